//! Claude Code's stream-json shape, which amp (a Claude Code-compatible subset) and cursor-agent
//! also print: `system/init`, `assistant` and `user` messages, and a terminal `result`
//! (`notes/agent-protocols.md` §1, §3, §6). The handlers here are the shape's rules; each of the
//! three dialects calls them and adds only its own differences.
//!
//! Rules of the shape, each forced by real output:
//! - every line is parsed as JSON, never prefix-matched (in claude 2.1.332's `result` line
//!   `"type"` is not the first key); the session id is taken from any line, since hook events
//!   can precede `system/init`;
//! - success is `result.is_error`, never `subtype` (claude reports API failures as
//!   `subtype:"success", is_error:true`); only when a build omits `is_error` does the subtype
//!   stand in;
//! - the final text is `result.result`; without it, the text blocks of the last top-level
//!   assistant message, grouped by `message.id` (claude prints one line per content block);
//!   subagent traffic (`parent_tool_use_id` not null) and `user` lines (tool results, and the
//!   prompt amp and cursor echo) never count;
//! - an assistant message with an `error` field is a synthetic API error, reported as an error.

use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::claude_turn::Turn;
use crate::agent::stream::{json_object, tokens, StreamCore};
use crate::process::strip_ansi;
use crate::protocol::fields::{str_field, summarize_tool_input};
use crate::protocol::{AgentEvent, Usage};

/// `line` as a JSON object, with the session id taken from it when none is known yet (and
/// [`StreamCore::line_is_json`] set when nothing surrounds it).
pub fn read_line(line: &str, core: &mut StreamCore) -> Option<Value> {
    let v = json_object(line)?;
    core.line_is_json = line.trim().len() == line.len();
    if core.session_id.is_none() {
        core.session_id = str_field(&v, "session_id");
    }
    Some(v)
}

/// `line` as an `assistant` or `user` line read into borrowed structs
/// ([`crate::agent::claude_turn`]), with the session id taken from it when none is known yet;
/// `None` for every other line (and for an odd shape), which [`read_line`] then reads.
pub fn read_turn<'a>(line: &'a str, core: &mut StreamCore) -> Option<Turn<'a>> {
    let turn = crate::agent::claude_turn::read(line.trim())?;
    core.line_is_json = line.trim().len() == line.len();
    if core.session_id.is_none() {
        core.session_id = turn.session_id().map(str::to_owned);
    }
    Some(turn)
}

