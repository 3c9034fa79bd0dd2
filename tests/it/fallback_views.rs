//! What a user sees of fallback agents: the live line and the outcome line of each iteration
//! name the agent (its profile name) that ran it, `ralph status`'s latest-run table has an AGENT
//! column, and a crashed iteration recovered at restart is booked on the agent it ran on.
//! A run with one agent shows none of this (its output is as it was).

use serde_json::{json, Value};

use crate::common::{codex_auth, text};
use crate::fallback::{codex_story, env_with};

/// claude's 5-hour limit, resetting an hour after the fake plays it (so the run stays on the
/// fallback for the rest of the test).
fn claude_limit() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 3600}},
        {"exit": 1}
    ])
}

const BACKUP: &str = "[[agents]]\nname = \"backup\"\nagent = \"codex\"\n";

#[test]
fn the_live_line_the_outcome_line_and_status_name_the_fallback_agent() {
    let env = env_with(2, BACKUP);
    env.script(&json!({"invocations": [
        claude_limit(),
        codex_story("US-001", 0),
        codex_story("US-002", 0),
    ]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = |prefix: &str| {
        stderr
            .lines()
            .find(|l| l.contains(prefix) && (prefix.starts_with('▶') || !l.starts_with('▶')))
            .unwrap_or_else(|| panic!("no line with {prefix:?} in:\n{stderr}"))
            .to_owned()
    };
    // The live line: the agent's profile name and its backend.
    let started = line("▶ iteration 2 ");
    assert!(started.ends_with("· backup (codex)"), "{started}");
    // The primary's name is the backend's: said once.
    let first = line("▶ iteration 1 ");
    assert!(first.ends_with("· claude"), "{first}");
    // The outcome lines name the agent too.
    let done = line("iteration 2 (");
    assert!(
        done.contains("US-001 · backup (codex) · story_passed"),
        "{done}"
    );
    let limited = line("iteration 1 (");
    assert!(
        limited.contains("US-001 · claude · usage_limit"),
        "{limited}"
    );

    // `ralph status`: an AGENT column, each row its iteration's agent.
    let status = env.ralph(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    let header = status
        .lines()
        .find(|l| l.trim_start().starts_with("# "))
        .unwrap_or_else(|| panic!("no table in:\n{status}"));
    assert!(header.contains("AGENT  STORY"), "{status}");
    let row = |n: u32| {
        status
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{n} ")))
            .unwrap_or_else(|| panic!("no row {n} in:\n{status}"))
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row(1), "1 claude US-001 usage_limit", "{status}");
    assert_eq!(row(2), "2 backup US-001 story_passed", "{status}");
    assert_eq!(row(3), "3 backup US-002 story_passed", "{status}");
}

#[test]
fn a_run_with_one_agent_names_no_agent_and_status_has_no_agent_column() {
    let env = env_with(1, "");
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": "US-001.txt", "content": "claude\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"git_commit": "feat: US-001"},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("· US-001 · story_passed ·"),
        "the outcome line names no agent:\n{stderr}"
    );
    let status = env.ralph(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(!status.contains("AGENT"), "{status}");
}

/// ralph is SIGKILLed while the fallback agent works; the restart books the interrupted
/// iteration on that agent (its name, backend and model), not on the primary.
#[test]
fn a_crashed_iteration_on_the_fallback_is_recovered_on_that_agent() {
    let env = env_with(
        1,
        &format!("model = \"opus\"\n\n{BACKUP}model = \"gpt-5-mini\"\n"),
    );
    env.script(&json!({"invocations": [
        claude_limit(),
        [
            {"read_stdin": true},
            {"codex": {"start": {}}},
            {"write_file": {"path": "US-001.txt", "content": "codex\n"}},
            {"write_file": {"path": "../agent-started", "content": "x"}},
            {"sleep_ms": 60_000}
        ],
        codex_story("US-001", 0),
    ]}));
    let mut child = env.ralph_spawn(&["run"]);
    crate::common::wait_for(&env, "../agent-started", std::time::Duration::from_secs(30));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill ralph");
    child.wait().expect("wait");
    // In flight: the agent it runs on is in state.json (the primary, opus, is not it).
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json");
    assert_eq!(state["in_flight"]["agent"], "backup", "{state}");

    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ledger = env.ledger();
    let seen: Vec<(String, String, String, String)> = ledger
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("-").to_owned();
            (s("agent"), s("backend"), s("model"), s("outcome"))
        })
        .collect();
    let row = |a: &str, b: &str, m: &str, o: &str| {
        (a.to_owned(), b.to_owned(), m.to_owned(), o.to_owned())
    };
    assert_eq!(
        seen,
        [
            row("claude", "claude", "claude-fake-1", "usage_limit"),
            row("backup", "codex", "gpt-5-mini", "interrupted"),
            row("backup", "codex", "gpt-5-mini", "story_passed"),
        ]
    );
}

/// Writes an executable `name` in `dir` that answers `--version` with `version_line`.
fn fake_cli(dir: &std::path::Path, name: &str, version_line: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("#!/bin/sh\n[ \"$1\" = --version ] && echo '{version_line}' && exit 0\nexit 3\n"),
    )
    .expect("write fake cli");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `ralph doctor` in `dir` with only `bin` (and the system's) on PATH.
fn doctor(dir: &std::path::Path, bin: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ralph"))
        .arg("doctor")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("run ralph doctor");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `ralph doctor --json`'s fallback agents (those with a name): name, backend, and whether
/// it is usable (no error).
fn named_agents(doc: &Value) -> Vec<(String, String, bool)> {
    doc["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter(|a| a["name"].is_string())
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_owned(),
                a["agent"].as_str().unwrap_or("").to_owned(),
                a["error"].is_null(),
            )
        })
        .collect()
}

#[test]
fn doctor_checks_each_fallback_agent_under_its_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");
    fake_cli(&bin, "codex-nightly", "codex-cli 0.99.0");
    // `backup` runs codex from a program of its own; `api` is the native agent whose key
    // variable is not set (a trap, as for the primary); `gone` points at a program that does
    // not exist.
    std::fs::write(
        tmp.path().join("ralph.toml"),
        format!(
            "[[agents]]\nname = \"backup\"\nagent = \"codex\"\nagent_program = \"{}\"\n\n\
             [[agents]]\nname = \"api\"\nagent = \"native\"\nmodel = \"m\"\napi_key_env = \"MY_NIGHT_KEY\"\n\n\
             [[agents]]\nname = \"gone\"\nagent = \"gemini\"\nagent_program = \"/nonexistent/gemini\"\n",
            bin.join("codex-nightly").display()
        ),
    )
    .expect("ralph.toml");
    let (code, out) = doctor(tmp.path(), &bin, &[]);
    // A fallback that cannot start makes `ralph run` refuse: doctor says not ready.
    assert_eq!(code, Some(1), "{out}");
    let section = |head: &str| {
        let start = out
            .find(head)
            .unwrap_or_else(|| panic!("no {head:?} in:\n{out}"));
        out[start..].split("\n\n").next().unwrap_or("").to_owned()
    };
    let backup = section("backup (codex)");
    assert!(backup.contains("ok codex-cli 0.99.0"), "{backup}");
    assert!(backup.contains("codex-nightly"), "{backup}");
    let api = section("api (native)");
    assert!(
        api.contains("$MY_NIGHT_KEY (api_key_env) is not set"),
        "{api}"
    );
    let gone = section("gone (gemini)");
    assert!(gone.contains("/nonexistent/gemini"), "{gone}");

    // --json: each under its name, beside its backend.
    let (_, json) = doctor(tmp.path(), &bin, &["--json"]);
    let doc: Value = serde_json::from_str(&json).expect("json");
    let named = named_agents(&doc);
    assert_eq!(
        named,
        [
            ("backup".to_owned(), "codex".to_owned(), true),
            ("api".to_owned(), "native".to_owned(), true),
            ("gone".to_owned(), "gemini".to_owned(), false),
        ]
    );
    assert_eq!(doc["ok"], false, "{doc}");
}

