//! Everything a run tells the outside world, as typed events. The loop sends each [`RunEvent`] to
//! every output (the terminal, `--json`, and later the report and notifications); no output is
//! written any other way. On the `--json` stream each event is one line,
//! `{"event": "<snake_case name>", "at": "<RFC 3339 UTC>", ...its fields}`; its JSON Schema is
//! `run-events.schema.json`, generated from these types ([`JsonEvent`]) and checked by a drift
//! test.

use std::time::Duration;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::agent_event::AgentEvent;
use super::outcome::Outcome;
use super::record::{LedgerRecord, VerifyRecord};
use super::stop::StopReason;
use super::time::rfc3339;

/// One line of the run header: a setting and its effective value (`("agent", "claude 2.1 …")`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Setting {
    /// The setting's name, e.g. `branch`.
    pub key: String,
    /// Its value as shown.
    pub value: String,
}

/// Why a run is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The agent hit a usage limit; the wait lasts until it resets (plus a margin).
    UsageLimit,
    /// A transient failure; the wait is a doubling backoff.
    Retry,
}

/// Why the run moved to another agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SwitchReason {
    /// The agent before hit a usage limit (it is tried again after `from_resets_at`).
    UsageLimit,
    /// The agent before failed to log in: it is out of the rotation for the rest of the run.
    AuthError,
    /// An agent earlier in the order is past its reset: the next iteration probes it.
    ResetPassed,
}

/// One agent's share of a run with fallback agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentTotals {
    /// The agent (profile) name.
    pub agent: String,
    /// Its iterations in this run.
    pub iterations: u32,
    /// Their reported or priced cost, USD (`None`: none reported).
    pub cost_usd: Option<f64>,
}

/// A run's outcome in numbers: what `run_finished` carries and the summary shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunSummary {
    /// Why the run ended.
    pub stop_reason: StopReason,
    /// The process exit code it maps to.
    pub exit_code: u8,
    /// One-line headline, e.g. `complete: every story passes (3 of 3)`.
    pub headline: String,
    /// Whether the run ended well (exit 0).
    pub success: bool,
    /// Stories passing at the end.
    pub passed: usize,
    /// Stories still open at the end, by id.
    pub open: Vec<String>,
    /// Stories blocked after too many attempts.
    pub blocked: Vec<String>,
    /// Iterations run in this invocation (usage-limit and transient retries included).
    pub iterations: u32,
    /// First and last iteration numbers run in this invocation.
    pub iteration_range: Option<(u32, u32)>,
    /// Wall time of the run, in seconds.
    pub elapsed_s: f64,
    /// Cost of this run in USD; `null` when no iteration reported one.
    pub cost_usd: Option<f64>,
    /// Input tokens of this run (cached ones included); `null` when no iteration reported any.
    pub tokens_in: Option<u64>,
    /// Output tokens of this run; `null` when no iteration reported any.
    pub tokens_out: Option<u64>,
    /// Path of the ledger, relative to the repository root.
    pub ledger: String,
    /// What the user should do next.
    pub next: String,
    /// Things to check even when the run completed; the first may be the stop reason's
    /// sentence (`stopped: …`).
    pub caveats: Vec<String>,
    /// When a usage limit the run stopped at resets (UTC).
    #[serde(with = "rfc3339::option")]
    #[schemars(with = "Option<String>")]
    pub resume_at: Option<DateTime<Utc>>,
    /// `--push`: where the run branch stands on the remote at the end; absent without `--push`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushSummary>,
    /// In a run with fallback agents: each agent's iterations and cost, in the order they
    /// first ran (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_agent: Vec<AgentTotals>,
    /// When a signal ended the run: seconds from the first signal to the end of the shutdown
    /// (agent stopped, checkpoint, ledger, state, push, lease released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_s: Option<f64>,
}

