//! The OpenCode backend: `opencode run --format json`, prompt on stdin.
//!
//! This module owns opencode's command line, the environment that makes it run unattended, its
//! facts ([`INFO`]) and its dialect of the `--format json` output (one JSON event per stdout line,
//! plus logfmt error logs on stderr), read into [`AgentEvent`]s over the shared [`StreamCore`].
//! Schema sources: `notes/agent-protocols.md` §4 (opencode's `run.ts` and `message-v2.ts`) and
//! `notes/real-clis.md` §3, checked against what opencode 1.18.33 really prints (probed offline
//! against a scripted Chat Completions server).
//!
//! Command-line decisions, each verified with 1.18.33:
//! - the prompt goes on stdin with no positional message: `run` reads a non-TTY stdin to EOF
//!   and uses it as the message. A positional prompt would hit the argv limit (128 KiB per
//!   argument) and opencode re-quotes positional words containing spaces;
//! - permissions: `OPENCODE_PERMISSION={"*":"allow"}`. Without it, `run` auto-rejects every
//!   permission "ask" (e.g. writing outside the repository) and the run ends after the tool
//!   call with exit 0 and no answer. The env works in builds that predate `--auto` (the flag's
//!   name has changed across versions, and opencode refuses unknown flags); a value the user
//!   already exported is kept, so their own rules win;
//! - `--title`: a title derived from the prompt, because without one opencode spends an extra
//!   model request per run generating it;
//! - `--print-logs --log-level ERROR`: the JSON `error` event of a failure that happens outside
//!   a model call is only `UnknownError: Unexpected server error. Check server logs for
//!   details.`; the ERROR log line on stderr names the cause (`ProviderModelNotFoundError:
//!   Model not found: x/y`). They also show opencode's own retries of a 429 or 5xx as they
//!   happen (one `stream error` line per attempt) instead of a minute of silence. Successful
//!   runs print nothing at that level.
//!
//! Reading rules:
//! - every stdout line is parsed as JSON; non-JSON lines and unknown `type`s yield no event;
//! - the session is the first `sessionID` seen. Steps, text and tool parts of another session
//!   (a subagent's, should a build print them) never make the final text, but their cost counts;
//! - a step ends with `step_finish`; `reason:"tool-calls"` means the model asked for tools and
//!   the loop goes on, any other reason (`stop`, `length`, `content-filter`, `error`, `other`)
//!   ends the run. The final text is the text parts of the last such terminal step: text
//!   written before a tool call, and tool inputs and outputs, never count;
//! - usage and cost are the sums over every `step_finish` (tokens; cost in USD);
//! - failures: an `error` event, a terminal `reason:"error"`, or a non-zero exit code (older
//!   builds exit 0 after an error event). Classes come from the structured error first
//!   (`error.name`, `error.data.statusCode`, the provider's `responseBody`), then from the
//!   error texts through the classifier.
//!
//! HTTP 429: opencode has already retried a retryable error five times with backoff (honouring
//! `retry-after`) before it prints the `error` event, and the AI SDK marks every 429 retryable,
//! so `isRetryable` says nothing about its kind. A 429 is therefore a [`FailureClass::Transient`]
//! rate limit, which ralph retries later without using up an iteration, unless the provider's
//! body says the money or quota is gone (OpenAI's `insufficient_quota` and spend-limit codes,
//! opencode Zen's `FreeUsageLimitError`/`GoUsageLimitError`): that is a
//! [`FailureClass::UsageLimit`], which waits for the reset (from `retry-after` when the
//! response had one) instead of retrying minutes later.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::agent::classify::{precedence, Signal};
use crate::agent::registry::{no_traps, BackendInfo, PromptVia, SandboxNeeds};
use crate::agent::stream::{json_object, Dialect, Parser, StderrTail, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::{strip_ansi, SpawnSpec};
use crate::protocol::fields::{summarize_tool_input, truncate_chars};
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::FailureClass;

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "opencode";

/// Facts about the opencode backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Opencode,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it with `npm install -g opencode-ai`",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: no_traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Opencode::new(settings))),
    sandbox: SandboxNeeds {
        state: &[
            ".config/opencode",
            ".local/share/opencode",
            ".local/state/opencode",
            ".cache/opencode",
        ],
        env_prefixes: &[
            "OPENCODE",
            "ANTHROPIC_",
            "OPENAI_",
            "GEMINI_",
            "GOOGLE_",
            "OPENROUTER_",
        ],
        hosts: &[
            "api.anthropic.com:443",
            "api.openai.com:443",
            "models.dev:443",
            "opencode.ai:443",
        ],
        base_url_hosts: || {
            crate::agent::registry::env_url_hosts(&["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"])
        },
        config_env: Vec::new,
        state_vars: &["OPENCODE_CONFIG_DIR"],
        config_vars: &["OPENCODE_CONFIG"],
    },
};

/// The variable holding opencode's permission rules (a JSON object, merged over its config).
pub const PERMISSION_ENV: &str = "OPENCODE_PERMISSION";

/// The rules ralph sets when the user has not: allow every tool without asking.
pub const ALLOW_ALL: &str = r#"{"*":"allow"}"#;

/// Longest session title, in characters.
const TITLE_MAX_CHARS: usize = 100;

/// `step_finish.part.reason` of a step that ended by asking for tools (the run goes on).
const REASON_TOOL_CALLS: &str = "tool-calls";

/// Provider error codes and types (OpenAI's envelope, `notes/agent-protocols.md` §10) that mean
/// the account is out of money or quota, not merely rate limited.
const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "credit_balance_exhausted",
    "organization_usage_limit_exceeded",
    "billing_error",
    "billing_hard_limit_reached",
];

/// Error classes opencode Zen puts in a 429 body when the plan's allowance is used up (seen in
/// 1.18.33's retry code).
const ZEN_LIMIT_MARKERS: &[&str] = &["FreeUsageLimitError", "GoUsageLimitError"];

/// The OpenCode backend. Stateless apart from its settings; each [`Backend::parser`] call
/// returns a fresh [`OpencodeParser`].
#[derive(Debug, Clone)]
pub struct Opencode {
    settings: AgentSettings,
}

