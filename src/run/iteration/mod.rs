//! One iteration, as a one-way pipeline. Each stage takes the previous stage's value and
//! returns a new one:
//!
//! ```text
//! Assignment ─prepare─▶ Prepared ─execute─▶ Execution ─inspect─▶ Observation
//!            ─classify (pure)─▶ Verdict ─commit─▶ LedgerRecord
//! ```
//!
//! Only [`commit`] writes the iteration down (progress.txt, checkpoint, ledger, state.json).

pub mod classify;
pub mod commit;
pub mod execute;
pub mod inspect;
pub mod prepare;
pub mod verify;

use chrono::{DateTime, Utc};

use crate::agent::Backend;
use crate::config::RunConfig;
use crate::git::Repo;
use crate::output::Outputs;
use crate::process::{Limits, StopSignals};
use crate::prompt::PromptTemplate;
use crate::protocol::{LedgerRecord, RunEvent};
use crate::run::feedback::Feedback;
use crate::state::State;
use crate::workspace::RunPaths;

use self::classify::{Facts, Verdict};
use self::commit::{Draft, Sinks};
use self::execute::Execution;
use self::inspect::Observation;
use self::prepare::{Assignment, Prepared};

/// What every iteration of a run shares (read-only).
pub struct Cx<'a> {
    /// The resolved settings.
    pub cfg: &'a RunConfig,
    /// The workspace.
    pub paths: &'a RunPaths,
    /// The repository.
    pub repo: &'a Repo,
    /// The agent's (profile) name, recorded in the ledger when `fallbacks` (see
    /// [`crate::config::AgentProfile`]).
    pub agent: &'a str,
    /// Whether the run has fallback agents (the ledger then names each iteration's agent).
    pub fallbacks: bool,
    /// The backend.
    pub backend: &'a dyn Backend,
    /// The prompt template.
    pub template: &'a PromptTemplate,
    /// Ctrl-C and friends.
    pub stop: &'a StopSignals,
    /// This run's id.
    pub run_id: &'a str,
    /// The agent CLI's `--version`, when it answered.
    pub agent_version: Option<&'a str>,
    /// Whether the "cost unknown" warning was given in this run.
    pub warned_unpriced: std::sync::atomic::AtomicBool,
    /// Whether the "prompt is unreasonably large" warning was given in this run.
    pub warned_prompt_size: std::sync::atomic::AtomicBool,
    /// `--push`: the remote each checkpoint is pushed to.
    pub remote: Option<&'a crate::remote::Remote>,
    /// `--sandbox`: the sandbox of the agent and the verify commands (`None`: off).
    pub sandbox: Option<&'a crate::process::sandbox::Sandbox>,
}

/// What an iteration hands back to the loop.
#[derive(Debug)]
pub struct Done {
    /// Its ledger record, as written.
    pub record: LedgerRecord,
    /// Notes for later prompts.
    pub feedback: Vec<Feedback>,
    /// For a usage limit: when the agent said it resets.
    pub resume_at: Option<DateTime<Utc>>,
    /// Whether its story passes in prd.json now.
    pub story_passes: bool,
    /// HEAD after the checkpoint, when that left the working tree clean (see
    /// [`Assignment::clean_at`]).
    pub clean_at: Option<String>,
}

/// Runs one iteration through every stage. `limits.timeout` is this iteration's wall-clock
/// limit (cut by `--max-duration` for the last one).
///
/// # Errors
/// Failures on ralph's own files, git, or an agent that cannot start. Agent failures are
/// outcomes, not errors.
pub async fn run(
    cx: &Cx<'_>,
    state: &mut State,
    a: Assignment,
    limits: &Limits,
    out: &mut Outputs,
) -> anyhow::Result<Done> {
    let worked = work(cx, state, a, limits, out).await?;
    let at = Sinks {
        repo: cx.repo,
        paths: cx.paths,
        remote: cx.remote,
        only: None,
    };
    write_down(at, cx.run_id, cx.cfg.max_iter, state, worked, out)
}

