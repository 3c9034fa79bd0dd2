//! Stage 3 of an iteration: look at what the agent left. prd.json is read back (restored from
//! the snapshot when the agent broke it); the verify gate checks every story the agent marked
//! passing (and, with `verify_marks_passing`, the current story); the prd.json guard lists what
//! changed beyond the story's `passes` and `notes` (and puts it back with `prd_guard = restore`);
//! git says which commits and files are the iteration's own and whether history was rewritten.
//! Every rewrite of prd.json here changes only the bytes it must, through
//! [`crate::fsutil::write_atomic`].

use std::collections::BTreeSet;

use anyhow::Context as _;

use super::prepare::{Assignment, StartPoint};
use super::{verify, Cx};
use crate::fsutil::write_atomic;
use crate::output::Outputs;
use crate::prd::model::Prd;
use crate::prd::store::{self, LoadedPrd};
use crate::protocol::{PrdGuard, RunEvent, VerifyRecord};

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
    /// The verify commands run, in order.
    pub verify: Vec<VerifyRecord>,
    /// Stories the agent marked passing whose check a stop (Ctrl-C, SIGTERM) left unrun: set
    /// back to not passing.
    pub unchecked: Vec<String>,
    /// ralph marked the current story passing because its check passed (`verify_marks_passing`).
    pub marked_by_ralph: bool,
    /// What changed beyond the current story's `passes`/`notes`, one sentence each.
    pub guard: Vec<String>,
    /// The guard put prd.json back (`prd_guard = restore`).
    pub guard_restored: bool,
    /// The agent's own commits, oldest first.
    pub agent_commits: Vec<String>,
    /// Files the iteration changed (not those already dirty and untouched).
    pub files_changed: Vec<String>,
    /// Every file in `files_changed` is one of the run's memory files (prd.json, progress.txt,
    /// progress-history/): the agent only wrote notes, not work (false when nothing changed).
    pub memory_only: bool,
    /// HEAD no longer contains the iteration's start (its sha).
    pub history_rewritten: Option<String>,
    /// Commits the agent made and threw away, pinned under `refs/ralph/<run>/<n>/lost-<sha>`.
    pub lost_commits: Vec<String>,
    /// HEAD moved to another branch: (before, after).
    pub branch_moved: Option<(Option<String>, Option<String>)>,
    /// Stories still open after the iteration.
    pub open_after: Vec<String>,
    /// Whether the iteration's story passes now.
    pub story_passes: bool,
}

/// Runs stage 3 (see the module docs).
///
/// # Errors
/// I/O errors restoring or rewriting prd.json, a verify command that cannot start, git errors.
pub async fn inspect(
    cx: &Cx<'_>,
    a: &Assignment,
    start: &StartPoint,
    out: &mut Outputs,
) -> anyhow::Result<Observation> {
    let mut obs = Observation::default();
    let snapshot = &a.snapshot;
    let mut after = read_back(cx, snapshot, &mut obs)?;
    let flipped = flipped_ids(&snapshot.prd, prd_of(&after, snapshot), true);
    // What the agent did, for the report (before ralph's gate or guard changed anything).
    let agent_prd = after.as_ref().map(|l| l.prd.clone());
    after = verify_gate(cx, a, after, &flipped, &mut obs, out).await?;
    if let Some(agent) = &after {
        obs.guard = guard_findings(snapshot, agent, agent_prd.as_ref().unwrap_or(&agent.prd));
        if !obs.unchecked.is_empty() {
            obs.guard.push(format!(
                "ralph was stopped before checking {}, so their passes went back to false",
                obs.unchecked.join(", ")
            ));
        }
    }
    after = guard(cx, a, after, &mut obs)?;
    let reported = agent_prd.as_ref().unwrap_or(prd_of(&after, snapshot));
    obs.reverted = flipped_ids(&snapshot.prd, reported, false);
    obs.flipped = flipped
        .into_iter()
        .filter(|id| !obs.verify.iter().any(|v| !v.passed && &v.story_id == id))
        .filter(|id| !obs.unchecked.contains(id))
        .collect();
    if obs.marked_by_ralph {
        obs.flipped.push(a.story.id.clone());
    }
    let now = prd_of(&after, snapshot);
    obs.open_after = crate::run::policy::open_ids(now);
    obs.story_passes = now.story(&a.story.id).is_some_and(|s| s.passes);
    git_delta(cx, start, &mut obs)?;
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
    Ok(obs)
}

fn prd_of<'a>(after: &'a Option<LoadedPrd>, snapshot: &'a LoadedPrd) -> &'a Prd {
    after.as_ref().map(|l| &l.prd).unwrap_or(&snapshot.prd)
}

