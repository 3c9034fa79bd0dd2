//! The outer loop of `ralph run`: preflight, then one iteration at a time — pick the story,
//! snapshot, render the prompt, run a fresh agent, classify, checkpoint, record, decide — until
//! every story passes or a stop condition is hit. The driver knows the *sequence*; building argv
//! and parsing output belong to [`crate::agent`], spawning and killing to [`crate::process`],
//! git to [`crate::git`].

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use chrono::{Datelike as _, Local, Utc};

use crate::agent::native::NativeSettings;
use crate::agent::{self, AgentSettings};
use crate::completion::promise_in_final_text;
use crate::config::RunConfig;
use crate::git::{BranchAction, Repo};
use crate::ledger;
use crate::lock::RunLock;
use crate::prd::model::Prd;
use crate::prd::store::{self, LoadedPrd};
use crate::process::{self, EndReason, Limits, LineVerdict, StopSignals};
use crate::progress;
use crate::prompt::{PromptContext, PromptTemplate};
use crate::protocol::AgentKind;
use crate::protocol::AgentReport;
use crate::protocol::CostSource;
use crate::protocol::ExitStatus;
use crate::protocol::FailureClass;
use crate::protocol::LedgerRecord;
use crate::protocol::Outcome;
use crate::state::{InFlight, State};
use crate::transcript::{Transcript, TranscriptMeta};
use crate::ui::{Summary, Ui};
use crate::workspace::{display_rel, ensure_ralph_dir, RunPaths};

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(crate::fsutil::write_atomic(path, bytes)?)
}

/// How long the agent may live after its terminal event before it is killed (seconds).
const FINAL_GRACE: Duration = Duration::from_secs(5);
/// How long output is still read after the agent exited, before its group is killed.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Longest agent output line kept in memory for parsing (16 MiB).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Environment variable marking every process of an agent with `<run id>/<iteration>`.
pub const AGENT_TAG_VAR: &str = "RALPH_AGENT_TAG";

