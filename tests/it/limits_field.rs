//! Usage limits and fallback agents as a tester met them in the field (`--agent exec` scripts
//! and the fake claude/codex): a limit met on the last open story does not hold a complete
//! feature (serial and `--parallel`, and a rerun does not wait for it); `--parallel` iterations
//! that meet the same limit together are one limit (no stacked backoff, the stop reason and
//! state.json agree); an agent that cannot log in while every other agent is limited stops (or
//! waits) instead of running a limited one. Resets are relative times the agent states as it
//! acts, or clock times hours ahead: nothing depends on the time of day or on timing.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::common::{claude_clock_in, codex_auth, prd_with_stories, script_file, text, TestEnv};
use crate::fallback::{env_with, pairs, sequence};

/// An exec agent for every story: it logs the story, waits while `agents/<story>.wait` (bash)
/// does not hold, then (unless `agents/<story>.nochange` exists) writes `<story>.txt` and marks
/// the story passing in prd.json, and prints `agents/<story>.say` as its last lines.
struct Exec {
    env: TestEnv,
    dir: PathBuf,
    cmd: PathBuf,
}

impl Exec {
    fn new(stories: usize) -> Exec {
        let env = TestEnv::new(&prd_with_stories(stories));
        let dir = env.root.path().join("agents");
        std::fs::create_dir_all(&dir).expect("mkdir agents");
        let body = format!(
            r#"dir='{dir}'
prompt=$(cat)
story=$(printf '%s\n' "$prompt" | sed -n 's/^Story ID: //p' | head -n 1)
echo "$story" >> "$dir/calls.log"
if [ -f "$dir/$story.wait" ]; then
  for _ in $(seq 1800); do bash "$dir/$story.wait" && break; sleep 0.1; done
fi
if [ ! -f "$dir/$story.nochange" ]; then
  echo "$story" > "$story.txt"
  jq --arg id "$story" '(.userStories[] | select(.id == $id) | .passes) = true' prd.json > prd.json.tmp
  mv prd.json.tmp prd.json
fi
if [ -f "$dir/$story.say" ]; then cat "$dir/$story.say"; fi
exit 0
"#,
            dir = dir.display()
        );
        let cmd = script_file(&env, "agent.sh", &body);
        Exec { env, dir, cmd }
    }

    fn put(&self, name: &str, content: &str) {
        std::fs::write(self.dir.join(name), content).expect("write in agents/");
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn run(&self, extra: &[&str]) -> std::process::Output {
        let cmd = self.cmd.display().to_string();
        let mut args = vec![
            "run",
            "--agent",
            "exec",
            "--agent-cmd",
            &cmd,
            "--max-iter",
            "10",
        ];
        args.extend_from_slice(extra);
        self.env.ralph(&args)
    }
}

fn state(env: &TestEnv) -> Value {
    serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json")
}

fn time(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}")))
        .expect("rfc3339")
        .to_utc()
}

/// The limit claude prints with a reset three hours from now.
fn limit_line() -> String {
    format!(
        "You have hit your usage limit · resets {}\n",
        claude_clock_in(3)
    )
}

/// Every story passes and the limit was hit on the way: exit 0, and reruns (waiting or
/// `--no-wait`) find the feature complete without calling the agent or waiting.
fn assert_complete_despite_the_limit(x: &Exec, out: &std::process::Output) {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    let prd = x.env.prd();
    assert!(
        prd["userStories"]
            .as_array()
            .expect("stories")
            .iter()
            .all(|s| s["passes"] == true),
        "{prd}"
    );
    assert_eq!(state(&x.env)["stop_reason"]["kind"], "complete");
    let calls = x.calls().len();
    for extra in [&["--no-wait"][..], &[][..]] {
        let again = x.run(extra);
        assert_eq!(again.status.code(), Some(0), "{extra:?}: {}", text(&again));
        assert!(
            !text(&again).contains("waiting"),
            "{extra:?}: {}",
            text(&again)
        );
        assert_eq!(x.calls().len(), calls, "{extra:?}: the agent ran again");
    }
}

