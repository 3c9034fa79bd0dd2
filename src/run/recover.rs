//! An iteration that a killed ralph left in flight (state.json still names it): its agent's and
//! its verify commands' leftover processes are killed (and listed in its record), a prd.json it
//! left broken is restored from the iteration's snapshot, the stories it marked passing are
//! judged by their checks run now on the work it left (one with no check goes back to not
//! passing, as after a SIGTERM), and its changes are written down as an `interrupted` iteration
//! through the same commit stage as every iteration.

use chrono::Utc;

use super::feedback::Feedback;
use super::iteration::commit::{self, Draft, Sinks};
use super::iteration::execute::{describe_strays, plural_processes, stray_records};
use super::iteration::verify::Check;
use crate::config::RunConfig;
use crate::fsutil::write_atomic;
use crate::git::Repo;
use crate::history::History;
use crate::output::Outputs;
use crate::prd::store;
use crate::process::{agent_tag, group_is_tagged, StopSignals};
use crate::protocol::{LedgerRecord, Outcome, StrayFound, StrayProcess, VerifyRecord};
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
    stop: &StopSignals,
    sandbox: Option<&crate::process::sandbox::Sandbox>,
    out: &mut Outputs,
) -> anyhow::Result<Vec<Feedback>> {
    let Some(flight) = state.in_flight.clone() else {
        return Ok(Vec::new());
    };
    // Saved with the in-flight iteration at once, with those the killed ralph saved (after its
    // agent, after its checks): a restart killed in turn still lists them all.
    let strays = kill_leftovers(&flight, cfg, out).await;
    state.note_strays(&paths.ralph_dir, &strays)?;
    // A prd.json the killed agent left broken is restored from the iteration's snapshot, so the
    // run can go on (the checkpoint below commits the restored file).
    let mut restored_prd = false;
    if store::load_shared(&paths.prd).is_err() {
        if let Ok(raw) = std::fs::read(paths.prd_snapshot()) {
            if store::parse_bytes(&paths.prd, &raw).is_ok() {
                write_atomic(&paths.prd, &raw)?;
                restored_prd = true;
                out.warn_in(flight.iteration, format!(
                    "prd.json was invalid after the interrupted iteration {}; restored it from the iteration's snapshot",
                    flight.iteration
                ));
            }
        }
    }
    let recorded = history_has(paths, &flight);
    let judged = if recorded {
        Judged::default()
    } else {
        judge_passes(paths, &flight, cfg, (stop, sandbox), state, out).await?
    };
    let mut feedback = Vec::new();
    if !recorded {
        let mut draft = draft(repo, paths, &flight, cfg, restored_prd)?;
        draft.record.strays = state
            .in_flight
            .as_ref()
            .map(|f| f.strays.clone())
            .unwrap_or_default();
        judged.apply(&mut draft);
        let record = commit::commit(
            Sinks {
                repo,
                paths,
                remote: None,
                only: None,
            },
            state,
            draft,
        )?
        .record;
        out.warn_in(
            flight.iteration,
            format!(
            "iteration {} ({}) was interrupted when ralph was killed; its changes are kept in {}",
            flight.iteration,
            flight.story_id,
            record
                .checkpoint_commit
                .as_deref()
                .map(|s| s.get(..8).unwrap_or(s))
                .unwrap_or("the existing commits")
        ),
        );
        if !judged.kept.contains(&flight.story_id) {
            feedback.push(Feedback::about(
                &flight.story_id,
                format!(
                    "The previous iteration ({}) was interrupted; its partial changes were committed as a checkpoint. Check `git log` and `git diff HEAD~1` and continue from there.",
                    flight.story_id
                ),
            ));
        }
        feedback.extend(judged.feedback());
    }
    state.iteration = state.iteration.max(flight.iteration);
    state.in_flight = None;
    state.save(&paths.ralph_dir)?;
    Ok(feedback)
}

/// What the restart made of the stories the interrupted iteration marked passing.
#[derive(Debug, Default)]
struct Judged {
    /// Passed their check, run now on the work the iteration left: still passing.
    kept: Vec<String>,
    /// Set back to not passing, each with why.
    reverted: Vec<(String, String)>,
    /// The checks that ran to their end.
    verify: Vec<VerifyRecord>,
}

