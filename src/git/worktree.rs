//! `--parallel`'s story worktrees: linked git worktrees (`git worktree`), one per story in flight,
//! each with a detached HEAD at the run branch's tip when the story starts
//! (`.ralph/worktrees/<run>/<story>-<iteration>`, docs/architecture.md says why there).
//!
//! A worktree is made by the `git` program (`git worktree add --detach`, through
//! [`crate::process::capture`]): libgit2 can only make a worktree on a branch, and ralph's
//! workers must not create branches. Everything else (listing, removing, checking what a leftover
//! holds) is libgit2. The worktree's hooks do not run when it is made (`core.hooksPath` is
//! pointed at an empty directory for that command): what a fresh worktree needs is
//! `worktree_setup`'s job, declared in ralph.toml, not a `post-checkout` hook's.
//!
//! Removing never deletes a reference or a branch: the story's work must already be landed or
//! saved ([`super::land::salvage`]) when its worktree goes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use git2::{Repository, StatusOptions, WorktreePruneOptions};

use super::{op, GitError, Repo};

/// How long a `git worktree add` may take before it is killed (a checkout of a very large
/// repository on a slow disk).
const ADD_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a story's worktree is locked (`git worktree list` shows it).
pub const LOCK_REASON: &str =
    "ralph: a story in flight (--parallel); ralph removes it when the story lands or is saved";

/// Variables that would point git at another repository than the one ralph names.
const GIT_LOCATION_VARS: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
];

