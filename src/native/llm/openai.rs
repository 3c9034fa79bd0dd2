//! The OpenAI-compatible Chat Completions client (`POST {base_url}/chat/completions`): OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp's server, LM Studio.
//!
//! It maps the provider-neutral [`ChatRequest`] onto the wire format described in
//! `shared/notes/agent-protocols.md` §8, streams over SSE (assembling text and the tool-call
//! fragments keyed by `index`), falls back to one non-streaming request when the server says it
//! cannot stream, and classifies failures through [`super::retry`].
//!
//! [`ToolMode::Json`] is for models without tool calling (`shared/notes/local-model.md`): no
//! `tools` are sent; instead `response_format: json_schema` forces one
//! `{"name": <tool>, "arguments": {…}}` object (or `final_answer`), the tools are described in
//! the system prompt, earlier calls and results are replayed as plain text (ending on tool
//! results, with a one-line nudge to move on: without it Qwen2.5-Coder-0.5B repeats its last
//! call), and the reply is turned back into one [`ToolCall`] with id `json-<n>`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures_util::StreamExt as _;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde_json::{json, Map, Value};

use super::retry::classify_stream_error;
use super::sse::{self, Answer, IdCounter};
use super::{
    ChatRequest, ChatResponse, LlmError, ProviderConfig, Role, StopReason, ToolCall, ToolSpec,
};
use crate::protocol::{ToolMode, Usage};

/// The tool name that ends a [`ToolMode::Json`] conversation: its `arguments.text` becomes the
/// response's content.
pub const FINAL_ANSWER: &str = "final_answer";

/// A Chat Completions client. Cheap to clone (clones share the connection pool, the
/// "server cannot stream" flag and the id counter). `Debug` never shows the API key.
#[derive(Debug, Clone)]
pub struct OpenaiClient {
    config: ProviderConfig,
    http: reqwest::Client,
    url: String,
    /// Set once the server refused a streaming request: later requests don't stream.
    no_stream: Arc<AtomicBool>,
    ids: IdCounter,
}

impl OpenaiClient {
    /// Builds a client for `config` (`kind` is not checked; `base_url` includes `/v1`).
    ///
    /// # Errors
    /// `BadRequest` (status 0) when `base_url` is not a URL or the HTTP client cannot be built.
    pub fn new(config: ProviderConfig) -> Result<Self, LlmError> {
        let http = sse::build_http(&config)?;
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Ok(OpenaiClient {
            config,
            http,
            url,
            no_stream: Arc::new(AtomicBool::new(false)),
            ids: IdCounter::default(),
        })
    }

    /// Sends one request (no retries): streaming when the config asks for it and the server
    /// has not refused it before, else one JSON response.
    ///
    /// # Errors
    /// A classified [`LlmError`] (see [`super::retry`]); a stream that ends before both
    /// `finish_reason` and `[DONE]` is `Transient` ("stream dropped"). The API key never
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
        self.read(response, request).await
    }

    async fn post(&self, request: &ChatRequest, stream: bool) -> Result<Answer, LlmError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = self.config.api_key.as_deref().filter(|k| !k.is_empty()) {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| LlmError::Auth {
                    status: 0,
                    message: "the API key holds characters that cannot go in an HTTP header; \
                              check the variable that holds it"
                        .into(),
                })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        sse::post(
            &self.http,
            &self.url,
            headers,
            &request_body(request, stream),
        )
        .await
    }

    async fn read(
        &self,
        response: reqwest::Response,
        request: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        let raw = if sse::is_event_stream(&response) {
            read_stream(response).await?
        } else {
            let body = sse::read_json(response).await?;
            parse_completion(&body)?
        };
        Ok(finish(raw, request, &self.ids))
    }
}

