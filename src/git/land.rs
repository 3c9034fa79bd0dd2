//! `--parallel`'s landing mechanics: bringing a story's worktree up to the run branch's tip
//! ([`integrate`]), moving the main checkout forward to the result ([`advance_checkout`]) and
//! keeping work that could not land under a named reference ([`salvage`]). The dispatcher
//! (`run/parallel.rs`) calls them one landing at a time.
//!
//! Nothing here resets, stashes or cleans anything: a conflict is found in memory (libgit2's
//! tree merge) and leaves the worktree as it was; the main checkout moves only when every file
//! the move would write is as the run branch last committed it.

use std::path::{Path, PathBuf};

use git2::{build::CheckoutBuilder, CheckoutNotificationType, Index, IndexEntry, Oid, Tree};

use super::worktree::safe_name;
use super::{commit_message, identity, op, GitError, Repo};

pub mod resolve;

/// What [`integrate`] made of the story's work and the run branch's tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Integration {
    /// The two fit together; the worktree's HEAD, index and files are at `commit`.
    Clean {
        /// The result (full sha): the story's own HEAD when `fast_forward`, else a new merge
        /// commit whose parents are the tip and the story's HEAD.
        commit: String,
        /// The tip is already in the story's history and nothing had to change: the run branch
        /// can simply move to `commit`.
        fast_forward: bool,
    },
    /// The story's work and the tip changed the same lines (or one deleted a file the other
    /// changed). Nothing changed in the worktree.
    Conflict {
        /// The conflicting paths, repository-relative, sorted.
        files: Vec<String>,
        /// The run branch's side (the tip: the stories landed meanwhile; the merge's first
        /// parent): how many commits since the merge base and their subjects (newest first),
        /// then per conflicting file a few of the lines it changed there (`deleted.` for a
        /// file it deleted). One paragraph (lines, no blank line), with no label: the caller
        /// says which side it is, in the story's next prompt.
        ours: String,
        /// The story's side (the worktree's HEAD), in the same shape.
        theirs: String,
    },
}

/// Commits of one side named in a conflict summary; more are counted.
const SUMMARY_COMMITS: usize = 8;
/// Changed lines shown per conflicting file and side.
const SUMMARY_LINES: usize = 6;
/// Characters kept of one shown line.
const SUMMARY_LINE_CHARS: usize = 160;
/// Conflicting files given lines in a summary; more are only named in `files`.
const SUMMARY_FILES: usize = 5;

/// In a story's worktree `wt`, commits everything the agent left uncommitted (new, changed and
/// deleted files; ignored files are not; nor are secret-looking untracked files such as `.env`,
/// which [`Repo::checkpoint`] withholds) with `subject`, and returns HEAD's full sha afterwards
/// (HEAD as it was when nothing was left).
///
/// # Errors
/// [`GitError::Conflicted`] when the worktree's index holds unresolved conflicts (an agent's
/// unfinished merge); [`GitError::UnknownRevision`] when HEAD has no commit; [`GitError::Git`].
pub fn commit_leftovers(wt: &Repo, subject: &str) -> Result<String, GitError> {
    commit_leftovers_withheld(wt, subject).map(|(sha, _)| sha)
}

/// [`commit_leftovers`], also returning the secret-looking untracked files the commit left
/// out (repository-relative), which the caller must keep before the worktree goes.
///
/// # Errors
/// As [`commit_leftovers`].
pub fn commit_leftovers_withheld(
    wt: &Repo,
    subject: &str,
) -> Result<(String, Vec<String>), GitError> {
    let checkpoint = wt.checkpoint(subject, "", &[])?;
    if !checkpoint.withheld.is_empty() {
        // The caller keeps them and says so in the record (run/parallel/land.rs).
        tracing::debug!(
            files = ?checkpoint.withheld,
            "secret-looking files in a worktree are not committed"
        );
    }
    let sha = wt.head_sha()?.ok_or_else(|| GitError::UnknownRevision {
        rev: "HEAD".to_owned(),
    })?;
    Ok((sha, checkpoint.withheld))
}

/// The directory in a worktree's private git directory where [`set_aside`] keeps files.
fn shelf(wt: &Repo) -> PathBuf {
    wt.private_dir().join("ralph-setup-aside")
}

/// Moves `files` (repository-relative: what `worktree_setup` made,
/// [`Repo::setup_files_unchanged`]) out of the worktree into its private git directory, so that
/// the commit of the agent's leftovers ([`commit_leftovers_withheld`]) and the merge of the run
/// branch's tip do not take them or trip on them; [`put_back`] returns them. A file that cannot
/// be moved stays (and is logged): it is then committed as before.
pub fn set_aside(wt: &Repo, files: &[String]) {
    let shelf = shelf(wt);
    for file in files {
        let (from, to) = (wt.root().join(file), shelf.join(file));
        let moved = to
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::rename(&from, &to));
        if let Err(e) = moved {
            tracing::warn!("cannot set {} aside: {e}", from.display());
        }
    }
}

/// Puts the files [`set_aside`] moved back into the worktree (for the check that may run there),
/// except where a file now is (the run branch's version, merged in, wins); returns those left
/// out. Nothing to do when nothing was set aside.
pub fn put_back(wt: &Repo) -> Vec<String> {
    let shelf = shelf(wt);
    let mut skipped = Vec::new();
    for path in files_under(&shelf) {
        let Ok(rel) = path.strip_prefix(&shelf) else {
            continue;
        };
        let to = wt.root().join(rel);
        if std::fs::symlink_metadata(&to).is_ok() {
            skipped.push(rel.to_string_lossy().into_owned());
            continue;
        }
        let back = to
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::rename(&path, &to));
        if let Err(e) = back {
            tracing::warn!("cannot put {} back: {e}", to.display());
        }
    }
    let _ = std::fs::remove_dir_all(&shelf);
    skipped.sort();
    skipped
}

