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
/// covered span), waits shown as bands; with `--parallel`, also one lane per worker, where
/// iterations that overlapped in time sit side by side.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// The start of the span (RFC 3339): the earliest iteration's start.
    pub start: String,
    /// The end of the span (RFC 3339): the latest iteration's end.
    pub end: String,
    /// The rows, in priority order.
    pub rows: Vec<TimelineRow>,
    /// Waits (usage limits, retry backoff) between iterations.
    pub waits: Vec<Band>,
    /// One lane per worker (`w1`, `w2`, …) when an iteration covered ran under `--parallel`;
    /// empty for serial runs, whose timeline is one lane (the story rows).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<Lane>,
}

/// One worker's lane of the timeline: the iterations it ran, in time.
#[derive(Debug, Clone, Serialize)]
pub struct Lane {
    /// `w1`, `w2`, …; `main` for iterations recorded without a worker beside parallel ones.
    pub label: String,
    /// Its bars, in start order.
    pub bars: Vec<LaneBar>,
}

/// One iteration's bar in a worker's lane.
#[derive(Debug, Clone, Serialize)]
pub struct LaneBar {
    /// The bar (its title names the story and the landing).
    #[serde(flatten)]
    pub bar: Bar,
    /// The story.
    pub story_id: String,
    /// How its work landed (`ff`, `merge`, `conflict → refs/ralph/salvage/…`), when recorded.
    pub landing: Option<String>,
    /// The landing's kind (`fast_forward`, `merge`, `conflict`, `reverted`, `not_landed`).
    pub landing_kind: Option<crate::protocol::record::LandingKind>,
    /// When it started, in seconds after the timeline's start (Markdown's lanes).
    pub offset_s: f64,
    /// Its wall time, seconds.
    pub duration_s: f64,
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
    /// `--parallel`: how its work landed, in words (`merge onto 1a2b3c4d`, `conflict on
    /// src/a.rs → refs/ralph/salvage/…`, with the landing's message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub landing: Option<String>,
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
    // From the earliest start to the latest end: `--parallel` records are in landing order.
    let first = records.iter().map(|r| r.started_at).min();
    let last = records.iter().map(|r| r.ended_at).max();
    let wall_s = match (first, last) {
        (Some(a), Some(b)) => (b - a).num_milliseconds() as f64 / 1000.0,
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
/// `waits for US-002` while a dependency does not pass. A dependency that is blocked, or waits
/// (through its own dependencies) for one that is, says so: `waits for US-001 (blocked)`,
/// `waits for US-002 (waits for blocked US-001)`; no agent can ever run such a story until the
/// block is lifted. A story blocked only because what it depends on is blocked (the transitive
/// block of `--parallel`) shows that reason instead of `blocked`. For many stories, build
/// [`Statuses`] once (this builds it for one answer).
pub fn story_status(prd: &Prd, id: &str, blocked: &[String]) -> String {
    Statuses::new(prd, blocked).of(id)
}

/// Most blocked stories named behind one dependency.
const ROOTS_SHOWN: usize = 3;

/// [`story_status`] of every story of a PRD, linear in its stories and dependencies: the
/// blocked stories each open story waits for are found once, deepest first.
pub struct Statuses<'p> {
    prd: &'p Prd,
    blocked: std::collections::HashSet<&'p str>,
    /// For each open story not itself blocked: the blocked stories it waits for through its
    /// open dependencies (at most [`ROOTS_SHOWN`]).
    roots: std::collections::HashMap<&'p str, Vec<&'p str>>,
}

impl<'p> Statuses<'p> {
    /// The statuses of `prd`'s stories with `blocked` blocked.
    pub fn new(prd: &'p Prd, blocked: &'p [String]) -> Statuses<'p> {
        let blocked: std::collections::HashSet<&str> = blocked.iter().map(String::as_str).collect();
        let mut roots: std::collections::HashMap<&str, Vec<&str>> = Default::default();
        if !blocked.is_empty() {
            let open: std::collections::HashMap<&str, &crate::prd::model::Story> = prd
                .user_stories
                .iter()
                .filter(|s| !s.passes)
                .map(|s| (s.id.as_str(), s))
                .collect();
            // Iterative depth-first walk, dependencies before dependents (chains of 100,000
            // stories are no stack overflow); a cycle (refused by validation) ends the walk.
            let mut entered = std::collections::HashSet::new();
            for s in prd.user_stories.iter().filter(|s| !s.passes) {
                let mut stack = vec![(s.id.as_str(), false)];
                while let Some((id, deps_done)) = stack.pop() {
                    if roots.contains_key(id) || blocked.contains(id) {
                        continue;
                    }
                    let Some(story) = open.get(id) else {
                        continue;
                    };
                    let deps = story
                        .depends_on
                        .iter()
                        .map(String::as_str)
                        .filter(|d| open.contains_key(d));
                    if deps_done {
                        let mut found: Vec<&str> = Vec::new();
                        for d in deps {
                            let from: Vec<&str> = if blocked.contains(d) {
                                vec![d]
                            } else {
                                roots.get(d).cloned().unwrap_or_default()
                            };
                            for r in from {
                                if found.len() < ROOTS_SHOWN && !found.contains(&r) {
                                    found.push(r);
                                }
                            }
                        }
                        roots.insert(id, found);
                    } else if entered.insert(id) {
                        stack.push((id, true));
                        stack.extend(deps.map(|d| (d, false)));
                    }
                }
            }
        }
        Statuses {
            prd,
            blocked,
            roots,
        }
    }

