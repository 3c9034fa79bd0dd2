//! Stage 3 of an iteration: look at what the agent left. prd.json is read back (restored from
//! the snapshot when the agent broke it); the verify gate checks every story the agent marked
//! passing (and, with `verify_marks_passing`, the current story); the prd.json guard lists what
//! changed beyond the story's `passes` and `notes` (and puts it back with `prd_guard = restore`);
//! git says which commits and files are the iteration's own and whether history was rewritten
//! (then the iteration's start is put back on the branch, the agent's work on top of it). A pass
//! the iteration did not earn (nothing but notes changed and no earlier iteration worked on the
//! story, or the story's acceptance criteria rewritten) is set back to false; acceptance criteria
//! the agent rewrote are put back and kept as proposals.
//! Every rewrite of prd.json here changes only the bytes it must, through
//! [`crate::fsutil::write_atomic`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use anyhow::Context as _;

use super::prepare::{Assignment, StartPoint};
use super::{verify, Cx};
use crate::fsutil::write_atomic;
use crate::output::Outputs;
use crate::prd::model::{Prd, Story};
use crate::prd::store::{self, LoadedPrd};
use crate::protocol::{
    CriteriaProposal, HistoryRewrite, Outcome, PrdGuard, RunEvent, StrayProcess, VerifyRecord,
};
use crate::state::State;

/// Stage 3's value: what the agent's iteration changed.
#[derive(Debug, Default)]
pub struct Observation {
    /// Why prd.json was invalid after the agent (it was restored), if it was.
    pub corrupted: Option<String>,
    /// Stories whose `passes` went to true and stayed (the verify gate passed or had no
    /// command), ralph's own marking included.
    pub flipped: Vec<String>,
    /// Stories the agent set back to false.
    pub reverted: Vec<String>,
    /// Stories the agent marked passing whose pass ralph did not count (set back to false), with
    /// why: see [`Refusal`].
    pub refused: Vec<(String, Refusal)>,
    /// The verify commands run, in order.
    pub verify: Vec<VerifyRecord>,
    /// Stories the agent marked passing whose check a stop (Ctrl-C, SIGTERM) left unrun: set
    /// back to not passing.
    pub unchecked: Vec<String>,
    /// A stop (Ctrl-C, SIGTERM) came while the verify gate had checks to run or running: the
    /// gate could not judge the iteration, which is then `interrupted`.
    pub stopped_in_gate: bool,
    /// What the verify commands left running, killed (`after_verify`).
    pub strays: Vec<StrayProcess>,
    /// ralph marked the current story passing because its check passed (`verify_marks_passing`).
    pub marked_by_ralph: bool,
    /// What changed beyond the current story's `passes`/`notes`, one sentence each.
    pub guard: Vec<String>,
    /// What the guard put back in prd.json, as one sentence naming the mode in force.
    pub guard_restored: Option<String>,
    /// Acceptance criteria the agent rewrote (put back by the guard, whatever `prd_guard` says).
    pub criteria_proposals: Vec<CriteriaProposal>,
    /// The agent's own commits, oldest first.
    pub agent_commits: Vec<String>,
    /// Files the iteration's checkpoint changes against the iteration's start (the working tree
    /// staged as the checkpoint stages it; not those already dirty and untouched).
    pub files_changed: Vec<String>,
    /// Every file in `files_changed` is one of the run's memory files (prd.json, progress.txt,
    /// progress-history/): the agent only wrote notes, not work (false when nothing changed).
    pub memory_only: bool,
    /// HEAD no longer contained the iteration's start, and what ralph did about it.
    pub history_rewrite: Option<HistoryRewrite>,
    /// Stories already satisfied: marked passing on an iteration that changed nothing but
    /// notes, and kept passing because their own `verify` (as the iteration started) passed
    /// on the tree as it is (docs/decisions.md, "Testers' findings").
    pub already_satisfied: Vec<String>,
    /// Stories that passed before an agent's history rewrite undid their `passes`: put back.
    pub passes_kept: Vec<String>,
    /// Commits the agent made and threw away, pinned under `refs/ralph/<run>/<n>/lost-<sha>`.
    pub lost_commits: Vec<String>,
    /// Commits ralph recorded (the iteration's start first) that the repository no longer has:
    /// the agent deleted the references that kept them and pruned them (see [`pruned`]).
    pub destroyed: Vec<String>,
    /// Local branches the agent deleted (put back at their old tips) or moved to a commit that
    /// no longer contains their old tip (the old tip kept under
    /// `refs/ralph/<run>/<n>/branch/<name>`), one sentence each.
    pub branches_kept: Vec<String>,
    /// What ralph did about HEAD leaving the feature branch, one sentence.
    pub branch_back: Option<String>,
    /// HEAD is still off the feature branch (ralph could not put it back): no pass counts.
    pub off_branch: bool,
    /// Stories marked passing whose pass did not count because the work is off the feature
    /// branch (set back to false).
    pub refused_off_branch: Vec<String>,
    /// HEAD moved to another branch: (before, after).
    pub branch_moved: Option<(Option<String>, Option<String>)>,
    /// Stories still open after the iteration.
    pub open_after: Vec<String>,
    /// Whether the iteration's story passes now.
    pub story_passes: bool,
    /// The working tree as inspect's last walk staged it: the checkpoint stages only what ralph
    /// writes after it ([`memory_paths`]) on top, instead of walking the tree again.
    pub staged: Option<crate::git::Staged>,
}

/// Why ralph did not count a story's `passes: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The iteration changed nothing but notes (prd.json, progress.txt, progress-history/): no
    /// work was done, whatever the agent says.
    NotesOnly,
    /// The iteration rewrote that story's acceptance criteria.
    CriteriaEdited,
    /// The agent failed (exited non-zero, or reported an error) and the story has no check
    /// that passed: the agent's own word was failure, so its `passes: true` is no evidence.
    AgentFailed,
}

