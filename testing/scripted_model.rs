//! `ralph-scripted-model`: a scripted Anthropic Messages API server, so the real Claude Code CLI
//! can run offline in ralph's end-to-end tests and in `scripts/demo-claude.sh`.
//!
//! It owns the wire protocol a loopback stand-in for the Messages API must speak to Claude Code
//! 2.1.332 (probed in the project's notes on real CLIs): `POST /v1/messages` answered with a
//! `text/event-stream` body of `message_start`, `content_block_*`, `message_delta` and
//! `message_stop` events. Which reply a request gets is decided from the conversation the request
//! carries, never from a request counter, so a CLI retry or an extra side request cannot shift the
//! script:
//!
//! * the story: the first `Story ID: <id>` in the first user message (ralph's prompt);
//! * the repository: the `Primary working directory: <path>` line Claude Code puts in its
//!   environment block (a system block or a `role:"system"` message);
//! * the step: how many `tool_result` blocks the conversation holds.
//!
//! The scenario format and the test harness around it are described in `testing/README-model.md`.
//!
//! Two modes: serve until SIGTERM/SIGINT or the parent dies, or (with `-- COMMAND…`) serve while
//! running one command with `ANTHROPIC_BASE_URL` pointing here, then exit with its status. The
//! second mode exists so that the server and ralph can share one `unshare -n` network namespace.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use serde::Deserialize;
use serde_json::{json, Value};

/// Largest request body read, in bytes; Claude Code's requests are a few hundred KiB.
const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// The text appended to the final answer when every story in prd.json passes.
const PROMISE: &str = "<promise>COMPLETE</promise>";
/// Size of the pieces a text or tool input is streamed in, in bytes (the real API streams
/// small deltas; clients must concatenate them).
const DELTA_CHUNK_BYTES: usize = 64;

/// Command line of `ralph-scripted-model`.
#[derive(Debug, Parser)]
#[command(
    name = "ralph-scripted-model",
    about = "Scripted Anthropic Messages API server for ralph's tests and demo (binds 127.0.0.1 only)"
)]
struct Args {
    /// Scenario JSON: the tool calls and final text to answer for each story id.
    #[arg(long, value_name = "PATH")]
    scenario: PathBuf,
    /// TCP port on 127.0.0.1; 0 picks a free ephemeral port.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Once listening, write the port (decimal, then a newline) to this file, atomically.
    #[arg(long, value_name = "PATH")]
    port_file: Option<PathBuf>,
    /// Append one JSON line per request (story, step, reply kind, status) to this file.
    #[arg(long, value_name = "PATH")]
    log: Option<PathBuf>,
    /// Run this command while serving, with ANTHROPIC_BASE_URL set to this server; stop the
    /// server when it ends and exit with its status (128+N when killed by signal N).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Why a scenario file could not be used.
#[derive(Debug, thiserror::Error)]
enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The scenario path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not JSON of the expected shape.
    #[error("scenario {path} is not valid: {source} (format: testing/README-model.md)")]
    Parse {
        /// The scenario path.
        path: PathBuf,
        /// The JSON error, with line and column.
        source: serde_json::Error,
    },
    /// The JSON parsed but a field breaks a rule.
    #[error("scenario {path}: {at}: {message} (format: testing/README-model.md)")]
    Invalid {
        /// The scenario path.
        path: PathBuf,
        /// Where: `stories.US-001[2]`, `error`, …
        at: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// The scenario file as written (see `testing/README-model.md`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    /// Free text for humans; read only so that it is not refused as unknown.
    #[serde(default, rename = "description")]
    _description: Option<String>,
    /// Story id → steps.
    #[serde(default)]
    stories: BTreeMap<String, Vec<StepFile>>,
    /// When set, every Messages request gets this error.
    #[serde(default)]
    error: Option<ErrorFile>,
}

/// One step as written: exactly one of `tool`, `final`, `error`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepFile {
    /// Tool name for a `tool_use` turn, e.g. `Write`, `Bash`.
    tool: Option<String>,
    /// The tool's input object.
    input: Option<Value>,
    /// Text block sent before the tool call.
    text: Option<String>,
    /// Final text of an `end_turn` turn.
    #[serde(rename = "final")]
    final_text: Option<String>,
    /// When the final text gets the promise; default [`Promise::Auto`].
    promise: Option<Promise>,
    /// An HTTP error instead of a turn.
    error: Option<ErrorFile>,
}

