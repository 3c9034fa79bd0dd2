//! The ledger: `.ralph/ledger.jsonl`, one JSON record per iteration, every run, append-only.
//!
//! It is ralph's audit trail (design.md, "Files and formats"): what ran, for how long, what it
//! cost, what it changed, and how it ended ([`Outcome`], a closed set). Each record is written
//! with a single `write` followed by `fsync`, so a crash can at worst leave a torn *last* line;
//! [`read_all`] skips such a line and reports it, while a broken line elsewhere is an error.
//! The next [`append`] (or an explicit [`repair`]) cuts a torn fragment off first, so it can
//! never end up in the middle; its bytes are kept next to the ledger in
//! `ledger.torn-<UTC timestamp>` so that nothing ralph wrote is silently thrown away.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::Utc;

use crate::protocol::LedgerRecord;

/// Errors reading or writing the ledger. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A filesystem operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What ralph was doing, e.g. `append to`.
        action: &'static str,
        /// The ledger (or its directory).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line other than the last one is not a valid record.
    #[error("{}:{line}: not a valid ledger record: {source}\nhint: fix or delete that line; the ledger is append-only JSONL, one record per line", path.display())]
    BadLine {
        /// The ledger.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be serialized (not expected: every field is plain data).
    #[error("cannot serialize a ledger record: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// What [`read_all`] found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LedgerContents {
    /// Every valid record, in file order (oldest first).
    pub records: Vec<LedgerRecord>,
    /// The 1-based number of an unparsable last line that was skipped (a write torn by a crash),
    /// if there was one.
    pub torn_last_line: Option<usize>,
}

/// What [`repair`] found at the end of the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// The file is missing, empty or ends with a newline: nothing to do.
    Clean,
    /// The last line was a complete record missing its newline; the newline was added.
    Terminated,
    /// The last line was a torn fragment (not a valid record); it was cut off the ledger.
    Dropped {
        /// Length of the fragment, in bytes.
        bytes: usize,
        /// Where its bytes were kept: `<ledger dir>/<ledger stem>.torn-<UTC timestamp>`
        /// (e.g. `.ralph/ledger.torn-20250131T140509.123Z`).
        kept_in: PathBuf,
    },
}

/// Makes the ledger end on a complete line, after a crash (power loss, full disk) tore the last
/// write: a last line without its newline is terminated when it is a valid record, and otherwise
/// cut off, its bytes first saved (and fsynced) in a `.torn-<timestamp>` file beside the ledger.
/// [`append`] does this before every write; calling it at the start of a run also repairs a
/// ledger that no later iteration appends to. A missing file is [`Repair::Clean`].
///
/// # Errors
/// [`LedgerError::Io`] naming the ledger (or the file the fragment was to be kept in).
pub fn repair(path: &Path) -> Result<Repair, LedgerError> {
    let mut file = match OpenOptions::new().read(true).append(true).open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Repair::Clean),
        Err(source) => {
            return Err(LedgerError::Io {
                action: "open",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    repair_torn_tail(&mut file, path)
}

/// Appends `record` as one JSON line and fsyncs, creating the file and its parent directory
/// when missing. If the file ends in an unterminated fragment (a torn write), it is repaired
/// first as [`repair`] describes.
///
/// # Errors
/// [`LedgerError::Io`] naming the file; [`LedgerError::Serialize`].
pub fn append(path: &Path, record: &LedgerRecord) -> Result<(), LedgerError> {
    let io = |action: &'static str| {
        move |source| LedgerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io("create the directory of"))?;
    }
    let line = serde_json::to_string(record).map_err(LedgerError::Serialize)?;
    // Every string field at once: a secret is matched in its JSON-escaped form too.
    let mut line = crate::redact::redact_env(&line);
    line.push('\n');

    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(io("open"))?;
    repair_torn_tail(&mut file, path)?;
    // One write call per record: a crash tears at most this line.
    file.write_all(line.as_bytes()).map_err(io("append to"))?;
    file.sync_data().map_err(io("sync"))?;
    Ok(())
}

