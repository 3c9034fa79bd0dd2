//! `ralph run --parallel N`: up to N stories at once, each in its own worktree with its own
//! agent, landed on the run branch one at a time (docs/decisions.md, "Parallel stories").
//!
//! ```text
//! dispatcher (this task)                       workers (one thread per iteration)
//!   policy::pick + the ready stories ──Job──▶   set the worktree up, stages 1–4 in it
//!   events ◀──────────────────────────Msg───   (the same pipeline as a serial run)
//!   land::land: commit the tree's leftovers, bring the run tip in, check on it,
//!               move the checkout forward, prd.json/progress.txt, stage 5 on the checkout
//!   policy::decide, blocks, waits
//! ```
//!
//! The dispatcher alone writes the run's books (ledger, state.json with every iteration in
//! flight in `flights`) and the run branch; it hands out iteration numbers, so they have no gaps.
//! A worker's prd.json and progress.txt are never merged: ralph writes the story's `passes` and
//! `notes` and the progress entry itself at landing.

mod guard;
pub mod land;
pub mod own;
pub mod resolve;
pub mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::iteration::prepare::Assignment;
use super::limits;
use super::policy::{self, Next, Situation};
use super::session::Session;
use crate::config::RunConfig;
use crate::git::GitError;
use crate::output::Outputs;
use crate::prd::store;
use crate::process::StopSignals;
use crate::protocol::run_event::WaitReason;
use crate::protocol::stop::During;
use crate::protocol::{Outcome, StopReason};
use crate::state::{InFlight, WorkerTree};

use self::worker::{Job, Msg};

/// An iteration running in a worker.
#[derive(Debug, Clone)]
pub struct Flight {
    /// The iteration number.
    pub iteration: u32,
    /// Its story.
    pub story_id: String,
    /// The worker slot (1-based).
    pub worker: u32,
    /// The worktree's root.
    pub root: PathBuf,
    /// The run branch's tip when the worktree was made.
    pub base: String,
    /// The agent (index into the run's agents).
    pub agent: usize,
    /// Stories landed on the run branch when the worktree was made (to name what it met).
    pub landed_before: usize,
    /// The story's work once its worktree's leftovers are committed (at landing).
    pub work: Option<String>,
    /// Its place in the run's budget (1-based).
    pub slot: u32,
    /// When its worktree was made (UTC): the earliest its agent could have committed.
    pub started_at: DateTime<Utc>,
    /// `--resolve-conflicts`: the conflict this iteration resolves (`None`: a story's own
    /// iteration).
    pub resolving: Option<resolve::Resolving>,
}

/// The dispatcher's memory of the night (what is not in state.json).
#[derive(Debug, Default)]
pub struct Board {
    /// Iterations running now.
    pub flights: Vec<Flight>,
    /// The agent (index in the session's agents) the last launch ran on: a launch on another
    /// one says so (`agent_switched`), as a serial run does.
    pub on_agent: Option<usize>,
    /// Salvage refs made for deleted worktrees' dangling commits, with the start (full sha) of
    /// the flight they were found for: a sibling of the same start whose worktree went too may
    /// find its commits already kept there.
    pub gone_kept: Vec<(String, String)>,
    /// Stories landed in this run, in landing order.
    pub landed: Vec<String>,
    /// Stories waiting for a transient retry, with when they may run again.
    pub held: BTreeMap<String, DateTime<Utc>>,
    /// No new launch before this (a usage limit met by a worker).
    pub limited_until: Option<DateTime<Utc>>,
    /// The story's last work that did not land, to start its next attempt from.
    pub resume: BTreeMap<String, String>,
    /// Why the run stops, once known: no new launch, the running iterations finish and land.
    pub stopping: Option<StopReason>,
    /// Where ralph last left the run branch (an agent in a worktree can move the shared ref:
    /// [`land::guard_branch`] puts it back).
    pub tip: Option<String>,
    /// The run branch (the checkout's branch when the run started).
    pub branch: Option<String>,
    /// Pending hints (`ralph hint`) given to an iteration in flight, by id, with that
    /// iteration: a hint for any story goes to one iteration, not to every one that starts
    /// before the first is written down (it is free again if that one does not deliver it).
    pub hinted: BTreeMap<u32, u32>,
    /// Whether the run said that the checkout was switched (said once, not per iteration).
    pub switch_told: bool,
    /// The average cost of an iteration of this feature in its earlier runs, in USD (`None`:
    /// no `--max-cost`, or no earlier priced iteration): what an iteration in flight is
    /// counted at before this run knows a cost of its own.
    pub earlier_average: Option<f64>,
    /// Stories passing in the run branch's committed prd.json when the loop started: with
    /// [`Board::landed`], the only passes [`own::guard`] trusts in the checkout's prd.json.
    pub passing_at_start: std::collections::BTreeSet<String>,
    /// `--resolve-conflicts`: conflicts waiting for their resolution iteration, oldest first.
    pub resolutions: Vec<resolve::Pending>,
}

