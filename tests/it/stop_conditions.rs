//! Issue 5's budgets and guards, through `ralph run` with the fake agent: a story blocked after
//! its attempts (case 24), the cost limit (case 25), consecutive failures, iterations that change
//! nothing, `ralph stop`, the prd.json guard's restore policy, and resuming from git alone.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::run_cases::{claude_story, outcomes};

/// An iteration that fails: the agent reports an error and exits 1, touching nothing.
fn failing() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ])
}

/// An iteration that changes nothing and ends normally.
fn idle() -> Value {
    json!([{"claude_init": {}}, {"claude_result": {"text": "Looked around; nothing to do."}}])
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn case_24_a_story_that_fails_three_times_is_blocked_and_the_loop_moves_on() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        failing(), failing(), failing(),
        claude_story("US-002", 2, "done")
    ]}));
    let out = env.ralph(&["run", "--max-iter", "10"]);
    // US-001 is blocked, US-002 passes: nothing more can be done.
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["agent_error", "agent_error", "agent_error", "story_passed"]
    );
    let ledger = env.ledger();
    assert_eq!(ledger[3]["story_id"], "US-002");
    let err = stderr(&out);
    assert!(err.contains("US-001 is blocked after 3 attempts"), "{err}");
    assert!(
        err.contains("every open story is blocked (US-001)"),
        "{err}"
    );
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["blocked"], json!(["US-001"]));

    // A later run does not touch the blocked story; --unblock gives it another chance.
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(env.agent_calls(), 4);
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--unblock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `--unblock` is kept in git (the `Ralph-Unblocked` trailer of the next checkpoint): with
/// `.ralph/` lost afterwards, the attempts rebuilt from the trailers start from the unblock, so
/// the story is not blocked again by the attempts it had before.
#[test]
fn an_unblock_survives_a_lost_ralph_dir() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [failing(), failing(), failing(), failing()]}));
    let out = env.ralph(&["run", "--max-iter", "10"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(env.agent_calls(), 3);
    let out = env.ralph(&["run", "--max-iter", "1", "--unblock"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.agent_calls(), 4);
    let message = env.git(&["log", "-1", "--format=%B"]);
    assert!(message.contains("Ralph-Unblocked: US-001"), "{message}");
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert!(
        state.get("unblocked").is_none(),
        "recorded, so cleared: {state}"
    );

    // .ralph/ is lost: from git, US-001 has 1 attempt since the unblock, not 4.
    std::fs::remove_dir_all(env.path(".ralph")).unwrap();
    let status: Value = serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["stories"][0]["attempts"], 1, "{status}");
    assert_eq!(status["stories"][0]["blocked"], false, "{status}");
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn case_25_the_cost_limit_stops_after_the_iteration_that_crossed_it_is_committed() {
    let env = TestEnv::new(&prd_with_stories(3));
    let story = |id: &str, n: usize| {
        json!([
            {"claude_init": {}},
            {"write_file": {"path": format!("file-{n}.txt"), "content": "x\n"}},
            {"set_passes": {"id": id, "passes": true}},
            {"claude_result": {"text": "done", "cost_usd": 0.30}}
        ])
    };
    env.script(
        &json!({"invocations": [story("US-001", 1), story("US-002", 2), story("US-003", 3)]}),
    );
    let out = env.ralph(&["run", "--max-cost", "0.50"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["story_passed", "story_passed"]);
    assert!(
        stderr(&out).contains("reached --max-cost $0.50"),
        "{}",
        text(&out)
    );
    // Iteration 2's work is in a ralph commit and prd.json records its story as passing.
    let log = env.git(&["log", "--format=%s", "--", "file-2.txt"]);
    assert!(log.contains("ralph: iteration 2"), "{log}");
    let prd: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(prd["userStories"][1]["passes"], true);
    assert!(env.git(&["status", "--porcelain"]).trim().is_empty());
}

#[test]
fn consecutive_failures_across_stories_stop_the_run_with_the_reason() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"default": failing()}));
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "10",
        "--max-attempts",
        "10",
        "--max-failures",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["agent_error", "agent_error"]);
    assert!(
        stderr(&out).contains("2 failed iterations in a row (--max-failures 2)"),
        "{}",
        text(&out)
    );
}

#[test]
fn iterations_that_change_nothing_stop_the_run() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"default": idle()}));
    let out = env.ralph(&["run", "--max-iter", "10", "--max-attempts", "10"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["no_progress", "no_progress", "no_progress"]
    );
    assert!(
        stderr(&out).contains("3 iterations in a row changed nothing"),
        "{}",
        text(&out)
    );
}

