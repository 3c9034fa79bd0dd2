//! The opencode dialect of `ralph-fake-agent`: `opencode run --format json` lines, shaped like
//! what opencode 1.18.33 prints (`notes/real-clis.md` §3, `notes/agent-protocols.md` §4). Every
//! line carries `type`, `timestamp` (epoch ms) and `sessionID` (`ses_fake_<n>`); parts carry
//! ids and the current step's `messageID`.
//!
//! Actions, `{"opencode": {KEY: VALUE}}` with exactly one key:
//! - `{"step_start": {}}`: a new step (a new assistant message).
//! - `{"text": "..."}`: a completed text part.
//! - `{"tool": {"tool": "bash", "input": {...}, "output": "..", "error": ".."}}`: a finished
//!   tool part; `status` is `error` when `error` is given, else `completed`.
//! - `{"step_finish": {"reason": "stop", "cost": 0.001, "tokens": {...}}}`: all fields
//!   optional (defaults: `stop`, 0.001 USD, 100 input / 10 output tokens).
//! - `{"final": "text"}`: `step_start`, the text part, `step_finish` with reason `stop`.
//! - `{"tool_step": {TOOL}}`: `step_start`, the tool part, `step_finish` with `tool-calls`.
//! - `{"error": {"name": "APIError", "data": {...}}}`: an `error` event with that error object.
//! - `{"rate_limit": {}}`: the 429 error event (`APIError`, "Rate limit exceeded",
//!   `isRetryable: true`); `{"rate_limit": {"quota": true}}` gives OpenAI's
//!   `insufficient_quota` body instead, with `retry-after: 3600`.
//! - `{"auth_error": {"message": ".."}}`: a `ProviderAuthError` event (message optional).
//! - `{"done": {}}`: the `done` event newer builds print.
//!
//! Follow an error with `{"exit": 1}`, as opencode does.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::Dialect;

/// The current step's number (its `messageID`); one process plays one invocation.
static STEP: AtomicU64 = AtomicU64::new(0);

/// Plays one `{"opencode": ...}` action.
///
/// # Errors
/// An action that is not an object with exactly one known key, or a write error.
pub fn play(action: &Value, d: &mut Dialect<'_>) -> anyhow::Result<()> {
    let obj = action
        .as_object()
        .filter(|o| o.len() == 1)
        .with_context(|| format!("an opencode action is an object with one key, got {action}"))?;
    let Some((key, value)) = obj.iter().next() else {
        bail!("an opencode action is an object with one key, got {action}");
    };
    match key.as_str() {
        "step_start" => step_start(d),
        "text" => {
            let text = value
                .as_str()
                .with_context(|| format!("opencode `text` needs a string, got {value}"))?;
            text_part(d, text)
        }
        "tool" => tool_part(d, value),
        "step_finish" => step_finish(d, value),
        "final" => {
            let text = value
                .as_str()
                .with_context(|| format!("opencode `final` needs a string, got {value}"))?;
            step_start(d)?;
            text_part(d, text)?;
            step_finish(d, &json!({"reason": "stop"}))
        }
        "tool_step" => {
            step_start(d)?;
            tool_part(d, value)?;
            step_finish(d, &json!({"reason": "tool-calls"}))
        }
        "error" => event(d, "error", "error", value.clone()),
        "rate_limit" => {
            let error = if value.get("quota").and_then(Value::as_bool) == Some(true) {
                let message =
                    "You exceeded your current quota, please check your plan and billing details.";
                let body = json!({"error": {"message": message, "type": "insufficient_quota",
                                            "param": null, "code": "insufficient_quota"}});
                json!({"name": "APIError", "data": {"message": message, "statusCode": 429,
                    "isRetryable": true,
                    "responseHeaders": {"content-type": "application/json", "retry-after": "3600"},
                    "responseBody": body.to_string(),
                    "metadata": {"url": "https://api.openai.com/v1/chat/completions"}}})
            } else {
                json!({"name": "APIError", "data": {"message": "Rate limit exceeded",
                    "statusCode": 429, "isRetryable": true}})
            };
            event(d, "error", "error", error)
        }
        "auth_error" => {
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("No API key found for provider anthropic");
            let error = json!({"name": "ProviderAuthError",
                               "data": {"providerID": "anthropic", "message": message}});
            event(d, "error", "error", error)
        }
        "done" => {
            let line = json!({"type": "done", "timestamp": now_ms(), "sessionID": session(d),
                              "reason": "idle", "rejected": []});
            d.line(&line)
        }
        other => bail!(
            "unknown opencode action `{other}` (known: step_start, text, tool, step_finish, \
             final, tool_step, error, rate_limit, auth_error, done)"
        ),
    }
}

