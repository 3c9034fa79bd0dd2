//! `ralph run`'s loop. It knows the order of the steps and nothing else:
//!
//! ```text
//! preflight ─▶ session ─▶ repeat { policy::pick ─▶ iteration ─▶ policy::decide } ─▶ summary
//! ```
//!
//! - [`preflight`]: checks with no side effects.
//! - [`session`]: lock, repairs, state, recovery ([`recover`]), archive, branch, local server.
//! - [`iteration`]: one iteration as a pipeline of stages (prepare, execute, inspect, classify,
//!   commit).
//! - [`policy`]: every stop-or-continue rule, pure.
//! - [`wait`]: the waits that Ctrl-C and `ralph stop` end.
//! - [`summary`]: the summary, pure.
//!
//! Everything the user sees is a [`RunEvent`] sent to the [`Outputs`].

pub mod feedback;
pub mod final_check;
pub mod iteration;
pub mod parallel;
pub mod policy;
pub mod preflight;
pub mod recover;
pub mod session;
pub mod summary;
pub mod wait;

use std::time::{Duration, Instant};

use chrono::Utc;

use crate::config::RunConfig;
use crate::output::Outputs;
use crate::prd::store;
use crate::process::{self, Limits, StopSignals};
use crate::protocol::run_event::WaitReason;
use crate::protocol::stop::During;
use crate::protocol::{ExitStatus, RunEvent, StopReason};

use self::iteration::prepare::Assignment;
use self::iteration::Cx;
use self::policy::{agents, Aftermath, Budgets, Next, Situation};
use self::session::Session;

/// How long the agent may live after its terminal event before it is killed.
const FINAL_GRACE: Duration = Duration::from_secs(5);
/// How long output is still read after the agent exited, before its group is killed.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Longest agent output line kept in memory for parsing (16 MiB).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Runs the whole loop with `cfg`, sending what happens to `out`; returns the exit status.
///
/// # Errors
/// Preflight and session failures (invalid prd.json, not a git repository, dirty tree, lock
/// held, agent missing, bad template) and I/O errors on ralph's own files. Agent failures are
/// not errors: they are iteration outcomes, and stop conditions are [`StopReason`]s.
pub async fn run(
    cfg: RunConfig,
    out: &mut Outputs,
    stop: StopSignals,
) -> anyhow::Result<ExitStatus> {
    let started = Instant::now();
    let pre = preflight::check(&cfg, out)?;
    if let Some(cause) = first_parse(&pre.paths.prd, &stop).await {
        out.notice(format!(
            "stopped by {} while reading {}: nothing ran, nothing changed",
            cause.signal,
            pre.paths.rel(&pre.paths.prd)
        ));
        return Ok(ExitStatus::Interrupted);
    }
    let paths = pre.paths.clone();
    let mut session = match session::open(&cfg, pre, &stop, started, out).await {
        Ok(session) => session,
        Err(e) => match e.downcast::<session::NothingToResume>() {
            // `--resume-only` and nothing to resume: a run that ends at once, with its summary
            // (`run_finished`, the GitHub outputs), and a success for the schedule.
            Ok(nothing) => return Ok(nothing_to_resume(&cfg, &paths, nothing.0, started, out)),
            Err(e) => return Err(e),
        },
    };
    let reason = match session.early_stop.take() {
        Some(reason) => reason,
        None => drive(&cfg, &mut session, &stop, out).await?,
    };
    Ok(finish(&cfg, session, reason, &stop, out).await)
}

/// The end of a `--resume-only` run that found nothing to resume (`why`): its summary, sent as
/// `RunFinished` like any run's, with prd.json as it is and no iteration.
fn nothing_to_resume(
    cfg: &RunConfig,
    paths: &crate::workspace::RunPaths,
    why: String,
    started: Instant,
    out: &mut Outputs,
) -> ExitStatus {
    // Preflight read prd.json a moment ago; should it be gone now, the sentence alone is said.
    let prd = match store::load(&paths.prd) {
        Ok(loaded) => loaded.prd,
        Err(_) => {
            out.notice(format!("nothing to resume: {why}"));
            return ExitStatus::Success;
        }
    };
    // The sentence names the last stop; the headline says "nothing to resume" itself.
    let why = why
        .strip_prefix("nothing to resume: ")
        .map(str::to_owned)
        .unwrap_or(why);
    let reason = StopReason::NothingToResume { why };
    let state = crate::state::State::load(&paths.ralph_dir)
        .ok()
        .flatten()
        .unwrap_or_default();
    let summary = summary::summarize(&summary::Input {
        reason: &reason,
        prd: &prd,
        totals: &Default::default(),
        elapsed: started.elapsed(),
        ledger: &paths.rel(&paths.ledger),
        agent: cfg.agent,
        api_key_env: cfg.native.api_key_env.as_deref(),
        blocked: &state.blocked,
        attempts: &state.attempts,
        push: None,
        shutdown_s: None,
        pending_reset: None,
        default_verify: cfg.verify.as_deref(),
    });
    out.emit(RunEvent::RunFinished(Box::new(summary)));
    reason.exit_status()
}

