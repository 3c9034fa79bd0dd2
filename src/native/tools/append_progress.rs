//! `append_progress`: ralph's own tool for adding to progress.txt, the memory the next
//! iterations read. It only appends (opened in append mode); earlier content is never rewritten.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "Append a note to progress.txt, the log later iterations \
    read: what you did, what you learned about the codebase, what is left. Earlier content is \
    kept as it is.";

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "The note to append (plain text or Markdown)."}
        },
        "required": ["text"]
    })
}

/// `append_progress` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub text: String,
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let text = args.text.trim_end();
    if text.trim().is_empty() {
        return Err(ToolError::RespondToModel(
            "text is empty; give the note to append".into(),
        ));
    }
    let path = &ctx.progress_path;
    let shown = path.display();
    let fail = |what: &str, err: std::io::Error| {
        ToolError::Fatal(format!("append_progress cannot {what} {shown}: {err}"))
    };
    // A missing file gets the standard header first, as ralph creates it.
    crate::progress::ensure_exists(path, chrono::Local::now())
        .map_err(|err| ToolError::Fatal(format!("append_progress: {err}")))?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(|err| fail("open", err))?;
    // Start on a fresh line even when the last writer left none.
    let len = file.metadata().map_err(|err| fail("inspect", err))?.len();
    let mut last = [0u8; 1];
    if len > 0 {
        file.seek(SeekFrom::Start(len - 1))
            .and_then(|_| file.read_exact(&mut last))
            .map_err(|err| fail("read", err))?;
    }
    let mut block = String::new();
    if len > 0 && last[0] != b'\n' {
        block.push('\n');
    }
    block.push_str(text);
    block.push('\n');
    file.write_all(block.as_bytes())
        .and_then(|()| file.sync_data())
        .map_err(|err| fail("append to", err))?;
    let lines = text.lines().count();
    Ok(ToolOutput {
        content: format!("Appended {lines} lines to progress.txt."),
        summary: summary(&format!("append_progress: {lines} lines")),
    })
}