/// An iteration worked and judged, not yet written down: what [`work`] hands to
/// [`write_down`] (in a `--parallel` run, across threads: the worker works, the dispatcher
/// lands the work and writes it down).
#[derive(Debug)]
pub struct Worked {
    /// The assignment's story id.
    pub story_id: String,
    /// Its place in the run's budget (1-based).
    pub slot: u32,
    /// The record and commit texts.
    pub draft: Draft,
    /// Notes for later prompts.
    pub feedback: Vec<Feedback>,
    /// For a usage limit: when the agent said it resets.
    pub resume_at: Option<DateTime<Utc>>,
    /// Whether the story passes in the tree's prd.json after the verify gate.
    pub story_passes: bool,
    /// The story's `notes` in the tree's prd.json after the iteration (`--parallel`: ralph
    /// copies them onto the run branch's prd.json at landing).
    pub story_notes: Option<String>,
    /// The story's check (its `verify`, else `--verify`), when it has one.
    pub check: Option<String>,
}

/// Stages 1–4 (prepare, execute, inspect, classify) and the record's draft: everything but the
/// writing down.
///
/// # Errors
/// As [`run`].
pub async fn work(
    cx: &Cx<'_>,
    state: &mut State,
    a: Assignment,
    limits: &Limits,
    out: &mut Outputs,
) -> anyhow::Result<Worked> {
    let Prepared {
        assignment,
        start,
        command_line,
        launch,
    } = prepare::prepare(cx, state, a)?;
    out.emit(RunEvent::IterationStarted {
        iteration: assignment.iteration,
        slot: assignment.slot,
        max_iter: cx.cfg.max_iter,
        story_id: assignment.story.id.clone(),
        story_title: assignment.story.title.clone(),
        backend: cx.backend.kind().as_str().to_string(),
        agent: cx.fallbacks.then(|| cx.agent.to_owned()),
        worker: assignment.worker,
    });
    out.emit(RunEvent::AgentCommand {
        iteration: assignment.iteration,
        command: command_line,
    });
    if let Some(warning) = crate::prompt::size_warning(launch.prompt.len()) {
        if !cx
            .warned_prompt_size
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            out.warn(warning);
        }
    }
    let execution = execute::execute(cx, state, launch, assignment.iteration, limits, out).await?;
    // A signal ended (or came during) the agent: how long its stop took is part of the record.
    let agent_stopped = cx.stop.stopped().map(|c| (c, c.at.elapsed()));
    // The agent's own word was failure: a pass it set without a check does not count. A usage
    // limit met after the work is the quota's word, not the agent's (docs/decisions.md, "A
    // failed agent's pass").
    let agent_failed = execution.report.failure != Some(crate::protocol::FailureClass::UsageLimit)
        && (execution.report.is_error
            || (execution.process.end == crate::process::EndReason::Exited
                && execution.process.exit_code != Some(0)));
    let observation = inspect::inspect(cx, state, &assignment, &start, out, agent_failed).await?;
    let verdict = classify::classify(
        &Facts {
            story_id: &assignment.story.id,
            run_id: cx.run_id,
            iteration: assignment.iteration,
            process: &execution.process,
            report: &execution.report,
            has_final_event: cx.backend.info().final_event,
            limits: classify::Limits {
                timeout: cx.cfg.timeout,
                iteration_timeout: limits.timeout,
                idle_timeout: cx.cfg.idle_timeout,
                max_duration: cx.cfg.max_duration,
            },
        },
        &observation,
    );
    let mut draft = draft(
        cx,
        &assignment,
        &start,
        &execution,
        &observation,
        &verdict,
        out,
    );
    if let Some((cause, stopped_after)) = agent_stopped {
        draft.signal_at = Some(cause.at);
        draft.record.shutdown = Some(crate::protocol::ShutdownRecord {
            signal: cause.signal.to_owned(),
            timeout_s: cx.cfg.shutdown_timeout.as_secs_f64(),
            agent_stopped_s: stopped_after.as_secs_f64(),
            recorded_s: 0.0,
        });
    }
    // Shared: the gate and guard above read this very file last, so this costs no parse.
    let story_notes = crate::prd::store::load_shared(&cx.paths.prd)
        .ok()
        .and_then(|now| now.prd.story(&assignment.story.id).map(|s| s.notes.clone()));
    let check = assignment
        .story
        .verify
        .clone()
        .or_else(|| cx.cfg.verify.clone())
        .filter(|c| !c.trim().is_empty());
    Ok(Worked {
        story_id: assignment.story.id.clone(),
        slot: assignment.slot,
        draft,
        feedback: verdict.feedback,
        resume_at: execution.report.resume_at,
        story_passes: observation.story_passes,
        story_notes,
        check,
    })
}