impl Judged {
    /// Writes the judgement into the interrupted iteration's record and progress entry.
    fn apply(&self, draft: &mut Draft) {
        if self.kept.is_empty() && self.reverted.is_empty() {
            return;
        }
        let mut parts = Vec::new();
        if !self.kept.is_empty() {
            parts.push(format!(
                "ralph was killed before checking {0}; the restart ran the check on the work the iteration left and it passed, so {0} stay{1} passing",
                self.kept.join(", "),
                if self.kept.len() == 1 { "s" } else { "" }
            ));
        }
        for (id, why) in &self.reverted {
            let finding = format!("{id} set back to not passing: {why}");
            draft.record.findings.push(finding.clone());
            parts.push(finding);
        }
        let note = format!("; {}", parts.join("; "));
        if let Some(m) = draft.record.message.as_mut() {
            m.push_str(&note);
        }
        draft.progress_summary.push_str(&note);
        draft.record.passes_flipped = self.kept.clone();
        draft.record.passes_reverted = self.reverted.iter().map(|(id, _)| id.clone()).collect();
        draft.record.checked_at_restart = !self.verify.is_empty();
        draft.record.verify = self.verify.clone();
    }

    /// Feedback for the stories whose check failed on the restart.
    fn feedback(&self) -> Vec<Feedback> {
        self.verify
            .iter()
            .filter(|v| !v.passed)
            .map(|v| {
                Feedback::about(
                    &v.story_id,
                    format!(
                        "ralph was killed before it checked {0}; on restart it ran the check (`{1}`) on the work the interrupted iteration left, and it failed ({2}), so its passes was set back to false. The end of its output:\n{3}",
                        v.story_id,
                        v.command,
                        v.result.as_deref().unwrap_or("failed"),
                        v.output_tail
                    ),
                )
            })
            .collect()
    }
}

/// Whether the ledger already has the in-flight iteration (ralph was killed after its commit
/// point): then it was checked and written down, and nothing is undone.
fn history_has(paths: &RunPaths, flight: &InFlight) -> bool {
    History::load(paths, None).is_ok_and(|h| h.contains(&flight.run_id, flight.iteration))
}

/// Judges the stories prd.json marks passing that did not pass when the interrupted iteration
/// started (its snapshot, `.ralph/prd.snapshot.json`): ralph was killed before its verify gate
/// judged them. Each one's check (its `verify` as it was before the iteration, else
/// `--verify`) runs now on the work the iteration left, under the iteration's process tag: a
/// story that passes it stays passing. One whose check fails, is cut short by a stop, or that
/// has no check goes back to not passing (only its `passes` bytes change): an iteration that
/// was cut short never passes a story on the agent's word (the same rule as after a SIGTERM,
/// docs/decisions.md).
///
/// # Errors
/// prd.json could not be rewritten.
async fn judge_passes(
    paths: &RunPaths,
    flight: &InFlight,
    cfg: &RunConfig,
    (stop, sandbox): (&StopSignals, Option<&crate::process::sandbox::Sandbox>),
    state: &mut State,
    out: &mut Outputs,
) -> anyhow::Result<Judged> {
    let mut judged = Judged::default();
    let (Ok(now), Ok(raw_before)) = (
        store::load_shared(&paths.prd),
        std::fs::read(paths.prd_snapshot()),
    ) else {
        return Ok(judged);
    };
    let Ok(before) = store::parse_bytes(&paths.prd_snapshot(), &raw_before) else {
        return Ok(judged);
    };
    let flipped: Vec<(String, Option<String>)> = now
        .prd
        .user_stories
        .iter()
        .filter_map(|s| {
            // The stories the gate would have judged (inspect.rs: `flipped_ids`), each with the
            // check it had before the iteration: the agent does not choose its own test.
            let b = before.prd.story(&s.id).filter(|b| s.passes && !b.passes)?;
            Some((
                s.id.clone(),
                b.verify.clone().or_else(|| cfg.verify.clone()),
            ))
        })
        .collect();
    let check = Check {
        cfg,
        repo_root: &paths.repo_root,
        stop,
        tag: agent_tag(&flight.run_id, flight.iteration),
        sandbox,
    };
    for (id, command) in flipped {
        let Some(command) = command else {
            judged.reverted.push((
                id,
                "it has no check (no `verify`, no --verify), and a story marked passing by an interrupted iteration is not taken on the agent's word".to_owned(),
            ));
            continue;
        };
        if stop.stop.is_cancelled() {
            judged
                .reverted
                .push((id, "a stop came before its check could run".to_owned()));
            continue;
        }
        out.warn_in(flight.iteration, format!(
            "iteration {} was interrupted before ralph checked the stories it marked passing: running {id}'s check on the work it left (`{command}`)",
            flight.iteration
        ));
        let record = match check.run(&command, &id).await {
            Ok(checked) => {
                state.note_strays(&paths.ralph_dir, &checked.strays)?;
                if !checked.strays.is_empty() {
                    out.warn(format!(
                        "killed {} {id}'s check left running: {}",
                        plural_processes(checked.strays.len()),
                        describe_strays(&checked.strays)
                    ));
                }
                checked.record
            }
            // A check that cannot start (no bash) judged nothing: the story is not passing.
            Err(e) => {
                judged
                    .reverted
                    .push((id, format!("its check could not be started: {e:#}")));
                continue;
            }
        };
        if record.passed {
            judged.kept.push(id.clone());
        } else if stop.stop.is_cancelled() {
            judged
                .reverted
                .push((id, "a stop cut its check short".to_owned()));
            continue;
        } else {
            judged.reverted.push((
                id.clone(),
                format!(
                    "its check `{command}` {} on the work the iteration left",
                    record.result.as_deref().unwrap_or("failed")
                ),
            ));
        }
        judged.verify.push(record);
    }
    if !judged.reverted.is_empty() {
        let mut raw = std::fs::read(&paths.prd)?;
        for (id, _) in &judged.reverted {
            raw = store::set_passes(&raw, id, false)?;
        }
        write_atomic(&paths.prd, &raw)?;
        let which: Vec<String> = judged
            .reverted
            .iter()
            .map(|(id, why)| format!("{id} ({why})"))
            .collect();
        out.warn_in(flight.iteration, format!(
            "iteration {} was interrupted before ralph checked the stories it marked passing: {} set back to not passing, until an iteration passes its check",
            flight.iteration,
            which.join(", ")
        ));
    }
    if !judged.kept.is_empty() {
        out.warn_in(flight.iteration, format!(
            "iteration {}: {} passed {} check on the work the interrupted iteration left, so {} stay{} passing",
            flight.iteration,
            judged.kept.join(", "),
            if judged.kept.len() == 1 { "its" } else { "their" },
            if judged.kept.len() == 1 { "it" } else { "they" },
            if judged.kept.len() == 1 { "s" } else { "" },
        ));
    }
    Ok(judged)
}

