//! ralph's shared vocabulary: the types that many modules speak, in leaf modules that import
//! nothing from the rest of the crate (the shape of codex-rs's `protocol` crate).
//!
//! - [`kinds`]: the closed sets chosen on the command line or in ralph.toml ([`AgentKind`],
//!   [`ProviderKind`], [`ToolMode`], [`PrdGuard`], [`BudgetScope`]).
//! - [`outcome`]: how an iteration ended ([`Outcome`]) and what each outcome counts toward.
//! - [`usage`]: tokens ([`Usage`], one type for the agent CLIs and the native loop), prices and
//!   where a cost came from.
//! - [`agent_event`]: what a backend reads from an agent ([`AgentEvent`], [`AgentReport`],
//!   [`FailureClass`]).
//! - [`record`]: one iteration as the ledger keeps it ([`LedgerRecord`]).
//! - [`stop`]: why a run ended ([`StopReason`]), which decides the exit code.
//! - [`run_event`]: everything a run tells its outputs ([`RunEvent`]).
//! - [`exit`]: the documented exit codes ([`ExitStatus`]).
//! - [`time`]: the RFC 3339 timestamp format of every file ralph writes.
//!
//! The rule that keeps this a leaf: nothing here may `use crate::` anything outside
//! `protocol/` (checked by the architecture test in `tests/it/architecture.rs`).

pub mod agent_event;
pub mod exit;
pub mod fields;
pub mod kinds;
pub mod outcome;
pub mod record;
pub mod run_event;
pub mod stop;
pub mod time;
pub mod usage;

pub use agent_event::{AgentEvent, AgentReport, FailureClass};
pub use exit::{ExitStatus, Retry};
pub use kinds::{AgentKind, BudgetScope, PrdGuard, ProviderKind, SandboxMode, ToolMode};
pub use outcome::{Outcome, UnknownOutcome};
pub use record::{
    CriteriaProposal, HintRecord, HistoryRewrite, LandingKind, LandingRecord, LedgerRecord,
    PushRecord, PushStatus, Rebuilt, ShutdownRecord, StrayFound, StrayProcess, VerifyRecord,
};
pub use run_event::RunEvent;
pub use stop::{OutcomeCount, StopReason, StreakCause};
pub use usage::{CostSource, Price, Usage};
