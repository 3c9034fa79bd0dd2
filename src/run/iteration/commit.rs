//! Stage 5 of an iteration, and the only place an iteration is written down: the progress.txt
//! entry first (so the checkpoint carries it), then the checkpoint commit with the trailers,
//! the ledger line (the iteration's commit point: once it is written the
//! iteration happened), and state.json. A crashed iteration recovered at the next start goes
//! through [`commit`] too, so there is one record builder and one trailer writer.

use std::time::Instant;

use chrono::{Local, Utc};

use crate::git::{Repo, Trailers};
use crate::ledger;
use crate::progress;
use crate::protocol::{CostSource, LedgerRecord, Price, Usage};
use crate::state::State;
use crate::workspace::RunPaths;

/// An iteration ready to be written: its ledger record with everything but what the commit
/// itself produces (the checkpoint, HEAD after, the end time and duration).
#[derive(Debug, Clone)]
pub struct Draft {
    /// The record; `checkpoint_commit`, `head_after`, `ended_at` and `duration_s` are filled in
    /// by [`commit`].
    pub record: LedgerRecord,
    /// The progress.txt entry's summary line.
    pub progress_summary: String,
    /// The checkpoint commit's subject, e.g. `ralph: iteration 3 (US-002)`.
    pub subject: String,
    /// The checkpoint commit's body, e.g. `Outcome: story_passed.`
    pub body: String,
    /// When the iteration started (monotonic), for the duration; `None` keeps the record's
    /// (a recovered iteration).
    pub clock: Option<Instant>,
    /// When the signal that ended the iteration came, for the record's `shutdown.recorded_s`.
    pub signal_at: Option<Instant>,
    /// The working tree as inspect staged it: the checkpoint stages only the memory files ralph
    /// writes after it on top (`None`, or a staging of another tree: the whole tree is walked).
    pub staged: Option<crate::git::Staged>,
}

/// The places [`commit`] writes to.
#[derive(Debug, Clone, Copy)]
pub struct Sinks<'a> {
    /// The repository.
    pub repo: &'a Repo,
    /// The workspace.
    pub paths: &'a RunPaths,
    /// `--push`: where the checkpoint goes before the ledger line is written.
    pub remote: Option<&'a crate::remote::Remote>,
    /// `--parallel`'s landings: the checkpoint commits only these repository-relative paths
    /// (prd.json, progress.txt, `progress-history/`) and leaves anything else in the checkout
    /// alone ([`crate::git::land::commit_own_files`]); `None`: the whole tree, as a serial
    /// iteration's checkpoint.
    pub only: Option<&'a [&'a str]>,
}

/// What [`commit`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The final record, as the ledger has it.
    pub record: LedgerRecord,
    /// Whether the checkpoint left the working tree clean (everything committed).
    pub tree_clean: bool,
}

/// How a record's finding starts when ralph's own files of a `--parallel` landing (prd.json,
/// progress.txt) could not be committed: another git process held the checkout's lock past
/// [`crate::git::lock_wait`], or committed on the run branch meanwhile (the rest of the
/// finding is the error).
pub const NOT_COMMITTED: &str =
    "ralph's prd.json and progress.txt for this iteration are not committed yet (they stay in the checkout and go with the next commit)";

/// Every this many iterations (and at the end of a run) the loose refs and objects ralph writes are
/// packed ([`crate::git::Repo::housekeeping`]).
pub const PACK_REFS_EVERY: u32 = 100;