/// The JSON body for `request`.
fn request_body(request: &ChatRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    let messages = match request.tool_mode {
        _ if request.answer_schema.is_some() => native_messages(request),
        ToolMode::Native => native_messages(request),
        ToolMode::Json => json_mode_messages(request),
    };
    body.insert("messages".into(), Value::Array(messages));
    if let Some(schema) = &request.answer_schema {
        // Not strict: OpenAI's strict mode refuses `minItems`/`maxItems`, which llama.cpp's
        // grammar uses to keep a small model's lists short. ralph validates the answer anyway.
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {
                "name": "answer", "strict": false, "schema": schema}}),
        );
    }
    match request.tool_mode {
        _ if request.answer_schema.is_some() => {}
        ToolMode::Native if !request.tools.is_empty() => {
            let tools = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        ToolMode::Native => {}
        ToolMode::Json => {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {
                    "name": "action", "strict": true, "schema": action_schema(&request.tools)}}),
            );
        }
    }
    body.insert("max_tokens".into(), json!(request.max_tokens));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(seed) = request.seed {
        body.insert("seed".into(), json!(seed));
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

/// Messages in the native tool-calling shape.
fn native_messages(request: &ChatRequest) -> Vec<Value> {
    request
        .messages
        .iter()
        .map(|m| match m.role {
            Role::System => json!({"role": "system", "content": m.content}),
            Role::User => json!({"role": "user", "content": m.content}),
            Role::Assistant if m.tool_calls.is_empty() => {
                json!({"role": "assistant", "content": m.content})
            }
            Role::Assistant => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function", "function": {
                            "name": c.name, "arguments": sse::argument_text(&c.arguments)}})
                    })
                    .collect();
                // OpenAI wants `null`, not "", beside tool calls with no text.
                let content = if m.content.is_empty() {
                    Value::Null
                } else {
                    json!(m.content)
                };
                json!({"role": "assistant", "content": content, "tool_calls": calls})
            }
            Role::Tool => json!({
                "role": "tool",
                "tool_call_id": m.tool_call_id.as_deref().unwrap_or_default(),
                "content": tool_result_text(&m.content, m.is_error),
            }),
        })
        .collect()
}

/// A tool result's text; Chat Completions has no error flag, so a failure says so in words.
fn tool_result_text(content: &str, is_error: bool) -> String {
    if is_error
        && !content
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("error")
    {
        format!("Error: {content}")
    } else {
        content.to_string()
    }
}

/// Messages for [`ToolMode::Json`]: the tools are described in the system prompt (the server
/// gets no `tools`), each earlier call is replayed as the JSON object the model wrote, and each
/// tool result is a user message naming the tool. Consecutive user messages are merged, since
/// some chat templates insist that roles alternate.
fn json_mode_messages(request: &ChatRequest) -> Vec<Value> {
    let guide = json_mode_guide(&request.tools);
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let push = |out: &mut Vec<(&'static str, String)>, role: &'static str, text: String| match out
        .last_mut()
    {
        Some((last, prev)) if *last == role && role == "user" => {
            prev.push_str("\n\n");
            prev.push_str(&text);
        }
        _ => out.push((role, text)),
    };
    let mut guided = false;
    for m in &request.messages {
        match m.role {
            Role::System if !guided => {
                guided = true;
                push(&mut out, "system", format!("{}\n\n{guide}", m.content));
            }
            Role::System => push(&mut out, "system", m.content.clone()),
            Role::User => push(&mut out, "user", m.content.clone()),
            Role::Assistant => {
                let mut parts = Vec::new();
                if !m.content.is_empty() {
                    parts.push(m.content.clone());
                }
                for c in &m.tool_calls {
                    names.insert(&c.id, &c.name);
                    parts.push(json!({"name": c.name, "arguments": c.arguments}).to_string());
                }
                push(&mut out, "assistant", parts.join("\n"));
            }
            Role::Tool => {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                let name = names.get(id).copied().unwrap_or("the tool");
                let head = if m.is_error {
                    format!("Error from {name}:")
                } else {
                    format!("Result of {name}:")
                };
                push(&mut out, "user", format!("{head}\n{}", m.content));
            }
        }
    }
    if !guided {
        out.insert(0, ("system", guide));
    }
    if request
        .messages
        .last()
        .is_some_and(|m| m.role == Role::Tool)
    {
        // Small models tend to repeat the call they just made; a nudge after the results
        // makes them move on.
        push(
            &mut out,
            "user",
            format!(
                "What is the next action? Follow the steps of the system prompt in order; reply {FINAL_ANSWER} only when every step is done."
            ),
        );
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// The system-prompt section that tells a [`ToolMode::Json`] model what it may do.
fn json_mode_guide(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "Reply with exactly one JSON object and nothing else: \
         {\"name\": <tool name>, \"arguments\": {...}}. The tools:\n",
    );
    for t in tools {
        text.push_str(&format!(
            "- {}: {} Arguments (JSON Schema): {}\n",
            t.name, t.description, t.parameters
        ));
    }
    text.push_str(&format!(
        "- {FINAL_ANSWER}: when the task is done, {{\"name\": \"{FINAL_ANSWER}\", \
         \"arguments\": {{\"text\": \"<a short summary>\"}}}}.\n\
         Each tool result comes back as a user message. Do not repeat a call that already \
         succeeded: call the next tool, or {FINAL_ANSWER} when nothing is left to do.\n"
    ));
    text
}

/// The JSON Schema of one [`ToolMode::Json`] reply: `anyOf` one object per tool
/// (`{"name": const, "arguments": <its parameters>}`) plus `final_answer`. `anyOf` rather than
/// `oneOf` because llama.cpp's grammar compiler and OpenAI's strict mode both accept it.
fn action_schema(tools: &[ToolSpec]) -> Value {
    let one = |name: &str, arguments: &Value| {
        json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        })
    };
    let mut options: Vec<Value> = tools.iter().map(|t| one(&t.name, &t.parameters)).collect();
    options.push(one(
        FINAL_ANSWER,
        &json!({"type": "object", "properties": {"text": {"type": "string"}},
                "required": ["text"], "additionalProperties": false}),
    ));
    json!({ "anyOf": options })
}

