//! The OpenAI Codex CLI backend: `codex exec --json`, prompt on stdin.
//!
//! This module owns codex's command line, its facts ([`INFO`], doctor traps) and its dialect of the
//! `exec --json` output (one JSON object per stdout line: `thread.started`, `turn.started`,
//! `item.started|updated|completed`, `turn.completed`, `turn.failed`, `error`), read into
//! [`AgentEvent`]s over the shared [`StreamCore`]. Schema source: `notes/agent-protocols.md` §2
//! (codex-rs `exec_events.rs`, `core/src/error.rs`) and `notes/real-clis.md` §2, checked against
//! what `@openai/codex@0.171.0` really prints.
//!
//! Reading rules, each forced by real output:
//! - every line is parsed as JSON, never prefix-matched; lines that are not JSON objects, and
//!   unknown `type`s, yield no event;
//! - the final text is the `text` of the last completed `agent_message` item. Command output
//!   (`command_execution.aggregated_output`), reasoning and the prompt (codex never echoes it)
//!   never count, so a `<promise>` in a file the agent printed is not a claim;
//! - the run's end is `turn.completed` (success) or `turn.failed` (failure); an interrupted turn
//!   prints neither and exits 1;
//! - `item.type == "error"` items are warnings (0.171.0 prints `Model metadata for `m` not
//!   found. Defaulting to fallback metadata…` for any model it does not know) and top-level
//!   `error` events are retry chatter or the echo of the failure that `turn.failed` then
//!   reports: neither ends the run or fails it on its own;
//! - failures are classified from `turn.failed.error.message`, the top-level `error` messages
//!   and stderr (the agent's own error channel) plus the HTTP status codex writes into some
//!   messages (`unexpected status 401 Unauthorized: …`, `last status: 429 Too Many Requests`);
//!   codex 0.171.0 turns an HTTP 429 with error type `usage_limit_reached` into
//!   `You’ve hit your usage limit. … try again at 2:51 AM.` (local time; curly apostrophe);
//! - usage comes from `turn.completed.usage`, where `input_tokens` *includes* the cached
//!   (and cache-write) tokens: [`Usage::input_tokens`] is the uncached rest. codex reports no
//!   cost and, in `--json` mode, no version.

use std::collections::HashSet;