/// Runs stage 3 (see the module docs). `agent_failed`: the agent exited non-zero or reported
/// an error; a pass it set on a story with no check is then refused ([`Refusal::AgentFailed`]).
///
/// # Errors
/// I/O errors restoring or rewriting prd.json, a verify command that cannot start, git errors.
pub async fn inspect(
    cx: &Cx<'_>,
    state: &mut State,
    a: &Assignment,
    start: &StartPoint,
    out: &mut Outputs,
    agent_failed: bool,
) -> anyhow::Result<Observation> {
    let mut obs = Observation::default();
    let snapshot = &a.snapshot;
    // An agent that deleted ralph's references and pruned (`git gc --prune=now`) can take the
    // iteration's start with it: the iteration is then counted from the newest commit ralph
    // recorded that HEAD still contains (or from nothing), and the loss is named.
    let counted_from;
    let original = start.head.clone();
    let start = match start.head.as_deref().filter(|h| !cx.repo.has_commit(h)) {
        Some(gone) => {
            let p = pruned(cx.repo, cx.paths, gone);
            obs.destroyed = p.missing;
            counted_from = StartPoint {
                head: p.base,
                ..start.clone()
            };
            &counted_from
        }
        None => start,
    };
    history(cx, a, start, &mut obs)?;
    keep_branches(cx, a, start, &mut obs, out)?;
    if let (false, Some(gone)) = (obs.destroyed.is_empty(), original) {
        obs.history_rewrite = Some(HistoryRewrite {
            start: gone,
            agent_head: cx.repo.head_sha()?.unwrap_or_default(),
            kept_at: None,
            restored: false,
            conflicts: Vec::new(),
            error: Some(format!(
                "{}, so {} no longer exist{}",
                HistoryRewrite::PRUNED,
                obs.destroyed.join(", "),
                if obs.destroyed.len() == 1 { "s" } else { "" }
            )),
        });
    }
    let mut after = read_back(cx, snapshot, &mut obs)?;
    if obs.history_rewrite.as_ref().is_some_and(|h| h.restored) {
        after = keep_passed(cx, snapshot, after, &mut obs)?;
    }
    // What the agent did, for the report (before ralph's gate or guard changed anything).
    // Only the stories' ids and passes are kept (not the parse, which ralph's rewrites of
    // `passes` then update in place instead of copying: 100,000 stories).
    let agent_view = after.as_ref().map(|l| AgentView::of(&l.prd));
    if let Some(agent) = &after {
        obs.criteria_proposals = criteria_proposals(snapshot, agent);
    }
    let mut flipped = flipped_ids(&snapshot.prd, prd_of(&after, snapshot), true);
    // The work, before a verify command adds its own files.
    let (work, staged) = work_files(cx, start, None)?;
    let notes_only = !work.iter().any(|p| !is_memory(cx, p));
    let mut io = GateIo {
        state,
        out,
        checks_ran: false,
    };
    after = verify_gate(cx, a, after, &flipped, notes_only, &mut obs, &mut io).await?;
    // Whether anything but ralph changed the tree since the walk above: a check may write files.
    let checks_ran = io.checks_ran;
    // A pass the check let through (or that has no check) still needs work behind it.
    let not_passed: HashSet<&str> = obs
        .verify
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.story_id.as_str())
        .chain(obs.unchecked.iter().map(String::as_str))
        .collect();
    flipped.retain(|id| !not_passed.contains(id.as_str()));
    after = refuse(
        cx,
        a,
        after,
        &mut flipped,
        (notes_only, agent_failed),
        &mut obs,
    )?;
    if obs.off_branch && !flipped.is_empty() {
        // The work is not on the feature branch: no pass counts for it.
        let edits: Vec<(&str, bool)> = flipped.iter().map(|id| (id.as_str(), false)).collect();
        after = Some(rewrite_passes(cx, after.take(), &edits)?);
        obs.refused_off_branch = std::mem::take(&mut flipped);
        obs.marked_by_ralph = false;
    }
    if let Some(agent) = &after {
        let view = agent_view
            .clone()
            .unwrap_or_else(|| AgentView::of(&agent.prd));
        obs.guard = guard_findings(snapshot, agent, &view);
        if !obs.unchecked.is_empty() {
            obs.guard.push(format!(
                "ralph was stopped before checking {}, so {} passes went back to false",
                obs.unchecked.join(", "),
                if obs.unchecked.len() == 1 {
                    "its"
                } else {
                    "their"
                }
            ));
        }
    }
    after = guard(cx, a, after, &mut obs)?;
    let reported = agent_view.unwrap_or_else(|| AgentView::of(prd_of(&after, snapshot)));
    obs.reverted = reported
        .flipped(&snapshot.prd, false)
        .into_iter()
        .filter(|id| !obs.passes_kept.contains(id))
        .collect();
    obs.flipped = flipped;
    if obs.marked_by_ralph {
        obs.flipped.push(a.story.id.clone());
    }
    let now = prd_of(&after, snapshot);
    obs.open_after = crate::run::policy::open_ids(now);
    obs.story_passes = now.story(&a.story.id).is_some_and(|s| s.passes);
    // What changed since the walk above: ralph's own writes to prd.json, and whatever a verify
    // command wrote (then the whole tree is walked again).
    git_delta(cx, start, (!checks_ran).then_some(&staged), &mut obs)?;
    Ok(obs)
}

/// Sets `passes` in prd.json as `edits` say (a byte-exact rewrite, written atomically) and
/// returns the file's new parse: `after` with the edits ([`store::with_passes`], no second parse
/// of a file that may hold 100,000 stories) when `after` is the parse of the file as it was,
/// else a parse.
///
/// # Errors
/// prd.json cannot be read or written, or an edit names a story it does not have.
fn rewrite_passes(
    cx: &Cx<'_>,
    after: Option<Arc<LoadedPrd>>,
    edits: &[(&str, bool)],
) -> anyhow::Result<Arc<LoadedPrd>> {
    let current = std::fs::read(&cx.paths.prd)?;
    let raw = store::set_passes_many(&current, edits, after.as_deref())?;
    write_atomic(&cx.paths.prd, &raw)?;
    Ok(match after {
        Some(prev) if prev.raw == current => store::with_passes(prev, raw, edits),
        _ => store::parse_shared(&cx.paths.prd, raw)?,
    })
}