/// Parses prd.json for the session (the parse every later read of the same bytes shares, see
/// [`store::load_shared`]) on a thread of its own, while listening for a stop: a 100,000-story
/// file takes seconds to parse in a slow build, and a Ctrl-C or SIGTERM meanwhile must end the
/// run at once. Returns the stop's cause when one came first (the parse is abandoned: nothing
/// was locked or written yet); `None` when the parse ended, whatever its result (the session
/// reports an invalid file).
async fn first_parse(prd: &std::path::Path, stop: &StopSignals) -> Option<process::StopCause> {
    let (done, parsed) = tokio::sync::oneshot::channel();
    let path = prd.to_path_buf();
    // A plain thread, not `spawn_blocking`: the runtime waits for its blocking tasks when it
    // shuts down, and an abandoned parse must not hold the exit.
    let spawned = std::thread::Builder::new()
        .name("ralph-prd-parse".into())
        .spawn(move || {
            let _ = store::load_shared(&path);
            let _ = done.send(());
        });
    if spawned.is_err() {
        // No thread: parsed later, in the session, as before.
        return None;
    }
    tokio::select! {
        _ = parsed => None,
        () = stop.stop.cancelled() => stop.stopped(),
    }
}

/// Gives the memory an iteration freed back to the system (glibc's `malloc_trim`). Without it
/// the allocator keeps freed pages of every thread's arena, and a night of iterations shows as
/// a slowly rising RSS though nothing is kept (issue 13, P3). About 0.1 ms.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel; it touches no live
    // allocation and is thread-safe in glibc.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// The loop: pick, run an iteration, decide, until the policy says stop.
