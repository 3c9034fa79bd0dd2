//! `--resolve-conflicts` (docs/decisions.md, "Resolving a landing's conflict"): a landing that
//! conflicts queues a resolution ([`queue`]); the dispatcher starts it as an iteration of its
//! own (its number, its slot in `--max-iter`/`--max-cost`) in a fresh worktree at the run
//! branch's tip with the story's work merged in and git's markers left in the files
//! ([`make_tree`], [`crate::git::land::resolve::prepare`]), with the prompt of
//! `templates/resolve.md`. At its landing ralph judges the result ([`judge`]): no marker left,
//! every modify/delete conflict named, no file changed that neither side touched, and the
//! story's check passing on it. Accepted, it lands as any story (a merge of the tip and the
//! story's work, kind `resolution`); refused, nothing of it lands, the story's work stays in
//! its salvage ref and the story goes on as after any conflict.

use std::path::Path;

use super::{Board, Flight};
use crate::config::RunConfig;
use crate::git::land::{self as git_land, resolve as git_resolve};
use crate::git::Repo;
use crate::output::Outputs;
use crate::process::StopSignals;
use crate::protocol::{LandingKind, LandingRecord, Outcome};
use crate::run::feedback::Feedback;
use crate::run::iteration::Worked;
use crate::run::session::Session;

/// A conflict waiting for its resolution iteration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The story whose landing conflicted.
    pub story_id: String,
    /// The iteration whose landing conflicted.
    pub of_iteration: u32,
    /// The story's work that did not land (full sha).
    pub work: String,
    /// Where that work is kept (`refs/ralph/salvage/<run>/<story>`, in full).
    pub salvage: String,
    /// The conflicting files, repository-relative.
    pub files: Vec<String>,
    /// The run branch's side of the conflict (commit subjects, changed lines).
    pub ours: String,
    /// The story's side of the conflict.
    pub theirs: String,
}

/// A resolution iteration in flight ([`Flight::resolving`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolving {
    /// What it resolves.
    pub pending: Pending,
    /// Its worktree's start (set when the worktree is made).
    pub prepared: Option<git_resolve::Prepared>,
}

/// Lands `flight` ([`super::land::onto_branch`]); a resolution iteration is judged first
/// ([`judge`]: refused, nothing lands; accepted, the merge of the tip and the story's work
/// lands, kind `resolution`), and a story's landing that conflicts queues its resolution
/// ([`queue`]).
///
/// # Errors
/// As [`super::land::onto_branch`]; git failing on ralph's side while judging.
pub async fn land(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Option<LandingRecord>> {
    let mut accepted = flight.clone();
    if flight.resolving.is_some() {
        match judge(cfg, s, board, flight, worked, (stop, out)).await? {
            Ok(merged) => accepted.work = Some(merged),
            Err(refused) => return Ok(Some(refused)),
        }
    }
    let mut landing = super::land::onto_branch(cfg, s, board, &accepted, worked, stop, out).await?;
    if let (Some(l), Some(r)) = (landing.as_mut(), &flight.resolving) {
        l.resolves = Some(r.pending.of_iteration);
        if matches!(l.kind, LandingKind::FastForward | LandingKind::Merge) {
            l.kind = LandingKind::Resolution;
            l.files = r.pending.files.clone();
        }
    }
    if let Some(l) = &landing {
        queue(cfg, board, flight, worked, l)?;
    }
    Ok(landing)
}

/// After `flight`'s landing conflicted (`landing`, kind `conflict`, with its salvage ref):
/// queues a resolution when `--resolve-conflicts` is on and `flight` was not itself one (a
/// resolution's own conflict goes on as any conflict), and says so in the record.
///
/// # Errors
/// git failing to read the conflict's two sides.
fn queue(
    cfg: &RunConfig,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    landing: &LandingRecord,
) -> anyhow::Result<()> {
    if !cfg.resolve_conflicts || flight.resolving.is_some() || landing.kind != LandingKind::Conflict
    {
        return Ok(());
    }
    let (Some(work), Some(salvage), Some(tip)) = (
        flight.work.clone(),
        landing.salvage_ref.clone(),
        landing.onto.as_deref(),
    ) else {
        return Ok(());
    };
    let tree = Repo::discover(&flight.root)?;
    let (ours, theirs) = git_resolve::sides(&tree, tip, &landing.files)?;
    board.resolutions.push(Pending {
        story_id: flight.story_id.clone(),
        of_iteration: flight.iteration,
        work,
        salvage,
        files: landing.files.clone(),
        ours,
        theirs,
    });
    worked.draft.record.findings.push(
        "--resolve-conflicts: an iteration of its own resolves this conflict next".to_owned(),
    );
    Ok(())
}

/// The next queued resolution whose story is not blocked (those of blocked stories are
/// dropped: the story's work stays in its salvage ref).
pub fn take(board: &mut Board, blocked: &[String]) -> Option<Pending> {
    board.resolutions.retain(|p| !blocked.contains(&p.story_id));
    (!board.resolutions.is_empty()).then(|| board.resolutions.remove(0))
}

/// The lines the resolution prompt shows as its `feedback`: what conflicts, and both sides.
pub fn prompt_lines(p: &Pending) -> Vec<String> {
    vec![
        format!(
            "This iteration resolves the conflict of iteration {} in: {}.",
            p.of_iteration,
            p.files.join(", ")
        ),
        format!("The run branch's side: {}", p.ours),
        format!("The story's side: {}", p.theirs),
        format!(
            "The story's original commits are kept in {}; if your resolution is refused, the story's next attempt redoes its work on the branch.",
            p.salvage
        ),
    ]
}

/// Makes the resolution's worktree at `root`: the run branch's tip `base` with the story's
/// work merged in and the conflicts left in the files (see [`git_resolve::prepare`]).
///
/// # Errors
/// git errors making the worktree or the merge.
pub fn make_tree(
    repo: &Repo,
    root: &Path,
    base: &str,
    keep: &[String],
    r: &mut Resolving,
) -> anyhow::Result<()> {
    repo.add_worktree(root, base)?;
    let tree = Repo::discover(root)?;
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    let prepared = git_resolve::prepare(&tree, &r.pending.work, &r.pending.story_id, &keep)?;
    r.prepared = Some(prepared);
    Ok(())
}

/// Outcomes after which the agent's result is judged: it ended its turn (whatever it claimed).
fn judgeable(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::StoryPassed
            | Outcome::Progress
            | Outcome::NoProgress
            | Outcome::PrematureClaim
            | Outcome::VerifyFailed
    )
}

