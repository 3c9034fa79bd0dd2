//! The gemini dialect of `ralph-fake-agent`: the lines `gemini --output-format stream-json`
//! prints (shapes from `notes/agent-protocols.md` §5 and what `@google/gemini-cli@0.61.0`
//! printed when probed, `notes/real-clis.md` §4), and its fatal exits.
//!
//! Actions (`{"gemini": {KEY: VALUE}}`, one key each):
//! - `{"init": {"session_id": "s", "model": "m"}}` (both optional; the model defaults to
//!   `gemini-2.5-flash` and is remembered for the result's `stats.models`).
//! - `{"user": "text"}`: the echoed prompt, a `message` with `role:"user"`;
//!   `{"echo_prompt": true}` echoes stdin (read to EOF) that way, as the CLI does.
//! - `{"text": "t"}` or `{"text": ["a", "b"]}`: assistant `message` deltas (`"delta":true`).
//! - `{"tool": {"name": "run_shell_command", "parameters": {...}, "output": "out",
//!   "status": "success", "error": "msg"}}`: a `tool_use` line, then a `tool_result` line unless
//!   `output`, `status` and `error` are all absent; `error` makes the status `error`.
//! - `{"error": {"message": "…", "severity": "warning"}}`: a non-fatal `error` event.
//! - `{"result": {"stats": {...}}}`: `status:"success"` with default stats (30 tokens);
//!   `{"result": {"error": {"type": "…", "message": "…"}}}`: `status:"error"`, no exit.
//! - `{"quota": {"type": "TerminalQuotaError", "message": "…", "exit": 173}}`: the error
//!   result, then exit (429 & 0xFF = 173 by default). Type and message default to the daily
//!   quota shape; `"type": "unknown"` plus `"stderr": true` gives 0.61.0's real shape, where
//!   the class is only named in the stderr report.
//! - `{"auth_error": {"message": "…", "result": false}}`: the message on stderr (plus a
//!   `FatalAuthenticationError` result line when `result` is true), then exit 41.
//! - `{"untrusted": true}`: the untrusted-folder message on stderr (red unless `NO_COLOR` is
//!   set), then exit 55.

use std::io::{Read, Write};

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::Dialect;