/// Runs the whole loop with `cfg`, returning the exit status to report.
///
/// # Errors
/// Preflight failures (invalid prd.json, not a git repo, dirty tree, lock held, agent missing,
/// bad template) and I/O errors on ralph's own files. Agent failures are not errors: they are
/// iteration outcomes.
pub async fn run(cfg: RunConfig, ui: &mut Ui, stop: StopSignals) -> anyhow::Result<ExitStatus> {
    let started = Instant::now();

    // Preflight: every check that can fail happens before any agent starts.
    let prd_dir = cfg
        .prd_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if !cfg.prd_path.exists() {
        bail!(
            "{} does not exist\nhint: create one with `ralph init`, or point ralph at yours with --prd PATH",
            cfg.prd_path.display()
        );
    }
    let repo = Repo::discover(&prd_dir)?;
    let paths = RunPaths::new(repo.root(), &cfg.prd_path);
    let template =
        PromptTemplate::load_with_default(cfg.template.as_deref(), cfg.agent == AgentKind::Local)?;
    if cfg.agent == AgentKind::Exec && cfg.model.is_some() {
        ui.warn("--model is not passed to an exec agent; put it in --agent-cmd instead");
    }
    if cfg.agent == AgentKind::Native {
        if let Some(var) = &cfg.native.api_key_env {
            if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                bail!(
                    "the API key variable {var} is not set\nhint: export {var}=<your key>, or name the variable that holds it with --api-key-env VAR"
                );
            }
        }
    }
    // The local backend's server starts later (after the lock); its URL is not known yet.
    let mut backend = build_backend(&cfg, &paths, cfg.native.base_url.clone())?;
    let probe = backend.command("")?;
    if which::which_in(&probe.program, std::env::var_os("PATH"), &paths.repo_root).is_err() {
        let how = match cfg.agent {
            AgentKind::Exec => "fix --agent-cmd (agent_cmd in ralph.toml)",
            _ => "install it, or point ralph at it with --agent-program PATH (agent_program in ralph.toml)",
        };
        let place = if probe.program.components().count() > 1 {
            "does not exist or is not executable"
        } else {
            "was not found on PATH"
        };
        bail!(
            "the agent program `{}` {place}\nhint: {how}",
            probe.program.display()
        );
    }

    // The CLI's version goes into the run header and every ledger record (a CLI that changed
    // overnight is the first suspect when its output stops parsing). Only for known CLIs: an
    // exec command may do anything with `--version`.
    let agent_version = match cfg.agent {
        AgentKind::Exec | AgentKind::Native | AgentKind::Local => None,
        _ => {
            match crate::agent::probe::version(&probe.program, crate::agent::probe::VERSION_TIMEOUT)
            {
                Ok(v) => Some(v),
                Err(e) => {
                    ui.warn(&format!("cannot tell the agent's version: {e}"));
                    None
                }
            }
        }
    };

    ensure_ralph_dir(&paths.ralph_dir)?;
    let acquired = RunLock::acquire(&paths.ralph_dir)?;
    let _lock = acquired.lock;
    if let Some(stale) = acquired.stale {
        ui.warn(&format!(
            "taking over a stale lock from pid {} on {} (that ralph is no longer running)",
            stale.pid, stale.host
        ));
    }

    // No other ralph runs here now, so git locks nobody holds were left by a killed process
    // (e.g. a ralph SIGKILLed inside its checkpoint commit) and would fail every commit.
    for lock in repo.clear_stale_locks() {
        ui.warn(&format!(
            "removed a stale .git/{lock} that no process held (left by a killed process)"
        ));
    }
    // A ledger line torn by a crash is cut off (its bytes kept beside the ledger) before anything
    // reads or appends to it.
    if let ledger::Repair::Dropped { bytes, kept_in } = ledger::repair(&paths.ledger)? {
        ui.warn(&format!(
            "the ledger's last line was torn by a crash; removed it ({bytes} bytes kept in {})",
            display_rel(&kept_in, &paths.repo_root)
        ));
    }
    let mut state = match State::load(&paths.ralph_dir)? {
        Some(state) => state,
        None => {
            // `.ralph/` was deleted (or this is the first run): what git remembers is the truth.
            let history = repo.trailer_history(100_000).unwrap_or_default();
            let rebuilt = State::rebuild_from_git(&history);
            if rebuilt.iteration > 0 {
                ui.info(&format!(
                    "no .ralph/state.json: rebuilt from git history ({} iteration{}, last run {})",
                    rebuilt.iteration,
                    if rebuilt.iteration == 1 { "" } else { "s" },
                    rebuilt.run_id.as_deref().unwrap_or("?")
                ));
            }
            rebuilt
        }
    };
    // A stop asked of an earlier run that ended before it saw the request.
    crate::stop_request::clear(&paths.ralph_dir);
    let run_id = new_run_id();
    let mut feedback = recover_interrupted(&repo, &paths, &mut state, &cfg, ui).await?;
    // Iteration numbers continue even when state.json was deleted: the ledger and the commit
    // trailers remember them.
    state.iteration = state.iteration.max(last_recorded_iteration(&repo, &paths));

    // A usage-limit wait that a previous ralph did not finish still holds.
    if let Some(until) = state.resume_at {
        if until > Utc::now() {
            if cfg.no_wait {
                ui.warn(&format!(
                    "the agent's usage limit resets at {}; not waiting (--no-wait)",
                    until.with_timezone(&Local).format("%Y-%m-%d %H:%M")
                ));
                return Ok(ExitStatus::OtherLimit);
            }
            if wait_passes_limit(until, cfg.usage_limit_margin, cfg.max_duration, started) {
                ui.warn(&format!(
                    "the agent's usage limit resets at {}, after --max-duration ends; not waiting",
                    until.with_timezone(&Local).format("%Y-%m-%d %H:%M")
                ));
                return Ok(ExitStatus::OtherLimit);
            }
            match wait_for_reset(until, cfg.usage_limit_margin, &stop, &paths.ralph_dir, ui).await {
                Pause::Elapsed => {}
                Pause::Interrupted => return Ok(ExitStatus::Interrupted),
                Pause::StopRequested => {
                    crate::stop_request::clear(&paths.ralph_dir);
                    ui.warn("stopped by `ralph stop` while waiting for the usage limit to reset");
                    return Ok(ExitStatus::OtherLimit);
                }
            }
        }
        state.resume_at = None;
        state.save(&paths.ralph_dir)?;
    }

    let loaded = store::load(&paths.prd)?;
    template.check(&loaded.prd, &paths)?;
    if cfg.unblock && !state.blocked.is_empty() {
        ui.info(&format!(
            "unblocked {} (--unblock): their attempts start again from 0",
            state.blocked.join(", ")
        ));
        for id in std::mem::take(&mut state.blocked) {
            state.attempts.remove(&id);
        }
    }
    // Blocked stories survive a lost state.json: the attempts rebuilt from git decide again.
    for s in &loaded.prd.user_stories {
        let tried = state.attempts.get(&s.id).copied().unwrap_or(0);
        if !s.passes && tried >= cfg.max_attempts && !state.blocked.contains(&s.id) {
            state.blocked.push(s.id.clone());
        }
    }
    let expected_ids = story_ids(&loaded.prd);
    if loaded.prd.user_stories.is_empty() {
        bail!(
            "{} has no stories\nhint: add at least one story to userStories (see `ralph init` for the format)",
            paths.prd.display()
        );
    }

    // progress.txt is ralph's own log: an entry (or the file itself) a killed run did not get to
    // commit is folded into the next checkpoint, not refused as the user's work.
    let progress_rel = display_rel(&paths.progress, &paths.repo_root);
    let dirty: Vec<String> = repo
        .dirty_paths()?
        .into_iter()
        .filter(|p| *p != progress_rel)
        .collect();
    if !dirty.is_empty() && !cfg.allow_dirty {
        let shown: Vec<_> = dirty.iter().take(10).map(|p| format!("  {p}")).collect();
        bail!(
            "the working tree has uncommitted changes ({} path{}):\n{}{}\nhint: commit or stash them first (ralph commits after every iteration and must not mix your work into its checkpoints), or pass --allow-dirty to include them",
            dirty.len(),
            if dirty.len() == 1 { "" } else { "s" },
            shown.join("\n"),
            if dirty.len() > 10 { "\n  …" } else { "" }
        );
    }
    // Before any checkout can swap progress.txt or prd.json: archive the previous feature's
    // prd.json and progress.txt when branchName changed since the last run.
    let archived = crate::archive::check(
        &paths.repo_root,
        &paths.prd,
        &paths.progress,
        &paths.ralph_dir,
        Local::now().date_naive(),
    )?;
    let branch_row = match &loaded.prd.branch_name {
        Some(branch) => {
            let action = match repo.ensure_branch(branch, loaded.prd.base_branch.as_deref())? {
                BranchAction::AlreadyOn => "already checked out".to_string(),
                BranchAction::CheckedOut => "checked out".to_string(),
                BranchAction::Created { from, .. } => format!("created from {from}"),
                BranchAction::Unborn => "no commit yet; the first commit lands on it".to_string(),
            };
            format!("{branch} ({action})")
        }
        None => format!(
            "{} (prd.json has no branchName)",
            repo.current_branch()
                .unwrap_or_else(|| "detached HEAD".into())
        ),
    };
    if let Some(done) = &archived {
        ui.info(&done.describe(&paths.repo_root));
        ui.json_event("archived", serde_json::to_value(done)?);
        let folder = display_rel(&done.folder, &paths.repo_root);
        repo.commit_all(
            &format!(
                "ralph: archive {} to {folder}",
                done.branch.as_deref().unwrap_or("the previous run")
            ),
            "",
            &[],
        )?;
    }
    // The local model's server lives exactly as long as this run: stopped below, and killed by
    // its guard on any early return (and by its parent-death signal if ralph itself dies).
    let local_server = match (cfg.agent, &cfg.native.base_url) {
        (AgentKind::Local, None) => {
            let server = start_local_server(&cfg, ui).await?;
            backend = build_backend(&cfg, &paths, Some(server.base_url()))?;
            Some(server)
        }
        _ => None,
    };
    let progress_row = if progress::ensure_exists(&paths.progress, Local::now())? {
        format!(
            "{} (created)",
            display_rel(&paths.progress, &paths.repo_root)
        )
    } else {
        display_rel(&paths.progress, &paths.repo_root)
    };

    ui.json_event(
        "run_started",
        serde_json::json!({"run_id": run_id, "prd": paths.prd, "agent": cfg.agent.as_str(), "max_iter": cfg.max_iter}),
    );
    ui.info(&format!("ralph run {run_id}"));
    ui.settings(&[
        ("prd", paths.prd.display().to_string()),
        ("branch", branch_row),
        ("progress", progress_row),
        (
            "agent",
            match &agent_version {
                Some(v) => format!("{} {v} ({})", cfg.agent.as_str(), shell_words(&probe)),
                None => format!("{} ({})", cfg.agent.as_str(), shell_words(&probe)),
            },
        ),
        (
            "model",
            match (&cfg.model, cfg.agent) {
                (Some(m), _) => m.clone(),
                (None, AgentKind::Local) => match &cfg.native.model_file {
                    Some(f) => f.display().to_string(),
                    None => crate::config::LOCAL_MODEL_NAME.to_string(),
                },
                (None, _) => "agent default".into(),
            },
        ),
        ("max-iter", cfg.max_iter.to_string()),
        (
            "timeouts",
            format!(
                "{} per iteration, {} idle",
                humantime::format_duration(cfg.timeout),
                humantime::format_duration(cfg.idle_timeout)
            ),
        ),
        ("ledger", display_rel(&paths.ledger, &paths.repo_root)),
    ]);

    let limits = Limits {
        timeout: cfg.timeout,
        idle_timeout: cfg.idle_timeout,
        kill_grace: cfg.kill_grace,
        exit_drain: EXIT_DRAIN,
        final_grace: FINAL_GRACE,
        max_line_bytes: MAX_LINE_BYTES,
    };
    let mut limit_repeats = 0u32;
    let mut failures_in_a_row = 0u32;
    let mut unchanged_in_a_row = 0u32;
    let mut records: Vec<LedgerRecord> = Vec::new();
    let mut slot = 0u32;
    let mut caveats: Vec<String> = Vec::new();
    let mut transient_in_a_row = 0u32;
    let mut usage_waits = 0u32;
    let status = loop {
        let current = store::load(&paths.prd)?;
        // What this feature's prd.json looks like, so that a later run with a new branchName
        // archives this one (not the new one).
        if let Err(e) = crate::archive::remember(
            &paths.ralph_dir,
            &paths.prd,
            &current.raw,
            current.prd.branch_name.as_deref(),
        ) {
            ui.warn(&format!("cannot remember prd.json for archiving: {e:#}"));
        }
        let missing: Vec<String> = expected_ids
            .difference(&story_ids(&current.prd))
            .cloned()
            .collect();
        if current.prd.all_pass() {
            if missing.is_empty() {
                break ExitStatus::Success;
            }
            // Never call a run complete because stories vanished from the PRD.
            caveats.push(format!(
                "every remaining story passes, but {} w{} deleted from prd.json during the run; restore {} (e.g. `git show refs/ralph/{run_id}/<n>/start:prd.json`) and run again",
                missing.join(", "),
                if missing.len() == 1 { "as" } else { "ere" },
                if missing.len() == 1 { "it" } else { "them" },
            ));
            break ExitStatus::OtherLimit;
        }
        if stop.stop.is_cancelled() {
            break ExitStatus::Interrupted;
        }
        if crate::stop_request::pending(&paths.ralph_dir) {
            crate::stop_request::clear(&paths.ralph_dir);
            caveats
                .push("stopped by `ralph stop` (after the iteration in progress finished)".into());
            break ExitStatus::OtherLimit;
        }
        if slot >= cfg.max_iter {
            break ExitStatus::MaxIterations;
        }
        let left = time_left(cfg.max_duration, started);
        if left == Some(Duration::ZERO) {
            caveats.push(format!(
                "stopped: the run reached --max-duration {}",
                humantime::format_duration(cfg.max_duration.unwrap_or_default())
            ));
            break ExitStatus::OtherLimit;
        }
        // The last iteration may not outlast the run's own limit.
        let mut limits = limits.clone();
        if let Some(left) = left {
            limits.timeout = limits.timeout.min(left.max(Duration::from_secs(1)));
        }
        let Some(story) = current.prd.next_story(&state.blocked).cloned() else {
            caveats.push(if state.blocked.is_empty() {
                "stopped: no open story can be worked on (each waits for a dependency that does not pass)".to_string()
            } else {
                format!(
                    "stopped: every open story is blocked ({}) or waits for one; fix what stops them, then `ralph run --unblock`",
                    state.blocked.join(", ")
                )
            });
            break ExitStatus::OtherLimit;
        };
        slot += 1;
        let iteration = state.iteration + 1;
        let input = IterationInput {
            run_id: &run_id,
            iteration,
            slot,
            story_id: &story.id,
            feedback: std::mem::take(&mut feedback),
            agent_version: agent_version.as_deref(),
        };
        let done = run_iteration(
            &cfg, &paths, &repo, &*backend, &template, &limits, &stop, &mut state, &current, input,
            ui,
        )
        .await?;
        let resume_at = done.resume_at;
        feedback = done.feedback;
        caveats.extend(done.caveats);
        let outcome = done.record.outcome;
        records.push(done.record);
        if outcome != Outcome::Transient {
            transient_in_a_row = 0;
        }
        if outcome != Outcome::UsageLimit {
            limit_repeats = 0;
        }
        if let Some(reason) = budget_stop(
            &cfg,
            current_story_passes(&paths, &story.id),
            &story.id,
            &records,
            &mut state,
            &mut failures_in_a_row,
            &mut unchanged_in_a_row,
            ui,
        ) {
            state.save(&paths.ralph_dir)?;
            caveats.push(reason);
            break ExitStatus::OtherLimit;
        }
        state.save(&paths.ralph_dir)?;
        match outcome {
            Outcome::Transient => {
                // Overload, 5xx, network: not the agent's fault, so it does not use up the
                // budget; wait (doubling, with jitter) and run the same story again, a bounded
                // number of times in a row.
                transient_in_a_row += 1;
                slot -= 1;
                if transient_in_a_row > cfg.max_transient_retries {
                    caveats.push(format!(
                        "stopped after {} transient failures in a row (overload, server or network errors); the last: {}",
                        transient_in_a_row,
                        records.last().and_then(|r| r.message.clone()).unwrap_or_default()
                    ));
                    break ExitStatus::OtherLimit;
                }
                let wait = transient_wait(cfg.transient_backoff, transient_in_a_row);
                if time_left(cfg.max_duration, started).is_some_and(|left| wait >= left) {
                    caveats.push(format!(
                        "stopped: retrying after the transient failure would pass --max-duration {}",
                        humantime::format_duration(cfg.max_duration.unwrap_or_default())
                    ));
                    break ExitStatus::OtherLimit;
                }
                ui.warn(&format!(
                    "transient failure; retrying {} in {} (retry {} of {})",
                    story.id,
                    humantime::format_duration(Duration::from_secs(wait.as_secs().max(1))),
                    transient_in_a_row,
                    cfg.max_transient_retries
                ));
                match pause(wait, &stop, &paths.ralph_dir).await {
                    Pause::Elapsed => {}
                    Pause::Interrupted => break ExitStatus::Interrupted,
                    Pause::StopRequested => {
                        crate::stop_request::clear(&paths.ralph_dir);
                        caveats.push("stopped by `ralph stop` while waiting to retry".into());
                        break ExitStatus::OtherLimit;
                    }
                }
            }
            Outcome::Interrupted => break ExitStatus::Interrupted,
            Outcome::AuthError | Outcome::ConfigError => break ExitStatus::Failure,
            Outcome::UsageLimit => {
                // Not the agent's failure and not an iteration of the budget: wait for the
                // reset (persisted, so a restarted ralph waits too) and run the same story again.
                slot -= 1;
                usage_waits += 1;
                limit_repeats += 1;
                let until = usage_limit_until(
                    resume_at,
                    Utc::now(),
                    cfg.usage_limit_fallback,
                    limit_repeats,
                );
                state.resume_at = Some(until);
                state.save(&paths.ralph_dir)?;
                if cfg.no_wait {
                    caveats.push(format!(
                        "the agent hit a usage limit that resets at {}; run `ralph run` again then (stopped because of --no-wait)",
                        until.with_timezone(&Local).format("%Y-%m-%d %H:%M")
                    ));
                    break ExitStatus::OtherLimit;
                }
                if usage_waits > cfg.max_usage_limit_waits {
                    caveats.push(format!(
                        "the agent hit a usage limit {usage_waits} times in this run; stopped instead of waiting again (it resets at {})",
                        until.with_timezone(&Local).format("%Y-%m-%d %H:%M")
                    ));
                    break ExitStatus::OtherLimit;
                }
                if wait_passes_limit(until, cfg.usage_limit_margin, cfg.max_duration, started) {
                    caveats.push(format!(
                        "the agent hit a usage limit that resets at {}, after --max-duration {} ends; run `ralph run` again then",
                        until.with_timezone(&Local).format("%Y-%m-%d %H:%M"),
                        humantime::format_duration(cfg.max_duration.unwrap_or_default())
                    ));
                    break ExitStatus::OtherLimit;
                }
                match wait_for_reset(until, cfg.usage_limit_margin, &stop, &paths.ralph_dir, ui)
                    .await
                {
                    Pause::Elapsed => {}
                    Pause::Interrupted => break ExitStatus::Interrupted,
                    Pause::StopRequested => {
                        crate::stop_request::clear(&paths.ralph_dir);
                        caveats.push(
                            "stopped by `ralph stop` while waiting for the usage limit to reset; `ralph run` later waits for the same reset"
                                .into(),
                        );
                        break ExitStatus::OtherLimit;
                    }
                }
                state.resume_at = None;
                state.save(&paths.ralph_dir)?;
            }
            _ => {}
        }
    };

    if let Some(server) = local_server {
        server.stop().await;
    }
    if !state.blocked.is_empty() && !caveats.iter().any(|c| c.contains("is blocked")) {
        let detail: Vec<String> = state
            .blocked
            .iter()
            .map(|id| {
                format!(
                    "{id} ({} attempts)",
                    state.attempts.get(id).copied().unwrap_or(0)
                )
            })
            .collect();
        caveats.push(format!(
            "blocked, so skipped: {}; `ralph run --unblock` gives {} another chance",
            detail.join(", "),
            if detail.len() == 1 { "it" } else { "them" }
        ));
    }
    let final_prd = store::load(&paths.prd).map(|l| l.prd).unwrap_or(loaded.prd);
    let mut summary = summarize(
        status,
        &final_prd,
        &records,
        started.elapsed(),
        &paths,
        &cfg,
    );
    summary.caveats = caveats;
    summary.resume_at = state.resume_at;
    summary.blocked = state.blocked.clone();
    ui.summary(&summary);
    Ok(status)
}

