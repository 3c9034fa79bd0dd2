//! Confinement: every path a tool touches is inside the repository, and which files the listing
//! tools see.
//!
//! A path argument is relative to the repository root (an absolute path is accepted only when it
//! is inside). It is normalized lexically (`.` and `..` removed), then its longest existing
//! prefix is canonicalized, so a symlink anywhere on the way is followed *before* the check: a
//! link inside the repository pointing outside is refused for reading and writing alike. The
//! parts that do not exist yet cannot be links. The tools then operate on the resolved path, so
//! what is checked is what is used. Writes inside `.git` are refused: git's internals are not the
//! model's to edit.
//!
//! Listing and searching walk the repository with the `ignore` crate: `.gitignore`, `.ignore`
//! and `.git/info/exclude` are honoured (even outside a git work tree), ignore files above the
//! repository root are not read, hidden files are shown, and `.git` is skipped.

use std::io;
use std::ops::ControlFlow;
use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use ignore::WalkBuilder;

use super::{ToolContext, ToolError};

/// What the tool is going to do with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Read it (or list / search under it).
    Read,
    /// Create, replace or edit it: also refused inside `.git`.
    Write,
}

/// A path argument resolved inside the repository.
#[derive(Debug, Clone)]
pub(super) struct RepoPath {
    /// Absolute path with every existing symlink resolved.
    pub abs: PathBuf,
    /// Relative to the repository root, `/`-separated, `.` for the root itself: what the model is
    /// shown.
    pub rel: String,
}

/// The canonical repository root.
///
/// # Errors
/// [`ToolError::Fatal`] when the root cannot be resolved (it was removed or made unreadable).
pub(super) fn root(ctx: &ToolContext) -> Result<PathBuf, ToolError> {
    std::fs::canonicalize(&ctx.repo_root).map_err(|err| {
        ToolError::Fatal(format!(
            "the repository root {} is not accessible: {err}",
            ctx.repo_root.display()
        ))
    })
}

/// Resolves the path argument `arg` inside the repository (see the module doc).
///
/// # Errors
/// [`ToolError::RespondToModel`] when the path is outside the repository (directly, through `..`
/// or through a symlink), goes through a dangling symlink, cannot be examined, or (for
/// [`Access::Write`]) is inside `.git`; [`ToolError::Fatal`] when the root itself is gone.
pub(super) fn resolve(ctx: &ToolContext, arg: &str, access: Access) -> Result<RepoPath, ToolError> {
    let root = root(ctx)?;
    let arg = arg.trim();
    let arg = if arg.is_empty() { "." } else { arg };
    let outside = |shown: &Path| {
        ToolError::RespondToModel(format!(
            "path `{arg}` is outside the repository{}; use a path relative to the repository root",
            if shown == Path::new(arg) {
                String::new()
            } else {
                format!(" (it resolves to {})", shown.display())
            }
        ))
    };
    let lexical = normalize(&root.join(arg));

    // Find the longest prefix that exists (a dangling symlink counts as existing).
    let mut existing = lexical.as_path();
    let mut missing: Vec<&std::ffi::OsStr> = Vec::new();
    loop {
        match std::fs::symlink_metadata(existing) {
            Ok(_) => break,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
            Err(err) => {
                return Err(ToolError::RespondToModel(format!(
                    "cannot examine `{arg}`: {err}"
                )))
            }
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                existing = parent;
            }
            // `/` always exists; reaching here means the file system is unusable.
            _ => return Err(outside(&lexical)),
        }
    }
    let mut real = match std::fs::canonicalize(existing) {
        Ok(real) => real,
        Err(_) if is_symlink(existing) => {
            return Err(ToolError::RespondToModel(format!(
                "path `{arg}` goes through the symbolic link {}, whose target does not exist; \
                 ralph does not follow dangling links",
                existing.display()
            )))
        }
        Err(err) => {
            return Err(ToolError::RespondToModel(format!(
                "cannot resolve `{arg}`: {err}"
            )))
        }
    };
    real.extend(missing.iter().rev());
    let Ok(inside) = real.strip_prefix(&root) else {
        return Err(outside(&real));
    };
    if access == Access::Write && inside.components().any(|c| c.as_os_str() == ".git") {
        return Err(ToolError::RespondToModel(format!(
            "path `{arg}` is inside .git; git's internals cannot be written (use git commands \
             through run_command instead)"
        )));
    }
    let rel = display_rel(inside);
    Ok(RepoPath { abs: real, rel })
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Removes `.` and resolves `..` textually (`..` at `/` stays at `/`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `rel` as shown to the model: `/`-separated, `.` when empty.
pub(super) fn display_rel(rel: &Path) -> String {
    let text = rel.to_string_lossy();
    if text.is_empty() {
        ".".to_string()
    } else {
        text.into_owned()
    }
}

/// A file-name glob as the listing tools take it: a pattern without `/` matches file names at
/// any depth (`*.rs`); one with `/` matches the path relative to the directory walked
/// (`src/**/*.rs`), where `*` stays within one directory and `**` crosses them.
#[derive(Debug, Clone)]
pub(super) struct FileGlob {
    matcher: GlobMatcher,
    names_only: bool,
}

impl FileGlob {
    /// Compiles `pattern` (a leading `./` or `/` is ignored).
    ///
    /// # Errors
    /// [`ToolError::RespondToModel`] naming the pattern and the syntax problem.
    pub(super) fn new(pattern: &str) -> Result<FileGlob, ToolError> {
        let trimmed = pattern.trim();
        let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
        let trimmed = trimmed.trim_start_matches('/');
        let glob = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .build()
            .map_err(|err| {
                ToolError::RespondToModel(format!(
                    "invalid glob `{pattern}`: {}; use `*` within a name, `**` across \
                     directories, `{{a,b}}` for alternatives",
                    err.kind()
                ))
            })?;
        Ok(FileGlob {
            matcher: glob.compile_matcher(),
            names_only: !trimmed.contains('/'),
        })
    }

    /// Whether the file at `rel_to_base` (relative to the directory walked) matches.
    pub(super) fn is_match(&self, rel_to_base: &Path) -> bool {
        if self.names_only {
            rel_to_base
                .file_name()
                .is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(rel_to_base)
        }
    }
}

/// One file met by [`walk_files`].
pub(super) struct Visit<'a> {
    /// Absolute path (not resolved: it may be a symlink).
    pub abs: &'a Path,
    /// Relative to the repository root, for display.
    pub rel: String,
    /// Relative to the directory walked, for glob matching.
    pub rel_to_base: &'a Path,
    /// Whether the entry is a symbolic link (its target may be outside the repository).
    pub is_symlink: bool,
}

