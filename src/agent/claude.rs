//! The Claude Code backend: `claude -p --output-format stream-json --verbose`, prompt on stdin.
//!
//! This module owns claude's command line, its environment hygiene, and the reading of its
//! stream-json output (one JSON object per stdout line) into [`AgentEvent`]s and an
//! [`AgentReport`]. Schema source: `notes/agent-protocols.md` §1 (claude-agent-sdk message
//! parser) and `notes/real-clis.md` §1 (what claude 2.1.332 really prints).
//!
//! Reading rules, each forced by real output:
//! - every line is parsed as JSON, never prefix-matched: in 2.1.332's `result` line `"type"` is
//!   not the first key; lines that are not JSON objects, and unknown `type`s, yield no event;
//! - the final text is `result.result`; without it (error subtypes, a run cut short), the text
//!   blocks of the last top-level assistant message. Claude prints one `assistant` line per
//!   content block, so blocks are grouped by `message.id`; subagent traffic
//!   (`parent_tool_use_id` not null) never counts;
//! - success is `result.is_error`, never `subtype`: API failures arrive as
//!   `subtype:"success", is_error:true`;
//! - cost and usage come from the `result` line only; `assistant.message.usage` repeats across
//!   the blocks of one turn and must not be summed.

use serde_json::Value;

use crate::agent::classify::{Classifier, Signal};
use crate::agent::{AgentSettings, Backend, OutputParser, StderrTail};
use crate::process::{strip_ansi, OutputLine, SpawnSpec, StreamKind};
use crate::protocol::fields::{str_field, summarize_tool_input};
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::AgentReport;
use crate::protocol::Usage;

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "claude";

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
        let program = self.settings.program_or(DEFAULT_PROGRAM);
        let mut args: Vec<String> = [
            "-p",
            "--output-format",
            "stream-json",
            // stream-json with -p is refused without --verbose.
            "--verbose",
            "--dangerously-skip-permissions",
        ]
        .map(String::from)
        .to_vec();
        if let Some(model) = &self.settings.model {
            args.push("--model".into());
            args.push(model.clone());
        }
        let mut env_set = vec![("NO_COLOR".to_owned(), "1".to_owned())];
        if as_root {
            env_set.push(("IS_SANDBOX".to_owned(), "1".to_owned()));
        }
        let mut env_remove: Vec<String> = ENV_REMOVED.iter().map(|s| (*s).to_owned()).collect();
        if !self.settings.keep_api_key {
            env_remove.push(API_KEY_VAR.to_owned());
        }
        SpawnSpec {
            program,
            args,
            cwd: self.settings.repo.clone(),
            env_remove,
            env_set,
            // On stdin, never argv: no size limit (E2BIG at 128 KiB) and no shell quoting.
            stdin: Some(prompt.as_bytes().to_vec()),
        }
    }
}