/// Looks at what the agent did to history: commits it threw away (pinned under
/// `refs/ralph/<run>/<n>/lost-<sha>`), and a branch that no longer contains the iteration's
/// start, which is put back ([`crate::git::Repo::restore_history`]) with the agent's work on
/// top and its rewritten history kept under `refs/ralph/<run>/<n>/rewritten`.
fn history(
    cx: &Cx<'_>,
    a: &Assignment,
    start: &StartPoint,
    obs: &mut Observation,
) -> anyhow::Result<()> {
    obs.lost_commits = cx
        .repo
        .lost_commits(start.head.as_deref(), start.reflog_len)?;
    for sha in &obs.lost_commits {
        cx.repo.set_ref(
            &format!(
                "refs/ralph/{}/{}/lost-{}",
                cx.run_id,
                a.iteration,
                sha.get(..12).unwrap_or(sha)
            ),
            sha,
        )?;
    }
    let head = cx.repo.head_sha()?;
    if let Some(h) = &head {
        obs.agent_commits = cx.repo.commits_between(start.head.as_deref(), h)?;
    }
    let (Some(before), Some(now)) = (&start.head, &head) else {
        return Ok(());
    };
    // HEAD left the feature branch (`git checkout -b side`, a detached HEAD): ralph puts it
    // back with the agent's work on it, and leaves the branch the agent made as it is.
    let branch = cx.repo.current_branch();
    let onto = start
        .branch
        .as_deref()
        .filter(|b| branch.as_deref() != Some(*b));
    let left = branch.as_deref().unwrap_or("a detached HEAD").to_owned();
    if onto.is_some() {
        obs.branch_moved = Some((start.branch.clone(), branch.clone()));
    }
    if cx.repo.is_ancestor(before, now)? {
        let Some(feature) = onto else {
            return Ok(());
        };
        match cx.repo.advance_branch(feature, now) {
            Ok(_) => {
                obs.branch_back = Some(format!(
                    "ralph put HEAD back on {feature}, fast-forwarded to the agent's work ({}), and left {left} as it is",
                    now.get(..12).unwrap_or(now)
                ));
                return Ok(());
            }
            // The feature branch has commits the agent's HEAD has not: the restore below.
            Err(crate::git::GitError::Diverged { .. }) => {}
            Err(e) => {
                obs.branch_back = Some(format!(
                    "ralph could not put HEAD back on {feature}: {}",
                    e.to_string().lines().next().unwrap_or("")
                ));
                obs.off_branch = true;
                return Ok(());
            }
        }
    }
    if let Some(feature) = onto {
        // Whatever the feature branch had beyond the start stays reachable.
        if let Some(tip) = cx.repo.ref_sha(&format!("refs/heads/{feature}")) {
            if tip != *before {
                let pin = format!("refs/ralph/{}/{}/feature-tip", cx.run_id, a.iteration);
                cx.repo.set_ref(&pin, &tip)?;
            }
        }
    }
    let mut rewrite = HistoryRewrite {
        start: before.clone(),
        agent_head: now.clone(),
        kept_at: None,
        restored: false,
        conflicts: Vec::new(),
        error: None,
    };
    let keep_as = format!("refs/ralph/{}/{}/rewritten", cx.run_id, a.iteration);
    // Started on a detached HEAD (a `--parallel` worktree) and left on a branch the agent
    // checked out: HEAD is detached again first, so that putting the start back moves no
    // branch (the user's `main`, the run branch).
    if start.branch.is_none() && branch.is_some() {
        cx.repo.detach_head()?;
    }
    match cx
        .repo
        .restore_history(before, &keep_as, onto, &|p: &str| is_memory(cx, p))
    {
        Ok(restored) => {
            rewrite.kept_at = Some(keep_as);
            rewrite.restored = true;
            rewrite.conflicts = restored.conflicts;
            if let Some(feature) = onto {
                obs.branch_back = Some(format!(
                    "ralph put HEAD back on {feature} at the iteration's start with the agent's work re-applied on top, and left {left} as it is"
                ));
            } else if let (None, Some(moved)) = (&start.branch, &branch) {
                // A `--parallel` worktree (detached) whose agent checked a branch out and
                // committed on it: that branch holds the agent's commits now; name it.
                obs.branch_moved = Some((None, Some(moved.clone())));
                obs.branch_back = Some(format!(
                    "ralph detached HEAD again at the iteration's start with the agent's work re-applied on top, and left {moved} as it is (it now holds the agent's commits: see `git log {moved}`)"
                ));
            }
        }
        Err(e) => {
            tracing::warn!("could not put back the history the agent rewrote: {e}");
            rewrite.error = Some(e.to_string().lines().next().unwrap_or("").to_owned());
            obs.off_branch = onto.is_some();
        }
    }
    obs.history_rewrite = Some(rewrite);
    Ok(())
}

/// Puts back the local branches the agent deleted (at their tips as the iteration started), and
/// keeps the old tip of a branch the agent moved to a commit that does not contain it under
/// `refs/ralph/<run>/<n>/branch/<name>`: the user's branches, and their unmerged commits, are
/// not lost to an agent's `git branch -D`. The branch the iteration started on is left to
/// [`history`]. Each is named in `obs.branches_kept` and warned about.
///
/// # Errors
/// A reference that cannot be written.
fn keep_branches(
    cx: &Cx<'_>,
    a: &Assignment,
    start: &StartPoint,
    obs: &mut Observation,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    if start.branches.is_empty() {
        return Ok(());
    }
    let now: HashMap<String, String> = cx.repo.local_branches().into_iter().collect();
    for (name, tip) in &start.branches {
        if start.branch.as_deref() == Some(name.as_str()) {
            continue;
        }
        let short = tip.get(..12).unwrap_or(tip);
        let sentence = match now.get(name) {
            Some(t) if t == tip || cx.repo.is_ancestor(tip, t).unwrap_or(true) => continue,
            Some(_) => {
                let pin = format!("refs/ralph/{}/{}/branch/{name}", cx.run_id, a.iteration);
                cx.repo.set_ref(&pin, tip)?;
                format!(
                    "the agent moved branch {name} off its tip {short} (now at a commit that does not contain it); ralph kept the old tip as {pin}"
                )
            }
            None => {
                cx.repo.set_ref(&format!("refs/heads/{name}"), tip)?;
                format!("the agent deleted branch {name}; ralph put it back at {short}")
            }
        };
        out.warn_in(
            a.iteration,
            format!("iteration {}: {sentence}", a.iteration),
        );
        obs.branches_kept.push(sentence);
    }
    Ok(())
}

