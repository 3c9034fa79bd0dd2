//! The morning report: what a run (or every run) did, as data ([`Report`], also `ralph report
//! --json`), rendered as one self-contained HTML file ([`html`]) or Markdown ([`markdown`]).
//! Built from the one reader of history ([`crate::history`]), prd.json, state.json, progress.txt's
//! Codebase Patterns and git (each iteration's diff).

pub mod html;
pub mod markdown;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::git::Repo;
use crate::history::{History, Source};
use crate::prd::model::Prd;
use crate::protocol::{LedgerRecord, Outcome, StopReason};
use crate::state::State;

/// Largest diff embedded per iteration, in bytes.
pub const DIFF_MAX_BYTES: usize = 48 * 1024;
/// Iterations whose diffs are embedded (the newest ones); older cards link nothing.
pub const DIFF_MAX_ITERATIONS: usize = 300;

/// Which runs a report covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The newest run.
    Latest,
    /// One run, by id.
    Run(String),
    /// Every run.
    All,
}

/// A report, ready to render.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// prd.json's `project`.
    pub project: String,
    /// prd.json's `branchName`.
    pub branch: Option<String>,
    /// What it covers, e.g. `run 20261201T120354-4eba` or `all 3 runs`.
    pub scope: String,
    /// When it was made (RFC 3339 UTC).
    pub generated_at: String,
    /// Where the history came from (`ledger` or `git`).
    pub source: String,
    /// The numbers.
    pub summary: Summary,
    /// One row per story, in priority order.
    pub stories: Vec<StoryRow>,
    /// The timeline chart.
    pub timeline: Timeline,
    /// One entry per iteration, in order: cumulative cost and tokens.
    pub cumulative: Vec<Cumulative>,
    /// One card per iteration, in order.
    pub iterations: Vec<Card>,
    /// progress.txt's `## Codebase Patterns` section (without its heading).
    pub patterns: String,
}

/// The report's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Stories in prd.json.
    pub stories: usize,
    /// Stories passing.
    pub passed: usize,
    /// Stories open (blocked ones included).
    pub open: usize,
    /// Stories blocked.
    pub blocked: usize,
    /// Iterations covered.
    pub iterations: usize,
    /// Wall time from the first iteration's start to the last one's end, in seconds.
    pub wall_s: f64,
    /// Cost in USD; `None` when no iteration reported one.
    pub cost_usd: Option<f64>,
    /// Input tokens (cached included); `None` when none were reported.
    pub tokens_in: Option<u64>,
    /// Output tokens; `None` when none were reported.
    pub tokens_out: Option<u64>,
    /// Why the latest run stopped, when the report covers it and state.json knows.
    pub stop_reason: Option<StopReason>,
    /// That reason in one sentence.
    pub stop_text: Option<String>,
    /// When the run can resume by itself (the reset of the usage limit it stopped at), RFC 3339
    /// UTC.
    pub resume_at: Option<String>,
    /// Outcomes and how many iterations ended with each.
    pub outcomes: BTreeMap<String, usize>,
}

/// One story's row.
#[derive(Debug, Clone, Serialize)]
pub struct StoryRow {
    /// Its id.
    pub id: String,
    /// Its title.
    pub title: String,
    /// `passes`, `open`, `blocked`, or `waits for US-001 (blocked)`.
    pub status: String,
    /// Iterations it took in the covered runs.
    pub iterations: usize,
    /// Its last outcome in the covered runs.
    pub last_outcome: Option<Outcome>,
    /// Its cost in USD; `None` when unknown.
    pub cost_usd: Option<f64>,
    /// From its first iteration's start to the end of the iteration that passed it, in seconds.
    pub time_to_pass_s: Option<f64>,
}

/// The timeline: one row per story, one bar per iteration, positioned in time (percent of the
/// covered span), waits shown as bands.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// The start of the span (RFC 3339).
    pub start: String,
    /// The end of the span (RFC 3339).
    pub end: String,
    /// The rows, in priority order.
    pub rows: Vec<TimelineRow>,
    /// Waits (usage limits, retry backoff) between iterations.
    pub waits: Vec<Band>,
}

/// One story's row of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineRow {
    /// The story.
    pub story_id: String,
    /// Its bars.
    pub bars: Vec<Bar>,
}

