//! The outputs of a run. Every line a user sees comes from a [`RunEvent`] sent to the
//! [`Outputs`], which hands it to each [`Sink`]: the terminal ([`human::Human`]), the `--json`
//! stream ([`json::Json`]), and any later one (a report, notifications) as a new file here, not
//! an edit of the loop. Sinks only read events; they never decide anything.

use crate::protocol::RunEvent;

pub mod human;
pub mod json;
pub mod text;

/// Something that consumes run events (see the module docs).
pub trait Sink: Send {
    /// Handles one event. Must not fail the run: a sink that cannot write drops the output.
    fn on(&mut self, event: &RunEvent);
}

/// The sinks of one run, in order.
#[derive(Default)]
pub struct Outputs {
    sinks: Vec<Box<dyn Sink>>,
}

impl Outputs {
    /// No sinks yet (events go nowhere).
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// Adds a sink; events reach sinks in the order they were added.
    pub fn add(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Sends `event` to every sink.
    pub fn emit(&mut self, event: RunEvent) {
        for sink in &mut self.sinks {
            sink.on(&event);
        }
    }

    /// Sends a [`RunEvent::Warning`].
    pub fn warn(&mut self, message: impl Into<String>) {
        self.emit(RunEvent::Warning {
            message: message.into(),
        });
    }

    /// Sends a [`RunEvent::Notice`].
    pub fn notice(&mut self, message: impl Into<String>) {
        self.emit(RunEvent::Notice {
            message: message.into(),
        });
    }
}

/// A sink that keeps every event, for tests and for callers that read events back.
#[derive(Debug, Default, Clone)]
pub struct Collect {
    /// The events, in order.
    pub events: std::sync::Arc<std::sync::Mutex<Vec<RunEvent>>>,
}

impl Sink for Collect {
    fn on(&mut self, event: &RunEvent) {
        if let Ok(mut events) = self.events.lock() {
            events.push(event.clone());
        }
    }
}