/// Where a `--push` run left the remote (the summary's `push` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PushSummary {
    /// The remote's name, e.g. `origin`.
    pub remote: String,
    /// The run branch.
    pub branch: String,
    /// The local branch's head at the end (full sha).
    pub local_head: Option<String>,
    /// The newest commit the remote is known to have from this run (full sha).
    pub pushed_head: Option<String>,
    /// Commits on the local branch that the remote does not have (0: all pushed).
    pub unpushed_commits: u32,
    /// Why they are not pushed: git's last error, credentials removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Whether this worker released the branch's lease.
    pub lease_released: bool,
}

impl RunSummary {
    /// The run's wall time.
    pub fn elapsed(&self) -> Duration {
        Duration::from_secs_f64(self.elapsed_s.max(0.0))
    }
}

/// Something that happened in a run, for the outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// The previous feature's prd.json and progress.txt were archived before the run.
    Archived {
        /// The archive folder, relative to the repository root.
        folder: String,
        /// The files written into it.
        files: Vec<String>,
        /// The archived prd.json's `branchName`.
        branch: Option<String>,
        /// One line saying what was archived.
        message: String,
    },
    /// The run is about to start its first iteration.
    RunStarted {
        /// The run id.
        run_id: String,
        /// prd.json's path.
        prd: String,
        /// The backend's name.
        agent: String,
        /// The iteration budget.
        max_iter: u32,
        /// The effective settings, as the header shows them.
        settings: Vec<Setting>,
    },
    /// A line for the human reader (set-up progress, repairs); not in the `--json` stream.
    Notice {
        /// The text.
        message: String,
    },
    /// Something the user should know; the run goes on.
    Warning {
        /// The text.
        message: String,
        /// The iteration it is about, when it is about one (absent for the run's own warnings).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iteration: Option<u32>,
    },
    /// An iteration started: its agent is about to run.
    IterationStarted {
        /// The iteration number (global to the repository).
        iteration: u32,
        /// Its place in this run's budget (1-based).
        slot: u32,
        /// This run's `--max-iter`.
        max_iter: u32,
        /// The story.
        story_id: String,
        /// Its title.
        story_title: String,
        /// The backend's name.
        backend: String,
        /// The agent's (profile) name, when the run has fallback agents (`[[agents]]`,
        /// `--fallback-agent`); absent in a run with one agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        /// `--parallel`: the worker slot running it (1-based); absent in a serial run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<u32>,
    },
    /// The exact command line of the agent (`--verbose`).
    AgentCommand {
        /// The iteration whose agent it is.
        iteration: u32,
        /// Pasteable into a shell; secrets shown as `<redacted>`.
        command: String,
    },
    /// One normalized event from the agent's output (`--verbose` for `--json`).
    AgentEvent {
        /// The iteration whose agent said it; 0 in a `ralph plan`/`convert` answer session,
        /// which is no iteration.
        iteration: u32,
        /// The event.
        agent_event: AgentEvent,
    },
    /// A verify command is about to run.
    VerifyStarted {
        /// The iteration whose gate runs it.
        iteration: u32,
        /// The story it checks.
        story_id: String,
        /// The command.
        command: String,
    },
    /// A verify command ended.
    VerifyFinished {
        /// The iteration whose gate ran it.
        iteration: u32,
        /// What it did.
        verify: VerifyRecord,
    },
    /// An iteration ended: committed, recorded in the ledger and in state.json.
    IterationFinished {
        /// The iteration (the record's `iteration`, on the event too so that every
        /// iteration-scoped `--json` line names it at the same place).
        iteration: u32,
        /// The ledger record.
        record: Box<LedgerRecord>,
        /// Its place in this run's budget (1-based).
        slot: u32,
        /// This run's `--max-iter`.
        max_iter: u32,
    },
    /// A story used up `--max-attempts` and is skipped from now on.
    StoryBlocked {
        /// The story.
        story_id: String,
        /// Its attempts.
        attempts: u32,
        /// Its last iteration's outcome.
        last_outcome: Outcome,
        /// Its last iteration's message.
        last_message: Option<String>,
    },
    /// The next iteration runs on another agent than the one before (fallback agents).
    AgentSwitched {
        /// The agent (profile) name of the iteration before.
        from: String,
        /// The agent of the next iteration.
        to: String,
        /// Why.
        reason: SwitchReason,
        /// For a usage limit: when `from` resets (UTC).
        #[serde(
            default,
            with = "rfc3339::option",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(with = "Option<String>")]
        from_resets_at: Option<DateTime<Utc>>,
    },
    /// The run is waiting before it goes on.
    Waiting {
        /// Why.
        reason: WaitReason,
        /// Until when (UTC).
        #[serde(with = "rfc3339")]
        #[schemars(with = "String")]
        until: DateTime<Utc>,
        /// The story that runs again after the wait; absent (`None`) when no one story does: a
        /// reset a previous ralph was waiting for when the run starts, or a `--parallel` run's
        /// usage-limit wait (every story waits).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        story_id: Option<String>,
        /// The retry number (transient) or the usage-limit wait number of this run (1-based).
        attempt: u32,
        /// The limit of such retries or waits.
        max: u32,
    },
    /// `ralph pause`: the run holds between iterations (the lock kept, no new iteration) until
    /// `ralph resume` or `ralph stop`.
    Paused {
        /// When the pause was asked (UTC).
        #[serde(with = "rfc3339")]
        #[schemars(with = "String")]
        since: DateTime<Utc>,
    },
    /// `ralph resume` ended a pause; the next iteration starts.
    Resumed {
        /// How long the run held, in seconds.
        paused_s: f64,
    },
    /// The run ended. Nothing follows.
    RunFinished(Box<RunSummary>),
}

