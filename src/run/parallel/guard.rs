//! The run branch under `--parallel`: whether the checkout is still on it ([`switched`]), where
//! ralph's own steps left it ([`own_tip`]), and putting it back when something else moved it
//! ([`guard_branch`]: an agent's `git update-ref` from its worktree, an agent's commit or reset
//! in the user's checkout), keeping what it was moved to under a named ref.

use super::Board;
use crate::git::land as git_land;
use crate::protocol::{Outcome, StopReason};
use crate::run::session::Session;

/// The sentence saying the checkout is no longer on the run branch (the user switched it
/// during the run), or `None` while it is. ralph then lands nothing, moves no branch and
/// starts no story: the run stops.
pub fn switched(s: &Session, board: &Board) -> Option<String> {
    let run = board.branch.as_deref()?;
    let now = s.pre.repo.current_branch();
    (now.as_deref() != Some(run)).then(|| {
        format!(
            "the checkout was switched from the run branch {run} to {} during the run; ralph lands nothing and moves no branch: switch back (`git checkout {run}`) and run `ralph run` again (the stories in flight are recorded then, their work kept under refs/ralph/salvage/)",
            now.as_deref().unwrap_or("a detached HEAD")
        )
    })
}

/// Puts the run branch back where ralph left it (`board.tip`) when something else moved it
/// (an agent committing on it from its worktree, `git update-ref`, a `git checkout` of it with
/// `--ignore-other-worktrees`): the commits it was moved to are kept under
/// `refs/ralph/<run>/moved-branch-<n>` and the warning naming them is returned. Only the
/// reference moves back: the checkout's files and index are still those of `board.tip`. An
/// agent's `git -C <checkout> reset` that only moved the branch back (to an ancestor of
/// `board.tip`) keeps nothing: the branch and checkout go forward again (`git reset --keep`).
///
/// # Errors
/// git failing to read or write the references.
pub fn guard_branch(s: &Session, board: &mut Board) -> anyhow::Result<Option<String>> {
    let (Some(expected), Some(branch)) = (board.tip.clone(), board.branch.clone()) else {
        return Ok(None);
    };
    if switched(s, board).is_some() {
        // The checkout is on another branch: ralph moves no branch then (as [`switched`] says);
        // the next run, back on the run branch, guards it.
        return Ok(None);
    }
    let name = format!("refs/heads/{branch}");
    let Some(now) = s.pre.repo.ref_sha(&name) else {
        return Ok(None);
    };
    if now == expected {
        return Ok(None);
    }
    // A commit made in the checkout itself (the user's `git commit`, `--amend`, a `git reset`
    // during the run) is the user's, and the run builds on it: the checkout's HEAD reflog leads
    // from where ralph left the branch to where it is now, every step made here (an agent in a
    // worktree cannot write that reflog). The user may have staged the next change since: the
    // index says nothing. Without a HEAD reflog, a commit made here leaves the index at its
    // tree, unless the user staged something since.
    let here = s.pre.repo.current_branch().as_deref() == Some(branch.as_str())
        && s.pre
            .repo
            .moved_from_here(&expected, &now)
            .unwrap_or_else(|| s.pre.repo.index_is_tree_of(&now));
    if here {
        // Made in the checkout, but by an agent of this run (`git -C <checkout> commit`): its
        // reflog entries carry the agent's tag.
        let by_agents = s.pre.repo.agent_steps_here(&expected, &now);
        if by_agents.is_empty() {
            board.tip = Some(now);
            return Ok(None);
        }
        if let Some(warning) = moved_back(s, board) {
            return Ok(Some(warning));
        }
        return agents_in_checkout(s, board, (&branch, &expected, &now), &by_agents).map(Some);
    }
    let expected = &expected;
    let mut n = 1;
    let kept = loop {
        let kept = format!("refs/ralph/{}/moved-branch-{n}", s.run_id);
        if s.pre.repo.ref_sha(&kept).is_none() {
            break kept;
        }
        n += 1;
    };
    // The newest step was made in the checkout, on top of a move made elsewhere: the user
    // committed on an agent's move; both are kept under the ref, and the warning says so.
    let on_top = s.pre.repo.current_branch().as_deref() == Some(branch.as_str())
        && s.pre.repo.head_reflog_newest().as_deref() == Some(now.as_str());
    s.pre.repo.set_ref(&kept, &now)?;
    s.pre.repo.set_ref(&name, expected)?;
    let yours = if on_top {
        format!(
            "; a commit made in your checkout on top of that move is kept there too (your checkout's files are as you left them): `git cherry-pick` what is yours from {kept}"
        )
    } else {
        String::new()
    };
    Ok(Some(format!(
        "the run branch {branch} was moved behind ralph's back (to {}, by an agent working in a worktree); ralph put it back at {} and kept what it pointed at under {kept}{yours}",
        short(&now),
        short(expected)
    )))
}

