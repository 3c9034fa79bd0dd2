//! `--json`: one JSON object per line on stdout for every [`RunEvent`] except
//! [`RunEvent::Notice`] (human-only set-up chatter), and the agent's command line and events only
//! with `--verbose`. Each line is a [`JsonEvent`]: `{"event": "<name>", "at": "<RFC 3339 UTC>",
//! ...}`; the schema is `run-events.schema.json`.

use std::io::Write as _;

use chrono::SecondsFormat;

use super::Sink;
use crate::protocol::run_event::JsonEvent;
use crate::protocol::RunEvent;

/// The `--json` sink.
pub struct Json {
    verbose: bool,
}

impl Json {
    /// A sink writing to stdout; `verbose` adds `agent_command` and `agent_event` lines.
    pub fn new(verbose: bool) -> Json {
        Json { verbose }
    }
}

impl Sink for Json {
    fn on(&mut self, event: &RunEvent) {
        match event {
            RunEvent::Notice { .. } => return,
            RunEvent::AgentCommand { .. } | RunEvent::AgentEvent { .. } if !self.verbose => return,
            _ => {}
        }
        let line = JsonEvent {
            at: chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            event: event.clone(),
        };
        let Ok(text) = serde_json::to_string(&line) else {
            return;
        };
        // Every string field at once (a secret is matched in its JSON-escaped form too).
        let text = crate::redact::redact_env(&text);
        // A closed stdout (e.g. `| head`) must not stop the run: write errors are ignored.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}