impl RunEvent {
    /// The snake_case event name (the `event` field on the wire).
    pub fn name(&self) -> &'static str {
        match self {
            RunEvent::Archived { .. } => "archived",
            RunEvent::RunStarted { .. } => "run_started",
            RunEvent::Notice { .. } => "notice",
            RunEvent::Warning { .. } => "warning",
            RunEvent::IterationStarted { .. } => "iteration_started",
            RunEvent::AgentCommand { .. } => "agent_command",
            RunEvent::AgentEvent { .. } => "agent_event",
            RunEvent::VerifyStarted { .. } => "verify_started",
            RunEvent::VerifyFinished { .. } => "verify_finished",
            RunEvent::IterationFinished { .. } => "iteration_finished",
            RunEvent::StoryBlocked { .. } => "story_blocked",
            RunEvent::AgentSwitched { .. } => "agent_switched",
            RunEvent::Waiting { .. } => "waiting",
            RunEvent::Paused { .. } => "paused",
            RunEvent::Resumed { .. } => "resumed",
            RunEvent::RunFinished(_) => "run_finished",
        }
    }
}

/// One line of the `--json` stream: the event, with the time it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JsonEvent {
    /// When the event was written (RFC 3339 UTC).
    pub at: String,
    /// The event; its `event` field names it.
    #[serde(flatten)]
    pub event: RunEvent,
}

/// The JSON Schema (draft 2020-12) of one `--json` line ([`JsonEvent`]) as pretty-printed JSON
/// with a trailing newline: exactly the content of the committed `run-events.schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(JsonEvent);
    let value = schema.as_value();
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