/// What an agent's pruning took (see [`pruned`]).
#[derive(Debug, Default)]
pub struct Pruned {
    /// The commits ralph recorded that the repository no longer has: the iteration's start
    /// first, then the ledger's checkpoints and heads, newest first.
    pub missing: Vec<String>,
    /// The newest commit the ledger records that HEAD still contains: where the agent's work is
    /// counted from (`None`: from the root).
    pub base: Option<String>,
}

/// After an agent deleted ralph's references and pruned the objects they kept, so that `start`
/// (the iteration's start) is no longer a commit: which recorded commits are gone, and which
/// recorded commit HEAD still contains. The ledger is ralph's record of them; git may have lost
/// them for good.
pub fn pruned(repo: &crate::git::Repo, paths: &crate::workspace::RunPaths, start: &str) -> Pruned {
    let mut out = Pruned {
        missing: vec![start.to_owned()],
        base: None,
    };
    let records = crate::history::History::load(paths, Some(repo))
        .map(|h| h.records)
        .unwrap_or_default();
    let head = repo.head_sha().ok().flatten();
    for r in records.iter().rev() {
        for sha in [&r.checkpoint_commit, &r.head_after, &r.head_before]
            .into_iter()
            .flatten()
        {
            if out.missing.contains(sha) || out.base.as_ref() == Some(sha) {
                continue;
            }
            if !repo.has_commit(sha) {
                out.missing.push(sha.clone());
            } else if out.base.is_none()
                && head
                    .as_deref()
                    .is_some_and(|h| repo.is_ancestor(sha, h).unwrap_or(false))
            {
                out.base = Some(sha.clone());
            }
        }
    }
    out
}

/// After a history rewrite was put back: a story that passed at the iteration's start and that
/// the rewrite set back to `passes: false` passes again (a pass ralph recorded is not undone by
/// a `git reset`).
fn keep_passed(
    cx: &Cx<'_>,
    snapshot: &LoadedPrd,
    after: Option<Arc<LoadedPrd>>,
    obs: &mut Observation,
) -> anyhow::Result<Option<Arc<LoadedPrd>>> {
    let Some(current) = &after else {
        return Ok(after);
    };
    let lost = flipped_ids(&snapshot.prd, &current.prd, false);
    if lost.is_empty() {
        return Ok(after);
    }
    let edits: Vec<(&str, bool)> = lost.iter().map(|id| (id.as_str(), true)).collect();
    let kept = rewrite_passes(cx, after, &edits)?;
    obs.passes_kept = lost;
    Ok(Some(kept))
}

/// The files the checkpoint would change against the iteration's start, less those that were
/// already dirty and are untouched.
fn work_files(
    cx: &Cx<'_>,
    start: &StartPoint,
    prior: Option<&crate::git::Staged>,
) -> anyhow::Result<(Vec<String>, crate::git::Staged)> {
    let staged = cx
        .repo
        .restage(prior, &memory_paths(cx.paths, cx.repo.root()))?;
    let changed = cx.repo.staged_diff(&staged, start.head.as_deref())?;
    Ok((
        start.dirty.changed_among(changed, &cx.paths.repo_root),
        staged,
    ))
}

/// The run's memory files (prd.json, progress.txt, progress-history/) relative to `root`, the
/// paths ralph itself writes between inspect's walk and the checkpoint (those outside `root`
/// left out): what the checkpoint stages on top of inspect's walk.
pub fn memory_paths(paths: &crate::workspace::RunPaths, root: &std::path::Path) -> Vec<String> {
    let history = paths
        .progress
        .parent()
        .map(|d| d.join(crate::progress::HISTORY_DIR));
    [
        Some(paths.prd.clone()),
        Some(paths.progress.clone()),
        history,
    ]
    .into_iter()
    .flatten()
    .filter_map(|p| {
        let rel = p
            .strip_prefix(root)
            .or_else(|_| p.strip_prefix(&paths.repo_root))
            .ok()?;
        let rel = rel.to_str()?.replace(std::path::MAIN_SEPARATOR, "/");
        (!rel.is_empty()).then_some(rel)
    })
    .collect()
}

/// The stories an earlier iteration (in this feature) changed more than notes for: an iteration
/// that only marks one of them passing finishes work already done (an agent that ran out of
/// turns before setting `passes`), which is not a claim without work. Records rebuilt from git
/// keep no files: a `progress` or `verify_failed` outcome stands for work there. Read once per
/// iteration, and only when a pass on a notes-only iteration needs it.
fn stories_with_work(cx: &Cx<'_>, a: &Assignment) -> HashSet<String> {
    let Ok(history) = crate::history::History::load(cx.paths, Some(cx.repo)) else {
        return HashSet::new();
    };
    let feature = a.snapshot.prd.branch_name.as_deref();
    history
        .records
        .into_iter()
        .filter(|r| {
            r.feature.as_deref() == feature
                && if r.from_git {
                    matches!(r.outcome, Outcome::Progress | Outcome::VerifyFailed)
                } else {
                    r.files_changed.iter().any(|p| !is_memory(cx, p))
                }
        })
        .map(|r| r.story_id)
        .collect()
}

