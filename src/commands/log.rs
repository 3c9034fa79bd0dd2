//! `ralph log`: every iteration across runs, one line each, newest last, from the one reader of
//! history ([`crate::history`]): the ledger, or, without `.ralph/`, the trailers of ralph's
//! commits (fewer columns, and it says so). Pages like git when stdout is a terminal.
//!
//! ```text
//!     #  RUN             STORY   OUTCOME          TIME   COST  COMMITS  FILES  WHY
//!     3  12-01 12:03:54  US-002  verify_failed    1m03s  $0.21        0      2  verify failed for US-002: …
//! ```
//!
//! A `--parallel` iteration's reason starts with its worker and how its work landed (`[w2 ff]`,
//! `[w3 merge]`); work that did not land gets a line naming the ref that keeps it, in full
//! (`↳ conflict → refs/ralph/salvage/<run>/<story>`).

use std::fmt::Write as _;

use chrono::{DateTime, NaiveDate, Utc};

use crate::cli::LogArgs;
use crate::error::UserError;
use crate::git::Repo;
use crate::history::{History, Source};
use crate::output::text::{
    landing_kind, landing_short, reason, run_label, short_secs, usd_or_unknown,
};
use crate::protocol::{ExitStatus, LedgerRecord, Outcome};
use crate::workspace::RunPaths;

/// Prints the log (see the module docs).
///
/// # Errors
/// No prd.json found, an unreadable ledger, a bad filter (naming the flag and the fix).
pub fn run(args: &LogArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_books(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);
    let repo = Repo::discover(&paths.repo_root).ok();
    let history = History::load(&paths, repo.as_ref())?;
    let records = select(&history, args)?;
    if args.json {
        let mut out = String::new();
        for r in &records {
            out.push_str(&serde_json::to_string(r)?);
            out.push('\n');
        }
        // What ralph prints carries no secret, even from a ledger written before redaction.
        print!("{}", crate::redact::redact_env(&out));
        return Ok(ExitStatus::Success);
    }
    let mut text = render(&records, history.source);
    if history.source == Source::Empty {
        let feature = crate::prd::store::load(&prd)
            .ok()
            .and_then(|l| l.prd.branch_name);
        if let Some(b) = repo
            .as_ref()
            .and_then(|r| crate::history::feature_elsewhere(r, feature.as_deref()))
        {
            text.push_str(&format!(
                "the run's iterations are on {b}, not checked out here: `git checkout {}`\n",
                b.trim_start_matches("origin/")
            ));
        }
    }
    // Notifications about the runs shown that did not go out.
    let failed: Vec<_> = crate::notify::failed_deliveries(&paths.ralph_dir)
        .into_iter()
        .filter(|d| records.iter().any(|r| r.run_id == d.run_id))
        .collect();
    if !failed.is_empty() {
        text.push_str(&format!(
            "\nnotifications not delivered ({}, see .ralph/{}):\n",
            failed.len(),
            crate::notify::DELIVERIES_FILE
        ));
        for d in &failed {
            text.push_str(&format!("  {}\n", d.describe()));
        }
    }
    let text = crate::output::text::readable(&text);
    if args.no_pager {
        print!("{text}");
    } else {
        crate::process::pager::page(&text);
    }
    Ok(ExitStatus::Success)
}