async fn drive(
    cfg: &RunConfig,
    s: &mut Session,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<StopReason> {
    if parallel::wanted(cfg) {
        return parallel::drive(cfg, s, stop, out).await;
    }
    let paths = s.pre.paths.clone();
    let cxs = contexts(&s.pre, &paths, &s.run_id, s.remote.as_ref(), stop);
    let mut on_agent: Option<usize> = None;
    // Where the previous iteration left the tree clean, while nothing else can have run since.
    let mut clean_at: Option<String> = None;
    loop {
        let current = store::load_shared(&paths.prd)?;
        remember(&current, &paths, stop, out);
        let situation = Situation {
            prd: &current.prd,
            expected_ids: &s.expected_ids,
            blocked: &s.state.blocked,
            elapsed: s.started.elapsed(),
            interrupted: stop.stop.is_cancelled(),
            stop_requested: crate::stop_request::pending(&paths.ralph_dir),
            run_id: &s.run_id,
        };
        // The renewal thread found the lease taken by another worker.
        if let Some(reason) = s.remote.as_ref().and_then(crate::remote::Remote::lost) {
            return Ok(reason);
        }
        let Some(index) = choose_agent(&s.books) else {
            return Ok(every_agent_out(s.state.iteration));
        };
        let cx = &cxs[index];
        let budgets = Budgets {
            timeout: cx.cfg.timeout,
            ..s.budgets.clone()
        };
        let pick = match policy::pick(&s.tally, &budgets, &situation) {
            Ok(pick) => pick,
            Err(StopReason::Complete)
                if !final_check::reopen_undone(
                    cfg,
                    final_check::At {
                        pre: &s.pre,
                        run_id: &s.run_id,
                        iteration: s.state.iteration,
                    },
                    &mut s.pending,
                    &current.prd,
                    stop,
                    out,
                )
                .await?
                .is_empty() =>
            {
                // A story a later one undid is open again: the loop picks it.
                clean_at = None;
                continue;
            }
            Err(reason) => {
                if final_check::due_at_stop(&reason) {
                    // Stories stay open, yet one that passed may have been undone since: it is
                    // checked again and set back, so that nothing is left passing unchecked.
                    let at = final_check::At {
                        pre: &s.pre,
                        run_id: &s.run_id,
                        iteration: s.state.iteration,
                    };
                    final_check::reopen_undone(cfg, at, &mut s.pending, &current.prd, stop, out)
                        .await?;
                }
                return Ok(acknowledge(reason, &paths.ralph_dir));
            }
        };
        // `ralph pause` holds only a run that would start an iteration (one about to end, ends);
        // after the pause, prd.json is read and the story picked again.
        let held = Held {
            budgets: &s.budgets,
            started: s.started,
            stop,
        };
        if hold(&held, &paths, &mut s.expected_ids, out).await? {
            clean_at = None;
            continue;
        }
        say_switch(&s.books, &mut on_agent, index, out);
        let story = current.prd.story(&pick.story_id).cloned().ok_or_else(|| {
            anyhow::anyhow!(
                "internal error: the picked story {} is not in prd.json",
                pick.story_id
            )
        })?;
        let assignment = Assignment {
            iteration: s.state.iteration + 1,
            slot: pick.slot,
            feedback: s.pending.take_for(&story.id),
            hints: crate::hints::pending_for(&paths.ralph_dir, &story.id),
            story,
            snapshot: current,
            clean_at: clean_at.take(),
            worker: None,
        };
        let limits = limits(cx.cfg, pick.timeout);
        let done = iteration::run(cx, &mut s.state, assignment, &limits, out).await?;
        release_freed_memory();
        let done_clean_at = done.clean_at.clone();
        let books = Books {
            state: &mut s.state,
            started: s.started,
            budgets: &s.budgets,
            tally: &mut s.tally,
            totals: &mut s.totals,
            pending: &mut s.pending,
            books: &mut s.books,
            ralph_dir: &paths.ralph_dir,
            prd: &paths.prd,
        };
        let (story_id, next) = match settle(books, done, index, out)? {
            Settled::Stop(reason) => return Ok(reason),
            Settled::Next { story_id, next } => (story_id, next),
        };
        let (until, reason, during) = match next {
            Next::Continue => {
                clean_at = done_clean_at;
                continue;
            }
            Next::Stop(reason) => return Ok(reason),
            Next::Retry { wait } => {
                let until = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
                (until, WaitReason::Retry, During::RetryWait)
            }
            Next::WaitUntil { until } => (until, WaitReason::UsageLimit, During::UsageLimitWait),
        };
        if let Some(reason) = before_wait(&s.pre.repo, cx.remote, s.totals.last.as_ref(), out) {
            return Ok(reason);
        }
        out.emit(waiting(cfg, &s.tally, reason, until, Some(story_id)));
        if let Some(reason) = wait_out(&mut s.state, until, during, stop, &paths).await? {
            return Ok(reason);
        }
    }
}

/// The parts of a [`Session`] that [`settle`] reads and changes (borrowed apart, so that the
/// serial loop may hold the iteration contexts that borrow the rest).
struct Books<'a> {
    state: &'a mut crate::state::State,
    started: Instant,
    budgets: &'a Budgets,
    tally: &'a mut policy::Tally,
    totals: &'a mut summary::RunTotals,
    pending: &'a mut feedback::Pending,
    books: &'a mut Vec<agents::AgentBook>,
    ralph_dir: &'a std::path::Path,
    /// prd.json (read when a usage limit would hold the run: nothing to hold once all pass).
    prd: &'a std::path::Path,
}

impl<'a> Books<'a> {
    /// `s`'s parts, with `ralph_dir` (state.json's directory) borrowed apart from it.
    fn of(
        s: &'a mut Session,
        ralph_dir: &'a std::path::Path,
        prd: &'a std::path::Path,
    ) -> Books<'a> {
        Books {
            state: &mut s.state,
            started: s.started,
            budgets: &s.budgets,
            tally: &mut s.tally,
            totals: &mut s.totals,
            pending: &mut s.pending,
            books: &mut s.books,
            ralph_dir,
            prd,
        }
    }
}

/// What follows an iteration written down ([`settle`]).
enum Settled {
    /// The remote refused the branch or the lease: nothing more may be pushed; the run stops.
    Stop(StopReason),
    /// The policy's next step after `story_id`'s iteration (blocks and the agent's book are
    /// applied already).
    Next {
        /// The iteration's story.
        story_id: String,
        /// Go on, retry the story after a wait, wait for a usage limit's reset, or stop.
        next: Next,
    },
}

