//! Agent backends: one trait, one module per backend. A backend describes *what* to run
//! ([`SpawnSpec`]) and how to read its output ([`OutputParser`]); [`crate::process`] runs it.
//!
//! A backend file holds only what differs between CLIs: its argv and environment, its
//! [`stream::Dialect`] (how its output reads) and its facts ([`BackendInfo`]: program, install
//! hint, `--version`, terminal event, how the prompt is passed, doctor traps). The machinery
//! they share is in [`stream`] (stderr, the report skeleton) and [`claude_shape`] (the
//! stream-json shape claude, amp and cursor share). Adding a backend: its file, one line in
//! [`registry::BACKENDS`], and its test fixtures.

use std::path::PathBuf;

use crate::process::{OutputLine, SpawnSpec};
use crate::protocol::{AgentEvent, AgentKind, AgentReport};

pub mod amp;
pub mod classify;
pub mod claude;
pub mod claude_login;
pub mod claude_shape;
pub mod claude_turn;
pub mod codex;
pub mod cursor;
pub mod exec;
pub mod gemini;
pub mod native;
pub mod opencode;
pub mod probe;
pub mod registry;
pub mod reset_time;
pub mod sandbox;
pub mod session;
pub mod stream;
#[cfg(test)]
mod tool_outputs;

pub use registry::{info, BackendInfo, DoctorContext, PromptVia};
pub use stream::StderrTail;

/// Settings a backend needs to build its command line.
#[derive(Debug, Clone, Default)]
pub struct AgentSettings {
    /// Repository root; the agent's working directory.
    pub repo: PathBuf,
    /// `--model`, passed through when set.
    pub model: Option<String>,
    /// `--agent-cmd` for the exec backend (a command line split into words without a shell).
    pub agent_cmd: Option<String>,
    /// Program to run for CLI backends, overriding the default name (e.g. a path to `claude`).
    pub program: Option<PathBuf>,
    /// Settings of the native and local backends (required for them).
    pub native: Option<native::NativeSettings>,
    /// claude: keep `ANTHROPIC_API_KEY` in its environment (`--keep-api-key`); without it the
    /// key is removed only when claude has a login of its own ([`claude_login::ApiKey`]).
    pub keep_api_key: bool,
}

impl AgentSettings {
    /// The program to run: [`AgentSettings::program`] when set (`--agent-program`), else the
    /// CLI's usual name `default`, looked up on PATH.
    pub fn program_or(&self, default: &str) -> PathBuf {
        self.program
            .clone()
            .unwrap_or_else(|| PathBuf::from(default))
    }

    /// `base`, then `model_flag MODEL` when a model is set (`--model`, `-m`, amp's `--mode`).
    pub fn args_with_model(&self, base: &[&str], model_flag: &str) -> Vec<String> {
        let mut args: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
        if let Some(model) = &self.model {
            args.push(model_flag.to_owned());
            args.push(model.clone());
        }
        args
    }

    /// How a CLI backend starts: [`AgentSettings::program_or`]`(default)` with `args` in the
    /// repository, `NO_COLOR=1`, nothing removed from the environment, and `stdin` written then
    /// closed (`None`: stdin is `/dev/null`). Backends add their own environment to it.
    pub fn cli_spec(&self, default: &str, args: Vec<String>, stdin: Option<&str>) -> SpawnSpec {
        SpawnSpec {
            program: self.program_or(default),
            args,
            cwd: self.repo.clone(),
            env_remove: Vec::new(),
            env_set: vec![("NO_COLOR".to_owned(), "1".to_owned())],
            stdin: stdin.map(|s| s.as_bytes().to_vec()),
        }
    }
}

/// Reads one agent's output, line by line, into events and a final report.
pub trait OutputParser: Send {
    /// Parses one line (stdout or stderr). Never fails: unknown or non-JSON lines yield no event.
    fn on_line(&mut self, line: &OutputLine) -> Vec<AgentEvent>;
    /// Whether the stdout line just read was one JSON value exactly as printed (the parser read
    /// it whole, and it has no surrounding whitespace), so a transcript may keep it as JSON
    /// rather than as an escaped string. By default `false`, which is always safe.
    fn line_is_json(&self) -> bool {
        false
    }
    /// Called once after the process ended, with its exit code (None when killed by a signal).
    fn finish(self: Box<Self>, exit_code: Option<i32>) -> AgentReport;
}

