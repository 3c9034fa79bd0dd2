//! `.ralph/state.json`: what a restarted `ralph run` needs to carry on where the last one stopped.
//!
//! It holds the run id, the iteration counter (which keeps counting across runs), per-story
//! attempt counts, blocked stories, the last outcome, the iteration in flight (so that a run
//! killed with SIGKILL can be recognised and its changes checkpointed) and `resume_at` for a
//! usage-limit wait. Writes are atomic: a temporary file in the same directory is written,
//! fsynced and renamed over the old one, then the directory is fsynced, so a crash leaves either
//! the old or the new state, never a mix. If the file is lost or deleted, ralph rebuilds the
//! counter from the `Ralph-*` trailers in git history ([`crate::git::Repo::trailer_history`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::protocol::time::rfc3339;
use crate::protocol::{LedgerRecord, StopReason, StrayProcess};

/// File name of the state inside the `.ralph` directory.
pub const STATE_FILE: &str = "state.json";

/// The state format this ralph writes and the newest it reads.
pub const STATE_VERSION: u32 = 1;

/// The persisted run state. Unknown fields in the file are ignored; missing ones take their
/// defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Id of the latest run.
    #[serde(default)]
    pub run_id: Option<String>,
    /// Number of the last iteration started; numbering continues across runs (0: none yet).
    #[serde(default)]
    pub iteration: u32,
    /// Attempts per story id of the current feature (see [`crate::protocol::Outcome::is_attempt`]).
    #[serde(default)]
    pub attempts: BTreeMap<String, u32>,
    /// Story ids that hit the attempt limit and are skipped.
    #[serde(default)]
    pub blocked: Vec<String>,
    /// Wire name of the last iteration's outcome (e.g. `story_passed`).
    #[serde(default)]
    pub last_outcome: Option<String>,
    /// The iteration running right now; still set after a crash, which is how a restart knows
    /// that an iteration was cut short.
    #[serde(default)]
    pub in_flight: Option<InFlight>,
    /// `--parallel`: the iterations running right now in worker worktrees, one per busy worker
    /// (a serial run uses `in_flight`); still set after a crash, so a restart recovers each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flights: Vec<InFlight>,
    /// When a usage limit resets (RFC 3339 UTC); a restarted run waits until then. With
    /// fallback agents: the earliest reset when every agent is limited (`None` while one is
    /// free).
    #[serde(default, with = "rfc3339::option")]
    pub resume_at: Option<DateTime<Utc>>,
    /// When the run, waiting after a transient agent failure (`transient_backoff`), tries the
    /// story again (RFC 3339 UTC); set only during that wait, so that `ralph watch` can count
    /// down to it. Absent otherwise.
    #[serde(
        default,
        with = "rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_at: Option<DateTime<Utc>>,
    /// When the usage-limit wait the run is in now ends (RFC 3339 UTC): the reset plus
    /// `usage_limit_margin`, the time the run's terminal counts down to. Set only during that
    /// wait, so that `ralph watch` counts down to the same moment (`resume_at` is the reset
    /// itself, without the margin). Absent otherwise.
    #[serde(
        default,
        with = "rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub wait_until: Option<DateTime<Utc>>,
    /// When each agent's usage limit resets, by agent (profile) name (RFC 3339 UTC); an agent
    /// leaves the map when an iteration on it ends without a limit. Absent in a state.json
    /// written before per-agent resets (its `resume_at` is then the primary agent's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agent_resets: BTreeMap<String, DateTime<Utc>>,
    /// Which agent each usage-limit reset belongs to, by agent (profile) name: its identity as
    /// configured when it met the limit (backend, command, program and model; see
    /// `AgentSetup::identity`). A reset holds an agent of that name only while it is configured
    /// the same. Absent in a state.json written before it: the reset then holds by name alone.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agent_identities: BTreeMap<String, String>,
    /// prd.json's `branchName` that `attempts` and `blocked` belong to (`""`: a prd.json without
    /// one; absent: a state written before features were recorded).
    #[serde(default)]
    pub feature: Option<String>,
    /// Why the latest run ended (`None` while it runs, or before any run ended).
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// Stories `--unblock` freed that no checkpoint has recorded yet: the next iteration's
    /// record and commit carry them (`Ralph-Unblocked`), then this is emptied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unblocked: Vec<String>,
    /// The latest run's budgets, for readers such as `ralph watch` (absent: written by a ralph
    /// before they were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
}

/// A run's budgets as it started ([`State::limits`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLimits {
    /// `--max-iter`.
    pub max_iter: u32,
    /// `--max-cost` in USD, when set.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// `--max-duration` in seconds, when set.
    #[serde(default)]
    pub max_duration_s: Option<u64>,
    /// When the run started (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    pub started_at: DateTime<Utc>,
}

