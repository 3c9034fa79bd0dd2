//! `ralph run` end to end with the scripted fake agent: the field cases of shared/cases.md that
//! belong to the loop (1–10, 17, 19, 22, 23, 26–28), plus Ctrl-C and the git trailers.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{group_has_live_members, prd_with_stories, text, TestEnv};

const PROMISE: &str = "<promise>COMPLETE</promise>";

/// One claude-dialect invocation that implements `id`: writes a file, flips passes, commits, and
/// ends with `final_text`.
pub(crate) fn claude_story(id: &str, n: usize, final_text: &str) -> Value {
    json!([
        {"claude_init": {}},
        {"claude_tool": {"name": "Write", "input": {"file_path": format!("file-{n}.txt")}}},
        {"write_file": {"path": format!("file-{n}.txt"), "content": format!("story {n}\n")}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"claude_result": {"text": final_text, "is_error": false, "cost_usd": 0.01}}
    ])
}

pub(crate) fn outcomes(env: &TestEnv) -> Vec<String> {
    env.ledger()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn stdin_of(env: &TestEnv, n: usize) -> String {
    env.read(&format!("../stdin-{n}.txt"))
}

#[test]
fn full_run_passes_every_story_commits_with_trailers_and_logs_progress() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        claude_story("US-001", 1, "Implemented US-001."),
        claude_story("US-002", 2, &format!("Implemented US-002.\n{PROMISE}")),
    ]}));
    let out = env.ralph(&["run", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["story_passed", "story_passed"]);
    let ledger = env.ledger();
    assert_eq!(ledger[0]["iteration"], 1);
    assert_eq!(ledger[1]["iteration"], 2);
    assert_eq!(ledger[1]["promise_seen"], true);
    assert_eq!(ledger[0]["passes_flipped"], json!(["US-001"]));
    assert!((ledger[0]["cost_usd"].as_f64().unwrap() - 0.01).abs() < 1e-9);
    // Every ralph commit carries the four trailers.
    let log = env.git(&["log", "--format=%s%n%(trailers:only,unfold)%n--END--"]);
    let ralph_commits: Vec<&str> = log
        .split("--END--")
        .filter(|c| c.trim().starts_with("ralph:"))
        .collect();
    assert_eq!(ralph_commits.len(), 2, "{log}");
    for c in ralph_commits {
        for t in [
            "Ralph-Run:",
            "Ralph-Iteration:",
            "Ralph-Story:",
            "Ralph-Outcome: story_passed",
        ] {
            assert!(c.contains(t), "missing {t} in {c}");
        }
    }
    assert_eq!(
        env.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "ralph/demo"
    );
    let progress = env.read("progress.txt");
    assert!(progress.starts_with("# Ralph Progress Log"), "{progress}");
    assert!(
        progress.contains("(ralph, iteration 1)") && progress.contains("(ralph, iteration 2)"),
        "{progress}"
    );
    // One start ref per iteration, and an end ref for the run's last one, keep every
    // iteration's starting point and result reachable from refs/ralph/ alone.
    let refs = env.git(&["for-each-ref", "--format=%(refname)", "refs/ralph/"]);
    let starts = refs.lines().filter(|r| r.ends_with("/start")).count();
    let ends: Vec<&str> = refs.lines().filter(|r| r.ends_with("/end")).collect();
    assert_eq!((starts, ends.len()), (2, 1), "{refs}");
    assert!(ends[0].ends_with("/2/end"), "{refs}");
    let pinned = env.git(&["rev-list", "--glob=refs/ralph/*"]);
    for line in env.read(".ralph/ledger.jsonl").lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let checkpoint = record["checkpoint_commit"].as_str().unwrap();
        assert!(
            pinned.contains(checkpoint),
            "{checkpoint} is not reachable from refs/ralph/"
        );
    }
    // Status reads it back.
    let status = env.ralph(&["status", "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["complete"], true);
    assert_eq!(doc["iterations"].as_array().unwrap().len(), 2);
}

/// An agent that rewrites its story's `verify` to something that always passes (and marks the
/// story passing) is judged by the check the story had when the iteration started.
#[test]
fn an_agent_cannot_pass_its_story_by_rewriting_its_verify() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!("test -f file-1.txt");
    let env = TestEnv::new(&prd);
    let mut cheat = prd.clone();
    cheat["userStories"][0]["verify"] = json!("true");
    cheat["userStories"][0]["passes"] = json!(true);
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "prd.json",
                        "content": serde_json::to_string_pretty(&cheat).unwrap() + "\n"}},
        {"claude_result": {"text": "done <promise>COMPLETE</promise>"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["verify_failed"]);
    let record = env.ledger().pop().unwrap();
    assert_eq!(
        record["verify"][0]["command"], "test -f file-1.txt",
        "{record}"
    );
    let now: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(now["userStories"][0]["passes"], false);
    // The edited check itself is put back, whatever prd_guard says: the next iteration is
    // judged by the story's own check too.
    assert_eq!(now["userStories"][0]["verify"], "test -f file-1.txt");
    assert!(
        record["findings"].to_string().contains("ralph put it back"),
        "{record}"
    );
}

