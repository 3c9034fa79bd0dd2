//! `ralph hint`'s mailbox: notes from the user for the next iteration, kept under
//! `.ralph/hints/` as one JSON file per hint (`<id>.json`), written with
//! [`crate::fsutil::write_atomic`] the moment the user gives them.
//!
//! A hint is **pending** until an iteration that carried it in its prompt is written down in the
//! ledger with an outcome in which the agent got to work ([`delivers`]); then it is marked
//! **delivered** (its file rewritten with `delivered`). An iteration that is interrupted, killed,
//! hits a usage limit or a transient error, or fails to start leaves its hints pending for the
//! next one. Delivery is at least once: a ralph killed between the ledger line and the mark
//! gives the hint once more.
//!
//! A hint may name a story (`--story ID`): it then goes only to an iteration of that story.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::protocol::{HintRecord, Outcome};

/// The mailbox's folder inside the PRD's books (`.ralph/hints/`).
pub const HINTS_DIR: &str = "hints";

/// One hint, as its file holds it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hint {
    /// Its number, 1, 2, … in the order given (what `--drop N` names).
    pub id: u32,
    /// The user's text, as given.
    pub text: String,
    /// The story it is meant for; `None`: the next iteration of any story.
    #[serde(default)]
    pub story: Option<String>,
    /// When it was given (RFC 3339 UTC).
    pub created_at: DateTime<Utc>,
    /// Set once an iteration that carried it is in the ledger.
    #[serde(default)]
    pub delivered: Option<Delivery>,
}

/// Which iteration took a hint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The run's id.
    pub run_id: String,
    /// The iteration number.
    pub iteration: u32,
    /// When it was marked (RFC 3339 UTC).
    pub at: DateTime<Utc>,
}

impl Hint {
    /// Whether it still waits for an iteration.
    pub fn is_pending(&self) -> bool {
        self.delivered.is_none()
    }

    /// Whether an iteration of `story_id` may carry it.
    pub fn is_for(&self, story_id: &str) -> bool {
        self.story.as_deref().is_none_or(|s| s == story_id)
    }

    /// What the ledger keeps of it.
    pub fn record(&self) -> HintRecord {
        HintRecord {
            id: self.id,
            text: self.text.clone(),
            story: self.story.clone(),
        }
    }
}

/// `.ralph/hints/` of the books at `ralph_dir`.
pub fn dir(ralph_dir: &Path) -> PathBuf {
    ralph_dir.join(HINTS_DIR)
}

fn file(ralph_dir: &Path, id: u32) -> PathBuf {
    dir(ralph_dir).join(format!("{id}.json"))
}

/// Every hint, by id. A file that cannot be read or parsed is skipped with a warning (a hint is
/// the user's text; a broken one must not stop the run).
pub fn all(ralph_dir: &Path) -> Vec<Hint> {
    let Ok(entries) = std::fs::read_dir(dir(ralph_dir)) else {
        return Vec::new();
    };
    let mut hints: Vec<Hint> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let parsed = std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Hint>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!("skipping the hint {}: {e}", p.display());
                    None
                }
            }
        })
        .collect();
    hints.sort_by_key(|h| h.id);
    hints
}

/// The pending hints, by id.
pub fn pending(ralph_dir: &Path) -> Vec<Hint> {
    all(ralph_dir)
        .into_iter()
        .filter(Hint::is_pending)
        .collect()
}

/// The pending hints an iteration of `story_id` carries: the untargeted ones and those naming
/// it, by id.
pub fn pending_for(ralph_dir: &Path, story_id: &str) -> Vec<Hint> {
    pending(ralph_dir)
        .into_iter()
        .filter(|h| h.is_for(story_id))
        .collect()
}

