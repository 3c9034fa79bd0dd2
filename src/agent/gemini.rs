//! The Gemini CLI backend: `gemini --output-format stream-json --yolo --skip-trust`, prompt on
//! stdin.
//!
//! This module owns gemini's command line, its facts ([`INFO`], doctor traps) and its dialect of
//! the stream-json output (one JSON object per stdout line), read into [`AgentEvent`]s over the
//! shared [`StreamCore`]. Schema source: `notes/agent-protocols.md` §5 (gemini-cli
//! `packages/core/src/output/types.ts`, exit codes) and `notes/real-clis.md` §4, checked against
//! what `@google/gemini-cli@0.61.0` prints.
//!
//! Invocation, as probed with 0.61.0:
//! - the prompt goes on stdin, then stdin is closed. With stdin not a TTY the CLI runs headless
//!   and reads stdin as the prompt, no `-p` needed (it waits 500 ms for the first byte and keeps
//!   at most 8 MiB). Stdin rather than `-p` because argv strings stop at 128 KiB (E2BIG);
//! - `--yolo` approves every tool call; `--skip-trust` because in a folder the user never
//!   trusted a headless run otherwise dies with exit 55 (or, in older builds, silently drops
//!   back from YOLO to asking, which headless means refusing);
//! - `-m MODEL` only when ralph's `--model` is set; without it the CLI's model router picks one.
//!
//! Reading rules, each forced by real output:
//! - every line is parsed as JSON, never prefix-matched; non-JSON lines and unknown `type`s yield
//!   no event;
//! - the prompt is echoed as a `message` with `role:"user"`: never assistant text;
//! - assistant `message`s are deltas (`"delta":true`, one per streamed chunk): the final text is
//!   the concatenation of the deltas after the last `tool_result`;
//! - the terminal event is `result` (`status` `success`/`error`) plus the exit code. API errors
//!   inside a turn reach `result.error.type` as `"unknown"` in 0.61.0 (the CLI throws a plain
//!   object), so the JS error class is also read from the CLI's stderr report
//!   (`… TerminalQuotaError: You have exhausted your capacity …`), and an HTTP status from the
//!   exit code, which the CLI sets to the status (`process.exit(429)`, seen as 429 & 0xFF = 173);
//! - usage comes from `result.stats` only (tokens; no cost is reported).

use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia, SandboxNeeds};
use crate::agent::stream::{json_object, Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::{strip_ansi, SpawnSpec};
use crate::protocol::fields::{str_field, summarize_tool_input};
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::FailureClass;
use crate::protocol::Usage;

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "gemini";

/// Facts about the gemini backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Gemini,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it with `npm install -g @google/gemini-cli`",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Gemini::new(settings))),
    sandbox: SandboxNeeds {
        state: &[".gemini"],
        env_prefixes: &["GEMINI_", "GOOGLE_"],
        hosts: &[
            "generativelanguage.googleapis.com:443",
            "oauth2.googleapis.com:443",
            "cloudcode-pa.googleapis.com:443",
        ],
        base_url_hosts: || {
            crate::agent::registry::env_url_hosts(&["GOOGLE_GEMINI_BASE_URL", "GEMINI_BASE_URL"])
        },
        config_env: Vec::new,
        state_vars: &["GEMINI_CLI_HOME"],
        config_vars: &[
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
            "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
        ],
    },
};

/// Exit code of `FatalAuthenticationError` (no or bad credentials, an auth type the CLI refuses).
pub const EXIT_AUTH: i32 = 41;
/// Exit code of `FatalInputError` (e.g. an empty prompt).
pub const EXIT_INPUT: i32 = 42;
/// Exit code of `FatalSandboxError`.
pub const EXIT_SANDBOX: i32 = 44;
/// Exit code of `FatalConfigError` (bad settings; admin settings that forbid YOLO).
pub const EXIT_CONFIG: i32 = 52;
/// Exit code of `FatalUntrustedWorkspaceError` (folder not trusted and no `--skip-trust`).
pub const EXIT_UNTRUSTED: i32 = 55;

/// The Gemini CLI backend. Stateless apart from its settings; each [`Backend::parser`] call
/// returns a fresh [`GeminiParser`].
#[derive(Debug, Clone)]
pub struct Gemini {
    settings: AgentSettings,
}

impl Gemini {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `-m settings.model` when set.
    pub fn new(settings: AgentSettings) -> Self {
        Gemini { settings }
    }
}

impl Backend for Gemini {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `gemini --output-format stream-json --yolo --skip-trust [-m MODEL]`, the prompt on stdin,
    /// `NO_COLOR=1` (the CLI colours its fatal messages red otherwise). Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        let args = self.settings.args_with_model(
            &["--output-format", "stream-json", "--yolo", "--skip-trust"],
            "-m",
        );
        Ok(self.settings.cli_spec(DEFAULT_PROGRAM, args, Some(prompt)))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // The echoed prompt is a `role:"user"` message, which the parser never reads as text.
        Box::new(GeminiParser::new().for_model(self.settings.model.as_deref()))
    }
}