/// After `.ralph/` was deleted and a new run began, the iterations before it come from git:
/// log, status and show say "?"/"-" for what the trailers do not keep, never "0ms" or "0
/// commits", and show still finds the story's title, the agent's commit and the diff.
#[test]
fn iterations_known_only_from_git_are_never_shown_as_measured() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    std::fs::remove_dir_all(env.path(".ralph")).unwrap();
    env.script(&json!({"invocations": [claude_story("US-002", 2, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let log = String::from_utf8_lossy(&env.ralph(&["log", "--no-pager"]).stdout).into_owned();
    let first = log
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap();
    assert!(!first.contains("0ms"), "{log}");
    assert!(first.contains(" - "), "{log}");
    assert!(log.contains("rows with - are from git history"), "{log}");
    let second = log
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap();
    assert!(!second.contains(" - "), "{log}");

    let show = String::from_utf8_lossy(&env.ralph(&["show", "1", "--no-pager", "--diff"]).stdout)
        .into_owned();
    assert!(show.contains("US-001 Story 1"), "{show}");
    assert!(show.contains("feat: US-001 (the agent's)"), "{show}");
    assert!(show.contains("+story 1"), "the patch: {show}");
    assert!(!show.contains("(0ms)"), "{show}");

    let md =
        String::from_utf8_lossy(&env.ralph(&["report", "--markdown", "--all"]).stdout).into_owned();
    let row = md.lines().find(|l| l.starts_with("| 1 | US-001")).unwrap();
    assert!(row.contains("| ? | ? | ? | ? |"), "{md}");
}

/// `--agent-cmd "bash ./missing.sh"`: the script is looked for before the run (not found out by
/// three failed iterations), and doctor says the same.
#[test]
fn an_exec_agent_script_that_does_not_exist_is_refused_before_the_run() {
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env.ralph(&["run", "--agent", "exec", "--agent-cmd", "bash ./missing.sh"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "the agent script `./missing.sh` of --agent-cmd `bash ./missing.sh` does not exist"
        ),
        "{stderr}"
    );
    assert!(!env.path(".ralph/ledger.jsonl").exists());
    let out = env.ralph(&[
        "doctor",
        "--agent",
        "exec",
        "--agent-cmd",
        "bash ./missing.sh",
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the script `./missing.sh`"),
        "{}",
        text(&out)
    );
}

/// A story the agent marked passing is never left passing unchecked: not when ralph is killed
/// (SIGKILL) before its verify gate, and not when a stop (SIGTERM) ends the agent before it.
#[test]
fn a_story_marked_passing_by_an_interrupted_iteration_is_not_left_passing() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!("test -f file-1.txt");
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        let env = TestEnv::new(&prd);
        env.script(&json!({"invocations": [[
            {"claude_init": {}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"write_file": {"path": "../agent-started", "content": "x"}},
            {"sleep_ms": 60_000}
        ], [{"claude_init": {}}, {"claude_result": {"text": "Looked around."}}]]}));
        let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
        let marker = env.root.path().join("agent-started");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "the agent never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        child.wait().unwrap();
        if signal == Signal::SIGKILL {
            // The restart writes the interrupted iteration down, with the mark undone.
            let out = env.ralph(&["run", "--max-iter", "1"]);
            assert_eq!(out.status.code(), Some(3), "{signal}: {}", text(&out));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(
                    "interrupted before ralph checked the stories it marked passing: US-001"
                ),
                "{stderr}"
            );
            assert_eq!(env.ledger()[0]["passes_reverted"], json!(["US-001"]));
        }
        let now: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
        assert_eq!(now["userStories"][0]["passes"], false, "{signal}");
        assert_eq!(env.ledger()[0]["outcome"], "interrupted", "{signal}");
        let status: Value =
            serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
        assert_eq!(status["complete"], false, "{signal}");
    }
}

/// A stop (SIGTERM) while the verify gate runs a story's check: the check said nothing, so the
/// story is not passing, and the iteration is not a failed attempt (no verify_failed).
#[test]
fn a_check_cut_short_by_a_stop_is_unchecked_not_failed() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] =
        json!("touch ../verify-started; sleep 30; test -f file-1.txt");
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
    let marker = env.root.path().join("verify-started");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the check never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{}", env.spawned_output());
    let record = env.ledger().pop().unwrap();
    assert_ne!(record["outcome"], "verify_failed", "{record}");
    assert!(
        record["findings"]
            .to_string()
            .contains("stopped before checking US-001"),
        "{record}"
    );
    let now: Value = serde_json::from_str(&env.read("prd.json")).unwrap();
    assert_eq!(now["userStories"][0]["passes"], false);
    // The stop came while the iteration's check ran: the iteration is interrupted, not a stop
    // between iterations.
    assert_eq!(record["outcome"], "interrupted", "{record}");
    let output = env.spawned_output();
    assert!(
        output.contains("interrupted: the current iteration was stopped and checkpointed")
            && !output.contains("between iterations"),
        "{output}"
    );
}

/// Under GitHub Actions, a run that ends with an error instead of its summary (here a refused
/// dirty tree) still gives the workflow its outputs, an annotation and a summary line.
#[test]
fn under_github_actions_a_run_that_cannot_start_still_writes_its_outputs() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("stray.txt", "not committed\n");
    let outputs = env.root.path().join("github_output");
    let summary = env.root.path().join("step_summary");
    let out = env
        .ralph_cmd(&["run"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &outputs)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let written = std::fs::read_to_string(&outputs).unwrap();
    assert!(written.contains("exit_code=1\n"), "{written}");
    assert!(written.contains("stop_reason=error\n"), "{written}");
    assert!(
        written.contains("error=the working tree has uncommitted changes (1 path): stray.txt"),
        "{written}"
    );
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(md.contains("The run ended with an error"), "{md}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("::error title=ralph%3A the run ended with an error::"),
        "{}",
        text(&out)
    );
}

/// `ralph status` on the base branch (a fresh clone's default checkout, or a user who switched
/// back) shows the feature branch's prd.json and history (what `ralph run` takes up), says so,
/// and stops saying so once the work is merged.
#[test]
fn status_away_from_the_feature_branch_says_where_the_work_is() {
    let env = TestEnv::new(&prd_with_stories(1));
    let idle = json!([{"claude_init": {}}, {"claude_result": {"text": "Looked around."}}]);
    env.script(&json!({"invocations": [idle, claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    env.git(&["checkout", "-q", "main"]);
    let out = env.ralph(&["status"]);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("1/1 stories pass"), "{shown}");
    assert!(
        !shown.contains("why open stories have not passed"),
        "{shown}"
    );
    assert!(
        shown.contains("last run stopped (on ralph/demo): complete"),
        "{shown}"
    );
    assert!(
        shown.contains("ralph/demo is not checked out here; shown are its prd.json and history"),
        "{shown}"
    );
    let doc: Value = serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(doc["feature_branch_elsewhere"], "ralph/demo");
    assert_eq!(doc["shown_from"], "ralph/demo");
    // A fresh clone sits on main, with the work on origin/ralph/demo and no .ralph/.
    let clone = env.root.path().join("clone");
    env.git(&[
        "clone",
        "-q",
        env.path("").to_str().unwrap(),
        clone.to_str().unwrap(),
    ]);
    let in_clone = |args: &[&str]| {
        let out = env.ralph_cmd(args).current_dir(&clone).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = in_clone(&["status"]);
    assert!(
        shown.contains("origin/ralph/demo is not checked out here"),
        "{shown}"
    );
    assert!(shown.contains("1/1 stories pass"), "{shown}");
    assert!(shown.contains("from git history"), "{shown}");
    let log = in_clone(&["log", "--no-pager"]);
    assert!(log.contains("`git checkout ralph/demo`"), "{log}");
    env.git(&["merge", "-q", "--ff-only", "ralph/demo"]);
    let shown = String::from_utf8_lossy(&env.ralph(&["status"]).stdout).into_owned();
    assert!(!shown.contains("the run's work is on"), "{shown}");
    assert!(shown.contains("1/1 stories pass"), "{shown}");
}

#[test]
fn case_01_echoed_prompt_is_not_a_completion() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"echo_stdin": true}]]}));
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
    let ledger = env.ledger();
    assert_eq!(ledger[0]["promise_seen"], false);
    assert_eq!(ledger[0]["outcome"], "no_progress");
}

#[test]
fn case_02_promise_inside_a_sentence_is_not_a_completion() {
    let env = TestEnv::new(&prd_with_stories(1));
    let said = format!("I will not print {PROMISE} until every story passes.");
    env.script(&json!({"invocations": [[{"claude_init": {}}, {"claude_text": said}, {"claude_result": {"text": said}}]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.ledger()[0]["promise_seen"], false);
    assert_eq!(outcomes(&env), ["no_progress"]);
}

#[test]
fn case_03_premature_claim_is_recorded_shown_and_fed_back() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"claude_result": {"text": format!("All done!\n{PROMISE}")}}],
        [{"save_stdin": "../stdin-2.txt"}, {"claude_result": {"text": "ok"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["premature_claim", "no_progress"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("premature_claim"), "{stderr}");
    let prompt2 = stdin_of(&env, 2);
    assert!(
        prompt2.contains(
            "Your completion claim was premature: US-001, US-002, US-003 still have passes=false"
        ),
        "{prompt2}"
    );
}

#[test]
fn case_04_all_passing_without_promise_completes() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "Implemented it.")]}));
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.agent_calls(), 1);
    assert_eq!(env.ledger()[0]["promise_seen"], false);
}

