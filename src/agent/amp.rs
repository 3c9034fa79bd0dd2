//! The Amp backend (Sourcegraph): `amp -x --stream-json --dangerously-allow-all`, prompt on
//! stdin.
//!
//! This module owns amp's command line and the reading of its `--stream-json` output (one JSON
//! object per stdout line, a Claude Code-compatible subset) into [`AgentEvent`]s and an
//! [`AgentReport`]. Schema source: `notes/agent-protocols.md` §3 (Amp) and §0 (rules for every
//! CLI); the shared Claude shapes are §1.
//!
//! Choices, each forced by what amp does:
//! - the prompt goes to stdin (`-x` without a value, then stdin closed): the notes' stdin form,
//!   with no argv size limit and no quoting;
//! - amp has no model flag; its model family is chosen by `-m/--mode` (`smart`, `rush`,
//!   `deep`). ralph's `--model M` is passed as `--mode M`, so `--agent amp --model rush` does
//!   what a user means; amp itself refuses a mode it does not know;
//! - amp echoes the prompt as a `user` line: text in `user` lines never becomes the final text
//!   (the prompt contains the completion promise instruction), nor do tool results;
//! - the final text is `result.result`; without it, the text blocks of the last top-level
//!   assistant message (`parent_tool_use_id` null). Blocks sharing a `message.id` belong to one
//!   message; amp's lines usually carry no id, so each line is then a message of its own;
//! - amp prints no run total for tokens: usage is summed over `assistant` lines, once per
//!   distinct `message.id` (a repeated id is the same turn printed again and is not added twice);
//!   lines without an id are each added. `total_cost_usd` is read when a build prints it (the
//!   notes say amp does not);
//! - failures: a `result` with `is_error:true` (subtypes `error_during_execution`,
//!   `error_max_turns`) and an `error` string; its text, the result text of an error result and
//!   stderr lines go through [`Classifier`]. The notes found no verified wording for amp's credit
//!   or auth errors, so classification rests on the classifier's shared text rules.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::agent::classify::{resume_at_from_text, Classifier, Signal};
use crate::agent::{AgentSettings, Backend, OutputParser, StderrTail};
use crate::process::{strip_ansi, OutputLine, SpawnSpec, StreamKind};
use crate::protocol::fields::str_field;
use crate::protocol::fields::summarize_tool_input;
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::AgentReport;
use crate::protocol::FailureClass;
use crate::protocol::Usage;

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "amp";

/// The amp backend. Stateless apart from its settings; each [`Backend::parser`] call returns a
/// fresh [`AmpParser`].
#[derive(Debug, Clone)]
pub struct Amp {
    settings: AgentSettings,
}

impl Amp {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `--mode settings.model` when a model is set (amp selects models by mode).
    pub fn new(settings: AgentSettings) -> Self {
        Amp { settings }
    }
}

impl Backend for Amp {
    fn kind(&self) -> AgentKind {
        AgentKind::Amp
    }

    /// `amp -x --stream-json --dangerously-allow-all [--mode M]`, the prompt on stdin (then
    /// closed), `NO_COLOR=1`. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        let program = self.settings.program_or(DEFAULT_PROGRAM);
        // `-x` with no value: amp takes the message from the piped stdin.
        let mut args: Vec<String> = ["-x", "--stream-json", "--dangerously-allow-all"]
            .map(String::from)
            .to_vec();
        if let Some(mode) = &self.settings.model {
            args.push("--mode".into());
            args.push(mode.clone());
        }
        Ok(SpawnSpec {
            program,
            args,
            cwd: self.settings.repo.clone(),
            env_remove: Vec::new(),
            env_set: vec![("NO_COLOR".to_owned(), "1".to_owned())],
            stdin: Some(prompt.as_bytes().to_vec()),
        })
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // The echoed prompt arrives as a `user` line, which never feeds the final text.
        Box::new(AmpParser::new())
    }
}

