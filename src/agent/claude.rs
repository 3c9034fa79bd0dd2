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
use crate::agent::claude_login::{ApiKey, KeptBecause};
use crate::agent::claude_shape::{self as shape, LastMessage, ResultLine};
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia, SandboxNeeds};
use crate::agent::stream::{with_note, Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::SpawnSpec;
use crate::protocol::fields::str_field;
use crate::protocol::{AgentEvent, AgentKind, AgentReport, FailureClass};

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
    notes: |cx| vec![ApiKey::decide(cx.keep_api_key, &|var| cx.env(var)).describe()],
    build: |settings| Ok(Box::new(Claude::new(settings))),
    sandbox: SandboxNeeds {
        state: &[".claude", ".claude.json", ".config/claude"],
        env_prefixes: &["ANTHROPIC_", "CLAUDE_", "DISABLE_", "MCP_", "IS_SANDBOX"],
        hosts: &[
            "api.anthropic.com:443",
            "statsig.anthropic.com:443",
            "console.anthropic.com:443",
        ],
        base_url_hosts: || crate::agent::registry::env_url_hosts(&["ANTHROPIC_BASE_URL"]),
        config_env: Vec::new,
        state_vars: &["CLAUDE_CONFIG_DIR"],
        config_vars: &[],
    },
};

/// Variables removed from claude's environment. When ralph itself runs inside a Claude Code
/// session these are set, and a child `claude` then refuses to start ("cannot be launched inside
/// another Claude Code session") or tries to talk to the parent's IDE port.
pub const ENV_REMOVED: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SSE_PORT",
];

/// Removed from claude's environment when claude has a login of its own and nothing says the
/// key is needed: with it set, `claude -p` always bills this API key, silently instead of the
/// user's subscription login (`notes/agent-protocols.md` §0.9). See [`ApiKey::decide`].
pub const API_KEY_VAR: &str = crate::agent::claude_login::API_KEY_VAR;

/// The Claude Code backend. Stateless apart from its settings and what it decided about
/// `ANTHROPIC_API_KEY`; each [`Backend::parser`] call returns a fresh [`ClaudeParser`].
#[derive(Debug, Clone)]
pub struct Claude {
    settings: AgentSettings,
    api_key: ApiKey,
}

impl Claude {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `--model settings.model` when set; what happens to `ANTHROPIC_API_KEY` is decided
    /// now, from this process's environment and claude's login files ([`ApiKey::from_env`]).
    pub fn new(settings: AgentSettings) -> Self {
        let api_key = ApiKey::from_env(settings.keep_api_key);
        Claude::with_api_key(settings, api_key)
    }

    /// A backend with the `ANTHROPIC_API_KEY` decision made by the caller.
    pub fn with_api_key(settings: AgentSettings, api_key: ApiKey) -> Self {
        Claude { settings, api_key }
    }