impl Opencode {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `--model settings.model` (`provider/model`) when set.
    pub fn new(settings: AgentSettings) -> Self {
        Opencode { settings }
    }

    /// The spawn spec for `prompt`. `user_permission` is the inherited value of
    /// [`PERMISSION_ENV`]; when it is set and not blank it is left alone.
    fn spec(&self, prompt: &str, user_permission: Option<&str>) -> SpawnSpec {
        let title = session_title(prompt);
        let args = self.settings.args_with_model(
            &[
                "run",
                "--format",
                "json",
                "--print-logs",
                "--log-level",
                "ERROR",
                "--title",
                &title,
            ],
            "--model",
        );
        // Nothing to scrub: opencode sets OPENCODE/OPENCODE_PID/AGENT for its own tools
        // itself, overriding any inherited value, and every other OPENCODE_* variable is
        // user configuration ralph must pass through.
        let mut spec = self.settings.cli_spec(DEFAULT_PROGRAM, args, Some(prompt));
        if user_permission.is_none_or(|p| p.trim().is_empty()) {
            spec.env_set
                .push((PERMISSION_ENV.to_owned(), ALLOW_ALL.to_owned()));
        }
        spec
    }
}

impl Backend for Opencode {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `opencode run --format json --print-logs --log-level ERROR --title T [--model M]`, the
    /// prompt on stdin, `NO_COLOR=1`, and `OPENCODE_PERMISSION={"*":"allow"}` unless the user
    /// exported their own rules. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        let inherited = std::env::var(PERMISSION_ENV).ok();
        Ok(self.spec(prompt, inherited.as_deref()))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // opencode never echoes the prompt on stdout in json mode.
        Box::new(OpencodeParser::new().for_model(self.settings.model.as_deref()))
    }
}