/// Kills the interrupted iteration's processes: every one carrying its tag (its agent's and its
/// verify commands'), and its recorded agent process group when that group still is the
/// agent's. Returns what was killed, for the iteration's record.
async fn kill_leftovers(
    flight: &InFlight,
    cfg: &RunConfig,
    out: &mut Outputs,
) -> Vec<StrayProcess> {
    let tag = agent_tag(&flight.run_id, flight.iteration);
    // Processes the agent or a check started in groups of their own (the native loop's
    // commands, setsid) carry its tag too.
    let mut strays = stray_records(&crate::process::sweep_tagged(&tag), StrayFound::AtRestart);
    if !strays.is_empty() {
        out.warn_in(
            flight.iteration,
            format!(
                "killed {} left running by the interrupted iteration {}: {}",
                plural_processes(strays.len()),
                flight.iteration,
                describe_strays(&strays)
            ),
        );
    }
    let Ok(pgid) = i32::try_from(flight.pid) else {
        return strays;
    };
    if pgid <= 0 || !crate::process::group_alive(pgid) {
        return strays;
    }
    if group_is_tagged(pgid, &tag) {
        let members: Vec<crate::process::Stray> = crate::process::group_members(pgid)
            .into_iter()
            .map(|pid| crate::process::Stray {
                pid: pid.unsigned_abs(),
                command: crate::process::command_line(pid),
            })
            .collect();
        crate::process::kill_group(pgid, cfg.kill_grace).await;
        strays.extend(stray_records(&members, StrayFound::AtRestart));
        out.warn(format!(
            "killed the agent process group {pgid} left running by the previous ralph"
        ));
    } else {
        out.warn(format!(
            "process group {pgid} recorded in state.json is no longer ralph's agent; left it alone"
        ));
    }
    strays
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
    let prd = store::load_shared(&paths.prd).ok();
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
    r.feature = prd.and_then(|l| l.prd.branch_name.clone());
    r.backend = cfg.agent.as_str().to_string();
    r.model = cfg.model.clone();
    // A run with fallback agents: the agent it ran on, with that agent's backend and model while
    // it is still configured (the transcript's backend below wins over both).
    if let Some(name) = &flight.agent {
        r.agent = Some(name.clone());
        if let Some(profile) = cfg.fallbacks.iter().find(|p| &p.name == name) {
            let its = cfg.for_agent(profile);
            r.backend = its.agent.as_str().to_string();
            r.model = its.model;
        }
    }
    r.head_before = flight.start_sha.clone();
    // A start the agent pruned away (it deleted ralph's references, then `git gc
    // --prune=now`): counted from the newest recorded commit HEAD still contains, loss named.
    let mut start = flight.start_sha.clone();
    if let Some(gone) = start.as_deref().filter(|s| !repo.has_commit(s)) {
        let p = super::iteration::inspect::pruned(repo, paths, gone);
        let short: Vec<&str> = p.missing.iter().map(|s| s.get(..12).unwrap_or(s)).collect();
        r.findings.push(format!(
            "the agent destroyed history: it deleted ralph's references and pruned the commits they kept, so ralph could not put back {} commit{} it had recorded ({}; the first is this iteration's start)",
            short.len(),
            if short.len() == 1 { "" } else { "s" },
            short.join(", ")
        ));
        start = p.base;
    }
    r.commits = match &head {
        Some(h) => repo.commits_between(start.as_deref(), h)?,
        None => Vec::new(),
    };
    r.files_changed = match &start {
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
        staged: None,
    })
}

