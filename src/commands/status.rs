//! `ralph status`: the stories, the next story, and the latest run's iterations from the ledger.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use console::style;
use serde_json::json;

use crate::cli::StatusArgs;
use crate::git::Repo;
use crate::history::{History, Source};
use crate::output::text::usd;
use crate::prd::store;
use crate::protocol::ExitStatus;
use crate::protocol::LedgerRecord;
use crate::state::State;
use crate::workspace::RunPaths;

/// Prints the status of the PRD at `args.prd` (default `./prd.json`); `--json` prints one JSON
/// document on stdout instead.
///
/// # Errors
/// An unreadable or invalid prd.json, an unreadable ledger or state file.
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let v = Status::load(args, &cwd)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v.json())?);
        return Ok(ExitStatus::Success);
    }
    v.print_heading();
    v.print_stories();
    v.print_why_open();
    v.print_now();
    v.print_latest_run();
    v.print_footer();
    Ok(ExitStatus::Success)
}

/// Everything `ralph status` shows, read once: prd.json (of the feature's branch when it is not
/// checked out here), the history, state.json (or what a lost one would hold) and the lock.
struct Status {
    /// The run's files in this checkout.
    paths: RunPaths,
    /// The repository's root.
    root: std::path::PathBuf,
    /// The prd.json shown: the feature branch's when it is not checked out here.
    loaded: std::sync::Arc<store::LoadedPrd>,
    /// The feature's branch, when its work is on a branch not checked out here.
    elsewhere: Option<String>,
    /// That branch, when what is shown was read from it.
    shown_from: Option<String>,
    /// Past iterations.
    history: History,
    /// state.json as `ralph run` would see it (the feature entered, spent stories blocked).
    state: State,
    /// state.json was missing: rebuilt from git's trailers.
    state_from_git: bool,
    /// prd.json's `branchName`.
    feature: Option<String>,
    /// The serial run's iteration in flight, with the live ralph holding the lock.
    running: Option<(crate::state::InFlight, crate::lock::LockInfo)>,
    /// `--parallel`: the live ralph holding the lock while `state.flights` are in flight.
    holder: Option<crate::lock::LockInfo>,
}

impl Status {
    fn load(args: &StatusArgs, cwd: &Path) -> anyhow::Result<Status> {
        let prd_path = crate::workspace::locate_prd(args.prd.as_deref(), cwd)?;
        // Shared: `History::load` reads the same prd.json (for its feature) without a second
        // parse.
        let checked_out = store::load_shared(&prd_path)?;
        let paths = RunPaths::of_prd(&checked_out.path);
        let root = paths.repo_root.clone();
        let repo = Repo::discover(&root).ok();
        let elsewhere = repo.as_ref().and_then(|r| {
            crate::history::feature_tip_elsewhere(r, checked_out.prd.branch_name.as_deref())
        });
        // The feature's branch is not checked out: what `ralph run` takes up is that branch's
        // prd.json and history, so those are what is shown.
        let at_branch = elsewhere.as_ref().and_then(|(_, sha)| {
            let repo = repo.as_ref()?;
            let rel = checked_out.path.strip_prefix(repo.root()).ok()?;
            let bytes = repo.file_at(sha, &rel.to_string_lossy()).ok()??;
            let loaded = std::sync::Arc::new(store::parse_bytes(&checked_out.path, &bytes).ok()?);
            let reader = Repo::discover(&root).ok()?.reading_history_at(sha).ok()?;
            Some((loaded, reader))
        });
        let (loaded, history_repo) = match at_branch {
            Some((loaded, reader)) => (loaded, Some(reader)),
            None => (checked_out, None),
        };
        let shown_from = history_repo
            .as_ref()
            .and(elsewhere.as_ref())
            .map(|(b, _)| b.clone());
        let elsewhere = elsewhere.map(|(b, _)| b);
        // Without `.ralph/` (deleted, or a fresh clone), git's trailers tell the story.
        let history = History::load(&paths, history_repo.as_ref().or(repo.as_ref()))?;
        let feature = loaded.prd.branch_name.clone();
        let (state, state_from_git) = as_run_sees_it(&paths, &history, &loaded, cwd);
        let running = state
            .in_flight
            .clone()
            .and_then(|f| live_lock_holder(&paths.ralph_dir).map(|h| (f, h)));
        // `--parallel`: every iteration in flight (state.json's `flights`), alive while the
        // run holding the lock is.
        let holder = (!state.flights.is_empty())
            .then(|| live_lock_holder(&paths.ralph_dir))
            .flatten();
        Ok(Status {
            paths,
            root,
            loaded,
            elsewhere,
            shown_from,
            history,
            state,
            state_from_git,
            feature,
            running,
            holder,
        })
    }

