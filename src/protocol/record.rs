//! One iteration as `.ralph/ledger.jsonl` keeps it ([`LedgerRecord`]), written once by the
//! iteration's commit stage and read by `ralph status`, resume and the reports.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::outcome::Outcome;
use super::time::rfc3339;
use super::usage::CostSource;

/// One iteration, as recorded in `.ralph/ledger.jsonl`. Field names are the wire names. Optional
/// fields are `null` when unknown (e.g. tokens for a backend that reports none); lists are `[]`.
/// Reading tolerates unknown fields and missing optional ones, so older and newer ralphs can
/// share a ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LedgerRecord {
    /// Run id (one per `ralph run` invocation).
    pub run_id: String,
    /// Iteration number; numbering continues across runs of the same repository.
    pub iteration: u32,
    /// Id of the story the iteration worked on.
    pub story_id: String,
    /// Title of that story, as it was when the iteration started.
    #[serde(default)]
    pub story_title: String,
    /// Backend name, e.g. `claude` or `exec`.
    pub backend: String,
    /// The agent (profile) that ran the iteration, in a run with fallback agents: an
    /// `[[agents]]` table's name or the backend's (absent in runs with one agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Model name, when known.
    #[serde(default)]
    pub model: Option<String>,
    /// Agent CLI version, when it reported one.
    #[serde(default)]
    pub agent_version: Option<String>,
    /// When the agent was started (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    #[schemars(with = "String")]
    pub started_at: DateTime<Utc>,
    /// When the iteration ended (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    #[schemars(with = "String")]
    pub ended_at: DateTime<Utc>,
    /// Wall-clock duration in seconds.
    pub duration_s: f64,
    /// How the iteration ended.
    pub outcome: Outcome,
    /// The agent's exit code, when it exited normally.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal number that killed the agent, when it was killed.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Uncached input tokens, when reported.
    #[serde(default)]
    pub tokens_in: Option<u64>,
    /// Output tokens, when reported.
    #[serde(default)]
    pub tokens_out: Option<u64>,
    /// Input tokens read from the prompt cache, when reported.
    #[serde(default)]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the prompt cache, when reported.
    #[serde(default)]
    pub cache_creation_tokens: Option<u64>,
    /// Cost in USD: reported by the agent, or computed from ralph.toml's price table for a CLI
    /// that reports only tokens (see `cost_source`); `null` when neither.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Where `cost_usd` came from: `agent` or `price_table`; `null` without a cost.
    #[serde(default)]
    pub cost_source: Option<CostSource>,
    /// Full sha of HEAD before the agent ran (`None` on an unborn branch).
    #[serde(default)]
    pub head_before: Option<String>,
    /// Full sha of HEAD after the checkpoint commit.
    #[serde(default)]
    pub head_after: Option<String>,
    /// Commits the agent made itself, oldest first (full shas).
    #[serde(default)]
    pub commits: Vec<String>,
    /// The commit ralph made for what the agent left uncommitted, if any.
    #[serde(default)]
    pub checkpoint_commit: Option<String>,
    /// Paths changed in the iteration, relative to the repository root.
    #[serde(default)]
    pub files_changed: Vec<String>,
    /// Whether the completion promise was seen in the agent's final text.
    #[serde(default)]
    pub promise_seen: bool,
    /// Story ids whose `passes` went from false to true.
    #[serde(default)]
    pub passes_flipped: Vec<String>,
    /// Story ids whose `passes` went from true to false (or that disappeared while passing).
    #[serde(default)]
    pub passes_reverted: Vec<String>,
    /// The agent's session id, when it reported one.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Transcript path relative to the repository root, e.g. `.ralph/runs/<run>/iter-003.jsonl`.
    #[serde(default)]
    pub transcript: Option<String>,
    /// The verify commands run in this iteration (the gate on stories marked passing, and
    /// `verify_marks_passing`'s check), each with its result and, when it failed, the tail of its
    /// output (bounded, secrets redacted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify: Vec<VerifyRecord>,
    /// What the prd.json guard and the history checks found beyond the story's own work
    /// (stories added, removed or edited, `passes` flipped on another story, history rewritten,
    /// HEAD moved), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    /// Commits the agent made during the iteration and then threw away (a `git reset --hard`, a
    /// deleted branch), full shas, oldest first; each is kept reachable under
    /// `refs/ralph/<run>/<iteration>/lost-<short sha>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_commits: Vec<String>,
    /// The agent rewrote the branch's history in this iteration (HEAD no longer contained the
    /// iteration's start), and what ralph did about it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_rewrite: Option<HistoryRewrite>,
    /// Stories the agent marked passing whose pass ralph did not count and set back to false:
    /// the iteration changed nothing but notes (prd.json, progress.txt, progress-history/), or
    /// it rewrote that story's acceptance criteria. `message` says which and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes_refused: Vec<String>,
    /// Acceptance criteria the agent rewrote in prd.json, one entry per story: ralph put the
    /// original back (the next attempt works against it) and keeps the agent's text here, for a
    /// person to accept by editing prd.json.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria_proposals: Vec<CriteriaProposal>,
    /// prd.json's `branchName` when the iteration ran (the feature its attempts belong to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature: Option<String>,
    /// Stories `ralph run --unblock` freed just before this iteration: their attempts count
    /// from 0 again from this record on (also kept in the commit's `Ralph-Unblocked` trailer,
    /// so a resume from git does not block them again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unblocked: Vec<String>,
    /// A human note, e.g. the error message or why the outcome was chosen.
    #[serde(default)]
    pub message: Option<String>,
    /// `--push`: what pushing this iteration's checkpoint (and renewing the lease) did; absent
    /// without `--push`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushRecord>,
    /// For an iteration a signal ended (SIGTERM, SIGINT, SIGHUP): how long the shutdown took
    /// up to this record, against `--shutdown-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown: Option<ShutdownRecord>,
    /// On the first record of a ledger that started while git already had ralph's iterations
    /// (a fresh clone, a deleted `.ralph/`): the ledger was started anew and its earlier
    /// history is in the commit trailers only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt: Option<Rebuilt>,
    /// Read back from a commit's trailers, not from the ledger (never written to a ledger): only
    /// the run, iteration, story, outcome, feature and commit are known; the duration, cost,
    /// tokens, the agent's commits and the files changed are not (shown as `?`, never as 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_git: bool,
    /// Processes the iteration left running that ralph killed (the agent's after it exited, or
    /// the agent's and its verify commands' that a restart found), each with its pid and
    /// command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strays: Vec<StrayProcess>,
    /// Whether the `verify` entries were run by the next `ralph run` on the work this
    /// interrupted iteration left, because ralph was killed before its own verify gate judged
    /// the stories it marked passing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checked_at_restart: bool,
    /// `--sandbox`: how the agent and its checks were confined (absent: `off`).
    #[serde(default, skip_serializing_if = "is_sandbox_off")]
    pub sandbox: super::kinds::SandboxMode,
    /// `--sandbox strict`: the hosts (`host:port`) the agent or its checks tried to reach and
    /// the egress proxy refused, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_hosts: Vec<String>,
    /// The user's hints (`ralph hint`) this iteration's prompt carried, by id. They count as
    /// delivered only when the outcome is one in which the agent got to work; otherwise they
    /// stay pending for the next iteration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<HintRecord>,
    /// `--parallel`: the worker slot (1-based, at most `--parallel`) that ran the iteration;
    /// absent in a serial run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    /// `--parallel`: the story's worktree, relative to the repository root (e.g.
    /// `.ralph/worktrees/<run>/US-002`); removed once its work landed or was saved under a ref.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
    /// `--parallel`: how the story's work came onto the run branch (or why it did not); absent
    /// in a serial run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing: Option<LandingRecord>,
}

