//! `ralph watch`'s picture of a run, read from files only: prd.json, `.ralph/state.json`, the
//! ledger, the lock, the pause and stop requests, the hints, and the in-flight iteration's
//! transcript as it grows. Nothing here locks or writes the run's state ([`Snapshot::load`]);
//! [`view`] draws a snapshot.

pub mod view;

use std::path::Path;

use chrono::{DateTime, Utc};

use crate::hints::Hint;
use crate::lock::LockInfo;
use crate::protocol::{AgentEvent, LedgerRecord, Outcome};
use crate::state::State;
use crate::workspace::RunPaths;

/// How many of the agent's latest actions are shown.
pub const ACTIONS: usize = 4;
/// How much of the end of a long transcript is read for the latest actions (256 KiB): the view
/// reads it twice a second, and must not cost the run its CPU when the agent has printed a lot.
pub const TRANSCRIPT_TAIL_BYTES: u64 = 256 * 1024;
/// How many of the latest iterations are kept.
pub const RECENT: usize = 5;

/// Where one story stands.
#[derive(Debug, Clone, PartialEq)]
pub enum StoryState {
    /// `passes: true`.
    Passed,
    /// Open and workable.
    Open,
    /// The iteration running now works on it.
    InFlight,
    /// Skipped after `--max-attempts`; why its last attempt failed.
    Blocked(String),
    /// Open, but these `dependsOn` stories do not pass yet.
    Waiting(Vec<String>),
}

/// One story's row.
#[derive(Debug, Clone, PartialEq)]
pub struct StoryRow {
    /// Its id.
    pub id: String,
    /// Its title.
    pub title: String,
    /// Where it stands.
    pub state: StoryState,
}

/// The iteration running now.
#[derive(Debug, Clone, PartialEq)]
pub struct Flight {
    /// Its number.
    pub iteration: u32,
    /// Its story.
    pub story_id: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// The agent's latest tool calls and messages (one line each, oldest first, at most
    /// [`ACTIONS`]).
    pub actions: Vec<String>,
    /// `--parallel`: the worker slot it runs on (`None` in a serial run).
    pub worker: Option<u32>,
}

/// One finished iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Recent {
    /// Its number.
    pub iteration: u32,
    /// Its story.
    pub story_id: String,
    /// Its outcome.
    pub outcome: Outcome,
    /// Why (the record's message, first line), or empty.
    pub why: String,
    /// Its duration, seconds.
    pub duration_s: f64,
    /// Its cost in USD, when known.
    pub cost_usd: Option<f64>,
}

/// The run itself.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// A `ralph run` holds the lock (its pid and host).
    Running {
        /// Its pid.
        pid: u32,
        /// Its host.
        host: String,
    },
    /// No run now; the last one stopped for this reason (when known).
    Ended(Option<String>),
}

/// Cost, tokens and iterations of the latest run against its budgets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budget {
    /// Iterations of the run that count toward `--max-iter`.
    pub iterations: u32,
    /// Iterations of the run recorded, counted or not (usage limits, login failures and
    /// interruptions do not count toward `--max-iter`).
    pub ran: u32,
    /// `--max-iter`, when the run recorded it.
    pub max_iter: Option<u32>,
    /// Cost so far, USD.
    pub cost_usd: f64,
    /// `--max-cost`, USD.
    pub max_cost_usd: Option<f64>,
    /// Input tokens so far.
    pub tokens_in: u64,
    /// Output tokens so far.
    pub tokens_out: u64,
}

/// Everything the view shows, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// prd.json's project.
    pub project: String,
    /// prd.json's branchName.
    pub branch: String,
    /// The run.
    pub run: RunState,
    /// `ralph pause` asked (the run holds once no iteration is in flight).
    pub pause_requested: bool,
    /// `ralph stop` asked.
    pub stop_requested: bool,
    /// Every story, in file order.
    pub stories: Vec<StoryRow>,
    /// The iteration running now.
    pub flight: Option<Flight>,
    /// `--parallel`: the other iterations in flight besides `flight`, in the order they started.
    pub others: Vec<Flight>,
    /// The latest run's last iterations, oldest first.
    pub recent: Vec<Recent>,
    /// Budgets.
    pub budget: Budget,
    /// The end of the usage-limit wait the run is in (the reset plus the margin: the moment the
    /// run's own terminal counts down to), or, between waits, the pending reset.
    pub wait_until: Option<DateTime<Utc>>,
    /// When the run tries a story again after a transient failure, while it waits for that.
    pub retry_at: Option<DateTime<Utc>>,
    /// Fallback agents: each agent whose usage limit has not reset yet, by its (profile) name,
    /// with its reset (state.json's `agent_resets`, those still ahead of `now`), in name order.
    pub agent_resets: Vec<(String, DateTime<Utc>)>,
    /// Pending hints.
    pub hints: Vec<Hint>,
    /// When no run is active: how the last run ended, in a few words (`every story passes`,
    /// `max iterations`), and when (its last iteration's end), when known.
    pub last_end: Option<LastEnd>,
    /// The moment the snapshot describes.
    pub now: DateTime<Utc>,
}

