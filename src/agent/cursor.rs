//! The Cursor CLI backend: `cursor-agent -p --force --output-format stream-json [-m MODEL]
//! <prompt>`, the prompt as the last argument.
//!
//! This module owns cursor-agent's command line, its facts ([`INFO`], doctor traps) and what its
//! stream-json output does differently from the shape it shares with claude
//! ([`crate::agent::claude_shape`]: `system/init`, the session id, `result`). Schema source:
//! `notes/agent-protocols.md` §6 (Cursor CLI, from cursor's output-format reference and observed
//! runs) and §0 (rules for every CLI). cursor-agent is closed source: every rule below is read
//! leniently.
//!
//! Choices, each forced by what cursor-agent does:
//! - the prompt is a positional argument, the only documented form. Linux refuses a single
//!   argument over 128 KiB (`E2BIG` at spawn), so a prompt over [`PROMPT_ARG_MAX_BYTES`] is
//!   refused with an error naming the limit before anything starts. A prompt starting with `-`
//!   is put after `--` so it is not read as an option;
//! - stdin is `/dev/null`: with the prompt in argv there is nothing to write;
//! - `--force` allows commands without asking. `--trust` is not passed: only newer builds know
//!   it (an older build stops at an unknown option), and cursor-agent's own workspace-trust
//!   refusal names `-f`/`--force` as an alternative to it, so `--force` already clears that gate;
//! - cursor echoes the prompt as a `user` line, which never becomes the final text, nor do tool
//!   results (`tool_call` lines);
//! - the final text is `result.result`, else the assistant's text since its last tool call:
//!   builds print one `assistant` line per complete message, and with partial output
//!   (`--stream-partial-output`, and some builds by default) one line per small chunk, so the
//!   `assistant` lines after the last tool call are joined (a line that repeats the text so far
//!   and goes on, a snapshot, replaces it) before the promise is looked for;
//! - the `result` line may be missing (on failure cursor prints to stderr and exits non-zero):
//!   then the exit code decides ([`StreamCore::exit_decides`]): exit 0 is a finished run, whose
//!   stderr chatter is never classified; any other exit is a failure. cursor-agent also
//!   sometimes does not exit after its `result`; the supervisor ends it after a grace period
//!   once it has seen [`AgentEvent::Final`];
//! - failures: cursor has no structured error fields; stderr lines and the text of an error
//!   result go through the classifier;
//! - no cost (`None`); tokens only when a build puts `usage` in the result line (not in the
//!   documented schema).

use serde_json::Value;

use crate::agent::classify::{resume_at_from_text, Signal};
use crate::agent::claude_shape::{self as shape, ResultLine};
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia, SandboxNeeds};
use crate::agent::stream::{Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::SpawnSpec;
use crate::protocol::fields::summarize_tool_input;
use crate::protocol::{AgentEvent, AgentKind, Usage};

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH). Newer builds
/// also install it as `agent`; point `--agent-program` there if only that name exists.
pub const DEFAULT_PROGRAM: &str = "cursor-agent";

/// Largest prompt, in bytes, ralph passes as cursor-agent's argument: below Linux's 128 KiB
/// limit for one argument (`MAX_ARG_STRLEN`), with room for the rest of argv and the
/// environment under macOS's smaller total limit.
pub const PROMPT_ARG_MAX_BYTES: usize = 100 * 1024;

/// Facts about the cursor backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Cursor,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it from https://cursor.com/cli (`cursor-agent`)",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Arg {
        max_bytes: PROMPT_ARG_MAX_BYTES,
    },
    doctor: traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Cursor::new(settings))),
    sandbox: SandboxNeeds {
        state: &[".cursor", ".config/cursor"],
        env_prefixes: &["CURSOR_"],
        hosts: &["api2.cursor.sh:443", "api.cursor.com:443"],
        base_url_hosts: Vec::new,
        config_env: Vec::new,
        state_vars: &[],
        config_vars: &[],
    },
};

