//! `ralph run`: resolve the settings, install the signal handlers, choose the outputs, and drive
//! the loop.

use std::io::Write as _;

use crate::cli::RunArgs;
use crate::config::{OutputMode, RunConfig};
use crate::output::github::{GitHubActions, RunnerEnv};
use crate::output::notify::{Deadline, Notify};
use crate::output::{human::Human, json::Json, Outputs};
use crate::process::StopSignals;
use crate::protocol::ExitStatus;

/// Runs the loop described by `args` (see [`crate::run::run`]).
///
/// # Errors
/// Invalid settings and every preflight failure of the loop; the caller prints them.
pub fn run(args: &RunArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    // A refused flag value is a usage error (exit 2); the same value in ralph.toml exits 1.
    let cfg = RunConfig::resolve(args, &cwd).map_err(|e| {
        let status = e.exit_status();
        crate::error::UserError::new(e.to_string()).with_status(status)
    })?;
    // One redactor for the run: the environment's secrets and the repository's `.env` files,
    // applied wherever text leaves ralph (crate::redact).
    crate::redact::install(&crate::workspace::RunPaths::of_prd(&cfg.prd_path).repo_root);
    // Two worker threads: the agent's pipes and timers on one, signals on the other. Agent
    // processes are spawned from worker threads, which live as long as the runtime, so their
    // parent-death signal does not fire early.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = StopSignals::default();
        let _signals = crate::signals::install(stop.clone())?;
        let notice = stop.clone();
        let grace = cfg.agent_grace();
        // Say at once what a Ctrl-C does: the agent may take the whole grace period to exit.
        tokio::spawn(async move {
            notice.stop.cancelled().await;
            // Nothing running (a usage-limit wait, a retry's pause): no grace, no checkpoint.
            if crate::process::supervised() == 0 {
                let _ = writeln!(
                    std::io::stderr(),
                    "\nralph: stopping — no agent is running, so the run stops now."
                );
                return;
            }
            let _ = writeln!(
                std::io::stderr(),
                "\nralph: stopping — a running agent gets up to {} to exit, then its work is checkpointed. Press Ctrl-C again to kill it now.",
                humantime::format_duration(grace)
            );
            notice.kill_now.cancelled().await;
            let _ = writeln!(std::io::stderr(), "ralph: killing the agent now.");
        });
        let mut out = outputs(&cfg, &stop);
        let result = crate::run::run(cfg, &mut out, stop).await;
        if let Err(e) = &result {
            out.failed(i32::from(crate::error::exit_status(e).code()), &e.to_string());
        }
        // Pending notifications are delivered (each attempt bounded; after a signal, all of them
        // within --shutdown-timeout) before ralph exits.
        out.close();
        result
    })
}

/// The sinks for the output mode: the terminal (`--quiet` keeps warnings, failures and the
/// summary), or the `--json` stream (warnings still reach stderr); notifications end within
/// `--shutdown-timeout` of a signal on `stop`.
fn outputs(cfg: &RunConfig, stop: &StopSignals) -> Outputs {
    let mut out = Outputs::new();
    // First, so that an iteration's group opens before the terminal prints its first line.
    if let Some(sink) = github_actions(cfg) {
        out.add(Box::new(sink));
    }
    match cfg.output {
        OutputMode::Human => out.add(Box::new(Human::new(false, cfg.verbose))),
        OutputMode::Quiet => out.add(Box::new(Human::new(true, cfg.verbose))),
        OutputMode::Json => {
            out.add(Box::new(Json::new(cfg.verbose)));
            out.add(Box::new(Human::warnings_only()));
        }
    }
    if !cfg.notify.is_empty() {
        let origin = crate::notify::Origin::of_prd(&cfg.prd_path);
        let paths = crate::workspace::RunPaths::of_prd(&cfg.prd_path);
        let log = paths.ralph_dir.join(crate::notify::DELIVERIES_FILE);
        let sink = Notify::new(
            cfg.notify.clone(),
            origin,
            paths.repo_root.clone(),
            log,
            out.warnings(),
        )
        .with_deadline(Deadline::new(stop.clone(), cfg.shutdown_timeout));
        out.add(Box::new(sink));
    }
    out
}

/// The GitHub Actions sink, under `GITHUB_ACTIONS=true` only; its step summary is the Markdown
/// report of the run that just finished (`ralph report --markdown`).
fn github_actions(cfg: &RunConfig) -> Option<GitHubActions> {
    let env = RunnerEnv::from_env();
    if !env.github_actions {
        // No need to read (a possibly huge) prd.json for a sink that will not exist.
        return None;
    }
    let prd_path = cfg.prd_path.clone();
    let branch = crate::prd::store::load(&prd_path)
        .ok()
        .and_then(|l| l.prd.branch_name);
    let report = Box::new(move || markdown_report(&prd_path));
    GitHubActions::new(&env, branch, report)
}

/// The Markdown report of the latest run of the repository holding `prd_path`.
fn markdown_report(prd_path: &std::path::Path) -> Option<String> {
    use crate::report::{self, Inputs, Scope};
    let prd = crate::prd::store::load(prd_path).ok()?;
    let paths = crate::workspace::RunPaths::of_prd(&prd.path);
    let repo = crate::git::Repo::discover(&paths.repo_root).ok();
    let history = crate::history::History::load(&paths, repo.as_ref()).ok()?;
    let state = crate::state::State::load(&paths.ralph_dir).ok().flatten();
    let progress = std::fs::read_to_string(&paths.progress).unwrap_or_default();
    let data = report::build(
        &history,
        &Scope::Latest,
        &Inputs {
            prd: &prd.prd,
            state: state.as_ref(),
            repo: repo.as_ref(),
            progress: &progress,
        },
    )
    .ok()?;
    Some(report::markdown::render(&data))
}
