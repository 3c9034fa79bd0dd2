//! Provider-neutral chat types and the HTTP clients for the two wire formats the native loop
//! speaks: OpenAI-compatible Chat Completions ([`openai`]) and Anthropic Messages
//! ([`anthropic`]). The loop in [`crate::native`] only sees these types.
//!
//! CONTRACT (the bodies live in the submodules):
//! - [`Provider::complete`] sends one request, streaming over SSE when `stream` is on (assembling
//!   text and tool-call deltas) and falling back to a non-streaming request when the server
//!   refuses streaming; it returns one [`ChatResponse`] or a classified [`LlmError`];
//! - [`complete_with_retry`] retries [`LlmError::is_retryable`] errors with capped exponential
//!   backoff that honours `retry-after` / `retry-after-ms`, and never retries auth, quota,
//!   context-length or other 4xx errors;
//! - dropping the future (cancellation) aborts the HTTP request at once;
//! - the API key is sent in a header and never appears in `Debug`, errors or logs.

use std::time::Duration;

use crate::protocol::{ProviderKind, ToolMode, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod anthropic;
pub mod openai;
pub mod retry;
mod sse;

pub use retry::{complete_with_retry, RetryPolicy};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The user (ralph's prompt, continuation requests, warnings).
    User,
    /// The model.
    Assistant,
    /// A tool result, answering one tool call by id.
    Tool,
}

/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's call id (OpenAI `call_…`, Anthropic `toolu_…`), or one ralph made up for
    /// calls parsed from text.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as a JSON object.
    pub arguments: Value,
}

/// One conversation message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Text content (may be empty for an assistant message with only tool calls).
    pub content: String,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a tool result: whether the tool failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl Message {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
        }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>, is_error: bool) -> Message {
        Message {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.to_string()),
            is_error,
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name (`read_file`).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatRequest {
    /// Model name sent to the API.
    pub model: String,
    /// The conversation, system prompt first.
    pub messages: Vec<Message>,
    /// Tools offered; empty means none (e.g. the final summary after the step limit).
    pub tools: Vec<ToolSpec>,
    /// Output token limit.
    pub max_tokens: u32,
    /// Sampling temperature; `None` leaves the server's default.
    pub temperature: Option<f32>,
    /// Sampling seed, for reproducible local runs.
    pub seed: Option<u64>,
    /// How tools are requested.
    pub tool_mode: ToolMode,
    /// A JSON Schema the whole reply must follow (an answer session: no tools). OpenAI-compatible
    /// servers get it as `response_format: json_schema` (llama.cpp enforces it with a grammar);
    /// the Messages API has no such field, so there the prompt must describe the format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_schema: Option<serde_json::Value>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It asked for tools (`tool_calls` / `tool_use`).
    ToolCalls,
    /// It finished its answer (`stop` / `end_turn`).
    EndTurn,
    /// It hit the output limit (`length` / `max_tokens`).
    Length,
    /// The provider filtered the content (`content_filter`).
    ContentFilter,
    /// The model refused (`refusal`).
    Refusal,
    /// Anything else, verbatim.
    Other(String),
}

/// One response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatResponse {
    /// The text the model wrote.
    pub content: String,
    /// Tool calls it made (from the API's structured field, or from JSON mode).
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Token usage, when reported.
    pub usage: Usage,
    /// The model name the server reported.
    pub model: Option<String>,
}

/// How to reach a provider.
#[derive(Clone)]
pub struct ProviderConfig {
    /// Wire format.
    pub kind: ProviderKind,
    /// Base URL: for openai including `/v1` (e.g. `https://api.openai.com/v1`,
    /// `http://127.0.0.1:8080/v1`); for anthropic without it (`https://api.anthropic.com`).
    pub base_url: String,
    /// The API key (never logged), when one is needed.
    pub api_key: Option<String>,
    /// Stream responses over SSE.
    pub stream: bool,
    /// Per-request timeout (whole response).
    pub request_timeout: Duration,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("stream", &self.stream)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A classified request failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// 401/403 or an invalid key: never retried.
    #[error("authentication failed (HTTP {status}): {message}")]
    Auth {
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Quota or billing exhausted (`insufficient_quota`, credit balance): never retried.
    #[error("quota or billing limit reached: {message}")]
    Quota {
        /// The provider's message.
        message: String,
    },
    /// The prompt is too long for the model's context: never retried.
    #[error("the context is too long for the model: {message}")]
    ContextLength {
        /// The provider's message.
        message: String,
    },
    /// Any other 4xx: never retried.
    #[error("request rejected (HTTP {status}): {message}")]
    BadRequest {
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// 408, 409, 429, 5xx, 529, a dropped connection or stream: retried.
    #[error("temporary failure{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Transient {
        /// HTTP status, when there was a response.
        status: Option<u16>,
        /// What happened.
        message: String,
        /// The server's `retry-after` / `retry-after-ms`, when given.
        retry_after: Option<Duration>,
    },
    /// The response could not be understood.
    #[error("could not read the response: {message}")]
    Decode {
        /// What was wrong.
        message: String,
    },
}

impl LlmError {
    /// Whether [`complete_with_retry`] may try again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, LlmError::Transient { .. })
    }
}

/// A provider client.
#[derive(Debug, Clone)]
pub enum Provider {
    /// Chat Completions.
    Openai(openai::OpenaiClient),
    /// Messages.
    Anthropic(anthropic::AnthropicClient),
}

impl Provider {
    /// Builds the client for `config`.
    ///
    /// # Errors
    /// A client that cannot be built (TLS setup).
    pub fn new(config: ProviderConfig) -> Result<Provider, LlmError> {
        Ok(match config.kind {
            ProviderKind::Openai => Provider::Openai(openai::OpenaiClient::new(config)?),
            ProviderKind::Anthropic => {
                Provider::Anthropic(anthropic::AnthropicClient::new(config)?)
            }
        })
    }

    /// Sends one request (no retries).
    ///
    /// # Errors
    /// A classified [`LlmError`].
    pub async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        match self {
            Provider::Openai(c) => c.complete(request).await,
            Provider::Anthropic(c) => c.complete(request).await,
        }
    }
}
