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
    let unfenced = if is_markdown(rel) {
        None
    } else {
        strip_fence(&args.content)
    };
    let content = unfenced.as_deref().unwrap_or(&args.content);
    write_atomic(&path.abs, content.as_bytes())
        .map_err(|err| ToolError::RespondToModel(format!("cannot write `{rel}`: {err}")))?;
    let bytes = content.len();
    let lines = content.lines().count();
    let how = if created { "created" } else { "replaced" };
    let note = if unfenced.is_some() {
        " The ``` fence around the content was removed: give a file's text only."
    } else {
        ""
    };
    Ok(ToolOutput {
        content: format!("Wrote {bytes} bytes ({lines} lines) to `{rel}` ({how}).{note}"),
        summary: summary(&format!("write_file {rel}: {bytes} bytes, {how}")),
    })
}

/// Whether `rel` is a Markdown or reStructuredText file, where a ``` fence is content.
fn is_markdown(rel: &str) -> bool {
    let lower = rel.to_ascii_lowercase();
    [".md", ".markdown", ".mdx", ".rst"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// The inside of `content` when all of it is one Markdown code block (a first line of ``` and an
/// optional language word, a last line of ```, no other fence line), as small models write a
/// file's content; `None` otherwise.
fn strip_fence(content: &str) -> Option<String> {
    let trimmed = content.trim();
    let (first, rest) = trimmed.split_once('\n')?;
    let lang = first.trim_end().strip_prefix("```")?;
    if lang.contains(char::is_whitespace) || lang.contains('`') {
        return None;
    }
    let inner = rest.trim_end().strip_suffix("```")?;
    if inner
        .lines()
        .any(|line| line.trim_start().starts_with("```"))
    {
        return None;
    }
    let inner = inner.trim_end_matches([' ', '\t']);
    let mut text = inner.trim_end_matches('\n').to_string();
    text.push('\n');
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fenced_block_is_unwrapped_other_content_is_kept() {
        assert_eq!(
            strip_fence("```python\ndef add(a, b):\n    return a + b\n```").as_deref(),
            Some("def add(a, b):\n    return a + b\n")
        );
        assert_eq!(strip_fence("```\nhi\n```\n").as_deref(), Some("hi\n"));
        for kept in [
            "def f():\n    pass\n",
            "```python\na = 1\n```\ntext\n```\nb\n```",
            "```not a language\nx\n```",
            "```python\nno closing fence\n",
            "intro\n```\ncode\n```",
        ] {
            assert_eq!(strip_fence(kept), None, "{kept:?}");
        }
        assert!(is_markdown("docs/README.md") && is_markdown("a.RST"));
        assert!(!is_markdown("hello.py"));
    }
}