/// `id` (a story id such as `US-001` or `a/b`) as one path component and one reference-name
/// component: ASCII letters, digits, `-` and `_` are kept, `.` too unless it would make an
/// invalid name (leading, doubled, trailing, `.lock`), and every other byte is written `%XX`, so
/// two ids never map to the same name. An empty id is `%`.
pub fn safe_name(id: &str) -> String {
    if id.is_empty() {
        return "%".to_owned();
    }
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(id.len());
    for (i, &b) in bytes.iter().enumerate() {
        let dot_ok = b == b'.'
            && i > 0
            && i + 1 < bytes.len()
            && bytes[i - 1] != b'.'
            && bytes[i + 1] != b'.';
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || dot_ok {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if let Some(stem) = out.strip_suffix(".lock") {
        out = format!("{stem}%2Elock");
    }
    out
}

/// `path` made absolute against `base` (when relative) with `.` and `..` resolved lexically, and
/// its existing prefix canonicalized (symlinks resolved), so that two spellings of one place
/// compare equal.
fn normalized(base: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut clean = PathBuf::new();
    for part in joined.components() {
        match part {
            std::path::Component::ParentDir => {
                clean.pop();
            }
            std::path::Component::CurDir => {}
            other => clean.push(other),
        }
    }
    // Canonicalize the longest prefix that exists, then put the rest back.
    let mut rest = Vec::new();
    let mut probe = clean.clone();
    loop {
        if let Ok(real) = probe.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (probe.file_name().map(|n| n.to_os_string()), probe.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                probe = parent.to_path_buf();
            }
            _ => return clean,
        }
    }
}

impl Repo {
    /// Makes a new worktree at `root` (absolute, or relative to this repository's root; parent
    /// directories are created) with a **detached HEAD at `base`** (a full sha) and its files
    /// checked out, **locked** ([`LOCK_REASON`]: `git worktree remove --force` refuses it). No
    /// branch is created.
    ///
    /// Something already at `root` (left by a ralph that was killed) is refused, unless it is a
    /// worktree of this repository whose HEAD commit some reference keeps (a branch, a tag,
    /// `refs/ralph/…`) and which has no uncommitted, non-ignored changes: that one is removed
    /// first ([`Repo::remove_worktree`]). An empty directory is used as it is. A registration
    /// whose directory is gone is pruned first.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `base` is not a commit; [`GitError::WorktreeInTheWay`]
    /// naming `root` and what to do; [`GitError::Command`] when `git worktree add` fails or `git`
    /// cannot be run; [`GitError::Git`].
    pub fn add_worktree(&self, root: &Path, base: &str) -> Result<(), GitError> {
        let sha = self.resolve_commit(base)?.id().to_string();
        let root = normalized(&self.root, root);
        if normalized(&self.root, &self.root).starts_with(&root) {
            return Err(GitError::WorktreeInTheWay {
                path: root,
                why: "this is the main checkout, not a place for a story's worktree".to_owned(),
            });
        }
        let registered = self.registered_worktrees()?;
        if let Some((name, _)) = registered.iter().find(|(_, p)| *p == root) {
            if !root.exists() {
                self.prune_worktree(name)?;
            }
        }
        if root.exists() && !is_empty_dir(&root) {
            self.clear_leftover(&root, &registered)?;
        }
        if let Some(parent) = root.parent() {
            std::fs::create_dir_all(parent).map_err(|e| GitError::WorktreeInTheWay {
                path: root.clone(),
                why: format!("cannot create {}: {e}", parent.display()),
            })?;
        }
        let no_hooks = tempfile::tempdir().map_err(|e| GitError::Command {
            command: "git worktree add".to_owned(),
            detail: format!("cannot make an empty hooks directory: {e}"),
        })?;
        let hooks = format!("core.hooksPath={}", no_hooks.path().display());
        let root_arg = root.to_string_lossy().into_owned();
        // Locked: an agent's `git worktree remove --force` (or a user's `git worktree prune`)
        // cannot take the story's worktree, and with it the commits only its HEAD holds, from
        // under ralph; ralph's own removal prunes locked entries ([`Repo::remove_worktree`]).
        self.run_git(&[
            "-c",
            &hooks,
            "worktree",
            "add",
            "--detach",
            "--lock",
            "--reason",
            LOCK_REASON,
            "--quiet",
            &root_arg,
            &sha,
        ])?;
        let made = Repo::discover(&root)?;
        if made.head_sha()?.as_deref() != Some(sha.as_str()) {
            return Err(GitError::Command {
                command: format!("git worktree add --detach {root_arg} {sha}"),
                detail: "the new worktree's HEAD is not at the requested commit".to_owned(),
            });
        }
        Ok(())
    }

    /// Removes the worktree at `root` (absolute, or relative to this repository's root): its
    /// directory with everything in it, untracked and ignored files included, and git's
    /// administrative entry for it (`.git/worktrees/<name>`). Never deletes a reference or a
    /// branch. Nothing at `root` and no registration: nothing to do.
    ///
    /// The worktree's HEAD commit must be kept by some reference (landed on the run branch, or
    /// saved by [`super::land::salvage`]): a worktree holding commits nothing else keeps is never
    /// removed.
    ///
    /// # Errors
    /// [`GitError::WorktreeInTheWay`] when `root` is the main checkout, a directory that is not
    /// a worktree of this repository, or a worktree whose HEAD no reference keeps (never
    /// deleted); [`GitError::Git`] when it cannot be deleted or pruned.
    pub fn remove_worktree(&self, root: &Path) -> Result<(), GitError> {
        let root = normalized(&self.root, root);
        if normalized(&self.root, &self.root).starts_with(&root) {
            return Err(GitError::WorktreeInTheWay {
                path: root,
                why: "this is the main checkout: ralph never removes it".to_owned(),
            });
        }
        let registered = self.registered_worktrees()?;
        let Some((name, _)) = registered.into_iter().find(|(_, p)| *p == root) else {
            if !root.exists() {
                return Ok(());
            }
            return Err(GitError::WorktreeInTheWay {
                path: root,
                why: "not a worktree of this repository, so ralph leaves it alone\nhint: look at what it holds, then move or delete it yourself".to_owned(),
            });
        };
        if let Some(head) = Repository::open(&root)
            .ok()
            .and_then(|r| r.head().ok().and_then(|h| h.target()))
        {
            if !self.commit_is_kept(head)? {
                return Err(GitError::WorktreeInTheWay {
                    path: root,
                    why: format!("its HEAD {head} is kept by no branch or reference, so removing the worktree would lose it\nhint: land it or save it first (`refs/ralph/salvage/…`, `git branch <name> {head}`)"),
                });
            }
        }
        if root.exists() {
            remove_tree(&root).map_err(|e| GitError::WorktreeInTheWay {
                path: root.clone(),
                why: format!("cannot delete the worktree's files: {e}"),
            })?;
        }
        self.prune_worktree(&name)
    }

    /// The roots of this repository's registered worktrees (made by ralph or not) that lie
    /// under `dir` (absolute, or relative to this repository's root), including those whose
    /// directory is gone; sorted. For crash recovery: what a killed ralph left under
    /// `.ralph/worktrees/`. Empty when the list cannot be read.
    pub fn worktrees_under(&self, dir: &Path) -> Vec<PathBuf> {
        let dir = normalized(&self.root, dir);
        let mut found: Vec<PathBuf> = self
            .registered_worktrees()
            .unwrap_or_default()
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p.starts_with(&dir) && *p != dir)
            .collect();
        found.sort();
        found
    }

    /// Prunes the registrations at or under `dir` (absolute, or relative to this repository's
    /// root) whose directory is gone (deleted by an agent's `rm -rf`, or a ralph killed while
    /// removing one): locked ([`LOCK_REASON`]), git never prunes them itself. Returns
    /// `(root, HEAD sha)` of each pruned worktree whose HEAD commit no reference keeps: the
    /// caller keeps it ([`super::land::salvage`]) before git's garbage collection could take it.
    ///
    /// # Errors
    /// [`GitError::Git`] when the worktrees cannot be listed or an entry cannot be pruned.
    pub fn prune_gone_worktrees(&self, dir: &Path) -> Result<Vec<(PathBuf, String)>, GitError> {
        let dir = normalized(&self.root, dir);
        let mut unkept = Vec::new();
        for (name, root) in self.registered_worktrees()? {
            if !root.starts_with(&dir) || root.exists() {
                continue;
            }
            // The entry's HEAD file still names the worktree's last commit (detached).
            let head = std::fs::read_to_string(
                self.repo.path().join("worktrees").join(&name).join("HEAD"),
            )
            .ok()
            .and_then(|h| git2::Oid::from_str(h.trim()).ok())
            .filter(|oid| self.repo.find_commit(*oid).is_ok());
            if let Some(oid) = head {
                if !self.commit_is_kept(oid)? {
                    unkept.push((root.clone(), oid.to_string()));
                }
            }
            self.prune_worktree(&name)?;
        }
        Ok(unkept)
    }

    /// Whether git ignores `path` (relative to this checkout's root), by `.gitignore`,
    /// `.git/info/exclude` or `core.excludesFile`. It is asked as a directory when it ends with
    /// `/` or is a directory here (so `node_modules/` matches a `node_modules/` rule before the
    /// directory exists). A path git tracks, or a directory holding tracked files, is not
    /// ignored.
    ///
    /// # Errors
    /// [`GitError::Git`] when the ignore rules or the index cannot be read.
    pub fn is_ignored(&self, path: &str) -> Result<bool, GitError> {
        let trimmed = path.trim_end_matches('/');
        let index = self.repo.index().map_err(op("read index"))?;
        if index.get_path(Path::new(trimmed), 0).is_some() {
            return Ok(false);
        }
        if path.ends_with('/') || self.root.join(trimmed).is_dir() {
            let prefix = format!("{trimmed}/");
            let tracked_inside = index.iter().any(|e| e.path.starts_with(prefix.as_bytes()));
            if tracked_inside {
                return Ok(false);
            }
            return self
                .repo
                .is_path_ignored(Path::new(&prefix))
                .map_err(op("read ignore rules"));
        }
        self.repo
            .is_path_ignored(Path::new(trimmed))
            .map_err(op("read ignore rules"))
    }

    /// `(admin name, root)` of every linked worktree git knows (roots normalized).
    fn registered_worktrees(&self) -> Result<Vec<(String, PathBuf)>, GitError> {
        let names = self.repo.worktrees().map_err(op("list worktrees"))?;
        let mut out = Vec::new();
        for name in names.iter().flatten() {
            if let Ok(wt) = self.repo.find_worktree(name) {
                out.push((name.to_owned(), normalized(&self.root, wt.path())));
            }
        }
        Ok(out)
    }

    /// Deletes git's administrative entry `name` (`.git/worktrees/<name>`), locked or not; the
    /// directory itself is left as it is.
    fn prune_worktree(&self, name: &str) -> Result<(), GitError> {
        let wt = self.repo.find_worktree(name).map_err(op("find worktree"))?;
        let mut opts = WorktreePruneOptions::new();
        opts.valid(true).locked(true).working_tree(false);
        wt.prune(Some(&mut opts)).map_err(op("prune worktree"))
    }

    /// Removes what a killed ralph left at `root`, or says why it cannot (see
    /// [`Repo::add_worktree`]).
    fn clear_leftover(
        &self,
        root: &Path,
        registered: &[(String, PathBuf)],
    ) -> Result<(), GitError> {
        let in_the_way = |why: String| GitError::WorktreeInTheWay {
            path: root.to_path_buf(),
            why,
        };
        if !registered.iter().any(|(_, p)| p == root) {
            return Err(in_the_way(
                "something is already there and it is not a worktree of this repository\nhint: look at what it holds, then move or delete it yourself".to_owned(),
            ));
        }
        // Open the leftover itself (not the main repository above it, should its `.git` file be
        // broken).
        let left = Repository::open(root).map_err(|e| {
            in_the_way(format!("a worktree of this repository that git cannot open ({e})\nhint: run `git worktree remove --force {}` after saving what it holds", root.display()))
        })?;
        let head = left
            .head()
            .and_then(|h| h.peel_to_commit())
            .map_err(|e| in_the_way(format!("its HEAD cannot be read ({e})")))?
            .id();
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .include_ignored(false)
            .exclude_submodules(true);
        let dirty = left
            .statuses(Some(&mut opts))
            .map_err(op("status"))?
            .iter()
            .any(|e| !e.status().is_empty() && !e.status().is_ignored());
        if dirty {
            return Err(in_the_way(format!("a worktree left by an earlier run holds uncommitted work\nhint: commit it there (`git -C {} add -A && git -C {0} commit`) or delete it, then run ralph again", root.display())));
        }
        if !self.commit_is_kept(head)? {
            return Err(in_the_way(format!("a worktree left by an earlier run holds commit {head} that no branch or reference keeps\nhint: keep it (`git branch <name> {head}`), then run ralph again")));
        }
        self.remove_worktree(root)
    }

    /// Whether some reference (branch, tag, `refs/ralph/…`, a remote-tracking branch) points
    /// at `oid` or at a descendant of it.
    ///
    /// Branches and salvage refs are looked at first (where landed or saved work is), so the
    /// usual answer costs a few history walks however many `refs/ralph/<run>/<n>/…` pins exist.
    fn commit_is_kept(&self, oid: git2::Oid) -> Result<bool, GitError> {
        for glob in ["refs/heads/*", "refs/ralph/salvage/*", "*"] {
            for reference in self
                .repo
                .references_glob(glob)
                .map_err(op("list references"))?
                .flatten()
            {
                if let Ok(commit) = reference.peel_to_commit() {
                    let tip = commit.id();
                    if tip == oid || self.repo.graph_descendant_of(tip, oid).unwrap_or(false) {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// The commits no reference and no reflog keeps (`git fsck`'s dangling commits) that descend
    /// from `base` (a full sha) and were made at or after `since` (one second of slack for git's
    /// whole-second dates), by their committer date or, as an agent may set that date
    /// (`GIT_COMMITTER_DATE`), by when their loose object file was written: work an agent made in a worktree whose registration it deleted
    /// too (`git worktree remove -f -f`, or `rm -rf` and `git worktree prune` of an unlocked
    /// one), which nothing else names. Returns the tips only (a commit that is an ancestor of
    /// another one found is left out: the tip keeps it), newest commit first.
    ///
    /// Such commits stay in the object store until git's garbage collection prunes loose
    /// objects (two weeks by default; an agent's `git gc --prune=now` takes them at once).
    ///
    /// # Errors
    /// [`GitError::Command`] when `git fsck` cannot run or fails.
    pub fn unreachable_work(
        &self,
        base: &str,
        since: std::time::SystemTime,
    ) -> Result<Vec<String>, GitError> {
        let base = self.resolve_commit(base)?.id();
        let since = since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            - 1;
        // Dangling (not `--unreachable`): the tips of what nothing keeps, so the list stays
        // short in a repository with a long history of rewritten commits.
        let listed = self.git_output(&["fsck", "--connectivity-only", "--no-progress"])?;
        let mut found: Vec<(i64, git2::Oid)> = listed
            .lines()
            .filter_map(|line| line.strip_prefix("dangling commit "))
            .filter_map(|sha| git2::Oid::from_str(sha.trim()).ok())
            .filter_map(|oid| self.repo.find_commit(oid).ok())
            .filter(|c| {
                c.committer().when().seconds() >= since || self.written_since(c.id(), since)
            })
            .filter(|c| {
                c.id() != base && self.repo.graph_descendant_of(c.id(), base).unwrap_or(false)
            })
            .map(|c| (c.committer().when().seconds(), c.id()))
            .collect();
        let all: Vec<git2::Oid> = found.iter().map(|(_, oid)| *oid).collect();
        found.retain(|(_, oid)| {
            !all.iter()
                .any(|other| self.repo.graph_descendant_of(*other, *oid).unwrap_or(false))
        });
        found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(found.into_iter().map(|(_, oid)| oid.to_string()).collect())
    }

    /// Whether `oid` is a loose object whose file was written at or after `since` (seconds since
    /// the Unix epoch). A packed object says no.
    fn written_since(&self, oid: git2::Oid, since: i64) -> bool {
        let hex = oid.to_string();
        let file = self
            .repo
            .path()
            .join("objects")
            .join(&hex[..2])
            .join(&hex[2..]);
        std::fs::metadata(file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .is_some_and(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX) >= since)
    }

    /// Whether a git command is rewriting this checkout right now, so that its files may
    /// already be another commit's while HEAD is not: `index.lock` is held (`git checkout`
    /// writes the files under it), or the index on disk is exactly the tree of a local branch's
    /// tip other than HEAD's (the checkout wrote its index and has not moved HEAD yet).
    /// A user's `git add` makes neither true for more than a moment.
    pub fn checkout_in_progress(&self) -> bool {
        if self.repo.path().join("index.lock").exists() {
            return true;
        }
        let Ok(mut index) = self.repo.index() else {
            return false;
        };
        if index.read(false).is_err() {
            return false;
        }
        let Ok(staged) = index.write_tree() else {
            return false;
        };
        let head = self
            .repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_tree().ok())
            .map(|t| t.id());
        if head == Some(staged) {
            return false;
        }
        let Ok(branches) = self.repo.references_glob("refs/heads/*") else {
            return false;
        };
        branches
            .flatten()
            .filter_map(|r| r.peel_to_tree().ok())
            .any(|t| t.id() == staged)
    }

    /// `git reset --keep <sha>` in this checkout: HEAD's branch and the checkout's files move
    /// to `sha`, and every uncommitted change (staged or not) stays; git refuses, changing
    /// nothing, when a file with such a change differs between HEAD and `sha`.
    ///
    /// # Errors
    /// [`GitError::Command`] with git's words when it refuses or cannot run.
    pub fn reset_keep(&self, sha: &str) -> Result<(), GitError> {
        let sha = self.resolve_commit(sha)?.id().to_string();
        self.run_git(&["reset", "--quiet", "--keep", &sha])
    }

    /// Runs the `git` program with `args` in this repository's root, its environment's
    /// repository variables removed.
    fn run_git(&self, args: &[&str]) -> Result<(), GitError> {
        self.git_output(args).map(|_| ())
    }

    /// Runs the `git` program with `args` in this repository's root, its environment's
    /// repository variables removed, and returns its standard output.
    fn git_output(&self, args: &[&str]) -> Result<String, GitError> {
        let command = format!("git {}", args.join(" "));
        let spec = crate::process::SpawnSpec {
            program: "git".into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: self.root.clone(),
            env_remove: GIT_LOCATION_VARS.iter().map(|v| (*v).to_owned()).collect(),
            env_set: vec![("GIT_TERMINAL_PROMPT".into(), "0".into())],
            stdin: None,
        };
        let out =
            crate::process::capture(&spec, Some(ADD_TIMEOUT)).map_err(|e| GitError::Command {
                command: command.clone(),
                detail: format!("{e}\nhint: install git (https://git-scm.com/downloads)"),
            })?;
        if out.success() {
            return Ok(out.stdout);
        }
        let text = format!("{}{}", out.stdout, out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(10).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let how = if out.timed_out {
            format!(
                "timed out after {}",
                humantime::format_duration(ADD_TIMEOUT)
            )
        } else {
            out.exit.to_string()
        };
        Err(GitError::Command {
            command,
            detail: crate::redact::redact_env(&format!("{how}: {}", tail.join("\n"))),
        })
    }
}

/// Whether `dir` is a directory with nothing in it.
fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

/// Deletes `dir` and everything in it; directories a tool made read-only (a Go module cache)
/// are made writable first when a plain delete is refused.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            make_dirs_writable(dir);
            std::fs::remove_dir_all(dir)
        }
        Err(e) => Err(e),
    }
}

/// Adds the owner's write and search bits to every directory under `dir` (symlinks not
/// followed), so that their entries can be deleted. Errors are skipped: the delete reports them.
fn make_dirs_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let mode = meta.permissions().mode();
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode | 0o700));
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
}