    /// The latest run's id and its records.
    fn latest(&self) -> (Option<String>, Vec<&LedgerRecord>) {
        let ledger = &self.history.records;
        let latest_run = ledger.last().map(|r| r.run_id.clone());
        let latest = ledger
            .iter()
            .filter(|r| Some(&r.run_id) == latest_run.as_ref())
            .collect();
        (latest_run, latest)
    }

    /// The story `ralph run` starts next: a story in flight on a worker (`--parallel`) is not
    /// the next one.
    fn next(&self) -> Option<&crate::prd::model::Story> {
        let busy: Vec<String> = self
            .state
            .blocked
            .iter()
            .cloned()
            .chain(self.state.flights.iter().map(|f| f.story_id.clone()))
            .collect();
        self.loaded.prd.next_story(&busy)
    }

    /// The iterations `ralph pause` waits for before the run holds: the serial one and every
    /// `--parallel` flight.
    fn finishing(&self) -> usize {
        let serial = self.state.in_flight.as_ref();
        serial.iter().count()
            + self
                .state
                .flights
                .iter()
                .filter(|f| serial.is_none_or(|s| s.iteration != f.iteration))
                .count()
    }

    /// A pause is asked and no iteration is in flight any more: the run holds.
    fn paused(&self) -> bool {
        crate::pause_request::pending(&self.paths.ralph_dir).is_some() && self.finishing() == 0
    }