/// From a written iteration (`done`, run on agent `agent`) to what the run does next, the same
/// for the serial loop and `--parallel`'s landings: the push's verdict, the feedback kept for
/// later prompts, [`policy::decide`] over the tally and the budgets, the run's totals, the
/// agent's book, and a block of the story (also for `setup_failed`: its worktree could not be
/// set up, no agent ran) saved to state.json and said, before the decision's next step.
///
/// # Errors
/// state.json could not be written.
fn settle(
    s: Books<'_>,
    done: iteration::Done,
    agent: usize,
    out: &mut Outputs,
) -> anyhow::Result<Settled> {
    if let Some(reason) = done.record.push.as_ref().and_then(policy::after_push) {
        s.totals.add(done.record);
        return Ok(Settled::Stop(reason));
    }
    s.pending.add(done.feedback);
    let story_id = done.record.story_id.clone();
    let now = Utc::now();
    let decision = policy::decide(
        s.tally,
        s.budgets,
        &Aftermath {
            record: &done.record,
            story_passes: done.story_passes,
            attempts: s.state.attempts.get(&story_id).copied().unwrap_or(0),
            already_blocked: s.state.blocked.contains(&story_id),
            resume_at: done.resume_at,
            elapsed: s.started.elapsed(),
            now,
            jitter: fastrand::f64(),
            limit_repeats: s.books[agent].limits_in_a_row,
            others: agents::others(s.books, agent, now),
            known_reset: s.books[agent].reset_at,
        },
    );
    let outcome = done.record.outcome;
    s.totals.add(done.record);
    let books_changed = book_agent(s.books, s.state, agent, &decision, outcome, now, out);
    *s.tally = decision.tally;
    let block = (decision.block || outcome == crate::protocol::Outcome::SetupFailed)
        && !s.state.blocked.contains(&story_id);
    if block {
        s.state.blocked.push(story_id.clone());
    }
    // The commit stage saved state.json already; only a block, a wait or an agent's reset
    // changes it again.
    if block || decision.resume_at.is_some() || books_changed {
        s.state.save(s.ralph_dir)?;
    }
    // Said only once state.json has the block (notifications follow what is written).
    if block {
        blocked(s.state, s.totals.last.as_ref(), &story_id, out);
    }
    Ok(Settled::Next {
        story_id,
        next: moot_limit(decision.next, s.prd),
    })
}

/// A usage limit's wait or stop (`next`) when every story of prd.json (at `prd`) passes after
/// this iteration: nothing is left to wait for, so the run goes on to the next pick, which ends
/// it as complete (or says which stories vanished). Any other `next` is returned as it is.
fn moot_limit(next: Next, prd: &std::path::Path) -> Next {
    let held = matches!(
        next,
        Next::WaitUntil { .. } | Next::Stop(StopReason::UsageLimit { .. })
    );
    if held && store::load_shared(prd).is_ok_and(|p| p.prd.all_pass()) {
        return Next::Continue;
    }
    next
}

/// One iteration context per agent of `pre`, in the order they are tried.
fn contexts<'a>(
    pre: &'a preflight::Preflight,
    paths: &'a crate::workspace::RunPaths,
    run_id: &'a str,
    remote: Option<&'a crate::remote::Remote>,
    stop: &'a StopSignals,
) -> Vec<Cx<'a>> {
    let fallbacks = pre.agents.len() > 1;
    pre.agents
        .iter()
        .map(|a| Cx {
            cfg: &a.cfg,
            paths,
            repo: &pre.repo,
            agent: &a.name,
            fallbacks,
            backend: &*a.backend,
            template: &a.template,
            stop,
            run_id,
            agent_version: a.agent_version.as_deref(),
            warned_unpriced: Default::default(),
            warned_prompt_size: Default::default(),
            remote,
            sandbox: a.sandbox.as_ref(),
        })
        .collect()
}

/// What this feature's prd.json looks like, so that a later run with a new branchName archives
/// this one (not the new one). Not after a stop: the run ends at the next pick, the stopped
/// iteration's passes went back, and the next run's start remembers the file as it finds it (a
/// rewrite of a large file's copy would hold the exit).
fn remember(
    current: &store::LoadedPrd,
    paths: &crate::workspace::RunPaths,
    stop: &StopSignals,
    out: &mut Outputs,
) {
    if stop.stop.is_cancelled() {
        return;
    }
    if let Err(e) = crate::archive::remember(
        &paths.ralph_dir,
        &paths.prd,
        &current.raw,
        current.prd.branch_name.as_deref(),
    ) {
        out.warn(format!("cannot remember prd.json for archiving: {e:#}"));
    }
}

