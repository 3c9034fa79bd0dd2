//! Fallback agents end to end: `ralph run` with `ralph-fake-agent` installed as both `claude` and
//! `codex` (one script plays both, invocation by invocation, in each CLI's own output shape).
//! A usage limit moves the run to the next agent at once, the first agent is probed again after
//! its (short, relative) reset, a probe that finds it still limited backs off, every agent
//! limited means one wait until the earliest reset, and an agent that cannot log in is taken out
//! of the run. Checked in the ledger (which agent ran each iteration), state.json, the live
//! lines, `--json` and the exit code. No test depends on the time of day: every reset is a few
//! seconds from now, given as an epoch (claude) or left out (codex's `Try again later`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{fake_agent_bin, prd_with_stories, text, TestEnv};

/// A repository with `stories` stories, the fake agent as `claude` and `codex`, and `toml` as
/// ralph.toml (committed).
pub(crate) fn env_with(stories: usize, toml: &str) -> TestEnv {
    let env = TestEnv::new(&prd_with_stories(stories));
    std::os::unix::fs::symlink(fake_agent_bin(), env.path("../bin/codex")).expect("symlink codex");
    env.write("ralph.toml", toml);
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env
}

/// claude works on `id` and marks it passing.
fn claude_story(id: &str) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": format!("{id}.txt"), "content": "claude\n"}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id} (claude)")},
        {"claude_result": {"text": "done", "cost_usd": 0.01}}
    ])
}

/// codex works on `id` (after `sleep_ms`) and marks it passing.
pub(crate) fn codex_story(id: &str, sleep_ms: u64) -> Value {
    json!([
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"sleep_ms": sleep_ms},
        {"write_file": {"path": format!("{id}.txt"), "content": "codex\n"}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id} (codex)")},
        {"codex": {"message": "done"}},
        {"codex": {"completed": {}}}
    ])
}

/// claude's 5-hour limit, resetting `in_s` seconds after the fake plays it (an epoch in
/// `rate_limit_event`): counted from the invocation, not from when the script was written, so
/// that a slow start of ralph cannot make the reset pass before the limit is even seen.
fn claude_limit(in_s: i64) -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": in_s}},
        {"exit": 1}
    ])
}

/// claude's 5-hour limit stating a reset that passed a second ago (a loose reset time).
fn claude_limit_stale() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": -1}},
        {"exit": 1}
    ])
}

/// codex's usage limit without a reset time (`Try again later.`).
fn codex_limit() -> Value {
    json!([{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}])
}

