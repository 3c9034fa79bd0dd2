//! The cursor backend (placeholder until its module is written: refuses to start).

use crate::agent::{AgentReport, AgentSettings, Backend, OutputParser};
use crate::cli::AgentKind;
use crate::process::{OutputLine, SpawnSpec};

/// The cursor backend.
#[derive(Debug, Clone)]
pub struct Cursor {
    _settings: AgentSettings,
}

impl Cursor {
    /// A backend for `settings`.
    pub fn new(settings: AgentSettings) -> Self {
        Cursor {
            _settings: settings,
        }
    }
}

impl Backend for Cursor {
    fn kind(&self) -> AgentKind {
        AgentKind::Cursor
    }

    fn command(&self, _prompt: &str) -> anyhow::Result<SpawnSpec> {
        anyhow::bail!("the cursor backend is not available in this build")
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        Box::new(Nothing)
    }
}

struct Nothing;

impl OutputParser for Nothing {
    fn on_line(&mut self, _line: &OutputLine) -> Vec<crate::agent::AgentEvent> {
        Vec::new()
    }

    fn finish(self: Box<Self>, _exit_code: Option<i32>) -> AgentReport {
        AgentReport::default()
    }
}