    /// `ralph status --json`'s document.
    fn json(&self) -> serde_json::Value {
        let (latest_run, latest) = self.latest();
        let ledger = &self.history.records;
        let state = &self.state;
        let failures = last_failures(&self.history, self.feature.as_deref());
        let last_failure = |id: &str| failures.get(id).copied().flatten();
        let blocked: HashSet<&str> = state.blocked.iter().map(String::as_str).collect();
        let all = Totals::of(ledger.iter());
        let this_run = Totals::of(latest.iter().copied());
        let pause_requested = crate::pause_request::pending(&self.paths.ralph_dir).is_some();
        json!({
            "prd": self.loaded.path,
            "feature_branch_elsewhere": self.elsewhere,
            "shown_from": self.shown_from,
            "project": self.loaded.prd.project,
            "stories": self.loaded.prd.user_stories.iter().map(|s| json!({
                "id": s.id, "title": s.title, "priority": s.priority, "passes": s.passes,
                "attempts": state.attempts.get(&s.id).copied().unwrap_or(0),
                "blocked": blocked.contains(s.id.as_str()),
                "last_failure": (!s.passes).then(|| last_failure(&s.id)).flatten().map(|r| json!({
                    "iteration": r.iteration, "outcome": r.outcome, "message": r.message,
                    "verify": r.verify_failures().collect::<Vec<_>>()})),
            })).collect::<Vec<_>>(),
            "next_story": self.next().map(|s| s.id.clone()),
            "complete": self.loaded.prd.all_pass(),
            "latest_run": latest_run,
            "iterations": latest,
            "total_iterations": ledger.len(),
            "total_cost_usd": all.cost_usd,
            "total_tokens_in": all.tokens_in,
            "total_tokens_out": all.tokens_out,
            "latest_run_cost_usd": this_run.cost_usd,
            "latest_run_tokens_in": this_run.tokens_in,
            "latest_run_tokens_out": this_run.tokens_out,
            "cost_estimated": all.estimated,
            "resume_at": state.resume_at,
            "agent_resets": state.agent_resets,
            "stop_reason": state.stop_reason,
            // The wire name of the last iteration's outcome (state.json's), e.g. `usage_limit`.
            "last_outcome": state.last_outcome,
            "running": self.running.as_ref().map(|(flight, holder)| json!({
                "iteration": flight.iteration, "story_id": flight.story_id,
                "started_at": flight.started_at, "pid": holder.pid, "host": holder.host})),
            "flights": state.flights.iter().map(|f| json!({
                "iteration": f.iteration, "story_id": f.story_id, "run_id": f.run_id,
                "started_at": f.started_at, "elapsed_s": elapsed(f).as_secs(),
                "worker": f.worktree.as_ref().map(|w| w.worker),
                "worktree": f.worktree.as_ref().map(|w| self.paths.rel(&w.root)),
                "running": self.holder.is_some()})).collect::<Vec<_>>(),
            "source": self.history.source.as_str(),
            // Held: a pause asked and nothing in flight; `pausing`: the iterations it waits for.
            "paused": self.paused(),
            "pause_requested": pause_requested,
            "pausing": if pause_requested { self.finishing() } else { 0 },
            "pending_hints": crate::hints::pending(&self.paths.ralph_dir).iter()
                .map(crate::hints::Hint::record).collect::<Vec<_>>(),
            "notifications_failed": crate::notify::failed_deliveries(&self.paths.ralph_dir)
                .iter().map(|d| json!({"at": d.at, "kind": d.kind, "run_id": d.run_id,
                    "target": d.target, "attempts": d.attempts, "error": d.error,
                    "undelivered": d.undelivered})).collect::<Vec<_>>(),
        })
    }

    /// The project line, and a note when the feature's branch is not checked out here.
    fn print_heading(&self) {
        let prd = &self.loaded.prd;
        let passed = prd.user_stories.iter().filter(|s| s.passes).count();
        println!(
            "{} — {passed}/{} stories pass ({})",
            style(&prd.project).bold(),
            prd.user_stories.len(),
            self.loaded.path.display()
        );
        if let Some(b) = &self.shown_from {
            println!(
                "{} {b} is not checked out here; shown are its prd.json and history, which `ralph run` takes up (it checks {} out)",
                style("note:").yellow().bold(),
                b.trim_start_matches("origin/")
            );
        } else if let Some(b) = &self.elsewhere {
            println!(
                "{} this is prd.json as checked out here; the run's work is on {b}, not checked out (`git checkout {}` shows where it stands)",
                style("note:").yellow().bold(),
                b.trim_start_matches("origin/")
            );
        }
        println!();
    }

    /// The stories' table, by priority.
    fn print_stories(&self) {
        let prd = &self.loaded.prd;
        let blocked: HashSet<&str> = self.state.blocked.iter().map(String::as_str).collect();
        let statuses = crate::report::Statuses::new(prd, &self.state.blocked);
        let status_width = prd
            .user_stories
            .iter()
            .map(|s| statuses.of(&s.id).chars().count())
            .max()
            .unwrap_or(8)
            .max(8);
        println!(
            "  {:<10} {:<status_width$} {:>4}  {:>8}  TITLE",
            "ID", "STATUS", "PRIO", "ATTEMPTS"
        );
        let mut stories: Vec<_> = prd.user_stories.iter().collect();
        stories.sort_by_key(|s| s.priority);
        for s in stories {
            // Padded before it is coloured: colour codes would count as width.
            let text = format!("{:<status_width$}", statuses.of(&s.id));
            let status = if s.passes {
                style(text).green()
            } else if blocked.contains(s.id.as_str()) {
                style(text).red()
            } else {
                style(text).yellow()
            };
            println!(
                "  {:<10} {} {:>4}  {:>8}  {}",
                s.id,
                status,
                s.priority,
                self.state.attempts.get(&s.id).copied().unwrap_or(0),
                s.title
            );
        }
    }