/// How the last run ended, for the header when no run is active.
#[derive(Debug, Clone, PartialEq)]
pub struct LastEnd {
    /// Its stop reason in a few words (`every story passes`, `max iterations`, `needs human`).
    pub what: String,
    /// Its last iteration's end, when it recorded one.
    pub at: Option<DateTime<Utc>>,
}

/// What [`Snapshot::load`] takes from outside the files: the time and the live lock holder.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Now.
    pub now: DateTime<Utc>,
    /// The `ralph run` holding the lock, when alive.
    pub holder: Option<LockInfo>,
}

impl Probe {
    /// The real clock and the lock file at `ralph_dir` (its pid alive).
    pub fn real(ralph_dir: &Path) -> Probe {
        Probe {
            now: Utc::now(),
            holder: crate::lock::live_holder(ralph_dir),
        }
    }
}

impl Snapshot {
    /// Reads the run of `paths` (see the module docs).
    ///
    /// # Errors
    /// prd.json cannot be read or is invalid (the agent may be rewriting it: a caller keeps its
    /// previous snapshot).
    pub fn load(paths: &RunPaths, probe: &Probe) -> anyhow::Result<Snapshot> {
        let prd = crate::prd::store::load(&paths.prd)?.prd;
        let state = State::load(&paths.ralph_dir)
            .ok()
            .flatten()
            .unwrap_or_default();
        let records = crate::ledger::read_all(&paths.ledger)
            .map(|c| c.records)
            .unwrap_or_default();
        let latest: Vec<&LedgerRecord> = match &state.run_id {
            Some(run) => records.iter().filter(|r| &r.run_id == run).collect(),
            None => Vec::new(),
        };
        let running = probe.holder.is_some();
        let mut flights: Vec<Flight> = state
            .in_flight
            .iter()
            .chain(&state.flights)
            .filter(|_| running)
            .map(|f| Flight {
                iteration: f.iteration,
                story_id: f.story_id.clone(),
                started_at: f.started_at,
                actions: actions(&transcript_of(paths, f)),
                worker: f.worktree.as_ref().map(|t| t.worker),
            })
            .collect();
        let flight = (!flights.is_empty()).then(|| flights.remove(0));
        let others = flights;
        let stories = prd
            .user_stories
            .iter()
            .map(|s| StoryRow {
                id: s.id.clone(),
                title: s.title.clone(),
                state: story_state(s, &prd, &state, flight.iter().chain(&others), &records),
            })
            .collect();
        let mut budget = Budget {
            max_iter: state.limits.as_ref().map(|l| l.max_iter),
            max_cost_usd: state.limits.as_ref().and_then(|l| l.max_cost_usd),
            ..Budget::default()
        };
        for r in &latest {
            budget.iterations += u32::from(r.outcome.counts_as_iteration());
            budget.ran += 1;
            budget.cost_usd += r.cost_usd.unwrap_or(0.0);
            budget.tokens_in += r.input_tokens().unwrap_or(0);
            budget.tokens_out += r.tokens_out.unwrap_or(0);
        }
        let recent = latest
            .iter()
            .rev()
            .take(RECENT)
            .rev()
            .map(|r| Recent {
                iteration: r.iteration,
                story_id: r.story_id.clone(),
                outcome: r.outcome,
                why: r
                    .message
                    .as_deref()
                    .and_then(|m| m.lines().next())
                    .unwrap_or_default()
                    .to_owned(),
                duration_s: r.duration_s,
                cost_usd: r.cost_usd,
            })
            .collect();
        Ok(Snapshot {
            project: prd.project.clone(),
            branch: prd.branch_name.clone().unwrap_or_default(),
            run: match &probe.holder {
                Some(h) => RunState::Running {
                    pid: h.pid,
                    host: h.host.clone(),
                },
                None => RunState::Ended(state.stop_reason.as_ref().map(|r| r.sentence())),
            },
            pause_requested: crate::pause_request::pending(&paths.ralph_dir).is_some(),
            stop_requested: crate::stop_request::pending(&paths.ralph_dir),
            stories,
            flight,
            others,
            recent,
            budget,
            wait_until: state
                .wait_until
                .or(state.resume_at)
                .filter(|at| *at > probe.now),
            retry_at: state.retry_at.filter(|at| *at > probe.now),
            agent_resets: state
                .agent_resets
                .iter()
                .filter(|(_, at)| **at > probe.now)
                .map(|(name, at)| (name.clone(), *at))
                .collect(),
            hints: crate::hints::pending(&paths.ralph_dir),
            last_end: state
                .stop_reason
                .as_ref()
                .filter(|_| !running)
                .map(|reason| LastEnd {
                    what: match reason {
                        crate::protocol::StopReason::Complete => "every story passes".to_owned(),
                        other => other.kind().replace('_', " "),
                    },
                    at: latest.last().map(|r| r.ended_at),
                }),
            now: probe.now,
        })
    }

