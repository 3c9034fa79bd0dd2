//! Git access for ralph, through libgit2 (`git2`, no git CLI and no network features).
//!
//! This module owns everything ralph does to a repository: finding it, checking out the PRD's
//! `branchName` (created from `baseBranch` or the current HEAD, never from a hard-coded `main`),
//! detecting a dirty tree before a run, pinning `refs/ralph/<run>/<n>/start` before each
//! iteration, committing what an agent left behind with `Ralph-*` trailers, and reading those
//! trailers back from history so that a lost `.ralph/state.json` can be rebuilt.
//!
//! Every call blocks and a [`Repo`] is not `Sync`: async callers open it inside
//! `spawn_blocking` and never hold it across an `.await`.
//!
//! Decisions worth knowing:
//! - Ignored files (`.gitignore`, `.git/info/exclude`, `core.excludesFile`) are never reported as
//!   dirty and never committed, so `.ralph/` (which ignores itself) stays out of history.
//! - The commit identity is git's: `GIT_AUTHOR_*`/`GIT_COMMITTER_*` name and email, then
//!   `user.name`/`user.email` from the repository's configuration, then `ralph <ralph@localhost>`
//!   so that a fresh container without any git identity can still checkpoint.
//! - [`Repo::commit_all`] never creates an empty commit, not even as the first commit of an
//!   unborn branch.

use std::path::{Path, PathBuf};

use git2::{
    build::CheckoutBuilder, BranchType, Commit, DiffOptions, ErrorCode, IndexAddOption, ObjectType,
    Repository, Signature, Sort, StatusOptions,
};

pub mod held;
pub mod land;
mod lock;
mod pack;
mod restore;
mod scan;
mod trailers;
pub mod worktree;

pub use lock::lock_wait;

pub use pack::MAX_LOOSE_TO_PACK;
pub use restore::Restored;
pub use scan::LINE_DIFF_MAX_BYTES;
pub use trailers::{
    TrailerRecord, Trailers, TRAILER_FEATURE, TRAILER_ITERATION, TRAILER_OUTCOME, TRAILER_RUN,
    TRAILER_STORY, TRAILER_UNBLOCKED,
};

/// The paths a diff touches (a rename: its old and new path), relative to the root with `/`
/// separators, sorted, no duplicates.
fn diff_paths(diff: &git2::Diff<'_>) -> Vec<String> {
    let mut paths = Vec::new();
    for delta in diff.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            if let Some(path) = file.path_bytes() {
                paths.push(String::from_utf8_lossy(path).into_owned());
            }
        }
    }
    paths.sort();
    paths.dedup();
    paths
}

/// Identity used when neither the environment nor the git configuration names one.
const FALLBACK_NAME: &str = "ralph";
/// Email of the fallback identity.
const FALLBACK_EMAIL: &str = "ralph@localhost";

/// Errors from git operations. Messages are lowercase fragments; where the user can fix the
/// problem, a `hint:` line after a newline says how.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// No repository contains the given path.
    #[error("{} is not inside a git repository\nhint: run `git init` and commit once", path.display())]
    NotARepo {
        /// The path that was searched from.
        path: PathBuf,
    },
    /// The repository has no working tree, so there is nothing for an agent to edit.
    #[error("{} is a bare git repository; ralph needs a working tree\nhint: run ralph inside a clone with a checkout", path.display())]
    Bare {
        /// The repository's git directory.
        path: PathBuf,
    },
    /// `baseBranch` (or another base) names neither a branch nor a commit.
    #[error("base branch `{base}` does not exist, so branch `{branch}` cannot be created from it\nhint: fix `baseBranch` in prd.json, or create `{base}` first (e.g. `git fetch origin {base}:{base}`)")]
    BaseNotFound {
        /// The base that was asked for.
        base: String,
        /// The branch that was to be created.
        branch: String,
    },
    /// The branch name is not a valid git reference name.
    #[error("`{name}` is not a valid git branch name\nhint: fix `branchName` in prd.json (e.g. `ralph/my-feature`)")]
    InvalidBranchName {
        /// The rejected name.
        name: String,
    },
    /// Switching branches would overwrite uncommitted changes.
    #[error("cannot check out branch `{branch}`: uncommitted changes in the working tree would be overwritten\nhint: commit or stash your changes, then run ralph again")]
    CheckoutConflict {
        /// The branch being checked out.
        branch: String,
    },
    /// A revision given to ralph does not resolve to a commit.
    #[error("`{rev}` does not name a commit in this repository")]
    UnknownRevision {
        /// The revision as given.
        rev: String,
    },
    /// A local branch has commits that another commit (the remote's) does not have, and the
    /// other way round, so neither can simply follow the other.
    #[error("branch `{branch}` here and the remote's ({other}) have diverged: each has commits the other lacks\nhint: look at both (`git log --oneline --graph {branch} {other}`), reconcile them by hand (merge or rebase) and push, then run ralph again")]
    Diverged {
        /// The local branch.
        branch: String,
        /// The other commit (sha).
        other: String,
    },
    /// The index holds unresolved merge conflicts, so no tree can be written.
    #[error("the git index has unresolved conflicts, so ralph cannot commit\nhint: resolve them (`git status`), commit, then run ralph again")]
    Conflicted,
    /// A `git` command ralph runs (`git worktree add`) failed or could not start.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line, e.g. `git worktree add --detach <path> <sha>`.
        command: String,
        /// Why: its exit and the last lines of its output, or why it could not start.
        detail: String,
    },
    /// Something is in the way of a worktree ralph would create or remove (a directory ralph did
    /// not make, one with work not kept by any reference, the main checkout itself).
    #[error("{}: {why}", path.display())]
    WorktreeInTheWay {
        /// The worktree's root.
        path: PathBuf,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// The main checkout cannot move forward: it is not where the landing expected, or the
    /// user's files are in the way. Nothing was changed. Displays as `why` alone (a sentence
    /// naming the files, then a `hint:` line).
    #[error("{why}")]
    CheckoutBlocked {
        /// What is wrong, naming the files, and how to fix it.
        why: String,
        /// The files in the way (repository-relative), sorted; empty when the cause is not a
        /// file (HEAD elsewhere, `to` not a descendant).
        files: Vec<String>,
    },
    /// Another git process held a lock ralph needs (the index's `index.lock`, a branch's
    /// `.lock`) for longer than ralph waits ([`lock_wait`]). Nothing was written by the
    /// operation that gave up.
    #[error("git {op} failed: another git process holds {}; ralph waited {} s for it\nhint: let that git command finish; if none runs, delete {}", lock.display(), waited_secs, lock.display())]
    Locked {
        /// What ralph was doing, e.g. `write index`.
        op: &'static str,
        /// The lock file (absolute path).
        lock: PathBuf,
        /// How long ralph waited, in whole seconds.
        waited_secs: u64,
    },
    /// The branch moved while ralph wrote a commit on it (another git process committed on it
    /// in between): ralph's commit was made but the branch was not moved to it, so nothing of
    /// the other commit is buried under ralph's.
    #[error("`{branch}` moved to {now} while ralph committed on {expected} (another git process committed on it); ralph's commit was not put on the branch")]
    BranchMoved {
        /// The branch (full reference name).
        branch: String,
        /// Where ralph found it when it began (full sha).
        expected: String,
        /// Where it is now (full sha, or `unknown`).
        now: String,
    },
    /// Any other libgit2 failure, with the operation that failed.
    #[error("git {op} failed: {source}")]
    Git {
        /// What ralph was doing, e.g. `commit`.
        op: &'static str,
        /// The libgit2 error.
        #[source]
        source: git2::Error,
    },
}

