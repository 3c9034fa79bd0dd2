//! The stream machinery every agent CLI's reader shares: [`StreamCore`] holds what each reader
//! tracks (classifier, stderr tail, session, terminal event, usage, cost, reset time) and builds
//! the [`AgentReport`] once; a [`Dialect`] holds only what differs per CLI (how its stdout lines
//! read, and its few quirks at the end); [`Parser`] drives a dialect line by line as an
//! [`OutputParser`].
//!
//! The report skeleton ([`StreamCore::finish`]), the same for every CLI:
//! 1. the dialect settles its last facts into the core ([`Dialect::settle`]);
//! 2. `is_error`: the agent said so ([`StreamCore::is_error`]), or there was no terminal event
//!    and the exit code was not 0 (a signal counts);
//! 3. `failure`, only when the run failed (`is_error`, or no terminal event, so retry chatter
//!    before a successful end never counts): the dialect's structured class
//!    ([`StreamCore::failure`]), else the [`Classifier`]'s most decisive one;
//! 4. `error_message`, only for an error, a failure class or (when the dialect asks,
//!    [`StreamCore::explain_unfinished`]) a run without a terminal event:
//!    [`Dialect::error_message`], by default [`StreamCore::error_message_chain`];
//! 5. `resume_at`, only for a usage limit: [`Dialect::reset_time`], by default the structured
//!    reset time ([`StreamCore::resume_at`]), else the one written in the error message. A
//!    reset time that has already passed ([`reset_time::judge`]) is never reported: `resume_at`
//!    is then `None` (the run waits `usage_limit_fallback`) and the error message says that the
//!    agent's reset time was stale;
//! 6. a config error about a model that does not exist ([`Classifier::missing_model`]) gets a
//!    message naming the model: the one the error names, else the one ralph asked for
//!    ([`StreamCore::requested_model`]), else the one the agent reported;
//! 7. the dialect's last word on the finished report ([`Dialect::annotate`]), e.g. claude's
//!    `--keep-api-key` hint after an auth error.
//!
//! When a CLI has no terminal event for sure ([`StreamCore::exit_decides`], cursor), a run that
//! ended without one is judged by its exit code alone: exit 0 counts as the end of the run.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::agent::classify::{resume_at_from_text, Classifier, Signal};
use crate::agent::reset_time::{self, Reset};
use crate::agent::OutputParser;
use crate::process::{strip_ansi, OutputLine, StreamKind};
use crate::protocol::fields::truncate_chars;
use crate::protocol::{AgentEvent, AgentReport, FailureClass, Usage};

/// The last few non-empty lines an agent wrote on stderr (ANSI stripped, each capped), kept so a
/// failed run can be explained without buffering the whole stream.
#[derive(Debug, Default, Clone)]
pub struct StderrTail {
    lines: VecDeque<String>,
}

impl StderrTail {
    /// Lines kept.
    pub const LINES: usize = 8;
    /// Characters kept per line.
    pub const LINE_MAX_CHARS: usize = 1000;

    /// Remembers `line` (already ANSI-stripped and trimmed), dropping the oldest beyond [`Self::LINES`].
    pub fn push(&mut self, line: &str) {
        if self.lines.len() == Self::LINES {
            self.lines.pop_front();
        }
        self.lines
            .push_back(line.chars().take(Self::LINE_MAX_CHARS).collect());
    }

    /// The newest `n` kept lines (fewer when fewer are kept), oldest first.
    pub fn last(&self, n: usize) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .skip(self.lines.len().saturating_sub(n))
            .map(String::as_str)
    }

    /// The kept lines joined with newlines, or `None` when nothing was written.
    pub fn joined(&self) -> Option<String> {
        (!self.lines.is_empty()).then(|| self.lines.iter().cloned().collect::<Vec<_>>().join("\n"))
    }
}

