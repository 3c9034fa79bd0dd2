//! The codex backend end to end.
//!
//! First through `ralph-fake-agent`'s codex dialect (fast, no CLI needed): what ralph makes of
//! codex's JSONL in the ledger and the run's exit. Then with the real Codex CLI (pinned by
//! `scripts/install-codex.sh`) against `ralph-scripted-model`'s Responses API, offline, in the
//! same `unshare -n` harness as `real_claude.rs` (`testing/README-model.md`): `ralph run --agent
//! codex` completes the textkit example, and a usage limit stops the run without using up an
//! iteration.
//!
//! codex is configured only through `$CODEX_HOME/config.toml` in the sandbox ([`codex_config`]):
//! ralph passes no extra flags for offline use.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{codex_clock_in, fake_agent_bin, prd_with_stories, TestEnv};
use crate::support_model::{
    example_dir, git, hermetic_env, init_repo_from_example, isolated, netns_flag, read_jsonl,
    run_with_deadline, RunOutput, SCRIPTED_MODEL,
};

/// Generous: a scripted codex iteration takes about 1.5 s, but CI machines are slow and shared.
const DEADLINE: Duration = Duration::from_secs(300);

/// The port the scripted model listens on inside a fresh network namespace, where every port
/// is free. The config file has to name it before the server starts.
const NETNS_PORT: u16 = 18090;

/// codex's arguments as ralph passes them (after the program).
const CODEX_ARGS: [&str; 7] = [
    "exec",
    "--json",
    "--dangerously-bypass-approvals-and-sandbox",
    "--skip-git-repo-check",
    "--color",
    "never",
    "-",
];