/// The prompt does not fit in one command-line argument.
#[derive(Debug, thiserror::Error)]
#[error(
    "the prompt is {bytes} bytes, over the {limit}-byte limit for cursor-agent, which takes its prompt as a command-line argument (Linux refuses one argument over 128 KiB)\nhint: make the prompt smaller (a shorter template, story text or progress_tail_bytes), or use an agent that reads the prompt on stdin (claude, amp)",
    limit = PROMPT_ARG_MAX_BYTES
)]
pub struct PromptTooLong {
    /// The prompt's size in bytes.
    pub bytes: usize,
}

/// The cursor backend. Stateless apart from its settings; each [`Backend::parser`] call returns
/// a fresh [`CursorParser`].
#[derive(Debug, Clone)]
pub struct Cursor {
    settings: AgentSettings,
}

impl Cursor {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `-m settings.model` when set.
    pub fn new(settings: AgentSettings) -> Self {
        Cursor { settings }
    }
}

impl Backend for Cursor {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `cursor-agent -p --force --output-format stream-json [-m M] [--] <prompt>`, stdin
    /// `/dev/null`, `NO_COLOR=1`.
    ///
    /// # Errors
    /// [`PromptTooLong`] when `prompt` is over [`PROMPT_ARG_MAX_BYTES`].
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        if prompt.len() > PROMPT_ARG_MAX_BYTES {
            return Err(PromptTooLong {
                bytes: prompt.len(),
            }
            .into());
        }
        let mut args = self
            .settings
            .args_with_model(&["-p", "--force", "--output-format", "stream-json"], "-m");
        if prompt.starts_with('-') {
            // Only then: a prompt that looks like an option must not be parsed as one.
            args.push("--".into());
        }
        args.push(prompt.to_owned());
        Ok(self.settings.cli_spec(DEFAULT_PROGRAM, args, None))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // The echoed prompt arrives as a `user` line, which never feeds the final text.
        Box::new(CursorParser::new().for_model(self.settings.model.as_deref()))
    }
}

/// Without `CURSOR_API_KEY` a first run tries a browser login.
fn traps(cx: &DoctorContext<'_>) -> Vec<String> {
    cx.unless_set("CURSOR_API_KEY", "no CURSOR_API_KEY: cursor-agent's first run tries a browser login and hangs until the idle timeout")
}

/// Reads cursor-agent's stream-json output. Memory use is bounded by the largest assistant
/// message plus a few stderr lines.
pub type CursorParser = Parser<CursorDialect>;

/// cursor's dialect of the shared shape (see the module docs).
#[derive(Debug, Default)]
pub struct CursorDialect {
    /// The assistant's text since its last tool call, its chunks joined.
    segment: String,
    /// A tool call ended the segment: the next assistant line starts a new one.
    segment_closed: bool,
}

impl CursorDialect {
    /// Adds one `assistant` line's text to the current segment.
    fn push_text(&mut self, text: &str) {
        if self.segment_closed {
            self.segment.clear();
            self.segment_closed = false;
        }
        if !self.segment.is_empty() && text.starts_with(self.segment.as_str()) {
            // A snapshot of the whole message so far (or the complete message after its chunks).
            self.segment = text.to_owned();
        } else {
            self.segment.push_str(text);
        }
    }
}

impl Dialect for CursorDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = shape::read_line(line, core) else {
            return Vec::new();
        };
        match shape::line_type(&v) {
            Some("system") if shape::is_init(&v) => shape::on_init(&v, core, None),
            Some("assistant") => {
                let Some(text) = v.get("message").and_then(message_text) else {
                    return Vec::new();
                };
                self.push_text(&text);
                vec![AgentEvent::AssistantText { text }]
            }
            Some("tool_call") => {
                self.segment_closed = true;
                on_tool_call(&v)
            }
            Some("result") => on_result(&v, core),
            // `user` is the echoed prompt: never the agent's words.
            _ => Vec::new(),
        }
    }

    /// The assistant's text since its last tool call stands in for a missing `result.result`;
    /// without a `result` line the exit code decides.
    fn settle(&mut self, core: &mut StreamCore, _exit_code: Option<i32>) {
        if core
            .final_text
            .as_deref()
            .is_none_or(|t| t.trim().is_empty())
            && !self.segment.is_empty()
        {
            core.final_text = Some(self.segment.clone());
        }
        core.exit_decides = true;
    }

    /// The usual sources, then the exit code: cursor may die without a word.
    fn error_message(&self, core: &StreamCore, exit_code: Option<i32>) -> Option<String> {
        core.error_message_chain().or_else(|| {
            exit_code.filter(|c| *c != 0).map(|c| {
                format!("cursor-agent exited with code {c} without a result or an error message")
            })
        })
    }

    /// cursor prints its limit as several stderr lines; the reset date is not on the first one.
    fn reset_time(
        &self,
        core: &StreamCore,
        error_message: Option<&str>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        core.reset_time_from(error_message).or_else(|| {
            core.stderr_tail
                .joined()
                .as_deref()
                .and_then(resume_at_from_text)
        })
    }
}

