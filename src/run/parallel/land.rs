//! Landing a `--parallel` worker's iteration on the run branch, one at a time (the dispatcher
//! calls [`land`] for one finished iteration before it looks at the next message):
//!
//! 1. the worktree's leftovers are committed there (the story's work S);
//! 2. a story that passed in its worktree brings the run branch's tip in
//!    ([`crate::git::land::integrate`]; prd.json and progress.txt always the tip's). A conflict
//!    lands nothing: S is kept under `refs/ralph/salvage/<run>/<story>`;
//! 3. when other stories landed since the worktree was made, the story's check runs again on
//!    the result, in the worktree: a failure lands nothing (`reverted`), the result is kept
//!    under a salvage ref and the next attempt starts from it;
//! 4. the main checkout moves forward to the result ([`crate::git::land::advance_checkout`]:
//!    the user's files are never reset, stashed or cleaned), ralph sets the story's `passes` and
//!    `notes` in prd.json, and the iteration is written down by the same commit stage as a
//!    serial iteration (progress.txt entry, checkpoint with trailers, `--push`, ledger,
//!    state.json);
//! 5. the worktree is removed (its work landed or is under a ref).

use std::path::{Path, PathBuf};

use chrono::Utc;

use super::guard::short;
pub use super::guard::{guard_branch, moved_back, own_tip, switched};
use super::worker::End;
use super::{Board, Flight};
use crate::config::RunConfig;
use crate::fsutil::write_atomic;
use crate::git::land::{self as git_land, Integration};
use crate::git::Repo;
use crate::output::Outputs;
use crate::prd::store;
use crate::process::StopSignals;
use crate::protocol::{LandingKind, LandingRecord, LedgerRecord, Outcome, RunEvent, StopReason};
use crate::run::feedback::Feedback;
use crate::run::iteration::commit::{self, Draft, Sinks};
use crate::run::iteration::{self, Done, Worked};
use crate::run::session::Session;
use crate::workspace::RunPaths;

/// A landed (or refused) iteration, written down.
#[derive(Debug)]
pub struct Landed {
    /// The written iteration.
    pub done: Done,
    /// The agent it ran on (index into the run's agents).
    pub agent: usize,
}

/// Makes the story's worktree at `root` from the run branch's tip `base`. A story whose last
/// work did not land (`board.resume`) starts from that work with the tip brought in, when they
/// merge (and that work does not contain ralph's resolution-markers commit); else from the tip
/// alone.
///
/// # Errors
/// git errors making the worktree.
pub fn make_tree(
    repo: &Repo,
    board: &mut Board,
    root: &Path,
    story_id: &str,
    base: &str,
    keep: &[String],
    out: &mut Outputs,
) -> anyhow::Result<()> {
    // Never from a commit on top of ralph's resolution-markers commit (a resolution's work that
    // did not land): its files hold git's conflict markers.
    let resume = board
        .resume
        .remove(story_id)
        .filter(|sha| !git_land::resolve::holds_markers_commit(repo, sha));
    if let Some(previous) = resume {
        repo.add_worktree(root, &previous)?;
        let tree = Repo::discover(root)?;
        let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
        match git_land::integrate(&tree, base, &keep)? {
            Integration::Clean { .. } => return Ok(()),
            Integration::Conflict { files, .. } => {
                out.warn(format!(
                    "{story_id}: its earlier work ({}) no longer merges with the run branch ({}); the new attempt starts from the run branch",
                    short(&previous),
                    files.join(", ")
                ));
                repo.remove_worktree(root)?;
            }
        }
    }
    repo.add_worktree(root, base)?;
    Ok(())
}

/// Commits prd.json and progress.txt when they differ from the run branch's tip (the user
/// edited them during the run: a story added, a note), and nothing else of the checkout.
///
/// Returns the commit made, if any.
///
/// # Errors
/// git failing to commit.
pub fn commit_edits(s: &Session) -> anyhow::Result<Option<String>> {
    let own = kept_paths(&s.pre.paths);
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    let made = git_land::commit_own_files_on_own_tip(
        &s.pre.repo,
        &own,
        "ralph: prd.json and progress.txt as edited during the run",
        "Committed before the next story starts or lands (--parallel), so that it builds on them.",
        &[],
    )?;
    Ok(made)
}