#[test]
fn case_05_promise_in_tool_output_is_not_a_completion() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_tool": {"name": "Read", "input": {"file_path": "notes.md"}}},
        {"json": {"type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": format!("notes: {PROMISE}")}]}, "parent_tool_use_id": null}},
        {"claude_result": {"text": "I read the notes."}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.ledger()[0]["promise_seen"], false);
}

#[test]
fn case_06_promise_as_last_line_without_newline_is_seen() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"read_stdin": true},
        {"write_file": {"path": "work-466.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"stdout": format!("Finished the work.\n{PROMISE}")}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude --plain",
        "--max-iter",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.ledger()[0]["promise_seen"], true);
    assert_eq!(outcomes(&env), ["story_passed"]);
}

#[test]
fn case_07_silent_agent_is_killed_as_stalled_and_the_next_iteration_runs() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [
        [{"sleep_ms": 3_600_000}],
        claude_story("US-001", 1, "done")
    ]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "2", "--idle-timeout", "1s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["stalled", "story_passed"]);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn case_08_grandchild_holding_stdout_does_not_hang_and_is_killed() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"spawn_grandchild": {"ignore_term": true, "hold_stdout": true, "sleep_s": 120}},
        {"write_file": {"path": "work-507.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}},
        {"exit": 0}
    ]]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "ralph waited for EOF: {:?}",
        t.elapsed()
    );
    // The iteration is written down as finished: nothing in flight, the story passed on its
    // first attempt, and the run stopped complete.
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert!(state["in_flight"].is_null(), "{state}");
    assert_eq!(state["iteration"], 1, "{state}");
    assert_eq!(state["last_outcome"], "story_passed", "{state}");
    assert_eq!(state["blocked"], json!([]), "{state}");
    assert_eq!(state["stop_reason"]["kind"], "complete", "{state}");
    // The grandchild (sleep 120) must be gone: no process of any fake-agent group survives.
    let calls = env.read("../script.json.calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    let pid = call["pid"].as_i64().unwrap() as i32;
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !group_has_live_members(pid),
        "group {pid} still has live members"
    );
}

#[test]
fn case_09_agent_that_never_exits_after_its_result_is_finished_after_a_grace() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "work-537.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}},
        {"sleep_ms": 3_600_000}
    ]]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["story_passed"]);
    assert!(
        t.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn case_10_agent_reading_stdin_to_eof_gets_the_prompt() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"save_stdin": "../stdin-1.txt"},
        {"claude_result": {"text": "read it"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stdin_of(&env, 1).contains("Story ID: US-001"));
}