/// An untrusted folder, and no key a headless gemini could log in with.
fn traps(cx: &DoctorContext<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let trusted = cx
        .home()
        .map(|h| h.join(".gemini").join("trustedFolders.json"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .is_some_and(|t| t.contains(&*cx.cwd.to_string_lossy()));
    if !trusted && cx.env("GEMINI_CLI_TRUST_WORKSPACE").as_deref() != Some("true") {
        out.push(format!(
            "{} is not a trusted gemini folder: headless gemini refuses it (exit 55) or silently drops --yolo; ralph passes --skip-trust",
            cx.cwd.display()
        ));
    }
    if !cx.env_set("GEMINI_API_KEY")
        && !cx.env_set("GOOGLE_API_KEY")
        && !cx.env_set("GOOGLE_CLOUD_PROJECT")
    {
        out.push(
            "no GEMINI_API_KEY (or Vertex settings): a headless gemini cannot log in by browser"
                .to_owned(),
        );
    }
    out
}

/// What the terminal `result` line said.
#[derive(Debug, Clone, Default)]
struct ResultLine {
    /// `status == "success"`.
    success: bool,
    /// `error.type`, the CLI's JS error class (`"unknown"` for API errors in 0.61.0).
    error_type: Option<String>,
    /// `error.message`, e.g. `[API Error: …]`.
    error_message: Option<String>,
}

/// Reads gemini's stream-json output. Memory use is bounded by the assistant text since the
/// last tool result plus a few stderr lines, whatever the length of the run.
pub type GeminiParser = Parser<GeminiDialect>;

/// gemini's dialect. In the core: the message of the last `error` event with
/// `severity:"error"` is the fallback error message; usage comes from `result.stats`.
#[derive(Debug, Default)]
pub struct GeminiDialect {
    /// Assistant deltas since the last `tool_result`, concatenated.
    text: String,
    result: Option<ResultLine>,
    /// The last known JS error class the CLI named on stderr, with the message after it.
    stderr_error: Option<(String, String)>,
    /// The class of the Google API error quoted in the result's message, when its `status` or
    /// `details[].reason` decide one.
    api_error_class: Option<FailureClass>,
    /// The `error` event that says the session hit its turn limit ([`is_turn_limit`]): the CLI
    /// stops the agent there and still ends with a `success` result.
    turn_limit: Option<String>,
}

/// Whether an `error` event's message says the session hit its maximum number of turns: the
/// CLI's `Maximum session turns exceeded` (an `error` event, then a `success` result, exit 0)
/// and `Reached max session turns for this session…` (`FatalTurnLimitedError`).
fn is_turn_limit(message: &str) -> bool {
    let lower = message.to_lowercase();
    lower.contains("maximum session turns") || lower.contains("max session turns")
}

impl Dialect for GeminiDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = json_object(line) else {
            return Vec::new();
        };
        match v.get("type").and_then(Value::as_str) {
            Some("init") => {
                core.session_id = str_field(&v, "session_id").or(core.session_id.take());
                core.model = str_field(&v, "model").or(core.model.take());
                vec![core.session_event()]
            }
            Some("message") => self.on_message(&v),
            Some("tool_use") => {
                let name = str_field(&v, "tool_name").unwrap_or_else(|| "?".to_owned());
                let summary = summarize_tool_input(v.get("parameters").unwrap_or(&Value::Null));
                vec![AgentEvent::ToolCall { name, summary }]
            }
            Some("tool_result") => {
                // Whatever the assistant said before a tool ran is not its final word.
                self.text.clear();
                vec![AgentEvent::ToolResult {
                    is_error: v.get("status").and_then(Value::as_str) == Some("error"),
                    output: v
                        .get("output")
                        .and_then(Value::as_str)
                        .or_else(|| v.pointer("/error/message").and_then(Value::as_str))
                        .and_then(super::stream::tool_output),
                    exit_code: None,
                }]
            }
            Some("error") => {
                let Some(message) = str_field(&v, "message") else {
                    return Vec::new();
                };
                let message = strip_ansi(&message);
                core.classifier.observe(Signal::Text(&message));
                if v.get("severity").and_then(Value::as_str) != Some("warning") {
                    core.error_event = Some(message.clone());
                }
                if is_turn_limit(&message) {
                    self.turn_limit = Some(message.trim().to_owned());
                }
                vec![AgentEvent::Error { message }]
            }
            Some("result") => self.on_result(&v, core),
            _ => Vec::new(),
        }
    }

    /// The stderr report naming a JS error class is remembered; otherwise as usual.
    fn stderr(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        if let Some(named) = named_error_class(strip_ansi(line).trim()) {
            self.stderr_error = Some(named);
        }
        core.stderr(line)
    }

    /// Report rules beyond the shared skeleton:
    /// - `final_text`: the assistant deltas after the last `tool_result`, concatenated;
    /// - `is_error`: with a result line, also a non-zero exit code (a kill by ralph after the
    ///   result, exit code `None`, is not an error), and an `error` event saying the session hit
    ///   its turn limit (`Maximum session turns exceeded`), even before a `success` result: the
    ///   agent was stopped, not finished, and the error message says so;
    /// - `failure`: the JS error class (`TerminalQuotaError` → usage limit,
    ///   `RetryableQuotaError` → transient, `FatalAuthenticationError` → auth,
    ///   `FatalConfigError`/`FatalUntrustedWorkspaceError`/`ModelNotFoundError`… → config), else
    ///   a quoted Google API error whose status is `UNAUTHENTICATED` or reason `API_KEY_*` →
    ///   auth, else the exit code (41 → auth; 42, 44, 52, 55 → config), else the classifier
    ///   over the error texts plus the HTTP status from the exit code (after an error result,
    ///   144..=255 is the status & 0xFF: 173 = 429, 145 = 401) or from the quoted API error;
    /// - `resume_at`: read from the error message (the CLI gives no structured reset time).
    fn settle(&mut self, core: &mut StreamCore, exit_code: Option<i32>) {
        if core.saw_final && exit_code.is_some_and(|c| c != 0) {
            core.is_error = true;
        }
        // The agent was stopped at its turn limit, not done: a `success` result after it does
        // not make the run a success.
        if self.turn_limit.is_some() {
            core.is_error = true;
        }
        let errored_result = self.result.as_ref().is_some_and(|r| !r.success);
        if let Some(status) = exit_code.and_then(|c| status_from_exit(c, errored_result)) {
            core.classifier.observe(Signal::ApiStatus(status));
        }
        core.failure = self.structured_failure(exit_code);
        core.final_text = self.final_text();
    }

    /// Best source first: the error result's message (else the last error event), the JS
    /// error class named on stderr, the classifier's text, the last error event, stderr, the
    /// last plain (non-JSON) stdout lines.
    fn error_message(&self, core: &StreamCore, _exit_code: Option<i32>) -> Option<String> {
        if let Some(said) = &self.turn_limit {
            return Some(format!(
                "gemini stopped the agent at its session turn limit before it finished ({said}); \
                 raise maxSessionTurns in gemini's settings.json or make the story smaller"
            ));
        }
        let from_result = self.result.as_ref().filter(|r| !r.success).and_then(|r| {
            r.error_message
                .clone()
                .filter(|m| !m.trim().is_empty())
                .or_else(|| core.error_event.clone())
        });
        from_result
            .or_else(|| self.stderr_error.as_ref().map(|(c, m)| format!("{c}: {m}")))
            .or_else(|| core.classifier.message().map(str::to_owned))
            .or_else(|| core.error_event.clone())
            .or_else(|| core.stderr_tail.joined())
            .or_else(|| core.plain_tail.joined())
            .map(|m| strip_ansi(&m))
    }
}