fn session(d: &Dialect<'_>) -> String {
    format!("ses_fake_{}", d.n)
}

fn message_id(d: &Dialect<'_>) -> String {
    format!("msg_fake_{}_{}", d.n, STEP.load(Ordering::Relaxed))
}

/// The current time in epoch milliseconds, as opencode stamps its lines (a reset time the
/// fake reports, e.g. `retry-after`, is then relative to now).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Prints `{"type": kind, "timestamp", "sessionID", field: value}`.
fn event(d: &mut Dialect<'_>, kind: &str, field: &str, value: Value) -> anyhow::Result<()> {
    let mut line = json!({"type": kind, "timestamp": now_ms(), "sessionID": session(d)});
    if let Some(obj) = line.as_object_mut() {
        obj.insert(field.to_owned(), value);
    }
    d.line(&line)
}

/// A part with the common fields filled in.
fn part(d: &mut Dialect<'_>, kind: &str, mut fields: Value) -> Value {
    let seq = d.next_id();
    let id = format!("prt_fake_{}_{seq}", d.n);
    if let Some(obj) = fields.as_object_mut() {
        obj.insert("id".into(), json!(id));
        obj.insert("sessionID".into(), json!(session(d)));
        obj.insert("messageID".into(), json!(message_id(d)));
        obj.insert("type".into(), json!(kind));
    }
    fields
}

fn step_start(d: &mut Dialect<'_>) -> anyhow::Result<()> {
    STEP.fetch_add(1, Ordering::Relaxed);
    let p = part(
        d,
        "step-start",
        json!({"snapshot": "4b825dc642cb6eb9a060e54bf8d69288fbee4904"}),
    );
    event(d, "step_start", "part", p)
}

fn text_part(d: &mut Dialect<'_>, text: &str) -> anyhow::Result<()> {
    let t = now_ms();
    let p = part(
        d,
        "text",
        json!({"text": text, "time": {"start": t, "end": t + 1}}),
    );
    event(d, "text", "part", p)
}

fn tool_part(d: &mut Dialect<'_>, spec: &Value) -> anyhow::Result<()> {
    let tool = spec
        .get("tool")
        .and_then(Value::as_str)
        .with_context(|| format!("opencode `tool` needs a `tool` name, got {spec}"))?;
    let input = spec.get("input").cloned().unwrap_or_else(|| json!({}));
    let t = now_ms();
    let state = match spec.get("error").and_then(Value::as_str) {
        Some(error) => json!({"status": "error", "input": input, "error": error,
                              "time": {"start": t, "end": t + 1}}),
        None => {
            let output = spec.get("output").and_then(Value::as_str).unwrap_or("");
            json!({"status": "completed", "input": input, "output": output,
                   "metadata": {"output": output, "exit": 0, "truncated": false},
                   "title": tool, "time": {"start": t, "end": t + 1}})
        }
    };
    let seq = d.next_id();
    let call_id = format!("call_fake_{}_{seq}", d.n);
    let p = part(
        d,
        "tool",
        json!({"tool": tool, "callID": call_id, "state": state}),
    );
    event(d, "tool_use", "part", p)
}

fn step_finish(d: &mut Dialect<'_>, spec: &Value) -> anyhow::Result<()> {
    let reason = spec.get("reason").and_then(Value::as_str).unwrap_or("stop");
    let cost = spec.get("cost").and_then(Value::as_f64).unwrap_or(0.001);
    let tokens = spec.get("tokens").cloned().unwrap_or_else(|| {
        json!({"total": 110, "input": 100, "output": 10, "reasoning": 0,
               "cache": {"write": 0, "read": 0}})
    });
    let p = part(
        d,
        "step-finish",
        json!({"reason": reason, "snapshot": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
               "tokens": tokens, "cost": cost}),
    );
    event(d, "step_finish", "part", p)
}