/// The backend for `cfg`; `base_url` is the native/local API URL (for local: the server ralph
/// started, or the user's `--base-url`).
fn build_backend(
    cfg: &RunConfig,
    paths: &RunPaths,
    base_url: Option<String>,
) -> anyhow::Result<Box<dyn agent::Backend>> {
    let native = matches!(cfg.agent, AgentKind::Native | AgentKind::Local).then(|| {
        let model = cfg
            .model
            .clone()
            .unwrap_or_else(|| crate::config::LOCAL_MODEL_NAME.to_string());
        NativeSettings {
            provider: cfg.native.provider,
            base_url: base_url.unwrap_or_else(|| "http://127.0.0.1:0/v1".to_string()),
            api_key_env: cfg.native.api_key_env.clone(),
            price: cfg.native.prices.get(&model).copied(),
            model,
            max_steps: cfg.native.max_steps,
            max_tokens: cfg.native.max_tokens,
            context_window: cfg.native.context_window,
            temperature: cfg.native.temperature,
            seed: cfg.native.seed,
            tool_mode: cfg.native.tool_mode,
            stream: true,
            command_timeout_s: 120,
            repo_root: paths.repo_root.clone(),
            prd_path: paths.prd.clone(),
            progress_path: paths.progress.clone(),
            tools: cfg.native.tools.clone(),
        }
    });
    agent::backend(
        cfg.agent,
        AgentSettings {
            repo: paths.repo_root.clone(),
            model: cfg.model.clone(),
            agent_cmd: cfg.agent_cmd.clone(),
            program: cfg.agent_program.clone(),
            native,
            keep_api_key: cfg.keep_api_key,
        },
    )
}

/// Prepares the local model (once per machine: a virtualenv and the verified GGUF in the cache)
/// and starts its server on 127.0.0.1.
async fn start_local_server(cfg: &RunConfig, ui: &Ui) -> anyhow::Result<crate::local::LocalServer> {
    let mut progress = |msg: &str| ui.info(&format!("local model: {msg}"));
    let (python, model_file) = match &cfg.native.model_file {
        Some(file) => {
            crate::local::verify_model_file(file)?;
            let python =
                crate::local::setup::ensure_venv(&crate::local::cache_dir(), &mut progress)?;
            (python, file.clone())
        }
        None => {
            let model = crate::local::ensure_setup(&mut progress)?;
            (model.python, model.model_file)
        }
    };
    ui.info(&format!(
        "local model: starting the server for {} (2 threads, {}-token context)",
        model_file.display(),
        cfg.native.context_window
    ));
    let server = crate::local::LocalServer::start(
        &python,
        &model_file,
        crate::local::ServerOptions {
            ctx: cfg.native.context_window,
            ..crate::local::ServerOptions::default()
        },
    )
    .await?;
    ui.info(&format!("local model: ready at {}", server.base_url()));
    Ok(server)
}

/// Per-iteration inputs that change every time.
struct IterationInput<'a> {
    run_id: &'a str,
    iteration: u32,
    slot: u32,
    story_id: &'a str,
    feedback: Vec<String>,
    /// The CLI's `--version`, when it answered (recorded when the agent reports none itself).
    agent_version: Option<&'a str>,
}

/// What one iteration produced.
struct IterationDone {
    record: LedgerRecord,
    feedback: Vec<String>,
    /// Things the morning reader must know even if the run completes (e.g. stories marked
    /// passing during another story's iteration).
    caveats: Vec<String>,
    /// For a usage limit: when the agent said it resets.
    resume_at: Option<chrono::DateTime<Utc>>,
}