fn text(out: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn outcomes(ledger: &[Value]) -> Vec<&str> {
    ledger
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("?"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The fake agent's codex dialect through `ralph run --agent codex`.

#[test]
fn fake_codex_story_passes_and_a_promise_in_command_output_is_no_claim() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [[
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"codex": {"warning": "Model metadata for `gpt-x` not found. Defaulting to fallback metadata; this can degrade performance and cause issues."}},
        {"codex": {"reasoning": "**Reading the notes**"}},
        {"codex": {"command": {"command": "cat NOTES.md", "output": "reply with <promise>COMPLETE</promise>\n"}}},
        {"write_file": {"path": "file-1.txt", "content": "one\n"}},
        {"codex": {"file_change": [{"path": "file-1.txt", "kind": "add"}]}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"codex": {"message": "US-001 is done; US-002 is still open."}},
        {"codex": {"completed": {}}}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "codex",
        "--agent-program",
        fake_agent_bin(),
        "--model",
        "gpt-5-codex",
        "--max-iter",
        "1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "max-iter with a story open\n{}",
        text(&out)
    );
    let ledger = env.ledger();
    assert_eq!(outcomes(&ledger), ["story_passed"], "no premature claim");
    let record = &ledger[0];
    assert_eq!(record["backend"], "codex");
    assert_eq!(record["promise_seen"], false, "{record}");
    assert_eq!(record["session_id"], "01a2296e-6a57-73f3-82f0-000000000000");
    // codex's input_tokens (24763) include the cached 24448.
    assert_eq!(record["tokens_in"], 315, "{record}");
    assert_eq!(record["cache_read_tokens"], 24448, "{record}");
    assert_eq!(record["tokens_out"], 122, "{record}");
    assert!(
        record["cost_usd"].is_null(),
        "codex reports no cost: {record}"
    );

    let calls =
        fs::read_to_string(format!("{}.calls.jsonl", env.script.display())).expect("calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().expect("one call")).expect("JSON");
    let mut expected: Vec<&str> = CODEX_ARGS[..6].to_vec();
    expected.extend(["-m", "gpt-5-codex", "-"]);
    assert_eq!(call["argv"], json!(expected));
    assert_eq!(call["env"]["NO_COLOR"], "1");
}

#[test]
fn fake_codex_usage_limit_stops_with_no_wait_without_using_an_attempt() {
    let env = TestEnv::new(&prd_with_stories(1));
    // Case 13's wording ("try again at 3:28 PM"), at a clock time hours ahead of the test's.
    let at = codex_clock_in(3);
    env.script(&json!({"invocations": [[
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"codex": {"usage_limit": {"at": at}}},
        {"codex": {"message": "never printed: usage_limit exits 1"}}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "codex",
        "--agent-program",
        fake_agent_bin(),
        "--no-wait",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(outcomes(&ledger), ["usage_limit"]);
    assert_eq!(ledger[0]["exit_code"], 1);
    let message = ledger[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("You've hit your usage limit.")
            && message.ends_with(&format!("try again at {at}.")),
        "{message}"
    );
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json");
    // Case 13: "try again at 3:28 PM" is read as the next 15:28 in the local zone.
    let named = chrono::NaiveTime::parse_from_str(&at, "%I:%M %p").expect("a clock time");
    let resume_at = chrono::DateTime::parse_from_rfc3339(state["resume_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Local);
    assert_eq!(
        resume_at.format("%H:%M").to_string(),
        named.format("%H:%M").to_string(),
        "{state}"
    );
    let ahead = resume_at.signed_duration_since(chrono::Local::now());
    assert!(
        ahead > -chrono::Duration::minutes(11) && ahead <= chrono::Duration::hours(24),
        "{state}"
    );
    assert!(state["attempts"].get("US-001").is_none(), "{state}");
    assert_eq!(env.agent_calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// The real Codex CLI against the scripted model.

fn codex_bin_or_skip(test: &str) -> Option<PathBuf> {
    crate::support_model::real_cli_or_skip("codex", test)
}

/// `$CODEX_HOME/config.toml` for an offline run against the scripted model on `port`:
/// - a custom provider speaking the Responses API (`wire_api = "chat"` is gone in 0.171.0),
///   its key read from `SCRIPTED_MODEL_API_KEY`, with no retries, so an error reply fails the
///   turn at once;
/// - `analytics.enabled = false` and `features.plugins = false`: without them 0.171.0 looks up
///   `ab.chatgpt.com` and `api.github.com` (the plugin marketplace), seen with
///   `strace -e trace=%network`; with them it makes no lookup at all.
///
/// `model` names no model codex knows, so each run also shows that codex's "Model metadata …
/// not found" warning item is not fatal.
fn codex_config(port: u16) -> String {
    format!(
        r#"model = "scripted-model"
model_provider = "scripted"

[model_providers.scripted]
name = "ralph-scripted-model"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "SCRIPTED_MODEL_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
"#
    )
}

/// The port for the scripted model: [`NETNS_PORT`] inside a fresh network namespace, else a
/// port that was free a moment ago (two tests run in parallel outside a namespace).
fn model_port() -> u16 {
    if netns_flag().is_some() {
        return NETNS_PORT;
    }
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A fresh copy of the textkit example as a git repository, plus a sandbox for HOME/TMPDIR
/// whose `.codex/config.toml` points codex at the scripted model.
pub(crate) struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    pub(crate) repo: PathBuf,
    sandbox: PathBuf,
    port: u16,
}

impl Fixture {
    pub(crate) fn textkit() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let repo = root.join("textkit");
        let sandbox = root.join("sandbox");
        init_repo_from_example(&example_dir("textkit"), &repo, &sandbox);
        let port = model_port();
        let codex_home = sandbox.join("home/.codex");
        fs::create_dir_all(&codex_home).expect("create CODEX_HOME");
        fs::write(codex_home.join("config.toml"), codex_config(port)).expect("write config.toml");
        Fixture {
            _tmp: tmp,
            root,
            repo,
            sandbox,
            port,
        }
    }

    fn git(&self, args: &[&str]) -> String {
        git(&self.repo, &self.sandbox, args)
    }

    /// Runs `ralph args…` (cwd = the repo, hermetic env, `RALPH_AGENT_PROGRAM=codex`) under
    /// `ralph-scripted-model --scenario S --port P --log L --`, both in one network namespace
    /// when available.
    pub(crate) fn ralph_with_model(
        &self,
        codex: &Path,
        args: &[&str],
        scenario: &Path,
        name: &str,
    ) -> RunOutput {
        let log = self.root.join(format!("{name}-model-log.jsonl"));
        let mut cmd = Command::new(SCRIPTED_MODEL);
        cmd.arg("--scenario")
            .arg(scenario)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--log")
            .arg(&log)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_ralph"))
            .args(args)
            .current_dir(&self.repo)
            .env("RALPH_AGENT_PROGRAM", codex);
        hermetic_env(&mut cmd, &self.sandbox);
        // A developer's codex login, base URL or config must not leak in.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("CODEX_") || k.starts_with("OPENAI_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("CODEX_HOME", self.sandbox.join("home/.codex"))
            .env("SCRIPTED_MODEL_API_KEY", "dummy");
        let mut out = run_with_deadline(isolated(&cmd), &self.root.join(name), DEADLINE);
        out.extra_log = Some(log);
        out
    }

    pub(crate) fn prd_passes(&self) -> Vec<(String, bool)> {
        let prd: Value = serde_json::from_str(
            &fs::read_to_string(self.repo.join("prd.json")).expect("prd.json"),
        )
        .expect("prd.json is JSON");
        prd["userStories"]
            .as_array()
            .expect("userStories")
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().expect("id").to_owned(),
                    s["passes"].as_bool().expect("passes"),
                )
            })
            .collect()
    }

    /// Runs the project's own test command; returns its stderr (where unittest reports).
    fn project_tests(&self) -> String {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "unittest", "discover", "-s", "tests", "-q"])
            .current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        let out = cmd.output().expect("run python3");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the project's tests fail:\n{stderr}");
        stderr
    }
}

#[test]
fn ralph_runs_the_textkit_example_to_completion_with_the_real_codex_cli() {
    let Some(codex) =
        codex_bin_or_skip("ralph_runs_the_textkit_example_to_completion_with_the_real_codex_cli")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    let started = Instant::now();
    let out = fx.ralph_with_model(
        &codex,
        &["run", "--agent", "codex", "--max-iter", "6"],
        &scenario,
        "ralph",
    );
    eprintln!("ralph + codex, 3 stories: {:.1?}", started.elapsed());
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");

    // Every story passes, and the project's tests (written through codex's exec_command) pass.
    assert!(
        fx.prd_passes().iter().all(|(_, passes)| *passes),
        "{:?}",
        fx.prd_passes()
    );
    assert!(fx.project_tests().contains("Ran 15 tests"));

    // One ledger record per iteration, each a passed story with codex's thread id and tokens;
    // the promise only in the last one, when prd.json had every story passing.
    let ledger = read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    assert_eq!(outcomes(&ledger), ["story_passed"; 3], "{ledger:#?}");
    for (record, story) in ledger.iter().zip(["US-001", "US-002", "US-003"]) {
        assert_eq!(record["story_id"], story, "{record}");
        assert_eq!(record["backend"], "codex", "{record}");
        assert!(
            record["session_id"].as_str().is_some_and(|s| !s.is_empty()),
            "the thread id: {record}"
        );
        // The scripted model reports part of each prompt as cached; codex counts it inside
        // input_tokens, ralph separately.
        let tokens_in = record["tokens_in"].as_u64().expect("tokens_in");
        let cached = record["cache_read_tokens"]
            .as_u64()
            .expect("cache_read_tokens");
        assert!(tokens_in > 0 && cached > 0, "{record}");
        assert!(
            record["tokens_out"].as_u64().is_some_and(|t| t > 0),
            "{record}"
        );
        assert!(record["cost_usd"].is_null(), "{record}");
    }
    let promises: Vec<bool> = ledger
        .iter()
        .map(|r| r["promise_seen"].as_bool().expect("promise_seen"))
        .collect();
    assert_eq!(promises, [false, false, true]);

    // codex spoke only the Responses API, and every request was answered.
    let log = read_jsonl(out.extra_log.as_deref().expect("model log"));
    assert!(
        log.iter()
            .all(|e| e["path"] == "/v1/responses" && e["status"] == 200),
        "{log:#?}"
    );
    assert_eq!(
        log.iter().filter(|e| e["reply"] == "text").count(),
        3,
        "one final answer per story"
    );

    // The PRD's branch, nothing uncommitted, the agent's commit per story, and ralph's own
    // commit with trailers per iteration.
    assert_eq!(
        fx.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "ralph/textkit"
    );
    assert_eq!(fx.git(&["status", "--porcelain"]), "");
    let subjects = fx.git(&["log", "--format=%s"]);
    for story in ["US-001", "US-002", "US-003"] {
        assert!(
            subjects
                .lines()
                .any(|s| s.starts_with(&format!("feat: {story} "))),
            "no agent commit for {story}:\n{subjects}"
        );
    }
    for n in 1..=3 {
        let grep = format!("--grep=^Ralph-Iteration: {n}$");
        let ralph_commit = fx.git(&["log", "--format=%B", &grep]);
        assert!(
            ralph_commit.contains("Ralph-Run: ")
                && ralph_commit.contains("Ralph-Outcome: story_passed"),
            "no ralph commit for iteration {n}:\n{ralph_commit}"
        );
    }
}

#[test]
fn real_codex_usage_limit_stops_the_run_without_using_an_iteration() {
    let Some(codex) =
        codex_bin_or_skip("real_codex_usage_limit_stops_the_run_without_using_an_iteration")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.root.join("usage-limit.json");
    // What the ChatGPT backend answers at a plan's limit: 429, type `usage_limit_reached`; the
    // scripted model adds `resets_at` an hour ahead (testing/README-model.md).
    fs::write(
        &scenario,
        r#"{"error": {"status": 429, "type": "usage_limit_reached", "message": "The usage limit has been reached"}}"#,
    )
    .expect("write scenario");
    let head = fx.git(&["rev-parse", "HEAD"]);

    let started = Instant::now();
    let out = fx.ralph_with_model(
        &codex,
        &["run", "--agent", "codex", "--max-iter", "1", "--no-wait"],
        &scenario,
        "limit",
    );
    eprintln!("ralph + codex, usage limit: {:.1?}", started.elapsed());
    // Stopped by the limit (75, resumable later), not "max iterations reached" (3).
    assert_eq!(out.status.and_then(|s| s.code()), Some(75), "{out}");
    assert!(out.stderr.contains("usage limit"), "{out}");

    let ledger = read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    assert_eq!(outcomes(&ledger), ["usage_limit"], "{ledger:#?}");
    assert_eq!(ledger[0]["exit_code"], 1);
    let message = ledger[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("You\u{2019}ve hit your usage limit.")
            && message.contains("try again at"),
        "codex's own words: {message}"
    );

    // The story's attempt budget is untouched, and the reset is remembered for the next run.
    let state: Value = serde_json::from_str(
        &fs::read_to_string(fx.repo.join(".ralph/state.json")).expect("state.json"),
    )
    .expect("state.json is JSON");
    assert!(state["attempts"].get("US-001").is_none(), "{state}");
    let resume_at = state["resume_at"].as_str().expect("resume_at persisted");
    let wait = chrono::DateTime::parse_from_rfc3339(resume_at)
        .expect("RFC 3339")
        .timestamp()
        - chrono::Utc::now().timestamp();
    assert!((50 * 60..=61 * 60).contains(&wait), "resumes in {wait} s");

    // codex made one request (no retries) and changed nothing but ralph's progress entry.
    let log = read_jsonl(out.extra_log.as_deref().expect("model log"));
    assert_eq!(log.len(), 1, "{log:#?}");
    assert_eq!(log[0]["status"], 429);
    assert_eq!(
        fx.prd_passes(),
        [
            ("US-001".into(), false),
            ("US-002".into(), false),
            ("US-003".into(), false)
        ]
    );
    let changed = fx.git(&["diff", "--name-only", head.trim(), "HEAD"]);
    assert!(
        changed.lines().all(|f| f == "progress.txt"),
        "only ralph's progress entry changed:\n{changed}"
    );
}