/// One iteration's bar.
#[derive(Debug, Clone, Serialize)]
pub struct Bar {
    /// The iteration.
    pub iteration: u32,
    /// Its outcome (the bar's colour class).
    pub outcome: Outcome,
    /// Start, in percent of the span.
    pub left: f64,
    /// Width, in percent of the span (at least a sliver, so every bar shows).
    pub width: f64,
    /// The tooltip.
    pub title: String,
}

/// A wait between iterations.
#[derive(Debug, Clone, Serialize)]
pub struct Band {
    /// `usage_limit` or `retry`.
    pub kind: String,
    /// Start, in percent of the span.
    pub left: f64,
    /// Width, in percent of the span.
    pub width: f64,
    /// The tooltip.
    pub title: String,
}

/// The running totals after one iteration.
#[derive(Debug, Clone, Serialize)]
pub struct Cumulative {
    /// The iteration.
    pub iteration: u32,
    /// Cost so far, USD.
    pub cost_usd: f64,
    /// Tokens so far (in + out).
    pub tokens: u64,
    /// Cost so far, in percent of the total (bar height).
    pub cost_pct: f64,
    /// Tokens so far, in percent of the total (bar height).
    pub tokens_pct: f64,
}

/// One iteration's card.
#[derive(Debug, Clone, Serialize)]
pub struct Card {
    /// The ledger record.
    pub record: LedgerRecord,
    /// Duration, short (`1m05s`).
    pub duration: String,
    /// Cost, or `?`.
    pub cost: String,
    /// Why it ended so, one line.
    pub reason: String,
    /// The patch from its start to its end (bounded), when git has both.
    pub diff: Option<String>,
    /// Its diffstat: `(path, added, removed)`.
    pub diffstat: Vec<(String, usize, usize)>,
}

/// What [`build`] reads besides history.
pub struct Inputs<'a> {
    /// prd.json now.
    pub prd: &'a Prd,
    /// state.json, when there is one.
    pub state: Option<&'a State>,
    /// The repository, for diffs.
    pub repo: Option<&'a Repo>,
    /// progress.txt's text.
    pub progress: &'a str,
}

/// Builds the report of `scope` from `history`.
///
/// # Errors
/// A message when `scope` names a run that is not in the history.
pub fn build(history: &History, scope: &Scope, i: &Inputs<'_>) -> Result<Report, String> {
    let latest = history.latest_run().map(str::to_owned);
    let (records, scope_text): (Vec<&LedgerRecord>, String) = match scope {
        Scope::All => {
            let runs: std::collections::BTreeSet<&str> =
                history.records.iter().map(|r| r.run_id.as_str()).collect();
            (
                history.records.iter().collect(),
                format!(
                    "all {} run{}",
                    runs.len(),
                    if runs.len() == 1 { "" } else { "s" }
                ),
            )
        }
        Scope::Latest => match &latest {
            Some(id) => (history.run(id).collect(), format!("run {id}")),
            None => (Vec::new(), "no run yet".into()),
        },
        Scope::Run(id) => {
            let rs: Vec<&LedgerRecord> = history.run(id).collect();
            if rs.is_empty() {
                return Err(format!("no run {id} in the history"));
            }
            (rs, format!("run {id}"))
        }
    };
    let covers_latest = match scope {
        Scope::Run(id) => Some(id) == latest.as_ref(),
        _ => true,
    };
    let stop_reason = covers_latest
        .then(|| i.state.and_then(|s| s.stop_reason.clone()))
        .flatten();
    let blocked: Vec<String> = i.state.map(|s| s.blocked.clone()).unwrap_or_default();
    Ok(Report {
        project: i.prd.project.clone(),
        branch: i.prd.branch_name.clone(),
        scope: scope_text,
        generated_at: Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        source: match history.source {
            Source::Git => "git".into(),
            _ => "ledger".into(),
        },
        summary: summary(&records, i.prd, &blocked, stop_reason),
        stories: story_rows(&records, i.prd, &blocked, history.source == Source::Git),
        timeline: timeline(&records, i.prd),
        cumulative: cumulative(&records),
        iterations: cards(&records, i.repo),
        patterns: codebase_patterns(i.progress),
    })
}