use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia, SandboxNeeds};
use crate::agent::stream::{json_object, tokens, Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::{strip_ansi, SpawnSpec};
use crate::protocol::fields::str_field;
use crate::protocol::fields::summarize_tool_input;
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::Usage;

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "codex";

/// Facts about the codex backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Codex,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it with `npm install -g @openai/codex`",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Codex::new(settings))),
    sandbox: SandboxNeeds {
        state: &[".codex"],
        env_prefixes: &["OPENAI_", "CODEX_", "RUST_LOG"],
        hosts: &[
            "api.openai.com:443",
            "chatgpt.com:443",
            "auth.openai.com:443",
        ],
        base_url_hosts: codex_base_url_hosts,
        config_env: || codex_config_strings("env_key"),
        state_vars: &["CODEX_HOME"],
        config_vars: &[],
    },
};
/// Every string value of `key` anywhere in `$CODEX_HOME/config.toml` (default `~/.codex`).
fn codex_config_strings(key: &str) -> Vec<String> {
    fn walk(v: &toml::Value, key: &str, out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    match v {
                        toml::Value::String(s) if k == key => out.push(s.clone()),
                        _ => walk(v, key, out),
                    }
                }
            }
            toml::Value::Array(a) => a.iter().for_each(|v| walk(v, key, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    let home = std::env::var_os("CODEX_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".codex")));
    if let Some(config) = home
        .and_then(|h| std::fs::read_to_string(h.join("config.toml")).ok())
        .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
    {
        walk(&toml::Value::Table(config), key, &mut found);
    }
    found
}

/// The hosts of every `base_url` in codex's config.toml, and of `OPENAI_BASE_URL`: where this
/// machine points codex, which `--sandbox strict` must let it reach.
fn codex_base_url_hosts() -> Vec<String> {
    let mut hosts = crate::agent::registry::env_url_hosts(&["OPENAI_BASE_URL"]);
    hosts.extend(
        codex_config_strings("base_url")
            .iter()
            .filter_map(|u| crate::agent::registry::url_host(u)),
    );
    hosts
}

/// The arguments before the optional `-m MODEL` and the final `-` (read the prompt from stdin).
///
/// - `--json`: the JSONL event stream on stdout (banners and warnings go to stderr);
/// - `--dangerously-bypass-approvals-and-sandbox`: ralph runs unattended, and codex's own
///   sandbox (bwrap/landlock) often fails inside containers; it also skips the git check;
/// - `--skip-git-repo-check`: otherwise a repository codex has not been told to trust stops the
///   run with `Not inside a trusted directory and --skip-git-repo-check was not specified.`;
/// - `--color never`: no ANSI codes on stderr (0.171.0 accepts it together with `--json`).
pub const BASE_ARGS: &[&str] = &[
    "exec",
    "--json",
    "--dangerously-bypass-approvals-and-sandbox",
    "--skip-git-repo-check",
    "--color",
    "never",
];

/// The Codex CLI backend. Stateless apart from its settings; each [`Backend::parser`] call
/// returns a fresh [`CodexParser`].
#[derive(Debug, Clone)]
pub struct Codex {
    settings: AgentSettings,
}

impl Codex {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `-m settings.model` when set.
    pub fn new(settings: AgentSettings) -> Self {
        Codex { settings }
    }
}

impl Backend for Codex {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `codex exec --json --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check
    /// --color never [-m MODEL] -`, the prompt on stdin (then closed), `NO_COLOR=1`.
    ///
    /// The prompt goes on stdin, never argv: no size limit (E2BIG at 128 KiB) and no quoting.
    /// `-` makes codex 0.171.0 read the whole prompt from stdin; without it, codex would read
    /// stdin anyway when it is not a terminal and append it as a `<stdin>` block. Either way it
    /// waits for EOF, which is why stdin is closed after the prompt. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        let mut args = self.settings.args_with_model(BASE_ARGS, "-m");
        args.push("-".into());
        Ok(self.settings.cli_spec(DEFAULT_PROGRAM, args, Some(prompt)))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // codex never prints the prompt back in `--json` mode.
        Box::new(CodexParser::new().for_model(self.settings.model.as_deref()))
    }
}

/// Neither a key nor a saved login.
fn traps(cx: &DoctorContext<'_>) -> Vec<String> {
    let codex_home = cx
        .env_path("CODEX_HOME")
        .or_else(|| cx.home().map(|h| h.join(".codex")));
    let logged_in = codex_home.is_some_and(|h| h.join("auth.json").is_file());
    if cx.env_set("CODEX_API_KEY") || cx.env_set("OPENAI_API_KEY") || logged_in {
        return Vec::new();
    }
    vec!["no CODEX_API_KEY and no saved login ($CODEX_HOME/auth.json): run `codex login` or export CODEX_API_KEY".to_owned()]
}

/// Reads codex's `exec --json` output. Memory use is bounded by the largest agent message plus
/// a few stderr lines and the ids of items still running, whatever the length of the run.
pub type CodexParser = Parser<CodexDialect>;

/// codex's dialect. In the core: the thread id is the session; the final text is the last
/// completed `agent_message` (also after a failure, so the transcript shows what the agent last
/// said); `turn.completed` ends without error and `turn.failed` with one, whose message is the
/// error message; top-level `error` events are the fallback message.
#[derive(Debug, Default)]
pub struct CodexDialect {
    /// Ids of tool items whose `item.started` was seen (their call was already reported).
    started: HashSet<String>,
}

impl Dialect for CodexDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = json_object(line) else {
            return Vec::new();
        };
        match v.get("type").and_then(Value::as_str) {
            Some("thread.started") => {
                core.session_id = str_field(&v, "thread_id").or(core.session_id.take());
                vec![core.session_event()]
            }
            Some("item.started") => self.on_item(&v, false, core),
            Some("item.completed") => self.on_item(&v, true, core),
            Some("turn.completed") => {
                if let Some(u) = v.get("usage") {
                    core.usage = usage_of(u);
                }
                core.saw_final = true;
                core.is_error = false;
                core.error_message = None;
                vec![AgentEvent::Final {
                    text: core.final_text.clone(),
                    is_error: false,
                }]
            }
            Some("turn.failed") => {
                let message = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(|m| strip_ansi(m).trim().to_owned())
                    .filter(|m| !m.is_empty());
                if let Some(m) = &message {
                    observe_error_text(core, m);
                }
                core.saw_final = true;
                core.is_error = true;
                core.error_message = message;
                vec![AgentEvent::Final {
                    text: core.final_text.clone(),
                    is_error: true,
                }]
            }
            Some("error") => {
                // Retry chatter (`Reconnecting... 2/5 (stream disconnected …)`) or the failure
                // that `turn.failed` repeats: decisive only if the run then fails.
                let Some(message) = str_field(&v, "message")
                    .map(|m| strip_ansi(&m).trim().to_owned())
                    .filter(|m| !m.is_empty())
                else {
                    return Vec::new();
                };
                observe_error_text(core, &message);
                core.error_event = Some(message.clone());
                vec![AgentEvent::Error { message }]
            }
            _ => Vec::new(),
        }
    }

    /// The usual sources, then a note that `turn.failed` said nothing.
    fn error_message(&self, core: &StreamCore, _exit_code: Option<i32>) -> Option<String> {
        core.error_message_chain().or_else(|| {
            (core.saw_final && core.is_error)
                .then(|| "codex reported turn.failed without a message".to_owned())
        })
    }
}