/// A backend: how to start one fresh agent process for a prompt and how to read it.
pub trait Backend: Send + Sync {
    /// Facts about this backend (the same as [`info`] of its kind).
    fn info(&self) -> &'static BackendInfo;
    /// Which backend this is.
    fn kind(&self) -> AgentKind {
        self.info().kind
    }
    /// The process to start for `prompt`.
    ///
    /// # Errors
    /// A user-fixable configuration problem (e.g. exec without `--agent-cmd`, an unparsable
    /// command line).
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec>;
    /// A fresh parser for one run of `prompt` (exec uses the prompt to drop an echo of it).
    fn parser(&self, prompt: &str) -> Box<dyn OutputParser>;
    /// A fresh parser for an answer session of `prompt` (`ralph plan`, `ralph convert`: the
    /// agent replies with a document): its report's `final_text` is the whole reply. By default
    /// [`Backend::parser`], whose final text already is the agent's last message; exec reads
    /// all of stdout instead of its last line.
    fn answer_parser(&self, prompt: &str) -> Box<dyn OutputParser> {
        self.parser(prompt)
    }
    /// One-line notices about how this backend runs its agent that the user should see once,
    /// at the start of a run, as warnings (claude: `ANTHROPIC_API_KEY` is not passed on). A
    /// backend cannot print; the run loop shows these. By default none.
    fn notices(&self) -> Vec<String> {
        Vec::new()
    }
}

/// [`replay_parser`] for the backend a transcript's meta record names (`"claude"`, …), as the
/// closure [`crate::transcript::read_with`] takes; `None` for an unknown name or exec.
pub fn replayer(backend: &str) -> Option<crate::transcript::Replay> {
    let kind: AgentKind = serde_json::from_value(serde_json::json!(backend)).ok()?;
    let mut parser = replay_parser(kind)?;
    Some(Box::new(move |line| parser.on_line(line)))
}

/// A fresh parser that reads a `kind` transcript's lines again into the same events as the run
/// did: for every backend whose events depend on its output lines alone (the settings a
/// backend's own parser gets, such as the requested model, change only its report). `None` for
/// exec, whose events also depend on the prompt and the program; its transcripts keep every event
/// ([`crate::transcript::Transcript::create_replayed`]).
pub fn replay_parser(kind: AgentKind) -> Option<Box<dyn OutputParser>> {
    Some(match kind {
        AgentKind::Claude => Box::new(claude::ClaudeParser::new()),
        AgentKind::Codex => Box::new(codex::CodexParser::new()),
        AgentKind::Amp => Box::new(amp::AmpParser::new()),
        AgentKind::Opencode => Box::new(opencode::OpencodeParser::new()),
        AgentKind::Gemini => Box::new(gemini::GeminiParser::new()),
        AgentKind::Cursor => Box::new(cursor::CursorParser::new()),
        AgentKind::Native | AgentKind::Local => Box::new(native::NativeParser::default()),
        AgentKind::Exec => return None,
    })
}

/// The backend for `kind`, configured from `settings`.
///
/// # Errors
/// Whatever the backend's constructor refuses, e.g. [`exec::ExecError`] when `kind` is
/// [`AgentKind::Exec`] and `settings.agent_cmd` is missing or cannot be split into words.
pub fn backend(kind: AgentKind, settings: AgentSettings) -> anyhow::Result<Box<dyn Backend>> {
    (info(kind).build)(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factory_builds_each_backend_and_reports_exec_misconfiguration() {
        let claude = backend(AgentKind::Claude, AgentSettings::default());
        assert!(matches!(claude.map(|b| b.kind()), Ok(AgentKind::Claude)));
        let exec = backend(
            AgentKind::Exec,
            AgentSettings {
                agent_cmd: Some("my-agent --x".into()),
                ..AgentSettings::default()
            },
        );
        assert!(matches!(exec.map(|b| b.kind()), Ok(AgentKind::Exec)));
        match backend(AgentKind::Exec, AgentSettings::default()) {
            Ok(_) => panic!("exec without --agent-cmd was accepted"),
            Err(e) => assert!(e.to_string().contains("--agent-cmd"), "{e}"),
        }
    }
}