/// The loop of a `--parallel` run (see the module docs); returns why it stopped.
///
/// # Errors
/// ralph's own files or git failing (an agent's failure is an outcome).
pub async fn drive(
    cfg: &RunConfig,
    s: &mut Session,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<StopReason> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let mut board = Board::default();
    start_point(s, cfg.allow_dirty)?;
    board.tip = s.pre.repo.head_sha()?;
    board.passing_at_start = own::passing_at_start(s)?;
    board.branch = s.pre.repo.current_branch();
    board.resume = earlier_work(s);
    board.earlier_average = earlier_average(s);
    loop {
        if board.stopping.is_none() {
            launch(cfg, s, &mut board, stop, &tx, out).await?;
        }
        if board.flights.is_empty() {
            if let Some(reason) = board.stopping.take() {
                if matches!(reason, StopReason::Complete) {
                    if own::guard(s, &board, out)? {
                        // A worker marked stories passing in the checkout: they run as usual.
                        continue;
                    }
                    let current = store::load_shared(&s.pre.paths.prd)?;
                    let at = super::final_check::At {
                        pre: &s.pre,
                        run_id: &s.run_id,
                        iteration: s.state.iteration,
                    };
                    let reopened = super::final_check::reopen_undone(
                        cfg,
                        at,
                        &mut s.pending,
                        &current.prd,
                        stop,
                        out,
                    )
                    .await?;
                    if !reopened.is_empty() {
                        // A story a later one undid is open again: launch it.
                        board.tip = s.pre.repo.head_sha()?;
                        continue;
                    }
                } else if super::final_check::due_at_stop(&reason)
                    && land::switched(s, &board).is_none()
                {
                    recheck_at_stop(cfg, s, &mut board, stop, out).await?;
                }
                // An agent's commit in the checkout after the last landing's check.
                if let Some(warning) = land::guard_branch(s, &mut board)? {
                    out.warn(warning);
                }
                tidy(s);
                return Ok(final_cost(s, reason));
            }
            // Nothing runs: a wait (a retry, a usage limit) or the end.
            match idle(cfg, s, &mut board, stop, out).await? {
                Some(reason) => {
                    tidy(s);
                    return Ok(reason);
                }
                None => continue,
            }
        }
        let Some(msg) = rx.recv().await else {
            anyhow::bail!("internal error: every worker is gone");
        };
        match msg {
            Msg::Event(event) => out.emit(event),
            Msg::AgentStarted { iteration, at } => agent_started(s, iteration, at)?,
            Msg::Done { iteration, end } => {
                let Some(at) = board.flights.iter().position(|f| f.iteration == iteration) else {
                    continue;
                };
                let flight = board.flights.remove(at);
                // Its hints are delivered now, or pending again for the next iteration.
                board.hinted.retain(|_, it| *it != iteration);
                if let Some(message) = land::switched(s, &board) {
                    // The checkout is on another branch now: nothing is landed or written on
                    // it; the iteration stays in flight in state.json, and the next run
                    // records it (its work under a salvage ref) once the branch is back.
                    if !std::mem::replace(&mut board.switch_told, true) {
                        out.warn_in(iteration, message.clone());
                    }
                    unlanded(s, iteration, &message)?;
                    board.stopping.get_or_insert(StopReason::NeedsHuman {
                        outcome: Outcome::Interrupted,
                        iteration,
                        message: Some(message),
                    });
                    drop(end);
                    continue;
                }
                let landed = land::land(cfg, s, &mut board, flight, end, stop, out).await?;
                after(cfg, s, &mut board, landed, out)?;
                super::release_freed_memory();
            }
        }
    }
}