/// Recovers the `--parallel` iterations a killed ralph left in flight (state.json's `flights`):
/// each one's leftover processes are killed, what its agent left in its worktree is committed
/// there and kept under `refs/ralph/salvage/<run>/<story>` (nothing of it lands: it was never
/// checked on the run branch, so no story passes on it), and it is written down as an
/// `interrupted` iteration through the same commit stage, naming the ref; then its worktree is
/// removed. Returns the feedback for those stories' next attempts.
///
/// # Errors
/// git, ledger or state.json could not be written.
pub async fn recover_flights(
    repo: &Repo,
    paths: &RunPaths,
    state: &mut State,
    cfg: &RunConfig,
    out: &mut Outputs,
) -> anyhow::Result<Vec<Feedback>> {
    let mut feedback = Vec::new();
    // A landing's move of the checkout that the kill cut short is finished first: what it
    // landed is then on the run branch when the flights below are judged (else the flight's
    // record would take the moved files for its own, and the move could not be finished).
    if let Some(notice) = finish_landing_in(repo, &paths.ralph_dir) {
        out.notice(notice);
    }
    for flight in state.flights.clone() {
        let strays = kill_leftovers(&flight, cfg, out).await;
        let recorded = history_has(paths, &flight);
        if let Some(tree) = &flight.worktree {
            let prd = tree.root.join(
                paths
                    .prd
                    .strip_prefix(&paths.repo_root)
                    .unwrap_or(&paths.prd),
            );
            let tree_paths = RunPaths::new(&tree.root, &prd);
            super::parallel::land::bring_transcripts(
                &tree_paths,
                paths,
                &flight.run_id,
                flight.iteration,
            );
        }
        // The worker's last sign of life: what its agent wrote after its last transcript line.
        let last_change = flight
            .worktree
            .as_ref()
            .and_then(|t| crate::git::land::newest_change(&t.root, 50_000));
        let (work, kept) = salvage_flight(repo, paths, &flight, out);
        let (salvage, landed) = match work {
            Some(Work::Salvaged(r)) => (Some(r), None),
            Some(Work::Landed(sha)) => (None, Some(sha)),
            None => (None, None),
        };
        // The run ended with this iteration done but not landed (the checkout was switched):
        // ralph was not killed, and the record says what happened.
        let switched = flight
            .worktree
            .as_ref()
            .and_then(|t| t.unlanded.as_deref())
            .is_some();
        let what = if switched {
            "the run ended without landing this iteration (the checkout was switched away from the run branch)"
        } else {
            "ralph was killed while this iteration ran"
        };
        if !recorded {
            let mut draft = draft(repo, paths, &flight, cfg, false)?;
            if switched {
                let message = format!("{what}; its work was recorded when ralph restarted");
                draft.record.message = Some(message.clone());
                draft.progress_summary = message;
                draft.body = "Outcome: interrupted (the checkout was switched to another branch before this iteration could land).".to_owned();
            }
            worked_until(&mut draft, &flight, last_change);
            let head = match (&salvage, &landed) {
                (Some(r), _) => repo.ref_sha(r),
                (None, Some(sha)) => Some(sha.clone()),
                (None, None) => None,
            };
            salvaged_work(repo, &mut draft, &flight, head.as_deref());
            let reverted = unrecorded_passes(repo, paths, &flight)?;
            draft.record.findings.extend(kept);
            draft.record.strays = flight.strays.iter().chain(&strays).cloned().collect();
            let tree = flight.worktree.as_ref();
            draft.record.worker = tree.map(|t| t.worker);
            draft.record.worktree = tree.map(|t| paths.rel(&t.root));
            draft.record.landing = Some(flight_landing(
                paths,
                &flight,
                landed.as_deref(),
                salvage.as_deref(),
                what,
                &draft,
            ));
            for id in &reverted {
                draft.record.findings.push(format!(
                    "{id} set back to not passing: prd.json marked it passing, but no check of it is on record (ralph was killed between its landing and its record)"
                ));
            }
            draft.record.passes_reverted = reverted.clone();
            let own = super::parallel::land::kept_paths(paths);
            let own: Vec<&str> = own.iter().map(String::as_str).collect();
            commit::commit(
                Sinks {
                    repo,
                    paths,
                    remote: None,
                    only: Some(&own),
                },
                state,
                draft,
            )?;
            out.warn(format!(
                "iteration {} ({}): {what}; {}",
                flight.iteration,
                flight.story_id,
                match (&salvage, &landed) {
                    (Some(r), _) => format!("its work is kept in {r}"),
                    (None, Some(sha)) => format!(
                        "its work landed on the run branch ({}) but was not checked on record, so {} goes back to not passing",
                        short(sha),
                        flight.story_id
                    ),
                    (None, None) => "it left no work".to_owned(),
                }
            ));
            feedback.push(Feedback::about(
                &flight.story_id,
                match &salvage {
                    None if landed.is_some() => format!(
                        "The previous attempt at {} was interrupted while its work landed: that work is on the branch now, but it was not checked on record. Check that the story is complete, finish it, and mark it passing.",
                        flight.story_id
                    ),
                    Some(r) => format!(
                        "The previous attempt at {} was interrupted; its partial work is kept in {r} (`git show {r}`), not on the branch. Take what is useful from it.",
                        flight.story_id
                    ),
                    None => format!(
                        "The previous attempt at {} was interrupted before it changed anything.",
                        flight.story_id
                    ),
                },
            ));
        }
        state.iteration = state.iteration.max(flight.iteration);
        state.flights.retain(|f| f.iteration != flight.iteration);
        state.save(&paths.ralph_dir)?;
    }
    remove_recorded_worktrees(repo, paths, state, out);
    Ok(feedback)
}