/// What the terminal `result` line said.
#[derive(Debug, Clone, Default)]
struct ResultLine {
    text: Option<String>,
    is_error: bool,
    subtype: Option<String>,
    /// The `error` field of an error result (amp SDK shape).
    error: Option<String>,
    cost_usd: Option<f64>,
}

/// Reads amp's `--stream-json` output. Memory use is bounded by the largest assistant message,
/// a few stderr lines and one usage entry per distinct `message.id`.
#[derive(Debug, Default)]
pub struct AmpParser {
    session_id: Option<String>,
    model: Option<String>,
    /// `message.id` of the last top-level assistant message (None when amp gave none), and its
    /// text blocks so far.
    last_message_id: Option<String>,
    last_message_texts: Vec<String>,
    /// Usage per distinct `message.id` (the largest count seen for each field).
    usage_by_id: BTreeMap<String, Usage>,
    /// Usage of assistant lines without an id, summed.
    usage_unkeyed: Usage,
    result: Option<ResultLine>,
    classifier: Classifier,
    /// Text of the last assistant message that carried an `error` field.
    assistant_error: Option<String>,
    stderr_tail: StderrTail,
}

impl AmpParser {
    /// A parser for one amp run.
    pub fn new() -> Self {
        Self::default()
    }

    fn on_stdout(&mut self, text: &str) -> Vec<AgentEvent> {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text.trim()) else {
            // Not a JSON object: amp's stream is JSON, but a wrapper may print to stdout. The
            // transcript keeps the raw line.
            return Vec::new();
        };
        let v = Value::Object(obj);
        if self.session_id.is_none() {
            self.session_id = str_field(&v, "session_id");
        }
        match v.get("type").and_then(Value::as_str) {
            Some("system") if str_field(&v, "subtype").as_deref() == Some("init") => {
                if let Some(id) = str_field(&v, "session_id") {
                    self.session_id = Some(id);
                }
                self.model = str_field(&v, "model").or(self.model.take());
                vec![AgentEvent::Session {
                    session_id: self.session_id.clone(),
                    model: self.model.clone(),
                    version: None,
                }]
            }
            Some("assistant") => self.on_assistant(&v),
            Some("user") => on_user(&v),
            Some("result") => self.on_result(&v),
            _ => Vec::new(),
        }
    }

    fn on_assistant(&mut self, v: &Value) -> Vec<AgentEvent> {
        let Some(message) = v.get("message") else {
            return Vec::new();
        };
        let id = str_field(message, "id");
        // Usage counts whoever spent it, subagents included.
        if let Some(u) = message.get("usage") {
            let usage = usage_of(u);
            match &id {
                Some(id) => {
                    let seen = self.usage_by_id.entry(id.clone()).or_default();
                    *seen = max_usage(*seen, usage);
                }
                None => self.usage_unkeyed = add_usage(self.usage_unkeyed, usage),
            }
        }
        if !v.get("parent_tool_use_id").is_none_or(Value::is_null) {
            // A subagent's turn: its text is not the agent's final word.
            return Vec::new();
        }
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
            // Claude's shape for an API error standing in for an assistant turn: an error, not
            // something the assistant said.
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
            self.model = str_field(message, "model");
        }
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
                    let summary = tool_summary(block.get("input").unwrap_or(&Value::Null));
                    events.push(AgentEvent::ToolCall { name, summary });
                }
                _ => {}
            }
        }
        events
    }

    fn on_result(&mut self, v: &Value) -> Vec<AgentEvent> {
        let subtype = str_field(v, "subtype");
        let is_error = v
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or_else(|| subtype.as_deref().is_some_and(|s| s.starts_with("error")));
        let text = str_field(v, "result");
        let error = v.get("error").and_then(error_text);
        if let Some(status) = v
            .get("api_error_status")
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
        {
            self.classifier.observe(Signal::ApiStatus(status));
        }
        if is_error {
            // Only an error result's text is the agent's own error message; a successful
            // result is the assistant's answer, which may quote anything.
            for t in error.iter().chain(text.iter()) {
                self.classifier.observe(Signal::Text(t));
            }
        }
        if let Some(id) = str_field(v, "session_id") {
            self.session_id = Some(id);
        }
        self.result = Some(ResultLine {
            text: text.clone(),
            is_error,
            subtype,
            error,
            cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
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
        let from_result = self.result.as_ref().filter(|r| r.is_error).map(|r| {
            r.error
                .clone()
                .or_else(|| r.text.clone())
                .filter(|t| !t.trim().is_empty())
                .unwrap_or_else(|| {
                    format!("amp ended with {}", r.subtype.as_deref().unwrap_or("error"))
                })
        });
        from_result
            .or_else(|| self.classifier.message().map(str::to_owned))
            .or_else(|| self.assistant_error.clone())
            .or_else(|| self.stderr_tail.joined())
            .map(|m| strip_ansi(&m))
    }

    /// Tokens over the whole run: one entry per distinct message id plus the id-less lines.
    fn total_usage(&self) -> Usage {
        self.usage_by_id
            .values()
            .fold(self.usage_unkeyed, |sum, u| add_usage(sum, *u))
    }
}

impl OutputParser for AmpParser {
    fn on_line(&mut self, line: &OutputLine) -> Vec<AgentEvent> {
        match line.stream {
            StreamKind::Stdout => self.on_stdout(&line.text),
            StreamKind::Stderr => self.on_stderr(&line.text),
        }
    }

    /// Report rules:
    /// - `final_text`: `result.result` when present, else the joined text blocks of the last
    ///   top-level assistant message, else `None`; never text from a `user` line;
    /// - `is_error`: `result.is_error` when a result line was seen, else "exit code was not 0";
    /// - `failure`: the most decisive class among amp's error signals, only when the run failed
    ///   (error result, or no result line);
    /// - `usage`: summed over assistant lines, once per distinct `message.id` (tokens);
    ///   `cost_usd`: `result.total_cost_usd` when printed (USD), else `None`;
    /// - `resume_at`: for a usage limit, the reset time written in the error message, if any.
    fn finish(self: Box<Self>, exit_code: Option<i32>) -> AgentReport {
        let saw_final = self.result.is_some();
        let is_error = match &self.result {
            Some(r) => r.is_error,
            None => exit_code != Some(0),
        };
        let failure = if is_error || !saw_final {
            self.classifier.best()
        } else {
            None
        };
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
        let resume_at = match failure {
            Some(FailureClass::UsageLimit) => {
                error_message.as_deref().and_then(resume_at_from_text)
            }
            _ => None,
        };
        AgentReport {
            final_text,
            saw_final,
            is_error,
            error_message,
            failure,
            cost_usd: self.result.as_ref().and_then(|r| r.cost_usd),
            usage: self.total_usage(),
            session_id: self.session_id,
            model: self.model,
            agent_version: None,
            resume_at,
        }
    }
}

/// Tool results: one event per `tool_result` block of a top-level `user` line. The echoed
/// prompt (a `user` line with `text` blocks) yields nothing.
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

/// A one-line summary of a tool input. amp's `Bash` names its command `cmd` (claude's says
/// `command`); everything else has claude's keys (`path`, `pattern`, ...).
fn tool_summary(input: &Value) -> String {
    match input.get("cmd").and_then(Value::as_str) {
        Some(cmd) => summarize_tool_input(&serde_json::json!({ "command": cmd })),
        None => summarize_tool_input(input),
    }
}

/// `result.error`: a string in the amp SDK's types; accept `{message}` too.
fn error_text(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::to_owned)
        .or_else(|| str_field(v, "message"))
        .filter(|s| !s.trim().is_empty())
}

