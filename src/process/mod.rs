//! Spawning and killing child processes. The only module that starts or signals a child
//! (`tests/it/architecture.rs` checks it).
//!
//! Entry points:
//! - [`run`] supervises one agent process (streamed lines, limits, stop signals);
//! - [`capture`] runs a short command to completion with a timeout and returns its output (the
//!   `--version` probe, the local model's `python -m venv` / `pip`);
//! - [`Service`] keeps a long-lived child (the local model server) until it is stopped or dropped;
//! - [`group_alive`], [`kill_group`] and [`group_members`] deal with a group recorded earlier
//!   (e.g. by a ralph that was SIGKILLed, so its agent was orphaned);
//! - [`AGENT_TAG_VAR`], [`agent_tag`], [`kill_tagged`] and [`group_is_tagged`] find an agent's
//!   processes by the tag in their environment, wherever they went.
//!
//! Callers describe what to run with a [`SpawnSpec`] and read the result; they never build a
//! `Command` or send a signal themselves. Files: `spawn.rs` (building a child from a spec),
//! `supervise.rs` (the agent run loop), `lines.rs` (bounded line splitting), `capture.rs`,
//! `service.rs`, `group.rs` (`/proc` scans and group signalling), `tag.rs`.
//!
//! CONTRACT (every child, whichever entry point starts it):
//! - the child runs in its own process group (`process_group(0)`) and gets
//!   `PR_SET_PDEATHSIG(SIGKILL)` so it dies with ralph;
//! - killing means the whole group, plus descendants that left it with `setsid` and are still
//!   linked by `/proc` parent links (Linux, best effort); no live process of the group outlives
//!   [`run`] or [`capture`], nor a [`Service`] that was stopped or dropped.
//! - under `--sandbox` ([`sandbox`]) the group is bwrap's; the agent runs in a new session and
//!   PID namespace below it, reached by the `/proc` descendant walk and the agent tag (host
//!   pids, readable environments), and the whole namespace dies with its init when the agent
//!   exits or bwrap is killed (`--die-with-parent`).
//!
//! CONTRACT of [`run`]:
//! - stdin is the prompt bytes (written in full, then closed) or `/dev/null`, stdout and stderr
//!   are drained concurrently;
//! - lines are read as bytes, split on `\n`, decoded lossily, a trailing `\r` trimmed; a line longer
//!   than `max_line_bytes` is cut there and `OutputLine::truncated_from` holds its full length;
//! - `timeout` / `idle_timeout` / `stop.stop` → SIGTERM to the group, `kill_grace`, then SIGKILL;
//!   `stop.kill_now` → SIGKILL at once;
//! - after the direct child exits: drain for at most `exit_drain`, then SIGKILL what is left of the
//!   group and stop reading (a grandchild holding the pipe must not hang us);
//! - when `on_line` returns [`LineVerdict::Final`], a child that has not exited within
//!   `final_grace` is terminated (SIGTERM, `kill_grace`, SIGKILL) and the run ends with
//!   [`EndReason::KilledAfterFinal`];
//! - when ralph decides to end a run, and at the end of every run, descendants that left the
//!   group with `setsid` are signalled too.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

mod capture;
pub mod egress;
mod group;
mod lines;
pub mod pager;
pub mod sandbox;
mod service;
mod spawn;
mod supervise;
mod tag;

pub use capture::{capture, capture_stoppable, Captured, CAPTURE_MAX_BYTES};
pub use group::{group_alive, group_members, kill_group};
pub use service::Service;
pub use supervise::run;
pub use tag::{
    agent_tag, command_line, fork_count, group_is_tagged, kill_tagged, kill_tagged_since,
    sweep_tagged, sweep_tagged_since, Stray, AGENT_TAG_VAR, REFLOG_ACTION_PREFIX,
};

/// What to run: built by an agent backend, executed here.
#[derive(Debug, Clone, Default)]
pub struct SpawnSpec {
    /// Program path or name (looked up on PATH).
    pub program: PathBuf,
    /// Arguments, passed as-is (no shell).
    pub args: Vec<String>,
    /// Working directory (the repository root).
    pub cwd: PathBuf,
    /// Variables removed from the inherited environment.
    pub env_remove: Vec<String>,
    /// Variables set (after removal).
    pub env_set: Vec<(String, String)>,
    /// Bytes written to stdin, which is then closed; `None` means stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
}

impl SpawnSpec {
    /// Sets `name=value` unless the spec already sets `name` (a backend's own value wins).
    pub fn set_env_default(&mut self, name: &str, value: &str) {
        if !self.env_set.iter().any(|(n, _)| n == name) {
            self.env_set.push((name.to_owned(), value.to_owned()));
        }
    }