/// [`repair`] on an open ledger (opened for reading and appending).
fn repair_torn_tail(file: &mut File, path: &Path) -> Result<Repair, LedgerError> {
    let io = |action: &'static str| {
        move |source| LedgerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let Some((start, fragment)) = torn_fragment(file).map_err(io("read the last line of"))? else {
        return Ok(Repair::Clean);
    };
    if serde_json::from_slice::<LedgerRecord>(&fragment).is_ok() {
        file.write_all(b"\n")
            .map_err(io("terminate the last line of"))?;
        file.sync_data().map_err(io("sync"))?;
        return Ok(Repair::Terminated);
    }
    // Keep the bytes before cutting them off: a crash in between loses nothing.
    let kept_in = keep_torn_bytes(path, &fragment)?;
    tracing::warn!(
        path = %path.display(),
        bytes = fragment.len(),
        kept_in = %kept_in.display(),
        "cut a torn last line off the ledger (left by a crash)"
    );
    file.set_len(start)
        .map_err(io("truncate the torn last line of"))?;
    file.sync_data().map_err(io("sync"))?;
    Ok(Repair::Dropped {
        bytes: fragment.len(),
        kept_in,
    })
}

/// Writes `fragment` to a new `<stem>.torn-<UTC timestamp>` file beside the ledger and fsyncs
/// it; returns its path. A name already taken gets a `-2`, `-3`, ... suffix.
fn keep_torn_bytes(ledger: &Path, fragment: &[u8]) -> Result<PathBuf, LedgerError> {
    let dir = ledger.parent().unwrap_or(Path::new(""));
    let stem = ledger
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ledger".to_owned());
    let base = format!("{stem}.torn-{}", Utc::now().format("%Y%m%dT%H%M%S%.3fZ"));
    let mut n = 1u32;
    loop {
        let name = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let candidate = dir.join(name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(mut kept) => {
                let io = |action: &'static str| {
                    let candidate = candidate.clone();
                    move |source| LedgerError::Io {
                        action,
                        path: candidate,
                        source,
                    }
                };
                kept.write_all(fragment).map_err(io("write"))?;
                kept.sync_all().map_err(io("sync"))?;
                return Ok(candidate);
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(source) => {
                return Err(LedgerError::Io {
                    action: "create",
                    path: candidate,
                    source,
                })
            }
        }
    }
}

/// The unterminated last line of `file`: its start offset and bytes, or `None` when the file is
/// empty or ends with a newline.
fn torn_fragment(file: &mut File) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(None);
    }
    // Find where the unterminated fragment starts, reading backwards in blocks.
    let mut start = 0u64;
    let mut end = len;
    let mut block = vec![0u8; 64 * 1024];
    while end > 0 {
        let from = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(chunk)?;
        if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
            start = from + pos as u64 + 1;
            break;
        }
        end = from;
    }
    let mut fragment = Vec::with_capacity((len - start) as usize);
    file.seek(SeekFrom::Start(start))?;
    file.read_to_end(&mut fragment)?;
    Ok(Some((start, fragment)))
}

/// The highest iteration number among the records in the ledger's last `TAIL_BYTES` (64 KiB):
/// iteration numbers only grow down the file (a recovered iteration repeats its number), so
/// the newest lines hold the maximum, and a start of `ralph run` does not parse 10,000 records
/// to find it. 0 for a missing or empty ledger; unparsable lines (a torn last line) are
/// skipped.
///
/// # Errors
/// [`LedgerError::Io`] naming the file.
pub fn last_iteration(path: &Path) -> Result<u32, LedgerError> {
    const TAIL_BYTES: u64 = 64 * 1024;
    #[derive(serde::Deserialize)]
    struct Numbered {
        iteration: u32,
    }
    let io = |action: &'static str| {
        move |source| LedgerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(io("read")(source)),
    };
    let len = file.metadata().map_err(io("read"))?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    let mut tail = Vec::with_capacity((len - start) as usize);
    file.seek(SeekFrom::Start(start)).map_err(io("read"))?;
    file.read_to_end(&mut tail).map_err(io("read"))?;
    // Unless the tail is the whole file, its first line is cut: skip it.
    let lines = tail.split(|&b| b == b'\n').skip(usize::from(start > 0));
    Ok(lines
        .filter_map(|line| serde_json::from_slice::<Numbered>(line).ok())
        .map(|r| r.iteration)
        .max()
        .unwrap_or(0))
}