/// An HTTP error reply as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorFile {
    /// HTTP status, 400..=599.
    status: u16,
    /// The API's `error.message`.
    message: String,
    /// The API's `error.type`; default: the one matching `status`.
    #[serde(rename = "type")]
    error_type: Option<String>,
}

/// When the final text gets the completion promise appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Promise {
    /// Iff prd.json in the repository, read when the final turn is answered, has every story
    /// passing.
    Auto,
    /// Always (a premature claim when stories are still open).
    Always,
    /// Never.
    Never,
}

/// A validated scenario.
#[derive(Debug, Clone, PartialEq)]
struct Scenario {
    stories: BTreeMap<String, Vec<Step>>,
    error: Option<ErrorReply>,
}

/// One scripted model turn.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Ask the client to run a tool (`{repo}` and `{story}` are substituted in every string
    /// of `input` and in `text`).
    Tool {
        name: String,
        input: Value,
        text: Option<String>,
    },
    /// End the turn with this text.
    Final { text: String, promise: Promise },
    /// Answer with an HTTP error.
    Error(ErrorReply),
}

/// An HTTP error in the Messages API's envelope.
#[derive(Debug, Clone, PartialEq)]
struct ErrorReply {
    /// HTTP status, 400..=599.
    status: u16,
    /// The API's `error.type`, e.g. `authentication_error`.
    error_type: String,
    /// The API's `error.message`.
    message: String,
}

impl ErrorReply {
    fn new(status: u16, message: impl Into<String>) -> Self {
        ErrorReply {
            status,
            error_type: default_error_type(status).to_owned(),
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.error_type, "message": self.message}})
    }
}

/// The Messages API's `error.type` for an HTTP status.
fn default_error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the file and, for rule violations, the step.
    fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let bytes = fs::read(path).map_err(|source| ScenarioError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: ScenarioFile =
            serde_json::from_slice(&bytes).map_err(|source| ScenarioError::Parse {
                path: path.to_owned(),
                source,
            })?;
        Scenario::from_file(file).map_err(|(at, message)| ScenarioError::Invalid {
            path: path.to_owned(),
            at,
            message,
        })
    }

    /// Validates the parsed file; errors are `(where, what)`.
    fn from_file(file: ScenarioFile) -> Result<Scenario, (String, String)> {
        let error = file
            .error
            .map(|e| error_reply(e).map_err(|m| ("error".to_owned(), m)))
            .transpose()?;
        if file.stories.is_empty() && error.is_none() {
            return Err((
                "stories".to_owned(),
                "no stories and no scenario-level error: add `\"stories\": {\"US-001\": [...]}`"
                    .to_owned(),
            ));
        }
        let mut stories = BTreeMap::new();
        for (id, steps) in file.stories {
            if steps.is_empty() {
                return Err((
                    format!("stories.{id}"),
                    "empty step list: end it with a `final` step".to_owned(),
                ));
            }
            let last = steps.len() - 1;
            let mut parsed = Vec::with_capacity(steps.len());
            for (i, step) in steps.into_iter().enumerate() {
                let at = format!("stories.{id}[{i}]");
                let step = parse_step(step).map_err(|m| (at.clone(), m))?;
                let terminal = !matches!(step, Step::Tool { .. });
                if terminal && i != last {
                    return Err((
                        at,
                        "a `final` or `error` step must be the last one".to_owned(),
                    ));
                }
                if !terminal && i == last {
                    return Err((
                        at,
                        "the last step must be `final` (or `error`): the client needs an answer \
                         after the last tool result"
                            .to_owned(),
                    ));
                }
                parsed.push(step);
            }
            stories.insert(id, parsed);
        }
        Ok(Scenario { stories, error })
    }
}

fn error_reply(e: ErrorFile) -> Result<ErrorReply, String> {
    if !(400..=599).contains(&e.status) {
        return Err(format!(
            "status {} is not an HTTP error (use 400..=599)",
            e.status
        ));
    }
    let mut reply = ErrorReply::new(e.status, e.message);
    if let Some(t) = e.error_type {
        reply.error_type = t;
    }
    Ok(reply)
}

