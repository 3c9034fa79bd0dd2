//! [`capture`]: run a short command to completion and collect its output, e.g. `claude --version`
//! or `python -m pip install …`. Blocking; for the long-lived model server see [`super::Service`],
//! for agents [`super::run`].

use std::io::{Read, Write as _};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::group::Tree;
use super::{spawn, ChildExit, ProcessError, SpawnSpec};

/// Bytes kept of each of stdout and stderr: the last ones (an error's explanation is at the end).
pub const CAPTURE_MAX_BYTES: usize = 1024 * 1024;

/// After the direct child exited, how long its output is still read before whatever is left of
/// its group is killed (a grandchild holding the pipe must not hang us).
const EXIT_DRAIN: Duration = Duration::from_secs(2);

/// After the final SIGKILL, how long to wait for the kernel to let us reap the child and close
/// the pipes. A process stuck in uninterruptible sleep may never go; we do not wait for it.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(5);

/// What a command run by [`capture`] did.
#[derive(Debug, Clone)]
pub struct Captured {
    /// How the direct child ended (after a timeout: killed by signal 9).
    pub exit: ChildExit,
    /// Whether the timeout fired and the group was killed.
    pub timed_out: bool,
    /// Whether a stop ([`capture_stoppable`]'s `stop`) came first and the group was killed.
    pub stopped: bool,
    /// Standard output, lossy UTF-8, at most its last [`CAPTURE_MAX_BYTES`] bytes.
    pub stdout: String,
    /// Standard error, lossy UTF-8, at most its last [`CAPTURE_MAX_BYTES`] bytes.
    pub stderr: String,
    /// Wall time from spawn to the end of reading.
    pub elapsed: Duration,
}

impl Captured {
    /// Whether it exited by itself with code 0.
    pub fn success(&self) -> bool {
        !self.timed_out && !self.stopped && self.exit.success()
    }
}

/// Runs `spec` to completion and returns its exit and output.
///
/// - the child gets its own process group and `PR_SET_PDEATHSIG(SIGKILL)` (the calling thread
///   waits for it, so the signal cannot fire early); stdin is `spec.stdin` written in full and
///   closed, or `/dev/null`; stdout and stderr are read at the same time, so neither pipe can
///   fill up;
/// - after `timeout` (none: wait as long as it takes) the whole group is SIGKILLed at once and
///   [`Captured::timed_out`] is set;
/// - once the child has exited, output is read for at most 2 s more; then whatever is left of its
///   group (and, on Linux, descendants that left the group and are still linked to it) is
///   SIGKILLed and, when anything had to be killed, waited for (up to 2 s more), so nothing it
///   started outlives the call.
///
/// Blocks the calling thread: in async code, call it from `spawn_blocking`.
///
/// # Errors
/// [`ProcessError`] when the command cannot start (not found, not runnable, missing `spec.cwd`).
/// An unsuccessful exit or a timeout is not an error: see [`Captured::success`].
pub fn capture(spec: &SpawnSpec, timeout: Option<Duration>) -> Result<Captured, ProcessError> {
    capture_until(spec, timeout, None)
}

/// [`capture`], also ended by `stop`: a graceful stop (`stop.stop`) or a kill (`stop.kill_now`),
/// asked before or while the command runs, SIGKILLs its whole group at once (within 50 ms) and
/// sets [`Captured::stopped`]. For setup commands ralph runs for a worker (`worktree_setup`),
/// which a Ctrl-C must not wait for.
///
/// # Errors
/// As [`capture`].
pub fn capture_stoppable(
    spec: &SpawnSpec,
    timeout: Option<Duration>,
    stop: &super::StopSignals,
) -> Result<Captured, ProcessError> {
    capture_until(spec, timeout, Some(stop))
}

/// How often a stoppable capture looks at its stop signals.
const STOP_POLL: Duration = Duration::from_millis(50);

/// The child's exit status, or `None` when `timeout` or `stop` came first.
fn wait_exit(
    exit_rx: &mpsc::Receiver<std::io::Result<std::process::ExitStatus>>,
    timeout: Option<Duration>,
    stop: Option<&super::StopSignals>,
) -> (Option<std::io::Result<std::process::ExitStatus>>, bool) {
    let Some(stop) = stop else {
        let waited = match timeout {
            Some(limit) => exit_rx.recv_timeout(limit).ok(),
            None => exit_rx.recv().ok(),
        };
        return (waited, false);
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if stop.stop.is_cancelled() || stop.kill_now.is_cancelled() {
            return (None, true);
        }
        let slice = match deadline {
            Some(d) if d <= Instant::now() => return (None, false),
            Some(d) => remaining(d).min(STOP_POLL),
            None => STOP_POLL,
        };
        match exit_rx.recv_timeout(slice) {
            Ok(status) => return (Some(status), false),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return (None, false),
        }
    }
}