/// What every agent-output reader tracks, and the one place an [`AgentReport`] is built.
///
/// A [`Dialect`] fills these fields as lines arrive (or in [`Dialect::settle`]); the fields are
/// the report's raw material, and [`StreamCore::finish`] applies the rules in the module docs.
#[derive(Debug, Default)]
pub struct StreamCore {
    /// The agent's own error signals (stderr, error results, API statuses).
    pub classifier: Classifier,
    /// The last stderr lines.
    pub stderr_tail: StderrTail,
    /// The last stdout lines that were not JSON, from a CLI in its JSON mode
    /// ([`StreamCore::plain_stdout`]): claude sometimes prints its usage-limit sentence so.
    pub plain_tail: StderrTail,
    /// How many plain stdout lines came so far; only the first [`StreamCore::PLAIN_LIVE_LINES`]
    /// are classified as they arrive.
    pub plain_seen: usize,
    /// The agent's session (or thread) id.
    pub session_id: Option<String>,
    /// The model the agent reported.
    pub model: Option<String>,
    /// The agent's version, when it reported one.
    pub version: Option<String>,
    /// The final text: the terminal event's, else the agent's last words (where the completion
    /// promise is looked for).
    pub final_text: Option<String>,
    /// A terminal event was seen (the agent said its run is over).
    pub saw_final: bool,
    /// The agent itself reported the run as failed.
    pub is_error: bool,
    /// The terminal event's own error message, when it reported an error.
    pub error_message: Option<String>,
    /// The last error the agent reported outside its terminal event (claude's synthetic
    /// assistant message, codex's `error` event, gemini's `error` event): a fallback message.
    pub error_event: Option<String>,
    /// A failure class read from structured fields, which wins over the classifier's.
    pub failure: Option<FailureClass>,
    /// Also explain a run that ended without a terminal event when it exited 0 (for CLIs where
    /// that means the agent stopped half-way).
    pub explain_unfinished: bool,
    /// Token usage.
    pub usage: Usage,
    /// Cost in USD, when the agent reported one.
    pub cost_usd: Option<f64>,
    /// A structured usage-limit reset time (UTC), when the agent gave one.
    pub resume_at: Option<DateTime<Utc>>,
    /// The model ralph asked for (`--model`), named when the agent's API says it does not exist.
    pub requested_model: Option<String>,
    /// The CLI may end without its terminal event, and then its exit code decides (cursor):
    /// exit 0 without a terminal event counts as the end of the run.
    pub exit_decides: bool,
    /// The line being read is one JSON value exactly as it was printed (no surrounding
    /// whitespace): set by the readers that parsed it whole, cleared before every line.
    pub line_is_json: bool,
}

impl StreamCore {
    /// The common stderr handling: ANSI stripped and trimmed; a blank line is dropped; anything
    /// else goes to the classifier and the tail, and is shown as an [`AgentEvent::Error`].
    pub fn stderr(&mut self, text: &str) -> Vec<AgentEvent> {
        let Some(clean) = self.note_stderr(text) else {
            return Vec::new();
        };
        vec![AgentEvent::Error { message: clean }]
    }

    /// Feeds a stderr line (ANSI stripped, trimmed) to the classifier and the tail without
    /// showing it; returns the cleaned line, or `None` when it was blank.
    pub fn note_stderr(&mut self, text: &str) -> Option<String> {
        let clean = strip_ansi(text);
        let clean = clean.trim();
        if clean.is_empty() {
            return None;
        }
        self.classifier.observe(Signal::Text(clean));
        self.stderr_tail.push(clean);
        Some(clean.to_owned())
    }

