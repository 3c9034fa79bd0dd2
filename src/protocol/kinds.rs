//! The closed sets a user picks on the command line or in ralph.toml. Each derives clap's
//! `ValueEnum` (for flags and `RALPH_*` variables) and serde (for ralph.toml and the files
//! ralph writes), with the same lowercase names in both.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Which agent backend drives each iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// Claude Code (`claude -p --output-format stream-json`).
    Claude,
    /// OpenAI Codex CLI (`codex exec --json`).
    Codex,
    /// Sourcegraph Amp (`amp -x --stream-json`).
    Amp,
    /// OpenCode (`opencode run --format json`).
    Opencode,
    /// Google Gemini CLI (`gemini --output-format stream-json`).
    Gemini,
    /// Cursor CLI (`cursor-agent -p --output-format stream-json`).
    Cursor,
    /// Any command: the prompt on stdin, plain-text output.
    Exec,
    /// ralph's own tool loop over an LLM HTTP API (OpenAI-compatible or Anthropic).
    Native,
    /// ralph's own tool loop against a small local model it serves on 127.0.0.1 (no account).
    Local,
}

impl AgentKind {
    /// The name used in the ledger, the terminal and `ralph.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Claude => "claude",
            AgentKind::Codex => "codex",
            AgentKind::Amp => "amp",
            AgentKind::Opencode => "opencode",
            AgentKind::Gemini => "gemini",
            AgentKind::Cursor => "cursor",
            AgentKind::Exec => "exec",
            AgentKind::Native => "native",
            AgentKind::Local => "local",
        }
    }
}

/// How tool calls are requested from the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// The API's own tool calling (`tools` + `tool_calls` / `tool_use`), with calls written as
    /// JSON in the text accepted as a fallback.
    #[default]
    Native,
    /// OpenAI only: `response_format: json_schema` forcing `{"name": <tool>, "arguments": {…}}`
    /// (or a final answer), which ralph turns into a tool call. For models without tool calling.
    Json,
}

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions (`POST {base}/chat/completions`).
    Openai,
    /// Anthropic Messages (`POST {base}/v1/messages`).
    Anthropic,
}

/// Which runs `--max-cost` counts (`--budget-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BudgetScope {
    /// Every recorded iteration of the feature (prd.json's `branchName`), over all its runs: a
    /// schedule that resumes the run again and again cannot spend past the limit.
    #[default]
    Feature,
    /// This run only (each `ralph run` starts at $0).
    Run,
}

/// What ralph does when an iteration changes prd.json beyond the current story's `passes` and
/// `notes` (stories added, removed or edited; `passes` flipped on another story; top-level
/// fields changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrdGuard {
    /// Record the change in the ledger, show it and tell the next prompt; keep it.
    #[default]
    Report,
    /// The same, and put prd.json back as it was, except the current story's passes/notes.
    Restore,
}

/// How far ralph confines the agent and the verify commands (`--sandbox`, `sandbox` in
/// ralph.toml), built with bubblewrap (`bwrap`). Recorded per iteration in the ledger.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Serialize,
    Deserialize,
    ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// No sandbox: the agent runs as the user, with the user's files and network.
    #[default]
    Off,
    /// The system read-only, the worktree read-write, ralph's books read-only, `$HOME` hidden
    /// but for the backend's own state, a private `/tmp` and PID namespace.
    Fs,
    /// `fs`, and the network limited to the backend's API hosts and `--allow-host` through an
    /// egress proxy owned by ralph.
    Strict,
}

impl SandboxMode {
    /// The name used on the command line, in ralph.toml and in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Off => "off",
            SandboxMode::Fs => "fs",
            SandboxMode::Strict => "strict",
        }
    }

    /// Whether a sandbox is asked for (`fs` or `strict`).
    pub fn is_on(self) -> bool {
        self != SandboxMode::Off
    }
}