/// The paths ralph writes itself at landing, relative to the repository root: prd.json,
/// progress.txt and its `progress-history/`.
pub fn kept_paths(paths: &RunPaths) -> Vec<String> {
    let rel = |p: &Path| {
        p.strip_prefix(&paths.repo_root)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    let history = paths
        .progress
        .parent()
        .map(|d| d.join("progress-history"))
        .unwrap_or_else(|| PathBuf::from("progress-history"));
    vec![
        rel(&paths.prd),
        rel(&paths.progress),
        format!("{}/", rel(&history)),
    ]
}

/// Lands one finished iteration (see the module docs).
///
/// # Errors
/// git, prd.json, progress.txt, ledger or state.json failing on ralph's side.
pub async fn land(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    flight: Flight,
    end: End,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Landed> {
    let paths = s.pre.paths.clone();
    let ran = matches!(end, End::Worked(_));
    // Whether the outputs saw this iteration start (its worker got to the agent's stage).
    let announced = matches!(end, End::Worked(_) | End::Failed(_, true));
    let mut worked = worked_of(s, &flight, end, out);
    let tree_paths = RunPaths::new(
        &flight.root,
        &flight.root.join(
            paths
                .prd
                .strip_prefix(&paths.repo_root)
                .unwrap_or(Path::new("prd.json")),
        ),
    );
    bring_transcripts(&tree_paths, &paths, &s.run_id, flight.iteration);
    if !flight.root.join(".git").exists() {
        gone(s, board, &flight, &mut worked)?;
    }
    let record = &mut worked.draft.record;
    record.worker = Some(flight.worker);
    record.worktree = Some(paths.rel(&flight.root));
    let mut flight = flight;
    let landing = if ran && flight.root.join(".git").exists() {
        let tree = Repo::discover(&flight.root)?;
        // An agent that checked a branch out in its worktree: its commits stay the story's
        // work, on a detached HEAD, and the branch is looked at below.
        if let Some(branch) = tree.detach_head()? {
            worked.draft.record.findings.push(format!(
                "the agent checked out the branch {branch} in its worktree; ralph detached it again (its commits are the story's work)"
            ));
        }
        guarded(s, board, &mut worked)?;
        // What worktree_setup made is not the agent's work: set aside for the commit and the
        // merge of the tip, put back before the check (onto_branch) or the removal.
        let setup_files = tree.setup_files_unchanged();
        git_land::set_aside(&tree, &setup_files);
        let (work, withheld) = git_land::commit_leftovers_withheld(
            &tree,
            &format!(
                "ralph: iteration {} ({}): the agent's uncommitted work",
                flight.iteration, flight.story_id
            ),
        )?;
        if !setup_files.is_empty() {
            worked.draft.record.findings.push(format!(
                "not committed: {} — made by worktree_setup before the agent started, not the agent's work",
                setup_files.join(", ")
            ));
        }
        let kept = Kept {
            paths: &paths,
            run_id: &s.run_id,
            iteration: flight.iteration,
            root: &flight.root,
        };
        let since = std::time::SystemTime::from(worked.draft.record.started_at);
        let findings = kept.keep(&tree, &withheld, since);
        worked.draft.record.findings.extend(findings);
        let notes = agent_notes(&tree, &tree_paths, &flight.base, &work);
        flight.work = Some(work);
        let landing = super::resolve::land(cfg, s, board, &flight, &mut worked, stop, out).await;
        git_land::put_back(&tree);
        let landing = landing?;
        append_notes(&paths, notes.as_deref())?;
        landing
    } else {
        None
    };
    worked.draft.record.landing = landing;
    only_own_pass(&mut worked);
    refresh_summary(&mut worked.draft);
    let own = kept_paths(&paths);
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    if !announced {
        // The outputs saw no start of this iteration (its worker never got to the agent).
        out.emit(RunEvent::IterationStarted {
            iteration: flight.iteration,
            slot: flight.slot,
            max_iter: cfg.max_iter,
            story_id: flight.story_id.clone(),
            story_title: worked.draft.record.story_title.clone(),
            backend: worked.draft.record.backend.clone(),
            worker: Some(flight.worker),
            agent: (s.pre.agents.len() > 1).then(|| s.pre.agents[flight.agent].name.clone()),
        });
    }
    record_start(s, board, &mut worked)?;
    between_steps(s, board, &mut worked)?;
    let done = iteration::write_down(
        Sinks {
            repo: &s.pre.repo,
            paths: &paths,
            remote: s.remote.as_ref(),
            // Only ralph's files: a file the user edits in the checkout during the run is theirs.
            only: Some(&own),
        },
        &s.run_id,
        cfg.max_iter,
        &mut s.state,
        worked,
        out,
    )?;
    crate::process::kill_point("landing-recorded");
    not_committed(board, &done);
    if flight.root.exists() {
        if let Err(e) = s.pre.repo.remove_worktree(&flight.root) {
            out.warn(format!(
                "cannot remove the worktree {}: {e}",
                paths.rel(&flight.root)
            ));
        }
    }
    board.tip = own_tip(s, board)?;
    Ok(Landed {
        done,
        agent: flight.agent,
    })
}

/// The record an iteration's [`End`] starts from: the worker's own, or one made here for a
/// worker that never got to its agent, failed after it, or ran in a worktree that went away.
fn worked_of(s: &Session, flight: &Flight, end: End, out: &mut Outputs) -> Worked {
    match end {
        End::Worked(worked) => *worked,
        End::SetupFailed(message) => {
            out.warn(format!(
                "{}: its worktree could not be set up; the story is blocked: {message}",
                flight.story_id
            ));
            synthetic(s, flight, Outcome::SetupFailed, message)
        }
        End::Failed(message, started) if started && !flight.root.join(".git").exists() => {
            // The agent ran, and its worktree went while it ran: the stages after it failed on
            // files that no longer exist (restoring prd.json, say). That is no error of the
            // iteration's to show; what was kept is said once, below ([`gone`]).
            tracing::debug!(
                "iteration {} ended in a deleted worktree: {message}",
                flight.iteration
            );
            ran_in_gone_tree(s, flight)
        }
        End::Failed(message, _) => {
            out.warn(format!(
                "iteration {} ({}) could not run: {message}",
                flight.iteration, flight.story_id
            ));
            synthetic(s, flight, Outcome::AgentError, message)
        }
    }
}

/// [`guard_branch`] between a landing's own steps (the move of the checkout and the commit of
/// ralph's files): its warning goes to the record's findings and the terminal.
///
/// # Errors
/// As [`guard_branch`].
fn between_steps(s: &Session, board: &mut Board, worked: &mut Worked) -> anyhow::Result<()> {
    let Some(landing) = &worked.draft.record.landing else {
        return Ok(());
    };
    // Where this landing left the branch is ralph's: an agent's commit in the checkout made
    // since (between the move and the record's commit) is taken off and named, not buried
    // under ralph's commit of prd.json and progress.txt.
    if let Some(commit) = &landing.commit {
        board.tip = Some(commit.clone());
    }
    // `git commit -a` there takes ralph's uncommitted prd.json and progress.txt in too: they
    // are put back as ralph wrote them once such a commit is taken off.
    let own = Own::read(&s.pre.paths);
    if let Some(warning) = guard_branch(s, board)? {
        // Said once: with the iteration's line, where the record's findings are shown.
        worked.draft.record.findings.push(warning);
    }
    own.restore(&s.pre.paths)?;
    Ok(())
}

/// After the record is written: when ralph's own files could not be committed
/// ([`commit::NOT_COMMITTED`]) because another git process held the checkout's lock past
/// ralph's wait, the run stops for the user (no new launch, nothing more lands); when the
/// branch moved under the commit, the next guard takes that move off and names it.
fn not_committed(board: &mut Board, done: &Done) {
    let Some(finding) = done
        .record
        .findings
        .iter()
        .find(|f| f.starts_with(commit::NOT_COMMITTED))
    else {
        return;
    };
    // The finding itself is shown with the record.
    if !finding.contains("another git process holds") {
        return;
    }
    board.stopping.get_or_insert(StopReason::NeedsHuman {
        outcome: Outcome::LandingRefused,
        iteration: done.record.iteration,
        // The finding itself is shown with the iteration's line: the summary only points at it.
        message: Some(format!(
            "the run stops: another git process holds your checkout's index, so ralph's prd.json and progress.txt of iteration {} (landed) are left uncommitted in your checkout; its warning above names the lock",
            done.record.iteration
        )),
    });
}

/// The story's worktree is gone (its agent deleted it: `rm -rf`, `git worktree remove -f -f`):
/// its registration is pruned, and the commits nothing else keeps are kept under salvage refs;
/// the story's next attempt starts from the one git's registration still names, never from a
/// dangling commit (any live agent may have made it) nor from one on top of ralph's
/// resolution-markers commit: then it starts from the run branch, and its feedback names the
/// refs ("work that may be yours is kept in ..."). The record names them and says that
/// what the agent had not committed went with the worktree. The last commit is the one git's
/// registration still names (`rm -rf` of a locked worktree); when git deleted the registration
/// too (`remove -f -f`, or `worktree unlock` and `prune`), the commits are git's dangling
/// commits that descend from the story's start and were made since its iteration started
/// ([`Repo::unreachable_work`]).
///
/// # Errors
/// git failing to prune the registration or to write a salvage ref.
fn gone(
    s: &Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
) -> anyhow::Result<()> {
    let unkept = s.pre.repo.prune_gone_worktrees(&flight.root)?;
    let rel = s.pre.paths.rel(&flight.root);
    let lost = "anything it had not committed was deleted with the worktree (git keeps no copy of uncommitted files)";
    let named = unkept
        .into_iter()
        .map(|(_, sha)| sha)
        .find(|sha| *sha != flight.base);
    let dangling = named.is_none();
    let (tips, how) = match named {
        Some(sha) => (vec![sha], "its last commit"),
        None => {
            // From the flight's start: a record made at landing (the worker failed once its
            // worktree was gone) starts later than the agent's commits.
            let since =
                std::time::SystemTime::from(flight.started_at.min(worked.draft.record.started_at));
            match s.pre.repo.unreachable_work(&flight.base, since) {
                Ok(tips) => (
                    tips,
                    "git deleted its record of the worktree too; the commits found among the repository's dangling commits made since the agent started",
                ),
                Err(e) => {
                    tracing::warn!("cannot look for the deleted worktree's commits: {e}");
                    (Vec::new(), "")
                }
            }
        }
    };
    // Other worktrees live meanwhile: a dangling commit found here may be any of their agents'
    // (all start from the run branch), so a dangling commit is never where the story's next
    // attempt starts; only the commit git's own record of this worktree names is.
    let live = board
        .flights
        .iter()
        .filter(|f| f.iteration != flight.iteration)
        .count();
    let mut refs = Vec::new();
    let mut kept = Vec::new();
    for sha in &tips {
        let salvage = git_land::salvage(&s.pre.repo, &s.run_id, &flight.story_id, sha)?;
        refs.push(format!("{} in {salvage}", short(sha)));
        if dangling {
            board.gone_kept.push((flight.base.clone(), salvage.clone()));
        }
        kept.push(salvage);
    }
    let earlier: Vec<&str> = board
        .gone_kept
        .iter()
        .filter(|(base, _)| tips.is_empty() && dangling && *base == flight.base)
        .map(|(_, r)| r.as_str())
        .collect();
    let elsewhere = if earlier.is_empty() {
        String::new()
    } else {
        format!(
            " (commits kept when another worktree of the same start went may be its: {})",
            earlier.join(", ")
        )
    };
    let markers = tips
        .first()
        .is_some_and(|t| crate::git::land::resolve::holds_markers_commit(&s.pre.repo, t));
    let message = match tips.first() {
        Some(newest) if !dangling && !markers => {
            board.resume.insert(flight.story_id.clone(), newest.clone());
            format!(
                "the worktree {rel} was deleted while the agent ran (by this or another agent); nothing landed; {how}, kept: {} (the story's next attempt starts from {}); {lost}",
                refs.join(", "),
                short(newest)
            )
        }
        Some(_) => {
            let who = if dangling && live > 0 {
                format!(
                    "; ralph cannot tell which agent made them ({live} other worktree{} {} live)",
                    if live == 1 { "" } else { "s" },
                    if live == 1 { "was" } else { "were" }
                )
            } else {
                String::new()
            };
            worked.feedback.push(Feedback::about(
                &flight.story_id,
                format!(
                    "Your previous attempt's worktree was deleted while the agent ran. Work that may be yours is kept in {}; look at it with git show. Your next attempt starts from the run branch.",
                    kept.join(", ")
                ),
            ));
            format!(
                "the worktree {rel} was deleted while the agent ran (by this or another agent); nothing landed; {how}, kept: {}{who}; the story's next attempt starts from the run branch: work that may be yours is kept in {}; look at it with git show; {lost}",
                refs.join(", "),
                kept.join(", ")
            )
        }
        None => format!(
            "the worktree {rel} was deleted while the agent ran (by this or another agent); nothing landed, and no commit of its was left to keep{elsewhere}; {lost}"
        ),
    };
    // Said once: the iteration's outcome line carries the message (no warning line as well).
    if worked.draft.record.outcome != Outcome::AgentError {
        set_outcome(worked, Outcome::AgentError, message.clone());
    } else {
        let before = worked.draft.record.message.take().unwrap_or_default();
        worked.draft.record.message = Some(format!("{message}\n{before}").trim_end().to_owned());
    }
    clear_pass(worked);
    Ok(())
}

/// Where a worktree's files that no commit takes are kept before it goes:
/// `.ralph/kept/<run>/<iteration>/`.
pub struct Kept<'a> {
    /// The run's paths (the books).
    pub paths: &'a RunPaths,
    /// The run.
    pub run_id: &'a str,
    /// The iteration that ran in the worktree.
    pub iteration: u32,
    /// The worktree's root.
    pub root: &'a Path,
}

impl Kept<'_> {
    /// Keeps the secret-looking files `withheld` (left out of the worktree's commit: ralph never
    /// commits them) and the ignored files the agent wrote since `since`
    /// ([`git_land::ignored_work`]: a serial run leaves them in the checkout; the worktree's
    /// removal would delete them), and returns the record's findings naming them and the
    /// ignored files left out for their size.
    pub fn keep(
        &self,
        tree: &Repo,
        withheld: &[String],
        since: std::time::SystemTime,
    ) -> Vec<String> {
        let mut findings = Vec::new();
        if !withheld.is_empty() {
            let dir = self.copy(withheld);
            findings.push(format!(
                "not committed (secret-looking, untracked): {} — ralph never commits such a file; kept in {} as the worktree is removed",
                withheld.join(", "),
                self.paths.rel(&dir)
            ));
        }
        let ignored = match git_land::ignored_work(tree, since) {
            Ok(ignored) => ignored,
            Err(e) => {
                tracing::warn!("cannot list the worktree's ignored files: {e}");
                return findings;
            }
        };
        if !ignored.keep.is_empty() {
            let dir = self.copy(&ignored.keep);
            findings.push(format!(
                "ignored files the agent wrote in its worktree (not committed: git ignores them): {} — kept in {} as the worktree is removed",
                ignored.keep.join(", "),
                self.paths.rel(&dir)
            ));
        }
        if !ignored.too_big.is_empty() {
            findings.push(format!(
                "ignored files the agent wrote in its worktree, not kept (over {} MiB each, {} MiB or {} files together): {} — deleted with the worktree",
                git_land::KEEP_FILE_BYTES >> 20,
                git_land::KEEP_TOTAL_BYTES >> 20,
                git_land::KEEP_FILES,
                ignored.too_big.join(", ")
            ));
        }
        findings
    }

    /// Copies `files` (relative to the worktree) to the kept directory, keeping their relative
    /// paths, and returns that directory; a file that cannot be copied is logged.
    fn copy(&self, files: &[String]) -> PathBuf {
        let dir = self
            .paths
            .ralph_dir
            .join("kept")
            .join(self.run_id)
            .join(self.iteration.to_string());
        for file in files {
            let (from, to) = (self.root.join(file), dir.join(file));
            let copied = to
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::copy(&from, &to).map(|_| ()));
            if copied.is_err() {
                tracing::warn!("cannot keep {}: {copied:?}", from.display());
            }
        }
        dir
    }
}