    /// The command as one line a user can paste into a POSIX shell to run the agent by hand:
    /// `cd <cwd> && env -u <removed>… <NAME=value>… <program> <args>… < <stdin_file>`, every word
    /// quoted where needed. Values of variables whose name looks secret
    /// ([`crate::redact::is_secret_name`]) are replaced by `<redacted>`. `stdin_file` names where the stdin bytes were saved
    /// (without one, a spec with stdin bytes ends in `< /dev/stdin`).
    pub fn shell_line(&self, stdin_file: Option<&std::path::Path>) -> String {
        let quote = |w: &str| {
            shlex::try_quote(w)
                .map(|q| q.into_owned())
                .unwrap_or_else(|_| format!("'{}'", w.replace('\0', "")))
        };
        let mut words: Vec<String> = Vec::new();
        if !self.env_remove.is_empty() || !self.env_set.is_empty() {
            words.push("env".into());
            for name in &self.env_remove {
                words.push("-u".into());
                words.push(quote(name));
            }
            for (name, value) in &self.env_set {
                let value = if crate::redact::is_secret_name(name) {
                    crate::redact::REDACTED
                } else {
                    value.as_str()
                };
                words.push(quote(&format!("{name}={value}")));
            }
        }
        words.push(quote(&self.program.to_string_lossy()));
        words.extend(self.args.iter().map(|a| quote(a)));
        let mut line = String::new();
        if !self.cwd.as_os_str().is_empty() {
            line.push_str(&format!("cd {} && ", quote(&self.cwd.to_string_lossy())));
        }
        line.push_str(&words.join(" "));
        match (&self.stdin, stdin_file) {
            (Some(_), Some(f)) => line.push_str(&format!(" < {}", quote(&f.to_string_lossy()))),
            (Some(_), None) => line.push_str(" < /dev/stdin"),
            (None, _) => line.push_str(" < /dev/null"),
        }
        line
    }
}

/// Time and size limits for one agent process.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit for the whole process.
    pub timeout: Duration,
    /// Kill after this long without a line on stdout or stderr.
    pub idle_timeout: Duration,
    /// Wait between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How long to keep reading after the direct child exited.
    pub exit_drain: Duration,
    /// How long a child may live after its terminal event before it is killed.
    pub final_grace: Duration,
    /// Longest line kept, in bytes; longer lines are cut.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30 * 60),
            idle_timeout: Duration::from_secs(10 * 60),
            kill_grace: Duration::from_secs(5),
            exit_drain: Duration::from_secs(2),
            final_grace: Duration::from_secs(10),
            max_line_bytes: 16 * 1024 * 1024,
        }
    }
}

/// How many process groups [`run`] is supervising right now in this process (agents, and the
/// checks and hooks run the same way): a stop with none running has nothing to wait for.
static SUPERVISED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The number of child process groups [`run`] supervises at this moment (0: nothing is running,
/// e.g. during a usage-limit wait, so a stop ends the run without a grace period).
pub fn supervised() -> usize {
    SUPERVISED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Counts one supervised group in [`supervised`] for as long as it lives.
struct Supervised;

impl Supervised {
    fn enter() -> Supervised {
        SUPERVISED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Supervised
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        SUPERVISED.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Cancellation from outside: a graceful stop (first Ctrl-C) and an immediate kill (second).
#[derive(Debug, Clone, Default)]
pub struct StopSignals {
    /// SIGTERM the group, wait `kill_grace`, SIGKILL.
    pub stop: CancellationToken,
    /// SIGKILL the group at once.
    pub kill_now: CancellationToken,
    /// The first signal and when it came (set by [`StopSignals::record`]), from which a
    /// shutdown's deadline counts.
    pub cause: std::sync::Arc<std::sync::OnceLock<StopCause>>,
}

/// What asked a run to stop, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopCause {
    /// The signal's name, e.g. `SIGTERM`.
    pub signal: &'static str,
    /// When it arrived.
    pub at: std::time::Instant,
}

impl StopSignals {
    /// Records `signal` as the cause of the stop, if none is recorded yet (the first one wins).
    pub fn record(&self, signal: &'static str) {
        let _ = self.cause.set(StopCause {
            signal,
            at: std::time::Instant::now(),
        });
    }

    /// The recorded cause; when the stop was cancelled without one (a test, an embedder), a
    /// cause named `stop` dated now is recorded and returned. `None` while no stop was asked.
    pub fn stopped(&self) -> Option<StopCause> {
        if !self.stop.is_cancelled() {
            return None;
        }
        self.record("stop");
        self.cause.get().copied()
    }
}

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line of agent output.
#[derive(Debug, Clone)]
pub struct OutputLine {
    /// The pipe it came from.
    pub stream: StreamKind,
    /// Lossy UTF-8, trailing `\r` removed, ANSI codes kept (strip with [`strip_ansi`] before matching).
    pub text: String,
    /// `Some(full length in bytes)` when the line was longer than `max_line_bytes` and was cut.
    pub truncated_from: Option<usize>,
}

impl OutputLine {
    /// A whole stdout line (not cut), as the supervisor delivers it.
    pub fn stdout(text: impl Into<String>) -> OutputLine {
        OutputLine {
            stream: StreamKind::Stdout,
            text: text.into(),
            truncated_from: None,
        }
    }

    /// A whole stderr line (not cut).
    pub fn stderr(text: impl Into<String>) -> OutputLine {
        OutputLine {
            stream: StreamKind::Stderr,
            text: text.into(),
            truncated_from: None,
        }
    }
}

/// Returned by the line callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineVerdict {
    /// Keep going.
    Continue,
    /// The agent's terminal event was seen: start the `final_grace` timer.
    Final,
}

/// Why the process run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The direct child exited by itself.
    Exited,
    /// The wall-clock `timeout` fired.
    TimedOut,
    /// No output for `idle_timeout`.
    Idle,
    /// `StopSignals` asked to stop.
    Cancelled,
    /// The terminal event was seen but the child did not exit within `final_grace`.
    KilledAfterFinal,
}

/// Result of [`run`].
#[derive(Debug, Clone)]
pub struct ProcessOutcome {
    /// Why it ended.
    pub end: EndReason,
    /// Exit code, when the child exited normally.
    pub exit_code: Option<i32>,
    /// Signal number, when the child was killed by a signal.
    pub signal: Option<i32>,
    /// Process id (= process group id) of the child.
    pub pid: u32,
    /// Wall time from spawn to the end of reading.
    pub elapsed: Duration,
    /// The machine's fork count (`processes` in `/proc/stat`) just before the spawn; with `pid`
    /// it bounds which pids can belong to what the child started (see
    /// [`kill_tagged_since`]). `None` where `/proc/stat` cannot be read.
    pub forks_before: Option<u64>,
}

/// How a child process ended, as reported by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildExit {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
}

