//! The one reader of what happened in earlier iterations: `.ralph/ledger.jsonl` when it has
//! records, else the `Ralph-*` trailers of ralph's commits in git (a deleted `.ralph/`, a fresh
//! clone). `ralph status`, a starting run (numbering, attempts, blocked stories) and crash
//! recovery read history only through here.

use crate::git::{Repo, TrailerRecord};
use crate::ledger::{self, LedgerError};
use crate::protocol::LedgerRecord;
use crate::workspace::RunPaths;

/// How many ralph commits are read from git at most (newest first).
pub const MAX_GIT_RECORDS: usize = 100_000;

/// Where a [`History`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `.ralph/ledger.jsonl`: every field.
    Ledger,
    /// The trailers of ralph's commits: run, iteration, story, outcome, feature and the commit
    /// time only (no tokens, cost, durations or messages).
    Git,
    /// Neither has any iteration.
    Empty,
}

impl Source {
    /// `ledger`, `git` or `empty`, as `ralph status --json` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Ledger => "ledger",
            Source::Git => "git",
            Source::Empty => "empty",
        }
    }
}

/// Every recorded iteration, oldest first (one record per run and iteration).
#[derive(Debug, Clone)]
pub struct History {
    /// The records, oldest first.
    pub records: Vec<LedgerRecord>,
    /// Where they came from.
    pub source: Source,
}

impl History {
    /// Reads the ledger at `paths.ledger`; when it has no record, the books `--push` runs keep
    /// with the branch (`refs/ralph/books/<prd.json's branchName or HEAD's branch>` in `repo`,
    /// e.g. fetched with `git fetch origin '+refs/ralph/books/*:refs/ralph/books/*'`); else the
    /// trailers of ralph's commits reachable from HEAD in `repo` (when given). A ledger whose
    /// first record is marked `rebuilt` (started anew in a fresh clone) is preceded by the
    /// earlier iterations git remembers, and a ledger that git's newest ralph commit has gone
    /// past (books copied from the remote before a worker was killed) is followed by the later
    /// iterations of the same feature git remembers.
    ///
    /// # Errors
    /// A ledger line other than the last that is not a valid record, or an unreadable ledger
    /// ([`LedgerError`], naming the file and line). Unreadable git history reads as empty.
    pub fn load(paths: &RunPaths, repo: Option<&Repo>) -> Result<History, LedgerError> {
        let mut records = if paths.ledger.exists() {
            ledger::read_all(&paths.ledger)?.records
        } else {
            Vec::new()
        };
        let feature = crate::prd::store::load_shared(&paths.prd)
            .ok()
            .and_then(|l| l.prd.branch_name.clone());
        // A PRD kept in a folder shares the repository's history with the other PRDs: of the
        // commits git remembers, only its own feature's (and those that name none) are its.
        let nested = paths.ralph_dir != paths.repo_root.join(crate::workspace::RALPH_DIR);
        let own = |r: &LedgerRecord| !nested || r.feature.is_none() || r.feature == feature;
        if records.is_empty() {
            if let Some(repo) = repo {
                records = books_records(repo, feature.as_deref());
            }
        }
        if let (Some(last), Some(repo)) = (records.iter().map(|r| r.iteration).max(), repo) {
            append_later_from_git(&mut records, last, repo, feature.as_deref());
        }
        if !records.is_empty() {
            // A ledger started anew over git history (a fresh clone): the iterations before it
            // come from the trailers.
            let mut records = records;
            if let (Some(first), Some(repo)) = (records.first(), repo) {
                if first.rebuilt.is_some() {
                    let before = first.iteration;
                    let mut earlier: Vec<LedgerRecord> = repo
                        .trailer_history(MAX_GIT_RECORDS)
                        .map(|t| records_from_git(&t))
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|r| r.iteration < before && own(r))
                        .collect();
                    earlier.append(&mut records);
                    records = earlier;
                }
            }
            return Ok(History {
                records,
                source: Source::Ledger,
            });
        }
        let mut from_git = repo
            .and_then(|r| r.trailer_history(MAX_GIT_RECORDS).ok())
            .map(|t| records_from_git(&t))
            .unwrap_or_default();
        from_git.retain(own);
        let source = if from_git.is_empty() {
            Source::Empty
        } else {
            Source::Git
        };
        Ok(History {
            records: from_git,
            source,
        })
    }

    /// The id of the run that recorded the newest iteration.
    pub fn latest_run(&self) -> Option<&str> {
        self.records.last().map(|r| r.run_id.as_str())
    }

    /// The run id `wanted` names: a run id, or a unique prefix or suffix of one.
    ///
    /// # Errors
    /// A message naming the runs there are (none matches) or those that match (several do).
    pub fn resolve_run(&self, wanted: &str) -> Result<String, String> {
        let ids: std::collections::BTreeSet<&str> =
            self.records.iter().map(|r| r.run_id.as_str()).collect();
        if ids.contains(wanted) {
            return Ok(wanted.to_owned());
        }
        let hits: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| id.starts_with(wanted) || id.ends_with(wanted))
            .collect();
        match hits.as_slice() {
            [one] => Ok((*one).to_owned()),
            [] => Err(format!(
                "no run {wanted}; the runs are: {}",
                ids.into_iter().collect::<Vec<_>>().join(", ")
            )),
            many => Err(format!(
                "{wanted} names {} runs ({}); give more of the id",
                many.len(),
                many.join(", ")
            )),
        }
    }

    /// The records of run `run_id`, oldest first.
    pub fn run<'a>(&'a self, run_id: &'a str) -> impl Iterator<Item = &'a LedgerRecord> + 'a {
        self.records.iter().filter(move |r| r.run_id == run_id)
    }

    /// Whether iteration `iteration` of run `run_id` is recorded.
    pub fn contains(&self, run_id: &str, iteration: u32) -> bool {
        self.records
            .iter()
            .any(|r| r.run_id == run_id && r.iteration == iteration)
    }

    /// The highest iteration number recorded (0 when none).
    pub fn last_iteration(&self) -> u32 {
        self.records.iter().map(|r| r.iteration).max().unwrap_or(0)
    }

    /// The newest record of `story_id` in feature `feature` (prd.json's `branchName`; records
    /// without one count) that is a failure of the story: why an open story has not passed yet.
    /// `None` when the story's newest decisive record passed it (progress, usage limits,
    /// transient errors and interruptions are skipped).
    pub fn last_failure(&self, story_id: &str, feature: Option<&str>) -> Option<&LedgerRecord> {
        use crate::protocol::Outcome;
        self.records
            .iter()
            .rev()
            .filter(|r| {
                r.story_id == story_id && r.feature.as_deref().is_none_or(|f| Some(f) == feature)
            })
            // Progress is no failure; a usage limit, a transient error or an interruption is not
            // the story's doing.
            .find(|r| {
                !matches!(
                    r.outcome,
                    Outcome::Progress
                        | Outcome::UsageLimit
                        | Outcome::Transient
                        | Outcome::Interrupted
                        | Outcome::LandingRefused
                )
            })
            // A story that passed since (prd.json shown from another branch, or reopened by
            // hand) has no failure to explain.
            .filter(|r| r.outcome != Outcome::StoryPassed)
    }
}

