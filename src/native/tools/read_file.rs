//! `read_file`: a window of a text file, with line numbers, so the model can quote exact text
//! back in `edit_file` and page through long files with `offset`.

use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::{json, Value};

use super::paths::{resolve, Access};
use super::{lenient, summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "Read a text file of the repository. Shows up to `limit` \
    lines starting at line `offset`, each prefixed with its 1-based line number and a tab \
    (`   12\\t...`; the prefix is not part of the file), then how many lines the file has. Use \
    `offset` to read on in a long file.";

/// Lines shown when the model gives no `limit`.
const DEFAULT_LIMIT: u64 = 400;
/// Longest line shown, in characters; longer lines are cut (minified files).
const MAX_LINE_CHARS: usize = 2000;
/// Files larger than this are not read: 32 MiB.
const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// How much of the start of a file is checked for NUL bytes to call it binary (as git does).
pub(super) const BINARY_SNIFF_BYTES: usize = 8000;

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the repository root."},
            "offset": {"type": "integer", "description": "First line to show, 1-based (default 1)."},
            "limit": {"type": "integer", "description": "How many lines to show (default 400)."}
        },
        "required": ["path"]
    })
}

/// `read_file` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub path: String,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub offset: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub limit: Option<u64>,
}

/// Whether `bytes` (the start of a file) look binary: a NUL byte in the first 8000 bytes.
pub(super) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0)
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let path = resolve(ctx, &args.path, Access::Read)?;
    let rel = &path.rel;
    let meta = std::fs::metadata(&path.abs).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => ToolError::RespondToModel(format!(
            "file `{rel}` does not exist; use list_files to see which files exist"
        )),
        _ => ToolError::RespondToModel(format!("cannot read `{rel}`: {err}")),
    })?;
    if meta.is_dir() {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is a directory; use list_files with path `{rel}` to see its files"
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is too large to read ({} bytes); use search to find the part you need, or \
             run_command with `sed -n 'A,Bp'`",
            meta.len()
        )));
    }
    let bytes = std::fs::read(&path.abs)
        .map_err(|err| ToolError::RespondToModel(format!("cannot read `{rel}`: {err}")))?;
    if looks_binary(&bytes) {
        return Err(ToolError::RespondToModel(format!(
            "`{rel}` is a binary file ({} bytes); read_file shows text files only",
            bytes.len()
        )));
    }
    let text = String::from_utf8_lossy(&bytes);
    let crlf = text.contains("\r\n");
    // A final newline ends the last line rather than starting an empty one.
    let body = text.strip_suffix('\n').unwrap_or(&text);
    let lines: Vec<&str> = if text.is_empty() {
        Vec::new()
    } else {
        body.split('\n').collect()
    };
    let total = lines.len();
    if total == 0 {
        return Ok(ToolOutput {
            content: format!("[`{rel}` is empty]"),
            summary: summary(&format!("read_file {rel}: empty")),
        });
    }

    let offset = args.offset.unwrap_or(1).max(1);
    let first = usize::try_from(offset).unwrap_or(usize::MAX);
    if first > total {
        return Err(ToolError::RespondToModel(format!(
            "offset {offset} is past the end of `{rel}`, which has {total} lines"
        )));
    }
    let limit = usize::try_from(args.limit.unwrap_or(DEFAULT_LIMIT).max(1)).unwrap_or(usize::MAX);
    let wanted_last = first.saturating_add(limit - 1).min(total);

    let mut content = String::new();
    let mut last = first - 1;
    let mut cut_by_size = false;
    for (number, line) in lines[first - 1..wanted_last].iter().enumerate() {
        let number = first + number;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut row = String::new();
        if line.chars().count() > MAX_LINE_CHARS {
            let head: String = line.chars().take(MAX_LINE_CHARS).collect();
            let _ = writeln!(
                row,
                "{number:>5}\t{head}… [line cut: {} characters]",
                line.chars().count()
            );
        } else {
            let _ = writeln!(row, "{number:>5}\t{line}");
        }
        // Always show at least one line, so paging makes progress.
        if last >= first && content.len() + row.len() > ctx.max_output_bytes {
            cut_by_size = true;
            break;
        }
        content.push_str(&row);
        last = number;
    }

    let endings = if crlf { "; CRLF line endings" } else { "" };
    let note = if last == total && first == 1 {
        format!("[end of file: {total} lines{endings}]")
    } else if last == total {
        format!("[lines {first}-{last} of {total}; end of file{endings}]")
    } else {
        let why = if cut_by_size {
            format!(" (output limit of {} bytes)", ctx.max_output_bytes)
        } else {
            String::new()
        };
        format!(
            "[lines {first}-{last} of {total}{why}; read on with offset={}{endings}]",
            last + 1
        )
    };
    content.push_str(&note);
    Ok(ToolOutput {
        content,
        summary: summary(&format!("read_file {rel}: lines {first}-{last} of {total}")),
    })
}
