//! The outputs of a run. Every line a user sees comes from a [`RunEvent`] sent to the
//! [`Outputs`], which hands it to each [`Sink`]: the terminal ([`human::Human`]), the `--json`
//! stream ([`json::Json`]), GitHub Actions' groups, annotations, step summary and outputs
//! ([`github::GitHubActions`], only under `GITHUB_ACTIONS=true`), notifications, and any later
//! one as a new file here, not an edit of the loop. Sinks only read events; they never decide anything.

use crate::protocol::RunEvent;

pub mod github;
pub mod human;
pub mod json;
pub mod notify;
pub mod text;

/// Something that consumes run events (see the module docs).
pub trait Sink: Send {
    /// Handles one event. Must not fail the run: a sink that cannot write drops the output.
    fn on(&mut self, event: &RunEvent);

    /// The run is over: finish what is pending (e.g. notifications in flight), within the
    /// sink's own time limits.
    fn close(&mut self) {}

    /// The run ended with an error instead of its summary (no [`RunEvent::RunFinished`]): it
    /// could not start (an unreachable remote, a refused dirty tree) or could not go on.
    /// `exit_code` is ralph's exit code, `message` the error (lines: the problem, then hints). The terminal prints
    /// the error itself; this is for sinks another program reads (GitHub Actions' outputs).
    fn failed(&mut self, _exit_code: i32, _message: &str) {}
}

/// Warnings a sink raises from elsewhere (a notification that failed on the notification
/// worker): [`Outputs`] turns them into [`RunEvent::Warning`]s for every sink.
#[derive(Debug, Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// Queues a warning.
    pub fn push(&self, message: String) {
        if let Ok(mut w) = self.0.lock() {
            w.push(message);
        }
    }

    fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
    }
}

/// The sinks of one run, in order.
#[derive(Default)]
pub struct Outputs {
    sinks: Vec<Box<dyn Sink>>,
    warnings: Warnings,
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

    /// Where sinks queue warnings of their own (see [`Warnings`]).
    pub fn warnings(&self) -> Warnings {
        self.warnings.clone()
    }

    /// Sends `event` to every sink, then any warning a sink queued meanwhile.
    pub fn emit(&mut self, event: RunEvent) {
        for sink in &mut self.sinks {
            sink.on(&event);
        }
        for message in self.warnings.take() {
            self.emit(RunEvent::Warning {
                message,
                iteration: None,
            });
        }
    }

    /// Ends the run's output: every sink finishes what is pending, and their last warnings are
    /// shown.
    pub fn close(&mut self) {
        for sink in &mut self.sinks {
            sink.close();
        }
        for message in self.warnings.take() {
            for sink in &mut self.sinks {
                sink.on(&RunEvent::Warning {
                    message: message.clone(),
                    iteration: None,
                });
            }
        }
    }

    /// Tells every sink the run ended with an error instead of its summary (see
    /// [`Sink::failed`]).
    pub fn failed(&mut self, exit_code: i32, message: &str) {
        for sink in &mut self.sinks {
            sink.failed(exit_code, message);
        }
    }

    /// Sends a [`RunEvent::Warning`] about the run (no iteration).
    pub fn warn(&mut self, message: impl Into<String>) {
        self.emit(RunEvent::Warning {
            message: message.into(),
            iteration: None,
        });
    }

    /// Sends a [`RunEvent::Warning`] about iteration `iteration` (its `--json` line names it,
    /// so that a reader of a `--parallel` run can tell whose it is).
    pub fn warn_in(&mut self, iteration: u32, message: impl Into<String>) {
        self.emit(RunEvent::Warning {
            message: message.into(),
            iteration: Some(iteration),
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
