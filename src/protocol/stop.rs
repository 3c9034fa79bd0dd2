//! Why a run ended: one typed [`StopReason`] per run, decided by the run policy, mapped to the
//! exit code, written into the summary, `--json`'s `run_finished`, `state.json` and
//! `ralph status --json` as a field (`{"kind": "max_failures", ...}`), and worded once here.

use chrono::{DateTime, Local, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::exit::ExitStatus;
use super::outcome::Outcome;
use super::time::rfc3339;

/// What the run was doing when a stop condition ended it, for the reasons that can come during a
/// wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum During {
    /// Between iterations (or at the start, before any).
    BetweenIterations,
    /// Waiting for a usage limit to reset.
    UsageLimitWait,
    /// Waiting to retry after a transient failure.
    RetryWait,
}

/// Why a usage limit ended the run instead of being waited out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "because")]
pub enum UsageLimitStop {
    /// `--no-wait` was given.
    NoWait,
    /// The run already waited `max_usage_limit_waits` times.
    TooManyWaits {
        /// Usage limits hit in this run.
        waits: u32,
    },
    /// The reset comes after `--max-duration` ends (seconds of the limit).
    PastMaxDuration {
        /// `--max-duration`, in seconds.
        max_duration_s: u64,
    },
}

/// One limited agent of a [`StopReason::UsageLimit`]: its (profile) name and its reset.
///
/// On the wire: `{"agent": "claude", "resets_at": "2026-12-01T14:00:00.000Z"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentReset {
    /// The agent's (profile) name, e.g. `claude` or `backup`.
    pub agent: String,
    /// When its usage limit resets (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    #[schemars(with = "String")]
    pub resets_at: DateTime<Utc>,
}

/// What a streak of iterations that ended a run (`--max-failures`, `--max-no-progress`) was made
/// of, so that the reason names the real cause (`agent_error ×4`) rather than only the limit.
///
/// On the wire: `{"outcomes": [{"outcome": "agent_error", "count": 4}], "last_message": "…",
/// "stories": ["US-001", "US-002"]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StreakCause {
    /// Each outcome in the streak with how many iterations ended with it, the dominant (most
    /// frequent; on a tie, the latest) first. The counts add up to the streak's length.
    pub outcomes: Vec<OutcomeCount>,
    /// The message of the last iteration that ended with the dominant outcome, when it had one.
    pub last_message: Option<String>,
    /// The stories the streak went through, in order (more than one when it outlived a block).
    pub stories: Vec<String>,
}

/// One outcome of a [`StreakCause`] and how many iterations of the streak ended with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutcomeCount {
    /// The outcome.
    pub outcome: Outcome,
    /// Iterations of the streak that ended with it (≥ 1).
    pub count: u32,
}

impl StreakCause {
    /// The dominant outcome, when the streak had any.
    pub fn dominant(&self) -> Option<Outcome> {
        self.outcomes.first().map(|o| o.outcome)
    }

    /// `: agent_error ×4 across US-001 (blocked after …) and US-002; the last: boom`, the tail
    /// of the sentences of [`StopReason::MaxFailures`] and [`StopReason::NoProgress`];
    /// `blocked_why` says why a story the streak went through was blocked.
    fn describe(&self, blocked_why: &str) -> String {
        let counts: Vec<String> = self
            .outcomes
            .iter()
            .map(|o| format!("{} ×{}", o.outcome, o.count))
            .collect();
        let mut s = format!(": {}", counts.join(", "));
        if let Some((last, blocked)) = self.stories.split_last() {
            if !blocked.is_empty() {
                s.push_str(&format!(
                    " across {} (blocked after {blocked_why}) and {last}",
                    blocked.join(", ")
                ));
            }
        }
        if let Some(m) = self
            .last_message
            .as_deref()
            .filter(|m| !m.trim().is_empty())
        {
            let which = match (self.dominant(), self.outcomes.len()) {
                (Some(o), n) if n > 1 => format!("the last {o}"),
                _ => "the last".to_owned(),
            };
            s.push_str(&format!("; {which}: {}", truncate_chars(m, 200)));
        }
        s
    }
}