    /// What this backend does with `ANTHROPIC_API_KEY`.
    pub fn api_key(&self) -> &ApiKey {
        &self.api_key
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
        if self.api_key.removed() {
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
    /// `CLAUDE_CODE_SSE_PORT` removed, `ANTHROPIC_API_KEY` removed when [`ApiKey::decide`]
    /// says so, `NO_COLOR=1`, and `IS_SANDBOX=1` when the effective uid is root. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        Ok(self.spec(prompt, nix::unistd::geteuid().is_root()))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // claude never echoes the prompt into the fields the final text comes from.
        Box::new(
            ClaudeParser::with(ClaudeDialect {
                key_removed: self.api_key.removed(),
                ..ClaudeDialect::default()
            })
            .for_model(self.settings.model.as_deref()),
        )
    }

    /// The notice that `ANTHROPIC_API_KEY` is not passed on, when it is not.
    fn notices(&self) -> Vec<String> {
        self.api_key.notice().into_iter().collect()
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
    if let ApiKey::Kept(KeptBecause::NoLogin | KeptBecause::Asked) =
        ApiKey::decide(cx.keep_api_key, &|var| cx.env(var))
    {
        out.push(
            "ANTHROPIC_API_KEY is set and kept: claude bills the API key, not a subscription (log in with `claude` and ralph removes the key for it, unless --keep-api-key)"
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
    /// ralph removed `ANTHROPIC_API_KEY` from this claude's environment: an auth error gets the
    /// `--keep-api-key` hint.
    pub key_removed: bool,
}

impl Dialect for ClaudeDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        // Nearly every byte is in assistant and user lines: read those without a `Value`.
        if let Some(turn) = shape::read_turn(line, core) {
            return match turn.kind() {
                Some("assistant") => turn.on_assistant(core, &mut self.last),
                _ => turn.on_user(),
            };
        }
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

    /// After an auth error in a claude whose `ANTHROPIC_API_KEY` ralph removed, the message
    /// ends with the `--keep-api-key` hint.
    fn annotate(&self, report: &mut AgentReport) {
        if self.key_removed && report.failure == Some(FailureClass::Auth) {
            let hint = ApiKey::Removed {
                login: String::new(),
            }
            .auth_hint()
            .unwrap_or_default();
            report.error_message = Some(with_note(report.error_message.take(), hint));
        }
    }
}

/// The `result` line: the shared fields, then claude's cost, usage, classified error fields
/// and, for an error, its message (the text, else `errors[]`, else the subtype and reason).
fn on_result(v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
    let result = ResultLine::read(v, core, shape::error_prefix);
    let errors = &result.errors;
    let terminal_reason = str_field(v, "terminal_reason");
    shape::observe_api_status(v, core);
    if let Some(reason) = &terminal_reason {
        core.classifier.observe(Signal::TerminalReason(reason));
    }
    if result.is_error {
        // The result text is the agent's own error message only when the run failed; on
        // success it is the assistant's answer, which may quote anything.
        for t in result.text.iter().chain(errors) {
            core.classifier.observe(Signal::Text(t));
        }
    }
    core.error_message = result.is_error.then(|| {
        result
            .nonblank_text()
            .or_else(|| result.joined_errors())
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
        test_support::run_plain::<ClaudeDialect>(lines, exit)
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
                AgentEvent::tool_result(false),
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

    /// A `rate_limit_event` whose `resetsAt` has already passed is never a time to wait for:
    /// no `resume_at` (the run waits `usage_limit_fallback`) and the message says why. The text
    /// of the same message is not used instead: it is the same stale moment.
    #[test]
    fn stale_structured_reset_is_reported_and_not_waited_for() {
        let lines = [
            out(
                r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1753441200,"rateLimitType":"five_hour"},"session_id":"s1"}"#,
            ),
            out(
                r#"{"type":"result","subtype":"success","is_error":true,"result":"You've hit your session limit · resets 2pm (Europe/Helsinki)","api_error_status":429,"terminal_reason":"api_error","session_id":"s1"}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.resume_at, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("You've hit your session limit · resets 2pm (Europe/Helsinki); the reset time it gave (2025-07-25 11:00 UTC) has already passed, so ralph waits usage_limit_fallback instead")
        );
        // A fresh one is the time to wait for.
        let soon = chrono::Utc::now().timestamp() + 3600;
        let fresh = out(&format!(
            r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{soon},"rateLimitType":"seven_day"}},"session_id":"s1"}}"#
        ));
        let (_, report) = run(&[fresh, lines[1].clone()], Some(1));
        assert_eq!(report.resume_at.map(|t| t.timestamp()), Some(soon));
    }

    /// Claude has printed its limit in several wordings (5-hour, weekly, session, extra usage,
    /// the legacy `|<epoch>`), with `·` or `∙`, as the text of an `is_error` result that exits
    /// 0, or on stderr with no result at all. One family: a usage limit with its reset time.
    #[test]
    fn every_limit_wording_is_a_usage_limit_with_its_reset() {
        // A clock reset that has just passed ("resets 5am" read at 5:02) is due now, not
        // tomorrow: the reset is never before the test began, whatever the time of day.
        let began = chrono::Utc::now() - chrono::Duration::seconds(1);
        let legacy = format!(
            "Claude AI usage limit reached|{}",
            chrono::Utc::now().timestamp() + 3 * 3600
        );
        for text in [
            "Weekly limit reached \u{2219} resets 5am",
            "Session limit reached \u{2219} resets 10am",
            "5-hour limit reached \u{00b7} resets 7pm",
            "You're out of extra usage \u{00b7} resets 9pm",
            legacy.as_str(),
        ] {
            let result = format!(
                r#"{{"type":"result","subtype":"success","is_error":true,"result":{},"session_id":"s","total_cost_usd":0}}"#,
                serde_json::Value::String(text.to_owned())
            );
            let (_, report) = run(&[out(&result)], Some(0));
            assert!(report.is_error, "{text}");
            assert_eq!(report.failure, Some(FailureClass::UsageLimit), "{text}");
            let at = report.resume_at.expect(text);
            assert!(at >= began, "{text}: {at}");
            assert!(
                at < chrono::Utc::now() + chrono::Duration::days(30),
                "{text}: {at}"
            );
            assert_eq!(report.error_message.as_deref(), Some(text));

            let (_, report) = run(&[err(text)], Some(1));
            assert_eq!(report.failure, Some(FailureClass::UsageLimit), "{text}");
            assert!(report.resume_at.is_some(), "{text}");
        }
    }