/// Says a switch when the agent at `index` is not the one of the iteration before (`on_agent`,
/// updated); called once an iteration is sure to run on it (the stories picked with that agent's
/// own time limit).
fn say_switch(
    books: &[agents::AgentBook],
    on_agent: &mut Option<usize>,
    index: usize,
    out: &mut Outputs,
) {
    if let Some(from) = on_agent.filter(|from| *from != index) {
        out.emit(switch_event(books, from, index));
    }
    *on_agent = Some(index);
}

/// The agent of the next iteration ([`agents::choose`]); `None` when every agent was taken out.
/// The waits for a reset happen where a limit is met ([`policy::decide`]) and when the session
/// opens, so an agent still limited here is one whose wait ended a little early: the one with
/// the earliest reset runs.
fn choose_agent(books: &[agents::AgentBook]) -> Option<usize> {
    match agents::choose(books, Utc::now()) {
        agents::AgentPick::Run { index, .. } => Some(index),
        agents::AgentPick::WaitUntil(at) => books
            .iter()
            .position(|b| !b.removed && b.reset_at == Some(at)),
        agents::AgentPick::NoneLeft => None,
    }
}

/// The stop when no agent is left (each one failed to log in).
fn every_agent_out(iteration: u32) -> StopReason {
    StopReason::NeedsHuman {
        outcome: crate::protocol::Outcome::AuthError,
        iteration,
        message: Some("every agent of the run failed to log in".into()),
    }
}

/// The `agent_switched` event of a move from the agent at `from` to the one at `to`.
fn switch_event(books: &[agents::AgentBook], from: usize, to: usize) -> RunEvent {
    use crate::protocol::run_event::SwitchReason;
    let before = &books[from];
    let reason = if before.removed {
        SwitchReason::AuthError
    } else if before.limits_in_a_row > 0 {
        SwitchReason::UsageLimit
    } else {
        SwitchReason::ResetPassed
    };
    RunEvent::AgentSwitched {
        from: before.name.clone(),
        to: books[to].name.clone(),
        reason,
        from_resets_at: before
            .reset_at
            .filter(|_| reason == SwitchReason::UsageLimit),
    }
}

/// Applies what `decision` says about the agent at `index` to its book and to state.json's
/// resets (`now`: when the decision was taken); returns whether state.json changed. An agent
/// with an auth error taken out of the rotation is named in a warning.
fn book_agent(
    books: &mut [agents::AgentBook],
    state: &mut crate::state::State,
    index: usize,
    decision: &policy::Decision,
    outcome: crate::protocol::Outcome,
    now: chrono::DateTime<Utc>,
    out: &mut Outputs,
) -> bool {
    let fallbacks = books.len() > 1;
    let book = &mut books[index];
    book.limits_in_a_row = decision.limit_repeats;
    if let Some(at) = decision.resume_at {
        book.reset_at = Some(at);
    } else if outcome != crate::protocol::Outcome::UsageLimit {
        // It ran without a limit: whatever reset it had is behind it.
        book.reset_at = None;
    }
    if decision.drop_agent {
        book.removed = true;
        let left: Vec<&str> = books
            .iter()
            .filter(|b| !b.removed)
            .map(|b| b.name.as_str())
            .collect();
        out.warn(format!(
            "agent {} cannot log in ({outcome}); it is out of this run, which goes on with {}. Log it in again for the next run",
            books[index].name,
            left.join(", ")
        ));
    }
    if !fallbacks {
        // One agent: state.json's `resume_at` is its reset, as before fallback agents, kept
        // with the agent it belongs to.
        if decision.resume_at.is_some() {
            state.resume_at = decision.resume_at;
            let one = &books[index];
            state.agent_identities =
                std::iter::once((one.name.clone(), one.identity.clone())).collect();
        }
        return false;
    }
    let resets: std::collections::BTreeMap<String, chrono::DateTime<Utc>> = books
        .iter()
        .filter_map(|b| b.reset_at.map(|at| (b.name.clone(), at)))
        .collect();
    let resume_at = agents::earliest_reset(books, now);
    let changed = resets != state.agent_resets || resume_at != state.resume_at;
    state.agent_identities = books
        .iter()
        .filter(|b| b.reset_at.is_some() && !b.identity.is_empty())
        .map(|b| (b.name.clone(), b.identity.clone()))
        .collect();
    state.agent_resets = resets;
    state.resume_at = resume_at;
    changed
}