#[allow(clippy::too_many_arguments)]
async fn run_iteration(
    cfg: &RunConfig,
    paths: &RunPaths,
    repo: &Repo,
    backend: &dyn agent::Backend,
    template: &PromptTemplate,
    limits: &Limits,
    stop: &StopSignals,
    state: &mut State,
    snapshot: &LoadedPrd,
    input: IterationInput<'_>,
    ui: &mut Ui,
) -> anyhow::Result<IterationDone> {
    let IterationInput {
        run_id,
        iteration,
        slot,
        agent_version,
        story_id,
        feedback,
    } = input;
    let story = snapshot
        .prd
        .story(story_id)
        .cloned()
        .context("the picked story vanished from prd.json")?;
    let started_at = Utc::now();
    let started = Instant::now();
    let head_before = repo.head_sha()?;
    if let Some(head) = &head_before {
        repo.set_ref(&format!("refs/ralph/{run_id}/{iteration}/start"), head)?;
    }
    // Changes that exist before the agent starts (ralph's new progress.txt, --allow-dirty work)
    // are not the agent's progress.
    let dirty_at_start = DirtySnapshot::take(repo, head_before.as_deref(), &paths.repo_root)?;

    let excerpt = progress::excerpt(&paths.progress, cfg.progress_tail_bytes)?;
    let ctx = PromptContext::new(
        &snapshot.prd,
        &story,
        iteration,
        iteration - slot + cfg.max_iter,
        &paths.repo_root,
        &paths.prd,
        &paths.progress,
        excerpt,
        feedback,
    );
    let prompt = template.render(&ctx)?;
    let mut spec = backend.command(&prompt)?;
    // Marks every process of this agent, so that a restarted ralph only kills a process group
    // that is really its own (pids are reused).
    spec.env_set
        .push((AGENT_TAG_VAR.to_string(), agent_tag(run_id, iteration)));
    // Colour codes only get in the way of parsing and of the transcript, whatever the backend.
    spec.set_env_default("NO_COLOR", "1");
    // The prompt is kept next to the transcript, so that the logged command line can be pasted
    // into a shell to replay the iteration by hand.
    let prompt_file = paths
        .ralph_dir
        .join(Transcript::relative_path(run_id, iteration))
        .with_extension("prompt.md");
    if let Some(dir) = prompt_file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    write_atomic(&prompt_file, prompt.as_bytes())?;
    let command_line = spec.shell_line(spec.stdin.is_some().then_some(prompt_file.as_path()));
    let mut parser = backend.parser(&prompt);
    // On disk too: a ralph killed mid-iteration restores prd.json from it on restart.
    write_atomic(&paths.prd_snapshot(), &snapshot.raw)?;
    let branch_before = repo.current_branch();

    state.run_id = Some(run_id.to_string());
    state.iteration = iteration;
    state.in_flight = Some(InFlight {
        run_id: run_id.to_string(),
        iteration,
        story_id: story.id.clone(),
        pid: 0,
        started_at,
        start_sha: head_before.clone(),
    });
    state.save(&paths.ralph_dir)?;

    let meta = TranscriptMeta {
        run_id: run_id.to_string(),
        iteration,
        story_id: story.id.clone(),
        backend: backend.kind().as_str().to_string(),
        command: command_line.clone(),
        head: head_before.clone(),
        ralph_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: started_at.to_rfc3339(),
        prompt_bytes: prompt.len(),
    };
    let mut transcript = Transcript::create(&paths.ralph_dir, &meta).with_context(|| {
        format!(
            "cannot write a transcript under {}",
            paths.ralph_dir.display()
        )
    })?;
    ui.iteration_started(
        iteration,
        slot,
        cfg.max_iter,
        &story.id,
        &story.title,
        backend.kind().as_str(),
    );
    ui.agent_command(&command_line);

    let ralph_dir = paths.ralph_dir.clone();
    let run_result = {
        let state_ref = &mut *state;
        let transcript_ref = &mut transcript;
        let parser_ref = &mut parser;
        let ui_ref = &*ui;
        process::run(
            spec,
            limits,
            stop,
            |pid| {
                // Persist the group id at once: a ralph killed now must find it on restart.
                if let Some(f) = state_ref.in_flight.as_mut() {
                    f.pid = pid;
                }
                let _ = state_ref.save(&ralph_dir);
            },
            |line| {
                transcript_ref.line(&line);
                let mut verdict = LineVerdict::Continue;
                for event in parser_ref.on_line(&line) {
                    if matches!(event, crate::protocol::AgentEvent::Final { .. }) {
                        verdict = LineVerdict::Final;
                    }
                    ui_ref.agent_event(&event);
                    transcript_ref.event(&event);
                }
                verdict
            },
        )
        .await
    };
    let outcome_of_process = match run_result {
        Ok(o) => o,
        Err(e) => {
            // The agent could not even start: nothing ran, so nothing to record as an iteration.
            state.in_flight = None;
            state.iteration = iteration - 1;
            state.save(&paths.ralph_dir)?;
            return Err(e.into());
        }
    };
    // Anything the agent left running in a session of its own (setsid, a daemonized dev server)
    // is no longer linked to it once the agent exited; its tag still names it.
    let stray = kill_tagged(&agent_tag(run_id, iteration));
    if stray > 0 {
        ui.warn(&format!(
            "iteration {iteration}: killed {stray} process{} the agent left running",
            if stray == 1 { "" } else { "es" }
        ));
    }
    let mut report = parser.finish(outcome_of_process.exit_code);
    cfg.patterns.apply(&mut report);
    transcript.note(
        "end",
        serde_json::json!({"end": outcome_of_process.end, "exit_code": outcome_of_process.exit_code,
            "signal": outcome_of_process.signal, "report": &report}),
    );
    let transcript_path = match transcript.finish() {
        Ok(p) => p,
        Err(e) => {
            ui.warn(&format!(
                "transcript of iteration {iteration} is incomplete: {e}"
            ));
            paths
                .ralph_dir
                .join(Transcript::relative_path(run_id, iteration))
        }
    };

    // What changed on disk.
    let mut feedback_next = Vec::new();
    let mut corrupted: Option<String> = None;
    let after = match std::fs::read(&paths.prd) {
        Ok(bytes) => match store::parse_bytes(&paths.prd, &bytes) {
            Ok(l) => Some(l),
            Err(e) => {
                corrupted = Some(e.to_string());
                None
            }
        },
        Err(e) => {
            corrupted = Some(format!("prd.json could not be read: {e}"));
            None
        }
    };
    if corrupted.is_some() {
        restore_prd(&paths.prd, &snapshot.raw)?;
    }
    let flipped = flipped_ids(
        &snapshot.prd,
        after.as_ref().map(|l| &l.prd).unwrap_or(&snapshot.prd),
        true,
    );
    // The verify gate: a story the agent marked passing must pass its check, or its `passes`
    // goes back to false (the rest of prd.json is left byte for byte as the agent wrote it).
    let mut verify_failures: Vec<VerifyFailure> = Vec::new();
    if let Some(current) = &after {
        for id in &flipped {
            let command = current
                .prd
                .story(id)
                .and_then(|s| s.verify.clone())
                .or_else(|| cfg.verify.clone());
            let Some(command) = command else { continue };
            if stop.stop.is_cancelled() {
                break;
            }
            ui.info(&format!("  verify {id}: {command}"));
            if let Some(failure) = run_verify(&command, id, paths, cfg, stop).await? {
                verify_failures.push(failure);
            }
        }
    }
    let mut after = if verify_failures.is_empty() {
        after
    } else {
        let mut raw = std::fs::read(&paths.prd)?;
        for f in &verify_failures {
            raw = store::set_passes(&raw, &f.story_id, false)?;
        }
        write_atomic(&paths.prd, &raw)?;
        Some(store::parse_bytes(&paths.prd, &raw)?)
    };
    // With verify_marks_passing, the current story's check decides even when the agent forgot
    // to mark it: a passing check marks it passing (only its `passes` bytes change).
    let mut marked_by_ralph = false;
    if cfg.verify_marks_passing && !stop.stop.is_cancelled() {
        let command = after
            .as_ref()
            .and_then(|l| l.prd.story(&story.id))
            .filter(|s| !s.passes && !verify_failures.iter().any(|f| f.story_id == s.id))
            .and_then(|s| s.verify.clone().or_else(|| cfg.verify.clone()));
        if let Some(command) = command {
            ui.info(&format!("  verify {}: {command}", story.id));
            if run_verify(&command, &story.id, paths, cfg, stop)
                .await?
                .is_none()
            {
                let raw = store::set_passes(&std::fs::read(&paths.prd)?, &story.id, true)?;
                write_atomic(&paths.prd, &raw)?;
                after = Some(store::parse_bytes(&paths.prd, &raw)?);
                marked_by_ralph = true;
            }
        }
    }
    // The prd.json guard: what the agent changed beyond its story's `passes` and `notes` is
    // always reported (below); with prd_guard = restore it is also put back.
    let agent_prd: Option<crate::prd::model::Prd> = after.as_ref().map(|l| l.prd.clone());
    let edits: Vec<String> = after
        .as_ref()
        .map(|l| prd_edits(&snapshot.value, &l.value))
        .unwrap_or_default();
    let mut guard_restored = false;
    if cfg.prd_guard == crate::protocol::PrdGuard::Restore {
        if let Some(current) = &after {
            let beyond_story = !edits.is_empty()
                || story_ids(&snapshot.prd) != story_ids(&current.prd)
                || snapshot.prd.user_stories.iter().any(|before| {
                    before.id != story.id
                        && current.prd.story(&before.id).map(|s| s.passes) != Some(before.passes)
                });
            if beyond_story {
                let mut raw = snapshot.raw.clone();
                if let Some(s) = current.prd.story(&story.id) {
                    raw = store::set_passes(&raw, &story.id, s.passes)?;
                    let old_notes = snapshot.prd.story(&story.id).map(|o| o.notes.as_str());
                    if old_notes != Some(s.notes.as_str()) {
                        raw = store::set_notes(&raw, &story.id, &s.notes)?;
                    }
                }
                write_atomic(&paths.prd, &raw)?;
                after = Some(store::parse_bytes(&paths.prd, &raw)?);
                guard_restored = true;
            }
        }
    }
    let after_prd = after.as_ref().map(|l| &l.prd).unwrap_or(&snapshot.prd);
    // What the agent did, for the report (before a restore put it back).
    let reported_prd = agent_prd.as_ref().unwrap_or(after_prd);
    let reverted = flipped_ids(&snapshot.prd, reported_prd, false);
    let mut flipped = flipped;
    if marked_by_ralph {
        flipped.push(story.id.clone());
    }
    let verified_flips: Vec<String> = flipped
        .iter()
        .filter(|id| !verify_failures.iter().any(|f| &f.story_id == *id))
        .cloned()
        .collect();
    let head_mid = repo.head_sha()?;
    let agent_commits = match &head_mid {
        Some(h) => repo.commits_between(head_before.as_deref(), h)?,
        None => Vec::new(),
    };
    let files_changed =
        dirty_at_start.changed_since(repo, head_before.as_deref(), &paths.repo_root)?;
    let promise_seen = report
        .final_text
        .as_deref()
        .is_some_and(promise_in_final_text);
    let open_after: Vec<String> = after_prd
        .user_stories
        .iter()
        .filter(|s| !s.passes)
        .map(|s| s.id.clone())
        .collect();

    let outcome = classify(Classify {
        end: outcome_of_process.end,
        exit_code: outcome_of_process.exit_code,
        report: &report,
        corrupted: corrupted.is_some(),
        verify_failed: !verify_failures.is_empty(),
        promise_seen,
        all_pass: open_after.is_empty(),
        story_passed: verified_flips.iter().any(|id| id == &story.id),
        changed: !agent_commits.is_empty() || !files_changed.is_empty(),
        backend_has_final_event: backend.kind() != crate::protocol::AgentKind::Exec,
    });
    let mut message = outcome_message(
        outcome,
        &report,
        corrupted.as_deref(),
        &open_after,
        cfg,
        limits,
        outcome_of_process.exit_code,
    );
    if let Some(m) = feedback_for(outcome, &story.id, &open_after, message.as_deref()) {
        feedback_next.push(m);
    }
    if marked_by_ralph {
        let what = format!(
            "{} passes its verify command, so ralph marked it passing (verify_marks_passing)",
            story.id
        );
        message = Some(match message {
            Some(m) => format!("{m}; {what}"),
            None => what,
        });
    }
    for f in &verify_failures {
        let what = format!(
            "verify failed for {}: `{}` {}; passes set back to false",
            f.story_id, f.command, f.result
        );
        ui.warn(&format!("iteration {iteration}: {what}"));
        feedback_next.push(format!(
            "ralph ran the check for {} (`{}`) after you marked it passing, and it failed ({}), so its passes was set back to false. The end of its output:\n{}",
            f.story_id, f.command, f.result, f.tail
        ));
        message = Some(match message {
            Some(m) => format!("{m}; {what}"),
            None => what,
        });
    }
    // What the agent did to the PRD and to history beyond its own story: reported in the
    // terminal, the ledger and the next prompt.
    let mut integrity: Vec<String> = Vec::new();
    let mut caveats: Vec<String> = Vec::new();
    let other_flips: Vec<String> = flipped
        .iter()
        .filter(|id| *id != &story.id)
        .cloned()
        .collect();
    if !other_flips.is_empty() {
        integrity.push(format!(
            "passes set to true on {} during {}'s iteration",
            other_flips.join(", "),
            story.id
        ));
        caveats.push(format!(
            "{} w{} marked passing during iteration {iteration} ({}), not in {} own iteration: check them",
            other_flips.join(", "),
            if other_flips.len() == 1 { "as" } else { "ere" },
            story.id,
            if other_flips.len() == 1 { "its" } else { "their" },
        ));
    }
    if !reverted.is_empty() {
        integrity.push(format!(
            "passes set back to false on {}",
            reverted.join(", ")
        ));
    }
    let before_ids = story_ids(&snapshot.prd);
    let after_ids = story_ids(reported_prd);
    let removed: Vec<String> = before_ids.difference(&after_ids).cloned().collect();
    let added: Vec<String> = after_ids.difference(&before_ids).cloned().collect();
    if !removed.is_empty() {
        integrity.push(format!(
            "stories deleted from prd.json: {}",
            removed.join(", ")
        ));
    }
    if !added.is_empty() {
        integrity.push(format!("stories added to prd.json: {}", added.join(", ")));
    }
    integrity.extend(edits.iter().cloned());
    if guard_restored {
        integrity.push(
            "prd.json put back as it was except the current story's passes/notes (prd_guard = restore)"
                .to_string(),
        );
    }
    if let (Some(before), Some(now)) = (&head_before, &head_mid) {
        if !repo.is_ancestor(before, now)? {
            integrity.push(format!(
                "history was rewritten: HEAD no longer contains the iteration's start {} (kept in refs/ralph/{run_id}/{iteration}/start)",
                short_sha(before)
            ));
        }
    }
    let branch_after = repo.current_branch();
    if branch_after != branch_before {
        integrity.push(format!(
            "HEAD moved from {} to {}",
            branch_before.as_deref().unwrap_or("a detached HEAD"),
            branch_after.as_deref().unwrap_or("a detached HEAD")
        ));
    }
    for note in &integrity {
        ui.warn(&format!("iteration {iteration}: {note}"));
    }
    if !integrity.is_empty() {
        feedback_next.push(format!(
            "ralph noticed changes outside your story in the previous iteration: {}. Work only on the current story, change only its `passes` and `notes` in prd.json, and never rewrite git history or switch branches.",
            integrity.join("; ")
        ));
    }
    let message = match (message, integrity.is_empty()) {
        (m, true) => m,
        (None, false) => Some(integrity.join("; ")),
        (Some(m), false) => Some(format!("{m}; {}", integrity.join("; "))),
    };

    // Checkpoint: the progress entry first, so that the ralph commit carries it.
    let agent_last = agent_commits.last().cloned();
    progress::append_entry(
        &paths.progress,
        &progress::Entry {
            at: Local::now(),
            iteration,
            story_id: story.id.clone(),
            story_title: story.title.clone(),
            outcome,
            commit: agent_last.clone(),
            summary: entry_summary(
                &agent_commits,
                &files_changed,
                &flipped,
                promise_seen,
                message.as_deref(),
            ),
        },
    )?;
    let trailers = [
        ("Ralph-Run", run_id.to_string()),
        ("Ralph-Iteration", iteration.to_string()),
        ("Ralph-Story", story.id.clone()),
        ("Ralph-Outcome", outcome.as_str().to_string()),
    ];
    let checkpoint = repo.commit_all(
        &format!("ralph: iteration {iteration} ({})", story.id),
        &format!("Outcome: {}.", outcome.as_str()),
        &trailers,
    )?;
    let head_after = repo.head_sha()?;
    if let Some(head) = &head_after {
        // Whatever happens to branches later, this iteration's result stays reachable.
        repo.set_ref(&format!("refs/ralph/{run_id}/{iteration}/end"), head)?;
    }

    let ended_at = Utc::now();
    // A CLI that reports only tokens (codex, gemini) is priced from ralph.toml's table.
    let model = report.model.clone().or(cfg.model.clone());
    let (cost_usd, cost_source) = match report.cost_usd {
        Some(c) => (Some(c), Some(CostSource::Agent)),
        None => match model.as_deref().and_then(|m| cfg.native.prices.get(m)) {
            Some(price) if report.usage != crate::protocol::Usage::default() => (
                Some(price.cost(&crate::protocol::Usage {
                    input_tokens: report.usage.input_tokens,
                    output_tokens: report.usage.output_tokens,
                    cache_read_tokens: report.usage.cache_read_tokens,
                    cache_creation_tokens: report.usage.cache_creation_tokens,
                })),
                Some(CostSource::PriceTable),
            ),
            _ => {
                warn_unpriced(cfg, model.as_deref(), &report.usage, ui);
                (None, None)
            }
        },
    };
    let record = LedgerRecord {
        verify: Vec::new(),
        findings: Vec::new(),
        feature: None,
        run_id: run_id.to_string(),
        iteration,
        story_id: story.id.clone(),
        story_title: story.title.clone(),
        backend: backend.kind().as_str().to_string(),
        model,
        agent_version: report
            .agent_version
            .clone()
            .or(agent_version.map(str::to_owned)),
        started_at,
        ended_at,
        duration_s: started.elapsed().as_secs_f64(),
        outcome,
        exit_code: outcome_of_process.exit_code,
        signal: outcome_of_process.signal,
        tokens_in: reported(report.usage.input_tokens),
        tokens_out: reported(report.usage.output_tokens),
        cache_read_tokens: reported(report.usage.cache_read_tokens),
        cache_creation_tokens: reported(report.usage.cache_creation_tokens),
        cost_usd,
        cost_source,
        head_before,
        head_after,
        commits: agent_commits,
        checkpoint_commit: checkpoint,
        files_changed,
        promise_seen,
        passes_flipped: flipped,
        passes_reverted: reverted,
        session_id: report.session_id.clone(),
        transcript: Some(display_rel(&transcript_path, &paths.repo_root)),
        message,
    };
    ledger::append(&paths.ledger, &record)?;

    // An attempt at the story: not a usage limit or transient failure (retried), and not an
    // interruption (the user's Ctrl-C or a crash is not the story's fault).
    if outcome.counts_as_iteration() && outcome != Outcome::Interrupted {
        *state.attempts.entry(story.id.clone()).or_insert(0) += 1;
    }
    state.last_outcome = Some(outcome.as_str().to_string());
    state.in_flight = None;
    state.save(&paths.ralph_dir)?;
    ui.iteration_finished(&record, slot, cfg.max_iter);
    Ok(IterationDone {
        record,
        feedback: feedback_next,
        caveats,
        resume_at: report.resume_at,
    })
}

