//! The run policy: every rule that decides whether a run goes on, waits, retries or stops, as
//! pure functions of the run's counters ([`Tally`]), its budgets ([`Budgets`]) and what just
//! happened. Nothing here reads a file, a clock or a signal: the caller passes the facts in
//! (the elapsed time, `now`, whether Ctrl-C or `ralph stop` arrived, a jitter draw) and applies
//! the [`Decision`]. The rules, in the order they are checked:
//!
//! Before an iteration ([`pick`]): every story passes (complete, unless stories were deleted),
//! Ctrl-C, `ralph stop`, `--max-iter`, `--max-duration`, no story that can be worked on (all
//! blocked, or waiting for dependencies).
//!
//! After an iteration ([`decide`]): Ctrl-C, an auth or config error, then, for outcomes that are
//! the agent's doing, the story's `--max-attempts` (block it and go on, or stop with
//! `--stop-on-block`), `--max-failures` in a row, `--max-no-progress` in a row (both go on
//! across a block when every attempt at the blocked story went the same way, and their stop
//! reasons name the streak's dominant outcome, its count and last message) and `--max-cost`; then a transient failure (retry after a
//! doubling backoff, `max_transient_retries`, `--max-duration`) or a usage limit (wait for the
//! reset: `--no-wait`, `max_usage_limit_waits`, `--max-duration`).
//!
//! While waiting ([`after_wait`]): Ctrl-C and `ralph stop` end the wait and the run.
//!
//! With fallback agents ([`agents`]): a usage limit goes on at once on another agent that is
//! not limited (no wait, no attempt, no budget), and the wait comes only when every agent left is
//! limited, until the earliest reset; an auth error takes the agent out of the rotation while
//! another one is left.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::RunConfig;
use crate::prd::model::Prd;
use crate::protocol::outcome::{Next as OutcomeNext, Streak};
use crate::protocol::stop::{During, OutcomeCount, StreakCause, UsageLimitStop};
use crate::protocol::{LedgerRecord, Outcome, StopReason};

/// Longest wait between transient retries.
const MAX_TRANSIENT_WAIT: Duration = Duration::from_secs(600);
/// First backoff when a usage limit comes back right after a wait.
const REPEAT_LIMIT_BACKOFF_MIN: i64 = 5;

/// The limits of one run, from the resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Budgets {
    /// `--max-iter`: iterations this run may use.
    pub max_iter: u32,
    /// `--max-duration`: wall-clock limit of the run.
    pub max_duration: Option<Duration>,
    /// `--max-cost`, in USD.
    pub max_cost: Option<f64>,
    /// `--max-attempts`: iterations a story may take before it is blocked.
    pub max_attempts: u32,
    /// `--max-failures`: failed iterations in a row before the run stops.
    pub max_failures: u32,
    /// `--max-no-progress`: iterations in a row without any change before the run stops.
    pub max_no_progress: u32,
    /// Transient failures in a row before the run stops.
    pub max_transient_retries: u32,
    /// First wait after a transient failure (doubles, capped at 10 minutes).
    pub transient_backoff: Duration,
    /// Usage-limit waits in one run before it stops.
    pub max_usage_limit_waits: u32,
    /// `--no-wait`: stop at a usage limit instead of waiting.
    pub no_wait: bool,
    /// Wait for a usage limit without a reset time.
    pub usage_limit_fallback: Duration,
    /// Extra wait after a usage limit's reset time.
    pub usage_limit_margin: Duration,
    /// The per-iteration wall-clock limit.
    pub timeout: Duration,
    /// `--stop-on-block`: a blocked story stops the run.
    pub stop_on_block: bool,
}

impl Budgets {
    /// The budgets `cfg` sets.
    pub fn of(cfg: &RunConfig) -> Budgets {
        Budgets {
            max_iter: cfg.max_iter,
            max_duration: cfg.max_duration,
            max_cost: cfg.max_cost,
            max_attempts: cfg.max_attempts,
            max_failures: cfg.max_failures,
            max_no_progress: cfg.max_no_progress,
            max_transient_retries: cfg.max_transient_retries,
            transient_backoff: cfg.transient_backoff,
            max_usage_limit_waits: cfg.max_usage_limit_waits,
            no_wait: cfg.no_wait,
            usage_limit_fallback: cfg.usage_limit_fallback,
            usage_limit_margin: cfg.usage_limit_margin,
            timeout: cfg.timeout,
            stop_on_block: cfg.stop_on_block,
        }
    }

