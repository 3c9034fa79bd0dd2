//! ralph's commit trailers (`Ralph-Run`, `Ralph-Iteration`, …): the one definition the commit
//! stage writes ([`Trailers::pairs`]) and the history readers read back
//! ([`Repo::trailer_history`], [`Repo::newest_trailer`]), so that resume from git cannot drift
//! from what was written.

use chrono::{DateTime, Utc};
use git2::Commit;

use super::{op, GitError, Repo};
use crate::protocol::Outcome;

/// Trailer key naming the run id in every ralph commit.
pub const TRAILER_RUN: &str = "Ralph-Run";
/// Trailer key naming the iteration number (a decimal `u32`) in every ralph commit.
pub const TRAILER_ITERATION: &str = "Ralph-Iteration";
/// Trailer key naming the story id in every ralph commit.
pub const TRAILER_STORY: &str = "Ralph-Story";
/// Trailer key naming the iteration's [`Outcome`] (snake_case) in every ralph commit.
pub const TRAILER_OUTCOME: &str = "Ralph-Outcome";
/// Trailer key naming prd.json's `branchName` (the feature the iteration's attempts belong to),
/// when prd.json has one.
pub const TRAILER_FEATURE: &str = "Ralph-Feature";
/// Trailer key listing the stories `--unblock` freed before the iteration (comma-separated
/// ids), on the first checkpoint after the unblock only.
pub const TRAILER_UNBLOCKED: &str = "Ralph-Unblocked";

/// The trailers of one ralph iteration commit: the one definition that the commit stage writes
/// ([`Trailers::pairs`]) and [`Repo::trailer_history`] reads back, so resume from git cannot
/// drift from what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trailers {
    /// `Ralph-Run`: the run id.
    pub run_id: String,
    /// `Ralph-Iteration`: the iteration number.
    pub iteration: u32,
    /// `Ralph-Story`: the story id.
    pub story_id: String,
    /// `Ralph-Outcome`: how the iteration ended.
    pub outcome: Outcome,
    /// `Ralph-Feature`: prd.json's `branchName`, when it has one.
    pub feature: Option<String>,
    /// `Ralph-Unblocked`: stories `--unblock` freed before this iteration (omitted when none).
    pub unblocked: Vec<String>,
}

impl Trailers {
    /// The `(key, value)` pairs in commit order, for [`Repo::commit_all`].
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            (TRAILER_RUN, self.run_id.clone()),
            (TRAILER_ITERATION, self.iteration.to_string()),
            (TRAILER_STORY, self.story_id.clone()),
            (TRAILER_OUTCOME, self.outcome.as_str().to_owned()),
        ];
        if let Some(feature) = &self.feature {
            pairs.push((TRAILER_FEATURE, feature.clone()));
        }
        if !self.unblocked.is_empty() {
            pairs.push((TRAILER_UNBLOCKED, self.unblocked.join(", ")));
        }
        pairs
    }
}

/// One ralph commit found in history by [`Repo::trailer_history`].
#[derive(Debug, Clone, PartialEq)]
pub struct TrailerRecord {
    /// Full sha of the commit.
    pub sha: String,
    /// Committer time of the commit (UTC).
    pub committed_at: DateTime<Utc>,
    /// Value of `Ralph-Run`.
    pub run_id: String,
    /// Value of `Ralph-Iteration`, when present and a valid number.
    pub iteration: Option<u32>,
    /// Value of `Ralph-Story`, when present.
    pub story_id: Option<String>,
    /// Value of `Ralph-Outcome`, when present and one of the known outcomes (an unknown value,
    /// e.g. from a newer ralph, reads as `None`).
    pub outcome: Option<Outcome>,
    /// Value of `Ralph-Feature`, when present (commits of older ralphs have none).
    pub feature: Option<String>,
    /// The ids in `Ralph-Unblocked` (empty when absent).
    pub unblocked: Vec<String>,
}

impl Repo {
    /// Up to `max` ralph commits (those with a `Ralph-Run` trailer), newest first, found by
    /// walking first parents from HEAD (or [`Repo::reading_history_at`]'s commit). Commits without the trailer are skipped (the walk goes
    /// on past them). Empty on an unborn branch.
    ///
    /// # Errors
    /// [`GitError::Git`] when history cannot be read.
    pub fn trailer_history(&self, max: usize) -> Result<Vec<TrailerRecord>, GitError> {
        let mut records = Vec::new();
        let Some(head) = self.history_tip()? else {
            return Ok(records);
        };
        if max == 0 {
            return Ok(records);
        }
        let mut walk = self.repo.revwalk().map_err(op("walk history"))?;
        walk.push(head.id()).map_err(op("walk history"))?;
        walk.simplify_first_parent().map_err(op("walk history"))?;
        for oid in walk {
            let oid = oid.map_err(op("walk history"))?;
            let commit = self.repo.find_commit(oid).map_err(op("read commit"))?;
            let message = String::from_utf8_lossy(commit.message_bytes());
            if let Some(record) = parse_trailers(&message, &commit) {
                records.push(record);
                if records.len() >= max {
                    break;
                }
            }
        }
        Ok(records)
    }

    /// ralph's newest commit (one with a `Ralph-Run` trailer) among the first `max_walk` commits
    /// of HEAD's (or [`Repo::reading_history_at`]'s) first-parent line; `None` when there is none that close (or no commit).
    ///
    /// # Errors
    /// [`GitError::Git`] when history cannot be read.
    pub fn newest_trailer(&self, max_walk: usize) -> Result<Option<TrailerRecord>, GitError> {
        let Some(head) = self.history_tip()? else {
            return Ok(None);
        };
        let mut walk = self.repo.revwalk().map_err(op("walk history"))?;
        walk.push(head.id()).map_err(op("walk history"))?;
        walk.simplify_first_parent().map_err(op("walk history"))?;
        for oid in walk.take(max_walk) {
            let oid = oid.map_err(op("walk history"))?;
            let commit = self.repo.find_commit(oid).map_err(op("read commit"))?;
            let message = String::from_utf8_lossy(commit.message_bytes());
            if let Some(record) = parse_trailers(&message, &commit) {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }
}

/// Extracts a [`TrailerRecord`] from a commit message, if it carries `Ralph-Run`.
fn parse_trailers(message: &str, commit: &Commit<'_>) -> Option<TrailerRecord> {
    let trailers = git2::message_trailers_strs(message).ok()?;
    let mut run_id = None;
    let mut iteration = None;
    let mut story_id = None;
    let mut outcome = None;
    let mut feature = None;
    let mut unblocked = Vec::new();
    for (key, value) in trailers.iter() {
        let value = value.trim();
        if key.eq_ignore_ascii_case(TRAILER_RUN) {
            run_id = Some(value.to_owned());
        } else if key.eq_ignore_ascii_case(TRAILER_ITERATION) {
            iteration = value.parse().ok();
        } else if key.eq_ignore_ascii_case(TRAILER_STORY) {
            story_id = Some(value.to_owned());
        } else if key.eq_ignore_ascii_case(TRAILER_OUTCOME) {
            outcome = value.parse().ok();
        } else if key.eq_ignore_ascii_case(TRAILER_FEATURE) {
            feature = Some(value.to_owned());
        } else if key.eq_ignore_ascii_case(TRAILER_UNBLOCKED) {
            unblocked.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    let committed_at = DateTime::from_timestamp(commit.time().seconds(), 0).unwrap_or_default();
    Some(TrailerRecord {
        sha: commit.id().to_string(),
        committed_at,
        run_id: run_id?,
        iteration,
        story_id,
        outcome,
        feature,
        unblocked,
    })
}