/// The files that differ between commits `from` and `to` (added, changed or deleted; both
/// sides of a rename), repository-relative, sorted: what a salvaged story's work holds.
///
/// # Errors
/// [`GitError::UnknownRevision`] when either is not a commit; [`GitError::Git`].
pub fn files_between(repo: &Repo, from: &str, to: &str) -> Result<Vec<String>, GitError> {
    let from = repo.resolve_commit(from)?.tree().map_err(op("read tree"))?;
    let to = repo.resolve_commit(to)?.tree().map_err(op("read tree"))?;
    repo.paths_between(&from, &to)
}

/// The newest modification time of anything under `root` (files, links and directories; at
/// most `limit` entries looked at), or `None` when nothing could be read: a killed worker's
/// last sign of life, when its agent wrote files after its last transcript line.
pub fn newest_change(root: &Path, limit: usize) -> Option<std::time::SystemTime> {
    let mut newest = None;
    let mut todo = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > limit {
                return newest;
            }
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if let Ok(at) = meta.modified() {
                newest = Some(newest.map_or(at, |n: std::time::SystemTime| n.max(at)));
            }
            if meta.is_dir() {
                todo.push(e.path());
            }
        }
    }
    newest
}

/// Directories whose ignored contents are builds, dependencies or caches, which the project
/// makes again (`npm ci`, `cargo build`): never kept from a worktree. Matched against any
/// component of a path.
pub const REBUILT_DIRS: &[&str] = &[
    "node_modules",
    "bower_components",
    "target",
    "build",
    "dist",
    "__pycache__",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".gradle",
    ".next",
    ".nuxt",
    ".turbo",
    ".parcel-cache",
    ".cache",
    ".dart_tool",
    ".terraform",
    "coverage",
    "vendor",
    ".ralph",
];

/// Largest ignored file kept from a worktree, in bytes (10 MiB).
pub const KEEP_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Most bytes of ignored files kept from one worktree (50 MiB).
pub const KEEP_TOTAL_BYTES: u64 = 50 * 1024 * 1024;
/// Most ignored files kept from one worktree.
pub const KEEP_FILES: usize = 200;

/// The ignored files an agent wrote in a story's worktree: what a serial run would have left
/// in the checkout and a worktree's removal would delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IgnoredWork {
    /// Files to keep (repository-relative, sorted): modified at or after `since`, outside
    /// [`REBUILT_DIRS`], each at most [`KEEP_FILE_BYTES`], together at most
    /// [`KEEP_TOTAL_BYTES`] and [`KEEP_FILES`].
    pub keep: Vec<String>,
    /// New ignored files left out for their size or number (repository-relative, sorted).
    pub too_big: Vec<String>,
}

/// In worktree `wt`, the ignored files (regular files; links and what [`REBUILT_DIRS`] holds
/// left out) modified at or after `since` (the iteration's start: what `worktree_copy` and
/// `worktree_setup` made before it is not the agent's), sorted into [`IgnoredWork`].
///
/// # Errors
/// [`GitError::Git`] when git's status cannot be read.
pub fn ignored_work(wt: &Repo, since: std::time::SystemTime) -> Result<IgnoredWork, GitError> {
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(false)
        .include_ignored(true)
        .recurse_ignored_dirs(false)
        .exclude_submodules(true);
    let statuses = wt.repo.statuses(Some(&mut opts)).map_err(op("status"))?;
    let rebuilt = |rel: &str| rel.split('/').any(|c| REBUILT_DIRS.contains(&c));
    let mut found: Vec<(String, u64)> = Vec::new();
    let mut todo: Vec<String> = statuses
        .iter()
        .filter(|e| e.status().is_ignored())
        .map(|e| String::from_utf8_lossy(e.path_bytes()).into_owned())
        .collect();
    // A directory git reports as ignored (`logs/`) is walked here, bounded.
    let mut seen = 0usize;
    while let Some(rel) = todo.pop() {
        let rel = rel.trim_end_matches('/').to_owned();
        if rel.is_empty() || rebuilt(&rel) {
            continue;
        }
        seen += 1;
        if seen > 10 * KEEP_FILES {
            break;
        }
        let path = wt.root.join(&rel);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                for e in entries.flatten() {
                    todo.push(format!("{rel}/{}", e.file_name().to_string_lossy()));
                }
            }
        } else if meta.is_file() && meta.modified().is_ok_and(|m| m >= since) {
            found.push((rel, meta.len()));
        }
    }
    found.sort();
    let mut work = IgnoredWork::default();
    let mut total = 0u64;
    for (rel, len) in found {
        if len > KEEP_FILE_BYTES || total + len > KEEP_TOTAL_BYTES || work.keep.len() >= KEEP_FILES
        {
            work.too_big.push(rel);
        } else {
            total += len;
            work.keep.push(rel);
        }
    }
    Ok(work)
}

/// Whether repository-relative `path` is one of `keep` (a file, or a directory prefix such as
/// `progress-history/` or `progress-history`, covering what is under it).
fn covered(path: &str, keep: &[&str]) -> bool {
    keep.iter().any(|k| {
        let k = k.trim_start_matches("./").trim_end_matches('/');
        !k.is_empty()
            && (path == k
                || (path.len() > k.len()
                    && path.starts_with(k)
                    && path.as_bytes()[k.len()] == b'/'))
    })
}

