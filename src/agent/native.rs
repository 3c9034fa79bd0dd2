//! The `native` and `local` backends: ralph's own tool loop ([`crate::native`]) run as a child
//! process, `ralph __native-agent`, so that it gets exactly the supervision every agent CLI gets
//! (its own process group, timeouts, Ctrl-C, transcripts) and a kill stops the HTTP request and
//! any running tool at once.
//!
//! The child reads the prompt on stdin and its settings from [`SETTINGS_VAR`] (JSON, without the
//! API key: the key stays in the environment variable the user named). It prints one JSON object
//! per line on stdout, ralph's own "native" dialect:
//! - `{"type":"event","event":<AgentEvent>}` for assistant text, tool calls, tool results, errors;
//! - `{"type":"result", "final_text", "end", "usage", "steps", "requests", "model", "cost_usd"}`
//!   once, at the end.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::registry::{no_traps, BackendInfo, PromptVia, SandboxNeeds};
use crate::agent::{AgentSettings, Backend, OutputParser};

use crate::protocol::AgentEvent;

use crate::protocol::AgentReport;

use crate::protocol::FailureClass;

use crate::process::{OutputLine, SpawnSpec, StreamKind};
use crate::protocol::AgentKind;
use crate::protocol::ProviderKind;
use crate::protocol::Usage;
use crate::protocol::{Price, ToolMode};

/// Environment variable carrying [`NativeSettings`] as JSON to the child.
pub const SETTINGS_VAR: &str = "RALPH_NATIVE_SETTINGS";
/// The hidden subcommand that runs the loop.
pub const SUBCOMMAND: &str = "__native-agent";

/// Everything the child needs, resolved by the parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeSettings {
    /// Wire format.
    pub provider: ProviderKind,
    /// Base URL (see [`crate::native::llm::ProviderConfig::base_url`]).
    pub base_url: String,
    /// Name of the environment variable holding the API key (`None`: no key, e.g. a local server).
    pub api_key_env: Option<String>,
    /// Model name sent to the API.
    pub model: String,
    /// Tool-using steps per session.
    pub max_steps: u32,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// The model's context window, in tokens.
    pub context_window: u32,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// How tool calls are requested.
    pub tool_mode: ToolMode,
    /// Stream responses.
    pub stream: bool,
    /// Timeout of one `run_command` tool call, in seconds.
    pub command_timeout_s: u64,
    /// Repository root.
    pub repo_root: PathBuf,
    /// prd.json.
    pub prd_path: PathBuf,
    /// progress.txt.
    pub progress_path: PathBuf,
    /// The model's price, when configured.
    pub price: Option<Price>,
    /// Tools offered by name (`None`: all).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// The `local` backend's protocol around `mark_story`: it runs the story's check (its
    /// `verify`, else [`NativeSettings::verify`]) before it records `passes: true` and refuses
    /// with the check's output while it fails; a final answer before any `mark_story` call gets
    /// a reminder; a successful `mark_story(passes: true)` ends the session
    /// (`crate::native::SessionConfig::mark_protocol`).
    #[serde(default)]
    pub mark_protocol: bool,
    /// The run's verify command (`--verify`), for stories without their own.
    #[serde(default)]
    pub verify: Option<String>,
    /// Time limit of that check, in seconds (the run's `verify_timeout`).
    #[serde(default = "default_verify_timeout_s")]
    pub verify_timeout_s: u64,
    /// Set for an answer session (`ralph plan`, `ralph convert`): no tools, one reply that must
    /// follow this JSON Schema (see [`crate::native::answer`]). `None` for `ralph run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_schema: Option<Value>,
}

fn default_verify_timeout_s() -> u64 {
    600
}

/// Facts about the native backend: ralph itself, no CLI to install or probe.
pub const NATIVE_INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Native,
    program: None,
    install_hint: "see README.md",
    version_probe: false,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: no_traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| build(AgentKind::Native, settings),
    sandbox: SandboxNeeds {
        state: &[],
        env_prefixes: &[
            "OPENAI_",
            "ANTHROPIC_",
            "OPENROUTER_",
            "GROQ_",
            "GEMINI_",
            "MISTRAL_",
            "DEEPSEEK_",
        ],
        hosts: &[],
        base_url_hosts: Vec::new,
        config_env: Vec::new,
        state_vars: &[],
        config_vars: &[],
    },
};

