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
    let current = State::load(&paths.ralph_dir)
        .ok()
        .flatten()
        .and_then(|s| s.in_flight)
        .map(|f| format!(" (iteration {}, {})", f.iteration, f.story_id))
        .unwrap_or_default();
    let when = if crate::pause_request::pending(&paths.ralph_dir).is_some() && current.is_empty() {
        "to stop (it is paused: it stops at once)".to_owned()
    } else {
        format!("to stop after its current iteration{current}")
    };
    println!(
        "asked ralph (pid {} on {}) {when}; it exits 4 when done",
        holder.pid, holder.host
    );
    Ok(ExitStatus::Success)
}