/// The landing record of an interrupted flight: its work `landed` on the run branch already
/// (this commit), or not (kept under `salvage`, or nothing to keep).
fn flight_landing(
    paths: &RunPaths,
    flight: &InFlight,
    landed: Option<&str>,
    salvage: Option<&str>,
    what: &str,
    draft: &Draft,
) -> crate::protocol::LandingRecord {
    match landed {
                Some(sha) => crate::protocol::LandingRecord {
                    kind: landed_kind(paths, sha),
                    resolves: None,
                    onto: None,
                    commit: Some(sha.to_owned()),
                    salvage_ref: None,
                    files: draft.record.files_changed.clone(),
                    landed_since: Vec::new(),
                    message: Some(format!(
                        "ralph was killed while it landed this iteration: its work is on the run branch, but its pass was never written down, so {} does not pass until an iteration's check passes",
                        flight.story_id
                    )),
                },
                None => crate::protocol::LandingRecord {
                    kind: crate::protocol::LandingKind::NotLanded,
                    resolves: None,
                    onto: None,
                    commit: None,
                    salvage_ref: salvage.map(str::to_owned),
                    files: Vec::new(),
                    landed_since: Vec::new(),
                    message: Some(format!("{what}; its work did not land")),
                },
            }
}

/// What an interrupted worker's work became at restart.
enum Work {
    /// Kept under this salvage ref (it did not land).
    Salvaged(String),
    /// On the run branch already (ralph was killed during or after its landing's move of the
    /// checkout): this commit, the run branch contains it.
    Landed(String),
}