/// Files that differ from a commit, with a fingerprint of their content, so that an iteration's
/// own changes can be told apart from changes that were already there when it started.
struct DirtySnapshot {
    files: std::collections::HashMap<String, Option<u64>>,
}

impl DirtySnapshot {
    fn changed(repo: &Repo, head: Option<&str>) -> anyhow::Result<Vec<String>> {
        Ok(match head {
            Some(h) => repo.changed_files(h)?,
            None => repo.dirty_paths()?,
        })
    }

    fn fingerprint(root: &Path, rel: &str) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let bytes = std::fs::read(root.join(rel)).ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        Some(h.finish())
    }

    fn take(repo: &Repo, head: Option<&str>, root: &Path) -> anyhow::Result<DirtySnapshot> {
        let files = Self::changed(repo, head)?
            .into_iter()
            .map(|p| {
                let fp = Self::fingerprint(root, &p);
                (p, fp)
            })
            .collect();
        Ok(DirtySnapshot { files })
    }

    /// Paths changed since `head` whose content differs from the snapshot.
    fn changed_since(
        &self,
        repo: &Repo,
        head: Option<&str>,
        root: &Path,
    ) -> anyhow::Result<Vec<String>> {
        Ok(Self::changed(repo, head)?
            .into_iter()
            .filter(|p| match self.files.get(p) {
                Some(before) => *before != Self::fingerprint(root, p),
                None => true,
            })
            .collect())
    }
}

/// Inputs of [`classify`].
struct Classify<'a> {
    end: EndReason,
    exit_code: Option<i32>,
    report: &'a AgentReport,
    corrupted: bool,
    verify_failed: bool,
    promise_seen: bool,
    all_pass: bool,
    story_passed: bool,
    changed: bool,
    backend_has_final_event: bool,
}

/// Decides an iteration's outcome. Order matters: how the process ended first (ralph's own
/// kills), then what the agent reported about itself, then what the files say.
fn classify(c: Classify<'_>) -> Outcome {
    match c.end {
        EndReason::Cancelled => return Outcome::Interrupted,
        EndReason::TimedOut => return Outcome::Timeout,
        EndReason::Idle => return Outcome::Stalled,
        EndReason::Exited | EndReason::KilledAfterFinal => {}
    }
    match c.report.failure {
        Some(FailureClass::Auth) => return Outcome::AuthError,
        Some(FailureClass::Config) => return Outcome::ConfigError,
        Some(FailureClass::UsageLimit) => return Outcome::UsageLimit,
        Some(FailureClass::Transient) => return Outcome::Transient,
        Some(FailureClass::Context) | None => {}
    }
    if c.corrupted {
        return Outcome::PrdCorrupted;
    }
    if c.verify_failed {
        return Outcome::VerifyFailed;
    }
    if c.promise_seen && !c.all_pass {
        return Outcome::PrematureClaim;
    }
    if c.story_passed {
        return Outcome::StoryPassed;
    }
    let failed_exit = c.end == EndReason::Exited && c.exit_code != Some(0);
    let no_final = c.backend_has_final_event && !c.report.saw_final;
    if c.report.is_error || failed_exit || (no_final && c.end == EndReason::Exited && !c.changed) {
        return Outcome::AgentError;
    }
    if c.changed {
        Outcome::Progress
    } else {
        Outcome::NoProgress
    }
}

