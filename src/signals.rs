//! Turning SIGINT, SIGTERM and SIGHUP into [`StopSignals`] cancellations.
//!
//! Policy, counting all three signals together:
//! 1. The first asks for a graceful stop (`stop.stop`): the agent's group gets SIGTERM and a
//!    short grace, the iteration is recorded as interrupted, its work is checkpointed, and ralph
//!    exits 130. This is the common case: one Ctrl-C, or a service manager's SIGTERM.
//! 2. The second kills at once (`stop.kill_now`): whoever presses Ctrl-C again is not willing to
//!    wait out the grace, and an agent that ignores SIGTERM must not be able to hold ralph.
//! 3. A third exits ralph immediately with status 128 + the signal number, skipping all cleanup,
//!    in case ralph itself is stuck (say in a slow git operation). The agent's direct child still
//!    dies through its `PR_SET_PDEATHSIG`.
//!
//! SIGINT forwarding: the agent runs in its own process group, so the terminal's Ctrl-C reaches
//! only ralph, never the agent directly; ralph alone decides what the agent receives. That avoids
//! an agent seeing the signal twice (once from the terminal, once from us) and lets a first
//! Ctrl-C wait for the iteration to be recorded.
//!
//! Once installed, tokio keeps the handlers for the life of the process, so these signals no
//! longer kill ralph by default even if the watcher task stops.

use std::io;
use std::sync::{Arc, OnceLock};

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::process::StopSignals;

/// Handle on the signal-listening task started by [`install`].
///
/// Dropping it does not stop listening: the task runs until the tokio runtime shuts down, so
/// dropping the handle by accident cannot leave Ctrl-C swallowed and ignored.
#[derive(Debug)]
pub struct SignalWatcher {
    first: Arc<OnceLock<&'static str>>,
}

impl SignalWatcher {
    /// Name of the first signal received (`"SIGINT"`, `"SIGTERM"` or `"SIGHUP"`), if any.
    pub fn received(&self) -> Option<&'static str> {
        self.first.get().copied()
    }
}

/// What to do on the n-th signal (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escalation {
    Stop,
    KillNow,
    Exit,
}

fn escalation(count: u32) -> Escalation {
    match count {
        0 | 1 => Escalation::Stop,
        2 => Escalation::KillNow,
        _ => Escalation::Exit,
    }
}

/// Starts listening for SIGINT, SIGTERM and SIGHUP and applies the module's policy to `stop`.
///
/// The handlers are registered before this returns, so a signal that arrives right after is
/// already caught. Must be called inside a tokio runtime with I/O enabled.
///
/// # Errors
/// An `io::Error` when there is no tokio runtime, or when the runtime cannot register a handler
/// (the OS refused, or tokio's `signal` feature is off).
pub fn install(stop: StopSignals) -> io::Result<SignalWatcher> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|err| {
        io::Error::other(format!(
            "signals::install must be called inside a tokio runtime: {err}"
        ))
    })?;
    // Registered here, not in the task, so no signal slips through before the task first runs.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    // A SIGHUP that was ignored when ralph started (`nohup ralph run`, or a service manager
    // that ignores it) stays ignored: closing the terminal must not end a run its user
    // protected. Otherwise a hang-up is a stop request like SIGTERM (docs/decisions.md).
    let mut hup = if hangup_ignored() {
        tracing::info!("SIGHUP is ignored (nohup): closing the terminal does not stop this run");
        None
    } else {
        Some(signal(SignalKind::hangup())?)
    };
    let first = Arc::new(OnceLock::new());
    let seen = Arc::clone(&first);
    runtime.spawn(async move {
        let mut count: u32 = 0;
        loop {
            let sig = tokio::select! {
                Some(()) = int.recv() => Signal::SIGINT,
                Some(()) = term.recv() => Signal::SIGTERM,
                Some(()) = hangup(&mut hup) => Signal::SIGHUP,
                else => break, // the runtime is shutting down
            };
            count += 1;
            let name = sig.as_str();
            // Only the first signal is recorded; later ones find it already set.
            let _ = seen.set(name);
            stop.record(name);
            match escalation(count) {
                Escalation::Stop => {
                    tracing::info!(signal = name, "stopping: the agent gets SIGTERM and a short grace; signal again to kill it at once");
                    stop.stop.cancel();
                }
                Escalation::KillNow => {
                    tracing::warn!(signal = name, "second signal: killing the agent now");
                    stop.stop.cancel();
                    stop.kill_now.cancel();
                }
                Escalation::Exit => {
                    eprintln!("ralph: third signal ({name}), exiting at once without cleanup");
                    std::process::exit(128 + sig as i32);
                }
            }
        }
    });
    Ok(SignalWatcher { first })
}

/// The next SIGHUP, or never when ralph does not listen for it.
async fn hangup(hup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hup {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
}

/// Whether SIGHUP's disposition is "ignore" (inherited from `nohup` or the parent), read
/// without changing it.
pub fn hangup_ignored() -> bool {
    let mut old = std::mem::MaybeUninit::<nix::libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current disposition into `old`, which is a
    // zero-initialised sigaction the kernel fills in; nothing is installed or changed.
    let rc = unsafe { nix::libc::sigaction(nix::libc::SIGHUP, std::ptr::null(), old.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: sigaction returned 0, so it wrote `old`; zeroed memory is a valid sigaction too.
    let old = unsafe { old.assume_init() };
    old.sa_sigaction == nix::libc::SIG_IGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_stops_second_kills_third_exits() {
        assert_eq!(escalation(1), Escalation::Stop);
        assert_eq!(escalation(2), Escalation::KillNow);
        assert_eq!(escalation(3), Escalation::Exit);
        assert_eq!(escalation(7), Escalation::Exit);
    }

    #[test]
    fn install_outside_a_runtime_is_an_error_not_a_panic() {
        let err = install(StopSignals::default()).expect_err("no runtime here");
        assert!(err.to_string().contains("tokio runtime"), "{err}");
    }
}
