//! `search`: a regular expression over the contents of the repository's files (`.gitignore`
//! honoured), reported as `path:line: text`, capped so a broad pattern cannot flood the context.

use std::fmt::Write as _;
use std::ops::ControlFlow;

use regex::bytes::RegexBuilder;
use serde::Deserialize;
use serde_json::{json, Value};

use super::paths::{resolve, root, walk_files, Access, FileGlob};
use super::read_file::looks_binary;
use super::{summary, ToolContext, ToolError, ToolOutput};

pub(super) const DESCRIPTION: &str = "Search the contents of the repository's files (not \
    ignored by .gitignore) for a regular expression (Rust regex syntax; escape `( ) [ ] { } . * \
    + ? |` with `\\` to match them literally), line by line. Returns `path:line: text` lines, at \
    most 200 matches. `path` limits the search to a directory or file; `glob` filters files like \
    list_files' pattern (`*.rs`).";

/// Most matches reported.
const MAX_MATCHES: usize = 200;
/// Longest line shown, in characters.
const MAX_LINE_CHARS: usize = 300;
/// Files larger than this are skipped (logs, data dumps): 4 MiB.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Compiled-regex size limit: a pathological pattern is refused rather than eating memory.
const REGEX_SIZE_LIMIT: usize = 10 * 1024 * 1024;

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression to find in each line."},
            "path": {"type": "string", "description": "Directory or file to search, relative to the repository root (default: the root)."},
            "glob": {"type": "string", "description": "Only search files matching this glob, e.g. `*.rs`."}
        },
        "required": ["pattern"]
    })
}

/// `search` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub pattern: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub glob: Option<String>,
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let regex = RegexBuilder::new(&args.pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|err| {
            ToolError::RespondToModel(format!(
                "invalid regular expression `{}`: {err}\nEscape special characters with `\\` \
                 to match them literally, e.g. `fn main\\(`.",
                args.pattern
            ))
        })?;
    let root = root(ctx)?;
    let base = resolve(ctx, args.path.as_deref().unwrap_or("."), Access::Read)?;
    if !base.abs.exists() {
        return Err(ToolError::RespondToModel(format!(
            "`{}` does not exist; give a directory or file inside the repository",
            base.rel
        )));
    }
    let glob = match args.glob.as_deref().map(str::trim) {
        Some(pattern) if !pattern.is_empty() => Some(FileGlob::new(pattern)?),
        _ => None,
    };

    let mut content = String::new();
    let mut matches = 0usize;
    let mut files_with_matches = 0usize;
    let mut skipped = 0usize;
    let mut full = false;
    walk_files(&root, &base.abs, ctx, |visit| {
        if glob
            .as_ref()
            .is_some_and(|g| !g.is_match(visit.rel_to_base))
        {
            return ControlFlow::Continue(());
        }
        // A link may point outside the repository; the file it names, if inside, is searched
        // under its own path.
        if visit.is_symlink {
            return ControlFlow::Continue(());
        }
        let readable = std::fs::metadata(visit.abs).is_ok_and(|m| m.len() <= MAX_FILE_BYTES);
        let bytes = match readable.then(|| std::fs::read(visit.abs)) {
            Some(Ok(bytes)) => bytes,
            _ => {
                skipped += 1;
                return ControlFlow::Continue(());
            }
        };
        if looks_binary(&bytes) || !regex.is_match(&bytes) {
            return ControlFlow::Continue(());
        }
        // A final newline ends the last line rather than starting an empty one.
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        let mut counted = false;
        for (index, line) in body.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !regex.is_match(line) {
                continue;
            }
            let text = String::from_utf8_lossy(line);
            let text = text.trim_end();
            let text: String = if text.chars().count() > MAX_LINE_CHARS {
                let mut cut: String = text.chars().take(MAX_LINE_CHARS).collect();
                cut.push('…');
                cut
            } else {
                text.to_string()
            };
            let row = format!("{}:{}: {text}\n", visit.rel, index + 1);
            if matches == MAX_MATCHES || content.len() + row.len() > ctx.max_output_bytes {
                full = true;
                return ControlFlow::Break(());
            }
            content.push_str(&row);
            matches += 1;
            if !counted {
                counted = true;
                files_with_matches += 1;
            }
        }
        ControlFlow::Continue(())
    })?;

    let place = if base.rel == "." {
        String::new()
    } else {
        format!(" in `{}`", base.rel)
    };
    let skipped_note = if skipped > 0 {
        format!(" ({skipped} unreadable or larger than 4 MiB skipped)")
    } else {
        String::new()
    };
    if matches == 0 {
        return Ok(ToolOutput {
            content: format!("No matches for `{}`{place}{skipped_note}.", args.pattern),
            summary: summary(&format!("search `{}`{place}: no matches", args.pattern)),
        });
    }
    if full {
        let _ = write!(
            content,
            "[stopped after {matches} matches; narrow `pattern`, `path` or `glob` to see the \
             rest]"
        );
    } else {
        let _ = write!(
            content,
            "[{matches} matches in {files_with_matches} files{skipped_note}]"
        );
    }
    Ok(ToolOutput {
        content,
        summary: summary(&format!(
            "search `{}`{place}: {matches}{} matches",
            args.pattern,
            if full { "+" } else { "" }
        )),
    })
}