/// The session title for `prompt`: `ralph <story id>: <story title>` from ralph's template
/// lines `Story ID:` and `Title:`, else `ralph: <first non-empty line>` (Markdown heading marks
/// removed), at most [`TITLE_MAX_CHARS`] characters.
pub fn session_title(prompt: &str) -> String {
    let field = |name: &str| {
        prompt
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    // ralph's template writes the id bare; a hand-written prompt may quote or star it.
    let id = field("Story ID:")
        .map(|id| id.trim_matches(|c| matches!(c, '`' | '*' | '"')).to_owned())
        .filter(|id| !id.is_empty());
    let title = match (id, field("Title:")) {
        (Some(id), Some(t)) => format!("ralph {id}: {t}"),
        (Some(id), None) => format!("ralph {id}"),
        _ => match prompt
            .lines()
            .map(|l| l.trim().trim_start_matches('#').trim())
            .find(|l| !l.is_empty())
        {
            Some(line) if line.starts_with("ralph") => line.to_owned(),
            Some(line) => format!("ralph: {line}"),
            None => "ralph".to_owned(),
        },
    };
    truncate_chars(&title, TITLE_MAX_CHARS)
}

/// A step of the main session in progress.
#[derive(Debug, Default)]
struct Step {
    texts: Vec<String>,
}

/// The last terminal step: its reason and text parts.
#[derive(Debug, Clone)]
struct Terminal {
    reason: String,
    texts: Vec<String>,
}

/// One `error` event, as far as the report needs it.
#[derive(Debug, Clone)]
struct ErrorEvent {
    /// `error.name` (`APIError`, `ProviderAuthError`, `UnknownError`, ...).
    name: String,
    message: Option<String>,
    status: Option<u16>,
}

/// Reads opencode's `run --format json` output. Memory use is bounded by the text parts of one
/// step, the error events and a few stderr lines, whatever the length of the run.
pub type OpencodeParser = Parser<OpencodeDialect>;

/// opencode's dialect. In the core: the session, the summed usage and cost, the provider's
/// reset time, and the most decisive class read from structured fields the classifier has no
/// signal for (error names, provider quota codes, opencode's own error classes in logs).
#[derive(Debug, Default)]
pub struct OpencodeDialect {
    step: Option<Step>,
    terminal: Option<Terminal>,
    /// A newer build's `done` event was seen.
    done: bool,
    /// Permissions the `done` event says were auto-rejected.
    rejected: Vec<String>,
    errors: Vec<ErrorEvent>,
    /// The error texts of opencode's ERROR log lines on stderr, first one first (capped).
    log_errors: Vec<String>,
    /// opencode printed its usage text: it refused the command line.
    usage_printed: bool,
}

/// Raises the structured class to `class` when that is more decisive.
fn note_class(core: &mut StreamCore, class: FailureClass) {
    if core
        .failure
        .is_none_or(|c| precedence(class) > precedence(c))
    {
        core.failure = Some(class);
    }
}

impl Dialect for OpencodeDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = json_object(line) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let line_session = str_at(&v, "/sessionID").or_else(|| str_at(&v, "/part/sessionID"));
        if core.session_id.is_none() {
            if let Some(id) = &line_session {
                core.session_id = Some(id.clone());
                events.push(core.session_event());
            }
        }
        // A line without a session id is taken as the main session's.
        let main = line_session.is_none() || line_session == core.session_id;
        match v.get("type").and_then(Value::as_str) {
            Some("step_start") if main => self.step = Some(Step::default()),
            Some("text") if main => {
                if let Some(text) = str_at(&v, "/part/text") {
                    self.step
                        .get_or_insert_with(Step::default)
                        .texts
                        .push(text.clone());
                    events.push(AgentEvent::AssistantText { text });
                }
            }
            Some("tool_use") if main => events.extend(on_tool_use(&v)),
            Some("step_finish") => events.extend(self.on_step_finish(&v, main, core)),
            Some("error") => events.extend(self.on_error(&v, core)),
            Some("done") => {
                self.rejected.extend(
                    v.get("rejected")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|r| match r.as_str() {
                            Some(s) => s.to_owned(),
                            None => r.to_string(),
                        }),
                );
                if !self.done && self.terminal.is_none() {
                    events.push(AgentEvent::Final {
                        text: None,
                        is_error: !self.errors.is_empty(),
                    });
                }
                self.done = true;
            }
            _ => {}
        }
        events
    }

    fn stderr(&mut self, text: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let clean = strip_ansi(text);
        let clean = clean.trim();
        if clean.is_empty() {
            return Vec::new();
        }
        if clean.starts_with("opencode run [message..]") {
            self.usage_printed = true;
        }
        let fields = logfmt(clean);
        let level = fields.iter().find(|(k, _)| k == "level").map(|(_, v)| v);
        if level.is_some_and(|l| l.eq_ignore_ascii_case("error")) {
            // `error` on the run's own failure, `error.error` on a failed model stream; the
            // first line of the value, without the stack trace that may follow.
            let error = fields
                .iter()
                .find(|(k, _)| k == "error" || k == "error.error")
                .map(|(_, v)| v.lines().next().unwrap_or_default().trim().to_owned())
                .filter(|e| !e.is_empty());
            let Some(error) = error else {
                return Vec::new();
            };
            if error.contains("ModelNotFoundError") {
                note_class(core, FailureClass::Config);
            }
            core.classifier.observe(Signal::Text(&error));
            if self.log_errors.len() < StderrTail::LINES {
                self.log_errors
                    .push(error.chars().take(StderrTail::LINE_MAX_CHARS).collect());
            }
            return vec![AgentEvent::Error { message: error }];
        }
        if level.is_some() {
            // Log lines below ERROR: noise for the report.
            return Vec::new();
        }
        core.stderr(clean)
    }

    /// Report rules beyond the shared skeleton:
    /// - `final_text`: the text parts of the last terminal step (`step_finish.reason` other than
    ///   `tool-calls`) of the main session, joined with newlines; `None` without one;
    /// - `saw_final`: a terminal step or a `done` event was seen;
    /// - `is_error`: an `error` event, a terminal `reason:"error"`, or an exit code other than 0
    ///   (`None`, killed, included);
    /// - `failure`: the most decisive of the structured classes and the classifier's; a refused
    ///   command line is [`FailureClass::Config`];
    /// - `error_message`: also for a run without a terminal step;
    /// - `cost_usd`/`usage`: sums over every `step_finish` (USD; tokens, reasoning counted as
    ///   output); `cost_usd` is `None` when no step finished;
    /// - `resume_at`: for a usage limit, the provider's `retry-after`, else a reset time written
    ///   in the message.
    fn settle(&mut self, core: &mut StreamCore, exit_code: Option<i32>) {
        core.saw_final = self.terminal.is_some() || self.done;
        core.is_error = !self.errors.is_empty()
            || exit_code != Some(0)
            || self.terminal.as_ref().is_some_and(|t| t.reason == "error");
        let refused =
            (self.usage_printed && core.session_id.is_none()).then_some(FailureClass::Config);
        core.failure = [core.failure, core.classifier.best(), refused]
            .into_iter()
            .flatten()
            .max_by_key(|c| precedence(*c));
        core.explain_unfinished = true;
        core.final_text = self
            .terminal
            .as_ref()
            .filter(|t| !t.texts.is_empty())
            .map(|t| t.texts.join("\n"));
    }

    /// The error message to report for a failed run, best source first.
    fn error_message(&self, core: &StreamCore, exit_code: Option<i32>) -> Option<String> {
        // `UnknownError` only says "check server logs": the log line is the better message.
        let from_event = self
            .errors
            .iter()
            .find(|e| e.name != "UnknownError" || self.log_errors.is_empty())
            .map(|e| describe_error(&e.name, e.message.as_deref(), e.status));
        if let Some(m) = from_event.or_else(|| self.log_errors.first().cloned()) {
            return Some(m);
        }
        if self.usage_printed {
            return Some(
                "opencode refused its command line and printed its usage; ralph needs \
                 `opencode run --format json` (opencode 1.x)"
                    .to_owned(),
            );
        }
        if let Some(m) = core.classifier.message() {
            return Some(m.to_owned());
        }
        if !self.rejected.is_empty() {
            return Some(format!(
                "opencode auto-rejected permissions: {}",
                self.rejected.join(", ")
            ));
        }
        if self.terminal.as_ref().is_some_and(|t| t.reason == "error") {
            return Some("opencode's last step ended with reason `error`".to_owned());
        }
        if let Some(tail) = core.stderr_tail.joined() {
            return Some(tail);
        }
        Some(match exit_code {
            Some(0) => {
                "opencode exited without a final answer (its last step asked for tools)".to_owned()
            }
            Some(code) => format!("opencode exited with code {code}"),
            None => "opencode was killed by a signal".to_owned(),
        })
    }
}

impl OpencodeDialect {
    fn on_step_finish(&mut self, v: &Value, main: bool, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(part) = v.get("part") else {
            return Vec::new();
        };
        if let Some(cost) = part.get("cost").and_then(Value::as_f64) {
            *core.cost_usd.get_or_insert(0.0) += cost;
        }
        if let Some(tokens) = part.get("tokens") {
            let n = |p: &str| tokens.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            core.usage.input_tokens += n("/input");
            // Reasoning tokens are billed as output; ralph's usage has no separate field.
            core.usage.output_tokens += n("/output") + n("/reasoning");
            core.usage.cache_read_tokens += n("/cache/read");
            core.usage.cache_creation_tokens += n("/cache/write");
        }
        if !main {
            return Vec::new();
        }
        let step = self.step.take().unwrap_or_default();
        let reason = part
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        if reason == REASON_TOOL_CALLS {
            return Vec::new();
        }
        let is_error = reason == "error";
        let text = (!step.texts.is_empty()).then(|| step.texts.join("\n"));
        self.terminal = Some(Terminal {
            reason: reason.to_owned(),
            texts: step.texts,
        });
        vec![AgentEvent::Final { text, is_error }]
    }

    fn on_error(&mut self, v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
        let err = v.get("error").unwrap_or(&Value::Null);
        let name = str_at(err, "/name").unwrap_or_else(|| "Error".to_owned());
        let data = err.get("data").unwrap_or(&Value::Null);
        let message = str_at(data, "/message")
            .or_else(|| err.as_str().map(str::to_owned))
            .or_else(|| str_at(err, "/message"))
            .map(|m| strip_ansi(&m).trim().to_owned())
            .filter(|m| !m.is_empty());
        let status = data
            .get("statusCode")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok());

