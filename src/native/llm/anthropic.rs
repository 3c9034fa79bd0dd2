//! The Anthropic Messages client (`POST {base_url}/v1/messages`).
//!
//! It maps the provider-neutral [`ChatRequest`] onto the wire format described in
//! `shared/notes/agent-protocols.md` §9: the system prompt as the top-level `system`, assistant
//! tool calls as `tool_use` blocks, and consecutive tool results merged into one user message of
//! `tool_result` blocks (first, before any text). It streams over SSE (`message_start`,
//! `content_block_*`, `message_delta`, `message_stop`, and `error` events that can arrive after
//! HTTP 200), falls back to one non-streaming request when the server says it cannot stream, and
//! classifies failures through [`super::retry`].
//!
//! Two deliberate differences from the OpenAI client:
//! - [`super::ToolMode::Json`] is an OpenAI-only mode; here requests always use native tool use.
//! - The API refuses `tool_use`/`tool_result` blocks in a request that defines no tools, so a
//!   request with no tools (the final summary after the step limit) replays earlier calls and
//!   results as plain text blocks instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures_util::StreamExt as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

use super::retry::classify_stream_error;
use super::sse::{self, Answer};
use super::{ChatRequest, ChatResponse, LlmError, ProviderConfig, Role, StopReason};
use super::{Message, ToolCall};
use crate::protocol::Usage;

/// The API version header value this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A Messages client. Cheap to clone (clones share the connection pool and the "server cannot
/// stream" flag). `Debug` never shows the API key.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    config: ProviderConfig,
    http: reqwest::Client,
    url: String,
    /// Set once the server refused a streaming request: later requests don't stream.
    no_stream: Arc<AtomicBool>,
}

impl AnthropicClient {
    /// Builds a client for `config` (`kind` is not checked; `base_url` without `/v1`, e.g.
    /// `https://api.anthropic.com`).
    ///
    /// # Errors
    /// `BadRequest` (status 0) when `base_url` is not a URL or the HTTP client cannot be built.
    pub fn new(config: ProviderConfig) -> Result<Self, LlmError> {
        let http = sse::build_http(&config)?;
        let url = format!("{}/v1/messages", config.base_url.trim_end_matches('/'));
        Ok(AnthropicClient {
            config,
            http,
            url,
            no_stream: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Sends one request (no retries): streaming when the config asks for it and the server
    /// has not refused it before, else one JSON response.
    ///
    /// # Errors
    /// A classified [`LlmError`] (see [`super::retry`]); an `error` event inside the stream is
    /// classified like the HTTP status it stands for; a stream that ends before both
    /// `message_stop` and a `stop_reason` is `Transient` ("stream dropped"). The API key never
    /// appears in the error.
    pub async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.send(request)
            .await
            .map_err(|e| sse::redact(e, self.config.api_key.as_deref()))
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let response =
            sse::post_with_fallback(&self.no_stream, self.config.stream, &self.url, |stream| {
                self.post(request, stream)
            })
            .await?;
        read(response).await
    }

    async fn post(&self, request: &ChatRequest, stream: bool) -> Result<Answer, LlmError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(key) = self.config.api_key.as_deref().filter(|k| !k.is_empty()) {
            let mut value = HeaderValue::from_str(key).map_err(|_| LlmError::Auth {
                status: 0,
                message: "the API key holds characters that cannot go in an HTTP header; \
                          check the variable that holds it"
                    .into(),
            })?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), value);
        }
        sse::post(
            &self.http,
            &self.url,
            headers,
            &request_body(request, stream),
        )
        .await
    }
}

/// Reads a 2xx response, streaming or not.
async fn read(response: reqwest::Response) -> Result<ChatResponse, LlmError> {
    if sse::is_event_stream(&response) {
        read_stream(response).await
    } else {
        let body = sse::read_json(response).await?;
        parse_message(&body)
    }
}

/// The JSON body for `request`.
fn request_body(request: &ChatRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("max_tokens".into(), json!(request.max_tokens));
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    let tools_as_text = request.tools.is_empty();
    body.insert(
        "messages".into(),
        Value::Array(messages(&request.messages, tools_as_text)),
    );
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Value::Object(body)
}

