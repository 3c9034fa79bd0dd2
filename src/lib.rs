//! ralph: a trustworthy orchestrator for long, unattended coding-agent runs.
//!
//! The loop ([`run`]) picks a story from `prd.json` ([`prd`]), renders a prompt ([`prompt`]),
//! runs a fresh agent process ([`agent`] describes it, [`process`] runs it, [`native`] is ralph's
//! own tool loop), inspects and classifies what happened, checkpoints in git ([`git`]), appends
//! to `progress.txt` ([`progress`]), records one ledger line per iteration ([`ledger`]) and
//! decides what comes next ([`run::policy`]). Everything the user sees is a typed run event
//! ([`protocol::RunEvent`]) sent to the outputs ([`output`]). Long-term memory lives in files:
//! prd.json, progress.txt, git history, and `.ralph/` ([`workspace`]: state, ledger,
//! transcripts), read back through [`history`].
//!
//! docs/architecture.md has the module map, the flow of one iteration, and where each kind of
//! change goes.

#![warn(missing_docs)]

pub mod agent;
pub mod archive;
pub mod ask;
pub mod cli;
pub mod commands;
pub mod completion;
pub mod config;
pub mod convert;
pub mod error;
pub mod fsutil;
pub mod git;
pub mod hints;
pub mod history;
pub mod ledger;
pub mod local;
pub mod lock;
pub mod native;
pub mod notify;
pub mod output;
pub mod pause_request;
pub mod plan;
pub mod prd;
pub mod process;
pub mod progress;
pub mod prompt;
pub mod protocol;
pub mod redact;
pub mod remote;
pub mod report;
pub mod run;
pub mod signals;
pub mod state;
pub mod stop_request;
pub mod transcript;
pub mod watch;
pub mod workspace;
pub mod worktree;
