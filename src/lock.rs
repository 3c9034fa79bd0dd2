//! `.ralph/lock`: one `ralph run` per repository at a time.
//!
//! The lock is an exclusive advisory lock (std `File::try_lock`, `flock(2)` on Unix) held on the
//! open file for the whole run. The kernel releases it when the process dies, however it dies,
//! so a lock file whose lock is free was left by a crashed or SIGKILLed ralph: it is taken over
//! and the previous holder's details are handed back so the caller can warn. The file's content,
//! `{"pid", "host", "started_at"}`, exists only to tell a user *which* run holds the lock.
//!
//! On drop the file is removed *before* the lock is released, and [`RunLock::acquire`] checks
//! after locking that the path still names the file it locked; together these stop two runs
//! from each holding a lock on a different inode.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Serialize};

use crate::protocol::time::rfc3339;

/// File name of the lock inside the `.ralph` directory.
pub const LOCK_FILE: &str = "lock";

/// Who holds (or held) the lock: the JSON content of the lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// Process id of the ralph run.
    pub pid: u32,
    /// Host name of the machine it runs on.
    pub host: String,
    /// When it took the lock (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    pub started_at: DateTime<Utc>,
}

/// The `ralph run` holding the lock of the books at `ralph_dir`, when its process is alive on
/// this machine (read from the lock file; nothing is taken).
pub fn live_holder(ralph_dir: &Path) -> Option<LockInfo> {
    std::fs::read_to_string(ralph_dir.join(LOCK_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<LockInfo>(&t).ok())
        .filter(|info| Path::new(&format!("/proc/{}", info.pid)).exists())
}

impl LockInfo {
    /// Details of the current process, now (to the millisecond, as the file stores it).
    pub fn current() -> LockInfo {
        LockInfo {
            pid: std::process::id(),
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "unknown".to_owned()),
            started_at: Utc::now().trunc_subsecs(3),
        }
    }
}

/// Errors taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live ralph run holds the lock.
    #[error("another ralph run (pid {pid} on host {host}, started {}) holds {}\nhint: wait for it to finish, or ask it to stop after its current iteration with `ralph stop` (Ctrl-C in its terminal stops it at once); ralph runs one loop per repository at a time", started_at.to_rfc3339_opts(SecondsFormat::Secs, true), path.display())]
    Held {
        /// Pid of the holder.
        pid: u32,
        /// Host of the holder.
        host: String,
        /// When the holder took the lock.
        started_at: DateTime<Utc>,
        /// The lock file.
        path: PathBuf,
    },
    /// The lock is held, but its file does not (yet) say by whom.
    #[error("another ralph run holds {} (its details are unreadable)\nhint: wait for it to finish; if no ralph is running, delete the file", path.display())]
    HeldUnknown {
        /// The lock file.
        path: PathBuf,
    },
    /// A filesystem operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What ralph was doing, e.g. `lock`.
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// A held run lock. Dropping it removes the file and releases the lock.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
    info: LockInfo,
}

/// A freshly acquired lock.
#[derive(Debug)]
pub struct Acquired {
    /// The lock; keep it alive for the whole run.
    pub lock: RunLock,
    /// The previous holder, when a lock file was left behind by a run that is gone (crashed or
    /// killed): the caller warns "taking over stale lock from pid N".
    pub stale: Option<LockInfo>,
}

/// How often acquisition retries when the file it locked was replaced under it, and how long it
/// waits for a new holder to write its details.
const ATTEMPTS: usize = 10;
const HOLDER_WRITE_WAIT: Duration = Duration::from_millis(20);

impl RunLock {
    /// Takes `<ralph_dir>/lock` without waiting, creating `ralph_dir` when missing, and writes
    /// this process's [`LockInfo`] into it.
    ///
    /// # Errors
    /// [`LockError::Held`] naming the holder's pid, host and start time;
    /// [`LockError::HeldUnknown`] when the holder's details cannot be read;
    /// [`LockError::Io`] naming the file.
    pub fn acquire(ralph_dir: &Path) -> Result<Acquired, LockError> {
        let path = ralph_dir.join(LOCK_FILE);
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| LockError::Io {
                action,
                path,
                source,
            }
        };
        fs::create_dir_all(ralph_dir).map_err(io("create", ralph_dir))?;