/// The non-system messages as Messages API turns: consecutive user-side messages (user text
/// and tool results) merged into one user turn with its `tool_result` blocks first, and empty
/// text left out (the API rejects empty text blocks). With `tools_as_text`, calls and results
/// become text blocks.
fn messages(messages: &[Message], tools_as_text: bool) -> Vec<Value> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in messages {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => ("user", text_block(&m.content).into_iter().collect()),
            Role::Assistant => {
                let mut blocks: Vec<Value> = text_block(&m.content).into_iter().collect();
                for c in &m.tool_calls {
                    names.insert(&c.id, &c.name);
                    blocks.push(if tools_as_text {
                        json!({"type": "text", "text": format!("[tool call {} {}]", c.name, c.arguments)})
                    } else {
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": object_input(c)})
                    });
                }
                ("assistant", blocks)
            }
            Role::Tool => {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                let block = if tools_as_text {
                    let name = names.get(id).copied().unwrap_or("a tool");
                    let head = if m.is_error {
                        "error from"
                    } else {
                        "result of"
                    };
                    json!({"type": "text", "text": format!("[{head} {name}]\n{}", m.content)})
                } else {
                    json!({"type": "tool_result", "tool_use_id": id, "content": m.content,
                           "is_error": m.is_error})
                };
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // Tool results must open the user turn that answers the calls.
                blocks.sort_by_key(|b| b["type"] != "tool_result");
            }
            json!({"role": role, "content": blocks})
        })
        .collect()
}

/// A text block, or nothing for empty text.
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// A call's arguments as the object `input` must be.
fn object_input(call: &ToolCall) -> Value {
    if call.arguments.is_object() {
        call.arguments.clone()
    } else {
        json!({ "_raw": call.arguments.to_string() })
    }
}

/// Reads a non-streaming `message` body.
fn parse_message(body: &Value) -> Result<ChatResponse, LlmError> {
    if body.get("type").and_then(Value::as_str) == Some("error") {
        return Err(classify_stream_error(body));
    }
    let Some(blocks) = body.get("content").and_then(Value::as_array) else {
        return Err(LlmError::Decode {
            message: format!(
                "the response has no `content`: {}",
                super::retry::error_message(200, &body.to_string())
            ),
        });
    };
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                content.push_str(block.get("text").and_then(Value::as_str).unwrap_or(""))
            }
            Some("tool_use") => tool_calls.push(ToolCall {
                id: str_field(block, "id"),
                name: str_field(block, "name"),
                arguments: sse::parse_arguments(block.get("input").unwrap_or(&Value::Null)),
            }),
            _ => {}
        }
    }
    let mut usage = Usage::default();
    merge_usage(&mut usage, body.get("usage"));
    Ok(ChatResponse {
        stop: stop_reason(body.get("stop_reason").and_then(Value::as_str), &tool_calls),
        content,
        tool_calls,
        usage,
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// A content block being assembled from stream events.
#[derive(Debug)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        /// `input` from `content_block_start` (normally `{}`).
        start: Value,
        /// Concatenated `partial_json`.
        json: String,
    },
    /// Thinking and other blocks ralph does not use.
    Other,
}

/// Reads an SSE message stream to its end.
async fn read_stream(response: reqwest::Response) -> Result<ChatResponse, LlmError> {
    let mut events = sse::events(response);
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut model = None;
    let mut stop: Option<String> = None;
    let mut stopped = false;
    while let Some(event) = events.next().await {
        let event = event?;
        if event.data.trim().is_empty() {
            continue;
        }
        let data: Value = serde_json::from_str(&event.data).map_err(|e| LlmError::Decode {
            message: format!("a stream event is not JSON ({e}): {:.200}", event.data),
        })?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                let message = data.get("message").unwrap_or(&Value::Null);
                model = message
                    .get("model")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                merge_usage(&mut usage, message.get("usage"));
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let new = match block.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(str_field(block, "text")),
                    Some("tool_use") => Block::ToolUse {
                        id: str_field(block, "id"),
                        name: str_field(block, "name"),
                        start: block.get("input").cloned().unwrap_or(Value::Null),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                blocks.insert(index, new);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                match (
                    blocks.get_mut(&index),
                    delta.get("type").and_then(Value::as_str),
                ) {
                    (Some(Block::Text(text)), Some("text_delta")) => {
                        text.push_str(delta.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    (Some(Block::ToolUse { json, .. }), Some("input_json_delta")) => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    stop = Some(reason.to_string());
                }
                merge_usage(&mut usage, data.get("usage"));
            }
            "message_stop" => {
                stopped = true;
                break;
            }
            "error" => return Err(classify_stream_error(&data)),
            // `ping`, `content_block_stop` and event types added later carry nothing needed.
            _ => {}
        }
    }
    if !stopped && stop.is_none() {
        return Err(sse::stream_dropped("`message_stop`"));
    }
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks.into_values() {
        match block {
            Block::Text(text) => content.push_str(&text),
            Block::ToolUse {
                id,
                name,
                start,
                json,
            } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: if json.trim().is_empty() {
                    sse::parse_arguments(&start)
                } else {
                    sse::parse_argument_text(&json)
                },
            }),
            Block::Other => {}
        }
    }
    Ok(ChatResponse {
        stop: stop_reason(stop.as_deref(), &tool_calls),
        content,
        tool_calls,
        usage,
        model,
    })
}

