//! The Claude Code backend: `claude -p --output-format stream-json --verbose`, prompt on stdin.
//!
//! This module owns claude's command line, its environment hygiene, its facts ([`INFO`], doctor
//! traps) and what its stream-json output has beyond the shape it shares with amp and cursor
//! ([`crate::agent::claude_shape`], which holds the reading rules). Schema source:
//! `notes/agent-protocols.md` §1 (claude-agent-sdk message parser) and `notes/real-clis.md` §1
//! (what claude 2.1.332 really prints).
//!
//! claude's own reading rules:
//! - `system/init` names the version (`claude_code_version`); `system/api_retry` is retry
//!   chatter whose status and error code count only if the run then fails;
//! - a rejected `rate_limit_event` gives the usage limit's reset time (`resetsAt`);
//! - cost and usage come from the `result` line only; `assistant.message.usage` repeats across
//!   the blocks of one turn and must not be summed. An error result's text, `errors[]`,
//!   `api_error_status` and `terminal_reason` go to the classifier.

use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::claude_shape::{self as shape, LastMessage, ResultLine};
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia};
use crate::agent::stream::{Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::SpawnSpec;
use crate::protocol::fields::str_field;
use crate::protocol::{AgentEvent, AgentKind};

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "claude";

/// Facts about the claude backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Claude,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it with `npm install -g @anthropic-ai/claude-code`",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: traps,
    build: |settings| Ok(Box::new(Claude::new(settings))),
};

/// Variables removed from claude's environment. When ralph itself runs inside a Claude Code
/// session these are set, and a child `claude` then refuses to start ("cannot be launched inside
/// another Claude Code session") or tries to talk to the parent's IDE port.
pub const ENV_REMOVED: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SSE_PORT",
];

/// Removed from claude's environment unless `--keep-api-key`: with it set, `claude -p` always
/// bills this API key, silently instead of the user's subscription login
/// (`notes/agent-protocols.md` §0.9).
pub const API_KEY_VAR: &str = "ANTHROPIC_API_KEY";

/// The Claude Code backend. Stateless apart from its settings; each [`Backend::parser`] call
/// returns a fresh [`ClaudeParser`].
#[derive(Debug, Clone)]
pub struct Claude {
    settings: AgentSettings,
}

impl Claude {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `--model settings.model` when set.
    pub fn new(settings: AgentSettings) -> Self {
        Claude { settings }
    }

    /// The spawn spec for `prompt`, as run by a root (`as_root`) or ordinary user.
    ///
    /// As root, `IS_SANDBOX=1` is set: claude refuses `--dangerously-skip-permissions` under
    /// uid 0 otherwise ("cannot be used with root/sudo privileges"), and ralph exists for
    /// unattended runs, which as root means a sandbox or container.
    fn spec(&self, prompt: &str, as_root: bool) -> SpawnSpec {
        let args = self.settings.args_with_model(
            &[
                "-p",
                "--output-format",
                "stream-json",
                // stream-json with -p is refused without --verbose.
                "--verbose",
                "--dangerously-skip-permissions",
            ],
            "--model",
        );
        // On stdin, never argv: no size limit (E2BIG at 128 KiB) and no shell quoting.
        let mut spec = self.settings.cli_spec(DEFAULT_PROGRAM, args, Some(prompt));
        if as_root {
            spec.env_set.push(("IS_SANDBOX".to_owned(), "1".to_owned()));
        }
        spec.env_remove = ENV_REMOVED.iter().map(|s| (*s).to_owned()).collect();
        if !self.settings.keep_api_key {
            spec.env_remove.push(API_KEY_VAR.to_owned());
        }
        spec
    }
}

