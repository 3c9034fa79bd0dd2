//! `ralph pause` and `ralph resume` (see [`crate::pause_request`]).
//!
//! `ralph pause` asks the `ralph run` working on this repository to hold after its current
//! iteration (finished and recorded first); exits 1 when no run is active there (no request is
//! left behind then). `ralph resume` removes the request; exits 1 when the run was not paused.

use crate::cli::StopArgs;
use crate::protocol::ExitStatus;
use crate::state::State;
use crate::workspace::RunPaths;

fn paths(args: &StopArgs) -> anyhow::Result<RunPaths> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_prd(args.prd.as_deref(), &cwd)?;
    Ok(RunPaths::of_prd(&prd))
}

/// Runs `ralph pause`.
///
/// # Errors
/// `.ralph/` cannot be written.
pub fn pause(args: &StopArgs) -> anyhow::Result<ExitStatus> {
    let paths = paths(args)?;
    let Some(holder) = crate::lock::live_holder(&paths.ralph_dir) else {
        eprintln!(
            "no `ralph run` is active in {} (nothing to pause)",
            paths.repo_root.display()
        );
        return Ok(ExitStatus::Failure);
    };
    crate::pause_request::request(&paths.ralph_dir)?;
    let state = State::load(&paths.ralph_dir).ok().flatten();
    // A run waiting for a usage limit to reset keeps waiting; the pause holds once the wait
    // ends, before the next iteration starts.
    let waiting = state
        .as_ref()
        .and_then(|s| s.resume_at)
        .filter(|at| *at > chrono::Utc::now());
    if let Some(at) = waiting {
        println!(
            "asked ralph (pid {} on {}) to pause; it is waiting for a usage limit to reset until {} UTC and holds when that wait ends, before the next iteration, until `ralph resume` or `ralph stop`; prd.json and progress.txt are yours to edit once it says it is paused (`ralph status`)",
            holder.pid,
            holder.host,
            at.format("%H:%M:%S")
        );
        return Ok(ExitStatus::Success);
    }
    let current = state
        .and_then(|s| s.in_flight)
        .map(|f| {
            format!(
                " after its current iteration ({}, {})",
                f.iteration, f.story_id
            )
        })
        .unwrap_or_default();
    println!(
        "asked ralph (pid {} on {}) to pause{current}; it holds until `ralph resume` or `ralph stop`, and prd.json and progress.txt are yours to edit once it says it is paused (`ralph status`)",
        holder.pid, holder.host
    );
    Ok(ExitStatus::Success)
}

/// Runs `ralph resume`.
///
/// # Errors
/// No prd.json found.
pub fn resume(args: &StopArgs) -> anyhow::Result<ExitStatus> {
    let paths = paths(args)?;
    if !crate::pause_request::clear(&paths.ralph_dir) {
        eprintln!(
            "ralph is not paused in {} (nothing to resume)",
            paths.repo_root.display()
        );
        return Ok(ExitStatus::Failure);
    }
    match crate::lock::live_holder(&paths.ralph_dir) {
        Some(holder) => println!(
            "resumed: ralph (pid {} on {}) starts its next iteration",
            holder.pid, holder.host
        ),
        None => println!("pause removed (no `ralph run` is active)"),
    }
    Ok(ExitStatus::Success)
}