    /// Why each open story has not passed yet: its last failed iteration.
    fn print_why_open(&self) {
        // One pass over the history, not one per story (issue 18: quadratic at 100,000
        // stories).
        let failures = last_failures(&self.history, self.feature.as_deref());
        let latest = last_records(&self.history, self.feature.as_deref());
        let mut why_lines = Vec::new();
        for s in self.loaded.prd.user_stories.iter().filter(|s| !s.passes) {
            let Some(r) = failures.get(s.id.as_str()).copied().flatten() else {
                continue;
            };
            let reason = r
                .message
                .as_deref()
                .map(|m| crate::protocol::fields::truncate_chars(m, 200))
                .unwrap_or_default();
            let colon = if reason.is_empty() { "" } else { ": " };
            // The failure that explains the story is not always its last iteration: a usage
            // limit, a transient error or an interruption since is named as what it last ended
            // with, the failure after it.
            match latest.get(s.id.as_str()).filter(|l| !std::ptr::eq(**l, r)) {
                Some(l) => why_lines.push(format!(
                    "  {} last ended {} (iteration {}); its last failure: {} (iteration {}){colon}{reason}",
                    s.id, l.outcome, l.iteration, r.outcome, r.iteration
                )),
                None => why_lines.push(format!(
                    "  {} last ended {} (iteration {}){colon}{reason}",
                    s.id, r.outcome, r.iteration
                )),
            }
            for v in r.verify_failures() {
                if let Some(last) = v.output_tail.lines().rev().find(|l| !l.trim().is_empty()) {
                    why_lines.push(format!("    {} output ends: {}", v.command, last.trim()));
                }
            }
        }
        if !why_lines.is_empty() {
            println!();
            println!("why open stories have not passed:");
            for line in why_lines {
                println!("{line}");
            }
        }
        println!();
    }

    /// The next story, what runs now, a pause, pending hints and usage-limit resets.
    fn print_now(&self) {
        let state = &self.state;
        match self.next() {
            Some(s) => println!("next story: {} {}", s.id, s.title),
            None if self.loaded.prd.all_pass() => println!("next story: none — every story passes"),
            None if !state.flights.is_empty() => println!(
                "next story: none free — every open story is in flight, blocked or waits for a dependency"
            ),
            None => {
                println!("next story: none — every open story is blocked or waits for a dependency")
            }
        }
        print_flights(&state.flights, self.holder.as_ref(), &self.paths);
        let single = state
            .in_flight
            .as_ref()
            .filter(|f| !state.flights.iter().any(|x| x.iteration == f.iteration));
        if let Some(flight) = single {
            match self.running.as_ref().map(|(_, h)| h) {
                Some(holder) => println!(
                    "running: iteration {} ({}) since {}, ralph pid {} on {}",
                    flight.iteration,
                    flight.story_id,
                    flight.started_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    holder.pid,
                    holder.host
                ),
                None => println!(
                    "interrupted: iteration {} ({}) was in flight when ralph stopped; `ralph run` checkpoints it and continues",
                    flight.iteration, flight.story_id
                ),
            }
        }
        self.print_pause();
        for h in crate::hints::pending(&self.paths.ralph_dir) {
            let to = h
                .story
                .as_deref()
                .map(|s| format!(" for {s}"))
                .unwrap_or_default();
            println!("pending hint {}{to}: {}", h.id, h.text);
        }
        print_resets(state, chrono::Utc::now());
        println!();
    }

