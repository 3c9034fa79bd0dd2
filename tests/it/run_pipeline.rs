//! Behaviour the pipeline restructuring fixed, each found by trying ralph as a new user would:
//! feedback that leaked into another story's prompt, attempts that carried over into a new
//! feature, a verify failure recorded nowhere but the next prompt, counters that showed unknown
//! as zero, a duplicated `--quiet` warning, `ralph status` during a run, file modes changed by
//! rewrites, and the typed stop reason on every output.

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::run_cases::{claude_story, outcomes};

/// A prd.json whose stories have a `verify` that passes only when `file-<n>.txt` exists.
fn prd_with_checks(n: usize) -> Value {
    let mut prd = prd_with_stories(n);
    for (i, s) in prd["userStories"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        s["verify"] = json!(format!(
            "test -f file-{0}.txt || {{ echo 'check output: file-{0}.txt is missing'; exit 3; }}",
            i + 1
        ));
    }
    prd
}

/// An iteration that marks `id` passing without doing the work (its verify fails), saving the
/// prompt it got in `../prompt-<n>.txt`.
fn false_claim(id: &str, n: usize) -> Value {
    json!([
        {"save_stdin": format!("../prompt-{n}.txt")},
        {"claude_init": {}},
        {"set_passes": {"id": id, "passes": true}},
        {"claude_result": {"text": "done"}}
    ])
}

