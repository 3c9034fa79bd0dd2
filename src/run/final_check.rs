//! The last look before a run says "complete": a story that passed is checked again when a later
//! iteration changed a file its own passing iteration changed.
//!
//! A story passes on its check at the time it is worked. A later story may then undo it: two
//! stories that write the same file, the second one landing last (a tester's case: US-001 writes
//! `one` into shared.txt and checks for it; US-002 writes `two` there). Without this step the run
//! said "complete: every story passes" while US-001's check failed on the finished tree.
//!
//! Which stories are checked again (a decision, docs/decisions.md "The final check"): those with
//! a check (their `verify`, else `--verify`) whose last passing iteration changed a file (not
//! prd.json, progress.txt or progress-history/) that an iteration recorded after it in the
//! ledger changed too. A check that reads files its story never wrote (a whole test suite) is
//! not re-run for that: running every check at every end would cost what the run cost, and
//! change nothing a later story did not touch. Each distinct command runs once.
//!
//! A check that fails sets its story back to not passing (prd.json, committed by ralph with a
//! message naming why), with its output as feedback for the story's next attempt, and the run
//! goes on: the story is worked again within its attempts and the run's budgets.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::RunConfig;
use crate::output::Outputs;
use crate::prd::model::Prd;
use crate::prd::store;
use crate::process::StopSignals;
use crate::protocol::{LedgerRecord, Outcome};

use super::feedback::{Feedback, Pending};
use super::preflight::Preflight;

/// Where the final check runs: the run's checkout and books, and whose checks they are.
#[derive(Clone, Copy)]
pub struct At<'a> {
    /// The run's repository, paths and agents (the first agent's sandbox is the checks').
    pub pre: &'a Preflight,
    /// The run's id.
    pub run_id: &'a str,
    /// The last iteration's number (the checks carry its process tag).
    pub iteration: u32,
}

/// A story to check again: why, as the files its pass relied on and who changed them since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recheck {
    /// The story.
    pub story_id: String,
    /// Files its last passing iteration changed that later iterations changed too.
    pub files: Vec<String>,
    /// The stories of those later iterations.
    pub changed_by: Vec<String>,
}

