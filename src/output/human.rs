//! The terminal: a live status line per iteration in flight (one in a serial run, one per
//! worker with `--parallel`, under an indicatif `MultiProgress`), one line per finished
//! iteration printed above the live lines, warnings, and the final summary, all on stderr.
//! `--quiet` keeps only warnings, failed iterations and the summary. Colours and the live lines
//! are off when stderr is not a terminal or `NO_COLOR` is set. While more than one iteration is
//! in flight, a line that belongs to one (`--verbose` agent lines, a verify command) starts with
//! `#<iteration>` so that it is never read as another's.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::{Datelike as _, Local, Utc};
use console::{style, Style};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

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
    /// Where the live lines are drawn: `Some` when stderr is a terminal.
    multi: Option<MultiProgress>,
    /// The iterations in flight, by number (started, not yet finished).
    live: BTreeMap<u32, Live>,
    /// Where lines go (stderr; a buffer in tests).
    err: Box<dyn Write + Send>,
    /// This run's cost so far (USD), `None` until an iteration reports one.
    run_cost: Option<f64>,
    /// An iteration ran on a worker (`--parallel`): verify lines always name their iteration.
    parallel: bool,
}

/// One iteration in flight.
struct Live {
    /// `iteration 3 (2/10) · US-002 Title · claude`, with ` · w2` under `--parallel`.
    prefix: String,
    /// Its live line (a terminal only).
    bar: Option<ProgressBar>,
}

impl Human {
    /// A terminal sink; `quiet` keeps only warnings, failures and the summary, `verbose` adds the
    /// agent's command line, text and tool calls. Colours follow `NO_COLOR` and whether stderr is
    /// a terminal.
    pub fn new(quiet: bool, verbose: bool) -> Human {
        let tty = std::io::stderr().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        console::set_colors_enabled_stderr(tty && !no_color);
        let multi = tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Human::with_writer(quiet, verbose, multi, Box::new(std::io::stderr()))
    }