/// Writes `draft` down (see the module docs) and returns the final record.
///
/// # Errors
/// progress.txt, git, ledger or state.json could not be written; whatever was written before the
/// failure stays (a restart recovers the iteration from state.json's in-flight entry).
pub fn commit(at: Sinks<'_>, state: &mut State, draft: Draft) -> anyhow::Result<Written> {
    let Draft {
        mut record,
        progress_summary,
        subject,
        body,
        clock,
        signal_at,
        staged,
    } = draft;
    // A ledger that starts while git already has ralph's iterations (a fresh clone, a deleted
    // `.ralph/`) says so on its first record.
    record.rebuilt = rebuilt_mark(at);
    if let Some(target) = progress::detach_link(&at.paths.progress)? {
        let finding = format!(
            "progress.txt was a symbolic link (to {}); ralph does not follow it and wrote a new progress.txt in its place (earlier entries are in git)",
            target.display()
        );
        tracing::warn!("{finding}");
        record.findings.push(finding);
    }
    progress::ensure_exists(&at.paths.progress, Local::now())?;
    // progress.txt stays bounded: its older entries move to progress-history/ (P5).
    if let Some(rolled) = progress::roll(&at.paths.progress, Local::now())? {
        tracing::info!(
            "moved {} bytes of older progress.txt entries to {}",
            rolled.moved_bytes,
            rolled.part.display()
        );
    }
    progress::append_entry(
        &at.paths.progress,
        &progress::Entry {
            at: Local::now(),
            iteration: record.iteration,
            story_id: record.story_id.clone(),
            story_title: record.story_title.clone(),
            outcome: record.outcome,
            commit: record.commits.last().cloned(),
            summary: progress_summary,
        },
    )?;
    record.unblocked = state.unblocked.clone();
    let trailers = Trailers {
        run_id: record.run_id.clone(),
        iteration: record.iteration,
        story_id: record.story_id.clone(),
        outcome: record.outcome,
        feature: record.feature.clone(),
        unblocked: record.unblocked.clone(),
    };
    // An agent stopped by a signal may have been killed inside `git commit`: its index.lock
    // would fail the checkpoint, which must land before the shutdown pushes it.
    if record.outcome == crate::protocol::Outcome::Interrupted {
        at.repo.clear_stale_locks();
    }
    let checkpoint = match at.only {
        Some(paths) => {
            let made = crate::git::land::commit_own_files_on_own_tip(
                at.repo,
                paths,
                &subject,
                &body,
                &trailers.pairs(),
            );
            let made = match made {
                Ok(made) => made,
                // --parallel: another git process held the checkout's lock past ralph's wait,
                // or committed on the run branch meanwhile. The record is still written (the
                // files stay in the checkout, committed with the next landing); the
                // dispatcher sees the finding and stops or guards the branch.
                Err(
                    e @ (crate::git::GitError::Locked { .. }
                    | crate::git::GitError::BranchMoved { .. }),
                ) => {
                    record.findings.push(format!("{NOT_COMMITTED}: {e}"));
                    None
                }
                Err(e) => return Err(e.into()),
            };
            crate::git::Checkpoint {
                commit: made,
                clean: false,
                withheld: Vec::new(),
            }
        }
        None => at.repo.checkpoint_after(
            &subject,
            &body,
            &trailers.pairs(),
            staged.as_ref(),
            &super::inspect::memory_paths(at.paths, at.repo.root()),
        )?,
    };
    record.checkpoint_commit = checkpoint.commit;
    let withheld = newly_withheld(&checkpoint.withheld);
    if !withheld.is_empty() {
        record.findings.push(withheld_finding(&withheld));
    }
    record.head_after = at.repo.head_sha()?;
    if let Some(finding) = secret_finding(at.repo, &record) {
        tracing::warn!("{finding}");
        record.findings.push(finding);
    }
    // The iteration's commit point waits for the push: the ledger then says whether the remote
    // has it. (The `end` ref is pinned later, before a wait or at the end, and goes with the
    // next push or the lease's release.)
    if let Some(remote) = at.remote {
        record.push = Some(remote.push());
    }
    record.ended_at = Utc::now();
    if let (Some(shutdown), Some(signal_at)) = (record.shutdown.as_mut(), signal_at) {
        shutdown.recorded_s = signal_at.elapsed().as_secs_f64();
    }
    // A recovered iteration's real duration is unknown (ralph was killed during it): it keeps
    // the draft's.
    if let Some(c) = clock {
        record.duration_s = c.elapsed().as_secs_f64();
    }
    crate::process::kill_point("commit-checkpointed");
    ledger::append(&at.paths.ledger, &record)?;
    // The unblock is on record now (ledger and trailer).
    state.unblocked.clear();

    if record.outcome.is_attempt() {
        *state.attempts.entry(record.story_id.clone()).or_insert(0) += 1;
    }
    state.iteration = state.iteration.max(record.iteration);
    state.last_outcome = Some(record.outcome.as_str().to_string());
    state.in_flight = None;
    state.flights.retain(|f| f.iteration != record.iteration);
    state.save(&at.paths.ralph_dir)?;
    if record.iteration % PACK_REFS_EVERY == 0 {
        for warning in at.repo.housekeeping() {
            tracing::warn!("{warning}");
        }
    }
    Ok(Written {
        record,
        tree_clean: checkpoint.clean,
    })
}

/// Largest patch read for secrets after a checkpoint, in bytes.
const SECRET_SCAN_MAX_BYTES: usize = 8 << 20;

/// The finding, when what the iteration committed (the agent's commits and ralph's checkpoint)
/// adds a line holding a secret the run knows (`crate::redact`): the diff is the repository's
/// content, which ralph cannot redact, so the record says so loudly, naming the files.
fn secret_finding(repo: &Repo, record: &LedgerRecord) -> Option<String> {
    let (Some(from), Some(to)) = (&record.head_before, &record.head_after) else {
        return None;
    };
    if from == to {
        return None;
    }
    // Only the added lines: a line diff of a 40 MB prd.json would cost more than the rest of
    // the iteration's bookkeeping (see `git::scan`).
    let added = repo.added_text(from, to, SECRET_SCAN_MAX_BYTES).ok()?;
    let files = crate::redact::files_with_secrets(&crate::redact::current(), &added);
    (!files.is_empty()).then(|| {
        format!(
            "SECRET COMMITTED: the iteration's commits add a secret-looking value in {} — it is in git history now (shown <redacted> by ralph, not in git): rotate the key, and rewrite the commit before pushing",
            files.join(", ")
        )
    })
}