    /// What is left of `--max-duration` after `elapsed` (`None`: no limit; zero when used up).
    pub fn time_left(&self, elapsed: Duration) -> Option<Duration> {
        self.max_duration.map(|m| m.saturating_sub(elapsed))
    }

    fn max_duration_s(&self) -> u64 {
        self.max_duration.unwrap_or_default().as_secs()
    }
}

/// The counters of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Iterations of the `--max-iter` budget used.
    pub slot: u32,
    /// Failed iterations in a row.
    pub failures_in_a_row: u32,
    /// Iterations in a row that changed nothing.
    pub unchanged_in_a_row: u32,
    /// Transient failures in a row.
    pub transient_in_a_row: u32,
    /// Usage-limit waits in this run (a limit met while another agent was free is no wait).
    pub usage_waits: u32,
    /// The cost counted against `--max-cost`, in USD: this run's, plus the feature's earlier
    /// runs' with `--budget-scope feature` (set when the session opens).
    pub cost_usd: f64,
    /// What the failure streak is made of (for the stop reason).
    pub failures: StreakLog,
    /// Whether the failure streak outlived a story's block (every attempt at it failed the same
    /// way): it then goes on only while each failure is that same one.
    pub failures_carried: bool,
    /// What the no-change streak is made of (for the stop reason).
    pub unchanged: StreakLog,
}

/// The outcomes of one streak of iterations, by class, and the stories it went through: what a
/// stop for `--max-failures` or `--max-no-progress` names as its cause.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreakLog {
    /// Each outcome, how many iterations ended with it, and the last message of those.
    classes: Vec<(Outcome, u32, Option<String>)>,
    /// The last class pushed (ties between classes go to it).
    latest: Option<Outcome>,
    /// The stories, in order, without repeats.
    stories: Vec<String>,
}

impl StreakLog {
    /// Adds an iteration's record to the streak.
    pub fn push(&mut self, r: &LedgerRecord) {
        match self.classes.iter_mut().find(|c| c.0 == r.outcome) {
            Some(c) => {
                c.1 += 1;
                if r.message.is_some() {
                    c.2 = r.message.clone();
                }
            }
            None => self.classes.push((r.outcome, 1, r.message.clone())),
        }
        self.latest = Some(r.outcome);
        if self.stories.last() != Some(&r.story_id) {
            self.stories.push(r.story_id.clone());
        }
    }

    /// The iterations in the streak.
    pub fn len(&self) -> u32 {
        self.classes.iter().map(|c| c.1).sum()
    }

    /// Whether the streak is empty.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The one outcome every iteration of the streak ended with, if there is one.
    pub fn single(&self) -> Option<Outcome> {
        match self.classes.as_slice() {
            [(o, _, _)] => Some(*o),
            _ => None,
        }
    }

    /// The streak as a stop reason's cause: the dominant outcome (most frequent; on a tie, the
    /// latest) first; `None` when nothing was logged.
    pub fn cause(&self) -> Option<StreakCause> {
        if self.classes.is_empty() {
            return None;
        }
        let mut classes = self.classes.clone();
        // Stable: among equal counts the latest class goes first, then the order they came in.
        classes.sort_by_key(|c| (std::cmp::Reverse(c.1), Some(c.0) != self.latest));
        Some(StreakCause {
            outcomes: classes
                .iter()
                .map(|c| OutcomeCount {
                    outcome: c.0,
                    count: c.1,
                })
                .collect(),
            last_message: classes[0].2.clone(),
            stories: self.stories.clone(),
        })
    }
}

/// What the run knows before it picks the next story.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// prd.json now.
    pub prd: &'a Prd,
    /// The story ids prd.json had when the run started.
    pub expected_ids: &'a BTreeSet<String>,
    /// Blocked stories.
    pub blocked: &'a [String],
    /// Time since the run started.
    pub elapsed: Duration,
    /// Ctrl-C (or SIGTERM/SIGHUP) arrived.
    pub interrupted: bool,
    /// `ralph stop` asked the run to end.
    pub stop_requested: bool,
    /// This run's id.
    pub run_id: &'a str,
}

/// The next iteration to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The story.
    pub story_id: String,
    /// Its place in the budget (1-based).
    pub slot: u32,
    /// Its wall-clock limit: `--timeout`, cut to what is left of `--max-duration`.
    pub timeout: Duration,
}

