//! Per-iteration transcripts: `.ralph/runs/<run-id>/iter-NNN.jsonl`.
//!
//! Line 1 is a meta record; then every raw line the agent printed (`"type":"line"`) and the
//! normalized events ralph parsed from it (`"type":"event"`), in order; the last line is an `end`
//! record. Lines are written through a buffer as they arrive, so memory stays flat however much
//! the agent prints; lines longer than [`MAX_TRANSCRIPT_LINE_BYTES`] are cut with a note, and once
//! [`MAX_TRANSCRIPT_BYTES`] have been written, further lines and events are only counted (a
//! `capped` record says so at once, and a `omitted` record at the end says how much), so an agent
//! that prints gigabytes cannot fill the disk.
//!
//! Each raw line is stored once. When the backend's events depend on its lines alone
//! ([`Transcript::create_replayed`], the meta record says `"events":"replay"`), the events of a
//! stdout line kept whole are not written: a reader rebuilds them by reading those lines again
//! with the backend's parser ([`read_with`]). A stdout line kept with a `note` (cut) and every
//! stderr line (few and small) have their events written after them, and are not read again.
//! Older transcripts (and backends whose events depend on more than the lines, such as exec's on
//! the prompt) have every event written.
//!
//! A stdout line the parser read as one JSON value exactly as printed is kept as that JSON
//! (`"json":{...}`, [`Transcript::line_as`]) rather than as an escaped `"text"` string.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use crate::process::{OutputLine, StreamKind};
use crate::protocol::AgentEvent;

/// Longest agent line kept verbatim in a transcript (64 KiB); longer ones are cut with a note.
pub const MAX_TRANSCRIPT_LINE_BYTES: usize = 64 * 1024;

/// Size after which a transcript keeps only counts of further lines and events (64 MiB).
pub const MAX_TRANSCRIPT_BYTES: u64 = 64 * 1024 * 1024;

/// Metadata written as the first line of a transcript.
#[derive(Debug, Clone, Serialize)]
pub struct TranscriptMeta {
    /// Run id.
    pub run_id: String,
    /// Iteration number.
    pub iteration: u32,
    /// Story id.
    pub story_id: String,
    /// Backend name.
    pub backend: String,
    /// The agent's argv, shell-quoted so it can be pasted into a shell.
    pub command: String,
    /// Git HEAD at the start, when there is one.
    pub head: Option<String>,
    /// ralph's version.
    pub ralph_version: String,
    /// RFC 3339 UTC start time.
    pub started_at: String,
    /// Size of the prompt in bytes.
    pub prompt_bytes: usize,
}

/// Writes one iteration's transcript. Write errors are remembered, not raised per line, so a full
/// disk cannot kill an iteration; [`Transcript::finish`] reports the first one.
pub struct Transcript {
    path: PathBuf,
    out: BufWriter<File>,
    started: Instant,
    error: Option<std::io::Error>,
    /// Bytes written so far.
    written: u64,
    /// [`MAX_TRANSCRIPT_BYTES`], smaller in tests.
    cap: u64,
    /// Lines and events left out after the cap.
    omitted_records: u64,
    /// Bytes of the lines left out.
    omitted_bytes: u64,
    /// When the buffer last went to the file.
    flushed: Instant,
    /// Events of a line kept whole are rebuilt by readers, not written
    /// ([`Transcript::create_replayed`]).
    replay: bool,
    /// The last line was a stdout line written whole (no cut, no note): its events are not
    /// written when `replay` is set.
    line_whole: bool,
    /// Applied to every record before it is written (crate::redact).
    redactor: std::sync::Arc<crate::redact::Redactor>,
}

/// A `line` record with its text as a string (the fields in this order).
#[derive(Serialize)]
struct LineRecord<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    t_ms: u64,
    stream: StreamKind,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// How long written records may sit in the buffer: a ralph killed with SIGKILL loses at most
/// this much of its transcript.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

impl Transcript {
    /// The transcript path of `iteration` in `run_id`, relative to the `.ralph` directory.
    pub fn relative_path(run_id: &str, iteration: u32) -> PathBuf {
        crate::workspace::RunPaths::transcript_rel(run_id, iteration)
    }

