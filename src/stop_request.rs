//! `ralph stop`'s request to a running `ralph run`: a file `.ralph/stop` that the run looks for
//! between iterations and during its waits. A file, not a signal, because the request must not
//! interrupt the iteration in progress (its work is finished, committed and recorded first) and
//! must survive until the run sees it.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The request's file name inside `.ralph/`.
pub const STOP_FILE: &str = "stop";

/// What the request file holds (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopRequest {
    /// When it was asked (RFC 3339 UTC).
    pub requested_at: DateTime<Utc>,
    /// The process id of the `ralph stop` that asked.
    pub by_pid: u32,
}

fn path(ralph_dir: &Path) -> PathBuf {
    ralph_dir.join(STOP_FILE)
}

/// Writes the request (atomically, see [`crate::fsutil::write_atomic`]).
///
/// # Errors
/// The I/O error, when `.ralph/` cannot be written.
pub fn request(ralph_dir: &Path) -> std::io::Result<()> {
    let body = serde_json::to_vec(&StopRequest {
        requested_at: Utc::now(),
        by_pid: std::process::id(),
    })
    .map_err(std::io::Error::other)?;
    crate::fsutil::write_atomic(&path(ralph_dir), &body)
}

/// Whether a stop was requested.
pub fn pending(ralph_dir: &Path) -> bool {
    path(ralph_dir).exists()
}

/// Removes the request (once the run has acted on it, or a stale one from a run that ended
/// before it saw it). Missing is fine.
pub fn clear(ralph_dir: &Path) {
    let _ = std::fs::remove_file(path(ralph_dir));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!pending(dir.path()));
        request(dir.path()).unwrap();
        assert!(pending(dir.path()));
        let r: StopRequest =
            serde_json::from_slice(&std::fs::read(dir.path().join(STOP_FILE)).unwrap()).unwrap();
        assert_eq!(r.by_pid, std::process::id());
        clear(dir.path());
        assert!(!pending(dir.path()));
        clear(dir.path());
    }
}