/// Picks the next iteration, or says why the run stops (see the module docs for the order).
pub fn pick(t: &Tally, b: &Budgets, s: &Situation<'_>) -> Result<Pick, StopReason> {
    let ids: BTreeSet<String> = s.prd.user_stories.iter().map(|x| x.id.clone()).collect();
    if s.prd.all_pass() {
        let missing: Vec<String> = s.expected_ids.difference(&ids).cloned().collect();
        if missing.is_empty() {
            return Err(StopReason::Complete);
        }
        // Never call a run complete because stories vanished from the PRD.
        return Err(StopReason::StoriesDeleted {
            missing,
            run_id: s.run_id.to_owned(),
        });
    }
    if s.interrupted {
        return Err(StopReason::Interrupted {
            agent_running: false,
        });
    }
    if s.stop_requested {
        return Err(StopReason::StopRequested {
            during: During::BetweenIterations,
        });
    }
    if t.slot >= b.max_iter {
        return Err(StopReason::MaxIterations {
            max_iter: b.max_iter,
            open: open_ids(s.prd),
        });
    }
    let left = b.time_left(s.elapsed);
    if left == Some(Duration::ZERO) {
        return Err(StopReason::MaxDuration {
            max_duration_s: b.max_duration_s(),
            during: During::BetweenIterations,
        });
    }
    let Some(story) = s.prd.next_story(s.blocked) else {
        return Err(if s.blocked.is_empty() {
            StopReason::NoWorkableStory
        } else {
            StopReason::AllBlocked {
                blocked: s.blocked.to_vec(),
            }
        });
    };
    // The last iteration may not outlast the run's own limit.
    let timeout = match left {
        Some(left) => b.timeout.min(left.max(Duration::from_secs(1))),
        None => b.timeout,
    };
    Ok(Pick {
        story_id: story.id.clone(),
        slot: t.slot + 1,
        timeout,
    })
}

/// After an iteration's push (`--push`): the remote refused the branch (someone else moved it)
/// or the lease renewal (another worker took it), and the run must stop; `None` when it was
/// pushed or the remote could not be reached (the run goes on locally).
pub fn after_push(push: &crate::protocol::PushRecord) -> Option<StopReason> {
    use crate::protocol::PushStatus;
    match push.status {
        PushStatus::Pushed | PushStatus::Unreachable => None,
        PushStatus::Rejected => Some(StopReason::PushRejected {
            remote: push.remote.clone(),
            branch: push.branch.clone(),
            message: push.error.clone().unwrap_or_default(),
        }),
        PushStatus::LeaseLost => Some(StopReason::LeaseLost {
            remote: push.remote.clone(),
            branch: push.branch.clone(),
            holder: push
                .error
                .as_deref()
                .map(|e| e.trim_start_matches("the lease is held by ").to_owned()),
        }),
    }
}

/// What the run knows after an iteration was committed and recorded.
#[derive(Debug, Clone)]
pub struct Aftermath<'a> {
    /// The iteration's ledger record.
    pub record: &'a LedgerRecord,
    /// Whether its story passes in prd.json now.
    pub story_passes: bool,
    /// The story's attempts, this iteration included.
    pub attempts: u32,
    /// Whether the story was already blocked.
    pub already_blocked: bool,
    /// For a usage limit: when the agent said it resets.
    pub resume_at: Option<DateTime<Utc>>,
    /// Time since the run started.
    pub elapsed: Duration,
    /// The current time.
    pub now: DateTime<Utc>,
    /// A random draw in `[0, 1)` for the retry jitter.
    pub jitter: f64,
    /// The usage limits in a row of the agent that ran, before this iteration (a limit right
    /// after its reset backs off).
    pub limit_repeats: u32,
    /// The other agents of the run (default: none).
    pub others: agents::Others,
    /// The reset of the agent that ran, when it was still known to be limited as this iteration
    /// ended (`None`: not limited). A usage limit then is the same limit met again by an
    /// iteration launched before it was known (`--parallel`): no new wait, no extra backoff.
    pub known_reset: Option<DateTime<Utc>>,
}

