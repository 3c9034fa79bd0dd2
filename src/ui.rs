//! The terminal: a live status line while an iteration runs, one line per finished iteration, and
//! a final summary — all on stderr. With `--json`, machine-readable events go to stdout instead
//! (one JSON object per line) and stderr carries only warnings and errors.
//!
//! Colours and the live line are off when stderr is not a terminal or `NO_COLOR` is set.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use console::{style, Style};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::config::OutputMode;
use crate::protocol::AgentEvent;
use crate::protocol::LedgerRecord;
use crate::protocol::Outcome;

/// What the final summary reports.
#[derive(Debug, Clone)]
pub struct Summary {
    /// One-line headline, e.g. "complete: all 3 stories pass".
    pub headline: String,
    /// Whether the run ended well (exit 0).
    pub success: bool,
    /// Stories passing at the end.
    pub passed: usize,
    /// Stories still open at the end, by id.
    pub open: Vec<String>,
    /// Iterations run in this invocation.
    pub iterations: u32,
    /// First and last iteration numbers run in this invocation.
    pub iteration_range: Option<(u32, u32)>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Cost of this run in USD, when any agent reported one.
    pub cost_usd: Option<f64>,
    /// Input and output tokens of this run.
    pub tokens: (u64, u64),
    /// Path of the ledger, for display.
    pub ledger: String,
    /// What the user should do next.
    pub next: String,
    /// Things to check even when the run completed (e.g. stories marked passing outside their
    /// own iteration, stories deleted from the PRD).
    pub caveats: Vec<String>,
    /// When a usage limit the run stopped at resets (UTC), for scripts reading `--json`.
    pub resume_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Stories blocked after too many attempts.
    pub blocked: Vec<String>,
}

/// The terminal front end of `ralph run`.
pub struct Ui {
    mode: OutputMode,
    verbose: bool,
    bar: Option<ProgressBar>,
    live_prefix: String,
    run_cost: f64,
}

impl Ui {
    /// Sets up the terminal for `mode`. Colours follow `NO_COLOR` and whether stderr is a terminal.
    pub fn new(mode: OutputMode, verbose: bool) -> Ui {
        let tty = std::io::stderr().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        console::set_colors_enabled_stderr(tty && !no_color);
        Ui {
            mode,
            verbose,
            bar: None,
            live_prefix: String::new(),
            run_cost: 0.0,
        }
    }

    fn human(&self) -> bool {
        self.mode == OutputMode::Human
    }

