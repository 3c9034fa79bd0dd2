//! Sleeps that end early on Ctrl-C (or SIGTERM/SIGHUP) or a `ralph stop` request (checked every
//! second): the waits for a usage limit's reset and for a transient retry.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::policy::WaitEnd;
use crate::process::StopSignals;

/// Sleeps until `until`, waking early on a stop (see the module docs).
pub async fn until(until: DateTime<Utc>, stop: &StopSignals, ralph_dir: &Path) -> WaitEnd {
    let left = (until - Utc::now()).to_std().unwrap_or_default();
    pause(left, stop, ralph_dir).await
}

/// How a pause ([`crate::pause_request`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseEnd {
    /// The request was removed (`ralph resume`).
    Resumed,
    /// `ralph stop`, Ctrl-C/SIGTERM/SIGHUP, or `--max-duration` ran out: the run's next pick
    /// says which and stops.
    Stopping,
}

/// Holds while a pause is requested, checking every 200 ms; ends on `ralph resume`, a stop
/// request, a stop signal, or when `time_left` (what is left of `--max-duration`) runs out.
pub async fn while_paused(
    stop: &StopSignals,
    ralph_dir: &Path,
    time_left: Option<Duration>,
) -> PauseEnd {
    let deadline = time_left.map(|left| tokio::time::Instant::now() + left);
    loop {
        if crate::pause_request::pending(ralph_dir).is_none() {
            return PauseEnd::Resumed;
        }
        if crate::stop_request::pending(ralph_dir)
            || deadline.is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            return PauseEnd::Stopping;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.stop.cancelled() => return PauseEnd::Stopping,
        }
    }
}

/// Sleeps for `wait`, waking early on a stop (see the module docs).
pub async fn pause(wait: Duration, stop: &StopSignals, ralph_dir: &Path) -> WaitEnd {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if crate::stop_request::pending(ralph_dir) {
            return WaitEnd::StopRequested;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return WaitEnd::Elapsed;
        }
        let step = (deadline - now).min(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(step) => {}
            _ = stop.stop.cancelled() => return WaitEnd::Interrupted,
        }
    }
}