/// `ralph doctor` checks the fallbacks the run would use: `--fallback-agent` (as `ralph run`'s)
/// replaces ralph.toml's `fallback_agents`. (doctor refused the flag, and under
/// RALPH_FALLBACK_AGENT it listed the file's fallbacks, not the ones the run would use.)
#[test]
fn doctor_checks_the_fallbacks_of_fallback_agent_not_the_files_list() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");
    fake_cli(&bin, "codex-nightly", "codex-cli 0.99.0");
    std::fs::write(
        tmp.path().join("ralph.toml"),
        format!(
            "fallback_agents = [\"gone\"]\n\n\
             [[agents]]\nname = \"backup\"\nagent = \"codex\"\nagent_program = \"{}\"\n\n\
             [[agents]]\nname = \"gone\"\nagent = \"gemini\"\nagent_program = \"/nonexistent/gemini\"\n",
            bin.join("codex-nightly").display()
        ),
    )
    .expect("ralph.toml");
    let named = |args: &[&str]| -> (Option<i32>, Vec<String>) {
        let (code, json) = doctor(tmp.path(), &bin, args);
        let doc: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        let names = named_agents(&doc)
            .into_iter()
            .map(|(name, ..)| name)
            .collect();
        (code, names)
    };
    // The file's list: `gone`, which cannot start.
    assert_eq!(named(&["--json"]), (Some(1), vec!["gone".to_owned()]));
    // The flag's: `backup` alone, and ready.
    assert_eq!(
        named(&["--json", "--fallback-agent", "backup"]),
        (Some(0), vec!["backup".to_owned()])
    );
}

