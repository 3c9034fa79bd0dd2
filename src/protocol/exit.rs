//! Process exit codes, as documented in README.md ("Exit codes").

use std::process::ExitCode;

/// How a ralph command ended. Each variant maps to one documented exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: the command succeeded; for `ralph run`, every story passes.
    Success,
    /// 1: an error the user must fix (configuration, auth, git, unreadable or invalid files).
    Failure,
    /// 2: a usage error: a command line that is wrong on its face (clap's own errors, and
    /// flag values ralph refuses, such as `--max-iter 0`).
    Usage,
    /// 3: `--max-iter` was reached with stories still open.
    MaxIterations,
    /// 4: stopped by another limit (reserved for budgets, blocked stories, `ralph stop`).
    OtherLimit,
    /// 130: interrupted by Ctrl-C, SIGTERM or SIGHUP.
    Interrupted,
}

impl ExitStatus {
    /// The numeric exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::Usage => 2,
            ExitStatus::MaxIterations => 3,
            ExitStatus::OtherLimit => 4,
            ExitStatus::Interrupted => 130,
        }
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        ExitCode::from(status.code())
    }
}