/// Every way a `ralph run` ends once it has started its loop. Preflight errors (a broken
/// prd.json, a missing agent) are errors, not stop reasons.
///
/// Serialized as an object tagged by `kind` (snake_case): `{"kind": "complete"}`,
/// `{"kind": "max_iterations", "max_iter": 10, "open": ["US-002"]}`, …
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopReason {
    /// Every story in prd.json passes (exit 0).
    Complete,
    /// The run used its `--max-iter` budget with stories still open (exit 3).
    MaxIterations {
        /// The budget.
        max_iter: u32,
        /// Stories still open, by id.
        open: Vec<String>,
    },
    /// The run reached `--max-duration` (exit 4).
    MaxDuration {
        /// The limit, in seconds.
        max_duration_s: u64,
        /// Whether it was reached between iterations or would be passed by a retry wait.
        during: During,
    },
    /// The cost reached `--max-cost` (exit 4).
    MaxCost {
        /// The cost counted against the limit, in USD: the feature's runs (`--budget-scope
        /// feature`, the default) or this run (`--budget-scope run`).
        spent_usd: f64,
        /// The limit, in USD.
        max_usd: f64,
        /// The iteration that crossed it (committed and recorded); with `before_start`, the
        /// feature's last recorded iteration (of an earlier run).
        iteration: u32,
        /// The feature's earlier runs had already reached the limit (`--budget-scope feature`):
        /// this run stopped before its first iteration.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        before_start: bool,
    },
    /// `--max-failures` failed iterations in a row (exit 4).
    MaxFailures {
        /// Failed iterations in a row.
        failures: u32,
        /// The limit.
        max_failures: u32,
        /// The last one's outcome.
        last_outcome: Outcome,
        /// The last one's message, when it had one.
        last_message: Option<String>,
        /// What the streak was made of: its dominant outcome, the count of each, the stories it
        /// went through (absent in records written before ralph kept it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<StreakCause>,
    },
    /// `--max-no-progress` iterations in a row changed nothing (exit 4).
    NoProgress {
        /// Iterations in a row without a change.
        iterations: u32,
        /// The limit.
        max_no_progress: u32,
        /// What the streak was made of (see [`StreakCause`]; absent in older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<StreakCause>,
    },
    /// More transient failures in a row than `max_transient_retries` (exit 4).
    TransientRetries {
        /// Transient failures in a row.
        failures: u32,
        /// The last one's message.
        last_message: Option<String>,
    },
    /// A usage limit that the run did not wait out (exit 75, `EX_TEMPFAIL`: resumable later).
    UsageLimit {
        /// When the limit resets (UTC); `ralph run` after it continues.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String")]
        resume_at: DateTime<Utc>,
        /// Why the run did not wait.
        why: UsageLimitStop,
        /// Fallback agents: each agent that was limited when the run stopped, with its own
        /// reset, in name order (`resume_at` is the earliest of them). Absent in a run with one
        /// agent and in reasons written before per-agent resets.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        agents: Vec<AgentReset>,
    },
    /// Every open story is blocked after `--max-attempts`, or waits for one that is (exit 4).
    AllBlocked {
        /// The blocked stories.
        blocked: Vec<String>,
    },
    /// A story used up `--max-attempts` and `--stop-on-block` asked to stop there (exit 4).
    StoryBlocked {
        /// The story.
        story_id: String,
        /// Its attempts.
        attempts: u32,
        /// Its last iteration's outcome.
        last_outcome: Outcome,
    },
    /// No open story can be worked on: each waits for a dependency that does not pass (exit 4).
    NoWorkableStory,
    /// Every remaining story passes, but stories were deleted from prd.json during the run
    /// (exit 4): a run is never called complete because stories vanished.
    StoriesDeleted {
        /// The deleted story ids.
        missing: Vec<String>,
        /// This run's id (its refs keep the old prd.json).
        run_id: String,
    },
    /// `ralph stop` asked the run to end (exit 4).
    StopRequested {
        /// What the run was doing when it saw the request.
        during: During,
    },
    /// Ctrl-C, SIGTERM or SIGHUP (exit 130).
    Interrupted {
        /// Whether an agent was running (its iteration was stopped and checkpointed).
        agent_running: bool,
    },
    /// `--push`: the remote refused the run branch (someone else moved it); the local work is
    /// kept, committed on the local branch (exit 1).
    PushRejected {
        /// The remote's name, e.g. `origin`.
        remote: String,
        /// The run branch.
        branch: String,
        /// What git said, credentials removed.
        message: String,
    },
    /// `--push`: another worker took the branch's lease (this one's had expired, e.g. during a
    /// network partition); this worker stops at once, its local work kept (exit 5).
    LeaseLost {
        /// The remote's name.
        remote: String,
        /// The run branch.
        branch: String,
        /// Who holds the lease now (`host pid N job J`), when known.
        holder: Option<String>,
    },
    /// `--resume-only` found nothing to resume: the last run's stop does not pass by itself
    /// (exit 0: a schedule has nothing to do).
    NothingToResume {
        /// Why, naming the last stop, e.g. `the last run stopped at exit 4 …`.
        why: String,
    },
    /// An auth or config error: a human must act (exit 1).
    NeedsHuman {
        /// `auth_error` or `config_error`.
        outcome: Outcome,
        /// The iteration that hit it.
        iteration: u32,
        /// The agent's message.
        message: Option<String>,
    },
}

