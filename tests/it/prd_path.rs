//! Engineer h6's part of issue 18, end to end: the PRD path (`ralph plan` keeps `verify` and
//! `dependsOn`, the linter and the run say which stories are taken on the agent's word) and
//! the agent lines that were misread (claude's plain-text limit sentence in stream-json mode,
//! gemini's session turn limit before a `success` result).

use serde_json::{json, Value};

use crate::common::{fake_agent_bin, prd_with_stories, text, TestEnv};

fn outcomes(env: &TestEnv) -> Vec<String> {
    env.ledger()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn state(env: &TestEnv) -> Value {
    serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json")
}

/// claude prints its limit sentence as a plain line on stdout in stream-json mode, instead of
/// the JSON lines or among them, then exits 1: the run reads a usage limit with its reset time
/// (exit 75 with --no-wait, the reset in state.json), not "exited with code 1 and gave no error
/// message", and no attempt is spent.
#[test]
fn claude_plain_text_limit_line_is_a_usage_limit_with_its_reset() {
    for (script, reset_within_h) in [
        // Instead of the JSON lines: the 5-hour wording with a relative reset.
        (
            json!([{"stdout": "5-hour limit reached \u{2219} resets in 2h 30m"}, {"exit": 1}]),
            (2, 3),
        ),
        // Among them: the extra-usage wording with a clock time.
        (
            json!([{"claude_init": {}}, {"stdout": "You're out of extra usage \u{00b7} resets 9pm"}, {"exit": 1}]),
            (0, 25),
        ),
        // The weekly wording with a day and a time.
        (
            json!([{"claude_init": {}}, {"stdout": "Weekly limit reached \u{2219} resets Mon 5am"}, {"exit": 1}]),
            (0, 24 * 8),
        ),
    ] {
        let env = TestEnv::new(&prd_with_stories(1));
        env.script(&json!({ "invocations": [script] }));
        let out = env.ralph(&["run", "--no-wait"]);
        assert_eq!(out.status.code(), Some(75), "{script}: {}", text(&out));
        assert_eq!(outcomes(&env), ["usage_limit"], "{script}");
        let record = &env.ledger()[0];
        let message = record["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("gave no error message") && message.contains("reset"),
            "{script}: {message}"
        );
        let state = state(&env);
        let at = chrono::DateTime::parse_from_rfc3339(
            state["resume_at"]
                .as_str()
                .unwrap_or_else(|| panic!("{script}: no resume_at in {state}")),
        )
        .unwrap()
        .with_timezone(&chrono::Utc);
        let hours = (at - chrono::Utc::now()).num_minutes() as f64 / 60.0;
        let (lo, hi) = reset_within_h;
        assert!(
            hours >= f64::from(lo) - 0.1 && hours <= f64::from(hi) + 0.1,
            "{script}: resets in {hours} h"
        );
        assert_eq!(
            state["attempts"]["US-001"].as_u64().unwrap_or(0),
            0,
            "{state}"
        );
    }
}

/// gemini stops the agent at its `maxSessionTurns` with an `error` event, then prints a
/// `success` result and exits 0. The iteration failed (agent_error) and its reason names the
/// turn limit, not "changed nothing".
#[test]
fn gemini_session_turn_limit_fails_the_iteration_and_says_so() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"gemini": {"init": {"session_id": "s-1"}}},
        {"gemini": {"text": "Let me look at the files first."}},
        {"gemini": {"error": {"message": "Maximum session turns exceeded", "severity": "error"}}},
        {"gemini": {"result": {}}}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "gemini",
        "--agent-program",
        fake_agent_bin(),
        "--max-iter",
        "1",
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["agent_error"], "{}", text(&out));
    let message = env.ledger()[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("session turn limit")
            && message.contains("Maximum session turns exceeded"),
        "{message}"
    );
    assert!(!message.contains("changed nothing"), "{message}");
}