#[test]
fn case_17_corrupted_prd_is_restored_and_reported_to_the_next_prompt() {
    let env = TestEnv::new(&prd_with_stories(1));
    let before = env.read("prd.json");
    env.script(&json!({"invocations": [
        [{"corrupt_prd": true}, {"claude_result": {"text": "oops"}}],
        [{"save_stdin": "../stdin-2.txt"}, {"claude_result": {"text": "ok"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env)[0], "prd_corrupted");
    assert_eq!(
        env.read("prd.json"),
        before,
        "prd.json must be restored byte for byte"
    );
    assert!(stdin_of(&env, 2).contains("prd.json was not valid after the previous iteration"));
}

/// A prd.json that is valid JSON but not a valid PRD (the agent deleted every story): the
/// message, in the ledger and the next prompt, names the problem, not only "1 problem:".
#[test]
fn an_invalid_prd_after_the_agent_names_the_problem() {
    let env = TestEnv::new(&prd_with_stories(1));
    let mut emptied = prd_with_stories(1);
    emptied["userStories"] = json!([]);
    env.script(&json!({"invocations": [
        [{"write_file": {"path": "prd.json", "content": emptied.to_string()}}, {"claude_result": {"text": "oops"}}],
        [{"save_stdin": "../stdin-2.txt"}, {"claude_result": {"text": "ok"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env)[0], "prd_corrupted");
    let message = env.ledger()[0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("userStories"), "{message}");
    assert!(!message.contains("hint:"), "{message}");
    assert!(stdin_of(&env, 2).contains("userStories"));
}

#[test]
fn case_19_dirty_tree_is_refused_with_a_hint_and_nothing_is_lost() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("README.md", "my unsaved edit\n");
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("uncommitted changes") && stderr.contains("--allow-dirty"),
        "{stderr}"
    );
    assert!(stderr.contains("README.md"), "{stderr}");
    assert_eq!(env.read("README.md"), "my unsaved edit\n");
    assert_eq!(env.agent_calls(), 0);
    // With --allow-dirty it proceeds.
    let out = env.ralph(&["run", "--allow-dirty", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn case_22_sigkill_mid_iteration_then_resume() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        claude_story("US-001", 1, "done 1"),
        claude_story("US-002", 2, "done 2"),
        [{"write_file": {"path": "partial.txt", "content": "half done\n"}},
         {"spawn_grandchild": {"ignore_term": true, "hold_stdout": false, "sleep_s": 300}},
         {"stdout": "{\"type\":\"system\",\"subtype\":\"init\"}"},
         {"sleep_ms": 3_600_000}],
        claude_story("US-003", 3, "done 3")
    ]}));
    let mut prd = prd_with_stories(3);
    prd["userStories"][2]["id"] = json!("US-003");
    env.write("prd.json", &serde_json::to_string_pretty(&prd).unwrap());
    env.git(&["commit", "-qam", "three stories"]);

    let mut child = env.ralph_spawn(&["run", "--max-iter", "5"]);
    // Wait until iteration 3 is in flight with its agent running.
    let deadline = Instant::now() + Duration::from_secs(60);
    let pgid = loop {
        assert!(Instant::now() < deadline, "iteration 3 never started");
        if let Ok(s) = std::fs::read_to_string(env.path(".ralph/state.json")) {
            let v: Value = serde_json::from_str(&s).unwrap_or(Value::Null);
            if v["in_flight"]["iteration"] == 3
                && v["in_flight"]["pid"].as_u64().unwrap_or(0) > 0
                && env.path("partial.txt").exists()
            {
                break v["in_flight"]["pid"].as_i64().unwrap() as i32;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();

    let out = env.ralph(&["run", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stale lock"), "{stderr}");
    assert!(
        !group_has_live_members(pgid),
        "the orphaned agent group {pgid} survived"
    );
    let ledger = env.ledger();
    let its: Vec<(u64, &str)> = ledger
        .iter()
        .map(|r| {
            (
                r["iteration"].as_u64().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        its,
        [
            (1, "story_passed"),
            (2, "story_passed"),
            (3, "interrupted"),
            (4, "story_passed")
        ]
    );
    // The interrupted iteration's work is in a checkpoint commit.
    let log = env.git(&["log", "--format=%s", "--", "partial.txt"]);
    assert!(log.contains("ralph: iteration 3 (US-003)"), "{log}");
    assert_eq!(env.read("partial.txt"), "half done\n");
}

#[test]
fn case_23_second_run_refuses_and_names_the_pid() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"claude_init": {}}, {"sleep_ms": 3_600_000}]]}));
    let mut first = env.ralph_spawn(&["run", "--max-iter", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.agent_calls() == 0 {
        assert!(
            Instant::now() < deadline,
            "first run never started its agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("pid {}", first.id())), "{stderr}");
    assert_eq!(env.agent_calls(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(130));
}

#[test]
fn ctrl_c_interrupts_checkpoints_and_resume_continues_numbering() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"write_file": {"path": "wip.txt", "content": "wip\n"}},
         {"spawn_grandchild": {"ignore_term": true, "hold_stdout": true, "sleep_s": 300}},
         {"sleep_ms": 3_600_000}],
        claude_story("US-001", 1, "done")
    ]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "3"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.path("wip.txt").exists() {
        assert!(Instant::now() < deadline, "agent never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The agent may write its file before ralph has saved its process group id.
    let pgid = loop {
        let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
        let pid = state["in_flight"]["pid"].as_i64().unwrap_or(0) as i32;
        if pid > 0 {
            break pid;
        }
        assert!(Instant::now() < deadline, "the agent's pid was never saved");
        std::thread::sleep(Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!group_has_live_members(pgid), "agent group survived Ctrl-C");
    assert_eq!(outcomes(&env), ["interrupted"]);
    assert!(env
        .git(&["log", "--format=%s", "--", "wip.txt"])
        .contains("ralph: iteration 1"));
    assert!(env.git(&["status", "--porcelain"]).trim().is_empty());

    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let its: Vec<u64> = env
        .ledger()
        .iter()
        .map(|r| r["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(its, [1, 2]);
}

#[test]
fn case_26_invalid_prd_refuses_before_any_agent_starts() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("prd.json", "{\"project\": \"x\", \"userStories\": [{\"title\": \"t\", \"priority\": \"high\", \"acceptanceCriteria\": []}]}");
    env.git(&["commit", "-qam", "bad prd"]);
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prd.json") && stderr.contains("userStories[0]"),
        "{stderr}"
    );
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn case_27_hostile_title_and_200kb_prompt_arrive_byte_for_byte() {
    let mut prd = prd_with_stories(1);
    let title = "Quote \"it\" and 'this' $(touch pwned) `touch pwned2` — ünïcødé ✓";
    prd["userStories"][0]["title"] = json!(title);
    let big = "x".repeat(200 * 1024);
    prd["userStories"][0]["description"] = json!(big);
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [[{"save_stdin": "../stdin-1.txt"}, {"claude_result": {"text": "ok"}}]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let got = stdin_of(&env, 1);
    assert!(
        got.contains(&format!("Title: {title}")),
        "title not received verbatim"
    );
    assert!(got.contains(&big));
    assert!(!env.path("pwned").exists() && !env.path("pwned2").exists());
    assert!(!env.root.path().join("pwned").exists());
}

#[test]
fn case_28_bad_invocations_fail_clearly_before_any_agent() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--max-iter", "0"],
            2,
            "--max-iter must be at least 1",
        ),
        (vec!["run", "--no-such-flag"], 2, "--no-such-flag"),
        (vec!["run", "--template", "missing.md"], 1, "missing.md"),
        (
            vec!["run", "--agent-program", "no-such-agent-binary"],
            1,
            "no-such-agent-binary",
        ),
    ];
    for (args, code, needle) in cases {
        let out = env.ralph(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn auth_error_stops_the_run_with_exit_1() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_result": {"text": "Invalid API key · Please run /login", "is_error": true}},
        {"exit": 1}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(outcomes(&env), ["auth_error"]);
    assert_eq!(env.agent_calls(), 1);
}

#[test]
fn nested_session_variables_are_scrubbed_and_sandbox_set_for_root() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")],
                       "record_env": ["ANTHROPIC_API_KEY"]}));
    // A claude login of its own: only then is the key removed (README, claude's environment).
    std::fs::create_dir_all(env.home.join(".claude")).unwrap();
    std::fs::write(
        env.home.join(".claude/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x"}}"#,
    )
    .unwrap();
    let out = env
        .ralph_cmd(&["run", "--max-iter", "1"])
        .env("CLAUDECODE", "1")
        .env("CLAUDE_CODE_ENTRYPOINT", "cli")
        .env("ANTHROPIC_API_KEY", "sk-ant-would-switch-billing")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let calls = env.read("../script.json.calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert!(call["env"]["CLAUDECODE"].is_null(), "{call}");
    // An API key would silently bill the API instead of the subscription login: removed.
    assert!(call["env"]["ANTHROPIC_API_KEY"].is_null(), "{call}");
    assert_eq!(call["env"]["NO_COLOR"], "1");
    if nix::unistd::geteuid().is_root() {
        assert_eq!(call["env"]["IS_SANDBOX"], "1");
    }
    let argv: Vec<&str> = call["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for flag in [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
    ] {
        assert!(argv.contains(&flag), "{argv:?}");
    }
}

#[test]
fn keep_api_key_leaves_the_key_to_claude_and_the_command_line_is_logged_pasteable() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")],
                       "record_env": ["ANTHROPIC_API_KEY"]}));
    // A claude login of its own: only then is the key removed (README, claude's environment).
    std::fs::create_dir_all(env.home.join(".claude")).unwrap();
    std::fs::write(
        env.home.join(".claude/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x"}}"#,
    )
    .unwrap();
    let out = env
        .ralph_cmd(&["run", "--max-iter", "1", "--keep-api-key", "--verbose"])
        .env("ANTHROPIC_API_KEY", "sk-ant-kept")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let calls = env.read("../script.json.calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(call["env"]["ANTHROPIC_API_KEY"], "sk-ant-kept", "{call}");
    // --verbose shows the exact command; it ends by feeding the saved prompt on stdin.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("$ cd "))
        .unwrap_or_else(|| panic!("no command line in:\n{stderr}"));
    assert!(
        line.contains("NO_COLOR=1") && line.contains("--dangerously-skip-permissions"),
        "{line}"
    );
    let prompt_file = line.rsplit("< ").next().unwrap().trim().trim_matches('\'');
    let prompt = std::fs::read_to_string(prompt_file).unwrap();
    assert!(prompt.contains("US-001"), "{prompt}");
}

#[test]
fn settings_come_from_flags_then_env_then_ralph_toml() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.write("prompt.md", "CUSTOM PROMPT for {{ story.id }}\n");
    env.write("ralph.toml", "max_iter = 1\ntemplate = \"prompt.md\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [[{"save_stdin": "../stdin-1.txt"}, {"claude_result": {"text": "ok"}}]]}));
    // ralph.toml alone: one iteration, with the user's template.
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.ledger().len(), 1);
    assert_eq!(stdin_of(&env, 1), "CUSTOM PROMPT for US-001\n");
    // The environment wins over the file.
    let out = env
        .ralph_cmd(&["run"])
        .env("RALPH_MAX_ITER", "2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.ledger().len(), 3);
    // A flag wins over the environment.
    let out = env
        .ralph_cmd(&["run", "--max-iter", "1"])
        .env("RALPH_MAX_ITER", "5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.ledger().len(), 4);
    // A typo in ralph.toml is an error naming the file and key, before any agent starts.
    env.write("ralph.toml", "max_iters = 1\n");
    let calls = env.agent_calls();
    let out = env.ralph(&["run", "--allow-dirty"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ralph.toml") && stderr.contains("max_iters"),
        "{stderr}"
    );
    assert_eq!(env.agent_calls(), calls);
}

#[test]
fn json_mode_prints_one_event_per_line_on_stdout() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    // Warnings vary (a slow `--version` probe on a loaded machine; the stories taken on the
    // agent's word, which this prd.json has); the rest is fixed.
    let events: Vec<Value> = events
        .into_iter()
        .filter(|e| e["event"] != "warning")
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_started",
            "iteration_started",
            "iteration_finished",
            "run_finished"
        ]
    );
    let named = |name: &str| {
        events
            .iter()
            .find(|e| e["event"] == name)
            .unwrap_or_else(|| panic!("no {name} event"))
    };
    assert_eq!(
        named("iteration_finished")["record"]["outcome"],
        "story_passed"
    );
    assert_eq!(named("run_finished")["success"], true);
}

#[test]
fn quiet_mode_prints_only_the_summary() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("iteration 1 (1/10)"), "{stderr}");
    assert!(
        stderr.contains("complete: every story passes (1 of 1)"),
        "{stderr}"
    );
}

