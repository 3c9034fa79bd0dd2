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
    /// 5: another worker holds the branch's lease on the remote (`--push`): it drives this
    /// branch now, so this worker did nothing. Not a failure of the work; do not retry before
    /// the holder's lease expires.
    LeaseHeld,
    /// 75 (`EX_TEMPFAIL`): resumable later without a human: a usage limit the run could not
    /// wait out (`--no-wait`, past `--max-duration`, too many waits; `resume_at` says when), or
    /// work that could not be pushed (`--push` with the remote unreachable).
    TempFail,
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
            ExitStatus::LeaseHeld => 5,
            ExitStatus::TempFail => 75,
            ExitStatus::Interrupted => 130,
        }
    }
}

impl ExitStatus {
    /// Every status, in code order.
    pub const ALL: [ExitStatus; 8] = [
        ExitStatus::Success,
        ExitStatus::Failure,
        ExitStatus::Usage,
        ExitStatus::MaxIterations,
        ExitStatus::OtherLimit,
        ExitStatus::LeaseHeld,
        ExitStatus::TempFail,
        ExitStatus::Interrupted,
    ];

    /// What the code means for `ralph run`, in one line (README.md's "Exit codes" table).
    pub fn meaning(self) -> &'static str {
        match self {
            ExitStatus::Success => "complete: every story passes",
            ExitStatus::Failure => "an error to fix: prd.json, settings, git, the lock, an auth or config error from the agent, a push the remote rejected",
            ExitStatus::Usage => "a usage error on the command line (unknown flag, refused value)",
            ExitStatus::MaxIterations => "--max-iter reached with stories open",
            ExitStatus::OtherLimit => "stopped by another limit or `ralph stop` (the summary's `why:` line and run_finished's stop_reason say which)",
            ExitStatus::LeaseHeld => "--push: another worker holds the branch's lease (the message names it); nothing was done",
            ExitStatus::TempFail => "resumable later: a usage limit not waited out (run again after resume_at), or work not pushed (remote unreachable)",
            ExitStatus::Interrupted => "interrupted (Ctrl-C, SIGTERM or SIGHUP); `ralph run` resumes",
        }
    }

    /// The exit-code table `ralph run --help` ends with.
    pub fn help_table() -> String {
        let mut out = String::from("Exit codes:\n");
        for status in ExitStatus::ALL {
            out.push_str(&format!("  {:>3}  {}\n", status.code(), status.meaning()));
        }
        out
    }
}

/// What a scheduler does with a `ralph run` that ended with an [`ExitStatus`] (README,
/// "Exit codes"; deploy/ applies it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Done, or a human must act (fix something, raise a budget, `--unblock`), or another
    /// worker has the branch: a retry would change nothing.
    No,
    /// Later: after `resume_at` (a usage limit) or at the next scheduled `--resume-only` run.
    Later,
    /// At once: the run was interrupted or killed; its work is pushed and a retry resumes it.
    Now,
}

impl ExitStatus {
    /// What a scheduler should do with a run that ended with this status. `--max-iter` (3) is
    /// not retried: a retry would give the run another `--max-iter`, the per-schedule budget
    /// `--resume-only` exists to prevent; raise `--max-iter` or run again by hand.
    pub fn retry(self) -> Retry {
        match self {
            ExitStatus::Success
            | ExitStatus::Failure
            | ExitStatus::Usage
            | ExitStatus::MaxIterations
            | ExitStatus::OtherLimit
            | ExitStatus::LeaseHeld => Retry::No,
            ExitStatus::TempFail => Retry::Later,
            ExitStatus::Interrupted => Retry::Now,
        }
    }
}

impl ExitStatus {
    /// The status of a run that ended with `self` but left work the remote does not have
    /// (`--push` could not reach it): a run that completed or used its `--max-iter` budget exits
    /// [`ExitStatus::TempFail`] instead, so a scheduler retries it; every other status is kept
    /// (the summary says what is unpushed).
    pub fn with_unpushed(self, unpushed: bool) -> ExitStatus {
        match self {
            ExitStatus::Success | ExitStatus::MaxIterations if unpushed => ExitStatus::TempFail,
            other => other,
        }
    }
}

/// How a child process ended, for a reader: `exit 1`, `killed by signal 9`, or `killed by a
/// signal` when neither is known (`code` `None` means a signal ended it on Unix).
pub fn describe_end(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "killed by a signal".to_owned(),
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        ExitCode::from(status.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_end_reads_as_a_person_says_it() {
        assert_eq!(describe_end(Some(1), None), "exit 1");
        assert_eq!(describe_end(None, Some(9)), "killed by signal 9");
        assert_eq!(describe_end(None, None), "killed by a signal");
    }
}
