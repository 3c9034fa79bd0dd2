//! The real local model, end to end: `ralph run --agent local` with no scripting — setup
//! checked, server started on 127.0.0.1, the default model (Qwen2.5-Coder-1.5B) doing the work
//! through ralph's own tool loop, the verify gate checking each story — on examples/hello-files
//! (the demo) and examples/first-project (the README's project of your own: a file in the
//! repository root, a function added, a constant changed); plus Ctrl-C during a local run.
//! Needs `scripts/setup-local-model.sh all` (run by scripts/test.sh); see tests/it/local.rs for
//! the skip rules.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{group_has_live_members, text, TestEnv};
use crate::local::{one_model_at_a_time, prepared_or_skip, OneModel};
use ralph::local::BuiltinModel;

/// A TestEnv holding a copy of `examples/<name>` (its `files`, and prd.json), committed.
fn example_env(name: &str, files: &[&str]) -> TestEnv {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let prd: Value =
        serde_json::from_str(&std::fs::read_to_string(example.join("prd.json")).unwrap()).unwrap();
    let env = TestEnv::new(&prd);
    for file in files.iter().chain(&["prd.json"]) {
        if let Some(dir) = Path::new(file).parent() {
            std::fs::create_dir_all(env.path("").join(dir)).unwrap();
        }
        std::fs::copy(example.join(file), env.path(file)).unwrap();
    }
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", &format!("{name} example")]);
    env
}

/// A TestEnv holding a copy of examples/hello-files.
fn hello_files_env() -> TestEnv {
    example_env("hello-files", &["check.sh", "status.txt", "README.md"])
}

/// Runs every story's `verify` of the env's prd.json; panics naming a failing one.
fn every_verify_passes(env: &TestEnv) {
    for story in env.prd()["userStories"].as_array().unwrap() {
        let verify = story["verify"].as_str().unwrap();
        let out = std::process::Command::new("bash")
            .args(["-c", verify])
            .current_dir(&env.repo)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: `{verify}` fails: {}",
            story["id"],
            text(&out)
        );
    }
}

fn local_cmd(env: &TestEnv, args: &[&str]) -> std::process::Command {
    let mut cmd = env.ralph_cmd(args);
    cmd.env("RALPH_CACHE_DIR", ralph::local::cache_dir());
    cmd
}

/// The guard of [`one_model_at_a_time`] once `model` is prepared; `None` when `test` is skipped
/// (the skip rules of tests/it/local.rs).
fn model_or_skip(test: &str, model: BuiltinModel) -> Option<OneModel> {
    prepared_or_skip(test, model)?;
    Some(one_model_at_a_time())
}

/// `ralph <args>` with the local model's cache, to its end: prints how long the run took and
/// how many iterations it recorded (`what` names the run), and asserts it exited 0.
fn local_run(env: &TestEnv, what: &str, args: &[&str]) -> std::process::Output {
    let started = Instant::now();
    let out = local_cmd(env, args).output().unwrap();
    eprintln!(
        "{what}: {:?}, {} iterations",
        started.elapsed(),
        env.ledger().len()
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    out
}

#[test]
fn local_model_completes_the_hello_files_example() {
    let test = "local_model_completes_the_hello_files_example";
    let Some(_one) = model_or_skip(test, BuiltinModel::Default) else {
        return;
    };
    let env = hello_files_env();
    let out = local_run(
        &env,
        "hello-files with the default model",
        &["run", "--agent", "local", "--max-iter", "10"],
    );
    // The verify gate ran: the files really are right.
    hello_files_done(&env, &out);
}

/// The README's example of a project of your own (examples/first-project): three one-file
/// stories a new user writes — create hello.py in the repository root, add mathutil.add, change
/// a constant — each with a `verify`, done by the default model.
#[test]
fn local_model_completes_the_first_project_example() {
    let test = "local_model_completes_the_first_project_example";
    let Some(_one) = model_or_skip(test, BuiltinModel::Default) else {
        return;
    };
    let env = example_env(
        "first-project",
        &["README.md", "mathutil.py", "config.py", "src/app.py"],
    );
    local_run(
        &env,
        "first-project with the default model",
        &["run", "--agent", "local", "--max-iter", "9"],
    );
    every_verify_passes(&env);
    assert!(
        env.path("hello.py").exists() && !env.path("src/hello.py").exists(),
        "hello.py belongs in the repository root"
    );
}

/// Child processes of `pid` whose command line contains `needle`.
fn children_matching(pid: u32, needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(child);
        }
    }
    found
}