fn prompt(env: &TestEnv, n: usize) -> String {
    env.read(&format!("../prompt-{n}.txt"))
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(env: &TestEnv, rel: &str) -> u32 {
    std::fs::metadata(env.path(rel))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn set_mode(env: &TestEnv, rel: &str, mode: u32) {
    std::fs::set_permissions(env.path(rel), std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn feedback_about_a_story_reaches_only_that_storys_next_attempt() {
    let env = TestEnv::new(&prd_with_checks(2));
    env.script(&json!({"invocations": [
        false_claim("US-001", 1),
        false_claim("US-001", 2),
        [{"save_stdin": "../prompt-3.txt"}, {"claude_init": {}},
         {"write_file": {"path": "file-2.txt", "content": "ok\n"}},
         {"set_passes": {"id": "US-002", "passes": true}}, {"claude_result": {"text": "done"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "3", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["verify_failed", "verify_failed", "story_passed"]
    );
    // US-001's second attempt is told why its first failed...
    assert!(
        prompt(&env, 2).contains("ralph ran the check for US-001"),
        "{}",
        prompt(&env, 2)
    );
    // ...but US-002's prompt, after US-001 was blocked, says nothing about US-001's check.
    let third = prompt(&env, 3);
    assert!(third.contains("Story ID: US-002"), "{third}");
    assert!(
        !third.contains("ralph ran the check for US-001")
            && !third.contains("## Feedback from the previous iteration"),
        "feedback leaked into another story's prompt:\n{third}"
    );
}

#[test]
fn attempts_and_blocks_belong_to_the_feature_they_were_earned_in() {
    let env = TestEnv::new(&prd_with_stories(1));
    let failing = json!([
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ]);
    env.script(&json!({"default": failing}));
    let out = env.ralph(&["run", "--max-iter", "5", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["blocked"], json!(["US-001"]));

    // The next feature reuses the story id US-001.
    let mut next = prd_with_stories(1);
    next["branchName"] = json!("ralph/next-feature");
    next["userStories"][0]["title"] = json!("A different story");
    env.write(
        "prd.json",
        &format!("{}\n", serde_json::to_string_pretty(&next).unwrap()),
    );
    env.git(&["commit", "-qam", "next feature"]);
    let out = env.ralph(&["run", "--max-iter", "1", "--max-attempts", "2"]);
    // It runs (not "every open story is blocked") and is not blocked after one attempt.
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["attempts"]["US-001"], 1, "{state}");
    assert_eq!(state["blocked"], json!([]), "{state}");
    assert_eq!(state["feature"], "ralph/next-feature");
    assert!(stderr(&out).contains("no longer count"), "{}", stderr(&out));
}

#[test]
fn why_a_verify_failed_is_in_the_ledger_the_outcome_line_and_status() {
    let env = TestEnv::new(&prd_with_checks(1));
    env.script(&json!({"default": false_claim("US-001", 1)}));
    let out = env.ralph(&["run", "--max-iter", "5", "--max-attempts", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let ledger = env.ledger();
    // The iteration that blocked the story keeps it too.
    for rec in &ledger {
        let v = &rec["verify"][0];
        assert_eq!(v["passed"], false, "{rec}");
        assert_eq!(v["result"], "exited with code 3");
        assert!(
            v["output_tail"]
                .as_str()
                .unwrap()
                .contains("check output: file-1.txt is missing"),
            "{rec}"
        );
    }
    let err = stderr(&out);
    assert!(
        err.contains("│ check output: file-1.txt is missing"),
        "the outcome line does not show the check's output:\n{err}"
    );
    let status = env.ralph(&["status"]);
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains("US-001 last ended verify_failed")
            && shown.contains("check output: file-1.txt is missing"),
        "{shown}"
    );
    let doc: Value = serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        doc["stories"][0]["last_failure"]["outcome"], "verify_failed",
        "{doc}"
    );
}

#[test]
fn quiet_mode_reports_a_verify_failure_once() {
    let env = TestEnv::new(&prd_with_checks(1));
    env.script(&json!({"invocations": [false_claim("US-001", 1)]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--quiet"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("verify failed for US-001").count(), 1, "{err}");
}

#[test]
fn unknown_counts_are_not_shown_as_zero() {
    let env = TestEnv::new(&prd_with_stories(1));
    // An exec agent that reports neither tokens nor cost and changes nothing.
    env.script(&json!({"invocations": [[{"stdout": "looked around"}]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude",
        "--max-iter",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(outcomes(&env), ["no_progress"]);
    // ralph's own checkpoint commit is not the agent's.
    assert!(err.contains("no_progress · 0s · 0 commits"), "{err}");
    assert!(!err.contains("$0.00"), "{err}");
    assert!(!err.contains("0 tokens"), "{err}");
    assert!(err.contains("not reported by the agent"), "{err}");
    let status = String::from_utf8_lossy(&env.ralph(&["status"]).stdout).into_owned();
    assert!(!status.contains("0 tokens"), "{status}");
    assert!(status.contains("tokens not reported"), "{status}");
}

#[test]
fn status_during_the_first_iteration_does_not_say_no_runs_yet() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"claude_init": {}}, {"write_file": {"path": "started", "content": ""}}, {"sleep_ms": 20_000}]]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.path("started").exists() {
        assert!(Instant::now() < deadline, "agent never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = env.ralph(&["status"]);
    let shown = String::from_utf8_lossy(&status.stdout).into_owned();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = child.wait();
    assert!(shown.contains("running: iteration 1 (US-001)"), "{shown}");
    assert!(!shown.contains("no runs yet"), "{shown}");
}

#[test]
fn rewrites_keep_the_mode_of_prd_json_and_progress_txt() {
    // The verify gate's rewrite and the guard's restore.
    let env = TestEnv::new(&prd_with_checks(2));
    set_mode(&env, "prd.json", 0o640);
    env.script(&json!({"invocations": [false_claim("US-001", 1)]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--prd-guard", "restore"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["verify_failed"]);
    assert_eq!(mode(&env, "prd.json"), 0o640);
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "file-1.txt", "content": "ok\n"}},
        {"write_file": {"path": "file-2.txt", "content": "ok\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"set_passes": {"id": "US-002", "passes": true}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--prd-guard", "restore"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        env.ledger()[1]["message"]
            .as_str()
            .unwrap()
            .contains("prd_guard = restore"),
        "{}",
        text(&out)
    );
    assert_eq!(mode(&env, "prd.json"), 0o640);

    // progress.txt reset by the archive of a finished feature.
    set_mode(&env, "progress.txt", 0o640);
    let mut next = prd_with_stories(1);
    next["branchName"] = json!("ralph/next");
    env.write(
        "prd.json",
        &format!("{}\n", serde_json::to_string_pretty(&next).unwrap()),
    );
    set_mode(&env, "prd.json", 0o640);
    env.git(&["commit", "-qam", "next feature"]);
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("archived branch ralph/demo"),
        "{}",
        text(&out)
    );
    assert_eq!(mode(&env, "progress.txt"), 0o640);
    assert_eq!(mode(&env, "prd.json"), 0o640);
}

#[test]
fn the_stop_reason_is_typed_in_json_state_and_status() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let last: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap();
    assert_eq!(last["event"], "run_finished");
    assert_eq!(last["stop_reason"]["kind"], "max_iterations");
    assert_eq!(last["stop_reason"]["open"], json!(["US-002"]));
    assert_eq!(last["exit_code"], 3);
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["stop_reason"]["kind"], "max_iterations");
    let doc: Value = serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(doc["stop_reason"]["kind"], "max_iterations");
}

#[test]
fn every_json_line_of_a_run_matches_the_committed_schema() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/run-events.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let env = TestEnv::new(&prd_with_checks(2));
    env.script(&json!({"invocations": [
        false_claim("US-001", 1),
        [{"claude_init": {}}, {"claude_tool": {"name": "Bash", "input": {"command": "ls"}, "result": "x"}},
         {"write_file": {"path": "file-1.txt", "content": "ok\n"}},
         {"set_passes": {"id": "US-001", "passes": true}}, {"claude_result": {"text": "done"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2", "--json", "--verbose"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let mut names = std::collections::BTreeSet::new();
    // Every line of an iteration names it (`iteration`), so that a reader of a `--parallel`
    // run can tell overlapping iterations apart: here 1, then 2.
    let mut current = None;
    let mut scoped = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&event)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{line}\n{errors:#?}");
        let name = event["event"].as_str().unwrap().to_owned();
        if name == "iteration_started" {
            current = event["iteration"].as_u64();
        }
        if [
            "iteration_started",
            "agent_command",
            "agent_event",
            "verify_started",
            "verify_finished",
            "iteration_finished",
        ]
        .contains(&name.as_str())
        {
            assert!(current.is_some(), "{line}");
            assert_eq!(event["iteration"].as_u64(), current, "{line}");
            scoped += 1;
        }
        if name == "iteration_finished" {
            assert_eq!(event["record"]["iteration"].as_u64(), current, "{line}");
        }
        names.insert(name);
    }
    assert!(scoped > 8, "{scoped} iteration-scoped lines");
    assert_eq!(current, Some(2));
    for name in [
        "run_started",
        "iteration_started",
        "agent_command",
        "agent_event",
        "verify_started",
        "verify_finished",
        "iteration_finished",
        "run_finished",
    ] {
        assert!(names.contains(name), "no {name} event in {names:?}");
    }
}

#[test]
fn commits_the_agent_throws_away_are_pinned_and_recorded() {
    let env = TestEnv::new(&prd_with_stories(1));
    // An agent that commits twice, then resets both commits away.
    let agent = env.root.path().join("agent.sh");
    std::fs::write(
        &agent,
        "#!/bin/sh\ncat >/dev/null\n\
         echo one > one.txt && git add one.txt && git commit -qm 'agent: one'\n\
         echo two > two.txt && git add two.txt && git commit -qm 'agent: two'\n\
         git reset -q --hard HEAD~2\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent_cmd = agent.display().to_string();
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent_cmd,
        "--max-iter",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let rec = &env.ledger()[0];
    let lost: Vec<String> = rec["lost_commits"]
        .as_array()
        .unwrap_or_else(|| panic!("no lost_commits in {rec}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(lost.len(), 2, "{rec}");
    let refs = env.git(&[
        "for-each-ref",
        "--format=%(refname) %(objectname)",
        "refs/ralph/",
    ]);
    for sha in &lost {
        assert!(
            refs.lines()
                .any(|l| l.contains("/1/lost-") && l.ends_with(sha.as_str())),
            "{sha} is not pinned:\n{refs}"
        );
        let subject = env.git(&["log", "-1", "--format=%s", sha]);
        assert!(subject.starts_with("agent: "), "{subject}");
    }
    assert!(
        stderr(&out).contains("on no branch any more"),
        "{}",
        stderr(&out)
    );
}