    /// The status of story `id` (see [`story_status`]); `gone` for an id prd.json lacks.
    pub fn of(&self, id: &str) -> String {
        let Some(s) = self.prd.story(id) else {
            return "gone".into();
        };
        if s.passes {
            return "passes".into();
        }
        let mut held = false;
        let waiting: Vec<String> = s
            .depends_on
            .iter()
            .filter(|d| self.prd.story(d).is_some_and(|x| !x.passes))
            .map(|d| {
                if self.blocked.contains(d.as_str()) {
                    held = true;
                    return format!("{d} (blocked)");
                }
                match self.roots.get(d.as_str()).filter(|r| !r.is_empty()) {
                    Some(roots) => {
                        held = true;
                        format!("{d} (waits for blocked {})", roots.join(", "))
                    }
                    None => d.clone(),
                }
            })
            .collect();
        if self.blocked.contains(s.id.as_str()) && !held {
            return "blocked".into();
        }
        if waiting.is_empty() {
            "open".into()
        } else {
            format!("waits for {}", waiting.join(", "))
        }
    }
}

fn story_rows(
    records: &[&LedgerRecord],
    prd: &Prd,
    blocked: &[String],
    times_unknown: bool,
) -> Vec<StoryRow> {
    let statuses = Statuses::new(prd, blocked);
    let mut stories: Vec<_> = prd.user_stories.iter().collect();
    stories.sort_by_key(|s| s.priority);
    stories
        .into_iter()
        .map(|s| {
            let mine: Vec<&&LedgerRecord> = records.iter().filter(|r| r.story_id == s.id).collect();
            let costs: Vec<f64> = mine.iter().filter_map(|r| r.cost_usd).collect();
            // The iteration that left the story passing: `story_passed`, or one that ended
            // otherwise (a timeout) after the story's pass was kept.
            let passed_at = mine
                .iter()
                .find(|r| crate::output::text::passed_own_story(r));
            StoryRow {
                id: s.id.clone(),
                title: s.title.clone(),
                status: statuses.of(&s.id),
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
    // The earliest start: with `--parallel` the ledger is in landing order, not start order.
    let start = records
        .iter()
        .map(|r| r.started_at)
        .min()
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
    let bar = |r: &LedgerRecord| {
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
    };
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
                .map(|r| bar(r))
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
        lanes: lanes(records, start, &bar),
    }
}

/// The worker lanes of [`Timeline::lanes`] (empty when no record has a worker).
fn lanes(
    records: &[&LedgerRecord],
    start: DateTime<Utc>,
    bar: &dyn Fn(&LedgerRecord) -> Bar,
) -> Vec<Lane> {
    if records.iter().all(|r| r.worker.is_none()) {
        return Vec::new();
    }
    let mut by_worker: BTreeMap<Option<u32>, Vec<&LedgerRecord>> = BTreeMap::new();
    for r in records {
        by_worker.entry(r.worker).or_default().push(r);
    }
    let mut lanes: Vec<Lane> = by_worker
        .into_iter()
        .map(|(worker, mut rs)| {
            rs.sort_by_key(|r| (r.started_at, r.iteration));
            Lane {
                label: worker.map_or_else(|| "main".to_owned(), |w| format!("w{w}")),
                bars: rs
                    .into_iter()
                    .map(|r| {
                        let landing = r.landing.as_ref().map(crate::output::text::landing_short);
                        let mut b = bar(r);
                        if let Some(l) = &landing {
                            b.title.push_str(&format!(" · landed: {l}"));
                        }
                        LaneBar {
                            bar: b,
                            story_id: r.story_id.clone(),
                            landing,
                            landing_kind: r.landing.as_ref().map(|l| l.kind),
                            offset_s: (r.started_at - start).num_milliseconds() as f64 / 1000.0,
                            duration_s: r.duration_s,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    // `main` (no worker) sorts first; it goes last: the workers are the lanes a reader compares.
    if lanes.first().is_some_and(|l| l.label == "main") {
        lanes.rotate_left(1);
    }
    lanes
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
                landing: r.landing.as_ref().map(landing_words),
                record: (*r).clone(),
            }
        })
        .collect()
}

/// A card's landing line: `merge onto 1a2b3c4d (met US-001, US-003)`, `conflict on src/a.rs →
/// refs/ralph/salvage/<run>/<story>: <message>` (refs in full, commits short).
fn landing_words(l: &crate::protocol::record::LandingRecord) -> String {
    use crate::protocol::record::LandingKind;
    let short = |sha: &String| sha.get(..8).unwrap_or(sha).to_owned();
    let mut text = crate::output::text::landing_kind(l.kind).to_owned();
    if let Some(n) = l.resolves {
        text.push_str(&format!(" of iteration {n}'s conflict"));
    }
    if !l.files.is_empty() {
        text.push_str(&format!(" on {}", l.files.join(", ")));
    }
    match (l.kind, &l.onto, &l.commit) {
        (
            LandingKind::FastForward | LandingKind::Merge | LandingKind::Resolution,
            Some(onto),
            Some(c),
        ) => text.push_str(&format!(" onto {} → {}", short(onto), short(c))),
        (_, Some(onto), _) => text.push_str(&format!(" onto {}", short(onto))),
        _ => {}
    }
    if let Some(saved) = &l.salvage_ref {
        text.push_str(&format!(", work kept at {saved}"));
    }
    if !l.landed_since.is_empty() {
        text.push_str(&format!(
            " (landed meanwhile: {})",
            l.landed_since.join(", ")
        ));
    }
    if let Some(m) = &l.message {
        text.push_str(&format!(": {m}"));
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;

    fn prd(stories: &[(&str, bool, &[&str])]) -> Prd {
        let stories: Vec<serde_json::Value> = stories
            .iter()
            .enumerate()
            .map(|(i, (id, passes, deps))| {
                serde_json::json!({"id": id, "title": id, "acceptanceCriteria": [],
                    "priority": i + 1, "passes": passes, "dependsOn": deps})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"project": "p", "userStories": stories})).unwrap()
    }

    /// A chain behind a blocked story says what it waits for, however far down; a story
    /// blocked only because its dependency is (the transitive block of `--parallel`) says so
    /// instead of `blocked`; one blocked by its own attempts stays `blocked`.
    #[test]
    fn a_story_behind_a_blocked_one_says_what_it_waits_for() {
        let p = prd(&[
            ("A", false, &[]),
            ("B", false, &["A"]),
            ("C", false, &["B"]),
            ("D", false, &["C", "E"]),
            ("E", true, &[]),
            ("F", false, &["E"]),
        ]);
        let blocked = vec!["A".to_owned()];
        let status = |id: &str, blocked: &[String]| story_status(&p, id, blocked);
        assert_eq!(status("A", &blocked), "blocked");
        assert_eq!(status("B", &blocked), "waits for A (blocked)");
        assert_eq!(status("C", &blocked), "waits for B (waits for blocked A)");
        assert_eq!(status("D", &blocked), "waits for C (waits for blocked A)");
        assert_eq!(status("F", &blocked), "open");
        assert_eq!(status("E", &blocked), "passes");
        // B and C blocked transitively: they show why.
        let all = vec!["A".to_owned(), "B".to_owned(), "C".to_owned()];
        assert_eq!(status("B", &all), "waits for A (blocked)");
        assert_eq!(status("C", &all), "waits for B (blocked)");
        // Nothing blocked: plain waits.
        assert_eq!(status("C", &[]), "waits for B");
        // A chain of 30,000 stories behind a blocked first one: found once each (a walk per
        // story would be quadratic), with no deep recursion.
        let ids: Vec<String> = (0..30_000).map(|i| format!("S{i}")).collect();
        let chain: Vec<(&str, bool, Vec<&str>)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let deps = if i == 0 {
                    vec![]
                } else {
                    vec![ids[i - 1].as_str()]
                };
                (id.as_str(), false, deps)
            })
            .collect();
        let long = prd(&chain
            .iter()
            .map(|(id, p, d)| (*id, *p, d.as_slice()))
            .collect::<Vec<_>>());
        let first = vec!["S0".to_owned()];
        let statuses = Statuses::new(&long, &first);
        assert_eq!(statuses.of("S1"), "waits for S0 (blocked)");
        assert_eq!(
            statuses.of("S29999"),
            "waits for S29998 (waits for blocked S0)"
        );
        // A cycle (refused by validation) does not loop.
        let cyc = prd(&[("X", false, &["Y"]), ("Y", false, &["X"])]);
        assert_eq!(story_status(&cyc, "X", &[]), "waits for Y");
    }
}