        match name.as_str() {
            "ProviderAuthError" | "LoadAPIKeyError" | "AuthError" => {
                note_class(core, FailureClass::Auth)
            }
            "ContextOverflowError" => note_class(core, FailureClass::Context),
            _ => {}
        }
        if let Some(status) = status {
            core.classifier.observe(Signal::ApiStatus(status));
        }
        let raw_body = str_at(data, "/responseBody").unwrap_or_default();
        let body: Value = serde_json::from_str(&raw_body).unwrap_or(Value::Null);
        let codes: Vec<String> = ["/error/type", "/error/code", "/type", "/code"]
            .iter()
            .filter_map(|p| str_at(&body, p))
            .collect();
        for code in &codes {
            core.classifier.observe(Signal::ErrorCode(code));
        }
        let quota = codes
            .iter()
            .any(|c| QUOTA_CODES.contains(&c.as_str()) || c.ends_with("_spend_limit_exceeded"))
            || ZEN_LIMIT_MARKERS.iter().any(|m| raw_body.contains(m));
        if quota {
            note_class(core, FailureClass::UsageLimit);
            core.resume_at = retry_after(data.get("responseHeaders"), v.get("timestamp"));
        }
        if codes.iter().any(|c| c == "context_length_exceeded") {
            note_class(core, FailureClass::Context);
        }
        if let Some(m) = &message {
            core.classifier.observe(Signal::Text(m));
        }
        let shown = describe_error(&name, message.as_deref(), status);
        self.errors.push(ErrorEvent {
            name,
            message,
            status,
        });
        vec![AgentEvent::Error { message: shown }]
    }
}

/// A `tool_use` line (printed once the tool finished): the call, then its result.
fn on_tool_use(v: &Value) -> Vec<AgentEvent> {
    let Some(part) = v.get("part") else {
        return Vec::new();
    };
    let name = str_at(part, "/tool").unwrap_or_else(|| "?".to_owned());
    let summary = summarize_tool_input(part.pointer("/state/input").unwrap_or(&Value::Null));
    let status = str_at(part, "/state/status");
    let mut events = vec![AgentEvent::ToolCall { name, summary }];
    if matches!(status.as_deref(), Some("completed" | "error")) {
        events.push(AgentEvent::ToolResult {
            is_error: status.as_deref() == Some("error"),
            output: part
                .pointer("/state/output")
                .or_else(|| part.pointer("/state/error"))
                .and_then(Value::as_str)
                .and_then(super::stream::tool_output),
            exit_code: part
                .pointer("/state/metadata/exit")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok()),
        });
    }
    events
}

/// `Rate limit exceeded (HTTP 429)`, `ProviderAuthError: message`, or the name alone.
fn describe_error(name: &str, message: Option<&str>, status: Option<u16>) -> String {
    match (message, status) {
        (Some(m), Some(s)) => format!("{m} (HTTP {s})"),
        (Some(m), None) if name == "APIError" || name == "UnknownError" => m.to_owned(),
        (Some(m), None) => format!("{name}: {m}"),
        (None, Some(s)) => format!("{name} (HTTP {s})"),
        (None, None) => name.to_owned(),
    }
}

/// When a rate-limited provider said to come back: `retry-after-ms` (milliseconds) or
/// `retry-after` (seconds, or an HTTP date) among `headers`, counted from the event's
/// `timestamp` (epoch milliseconds), else from now.
fn retry_after(headers: Option<&Value>, timestamp: Option<&Value>) -> Option<DateTime<Utc>> {
    let headers = headers?.as_object()?;
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_str())
            .map(str::trim)
    };
    let base = timestamp
        .and_then(Value::as_i64)
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or_else(Utc::now);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return base.checked_add_signed(chrono::Duration::milliseconds(ms.max(0.0) as i64));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return base.checked_add_signed(chrono::Duration::milliseconds(
            (secs.max(0.0) * 1000.0) as i64,
        ));
    }
    DateTime::parse_from_rfc2822(value)
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

/// The `key=value` pairs of a logfmt line (opencode's `--print-logs` format); quoted values
/// have their `\"`, `\\` and `\n` escapes undone. Text that is not logfmt gives no pairs with a
/// `level` key, which is all the caller checks.
fn logfmt(line: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() && chars.peek().is_none() {
            return pairs;
        }
        if chars.peek() != Some(&'=') {
            // A bare word: not a pair.
            if chars.next().is_none() {
                return pairs;
            }
            continue;
        }
        chars.next();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some('t') => value.push('\t'),
                        Some(other) => value.push(other),
                        None => break,
                    },
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        pairs.push((key, value));
    }
}