impl CodexDialect {
    /// `item.started` (`completed == false`) and `item.completed` lines.
    fn on_item(&mut self, v: &Value, completed: bool, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(item) = v.get("item") else {
            return Vec::new();
        };
        let id = str_field(item, "id");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, completed) {
            ("agent_message", true) => {
                let Some(text) = str_field(item, "text") else {
                    return Vec::new();
                };
                core.final_text = Some(text.clone());
                vec![AgentEvent::AssistantText { text }]
            }
            ("error", true) => {
                // A warning item (fallback model metadata and the like): shown, never fatal,
                // and not fed to the classifier, since it is not about the API call.
                match str_field(item, "message") {
                    Some(m) => vec![AgentEvent::Error {
                        message: strip_ansi(&m).trim().to_owned(),
                    }],
                    None => Vec::new(),
                }
            }
            _ => {
                let Some((name, summary)) = tool_call(kind, item) else {
                    return Vec::new();
                };
                let mut events = Vec::new();
                let already = id.as_ref().is_some_and(|i| self.started.contains(i));
                if !completed {
                    if let Some(id) = id {
                        self.started.insert(id);
                    }
                    events.push(AgentEvent::ToolCall { name, summary });
                    return events;
                }
                // Items that only ever complete (file changes, finished searches) were not
                // announced yet.
                if !already {
                    events.push(AgentEvent::ToolCall { name, summary });
                }
                if let Some(id) = &id {
                    self.started.remove(id);
                }
                events.push(AgentEvent::ToolResult {
                    is_error: tool_failed(item),
                    output: item
                        .get("aggregated_output")
                        .and_then(Value::as_str)
                        .and_then(super::stream::tool_output),
                    exit_code: item
                        .get("exit_code")
                        .and_then(Value::as_i64)
                        .and_then(|c| i32::try_from(c).ok()),
                });
                events
            }
        }
    }
}

/// Feeds one of codex's own error messages to the classifier, plus the HTTP status it names.
fn observe_error_text(core: &mut StreamCore, message: &str) {
    if let Some(status) = status_in_message(message) {
        core.classifier.observe(Signal::ApiStatus(status));
    }
    core.classifier.observe(Signal::Text(message));
}

