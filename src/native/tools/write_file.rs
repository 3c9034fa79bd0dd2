//! `write_file`: create or replace a whole file, atomically (a temporary file in the same
//! directory, renamed over the target), so an interrupted write never leaves half a file.

use std::io;
use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::paths::{resolve, Access};
use super::{summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "Create a file, or replace a file's whole content, with \
    exactly `content`. Missing parent directories are created. To change part of an existing \
    file, prefer edit_file.";

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the repository root."},
            "content": {"type": "string", "description": "The complete new content of the file."}
        },
        "required": ["path", "content"]
    })
}

/// `write_file` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub path: String,
    pub content: String,
}

/// Replaces `path` with `bytes` atomically: a temporary file in the same directory, synced, then
/// renamed over it. An existing file keeps its permission bits; a new one gets `0666` minus the
/// umask, like any file a program creates.
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming the temporary file.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    crate::fsutil::replace(path, bytes)
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let path = resolve(ctx, &args.path, Access::Write)?;
    let rel = &path.rel;
    if path.abs.is_dir() {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is a directory; give the path of a file inside it"
        )));
    }
    let created = !path.abs.exists();
    if let Some(parent) = path.abs.parent() {
        std::fs::create_dir_all(parent).map_err(|err| {
            ToolError::RespondToModel(format!("cannot create the directories for `{rel}`: {err}"))
        })?;
    }
    write_atomic(&path.abs, args.content.as_bytes())
        .map_err(|err| ToolError::RespondToModel(format!("cannot write `{rel}`: {err}")))?;
    let bytes = args.content.len();
    let lines = args.content.lines().count();
    let how = if created { "created" } else { "replaced" };
    Ok(ToolOutput {
        content: format!("Wrote {bytes} bytes ({lines} lines) to `{rel}` ({how})."),
        summary: summary(&format!("write_file {rel}: {bytes} bytes, {how}")),
    })
}
