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
}

/// Waits until `path` exists (at most 30 s), naming `what` when it never appears.
fn wait_for(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is gone or a zombie.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Waits (at most 5 s) for `pid` to be gone.
fn gone_soon(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dead(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn sigkill(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// ralph is SIGKILLed while its verify gate runs the story's check, which has started a child
/// of its own. The check's child carries the iteration's tag, so the restart's sweep kills it
/// and lists it in the interrupted iteration's record. The restart then runs the check on the
/// work the iteration left instead of setting the story back and running the agent again: the
/// check passes, the story stays passing, the ledger says the check ran at the restart, and the
/// run is complete without another agent call.
#[test]
fn a_restart_checks_the_work_an_iteration_killed_in_its_verify_gate_left() {
    let mut prd = prd_with_stories(1);
    // The first run of the check starts a long child and waits for it (ralph is killed then);
    // the second is the real check.
    prd["userStories"][0]["verify"] = json!(
        "if [ -e ../verify-ran ]; then test -f file-1.txt; else touch ../verify-ran; sleep 300 & echo $! > ../verify-child.pid; wait; fi"
    );
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [crate::run_cases::claude_story("US-001", 1, "done")]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "3"]);
    let pid_file = env.root.path().join("verify-child.pid");
    wait_for(&pid_file, "the check's child");
    std::thread::sleep(Duration::from_millis(100));
    let check_child: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The check's child is tagged like the agent's processes.
    let environ = std::fs::read(format!("/proc/{check_child}/environ")).unwrap_or_default();
    let tagged = environ
        .split(|b| *b == 0)
        .any(|kv| kv.starts_with(b"RALPH_AGENT_TAG="));
    sigkill(child.id());
    child.wait().unwrap();
    if !tagged {
        sigkill(check_child as u32);
    }
    assert!(
        tagged,
        "the verify command's child carries no RALPH_AGENT_TAG"
    );
    assert!(!dead(check_child), "the check's child died with ralph");

    let out = env.ralph(&["run", "--max-iter", "3"]);
    let alive = !gone_soon(check_child);
    if alive {
        sigkill(check_child as u32);
    }
    assert!(
        !alive,
        "the restart left the check's child running: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.agent_calls(), 1, "the agent ran again: {}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let r = &ledger[0];
    assert_eq!(r["outcome"], "interrupted", "{r}");
    assert_eq!(r["checked_at_restart"], true, "{r}");
    assert_eq!(r["verify"][0]["story_id"], "US-001", "{r}");
    assert_eq!(r["verify"][0]["passed"], true, "{r}");
    assert_eq!(r["passes_flipped"], json!(["US-001"]), "{r}");
    assert_eq!(r["passes_reverted"], json!([]), "{r}");
    let strays = r["strays"].as_array().expect("strays");
    assert!(
        strays.iter().any(|s| s["pid"] == check_child
            && s["command"] == "sleep 300"
            && s["found"] == "at_restart"),
        "{r}"
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("the restart ran the check on the work the iteration left and it passed"),
        "{r}"
    );
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
    let show =
        String::from_utf8_lossy(&env.ralph(&["show", "1", "--no-pager"]).stdout).into_owned();
    assert!(
        show.contains("verify (run by the restart, on the work this interrupted iteration left)\n  US-001: `if [ -e ../verify-ran ]"),
        "{show}"
    );
    assert!(
        show.contains(&format!("pid {check_child} `sleep 300` (by the restart)")),
        "{show}"
    );
    assert!(
        stderr(&out).contains("US-001 passed its check on the work the interrupted iteration left"),
        "{}",
        text(&out)
    );
}

/// The same kill, but the work left does not pass the check: the story goes back to not
/// passing with the check's result in the record, and the next attempt is told why.
#[test]
fn a_restart_sets_back_a_story_whose_check_fails_on_the_work_left() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!(
        "if [ -e ../verify-ran ]; then test -f missing.txt; else touch ../verify-ran; sleep 300; fi"
    );
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [
        crate::run_cases::claude_story("US-001", 1, "done"),
        [{"claude_init": {}}, {"save_stdin": "../stdin-2.txt"}, {"claude_result": {"text": "Looked around."}}]
    ]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
    wait_for(&env.root.path().join("verify-ran"), "the check");
    std::thread::sleep(Duration::from_millis(100));
    sigkill(child.id());
    child.wait().unwrap();
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let r = &env.ledger()[0];
    assert_eq!(r["outcome"], "interrupted", "{r}");
    assert_eq!(r["checked_at_restart"], true, "{r}");
    assert_eq!(r["verify"][0]["passed"], false, "{r}");
    assert_eq!(r["verify"][0]["result"], "exited with code 1", "{r}");
    assert_eq!(r["passes_reverted"], json!(["US-001"]), "{r}");
    assert_eq!(env.prd()["userStories"][0]["passes"], false);
    // The next attempt's prompt says what the check said.
    let prompt = env.read("../stdin-2.txt");
    assert!(
        prompt.contains("on restart it ran the check (`if [ -e ../verify-ran ]"),
        "{prompt}"
    );
}

/// A process the agent left running after it exited (started in a session of its own, so
/// nothing links it to the agent any more) is killed by its tag, and its pid and command are
/// in the iteration's record, not only on stderr.
#[test]
fn a_stray_killed_after_an_iteration_is_in_its_record() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"spawn_grandchild": {"sleep_s": 300, "setsid": true, "pid_file": "../stray.pid"}},
        {"write_file": {"path": "file-1.txt", "content": "x\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    let pid: i32 = std::fs::read_to_string(env.root.path().join("stray.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = !gone_soon(pid);
    if alive {
        sigkill(pid as u32);
    }
    assert!(!alive, "the stray survived: {}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = &env.ledger()[0];
    assert_eq!(
        r["strays"],
        json!([{"pid": pid, "command": "sleep 300", "found": "after_agent"}]),
        "{r}"
    );
    assert!(
        stderr(&out).contains(&format!(
            "iteration 1: killed 1 process the agent left running: pid {pid} (sleep 300)"
        )),
        "{}",
        text(&out)
    );
    let show = env.ralph(&["show", "1", "--no-pager"]);
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&format!(
            "left running, killed by ralph\n  pid {pid} `sleep 300` (after the agent exited)"
        )),
        "{}",
        text(&show)
    );
}

/// One rule for a story marked passing by an iteration that a stop cut short, whatever the
/// signal: it passes only on a check that ran to its end, so a story with no check at all goes
/// back to not passing after SIGTERM (the stop reaches the verify gate) exactly as after
/// SIGKILL (the restart judges it).
#[test]
fn sigkill_and_sigterm_set_back_an_unchecked_story_alike() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        // No `verify` on the story and no --verify.
        let env = TestEnv::new(&prd_with_stories(1));
        env.script(&json!({"invocations": [[
            {"claude_init": {}},
            {"write_file": {"path": "file-1.txt", "content": "x\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"write_file": {"path": "../agent-started", "content": "x"}},
            {"sleep_ms": 60_000}
        ], [{"claude_init": {}}, {"claude_result": {"text": "Looked around."}}]]}));
        let mut child = env.ralph_spawn(&["run", "--max-iter", "1"]);
        wait_for(&env.root.path().join("agent-started"), "the agent's mark");
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        child.wait().unwrap();
        if signal == Signal::SIGKILL {
            let out = env.ralph(&["run", "--max-iter", "1"]);
            assert_eq!(out.status.code(), Some(3), "{signal}: {}", text(&out));
            assert!(
                stderr(&out).contains("US-001 (it has no check (no `verify`, no --verify)"),
                "{}",
                text(&out)
            );
        }
        let r = &env.ledger()[0];
        assert_eq!(r["outcome"], "interrupted", "{signal}: {r}");
        assert_eq!(r["passes_flipped"], json!([]), "{signal}: {r}");
        let findings = r["findings"].to_string();
        assert!(
            findings.contains("US-001") && findings.contains("back to"),
            "{signal}: the record says the mark was undone: {r}"
        );
        // The work is kept in the checkpoint either way; only the mark is undone.
        assert_eq!(env.read("file-1.txt"), "x\n", "{signal}");
        assert_eq!(
            env.prd()["userStories"][0]["passes"],
            false,
            "{signal}: the agent's word was taken from an interrupted iteration"
        );
    }
}

/// Reads a pid a test script wrote.
fn read_pid(env: &TestEnv, file: &str) -> i32 {
    std::fs::read_to_string(env.root.path().join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

/// Kills `pid` if it is still alive and says whether it was gone (within 5 s).
fn gone_or_kill(pid: i32) -> bool {
    let gone = gone_soon(pid);
    if !gone {
        sigkill(pid as u32);
    }
    gone
}

/// A verify command that leaves a process running in a session of its own (setsid): after the
/// check, ralph kills it by the iteration's tag, says so, lists it in the iteration's record as
/// `after_verify`, and `ralph show` lists it.
#[test]
fn a_process_a_verify_command_left_running_is_killed_and_recorded() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!(
        "(setsid sleep 302 >/dev/null 2>&1 & echo $! > ../verify-stray.pid); sleep 0.2; test -f file-1.txt"
    );
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [crate::run_cases::claude_story("US-001", 1, "done")]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    let pid = read_pid(&env, "verify-stray.pid");
    assert!(
        gone_or_kill(pid),
        "the check's `sleep 302` outlived ralph: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = &env.ledger()[0];
    assert_eq!(r["outcome"], "story_passed", "{r}");
    assert_eq!(
        r["strays"],
        json!([{"pid": pid, "command": "sleep 302", "found": "after_verify"}]),
        "{r}"
    );
    assert!(
        stderr(&out).contains(&format!(
            "iteration 1: killed 1 process US-001's check left running: pid {pid} (sleep 302)"
        )),
        "{}",
        text(&out)
    );
    let show = env.ralph(&["show", "1", "--no-pager"]);
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&format!(
            "left running, killed by ralph\n  pid {pid} `sleep 302` (after a verify command)"
        )),
        "{}",
        text(&show)
    );
}

/// ralph is SIGKILLed while its verify gate runs, after it killed a process the agent left
/// running. The restart's record of the interrupted iteration still lists that process (it was
/// saved with the in-flight iteration when it was killed), and what the check the restart runs
/// leaves running is killed and listed too: nothing outlives the restart.
#[test]
fn a_restart_records_every_stray_and_leaves_none_of_its_own_check() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!(
        "if [ -e ../verify-ran ]; then (setsid sleep 301 >/dev/null 2>&1 & echo $! > ../restart-stray.pid); sleep 0.2; test -f file-1.txt; else touch ../verify-ran; sleep 300; fi"
    );
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"spawn_grandchild": {"sleep_s": 299, "setsid": true, "pid_file": "../agent-stray.pid"}},
        {"write_file": {"path": "file-1.txt", "content": "x\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "3"]);
    wait_for(&env.root.path().join("verify-ran"), "the check");
    std::thread::sleep(Duration::from_millis(200));
    sigkill(child.id());
    child.wait().unwrap();
    let agent_stray = read_pid(&env, "agent-stray.pid");
    assert!(dead(agent_stray), "{}", env.spawned_output());

    let out = env.ralph(&["run", "--max-iter", "3"]);
    let restart_stray = read_pid(&env, "restart-stray.pid");
    assert!(
        gone_or_kill(restart_stray),
        "the restart's own check left `sleep 301` running: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = &env.ledger()[0];
    assert_eq!(r["outcome"], "interrupted", "{r}");
    let strays = r["strays"].as_array().expect("strays");
    let has = |pid: i32, command: &str, found: &str| {
        strays
            .iter()
            .any(|s| s["pid"] == pid && s["command"] == command && s["found"] == found)
    };
    assert!(has(agent_stray, "sleep 299", "after_agent"), "{r}");
    assert!(has(restart_stray, "sleep 301", "after_verify"), "{r}");
    assert!(
        strays
            .iter()
            .any(|s| s["command"] == "sleep 300" && s["found"] == "at_restart"),
        "{r}"
    );
    assert!(
        stderr(&out).contains(&format!(
            "killed 1 process US-001's check left running: pid {restart_stray} (sleep 301)"
        )),
        "{}",
        text(&out)
    );
}

/// SIGTERM while the verify gate runs the story's check: the iteration's outcome is
/// `interrupted` (its check was cut short), the story is not passing, and the stop sentence
/// says the current iteration was stopped, not "between iterations".
#[test]
fn sigterm_during_the_verify_gate_interrupts_the_iteration() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] =
        json!("touch ../verify-started; sleep 20; test -f file-1.txt");
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [crate::run_cases::claude_story("US-001", 1, "done")]}));
    let mut child = env.ralph_spawn(&["run", "--max-iter", "2"]);
    wait_for(&env.root.path().join("verify-started"), "the check");
    std::thread::sleep(Duration::from_millis(200));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let printed = env.spawned_output();
    assert_eq!(status.code(), Some(130), "{printed}");
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["outcome"], "interrupted", "{}", ledger[0]);
    assert_eq!(env.prd()["userStories"][0]["passes"], false);
    assert!(!printed.contains("between iterations"), "{printed}");
    assert!(
        printed.contains("interrupted: the current iteration was stopped and checkpointed"),
        "{printed}"
    );
}