impl GeminiDialect {
    fn on_message(&mut self, v: &Value) -> Vec<AgentEvent> {
        if v.get("role").and_then(Value::as_str) != Some("assistant") {
            // The echoed prompt (`role:"user"`) holds the promise instruction: never text.
            return Vec::new();
        }
        let Some(content) = v.get("content").and_then(Value::as_str) else {
            return Vec::new();
        };
        self.text.push_str(content);
        vec![AgentEvent::AssistantText {
            text: content.to_owned(),
        }]
    }

    fn on_result(&mut self, v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
        let success = v.get("status").and_then(Value::as_str) == Some("success");
        let error = v.get("error");
        let error_type = error
            .and_then(|e| str_field(e, "type"))
            .filter(|t| !t.is_empty());
        // One line: the CLI puts the API's own words first and generic advice ("Please wait
        // and try again later…") on the next line, and a one-line summary must keep the former.
        let error_message = error
            .and_then(|e| str_field(e, "message"))
            .map(|m| one_line(&m));
        if !success {
            // The result's error is the CLI's own report of why the run failed.
            if let Some(message) = &error_message {
                core.classifier.observe(Signal::Text(message));
                if let Some(api) = embedded_api_error(message) {
                    if let Some(code) = api.code {
                        core.classifier.observe(Signal::ApiStatus(code));
                    }
                    self.api_error_class = api.class();
                }
            }
        }
        let stats = v.get("stats").unwrap_or(&Value::Null);
        if core.model.is_none() {
            core.model = stats
                .get("models")
                .and_then(Value::as_object)
                .and_then(|m| m.keys().next().cloned());
        }
        core.usage = usage_of(stats);
        core.saw_final = true;
        core.is_error = !success;
        self.result = Some(ResultLine {
            success,
            error_type,
            error_message,
        });
        vec![AgentEvent::Final {
            text: self.final_text(),
            is_error: !success,
        }]
    }

    fn final_text(&self) -> Option<String> {
        (!self.text.is_empty()).then(|| self.text.clone())
    }

    /// The failure class from structured facts, most exact first: the JS error class (the
    /// result's `error.type`, else the one named on stderr), then the CLI's own exit codes.
    /// HTTP statuses carried by the exit code are fed to the classifier instead (see
    /// [`Dialect::settle`]), since a 429 alone does not tell a quota from a rate limit.
    fn structured_failure(&self, exit_code: Option<i32>) -> Option<FailureClass> {
        let result_type = self
            .result
            .as_ref()
            .and_then(|r| r.error_type.as_deref())
            .filter(|t| *t != "unknown");
        let stderr_type = self.stderr_error.as_ref().map(|(class, _)| class.as_str());
        if let Some(class) = result_type.or(stderr_type).and_then(class_of_error_type) {
            return Some(class);
        }
        if let Some(class) = self.api_error_class {
            return Some(class);
        }
        match exit_code? {
            EXIT_AUTH => Some(FailureClass::Auth),
            EXIT_INPUT | EXIT_SANDBOX | EXIT_CONFIG | EXIT_UNTRUSTED => Some(FailureClass::Config),
            _ => None,
        }
    }
}