        for _ in 0..ATTEMPTS {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io("open", &path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => return Err(held(&mut file, &path)),
                Err(fs::TryLockError::Error(source)) => {
                    return Err(LockError::Io {
                        action: "lock",
                        path,
                        source,
                    })
                }
            }
            // The previous holder may have removed the file between our open and our lock;
            // then we locked an orphaned inode and must start over.
            let still_ours = match (fs::metadata(&path), file.metadata()) {
                (Ok(on_disk), Ok(opened)) => {
                    on_disk.dev() == opened.dev() && on_disk.ino() == opened.ino()
                }
                _ => false,
            };
            if !still_ours {
                continue;
            }

            let previous = read_content(&mut file).map_err(io("read", &path))?;
            let stale = if previous.trim().is_empty() {
                None
            } else {
                match serde_json::from_str::<LockInfo>(&previous) {
                    Ok(info) => Some(info),
                    Err(err) => {
                        tracing::warn!(path = %path.display(), %err, "replacing an unreadable stale lock file");
                        None
                    }
                }
            };
            let info = LockInfo::current();
            write_info(&mut file, &info).map_err(io("write", &path))?;
            return Ok(Acquired {
                lock: RunLock { file, path, info },
                stale,
            });
        }
        Err(LockError::Io {
            action: "lock",
            path,
            source: std::io::Error::other("the lock file kept being replaced by another process"),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What this lock wrote into the file (this process's pid, host and start time).
    pub fn info(&self) -> &LockInfo {
        &self.info
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Remove while still locked so a waiting process never locks a file that is about to
        // vanish; the lock itself goes with the file handle right after.
        if let Err(err) = fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %err, "could not remove the lock file");
        }
        let _ = self.file.unlock();
    }
}

/// Builds the "held" error from the holder's file, giving a holder that has just locked a short
/// moment to write its details.
fn held(file: &mut File, path: &Path) -> LockError {
    for _ in 0..ATTEMPTS {
        if let Ok(text) = read_content(file) {
            if let Ok(info) = serde_json::from_str::<LockInfo>(&text) {
                return LockError::Held {
                    pid: info.pid,
                    host: info.host,
                    started_at: info.started_at,
                    path: path.to_path_buf(),
                };
            }
        }
        std::thread::sleep(HOLDER_WRITE_WAIT);
    }
    LockError::HeldUnknown {
        path: path.to_path_buf(),
    }
}

/// Reads the whole file from the start.
fn read_content(file: &mut File) -> std::io::Result<String> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut text)?;
    Ok(text)
}

/// Replaces the file's content with `info` as JSON and syncs it.
fn write_info(file: &mut File, info: &LockInfo) -> std::io::Result<()> {
    let json = serde_json::to_string(info).map_err(std::io::Error::other)?;
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(json.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_removes_the_file_and_frees_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let acquired = RunLock::acquire(dir.path()).unwrap();
        assert!(acquired.stale.is_none());
        let path = acquired.lock.path().to_path_buf();
        let on_disk: LockInfo = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(on_disk.pid, std::process::id());
        assert_eq!(&on_disk, acquired.lock.info());
        drop(acquired);
        assert!(!path.exists());
        let again = RunLock::acquire(dir.path()).unwrap();
        assert!(
            again.stale.is_none(),
            "a clean release leaves nothing stale"
        );
    }

    #[test]
    fn unreadable_stale_file_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(LOCK_FILE), "garbage").unwrap();
        let acquired = RunLock::acquire(dir.path()).unwrap();
        assert!(acquired.stale.is_none());
        let text = fs::read_to_string(acquired.lock.path()).unwrap();
        assert!(
            text.contains(&format!("\"pid\":{}", std::process::id())),
            "{text}"
        );
    }
}