/// Stage 5: writes `worked` down at `at` ([`commit::commit`]), marks the hints it carried
/// delivered (in `run_id`'s books) and says it ended (`max_iter`: the run's budget, for the
/// outputs).
///
/// # Errors
/// As [`commit::commit`].
pub fn write_down(
    at: Sinks<'_>,
    run_id: &str,
    max_iter: u32,
    state: &mut State,
    worked: Worked,
    out: &mut Outputs,
) -> anyhow::Result<Done> {
    let written = commit::commit(at, state, worked.draft)?;
    let record = written.record;
    // Written down: the hints it carried are delivered (unless the agent never got to work).
    if let Err(e) = crate::hints::mark_delivered(
        &at.paths.ralph_dir,
        &record.hints,
        record.outcome,
        run_id,
        record.iteration,
    ) {
        out.warn_in(
            record.iteration,
            format!(
                "cannot mark the hints of iteration {} delivered: {e}",
                record.iteration
            ),
        );
    }
    out.emit(RunEvent::IterationFinished {
        iteration: record.iteration,
        record: Box::new(record.clone()),
        slot: worked.slot,
        max_iter,
    });
    // `--push`: a push that did not land is said when it happens, not only in the summary.
    if let Some(problem) = record.push.as_ref().and_then(|p| p.problem()) {
        out.warn_in(
            record.iteration,
            format!("iteration {}: {problem}", record.iteration),
        );
    }
    if !record.refused_hosts.is_empty() {
        out.warn_in(record.iteration, format!(
            "iteration {}: --sandbox strict refused connections to {} (let one through with --allow-host HOST)",
            record.iteration,
            record.refused_hosts.join(", ")
        ));
    }
    Ok(Done {
        clean_at: written
            .tree_clean
            .then(|| record.head_after.clone())
            .flatten(),
        record,
        feedback: worked.feedback,
        resume_at: worked.resume_at,
        story_passes: worked.story_passes,
    })
}

