//! Each kind of agent failure end to end: `ralph run` with `ralph-fake-agent` playing a CLI
//! that fails the way real versions do (lines written from the notes and from what the real
//! CLIs printed against the scripted model), checked in the ledger, state.json and exit code.
//! The parsers' unit tests (`src/agent/*.rs`) cover each wording; these check that the class
//! reaches the run loop: a usage limit waits (and never for a time in the past), a config error
//! stops at once naming the model, an auth error stops with its hint, and what the README says
//! decides a run without a terminal event.

use serde_json::{json, Value};

use crate::common::{claude_clock_in, fake_agent_bin, prd_with_stories, text, TestEnv};

const PROMISE: &str = "<promise>COMPLETE</promise>";

fn resume_at(env: &TestEnv) -> chrono::DateTime<chrono::Utc> {
    let state = env.state();
    let at = state["resume_at"]
        .as_str()
        .unwrap_or_else(|| panic!("{state}"));
    chrono::DateTime::parse_from_rfc3339(at)
        .expect("rfc3339")
        .with_timezone(&chrono::Utc)
}

/// claude's terminal line, `type` last like 2.1.332, as an error result with `text`.
fn claude_error_result(text: &str, status: Option<u16>) -> Value {
    json!({"json": {"duration_ms": 400, "session_id": "s", "total_cost_usd": 0,
        "is_error": true, "subtype": "success", "api_error_status": status,
        "terminal_reason": "api_error", "result": text, "type": "result"}})
}

/// The weekly-limit wording as the text of an `is_error` result, exit 0 (no rate_limit_event):
/// a usage limit whose reset is the next 5am, never a failed iteration.
#[test]
fn claude_weekly_limit_result_with_exit_0_waits_for_its_reset() {
    let env = TestEnv::new(&prd_with_stories(1));
    let limit = format!(
        "Weekly limit reached \u{2219} resets {}",
        claude_clock_in(3)
    );
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        claude_error_result(&limit, Some(429)),
        {"exit": 0}
    ]]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit"]);
    let at = resume_at(&env);
    let now = chrono::Utc::now();
    assert!(at > now && at <= now + chrono::Duration::hours(25), "{at}");
    assert_eq!(env.state()["attempts"]["US-001"].as_u64().unwrap_or(0), 0);
}

/// A `rate_limit_event` whose `resetsAt` is days old: ralph does not show or wait for that
/// time; it waits `usage_limit_fallback` and the ledger says the reset time was stale.
#[test]
fn a_stale_reset_time_waits_the_fallback_and_says_so() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_fallback = \"2h\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    let stale = chrono::Utc::now().timestamp() - 3 * 24 * 3600;
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your limit \u{00b7} resets 4pm", "resets_at": stale}},
        {"exit": 1}
    ]]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit"]);
    let wait = resume_at(&env) - chrono::Utc::now();
    assert!(
        (110..=121).contains(&wait.num_minutes()),
        "waited {wait:?}, not the 2h fallback"
    );
    let message = env.ledger()[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("has already passed"), "{message}");
}

/// `claude -p` in text mode, driven by `--agent exec`, prints its limit as its only answer and
/// exits 0: the exec backend reads that one line as a usage limit.
#[test]
fn claude_text_mode_limit_through_exec_is_a_usage_limit() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"read_stdin": true},
        {"stdout": format!("You're out of extra usage \u{00b7} resets {}", claude_clock_in(3))},
        {"exit": 0}
    ]]}));
    let cmd = format!("{} -p", fake_agent_bin());
    let out = env.ralph(&["run", "--agent", "exec", "--agent-cmd", &cmd, "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit"]);
    assert!(resume_at(&env) > chrono::Utc::now());
}