/// Sets back to false every story in `flipped` whose pass this iteration did not earn (see
/// [`Refusal`]), and takes it out of `flipped`. `(notes_only, agent_failed)`: the iteration
/// changed nothing but notes; the agent exited non-zero or reported an error.
fn refuse(
    cx: &Cx<'_>,
    a: &Assignment,
    after: Option<Arc<LoadedPrd>>,
    flipped: &mut Vec<String>,
    (notes_only, agent_failed): (bool, bool),
    obs: &mut Observation,
) -> anyhow::Result<Option<Arc<LoadedPrd>>> {
    let rewritten: HashSet<&str> = obs
        .criteria_proposals
        .iter()
        .map(|p| p.story_id.as_str())
        .collect();
    let worked_on = if notes_only && !flipped.is_empty() {
        stories_with_work(cx, a)
    } else {
        HashSet::new()
    };
    // Work an earlier iteration did for another story may already satisfy this one: its own
    // check (as the story had it when the iteration started, not `--verify`), passing on the
    // tree as it is, is the evidence a notes-only iteration cannot give by itself.
    let own_check_passed = |id: &str| {
        a.snapshot
            .prd
            .story(id)
            .and_then(|s| s.verify.as_deref())
            .is_some_and(|cmd| {
                obs.verify
                    .iter()
                    .any(|v| v.story_id == id && v.passed && v.command == cmd)
            })
    };
    let satisfied: Vec<String> = flipped
        .iter()
        .filter(|id| notes_only && !worked_on.contains(*id) && own_check_passed(id))
        .cloned()
        .collect();
    obs.already_satisfied = satisfied;
    obs.refused = flipped
        .iter()
        .filter_map(|id| {
            // A failed agent's word is no evidence: only a check that passed is.
            let checked = obs.verify.iter().any(|v| &v.story_id == id && v.passed);
            if agent_failed && !checked {
                Some((id.clone(), Refusal::AgentFailed))
            } else if notes_only && !worked_on.contains(id) && !obs.already_satisfied.contains(id) {
                Some((id.clone(), Refusal::NotesOnly))
            } else if rewritten.contains(&id.as_str()) {
                Some((id.clone(), Refusal::CriteriaEdited))
            } else {
                None
            }
        })
        .collect();
    if obs.refused.is_empty() {
        return Ok(after);
    }
    let refused: HashSet<&str> = obs.refused.iter().map(|(id, _)| id.as_str()).collect();
    flipped.retain(|id| !refused.contains(id.as_str()));
    let edits: Vec<(&str, bool)> = obs
        .refused
        .iter()
        .map(|(id, _)| (id.as_str(), false))
        .collect();
    Ok(Some(rewrite_passes(cx, after, &edits)?))
}

fn prd_of<'a>(after: &'a Option<Arc<LoadedPrd>>, snapshot: &'a LoadedPrd) -> &'a Prd {
    after.as_ref().map(|l| &l.prd).unwrap_or(&snapshot.prd)
}

/// prd.json as the agent left it; `None` (and the snapshot restored) when it is unreadable or
/// invalid.
fn read_back(
    cx: &Cx<'_>,
    snapshot: &LoadedPrd,
    obs: &mut Observation,
) -> anyhow::Result<Option<Arc<LoadedPrd>>> {
    let parsed = match std::fs::read(&cx.paths.prd) {
        Ok(bytes) => store::parse_shared(&cx.paths.prd, bytes).map_err(|e| e.to_string()),
        Err(e) => Err(format!("prd.json could not be read: {e}")),
    };
    match parsed {
        Ok(l) => Ok(Some(l)),
        Err(why) => {
            obs.corrupted = Some(why);
            write_atomic(&cx.paths.prd, &snapshot.raw)
                .with_context(|| format!("cannot restore {}", cx.paths.prd.display()))?;
            Ok(None)
        }
    }
}

/// The verify gate: a story the agent marked passing must pass its check (its `verify` as it
/// was before the iteration, else `--verify`), or its `passes` goes
/// back to false (the rest of prd.json is left byte for byte as the agent wrote it). With
/// `verify_marks_passing`, the current story's passing check marks it passing (only its
/// `passes` bytes change), but not on an iteration that changed nothing but notes or rewrote
/// the story's acceptance criteria.
async fn verify_gate(
    cx: &Cx<'_>,
    a: &Assignment,
    mut after: Option<Arc<LoadedPrd>>,
    flipped: &[String],
    notes_only: bool,
    obs: &mut Observation,
    io: &mut GateIo<'_>,
) -> anyhow::Result<Option<Arc<LoadedPrd>>> {
    let Some(current) = &after else {
        return Ok(after);
    };
    // The check is the one the story had when the iteration started: an agent that rewrites
    // its story's `verify` (to `true`, say) does not choose its own test. Only a story the
    // agent added has no earlier check, and gets its own.
    let command_of = |now: &Prd, id: &str| {
        match a.snapshot.prd.story(id) {
            Some(before) => before.verify.clone(),
            None => now.story(id).and_then(|s| s.verify.clone()),
        }
        .or_else(|| cx.cfg.verify.clone())
    };
    // Stories with a check that a stop (Ctrl-C, SIGTERM) left unchecked: not passing either.
    let mut unchecked = Vec::new();
    for id in flipped {
        let Some(command) = command_of(&current.prd, id) else {
            continue;
        };
        // A check the stop cut short, or left unrun, said nothing about the story: unchecked,
        // not failed, and on record as interrupted.
        if cx.stop.stop.is_cancelled() {
            unchecked.push(id.clone());
            obs.verify.push(verify::interrupted(None, &command, id));
            continue;
        }
        let record = run_verify(cx, a.iteration, &command, id, obs, io).await?;
        if !record.passed && cx.stop.stop.is_cancelled() {
            unchecked.push(id.clone());
            obs.verify
                .push(verify::interrupted(Some(record), &command, id));
        } else {
            obs.verify.push(record);
        }
    }
    // One rule for every stop (docs/decisions.md, "Stop reasons and recovery"): a story marked
    // passing by an iteration that a stop cut short passes only on a check that ran to its end,
    // so one with no check at all goes back too, as it does after a SIGKILL (run/recover.rs).
    if cx.stop.stop.is_cancelled() {
        unchecked.extend(
            flipped
                .iter()
                .filter(|id| command_of(&current.prd, id).is_none())
                .cloned(),
        );
    }
    obs.stopped_in_gate = !unchecked.is_empty();
    obs.unchecked = unchecked.clone();
    let failed: Vec<&str> = obs
        .verify
        .iter()
        .filter(|v| !v.passed && !v.interrupted)
        .map(|v| v.story_id.as_str())
        .chain(unchecked.iter().map(String::as_str))
        .collect();
    if !failed.is_empty() {
        let edits: Vec<(&str, bool)> = failed.iter().map(|id| (*id, false)).collect();
        after = Some(rewrite_passes(cx, after.take(), &edits)?);
    }
    let id = &a.story.id;
    // ralph marks a story passing only on an iteration that did its work, against the
    // story's own criteria: a check that passes on an unchanged tree proves nothing new.
    let rewrote_own = obs.criteria_proposals.iter().any(|p| &p.story_id == id);
    if !cx.cfg.verify_marks_passing
        || cx.stop.stop.is_cancelled()
        || rewrote_own
        || (notes_only && !stories_with_work(cx, a).contains(id))
    {
        return Ok(after);
    }
    let checked = obs.verify.iter().any(|v| &v.story_id == id);
    let command = after
        .as_ref()
        .filter(|l| l.prd.story(id).is_some_and(|s| !s.passes && !checked))
        .and_then(|l| command_of(&l.prd, id));
    if let Some(command) = command {
        let record = run_verify(cx, a.iteration, &command, id, obs, io).await?;
        let passed = record.passed;
        // A stop cut the check short: the gate did not get to judge the iteration.
        if !passed && cx.stop.stop.is_cancelled() {
            obs.stopped_in_gate = true;
            obs.verify
                .push(verify::interrupted(Some(record.clone()), &command, id));
        }
        // A failing check here is not a failure of the iteration: the agent did not claim it.
        if passed {
            obs.verify.push(record);
            after = Some(rewrite_passes(cx, after.take(), &[(id.as_str(), true)])?);
            obs.marked_by_ralph = true;
        }
    }
    Ok(after)
}

