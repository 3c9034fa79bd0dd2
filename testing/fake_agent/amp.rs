//! The amp dialect of `ralph-fake-agent`: `amp -x --stream-json` lines, a Claude Code-compatible
//! subset (shapes from `notes/agent-protocols.md` §3). Assistant lines carry no `message.id`
//! and one content block each, with per-message `usage`; the result has no cost.
//!
//! Actions, one key inside `{"amp": {...}}`:
//! - `{"init": {"session_id": "T-...", "model": "m"}}` (both optional; default session
//!   `T-fake-<n>`, no model, as amp prints none): the `system/init` line.
//! - `{"user": {"text": "..."}}`: the echoed prompt as a `user` line. Without `text` it echoes
//!   the real prompt, read from stdin to EOF (so do not combine with `save_stdin`).
//! - `{"text": "..."}`: one assistant message with one text block.
//! - `{"tool": {"name": "Bash", "input": {"cmd": "cargo test"}, "result": "ok",
//!   "is_error": false}}`: an assistant `tool_use` message, then (when `result` is given) the
//!   `user` line holding its `tool_result`.
//! - `{"result": {"text": "...", "is_error": false, "subtype": "success", "cost_usd": 0.1}}`:
//!   the terminal line (all optional; `text` omitted means no `result` field, `cost_usd` omitted
//!   means no `total_cost_usd`, as amp prints).
//! - `{"error": "message"}`: the amp SDK's error result (`subtype:"error_during_execution"`,
//!   `is_error:true`, the message in `error`). amp's real wording for credit and auth failures
//!   is not known (notes §3), so tests pass the text; follow with `{"exit": 1}` (amp exits
//!   non-zero on failure).

use std::io::Read;
use std::sync::Mutex;

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};

use crate::Dialect;

/// The session id `init` set; later lines of the same process repeat it.
static SESSION: Mutex<Option<String>> = Mutex::new(None);

/// Plays one `{"amp": ...}` action.
pub fn play(action: &Value, d: &mut Dialect<'_>) -> anyhow::Result<()> {
    let Some((key, arg)) = single_key(action) else {
        bail!("an amp action is an object with one key (got {action})");
    };
    match key {
        "init" => {
            if let Some(id) = arg.get("session_id").and_then(Value::as_str) {
                set_session(id);
            }
            let cwd = std::env::current_dir().context("reading the working directory")?;
            let mut line = json!({
                "type": "system", "subtype": "init", "cwd": cwd.to_string_lossy(),
                "session_id": session(d),
                "tools": ["Bash", "Read", "edit_file", "create_file", "Grep", "glob", "oracle", "Task"],
                "mcp_servers": [],
            });
            if let (Some(model), Some(obj)) = (arg.get("model"), line.as_object_mut()) {
                obj.insert("model".into(), model.clone());
            }
            d.line(&line)
        }
        "user" => {
            let text = match arg.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .context("reading the prompt from stdin")?;
                    String::from_utf8_lossy(&buf).into_owned()
                }
            };
            d.line(&json!({
                "type": "user",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
                "parent_tool_use_id": null, "session_id": session(d),
            }))
        }
        "text" => {
            let Some(text) = arg.as_str() else {
                bail!("amp text takes a string (got {arg})");
            };
            assistant(d, json!({"type": "text", "text": text}), "end_turn")
        }
        "tool" => {
            let name = arg
                .get("name")
                .and_then(Value::as_str)
                .context("amp tool needs a name")?;
            let seq = d.next_id();
            let id = format!("toolu_fake_{}_{seq}", d.n);
            let input = arg.get("input").cloned().unwrap_or_else(|| json!({}));
            assistant(
                d,
                json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                "tool_use",
            )?;
            match arg.get("result").and_then(Value::as_str) {
                Some(result) => d.line(&json!({
                    "type": "user",
                    "message": {"role": "user", "content": [{"type": "tool_result",
                        "tool_use_id": id, "content": result,
                        "is_error": arg.get("is_error").and_then(Value::as_bool).unwrap_or(false)}]},
                    "parent_tool_use_id": null, "session_id": session(d),
                })),
                None => Ok(()),
            }
        }
        "result" => {
            let is_error = arg
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let default_subtype = if is_error {
                "error_during_execution"
            } else {
                "success"
            };
            let subtype = arg
                .get("subtype")
                .and_then(Value::as_str)
                .unwrap_or(default_subtype);
            let mut line = result_line(d, subtype, is_error);
            if let Some(text) = arg.get("text") {
                line.insert("result".into(), text.clone());
            }
            if let Some(cost) = arg.get("cost_usd") {
                line.insert("total_cost_usd".into(), cost.clone());
            }
            d.line(&Value::Object(line))
        }
        "error" => {
            let Some(message) = arg.as_str() else {
                bail!("amp error takes the message as a string (got {arg})");
            };
            let mut line = result_line(d, "error_during_execution", true);
            line.insert("error".into(), json!(message));
            d.line(&Value::Object(line))
        }
        other => bail!("unknown amp action {other:?} (see testing/fake_agent/amp.rs)"),
    }
}

fn single_key(action: &Value) -> Option<(&str, &Value)> {
    let obj = action.as_object().filter(|o| o.len() == 1)?;
    obj.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn set_session(id: &str) {
    if let Ok(mut s) = SESSION.lock() {
        *s = Some(id.to_owned());
    }
}

fn session(d: &Dialect<'_>) -> String {
    SESSION
        .lock()
        .ok()
        .and_then(|s| s.clone())
        .unwrap_or_else(|| format!("T-fake-{}", d.n))
}

/// One assistant message (amp prints no `message.id`) with one block and its usage.
fn assistant(d: &mut Dialect<'_>, block: Value, stop_reason: &str) -> anyhow::Result<()> {
    d.line(&json!({
        "type": "assistant",
        "message": {"type": "message", "role": "assistant", "content": [block],
            "stop_reason": stop_reason,
            "usage": {"input_tokens": 120, "cache_creation_input_tokens": 30,
                "cache_read_input_tokens": 1000, "output_tokens": 12,
                "max_tokens": 224000, "service_tier": "standard"}},
        "parent_tool_use_id": null, "session_id": session(d),
    }))
}

/// The result line's common fields, in amp's order.
fn result_line(d: &mut Dialect<'_>, subtype: &str, is_error: bool) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert("type".into(), json!("result"));
    line.insert("subtype".into(), json!(subtype));
    line.insert("duration_ms".into(), json!(2906));
    line.insert("is_error".into(), json!(is_error));
    line.insert("num_turns".into(), json!(*d.seq + 1));
    line.insert("session_id".into(), json!(session(d)));
    line
}