#[test]
fn timeout_with_a_term_ignoring_grandchild_leaves_no_process_and_does_not_wait_for_eof() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "kill_grace = \"1s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"ignore_sigterm": true},
        {"spawn_grandchild": {"ignore_term": true, "hold_stdout": true, "sleep_s": 300}},
        {"sleep_ms": 3_600_000}
    ]]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "1", "--timeout", "2s"]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["timeout"]);
    // 2 s timeout + 1 s grace + bookkeeping; waiting for the grandchild's EOF would take 300 s.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let calls = env.read("../script.json.calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    let pgid = call["pid"].as_i64().unwrap() as i32;
    assert!(
        !group_has_live_members(pgid),
        "group {pgid} survived the timeout"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timeout"), "{stderr}");
}

/// Case 18 (a deleted story): reported, and the run never calls itself complete.
#[test]
fn case_18_a_deleted_story_never_makes_the_run_complete() {
    let env = TestEnv::new(&prd_with_stories(2));
    let mut only_first = prd_with_stories(2);
    only_first["userStories"].as_array_mut().unwrap().remove(1);
    only_first["userStories"][0]["passes"] = json!(true);
    env.script(&json!({"invocations": [[
        {"write_file": {"path": "file-1.txt", "content": "story 1\n"}},
        {"write_file": {"path": "prd.json", "content": serde_json::to_string_pretty(&only_first).unwrap()}},
        {"claude_result": {"text": format!("done\n{PROMISE}")}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stories deleted from prd.json: US-002"),
        "{stderr}"
    );
    assert!(
        stderr.contains("US-002 was deleted from prd.json during the run"),
        "{stderr}"
    );
    assert!(!stderr.contains("complete: every story passes"), "{stderr}");
    let ledger = env.ledger();
    assert!(
        ledger[0]["message"]
            .as_str()
            .unwrap()
            .contains("stories deleted"),
        "{}",
        ledger[0]
    );
}

/// Case 18 (passes set on a story the agent did not work on): ledger, terminal, next prompt.
#[test]
fn case_18_passes_flipped_on_another_story_is_reported_in_the_ledger_feedback_and_summary() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        [{"write_file": {"path": "work-1086.txt", "content": "work\n"}}, {"set_passes": {"id": "US-002", "passes": true}}, {"claude_result": {"text": "did 2"}}],
        [{"save_stdin": "../stdin-2.txt"}, {"write_file": {"path": "work-1087.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}}, {"claude_result": {"text": "did 1"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("passes set to true on US-002 during US-001's iteration"),
        "{stderr}"
    );
    assert!(
        stderr.contains("check: US-002 was marked passing during iteration 1 (US-001)"),
        "{stderr}"
    );
    assert!(
        stdin_of(&env, 2).contains("ralph noticed changes beyond your story's passes and notes")
    );
    assert!(env.ledger()[0]["message"]
        .as_str()
        .unwrap()
        .contains("US-002"));
}

#[test]
fn restart_leaves_an_unrelated_process_group_alone() {
    let env = TestEnv::new(&prd_with_stories(1));
    // A process group that is not ralph's, recorded as if it were the agent of a killed run.
    let mut victim = std::process::Command::new("setsid")
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = victim.id();
    std::fs::create_dir_all(env.path(".ralph")).unwrap();
    env.write(".ralph/.gitignore", "*\n");
    env.write(
        ".ralph/state.json",
        &json!({"version": 1, "run_id": "old", "iteration": 1, "attempts": {}, "blocked": [],
            "in_flight": {"run_id": "old", "iteration": 1, "story_id": "US-001", "pid": pid,
                "started_at": "2026-01-01T00:00:00.000Z"}})
        .to_string(),
    );
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no longer ralph's agent"),
        "{}",
        text(&out)
    );
    assert!(
        victim.try_wait().unwrap().is_none(),
        "ralph killed an unrelated process"
    );
    let _ = victim.kill();
    let _ = victim.wait();
    // The interrupted iteration 1 was recorded; the new one is 2.
    let its: Vec<u64> = env
        .ledger()
        .iter()
        .map(|r| r["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(its, [1, 2]);
}

#[test]
fn sigkill_while_prd_is_broken_restores_it_on_restart() {
    let env = TestEnv::new(&prd_with_stories(1));
    let before = env.read("prd.json");
    env.script(&json!({"invocations": [
        [{"corrupt_prd": true}, {"write_file": {"path": "marker.txt", "content": "x"}}, {"sleep_ms": 3_600_000}],
        claude_story("US-001", 1, "done")
    ]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "3"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.path("marker.txt").exists() {
        assert!(Instant::now() < deadline, "agent never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert_ne!(env.read("prd.json"), before);
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("restored it from the iteration's snapshot")
    );
    assert_eq!(outcomes(&env), ["interrupted", "story_passed"]);
}

#[test]
fn template_errors_in_any_branch_are_caught_before_an_agent_starts() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "prompt.md",
        "{{ story.id }}\n{% for item in feedback %}{{ item.missing_field }}{% endfor %}\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "template"]);
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--template", "prompt.md"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prompt.md") && stderr.contains("missing_field"),
        "{stderr}"
    );
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn numbering_continues_from_git_and_the_ledger_when_state_json_is_gone() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [claude_story("US-001", 1, "one"), claude_story("US-002", 2, "two")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    std::fs::remove_file(env.path(".ralph/state.json")).unwrap();
    std::fs::remove_file(env.path(".ralph/ledger.jsonl")).unwrap();
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let its: Vec<u64> = env
        .ledger()
        .iter()
        .map(|r| r["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(its, [2]);
}

#[test]
fn verify_gate_sets_a_failing_story_back_and_keeps_prd_bytes() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        [{"set_passes": {"id": "US-001", "passes": true}}, {"claude_result": {"text": "done"}}],
        [{"save_stdin": "../stdin-2.txt"}, {"write_file": {"path": "file-1.txt", "content": "ok\n"}},
         {"set_passes": {"id": "US-001", "passes": true}}, {"claude_result": {"text": "done"}}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2", "--verify", "test -f file-$RALPH_STORY_ID.txt || test -f file-1.txt || { echo 'file-1.txt is missing'; exit 3; }"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["verify_failed", "story_passed"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("verify failed for US-001"), "{stderr}");
    let prompt2 = stdin_of(&env, 2);
    assert!(
        prompt2.contains("file-1.txt is missing") && prompt2.contains("exited with code 3"),
        "{prompt2}"
    );
    let prd = env.prd();
    assert_eq!(prd["userStories"][0]["passes"], true);
}

#[test]
fn verify_failure_changes_only_the_passes_value() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"set_passes": {"id": "US-001", "passes": true}}, {"claude_result": {"text": "done"}}]]}));
    // What the agent's prd.json looks like, with passes flipped back by hand for comparison.
    let out = env.ralph(&["run", "--max-iter", "1", "--verify", "exit 1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["verify_failed"]);
    let after = env.read("prd.json");
    let agent_wrote = env.git(&["show", "HEAD:prd.json"]);
    assert_eq!(after, agent_wrote, "the checkpoint holds the restored file");
    let original: Value = prd_with_stories(1);
    let now: Value = serde_json::from_str(&after).unwrap();
    assert_eq!(
        now, original,
        "only passes changed, and it is back to false"
    );
}

#[test]
fn verify_marks_passing_lets_the_check_decide_when_the_agent_forgets() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"write_file": {"path": "file-1.txt", "content": "one\n"}},
        {"claude_result": {"text": "wrote it"}}
    ]]}));
    // Off by default for agent CLIs: the agent's own `passes` is what counts.
    let out = env.ralph(&["run", "--max-iter", "1", "--verify", "test -f file-1.txt"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["progress"]);
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "1",
        "--verify",
        "test -f file-1.txt",
        "--verify-marks-passing",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["progress", "story_passed"]);
    let last = env.ledger().pop().unwrap();
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("ralph marked it passing"),
        "{last}"
    );
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
}