/// How a `--parallel` worker's work came onto the run branch (the ledger's `landing` field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LandingRecord {
    /// What happened.
    pub kind: LandingKind,
    /// The run branch's tip the landing started from (full sha).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onto: Option<String>,
    /// The commit the run branch points at after the landing (full sha); absent when nothing
    /// landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Where the story's commits are kept when they did not land (`conflict`, `reverted`,
    /// an interrupted worker): `refs/ralph/salvage/<run>/<story>`, in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salvage_ref: Option<String>,
    /// The files in conflict (`conflict`), relative to the repository root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The stories landed on the run branch since this story's worktree started (what it
    /// met when it landed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landed_since: Vec<String>,
    /// One sentence for a person (e.g. which check failed once the others were present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `--resolve-conflicts`: this iteration resolved (kind `resolution`) or tried to resolve
    /// (kind `conflict`, refused) the conflict of that iteration's landing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolves: Option<u32>,
}

/// The kinds of [`LandingRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LandingKind {
    /// The run branch had not moved since the story started: it now points at the story's work.
    FastForward,
    /// Other stories landed meanwhile: the story's commits were merged onto the tip (a merge
    /// commit with both as parents).
    Merge,
    /// The merge conflicted: nothing landed, the run branch is as it was, the story's commits
    /// are under `salvage_ref`.
    Conflict,
    /// The story's work merged, but its check failed with the other landed stories present:
    /// the landing was undone, the story's commits are under `salvage_ref`.
    Reverted,
    /// Nothing to land: the iteration did not pass its story (its work is under `salvage_ref`
    /// when it left any).
    NotLanded,
    /// The story passed, but its landing was refused: the main checkout holds a change of the
    /// user's where the landing would write. Nothing moved; the story's work is under
    /// `salvage_ref` (outcome `landing_refused`).
    Refused,
    /// `--resolve-conflicts`: an agent resolved an earlier landing's conflict (`resolves`) and
    /// ralph accepted the result (no marker left, modify/delete conflicts named, no other file
    /// changed, the story's check passed): a merge of the tip and the story's work landed.
    Resolution,
}