impl ChildExit {
    /// Whether it exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl From<std::process::ExitStatus> for ChildExit {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        ChildExit {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl std::fmt::Display for ChildExit {
    /// `exit code N`, `killed by signal N`, or `ended abnormally` (neither is known).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => write!(f, "killed by signal {signal}"),
            (None, None) => f.write_str("ended abnormally"),
        }
    }
}

/// Errors starting a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program was not found.
    #[error("`{program}` was not found on PATH")]
    NotFound {
        /// The program that was looked up.
        program: String,
    },
    /// The program exists but the kernel reported it missing: a script whose `#!` interpreter
    /// does not exist, or a binary whose dynamic loader is missing.
    #[error("`{program}` exists but cannot be run: {why}")]
    Unrunnable {
        /// The program.
        program: String,
        /// What is missing (the interpreter named on its `#!` line, or its loader).
        why: String,
    },
    /// Any other spawn failure (permissions, E2BIG, ...).
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program that failed to start.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Removes ANSI escape sequences (colours, cursor moves) from `text`.
pub fn strip_ansi(text: &str) -> String {
    String::from_utf8_lossy(&strip_ansi_escapes::strip(text.as_bytes())).into_owned()
}

/// Test hook: with feature `test-fakes`, `RALPH_TEST_KILL_AT=<point>` makes ralph SIGKILL
/// itself (as a user's `kill -9` would) when it reaches `point` (`landing-noted`,
/// `landing-moved`, `landing-marked`, `landing-recorded` in `run/parallel/land.rs`,
/// `commit-checkpointed` in the commit stage), so that a test replays a kill there
/// deterministically. Likewise `RALPH_TEST_RUN_AT=<point>` runs `RALPH_TEST_RUN_CMD` with
/// `sh -c` there and waits for it (another process acting at that very moment: an agent's
/// `git -C <checkout> commit` between two of ralph's steps). Does nothing otherwise.
pub fn kill_point(point: &str) {
    #[cfg(feature = "test-fakes")]
    if std::env::var("RALPH_TEST_RUN_AT").is_ok_and(|p| p == point) {
        if let Ok(cmd) = std::env::var("RALPH_TEST_RUN_CMD") {
            let _ = std::process::Command::new("sh").arg("-c").arg(cmd).status();
        }
    }
    #[cfg(feature = "test-fakes")]
    if std::env::var("RALPH_TEST_KILL_AT").is_ok_and(|p| p == point) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = point;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_line_can_be_pasted_and_hides_secrets() {
        let mut spec = SpawnSpec {
            program: "claude".into(),
            args: vec!["-p".into(), "--model".into(), "it's big".into()],
            cwd: "/w/my repo".into(),
            env_remove: vec!["CLAUDECODE".into()],
            env_set: vec![("OPENAI_API_KEY".into(), "sk-123".into())],
            stdin: Some(b"prompt".to_vec()),
        };
        spec.set_env_default("NO_COLOR", "1");
        spec.set_env_default("OPENAI_API_KEY", "other");
        let line = spec.shell_line(Some(std::path::Path::new("/w/.ralph/p 1.md")));
        assert_eq!(
            line,
            "cd '/w/my repo' && env -u CLAUDECODE 'OPENAI_API_KEY=<redacted>' 'NO_COLOR=1' claude -p --model \"it's big\" < '/w/.ralph/p 1.md'"
        );
        let words = shlex::split(line.split(" && ").nth(1).unwrap()).unwrap();
        assert_eq!(words[words.len() - 3], "it's big");
        spec.stdin = None;
        assert!(spec.shell_line(None).ends_with("< /dev/null"));
    }
}