    /// `ralph pause`: pausing while iterations are in flight (`--parallel`: until every one
    /// has landed), paused once none is.
    fn print_pause(&self) {
        if crate::pause_request::pending(&self.paths.ralph_dir).is_none() {
            return;
        }
        match self.finishing() {
            0 => println!("paused: no new iteration starts until `ralph resume` or `ralph stop`; prd.json and progress.txt are yours to edit"),
            1 if self.state.flights.is_empty() => println!("pausing: the run holds once the iteration above is recorded (`ralph resume` cancels)"),
            1 => println!("pausing: 1 iteration finishing; the run holds once it has landed (`ralph resume` cancels)"),
            n => println!("pausing: {n} iterations finishing; the run holds once they have landed (`ralph resume` cancels)"),
        }
    }

    /// The latest run's iterations, this run's and all runs' totals.
    fn print_latest_run(&self) {
        let (latest_run, latest) = self.latest();
        let Some(run) = &latest_run else {
            match &self.elsewhere {
                _ if self.running.is_some() => {
                    println!("no iteration recorded yet: the first one is running (see above)")
                }
                _ if !self.state.flights.is_empty() => println!(
                    "no iteration recorded yet: the run's first ones are in flight (see above)"
                ),
                Some(b) => println!(
                    "no runs on this branch: the run's iterations are on {b} (`git checkout {}`)",
                    b.trim_start_matches("origin/")
                ),
                None => println!("no runs yet: start one with `ralph run`"),
            }
            return;
        };
        let previous = self.running.as_ref().is_some_and(|(f, _)| f.run_id != *run);
        let label = if previous {
            "previous run"
        } else {
            "latest run"
        };
        println!("{label} {run}: {} iteration(s)", latest.len());
        print_iterations(&latest);
        println!(
            "{}: {} iteration(s), {}",
            if previous { "previous run" } else { "this run" },
            latest.len(),
            Totals::of(latest.iter().copied()).describe()
        );
        println!(
            "all runs: {} iteration(s), {}",
            self.history.records.len(),
            Totals::of(self.history.records.iter()).describe()
        );
    }

    /// How the last run stopped, undelivered notifications, and where the iterations come
    /// from.
    fn print_footer(&self) {
        if self.running.is_none() {
            if let Some(reason) = &self.state.stop_reason {
                // Its stories are those of the feature's branch, not of the prd.json shown
                // here.
                let on = self
                    .elsewhere
                    .as_deref()
                    .map(|b| format!(" (on {b})"))
                    .unwrap_or_default();
                println!("last run stopped{on}: {}", reason.sentence());
            }
        }
        let failed = crate::notify::failed_deliveries(&self.paths.ralph_dir);
        if let Some(last) = failed.last() {
            let of_run: Vec<_> = failed.iter().filter(|d| d.run_id == last.run_id).collect();
            println!(
                "notifications: {} not delivered in run {} (see .ralph/{}); last: {}",
                of_run.len(),
                last.run_id,
                crate::notify::DELIVERIES_FILE,
                last.describe()
            );
        }
        if self.history.source == Source::Git || self.state_from_git {
            println!(
                "from git history: .ralph/ is missing, so iterations and attempts come from the trailers of ralph's commits (no tokens, cost or durations)"
            );
        } else {
            let ledger = &self.paths.ledger;
            println!(
                "ledger: {}",
                ledger.strip_prefix(&self.root).unwrap_or(ledger).display()
            );
        }
    }
}

/// state.json as `ralph run` would see it (shown only; state.json is not written): rebuilt
/// from the history when it is missing (then the second value says whether from git), the
/// attempts and blocks of another feature dropped, and the stories whose attempts reached
/// `max_attempts` (of this directory's environment and ralph.toml) blocked.
fn as_run_sees_it(
    paths: &RunPaths,
    history: &History,
    loaded: &store::LoadedPrd,
    cwd: &Path,
) -> (State, bool) {
    let (mut state, from_git) = match State::load(&paths.ralph_dir).ok().flatten() {
        Some(state) => (state, false),
        None => (
            State::rebuild(&history.records, loaded.prd.branch_name.as_deref()),
            history.source == Source::Git,
        ),
    };
    state.enter_feature(loaded.prd.branch_name.as_deref());
    let max_attempts = crate::config::RunConfig::resolve_here(cwd)
        .map(|c| c.max_attempts)
        .unwrap_or_else(|_| crate::cli::settings::DefaultsFor::base().max_attempts());
    state.block_spent(&loaded.prd, max_attempts);
    (state, from_git)
}