fn is_sandbox_off(mode: &super::kinds::SandboxMode) -> bool {
    !mode.is_on()
}

/// A user's hint carried by an iteration (the ledger's `hints` field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HintRecord {
    /// Its number in `.ralph/hints/` (as `ralph hint --list` shows it).
    pub id: u32,
    /// The text, as the user gave it.
    pub text: String,
    /// The story it was meant for; `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub story: Option<String>,
}

/// How a `--push` after an iteration went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PushStatus {
    /// The remote has the branch, ralph's refs and the renewed lease.
    Pushed,
    /// The remote could not be reached (retried with backoff); the work is local only and the
    /// next push sends it.
    Unreachable,
    /// The remote refused the branch: someone else moved it. The run stops.
    Rejected,
    /// The remote refused the lease renewal: another worker holds the lease now. The run stops.
    LeaseLost,
}

/// What `--push` did after one iteration (the ledger's `push` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PushRecord {
    /// The remote's name, e.g. `origin`.
    pub remote: String,
    /// The run branch.
    pub branch: String,
    /// How it went.
    pub status: PushStatus,
    /// The commit pushed (or that was to be pushed), full sha.
    #[serde(default)]
    pub head: Option<String>,
    /// Push attempts made (1 when the first one settled it).
    pub attempts: u32,
    /// Wall time of all attempts and the backoff between them, in seconds.
    pub duration_s: f64,
    /// git's last error, credentials removed; `None` when it was pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PushRecord {
    /// One sentence on a push that did not land (what happened, what follows, git's last error
    /// line in parentheses), or `None` when it was pushed.
    pub fn problem(&self) -> Option<String> {
        let what = match self.status {
            PushStatus::Pushed => return None,
            PushStatus::Unreachable => format!(
                "could not push {} to {} ({} attempts); the work is committed here and the next push sends it",
                self.branch, self.remote, self.attempts
            ),
            PushStatus::Rejected => format!(
                "{} refused {}: someone else moved the branch, so the run stops",
                self.remote, self.branch
            ),
            PushStatus::LeaseLost => format!(
                "{} refused the lease renewal for {}: another worker holds it now, so the run stops",
                self.remote, self.branch
            ),
        };
        let error = self
            .error
            .as_deref()
            .and_then(|e| e.lines().rev().find(|l| !l.trim().is_empty()))
            .map(|l| format!(" (git: {})", l.trim()))
            .unwrap_or_default();
        Some(format!("{what}{error}"))
    }
}

/// The shutdown of an iteration ended by a signal (the ledger's `shutdown` field). Times are
/// seconds from the signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ShutdownRecord {
    /// The first signal, e.g. `SIGTERM`.
    pub signal: String,
    /// `--shutdown-timeout`, in seconds.
    pub timeout_s: f64,
    /// From the signal to the agent's process group being gone.
    pub agent_stopped_s: f64,
    /// From the signal to this record being written: the agent stopped, the checkpoint
    /// committed and, with `--push`, pushed. The lease release follows (the run's
    /// `run_finished` has the whole shutdown).
    pub recorded_s: f64,
}