/// Shorthand for wrapping a libgit2 error with the operation that failed.
fn op(op: &'static str) -> impl FnOnce(git2::Error) -> GitError {
    move |source| GitError::Git { op, source }
}

/// What [`Repo::ensure_branch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchAction {
    /// HEAD was already on the branch; nothing changed.
    AlreadyOn,
    /// The branch existed and was checked out.
    CheckedOut,
    /// The branch was created at `from` (the base's name, or `HEAD`) and checked out.
    Created {
        /// The base it was created from: the given base, or `HEAD`.
        from: String,
        /// Full sha of the commit the new branch points at.
        sha: String,
    },
    /// The repository has no commit yet: HEAD now names the (still unborn) branch, so the first
    /// commit lands on it.
    Unborn,
    /// The branch existed only on a remote (a fresh clone): it was created at the
    /// remote-tracking branch, set to track it, and checked out.
    Tracking {
        /// The remote-tracking branch it starts from and tracks (e.g. `origin/ralph/x`).
        upstream: String,
        /// Full sha of the commit the new branch points at.
        sha: String,
    },
}

/// One file of a diffstat: `(path, added lines, removed lines)`.
pub type FileStat = (String, usize, usize);

/// What [`Repo::checkpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The new commit's full sha; `None` when there was nothing to commit.
    pub commit: Option<String>,
    /// Whether the working tree matches HEAD afterwards (as far as git can make it: a submodule
    /// with uncommitted work of its own leaves it dirty; a secret-looking file left out does
    /// not count).
    pub clean: bool,
    /// Secret-looking files git does not track that the checkpoint left out
    /// ([`crate::redact::is_secret_file`]): never committed by ralph. Sorted.
    pub withheld: Vec<String>,
}

/// The working tree staged as a checkpoint stages it, by one status walk ([`Repo::stage`]).
///
/// An iteration walks its tree once, in inspect; what ralph itself writes after that (prd.json,
/// progress.txt, progress-history/) is staged on top by [`Repo::restage`], which walks only
/// those paths, so the checkpoint does not walk the whole tree again. A `Staged` is only reused
/// while it still describes the repository: the same working tree, the same HEAD and the same
/// index file (its size, inode and modification time); otherwise [`Repo::restage`] walks the
/// whole tree as [`Repo::stage`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The staged tree.
    tree: git2::Oid,
    /// See [`Checkpoint::clean`].
    clean: bool,
    /// See [`Checkpoint::withheld`].
    withheld: Vec<String>,
    /// The working tree's root it was staged in.
    root: PathBuf,
    /// HEAD's commit when it was staged (`None`: an unborn branch).
    head: Option<git2::Oid>,
    /// The index file as the staging left it (`None`: no index file).
    index: Option<IndexStamp>,
}

/// What tells one version of the index file from another: its size, inode and modification time
/// (nanoseconds where the file system keeps them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct IndexStamp {
    len: u64,
    ino: u64,
    modified: Option<std::time::SystemTime>,
}

/// An open git repository with a working tree.
pub struct Repo {
    repo: Repository,
    root: PathBuf,
    /// When this handle was opened: [`Repo::pack_loose_objects`] packs only loose objects
    /// written since (ralph's own and its agents'), never a user's older ones.
    opened_at: std::time::SystemTime,
    /// Where [`Repo::trailer_history`] and [`Repo::newest_trailer`] start: HEAD unless
    /// [`Repo::reading_history_at`] named another commit.
    history_tip: Option<git2::Oid>,
}

impl std::fmt::Debug for Repo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repo").field("root", &self.root).finish()
    }
}

impl Repo {
    /// Finds the repository containing `path` (searching upwards, like git does).
    ///
    /// # Errors
    /// [`GitError::NotARepo`] when no repository contains `path`; [`GitError::Bare`] for a bare
    /// repository; [`GitError::Git`] for other libgit2 failures (e.g. permissions).
    pub fn discover(path: &Path) -> Result<Repo, GitError> {
        // libgit2 keeps every object it reads in a per-repository cache (up to 256 MiB) for the
        // life of the handle. ralph reads each iteration's new commit and trees once, so over a
        // night that cache only grows (issue 13, P3); nothing ralph does reads an object twice
        // in a way the cache would speed up.
        static NO_OBJECT_CACHE: std::sync::Once = std::sync::Once::new();
        // libgit2 also hashes every object it reads again to check it (SHA-1 with collision
        // detection: for a 34 MB prd.json, a tenth of a second per read, and the bookkeeping
        // after an iteration reads it several times). git itself checks objects only when asked
        // (`git fsck`, `transfer.fsckObjects`); ralph does the same.
        NO_OBJECT_CACHE.call_once(|| {
            git2::opts::enable_caching(false);
            git2::opts::strict_hash_verification(false);
        });
        let repo = Repository::discover(path).map_err(|err| {
            if err.code() == ErrorCode::NotFound {
                GitError::NotARepo {
                    path: path.to_path_buf(),
                }
            } else {
                GitError::Git {
                    op: "open repository",
                    source: err,
                }
            }
        })?;
        let root = match repo.workdir() {
            Some(dir) => dir.to_path_buf(),
            None => {
                return Err(GitError::Bare {
                    path: repo.path().to_path_buf(),
                })
            }
        };
        Ok(Repo {
            repo,
            root,
            opened_at: std::time::SystemTime::now(),
            history_tip: None,
        })
    }