    /// Whether the run holds now (a pause asked and no iteration in flight).
    pub fn paused(&self) -> bool {
        self.pause_requested
            && self.flight.is_none()
            && matches!(self.run, RunState::Running { .. })
    }
}

/// Where an iteration in flight writes its transcript: the run's books (a `--parallel` worker
/// too); a worker of a ralph from before that wrote it in its worktree's own books.
fn transcript_of(paths: &RunPaths, f: &crate::state::InFlight) -> std::path::PathBuf {
    let books = paths.transcript(&f.run_id, f.iteration);
    match &f.worktree {
        Some(tree) if !books.exists() => {
            let prd = paths
                .prd
                .strip_prefix(&paths.repo_root)
                .unwrap_or(&paths.prd);
            RunPaths::new(&tree.root, &tree.root.join(prd)).transcript(&f.run_id, f.iteration)
        }
        _ => books,
    }
}

fn story_state<'a>(
    s: &crate::prd::model::Story,
    prd: &crate::prd::model::Prd,
    state: &State,
    mut flights: impl Iterator<Item = &'a Flight>,
    records: &[LedgerRecord],
) -> StoryState {
    if s.passes {
        return StoryState::Passed;
    }
    if flights.any(|f| f.story_id == s.id) {
        return StoryState::InFlight;
    }
    if state.blocked.contains(&s.id) {
        let last = records.iter().rev().find(|r| r.story_id == s.id);
        let why = last
            .map(
                |r| match r.message.as_deref().and_then(|m| m.lines().next()) {
                    Some(m) => format!("{}: {m}", r.outcome.as_str()),
                    None => r.outcome.as_str().to_owned(),
                },
            )
            .unwrap_or_default();
        return StoryState::Blocked(why);
    }
    let waiting: Vec<String> = s
        .depends_on
        .iter()
        .filter(|d| prd.story(d).is_some_and(|x| !x.passes))
        .cloned()
        .collect();
    if waiting.is_empty() {
        StoryState::Open
    } else {
        StoryState::Waiting(waiting)
    }
}

/// The transcript at `path`, or for a long one its meta line and its last
/// [`TRANSCRIPT_TAIL_BYTES`] from the first whole line on.
fn transcript_tail(path: &Path) -> Option<String> {
    use std::io::{BufRead as _, Read as _, Seek as _};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    if len <= TRANSCRIPT_TAIL_BYTES {
        return std::fs::read_to_string(path).ok();
    }
    let mut meta = String::new();
    std::io::BufReader::new(&mut file)
        .read_line(&mut meta)
        .ok()?;
    file.seek(std::io::SeekFrom::Start(len - TRANSCRIPT_TAIL_BYTES))
        .ok()?;
    let mut tail = Vec::new();
    file.take(TRANSCRIPT_TAIL_BYTES)
        .read_to_end(&mut tail)
        .ok()?;
    let tail = String::from_utf8_lossy(&tail);
    let whole = tail.split_once('\n').map_or("", |(_, rest)| rest);
    Some(format!("{}\n{whole}", meta.trim_end()))
}

