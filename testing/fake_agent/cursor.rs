//! The cursor dialect of `ralph-fake-agent`: `cursor-agent -p --output-format stream-json`
//! lines (shapes from `notes/agent-protocols.md` §6 and captured runs) and its failures, which
//! cursor prints on stderr with no `result` line.
//!
//! Actions, one key inside `{"cursor": {...}}`:
//! - `{"init": {"session_id": "...", "model": "..."}}` (both optional; defaults
//!   `fake-cursor-<n>` and `Auto`): the `system/init` line.
//! - `{"user": {"text": "..."}}`: the echoed prompt as a `user` line. Without `text` it echoes
//!   the real prompt: the last command-line argument, where cursor-agent takes it.
//! - `{"text": "..."}`: one `assistant` line (a complete message).
//! - `{"tool": {"kind": "shellToolCall", "args": {"command": "ls"}, "result": {...}}}`: a
//!   `tool_call` `started` line, then its `completed` line holding `result` (default
//!   `{"success": {}}`; use `{"failure": {...}}` for a failed tool).
//! - `{"result": {"text": "...", "is_error": false, "subtype": "success"}}`: the terminal line
//!   (all optional; `text` omitted means no `result` field). To play cursor's "result, then
//!   never exits", follow it with `{"sleep_ms": 3600000}`.
//! - `{"usage_limit": {}}`: the usage-limit block cursor-agent prints on stderr
//!   (cursor/cursor#3703), `reset` (default `11/17/2025`) being the date in its last sentence;
//!   follow with `{"exit": 1}`.
//! - `{"auth_failure": {}}`: the stderr line of `cursor-agent -p` without a login or
//!   `CURSOR_API_KEY`; follow with `{"exit": 1}`.

use std::sync::Mutex;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::Dialect;

/// The session id `init` set; later lines of the same process repeat it.
static SESSION: Mutex<Option<String>> = Mutex::new(None);

/// cursor-agent's line when it has no credentials.
const AUTH_REQUIRED: &str = "Error: Authentication required. Please run 'agent login' first, or set CURSOR_API_KEY environment variable.";

/// Plays one `{"cursor": ...}` action.
pub fn play(action: &Value, d: &mut Dialect<'_>) -> anyhow::Result<()> {
    let Some((key, arg)) = action
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        bail!("a cursor action is an object with one key (got {action})");
    };
    match key.as_str() {
        "init" => {
            if let Some(id) = arg.get("session_id").and_then(Value::as_str) {
                if let Ok(mut s) = SESSION.lock() {
                    *s = Some(id.to_owned());
                }
            }
            let cwd = std::env::current_dir().context("reading the working directory")?;
            d.line(&json!({
                "type": "system", "subtype": "init", "apiKeySource": "env",
                "cwd": cwd.to_string_lossy(), "session_id": session(d),
                "model": arg.get("model").and_then(Value::as_str).unwrap_or("Auto"),
                "permissionMode": "default",
            }))
        }
        "user" => {
            let text = match arg.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => std::env::args_os()
                    .skip(1)
                    .last()
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            d.line(&json!({
                "type": "user",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
                "session_id": session(d),
            }))
        }
        "text" => {
            let Some(text) = arg.as_str() else {
                bail!("cursor text takes a string (got {arg})");
            };
            d.line(&json!({
                "type": "assistant",
                "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
                "session_id": session(d),
            }))
        }
        "tool" => {
            let kind = arg
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("shellToolCall");
            let args = arg.get("args").cloned().unwrap_or_else(|| json!({}));
            let result = arg
                .get("result")
                .cloned()
                .unwrap_or_else(|| json!({"success": {}}));
            let seq = d.next_id();
            let call_id = format!("call_fake_{}_{seq}", d.n);
            let mut started = serde_json::Map::new();
            started.insert(kind.to_owned(), json!({"args": args}));
            started.insert("toolCallId".into(), json!(call_id));
            started.insert("startedAtMs".into(), json!("1785855754954"));
            d.line(&json!({
                "type": "tool_call", "subtype": "started", "call_id": call_id,
                "tool_call": started, "session_id": session(d),
            }))?;
            let mut completed = serde_json::Map::new();
            completed.insert(kind.to_owned(), json!({"args": args, "result": result}));
            d.line(&json!({
                "type": "tool_call", "subtype": "completed", "call_id": call_id,
                "tool_call": completed, "session_id": session(d),
            }))
        }
        "result" => {
            let is_error = arg
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let subtype = arg
                .get("subtype")
                .and_then(Value::as_str)
                .unwrap_or(if is_error { "error" } else { "success" });
            let mut line = serde_json::Map::new();
            line.insert("type".into(), json!("result"));
            line.insert("subtype".into(), json!(subtype));
            line.insert("duration_ms".into(), json!(5234));
            line.insert("duration_api_ms".into(), json!(5234));
            line.insert("is_error".into(), json!(is_error));
            if let Some(text) = arg.get("text") {
                line.insert("result".into(), text.clone());
            }
            line.insert("session_id".into(), json!(session(d)));
            line.insert("request_id".into(), json!(format!("fake-request-{}", d.n)));
            d.line(&Value::Object(line))
        }
        "usage_limit" => {
            let reset = arg
                .get("reset")
                .and_then(Value::as_str)
                .unwrap_or("11/17/2025");
            for line in [
                "Error: You've hit your usage limit".to_owned(),
                "  Get Cursor Pro for more Agent usage, unlimited Tab, and more.".to_owned(),
                "  fallbackModel: ".to_owned(),
                "  spendLimitHit: false".to_owned(),
                "  chatMessage: *You've hit your free requests limit. [Upgrade to Pro](https://www.cursor.com/api/auth/checkoutDeepControl?tier=pro) for more usage, frontier models, Background Agents, ".to_owned(),
                format!("  and more. Your usage limits will reset when your monthly cycle ends on {reset}.*"),
                "  spendLimits: [50,100,200]".to_owned(),
            ] {
                d.stderr(&line)?;
            }
            Ok(())
        }
        "auth_failure" => d.stderr(AUTH_REQUIRED),
        other => bail!("unknown cursor action {other:?} (see testing/fake_agent/cursor.rs)"),
    }
}

fn session(d: &Dialect<'_>) -> String {
    SESSION
        .lock()
        .ok()
        .and_then(|s| s.clone())
        .unwrap_or_else(|| format!("fake-cursor-{}", d.n))
}