/// `message.usage` → [`Usage`] (tokens; missing counts are 0).
fn usage_of(u: &Value) -> Usage {
    let n = |key: &str| u.get(key).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_read_tokens: n("cache_read_input_tokens"),
        cache_creation_tokens: n("cache_creation_input_tokens"),
    }
}

fn add_usage(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens.saturating_add(b.input_tokens),
        output_tokens: a.output_tokens.saturating_add(b.output_tokens),
        cache_read_tokens: a.cache_read_tokens.saturating_add(b.cache_read_tokens),
        cache_creation_tokens: a
            .cache_creation_tokens
            .saturating_add(b.cache_creation_tokens),
    }
}

/// Field-wise maximum: a message printed again (more blocks, a later snapshot) never counts
/// twice, and its most complete count wins.
fn max_usage(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens.max(b.input_tokens),
        output_tokens: a.output_tokens.max(b.output_tokens),
        cache_read_tokens: a.cache_read_tokens.max(b.cache_read_tokens),
        cache_creation_tokens: a.cache_creation_tokens.max(b.cache_creation_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::promise_in_final_text;
    use std::path::PathBuf;

    fn out(text: &str) -> OutputLine {
        OutputLine::stdout(text)
    }

    fn err(text: &str) -> OutputLine {
        OutputLine::stderr(text)
    }

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        let mut parser: Box<dyn OutputParser> = Box::new(AmpParser::new());
        let events = lines.iter().flat_map(|l| parser.on_line(l)).collect();
        (events, parser.finish(exit))
    }

    fn claims(report: &AgentReport) -> bool {
        promise_in_final_text(report.final_text.as_deref().unwrap_or_default())
    }

    // Shapes from notes/agent-protocols.md §3 (amp --stream-json).
    const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"/w/repo","session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83","tools":["Bash","Read","edit_file","create_file","Grep","glob","oracle","Task"],"mcp_servers":[]}"#;
    /// amp echoes the prompt; ralph's prompt explains the promise, here as its last words.
    const USER_ECHO: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"Work on US-001. When every story passes, end with <promise>COMPLETE</promise>"}]},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const TOOL_USE: &str = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"cmd":"cargo test"}}],"stop_reason":"tool_use","usage":{"input_tokens":12783,"cache_creation_input_tokens":367,"cache_read_input_tokens":12416,"output_tokens":28,"max_tokens":224000,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const TOOL_RESULT: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"ok","is_error":false}]},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const FINAL_TEXT: &str = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"Done.\n<promise>COMPLETE</promise>"}],"stop_reason":"end_turn","usage":{"input_tokens":13100,"cache_creation_input_tokens":0,"cache_read_input_tokens":12783,"output_tokens":14,"max_tokens":224000,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const RESULT: &str = r#"{"type":"result","subtype":"success","duration_ms":2906,"is_error":false,"num_turns":3,"result":"Done.\n<promise>COMPLETE</promise>","session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;

    #[test]
    fn successful_run_reads_events_final_text_usage_and_session() {
        let lines = [
            out(INIT),
            out(USER_ECHO),
            out(TOOL_USE),
            out(TOOL_RESULT),
            out(FINAL_TEXT),
            out(RESULT),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("T-2775dc92-90ed-4f85-8b73-8f9766029e83".into()),
                    model: None,
                    version: None,
                },
                AgentEvent::ToolCall {
                    name: "Bash".into(),
                    summary: "cargo test".into()
                },
                AgentEvent::ToolResult { is_error: false },
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
        assert_eq!(
            report.session_id.as_deref(),
            Some("T-2775dc92-90ed-4f85-8b73-8f9766029e83")
        );
        // Two assistant messages without ids: both counted, once each.
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 12783 + 13100,
                output_tokens: 28 + 14,
                cache_read_tokens: 12416 + 12783,
                cache_creation_tokens: 367,
            }
        );
        assert_eq!(report.cost_usd, None, "amp prints no cost");
    }

    /// The same `message.id` printed once per content block is one message: its usage is
    /// counted once, its blocks form the fallback final text together.
    #[test]
    fn usage_counts_each_message_id_once() {
        let block = |id: &str, text: &str, out_tokens: u64| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"{id}","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input_tokens":100,"cache_read_input_tokens":50,"output_tokens":{out_tokens}}}}},"parent_tool_use_id":null,"session_id":"T-1"}}"#
            )
        };
        let lines = [
            out(&block("msg_1", "Part one.", 5)),
            out(&block("msg_1", "Part two.", 9)),
            out(&block("msg_2", "Second turn.", 3)),
            out(&block("msg_2", "Still second.", 3)),
        ];
        // Killed before its result line.
        let (_, report) = run(&lines, None);
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 200,
                output_tokens: 12,
                cache_read_tokens: 100,
                cache_creation_tokens: 0,
            }
        );
        assert_eq!(
            report.final_text.as_deref(),
            Some("Second turn.\nStill second.")
        );
        assert_eq!(report.model.as_deref(), Some("claude-opus-5-5"));
        assert!(
            report.is_error && !report.saw_final,
            "killed without a result line"
        );
    }

    /// The promise in the echoed prompt or in a tool result is never a claim, with or without
    /// a result line.
    #[test]
    fn promise_in_echoed_prompt_or_tool_result_does_not_count() {
        let tool_result_with_promise = r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"prompt.md: end with <promise>COMPLETE</promise>","is_error":false}]},"parent_tool_use_id":null,"session_id":"T-1"}"#;
        let (events, report) = run(
            &[
                out(INIT),
                out(USER_ECHO),
                out(TOOL_USE),
                out(tool_result_with_promise),
            ],
            Some(0),
        );
        assert!(!events
            .iter()
            .any(|e| matches!(e, AgentEvent::AssistantText { .. })));
        assert_eq!(report.final_text, None);
        assert!(!claims(&report));

        let no_text_result = r#"{"type":"result","subtype":"success","duration_ms":10,"is_error":false,"num_turns":1,"session_id":"T-1"}"#;
        let (_, report) = run(&[out(USER_ECHO), out(no_text_result)], Some(0));
        assert!(report.saw_final && !report.is_error);
        assert!(!claims(&report));

        let said = r#"{"type":"result","subtype":"success","duration_ms":10,"is_error":false,"num_turns":1,"result":"I read the instructions; US-002 is still open.","session_id":"T-1"}"#;
        let (_, report) = run(
            &[out(USER_ECHO), out(tool_result_with_promise), out(said)],
            Some(0),
        );
        assert!(!claims(&report));
    }

    /// A subagent's text is never the final text; its tokens still count.
    #[test]
    fn subagent_text_is_not_the_final_text() {
        let top = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"Delegating."}],"usage":{"input_tokens":10,"output_tokens":1}},"parent_tool_use_id":null}"#;
        let sub = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"<promise>COMPLETE</promise>"}],"usage":{"input_tokens":7,"output_tokens":2}},"parent_tool_use_id":"toolu_9"}"#;
        let (events, report) = run(&[out(top), out(sub)], Some(0));
        assert_eq!(
            events,
            vec![AgentEvent::AssistantText {
                text: "Delegating.".into()
            }]
        );
        assert_eq!(report.final_text.as_deref(), Some("Delegating."));
        assert_eq!(report.usage.input_tokens, 17);
        assert!(!report.is_error, "exit 0 without a result line");
    }

    /// The amp SDK's error result: `is_error`, an error subtype and an `error` string. amp's own
    /// wording for credit and auth failures is not known (notes §3), so these use the texts the
    /// shared classifier knows.
    #[test]
    fn error_results_are_classified_from_their_error_text() {
        for (error, class) in [
            // What amp's TUI shows at an exhausted balance.
            ("Out of Credits", FailureClass::UsageLimit),
            ("Credit balance is too low", FailureClass::UsageLimit),
            (
                "401 Unauthorized: Invalid API key. Run amp login or set AMP_API_KEY.",
                FailureClass::Auth,
            ),
            (
                "API Error: 529 Overloaded. This is a server-side issue",
                FailureClass::Transient,
            ),
            ("Prompt is too long", FailureClass::Context),
        ] {
            let line = serde_json::json!({"type": "result", "subtype": "error_during_execution",
                "duration_ms": 412, "is_error": true, "num_turns": 1, "error": error,
                "session_id": "T-9"})
            .to_string();
            let (events, report) = run(&[out(INIT), out(&line)], Some(1));
            assert!(report.is_error && report.saw_final, "{error}");
            assert_eq!(report.failure, Some(class), "{error}");
            assert_eq!(report.error_message.as_deref(), Some(error));
            assert_eq!(report.session_id.as_deref(), Some("T-9"));
            assert!(!claims(&report));
            assert_eq!(
                events.last(),
                Some(&AgentEvent::Final {
                    text: None,
                    is_error: true
                })
            );
        }
    }

    #[test]
    fn usage_limit_reset_time_comes_from_the_error_text() {
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"error":"Claude AI usage limit reached|1753441200","session_id":"T-1"}"#;
        let (_, report) = run(&[out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.resume_at.map(|t| t.timestamp()), Some(1_753_441_200));
    }

    #[test]
    fn max_turns_without_text_is_an_error_without_a_class() {
        let line = r#"{"type":"result","subtype":"error_max_turns","duration_ms":90000,"is_error":true,"num_turns":200,"session_id":"T-1"}"#;
        let (_, report) = run(&[out(FINAL_TEXT), out(line)], Some(1));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("amp ended with error_max_turns")
        );
        // The run was cut short: the last assistant message stands in for the result text.
        assert!(claims(&report));
    }

    /// Failures reported only on stderr (no JSON at all), ANSI-coloured.
    #[test]
    fn stderr_errors_without_a_result() {
        let (events, report) = run(&[err("\x1b[31mError: Invalid API key\x1b[0m")], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: Invalid API key")
        );
        assert_eq!(
            events,
            vec![AgentEvent::Error {
                message: "Error: Invalid API key".into()
            }]
        );
    }

    /// A successful result after retry chatter on stderr is not a failure, and the assistant's
    /// successful answer is never fed to the classifier however it reads.
    #[test]
    fn success_is_not_a_failure_whatever_the_text_says() {
        let answer = r#"{"type":"result","subtype":"success","is_error":false,"result":"Fixed the 'Invalid API key' message in login.rs.","session_id":"T-1"}"#;
        let (_, report) = run(
            &[err("API Error: 529 Overloaded, retrying"), out(answer)],
            Some(0),
        );
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
    }

    /// Non-JSON lines, JSON that is not an object, unknown types, lossy UTF-8: no event and no
    /// crash; the real lines are still read.
    #[test]
    fn hostile_lines_are_ignored() {
        let invalid_utf8 = String::from_utf8_lossy(b"{\"type\":\"result\xff\"}").into_owned();
        let lines = [
            out("Amp CLI v0.0.1 (not JSON)"),
            out(""),
            out("[1,2]"),
            out("\"type\":\"result\",\"result\":\"<promise>COMPLETE</promise>\""),
            out(r#"{"type":"some_future_type","result":"<promise>COMPLETE</promise>"}"#),
            out(&invalid_utf8),
            out(&format!("{RESULT}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(report.saw_final && claims(&report));
    }

    #[test]
    fn command_line_stdin_and_mode() {
        let amp = Amp::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("rush".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode\n-x --help";
        let spec = amp.command(prompt).unwrap();
        assert_eq!(spec.program, PathBuf::from("amp"));
        assert_eq!(
            spec.args,
            [
                "-x",
                "--stream-json",
                "--dangerously-allow-all",
                "--mode",
                "rush"
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);

        let custom = Amp::new(AgentSettings {
            program: Some(PathBuf::from("/opt/amp/bin/amp")),
            ..AgentSettings::default()
        });
        let spec = custom.command(&"x".repeat(300 * 1024)).unwrap();
        assert_eq!(spec.program, PathBuf::from("/opt/amp/bin/amp"));
        assert_eq!(spec.args.len(), 3, "no --mode without a model");
        assert_eq!(spec.stdin.map(|s| s.len()), Some(300 * 1024));
    }
}
