//! [`run`]: start one agent process and supervise it until it ends, by itself or by ralph's hand.
//!
//! One task owns the child and makes every decision; two reader tasks turn stdout and stderr into
//! lines and hand them over through a small bounded queue (so a slow consumer slows the child
//! instead of growing memory), and one task writes the prompt to stdin.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

use super::group::Tree;
use super::lines::pump;
use super::spawn;
use super::{
    EndReason, Limits, LineVerdict, OutputLine, ProcessError, ProcessOutcome, SpawnSpec,
    StopSignals, StreamKind,
};

/// Lines queued between the readers and the consumer. Small: memory is bounded by this times
/// `max_line_bytes`, and the consumer is a quick synchronous callback.
const LINE_QUEUE: usize = 8;

/// After the final SIGKILL, how long to wait for the kernel to let us reap the direct child. A
/// process stuck in uninterruptible sleep (a dead NFS mount) may never go; we do not wait for it.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// After the final SIGKILL, how long to keep collecting lines that were already in the pipes.
/// Once every writer is dead the pipes hit EOF at once; a holder we could not find must not
/// keep us here.
const POST_KILL_DRAIN: Duration = Duration::from_millis(250);

/// Runs `spec` as a child process under `limits`, feeding each output line to `on_line`.
///
/// Behaviour (the module CONTRACT in [`crate::process`]):
/// - the child gets its own process group (pgid = its pid) and `PR_SET_PDEATHSIG(SIGKILL)` on
///   Linux; `on_spawn(pid)` is called right after the spawn so the caller can record the pgid and
///   kill an orphaned group after a crash ([`super::kill_group`]);
/// - stdin is `spec.stdin` written in full from a separate task and then closed, or `/dev/null`;
///   a child that never reads it only makes that write fail with EPIPE, which is ignored;
/// - stdout and stderr are read at the same time, split into lines as described on
///   [`OutputLine`]; `on_line` sees each stream's lines in order (the two streams interleave);
/// - `limits.timeout` (wall clock from spawn), `limits.idle_timeout` (no complete line on either
///   stream) and `stop.stop` send SIGTERM to the group, then SIGKILL after `limits.kill_grace`;
///   `stop.kill_now` sends SIGKILL at once;
/// - when `on_line` returns [`LineVerdict::Final`] and the child has not exited
///   `limits.final_grace` later, it is terminated the same way ([`EndReason::KilledAfterFinal`]);
/// - once the direct child has exited, output is read for at most `limits.exit_drain` (a
///   grandchild holding the pipe must not hang us), then whatever is left of the group is
///   SIGKILLed. Survivors are SIGKILLed even when the pipes closed on time, so no process of the
///   group outlives the call. On Linux, descendants that left the group (`setsid`) and are still
///   reachable through parent links are signalled with it.
///
/// The first reason to stop wins: a run that timed out and then got `stop.kill_now` still ends
/// with [`EndReason::TimedOut`], killed sooner. Lines that were already in the pipes when the
/// group was killed are still delivered (for at most 250 ms); `on_line`'s verdict is then
/// ignored. Dropping the returned future SIGKILLs the group.
///
/// Must be awaited inside a tokio runtime with I/O and time enabled, on a runtime thread that
/// lives as long as the child should (see the comment at the spawn).
///
/// # Errors
/// [`ProcessError::NotFound`] when `spec.program` does not exist (ENOENT);
/// [`ProcessError::Spawn`] for any other spawn failure, including a missing `spec.cwd`.
/// Once the child is running, every ending is an [`EndReason`], never an error.
pub async fn run(
    spec: SpawnSpec,
    limits: &Limits,
    stop: &StopSignals,
    on_spawn: impl FnOnce(u32) + Send,
    mut on_line: impl FnMut(OutputLine) -> LineVerdict + Send,
) -> Result<ProcessOutcome, ProcessError> {
    let program = spec.program.display().to_string();
    let mut command = build_command(&spec)?;
    // PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. So
    // the spawn happens here, on the runtime thread polling this future (tokio worker threads live
    // as long as the runtime), never inside `spawn_blocking`, whose threads exit after 10 s idle
    // and would take a healthy agent down with them.
    let forks_before = super::fork_count();
    let mut child = command
        .spawn()
        .map_err(|source| spawn::spawn_error(&spec, source))?;
    let started = Instant::now();
    // Counted until this call returns or is dropped (a stop's notice says whether one runs).
    let _supervised = super::Supervised::enter();
    // No pid is only possible once the child has been reaped, which nothing has done yet.
    let (pid, pgid) = spawn::pgid_of(&spec, child.id())?;
    let mut guard = Guard {
        tree: Tree::new(pgid),
        armed: true,
        tasks: Vec::new(),
    };
    on_spawn(pid);
    tracing::debug!(pid, program = %program, "agent process started in its own group");

    if let (Some(bytes), Some(mut stdin)) = (spec.stdin, child.stdin.take()) {
        let writer = tokio::spawn(async move {
            // EPIPE here only means the child stopped reading (or never read): that is the
            // child's business, and its output and exit status tell the story.
            if let Err(err) = stdin.write_all(&bytes).await {
                tracing::debug!(%err, "writing the prompt to the child's stdin stopped early");
            }
            // Dropping `stdin` closes the pipe, so a child reading to EOF proceeds.
        });
        guard.tasks.push(writer.abort_handle());
    }

    let (tx, mut rx) = mpsc::channel(LINE_QUEUE);
    if let Some(stdout) = child.stdout.take() {
        let task = tokio::spawn(pump(
            stdout,
            StreamKind::Stdout,
            limits.max_line_bytes,
            tx.clone(),
        ));
        guard.tasks.push(task.abort_handle());
    }
    if let Some(stderr) = child.stderr.take() {
        let task = tokio::spawn(pump(
            stderr,
            StreamKind::Stderr,
            limits.max_line_bytes,
            tx.clone(),
        ));
        guard.tasks.push(task.abort_handle());
    }
    drop(tx); // `rx` reports the end once both readers are done.

    let mut state = State::new(started, limits);
    loop {
        let now = Instant::now();
        if let Some(reason) = state.limit_reached(now) {
            tracing::debug!(pid, ?reason, "terminating agent process group");
            state.reason = Some(reason);
            guard.tree.signal(Signal::SIGTERM);
            state.kill_at = Some(now + limits.kill_grace);
        }
        if state.kill_due(now) {
            break;
        }
        if state.exited && !state.lines_open {
            break; // Clean end: the child exited and both pipes reached EOF.
        }
        tokio::select! {
            biased;
            () = stop.kill_now.cancelled() => {
                if !state.exited {
                    state.reason.get_or_insert(EndReason::Cancelled);
                }
                break;
            }
            () = stop.stop.cancelled(), if state.reason.is_none() && !state.exited => {
                tracing::debug!(pid, "stop requested: terminating agent process group");
                state.reason = Some(EndReason::Cancelled);
                guard.tree.signal(Signal::SIGTERM);
                state.kill_at = Some(Instant::now() + limits.kill_grace);
            }
            waited = child.wait(), if !state.exited => {
                state.child_exited(waited, Instant::now());
            }
            line = rx.recv(), if state.lines_open => match line {
                Some(line) => {
                    let verdict = on_line(line);
                    state.line_seen(verdict, Instant::now());
                }
                None => state.lines_open = false,
            },
            () = sleep_until(state.next_wake(now)) => {}
        }
    }

    // Whatever is left of the group (and its escapees) dies now, whichever way we got here.
    guard.tree.signal(Signal::SIGKILL);
    if !state.exited {
        match timeout(REAP_WAIT, child.wait()).await {
            Ok(waited) => state.child_exited(waited, Instant::now()),
            Err(_) => tracing::warn!(pid, "agent process did not go away after SIGKILL"),
        }
    }
    // A SIGKILLed grandchild can take a moment (a busy machine) to actually die: wait until the
    // group is empty, so that "no process of the group outlives `run`" holds when it returns.
    let gone_by = Instant::now() + REAP_WAIT;
    while super::group_alive(pgid) && Instant::now() < gone_by {
        guard.tree.signal(Signal::SIGKILL);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain_until = Instant::now() + POST_KILL_DRAIN;
    while state.lines_open {
        match timeout_at(drain_until, rx.recv()).await {
            Ok(Some(line)) => {
                on_line(line);
            }
            Ok(None) => state.lines_open = false,
            Err(_) => break, // a holder we could not kill keeps the pipe open
        }
    }
    let elapsed = started.elapsed();
    guard.armed = false;
    drop(guard); // stops the readers and the stdin writer

    let status = state.status;
    Ok(ProcessOutcome {
        end: state.reason.unwrap_or(EndReason::Exited),
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(exit_signal),
        pid,
        elapsed,
        forks_before,
    })
}

/// Builds the command: own group, piped output, stdin piped or `/dev/null`, death signal.
fn build_command(spec: &SpawnSpec) -> Result<Command, ProcessError> {
    let mut command = Command::from(spawn::command(spec)?);
    command
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A backstop for the direct child only; the group is handled by `Guard`.
        .kill_on_drop(true);
    Ok(command)
}

/// The signal that ended the child, if a signal did.
fn exit_signal(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// The supervisor's clock and bookkeeping; pure logic, no I/O.
struct State {
    /// Wall-clock limit.
    deadline: Instant,
    /// Moves forward with every line.
    idle_at: Instant,
    idle_timeout: Duration,
    final_grace: Duration,
    exit_drain: Duration,
    /// Set once `on_line` returned `Final`.
    final_at: Option<Instant>,
    /// Set once ralph decided to end the child (SIGTERM sent or about to be).
    reason: Option<EndReason>,
    /// When SIGTERM turns into SIGKILL.
    kill_at: Option<Instant>,
    /// Whether the direct child has been reaped (or waiting on it failed).
    exited: bool,
    /// When output stops being read after the child exited.
    drain_until: Option<Instant>,
    status: Option<ExitStatus>,
    /// Whether either reader may still deliver a line.
    lines_open: bool,
}

impl State {
    fn new(started: Instant, limits: &Limits) -> Self {
        State {
            deadline: started + limits.timeout,
            idle_at: started + limits.idle_timeout,
            idle_timeout: limits.idle_timeout,
            final_grace: limits.final_grace,
            exit_drain: limits.exit_drain,
            final_at: None,
            reason: None,
            kill_at: None,
            exited: false,
            drain_until: None,
            status: None,
            lines_open: true,
        }
    }

    /// A limit that has just been reached while the child runs and nothing is ending it yet.
    fn limit_reached(&self, now: Instant) -> Option<EndReason> {
        if self.exited || self.reason.is_some() {
            None
        } else if now >= self.deadline {
            Some(EndReason::TimedOut)
        } else if now >= self.idle_at {
            Some(EndReason::Idle)
        } else if self.final_at.is_some_and(|at| now >= at) {
            Some(EndReason::KilledAfterFinal)
        } else {
            None
        }
    }

    /// Whether the kill grace or the post-exit drain has run out.
    fn kill_due(&self, now: Instant) -> bool {
        self.kill_at.is_some_and(|at| now >= at) || self.drain_until.is_some_and(|at| now >= at)
    }

    /// The earliest deadline still pending; the loop sleeps until then.
    fn next_wake(&self, now: Instant) -> Instant {
        let running = !self.exited && self.reason.is_none();
        [
            running.then_some(self.deadline),
            running.then_some(self.idle_at),
            self.final_at.filter(|_| running),
            self.kill_at,
            self.drain_until,
        ]
        .into_iter()
        .flatten()
        .min()
        // Unreachable in practice (a running child always has a deadline); a long nap is safe
        // because every other branch of the loop wakes it.
        .unwrap_or(now + Duration::from_secs(3600))
    }

    fn child_exited(&mut self, waited: io::Result<ExitStatus>, now: Instant) {
        match waited {
            Ok(status) => self.status = Some(status),
            Err(err) => tracing::warn!(%err, "waiting for the agent process failed"),
        }
        self.exited = true;
        self.drain_until = Some(now + self.exit_drain);
    }

    fn line_seen(&mut self, verdict: LineVerdict, now: Instant) {
        self.idle_at = now + self.idle_timeout;
        if verdict == LineVerdict::Final && self.final_at.is_none() {
            self.final_at = Some(now + self.final_grace);
        }
    }
}

/// Kills the group if [`run`] is left early (its future dropped), and always stops the helper
/// tasks, so nothing of the child outlives the call.
struct Guard {
    tree: Tree,
    armed: bool,
    tasks: Vec<AbortHandle>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            self.tree.signal(Signal::SIGKILL);
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            timeout: Duration::from_secs(100),
            idle_timeout: Duration::from_secs(10),
            kill_grace: Duration::from_secs(1),
            exit_drain: Duration::from_secs(2),
            final_grace: Duration::from_secs(5),
            max_line_bytes: 1024,
        }
    }

    #[tokio::test]
    async fn limits_fire_in_order_and_lines_push_the_idle_limit() {
        let t0 = Instant::now();
        let mut state = State::new(t0, &limits());
        assert_eq!(state.limit_reached(t0 + Duration::from_secs(9)), None);
        state.line_seen(LineVerdict::Continue, t0 + Duration::from_secs(9));
        assert_eq!(state.limit_reached(t0 + Duration::from_secs(18)), None);
        assert_eq!(
            state.limit_reached(t0 + Duration::from_secs(19)),
            Some(EndReason::Idle)
        );
        assert_eq!(
            state.limit_reached(t0 + Duration::from_secs(100)),
            Some(EndReason::TimedOut)
        );
        assert_eq!(state.next_wake(t0), t0 + Duration::from_secs(19));
    }

    #[tokio::test]
    async fn final_verdict_starts_the_grace_once() {
        let t0 = Instant::now();
        let mut state = State::new(t0, &limits());
        state.line_seen(LineVerdict::Final, t0 + Duration::from_secs(1));
        state.line_seen(LineVerdict::Final, t0 + Duration::from_secs(3));
        assert_eq!(state.next_wake(t0), t0 + Duration::from_secs(6));
        assert_eq!(
            state.limit_reached(t0 + Duration::from_secs(6)),
            Some(EndReason::KilledAfterFinal)
        );
    }

    #[tokio::test]
    async fn after_exit_only_the_drain_counts() {
        let t0 = Instant::now();
        let mut state = State::new(t0, &limits());
        state.child_exited(Err(io::Error::other("test")), t0 + Duration::from_secs(1));
        assert_eq!(state.limit_reached(t0 + Duration::from_secs(500)), None);
        assert_eq!(state.next_wake(t0), t0 + Duration::from_secs(3));
        assert!(!state.kill_due(t0 + Duration::from_secs(2)));
        assert!(state.kill_due(t0 + Duration::from_secs(3)));
    }
}