/// The records `args` asks for, oldest first.
fn select<'a>(history: &'a History, args: &LogArgs) -> Result<Vec<&'a LedgerRecord>, UserError> {
    let outcomes = args
        .outcome
        .iter()
        .map(|o| {
            o.trim().parse::<Outcome>().map_err(|e| {
                UserError::usage(format!("--outcome: {e}"))
                    .with_hint("name outcomes as the ledger does, comma-separated")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let run = match &args.run {
        Some(wanted) => Some(
            history
                .resolve_run(wanted)
                .map_err(|e| UserError::usage(format!("--run: {e}")))?,
        ),
        None => None,
    };
    let since = args.since.as_deref().map(parse_since).transpose()?;
    let mut out: Vec<&LedgerRecord> = history
        .records
        .iter()
        .filter(|r| run.as_deref().is_none_or(|id| r.run_id == id))
        .filter(|r| args.story.as_deref().is_none_or(|s| r.story_id == s))
        .filter(|r| outcomes.is_empty() || outcomes.contains(&r.outcome))
        .filter(|r| since.is_none_or(|t| r.started_at >= t))
        .collect();
    if let Some(n) = args.max_count {
        out.drain(..out.len().saturating_sub(n));
    }
    Ok(out)
}

/// `--since`: an RFC 3339 time, a date (local midnight), or an age (`12h`, `3days`).
fn parse_since(text: &str) -> Result<DateTime<Utc>, UserError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            if let Some(local) = t.and_local_timezone(chrono::Local).earliest() {
                return Ok(local.with_timezone(&Utc));
            }
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        if let Some(local) = d
            .and_hms_opt(0, 0, 0)
            .and_then(|t| t.and_local_timezone(chrono::Local).earliest())
        {
            return Ok(local.with_timezone(&Utc));
        }
    }
    if let Ok(age) = humantime::parse_duration(text) {
        if let Ok(age) = chrono::Duration::from_std(age) {
            return Ok(Utc::now() - age);
        }
    }
    Err(
        UserError::usage(format!("--since {text}: not a date, time or age"))
            .with_hint("write 2026-12-01, 2026-12-01T08:00:00Z, or an age such as 12h or 3days"),
    )
}

/// What a row's one-line reason cannot hold and a reader must not miss, in full: a history
/// rewrite by the agent (with the reference that keeps its commits), acceptance criteria it
/// proposed (kept in the ledger, shown whole by `ralph show`).
fn notes(r: &LedgerRecord) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(h) = &r.history_rewrite {
        out.push(match (&h.kept_at, h.restored) {
            (Some(kept), true) => format!(
                "the agent rewrote history; ralph put its checkpoints back ({} is on the branch again); the agent's history is kept at {kept}",
                h.start
            ),
            _ if h.pruned() => format!(
                "the agent destroyed history; ralph could not put it back ({})",
                h.error.as_deref().unwrap_or("")
            ),
            _ => format!(
                "the agent rewrote history; ralph did not put it back ({}); the iteration's start {} is kept at refs/ralph/{}/{}/start",
                h.error.as_deref().unwrap_or("unknown reason"),
                h.start,
                r.run_id,
                r.iteration
            ),
        });
    }
    for p in &r.criteria_proposals {
        out.push(format!(
            "the agent proposed new acceptance criteria for {} (put back; `ralph show {}` shows them)",
            p.story_id, r.iteration
        ));
    }
    if !r.passes_refused.is_empty() {
        out.push(format!(
            "passes not counted (set back to false): {}",
            r.passes_refused.join(", ")
        ));
    }
    if let Some(l) = r.landing.as_ref().filter(|l| l.salvage_ref.is_some()) {
        let files = match l.files.as_slice() {
            [] => String::new(),
            files => format!(" (in conflict: {})", files.join(", ")),
        };
        out.push(format!("{}{files}", landing_short(l)));
    }
    out
}

/// `[w2 ff] ` before a `--parallel` iteration's reason (with the fallback agent's name when
/// there is one: `[w2 merge · codex] `); `[codex] ` or nothing in a serial run.
fn tag(r: &LedgerRecord) -> String {
    let mut parts = Vec::new();
    if let Some(w) = r.worker {
        parts.push(match &r.landing {
            Some(l) => format!("w{w} {}", landing_kind(l.kind)),
            None => format!("w{w}"),
        });
    }
    if let Some(agent) = &r.agent {
        parts.push(agent.clone());
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!("[{}] ", parts.join(" · ")),
    }
}

/// The table.
fn render(records: &[&LedgerRecord], source: Source) -> String {
    let mut out = String::new();
    if records.is_empty() {
        out.push_str(match source {
            Source::Empty => "no iterations recorded yet: start with `ralph run`\n",
            _ => "no iteration matches\n",
        });
        return out;
    }
    let git = source == Source::Git;
    let _ = writeln!(
        out,
        "{:>5}  {:<14}  {:<10}  {:<15}  {:>6}  {:>7}  {:>7}  {:>5}  WHY",
        "#", "RUN", "STORY", "OUTCOME", "TIME", "COST", "COMMITS", "FILES"
    );
    let mut some_from_git = false;
    for r in records {
        some_from_git |= r.from_git;
        let (time, cost, commits, files) = if git || r.from_git {
            ("-".into(), "-".into(), "-".into(), "-".into())
        } else {
            (
                short_secs(r.duration_s),
                usd_or_unknown(r.cost_usd),
                r.commits.len().to_string(),
                r.files_changed.len().to_string(),
            )
        };
        let _ = writeln!(
            out,
            "{:>5}  {:<14}  {:<10}  {:<15}  {:>6}  {:>7}  {:>7}  {:>5}  {}{}",
            r.iteration,
            run_label(&r.run_id),
            r.story_id,
            r.outcome.as_str(),
            time,
            cost,
            commits,
            files,
            // Its worker and landing (`--parallel`), the agent that ran it (fallback agents).
            tag(r),
            reason(r)
        );
        for note in notes(r) {
            let _ = writeln!(out, "{:>5}  ↳ {note}", "");
        }
    }
    if git {
        out.push_str(
            "from git history: .ralph/ is missing, so only what ralph's commit trailers keep is shown (no durations, costs, changes or reasons)\n",
        );
    } else if some_from_git {
        out.push_str(
            "rows with - are from git history (before this ledger began, e.g. .ralph/ was deleted): only what ralph's commit trailers keep is shown\n",
        );
    }
    out
}