fn outcome_message(
    outcome: Outcome,
    report: &AgentReport,
    corrupted: Option<&str>,
    open_after: &[String],
    cfg: &RunConfig,
    limits: &Limits,
    exit_code: Option<i32>,
) -> Option<String> {
    let agent_said = || {
        report
            .error_message
            .as_deref()
            .map(|m| truncate_chars(m.lines().last().unwrap_or(m), 300))
    };
    match outcome {
        Outcome::PrematureClaim => Some(format!(
            "completion promise printed while {} still ha{} passes=false",
            open_after.join(", "),
            if open_after.len() == 1 { "s" } else { "ve" }
        )),
        Outcome::PrdCorrupted => corrupted.map(|e| {
            format!(
                "prd.json was invalid after the iteration and was restored: {}",
                // The error's first line names the problem; its hint is for humans editing by hand.
                truncate_chars(e.lines().next().unwrap_or(e), 300)
            )
        }),
        // The last iteration of a run with --max-duration gets only what is left of it.
        Outcome::Timeout if limits.timeout < cfg.timeout => Some(format!(
            "killed when the run reached --max-duration {} ({} into the iteration)",
            humantime::format_duration(cfg.max_duration.unwrap_or_default()),
            humantime::format_duration(Duration::from_secs(limits.timeout.as_secs()))
        )),
        Outcome::Timeout => Some(format!(
            "killed after the iteration time limit of {}",
            humantime::format_duration(cfg.timeout)
        )),
        Outcome::Stalled => Some(format!(
            "killed after {} without output (idle limit)",
            humantime::format_duration(cfg.idle_timeout)
        )),
        Outcome::Interrupted => {
            Some("interrupted by the user; changes kept in a checkpoint commit".into())
        }
        Outcome::AgentError => agent_said().or_else(|| {
            Some(match (exit_code, report.saw_final) {
                (Some(0), false) => "the agent exited 0 without its final result event; its output is in the transcript".to_string(),
                (Some(code), _) => format!("the agent exited with code {code} and gave no error message; its output is in the transcript"),
                (None, _) => "the agent was killed by a signal; its output is in the transcript".to_string(),
            })
        }),
        Outcome::AuthError
        | Outcome::ConfigError
        | Outcome::UsageLimit
        | Outcome::Transient => agent_said(),
        _ => None,
    }
}

fn feedback_for(
    outcome: Outcome,
    story: &str,
    open: &[String],
    message: Option<&str>,
) -> Option<String> {
    let msg = message.unwrap_or("");
    match outcome {
        Outcome::PrematureClaim => Some(format!(
            "Your completion claim was premature: {} still ha{} passes=false in prd.json. Print the promise only when every story passes.",
            open.join(", "),
            if open.len() == 1 { "s" } else { "ve" }
        )),
        Outcome::PrdCorrupted => Some(format!(
            "prd.json was not valid after the previous iteration, so ralph restored the earlier version ({msg}). Edit only the `passes` and `notes` fields, and keep it valid JSON."
        )),
        Outcome::Timeout => Some(format!("The previous iteration was {msg}. Work in smaller steps and commit as you go.")),
        Outcome::Stalled => Some(format!("The previous iteration was {msg}. Avoid commands that wait for input or run forever.")),
        Outcome::AgentError => Some(format!("The previous iteration ended with an agent error: {msg}")),
        Outcome::NoProgress => Some(format!(
            "The previous iteration changed nothing (no commit, no file change). Make concrete progress on {story}."
        )),
        Outcome::Progress => Some(format!(
            "The previous iteration made changes but {story} does not pass yet: finish it, run the checks, and mark it as passing (set its passes to true in prd.json, or call mark_story if you have that tool)."
        )),
        _ => None,
    }
}

fn entry_summary(
    commits: &[String],
    files: &[String],
    flipped: &[String],
    promise: bool,
    message: Option<&str>,
) -> String {
    let mut parts = Vec::new();
    parts.push(format!(
        "{} agent commit{}, {} file{} changed",
        commits.len(),
        if commits.len() == 1 { "" } else { "s" },
        files.len(),
        if files.len() == 1 { "" } else { "s" }
    ));
    if !flipped.is_empty() {
        parts.push(format!("passes set: {}", flipped.join(", ")));
    }
    if promise {
        parts.push("completion promise printed".into());
    }
    if let Some(m) = message {
        parts.push(m.to_string());
    }
    parts.join("; ")
}

/// Story ids whose `passes` went from `!to` to `to` between `before` and `after`.
fn flipped_ids(before: &Prd, after: &Prd, to: bool) -> Vec<String> {
    after
        .user_stories
        .iter()
        .filter(|s| s.passes == to)
        .filter(|s| before.story(&s.id).is_some_and(|b| b.passes != to))
        .map(|s| s.id.clone())
        .collect()
}

/// Writes the snapshot back atomically.
fn restore_prd(path: &Path, raw: &[u8]) -> anyhow::Result<()> {
    write_atomic(path, raw).with_context(|| format!("cannot restore {}", path.display()))
}

/// A verify command that did not pass.
struct VerifyFailure {
    story_id: String,
    command: String,
    /// "exited with code 1", "timed out after 10m", ...
    result: String,
    /// The last lines of its combined output.
    tail: String,
}

/// Lines of a failed verify command's output kept for the message and the next prompt.
const VERIFY_TAIL_LINES: usize = 30;

/// Runs `command` with `bash -c` in the repository for `story_id`, in its own process group
/// with the verify time limit. `None` when it exits 0.
async fn run_verify(
    command: &str,
    story_id: &str,
    paths: &RunPaths,
    cfg: &RunConfig,
    stop: &StopSignals,
) -> anyhow::Result<Option<VerifyFailure>> {
    let spec = process::SpawnSpec {
        program: "bash".into(),
        args: vec!["-c".into(), command.to_string()],
        cwd: paths.repo_root.clone(),
        env_remove: Vec::new(),
        env_set: vec![
            ("RALPH_STORY_ID".into(), story_id.to_string()),
            ("NO_COLOR".into(), "1".into()),
        ],
        stdin: None,
    };
    let limits = Limits {
        timeout: cfg.verify_timeout,
        idle_timeout: cfg.verify_timeout,
        kill_grace: cfg.kill_grace,
        exit_drain: EXIT_DRAIN,
        final_grace: FINAL_GRACE,
        max_line_bytes: 64 * 1024,
    };
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let outcome = process::run(
        spec,
        &limits,
        stop,
        |_| {},
        |line| {
            if tail.len() == VERIFY_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(process::strip_ansi(&line.text));
            LineVerdict::Continue
        },
    )
    .await
    .with_context(|| format!("cannot run the verify command `{command}`"))?;
    let result = match (outcome.end, outcome.exit_code) {
        (EndReason::Exited, Some(0)) => return Ok(None),
        (EndReason::Exited, Some(code)) => format!("exited with code {code}"),
        (EndReason::TimedOut | EndReason::Idle, _) => format!(
            "timed out after {}",
            humantime::format_duration(cfg.verify_timeout)
        ),
        (EndReason::Cancelled, _) => "was interrupted".to_string(),
        _ => format!("was killed (signal {:?})", outcome.signal),
    };
    Ok(Some(VerifyFailure {
        story_id: story_id.to_string(),
        command: command.to_string(),
        result,
        tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
    }))
}

/// Sleeps until `until` plus `margin`, saying when it will resume. False when a stop signal
/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// The time passed.
    Elapsed,
    /// Ctrl-C (or SIGTERM/SIGHUP).
    Interrupted,
    /// `ralph stop` asked the run to end.
    StopRequested,
}

/// Sleeps for `wait`, waking early on Ctrl-C or a `ralph stop` request (checked every second).
async fn pause(wait: Duration, stop: &StopSignals, ralph_dir: &Path) -> Pause {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if crate::stop_request::pending(ralph_dir) {
            return Pause::StopRequested;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Pause::Elapsed;
        }
        let step = (deadline - now).min(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(step) => {}
            _ = stop.stop.cancelled() => return Pause::Interrupted,
        }
    }
}

/// Waits until `until` + `margin`, saying when it will resume; Ctrl-C or `ralph stop` end the
/// wait early.
async fn wait_for_reset(
    until: chrono::DateTime<Utc>,
    margin: Duration,
    stop: &StopSignals,
    ralph_dir: &Path,
    ui: &Ui,
) -> Pause {
    let left = (until - Utc::now()).to_std().unwrap_or_default() + margin;
    ui.warn(&format!(
        "waiting for the usage limit to reset at {} (in {}); Ctrl-C or `ralph stop` stops, `ralph run` later resumes the wait",
        reset_time_text(until),
        humantime::format_duration(Duration::from_secs(left.as_secs().max(1)))
    ));
    pause(left, stop, ralph_dir).await
}

/// `14:00` for a time today, `Tue 1 Dec 14:00` otherwise (local time).
fn reset_time_text(until: chrono::DateTime<Utc>) -> String {
    let local = until.with_timezone(&Local);
    let now = Local::now();
    if local.date_naive() == now.date_naive() {
        local.format("%H:%M").to_string()
    } else if local.year() == now.year() && local > now {
        local.format("%a %-d %b %H:%M").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M").to_string()
    }
}