#[test]
fn a_limit_on_the_last_open_story_ends_a_serial_run_complete() {
    let x = Exec::new(2);
    x.put("US-002.say", &limit_line());
    let out = x.run(&["--no-wait"]);
    assert_eq!(x.calls(), ["US-001", "US-002"]);
    assert_complete_despite_the_limit(&x, &out);
}

#[test]
fn a_limit_on_the_last_open_story_ends_a_parallel_run_complete() {
    let x = Exec::new(2);
    // US-002 meets the limit and lands first; US-001 lands after it, the last open story.
    x.put("US-002.say", &limit_line());
    x.put(
        "US-001.wait",
        &format!(
            "git -C '{}' cat-file -e 'ralph/demo:US-002.txt' 2>/dev/null",
            x.env.repo.display()
        ),
    );
    let out = x.run(&["--parallel", "2", "--no-wait"]);
    assert_eq!(x.calls().len(), 2, "{}", text(&out));
    assert_complete_despite_the_limit(&x, &out);
}

#[test]
fn parallel_hits_of_the_same_limit_are_one_limit_without_stacked_backoff() {
    let x = Exec::new(3);
    let log = x.dir.join("calls.log");
    for id in ["US-001", "US-002", "US-003"] {
        x.put(&format!("{id}.nochange"), "");
        x.put(&format!("{id}.say"), "Usage limit reached · retry in 20s\n");
        // All three are running before any of them meets the limit.
        x.put(
            &format!("{id}.wait"),
            &format!("test \"$(wc -l < '{}')\" -ge 3", log.display()),
        );
    }
    let out = x.run(&["--parallel", "3", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(x.calls().len(), 3, "{}", text(&out));
    let st = state(&x.env);
    let kept = time(&st["resume_at"]);
    let stopped = time(&st["stop_reason"]["resume_at"]);
    assert_eq!(kept, stopped, "state.json and its stop reason: {st}");
    // 20 s stated; a stacked backoff made it 5 or 10 minutes.
    let ahead = (kept - chrono::Utc::now()).num_seconds();
    assert!(ahead <= 120, "resume_at is {ahead}s ahead: {st}");
}

/// claude's limit, resetting `in_s` seconds after the fake plays it.
fn claude_limit(in_s: i64) -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": in_s}},
        {"exit": 1}
    ])
}

fn codex_limit() -> Value {
    json!([{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}])
}