/// The ledger record and commit texts of an iteration, from what the stages found.
fn draft(
    cx: &Cx<'_>,
    a: &Assignment,
    start: &prepare::StartPoint,
    e: &Execution,
    obs: &Observation,
    v: &Verdict,
    out: &mut Outputs,
) -> Draft {
    let report = &e.report;
    // A CLI that reports only tokens (codex, gemini) is priced from ralph.toml's table.
    let model = report.model.clone().or(cx.cfg.model.clone());
    let price = model.as_deref().and_then(|m| cx.cfg.native.prices.get(m));
    let (cost_usd, cost_source) = commit::cost(report.cost_usd, &report.usage, price);
    if cost_usd.is_none() {
        warn_unpriced(cx, model.as_deref(), &report.usage, out);
    }
    let mut r = LedgerRecord::new(cx.run_id, a.iteration, &a.story.id, v.outcome, start.at);
    r.story_title = a.story.title.clone();
    r.backend = cx.backend.kind().as_str().to_string();
    r.agent = cx.fallbacks.then(|| cx.agent.to_owned());
    r.model = model;
    r.agent_version = report
        .agent_version
        .clone()
        .or(cx.agent_version.map(str::to_owned));
    r.exit_code = e.process.exit_code;
    r.signal = e.process.signal;
    r.tokens_in = commit::reported(report.usage.input_tokens);
    r.tokens_out = commit::reported(report.usage.output_tokens);
    r.cache_read_tokens = commit::reported(report.usage.cache_read_tokens);
    r.cache_creation_tokens = commit::reported(report.usage.cache_creation_tokens);
    r.cost_usd = cost_usd;
    r.cost_source = cost_source;
    r.head_before = start.head.clone();
    r.commits = obs.agent_commits.clone();
    r.files_changed = obs.files_changed.clone();
    r.promise_seen = v.promise_seen;
    r.passes_flipped = obs.flipped.clone();
    r.passes_reverted = obs.reverted.clone();
    r.session_id = report.session_id.clone();
    r.transcript = Some(cx.paths.rel_transcript(&e.transcript));
    r.verify = obs.verify.clone();
    r.findings = v.findings.clone();
    r.findings
        .extend(large_files(&cx.paths.repo_root, &r.files_changed));
    r.lost_commits = obs.lost_commits.clone();
    r.history_rewrite = obs.history_rewrite.clone();
    r.passes_refused = obs.refused.iter().map(|(id, _)| id.clone()).collect();
    r.criteria_proposals = obs.criteria_proposals.clone();
    r.strays = e.strays.iter().chain(&obs.strays).cloned().collect();
    if let Some(sandbox) = cx.sandbox {
        r.sandbox = sandbox.mode;
        // The agent's and its checks' refusals, since the last iteration took them.
        r.refused_hosts = sandbox.take_refused();
    }
    r.feature = a.snapshot.prd.branch_name.clone();
    r.message = v.message.clone();
    // `--sandbox`: what the sandbox's settle found (a ralph.toml the agent created, moved
    // aside), appended as the verdict's findings are.
    let settled = cx
        .sandbox
        .map(|s| s.take_findings(&cx.paths.repo_root))
        .unwrap_or_default();
    if !settled.is_empty() {
        let joined = settled.join("; ");
        r.message = Some(match r.message.take() {
            Some(m) => format!("{m}; {joined}"),
            None => joined,
        });
        r.findings.extend(settled);
    }
    r.hints = a.hints.iter().map(crate::hints::Hint::record).collect();
    Draft {
        progress_summary: commit::progress_summary(
            &r.commits,
            &r.files_changed,
            &r.passes_flipped,
            r.promise_seen,
            r.message.as_deref(),
        ),
        subject: format!("ralph: iteration {} ({})", a.iteration, a.story.id),
        body: format!("Outcome: {}.", v.outcome.as_str()),
        clock: Some(start.clock),
        signal_at: None,
        staged: obs.staged.clone(),
        record: r,
    }
}

/// Says once per run why an iteration that used tokens has no cost, when a price table exists
/// but cannot apply (the CLI names no model, or the model has no entry).
fn warn_unpriced(
    cx: &Cx<'_>,
    model: Option<&str>,
    usage: &crate::protocol::Usage,
    out: &mut Outputs,
) {
    let prices = &cx.cfg.native.prices;
    if prices.is_empty() || usage.is_empty() {
        return;
    }
    if cx
        .warned_unpriced
        .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    let known: Vec<&str> = prices.keys().map(String::as_str).collect();
    let message = match model {
        None => format!(
            "cost unknown: {} reports tokens but names no model, so [prices] ({}) cannot apply; pass --model NAME (model in ralph.toml)",
            cx.cfg.agent.as_str(),
            known.join(", ")
        ),
        Some(m) => format!(
            "cost unknown: no [prices.\"{m}\"] entry in ralph.toml (it has: {})",
            known.join(", ")
        ),
    };
    out.warn(message);
}

/// Size above which a file an iteration adds or changes is named in its findings (50 MiB): git
/// keeps every version of it in the history for good, and hosts refuse pushes with files past
/// 100 MB (GitHub).
pub const LARGE_FILE_BYTES: u64 = 50 * 1024 * 1024;

/// The finding naming the files of `files` (relative to `root`, as the iteration left them)
/// larger than [`LARGE_FILE_BYTES`], with their sizes and the limit; `None` when there are none.
/// Serial and `--parallel` iterations alike (the same stage).
pub fn large_files(root: &std::path::Path, files: &[String]) -> Option<String> {
    let big: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let len = std::fs::symlink_metadata(root.join(f)).ok()?.len();
            (len > LARGE_FILE_BYTES).then(|| format!("{f} ({} MiB)", len >> 20))
        })
        .collect();
    (!big.is_empty()).then(|| {
        format!(
            "large file{} committed: {} — over the {} MiB limit ralph warns at; git keeps it in the history for good (remove it with a history rewrite, or track it with Git LFS)",
            if big.len() == 1 { "" } else { "s" },
            big.join(", "),
            LARGE_FILE_BYTES >> 20
        )
    })
}