/// Changes between two prd.json documents other than stories added or removed and other than
/// `passes` and `notes` (reported elsewhere, or allowed): top-level fields, and fields of each
/// story present in both. One line per changed story or for the top level, e.g.
/// `US-002 edited (title, acceptanceCriteria)`. The current story's edits count too: an agent
/// must not rewrite its own acceptance criteria.
fn prd_edits(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    let empty = serde_json::Map::new();
    let obj = |v: &Value| v.as_object().cloned().unwrap_or_else(|| empty.clone());
    let (b, a) = (obj(before), obj(after));
    let mut out = Vec::new();
    let mut top: Vec<&str> = b
        .keys()
        .chain(a.keys())
        .map(String::as_str)
        .filter(|k| *k != "userStories" && b.get(*k) != a.get(*k))
        .collect();
    top.sort_unstable();
    top.dedup();
    if !top.is_empty() {
        out.push(format!("prd.json fields changed: {}", top.join(", ")));
    }
    let stories = |o: &serde_json::Map<String, Value>| -> Vec<serde_json::Map<String, Value>> {
        o.get("userStories")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_object().cloned()).collect())
            .unwrap_or_default()
    };
    let after_stories = stories(&a);
    for old in stories(&b) {
        let Some(id) = old.get("id").and_then(Value::as_str) else {
            continue;
        };
        let Some(new) = after_stories
            .iter()
            .find(|s| s.get("id").and_then(Value::as_str) == Some(id))
        else {
            continue;
        };
        let mut fields: Vec<&str> = old
            .keys()
            .chain(new.keys())
            .map(String::as_str)
            .filter(|k| !matches!(*k, "passes" | "notes") && old.get(*k) != new.get(*k))
            .collect();
        fields.sort_unstable();
        fields.dedup();
        if !fields.is_empty() {
            out.push(format!("{id} edited ({})", fields.join(", ")));
        }
    }
    out
}

/// Says once per run why an iteration that used tokens has no cost, when a price table exists
/// but cannot apply (the CLI names no model, or the model has no entry).
fn warn_unpriced(cfg: &RunConfig, model: Option<&str>, usage: &crate::protocol::Usage, ui: &Ui) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if cfg.native.prices.is_empty() || *usage == crate::protocol::Usage::default() {
        return;
    }
    if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let known: Vec<&str> = cfg.native.prices.keys().map(String::as_str).collect();
    ui.warn(&match model {
        None => format!(
            "cost unknown: {} reports tokens but names no model, so [prices] ({}) cannot apply; pass --model NAME (model in ralph.toml)",
            cfg.agent.as_str(),
            known.join(", ")
        ),
        Some(m) => format!(
            "cost unknown: no [prices.\"{m}\"] entry in ralph.toml (it has: {})",
            known.join(", ")
        ),
    });
}

/// Whether `story_id` passes in prd.json now (`false` when prd.json cannot be read).
fn current_story_passes(paths: &RunPaths, story_id: &str) -> bool {
    store::load(&paths.prd)
        .ok()
        .and_then(|l| l.prd.story(story_id).map(|s| s.passes))
        .unwrap_or(false)
}

/// The budget rules applied after each iteration (the last of `records`), in this order:
/// the story's attempt limit (block it and move on), then consecutive failures, iterations
/// without any change, and this run's cost. Returns the reason to stop, if any; the iteration's
/// work is already committed and recorded by then.
#[allow(clippy::too_many_arguments)]
fn budget_stop(
    cfg: &RunConfig,
    story_passes: bool,
    story_id: &str,
    records: &[LedgerRecord],
    state: &mut State,
    failures_in_a_row: &mut u32,
    unchanged_in_a_row: &mut u32,
    ui: &Ui,
) -> Option<String> {
    let last = records.last()?;
    let outcome = last.outcome;
    // Not the agent's doing: they neither count nor reset the streaks.
    let neutral = matches!(
        outcome,
        Outcome::UsageLimit | Outcome::Transient | Outcome::Interrupted
    );
    if neutral {
        return None;
    }
    let tried = state.attempts.get(story_id).copied().unwrap_or(0);
    if !story_passes && tried >= cfg.max_attempts && !state.blocked.iter().any(|b| b == story_id) {
        state.blocked.push(story_id.to_string());
        ui.warn(&format!(
            "{story_id} is blocked after {tried} attempts (last: {outcome}); moving on to the next story"
        ));
        // Blocking is the answer to those failures; the streaks start again with the next story.
        *failures_in_a_row = 0;
        *unchanged_in_a_row = 0;
        return None;
    }
    let failed = matches!(
        outcome,
        Outcome::AgentError
            | Outcome::Timeout
            | Outcome::Stalled
            | Outcome::PrdCorrupted
            | Outcome::VerifyFailed
    );
    *failures_in_a_row = if failed { *failures_in_a_row + 1 } else { 0 };
    if *failures_in_a_row >= cfg.max_failures {
        return Some(format!(
            "stopped: {} failed iterations in a row (--max-failures {}); the last was {outcome}{}",
            failures_in_a_row,
            cfg.max_failures,
            last.message
                .as_deref()
                .map(|m| format!(": {}", truncate_chars(m, 200)))
                .unwrap_or_default()
        ));
    }
    let unchanged = last.commits.is_empty()
        && last.files_changed.is_empty()
        && last.passes_flipped.is_empty()
        && last.passes_reverted.is_empty();
    *unchanged_in_a_row = if unchanged {
        *unchanged_in_a_row + 1
    } else {
        0
    };
    if *unchanged_in_a_row >= cfg.max_no_progress {
        return Some(format!(
            "stopped: {} iterations in a row changed nothing (no commit, no file, no prd.json change; --max-no-progress {})",
            unchanged_in_a_row, cfg.max_no_progress
        ));
    }
    if let Some(max) = cfg.max_cost {
        let spent: f64 = records.iter().filter_map(|r| r.cost_usd).sum();
        if spent >= max {
            return Some(format!(
                "stopped: this run's cost ${spent:.2} reached --max-cost ${max:.2} (iteration {}'s work is committed and recorded)",
                last.iteration
            ));
        }
    }
    None
}

/// What is left of the run's `--max-duration` after `started` (`None`: no limit; zero when
/// used up).
fn time_left(max: Option<Duration>, started: Instant) -> Option<Duration> {
    max.map(|m| m.saturating_sub(started.elapsed()))
}

/// Whether waiting until `until` (+ `margin`) would end after the run's `--max-duration`.
fn wait_passes_limit(
    until: chrono::DateTime<Utc>,
    margin: Duration,
    max: Option<Duration>,
    started: Instant,
) -> bool {
    let wait = (until - Utc::now()).to_std().unwrap_or_default() + margin;
    time_left(max, started).is_some_and(|left| wait >= left)
}

/// When to try again after a usage limit: the reset time the agent gave, else `fallback` from
/// now. A limit that comes back right after a wait (`repeat` ≥ 2 in a row) waits at least 5
/// minutes, doubling with each repeat up to `fallback`, so a reset time that has passed while the
/// agent still says "limited" (clock skew, a stale message) cannot spin the loop.
fn usage_limit_until(
    resume_at: Option<chrono::DateTime<Utc>>,
    now: chrono::DateTime<Utc>,
    fallback: Duration,
    repeat: u32,
) -> chrono::DateTime<Utc> {
    let fallback = chrono::Duration::from_std(fallback).unwrap_or(chrono::Duration::hours(1));
    let until = resume_at.unwrap_or(now + fallback);
    if repeat < 2 {
        return until;
    }
    let backoff = (chrono::Duration::minutes(5) * (1i32 << (repeat - 2).min(10))).min(fallback);
    until.max(now + backoff)
}

/// The wait before retry `n` (1-based) after transient failures: `base` doubled each time, capped
/// at 10 minutes, plus up to 20 % jitter so that many runs do not retry in step.
fn transient_wait(base: Duration, n: u32) -> Duration {
    let doubled = base.saturating_mul(1u32 << n.saturating_sub(1).min(16));
    let capped = doubled.min(Duration::from_secs(600));
    capped + capped.mul_f64(fastrand::f64() * 0.2)
}

/// The value of [`AGENT_TAG_VAR`] for one iteration.
fn agent_tag(run_id: &str, iteration: u32) -> String {
    format!("{run_id}/{iteration}")
}

/// Whether any live process of group `pgid` carries `tag` in its environment, i.e. the group is
/// still the agent ralph started and not an unrelated group that reuses the id.
fn group_is_tagged(pgid: i32, tag: &str) -> bool {
    let needle = format!("{AGENT_TAG_VAR}={tag}");
    process::group_members(pgid).into_iter().any(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
            .unwrap_or(false)
    })
}

