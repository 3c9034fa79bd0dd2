//! Stage 1 of an iteration: pin where it starts (the `start` ref, HEAD, branch, the files that
//! were already dirty), render the prompt, describe the agent's process, and record the
//! iteration as in flight in state.json before anything runs, so a ralph killed from now on finds
//! it on restart.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use chrono::{DateTime, Utc};

use super::Cx;
use crate::fsutil::write_volatile_if_changed;
use crate::git::Repo;
use crate::prd::model::Story;
use crate::prd::store::LoadedPrd;
use crate::process::SpawnSpec;
use crate::prompt::PromptContext;
use crate::state::{InFlight, State};
use crate::transcript::{Transcript, TranscriptMeta};

/// What the policy picked, with the feedback meant for this story.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// The iteration number (global to the repository).
    pub iteration: u32,
    /// Its place in this run's budget (1-based).
    pub slot: u32,
    /// The story, as prd.json had it when the iteration started.
    pub story: Story,
    /// Feedback lines for the prompt.
    pub feedback: Vec<String>,
    /// The user's pending hints for this story (`ralph hint`), shown in their own block.
    pub hints: Vec<crate::hints::Hint>,
    /// prd.json when the iteration started (restored from it when the agent breaks it).
    pub snapshot: std::sync::Arc<LoadedPrd>,
    /// The HEAD at which the previous iteration's checkpoint left the working tree clean, when
    /// the loop went straight on to this one (no wait in between): then nothing is dirty at the
    /// start and the status walk is skipped. `None` makes the start look at the tree.
    pub clean_at: Option<String>,
    /// `--parallel`: the worker slot (1-based) it runs on; `None` in a serial run.
    pub worker: Option<u32>,
}

/// Where an iteration started.
#[derive(Debug, Clone)]
pub struct StartPoint {
    /// HEAD's sha (`None` on an unborn branch).
    pub head: Option<String>,
    /// The checked-out branch.
    pub branch: Option<String>,
    /// Files that already differed from HEAD, with a fingerprint of their content.
    pub dirty: DirtySnapshot,
    /// Wall-clock start.
    pub at: DateTime<Utc>,
    /// HEAD's reflog length, to find commits the agent throws away.
    pub reflog_len: usize,
    /// The local branches (`refs/heads/*`) and their tips (full shas) as the iteration
    /// started: a branch the agent deletes or moves off its tip is put back or kept.
    pub branches: Vec<(String, String)>,
    /// Monotonic start, for the duration.
    pub clock: Instant,
}

/// Stage 1's value: the assignment, where it started, and what stage 2 launches.
pub struct Prepared {
    /// The assignment.
    pub assignment: Assignment,
    /// Where the iteration started.
    pub start: StartPoint,
    /// The command line as a user can paste it (secrets redacted).
    pub command_line: String,
    /// What stage 2 consumes.
    pub launch: Launch,
}

/// The agent's run, ready to start.
pub struct Launch {
    /// The rendered prompt.
    pub prompt: String,
    /// The agent's process.
    pub spec: SpawnSpec,
    /// The transcript, with its meta line written.
    pub transcript: Transcript,
}