/// The kind of a landing found done at restart: a merge when the landed commit has two
/// parents (ralph merged the tip in), else a fast-forward.
fn landed_kind(paths: &RunPaths, sha: &str) -> crate::protocol::LandingKind {
    let parents = git2::Repository::open(&paths.repo_root).ok().and_then(|r| {
        let oid = git2::Oid::from_str(sha).ok()?;
        r.find_commit(oid).ok().map(|c| c.parent_count())
    });
    match parents {
        Some(n) if n > 1 => crate::protocol::LandingKind::Merge,
        _ => crate::protocol::LandingKind::FastForward,
    }
}

/// Sets back to not passing, in the checkout's prd.json, every story that passes there but
/// neither passed when the interrupted `flight` started (its worktree's base) nor has a
/// `story_passed` record of this run: only a landing's record makes a pass, and a ralph killed
/// between a landing (the branch moved, prd.json's `passes` written) and its record leaves a
/// pass no check stands behind. Returns the stories set back (only their `passes` bytes
/// change).
///
/// # Errors
/// prd.json could not be rewritten.
fn unrecorded_passes(
    repo: &Repo,
    paths: &RunPaths,
    flight: &InFlight,
) -> anyhow::Result<Vec<String>> {
    let Ok(now) = store::load(&paths.prd) else {
        return Ok(Vec::new());
    };
    let rel = paths
        .prd
        .strip_prefix(&paths.repo_root)
        .unwrap_or(&paths.prd)
        .to_string_lossy()
        .into_owned();
    let before = flight
        .worktree
        .as_ref()
        .and_then(|t| repo.file_at(&t.base, &rel).ok().flatten())
        .and_then(|raw| store::parse_bytes(&paths.prd, &raw).ok());
    let history = History::load(paths, None).ok();
    let recorded = |id: &str| {
        history.as_ref().is_some_and(|h| {
            h.run(&flight.run_id)
                .any(|r| r.story_id == id && r.outcome == Outcome::StoryPassed)
        })
    };
    let reverted: Vec<String> = now
        .prd
        .user_stories
        .iter()
        .filter(|s| s.passes && !recorded(&s.id))
        .filter(|s| {
            s.id == flight.story_id
                || before
                    .as_ref()
                    .is_some_and(|b| b.prd.story(&s.id).is_some_and(|b| !b.passes))
        })
        .map(|s| s.id.clone())
        .collect();
    if reverted.is_empty() {
        return Ok(reverted);
    }
    let mut raw = now.raw.clone();
    for id in &reverted {
        raw = store::set_passes(&raw, id, false)?;
    }
    write_atomic(&paths.prd, &raw)?;
    Ok(reverted)
}

/// Removes the story worktrees under `.ralph/worktrees/<run>/` of this PRD's runs (a run the
/// ledger names) that no iteration in flight owns: a ralph killed after an iteration's record
/// was written, before its worktree was removed, left them. What such a worktree holds that no
/// reference keeps (it should hold nothing: its work was committed at landing) is committed and
/// kept under a salvage ref first.
fn remove_recorded_worktrees(repo: &Repo, paths: &RunPaths, state: &State, out: &mut Outputs) {
    let dir = paths
        .repo_root
        .join(crate::workspace::RALPH_DIR)
        .join("worktrees");
    let found = repo.worktrees_under(&dir);
    if found.is_empty() {
        return;
    }
    let Ok(history) = History::load(paths, None) else {
        return;
    };
    for root in found {
        let owned = state
            .flights
            .iter()
            .any(|f| f.worktree.as_ref().is_some_and(|t| t.root == root));
        let run = root
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if owned || !history.records.iter().any(|r| r.run_id == run) {
            continue;
        }
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if root.join(".git").exists() {
            if let Ok(wt) = Repo::discover(&root) {
                wt.clear_stale_locks();
                let subject =
                    format!("ralph: work left in the worktree {name} when ralph was killed");
                if let Ok(head) = crate::git::land::commit_leftovers(&wt, &subject) {
                    if !repo.is_ancestor(&head, "HEAD").unwrap_or(false) {
                        match crate::git::land::salvage(repo, &run, &name, &head) {
                            Ok(r) => out.warn(format!(
                                "the worktree {} outlived its recorded iteration; what it held is kept in {r}",
                                paths.rel(&root)
                            )),
                            Err(e) => tracing::warn!("cannot keep {head} of {}: {e}", root.display()),
                        }
                    }
                }
            }
        }
        match repo.remove_worktree(&root) {
            // The run's folder goes with its last worktree.
            Ok(()) => {
                if let Some(run_dir) = root.parent() {
                    let _ = std::fs::remove_dir(run_dir);
                }
            }
            Err(e) => out.warn(format!(
                "cannot remove the worktree {}: {e}",
                paths.rel(&root)
            )),
        }
    }
}