/// What the run does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Pick the next story.
    Continue,
    /// Wait `wait`, then run the same story again (a transient failure).
    Retry {
        /// The backoff.
        wait: Duration,
    },
    /// Wait until `until` (a usage limit's reset plus the margin), then run the same story
    /// again.
    WaitUntil {
        /// The end of the wait.
        until: DateTime<Utc>,
    },
    /// End the run.
    Stop(StopReason),
}

/// The policy's answer after an iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The counters after this iteration.
    pub tally: Tally,
    /// Block the iteration's story (it used up `--max-attempts`).
    pub block: bool,
    /// For a usage limit: when the agent that ran resets, to persist in state.json whatever
    /// happens next.
    pub resume_at: Option<DateTime<Utc>>,
    /// What to do.
    pub next: Next,
    /// The agent's usage limits in a row after this iteration.
    pub limit_repeats: u32,
    /// Take the agent that ran out of the rotation (an auth error while another agent is left).
    pub drop_agent: bool,
}

/// No commit, no flip, and no file changed (or only the notes, which classify already judged
/// no_progress: prd.json's notes and progress.txt are not work).
fn is_unchanged(r: &LedgerRecord) -> bool {
    r.commits.is_empty()
        && (r.files_changed.is_empty() || r.outcome == Outcome::NoProgress)
        && r.passes_flipped.is_empty()
        && r.passes_reverted.is_empty()
}

/// Decides what follows an iteration (see the module docs for the order).
pub fn decide(t: &Tally, b: &Budgets, a: &Aftermath<'_>) -> Decision {
    let r = a.record;
    let rules = r.outcome.rules();
    let mut t = t.clone();
    let limit_repeats = match r.outcome {
        Outcome::UsageLimit => a.limit_repeats + 1,
        _ => 0,
    };
    let d = |next: Next, tally: Tally, block: bool, resume_at| Decision {
        tally,
        block,
        resume_at,
        next,
        limit_repeats,
        drop_agent: false,
    };
    if rules.uses_budget {
        t.slot += 1;
    }
    if let Some(cost) = r.cost_usd {
        t.cost_usd += cost;
    }
    if r.outcome != Outcome::Transient {
        t.transient_in_a_row = 0;
    }
    match rules.next {
        OutcomeNext::StopInterrupted => {
            return d(
                Next::Stop(StopReason::Interrupted {
                    agent_running: true,
                }),
                t,
                false,
                None,
            )
        }
        // Another agent may still have a working login: this one is taken out instead.
        // When every agent left is limited, the run waits for the earliest reset as at a usage
        // limit (or stops with `--no-wait`) instead of running one before its reset.
        OutcomeNext::StopNeedsHuman if r.outcome == Outcome::AuthError && a.others.left > 0 => {
            let next = match a.others.earliest_reset.filter(|_| !a.others.ready) {
                None => Next::Continue,
                Some(at) => {
                    t.usage_waits += 1;
                    limit_wait(&t, b, a, at)
                }
            };
            return Decision {
                drop_agent: true,
                ..d(next, t, false, None)
            };
        }
        OutcomeNext::StopNeedsHuman => {
            return d(
                Next::Stop(StopReason::NeedsHuman {
                    outcome: r.outcome,
                    iteration: r.iteration,
                    message: r.message.clone(),
                }),
                t,
                false,
                None,
            )
        }
        OutcomeNext::RetryAfterBackoff => return retry(t, b, a),
        OutcomeNext::WaitForReset => return wait_for_reset(t, b, a),
        OutcomeNext::Continue => {}
    }
    if !a.story_passes && a.attempts >= b.max_attempts && !a.already_blocked {
        return block(t, b, a);
    }
    count_failure(&mut t, r);
    if let Some(reason) = failure_stop(&t, b, r) {
        return d(Next::Stop(reason), t, false, None);
    }
    count_unchanged(&mut t, r);
    if t.unchanged_in_a_row >= b.max_no_progress {
        let reason = StopReason::NoProgress {
            iterations: t.unchanged_in_a_row,
            max_no_progress: b.max_no_progress,
            cause: t.unchanged.cause(),
        };
        return d(Next::Stop(reason), t, false, None);
    }
    if let Some(reason) = cost_stop(&t, b, r) {
        return d(Next::Stop(reason), t, false, None);
    }
    d(Next::Continue, t, false, None)
}