fn parse_step(step: StepFile) -> Result<Step, String> {
    let kinds = [
        step.tool.is_some(),
        step.final_text.is_some(),
        step.error.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err("a step needs exactly one of `tool`, `final` or `error`".to_owned());
    }
    if let Some(name) = step.tool {
        if step.promise.is_some() {
            return Err("`promise` belongs on a `final` step".to_owned());
        }
        let input = step
            .input
            .ok_or_else(|| format!("tool `{name}` needs an `input` object"))?;
        if !input.is_object() {
            return Err(format!("tool `{name}`: `input` must be a JSON object"));
        }
        return Ok(Step::Tool {
            name,
            input,
            text: step.text,
        });
    }
    if step.input.is_some() || step.text.is_some() {
        return Err("`input` and `text` belong on a `tool` step".to_owned());
    }
    if let Some(text) = step.final_text {
        return Ok(Step::Final {
            text,
            promise: step.promise.unwrap_or(Promise::Auto),
        });
    }
    if step.promise.is_some() {
        return Err("`promise` belongs on a `final` step".to_owned());
    }
    match step.error {
        Some(e) => error_reply(e).map(Step::Error),
        None => Err("a step needs exactly one of `tool`, `final` or `error`".to_owned()),
    }
}

/// What the server reads from one Messages request.
#[derive(Debug, Default, Clone, PartialEq)]
struct Conversation {
    /// The first `Story ID: <id>` in the first user message.
    story: Option<String>,
    /// The first `Primary working directory: <path>` in the system prompt or messages.
    repo: Option<String>,
    /// How many `tool_result` blocks the messages hold: the index of the step to answer.
    step: usize,
    /// The text of the latest tool result when it was an error (for the log).
    last_tool_error: Option<String>,
    /// The requested model, echoed back.
    model: Option<String>,
}

/// Collects every string inside `v`, depth first, in document order.
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => map.values().for_each(|i| strings(i, out)),
        _ => {}
    }
}

/// The text right after `marker` up to the end of its line, trimmed; `None` when absent or
/// empty.
fn after_marker<'a>(haystack: &'a str, marker: &str) -> Option<&'a str> {
    let start = haystack.find(marker)? + marker.len();
    let rest = &haystack[start..];
    let line = rest.split(['\n', '\r']).next().unwrap_or("").trim();
    (!line.is_empty()).then_some(line)
}

/// Reads the conversation state from a Messages request body.
fn read_conversation(body: &Value) -> Conversation {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut conv = Conversation {
        model: body.get("model").and_then(Value::as_str).map(str::to_owned),
        ..Conversation::default()
    };
    if let Some(first_user) = messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    {
        let mut texts = Vec::new();
        if let Some(content) = first_user.get("content") {
            strings(content, &mut texts);
        }
        conv.story = texts.iter().find_map(|t| {
            let token = after_marker(t, "Story ID:")?.split_whitespace().next()?;
            // Tolerate Markdown decoration around the id (`US-001`, **US-001**).
            let id = token.trim_matches(|c| matches!(c, '`' | '*' | '"' | '\''));
            (!id.is_empty()).then(|| id.to_owned())
        });
    }
    let mut texts = Vec::new();
    if let Some(system) = body.get("system") {
        strings(system, &mut texts);
    }
    for m in messages {
        strings(m, &mut texts);
    }
    conv.repo = texts
        .iter()
        .find_map(|t| after_marker(t, "Primary working directory:"))
        .map(str::to_owned);
    for block in messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
    {
        conv.step += 1;
        let is_error = block.get("is_error").and_then(Value::as_bool) == Some(true);
        conv.last_tool_error = is_error.then(|| {
            let mut parts = Vec::new();
            if let Some(c) = block.get("content") {
                strings(c, &mut parts);
            }
            let text = parts.concat();
            text.chars().take(500).collect()
        });
    }
    conv
}

/// The reply decided for a Messages request.
#[derive(Debug, Clone, PartialEq)]
enum Turn {
    /// A tool call (already substituted).
    Tool {
        name: String,
        input: Value,
        text: Option<String>,
    },
    /// The final text (already substituted, promise appended when due).
    Final { text: String, promise: bool },
    /// An HTTP error.
    Error(ErrorReply),
}