fn str_at(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stream::test_support::{self, err, out};
    use crate::completion::promise_in_final_text;
    use crate::process::OutputLine;
    use crate::protocol::{AgentReport, Usage};
    use std::path::PathBuf;

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        test_support::run_plain::<OpencodeDialect>(lines, exit)
    }

    fn claims(report: &AgentReport) -> bool {
        promise_in_final_text(report.final_text.as_deref().unwrap_or_default())
    }

    // Lines as opencode 1.18.33 printed them against the scripted server (ids shortened, costs
    // made non-zero: the fake provider is free).
    const START_1: &str = r#"{"type":"step_start","timestamp":1796003379692,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_1","messageID":"msg_1","sessionID":"ses_dd5db4fedffe","snapshot":"4b825dc642cb6eb9a060e54bf8d69288fbee4904","type":"step-start"}}"#;
    const TEXT_1: &str = r#"{"type":"text","timestamp":1796003379692,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_2","messageID":"msg_1","sessionID":"ses_dd5db4fedffe","type":"text","text":"Writing.","time":{"start":1796003379672,"end":1796003379687}}}"#;
    const WRITE: &str = r#"{"type":"tool_use","timestamp":1796003379719,"sessionID":"ses_dd5db4fedffe","part":{"type":"tool","tool":"write","callID":"call_1","state":{"status":"completed","input":{"filePath":"/w/repo/hello.txt","content":"hi\n"},"output":"Wrote file successfully.","metadata":{"diagnostics":{},"filepath":"/w/repo/hello.txt","exists":false,"truncated":false},"title":"hello.txt","time":{"start":1796003379684,"end":1796003379711}},"id":"prt_3","sessionID":"ses_dd5db4fedffe","messageID":"msg_1"}}"#;
    const FINISH_TOOLS_1: &str = r#"{"type":"step_finish","timestamp":1796003379793,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_4","reason":"tool-calls","snapshot":"7a28711","messageID":"msg_1","sessionID":"ses_dd5db4fedffe","type":"step-finish","tokens":{"total":120,"input":100,"output":20,"reasoning":0,"cache":{"write":0,"read":0}},"cost":0.0123}}"#;
    const START_2: &str = r#"{"type":"step_start","timestamp":1796003379941,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_5","messageID":"msg_2","sessionID":"ses_dd5db4fedffe","snapshot":"7a28711","type":"step-start"}}"#;
    /// A bash call whose output holds the promise (the agent grepped for it).
    const BASH_ECHOING_PROMISE: &str = r#"{"type":"tool_use","timestamp":1796003380042,"sessionID":"ses_dd5db4fedffe","part":{"type":"tool","tool":"bash","callID":"call_2","state":{"status":"completed","input":{"command":"cat hello.txt; echo '<promise>COMPLETE</promise>'","description":"show"},"output":"hi\n<promise>COMPLETE</promise>\n","metadata":{"output":"hi\n<promise>COMPLETE</promise>\n","exit":0,"truncated":false},"title":"cat hello.txt","time":{"start":1796003379930,"end":1796003380039}},"id":"prt_6","sessionID":"ses_dd5db4fedffe","messageID":"msg_2"}}"#;
    const FINISH_TOOLS_2: &str = r#"{"type":"step_finish","timestamp":1796003380073,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_7","reason":"tool-calls","snapshot":"7a28711","messageID":"msg_2","sessionID":"ses_dd5db4fedffe","type":"step-finish","tokens":{"total":170,"input":150,"output":20,"reasoning":0,"cache":{"write":0,"read":0}},"cost":0.0045}}"#;
    const START_3: &str = r#"{"type":"step_start","timestamp":1796003380173,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_8","messageID":"msg_3","sessionID":"ses_dd5db4fedffe","snapshot":"7a28711","type":"step-start"}}"#;
    const TEXT_FINAL: &str = r#"{"type":"text","timestamp":1796003380173,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_9","messageID":"msg_3","sessionID":"ses_dd5db4fedffe","type":"text","text":"Done.\n<promise>COMPLETE</promise>","time":{"start":1796003380168,"end":1796003380171}}}"#;
    const TEXT_PLAIN: &str = r#"{"type":"text","timestamp":1796003380173,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_9","messageID":"msg_3","sessionID":"ses_dd5db4fedffe","type":"text","text":"Created hello.txt.","time":{"start":1796003380168,"end":1796003380171}}}"#;
    const FINISH_STOP: &str = r#"{"type":"step_finish","timestamp":1796003380218,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_10","reason":"stop","snapshot":"7a28711","messageID":"msg_3","sessionID":"ses_dd5db4fedffe","type":"step-finish","tokens":{"total":17609,"input":200,"output":9,"reasoning":3,"cache":{"write":400,"read":17000}},"cost":0.0001}}"#;
    /// The 429 line of `notes/agent-protocols.md` §4, as opencode prints it after its retries.
    const RATE_LIMITED: &str = r#"{"type":"error","timestamp":1768191342200,"sessionID":"ses_44f9562d4ffe","error":{"name":"APIError","data":{"message":"Rate limit exceeded","statusCode":429,"isRetryable":true}}}"#;

    #[test]
    fn real_1_18_33_run_final_text_usage_and_cost() {
        let lines = [
            out(START_1),
            out(TEXT_1),
            out(WRITE),
            out(FINISH_TOOLS_1),
            out(START_2),
            out(BASH_ECHOING_PROMISE),
            out(FINISH_TOOLS_2),
            out(START_3),
            out(TEXT_FINAL),
            out(FINISH_STOP),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("ses_dd5db4fedffe".into()),
                    model: None,
                    version: None
                },
                AgentEvent::AssistantText {
                    text: "Writing.".into()
                },
                AgentEvent::ToolCall {
                    name: "write".into(),
                    summary: "/w/repo/hello.txt".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::ToolCall {
                    name: "bash".into(),
                    summary: "cat hello.txt; echo '<promise>COMPLETE</promise>'".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::AssistantText {
                    text: "Done.\n<promise>COMPLETE</promise>".into()
                },
                AgentEvent::Final {
                    text: Some("Done.\n<promise>COMPLETE</promise>".into()),
                    is_error: false
                },
            ]
        );
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert!(claims(&report));
        assert_eq!(report.session_id.as_deref(), Some("ses_dd5db4fedffe"));
        let cost = report.cost_usd.expect("cost");
        assert!((cost - 0.0169).abs() < 1e-9, "{cost}");
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 450,
                output_tokens: 52,
                cache_read_tokens: 17000,
                cache_creation_tokens: 400,
            }
        );
    }

    /// What opencode 1.18.33 printed when the provider answered 404 for the model: a config
    /// error naming it; and a final answer that discusses limits is no failure.
    #[test]
    fn a_missing_model_is_config_and_an_answer_about_limits_is_not_a_limit() {
        let lines = [
            err(
                r#"timestamp=2026-12-01T13:00:35.311Z level=ERROR run=22c96db7 message=process session.id=ses_d messageID=msg_2 error="The model `gpt-nope-9` does not exist or you do not have access to it." stack="AI_APICallError: The model `gpt-nope-9` does not exist""#,
            ),
            out(
                r#"{"type":"error","timestamp":1796130035319,"sessionID":"ses_d","error":{"name":"APIError","data":{"message":"The model `gpt-nope-9` does not exist or you do not have access to it.","statusCode":404,"isRetryable":false,"responseBody":"{\"error\":{\"message\":\"The model `gpt-nope-9` does not exist or you do not have access to it.\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_request_error\"}}"}}}"#,
            ),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report
            .error_message
            .unwrap_or_default()
            .starts_with("the model `gpt-nope-9` does not exist"));

        let about = r#"{"type":"text","timestamp":1796003380173,"sessionID":"ses_dd5db4fedffe","part":{"id":"prt_9","messageID":"msg_3","sessionID":"ses_dd5db4fedffe","type":"text","text":"Mapped 'Rate limit exceeded (HTTP 429)' and 'insufficient_quota' to retries.","time":{"start":1,"end":2}}}"#;
        let (_, report) = run(&[out(START_3), out(about), out(FINISH_STOP)], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
    }

    #[test]
    fn promise_in_tool_output_does_not_count() {
        let lines = [
            out(START_2),
            out(BASH_ECHOING_PROMISE),
            out(FINISH_TOOLS_2),
            out(START_3),
            out(TEXT_PLAIN),
            out(FINISH_STOP),
        ];
        let (_, report) = run(&lines, Some(0));
        assert_eq!(report.final_text.as_deref(), Some("Created hello.txt."));
        assert!(!claims(&report));
    }

    /// Text written in a step that then called tools is not the final answer, even when the
    /// run is cut short right after it.
    #[test]
    fn promise_in_an_earlier_step_followed_by_tool_calls_does_not_count() {
        let early_claim = TEXT_1.replace("Writing.", "All done. <promise>COMPLETE</promise>");
        let lines = [
            out(START_1),
            out(&early_claim),
            out(WRITE),
            out(FINISH_TOOLS_1),
            out(START_3),
            out(TEXT_PLAIN),
            out(FINISH_STOP),
        ];
        let (_, report) = run(&lines, Some(0));
        assert_eq!(report.final_text.as_deref(), Some("Created hello.txt."));
        assert!(!claims(&report));

        // Killed after the tool step: no terminal step, so no final text at all.
        let (events, report) = run(&lines[..4], None);
        assert!(!events.iter().any(|e| matches!(e, AgentEvent::Final { .. })));
        assert_eq!(report.final_text, None);
        assert!(!report.saw_final && report.is_error);
        assert_eq!(
            report.error_message.as_deref(),
            Some("opencode was killed by a signal")
        );
        // An unfinished step's text does not count either.
        let (_, report) = run(&[out(START_3), out(TEXT_FINAL)], None);
        assert!(!claims(&report));
    }

    #[test]
    fn rate_limit_429_is_transient_and_says_so() {
        let (events, report) = run(&[out(RATE_LIMITED)], Some(1));
        assert_eq!(
            events[1],
            AgentEvent::Error {
                message: "Rate limit exceeded (HTTP 429)".into()
            }
        );
        assert!(report.is_error && !report.saw_final);
        assert_eq!(report.failure, Some(FailureClass::Transient));
        assert_eq!(
            report.error_message.as_deref(),
            Some("Rate limit exceeded (HTTP 429)")
        );
        assert_eq!(report.resume_at, None);
        assert_eq!(report.session_id.as_deref(), Some("ses_44f9562d4ffe"));
        // Older builds exit 0 after an error event: still an error.
        let (_, report) = run(&[out(RATE_LIMITED)], Some(0));
        assert!(report.is_error);
        assert_eq!(report.failure, Some(FailureClass::Transient));
    }

    /// A 429 whose body says the quota is gone waits for the reset the provider gave; a reset
    /// that has already passed is no time to wait for (the message says so).
    #[test]
    fn quota_429_is_a_usage_limit_with_the_providers_reset() {
        let quota = |timestamp_ms: i64| {
            format!(
                r#"{{"type":"error","timestamp":{timestamp_ms},"sessionID":"ses_q","error":{{"name":"APIError","data":{{"message":"You exceeded your current quota, please check your plan and billing details.","statusCode":429,"isRetryable":true,"responseHeaders":{{"content-type":"application/json","retry-after":"3600"}},"responseBody":"{{\"error\":{{\"message\":\"You exceeded your current quota, please check your plan and billing details.\",\"type\":\"insufficient_quota\",\"param\":null,\"code\":\"insufficient_quota\"}}}}","metadata":{{"url":"https://api.openai.com/v1/chat/completions"}}}}}}}}"#
            )
        };
        let now_ms = chrono::Utc::now().timestamp_millis();
        let (_, report) = run(&[out(&quota(now_ms))], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(
            report.resume_at.map(|t| t.timestamp_millis()),
            Some(now_ms + 3_600_000)
        );
        // The same event replayed two days later: its reset has passed.
        let (_, report) = run(&[out(&quota(now_ms - 48 * 3_600_000))], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.resume_at, None);
        assert!(
            report
                .error_message
                .as_deref()
                .is_some_and(|m| m
                    .ends_with("has already passed, so ralph waits usage_limit_fallback instead")),
            "{:?}",
            report.error_message
        );

        // opencode Zen's plan limit, reset as an HTTP date.
        let zen = r#"{"type":"error","timestamp":1796003564686,"sessionID":"ses_z","error":{"name":"APIError","data":{"message":"Usage limit","statusCode":429,"isRetryable":true,"responseHeaders":{"Retry-After":"Mon, 30 Nov 2099 06:00:00 GMT"},"responseBody":"{\"type\":\"error\",\"error\":{\"type\":\"GoUsageLimitError\",\"message\":\"limit\"}}"}}}"#;
        let (_, report) = run(&[out(zen)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(
            report.resume_at.map(|t| t.to_rfc3339()),
            Some("2099-11-30T06:00:00+00:00".to_owned())
        );
    }

    #[test]
    fn auth_errors_from_status_and_error_name() {
        // What 1.18.33 printed for a scripted 401.
        let api_401 = r#"{"type":"error","timestamp":1796003432703,"sessionID":"ses_a","error":{"name":"APIError","data":{"message":"Incorrect API key provided","statusCode":401,"isRetryable":false,"responseHeaders":{"content-type":"application/json"},"responseBody":"{\"error\":{\"message\":\"Incorrect API key provided\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}","metadata":{"url":"http://127.0.0.1:18082/v1/chat/completions"}}}}"#;
        let provider_auth = r#"{"type":"error","timestamp":1796003432703,"sessionID":"ses_b","error":{"name":"ProviderAuthError","data":{"providerID":"anthropic","message":"No API key found for provider anthropic"}}}"#;
        for (line, message) in [
            (api_401, "Incorrect API key provided (HTTP 401)"),
            (
                provider_auth,
                "ProviderAuthError: No API key found for provider anthropic",
            ),
        ] {
            let (_, report) = run(&[out(line)], Some(1));
            assert_eq!(report.failure, Some(FailureClass::Auth), "{line}");
            assert_eq!(report.error_message.as_deref(), Some(message));
        }
    }

    #[test]
    fn server_errors_and_context_overflow() {
        let e500 = r#"{"type":"error","sessionID":"s","error":{"name":"APIError","data":{"message":"Internal server error","statusCode":500,"isRetryable":true}}}"#;
        let (_, report) = run(&[out(e500)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Transient));
        let overflow = r#"{"type":"error","sessionID":"s","error":{"name":"ContextOverflowError","data":{"message":"Context overflow: prompt is 210000 tokens"}}}"#;
        let (_, report) = run(&[out(overflow)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Context));
        let e400 = r#"{"type":"error","sessionID":"s","error":{"name":"APIError","data":{"message":"This model's maximum context length is 128000 tokens.","statusCode":400,"isRetryable":false,"responseBody":"{\"error\":{\"message\":\"This model's maximum context length is 128000 tokens.\",\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\"}}"}}}"#;
        let (_, report) = run(&[out(e400)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Context));
        // A plain 400 is the agent's error, of no retryable class.
        let bad = r#"{"type":"error","sessionID":"s","error":{"name":"APIError","data":{"message":"scripted bad request","statusCode":400,"isRetryable":false}}}"#;
        let (_, report) = run(&[out(bad)], Some(1));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("scripted bad request (HTTP 400)")
        );
    }

    /// A wrong `--model`: the event only says "check server logs"; the ERROR log names it.
    #[test]
    fn unknown_error_takes_its_cause_from_the_error_log() {
        let lines = [
            out(
                r#"{"type":"error","timestamp":1796003593900,"sessionID":"ses_m","error":{"name":"UnknownError","data":{"message":"Unexpected server error. Check server logs for details.","ref":"err_ef90f8a6"}}}"#,
            ),
            err(
                r#"timestamp=2026-11-30T01:53:13.899Z level=ERROR run=a1096940 message=failed ref=err_ef90f8a6 error="ProviderModelNotFoundError: Model not found: nope/nothing. Did you mean: standardcompute?" cause="ProviderModelNotFoundError: Model not found: nope/nothing.\n    at <anonymous> (/$bunfs/root/chunk-dn9bw1yz.js:439:94416)""#,
            ),
        ];
        let (events, report) = run(&lines, Some(1));
        assert!(events.contains(&AgentEvent::Error {
            message: "ProviderModelNotFoundError: Model not found: nope/nothing. Did you mean: standardcompute?".into()
        }));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert_eq!(
            report.error_message.as_deref(),
            Some(
                "the model `nope/nothing` does not exist or this account cannot use it: fix --model (a config error; ralph does not retry it); the agent said: ProviderModelNotFoundError: Model not found: nope/nothing. Did you mean: standardcompute?"
            )
        );
    }

    #[test]
    fn stream_error_logs_feed_the_classifier_but_not_on_success() {
        let log = r#"timestamp=2026-11-30T01:53:40.207Z level=ERROR run=6e9adc59 message="stream error" providerID=fake modelID=fake-model small=false agent=build mode=primary error.error="AI_APICallError: Invalid API key""#;
        let (_, report) = run(&[err(log)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert_eq!(
            report.error_message.as_deref(),
            Some("AI_APICallError: Invalid API key")
        );
        // The same log line in a run that then finished normally is not a failure.
        let (_, report) = run(
            &[err(log), out(START_3), out(TEXT_PLAIN), out(FINISH_STOP)],
            Some(0),
        );
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        // Log lines below ERROR are ignored.
        let (events, _) = run(&[err("timestamp=x level=WARN message=\"slow\"")], Some(0));
        assert!(events.is_empty());
    }

    /// An unknown flag (another opencode version): usage on stderr, exit 1, no JSON.
    #[test]
    fn refused_command_line_is_a_config_error() {
        let lines = [
            err("opencode run [message..]"),
            err(""),
            err("run opencode with a message"),
            err("      --auto         auto-approve permissions that are not explicitly denied (dangerous!)"),
        ];
        let (_, report) = run(&lines, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(
            report
                .error_message
                .as_deref()
                .unwrap_or_default()
                .contains("refused its command line"),
            "{:?}",
            report.error_message
        );
    }

    /// Without the permission env, 1.18.33 auto-rejects an "ask", ends after the tool step and
    /// exits 0.
    #[test]
    fn auto_rejected_permission_ends_without_a_final_answer() {
        let rejected = WRITE
            .replace(r#""status":"completed""#, r#""status":"error""#)
            .replace(
                r#""output":"Wrote file successfully.""#,
                r#""error":"The user rejected permission to use this specific tool call.""#,
            );
        let lines = [
            out(START_1),
            out(&rejected),
            err("\x1b[93m\x1b[1m! \x1b[0mpermission requested: external_directory (/w/*); auto-rejecting"),
            out(FINISH_TOOLS_1),
        ];
        let (events, report) = run(&lines, Some(0));
        assert!(events.contains(&AgentEvent::tool_result(true)));
        assert!(!report.saw_final && !report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("! permission requested: external_directory (/w/*); auto-rejecting")
        );
    }

    #[test]
    fn another_sessions_text_is_never_final_but_its_cost_counts() {
        let sub = |s: &str| s.replace("ses_dd5db4fedffe", "ses_subagent");
        let lines = [
            out(START_1),
            out(&sub(START_3)),
            out(&sub(TEXT_FINAL)),
            out(&sub(FINISH_STOP)),
            out(FINISH_TOOLS_1),
            out(START_3),
            out(TEXT_PLAIN),
            out(FINISH_STOP),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Final { .. }))
                .count(),
            1
        );
        assert_eq!(report.final_text.as_deref(), Some("Created hello.txt."));
        let cost = report.cost_usd.expect("cost");
        assert!((cost - 0.0125).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn done_event_and_terminal_error_reason() {
        let done = r#"{"type":"done","timestamp":1,"sessionID":"s","reason":"idle","rejected":["external_directory"]}"#;
        let (events, report) = run(&[out(done)], Some(0));
        assert!(matches!(
            events.last(),
            Some(AgentEvent::Final {
                text: None,
                is_error: false
            })
        ));
        assert!(report.saw_final && !report.is_error);

        let reason_error = FINISH_STOP.replace(r#""reason":"stop""#, r#""reason":"error""#);
        let (_, report) = run(&[out(START_3), out(&reason_error)], Some(0));
        assert!(report.saw_final && report.is_error);
        assert_eq!(
            report.error_message.as_deref(),
            Some("opencode's last step ended with reason `error`")
        );
    }

    /// Non-JSON lines, JSON that is not an object, unknown types, invalid UTF-8 (decoded
    /// lossily), a huge tool line and a CRLF line: no crash, the real events still parsed.
    #[test]
    fn hostile_lines_are_ignored() {
        let big = BASH_ECHOING_PROMISE.replace("hi\\n", &"x".repeat(6 * 1024 * 1024));
        let invalid_utf8 = String::from_utf8_lossy(b"{\"type\":\"text\xff\xfe\"}").into_owned();
        let lines = [
            out("Warning: something on stdout that is not JSON"),
            out(""),
            out("[1,2,3]"),
            out(r#""type":"step_finish""#),
            out(r#"{"type":"some_future_type","part":{"text":"<promise>COMPLETE</promise>"}}"#),
            out(
                r#"{"type":"reasoning","sessionID":"ses_dd5db4fedffe","part":{"type":"reasoning","text":"<promise>COMPLETE</promise>"}}"#,
            ),
            out(&invalid_utf8),
            out(START_2),
            out(&big),
            out(FINISH_TOOLS_2),
            out(START_3),
            out(TEXT_PLAIN),
            out(&format!("{FINISH_STOP}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 5, "{events:?}");
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.final_text.as_deref(), Some("Created hello.txt."));
    }

    #[test]
    fn command_line_env_and_stdin() {
        let oc = Opencode::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("anthropic/claude-sonnet-4-5".into()),
            ..AgentSettings::default()
        });
        let prompt = "# ralph: iteration 1 of 10\n\nStory ID: US-001\nTitle: Add `slugify`\n\"$(rm -rf ~)\" — ünïcode";
        let spec = oc.spec(prompt, None);
        assert_eq!(spec.program, PathBuf::from("opencode"));
        assert_eq!(
            spec.args,
            [
                "run",
                "--format",
                "json",
                "--print-logs",
                "--log-level",
                "ERROR",
                "--title",
                "ralph US-001: Add `slugify`",
                "--model",
                "anthropic/claude-sonnet-4-5"
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert!(spec.env_remove.is_empty());
        assert_eq!(
            spec.env_set,
            [
                ("NO_COLOR".to_owned(), "1".to_owned()),
                (
                    "OPENCODE_PERMISSION".to_owned(),
                    r#"{"*":"allow"}"#.to_owned()
                )
            ]
        );
        // The user's own rules are kept; a blank value is not a rule.
        let spec = oc.spec(prompt, Some(r#"{"bash":"deny"}"#));
        assert!(!spec.env_set.iter().any(|(k, _)| k == PERMISSION_ENV));
        let spec = oc.spec(prompt, Some(" "));
        assert!(spec.env_set.iter().any(|(k, _)| k == PERMISSION_ENV));

        let custom = Opencode::new(AgentSettings {
            program: Some(PathBuf::from("/opt/oc/bin/opencode")),
            ..AgentSettings::default()
        });
        let spec = custom.spec("p", None);
        assert_eq!(spec.program, PathBuf::from("/opt/oc/bin/opencode"));
        assert!(!spec.args.iter().any(|a| a == "--model"));
    }

    #[test]
    fn session_titles() {
        assert_eq!(session_title("Story ID: `US-7`\nbody"), "ralph US-7");
        assert_eq!(
            session_title("\n\n## ralph: iteration 2 of 5\nmore"),
            "ralph: iteration 2 of 5"
        );
        assert_eq!(session_title("Fix the bug\n"), "ralph: Fix the bug");
        assert_eq!(session_title("  \n"), "ralph");
        let long = session_title(&format!("Story ID: US-1\nTitle: {}", "é".repeat(300)));
        assert_eq!(long.chars().count(), TITLE_MAX_CHARS + 1);
    }

    #[test]
    fn logfmt_pairs_and_retry_after() {
        assert_eq!(
            logfmt(r#"level=ERROR message="a \"b\"\nc" error.error=x bare k="""#),
            [
                ("level".to_owned(), "ERROR".to_owned()),
                ("message".to_owned(), "a \"b\"\nc".to_owned()),
                ("error.error".to_owned(), "x".to_owned()),
                ("k".to_owned(), String::new()),
            ]
        );
        assert!(logfmt("! permission requested: x; auto-rejecting")
            .iter()
            .all(|(k, _)| k != "level"));
        let ts = serde_json::json!(1_000_000);
        let at = |h: Value| retry_after(Some(&h), Some(&ts)).map(|t| t.timestamp_millis());
        assert_eq!(
            at(serde_json::json!({"retry-after-ms": "250"})),
            Some(1_000_250)
        );
        assert_eq!(at(serde_json::json!({"retry-after": "2"})), Some(1_002_000));
        assert_eq!(at(serde_json::json!({"retry-after": "soon"})), None);
        assert_eq!(at(serde_json::json!({})), None);
    }

    #[test]
    fn tool_summaries_are_one_short_line() {
        use serde_json::json;
        assert_eq!(
            summarize_tool_input(&json!({"pattern": "TODO", "path": "src"})),
            "TODO in src"
        );
        assert_eq!(
            summarize_tool_input(&json!({"command": "cargo   test\n --all"})),
            "cargo test --all"
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