/// The story's attempt limit: block it and move on. Blocking is the answer to a hard story's
/// failures, so the streaks start again with the next story, except when every attempt at it
/// went the same way, which says the agent or its setup is stuck rather than the story hard:
/// - every attempt failed with the same outcome (`agent_error` ×3): the failure streak goes on
///   into the next story, which extends it only by failing the same way, so `--max-failures`
///   fires there;
/// - no attempt changed anything: the no-change streak goes on, and the next story's first
///   unchanged iteration ends the run.
fn block(mut t: Tally, b: &Budgets, a: &Aftermath<'_>) -> Decision {
    let r = a.record;
    count_failure(&mut t, r);
    let same_way = t.failures.single().is_some()
        && t.failures.len() == t.failures_in_a_row
        && t.failures_in_a_row >= a.attempts;
    if same_way {
        t.failures_carried = true;
    } else {
        reset_failures(&mut t);
    }
    let unchanged = t.unchanged_in_a_row + 1;
    if is_unchanged(r) && unchanged >= a.attempts {
        t.unchanged_in_a_row = unchanged;
        t.unchanged.push(r);
    } else {
        t.unchanged_in_a_row = 0;
        t.unchanged = StreakLog::default();
    }
    let next = if b.stop_on_block {
        Next::Stop(StopReason::StoryBlocked {
            story_id: r.story_id.clone(),
            attempts: a.attempts,
            last_outcome: r.outcome,
        })
    } else {
        cost_stop(&t, b, r).map_or(Next::Continue, Next::Stop)
    };
    Decision {
        tally: t,
        block: true,
        resume_at: None,
        next,
        limit_repeats: 0,
        drop_agent: false,
    }
}

/// Extends or ends the failure streak by `r`'s outcome ([`Streak`]); a streak carried across a
/// block starts again when this failure is not the same as the ones before.
fn count_failure(t: &mut Tally, r: &LedgerRecord) {
    match r.outcome.rules().streak {
        Streak::Failure => {
            if t.failures_carried && t.failures.single() != Some(r.outcome) {
                reset_failures(t);
            }
            t.failures_in_a_row += 1;
            t.failures.push(r);
        }
        Streak::Reset => reset_failures(t),
        Streak::Neutral => {}
    }
}

fn reset_failures(t: &mut Tally) {
    t.failures_in_a_row = 0;
    t.failures = StreakLog::default();
    t.failures_carried = false;
}

/// `--max-failures`: the failure streak reached the limit.
fn failure_stop(t: &Tally, b: &Budgets, r: &LedgerRecord) -> Option<StopReason> {
    (t.failures_in_a_row >= b.max_failures).then(|| StopReason::MaxFailures {
        failures: t.failures_in_a_row,
        max_failures: b.max_failures,
        last_outcome: r.outcome,
        last_message: r.message.clone(),
        cause: t.failures.cause(),
    })
}

/// Extends the no-change streak by `r` when it changed nothing, else ends it.
fn count_unchanged(t: &mut Tally, r: &LedgerRecord) {
    if is_unchanged(r) {
        t.unchanged_in_a_row += 1;
        t.unchanged.push(r);
    } else {
        t.unchanged_in_a_row = 0;
        t.unchanged = StreakLog::default();
    }
}

/// `--max-cost`: this run's cost reached the limit (the iteration that crossed it is recorded).
fn cost_stop(t: &Tally, b: &Budgets, r: &LedgerRecord) -> Option<StopReason> {
    let max = b.max_cost?;
    (t.cost_usd >= max).then_some(StopReason::MaxCost {
        spent_usd: t.cost_usd,
        max_usd: max,
        iteration: r.iteration,
        before_start: false,
    })
}

/// Overload, 5xx, network: not the agent's fault, so it does not use up the budget; wait
/// (doubling, with jitter) and run the same story again, a bounded number of times in a row.
fn retry(mut t: Tally, b: &Budgets, a: &Aftermath<'_>) -> Decision {
    t.transient_in_a_row += 1;
    let next = if t.transient_in_a_row > b.max_transient_retries {
        Next::Stop(StopReason::TransientRetries {
            failures: t.transient_in_a_row,
            last_message: a.record.message.clone(),
        })
    } else {
        let wait = transient_wait(b.transient_backoff, t.transient_in_a_row, a.jitter);
        if b.time_left(a.elapsed).is_some_and(|left| wait >= left) {
            Next::Stop(StopReason::MaxDuration {
                max_duration_s: b.max_duration_s(),
                during: During::RetryWait,
            })
        } else {
            Next::Retry { wait }
        }
    };
    Decision {
        tally: t,
        block: false,
        resume_at: None,
        next,
        limit_repeats: 0,
        drop_agent: false,
    }
}