/// Runs stage 1 (see the module docs).
///
/// # Errors
/// git, template and I/O errors on ralph's own files; the agent has not started.
pub fn prepare(cx: &Cx<'_>, state: &mut State, a: Assignment) -> anyhow::Result<Prepared> {
    let start = start_point(cx, &a)?;
    let excerpt = crate::progress::excerpt(&cx.paths.progress, cx.cfg.progress_tail_bytes)?;
    let ctx = PromptContext::new(
        &a.snapshot.prd,
        &a.story,
        (a.iteration, a.iteration - a.slot + cx.cfg.max_iter),
        cx.paths,
        excerpt,
        a.feedback.clone(),
    )
    .with_hints(a.hints.iter().map(|h| h.text.clone()).collect())
    .in_worktree(a.worker.is_some());
    let prompt = cx.template.render(&ctx)?;
    let mut spec = cx.backend.command(&prompt)?;
    // The tag (a restarted ralph only kills a process group that is really its own), NO_COLOR
    // and `--push`'s token removed, as the launcher will apply them, so that the command line
    // shown is the one that runs.
    crate::agent::session::decorate(
        &mut spec,
        &crate::process::agent_tag(cx.run_id, a.iteration),
    );
    // The prompt is kept next to the transcript, so that the logged command line can be pasted
    // into a shell to replay the iteration by hand.
    let prompt_file = cx.paths.prompt_copy(cx.run_id, a.iteration);
    if let Some(dir) = prompt_file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // A new file per iteration, only ever read by a person: no temporary file, no fsync.
    // Redacted, as everything under .ralph/ is when written (the prompt quotes prd.json's notes
    // and progress.txt, which an agent may have written a key into).
    std::fs::write(
        &prompt_file,
        crate::redact::current().redact(&prompt).as_bytes(),
    )
    .with_context(|| format!("cannot write {}", prompt_file.display()))?;
    let command_line = crate::agent::session::shown_command_line(
        &spec,
        cx.sandbox.map(|s| s.mode),
        spec.stdin.is_some().then_some(prompt_file.as_path()),
    );
    // On disk too: a ralph killed mid-iteration restores prd.json from it on restart.
    // Rewritten only when prd.json changed since the last iteration; not fsynced (prd.json
    // itself is what a power loss would leave).
    write_volatile_if_changed(&cx.paths.prd_snapshot(), &a.snapshot.raw)?;

    state.run_id = Some(cx.run_id.to_string());
    state.iteration = a.iteration;
    state.in_flight = Some(InFlight {
        run_id: cx.run_id.to_string(),
        iteration: a.iteration,
        story_id: a.story.id.clone(),
        pid: 0,
        started_at: start.at,
        start_sha: start.head.clone(),
        strays: Vec::new(),
        worktree: None,
        agent: cx.fallbacks.then(|| cx.agent.to_owned()),
    });
    // Saved now, before the agent exists: a spawned agent can change the tree before ralph
    // gets to write anything else, and a ralph killed in that moment must find the iteration on
    // restart (or it would refuse the agent's files as a user's uncommitted work). The execute
    // stage saves it again with the agent's process group id.
    state.save(&cx.paths.ralph_dir)?;

    let meta = TranscriptMeta {
        run_id: cx.run_id.to_string(),
        iteration: a.iteration,
        story_id: a.story.id.clone(),
        backend: cx.backend.kind().as_str().to_string(),
        command: command_line.clone(),
        head: start.head.clone(),
        ralph_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: start.at.to_rfc3339(),
        prompt_bytes: prompt.len(),
    };
    // The raw output is stored once when a reader can rebuild the events from it.
    let create = if crate::agent::replay_parser(cx.backend.kind()).is_some() {
        Transcript::create_replayed
    } else {
        Transcript::create
    };
    let transcript = create(&cx.paths.transcripts, &meta).with_context(|| {
        format!(
            "cannot write a transcript under {}",
            cx.paths.transcripts.display()
        )
    })?;
    Ok(Prepared {
        assignment: a,
        start,
        command_line,
        launch: Launch {
            prompt,
            spec,
            transcript,
        },
    })
}

/// Pins HEAD under `refs/ralph/<run>/<n>/start` and notes what was already dirty.
fn start_point(cx: &Cx<'_>, a: &Assignment) -> anyhow::Result<StartPoint> {
    let iteration = a.iteration;
    let at = Utc::now();
    let clock = Instant::now();
    let head = cx.repo.head_sha()?;
    if let Some(head) = &head {
        cx.repo
            .set_ref(&format!("refs/ralph/{}/{iteration}/start", cx.run_id), head)?;
    }
    // Changes that exist before the agent starts (ralph's new progress.txt, --allow-dirty work)
    // are not the agent's progress. Right after a checkpoint that left the tree clean there are
    // none (a file someone edits in the milliseconds between counts as the agent's).
    let dirty = if head.is_some() && head == a.clean_at {
        DirtySnapshot::default()
    } else {
        DirtySnapshot::take(cx.repo, head.as_deref(), &cx.paths.repo_root)?
    };
    Ok(StartPoint {
        reflog_len: cx.repo.head_reflog_len(),
        branches: cx.repo.local_branches(),
        branch: cx.repo.current_branch(),
        head,
        dirty,
        at,
        clock,
    })
}

/// Files that differ from a commit, with a fingerprint of their content, so that an iteration's
/// own changes can be told apart from changes that were already there when it started.
#[derive(Debug, Default, Clone)]
pub struct DirtySnapshot {
    files: HashMap<String, Option<u64>>,
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

    /// The files that differ from `head` (or the dirty paths on an unborn branch) now.
    ///
    /// # Errors
    /// git errors reading the status.
    pub fn take(repo: &Repo, head: Option<&str>, root: &Path) -> anyhow::Result<DirtySnapshot> {
        let files = Self::changed(repo, head)?
            .into_iter()
            .map(|p| {
                let fp = Self::fingerprint(root, &p);
                (p, fp)
            })
            .collect();
        Ok(DirtySnapshot { files })
    }

    /// Paths the next checkpoint changes against `head` (the working tree staged as the
    /// checkpoint stages it, [`Repo::staged_changes`]) whose content differs from the snapshot.
    /// A file only removed from the index (`git rm --cached`) is staged back and does not count;
    /// a commit the agent made counts by what it changed.
    ///
    /// # Errors
    /// git errors reading the status or staging.
    pub fn changed_since(
        &self,
        repo: &Repo,
        head: Option<&str>,
        root: &Path,
    ) -> anyhow::Result<Vec<String>> {
        Ok(self.changed_among(repo.staged_changes(head)?, root))
    }

    /// Those of `paths` (what a staging changes against the iteration's start, e.g.
    /// [`Repo::staged_diff`]) whose content differs from the snapshot.
    pub fn changed_among(&self, paths: Vec<String>, root: &Path) -> Vec<String> {
        paths
            .into_iter()
            .filter(|p| match self.files.get(p) {
                Some(before) => *before != Self::fingerprint(root, p),
                None => true,
            })
            .collect()
    }
}