impl Default for State {
    fn default() -> Self {
        State {
            version: STATE_VERSION,
            run_id: None,
            iteration: 0,
            attempts: BTreeMap::new(),
            blocked: Vec::new(),
            last_outcome: None,
            in_flight: None,
            flights: Vec::new(),
            resume_at: None,
            retry_at: None,
            wait_until: None,
            agent_resets: BTreeMap::new(),
            agent_identities: BTreeMap::new(),
            feature: None,
            stop_reason: None,
            unblocked: Vec::new(),
            limits: None,
        }
    }
}

/// The iteration that was running when the state was last written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// Run id of that iteration.
    pub run_id: String,
    /// Its iteration number.
    pub iteration: u32,
    /// The story it worked on.
    pub story_id: String,
    /// Pid of the agent process, which is also its process group id (the agent leads its own
    /// group), so a restart can make sure no leftover of it survives.
    pub pid: u32,
    /// When the agent was started (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    pub started_at: DateTime<Utc>,
    /// Full sha of HEAD before the agent ran (`None` on an unborn branch).
    #[serde(default)]
    pub start_sha: Option<String>,
    /// The processes this iteration left running that ralph already killed (after the agent,
    /// after a verify command, at a restart), saved as soon as they are killed so that the
    /// record a restart writes for a killed ralph still lists them ([`State::note_strays`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strays: Vec<StrayProcess>,
    /// `--parallel`: the worker slot (1-based) and the worktree (absolute path) the iteration
    /// runs in; absent in a serial run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<WorkerTree>,
    /// The agent's (profile) name the iteration runs on, when the run has fallback agents
    /// (`[[agents]]`, `--fallback-agent`), so that a restart books a crashed iteration on the
    /// agent it ran on; absent in a run with one agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// Where a `--parallel` iteration runs (see [`InFlight::worktree`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerTree {
    /// The worker slot, 1-based.
    pub worker: u32,
    /// The worktree's root, absolute.
    pub root: PathBuf,
    /// The run branch's tip the worktree started from (full sha).
    pub base: String,
    /// When the worker got to the agent (after `worktree_copy` and `worktree_setup`): a
    /// restart keeps the ignored files written after it as the agent's, not those the setup
    /// wrote. Absent until then (and in state.json files of older ralphs).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rfc3339::option"
    )]
    pub agent_started_at: Option<DateTime<Utc>>,
    /// Why the run ended with this iteration finished but not landed (the checkout was switched
    /// to another branch: nothing could land): a restart records that, not a killed ralph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlanded: Option<String>,
}