/// In worktree `wt`, whose HEAD (S) is the story's work, brings in `tip` (the run branch's tip,
/// a sha). The result's tree is the three-way merge of S and the tip (base: their merge base)
/// with every path `keep_from_tip` covers (repository-relative files, or directory prefixes)
/// exactly as in the tip (absent there: absent in the result), whatever either side did to it;
/// a conflict only in those paths is no conflict.
///
/// - the result's tree is S's and the tip is in S's history: [`Integration::Clean`] with S and
///   `fast_forward`;
/// - otherwise a merge commit (parents: the tip, then S; its message names both) is made, and
///   HEAD (detached), the index and the files move to it (a safe checkout: ignored files stay);
/// - a real conflict: [`Integration::Conflict`], and the worktree is left exactly as it was
///   (HEAD at S, no conflict markers, a clean index).
///
/// # Errors
/// [`GitError::UnknownRevision`] when `tip` is not a commit or HEAD has none;
/// [`GitError::CheckoutConflict`] when uncommitted changes in the worktree are in the way of the
/// result (call [`commit_leftovers`] first); [`GitError::Git`].
pub fn integrate(wt: &Repo, tip: &str, keep_from_tip: &[&str]) -> Result<Integration, GitError> {
    let story = wt.head_commit()?.ok_or_else(|| GitError::UnknownRevision {
        rev: "HEAD".to_owned(),
    })?;
    let tip = wt.resolve_commit(tip)?;
    let repo = &wt.repo;
    let base = repo.merge_base(story.id(), tip.id()).ok();
    let story_tree = story.tree().map_err(op("read tree"))?;
    let tip_tree = tip.tree().map_err(op("read tree"))?;
    let base_tree = match base {
        Some(oid) => repo
            .find_commit(oid)
            .and_then(|c| c.tree())
            .map_err(op("read tree"))?,
        None => empty_tree(wt)?,
    };
    let tip_in_story = base == Some(tip.id());
    let mut index = if tip_in_story {
        let mut index = Index::new().map_err(op("build index"))?;
        index.read_tree(&story_tree).map_err(op("build index"))?;
        index
    } else {
        repo.merge_trees(&base_tree, &tip_tree, &story_tree, None)
            .map_err(op("merge"))?
    };
    let conflicts = real_conflicts(&index, keep_from_tip)?;
    if !conflicts.is_empty() {
        let base_sha = base.map(|b| b.to_string());
        let ours = side_summary(wt, base_sha.as_deref(), &tip, &base_tree, &conflicts)?;
        let theirs = side_summary(wt, base_sha.as_deref(), &story, &base_tree, &conflicts)?;
        return Ok(Integration::Conflict {
            files: conflicts,
            ours,
            theirs,
        });
    }
    take_from_tip(wt, &mut index, &tip_tree, keep_from_tip)?;
    let tree_id = index.write_tree_to(repo).map_err(op("write tree"))?;
    if tip_in_story && tree_id == story_tree.id() {
        return Ok(Integration::Clean {
            commit: story.id().to_string(),
            fast_forward: true,
        });
    }
    let tree = repo.find_tree(tree_id).map_err(op("read tree"))?;
    let config = repo.config().map_err(op("read config"))?;
    let env = |key: &str| std::env::var(key).ok();
    let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
    let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
    let short = |oid: Oid| oid.to_string()[..12].to_owned();
    let message = commit_message(
        &format!(
            "ralph: merge the run branch ({}) into the story's work ({})",
            short(tip.id()),
            short(story.id())
        ),
        &format!(
            "The run branch's tip {} (first parent) and the story's work {} (second parent).",
            tip.id(),
            story.id()
        ),
        &[],
    );
    let merged = repo
        .commit(None, &author, &committer, &message, &tree, &[&tip, &story])
        .map_err(op("commit"))?;
    let mut checkout = CheckoutBuilder::new();
    checkout.safe();
    repo.index()
        .and_then(|mut i| i.read(false))
        .map_err(op("read index"))?;
    repo.checkout_tree(tree.as_object(), Some(&mut checkout))
        .map_err(|err| {
            if err.code() == git2::ErrorCode::Conflict {
                GitError::CheckoutConflict {
                    branch: "(the story's worktree)".to_owned(),
                }
            } else {
                GitError::Git {
                    op: "checkout",
                    source: err,
                }
            }
        })?;
    repo.set_head_detached(merged).map_err(op("move HEAD"))?;
    Ok(Integration::Clean {
        commit: merged.to_string(),
        fast_forward: false,
    })
}

/// The empty tree of `wt`'s repository (the base of two histories with no common commit).
fn empty_tree(wt: &Repo) -> Result<Tree<'_>, GitError> {
    let id = wt
        .repo
        .treebuilder(None)
        .and_then(|b| b.write())
        .map_err(op("write tree"))?;
    wt.repo.find_tree(id).map_err(op("read tree"))
}

/// The conflicting paths of a merge's `index` that `keep` does not cover, sorted.
fn real_conflicts(index: &Index, keep: &[&str]) -> Result<Vec<String>, GitError> {
    let mut files = Vec::new();
    if !index.has_conflicts() {
        return Ok(files);
    }
    for conflict in index.conflicts().map_err(op("read conflicts"))? {
        let conflict = conflict.map_err(op("read conflicts"))?;
        for entry in [&conflict.ancestor, &conflict.our, &conflict.their]
            .into_iter()
            .flatten()
        {
            let path = String::from_utf8_lossy(&entry.path).into_owned();
            if !covered(&path, keep) {
                files.push(path);
            }
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Replaces in `index` every path `keep` covers by the tip's version (removing those the tip
/// does not have), conflicts in them included.
fn take_from_tip(
    wt: &Repo,
    index: &mut Index,
    tip_tree: &Tree<'_>,
    keep: &[&str],
) -> Result<(), GitError> {
    if keep.is_empty() {
        return Ok(());
    }
    let mut drop: Vec<String> = index
        .iter()
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .filter(|p| covered(p, keep))
        .collect();
    if index.has_conflicts() {
        for conflict in index.conflicts().map_err(op("read conflicts"))?.flatten() {
            for entry in [conflict.ancestor, conflict.our, conflict.their]
                .into_iter()
                .flatten()
            {
                let path = String::from_utf8_lossy(&entry.path).into_owned();
                if covered(&path, keep) {
                    drop.push(path);
                }
            }
        }
    }
    drop.sort();
    drop.dedup();
    for path in &drop {
        let _ = index.conflict_remove(Path::new(path));
        for stage in 0..=3 {
            let _ = index.remove(Path::new(path), stage);
        }
    }
    let mut keep_entries = Vec::new();
    tip_tree
        .walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            let path = format!("{dir}{}", entry.name().unwrap_or_default());
            let is_file = matches!(
                entry.kind(),
                Some(git2::ObjectType::Blob) | Some(git2::ObjectType::Commit)
            );
            if is_file && covered(&path, keep) {
                keep_entries.push((path, entry.id(), entry.filemode() as u32));
            }
            git2::TreeWalkResult::Ok
        })
        .map_err(op("read tree"))?;
    for (path, id, mode) in keep_entries {
        let size = wt.repo.find_blob(id).map(|b| b.size() as u32).unwrap_or(0);
        index
            .add(&IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode,
                uid: 0,
                gid: 0,
                file_size: size,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.into_bytes(),
            })
            .map_err(op("build index"))?;
    }
    Ok(())
}

