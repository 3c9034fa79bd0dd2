//! `list_files`: the repository's files matching a glob, as the model would see them in git
//! (`.gitignore` honoured, `.git` skipped), sorted and capped.

use std::fmt::Write as _;
use std::ops::ControlFlow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::paths::{resolve, root, walk_files, Access, FileGlob};
use super::{summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "List the repository's files (not ignored by .gitignore), \
    sorted, at most 500. `pattern` is a glob: without `/` it matches file names at any depth \
    (`*.rs`); with `/` it matches paths under `path` (`src/**/*.rs`). Paths are shown relative to \
    the repository root.";

/// Most entries listed.
const MAX_ENTRIES: usize = 500;

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob to match (default `**/*`, every file)."},
            "path": {"type": "string", "description": "Directory to list, relative to the repository root (default: the root)."}
        },
        "required": []
    })
}

/// `list_files` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    #[serde(default)]
    pub pattern: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let root = root(ctx)?;
    let base = resolve(ctx, args.path.as_deref().unwrap_or("."), Access::Read)?;
    let pattern = args
        .pattern
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .unwrap_or("**/*");
    let glob = FileGlob::new(pattern)?;
    match std::fs::metadata(&base.abs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ToolError::RespondToModel(format!(
                "`{}` is a file, not a directory; give a directory as `path`",
                base.rel
            )))
        }
        Err(_) => {
            return Err(ToolError::RespondToModel(format!(
                "directory `{}` does not exist",
                base.rel
            )))
        }
    }

    let mut found = Vec::new();
    walk_files(&root, &base.abs, ctx, |visit| {
        if glob.is_match(visit.rel_to_base) {
            found.push(visit.rel);
        }
        ControlFlow::Continue(())
    })?;
    found.sort();
    let total = found.len();
    let place = if base.rel == "." {
        String::new()
    } else {
        format!(" under `{}`", base.rel)
    };
    if total == 0 {
        return Ok(ToolOutput {
            content: format!(
                "No files match `{pattern}`{place} (files ignored by .gitignore are not listed)."
            ),
            summary: summary(&format!("list_files {pattern}{place}: none")),
        });
    }
    let mut content = String::new();
    let mut shown = 0;
    for path in &found {
        if shown == MAX_ENTRIES || content.len() + path.len() + 1 > ctx.max_output_bytes {
            break;
        }
        content.push_str(path);
        content.push('\n');
        shown += 1;
    }
    if shown < total {
        let _ = write!(
            content,
            "[{shown} of {total} files shown; narrow `pattern` or `path` to see the rest]"
        );
    } else {
        let _ = write!(content, "[{total} files]");
    }
    Ok(ToolOutput {
        content,
        summary: summary(&format!("list_files {pattern}{place}: {total} files")),
    })
}