/// A history rewrite by the agent (the ledger's `history_rewrite` field): HEAD no longer
/// contained the iteration's start when the agent finished (`git reset --hard HEAD~1`, a
/// rebase, an amended commit), which would have taken ralph's earlier checkpoints and progress
/// entries off the branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryRewrite {
    /// The iteration's start (full sha), also kept under `refs/ralph/<run>/<n>/start`.
    pub start: String,
    /// HEAD as the agent left it (full sha).
    pub agent_head: String,
    /// The full name of the reference that keeps the agent's rewritten history reachable, e.g.
    /// `refs/ralph/<run>/<n>/rewritten`; `null` when ralph did not restore (then the agent's
    /// HEAD is still on the branch).
    #[serde(default)]
    pub kept_at: Option<String>,
    /// Whether ralph put the branch back: it contains `start` again, with the agent's changes
    /// re-applied on top and committed by the checkpoint.
    pub restored: bool,
    /// Files the agent's changes and ralph's history both changed where the merge could not
    /// join them: they hold the agent's version (notes files keep both sides' lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    /// Why ralph did not restore, when it did not (HEAD on another branch, a git error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HistoryRewrite {
    /// How [`HistoryRewrite::error`] starts when the agent deleted ralph's references and
    /// pruned the commits they kept, the iteration's start among them.
    pub const PRUNED: &'static str = "the agent deleted ralph's references and pruned the commits";

    /// Whether the agent pruned the iteration's start away (nothing of it is kept anywhere).
    pub fn pruned(&self) -> bool {
        self.error
            .as_deref()
            .is_some_and(|e| e.starts_with(Self::PRUNED))
    }

    /// One sentence on what happened and what ralph did, naming the references in full.
    pub fn sentence(&self, start_ref: &str) -> String {
        let start = self.start.get(..12).unwrap_or(&self.start);
        let agent = self.agent_head.get(..12).unwrap_or(&self.agent_head);
        match (&self.kept_at, self.restored) {
            (Some(kept), true) => {
                let conflicts = if self.conflicts.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (where both changed {}, the agent's version was kept)",
                        self.conflicts.join(", ")
                    )
                };
                format!(
                    "the agent rewrote history (HEAD {agent} no longer contained the iteration's start {start}); ralph put its checkpoints back: the branch contains {start} again with the agent's changes re-applied on top{conflicts}, and the agent's rewritten history is kept at {kept}"
                )
            }
            _ if self.pruned() => format!(
                "history was destroyed: HEAD {agent} no longer contains the iteration's start {start}, which ralph could not put back: {}",
                self.error.as_deref().unwrap_or("")
            ),
            _ => format!(
                "history was rewritten: HEAD {agent} no longer contains the iteration's start {start} (kept at {start_ref}); ralph did not put it back: {}",
                self.error.as_deref().unwrap_or("unknown reason")
            ),
        }
    }
}

/// Acceptance criteria an agent rewrote (the ledger's `criteria_proposals` field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CriteriaProposal {
    /// The story whose criteria the agent rewrote.
    pub story_id: String,
    /// The criteria prd.json had (and has again: ralph put them back).
    pub original: Vec<String>,
    /// The agent's text, as it left prd.json (empty when it removed them all, or left
    /// something that is not a list of strings).
    pub proposed: Vec<String>,
}

/// The mark on the first record of a ledger started anew over history kept in git.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Rebuilt {
    /// Where the earlier history is: `git` (the `Ralph-*` commit trailers).
    pub from: String,
    /// How many iterations git had recorded.
    pub iterations: u32,
    /// The highest iteration number among them.
    pub last_iteration: u32,
}

/// Which sweep found a process the iteration left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StrayFound {
    /// Right after the agent exited: the agent started it and left it running.
    AfterAgent,
    /// When the next `ralph run` recovered the iteration a killed ralph left in flight.
    AtRestart,
    /// Right after a verify command ended (in the verify gate, or a check a restart ran on the
    /// work an interrupted iteration left): the check started it and left it running.
    AfterVerify,
}

/// A process carrying the iteration's tag (`RALPH_AGENT_TAG`) that ralph killed with SIGKILL
/// because the iteration had left it running (the ledger's `strays` field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StrayProcess {
    /// Its process id when it was killed.
    pub pid: u32,
    /// Its command line (`/proc/<pid>/cmdline`, arguments joined by spaces, secrets redacted,
    /// at most 300 characters); empty when it could not be read.
    pub command: String,
    /// Which sweep found it.
    pub found: StrayFound,
}

