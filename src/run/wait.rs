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
