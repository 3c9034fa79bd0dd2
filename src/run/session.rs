//! Opening a run's session, in order: `.ralph/` and the lock; repairs of what a killed process
//! left (stale git locks, a torn ledger line); state.json (or its rebuild from git history); the
//! recovery of an iteration left in flight; a usage-limit reset a previous ralph was waiting for;
//! prd.json, `--unblock` and the feature's attempts; the dirty-tree check; the archive of a
//! previous feature; the branch; the local model's server; progress.txt; the run header.

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::bail;
use chrono::{Local, Utc};

use super::feedback::Pending;
use super::policy::{self, Budgets, Tally};
use super::preflight::{build_backend, Preflight};
use super::{wait, RunEvent};
use crate::config::RunConfig;
use crate::git::BranchAction;
use crate::history::{self, History};
use crate::local::LocalServer;
use crate::lock::RunLock;
use crate::output::Outputs;
use crate::prd::store::{self, LoadedPrd};
use crate::process::StopSignals;
use crate::protocol::run_event::{Setting, WaitReason};
use crate::protocol::stop::During;
use crate::protocol::{AgentKind, StopReason};
use crate::state::State;
use crate::workspace::ensure_ralph_dir;

/// An open session: everything the loop needs, and its counters.
pub struct Session {
    /// What preflight found.
    pub pre: Preflight,
    /// This run's id (`<UTC timestamp>-<pid hex>`).
    pub run_id: String,
    /// state.json's content, saved after every change.
    pub state: State,
    /// When the run started.
    pub started: Instant,
    /// The budgets.
    pub budgets: Budgets,
    /// The counters.
    pub tally: Tally,
    /// This run's iterations, as running totals.
    pub totals: super::summary::RunTotals,
    /// Feedback waiting for its story's next prompt.
    pub pending: Pending,
    /// The story ids prd.json had when the run started.
    pub expected_ids: BTreeSet<String>,
    /// prd.json when the run started.
    pub initial: std::sync::Arc<LoadedPrd>,
    /// Why the run ends before its first iteration, when it does (a usage-limit reset it may
    /// not wait for, Ctrl-C or `ralph stop` during that wait).
    pub early_stop: Option<StopReason>,
    /// The user's uncommitted paths (relative to the repository root) when the run started
    /// with `--allow-dirty`; empty otherwise. An agent's commit in the checkout that swept them
    /// in is taken off with their content put back (see `run::parallel::land`).
    pub dirty_at_start: Vec<String>,
    /// The local model's server, for `--agent local` (stopped at the end; its guard kills it on
    /// any early return).
    pub local_server: Option<LocalServer>,
    /// Each agent's standing (usage-limit reset, taken out), in the order of `pre.agents`.
    pub books: Vec<policy::agents::AgentBook>,
    /// `--push`: the remote, its lease held (released at the end; its guard releases it on any
    /// early return).
    pub remote: Option<crate::remote::Remote>,
    /// The run lock, released when the session is dropped.
    _lock: RunLock,
}

impl Session {
    /// Ends the session: everything it holds is released now (the run lock, the sandbox's
    /// proxy and temporary files, the local server's guard), except the parse of prd.json it
    /// started with and the story ids (hundreds of MiB for 100,000 stories), which are freed
    /// on a thread of its own, so that the exit after a stop signal does not wait for the
    /// allocator (the process may end before that thread is done; the memory goes back with
    /// the process).
    pub fn close(mut self) {
        let heavy = (
            std::sync::Arc::clone(&self.initial),
            std::mem::take(&mut self.expected_ids),
        );
        drop(self);
        // No thread: the parse was freed with the failed spawn's closure.
        let _ = std::thread::Builder::new()
            .name("ralph-free".into())
            .spawn(move || drop(heavy));
    }
}

