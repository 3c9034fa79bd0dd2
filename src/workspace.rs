//! The files of one ralph workspace: prd.json, progress.txt beside it, and `.ralph/` at the
//! repository root with its state, ledger, transcripts, prompt copies, prd.json snapshot, lock
//! and stop request. Every path ralph reads or writes under `.ralph/` is named here, once.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::UserError;
use crate::fsutil::write_atomic;

/// The `.ralph` directory name, at the repository root.
pub const RALPH_DIR: &str = ".ralph";
/// The ledger's file name inside `.ralph/`.
pub const LEDGER_FILE: &str = "ledger.jsonl";
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
    /// `.ralph/` at the repository root.
    pub ralph_dir: PathBuf,
    /// `.ralph/ledger.jsonl`.
    pub ledger: PathBuf,
}

impl RunPaths {
    /// Derives every path from the repository root and prd.json.
    pub fn new(repo_root: &Path, prd: &Path) -> RunPaths {
        let ralph_dir = repo_root.join(RALPH_DIR);
        RunPaths {
            repo_root: repo_root.to_path_buf(),
            prd: prd.to_path_buf(),
            progress: prd.parent().unwrap_or(repo_root).join("progress.txt"),
            ledger: ralph_dir.join(LEDGER_FILE),
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

    /// An iteration's transcript: `.ralph/runs/<run>/iter-NNN.jsonl`.
    pub fn transcript(&self, run_id: &str, iteration: u32) -> PathBuf {
        self.ralph_dir.join(Self::transcript_rel(run_id, iteration))
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
}

/// `path` relative to `base` when inside it (else as given), for display.
pub fn display_rel(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// Makes sure `.ralph/` exists and ignores itself in git (transcripts can hold secrets).
///
/// # Errors
/// The I/O error creating the directory or writing its `.gitignore`, naming the path.
pub fn ensure_ralph_dir(ralph_dir: &Path) -> io::Result<()> {
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