fn summary(
    records: &[&LedgerRecord],
    prd: &Prd,
    blocked: &[String],
    stop_reason: Option<StopReason>,
) -> Summary {
    let passed = prd.user_stories.iter().filter(|s| s.passes).count();
    let costs: Vec<f64> = records.iter().filter_map(|r| r.cost_usd).collect();
    let tin: Vec<u64> = records.iter().filter_map(|r| r.input_tokens()).collect();
    let tout: Vec<u64> = records.iter().filter_map(|r| r.tokens_out).collect();
    let mut outcomes = BTreeMap::new();
    for r in records {
        *outcomes.entry(r.outcome.as_str().to_owned()).or_insert(0) += 1;
    }
    let wall_s = match (records.first(), records.last()) {
        (Some(a), Some(b)) => (b.ended_at - a.started_at).num_milliseconds() as f64 / 1000.0,
        _ => 0.0,
    };
    Summary {
        stories: prd.user_stories.len(),
        passed,
        open: prd.user_stories.len() - passed,
        blocked: prd
            .user_stories
            .iter()
            .filter(|s| !s.passes && blocked.contains(&s.id))
            .count(),
        iterations: records.len(),
        wall_s: wall_s.max(0.0),
        cost_usd: (!costs.is_empty()).then(|| costs.iter().sum()),
        tokens_in: (!tin.is_empty()).then(|| tin.iter().sum()),
        tokens_out: (!tout.is_empty()).then(|| tout.iter().sum()),
        stop_text: stop_reason.as_ref().map(StopReason::sentence),
        resume_at: stop_reason
            .as_ref()
            .and_then(StopReason::resume_at)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        stop_reason,
        outcomes,
    }
}

/// A story's status as `ralph status` shows it: `passes`, `blocked`, `open`, or
/// `waits for US-001 (blocked)` when a dependency is blocked.
pub fn story_status(prd: &Prd, id: &str, blocked: &[String]) -> String {
    let Some(s) = prd.story(id) else {
        return "gone".into();
    };
    if s.passes {
        return "passes".into();
    }
    if blocked.contains(&s.id) {
        return "blocked".into();
    }
    let waiting: Vec<String> = s
        .depends_on
        .iter()
        .filter(|d| prd.story(d).is_some_and(|x| !x.passes))
        .map(|d| {
            if blocked.contains(d) {
                format!("{d} (blocked)")
            } else {
                d.clone()
            }
        })
        .collect();
    if waiting.is_empty() {
        "open".into()
    } else {
        format!("waits for {}", waiting.join(", "))
    }
}

fn story_rows(
    records: &[&LedgerRecord],
    prd: &Prd,
    blocked: &[String],
    times_unknown: bool,
) -> Vec<StoryRow> {
    let mut stories: Vec<_> = prd.user_stories.iter().collect();
    stories.sort_by_key(|s| s.priority);
    stories
        .into_iter()
        .map(|s| {
            let mine: Vec<&&LedgerRecord> = records.iter().filter(|r| r.story_id == s.id).collect();
            let costs: Vec<f64> = mine.iter().filter_map(|r| r.cost_usd).collect();
            let passed_at = mine.iter().find(|r| r.outcome == Outcome::StoryPassed);
            StoryRow {
                id: s.id.clone(),
                title: s.title.clone(),
                status: story_status(prd, &s.id, blocked),
                iterations: mine.len(),
                last_outcome: mine.last().map(|r| r.outcome),
                cost_usd: (!costs.is_empty()).then(|| costs.iter().sum()),
                time_to_pass_s: match (mine.first(), passed_at) {
                    _ if times_unknown => None,
                    (Some(first), Some(pass)) => {
                        Some((pass.ended_at - first.started_at).num_milliseconds() as f64 / 1000.0)
                    }
                    _ => None,
                },
            }
        })
        .collect()
}