/// Opens the session (see the module docs).
///
/// # Errors
/// The lock is held by a live ralph; state.json or the ledger is corrupt; prd.json has no
/// stories; the tree is dirty without `--allow-dirty`; git, archive or I/O failures; the local
/// model cannot be prepared.
pub async fn open(
    cfg: &RunConfig,
    pre: Preflight,
    stop: &StopSignals,
    started: Instant,
    out: &mut Outputs,
) -> anyhow::Result<Session> {
    let paths = pre.paths.clone();
    // Books an older ralph kept in .ralph/ for this prd.json in a folder become its own.
    let feature = store::load_shared(&paths.prd)
        .ok()
        .and_then(|l| l.prd.branch_name.clone());
    let moved = crate::workspace::adopt_legacy_books(&paths, feature.as_deref())?;
    if moved > 0 {
        out.notice(format!(
            "moved this PRD's books from .ralph/ (where an older ralph kept them) to {}",
            paths.rel(&paths.ralph_dir)
        ));
    }
    ensure_ralph_dir(&paths.ralph_dir)?;
    let acquired = RunLock::acquire(&paths.ralph_dir)?;
    if let Some(stale) = &acquired.stale {
        out.warn(format!(
            "taking over a stale lock from pid {} on {} (that ralph is no longer running)",
            stale.pid, stale.host
        ));
    }
    repair(&pre, out)?;
    let run_id = new_run_id();
    // Before state.json is read or rebuilt: a fresh clone takes its numbering from the run
    // branch's history, which comes from the remote.
    let (remote, lease_resets) = match &cfg.push {
        Some(name) => {
            let (remote, resets) = open_remote(cfg, name, &pre, &run_id, stop, out)?;
            (Some(remote), resets)
        }
        None => (None, crate::remote::lease::Resets::default()),
    };
    // Before state.json, history and prd.json are read: a clone on its base branch goes on from
    // the run branch a remote has, rather than starting over on a new one.
    let adopted = adopt_remote_branch(cfg, &pre, out)?;
    let mut state = load_state(&pre, out)?;
    begin_state(cfg, &mut state, &paths, &lease_resets)?;
    let mut pending = Pending::default();
    pending.add(
        super::recover::recover(
            &pre.repo,
            &paths,
            &mut state,
            cfg,
            stop,
            pre.primary().sandbox.as_ref(),
            out,
        )
        .await?,
    );
    pending.add(super::recover::recover_flights(&pre.repo, &paths, &mut state, cfg, out).await?);
    // Iteration numbers continue even when state.json was deleted: the ledger and the commit
    // trailers remember them.
    state.iteration = state
        .iteration
        .max(history::last_recorded_iteration(&paths, &pre.repo));
    let budgets = Budgets::of(cfg);
    let initial = store::load_shared(&paths.prd)?;
    if let Some(warning) = store::size_warning(&initial) {
        out.warn(warning);
    }
    // `--max-cost` over the feature's runs: what they spent counts from the start.
    let (tally, spent_stop) = earlier_spending(cfg, &pre, &initial, out)?;
    let mut session = Session {
        expected_ids: initial
            .prd
            .user_stories
            .iter()
            .map(|s| s.id.clone())
            .collect(),
        initial,
        pre,
        run_id,
        state,
        started,
        budgets,
        tally,
        totals: Default::default(),
        pending,
        early_stop: None,
        dirty_at_start: Vec::new(),
        local_server: None,
        books: Vec::new(),
        remote,
        _lock: acquired.lock,
    };
    session.prepare_stories(cfg, out)?;
    // A stop heard here ends the run before the tree is touched (archive, branch): with a large
    // prd.json the archive's copy of it alone takes a while.
    if stop.stop.is_cancelled() {
        session.early_stop = Some(StopReason::Interrupted {
            agent_running: false,
        });
        return Ok(session);
    }
    let branch_row = session.prepare_tree(cfg, out)?;
    let branch_row = adopted.unwrap_or(branch_row);
    let progress_row = match crate::progress::ensure_exists(&paths.progress, Local::now())? {
        true => format!("{} (created)", paths.rel(&paths.progress)),
        false => paths.rel(&paths.progress),
    };
    session.header(cfg, branch_row, progress_row, out);
    // A usage-limit reset a previous ralph was waiting for: waited out before the local model's
    // server takes its memory.
    if let Some(reason) = spent_stop {
        session.early_stop = Some(reason);
        return Ok(session);
    }
    session.books = agent_books(&session.pre, &mut session.state, Utc::now());
    if session.initial.prd.all_pass() {
        // Every story passes: the first pick ends the run as complete; no reset holds it.
        session.state.resume_at = None;
    }
    session.early_stop = pending_reset(
        &mut session.state,
        &session.budgets,
        &paths,
        stop,
        started,
        out,
    )
    .await?;
    if session.early_stop.is_some() {
        return Ok(session);
    }
    start_local_model(&mut session, out).await?;
    Ok(session)
}