/// The tool name and one-line summary shown for a tool-like item, `None` for items that are
/// not tool calls (reasoning, todo lists, unknown types).
fn tool_call(kind: &str, item: &Value) -> Option<(String, String)> {
    match kind {
        "command_execution" => {
            let command = str_field(item, "command").unwrap_or_default();
            let summary = summarize_tool_input(&serde_json::json!({
                "command": unwrap_shell(&command)
            }));
            Some(("command".to_owned(), summary))
        }
        "file_change" => {
            let paths: Vec<String> = item
                .get("changes")
                .and_then(Value::as_array)
                .map(|changes| {
                    changes
                        .iter()
                        .filter_map(|c| {
                            let path = c.get("path").and_then(Value::as_str)?;
                            Some(match c.get("kind").and_then(Value::as_str) {
                                Some(kind) => format!("{kind} {path}"),
                                None => path.to_owned(),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let summary = summarize_tool_input(&serde_json::json!({"path": paths.join(", ")}));
            Some(("file_change".to_owned(), summary))
        }
        "mcp_tool_call" => {
            let server = str_field(item, "server").unwrap_or_default();
            let tool = str_field(item, "tool").unwrap_or_default();
            let summary = summarize_tool_input(item.get("arguments").unwrap_or(&Value::Null));
            Some((format!("{server}.{tool}"), summary))
        }
        "web_search" => {
            let summary = summarize_tool_input(&serde_json::json!({
                "query": str_field(item, "query").unwrap_or_default()
            }));
            Some(("web_search".to_owned(), summary))
        }
        "collab_tool_call" => {
            let tool = str_field(item, "tool").unwrap_or_else(|| "collab".to_owned());
            Some((tool, String::new()))
        }
        _ => None,
    }
}

/// Whether a completed tool item failed: a `failed`/`declined` status, a non-zero
/// `exit_code`, or an `error` object (MCP calls).
fn tool_failed(item: &Value) -> bool {
    let status_failed = matches!(
        item.get("status").and_then(Value::as_str),
        Some("failed" | "declined")
    );
    let exit_failed = item
        .get("exit_code")
        .and_then(Value::as_i64)
        .is_some_and(|c| c != 0);
    let error = item.get("error").is_some_and(|e| !e.is_null());
    status_failed || exit_failed || error
}

/// The command inside codex's `/bin/bash -lc '<command>'` wrapper, or `command` unchanged.
fn unwrap_shell(command: &str) -> String {
    if let Some(words) = shlex::split(command) {
        if let [shell, flag, inner] = words.as_slice() {
            let is_shell = ["bash", "sh", "zsh"]
                .iter()
                .any(|s| shell == s || shell.ends_with(&format!("/{s}")));
            if is_shell && flag.starts_with('-') && flag.ends_with('c') {
                return inner.clone();
            }
        }
    }
    command.to_owned()
}

/// The HTTP status codex writes into its error messages: `unexpected status 401 Unauthorized:
/// …` (any status it does not handle itself) and `exceeded retry limit, last status: 429 Too
/// Many Requests`.
fn status_in_message(message: &str) -> Option<u16> {
    ["unexpected status ", "last status: "]
        .iter()
        .find_map(|marker| {
            let start = message.find(marker)? + marker.len();
            let digits: String = message[start..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u16>().ok()
        })
        .filter(|s| (100..=599).contains(s))
}

/// `turn.completed.usage` → [`Usage`] (tokens; missing counts are 0). codex's `input_tokens`
/// counts every input token, the cached ones (`cached_input_tokens`) and, in builds that report
/// it, those written to a cache (`cache_write_input_tokens`) included; ralph's `input_tokens`
/// is the uncached rest. `output_tokens` already includes `reasoning_output_tokens`.
fn usage_of(u: &Value) -> Usage {
    let n = |key: &str| tokens(u, key);
    let cached = n("cached_input_tokens");
    let written = n("cache_write_input_tokens");
    Usage {
        input_tokens: n("input_tokens")
            .saturating_sub(cached)
            .saturating_sub(written),
        output_tokens: n("output_tokens"),
        cache_read_tokens: cached,
        cache_creation_tokens: written,
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
        test_support::run_plain::<CodexDialect>(lines, exit)
    }

    // Lines as codex 0.171.0 printed them against the scripted model (notes/real-clis.md §2).
    const THREAD: &str =
        r#"{"type":"thread.started","thread_id":"01a2296e-6a57-73f3-82f0-445dd7a67446"}"#;
    const METADATA_WARNING: &str = r#"{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues."}}"#;
    const TURN_STARTED: &str = r#"{"type":"turn.started"}"#;
    const CMD_STARTED: &str = r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc 'echo hi > hello.txt'","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#;
    const CMD_DONE: &str = r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc 'echo hi > hello.txt'","aggregated_output":"","exit_code":0,"status":"completed"}}"#;
    const MESSAGE: &str = r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Created hello.txt. <promise>COMPLETE</promise>"}}"#;
    const COMPLETED: &str = r#"{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"cache_write_input_tokens":0,"output_tokens":122,"reasoning_output_tokens":64}}"#;

    #[test]
    fn real_0_171_0_run_succeeds_with_promise_session_and_uncached_usage() {
        let lines = [
            out(THREAD),
            out(METADATA_WARNING),
            out(TURN_STARTED),
            out(CMD_STARTED),
            out(CMD_DONE),
            out(MESSAGE),
            out(COMPLETED),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("01a2296e-6a57-73f3-82f0-445dd7a67446".into()),
                    model: None,
                    version: None,
                },
                AgentEvent::Error {
                    message: "Model metadata for `fake-model` not found. Defaulting to fallback \
                              metadata; this can degrade performance and cause issues."
                        .into()
                },
                AgentEvent::ToolCall {
                    name: "command".into(),
                    summary: "echo hi > hello.txt".into()
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
        assert!(!report.is_error, "the metadata warning item is not fatal");
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 315,
                output_tokens: 122,
                cache_read_tokens: 24448,
                cache_creation_tokens: 0,
            }
        );
        assert_eq!(
            report.session_id.as_deref(),
            Some("01a2296e-6a57-73f3-82f0-445dd7a67446")
        );
        assert_eq!(report.cost_usd, None);
        assert_eq!(report.agent_version, None);
        assert_eq!(report.model, None);
    }

    /// What codex 0.171.0 printed with retries on: `Reconnecting... n/N` chatter carrying the
    /// status, then the failure. A 401 behind the chatter (or behind `exceeded retry limit,
    /// last status: 401 Unauthorized`) is auth, not transient; a 503 is transient; a 404 for the
    /// model is a config error naming it.
    #[test]
    fn retry_chatter_then_the_real_failure() {
        let failing = |message: &str| {
            let mut lines = vec![out(TURN_STARTED)];
            for n in 1..=2 {
                lines.push(out(&format!(
                    r#"{{"type":"error","message":{}}}"#,
                    serde_json::Value::String(format!("Reconnecting... {n}/2 ({message})"))
                )));
            }
            let quoted = serde_json::Value::String(message.to_owned());
            lines.push(out(&format!(r#"{{"type":"error","message":{quoted}}}"#)));
            lines.push(out(&format!(
                r#"{{"type":"turn.failed","error":{{"message":{quoted}}}}}"#
            )));
            run(&lines, Some(1)).1
        };
        let url = ", url: http://127.0.0.1:18731/v1/responses";
        let report = failing(&format!(
            "unexpected status 401 Unauthorized: Incorrect API key provided{url}"
        ));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        let report = failing("exceeded retry limit, last status: 401 Unauthorized");
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert_eq!(
            report.error_message.as_deref(),
            Some("exceeded retry limit, last status: 401 Unauthorized")
        );
        let report = failing(&format!(
            "unexpected status 503 Service Unavailable: Service Unavailable{url}"
        ));
        assert_eq!(report.failure, Some(FailureClass::Transient));
        let report = failing(&format!("unexpected status 404 Not Found: The model `gpt-nope-9` does not exist or you do not have access to it.{url}"));
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report
            .error_message
            .unwrap_or_default()
            .starts_with("the model `gpt-nope-9` does not exist"));

        // Chatter about an auth failure, then a turn that completes: no failure at all.
        let lines = [
            out(TURN_STARTED),
            out(
                r#"{"type":"error","message":"Reconnecting... 1/5 (unexpected status 401 Unauthorized: token expired)"}"#,
            ),
            out(MESSAGE),
            out(COMPLETED),
        ];
        let (_, report) = run(&lines, Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
    }

    /// An agent message that discusses usage limits, in a completed turn, is no limit.
    #[test]
    fn an_answer_about_limits_is_not_a_limit() {
        let message = r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Parsed 'You've hit your usage limit. Try again at 3:28 PM.' in limits.rs."}}"#;
        let (_, report) = run(&[out(TURN_STARTED), out(message), out(COMPLETED)], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.resume_at, None);
    }

    /// The promise in command output (the agent printed a file holding it) or in a reasoning
    /// item never counts; only the last agent_message does.
    #[test]
    fn promise_only_counts_in_the_last_agent_message() {
        let lines = [
            out(THREAD),
            out(
                r#"{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"Reading the instructions. <promise>COMPLETE</promise>"}}"#,
            ),
            out(
                r#"{"type":"item.completed","item":{"id":"item_1","type":"reasoning","text":"**Must end with <promise>COMPLETE</promise>**"}}"#,
            ),
            out(
                r#"{"type":"item.completed","item":{"id":"item_2","type":"command_execution","command":"/bin/bash -lc 'cat prompt.md'","aggregated_output":"Reply <promise>COMPLETE</promise>\n","exit_code":0,"status":"completed"}}"#,
            ),
            out(
                r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"US-002 is still open."}}"#,
            ),
            out(COMPLETED),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(report.final_text.as_deref(), Some("US-002 is still open."));
        assert!(!promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
        // The command only completed: its call and result are both reported then.
        assert!(events.contains(&AgentEvent::ToolCall {
            name: "command".into(),
            summary: "cat prompt.md".into()
        }));
        assert!(!events.iter().any(|e| matches!(
            e,
            AgentEvent::AssistantText { text } if text.contains("Must end")
        )));

        // Killed before the turn ended: the earlier message stays the last one said, but
        // the output of a command never becomes the final text.
        let (_, report) = run(&lines[..4], None);
        assert!(!report.saw_final && report.is_error);
        assert_eq!(
            report.final_text.as_deref(),
            Some("Reading the instructions. <promise>COMPLETE</promise>")
        );
    }

    /// The documented failure: `error` then `turn.failed`, exit 1.
    #[test]
    fn usage_limit_turn_failed_is_a_usage_limit() {
        let text =
            "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), \
                    visit https://chatgpt.com/codex/settings/usage to purchase more credits or \
                    try again at 3:28 PM.";
        let error = serde_json::json!({"type": "error", "message": text}).to_string();
        let failed =
            serde_json::json!({"type": "turn.failed", "error": {"message": text}}).to_string();
        let lines = [out(THREAD), out(TURN_STARTED), out(&error), out(&failed)];
        let (events, report) = run(&lines, Some(1));
        assert_eq!(
            events.last(),
            Some(&AgentEvent::Final {
                text: None,
                is_error: true
            })
        );
        assert!(report.saw_final && report.is_error);
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.error_message.as_deref(), Some(text));
        // "try again at 3:28 PM" is the machine's local time: the next 15:28:00 local, within
        // a day (or now, when 15:28 passed a few minutes ago).
        let got = report.resume_at.expect("the report carries the reset time");
        next_local_time_of_day(got, 15, 28);

        // 0.171.0's own words for a 429 `usage_limit_reached` (curly apostrophe).
        let curly = r#"{"type":"turn.failed","error":{"message":"You’ve hit your usage limit. Try again at 2:51 AM."}}"#;
        let (_, report) = run(&[out(curly)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        next_local_time_of_day(report.resume_at.expect("a reset time"), 2, 51);
    }

    /// Asserts that `at` is `hour:minute` local time, at most a day ahead (and not in the
    /// past, unless that time of day passed at most 10 minutes ago and `at` is now).
    fn next_local_time_of_day(at: chrono::DateTime<chrono::Utc>, hour: u32, minute: u32) {
        use chrono::Timelike;
        let now = chrono::Utc::now();
        assert!(
            at >= now - chrono::Duration::seconds(5) && at <= now + chrono::Duration::hours(24),
            "{at} is not within the next day of {now}"
        );
        let local = at.with_timezone(&chrono::Local);
        let exact = (local.hour(), local.minute(), local.second()) == (hour, minute, 0);
        // Read just after the reset: the parser says "now" rather than tomorrow.
        let just_passed = (at - now).num_seconds().abs() <= 5;
        assert!(
            exact || just_passed,
            "{local} is not {hour}:{minute:02} local"
        );
    }

    /// 0.171.0 against an HTTP 401 / 403: `unexpected status …` (with the retry counts at 0).
    #[test]
    fn auth_errors_are_read_from_the_status_in_the_message() {
        for status in ["401 Unauthorized", "403 Forbidden"] {
            let message = format!(
                "unexpected status {status}: Incorrect API key provided: sk-…1234., url: \
                 https://api.openai.com/v1/responses"
            );
            let error = serde_json::json!({"type": "error", "message": message}).to_string();
            let failed = serde_json::json!({"type": "turn.failed", "error": {"message": message}})
                .to_string();
            let (_, report) = run(&[out(THREAD), out(&error), out(&failed)], Some(1));
            assert_eq!(report.failure, Some(FailureClass::Auth), "{status}");
            assert_eq!(report.error_message.as_deref(), Some(message.as_str()));
        }
        let exhausted = r#"{"type":"turn.failed","error":{"message":"exceeded retry limit, last status: 429 Too Many Requests"}}"#;
        let (_, report) = run(&[out(exhausted)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Transient));
    }

    /// Scenario 7: reconnect chatter from 5xx answers, then a completed turn, is no failure.
    #[test]
    fn server_error_chatter_then_success_is_not_a_failure() {
        let lines = [
            out(THREAD),
            out(TURN_STARTED),
            out(
                r#"{"type":"error","message":"Reconnecting... 1/5 (unexpected status 503 Service Unavailable: upstream connect error, url: https://api.openai.com/v1/responses)"}"#,
            ),
            out(
                r#"{"type":"error","message":"Reconnecting... 2/5 (stream disconnected before completion: error sending request for url (https://api.openai.com/v1/responses))"}"#,
            ),
            out(MESSAGE),
            out(COMPLETED),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, AgentEvent::Error { .. }))
                .count(),
            2
        );
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);

        // The same chatter before a failed turn makes it transient.
        let mut failing = lines[..4].to_vec();
        failing.push(out(
            r#"{"type":"turn.failed","error":{"message":"stream disconnected before completion: error sending request for url (https://api.openai.com/v1/responses)"}}"#,
        ));
        let (_, report) = run(&failing, Some(1));
        assert_eq!(report.failure, Some(FailureClass::Transient));
    }

    /// codex refuses an untrusted directory on stderr, exit 1, before any JSON.
    #[test]
    fn stderr_only_failure_without_a_turn() {
        let line = "Not inside a trusted directory and --skip-git-repo-check was not specified.";
        let (events, report) = run(&[err(line)], Some(1));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(report.error_message.as_deref(), Some(line));
        assert_eq!(
            events,
            vec![AgentEvent::Error {
                message: line.into()
            }]
        );
        // A clap usage error (exit 2) is classified by the default rules.
        let (_, report) = run(
            &[err("error: unexpected argument '--full-auto' found")],
            Some(2),
        );
        assert!(report.is_error);

        // An interrupted turn prints neither terminal event and exits 1.
        let (_, report) = run(&[out(THREAD), out(TURN_STARTED), out(CMD_STARTED)], Some(1));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(report.failure, None);
    }

    /// Case 14: non-JSON lines, JSON that is not an object, unknown types, old-format lines
    /// (`{"id":"0","msg":{…}}`), a lossily decoded line, a 6 MB command output: no crash, the
    /// real events still parsed.
    #[test]
    fn hostile_lines_are_ignored_and_big_lines_parse() {
        let big = format!(
            r#"{{"type":"item.completed","item":{{"id":"item_9","type":"command_execution","command":"cat big","aggregated_output":"{}","exit_code":1,"status":"failed"}}}}"#,
            "x".repeat(6 * 1024 * 1024)
        );
        let invalid_utf8 = String::from_utf8_lossy(b"{\"type\":\"turn.\xff\xfe\"}").into_owned();
        let lines = [
            out("Reading additional input from stdin..."),
            out(""),
            out("[1,2,3]"),
            out("\"type\":\"turn.completed\""),
            out(
                r#"{"id":"0","msg":{"type":"agent_message","message":"<promise>COMPLETE</promise>"}}"#,
            ),
            out(r#"{"type":"some.future.event","text":"<promise>COMPLETE</promise>"}"#),
            out(r#"{"type":"item.completed","item":{"id":"t","type":"todo_list","items":[]}}"#),
            out(r#"{"type":"item.completed"}"#),
            out(&invalid_utf8),
            out(&big),
            out(MESSAGE),
            out(&format!("{COMPLETED}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(events[1], AgentEvent::tool_result(true));
        assert!(report.saw_final && !report.is_error);
        assert!(promise_in_final_text(
            report.final_text.as_deref().unwrap_or_default()
        ));
    }

    #[test]
    fn file_changes_and_mcp_calls_are_tool_calls() {
        let lines = [
            out(
                r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"/w/repo/src/lib.rs","kind":"update"},{"path":"/w/repo/new.rs","kind":"add"}],"status":"completed"}}"#,
            ),
            out(
                r#"{"type":"item.started","item":{"id":"item_3","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"query":"tokio"},"result":null,"error":null,"status":"in_progress"}}"#,
            ),
            out(
                r#"{"type":"item.completed","item":{"id":"item_3","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"query":"tokio"},"result":null,"error":{"message":"timeout"},"status":"failed"}}"#,
            ),
        ];
        let (events, _) = run(&lines, None);
        assert_eq!(
            events,
            vec![
                AgentEvent::ToolCall {
                    name: "file_change".into(),
                    summary: "update /w/repo/src/lib.rs, add /w/repo/new.rs".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::ToolCall {
                    name: "docs.search".into(),
                    summary: "tokio".into()
                },
                AgentEvent::tool_result(true),
            ]
        );
    }

    #[test]
    fn usage_without_cache_fields_and_with_cache_writes() {
        assert_eq!(
            usage_of(&serde_json::json!({"input_tokens": 20, "output_tokens": 10})),
            Usage {
                input_tokens: 20,
                output_tokens: 10,
                cache_read_tokens: 0,
                cache_creation_tokens: 0
            }
        );
        assert_eq!(
            usage_of(
                &serde_json::json!({"input_tokens": 1000, "cached_input_tokens": 600,
                "cache_write_input_tokens": 300, "output_tokens": 7})
            ),
            Usage {
                input_tokens: 100,
                output_tokens: 7,
                cache_read_tokens: 600,
                cache_creation_tokens: 300
            }
        );
    }

    #[test]
    fn status_and_shell_unwrapping() {
        assert_eq!(
            status_in_message("unexpected status 401 Unauthorized: x, url: y"),
            Some(401)
        );
        assert_eq!(
            status_in_message("exceeded retry limit, last status: 429 Too Many Requests"),
            Some(429)
        );
        assert_eq!(status_in_message("Try again at 3:28 PM."), None);
        assert_eq!(status_in_message("unexpected status ok"), None);
        assert_eq!(unwrap_shell("/bin/bash -lc 'cargo test'"), "cargo test");
        assert_eq!(
            unwrap_shell(r#"bash -lc "echo 'a b'""#),
            "echo 'a b'",
            "double-quoted inner command"
        );
        assert_eq!(unwrap_shell("cargo test --all"), "cargo test --all");
    }

    #[test]
    fn command_line_env_and_stdin() {
        let codex = Codex::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("gpt-5-codex".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode";
        let spec = codex.command(prompt).expect("spec");
        assert_eq!(spec.program, PathBuf::from("codex"));
        assert_eq!(
            spec.args,
            [
                "exec",
                "--json",
                "--dangerously-bypass-approvals-and-sandbox",
                "--skip-git-repo-check",
                "--color",
                "never",
                "-m",
                "gpt-5-codex",
                "-"
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);

        let custom = Codex::new(AgentSettings {
            program: Some(PathBuf::from("/opt/codex/bin/codex")),
            ..AgentSettings::default()
        });
        let spec = custom.command("p").expect("spec");
        assert_eq!(spec.program, PathBuf::from("/opt/codex/bin/codex"));
        assert!(!spec.args.iter().any(|a| a == "-m"));
        assert_eq!(spec.args.last().map(String::as_str), Some("-"));
    }
}