/// One side of a conflict for the story's next prompt: the subjects of `side`'s commits since
/// `base`, then per conflicting file a few of the lines `side` changed there.
fn side_summary(
    wt: &Repo,
    base: Option<&str>,
    side: &git2::Commit<'_>,
    base_tree: &Tree<'_>,
    files: &[String],
) -> Result<String, GitError> {
    let side_sha = side.id().to_string();
    let commits = wt.commits_between(base, &side_sha)?;
    let mut subjects: Vec<String> = commits
        .iter()
        .rev()
        .take(SUMMARY_COMMITS)
        .map(|c| format!("\"{}\"", wt.commit_subject(c).unwrap_or_default()))
        .collect();
    if commits.len() > SUMMARY_COMMITS {
        subjects.push(format!("and {} more", commits.len() - SUMMARY_COMMITS));
    }
    let since = base
        .map(|b| format!("since {}", &b[..b.len().min(12)]))
        .unwrap_or_else(|| "(no common history)".to_owned());
    let mut out = format!(
        "{} commit{} {since}",
        commits.len(),
        if commits.len() == 1 { "" } else { "s" }
    );
    if !subjects.is_empty() {
        out.push_str(&format!(" ({})", subjects.join(", ")));
    }
    out.push('.');
    let side_tree = side.tree().map_err(op("read tree"))?;
    for file in files.iter().take(SUMMARY_FILES) {
        out.push('\n');
        out.push_str(&file_change(wt, base_tree, &side_tree, file));
    }
    if files.len() > SUMMARY_FILES {
        out.push_str(&format!(
            "\n…and {} more conflicting files.",
            files.len() - SUMMARY_FILES
        ));
    }
    Ok(crate::redact::redact_env(&out))
}

/// What one side did to `path` since the base, in a line or a few: `deleted`, `added`, or the
/// first changed lines (`-`/`+`).
fn file_change(wt: &Repo, base_tree: &Tree<'_>, side_tree: &Tree<'_>, path: &str) -> String {
    let blob_of = |tree: &Tree<'_>| {
        tree.get_path(Path::new(path))
            .ok()
            .and_then(|e| wt.repo.find_blob(e.id()).ok())
    };
    let (before, after) = (blob_of(base_tree), blob_of(side_tree));
    let lines = match (&before, &after) {
        (Some(_), None) => return format!("{path}: deleted."),
        (None, None) => return format!("{path}: not a file on this side."),
        _ => changed_lines(before.as_ref(), after.as_ref(), path),
    };
    let verb = if before.is_none() { "added" } else { "changed" };
    if lines.is_empty() {
        return format!("{path}: {verb} (no text lines to show).");
    }
    format!("{path}: {verb}:\n{}", lines.join("\n"))
}

/// The first [`SUMMARY_LINES`] added or removed lines between two versions of a file, each cut
/// at [`SUMMARY_LINE_CHARS`] characters and prefixed `-`/`+`.
fn changed_lines(
    before: Option<&git2::Blob<'_>>,
    after: Option<&git2::Blob<'_>>,
    path: &str,
) -> Vec<String> {
    let old = before.map(|b| b.content()).unwrap_or_default();
    let new = after.map(|b| b.content()).unwrap_or_default();
    let Ok(patch) =
        git2::Patch::from_buffers(old, Some(Path::new(path)), new, Some(Path::new(path)), None)
    else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    'hunks: for h in 0..patch.num_hunks() {
        let count = patch.num_lines_in_hunk(h).unwrap_or(0);
        for l in 0..count {
            let Ok(line) = patch.line_in_hunk(h, l) else {
                continue;
            };
            let origin = line.origin();
            if origin != '+' && origin != '-' {
                continue;
            }
            let text = String::from_utf8_lossy(line.content());
            let text: String = text.trim_end().chars().take(SUMMARY_LINE_CHARS).collect();
            lines.push(format!("  {origin} {text}"));
            if lines.len() == SUMMARY_LINES {
                break 'hunks;
            }
        }
    }
    lines
}