impl Repo {
    /// Whether this checkout's index (as on disk now) holds exactly the tree of commit `sha`:
    /// someone committed here (a user's `git commit` in the checkout), as opposed to a
    /// reference moved from elsewhere, which leaves the index behind. `false` when unreadable.
    pub fn index_is_tree_of(&self, sha: &str) -> bool {
        let Ok(commit) = self.resolve_commit(sha) else {
            return false;
        };
        let Ok(mut index) = self.repo.index() else {
            return false;
        };
        if index.read(false).is_err() {
            return false;
        }
        index
            .write_tree()
            .is_ok_and(|tree| commit.tree_id() == tree)
    }

    /// Whether this checkout's own HEAD made every move of its branch from `from` to `to`:
    /// HEAD's reflog, newest first, chains from `to` back to `from` (each entry's old commit is
    /// the next one's new), within its last 200 entries. A move made from a linked worktree
    /// (`git update-ref`, a commit on the branch checked out there with
    /// `--ignore-other-worktrees`) is logged in the branch's reflog and that worktree's HEAD
    /// reflog, never in this checkout's HEAD reflog, so the chain breaks there: `false`. `None`
    /// when HEAD has no reflog (`core.logAllRefUpdates` off): the question cannot be answered.
    pub fn moved_from_here(&self, from: &str, to: &str) -> Option<bool> {
        let reflog = self.repo.reflog("HEAD").ok()?;
        if reflog.is_empty() {
            return None;
        }
        let (Ok(from), Ok(mut at)) = (git2::Oid::from_str(from), git2::Oid::from_str(to)) else {
            return Some(false);
        };
        for entry in reflog.iter().take(200) {
            if entry.id_new() != at {
                return Some(false);
            }
            if entry.id_old() == from {
                return Some(true);
            }
            at = entry.id_old();
        }
        Some(false)
    }

