//! `progress.txt`: the run's human-readable, append-only memory, shared by the agent and ralph.
//!
//! The layout is the original Ralph's (snarktank/ralph, as its `ralph.sh` and prompt build it):
//! a `# Ralph Progress Log` header with a `Started:` line and `---`, a `## Codebase Patterns`
//! section near the top that the agent curates with reusable learnings, then one `## ...` block
//! per iteration ending in `---`. ralph adds its own short block per iteration (time, iteration,
//! story, outcome, commit) and never edits earlier content (see [`roll`] for where older entries
//! go).
//!
//! Prompts get an [`excerpt`]: the Codebase Patterns section (the most valuable part, kept
//! even when the file is large) plus as much of the newest content as fits.
//!
//! The log stays append-only, but progress.txt itself does not grow without bound: once it is
//! over [`ROLL_AT_BYTES`], [`roll`] moves its older entries, unchanged and in order, into the
//! next numbered file of `progress-history/` beside it ([`HISTORY_DIR`]) and keeps the header,
//! the Codebase Patterns section and the newest entries. Each history file is written once and
//! never changed, so an iteration's checkpoint hashes and stores a progress.txt of bounded size
//! whatever the length of the night (issue 13, P5): the log's history costs git one blob per
//! moved part, not one copy of the whole log per iteration. Reading `progress-history/*.txt` in
//! name order, then progress.txt's entries, gives the whole log.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Local};

use crate::protocol::Outcome;

/// The heading of the section the agent keeps its reusable learnings in.
pub const PATTERNS_HEADING: &str = "## Codebase Patterns";

/// The folder, beside progress.txt, that [`roll`] moves older entries into: `0001.txt`,
/// `0002.txt`, … oldest first.
pub const HISTORY_DIR: &str = "progress-history";

/// Size of progress.txt (bytes) above which [`roll`] moves its older entries out: 32 KiB, twice
/// the prompt's default excerpt, so the agent and the prompt still see a good stretch of recent
/// entries and a checkpoint stores at most a few KiB (compressed) of progress.txt.
pub const ROLL_AT_BYTES: u64 = 32 * 1024;

/// About how many bytes of the newest entries [`roll`] keeps in progress.txt (8 KiB; it cuts
/// at an entry heading, so a little less or, for one long newest entry, all of it).
pub const ROLL_KEEP_BYTES: usize = 8 * 1024;

/// The line in progress.txt's header that points at [`HISTORY_DIR`] once entries have moved.
const HISTORY_LINE_PREFIX: &str = "Earlier entries: ";

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

/// Whether `path` is a symbolic link (a dangling one included).
pub fn is_link(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Removes a symbolic link at `path` and returns where it pointed; `None` when `path` is no
/// link. ralph never follows a link at progress.txt: an agent that links it to a file outside
/// the tree (`~/.ssh/id_ed25519`, `~/.profile`) would otherwise have ralph read that file into
/// the next prompt or append its entries to it, from outside any `--sandbox`. The file that
/// takes the link's place starts afresh; the earlier entries are in git.
///
/// # Errors
/// [`ProgressError`] when the link cannot be removed.
pub fn detach_link(path: &Path) -> Result<Option<std::path::PathBuf>, ProgressError> {
    if !is_link(path) {
        return Ok(None);
    }
    let target = fs::read_link(path).unwrap_or_default();
    fs::remove_file(path).map_err(io_error("remove the symbolic link", path))?;
    Ok(Some(target))
}

/// Creates `path` with [`initial_contents`] when it does not exist (the parent directory must
/// exist). Returns whether it was created; an existing file is left untouched.
///
/// # Errors
/// [`ProgressError`] naming the file.
pub fn ensure_exists(path: &Path, now: DateTime<Local>) -> Result<bool, ProgressError> {
    detach_link(path)?;
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
    // progress.txt is committed (and pushed): no secret may reach it (crate::redact).
    text.push_str(&crate::redact::redact_env(&entry.render()));
    // One write(2) and no fsync: the checkpoint commit that follows carries the entry, and the
    // ledger line after it is the iteration's durable commit point (docs/durability.md).
    file.write_all(text.as_bytes())
        .map_err(io_error("append to", path))?;
    Ok(())
}

/// What [`roll`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rolled {
    /// The history file the older entries went into, e.g. `<dir>/progress-history/0003.txt`.
    pub part: PathBuf,
    /// Bytes moved out of progress.txt into it.
    pub moved_bytes: usize,
}