/// What a feature's recorded iterations cost ([`History::feature_cost`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    /// USD, summed over the records that have a cost.
    pub usd: f64,
    /// The feature's records.
    pub iterations: u32,
    /// Those without a cost (rebuilt from git trailers, or an agent that reports none).
    pub unpriced: u32,
    /// The highest iteration number among them (0 when none).
    pub last_iteration: u32,
}

impl History {
    /// The cost of every recorded iteration of feature `feature` (prd.json's `branchName`;
    /// records without one count, as they do for attempts), over all its runs.
    pub fn feature_cost(&self, feature: Option<&str>) -> Spent {
        let mut spent = Spent::default();
        let feature = feature.unwrap_or_default();
        for r in &self.records {
            if r.feature.as_deref().is_some_and(|f| f != feature) {
                continue;
            }
            spent.iterations += 1;
            spent.last_iteration = spent.last_iteration.max(r.iteration);
            match r.cost_usd {
                Some(c) => spent.usd += c,
                None => spent.unpriced += 1,
            }
        }
        spent
    }
}

/// The records of the books of `feature` (else of HEAD's branch) kept at
/// `refs/ralph/books/<branch>` in `repo`; empty when there are none.
fn books_records(repo: &Repo, feature: Option<&str>) -> Vec<LedgerRecord> {
    let head = repo.current_branch();
    [feature.map(str::to_owned), head]
        .into_iter()
        .flatten()
        .filter(|b| !b.is_empty())
        .find_map(|b| {
            let sha = repo.ref_sha(&crate::remote::books::books_ref(&b))?;
            crate::remote::books::records_at(repo, &sha)
        })
        .unwrap_or_default()
}

