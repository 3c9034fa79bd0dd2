//! Deadlines, signals and scale (issue 18, items 8–10): after a stop signal everything ralph
//! still does, notifications included, ends within `--shutdown-timeout`; a stop is heard during
//! long work on a big prd.json; `status` and one iteration stay linear in the number of stories.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, signal, wait_exit, wait_for, TestEnv};

/// A TCP server on 127.0.0.1 that accepts every connection and never answers (a dead webhook
/// behind a live load balancer). Lives as long as the test process; returns its URL.
fn silent_webhook() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn); // kept open, never read from or written to
        }
    });
    format!("http://127.0.0.1:{port}/hook")
}

fn notification_log(env: &TestEnv) -> Vec<Value> {
    env.read(".ralph/notifications.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("notifications.jsonl line"))
        .collect()
}

// Item 8: a SIGTERM to a run whose webhook accepts and never answers. Before the fix the
// notification's 3 attempts of 10 s and their backoffs held the exit for 33 s whatever
// --shutdown-timeout said (Kubernetes then SIGKILLs: 137, not 130). Now the run exits 130 within
// the timeout and says which notification did not go out.
#[test]
fn sigterm_with_a_webhook_that_never_answers_exits_within_the_shutdown_timeout() {
    let env = TestEnv::new(&prd_with_stories(1));
    let hook = silent_webhook();
    env.script(&json!({"invocations": [[
        {"write_file": {"path": "started", "content": ""}},
        {"sleep_ms": 60_000}
    ]]}));
    let mut child = env.ralph_spawn(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude",
        "--max-iter",
        "1",
        "--shutdown-timeout",
        "3s",
        "--notify-webhook",
        &hook,
    ]);
    wait_for(&env, "started", Duration::from_secs(30));
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let (code, took) = wait_exit(&env, &mut child, Duration::from_secs(40));
    let shown = env.spawned_output();
    assert_eq!(code, 130, "{shown}");
    assert!(
        took < Duration::from_secs(6),
        "exit took {took:?} after SIGTERM with --shutdown-timeout 3s:\n{shown}"
    );
    // The iteration is still written down.
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{shown}");
    assert_eq!(ledger[0]["outcome"], "interrupted");
    // The run_finished notification is recorded as undelivered, in the log and on stderr.
    let log = notification_log(&env);
    let finished: Vec<&Value> = log.iter().filter(|l| l["kind"] == "run_finished").collect();
    assert_eq!(finished.len(), 1, "{log:?}");
    assert_eq!(finished[0]["ok"], false, "{log:?}");
    assert_eq!(finished[0]["undelivered"], true, "{log:?}");
    let error = finished[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("--shutdown-timeout 3s after SIGTERM"),
        "{error}"
    );
    let warning = shown
        .lines()
        .find(|l| l.contains("the run_finished notification to webhook http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no warning about the notification:\n{shown}"));
    assert!(
        warning.contains("was not delivered")
            && warning.contains("--shutdown-timeout 3s after SIGTERM"),
        "{warning}"
    );
}

/// A prd.json of `n` stories `US-000001`…, the first half passing, each from the second on
/// depending on the one before (the shape that made dependency lookups quadratic), with three
/// criteria each: about 300 bytes a story.
fn big_prd(n: usize) -> Value {
    let stories: Vec<Value> = (1..=n)
        .map(|i| {
            let mut s = json!({
                "id": format!("US-{i:06}"),
                "title": format!("Story {i}"),
                "description": format!("As a user, I want item {i} so that the list is complete."),
                "acceptanceCriteria": [format!("File item-{i}.txt exists"), format!("It holds {i}"),
                    "Typecheck passes"],
                "priority": i,
                "passes": i <= n / 2,
                "notes": "",
            });
            if i > 1 {
                s["dependsOn"] = json!([format!("US-{:06}", i - 1)]);
            }
            s
        })
        .collect();
    json!({"project": "Scale", "branchName": "ralph/scale", "description": "Many stories",
        "userStories": stories})
}

/// Runs `ralph args` to its end, at most `within` (killed and failed past it); returns the exit
/// code, stdout, stderr and the wall time.
fn ralph_within(env: &TestEnv, args: &[&str], within: Duration) -> (i32, String, String, Duration) {
    let out = env.root.path().join("bounded.stdout");
    let err = env.root.path().join("bounded.stderr");
    let mut cmd = env.ralph_cmd(args);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    let started = Instant::now();
    let mut child = cmd.spawn().expect("start ralph");
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            use std::os::unix::process::ExitStatusExt as _;
            // Killed by a signal: the shell's 128 + n.
            break status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`ralph {}` did not finish within {within:?}; stderr:\n{}",
                args.join(" "),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    (code, read(&out), read(&err), started.elapsed())
}