/// A run that stops with stories open (a budget, `ralph stop`; see
/// [`super::final_check::due_at_stop`]): a passed story that a later landing undid is checked
/// again on the landed tip and set back, as at "complete", but nothing new is launched.
///
/// # Errors
/// As [`super::final_check::reopen_undone`].
async fn recheck_at_stop(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    own::guard(s, board, out)?;
    let current = store::load_shared(&s.pre.paths.prd)?;
    let at = super::final_check::At {
        pre: &s.pre,
        run_id: &s.run_id,
        iteration: s.state.iteration,
    };
    super::final_check::reopen_undone(cfg, at, &mut s.pending, &current.prd, stop, out).await?;
    board.tip = s.pre.repo.head_sha()?;
    Ok(())
}

/// The work of earlier runs that did not land and that an open story's next attempt starts
/// from (its last record's salvage ref, unless that was a conflict: a conflicting story starts
/// from the tip). Read from the ledger; empty when there is none.
fn earlier_work(s: &Session) -> BTreeMap<String, String> {
    let Ok(history) = crate::history::History::load(&s.pre.paths, None) else {
        return BTreeMap::new();
    };
    let open: std::collections::BTreeSet<String> = s
        .initial
        .prd
        .user_stories
        .iter()
        .filter(|story| !story.passes)
        .map(|story| story.id.clone())
        .collect();
    let mut last: BTreeMap<String, &crate::protocol::LedgerRecord> = BTreeMap::new();
    for r in &history.records {
        if open.contains(&r.story_id) {
            last.insert(r.story_id.clone(), r);
        }
    }
    last.into_iter()
        .filter_map(|(story, r)| {
            let landing = r.landing.as_ref()?;
            if landing.kind == crate::protocol::LandingKind::Conflict {
                return None;
            }
            let sha = s.pre.repo.ref_sha(landing.salvage_ref.as_deref()?)?;
            // A killed resolution's work holds the conflict's markers: start from the tip.
            (!crate::git::land::resolve::holds_markers_commit(&s.pre.repo, &sha))
                .then_some((story, sha))
        })
        .collect()
}

/// Notes in state.json when iteration `iteration`'s worker got to its agent (its worktree set
/// up): a restart after a crash keeps only what was written after it as the agent's.
///
/// # Errors
/// state.json could not be written.
fn agent_started(s: &mut Session, iteration: u32, at: DateTime<Utc>) -> anyhow::Result<()> {
    let Some(tree) = s
        .state
        .flights
        .iter_mut()
        .find(|f| f.iteration == iteration)
        .and_then(|f| f.worktree.as_mut())
    else {
        return Ok(());
    };
    tree.agent_started_at = Some(at);
    s.state.save(&s.pre.paths.ralph_dir)?;
    Ok(())
}

/// Notes in state.json why iteration `iteration` stays in flight though it ended: the
/// checkout was switched (`why`), nothing landed; the next run records it as such.
///
/// # Errors
/// state.json could not be written.
fn unlanded(s: &mut Session, iteration: u32, why: &str) -> anyhow::Result<()> {
    let Some(tree) = s
        .state
        .flights
        .iter_mut()
        .find(|f| f.iteration == iteration)
        .and_then(|f| f.worktree.as_mut())
    else {
        return Ok(());
    };
    tree.unlanded = Some(why.to_owned());
    s.state.save(&s.pre.paths.ralph_dir)?;
    Ok(())
}

/// Removes this run's worktree folder (and `.ralph/worktrees/`) when nothing is left in them,
/// after pruning the registrations of worktrees whose directory is gone (locked, git keeps
/// them; a HEAD nothing keeps is saved under a salvage ref first, and logged).
fn tidy(s: &Session) {
    let dir = s
        .pre
        .paths
        .repo_root
        .join(crate::workspace::RALPH_DIR)
        .join("worktrees");
    match s.pre.repo.prune_gone_worktrees(&dir) {
        Ok(unkept) => {
            for (root, sha) in unkept {
                let name = root
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match crate::git::land::salvage(&s.pre.repo, &s.run_id, &name, &sha) {
                    Ok(salvage) => tracing::warn!(
                        "the worktree {} was deleted behind ralph's back; its last commit is kept in {salvage}",
                        root.display()
                    ),
                    Err(e) => tracing::warn!("cannot keep {sha} of {}: {e}", root.display()),
                }
            }
        }
        Err(e) => tracing::warn!("cannot prune the worktrees that are gone: {e}"),
    }
    let _ = std::fs::remove_dir(dir.join(&s.run_id));
    let _ = std::fs::remove_dir(dir);
}