impl StopReason {
    /// The exit status this reason maps to (README, "Exit codes").
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            StopReason::Complete | StopReason::NothingToResume { .. } => ExitStatus::Success,
            StopReason::MaxIterations { .. } => ExitStatus::MaxIterations,
            StopReason::Interrupted { .. } => ExitStatus::Interrupted,
            StopReason::NeedsHuman { .. } | StopReason::PushRejected { .. } => ExitStatus::Failure,
            StopReason::UsageLimit { .. } => ExitStatus::TempFail,
            StopReason::LeaseLost { .. } => ExitStatus::LeaseHeld,
            _ => ExitStatus::OtherLimit,
        }
    }

    /// The snake_case name of the reason (the `kind` field on the wire).
    pub fn kind(&self) -> &'static str {
        match self {
            StopReason::Complete => "complete",
            StopReason::MaxIterations { .. } => "max_iterations",
            StopReason::MaxDuration { .. } => "max_duration",
            StopReason::MaxCost { .. } => "max_cost",
            StopReason::MaxFailures { .. } => "max_failures",
            StopReason::NoProgress { .. } => "no_progress",
            StopReason::TransientRetries { .. } => "transient_retries",
            StopReason::UsageLimit { .. } => "usage_limit",
            StopReason::AllBlocked { .. } => "all_blocked",
            StopReason::StoryBlocked { .. } => "story_blocked",
            StopReason::NoWorkableStory => "no_workable_story",
            StopReason::StoriesDeleted { .. } => "stories_deleted",
            StopReason::StopRequested { .. } => "stop_requested",
            StopReason::Interrupted { .. } => "interrupted",
            StopReason::PushRejected { .. } => "push_rejected",
            StopReason::LeaseLost { .. } => "lease_lost",
            StopReason::NeedsHuman { .. } => "needs_human",
            StopReason::NothingToResume { .. } => "nothing_to_resume",
        }
    }

    /// A [`StopReason::UsageLimit`] of a run with fallback agents, naming each limited agent
    /// and its reset (`resets`: state.json's `agent_resets`, by agent name); `resume_at` stays
    /// the earliest. Any other reason, or an empty `resets` (one agent), is returned as it is.
    pub fn with_agent_resets(
        self,
        resets: &std::collections::BTreeMap<String, DateTime<Utc>>,
    ) -> StopReason {
        match self {
            StopReason::UsageLimit { resume_at, why, .. } if !resets.is_empty() => {
                StopReason::UsageLimit {
                    resume_at,
                    why,
                    agents: resets
                        .iter()
                        .map(|(agent, at)| AgentReset {
                            agent: agent.clone(),
                            resets_at: *at,
                        })
                        .collect(),
                }
            }
            other => other,
        }
    }

    /// When the run can go on by itself (a usage limit's reset), if it can.
    pub fn resume_at(&self) -> Option<DateTime<Utc>> {
        match self {
            StopReason::UsageLimit { resume_at, .. } => Some(*resume_at),
            _ => None,
        }
    }

    /// Why the run ended, as one sentence for every reason (the readers of history: status,
    /// report, notifications), without the `stopped: ` prefix.
    pub fn sentence(&self) -> String {
        if let Some(why) = self.why() {
            return why
                .strip_prefix("stopped: ")
                .map(str::to_owned)
                .unwrap_or(why);
        }
        match self {
            StopReason::Complete => "complete: every story passes".to_owned(),
            StopReason::NothingToResume { why } => format!("nothing to resume: {why}"),
            StopReason::MaxIterations { max_iter, open } => format!(
                "--max-iter {max_iter} reached with {} open",
                if open.is_empty() {
                    "no story".to_owned()
                } else {
                    open.join(", ")
                }
            ),
            StopReason::Interrupted { .. } => {
                "interrupted (Ctrl-C, SIGTERM or SIGHUP); `ralph run` resumes".to_owned()
            }
            StopReason::NeedsHuman {
                outcome,
                iteration,
                message,
            } => format!(
                "iteration {iteration} ended with {outcome}{}; a human must fix it before `ralph run`",
                message
                    .as_deref()
                    .map(|m| format!(" ({})", truncate_chars(m, 200)))
                    .unwrap_or_default()
            ),
            _ => self.kind().replace('_', " "),
        }
    }

    /// The sentence that says why the run stopped, for the summary's `why:` line; `None` for
    /// the reasons the headline already says (complete, `--max-iter`, interrupted, an auth or
    /// config error).
    pub fn why(&self) -> Option<String> {
        let dur = |s: u64| humantime::format_duration(std::time::Duration::from_secs(s));
        Some(match self {
            StopReason::Complete
            | StopReason::MaxIterations { .. }
            | StopReason::Interrupted { .. }
            | StopReason::NothingToResume { .. }
            | StopReason::NeedsHuman { .. } => return None,
            StopReason::MaxDuration {
                max_duration_s,
                during: During::RetryWait,
            } => format!(
                "stopped: retrying after the transient failure would pass --max-duration {}",
                dur(*max_duration_s)
            ),
            StopReason::MaxDuration { max_duration_s, .. } => format!(
                "stopped: the run reached --max-duration {}",
                dur(*max_duration_s)
            ),
            StopReason::MaxCost {
                spent_usd,
                max_usd,
                before_start: true,
                ..
            } => format!(
                "stopped before any iteration ran: the feature's earlier runs already spent ${spent_usd:.2} of the --max-cost ${max_usd:.2} limit (--budget-scope feature counts every run of the feature); raise --max-cost, or pass --budget-scope run to give this run a budget of its own"
            ),
            StopReason::MaxCost {
                spent_usd,
                max_usd,
                iteration,
                ..
            } => format!(
                "stopped: the cost so far, ${spent_usd:.2}, reached --max-cost ${max_usd:.2} (iteration {iteration}'s work is committed and recorded)"
            ),
            StopReason::MaxFailures {
                failures,
                max_failures,
                cause: Some(cause),
                ..
            } => format!(
                "stopped: {failures} failed iterations in a row (--max-failures {max_failures}){}",
                cause.describe("failing every attempt the same way")
            ),
            StopReason::MaxFailures {
                failures,
                max_failures,
                last_outcome,
                last_message,
                cause: None,
            } => format!(
                "stopped: {failures} failed iterations in a row (--max-failures {max_failures}); the last was {last_outcome}{}",
                last_message
                    .as_deref()
                    .map(|m| format!(": {}", truncate_chars(m, 200)))
                    .unwrap_or_default()
            ),
            StopReason::NoProgress {
                iterations,
                max_no_progress,
                cause,
            } => format!(
                "stopped: {iterations} iterations in a row changed nothing, or only notes (no commit, no file beyond prd.json and progress.txt; --max-no-progress {max_no_progress}){}",
                cause
                    .as_ref()
                    .map(|c| c.describe("every attempt changed nothing"))
                    .unwrap_or_default()
            ),
            StopReason::TransientRetries {
                failures,
                last_message,
            } => format!(
                "stopped after {failures} transient failures in a row (overload, server or network errors); the last: {}",
                last_message.as_deref().unwrap_or_default()
            ),
            StopReason::UsageLimit {
                resume_at,
                why,
                agents,
            } => usage_limit_why(*resume_at, why, agents),
            StopReason::AllBlocked { blocked } => format!(
                "stopped: every open story is blocked ({}) or waits for one; fix what stops them, then `ralph run --unblock`",
                blocked.join(", ")
            ),
            StopReason::StoryBlocked {
                story_id,
                attempts,
                last_outcome,
            } => format!(
                "stopped: {story_id} is blocked after {attempts} attempt{} (last: {last_outcome}) and --stop-on-block is set; fix what stops it, then `ralph run --unblock`", if *attempts == 1 { "" } else { "s" }
            ),
            StopReason::NoWorkableStory => "stopped: no open story can be worked on (each waits for a dependency that does not pass)".to_string(),
            StopReason::StoriesDeleted { missing, .. } => {
                let one = missing.len() == 1;
                format!(
                    "stopped: every remaining story passes, but {} {} deleted from prd.json during the run; restore {} (`git log -p -- prd.json` shows the commit that removed {}, and `git show <that commit>^:prd.json` the file before it) and run again",
                    missing.join(", "),
                    if one { "was" } else { "were" },
                    if one { "it" } else { "them" },
                    if one { "it" } else { "them" },
                )
            }
            StopReason::PushRejected { remote, branch, message } => format!(
                "stopped: {remote} rejected the push of {branch} (someone else moved it: {}); the local branch keeps every commit. Fetch, look at both histories, and reconcile them by hand before `ralph run --push` again",
                truncate_chars(message, 200)
            ),
            StopReason::LeaseLost { remote, branch, holder } => format!(
                "stopped: another worker{} took the lease on {branch} at {remote} (this worker's had expired); its local work is kept but not pushed",
                holder.as_deref().map(|h| format!(" ({h})")).unwrap_or_default()
            ),
            StopReason::StopRequested { during } => match during {
                During::BetweenIterations => {
                    "stopped by `ralph stop` (after the iteration in progress finished)".to_string()
                }
                During::RetryWait => "stopped by `ralph stop` while waiting to retry".to_string(),
                During::UsageLimitWait => "stopped by `ralph stop` while waiting for the usage limit to reset; `ralph run` later waits for the same reset".to_string(),
            },
        })
    }
}