/// Calls `each` for every file (and symlink) under `base` that the ignore rules let through, in
/// a stable order (sorted by name within each directory). Unreadable directories are skipped.
/// The walk starts at the repository root so that the root's ignore files apply to a
/// subdirectory too, and prunes everything not on the way to `base`.
///
/// # Errors
/// [`ToolError::Fatal`] when the session was asked to stop meanwhile.
pub(super) fn walk_files(
    root: &Path,
    base: &Path,
    ctx: &ToolContext,
    mut each: impl FnMut(Visit<'_>) -> ControlFlow<()>,
) -> Result<(), ToolError> {
    let prune_base = base.to_path_buf();
    let walker = WalkBuilder::new(root)
        .hidden(false)
        .parents(false)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(std::cmp::Ord::cmp)
        .filter_entry(move |entry| {
            let path = entry.path();
            entry.file_name() != ".git"
                && (path.starts_with(&prune_base) || prune_base.starts_with(path))
        })
        .build();
    for entry in walker {
        if ctx.stop.stop.is_cancelled() || ctx.stop.kill_now.is_cancelled() {
            return Err(ToolError::Fatal(
                "stopped while walking the repository: ralph is shutting down".into(),
            ));
        }
        let Ok(entry) = entry else { continue };
        let Some(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            continue;
        }
        let abs = entry.path();
        let (Ok(rel), Ok(rel_to_base)) = (abs.strip_prefix(root), abs.strip_prefix(base)) else {
            continue;
        };
        let visit = Visit {
            abs,
            rel: display_rel(rel),
            rel_to_base: if rel_to_base.as_os_str().is_empty() {
                // `base` is the file itself: match its name.
                Path::new(abs.file_name().unwrap_or_default())
            } else {
                rel_to_base
            },
            is_symlink: kind.is_symlink(),
        };
        if each(visit).is_break() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(root: &Path) -> ToolContext {
        ToolContext::new(
            std::fs::canonicalize(root).unwrap(),
            root.join("prd.json"),
            root.join("progress.txt"),
        )
    }

    fn refused(result: Result<RepoPath, ToolError>) -> String {
        match result {
            Err(ToolError::RespondToModel(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn relative_and_inside_absolute_paths_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx(dir.path());
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let p = resolve(&ctx, "src/./new/../main.rs", Access::Write).unwrap();
        assert_eq!(p.rel, "src/main.rs");
        assert_eq!(p.abs, ctx.repo_root.join("src/main.rs"));
        let abs = ctx.repo_root.join("src/x/y.rs");
        assert_eq!(
            resolve(&ctx, abs.to_str().unwrap(), Access::Read)
                .unwrap()
                .rel,
            "src/x/y.rs"
        );
        assert_eq!(resolve(&ctx, "", Access::Read).unwrap().rel, ".");
    }

    #[test]
    fn escapes_and_git_writes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx(dir.path());
        let message = refused(resolve(&ctx, "a/../../x", Access::Read));
        assert!(message.contains("outside the repository"), "{message}");
        refused(resolve(&ctx, "/etc/passwd", Access::Read));
        std::os::unix::fs::symlink("/nonexistent/target", dir.path().join("dangling")).unwrap();
        let message = refused(resolve(&ctx, "dangling/x", Access::Write));
        assert!(message.contains("dangling"), "{message}");
        let message = refused(resolve(&ctx, ".git/config", Access::Write));
        assert!(message.contains(".git"), "{message}");
        assert!(resolve(&ctx, ".git/config", Access::Read).is_ok());
    }

    #[test]
    fn globs_without_a_slash_match_names_at_any_depth() {
        let glob = FileGlob::new("*.rs").unwrap();
        assert!(glob.is_match(Path::new("a/b/c.rs")));
        assert!(!glob.is_match(Path::new("a/b/c.txt")));
        let glob = FileGlob::new("./src/*.rs").unwrap();
        assert!(glob.is_match(Path::new("src/c.rs")));
        assert!(!glob.is_match(Path::new("src/a/c.rs")));
        assert!(FileGlob::new("**/*").unwrap().is_match(Path::new("x/y")));
        assert!(FileGlob::new("a[").is_err());
    }
}