/// Moves the main checkout `main` (on local branch `branch`, HEAD at `from`, a sha) forward to
/// `to` (a descendant of `from`): the tracked files that differ between the two commits and the
/// index are updated (a safe checkout), then the branch moves (only if it still points at
/// `from`). `from == to`: nothing to do.
///
/// Never resets, stashes or cleans anything, and never touches an untracked or ignored file.
/// Refused, with nothing changed, when HEAD is not on `branch` at `from`, when `to` does not
/// descend from `from`, when a tracked file `to` changes differs from `from` in the index or
/// the working tree (the user edited or staged it; submodules' own contents are not looked
/// at), or when an untracked or ignored file is where `to` puts a tracked one. The user's
/// changes to files `to` does not change stay as they are (edited, staged), uncommitted.
///
/// # Errors
/// [`GitError::CheckoutBlocked`] naming the files and the fix; [`GitError::UnknownRevision`];
/// [`GitError::Git`].
pub fn advance_checkout(main: &Repo, branch: &str, from: &str, to: &str) -> Result<(), GitError> {
    let blocked = |why: String, files: Vec<String>| GitError::CheckoutBlocked { why, files };
    let on = main.current_branch();
    if on.as_deref() != Some(branch) {
        return Err(blocked(
            format!(
                "the checkout cannot move forward: HEAD is {}, not on the run branch `{branch}`\nhint: check out `{branch}` again (`git switch {branch}`), then run ralph again",
                on.map(|b| format!("on `{b}`")).unwrap_or_else(|| "detached".to_owned())
            ),
            Vec::new(),
        ));
    }
    let from_commit = main.resolve_commit(from)?;
    let to_commit = main.resolve_commit(to)?;
    let head = main.head_commit()?.map(|c| c.id());
    if head != Some(from_commit.id()) {
        return Err(blocked(
            format!(
                "the checkout cannot move forward: `{branch}` is at {}, not at {from} where the landing started\nhint: something else committed on the run branch during the run; look at `git log {branch}`",
                head.map(|h| h.to_string()).unwrap_or_else(|| "no commit".to_owned())
            ),
            Vec::new(),
        ));
    }
    if from_commit.id() == to_commit.id() {
        return Ok(());
    }
    if !main.is_ancestor(from, to)? {
        return Err(blocked(
            format!("the checkout cannot move forward: {to} does not descend from {from}, so `{branch}` cannot move to it"),
            Vec::new(),
        ));
    }
    let from_tree = from_commit.tree().map_err(op("read tree"))?;
    let to_tree = to_commit.tree().map_err(op("read tree"))?;
    // The user's uncommitted changes the landing would write over (their other changes stay as
    // they are, uncommitted: the landing's checkpoint commits only ralph's own files).
    let written = main.paths_between(&from_tree, &to_tree)?;
    // ralph's own files holding the user's uncommitted edit from before the run
    // (`--parallel --allow-dirty`, `git::held`): the landed content with that edit on top is
    // written to the working file, the landed content to the index.
    let held: Vec<(String, Vec<u8>, Oid)> = written
        .iter()
        .filter(|f| super::held::is_held(&main.root, f))
        .filter_map(|f| {
            let id = to_tree.get_path(Path::new(f)).ok()?.id();
            let landed = main.repo.find_blob(id).ok()?.content().to_vec();
            let working = super::held::with_held(&main.root, f, &landed)?;
            Some((f.clone(), working, id))
        })
        .collect();
    let is_held = |f: &String| held.iter().any(|(h, _, _)| h == f);
    let edited: Vec<String> = main
        .edited_tracked_files()?
        .into_iter()
        .filter(|f| written.contains(f) && !is_held(f))
        .collect();
    if !edited.is_empty() {
        return Err(blocked(
            format!(
                "the landed work cannot be checked out: it changes files you changed in your checkout and did not commit: {}\nhint: commit or move your changes elsewhere (ralph never stashes, resets or overwrites them), then run ralph again",
                edited.join(", ")
            ),
            edited,
        ));
    }
    let in_the_way = main.untracked_in_the_way(&from_tree, &to_tree)?;
    if !in_the_way.is_empty() {
        return Err(blocked(
            format!(
                "the landed work cannot be checked out: untracked or ignored files in your checkout are where it puts tracked files: {}\nhint: move them away (ralph never overwrites them), then run ralph again",
                in_the_way.join(", ")
            ),
            in_the_way,
        ));
    }
    let mut refused: Vec<String> = Vec::new();
    let mut checkout = CheckoutBuilder::new();
    checkout
        .safe()
        .overwrite_ignored(false)
        .notify_on(CheckoutNotificationType::CONFLICT)
        .notify(|_, path, _, _, _| {
            if let Some(p) = path {
                refused.push(p.to_string_lossy().into_owned());
            }
            true
        });
    // Another git process (an agent's `git -C <checkout> add`) may hold the index: the checkout
    // writes it last, after the files, so it starts only once the lock is gone.
    if !main.wait_index_unlocked() {
        return Err(locked_checkout(main));
    }
    // The index as it is on disk now (the user may have staged something since it was read).
    main.repo
        .index()
        .and_then(|mut i| i.read(false))
        .map_err(op("read index"))?;
    let rest: Vec<&String> = written.iter().filter(|f| !is_held(f)).collect();
    for f in &rest {
        checkout.path(f.as_str());
    }
    let result = if held.is_empty() || !rest.is_empty() {
        main.repo
            .checkout_tree(to_tree.as_object(), Some(&mut checkout))
    } else {
        Ok(())
    };
    drop(checkout);
    if let Err(err) = result.as_ref().map_err(|e| e.code()) {
        if err == git2::ErrorCode::Locked && refused.is_empty() {
            // The lock was taken between the wait and the index write: the files are at `to`,
            // the index and the branch not yet. Finished as a killed ralph's half-done move is.
            return retry_half_done(main, branch, from, to);
        }
    }
    if result.is_ok() && !held.is_empty() {
        main.retry_locked(|| put_held(main, &held))?;
    }
    if let Err(err) = result {
        if err.code() == git2::ErrorCode::Conflict || !refused.is_empty() {
            refused.sort();
            refused.dedup();
            return Err(blocked(
                format!(
                    "the landed work cannot be checked out: files in your checkout are in the way: {}\nhint: move them away or commit them, then run ralph again",
                    refused.join(", ")
                ),
                refused,
            ));
        }
        return Err(GitError::Git {
            op: "checkout",
            source: err,
        });
    }
    main.retry_locked(|| {
        main.repo
            .reference_matching(
                &format!("refs/heads/{branch}"),
                to_commit.id(),
                true,
                from_commit.id(),
                "ralph: land a story",
            )
            .map_err(op("move the run branch"))
    })?;
    Ok(())
}

/// Writes each held file's working content and stages its landed blob (with no stat, so that git
/// compares contents and shows the user's edit as unstaged).
fn put_held(main: &Repo, held: &[(String, Vec<u8>, Oid)]) -> Result<(), GitError> {
    let mut index = main.repo.index().map_err(op("read index"))?;
    index.read(true).map_err(op("read index"))?;
    for (f, working, id) in held {
        crate::fsutil::write_atomic(&main.root.join(f), working).map_err(|e| GitError::Git {
            op: "write a held file",
            source: git2::Error::from_str(&e.to_string()),
        })?;
        if let Some(mut entry) = index.get_path(Path::new(f), 0) {
            let size = main.repo.find_blob(*id).map(|b| b.size()).unwrap_or(0);
            entry.id = *id;
            entry.file_size = size as u32;
            entry.mtime = git2::IndexTime::new(0, 0);
            entry.ctime = git2::IndexTime::new(0, 0);
            index.add(&entry).map_err(op("stage a file"))?;
        }
    }
    index.write().map_err(op("write index"))
}