/// Whether a committed-schema test should rewrite its file instead of comparing: only when
/// `RALPH_UPDATE_SCHEMA` is exactly `1` (`value` is the variable's value). Anything else, `0`
/// and empty included, compares, so that a stray setting cannot hide a drift.
#[cfg(test)]
pub(crate) fn schema_update_requested(value: Option<&str>) -> bool {
    value == Some("1")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGENERATE: &str = "RALPH_UPDATE_SCHEMA=1 cargo test --features test-fakes schema";

    #[test]
    fn only_ralph_update_schema_1_rewrites_the_committed_schemas() {
        assert!(schema_update_requested(Some("1")));
        for value in [None, Some("0"), Some(""), Some("false"), Some("yes")] {
            assert!(!schema_update_requested(value), "{value:?}");
        }
    }

    #[test]
    fn committed_run_events_schema_matches_the_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/run-events.schema.json");
        let generated = schema_json();
        if schema_update_requested(std::env::var("RALPH_UPDATE_SCHEMA").ok().as_deref()) {
            std::fs::write(path, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "run-events.schema.json is out of date with src/protocol/; regenerate it with `{REGENERATE}`"
        );
    }

    #[test]
    fn every_event_kind_validates_against_the_schema() {
        let schema: serde_json::Value = serde_json::from_str(&schema_json()).unwrap();
        let v = jsonschema::validator_for(&schema).unwrap();
        let at = "2026-12-01T12:00:00.000Z".to_string();
        let record = LedgerRecord::new("r", 1, "US-001", Outcome::StoryPassed, Utc::now());
        let events = [
            RunEvent::Warning {
                message: "w".into(),
                iteration: None,
            },
            RunEvent::Warning {
                message: "w".into(),
                iteration: Some(2),
            },
            RunEvent::IterationFinished {
                iteration: 1,
                record: Box::new(record),
                slot: 1,
                max_iter: 3,
            },
            RunEvent::Waiting {
                reason: WaitReason::UsageLimit,
                until: Utc::now(),
                story_id: Some("US-001".into()),
                attempt: 1,
                max: 3,
            },
            RunEvent::Paused { since: Utc::now() },
            RunEvent::Resumed { paused_s: 1.5 },
        ];
        for event in events {
            let line = serde_json::to_value(JsonEvent {
                at: at.clone(),
                event,
            })
            .unwrap();
            let errors: Vec<String> = v.iter_errors(&line).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{line}: {errors:?}");
        }
        let bad = serde_json::json!({"at": at, "event": "no_such_event"});
        assert!(!v.is_valid(&bad));
    }

    /// With several iterations in flight (`--parallel`), a `--json` reader tells their lines
    /// apart by the top-level `iteration` field: every iteration-scoped event has it, and it
    /// validates against the committed schema; a run-level warning has none.
    #[test]
    fn every_iteration_scoped_json_line_names_its_iteration() {
        let schema: serde_json::Value = serde_json::from_str(&schema_json()).unwrap();
        let v = jsonschema::validator_for(&schema).unwrap();
        let verify = VerifyRecord {
            story_id: "US-002".into(),
            command: "true".into(),
            passed: true,
            result: None,
            output_tail: String::new(),
            interrupted: false,
        };
        let mut record = LedgerRecord::new("r", 7, "US-002", Outcome::StoryPassed, Utc::now());
        record.worker = Some(2);
        let scoped = [
            RunEvent::IterationStarted {
                iteration: 7,
                slot: 2,
                max_iter: 9,
                story_id: "US-002".into(),
                story_title: "t".into(),
                backend: "claude".into(),
                agent: None,
                worker: Some(2),
            },
            RunEvent::AgentCommand {
                iteration: 7,
                command: "claude -p".into(),
            },
            RunEvent::AgentEvent {
                iteration: 7,
                agent_event: AgentEvent::AssistantText { text: "hi".into() },
            },
            RunEvent::VerifyStarted {
                iteration: 7,
                story_id: "US-002".into(),
                command: "true".into(),
            },
            RunEvent::VerifyFinished {
                iteration: 7,
                verify,
            },
            RunEvent::Warning {
                message: "iteration 7: w".into(),
                iteration: Some(7),
            },
            RunEvent::IterationFinished {
                iteration: 7,
                record: Box::new(record),
                slot: 2,
                max_iter: 9,
            },
        ];
        for event in scoped {
            let name = event.name();
            let line = serde_json::to_value(JsonEvent {
                at: "2026-12-01T12:00:00.000Z".into(),
                event,
            })
            .unwrap();
            assert_eq!(line["iteration"], serde_json::json!(7), "{name}: {line}");
            let errors: Vec<String> = v.iter_errors(&line).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{line}: {errors:?}");
        }
        let run_level = serde_json::to_value(RunEvent::Warning {
            message: "w".into(),
            iteration: None,
        })
        .unwrap();
        assert!(run_level.get("iteration").is_none(), "{run_level}");
    }
}
