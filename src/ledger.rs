//! The ledger: `.ralph/ledger.jsonl`, one JSON record per iteration, every run, append-only.
//!
//! It is ralph's audit trail (design.md, "Files and formats"): what ran, for how long, what it
//! cost, what it changed, and how it ended ([`Outcome`], a closed set). Each record is written
//! with a single `write` followed by `fsync`, so a crash can at worst leave a torn *last* line;
//! [`read_all`] skips such a line and reports it, while a broken line elsewhere is an error.
//! The next [`append`] (or an explicit [`repair`]) cuts a torn fragment off first, so it can
//! never end up in the middle; its bytes are kept next to the ledger in
//! `ledger.torn-<UTC timestamp>` so that nothing ralph wrote is silently thrown away.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How an iteration ended. Every ledger record has exactly one; on the wire it is the snake_case
/// name (`story_passed`, `usage_limit`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The picked story went from `passes: false` to `true` and prd.json is valid.
    StoryPassed,
    /// The agent committed or changed files, but the story does not pass yet.
    Progress,
    /// The agent exited normally without changing anything.
    NoProgress,
    /// The agent printed the completion promise while stories were still open.
    PrematureClaim,
    /// The agent failed (non-zero exit or an error result) for a reason not classified below.
    AgentError,
    /// The iteration hit its wall-clock limit and was killed.
    Timeout,
    /// The agent produced no output for the idle limit and was killed.
    Stalled,
    /// A subscription or API usage limit; the run waits for the reset (`resume_at`).
    UsageLimit,
    /// Overload, 5xx or network trouble; retried with backoff.
    Transient,
    /// Bad or expired credentials; the run stops.
    AuthError,
    /// A deterministic setup problem (bad flag, nested session, root without sandbox); the run
    /// stops.
    ConfigError,
    /// The agent left prd.json unparsable or invalid; ralph restored the snapshot.
    PrdCorrupted,
    /// The user's verify command failed after the agent finished.
    VerifyFailed,
    /// Stopped by Ctrl-C, SIGTERM or SIGHUP (or found in flight after a crash).
    Interrupted,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 14] = [
        Outcome::StoryPassed,
        Outcome::Progress,
        Outcome::NoProgress,
        Outcome::PrematureClaim,
        Outcome::AgentError,
        Outcome::Timeout,
        Outcome::Stalled,
        Outcome::UsageLimit,
        Outcome::Transient,
        Outcome::AuthError,
        Outcome::ConfigError,
        Outcome::PrdCorrupted,
        Outcome::VerifyFailed,
        Outcome::Interrupted,
    ];

    /// The snake_case wire name, e.g. `"story_passed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::StoryPassed => "story_passed",
            Outcome::Progress => "progress",
            Outcome::NoProgress => "no_progress",
            Outcome::PrematureClaim => "premature_claim",
            Outcome::AgentError => "agent_error",
            Outcome::Timeout => "timeout",
            Outcome::Stalled => "stalled",
            Outcome::UsageLimit => "usage_limit",
            Outcome::Transient => "transient",
            Outcome::AuthError => "auth_error",
            Outcome::ConfigError => "config_error",
            Outcome::PrdCorrupted => "prd_corrupted",
            Outcome::VerifyFailed => "verify_failed",
            Outcome::Interrupted => "interrupted",
        }
    }

    /// Whether this iteration uses up one of the run's `--max-iter` budget. Usage limits and
    /// transient errors do not (design.md): the agent never got to work, and ralph retries.
    /// Everything else does, including `interrupted` (a crashed iteration 3 resumes at 4).
    pub fn counts_as_iteration(self) -> bool {
        !matches!(self, Outcome::UsageLimit | Outcome::Transient)
    }

    /// Whether this is a failed attempt at the story: it counts toward the per-story attempt
    /// limit (after which the story is blocked) and the consecutive-failure limit. False for
    /// `story_passed` and `progress` (work moved forward), for `usage_limit` and `transient`
    /// (outside the agent's control, retried) and for `interrupted` (the user's decision).
    pub fn is_failure(self) -> bool {
        !matches!(
            self,
            Outcome::StoryPassed
                | Outcome::Progress
                | Outcome::UsageLimit
                | Outcome::Transient
                | Outcome::Interrupted
        )
    }

    /// Whether the run must stop at once: auth and config errors need a human (design.md).
    pub fn stops_run(self) -> bool {
        matches!(self, Outcome::AuthError | Outcome::ConfigError)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the [`Outcome`] wire names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown outcome `{0}` (expected one of: story_passed, progress, no_progress, premature_claim, agent_error, timeout, stalled, usage_limit, transient, auth_error, config_error, prd_corrupted, verify_failed, interrupted)")]
pub struct UnknownOutcome(pub String);

impl FromStr for Outcome {
    type Err = UnknownOutcome;

    /// Parses a snake_case wire name (exact match).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Outcome::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == s)
            .ok_or_else(|| UnknownOutcome(s.to_owned()))
    }
}