/// [`GitError::Locked`] for the main checkout's index, after [`Repo::wait_index_unlocked`]
/// waited in vain.
fn locked_checkout(main: &Repo) -> GitError {
    GitError::Locked {
        op: "checkout",
        lock: main.index_lock(),
        waited_secs: super::lock_wait().as_secs(),
    }
}

/// After a checkout of `to` whose index write another process's lock refused: waits for the
/// lock and finishes the move with [`finish_advance`] (the paths hold `from`'s or `to`'s
/// versions, written by ralph).
///
/// # Errors
/// [`GitError::Locked`] when the lock stays; [`GitError::CheckoutBlocked`] when the move cannot
/// be finished (something else changed those files meanwhile); [`GitError::Git`].
fn retry_half_done(main: &Repo, branch: &str, from: &str, to: &str) -> Result<(), GitError> {
    if !main.wait_index_unlocked() {
        return Err(locked_checkout(main));
    }
    match main.retry_locked(|| finish_advance(main, branch, from, to))? {
        true => Ok(()),
        false => Err(GitError::CheckoutBlocked {
            why: format!("the landed work was checked out while another git process held the index, and the move of `{branch}` to {to} could not be finished: files it writes changed meanwhile\nhint: look at `git status`; the story's work is kept under its salvage ref"),
            files: Vec::new(),
        }),
    }
}

/// Finishes an [`advance_checkout`] of `main` (on `branch`) from `from` to `to` that a killed
/// ralph left half done: files and index (partly) at `to`, the branch still at `from`. Done only
/// when every path the two commits differ in holds, in the working tree and in the index,
/// `from`'s version or `to`'s (or nothing where one of them has nothing): then those paths are
/// checked out at `to` and the branch moves. Returns whether it moved the branch; `Ok(false)`
/// (nothing changed) when the branch is already at `to`, is not at `from`, HEAD is not on
/// `branch`, or a path holds anything else (the user's change: the dirty-tree check says so).
///
/// # Errors
/// [`GitError::UnknownRevision`]; [`GitError::Git`].
pub fn finish_advance(main: &Repo, branch: &str, from: &str, to: &str) -> Result<bool, GitError> {
    if main.current_branch().as_deref() != Some(branch) {
        return Ok(false);
    }
    let from_commit = main.resolve_commit(from)?;
    let to_commit = main.resolve_commit(to)?;
    let head = main.head_commit()?.map(|c| c.id());
    if head != Some(from_commit.id()) || !main.is_ancestor(from, to)? {
        return Ok(false);
    }
    let from_tree = from_commit.tree().map_err(op("read tree"))?;
    let to_tree = to_commit.tree().map_err(op("read tree"))?;
    let paths = main.paths_between(&from_tree, &to_tree)?;
    let mut index = main.repo.index().map_err(op("read index"))?;
    index.read(true).map_err(op("read index"))?;
    let blob_at = |tree: &Tree<'_>, p: &str| tree.get_path(Path::new(p)).ok().map(|e| e.id());
    for p in &paths {
        let (old, new) = (blob_at(&from_tree, p), blob_at(&to_tree, p));
        let ours = |id: Option<Oid>| id == old || id == new;
        let on_disk = match std::fs::symlink_metadata(main.root.join(p)) {
            Err(_) => None,
            Ok(m) if m.is_file() => {
                let bytes = std::fs::read(main.root.join(p)).map_err(|e| GitError::Git {
                    op: "read a file",
                    source: git2::Error::from_str(&e.to_string()),
                })?;
                Some(Oid::hash_object(git2::ObjectType::Blob, &bytes).map_err(op("hash"))?)
            }
            // A link or a folder where a file was: not a half-done checkout's doing.
            Ok(_) => return Ok(false),
        };
        let staged = index.get_path(Path::new(p), 0).map(|e| e.id);
        if !ours(on_disk) || !ours(staged) {
            return Ok(false);
        }
    }
    let mut checkout = CheckoutBuilder::new();
    checkout.force();
    for p in &paths {
        checkout.path(p);
    }
    main.repo
        .checkout_tree(to_tree.as_object(), Some(&mut checkout))
        .map_err(op("checkout"))?;
    main.repo
        .reference_matching(
            &format!("refs/heads/{branch}"),
            to_commit.id(),
            true,
            from_commit.id(),
            "ralph: finish an interrupted landing",
        )
        .map_err(op("move the run branch"))?;
    Ok(true)
}

impl Repo {
    /// Tracked files whose index or working copy differs from HEAD (modified, staged, deleted,
    /// renamed, type-changed or conflicted; untracked and ignored files and submodules' own
    /// contents left out), sorted.
    fn edited_tracked_files(&self) -> Result<Vec<String>, GitError> {
        let mut opts = git2::StatusOptions::new();
        opts.include_untracked(false)
            .include_ignored(false)
            .exclude_submodules(true);
        let statuses = self.repo.statuses(Some(&mut opts)).map_err(op("status"))?;
        let mut files: Vec<String> = statuses
            .iter()
            .filter(|e| {
                let s = e.status();
                !s.is_empty() && !s.is_wt_new() && !s.is_ignored()
            })
            .map(|e| String::from_utf8_lossy(e.path_bytes()).into_owned())
            .collect();
        files.sort();
        files.dedup();
        Ok(files)
    }

    /// The paths a checkout from `from` to `to` writes (added, changed or deleted; both sides
    /// of a rename), sorted.
    fn paths_between(&self, from: &Tree<'_>, to: &Tree<'_>) -> Result<Vec<String>, GitError> {
        let diff = self
            .repo
            .diff_tree_to_tree(Some(from), Some(to), None)
            .map_err(op("diff"))?;
        let mut paths: Vec<String> = diff
            .deltas()
            .flat_map(|d| [d.old_file().path(), d.new_file().path()])
            .flatten()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        paths.sort();
        paths.dedup();
        Ok(paths)
    }

