//! One `--parallel` worker: one iteration of one story in its own worktree, on a thread of its
//! own with its own runtime (git2's repository is not `Sync`, so an iteration's future is not
//! `Send`; a thread per iteration keeps the pipeline as it is). The worker sets its tree up
//! (`worktree_copy`, submodules, `worktree_setup`), opens the tree's repository, builds the
//! agent's backend for the tree and runs stages 1–4 ([`iteration::work`]) with the tree's own
//! workspace (`<tree>/.ralph/`: its prd.json snapshot and a private state.json; its prompt copy
//! and transcript go to the run's books in the main checkout, `.ralph/runs/<run>/`). Everything
//! it has to say goes to the dispatcher as [`Msg`]s; besides its transcript and prompt copy it
//! never writes the run's books (ledger, state.json) or the run branch.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use crate::config::RunConfig;
use crate::output::{Outputs, Sink};
use crate::process::{Limits, StopSignals};
use crate::prompt::PromptTemplate;
use crate::protocol::RunEvent;
use crate::run::iteration::prepare::Assignment;
use crate::run::iteration::{self, Cx, Worked};
use crate::state::State;
use crate::workspace::RunPaths;

/// What a worker tells the dispatcher.
#[derive(Debug)]
pub enum Msg {
    /// An event of its iteration, for the run's outputs.
    Event(RunEvent),
    /// The worker got to its agent (its worktree set up) at `at`: the dispatcher notes it in
    /// state.json (what a restart takes as the agent's files starts then).
    AgentStarted {
        /// The iteration number.
        iteration: u32,
        /// When (taken by the worker, not when the dispatcher reads the message).
        at: chrono::DateTime<chrono::Utc>,
    },
    /// The iteration ended (its record not yet written).
    Done {
        /// The iteration number.
        iteration: u32,
        /// What it did: the worked iteration, the setup that failed, or an error.
        end: End,
    },
}

/// How a worker's iteration ended.
#[derive(Debug)]
pub enum End {
    /// Stages 1–4 ran.
    Worked(Box<Worked>),
    /// The worktree could not be set up; no agent ran.
    SetupFailed(String),
    /// ralph's own files, git, or an agent that could not start (the message), and whether its
    /// `iteration_started` went out before.
    Failed(String, bool),
}

/// Everything a worker needs, owned (it outlives no borrow of the dispatcher).
pub struct Job {
    /// The agent's settings.
    pub cfg: RunConfig,
    /// The agent's (profile) name.
    pub agent: String,
    /// Whether the run has fallback agents.
    pub fallbacks: bool,
    /// The agent's prompt template.
    pub template: PromptTemplate,
    /// Its CLI's `--version`.
    pub agent_version: Option<String>,
    /// The native/local API URL (the local model server's, once it runs).
    pub base_url: Option<String>,
    /// This run's id.
    pub run_id: String,
    /// Ctrl-C and friends (shared with the whole run).
    pub stop: StopSignals,
    /// The main checkout's root (where `worktree_copy` comes from).
    pub main_root: PathBuf,
    /// The worktree's root.
    pub tree: PathBuf,
    /// prd.json's path relative to the repository root.
    pub prd_rel: PathBuf,
    /// The story and its feedback (its snapshot is replaced by the tree's prd.json).
    pub assignment: Assignment,
    /// The iteration's process limits.
    pub limits: Limits,
    /// A copy of the run's state (the worker's stages keep their own).
    pub state: State,
    /// `worktree_copy`.
    pub copy: Vec<String>,
    /// `worktree_setup`.
    pub setup: Option<String>,
}

/// Starts `job` on a thread of its own; its events and its end go to `tx`.
///
/// # Errors
/// The thread could not be started.
pub fn spawn(job: Job, tx: UnboundedSender<Msg>) -> std::io::Result<()> {
    let iteration = job.assignment.iteration;
    std::thread::Builder::new()
        .name(format!("ralph-worker-{iteration}"))
        .spawn(move || {
            let forward = tx.clone();
            // A panic in the iteration must still end it for the dispatcher (which waits for
            // every worker's end), as a failed iteration with the panic's message.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(run(job, forward)),
                    Err(e) => End::Failed(format!("cannot start the worker's runtime: {e}"), false),
                }
            }));
            let end = ran.unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                End::Failed(format!("internal error: the worker stopped: {what}"), false)
            });
            let _ = tx.send(Msg::Done { iteration, end });
        })
        .map(|_| ())
}

