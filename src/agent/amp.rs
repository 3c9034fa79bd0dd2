//! The amp backend (placeholder until its module is written: refuses to start).

use crate::agent::{AgentReport, AgentSettings, Backend, OutputParser};
use crate::cli::AgentKind;
use crate::process::{OutputLine, SpawnSpec};

/// The amp backend.
#[derive(Debug, Clone)]
pub struct Amp {
    _settings: AgentSettings,
}

impl Amp {
    /// A backend for `settings`.
    pub fn new(settings: AgentSettings) -> Self {
        Amp {
            _settings: settings,
        }
    }
}

impl Backend for Amp {
    fn kind(&self) -> AgentKind {
        AgentKind::Amp
    }

    fn command(&self, _prompt: &str) -> anyhow::Result<SpawnSpec> {
        anyhow::bail!("the amp backend is not available in this build")
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
