//! The files of one ralph workspace: prd.json, progress.txt beside it, and the PRD's books (its
//! state, ledger, transcripts, prompt copies, prd.json snapshot, lock and stop request) under
//! `.ralph/` at the repository root. Every path ralph reads or writes under `.ralph/` is named
//! here, once.
//!
//! Each prd.json keeps its books apart, keyed by its path in the repository: the repository's
//! own `prd.json` (the common case, and where every ralph before books per PRD kept them) uses
//! `.ralph/` itself; any other prd.json uses `.ralph/books/<its path>/`, e.g.
//! `.ralph/books/prds/a/prd.json/`. Within one PRD's books, records carry their feature
//! (prd.json's `branchName`), which keeps a new feature's attempts and costs apart from an
//! archived one's.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::UserError;
use crate::fsutil::write_atomic;

/// The `.ralph` directory name, at the repository root.
pub const RALPH_DIR: &str = ".ralph";
/// The ledger's file name inside `.ralph/`.
pub const LEDGER_FILE: &str = "ledger.jsonl";
/// The folder under `.ralph/` that holds the books of every prd.json other than the
/// repository's own `prd.json`.
pub const BOOKS_DIR: &str = "books";
/// prd.json as it was when the current iteration started, inside `.ralph/` (a ralph killed
/// mid-iteration restores a broken prd.json from it).
pub const PRD_SNAPSHOT_FILE: &str = "prd.snapshot.json";

/// Paths a run works with, all absolute.
#[derive(Debug, Clone)]
pub struct RunPaths {
    /// Repository root.
    pub repo_root: PathBuf,
    /// prd.json.
    pub prd: PathBuf,
    /// progress.txt, beside prd.json.
    pub progress: PathBuf,
    /// This PRD's books: `.ralph/` at the repository root for the root's `prd.json`, else
    /// `.ralph/books/<prd.json's path>/` ([`books_dir`]).
    pub ralph_dir: PathBuf,
    /// `ledger.jsonl` in the books.
    pub ledger: PathBuf,
    /// The books whose `runs/<run>/` holds the iterations' transcripts and prompt copies:
    /// `ralph_dir`, except in a `--parallel` worker, where it is the main checkout's books (an
    /// agent that deletes its worktree cannot take its iteration's transcript with it).
    pub transcripts: PathBuf,
}

impl RunPaths {
    /// Derives every path from the repository root and prd.json.
    pub fn new(repo_root: &Path, prd: &Path) -> RunPaths {
        let ralph_dir = books_dir(repo_root, prd);
        RunPaths {
            repo_root: repo_root.to_path_buf(),
            prd: prd.to_path_buf(),
            progress: prd.parent().unwrap_or(repo_root).join("progress.txt"),
            ledger: ralph_dir.join(LEDGER_FILE),
            transcripts: ralph_dir.clone(),
            ralph_dir,
        }
    }

    /// The paths of the workspace of `prd`: its repository's root is the root (outside a git
    /// repository, prd.json's directory is).
    pub fn of_prd(prd: &Path) -> RunPaths {
        let dir = prd.parent().unwrap_or(Path::new(".")).to_path_buf();
        let root = crate::git::Repo::discover(&dir)
            .map(|r| r.root().to_path_buf())
            .unwrap_or(dir);
        RunPaths::new(&root, prd)
    }

    /// `.ralph/prd.snapshot.json`.
    pub fn prd_snapshot(&self) -> PathBuf {
        self.ralph_dir.join(PRD_SNAPSHOT_FILE)
    }

    /// An iteration's transcript, relative to `.ralph/`: `runs/<run>/iter-NNN.jsonl`.
    pub fn transcript_rel(run_id: &str, iteration: u32) -> PathBuf {
        Path::new("runs")
            .join(run_id)
            .join(format!("iter-{iteration:03}.jsonl"))
    }

    /// An iteration's transcript: `.ralph/runs/<run>/iter-NNN.jsonl` (in [`Self::transcripts`]).
    pub fn transcript(&self, run_id: &str, iteration: u32) -> PathBuf {
        self.transcripts
            .join(Self::transcript_rel(run_id, iteration))
    }

    /// The copy of an iteration's prompt beside its transcript:
    /// `.ralph/runs/<run>/iter-NNN.prompt.md`.
    pub fn prompt_copy(&self, run_id: &str, iteration: u32) -> PathBuf {
        self.transcript(run_id, iteration)
            .with_extension("prompt.md")
    }

    /// `path` relative to the repository root when inside it, for display.
    pub fn rel(&self, path: &Path) -> String {
        display_rel(path, &self.repo_root)
    }

    /// How a record names the transcript at `path`: relative to the repository root, a file
    /// under [`Self::transcripts`] named as under `ralph_dir` (a `--parallel` worker's
    /// transcript is in the main checkout's books, at the path its worktree's books would have).
    pub fn rel_transcript(&self, path: &Path) -> String {
        match path.strip_prefix(&self.transcripts) {
            Ok(tail) => self.rel(&self.ralph_dir.join(tail)),
            Err(_) => self.rel(path),
        }
    }
}