/// The [`RunEvent::Waiting`] of a wait for `reason` until `until`, before `story_id` runs again.
fn waiting(
    cfg: &RunConfig,
    tally: &policy::Tally,
    reason: WaitReason,
    until: chrono::DateTime<Utc>,
    story_id: Option<String>,
) -> RunEvent {
    let (attempt, max) = match reason {
        WaitReason::Retry => (tally.transient_in_a_row, cfg.max_transient_retries),
        WaitReason::UsageLimit => (tally.usage_waits, cfg.max_usage_limit_waits),
    };
    RunEvent::Waiting {
        reason,
        until,
        story_id,
        attempt,
        max,
    }
}

/// An iteration's process limits, with `timeout` its wall-clock limit.
fn limits(cfg: &RunConfig, timeout: Duration) -> Limits {
    Limits {
        timeout,
        idle_timeout: cfg.idle_timeout,
        kill_grace: cfg.agent_grace(),
        exit_drain: EXIT_DRAIN,
        final_grace: FINAL_GRACE,
        max_line_bytes: MAX_LINE_BYTES,
    }
}

/// What [`hold`] reads of the run.
struct Held<'a> {
    budgets: &'a policy::Budgets,
    started: Instant,
    stop: &'a StopSignals,
}

/// `ralph pause`: when one is asked, holds between iterations until `ralph resume`, a stop or
/// `--max-duration` (a pause counts toward it: docs/decisions.md); returns whether it held.
/// Edits the user makes to prd.json meanwhile are theirs: the next iteration starts from them
/// (the loop reloads prd.json after this, and looks at the tree again), and stories they remove
/// or add are what the run expects from now on.
async fn hold(
    h: &Held<'_>,
    paths: &crate::workspace::RunPaths,
    expected_ids: &mut std::collections::BTreeSet<String>,
    out: &mut Outputs,
) -> anyhow::Result<bool> {
    let Some(request) = crate::pause_request::pending(&paths.ralph_dir) else {
        return Ok(false);
    };
    if crate::stop_request::pending(&paths.ralph_dir) || h.stop.stop.is_cancelled() {
        return Ok(false);
    }
    let since = request.requested_at;
    let ids = |prd: &crate::prd::model::Prd| -> std::collections::BTreeSet<String> {
        prd.user_stories.iter().map(|s| s.id.clone()).collect()
    };
    let before = ids(&store::load(&paths.prd)?.prd);
    out.emit(RunEvent::Paused { since });
    let held = Instant::now();
    let left = h.budgets.time_left(h.started.elapsed());
    let end = wait::while_paused(h.stop, &paths.ralph_dir, left).await;
    if let Ok(now) = store::load(&paths.prd) {
        let after = ids(&now.prd);
        expected_ids.retain(|id| after.contains(id) || !before.contains(id));
        expected_ids.extend(after.difference(&before).cloned());
    }
    if end == wait::PauseEnd::Resumed {
        out.emit(RunEvent::Resumed {
            paused_s: held.elapsed().as_secs_f64(),
        });
    }
    Ok(true)
}

/// Pins the result of this run's latest iteration (see [`iteration::commit::pin_end`]).
fn pin_last(
    repo: &crate::git::Repo,
    last: Option<&crate::protocol::LedgerRecord>,
    out: &mut Outputs,
) {
    if let Some(last) = last {
        if let Err(e) = iteration::commit::pin_end(repo, last) {
            out.warn(format!(
                "cannot pin iteration {}'s result: {e:#}",
                last.iteration
            ));
        }
    }
}

/// Before a wait: the latest iteration's result is pinned and, with `--push`, the pin goes to the
/// remote with the branch (the wait may be long, and the worker may be evicted during it). A
/// remote that refuses this worker stops the run.
fn before_wait(
    repo: &crate::git::Repo,
    remote: Option<&crate::remote::Remote>,
    last: Option<&crate::protocol::LedgerRecord>,
    out: &mut Outputs,
) -> Option<StopReason> {
    pin_last(repo, last, out);
    let record = remote?.push();
    if record.status == crate::protocol::PushStatus::Unreachable {
        out.warn(format!(
            "could not push {} to {} before waiting: {}",
            record.branch,
            record.remote,
            record.error.as_deref().unwrap_or("unknown error")
        ));
    }
    policy::after_push(&record)
}

