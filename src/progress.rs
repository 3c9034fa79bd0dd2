//! `progress.txt`: the run's human-readable, append-only memory, shared by the agent and ralph.
//!
//! The layout is the original Ralph's (snarktank/ralph, as its `ralph.sh` and prompt build it):
//! a `# Ralph Progress Log` header with a `Started:` line and `---`, a `## Codebase Patterns`
//! section near the top that the agent curates with reusable learnings, then one `## ...` block
//! per iteration ending in `---`. ralph adds its own short block per iteration (time, iteration,
//! story, outcome, commit) and never rewrites earlier content.
//!
//! The file grows without bound, so prompts get an [`excerpt`]: the Codebase Patterns section
//! (the most valuable part, kept even when the file is large) plus as much of the newest
//! content as fits.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Local};

use crate::protocol::Outcome;

/// The heading of the section the agent keeps its reusable learnings in.
pub const PATTERNS_HEADING: &str = "## Codebase Patterns";

/// How timestamps are written (local time, with the UTC offset so logs from different machines
/// compare).
const TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S %:z";

/// Errors reading or writing progress.txt. Each names the file.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}", path.display())]
pub struct ProgressError {
    /// What ralph was doing, e.g. `append to`.
    pub action: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: std::io::Error,
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ProgressError {
    let path = path.to_path_buf();
    move |source| ProgressError {
        action,
        path,
        source,
    }
}

/// The content of a new progress.txt: the header, `Started: <now>`, `---`, and an empty
/// `## Codebase Patterns` section for the agent to fill.
pub fn initial_contents(now: DateTime<Local>) -> String {
    format!(
        "# Ralph Progress Log\nStarted: {}\n---\n\n{PATTERNS_HEADING}\n\n",
        now.format(TIME_FORMAT)
    )
}

/// Creates `path` with [`initial_contents`] when it does not exist (the parent directory must
/// exist). Returns whether it was created; an existing file is left untouched.
///
/// # Errors
/// [`ProgressError`] naming the file.
pub fn ensure_exists(path: &Path, now: DateTime<Local>) -> Result<bool, ProgressError> {
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut file) => {
            file.write_all(initial_contents(now).as_bytes())
                .map_err(io_error("write", path))?;
            Ok(true)
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(ProgressError {
            action: "create",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// ralph's own record of one iteration in progress.txt.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// When the iteration ended (local time).
    pub at: DateTime<Local>,
    /// Iteration number.
    pub iteration: u32,
    /// Story id, e.g. `US-001`.
    pub story_id: String,
    /// Story title.
    pub story_title: String,
    /// How the iteration ended.
    pub outcome: Outcome,
    /// Full sha of the commit that holds the iteration's work, if any (shown abbreviated).
    pub commit: Option<String>,
    /// One or a few lines saying what happened (e.g. the error, or what flipped).
    pub summary: String,
}

impl Entry {
    /// The block appended for this entry:
    ///
    /// ```text
    /// ## 2025-01-31 14:05:09 +01:00 - US-001: Add login (ralph, iteration 3)
    /// - Outcome: story_passed
    /// - Agent commit: 1a2b3c4d5e6f
    /// - Summary: first line
    ///   further lines, indented
    /// ---
    /// ```
    pub fn render(&self) -> String {
        let one_line = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
        let commit = match &self.commit {
            Some(sha) => sha.chars().take(12).collect(),
            None => "none (ralph checkpoints the changes)".to_owned(),
        };
        // Continuation lines are indented so nothing in a summary can pose as a heading.
        let summary = self
            .summary
            .trim()
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n  ");
        let summary = if summary.is_empty() {
            "-".to_owned()
        } else {
            summary
        };
        format!(
            "## {} - {}: {} (ralph, iteration {})\n- Outcome: {}\n- Agent commit: {}\n- Summary: {}\n---\n",
            self.at.format(TIME_FORMAT),
            one_line(&self.story_id),
            one_line(&self.story_title),
            self.iteration,
            self.outcome,
            commit,
            summary,
        )
    }
}

/// Appends `entry` (see [`Entry::render`]) after a blank line, creating the file with its header
/// first when missing. Earlier content is never rewritten; a missing final newline is added.
///
/// # Errors
/// [`ProgressError`] naming the file.
pub fn append_entry(path: &Path, entry: &Entry) -> Result<(), ProgressError> {
    ensure_exists(path, entry.at)?;
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_error("open", path))?;
    let len = file.metadata().map_err(io_error("read", path))?.len();
    let mut text = String::new();
    if len > 0 {
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(len - 1))
            .and_then(|_| file.read_exact(&mut last))
            .map_err(io_error("read", path))?;
        if last[0] != b'\n' {
            text.push('\n');
        }
        text.push('\n');
    }
    text.push_str(&entry.render());
    // One write(2) and no fsync: the checkpoint commit that follows carries the entry, and the
    // ledger line after it is the iteration's durable commit point (docs/durability.md).
    file.write_all(text.as_bytes())
        .map_err(io_error("append to", path))?;
    Ok(())
}

/// A prompt-sized view of progress.txt, at most about `max_bytes` bytes (plus short markers).
///
/// When the whole file fits it is returned as is. Otherwise the result is the
/// `## Codebase Patterns` section (always kept; if it alone is larger than three quarters of
/// `max_bytes` it is cut at a line boundary with a marker) followed by a
/// `[… N earlier bytes omitted …]` marker and the newest part of the rest of the file that fits,
/// starting at an entry heading (`## `) when one fits, else at a line boundary. A missing file
/// gives an empty string. Invalid UTF-8 is replaced, not an error.
///
/// # Errors
/// [`ProgressError`] when the file exists but cannot be read.
pub fn excerpt(path: &Path, max_bytes: usize) -> Result<String, ProgressError> {
    let mut bytes = Vec::new();
    match fs::File::open(path) {
        Ok(mut file) => file
            .read_to_end(&mut bytes)
            .map_err(io_error("read", path))?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(source) => {
            return Err(ProgressError {
                action: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(excerpt_of(&text, max_bytes))
}

/// [`excerpt`] on text already in memory.
fn excerpt_of(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let (patterns, rest) = match patterns_section(text) {
        Some((start, end)) => {
            let cap = max_bytes / 4 * 3;
            let section = &text[start..end];
            let kept = if section.len() <= cap {
                section.trim_end().to_owned() + "\n"
            } else {
                let cut = floor_line(section, cap);
                format!(
                    "{}\n[… {} more bytes of Codebase Patterns omitted …]\n",
                    section[..cut].trim_end(),
                    section.len() - cut
                )
            };
            (kept, &text[end..])
        }
        None => (String::new(), text),
    };
    let budget = max_bytes.saturating_sub(patterns.len());
    let tail_start = tail_start(rest, budget);
    let omitted = text.len() - patterns_len_in(text) - (rest.len() - tail_start);
    let mut out = patterns;
    if !out.is_empty() {
        out.push('\n');
    }
    if omitted > 0 {
        out.push_str(&format!("[… {omitted} earlier bytes omitted …]\n"));
    }
    out.push_str(&rest[tail_start..]);
    out
}

/// Byte length of the Codebase Patterns section in `text` (0 when absent).
fn patterns_len_in(text: &str) -> usize {
    patterns_section(text).map_or(0, |(start, end)| end - start)
}

/// Byte range of the Codebase Patterns section: from its heading line up to the next `## `
/// heading (or the end of the text).
fn patterns_section(text: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    let mut start = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        match start {
            None if trimmed.eq_ignore_ascii_case(PATTERNS_HEADING) => start = Some(offset),
            Some(begin) if trimmed.starts_with("## ") => return Some((begin, offset)),
            _ => {}
        }
        offset += line.len();
    }
    start.map(|begin| (begin, text.len()))
}

/// Where the newest `budget` bytes of `text` start, moved forward to an entry heading if one
/// lies in that window, else to a line start, else to a character boundary.
fn tail_start(text: &str, budget: usize) -> usize {
    if text.len() <= budget {
        return 0;
    }
    let mut start = text.len() - budget;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let window = &text[start..];
    let at_line_start = start == 0 || text.as_bytes()[start - 1] == b'\n';
    if at_line_start && window.starts_with("## ") {
        return start;
    }
    if let Some(pos) = window.find("\n## ") {
        return start + pos + 1;
    }
    if at_line_start {
        return start;
    }
    match window.find('\n') {
        Some(pos) if pos + 1 < window.len() => start + pos + 1,
        _ => start,
    }
}

/// The largest line boundary at or below `cap` in `text` (a character boundary when the first
/// line is already longer than `cap`).
fn floor_line(text: &str, cap: usize) -> usize {
    let mut cut = cap.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    match text[..cut].rfind('\n') {
        Some(pos) => pos + 1,
        None => cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at() -> DateTime<Local> {
        Local.with_ymd_and_hms(2025, 1, 31, 14, 5, 9).unwrap()
    }

    fn entry(iteration: u32, summary: &str) -> Entry {
        Entry {
            at: at(),
            iteration,
            story_id: "US-001".into(),
            story_title: "Add\nlogin".into(),
            outcome: Outcome::StoryPassed,
            commit: Some("0123456789abcdef0123".into()),
            summary: summary.into(),
        }
    }

    #[test]
    fn initial_contents_has_the_original_header() {
        let text = initial_contents(at());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# Ralph Progress Log");
        assert!(
            lines[1].starts_with("Started: 2025-01-31 14:05:09 "),
            "{text}"
        );
        assert_eq!(lines[2], "---");
        assert!(lines.contains(&PATTERNS_HEADING));
    }

    #[test]
    fn entry_renders_one_short_block() {
        let block = entry(3, "did it\n## not a heading").render();
        assert!(
            block.contains(" - US-001: Add login (ralph, iteration 3)\n"),
            "{block}"
        );
        assert!(block.contains("- Outcome: story_passed\n"), "{block}");
        assert!(block.contains("- Agent commit: 0123456789ab\n"), "{block}");
        assert!(
            block.contains("- Summary: did it\n  ## not a heading\n---\n"),
            "{block}"
        );
        assert_eq!(block.lines().filter(|l| l.starts_with("## ")).count(), 1);
    }

    #[test]
    fn append_keeps_earlier_content_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.txt");
        assert!(ensure_exists(&path, at()).unwrap());
        assert!(!ensure_exists(&path, at()).unwrap());
        // The agent's own edit, without a trailing newline.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"- use pnpm, not npm").unwrap();
        drop(file);
        let before = fs::read_to_string(&path).unwrap();
        append_entry(&path, &entry(1, "ok")).unwrap();
        let after = fs::read_to_string(&path).unwrap();
        assert!(after.starts_with(&before));
        assert!(after[before.len()..].starts_with("\n\n## "), "{after}");
    }

    #[test]
    fn small_file_is_returned_whole_and_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.txt");
        assert_eq!(excerpt(&path, 100).unwrap(), "");
        fs::write(&path, "short\n").unwrap();
        assert_eq!(excerpt(&path, 100).unwrap(), "short\n");
    }

    #[test]
    fn huge_patterns_section_is_capped_at_a_line() {
        let patterns: String = (0..100).map(|i| format!("- pattern {i}\n")).collect();
        let text = format!("# H\n{PATTERNS_HEADING}\n{patterns}## later entry\nbody\n---\n");
        let out = excerpt_of(&text, 400);
        assert!(out.starts_with(PATTERNS_HEADING), "{out}");
        assert!(
            out.contains("more bytes of Codebase Patterns omitted"),
            "{out}"
        );
        assert!(out.ends_with("## later entry\nbody\n---\n"), "{out}");
        assert!(out.len() < 400 + 120, "{}", out.len());
    }

    #[test]
    fn single_long_line_is_cut_on_a_char_boundary() {
        let text = "é".repeat(500);
        let out = excerpt_of(&text, 101);
        assert!(out.contains("earlier bytes omitted"));
        assert!(out.ends_with('é'));
    }
}