/// RFC 3339 UTC timestamps with millisecond precision (`2025-01-31T14:05:09.123Z`), used by the
/// ledger, state and lock files. Reading accepts any RFC 3339 timestamp.
pub(crate) mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|at| at.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }

    /// The same for `Option<DateTime<Utc>>` (`null` when absent).
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(
            at: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match at {
                Some(at) => super::serialize(at, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    DateTime::parse_from_rfc3339(&text)
                        .map(|at| at.with_timezone(&Utc))
                        .map_err(serde::de::Error::custom)
                })
                .transpose()
        }
    }
}

/// Where an iteration's cost came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostSource {
    /// The agent reported it (claude's `total_cost_usd`, opencode's step costs).
    Agent,
    /// ralph computed it from the tokens and `[prices."<model>"]` in ralph.toml (USD per million
    /// tokens).
    PriceTable,
}

/// One iteration, as recorded in `.ralph/ledger.jsonl`. Field names are the wire names. Optional
/// fields are `null` when unknown (e.g. tokens for a backend that reports none); lists are `[]`.
/// Reading tolerates unknown fields and missing optional ones, so older and newer ralphs can
/// share a ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Model name, when known.
    #[serde(default)]
    pub model: Option<String>,
    /// Agent CLI version, when it reported one.
    #[serde(default)]
    pub agent_version: Option<String>,
    /// When the agent was started (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    pub started_at: DateTime<Utc>,
    /// When the iteration ended (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
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
    /// A human note, e.g. the error message or why the outcome was chosen.
    #[serde(default)]
    pub message: Option<String>,
}

/// Errors reading or writing the ledger. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A filesystem operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What ralph was doing, e.g. `append to`.
        action: &'static str,
        /// The ledger (or its directory).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line other than the last one is not a valid record.
    #[error("{}:{line}: not a valid ledger record: {source}\nhint: fix or delete that line; the ledger is append-only JSONL, one record per line", path.display())]
    BadLine {
        /// The ledger.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be serialized (not expected: every field is plain data).
    #[error("cannot serialize a ledger record: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// What [`read_all`] found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LedgerContents {
    /// Every valid record, in file order (oldest first).
    pub records: Vec<LedgerRecord>,
    /// The 1-based number of an unparsable last line that was skipped (a write torn by a crash),
    /// if there was one.
    pub torn_last_line: Option<usize>,
}

/// What [`repair`] found at the end of the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// The file is missing, empty or ends with a newline: nothing to do.
    Clean,
    /// The last line was a complete record missing its newline; the newline was added.
    Terminated,
    /// The last line was a torn fragment (not a valid record); it was cut off the ledger.
    Dropped {
        /// Length of the fragment, in bytes.
        bytes: usize,
        /// Where its bytes were kept: `<ledger dir>/<ledger stem>.torn-<UTC timestamp>`
        /// (e.g. `.ralph/ledger.torn-20250131T140509.123Z`).
        kept_in: PathBuf,
    },
}

