//! `ralph stop [--prd PATH]`: asks the `ralph run` working on this repository to stop after its
//! current iteration (finished, committed and recorded first), or at once when it is waiting for
//! a usage-limit reset or a retry. The run then exits 4 and its summary says `ralph stop` ended it.
//!
//! Prints which run was asked (pid, host, current iteration); exits 1 with a message when no
//! `ralph run` is active there (no request is left behind then).

use crate::cli::StopArgs;
use crate::protocol::ExitStatus;
use crate::state::State;
use crate::workspace::RunPaths;

/// Runs `ralph stop`.
///
/// # Errors
/// `.ralph/` cannot be written.
pub fn run(args: &StopArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_prd(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);
    let root = paths.repo_root.clone();
    let Some(holder) = crate::lock::live_holder(&paths.ralph_dir) else {
        eprintln!(
            "no `ralph run` is active in {} (nothing to stop)",
            root.display()
        );
        return Ok(ExitStatus::Failure);
    };
    crate::stop_request::request(&paths.ralph_dir)?;
    let state = State::load(&paths.ralph_dir)
        .ok()
        .flatten()
        .unwrap_or_default();
    let paused = crate::pause_request::pending(&paths.ralph_dir).is_some();
    let when = when(&state, paused, chrono::Utc::now());
    println!(
        "asked ralph (pid {} on {}) {when}; it exits 4 when done",
        holder.pid, holder.host
    );
    Ok(ExitStatus::Success)
}

/// When the run stops, as `ralph stop` words it from state.json (`state`), whether a pause is
/// asked (`paused`) and the time (`now`). A wait (a usage limit's reset, a retry) ends at once
/// on the request, paused or not (a pause holds only between iterations, after the wait); an
/// iteration in flight is finished first; a run held by a pause with nothing in flight stops at
/// once.
fn when(state: &State, paused: bool, now: chrono::DateTime<chrono::Utc>) -> String {
    let clock = |at: chrono::DateTime<chrono::Utc>| at.format("%H:%M:%S UTC").to_string();
    let waiting = |what: &str, at: chrono::DateTime<chrono::Utc>| {
        format!(
            "to stop (it is waiting for {what} until {}: the wait ends at once, no iteration runs)",
            clock(at)
        )
    };
    let flights: Vec<String> = state
        .in_flight
        .iter()
        .chain(&state.flights)
        .map(|f| format!("iteration {}, {}", f.iteration, f.story_id))
        .collect();
    match (state.wait_until, state.retry_at) {
        (Some(until), _) if until > now && flights.is_empty() => {
            waiting("a usage limit to reset", until)
        }
        (_, Some(at)) if at > now && flights.is_empty() => waiting("a retry", at),
        _ if flights.is_empty() && paused => "to stop (it is paused: it stops at once)".to_owned(),
        _ if flights.is_empty() => "to stop after its current iteration".to_owned(),
        _ => format!(
            "to stop after its current iteration ({})",
            flights.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_named_as_a_wait_paused_or_not() {
        let now = chrono::Utc::now();
        let later = now + chrono::Duration::minutes(50);
        let waiting = State {
            wait_until: Some(later),
            ..State::default()
        };
        for paused in [false, true] {
            let said = when(&waiting, paused, now);
            assert!(
                said.contains("waiting for a usage limit to reset until"),
                "{said}"
            );
            assert!(!said.contains("paused"), "{said}");
        }
        let retrying = State {
            retry_at: Some(later),
            ..State::default()
        };
        assert!(when(&retrying, true, now).contains("waiting for a retry"));
        assert_eq!(
            when(&State::default(), true, now),
            "to stop (it is paused: it stops at once)"
        );
    }
}
