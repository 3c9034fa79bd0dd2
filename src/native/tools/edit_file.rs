//! `edit_file`: exact string replacement. The text to replace must occur exactly once (unless
//! `replace_all`), so an edit never lands somewhere the model did not look; every failure says
//! how many places matched and what to do next.

use serde::Deserialize;
use serde_json::{json, Value};

use super::paths::{resolve, Access};
use super::read_file::looks_binary;
use super::write_file::write_atomic;
use super::{lenient, summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "Replace exact text in an existing file. `old_string` must \
    match the file exactly, whitespace and indentation included (without read_file's line-number \
    prefix), and occur exactly once; include enough surrounding lines to make it unique, or set \
    `replace_all` to replace every occurrence. To create a file, use write_file.";

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the repository root."},
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one (default false)."}
        },
        "required": ["path", "old_string", "new_string"]
    })
}

/// `edit_file` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default, deserialize_with = "lenient::bool_or_null")]
    pub replace_all: bool,
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let path = resolve(ctx, &args.path, Access::Write)?;
    let rel = &path.rel;
    if args.old_string.is_empty() {
        return Err(ToolError::RespondToModel(
            "old_string is empty; give the exact text to replace (to create or overwrite a \
             whole file, use write_file)"
                .into(),
        ));
    }
    if args.old_string == args.new_string {
        return Err(ToolError::RespondToModel(
            "old_string and new_string are identical, so there is nothing to change".into(),
        ));
    }
    let bytes = match std::fs::read(&path.abs) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(ToolError::RespondToModel(format!(
                "file `{rel}` does not exist; create it with write_file"
            )))
        }
        Err(err) => {
            return Err(ToolError::RespondToModel(format!(
                "cannot read `{rel}`: {err}"
            )))
        }
    };
    if looks_binary(&bytes) {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is a binary file; edit_file changes text files only"
        )));
    }
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is not valid UTF-8, so it cannot be edited by text; use write_file to \
             replace it"
        )));
    };

    let (mut old, mut new) = (args.old_string.clone(), args.new_string.clone());
    let mut count = text.matches(&old).count();
    // read_file shows CRLF files without the `\r`: text copied from it still matches.
    if count == 0 && text.contains("\r\n") && old.contains('\n') && !old.contains('\r') {
        let crlf_old = old.replace('\n', "\r\n");
        let crlf_count = text.matches(&crlf_old).count();
        if crlf_count > 0 {
            old = crlf_old;
            new = new.replace("\r\n", "\n").replace('\n', "\r\n");
            count = crlf_count;
        }
    }
    if count == 0 {
        return Err(ToolError::RespondToModel(format!(
            "old_string was not found in `{rel}`; it must match the file exactly, whitespace and \
             indentation included. Read the file with read_file and copy the text without the \
             line-number prefix."
        )));
    }
    if count > 1 && !args.replace_all {
        return Err(ToolError::RespondToModel(format!(
            "old_string matches {count} places in `{rel}`; include more surrounding lines so it \
             matches exactly one, or set replace_all to true to replace all {count}"
        )));
    }
    let first_line = text
        .find(&old)
        .map_or(1, |at| text[..at].matches('\n').count() + 1);
    let edited = if args.replace_all {
        text.replace(&old, &new)
    } else {
        text.replacen(&old, &new, 1)
    };
    write_atomic(&path.abs, edited.as_bytes())
        .map_err(|err| ToolError::RespondToModel(format!("cannot write `{rel}`: {err}")))?;
    let what = if count == 1 {
        format!("1 occurrence at line {first_line}")
    } else {
        format!("{count} occurrences, the first at line {first_line}")
    };
    Ok(ToolOutput {
        content: format!("Edited `{rel}`: replaced {what}."),
        summary: summary(&format!("edit_file {rel}: replaced {what}")),
    })
}