/// Readies state.json's run-wide fields for this run: `--resume-only` refuses a run whose last
/// stop does not pass by itself; stop and pause requests left by a dead run are cleared; the
/// run's limits are written (for `ralph watch`); a usage-limit reset handed on with the `--push`
/// lease is kept.
///
/// # Errors
/// [`NothingToResume`] under `--resume-only` when the last stop needs a human.
fn begin_state(
    cfg: &RunConfig,
    state: &mut crate::state::State,
    paths: &crate::workspace::RunPaths,
    lease_resets: &crate::remote::lease::Resets,
) -> anyhow::Result<()> {
    // `--resume-only`: a schedule goes on only with a run whose last stop passes by itself.
    if cfg.resume_only {
        if let Err(why) = policy::resumable(state.stop_reason.as_ref()) {
            return Err(NothingToResume(why).into());
        }
    }
    // A stop asked of an earlier run that ended before it saw the request.
    crate::stop_request::clear(&paths.ralph_dir);
    // Likewise a pause (`ralph pause` needs a live run; this one is left from a dead one).
    crate::pause_request::clear(&paths.ralph_dir);
    state.stop_reason = None;
    state.limits = Some(crate::state::RunLimits {
        max_iter: cfg.max_iter,
        max_cost_usd: cfg.max_cost,
        max_duration_s: cfg.max_duration.map(|d| d.as_secs()),
        started_at: chrono::Utc::now(),
    });
    // A usage-limit reset the worker that released the lease was waiting for.
    if let Some(at) = lease_resets.resume_at {
        state.resume_at = Some(state.resume_at.map_or(at, |mine| mine.max(at)));
    }
    // And each fallback agent's: the later of that worker's and this one's.
    for (agent, at) in &lease_resets.agents {
        let mine = state.agent_resets.entry(agent.clone()).or_insert(*at);
        *mine = (*mine).max(*at);
    }
    Ok(())
}

/// Starts the local model's server for the first agent that needs it (one server per run) and
/// rebuilds that agent's backend on its URL.
///
/// # Errors
/// The model cannot be prepared or its server does not start.
async fn start_local_model(session: &mut Session, out: &mut Outputs) -> anyhow::Result<()> {
    // The local model's server, for the first agent that needs it (one server per run).
    let paths = session.pre.paths.clone();
    if let Some(agent) = session
        .pre
        .agents
        .iter_mut()
        .find(|a| a.cfg.agent == AgentKind::Local && a.cfg.native.base_url.is_none())
    {
        let server = start_local_server(&agent.cfg, out).await?;
        agent.backend = build_backend(&agent.cfg, &paths, Some(server.base_url()))?;
        crate::agent::sandbox::allow_url(agent.sandbox.as_ref(), Some(&server.base_url()));
        session.local_server = Some(server);
    }
    Ok(())
}

impl Session {
    /// prd.json's stories, `--unblock`, the feature's attempts and the blocks they imply.
    fn prepare_stories(&mut self, cfg: &RunConfig, out: &mut Outputs) -> anyhow::Result<()> {
        let paths = &self.pre.paths;
        for agent in &self.pre.agents {
            agent.template.check(&self.initial.prd, paths)?;
        }
        if self.initial.prd.user_stories.is_empty() {
            bail!(
                "{} has no stories\nhint: add at least one story to userStories (see `ralph init` for the format)",
                paths.prd.display()
            );
        }
        for s in &self.initial.prd.user_stories {
            if !s.passes && crate::prd::lint::is_starter_story(s) {
                out.warn(format!(
                    "{} is still the example story `ralph init` wrote ({:?}): the agent will work on a placeholder; replace the example stories with your own (`ralph plan \"<the feature>\"` drafts them)",
                    s.id, s.title
                ));
            }
        }
        if let Some(w) =
            crate::run::preflight::unchecked_warning(&self.initial.prd, cfg.verify.as_deref())
        {
            out.warn(w);
        }
        let feature = self.initial.prd.branch_name.clone();
        if let Some(old) = self.state.enter_feature(feature.as_deref()) {
            out.notice(format!(
                "prd.json is a new feature ({}): the attempts and blocks earned in {old} no longer count",
                feature.as_deref().unwrap_or("no branchName")
            ));
        }
        // Blocked stories survive a lost state.json: the attempts rebuilt from git decide again,
        // before `--unblock`, so that it also frees the stories a fresh clone finds blocked.
        let spent = self.state.block_spent(&self.initial.prd, cfg.max_attempts);
        if !spent.is_empty() && !cfg.unblock {
            out.warn(format!(
                "{} blocked: {} used {} {} attempts in earlier runs (--max-attempts {}); \
                 `ralph run --unblock` gives {} new ones",
                if spent.len() == 1 { "story" } else { "stories" },
                spent.join(", "),
                if spent.len() == 1 { "its" } else { "their" },
                cfg.max_attempts,
                cfg.max_attempts,
                if spent.len() == 1 { "it" } else { "them" },
            ));
        }
        if cfg.unblock && !self.state.blocked.is_empty() {
            out.notice(format!(
                "unblocked {} (--unblock): their attempts start again from 0",
                self.state.blocked.join(", ")
            ));
            for id in std::mem::take(&mut self.state.blocked) {
                self.state.attempts.remove(&id);
                // Recorded by the next checkpoint, so that git remembers it too.
                if !self.state.unblocked.contains(&id) {
                    self.state.unblocked.push(id);
                }
            }
        }
        // Saved by the first iteration (or the end of the run): a run refused below (dirty tree,
        // bad base branch) must leave state.json as it was.
        Ok(())
    }