    /// A stdout line that is not a JSON object, from a CLI whose stdout should hold only JSON
    /// lines ([`Dialect::json_lines`]): the CLI itself wrote it outside its protocol (claude
    /// prints its usage-limit sentence as a plain line, among or instead of the JSON lines,
    /// then exits 1). Like a stderr line it goes to the classifier and is kept
    /// ([`StreamCore::plain_tail`], the last source of an error message), so that such a run is
    /// read as what the line says (a usage limit with its reset time) rather than as an exit
    /// code with no message. A line the classifier reads as an error signal is shown as an
    /// [`AgentEvent::Error`]; other stray lines (a wrapper's banner) only stay in the tail and
    /// the transcript. Blank lines are dropped.
    pub fn plain_stdout(&mut self, text: &str) -> Vec<AgentEvent> {
        let clean = strip_ansi(text);
        let clean = clean.trim();
        if clean.is_empty() {
            return Vec::new();
        }
        self.plain_tail.push(clean);
        self.plain_seen += 1;
        if self.plain_seen > Self::PLAIN_LIVE_LINES {
            // A flood of plain lines (gigabytes of chatter) is not classified line by line:
            // what is kept of its end is, when the run ends ([`StreamCore::finish`]).
            return Vec::new();
        }
        if self.classifier.observe(Signal::Text(clean)).is_some() {
            vec![AgentEvent::Error {
                message: clean.to_owned(),
            }]
        } else {
            Vec::new()
        }
    }

    /// Plain stdout lines classified as they arrive; past these, only the last
    /// [`StderrTail::LINES`] are, when the run ends. A CLI's limit or error sentence is among
    /// its first lines (instead of the JSON) or its last (before it exits).
    pub const PLAIN_LIVE_LINES: usize = 200;

    /// The [`AgentEvent::Session`] for what is known of the session so far.
    pub fn session_event(&self) -> AgentEvent {
        AgentEvent::Session {
            session_id: self.session_id.clone(),
            model: self.model.clone(),
            version: self.version.clone(),
        }
    }

    /// The usual error message of a failed run, best source first: the terminal event's own
    /// message, the text that decided the failure class, the last error reported outside the
    /// terminal event, the last stderr lines, the last plain (non-JSON) stdout lines; ANSI
    /// stripped.
    pub fn error_message_chain(&self) -> Option<String> {
        self.error_message
            .clone()
            .or_else(|| self.classifier.message().map(str::to_owned))
            .or_else(|| self.error_event.clone())
            .or_else(|| self.stderr_tail.joined())
            .or_else(|| self.plain_tail.joined())
            .map(|m| strip_ansi(&m))
    }

    /// The usual reset time of a usage limit: the structured one, else the one written in
    /// `error_message`.
    pub fn reset_time_from(&self, error_message: Option<&str>) -> Option<DateTime<Utc>> {
        self.resume_at
            .or_else(|| error_message.and_then(resume_at_from_text))
    }

    /// Builds the report once the process ended with `exit_code` (`None`: killed by a signal),
    /// by the rules in the module docs.
    pub fn finish<D: Dialect + ?Sized>(
        mut self,
        dialect: &mut D,
        exit_code: Option<i32>,
    ) -> AgentReport {
        dialect.settle(&mut self, exit_code);
        // The end of a flood of plain lines, which was not classified as it came.
        let unread = self.plain_seen.saturating_sub(Self::PLAIN_LIVE_LINES);
        let tail: Vec<String> = self.plain_tail.last(unread).map(str::to_owned).collect();
        for line in &tail {
            self.classifier.observe(Signal::Text(line));
        }
        if self.exit_decides && !self.saw_final && exit_code == Some(0) {
            self.saw_final = true;
        }
        let saw_final = self.saw_final;
        let is_error = self.is_error || (!saw_final && exit_code != Some(0));
        let failed = is_error || !saw_final;
        let failure = if failed {
            self.failure.or_else(|| self.classifier.best())
        } else {
            None
        };
        let explain = is_error || failure.is_some() || (self.explain_unfinished && !saw_final);
        let mut error_message = if explain {
            dialect.error_message(&self, exit_code)
        } else {
            None
        };
        let mut resume_at = None;
        if failure == Some(FailureClass::UsageLimit) {
            match dialect
                .reset_time(&self, error_message.as_deref())
                .map(|at| reset_time::judge(at, Utc::now()))
            {
                Some(Reset::At(at)) => resume_at = Some(at),
                Some(Reset::Stale(at)) => {
                    error_message = Some(with_note(error_message, &stale_note(at)));
                }
                None => {}
            }
        }
        if failure == Some(FailureClass::Config) {
            let from_message = error_message
                .as_deref()
                .and_then(crate::agent::classify::missing_model);
            if let Some(missing) = self.classifier.missing_model().cloned().or(from_message) {
                let name = missing
                    .name
                    .clone()
                    .or_else(|| self.requested_model.clone())
                    .or_else(|| self.model.clone());
                error_message = Some(missing_model_message(
                    name.as_deref(),
                    error_message.as_deref(),
                ));
            }
        }
        let mut report = AgentReport {
            final_text: self.final_text,
            saw_final,
            is_error,
            error_message,
            failure,
            cost_usd: self.cost_usd,
            usage: self.usage,
            session_id: self.session_id,
            model: self.model,
            agent_version: self.version,
            resume_at,
        };
        dialect.annotate(&mut report);
        report
    }
}

