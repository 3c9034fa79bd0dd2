//! The terminal: a live status line while an iteration runs, one line per finished iteration,
//! warnings, and the final summary, all on stderr. `--quiet` keeps only warnings, failed
//! iterations and the summary. Colours and the live line are off when stderr is not a terminal
//! or `NO_COLOR` is set.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::{Datelike as _, Local, Utc};
use console::{style, Style};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Sink;
use crate::protocol::run_event::{RunSummary, WaitReason};
use crate::protocol::{AgentEvent, LedgerRecord, Outcome, RunEvent};

/// Lines of a failed verify command's output shown under its iteration's line.
const VERIFY_TAIL_SHOWN: usize = 6;

/// The terminal sink.
pub struct Human {
    /// Only warnings, nothing else (beside `--json`, whose stream carries the rest).
    warnings_only: bool,
    quiet: bool,
    verbose: bool,
    bar: Option<ProgressBar>,
    live_prefix: String,
    /// This run's cost so far (USD), `None` until an iteration reports one.
    run_cost: Option<f64>,
}

impl Human {
    /// A terminal sink; `quiet` keeps only warnings, failures and the summary, `verbose` adds the
    /// agent's command line, text and tool calls. Colours follow `NO_COLOR` and whether stderr is
    /// a terminal.
    pub fn new(quiet: bool, verbose: bool) -> Human {
        let tty = std::io::stderr().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        console::set_colors_enabled_stderr(tty && !no_color);
        Human {
            warnings_only: false,
            quiet,
            verbose,
            bar: None,
            live_prefix: String::new(),
            run_cost: None,
        }
    }

    /// A sink that prints only warnings on stderr: beside `--json`, so that a script reading
    /// stdout still shows a person what went wrong.
    pub fn warnings_only() -> Human {
        let mut sink = Human::new(true, false);
        sink.warnings_only = true;
        sink
    }