/// What claude 2.1.332 printed for a model that does not exist: the run stops at once (exit 1,
/// one agent run, no failure budget spent) and the message names the model.
#[test]
fn a_missing_model_stops_the_run_at_once_naming_it() {
    let env = TestEnv::new(&prd_with_stories(2));
    let said = "There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model.";
    env.script(&json!({"invocations": [[
        {"claude_init": {"model": "claude-nope-9"}},
        {"stderr": "Claude Code doesn't recognize the model \"claude-nope-9\", so it assumes a context window of 1m tokens."},
        {"json": {"type": "assistant", "message": {"id": "m", "model": "<synthetic>", "role": "assistant",
            "type": "message", "content": [{"type": "text", "text": said}]},
            "error": "model_not_found", "parent_tool_use_id": null, "session_id": "s"}},
        claude_error_result(said, Some(404)),
        {"exit": 1}
    ]]}));
    let out = env.ralph(&["run", "--model", "claude-nope-9", "--max-failures", "5"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(env.outcomes(), ["config_error"]);
    assert_eq!(env.agent_calls(), 1);
    let message = env.ledger()[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.starts_with("the model `claude-nope-9` does not exist"),
        "{message}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("claude-nope-9"),
        "{}",
        text(&out)
    );
}

/// codex's retry chatter, then `exceeded retry limit, last status: 401 Unauthorized`: an auth
/// error that stops the run, not a transient one that would be retried.
#[test]
fn codex_retry_chatter_then_401_is_an_auth_stop() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"codex": {"error": "Reconnecting... 1/5 (stream disconnected before completion: error sending request for url (https://api.openai.com/v1/responses))"}},
        {"codex": {"error": "Reconnecting... 2/5 (unexpected status 401 Unauthorized: Incorrect API key provided)"}},
        {"codex": {"failed": "exceeded retry limit, last status: 401 Unauthorized"}},
        {"exit": 1}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "codex",
        "--agent-program",
        fake_agent_bin(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(env.outcomes(), ["auth_error"]);
    assert_eq!(env.agent_calls(), 1);
}

/// cursor with partial output: the final answer in small chunks (the promise split across
/// two), no `result` line, exit 0. The exit code decides (a finished run) and the joined
/// chunks carry the promise.
#[test]
fn cursor_chunks_without_a_result_line_complete_the_story() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"cursor": {"init": {}}},
        {"cursor": {"user": {}}},
        {"cursor": {"text": "Writing file-1.txt."}},
        {"cursor": {"tool": {"kind": "editToolCall", "args": {"path": "file-1.txt"}}}},
        {"write_file": {"path": "file-1.txt", "content": "story 1\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"cursor": {"text": "All stories "}},
        {"cursor": {"text": "pass.\n<prom"}},
        {"cursor": {"text": "ise>COMPLETE</promise>"}},
        {"stderr": "Warning: API Error: 529 Overloaded, retrying"},
        {"exit": 0}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "cursor",
        "--agent-program",
        fake_agent_bin(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "story_passed", "{}", ledger[0]);
    assert_eq!(ledger[0]["promise_seen"], true, "{}", ledger[0]);
}

/// gemini: an `error` event of severity `error`, then a successful result and exit 0, is only
/// a warning: the story passes.
#[test]
fn gemini_error_event_before_success_is_a_warning() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"gemini": {"init": {}}},
        {"gemini": {"echo_prompt": true}},
        {"gemini": {"error": {"message": "Invalid stream: The model returned an empty response or malformed tool call.", "severity": "error"}}},
        {"write_file": {"path": "file-1.txt", "content": "story 1\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"gemini": {"text": ["Done.\n", PROMISE]}},
        {"gemini": {"result": {}}}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "gemini",
        "--agent-program",
        fake_agent_bin(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.outcomes(), ["story_passed"]);
}

/// `ralph run --agent claude` with `ANTHROPIC_API_KEY` set, its HOME given, and `extra` env.
fn run_claude_with_key(env: &TestEnv, home: &std::path::Path, extra: &[(&str, &str)]) {
    let mut cmd = env.ralph_cmd(&[
        "run",
        "--max-iter",
        "1",
        "--max-no-progress",
        "100",
        "--max-attempts",
        "100",
    ]);
    cmd.env("HOME", home)
        .env("ANTHROPIC_API_KEY", "sk-ant-api03-test");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ralph");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

/// `ANTHROPIC_API_KEY` reaches claude unless claude has a login of its own; with a login it is
/// removed, except when `ANTHROPIC_BASE_URL` says the key belongs to another endpoint; and an
/// auth error after the removal names `--keep-api-key`.
#[test]
fn the_api_key_is_removed_only_when_claude_has_a_login() {
    let story = json!([
        {"claude_init": {}},
        {"claude_result": {"text": "Looked around."}}
    ]);
    let seen = |env: &TestEnv| -> Vec<Value> {
        std::fs::read_to_string(format!("{}.calls.jsonl", env.script.display()))
            .expect("calls")
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("call"))
            .map(|c| c["env"]["ANTHROPIC_API_KEY"].clone())
            .collect()
    };
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [story], "record_env": ["ANTHROPIC_API_KEY"]}));
    let no_login = env.root.path().join("home-no-login");
    let logged_in = env.root.path().join("home-logged-in");
    std::fs::create_dir_all(logged_in.join(".claude")).expect("mkdir");
    std::fs::create_dir_all(&no_login).expect("mkdir");
    std::fs::write(
        logged_in.join(".claude/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x","refreshToken":"r","expiresAt":4102444800000,"scopes":["user:inference"]}}"#,
    )
    .expect("write credentials");

    run_claude_with_key(&env, &no_login, &[]);
    run_claude_with_key(&env, &logged_in, &[]);
    run_claude_with_key(
        &env,
        &logged_in,
        &[("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")],
    );
    run_claude_with_key(&env, &logged_in, &[("RALPH_KEEP_API_KEY", "1")]);
    assert_eq!(
        seen(&env),
        [
            json!("sk-ant-api03-test"),
            Value::Null,
            json!("sk-ant-api03-test"),
            json!("sk-ant-api03-test")
        ]
    );

    // The login failed after the key was removed: the message says how to use the key.
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_api_error": {"status": 401, "message": "OAuth token has expired. Please obtain a new token or refresh your existing token."}},
        {"exit": 1}
    ]]}));
    let mut cmd = env.ralph_cmd(&["run"]);
    cmd.env("HOME", &logged_in)
        .env("ANTHROPIC_API_KEY", "sk-ant-api03-test");
    let out = cmd.output().expect("run ralph");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(env.outcomes(), ["auth_error"]);
    let message = env.ledger()[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("--keep-api-key"), "{message}");
}
