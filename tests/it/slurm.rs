//! ralph on a real Slurm (Debian's slurm-wlm and munge; scripts/install-slurm.sh installs them,
//! scripts/test.sh runs it): a one-node cluster of the test's own in a network namespace
//! (scripts/slurm-local.sh), the shipped job-array script (deploy/slurm/ralph-array.sbatch)
//! over three repositories cloned from local bare remotes, with the fake agent. All three
//! complete and each remote branch has every iteration's commits. Then one task is stopped with
//! `scancel --batch --signal=TERM` in the middle of an iteration and requeued with `scontrol
//! requeue`: it resumes from the remote and nothing is lost.
//!
//! A machine without Slurm fails this test (it never skips) with the command that installs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::scale_out::{path, Remote, BRANCH};

/// The cluster; stopped (daemons and namespace) when dropped.
struct Cluster {
    root: PathBuf,
    script: PathBuf,
}

impl Cluster {
    fn up(root: &Path) -> Cluster {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-local.sh");
        let cluster = Cluster {
            root: root.to_path_buf(),
            script,
        };
        let out = cluster
            .cmd(&["up", path(root)])
            .output()
            .expect("slurm-local.sh");
        assert!(
            out.status.success(),
            "scripts/slurm-local.sh up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(&self.script).args(args).env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        cmd
    }

    /// A Slurm client command (sbatch, scancel, scontrol, squeue) with `envs`; its stdout.
    fn client(&self, args: &[&str], envs: &[(String, String)]) -> String {
        let mut all = vec!["exec", path(&self.root)];
        all.extend_from_slice(args);
        let mut cmd = self.cmd(&all);
        // The system's PATH unless the caller gives one (a job inherits it).
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .envs(envs.iter().cloned());
        let out = cmd.output().expect("slurm client");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ArrayTaskId -> (JobState, ExitCode, Restarts)` of every task of `job`.
    fn tasks(&self, job: &str) -> Vec<(String, String, String, String)> {
        self.client(&["scontrol", "-o", "show", "job", job], &[])
            .lines()
            .map(|l| {
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(&format!("{k}=")))
                        .unwrap_or("")
                        .to_owned()
                };
                (
                    field("ArrayTaskId"),
                    field("JobState"),
                    field("ExitCode"),
                    field("Restarts"),
                )
            })
            .collect()
    }

    /// Waits until no task of `job` is pending or running (bounded).
    fn wait_done(&self, job: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let active = self.client(&["squeue", "-h", "-j", job], &[]);
            if active.trim().is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} still active after {limit:?}:\n{active}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for f in ["log/slurmctld.log", "log/slurmd.log"] {
            let text = std::fs::read_to_string(self.root.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s.push_str(&format!(
                "--- {f}\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.cmd(&["down", path(&self.root)]).output();
    }
}

/// Fails (never skips) when Slurm is missing.
fn require_slurm() {
    let missing: Vec<&str> = [
        "/usr/bin/sbatch",
        "/usr/sbin/slurmctld",
        "/usr/sbin/slurmd",
        "/usr/sbin/munged",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    assert!(
        missing.is_empty(),
        "Slurm is not installed (missing {}): run scripts/install-slurm.sh (scripts/test.sh does); \
         this test does not skip{}",
        missing.join(", "),
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            " under CI"
        } else {
            ""
        }
    );
}

/// The agent scripts of one submission: `scripts[i]` drives task `i`.
fn write_scripts(dir: &Path, scripts: &[serde_json::Value]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, s) in scripts.iter().enumerate() {
        std::fs::write(dir.join(format!("script-{i}.json")), s.to_string()).unwrap();
    }
}

/// An agent that commits a line, leaves a note uncommitted, then (`slow`: writes the marker and
/// works for 20 s) marks the next story passing.
fn agent(slow: Option<&Path>) -> serde_json::Value {
    let mut steps = vec![
        json!({"claude_init": {}}),
        json!({"sleep_ms": 100}),
        json!({"append_file": {"path": "work.txt", "content": "a line\n"}}),
        json!({"git_commit": "agent: work"}),
        json!({"append_file": {"path": "notes.txt", "content": "uncommitted\n"}}),
    ];
    if let Some(m) = slow {
        steps.push(json!({"write_file": {"path": path(m), "content": "started\n"}}));
        steps.push(json!({"sleep_ms": 20_000}));
    }
    steps.extend([
        json!({"set_passes": {"id": "@next", "passes": true}}),
        json!({"claude_result": {"text": "done", "cost_usd": 0.01}}),
    ]);
    serde_json::Value::Array(steps)
}

#[test]
fn a_job_array_on_real_slurm_completes_and_a_requeued_task_resumes_from_the_remote() {
    require_slurm();
    let started = Instant::now();
    let base = tempfile::Builder::new()
        .prefix("rs")
        .tempdir_in("/tmp")
        .unwrap();
    let cluster = Cluster::up(&base.path().join("c"));
    let remotes: Vec<Remote> = (0..4)
        .map(|_| Remote::new(2, &json!({"invocations": []})))
        .collect();
    // The fake agent as `claude`, its script chosen by the array task.
    let bin = base.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("claude");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nRALPH_FAKE_SCRIPT=\"$RALPH_FAKE_DIR/script-$SLURM_ARRAY_TASK_ID.json\" exec {} \"$@\"\n",
            crate::common::fake_agent_bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let out_dir = base.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let submit = |list: &[&Remote], fake_dir: &Path, tag: &str| -> String {
        let list_file = base.path().join(format!("{tag}.txt"));
        let lines: String = list
            .iter()
            .map(|r| format!("{} prd.json\n", r.bare.display()))
            .collect();
        std::fs::write(&list_file, format!("# {tag}\n{lines}")).unwrap();
        let mut envs: Vec<(String, String)> = remotes[0]
            .env
            .envs()
            .into_iter()
            .filter(|(k, _)| k != "PATH" && k != "RALPH_FAKE_SCRIPT")
            .collect();
        envs.extend(
            [
                (
                    "PATH",
                    format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
                ),
                ("RALPH_FAKE_DIR", fake_dir.display().to_string()),
                ("RALPH_PRD_LIST", list_file.display().to_string()),
                ("RALPH_BIN", crate::common::ralph_bin().to_owned()),
                (
                    "RALPH_JOB_SCRIPT",
                    manifest
                        .join("deploy/job/ralph-job.sh")
                        .display()
                        .to_string(),
                ),
                (
                    "RALPH_WORKDIR",
                    base.path().join("work").display().to_string(),
                ),
                ("RALPH_REQUEUE_ON_TERM", "0".into()),
                ("RALPH_SHUTDOWN_TIMEOUT", "5s".into()),
                ("RALPH_QUIET", "1".into()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let out = cluster.client(
            &[
                "sbatch",
                "--parsable",
                &format!("--array=0-{}", list.len() - 1),
                "--time=10",
                &format!("--output={}/{tag}-%A_%a.out", out_dir.display()),
                &format!("--chdir={}", base.path().display()),
                path(&manifest.join("deploy/slurm/ralph-array.sbatch")),
            ],
            &envs,
        );
        out.trim().split(';').next().unwrap().to_owned()
    };
    let outputs = || {
        let mut s = String::new();
        for e in std::fs::read_dir(&out_dir).unwrap().flatten() {
            s.push_str(&format!(
                "--- {}\n{}\n",
                e.path().display(),
                std::fs::read_to_string(e.path()).unwrap_or_default()
            ));
        }
        s
    };

    // Three PRDs, one task each: all complete, every iteration on its remote.
    let fake_a = base.path().join("fake-a");
    write_scripts(
        &fake_a,
        &vec![json!({"invocations": [], "default": agent(None)}); 3],
    );
    let job = submit(&[&remotes[0], &remotes[1], &remotes[2]], &fake_a, "array");
    cluster.wait_done(&job, Duration::from_secs(120));
    let tasks = cluster.tasks(&job);
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    for (task, state, exit, _) in &tasks {
        assert_eq!(
            (state.as_str(), exit.as_str()),
            ("COMPLETED", "0:0"),
            "task {task}: {tasks:?}\n{}",
            outputs()
        );
    }
    for r in &remotes[..3] {
        assert_eq!(r.remote_iterations(), [1, 2], "{}", outputs());
        let log = r.remote_log();
        assert_eq!(
            log.iter().filter(|s| *s == "agent: work").count(),
            2,
            "{log:?}"
        );
        assert!(r.lease().unwrap().contains("State: released"));
        assert!(r
            .lease()
            .unwrap()
            .contains(&format!("Ralph-Lease-Job: slurm {job}_")));
    }

    // A fourth PRD whose first iteration is stopped with scancel, then requeued.
    let fake_b = base.path().join("fake-b");
    let marker = base.path().join("agent-started");
    write_scripts(
        &fake_b,
        &[json!({"invocations": [agent(Some(&marker))], "default": agent(None)})],
    );
    let job = submit(&[&remotes[3]], &fake_b, "requeue");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "the agent never started:\n{}",
            outputs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let task = format!("{job}_0");
    let signalled = Instant::now();
    cluster.client(&["scancel", "--batch", "--signal=TERM", &task], &[]);
    cluster.wait_done(&job, Duration::from_secs(60));
    let stopped_in = signalled.elapsed();
    let first = &cluster.tasks(&job)[0];
    assert_eq!(first.2, "130:0", "{first:?}\n{}", outputs());
    // Stopped within its shutdown timeout, its interrupted iteration pushed.
    assert!(stopped_in < Duration::from_secs(10), "{stopped_in:?}");
    assert_eq!(
        remotes[3].remote_log()[1..],
        ["agent: work", "ralph: iteration 1 (US-001)"],
        "{}",
        outputs()
    );
    let agent_commits_before: Vec<String> = remotes[3]
        .remote_git(&["log", "--format=%H", BRANCH])
        .lines()
        .map(str::to_owned)
        .collect();
    cluster.client(&["scontrol", "requeue", &task], &[]);
    std::thread::sleep(Duration::from_millis(500));
    cluster.wait_done(&job, Duration::from_secs(120));
    let second = &cluster.tasks(&job)[0];
    assert_eq!(
        (second.1.as_str(), second.2.as_str(), second.3.as_str()),
        ("COMPLETED", "0:0", "1"),
        "{second:?}\n{}",
        outputs()
    );
    // Resumed from the remote: nothing lost, the numbering goes on.
    for sha in &agent_commits_before {
        assert!(remotes[3].remote_has(sha), "{sha} lost");
    }
    assert_eq!(remotes[3].remote_iterations(), [1, 2, 3], "{}", outputs());
    let lease = remotes[3].lease().unwrap();
    assert!(
        lease.contains("State: released") && lease.contains("restart 1"),
        "{lease}"
    );
    eprintln!("Slurm end to end in {:?}", started.elapsed());
}