#[test]
fn ctrl_c_during_a_local_run_leaves_no_server_and_no_agent() {
    // The small model: this is about process lifetimes, and it loads faster.
    let test = "ctrl_c_during_a_local_run_leaves_no_server_and_no_agent";
    let Some(_one) = model_or_skip(test, BuiltinModel::Small) else {
        return;
    };
    let env = hello_files_env();
    let args = [
        "run",
        "--agent",
        "local",
        "--local-model",
        "small",
        "--max-iter",
        "3",
    ];
    let mut child = local_cmd(&env, &args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the server runs and the first agent is in flight.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (server, agent) = loop {
        assert!(
            Instant::now() < deadline,
            "the local run never started its agent"
        );
        let servers = children_matching(child.id(), "llama_server.py");
        let state: Value =
            serde_json::from_str(&env.read(".ralph/state.json")).unwrap_or(Value::Null);
        let agent = state["in_flight"]["pid"].as_i64().unwrap_or(0) as i32;
        if let (Some(&server), true) = (servers.first(), agent > 0) {
            break (server, agent);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !group_has_live_members(server),
        "the model server (group {server}) outlived ralph"
    );
    assert!(
        !group_has_live_members(agent),
        "the agent (group {agent}) outlived ralph"
    );
    let outcomes: Vec<String> = env
        .ledger()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("interrupted"),
        "{outcomes:?}"
    );
}

/// Every story of hello-files has a `story_passed` record and `check.sh all` passes.
fn hello_files_done(env: &TestEnv, out: &std::process::Output) {
    let ledger = env.ledger();
    for id in ["US-001", "US-002", "US-003"] {
        assert!(
            ledger
                .iter()
                .any(|r| r["story_id"] == id && r["outcome"] == "story_passed"),
            "no story_passed record for {id}: {ledger:?}\n{}",
            text(out)
        );
    }
    let check = std::process::Command::new("sh")
        .arg("check.sh")
        .arg("all")
        .current_dir(&env.repo)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));
}

/// The same stories pass with `--sandbox strict` (issue 22's acceptance): the model server ralph
/// starts on the host's 127.0.0.1 is on the local backend's allowlist and reached from inside the
/// sandbox's network namespace at the same address, through ralph's bridge and egress proxy;
/// the native agent's tools and the verify commands run in the sandbox.
#[test]
fn local_model_completes_the_hello_files_example_under_sandbox_strict() {
    let test = "local_model_completes_the_hello_files_example_under_sandbox_strict";
    if !crate::sandbox::bwrap_or_skip(test) {
        return;
    }
    let Some(_one) = model_or_skip(test, BuiltinModel::Default) else {
        return;
    };
    let env = hello_files_env();
    let out = local_run(
        &env,
        "hello-files with the default model under --sandbox strict",
        &[
            "run",
            "--agent",
            "local",
            "--max-iter",
            "10",
            "--sandbox",
            "strict",
        ],
    );
    hello_files_done(&env, &out);
    for r in env.ledger() {
        assert_eq!(r["sandbox"], "strict", "{r}");
        // The model server was never refused: it is the backend's declared host.
        let refused = r["refused_hosts"].as_array().cloned().unwrap_or_default();
        assert!(
            !refused
                .iter()
                .any(|h| h.as_str().is_some_and(|h| h.starts_with("127.0.0.1"))),
            "{r}"
        );
    }
}

/// The local model as the last fallback (issue 19): the primary (the scripted claude) hits its
/// usage limit on the first iteration, with a reset an hour away, and the run goes on at once
/// with `--fallback-agent local`, which completes the hello-files stories. The ledger names the
/// agent of each iteration.
#[test]
fn the_local_model_as_last_fallback_completes_the_stories_after_a_usage_limit() {
    let test = "the_local_model_as_last_fallback_completes_the_stories_after_a_usage_limit";
    let Some(_one) = model_or_skip(test, BuiltinModel::Default) else {
        return;
    };
    let env = hello_files_env();
    env.script(&serde_json::json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 3600}},
        {"exit": 1}
    ]]}));
    let out = local_run(
        &env,
        "hello-files on the local fallback",
        &[
            "run",
            "--agent",
            "claude",
            "--fallback-agent",
            "local",
            "--max-iter",
            "10",
        ],
    );
    hello_files_done(&env, &out);
    let ledger = env.ledger();
    let agents: Vec<(&str, &str, &str)> = ledger
        .iter()
        .map(|r| {
            (
                r["agent"].as_str().unwrap_or("?"),
                r["backend"].as_str().unwrap_or("?"),
                r["outcome"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(
        agents.first(),
        Some(&("claude", "claude", "usage_limit")),
        "{agents:?}"
    );
    assert!(
        agents[1..]
            .iter()
            .all(|(agent, backend, _)| *agent == "local" && *backend == "local"),
        "every iteration after the limit ran on the local fallback: {agents:?}"
    );
    assert_eq!(
        env.agent_calls(),
        1,
        "claude was not tried again before its reset"
    );
}