/// One reply as read off the wire, before ids and stop reasons are settled.
#[derive(Debug, Default)]
struct Raw {
    content: String,
    refusal: String,
    /// `(id, name, arguments as sent)`; arguments are text or an object.
    calls: Vec<(Option<String>, String, Value)>,
    finish: Option<String>,
    usage: Usage,
    model: Option<String>,
}

/// Reads a non-streaming `chat.completion` body.
fn parse_completion(body: &Value) -> Result<Raw, LlmError> {
    let Some(choice) = body.get("choices").and_then(|c| c.get(0)) else {
        if body.get("error").is_some() {
            // Some gateways answer 200 with an error body.
            return Err(classify_stream_error(body));
        }
        return Err(LlmError::Decode {
            message: format!(
                "the response has no `choices`: {}",
                super::retry::error_message(200, &body.to_string())
            ),
        });
    };
    let message = choice.get("message").unwrap_or(&Value::Null);
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let f = c.get("function").unwrap_or(&Value::Null);
                    (
                        c.get("id").and_then(Value::as_str).map(str::to_string),
                        str_field(f, "name"),
                        f.get("arguments").cloned().unwrap_or(Value::Null),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Raw {
        content: content_text(message.get("content")),
        refusal: str_field(message, "refusal"),
        calls,
        finish: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
        usage: usage(body.get("usage")),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// A tool call being assembled from stream fragments.
#[derive(Debug, Default)]
struct Partial {
    id: Option<String>,
    name: String,
    args: String,
    /// Arguments some servers send as one object instead of text fragments.
    args_object: Option<Value>,
}

/// Reads an SSE `chat.completion.chunk` stream to its end.
async fn read_stream(response: reqwest::Response) -> Result<Raw, LlmError> {
    let mut events = sse::events(response);
    let mut raw = Raw::default();
    let mut calls: BTreeMap<u64, Partial> = BTreeMap::new();
    let mut done = false;
    while let Some(event) = events.next().await {
        let event = event?;
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| LlmError::Decode {
            message: format!("a stream chunk is not JSON ({e}): {data:.200}"),
        })?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(classify_stream_error(&chunk));
        }
        apply_chunk(&chunk, &mut raw, &mut calls);
    }
    if !done && raw.finish.is_none() {
        return Err(sse::stream_dropped("`finish_reason` or `[DONE]`"));
    }
    raw.calls = calls
        .into_values()
        .map(|p| {
            let args = p.args_object.unwrap_or(Value::String(p.args));
            (p.id, p.name, args)
        })
        .collect();
    Ok(raw)
}

/// Folds one stream chunk into the reply being assembled.
fn apply_chunk(chunk: &Value, raw: &mut Raw, calls: &mut BTreeMap<u64, Partial>) {
    if let Some(model) = chunk.get("model").and_then(Value::as_str) {
        raw.model = Some(model.to_string());
    }
    if chunk.get("usage").is_some_and(|u| !u.is_null()) {
        raw.usage = usage(chunk.get("usage"));
    }
    let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
        return;
    };
    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
        raw.finish = Some(reason.to_string());
    }
    let Some(delta) = choice.get("delta") else {
        return;
    };
    raw.content.push_str(&content_text(delta.get("content")));
    raw.refusal.push_str(&str_field(delta, "refusal"));
    let Some(fragments) = delta.get("tool_calls").and_then(Value::as_array) else {
        return;
    };
    for fragment in fragments {
        let id = fragment
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        // `index` keys the fragments; servers that leave it out send whole calls, each with
        // its own id.
        let index = fragment
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| {
                let last = calls.keys().next_back().copied();
                match (id, last) {
                    (Some(id), Some(last)) if calls[&last].id.as_deref() == Some(id) => last,
                    (_, Some(last)) if id.is_none() => last,
                    (_, Some(last)) => last + 1,
                    (_, None) => 0,
                }
            });
        let partial = calls.entry(index).or_default();
        if let Some(id) = id {
            partial.id = Some(id.to_string());
        }
        let f = fragment.get("function").unwrap_or(&Value::Null);
        let name = str_field(f, "name");
        if partial.name.is_empty() {
            partial.name = name;
        } else if !name.is_empty() && name != partial.name {
            partial.name.push_str(&name);
        }
        match f.get("arguments") {
            Some(Value::String(piece)) => partial.args.push_str(piece),
            Some(v @ Value::Object(_)) => partial.args_object = Some(v.clone()),
            _ => {}
        }
    }
}