/// Facts about the local backend: the native loop against a model ralph serves itself.
pub const LOCAL_INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Local,
    build: |settings| build(AgentKind::Local, settings),
    ..NATIVE_INFO
};

/// The `kind` (`Native` or `Local`) backend for `settings`, run as this same binary's hidden
/// subcommand.
fn build(kind: AgentKind, settings: AgentSettings) -> anyhow::Result<Box<dyn Backend>> {
    let native = settings.native.ok_or_else(|| {
        anyhow::anyhow!(
            "internal error: the {} backend needs its settings",
            kind.as_str()
        )
    })?;
    // The loop runs in a child process: this same binary, hidden subcommand.
    let program = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find ralph's own executable: {e}"))?;
    Ok(Box::new(Native::new(kind, native, program)))
}

/// The backend.
pub struct Native {
    kind: AgentKind,
    settings: NativeSettings,
    program: PathBuf,
}

impl Native {
    /// A backend of `kind` (`Native` or `Local`) running `program` (ralph itself) with `settings`.
    pub fn new(kind: AgentKind, settings: NativeSettings, program: PathBuf) -> Native {
        Native {
            kind,
            settings,
            program,
        }
    }
}

impl Backend for Native {
    fn info(&self) -> &'static BackendInfo {
        match self.kind {
            AgentKind::Local => &LOCAL_INFO,
            _ => &NATIVE_INFO,
        }
    }

    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        Ok(SpawnSpec {
            program: self.program.clone(),
            args: vec![SUBCOMMAND.to_string()],
            cwd: self.settings.repo_root.clone(),
            env_remove: Vec::new(),
            env_set: vec![
                (
                    SETTINGS_VAR.to_string(),
                    serde_json::to_string(&self.settings)?,
                ),
                ("NO_COLOR".to_string(), "1".to_string()),
            ],
            stdin: Some(prompt.as_bytes().to_vec()),
        })
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        Box::new(NativeParser::default())
    }
}

/// Parses the native dialect.
#[derive(Debug, Default)]
pub struct NativeParser {
    result: Option<Value>,
    stderr_tail: crate::agent::StderrTail,
}

impl OutputParser for NativeParser {
    fn on_line(&mut self, line: &OutputLine) -> Vec<AgentEvent> {
        if line.stream == StreamKind::Stderr {
            let clean = crate::process::strip_ansi(&line.text);
            if !clean.trim().is_empty() {
                self.stderr_tail.push(clean.trim());
            }
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(&line.text) else {
            return Vec::new();
        };
        match v.get("type").and_then(Value::as_str) {
            Some("event") => v
                .get("event")
                .cloned()
                .and_then(|e| serde_json::from_value::<AgentEvent>(e).ok())
                .into_iter()
                .collect(),
            Some("result") => {
                let text = v
                    .get("final_text")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let is_error = end_is_error(&v);
                self.result = Some(v);
                vec![AgentEvent::Final { text, is_error }]
            }
            _ => Vec::new(),
        }
    }

    fn finish(self: Box<Self>, exit_code: Option<i32>) -> AgentReport {
        let Some(r) = self.result else {
            return AgentReport {
                is_error: true,
                error_message: self.stderr_tail.joined().or_else(|| {
                    Some(format!(
                        "the native agent ended without a result ({})",
                        crate::protocol::exit::describe_end(exit_code, None)
                    ))
                }),
                ..AgentReport::default()
            };
        };
        let end = r.get("end").cloned().unwrap_or(Value::Null);
        let reason = end.get("reason").and_then(Value::as_str).unwrap_or("");
        let failure = match (reason, end.get("class").and_then(Value::as_str)) {
            ("error", Some("auth")) => Some(FailureClass::Auth),
            ("error", Some("quota")) => Some(FailureClass::UsageLimit),
            ("error", Some("context")) => Some(FailureClass::Context),
            ("error", Some("transient")) => Some(FailureClass::Transient),
            _ => None,
        };
        let error_message = match reason {
            "error" => end.get("error").and_then(Value::as_str).map(str::to_string),
            "tool_fatal" => end
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string),
            "stuck" => Some(format!(
                "stuck: the model repeated the same {} call",
                end.get("tool").and_then(Value::as_str).unwrap_or("tool")
            )),
            "content_filter" => Some("the provider filtered the reply (content_filter)".into()),
            "refusal" => Some("the model refused".into()),
            _ => None,
        };
        let usage: crate::protocol::Usage = r
            .get("usage")
            .cloned()
            .and_then(|u| serde_json::from_value(u).ok())
            .unwrap_or_default();
        AgentReport {
            final_text: r
                .get("final_text")
                .and_then(Value::as_str)
                .map(str::to_string),
            saw_final: true,
            is_error: end_is_error(&r),
            error_message,
            failure,
            cost_usd: r.get("cost_usd").and_then(Value::as_f64),
            usage: Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_creation_tokens: usage.cache_creation_tokens,
            },
            session_id: None,
            model: r.get("model").and_then(Value::as_str).map(str::to_string),
            agent_version: Some(format!("ralph-native {}", env!("CARGO_PKG_VERSION"))),
            resume_at: None,
        }
    }
}

