//! `ralph watch` in a real terminal (a tmux pane read with `capture-pane`) beside a run of a slow
//! scripted agent, and its plain snapshot when stdout is not a terminal.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{prd_with_stories, text, TestEnv};

/// A private tmux server for one test, killed when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn new(dir: &Path) -> Tmux {
        let found = Command::new("tmux").arg("-V").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "tmux is not installed: the real-terminal test of `ralph watch` needs it; run scripts/install-test-deps.sh (it installs tmux)"
        );
        Tmux {
            socket: dir.join("tmux.sock"),
        }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .output()
            .expect("tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "w"]).stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "w"]).status.success()
    }

    /// Starts `ralph watch` ([`watch_script`]) in an 80×24 session `w`.
    fn start_watch(&self, env: &TestEnv) {
        let script = watch_script(env);
        let started = self.run(&[
            "new-session",
            "-d",
            "-x",
            "80",
            "-y",
            "24",
            "-s",
            "w",
            script.to_str().unwrap(),
        ]);
        assert!(started.status.success(), "{}", text(&started));
    }

    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{what} never showed:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A shell script that starts `ralph watch` in the repository with the test's environment.
fn watch_script(env: &TestEnv) -> PathBuf {
    let mut body = String::from("#!/bin/sh\n");
    for (k, v) in env.envs() {
        body.push_str(&format!("export {k}='{v}'\n"));
    }
    body.push_str("export TERM=xterm-256color\n");
    body.push_str(&format!(
        "cd '{}' && exec '{}' watch\n",
        env.repo.display(),
        crate::common::ralph_bin()
    ));
    let path = env.root.path().join("watch.sh");
    std::fs::write(&path, body).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

const HINT: &str = "keep the public API unchanged";

#[test]
fn watch_in_a_terminal_shows_the_run_takes_a_hint_and_quits_without_stopping_it() {
    let env = TestEnv::new(&prd_with_stories(2));
    let tmux = Tmux::new(env.root.path());
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"claude_text": "Looking at the parser first."},
            {"claude_tool": {"name": "Bash", "input": {"command": "cargo test --watch-marker"}, "result": "ok"}},
            {"write_file": {"path": "../started-1", "content": "x\n"}},
            {"sleep_ms": 8000},
            {"write_file": {"path": "file-1.txt", "content": "x\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"git_commit": "feat: US-001"},
            {"claude_result": {"text": "done"}}
        ],
        [
            {"claude_init": {}},
            {"save_stdin": "../prompt-2.txt"},
            {"write_file": {"path": "file-2.txt", "content": "x\n"}},
            {"set_passes": {"id": "US-002", "passes": true}},
            {"git_commit": "feat: US-002"},
            {"claude_result": {"text": "done"}}
        ]
    ]}));
    let mut run = env.ralph_spawn(&["run"]);
    tmux.start_watch(&env);
    // The story list, the running iteration and its last tool call.
    let screen = tmux.wait_for("the running iteration's tool call", |s| {
        s.contains("Bash: cargo test --watch-marker")
    });
    assert!(
        screen.contains("US-001 Story 1") && screen.contains("US-002 Story 2"),
        "{screen}"
    );
    assert!(screen.contains("iteration 1 · US-001"), "{screen}");
    assert!(screen.contains("running (pid"), "{screen}");
    assert!(screen.contains("Stories 0/2 passed"), "{screen}");

    // h, the hint, Enter: saved for the next iteration.
    tmux.run(&["send-keys", "-t", "w", "h"]);
    tmux.wait_for("the hint prompt", |s| s.contains("hint>"));
    tmux.run(&["send-keys", "-t", "w", "-l", HINT]);
    tmux.run(&["send-keys", "-t", "w", "Enter"]);
    let screen = tmux.wait_for("the saved hint", |s| s.contains("hint 1 saved"));
    // The message and the keys share the bottom line, within the 80 columns.
    let line = screen
        .lines()
        .find(|l| l.contains("hint 1 saved"))
        .unwrap_or_default();
    assert!(
        line.trim_end().chars().count() <= 80 && line.contains("q quit"),
        "the key line lost its keys: {line:?}\n{screen}"
    );
    let list = env.ralph(&["hint", "--list"]);
    assert!(text(&list).contains(HINT), "{}", text(&list));

    // q leaves the view; the run goes on.
    tmux.run(&["send-keys", "-t", "w", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux.alive() {
        assert!(
            Instant::now() < deadline,
            "q did not quit:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        run.try_wait().unwrap().is_none(),
        "quitting the view ended the run"
    );
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", env.spawned_output());
    let prompt = std::fs::read_to_string(env.root.path().join("prompt-2.txt")).unwrap();
    assert!(prompt.contains(HINT), "{prompt}");
    assert_eq!(env.ledger()[1]["hints"][0]["text"], HINT);
}

#[test]
fn watch_without_a_terminal_prints_one_snapshot_of_the_last_run() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"write_file": {"path": "file-1.txt", "content": "x\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"git_commit": "feat: US-001"},
            {"claude_result": {"text": "done"}}
        ]
    ]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--max-cost", "3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    env.ralph(&["hint", "--story", "US-002", "mind the edge cases"]);
    let out = env.ralph(&["watch"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "ralph watch · last run ended ",
        " UTC: max iterations · ",
        "Stories 1/2 passed",
        "✓ US-001 Story 1",
        "· US-002 Story 2",
        "#1 US-001 story_passed",
        "iterations 1/1 · cost $0.01/$3.00",
        "hints pending: 1 [US-002] mind the edge cases",
        "stopped: --max-iter 1 reached",
    ] {
        assert!(shown.contains(needle), "missing {needle:?} in:\n{shown}");
    }
    // No escape sequences, no key line.
    assert!(
        !shown.contains('\u{1b}') && !shown.contains("q quit"),
        "{shown}"
    );
}

/// A run that waits to try a story again after a transient failure: `ralph watch` counts down to
/// the retry, and the wait is gone from state.json once the run goes on.
#[test]
fn watch_counts_down_to_a_retry_after_a_transient_failure() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "transient_backoff = \"30s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"claude_result": {"text": "API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}", "is_error": true, "terminal_reason": "api_error"}},
            {"exit": 1}
        ]
    ]}));
    let mut child = env.ralph_spawn(&["run"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let retry_at = loop {
        let state = std::fs::read_to_string(env.path(".ralph/state.json")).unwrap_or_default();
        let state: serde_json::Value = serde_json::from_str(&state).unwrap_or_default();
        if let Some(at) = state["retry_at"].as_str() {
            break chrono::DateTime::parse_from_rfc3339(at).expect("rfc3339");
        }
        assert!(
            Instant::now() < deadline,
            "no retry_at in state.json:\n{}",
            env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let ahead = retry_at.timestamp() - chrono::Utc::now().timestamp();
    // 30 s and its jitter.
    assert!((1..=60).contains(&ahead), "retry in {ahead}s");
    let out = env.ralph(&["watch"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("transient failure: tries again in"),
        "{shown}"
    );
    // `ralph stop` ends the wait; the run ends and the wait is no longer on record.
    let stop = env.ralph(&["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let (code, _) = crate::common::wait_exit(&env, &mut child, Duration::from_secs(30));
    assert_ne!(code, -1, "{}", env.spawned_output());
    let state = env.state();
    assert!(state.get("retry_at").is_none(), "{state}");
}

/// Installs as `claude` a wrapper that plays, for the story named in its prompt, the fake agent's
/// `<story>-1.json` (a tool call naming the story), marks `started-<story>` beside the
/// repository, waits until the test creates `go-<story>` there, then plays `<story>-2.json` (the
/// story's work and commit). Each story's agent is slow until the test lets it go, whatever the
/// order in which the workers start.
fn per_story_claude(env: &TestEnv, stories: &[&str]) {
    let dir = env.root.path();
    for id in stories {
        let first = json!({"invocations": [[
            {"claude_init": {}},
            {"claude_tool": {"name": "Bash", "input": {"command": format!("make {id} --lane")}, "result": "ok"}}
        ]]});
        let n = id.trim_start_matches("US-").trim_start_matches('0');
        let second = json!({"invocations": [[
            {"write_file": {"path": format!("file-{n}.txt"), "content": "x\n"}},
            {"set_passes": {"id": id, "passes": true}},
            {"git_commit": format!("feat: {id}")},
            {"claude_result": {"text": "done"}}
        ]]});
        std::fs::write(dir.join(format!("{id}-1.json")), first.to_string()).unwrap();
        std::fs::write(dir.join(format!("{id}-2.json")), second.to_string()).unwrap();
    }
    let body = format!(
        r#"#!/bin/bash
dir='{dir}'
if [ "$1" = --version ]; then echo '2.1.332 (Claude Code)'; exit 0; fi
story=$(cat | sed -n 's/^Story ID: //p' | head -n 1)
RALPH_FAKE_SCRIPT="$dir/$story-1.json" '{fake}' || exit 97
touch "$dir/started-$story"
for _ in $(seq 1200); do [ -f "$dir/go-$story" ] && break; sleep 0.1; done
RALPH_FAKE_SCRIPT="$dir/$story-2.json" exec '{fake}'
"#,
        dir = dir.display(),
        fake = crate::common::fake_agent_bin()
    );
    let claude = env.bin.join("claude");
    std::fs::remove_file(&claude).unwrap();
    std::fs::write(&claude, body).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `ralph status` says `says` and not `not`; `ralph status --json` has a pause requested,
/// `pausing` iterations finishing and `paused` as given.
fn assert_pause_status(env: &TestEnv, says: &str, not: &str, pausing: u64, paused: bool) {
    let status = text(&env.ralph(&["status"]));
    assert!(status.contains(says), "{status}");
    assert!(!status.contains(not), "{status}");
    let doc: serde_json::Value =
        serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        (&doc["pause_requested"], &doc["pausing"], &doc["paused"]),
        (&json!(true), &json!(pausing), &json!(paused)),
        "{doc}"
    );
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--parallel 2` with two slow agents: the view in a terminal and its plain snapshot show both
/// flights (worker, story, last action); `ralph pause` reads as "pausing: 2 iterations
/// finishing" in `ralph status` and in the view until both have landed, and as paused after.
#[test]
fn watch_and_status_show_every_parallel_flight_and_a_pause_that_waits_for_them() {
    let env = TestEnv::new(&prd_with_stories(3));
    let tmux = Tmux::new(env.root.path());
    per_story_claude(&env, &["US-001", "US-002", "US-003"]);
    let root = env.root.path().to_path_buf();
    let mut run = env.ralph_spawn(&["run", "--json", "--parallel", "2"]);
    wait_until("both agents started", || {
        root.join("started-US-001").exists() && root.join("started-US-002").exists()
    });
    tmux.start_watch(&env);
    // Both lanes: their worker, story and last action.
    let screen = tmux.wait_for("both flights' tool calls", |s| {
        s.contains("Bash: make US-001 --lane") && s.contains("Bash: make US-002 --lane")
    });
    for id in ["US-001", "US-002"] {
        assert!(
            screen
                .lines()
                .any(|l| l.contains(&format!("· {id} · w")) && l.contains("iteration ")),
            "no lane line for {id}:\n{screen}"
        );
    }
    assert!(screen.contains("Running (parallel)"), "{screen}");

    // The plain snapshot (stdout not a terminal) shows every flight too.
    let out = env.ralph(&["watch"]);
    let plain = String::from_utf8_lossy(&out.stdout).into_owned();
    for id in ["US-001", "US-002"] {
        assert!(
            plain.contains(&format!("Bash: make {id} --lane")),
            "the plain snapshot lost {id}'s flight:\n{plain}"
        );
        assert!(plain.contains(&format!("· {id} · w")), "{plain}");
    }

    // A pause while both are in flight: pausing, not paused.
    let out = env.ralph(&["pause"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_pause_status(&env, "pausing: 2 iterations finishing", "paused:", 2, false);
    tmux.wait_for("the view's pausing", |s| {
        s.contains("pausing: 2 iterations finishing")
    });
    let plain = String::from_utf8_lossy(&env.ralph(&["watch"]).stdout).into_owned();
    assert!(
        plain.contains("pausing: 2 iterations finishing") && !plain.contains("PAUSED"),
        "{plain}"
    );

    // Both land; then the run holds, and status and the view say paused.
    std::fs::write(root.join("go-US-001"), "").unwrap();
    std::fs::write(root.join("go-US-002"), "").unwrap();
    wait_until("the paused event", || {
        env.spawned_output().contains(r#""event":"paused""#)
    });
    assert_pause_status(&env, "paused: no new iteration starts", "pausing", 0, true);
    tmux.wait_for("the view's PAUSED", |s| s.contains("PAUSED"));
    assert_eq!(env.ledger().len(), 2, "{}", env.spawned_output());
    assert!(
        !root.join("started-US-003").exists(),
        "a story started while paused"
    );

    tmux.run(&["send-keys", "-t", "w", "q"]);
    assert_eq!(env.ralph(&["stop"]).status.code(), Some(0));
    let (code, _) = crate::common::wait_exit(&env, &mut run, Duration::from_secs(60));
    assert_eq!(code, 4, "{}", env.spawned_output());
}

/// `ralph watch` on a finished run in a real terminal: the key line offers only the keys that
/// act (a hint for the next run, quit), not pause or stop, which have no run to act on.
#[test]
fn watch_on_a_finished_run_offers_only_the_keys_that_act() {
    let env = TestEnv::new(&prd_with_stories(1));
    let tmux = Tmux::new(env.root.path());
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "file-1.txt", "content": "x\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    tmux.start_watch(&env);
    let screen = tmux.wait_for("the ended run and its key line", |s| {
        s.contains("last run ended") && s.contains("q quit")
    });
    let keys = screen
        .lines()
        .find(|l| l.contains("q quit"))
        .unwrap_or_default();
    assert!(
        keys.contains("h hint") && !keys.contains("pause") && !keys.contains("s stop"),
        "a finished run's key line offers keys that do nothing: {keys:?}\n{screen}"
    );
    tmux.run(&["send-keys", "-t", "w", "q"]);
}