    /// claude sometimes prints its limit sentence as a plain line on stdout in stream-json mode,
    /// among the JSON lines or instead of them, then exits 1. Every member of the family (5-hour,
    /// weekly, session, extra usage, the legacy `|<epoch>`; with or without a reset time; the
    /// time as a clock time or relative) is read from such a line: a usage limit, with the
    /// reset time when the line gives one, and the line as the error message.
    #[test]
    fn a_plain_limit_line_in_stream_json_is_a_usage_limit_with_its_reset() {
        let now = chrono::Utc::now();
        let legacy = format!(
            "Claude AI usage limit reached|{}",
            now.timestamp() + 3 * 3600
        );
        // (line, the reset it names: None, or (earliest, latest) from now, in hours)
        let family: Vec<(&str, Option<(i64, i64)>)> = vec![
            ("5-hour limit reached \u{2219} resets 7pm", Some((0, 25))),
            (
                "5-hour limit reached \u{00b7} resets in 2h 30m",
                Some((2, 3)),
            ),
            ("5-hour limit reached", None),
            (
                "Weekly limit reached \u{2219} resets Mon 5am",
                Some((0, 24 * 8)),
            ),
            (
                "Weekly limit reached \u{2219} resets in 3 days",
                Some((71, 73)),
            ),
            ("Weekly limit reached", None),
            (
                "You've hit your weekly limit \u{00b7} resets Dec 3 at 4pm (America/New_York)",
                Some((0, 24 * 367)),
            ),
            (
                "You've hit your session limit \u{00b7} resets 2pm (Europe/Helsinki)",
                Some((0, 25)),
            ),
            (
                "You\u{2019}ve hit your limit \u{00b7} resets in 45 minutes",
                Some((0, 1)),
            ),
            (
                "You're out of extra usage \u{00b7} resets 9pm",
                Some((0, 25)),
            ),
            (
                "You're out of extra usage \u{00b7} resets in 1 hour",
                Some((0, 2)),
            ),
            ("You're out of extra usage", None),
            (legacy.as_str(), Some((2, 4))),
        ];
        let init = out(
            r#"{"type":"system","subtype":"init","session_id":"s1","model":"claude-sonnet-4-5","claude_code_version":"2.1.332"}"#,
        );
        for (line, reset) in family {
            // Instead of the JSON lines, and among them (after init, before the exit).
            for lines in [vec![out(line)], vec![init.clone(), out(line)]] {
                let (events, report) = run(&lines, Some(1));
                assert!(report.is_error, "{line}");
                assert_eq!(report.failure, Some(FailureClass::UsageLimit), "{line}");
                assert_eq!(report.error_message.as_deref(), Some(line), "{line}");
                assert!(
                    events.contains(&AgentEvent::Error {
                        message: line.to_owned()
                    }),
                    "{line}: {events:?}"
                );
                match reset {
                    None => assert_eq!(report.resume_at, None, "{line}"),
                    Some((lo, hi)) => {
                        let at = report
                            .resume_at
                            .unwrap_or_else(|| panic!("{line}: no reset"));
                        let hours = (at - now).num_minutes() as f64 / 60.0;
                        assert!(
                            hours >= lo as f64 - 0.1 && hours <= hi as f64 + 0.1,
                            "{line}: resets in {hours} h"
                        );
                    }
                }
            }
        }
        // A stray plain line that says nothing of a failure is kept quietly; after a successful
        // result it changes nothing.
        let result = out(
            r#"{"type":"result","subtype":"success","is_error":false,"result":"done","session_id":"s1","total_cost_usd":0.01}"#,
        );
        let (events, report) = run(
            &[init.clone(), out("hook: formatted 3 files"), result],
            Some(0),
        );
        assert!(!report.is_error && report.failure.is_none());
        assert!(
            !events.iter().any(|e| matches!(e, AgentEvent::Error { .. })),
            "{events:?}"
        );
        // With nothing else to go on, it explains a failed run.
        let (_, report) = run(&[init, out("hook: formatted 3 files")], Some(1));
        assert_eq!(
            report.error_message.as_deref(),
            Some("hook: formatted 3 files")
        );
    }