    /// The commits (full shas, oldest first) among the steps of this checkout's HEAD reflog
    /// from `from` to `to` (as [`Repo::moved_from_here`] walks them) that a process of one of
    /// ralph's agents made: their reflog message starts with
    /// [`crate::process::REFLOG_ACTION_PREFIX`] (`git -C <this checkout> commit` run by an
    /// agent). Empty without a reflog or when the chain breaks.
    pub fn agent_steps_here(&self, from: &str, to: &str) -> Vec<String> {
        let Ok(reflog) = self.repo.reflog("HEAD") else {
            return Vec::new();
        };
        let (Ok(from), Ok(mut at)) = (git2::Oid::from_str(from), git2::Oid::from_str(to)) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in reflog.iter().take(200) {
            if entry.id_new() != at {
                return Vec::new();
            }
            if entry
                .message()
                .is_some_and(|m| m.starts_with(crate::process::REFLOG_ACTION_PREFIX))
            {
                found.push(at.to_string());
            }
            if entry.id_old() == from {
                found.reverse();
                return found;
            }
            at = entry.id_old();
        }
        Vec::new()
    }

    /// The iterations of run `run_id` whose agents made the steps of this checkout's HEAD reflog
    /// that [`Repo::agent_steps_here`] finds from `from` to `to` (their reflog messages read
    /// `ralph agent <run id>/<iteration>: …`), ascending, without repeats. Empty when the
    /// reflog names none (an agent that cleared its environment: ralph cannot tell which).
    pub fn agent_step_iterations(&self, run_id: &str, from: &str, to: &str) -> Vec<u32> {
        let Ok(reflog) = self.repo.reflog("HEAD") else {
            return Vec::new();
        };
        let (Ok(from), Ok(mut at)) = (git2::Oid::from_str(from), git2::Oid::from_str(to)) else {
            return Vec::new();
        };
        let prefix = format!("{}{run_id}/", crate::process::REFLOG_ACTION_PREFIX);
        let mut found = std::collections::BTreeSet::new();
        for entry in reflog.iter().take(200) {
            if entry.id_new() != at {
                return Vec::new();
            }
            let n = entry
                .message()
                .and_then(|m| m.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u32>().ok());
            found.extend(n);
            if entry.id_old() == from {
                return found.into_iter().collect();
            }
            at = entry.id_old();
        }
        Vec::new()
    }