/// The books of `prd` in the repository at `repo_root`: `<root>/.ralph/` for `<root>/prd.json`
/// (and for a prd.json outside the repository), else `<root>/.ralph/books/<prd's path relative
/// to the root>/`. Symbolic links in either path are resolved before they are compared.
pub fn books_dir(repo_root: &Path, prd: &Path) -> PathBuf {
    let root = repo_root.join(RALPH_DIR);
    match prd_in_repo(repo_root, prd) {
        Some(rel) if rel != Path::new("prd.json") => root.join(BOOKS_DIR).join(rel),
        _ => root,
    }
}

/// `prd`'s path relative to `repo_root` (plain components only), when it is inside it.
fn prd_in_repo(repo_root: &Path, prd: &Path) -> Option<PathBuf> {
    let plain = |rel: &Path| {
        rel.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
            .then(|| rel.to_path_buf())
    };
    if let Some(rel) = prd.strip_prefix(repo_root).ok().and_then(plain) {
        return Some(rel);
    }
    // `/tmp/x` against `/private/tmp/x`, `a/../prd.json`, …: compare the resolved directories.
    let root = repo_root.canonicalize().ok()?;
    let dir = prd.parent().filter(|p| !p.as_os_str().is_empty())?;
    let resolved = dir.canonicalize().ok()?.join(prd.file_name()?);
    resolved.strip_prefix(&root).ok().and_then(plain)
}

/// Moves the books an older ralph kept in `.ralph/` for a prd.json in a folder into that PRD's
/// own books (`paths.ralph_dir`), once: only when they are this PRD's (no `prd.json` at the
/// repository root, and `.ralph/state.json` names `feature`, prd.json's `branchName`, as its
/// feature) and the PRD has no books of its own yet. Everything in `.ralph/` but its
/// `.gitignore` and `books/` moves (ledger, state, transcripts, snapshot, archive memory).
/// Returns how many entries moved (0: nothing to adopt).
///
/// # Errors
/// The I/O error of a move, naming both paths (entries already moved stay moved; the next run
/// moves the rest).
pub fn adopt_legacy_books(paths: &RunPaths, feature: Option<&str>) -> io::Result<usize> {
    let root = paths.repo_root.join(RALPH_DIR);
    let state_file = |d: &Path| d.join(crate::state::STATE_FILE);
    if paths.ralph_dir == root
        || paths.repo_root.join("prd.json").exists()
        || paths.ledger.exists()
        || state_file(&paths.ralph_dir).exists()
    {
        return Ok(0);
    }
    let Ok(text) = std::fs::read_to_string(state_file(&root)) else {
        return Ok(0);
    };
    // An older ralph still running there keeps its books where they are.
    let holder = std::fs::read_to_string(root.join(crate::lock::LOCK_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<crate::lock::LockInfo>(&t).ok());
    if holder.is_some_and(|h| Path::new(&format!("/proc/{}", h.pid)).exists()) {
        return Ok(0);
    }
    let owner = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("feature").and_then(|f| f.as_str()).map(str::to_owned));
    if owner.as_deref() != Some(feature.unwrap_or_default()) {
        return Ok(0);
    }
    std::fs::create_dir_all(&paths.ralph_dir)?;
    let mut moved = 0;
    for entry in std::fs::read_dir(&root)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".gitignore" || name == BOOKS_DIR {
            continue;
        }
        let to = paths.ralph_dir.join(&name);
        std::fs::rename(entry.path(), &to).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot move {} to {}: {e}",
                    entry.path().display(),
                    to.display()
                ),
            )
        })?;
        moved += 1;
    }
    Ok(moved)
}