/// A `ralph stop` request is answered once: its file is removed when the run acts on it.
/// Waits until `until` (`during` says why) and returns the stop a signal, `ralph stop` or the
/// end of the budget brought meanwhile. A retry's wait is written to state.json's `retry_at` while
/// it lasts, for `ralph watch`; a usage limit's end (the reset plus the margin) to `wait_until`
/// (and its `resume_at`, the reset, is cleared once waited out).
///
/// # Errors
/// state.json cannot be written.
async fn wait_out(
    state: &mut crate::state::State,
    until: chrono::DateTime<Utc>,
    during: During,
    stop: &StopSignals,
    paths: &crate::workspace::RunPaths,
) -> anyhow::Result<Option<StopReason>> {
    state.retry_at = (during == During::RetryWait).then_some(until);
    state.wait_until = (during == During::UsageLimitWait).then_some(until);
    state.save(&paths.ralph_dir)?;
    let end = wait::until(until, stop, &paths.ralph_dir).await;
    state.retry_at = None;
    state.wait_until = None;
    let stopped = policy::after_wait(end, during);
    if stopped.is_none() && during == During::UsageLimitWait {
        state.resume_at = None;
    }
    state.save(&paths.ralph_dir)?;
    Ok(stopped.map(|reason| acknowledge(reason, &paths.ralph_dir)))
}

fn acknowledge(reason: StopReason, ralph_dir: &std::path::Path) -> StopReason {
    if matches!(reason, StopReason::StopRequested { .. }) {
        crate::stop_request::clear(ralph_dir);
    }
    reason
}

/// Says that `story_id` is blocked (it used up `--max-attempts`).
fn blocked(
    state: &crate::state::State,
    last: Option<&crate::protocol::LedgerRecord>,
    story_id: &str,
    out: &mut Outputs,
) {
    out.emit(RunEvent::StoryBlocked {
        story_id: story_id.to_owned(),
        attempts: state.attempts.get(story_id).copied().unwrap_or(0),
        last_outcome: last
            .map(|r| r.outcome)
            .unwrap_or(crate::protocol::Outcome::AgentError),
        last_message: last.and_then(|r| r.message.clone()),
    });
}

/// Ends the run: the local server stops, the stop reason goes into state.json, the summary to
/// the outputs.
async fn finish(
    cfg: &RunConfig,
    mut s: Session,
    reason: StopReason,
    stop: &StopSignals,
    out: &mut Outputs,
) -> ExitStatus {
    if let Some(server) = s.local_server.take() {
        server.stop().await;
    }
    let paths = &s.pre.paths;
    pin_last(&s.pre.repo, s.totals.last.as_ref(), out);
    // The refs and objects this run wrote are packed (see iteration::commit::PACK_REFS_EVERY).
    // After a stop signal ralph exits as soon as the work is kept, within --shutdown-timeout:
    // packing the run's loose objects (seconds, for a large prd.json's copies) is left to
    // `git gc`; only the refs are packed (one short rewrite of packed-refs).
    if s.totals.iterations > 0 {
        let warnings = match stop.stopped() {
            Some(_) => s
                .pre
                .repo
                .pack_refs()
                .err()
                .map(|e| e.to_string())
                .into_iter()
                .collect(),
            None => s.pre.repo.housekeeping(),
        };
        for warning in warnings {
            tracing::warn!("{warning}");
        }
    }
    // Fallback agents: a usage limit names each limited agent and its reset.
    let reason = latest_reset(
        reason.with_agent_resets(&s.state.agent_resets),
        s.state.resume_at,
    );
    // `--parallel`: the budget ran out at a launch, and the iterations still running landed
    // afterwards; the open stories are the ones open now.
    let reason = match reason {
        StopReason::MaxIterations { max_iter, open } => {
            let now = store::load_shared(&paths.prd)
                .map(|l| policy::open_ids(&l.prd))
                .ok()
                .filter(|now| !now.is_empty());
            StopReason::MaxIterations {
                max_iter,
                open: now.unwrap_or(open),
            }
        }
        other => other,
    };
    if reason == StopReason::Complete {
        // Every story passes: a limit met on the way holds no later run.
        s.state.resume_at = None;
    }
    s.state.stop_reason = Some(reason.clone());
    // A pause ends with the run (a later run does not start paused).
    crate::pause_request::clear(&paths.ralph_dir);
    if let Err(e) = s.state.save(&paths.ralph_dir) {
        out.warn(format!("cannot record why the run stopped: {e}"));
    }
    // --push: the books (ledger, state.json) go to refs/ralph/books/<branch> with the release.
    if let Some(Err(e)) = s.remote.as_ref().map(|r| r.record_books(paths)) {
        out.warn(e);
    }
    let push = s
        .remote
        .take()
        .map(|remote| hand_back(remote, &reason, &s.state, out));
    let shutdown_s = stop.stopped().map(|c| c.at.elapsed().as_secs_f64());
    // The same bytes as the last iteration left them: the parse it made, not a new one.
    let final_prd = on_run_branch(&s, &reason)
        .or_else(|| store::load_shared(&paths.prd).ok())
        .unwrap_or_else(|| s.initial.clone());
    let ledger = paths.rel(&paths.ledger);
    let summary = summary::summarize(&summary::Input {
        reason: &reason,
        prd: &final_prd.prd,
        totals: &s.totals,
        elapsed: s.started.elapsed(),
        ledger: &ledger,
        agent: cfg.agent,
        api_key_env: cfg.native.api_key_env.as_deref(),
        blocked: &s.state.blocked,
        attempts: &s.state.attempts,
        push: push.as_ref(),
        shutdown_s,
        pending_reset: s.state.resume_at,
        default_verify: cfg.verify.as_deref(),
    });
    let status = reason
        .exit_status()
        .with_unpushed(push.as_ref().is_some_and(|p| p.unpushed_commits > 0));
    out.emit(RunEvent::RunFinished(Box::new(summary)));
    s.close();
    status
}