#[test]
fn transient_failures_are_retried_with_backoff_without_using_the_budget() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "ralph.toml",
        "transient_backoff = \"100ms\"\nmax_transient_retries = 2\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"claude_api_error": {"status": 529, "message": "API Error: 529 Overloaded. This is a server-side issue, usually temporary"}}, {"exit": 1}],
        claude_story("US-001", 1, "done")
    ]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["transient", "story_passed"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("transient failure; retrying US-001"));
    // Only the real attempt counts toward the story's attempts.
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["attempts"]["US-001"], 1);
}

#[test]
fn transient_failures_in_a_row_are_bounded() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "ralph.toml",
        "transient_backoff = \"50ms\"\nmax_transient_retries = 2\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"claude_api_error": {"status": 529, "message": "API Error: 529 Overloaded"}}, {"exit": 1}]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "10"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(outcomes(&env), ["transient", "transient", "transient"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("3 transient failures in a row"),
        "{}",
        text(&out)
    );
}

#[test]
fn restart_kills_processes_the_agent_moved_out_of_its_group() {
    let env = TestEnv::new(&prd_with_stories(1));
    // An agent that starts a process in a session of its own (as tools and dev servers do),
    // then hangs.
    let agent = env.root.path().join("agent.sh");
    std::fs::write(
        &agent,
        "#!/bin/sh\ncat >/dev/null\nsetsid sleep 300 </dev/null >/dev/null 2>&1 &\necho $! > \"$ESCAPEE\"\nsleep 300\n",
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pid_file = env.root.path().join("escapee.pid");
    let mut cmd = env.ralph_cmd(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        agent.to_str().unwrap(),
        "--max-iter",
        "1",
    ]);
    cmd.env("ESCAPEE", &pid_file);
    let mut child = env.ralph_spawn_with(cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    let escapee: i32 = loop {
        assert!(
            Instant::now() < deadline,
            "the agent never started its process"
        );
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert!(
        std::path::Path::new(&format!("/proc/{escapee}")).exists(),
        "escapee died too early"
    );
    env.script(&json!({"invocations": [claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::thread::sleep(Duration::from_millis(200));
    let alive = std::fs::read_to_string(format!("/proc/{escapee}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false);
    assert!(
        !alive,
        "the agent's escaped process {escapee} survived the restart"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("left running by the interrupted iteration"),
        "{}",
        text(&out)
    );
}

/// A claude invocation that hits its usage limit, resetting `resets_in_s` seconds after the fake
/// plays it (not after the script is written: a slow start of ralph must not eat the wait).
fn usage_limit_invocation(resets_in_s: i64) -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit · resets 2pm (Europe/Berlin)", "resets_in_s": resets_in_s}},
        {"exit": 1}
    ])
}

#[test]
fn case_12_usage_limit_waits_for_the_reset_and_does_not_use_the_budget() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"0s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(
        &json!({"invocations": [usage_limit_invocation(2), claude_story("US-001", 1, "done")]}),
    );
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "did not wait for the reset"
    );
    assert_eq!(outcomes(&env), ["usage_limit", "story_passed"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("waiting for the usage limit to reset at"),
        "{stderr}"
    );
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert!(state["resume_at"].is_null(), "{state}");
    assert_eq!(state["attempts"]["US-001"], 1);
}

#[test]
fn no_wait_stops_at_a_usage_limit_and_a_restart_honours_the_persisted_reset() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(
        &json!({"invocations": [usage_limit_invocation(3600), claude_story("US-001", 1, "done")]}),
    );
    let out = env.ralph(&["run", "--no-wait", "--json"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(outcomes(&env), ["usage_limit"]);
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    let resume_at = state["resume_at"].as_str().expect("resume_at persisted");
    // Scripts reading --json get the reset time as a field, not only in prose.
    let finished: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "run_finished" || e["type"] == "run_finished")
        .expect("a run_finished event");
    let reported = finished["resume_at"]
        .as_str()
        .expect("resume_at in run_finished");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(reported).unwrap(),
        chrono::DateTime::parse_from_rfc3339(resume_at).unwrap()
    );
    let parsed = chrono::DateTime::parse_from_rfc3339(resume_at).unwrap();
    assert!(
        (parsed.timestamp() - chrono::Utc::now().timestamp() - 3600).abs() < 60,
        "{resume_at}"
    );
    // A restarted ralph still knows about the limit: with --no-wait it stops at once.
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not waiting (--no-wait)"),
        "{}",
        text(&out)
    );
    assert_eq!(env.agent_calls(), 1);
}

#[test]
fn a_ralph_killed_during_a_usage_limit_wait_waits_for_the_same_reset_when_restarted() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"0s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(
        &json!({"invocations": [usage_limit_invocation(5), claude_story("US-001", 1, "done")]}),
    );
    let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let resume_at = loop {
        assert!(Instant::now() < deadline, "ralph never started waiting");
        if let Ok(s) = std::fs::read_to_string(env.path(".ralph/state.json")) {
            let v: Value = serde_json::from_str(&s).unwrap_or(Value::Null);
            if let Some(r) = v["resume_at"].as_str() {
                break chrono::DateTime::parse_from_rfc3339(r).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();

    let out = env.ralph(&["run", "--max-iter", "1"]);
    let finished = chrono::Utc::now();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        finished >= resume_at,
        "the restarted ralph ran the agent before the persisted reset {resume_at}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("waiting for the usage limit to reset at"),
        "{}",
        text(&out)
    );
    // The wait did not use up the budget: one iteration was allowed and the story passed.
    assert_eq!(outcomes(&env), ["usage_limit", "story_passed"]);
    assert_eq!(env.agent_calls(), 2);
}

/// Ctrl-C (GitHub Actions' cancel) during a usage-limit wait: the run ends interrupted, and its
/// summary, `$GITHUB_OUTPUT` included, still says when the run can resume.
#[test]
fn a_wait_cut_short_by_ctrl_c_still_reports_when_the_run_can_resume() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(
        &json!({"invocations": [usage_limit_invocation(3600), claude_story("US-001", 1, "done")]}),
    );
    let outputs = env.root.path().join("github_output");
    let mut cmd = env.ralph_cmd(&["run", "--max-iter", "1"]);
    cmd.env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &outputs);
    let mut child = env.ralph_spawn_with(cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    let resume_at = loop {
        assert!(Instant::now() < deadline, "ralph never started waiting");
        if let Ok(s) = std::fs::read_to_string(env.path(".ralph/state.json")) {
            let v: Value = serde_json::from_str(&s).unwrap_or(Value::Null);
            if let Some(r) = v["resume_at"].as_str() {
                break chrono::DateTime::parse_from_rfc3339(r).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{}", env.spawned_output());
    let outputs = std::fs::read_to_string(&outputs).unwrap();
    assert!(outputs.contains("stop_reason=interrupted\n"), "{outputs}");
    let expected = resume_at
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        outputs.contains(&format!("resume_at={expected}\n")),
        "{expected} in {outputs}"
    );
}

#[test]
fn a_usage_limit_that_resets_after_max_duration_stops_the_run_at_once() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(
        &json!({"invocations": [usage_limit_invocation(3600), claude_story("US-001", 1, "done")]}),
    );
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-duration", "10m"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(t.elapsed() < Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("after --max-duration 10m ends"), "{stderr}");
    assert_eq!(outcomes(&env), ["usage_limit"]);
}

#[test]
fn max_duration_stops_between_iterations_with_exit_4_and_names_the_reason() {
    let env = TestEnv::new(&prd_with_stories(2));
    // Every iteration takes about 1.5 s and never finishes a story.
    env.script(&json!({"default": [
        {"claude_init": {}},
        {"sleep_ms": 1500},
        {"claude_result": {"text": "still working"}}
    ]}));
    let out = env.ralph(&["run", "--max-iter", "10", "--max-duration", "2s"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let n = outcomes(&env).len();
    assert!((1..=3).contains(&n), "{n} iterations ran in a 2 s budget");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-duration 2s"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_cli_reporting_only_tokens_is_priced_from_ralph_toml_and_status_shows_the_run_totals() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "ralph.toml",
        "[prices.\"claude-fake-1\"]\ninput = 3.0\noutput = 15.0\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "prices"]);
    env.script(&json!({"invocations": [[
        {"claude_init": {"model": "claude-fake-1"}},
        {"write_file": {"path": "work-1610.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"claude_result": {"text": "done", "omit_cost": true,
                           "usage": {"input_tokens": 1000, "output_tokens": 2000}}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rec = &env.ledger()[0];
    // 1000 × $3/M + 2000 × $15/M = $0.033
    assert!(
        (rec["cost_usd"].as_f64().unwrap() - 0.033).abs() < 1e-9,
        "{rec}"
    );
    assert_eq!(rec["cost_source"], "price_table");
    // The version the agent reports itself wins; the `--version` answer is in the run header.
    assert_eq!(rec["agent_version"], "2.1.332");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("claude ralph-fake-agent 0.0.0 (test stand-in)"),
        "{}",
        text(&out)
    );

    let status = env.ralph(&["status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        stdout.contains(
            "this run: 1 iteration(s), $0.03 (estimated from [prices]), 1000 tokens in, 2000 out"
        ),
        "{stdout}"
    );
    let json_out = env.ralph(&["status", "--json"]);
    let doc: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(doc["latest_run_tokens_out"], 2000);
    assert_eq!(doc["cost_estimated"], true);
}

#[test]
fn case_11_no_messages_returned_once_is_retried_without_using_the_budget() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "transient_backoff = \"100ms\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [{"stderr": "No messages returned"}, {"exit": 1}],
        claude_story("US-001", 1, "done")
    ]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["transient", "story_passed"]);
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(state["attempts"]["US-001"], 1);
}

#[test]
fn case_14_hostile_output_does_not_crash_the_run_and_the_transcript_keeps_it() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"stdout_repeat": {"text": "x", "count": 6_000_000}},
        {"stdout_bytes": [0xff, 0xfe, 0x7b, 0x0a]},
        {"stdout": "plain text, not JSON\r"},
        {"stderr": "\u{1b}[31mcoloured warning\u{1b}[0m"},
        {"write_file": {"path": "work-1673.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"claude_result": {"text": "Done.\n<promise>COMPLETE</promise>"}},
        {"stdout_raw": "partial line without newline"}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rec = &env.ledger()[0];
    assert_eq!(rec["outcome"], "story_passed");
    assert_eq!(rec["promise_seen"], true);
    let transcript = env.read(rec["transcript"].as_str().unwrap());
    assert!(
        transcript.contains("line truncated: kept 65536 of 6000000 bytes"),
        "the 6 MB line is cut with a note"
    );
    assert!(transcript.contains("partial line without newline"));
    assert!(transcript.contains("plain text, not JSON"));
    assert!(
        transcript.contains("\"message\":\"coloured warning\""),
        "ANSI stripped in events"
    );
}

/// Case 15: 2 GB of output in one iteration. ralph reads it line by line through a bounded
/// buffer and the transcript keeps only its first 64 MiB, so neither memory nor disk grows with
/// the output. Peak memory is read with getrusage over the whole process tree (ralph and the
/// fake agent, which streams from a 1 MiB buffer).
#[test]
fn case_15_two_gigabytes_of_output_keep_memory_and_the_transcript_bounded() {
    let env = TestEnv::new(&prd_with_stories(1));
    let gib2: u64 = 2 * 1024 * 1024 * 1024;
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"stdout_flood": {"line": "some agent chatter that is not JSON, over and over ".repeat(20), "bytes": gib2}},
        {"write_file": {"path": "work-1707.txt", "content": "work\n"}}, {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"claude_result": {"text": "done"}}
    ]]}));
    // Reaped below with wait4, which also reports the tree's peak memory.
    #[allow(clippy::zombie_processes)]
    let child = env
        .ralph_cmd(&["run", "--max-iter", "1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // wait4 reports the peak resident size of ralph and of the processes it waited for (the
    // agent); the test binary's own other children do not count, unlike RUSAGE_CHILDREN.
    let mut status = 0;
    // SAFETY: plain syscall on our own child's pid with valid out-pointers.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { nix::libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    assert!(
        nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    // ru_maxrss is in KiB on Linux: the largest process of the tree stayed under 256 MiB while
    // 2048 MiB went through it.
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(peak_mib < 256, "peak RSS {peak_mib} MiB");
    let rec = &env.ledger()[0];
    assert_eq!(rec["outcome"], "story_passed");
    let transcript = env.path(rec["transcript"].as_str().unwrap());
    let size = std::fs::metadata(&transcript).unwrap().len();
    assert!(size < 80 * 1024 * 1024, "transcript is {size} bytes");
    let tail = std::fs::read_to_string(&transcript).unwrap();
    assert!(tail.contains("\"type\":\"capped\""));
    assert!(tail.trim_end().ends_with('}') && tail.contains("\"type\":\"omitted\""));
}

#[test]
fn case_16_inside_a_claude_session_the_variable_is_removed_and_the_refusal_is_not_retried() {
    let env = TestEnv::new(&prd_with_stories(1));
    // What claude prints when it still sees CLAUDECODE: a deterministic config error.
    env.script(&json!({"default": [
        {"stderr": "Error: Claude Code cannot be launched inside another Claude Code session."},
        {"exit": 1}
    ]}));
    let out = env
        .ralph_cmd(&["run", "--max-iter", "5"])
        .env("CLAUDECODE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(outcomes(&env), ["config_error"]);
    assert_eq!(env.agent_calls(), 1, "a config error must never be retried");
    let calls = env.read("../script.json.calls.jsonl");
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert!(call["env"]["CLAUDECODE"].is_null(), "{call}");
}

#[test]
fn a_limit_text_in_a_tool_result_or_a_file_is_never_a_usage_limit() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "NOTES.md", "content": "You've hit your session limit · resets 2pm (Europe/Berlin)\nClaude AI usage limit reached|1753441200\n"}},
        {"claude_tool": {"name": "Bash", "input": {"command": "cat NOTES.md"},
                         "result": "You've hit your session limit · resets 2pm (Europe/Berlin)\nClaude AI usage limit reached|1753441200", "is_error": true}},
        {"claude_result": {"text": "I could not finish the story.", "is_error": false}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["progress"]);
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert!(state["resume_at"].is_null(), "{state}");
}