/// Where the verify gate writes besides the observation: state.json (the strays a check left,
/// saved with the in-flight iteration as soon as they are killed) and the outputs.
struct GateIo<'s> {
    state: &'s mut State,
    out: &'s mut Outputs,
    /// Whether a check was started (it may have written to the tree).
    checks_ran: bool,
}

/// Runs one check; what it left running is killed, said, saved with the in-flight iteration and
/// kept for the record (`obs.strays`).
async fn run_verify(
    cx: &Cx<'_>,
    iteration: u32,
    command: &str,
    story_id: &str,
    obs: &mut Observation,
    io: &mut GateIo<'_>,
) -> anyhow::Result<VerifyRecord> {
    io.out.emit(RunEvent::VerifyStarted {
        iteration,
        story_id: story_id.to_owned(),
        command: command.to_owned(),
    });
    io.checks_ran = true;
    let verify::Checked { record, strays } = verify::run(cx, iteration, command, story_id).await?;
    io.state.note_strays(&cx.paths.ralph_dir, &strays)?;
    if !strays.is_empty() {
        io.out.warn_in(
            iteration,
            format!(
                "iteration {iteration}: killed {} {story_id}'s check left running: {}",
                super::execute::plural_processes(strays.len()),
                super::execute::describe_strays(&strays)
            ),
        );
    }
    obs.strays.extend(strays);
    io.out.emit(RunEvent::VerifyFinished {
        iteration,
        verify: record.clone(),
    });
    Ok(record)
}

/// What changed in prd.json beyond the current story's `passes` and `notes`: other stories'
/// `passes`, stories added or removed, fields edited (`reported` is prd.json as the agent left
/// it).
fn guard_findings(snapshot: &LoadedPrd, agent: &LoadedPrd, reported: &AgentView) -> Vec<String> {
    let mut out = Vec::new();
    // The same ids in the same order (the usual case) need no sets of 100,000 strings.
    let same_ids = snapshot.prd.user_stories.len() == reported.stories.len()
        && snapshot
            .prd
            .user_stories
            .iter()
            .zip(&reported.stories)
            .all(|(a, (id, _))| &a.id == id);
    let (removed, added): (Vec<String>, Vec<String>) = if same_ids {
        (Vec::new(), Vec::new())
    } else {
        let before_ids = story_ids(&snapshot.prd);
        let after_ids: BTreeSet<String> =
            reported.stories.iter().map(|(id, _)| id.clone()).collect();
        (
            before_ids.difference(&after_ids).cloned().collect(),
            after_ids.difference(&before_ids).cloned().collect(),
        )
    };
    if !removed.is_empty() {
        out.push(format!(
            "stories deleted from prd.json: {}",
            removed.join(", ")
        ));
    }
    if !added.is_empty() {
        out.push(format!("stories added to prd.json: {}", added.join(", ")));
    }
    if snapshot.raw != agent.raw {
        out.extend(prd_edits(&snapshot.value, &agent.value));
    }
    out
}

