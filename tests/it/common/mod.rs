//! Hermetic test environment for driving the `ralph` binary end to end: a temp HOME and TMPDIR,
//! `GIT_CONFIG_GLOBAL=/dev/null`, a fixed git identity and dates, a fresh git repository with a
//! prd.json, and the scripted fake agent on PATH under the name `claude`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

/// A temp directory tree for one test.
pub struct TestEnv {
    /// Keeps the tree alive.
    pub root: tempfile::TempDir,
    /// The git repository ralph runs in.
    pub repo: PathBuf,
    /// HOME for every child.
    pub home: PathBuf,
    /// TMPDIR for every child.
    pub tmp: PathBuf,
    /// Directory put first on PATH (holds the fake `claude`).
    pub bin: PathBuf,
    /// The fake agent's script.
    pub script: PathBuf,
}

/// The built ralph binary.
pub fn ralph_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph")
}

/// The built fake agent.
pub fn fake_agent_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-fake-agent")
}

/// A prd.json with `n` open stories `US-001`..: priority = index.
pub fn prd_with_stories(n: usize) -> Value {
    let stories: Vec<Value> = (1..=n)
        .map(|i| {
            json!({
                "id": format!("US-{i:03}"),
                "title": format!("Story {i}"),
                "description": format!("As a user I want feature {i}"),
                "acceptanceCriteria": [format!("file-{i}.txt exists")],
                "priority": i,
                "passes": false,
                "notes": ""
            })
        })
        .collect();
    json!({
        "project": "Demo",
        "branchName": "ralph/demo",
        "description": "A demo project",
        "userStories": stories
    })
}

impl TestEnv {
    /// A fresh repo with `prd` committed on `main`, and the fake agent installed as `claude`.
    pub fn new(prd: &Value) -> TestEnv {
        let root = tempfile::tempdir().expect("tempdir");
        let repo = root.path().join("repo");
        let home = root.path().join("home");
        let tmp = root.path().join("tmp");
        let bin = root.path().join("bin");
        for d in [&repo, &home, &tmp, &bin] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::os::unix::fs::symlink(fake_agent_bin(), bin.join("claude")).expect("symlink claude");
        let script = root.path().join("script.json");
        let env = TestEnv {
            root,
            repo,
            home,
            tmp,
            bin,
            script,
        };
        env.git(&["init", "-q", "-b", "main"]);
        env.write(
            "prd.json",
            &format!("{}\n", serde_json::to_string_pretty(prd).expect("json")),
        );
        env.write("README.md", "demo\n");
        env.git(&["add", "-A"]);
        env.git(&["commit", "-q", "-m", "initial"]);
        env
    }

    /// Writes `content` to `rel` inside the repo.
    pub fn write(&self, rel: &str, content: &str) {
        let p = self.repo.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(p, content).expect("write");
    }

    /// Reads `rel` inside the repo.
    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.repo.join(rel)).unwrap_or_default()
    }

    /// Environment every child gets: nothing inherited but PATH's system part.
    pub fn envs(&self) -> Vec<(String, String)> {
        vec![
            (
                "PATH".into(),
                format!("{}:/usr/local/bin:/usr/bin:/bin", self.bin.display()),
            ),
            ("HOME".into(), self.home.display().to_string()),
            ("TMPDIR".into(), self.tmp.display().to_string()),
            ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_AUTHOR_NAME".into(), "Test Author".into()),
            ("GIT_AUTHOR_EMAIL".into(), "author@example.com".into()),
            ("GIT_COMMITTER_NAME".into(), "Test Author".into()),
            ("GIT_COMMITTER_EMAIL".into(), "author@example.com".into()),
            ("GIT_AUTHOR_DATE".into(), "2026-01-01T00:00:00Z".into()),
            ("GIT_COMMITTER_DATE".into(), "2026-01-01T00:00:00Z".into()),
            ("NO_COLOR".into(), "1".into()),
            ("COLUMNS".into(), "100".into()),
            (
                "RALPH_FAKE_SCRIPT".into(),
                self.script.display().to_string(),
            ),
        ]
    }

    /// Runs `git` in the repo, panicking on failure; returns stdout.
    pub fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(&self.repo)
            .env_clear()
            .envs(self.envs())
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `ralph` command in the repo with the hermetic environment.
    pub fn ralph_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(ralph_bin());
        cmd.args(args)
            .current_dir(&self.repo)
            .env_clear()
            .envs(self.envs());
        cmd
    }

    /// Starts `ralph` in the background with its stdout and stderr in files beside the repo
    /// (`ralph-<n>.stdout`/`.stderr`, see [`TestEnv::spawned_output`]), so that a run a test
    /// interrupts does not print its banner into the test harness's log.
    pub fn ralph_spawn(&self, args: &[&str]) -> std::process::Child {
        self.ralph_spawn_with(self.ralph_cmd(args))
    }

    /// [`TestEnv::ralph_spawn`] for a command the test configured further (env, cwd).
    pub fn ralph_spawn_with(&self, mut cmd: Command) -> std::process::Child {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let base = self.root.path().join(format!("ralph-{n}"));
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(base.with_extension("stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(base.with_extension("stderr")).expect("stderr file"))
            .spawn()
            .expect("start ralph")
    }

    /// What every background ralph of this test printed, for assertion messages.
    pub fn spawned_output(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<_> = std::fs::read_dir(self.root.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("ralph-"))
            })
            .collect();
        files.sort();
        for f in files {
            out.push_str(&format!("--- {}\n", f.display()));
            out.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
        }
        out
    }

    /// Runs `ralph` to completion.
    pub fn ralph(&self, args: &[&str]) -> Output {
        self.ralph_cmd(args).output().expect("run ralph")
    }

    /// Writes the fake agent's script (see testing/README.md).
    pub fn script(&self, script: &Value) {
        std::fs::write(
            &self.script,
            serde_json::to_vec_pretty(script).expect("json"),
        )
        .expect("write script");
    }

    /// Ledger records, parsed.
    pub fn ledger(&self) -> Vec<Value> {
        self.read(".ralph/ledger.jsonl")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("ledger line"))
            .collect()
    }

    /// The current prd.json, parsed.
    pub fn prd(&self) -> Value {
        serde_json::from_str(&self.read("prd.json")).expect("prd.json")
    }

    /// How many times the fake agent was started.
    pub fn agent_calls(&self) -> usize {
        let p = PathBuf::from(format!("{}.calls.jsonl", self.script.display()));
        std::fs::read_to_string(p)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Path relative to the repo.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.repo.join(rel)
    }

    /// The ledger's outcomes, in order (`?` for a record without one).
    pub fn outcomes(&self) -> Vec<String> {
        self.ledger()
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    /// `.ralph/state.json`, parsed.
    pub fn state(&self) -> Value {
        serde_json::from_str(&self.read(".ralph/state.json")).expect("state.json")
    }
}