impl Backend for Claude {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `claude -p --output-format stream-json --verbose --dangerously-skip-permissions
    /// [--model M]`, the prompt on stdin, `CLAUDECODE`/`CLAUDE_CODE_ENTRYPOINT`/
    /// `CLAUDE_CODE_SSE_PORT` removed, `ANTHROPIC_API_KEY` removed unless
    /// [`AgentSettings::keep_api_key`], `NO_COLOR=1`, and `IS_SANDBOX=1` when the effective uid is
    /// root. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        Ok(self.spec(prompt, nix::unistd::geteuid().is_root()))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // claude never echoes the prompt into the fields the final text comes from.
        Box::new(ClaudeParser::new())
    }
}

/// Root without `IS_SANDBOX`, an API key that switches billing, a parent Claude Code session,
/// and an `agent_cmd` running claude's stream-json without `--verbose`.
fn traps(cx: &DoctorContext<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if cx.root && cx.env("IS_SANDBOX").as_deref() != Some("1") {
        out.push(
            "running as root without IS_SANDBOX=1: claude refuses --dangerously-skip-permissions as root; ralph sets IS_SANDBOX=1 for the claude it starts, a claude you start by hand needs `export IS_SANDBOX=1` (only in a sandbox or container)"
                .to_owned(),
        );
    }
    if cx.env_set(API_KEY_VAR) {
        out.push(
            "ANTHROPIC_API_KEY is set: with it claude bills the API key, not your subscription; ralph removes it for claude unless --keep-api-key"
                .to_owned(),
        );
    }
    if cx.env_set("CLAUDECODE") {
        out.push(
            "running inside a Claude Code session (CLAUDECODE is set): ralph removes CLAUDECODE, CLAUDE_CODE_ENTRYPOINT and CLAUDE_CODE_SSE_PORT for its claude"
                .to_owned(),
        );
    }
    let cmd = cx.agent_cmd.unwrap_or("");
    if cmd.contains("claude") && cmd.contains("stream-json") && !cmd.contains("--verbose") {
        out.push(format!(
            "agent_cmd `{cmd}` uses claude's stream-json without --verbose, which claude refuses with -p; add --verbose (or use --agent claude)"
        ));
    }
    out
}

/// Reads claude's stream-json output. Memory use is bounded by the largest single assistant
/// message plus a few stderr lines, whatever the length of the run.
pub type ClaudeParser = Parser<ClaudeDialect>;

/// claude's dialect of the shared shape (see the module docs).
#[derive(Debug, Default)]
pub struct ClaudeDialect {
    last: LastMessage,
}

impl Dialect for ClaudeDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = shape::read_line(line, core) else {
            return Vec::new();
        };
        match shape::line_type(&v) {
            Some("system") if shape::is_init(&v) => {
                shape::on_init(&v, core, Some("claude_code_version"))
            }
            Some("system") => {
                if v.get("subtype").and_then(Value::as_str) == Some("api_retry") {
                    // Retry chatter: only decisive if the run then fails.
                    if let Some(status) = v.get("error_status").and_then(shape::as_status) {
                        core.classifier.observe(Signal::ApiStatus(status));
                    }
                    if let Some(code) = v.get("error").and_then(Value::as_str) {
                        core.classifier.observe(Signal::ErrorCode(code));
                    }
                }
                Vec::new()
            }
            Some("assistant") => shape::on_assistant(&v, core, &mut self.last),
            Some("user") => shape::on_user(&v),
            Some("rate_limit_event") => {
                if let Some(status) = v.pointer("/rate_limit_info/status").and_then(Value::as_str) {
                    core.classifier.observe(Signal::RateLimitStatus(status));
                    if status == "rejected" {
                        core.resume_at = v
                            .pointer("/rate_limit_info/resetsAt")
                            .and_then(Value::as_i64)
                            .and_then(|epoch| chrono::DateTime::from_timestamp(epoch, 0));
                    }
                }
                Vec::new()
            }
            Some("result") => on_result(&v, core),
            _ => Vec::new(),
        }
    }

    /// The last top-level assistant message stands in for a missing `result.result`.
    fn settle(&mut self, core: &mut StreamCore, _exit_code: Option<i32>) {
        self.last.settle(core);
    }
}