/// Replaces `{repo}` and `{story}` in every string inside `v`.
fn substitute(v: &Value, repo: &str, story: &str) -> Value {
    match v {
        Value::String(s) => Value::String(subst_str(s, repo, story)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| substitute(i, repo, story)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, i)| (k.clone(), substitute(i, repo, story)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn subst_str(s: &str, repo: &str, story: &str) -> String {
    s.replace("{repo}", repo).replace("{story}", story)
}

/// Whether `<repo>/prd.json` has at least one story and every story has `passes: true`.
///
/// # Errors
/// A message naming the file when it cannot be read or has no `userStories` array.
fn all_stories_pass(repo: &Path) -> Result<bool, String> {
    let path = repo.join("prd.json");
    let bytes = fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let prd: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let stories = prd
        .get("userStories")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{} has no `userStories` array", path.display()))?;
    Ok(!stories.is_empty()
        && stories
            .iter()
            .all(|s| s.get("passes").and_then(Value::as_bool) == Some(true)))
}

/// Decides the reply for `conv` from the scenario.
fn decide(scenario: &Scenario, conv: &Conversation) -> Turn {
    if let Some(e) = &scenario.error {
        return Turn::Error(e.clone());
    }
    let Some(story) = conv.story.as_deref() else {
        return Turn::Error(ErrorReply::new(
            400,
            "ralph-scripted-model: no `Story ID: <id>` line in the first user message, so no \
             scripted story applies",
        ));
    };
    let Some(steps) = scenario.stories.get(story) else {
        let known: Vec<&str> = scenario.stories.keys().map(String::as_str).collect();
        return Turn::Error(ErrorReply::new(
            400,
            format!(
                "ralph-scripted-model: the scenario has no story `{story}` (it scripts: {})",
                known.join(", ")
            ),
        ));
    };
    let Some(step) = steps.get(conv.step) else {
        return Turn::Error(ErrorReply::new(
            400,
            format!(
                "ralph-scripted-model: story `{story}` has {} steps but the conversation already \
                 holds {} tool results",
                steps.len(),
                conv.step
            ),
        ));
    };
    let Some(repo) = conv.repo.as_deref() else {
        return Turn::Error(ErrorReply::new(
            400,
            "ralph-scripted-model: no `Primary working directory: <path>` in the request, so \
             `{repo}` cannot be substituted",
        ));
    };
    match step {
        Step::Tool { name, input, text } => Turn::Tool {
            name: name.clone(),
            input: substitute(input, repo, story),
            text: text.as_deref().map(|t| subst_str(t, repo, story)),
        },
        Step::Final { text, promise } => {
            let promise = match promise {
                Promise::Always => true,
                Promise::Never => false,
                // An unreadable prd.json means "not complete": the server must not claim more
                // than the files show.
                Promise::Auto => all_stories_pass(Path::new(repo)).unwrap_or(false),
            };
            let mut text = subst_str(text, repo, story);
            if promise {
                text.push('\n');
                text.push_str(PROMISE);
            }
            Turn::Final { text, promise }
        }
        Step::Error(e) => Turn::Error(e.clone()),
    }
}

/// Splits `s` into pieces of at most [`DELTA_CHUNK_BYTES`] bytes on char boundaries.
fn chunks(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = rest.len().min(DELTA_CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (head, tail) = rest.split_at(end);
        out.push(head);
        rest = tail;
    }
    if out.is_empty() {
        out.push("");
    }
    out
}

/// Renders one streamed Messages reply (SSE `event:`/`data:` pairs) for a tool call or a final
/// text. `input_tokens` and the output token count are rough byte/4 estimates, deterministic.
fn render_sse(turn: &Turn, model: &str, msg_id: &str, tool_id: &str, input_tokens: u64) -> String {
    let mut events: Vec<(&str, Value)> = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    let mut index = 0;
    let mut out_bytes = 0;
    let mut text_block = |events: &mut Vec<(&str, Value)>, index: &mut usize, text: &str| {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": *index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in chunks(text) {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": *index,
                       "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": *index}),
        ));
        *index += 1;
        out_bytes += text.len();
    };
    let stop_reason = match turn {
        Turn::Tool { name, input, text } => {
            if let Some(t) = text {
                text_block(&mut events, &mut index, t);
            }
            let partial = input.to_string();
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}}),
            ));
            for piece in chunks(&partial) {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
            out_bytes += partial.len();
            "tool_use"
        }
        Turn::Final { text, .. } => {
            text_block(&mut events, &mut index, text);
            "end_turn"
        }
        // Errors are not streamed; see `respond_error`.
        Turn::Error(_) => "end_turn",
    };
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": out_bytes as u64 / 4 + 1}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    let mut body = String::new();
    for (name, data) in events {
        body.push_str("event: ");
        body.push_str(name);
        body.push_str("\ndata: ");
        body.push_str(&data.to_string());
        body.push_str("\n\n");
    }
    body
}