/// Puts back what the agent must not change: a story's `verify` and `acceptanceCriteria`,
/// whatever `prd_guard` says (only those fields with `report`); with `prd_guard = restore`,
/// prd.json as it was except the current story's `passes` and `notes` when the agent changed
/// anything else.
fn guard(
    cx: &Cx<'_>,
    a: &Assignment,
    after: Option<Arc<LoadedPrd>>,
    obs: &mut Observation,
) -> anyhow::Result<Option<Arc<LoadedPrd>>> {
    let Some(current) = &after else {
        return Ok(after);
    };
    let snapshot = &a.snapshot;
    let now_by_id = by_id(&current.prd);
    // A story's check is the user's, not the agent's: an edited `verify` is always put back,
    // whatever `prd_guard` says, or the next iteration would be judged by the agent's own check.
    let checks_edited: Vec<&str> = snapshot
        .prd
        .user_stories
        .iter()
        .filter(|before| {
            now_by_id
                .get(before.id.as_str())
                .is_some_and(|now| now.verify != before.verify)
        })
        .map(|before| before.id.as_str())
        .collect();
    if !checks_edited.is_empty() {
        obs.guard.push(format!(
            "the agent changed the verify command of {}; ralph put it back (a story's check is not the agent's to change)",
            checks_edited.join(", ")
        ));
    }
    // So are its acceptance criteria: put back too, the agent's text kept in the ledger for a
    // person to accept.
    let id = &a.story.id;
    if !obs.criteria_proposals.is_empty() {
        let ids: Vec<String> = obs
            .criteria_proposals
            .iter()
            .map(|p| {
                if &p.story_id == id {
                    format!("{id} (its own story)")
                } else {
                    p.story_id.clone()
                }
            })
            .collect();
        obs.guard.push(format!(
            "the agent rewrote the acceptance criteria of {}; ralph put them back and kept the proposed text in the ledger (criteria_proposals) for a person to accept",
            ids.join(", ")
        ));
    }
    if checks_edited.is_empty()
        && obs.criteria_proposals.is_empty()
        && cx.cfg.prd_guard != PrdGuard::Restore
    {
        return Ok(after);
    }
    // `prd_guard = report`: only what is always put back (verify, acceptance criteria), byte for
    // byte from the snapshot; the rest stays as the agent left it and is only reported.
    if cx.cfg.prd_guard != PrdGuard::Restore {
        let criteria: Vec<&str> = obs
            .criteria_proposals
            .iter()
            .map(|p| p.story_id.as_str())
            .collect();
        if let Some(raw) = put_back_fields(cx, snapshot, &checks_edited, &criteria)? {
            write_atomic(&cx.paths.prd, &raw)?;
            obs.guard_restored = Some(format!(
                "prd_guard = report: ralph put back only the {} named above; the other changes to prd.json stay as the agent made them",
                match (checks_edited.is_empty(), criteria.is_empty()) {
                    (false, false) => "verify commands and acceptance criteria",
                    (false, true) => "verify commands",
                    _ => "acceptance criteria",
                }
            ));
            return Ok(Some(store::parse_shared(&cx.paths.prd, raw)?));
        }
    }
    let beyond_story = !obs.guard.is_empty()
        || snapshot.prd.user_stories.iter().any(|before| {
            &before.id != id
                && now_by_id.get(before.id.as_str()).map(|s| s.passes) != Some(before.passes)
        });
    if !beyond_story {
        return Ok(after);
    }
    let mut raw = snapshot.raw.clone();
    if let Some(s) = current.prd.story(id) {
        raw = store::set_passes(&raw, id, s.passes)?;
        let old_notes = snapshot.prd.story(id).map(|o| o.notes.as_str());
        if old_notes != Some(s.notes.as_str()) {
            raw = store::set_notes(&raw, id, &s.notes)?;
        }
    }
    write_atomic(&cx.paths.prd, &raw)?;
    obs.guard_restored = Some(match cx.cfg.prd_guard {
        PrdGuard::Restore => "prd.json put back as it was except the current story's passes/notes (prd_guard = restore)".to_owned(),
        _ => "prd.json put back as it was except the current story's passes/notes: the agent added or removed a verify or acceptanceCriteria field, which ralph can only put back with the whole file (prd_guard = report)".to_owned(),
    });
    Ok(Some(store::parse_shared(&cx.paths.prd, raw)?))
}

/// prd.json as it is now with the `verify` of `checks` and the `acceptanceCriteria` of
/// `criteria` copied byte for byte from the snapshot; `None` when one of them was added or
/// removed (then only the whole file can be put back).
fn put_back_fields(
    cx: &Cx<'_>,
    snapshot: &LoadedPrd,
    checks: &[&str],
    criteria: &[&str],
) -> anyhow::Result<Option<Vec<u8>>> {
    let mut raw = std::fs::read(&cx.paths.prd)?;
    let fields = checks
        .iter()
        .map(|id| (*id, "verify"))
        .chain(criteria.iter().map(|id| (*id, "acceptanceCriteria")));
    for (id, key) in fields {
        match store::copy_member(&snapshot.raw, &raw, id, key)? {
            Some(next) => raw = next,
            None => return Ok(None),
        }
    }
    Ok(Some(raw))
}

/// The files the iteration's checkpoint changes, and whether the agent switched branches.
///
/// `prior`: the staging of the walk before the verify gate, when nothing but ralph's own writes
/// to the memory files changed the tree since (no check ran): only those are walked again.
fn git_delta(
    cx: &Cx<'_>,
    start: &StartPoint,
    prior: Option<&crate::git::Staged>,
    obs: &mut Observation,
) -> anyhow::Result<()> {
    let (files, staged) = work_files(cx, start, prior)?;
    obs.files_changed = files;
    obs.staged = Some(staged);
    obs.memory_only =
        !obs.files_changed.is_empty() && obs.files_changed.iter().all(|p| is_memory(cx, p));
    let branch = cx.repo.current_branch();
    if branch != start.branch && obs.branch_moved.is_none() {
        obs.branch_moved = Some((start.branch.clone(), branch));
    }
    Ok(())
}

/// Whether `rel` (relative to the repository root, `/`-separated) is prd.json, progress.txt or
/// a file under progress.txt's `progress-history/`.
fn is_memory(cx: &Cx<'_>, rel: &str) -> bool {
    let path = cx.paths.repo_root.join(rel);
    let history = cx
        .paths
        .progress
        .parent()
        .map(|d| d.join(crate::progress::HISTORY_DIR));
    path == cx.paths.prd
        || path == cx.paths.progress
        || history.is_some_and(|h| path.starts_with(h))
}

/// Story ids whose `passes` went from `!to` to `to` between `before` and `after` (linear in
/// the number of stories).
/// The stories of prd.json as the agent left it, in its order: each one's id and `passes`. What
/// the guard and the record need of the agent's version once ralph's own rewrites of `passes`
/// have changed the parse.
#[derive(Debug, Clone)]
struct AgentView {
    stories: Vec<(String, bool)>,
}