/// Errors loading or saving the state. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A filesystem operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What ralph was doing, e.g. `read`.
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid state JSON.
    #[error("{} is corrupt: {source}\nhint: delete it; ralph rebuilds the iteration count from the Ralph-* trailers in git history", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a newer ralph.
    #[error("{} has format version {found}, but this ralph understands up to {STATE_VERSION}\nhint: upgrade ralph, or delete the file to rebuild it from git history", path.display())]
    NewerVersion {
        /// The state file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The state could not be serialized (not expected: every field is plain data).
    #[error("cannot serialize the state: {0}")]
    Serialize(#[source] serde_json::Error),
}

impl State {
    /// The state a lost `.ralph/state.json` would have held, rebuilt from recorded iterations
    /// (`records`, oldest first, e.g. [`crate::history::History`] read from git trailers): the
    /// last iteration number, the latest run id, the last outcome, and the attempts per story
    /// (counted from its last `--unblock`, a record's `unblocked`) of the feature `feature` (prd.json's `branchName`; records of another feature do not
    /// count, records without one do). Blocked stories, the in-flight iteration and a pending
    /// usage-limit reset are not in git; the caller decides blocking again from the attempts.
    pub fn rebuild(records: &[LedgerRecord], feature: Option<&str>) -> State {
        let mut state = State {
            run_id: records.last().map(|r| r.run_id.clone()),
            iteration: records.iter().map(|r| r.iteration).max().unwrap_or(0),
            last_outcome: records.last().map(|r| r.outcome.as_str().to_owned()),
            feature: Some(feature.unwrap_or_default().to_owned()),
            ..State::default()
        };
        for r in records {
            // A record without a feature comes from an older ralph (or a prd.json without
            // branchName): it counts.
            let same_feature = match &r.feature {
                Some(a) => Some(a.as_str()) == feature,
                None => true,
            };
            // `--unblock` before this iteration: the story's earlier attempts no longer count.
            if same_feature {
                for id in &r.unblocked {
                    state.attempts.remove(id);
                }
            }
            if same_feature && r.outcome.is_attempt() {
                *state.attempts.entry(r.story_id.clone()).or_insert(0) += 1;
            }
        }
        state
    }

    /// Starts the attempts and blocks afresh when prd.json's `branchName` is not the feature
    /// they were earned in (a new feature reuses story ids). Returns the old feature when it
    /// cleared anything.
    ///
    /// `feature` is prd.json's `branchName`; a prd.json without one is the feature `""`. A state
    /// written before features were recorded (`feature` absent) keeps its attempts once.
    pub fn enter_feature(&mut self, feature: Option<&str>) -> Option<String> {
        let new = feature.unwrap_or_default();
        let changed = self.feature.as_deref().is_some_and(|old| old != new);
        let old = self.feature.replace(new.to_owned());
        if changed && (!self.attempts.is_empty() || !self.blocked.is_empty()) {
            self.attempts.clear();
            self.blocked.clear();
            self.unblocked.clear();
            return old.map(|o| {
                if o.is_empty() {
                    "a prd.json without branchName".to_owned()
                } else {
                    o
                }
            });
        }
        None
    }

    /// Blocks every open story of `prd` whose attempts reached `max_attempts` and is not
    /// blocked yet (a lost state.json, a fresh clone: the attempts rebuilt from history decide
    /// again). `ralph run` and `ralph status` both apply it, so they agree on the next story.
    /// Returns the stories it blocked.
    pub fn block_spent(&mut self, prd: &crate::prd::model::Prd, max_attempts: u32) -> Vec<String> {
        let mut newly = Vec::new();
        for s in &prd.user_stories {
            let tried = self.attempts.get(&s.id).copied().unwrap_or(0);
            if !s.passes && tried >= max_attempts && !self.blocked.contains(&s.id) {
                self.blocked.push(s.id.clone());
                newly.push(s.id.clone());
            }
        }
        newly
    }

    /// Adds `strays` (just killed) to the in-flight iteration and saves the state at once, so
    /// that a ralph killed before the iteration's record is written loses none of them (the
    /// restart's record includes them). Nothing is written when `strays` is empty or no
    /// iteration is in flight.
    ///
    /// # Errors
    /// See [`State::save`].
    pub fn note_strays(
        &mut self,
        ralph_dir: &Path,
        strays: &[StrayProcess],
    ) -> Result<(), StateError> {
        let Some(flight) = self.in_flight.as_mut().filter(|_| !strays.is_empty()) else {
            return Ok(());
        };
        flight.strays.extend_from_slice(strays);
        self.save(ralph_dir)
    }

    /// Path of the state file inside `ralph_dir` (normally `<repo>/.ralph`).
    pub fn path(ralph_dir: &Path) -> PathBuf {
        ralph_dir.join(STATE_FILE)
    }

    /// Loads `<ralph_dir>/state.json`; `Ok(None)` when it does not exist, or when it is empty or
    /// all NUL bytes: what a power loss can leave of a file written without fsync (see
    /// [`State::save`]); the caller rebuilds it from the ledger and git as for a missing file.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] (with the fix: delete it), [`StateError::NewerVersion`],
    /// [`StateError::Io`].
    pub fn load(ralph_dir: &Path) -> Result<Option<State>, StateError> {
        let path = State::path(ralph_dir);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Io {
                    action: "read",
                    path,
                    source,
                })
            }
        };
        if bytes.iter().all(|b| *b == 0) {
            tracing::warn!(path = %path.display(), "state.json is empty (a power loss?): rebuilding it");
            return Ok(None);
        }
        let state: State = match serde_json::from_slice(&bytes) {
            Ok(state) => state,
            Err(source) => return Err(StateError::Corrupt { path, source }),
        };
        if state.version > STATE_VERSION {
            return Err(StateError::NewerVersion {
                path,
                found: state.version,
            });
        }
        Ok(Some(state))
    }

    /// Writes the state to `<ralph_dir>/state.json` atomically (temporary file in the same
    /// directory, rename), creating `ralph_dir` when missing. Not fsynced, on purpose: it is
    /// saved several times per iteration and everything in it can be rebuilt from the ledger
    /// (fsynced, the iteration's commit point) and git; a SIGKILLed ralph leaves the old or the
    /// new file, and a power loss at worst an old or empty one (see `docs/durability.md`).
    ///
    /// # Errors
    /// [`StateError::Io`] naming the file or directory; [`StateError::Serialize`].
    pub fn save(&self, ralph_dir: &Path) -> Result<(), StateError> {
        let path = State::path(ralph_dir);
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io {
                action,
                path,
                source,
            }
        };
        fs::create_dir_all(ralph_dir).map_err(io("create", ralph_dir))?;
        let json = serde_json::to_string_pretty(self).map_err(StateError::Serialize)?;
        // The stop reason quotes agents' messages: no secret in it (crate::redact).
        let mut json = crate::redact::redact_env(&json).into_bytes();
        json.push(b'\n');

        crate::fsutil::write_volatile(&path, &json).map_err(|source| StateError::Io {
            action: "replace",
            path: path.clone(),
            source,
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_loads_as_none_and_fields_default() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(State::load(dir.path()).unwrap(), None);
        fs::write(
            dir.path().join(STATE_FILE),
            r#"{"version":1,"iteration":4,"from_the_future":true}"#,
        )
        .unwrap();
        let state = State::load(dir.path()).unwrap().unwrap();
        assert_eq!(state.iteration, 4);
        assert!(state.attempts.is_empty());
        assert_eq!(state.resume_at, None);
    }

    #[test]
    fn newer_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), r#"{"version":99}"#).unwrap();
        let err = State::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("format version 99"), "{err}");
    }
}
