//! `ralph pause` / `ralph resume`: the running iteration finishes and is recorded, then the run
//! holds (lock kept, no new iteration, `--json` says `paused`); the user's edits made meanwhile
//! are the next iteration's starting point and not restored by the guard; `ralph stop` during a
//! pause ends the run with its usual exit code; a pause counts toward `--max-duration`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// The fake agent's iteration `n` of story `id`: saves its prompt to `../prompt-<n>.txt`, marks
/// `../started-<n>`, sleeps `sleep_ms`, then does the story.
fn story(id: &str, n: usize, sleep_ms: u64) -> Value {
    json!([
        {"claude_init": {}},
        {"save_stdin": format!("../prompt-{n}.txt")},
        {"write_file": {"path": format!("../started-{n}"), "content": "x\n"}},
        {"sleep_ms": sleep_ms},
        {"write_file": {"path": format!("file-{n}.txt"), "content": "x\n"}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"claude_result": {"text": "done"}}
    ])
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn exists(env: &TestEnv, name: &str) -> bool {
    Path::new(&env.root.path().join(name)).exists()
}

/// Starts `ralph run --json`, pauses it during iteration 1 and waits until it says it is paused.
fn paused_run(env: &TestEnv, args: &[&str]) -> std::process::Child {
    let mut all = vec!["run", "--json"];
    all.extend_from_slice(args);
    let child = env.ralph_spawn(&all);
    wait_until("iteration 1", || exists(env, "started-1"));
    let out = env.ralph(&["pause"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("to pause after its current iteration (1, US-001)"),
        "{}",
        text(&out)
    );
    wait_until("the paused event", || {
        env.spawned_output().contains(r#""event":"paused""#)
    });
    child
}

#[test]
fn a_pause_holds_after_the_iteration_and_the_users_edits_are_the_next_start() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        story("US-001", 1, 1500), story("US-002", 2, 0), story("US-003", 3, 0)
    ]}));
    let mut child = paused_run(&env, &[]);
    // Iteration 1 is recorded; nothing new starts while paused, and the run keeps its lock.
    assert_eq!(env.ledger().len(), 1);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !exists(&env, "started-2"),
        "an iteration started while paused"
    );
    assert!(child.try_wait().unwrap().is_none(), "the run ended");
    let status = env.ralph(&["status"]);
    assert!(
        text(&status).contains("paused: no new iteration starts"),
        "{}",
        text(&status)
    );
    let again = env.ralph(&["run"]);
    assert_ne!(
        again.status.code(),
        Some(0),
        "a second run got in: {}",
        text(&again)
    );

    // The user's edits during the pause: a criterion rewritten, a story added, a progress note.
    let mut prd = env.prd();
    prd["userStories"][1]["acceptanceCriteria"] = json!(["the user's own criterion"]);
    let mut extra = prd["userStories"][2].clone();
    extra["id"] = json!("US-004");
    extra["priority"] = json!(4);
    prd["userStories"].as_array_mut().unwrap().push(extra);
    env.write(
        "prd.json",
        &(serde_json::to_string_pretty(&prd).unwrap() + "\n"),
    );
    let progress = env.read("progress.txt") + "\nA note from the user during the pause.\n";
    env.write("progress.txt", &progress);

    env.script(&json!({"invocations": [
        story("US-001", 1, 1500), story("US-002", 2, 0), story("US-003", 3, 0), story("US-004", 4, 0)
    ]}));
    let out = env.ralph(&["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("resumed"), "{}", text(&out));
    let status = child.wait().unwrap();
    let output = env.spawned_output();
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains(r#""event":"resumed""#), "{output}");
    // The next iteration started from the user's prd.json; the guard kept it.
    assert!(
        std::fs::read_to_string(env.root.path().join("prompt-2.txt"))
            .unwrap()
            .contains("the user's own criterion")
    );
    let prd = env.prd();
    assert_eq!(
        prd["userStories"][1]["acceptanceCriteria"],
        json!(["the user's own criterion"])
    );
    assert_eq!(prd["userStories"][3]["passes"], true, "{prd}");
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 4);
    for r in &ledger {
        assert_eq!(r["outcome"], "story_passed", "{r}");
        assert!(
            r.get("findings").is_none(),
            "the guard blamed the agent: {r}"
        );
        assert!(r.get("criteria_proposals").is_none(), "{r}");
    }
    assert!(env
        .read("progress.txt")
        .contains("A note from the user during the pause."));
    assert!(!env.path(".ralph/pause").exists());
}

#[test]
fn ralph_stop_during_a_pause_ends_the_run_with_its_usual_exit_code() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [story("US-001", 1, 1000), story("US-002", 2, 0)]}));
    let mut child = paused_run(&env, &[]);
    let stop = env.ralph(&["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let status = child.wait().unwrap();
    let output = env.spawned_output();
    assert_eq!(status.code(), Some(4), "{output}");
    assert!(output.contains("stop_requested"), "{output}");
    assert_eq!(env.ledger().len(), 1);
    assert!(!exists(&env, "started-2"));
    assert!(!env.path(".ralph/pause").exists());
    assert!(!env.path(".ralph/stop").exists());
    // Nothing to pause or resume once the run is gone.
    assert_eq!(env.ralph(&["pause"]).status.code(), Some(1));
    assert_eq!(env.ralph(&["resume"]).status.code(), Some(1));
}

/// docs/decisions.md: a pause counts toward `--max-duration`; the run ends when it runs out.
#[test]
fn a_pause_counts_toward_max_duration() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [story("US-001", 1, 500), story("US-002", 2, 0)]}));
    let started = Instant::now();
    let mut child = paused_run(&env, &["--max-duration", "4s"]);
    let status = child.wait().unwrap();
    let output = env.spawned_output();
    assert!(started.elapsed() < Duration::from_secs(30), "{output}");
    assert_ne!(status.code(), Some(0), "{output}");
    assert!(
        output.contains(r#""stop_reason":{"kind":"max_duration""#)
            || output.contains("max_duration"),
        "{output}"
    );
    assert_eq!(env.ledger().len(), 1);
    assert!(!exists(&env, "started-2"));
}