/// Worktrees start from the run branch's last commit: prd.json and progress.txt as the run
/// starts (progress.txt just created, a prd.json not yet committed) are committed first, so that
/// every worktree has them. Nothing else: the user's uncommitted changes (`--allow-dirty`) stay
/// in the checkout as they are, never committed by ralph (a landing that would write over one
/// stops the run instead).
fn start_point(s: &Session, allow_dirty: bool) -> anyhow::Result<()> {
    let own = land::kept_paths(&s.pre.paths);
    if allow_dirty {
        own::hold_user_edits(s, &own)?;
    }
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    crate::git::land::commit_own_files(
        &s.pre.repo,
        &own,
        &format!("ralph: the run's prd.json and progress.txt ({})", s.run_id),
        "Committed before the stories' worktrees are made (--parallel).",
        &[],
    )?;
    Ok(())
}

/// Starts iterations on free workers while stories are ready and the budgets allow.
async fn launch(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    stop: &StopSignals,
    tx: &mpsc::UnboundedSender<Msg>,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    let paths = s.pre.paths.clone();
    while (board.flights.len() as u32) < cfg.parallel && board.stopping.is_none() {
        if let Some(message) = land::switched(s, board) {
            // The checkout is on another branch (its prd.json is not the run's): no launch,
            // and nothing is taken for one (feedback, hints). With nothing in flight the run
            // stops here; else it stops once the running iterations end (the first of them
            // to end says so).
            if board.flights.is_empty() {
                if !std::mem::replace(&mut board.switch_told, true) {
                    out.warn(message.clone());
                }
                board.stopping.get_or_insert(StopReason::NeedsHuman {
                    outcome: Outcome::Interrupted,
                    iteration: s.state.iteration,
                    message: Some(message),
                });
            }
            return Ok(());
        }
        if board.limited_until.is_some_and(|at| at > Utc::now()) {
            return Ok(());
        }
        if crate::pause_request::pending(&paths.ralph_dir).is_some()
            && !crate::stop_request::pending(&paths.ralph_dir)
            && !stop.stop.is_cancelled()
        {
            // `ralph pause`: no new iteration; the running ones finish (held in `idle`). A stop
            // asked during the pause goes on to the pick below, which ends the run (without
            // this, the loop spun: `idle` leaves a stop to the launch).
            return Ok(());
        }
        if cost_would_cross(s, board) {
            // `--max-cost`: what is in flight will likely spend the rest; the landings decide.
            return Ok(());
        }
        // An agent's move of the run branch in the checkout (a `git reset` back) is undone
        // before prd.json is read: the stories its landings passed are not picked again.
        if let Some(warning) = land::moved_back(s, board) {
            out.warn(warning);
        }
        let Some(current) = settled_prd(s, board).await? else {
            // Switched while prd.json was read: the next pass of this loop says so.
            continue;
        };
        if own::guard(s, board, out)? {
            // What a worker wrote into the checkout's prd.json is set back: read it again.
            continue;
        }
        super::remember(&current, &paths, stop, out);
        let now = Utc::now();
        board.held.retain(|_, at| *at > now);
        let mut busy: Vec<String> = s.state.blocked.clone();
        busy.extend(board.flights.iter().map(|f| f.story_id.clone()));
        busy.extend(board.held.keys().cloned());
        let situation = Situation {
            prd: &current.prd,
            expected_ids: &s.expected_ids,
            blocked: &busy,
            elapsed: s.started.elapsed(),
            interrupted: stop.stop.is_cancelled(),
            stop_requested: crate::stop_request::pending(&paths.ralph_dir),
            run_id: &s.run_id,
        };
        let Some(agent) = super::choose_agent(&s.books) else {
            board.stopping = Some(super::every_agent_out(s.state.iteration));
            return Ok(());
        };
        let mut tally = s.tally.clone();
        tally.slot += board.flights.len() as u32;
        let budgets = policy::Budgets {
            timeout: s.pre.agents[agent].cfg.timeout,
            ..s.budgets.clone()
        };
        let pick = match policy::pick(&tally, &budgets, &situation) {
            Ok(pick) => pick,
            Err(reason) => {
                // Stories in flight or held: the run waits for them unless it must stop.
                if hard_stop(&reason) || (board.flights.is_empty() && board.held.is_empty()) {
                    board.stopping = Some(super::acknowledge(reason, &paths.ralph_dir));
                }
                return Ok(());
            }
        };
        // A queued conflict's resolution goes first, in the slot and budget the pick found.
        let resolving = resolve::take(board, &s.state.blocked);
        let story_id = resolving.as_ref().map_or(&pick.story_id, |p| &p.story_id);
        let Some(story) = current.prd.story(story_id).cloned() else {
            anyhow::bail!(
                "internal error: the picked story {} is not in prd.json",
                pick.story_id
            );
        };
        let assignment = Assignment {
            iteration: s.state.iteration + 1,
            slot: pick.slot,
            feedback: match &resolving {
                Some(p) => resolve::prompt_lines(p),
                None => s.pending.take_for(&story.id),
            },
            hints: crate::hints::pending_for(&paths.ralph_dir, &story.id)
                .into_iter()
                .filter(|h| !board.hinted.contains_key(&h.id))
                .collect(),
            story,
            snapshot: current.clone(),
            clean_at: None,
            worker: None,
        };
        for hint in &assignment.hints {
            board.hinted.insert(hint.id, assignment.iteration);
        }
        super::say_switch(&s.books, &mut board.on_agent, agent, out);
        start(
            cfg,
            s,
            board,
            (assignment, pick.timeout, agent, resolving),
            stop,
            tx,
            out,
        )?;
    }
    Ok(())
}

