//! ralph: a trustworthy orchestrator for long, unattended coding-agent runs.
//!
//! The outer loop ([`driver`]) picks a story from `prd.json`, renders a prompt ([`prompt`]), runs a
//! fresh agent process ([`agent`], [`process`]), classifies what happened, checkpoints in git
//! ([`git`]), appends to `progress.txt` ([`progress`]) and records one ledger line per iteration
//! ([`ledger`]). Long-term memory lives in files: prd.json, progress.txt, git history, and
//! `.ralph/` (state, ledger, transcripts).

#![warn(missing_docs)]

pub mod agent;
pub mod archive;
pub mod cli;
pub mod commands;
pub mod completion;
pub mod config;
pub mod driver;
pub mod error;
pub mod fsutil;
pub mod protocol;

pub mod git;
pub mod ledger;
pub mod local;
pub mod lock;
pub mod native;
pub mod prd;
pub mod process;
pub mod progress;
pub mod prompt;
pub mod signals;
pub mod state;
pub mod stop_request;
pub mod transcript;
pub mod ui;
pub mod workspace;