// Item 10: `ralph status` and one iteration on 20,000 stories. Before the fix, status looked up
// each story's dependencies and status by scanning every story (57 s at 20,000 stories in a
// debug build, 666 s and killed at 200,000 in release), and an iteration compared prd.json story
// by story the same way (2.5 minutes in `prd_edits`). Both are linear now; the bounds here are
// loose (a debug build on a shared machine) but far below what quadratic work takes. The run
// also warns that prd.json and the prompt are unreasonably large, naming the limits.
#[test]
fn status_and_one_iteration_stay_linear_in_the_number_of_stories() {
    let n = 20_000;
    let env = TestEnv::new(&big_prd(n));
    let (code, stdout, stderr, took) = ralph_within(&env, &["status"], Duration::from_secs(30));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("10000/20000 stories pass"),
        "{}",
        &stdout[..stdout.len().min(500)]
    );
    assert!(
        stdout.contains("next story: US-010001 Story 10001"),
        "took {took:?}"
    );

    let (code, _, stderr, took) = ralph_within(
        &env,
        &[
            "run",
            "--agent",
            "exec",
            "--agent-cmd",
            "true",
            "--max-iter",
            "1",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(
        code,
        3,
        "took {took:?}: {}",
        &stderr[..stderr.len().min(2000)]
    );
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["story_id"], "US-010001");
    assert!(
        stderr.contains("is unreasonably large")
            && stderr.contains("20000 stories (ralph warns above 2.0 MiB or 1000 stories)"),
        "{}",
        &stderr[..stderr.len().min(2000)]
    );
    let prompt = stderr
        .lines()
        .filter(|l| l.contains("the rendered prompt is unreasonably large"))
        .collect::<Vec<_>>();
    assert_eq!(prompt.len(), 1, "said once: {prompt:?}");
    assert!(
        prompt[0].contains("ralph warns above 256.0 KiB"),
        "{prompt:?}"
    );
}

// Item 9: a SIGINT after the agent started, on a 20,000-story prd.json. The iteration is still
// recorded (interrupted) and ralph exits 130 within the default --shutdown-timeout; before the
// fix the inspection after the agent ran for minutes with the signal unanswered.
#[test]
fn sigint_during_a_big_prd_iteration_is_answered_within_the_shutdown_timeout() {
    let env = TestEnv::new(&big_prd(20_000));
    env.script(&json!({"invocations": [[
        {"write_file": {"path": "started", "content": ""}},
        {"sleep_ms": 60_000}
    ]]}));
    let mut child = env.ralph_spawn(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude",
        "--max-iter",
        "1",
        "--shutdown-timeout",
        "25s",
    ]);
    wait_for(&env, "started", Duration::from_secs(90));
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let (code, took) = wait_exit(&env, &mut child, Duration::from_secs(60));
    let shown = env.spawned_output();
    assert_eq!(code, 130, "{}", &shown[shown.len().saturating_sub(3000)..]);
    assert!(took < Duration::from_secs(25), "took {took:?}");
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["outcome"], "interrupted");
}

// Item 9: a SIGINT while ralph is still loading and validating a big prd.json (before any agent
// starts) stops the run there: exit 130, no agent started, no iteration recorded.
#[test]
fn sigint_while_loading_a_big_prd_stops_before_any_agent_starts() {
    let env = TestEnv::new(&big_prd(20_000));
    env.script(&json!({"invocations": [[
        {"write_file": {"path": "started", "content": ""}},
        {"sleep_ms": 60_000}
    ]]}));
    let mut child = env.ralph_spawn(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude",
        "--max-iter",
        "1",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let (code, took) = wait_exit(&env, &mut child, Duration::from_secs(60));
    let shown = env.spawned_output();
    assert_eq!(code, 130, "{}", &shown[shown.len().saturating_sub(3000)..]);
    assert!(took < Duration::from_secs(25), "took {took:?}");
    assert_eq!(env.agent_calls(), 0, "no agent may start after the signal");
    assert!(env.ledger().is_empty());
}