/// Under GitHub Actions, each iteration's log group names the agent it ran on.
#[test]
fn github_actions_group_titles_name_the_agent() {
    let env = env_with(2, BACKUP);
    env.script(&json!({"invocations": [
        claude_limit(),
        codex_story("US-001", 0),
        codex_story("US-002", 0),
    ]}));
    let out = env
        .ralph_cmd(&["run"])
        .env("GITHUB_ACTIONS", "true")
        .output()
        .expect("run ralph");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let groups: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("::group::"))
        .collect();
    assert_eq!(
        groups,
        [
            "::group::iteration 1 · US-001 Story 1 · claude",
            "::group::iteration 2 · US-001 Story 1 · backup (codex)",
            "::group::iteration 3 · US-002 Story 2 · backup (codex)",
        ],
        "{stderr}"
    );
}

/// While the fallback works, `ralph watch` counts down to the limited agent's own reset, and
/// `ralph status` names the agent and its reset.
#[test]
fn watch_and_status_count_down_to_each_limited_agents_reset_while_the_fallback_works() {
    let env = env_with(1, BACKUP);
    env.script(&json!({"invocations": [
        claude_limit(),
        [
            {"read_stdin": true},
            {"codex": {"start": {}}},
            {"write_file": {"path": "../agent-started", "content": "x"}},
            {"sleep_ms": 60_000}
        ],
    ]}));
    let mut child = env.ralph_spawn(&["run"]);
    crate::common::wait_for(&env, "../agent-started", std::time::Duration::from_secs(60));
    let out = env.ralph(&["watch"]);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("iteration 2 · US-001"), "{shown}");
    let line = shown
        .lines()
        .find(|l| l.contains("claude limited: resets in "))
        .unwrap_or_else(|| panic!("no countdown for claude in:\n{shown}"));
    // An hour ahead, less the time the test took (a loaded machine: minutes): `5x:xx` or
    // `1:00:00`.
    let countdown = regex::Regex::new(r"resets in (5\d:\d\d|1:00:00) \(\d\d:\d\d UTC\)").unwrap();
    assert!(countdown.is_match(line), "{line}");
    assert!(!shown.contains("backup limited"), "{shown}");
    let status = text(&env.ralph(&["status"]));
    assert!(
        status.contains("agents waiting for a usage-limit reset: claude until "),
        "{status}"
    );
    crate::common::signal(&child, nix::sys::signal::Signal::SIGTERM);
    let (code, _) = crate::common::wait_exit(&env, &mut child, std::time::Duration::from_secs(60));
    assert_ne!(code, 0, "{}", env.spawned_output());
}