    /// Prints a line on stderr without tearing the live line.
    fn eprint(&self, line: &str) {
        match &self.bar {
            // A closed stderr (e.g. `| head`) must not stop the run: write errors are ignored.
            Some(bar) => bar.suspend(|| {
                let _ = writeln!(std::io::stderr(), "{line}");
            }),
            None => {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }

    /// Writes one JSON event on stdout (JSON mode only).
    pub fn json_event(&self, event: &str, data: Value) {
        if self.mode != OutputMode::Json {
            return;
        }
        let mut record = json!({"event": event, "at": chrono::Utc::now().to_rfc3339()});
        if let (Some(obj), Value::Object(extra)) = (record.as_object_mut(), data) {
            obj.extend(extra);
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{record}");
        let _ = out.flush();
    }

    /// An informational line (human mode only).
    pub fn info(&self, msg: &str) {
        if self.human() {
            self.eprint(msg);
        }
    }

    /// A warning: always shown on stderr, and as an event in JSON mode.
    pub fn warn(&self, msg: &str) {
        self.eprint(&format!(
            "{} {msg}",
            style("warning:").yellow().bold().for_stderr()
        ));
        self.json_event("warning", json!({"message": msg}));
    }

    /// The effective settings, printed once before the first iteration.
    pub fn settings(&self, rows: &[(&str, String)]) {
        if !self.human() {
            return;
        }
        for (key, value) in rows {
            self.eprint(&format!("  {:<12} {value}", style(key).dim().for_stderr()));
        }
    }

    /// Starts the live line for an iteration.
    pub fn iteration_started(
        &mut self,
        iteration: u32,
        slot: u32,
        max: u32,
        story_id: &str,
        story_title: &str,
        backend: &str,
    ) {
        self.live_prefix =
            format!("iteration {iteration} ({slot}/{max}) · {story_id} {story_title} · {backend}");
        self.json_event(
            "iteration_started",
            json!({"iteration": iteration, "slot": slot, "max_iter": max, "story_id": story_id,
                "story_title": story_title, "backend": backend}),
        );
        if !self.human() {
            return;
        }
        if !std::io::stderr().is_terminal() {
            self.eprint(&format!("▶ {}", self.live_prefix));
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let template = "{spinner} {prefix} · {elapsed} · {msg}";
        if let Ok(s) = ProgressStyle::with_template(template) {
            bar.set_style(s);
        }
        bar.set_prefix(self.live_prefix.clone());
        bar.set_message(self.cost_text(0.0));
        bar.enable_steady_tick(Duration::from_millis(120));
        self.bar = Some(bar);
    }

    fn cost_text(&self, iteration_cost: f64) -> String {
        format!("${:.2}", self.run_cost + iteration_cost)
    }

    /// With `--verbose`, prints the agent's command line (pasteable into a shell; see
    /// [`crate::process::SpawnSpec::shell_line`]); in JSON mode it is the `command` field of an
    /// `agent_command` event.
    pub fn agent_command(&self, line: &str) {
        if self.verbose && self.human() {
            self.eprint(&format!("  {} {line}", style("$").dim().for_stderr()));
        }
        if self.verbose {
            self.json_event("agent_command", json!({"command": line}));
        }
    }

    /// Updates the live line from an agent event; with `--verbose`, prints the agent's text and
    /// tool calls.
    pub fn agent_event(&self, event: &AgentEvent) {
        match event {
            AgentEvent::ToolCall { name, summary } => {
                if let Some(bar) = &self.bar {
                    bar.set_message(format!("{} · {name}: {summary}", self.cost_text(0.0)));
                }
                if self.verbose && self.human() {
                    self.eprint(&format!(
                        "  {} {name}: {summary}",
                        style("→").cyan().for_stderr()
                    ));
                }
            }
            AgentEvent::AssistantText { text } if self.verbose && self.human() => {
                for line in text.lines() {
                    self.eprint(&format!("  {}", style(line).dim().for_stderr()));
                }
            }
            _ => {}
        }
        if self.verbose {
            self.json_event("agent_event", json!({"agent_event": event}));
        }
    }

    /// Ends the live line and prints the iteration's outcome line.
    pub fn iteration_finished(&mut self, record: &LedgerRecord, slot: u32, max: u32) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.run_cost += record.cost_usd.unwrap_or(0.0);
        self.json_event("iteration_finished", json!({"record": record}));
        if self.mode == OutputMode::Quiet
            && record.outcome != Outcome::Progress
            && record.outcome.is_failure()
        {
            let detail = record.message.as_deref().unwrap_or("");
            self.eprint(&format!(
                "{} iteration {} ({}): {} {detail}",
                style("warning:").yellow().bold().for_stderr(),
                record.iteration,
                record.story_id,
                record.outcome.as_str()
            ));
        }
        if !self.human() {
            return;
        }
        let (mark, colour) = outcome_style(record.outcome);
        let mut parts = vec![
            format!("iteration {} ({slot}/{max})", record.iteration),
            record.story_id.clone(),
            colour
                .apply_to(record.outcome.as_str())
                .for_stderr()
                .to_string(),
            humantime::format_duration(Duration::from_secs(record.duration_s.round() as u64))
                .to_string(),
        ];
        if let Some(cost) = record.cost_usd {
            parts.push(format!("${cost:.2}"));
        }
        let commits = record.commits.len() + usize::from(record.checkpoint_commit.is_some());
        parts.push(format!(
            "{commits} commit{}",
            if commits == 1 { "" } else { "s" }
        ));
        self.eprint(&format!(
            "{} {}",
            colour.apply_to(mark).for_stderr(),
            parts.join(" · ")
        ));
        if let Some(message) = &record.message {
            self.eprint(&format!("    {}", style(message).dim().for_stderr()));
        }
    }

    /// Prints the final summary (all modes except JSON print it on stderr).
    pub fn summary(&self, s: &Summary) {
        self.json_event(
            "run_finished",
            json!({
                "headline": s.headline, "success": s.success, "passed": s.passed, "open": s.open,
                "iterations": s.iterations, "elapsed_s": s.elapsed.as_secs_f64(),
                "cost_usd": s.cost_usd, "tokens_in": s.tokens.0, "tokens_out": s.tokens.1,
                "ledger": s.ledger, "caveats": s.caveats,
                "resume_at": s.resume_at.map(|t| t.to_rfc3339()), "blocked": s.blocked,
            }),
        );
        if self.mode == OutputMode::Json {
            return;
        }
        let head = if s.success {
            style(format!("ralph: {}", s.headline)).green().bold()
        } else {
            style(format!("ralph: {}", s.headline)).yellow().bold()
        };
        self.eprint(&format!("\n{}", head.for_stderr()));
        let open = if s.open.is_empty() {
            String::from("0 open")
        } else {
            format!("{} open ({})", s.open.len(), s.open.join(", "))
        };
        let iterations = match s.iteration_range {
            Some((a, b)) if a != b => format!("{} this run (#{a}–#{b})", s.iterations),
            Some((a, _)) => format!("1 this run (#{a})"),
            None => String::from("0 this run"),
        };
        let secs = Duration::from_secs(s.elapsed.as_secs());
        let cost = match s.cost_usd {
            Some(c) => format!("${c:.2} ({} tokens in, {} out)", s.tokens.0, s.tokens.1),
            None if s.tokens == (0, 0) => "not reported by the agent".to_string(),
            None => format!(
                "not reported ({} tokens in, {} out)",
                s.tokens.0, s.tokens.1
            ),
        };
        for caveat in &s.caveats {
            // The reason a run stopped reads as such; everything else is for the reader to check.
            let label = if caveat.starts_with("stopped") {
                "why:"
            } else {
                "check:"
            };
            self.eprint(&format!(
                "  {} {caveat}",
                style(label).yellow().bold().for_stderr()
            ));
        }
        for (k, v) in [
            ("stories", format!("{} passed, {open}", s.passed)),
            ("iterations", iterations),
            ("time", humantime::format_duration(secs).to_string()),
            ("cost", cost),
            ("ledger", s.ledger.clone()),
            ("next", s.next.clone()),
        ] {
            self.eprint(&format!("  {:<11} {v}", style(k).dim().for_stderr()));
        }
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn outcome_style(outcome: Outcome) -> (&'static str, Style) {
    match outcome {
        Outcome::StoryPassed => ("✓", Style::new().green()),
        Outcome::Progress => ("•", Style::new().cyan()),
        Outcome::Interrupted => ("■", Style::new().yellow()),
        Outcome::NoProgress
        | Outcome::PrematureClaim
        | Outcome::UsageLimit
        | Outcome::Transient => ("!", Style::new().yellow()),
        _ => ("✗", Style::new().red()),
    }
}