    /// [`Human::new`] writing its lines to `err` and drawing its live lines on `multi` (`None`:
    /// no live lines, as when stderr is not a terminal); for tests.
    pub fn with_writer(
        quiet: bool,
        verbose: bool,
        multi: Option<MultiProgress>,
        err: Box<dyn Write + Send>,
    ) -> Human {
        Human {
            warnings_only: false,
            quiet,
            verbose,
            multi,
            live: BTreeMap::new(),
            parallel: false,
            err,
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

    /// Prints a line on stderr above the live lines, without tearing them (secrets redacted,
    /// crate::redact).
    fn eprint(&mut self, line: &str) {
        let line = crate::redact::redact_env(line);
        let err = &mut self.err;
        // A closed stderr (e.g. `| head`) must not stop the run: write errors are ignored.
        let mut write = || {
            let _ = writeln!(err, "{line}");
            let _ = err.flush();
        };
        match &self.multi {
            Some(multi) if self.live.values().any(|l| l.bar.is_some()) => multi.suspend(write),
            _ => write(),
        }
    }

    /// `#3 ` before a line of iteration 3 while another iteration is in flight too (empty in a
    /// serial run, whose lines are as they always were).
    fn tag(&self, iteration: u32) -> String {
        if self.live.len() > 1 {
            format!("#{iteration} ")
        } else {
            String::new()
        }
    }

    fn warn(&mut self, msg: &str) {
        self.eprint(&format!(
            "{} {msg}",
            style("warning:").yellow().bold().for_stderr()
        ));
    }

    fn info(&mut self, msg: &str) {
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

    fn iteration_started(&mut self, iteration: u32, prefix: String) {
        let mut live = Live { prefix, bar: None };
        if self.quiet {
            self.live.insert(iteration, live);
            return;
        }
        let Some(multi) = &self.multi else {
            let line = format!("▶ {}", live.prefix);
            self.live.insert(iteration, live);
            self.eprint(&line);
            return;
        };
        let bar = multi.add(ProgressBar::hidden());
        if let Ok(s) = ProgressStyle::with_template("{spinner} {prefix} · {elapsed} · {msg}") {
            bar.set_style(s);
        }
        bar.set_prefix(live.prefix.clone());
        bar.set_message(self.live_text(None));
        bar.enable_steady_tick(Duration::from_millis(120));
        live.bar = Some(bar);
        self.live.insert(iteration, live);
    }

    fn agent_event(&mut self, iteration: u32, event: &AgentEvent) {
        let tag = self.tag(iteration);
        match event {
            AgentEvent::ToolCall { name, summary } => {
                if let Some(bar) = self.live.get(&iteration).and_then(|l| l.bar.as_ref()) {
                    bar.set_message(self.live_text(Some(format!("{name}: {summary}"))));
                }
                if self.verbose && !self.quiet {
                    self.eprint(&format!(
                        "  {tag}{} {name}: {summary}",
                        style("→").cyan().for_stderr()
                    ));
                }
            }
            AgentEvent::AssistantText { text } if self.verbose && !self.quiet => {
                for line in text.lines() {
                    self.eprint(&format!("  {tag}{}", style(line).dim().for_stderr()));
                }
            }
            _ => {}
        }
    }

    /// Ends iteration `iteration`'s live line (all of them for `None`: the run is over).
    fn end_live(&mut self, iteration: Option<u32>) {
        let ended = match iteration {
            Some(n) => self.live.remove(&n).into_iter().collect(),
            None => std::mem::take(&mut self.live)
                .into_values()
                .collect::<Vec<_>>(),
        };
        for live in ended {
            if let Some(bar) = live.bar {
                bar.finish_and_clear();
                if let Some(multi) = &self.multi {
                    multi.remove(&bar);
                }
            }
        }
    }

    fn iteration_finished(&mut self, record: &LedgerRecord, slot: u32, max: u32) {
        self.end_live(Some(record.iteration));
        if let Some(cost) = record.cost_usd {
            self.run_cost = Some(self.run_cost.unwrap_or(0.0) + cost);
        }
        if self.quiet {
            self.quiet_iteration(record);
            return;
        }
        // An iteration that ended otherwise (a timeout) but left its story passing, its check
        // passed, is no failure: the line says both.
        let passed =
            record.outcome != Outcome::StoryPassed && super::text::passed_own_story(record);
        let (mark, colour) = if passed {
            outcome_style(Outcome::StoryPassed)
        } else {
            outcome_style(record.outcome)
        };
        let worker = record
            .worker
            .map(|w| format!(" [w{w}]"))
            .unwrap_or_default();
        let mut parts = vec![
            format!("iteration {} ({slot}/{max}){worker}", record.iteration),
            record.story_id.clone(),
        ];
        // A run with fallback agents names the agent of each iteration (its record's `agent`).
        if let Some(agent) = &record.agent {
            parts.push(agent_label(Some(agent), record.backend.as_str()));
        }
        parts.extend([
            colour
                .apply_to(if passed {
                    format!(
                        "{}, yet {} passes",
                        record.outcome.as_str(),
                        record.story_id
                    )
                } else {
                    record.outcome.as_str().to_owned()
                })
                .for_stderr()
                .to_string(),
            humantime::format_duration(Duration::from_secs(record.duration_s.round() as u64))
                .to_string(),
        ]);
        if let Some(cost) = record.cost_usd {
            parts.push(usd(cost));
        }
        // The agent's own commits; ralph's checkpoint is not the agent's work.
        parts.push(plural(record.commits.len(), "commit"));
        parts.push(files_part(&record.files_changed));
        if let Some(landing) = &record.landing {
            parts.push(format!("landed: {}", super::text::landing_short(landing)));
        }
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
    fn quiet_iteration(&mut self, record: &LedgerRecord) {
        let moved = matches!(
            record.outcome,
            Outcome::StoryPassed
                | Outcome::Progress
                | Outcome::UsageLimit
                | Outcome::Transient
                | Outcome::Interrupted
        ) || super::text::passed_own_story(record);
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
    fn verify_tails(&mut self, record: &LedgerRecord) {
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
        &mut self,
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

    fn summary(&mut self, s: &RunSummary) {
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
            RunEvent::Warning { message, .. } => self.warn(message),
            RunEvent::IterationStarted {
                iteration,
                slot,
                max_iter,
                story_id,
                story_title,
                backend,
                agent,
                worker,
            } => {
                self.parallel |= worker.is_some();
                let worker = worker.map(|w| format!(" · w{w}")).unwrap_or_default();
                let agent = agent_label(agent.as_deref(), backend);
                self.iteration_started(
                    *iteration,
                    format!(
                        "iteration {iteration} ({slot}/{max_iter}) · {story_id} {story_title} · {agent}{worker}"
                    ),
                )
            }
            RunEvent::AgentCommand { iteration, command } => {
                if self.verbose && !self.quiet {
                    let tag = self.tag(*iteration);
                    self.eprint(&format!(
                        "  {tag}{} {command}",
                        style("$").dim().for_stderr()
                    ));
                }
            }
            RunEvent::AgentEvent {
                iteration,
                agent_event,
            } => self.agent_event(*iteration, agent_event),
            RunEvent::VerifyStarted {
                iteration,
                story_id,
                command,
            } => {
                // A `--parallel` run's checks (in the worktree, or again at landing) always name
                // their iteration: a landing's re-check comes long after its agent's lines.
                let tag = if self.parallel {
                    format!("#{iteration} ")
                } else {
                    self.tag(*iteration)
                };
                self.info(&format!("  {tag}verify {story_id}: {command}"))
            }
            RunEvent::VerifyFinished { .. } => {}
            RunEvent::IterationFinished {
                record,
                slot,
                max_iter,
                ..
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
                self.end_live(None);
                self.summary(summary)
            }
        }
    }
}

/// How a line names the agent of an iteration: its profile name when the run has fallback
/// agents (`backup (codex)`, or just `claude` when the name is the backend's), else the backend.
pub(super) fn agent_label(agent: Option<&str>, backend: &str) -> String {
    match agent {
        Some(name) if name != backend => format!("{name} ({backend})"),
        Some(name) => name.to_owned(),
        None => backend.to_owned(),
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
        self.end_live(None);
    }
}

fn outcome_style(outcome: Outcome) -> (&'static str, Style) {
    match outcome {
        Outcome::StoryPassed => ("✓", Style::new().green()),
        Outcome::Progress => ("•", Style::new().cyan()),
        Outcome::Interrupted | Outcome::LandingRefused => ("■", Style::new().yellow()),
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

    use std::sync::{Arc, Mutex};

    use crate::protocol::record::{LandingKind, LandingRecord};

    const WIDTH: usize = 160;

    /// A terminal for tests: the screen's lines as a person would see them (cursor moves,
    /// clears and line wraps applied; colour codes dropped). The sink's lines and its live
    /// lines are both drawn on it, as both go to stderr.
    #[derive(Debug, Default, Clone)]
    struct Screen(Arc<Mutex<ScreenState>>);

    #[derive(Debug, Default)]
    struct ScreenState {
        lines: Vec<Vec<char>>,
        row: usize,
        col: usize,
        wrap: bool,
        escape: bool,
    }

    impl ScreenState {
        fn put(&mut self, text: &str) {
            for ch in text.chars() {
                if self.escape {
                    self.escape = !ch.is_ascii_alphabetic();
                    continue;
                }
                match ch {
                    '\x1b' => self.escape = true,
                    '\n' => {
                        self.row += 1;
                        self.col = 0;
                        self.wrap = false;
                    }
                    '\r' => {
                        self.col = 0;
                        self.wrap = false;
                    }
                    c => {
                        if self.wrap {
                            self.row += 1;
                            self.col = 0;
                            self.wrap = false;
                        }
                        while self.lines.len() <= self.row {
                            self.lines.push(Vec::new());
                        }
                        let line = &mut self.lines[self.row];
                        while line.len() <= self.col {
                            line.push(' ');
                        }
                        line[self.col] = c;
                        self.col += 1;
                        if self.col == WIDTH {
                            self.col -= 1;
                            self.wrap = true;
                        }
                    }
                }
            }
        }
    }

    impl Screen {
        /// The screen's non-empty lines, trailing blanks trimmed.
        fn lines(&self) -> Vec<String> {
            let s = self.0.lock().unwrap();
            s.lines
                .iter()
                .map(|l| l.iter().collect::<String>().trim_end().to_owned())
                .filter(|l| !l.is_empty())
                .collect()
        }

        /// Waits (at most 5 s) until the screen shows a line containing each of `parts`.
        fn wait_for(&self, parts: &[&str]) -> Vec<String> {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let lines = self.lines();
                if parts.iter().all(|p| lines.iter().any(|l| l.contains(p))) {
                    return lines;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the screen never showed {parts:?}: {lines:#?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            WIDTH as u16
        }
        fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            s.row = s.row.saturating_sub(n);
            s.wrap = false;
            Ok(())
        }
        fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            s.row += n;
            s.wrap = false;
            Ok(())
        }
        fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
            self.0.lock().unwrap().col += n;
            Ok(())
        }
        fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            s.col = s.col.saturating_sub(n);
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().put(&format!("{line}\n"));
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().put(text);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            let row = s.row;
            if let Some(line) = s.lines.get_mut(row) {
                line.clear();
            }
            s.col = 0;
            s.wrap = false;
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Write for Screen {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().put(&String::from_utf8_lossy(buf));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn started(iteration: u32, story: &str, worker: Option<u32>) -> RunEvent {
        RunEvent::IterationStarted {
            iteration,
            slot: iteration,
            max_iter: 5,
            story_id: story.into(),
            story_title: format!("Title of {story}"),
            backend: "claude".into(),
            agent: None,
            worker,
        }
    }

    fn said(iteration: u32, text: &str) -> RunEvent {
        RunEvent::AgentEvent {
            iteration,
            agent_event: AgentEvent::AssistantText { text: text.into() },
        }
    }

    fn finished(
        iteration: u32,
        story: &str,
        worker: Option<u32>,
        landing: Option<LandingRecord>,
    ) -> RunEvent {
        let mut record = LedgerRecord::new("r", iteration, story, Outcome::StoryPassed, Utc::now());
        record.worker = worker;
        record.landing = landing;
        RunEvent::IterationFinished {
            iteration,
            record: Box::new(record),
            slot: iteration,
            max_iter: 5,
        }
    }

    fn landing(kind: LandingKind, salvage: Option<&str>) -> Option<LandingRecord> {
        Some(LandingRecord {
            kind,
            onto: None,
            commit: None,
            salvage_ref: salvage.map(str::to_owned),
            files: Vec::new(),
            landed_since: Vec::new(),
            message: None,
            resolves: None,
        })
    }

    /// Not a terminal (a log file, CI): no live lines; two overlapping iterations (1 starts,
    /// 2 starts, 2 ends, 1 ends) give both outcome lines in the order they ended, each with its
    /// story, worker and landing, and every agent line while both run is tagged with its own
    /// iteration.
    #[test]
    fn overlapping_iterations_print_their_outcomes_in_finishing_order_each_with_its_story() {
        let screen = Screen::default();
        let mut sink = Human::with_writer(false, true, None, Box::new(screen.clone()));
        sink.on(&started(1, "US-001", Some(1)));
        sink.on(&said(1, "alone so far"));
        sink.on(&started(2, "US-002", Some(2)));
        sink.on(&said(1, "working on one"));
        sink.on(&said(2, "working on two"));
        sink.on(&RunEvent::VerifyStarted {
            iteration: 2,
            story_id: "US-002".into(),
            command: "make test".into(),
        });
        sink.on(&finished(
            2,
            "US-002",
            Some(2),
            landing(LandingKind::FastForward, None),
        ));
        sink.on(&said(1, "still one"));
        sink.on(&finished(
            1,
            "US-001",
            Some(1),
            landing(LandingKind::Conflict, Some("refs/ralph/salvage/r/US-001")),
        ));
        let lines = screen.lines();
        let expected_starts = [
            "▶ iteration 1 (1/5) · US-001 Title of US-001 · claude · w1",
            "▶ iteration 2 (2/5) · US-002 Title of US-002 · claude · w2",
        ];
        assert_eq!(lines[0], expected_starts[0], "{lines:#?}");
        assert_eq!(lines[1], "  alone so far", "{lines:#?}");
        assert_eq!(lines[2], expected_starts[1], "{lines:#?}");
        assert_eq!(
            &lines[3..6],
            [
                "  #1 working on one",
                "  #2 working on two",
                "  #2 verify US-002: make test"
            ],
            "{lines:#?}"
        );
        assert!(
            lines[6].starts_with("✓ iteration 2 (2/5) [w2] · US-002 · story_passed")
                && lines[6].ends_with("landed: ff"),
            "{lines:#?}"
        );
        // Iteration 1 is alone again: its lines are untagged, as in a serial run.
        assert_eq!(lines[7], "  still one", "{lines:#?}");
        assert!(
            lines[8].starts_with("✓ iteration 1 (1/5) [w1] · US-001 · story_passed")
                && lines[8].ends_with("landed: conflict → refs/ralph/salvage/r/US-001"),
            "{lines:#?}"
        );
        assert_eq!(lines.len(), 9, "{lines:#?}");
    }

    /// A terminal: one live line per iteration in flight, each with its iteration, story,
    /// agent, worker and elapsed time; an outcome line appears above the live lines when an
    /// iteration ends, and the live line of the one that ended goes while the other stays.
    #[test]
    fn a_terminal_shows_one_live_line_per_iteration_and_outcomes_above_them() {
        let screen = Screen::default();
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::term_like(Box::new(
            screen.clone(),
        )));
        let mut sink = Human::with_writer(false, false, Some(multi), Box::new(screen.clone()));
        sink.on(&started(1, "US-001", Some(1)));
        sink.on(&started(2, "US-002", Some(2)));
        let lines = screen.wait_for(&[
            "iteration 1 (1/5) · US-001 Title of US-001 · claude · w1 · ",
            "iteration 2 (2/5) · US-002 Title of US-002 · claude · w2 · ",
        ]);
        assert_eq!(lines.len(), 2, "two live lines: {lines:#?}");
        for line in &lines {
            // The elapsed time follows the worker: `… · w1 · 0s · `.
            let elapsed = line.split(" · ").nth(4).unwrap_or_default();
            let elapsed = elapsed.trim_end_matches(" ·");
            assert!(
                elapsed.ends_with('s') && elapsed[..elapsed.len() - 1].parse::<u64>().is_ok(),
                "{line}"
            );
        }
        sink.on(&finished(2, "US-002", Some(2), None));
        let lines = screen.wait_for(&["✓ iteration 2 (2/5) [w2] · US-002"]);
        assert!(
            lines[0].starts_with("✓ iteration 2 (2/5) [w2] · US-002"),
            "{lines:#?}"
        );
        assert!(
            lines[1].contains("iteration 1 (1/5) · US-001"),
            "{lines:#?}"
        );
        assert_eq!(
            lines.len(),
            2,
            "the outcome, then iteration 1's live line: {lines:#?}"
        );
        sink.on(&finished(1, "US-001", Some(1), None));
        let lines = screen.wait_for(&["✓ iteration 1 (1/5) [w1] · US-001"]);
        assert!(
            lines[0].starts_with("✓ iteration 2 (2/5) [w2] · US-002"),
            "{lines:#?}"
        );
        assert!(
            lines[1].starts_with("✓ iteration 1 (1/5) [w1] · US-001"),
            "{lines:#?}"
        );
        assert_eq!(lines.len(), 2, "no live line is left: {lines:#?}");
    }

    /// A serial run's lines carry no worker, no landing and no `#n` tags: what it always printed.
    #[test]
    fn a_serial_iteration_prints_what_it_always_printed() {
        let screen = Screen::default();
        let mut sink = Human::with_writer(false, true, None, Box::new(screen.clone()));
        sink.on(&started(1, "US-001", None));
        sink.on(&said(1, "hello"));
        sink.on(&finished(1, "US-001", None, None));
        let lines = screen.lines();
        assert_eq!(
            lines[0],
            "▶ iteration 1 (1/5) · US-001 Title of US-001 · claude"
        );
        assert_eq!(lines[1], "  hello");
        assert_eq!(
            lines[2],
            "✓ iteration 1 (1/5) · US-001 · story_passed · 0s · 0 commits · 0 files changed"
        );
    }

    #[test]
    fn sub_cent_costs_keep_their_digits() {
        assert_eq!(usd(0.0047), "$0.0047");
        assert_eq!(usd(1.5), "$1.50");
        assert_eq!(usd(0.0), "$0.00");
    }
}