    /// Creates the file (and its directory) under `ralph_dir` and writes the meta line.
    ///
    /// # Errors
    /// I/O errors creating the directory or the file.
    pub fn create(ralph_dir: &Path, meta: &TranscriptMeta) -> std::io::Result<Transcript> {
        Self::open(ralph_dir, meta, false)
    }

    /// [`Transcript::create`] for a backend whose events a reader can rebuild from its lines
    /// alone: the events of a line kept whole are not written (see the module docs), so the raw
    /// output is stored once. The meta record says `"events":"replay"`.
    ///
    /// # Errors
    /// I/O errors creating the directory or the file.
    pub fn create_replayed(ralph_dir: &Path, meta: &TranscriptMeta) -> std::io::Result<Transcript> {
        Self::open(ralph_dir, meta, true)
    }

    fn open(ralph_dir: &Path, meta: &TranscriptMeta, replay: bool) -> std::io::Result<Transcript> {
        let path = ralph_dir.join(Self::relative_path(&meta.run_id, meta.iteration));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = File::create(&path)?;
        let mut t = Transcript {
            path,
            out: BufWriter::new(file),
            started: Instant::now(),
            flushed: Instant::now(),
            error: None,
            written: 0,
            cap: MAX_TRANSCRIPT_BYTES,
            omitted_records: 0,
            omitted_bytes: 0,
            replay,
            line_whole: false,
            redactor: crate::redact::current(),
        };
        if replay {
            t.write(&json!({"type": "meta", "meta": meta, "events": "replay"}));
        } else {
            t.write(&json!({"type": "meta", "meta": meta}));
        }
        Ok(t)
    }