/// An iteration that hit its time limit after the agent committed its story and marked it
/// passing, whose check then passed: the ledger says `timeout` with the pass kept
/// (`passes_flipped`), and the story passes. The outcome line is no "✗" failure but says both,
/// and the report fills the story's time to pass from that iteration.
#[test]
fn a_timeout_after_the_story_passed_its_check_is_shown_as_a_pass_with_its_time_to_pass() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "file-1.txt", "content": "story 1\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        // Far past the limit: the kill, not the agent, ends the iteration.
        {"sleep_ms": 600_000},
        {"claude_result": {"text": "done"}}
    ]]}));
    // A limit generous enough for a loaded machine to reach the commit first.
    let out = env.ralph(&["run", "--timeout", "20s", "--verify", "test -f file-1.txt"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger[0]["outcome"], "timeout", "{}", ledger[0]);
    assert_eq!(
        ledger[0]["passes_flipped"],
        json!(["US-001"]),
        "{}",
        ledger[0]
    );
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("iteration 1 (") && !l.starts_with('▶'))
        .unwrap_or_else(|| panic!("no outcome line in:\n{stderr}"));
    assert!(
        line.starts_with("✓ ") && line.contains("· timeout, yet US-001 passes ·"),
        "{line}"
    );

    let report = env.ralph(&["report", "--json"]);
    assert_eq!(report.status.code(), Some(0), "{}", text(&report));
    let report: Value = serde_json::from_slice(&report.stdout).expect("report json");
    let story = &report["stories"][0];
    assert_eq!(story["last_outcome"], "timeout", "{story}");
    assert!(
        story["time_to_pass_s"].as_f64().is_some_and(|s| s > 0.0),
        "{story}"
    );
    let md = env.ralph(&["report", "--markdown"]);
    let md = String::from_utf8_lossy(&md.stdout);
    let row = md
        .lines()
        .find(|l| l.starts_with("| US-001 | Story 1 |"))
        .unwrap_or_else(|| panic!("no story row in:\n{md}"));
    let time_to_pass = row
        .trim_end_matches('|')
        .rsplit('|')
        .next()
        .unwrap_or("")
        .trim();
    assert!(!time_to_pass.is_empty(), "time to pass is blank: {row}");
}