/// [`guard_branch`] before a landing: its warning goes to the record's findings and the
/// terminal; when agents' commits in the checkout could not be taken off the branch, the
/// iteration is `landing_refused` (nothing lands on that branch).
///
/// # Errors
/// As [`guard_branch`].
fn guarded(s: &Session, board: &mut Board, worked: &mut Worked) -> anyhow::Result<()> {
    let Some(warning) = guard_branch(s, board)? else {
        return Ok(());
    };
    // Said once: with the iteration's line, where the record's findings are shown.
    worked.draft.record.findings.push(warning);
    if matches!(
        board.stopping,
        Some(StopReason::NeedsHuman {
            outcome: Outcome::LandingRefused,
            ..
        })
    ) {
        set_outcome(
            worked,
            Outcome::LandingRefused,
            "the landing was refused: an agent's commits in your checkout could not be taken off the run branch without touching your change (see the findings)".into(),
        );
    }
    Ok(())
}

/// Steps 1–4 of the module docs for an iteration whose worktree exists; returns its landing.
pub(super) async fn onto_branch(
    cfg: &RunConfig,
    s: &mut Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Option<LandingRecord>> {
    let paths = s.pre.paths.clone();
    let tree = Repo::discover(&flight.root)?;
    let story = flight.story_id.clone();
    let work = flight.work.clone().unwrap_or_else(|| flight.base.clone());
    let (edits, tip) = before_landing(s, board, worked, out)?;
    let mut landing = LandingRecord {
        kind: LandingKind::NotLanded,
        resolves: None,
        onto: Some(tip.clone()),
        commit: None,
        salvage_ref: None,
        files: Vec::new(),
        landed_since: board.landed[flight.landed_before.min(board.landed.len())..].to_vec(),
        message: None,
    };
    if stops_first(s, board, flight, worked, &mut landing, edits)? {
        return Ok(Some(landing));
    }
    let keep = kept_paths(&paths);
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    let integrated = if tip == flight.base {
        // Nothing landed since the story started: the branch moves to its work as it is, and
        // ralph puts the run's prd.json and progress.txt back on top (below).
        Integration::Clean {
            commit: work.clone(),
            fast_forward: true,
        }
    } else {
        git_land::integrate(&tree, &tip, &keep)?
    };
    // The setup's files (set aside in `land`) are back for the check; where the tip brought a
    // file of the same name, the tip's stays.
    git_land::put_back(&tree);
    let (result, fast_forward) = match integrated {
        Integration::Clean {
            commit,
            fast_forward,
        } => (commit, fast_forward),
        Integration::Conflict {
            files,
            ours,
            theirs,
        } => {
            conflicted(s, flight, worked, &mut landing, (files, ours, theirs))?;
            return Ok(Some(landing));
        }
    };
    // Only a story landed since its start changes the code it meets: ralph's own records
    // (progress.txt, prd.json) do not call for the check again.
    if !landing.landed_since.is_empty() {
        if let Some(failed) = check_landed(cfg, s, flight, worked, stop, out).await? {
            let salvage = git_land::salvage(&s.pre.repo, &s.run_id, &story, &result)?;
            let message = format!(
                "its check fails once {} landed; the landing was undone and its work is kept in {salvage}",
                or_none(&landing.landed_since)
            );
            worked.feedback.push(Feedback::about(
                &story,
                format!(
                    "Your work on {story} passed its check alone, but the check fails with the stories landed meanwhile ({}) present. Your next attempt starts from your work with theirs merged in: make the check pass with both.\n{failed}",
                    or_none(&landing.landed_since)
                ),
            ));
            board.resume.insert(story.clone(), result);
            set_outcome(worked, Outcome::VerifyFailed, message.clone());
            landing.kind = LandingKind::Reverted;
            landing.salvage_ref = Some(salvage);
            landing.message = Some(message);
            clear_pass(worked);
            return Ok(Some(landing));
        }
    }
    let branch = board
        .branch
        .clone()
        .or_else(|| s.pre.repo.current_branch())
        .unwrap_or_default();
    // The run's own prd.json and progress.txt, as they are before the checkout moves: the
    // story's copies never land.
    let own = Own::read(&paths);
    // A ralph killed while the checkout moves leaves files at the result and the branch at the
    // tip: the next run finishes the move from this note (`recover::finish_landing`).
    let note = crate::run::recover::LandingNote {
        branch: branch.clone(),
        from: tip.clone(),
        to: result.clone(),
    };
    note.write(&paths.ralph_dir)?;
    crate::process::kill_point("landing-noted");
    let advanced = advance(s, board, worked, (&branch, &tip, &result))?;
    crate::run::recover::LandingNote::clear(&paths.ralph_dir);
    if let Err(e) = advanced {
        let salvage = git_land::salvage(&s.pre.repo, &s.run_id, &story, &result)?;
        let message = format!(
            "the landing was refused: {e}\nThe story's work is kept in {salvage}; the story's next attempt (in the next run) starts from there and lands once its check passes."
        );
        board.resume.insert(story.clone(), result);
        // Not the story's failure: no attempt is spent, and the run stops for the user.
        set_outcome(worked, Outcome::LandingRefused, message.clone());
        landing.salvage_ref = Some(salvage);
        landing.message = Some(message.clone());
        clear_pass(worked);
        board.stopping.get_or_insert(StopReason::NeedsHuman {
            outcome: Outcome::LandingRefused,
            iteration: flight.iteration,
            message: Some(message),
        });
        landing.kind = LandingKind::Refused;
        return Ok(Some(landing));
    }
    crate::process::kill_point("landing-moved");
    own.restore(&paths)?;
    mark_passing(&paths, &story, worked.story_notes.as_deref())?;
    crate::process::kill_point("landing-marked");
    board.landed.push(story);
    landing.kind = if fast_forward {
        LandingKind::FastForward
    } else {
        LandingKind::Merge
    };
    landing.commit = Some(result);
    Ok(Some(landing))
}

/// [`git_land::advance_checkout`] of the run branch `branch` from `tip` (ralph's) to `result`.
/// When an agent moved the branch from its worktree after the landing read `tip` (`git
/// update-ref`, `git -C <checkout> commit`), the branch guard takes that move off and names it
/// (a finding and a warning), and the move is tried again, at most 3 times; a move the guard
/// leaves (the user's own commit in the checkout) is returned as the error it was.
///
/// # Errors
/// The guard's own errors (git failing to read or write refs); the checkout's error is the
/// `Ok` value's.
fn advance(
    s: &Session,
    board: &mut Board,
    worked: &mut Worked,
    (branch, tip, result): (&str, &str, &str),
) -> anyhow::Result<Result<(), crate::git::GitError>> {
    let name = format!("refs/heads/{branch}");
    let mut advanced = git_land::advance_checkout(&s.pre.repo, branch, tip, result);
    for _ in 0..3 {
        let moved = s.pre.repo.ref_sha(&name).is_some_and(|now| now != tip);
        if advanced.is_ok() || !moved || board.tip.as_deref() != Some(tip) {
            break;
        }
        guarded(s, board, worked)?;
        if s.pre.repo.ref_sha(&name).as_deref() != Some(tip) {
            break;
        }
        advanced = git_land::advance_checkout(&s.pre.repo, branch, tip, result);
    }
    Ok(advanced)
}

/// The steps before a landing, in the checkout: an agent's move of the run branch taken off
/// (the guard), the user's edits of prd.json and progress.txt committed ([`commit_edits`],
/// whose result is returned for [`stops_first`]), and the tip the story lands on (full sha).
///
/// # Errors
/// The guards' errors; the run branch having no commit.
fn before_landing(
    s: &Session,
    board: &mut Board,
    worked: &mut Worked,
    out: &mut Outputs,
) -> anyhow::Result<(anyhow::Result<Option<String>>, String)> {
    // An agent's commit in the checkout made since the landing began (while this worktree's
    // leftovers were committed) is taken off before the story lands on top of it.
    guarded(s, board, worked)?;
    // The user's edits to prd.json or progress.txt since the last landing are theirs: committed
    // as they are before the story lands on top; what a worker wrote there is set back first.
    super::own::guard(s, board, out)?;
    let edits = commit_edits(s);
    let moved = edits
        .as_ref()
        .err()
        .and_then(|e| e.downcast_ref::<crate::git::GitError>());
    if matches!(moved, Some(crate::git::GitError::BranchMoved { .. })) {
        // Moved by another process between the guard above and that commit (an agent's
        // `git update-ref` from its worktree): taken off and named before the story lands.
        guarded(s, board, worked)?;
    }
    let tip = board
        .branch
        .as_deref()
        .and_then(|b| s.pre.repo.ref_sha(&format!("refs/heads/{b}")))
        .or(s.pre.repo.head_sha()?)
        .ok_or_else(|| anyhow::anyhow!("the run branch has no commit"))?;
    Ok((edits, tip))
}

/// Keeps the work of an iteration that did not pass its story (or was interrupted) under a
/// salvage ref for the story's next attempt, and says so in its record.
fn keep_unlanded(
    s: &Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    landing: &mut LandingRecord,
) -> anyhow::Result<()> {
    let story = &flight.story_id;
    let work = flight.work.clone().unwrap_or_else(|| flight.base.clone());
    let interrupted = worked.draft.record.outcome == Outcome::Interrupted;
    if worked.draft.record.outcome == Outcome::LandingRefused {
        landing.kind = LandingKind::Refused;
        // Why, for the landing's label (`refused: index locked`, …).
        if landing.message.is_none() {
            landing.message = worked.draft.record.message.clone();
        }
    }
    if work != flight.base {
        let salvage = git_land::salvage(&s.pre.repo, &s.run_id, story, &work)?;
        if interrupted {
            let message = format!(
                "interrupted by a stop signal; its work is kept in {salvage} (not landed: it was not checked)"
            );
            set_outcome(worked, Outcome::Interrupted, message);
        }
        landing.salvage_ref = Some(salvage);
        board.resume.insert(story.clone(), work);
    } else if interrupted {
        set_outcome(
            worked,
            Outcome::Interrupted,
            "interrupted by a stop signal before it changed anything".into(),
        );
    }
    clear_pass(worked);
    Ok(())
}

/// Before a landing: when the run can land nothing now, records why and returns `true`.
/// ralph's commit of the user's edits (`edits`, [`commit_edits`]) refused by another git
/// process's lock held past ralph's wait refuses the landing (`landing_refused`, the run stops);
/// once the run stops for the user (a landing refused, a login or config error), an iteration
/// that ends lands nothing (its work kept, [`held_back`]); a story that did not pass (or was
/// interrupted or refused) lands nothing either ([`keep_unlanded`]).
///
/// # Errors
/// `edits`' other errors; git failing to write a salvage ref.
fn stops_first(
    s: &Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    landing: &mut LandingRecord,
    edits: anyhow::Result<Option<String>>,
) -> anyhow::Result<bool> {
    if let Err(e) = edits {
        match e.downcast_ref::<crate::git::GitError>() {
            // Another git process holds the checkout's index past ralph's wait: nothing lands,
            // the story's work is kept, and the run stops for the user.
            Some(crate::git::GitError::Locked { .. }) => {
                let message = format!("the landing was refused: {e}");
                set_outcome(worked, Outcome::LandingRefused, message.clone());
                board.stopping.get_or_insert(StopReason::NeedsHuman {
                    outcome: Outcome::LandingRefused,
                    iteration: flight.iteration,
                    message: Some(message.clone()),
                });
                keep_unlanded(s, board, flight, worked, landing)?;
                landing.message = Some(message);
                return Ok(true);
            }
            // Another git process committed on the branch meanwhile: the edits go with the
            // next commit; the guard before the record names that commit.
            Some(crate::git::GitError::BranchMoved { .. }) => {}
            _ => return Err(e),
        }
    }
    if let Some(StopReason::NeedsHuman {
        outcome, iteration, ..
    }) = &board.stopping
    {
        if worked.draft.record.outcome == Outcome::LandingRefused {
            // Refused by this landing's own guard: recorded as such below.
            keep_unlanded(s, board, flight, worked, landing)?;
            return Ok(true);
        }
        // The run stops for the user: nothing more lands (as after `ralph stop`'s signal, the
        // work is kept under a salvage ref and named; the next run lands it after its check).
        let why = format!(
            "not landed: the run stops because iteration {iteration} needs you ({})",
            outcome.as_str()
        );
        held_back(s, board, flight, worked, landing, &why)?;
        return Ok(true);
    }
    if !worked.story_passes
        || matches!(
            worked.draft.record.outcome,
            Outcome::Interrupted | Outcome::LandingRefused
        )
    {
        keep_unlanded(s, board, flight, worked, landing)?;
        return Ok(true);
    }
    Ok(false)
}

/// Keeps the work of an iteration that ended after the run began to stop for the user
/// (`why`): nothing lands; the work is under a salvage ref for the story's next attempt, and
/// the record is `interrupted` (not the story's failure: no attempt is spent).
fn held_back(
    s: &Session,
    board: &mut Board,
    flight: &Flight,
    worked: &mut Worked,
    landing: &mut LandingRecord,
    why: &str,
) -> anyhow::Result<()> {
    let work = flight.work.clone().unwrap_or_else(|| flight.base.clone());
    let message = if work == flight.base {
        format!("{why}; the agent changed nothing")
    } else {
        let salvage = git_land::salvage(&s.pre.repo, &s.run_id, &flight.story_id, &work)?;
        board.resume.insert(flight.story_id.clone(), work);
        landing.salvage_ref = Some(salvage.clone());
        format!("{why}; its work is kept in {salvage}, where the next run starts it from (it lands only after its check)")
    };
    set_outcome(worked, Outcome::Interrupted, message.clone());
    landing.message = Some(message);
    clear_pass(worked);
    Ok(())
}

/// Records a landing that conflicted (`files`, and the branch's and the story's side): the
/// story's work under a salvage ref, the conflict as feedback for its next attempt.
fn conflicted(
    s: &Session,
    flight: &Flight,
    worked: &mut Worked,
    landing: &mut LandingRecord,
    (files, ours, theirs): (Vec<String>, String, String),
) -> anyhow::Result<()> {
    let story = &flight.story_id;
    let work = flight.work.clone().unwrap_or_else(|| flight.base.clone());
    let salvage = git_land::salvage(&s.pre.repo, &s.run_id, story, &work)?;
    let message = format!(
        "its work conflicts with what landed meanwhile ({}) in {}; nothing landed, its commits are kept in {salvage}",
        or_none(&landing.landed_since),
        files.join(", ")
    );
    worked.feedback.push(Feedback::about(
        story,
        format!(
            "Your previous attempt at {story} could not land: it conflicts with work landed on the branch meanwhile, in {}. You now start from the branch with that work in; redo your change on top of it (your earlier commits are kept in {salvage}).\nThe branch's side: {ours}\nYour side: {theirs}",
            files.join(", ")
        ),
    ));
    set_outcome(worked, Outcome::Conflict, message.clone());
    landing.kind = LandingKind::Conflict;
    landing.files = files;
    landing.salvage_ref = Some(salvage);
    landing.message = Some(message);
    clear_pass(worked);
    Ok(())
}

/// Runs the story's check on the landed result, in its worktree; returns the failure's text
/// (`None`: it passed, or the story has no check).
pub(super) async fn check_landed(
    cfg: &RunConfig,
    s: &Session,
    flight: &Flight,
    worked: &mut Worked,
    stop: &StopSignals,
    out: &mut Outputs,
) -> anyhow::Result<Option<String>> {
    let Some(command) = worked.check.clone() else {
        return Ok(None);
    };
    let check = crate::run::iteration::verify::Check {
        cfg,
        repo_root: &flight.root,
        stop,
        tag: crate::process::agent_tag(&s.run_id, flight.iteration),
        // `--sandbox`: the check runs code the agent wrote, so in its agent's sandbox (rooted
        // in the worktree the check runs in, as the worker's own was).
        sandbox: s
            .pre
            .agents
            .get(flight.agent)
            .and_then(|a| a.sandbox.as_ref()),
    };
    out.emit(RunEvent::VerifyStarted {
        iteration: flight.iteration,
        story_id: flight.story_id.clone(),
        command: command.clone(),
    });
    let checked = check.run(&command, &flight.story_id).await?;
    out.emit(RunEvent::VerifyFinished {
        iteration: flight.iteration,
        verify: checked.record.clone(),
    });
    let passed = checked.record.passed;
    let text = format!(
        "`{command}` failed on the landed tip:\n{}",
        checked.record.output_tail
    );
    worked.draft.record.verify.push(checked.record);
    Ok((!passed).then_some(text))
}

/// The record of an iteration whose worker never got to run its agent.
fn synthetic(s: &Session, flight: &Flight, outcome: Outcome, message: String) -> Worked {
    let mut r = LedgerRecord::new(
        &s.run_id,
        flight.iteration,
        &flight.story_id,
        outcome,
        Utc::now(),
    );
    let prd = store::load_shared(&s.pre.paths.prd).ok();
    r.story_title = prd
        .as_ref()
        .and_then(|l| l.prd.story(&flight.story_id).map(|x| x.title.clone()))
        .unwrap_or_default();
    r.feature = prd.and_then(|l| l.prd.branch_name.clone());
    r.backend = s.pre.agents[flight.agent]
        .backend
        .kind()
        .as_str()
        .to_string();
    r.head_before = Some(flight.base.clone());
    r.message = Some(message);
    // A worker writes its transcript in the run's books: one that got to the agent has one.
    let transcript = s.pre.paths.transcript(&s.run_id, flight.iteration);
    r.transcript = transcript.exists().then(|| s.pre.paths.rel(&transcript));
    Worked {
        story_id: flight.story_id.clone(),
        slot: flight.slot,
        draft: Draft {
            progress_summary: String::new(),
            subject: format!(
                "ralph: iteration {} ({})",
                flight.iteration, flight.story_id
            ),
            body: format!("Outcome: {}.", outcome.as_str()),
            clock: None,
            signal_at: None,
            staged: None,
            record: r,
        },
        feedback: Vec::new(),
        resume_at: None,
        story_passes: false,
        story_notes: None,
        check: None,
    }
}

/// Where what the record did to the run branch starts: where its landing found the branch; with
/// nothing landed, the tip as it is now, so that its commits and files (`ralph show`, `log`, the
/// report) are its own record's, never those of the stories that landed since it started.
///
/// # Errors
/// git failing to read HEAD.
fn record_start(s: &Session, board: &Board, worked: &mut Worked) -> anyhow::Result<()> {
    match &worked.draft.record.landing {
        Some(landing) => {
            if landing.onto.is_some() {
                worked.draft.record.head_before = landing.onto.clone();
            }
        }
        None => {
            if let Some(tip) = own_tip(s, board)? {
                worked.draft.record.head_before = Some(tip);
            }
        }
    }
    Ok(())
}

/// The record of an iteration whose agent ran and whose worktree was deleted while it ran: its
/// time is the agent's (from its start, as state.json noted it, else the worktree's making, to
/// now), and its message is left to [`gone`].
fn ran_in_gone_tree(s: &Session, flight: &Flight) -> Worked {
    let started = s
        .state
        .flights
        .iter()
        .find(|f| f.iteration == flight.iteration)
        .and_then(|f| f.worktree.as_ref())
        .and_then(|t| t.agent_started_at)
        .unwrap_or(flight.started_at);
    let mut worked = synthetic(s, flight, Outcome::AgentError, String::new());
    let now = Utc::now();
    worked.draft.record.started_at = started;
    worked.draft.record.ended_at = now;
    worked.draft.record.duration_s = (now - started).num_milliseconds().max(0) as f64 / 1000.0;
    worked.draft.record.message = None;
    worked
}

/// Changes the record's outcome (and says why).
fn set_outcome(worked: &mut Worked, outcome: Outcome, message: String) {
    worked.draft.record.outcome = outcome;
    worked.draft.record.message = Some(message);
    worked.draft.body = format!("Outcome: {}.", outcome.as_str());
}

/// The story did not land: it does not pass on the run branch, whatever its worktree said.
fn clear_pass(worked: &mut Worked) {
    worked.story_passes = false;
    let story = worked.story_id.clone();
    worked.draft.record.passes_flipped.retain(|id| *id != story);
}

/// Other stories the agent marked passing in its worktree's prd.json: that copy never lands
/// (ralph sets only the landed story's `passes`), so they are not flipped on the run branch; the
/// record's findings say so.
fn only_own_pass(worked: &mut Worked) {
    let story = worked.story_id.clone();
    let record = &mut worked.draft.record;
    let others: Vec<String> = record
        .passes_flipped
        .iter()
        .filter(|id| **id != story)
        .cloned()
        .collect();
    if others.is_empty() {
        return;
    }
    record.passes_flipped.retain(|id| *id == story);
    record.findings.push(format!(
        "the agent also marked {} passing in its worktree's prd.json; not taken: in a parallel run a story passes only when its own iteration lands",
        others.join(", ")
    ));
}

/// The progress.txt summary line, from the record as it is now.
fn refresh_summary(draft: &mut Draft) {
    let r = &draft.record;
    draft.progress_summary = commit::progress_summary(
        &r.commits,
        &r.files_changed,
        &r.passes_flipped,
        r.promise_seen,
        r.message.as_deref(),
    );
}

/// Sets `story`'s `passes` (and its `notes`, when the worktree changed them) in the run's
/// prd.json, touching only those bytes.
fn mark_passing(paths: &RunPaths, story: &str, notes: Option<&str>) -> anyhow::Result<()> {
    let loaded = store::load(&paths.prd)?;
    let mut raw = store::set_passes(&loaded.raw, story, true)?;
    if let Some(notes) = notes {
        let before = loaded.prd.story(story).map(|s| s.notes.as_str());
        if before != Some(notes) {
            raw = store::set_notes(&raw, story, notes)?;
        }
    }
    write_atomic(&paths.prd, &raw)?;
    Ok(())
}

/// What the agent appended to its worktree's progress.txt (the original ralph's agents write
/// their learnings there) between the story's start (`base`) and its work (`work`); `None` when
/// nothing, or when it rewrote the file instead of appending.
fn agent_notes(tree: &Repo, tree_paths: &RunPaths, base: &str, work: &str) -> Option<Vec<u8>> {
    let rel = tree_paths
        .progress
        .strip_prefix(&tree_paths.repo_root)
        .unwrap_or(Path::new("progress.txt"))
        .to_string_lossy()
        .into_owned();
    let before = tree.file_at(base, &rel).ok().flatten().unwrap_or_default();
    let now = tree.file_at(work, &rel).ok().flatten()?;
    let added = now.strip_prefix(before.as_slice())?;
    (!added.iter().all(u8::is_ascii_whitespace)).then(|| added.to_vec())
}

/// Appends an agent's progress.txt notes ([`agent_notes`]) to the run's progress.txt, before
/// ralph's own entry.
fn append_notes(paths: &RunPaths, notes: Option<&[u8]>) -> anyhow::Result<()> {
    let Some(added) = notes else {
        return Ok(());
    };
    crate::progress::ensure_exists(&paths.progress, chrono::Local::now())?;
    let mut text = std::fs::read(&paths.progress).unwrap_or_default();
    if !text.ends_with(b"\n") && !text.is_empty() {
        text.push(b'\n');
    }
    text.extend_from_slice(added);
    write_atomic(&paths.progress, &text)?;
    Ok(())
}

/// The run's prd.json and progress.txt bytes, kept across a move of the checkout.
struct Own(Vec<(PathBuf, Option<Vec<u8>>)>);

impl Own {
    fn read(paths: &RunPaths) -> Own {
        Own([&paths.prd, &paths.progress]
            .into_iter()
            .map(|p| (p.clone(), std::fs::read(p).ok()))
            .collect())
    }

    /// Puts the bytes back where the move changed them.
    fn restore(&self, paths: &RunPaths) -> anyhow::Result<()> {
        let _ = paths;
        for (path, bytes) in &self.0 {
            match bytes {
                Some(b) if std::fs::read(path).ok().as_ref() != Some(b) => write_atomic(path, b)?,
                None if path.exists() => std::fs::remove_file(path)?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// Moves the iteration's transcript and prompt copy from the worktree's books to the run's,
/// where `ralph show` and the record's `transcript` find them.
pub fn bring_transcripts(tree: &RunPaths, paths: &RunPaths, run_id: &str, iteration: u32) {
    for (from, to) in [
        (
            tree.transcript(run_id, iteration),
            paths.transcript(run_id, iteration),
        ),
        (
            tree.prompt_copy(run_id, iteration),
            paths.prompt_copy(run_id, iteration),
        ),
    ] {
        if !from.exists() {
            continue;
        }
        if let Some(dir) = to.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = std::fs::rename(&from, &to) {
            tracing::warn!("cannot move {} to {}: {e}", from.display(), to.display());
        }
    }
}

fn or_none(ids: &[String]) -> String {
    if ids.is_empty() {
        "no other story".into()
    } else {
        ids.join(", ")
    }
}
