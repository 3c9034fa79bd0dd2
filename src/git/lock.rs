//! Locks of other git processes: ralph waits for a lock an agent's git command holds for a
//! moment ([`Repo::retry_locked`], [`Repo::wait_index_unlocked`]) and removes only the locks no
//! process holds any more ([`Repo::clear_stale_locks`], after a killed process).

use std::path::PathBuf;

use super::{GitError, Repo};

/// Every file some process has open, from `/proc/*/fd` (Linux; empty elsewhere or when `/proc`
/// cannot be read, which makes lock clean-up rely on the age test alone).
fn open_files() -> std::collections::HashSet<std::path::PathBuf> {
    let mut open = std::collections::HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return open;
    };
    for p in procs.flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                open.insert(target);
            }
        }
    }
    open
}

/// How long ralph waits for a lock another git process holds on a repository it writes (an
/// agent's `git add` or `git commit` in the main checkout holds `index.lock` for a moment): 10 s,
/// or `RALPH_GIT_LOCK_WAIT_MS` milliseconds when set (tests; slow network filesystems).
pub fn lock_wait() -> std::time::Duration {
    std::env::var("RALPH_GIT_LOCK_WAIT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(
            std::time::Duration::from_secs(10),
            std::time::Duration::from_millis,
        )
}

/// How often a held lock is looked at again while ralph waits for it.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl GitError {
    /// Whether another git process's lock refused the operation (a libgit2 `Locked` error, or
    /// [`GitError::Locked`] after waiting).
    pub fn is_locked(&self) -> bool {
        match self {
            GitError::Locked { .. } => true,
            GitError::Git { source, .. } => source.code() == git2::ErrorCode::Locked,
            _ => false,
        }
    }
}

impl Repo {
    /// The index's lock file (`<git dir>/index.lock`).
    pub fn index_lock(&self) -> PathBuf {
        self.repo.path().join("index.lock")
    }

    /// Runs `write` (an index or reference write on this repository that can simply be done
    /// again: it reads what it needs afresh), and while another git process's lock refuses it,
    /// waits and runs it again, every 50 ms for at most [`lock_wait`].
    ///
    /// # Errors
    /// [`GitError::Locked`] naming the lock file when the lock is still held after that;
    /// `write`'s other errors as they are.
    pub fn retry_locked<T>(
        &self,
        mut write: impl FnMut() -> Result<T, GitError>,
    ) -> Result<T, GitError> {
        let started = std::time::Instant::now();
        let wait = lock_wait();
        loop {
            match write() {
                Err(e) if e.is_locked() => {
                    if started.elapsed() >= wait {
                        return Err(self.locked_error(e, wait));
                    }
                    std::thread::sleep(LOCK_POLL);
                }
                done => return done,
            }
        }
    }

    /// Waits (every 50 ms, at most [`lock_wait`]) until no git process holds the index's lock;
    /// returns whether it is free now.
    pub fn wait_index_unlocked(&self) -> bool {
        let started = std::time::Instant::now();
        let lock = self.index_lock();
        while lock.exists() {
            if started.elapsed() >= lock_wait() {
                return false;
            }
            std::thread::sleep(LOCK_POLL);
        }
        true
    }

    /// [`GitError::Locked`] for a lock error `e` after waiting `wait`: the lock file named in
    /// libgit2's message (`failed to lock file '…/x.lock'`), else the index's.
    fn locked_error(&self, e: GitError, wait: std::time::Duration) -> GitError {
        let (op, text) = match &e {
            GitError::Locked { .. } => return e,
            GitError::Git { op, source } => (*op, source.message().to_owned()),
            _ => ("write", String::new()),
        };
        let named = text
            .split('\'')
            .find(|part| part.ends_with(".lock"))
            .map(PathBuf::from);
        GitError::Locked {
            op,
            lock: named.unwrap_or_else(|| self.index_lock()),
            waited_secs: wait.as_secs(),
        }
    }

    /// Removes git lock files (`index.lock`, `HEAD.lock`, `refs/**/*.lock`) that no process has
    /// open: left behind by a process killed while it held them (a SIGKILLed ralph in the middle
    /// of a checkpoint commit), they make every later commit fail. A lock some process has open
    /// (`/proc/*/fd`, Linux) belongs to a git command at work and is left alone; so is one that
    /// disappears within 100 ms (git closes a lock just before renaming it). Returns the paths removed, relative to the `.git` directory. Never fails:
    /// unreadable directories and locks that cannot be removed are skipped (the commit that needs
    /// one reports it).
    pub fn clear_stale_locks(&self) -> Vec<String> {
        let git_dir = self.repo.path().to_path_buf();
        let mut candidates = vec![git_dir.join("index.lock"), git_dir.join("HEAD.lock")];
        let mut dirs = vec![git_dir.join("refs")];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "lock") {
                    candidates.push(p);
                }
            }
        }
        let unheld = |candidates: Vec<std::path::PathBuf>| {
            let open = open_files();
            candidates
                .into_iter()
                .filter(|l| l.exists() && !open.contains(l))
                .collect::<Vec<_>>()
        };
        let mut suspects = unheld(candidates);
        if suspects.is_empty() {
            return Vec::new();
        }
        // git closes a lock file just before renaming it into place: a lock nobody holds twice,
        // 100 ms apart, is not in that moment.
        std::thread::sleep(std::time::Duration::from_millis(100));
        suspects = unheld(suspects);
        let mut removed = Vec::new();
        for lock in suspects {
            if std::fs::remove_file(&lock).is_ok() {
                removed.push(
                    lock.strip_prefix(&git_dir)
                        .unwrap_or(&lock)
                        .display()
                        .to_string(),
                );
            }
        }
        removed
    }
}