/// One line of the request log.
#[derive(Debug, Default, serde::Serialize)]
struct LogEntry {
    /// RFC 3339 UTC time the reply was sent.
    ts: String,
    method: String,
    path: String,
    /// HTTP status sent.
    status: u16,
    /// `tool_use`, `text`, `error`, `count_tokens`, `ok` (HEAD/GET) or `not_found`.
    reply: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    story: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    promise: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_tool_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// Shared state of the request handlers.
struct ServerState {
    scenario: Scenario,
    log: Option<Mutex<File>>,
    /// Source of unique message and tool-use ids.
    counter: AtomicU64,
}

impl ServerState {
    fn write_log(&self, mut entry: LogEntry) {
        let Some(log) = &self.log else { return };
        entry.ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let Ok(mut line) = serde_json::to_string(&entry) else {
            return;
        };
        line.push('\n');
        // A poisoned lock only means another handler panicked mid-write; keep logging.
        let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            eprintln!("ralph-scripted-model: warning: cannot write the request log: {e}");
        }
    }

    /// Answers one request. The log line is written before the reply is sent, so whoever got
    /// the reply can already read its log line.
    fn handle(&self, mut req: tiny_http::Request) {
        let method = req.method().as_str().to_owned();
        let url = req.url().to_owned();
        let path = url.split('?').next().unwrap_or("").to_owned();
        let mut entry = LogEntry {
            method: method.clone(),
            path: path.clone(),
            ..LogEntry::default()
        };
        let response = match (method.as_str(), path.as_str()) {
            ("HEAD" | "GET", _) => {
                entry.reply = "ok";
                json_response(200, &json!({"ok": true, "server": "ralph-scripted-model"}))
            }
            ("POST", "/v1/messages" | "/v1/messages/count_tokens") => {
                let mut raw = Vec::new();
                let read = req.as_reader().take(MAX_BODY_BYTES).read_to_end(&mut raw);
                let parsed = read
                    .map_err(|e| format!("cannot read the request body: {e}"))
                    .and_then(|_| {
                        serde_json::from_slice::<Value>(&raw)
                            .map_err(|e| format!("the request body is not JSON: {e}"))
                    });
                match parsed {
                    Err(message) => error_response(
                        &ErrorReply::new(400, format!("ralph-scripted-model: {message}")),
                        &mut entry,
                    ),
                    Ok(_) if path.ends_with("/count_tokens") => {
                        entry.reply = "count_tokens";
                        json_response(200, &json!({"input_tokens": raw.len() / 4 + 1}))
                    }
                    Ok(body) => self.messages(&body, raw.len(), &mut entry),
                }
            }
            _ => {
                let response = error_response(
                    &ErrorReply::new(
                        404,
                        format!(
                            "ralph-scripted-model: no route for {method} {path}; it serves \
                             POST /v1/messages, POST /v1/messages/count_tokens, and HEAD/GET"
                        ),
                    ),
                    &mut entry,
                );
                entry.reply = "not_found";
                response
            }
        };
        entry.status = response.status_code().0;
        self.write_log(entry);
        if let Err(e) = req.respond(response) {
            eprintln!("ralph-scripted-model: warning: cannot answer {method} {url}: {e}");
        }
    }