/// One verify command run after an iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VerifyRecord {
    /// The story it checked.
    pub story_id: String,
    /// The shell command (run with `bash -c` in the repository).
    pub command: String,
    /// Whether it exited 0.
    pub passed: bool,
    /// How it ended when it failed: `exited with code 1`, `timed out after 10m`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The last lines of its combined stdout and stderr when it failed (at most
    /// [`VerifyRecord::TAIL_LINES`] lines and [`VerifyRecord::TAIL_BYTES`] bytes, ANSI stripped,
    /// values of secret-looking environment variables replaced by `<redacted>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_tail: String,
    /// A stop (Ctrl-C, SIGTERM) cut the check short or came before it ran: it said nothing
    /// about the story (`passed` is false, and `result` says which), so it is not a failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl VerifyRecord {
    /// Lines of a failed command's output kept.
    pub const TAIL_LINES: usize = 30;
    /// Bytes of a failed command's output kept (the end is kept).
    pub const TAIL_BYTES: usize = 4096;
}

impl LedgerRecord {
    /// A record with the identifying fields set and every other field unknown (`None`, empty,
    /// `false`, zero duration): the start of every record ralph writes or rebuilds.
    pub fn new(
        run_id: &str,
        iteration: u32,
        story_id: &str,
        outcome: Outcome,
        started_at: DateTime<Utc>,
    ) -> LedgerRecord {
        LedgerRecord {
            run_id: run_id.to_owned(),
            iteration,
            story_id: story_id.to_owned(),
            story_title: String::new(),
            backend: String::new(),
            agent: None,
            model: None,
            agent_version: None,
            started_at,
            ended_at: started_at,
            duration_s: 0.0,
            outcome,
            exit_code: None,
            signal: None,
            tokens_in: None,
            tokens_out: None,
            cache_read_tokens: None,
            cache_creation_tokens: None,
            cost_usd: None,
            cost_source: None,
            head_before: None,
            head_after: None,
            commits: Vec::new(),
            checkpoint_commit: None,
            files_changed: Vec::new(),
            promise_seen: false,
            passes_flipped: Vec::new(),
            passes_reverted: Vec::new(),
            session_id: None,
            transcript: None,
            verify: Vec::new(),
            findings: Vec::new(),
            lost_commits: Vec::new(),
            history_rewrite: None,
            passes_refused: Vec::new(),
            criteria_proposals: Vec::new(),
            feature: None,
            unblocked: Vec::new(),
            message: None,
            push: None,
            shutdown: None,
            rebuilt: None,
            from_git: false,
            strays: Vec::new(),
            checked_at_restart: false,
            sandbox: super::kinds::SandboxMode::Off,
            refused_hosts: Vec::new(),
            hints: Vec::new(),
            worker: None,
            worktree: None,
            landing: None,
        }
    }

    /// All input tokens (uncached, cache reads and writes), `None` when none was reported.
    pub fn input_tokens(&self) -> Option<u64> {
        let parts = [
            self.tokens_in,
            self.cache_read_tokens,
            self.cache_creation_tokens,
        ];
        parts
            .iter()
            .any(Option::is_some)
            .then(|| parts.iter().flatten().sum())
    }

    /// The message without the findings appended to it (they have a field of their own): why
    /// the outcome, in a sentence; `None` when that is all the message said.
    pub fn primary_message(&self) -> Option<&str> {
        let message = self.message.as_deref()?;
        if self.findings.is_empty() {
            return Some(message);
        }
        let findings = self.findings.join("; ");
        let primary = message
            .strip_suffix(findings.as_str())
            .unwrap_or(message)
            .trim_end_matches("; ");
        (!primary.is_empty()).then_some(primary)
    }

    /// The verify runs of this iteration that failed (not those a stop interrupted).
    pub fn verify_failures(&self) -> impl Iterator<Item = &VerifyRecord> {
        self.verify.iter().filter(|v| !v.passed && !v.interrupted)
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn the_message_line_leaves_findings_to_their_warnings() {
        let mut r = LedgerRecord::new("r", 1, "US-001", Outcome::StoryPassed, Utc::now());
        r.findings = vec!["US-002 edited (title)".into(), "HEAD moved".into()];
        r.message = Some("US-002 edited (title); HEAD moved".into());
        assert_eq!(r.primary_message(), None);
        r.message = Some("verify failed; US-002 edited (title); HEAD moved".into());
        assert_eq!(r.primary_message(), Some("verify failed"));
        r.findings.clear();
        assert_eq!(r.primary_message(), r.message.as_deref());
    }
}
