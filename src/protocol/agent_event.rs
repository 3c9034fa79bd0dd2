//! What a backend reads out of an agent's output: a stream of normalized [`AgentEvent`]s while
//! it runs, and one [`AgentReport`] when it ends. The native loop writes the same events, so
//! the outer loop reads every backend alike.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::usage::Usage;

/// Failure classes an agent's output can be sorted into .
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Bad or expired credentials: stop the run, a human must log in.
    Auth,
    /// A deterministic setup problem (root without IS_SANDBOX, nested session, bad flag).
    Config,
    /// A subscription or API usage limit.
    UsageLimit,
    /// Overload, 5xx, network trouble: worth retrying later.
    Transient,
    /// The prompt or context was too long.
    Context,
}

/// A normalized event parsed from an agent's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The agent announced its session (claude `system/init`).
    Session {
        /// Session id, when given.
        session_id: Option<String>,
        /// Model name, when given.
        model: Option<String>,
        /// Agent version, when given.
        version: Option<String>,
    },
    /// Text written by the assistant (top-level turns only).
    AssistantText {
        /// The text.
        text: String,
    },
    /// A tool call the agent made.
    ToolCall {
        /// Tool name, e.g. `Bash`.
        name: String,
        /// A one-line summary of the input (command, path), at most ~200 chars.
        summary: String,
    },
    /// A tool result.
    ToolResult {
        /// Whether the tool reported an error.
        is_error: bool,
        /// What the tool returned, when the agent's stream carries it: at most
        /// [`crate::protocol::fields::TOOL_OUTPUT_KEEP_BYTES`] bytes (head and tail, the size of
        /// what was left out noted), values of secret-looking environment variables redacted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// A shell command's exit code, when the stream gives it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// An error the agent reported.
    Error {
        /// The message, ANSI stripped.
        message: String,
    },
    /// The terminal event: the agent's run is over.
    Final {
        /// The final text (claude `result.result`), when present.
        text: Option<String>,
        /// Whether the agent ended in error (claude `is_error`).
        is_error: bool,
    },
}

impl AgentEvent {
    /// A tool result with only its error flag (the stream says nothing more).
    pub fn tool_result(is_error: bool) -> AgentEvent {
        AgentEvent::ToolResult {
            is_error,
            output: None,
            exit_code: None,
        }
    }
}

/// What a parser concluded once the process ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentReport {
    /// The final assistant text: where the completion promise is looked for.
    pub final_text: Option<String>,
    /// Whether a terminal event was seen.
    pub saw_final: bool,
    /// Whether the agent reported an error (claude: `is_error`).
    pub is_error: bool,
    /// The agent's error message, when it gave one.
    pub error_message: Option<String>,
    /// The failure class, when the output matched one.
    pub failure: Option<FailureClass>,
    /// Cost reported by the agent, in USD.
    pub cost_usd: Option<f64>,
    /// Token usage reported by the agent.
    pub usage: Usage,
    /// The agent's session id.
    pub session_id: Option<String>,
    /// The model the agent reported.
    pub model: Option<String>,
    /// The agent's version, when it reported one.
    pub agent_version: Option<String>,
    /// For a usage limit: when the agent said it resets (UTC), if it said so.
    pub resume_at: Option<chrono::DateTime<chrono::Utc>>,
}