/// A killed worker's duration as far as known: at least until the newest change in its
/// worktree (`last_change`), when that is later than what its transcript showed.
fn worked_until(draft: &mut Draft, flight: &InFlight, last_change: Option<std::time::SystemTime>) {
    let Some(at) = last_change.map(chrono::DateTime::<Utc>::from) else {
        return;
    };
    let secs = (at - flight.started_at).num_milliseconds() as f64 / 1000.0;
    if secs > draft.record.duration_s {
        draft.record.duration_s = secs;
    }
}

/// A killed worker's commits and files are those of its salvaged work (from the story's start
/// in its worktree to the salvage ref), not the run branch's (where nothing of it landed):
/// none when it left nothing.
fn salvaged_work(repo: &Repo, draft: &mut Draft, flight: &InFlight, head: Option<&str>) {
    let r = &mut draft.record;
    let (Some(tree), Some(head)) = (flight.worktree.as_ref(), head) else {
        r.commits.clear();
        r.files_changed.clear();
        return;
    };
    r.commits = repo
        .commits_between(Some(&tree.base), head)
        .unwrap_or_default();
    r.files_changed = crate::git::land::files_between(repo, &tree.base, head).unwrap_or_default();
}

/// Commits what an interrupted worker left in its worktree, keeps it under a salvage ref
/// (returned; `None` when it left nothing beyond its start; [`Work::Landed`] instead when the
/// run branch already contains it: ralph was killed in or after its landing), keeps the files no commit takes
/// (secret-looking, or ignored and written since the iteration started) under
/// `.ralph/kept/<run>/<iteration>/` (the findings naming them returned), and removes the
/// worktree.
fn salvage_flight(
    repo: &Repo,
    paths: &RunPaths,
    flight: &InFlight,
    out: &mut Outputs,
) -> (Option<Work>, Vec<String>) {
    let Some(tree) = flight.worktree.as_ref() else {
        return (None, Vec::new());
    };
    if !tree.root.join(".git").exists() {
        let (kept, findings) = gone_flight(repo, paths, flight, tree);
        return (kept.map(Work::Salvaged), findings);
    }
    let mut findings = Vec::new();
    let kept = Repo::discover(&tree.root).ok().and_then(|wt| {
        wt.clear_stale_locks();
        let subject = format!(
            "ralph: iteration {} ({}): work left when ralph was killed",
            flight.iteration, flight.story_id
        );
        let (head, withheld) = crate::git::land::commit_leftovers_withheld(&wt, &subject).ok()?;
        let keep = super::parallel::land::Kept {
            paths,
            run_id: &flight.run_id,
            iteration: flight.iteration,
            root: &tree.root,
        };
        // What the agent wrote, not the worktree's setup (`worktree_setup`'s logs, a build):
        // files since the agent started, as state.json noted it; else since its prompt was
        // written (just before the agent, after the setup); else since the story's launch.
        let since = tree
            .agent_started_at
            .map(std::time::SystemTime::from)
            .or_else(|| {
                std::fs::metadata(paths.prompt_copy(&flight.run_id, flight.iteration))
                    .and_then(|m| m.modified())
                    .ok()
            })
            .unwrap_or_else(|| flight.started_at.into());
        findings = keep.keep(&wt, &withheld, since);
        if head == tree.base {
            return None;
        }
        let branch = repo.head_sha().ok().flatten();
        if branch.is_some_and(|b| repo.is_ancestor(&head, &b).unwrap_or(false)) {
            return Some(Work::Landed(head));
        }
        crate::git::land::salvage(repo, &flight.run_id, &flight.story_id, &head)
            .ok()
            .map(Work::Salvaged)
    });
    if let Err(e) = repo.remove_worktree(&tree.root) {
        out.warn(format!(
            "cannot remove the worktree {}: {e}",
            tree.root.display()
        ));
    }
    (kept, findings)
}