    /// Where HEAD was before the newest run of steps of this checkout's HEAD reflog that a
    /// process of one of ralph's agents made ([`crate::process::REFLOG_ACTION_PREFIX`], as
    /// [`Repo::agent_steps_here`] tells them): the newest entry's commit (full sha) when that
    /// step is not an agent's. The walk starts at the reflog's newest entry, not at HEAD: a move
    /// of the branch made without this checkout (`git update-ref` from another worktree) is in
    /// no entry here, so it is never taken for a step of this checkout's. `None` without a
    /// reflog, or when its chain breaks within its last 200 entries.
    pub fn head_before_agent_steps(&self) -> Option<String> {
        let reflog = self.repo.reflog("HEAD").ok()?;
        let mut at = reflog.get(0)?.id_new();
        for entry in reflog.iter().take(200) {
            if entry.id_new() != at {
                return None;
            }
            let by_agent = entry
                .message()
                .is_some_and(|m| m.starts_with(crate::process::REFLOG_ACTION_PREFIX));
            if !by_agent {
                return Some(at.to_string());
            }
            at = entry.id_old();
        }
        None
    }

    /// The commit the newest entry of this checkout's HEAD reflog moved HEAD to (full sha);
    /// `None` without a reflog.
    pub fn head_reflog_newest(&self) -> Option<String> {
        let reflog = self.repo.reflog("HEAD").ok()?;
        reflog.get(0).map(|e| e.id_new().to_string())
    }