/// `2026-12-01 14:00 +01:00` in local time, with its offset from UTC (a reader in another
/// zone, or a log read later, must not guess).
fn local_time(at: DateTime<Utc>) -> String {
    at.with_timezone(&Local)
        .format("%Y-%m-%d %H:%M %:z")
        .to_string()
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// [`StopReason::why`] for a usage limit: when each agent resets (`agents`, when the run had
/// fallbacks), else when the one agent does (`resume_at`), and why ralph did not wait.
fn usage_limit_why(
    resume_at: DateTime<Utc>,
    why: &UsageLimitStop,
    agents: &[AgentReset],
) -> String {
    let dur = |s: u64| humantime::format_duration(std::time::Duration::from_secs(s));
    let at = local_time(resume_at);
    if !agents.is_empty() {
        let each: Vec<String> = agents
            .iter()
            .map(|a| format!("{} at {}", a.agent, local_time(a.resets_at)))
            .collect();
        let limited = format!(
            "every agent hit its usage limit; they reset: {}",
            each.join(", ")
        );
        return match why {
            UsageLimitStop::NoWait => format!(
                "stopped: {limited}; not waiting (--no-wait), run `ralph run` again after {at}"
            ),
            UsageLimitStop::TooManyWaits { waits } => format!(
                "stopped: {limited}; usage limits came {waits} times in this run, so it stopped instead of waiting again"
            ),
            UsageLimitStop::PastMaxDuration { max_duration_s } => format!(
                "stopped: {limited}; the first is after --max-duration {} ends; not waiting, run `ralph run` again then",
                dur(*max_duration_s)
            ),
        };
    }
    match why {
        UsageLimitStop::NoWait => format!(
            "stopped: the agent's usage limit resets at {at}; not waiting (--no-wait), run `ralph run` again then"
        ),
        UsageLimitStop::TooManyWaits { waits } => format!(
            "stopped: the agent hit a usage limit {waits} times in this run; stopped instead of waiting again (it resets at {at})"
        ),
        UsageLimitStop::PastMaxDuration { max_duration_s } => format!(
            "stopped: the agent's usage limit resets at {at}, after --max-duration {} ends; not waiting, run `ralph run` again then",
            dur(*max_duration_s)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_maps_to_its_documented_exit_code() {
        let cases = [
            (StopReason::Complete, 0),
            (
                StopReason::MaxIterations {
                    max_iter: 3,
                    open: vec!["US-001".into()],
                },
                3,
            ),
            (StopReason::NoWorkableStory, 4),
            (
                StopReason::UsageLimit {
                    resume_at: Utc::now(),
                    why: UsageLimitStop::NoWait,
                    agents: Vec::new(),
                },
                75,
            ),
            (
                StopReason::UsageLimit {
                    resume_at: Utc::now(),
                    why: UsageLimitStop::PastMaxDuration { max_duration_s: 60 },
                    agents: Vec::new(),
                },
                75,
            ),
            (
                StopReason::PushRejected {
                    remote: "origin".into(),
                    branch: "ralph/x".into(),
                    message: "non-fast-forward".into(),
                },
                1,
            ),
            (
                StopReason::LeaseLost {
                    remote: "origin".into(),
                    branch: "ralph/x".into(),
                    holder: None,
                },
                5,
            ),
            (
                StopReason::StopRequested {
                    during: During::BetweenIterations,
                },
                4,
            ),
            (
                StopReason::Interrupted {
                    agent_running: true,
                },
                130,
            ),
            (
                StopReason::NeedsHuman {
                    outcome: Outcome::AuthError,
                    iteration: 1,
                    message: None,
                },
                1,
            ),
        ];
        for (reason, code) in cases {
            assert_eq!(reason.exit_status().code(), code, "{reason:?}");
        }
    }

    #[test]
    fn a_streak_reason_without_a_cause_still_reads_and_says_its_limit() {
        // state.json written before ralph kept the cause.
        let old = serde_json::json!({"kind": "no_progress", "iterations": 3, "max_no_progress": 3});
        let r: StopReason = serde_json::from_value(old).unwrap();
        assert_eq!(
            r,
            StopReason::NoProgress {
                iterations: 3,
                max_no_progress: 3,
                cause: None
            }
        );
        assert!(r.why().unwrap().ends_with("--max-no-progress 3)"));
        assert!(serde_json::to_value(&r).unwrap().get("cause").is_none());
        let with = StopReason::MaxFailures {
            failures: 2,
            max_failures: 2,
            last_outcome: Outcome::Timeout,
            last_message: Some("t".into()),
            cause: Some(StreakCause {
                outcomes: vec![OutcomeCount {
                    outcome: Outcome::Timeout,
                    count: 2,
                }],
                last_message: None,
                stories: vec!["US-001".into()],
            }),
        };
        assert_eq!(
            with.why().unwrap(),
            "stopped: 2 failed iterations in a row (--max-failures 2): timeout ×2"
        );
        let back: StopReason =
            serde_json::from_value(serde_json::to_value(&with).unwrap()).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn the_wire_form_is_tagged_by_kind() {
        let r = StopReason::AllBlocked {
            blocked: vec!["US-001".into()],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "all_blocked");
        assert_eq!(v["blocked"][0], "US-001");
        assert_eq!(r.kind(), "all_blocked");
        let back: StopReason = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_usage_limit_names_each_limited_agent_and_reads_its_older_form() {
        use chrono::TimeZone;
        let at = |h| Utc.with_ymd_and_hms(2026, 12, 1, h, 0, 0).unwrap();
        let resets: std::collections::BTreeMap<String, DateTime<Utc>> =
            [("claude".to_owned(), at(14)), ("backup".to_owned(), at(15))].into();
        let r = StopReason::UsageLimit {
            resume_at: at(14),
            why: UsageLimitStop::NoWait,
            agents: Vec::new(),
        }
        .with_agent_resets(&resets);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["agents"][0]["agent"], "backup");
        assert_eq!(v["agents"][0]["resets_at"], "2026-12-01T15:00:00.000Z");
        assert_eq!(v["agents"][1]["agent"], "claude");
        let sentence = r.sentence();
        assert!(
            sentence.contains(&format!(
                "every agent hit its usage limit; they reset: backup at {}, claude at {}",
                local_time(at(15)),
                local_time(at(14))
            )),
            "{sentence}"
        );
        assert!(sentence.contains("--no-wait"), "{sentence}");
        let back: StopReason = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        // A state.json of an older ralph: no `agents`; a run with one agent writes none.
        let old = serde_json::json!({"kind": "usage_limit", "resume_at": "2026-12-01T14:00:00Z",
            "why": {"because": "no_wait"}});
        let r: StopReason = serde_json::from_value(old).unwrap();
        assert!(matches!(&r, StopReason::UsageLimit { agents, .. } if agents.is_empty()));
        let one = r.with_agent_resets(&Default::default());
        assert!(serde_json::to_value(&one).unwrap().get("agents").is_none());
        assert!(one.sentence().contains("the agent's usage limit resets at"));
    }
}