    /// The absolute path of this transcript.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, value: &impl Serialize) {
        if self.error.is_some() {
            return;
        }
        match serde_json::to_vec(value) {
            Ok(bytes) => self.write_parts(&[&bytes]),
            Err(e) => self.error = Some(std::io::Error::other(e)),
        }
    }

    /// Writes one record made of `parts` (already JSON), and its newline.
    fn write_parts(&mut self, parts: &[&[u8]]) {
        if self.error.is_some() {
            return;
        }
        // One record, redacted as text (a secret is matched in its JSON-escaped form too).
        let joined = parts.concat();
        let text = String::from_utf8_lossy(&joined);
        let text = self.redactor.redact(&text);
        let result = self.out.write_all(text.as_bytes());
        self.written += text.len() as u64;
        let result = result.and_then(|()| self.out.write_all(b"\n"));
        self.written += 1;
        if let Err(e) = result {
            self.error = Some(e);
            return;
        }
        if self.flushed.elapsed() >= FLUSH_EVERY {
            self.flushed = Instant::now();
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
            }
        }
    }

    /// Whether a line or event of about `len` bytes may still be written; once the cap is
    /// reached, writes a `capped` note the first time and counts what is left out.
    fn room_for(&mut self, len: usize) -> bool {
        if self.written < self.cap {
            return true;
        }
        if self.omitted_records == 0 {
            let note = json!({"type": "capped", "t_ms": self.elapsed_ms(), "data": format!(
                "transcript reached {} bytes: further lines and events are counted, not kept",
                self.cap
            )});
            self.write(&note);
        }
        self.omitted_records += 1;
        self.omitted_bytes += len as u64;
        false
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records one raw agent line, cutting it at [`MAX_TRANSCRIPT_LINE_BYTES`].
    pub fn line(&mut self, line: &OutputLine) {
        self.line_as(line, false);
    }

    /// [`Transcript::line`] for a line the parser read as one JSON value exactly as printed
    /// (`is_json`, see [`crate::agent::OutputParser::line_is_json`]): a whole stdout line that
    /// fits is kept as that JSON (`"json":{...}`) instead of as an escaped string, which costs
    /// no escaping and keeps more of a run under the cap. Readers get the line's text back
    /// byte for byte.
    pub fn line_as(&mut self, line: &OutputLine, is_json: bool) {
        let full_len = line.truncated_from.unwrap_or(line.text.len());
        self.line_whole = false;
        if !self.room_for(full_len) {
            return;
        }
        if is_json
            && line.stream == StreamKind::Stdout
            && full_len == line.text.len()
            && line.text.len() <= MAX_TRANSCRIPT_LINE_BYTES
        {
            let head = format!(
                r#"{{"type":"line","t_ms":{},"stream":"stdout","json":"#,
                self.elapsed_ms()
            );
            self.write_parts(&[head.as_bytes(), line.text.as_bytes(), b"}"]);
            self.line_whole = true;
            return;
        }
        let mut text = line.text.as_str();
        if text.len() > MAX_TRANSCRIPT_LINE_BYTES {
            let mut cut = MAX_TRANSCRIPT_LINE_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text = &text[..cut];
        }
        let note = (full_len > text.len())
            .then(|| format!("line truncated: kept {} of {} bytes", text.len(), full_len));
        // stderr lines are few and small: their events are written anyway.
        self.line_whole = note.is_none() && line.stream == StreamKind::Stdout;
        self.write(&LineRecord {
            kind: "line",
            t_ms: self.elapsed_ms(),
            stream: line.stream,
            text,
            note,
        });
    }

    /// Records one normalized event (of the line recorded last). Not written when readers
    /// rebuild it from that line ([`Transcript::create_replayed`]).
    pub fn event(&mut self, event: &AgentEvent) {
        if self.replay && self.line_whole {
            return;
        }
        if !self.room_for(0) {
            return;
        }
        let record = json!({"type": "event", "t_ms": self.elapsed_ms(), "event": event});
        self.write(&record);
    }

    /// Writes what is buffered now, so that a reader of the growing file (`ralph watch`) sees
    /// the agent's latest action while the agent works on it (called after a tool call or a
    /// message, which come seldom; a flood of other lines stays buffered).
    pub fn flush_now(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
            }
            self.flushed = Instant::now();
        }
    }

    /// Writes a free-form record (e.g. the process outcome, ralph's own notes).
    pub fn note(&mut self, kind: &str, data: serde_json::Value) {
        let record = json!({"type": kind, "t_ms": self.elapsed_ms(), "data": data});
        self.write(&record);
    }

    /// Flushes the file.
    ///
    /// # Errors
    /// The first write error seen, or the flush error.
    pub fn finish(mut self) -> std::io::Result<PathBuf> {
        if self.omitted_records > 0 {
            let note = json!({"type": "omitted", "t_ms": self.elapsed_ms(), "data": {
                "records": self.omitted_records, "line_bytes": self.omitted_bytes}});
            self.write(&note);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.path)
    }
}

/// A transcript read back (see [`read`]).
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// The `meta` record's data.
    pub meta: serde_json::Value,
    /// The normalized events, with their time (milliseconds since the agent started).
    pub events: Vec<(u64, AgentEvent)>,
    /// Every record as written (one JSON line each), for `ralph show --raw`.
    pub lines: Vec<String>,
    /// The `end` note's data (how the process ended and the report), when written.
    pub end: Option<serde_json::Value>,
    /// Notes about what was cut or left out (`capped`, `omitted`, truncated lines).
    pub notes: Vec<String>,
}

/// Reads a transcript's lines again into events: a fresh parser of the backend that wrote it.
pub type Replay = Box<dyn FnMut(&OutputLine) -> Vec<AgentEvent>>;

/// Reads the transcript at `path` without rebuilding events: [`Recorded::events`] holds only
/// the events written in the file (all of them in a transcript without `"events":"replay"`).
/// Lines that are not JSON (a torn last line) are kept in [`Recorded::lines`] and otherwise
/// skipped.
///
/// # Errors
/// The file cannot be read.
pub fn read(path: &Path) -> std::io::Result<Recorded> {
    read_with(path, |_| None)
}