    /// Detaches this checkout's HEAD at the commit it points at, when it is on a branch (an
    /// agent in a story's worktree that checked a branch out); files and index stay as they are.
    /// Returns the branch it was on, `None` when HEAD was already detached (or unborn).
    ///
    /// # Errors
    /// [`GitError::Git`] when HEAD cannot be read or moved.
    pub fn detach_head(&self) -> Result<Option<String>, GitError> {
        let head = self.repo.head().map_err(op("read HEAD"))?;
        if !head.is_branch() {
            return Ok(None);
        }
        let name = head.shorthand().unwrap_or_default().to_owned();
        let id = head.peel_to_commit().map_err(op("read HEAD"))?.id();
        self.repo.set_head_detached(id).map_err(op("detach HEAD"))?;
        Ok(Some(name))
    }
}

/// The file in a worktree's private git directory (`.git/worktrees/<name>/`, never part of any
/// commit, gone with the worktree) where [`Repo::record_setup_files`] writes what
/// `worktree_setup` left untracked: one line per file, `<bytes>\t<mtime ns>\t<path>`.
const SETUP_FILES: &str = "ralph-setup-files";

impl Repo {
    /// This checkout's own git directory (for a linked worktree `.git/worktrees/<name>/`): files
    /// ralph keeps there are in no commit and go with the worktree.
    pub fn private_dir(&self) -> &Path {
        self.repo.path()
    }

    /// The untracked, not ignored files of the working tree (repository-relative, sorted; the
    /// files inside untracked directories listed one by one).
    ///
    /// # Errors
    /// [`GitError::Git`] when the status cannot be read.
    pub fn untracked_files(&self) -> Result<Vec<String>, GitError> {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(false);
        let statuses = self.repo.statuses(Some(&mut opts)).map_err(op("status"))?;
        let mut files: Vec<String> = statuses
            .iter()
            .filter(|e| e.status().contains(git2::Status::WT_NEW))
            .filter_map(|e| e.path().map(str::to_owned))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Writes down the untracked files as they are now (size and modification time), in this
    /// worktree's private git directory: called after `worktree_setup`, before the agent starts,
    /// so that [`Repo::setup_files_unchanged`] can tell the setup's files from the agent's.
    ///
    /// # Errors
    /// The status cannot be read or the record cannot be written.
    pub fn record_setup_files(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        for file in self.untracked_files()? {
            if let Some((len, at)) = stamp(&self.root.join(&file)) {
                text.push_str(&format!("{len}\t{at}\t{file}\n"));
            }
        }
        std::fs::write(self.repo.path().join(SETUP_FILES), text)?;
        Ok(())
    }

    /// The files [`Repo::record_setup_files`] wrote down that are still in no commit of HEAD, with the same
    /// size and modification time: the setup's, not the agent's (a setup file the agent changed
    /// counts as its work). Empty when nothing was written down.
    pub fn setup_files_unchanged(&self) -> Vec<String> {
        let Ok(text) = std::fs::read_to_string(self.repo.path().join(SETUP_FILES)) else {
            return Vec::new();
        };
        // Not in HEAD's tree (ralph's own stages may have staged it since: the index says
        // nothing).
        let head = self.repo.head().ok().and_then(|h| h.peel_to_tree().ok());
        let committed = |file: &str| {
            head.as_ref()
                .is_some_and(|t| t.get_path(Path::new(file)).is_ok())
        };
        text.lines()
            .filter_map(|line| {
                let mut parts = line.splitn(3, '\t');
                let (len, at, file) = (parts.next()?, parts.next()?, parts.next()?);
                let now = stamp(&self.root.join(file))?;
                (!committed(file)
                    && (now.0.to_string(), now.1.to_string()) == (len.to_owned(), at.to_owned()))
                    .then(|| file.to_owned())
            })
            .collect()
    }
}

/// A file's size in bytes and modification time in nanoseconds since the epoch (not following
/// a symbolic link).
fn stamp(path: &Path) -> Option<(u64, u128)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let at = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some((meta.len(), at))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::git::tests::git;