/// Those of `paths` (secret-looking files a checkpoint left out) not yet said in this process:
/// each is said once (at the start of the run, or by the first iteration that left it out),
/// not after every iteration.
pub fn newly_withheld(paths: &[String]) -> Vec<String> {
    static SAID: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let Ok(mut said) = SAID.lock() else {
        return paths.to_vec();
    };
    paths
        .iter()
        .filter(|p| said.insert((*p).clone()))
        .cloned()
        .collect()
}

/// The finding naming the secret-looking files a checkpoint left out, e.g. `not committed
/// (secret-looking, untracked): .env — ralph never commits such a file; add it to .gitignore`.
pub fn withheld_finding(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(5).map(String::as_str).collect();
    format!(
        "not committed (secret-looking, untracked): {}{} — ralph never commits such a file; add it to .gitignore, or commit it yourself if it is meant to be shared",
        shown.join(", "),
        if paths.len() > 5 {
            format!(" and {} more", paths.len() - 5)
        } else {
            String::new()
        }
    )
}

/// Points `refs/ralph/<run>/<n>/end` at the iteration's result (HEAD after its checkpoint), so
/// that whatever happens to branches later it stays reachable. Written when the loop does not go
/// straight on to the next iteration (before a wait, at the end of a run): otherwise the next
/// iteration's `start` ref pins the same commit, and one ref per iteration is enough.
///
/// # Errors
/// git errors writing the reference.
pub fn pin_end(repo: &Repo, record: &LedgerRecord) -> anyhow::Result<()> {
    if let Some(head) = &record.head_after {
        repo.set_ref(
            &format!("refs/ralph/{}/{}/end", record.run_id, record.iteration),
            head,
        )?;
    }
    Ok(())
}

/// The `rebuilt` mark for a record about to start a new ledger when git already remembers
/// iterations; `None` when the ledger has records (or git has none).
fn rebuilt_mark(at: Sinks<'_>) -> Option<crate::protocol::Rebuilt> {
    let empty = std::fs::metadata(&at.paths.ledger).map_or(true, |m| m.len() == 0);
    if !empty {
        return None;
    }
    let from_git = crate::history::records_from_git(
        &at.repo
            .trailer_history(crate::history::MAX_GIT_RECORDS)
            .ok()?,
    );
    let last = from_git.iter().map(|r| r.iteration).max()?;
    Some(crate::protocol::Rebuilt {
        from: "git".to_owned(),
        iterations: u32::try_from(from_git.len()).unwrap_or(u32::MAX),
        last_iteration: last,
    })
}

/// The iteration's cost: the agent's own report, else its tokens priced from ralph.toml's
/// `[prices]` when the model has an entry, else unknown.
pub fn cost(
    reported: Option<f64>,
    usage: &Usage,
    price: Option<&Price>,
) -> (Option<f64>, Option<CostSource>) {
    match (reported, price) {
        (Some(c), _) => (Some(c), Some(CostSource::Agent)),
        (None, Some(p)) if !usage.is_empty() => (Some(p.cost(usage)), Some(CostSource::PriceTable)),
        _ => (None, None),
    }
}

/// A token count of 0 means the agent reported none: recorded as absent, not as zero.
pub fn reported(tokens: u64) -> Option<u64> {
    (tokens > 0).then_some(tokens)
}

/// progress.txt's one-line summary of an iteration.
pub fn progress_summary(
    commits: &[String],
    files: &[String],
    flipped: &[String],
    promise: bool,
    message: Option<&str>,
) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let mut parts = vec![format!(
        "{} agent commit{}, {} file{} changed",
        commits.len(),
        plural(commits.len()),
        files.len(),
        plural(files.len())
    )];
    if !flipped.is_empty() {
        parts.push(format!("passes set: {}", flipped.join(", ")));
    }
    if promise {
        parts.push("completion promise printed".into());
    }
    if let Some(m) = message {
        parts.push(m.to_string());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_prefers_the_agent_then_the_price_table_and_never_invents_zero() {
        let price = Price {
            input: 1.0,
            output: 2.0,
            cache_read: None,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Usage::default()
        };
        assert_eq!(
            cost(Some(0.5), &usage, Some(&price)),
            (Some(0.5), Some(CostSource::Agent))
        );
        assert_eq!(
            cost(None, &usage, Some(&price)),
            (Some(3.0), Some(CostSource::PriceTable))
        );
        assert_eq!(cost(None, &Usage::default(), Some(&price)), (None, None));
        assert_eq!(cost(None, &usage, None), (None, None));
        assert_eq!(reported(0), None);
    }
}
