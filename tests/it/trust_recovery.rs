//! Issue 18, items 3, 5 and 20 through `ralph run` with the fake agent: the stop reason names
//! the real cause of a failure streak (its dominant outcome, count and last message) and
//! `--max-failures` goes on across a story blocked by the same failure; a restart checks the
//! work an interrupted iteration left before setting anything back; a verify command's children
//! carry the iteration's tag; the processes an iteration left running are in its record; and
//! SIGKILL and SIGTERM follow one rule for stories an interrupted iteration marked passing.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::run_cases::outcomes;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The stop reason `ralph status --json` reads back from the last run.
fn last_stop(env: &TestEnv) -> Value {
    let out = env.ralph(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json");
    assert!(
        !state["stop_reason"].is_null(),
        "state.json keeps the stop reason: {state} / {status}"
    );
    state["stop_reason"].clone()
}

/// A crashing agent (an error result and exit 1, every time) and a hanging one (no output until
/// the idle limit), with the default limits: the first story is blocked after 3 attempts and
/// the second story's first identical failure ends the run. The reason is `--max-failures`,
/// naming the failure, its count over the whole streak and its last message, not "changed
/// nothing".
#[test]
fn a_crashing_or_hanging_agent_stops_on_max_failures_naming_its_failure() {
    let crash = json!([
        {"claude_init": {}},
        {"claude_result": {"text": "segfault in the tool runner", "is_error": true}},
        {"exit": 1}
    ]);
    let hang = json!([{"claude_init": {}}, {"sleep_ms": 3_600_000}]);
    for (name, script, class, last) in [
        (
            "crash",
            crash,
            "agent_error",
            "; the last: segfault in the tool runner",
        ),
        (
            "hang",
            hang,
            "stalled",
            "; the last: killed after 1s without output (idle limit)",
        ),
    ] {
        let env = TestEnv::new(&prd_with_stories(3));
        env.script(&json!({ "default": script }));
        let out = env.ralph(&["run", "--max-iter", "20", "--idle-timeout", "1s"]);
        assert_eq!(out.status.code(), Some(4), "{name}: {}", text(&out));
        assert_eq!(outcomes(&env), [class; 4], "{name}");
        let err = stderr(&out);
        let why = format!(
            "4 failed iterations in a row (--max-failures 3): {class} ×4 across US-001 (blocked after failing every attempt the same way) and US-002{last}"
        );
        assert!(err.contains(&why), "{name}: wanted {why:?} in\n{err}");
        assert!(!err.contains("changed nothing"), "{name}: {err}");
        let stop = last_stop(&env);
        assert_eq!(stop["kind"], "max_failures", "{name}: {stop}");
        assert_eq!(
            stop["cause"]["outcomes"],
            json!([{"outcome": class, "count": 4}]),
            "{name}: {stop}"
        );
        assert_eq!(stop["cause"]["stories"], json!(["US-001", "US-002"]));
    }
}

/// A lying agent: it prints the completion promise every time and changes nothing. Its
/// premature claims are not failures, so the no-change limit stops it, and the reason names
/// them with their count and message.
#[test]
fn a_lying_agent_stops_on_no_progress_naming_its_premature_claims() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"default": [
        {"claude_init": {}},
        {"claude_result": {"text": "All done.\n<promise>COMPLETE</promise>"}}
    ]}));
    let out = env.ralph(&["run", "--max-iter", "20"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["premature_claim"; 4]);
    let err = stderr(&out);
    assert!(
        err.contains("--max-no-progress 3): premature_claim ×4 across US-001 (blocked after every attempt changed nothing) and US-002; the last: completion promise printed while US-001, US-002, US-003 still have passes=false"),
        "{err}"
    );
    assert_eq!(last_stop(&env)["cause"]["outcomes"][0]["count"], 4);
}

/// `--max-failures` across stories: with 2 attempts per story and 3 failures allowed, the
/// second story's first crash is the third in a row. A story whose attempts failed in
/// different ways is hard, not a sign of a broken agent, and its block starts the count again.
#[test]
fn max_failures_fires_across_a_block_only_when_every_attempt_failed_the_same_way() {
    let crash = json!([
        {"claude_init": {}},
        {"claude_result": {"text": "boom", "is_error": true}},
        {"exit": 1}
    ]);
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({ "default": crash }));
    let out = env.ralph(&["run", "--max-iter", "20", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["agent_error"; 3]);
    assert!(
        stderr(&out).contains("3 failed iterations in a row (--max-failures 3): agent_error ×3 across US-001 (blocked after failing every attempt the same way) and US-002; the last: boom"),
        "{}",
        text(&out)
    );

    // A timeout then a crash on US-001 (a hard story), then crashes: the block resets the
    // count, so US-002 gets its own 2 attempts and US-003 is reached.
    let env = TestEnv::new(&prd_with_stories(3));
    let hang = json!([{"claude_init": {}}, {"sleep_ms": 3_600_000}]);
    env.script(
        &json!({"invocations": [hang, crash.clone(), crash.clone(), crash.clone(), crash.clone()]}),
    );
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "5",
        "--max-attempts",
        "2",
        "--idle-timeout",
        "1s",
        "--max-no-progress",
        "10",
    ]);
    assert_eq!(
        outcomes(&env),
        [
            "stalled",
            "agent_error",
            "agent_error",
            "agent_error",
            "agent_error"
        ],
        "{}",
        text(&out)
    );
    let stories: Vec<String> = env
        .ledger()
        .iter()
        .map(|r| r["story_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(stories, ["US-001", "US-001", "US-002", "US-002", "US-003"]);
    assert!(
        stderr(&out).contains("3 failed iterations in a row (--max-failures 3): agent_error ×3 across US-002 (blocked after failing every attempt the same way) and US-003"),
        "{}",
        text(&out)
    );
    let _ = (Duration::ZERO, Instant::now());
}