impl Backend for Claude {
    fn kind(&self) -> AgentKind {
        AgentKind::Claude
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

/// What the terminal `result` line said.
#[derive(Debug, Clone, Default)]
struct ResultLine {
    text: Option<String>,
    is_error: bool,
    subtype: Option<String>,
    terminal_reason: Option<String>,
    errors: Vec<String>,
    cost_usd: Option<f64>,
    usage: Usage,
}

/// Reads claude's stream-json output. Memory use is bounded by the largest single assistant
/// message plus a few stderr lines, whatever the length of the run.
#[derive(Debug, Default)]
pub struct ClaudeParser {
    session_id: Option<String>,
    model: Option<String>,
    version: Option<String>,
    /// `message.id` of the last top-level assistant message, and its text blocks so far.
    last_message_id: Option<String>,
    last_message_texts: Vec<String>,
    result: Option<ResultLine>,
    classifier: Classifier,
    /// Text of the last assistant message that carried an `error` field (a synthetic API error).
    assistant_error: Option<String>,
    stderr_tail: StderrTail,
    /// `rate_limit_event.rate_limit_info.resetsAt` (epoch seconds) of a rejected limit.
    resets_at: Option<i64>,
}

impl ClaudeParser {
    /// A parser for one claude run.
    pub fn new() -> Self {
        Self::default()
    }

    fn on_stdout(&mut self, text: &str) -> Vec<AgentEvent> {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text.trim()) else {
            // Not JSON (or not an object): claude keeps stdout clean in stream-json mode, but a
            // wrapper or a hook may not. The transcript keeps the raw line.
            return Vec::new();
        };
        let v = Value::Object(obj);
        if self.session_id.is_none() {
            // Hook events can precede `system/init`; take the session from any line.
            self.session_id = str_field(&v, "session_id");
        }
        match v.get("type").and_then(Value::as_str) {
            Some("system") => self.on_system(&v),
            Some("assistant") => self.on_assistant(&v),
            Some("user") => on_user(&v),
            Some("rate_limit_event") => {
                if let Some(status) = v.pointer("/rate_limit_info/status").and_then(Value::as_str) {
                    self.classifier.observe(Signal::RateLimitStatus(status));
                    if status == "rejected" {
                        self.resets_at = v
                            .pointer("/rate_limit_info/resetsAt")
                            .and_then(Value::as_i64);
                    }
                }
                Vec::new()
            }
            Some("result") => self.on_result(&v),
            _ => Vec::new(),
        }
    }

    fn on_system(&mut self, v: &Value) -> Vec<AgentEvent> {
        match v.get("subtype").and_then(Value::as_str) {
            Some("init") => {
                if let Some(id) = str_field(v, "session_id") {
                    self.session_id = Some(id);
                }
                self.model = str_field(v, "model").or(self.model.take());
                self.version = str_field(v, "claude_code_version").or(self.version.take());
                vec![AgentEvent::Session {
                    session_id: self.session_id.clone(),
                    model: self.model.clone(),
                    version: self.version.clone(),
                }]
            }
            Some("api_retry") => {
                // Retry chatter: only decisive if the run then fails (see `finish`).
                if let Some(status) = v.get("error_status").and_then(as_status) {
                    self.classifier.observe(Signal::ApiStatus(status));
                }
                if let Some(code) = v.get("error").and_then(Value::as_str) {
                    self.classifier.observe(Signal::ErrorCode(code));
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn on_assistant(&mut self, v: &Value) -> Vec<AgentEvent> {
        if !v.get("parent_tool_use_id").is_none_or(Value::is_null) {
            // A subagent's turn: its text is not the agent's final word.
            return Vec::new();
        }
        let Some(message) = v.get("message") else {
            return Vec::new();
        };
        let blocks = message
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let texts: Vec<&str> = blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect();

        if let Some(code) = v.get("error").and_then(Value::as_str) {
            // A synthetic message standing for an API error (`"model":"<synthetic>"`): report it
            // as an error, not as something the assistant said.
            self.classifier.observe(Signal::ErrorCode(code));
            let message = if texts.is_empty() {
                code.to_owned()
            } else {
                texts.join("\n")
            };
            self.classifier.observe(Signal::Text(&message));
            self.assistant_error = Some(message.clone());
            return vec![AgentEvent::Error {
                message: strip_ansi(&message),
            }];
        }

        if self.model.is_none() {
            self.model = str_field(message, "model").filter(|m| m != "<synthetic>");
        }
        let id = str_field(message, "id");
        if id.is_none() || id != self.last_message_id {
            self.last_message_id = id;
            self.last_message_texts.clear();
        }
        self.last_message_texts
            .extend(texts.iter().map(|t| (*t).to_owned()));

        let mut events = Vec::new();
        for block in blocks {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    if let Some(text) = block.get("text").and_then(Value::as_str) {
                        events.push(AgentEvent::AssistantText {
                            text: text.to_owned(),
                        });
                    }
                }
                Some("tool_use") => {
                    let name = str_field(block, "name").unwrap_or_else(|| "?".to_owned());
                    let summary = summarize_tool_input(block.get("input").unwrap_or(&Value::Null));
                    events.push(AgentEvent::ToolCall { name, summary });
                }
                _ => {}
            }
        }
        events
    }

    fn on_result(&mut self, v: &Value) -> Vec<AgentEvent> {
        let subtype = str_field(v, "subtype");
        // `is_error` decides. Only when a build omits it does the subtype stand in.
        let is_error = v
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or_else(|| subtype.as_deref().is_some_and(|s| s.starts_with("error")));
        let text = str_field(v, "result");
        let errors: Vec<String> = v
            .get("errors")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(error_entry_text).collect())
            .unwrap_or_default();
        let terminal_reason = str_field(v, "terminal_reason");

        if let Some(status) = v.get("api_error_status").and_then(as_status) {
            self.classifier.observe(Signal::ApiStatus(status));
        }
        if let Some(reason) = &terminal_reason {
            self.classifier.observe(Signal::TerminalReason(reason));
        }
        if is_error {
            // The result text is the agent's own error message only when the run failed; on
            // success it is the assistant's answer, which may quote anything.
            if let Some(t) = &text {
                self.classifier.observe(Signal::Text(t));
            }
            for e in &errors {
                self.classifier.observe(Signal::Text(e));
            }
        }
        if let Some(id) = str_field(v, "session_id") {
            self.session_id = Some(id);
        }
        if self.model.is_none() {
            self.model = v
                .get("modelUsage")
                .and_then(Value::as_object)
                .and_then(|m| m.keys().next().cloned());
        }
        let usage = v.get("usage").map(usage_of).unwrap_or_default();
        self.result = Some(ResultLine {
            text: text.clone(),
            is_error,
            subtype,
            terminal_reason,
            errors,
            cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
            usage,
        });
        vec![AgentEvent::Final { text, is_error }]
    }

    fn on_stderr(&mut self, text: &str) -> Vec<AgentEvent> {
        let clean = strip_ansi(text);
        let clean = clean.trim();
        if clean.is_empty() {
            return Vec::new();
        }
        self.classifier.observe(Signal::Text(clean));
        self.stderr_tail.push(clean);
        vec![AgentEvent::Error {
            message: clean.to_owned(),
        }]
    }

    /// The error message to report for a failed run, best source first.
    fn error_message(&self) -> Option<String> {
        let from_result = self.result.as_ref().filter(|r| r.is_error).and_then(|r| {
            r.text
                .clone()
                .filter(|t| !t.trim().is_empty())
                .or_else(|| (!r.errors.is_empty()).then(|| r.errors.join("; ")))
                .or_else(|| {
                    let subtype = r.subtype.as_deref().unwrap_or("error");
                    Some(match &r.terminal_reason {
                        Some(reason) => format!("claude ended with {subtype} ({reason})"),
                        None => format!("claude ended with {subtype}"),
                    })
                })
        });
        from_result
            .or_else(|| self.classifier.message().map(str::to_owned))
            .or_else(|| self.assistant_error.clone())
            .or_else(|| self.stderr_tail.joined())
            .map(|m| strip_ansi(&m))
    }
}

impl OutputParser for ClaudeParser {
    fn on_line(&mut self, line: &OutputLine) -> Vec<AgentEvent> {
        match line.stream {
            StreamKind::Stdout => self.on_stdout(&line.text),
            StreamKind::Stderr => self.on_stderr(&line.text),
        }
    }

    /// Report rules:
    /// - `final_text`: `result.result` when the result line had one, else the joined text
    ///   blocks of the last top-level assistant message, else `None`;
    /// - `is_error`: `result.is_error` when a result line was seen, else "exit code was not 0"
    ///   (no result line and a non-zero exit or a signal);
    /// - `failure`: the most decisive class among the agent's error signals, reported only when
    ///   the run failed (`is_error`, or no result line): retry chatter before a successful
    ///   result is not a failure;
    /// - `cost_usd`/`usage`: from the result line only (USD, tokens).
    fn finish(self: Box<Self>, exit_code: Option<i32>) -> AgentReport {
        let saw_final = self.result.is_some();
        let is_error = match &self.result {
            Some(r) => r.is_error,
            None => exit_code != Some(0),
        };
        let failed = is_error || !saw_final;
        let failure = if failed { self.classifier.best() } else { None };
        let error_message = if is_error || failure.is_some() {
            self.error_message()
        } else {
            None
        };
        let final_text = match self.result.as_ref().and_then(|r| r.text.clone()) {
            Some(text) => Some(text),
            None if self.last_message_texts.is_empty() => None,
            None => Some(self.last_message_texts.join("\n")),
        };
        let resume_at = match (failure, self.resets_at) {
            (Some(crate::protocol::FailureClass::UsageLimit), Some(epoch)) => {
                chrono::DateTime::from_timestamp(epoch, 0)
            }
            (Some(crate::protocol::FailureClass::UsageLimit), None) => error_message
                .as_deref()
                .and_then(crate::agent::classify::resume_at_from_text),
            _ => None,
        };
        AgentReport {
            final_text,
            saw_final,
            is_error,
            error_message,
            failure,
            cost_usd: self.result.as_ref().and_then(|r| r.cost_usd),
            usage: self.result.as_ref().map(|r| r.usage).unwrap_or_default(),
            resume_at,
            session_id: self.session_id,
            model: self.model,
            agent_version: self.version,
        }
    }
}

/// Tool results: one event per `tool_result` block of a top-level `user` line.
fn on_user(v: &Value) -> Vec<AgentEvent> {
    if !v.get("parent_tool_use_id").is_none_or(Value::is_null) {
        return Vec::new();
    }
    v.pointer("/message/content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                .map(|b| AgentEvent::ToolResult {
                    is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn as_status(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|n| u16::try_from(n).ok())
}

/// `result.errors[]` entries are strings in the builds we have seen; accept `{message}` too.
fn error_entry_text(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::to_owned)
        .or_else(|| str_field(v, "message"))
}

/// `result.usage` → [`Usage`] (tokens; missing counts are 0).
fn usage_of(u: &Value) -> Usage {
    let n = |key: &str| u.get(key).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_tokens: n("cache_read_input_tokens"),
        cache_creation_tokens: n("cache_creation_input_tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::promise_in_final_text;
    use crate::protocol::FailureClass;
    use std::path::PathBuf;

    fn out(text: &str) -> OutputLine {
        OutputLine::stdout(text)
    }

    fn err(text: &str) -> OutputLine {
        OutputLine::stderr(text)
    }

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        let mut parser: Box<dyn OutputParser> = Box::new(ClaudeParser::new());
        let events = lines.iter().flat_map(|l| parser.on_line(l)).collect();
        (events, parser.finish(exit))
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