    /// The dirty-tree check, the archive of a previous feature and the branch; returns the
    /// header's branch row.
    fn prepare_tree(&mut self, cfg: &RunConfig, out: &mut Outputs) -> anyhow::Result<String> {
        // A landing a killed ralph left half done is finished first: its files are not the
        // user's changes.
        if let Some(notice) = crate::run::recover::finish_landing(&self.pre) {
            out.notice(notice);
        }
        let (repo, paths) = (&self.pre.repo, &self.pre.paths);
        let dirty = user_changes(&self.pre)?;
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
        if cfg.allow_dirty {
            self.dirty_at_start.clone_from(&dirty);
        }
        let secrets = crate::run::iteration::commit::newly_withheld(&secret_files(&self.pre)?);
        if !secrets.is_empty() {
            out.notice(crate::run::iteration::commit::withheld_finding(&secrets));
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
        let prd = &self.initial.prd;
        let branch_row = match &prd.branch_name {
            Some(branch) => {
                let action = match repo.ensure_branch(branch, prd.base_branch.as_deref())? {
                    BranchAction::AlreadyOn => "already checked out".to_string(),
                    BranchAction::CheckedOut => "checked out".to_string(),
                    BranchAction::Created { from, .. } => format!("created from {from}"),
                    BranchAction::Tracking { upstream, .. } => {
                        format!("created from {upstream}, tracking it")
                    }
                    BranchAction::Unborn => {
                        "no commit yet; the first commit lands on it".to_string()
                    }
                };
                format!("{branch} ({action})")
            }
            None => format!(
                "{} (prd.json has no branchName)",
                repo.current_branch()
                    .unwrap_or_else(|| "detached HEAD".into())
            ),
        };
        if let Some(done) = archived {
            let folder = paths.rel(&done.folder);
            out.emit(RunEvent::Archived {
                folder: folder.clone(),
                files: done.files.iter().map(|f| paths.rel(f)).collect(),
                branch: done.branch.clone(),
                message: done.describe(&paths.repo_root),
            });
            repo.commit_all(
                &format!(
                    "ralph: archive {} to {folder}",
                    done.branch.as_deref().unwrap_or("the previous run")
                ),
                "",
                &[],
            )?;
        }
        Ok(branch_row)
    }

    /// The run header: one [`RunEvent::RunStarted`] with the effective settings.
    fn header(&self, cfg: &RunConfig, branch: String, progress: String, out: &mut Outputs) {
        let paths = &self.pre.paths;
        let primary = self.pre.primary();
        let agent = match &primary.agent_version {
            Some(v) => format!("{} {v} ({})", cfg.agent.as_str(), primary.agent_words),
            None => format!("{} ({})", cfg.agent.as_str(), primary.agent_words),
        };
        let model = match (&cfg.model, cfg.agent) {
            (Some(m), _) => m.clone(),
            (None, AgentKind::Local) => match &cfg.native.model_file {
                Some(f) => f.display().to_string(),
                None => cfg.native.local_model.pin().name.to_string(),
            },
            (None, _) => "agent default".into(),
        };
        let rows = [
            ("prd", paths.prd.display().to_string()),
            ("branch", branch),
            ("progress", progress),
            ("agent", agent),
            ("model", model),
            ("fallback", fallback_row(&self.pre.agents[1..])),
            ("max-iter", cfg.max_iter.to_string()),
            ("parallel", parallel_row(cfg)),
            (
                "timeouts",
                format!(
                    "{} per iteration, {} idle",
                    humantime::format_duration(cfg.timeout),
                    humantime::format_duration(cfg.idle_timeout)
                ),
            ),
            ("sandbox", sandbox_row(cfg)),
            ("ledger", paths.rel(&paths.ledger)),
        ];
        // The fallback and sandbox rows only when there are fallback agents or a sandbox.
        let rows = rows.into_iter().filter(|(key, value)| {
            !matches!(*key, "fallback" | "sandbox" | "parallel") || !value.is_empty()
        });
        out.emit(RunEvent::RunStarted {
            run_id: self.run_id.clone(),
            prd: paths.prd.display().to_string(),
            agent: cfg.agent.as_str().to_string(),
            max_iter: cfg.max_iter,
            settings: rows
                .map(|(key, value)| Setting {
                    key: key.to_string(),
                    value,
                })
                .collect(),
        });
    }
}

/// The header's `parallel` row (empty, so not shown, for a serial run): e.g. `3 stories at once,
/// each in a worktree under .ralph/worktrees/ (setup: npm ci)`. A serial run with
/// `--resolve-conflicts` gets a row that says the setting does nothing there (a serial run never
/// lands a story over another's work, so it has no conflict to resolve).
fn parallel_row(cfg: &RunConfig) -> String {
    if cfg.parallel <= 1 {
        return if cfg.resolve_conflicts {
            "1 story at a time, so --resolve-conflicts / resolve_conflicts has nothing to do (it takes --parallel N, N > 1)".into()
        } else {
            String::new()
        };
    }
    let mut row = format!(
        "{} stories at once, each in a worktree under .ralph/worktrees/",
        cfg.parallel
    );
    if !cfg.worktree_copy.is_empty() {
        row.push_str(&format!(" (copied in: {})", cfg.worktree_copy.join(", ")));
    }
    if let Some(setup) = &cfg.worktree_setup {
        row.push_str(&format!(" (setup: {setup})"));
    }
    if cfg.resolve_conflicts {
        row.push_str(" (conflicts: resolved by an agent, then checked)");
    }
    row
}

/// The header's `sandbox` row: the mode, and in strict mode the hosts `--allow-host` adds (the
/// backend's own are implied); empty with `--sandbox off`.
fn sandbox_row(cfg: &RunConfig) -> String {
    if !cfg.sandbox.is_on() {
        return String::new();
    }
    match (cfg.sandbox, cfg.allow_hosts.is_empty()) {
        (crate::protocol::SandboxMode::Strict, false) => format!(
            "strict (network: the agent's API hosts and {})",
            cfg.allow_hosts.join(", ")
        ),
        (crate::protocol::SandboxMode::Strict, true) => {
            "strict (network: the agent's API hosts only)".to_owned()
        }
        (mode, _) => mode.as_str().to_owned(),
    }
}

/// The header's `fallback` row: each fallback agent's name, backend and model, in order (empty
/// without fallback agents).
fn fallback_row(fallbacks: &[super::preflight::AgentSetup]) -> String {
    fallbacks
        .iter()
        .map(|a| {
            let mut words = a.name.clone();
            if a.name != a.cfg.agent.as_str() {
                words.push_str(&format!(" ({})", a.cfg.agent.as_str()));
            }
            if let Some(m) = &a.cfg.model {
                words.push_str(&format!(", model {m}"));
            }
            words
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

/// `--resume-only` found nothing a schedule should go on with: the message says why. `ralph run`
/// prints it and exits 0 without starting anything.
#[derive(Debug)]
pub struct NothingToResume(pub String);

impl std::fmt::Display for NothingToResume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NothingToResume {}

/// The counters a run starts with: with `--max-cost` over the feature (`--budget-scope
/// feature`), the cost its earlier runs recorded, and the stop when that already reaches the
/// limit.
///
/// # Errors
/// An unreadable ledger.
fn earlier_spending(
    cfg: &RunConfig,
    pre: &Preflight,
    initial: &LoadedPrd,
    out: &mut Outputs,
) -> anyhow::Result<(Tally, Option<StopReason>)> {
    let mut tally = Tally::default();
    let Some(max) = cfg.max_cost else {
        return Ok((tally, None));
    };
    if cfg.budget_scope != crate::protocol::BudgetScope::Feature {
        return Ok((tally, None));
    }
    let history = History::load(&pre.paths, Some(&pre.repo))?;
    let spent = history.feature_cost(initial.prd.branch_name.as_deref());
    if spent.iterations == 0 {
        return Ok((tally, None));
    }
    tally.cost_usd = spent.usd;
    let unknown = if spent.unpriced > 0 {
        format!(
            "; {} of them recorded no cost (git trailers only, or an agent that reports none)",
            spent.unpriced
        )
    } else {
        String::new()
    };
    out.notice(format!(
        "--max-cost ${max:.2} counts this feature's earlier runs: ${:.2} over {} iteration{}{unknown} (--budget-scope run counts this run only)",
        spent.usd,
        spent.iterations,
        if spent.iterations == 1 { "" } else { "s" }
    ));
    let stop = policy::spent_before_start(&tally, &policy::Budgets::of(cfg), spent.last_iteration);
    Ok((tally, stop))
}

/// The paths with uncommitted changes that are the user's: progress.txt is ralph's own log (an
/// entry, or the file itself, that a killed run did not get to commit is folded into the next
/// checkpoint, not refused as the user's work).
/// Untracked secret-looking files are not: ralph never commits them ([`secret_files`]).
fn user_changes(pre: &Preflight) -> anyhow::Result<Vec<String>> {
    let progress_rel = pre.paths.rel(&pre.paths.progress);
    Ok(pre
        .repo
        .dirty_paths()?
        .into_iter()
        .filter(|p| *p != progress_rel && !crate::redact::is_secret_file(p))
        .collect())
}

/// The untracked secret-looking files (`.env`, `*.pem`, `id_rsa`, …) of the working tree, which
/// no checkpoint will carry ([`crate::redact::is_secret_file`]).
fn secret_files(pre: &Preflight) -> anyhow::Result<Vec<String>> {
    Ok(pre
        .repo
        .dirty_paths()?
        .into_iter()
        .filter(|p| crate::redact::is_secret_file(p))
        .collect())
}

/// A clone on its base branch whose prd.json names a `branchName` that exists only on a remote
/// (the run's work, pushed from elsewhere): creates the local branch there, tracking it, and
/// checks it out, so that the run goes on from that branch's prd.json and history instead of
/// starting over on a new branch. Returns the header's branch row when it did.
///
/// An existing local branch is never moved (the dirty-tree check and [`Repo::ensure_branch`]
/// take it later). Uncommitted changes of the user's: left alone without `--allow-dirty` (the
/// dirty-tree check then refuses the run, and the next one, on a clean tree, comes here); with
/// it, carried over unless the switch would overwrite them, when nothing changes and the run
/// stops saying so.
///
/// [`Repo::ensure_branch`]: crate::git::Repo::ensure_branch
fn adopt_remote_branch(
    cfg: &RunConfig,
    pre: &Preflight,
    out: &mut Outputs,
) -> anyhow::Result<Option<String>> {
    let Some(branch) = store::load_shared(&pre.paths.prd)
        .ok()
        .and_then(|l| l.prd.branch_name.clone())
        .filter(|b| !b.is_empty())
    else {
        return Ok(None);
    };
    let repo = &pre.repo;
    if repo.current_branch().as_deref() == Some(branch.as_str())
        // Only a remote's branch with work HEAD lacks (`ralph/x` itself would be a local one).
        || crate::history::feature_elsewhere(repo, Some(&branch)).is_none_or(|b| b == branch)
        || (!cfg.allow_dirty && !user_changes(pre)?.is_empty())
    {
        return Ok(None);
    }
    let BranchAction::Tracking { upstream, sha } = repo.ensure_branch(&branch, None)? else {
        return Ok(None);
    };
    out.notice(format!(
        "{branch} was only on {upstream}: created it there ({}), tracking it; the run goes on from its prd.json and history",
        sha.get(..12).unwrap_or(&sha)
    ));
    Ok(Some(format!(
        "{branch} (created from {upstream}, tracking it)"
    )))
}

/// Stale git locks nobody holds and a torn ledger line: what a killed process leaves behind.
fn repair(pre: &Preflight, out: &mut Outputs) -> anyhow::Result<()> {
    // No other ralph runs here now, so git locks nobody holds were left by a killed process
    // (e.g. a ralph SIGKILLed inside its checkpoint commit) and would fail every commit.
    for lock in pre.repo.clear_stale_locks() {
        out.warn(format!(
            "removed a stale .git/{lock} that no process held (left by a killed process)"
        ));
    }
    // A ledger line torn by a crash is cut off (its bytes kept beside the ledger) before anything
    // reads or appends to it.
    if let crate::ledger::Repair::Dropped { bytes, kept_in } =
        crate::ledger::repair(&pre.paths.ledger)?
    {
        out.warn(format!(
            "the ledger's last line was torn by a crash; removed it ({bytes} bytes kept in {})",
            pre.paths.rel(&kept_in)
        ));
    }
    Ok(())
}

/// state.json, or, when `.ralph/` was deleted (or this is the first run), what git remembers.
fn load_state(pre: &Preflight, out: &mut Outputs) -> anyhow::Result<State> {
    if let Some(state) = State::load(&pre.paths.ralph_dir)? {
        return Ok(state);
    }
    let history = History::load(&pre.paths, Some(&pre.repo))?;
    let feature = store::load_shared(&pre.paths.prd)
        .ok()
        .and_then(|l| l.prd.branch_name.clone());
    let rebuilt = State::rebuild(&history.records, feature.as_deref());
    if rebuilt.iteration > 0 {
        out.notice(format!(
            "no .ralph/state.json: rebuilt from git history ({} iteration{}, last run {})",
            rebuilt.iteration,
            if rebuilt.iteration == 1 { "" } else { "s" },
            rebuilt.run_id.as_deref().unwrap_or("?")
        ));
    }
    Ok(rebuilt)
}

/// A usage-limit wait that a previous ralph did not finish still holds: wait for it, or say why
/// the run stops before it starts.
async fn pending_reset(
    state: &mut State,
    budgets: &Budgets,
    paths: &crate::workspace::RunPaths,
    stop: &StopSignals,
    started: Instant,
    out: &mut Outputs,
) -> anyhow::Result<Option<StopReason>> {
    let Some(at) = state.resume_at else {
        return Ok(None);
    };
    match policy::pending_reset(at, Utc::now(), budgets, started.elapsed()) {
        Err(reason) => return Ok(Some(reason)),
        Ok(None) => {}
        Ok(Some(until)) => {
            out.emit(RunEvent::Waiting {
                reason: WaitReason::UsageLimit,
                until,
                story_id: None,
                attempt: 1,
                max: budgets.max_usage_limit_waits,
            });
            // For `ralph watch`: the end of this wait, margin included.
            state.wait_until = Some(until);
            state.save(&paths.ralph_dir)?;
            let end = wait::until(until, stop, &paths.ralph_dir).await;
            state.wait_until = None;
            if let Some(reason) = policy::after_wait(end, During::UsageLimitWait) {
                state.save(&paths.ralph_dir)?;
                if matches!(reason, StopReason::StopRequested { .. }) {
                    crate::stop_request::clear(&paths.ralph_dir);
                }
                return Ok(Some(reason));
            }
        }
    }
    state.resume_at = None;
    state.save(&paths.ralph_dir)?;
    Ok(None)
}

/// Each agent's book from state.json's per-agent resets (a state.json from before them: its
/// `resume_at` is the primary agent's). With fallback agents, state.json's `resume_at` (the reset
/// a restarted run waits for) becomes the earliest reset when every agent is limited, and `None`
/// when one of them is free.
fn agent_books(
    pre: &Preflight,
    state: &mut State,
    now: chrono::DateTime<Utc>,
) -> Vec<policy::agents::AgentBook> {
    let legacy = state.agent_resets.is_empty();
    // A reset holds the agent it was met by: one of the same name configured otherwise (another
    // command or model) is not held by it. A state.json without identities holds by name.
    let same = |a: &crate::run::preflight::AgentSetup| {
        state
            .agent_identities
            .get(&a.name)
            .is_none_or(|id| *id == a.identity())
    };
    if pre.agents.len() == 1 && !same(&pre.agents[0]) {
        state.resume_at = None;
    }
    let books: Vec<_> = pre
        .agents
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let reset = match state.agent_resets.get(&a.name) {
                Some(at) if same(a) => Some(*at),
                Some(_) => None,
                None if legacy && i == 0 && same(a) => state.resume_at,
                None => None,
            };
            policy::agents::AgentBook {
                identity: a.identity(),
                ..policy::agents::AgentBook::new(&a.name, reset, now)
            }
        })
        .collect();
    if books.len() > 1 {
        state.resume_at = policy::agents::earliest_reset(&books, now);
    }
    books
}

/// Prepares the local model (once per machine: a virtualenv and the verified GGUF in the cache)
/// and starts its server on 127.0.0.1.
pub async fn start_local_server(cfg: &RunConfig, out: &mut Outputs) -> anyhow::Result<LocalServer> {
    let mut progress = |msg: &str| out.notice(format!("local model: {msg}"));
    let (python, model_file) = match &cfg.native.model_file {
        Some(file) => {
            crate::local::verify_model_file(file)?;
            let python =
                crate::local::setup::ensure_venv(&crate::local::cache_dir(), &mut progress)?;
            (python, file.clone())
        }
        None => {
            let model = crate::local::ensure_setup(cfg.native.local_model, &mut progress)?;
            (model.python, model.model_file)
        }
    };
    out.notice(format!(
        "local model: starting the server for {} (2 threads, {}-token context)",
        model_file.display(),
        cfg.native.context_window
    ));
    let server = LocalServer::start(
        &python,
        &model_file,
        crate::local::ServerOptions {
            ctx: cfg.native.context_window,
            ..crate::local::ServerOptions::default()
        },
    )
    .await?;
    out.notice(format!("local model: ready at {}", server.base_url()));
    Ok(server)
}

/// A new run id: `<UTC timestamp>-<low 16 bits of the pid, hex><32 random bits, hex>`. The
/// random part keeps the ids of workers that start in the same second with the same pid (one
/// container each) apart, since `--push` sends every run's refs to one remote.
fn new_run_id() -> String {
    format!(
        "{}-{:04x}{:08x}",
        Utc::now().format("%Y%m%dT%H%M%S"),
        std::process::id() & 0xffff,
        fastrand::u32(..)
    )
}

/// `--push`: takes the run branch's lease on the remote and brings the local branch level with
/// the remote's (checked out from it in a fresh clone, moved forward when behind). Returns the
/// remote and the usage-limit resets the previous worker recorded (its run's, each agent's).
fn open_remote(
    cfg: &RunConfig,
    name: &str,
    pre: &Preflight,
    run_id: &str,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<(crate::remote::Remote, crate::remote::lease::Resets)> {
    let paths = &pre.paths;
    let branch = match store::load_shared(&paths.prd)?.prd.branch_name.clone() {
        Some(b) => b,
        None => pre.repo.current_branch().ok_or_else(|| {
            crate::error::UserError::new(
                "--push needs a branch to push, but prd.json has no branchName and HEAD is detached",
            )
            .with_hint("set branchName in prd.json (e.g. \"ralph/my-feature\")")
        })?,
    };
    let settings = crate::remote::Settings {
        remote: name.to_owned(),
        lease_ttl: cfg.lease_ttl,
        attempts: cfg.push_attempts,
        backoff: cfg.push_backoff,
        op_timeout: std::time::Duration::from_secs(120),
        shutdown_timeout: cfg.shutdown_timeout,
    };
    let (remote, opened) =
        crate::remote::Remote::open(settings, &paths.repo_root, &branch, run_id, stop)?;
    for w in opened.warnings {
        out.warn(w);
    }
    if let Some(remote_head) = &opened.remote_head {
        let local = pre.repo.ref_sha(&format!("refs/heads/{branch}"));
        let ahead = match &local {
            Some(l) => pre.repo.is_ancestor(remote_head, l)?,
            None => false,
        };
        let advanced = if ahead {
            false
        } else {
            match pre.repo.advance_branch(&branch, remote_head) {
                Ok(moved) => moved,
                // A ralph killed here left an iteration's changes, and meanwhile another worker
                // took the lease over and moved the branch on: both touch the same files.
                Err(crate::git::GitError::CheckoutConflict { .. }) => {
                    let flight = crate::state::State::load(&paths.ralph_dir)
                        .ok()
                        .flatten()
                        .and_then(|s| s.in_flight);
                    let Some(flight) = flight else {
                        return Err(crate::git::GitError::CheckoutConflict { branch }.into());
                    };
                    return Err(crate::error::UserError::new(format!(
                        "{branch} moved on at {name} (another worker took over after this ralph was killed during iteration {}), and the changes that iteration left here conflict with the new commits",
                        flight.iteration
                    ))
                    .with_hint(format!(
                        "keep them aside and follow the remote: `git stash push --include-untracked -m \"ralph iteration {}\"`, then `ralph run --push` again (the stash keeps them; `git stash show -p` shows them)",
                        flight.iteration
                    ))
                    .into());
                }
                Err(e) => return Err(e.into()),
            }
        };
        if advanced {
            out.notice(format!(
                "{branch}: {} from {name} ({})",
                if local.is_some() {
                    "moved forward to the commit"
                } else {
                    "checked out the run branch"
                },
                remote_head.get(..12).unwrap_or(remote_head)
            ));
        }
    }
    // A fresh clone starts its books from the ones the branch's earlier workers pushed.
    if let Some(sha) = &opened.books {
        match crate::remote::books::import(&pre.repo, paths, sha) {
            Ok(Some(got)) => out.notice(format!(
                "books of {branch} from {name}: {} ledger record{}{}",
                got.records,
                if got.records == 1 { "" } else { "s" },
                if got.state { " and state.json" } else { "" }
            )),
            Ok(None) => {}
            Err(e) => out.warn(format!("could not start from the remote's books: {e}")),
        }
    }
    let resets = crate::remote::lease::Resets {
        resume_at: opened.resume_at,
        agents: opened.agent_resets,
    };
    Ok((remote, resets))
}