/// With the default limits (3 attempts, 3 unchanged in a row), an agent that changes nothing
/// gets its first story blocked, and the next story's first unchanged iteration ends the run: it
/// does not spend 3 iterations on every story of the PRD.
#[test]
fn an_agent_that_changes_nothing_stops_the_run_across_stories_with_default_limits() {
    let env = TestEnv::new(&prd_with_stories(4));
    env.script(&json!({"default": idle()}));
    let out = env.ralph(&["run", "--max-iter", "20"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["no_progress"; 4]);
    let err = stderr(&out);
    assert!(err.contains("US-001 is blocked after 3 attempts"), "{err}");
    assert!(
        err.contains("4 iterations in a row changed nothing"),
        "{err}"
    );
}

/// An agent that only writes notes (its story's `notes` in prd.json, a line in progress.txt)
/// changes no work: each iteration is no_progress, and the no-progress limit stops the run.
#[test]
fn iterations_that_only_write_notes_stop_the_run_like_ones_that_change_nothing() {
    let env = TestEnv::new(&prd_with_stories(1));
    let notes_only = |n: usize| {
        let mut prd = prd_with_stories(1);
        prd["userStories"][0]["notes"] = json!(format!("attempt {n}: still stuck on the parser"));
        json!([
            {"claude_init": {}},
            {"write_file": {"path": "prd.json",
                            "content": serde_json::to_string_pretty(&prd).unwrap() + "\n"}},
            {"append_file": {"path": "progress.txt", "content": format!("attempt {n}: stuck\n")}},
            {"claude_result": {"text": "Wrote down where I am."}}
        ])
    };
    env.script(&json!({"invocations": [notes_only(1), notes_only(2), notes_only(3)]}));
    let out = env.ralph(&["run", "--max-iter", "10", "--max-attempts", "10"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["no_progress", "no_progress", "no_progress"]
    );
    // The notes are still kept: committed with the iteration, not thrown away.
    let prd: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(
        prd["userStories"][0]["notes"],
        "attempt 3: still stuck on the parser"
    );
}

#[test]
fn ralph_stop_finishes_the_current_iteration_then_stops() {
    let env = TestEnv::new(&prd_with_stories(3));
    let slow = |id: &str, n: usize| {
        json!([
            {"claude_init": {}},
            {"write_file": {"path": format!("started-{n}.txt"), "content": "x\n"}},
            {"sleep_ms": 1500},
            {"write_file": {"path": format!("file-{n}.txt"), "content": "x\n"}},
            {"set_passes": {"id": id, "passes": true}},
            {"claude_result": {"text": "done"}}
        ])
    };
    env.script(&json!({"invocations": [slow("US-001", 1), slow("US-002", 2), slow("US-003", 3)]}));
    let child = env
        .ralph_cmd(&["run"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.path("started-1.txt").exists() {
        assert!(Instant::now() < deadline, "the agent never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stop = env.ralph(&["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stdout)
            .contains("to stop after its current iteration (iteration 1, US-001)"),
        "{}",
        text(&stop)
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // The iteration in progress was finished and recorded, not cut short.
    assert_eq!(outcomes(&env), ["story_passed"]);
    assert!(env.path("file-1.txt").exists());
    assert!(!env.path("started-2.txt").exists());
    assert!(
        stderr(&out).contains("stopped by `ralph stop`"),
        "{}",
        text(&out)
    );
    assert!(!env.path(".ralph/stop").exists(), "the request is consumed");

    // With no run active, `ralph stop` says so and leaves nothing behind.
    let idle = env.ralph(&["stop"]);
    assert_eq!(idle.status.code(), Some(1), "{}", text(&idle));
    assert!(
        stderr(&idle).contains("no `ralph run` is active"),
        "{}",
        text(&idle)
    );
    assert!(!env.path(".ralph/stop").exists());
}

#[test]
fn prd_guard_restore_puts_back_everything_but_the_current_storys_passes_and_notes() {
    let env = TestEnv::new(&prd_with_stories(2));
    let before = env.read("prd.json");
    // The agent does its story, but also retitles US-002, marks it passing and renames the
    // project: all reported; with restore, all put back.
    let edited = {
        let mut prd: Value = serde_json::from_str(&before).unwrap();
        prd["project"] = json!("Renamed");
        prd["userStories"][0]["passes"] = json!(true);
        prd["userStories"][0]["notes"] = json!("done via file-1.txt");
        prd["userStories"][1]["title"] = json!("Something else");
        prd["userStories"][1]["passes"] = json!(true);
        serde_json::to_string_pretty(&prd).unwrap() + "\n"
    };
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "file-1.txt", "content": "x\n"}},
        {"write_file": {"path": "prd.json", "content": edited}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--prd-guard", "restore"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let rec = &env.ledger()[0];
    assert_eq!(rec["outcome"], "story_passed");
    let message = rec["message"].as_str().unwrap();
    for part in [
        "passes set to true on US-002",
        "prd.json fields changed: project",
        "US-002 edited (title)",
        "prd_guard = restore",
    ] {
        assert!(message.contains(part), "{part} missing in: {message}");
    }
    // Only the current story's passes and notes differ from the file before the iteration.
    let mut expected: Value = serde_json::from_str(&before).unwrap();
    expected["userStories"][0]["passes"] = json!(true);
    expected["userStories"][0]["notes"] = json!("done via file-1.txt");
    let after: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(after, expected);
    let expected_bytes = before
        .replacen("\"passes\": false", "\"passes\": true", 1)
        .replacen("\"notes\": \"\"", "\"notes\": \"done via file-1.txt\"", 1);
    assert_eq!(
        env.read("prd.json"),
        expected_bytes,
        "byte for byte, apart from those fields"
    );

    // The default policy reports the same changes and keeps them.
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "prd.json", "content": edited}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert!(
        stderr(&out).contains("US-002 edited (title)"),
        "{}",
        text(&out)
    );
    let after: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(after["project"], "Renamed");
}

/// The acceptance test: delete `.ralph/` after a 3-iteration run; `ralph status` still reports
/// the iterations and the per-story attempts from git, and `ralph run` continues the numbering.
#[test]
fn status_and_numbering_survive_a_deleted_ralph_dir() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        failing(),
        claude_story("US-001", 1, "done 1"),
        claude_story("US-002", 2, "done 2"),
        claude_story("US-003", 3, "done 3")
    ]}));
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    std::fs::remove_dir_all(env.path(".ralph")).unwrap();

    let status = env.ralph(&["status", "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["source"], "git");
    assert_eq!(doc["total_iterations"], 3);
    let attempts: Vec<(String, u64)> = doc["stories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["attempts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("US-001".into(), 2),
            ("US-002".into(), 1),
            ("US-003".into(), 0)
        ]
    );
    let human = env.ralph(&["status"]);
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(stdout.contains("from git history"), "{stdout}");
    assert!(
        stdout.contains("agent_error") && stdout.contains("story_passed"),
        "{stdout}"
    );

    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(
        ledger.last().unwrap()["iteration"],
        4,
        "numbering continues from git"
    );
    assert!(
        stderr(&out).contains("rebuilt from git history (3 iterations"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_iteration_cut_short_by_max_duration_says_so() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"default": [{"claude_init": {}}, {"sleep_ms": 30_000}]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-duration", "2s"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        t.elapsed() < Duration::from_secs(25),
        "the iteration was not cut at the run's limit"
    );
    let rec = &env.ledger()[0];
    assert_eq!(rec["outcome"], "timeout");
    let message = rec["message"].as_str().unwrap();
    assert!(message.contains("reached --max-duration 2s"), "{message}");
}

#[test]
fn stop_on_block_ends_the_run_at_the_first_blocked_story() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [failing(), failing(), claude_story("US-002", 2, "done")]}));
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "10",
        "--max-attempts",
        "2",
        "--stop-on-block",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // US-002 never ran: the block ended the run.
    assert_eq!(outcomes(&env), ["agent_error", "agent_error"]);
    let err = stderr(&out);
    assert!(
        err.contains("why: stopped: US-001 is blocked after 2 attempts"),
        "{err}"
    );
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["stop_reason"]["kind"], "story_blocked");
    assert_eq!(state["blocked"], json!(["US-001"]));
}

/// A story whose attempts in earlier runs already reach a lower `--max-attempts` is blocked
/// when the next run starts, and the run says so (it was blocked silently: the run then said
/// only "every open story is blocked").
#[test]
fn a_story_blocked_at_start_by_its_earlier_attempts_is_named_with_the_way_out() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [failing(), failing()]}));
    let out = env.ralph(&["run", "--max-iter", "2", "--max-attempts", "5"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = env.ralph(&["run", "--max-iter", "1", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "story blocked: US-001 used its 2 attempts in earlier runs (--max-attempts 2)"
        ) && err.contains("`ralph run --unblock` gives it new ones"),
        "{err}"
    );
    assert_eq!(env.agent_calls(), 2, "no agent runs for the blocked story");
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["blocked"], json!(["US-001"]));
}