    /// Paths `to` has as tracked files where the working tree holds something `from` does not
    /// track (an untracked or ignored file, or a file where `to` needs a directory), sorted.
    fn untracked_in_the_way(
        &self,
        from: &Tree<'_>,
        to: &Tree<'_>,
    ) -> Result<Vec<String>, GitError> {
        let diff = self
            .repo
            .diff_tree_to_tree(Some(from), Some(to), None)
            .map_err(op("diff"))?;
        let tracked = |p: &Path| from.get_path(p).is_ok();
        let mut found = Vec::new();
        for delta in diff.deltas() {
            let Some(new) = delta.new_file().path() else {
                continue;
            };
            if tracked(new) {
                continue;
            }
            // The file itself, or a parent that is a file where `to` needs a directory.
            let mut probe = Some(new);
            while let Some(p) = probe.filter(|p| !p.as_os_str().is_empty()) {
                let on_disk = self.root.join(p);
                if let Ok(meta) = std::fs::symlink_metadata(&on_disk) {
                    let blocks = p == new || !meta.is_dir();
                    if blocks && !tracked(p) {
                        found.push(p.to_string_lossy().into_owned());
                    }
                    break;
                }
                probe = p.parent();
            }
        }
        found.sort();
        found.dedup();
        Ok(found)
    }
}

/// On the main checkout, commits only `paths` (repository-relative files, or directory prefixes
/// such as `progress-history/` covering what is under them) as the working tree has them
/// (added, changed or deleted) on top of HEAD, with a message laid out as
/// [`Repo::checkpoint`]'s (`subject`, `body`, trailers). Everything else in the working tree
/// and the index (what the user changed or staged during the run) is left exactly as it is and
/// is not committed: the landing's own checkpoint (prd.json, progress.txt) never takes the
/// user's work in. Returns the new commit's full sha; `None` when those paths are as HEAD has
/// them.
///
/// # Errors
/// [`GitError::UnknownRevision`] when HEAD has no commit; [`GitError::Git`] when a file cannot
/// be read or the commit cannot be written.
pub fn commit_own_files(
    main: &Repo,
    paths: &[&str],
    subject: &str,
    body: &str,
    trailers: &[(&str, String)],
) -> Result<Option<String>, GitError> {
    // An agent's `git -C <checkout> add/commit` holds the index (or the branch) for a moment:
    // the whole step is done again once the lock is gone (it reads everything afresh).
    main.retry_locked(|| commit_own_files_once(main, paths, subject, body, trailers, false))
}

/// [`commit_own_files`] for a `--parallel` run, whose agents work beside the checkout: ralph
/// commits only on a tip its own steps (or the user's in this checkout) made. When the run
/// branch was moved by another process since (an agent's `git update-ref` from its worktree, an
/// agent's `git -C <checkout> commit`: this checkout's HEAD reflog does not lead to HEAD through
/// non-agent steps), nothing is committed and the error is [`GitError::BranchMoved`], so that
/// the caller's branch guard takes that move off and names it instead of ralph building on it.
/// Without a HEAD reflog (`core.logAllRefUpdates` off) it is [`commit_own_files`].
///
/// # Errors
/// As [`commit_own_files`].
pub fn commit_own_files_on_own_tip(
    main: &Repo,
    paths: &[&str],
    subject: &str,
    body: &str,
    trailers: &[(&str, String)],
) -> Result<Option<String>, GitError> {
    main.retry_locked(|| commit_own_files_once(main, paths, subject, body, trailers, true))
}

/// One try of [`commit_own_files`]. The branch moves to the new commit only if it still points
/// where this read HEAD (a compare-and-swap): a commit another process made on it meanwhile is
/// never buried under ralph's ([`GitError::BranchMoved`]).
fn commit_own_files_once(
    main: &Repo,
    paths: &[&str],
    subject: &str,
    body: &str,
    trailers: &[(&str, String)],
    on_own_tip: bool,
) -> Result<Option<String>, GitError> {
    let head = main
        .head_commit()?
        .ok_or_else(|| GitError::UnknownRevision {
            rev: "HEAD".to_owned(),
        })?;
    if on_own_tip && main.head_reflog_newest().is_some() {
        let own = main.head_before_agent_steps();
        if own.as_deref() != Some(head.id().to_string().as_str()) {
            return Err(GitError::BranchMoved {
                branch: main
                    .repo
                    .find_reference("HEAD")
                    .ok()
                    .and_then(|h| h.symbolic_target().map(str::to_owned))
                    .unwrap_or_else(|| "HEAD".to_owned()),
                expected: own.unwrap_or_else(|| "unknown".to_owned()),
                now: head.id().to_string(),
            });
        }
    }
    let head_tree = head.tree().map_err(op("read tree"))?;
    let files = own_files(main, &head_tree, paths);
    let mut index = main.repo.index().map_err(op("read index"))?;
    // What someone else (the user's `git add`) wrote since this handle read it.
    index.read(false).map_err(op("read index"))?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for file in &files {
        let on_disk = std::fs::symlink_metadata(main.root.join(file))
            .is_ok_and(|m| m.is_file() || m.file_type().is_symlink());
        if on_disk {
            index
                .add_path(Path::new(file))
                .map_err(op("stage a file"))?;
            let Some(mut entry) = index.get_path(Path::new(file), 0) else {
                continue;
            };
            // The user's uncommitted edit of the file when the run started stays uncommitted
            // (`--parallel --allow-dirty`, see `git::held`): staged and committed without it.
            if let Some(content) = held_out(main, file) {
                entry.id = main.repo.blob(&content).map_err(op("write a blob"))?;
                // Not the working file's stat: git then compares the contents and shows the
                // user's edit as the unstaged change it is.
                entry.file_size = content.len() as u32;
                entry.mtime = git2::IndexTime::new(0, 0);
                entry.ctime = git2::IndexTime::new(0, 0);
                index.add(&entry).map_err(op("stage a file"))?;
            }
            let mode = match entry.mode {
                0o100755 => git2::FileMode::BlobExecutable,
                0o120000 => git2::FileMode::Link,
                _ => git2::FileMode::Blob,
            };
            update.upsert(file.as_str(), entry.id, mode);
        } else {
            let _ = index.remove_path(Path::new(file));
            update.remove(file.as_str());
        }
    }
    let tree_id = update
        .create_updated(&main.repo, &head_tree)
        .map_err(op("write tree"))?;
    index.write().map_err(op("write index"))?;
    if tree_id == head_tree.id() {
        return Ok(None);
    }
    let tree = main.repo.find_tree(tree_id).map_err(op("read tree"))?;
    let config = main.repo.config().map_err(op("read config"))?;
    let env = |key: &str| std::env::var(key).ok();
    let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
    let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
    let message = commit_message(subject, body, trailers);
    let branch = main
        .repo
        .find_reference("HEAD")
        .ok()
        .and_then(|h| h.symbolic_target().map(str::to_owned));
    let Some(branch) = branch else {
        // A detached HEAD: no branch to bury anything under.
        let oid = main
            .repo
            .commit(Some("HEAD"), &author, &committer, &message, &tree, &[&head])
            .map_err(op("commit"))?;
        return Ok(Some(oid.to_string()));
    };
    let oid = main
        .repo
        .commit(None, &author, &committer, &message, &tree, &[&head])
        .map_err(op("commit"))?;
    let reflog = format!("commit: {}", message.lines().next().unwrap_or_default());
    match main
        .repo
        .reference_matching(&branch, oid, true, head.id(), &reflog)
    {
        Ok(_) => Ok(Some(oid.to_string())),
        Err(e) if e.code() == git2::ErrorCode::Locked => Err(GitError::Git {
            op: "move the branch",
            source: e,
        }),
        Err(e)
            if e.code() == git2::ErrorCode::Modified || e.code() == git2::ErrorCode::NotFound =>
        {
            Err(GitError::BranchMoved {
                now: main
                    .ref_sha(&branch)
                    .unwrap_or_else(|| "unknown".to_owned()),
                branch,
                expected: head.id().to_string(),
            })
        }
        Err(e) => Err(GitError::Git {
            op: "move the branch",
            source: e,
        }),
    }
}