/// A usage-limit stop says the reset state.json keeps (`kept`) when that is later than its own:
/// `--parallel` iterations that met the same limit together keep its latest stated reset, and
/// the stop reason, `ralph status` and state.json then agree. Any other stop is returned as is.
fn latest_reset(reason: StopReason, kept: Option<chrono::DateTime<Utc>>) -> StopReason {
    match reason {
        StopReason::UsageLimit {
            resume_at,
            why,
            agents,
        } => StopReason::UsageLimit {
            resume_at: kept.map_or(resume_at, |kept| kept.max(resume_at)),
            why,
            agents,
        },
        other => other,
    }
}

/// `--push` at the end of a run: what is not on the remote yet is pushed (unless the remote
/// refused this worker), and the lease is released with the usage-limit reset the run stopped
/// at or was waiting for, and each fallback agent's reset (`state`'s); returns where the remote
/// stands.
fn hand_back(
    remote: crate::remote::Remote,
    reason: &StopReason,
    state: &crate::state::State,
    out: &mut Outputs,
) -> crate::protocol::run_event::PushSummary {
    let refused = matches!(
        reason,
        StopReason::PushRejected { .. } | StopReason::LeaseLost { .. }
    );
    if let Some(record) = (!refused).then(|| remote.push_if_needed()).flatten() {
        if record.status != crate::protocol::PushStatus::Pushed {
            out.warn(format!(
                "could not push {} to {} at the end: {}",
                remote.branch(),
                remote.name(),
                record.error.as_deref().unwrap_or("unknown error")
            ));
        }
    }
    // A run stopped some other way during a usage-limit wait (a SIGTERM, `ralph stop`) still
    // hands its reset on, so that the next worker waits for it instead of calling the agent.
    // Fallback agents: each limited agent's reset goes along (the next worker uses a free one).
    let now = chrono::Utc::now();
    let resets = crate::remote::lease::Resets {
        resume_at: reason
            .resume_at()
            .or(state.resume_at.filter(|at| *at > now)),
        agents: state
            .agent_resets
            .iter()
            .filter(|(_, at)| **at > now)
            .map(|(name, at)| (name.clone(), *at))
            .collect(),
    };
    if !matches!(reason, StopReason::LeaseLost { .. }) && !remote.release(&resets) {
        out.warn(format!(
            "could not release the lease on {} at {}; it lapses by itself after --lease-ttl",
            remote.branch(),
            remote.name()
        ));
    }
    remote.summary()
}

/// prd.json as the run branch holds it, for a `--parallel` run stopped because the checkout was
/// switched to another branch: the checkout's prd.json is then the other branch's, and the
/// summary would count its stories. `None` for any other stop, or when the branch or its
/// prd.json cannot be read.
fn on_run_branch(s: &Session, reason: &StopReason) -> Option<std::sync::Arc<store::LoadedPrd>> {
    let StopReason::NeedsHuman {
        message: Some(m), ..
    } = reason
    else {
        return None;
    };
    if !m.contains("was switched from the run branch") {
        return None;
    }
    let paths = &s.pre.paths;
    let branch = s.initial.prd.branch_name.as_deref()?;
    let rel = paths.prd.strip_prefix(&paths.repo_root).ok()?;
    let rel = rel
        .to_string_lossy()
        .replace(std::path::MAIN_SEPARATOR, "/");
    let bytes = s
        .pre
        .repo
        .file_at(&format!("refs/heads/{branch}"), &rel)
        .ok()??;
    store::parse_shared(&paths.prd, bytes).ok()
}