/// `message` with `note` appended on its last line (`; note`), or `note` alone. The run loop
/// shows the last line of an agent's message, so a note must end it.
pub fn with_note(message: Option<String>, note: &str) -> String {
    match message {
        Some(m) if !m.trim().is_empty() => format!("{}; {note}", m.trim_end()),
        _ => note.to_owned(),
    }
}

/// What the report says of a usage-limit reset time that has already passed.
fn stale_note(at: DateTime<Utc>) -> String {
    format!(
        "the reset time it gave ({}) has already passed, so ralph waits usage_limit_fallback instead",
        at.format("%Y-%m-%d %H:%M UTC")
    )
}

/// One line naming the missing model, then what the agent said (on one line, shortened).
fn missing_model_message(name: Option<&str>, said: Option<&str>) -> String {
    let head = match name {
        Some(name) => format!(
            "the model `{name}` does not exist or this account cannot use it: fix --model (a config error; ralph does not retry it)"
        ),
        None => "the requested model does not exist or this account cannot use it: fix --model (a config error; ralph does not retry it)".to_owned(),
    };
    match said.map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")) {
        Some(said) if !said.is_empty() => {
            format!("{head}; the agent said: {}", truncate_chars(&said, 200))
        }
        _ => head,
    }
}

/// What differs between agent CLIs' output: how a line reads, and a few end-of-run quirks.
/// Everything else lives in [`StreamCore`].
pub trait Dialect: Send {
    /// Whether the CLI's stdout holds one JSON object per line (every stream-json and JSONL
    /// mode). Then a stdout line that is not a JSON object never reaches [`Dialect::stdout`]: it
    /// is read by [`StreamCore::plain_stdout`] (the classifier and the error message's last
    /// source). `false` for a plain-text CLI (exec), whose dialect reads every line.
    fn json_lines(&self) -> bool {
        true
    }

    /// Reads one stdout line into events, filling `core`. Never fails: lines that are not this
    /// CLI's format yield no event.
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent>;

    /// Reads one stderr line; by default [`StreamCore::stderr`].
    fn stderr(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        core.stderr(line)
    }

    /// Puts the last facts into `core` once the process ended (a fallback final text, totals,
    /// what the exit code says), before the report is built. By default nothing.
    fn settle(&mut self, _core: &mut StreamCore, _exit_code: Option<i32>) {}

    /// The error message of a failed run; by default [`StreamCore::error_message_chain`].
    fn error_message(&self, core: &StreamCore, _exit_code: Option<i32>) -> Option<String> {
        core.error_message_chain()
    }

    /// For a usage limit: when it resets; by default [`StreamCore::reset_time_from`]. A time
    /// in the past is fine here: [`StreamCore::finish`] judges it.
    fn reset_time(&self, core: &StreamCore, error_message: Option<&str>) -> Option<DateTime<Utc>> {
        core.reset_time_from(error_message)
    }

    /// The dialect's last word on the finished report (a hint added to the error message). By
    /// default nothing.
    fn annotate(&self, _report: &mut AgentReport) {}
}

/// A reader of one agent run: a [`Dialect`] over a [`StreamCore`], driven line by line.
#[derive(Debug, Default)]
pub struct Parser<D> {
    core: StreamCore,
    dialect: D,
}