/// Stores a new hint and returns it. Its id is one more than the highest so far; the file is
/// created exclusively, so two `ralph hint` at once get two ids.
///
/// # Errors
/// The I/O error when `.ralph/hints/` cannot be written.
pub fn add(ralph_dir: &Path, text: &str, story: Option<&str>) -> std::io::Result<Hint> {
    // `.ralph/` ignores itself, so a hint never makes the tree dirty for the next run.
    crate::workspace::ensure_ralph_dir(ralph_dir)?;
    std::fs::create_dir_all(dir(ralph_dir))?;
    let mut id = all(ralph_dir).last().map_or(0, |h| h.id) + 1;
    loop {
        let hint = Hint {
            id,
            text: text.to_owned(),
            story: story.map(str::to_owned),
            created_at: Utc::now(),
            delivered: None,
        };
        // Claim the id with an exclusive create, then fill it atomically.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file(ralph_dir, id))
        {
            Ok(_) => {
                save(ralph_dir, &hint)?;
                return Ok(hint);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => id += 1,
            Err(e) => return Err(e),
        }
    }
}

fn save(ralph_dir: &Path, hint: &Hint) -> std::io::Result<()> {
    let body = serde_json::to_vec_pretty(hint).map_err(std::io::Error::other)?;
    crate::fsutil::write_atomic(&file(ralph_dir, hint.id), &body)
}

/// What [`drop`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Dropped {
    /// The pending hint was removed.
    Removed(Hint),
    /// No hint has this id.
    Missing,
    /// The hint was delivered already (it stays, as history).
    AlreadyDelivered(Hint),
}

/// Removes pending hint `id`.
///
/// # Errors
/// The I/O error when its file cannot be removed.
pub fn drop(ralph_dir: &Path, id: u32) -> std::io::Result<Dropped> {
    let Some(hint) = all(ralph_dir).into_iter().find(|h| h.id == id) else {
        return Ok(Dropped::Missing);
    };
    if !hint.is_pending() {
        return Ok(Dropped::AlreadyDelivered(hint));
    }
    std::fs::remove_file(file(ralph_dir, id))?;
    Ok(Dropped::Removed(hint))
}

/// Whether an iteration with `outcome` consumes the hints it carried: the agent got to work on
/// its story and the run goes on (not an interruption, a usage limit, a transient error, or a
/// stop for bad credentials or setup).
pub fn delivers(outcome: Outcome) -> bool {
    outcome.is_attempt() && outcome.rules().next == crate::protocol::outcome::Next::Continue
}

/// Marks the hints `carried` by iteration `iteration` of `run_id` delivered, when `outcome`
/// [`delivers`] them; called once the iteration's ledger line is written. A hint the user
/// dropped meanwhile stays dropped.
///
/// # Errors
/// The I/O error of a rewrite.
pub fn mark_delivered(
    ralph_dir: &Path,
    carried: &[HintRecord],
    outcome: Outcome,
    run_id: &str,
    iteration: u32,
) -> std::io::Result<()> {
    if carried.is_empty() || !delivers(outcome) {
        return Ok(());
    }
    for mut hint in all(ralph_dir) {
        if hint.is_pending() && carried.iter().any(|c| c.id == hint.id) {
            hint.delivered = Some(Delivery {
                run_id: run_id.to_owned(),
                iteration,
                at: Utc::now(),
            });
            save(ralph_dir, &hint)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_numbered_targeted_delivered_and_dropped() {
        let d = tempfile::tempdir().unwrap();
        let a = add(d.path(), "use the helper in util.rs", None).unwrap();
        let b = add(d.path(), "US-002 needs a migration", Some("US-002")).unwrap();
        assert_eq!((a.id, b.id), (1, 2));
        assert_eq!(pending_for(d.path(), "US-001"), vec![a.clone()]);
        assert_eq!(pending_for(d.path(), "US-002").len(), 2);
        // A usage limit leaves them pending; a finished attempt delivers them.
        mark_delivered(d.path(), &[a.record()], Outcome::UsageLimit, "r", 1).unwrap();
        mark_delivered(d.path(), &[a.record()], Outcome::Interrupted, "r", 1).unwrap();
        assert_eq!(pending(d.path()).len(), 2);
        mark_delivered(d.path(), &[a.record()], Outcome::VerifyFailed, "r", 2).unwrap();
        assert_eq!(pending(d.path()), vec![b.clone()]);
        assert_eq!(all(d.path())[0].delivered.as_ref().unwrap().iteration, 2);
        assert!(matches!(
            drop(d.path(), 1).unwrap(),
            Dropped::AlreadyDelivered(_)
        ));
        assert_eq!(drop(d.path(), 9).unwrap(), Dropped::Missing);
        assert_eq!(drop(d.path(), 2).unwrap(), Dropped::Removed(b));
        assert!(pending(d.path()).is_empty());
        // Ids keep growing past a dropped one's gap only from the highest kept.
        assert_eq!(add(d.path(), "x", None).unwrap().id, 2);
    }
}