/// The failure class of one of the CLI's JS error classes (`error.type`), when it has one.
fn class_of_error_type(error_type: &str) -> Option<FailureClass> {
    Some(match error_type {
        "TerminalQuotaError" => FailureClass::UsageLimit,
        "RetryableQuotaError" => FailureClass::Transient,
        "FatalAuthenticationError"
        | "UnauthorizedError"
        | "ForbiddenError"
        | "AccountSuspendedError"
        | "ValidationRequiredError" => FailureClass::Auth,
        "FatalConfigError"
        | "FatalSandboxError"
        | "FatalInputError"
        | "FatalUntrustedWorkspaceError"
        | "ModelNotFoundError" => FailureClass::Config,
        _ => return None,
    })
}

/// A known JS error class the CLI names on a stderr line (`… TerminalQuotaError: <message>`,
/// as its "Error when talking to Gemini API" report prints it), with the message after it.
fn named_error_class(line: &str) -> Option<(String, String)> {
    const NAMED: &[&str] = &[
        "TerminalQuotaError",
        "RetryableQuotaError",
        "FatalAuthenticationError",
        "ValidationRequiredError",
        "ModelNotFoundError",
    ];
    NAMED.iter().find_map(|class| {
        let at = line.find(&format!("{class}: "))?;
        // A class name, not the tail of a longer identifier.
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let message = line[at + class.len() + 2..].trim().to_owned();
        Some(((*class).to_owned(), message))
    })
}

/// The HTTP status behind an exit code: after an error result, codes 144..=255 are the status
/// of the failed API call modulo 256 (`process.exit(status)`), i.e. 400..=511.
fn status_from_exit(code: i32, errored_result: bool) -> Option<u16> {
    if !errored_result || !(144..=255).contains(&code) {
        return None;
    }
    u16::try_from(code + 256).ok()
}

/// A Google API error (`{"error":{"code","message","status","details":[{"reason"}]}}`) as the
/// CLI quotes it in `[API Error: {…}]` when the API's body is the error's message.
#[derive(Debug, Default, PartialEq)]
struct ApiError {
    /// `error.code`, the HTTP status.
    code: Option<u16>,
    /// `error.status`, e.g. `UNAUTHENTICATED`, `INVALID_ARGUMENT`.
    status: Option<String>,
    /// `error.details[].reason`, e.g. `API_KEY_INVALID`.
    reasons: Vec<String>,
}

impl ApiError {
    /// Auth when the status or a reason says the credentials are wrong: Google answers a bad
    /// API key with 400 `INVALID_ARGUMENT` and reason `API_KEY_INVALID`, which no status rule
    /// catches.
    fn class(&self) -> Option<FailureClass> {
        let bad_key = self.reasons.iter().any(|r| r.starts_with("API_KEY_"));
        (bad_key || self.status.as_deref() == Some("UNAUTHENTICATED")).then_some(FailureClass::Auth)
    }
}

/// The Google API error JSON quoted in an `[API Error: {"error":{…}}]` message, if any.
fn embedded_api_error(message: &str) -> Option<ApiError> {
    let start = message.find("{\"error\"")?;
    let end = message.rfind('}')?;
    let v: Value = serde_json::from_str(message.get(start..=end)?).ok()?;
    let e = v.get("error")?;
    Some(ApiError {
        code: e
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok()),
        status: str_field(e, "status"),
        reasons: e
            .get("details")
            .and_then(Value::as_array)
            .map(|ds| ds.iter().filter_map(|d| str_field(d, "reason")).collect())
            .unwrap_or_default(),
    })
}