/// The `result` line: the shared fields, then claude's cost, usage, classified error fields
/// and, for an error, its message (the text, else `errors[]`, else the subtype and reason).
fn on_result(v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
    let result = ResultLine::read(v, core, shape::error_prefix);
    let errors: Vec<String> = v
        .get("errors")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(shape::error_text).collect())
        .unwrap_or_default();
    let terminal_reason = str_field(v, "terminal_reason");
    shape::observe_api_status(v, core);
    if let Some(reason) = &terminal_reason {
        core.classifier.observe(Signal::TerminalReason(reason));
    }
    if result.is_error {
        // The result text is the agent's own error message only when the run failed; on
        // success it is the assistant's answer, which may quote anything.
        for t in result.text.iter().chain(&errors) {
            core.classifier.observe(Signal::Text(t));
        }
    }
    core.error_message = result.is_error.then(|| {
        result
            .nonblank_text()
            .or_else(|| (!errors.is_empty()).then(|| errors.join("; ")))
            .unwrap_or_else(|| match &terminal_reason {
                Some(reason) => format!("{} ({reason})", result.ended_with("claude", "error")),
                None => result.ended_with("claude", "error"),
            })
    });
    if core.model.is_none() {
        core.model = v
            .get("modelUsage")
            .and_then(Value::as_object)
            .and_then(|m| m.keys().next().cloned());
    }
    core.usage = v.get("usage").map(shape::usage_of).unwrap_or_default();
    core.cost_usd = v.get("total_cost_usd").and_then(Value::as_f64);
    vec![result.event()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stream::test_support::{self, err, out};
    use crate::completion::promise_in_final_text;
    use crate::process::{strip_ansi, OutputLine};
    use crate::protocol::fields::summarize_tool_input;
    use crate::protocol::{AgentReport, FailureClass, Usage};
    use std::path::PathBuf;

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        test_support::run::<ClaudeDialect>(lines, exit)
    }

    const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"/w/repo","session_id":"3f2a9c40-1111","tools":["Task","Bash","Write"],"mcp_servers":[],"model":"claude-opus-5-5","permissionMode":"bypassPermissions","apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.332","uuid":"u1"}"#;
    const TOOL_USE: &str = r#"{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"toolu_01","name":"Write","input":{"file_path":"/w/repo/hello.txt","content":"hi\n"}}],"stop_reason":null,"usage":{"input_tokens":4,"output_tokens":9}},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111","uuid":"u2","timestamp":"2026-11-29T10:00:00Z"}"#;
    const TOOL_RESULT: &str = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01","type":"tool_result","content":"File created successfully at: /w/repo/hello.txt"}]},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111","tool_use_result":{"type":"create","filePath":"/w/repo/hello.txt","content":"hi\n"}}"#;
    const FINAL_TEXT: &str = r#"{"type":"assistant","message":{"id":"msg_02","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Created hello.txt. <promise>COMPLETE</promise>"}],"stop_reason":null,"usage":{"input_tokens":4,"output_tokens":9}},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111"}"#;
    /// claude 2.1.332's result line: `type` is not the first key.
    const RESULT_TYPE_LAST: &str = r#"{"duration_api_ms":36,"stop_reason":"end_turn","session_id":"3f2a9c40-1111","total_cost_usd":0.00028,"usage":{"input_tokens":57,"cache_creation_input_tokens":20311,"cache_read_input_tokens":401233,"output_tokens":3120},"modelUsage":{"claude-opus-5-5":{"inputTokens":57}},"permission_denials":[],"terminal_reason":"completed","is_error":false,"num_turns":2,"subtype":"success","api_error_status":null,"result":"Created hello.txt. <promise>COMPLETE</promise>","type":"result","uuid":"u9"}"#;

    #[test]
    fn real_2_1_332_run_with_type_last_in_result() {
        let lines = [
            out(INIT),
            out(TOOL_USE),
            out(TOOL_RESULT),
            out(FINAL_TEXT),
            out(RESULT_TYPE_LAST),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("3f2a9c40-1111".into()),
                    model: Some("claude-opus-5-5".into()),
                    version: Some("2.1.332".into()),
                },
                AgentEvent::ToolCall {
                    name: "Write".into(),
                    summary: "/w/repo/hello.txt".into()
                },
                AgentEvent::ToolResult { is_error: false },
                AgentEvent::AssistantText {
                    text: "Created hello.txt. <promise>COMPLETE</promise>".into()
                },
                AgentEvent::Final {
                    text: Some("Created hello.txt. <promise>COMPLETE</promise>".into()),
                    is_error: false,
                },
            ]
        );
        assert!(report.saw_final);
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
        assert_eq!(report.cost_usd, Some(0.00028));
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 57,
                output_tokens: 3120,
                cache_read_tokens: 401_233,
                cache_creation_tokens: 20311,
            }
        );
        assert_eq!(report.session_id.as_deref(), Some("3f2a9c40-1111"));
        assert_eq!(report.model.as_deref(), Some("claude-opus-5-5"));
        assert_eq!(report.agent_version.as_deref(), Some("2.1.332"));
    }

    /// An API failure: `subtype:"success"` but `is_error:true`, after retry chatter and a
    /// synthetic assistant message.
    #[test]
    fn api_error_result_with_subtype_success_is_an_error() {
        let lines = [
            out(INIT),
            out(
                r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":1,"retry_delay_ms":500,"error_status":500,"error":"server_error","session_id":"3f2a9c40-1111"}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"msg_s","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"API Error: 500 scripted failure"}],"usage":{"input_tokens":0,"output_tokens":0}},"error":"server_error","parent_tool_use_id":null,"session_id":"3f2a9c40-1111"}"#,
            ),
            out(
                r#"{"total_cost_usd":0,"is_error":true,"subtype":"success","api_error_status":500,"terminal_reason":"api_error","result":"API Error: 500 scripted failure. This is a server-side issue","session_id":"3f2a9c40-1111","type":"result"}"#,
            ),
        ];
        let (events, report) = run(&lines, Some(1));
        assert!(events.contains(&AgentEvent::Error {
            message: "API Error: 500 scripted failure".into()
        }));
        assert!(report.is_error);
        assert!(report.saw_final);
        assert_eq!(report.failure, Some(FailureClass::Transient));
        assert_eq!(
            report.error_message.as_deref(),
            Some("API Error: 500 scripted failure. This is a server-side issue")
        );
        // The synthetic message is not the model's name.
        assert_eq!(report.model.as_deref(), Some("claude-opus-5-5"));
    }

    /// Case 12's claude shape: rate_limit_event rejected, synthetic message, 429 result.
    #[test]
    fn synthetic_usage_limit_message_is_a_usage_limit() {
        let lines = [
            out(
                r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1790161200,"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":"org_level_disabled"},"uuid":"u","session_id":"s1"}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m1","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"You've hit your session limit · resets 2pm (Europe/Helsinki)"}],"usage":{"input_tokens":0,"output_tokens":0}},"error":"rate_limit","parent_tool_use_id":null,"session_id":"s1"}"#,
            ),
            out(
                r#"{"type":"result","subtype":"success","is_error":true,"result":"You've hit your session limit · resets 2pm (Europe/Helsinki)","api_error_status":429,"terminal_reason":"api_error","num_turns":1,"duration_ms":412,"duration_api_ms":0,"total_cost_usd":0,"session_id":"s1"}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert!(report.is_error);
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.session_id.as_deref(), Some("s1"));
        assert_eq!(report.model, None);
        assert_eq!(report.cost_usd, Some(0.0));
        assert!(!promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    /// Case 16 and the root check: deterministic config errors on stderr, no stdout at all.
    #[test]
    fn config_errors_on_stderr_without_result() {
        for (line, expect) in [
            (
                "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons",
                FailureClass::Config,
            ),
            ("Error: Claude Code cannot be launched inside another Claude Code session.", FailureClass::Config),
            ("\x1b[31mError: When using --print, --output-format=stream-json requires --verbose\x1b[0m", FailureClass::Config),
            ("Invalid API key · Please run /login", FailureClass::Auth),
        ] {
            let (events, report) = run(&[err(line)], Some(1));
            assert_eq!(report.failure, Some(expect), "{line}");
            assert!(report.is_error && !report.saw_final, "{line}");
            assert_eq!(report.error_message.as_deref(), Some(strip_ansi(line).as_str()));
            assert!(matches!(&events[..], [AgentEvent::Error { .. }]));
        }
    }

    #[test]
    fn auth_failure_from_assistant_error_field_and_status() {
        let lines = [
            out(
                r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"error_status":401,"error":"authentication_failed"}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m","model":"<synthetic>","content":[{"type":"text","text":"Failed to authenticate. API Error: 401"}]},"error":"authentication_failed","parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"result","subtype":"success","is_error":true,"result":"Failed to authenticate. API Error: 401","api_error_status":401,"session_id":"s"}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
    }

    /// Scenario 7: overload chatter followed by success is not a failure.
    #[test]
    fn retry_chatter_then_success_is_not_a_failure() {
        let lines = [
            out(
                r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"error_status":529,"error":"overloaded"}"#,
            ),
            err("API Error: 529 Overloaded, retrying"),
            out(FINAL_TEXT),
            out(RESULT_TYPE_LAST),
        ];
        let (_, report) = run(&lines, Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
    }

    #[test]
    fn context_too_long() {
        let line = r#"{"type":"result","subtype":"success","is_error":true,"result":"Prompt is too long","terminal_reason":"prompt_too_long"}"#;
        let (_, report) = run(&[out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Context));
    }

    #[test]
    fn max_turns_without_result_text_uses_last_assistant_message() {
        let lines = [
            out(
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Part one."}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Part two."}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":201,"errors":[],"terminal_reason":"max_turns","total_cost_usd":1.9}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert!(report.is_error);
        assert_eq!(report.final_text.as_deref(), Some("Part one.\nPart two."));
        assert_eq!(
            report.error_message.as_deref(),
            Some("claude ended with error_max_turns (max_turns)")
        );
        assert_eq!(report.failure, None);
        assert_eq!(report.cost_usd, Some(1.9));
    }

    /// Blocks of one message (same `message.id`) are grouped; a new id starts a new message; a
    /// subagent's text never becomes the final text.
    #[test]
    fn final_text_fallback_groups_by_message_id_and_ignores_subagents() {
        let lines = [
            out(
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Old turn. <promise>COMPLETE</promise>"}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m2","content":[{"type":"text","text":"Checking."}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m2","content":[{"type":"tool_use","id":"t","name":"Bash","input":{"command":"cargo   test\n --all"}}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"sub","content":[{"type":"text","text":"<promise>COMPLETE</promise>"}]},"parent_tool_use_id":"toolu_9"}"#,
            ),
        ];
        let (events, report) = run(&lines, None);
        assert!(events.contains(&AgentEvent::ToolCall {
            name: "Bash".into(),
            summary: "cargo test --all".into()
        }));
        assert!(!events.contains(&AgentEvent::AssistantText {
            text: "<promise>COMPLETE</promise>".into()
        }));
        assert_eq!(report.final_text.as_deref(), Some("Checking."));
        assert!(!report.saw_final);
        assert!(report.is_error, "killed without a result line");
    }

    /// Case 5: the promise inside a tool result (a file the agent read) never counts.
    #[test]
    fn case_5_promise_in_tool_result_does_not_count() {
        let lines = [
            out(
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/w/repo/prompt.md"}}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"Reply <promise>COMPLETE</promise>","is_error":false}]},"parent_tool_use_id":null}"#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m2","content":[{"type":"text","text":"I read the instructions."}]},"parent_tool_use_id":null}"#,
            ),
        ];
        let (events, report) = run(&lines, Some(0));
        assert!(events.contains(&AgentEvent::ToolResult { is_error: false }));
        assert!(!promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
        let with_result = [
            &lines[..],
            &[out(
                r#"{"type":"result","is_error":false,"result":"I read the instructions."}"#,
            )],
        ]
        .concat();
        let (_, report) = run(&with_result, Some(0));
        assert!(!promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    /// Case 14: non-JSON lines, JSON that is not an object, unknown types, a lossily decoded
    /// line, and a 6 MB line: no crash, the real events still parsed.
    #[test]
    fn hostile_lines_are_ignored_and_big_lines_parse() {
        let big = format!(
            r#"{{"type":"user","message":{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":"{}","is_error":true}}]}},"parent_tool_use_id":null}}"#,
            "x".repeat(6 * 1024 * 1024)
        );
        let invalid_utf8 =
            String::from_utf8_lossy(b"{\"type\":\"assistant\xff\xfe\"}").into_owned();
        let lines = [
            out("Warning: something on stdout that is not JSON"),
            out(""),
            out("[1,2,3]"),
            out("\"type\":\"result\""),
            out(r#"{"type":"stream_event","event":{"type":"message_start"}}"#),
            out(r#"{"type":"some_future_type","result":"<promise>COMPLETE</promise>"}"#),
            out(&invalid_utf8),
            out(&big),
            out(&format!("{RESULT_TYPE_LAST}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0], AgentEvent::ToolResult { is_error: true });
        assert!(report.saw_final);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    #[test]
    fn command_line_env_and_stdin() {
        let claude = Claude::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("sonnet".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode";
        let spec = claude.spec(prompt, false);
        assert_eq!(spec.program, PathBuf::from("claude"));
        assert_eq!(
            spec.args,
            [
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
                "--model",
                "sonnet"
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        for var in [
            "CLAUDECODE",
            "CLAUDE_CODE_ENTRYPOINT",
            "CLAUDE_CODE_SSE_PORT",
            "ANTHROPIC_API_KEY",
        ] {
            assert!(spec.env_remove.iter().any(|v| v == var), "{var}");
        }
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);
        let keep = Claude::new(AgentSettings {
            keep_api_key: true,
            ..AgentSettings::default()
        });
        assert!(!keep
            .spec(prompt, false)
            .env_remove
            .iter()
            .any(|v| v == "ANTHROPIC_API_KEY"));

        let root = claude.spec(prompt, true);
        assert!(root
            .env_set
            .contains(&("IS_SANDBOX".to_owned(), "1".to_owned())));

        let custom = Claude::new(AgentSettings {
            program: Some(PathBuf::from("/opt/claude/bin/claude")),
            ..AgentSettings::default()
        });
        let spec = custom.spec("p", false);
        assert_eq!(spec.program, PathBuf::from("/opt/claude/bin/claude"));
        assert!(!spec.args.iter().any(|a| a == "--model"));
    }

    #[test]
    fn tool_summaries_are_one_short_line() {
        use serde_json::json;
        assert_eq!(
            summarize_tool_input(&json!({"pattern": "TODO", "path": "src"})),
            "TODO in src"
        );
        assert_eq!(
            summarize_tool_input(&json!({"url": "https://example.com"})),
            "https://example.com"
        );
        assert_eq!(summarize_tool_input(&json!({"todos": [1, 2]})), "2 todos");
        assert_eq!(summarize_tool_input(&json!({"x": 1})), r#"{"x":1}"#);
        let long = summarize_tool_input(&json!({"command": "é".repeat(500)}));
        assert_eq!(
            long.chars().count(),
            crate::protocol::fields::SUMMARY_MAX_CHARS + 1
        );
        assert!(long.ends_with('…'));
    }
}