    /// The working tree's root directory (absolute, as libgit2 reports it; ends without a
    /// trailing separator only if libgit2 gives none).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Full sha of the commit HEAD points at; `None` on an unborn branch (no commit yet).
    ///
    /// # Errors
    /// [`GitError::Git`] when HEAD cannot be read or is broken.
    pub fn head_sha(&self) -> Result<Option<String>, GitError> {
        Ok(self.head_commit()?.map(|commit| commit.id().to_string()))
    }

    /// The branch HEAD is on (short name, e.g. `ralph/feature`), also on an unborn branch;
    /// `None` when HEAD is detached or unreadable.
    pub fn current_branch(&self) -> Option<String> {
        let head = self.repo.find_reference("HEAD").ok()?;
        let target = head.symbolic_target()?;
        target.strip_prefix("refs/heads/").map(str::to_owned)
    }

    /// Puts HEAD on branch `name`. An existing branch is checked out (never moved); a missing one
    /// that a remote has ([`Repo::remote_branch_for`]) with commits HEAD lacks is created
    /// there, tracking it, so that the work pushed from elsewhere goes on; any other missing one
    /// is created
    /// from `base` when given (a branch, tag or commit-ish), else from the current HEAD, and then
    /// checked out. On a repository with no commit yet (and no base), HEAD is simply pointed at
    /// `refs/heads/<name>`. Checkout is "safe": uncommitted changes are carried over unless the
    /// switch would overwrite them, in which case nothing changes.
    ///
    /// # Errors
    /// [`GitError::InvalidBranchName`], [`GitError::BaseNotFound`] (naming `base`),
    /// [`GitError::CheckoutConflict`], or [`GitError::Git`].
    pub fn ensure_branch(&self, name: &str, base: Option<&str>) -> Result<BranchAction, GitError> {
        let refname = format!("refs/heads/{name}");
        if !git2::Reference::is_valid_name(&refname) || name.starts_with('-') {
            return Err(GitError::InvalidBranchName {
                name: name.to_owned(),
            });
        }
        if self.current_branch().as_deref() == Some(name) {
            return Ok(BranchAction::AlreadyOn);
        }

        if let Ok(branch) = self.repo.find_branch(name, BranchType::Local) {
            let commit = branch.get().peel_to_commit().map_err(op("read branch"))?;
            self.switch_to(name, &refname, &commit)?;
            return Ok(BranchAction::CheckedOut);
        }
        let remote_start = match self.remote_branch_for(name) {
            Some(upstream) => {
                let start = self
                    .repo
                    .find_branch(&upstream, BranchType::Remote)
                    .and_then(|b| b.get().peel_to_commit())
                    .map_err(op("read remote branch"))?;
                // Merged into HEAD already: HEAD has that work and more.
                let merged = match self.head_commit()? {
                    Some(head) => {
                        self.is_ancestor(&start.id().to_string(), &head.id().to_string())?
                    }
                    None => false,
                };
                (!merged).then_some((upstream, start))
            }
            None => None,
        };
        if let Some((upstream, start)) = remote_start {
            // Check out first so that a conflict leaves no half-created branch behind.
            self.checkout_commit(name, &start)?;
            let mut branch = self
                .repo
                .branch(name, &start, false)
                .map_err(op("create branch"))?;
            branch
                .set_upstream(Some(&upstream))
                .map_err(op("set the branch's upstream"))?;
            self.repo.set_head(&refname).map_err(op("switch HEAD"))?;
            return Ok(BranchAction::Tracking {
                upstream,
                sha: start.id().to_string(),
            });
        }

        let (start, from) = match base {
            Some(base) => (self.resolve_base(base, name)?, base.to_owned()),
            None => match self.head_commit()? {
                Some(commit) => (commit, "HEAD".to_owned()),
                None => {
                    self.repo
                        .set_head(&refname)
                        .map_err(op("point HEAD at the new branch"))?;
                    return Ok(BranchAction::Unborn);
                }
            },
        };
        // Check out first so that a conflict leaves no half-created branch behind.
        self.checkout_commit(name, &start)?;
        self.repo
            .branch(name, &start, false)
            .map_err(op("create branch"))?;
        self.repo.set_head(&refname).map_err(op("switch HEAD"))?;
        Ok(BranchAction::Created {
            from,
            sha: start.id().to_string(),
        })
    }

    /// Paths with uncommitted changes, as `git status` would list them: modified, staged, deleted,
    /// renamed, conflicted and untracked files, relative to the root with `/` separators. Ignored
    /// files are left out, and an untracked directory is listed once as `dir/`. Sorted.
    ///
    /// # Errors
    /// [`GitError::Git`] when the status cannot be computed.
    pub fn dirty_paths(&self) -> Result<Vec<String>, GitError> {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .recurse_untracked_dirs(false)
            .include_ignored(false)
            .exclude_submodules(false);
        let statuses = self.repo.statuses(Some(&mut opts)).map_err(op("status"))?;
        let mut paths: Vec<String> = statuses
            .iter()
            .filter(|entry| {
                let status = entry.status();
                !status.is_empty() && !status.is_ignored()
            })
            .map(|entry| String::from_utf8_lossy(entry.path_bytes()).into_owned())
            .collect();
        paths.sort();
        paths.dedup();
        Ok(paths)
    }

    /// Whether `rev` names a commit this repository still has (false once an agent deleted the
    /// references that kept it and pruned it, `git gc --prune=now`).
    pub fn has_commit(&self, rev: &str) -> bool {
        self.resolve_commit(rev).is_ok()
    }

    /// Creates or moves reference `name` (a full name such as `refs/ralph/<run>/3/start`) to
    /// commit `sha`.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `sha` is not a commit; [`GitError::Git`] for an invalid
    /// reference name or a write failure.
    pub fn set_ref(&self, name: &str, sha: &str) -> Result<(), GitError> {
        let commit = self.resolve_commit(sha)?;
        // A git command of an agent may hold the reference's lock for a moment.
        self.retry_locked(|| {
            self.repo
                .reference(name, commit.id(), true, "ralph: iteration start")
                .map_err(op("write reference"))
        })?;
        Ok(())
    }