/// SIGKILLs every live process carrying `tag` in its environment (see [`AGENT_TAG_VAR`]);
/// returns how many were signalled.
fn kill_tagged(tag: &str) -> usize {
    let needle = format!("{AGENT_TAG_VAR}={tag}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let tagged = std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
            .unwrap_or(false);
        if tagged
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// The set of story ids in `prd`.
fn story_ids(prd: &Prd) -> std::collections::BTreeSet<String> {
    prd.user_stories.iter().map(|s| s.id.clone()).collect()
}

/// The highest iteration number in the ledger or in ralph's commit trailers (0 when none).
fn last_recorded_iteration(repo: &Repo, paths: &RunPaths) -> u32 {
    let from_ledger = ledger::read_all(&paths.ledger)
        .map(|l| l.records.iter().map(|r| r.iteration).max().unwrap_or(0))
        .unwrap_or(0);
    let from_git = repo
        .trailer_history(10_000)
        .map(|h| h.iter().filter_map(|t| t.iteration).max().unwrap_or(0))
        .unwrap_or(0);
    from_ledger.max(from_git)
}

/// Handles an iteration that a previous ralph left in flight (it was killed): kills the agent's
/// orphaned process group, checkpoints its changes and records it as `interrupted`.
async fn recover_interrupted(
    repo: &Repo,
    paths: &RunPaths,
    state: &mut State,
    cfg: &RunConfig,
    ui: &Ui,
) -> anyhow::Result<Vec<String>> {
    let Some(flight) = state.in_flight.clone() else {
        return Ok(Vec::new());
    };
    // Processes the agent started in groups of their own (the native loop's commands, setsid)
    // carry its tag too: kill every one of them.
    let stray = kill_tagged(&agent_tag(&flight.run_id, flight.iteration));
    if stray > 0 {
        ui.warn(&format!(
            "killed {stray} process{} left running by the interrupted iteration's agent",
            if stray == 1 { "" } else { "es" }
        ));
    }
    if flight.pid > 0 {
        if let Ok(pgid) = i32::try_from(flight.pid) {
            if process::group_alive(pgid) {
                if group_is_tagged(pgid, &agent_tag(&flight.run_id, flight.iteration)) {
                    process::kill_group(pgid, cfg.kill_grace).await;
                    ui.warn(&format!(
                        "killed the agent process group {pgid} left running by the previous ralph"
                    ));
                } else {
                    ui.warn(&format!(
                        "process group {pgid} recorded in state.json is no longer ralph's agent; left it alone"
                    ));
                }
            }
        }
    }
    // A prd.json the killed agent left broken is restored from the iteration's snapshot, so the
    // run can go on; the broken text stays in the transcript's history (the checkpoint below
    // commits the restored file).
    let mut restored_prd = false;
    if store::load(&paths.prd).is_err() {
        if let Ok(raw) = std::fs::read(paths.prd_snapshot()) {
            if store::parse_bytes(&paths.prd, &raw).is_ok() {
                restore_prd(&paths.prd, &raw)?;
                restored_prd = true;
                ui.warn(&format!(
                    "prd.json was invalid after the interrupted iteration {}; restored it from the iteration's snapshot",
                    flight.iteration
                ));
            }
        }
    }
    let already_recorded = ledger::read_all(&paths.ledger)
        .map(|r| {
            r.records
                .iter()
                .any(|x| x.run_id == flight.run_id && x.iteration == flight.iteration)
        })
        .unwrap_or(false);
    let mut feedback = Vec::new();
    if !already_recorded {
        let started = Instant::now();
        let head_mid = repo.head_sha()?;
        let agent_commits = match &head_mid {
            Some(h) => repo.commits_between(flight.start_sha.as_deref(), h)?,
            None => Vec::new(),
        };
        let files_changed = match &flight.start_sha {
            Some(h) => repo.changed_files(h)?,
            None => repo.dirty_paths()?,
        };
        let mut message = "ralph was stopped during this iteration; its changes were checkpointed when ralph restarted".to_string();
        if restored_prd {
            message
                .push_str("; prd.json was invalid and was restored from the iteration's snapshot");
        }
        let title = store::load(&paths.prd)
            .ok()
            .and_then(|l| l.prd.story(&flight.story_id).map(|s| s.title.clone()))
            .unwrap_or_default();
        progress::ensure_exists(&paths.progress, Local::now())?;
        progress::append_entry(
            &paths.progress,
            &progress::Entry {
                at: Local::now(),
                iteration: flight.iteration,
                story_id: flight.story_id.clone(),
                story_title: title.clone(),
                outcome: Outcome::Interrupted,
                commit: agent_commits.last().cloned(),
                summary: message.clone(),
            },
        )?;
        let checkpoint = repo.commit_all(
            &format!(
                "ralph: iteration {} ({}) checkpoint after restart",
                flight.iteration, flight.story_id
            ),
            "Outcome: interrupted (ralph was killed during this iteration).",
            &[
                ("Ralph-Run", flight.run_id.clone()),
                ("Ralph-Iteration", flight.iteration.to_string()),
                ("Ralph-Story", flight.story_id.clone()),
                ("Ralph-Outcome", Outcome::Interrupted.as_str().to_string()),
            ],
        )?;
        let record = LedgerRecord {
            verify: Vec::new(),
            findings: Vec::new(),
            feature: None,
            run_id: flight.run_id.clone(),
            iteration: flight.iteration,
            story_id: flight.story_id.clone(),
            story_title: title,
            backend: cfg.agent.as_str().to_string(),
            model: cfg.model.clone(),
            agent_version: None,
            started_at: flight.started_at,
            ended_at: Utc::now(),
            duration_s: started.elapsed().as_secs_f64(),
            outcome: Outcome::Interrupted,
            exit_code: None,
            signal: None,
            tokens_in: None,
            tokens_out: None,
            cache_read_tokens: None,
            cache_creation_tokens: None,
            cost_usd: None,
            cost_source: None,
            head_before: flight.start_sha.clone(),
            head_after: repo.head_sha()?,
            commits: agent_commits,
            checkpoint_commit: checkpoint.clone(),
            files_changed,
            promise_seen: false,
            passes_flipped: Vec::new(),
            passes_reverted: Vec::new(),
            session_id: None,
            transcript: Some(display_rel(
                &paths
                    .ralph_dir
                    .join(Transcript::relative_path(&flight.run_id, flight.iteration)),
                &paths.repo_root,
            )),
            message: Some(message),
        };
        ledger::append(&paths.ledger, &record)?;
        ui.warn(&format!(
            "iteration {} ({}) was interrupted when ralph was killed; its changes are kept in {}",
            flight.iteration,
            flight.story_id,
            checkpoint
                .as_deref()
                .map(short_sha)
                .unwrap_or("the existing commits")
        ));
        feedback.push(format!(
            "The previous iteration ({}) was interrupted; its partial changes were committed as a checkpoint. Check `git log` and `git diff HEAD~1` and continue from there.",
            flight.story_id
        ));
        state.last_outcome = Some(Outcome::Interrupted.as_str().to_string());
    }
    state.iteration = state.iteration.max(flight.iteration);
    state.in_flight = None;
    state.save(&paths.ralph_dir)?;
    Ok(feedback)
}

fn summarize(
    status: ExitStatus,
    prd: &Prd,
    records: &[LedgerRecord],
    elapsed: Duration,
    paths: &RunPaths,
    cfg: &RunConfig,
) -> Summary {
    let open: Vec<String> = prd
        .user_stories
        .iter()
        .filter(|s| !s.passes)
        .map(|s| s.id.clone())
        .collect();
    let passed = prd.user_stories.len() - open.len();
    let total = prd.user_stories.len();
    let headline = match status {
        ExitStatus::Success => format!("complete: every story passes ({total} of {total})"),
        ExitStatus::MaxIterations => format!(
            "stopped: --max-iter {} reached with {} of {total} stories open",
            cfg.max_iter,
            open.len()
        ),
        ExitStatus::Interrupted => match records.last() {
            Some(r) if r.outcome == Outcome::Interrupted => {
                "interrupted: the current iteration was stopped and checkpointed".into()
            }
            _ => "interrupted while no agent was running (nothing to checkpoint)".into(),
        },
        ExitStatus::OtherLimit => "stopped by a limit before every story passed".into(),
        ExitStatus::Failure | ExitStatus::Usage => match records.last() {
            Some(r) => format!(
                "stopped: iteration {} ended with {}",
                r.iteration,
                r.outcome.as_str()
            ),
            None => "stopped by an error".into(),
        },
    };
    let next = match status {
        ExitStatus::Success => "review the commits (git log) and merge the branch".to_string(),
        ExitStatus::Interrupted => "run `ralph run` again to resume where it stopped".to_string(),
        ExitStatus::Failure => match records.last().map(|r| r.outcome) {
            Some(Outcome::AuthError) => match cfg.agent {
                AgentKind::Native => format!(
                    "check the API key in {} (--api-key-env), then `ralph run`",
                    cfg.native.api_key_env.as_deref().unwrap_or("the key variable")
                ),
                _ => "log the agent in again (e.g. `claude /login`), then `ralph run`".into(),
            },
            Some(Outcome::ConfigError) => "fix the agent's setup shown above (see `.ralph/runs/` for the transcript), then `ralph run`".into(),
            _ => "fix the error above, then `ralph run`".into(),
        },
        _ => "check `ralph status` and the transcripts in .ralph/runs/, then `ralph run` to continue".to_string(),
    };
    let costs: Vec<f64> = records.iter().filter_map(|r| r.cost_usd).collect();
    Summary {
        headline,
        success: status == ExitStatus::Success,
        passed,
        open,
        iterations: u32::try_from(records.len()).unwrap_or(u32::MAX),
        iteration_range: records
            .first()
            .zip(records.last())
            .map(|(a, b)| (a.iteration, b.iteration)),
        elapsed,
        cost_usd: if costs.is_empty() {
            None
        } else {
            Some(costs.iter().sum())
        },
        tokens: (
            records
                .iter()
                .map(|r| {
                    r.tokens_in.unwrap_or(0)
                        + r.cache_read_tokens.unwrap_or(0)
                        + r.cache_creation_tokens.unwrap_or(0)
                })
                .sum(),
            records.iter().filter_map(|r| r.tokens_out).sum(),
        ),
        ledger: display_rel(&paths.ledger, &paths.repo_root),
        next,
        caveats: Vec::new(),
        resume_at: None,
        blocked: Vec::new(),
    }
}

/// A token count of 0 means the agent reported none: recorded as absent, not as zero.
fn reported(tokens: u64) -> Option<u64> {
    (tokens > 0).then_some(tokens)
}

fn new_run_id() -> String {
    format!(
        "{}-{:04x}",
        Utc::now().format("%Y%m%dT%H%M%S"),
        std::process::id() & 0xffff
    )
}

/// The argv of `spec`, quoted so that it can be pasted into a shell.
pub fn shell_words(spec: &process::SpawnSpec) -> String {
    let mut words = vec![spec.program.display().to_string()];
    words.extend(spec.args.iter().cloned());
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

fn short_sha(sha: &str) -> &str {
    sha.get(..8).unwrap_or(sha)
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_limit_repeating_right_after_a_wait_backs_off() {
        let now = Utc::now();
        let hour = Duration::from_secs(3600);
        let given = now + chrono::Duration::minutes(30);
        // First time: the agent's reset time, or the fallback when it gave none.
        assert_eq!(usage_limit_until(Some(given), now, hour, 1), given);
        assert_eq!(
            usage_limit_until(None, now, hour, 1),
            now + chrono::Duration::hours(1)
        );
        // Again right after waking, with a reset time already past: 5, 10, 20 min, … ≤ fallback.
        let past = now - chrono::Duration::minutes(1);
        assert_eq!(
            usage_limit_until(Some(past), now, hour, 2),
            now + chrono::Duration::minutes(5)
        );
        assert_eq!(
            usage_limit_until(Some(past), now, hour, 3),
            now + chrono::Duration::minutes(10)
        );
        assert_eq!(
            usage_limit_until(Some(past), now, hour, 9),
            now + chrono::Duration::hours(1)
        );
        // A later reset time than the backoff still wins.
        assert_eq!(usage_limit_until(Some(given), now, hour, 2), given);
    }
}
