//! Shared driver of ralph's fuzz targets: turns the fuzzer's bytes into the agent output lines
//! ralph's process supervisor would hand a backend's parser, and the prd.json checks.
//!
//! Input layout for the stream parsers (so a seed file is just a captured transcript):
//! - if the bytes contain a NUL, what comes before the first one is the prompt (lossy UTF-8) and
//!   the rest is the output; otherwise a fixed realistic prompt is used and every byte is output;
//! - output is split on `\n` like `process::lines` does: a trailing `\r` trimmed, invalid UTF-8
//!   replaced, a line longer than [`MAX_LINE_BYTES`] cut there with `truncated_from` set, and a
//!   final line without `\n` still delivered;
//! - a line starting with the byte `0x1E` (record separator) is delivered as stderr, without that
//!   byte; every other line is stdout;
//! - the exit code passed to `finish` is `Some(0)`, `Some(1)` or `None` (killed by a signal),
//!   chosen by the input length modulo 3.

use std::path::Path;

use ralph::agent::{self, AgentSettings};
use ralph::protocol::AgentKind;
use ralph::process::{OutputLine, StreamKind};

/// Longest line delivered uncut, in bytes. Much smaller than ralph's 16 MiB so that the fuzzer
/// reaches cut JSON lines without megabyte inputs.
pub const MAX_LINE_BYTES: usize = 4096;

/// Marks a line as stderr when it is the line's first byte.
const STDERR_MARK: u8 = 0x1e;

/// The prompt used when the input holds no NUL: contains the promise, as ralph's real prompt does,
/// so an echo of it in the output is exercised.
const DEFAULT_PROMPT: &str = "You are working on story US-001 (Add login).\n\
When every story passes, reply with <promise>COMPLETE</promise>.\n";

/// Feeds `data` (layout in the module docs) through a fresh `kind` parser, then `finish`.
/// Panics only if the parser does, or if an event or the report cannot be serialized (ralph
/// writes both into the transcript).
pub fn feed_parser(kind: AgentKind, data: &[u8]) {
    let (prompt, output) = match data.iter().position(|&b| b == 0) {
        Some(at) => (
            String::from_utf8_lossy(&data[..at]).into_owned(),
            &data[at + 1..],
        ),
        None => (DEFAULT_PROMPT.to_owned(), data),
    };
    let settings = AgentSettings {
        agent_cmd: Some("my-agent --flag".to_owned()),
        ..AgentSettings::default()
    };
    let backend = match agent::backend(kind, settings) {
        Ok(backend) => backend,
        Err(err) => panic!("cannot build the {} backend: {err}", kind.as_str()),
    };
    let mut parser = backend.parser(&prompt);
    for line in lines(output) {
        for event in parser.on_line(&line) {
            if let Err(err) = serde_json::to_string(&event) {
                panic!("event {event:?} does not serialize: {err}");
            }
        }
    }
    let exit_code = match data.len() % 3 {
        0 => Some(0),
        1 => Some(1),
        _ => None,
    };
    let report = parser.finish(exit_code);
    if let Err(err) = serde_json::to_string(&report) {
        panic!("report {report:?} does not serialize: {err}");
    }
}

/// Splits `output` into [`OutputLine`]s as described in the module docs.
fn lines(output: &[u8]) -> Vec<OutputLine> {
    let mut parts: Vec<&[u8]> = output.split(|&b| b == b'\n').collect();
    // `split` yields an empty piece after a final `\n`; there is no line there.
    if parts.last().is_some_and(|last| last.is_empty()) {
        parts.pop();
    }
    parts
        .into_iter()
        .map(|raw| {
            let (stream, raw) = match raw.split_first() {
                Some((&STDERR_MARK, rest)) => (StreamKind::Stderr, rest),
                _ => (StreamKind::Stdout, raw),
            };
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let (kept, truncated_from) = if raw.len() > MAX_LINE_BYTES {
                (&raw[..MAX_LINE_BYTES], Some(raw.len()))
            } else {
                (raw, None)
            };
            OutputLine {
                stream,
                text: String::from_utf8_lossy(kept).into_owned(),
                truncated_from,
            }
        })
        .collect()
}

/// Loads `data` as prd.json with ralph's own loader, and for a document it accepts checks that
/// the surgical edits ralph makes keep it valid: flipping each story's `passes` and setting its
/// `notes` must yield a document the loader accepts again, with only that change. Panics on any
/// violation (and when the loader or an edit panics, or an error fails to render).
pub fn check_prd(data: &[u8]) {
    let path = Path::new("prd.json");
    let loaded = match ralph::prd::store::parse_bytes(path, data) {
        Ok(loaded) => loaded,
        Err(err) => {
            // The message is shown to users: rendering it must not panic.
            let _ = err.to_string();
            return;
        }
    };
    let _ = loaded.prd.all_pass();
    let _ = loaded.prd.next_story(&[]);
    for story in &loaded.prd.user_stories {
        let flipped = match ralph::prd::store::set_passes(data, &story.id, !story.passes) {
            Ok(bytes) => bytes,
            Err(err) => panic!("set_passes({}) failed on a valid prd.json: {err}", story.id),
        };
        let again = match ralph::prd::store::parse_bytes(path, &flipped) {
            Ok(again) => again,
            Err(err) => panic!(
                "set_passes({}) produced an invalid prd.json: {err}",
                story.id
            ),
        };
        // Exactly that value changed: the document is otherwise the same.
        let mut expected = loaded.value.clone();
        let target = expected
            .get_mut("userStories")
            .and_then(|stories| stories.as_array_mut())
            .and_then(|stories| {
                stories
                    .iter_mut()
                    .find(|s| s.get("id").and_then(|id| id.as_str()) == Some(story.id.as_str()))
            })
            .and_then(|s| s.as_object_mut());
        match target {
            Some(object) => {
                object.insert("passes".to_owned(), (!story.passes).into());
            }
            None => panic!("story {} is not an object in the parsed value", story.id),
        }
        if again.value != expected {
            panic!(
                "set_passes({}) changed more than its value:\nbefore: {}\nafter:  {}",
                story.id, loaded.value, again.value
            );
        }
        let noted = match ralph::prd::store::set_notes(data, &story.id, "fuzz \"note\"\n") {
            Ok(bytes) => bytes,
            Err(err) => panic!("set_notes({}) failed on a valid prd.json: {err}", story.id),
        };
        if let Err(err) = ralph::prd::store::parse_bytes(path, &noted) {
            panic!(
                "set_notes({}) produced an invalid prd.json: {err}",
                story.id
            );
        }
    }
}