/// Maps `stop_reason`; tool calls beside `end_turn` (or an unknown reason) still count as
/// tool calls.
fn stop_reason(reason: Option<&str>, calls: &[ToolCall]) -> StopReason {
    let stop = match reason {
        Some("tool_use") => StopReason::ToolCalls,
        Some("end_turn" | "stop_sequence") | None => StopReason::EndTurn,
        Some("max_tokens") => StopReason::Length,
        Some("refusal") => StopReason::Refusal,
        Some(other) => StopReason::Other(other.to_string()),
    };
    if !calls.is_empty() && matches!(stop, StopReason::EndTurn | StopReason::Other(_)) {
        StopReason::ToolCalls
    } else {
        stop
    }
}

/// Overwrites the counts `usage` (a Messages `usage` object) carries: `input_tokens`,
/// `output_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`.
fn merge_usage(into: &mut Usage, usage: Option<&Value>) {
    let Some(u) = usage else { return };
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(v) = n("input_tokens") {
        into.input_tokens = v;
    }
    if let Some(v) = n("output_tokens") {
        into.output_tokens = v;
    }
    if let Some(v) = n("cache_read_input_tokens") {
        into.cache_read_tokens = v;
    }
    if let Some(v) = n("cache_creation_input_tokens") {
        into.cache_creation_tokens = v;
    }
}

/// `v[key]` as a string, or "".
fn str_field(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::llm::ToolSpec;
    use crate::protocol::ToolMode;

    fn request(tools: bool) -> ChatRequest {
        let mut call = Message::text(Role::Assistant, "Reading.");
        for id in ["toolu_1", "toolu_2"] {
            call.tool_calls.push(ToolCall {
                id: id.into(),
                name: "read_file".into(),
                arguments: json!({"path": id}),
            });
        }
        ChatRequest {
            model: "claude".into(),
            messages: vec![
                Message::text(Role::System, "sys"),
                Message::text(Role::User, "do it"),
                call,
                Message::tool_result("toolu_1", "one", false),
                Message::tool_result("toolu_2", "missing", true),
                Message::text(Role::User, "now continue"),
            ],
            tools: if tools {
                vec![ToolSpec {
                    name: "read_file".into(),
                    description: "Read.".into(),
                    parameters: json!({"type": "object"}),
                }]
            } else {
                Vec::new()
            },
            max_tokens: 64,
            temperature: Some(0.0),
            seed: Some(1),
            tool_mode: ToolMode::Native,
            answer_schema: None,
        }
    }

    #[test]
    fn body_merges_tool_results_into_one_user_turn() {
        let body = request_body(&request(true), true);
        assert_eq!(body["system"], json!("sys"));
        assert_eq!(body["stream"], json!(true));
        assert!(body.get("seed").is_none());
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["content"][1]["type"], json!("tool_use"));
        assert_eq!(m[1]["content"][1]["input"], json!({"path": "toolu_1"}));
        let results = m[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(results[0]["tool_use_id"], json!("toolu_1"));
        assert_eq!(results[1]["is_error"], json!(true));
        assert_eq!(results[2], json!({"type": "text", "text": "now continue"}));
    }

    #[test]
    fn without_tools_calls_are_replayed_as_text() {
        let body = request_body(&request(false), false);
        assert!(body.get("tools").is_none());
        let text = body["messages"].to_string();
        assert!(
            !text.contains("tool_use") && !text.contains("tool_result"),
            "{text}"
        );
        assert!(text.contains("[tool call read_file"));
        assert!(text.contains("[error from read_file]\\nmissing"));
    }

    #[test]
    fn non_streaming_message_is_read() {
        let body = json!({"id":"msg_01","type":"message","role":"assistant","model":"claude-x",
            "content":[{"type":"text","text":"Running tests."},
                       {"type":"tool_use","id":"toolu_01","name":"run_shell","input":{"cmd":"cargo test"}}],
            "stop_reason":"tool_use",
            "usage":{"input_tokens":1834,"output_tokens":41,"cache_creation_input_tokens":3,"cache_read_input_tokens":7}});
        let r = parse_message(&body).unwrap();
        assert_eq!(r.content, "Running tests.");
        assert_eq!(r.stop, StopReason::ToolCalls);
        assert_eq!(r.tool_calls[0].arguments, json!({"cmd": "cargo test"}));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 1834,
                output_tokens: 41,
                cache_read_tokens: 7,
                cache_creation_tokens: 3
            }
        );
        for (reason, stop) in [
            ("max_tokens", StopReason::Length),
            ("refusal", StopReason::Refusal),
            ("stop_sequence", StopReason::EndTurn),
            ("pause_turn", StopReason::Other("pause_turn".into())),
        ] {
            assert_eq!(stop_reason(Some(reason), &[]), stop);
        }
    }
}
