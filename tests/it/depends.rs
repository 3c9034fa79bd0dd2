//! Stories with `dependsOn` in `ralph run` (issue 20, scheduling): a story whose dependency is
//! blocked is never attempted and the summary says what it waits for; a dependency graph with an
//! unknown id, a self-dependency or a cycle is refused before any agent starts.

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// An iteration in which the agent fails (an error result, exit 1), touching nothing.
fn failing() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ])
}

/// An iteration that implements `id` (writes `<id>.txt`), marks it passing and commits.
fn story(id: &str) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": format!("{id}.txt"), "content": "done\n"}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"claude_result": {"text": "Implemented it."}}
    ])
}

/// `n` stories, with `deps[i]` as story i's `dependsOn`.
fn prd_with_deps(n: usize, deps: &[(usize, &[&str])]) -> Value {
    let mut prd = prd_with_stories(n);
    for (i, ids) in deps {
        prd["userStories"][*i]["dependsOn"] = json!(ids);
    }
    prd
}

fn stories_of(env: &TestEnv) -> Vec<String> {
    env.ledger()
        .iter()
        .map(|r| r["story_id"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn depends_a_story_waiting_for_a_blocked_one_is_never_attempted_and_the_summary_says_why() {
    // US-002 waits for US-001, US-004 for US-002 (so transitively for US-001); US-003 is free.
    let env = TestEnv::new(&prd_with_deps(4, &[(1, &["US-001"]), (3, &["US-002"])]));
    env.script(&json!({"invocations": [failing(), story("US-003")], "default": failing()}));
    let out = env.ralph(&["run", "--max-iter", "10", "--max-attempts", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // No agent ever ran for US-002 or US-004.
    assert_eq!(stories_of(&env), ["US-001", "US-003"], "{}", text(&out));
    assert_eq!(env.agent_calls(), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("every open story is blocked (US-001) or waits for one"),
        "{err}"
    );
    assert!(
        err.contains("check: not attempted: US-002, US-004 wait for US-001 (blocked)\n"),
        "{err}"
    );

    // A later run attempts nothing and says the same; with --max-iter left it is no budget
    // question, the dependency is.
    let out = env.ralph(&["run", "--max-iter", "10", "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(env.agent_calls(), 2, "{}", text(&out));
    let finished: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "run_finished")
        .unwrap_or_else(|| panic!("no run_finished line:\n{}", text(&out)));
    let caveats = finished["caveats"].as_array().cloned().unwrap_or_default();
    assert!(
        caveats.contains(&json!(
            "not attempted: US-002, US-004 wait for US-001 (blocked)"
        )),
        "{finished:#}"
    );

    // Unblocked, US-001 passes and its dependents run after it, in order.
    env.script(&json!({"invocations": [story("US-001"), story("US-002"), story("US-004")]}));
    // The fake counts its runs beside the script: this script starts at its first invocation.
    std::fs::remove_file(format!("{}.count", env.script.display())).expect("fake's counter");
    let out = env.ralph(&["run", "--max-iter", "10", "--unblock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        stories_of(&env),
        ["US-001", "US-003", "US-001", "US-002", "US-004"]
    );
}

#[test]
fn depends_a_story_whose_own_dependency_is_blocked_in_the_middle_names_the_nearest() {
    // US-001 passes; US-002 (waiting for it) gets blocked; US-003 waits for US-002.
    let mut prd = prd_with_deps(3, &[(1, &["US-001"]), (2, &["US-002"])]);
    prd["userStories"][0]["passes"] = json!(true);
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [failing(), failing()]}));
    let out = env.ralph(&["run", "--max-iter", "10", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(stories_of(&env), ["US-002", "US-002"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("check: not attempted: US-003 waits for US-002 (blocked)\n"),
        "{err}"
    );
}

/// Runs `ralph run` (with `extra` flags) on a prd.json whose graph is broken, asserts it is
/// refused with exit 1 (an invalid prd.json) before any agent starts, and returns stderr.
fn refused(prd: &Value, extra: &[&str]) -> String {
    let env = TestEnv::new(prd);
    env.script(&json!({"invocations": [story("US-001")]}));
    let mut args = vec!["run", "--max-iter", "5"];
    args.extend_from_slice(extra);
    let out = env.ralph(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(env.agent_calls(), 0, "an agent ran: {}", text(&out));
    assert!(env.ledger().is_empty(), "{}", text(&out));
    // Nothing was set up for the run either: no branch, no progress.txt.
    assert_eq!(env.git(&["branch", "--list", "ralph/demo"]), "");
    assert!(!env.path("progress.txt").exists());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains(&format!(
            "error: {} is not a valid PRD",
            env.path("prd.json").display()
        )),
        "{err}"
    );
    // One problem's hint is printed flush, several problems' indented: compared flush.
    err.lines()
        .map(|l| format!("{}\n", l.trim_start()))
        .collect()
}

#[test]
fn depends_an_unknown_dependency_refuses_the_run_before_any_agent() {
    let prd = prd_with_deps(3, &[(2, &["US-001", "US-009"])]);
    let err = refused(&prd, &[]);
    assert!(
        err.contains(
            "prd.json: $.userStories[2].dependsOn[1]: unknown story id \"US-009\"\nhint: use the \
             id of a story in this file (known ids: US-001, US-002, US-003)\n"
        ),
        "{err}"
    );
}

#[test]
fn depends_a_self_dependency_refuses_the_run_before_any_agent() {
    let prd = prd_with_deps(3, &[(1, &["US-002"])]);
    let err = refused(&prd, &["--parallel", "2"]);
    assert!(
        err.contains(
            "prd.json: $.userStories[1].dependsOn[0]: story \"US-002\" depends on itself\nhint: \
             remove \"US-002\" from its own dependsOn\n"
        ),
        "{err}"
    );
    assert!(!err.contains("cycle"), "{err}");
    // `ralph validate` says the same, at the same path.
    let env = TestEnv::new(&prd);
    let out = env.ralph(&["validate", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("validate --json");
    assert_eq!(
        report["violations"],
        json!([{
            "jsonPath": "$.userStories[1].dependsOn[0]",
            "message": "story \"US-002\" depends on itself",
            "hint": "remove \"US-002\" from its own dependsOn"
        }])
    );
}

#[test]
fn depends_a_cycle_refuses_the_run_before_any_agent() {
    // US-001 → US-003 → US-002 → US-001; US-004 is free but nothing starts.
    let prd = prd_with_deps(4, &[(0, &["US-003"]), (1, &["US-001"]), (2, &["US-002"])]);
    let err = refused(&prd, &[]);
    assert!(
        err.contains(
            "prd.json: $.userStories[0].dependsOn: dependency cycle: US-001 → US-003 → US-002 → \
             US-001\nhint: remove one of these dependsOn entries so the stories can run in some \
             order\n"
        ),
        "{err}"
    );
}

#[test]
fn depends_a_cycle_an_agent_writes_into_prd_json_is_put_back() {
    let env = TestEnv::new(&prd_with_stories(2));
    // The agent makes US-001 and US-002 wait for each other (and claims US-001).
    let mut broken = env.prd();
    broken["userStories"][0]["dependsOn"] = json!(["US-002"]);
    broken["userStories"][1]["dependsOn"] = json!(["US-001"]);
    broken["userStories"][0]["passes"] = json!(true);
    let content = serde_json::to_string_pretty(&broken).unwrap();
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"write_file": {"path": "prd.json", "content": content}},
         {"claude_result": {"text": "Reordered the stories."}}],
        story("US-001"),
        story("US-002"),
    ]}));
    let out = env.ralph(&["run", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stories_of(&env), ["US-001", "US-001", "US-002"]);
    let first = &env.ledger()[0];
    assert!(
        first["message"]
            .as_str()
            .is_some_and(|m| m.contains("dependency cycle: US-001 → US-002 → US-001")),
        "{first:#}"
    );
    // Put back as it was: no dependsOn left, both stories passing by their own iterations.
    let prd = env.prd();
    assert!(prd["userStories"][0].get("dependsOn").is_none(), "{prd:#}");
    assert!(prd["userStories"][1].get("dependsOn").is_none(), "{prd:#}");
}