/// `text` with its lines trimmed and joined by single spaces, empty lines dropped.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `result.stats` → [`Usage`] (tokens; missing counts are 0). `input_tokens` there includes
/// the cached tokens; `input` is the uncached part.
fn usage_of(stats: &Value) -> Usage {
    let n = |key: &str| stats.get(key).and_then(Value::as_u64);
    let cached = n("cached").unwrap_or(0);
    let uncached = n("input")
        .or_else(|| n("input_tokens").map(|total| total.saturating_sub(cached)))
        .unwrap_or(0);
    Usage {
        input_tokens: uncached,
        output_tokens: n("output_tokens").unwrap_or(0),
        cache_read_tokens: cached,
        cache_creation_tokens: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stream::test_support::{self, err, out};
    use crate::process::OutputLine;
    use crate::protocol::AgentReport;
    use std::path::PathBuf;

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        test_support::run_plain::<GeminiDialect>(lines, exit)
    }

    fn has_promise(report: &AgentReport) -> bool {
        report
            .final_text
            .as_deref()
            .is_some_and(|t| t.contains("<promise>COMPLETE</promise>"))
    }

    const INIT: &str = r#"{"type":"init","timestamp":"2026-11-30T01:49:38.146Z","session_id":"4d883196-5ebb-48f2-bb63-133f34f49839","model":"gemini-2.5-flash"}"#;
    const USER_ECHO: &str = r#"{"type":"message","timestamp":"2026-11-30T01:49:38.147Z","role":"user","content":"Story ID: US-001\nWhen every story passes, reply <promise>COMPLETE</promise>."}"#;
    const STDERR_NOISE: [&str; 3] = [
        "Warning: 256-color support not detected. Using a terminal with at least 256-color support is recommended for a better visual experience.",
        "YOLO mode is enabled. All tool calls will be automatically approved.",
        "Ripgrep is not available. Falling back to GrepTool.",
    ];

    /// What 0.61.0 printed in a probe: a delta before the tool call, two after it.
    #[test]
    fn success_joins_the_deltas_after_the_last_tool_result() {
        let mut lines = vec![out(INIT), out(USER_ECHO)];
        lines.extend(STDERR_NOISE.map(err));
        lines.extend([
            out(r#"{"type":"message","timestamp":"2026-11-30T01:49:38.189Z","role":"assistant","content":"I'll create it.","delta":true}"#),
            out(r#"{"type":"tool_use","timestamp":"2026-11-30T01:49:38.278Z","tool_name":"run_shell_command","tool_id":"run_shell_command__run_shell_command_1796003378189_0","parameters":{"command":"echo hi >   hello.txt","description":"make it"}}"#),
            out(r#"{"type":"tool_result","timestamp":"2026-11-30T01:49:38.413Z","tool_id":"run_shell_command__run_shell_command_1796003378189_0","status":"success","output":""}"#),
            out(r#"{"type":"message","timestamp":"2026-11-30T01:49:38.430Z","role":"assistant","content":"Created hello.txt.\n","delta":true}"#),
            out(r#"{"type":"message","timestamp":"2026-11-30T01:49:38.443Z","role":"assistant","content":"<promise>COMPLETE</promise>","delta":true}"#),
            out(r#"{"type":"result","timestamp":"2026-11-30T01:49:38.445Z","status":"success","stats":{"total_tokens":30,"input_tokens":20,"output_tokens":10,"cached":3,"input":17,"duration_ms":300,"tool_calls":1,"models":{"gemini-2.5-flash":{"total_tokens":30,"input_tokens":20,"output_tokens":10,"cached":3,"input":17}}}}"#),
        ]);
        let (events, report) = run(&lines, Some(0));
        let stdout_events: Vec<&AgentEvent> = events
            .iter()
            .filter(|e| !matches!(e, AgentEvent::Error { .. }))
            .collect();
        assert_eq!(
            stdout_events,
            [
                &AgentEvent::Session {
                    session_id: Some("4d883196-5ebb-48f2-bb63-133f34f49839".into()),
                    model: Some("gemini-2.5-flash".into()),
                    version: None
                },
                &AgentEvent::AssistantText {
                    text: "I'll create it.".into()
                },
                &AgentEvent::ToolCall {
                    name: "run_shell_command".into(),
                    summary: "echo hi > hello.txt".into()
                },
                &AgentEvent::tool_result(false),
                &AgentEvent::AssistantText {
                    text: "Created hello.txt.\n".into()
                },
                &AgentEvent::AssistantText {
                    text: "<promise>COMPLETE</promise>".into()
                },
                &AgentEvent::Final {
                    text: Some("Created hello.txt.\n<promise>COMPLETE</promise>".into()),
                    is_error: false
                },
            ]
        );
        assert_eq!(
            report.final_text.as_deref(),
            Some("Created hello.txt.\n<promise>COMPLETE</promise>")
        );
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None, "stderr noise is not an error");
        assert_eq!(report.cost_usd, None);
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 17,
                output_tokens: 10,
                cache_read_tokens: 3,
                cache_creation_tokens: 0
            }
        );
        assert_eq!(
            report.session_id.as_deref(),
            Some("4d883196-5ebb-48f2-bb63-133f34f49839")
        );
        assert_eq!(report.model.as_deref(), Some("gemini-2.5-flash"));
    }

    /// The promise in the echoed prompt, in a tool's parameters or in its output never counts;
    /// text before the last tool result is not the final text.
    #[test]
    fn promise_counts_only_in_the_final_assistant_text() {
        let lines = [
            out(INIT),
            out(USER_ECHO),
            out(
                r#"{"type":"message","timestamp":"t","role":"assistant","content":"Reading. <promise>COMPLETE</promise>","delta":true}"#,
            ),
            out(
                r#"{"type":"tool_use","timestamp":"t","tool_name":"read_file","tool_id":"read_file_1","parameters":{"file_path":"/w/prompt.md"}}"#,
            ),
            out(
                r#"{"type":"tool_result","timestamp":"t","tool_id":"read_file_1","status":"success","output":"Reply <promise>COMPLETE</promise> when done"}"#,
            ),
            out(
                r#"{"type":"message","timestamp":"t","role":"assistant","content":"Two stories remain open.","delta":true}"#,
            ),
            out(
                r#"{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":3,"input_tokens":2,"output_tokens":1,"cached":0,"input":2,"duration_ms":5,"tool_calls":1,"models":{}}}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(0));
        assert_eq!(
            report.final_text.as_deref(),
            Some("Two stories remain open.")
        );
        assert!(!has_promise(&report));

        // Nothing said after the last tool result: no final text at all.
        let (_, report) = run(&[&lines[..5], &lines[6..]].concat(), Some(0));
        assert_eq!(report.final_text, None);

        // The echoed prompt alone.
        let (events, report) = run(&[out(USER_ECHO)], Some(0));
        assert!(events.is_empty());
        assert_eq!(report.final_text, None);
    }

    /// Case 13 as the brief's fake prints it: a structured `TerminalQuotaError`, exit 173.
    #[test]
    fn terminal_quota_error_with_exit_173_is_a_usage_limit() {
        let lines = [
            out(INIT),
            out(USER_ECHO),
            out(
                r#"{"type":"result","timestamp":"t","status":"error","error":{"type":"TerminalQuotaError","message":"[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}"#,
            ),
        ];
        let (events, report) = run(&lines, Some(173));
        assert!(matches!(
            events.last(),
            Some(AgentEvent::Final { is_error: true, .. })
        ));
        assert!(report.is_error && report.saw_final);
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(
            report.error_message.as_deref(),
            Some("[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.]")
        );
        assert_eq!(report.final_text, None);
    }

    /// What 0.61.0 really prints for that quota: `error.type` is `"unknown"`; the class is only
    /// named on stderr.
    #[test]
    fn real_quota_error_is_read_from_the_stderr_report() {
        let result = r#"{"type":"result","timestamp":"2026-11-30T01:52:01.365Z","status":"error","error":{"type":"unknown","message":"[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.]\nPlease wait and try again later. To increase your limits, request a quota increase through AI Studio, or switch to another /auth method"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{"gemini-2.5-flash":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0}}}}"#;
        let lines = [
            out(INIT),
            out(USER_ECHO),
            err("Attempt 1 failed: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.. Retrying after 1067ms..."),
            err("Error when talking to Gemini API Full report available at: /tmp/s/tmp/gemini-client-error-Turn.run-sendMessageStream-2026-11-30T01-52-01-362Z.json TerminalQuotaError: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s."),
            err("    at classifyGoogleError (file:///x/bundle/chunk-JDPZ4CE3.js:307331:16)"),
            out(result),
        ];
        let (_, report) = run(&lines, Some(173));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        // One line, the API's words first: ralph's one-line summary keeps the reset time.
        assert_eq!(
            report.error_message.as_deref(),
            Some("[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.] Please wait and try again later. To increase your limits, request a quota increase through AI Studio, or switch to another /auth method")
        );

        // Without the stderr report the result's own words still name the daily quota.
        let (_, report) = run(&[out(INIT), out(result)], Some(173));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        // A 429 with words that name no quota only says "retry later".
        let vague = result.replace(
            "You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.",
            "Too many requests.",
        );
        let (_, report) = run(&[out(INIT), out(&vague)], Some(173));
        assert_eq!(report.failure, Some(FailureClass::Transient));

        // A per-minute limit the CLI gave up retrying.
        let (_, report) = run(
            &[
                err("Error when talking to Gemini API Full report available at: /t/x.json RetryableQuotaError: Resource has been exhausted (e.g. check quota). Please retry in 12s."),
                out(result),
            ],
            Some(173),
        );
        assert_eq!(report.failure, Some(FailureClass::Transient));
    }

    /// `FatalAuthenticationError`: 0.61.0 prints only stderr and exits 41; a result line with
    /// the class, when a build prints one, says the same.
    #[test]
    fn auth_exit_41() {
        let lines = [
            err("When using Gemini API, you must specify the GEMINI_API_KEY environment variable."),
            err("Update your environment and try again (no reload needed if using .env)!"),
        ];
        let (events, report) = run(&lines, Some(41));
        assert_eq!(events.len(), 2);
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(
            report.error_message.as_deref(),
            Some("When using Gemini API, you must specify the GEMINI_API_KEY environment variable.\nUpdate your environment and try again (no reload needed if using .env)!")
        );

        let (_, report) = run(
            &[out(
                r#"{"type":"result","timestamp":"t","status":"error","error":{"type":"FatalAuthenticationError","message":"Invalid auth method selected."},"stats":{}}"#,
            )],
            Some(41),
        );
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert_eq!(
            report.error_message.as_deref(),
            Some("Invalid auth method selected.")
        );
    }

    /// A 401 from the API: `unknown` type, the Google error JSON quoted in the message, exit 145
    /// (401 & 0xFF).
    #[test]
    fn api_401_is_auth() {
        let line = r#"{"type":"result","timestamp":"t","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":401,\"message\":\"API key not valid. Please pass a valid API key.\",\"status\":\"UNAUTHENTICATED\"}}]"},"stats":{}}"#;
        let (_, report) = run(&[out(INIT), out(line)], Some(145));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        // The quoted JSON alone is enough (e.g. a wrapper that changes the exit code).
        let (_, report) = run(&[out(INIT), out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
    }

    /// A bad key as Google really answers it: 400 `INVALID_ARGUMENT`, reason `API_KEY_INVALID`
    /// (exit 144 = 400 & 0xFF, which alone is no failure class).
    #[test]
    fn api_key_invalid_400_is_auth() {
        let line = r#"{"type":"result","timestamp":"2026-11-30T02:15:40.439Z","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":400,\"message\":\"API key not valid. Please pass a valid API key.\",\"status\":\"INVALID_ARGUMENT\",\"details\":[{\"@type\":\"type.googleapis.com/google.rpc.ErrorInfo\",\"reason\":\"API_KEY_INVALID\",\"domain\":\"googleapis.com\",\"metadata\":{\"service\":\"generativelanguage.googleapis.com\"}}]}}]"},"stats":{}}"#;
        let (_, report) = run(&[out(INIT), out(USER_ECHO), out(line)], Some(144));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        // Any other 400 is the agent's failure, not a class.
        let other = line.replace("API_KEY_INVALID", "FIELD_INVALID").replace(
            "API key not valid. Please pass a valid API key.",
            "Request contains an invalid argument.",
        );
        let (_, report) = run(&[out(INIT), out(&other)], Some(144));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
    }

    #[test]
    fn untrusted_folder_and_config_exit_codes() {
        let untrusted = "\x1b[31mGemini CLI is not running in a trusted directory. To proceed, either use `--skip-trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment variable, or trust this directory in interactive mode.\x1b[0m";
        let (_, report) = run(&[err(untrusted)], Some(55));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report
            .error_message
            .as_deref()
            .is_some_and(|m| m.starts_with("Gemini CLI is not running in a trusted directory")));
        for code in [42, 44, 52] {
            assert_eq!(
                run(&[], Some(code)).1.failure,
                Some(FailureClass::Config),
                "{code}"
            );
        }
        // Turn limit (53) and a fatal tool error (54) are the agent's failures, not setup.
        assert_eq!(run(&[], Some(53)).1.failure, None);
        assert!(run(&[], Some(54)).1.is_error);
    }

    /// Non-fatal `error` events before a successful result are not a failure; an invalid stream
    /// (`status:"error"` without an `error` object, exit 0) is an error reported by its event.
    #[test]
    fn error_events_and_invalid_stream() {
        let warning = out(
            r#"{"type":"error","timestamp":"t","severity":"warning","message":"Loop detected, stopping execution"}"#,
        );
        let success = out(r#"{"type":"result","timestamp":"t","status":"success","stats":{}}"#);
        let (events, report) = run(&[warning.clone(), success], Some(0));
        assert_eq!(
            events[0],
            AgentEvent::Error {
                message: "Loop detected, stopping execution".into()
            }
        );
        assert!(!report.is_error);
        assert_eq!(report.error_message, None);

        let invalid = out(
            r#"{"type":"error","timestamp":"t","severity":"error","message":"Invalid stream: The model returned an empty response or malformed tool call."}"#,
        );
        let errored = out(r#"{"type":"result","timestamp":"t","status":"error","stats":{}}"#);
        let (_, report) = run(&[warning, invalid, errored], Some(0));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Invalid stream: The model returned an empty response or malformed tool call.")
        );
    }

    /// gemini's turn limit: an `error` event `Maximum session turns exceeded`, then a `success`
    /// result and exit 0 (what gemini-cli 0.61.0 prints when `maxSessionTurns` stops the agent).
    /// The agent was stopped, not finished: the run is an error whose message names the turn
    /// limit. The `FatalTurnLimitedError` form (an error result, exit 53) says so too.
    #[test]
    fn the_session_turn_limit_is_an_error_even_before_a_success_result() {
        let error = out(
            r#"{"type":"error","timestamp":"t","severity":"error","message":"Maximum session turns exceeded"}"#,
        );
        let text = out(
            r#"{"type":"message","timestamp":"t","role":"assistant","content":"Working on it","delta":true}"#,
        );
        let success = out(r#"{"type":"result","timestamp":"t","status":"success","stats":{}}"#);
        let (_, report) = run(&[text, error, success], Some(0));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        let message = report.error_message.unwrap_or_default();
        assert!(
            message.starts_with("gemini stopped the agent at its session turn limit")
                && message.contains("(Maximum session turns exceeded)"),
            "{message}"
        );
        let fatal = out(
            r#"{"type":"result","timestamp":"t","status":"error","error":{"type":"FatalTurnLimitedError","message":"Reached max session turns for this session. Increase the number of turns by specifying maxSessionTurns in settings.json."},"stats":{}}"#,
        );
        let (_, report) = run(&[fatal], Some(53));
        assert!(report.is_error);
        assert!(report
            .error_message
            .is_some_and(|m| m.contains("Reached max session turns")),);
    }

    /// Decision (README, gemini): an `error` event of severity `error` followed by a `result`
    /// with status `success` and exit 0 is at most a warning. It is shown (an
    /// [`AgentEvent::Error`]), but the run is not a failure and gets no class, even when the
    /// event's words would name one; the iteration is judged on what it did (prd.json, verify).
    #[test]
    fn an_error_event_before_a_successful_result_is_only_a_warning() {
        for message in [
            "Invalid stream: The model returned an empty response or malformed tool call.",
            "[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h30m40s.]",
            "Loop detected, stopping execution",
        ] {
            let error = out(&format!(
                r#"{{"type":"error","timestamp":"t","severity":"error","message":{}}}"#,
                serde_json::Value::String(message.to_owned())
            ));
            let text = out(
                r#"{"type":"message","timestamp":"t","role":"assistant","content":"Done.\n<promise>COMPLETE</promise>","delta":true}"#,
            );
            let success =
                out(r#"{"type":"result","timestamp":"t","status":"success","stats":{}}"#);
            let (events, report) = run(&[error, text, success], Some(0));
            assert!(events.contains(&AgentEvent::Error {
                message: message.to_owned()
            }));
            assert!(!report.is_error, "{message}");
            assert_eq!(report.failure, None, "{message}");
            assert_eq!(report.error_message, None, "{message}");
            assert_eq!(report.resume_at, None, "{message}");
            assert!(crate::completion::promise_in_final_text(
                report.final_text.as_deref().unwrap_or_default()
            ));
        }
    }

    /// An answer that discusses quotas, in a successful run, is not a usage limit.
    #[test]
    fn an_answer_about_quotas_is_not_a_limit() {
        let text = out(
            r#"{"type":"message","timestamp":"t","role":"assistant","content":"Handled TerminalQuotaError and 'You have exhausted your capacity' in retry.ts.","delta":true}"#,
        );
        let success = out(r#"{"type":"result","timestamp":"t","status":"success","stats":{}}"#);
        let (_, report) = run(&[text, success], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
    }

    /// What gemini 0.61.0 printed for a model that does not exist (a scripted 404): a config
    /// error naming the model.
    #[test]
    fn a_missing_model_is_a_config_error_naming_it() {
        let lines = [
            out(r#"{"type":"init","timestamp":"t","session_id":"s","model":"gemini-nope-9"}"#),
            err("Error when talking to Gemini API Full report available at: /tmp/gemini-client-error-Turn.run-sendMessageStream-2026-12-01T13-00-48-500Z.json ModelNotFoundError: models/gemini-nope-9 is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods."),
            out(r#"{"type":"result","timestamp":"t","status":"error","error":{"type":"unknown","message":"[API Error: models/gemini-nope-9 is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods.]"},"stats":{}}"#),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report
            .error_message
            .unwrap_or_default()
            .starts_with("the model `gemini-nope-9` does not exist"));
    }

    /// A result followed by a kill from ralph (no exit code) keeps the result's verdict; a
    /// non-zero exit after a success result is an error; no result and exit 0 is not.
    #[test]
    fn exit_code_completes_the_result() {
        let success = out(r#"{"type":"result","timestamp":"t","status":"success","stats":{}}"#);
        assert!(!run(std::slice::from_ref(&success), None).1.is_error);
        assert!(run(&[success], Some(1)).1.is_error);
        let (_, report) = run(&[], None);
        assert!(report.is_error && !report.saw_final);
        assert!(!run(&[], Some(0)).1.is_error);
    }

    /// Non-JSON lines, JSON that is not an object, unknown types, a CRLF line: no event, no
    /// crash, and the real events still parse.
    #[test]
    fn non_json_lines_are_ignored() {
        let lines = [
            out("Loaded cached credentials."),
            out(""),
            out("[1,2]"),
            out("\"type\":\"result\""),
            out(r#"{"type":"future_event","content":"<promise>COMPLETE</promise>"}"#),
            out(r#"{"type":"message","role":"assistant","content":42,"delta":true}"#),
            out(
                r#"{"type":"message","timestamp":"t","role":"assistant","content":"Done.","delta":true}"#,
            ),
            out("{\"type\":\"result\",\"timestamp\":\"t\",\"status\":\"success\",\"stats\":{}}\r"),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.final_text.as_deref(), Some("Done."));
    }

    #[test]
    fn command_line_env_and_stdin() {
        let gemini = Gemini::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("gemini-2.5-flash".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode";
        let spec = gemini.command(prompt).expect("spec");
        assert_eq!(spec.program, PathBuf::from("gemini"));
        assert_eq!(
            spec.args,
            [
                "--output-format",
                "stream-json",
                "--yolo",
                "--skip-trust",
                "-m",
                "gemini-2.5-flash"
            ]
        );
        assert!(!spec.args.iter().any(|a| a == "-p" || a.contains("US-1")));
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);

        let custom = Gemini::new(AgentSettings {
            program: Some(PathBuf::from("/opt/gemini/bin/gemini")),
            ..AgentSettings::default()
        });
        let spec = custom.command("p").expect("spec");
        assert_eq!(spec.program, PathBuf::from("/opt/gemini/bin/gemini"));
        assert!(!spec.args.iter().any(|a| a == "-m"));
        assert_eq!(custom.kind(), AgentKind::Gemini);
    }

    #[test]
    fn helpers() {
        use serde_json::json;
        assert_eq!(
            summarize_tool_input(&json!({"file_path": "/w/a.py", "content": "x"})),
            "/w/a.py"
        );
        assert_eq!(summarize_tool_input(&json!({"x": 1})), r#"{"x":1}"#);
        let long = summarize_tool_input(&json!({"command": "é".repeat(500)}));
        assert_eq!(
            long.chars().count(),
            crate::protocol::fields::SUMMARY_MAX_CHARS + 1
        );
        assert_eq!(status_from_exit(173, true), Some(429));
        assert_eq!(status_from_exit(173, false), None);
        assert_eq!(status_from_exit(143, true), None);
        assert_eq!(
            named_error_class("x MyTerminalQuotaError: y"),
            None,
            "only whole class names"
        );
        assert_eq!(
            usage_of(&json!({"input_tokens": 30, "cached": 10, "output_tokens": 2})),
            Usage {
                input_tokens: 20,
                output_tokens: 2,
                cache_read_tokens: 10,
                cache_creation_tokens: 0
            }
        );
    }
}