/// Keeps progress.txt bounded without losing a line: when `path` is larger than
/// [`ROLL_AT_BYTES`], its entries older than the newest [`ROLL_KEEP_BYTES`] or so (cut at an
/// entry heading) move, byte for byte and in order, into a new numbered file in
/// [`HISTORY_DIR`] beside it, and progress.txt keeps its header (with an `Earlier entries:` line
/// naming that folder), the whole `## Codebase Patterns` section and the newest entries.
///
/// Costs one `stat` when the file is small. Crash-safe: the history file is complete (written to
/// a temporary name and renamed) before progress.txt is replaced (atomically, its mode kept);
/// a crash between the two is noticed on the next call, which sees that the newest history file
/// already holds the entries it would move and only shortens progress.txt. Returns `None` when
/// nothing moved (small file, missing file, or nothing older than the newest entries).
///
/// # Errors
/// [`ProgressError`] naming the file or folder that could not be read or written.
pub fn roll(path: &Path, now: DateTime<Local>) -> Result<Option<Rolled>, ProgressError> {
    detach_link(path)?;
    match fs::metadata(path) {
        Ok(meta) if meta.len() > ROLL_AT_BYTES => {}
        Ok(_) => return Ok(None),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ProgressError {
                action: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    }
    let bytes = fs::read(path).map_err(io_error("read", path))?;
    // Invalid UTF-8 is never rewritten (it would be replaced): such a file is left as it is.
    let Ok(text) = std::str::from_utf8(&bytes) else {
        tracing::warn!(
            "{} is not valid UTF-8; ralph leaves it as it is instead of moving its older entries to {HISTORY_DIR}/",
            path.display()
        );
        return Ok(None);
    };
    let (head, body) = text.split_at(head_len(text));
    let keep_from = keep_start(body, ROLL_KEEP_BYTES);
    let moved = &body[..keep_from];
    if moved.trim().is_empty() {
        return Ok(None);
    }
    let dir = path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(HISTORY_DIR);
    fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
    let (last, last_number) = newest_part(&dir)?;
    let part_text = format!(
        "# Ralph Progress Log: entries moved from progress.txt on {}\n\n{moved}",
        now.format(TIME_FORMAT)
    );
    // A crash after the part was written and before progress.txt was shortened: the part is
    // already there, so it is not written twice.
    let already = last
        .as_ref()
        .and_then(|p| fs::read(p).ok())
        .is_some_and(|old| part_body(&old) == moved.as_bytes());
    let part = match (already, last) {
        (true, Some(last)) => last,
        _ => {
            let part = dir.join(format!("{:04}.txt", last_number + 1));
            let tmp = dir.join(format!(".{:04}.txt.tmp", last_number + 1));
            fs::write(&tmp, part_text.as_bytes()).map_err(io_error("write", &tmp))?;
            fs::rename(&tmp, &part).map_err(io_error("write", &part))?;
            part
        }
    };
    let pointer = format!(
        "{HISTORY_LINE_PREFIX}{HISTORY_DIR}/ ({} oldest first, moved there by ralph when this file passed {} KiB)",
        part.file_name().map_or_else(String::new, |n| format!("up to {},", n.to_string_lossy())),
        ROLL_AT_BYTES / 1024
    );
    let new_text = format!("{}{}", with_pointer(head, &pointer), &body[keep_from..]);
    crate::fsutil::write_volatile(path, new_text.as_bytes()).map_err(io_error("write", path))?;
    Ok(Some(Rolled {
        part,
        moved_bytes: moved.len(),
    }))
}

/// Length of the part of progress.txt that [`roll`] never moves: everything up to the end of
/// the Codebase Patterns section, or, without one, up to the first entry heading.
fn head_len(text: &str) -> usize {
    if let Some((_, end)) = patterns_section(text) {
        return end;
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with("## ") {
            return offset;
        }
        offset += line.len();
    }
    text.len()
}

/// Where the entries [`roll`] keeps start in `body`: the oldest entry heading (`## ` at a line
/// start) with at most `keep` bytes from it to the end, else the newest entry heading (a long
/// newest entry is kept whole), else 0 (no heading: nothing moves).
fn keep_start(body: &str, keep: usize) -> usize {
    let mut newest = 0;
    let mut offset = 0;
    for line in body.split_inclusive('\n') {
        if line.starts_with("## ") {
            if body.len() - offset <= keep {
                return offset;
            }
            newest = offset;
        }
        offset += line.len();
    }
    newest
}

/// The newest numbered file in `dir` (`NNNN.txt`) and its number (0 when there is none).
fn newest_part(dir: &Path) -> Result<(Option<PathBuf>, u32), ProgressError> {
    let mut newest: (Option<PathBuf>, u32) = (None, 0);
    for entry in fs::read_dir(dir).map_err(io_error("list", dir))? {
        let entry = entry.map_err(io_error("list", dir))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".txt"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if number >= newest.1 {
            newest = (Some(entry.path()), number);
        }
    }
    Ok(newest)
}

/// A history file's content after its first line and the blank line that follows.
fn part_body(bytes: &[u8]) -> &[u8] {
    match bytes.windows(2).position(|w| w == b"\n\n") {
        Some(pos) => &bytes[pos + 2..],
        None => &[],
    }
}

/// `head` with its `Earlier entries:` line replaced by `pointer`, or with `pointer` inserted
/// after the `Started:` line (at the top when there is none).
fn with_pointer(head: &str, pointer: &str) -> String {
    // Only the header above the Codebase Patterns heading is ralph's to change.
    let split = patterns_section(head).map_or(head.len(), |(start, _)| start);
    let (head, patterns) = head.split_at(split);
    let mut out = String::with_capacity(head.len() + patterns.len() + pointer.len() + 1);
    let mut placed = false;
    let has_line = head.lines().any(|l| l.starts_with(HISTORY_LINE_PREFIX));
    let has_started = head.lines().any(|l| l.starts_with("Started:"));
    if !has_line && !has_started {
        out.push_str(pointer);
        out.push('\n');
        placed = true;
    }
    for line in head.split_inclusive('\n') {
        if line.starts_with(HISTORY_LINE_PREFIX) {
            if !placed {
                out.push_str(pointer);
                out.push('\n');
                placed = true;
            }
            continue;
        }
        out.push_str(line);
        if !placed && !has_line && line.starts_with("Started:") {
            if !line.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(pointer);
            out.push('\n');
            placed = true;
        }
    }
    out.push_str(patterns);
    out
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
    // A link is never followed: an agent (sandboxed or not) that links progress.txt to a file
    // it cannot read would have ralph paste that file into the next prompt.
    if is_link(path) {
        return Ok(String::new());
    }
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

    /// The entries of a progress log as one text: the history parts' bodies in name order, then
    /// progress.txt after its head.
    fn whole_log(dir: &Path) -> String {
        let mut parts: Vec<_> = fs::read_dir(dir.join(HISTORY_DIR))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        parts.sort();
        let mut out = String::new();
        for part in parts {
            let bytes = fs::read(&part).unwrap();
            out.push_str(std::str::from_utf8(part_body(&bytes)).unwrap());
        }
        let text = fs::read_to_string(dir.join("progress.txt")).unwrap();
        out.push_str(&text[head_len(&text)..]);
        out
    }

    fn grow(path: &Path, from: u32, to: u32) {
        for i in from..to {
            append_entry(
                path,
                &entry(
                    i,
                    &format!("did thing {i}\nwith detail {}", "x".repeat(300)),
                ),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_small_progress_txt_is_not_rolled() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("progress.txt");
        assert_eq!(roll(&path, at()).unwrap(), None, "a missing file");
        grow(&path, 1, 10);
        let before = fs::read(&path).unwrap();
        assert_eq!(roll(&path, at()).unwrap(), None);
        assert_eq!(fs::read(&path).unwrap(), before);
        assert!(!tmp.path().join(HISTORY_DIR).exists());
    }

    #[test]
    fn rolling_moves_older_entries_byte_for_byte_and_keeps_patterns_and_the_newest() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("progress.txt");
        ensure_exists(&path, at()).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"- Use the repo's Makefile for checks\n")
            .unwrap();
        drop(file);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        grow(&path, 1, 200);
        let entries_before = {
            let text = fs::read_to_string(&path).unwrap();
            text[head_len(&text)..].to_owned()
        };

        let rolled = roll(&path, at()).unwrap().expect("a large file rolls");
        assert_eq!(rolled.part, tmp.path().join(HISTORY_DIR).join("0001.txt"));
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.len() as u64 <= ROLL_KEEP_BYTES as u64 + 1024,
            "{} bytes",
            text.len()
        );
        assert!(
            text.starts_with("# Ralph Progress Log\nStarted: "),
            "{text}"
        );
        assert!(
            text.contains("\nEarlier entries: progress-history/ (up to 0001.txt"),
            "{text}"
        );
        assert!(text.contains("## Codebase Patterns\n\n- Use the repo's Makefile for checks\n"));
        assert!(
            text.contains("(ralph, iteration 199)"),
            "the newest entry stays"
        );
        assert!(!text.contains("(ralph, iteration 1)\n"));
        assert_eq!(
            whole_log(tmp.path()),
            entries_before,
            "nothing lost or reordered"
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "the file keeps its mode");

        // More nights: each roll adds the next part, the pointer is updated, not repeated.
        grow(&path, 200, 400);
        let entries_before = whole_log(tmp.path());
        let rolled = roll(&path, at()).unwrap().expect("rolls again");
        assert!(rolled.part.ends_with("0002.txt"));
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("Earlier entries:").count(), 1, "{text}");
        assert!(text.contains("up to 0002.txt"));
        assert_eq!(whole_log(tmp.path()), entries_before);
        assert!(excerpt(&path, 4096).unwrap().contains("Makefile"));
    }

    #[test]
    fn a_roll_interrupted_after_writing_its_part_does_not_write_it_twice() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("progress.txt");
        grow(&path, 1, 150);
        let original = fs::read(&path).unwrap();
        roll(&path, at()).unwrap().unwrap();
        // As if killed before progress.txt was replaced: the part exists, the file is whole.
        fs::write(&path, &original).unwrap();
        let rolled = roll(&path, at()).unwrap().unwrap();
        assert!(rolled.part.ends_with("0001.txt"), "{:?}", rolled.part);
        assert_eq!(
            fs::read_dir(tmp.path().join(HISTORY_DIR)).unwrap().count(),
            1
        );
        let text = String::from_utf8(original).unwrap();
        assert_eq!(whole_log(tmp.path()), text[head_len(&text)..]);
    }

    #[test]
    fn one_long_newest_entry_is_kept_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("progress.txt");
        grow(&path, 1, 5);
        append_entry(&path, &entry(5, &"long line\n".repeat(5000))).unwrap();
        roll(&path, at()).unwrap().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("(ralph, iteration 5)"));
        assert!(!text.contains("(ralph, iteration 4)"));
        assert_eq!(text.matches("long line").count(), 5000);
    }
}