/// An agent's steps in the user's checkout that only moved the run branch back
/// (`git -C <checkout> reset --hard HEAD~1`: the branch now at an ancestor of ralph's tip
/// `board.tip`, its HEAD reflog's steps tagged as an agent's): nothing of the agent's is to
/// keep, so the branch and checkout go forward again to ralph's tip with `git reset --keep`
/// (the user's uncommitted edits stay) and the warning saying so is returned. `None` when the
/// branch was not moved back that way, or the reset refuses (then [`guard_branch`] handles it).
pub fn moved_back(s: &Session, board: &Board) -> Option<String> {
    let (expected, branch) = (board.tip.as_deref()?, board.branch.as_deref()?);
    let now = s.pre.repo.ref_sha(&format!("refs/heads/{branch}"))?;
    let back = now != expected
        && s.pre.repo.current_branch().as_deref() == Some(branch)
        && s.pre.repo.is_ancestor(&now, expected).unwrap_or(false)
        && s.pre.repo.moved_from_here(expected, &now) == Some(true)
        && !s.pre.repo.agent_steps_here(expected, &now).is_empty();
    if !back {
        return None;
    }
    s.pre.repo.wait_index_unlocked();
    s.pre.repo.reset_keep(expected).ok()?;
    Some(format!(
        "an agent moved the run branch back in your checkout (git reset, to {}); ralph put it forward again at {} (`git reset --keep`: your uncommitted changes stay)",
        short(&now),
        short(expected)
    ))
}

/// The run branch's tip as ralph's own steps left it: HEAD, except that the commits an agent
/// made in the checkout on top of it (`git -C <checkout> commit` while ralph landed) are not
/// taken as ralph's, so that the next [`guard_branch`] (the next landing, launch or the run's
/// end) takes them off and names them instead of building on them unnoticed.
///
/// # Errors
/// git failing to read HEAD.
pub fn own_tip(s: &Session, board: &Board) -> anyhow::Result<Option<String>> {
    let head = s.pre.repo.head_sha()?;
    let Some(branch) = board.branch.as_deref() else {
        return Ok(head);
    };
    if s.pre.repo.current_branch().as_deref() != Some(branch) {
        // Switched away: the run branch's tip is its reference, not the other branch's HEAD.
        return Ok(s.pre.repo.ref_sha(&format!("refs/heads/{branch}")).or(head));
    }
    Ok(s.pre.repo.head_before_agent_steps().or(head))
}