/// `--max-cost` with iterations in flight: whether one more would likely cross the limit,
/// counting each iteration in flight (and the new one) at this run's average cost so far, or
/// before this run knows one, at the feature's earlier runs' average (the limit counts those
/// runs too, docs/decisions.md). A
/// serial run learns an iteration's cost before it starts the next; N workers must not spend
/// N iterations past the limit before the first cost is known. `false` without a limit, with
/// nothing in flight (the policy's own check applies) or before any cost is known.
fn cost_would_cross(s: &Session, board: &Board) -> bool {
    let Some(max) = s.budgets.max_cost else {
        return false;
    };
    if board.flights.is_empty() {
        return false;
    }
    let here = match (s.totals.cost_usd, s.totals.iterations) {
        (Some(spent), n) if n > 0 => Some(spent / f64::from(n)),
        _ => None,
    };
    let Some(average) = here.or(board.earlier_average) else {
        return false;
    };
    s.tally.cost_usd + average * (board.flights.len() as f64 + 1.0) > max
}

/// A `--max-cost` stop decided while other iterations still ran names the cost once they
/// ended (what the run spent in all), not the cost when the limit was reached.
fn final_cost(s: &Session, reason: StopReason) -> StopReason {
    match reason {
        StopReason::MaxCost {
            spent_usd,
            max_usd,
            iteration,
            before_start,
        } => StopReason::MaxCost {
            spent_usd: spent_usd.max(s.tally.cost_usd),
            max_usd,
            iteration,
            before_start,
        },
        other => other,
    }
}

/// The average cost of one of this feature's iterations in its earlier runs (those that
/// recorded a cost), when `--max-cost` is set; see [`Board::earlier_average`].
fn earlier_average(s: &Session) -> Option<f64> {
    s.budgets.max_cost?;
    let history = crate::history::History::load(&s.pre.paths, None).ok()?;
    let spent = history.feature_cost(s.initial.prd.branch_name.as_deref());
    let priced = spent.iterations.saturating_sub(spent.unpriced);
    (priced > 0).then(|| spent.usd / f64::from(priced))
}

/// A stop that ends the launches at once (the running iterations still finish and land).
fn hard_stop(reason: &StopReason) -> bool {
    !matches!(
        reason,
        StopReason::NoWorkableStory | StopReason::AllBlocked { .. } | StopReason::Complete
    )
}