    /// Stages every change (new, modified and deleted files; ignored files excluded) and commits
    /// it on HEAD, but only when the staged tree differs from HEAD's tree (on an unborn branch:
    /// when it is not empty). Returns the new commit's full sha, or `None` when there was nothing
    /// to commit. See [`Repo::checkpoint`], which also says whether the tree was left clean.
    ///
    /// The message is `subject`, a blank line, `body` (omitted when blank) and a blank line, then
    /// one `Key: value` line per trailer, in the order given. Line breaks inside the subject or a
    /// trailer value are replaced by spaces so the trailer block stays parseable.
    ///
    /// # Errors
    /// [`GitError::Conflicted`] when the index has unresolved conflicts; [`GitError::Git`] for
    /// other failures (unreadable files, a broken HEAD).
    pub fn commit_all(
        &self,
        subject: &str,
        body: &str,
        trailers: &[(&str, String)],
    ) -> Result<Option<String>, GitError> {
        Ok(self.checkpoint(subject, body, trailers)?.commit)
    }

    /// Stages every change in the working tree as [`Repo::checkpoint`] commits it (new,
    /// modified and deleted files; ignored files excluded; the index is written) by one status
    /// walk of the whole tree, and returns the staged tree with whether the working tree is
    /// clean against it and the secret-looking files left out: an untracked one is never staged,
    /// and one someone staged that HEAD does not have is taken out of the index again
    /// ([`crate::redact::is_secret_file`]).
    ///
    /// # Errors
    /// As [`Repo::commit_all`].
    pub fn stage(&self) -> Result<Staged, GitError> {
        let (tree, clean, withheld) = self.stage_walk(&[])?;
        self.staged(tree, clean, withheld)
    }