/// `file`'s working content with the user's held edit taken off ([`super::held`]); `None` when
/// none is held, or it cannot be taken off (then the working file is committed, and a warning
/// says so).
fn held_out(main: &Repo, file: &str) -> Option<Vec<u8>> {
    if !super::held::is_held(&main.root, file) {
        return None;
    }
    let working = std::fs::read(main.root.join(file)).ok()?;
    let out = super::held::without_held(&main.root, file, &working);
    if out.is_none() {
        tracing::warn!(
            "your uncommitted edit of {file} from before the run overlaps a change ralph made to it: the commit takes the file as it is"
        );
    }
    out
}

/// The files `paths` names: each plain path, and for a directory prefix every file under it in
/// the working tree or in HEAD's tree (`/`-separated, sorted, no duplicates).
fn own_files(main: &Repo, head_tree: &Tree<'_>, paths: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    for p in paths {
        let p = p.trim_start_matches("./");
        let dir = p.trim_end_matches('/');
        if dir.is_empty() {
            continue;
        }
        let in_head_as_dir = head_tree
            .get_path(Path::new(dir))
            .is_ok_and(|e| e.kind() == Some(git2::ObjectType::Tree));
        let on_disk_as_dir = main.root.join(dir).is_dir();
        if !(p.ends_with('/') || in_head_as_dir || on_disk_as_dir) {
            files.push(dir.to_owned());
            continue;
        }
        let keep = [dir];
        let _ = head_tree.walk(git2::TreeWalkMode::PreOrder, |parent, entry| {
            let path = format!("{parent}{}", entry.name().unwrap_or_default());
            if entry.kind() == Some(git2::ObjectType::Blob) && covered(&path, &keep) {
                files.push(path);
            }
            git2::TreeWalkResult::Ok
        });
        for path in files_under(&main.root.join(dir)) {
            if let Ok(rel) = path.strip_prefix(&main.root) {
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

/// Everything under directory `root` that is not a directory (files, links), as absolute
/// paths, in no particular order; unreadable directories are skipped, links to directories are
/// not followed. Empty when `root` is missing.
fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

/// Points `refs/ralph/salvage/<run>/<story>` at commit `sha` and returns the reference's full
/// name: the story's work kept when it could not land. `run_id` and `story_id` are made valid
/// reference components by [`safe_name`] (`a/b` → `a%2Fb`). A salvage is never overwritten:
/// when the name already keeps another commit, `<story>-2`, `-3`, … is used; when it already
/// keeps `sha`, that name is returned.
///
/// # Errors
/// [`GitError::UnknownRevision`] when `sha` is not a commit; [`GitError::Git`].
pub fn salvage(repo: &Repo, run_id: &str, story_id: &str, sha: &str) -> Result<String, GitError> {
    let commit = repo.resolve_commit(sha)?.id();
    let base = format!(
        "refs/ralph/salvage/{}/{}",
        safe_name(run_id),
        safe_name(story_id)
    );
    for n in 1u32..=SALVAGE_NAMES {
        let name = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        match repo.repo.find_reference(&name) {
            Ok(existing) => {
                if existing.target() == Some(commit) {
                    return Ok(name);
                }
                continue;
            }
            Err(err) if err.code() == git2::ErrorCode::NotFound => {}
            Err(err) => {
                return Err(GitError::Git {
                    op: "read salvage reference",
                    source: err,
                })
            }
        }
        match repo
            .repo
            .reference(&name, commit, false, &format!("ralph: salvage {story_id}"))
        {
            Ok(_) => return Ok(name),
            // Written meanwhile by someone else: try the next name.
            Err(err) if err.code() == git2::ErrorCode::Exists => continue,
            Err(err) => {
                return Err(GitError::Git {
                    op: "write salvage reference",
                    source: err,
                })
            }
        }
    }
    Err(GitError::Git {
        op: "write salvage reference",
        source: git2::Error::from_str(&format!(
            "{base} and its {SALVAGE_NAMES} numbered names are all taken\nhint: delete salvages you no longer need (`git for-each-ref refs/ralph/salvage/`)"
        )),
    })
}

/// How many names [`salvage`] tries for one story before it gives up.
const SALVAGE_NAMES: u32 = 1000;

#[cfg(test)]
mod tests;