/// Makes the story's worktree, records the iteration in flight and starts its worker.
fn start(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    (assignment, timeout, agent, resolving): (
        Assignment,
        std::time::Duration,
        usize,
        Option<resolve::Pending>,
    ),
    stop: &StopSignals,
    tx: &mpsc::UnboundedSender<Msg>,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    // An agent that moved the run branch does not decide where the next story starts.
    if let Some(warning) = land::guard_branch(s, board)? {
        out.warn(warning);
        if board.stopping.is_some() {
            give_back(s, board, &assignment);
            return Ok(());
        }
    }
    // prd.json as the user edited it meanwhile (a story added during a pause) is what the
    // worktree must start from; what a worker wrote there is set back first.
    own::guard(s, board, out)?;
    if !edits_committed(s, board)? {
        give_back(s, board, &assignment);
        return Ok(());
    }
    board.tip = land::own_tip(s, board)?;
    let paths = &s.pre.paths;
    let repo = &s.pre.repo;
    let iteration = assignment.iteration;
    let slot = assignment.slot;
    let story_id = assignment.story.id.clone();
    // ralph's own tip: not an agent's checkout commit made since the guard above.
    let base = board
        .tip
        .clone()
        .or(repo.head_sha()?)
        .ok_or_else(|| anyhow::anyhow!("--parallel needs a first commit on the run branch"))?;
    if land::switched(s, board).is_some() {
        give_back(s, board, &assignment);
        return Ok(());
    }
    let worker = (1..=cfg.parallel)
        .find(|w| board.flights.iter().all(|f| f.worker != *w))
        .unwrap_or(1);
    let mut assignment = assignment;
    assignment.worker = Some(worker);
    let root = tree_root(paths, &s.run_id, &story_id, iteration);
    let keep = land::kept_paths(paths);
    let started_at = Utc::now();
    let mut resolving = resolving.map(|pending| resolve::Resolving {
        pending,
        prepared: None,
    });
    match resolving.as_mut() {
        Some(r) => resolve::make_tree(repo, &root, &base, &keep, r)?,
        None => land::make_tree(repo, board, &root, &story_id, &base, &keep, out)?,
    }
    s.state.run_id = Some(s.run_id.clone());
    s.state.iteration = s.state.iteration.max(iteration);
    s.state.flights.push(InFlight {
        run_id: s.run_id.clone(),
        iteration,
        story_id: story_id.clone(),
        pid: 0,
        started_at,
        start_sha: Some(base.clone()),
        strays: Vec::new(),
        worktree: Some(WorkerTree {
            worker,
            root: root.clone(),
            base: base.clone(),
            agent_started_at: None,
            unlanded: None,
        }),
        agent: (s.pre.agents.len() > 1).then(|| s.pre.agents[agent].name.clone()),
    });
    s.state.save(&paths.ralph_dir)?;
    let setup = &s.pre.agents[agent];
    let base_url = s
        .local_server
        .as_ref()
        .map(|server| server.base_url())
        .or_else(|| setup.cfg.native.base_url.clone());
    let job = Job {
        cfg: setup.cfg.clone(),
        agent: setup.name.clone(),
        fallbacks: s.pre.agents.len() > 1,
        template: match resolving {
            Some(_) => crate::prompt::PromptTemplate::resolve()?,
            None => setup.template.clone(),
        },
        agent_version: setup.agent_version.clone(),
        base_url,
        run_id: s.run_id.clone(),
        stop: stop.clone(),
        main_root: paths.repo_root.clone(),
        tree: root.clone(),
        prd_rel: paths
            .prd
            .strip_prefix(&paths.repo_root)
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from("prd.json")),
        assignment,
        limits: limits(&setup.cfg, timeout),
        state: s.state.clone(),
        copy: cfg.worktree_copy.clone(),
        setup: cfg.worktree_setup.clone(),
    };
    board.flights.push(Flight {
        iteration,
        story_id,
        worker,
        root,
        base,
        agent,
        landed_before: board.landed.len(),
        work: None,
        slot,
        started_at,
        resolving,
    });
    worker::spawn(job, tx.clone()).map_err(|e| anyhow::anyhow!("cannot start a worker: {e}"))
}