/// Reads every record, oldest first. A missing file reads as empty. Blank lines are skipped.
/// An unparsable *last* line is skipped, logged as a warning and reported in
/// [`LedgerContents::torn_last_line`]; an unparsable line anywhere else is an error.
///
/// # Errors
/// [`LedgerError::Io`] naming the file; [`LedgerError::BadLine`] with the file and line number.
pub fn read_all(path: &Path) -> Result<LedgerContents, LedgerError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LedgerContents::default())
        }
        Err(source) => {
            return Err(LedgerError::Io {
                action: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let lines: Vec<(usize, &[u8])> = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(index, line)| (index + 1, line))
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    let mut contents = LedgerContents::default();
    for (position, (number, line)) in lines.iter().enumerate() {
        match serde_json::from_slice::<LedgerRecord>(line) {
            Ok(record) => contents.records.push(record),
            Err(_) if position + 1 == lines.len() => {
                tracing::warn!(
                    path = %path.display(),
                    line = number,
                    "skipping a torn last line in the ledger (left by a crash)"
                );
                contents.torn_last_line = Some(*number);
            }
            Err(source) => {
                return Err(LedgerError::BadLine {
                    path: path.to_path_buf(),
                    line: *number,
                    source,
                })
            }
        }
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::*;
    use crate::protocol::{CostSource, Outcome};

    fn record(iteration: u32, outcome: Outcome) -> LedgerRecord {
        let at = DateTime::parse_from_rfc3339("2025-01-31T14:05:09.123Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut r = LedgerRecord::new("r1", iteration, "US-001", outcome, at);
        r.story_title = "Add login".into();
        r.backend = "claude".into();
        r.model = Some("sonnet".into());
        r.duration_s = 1.5;
        r.exit_code = Some(0);
        r.tokens_in = Some(10);
        r.tokens_out = Some(20);
        r.cost_usd = Some(0.25);
        r.cost_source = Some(CostSource::Agent);
        r.head_after = Some("abc".into());
        r.commits = vec!["abc".into()];
        r.files_changed = vec!["src/a.rs".into()];
        r.passes_flipped = vec!["US-001".into()];
        r.transcript = Some(".ralph/runs/r1/iter-001.jsonl".into());
        r
    }

    #[test]
    fn last_iteration_reads_the_tail_only_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        assert_eq!(last_iteration(&path).unwrap(), 0);
        for n in 1..=400 {
            let mut r = record(n, Outcome::Progress);
            r.message = Some("x".repeat(300));
            append(&path, &r).unwrap();
        }
        assert!(fs::metadata(&path).unwrap().len() > 64 * 1024);
        assert_eq!(last_iteration(&path).unwrap(), 400);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"run_id\":\"r\",\"itera").unwrap();
        assert_eq!(last_iteration(&path).unwrap(), 400);
    }

    #[test]
    fn timestamps_are_rfc3339_utc_millis() {
        let line = serde_json::to_string(&record(1, Outcome::Progress)).unwrap();
        assert!(
            line.contains(r#""started_at":"2025-01-31T14:05:09.123Z""#),
            "{line}"
        );
        assert!(line.contains(r#""outcome":"progress""#), "{line}");
    }

    #[test]
    fn append_drops_a_torn_fragment_so_it_never_lands_mid_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/ledger.jsonl");
        append(&path, &record(1, Outcome::Progress)).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"run_id":"r1","iter"#).unwrap();
        drop(file);
        append(&path, &record(2, Outcome::StoryPassed)).unwrap();
        let contents = read_all(&path).unwrap();
        assert_eq!(contents.torn_last_line, None);
        let iterations: Vec<u32> = contents.records.iter().map(|r| r.iteration).collect();
        assert_eq!(iterations, [1, 2]);
        // The cut bytes are kept beside the ledger, not thrown away.
        let kept = torn_files(&path);
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).unwrap(), br#"{"run_id":"r1","iter"#);
    }

    /// The `.torn-*` files beside `ledger`, sorted.
    fn torn_files(ledger: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(ledger.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ledger.torn-"))
            })
            .collect();
        found.sort();
        found
    }

    #[test]
    fn repair_cuts_a_torn_tail_keeps_its_bytes_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        assert_eq!(repair(&path).unwrap(), Repair::Clean, "missing file");
        assert!(!path.exists(), "repair must not create the ledger");
        append(&path, &record(1, Outcome::Progress)).unwrap();
        append(&path, &record(2, Outcome::Progress)).unwrap();
        let whole = fs::read(&path).unwrap();
        assert_eq!(repair(&path).unwrap(), Repair::Clean);

        // A crash tore the third record after 40 bytes (an é split in the middle, too).
        let third = serde_json::to_string(&record(3, Outcome::StoryPassed)).unwrap();
        let mut torn = third.as_bytes()[..40].to_vec();
        torn.extend_from_slice(&[0xc3]);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&torn).unwrap();
        drop(file);
        assert_eq!(read_all(&path).unwrap().torn_last_line, Some(3));

        let Repair::Dropped { bytes, kept_in } = repair(&path).unwrap() else {
            panic!("the torn line was not dropped");
        };
        assert_eq!(bytes, torn.len());
        assert_eq!(fs::read(&path).unwrap(), whole, "only the fragment was cut");
        assert_eq!(fs::read(&kept_in).unwrap(), torn);
        assert_eq!(kept_in.parent(), path.parent());
        assert_eq!(repair(&path).unwrap(), Repair::Clean, "second repair");
        let contents = read_all(&path).unwrap();
        assert_eq!(contents.torn_last_line, None);
        assert_eq!(contents.records.len(), 2);

        // A second tear in the same millisecond still gets its own file.
        for _ in 0..2 {
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(b"{\"run_id\"").unwrap();
            drop(file);
            assert!(matches!(repair(&path).unwrap(), Repair::Dropped { .. }));
        }
        assert_eq!(torn_files(&path).len(), 3);
        assert_eq!(fs::read(&path).unwrap(), whole);
    }

    #[test]
    fn repair_of_a_file_that_is_one_torn_line_leaves_it_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let torn = b"{\"run_id\":\"r1\",\"itera";
        fs::write(&path, torn).unwrap();
        assert!(
            matches!(repair(&path).unwrap(), Repair::Dropped { bytes, .. } if bytes == torn.len())
        );
        assert_eq!(fs::read(&path).unwrap(), b"");
        assert_eq!(read_all(&path).unwrap(), LedgerContents::default());
    }

    #[test]
    fn append_terminates_a_complete_record_missing_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let line = serde_json::to_string(&record(1, Outcome::Progress)).unwrap();
        fs::write(&path, &line).unwrap();
        assert_eq!(repair(&path).unwrap(), Repair::Terminated);
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{line}\n"));
        fs::write(&path, &line).unwrap();
        append(&path, &record(2, Outcome::Progress)).unwrap();
        assert_eq!(read_all(&path).unwrap().records.len(), 2);
        assert!(
            torn_files(&path).is_empty(),
            "a complete record is not torn"
        );
    }
}