/// A pause asked during a usage-limit wait: the wait runs to its reset, then the run holds; after
/// `ralph resume` the story runs again at once (the wait is neither cut short nor done twice).
#[test]
fn a_usage_limit_wait_during_a_pause_is_not_lost() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"0s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"claude_usage_limit": {"message": "You've hit your limit", "resets_in_s": 3}},
            {"exit": 1}
        ],
        story("US-001", 2, 0)
    ]}));
    let mut child = env.ralph_spawn(&["run", "--json"]);
    wait_until("the usage-limit wait", || {
        env.spawned_output().contains(r#""event":"waiting""#)
    });
    // The end of the wait, as the run announced it (the margin is 0 s: the agent's reset).
    let resets_at = env
        .spawned_output()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "waiting")
        .and_then(|e| e["until"].as_str().map(str::to_owned))
        .map(|u| {
            chrono::DateTime::parse_from_rfc3339(&u)
                .expect("rfc3339")
                .timestamp()
        })
        .expect("the waiting event names its end");
    let out = env.ralph(&["pause"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_until("the paused event", || {
        env.spawned_output().contains(r#""event":"paused""#)
    });
    // Held only once the reset passed; and still held after it.
    assert!(
        chrono::Utc::now().timestamp() >= resets_at,
        "the wait was cut short"
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        !exists(&env, "started-2"),
        "an iteration started while paused"
    );
    let resumed = Instant::now();
    assert_eq!(env.ralph(&["resume"]).status.code(), Some(0));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", env.spawned_output());
    assert!(resumed.elapsed() < Duration::from_secs(20));
    let outcomes: Vec<Value> = env.ledger().iter().map(|r| r["outcome"].clone()).collect();
    assert_eq!(outcomes, [json!("usage_limit"), json!("story_passed")]);
    // Only one wait was announced.
    assert_eq!(
        env.spawned_output().matches(r#""event":"waiting""#).count(),
        1,
        "{}",
        env.spawned_output()
    );
}

/// A pause asked during the run's last iteration (`--max-iter 1`, or the last story) does not
/// hold a run that is about to end: it ends with its usual exit code and lets go of its lock.
#[test]
fn a_pause_during_the_last_iteration_lets_the_run_end() {
    for (stories, args, code) in [(2, vec!["--max-iter", "1"], 3), (1, vec![], 0)] {
        let env = TestEnv::new(&prd_with_stories(stories));
        env.script(&json!({"invocations": [story("US-001", 1, 1500)]}));
        let mut all = vec!["run", "--json"];
        all.extend_from_slice(&args);
        let mut child = env.ralph_spawn(&all);
        wait_until("iteration 1", || exists(&env, "started-1"));
        let out = env.ralph(&["pause"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let (exit, _) = crate::common::wait_exit(&env, &mut child, Duration::from_secs(60));
        assert_eq!(exit, code, "{args:?}: {}", env.spawned_output());
        assert!(
            !env.spawned_output().contains(r#""event":"paused""#),
            "{}",
            env.spawned_output()
        );
        // The lock is free: another run starts (and finds nothing more to do or its limit).
        let again = env.ralph(&["status"]);
        assert!(
            !text(&again).contains("paused: no new iteration"),
            "{}",
            text(&again)
        );
    }
}