/// Every agent limited under `--no-wait`: the stop reason names each agent and its own reset
/// (state.json, `--json`'s `run_finished`, `ralph status`), and status's wait names each agent.
#[test]
fn a_usage_limit_stop_names_each_limited_agent_and_its_reset() {
    let env = env_with(1, BACKUP);
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 7200}},
            {"exit": 1}
        ],
        [{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}],
    ]}));
    let out = env.ralph(&["run", "--no-wait", "--json"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let finished: Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "run_finished")
        .unwrap_or_else(|| panic!("no run_finished in:\n{stdout}"));
    let reason = &finished["stop_reason"];
    assert_eq!(reason["kind"], "usage_limit", "{finished}");
    let agents: Vec<&str> = reason["agents"]
        .as_array()
        .unwrap_or_else(|| panic!("no agents in {reason}"))
        .iter()
        .map(|a| a["agent"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(agents, ["backup", "claude"], "{reason}");
    let at = |name: &str| {
        let a = reason["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent"] == name)
            .unwrap();
        chrono::DateTime::parse_from_rfc3339(a["resets_at"].as_str().unwrap()).unwrap()
    };
    // claude said 2 h; codex said nothing (usage_limit_fallback: 1 h). resume_at is the earliest.
    assert!(at("claude") > at("backup"), "{reason}");
    let resume_at =
        chrono::DateTime::parse_from_rfc3339(reason["resume_at"].as_str().unwrap()).unwrap();
    assert_eq!(resume_at, at("backup"), "{reason}");
    let state: Value = serde_json::from_str(&env.read(".ralph/state.json")).unwrap();
    assert_eq!(&state["stop_reason"], reason, "{state}");

    let status = text(&env.ralph(&["status"]));
    assert!(
        status
            .contains("last run stopped: every agent hit its usage limit; they reset: backup at ")
            && status.contains(", claude at "),
        "{status}"
    );
    let wait = status
        .lines()
        .find(|l| l.starts_with("usage limit: "))
        .unwrap_or_else(|| panic!("no wait line in:\n{status}"));
    assert!(
        wait.starts_with("usage limit: every agent is limited (backup until ")
            && wait.contains(", claude until ")
            && wait.contains("`ralph run` waits until the first resets"),
        "{wait}"
    );
}

/// `--push` with fallback agents: the release hands each limited agent's reset on
/// (`Ralph-Agent-Reset` trailers beside the old `Ralph-Resume-At`), and a worker in a fresh
/// clone without the books takes them up: every agent is still limited, so under `--no-wait` it
/// stops at once, calling no agent, and names both.
#[test]
fn the_lease_hands_each_agents_reset_to_the_next_worker() {
    use crate::scale_out::{Remote, BRANCH};
    let r = Remote::new(
        1,
        &json!({"invocations": [
            [
                {"claude_init": {}},
                {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 7200}},
                {"exit": 1}
            ],
            [{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}],
        ]}),
    );
    std::os::unix::fs::symlink(crate::common::fake_agent_bin(), r.env.bin.join("codex"))
        .expect("symlink codex");
    r.env.write("ralph.toml", BACKUP);
    r.env.git(&["add", "-A"]);
    r.env.git(&["commit", "-qm", "config"]);
    r.env.git(&["push", "-q", "origin", "main"]);
    let first = r.clone("first");
    let out = r
        .ralph(&first, &["run", "--push", "--no-wait"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let lease = r.lease().expect("a lease commit");
    assert!(lease.contains("Ralph-Lease-State: released"), "{lease}");
    assert!(lease.contains("Ralph-Resume-At: "), "{lease}");
    for agent in ["backup", "claude"] {
        assert!(
            lease.contains(&format!("Ralph-Agent-Reset: {agent} ")),
            "{lease}"
        );
    }
    // Without the books, only the lease knows the resets.
    r.remote_git(&["update-ref", "-d", &format!("refs/ralph/books/{BRANCH}")]);
    let second = r.clone("second");
    let out = r
        .ralph(&second, &["run", "--push", "--no-wait"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(r.env.agent_calls(), 2, "{}", text(&out));
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(second.join(".ralph/state.json")).unwrap())
            .unwrap();
    let names: Vec<&String> = state["agent_resets"]
        .as_object()
        .unwrap_or_else(|| panic!("no agent_resets: {state}"))
        .keys()
        .collect();
    assert_eq!(names, ["backup", "claude"], "{state}");
    assert_eq!(
        state["stop_reason"]["agents"][1]["agent"], "claude",
        "{state}"
    );
}

/// claude is limited, the first fallback cannot log in, the second is limited: the story's
/// last iteration ended `usage_limit`, its last failure was the `auth_error`. `ralph status`
/// names the last outcome as what the story last ended with, and the failure as the failure.
#[test]
fn status_names_a_storys_real_last_outcome_when_a_limit_came_after_its_failure() {
    let env = env_with(
        1,
        "[[agents]]\nname = \"authbad\"\nagent = \"codex\"\n\n[[agents]]\nname = \"lim2\"\nagent = \"codex\"\n",
    );
    env.script(&json!({"invocations": [
        claude_limit(),
        codex_auth(),
        [{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}],
    ]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit", "auth_error", "usage_limit"]);
    let status = env.ralph(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    let line = status
        .lines()
        .find(|l| l.trim_start().starts_with("US-001 last ended"))
        .unwrap_or_else(|| panic!("no last-outcome line in:\n{status}"));
    assert!(
        line.contains("US-001 last ended usage_limit (iteration 3); its last failure: auth_error (iteration 2): unexpected status 401"),
        "{line}"
    );
}

/// A run that stopped right after its fallback switch: claude's limit, then the fallback's. Both
/// iterations ran but neither counts toward `--max-iter`; `ralph watch`'s budget line says both
/// (it said "iterations 0/10", as if none ran), and the run's summary counts them.
#[test]
fn watch_counts_the_iterations_that_ran_after_a_switch_beside_the_max_iter_budget() {
    let env = env_with(1, BACKUP);
    env.script(&json!({"invocations": [
        claude_limit(),
        [{"read_stdin": true}, {"codex": {"start": {}}}, {"codex": {"usage_limit": {"at": null}}}],
    ]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit", "usage_limit"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("switching from claude to backup"),
        "{stderr}"
    );
    assert!(
        stderr.contains("iterations  2 this run (#1–#2)"),
        "{stderr}"
    );
    let watch = env.ralph(&["watch"]);
    assert_eq!(watch.status.code(), Some(0), "{}", text(&watch));
    let shown = String::from_utf8_lossy(&watch.stdout);
    let budget = shown
        .lines()
        .find(|l| l.starts_with("iterations "))
        .unwrap_or_else(|| panic!("no budget line in:\n{shown}"));
    assert!(
        budget.starts_with("iterations 0/10 counted (2 ran) · "),
        "{budget}"
    );
}

/// `ralph doctor`'s verdict names each agent of the run by what configured it, ready or not
/// with the real reason. (A fallback from RALPH_FALLBACK_AGENT that could not start made it
/// say "configured agent: exec — NOT ready" of a primary exec that was ready; a fallback `exec`
/// without a command was not shown at all.)
#[test]
fn doctor_names_each_agent_by_what_configured_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let doctor_env = |envs: &[(&str, &str)], args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ralph"))
            .arg("doctor")
            .args(args)
            .current_dir(tmp.path())
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("HOME", tmp.path())
            .env("NO_COLOR", "1")
            .envs(envs.iter().copied())
            .output()
            .expect("run ralph doctor");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), text)
    };
    std::fs::write(
        tmp.path().join("ralph.toml"),
        "agent = \"exec\"\nagent_cmd = \"true\"\n",
    )
    .expect("ralph.toml");
    // The primary is ready; the fallback from the environment is not installed.
    let (code, out) = doctor_env(&[("RALPH_FALLBACK_AGENT", "codex")], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("primary agent: exec (`agent` in ralph.toml) — ready\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "fallback agent: codex (RALPH_FALLBACK_AGENT) — NOT ready: `codex` is not installed"
        ),
        "{out}"
    );
    assert!(!out.contains("exec — NOT ready"), "{out}");
    // The flag is named as the flag; an installed codex is ready.
    fake_cli(&bin, "codex", "codex-cli 0.99.0");
    let (code, out) = doctor_env(&[], &["--fallback-agent", "codex"]);
    assert!(
        out.contains("fallback agent: codex (--fallback-agent) — ready\n"),
        "{out}"
    );
    assert!(out.contains("ralph run: ready"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    // The primary among its own fallbacks: the fallbacks' problem, not the primary's.
    let (code, out) = doctor_env(&[("RALPH_FALLBACK_AGENT", "exec")], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("primary agent: exec (`agent` in ralph.toml) — ready\n"),
        "{out}"
    );
    assert!(
        out.contains("fallback agent: exec (RALPH_FALLBACK_AGENT) — NOT ready: ")
            && out.contains("which is the primary agent"),
        "{out}"
    );
    // No primary configured: the default claude; a fallback exec without a command is shown
    // with what it needs.
    std::fs::remove_file(tmp.path().join("ralph.toml")).expect("rm ralph.toml");
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");
    let (code, out) = doctor_env(&[("RALPH_FALLBACK_AGENT", "exec")], &["--json"]);
    assert_eq!(code, Some(1), "{out}");
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let agents: Vec<(String, String, bool)> = doc["run_agents"]
        .as_array()
        .expect("run_agents")
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_owned(),
                a["source"].as_str().unwrap_or("").to_owned(),
                a["ready"].as_bool().unwrap_or(true),
            )
        })
        .collect();
    assert_eq!(
        agents,
        [
            ("claude".to_owned(), "the default".to_owned(), true),
            ("exec".to_owned(), "RALPH_FALLBACK_AGENT".to_owned(), false),
        ],
        "{doc}"
    );
    assert!(
        doc["run_agents"][1]["error"]
            .as_str()
            .unwrap_or("")
            .contains("needs the command to run"),
        "{doc}"
    );
}

/// `ralph status --json` says how the last iteration ended (`last_outcome`, state.json's),
/// as the human view does; it was missing from the JSON.
#[test]
fn status_json_has_the_last_outcome() {
    let env = env_with(1, "[[agents]]\nname = \"authbad\"\nagent = \"codex\"\n");
    env.script(&json!({"invocations": [claude_limit(), codex_auth()]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.outcomes(), ["usage_limit", "auth_error"]);
    let status = env.ralph(&["status", "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    assert_eq!(doc["last_outcome"], "auth_error", "{doc}");
    assert_eq!(doc["last_outcome"], env.state()["last_outcome"], "{doc}");
}

/// `ralph doctor` names a fallback that is neither a table nor a backend on its own line (and
/// in `run_agents`), not on the good fallback beside it; `RALPH_FALLBACK_AGENT=` (empty) is
/// unset for doctor and for `ralph run` alike (tester 6, issue 19).
#[test]
fn doctor_names_an_unknown_fallback_and_an_empty_fallback_variable_is_unset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    fake_cli(&bin, "codex", "codex-cli 0.99.0");
    let ralph = |envs: &[(&str, &str)], args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ralph"))
            .args(args)
            .current_dir(tmp.path())
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("HOME", tmp.path())
            .env("NO_COLOR", "1")
            .envs(envs.iter().copied())
            .output()
            .expect("run ralph");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), stdout, text(&out))
    };
    std::fs::write(
        tmp.path().join("ralph.toml"),
        "agent = \"exec\"\nagent_cmd = \"true\"\n",
    )
    .expect("ralph.toml");
    let (code, out, _) = ralph(&[], &["doctor", "--fallback-agent", "nosuch"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("fallback agent: nosuch (--fallback-agent) — NOT ready: fallback agent `nosuch` is neither"),
        "{out}"
    );
    let (_, out, _) = ralph(&[], &["doctor", "--fallback-agent", "nosuch", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let last = &doc["run_agents"][1];
    assert_eq!(last["name"], "nosuch", "{doc}");
    assert_eq!(last["ready"], false, "{doc}");
    let (code, out, _) = ralph(&[("RALPH_FALLBACK_AGENT", "nosuch,codex")], &["doctor"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "fallback agent: nosuch (RALPH_FALLBACK_AGENT) — NOT ready: fallback agent `nosuch`"
        ),
        "{out}"
    );
    assert!(
        out.contains("fallback agent: codex (RALPH_FALLBACK_AGENT) — ready\n"),
        "the error is nosuch's, not codex's: {out}"
    );
    let (code, out, _) = ralph(&[("RALPH_FALLBACK_AGENT", "")], &["doctor"]);
    assert!(!out.contains("fallback agent"), "{out}");
    assert!(out.contains("ralph run: ready"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    // `ralph run` reads the empty variable as unset too: no "fallback agent ``" refusal.
    std::fs::write(
        tmp.path().join("prd.json"),
        serde_json::to_string(&json!({"project": "x", "branchName": "ralph/x",
            "description": "d", "userStories": [{"id": "US-001", "title": "t",
            "description": "d", "acceptanceCriteria": ["a"], "priority": 1, "passes": false}]}))
        .expect("json"),
    )
    .expect("prd.json");
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "init",
        ],
    ] {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(tmp.path())
            .status()
            .expect("git");
        assert!(ok.success(), "git {args:?}");
    }
    let (_, _, out) = ralph(&[("RALPH_FALLBACK_AGENT", "")], &["run", "--max-iter", "1"]);
    assert!(
        !out.contains("fallback agent ``")
            && !out.contains("neither an [[agents]]")
            && out.contains(".ralph/ledger.jsonl"),
        "{out}"
    );
}