/// The line's `type`.
pub fn line_type(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// Whether a `system` line is `system/init`.
pub fn is_init(v: &Value) -> bool {
    v.get("subtype").and_then(Value::as_str) == Some("init")
}

/// `system/init`: the session, the model and, under `version_key` when the CLI names one
/// (claude's `claude_code_version`), its version.
pub fn on_init(v: &Value, core: &mut StreamCore, version_key: Option<&str>) -> Vec<AgentEvent> {
    if let Some(id) = str_field(v, "session_id") {
        core.session_id = Some(id);
    }
    core.model = str_field(v, "model").or(core.model.take());
    if let Some(key) = version_key {
        core.version = str_field(v, key).or(core.version.take());
    }
    vec![core.session_event()]
}

/// Whether the line belongs to a subagent (`parent_tool_use_id` set).
pub fn is_subagent(v: &Value) -> bool {
    !v.get("parent_tool_use_id").is_none_or(Value::is_null)
}

/// The text blocks of the last top-level assistant message, grouped by `message.id` (a line
/// without an id is a message of its own).
#[derive(Debug, Default)]
pub struct LastMessage {
    id: Option<String>,
    texts: Vec<String>,
}

impl LastMessage {
    /// Adds the text blocks of a message line with `id`.
    pub(crate) fn push(&mut self, id: Option<String>, texts: &[&str]) {
        if id.is_none() || id != self.id {
            self.id = id;
            self.texts.clear();
        }
        self.texts.extend(texts.iter().map(|t| (*t).to_owned()));
    }

    /// The message's text blocks joined with newlines, `None` when it had none.
    pub fn text(&self) -> Option<String> {
        (!self.texts.is_empty()).then(|| self.texts.join("\n"))
    }

    /// When the terminal event gave no text, the last message stands in for it.
    pub fn settle(&self, core: &mut StreamCore) {
        if core.final_text.is_none() {
            core.final_text = self.text();
        }
    }
}

/// An `assistant` line: one [`AgentEvent::AssistantText`] per text block and one
/// [`AgentEvent::ToolCall`] per `tool_use` block of a top-level message; an [`AgentEvent::Error`]
/// for a synthetic API-error message (`error` field), whose code and text go to the classifier.
pub fn on_assistant(v: &Value, core: &mut StreamCore, last: &mut LastMessage) -> Vec<AgentEvent> {
    if is_subagent(v) {
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
        core.classifier.observe(Signal::ErrorCode(code));
        let message = if texts.is_empty() {
            code.to_owned()
        } else {
            texts.join("\n")
        };
        core.classifier.observe(Signal::Text(&message));
        core.error_event = Some(message.clone());
        return vec![AgentEvent::Error {
            message: strip_ansi(&message),
        }];
    }

    if core.model.is_none() {
        core.model = str_field(message, "model").filter(|m| m != "<synthetic>");
    }
    last.push(str_field(message, "id"), &texts);

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

/// A `user` line: one [`AgentEvent::ToolResult`] per `tool_result` block of a top-level line.
/// An echoed prompt (a `user` line with `text` blocks) yields nothing.
pub fn on_user(v: &Value) -> Vec<AgentEvent> {
    if is_subagent(v) {
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
                    output: result_text(b)
                        .as_deref()
                        .and_then(super::stream::tool_output),
                    exit_code: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The text of a `tool_result` block: its `content` string, or its text blocks joined.
fn result_text(block: &Value) -> Option<String> {
    match block.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// The fields every CLI's `result` line has.
#[derive(Debug, Clone)]
pub struct ResultLine {
    /// `subtype` (`success`, `error_max_turns`, ...).
    pub subtype: Option<String>,
    /// `is_error`, or what the subtype says when a build omits it.
    pub is_error: bool,
    /// `result`: the final text.
    pub text: Option<String>,
    /// `errors[]`: what an error result without text (`error_during_execution`) says went
    /// wrong, each entry a string or an object with a `message`.
    pub errors: Vec<String>,
}

impl ResultLine {
    /// Reads a `result` line into `core` (terminal event, its verdict and text, the session id).
    /// `error_subtype` says whether a subtype means an error when `is_error` is missing.
    pub fn read(v: &Value, core: &mut StreamCore, error_subtype: fn(&str) -> bool) -> ResultLine {
        let subtype = str_field(v, "subtype");
        let is_error = v
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or_else(|| subtype.as_deref().is_some_and(error_subtype));
        let text = str_field(v, "result");
        let errors = v
            .get("errors")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(error_text)
                    .filter(|e| !e.trim().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(id) = str_field(v, "session_id") {
            core.session_id = Some(id);
        }
        core.saw_final = true;
        core.is_error = is_error;
        core.final_text = text.clone();
        ResultLine {
            subtype,
            is_error,
            text,
            errors,
        }
    }

    /// `errors[]` joined with `; `, when there is any.
    pub fn joined_errors(&self) -> Option<String> {
        (!self.errors.is_empty()).then(|| self.errors.join("; "))
    }

    /// The terminal [`AgentEvent::Final`].
    pub fn event(&self) -> AgentEvent {
        AgentEvent::Final {
            text: self.text.clone(),
            is_error: self.is_error,
        }
    }

    /// The result text when it is not blank.
    pub fn nonblank_text(&self) -> Option<String> {
        self.text.clone().filter(|t| !t.trim().is_empty())
    }

    /// `<cli> ended with <subtype>` (`fallback` when there is no subtype), for an error result
    /// that says nothing more.
    pub fn ended_with(&self, cli: &str, fallback: &str) -> String {
        format!(
            "{cli} ended with {}",
            self.subtype.as_deref().unwrap_or(fallback)
        )
    }
}

/// claude and amp: a subtype starting with `error` is an error.
pub fn error_prefix(subtype: &str) -> bool {
    subtype.starts_with("error")
}

/// Feeds `api_error_status` (the HTTP status of a failed API call) to the classifier.
pub fn observe_api_status(v: &Value, core: &mut StreamCore) {
    if let Some(status) = v.get("api_error_status").and_then(as_status) {
        core.classifier.observe(Signal::ApiStatus(status));
    }
}

/// A JSON number as an HTTP status.
pub fn as_status(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|n| u16::try_from(n).ok())
}

/// An error entry: a string, or an object with a `message`.
pub fn error_text(v: &Value) -> Option<String> {
    v.as_str()
        .map(str::to_owned)
        .or_else(|| str_field(v, "message"))
}

/// A `usage` object in the Anthropic spelling (`input_tokens`, `cache_read_input_tokens`, ...)
/// → [`Usage`] (tokens; missing counts are 0).
pub fn usage_of(u: &Value) -> Usage {
    Usage {
        input_tokens: tokens(u, "input_tokens"),
        output_tokens: tokens(u, "output_tokens"),
        cache_read_tokens: tokens(u, "cache_read_input_tokens"),
        cache_creation_tokens: tokens(u, "cache_creation_input_tokens"),
    }
}