    /// The reply to a Messages request, and what the log should say about it.
    fn messages(&self, body: &Value, body_len: usize, entry: &mut LogEntry) -> Response {
        let conv = read_conversation(body);
        entry.story = conv.story.clone();
        entry.step = Some(conv.step);
        entry.repo = conv.repo.clone();
        entry.last_tool_error = conv.last_tool_error.clone();
        let turn = decide(&self.scenario, &conv);
        match &turn {
            Turn::Error(e) => return error_response(e, entry),
            Turn::Tool { name, .. } => {
                entry.reply = "tool_use";
                entry.tool = Some(name.clone());
            }
            Turn::Final { promise, .. } => {
                entry.reply = "text";
                entry.promise = Some(*promise);
            }
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let msg_id = format!("msg_scripted_{n:06}");
        let tool_id = format!("toolu_scripted_{n:06}");
        let model = conv.model.as_deref().unwrap_or("scripted-model");
        let sse = render_sse(&turn, model, &msg_id, &tool_id, body_len as u64 / 4 + 1);
        with_headers(
            tiny_http::Response::from_data(sse.into_bytes()),
            &[
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Cache-Control", "no-cache"),
                ("request-id", &format!("req_scripted_{n:06}")),
            ],
        )
    }
}

/// Every reply is built in memory first.
type Response = tiny_http::Response<io::Cursor<Vec<u8>>>;

/// An API error reply; records it in `entry`.
fn error_response(e: &ErrorReply, entry: &mut LogEntry) -> Response {
    entry.reply = "error";
    entry.message = Some(e.message.clone());
    json_response(e.status, &e.body())
}

/// Adds `headers` to `response`. The names and values are ASCII built in this file, which
/// `tiny_http` always accepts; one it refused would only be left out.
fn with_headers<R: Read>(
    mut response: tiny_http::Response<R>,
    headers: &[(&str, &str)],
) -> tiny_http::Response<R> {
    for (name, value) in headers {
        if let Ok(h) = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(h);
        }
    }
    response
}

fn json_response(status: u16, body: &Value) -> Response {
    with_headers(
        tiny_http::Response::from_data(body.to_string().into_bytes()).with_status_code(status),
        &[("Content-Type", "application/json")],
    )
}

/// Writes `port` to `path` via a temporary file and a rename, so a reader polling the file
/// never sees a partial number.
fn write_port_file(path: &Path, port: u16) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, format!("{port}\n"))?;
    fs::rename(&tmp, path)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ralph-scripted-model: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let scenario = Scenario::load(&args.scenario)?;
    let run_mode = !args.command.is_empty();

    // SIGTERM (and the parent's death, delivered as SIGTERM) ends serving, or is forwarded to
    // the command in run mode. SIGINT ends serving; in run mode it is only swallowed, since a
    // terminal's Ctrl-C already reaches the command through the process group, and forwarding
    // it would look like a second Ctrl-C to ralph.
    let term = Arc::new(AtomicBool::new(false));
    let int = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&term))
        .context("cannot install the SIGTERM handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&int))
        .context("cannot install the SIGINT handler")?;
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .context("cannot set the parent-death signal")?;
    let parent_gone = move || nix::unistd::getppid() != parent;

    let log = args
        .log
        .as_deref()
        .map(|p| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open the request log {}", p.display()))
        })
        .transpose()?
        .map(Mutex::new);

    let server = tiny_http::Server::http(("127.0.0.1", args.port))
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{}: {e}", args.port))?;
    let port = server
        .server_addr()
        .to_ip()
        .map(|a| a.port())
        .context("the server is not bound to a TCP address")?;
    if let Some(p) = &args.port_file {
        write_port_file(p, port)
            .with_context(|| format!("cannot write the port file {}", p.display()))?;
    }
    let banner = format!("listening on http://127.0.0.1:{port}");
    if run_mode {
        // stdout belongs to the command.
        eprintln!("ralph-scripted-model: {banner}");
    } else {
        println!("{banner}");
        io::stdout().flush().context("cannot write to stdout")?;
    }

    let state = Arc::new(ServerState {
        scenario,
        log,
        counter: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = Arc::clone(&stop);
        let state = Arc::clone(&state);
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match server.recv_timeout(Duration::from_millis(100)) {
                    Ok(Some(req)) => {
                        let state = Arc::clone(&state);
                        thread::spawn(move || state.handle(req));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("ralph-scripted-model: error: accepting a request failed: {e}");
                        break;
                    }
                }
            }
        })
    };

    let code = if run_mode {
        run_command(&args.command, port, &term, &parent_gone)?
    } else {
        while !term.load(Ordering::SeqCst) && !int.load(Ordering::SeqCst) && !parent_gone() {
            thread::sleep(Duration::from_millis(50));
        }
        ExitCode::SUCCESS
    };
    stop.store(true, Ordering::SeqCst);
    // The acceptor wakes within its 100 ms poll; a panic there has already been printed.
    let _ = acceptor.join();
    Ok(code)
}