/// Reads the transcript at `path` ([`read`]); when its meta record says `"events":"replay"`,
/// `replayer(backend)` gives a parser for the backend named in the meta record, and the events
/// of every stdout line kept whole are rebuilt by feeding it those lines in order (each event
/// gets its line's time), in place among the events written in the file. When `replayer` gives none, only
/// the written events are there, and a note says why.
///
/// # Errors
/// The file cannot be read.
pub fn read_with(
    path: &Path,
    replayer: impl FnOnce(&str) -> Option<Replay>,
) -> std::io::Result<Recorded> {
    let text = std::fs::read_to_string(path)?;
    Ok(parse_with(&text, replayer))
}

/// [`read_with`] on a transcript's text already in memory (e.g. its meta line and the tail of a
/// long, growing one, as `ralph watch` reads it).
pub fn parse_with(text: &str, replayer: impl FnOnce(&str) -> Option<Replay>) -> Recorded {
    let mut out = Recorded::default();
    let mut replayer = Some(replayer);
    let mut replay: Option<Replay> = None;
    for line in text.lines() {
        out.lines.push(line.to_owned());
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            // A `json` line record whose line a `Value` refuses but the parser read (a lone
            // surrogate escape in a field it skips) is still read again.
            if let (Some(replay), Ok(r)) = (
                replay.as_mut(),
                serde_json::from_str::<JsonLineRecord<'_>>(line),
            ) {
                if r.kind == "line" && r.stream == "stdout" {
                    let line = OutputLine::stdout(r.json.get());
                    out.events
                        .extend(replay(&line).into_iter().map(|e| (r.t_ms, e)));
                }
            }
            continue;
        };
        let t = v
            .get("t_ms")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        match v.get("type").and_then(serde_json::Value::as_str) {
            Some("meta") => {
                out.meta = v.get("meta").cloned().unwrap_or_default();
                if v.get("events").and_then(serde_json::Value::as_str) == Some("replay") {
                    let backend = out
                        .meta
                        .get("backend")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default();
                    replay = replayer.take().and_then(|r| r(backend));
                    if replay.is_none() {
                        out.notes.push(format!(
                            "the agent's events are not stored in this transcript and cannot be rebuilt here (backend `{backend}`): see `ralph show --raw`"
                        ));
                    }
                }
            }
            Some("event") => {
                if let Some(e) = v
                    .get("event")
                    .and_then(|e| serde_json::from_value::<AgentEvent>(e.clone()).ok())
                {
                    out.events.push((t, e));
                }
            }
            Some("end") => out.end = v.get("data").cloned(),
            Some("capped") | Some("omitted") => out.notes.push(
                v.get("data")
                    .map(|d| match d.as_str() {
                        Some(s) => s.to_owned(),
                        None => d.to_string(),
                    })
                    .unwrap_or_default(),
            ),
            Some("line") => {
                if let Some(note) = v.get("note").and_then(serde_json::Value::as_str) {
                    // A cut line: its events were written after it.
                    out.notes.push(note.to_owned());
                } else if let Some(replay) = replay.as_mut() {
                    // stderr lines have their events written after them.
                    if let Some(line) =
                        output_line(line, &v).filter(|l| l.stream == StreamKind::Stdout)
                    {
                        out.events.extend(replay(&line).into_iter().map(|e| (t, e)));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A `line` record with its line as JSON, read without building a `Value`.
#[derive(serde::Deserialize)]
struct JsonLineRecord<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    t_ms: u64,
    stream: &'a str,
    #[serde(borrow)]
    json: &'a serde_json::value::RawValue,
}

/// A `line` record (`record` as written, `v` parsed) as the line the parser saw: its `text`, or
/// its `json` exactly as written.
fn output_line(record: &str, v: &serde_json::Value) -> Option<OutputLine> {
    let stream = match v.get("stream").and_then(serde_json::Value::as_str)? {
        "stdout" => StreamKind::Stdout,
        "stderr" => StreamKind::Stderr,
        _ => return None,
    };
    let text = match v.get("text").and_then(serde_json::Value::as_str) {
        Some(text) => text.to_owned(),
        None => serde_json::from_str::<JsonLineRecord<'_>>(record)
            .ok()?
            .json
            .get()
            .to_owned(),
    };
    Some(OutputLine {
        stream,
        text,
        truncated_from: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::StreamKind;

    #[test]
    fn oversized_lines_are_cut_with_a_note_and_meta_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let meta = TranscriptMeta {
            run_id: "r1".into(),
            iteration: 7,
            story_id: "US-001".into(),
            backend: "claude".into(),
            command: "claude -p".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            prompt_bytes: 10,
        };
        let mut t = Transcript::create(dir.path(), &meta).unwrap();
        t.line(&OutputLine {
            stream: StreamKind::Stdout,
            text: "é".repeat(MAX_TRANSCRIPT_LINE_BYTES),
            truncated_from: Some(6_000_000),
        });
        t.event(&AgentEvent::AssistantText { text: "hi".into() });
        let path = t.finish().unwrap();
        assert!(path.ends_with("runs/r1/iter-007.jsonl"));
        let text = std::fs::read_to_string(path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["type"], "meta");
        assert_eq!(
            lines[1]["note"],
            format!(
                "line truncated: kept {} of 6000000 bytes",
                MAX_TRANSCRIPT_LINE_BYTES
            )
        );
        assert!(lines[1]["text"].as_str().unwrap().len() <= MAX_TRANSCRIPT_LINE_BYTES);
        assert_eq!(lines[2]["event"]["kind"], "assistant_text");
    }

    #[test]
    fn past_the_cap_lines_are_counted_not_kept_and_the_end_record_still_comes() {
        let dir = tempfile::tempdir().unwrap();
        let meta = TranscriptMeta {
            run_id: "r1".into(),
            iteration: 1,
            story_id: "US-001".into(),
            backend: "exec".into(),
            command: "x".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            prompt_bytes: 1,
        };
        let mut t = Transcript::create(dir.path(), &meta).unwrap();
        t.cap = 4096;
        for _ in 0..1000 {
            t.line(&OutputLine {
                stream: StreamKind::Stdout,
                text: "y".repeat(100),
                truncated_from: None,
            });
        }
        t.note("end", json!({"exit_code": 0}));
        let path = t.finish().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 8192, "{size} bytes");
        let records: Vec<serde_json::Value> = std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| r["type"].as_str().unwrap())
            .collect();
        assert!(kinds.contains(&"capped"), "{kinds:?}");
        assert_eq!(&kinds[kinds.len() - 2..], ["end", "omitted"]);
        let omitted = &records.last().unwrap()["data"];
        let kept = kinds.iter().filter(|k| **k == "line").count() as u64;
        assert_eq!(omitted["records"].as_u64().unwrap() + kept, 1000);
        assert_eq!(omitted["line_bytes"].as_u64().unwrap(), (1000 - kept) * 100);
    }

    /// A toy parser: a stdout line says its text, a stderr line is an error, a line saying
    /// `two` gives two events and a line saying `none` none.
    fn toy(line: &OutputLine) -> Vec<AgentEvent> {
        match (line.stream, line.text.as_str()) {
            (StreamKind::Stderr, t) => vec![AgentEvent::Error { message: t.into() }],
            (_, "none") => Vec::new(),
            (_, "two") => vec![
                AgentEvent::AssistantText { text: "one".into() },
                AgentEvent::AssistantText { text: "two".into() },
            ],
            (_, t) => vec![AgentEvent::AssistantText { text: t.into() }],
        }
    }

    #[test]
    fn a_replayed_transcript_stores_each_line_once_and_reads_back_the_same_events() {
        let dir = tempfile::tempdir().unwrap();
        let meta = |iteration| TranscriptMeta {
            run_id: "r1".into(),
            iteration,
            story_id: "US-001".into(),
            backend: "claude".into(),
            command: "claude -p".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            prompt_bytes: 1,
        };
        let lines = [
            OutputLine::stdout("hello"),
            OutputLine::stderr("warning: something"),
            OutputLine::stdout("two"),
            OutputLine::stdout("none"),
            OutputLine::stdout("z".repeat(MAX_TRANSCRIPT_LINE_BYTES + 10)),
            OutputLine {
                stream: StreamKind::Stdout,
                text: "cut by the reader".into(),
                truncated_from: Some(1 << 30),
            },
            OutputLine::stdout("{\"json\": \"with \\\"quotes\\\"\"}"),
        ];
        let mut paths = Vec::new();
        for (iteration, replayed) in [(1, false), (2, true)] {
            let create = if replayed {
                Transcript::create_replayed
            } else {
                Transcript::create
            };
            let mut t = create(dir.path(), &meta(iteration)).unwrap();
            for line in &lines {
                t.line(line);
                for e in toy(line) {
                    t.event(&e);
                }
            }
            t.note("end", json!({"exit_code": 0}));
            paths.push(t.finish().unwrap());
        }
        let events = |r: &Recorded| r.events.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>();
        let full = read(&paths[0]).unwrap();
        let replayed = read_with(&paths[1], |backend| {
            assert_eq!(backend, "claude");
            Some(Box::new(toy) as Replay)
        })
        .unwrap();
        assert_eq!(events(&replayed), events(&full));
        assert_eq!(events(&full).len(), 7);
        assert_eq!(replayed.notes, full.notes);
        assert_eq!(replayed.end, full.end);
        // Only the events of the stderr line and the two cut lines are written.
        let written = |p: &Path| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with(r#"{"type":"event""#))
                .count()
        };
        assert_eq!(written(&paths[0]), 7);
        assert_eq!(written(&paths[1]), 3);
        // Without a parser the written events are there, and a note says what is missing.
        let bare = read(&paths[1]).unwrap();
        assert_eq!(bare.events.len(), 3);
        assert!(
            bare.notes[0].contains("cannot be rebuilt"),
            "{:?}",
            bare.notes
        );
    }

    #[test]
    fn json_lines_are_kept_as_json_and_read_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let meta = TranscriptMeta {
            run_id: "r1".into(),
            iteration: 3,
            story_id: "US-001".into(),
            backend: "claude".into(),
            command: "claude -p".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            prompt_bytes: 1,
        };
        let json_lines = [
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"a \"b\"\n\tcafé → \u00e9 \\ /"}]},"n":[1.5e3,-0,null,true]}"#,
            r#"{"z":1,"a":2,"z":3}"#,
            r#"[1,2]"#,
        ];
        let mut t = Transcript::create_replayed(dir.path(), &meta).unwrap();
        for line in json_lines {
            t.line_as(&OutputLine::stdout(line), true);
        }
        // Only whole stdout lines are kept as JSON.
        t.line_as(&OutputLine::stderr(r#"{"on":"stderr"}"#), true);
        t.line_as(&OutputLine::stdout("not json"), false);
        let lone = r#"{"type":"user","skipped":"\ud800"}"#;
        t.line_as(&OutputLine::stdout(lone), true);
        let big = format!(r#"{{"t":"{}"}}"#, "y".repeat(MAX_TRANSCRIPT_LINE_BYTES));
        t.line_as(&OutputLine::stdout(big.clone()), true);
        let path = t.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let records: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| !l.contains(r#"\ud800"#))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(records[1..4].iter().all(|r| r.get("json").is_some()));
        assert_eq!(records[4]["text"], r#"{"on":"stderr"}"#);
        assert_eq!(records[5]["text"], "not json");
        assert!(records[6]["note"]
            .as_str()
            .unwrap()
            .starts_with("line truncated"));
        let mut seen = Vec::new();
        let r = read_with(&path, |_| {
            Some(Box::new(move |l: &OutputLine| {
                vec![AgentEvent::AssistantText {
                    text: l.text.clone(),
                }]
            }) as Replay)
        })
        .unwrap();
        seen.extend(r.events.iter().map(|(_, e)| match e {
            AgentEvent::AssistantText { text } => text.clone(),
            other => panic!("{other:?}"),
        }));
        assert_eq!(
            seen,
            [
                json_lines[0],
                json_lines[1],
                json_lines[2],
                "not json",
                lone
            ]
        );
    }
}
