//! `ralph pause`'s request to a running `ralph run`: a file `.ralph/pause` that the run looks for
//! between iterations. While it exists the run holds: the iteration in progress finishes and is
//! recorded, then no new one starts (the lock stays held). `ralph resume` removes the file;
//! `ralph stop` ends the pause by stopping the run. A file, like [`crate::stop_request`], so that
//! it survives until the run sees it and any terminal (or `ralph watch`) can write it.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The request's file name inside `.ralph/`.
pub const PAUSE_FILE: &str = "pause";

/// What the request file holds (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PauseRequest {
    /// When it was asked (RFC 3339 UTC).
    pub requested_at: DateTime<Utc>,
    /// The process id of the `ralph pause` (or `ralph watch`) that asked.
    pub by_pid: u32,
}

fn path(ralph_dir: &Path) -> PathBuf {
    ralph_dir.join(PAUSE_FILE)
}

/// Writes the request (atomically, see [`crate::fsutil::write_atomic`]).
///
/// # Errors
/// The I/O error, when `.ralph/` cannot be written.
pub fn request(ralph_dir: &Path) -> std::io::Result<()> {
    let body = serde_json::to_vec(&PauseRequest {
        requested_at: Utc::now(),
        by_pid: std::process::id(),
    })
    .map_err(std::io::Error::other)?;
    crate::fsutil::write_atomic(&path(ralph_dir), &body)
}

/// The pending request, when there is one (a file that cannot be parsed still counts, with the
/// file's modification time or now).
pub fn pending(ralph_dir: &Path) -> Option<PauseRequest> {
    let bytes = std::fs::read(path(ralph_dir)).ok()?;
    Some(
        serde_json::from_slice(&bytes).unwrap_or_else(|_| PauseRequest {
            requested_at: Utc::now(),
            by_pid: 0,
        }),
    )
}

/// Removes the request (`ralph resume`, or the run ending). Returns whether there was one.
pub fn clear(ralph_dir: &Path) -> bool {
    std::fs::remove_file(path(ralph_dir)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        assert!(pending(dir.path()).is_none());
        request(dir.path()).unwrap();
        assert_eq!(pending(dir.path()).unwrap().by_pid, std::process::id());
        assert!(clear(dir.path()));
        assert!(pending(dir.path()).is_none());
        assert!(!clear(dir.path()));
    }
}