/// The prd.json paths of the repository at `repo_root` that have books (a ledger or a
/// state.json), sorted: `<root>/prd.json` for `.ralph/` itself, `<root>/<path>` for
/// `.ralph/books/<path>/`. The prd.json files need not exist any more.
pub fn prds_with_books(repo_root: &Path) -> Vec<PathBuf> {
    let root = repo_root.join(RALPH_DIR);
    let has_books =
        |d: &Path| d.join(LEDGER_FILE).is_file() || d.join(crate::state::STATE_FILE).is_file();
    let mut found = Vec::new();
    if has_books(&root) {
        found.push(repo_root.join("prd.json"));
    }
    let books = root.join(BOOKS_DIR);
    let mut stack = vec![books.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if has_books(&path) {
                if let Ok(rel) = path.strip_prefix(&books) {
                    found.push(repo_root.join(rel));
                }
            } else if path
                .strip_prefix(&books)
                .map_or(0, |r| r.components().count())
                < 16
            {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The prd.json whose books a reader of history (`ralph log`, `ralph report`) shows: `arg`, or
/// the prd.json [`locate_prd`] finds, or, when there is none (the root of a repository whose
/// PRDs live in folders), the one PRD of the repository that has books.
///
/// # Errors
/// [`locate_prd`]'s error when no PRD has books either; a [`UserError`] listing the PRDs when
/// several have books and none was named.
pub fn locate_books(arg: Option<&Path>, cwd: &Path) -> Result<PathBuf, UserError> {
    let err = match locate_prd(arg, cwd) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    let Some(root) = crate::git::Repo::discover(cwd)
        .ok()
        .map(|r| r.root().to_path_buf())
    else {
        return Err(err);
    };
    let mut prds = prds_with_books(&root);
    match prds.len() {
        0 => Err(err),
        1 => Ok(prds.remove(0)),
        n => Err(UserError::new(format!(
            "no prd.json in {}, and {n} PRDs of this repository have books: {}",
            cwd.display(),
            prds.iter()
                .map(|p| display_rel(p, &root))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .with_hint(format!(
            "name one with --prd, e.g. --prd {}",
            display_rel(&prds[0], &root)
        ))),
    }
}

/// `path` relative to `base` when inside it (else as given), for display.
pub fn display_rel(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// Makes sure a PRD's books directory exists and that `.ralph/` (the books' enclosing
/// `.ralph/` when they are under `.ralph/books/`) ignores itself in git (transcripts can hold
/// secrets).
///
/// # Errors
/// The I/O error creating the directory or writing a `.gitignore`, naming the path.
pub fn ensure_ralph_dir(ralph_dir: &Path) -> io::Result<()> {
    if let Some(top) = ralph_dir
        .ancestors()
        .skip(1)
        .find(|a| a.file_name().is_some_and(|n| n == RALPH_DIR))
    {
        ignore_itself(top)?;
    }
    ignore_itself(ralph_dir)
}

/// Creates `dir` with a `.gitignore` of `*`.
fn ignore_itself(ralph_dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(ralph_dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot create {}: {e}", ralph_dir.display()),
        )
    })?;
    let ignore = ralph_dir.join(".gitignore");
    // Checked by content and written atomically: a ralph killed while writing it must not leave
    // an empty file that lets `.ralph/` show up as the user's uncommitted work.
    if std::fs::read(&ignore).ok().as_deref() != Some(b"*\n".as_slice()) {
        write_atomic(&ignore, b"*\n")?;
    }
    Ok(())
}

/// The prd.json a command works on: `arg` when given (relative to `cwd`), else `prd.json` in
/// `cwd` or the nearest parent directory that has one, looking no higher than the enclosing git
/// repository's root (the way git finds its repository), so `ralph status` works from any
/// subdirectory.
///
/// # Errors
/// A [`UserError`] naming where ralph looked and how to fix it, when no `arg` was given and no
/// prd.json was found. An `arg` that does not exist is returned as is, for the command to report.
pub fn locate_prd(arg: Option<&Path>, cwd: &Path) -> Result<PathBuf, UserError> {
    if let Some(p) = arg {
        let path = if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        };
        // A directory stands for the prd.json in it, when there is one.
        if path.is_dir() {
            let inside = path.join("prd.json");
            if inside.is_file() {
                return Ok(inside);
            }
            return Err(UserError::new(format!(
                "--prd {} is a directory with no prd.json in it",
                p.display()
            ))
            .with_hint("give the path of the prd.json file (e.g. --prd features/x/prd.json), or create one there with `ralph init --dir DIR`"));
        }
        return Ok(path);
    }
    let mut dir = Some(cwd);
    while let Some(d) = dir {
        let candidate = d.join("prd.json");
        if candidate.is_file() {
            return Ok(candidate);
        }
        if d.join(".git").exists() {
            return Err(not_found(cwd, Some(d)));
        }
        dir = d.parent();
    }
    Err(not_found(cwd, None))
}

fn not_found(cwd: &Path, root: Option<&Path>) -> UserError {
    let looked = match root {
        Some(root) if root != cwd => format!(
            "no prd.json in {} or its parent directories up to the repository root {}",
            cwd.display(),
            root.display()
        ),
        _ => format!("no prd.json in {}", cwd.display()),
    };
    UserError::new(looked).with_hint(
        "create one with `ralph init` (or `ralph init --dir DIR`), or name yours with --prd PATH",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prd_directory_means_its_prd_json_or_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let feature = dir.path().join("feature");
        std::fs::create_dir_all(&feature).unwrap();
        let err = locate_prd(Some(Path::new("feature")), dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("is a directory with no prd.json"), "{text}");
        std::fs::write(feature.join("prd.json"), "{}").unwrap();
        assert_eq!(
            locate_prd(Some(Path::new("feature")), dir.path()).unwrap(),
            feature.join("prd.json")
        );
    }

    #[test]
    fn prd_json_is_found_upward_but_not_above_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let sub = repo.join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        // Above the repository: never found from inside it.
        std::fs::write(dir.path().join("prd.json"), "{}").unwrap();
        let err = locate_prd(None, &sub).unwrap_err();
        assert!(
            err.to_string().contains("up to the repository root"),
            "{err}"
        );
        std::fs::write(repo.join("prd.json"), "{}").unwrap();
        assert_eq!(locate_prd(None, &sub).unwrap(), repo.join("prd.json"));
        assert_eq!(
            locate_prd(Some(Path::new("x/prd.json")), &sub).unwrap(),
            sub.join("x/prd.json")
        );
    }
}