/// The stories of `passing` (id → whether it has a check) that need their check again, in
/// ledger order of their pass (see the module docs). `memory` are the run's memory files
/// (relative paths; a directory covers what is under it), which never count.
pub fn rechecks(
    records: &[LedgerRecord],
    passing: &BTreeMap<String, bool>,
    memory: &[String],
) -> Vec<Recheck> {
    let is_memory = |f: &str| {
        memory.iter().any(|m| {
            f == m
                || f.strip_prefix(m.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        })
    };
    let mut last_pass: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        if r.outcome == Outcome::StoryPassed {
            last_pass.insert(&r.story_id, i);
        }
    }
    let mut out: Vec<(usize, Recheck)> = Vec::new();
    for (id, &at) in &last_pass {
        if passing.get(*id) != Some(&true) {
            continue;
        }
        let own: BTreeSet<&str> = records[at]
            .files_changed
            .iter()
            .map(String::as_str)
            .filter(|f| !is_memory(f))
            .collect();
        let mut files = BTreeSet::new();
        let mut changed_by = BTreeSet::new();
        for later in &records[at + 1..] {
            for f in &later.files_changed {
                if own.contains(f.as_str()) {
                    files.insert(f.clone());
                    changed_by.insert(later.story_id.clone());
                }
            }
        }
        if !files.is_empty() {
            out.push((
                at,
                Recheck {
                    story_id: (*id).to_owned(),
                    files: files.into_iter().collect(),
                    changed_by: changed_by.into_iter().collect(),
                },
            ));
        }
    }
    out.sort_by_key(|(at, _)| *at);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Whether a run that stops for `reason` with stories still open gets the final check too
/// ([`reopen_undone`]), so that a story a later iteration undid is not left passing unchecked:
/// a budget other than the deadline (`--max-iter`, `--max-cost`, the failure and no-progress
/// limits), `ralph stop`, and a run with nothing left it can work on. Not after a signal, a
/// stop for the user (the checkout may be on another branch), `--max-duration` (the deadline
/// holds) or a run that says complete (that path runs the check itself).
pub fn due_at_stop(reason: &crate::protocol::StopReason) -> bool {
    use crate::protocol::StopReason as R;
    matches!(
        reason,
        R::MaxIterations { .. }
            | R::MaxCost { .. }
            | R::MaxFailures { .. }
            | R::NoProgress { .. }
            | R::AllBlocked { .. }
            | R::StoryBlocked { .. }
            | R::NoWorkableStory
            | R::StopRequested { .. }
    )
}

/// Runs the final check for `prd` (every story passes) in the run's checkout. Returns the
/// stories it set back to not passing (none: the run is complete).
///
/// # Errors
/// The ledger or prd.json cannot be read or written, a check cannot be started, or git fails
/// to commit prd.json.
pub async fn reopen_undone(
    cfg: &RunConfig,
    at: At<'_>,
    pending: &mut Pending,
    prd: &Prd,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Vec<String>> {
    let paths = &at.pre.paths;
    let check_of = |id: &str| {
        prd.story(id)
            .and_then(|st| st.verify.clone())
            .or_else(|| cfg.verify.clone())
            .filter(|c| !c.trim().is_empty())
    };
    let passing: BTreeMap<String, bool> = prd
        .user_stories
        .iter()
        .map(|st| (st.id.clone(), st.passes && check_of(&st.id).is_some()))
        .collect();
    let records = crate::ledger::read_all(&paths.ledger)?.records;
    let memory = super::iteration::inspect::memory_paths(paths, &paths.repo_root);
    let todo = rechecks(&records, &passing, &memory);
    if todo.is_empty() || stop.stop.is_cancelled() {
        return Ok(Vec::new());
    }
    let check = super::iteration::verify::Check {
        cfg,
        repo_root: &paths.repo_root,
        stop,
        tag: crate::process::agent_tag(at.run_id, at.iteration),
        sandbox: at.pre.agents.first().and_then(|a| a.sandbox.as_ref()),
    };
    // One run per distinct command: its result holds for every story it checks.
    let mut results: BTreeMap<String, (bool, String)> = BTreeMap::new();
    let mut failed: Vec<(Recheck, String, String)> = Vec::new();
    for r in todo {
        let Some(command) = check_of(&r.story_id) else {
            continue;
        };
        if !results.contains_key(&command) {
            let checked = check.run(&command, &r.story_id).await?;
            if stop.stop.is_cancelled() {
                return Ok(Vec::new());
            }
            results.insert(
                command.clone(),
                (checked.record.passed, checked.record.output_tail.clone()),
            );
        }
        let (passed, tail) = &results[&command];
        if !passed {
            failed.push((r, command, tail.clone()));
        }
    }
    if failed.is_empty() {
        return Ok(Vec::new());
    }
    let edits: Vec<(&str, bool)> = failed
        .iter()
        .map(|(r, _, _)| (r.story_id.as_str(), false))
        .collect();
    let raw = store::set_passes_many(&std::fs::read(&paths.prd)?, &edits, None)?;
    crate::fsutil::write_atomic(&paths.prd, &raw)?;
    let mut body = String::new();
    for (r, command, tail) in &failed {
        let why = format!(
            "{}'s check `{command}` fails on the finished tree: {} changed {} after it passed",
            r.story_id,
            r.changed_by.join(", "),
            r.files.join(", ")
        );
        out.warn(format!("final check: {why}; {} is open again", r.story_id));
        body.push_str(&format!("- {why}\n"));
        pending.add([Feedback::about(
            &r.story_id,
            format!(
                "This story had passed, but its check fails now that {} changed {} (the final check before the run could end):\n{}\nMake this story's check pass again without undoing what {} did.",
                r.changed_by.join(", "),
                r.files.join(", "),
                tail,
                r.changed_by.join(", ")
            ),
        )]);
    }
    let rel = paths
        .prd
        .strip_prefix(&paths.repo_root)
        .map(|p| p.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/"))
        .unwrap_or_else(|_| "prd.json".to_owned());
    let ids: Vec<&str> = edits.iter().map(|(id, _)| *id).collect();
    crate::git::land::commit_own_files(
        &at.pre.repo,
        &[rel.as_str()],
        &format!("ralph: final check reopens {}", ids.join(", ")),
        &body,
        &[("Ralph-Run", at.run_id.to_owned())],
    )?;
    Ok(ids.into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(story: &str, outcome: Outcome, files: &[&str]) -> LedgerRecord {
        let mut r = LedgerRecord::new("r", 1, story, outcome, chrono::Utc::now());
        r.files_changed = files.iter().map(|f| (*f).to_owned()).collect();
        r
    }

    #[test]
    fn a_story_is_checked_again_when_a_later_iteration_changed_its_files() {
        let records = vec![
            record(
                "US-001",
                Outcome::StoryPassed,
                &["shared.txt", "prd.json", "a.txt"],
            ),
            record("US-003", Outcome::StoryPassed, &["c.txt", "progress.txt"]),
            record("US-002", Outcome::Conflict, &[]),
            record("US-002", Outcome::StoryPassed, &["shared.txt", "prd.json"]),
            record("US-004", Outcome::StoryPassed, &["progress-history/1.txt"]),
        ];
        let passing: BTreeMap<String, bool> = [
            ("US-001", true),
            ("US-002", true),
            ("US-003", true),
            ("US-004", true),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let memory = vec![
            "prd.json".to_owned(),
            "progress.txt".to_owned(),
            "progress-history".to_owned(),
        ];
        assert_eq!(
            rechecks(&records, &passing, &memory),
            vec![Recheck {
                story_id: "US-001".into(),
                files: vec!["shared.txt".into()],
                changed_by: vec!["US-002".into()],
            }]
        );
        // A story without a check (or not passing) is not checked again.
        let mut no_check = passing.clone();
        no_check.insert("US-001".into(), false);
        assert!(rechecks(&records, &no_check, &memory).is_empty());
        // Once it passed again after the other story, the other one is checked.
        let mut again = records.clone();
        again.push(record("US-001", Outcome::StoryPassed, &["shared.txt"]));
        let r = rechecks(&again, &passing, &memory);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].story_id, "US-002");
    }
}