/// Appends the iterations after `last` that git's trailers remember and the ledger does not
/// (of `feature`, or without one), when ralph's newest commit is past `last`.
fn append_later_from_git(
    records: &mut Vec<LedgerRecord>,
    last: u32,
    repo: &Repo,
    feature: Option<&str>,
) {
    let newest = repo
        .newest_trailer(NEWEST_COMMIT_WALK)
        .ok()
        .flatten()
        .and_then(|t| t.iteration)
        .unwrap_or(0);
    if newest <= last {
        return;
    }
    let later = repo
        .trailer_history(MAX_GIT_RECORDS)
        .map(|t| records_from_git(&t))
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.iteration > last && r.feature.as_deref().is_none_or(|f| Some(f) == feature));
    records.extend(later);
}

/// How many commits down HEAD's first-parent line [`last_recorded_iteration`] looks for ralph's
/// newest commit.
pub const NEWEST_COMMIT_WALK: usize = 1_000;

/// The highest iteration number in either the ledger or ralph's commit trailers: iteration
/// numbers continue even when state.json or the whole `.ralph/` was lost.
///
/// Cheap on a long history: the ledger's tail ([`ledger::last_iteration`]) and ralph's newest
/// commit within [`NEWEST_COMMIT_WALK`] first-parent commits of HEAD (numbers only grow along
/// a branch), not every record and commit. A lost state.json is rebuilt from the whole history
/// elsewhere ([`History::load`]).
pub fn last_recorded_iteration(paths: &RunPaths, repo: &Repo) -> u32 {
    let from_ledger = ledger::last_iteration(&paths.ledger).unwrap_or(0);
    let from_git = repo
        .newest_trailer(NEWEST_COMMIT_WALK)
        .ok()
        .flatten()
        .and_then(|t| t.iteration)
        .unwrap_or(0);
    from_ledger.max(from_git)
}

/// Ledger-like records rebuilt from ralph's commit trailers (`history` newest first, as
/// [`Repo::trailer_history`] gives them), oldest first, one per run and iteration (a restart's
/// checkpoint of an interrupted iteration shares its number): what git alone remembers.
pub fn records_from_git(history: &[TrailerRecord]) -> Vec<LedgerRecord> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out: Vec<LedgerRecord> = history
        .iter()
        .rev()
        .filter_map(|t| {
            let iteration = t.iteration?;
            let outcome = t.outcome?;
            if !seen.insert((t.run_id.clone(), iteration)) {
                return None;
            }
            let mut r = LedgerRecord::new(
                &t.run_id,
                iteration,
                t.story_id.as_deref().unwrap_or_default(),
                outcome,
                t.committed_at,
            );
            r.head_after = Some(t.sha.clone());
            r.checkpoint_commit = Some(t.sha.clone());
            r.unblocked = t.unblocked.clone();
            r.from_git = true;
            r.feature = t.feature.clone();
            Some(r)
        })
        .collect();
    out.sort_by_key(|r| r.iteration);
    out
}

/// Where the feature's work is when it is not what is checked out: prd.json's `branchName`
/// when HEAD is on another branch and that branch exists here (`ralph/x`) or only on a remote
/// (`origin/ralph/x`, a fresh clone; [`Repo::remote_branch_for`], where `ralph run` would take it
/// from), with commits HEAD does not have. `None` otherwise.
pub fn feature_elsewhere(repo: &Repo, feature: Option<&str>) -> Option<String> {
    feature_tip_elsewhere(repo, feature).map(|(shown, _)| shown)
}

/// [`feature_elsewhere`] and the full sha of that branch's tip.
pub fn feature_tip_elsewhere(repo: &Repo, feature: Option<&str>) -> Option<(String, String)> {
    let feature = feature.filter(|f| !f.is_empty())?;
    if repo.current_branch().as_deref() == Some(feature) {
        return None;
    }
    let head = repo.head_sha().ok().flatten();
    let remote = repo
        .remote_branch_for(feature)
        .map(|short| (format!("refs/remotes/{short}"), short));
    [
        Some((format!("refs/heads/{feature}"), feature.to_owned())),
        remote,
    ]
    .into_iter()
    .flatten()
    .find_map(|(refname, shown)| {
        let sha = repo.ref_sha(&refname)?;
        // Merged (or the same commit): what is checked out already has the work.
        let merged = match &head {
            Some(h) => repo.is_ancestor(&sha, h).unwrap_or(false),
            None => false,
        };
        (!merged).then_some((shown, sha))
    })
}