/// A killed ralph's flight whose worktree its agent deleted (`rm -rf`, `git worktree remove -f
/// -f`): the commit git's registration still names, else the dangling commits made since the
/// iteration started that descend from its start ([`Repo::unreachable_work`]), are kept under
/// salvage refs (the registration's commit returned, where the story's next attempt starts; a
/// dangling commit, which any live agent may have made, is only named), the registration
/// is pruned, and a finding says what happened and that uncommitted files went with it.
fn gone_flight(
    repo: &Repo,
    paths: &RunPaths,
    flight: &InFlight,
    tree: &crate::state::WorkerTree,
) -> (Option<String>, Vec<String>) {
    let named = repo
        .prune_gone_worktrees(&tree.root)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, sha)| sha)
        .find(|sha| *sha != tree.base);
    let dangling = named.is_none();
    let tips = match named {
        Some(sha) => vec![sha],
        None => {
            let since = tree
                .agent_started_at
                .unwrap_or(flight.started_at)
                .min(flight.started_at);
            repo.unreachable_work(&tree.base, since.into())
                .unwrap_or_default()
        }
    };
    let refs: Vec<String> = tips
        .iter()
        .filter_map(|sha| {
            crate::git::land::salvage(repo, &flight.run_id, &flight.story_id, sha).ok()
        })
        .collect();
    let lost = "anything it had not committed was deleted with the worktree (git keeps no copy of uncommitted files)";
    let finding = if refs.is_empty() {
        format!(
            "the worktree {} was deleted while the agent ran (by this or another agent); no commit of its was left to keep; {lost}",
            paths.rel(&tree.root)
        )
    } else if dangling {
        format!(
            "the worktree {} was deleted while the agent ran (by this or another agent); commits found among git's dangling commits are kept in {} (ralph cannot tell which agent made them when more than one worktree was live); the story's next attempt starts from the run branch: work that may be yours is kept in {}; look at it with git show; {lost}",
            paths.rel(&tree.root),
            refs.join(", "),
            refs.join(", ")
        )
    } else {
        format!(
            "the worktree {} was deleted while the agent ran (by this or another agent); its commits are kept in {}; {lost}",
            paths.rel(&tree.root),
            refs.join(", ")
        )
    };
    // A dangling commit may be any live agent's: never where the story's next attempt starts.
    let resume = refs.into_iter().next().filter(|_| !dangling);
    (resume, vec![finding])
}

/// A landing's move of the main checkout, noted in `.ralph/landing.json` while it runs
/// (`run/parallel/land.rs`): a ralph killed during the move left the files at `to` and the
/// branch at `from`, and the next run finishes it ([`finish_landing`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LandingNote {
    /// The run branch.
    pub branch: String,
    /// The branch's commit before the move.
    pub from: String,
    /// The landed result the checkout moves to.
    pub to: String,
}

impl LandingNote {
    const FILE: &'static str = "landing.json";

    /// Writes the note (atomically) under `ralph_dir`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&self, ralph_dir: &std::path::Path) -> anyhow::Result<()> {
        crate::fsutil::write_atomic(&ralph_dir.join(Self::FILE), &serde_json::to_vec(self)?)?;
        Ok(())
    }

    /// Removes the note (a missing one is fine).
    pub fn clear(ralph_dir: &std::path::Path) {
        let _ = std::fs::remove_file(ralph_dir.join(Self::FILE));
    }
}

/// Finishes the move of the checkout that a killed ralph left half done (see [`LandingNote`]),
/// before the dirty-tree check would take its files for the user's. Returns what it did, for
/// the terminal; `None` when there was no note or nothing to finish (then the note goes, and a
/// tree that is still dirty is the dirty-tree check's to report).
pub fn finish_landing(pre: &super::preflight::Preflight) -> Option<String> {
    finish_landing_in(&pre.repo, &pre.paths.ralph_dir)
}

/// [`finish_landing`] for the checkout `repo` whose books are in `dir`.
fn finish_landing_in(repo: &Repo, dir: &std::path::Path) -> Option<String> {
    let note: LandingNote =
        serde_json::from_slice(&std::fs::read(dir.join(LandingNote::FILE)).ok()?).ok()?;
    let done = crate::git::land::finish_advance(repo, &note.branch, &note.from, &note.to);
    LandingNote::clear(dir);
    match done {
        Ok(true) => Some(format!(
            "finished moving the checkout to {} (a landing that ralph was stopped in the middle of): `{}` now holds it",
            short(&note.to),
            note.branch
        )),
        Ok(false) => None,
        Err(e) => {
            tracing::warn!("cannot finish an interrupted landing: {e}");
            None
        }
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}