/// Forwards a worker's events to the dispatcher, noting when its `iteration_started` went.
struct Forward(UnboundedSender<Msg>, Arc<std::sync::atomic::AtomicBool>);

impl Sink for Forward {
    fn on(&mut self, event: &RunEvent) {
        if let RunEvent::IterationStarted { iteration, .. } = event {
            self.1.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = self.0.send(Msg::AgentStarted {
                iteration: *iteration,
                at: chrono::Utc::now(),
            });
        }
        let _ = self.0.send(Msg::Event(event.clone()));
    }
}

/// The worker's body (see the module docs).
async fn run(job: Job, tx: UnboundedSender<Msg>) -> End {
    let setup = crate::worktree::TreeSetup {
        main_root: &job.main_root,
        root: &job.tree,
        copy: &job.copy,
        command: job.setup.as_deref(),
        timeout: setup_timeout(&job.cfg),
        tag: &crate::process::agent_tag(&job.run_id, job.assignment.iteration),
    };
    if let Err(failed) = crate::worktree::set_up(&setup, &job.stop) {
        return End::SetupFailed(failed.to_string());
    }
    // What the setup left untracked is not the agent's work: the landing leaves it out of the
    // commit of the agent's leftovers (run/parallel/land.rs).
    if job.setup.is_some() || !job.copy.is_empty() {
        let recorded = crate::git::Repo::discover(&job.tree)
            .map_err(anyhow::Error::from)
            .and_then(|tree| tree.record_setup_files());
        if let Err(e) = recorded {
            tracing::warn!("cannot write down the files worktree_setup made: {e:#}");
        }
    }
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    match work(job, Forward(tx, started.clone())).await {
        Ok(worked) => End::Worked(Box::new(worked)),
        Err(e) => End::Failed(
            format!("{e:#}"),
            started.load(std::sync::atomic::Ordering::Relaxed),
        ),
    }
}

/// How long `worktree_setup` may take: the iteration's own `--timeout`.
fn setup_timeout(cfg: &RunConfig) -> Duration {
    cfg.timeout
}

async fn work(mut job: Job, forward: Forward) -> anyhow::Result<Worked> {
    let mut paths = RunPaths::new(&job.tree, &job.tree.join(&job.prd_rel));
    // The run's ledger is the main checkout's (the tree has none): what earlier iterations of
    // the story did, an interrupted one whose work was salvaged included, is read from it
    // (inspect's "no earlier iteration did any work"). Records are written by the driver.
    let books = RunPaths::new(&job.main_root, &job.main_root.join(&job.prd_rel));
    paths.ledger = books.ledger;
    // The iteration's transcript and prompt copy are written straight into the run's books:
    // an agent that deletes its worktree does not take them along.
    paths.transcripts = books.transcripts;
    crate::workspace::ensure_ralph_dir(&paths.ralph_dir)?;
    let repo = crate::git::Repo::discover(&job.tree)?;
    // The story as the tree has it: the run branch's prd.json when the story started.
    let snapshot = Arc::new(crate::prd::store::load(&paths.prd)?);
    if let Some(story) = snapshot.prd.story(&job.assignment.story.id) {
        job.assignment.story = story.clone();
    }
    job.assignment.snapshot = snapshot;
    job.assignment.clean_at = None;
    let backend = crate::run::preflight::build_backend(&job.cfg, &paths, job.base_url.clone())?;
    // `--sandbox`: one of the worker's own, rooted in its tree (strict: its own proxy, so the
    // refusals it counts are this iteration's).
    let sandbox = crate::agent::sandbox::build(
        &crate::run::preflight::sandbox_ask(&job.cfg),
        backend.info(),
    )?;
    crate::agent::sandbox::allow_url(sandbox.as_ref(), job.base_url.as_deref());
    let cx = Cx {
        cfg: &job.cfg,
        paths: &paths,
        repo: &repo,
        agent: &job.agent,
        fallbacks: job.fallbacks,
        backend: &*backend,
        template: &job.template,
        stop: &job.stop,
        run_id: &job.run_id,
        agent_version: job.agent_version.as_deref(),
        warned_unpriced: Default::default(),
        warned_prompt_size: Default::default(),
        remote: None,
        sandbox: sandbox.as_ref(),
    };
    let mut out = Outputs::new();
    out.add(Box::new(forward));
    let mut state = job.state;
    state.in_flight = None;
    state.flights.clear();
    iteration::work(&cx, &mut state, job.assignment, &job.limits, &mut out).await
}