/// Each iteration's (agent, outcome) from the ledger.
pub(crate) fn sequence(env: &TestEnv) -> Vec<(String, String)> {
    env.ledger()
        .iter()
        .map(|r| {
            (
                r["agent"].as_str().unwrap_or("?").to_owned(),
                r["outcome"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

pub(crate) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, o)| (a.to_string(), o.to_string()))
        .collect()
}

fn state(env: &TestEnv) -> Value {
    serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json")
}

/// claude's answer when it cannot log in (an `api_error` result with status 401, exit 1).
pub(crate) fn claude_login_failure() -> Value {
    json!([
        {"claude_init": {}},
        {"json": {"duration_ms": 400, "session_id": "s", "total_cost_usd": 0,
            "is_error": true, "subtype": "success", "api_error_status": 401,
            "terminal_reason": "api_error",
            "result": "Invalid API key · Please run /login", "type": "result"}},
        {"exit": 1}
    ])
}

/// The argv of the fake's `n`th run (0-based).
pub(crate) fn argv(env: &TestEnv, n: usize) -> Vec<String> {
    let calls = std::fs::read_to_string(env.path("../script.json.calls.jsonl")).unwrap_or_default();
    let call: Value = serde_json::from_str(calls.lines().nth(n).expect("a call")).expect("json");
    call["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn a_usage_limit_switches_to_the_fallback_and_the_primary_is_probed_after_its_reset() {
    let env = env_with(
        3,
        "model = \"opus\"\n\n[[agents]]\nname = \"backup\"\nagent = \"codex\"\nmodel = \"gpt-5-mini\"\n",
    );
    env.script(&json!({"invocations": [
        claude_story("US-001"),
        claude_limit(3),
        // codex works long enough for claude's reset to pass.
        codex_story("US-002", 3500),
        claude_story("US-003"),
    ]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        t.elapsed() < Duration::from_secs(25),
        "the run waited instead of switching"
    );
    assert_eq!(
        sequence(&env),
        pairs(&[
            ("claude", "story_passed"),
            ("claude", "usage_limit"),
            ("backup", "story_passed"),
            ("claude", "story_passed"),
        ])
    );
    let backends: Vec<String> = env
        .ledger()
        .iter()
        .map(|r| r["backend"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(backends, ["claude", "claude", "codex", "claude"]);
    // The morning report names the agent of each iteration.
    let md = text(&env.ralph(&["report", "--markdown"]));
    for row in ["usage_limit · claude", "story_passed · backup"] {
        assert!(md.contains(row), "missing {row:?} in:\n{md}");
    }
    let html = env.ralph(&["report", "--out", "report.html"]);
    assert_eq!(html.status.code(), Some(0), "{}", text(&html));
    let html = env.read("report.html");
    assert!(
        html.contains("agent backup") && html.contains("agent claude"),
        "the HTML report labels the agents"
    );
    // Each agent runs with its own model: the fallback does not inherit the primary's.
    let codex_argv = argv(&env, 2).join(" ");
    assert!(
        codex_argv.contains("gpt-5-mini") && !codex_argv.contains("opus"),
        "{codex_argv}"
    );
    let claude_argv = argv(&env, 3).join(" ");
    assert!(
        claude_argv.contains("opus") && !claude_argv.contains("gpt-5-mini"),
        "{claude_argv}"
    );
    // The limit cost no attempt, and no reset is left once claude ran again.
    let state = state(&env);
    assert_eq!(state["attempts"]["US-002"], 1, "{state}");
    assert!(state["resume_at"].is_null(), "{state}");
    assert!(state.get("agent_resets").is_none(), "{state}");
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|e: &Value| e["event"] == "agent_switched")
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        (&events[0]["from"], &events[0]["to"], &events[0]["reason"]),
        (&json!("claude"), &json!("backup"), &json!("usage_limit"))
    );
    assert!(events[0]["from_resets_at"].is_string(), "{events:?}");
    assert_eq!(
        (&events[1]["from"], &events[1]["to"], &events[1]["reason"]),
        (&json!("backup"), &json!("claude"), &json!("reset_passed"))
    );
    // The readers of history name the agent of each iteration.
    let log = env.ralph(&["log"]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("backup"), "{log}");
}

#[test]
fn a_probe_that_finds_the_primary_still_limited_backs_off_and_stays_on_the_fallback() {
    let env = env_with(2, "");
    env.script(&json!({"invocations": [
        claude_limit(2),
        codex_story("US-001", 2500),
        // The stated reset has passed, but claude is still limited (a loose reset time).
        claude_limit_stale(),
        codex_story("US-002", 0),
    ]}));
    let out = env.ralph(&["run", "--fallback-agent", "codex"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        sequence(&env),
        pairs(&[
            ("claude", "usage_limit"),
            ("codex", "story_passed"),
            ("claude", "usage_limit"),
            ("codex", "story_passed"),
        ])
    );
    let state = state(&env);
    let reset = state["agent_resets"]["claude"]
        .as_str()
        .unwrap_or_else(|| panic!("claude's reset is kept: {state}"));
    let reset = chrono::DateTime::parse_from_rfc3339(reset).expect("rfc3339");
    let ahead = reset.timestamp() - chrono::Utc::now().timestamp();
    assert!(
        (200..=400).contains(&ahead),
        "the second limit in a row backs off about 5 minutes, got {ahead}s"
    );
    // One agent is still free: nothing for a restarted run to wait for.
    assert!(state["resume_at"].is_null(), "{state}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("switching from claude to codex").count(),
        2,
        "{stderr}"
    );
    assert!(!stderr.contains("waiting for the usage limit"), "{stderr}");
}

#[test]
fn every_agent_limited_waits_once_until_the_earliest_reset() {
    let env = env_with(
        1,
        "usage_limit_fallback = \"2s\"\nusage_limit_margin = \"0s\"\nfallback_agents = [\"codex\"]\n",
    );
    env.script(&json!({"invocations": [
        claude_limit(3600),
        codex_limit(),
        codex_story("US-001", 0),
    ]}));
    let t = Instant::now();
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        t.elapsed() >= Duration::from_millis(1500) && t.elapsed() < Duration::from_secs(60),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(
        sequence(&env),
        pairs(&[
            ("claude", "usage_limit"),
            ("codex", "usage_limit"),
            ("codex", "story_passed"),
        ])
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("waiting for the usage limit").count(),
        1,
        "{stderr}"
    );
    // claude's hour-long reset is still recorded for the next run.
    let state = state(&env);
    assert!(state["agent_resets"]["claude"].is_string(), "{state}");
    assert!(state["agent_resets"].get("codex").is_none(), "{state}");
}

#[test]
fn every_agent_limited_with_no_wait_stops_with_the_earliest_reset_and_a_restart_waits_for_it() {
    let env = env_with(1, "");
    env.script(&json!({"invocations": [
        claude_limit(7200),
        codex_limit(),
        codex_story("US-001", 0),
    ]}));
    let out = env.ralph(&["run", "--no-wait", "--fallback-agent", "codex"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let state = state(&env);
    let resume_at =
        chrono::DateTime::parse_from_rfc3339(state["resume_at"].as_str().expect("resume_at"))
            .expect("rfc3339");
    let ahead = resume_at.timestamp() - chrono::Utc::now().timestamp();
    // codex's reset (no time given: usage_limit_fallback, 1 h) comes before claude's 2 h.
    assert!((3000..=3700).contains(&ahead), "{ahead}s: {state}");
    // A restart with --no-wait stops at once: every agent is still limited.
    let again = env.ralph(&["run", "--no-wait", "--fallback-agent", "codex"]);
    assert_eq!(again.status.code(), Some(75), "{}", text(&again));
    assert_eq!(env.agent_calls(), 2);
    // Without the fallback, the state's claude reset still holds (2 h).
    let status = env.ralph(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("claude") && status.contains("codex"),
        "{status}"
    );
}

#[test]
fn an_agent_that_cannot_log_in_is_taken_out_and_the_run_goes_on() {
    let env = env_with(2, "");
    env.script(&json!({"invocations": [
        claude_login_failure(),
        codex_story("US-001", 0),
        codex_story("US-002", 0),
    ]}));
    let out = env.ralph(&["run", "--fallback-agent", "codex"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        sequence(&env),
        pairs(&[
            ("claude", "auth_error"),
            ("codex", "story_passed"),
            ("codex", "story_passed"),
        ])
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agent claude cannot log in") && stderr.contains("goes on with codex"),
        "{stderr}"
    );
    assert!(
        stderr.contains("switching from claude to codex"),
        "{stderr}"
    );
}

#[test]
fn the_run_stops_when_every_agent_failed_to_log_in() {
    let env = env_with(1, "");
    let auth = json!([
        {"claude_init": {}},
        {"json": {"duration_ms": 400, "session_id": "s", "total_cost_usd": 0,
            "is_error": true, "subtype": "success", "api_error_status": 401,
            "terminal_reason": "api_error",
            "result": "Invalid API key · Please run /login", "type": "result"}},
        {"exit": 1}
    ]);
    env.script(&json!({"invocations": [
        auth,
        [
            {"read_stdin": true},
            {"codex": {"start": {}}},
            {"codex": {"failed": "unexpected status 401 Unauthorized: Incorrect API key provided"}},
            {"exit": 1}
        ],
    ]}));
    let out = env.ralph(&["run", "--fallback-agent", "codex"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        sequence(&env),
        pairs(&[("claude", "auth_error"), ("codex", "auth_error")])
    );
    assert_eq!(env.agent_calls(), 2);
}

#[test]
fn an_unknown_fallback_agent_is_refused_before_anything_runs() {
    let env = env_with(1, "");
    let out = env.ralph(&["run", "--fallback-agent", "codx"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fallback agent `codx` is neither"),
        "{stderr}"
    );
    assert_eq!(env.agent_calls(), 0);
}

// ---------------------------------------------------------------------------------------------
// The real claude and codex CLIs against the scripted model (testing/README-model.md), offline:
// two scripted servers in one network namespace. The inner one (run mode, so claude's
// ANTHROPIC_BASE_URL points at it) plays claude's side of the textkit example with an API usage
// limit on US-002; the outer one, on the port codex's config names, plays the whole example for
// codex.

mod real {
    use std::fs;
    use std::net::TcpListener;
    use std::process::Command;
    use std::time::Duration;

    use serde_json::{json, Value};

    use crate::support_model::{
        example_dir, git, hermetic_env, init_repo_from_example, isolated, netns_flag, read_jsonl,
        real_cli_or_skip, run_with_deadline, SCRIPTED_MODEL,
    };

    /// codex's model server port inside a fresh network namespace (any port is free there).
    const NETNS_PORT: u16 = 18091;

    /// `$CODEX_HOME/config.toml` for the scripted model on `port` (as `real_codex.rs` writes it).
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

    #[test]
    fn real_claude_at_a_usage_limit_hands_the_story_to_real_codex_and_comes_back() {
        let test = "real_claude_at_a_usage_limit_hands_the_story_to_real_codex_and_comes_back";
        let (Some(claude), Some(codex)) = (
            real_cli_or_skip("claude", test),
            real_cli_or_skip("codex", test),
        ) else {
            return;
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let repo = root.join("textkit");
        let sandbox = root.join("sandbox");
        init_repo_from_example(&example_dir("textkit"), &repo, &sandbox);
        // The order under test does not hang on how fast this machine is: claude's reset comes
        // 4 s after its limit (usage_limit_fallback), so the pick right after the limit finds
        // claude limited however slow the bookkeeping; US-002's check takes 5 s, so the pick
        // after codex's iteration finds the reset passed however fast codex answered.
        let prd_path = repo.join("prd.json");
        let mut prd: Value =
            serde_json::from_str(&fs::read_to_string(&prd_path).expect("prd.json")).expect("JSON");
        prd["userStories"][1]["verify"] = json!("sleep 5");
        fs::write(&prd_path, serde_json::to_string_pretty(&prd).expect("JSON")).expect("write");
        git(&repo, &sandbox, &["commit", "-qam", "US-002 checks slowly"]);
        let port = match netns_flag() {
            Some(_) => NETNS_PORT,
            None => TcpListener::bind(("127.0.0.1", 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port"),
        };
        let codex_home = sandbox.join("home/.codex");
        fs::create_dir_all(&codex_home).expect("CODEX_HOME");
        fs::write(codex_home.join("config.toml"), codex_config(port)).expect("config.toml");
        // claude's side: US-002 answers with the API's spend-limit error (a reset date long
        // past, so ralph tries claude again after usage_limit_fallback: 4 s).
        let textkit: Value = serde_json::from_str(
            &fs::read_to_string(example_dir("textkit").join("scenario.json")).expect("scenario"),
        )
        .expect("scenario JSON");
        let mut claude_side = textkit.clone();
        claude_side["stories"]["US-002"] = json!([{"error": {"status": 429,
            "type": "rate_limit_error",
            "message": "You have reached your specified API usage limits. You will regain access on 2020-01-01 at 00:00 UTC."}}]);
        let claude_scenario = root.join("claude-scenario.json");
        fs::write(&claude_scenario, claude_side.to_string()).expect("write");
        let codex_scenario = root.join("codex-scenario.json");
        fs::write(&codex_scenario, textkit.to_string()).expect("write");
        let config = root.join("ralph.toml");
        fs::write(
            &config,
            format!(
                "usage_limit_fallback = \"4s\"\nusage_limit_margin = \"0s\"\n\n[[agents]]\nname = \"codex\"\nagent = \"codex\"\nagent_program = \"{}\"\n",
                codex.display()
            ),
        )
        .expect("write ralph.toml");

        let mut cmd = Command::new(SCRIPTED_MODEL);
        cmd.arg("--scenario")
            .arg(&codex_scenario)
            .arg("--port")
            .arg(port.to_string())
            .arg("--log")
            .arg(root.join("codex-model-log.jsonl"))
            .arg("--")
            .arg(SCRIPTED_MODEL)
            .arg("--scenario")
            .arg(&claude_scenario)
            .arg("--log")
            .arg(root.join("claude-model-log.jsonl"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_ralph"))
            .args(["run", "--agent", "claude", "--max-iter", "6", "--config"])
            .arg(&config)
            .current_dir(&repo)
            .env("RALPH_AGENT_PROGRAM", &claude);
        hermetic_env(&mut cmd, &sandbox);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("CODEX_") || k.starts_with("OPENAI_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("CODEX_HOME", &codex_home)
            .env("SCRIPTED_MODEL_API_KEY", "dummy");
        let out = run_with_deadline(
            isolated(&cmd),
            &root.join("ralph"),
            Duration::from_secs(300),
        );
        assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");
        let ledger = read_jsonl(&repo.join(".ralph/ledger.jsonl"));
        let seq: Vec<(String, String, String)> = ledger
            .iter()
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap_or("?").to_owned();
                (s("agent"), s("story_id"), s("outcome"))
            })
            .collect();
        let want: Vec<(String, String, String)> = [
            ("claude", "US-001", "story_passed"),
            ("claude", "US-002", "usage_limit"),
            ("codex", "US-002", "story_passed"),
            ("claude", "US-003", "story_passed"),
        ]
        .iter()
        .map(|(a, s, o)| (a.to_string(), s.to_string(), o.to_string()))
        .collect();
        assert_eq!(seq, want, "{out}");
        assert!(
            out.stderr.contains("switching from claude to codex")
                && out.stderr.contains("switching from codex to claude"),
            "{out}"
        );
        // codex answered only US-002 on its server; claude never saw US-002 succeed.
        let codex_log = read_jsonl(&root.join("codex-model-log.jsonl"));
        assert!(
            !codex_log.is_empty() && codex_log.iter().all(|e| e["story"] == "US-002"),
            "{codex_log:#?}"
        );
    }
}

/// A fallback named by its backend alone (`--fallback-agent codex`, no `[[agents]]` table) that
/// cannot start gets a hint naming a table that can exist: a new one with `name = "codex"`.
/// (The hint said "`agent_program` in the [[agents]] table `codex` of ralph.toml", a table that
/// was not there.)
#[test]
fn a_bare_fallback_that_cannot_start_is_sent_to_a_table_that_can_exist() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "max_iter = 3\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    // No codex on PATH.
    let out = env.ralph(&["run", "--fallback-agent", "codex"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr.contains("fallback agent `codex`"), "{stderr}");
    assert!(
        stderr.contains(
            "`agent_program` in a new [[agents]] table with name = \"codex\" in ralph.toml"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("[[agents]] table `codex`"), "{stderr}");
    assert_eq!(env.agent_calls(), 0);
}

/// A fallback agent's error names where its name came from: RALPH_FALLBACK_AGENT (not
/// --fallback-agent), and, with no ralph.toml, says so instead of naming an empty path.
/// (`RALPH_FALLBACK_AGENT=native` said "`agent = "native"` in  needs the model name".)
#[test]
fn a_fallback_error_names_the_environment_variable_and_the_missing_ralph_toml() {
    let env = TestEnv::new(&prd_with_stories(1));
    let mut cmd = env.ralph_cmd(&["run"]);
    cmd.env("RALPH_FALLBACK_AGENT", "native");
    let out = cmd.output().expect("run ralph");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr.contains("RALPH_FALLBACK_AGENT names `native`, a backend that needs the model name"),
        "{stderr}"
    );
    assert!(
        stderr.contains("no ralph.toml: add one with an [[agents]] table"),
        "{stderr}"
    );
    assert!(!stderr.contains(" in  "), "no empty path: {stderr}");
    assert_eq!(env.agent_calls(), 0);
    // exec needs its command line: the same, for the flag.
    let out = env.ralph(&["run", "--fallback-agent", "exec"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--fallback-agent names `exec`, a backend that needs the command to run"),
        "{stderr}"
    );
    assert!(
        stderr.contains("agent = \"exec\", agent_cmd = "),
        "{stderr}"
    );
    // Named twice through the variable: the variable is named, not the flag.
    let mut cmd = env.ralph_cmd(&["run"]);
    cmd.env("RALPH_FALLBACK_AGENT", "codex,codex");
    let out = cmd.output().expect("run ralph");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RALPH_FALLBACK_AGENT names `codex` twice"),
        "{stderr}"
    );
    assert!(!stderr.contains("--fallback-agent names"), "{stderr}");
    // An unknown name through the flag: the flag is named.
    let out = env.ralph(&["run", "--fallback-agent", "codx"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(named by --fallback-agent)"), "{stderr}");
    assert!(stderr.contains("ralph.toml (there is none)"), "{stderr}");
}