/// Settles ids, arguments, the stop reason and (in JSON mode) the action of one reply.
fn finish(raw: Raw, request: &ChatRequest, ids: &IdCounter) -> ChatResponse {
    let mut tool_calls: Vec<ToolCall> = raw
        .calls
        .into_iter()
        .filter(|(_, name, _)| !name.is_empty())
        .map(|(id, name, args)| ToolCall {
            id: id
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| format!("call-{}", ids.next())),
            name,
            arguments: sse::parse_arguments(&args),
        })
        .collect();
    let mut content = raw.content;
    let mut stop = match raw.finish.as_deref() {
        Some("tool_calls" | "function_call") => StopReason::ToolCalls,
        Some("stop" | "eos" | "end_turn") | None => StopReason::EndTurn,
        Some("length") => StopReason::Length,
        Some("content_filter") => StopReason::ContentFilter,
        Some(other) => StopReason::Other(other.to_string()),
    };
    if request.tool_mode == ToolMode::Json
        && request.answer_schema.is_none()
        && tool_calls.is_empty()
        && stop != StopReason::Length
    {
        match json_action(&content, ids) {
            Some(Action::Call(call)) => {
                tool_calls.push(call);
                content.clear();
                stop = StopReason::ToolCalls;
            }
            Some(Action::Final(text)) => {
                content = text;
                stop = StopReason::EndTurn;
            }
            None => {}
        }
    }
    // What counts is the presence of tool calls: compatible servers also say `stop`, `eos` or
    // nothing beside them.
    if !tool_calls.is_empty() && matches!(stop, StopReason::EndTurn | StopReason::Other(_)) {
        stop = StopReason::ToolCalls;
    }
    if !raw.refusal.trim().is_empty() {
        stop = StopReason::Refusal;
        if content.trim().is_empty() {
            content = raw.refusal;
        } else {
            content = format!("{content}\n{}", raw.refusal);
        }
    }
    ChatResponse {
        content,
        tool_calls,
        stop,
        usage: raw.usage,
        model: raw.model,
    }
}

/// A [`ToolMode::Json`] reply, understood.
enum Action {
    Call(ToolCall),
    Final(String),
}

/// Reads a JSON-mode reply (`{"name", "arguments"}`, `"parameters"` accepted too, an optional
/// code fence around it). `None` when it is not such an object: the content is then left as
/// text for the loop's text fallback.
fn json_action(content: &str, ids: &IdCounter) -> Option<Action> {
    let mut text = content.trim();
    if let Some(rest) = text.strip_prefix("```") {
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
        text = rest.trim().strip_suffix("```").unwrap_or(rest).trim();
    }
    let value: Value = serde_json::from_str(text).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let args = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .map(sse::parse_arguments)
        .unwrap_or_else(|| json!({}));
    if name == FINAL_ANSWER {
        let text = args
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| args.to_string());
        return Some(Action::Final(text));
    }
    Some(Action::Call(ToolCall {
        id: format!("json-{}", ids.next()),
        name,
        arguments: args,
    }))
}