    /// A repository with one commit (`a.txt`) and its sha.
    pub(crate) fn repo_with_commit() -> (tempfile::TempDir, Repo, String) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir_all(&root).unwrap();
        git2::Repository::init(&root).unwrap();
        std::fs::write(root.join(".gitignore"), ".ralph/\n").unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        let repo = Repo::discover(&root).unwrap();
        let sha = repo.commit_all("one", "", &[]).unwrap().unwrap();
        (dir, repo, sha)
    }

    #[test]
    fn safe_name_keeps_plain_ids_and_escapes_the_rest_without_collisions() {
        assert_eq!(safe_name("US-001"), "US-001");
        assert_eq!(safe_name("story_2.1"), "story_2.1");
        assert_eq!(safe_name("a/b"), "a%2Fb");
        assert_ne!(safe_name("a/b"), safe_name("a-b"));
        assert_eq!(safe_name(".hidden"), "%2Ehidden");
        assert_eq!(safe_name("x..y"), "x%2E%2Ey");
        assert_eq!(safe_name("end."), "end%2E");
        assert_eq!(safe_name("a.lock"), "a%2Elock");
        assert_eq!(safe_name(""), "%");
        for id in [
            "US-001", "a/b", "x y", "ü", "a..b", "@{x}", "a.lock", "~^:?*[\\",
        ] {
            let name = format!("refs/ralph/salvage/run/{}", safe_name(id));
            assert!(git2::Reference::is_valid_name(&name), "{id} -> {name}");
        }
    }

    #[test]
    fn a_worktree_has_a_detached_head_at_base_and_removing_it_keeps_every_ref() {
        let (_dir, repo, first) = repo_with_commit();
        let root = repo.root().to_path_buf();
        std::fs::write(root.join("b.txt"), "b\n").unwrap();
        let second = repo.commit_all("two", "", &[]).unwrap().unwrap();
        let branches_before = git(
            &root,
            &["for-each-ref", "--format=%(refname) %(objectname)"],
        );

        let wt_root = root.join(".ralph/worktrees/run-1").join(safe_name("a/b"));
        repo.add_worktree(&wt_root, &first).unwrap();
        let wt = Repo::discover(&wt_root).unwrap();
        assert_eq!(
            wt.root().canonicalize().unwrap(),
            wt_root.canonicalize().unwrap()
        );
        assert_eq!(wt.head_sha().unwrap().as_deref(), Some(first.as_str()));
        assert_eq!(wt.current_branch(), None, "HEAD must be detached");
        assert_eq!(
            std::fs::read_to_string(wt_root.join("a.txt")).unwrap(),
            "a\n"
        );
        assert!(!wt_root.join("b.txt").exists());
        // The main checkout is untouched and no branch was made.
        assert_eq!(repo.head_sha().unwrap().as_deref(), Some(second.as_str()));
        assert_eq!(
            git(
                &root,
                &["for-each-ref", "--format=%(refname) %(objectname)"]
            ),
            branches_before
        );
        assert_eq!(git(&root, &["status", "--porcelain"]), "");
        assert_eq!(
            repo.worktrees_under(&root.join(".ralph/worktrees")),
            vec![wt_root.canonicalize().unwrap()]
        );

        // Work in the worktree, kept under a ref, then the worktree goes: the ref stays.
        std::fs::write(wt_root.join("c.txt"), "c\n").unwrap();
        let work = wt.commit_all("work", "", &[]).unwrap().unwrap();
        std::fs::create_dir_all(wt_root.join(".ralph")).unwrap();
        std::fs::write(wt_root.join(".ralph/ignored.bin"), "x\n").unwrap();
        std::fs::write(wt_root.join("untracked.txt"), "x\n").unwrap();
        let err = repo.remove_worktree(&wt_root).unwrap_err().to_string();
        assert!(
            err.contains(&work) && err.contains("would lose it"),
            "{err}"
        );
        assert!(wt_root.join("c.txt").exists());
        repo.set_ref("refs/ralph/salvage/run-1/a%2Fb", &work)
            .unwrap();
        drop(wt);
        repo.remove_worktree(&wt_root).unwrap();
        assert!(!wt_root.exists());
        assert!(repo.worktrees_under(&root.join(".ralph")).is_empty());
        assert_eq!(
            git(&root, &["worktree", "list", "--porcelain"])
                .matches("worktree ")
                .count(),
            1
        );
        assert_eq!(repo.ref_sha("refs/ralph/salvage/run-1/a%2Fb"), Some(work));
        assert!(git(&root, &["for-each-ref", "--format=%(refname)"]).contains("refs/heads/"));
        // Removing again is nothing to do.
        repo.remove_worktree(&wt_root).unwrap();
    }

    #[test]
    fn a_leftover_is_reused_only_when_its_work_is_kept_and_nothing_else_is_touched() {
        let (_dir, repo, first) = repo_with_commit();
        let root = repo.root().to_path_buf();
        let wt_root = root.join(".ralph/worktrees/r/US-001");

        // A directory that is not a worktree: refused, left as it is.
        std::fs::create_dir_all(&wt_root).unwrap();
        std::fs::write(wt_root.join("mine.txt"), "user\n").unwrap();
        let err = repo.add_worktree(&wt_root, &first).unwrap_err().to_string();
        assert!(err.contains("not a worktree of this repository"), "{err}");
        assert!(wt_root.join("mine.txt").exists());
        let err = repo.remove_worktree(&wt_root).unwrap_err().to_string();
        assert!(err.contains("leaves it alone"), "{err}");
        assert!(wt_root.join("mine.txt").exists());
        std::fs::remove_dir_all(&wt_root).unwrap();

        // A leftover worktree with a commit nothing keeps: refused.
        repo.add_worktree(&wt_root, &first).unwrap();
        let wt = Repo::discover(&wt_root).unwrap();
        std::fs::write(wt_root.join("new.txt"), "work\n").unwrap();
        let work = wt.commit_all("work", "", &[]).unwrap().unwrap();
        let err = repo.add_worktree(&wt_root, &first).unwrap_err().to_string();
        assert!(
            err.contains(&work) && err.contains("no branch or reference keeps"),
            "{err}"
        );
        assert!(wt_root.join("new.txt").exists());

        // Uncommitted work in it: refused too, even once the commit is kept.
        repo.set_ref("refs/ralph/salvage/r/US-001", &work).unwrap();
        std::fs::write(wt_root.join("more.txt"), "uncommitted\n").unwrap();
        let err = repo.add_worktree(&wt_root, &first).unwrap_err().to_string();
        assert!(err.contains("uncommitted work"), "{err}");
        std::fs::remove_file(wt_root.join("more.txt")).unwrap();

        // Kept and clean: removed and made again at the new base.
        repo.add_worktree(&wt_root, &first).unwrap();
        let again = Repo::discover(&wt_root).unwrap();
        assert_eq!(again.head_sha().unwrap().as_deref(), Some(first.as_str()));
        assert!(!wt_root.join("new.txt").exists());
        assert_eq!(repo.ref_sha("refs/ralph/salvage/r/US-001"), Some(work));

        // Its directory deleted by hand: the stale registration is pruned and it is made again.
        drop(again);
        std::fs::remove_dir_all(&wt_root).unwrap();
        assert_eq!(
            repo.worktrees_under(&root.join(".ralph/worktrees")).len(),
            1,
            "recovery still sees a registration whose directory is gone"
        );
        repo.add_worktree(&wt_root, &first).unwrap();
        assert!(wt_root.join("a.txt").exists());
    }

    #[test]
    fn any_reference_keeps_a_worktrees_head() {
        let (_dir, repo, first) = repo_with_commit();
        let wt_root = repo.root().join(".ralph/worktrees/r/US-9");
        repo.add_worktree(&wt_root, &first).unwrap();
        let wt = Repo::discover(&wt_root).unwrap();
        std::fs::write(wt_root.join("n.txt"), "n\n").unwrap();
        let work = wt.commit_all("work", "", &[]).unwrap().unwrap();
        let oid = git2::Oid::from_str(&work).unwrap();
        assert!(!repo.commit_is_kept(oid).unwrap());
        // A pin deep under refs/ralph/ keeps it; so does a tag on a descendant.
        repo.set_ref("refs/ralph/r/7/start", &work).unwrap();
        assert!(repo.commit_is_kept(oid).unwrap());
        git(repo.root(), &["update-ref", "-d", "refs/ralph/r/7/start"]);
        std::fs::write(wt_root.join("m.txt"), "m\n").unwrap();
        let later = wt.commit_all("later", "", &[]).unwrap().unwrap();
        git(repo.root(), &["tag", "v1", &later]);
        assert!(repo.commit_is_kept(oid).unwrap());
        repo.remove_worktree(&wt_root).unwrap();
    }

    #[test]
    fn the_main_checkout_is_never_a_worktree_to_add_or_remove() {
        let (_dir, repo, first) = repo_with_commit();
        let root = repo.root().to_path_buf();
        assert!(repo.remove_worktree(&root).is_err());
        assert!(repo.add_worktree(&root, &first).is_err());
        assert!(root.join("a.txt").exists());
        assert!(matches!(
            repo.add_worktree(&root.join(".ralph/w"), "no-such"),
            Err(GitError::UnknownRevision { .. })
        ));
    }

    #[test]
    fn is_ignored_answers_for_files_and_directories() {
        let (_dir, repo, _) = repo_with_commit();
        let root = repo.root().to_path_buf();
        std::fs::write(root.join(".gitignore"), ".ralph/\n.env\nnode_modules/\n").unwrap();
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        repo.commit_all("src", "", &[]).unwrap();
        assert!(repo.is_ignored(".env").unwrap());
        assert!(repo.is_ignored("node_modules").unwrap());
        assert!(repo.is_ignored("node_modules/").unwrap());
        assert!(!repo.is_ignored("a.txt").unwrap());
        assert!(!repo.is_ignored("src").unwrap());
        assert!(!repo.is_ignored("config/local.toml").unwrap());
        std::fs::remove_dir_all(root.join("node_modules")).unwrap();
        assert!(
            repo.is_ignored("node_modules/").unwrap(),
            "asked as a directory before it exists"
        );
    }

    #[test]
    fn a_checkout_half_way_to_another_branch_is_in_progress() {
        let (_dir, repo, one) = repo_with_commit();
        let root = repo.root().to_path_buf();
        assert!(!repo.checkout_in_progress());
        // The user's staged change is no checkout.
        std::fs::write(root.join("b.txt"), "b\n").unwrap();
        let mut index = repo.repo.index().unwrap();
        index.add_path(Path::new("b.txt")).unwrap();
        index.write().unwrap();
        assert!(!repo.checkout_in_progress());
        // A branch whose tip has that tree: the index now looks like a checkout of it whose
        // HEAD has not moved yet.
        let tree = repo.repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let parent = repo
            .repo
            .find_commit(git2::Oid::from_str(&one).unwrap())
            .unwrap();
        let other = repo
            .repo
            .commit(None, &sig, &sig, "other", &tree, &[&parent])
            .unwrap();
        repo.repo
            .reference("refs/heads/other", other, false, "test")
            .unwrap();
        assert!(repo.checkout_in_progress());
        std::fs::remove_file(repo.repo.path().join("index")).unwrap();
        repo.repo
            .reset(parent.as_object(), git2::ResetType::Mixed, None)
            .unwrap();
        assert!(!repo.checkout_in_progress());
        std::fs::write(repo.repo.path().join("index.lock"), "").unwrap();
        assert!(repo.checkout_in_progress(), "a git command holds the index");
    }
}