/// Judges a resolution iteration's result (`flight.work`, its leftovers committed) at its
/// landing. Accepted: `Ok` with the merge of `flight.base` and the story's work with the
/// result's tree (HEAD of the worktree moves there); the record says `story_passed` and what it
/// resolved. Refused: `Err` with its landing (kind `conflict`, the story's salvage ref); the
/// record says why, the story gets feedback, and the resolution's own commits are kept under a
/// salvage ref of their own (named in the message).
///
/// # Errors
/// git failing on ralph's side; the check failing to start.
pub async fn judge(
    cfg: &RunConfig,
    s: &mut Session,
    board: &Board,
    flight: &Flight,
    worked: &mut Worked,
    (stop, out): (&StopSignals, &mut Outputs),
) -> anyhow::Result<Result<String, LandingRecord>> {
    let Some(Resolving {
        pending: p,
        prepared: Some(prepared),
    }) = flight.resolving.clone()
    else {
        anyhow::bail!("internal error: a resolution iteration without its start");
    };
    let tip = board
        .branch
        .as_deref()
        .and_then(|b| s.pre.repo.ref_sha(&format!("refs/heads/{b}")))
        .or(s.pre.repo.head_sha()?);
    let mut landing = LandingRecord {
        kind: LandingKind::Conflict,
        resolves: Some(p.of_iteration),
        onto: tip,
        commit: None,
        salvage_ref: Some(p.salvage.clone()),
        files: p.files.clone(),
        landed_since: board.landed[flight.landed_before.min(board.landed.len())..].to_vec(),
        message: None,
    };
    let tree = Repo::discover(&flight.root)?;
    let result = flight
        .work
        .clone()
        .unwrap_or_else(|| prepared.start.clone());
    let keep = super::land::kept_paths(&s.pre.paths);
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    let outcome = worked.draft.record.outcome;
    let mut refusals = if judgeable(outcome) {
        let facts = git_resolve::facts(&tree, &prepared, (&flight.base, &p.work, &result), &keep)?;
        git_resolve::judge(&facts)
    } else {
        vec![format!("its iteration ended as {}", outcome.as_str())]
    };
    if refusals.is_empty() {
        if let Some(failed) = super::land::check_landed(cfg, s, flight, worked, stop, out).await? {
            refusals.push(format!("the story's check fails on it: {failed}"));
        }
    }
    if refusals.is_empty() {
        let merged = git_resolve::merge_commit(
            &tree,
            (&flight.base, &p.work, &result),
            &format!(
                "ralph: iteration {} resolves the conflict of {} (iteration {})",
                flight.iteration, p.story_id, p.of_iteration
            ),
            &format!(
                "The run branch's tip {} (first parent) and the story's work {} (second parent), resolved in: {}.",
                flight.base,
                p.work,
                p.files.join(", ")
            ),
        )?;
        let message = format!(
            "resolved the conflict of iteration {} ({}) in {}",
            p.of_iteration,
            p.story_id,
            p.files.join(", ")
        );
        let r = &mut worked.draft.record;
        r.outcome = Outcome::StoryPassed;
        r.message = Some(message.clone());
        if !r.passes_flipped.contains(&p.story_id) {
            r.passes_flipped.push(p.story_id.clone());
        }
        worked.draft.body = format!("Outcome: {}.", Outcome::StoryPassed.as_str());
        worked.story_passes = true;
        // The conflict's note for a next attempt is moot: the story lands.
        s.pending.take_for(&p.story_id);
        return Ok(Ok(merged));
    }
    let attempt = if result != prepared.start {
        let kept = git_land::salvage(&s.pre.repo, &s.run_id, &p.story_id, &result)?;
        format!(" (the resolution's own commits are in {kept})")
    } else {
        // Nothing of the agent's: the start is a commit ralph made; kept so the worktree goes.
        git_land::salvage(&s.pre.repo, &s.run_id, &p.story_id, &result)?;
        String::new()
    };
    let message = format!(
        "the resolution of iteration {}'s conflict was refused: {}; nothing landed, the story's work stays in {}{attempt}",
        p.of_iteration,
        refusals.join("; "),
        p.salvage
    );
    worked.feedback.push(Feedback::about(
        &p.story_id,
        format!(
            "An agent's resolution of the conflict of {} was refused: {}. You start from the branch; redo the story's change on top of it (its earlier commits are kept in {}).",
            p.story_id,
            refusals.join("; "),
            p.salvage
        ),
    ));
    if judgeable(outcome) {
        worked.draft.record.outcome = Outcome::Conflict;
        worked.draft.body = format!("Outcome: {}.", Outcome::Conflict.as_str());
    }
    worked.draft.record.message = Some(message.clone());
    worked.story_passes = false;
    let story = p.story_id.clone();
    worked.draft.record.passes_flipped.retain(|id| *id != story);
    landing.message = Some(message);
    Ok(Err(landing))
}
