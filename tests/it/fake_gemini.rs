//! `ralph run --agent gemini` end to end with the fake agent's gemini dialect
//! (`testing/fake_agent/gemini.rs`) standing in for the CLI: the command line and stdin ralph
//! gives it, the promise read only from the final assistant deltas, and the fatal exits the
//! scripted model cannot provoke (a structured `TerminalQuotaError`, exit 41, exit 55).

use serde_json::{json, Value};

use crate::common::{fake_agent_bin, prd_with_stories, text, TestEnv};

const PROMISE: &str = "<promise>COMPLETE</promise>";

/// `ralph run --agent gemini --model gemini-2.5-flash` with the fake as the gemini program.
fn ralph(env: &TestEnv, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        "--agent",
        "gemini",
        "--model",
        "gemini-2.5-flash",
        "--agent-program",
        fake_agent_bin(),
    ];
    args.extend_from_slice(extra);
    env.ralph(&args)
}

fn calls(env: &TestEnv) -> Vec<Value> {
    std::fs::read_to_string(format!("{}.calls.jsonl", env.script.display()))
        .expect("the fake's calls.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("call line"))
        .collect()
}

#[test]
fn a_story_implemented_through_gemini_stream_json_passes_with_the_promise() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"gemini": {"init": {"session_id": "s-1"}}},
        {"gemini": {"echo_prompt": true}},
        {"gemini": {"text": "I'll write file-1.txt."}},
        {"gemini": {"tool": {"name": "write_file",
            "parameters": {"file_path": "file-1.txt", "content": "story 1\n"},
            "output": "Successfully created and wrote to new file: file-1.txt."}}},
        {"write_file": {"path": "file-1.txt", "content": "story 1\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"gemini": {"text": ["Implemented US-001.\n", PROMISE]}},
        {"gemini": {"result": {}}}
    ]]}));
    let out = ralph(&env, &["--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    let r = &ledger[0];
    assert_eq!(r["outcome"], "story_passed", "{r}");
    assert_eq!(r["backend"], "gemini", "{r}");
    assert_eq!(r["promise_seen"], true, "{r}");
    assert_eq!(r["session_id"], "s-1", "{r}");
    assert_eq!(r["model"], "gemini-2.5-flash", "{r}");
    // The fake's default stats: 20 input tokens of which 5 cached, 10 output.
    assert_eq!(r["tokens_in"], 15, "{r}");
    assert_eq!(r["tokens_out"], 10, "{r}");
    assert_eq!(r["cache_read_tokens"], 5, "{r}");
    assert_eq!(r["cost_usd"], Value::Null, "{r}");

    // The command line ralph builds; the prompt came on stdin, not in argv.
    let call = &calls(&env)[0];
    assert_eq!(
        call["argv"],
        json!([
            "--output-format",
            "stream-json",
            "--yolo",
            "--skip-trust",
            "-m",
            "gemini-2.5-flash"
        ])
    );
    assert_eq!(call["env"]["NO_COLOR"], "1");
}

/// The prompt ralph sends carries the promise instruction, and the CLI echoes it as a user
/// message; text before a tool call and a file the agent reads may hold the promise too. None of
/// them is a claim: only the assistant deltas after the last tool result are.
#[test]
fn the_promise_in_the_echoed_prompt_or_around_a_tool_is_not_a_claim() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        [
            // A prompt (e.g. a custom template) that ends with the marker, echoed; the
            // assistant says nothing after it.
            {"gemini": {"init": {}}},
            {"gemini": {"user": format!("Story ID: US-001\nWhen every story passes, print:\n{PROMISE}")}},
            {"gemini": {"result": {}}}
        ],
        [
            {"gemini": {"init": {}}},
            {"gemini": {"echo_prompt": true}},
            {"gemini": {"text": format!("Let me check the notes.\n{PROMISE}")}},
            {"gemini": {"tool": {"name": "read_file", "parameters": {"file_path": "notes.md"},
                "output": format!("Reply with\n{PROMISE}")}}},
            {"gemini": {"result": {}}}
        ]
    ]}));
    let out = ralph(&env, &["--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 2, "{ledger:#?}");
    for r in &ledger {
        assert_eq!(r["outcome"], "no_progress", "{r}");
        assert_eq!(r["promise_seen"], false, "{r}");
    }
}

#[test]
fn a_terminal_quota_error_with_exit_173_is_a_usage_limit() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"default": [
        {"gemini": {"init": {}}},
        {"gemini": {"echo_prompt": true}},
        {"gemini": {"quota": {}}}
    ]}));
    let out = ralph(&env, &["--max-iter", "3", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "usage_limit", "{}", ledger[0]);
    assert_eq!(ledger[0]["exit_code"], 173, "{}", ledger[0]);
    assert!(
        ledger[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("You have exhausted your capacity")),
        "{}",
        ledger[0]
    );
}

#[test]
fn auth_and_untrusted_folder_exits_stop_the_run() {
    for (action, outcome, code) in [
        (json!({"auth_error": {}}), "auth_error", 41),
        (json!({"auth_error": {"result": true}}), "auth_error", 41),
        (json!({"untrusted": true}), "config_error", 55),
    ] {
        let env = TestEnv::new(&prd_with_stories(1));
        env.script(&json!({"default": [{"gemini": action}]}));
        let out = ralph(&env, &["--max-iter", "3"]);
        assert_eq!(out.status.code(), Some(1), "{action}: {}", text(&out));
        let ledger = env.ledger();
        assert_eq!(ledger.len(), 1, "{action}: {ledger:#?}");
        assert_eq!(ledger[0]["outcome"], outcome, "{action}: {}", ledger[0]);
        assert_eq!(ledger[0]["exit_code"], code, "{action}: {}", ledger[0]);
        assert_eq!(env.agent_calls(), 1, "{action}: stopped at once");
    }
}