/// prd.json as the agent left it; `None` (and the snapshot restored) when it is unreadable or
/// invalid.
fn read_back(
    cx: &Cx<'_>,
    snapshot: &LoadedPrd,
    obs: &mut Observation,
) -> anyhow::Result<Option<LoadedPrd>> {
    let parsed = match std::fs::read(&cx.paths.prd) {
        Ok(bytes) => store::parse_bytes(&cx.paths.prd, &bytes).map_err(|e| e.to_string()),
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
/// `passes` bytes change).
async fn verify_gate(
    cx: &Cx<'_>,
    a: &Assignment,
    mut after: Option<LoadedPrd>,
    flipped: &[String],
    obs: &mut Observation,
    out: &mut Outputs,
) -> anyhow::Result<Option<LoadedPrd>> {
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
        if cx.stop.stop.is_cancelled() {
            unchecked.push(id.clone());
            continue;
        }
        let record = run_verify(cx, a.iteration, &command, id, out).await?;
        // A check the stop cut short said nothing about the story: unchecked, not failed.
        if !record.passed && cx.stop.stop.is_cancelled() {
            unchecked.push(id.clone());
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
    obs.unchecked = unchecked.clone();
    let failed: Vec<&str> = obs
        .verify
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.story_id.as_str())
        .chain(unchecked.iter().map(String::as_str))
        .collect();
    if !failed.is_empty() {
        let mut raw = std::fs::read(&cx.paths.prd)?;
        for id in &failed {
            raw = store::set_passes(&raw, id, false)?;
        }
        write_atomic(&cx.paths.prd, &raw)?;
        after = Some(store::parse_bytes(&cx.paths.prd, &raw)?);
    }
    if !cx.cfg.verify_marks_passing || cx.stop.stop.is_cancelled() {
        return Ok(after);
    }
    let id = &a.story.id;
    let checked = obs.verify.iter().any(|v| &v.story_id == id);
    let command = after
        .as_ref()
        .filter(|l| l.prd.story(id).is_some_and(|s| !s.passes && !checked))
        .and_then(|l| command_of(&l.prd, id));
    if let Some(command) = command {
        let record = run_verify(cx, a.iteration, &command, id, out).await?;
        let passed = record.passed;
        // A failing check here is not a failure of the iteration: the agent did not claim it.
        if passed {
            obs.verify.push(record);
            let raw = store::set_passes(&std::fs::read(&cx.paths.prd)?, id, true)?;
            write_atomic(&cx.paths.prd, &raw)?;
            after = Some(store::parse_bytes(&cx.paths.prd, &raw)?);
            obs.marked_by_ralph = true;
        }
    }
    Ok(after)
}

async fn run_verify(
    cx: &Cx<'_>,
    iteration: u32,
    command: &str,
    story_id: &str,
    out: &mut Outputs,
) -> anyhow::Result<VerifyRecord> {
    out.emit(RunEvent::VerifyStarted {
        story_id: story_id.to_owned(),
        command: command.to_owned(),
    });
    let record = verify::run(cx, iteration, command, story_id).await?;
    out.emit(RunEvent::VerifyFinished {
        verify: record.clone(),
    });
    Ok(record)
}

/// What changed in prd.json beyond the current story's `passes` and `notes`: other stories'
/// `passes`, stories added or removed, fields edited (`reported` is prd.json as the agent left
/// it).
fn guard_findings(snapshot: &LoadedPrd, agent: &LoadedPrd, reported: &Prd) -> Vec<String> {
    let mut out = Vec::new();
    let before_ids = story_ids(&snapshot.prd);
    let after_ids = story_ids(reported);
    let removed: Vec<String> = before_ids.difference(&after_ids).cloned().collect();
    let added: Vec<String> = after_ids.difference(&before_ids).cloned().collect();
    if !removed.is_empty() {
        out.push(format!(
            "stories deleted from prd.json: {}",
            removed.join(", ")
        ));
    }
    if !added.is_empty() {
        out.push(format!("stories added to prd.json: {}", added.join(", ")));
    }
    out.extend(prd_edits(&snapshot.value, &agent.value));
    out
}

/// With `prd_guard = restore`, or whatever it says when the agent changed a story's `verify`,
/// puts prd.json back as it was except the current story's `passes` and `notes` when the agent
/// changed anything else.
fn guard(
    cx: &Cx<'_>,
    a: &Assignment,
    after: Option<LoadedPrd>,
    obs: &mut Observation,
) -> anyhow::Result<Option<LoadedPrd>> {
    let Some(current) = &after else {
        return Ok(after);
    };
    let snapshot = &a.snapshot;
    // A story's check is the user's, not the agent's: an edited `verify` is always put back,
    // whatever `prd_guard` says, or the next iteration would be judged by the agent's own check.
    let checks_edited: Vec<&str> = snapshot
        .prd
        .user_stories
        .iter()
        .filter(|before| {
            current
                .prd
                .story(&before.id)
                .is_some_and(|now| now.verify != before.verify)
        })
        .map(|before| before.id.as_str())
        .collect();
    if !checks_edited.is_empty() {
        obs.guard.push(format!(
            "the agent changed the verify command of {}; ralph put it back (a story's check is not the agent's to change)",
            checks_edited.join(", ")
        ));
    } else if cx.cfg.prd_guard != PrdGuard::Restore {
        return Ok(after);
    }
    let id = &a.story.id;
    let beyond_story = !obs.guard.is_empty()
        || snapshot.prd.user_stories.iter().any(|before| {
            &before.id != id
                && current.prd.story(&before.id).map(|s| s.passes) != Some(before.passes)
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
    obs.guard_restored = true;
    Ok(Some(store::parse_bytes(&cx.paths.prd, &raw)?))
}

/// The agent's commits and changed files, and whether it rewrote history or switched branches.
fn git_delta(cx: &Cx<'_>, start: &StartPoint, obs: &mut Observation) -> anyhow::Result<()> {
    let head = cx.repo.head_sha()?;
    obs.agent_commits = match &head {
        Some(h) => cx.repo.commits_between(start.head.as_deref(), h)?,
        None => Vec::new(),
    };
    obs.files_changed =
        start
            .dirty
            .changed_since(cx.repo, start.head.as_deref(), &cx.paths.repo_root)?;
    obs.memory_only =
        !obs.files_changed.is_empty() && obs.files_changed.iter().all(|p| is_memory(cx, p));
    if let (Some(before), Some(now)) = (&start.head, &head) {
        if !cx.repo.is_ancestor(before, now)? {
            obs.history_rewritten = Some(before.clone());
        }
    }
    let branch = cx.repo.current_branch();
    if branch != start.branch {
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
    let stories = |o: &Map<String, Value>| -> Vec<Map<String, Value>> {
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