/// Model named when a script does not set one.
const DEFAULT_MODEL: &str = "gemini-2.5-flash";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Action {
    Init(Init),
    User(String),
    EchoPrompt(bool),
    Text(Texts),
    Tool(Tool),
    Error(ErrorEvent),
    Result(ResultAction),
    Quota(Quota),
    AuthError(AuthError),
    Untrusted(bool),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Init {
    session_id: Option<String>,
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tool {
    name: String,
    #[serde(default)]
    parameters: Value,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorEvent {
    message: String,
    #[serde(default = "default_severity")]
    severity: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ResultAction {
    stats: Option<Value>,
    error: Option<ErrorObj>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorObj {
    #[serde(rename = "type")]
    kind: String,
    message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quota {
    #[serde(rename = "type", default = "default_quota_type")]
    kind: String,
    #[serde(default = "default_quota_message")]
    message: String,
    #[serde(default = "default_quota_exit")]
    exit: i32,
    /// Also print the CLI's stderr report naming `TerminalQuotaError`.
    #[serde(default)]
    stderr: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthError {
    #[serde(default = "default_auth_message")]
    message: String,
    #[serde(default)]
    result: bool,
}

fn default_severity() -> String {
    "error".to_owned()
}
fn default_quota_type() -> String {
    "TerminalQuotaError".to_owned()
}
fn default_quota_message() -> String {
    "[API Error: You have exhausted your capacity on this model. Your quota will reset after \
     2h13m5s.]\nPlease wait and try again later. To increase your limits, request a quota \
     increase through AI Studio, or switch to another /auth method"
        .to_owned()
}
fn default_quota_exit() -> i32 {
    // The CLI exits with the HTTP status; the OS keeps 429 & 0xFF.
    173
}
fn default_auth_message() -> String {
    "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.".to_owned()
}

/// ISO 8601 UTC timestamp, as on every event.
fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Default `result.stats` for `model`.
fn default_stats(model: &str) -> Value {
    let per_model = json!({"total_tokens": 30, "input_tokens": 20, "output_tokens": 10,
                           "cached": 5, "input": 15});
    json!({"total_tokens": 30, "input_tokens": 20, "output_tokens": 10, "cached": 5,
           "input": 15, "duration_ms": 236, "tool_calls": 1, "models": {model: per_model}})
}

/// Stats of a run that failed before any token was counted.
fn zero_stats(model: &str) -> Value {
    let zero = json!({"total_tokens": 0, "input_tokens": 0, "output_tokens": 0, "cached": 0,
                      "input": 0});
    json!({"total_tokens": 0, "input_tokens": 0, "output_tokens": 0, "cached": 0, "input": 0,
           "duration_ms": 0, "tool_calls": 0, "models": {model: zero}})
}

/// Flushes stdout and exits with `code`, as the CLI's `process.exit` does after a fatal error.
fn exit(code: i32) -> ! {
    // Nothing more can be reported if the flush fails; the exit code still tells.
    let _ = std::io::stdout().flush();
    std::process::exit(code & 0xff)
}

/// Plays one `{"gemini": ...}` action.
///
/// # Errors
/// An action of an unknown shape, or stdout/stdin failing.
pub fn play(action: &Value, d: &mut Dialect<'_>) -> anyhow::Result<()> {
    let action: Action = serde_json::from_value(action.clone()).with_context(|| {
        format!("not a gemini action (see testing/fake_agent/gemini.rs): {action}")
    })?;
    // The model `init` named, kept across the actions of this process.
    let model = MODEL.with(|m| m.borrow().clone());
    match action {
        Action::Init(init) => {
            let model = init.model.unwrap_or_else(|| DEFAULT_MODEL.to_owned());
            MODEL.with(|m| *m.borrow_mut() = model.clone());
            let session = init
                .session_id
                .unwrap_or_else(|| format!("fake-gemini-session-{}", d.n));
            d.line(
                &json!({"type": "init", "timestamp": now(), "session_id": session, "model": model}),
            )?;
        }
        Action::User(text) => user(d, &text)?,
        Action::EchoPrompt(echo) => {
            if echo {
                let mut prompt = String::new();
                std::io::stdin()
                    .read_to_string(&mut prompt)
                    .context("reading the prompt from stdin")?;
                user(d, &prompt)?;
            }
        }
        Action::Text(texts) => {
            let texts = match texts {
                Texts::One(t) => vec![t],
                Texts::Many(ts) => ts,
            };
            for t in texts {
                d.line(
                    &json!({"type": "message", "timestamp": now(), "role": "assistant",
                               "content": t, "delta": true}),
                )?;
            }
        }
        Action::Tool(tool) => {
            let n = d.next_id();
            let id = format!("{0}__{0}_{1}_{2}", tool.name, 1_796_003_378_000 + n, n - 1);
            d.line(
                &json!({"type": "tool_use", "timestamp": now(), "tool_name": tool.name,
                           "tool_id": id, "parameters": tool.parameters}),
            )?;
            if tool.output.is_some() || tool.status.is_some() || tool.error.is_some() {
                let status = tool.status.unwrap_or_else(|| {
                    if tool.error.is_some() {
                        "error"
                    } else {
                        "success"
                    }
                    .to_owned()
                });
                let mut line = json!({"type": "tool_result", "timestamp": now(), "tool_id": id,
                                      "status": status});
                if let Some(output) = tool.output {
                    line["output"] = json!(output);
                }
                if let Some(message) = tool.error {
                    line["error"] = json!({"type": "TOOL_EXECUTION_ERROR", "message": message});
                }
                d.line(&line)?;
            }
        }
        Action::Error(e) => {
            d.line(
                &json!({"type": "error", "timestamp": now(), "severity": e.severity,
                           "message": e.message}),
            )?;
        }
        Action::Result(r) => match r.error {
            None => d.line(
                &json!({"type": "result", "timestamp": now(), "status": "success",
                "stats": r.stats.unwrap_or_else(|| default_stats(&model))}),
            )?,
            Some(e) => d.line(
                &json!({"type": "result", "timestamp": now(), "status": "error",
                "error": {"type": e.kind, "message": e.message},
                "stats": r.stats.unwrap_or_else(|| zero_stats(&model))}),
            )?,
        },
        Action::Quota(q) => {
            if q.stderr {
                let first = q
                    .message
                    .trim_start_matches("[API Error: ")
                    .split(']')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                d.stderr(&format!(
                    "Error when talking to Gemini API Full report available at: \
                     /tmp/gemini-client-error-Turn.run-sendMessageStream.json TerminalQuotaError: {first}"
                ))?;
            }
            d.line(
                &json!({"type": "result", "timestamp": now(), "status": "error",
                "error": {"type": q.kind, "message": q.message}, "stats": zero_stats(&model)}),
            )?;
            exit(q.exit);
        }
        Action::AuthError(a) => {
            d.stderr(&a.message)?;
            if a.result {
                d.line(
                    &json!({"type": "result", "timestamp": now(), "status": "error",
                    "error": {"type": "FatalAuthenticationError", "message": a.message},
                    "stats": zero_stats(&model)}),
                )?;
            }
            exit(41);
        }
        Action::Untrusted(untrusted) => {
            if !untrusted {
                bail!("`untrusted` only takes `true`");
            }
            let message = "Gemini CLI is not running in a trusted directory. To proceed, either \
                 use `--skip-trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment \
                 variable, or trust this directory in interactive mode.";
            if std::env::var_os("NO_COLOR").is_some() {
                d.stderr(message)?;
            } else {
                d.stderr(&format!("\x1b[31m{message}\x1b[0m"))?;
            }
            exit(55);
        }
    }
    Ok(())
}

/// The echoed prompt.
fn user(d: &Dialect<'_>, text: &str) -> anyhow::Result<()> {
    d.line(&json!({"type": "message", "timestamp": now(), "role": "user", "content": text}))
}

thread_local! {
    /// The model the last `init` named, for the result's `stats.models`.
    static MODEL: std::cell::RefCell<String> = std::cell::RefCell::new(DEFAULT_MODEL.to_owned());
}