/// A usage limit: not the agent's failure and not an iteration of the budget. Another agent
/// that is not limited takes the next iteration at once; else wait for the earliest reset
/// (persisted, so a restarted ralph waits too) and run the same story again.
///
/// A limit met while the agent's earlier reset is still ahead (`a.known_reset`: iterations
/// launched together, `--parallel`) is that same limit: it keeps the later of the two resets,
/// adds no backoff and no wait to the count.
fn wait_for_reset(mut t: Tally, b: &Budgets, a: &Aftermath<'_>) -> Decision {
    let known = a.known_reset.filter(|at| *at > a.now);
    let (repeats, mine) = match known {
        Some(known) => (
            a.limit_repeats.max(1),
            a.resume_at.map_or(known, |stated| stated.max(known)),
        ),
        None => {
            let repeats = a.limit_repeats + 1;
            let until = usage_limit_until(a.resume_at, a.now, b.usage_limit_fallback, repeats);
            (repeats, until)
        }
    };
    let decision = |tally, next| Decision {
        tally,
        block: false,
        resume_at: Some(mine),
        next,
        limit_repeats: repeats,
        drop_agent: false,
    };
    if a.others.ready {
        return decision(t, Next::Continue);
    }
    if known.is_none() {
        t.usage_waits += 1;
    }
    let at = a
        .others
        .earliest_reset
        .map_or(mine, |other| other.min(mine));
    let next = limit_wait(&t, b, a, at);
    decision(t, next)
}

/// Every agent is limited until `at` at the earliest (`t.usage_waits` counts this wait): stop
/// for `--no-wait`, too many waits or a reset past `--max-duration`, else wait until `at` plus
/// the margin.
fn limit_wait(t: &Tally, b: &Budgets, a: &Aftermath<'_>, at: DateTime<Utc>) -> Next {
    let stop = |why| {
        Next::Stop(StopReason::UsageLimit {
            resume_at: at,
            why,
            agents: Vec::new(),
        })
    };
    if b.no_wait {
        stop(UsageLimitStop::NoWait)
    } else if t.usage_waits > b.max_usage_limit_waits {
        stop(UsageLimitStop::TooManyWaits {
            waits: t.usage_waits,
        })
    } else {
        match wait_for(at, a.now, b, a.elapsed) {
            Ok(until) => Next::WaitUntil { until },
            Err(reason) => Next::Stop(reason),
        }
    }
}

/// The end of a wait for a usage limit that resets at `at`: `at` plus the margin, or why the run
/// must not wait (`--no-wait` is the caller's check; here: the wait would pass
/// `--max-duration`).
///
/// # Errors
/// [`StopReason::UsageLimit`] with [`UsageLimitStop::PastMaxDuration`].
pub fn wait_for(
    at: DateTime<Utc>,
    now: DateTime<Utc>,
    b: &Budgets,
    elapsed: Duration,
) -> Result<DateTime<Utc>, StopReason> {
    let margin = chrono::Duration::from_std(b.usage_limit_margin).unwrap_or_default();
    let until = at.max(now) + margin;
    let wait = (until - now).to_std().unwrap_or_default();
    if b.time_left(elapsed).is_some_and(|left| wait >= left) {
        return Err(StopReason::UsageLimit {
            resume_at: at,
            why: UsageLimitStop::PastMaxDuration {
                max_duration_s: b.max_duration_s(),
            },
            agents: Vec::new(),
        });
    }
    Ok(until)
}

/// A usage-limit reset that a previous ralph persisted (`at`), met at the start of a run:
/// `Ok(None)` when it has passed, `Ok(Some(until))` to wait, or why the run stops at once.
///
/// # Errors
/// [`StopReason::UsageLimit`] for `--no-wait` or a reset after `--max-duration`.
pub fn pending_reset(
    at: DateTime<Utc>,
    now: DateTime<Utc>,
    b: &Budgets,
    elapsed: Duration,
) -> Result<Option<DateTime<Utc>>, StopReason> {
    if at <= now {
        return Ok(None);
    }
    if b.no_wait {
        return Err(StopReason::UsageLimit {
            resume_at: at,
            why: UsageLimitStop::NoWait,
            agents: Vec::new(),
        });
    }
    wait_for(at, now, b, elapsed).map(Some)
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The time passed.
    Elapsed,
    /// Ctrl-C (or SIGTERM/SIGHUP).
    Interrupted,
    /// `ralph stop` asked the run to end.
    StopRequested,
}