/// Takes the commits agents of this run made in the user's checkout (`git -C <checkout>
/// commit`: `by_agents`, found in its HEAD reflog) off the run branch: the branch's tip `now`
/// (with them, and anything committed on top of them) is kept under
/// `refs/ralph/salvage/<run>/checkout-commits` (`-2`, …), and the branch and the checkout go
/// back to `expected` with `git reset --keep` (files the user changed and the reset does not
/// touch stay as they are). When the reset refuses (the user changed a file the agents'
/// commits changed), nothing moves and the run stops for the user, as a landing refused for a
/// dirty checkout does. Returns the warning for the record and the terminal.
///
/// # Errors
/// git failing to read or write the references.
fn agents_in_checkout(
    s: &Session,
    board: &mut Board,
    (branch, expected, now): (&str, &str, &str),
    by_agents: &[String],
) -> anyhow::Result<String> {
    let shas: Vec<&str> = by_agents.iter().map(|c| short(c)).collect();
    let salvage = git_land::salvage(&s.pre.repo, &s.run_id, "checkout-commits", now)?;
    let what = format!(
        "the run branch {branch} was moved by an agent of this run committing in your checkout (`git -C`), not in its worktree: {} ({} in your checkout's HEAD reflog; {}), kept in {salvage}",
        shas.join(", "),
        crate::process::REFLOG_ACTION_PREFIX.trim_end(),
        makers(s, board, expected, now),
    );
    // `git reset --keep` needs the index: an agent's git command may hold it for a moment.
    s.pre.repo.wait_index_unlocked();
    match s.pre.repo.reset_keep(expected) {
        Ok(()) => {
            board.tip = Some(expected.to_owned());
            let restored = restore_swept_edits(s, expected, now);
            let back = if restored.is_empty() {
                String::new()
            } else {
                format!(
                    "; your uncommitted changes to {} that the agent's commit had taken in are back in your checkout, uncommitted, as they were in {salvage}",
                    restored.join(", ")
                )
            };
            Ok(format!(
                "{what}; ralph took {} off the branch and your checkout (`git reset --keep {}`: your uncommitted changes stay){back}",
                if shas.len() == 1 { "it" } else { "them" },
                short(expected)
            ))
        }
        Err(e) => {
            board.tip = Some(now.to_owned());
            let message = format!(
                "{what}; ralph cannot take {} off without touching a change of yours in the checkout, so it moved nothing and stops: {e}\nhint: commit or put away your change, then `git reset --keep {}` and run ralph again",
                if shas.len() == 1 { "it" } else { "them" },
                short(expected)
            );
            board.stopping.get_or_insert(StopReason::NeedsHuman {
                outcome: Outcome::LandingRefused,
                iteration: s.state.iteration,
                message: Some(message.clone()),
            });
            Ok(message)
        }
    }
}

/// Who made the agents' commits in the checkout from `expected` to `now`, as far as ralph can
/// tell: the iterations their reflog entries name (with their stories when still in flight), or
/// the iterations in flight, none of which can be told apart. Never a story's own work: these
/// commits are kept apart (`checkout-commits`), not as any story's next start.
fn makers(s: &Session, board: &Board, expected: &str, now: &str) -> String {
    let story = |n: u32| {
        board
            .flights
            .iter()
            .find(|f| f.iteration == n)
            .map(|f| format!("iteration {n} ({})", f.story_id))
            .unwrap_or_else(|| format!("iteration {n}"))
    };
    let named = s.pre.repo.agent_step_iterations(&s.run_id, expected, now);
    if !named.is_empty() {
        let who: Vec<String> = named.into_iter().map(story).collect();
        return format!("made by the agent of {}", who.join(" and "));
    }
    let running: Vec<String> = board.flights.iter().map(|f| story(f.iteration)).collect();
    if running.is_empty() {
        "made by an agent ralph cannot tell apart".to_owned()
    } else {
        format!(
            "made while {} ran, by an agent ralph cannot tell apart",
            running.join(" and ")
        )
    }
}

/// After `git reset --keep <expected>` took agents' checkout commits (`now`) off: the files that
/// were the user's uncommitted changes when the run started (`--allow-dirty`) and that those
/// commits swept in get their content at `now` back in the working tree (uncommitted), when the
/// reset left them as they are at `expected` (nothing changed them since). Returns the paths
/// put back (relative to the repository root); a path git cannot read is left as it is.
fn restore_swept_edits(s: &Session, expected: &str, now: &str) -> Vec<String> {
    let mut restored = Vec::new();
    for rel in &s.dirty_at_start {
        let (Ok(Some(swept)), Ok(before)) = (
            s.pre.repo.file_at(now, rel),
            s.pre.repo.file_at(expected, rel),
        ) else {
            continue;
        };
        if before.as_ref() == Some(&swept) {
            continue;
        }
        let path = s.pre.paths.repo_root.join(rel);
        if std::fs::read(&path).ok() != before {
            continue;
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match std::fs::write(&path, &swept) {
            Ok(()) => restored.push(rel.clone()),
            Err(e) => tracing::warn!("cannot put back {}: {e}", path.display()),
        }
    }
    restored
}

pub(super) fn short(sha: &str) -> &str {
    sha.get(..8).unwrap_or(sha)
}