    /// After a flood of plain chatter (more lines than are classified as they come), the limit
    /// sentence at the end is still read, when the run ends: a usage limit with its reset.
    #[test]
    fn a_limit_line_after_a_flood_of_plain_chatter_is_still_a_usage_limit() {
        let mut lines = vec![out(
            r#"{"type":"system","subtype":"init","session_id":"s1","model":"m"}"#,
        )];
        for n in 0..(crate::agent::stream::StreamCore::PLAIN_LIVE_LINES * 3) {
            lines.push(out(&format!("chatter line {n}, not JSON")));
        }
        lines.push(out("5-hour limit reached \u{00b7} resets in 2h 30m"));
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert!(report.resume_at.is_some());
        assert_eq!(
            report.error_message.as_deref(),
            Some("5-hour limit reached \u{00b7} resets in 2h 30m")
        );
    }

    /// Older claude versions end with the status only in the text, no `api_error_status`.
    #[test]
    fn status_only_in_the_text_decides_the_class() {
        for (text, class) in [
            (
                r#"API Error: 500 {"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
                FailureClass::Transient,
            ),
            (r#"API Error: 502 Bad Gateway"#, FailureClass::Transient),
            (
                r#"API Error: 503 {"type":"error","error":{"type":"api_error","message":"Service Unavailable"}}"#,
                FailureClass::Transient,
            ),
            (
                r#"API Error: 504 {"type":"error","error":{"type":"timeout_error","message":"Gateway Timeout"}}"#,
                FailureClass::Transient,
            ),
            (
                r#"API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                FailureClass::Transient,
            ),
            (
                r#"API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                FailureClass::Auth,
            ),
            (
                r#"API Error: 403 {"type":"error","error":{"type":"permission_error","message":"Request not allowed"}}"#,
                FailureClass::Auth,
            ),
        ] {
            let result = format!(
                r#"{{"type":"result","subtype":"success","is_error":true,"result":{},"session_id":"s"}}"#,
                serde_json::Value::String(text.to_owned())
            );
            let (_, report) = run(&[out(&result)], Some(1));
            assert_eq!(report.failure, Some(class), "{text}");
        }
    }

    /// What claude 2.1.332 printed for a 404 `not_found_error` about the model: a config error
    /// (never retried, never a failed iteration), with the model named.
    #[test]
    fn a_missing_model_is_a_config_error_naming_it() {
        let lines = [
            out(
                r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s","model":"claude-nope-9","claude_code_version":"2.1.332"}"#,
            ),
            err(
                r#"Claude Code doesn't recognize the model "claude-nope-9", so it assumes a context window of 1m tokens."#,
            ),
            out(
                r#"{"type":"assistant","message":{"id":"m","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model."}]},"error":"model_not_found","parent_tool_use_id":null,"session_id":"s"}"#,
            ),
            out(
                r#"{"duration_api_ms":0,"session_id":"s","total_cost_usd":0,"terminal_reason":"api_error","is_error":true,"subtype":"success","api_error_status":404,"result":"There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model.","type":"result"}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Config));
        let message = report.error_message.unwrap_or_default();
        assert!(
            message.starts_with("the model `claude-nope-9` does not exist or this account cannot use it: fix --model"),
            "{message}"
        );
        // The same in an older version: the raw 404 envelope, the model only in the message;
        // and a warning about an unknown model in a run that succeeds changes nothing.
        let old = r#"{"type":"result","subtype":"success","is_error":true,"result":"API Error: 404 {\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"model: claude-3-opus-nope\"}}","session_id":"s"}"#;
        let (_, report) = run(&[out(old)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report
            .error_message
            .unwrap_or_default()
            .contains("`claude-3-opus-nope`"));
        let (_, report) = run(
            &[lines[1].clone(), out(FINAL_TEXT), out(RESULT_TYPE_LAST)],
            Some(0),
        );
        assert_eq!(report.failure, None);
    }

    /// `error_during_execution` results carry no `result` text: the reason is in `errors[]`.
    #[test]
    fn error_during_execution_reports_its_errors() {
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"duration_ms":1200,"num_turns":3,"session_id":"s","total_cost_usd":0.02,"errors":["Error: Request was aborted.","[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=tool_use"],"terminal_reason":"aborted_streaming"}"#;
        let (_, report) = run(&[out(FINAL_TEXT), out(line)], Some(1));
        assert!(report.is_error);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: Request was aborted.; [ede_diagnostic] result_type=user last_content_type=n/a stop_reason=tool_use")
        );
        assert_eq!(
            report.failure, None,
            "an aborted run uses the failure budget"
        );
        // An entry that names a class decides it.
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"session_id":"s","errors":[{"message":"API Error: 529 Overloaded"}]}"#;
        let (_, report) = run(&[out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Transient));
        assert_eq!(
            report.error_message.as_deref(),
            Some("API Error: 529 Overloaded")
        );
    }

    /// An answer that only discusses limits, keys and models, in a run that finished its story,
    /// is not a failure: the result says `is_error:false`.
    #[test]
    fn an_answer_about_limits_is_not_a_limit() {
        let answer = "Handled `Weekly limit reached ∙ resets 5am`, `Invalid API key · Please run /login` and `API Error: 500` in parse.rs.\n<promise>COMPLETE</promise>";
        let result = format!(
            r#"{{"type":"result","subtype":"success","is_error":false,"result":{},"session_id":"s","total_cost_usd":0.1}}"#,
            serde_json::Value::String(answer.to_owned())
        );
        let (_, report) = run(&[out(&result)], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.resume_at, None);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    /// After an auth error in a claude whose `ANTHROPIC_API_KEY` ralph removed, the message
    /// ends with the `--keep-api-key` hint; not otherwise.
    #[test]
    fn auth_error_after_the_key_was_removed_names_keep_api_key() {
        let line = r#"{"type":"result","subtype":"success","is_error":true,"result":"OAuth token has expired. Please obtain a new token or refresh your existing token.","api_error_status":401,"session_id":"s"}"#;
        let mut parser: Box<dyn OutputParser> = Box::new(ClaudeParser::with(ClaudeDialect {
            key_removed: true,
            ..ClaudeDialect::default()
        }));
        parser.on_line(&out(line));
        let report = parser.finish(Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        let message = report.error_message.unwrap_or_default();
        assert!(
            message.starts_with("OAuth token has expired.")
                && message.ends_with("run with --keep-api-key to authenticate with the key"),
            "{message}"
        );
        assert_eq!(message.lines().count(), 1, "{message}");
        let (_, report) = run(&[out(line)], Some(1));
        assert!(!report
            .error_message
            .unwrap_or_default()
            .contains("--keep-api-key"));
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
        assert!(events.contains(&AgentEvent::tool_result(false)));
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
        assert_eq!(events[0], AgentEvent::tool_result(true));
        assert!(report.saw_final);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    #[test]
    fn command_line_env_and_stdin() {
        let removed = ApiKey::Removed {
            login: "/home/u/.claude/.credentials.json".into(),
        };
        let claude = Claude::with_api_key(
            AgentSettings {
                repo: PathBuf::from("/w/repo"),
                model: Some("sonnet".into()),
                ..AgentSettings::default()
            },
            removed.clone(),
        );
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
        assert_eq!(claude.notices().len(), 1);
        for kept in [
            ApiKey::Unset,
            ApiKey::Kept(KeptBecause::Asked),
            ApiKey::Kept(KeptBecause::BaseUrl),
            ApiKey::Kept(KeptBecause::NoLogin),
        ] {
            let keep = Claude::with_api_key(AgentSettings::default(), kept);
            assert!(!keep
                .spec(prompt, false)
                .env_remove
                .iter()
                .any(|v| v == "ANTHROPIC_API_KEY"));
            assert!(keep.notices().is_empty());
        }

        let root = claude.spec(prompt, true);
        assert!(root
            .env_set
            .contains(&("IS_SANDBOX".to_owned(), "1".to_owned())));

        let custom = Claude::with_api_key(
            AgentSettings {
                program: Some(PathBuf::from("/opt/claude/bin/claude")),
                ..AgentSettings::default()
            },
            removed,
        );
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