/// Message content as text: a string, `null`, or an array of `{"type":"text","text"}` parts.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// `v[key]` as a string, or "".
fn str_field(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Usage in tokens; `prompt_tokens` includes the cached part, which is split out.
fn usage(v: Option<&Value>) -> Usage {
    let Some(v) = v.filter(|v| v.is_object()) else {
        return Usage::default();
    };
    let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n(v, "prompt_tokens");
    let cached = v
        .get("prompt_tokens_details")
        .map(|d| n(d, "cached_tokens"))
        .unwrap_or(0)
        .min(prompt);
    Usage {
        input_tokens: prompt - cached,
        output_tokens: n(v, "completion_tokens"),
        cache_read_tokens: cached,
        cache_creation_tokens: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::llm::Message;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} things."),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}},
                               "required": ["path"]}),
        }
    }

    fn request(mode: ToolMode) -> ChatRequest {
        let mut call = Message::text(Role::Assistant, "");
        call.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "a.txt"}),
        });
        ChatRequest {
            model: "m".into(),
            messages: vec![
                Message::text(Role::System, "sys"),
                Message::text(Role::User, "do it"),
                call,
                Message::tool_result("call_1", "no such file", true),
                Message::text(Role::User, "try again"),
            ],
            tools: vec![spec("read_file")],
            max_tokens: 100,
            temperature: Some(0.0),
            seed: Some(7),
            tool_mode: mode,
            answer_schema: None,
        }
    }

    #[test]
    fn native_body_maps_calls_results_and_options() {
        let body = request_body(&request(ToolMode::Native), true);
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["seed"], json!(7));
        assert_eq!(body["max_tokens"], json!(100));
        assert_eq!(body["tools"][0]["function"]["name"], json!("read_file"));
        let m = &body["messages"];
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            json!("{\"path\":\"a.txt\"}")
        );
        assert_eq!(m[3]["role"], json!("tool"));
        assert_eq!(m[3]["tool_call_id"], json!("call_1"));
        assert_eq!(m[3]["content"], json!("Error: no such file"));
        let mut no_tools = request(ToolMode::Native);
        no_tools.tools.clear();
        let body = request_body(&no_tools, false);
        assert!(body.get("tools").is_none());
        assert!(body.get("stream").is_none());
    }

    #[test]
    fn json_mode_body_has_a_schema_and_text_history() {
        let body = request_body(&request(ToolMode::Json), false);
        assert!(body.get("tools").is_none());
        let format = &body["response_format"];
        assert_eq!(format["type"], json!("json_schema"));
        assert_eq!(format["json_schema"]["strict"], json!(true));
        let options = format["json_schema"]["schema"]["anyOf"].as_array().unwrap();
        assert_eq!(options.len(), 2);
        assert_eq!(
            options[0]["properties"]["name"]["const"],
            json!("read_file")
        );
        assert_eq!(
            options[1]["properties"]["name"]["const"],
            json!(FINAL_ANSWER)
        );
        let m = body["messages"].as_array().unwrap();
        assert!(m[0]["content"]
            .as_str()
            .unwrap()
            .contains("- read_file: read_file things."));
        assert_eq!(
            m[2]["content"],
            json!(r#"{"name":"read_file","arguments":{"path":"a.txt"}}"#)
        );
        // The tool result and the following user message are merged into one user turn.
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[3]["content"],
            json!("Error from read_file:\nno such file\n\ntry again")
        );
        // A conversation that ends on tool results gets a nudge to move on.
        let mut ends_on_result = request(ToolMode::Json);
        ends_on_result.messages.pop();
        let body = request_body(&ends_on_result, false);
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        assert!(
            last["content"].as_str().unwrap().ends_with(
                "What is the next action? Follow the steps of the system prompt in order; \
                 reply final_answer only when every step is done."
            ),
            "{last}"
        );
    }

    #[test]
    fn json_mode_replies_become_calls_or_final_text() {
        let ids = IdCounter::default();
        let req = request(ToolMode::Json);
        let raw = Raw {
            content: r#"{"name": "read_file", "arguments": {"path": "b"}}"#.into(),
            finish: Some("stop".into()),
            ..Raw::default()
        };
        let r = finish(raw, &req, &ids);
        assert_eq!(r.stop, StopReason::ToolCalls);
        assert_eq!(r.tool_calls[0].id, "json-1");
        assert_eq!(r.tool_calls[0].arguments, json!({"path": "b"}));
        assert_eq!(r.content, "");
        let raw = Raw {
            content:
                "```json\n{\"name\": \"final_answer\", \"arguments\": {\"text\": \"done\"}}\n```"
                    .into(),
            finish: Some("stop".into()),
            ..Raw::default()
        };
        let r = finish(raw, &req, &ids);
        assert_eq!((r.content.as_str(), r.stop), ("done", StopReason::EndTurn));
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn stream_fragments_assemble_by_index() {
        let chunks = [
            json!({"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"run","arguments":""}}]},"finish_reason":null}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_B","function":{"name":"read","arguments":"{\"p"}}]},"finish_reason":null}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":\"ls\"}"}}]},"finish_reason":null}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\":1}"}}]},"finish_reason":null}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}),
        ];
        let mut raw = Raw::default();
        let mut calls = BTreeMap::new();
        for c in &chunks {
            apply_chunk(c, &mut raw, &mut calls);
        }
        raw.calls = calls
            .into_values()
            .map(|p| (p.id, p.name, Value::String(p.args)))
            .collect();
        let r = finish(raw, &request(ToolMode::Native), &IdCounter::default());
        assert_eq!(r.stop, StopReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (r.tool_calls[0].id.as_str(), r.tool_calls[0].name.as_str()),
            ("call_A", "run")
        );
        assert_eq!(r.tool_calls[0].arguments, json!({"cmd": "ls"}));
        assert_eq!(r.tool_calls[1].arguments, json!({"p": 1}));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 6,
                output_tokens: 5,
                cache_read_tokens: 4,
                cache_creation_tokens: 0
            }
        );
        assert_eq!(r.model.as_deref(), Some("m1"));
    }

    #[test]
    fn finish_reasons_refusals_and_bad_arguments() {
        let req = request(ToolMode::Native);
        let ids = IdCounter::default();
        let stop = |finish: &str| {
            let raw = Raw {
                finish: Some(finish.into()),
                ..Raw::default()
            };
            finish_reason_of(raw, &req, &ids)
        };
        assert_eq!(stop("length"), StopReason::Length);
        assert_eq!(stop("content_filter"), StopReason::ContentFilter);
        assert_eq!(stop("weird"), StopReason::Other("weird".into()));
        let raw = Raw {
            refusal: "I can't help with that.".into(),
            finish: Some("stop".into()),
            ..Raw::default()
        };
        let r = finish(raw, &req, &ids);
        assert_eq!(r.stop, StopReason::Refusal);
        assert_eq!(r.content, "I can't help with that.");
        // `stop` beside tool calls still means tool calls; broken arguments are kept raw and
        // a missing id is made up.
        let raw = Raw {
            calls: vec![(None, "run".into(), json!("{\"cmd\": "))],
            finish: Some("stop".into()),
            ..Raw::default()
        };
        let r = finish(raw, &req, &ids);
        assert_eq!(r.stop, StopReason::ToolCalls);
        assert_eq!(r.tool_calls[0].arguments, json!({"_raw": "{\"cmd\": "}));
        assert!(r.tool_calls[0].id.starts_with("call-"));
    }

    fn finish_reason_of(raw: Raw, req: &ChatRequest, ids: &IdCounter) -> StopReason {
        finish(raw, req, ids).stop
    }

    #[test]
    fn non_streaming_body_is_read() {
        let body = json!({"model":"gpt","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_Ab12","type":"function","function":{"name":"run_shell","arguments":"{\"cmd\":\"cargo test\"}"}}]}}],"usage":{"prompt_tokens":1834,"completion_tokens":27}});
        let raw = parse_completion(&body).unwrap();
        let r = finish(raw, &request(ToolMode::Native), &IdCounter::default());
        assert_eq!(r.tool_calls[0].id, "call_Ab12");
        assert_eq!(r.tool_calls[0].arguments, json!({"cmd": "cargo test"}));
        assert_eq!(r.usage.input_tokens, 1834);
        let err =
            parse_completion(&json!({"error": {"message": "Overloaded", "type": "server_error"}}));
        assert!(matches!(err, Err(LlmError::Transient { .. })));
    }
}