/// The usage-limit resets ahead of `now`: the one a restarted run waits for, naming each agent
/// when every one of a run's fallback agents is limited, else each limited agent's (the run
/// goes on with the others meanwhile).
fn print_resets(state: &State, now: chrono::DateTime<chrono::Utc>) {
    let local = |at: &chrono::DateTime<chrono::Utc>| {
        at.with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M %:z")
            .to_string()
    };
    let resets: Vec<String> = state
        .agent_resets
        .iter()
        .filter(|(_, at)| **at > now)
        .map(|(name, at)| format!("{name} until {}", local(at)))
        .collect();
    match state.resume_at.filter(|t| *t > now) {
        Some(until) if resets.len() > 1 => println!(
            "usage limit: every agent is limited ({}); `ralph run` waits until the first resets, at {}",
            resets.join(", "),
            local(&until)
        ),
        Some(until) => println!(
            "usage limit: the agent's limit resets at {}; `ralph run` waits until then",
            local(&until)
        ),
        None if !resets.is_empty() => println!(
            "agents waiting for a usage-limit reset: {}",
            resets.join(", ")
        ),
        None => {}
    }
}

/// The latest run's table: one row per iteration, with its worker (`--parallel`) and its
/// agent (fallback agents) when the run had them.
fn print_iterations(latest: &[&LedgerRecord]) {
    // `--parallel`: each iteration's worker (a serial run's table is as it was).
    let workers = latest.iter().any(|r| r.worker.is_some());
    let worker = |r: Option<&LedgerRecord>| match (workers, r) {
        (false, _) => String::new(),
        (true, None) => format!("{:<4}", "W"),
        (true, Some(r)) => format!(
            "{:<4}",
            r.worker
                .map(|w| format!("w{w}"))
                .unwrap_or_else(|| "-".into())
        ),
    };
    // Fallback agents: each iteration's agent (a run with one agent's table is as it was).
    let agent_width = latest
        .iter()
        .filter_map(|r| r.agent.as_ref().map(|a| a.chars().count()))
        .max()
        .map(|w| w.max("AGENT".len()));
    let agent = |r: Option<&LedgerRecord>| match (agent_width, r) {
        (None, _) => String::new(),
        (Some(w), None) => format!("{:<w$} ", "AGENT"),
        (Some(w), Some(r)) => format!("{:<w$} ", r.agent.as_deref().unwrap_or("-")),
    };
    println!(
        "  {:<5} {}{}{:<10} {:<16} {:>7}  {:>8}  {:>15}  STARTED (UTC)",
        "#",
        worker(None),
        agent(None),
        "STORY",
        "OUTCOME",
        "TIME",
        "COST",
        "TOKENS IN/OUT"
    );
    for r in latest {
        let tokens = match (r.tokens_in, r.tokens_out) {
            (None, None) => "?".to_owned(),
            (i, o) => format!(
                "{}/{}",
                i.unwrap_or(0)
                    + r.cache_read_tokens.unwrap_or(0)
                    + r.cache_creation_tokens.unwrap_or(0),
                o.unwrap_or(0)
            ),
        };
        println!(
            "  {:<5} {}{}{:<10} {:<16} {:>7}  {:>8}  {:>15}  {}",
            r.iteration,
            worker(Some(r)),
            agent(Some(r)),
            r.story_id,
            r.outcome.as_str(),
            crate::output::text::record_secs(r),
            crate::output::text::usd_or_unknown(r.cost_usd),
            tokens,
            r.started_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
}

/// How long `f` has been running (from its start to now; zero for a start in the future).
fn elapsed(f: &crate::state::InFlight) -> std::time::Duration {
    (chrono::Utc::now() - f.started_at)
        .to_std()
        .unwrap_or_default()
}

/// `--parallel`: the iterations in flight, one line each (iteration, story, worker, elapsed,
/// worktree); said as interrupted when no ralph holds the lock any more.
fn print_flights(
    flights: &[crate::state::InFlight],
    holder: Option<&crate::lock::LockInfo>,
    paths: &RunPaths,
) {
    if flights.is_empty() {
        return;
    }
    match holder {
        Some(h) => println!(
            "in flight: {} iteration{} (ralph pid {} on {})",
            flights.len(),
            if flights.len() == 1 { "" } else { "s" },
            h.pid,
            h.host
        ),
        None => println!(
            "interrupted: {} when ralph stopped; `ralph run` recovers {} (the work lands, or is kept under refs/ralph/salvage/)",
            match flights.len() {
                1 => "1 iteration was in flight".to_owned(),
                n => format!("{n} iterations were in flight"),
            },
            if flights.len() == 1 { "it" } else { "each" }
        ),
    }
    let mut sorted: Vec<_> = flights.iter().collect();
    sorted.sort_by_key(|f| f.iteration);
    for f in sorted {
        let worker = f
            .worktree
            .as_ref()
            .map(|w| format!("w{}", w.worker))
            .unwrap_or_else(|| "-".into());
        let tree = f
            .worktree
            .as_ref()
            .map(|w| paths.rel(&w.root))
            .unwrap_or_else(|| "(the main checkout)".into());
        println!(
            "  #{:<4} {:<10} {:<3} {:>7}  since {}  {tree}",
            f.iteration,
            f.story_id,
            worker,
            crate::output::text::short_duration(std::time::Duration::from_secs(
                elapsed(f).as_secs()
            )),
            f.started_at.format("%H:%M:%S UTC"),
        );
    }
}

/// [`History::last_failure`] of every story at once, in one pass from the newest record: the
/// first decisive record of a story (not progress, a usage limit, a transient error or an
/// interruption) in `feature` decides, `None` when it passed the story. Stories with no
/// decisive record are absent.
fn last_failures<'h>(
    history: &'h History,
    feature: Option<&str>,
) -> HashMap<&'h str, Option<&'h LedgerRecord>> {
    use crate::protocol::Outcome;
    let mut out = HashMap::new();
    for r in history.records.iter().rev() {
        if r.feature.as_deref().is_some_and(|f| Some(f) != feature)
            || matches!(
                r.outcome,
                Outcome::Progress
                    | Outcome::UsageLimit
                    | Outcome::Transient
                    | Outcome::Interrupted
                    | Outcome::LandingRefused
            )
        {
            continue;
        }
        out.entry(r.story_id.as_str())
            .or_insert_with(|| (r.outcome != Outcome::StoryPassed).then_some(r));
    }
    out
}

/// The newest record of every story in feature `feature` (records without one count), in one
/// pass from the newest record: what each story's last iteration ended with, whatever it was.
fn last_records<'h>(
    history: &'h History,
    feature: Option<&str>,
) -> HashMap<&'h str, &'h LedgerRecord> {
    let mut out = HashMap::new();
    for r in history.records.iter().rev() {
        if r.feature.as_deref().is_some_and(|f| Some(f) != feature) {
            continue;
        }
        out.entry(r.story_id.as_str()).or_insert(r);
    }
    out
}