    /// [`Repo::stage`] after `prior` (an earlier staging of this tree) when `prior` still
    /// describes the repository (same working tree, HEAD and index file, see [`Staged`]): then
    /// only `paths` (relative to the root, `/`-separated; a directory stands for everything
    /// under it) are walked and staged on top of it, the rest of the tree being taken as
    /// `prior` staged it. Without a `prior`, or with one that no longer applies, the whole tree
    /// is walked. The caller promises that nothing outside `paths` changed since `prior`.
    ///
    /// # Errors
    /// As [`Repo::commit_all`].
    pub fn restage(&self, prior: Option<&Staged>, paths: &[String]) -> Result<Staged, GitError> {
        let Some(prior) = prior.filter(|p| self.still_staged(p)) else {
            return self.stage();
        };
        if paths.is_empty() {
            return Ok(prior.clone());
        }
        let (tree, clean, fresh) = self.stage_walk(paths)?;
        let under = |w: &str| {
            paths.iter().any(|p| {
                w == p
                    || w.strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
        };
        let mut withheld: Vec<String> = prior
            .withheld
            .iter()
            .filter(|w| !under(w))
            .cloned()
            .chain(fresh)
            .collect();
        withheld.sort();
        withheld.dedup();
        self.staged(tree, clean && prior.clean, withheld)
    }

    /// A [`Staged`] of `tree` as the repository is now (HEAD, the index file).
    fn staged(
        &self,
        tree: git2::Oid,
        clean: bool,
        withheld: Vec<String>,
    ) -> Result<Staged, GitError> {
        Ok(Staged {
            tree,
            clean,
            withheld,
            root: self.root.clone(),
            head: self.head_commit()?.map(|c| c.id()),
            index: self.index_stamp(),
        })
    }

    /// Whether `staged` still describes this repository: the same working tree, HEAD and index
    /// file.
    fn still_staged(&self, staged: &Staged) -> bool {
        staged.root == self.root
            && self.head_commit().ok().map(|h| h.map(|c| c.id())) == Some(staged.head)
            && staged.index.is_some()
            && self.index_stamp() == staged.index
    }

    /// The index file's [`IndexStamp`], `None` when it cannot be read.
    fn index_stamp(&self) -> Option<IndexStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let index = self.repo.index().ok()?;
        let meta = std::fs::metadata(index.path()?).ok()?;
        Some(IndexStamp {
            len: meta.len(),
            ino: meta.ino(),
            modified: meta.modified().ok(),
        })
    }

    /// The status walk behind [`Repo::stage`] (`only` empty: the whole tree) and
    /// [`Repo::restage`] (`only`: those paths and what is under them): stages what it finds,
    /// writes the index when it staged anything, and returns the staged tree's id, whether the
    /// walked part of the working tree is clean against it, and the secret-looking files it
    /// left out.
    fn stage_walk(&self, only: &[String]) -> Result<(git2::Oid, bool, Vec<String>), GitError> {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(false)
            .exclude_submodules(false)
            .update_index(true);
        if !only.is_empty() {
            // Literal paths (a `[` in a file name is no pattern); a directory matches what is
            // under it.
            opts.disable_pathspec_match(true);
            for path in only {
                opts.pathspec(path);
            }
        }
        let statuses = self.repo.statuses(Some(&mut opts)).map_err(op("status"))?;
        let mut index = self.repo.index().map_err(op("read index"))?;
        if index.has_conflicts() {
            return Err(GitError::Conflicted);
        }
        let mut clean = true;
        let mut staged = false;
        let mut withheld = Vec::new();
        for entry in statuses.iter() {
            let status = entry.status();
            if status.is_conflicted() {
                return Err(GitError::Conflicted);
            }
            if let Some(rel) = entry.path().filter(|p| crate::redact::is_secret_file(p)) {
                if status.is_wt_new() {
                    withheld.push(rel.to_string());
                    continue;
                }
                if status.is_index_new() {
                    index
                        .remove_path(Path::new(rel))
                        .map_err(op("unstage a secret-looking file"))?;
                    staged = true;
                    withheld.push(rel.to_string());
                    continue;
                }
            }
            let Some(path) = entry.path().map(Path::new) else {
                // A path that is not UTF-8: let libgit2 find it itself.
                index
                    .add_all(["*"], IndexAddOption::DEFAULT, None)
                    .map_err(op("stage changes"))?;
                index
                    .update_all(["*"], None)
                    .map_err(op("stage deletions"))?;
                staged = true;
                continue;
            };
            if status.is_wt_deleted() {
                index.remove_path(path).map_err(op("stage deletions"))?;
                staged = true;
            } else if status.is_wt_new()
                || status.is_wt_modified()
                || status.is_wt_typechange()
                || status.is_wt_renamed()
            {
                if self.root.join(path).is_dir() {
                    // A submodule or a nested repository: staged as git add would, when it can
                    // be; its own uncommitted work stays dirty.
                    let _ = index.add_all([path], IndexAddOption::DEFAULT, None);
                    clean = false;
                } else {
                    index.add_path(path).map_err(op("stage changes"))?;
                }
                staged = true;
            }
        }
        if staged {
            index.write().map_err(op("write index"))?;
        }
        let tree_id = index.write_tree().map_err(op("write tree"))?;
        withheld.sort();
        Ok((tree_id, clean, withheld))
    }

    /// The files the next checkpoint would change against commit `from` (every file of the
    /// staged tree when `from` is `None`): the working tree is staged as [`Repo::checkpoint`]
    /// stages it (so a file only removed from the index, `git rm --cached`, is staged back and
    /// does not count), and the staged tree is compared with `from`'s. Paths relative to the
    /// root, `/`-separated, sorted, no duplicates (a rename shows as both paths).
    ///
    /// # Errors
    /// As [`Repo::commit_all`]; [`GitError::UnknownRevision`] when `from` is not a commit.
    pub fn staged_changes(&self, from: Option<&str>) -> Result<Vec<String>, GitError> {
        self.staged_diff(&self.stage()?, from)
    }

    /// The files `staged` changes against commit `from` (every file of the staged tree when
    /// `from` is `None`), as [`Repo::staged_changes`] lists them, without walking the tree.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `from` is not a commit; [`GitError::Git`].
    pub fn staged_diff(
        &self,
        staged: &Staged,
        from: Option<&str>,
    ) -> Result<Vec<String>, GitError> {
        let tree = self.repo.find_tree(staged.tree).map_err(op("read tree"))?;
        let base = match from {
            Some(rev) => Some(self.resolve_commit(rev)?.tree().map_err(op("read tree"))?),
            None => None,
        };
        let diff = self
            .repo
            .diff_tree_to_tree(base.as_ref(), Some(&tree), None)
            .map_err(op("diff"))?;
        Ok(diff_paths(&diff))
    }

    /// [`Repo::commit_all`], returning also whether the working tree was left clean.
    ///
    /// One status walk finds what changed (refreshing the index's stat data on the way, so a
    /// copied or touched tree is hashed once, not every iteration), and only those paths are
    /// staged: the cost follows what changed, not the size of the repository.
    ///
    /// # Errors
    /// As [`Repo::commit_all`].
    pub fn checkpoint(
        &self,
        subject: &str,
        body: &str,
        trailers: &[(&str, String)],
    ) -> Result<Checkpoint, GitError> {
        self.checkpoint_after(subject, body, trailers, None, &[])
    }

    /// [`Repo::checkpoint`] of the tree as `prior` staged it with `written` (the paths written
    /// since, relative to the root) staged on top ([`Repo::restage`]): the whole tree is not
    /// walked again when `prior` still applies. Without a `prior`, as [`Repo::checkpoint`].
    ///
    /// # Errors
    /// As [`Repo::commit_all`].
    pub fn checkpoint_after(
        &self,
        subject: &str,
        body: &str,
        trailers: &[(&str, String)],
        prior: Option<&Staged>,
        written: &[String],
    ) -> Result<Checkpoint, GitError> {
        // Another git process (an agent's `git add`) may hold the index or HEAD's lock for a
        // moment: the whole step is done again once it is free.
        self.retry_locked(|| self.checkpoint_once(subject, body, trailers, prior, written))
    }

    /// One try of [`Repo::checkpoint_after`].
    fn checkpoint_once(
        &self,
        subject: &str,
        body: &str,
        trailers: &[(&str, String)],
        prior: Option<&Staged>,
        written: &[String],
    ) -> Result<Checkpoint, GitError> {
        let Staged {
            tree: tree_id,
            clean,
            withheld,
            ..
        } = self.restage(prior, written)?;
        let parent = self.head_commit()?;
        let unchanged = match &parent {
            Some(parent) => parent.tree_id() == tree_id,
            None => self
                .repo
                .find_tree(tree_id)
                .map_err(op("read tree"))?
                .is_empty(),
        };
        if unchanged {
            return Ok(Checkpoint {
                commit: None,
                clean,
                withheld,
            });
        }

        let tree = self.repo.find_tree(tree_id).map_err(op("read tree"))?;
        let config = self.repo.config().map_err(op("read config"))?;
        let env = |key: &str| std::env::var(key).ok();
        let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
        let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
        let message = commit_message(subject, body, trailers);
        let parents: Vec<&Commit<'_>> = parent.iter().collect();
        let oid = self
            .repo
            .commit(Some("HEAD"), &author, &committer, &message, &tree, &parents)
            .map_err(op("commit"))?;
        Ok(Checkpoint {
            commit: Some(oid.to_string()),
            clean,
            withheld,
        })
    }

    /// Commits reachable from `to` but not from `from` (all of them when `from` is `None`),
    /// oldest first, as full shas. Both are revisions (sha, branch, `HEAD`, ...).
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when either does not name a commit; [`GitError::Git`].
    pub fn commits_between(&self, from: Option<&str>, to: &str) -> Result<Vec<String>, GitError> {
        let to = self.resolve_commit(to)?;
        let mut walk = self.repo.revwalk().map_err(op("walk history"))?;
        walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
            .map_err(op("walk history"))?;
        walk.push(to.id()).map_err(op("walk history"))?;
        if let Some(from) = from {
            let from = self.resolve_commit(from)?;
            walk.hide(from.id()).map_err(op("walk history"))?;
        }
        walk.map(|oid| oid.map(|oid| oid.to_string()))
            .collect::<Result<_, _>>()
            .map_err(op("walk history"))
    }

    /// Whether `ancestor` is `descendant` or one of its ancestors (both revisions). False after
    /// an agent reset or rewrote history past `ancestor`.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when either does not name a commit; [`GitError::Git`].
    pub fn is_ancestor(&self, ancestor: &str, descendant: &str) -> Result<bool, GitError> {
        let a = self.resolve_commit(ancestor)?.id();
        let d = self.resolve_commit(descendant)?.id();
        if a == d {
            return Ok(true);
        }
        self.repo
            .graph_descendant_of(d, a)
            .map_err(op("compare history"))
    }

    /// How many entries HEAD's reflog has (0 without one): taken when an iteration starts, so
    /// that [`Repo::lost_commits`] looks only at what happened since.
    pub fn head_reflog_len(&self) -> usize {
        self.repo.reflog("HEAD").map(|r| r.len()).unwrap_or(0)
    }

    /// Commits that HEAD pointed at in the reflog entries added after the first `since_len`
    /// (see [`Repo::head_reflog_len`]) which are neither
    /// reachable from `start` (they were made after it) nor from any branch, tag or HEAD now:
    /// work an agent committed and then threw away (`git reset --hard`, a deleted branch),
    /// reachable only from the reflog until git's garbage collection. Oldest first, full shas.
    /// An empty list when the reflog is missing (`core.logAllRefUpdates` off).
    ///
    /// # Errors
    /// [`GitError::Git`] when the references or history cannot be read.
    pub fn lost_commits(
        &self,
        start: Option<&str>,
        since_len: usize,
    ) -> Result<Vec<String>, GitError> {
        let Ok(reflog) = self.repo.reflog("HEAD") else {
            return Ok(Vec::new());
        };
        let start = match start {
            Some(s) => Some(self.resolve_commit(s)?.id()),
            None => None,
        };
        // The usual iteration only added commits that HEAD still contains: answered without
        // listing every reference.
        let added = reflog.len().saturating_sub(since_len);
        let head = self.head_commit().ok().flatten().map(|c| c.id());
        let kept_by_head = |oid: git2::Oid| {
            oid.is_zero()
                || head.is_some_and(|h| {
                    h == oid || self.repo.graph_descendant_of(h, oid).unwrap_or(false)
                })
                || start.is_some_and(|s| s == oid)
        };
        if (0..added).all(|i| reflog.get(i).is_none_or(|e| kept_by_head(e.id_new()))) {
            return Ok(Vec::new());
        }
        // Tips that keep commits alive: every branch, tag and HEAD (ralph's own `lost-` pins
        // excluded, so that a second look finds the same commits).
        let mut tips = Vec::new();
        for reference in self
            .repo
            .references()
            .map_err(op("list references"))?
            .flatten()
        {
            if reference.name().is_some_and(|n| n.contains("/lost-")) {
                continue;
            }
            if let Ok(commit) = reference.peel_to_commit() {
                tips.push(commit.id());
            }
        }
        if let Ok(Some(head)) = self.head_commit() {
            tips.push(head.id());
        }
        let mut lost = Vec::new();
        // The reflog lists the newest entry first; the entries added since are the first ones.
        for i in (0..added).rev() {
            let Some(entry) = reflog.get(i) else { continue };
            let oid = entry.id_new();
            if oid.is_zero() || lost.contains(&oid) || self.repo.find_commit(oid).is_err() {
                continue;
            }
            let reachable = |tip: git2::Oid| {
                tip == oid || self.repo.graph_descendant_of(tip, oid).unwrap_or(false)
            };
            if start.is_some_and(reachable) || tips.iter().any(|t| reachable(*t)) {
                continue;
            }
            lost.push(oid);
        }
        Ok(lost.into_iter().map(|o| o.to_string()).collect())
    }

    /// Files that differ between commit `from` and the working tree (staged or not, including
    /// untracked files inside untracked directories, excluding ignored files), relative to the
    /// root with `/` separators. A rename shows as its old and new path. Sorted, no duplicates.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `from` is not a commit; [`GitError::Git`].
    pub fn changed_files(&self, from: &str) -> Result<Vec<String>, GitError> {
        let tree = self.resolve_commit(from)?.tree().map_err(op("read tree"))?;
        let mut opts = DiffOptions::new();
        // Read-only: stale stat data is refreshed and written back by the checkpoint's status
        // (writing it here too would rewrite the index every iteration for the racily clean
        // progress.txt the previous checkpoint committed).
        opts.include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(false);
        let diff = self
            .repo
            .diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))
            .map_err(op("diff"))?;
        Ok(diff_paths(&diff))
    }

    /// The patch between commits `from` and `to` (unified diff, 3 lines of context), cut after
    /// `max_bytes` bytes (the cut is said on the last line), and its stat: one
    /// `(path, added lines, removed lines)` per file.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when either is not a commit; [`GitError::Git`].
    pub fn patch(
        &self,
        from: &str,
        to: &str,
        max_bytes: usize,
    ) -> Result<(String, Vec<FileStat>), GitError> {
        let a = self.resolve_commit(from)?.tree().map_err(op("read tree"))?;
        let b = self.resolve_commit(to)?.tree().map_err(op("read tree"))?;
        let diff = self
            .repo
            .diff_tree_to_tree(Some(&a), Some(&b), None)
            .map_err(op("diff"))?;
        let mut stat: Vec<FileStat> = Vec::new();
        let mut text = String::new();
        let mut cut = false;
        diff.print(git2::DiffFormat::Patch, |delta, _hunk, line| {
            let path = delta
                .new_file()
                .path()
                .or(delta.old_file().path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            if stat.last().map(|s| &s.0) != Some(&path) {
                stat.push((path, 0, 0));
            }
            if let Some(last) = stat.last_mut() {
                match line.origin() {
                    '+' => last.1 += 1,
                    '-' => last.2 += 1,
                    _ => {}
                }
            }
            if text.len() < max_bytes {
                if matches!(line.origin(), '+' | '-' | ' ') {
                    text.push(line.origin());
                }
                text.push_str(&String::from_utf8_lossy(line.content()));
            } else {
                cut = true;
            }
            true
        })
        .map_err(op("diff"))?;
        if cut {
            text.push_str(&format!(
                "\n… (cut at {max_bytes} bytes; `git diff {from} {to}` shows it whole)\n"
            ));
        }
        Ok((text, stat))
    }

    /// The subject line of commit `rev`.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `rev` is not a commit.
    pub fn commit_subject(&self, rev: &str) -> Result<String, GitError> {
        let commit = self.resolve_commit(rev)?;
        Ok(commit.summary().unwrap_or_default().to_owned())
    }

    /// The content of the file at `path` (relative to the repository root, `/`-separated) in
    /// commit `rev` (a sha, branch, `HEAD`, ...), as bytes; `None` when that commit has no such
    /// file (or `path` names a directory or a submodule). Read-only.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `rev` is not a commit; [`GitError::Git`] when the tree
    /// or the blob cannot be read.
    pub fn file_at(&self, rev: &str, path: &str) -> Result<Option<Vec<u8>>, GitError> {
        let tree = self.resolve_commit(rev)?.tree().map_err(op("read tree"))?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(entry) => entry,
            Err(err) if err.code() == ErrorCode::NotFound => return Ok(None),
            Err(err) => {
                return Err(GitError::Git {
                    op: "read tree",
                    source: err,
                })
            }
        };
        if entry.kind() != Some(ObjectType::Blob) {
            return Ok(None);
        }
        let blob = self
            .repo
            .find_blob(entry.id())
            .map_err(op("read file from history"))?;
        Ok(Some(blob.content().to_vec()))
    }

    /// Writes a commit object with an empty tree, `message` and `parent` (a sha), moving no
    /// reference, and returns its full sha: the lease commits that `--push` sends to the
    /// remote. Author and committer are git's identity (as for [`Repo::commit_all`]).
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `parent` is not a commit here; [`GitError::Git`].
    pub fn write_detached_commit(
        &self,
        message: &str,
        parent: Option<&str>,
    ) -> Result<String, GitError> {
        let parent = match parent {
            Some(p) => Some(self.resolve_commit(p)?),
            None => None,
        };
        let tree_id = self
            .repo
            .treebuilder(None)
            .and_then(|b| b.write())
            .map_err(op("write tree"))?;
        let tree = self.repo.find_tree(tree_id).map_err(op("read tree"))?;
        let config = self.repo.config().map_err(op("read config"))?;
        let env = |key: &str| std::env::var(key).ok();
        let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
        let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
        let parents: Vec<&Commit<'_>> = parent.iter().collect();
        let oid = self
            .repo
            .commit(None, &author, &committer, message, &tree, &parents)
            .map_err(op("commit"))?;
        Ok(oid.to_string())
    }

    /// Writes a commit object whose tree holds `files` (`(name, content)`, names without `/`),
    /// with `message` and `parent` (a sha), moving no reference, and returns its full sha: the
    /// books `--push` keeps at `refs/ralph/books/<branch>` (ledger and state.json).
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `parent` is not a commit here; [`GitError::Git`].
    pub fn write_files_commit(
        &self,
        message: &str,
        files: &[(&str, &[u8])],
        parent: Option<&str>,
    ) -> Result<String, GitError> {
        let parent = match parent {
            Some(p) => Some(self.resolve_commit(p)?),
            None => None,
        };
        let mut builder = self.repo.treebuilder(None).map_err(op("write tree"))?;
        for (name, content) in files {
            let blob = self.repo.blob(content).map_err(op("write blob"))?;
            builder
                .insert(name, blob, 0o100644)
                .map_err(op("write tree"))?;
        }
        let tree_id = builder.write().map_err(op("write tree"))?;
        let tree = self.repo.find_tree(tree_id).map_err(op("read tree"))?;
        let config = self.repo.config().map_err(op("read config"))?;
        let env = |key: &str| std::env::var(key).ok();
        let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
        let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
        let parents: Vec<&Commit<'_>> = parent.iter().collect();
        let oid = self
            .repo
            .commit(None, &author, &committer, message, &tree, &parents)
            .map_err(op("commit"))?;
        Ok(oid.to_string())
    }

    /// The whole message of commit `rev`.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `rev` is not a commit here.
    pub fn message_of(&self, rev: &str) -> Result<String, GitError> {
        let commit = self.resolve_commit(rev)?;
        Ok(String::from_utf8_lossy(commit.message_bytes()).into_owned())
    }

    /// This handle, reading ralph's history (its trailers) from commit `sha` instead of HEAD:
    /// `ralph status` of a feature whose branch is not checked out. Nothing else changes.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `sha` is not a commit here.
    pub fn reading_history_at(mut self, sha: &str) -> Result<Repo, GitError> {
        let oid = self.resolve_commit(sha)?.id();
        self.history_tip = Some(oid);
        Ok(self)
    }

    /// The commit ralph's history is read from: [`Repo::reading_history_at`]'s, else HEAD's.
    fn history_tip(&self) -> Result<Option<Commit<'_>>, GitError> {
        match self.history_tip {
            Some(oid) => self
                .repo
                .find_commit(oid)
                .map(Some)
                .map_err(op("read commit")),
            None => self.head_commit(),
        }
    }

    /// The remote-tracking branch (`<remote>/<name>`) to start a missing local branch `name`
    /// from: on the remote the current branch tracks, else on `origin`. `None` when the local
    /// branch exists or no such remote-tracking branch does.
    pub fn remote_branch_for(&self, name: &str) -> Option<String> {
        if self.repo.find_branch(name, BranchType::Local).is_ok() {
            return None;
        }
        let upstream_remote = self.current_branch().and_then(|b| {
            self.repo
                .config()
                .ok()?
                .get_string(&format!("branch.{b}.remote"))
                .ok()
        });
        [upstream_remote, Some("origin".to_owned())]
            .into_iter()
            .flatten()
            .filter(|r| r != ".")
            .map(|r| format!("{r}/{name}"))
            .find(|short| self.repo.find_branch(short, BranchType::Remote).is_ok())
    }

    /// The local branches (`refs/heads/*`) as (short name, full sha of the commit they point
    /// at), in git's order; branches that name no commit are left out, and a repository whose
    /// references cannot be listed gives none.
    pub fn local_branches(&self) -> Vec<(String, String)> {
        let Ok(refs) = self.repo.references_glob("refs/heads/*") else {
            return Vec::new();
        };
        refs.flatten()
            .filter_map(|r| {
                let name = r.name()?.strip_prefix("refs/heads/")?.to_owned();
                Some((name, r.peel_to_commit().ok()?.id().to_string()))
            })
            .collect()
    }

    /// The full sha reference `name` (e.g. `refs/remotes/origin/x`) points at; `None` when it
    /// does not exist or names no commit.
    pub fn ref_sha(&self, name: &str) -> Option<String> {
        let reference = self.repo.find_reference(name).ok()?;
        Some(reference.peel_to_commit().ok()?.id().to_string())
    }

    /// Puts HEAD on local branch `name` at commit `sha`: creates the branch there when it does
    /// not exist, or moves it forward to `sha` when `sha` descends from it, checking the tree
    /// out safely (uncommitted changes are kept unless the switch would overwrite them).
    /// Returns whether anything moved.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `sha` is not a commit here; [`GitError::Diverged`]
    /// when the branch has commits `sha` does not have; [`GitError::CheckoutConflict`];
    /// [`GitError::Git`].
    pub fn advance_branch(&self, name: &str, sha: &str) -> Result<bool, GitError> {
        let refname = format!("refs/heads/{name}");
        if !git2::Reference::is_valid_name(&refname) || name.starts_with('-') {
            return Err(GitError::InvalidBranchName {
                name: name.to_owned(),
            });
        }
        let target = self.resolve_commit(sha)?;
        let on_it = self.current_branch().as_deref() == Some(name);
        let current = self.ref_sha(&refname);
        if let Some(current) = &current {
            if *current == target.id().to_string() {
                if on_it {
                    return Ok(false);
                }
                self.switch_to(name, &refname, &target)?;
                return Ok(true);
            }
            if !self.is_ancestor(current, sha)? {
                return Err(GitError::Diverged {
                    branch: name.to_owned(),
                    other: sha.to_owned(),
                });
            }
        }
        // Check out first so that a conflict leaves the branch where it was.
        self.checkout_commit(name, &target)?;
        self.repo
            .reference(
                &refname,
                target.id(),
                true,
                "ralph: fast-forward from the remote",
            )
            .map_err(op("move branch"))?;
        self.repo.set_head(&refname).map_err(op("switch HEAD"))?;
        Ok(true)
    }

    /// The commits every remote-tracking ref of `remote` (`refs/remotes/<remote>/*`) points
    /// at, full shas.
    pub fn remote_tracking_shas(&self, remote: &str) -> Vec<String> {
        let glob = format!("refs/remotes/{remote}/*");
        let Ok(refs) = self.repo.references_glob(&glob) else {
            return Vec::new();
        };
        refs.flatten()
            .filter_map(|r| r.peel_to_commit().ok().map(|c| c.id().to_string()))
            .collect()
    }

    /// Commits reachable from `to` but from none of `hide` (shas; unknown ones are skipped),
    /// full shas: what a remote whose refs are `hide` lacks.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `to` is not a commit; [`GitError::Git`].
    pub fn commits_not_in(&self, to: &str, hide: &[String]) -> Result<Vec<String>, GitError> {
        let to = self.resolve_commit(to)?;
        let mut walk = self.repo.revwalk().map_err(op("walk history"))?;
        walk.push(to.id()).map_err(op("walk history"))?;
        for h in hide {
            if let Ok(commit) = self.resolve_commit(h) {
                walk.hide(commit.id()).map_err(op("walk history"))?;
            }
        }
        walk.map(|oid| oid.map(|oid| oid.to_string()))
            .collect::<Result<_, _>>()
            .map_err(op("walk history"))
    }

    /// The commit HEAD points at; `None` on an unborn branch.
    fn head_commit(&self) -> Result<Option<Commit<'_>>, GitError> {
        match self.repo.head() {
            Ok(head) => head.peel_to_commit().map(Some).map_err(op("read HEAD")),
            Err(err) if matches!(err.code(), ErrorCode::UnbornBranch | ErrorCode::NotFound) => {
                Ok(None)
            }
            Err(err) => Err(GitError::Git {
                op: "read HEAD",
                source: err,
            }),
        }
    }

    /// Resolves a revision to a commit.
    fn resolve_commit(&self, rev: &str) -> Result<Commit<'_>, GitError> {
        let unknown = || GitError::UnknownRevision {
            rev: rev.to_owned(),
        };
        let object = self.repo.revparse_single(rev).map_err(|_| unknown())?;
        object
            .peel(ObjectType::Commit)
            .ok()
            .and_then(|object| object.into_commit().ok())
            .ok_or_else(unknown)
    }

    /// Resolves `base` for creating `branch`, preferring a local branch, then a remote-tracking
    /// `origin/<base>`, then any revision.
    fn resolve_base(&self, base: &str, branch: &str) -> Result<Commit<'_>, GitError> {
        let not_found = || GitError::BaseNotFound {
            base: base.to_owned(),
            branch: branch.to_owned(),
        };
        if let Ok(local) = self.repo.find_branch(base, BranchType::Local) {
            return local.get().peel_to_commit().map_err(op("read base branch"));
        }
        if let Ok(remote) = self
            .repo
            .find_branch(&format!("origin/{base}"), BranchType::Remote)
        {
            return remote
                .get()
                .peel_to_commit()
                .map_err(op("read base branch"));
        }
        self.resolve_commit(base).map_err(|_| not_found())
    }

    /// Checks out an existing branch's commit and moves HEAD to it.
    fn switch_to(&self, name: &str, refname: &str, commit: &Commit<'_>) -> Result<(), GitError> {
        self.checkout_commit(name, commit)?;
        self.repo.set_head(refname).map_err(op("switch HEAD"))
    }

    /// Updates the working tree and index to `commit` without overwriting local changes.
    fn checkout_commit(&self, branch: &str, commit: &Commit<'_>) -> Result<(), GitError> {
        let tree = commit.tree().map_err(op("read tree"))?;
        let mut checkout = CheckoutBuilder::new();
        checkout.safe();
        self.repo
            .checkout_tree(tree.as_object(), Some(&mut checkout))
            .map_err(|err| {
                if err.code() == ErrorCode::Conflict {
                    GitError::CheckoutConflict {
                        branch: branch.to_owned(),
                    }
                } else {
                    GitError::Git {
                        op: "checkout",
                        source: err,
                    }
                }
            })
    }
}