/// `ralph stop` while the run waits for a usage limit's reset, after `ralph pause`: the run is
/// not paused (a pause holds only between iterations, after the wait) but waiting, and the stop
/// ends the wait at once. What `ralph stop` says is that, not "it is paused".
#[test]
fn stop_during_a_usage_limit_wait_after_a_pause_says_it_ends_the_wait() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 3000}},
        {"exit": 1}
    ]]}));
    let mut run = env.ralph_spawn(&["run"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !env.read(".ralph/state.json").contains("\"wait_until\"") {
        assert!(
            Instant::now() < deadline,
            "the run never waited for the reset:\n{}",
            env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pause = env.ralph(&["pause"]);
    assert_eq!(pause.status.code(), Some(0), "{}", text(&pause));
    // The pause says the run is waiting for the reset, and holds after it.
    let asked = String::from_utf8_lossy(&pause.stdout);
    assert!(
        asked.contains("waiting for a usage limit to reset until")
            && asked.contains("holds when that wait ends"),
        "{asked}"
    );
    let stop = env.ralph(&["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let said = String::from_utf8_lossy(&stop.stdout);
    assert!(
        said.contains("it is waiting for a usage limit to reset until")
            && said.contains("the wait ends at once")
            && !said.contains("paused"),
        "{said}"
    );
    let (code, _) = crate::common::wait_exit(&env, &mut run, Duration::from_secs(60));
    assert_eq!(code, 4, "{}", env.spawned_output());
    assert!(
        env.spawned_output()
            .contains("stopped by `ralph stop` while waiting for the usage limit to reset"),
        "{}",
        env.spawned_output()
    );
}