/// Token and cost totals over some ledger records.
struct Totals {
    /// USD, `None` when no record has a cost.
    cost_usd: Option<f64>,
    /// Whether part of the cost was computed from ralph.toml's price table.
    estimated: bool,
    /// Whether all of it was.
    all_estimated: bool,
    /// Input tokens, cached ones included.
    tokens_in: u64,
    /// Output tokens.
    tokens_out: u64,
    /// Whether any record reported tokens at all.
    tokens_reported: bool,
}

impl Totals {
    fn of<'a>(records: impl Iterator<Item = &'a LedgerRecord>) -> Totals {
        let mut t = Totals {
            cost_usd: None,
            estimated: false,
            all_estimated: true,
            tokens_in: 0,
            tokens_out: 0,
            tokens_reported: false,
        };
        for r in records {
            if let Some(c) = r.cost_usd {
                t.cost_usd = Some(t.cost_usd.unwrap_or(0.0) + c);
            }
            let priced = r.cost_source == Some(crate::protocol::CostSource::PriceTable);
            t.estimated |= priced;
            t.all_estimated &= priced || r.cost_usd.is_none();
            t.tokens_in += r.tokens_in.unwrap_or(0)
                + r.cache_read_tokens.unwrap_or(0)
                + r.cache_creation_tokens.unwrap_or(0);
            t.tokens_out += r.tokens_out.unwrap_or(0);
            t.tokens_reported |=
                r.tokens_in.is_some() || r.tokens_out.is_some() || r.cache_read_tokens.is_some();
        }
        t
    }

    /// `$1.23 (estimated from [prices]), 12345 tokens in, 678 out`.
    fn describe(&self) -> String {
        let cost = match self.cost_usd {
            None => "cost not reported".to_string(),
            Some(c) if self.all_estimated => format!("{} (estimated from [prices])", usd(c)),
            Some(c) if self.estimated => format!("{} (partly estimated from [prices])", usd(c)),
            Some(c) => usd(c),
        };
        if !self.tokens_reported {
            return format!("{cost}, tokens not reported");
        }
        format!(
            "{cost}, {} tokens in, {} out",
            self.tokens_in, self.tokens_out
        )
    }
}

