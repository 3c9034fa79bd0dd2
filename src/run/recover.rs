//! An iteration that a killed ralph left in flight (state.json still names it): its agent's
//! leftover processes are killed, a prd.json it left broken is restored from the iteration's
//! snapshot, and its changes are written down as an `interrupted` iteration through the same
//! commit stage as every iteration.

use chrono::Utc;

use super::feedback::Feedback;
use super::iteration::commit::{self, Draft, Sinks};
use crate::config::RunConfig;
use crate::fsutil::write_atomic;
use crate::git::Repo;
use crate::history::History;
use crate::output::Outputs;
use crate::prd::store;
use crate::process::{agent_tag, group_is_tagged, kill_tagged};
use crate::protocol::{LedgerRecord, Outcome};
use crate::state::{InFlight, State};
use crate::workspace::RunPaths;

/// Recovers the in-flight iteration of `state`, if any (see the module docs). Returns the
/// feedback for that story's next attempt.
///
/// # Errors
/// prd.json, git, ledger or state.json could not be written.
pub async fn recover(
    repo: &Repo,
    paths: &RunPaths,
    state: &mut State,
    cfg: &RunConfig,
    out: &mut Outputs,
) -> anyhow::Result<Vec<Feedback>> {
    let Some(flight) = state.in_flight.clone() else {
        return Ok(Vec::new());
    };
    kill_leftovers(&flight, cfg, out).await;
    // A prd.json the killed agent left broken is restored from the iteration's snapshot, so the
    // run can go on (the checkpoint below commits the restored file).
    let mut restored_prd = false;
    if store::load(&paths.prd).is_err() {
        if let Ok(raw) = std::fs::read(paths.prd_snapshot()) {
            if store::parse_bytes(&paths.prd, &raw).is_ok() {
                write_atomic(&paths.prd, &raw)?;
                restored_prd = true;
                out.warn(format!(
                    "prd.json was invalid after the interrupted iteration {}; restored it from the iteration's snapshot",
                    flight.iteration
                ));
            }
        }
    }
    let unchecked = if history_has(paths, &flight) {
        Vec::new()
    } else {
        unchecked_passes(paths)?
    };
    if !unchecked.is_empty() {
        out.warn(format!(
            "iteration {} was interrupted before ralph checked the stories it marked passing: {} set back to not passing, until an iteration passes its check",
            flight.iteration,
            unchecked.join(", ")
        ));
    }
    let history = History::load(paths, None).unwrap_or(History {
        records: Vec::new(),
        source: crate::history::Source::Empty,
    });
    let mut feedback = Vec::new();
    if !history.contains(&flight.run_id, flight.iteration) {
        let mut draft = draft(repo, paths, &flight, cfg, restored_prd)?;
        if !unchecked.is_empty() {
            let note = format!(
                "; ralph was killed before checking {}, so their passes went back to false",
                unchecked.join(", ")
            );
            if let Some(m) = draft.record.message.as_mut() {
                m.push_str(&note);
            }
            draft.progress_summary.push_str(&note);
            draft.record.passes_reverted = unchecked.clone();
        }
        let record = commit::commit(
            Sinks {
                repo,
                paths,
                remote: None,
            },
            state,
            draft,
        )?
        .record;
        out.warn(format!(
            "iteration {} ({}) was interrupted when ralph was killed; its changes are kept in {}",
            flight.iteration,
            flight.story_id,
            record
                .checkpoint_commit
                .as_deref()
                .map(|s| s.get(..8).unwrap_or(s))
                .unwrap_or("the existing commits")
        ));
        feedback.push(Feedback::about(
            &flight.story_id,
            format!(
                "The previous iteration ({}) was interrupted; its partial changes were committed as a checkpoint. Check `git log` and `git diff HEAD~1` and continue from there.",
                flight.story_id
            ),
        ));
    }
    state.iteration = state.iteration.max(flight.iteration);
    state.in_flight = None;
    state.save(&paths.ralph_dir)?;
    Ok(feedback)
}

/// Whether the ledger already has the in-flight iteration (ralph was killed after its commit
/// point): then it was checked and written down, and nothing is undone.
fn history_has(paths: &RunPaths, flight: &InFlight) -> bool {
    History::load(paths, None).is_ok_and(|h| h.contains(&flight.run_id, flight.iteration))
}