impl<D: Dialect> Parser<D> {
    /// A parser reading `dialect`.
    pub fn with(dialect: D) -> Self {
        Parser {
            core: StreamCore::default(),
            dialect,
        }
    }

    /// The same parser, told which model ralph asked for (named when the agent says that it
    /// does not exist).
    pub fn for_model(mut self, model: Option<&str>) -> Self {
        self.core.requested_model = model.map(str::to_owned);
        self
    }
}

impl<D: Dialect + Default> Parser<D> {
    /// A parser for one run, with the dialect's default state.
    pub fn new() -> Self {
        Self::with(D::default())
    }
}

impl<D: Dialect> OutputParser for Parser<D> {
    fn on_line(&mut self, line: &OutputLine) -> Vec<AgentEvent> {
        self.core.line_is_json = false;
        match line.stream {
            StreamKind::Stdout
                if self.dialect.json_lines() && !looks_like_json_object(&line.text) =>
            {
                self.core.plain_stdout(&line.text)
            }
            StreamKind::Stdout => self.dialect.stdout(&line.text, &mut self.core),
            StreamKind::Stderr => self.dialect.stderr(&line.text, &mut self.core),
        }
    }

    fn line_is_json(&self) -> bool {
        self.core.line_is_json
    }

    fn finish(self: Box<Self>, exit_code: Option<i32>) -> AgentReport {
        let Parser { core, mut dialect } = *self;
        core.finish(&mut dialect, exit_code)
    }
}

/// Whether `line` can be a JSON object: its first non-blank character is `{`. A cheap test,
/// so that the readers parse each JSON line once; a line that starts with `{` and still does
/// not parse is left to the dialect (which yields no event for it).
fn looks_like_json_object(line: &str) -> bool {
    line.trim_start().starts_with('{')
}

/// `line` as a JSON object, or `None` for anything else (not JSON, an array, a string): the
/// CLIs keep stdout clean in their JSON modes, but a wrapper or a hook may not, and the
/// transcript keeps the raw line anyway.
pub fn json_object(line: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(line.trim()) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// The tokens under `key` in a usage object, 0 when missing.
pub fn tokens(usage: &Value, key: &str) -> u64 {
    usage.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// What the dialects' unit tests share: lines as the runner delivers them, and one run.
/// A tool's output as events keep it: bounded ([`crate::protocol::fields::bounded_output`]) and
/// with secret-looking environment values redacted; `None` when empty.
pub fn tool_output(text: &str) -> Option<String> {
    (!text.trim().is_empty())
        .then(|| crate::protocol::fields::bounded_output(&crate::redact::redact_env(text)))
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A stdout line.
    pub fn out(text: &str) -> OutputLine {
        OutputLine::stdout(text)
    }

    /// A stderr line.
    pub fn err(text: &str) -> OutputLine {
        OutputLine::stderr(text)
    }

    /// [`run`], with every tool result reduced to its error flag (most tests are about the
    /// rest of the stream; the outputs have tests of their own).
    pub fn run_plain<D: Dialect + Default>(
        lines: &[OutputLine],
        exit: Option<i32>,
    ) -> (Vec<AgentEvent>, AgentReport) {
        let (events, report) = run::<D>(lines, exit);
        let plain = events
            .into_iter()
            .map(|e| match e {
                AgentEvent::ToolResult { is_error, .. } => AgentEvent::tool_result(is_error),
                other => other,
            })
            .collect();
        (plain, report)
    }

    /// Feeds `lines` to a fresh `D` parser, then ends it with `exit`.
    pub fn run<D: Dialect + Default>(
        lines: &[OutputLine],
        exit: Option<i32>,
    ) -> (Vec<AgentEvent>, AgentReport) {
        let mut parser: Box<dyn OutputParser> = Box::new(Parser::<D>::new());
        let events = lines.iter().flat_map(|l| parser.on_line(l)).collect();
        (events, parser.finish(exit))
    }
}