/// Whether a wait's end stops the run (`during` says which wait it was).
pub fn after_wait(end: WaitEnd, during: During) -> Option<StopReason> {
    match end {
        WaitEnd::Elapsed => None,
        WaitEnd::Interrupted => Some(StopReason::Interrupted {
            agent_running: false,
        }),
        WaitEnd::StopRequested => Some(StopReason::StopRequested { during }),
    }
}

/// When to try again after a usage limit: the reset time the agent gave, else `fallback` from
/// now. A limit that comes back right after a wait (`repeat` ≥ 2 in a row) waits at least 5
/// minutes, doubling with each repeat up to `fallback`, so a reset time that has passed while the
/// agent still says "limited" (clock skew, a stale message) cannot spin the loop.
pub fn usage_limit_until(
    resume_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    fallback: Duration,
    repeat: u32,
) -> DateTime<Utc> {
    let fallback = chrono::Duration::from_std(fallback).unwrap_or(chrono::Duration::hours(1));
    let until = resume_at.unwrap_or(now + fallback);
    if repeat < 2 {
        return until;
    }
    let backoff = (chrono::Duration::minutes(REPEAT_LIMIT_BACKOFF_MIN)
        * (1i32 << (repeat - 2).min(10)))
    .min(fallback);
    until.max(now + backoff)
}

/// The wait before retry `n` (1-based) after transient failures: `base` doubled each time, capped
/// at 10 minutes, plus up to 20 % jitter (`jitter` in `[0, 1)`) so that many runs do not retry
/// in step.
pub fn transient_wait(base: Duration, n: u32, jitter: f64) -> Duration {
    let doubled = base.saturating_mul(1u32 << n.saturating_sub(1).min(16));
    let capped = doubled.min(MAX_TRANSIENT_WAIT);
    capped + capped.mul_f64(jitter.clamp(0.0, 1.0) * 0.2)
}

/// The open stories of `prd`, by id.
pub fn open_ids(prd: &Prd) -> Vec<String> {
    prd.user_stories
        .iter()
        .filter(|s| !s.passes)
        .map(|s| s.id.clone())
        .collect()
}

/// `--max-cost` already reached before the first iteration (the feature's earlier runs, in
/// `t.cost_usd`, spent it): the stop, naming the last recorded iteration `last_iteration`.
pub fn spent_before_start(t: &Tally, b: &Budgets, last_iteration: u32) -> Option<StopReason> {
    let max = b.max_cost?;
    (t.cost_usd >= max).then_some(StopReason::MaxCost {
        spent_usd: t.cost_usd,
        max_usd: max,
        iteration: last_iteration,
        before_start: true,
    })
}

/// `--resume-only`: whether a schedule may go on with this PRD, from how its last run ended
/// (`last`, state.json's `stop_reason`, `None` when that run recorded no end or there was
/// none).
///
/// Resumable are the stops that pass by themselves: a usage limit, `--max-duration`, a signal,
/// and a run that recorded no end (killed: SIGKILL, OOM, a lost node). A PRD that never ran
/// starts (a schedule picks up a new PRD; nobody has decided anything about it yet). Everything
/// else (done, `--max-iter`, a budget, blocked stories, `ralph stop`, a refused push, a human
/// needed) is not: rerunning it would turn a run's limits into limits per schedule tick.
///
/// # Errors
/// The sentence saying why nothing runs, when the run is not resumable.
pub fn resumable(last: Option<&StopReason>) -> Result<(), String> {
    match last {
        None => Ok(()),
        Some(
            StopReason::UsageLimit { .. }
            | StopReason::MaxDuration { .. }
            | StopReason::Interrupted { .. },
        ) => Ok(()),
        Some(StopReason::Complete) => {
            Err("nothing to resume: the last run completed every story".into())
        }
        Some(reason) => Err(format!(
            "not resumed (--resume-only): the last run stopped with exit {1}: {0}. That needs a human, not a schedule: deal with it, then run `ralph run` by hand",
            reason.sentence(),
            reason.exit_status().code()
        )),
    }
}

pub mod agents;
pub mod ready;
#[cfg(test)]
mod tests;