/// Makes the ledger end on a complete line, after a crash (power loss, full disk) tore the last
/// write: a last line without its newline is terminated when it is a valid record, and otherwise
/// cut off, its bytes first saved (and fsynced) in a `.torn-<timestamp>` file beside the ledger.
/// [`append`] does this before every write; calling it at the start of a run also repairs a
/// ledger that no later iteration appends to. A missing file is [`Repair::Clean`].
///
/// # Errors
/// [`LedgerError::Io`] naming the ledger (or the file the fragment was to be kept in).
pub fn repair(path: &Path) -> Result<Repair, LedgerError> {
    let mut file = match OpenOptions::new().read(true).append(true).open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Repair::Clean),
        Err(source) => {
            return Err(LedgerError::Io {
                action: "open",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    repair_torn_tail(&mut file, path)
}

/// Appends `record` as one JSON line and fsyncs, creating the file and its parent directory
/// when missing. If the file ends in an unterminated fragment (a torn write), it is repaired
/// first as [`repair`] describes.
///
/// # Errors
/// [`LedgerError::Io`] naming the file; [`LedgerError::Serialize`].
pub fn append(path: &Path, record: &LedgerRecord) -> Result<(), LedgerError> {
    let io = |action: &'static str| {
        move |source| LedgerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io("create the directory of"))?;
    }
    let mut line = serde_json::to_string(record).map_err(LedgerError::Serialize)?;
    line.push('\n');

    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(io("open"))?;
    repair_torn_tail(&mut file, path)?;
    // One write call per record: a crash tears at most this line.
    file.write_all(line.as_bytes()).map_err(io("append to"))?;
    file.sync_data().map_err(io("sync"))?;
    Ok(())
}

/// [`repair`] on an open ledger (opened for reading and appending).
fn repair_torn_tail(file: &mut File, path: &Path) -> Result<Repair, LedgerError> {
    let io = |action: &'static str| {
        move |source| LedgerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let Some((start, fragment)) = torn_fragment(file).map_err(io("read the last line of"))? else {
        return Ok(Repair::Clean);
    };
    if serde_json::from_slice::<LedgerRecord>(&fragment).is_ok() {
        file.write_all(b"\n")
            .map_err(io("terminate the last line of"))?;
        file.sync_data().map_err(io("sync"))?;
        return Ok(Repair::Terminated);
    }
    // Keep the bytes before cutting them off: a crash in between loses nothing.
    let kept_in = keep_torn_bytes(path, &fragment)?;
    tracing::warn!(
        path = %path.display(),
        bytes = fragment.len(),
        kept_in = %kept_in.display(),
        "cut a torn last line off the ledger (left by a crash)"
    );
    file.set_len(start)
        .map_err(io("truncate the torn last line of"))?;
    file.sync_data().map_err(io("sync"))?;
    Ok(Repair::Dropped {
        bytes: fragment.len(),
        kept_in,
    })
}

/// Writes `fragment` to a new `<stem>.torn-<UTC timestamp>` file beside the ledger and fsyncs
/// it; returns its path. A name already taken gets a `-2`, `-3`, ... suffix.
fn keep_torn_bytes(ledger: &Path, fragment: &[u8]) -> Result<PathBuf, LedgerError> {
    let dir = ledger.parent().unwrap_or(Path::new(""));
    let stem = ledger
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ledger".to_owned());
    let base = format!("{stem}.torn-{}", Utc::now().format("%Y%m%dT%H%M%S%.3fZ"));
    let mut n = 1u32;
    loop {
        let name = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let candidate = dir.join(name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(mut kept) => {
                let io = |action: &'static str| {
                    let candidate = candidate.clone();
                    move |source| LedgerError::Io {
                        action,
                        path: candidate,
                        source,
                    }
                };
                kept.write_all(fragment).map_err(io("write"))?;
                kept.sync_all().map_err(io("sync"))?;
                return Ok(candidate);
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(source) => {
                return Err(LedgerError::Io {
                    action: "create",
                    path: candidate,
                    source,
                })
            }
        }
    }
}