fn capture_until(
    spec: &SpawnSpec,
    timeout: Option<Duration>,
    stop: Option<&super::StopSignals>,
) -> Result<Captured, ProcessError> {
    let mut command = spawn::command(spec)?;
    command
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|source| spawn::spawn_error(spec, source))?;
    let started = Instant::now();
    let (pid, pgid) = match spawn::pgid_of(spec, Some(child.id())) {
        Ok(ids) => ids,
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err);
        }
    };
    let mut tree = Tree::new(pgid);
    tracing::debug!(pid, program = %spec.program.display(), "command started in its own group");

    if let (Some(bytes), Some(mut stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        // EPIPE only means the child stopped reading; its exit and output tell the story.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let stdout = Tail::default();
    let stderr = Tail::default();
    if let Some(pipe) = child.stdout.take() {
        stdout.read_from(pipe, done_tx.clone());
    }
    if let Some(pipe) = child.stderr.take() {
        stderr.read_from(pipe, done_tx.clone());
    }
    drop(done_tx);

    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let (waited, stopped) = wait_exit(&exit_rx, timeout, stop);
    let (status, timed_out) = match waited {
        Some(status) => (status.ok(), false),
        None => {
            tracing::debug!(
                pid,
                stopped,
                "command timed out or stopped: killing its process group"
            );
            tree.signal(Signal::SIGKILL);
            (
                exit_rx
                    .recv_timeout(AFTER_KILL_WAIT)
                    .ok()
                    .and_then(Result::ok),
                !stopped,
            )
        }
    };
    // Read what is left in the pipes, for a while; then nothing of the group may stay.
    let drain_until = Instant::now()
        + if timed_out || stopped {
            Duration::ZERO
        } else {
            EXIT_DRAIN
        };
    let mut open = 2;
    while open > 0 && done_rx.recv_timeout(remaining(drain_until)).is_ok() {
        open -= 1;
    }
    let had_to_kill = timed_out || stopped || open > 0;
    tree.signal(Signal::SIGKILL);
    let gone_by = Instant::now() + AFTER_KILL_WAIT;
    while open > 0 && done_rx.recv_timeout(remaining(gone_by)).is_ok() {
        open -= 1;
    }
    if open > 0 || (had_to_kill && !tree.wait_gone_blocking(remaining(gone_by))) {
        tracing::warn!(
            pid,
            "a process of the command could not be killed within 2 s"
        );
    }
    let exit = status.map(ChildExit::from).unwrap_or(ChildExit {
        code: None,
        signal: None,
    });
    Ok(Captured {
        exit,
        timed_out,
        stopped,
        stdout: stdout.text(),
        stderr: stderr.text(),
        elapsed: started.elapsed(),
    })
}

fn remaining(until: Instant) -> Duration {
    until.saturating_duration_since(Instant::now())
}

/// The last [`CAPTURE_MAX_BYTES`] bytes read from one pipe, shared with its reader thread so that
/// what was read so far can be taken even if the pipe never closes.
#[derive(Debug, Default, Clone)]
struct Tail(Arc<Mutex<Vec<u8>>>);

impl Tail {
    /// Reads `pipe` to its end on a thread; sends on `done` when it ends.
    fn read_from(&self, mut pipe: impl Read + Send + 'static, done: mpsc::Sender<()>) {
        let buf = Arc::clone(&self.0);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut kept = buf.lock().unwrap_or_else(|e| e.into_inner());
                        kept.extend_from_slice(&chunk[..n]);
                        if kept.len() > 2 * CAPTURE_MAX_BYTES {
                            let cut = kept.len() - CAPTURE_MAX_BYTES;
                            kept.drain(..cut);
                        }
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done.send(());
        });
    }

    fn text(&self) -> String {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let start = kept.len().saturating_sub(CAPTURE_MAX_BYTES);
        String::from_utf8_lossy(&kept[start..]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> SpawnSpec {
        SpawnSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..SpawnSpec::default()
        }
    }

    #[test]
    fn collects_both_streams_and_the_exit() {
        let mut spec = sh("cat; echo err >&2; echo \"$GREETING\"; exit 3");
        spec.stdin = Some(b"from stdin\n".to_vec());
        spec.env_set.push(("GREETING".into(), "hello".into()));
        let out = capture(&spec, Some(Duration::from_secs(20))).unwrap();
        assert_eq!(out.stdout, "from stdin\nhello\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.exit.code, Some(3));
        assert_eq!(out.exit.to_string(), "exit code 3");
        assert!(!out.success() && !out.timed_out);
    }

    #[test]
    fn a_timeout_kills_the_whole_group_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let spec = sh(&format!(
            "sleep 30 & echo $! > {}; echo started; wait",
            pid_file.display()
        ));
        let t = Instant::now();
        let out = capture(&spec, Some(Duration::from_millis(500))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(out.timed_out && !out.success());
        assert_eq!(out.exit.signal, Some(9));
        assert_eq!(out.stdout, "started\n");
        let grandchild: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let alive = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "the background sleep survived the timeout");
    }

    #[test]
    fn a_stop_kills_a_stoppable_capture_at_once() {
        let stop = crate::process::StopSignals::default();
        let trigger = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            trigger.stop.cancel();
        });
        let t = Instant::now();
        let out = capture_stoppable(
            &sh("echo begun; sleep 30"),
            Some(Duration::from_secs(60)),
            &stop,
        )
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(out.stopped && !out.timed_out && !out.success(), "{out:?}");
        assert_eq!(out.stdout, "begun\n");
        // Not stopped: as capture.
        let calm = crate::process::StopSignals::default();
        let out = capture_stoppable(&sh("exit 0"), None, &calm).unwrap();
        assert!(out.success() && !out.stopped);
    }

    #[test]
    fn a_grandchild_holding_the_pipe_does_not_hang_the_caller() {
        let t = Instant::now();
        let out = capture(&sh("sleep 30 & echo done"), None).unwrap();
        assert!(out.success());
        assert_eq!(out.stdout, "done\n");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn a_missing_program_is_an_error_naming_it() {
        let spec = SpawnSpec {
            program: "/nonexistent/tool".into(),
            ..SpawnSpec::default()
        };
        let err = capture(&spec, None).unwrap_err();
        assert!(matches!(err, ProcessError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/tool"), "{err}");
    }
}