#[test]
fn an_auth_error_while_every_other_agent_is_limited_does_not_run_a_limited_agent() {
    let env = env_with(
        1,
        "[[agents]]\nname = \"authbad\"\nagent = \"codex\"\n\n[[agents]]\nname = \"lim2\"\nagent = \"codex\"\n",
    );
    env.script(&json!({"invocations": [
        claude_limit(3 * 3600),
        codex_auth(),
        codex_limit(),
        codex_auth(),
        codex_limit(),
    ]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(
        sequence(&env),
        pairs(&[
            ("claude", "usage_limit"),
            ("authbad", "auth_error"),
            ("lim2", "usage_limit"),
        ])
    );
    // The rerun tries authbad (not known to be limited); it cannot log in, and lim2's reset
    // (an hour) has not passed: the run stops without calling it.
    let again = env.ralph(&["run", "--no-wait"]);
    assert_eq!(again.status.code(), Some(75), "{}", text(&again));
    assert_eq!(env.agent_calls(), 4, "{}", text(&again));
    assert_eq!(sequence(&env)[3..], pairs(&[("authbad", "auth_error")])[..]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !stderr.contains("switching from authbad to lim2"),
        "{stderr}"
    );
    let st = state(&env);
    let resume = time(&st["stop_reason"]["resume_at"]);
    let ahead = (resume - chrono::Utc::now()).num_seconds();
    // lim2's reset (no time given: an hour), before claude's three hours.
    assert!((3000..=3700).contains(&ahead), "{ahead}s: {st}");
}

/// Under `--parallel`, a launch on another agent than the last one says so, as a serial run
/// does: "switching from exec to backup" on the terminal, and `agent_switched` in `--json`
/// (under `--parallel` it said nothing; only the ledger's agent field showed the switch).
#[test]
fn a_parallel_run_says_when_it_switches_to_the_fallback_agent() {
    let x = Exec::new(3);
    x.put("US-001.say", &limit_line());
    x.put("US-001.nochange", "");
    // The fallback runs the same agent without the limit line, and does the work.
    let primary = std::fs::read_to_string(&x.cmd).expect("agent.sh");
    let body = primary
        .trim_start_matches("#!/bin/bash\n")
        .replace(
            r#"if [ -f "$dir/$story.say" ]; then cat "$dir/$story.say"; fi"#,
            "",
        )
        .replace(
            r#"if [ ! -f "$dir/$story.nochange" ]; then"#,
            "if true; then",
        );
    let backup = script_file(&x.env, "backup.sh", &body);
    x.env.write(
        "ralph.toml",
        &format!(
            "fallback_agents = [\"backup\"]\n\n[[agents]]\nname = \"backup\"\nagent = \"exec\"\nagent_cmd = \"{}\"\n",
            backup.display()
        ),
    );
    x.env.git(&["add", "ralph.toml"]);
    x.env.git(&["commit", "-qm", "ralph.toml"]);
    // US-002 ends once US-001 has started (the wait script runs in a bash of its own).
    x.put(
        "US-002.wait",
        &format!("grep -q US-001 '{}/calls.log'", x.dir.display()),
    );
    let out = x.run(&["--parallel", "2", "--no-wait", "--json"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("switching from exec to backup"), "{said}");
    let switched: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "agent_switched")
        .collect();
    assert!(!switched.is_empty(), "no agent_switched event:\n{said}");
    assert_eq!(switched[0]["to"], "backup", "{:#}", switched[0]);
}

/// Ctrl-C during a usage-limit wait, when no agent runs: the notice says the run stops now,
/// not that "a running agent gets up to 5s to exit" (there is none to wait for).
#[test]
fn ctrl_c_during_a_usage_limit_wait_says_the_run_stops_now() {
    let env = env_with(
        1,
        "usage_limit_fallback = \"1h\"\nusage_limit_margin = \"0s\"\nfallback_agents = [\"codex\"]\n",
    );
    env.script(&json!({"invocations": [claude_limit(3600), codex_limit()]}));
    let mut child = env.ralph_spawn(&["run"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !env.spawned_output().contains("waiting for the usage limit") {
        assert!(
            std::time::Instant::now() < deadline,
            "no wait began:\n{}",
            env.spawned_output()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    crate::common::signal(&child, nix::sys::signal::Signal::SIGINT);
    crate::common::wait_exit(&env, &mut child, std::time::Duration::from_secs(120));
    let out = env.spawned_output();
    assert!(
        out.contains("ralph: stopping — no agent is running, so the run stops now."),
        "{out}"
    );
    assert!(!out.contains("gets up to"), "{out}");
    assert_eq!(env.agent_calls(), 2, "{out}");
}

/// A usage-limit reset belongs to the agent as it was configured when it met the limit: an exec
/// agent running another command is not held by it (it shared the reset by the name `exec`).
#[test]
fn a_limit_met_by_one_exec_command_does_not_hold_another() {
    let x = Exec::new(2);
    // The first command meets a limit three hours out on US-001 (the story stays open).
    x.put("US-001.nochange", "");
    x.put("US-001.say", &limit_line());
    let out = x.run(&["--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(state(&x.env)["resume_at"].is_string(), "{}", state(&x.env));
    // Another command (the same script behind a different command line) is not limited.
    std::fs::remove_file(x.dir.join("US-001.nochange")).expect("rm nochange");
    std::fs::remove_file(x.dir.join("US-001.say")).expect("rm say");
    let other = format!("bash {}", x.cmd.display());
    let out = x.env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &other,
        "--max-iter",
        "10",
        "--no-wait",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(x.calls(), ["US-001", "US-001", "US-002"], "{}", text(&out));
}