/// The unterminated last line of `file`: its start offset and bytes, or `None` when the file is
/// empty or ends with a newline.
fn torn_fragment(file: &mut File) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(None);
    }
    // Find where the unterminated fragment starts, reading backwards in blocks.
    let mut start = 0u64;
    let mut end = len;
    let mut block = vec![0u8; 64 * 1024];
    while end > 0 {
        let from = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(chunk)?;
        if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
            start = from + pos as u64 + 1;
            break;
        }
        end = from;
    }
    let mut fragment = Vec::with_capacity((len - start) as usize);
    file.seek(SeekFrom::Start(start))?;
    file.read_to_end(&mut fragment)?;
    Ok(Some((start, fragment)))
}

/// Reads every record, oldest first. A missing file reads as empty. Blank lines are skipped.
/// An unparsable *last* line is skipped, logged as a warning and reported in
/// [`LedgerContents::torn_last_line`]; an unparsable line anywhere else is an error.
///
/// # Errors
/// [`LedgerError::Io`] naming the file; [`LedgerError::BadLine`] with the file and line number.
pub fn read_all(path: &Path) -> Result<LedgerContents, LedgerError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LedgerContents::default())
        }
        Err(source) => {
            return Err(LedgerError::Io {
                action: "read",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let lines: Vec<(usize, &[u8])> = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(index, line)| (index + 1, line))
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    let mut contents = LedgerContents::default();
    for (position, (number, line)) in lines.iter().enumerate() {
        match serde_json::from_slice::<LedgerRecord>(line) {
            Ok(record) => contents.records.push(record),
            Err(_) if position + 1 == lines.len() => {
                tracing::warn!(
                    path = %path.display(),
                    line = number,
                    "skipping a torn last line in the ledger (left by a crash)"
                );
                contents.torn_last_line = Some(*number);
            }
            Err(source) => {
                return Err(LedgerError::BadLine {
                    path: path.to_path_buf(),
                    line: *number,
                    source,
                })
            }
        }
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(iteration: u32, outcome: Outcome) -> LedgerRecord {
        let at = DateTime::parse_from_rfc3339("2025-01-31T14:05:09.123Z")
            .unwrap()
            .with_timezone(&Utc);
        LedgerRecord {
            run_id: "r1".into(),
            iteration,
            story_id: "US-001".into(),
            story_title: "Add login".into(),
            backend: "claude".into(),
            model: Some("sonnet".into()),
            agent_version: None,
            started_at: at,
            ended_at: at,
            duration_s: 1.5,
            outcome,
            exit_code: Some(0),
            signal: None,
            tokens_in: Some(10),
            tokens_out: Some(20),
            cache_read_tokens: None,
            cache_creation_tokens: None,
            cost_usd: Some(0.25),
            cost_source: Some(CostSource::Agent),
            head_before: None,
            head_after: Some("abc".into()),
            commits: vec!["abc".into()],
            checkpoint_commit: None,
            files_changed: vec!["src/a.rs".into()],
            promise_seen: false,
            passes_flipped: vec!["US-001".into()],
            passes_reverted: vec![],
            session_id: None,
            transcript: Some(".ralph/runs/r1/iter-001.jsonl".into()),
            message: None,
        }
    }

    #[test]
    fn outcome_wire_names_round_trip() {
        for outcome in Outcome::ALL {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
            assert_eq!(outcome.as_str().parse::<Outcome>().unwrap(), outcome);
            assert_eq!(outcome.to_string(), outcome.as_str());
        }
        let err = "done".parse::<Outcome>().unwrap_err();
        assert!(err.to_string().contains("unknown outcome `done`"));
    }

    #[test]
    fn budget_helpers_follow_the_design() {
        assert!(!Outcome::UsageLimit.counts_as_iteration());
        assert!(!Outcome::Transient.counts_as_iteration());
        assert!(Outcome::Interrupted.counts_as_iteration());
        assert!(Outcome::NoProgress.is_failure());
        assert!(!Outcome::Progress.is_failure());
        assert!(Outcome::AuthError.stops_run());
        assert!(!Outcome::Timeout.stops_run());
    }

    #[test]
    fn timestamps_are_rfc3339_utc_millis() {
        let line = serde_json::to_string(&record(1, Outcome::Progress)).unwrap();
        assert!(
            line.contains(r#""started_at":"2025-01-31T14:05:09.123Z""#),
            "{line}"
        );
        assert!(line.contains(r#""outcome":"progress""#), "{line}");
    }

    #[test]
    fn append_drops_a_torn_fragment_so_it_never_lands_mid_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/ledger.jsonl");
        append(&path, &record(1, Outcome::Progress)).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"run_id":"r1","iter"#).unwrap();
        drop(file);
        append(&path, &record(2, Outcome::StoryPassed)).unwrap();
        let contents = read_all(&path).unwrap();
        assert_eq!(contents.torn_last_line, None);
        let iterations: Vec<u32> = contents.records.iter().map(|r| r.iteration).collect();
        assert_eq!(iterations, [1, 2]);
        // The cut bytes are kept beside the ledger, not thrown away.
        let kept = torn_files(&path);
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).unwrap(), br#"{"run_id":"r1","iter"#);
    }

    /// The `.torn-*` files beside `ledger`, sorted.
    fn torn_files(ledger: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(ledger.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ledger.torn-"))
            })
            .collect();
        found.sort();
        found
    }

    #[test]
    fn repair_cuts_a_torn_tail_keeps_its_bytes_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        assert_eq!(repair(&path).unwrap(), Repair::Clean, "missing file");
        assert!(!path.exists(), "repair must not create the ledger");
        append(&path, &record(1, Outcome::Progress)).unwrap();
        append(&path, &record(2, Outcome::Progress)).unwrap();
        let whole = fs::read(&path).unwrap();
        assert_eq!(repair(&path).unwrap(), Repair::Clean);

        // A crash tore the third record after 40 bytes (an é split in the middle, too).
        let third = serde_json::to_string(&record(3, Outcome::StoryPassed)).unwrap();
        let mut torn = third.as_bytes()[..40].to_vec();
        torn.extend_from_slice(&[0xc3]);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&torn).unwrap();
        drop(file);
        assert_eq!(read_all(&path).unwrap().torn_last_line, Some(3));

        let Repair::Dropped { bytes, kept_in } = repair(&path).unwrap() else {
            panic!("the torn line was not dropped");
        };
        assert_eq!(bytes, torn.len());
        assert_eq!(fs::read(&path).unwrap(), whole, "only the fragment was cut");
        assert_eq!(fs::read(&kept_in).unwrap(), torn);
        assert_eq!(kept_in.parent(), path.parent());
        assert_eq!(repair(&path).unwrap(), Repair::Clean, "second repair");
        let contents = read_all(&path).unwrap();
        assert_eq!(contents.torn_last_line, None);
        assert_eq!(contents.records.len(), 2);

        // A second tear in the same millisecond still gets its own file.
        for _ in 0..2 {
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(b"{\"run_id\"").unwrap();
            drop(file);
            assert!(matches!(repair(&path).unwrap(), Repair::Dropped { .. }));
        }
        assert_eq!(torn_files(&path).len(), 3);
        assert_eq!(fs::read(&path).unwrap(), whole);
    }

    #[test]
    fn repair_of_a_file_that_is_one_torn_line_leaves_it_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let torn = b"{\"run_id\":\"r1\",\"itera";
        fs::write(&path, torn).unwrap();
        assert!(
            matches!(repair(&path).unwrap(), Repair::Dropped { bytes, .. } if bytes == torn.len())
        );
        assert_eq!(fs::read(&path).unwrap(), b"");
        assert_eq!(read_all(&path).unwrap(), LedgerContents::default());
    }

    #[test]
    fn append_terminates_a_complete_record_missing_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let line = serde_json::to_string(&record(1, Outcome::Progress)).unwrap();
        fs::write(&path, &line).unwrap();
        assert_eq!(repair(&path).unwrap(), Repair::Terminated);
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{line}\n"));
        fs::write(&path, &line).unwrap();
        append(&path, &record(2, Outcome::Progress)).unwrap();
        assert_eq!(read_all(&path).unwrap().records.len(), 2);
        assert!(
            torn_files(&path).is_empty(),
            "a complete record is not torn"
        );
    }
}
