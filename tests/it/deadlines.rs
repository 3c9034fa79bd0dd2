//! Deadlines, signals and scale (issue 18, items 8–10): after a stop signal everything ralph
//! still does, notifications included, ends within `--shutdown-timeout`; a stop is heard during
//! long work on a big prd.json; `status` and one iteration stay linear in the number of stories.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, TestEnv};

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

/// Waits until `path` exists (the agent started), at most `within`.
fn wait_for(env: &TestEnv, rel: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !env.path(rel).exists() {
        assert!(
            Instant::now() < deadline,
            "{rel} never appeared:\n{}",
            env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &std::process::Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).expect("kill");
}

/// Waits for `child` to exit, at most `within`; kills it and fails the test past that.
fn wait_exit(env: &TestEnv, child: &mut std::process::Child, within: Duration) -> (i32, Duration) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (status.code().unwrap_or(-1), started.elapsed());
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ralph did not exit within {within:?} of the signal:\n{}",
                env.spawned_output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