fn timeline(records: &[&LedgerRecord], prd: &Prd) -> Timeline {
    let start = records
        .first()
        .map(|r| r.started_at)
        .unwrap_or_else(Utc::now);
    let end = records
        .iter()
        .map(|r| r.ended_at)
        .max()
        .unwrap_or(start)
        .max(start + chrono::Duration::seconds(1));
    let span = (end - start).num_milliseconds().max(1) as f64;
    let pct =
        |t: DateTime<Utc>| ((t - start).num_milliseconds() as f64 / span * 100.0).clamp(0.0, 100.0);
    let mut order: Vec<_> = prd.user_stories.iter().collect();
    order.sort_by_key(|s| s.priority);
    let mut ids: Vec<String> = order.iter().map(|s| s.id.clone()).collect();
    for r in records {
        if !ids.contains(&r.story_id) {
            ids.push(r.story_id.clone());
        }
    }
    let rows = ids
        .into_iter()
        .map(|id| TimelineRow {
            bars: records
                .iter()
                .filter(|r| r.story_id == id)
                .map(|r| {
                    let left = pct(r.started_at);
                    Bar {
                        iteration: r.iteration,
                        outcome: r.outcome,
                        left,
                        width: (pct(r.ended_at) - left).max(0.4),
                        title: format!(
                            "#{} {} {} ({})",
                            r.iteration,
                            r.story_id,
                            r.outcome,
                            crate::output::text::record_secs(r)
                        ),
                    }
                })
                .collect(),
            story_id: id,
        })
        .collect();
    let mut waits = Vec::new();
    for pair in records.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let kind = match a.outcome {
            Outcome::UsageLimit => "usage_limit",
            Outcome::Transient => "retry",
            _ => continue,
        };
        if b.started_at > a.ended_at {
            let left = pct(a.ended_at);
            waits.push(Band {
                kind: kind.into(),
                left,
                width: pct(b.started_at) - left,
                title: format!(
                    "waited {} ({})",
                    crate::output::text::short_secs(
                        (b.started_at - a.ended_at).num_milliseconds() as f64 / 1000.0
                    ),
                    kind.replace('_', " ")
                ),
            });
        }
    }
    Timeline {
        start: start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        end: end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        rows,
        waits,
    }
}

fn cumulative(records: &[&LedgerRecord]) -> Vec<Cumulative> {
    let mut cost = 0.0;
    let mut tokens = 0u64;
    let mut out: Vec<Cumulative> = records
        .iter()
        .map(|r| {
            cost += r.cost_usd.unwrap_or(0.0);
            tokens += r.input_tokens().unwrap_or(0) + r.tokens_out.unwrap_or(0);
            Cumulative {
                iteration: r.iteration,
                cost_usd: cost,
                tokens,
                cost_pct: 0.0,
                tokens_pct: 0.0,
            }
        })
        .collect();
    let (max_cost, max_tokens) = (cost.max(f64::MIN_POSITIVE), tokens.max(1) as f64);
    for c in &mut out {
        c.cost_pct = c.cost_usd / max_cost * 100.0;
        c.tokens_pct = c.tokens as f64 / max_tokens * 100.0;
    }
    out
}

fn cards(records: &[&LedgerRecord], repo: Option<&Repo>) -> Vec<Card> {
    let first_with_diff = records.len().saturating_sub(DIFF_MAX_ITERATIONS);
    records
        .iter()
        .enumerate()
        .map(|(n, r)| {
            let (diff, diffstat) = match (repo, &r.head_before, &r.head_after) {
                (Some(repo), Some(a), Some(b)) if n >= first_with_diff && a != b => {
                    match repo.patch(a, b, DIFF_MAX_BYTES) {
                        Ok((text, stat)) => (Some(text), stat),
                        Err(_) => (None, Vec::new()),
                    }
                }
                _ => (None, Vec::new()),
            };
            Card {
                duration: crate::output::text::record_secs(r),
                cost: crate::output::text::usd_or_unknown(r.cost_usd),
                reason: crate::output::text::reason(r),
                diff,
                diffstat,
                record: (*r).clone(),
            }
        })
        .collect()
}

/// progress.txt's `## Codebase Patterns` section, without its heading (empty when missing).
pub fn codebase_patterns(progress: &str) -> String {
    let Some(start) = progress.find("## Codebase Patterns") else {
        return String::new();
    };
    let body = &progress[start + "## Codebase Patterns".len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    let end = body[..end].find("\n---").map(|e| e.min(end)).unwrap_or(end);
    body[..end].trim().to_owned()
}