/// Runs `command` with `ANTHROPIC_BASE_URL` pointing at the server, forwarding SIGTERM (or the
/// parent's death) to it as SIGTERM, and returns its exit status as ours.
fn run_command(
    command: &[OsString],
    port: u16,
    term: &AtomicBool,
    parent_gone: &dyn Fn() -> bool,
) -> anyhow::Result<ExitCode> {
    let (program, rest) = command
        .split_first()
        .context("no command given after `--`")?;
    let mut child = Command::new(program)
        .args(rest)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .spawn()
        .with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(child.id()).context("the child's pid does not fit in an i32")?,
    );
    let mut forwarded = false;
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for the command")? {
            use std::os::unix::process::ExitStatusExt as _;
            let code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1);
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        if !forwarded && (term.load(Ordering::SeqCst) || parent_gone()) {
            // The child may have exited in between; then there is nothing to signal.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            forwarded = true;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(v: Value) -> Result<Scenario, (String, String)> {
        Scenario::from_file(serde_json::from_value(v).expect("scenario JSON shape"))
    }

    fn two_step() -> Scenario {
        scenario(json!({"stories": {"US-001": [
            {"tool": "Write", "input": {"file_path": "{repo}/a.txt", "content": "{story}"}},
            {"final": "Implemented {story}."}
        ]}}))
        .expect("valid scenario")
    }

    fn request(story_line: &str, repo: &str, tool_results: usize) -> Value {
        let mut messages = vec![
            json!({"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": format!("Work on this.\n{story_line}\nTitle: x")}]}),
            json!({"role": "system", "content": format!("Here is env:\nPrimary working directory: {repo}\nIs git: yes")}),
        ];
        for i in 0..tool_results {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": format!("t{i}"), "name": "Bash", "input": {}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "boom", "is_error": true}]}));
        }
        json!({"model": "claude-x", "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages})
    }

    #[test]
    fn reads_story_repo_and_step_from_the_conversation() {
        let conv = read_conversation(&request("Story ID: `US-007`", "/w/repo", 2));
        assert_eq!(conv.story.as_deref(), Some("US-007"));
        assert_eq!(conv.repo.as_deref(), Some("/w/repo"));
        assert_eq!(conv.step, 2);
        assert_eq!(conv.last_tool_error.as_deref(), Some("boom"));
        assert_eq!(conv.model.as_deref(), Some("claude-x"));
    }

    #[test]
    fn story_id_only_counts_in_the_first_user_message() {
        let mut req = request("no id here", "/w", 0);
        req["messages"]
            .as_array_mut()
            .expect("messages")
            .push(json!({"role": "user", "content": "Story ID: US-9"}));
        assert_eq!(read_conversation(&req).story, None);
    }

    #[test]
    fn tool_steps_substitute_repo_and_story() {
        let turn = decide(
            &two_step(),
            &read_conversation(&request("Story ID: US-001", "/w/r", 0)),
        );
        assert_eq!(
            turn,
            Turn::Tool {
                name: "Write".into(),
                input: json!({"file_path": "/w/r/a.txt", "content": "US-001"}),
                text: None
            }
        );
    }

    #[test]
    fn final_text_gets_the_promise_only_when_prd_has_every_story_passing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().to_str().expect("utf-8 path").to_owned();
        let prd = |passes: [bool; 2]| {
            json!({"userStories": [{"id": "A", "passes": passes[0]}, {"id": "B", "passes": passes[1]}]})
                .to_string()
        };
        let conv = read_conversation(&request("Story ID: US-001", &repo, 1));

        fs::write(dir.path().join("prd.json"), prd([true, false])).expect("write prd");
        assert_eq!(
            decide(&two_step(), &conv),
            Turn::Final {
                text: "Implemented US-001.".into(),
                promise: false
            }
        );

        fs::write(dir.path().join("prd.json"), prd([true, true])).expect("write prd");
        assert_eq!(
            decide(&two_step(), &conv),
            Turn::Final {
                text: format!("Implemented US-001.\n{PROMISE}"),
                promise: true
            }
        );

        fs::remove_file(dir.path().join("prd.json")).expect("remove prd");
        assert!(matches!(
            decide(&two_step(), &conv),
            Turn::Final { promise: false, .. }
        ));
    }

    #[test]
    fn unknown_story_and_exhausted_steps_are_400s_that_say_why() {
        let s = two_step();
        let Turn::Error(e) = decide(
            &s,
            &read_conversation(&request("Story ID: US-404", "/w", 0)),
        ) else {
            panic!("expected an error reply")
        };
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains("no story `US-404`") && e.message.contains("US-001"),
            "{}",
            e.message
        );

        let Turn::Error(e) = decide(
            &s,
            &read_conversation(&request("Story ID: US-001", "/w", 5)),
        ) else {
            panic!("expected an error reply")
        };
        assert!(e.message.contains("has 2 steps"), "{}", e.message);
    }

    #[test]
    fn scenario_level_error_answers_every_request() {
        let s = scenario(json!({"error": {"status": 401, "message": "invalid x-api-key"}}))
            .expect("valid");
        let turn = decide(&s, &Conversation::default());
        assert_eq!(
            turn,
            Turn::Error(ErrorReply {
                status: 401,
                error_type: "authentication_error".into(),
                message: "invalid x-api-key".into()
            })
        );
    }

    #[test]
    fn invalid_scenarios_name_the_step_and_the_fix() {
        let (at, msg) = scenario(json!({"stories": {"US-1": [{"final": "x"}, {"final": "y"}]}}))
            .expect_err("final not last");
        assert_eq!(at, "stories.US-1[0]");
        assert!(msg.contains("last"), "{msg}");

        let (at, msg) = scenario(json!({"stories": {"US-1": [{"tool": "Bash", "input": {}}]}}))
            .expect_err("no final");
        assert_eq!(at, "stories.US-1[0]");
        assert!(msg.contains("must be `final`"), "{msg}");

        let (_, msg) = scenario(json!({"stories": {"US-1": [{"tool": "Bash", "final": "x"}]}}))
            .expect_err("two kinds");
        assert!(msg.contains("exactly one"), "{msg}");

        let (at, _) = scenario(json!({"error": {"status": 200, "message": "x"}})).expect_err("200");
        assert_eq!(at, "error");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.json");
        fs::write(&path, r#"{"stories": {}, "typo": 1}"#).expect("write");
        let err = Scenario::load(&path)
            .expect_err("unknown field")
            .to_string();
        assert!(err.contains("typo") && err.contains("s.json"), "{err}");
    }

    /// Parses an SSE body back into `(event, data)` pairs.
    fn events(body: &str) -> Vec<(String, Value)> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut lines = e.lines();
                let name = lines
                    .next()
                    .and_then(|l| l.strip_prefix("event: "))
                    .expect("event line");
                let data = lines
                    .next()
                    .and_then(|l| l.strip_prefix("data: "))
                    .expect("data line");
                (
                    name.to_owned(),
                    serde_json::from_str(data).expect("data is JSON"),
                )
            })
            .collect()
    }

    #[test]
    fn tool_use_streams_input_json_that_reassembles_to_the_input() {
        let long = "é".repeat(100);
        let input = json!({"command": long, "description": "run"});
        let turn = Turn::Tool {
            name: "Bash".into(),
            input: input.clone(),
            text: Some("Running.".into()),
        };
        let ev = events(&render_sse(&turn, "m", "msg_1", "toolu_1", 10));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        let partial: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .map(|(_, d)| d["delta"]["partial_json"].as_str().expect("str").to_owned())
            .collect();
        assert!(
            ev.iter()
                .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
                .count()
                > 1
        );
        assert_eq!(
            serde_json::from_str::<Value>(&partial).expect("json"),
            input
        );
        let start = ev
            .iter()
            .find(|(_, d)| d["content_block"]["type"] == "tool_use")
            .expect("tool_use block");
        assert_eq!(start.1["index"], 1, "the text block comes first");
        assert_eq!(start.1["content_block"]["id"], "toolu_1");
        let delta = ev
            .iter()
            .find(|(n, _)| n == "message_delta")
            .expect("message_delta");
        assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn final_text_streams_as_text_deltas_with_end_turn() {
        let turn = Turn::Final {
            text: "Done.\n<promise>COMPLETE</promise>".into(),
            promise: true,
        };
        let ev = events(&render_sse(&turn, "m", "msg_1", "toolu_1", 10));
        let text: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .map(|(_, d)| d["delta"]["text"].as_str().expect("str").to_owned())
            .collect();
        assert_eq!(text, "Done.\n<promise>COMPLETE</promise>");
        let delta = ev
            .iter()
            .find(|(n, _)| n == "message_delta")
            .expect("message_delta");
        assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    }
}