/// Whether a result line's end reason is a failure of the agent.
fn end_is_error(result: &Value) -> bool {
    matches!(
        result.pointer("/end/reason").and_then(Value::as_str),
        Some("error" | "tool_fatal" | "stuck" | "content_filter" | "refusal" | "cancelled")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> OutputLine {
        OutputLine {
            stream: StreamKind::Stdout,
            text: text.into(),
            truncated_from: None,
        }
    }

    #[test]
    fn result_line_gives_final_text_usage_cost_and_failure() {
        let mut p: Box<dyn OutputParser> = Box::new(NativeParser::default());
        let ev = p.on_line(&line(r#"{"type":"event","event":{"kind":"tool_call","name":"write_file","summary":"a.txt"}}"#));
        assert_eq!(ev.len(), 1);
        let ev = p.on_line(&line(r#"{"type":"result","final_text":"done\n<promise>COMPLETE</promise>","end":{"reason":"completed"},"usage":{"input":10,"output":5,"cache_read":0,"cache_write":0},"cost_usd":0.5,"model":"m"}"#));
        assert!(matches!(
            ev[0],
            AgentEvent::Final {
                is_error: false,
                ..
            }
        ));
        let r = p.finish(Some(0));
        assert!(r.saw_final && !r.is_error);
        assert_eq!(r.usage.input_tokens, 10);
        assert_eq!(r.cost_usd, Some(0.5));

        let mut p: Box<dyn OutputParser> = Box::new(NativeParser::default());
        p.on_line(&line(r#"{"type":"result","final_text":"","end":{"reason":"error","error":"authentication failed (HTTP 401): bad key","class":"auth"},"usage":{"input":0,"output":0,"cache_read":0,"cache_write":0}}"#));
        let r = p.finish(Some(0));
        assert_eq!(r.failure, Some(FailureClass::Auth));
        assert!(r.is_error);
    }

    #[test]
    fn no_result_line_is_an_error_with_stderr() {
        let mut p: Box<dyn OutputParser> = Box::new(NativeParser::default());
        p.on_line(&OutputLine {
            stream: StreamKind::Stderr,
            text: "error: something broke".into(),
            truncated_from: None,
        });
        let r = p.finish(Some(1));
        assert!(r.is_error);
        assert_eq!(r.error_message.as_deref(), Some("error: something broke"));
    }

    #[test]
    fn price_is_per_million_tokens() {
        let p = Price {
            input: 3.0,
            output: 15.0,
            cache_read: None,
        };
        let u = crate::protocol::Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: 0,
            cache_creation_tokens: 0,
        };
        assert!((p.cost(&u) - 4.5).abs() < 1e-9);
    }
}