/// The `result` line: the shared fields (a subtype other than `success` is an error when
/// `is_error` is missing), the usage a build may print, and for an error its text and `error`,
/// classified; the message is the text, else the subtype. No cost: cursor prints none.
fn on_result(v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
    let result = ResultLine::read(v, core, |subtype| subtype != "success");
    if result.is_error {
        // Only an error result's text is cursor's own error message.
        if let Some(t) = &result.text {
            core.classifier.observe(Signal::Text(t));
        }
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            core.classifier.observe(Signal::Text(e));
        }
        for e in &result.errors {
            core.classifier.observe(Signal::Text(e));
        }
    }
    core.error_message = result.is_error.then(|| {
        result
            .nonblank_text()
            .or_else(|| result.joined_errors())
            .unwrap_or_else(|| result.ended_with("cursor-agent", "an error"))
    });
    core.usage = v.get("usage").map(usage_of).unwrap_or_default();
    vec![result.event()]
}

/// `tool_call` lines: `started` → [`AgentEvent::ToolCall`], `completed` →
/// [`AgentEvent::ToolResult`]. The tool is the key of `tool_call` named `<kind>ToolCall`
/// (`shellToolCall`, `readToolCall`, `editToolCall`, ...), else any key holding an object; the
/// other keys there are metadata (`toolCallId`, `startedAtMs`).
fn on_tool_call(v: &Value) -> Vec<AgentEvent> {
    let Some(fields) = v.get("tool_call").and_then(Value::as_object) else {
        return Vec::new();
    };
    let tool = fields
        .iter()
        .find(|(key, call)| key.ends_with("ToolCall") && call.is_object())
        .or_else(|| fields.iter().find(|(_, call)| call.is_object()));
    let Some((key, call)) = tool else {
        return Vec::new();
    };
    match v.get("subtype").and_then(Value::as_str) {
        Some("started") => {
            let name = match call.get("name").and_then(Value::as_str) {
                // MCP and other generic tools carry their own name.
                Some(name) if key == "function" || key == "mcpToolCall" => name.to_owned(),
                _ => key.strip_suffix("ToolCall").unwrap_or(key).to_owned(),
            };
            let summary = summarize_tool_input(call.get("args").unwrap_or(&Value::Null));
            vec![AgentEvent::ToolCall { name, summary }]
        }
        Some("completed") => {
            let result = call.get("result");
            // A shell tool's `{"success": {"stdout", "stderr", "exitCode"}}` (or failure).
            let outcome = result
                .and_then(Value::as_object)
                .and_then(|o| o.values().next());
            let text = outcome.map(|o| {
                ["stdout", "stderr", "content", "error", "message"]
                    .iter()
                    .filter_map(|k| o.get(*k).and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            vec![AgentEvent::ToolResult {
                is_error: tool_failed(result),
                output: text.as_deref().and_then(super::stream::tool_output),
                exit_code: outcome
                    .and_then(|o| o.get("exitCode"))
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok()),
            }]
        }
        _ => Vec::new(),
    }
}

/// A completed tool's `result` is `{"success": {...}}` or another outcome (`failure`,
/// `error`, `rejected`, ...). A shell command that ran but exited non-zero failed too.
fn tool_failed(result: Option<&Value>) -> bool {
    let Some(result) = result.and_then(Value::as_object) else {
        return false;
    };
    match result.get("success") {
        Some(success) => success
            .get("exitCode")
            .and_then(Value::as_i64)
            .is_some_and(|code| code != 0),
        None => !result.is_empty(),
    }
}

/// The text blocks of an assistant `message`, joined; `None` when it has no text.
fn message_text(message: &Value) -> Option<String> {
    let content = message.get("content")?;
    let text = match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| {
                b.get("type")
                    .and_then(Value::as_str)
                    .is_none_or(|t| t == "text")
            })
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// `result.usage`, when present: input and output tokens in either spelling (`inputTokens` /
/// `input_tokens`). Cache counts are not read: no known build names them.
fn usage_of(u: &Value) -> Usage {
    let n = |camel: &str, snake: &str| {
        u.get(camel)
            .or_else(|| u.get(snake))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Usage {
        input_tokens: n("inputTokens", "input_tokens"),
        output_tokens: n("outputTokens", "output_tokens"),
        ..Usage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stream::test_support::{self, err, out};
    use crate::completion::promise_in_final_text;
    use crate::process::OutputLine;
    use crate::protocol::{AgentReport, FailureClass};
    use std::path::PathBuf;

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        test_support::run_plain::<CursorDialect>(lines, exit)
    }

    fn claims(report: &AgentReport) -> bool {
        promise_in_final_text(report.final_text.as_deref().unwrap_or_default())
    }

    // Shapes from notes/agent-protocols.md §6 (cursor's output-format reference) and captured
    // runs: the tool object sits next to `toolCallId`/`startedAtMs` metadata.
    const INIT: &str = r#"{"type":"system","subtype":"init","apiKeySource":"env","cwd":"/w/repo","session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b","model":"Claude 4.5 Sonnet","permissionMode":"default"}"#;
    const USER_ECHO: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"Work on US-001. When every story passes, end with <promise>COMPLETE</promise>"}]},"session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b"}"#;
    const SAYS: &str = r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"I'll run the tests first."}]},"session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b"}"#;
    const SHELL_STARTED: &str = r#"{"type":"tool_call","subtype":"started","call_id":"c1","tool_call":{"shellToolCall":{"args":{"command":"cargo test","workingDirectory":"/w/repo"}},"toolCallId":"c1","startedAtMs":"1785855754954"},"session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b"}"#;
    /// The tool's output quotes the promise (a test fixture): never a claim.
    const SHELL_COMPLETED: &str = r#"{"type":"tool_call","subtype":"completed","call_id":"c1","tool_call":{"shellToolCall":{"args":{"command":"cargo test"},"result":{"success":{"command":"cargo test","exitCode":0,"stdout":"fixture: <promise>COMPLETE</promise>","stderr":""}}}},"session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b"}"#;
    const FINAL_SAYS: &str = r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"All stories pass.\n<promise>COMPLETE</promise>"}]},"session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b"}"#;
    const RESULT: &str = r#"{"type":"result","subtype":"success","duration_ms":5234,"duration_api_ms":5234,"is_error":false,"result":"All stories pass.\n<promise>COMPLETE</promise>","session_id":"f0bde9df-c86b-4d59-b453-c133f6de1a2b","request_id":"9a1b2c3d-0000"}"#;
    /// cursor/cursor#3703: a usage limit, on stderr, one field per line; exit 1, no result.
    const USAGE_LIMIT: [&str; 7] = [
        "Error: You've hit your usage limit",
        "  Get Cursor Pro for more Agent usage, unlimited Tab, and more.",
        "  fallbackModel: ",
        "  spendLimitHit: false",
        "  chatMessage: *You've hit your free requests limit. [Upgrade to Pro](https://www.cursor.com/api/auth/checkoutDeepControl?tier=pro) for more usage, frontier models, Background Agents, ",
        "  and more. Your usage limits will reset when your monthly cycle ends on 11/17/2025.*",
        "  spendLimits: [50,100,200]",
    ];
    /// `cursor-agent -p` without a login or `CURSOR_API_KEY`: stderr, exit 1.
    const AUTH_REQUIRED: &str = "Error: Authentication required. Please run 'agent login' first, or set CURSOR_API_KEY environment variable.";

    #[test]
    fn successful_run_reads_events_final_text_and_session() {
        let lines = [
            out(INIT),
            out(USER_ECHO),
            out(SAYS),
            out(SHELL_STARTED),
            out(SHELL_COMPLETED),
            out(FINAL_SAYS),
            out(RESULT),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("f0bde9df-c86b-4d59-b453-c133f6de1a2b".into()),
                    model: Some("Claude 4.5 Sonnet".into()),
                    version: None,
                },
                AgentEvent::AssistantText {
                    text: "I'll run the tests first.".into()
                },
                AgentEvent::ToolCall {
                    name: "shell".into(),
                    summary: "cargo test".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::AssistantText {
                    text: "All stories pass.\n<promise>COMPLETE</promise>".into()
                },
                AgentEvent::Final {
                    text: Some("All stories pass.\n<promise>COMPLETE</promise>".into()),
                    is_error: false
                },
            ]
        );
        assert!(report.saw_final && !report.is_error);
        assert!(claims(&report));
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert_eq!(report.cost_usd, None);
        assert_eq!(report.usage, Usage::default());
        assert_eq!(
            report.session_id.as_deref(),
            Some("f0bde9df-c86b-4d59-b453-c133f6de1a2b")
        );
    }

    /// The promise in the echoed prompt and in a tool's output never counts: not with a result
    /// line, not without one (then the last assistant message is the final text).
    #[test]
    fn promise_only_in_echo_or_tool_output_does_not_count() {
        let (_, report) = run(
            &[
                out(INIT),
                out(USER_ECHO),
                out(SHELL_STARTED),
                out(SHELL_COMPLETED),
            ],
            Some(0),
        );
        assert_eq!(report.final_text, None);
        assert!(!claims(&report));
        assert!(
            report.saw_final && !report.is_error,
            "exit 0 without a result decides"
        );

        let (_, report) = run(
            &[
                out(USER_ECHO),
                out(SAYS),
                out(SHELL_STARTED),
                out(SHELL_COMPLETED),
            ],
            Some(0),
        );
        assert_eq!(
            report.final_text.as_deref(),
            Some("I'll run the tests first.")
        );
        assert!(!claims(&report));

        let result = r#"{"type":"result","subtype":"success","is_error":false,"result":"Tests pass; US-002 is still open.","session_id":"s"}"#;
        let (_, report) = run(
            &[out(USER_ECHO), out(SHELL_COMPLETED), out(result)],
            Some(0),
        );
        assert!(!claims(&report));
    }

    /// Without a result line the exit code decides; the last assistant message still stands
    /// in for the final text (cursor may die after its last message).
    #[test]
    fn missing_result_leaves_the_exit_code_to_decide() {
        // Exit 0 without a result line is a finished run (README: the exit code decides), and
        // stderr chatter before it is not a failure.
        let (_, report) = run(
            &[
                out(INIT),
                err("Warning: API Error: 529 Overloaded, retrying"),
                out(FINAL_SAYS),
            ],
            Some(0),
        );
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert!(claims(&report));

        let (_, report) = run(&[out(INIT), out(SAYS)], Some(2));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("cursor-agent exited with code 2 without a result or an error message")
        );

        // Killed by ralph after its result (cursor sometimes never exits): the result decides.
        let (_, report) = run(&[out(INIT), out(RESULT)], None);
        assert!(report.saw_final && !report.is_error && claims(&report));
    }

    /// Partial output: the final message arrives as many small `assistant` chunks (the promise
    /// itself split across two), with no `result` line and exit 0. The chunks after the last
    /// tool call are joined; a snapshot repeating them replaces them; earlier text does not
    /// count.
    #[test]
    fn chunked_assistant_output_is_joined_before_the_promise_is_looked_for() {
        let chunk = |t: &str| {
            out(&format!(
                r#"{{"type":"assistant","message":{{"role":"assistant","content":[{{"type":"text","text":{}}}]}},"session_id":"s","timestamp_ms":1785855754954}}"#,
                serde_json::Value::String(t.to_owned())
            ))
        };
        let mut lines = vec![out(INIT), chunk("I'll run "), chunk("the tests.")];
        lines.extend([out(SHELL_STARTED), out(SHELL_COMPLETED)]);
        for piece in [
            "All ",
            "stories ",
            "pass.\n<prom",
            "ise>COMP",
            "LETE</promise>",
        ] {
            lines.push(chunk(piece));
        }
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            report.final_text.as_deref(),
            Some("All stories pass.\n<promise>COMPLETE</promise>")
        );
        assert!(claims(&report));
        assert!(report.saw_final && !report.is_error);
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::AssistantText { .. }))
                .count(),
            7
        );

        // The complete message printed again after its chunks replaces them.
        lines.push(chunk("All stories pass.\n<promise>COMPLETE</promise>"));
        let (_, report) = run(&lines, Some(0));
        assert_eq!(
            report.final_text.as_deref(),
            Some("All stories pass.\n<promise>COMPLETE</promise>")
        );

        // The same chunks, then a failure exit: the exit code decides, and the promise is
        // still the final text (the iteration's classification weighs it).
        let (_, report) = run(&lines, Some(1));
        assert!(report.is_error && !report.saw_final);
        assert!(claims(&report));

        // A result line with empty text leaves the joined chunks as the final text.
        lines.push(out(r#"{"type":"result","subtype":"success","is_error":false,"result":"","session_id":"s"}"#));
        let (_, report) = run(&lines, Some(0));
        assert!(claims(&report));
    }

    #[test]
    fn usage_limit_on_stderr_is_a_usage_limit() {
        let mut lines = vec![out(INIT)];
        lines.extend(USAGE_LIMIT.iter().map(|l| err(l)));
        let (events, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert!(report.is_error && !report.saw_final);
        // The captured block's reset date (11/17/2025) is long gone: no time to wait for, and
        // the message says so (the run waits usage_limit_fallback).
        assert_eq!(report.resume_at, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: You've hit your usage limit; the reset time it gave (2025-11-17 00:00 UTC) has already passed, so ralph waits usage_limit_fallback instead")
        );
        // A block whose date is still ahead gives that date.
        let mut lines = vec![out(INIT)];
        lines.extend(
            USAGE_LIMIT
                .iter()
                .map(|l| err(&l.replace("11/17/2025", "11/17/2099"))),
        );
        let (_, report) = run(&lines, Some(1));
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: You've hit your usage limit")
        );
        assert!(report
            .resume_at
            .is_some_and(|t| t.format("%Y").to_string() == "2099"));
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Error { .. }))
                .count(),
            7
        );
        assert!(!claims(&report));
    }

    /// Needs the classify.rs rule `authentication required` (asked of the lead): cursor's only
    /// known auth wording matches none of the shared rules yet.
    #[test]
    fn auth_failure_on_stderr_is_auth() {
        let (_, report) = run(&[err(AUTH_REQUIRED)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
    }

    /// What the parser itself owes an auth failure, whatever the rules say: the run failed and
    /// cursor's words are the error message, ANSI removed.
    #[test]
    fn stderr_error_is_reported_as_the_error_message() {
        let (events, report) = run(&[err(&format!("\x1b[31m{AUTH_REQUIRED}\x1b[0m"))], Some(1));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(report.error_message.as_deref(), Some(AUTH_REQUIRED));
        assert_eq!(
            events,
            vec![AgentEvent::Error {
                message: AUTH_REQUIRED.into()
            }]
        );

        let (_, report) = run(&[err("Error: Invalid API key")], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
    }

    #[test]
    fn error_result_text_is_classified_and_successful_text_is_not() {
        let error = r#"{"type":"result","subtype":"error","is_error":true,"result":"You've hit your usage limit","session_id":"s"}"#;
        let (_, report) = run(&[out(error)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(
            report.error_message.as_deref(),
            Some("You've hit your usage limit")
        );

        let answer = r#"{"type":"result","subtype":"success","is_error":false,"result":"Documented the 'You've hit your usage limit' message.","session_id":"s"}"#;
        let (_, report) = run(&[err("Warning: slow network"), out(answer)], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
    }

    #[test]
    fn tool_calls_of_every_kind_and_failed_results() {
        let started = |call: &str| {
            format!(
                r#"{{"type":"tool_call","subtype":"started","call_id":"c","tool_call":{call},"session_id":"s"}}"#
            )
        };
        let completed = |call: &str| {
            format!(
                r#"{{"type":"tool_call","subtype":"completed","call_id":"c","tool_call":{call},"session_id":"s"}}"#
            )
        };
        let lines = [
            out(&started(
                r#"{"readToolCall":{"args":{"path":"src/main.rs"}}}"#,
            )),
            out(&completed(
                r#"{"readToolCall":{"args":{"path":"src/main.rs"},"result":{"success":{"content":"fn main() {}","totalLines":1}}}}"#,
            )),
            out(&started(
                r#"{"editToolCall":{"args":{"path":"src/lib.rs"}}}"#,
            )),
            out(&completed(
                r#"{"editToolCall":{"args":{"path":"src/lib.rs"},"result":{"failure":{"message":"old string not found"}}}}"#,
            )),
            out(&completed(
                r#"{"shellToolCall":{"args":{"command":"false"},"result":{"success":{"exitCode":1,"stdout":"","stderr":""}}}}"#,
            )),
            out(&started(
                r#"{"function":{"name":"linear_search","arguments":"{}"}}"#,
            )),
        ];
        let (events, _) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::ToolCall {
                    name: "read".into(),
                    summary: "src/main.rs".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::ToolCall {
                    name: "edit".into(),
                    summary: "src/lib.rs".into()
                },
                AgentEvent::tool_result(true),
                AgentEvent::tool_result(true),
                AgentEvent::ToolCall {
                    name: "linear_search".into(),
                    summary: String::new()
                },
            ]
        );
    }

    /// Non-JSON lines (a workspace-trust notice, a banner), JSON that is not an object, unknown
    /// types, lossy UTF-8: no crash, and no event except for a plain line that reads as an error
    /// signal (the trust notice), which is shown as the CLI's error (`StreamCore::plain_stdout`).
    #[test]
    fn hostile_lines_are_ignored() {
        let invalid_utf8 = String::from_utf8_lossy(b"{\"type\":\"assistant\xff\"}").into_owned();
        let lines = [
            out("Workspace Trust Required"),
            out(""),
            out("[1,2]"),
            out(r#"{"type":"thinking","subtype":"delta","text":"<promise>COMPLETE</promise>"}"#),
            out(r#"{"type":"tool_call","subtype":"started"}"#),
            out(&invalid_utf8),
            out(&format!("{SAYS}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Error {
                    message: "Workspace Trust Required".into()
                },
                AgentEvent::AssistantText {
                    text: "I'll run the tests first.".into()
                }
            ]
        );
        assert!(!claims(&report));
    }

    #[test]
    fn result_usage_is_read_when_a_build_prints_it() {
        let line = r#"{"type":"result","subtype":"success","is_error":false,"result":"ok","usage":{"inputTokens":100,"outputTokens":30},"session_id":"s"}"#;
        let (_, report) = run(&[out(line)], Some(0));
        assert_eq!(report.usage.input_tokens, 100);
        assert_eq!(report.usage.output_tokens, 30);
        assert_eq!(report.cost_usd, None);
    }

    #[test]
    fn command_line_puts_the_prompt_last_and_refuses_oversized_prompts() {
        let cursor = Cursor::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("gpt-5".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode";
        let spec = cursor.command(prompt).unwrap();
        assert_eq!(spec.program, PathBuf::from("cursor-agent"));
        assert_eq!(
            spec.args,
            [
                "-p",
                "--force",
                "--output-format",
                "stream-json",
                "-m",
                "gpt-5",
                prompt
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin, None, "stdin is /dev/null");
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);

        let custom = Cursor::new(AgentSettings {
            program: Some(PathBuf::from("/home/u/.local/bin/agent")),
            ..AgentSettings::default()
        });
        let spec = custom.command("--- front matter\nwork").unwrap();
        assert_eq!(spec.program, PathBuf::from("/home/u/.local/bin/agent"));
        assert_eq!(
            spec.args,
            [
                "-p",
                "--force",
                "--output-format",
                "stream-json",
                "--",
                "--- front matter\nwork"
            ]
        );

        let fits = "x".repeat(PROMPT_ARG_MAX_BYTES);
        assert!(custom.command(&fits).is_ok());
        let over = "x".repeat(PROMPT_ARG_MAX_BYTES + 1);
        let e = custom.command(&over).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} bytes", PROMPT_ARG_MAX_BYTES + 1))
                && e.contains("102400-byte limit")
                && e.contains("128 KiB"),
            "{e}"
        );
    }
}