/// The ralph run holding `.ralph/lock`, when its process is still alive.
fn live_lock_holder(ralph_dir: &Path) -> Option<crate::lock::LockInfo> {
    let text = std::fs::read_to_string(ralph_dir.join(crate::lock::LOCK_FILE)).ok()?;
    let info: crate::lock::LockInfo = serde_json::from_str(&text).ok()?;
    Path::new(&format!("/proc/{}", info.pid))
        .exists()
        .then_some(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Outcome;

    #[test]
    fn last_failures_in_one_pass_agree_with_the_history_reader() {
        let at = chrono::Utc::now();
        let mut records = Vec::new();
        let outcomes = [
            ("US-1", Outcome::VerifyFailed, None),
            ("US-1", Outcome::Progress, None),
            ("US-2", Outcome::StoryPassed, None),
            ("US-2", Outcome::AgentError, Some("ralph/other")),
            ("US-3", Outcome::NoProgress, None),
            ("US-3", Outcome::StoryPassed, Some("ralph/f")),
            ("US-4", Outcome::Interrupted, None),
            ("US-5", Outcome::Stalled, Some("ralph/f")),
            ("US-5", Outcome::UsageLimit, None),
        ];
        for (i, (story, outcome, feature)) in outcomes.into_iter().enumerate() {
            let mut r = LedgerRecord::new("run", i as u32 + 1, story, outcome, at);
            r.feature = feature.map(str::to_owned);
            records.push(r);
        }
        let history = History {
            records,
            source: crate::history::Source::Ledger,
        };
        for feature in [None, Some("ralph/f"), Some("ralph/other")] {
            let all = last_failures(&history, feature);
            for id in ["US-1", "US-2", "US-3", "US-4", "US-5", "US-6"] {
                assert_eq!(
                    all.get(id).copied().flatten().map(|r| r.iteration),
                    history.last_failure(id, feature).map(|r| r.iteration),
                    "{id} in {feature:?}"
                );
            }
        }
    }
}
