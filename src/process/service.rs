//! [`Service`]: a long-lived child that serves ralph for a while (the local model server), and
//! must not outlive it whatever way ralph ends.
//!
//! The child runs in its own process group with `PR_SET_PDEATHSIG(SIGKILL)` (Linux);
//! [`Service::stop`] ends the group (SIGTERM, grace, SIGKILL) and dropping a [`Service`] that was
//! not stopped SIGKILLs the group at once. [`Service::pgid`] lets the caller record the group so
//! that a later ralph can kill it after a crash ([`super::kill_group`]).

use std::io;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};

use super::group::Tree;
use super::{spawn, ChildExit, ProcessError, SpawnSpec};

/// How long [`Service::stop`] waits for the kernel to let it reap the child once its group is
/// gone.
const REAP_WAIT: Duration = Duration::from_secs(2);

/// A running long-lived child in its own process group. Stop it with [`Service::stop`]; dropping
/// it SIGKILLs its group.
#[derive(Debug)]
pub struct Service {
    /// `None` once reaped (exited by itself, or stopped): nothing may be signalled then, since
    /// the group id may be reused.
    child: Option<Child>,
    /// The child's pid, which is also its process group id.
    pgid: i32,
}

impl Service {
    /// Starts `spec` with stdin `/dev/null` and its output going to `stdout` and `stderr` (e.g. a
    /// log file), in its own process group with the parent-death signal.
    ///
    /// The death signal fires when the *thread* that spawned the child exits, so call this on a
    /// thread that lives as long as the service should (a tokio worker or the main thread, never
    /// `spawn_blocking`). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`ProcessError`] when the program cannot start (not found, not runnable, missing
    /// `spec.cwd`), or when `spec.stdin` holds bytes (a service reads nothing).
    pub fn start(
        spec: &SpawnSpec,
        stdout: impl Into<Stdio>,
        stderr: impl Into<Stdio>,
    ) -> Result<Service, ProcessError> {
        if spec.stdin.is_some() {
            return Err(ProcessError::Spawn {
                program: spec.program.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a service's stdin is /dev/null; no input can be given",
                ),
            });
        }
        let mut command = Command::from(spawn::command(spec)?);
        command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // A backstop for the direct child; `Drop` handles the group.
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|source| spawn::spawn_error(spec, source))?;
        let (pid, pgid) = match spawn::pgid_of(spec, child.id()) {
            Ok(ids) => ids,
            Err(err) => {
                let _ = child.start_kill();
                return Err(err);
            }
        };
        tracing::debug!(pid, program = %spec.program.display(), "service started in its own group");
        Ok(Service {
            child: Some(child),
            pgid,
        })
    }

    /// The child's process group id (= its pid), for recording so that a later ralph can kill an
    /// orphaned group ([`super::kill_group`]).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// How the child ended, if it has exited by itself (it is then reaped, and [`Service::stop`]
    /// and drop signal nothing); `None` while it runs.
    pub fn try_exit(&mut self) -> Option<ChildExit> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(ChildExit::from(status))
    }

    /// Stops the service: SIGTERM to its group, up to `grace` to exit, then SIGKILL; returns once
    /// no live process of the group is left (or about 2 s after the SIGKILL), with the child
    /// reaped. A service that already exited is left alone.
    pub async fn stop(mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        super::kill_group(self.pgid, grace).await;
        // The group is gone, so this only collects the exit status (a zombie's).
        if tokio::time::timeout(REAP_WAIT, child.wait()).await.is_err() {
            tracing::warn!(pgid = self.pgid, "service was not reaped after SIGKILL");
        }
    }

    /// SIGKILLs the group (and descendants that left it, on Linux) at once, unless the child was
    /// already reaped; the child is then reaped by tokio in the background.
    pub fn kill_now(&mut self) {
        if self.child.take().is_some() {
            Tree::new(self.pgid).signal(Signal::SIGKILL);
        }
    }
}

impl Drop for Service {
    /// SIGKILLs the group at once (on errors, panics, or a forgotten `stop`).
    fn drop(&mut self) {
        self.kill_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> SpawnSpec {
        SpawnSpec {
            program: "sh".into(),
            args: vec!["-c".into(), "sleep 30 & sleep 30".into()],
            ..SpawnSpec::default()
        }
    }

    fn wait_gone(pgid: i32) -> bool {
        for _ in 0..100 {
            if !super::super::group_alive(pgid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stop_and_drop_end_the_whole_group() {
        let service = Service::start(&sleeper(), Stdio::null(), Stdio::null()).unwrap();
        let pgid = service.pgid();
        assert!(super::super::group_alive(pgid));
        service.stop(Duration::from_secs(1)).await;
        assert!(
            !super::super::group_alive(pgid),
            "stop left the group alive"
        );

        let service = Service::start(&sleeper(), Stdio::null(), Stdio::null()).unwrap();
        let pgid = service.pgid();
        drop(service);
        assert!(wait_gone(pgid), "drop left the group alive");
    }

    #[tokio::test]
    async fn an_exit_is_reported_once_and_a_missing_program_is_an_error() {
        let spec = SpawnSpec {
            program: "sh".into(),
            args: vec!["-c".into(), "exit 4".into()],
            ..SpawnSpec::default()
        };
        let mut service = Service::start(&spec, Stdio::null(), Stdio::null()).unwrap();
        let mut exit = None;
        for _ in 0..200 {
            exit = service.try_exit();
            if exit.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(exit.map(|e| e.to_string()).as_deref(), Some("exit code 4"));
        assert_eq!(service.try_exit(), None);

        let missing = SpawnSpec {
            program: "/nonexistent/python".into(),
            ..SpawnSpec::default()
        };
        let err = Service::start(&missing, Stdio::null(), Stdio::null()).unwrap_err();
        assert!(matches!(err, ProcessError::NotFound { .. }), "{err}");
    }
}