/// git's automatic housekeeping stays in the foreground for the agent and its checks
/// (`maintenance.autoDetach=false`, `gc.autoDetach=false` through GIT_CONFIG_COUNT), after the
/// settings the user already passes that way, which still apply.
#[test]
fn agent_and_verify_git_keeps_its_housekeeping_in_the_foreground() {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!(
        "for k in maintenance.autoDetach gc.autoDetach user.mine; do git config --get $k; done > ../verify-git.txt; test -f file-1.txt"
    );
    let env = TestEnv::new(&prd);
    env.script(&json!({
        "record_env": ["GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_KEY_1",
            "GIT_CONFIG_VALUE_1", "GIT_CONFIG_KEY_2", "GIT_CONFIG_VALUE_2"],
        "invocations": [crate::run_cases::claude_story("US-001", 1, "done")]
    }));
    let mut cmd = env.ralph_cmd(&["run", "--max-iter", "1"]);
    cmd.env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "user.mine")
        .env("GIT_CONFIG_VALUE_0", "kept");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        env.read("../verify-git.txt"),
        "false\nfalse\nkept\n",
        "{}",
        text(&out)
    );
    let calls = std::fs::read_to_string(format!("{}.calls.jsonl", env.script.display())).unwrap();
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(
        call["env"],
        json!({"CLAUDECODE": null, "CLAUDE_CODE_ENTRYPOINT": null, "CLAUDE_CODE_SSE_PORT": null,
            "IS_SANDBOX": call["env"]["IS_SANDBOX"], "NO_COLOR": "1",
            "GIT_CONFIG_COUNT": "3", "GIT_CONFIG_KEY_0": "user.mine",
            "GIT_CONFIG_KEY_1": "maintenance.autoDetach", "GIT_CONFIG_VALUE_1": "false",
            "GIT_CONFIG_KEY_2": "gc.autoDetach", "GIT_CONFIG_VALUE_2": "false"}),
        "{call}"
    );
}
