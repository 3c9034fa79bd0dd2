//! The codex dialect of `ralph-fake-agent`: actions that print `codex exec --json` lines the way
//! `@openai/codex@0.171.0` does (`notes/real-clis.md` §2, `notes/agent-protocols.md` §2).
//!
//! One `{"codex": {ACTION: ARG}}` per action, exactly one key:
//! - `{"start": {"thread_id": "…"}}` (`{}` for a made-up id): `thread.started`, `turn.started`.
//! - `{"warning": "text"}`: a non-fatal `item.completed` of type `error` (0.171.0 prints one
//!   for any model it has no metadata for).
//! - `{"reasoning": "text"}`: an `item.completed` reasoning item.
//! - `{"message": "text"}`: an `item.completed` agent_message (the last one is the final text).
//! - `{"command": {"command": "cargo test", "output": "…", "exit_code": 0}}`: `item.started`
//!   then `item.completed` of a `command_execution`, the command wrapped in `/bin/bash -lc '…'`;
//!   a non-zero exit code gives `status: "failed"`. `output` and `exit_code` default to `""`, 0.
//! - `{"file_change": [{"path": "/abs/src/lib.rs", "kind": "update"}]}`: an `item.completed`
//!   file_change (kinds `add`, `delete`, `update`).
//! - `{"error": "text"}`: a top-level `error` event (retry chatter such as
//!   `Reconnecting... 1/5 (…)`).
//! - `{"completed": {usage}}`: `turn.completed` with that usage object; `{}` gives
//!   `{"input_tokens":24763,"cached_input_tokens":24448,"cache_write_input_tokens":0,
//!   "output_tokens":122,"reasoning_output_tokens":64}`.
//! - `{"failed": "message"}`: the `error` event, then `turn.failed` with the same message (follow
//!   it with `{"exit": 1}`, as codex exits 1).
//! - `{"usage_limit": {"at": "3:28 PM"}}`: the documented usage-limit failure, `error` then
//!   `turn.failed` with `You've hit your usage limit. Upgrade to Pro
//!   (https://chatgpt.com/explore/pro), visit https://chatgpt.com/codex/settings/usage to purchase
//!   more credits or try again at <at>.`, then **exit 1** at once (nothing after it runs).
//!   `at` defaults to `3:28 PM`; `{"at": null}` gives codex's `… Try again later.` form.

use std::io::Write;

use anyhow::Context;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::Dialect;

/// The usage-limit text without a reset time (0.171.0: a 429 `usage_limit_reached` without
/// `resets_at`).
const LIMIT_LATER: &str = "You've hit your usage limit. Try again later.";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Action {
    Start(Start),
    Warning(String),
    Reasoning(String),
    Message(String),
    Command(Command),
    FileChange(Vec<Change>),
    Error(String),
    Completed(Value),
    Failed(String),
    UsageLimit(UsageLimit),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Start {
    thread_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Command {
    command: String,
    #[serde(default)]
    output: String,
    #[serde(default)]
    exit_code: i32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    path: String,
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageLimit {
    #[serde(default = "default_reset")]
    at: Option<String>,
}

fn default_reset() -> Option<String> {
    Some("3:28 PM".to_owned())
}

/// Plays one `{"codex": ...}` action.
///
/// # Errors
/// An action of unknown shape (the fake then exits 97 naming it), or a failed write to stdout.
pub fn play(action: &Value, d: &mut Dialect<'_>) -> anyhow::Result<()> {
    let parsed: Action = serde_json::from_value(action.clone()).with_context(|| {
        format!("not a codex action (see testing/fake_agent/codex.rs): {action}")
    })?;
    match parsed {
        Action::Start(start) => {
            let thread_id = start
                .thread_id
                .unwrap_or_else(|| format!("01a2296e-6a57-73f3-82f0-{:012x}", d.n));
            d.line(&json!({"type": "thread.started", "thread_id": thread_id}))?;
            d.line(&json!({"type": "turn.started"}))
        }
        Action::Warning(message) => item(d, "error", json!({"message": message})),
        Action::Reasoning(text) => item(d, "reasoning", json!({"text": text})),
        Action::Message(text) => item(d, "agent_message", json!({"text": text})),
        Action::Command(c) => {
            let id = format!("item_{}", d.next_id());
            let command = format!("/bin/bash -lc '{}'", c.command.replace('\'', r"'\''"));
            d.line(&json!({"type": "item.started", "item": {
                "id": id, "type": "command_execution", "command": command,
                "aggregated_output": "", "exit_code": null, "status": "in_progress"}}))?;
            let status = if c.exit_code == 0 {
                "completed"
            } else {
                "failed"
            };
            d.line(&json!({"type": "item.completed", "item": {
                "id": id, "type": "command_execution", "command": command,
                "aggregated_output": c.output, "exit_code": c.exit_code, "status": status}}))
        }
        Action::FileChange(changes) => {
            let changes: Vec<Value> = changes
                .iter()
                .map(|c| json!({"path": c.path, "kind": c.kind}))
                .collect();
            item(
                d,
                "file_change",
                json!({"changes": changes, "status": "completed"}),
            )
        }
        Action::Error(message) => d.line(&json!({"type": "error", "message": message})),
        Action::Completed(usage) => {
            let usage = match usage {
                Value::Object(map) if !map.is_empty() => Value::Object(map),
                _ => json!({"input_tokens": 24763, "cached_input_tokens": 24448,
                    "cache_write_input_tokens": 0, "output_tokens": 122,
                    "reasoning_output_tokens": 64}),
            };
            d.line(&json!({"type": "turn.completed", "usage": usage}))
        }
        Action::Failed(message) => failed(d, &message),
        Action::UsageLimit(limit) => {
            let message = match limit.at {
                Some(at) => format!(
                    "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), \
                     visit https://chatgpt.com/codex/settings/usage to purchase more credits or \
                     try again at {at}."
                ),
                None => LIMIT_LATER.to_owned(),
            };
            failed(d, &message)?;
            std::io::stdout().flush().context("flushing stdout")?;
            // codex exits 1 after a failed turn; nothing the script adds may follow it.
            std::process::exit(1)
        }
    }
}

/// One `item.completed` line: `{"id": "item_N", "type": kind, …fields}` (codex's key order).
fn item(d: &mut Dialect<'_>, kind: &str, fields: Value) -> anyhow::Result<()> {
    let mut item = serde_json::Map::new();
    item.insert("id".to_owned(), json!(format!("item_{}", d.next_id())));
    item.insert("type".to_owned(), json!(kind));
    if let Value::Object(fields) = fields {
        item.extend(fields);
    }
    d.line(&json!({"type": "item.completed", "item": item}))
}

/// The `error` event codex prints, then `turn.failed` with the same message.
fn failed(d: &mut Dialect<'_>, message: &str) -> anyhow::Result<()> {
    d.line(&json!({"type": "error", "message": message}))?;
    d.line(&json!({"type": "turn.failed", "error": {"message": message}}))
}