/// Stories prd.json marks passing that did not pass when the interrupted iteration started (its
/// snapshot, `.ralph/prd.snapshot.json`): ralph was killed before its verify gate judged them,
/// so their `passes` goes back to false (only those bytes change). Returns their ids.
///
/// # Errors
/// prd.json could not be rewritten.
fn unchecked_passes(paths: &RunPaths) -> anyhow::Result<Vec<String>> {
    let (Ok(now), Ok(raw_before)) = (store::load(&paths.prd), std::fs::read(paths.prd_snapshot()))
    else {
        return Ok(Vec::new());
    };
    let Ok(before) = store::parse_bytes(&paths.prd_snapshot(), &raw_before) else {
        return Ok(Vec::new());
    };
    let ids: Vec<String> = now
        .prd
        .user_stories
        .iter()
        .filter(|s| s.passes && before.prd.story(&s.id).is_some_and(|b| !b.passes))
        .map(|s| s.id.clone())
        .collect();
    if ids.is_empty() {
        return Ok(ids);
    }
    let mut raw = std::fs::read(&paths.prd)?;
    for id in &ids {
        raw = store::set_passes(&raw, id, false)?;
    }
    write_atomic(&paths.prd, &raw)?;
    Ok(ids)
}

/// Kills the interrupted agent's processes: every one carrying its tag, and its recorded process
/// group when that group still is the agent's.
async fn kill_leftovers(flight: &InFlight, cfg: &RunConfig, out: &mut Outputs) {
    let tag = agent_tag(&flight.run_id, flight.iteration);
    // Processes the agent started in groups of their own (the native loop's commands, setsid)
    // carry its tag too.
    let stray = kill_tagged(&tag);
    if stray > 0 {
        out.warn(format!(
            "killed {stray} process{} left running by the interrupted iteration's agent",
            if stray == 1 { "" } else { "es" }
        ));
    }
    let Ok(pgid) = i32::try_from(flight.pid) else {
        return;
    };
    if pgid <= 0 || !crate::process::group_alive(pgid) {
        return;
    }
    if group_is_tagged(pgid, &tag) {
        crate::process::kill_group(pgid, cfg.kill_grace).await;
        out.warn(format!(
            "killed the agent process group {pgid} left running by the previous ralph"
        ));
    } else {
        out.warn(format!(
            "process group {pgid} recorded in state.json is no longer ralph's agent; left it alone"
        ));
    }
}

/// The interrupted iteration's record: what git shows it changed.
fn draft(
    repo: &Repo,
    paths: &RunPaths,
    flight: &InFlight,
    cfg: &RunConfig,
    restored_prd: bool,
) -> anyhow::Result<Draft> {
    let head = repo.head_sha()?;
    let prd = store::load(&paths.prd).ok();
    let mut r = LedgerRecord::new(
        &flight.run_id,
        flight.iteration,
        &flight.story_id,
        Outcome::Interrupted,
        flight.started_at,
    );
    r.story_title = prd
        .as_ref()
        .and_then(|l| l.prd.story(&flight.story_id).map(|s| s.title.clone()))
        .unwrap_or_default();
    r.feature = prd.and_then(|l| l.prd.branch_name);
    r.backend = cfg.agent.as_str().to_string();
    r.model = cfg.model.clone();
    r.head_before = flight.start_sha.clone();
    r.commits = match &head {
        Some(h) => repo.commits_between(flight.start_sha.as_deref(), h)?,
        None => Vec::new(),
    };
    r.files_changed = match &flight.start_sha {
        Some(h) => repo.changed_files(h)?,
        None => repo.dirty_paths()?,
    };
    let transcript = paths.transcript(&flight.run_id, flight.iteration);
    r.transcript = Some(paths.rel(&transcript));
    // How long it ran, as far as its transcript saw (ralph was killed at some point after).
    if let Ok(t) = crate::transcript::read(&transcript) {
        let last_ms = t
            .lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("t_ms").and_then(serde_json::Value::as_u64))
            .max()
            .unwrap_or(0);
        r.duration_s = last_ms as f64 / 1000.0;
        // Lines still in ralph's write buffer died with it: the file's last write is a later
        // sign of life.
        if let Some(written) = std::fs::metadata(&transcript)
            .and_then(|m| m.modified())
            .ok()
            .map(chrono::DateTime::<Utc>::from)
        {
            let secs = (written - flight.started_at).num_milliseconds() as f64 / 1000.0;
            r.duration_s = r.duration_s.max(secs);
        }
        if let Some(backend) = t.meta.get("backend").and_then(serde_json::Value::as_str) {
            r.backend = backend.to_owned();
        }
    }
    let mut message = "ralph was stopped during this iteration; its changes were checkpointed when ralph restarted".to_string();
    if restored_prd {
        message.push_str("; prd.json was invalid and was restored from the iteration's snapshot");
    }
    r.message = Some(message.clone());
    r.ended_at = Utc::now();
    Ok(Draft {
        record: r,
        progress_summary: message,
        subject: format!(
            "ralph: iteration {} ({}) checkpoint after restart",
            flight.iteration, flight.story_id
        ),
        body: "Outcome: interrupted (ralph was killed during this iteration).".to_string(),
        clock: None,
        signal_at: None,
    })
}
