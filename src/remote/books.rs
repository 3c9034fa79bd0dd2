//! A run's books on the remote: with `--push`, the ledger (costs, durations, outcomes, reasons)
//! and state.json (attempts, blocks, why the last run stopped) travel with the branch as a
//! chain of commits at `refs/ralph/books/<branch>`, whose tree holds `ledger.jsonl` and
//! `state.json`. Each commit is a child of the last one, so the ref only moves forward and goes
//! with `refs/ralph/*` in the run's pushes, never forced.
//!
//! Written at the end of a run (its state says why it stopped), pushed with the lease's release.
//! A fresh clone's `--push` run fetches it and, having no ledger of its own, starts from it; any
//! clone reads it after `git fetch origin '+refs/ralph/books/*:refs/ralph/books/*'` (`ralph
//! report`, `log`, `status` through [`crate::history::History::load`]).

use crate::git::{GitError, Repo};
use crate::protocol::LedgerRecord;
use crate::state::{State, STATE_FILE};
use crate::workspace::{RunPaths, LEDGER_FILE};

/// The prefix of the books refs: `refs/ralph/books/<branch>`.
pub const BOOKS_PREFIX: &str = "refs/ralph/books/";

/// The books ref of run branch `branch`.
pub fn books_ref(branch: &str) -> String {
    format!("{BOOKS_PREFIX}{branch}")
}

/// Writes the books in `paths` (the ledger, state.json) as a commit on top of the local books
/// ref of `branch` and moves the ref to it. Returns the new commit, or `None` when there is no
/// ledger yet or the books did not change since the last commit.
///
/// # Errors
/// A [`GitError`] writing the commit or the ref.
pub fn record(repo: &Repo, branch: &str, paths: &RunPaths) -> Result<Option<String>, GitError> {
    let Ok(ledger) = std::fs::read(&paths.ledger) else {
        return Ok(None);
    };
    let state = std::fs::read(State::path(&paths.ralph_dir)).unwrap_or_default();
    let name = books_ref(branch);
    let parent = repo.ref_sha(&name);
    if let Some(p) = &parent {
        let same = repo.file_at(p, LEDGER_FILE)?.as_deref() == Some(ledger.as_slice())
            && repo.file_at(p, STATE_FILE)?.unwrap_or_default() == state;
        if same {
            return Ok(None);
        }
    }
    let records = ledger
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let message = format!(
        "ralph: books of {branch}\n\nThe ledger ({records} records) and state.json of the runs on {branch}.\n"
    );
    let mut files: Vec<(&str, &[u8])> = vec![(LEDGER_FILE, &ledger)];
    if !state.is_empty() {
        files.push((STATE_FILE, &state));
    }
    let sha = repo.write_files_commit(&message, &files, parent.as_deref())?;
    repo.set_ref(&name, &sha)?;
    Ok(Some(sha))
}

/// The ledger records kept in books commit `rev`, oldest first (lines that do not parse are
/// skipped: the books are a copy); `None` when `rev` is not a books commit here.
pub fn records_at(repo: &Repo, rev: &str) -> Option<Vec<LedgerRecord>> {
    let bytes = repo.file_at(rev, LEDGER_FILE).ok()??;
    Some(
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    )
}

/// What [`import`] brought into this clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Ledger records.
    pub records: usize,
    /// Whether state.json came too (it does not when this clone has one).
    pub state: bool,
}

/// Starts this clone's books from books commit `sha` (fetched from the remote) when it has no
/// ledger records of its own: the ledger is copied, and state.json too when there is none here
/// (without its in-flight iteration, which belonged to another machine). `None` when nothing
/// was imported.
///
/// # Errors
/// A message naming the file that could not be read or written.
pub fn import(repo: &Repo, paths: &RunPaths, sha: &str) -> Result<Option<Imported>, String> {
    let has_own = std::fs::read(&paths.ledger)
        .map(|b| b.iter().any(|c| !c.is_ascii_whitespace()))
        .unwrap_or(false);
    if has_own {
        return Ok(None);
    }
    let read = |name: &str| {
        repo.file_at(sha, name)
            .map_err(|e| format!("cannot read {name} from the books {sha}: {e}"))
    };
    let Some(ledger) = read(LEDGER_FILE)? else {
        return Ok(None);
    };
    crate::workspace::ensure_ralph_dir(&paths.ralph_dir).map_err(|e| e.to_string())?;
    crate::fsutil::write_atomic(&paths.ledger, &ledger)
        .map_err(|e| format!("cannot write {}: {e}", paths.ledger.display()))?;
    let records = ledger
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let state_path = State::path(&paths.ralph_dir);
    let mut state = false;
    if !state_path.exists() {
        if let Some(bytes) = read(STATE_FILE)? {
            if let Ok(mut s) = serde_json::from_slice::<State>(&bytes) {
                s.in_flight = None;
                s.save(&paths.ralph_dir)
                    .map_err(|e| format!("cannot write {}: {e}", state_path.display()))?;
                state = true;
            }
        }
    }
    Ok(Some(Imported { records, state }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, Repo, RunPaths) {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        for (k, v) in [("user.name", "t"), ("user.email", "t@example.com")] {
            let set = std::process::Command::new("git")
                .args(["config", k, v])
                .current_dir(dir.path())
                .status()
                .unwrap();
            assert!(set.success());
        }
        let repo = Repo::discover(dir.path()).unwrap();
        let paths = RunPaths::new(dir.path(), &dir.path().join("prd.json"));
        (dir, repo, paths)
    }

    #[test]
    fn books_move_forward_and_come_back_into_an_empty_clone() {
        let (_dir, repo, paths) = repo();
        assert_eq!(
            record(&repo, "ralph/x", &paths).unwrap(),
            None,
            "no ledger yet"
        );
        crate::workspace::ensure_ralph_dir(&paths.ralph_dir).unwrap();
        let r = LedgerRecord::new(
            "run-1",
            1,
            "US-001",
            crate::protocol::Outcome::StoryPassed,
            chrono::Utc::now(),
        );
        crate::ledger::append(&paths.ledger, &r).unwrap();
        let first = record(&repo, "ralph/x", &paths).unwrap().expect("a commit");
        assert_eq!(record(&repo, "ralph/x", &paths).unwrap(), None, "unchanged");
        crate::ledger::append(&paths.ledger, &r).unwrap();
        let second = record(&repo, "ralph/x", &paths).unwrap().expect("a commit");
        assert!(
            repo.is_ancestor(&first, &second).unwrap(),
            "only moves forward"
        );
        assert_eq!(records_at(&repo, &second).unwrap().len(), 2);

        std::fs::remove_dir_all(&paths.ralph_dir).unwrap();
        let got = import(&repo, &paths, &second).unwrap().expect("imported");
        assert_eq!(got.records, 2);
        assert_eq!(
            crate::ledger::read_all(&paths.ledger)
                .unwrap()
                .records
                .len(),
            2
        );
        // A clone with books of its own keeps them.
        assert_eq!(import(&repo, &paths, &first).unwrap(), None);
    }
}