/// The run's prd.json for a pick, or `None` when the checkout turns out to be switched. A
/// `git checkout` of another branch deletes and rewrites prd.json before it moves HEAD, so a
/// read that finds it missing or half-written, or made while a checkout is rewriting the files
/// ([`crate::git::Repo::checkout_in_progress`]), is tried again (every 50 ms, for at most 5 s)
/// until it loads from a settled checkout or the switch shows.
///
/// # Errors
/// prd.json still unreadable or invalid after that, the checkout on the run branch.
async fn settled_prd(
    s: &Session,
    board: &Board,
) -> anyhow::Result<Option<std::sync::Arc<crate::prd::store::LoadedPrd>>> {
    let mut tries = 0;
    loop {
        // Read first, then look: a checkout that rewrote prd.json before this read is still
        // seen (its lock held, or its index written and HEAD not yet moved).
        match store::load_shared(&s.pre.paths.prd) {
            Ok(_) if land::switched(s, board).is_some() => return Ok(None),
            Ok(_) if tries < 100 && s.pre.repo.checkout_in_progress() => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Ok(current) => return Ok(Some(current)),
            Err(_) if land::switched(s, board).is_some() => return Ok(None),
            Err(e) if tries >= 100 => return Err(e.into()),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// A launch that starts nothing because the checkout was switched while its story was picked
/// (the next launch stops the run): the feedback and hints taken for it are pending again.
fn give_back(s: &mut Session, board: &mut Board, assignment: &Assignment) {
    s.pending.add(
        assignment
            .feedback
            .iter()
            .map(|f| crate::run::feedback::Feedback::about(&assignment.story.id, f.clone())),
    );
    board.hinted.retain(|_, it| *it != assignment.iteration);
}

/// Commits the user's edits of prd.json and progress.txt before a story starts
/// ([`land::commit_edits`]) and returns `true`; or, when the checkout is switched by then (a
/// `git checkout` writes the files first and moves HEAD last, so the pick and this commit may
/// have read the other branch's prd.json), returns `false` with the run branch as ralph left it:
/// a commit of those files this made on the run branch is taken back, and a commit that failed
/// because HEAD moved under it (or the checkout held the index) is no error.
///
/// # Errors
/// git failing to commit or to move the run branch back, the checkout still on it.
fn edits_committed(s: &Session, board: &mut Board) -> anyhow::Result<bool> {
    let branch_ref = board.branch.as_ref().map(|b| format!("refs/heads/{b}"));
    let before = branch_ref.as_deref().and_then(|r| s.pre.repo.ref_sha(r));
    let settle = || {
        // Until a checkout rewriting the files (before or during the commit) has moved HEAD.
        let mut tries = 0;
        while tries < 100 && s.pre.repo.checkout_in_progress() && land::switched(s, board).is_none()
        {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    settle();
    let mut committed = land::commit_edits(s);
    // A `git checkout` holds the index while it rewrites the files: a commit refused for the
    // lock is tried again (every 50 ms, at most 5 s) until it goes through or the switch shows.
    // A lock held past ralph's wait, or a commit made on the branch meanwhile, is not tried
    // again here (the commit itself waited for the lock; a new try would build on that commit).
    let settled = |c: &anyhow::Result<Option<String>>| {
        c.as_ref()
            .err()
            .and_then(|e| e.downcast_ref::<GitError>())
            .is_some_and(|e| matches!(e, GitError::Locked { .. } | GitError::BranchMoved { .. }))
    };
    let mut tries = 0;
    while committed.is_err()
        && !settled(&committed)
        && land::switched(s, board).is_none()
        && tries < 100
    {
        tries += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
        committed = land::commit_edits(s);
    }
    settle();
    if land::switched(s, board).is_none() {
        let e = match committed {
            Ok(_) => return Ok(true),
            Err(e) => e,
        };
        return match e.downcast_ref::<GitError>() {
            // Another git process committed on the run branch in the checkout meanwhile: the
            // edits stay in the checkout (the next landing commits them); the next guard
            // takes that commit off and names it.
            Some(GitError::BranchMoved { .. }) => Ok(true),
            // Another git process holds the checkout's index past ralph's wait: the run stops
            // cleanly for the user (nothing lost: the edits are in the checkout).
            Some(GitError::Locked { .. }) => {
                board.stopping.get_or_insert(StopReason::NeedsHuman {
                    outcome: Outcome::LandingRefused,
                    iteration: s.state.iteration,
                    message: Some(format!(
                        "ralph cannot commit prd.json and progress.txt before the next story starts: {e}"
                    )),
                });
                Ok(false)
            }
            _ => Err(e),
        };
    }
    if let (Some(name), Some(before), Ok(Some(made))) = (branch_ref.as_deref(), before, &committed)
    {
        // Only ralph's own commit, still the branch's tip, is taken back.
        if s.pre.repo.ref_sha(name).as_deref() == Some(made.as_str()) {
            s.pre.repo.set_ref(name, &before)?;
        }
    }
    Ok(false)
}

/// `.ralph/worktrees/<run>/<story>-<iteration>` (the story id made safe for a file name).
fn tree_root(
    paths: &crate::workspace::RunPaths,
    run_id: &str,
    story_id: &str,
    iteration: u32,
) -> PathBuf {
    let safe: String = story_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    paths
        .repo_root
        .join(crate::workspace::RALPH_DIR)
        .join("worktrees")
        .join(run_id)
        .join(format!("{safe}-{iteration}"))
}

/// What the dispatcher does after an iteration was landed and written down: the policy's
/// decision (blocks, waits, stops) applied to the board.
fn after(
    _cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    landed: land::Landed,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    let land::Landed { done, agent } = landed;
    let ralph_dir = s.pre.paths.ralph_dir.clone();
    let prd = s.pre.paths.prd.clone();
    let books = super::Books::of(s, &ralph_dir, &prd);
    let (story_id, next) = match super::settle(books, done, agent, out)? {
        super::Settled::Stop(reason) => {
            board.stopping.get_or_insert(reason);
            return Ok(());
        }
        super::Settled::Next { story_id, next } => (story_id, next),
    };
    // What a worker wrote into the checkout's prd.json does not count as passing.
    own::guard(s, board, out)?;
    if store::load_shared(&prd).is_ok_and(|p| p.prd.all_pass()) {
        // Every story passes: a usage limit met by this landing or an earlier one holds
        // nothing; the next launch's pick ends the run.
        board.limited_until = None;
        if matches!(board.stopping, Some(StopReason::UsageLimit { .. })) {
            board.stopping = None;
        }
    }
    let now = Utc::now();
    match next {
        Next::Continue => {}
        Next::Stop(reason) => {
            board.stopping.get_or_insert(reason);
        }
        Next::Retry { wait } => {
            let until = now + chrono::Duration::from_std(wait).unwrap_or_default();
            board.held.insert(story_id, until);
        }
        Next::WaitUntil { until } => {
            board.limited_until = Some(board.limited_until.map_or(until, |at| at.max(until)));
        }
    }
    Ok(())
}

/// Nothing runs: waits for a usage limit's reset, a held story's retry or a pause, and returns
/// the stop such a wait ended with (`None`: go on launching).
async fn idle(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Option<StopReason>> {
    let paths = s.pre.paths.clone();
    let held = super::Held {
        budgets: &s.budgets,
        started: s.started,
        stop,
    };
    if super::hold(&held, &paths, &mut s.expected_ids, out).await? {
        // A pause is the user's turn (nothing ran meanwhile, and the last landing put the
        // workers' writes back): prd.json as they left it is what the guard keeps from now on,
        // their passes included, and their edits are committed.
        if let Ok(now) = store::load_shared(&paths.prd) {
            board.passing_at_start = now
                .prd
                .user_stories
                .iter()
                .filter(|u| u.passes)
                .map(|u| u.id.clone())
                .collect();
        }
        edits_committed(s, board)?;
        return Ok(None);
    }
    let now = Utc::now();
    let (until, reason, during, story) = if let Some(at) = board.limited_until.take() {
        (at, WaitReason::UsageLimit, During::UsageLimitWait, None)
    } else if let Some((story, at)) = board.held.iter().min_by_key(|(_, at)| **at) {
        let (story, at) = (story.clone(), *at);
        (at, WaitReason::Retry, During::RetryWait, Some(story))
    } else {
        // Nothing runs, nothing waits and nothing could start: the next launch says why.
        return Ok(None);
    };
    if until <= now {
        return Ok(None);
    }
    if let Some(reason) =
        super::before_wait(&s.pre.repo, s.remote.as_ref(), s.totals.last.as_ref(), out)
    {
        return Ok(Some(reason));
    }
    // A usage limit holds every story: the event names none.
    out.emit(super::waiting(cfg, &s.tally, reason, until, story));
    let stopped = super::wait_out(&mut s.state, until, during, stop, &paths).await?;
    board.held.retain(|_, at| *at > Utc::now());
    Ok(stopped)
}

/// Whether the run's settings ask for parallel stories.
pub fn wanted(cfg: &RunConfig) -> bool {
    cfg.parallel > 1
}