/// The agent's latest actions in the transcript at `path` (tool calls, messages, errors), one
/// line each.
fn actions(path: &Path) -> Vec<String> {
    let Some(text) = transcript_tail(path) else {
        return Vec::new();
    };
    let recorded = crate::transcript::parse_with(&text, crate::agent::replayer);
    let mut out: Vec<String> = recorded
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::ToolCall { name, summary } => Some(format!("{name}: {summary}")),
            AgentEvent::AssistantText { text } => text
                .lines()
                .find(|l| !l.trim().is_empty())
                .map(|l| format!("“{}”", l.trim())),
            AgentEvent::Error { message } => Some(format!("error: {message}")),
            _ => None,
        })
        .collect();
    let keep = out.len().saturating_sub(ACTIONS);
    out.drain(..keep);
    out.iter().map(|a| crate::redact::redact_env(a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use ratatui::backend::TestBackend;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, h, m, s).unwrap()
    }

    /// A fixture run: US-001 passed in iteration 1, US-002 failed its check twice and is
    /// blocked, US-003 is in flight (iteration 4, a tool call and a message in its transcript),
    /// US-004 waits for US-003; one hint pending; a pause asked.
    fn fixture() -> (tempfile::TempDir, RunPaths) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let paths = RunPaths::new(root, &root.join("prd.json"));
        let story = |id: &str, title: &str, passes: bool, deps: &[&str]| {
            serde_json::json!({"id": id, "title": title, "description": "d",
                "acceptanceCriteria": ["c"], "priority": 1, "passes": passes, "notes": "",
                "dependsOn": deps})
        };
        let prd = serde_json::json!({"project": "Demo", "branchName": "ralph/demo",
        "description": "x", "userStories": [
            story("US-001", "Add the parser", true, &[]),
            story("US-002", "Wire the --reverse flag", false, &[]),
            story("US-003", "Document the CLI", false, &[]),
            story("US-004", "Release notes", false, &["US-003"]),
        ]});
        std::fs::write(&paths.prd, serde_json::to_vec_pretty(&prd).unwrap()).unwrap();
        std::fs::create_dir_all(&paths.ralph_dir).unwrap();
        let mut ledger = String::new();
        for (n, id, outcome, msg, cost) in [
            (1, "US-001", Outcome::StoryPassed, None, 0.12),
            (
                2,
                "US-002",
                Outcome::VerifyFailed,
                Some("verify failed: `cargo test` exited with code 101"),
                0.31,
            ),
            (
                3,
                "US-002",
                Outcome::VerifyFailed,
                Some("verify failed: `cargo test` exited with code 101"),
                0.27,
            ),
        ] {
            let mut r = LedgerRecord::new("run-a", n, id, outcome, at(1, 0, 0));
            r.duration_s = 95.0 + f64::from(n);
            r.cost_usd = Some(cost);
            r.tokens_in = Some(10_000 * u64::from(n));
            r.tokens_out = Some(1_000);
            r.message = msg.map(str::to_owned);
            ledger.push_str(&serde_json::to_string(&r).unwrap());
            ledger.push('\n');
        }
        std::fs::write(&paths.ledger, ledger).unwrap();
        let state = State {
            run_id: Some("run-a".into()),
            iteration: 4,
            blocked: vec!["US-002".into()],
            in_flight: Some(crate::state::InFlight {
                run_id: "run-a".into(),
                iteration: 4,
                story_id: "US-003".into(),
                pid: 0,
                started_at: at(1, 10, 0),
                start_sha: None,
                strays: Vec::new(),
                worktree: None,
                agent: None,
            }),
            limits: Some(crate::state::RunLimits {
                max_iter: 10,
                max_cost_usd: Some(5.0),
                max_duration_s: None,
                started_at: at(1, 0, 0),
            }),
            ..State::default()
        };
        state.save(&paths.ralph_dir).unwrap();
        let meta = crate::transcript::TranscriptMeta {
            run_id: "run-a".into(),
            iteration: 4,
            story_id: "US-003".into(),
            backend: "claude".into(),
            command: "claude -p".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: at(1, 10, 0).to_rfc3339(),
            prompt_bytes: 10,
        };
        let mut t = crate::transcript::Transcript::create(&paths.ralph_dir, &meta).unwrap();
        for e in [
            AgentEvent::AssistantText {
                text: "Reading the CLI module first.".into(),
            },
            AgentEvent::ToolCall {
                name: "Read".into(),
                summary: "src/cli.rs".into(),
            },
            AgentEvent::ToolCall {
                name: "Bash".into(),
                summary: "cargo test --doc".into(),
            },
        ] {
            t.event(&e);
        }
        t.finish().unwrap();
        crate::hints::add(&paths.ralph_dir, "README examples must run", None).unwrap();
        crate::pause_request::request(&paths.ralph_dir).unwrap();
        (dir, paths)
    }

    fn probe() -> Probe {
        Probe {
            now: at(1, 12, 34),
            holder: Some(LockInfo {
                pid: 4242,
                host: "box".into(),
                started_at: at(1, 0, 0),
            }),
        }
    }

    #[test]
    fn a_fixture_run_reads_as_the_user_sees_it() {
        let (_dir, paths) = fixture();
        let snap = Snapshot::load(&paths, &probe()).unwrap();
        let states: Vec<&StoryState> = snap.stories.iter().map(|s| &s.state).collect();
        assert_eq!(states[0], &StoryState::Passed);
        assert!(matches!(states[1], StoryState::Blocked(why) if why.contains("cargo test")));
        assert_eq!(states[2], &StoryState::InFlight);
        assert_eq!(states[3], &StoryState::Waiting(vec!["US-003".into()]));
        let flight = snap.flight.as_ref().unwrap();
        assert_eq!(flight.actions.last().unwrap(), "Bash: cargo test --doc");
        assert_eq!(snap.budget.iterations, 3);
        assert_eq!(snap.budget.max_iter, Some(10));
        assert!((snap.budget.cost_usd - 0.70).abs() < 1e-9);
        assert!(
            snap.pause_requested && !snap.paused(),
            "pausing, not paused yet"
        );
        // No run: the last one, nothing in flight.
        let ended = Snapshot::load(
            &paths,
            &Probe {
                holder: None,
                ..probe()
            },
        )
        .unwrap();
        assert!(ended.flight.is_none());
        assert_eq!(ended.stories[2].state, StoryState::Open);
    }

    #[test]
    fn after_the_run_the_header_says_how_it_ended_and_a_wait_counts_to_the_runs_own_end() {
        let (_dir, paths) = fixture();
        let mut state = State::load(&paths.ralph_dir).unwrap().unwrap();
        state.stop_reason = Some(crate::protocol::StopReason::Complete);
        state.in_flight = None;
        state.save(&paths.ralph_dir).unwrap();
        // A stop request an ended run left behind.
        crate::stop_request::request(&paths.ralph_dir).unwrap();
        let ended = Snapshot::load(
            &paths,
            &Probe {
                holder: None,
                ..probe()
            },
        )
        .unwrap();
        let last = crate::ledger::read_all(&paths.ledger).unwrap().records;
        let ended_at = last.last().unwrap().ended_at;
        let header = view::plain(&ended, 100).lines().next().unwrap().to_owned();
        assert_eq!(
            header,
            format!(
                "ralph watch · last run ended {} UTC: every story passes · Demo · ralph/demo",
                ended_at.format("%H:%M")
            )
        );
        // During a usage-limit wait: the run's end of the wait (reset + margin), not the reset.
        state.stop_reason = None;
        state.resume_at = Some(at(1, 13, 0));
        state.wait_until = Some(at(1, 13, 0) + chrono::Duration::seconds(30));
        state.save(&paths.ralph_dir).unwrap();
        let waiting = Snapshot::load(&paths, &probe()).unwrap();
        assert_eq!(waiting.wait_until, state.wait_until);
        let screen = view::plain(&waiting, 100);
        assert!(
            screen.contains("usage limit: waits 0:56 (until 01:13 UTC)"),
            "{screen}"
        );
    }

    #[test]
    fn a_long_transcript_is_read_from_its_tail() {
        let (_dir, paths) = fixture();
        let meta = crate::transcript::TranscriptMeta {
            run_id: "run-b".into(),
            iteration: 1,
            story_id: "US-003".into(),
            backend: "claude".into(),
            command: "claude -p".into(),
            head: None,
            ralph_version: "0".into(),
            started_at: at(1, 0, 0).to_rfc3339(),
            prompt_bytes: 10,
        };
        let mut t = crate::transcript::Transcript::create(&paths.ralph_dir, &meta).unwrap();
        for i in 0..3000 {
            t.event(&AgentEvent::ToolCall {
                name: "Read".into(),
                summary: format!("src/file-{i}.rs {}", "x".repeat(200)),
            });
        }
        t.event(&AgentEvent::ToolCall {
            name: "Bash".into(),
            summary: "the last one".into(),
        });
        let path = t.finish().unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 2 * TRANSCRIPT_TAIL_BYTES);
        let got = actions(&path);
        assert_eq!(got.len(), ACTIONS);
        assert_eq!(got.last().unwrap(), "Bash: the last one");
        assert!(got[0].starts_with("Read: src/file-2997.rs"), "{got:?}");
    }

    #[test]
    fn the_screen_at_80x24() {
        let (_dir, paths) = fixture();
        let snap = Snapshot::load(&paths, &probe()).unwrap();
        let mut term = ratatui::Terminal::new(TestBackend::new(80, 24)).unwrap();
        let ui = view::Ui::default();
        term.draw(|f| view::render(&snap, &ui, f.area(), f.buffer_mut()))
            .unwrap();
        let screen = view::buffer_lines(term.backend().buffer()).join("\n");
        insta::assert_snapshot!(screen);
    }
}