impl AgentView {
    fn of(prd: &Prd) -> AgentView {
        AgentView {
            stories: prd
                .user_stories
                .iter()
                .map(|s| (s.id.clone(), s.passes))
                .collect(),
        }
    }

    /// As [`flipped_ids`], for the agent's version.
    fn flipped(&self, before: &Prd, to: bool) -> Vec<String> {
        let before = by_id(before);
        self.stories
            .iter()
            .filter(|(id, passes)| {
                *passes == to && before.get(id.as_str()).is_some_and(|b| b.passes != to)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }
}

fn flipped_ids(before: &Prd, after: &Prd, to: bool) -> Vec<String> {
    let before = by_id(before);
    after
        .user_stories
        .iter()
        .filter(|s| s.passes == to)
        .filter(|s| before.get(s.id.as_str()).is_some_and(|b| b.passes != to))
        .map(|s| s.id.clone())
        .collect()
}

/// `prd`'s stories by id (the first of a duplicated id, as [`Prd::story`] finds it).
fn by_id(prd: &Prd) -> HashMap<&str, &Story> {
    let mut map = HashMap::with_capacity(prd.user_stories.len());
    for s in &prd.user_stories {
        map.entry(s.id.as_str()).or_insert(s);
    }
    map
}

/// Stories present before and after whose `acceptanceCriteria` the agent changed: the original
/// and the proposed text (the agent's value read as a list of strings; anything else counts as
/// no criteria).
fn criteria_proposals(snapshot: &LoadedPrd, agent: &LoadedPrd) -> Vec<CriteriaProposal> {
    // The same bytes: nothing was rewritten (a comparison, not a walk of every story).
    if snapshot.raw == agent.raw {
        return Vec::new();
    }
    let before = by_id(&snapshot.prd);
    agent
        .prd
        .user_stories
        .iter()
        .filter_map(|now| {
            let old = before.get(now.id.as_str())?;
            (old.acceptance_criteria != now.acceptance_criteria).then(|| CriteriaProposal {
                story_id: now.id.clone(),
                original: old.acceptance_criteria.clone(),
                proposed: now.acceptance_criteria.clone(),
            })
        })
        .collect()
}

/// The set of story ids in `prd`.
fn story_ids(prd: &Prd) -> BTreeSet<String> {
    prd.user_stories.iter().map(|s| s.id.clone()).collect()
}

/// Changes between two prd.json documents other than stories added or removed and other than
/// `passes` and `notes` (reported elsewhere, or allowed): top-level fields, and fields of each
/// story present in both. One line per changed story or for the top level, e.g.
/// `US-002 edited (title, acceptanceCriteria)`. The current story's edits count too: an agent
/// must not rewrite its own acceptance criteria.
fn prd_edits(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    use serde_json::{Map, Value};
    let empty = Map::new();
    let b = before.as_object().unwrap_or(&empty);
    let a = after.as_object().unwrap_or(&empty);
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
    fn stories(o: &Map<String, Value>) -> Vec<&Map<String, Value>> {
        o.get("userStories")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_object).collect())
            .unwrap_or_default()
    }
    let after_stories = stories(a);
    // Keyed by id: one pass over each side, not a search per story. Built only when a story is
    // not where it was (the usual edit keeps the order, and hashing 100,000 ids costs).
    let after_by_id = std::cell::OnceCell::new();
    let after_by_id = || -> &HashMap<&str, &Map<String, Value>> {
        after_by_id.get_or_init(|| {
            let mut map = HashMap::new();
            for story in &after_stories {
                if let Some(id) = story.get("id").and_then(Value::as_str) {
                    map.entry(id).or_insert(*story);
                }
            }
            map
        })
    };
    for (i, old) in stories(b).into_iter().enumerate() {
        let Some(id) = old.get("id").and_then(Value::as_str) else {
            continue;
        };
        let same_place = after_stories
            .get(i)
            .copied()
            .filter(|new| new.get("id").and_then(Value::as_str) == Some(id));
        let Some(new) = same_place.or_else(|| after_by_id().get(id).copied()) else {
            continue;
        };
        if old == new {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn stories(n: usize) -> Vec<Value> {
        (1..=n)
            .map(|i| {
                json!({"id": format!("US-{i:06}"), "title": format!("Story {i}"),
                       "acceptanceCriteria": [format!("c{i}")], "priority": i,
                       "passes": false, "notes": ""})
            })
            .collect()
    }

    #[test]
    fn prd_edits_lists_each_edited_story_once_whatever_the_order() {
        let n = 20_000;
        let before = json!({"project": "p", "branchName": "b", "userStories": stories(n)});
        let mut after_stories = stories(n);
        // Edits the file order cannot hide: story 7's criteria, story 19_999's title and
        // priority; passes and notes are not edits; a story removed is reported elsewhere.
        after_stories[6]["acceptanceCriteria"] = json!(["weaker"]);
        after_stories[19_998]["title"] = json!("renamed");
        after_stories[19_998]["priority"] = json!(1);
        after_stories[3]["passes"] = json!(true);
        after_stories[4]["notes"] = json!("a note");
        after_stories.remove(10);
        after_stories.reverse();
        let after = json!({"project": "q", "branchName": "b", "userStories": after_stories});
        let started = std::time::Instant::now();
        let edits = prd_edits(&before, &after);
        assert_eq!(
            edits,
            [
                "prd.json fields changed: project",
                "US-000007 edited (acceptanceCriteria)",
                "US-019999 edited (priority, title)",
            ]
        );
        // A comparison of every pair (4e8 here) takes minutes; one pass takes milliseconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn flipped_ids_pairs_stories_by_id() {
        let prd = |v: Value| -> Prd { serde_json::from_value(v).unwrap() };
        let before = prd(json!({"project": "p", "userStories": stories(3)}));
        let mut after = stories(3);
        after[0]["passes"] = json!(true);
        after.reverse();
        let after = prd(json!({"project": "p", "userStories": after}));
        assert_eq!(flipped_ids(&before, &after, true), ["US-000001"]);
        assert!(flipped_ids(&before, &after, false).is_empty());
    }
}