/// stdout + stderr of an output, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether any process in group `pgid` is still alive (zombies excluded).
pub fn group_has_live_members(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) =
            std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
        else {
            continue;
        };
        // Fields after the command name: state ppid pgrp ...
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse::<i32>().ok() == Some(pgid) {
            return true;
        }
    }
    false
}

/// Writes an executable bash script `name` beside the repository (outside it, so that it is no
/// change of the agent's) and returns its path.
pub fn script_file(env: &TestEnv, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = env.root.path().join(name);
    std::fs::write(&path, format!("#!/bin/bash\n{body}")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Waits until `rel` exists in the repository (an agent or a check got that far), at most
/// `within`; fails naming what every background ralph printed.
pub fn wait_for(env: &TestEnv, rel: &str, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    while !env.path(rel).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{rel} never appeared:\n{}",
            env.spawned_output()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends `sig` to `child`.
pub fn signal(child: &std::process::Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).expect("kill");
}

/// Waits for `child` to exit, at most `within`; kills it and fails the test past that. Returns
/// its exit code (-1 for a signal) and how long the wait took.
pub fn wait_exit(
    env: &TestEnv,
    child: &mut std::process::Child,
    within: std::time::Duration,
) -> (i32, std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (status.code().unwrap_or(-1), started.elapsed());
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ralph did not exit within {within:?}:\n{}",
                env.spawned_output()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A fake claude iteration in which the agent fails (an error result, exit 1).
pub fn failing_iteration() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ])
}

/// `ralph plan "add a --reverse flag" --yes --attempts 1` with the exec agent `agent`, stdin
/// closed.
pub fn plan_once_with_exec(env: &TestEnv, agent: &Path) -> Command {
    let mut cmd = env.ralph_cmd(&[
        "plan",
        "add a --reverse flag",
        "--yes",
        "--attempts",
        "1",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
    ]);
    cmd.stdin(std::process::Stdio::null());
    cmd
}

/// A wall-clock time `hours` from now in the local zone, as claude words a reset (`5am`,
/// `11pm`): a reset that is hours ahead whatever the test's time of day. (A fixed "resets 5am"
/// read at 5:02 is due now, which is right but not the case such a test is about.)
pub fn claude_clock_in(hours: i64) -> String {
    (chrono::Local::now() + chrono::Duration::hours(hours))
        .format("%-I%P")
        .to_string()
}

/// A wall-clock time `hours` from now in the local zone, as codex words a reset (`3:28 PM`).
pub fn codex_clock_in(hours: i64) -> String {
    (chrono::Local::now() + chrono::Duration::hours(hours))
        .format("%-I:%M %p")
        .to_string()
}
pub mod par;

/// A codex session (the fake) that cannot log in: a 401 for its API key, then exit 1.
pub fn codex_auth() -> Value {
    json!([
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"codex": {"failed": "unexpected status 401 Unauthorized: Incorrect API key provided"}},
        {"exit": 1}
    ])
}

/// The flags of a `native` agent on the scripted model server at `base_url` (model
/// `scripted`), its key read from the environment variable `key_var`.
pub fn native_flags(base_url: &str, key_var: &str) -> Vec<String> {
    [
        "--agent",
        "native",
        "--model",
        "scripted",
        "--base-url",
        base_url,
        "--api-key-env",
        key_var,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