/// Builds the commit message: subject, blank line, optional body, blank line, trailers.
fn commit_message(subject: &str, body: &str, trailers: &[(&str, String)]) -> String {
    let one_line = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut message = one_line(subject);
    message.push('\n');
    let body = body.trim();
    if !body.is_empty() {
        message.push('\n');
        message.push_str(body);
        message.push('\n');
    }
    if !trailers.is_empty() {
        message.push('\n');
        for (key, value) in trailers {
            message.push_str(&format!("{key}: {}\n", one_line(value)));
        }
    }
    // A commit is published by `--push`: no secret may reach it (crate::redact).
    crate::redact::redact_env(&message)
}

/// The identity git would use: the environment variables, then `user.name`/`user.email`, then
/// the ralph fallback (per field).
fn identity(
    config: &git2::Config,
    env: &dyn Fn(&str) -> Option<String>,
    name_var: &str,
    email_var: &str,
) -> Result<Signature<'static>, GitError> {
    let pick = |var: &str, key: &str, fallback: &str| {
        env(var)
            .or_else(|| config.get_string(key).ok())
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
            .unwrap_or_else(|| fallback.to_owned())
    };
    let name = pick(name_var, "user.name", FALLBACK_NAME);
    let email = pick(email_var, "user.email", FALLBACK_EMAIL);
    // libgit2 rejects names with angle brackets; fall back rather than fail the checkpoint.
    Signature::now(&name, &email)
        .or_else(|_| Signature::now(FALLBACK_NAME, FALLBACK_EMAIL))
        .map_err(op("build commit signature"))
}

#[cfg(test)]
pub(crate) mod tests;