    /// Prints a line on stderr without tearing the live line (secrets redacted, crate::redact).
    fn eprint(&self, line: &str) {
        let line = crate::redact::redact_env(line);
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

    fn warn(&self, msg: &str) {
        self.eprint(&format!(
            "{} {msg}",
            style("warning:").yellow().bold().for_stderr()
        ));
    }

    fn info(&self, msg: &str) {
        if !self.quiet {
            self.eprint(msg);
        }
    }

    fn live_text(&self, tail: Option<String>) -> String {
        let tail = tail.map(|t| crate::redact::redact_env(&t));
        let cost = self.run_cost.map(usd);
        match (cost, tail) {
            (Some(c), Some(t)) => format!("{c} · {t}"),
            (Some(c), None) => c,
            (None, Some(t)) => t,
            (None, None) => String::new(),
        }
    }

    fn iteration_started(&mut self, prefix: String) {
        self.live_prefix = prefix;
        if self.quiet {
            return;
        }
        if !std::io::stderr().is_terminal() {
            self.eprint(&format!("▶ {}", self.live_prefix));
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(s) = ProgressStyle::with_template("{spinner} {prefix} · {elapsed} · {msg}") {
            bar.set_style(s);
        }
        bar.set_prefix(self.live_prefix.clone());
        bar.set_message(self.live_text(None));
        bar.enable_steady_tick(Duration::from_millis(120));
        self.bar = Some(bar);
    }

    fn agent_event(&self, event: &AgentEvent) {
        match event {
            AgentEvent::ToolCall { name, summary } => {
                if let Some(bar) = &self.bar {
                    bar.set_message(self.live_text(Some(format!("{name}: {summary}"))));
                }
                if self.verbose && !self.quiet {
                    self.eprint(&format!(
                        "  {} {name}: {summary}",
                        style("→").cyan().for_stderr()
                    ));
                }
            }
            AgentEvent::AssistantText { text } if self.verbose && !self.quiet => {
                for line in text.lines() {
                    self.eprint(&format!("  {}", style(line).dim().for_stderr()));
                }
            }
            _ => {}
        }
    }

    fn iteration_finished(&mut self, record: &LedgerRecord, slot: u32, max: u32) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if let Some(cost) = record.cost_usd {
            self.run_cost = Some(self.run_cost.unwrap_or(0.0) + cost);
        }
        if self.quiet {
            self.quiet_iteration(record);
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
            parts.push(usd(cost));
        }
        // The agent's own commits; ralph's checkpoint is not the agent's work.
        parts.push(plural(record.commits.len(), "commit"));
        parts.push(files_part(&record.files_changed));
        self.eprint(&format!(
            "{} {}",
            colour.apply_to(mark).for_stderr(),
            parts.join(" · ")
        ));
        if let Some(message) = record.primary_message() {
            self.eprint(&format!("    {}", style(message).dim().for_stderr()));
        }
        self.verify_tails(record);
        for finding in &record.findings {
            self.warn(&format!("iteration {}: {finding}", record.iteration));
        }
    }

    /// `--quiet`: one warning line for an iteration that did not move its story forward (its
    /// message says why, findings included), else the findings alone.
    fn quiet_iteration(&self, record: &LedgerRecord) {
        let moved = matches!(
            record.outcome,
            Outcome::StoryPassed
                | Outcome::Progress
                | Outcome::UsageLimit
                | Outcome::Transient
                | Outcome::Interrupted
        );
        if !moved {
            let why = record
                .primary_message()
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            self.warn(&format!(
                "iteration {} ({}): {}{why}",
                record.iteration,
                record.story_id,
                record.outcome.as_str(),
            ));
            self.verify_tails(record);
        } else {
            for finding in &record.findings {
                self.warn(&format!("iteration {}: {finding}", record.iteration));
            }
        }
    }

    /// The end of each failed verify command's output, indented under the iteration.
    fn verify_tails(&self, record: &LedgerRecord) {
        for v in record.verify_failures() {
            let lines: Vec<&str> = v.output_tail.lines().collect();
            if lines.is_empty() {
                continue;
            }
            let shown = &lines[lines.len().saturating_sub(VERIFY_TAIL_SHOWN)..];
            self.eprint(&format!(
                "    {}",
                style(format!(
                    "{}'s verify output (last {} lines):",
                    v.story_id,
                    shown.len()
                ))
                .dim()
                .for_stderr()
            ));
            for line in shown {
                self.eprint(&format!("    │ {}", style(line).dim().for_stderr()));
            }
        }
    }

    fn waiting(
        &self,
        reason: WaitReason,
        until: chrono::DateTime<Utc>,
        story: &str,
        n: u32,
        max: u32,
    ) {
        let left = (until - Utc::now()).to_std().unwrap_or_default();
        let left = humantime::format_duration(Duration::from_secs(left.as_secs().max(1)));
        match reason {
            WaitReason::UsageLimit => self.warn(&format!(
                "waiting for the usage limit to reset at {} (in {left}); Ctrl-C or `ralph stop` stops, `ralph run` later resumes the wait",
                reset_time_text(until),
            )),
            WaitReason::Retry => self.warn(&format!(
                "transient failure; retrying {story} in {left} (retry {n} of {max})"
            )),
        }
    }

    fn summary(&self, s: &RunSummary) {
        let head = if s.success {
            style(format!("ralph: {}", s.headline)).green().bold()
        } else {
            style(format!("ralph: {}", s.headline)).yellow().bold()
        };
        self.eprint(&format!("\n{}", head.for_stderr()));
        let open = if s.open.is_empty() {
            String::from("0 open")
        } else {
            // The first ten: a summary of 100,000 open stories is not a list of them.
            const SHOWN: usize = 10;
            let more = s.open.len().saturating_sub(SHOWN);
            let tail = if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            };
            format!(
                "{} open ({}{tail})",
                s.open.len(),
                s.open[..s.open.len().min(SHOWN)].join(", ")
            )
        };
        let iterations = match s.iteration_range {
            Some((a, b)) if a != b => format!("{} this run (#{a}–#{b})", s.iterations),
            Some((a, _)) => format!("1 this run (#{a})"),
            None => String::from("0 this run"),
        };
        let tokens = match (s.tokens_in, s.tokens_out) {
            (None, None) => None,
            (i, o) => Some(format!(
                "{} tokens in, {} out",
                i.unwrap_or(0),
                o.unwrap_or(0)
            )),
        };
        let cost = match (s.cost_usd, tokens) {
            (Some(c), Some(t)) => format!("{} ({t})", usd(c)),
            (Some(c), None) => usd(c),
            // No iteration ran, so there was nothing to report.
            (None, None) if s.iterations == 0 => "none this run (no iteration ran)".to_string(),
            (None, None) => "not reported by the agent".to_string(),
            (None, Some(t)) => format!("not reported ({t})"),
        };
        if let Some(why) = s.stop_reason.why() {
            self.eprint(&format!(
                "  {} {why}",
                style("why:").yellow().bold().for_stderr()
            ));
        }
        for caveat in &s.caveats {
            self.eprint(&format!(
                "  {} {caveat}",
                style("check:").yellow().bold().for_stderr()
            ));
        }
        let secs = Duration::from_secs(s.elapsed().as_secs());
        let by_agent = s
            .by_agent
            .iter()
            .map(|a| {
                let cost = a.cost_usd.map_or_else(|| "cost not reported".into(), usd);
                let n = a.iterations;
                format!(
                    "{} {cost} ({n} iteration{})",
                    a.agent,
                    if n == 1 { "" } else { "s" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let cost = match by_agent.is_empty() {
            true => cost,
            false => format!("{cost}; by agent: {by_agent}"),
        };
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

impl Sink for Human {
    fn on(&mut self, event: &RunEvent) {
        let warning = matches!(
            event,
            RunEvent::Warning { .. }
                | RunEvent::StoryBlocked { .. }
                | RunEvent::Waiting { .. }
                | RunEvent::AgentSwitched { .. }
                | RunEvent::Paused { .. }
                | RunEvent::Resumed { .. }
        );
        if self.warnings_only && !warning {
            return;
        }
        match event {
            RunEvent::Archived { message, .. } => self.info(message),
            RunEvent::RunStarted {
                run_id, settings, ..
            } => {
                self.info(&format!("ralph run {run_id}"));
                if !self.quiet {
                    for s in settings {
                        self.eprint(&format!(
                            "  {:<12} {}",
                            style(&s.key).dim().for_stderr(),
                            s.value
                        ));
                    }
                }
            }
            RunEvent::Notice { message } => self.info(message),
            RunEvent::Warning { message } => self.warn(message),
            RunEvent::IterationStarted {
                iteration,
                slot,
                max_iter,
                story_id,
                story_title,
                backend,
            } => self.iteration_started(format!(
                "iteration {iteration} ({slot}/{max_iter}) · {story_id} {story_title} · {backend}"
            )),
            RunEvent::AgentCommand { command } => {
                if self.verbose && !self.quiet {
                    self.eprint(&format!("  {} {command}", style("$").dim().for_stderr()));
                }
            }
            RunEvent::AgentEvent { agent_event } => self.agent_event(agent_event),
            RunEvent::VerifyStarted { story_id, command } => {
                self.info(&format!("  verify {story_id}: {command}"))
            }
            RunEvent::VerifyFinished { .. } => {}
            RunEvent::IterationFinished {
                record,
                slot,
                max_iter,
            } => self.iteration_finished(record, *slot, *max_iter),
            RunEvent::StoryBlocked {
                story_id,
                attempts,
                last_outcome,
                ..
            } => self.warn(&format!(
                "{story_id} is blocked after {attempts} attempt{} (last: {last_outcome}); moving on to the next story", if *attempts == 1 { "" } else { "s" }
            )),
            RunEvent::Waiting {
                reason,
                until,
                story_id,
                attempt,
                max,
            } => self.waiting(*reason, *until, story_id.as_deref().unwrap_or("the story"), *attempt, *max),
            RunEvent::AgentSwitched {
                from,
                to,
                reason,
                from_resets_at,
            } => self.warn(&switch_text(from, to, *reason, *from_resets_at)),
            RunEvent::Paused { since } => self.eprint(&format!(
                "{} by `ralph pause` (asked at {} UTC): no new iteration starts until `ralph resume` or `ralph stop`; prd.json and progress.txt are yours to edit meanwhile",
                style("paused:").yellow().bold().for_stderr(),
                since.format("%H:%M:%S")
            )),
            RunEvent::Resumed { paused_s } => self.eprint(&format!(
                "{} after {} paused",
                style("resumed:").bold().for_stderr(),
                humantime::format_duration(std::time::Duration::from_secs(*paused_s as u64))
            )),
            RunEvent::RunFinished(summary) => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                self.summary(summary)
            }
        }
    }
}

/// The live line of an agent switch: `switching from claude to codex: claude hit its usage
/// limit (resets at 14:00)`.
pub fn switch_text(
    from: &str,
    to: &str,
    reason: crate::protocol::run_event::SwitchReason,
    resets: Option<chrono::DateTime<Utc>>,
) -> String {
    use crate::protocol::run_event::SwitchReason;
    let why = match reason {
        SwitchReason::UsageLimit => match resets {
            Some(at) => format!(
                "{from} hit its usage limit (tried again after {})",
                reset_time_text(at)
            ),
            None => format!("{from} hit its usage limit"),
        },
        SwitchReason::AuthError => {
            format!(
                "{from} cannot log in and is out of this run (log it in again, then `ralph run`)"
            )
        }
        SwitchReason::ResetPassed => {
            format!("{to}'s usage limit should have reset; trying it again")
        }
    };
    format!("switching from {from} to {to}: {why}")
}

impl Drop for Human {
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

/// `1 commit`, `2 files`.
fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

pub use super::text::usd;

/// `14:00 +01:00` for a time today, `Tue 1 Dec 14:00 +01:00` later this year,
/// `2027-01-04 14:00 +01:00` otherwise (local time, with its offset from UTC).
pub fn reset_time_text(until: chrono::DateTime<Utc>) -> String {
    let local = until.with_timezone(&Local);
    let now = Local::now();
    if local.date_naive() == now.date_naive() {
        local.format("%H:%M %:z").to_string()
    } else if local.year() == now.year() && local > now {
        local.format("%a %-d %b %H:%M %:z").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M %:z").to_string()
    }
}

/// The files an iteration changed, for its line: `notes only` when every one is a run's memory
/// file (prd.json, progress.txt, progress-history/), which is not work.
fn files_part(files: &[String]) -> String {
    let note = |p: &String| {
        let path = std::path::Path::new(p);
        path.file_name()
            .is_some_and(|n| n == "prd.json" || n == "progress.txt")
            || path
                .components()
                .any(|c| c.as_os_str() == crate::progress::HISTORY_DIR)
    };
    if !files.is_empty() && files.iter().all(note) {
        return "notes only".to_owned();
    }
    format!("{} changed", plural(files.len(), "file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_cent_costs_keep_their_digits() {
        assert_eq!(usd(0.0047), "$0.0047");
        assert_eq!(usd(1.5), "$1.50");
        assert_eq!(usd(0.0), "$0.00");
    }
}
