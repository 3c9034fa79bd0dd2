//! `ralph hint`: a note reaches the next iteration's prompt in its own block, survives a killed
//! ralph and a usage limit until an iteration that got to work is in the ledger, and `--story`
//! sends it to that story only.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// An iteration of the fake agent that saves its prompt to `../prompt-<n>.txt`, marks
/// `../started-<n>`, sleeps `sleep_ms`, then does story `id`.
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

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn prompt(env: &TestEnv, n: usize) -> String {
    std::fs::read_to_string(env.root.path().join(format!("prompt-{n}.txt"))).unwrap_or_default()
}

fn hint(env: &TestEnv, args: &[&str]) -> String {
    let mut all = vec!["hint"];
    all.extend_from_slice(args);
    let out = env.ralph(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const NOTE: &str = "Use the helper in src/util.rs, not a new one";

#[test]
fn a_hint_given_during_iteration_1_reaches_iteration_2_and_the_ledger_names_it() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [story("US-001", 1, 1500), story("US-002", 2, 0)]}));
    let child = env.ralph_spawn(&["run"]);
    wait_for(&env.root.path().join("started-1"), "iteration 1");
    let said = hint(&env, &[NOTE]);
    assert!(said.contains("hint 1 saved"), "{said}");
    // Pending, for `ralph status` and `--list`, until an iteration takes it.
    let status = env.ralph(&["status"]);
    assert!(
        text(&status).contains(&format!("pending hint 1: {NOTE}")),
        "{}",
        text(&status)
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", env.spawned_output());
    assert!(!prompt(&env, 1).contains(NOTE), "{}", prompt(&env, 1));
    let p2 = prompt(&env, 2);
    assert!(
        p2.contains("## From the user\n") && p2.contains(&format!("- {NOTE}")),
        "{p2}"
    );
    // Apart from ralph's own feedback.
    assert!(
        !p2.contains("## Feedback from the previous iteration"),
        "{p2}"
    );
    let ledger = env.ledger();
    assert!(ledger[0].get("hints").is_none(), "{}", ledger[0]);
    assert_eq!(ledger[1]["hints"], json!([{"id": 1, "text": NOTE}]));
    let list = hint(&env, &["--list"]);
    assert!(
        list.contains("delivered:") && list.contains("(iteration 2)") && !list.contains("pending:"),
        "{list}"
    );
    let status = env.ralph(&["status"]);
    assert!(!text(&status).contains("pending hint"), "{}", text(&status));
}

#[test]
fn a_hint_whose_iteration_was_killed_reaches_the_iteration_after_the_restart() {
    let env = TestEnv::new(&prd_with_stories(1));
    hint(&env, &[NOTE]);
    env.script(&json!({"invocations": [story("US-001", 1, 60_000), story("US-001", 2, 0)]}));
    let mut child = env.ralph_spawn(&["run"]);
    wait_for(&env.root.path().join("started-1"), "iteration 1");
    assert!(prompt(&env, 1).contains(NOTE));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    child.wait().unwrap();
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger[0]["outcome"], "interrupted", "{}", ledger[0]);
    assert_eq!(ledger[1]["outcome"], "story_passed", "{}", ledger[1]);
    assert!(prompt(&env, 2).contains(NOTE), "{}", prompt(&env, 2));
    assert_eq!(ledger[1]["hints"][0]["id"], 1);
    assert!(!hint(&env, &["--list"]).contains("pending:"));
}

#[test]
fn a_hint_whose_iteration_hit_a_usage_limit_reaches_the_iteration_after_the_wait() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"0s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    hint(&env, &[NOTE]);
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"save_stdin": "../prompt-1.txt"},
            {"claude_usage_limit": {"message": "You've hit your limit", "resets_in_s": 1}},
            {"exit": 1}
        ],
        story("US-001", 2, 0)
    ]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger[0]["outcome"], "usage_limit", "{}", ledger[0]);
    assert!(prompt(&env, 1).contains(NOTE));
    // Carried by both; delivered by the one that got to work.
    assert_eq!(ledger[0]["hints"][0]["id"], 1);
    assert_eq!(ledger[1]["hints"][0]["id"], 1);
    assert!(prompt(&env, 2).contains(NOTE), "{}", prompt(&env, 2));
    let list = hint(&env, &["--list"]);
    assert!(list.contains("(iteration 2)"), "{list}");
}

#[test]
fn a_hint_for_a_story_waits_for_that_storys_iteration_and_can_be_dropped() {
    let env = TestEnv::new(&prd_with_stories(3));
    let bad = env.ralph(&["hint", "--story", "US-999", "x"]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(
        text(&bad).contains("no story US-999") && text(&bad).contains("US-001, US-002, US-003"),
        "{}",
        text(&bad)
    );
    hint(
        &env,
        &["--story", "US-002", "US-002 needs the migration first"],
    );
    hint(&env, &["a note I take back"]);
    let dropped = hint(&env, &["--drop", "2"]);
    assert!(dropped.contains("dropped hint 2"), "{dropped}");
    let again = env.ralph(&["hint", "--drop", "2"]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    let list = hint(&env, &["--list"]);
    assert!(
        list.contains("1 [US-002]") && !list.contains("take back"),
        "{list}"
    );
    env.script(&json!({"invocations": [
        story("US-001", 1, 0), story("US-002", 2, 0), story("US-003", 3, 0)
    ]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let needle = "US-002 needs the migration first";
    assert!(!prompt(&env, 1).contains(needle));
    assert!(prompt(&env, 2).contains(needle), "{}", prompt(&env, 2));
    assert!(!prompt(&env, 3).contains(needle));
    assert!(!prompt(&env, 1).contains("take back"));
    let ledger = env.ledger();
    assert_eq!(
        ledger[1]["hints"],
        json!([{"id": 1, "text": needle, "story": "US-002"}])
    );
}

/// A hint for a story that already passes is kept, and `ralph hint` says that no iteration of it
/// runs unless the story is reopened.
#[test]
fn a_hint_for_a_story_that_already_passes_says_none_of_its_iterations_is_coming() {
    let mut prd = prd_with_stories(2);
    prd["userStories"][0]["passes"] = serde_json::json!(true);
    let env = TestEnv::new(&prd);
    let out = env.ralph(&["hint", "--story", "US-001", "use the helper"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("US-001 already passes") && said.contains("`passes` back to false"),
        "{said}"
    );
    let out = env.ralph(&["hint", "--story", "US-002", "mind the edge cases"]);
    assert!(!text(&out).contains("already passes"), "{}", text(&out));
}
