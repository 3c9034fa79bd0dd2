//! `--push` without a scheduler: workers in separate clones of one bare remote (a directory on
//! this machine), driven as a scheduler would drive them: the push after each checkpoint, the
//! resume from a fresh clone, the lease (two workers at once, a live lease elsewhere, an expired
//! one, an abandoned one), a push the remote refuses, a remote that cannot be reached, and the
//! shutdown on SIGTERM (Kubernetes) and on GitHub Actions' cancel sequence.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// A bare remote with `main` holding a prd.json, and clones of it for workers.
pub struct Remote {
    /// The hermetic environment (its `repo` is the seed clone that pushed `main`).
    pub env: TestEnv,
    /// The bare repository.
    pub bare: PathBuf,
}

/// The branch prd.json names.
pub const BRANCH: &str = "ralph/demo";

impl Remote {
    /// A remote whose `main` has a prd.json with `stories` open stories; the fake agent's
    /// script `script` drives every worker.
    pub fn new(stories: usize, script: &Value) -> Remote {
        let env = TestEnv::new(&prd_with_stories(stories));
        env.script(script);
        let bare = env.root.path().join("remote.git");
        run_git(
            env.root.path(),
            &env,
            &["init", "-q", "--bare", "-b", "main", path(&bare)],
        );
        env.git(&["remote", "add", "origin", path(&bare)]);
        env.git(&["push", "-q", "origin", "main"]);
        Remote { env, bare }
    }

    /// A fresh clone named `name` beside the remote.
    pub fn clone(&self, name: &str) -> PathBuf {
        let dir = self.env.root.path().join(name);
        run_git(
            self.env.root.path(),
            &self.env,
            &["clone", "-q", path(&self.bare), path(&dir)],
        );
        dir
    }

    /// `ralph <args>` in `dir` with the hermetic environment.
    pub fn ralph(&self, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(crate::common::ralph_bin());
        cmd.args(args)
            .current_dir(dir)
            .env_clear()
            .envs(self.env.envs())
            .stdin(Stdio::null());
        cmd
    }

    /// `git <args>` in the bare remote; stdout.
    pub fn remote_git(&self, args: &[&str]) -> String {
        run_git(&self.bare, &self.env, args)
    }

    /// Subjects of the remote branch's commits, oldest first (empty when it has none).
    pub fn remote_log(&self) -> Vec<String> {
        if !self.has_ref(&format!("refs/heads/{BRANCH}")) {
            return Vec::new();
        }
        self.remote_git(&["log", "--reverse", "--format=%s", BRANCH])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The `Ralph-Iteration` trailers on the remote branch, oldest first.
    pub fn remote_iterations(&self) -> Vec<u32> {
        if !self.has_ref(&format!("refs/heads/{BRANCH}")) {
            return Vec::new();
        }
        self.remote_git(&[
            "log",
            "--reverse",
            "--format=%(trailers:key=Ralph-Iteration,valueonly)",
            BRANCH,
        ])
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
    }

    /// Whether the remote has reference `name`.
    pub fn has_ref(&self, name: &str) -> bool {
        Command::new("git")
            .args(["show-ref", "--verify", "--quiet", name])
            .current_dir(&self.bare)
            .env_clear()
            .envs(self.env.envs())
            .status()
            .expect("git show-ref")
            .success()
    }

    /// The subject of the lease commit on the remote, when there is one.
    pub fn lease(&self) -> Option<String> {
        let name = format!("refs/ralph/lease/{BRANCH}");
        self.has_ref(&name)
            .then(|| self.remote_git(&["log", "-1", "--format=%B", &name]))
    }

    /// Whether `sha` is reachable from the remote branch.
    pub fn remote_has(&self, sha: &str) -> bool {
        Command::new("git")
            .args(["merge-base", "--is-ancestor", sha, BRANCH])
            .current_dir(&self.bare)
            .env_clear()
            .envs(self.env.envs())
            .status()
            .expect("git merge-base")
            .success()
    }
}

/// `path` as `&str`.
pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `git <args>` in `dir`, panicking on failure; stdout.
pub fn run_git(dir: &Path, env: &TestEnv, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.envs())
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The records of `dir`'s ledger.
pub fn ledger(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join(".ralph/ledger.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("ledger line"))
        .collect()
}

/// An agent that marks the next story passing, commits its work itself, and leaves one file
/// uncommitted, after `sleep_ms`.
pub fn working_agent(sleep_ms: u64) -> Value {
    json!({"invocations": [], "default": [
        {"claude_init": {}},
        {"sleep_ms": sleep_ms},
        {"append_file": {"path": "work.txt", "content": "one more line\n"}},
        {"set_passes": {"id": "@next", "passes": true}},
        {"git_commit": "agent: work"},
        {"append_file": {"path": "notes.txt", "content": "left uncommitted\n"}},
        {"claude_result": {"text": "did it", "cost_usd": 0.01}}
    ]})
}

/// [`working_agent`] that first writes `agent-started` (excluded from git by the tests that use
/// it), so that a test can act while it works.
pub fn marked_agent(sleep_ms: u64) -> Value {
    let mut script = working_agent(sleep_ms);
    script["default"].as_array_mut().unwrap().insert(
        1,
        json!({"write_file": {"path": "agent-started", "content": ""}}),
    );
    script
}

/// Waits until the agent in `dir` wrote its marker, then removes it.
pub fn agent_started(dir: &Path) {
    let marker = dir.join("agent-started");
    assert!(
        wait_file(&marker, Duration::from_secs(30)),
        "the agent never started"
    );
    let _ = std::fs::remove_file(marker);
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
}

/// Waits up to `limit` for `child`; `None` when it is still running.
pub fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `file` exists (bounded).
pub fn wait_file(file: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if file.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn out_text(out: &Output) -> String {
    text(out)
}

#[test]
fn a_pushed_run_resumes_from_a_fresh_clone_and_releases_its_lease() {
    let r = Remote::new(3, &working_agent(0));
    let first = r.clone("first");
    let out = r
        .ralph(&first, &["run", "--push", "--max-iter", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", out_text(&out));
    // The remote has the iteration: the agent's commit and ralph's checkpoint, its refs, and a
    // released lease.
    assert_eq!(
        r.remote_log()[1..],
        ["agent: work", "ralph: iteration 1 (US-001)"],
        "{}",
        out_text(&out)
    );
    let record = &ledger(&first)[0];
    assert_eq!(record["push"]["status"], "pushed", "{record}");
    let run_id = record["run_id"].as_str().unwrap();
    assert!(r.has_ref(&format!("refs/ralph/{run_id}/1/end")));
    let lease = r.lease().expect("a lease commit");
    assert!(lease.contains("Ralph-Lease-State: released"), "{lease}");
    assert!(!lease.contains("ghp_"), "no token in the lease");

    // A fresh clone: the branch exists only on the remote.
    let second = r.clone("second");
    let out = r.ralph(&second, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    let records = ledger(&second);
    // The books travelled with the branch (refs/ralph/books/<branch>): the new clone's ledger
    // starts from the first worker's record, cost included, and numbering goes on.
    assert_eq!(records[0]["iteration"], 1, "{records:#?}");
    assert_eq!(records[0]["cost_usd"], 0.01, "{records:#?}");
    assert_eq!(records[1]["iteration"], 2, "{records:#?}");
    assert_eq!(records.len(), 3);
    assert_eq!(r.remote_iterations(), [1, 2, 3]);
    // ralph's refs on the remote are the local ones: every iteration's start, and an `end` pin
    // only where the loop did not go straight on (here, the end of the run).
    let run_id = records[1]["run_id"].as_str().unwrap();
    for n in [2, 3] {
        assert!(r.has_ref(&format!("refs/ralph/{run_id}/{n}/start")), "{n}");
    }
    assert!(!r.has_ref(&format!("refs/ralph/{run_id}/2/end")));
    assert!(r.has_ref(&format!("refs/ralph/{run_id}/3/end")));
    // progress.txt goes on: the first worker's entry is still there, then the second's.
    let progress = std::fs::read_to_string(second.join("progress.txt")).unwrap();
    let first_entry = progress.find("iteration 1)").expect("iteration 1's entry");
    let third_entry = progress.find("iteration 3)").expect("iteration 3's entry");
    assert!(first_entry < third_entry, "{progress}");
    // `ralph log` in the new clone shows the whole history (git's part, then the ledger's).
    let log = r.ralph(&second, &["log", "--no-pager"]).output().unwrap();
    let log = String::from_utf8_lossy(&log.stdout);
    assert_eq!(
        log.lines().filter(|l| l.contains("story_passed")).count(),
        3,
        "{log}"
    );
    assert!(r.lease().unwrap().contains("Ralph-Lease-State: released"));
}

#[test]
fn two_workers_on_one_branch_exactly_one_runs_twenty_times() {
    // The agent changes nothing and takes long enough for the other worker to find its lease.
    let r = Remote::new(
        1,
        &json!({"invocations": [], "default": [
            {"claude_init": {}}, {"sleep_ms": 700}, {"claude_result": {"text": "thinking"}}
        ]}),
    );
    let a = r.clone("a");
    let b = r.clone("b");
    let started = Instant::now();
    for round in 0..20 {
        let spawn = |dir: &Path, tag: &str| {
            r.ralph(
                dir,
                &[
                    "run",
                    "--push",
                    "--max-iter",
                    "1",
                    "--max-attempts",
                    "100",
                    "--quiet",
                ],
            )
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(r.env.root.path().join(format!("{tag}-{round}.err")))
                    .unwrap(),
            )
            .spawn()
            .unwrap()
        };
        let wa = spawn(&a, "a");
        let wb = spawn(&b, "b");
        let (oa, ob) = (
            wa.wait_with_output().unwrap(),
            wb.wait_with_output().unwrap(),
        );
        let codes = [oa.status.code(), ob.status.code()];
        let err = |tag: &str| {
            std::fs::read_to_string(r.env.root.path().join(format!("{tag}-{round}.err")))
                .unwrap_or_default()
        };
        let ran = codes.iter().filter(|c| **c == Some(3)).count();
        let held = codes.iter().filter(|c| **c == Some(5)).count();
        assert!(
            ran == 1 && held == 1,
            "round {round}: exit codes {codes:?}\n--- a\n{}\n--- b\n{}",
            err("a"),
            err("b")
        );
        let loser = if codes[0] == Some(5) {
            err("a")
        } else {
            err("b")
        };
        assert!(
            loser.contains("another worker holds the lease on ralph/demo")
                && loser.contains("pid "),
            "round {round}: {loser}"
        );
        // Only the winner's iteration was recorded, and the lease is free again.
        assert!(r.lease().unwrap().contains("Ralph-Lease-State: released"));
    }
    eprintln!("20 lease races in {:?}", started.elapsed());
}

/// Puts a lease commit on the remote as another machine's worker would, expiring in
/// `expires_in_s` seconds (negative: already lapsed).
fn foreign_lease(r: &Remote, expires_in_s: i64) {
    let expires = (chrono::Utc::now() + chrono::Duration::seconds(expires_in_s))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let message = format!(
        "ralph lease: {BRANCH} held by host node-7 pid 4242 job slurm 99_3\n\n\
         Ralph-Lease-Branch: {BRANCH}\nRalph-Lease-State: held\nRalph-Lease-Expires: {expires}\n\
         Ralph-Lease-Host: node-7\nRalph-Lease-Pid: 4242\nRalph-Lease-Job: slurm 99_3\n\
         Ralph-Lease-Machine: another-boot/pid:[1]\nRalph-Lease-Run: 20261201T000000-00001234\n\
         Ralph-Lease-Token: feedfeedfeedfeed\n"
    );
    let tree = r.remote_git(&["hash-object", "-t", "tree", "-w", "/dev/null"]);
    let parent = r
        .has_ref(&format!("refs/ralph/lease/{BRANCH}"))
        .then(|| r.remote_git(&["rev-parse", &format!("refs/ralph/lease/{BRANCH}")]));
    let mut args = vec!["commit-tree", tree.trim(), "-m", &message];
    let parent = parent.map(|p| p.trim().to_owned());
    if let Some(p) = &parent {
        args.extend(["-p", p]);
    }
    let sha = r.remote_git(&args);
    r.remote_git(&[
        "update-ref",
        &format!("refs/ralph/lease/{BRANCH}"),
        sha.trim(),
    ]);
}

#[test]
fn a_live_lease_elsewhere_exits_5_naming_it_and_an_expired_one_is_taken_over() {
    let r = Remote::new(2, &working_agent(0));
    let dir = r.clone("worker");
    foreign_lease(&r, 600);
    let out = r.ralph(&dir, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", out_text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another worker holds the lease on ralph/demo at origin: host node-7 pid 4242 job slurm 99_3"),
        "{stderr}"
    );
    assert_eq!(r.env.agent_calls(), 0, "nothing ran");
    assert!(r.remote_log().is_empty(), "the branch was not touched");

    // The same lease, lapsed: taken over with a warning, and the run completes.
    foreign_lease(&r, -5);
    let out = r.ralph(&dir, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("took over the lease on ralph/demo at origin: host node-7 pid 4242 job slurm 99_3 let it lapse"),
        "{stderr}"
    );
    // Released at the end, as a child of the lapsed lease (the CAS chain goes on).
    let chain = r.remote_git(&["log", "--format=%s", &format!("refs/ralph/lease/{BRANCH}")]);
    let subjects: Vec<&str> = chain.lines().collect();
    assert!(subjects[0].contains("released by"), "{chain}");
    assert!(subjects.last().unwrap().contains("node-7"), "{chain}");
}

#[test]
fn a_worker_killed_on_this_machine_leaves_a_lease_the_next_one_takes_over() {
    let r = Remote::new(1, &working_agent(5_000));
    let dir = r.clone("worker");
    let mut child = r
        .ralph(&dir, &["run", "--push", "--quiet"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it holds the lease, then kill it without a chance to release it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.lease().is_none_or(|l| !l.contains("State: held")) {
        assert!(Instant::now() < deadline, "no lease taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    crate::fault_injection::wait_no_processes(&r.env.script, Duration::from_secs(5));
    r.env.script(&working_agent(0));
    let fresh = r.clone("fresh");
    let out = r.ralph(&fresh, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ran on this machine and is gone"),
        "{}",
        out_text(&out)
    );
}

#[test]
fn a_push_the_remote_refuses_stops_the_run_with_the_work_kept() {
    let r = Remote::new(3, &working_agent(1_500));
    let dir = r.clone("worker");
    // A first iteration lands on the remote.
    r.env.script(&working_agent(0));
    let out = r
        .ralph(&dir, &["run", "--push", "--max-iter", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", out_text(&out));
    // While the next iteration runs, someone else moves the branch on the remote.
    r.env.script(&marked_agent(1_500));
    std::fs::write(dir.join(".git/info/exclude"), "agent-started\n").unwrap();
    let mut child = r
        .ralph(&dir, &["run", "--push", "--max-iter", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let other = r.clone("other");
    agent_started(&dir);
    run_git(&other, &r.env, &["checkout", "-q", BRANCH]);
    std::fs::write(other.join("hotfix.txt"), "by hand\n").unwrap();
    run_git(&other, &r.env, &["add", "-A"]);
    run_git(&other, &r.env, &["commit", "-qm", "hotfix by a human"]);
    run_git(&other, &r.env, &["push", "-q", "origin", BRANCH]);
    assert!(wait_for(&mut child, Duration::from_secs(60)).is_some());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", out_text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("origin rejected the push of ralph/demo"),
        "{stderr}"
    );
    // Never forced: the human's commit is still the remote's head; ralph's work is local.
    assert_eq!(r.remote_log().last().unwrap(), "hotfix by a human");
    let local = run_git(&dir, &r.env, &["log", "-1", "--format=%s"]);
    assert_eq!(local.trim(), "ralph: iteration 2 (US-002)");
    let record = ledger(&dir).pop().unwrap();
    assert_eq!(record["push"]["status"], "rejected", "{record}");
}

#[test]
fn an_unreachable_remote_is_retried_recorded_and_reported_as_unpushed() {
    let r = Remote::new(2, &marked_agent(500));
    let dir = r.clone("worker");
    // Not committed (the remote does not have it): ignored by this clone.
    std::fs::write(
        dir.join("ralph.toml"),
        "push_attempts = 2\npush_backoff = \"100ms\"\n",
    )
    .unwrap();
    std::fs::write(dir.join(".git/info/exclude"), "ralph.toml\nagent-started\n").unwrap();
    let mut child = r
        .ralph(&dir, &["run", "--push", "--max-iter", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The remote goes away while the agent works (a network partition, seen from here).
    let away = r.env.root.path().join("remote-away.git");
    agent_started(&dir);
    std::fs::rename(&r.bare, &away).unwrap();
    assert!(wait_for(&mut child, Duration::from_secs(60)).is_some());
    let out = child.wait_with_output().unwrap();
    std::fs::rename(&away, &r.bare).unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", out_text(&out));
    let record = ledger(&dir).pop().unwrap();
    assert_eq!(record["push"]["status"], "unreachable", "{record}");
    assert_eq!(record["push"]["attempts"], 2, "{record}");
    assert!(record["push"]["error"]
        .as_str()
        .unwrap()
        .contains("does not appear to be a git repository"));
    // Said when it happened (a warning after the iteration, on stderr beside --json).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("iteration 1: could not push ralph/demo to origin (2 attempts)"),
        "{stderr}"
    );
    let finished: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "run_finished")
        .expect("run_finished");
    assert_eq!(finished["exit_code"], 75);
    assert_eq!(finished["push"]["unpushed_commits"], 2, "{finished}");
    assert!(
        finished["caveats"][0]
            .as_str()
            .unwrap()
            .starts_with("not pushed: 2 commits of ralph/demo are only in this clone"),
        "{finished}"
    );
    // Back online: the next run here pushes what was left (the lease its predecessor could not
    // release is taken over: that worker is gone).
    r.env.script(&working_agent(0));
    let out = r.ralph(&dir, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    assert_eq!(r.remote_iterations(), [1, 2]);
}

#[test]
fn a_run_that_fails_after_taking_the_lease_releases_it() {
    // The lease is taken before the dirty-tree check; refusing the tree gives it back at once,
    // so the next attempt (anywhere) is not held off for --lease-ttl.
    let r = Remote::new(1, &working_agent(0));
    let dir = r.clone("worker");
    std::fs::write(dir.join("stray.txt"), "not committed\n").unwrap();
    let out = r.ralph(&dir, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", out_text(&out));
    assert!(out_text(&out).contains("stray.txt"), "{}", out_text(&out));
    let lease = r.lease().expect("a lease commit");
    assert!(lease.contains("State: released"), "{lease}");
}

#[test]
fn before_a_wait_the_iterations_end_pin_is_on_the_remote() {
    // A transient failure, then a long retry wait: a worker evicted (SIGKILL) during the wait
    // leaves the remote with the branch and the `end` pin of the iteration before it.
    let r = Remote::new(
        1,
        &json!({"invocations": [[
            {"claude_init": {}},
            {"claude_api_error": {"status": 529, "message": "API Error: 529 Overloaded. This is a server-side issue, usually temporary"}},
            {"exit": 1}
        ]], "default": []}),
    );
    let dir = r.clone("worker");
    std::fs::write(dir.join("ralph.toml"), "transient_backoff = \"60s\"\n").unwrap();
    std::fs::write(dir.join(".git/info/exclude"), "ralph.toml\n").unwrap();
    let mut child = r
        .ralph(&dir, &["run", "--push"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pinned = String::new();
    while Instant::now() < deadline && pinned.is_empty() {
        pinned = r.remote_git(&[
            "for-each-ref",
            "--format=%(refname) %(objectname)",
            "refs/ralph/*/1/end",
        ]);
        if pinned.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let still_waiting = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(still_waiting, "ralph should be waiting to retry");
    let (_, sha) = pinned
        .trim()
        .split_once(' ')
        .expect("an end pin on the remote");
    assert_eq!(sha, r.remote_git(&["rev-parse", BRANCH]).trim());
    assert_eq!(ledger(&dir)[0]["outcome"], "transient");
}

/// Starts `ralph run --push` with an agent that `agent_ignores_term` or not, waits until the
/// agent runs, sends the signals of `sequence` (after how long since the first, which signal),
/// and returns the exit status, the time from the first signal to the exit, and the output.
fn shutdown(
    r: &Remote,
    dir: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
    sequence: &[(Duration, nix::sys::signal::Signal)],
) -> (Option<i32>, Duration, String) {
    let marker = dir.join("agent-started");
    let mut args = vec!["run", "--push"];
    args.extend_from_slice(extra);
    let stderr_file = r.env.root.path().join("shutdown.stderr");
    let mut child = r
        .ralph(dir, &args)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .spawn()
        .unwrap();
    assert!(
        wait_file(&marker, Duration::from_secs(30)),
        "the agent never started"
    );
    let first = Instant::now();
    let mut status = None;
    for (at, sig) in sequence {
        let left = at.saturating_sub(first.elapsed());
        if let Some(s) = wait_for(&mut child, left) {
            status = Some(s);
            break;
        }
        signal(&child, *sig);
    }
    let status = status.or_else(|| wait_for(&mut child, Duration::from_secs(30)));
    let took = first.elapsed();
    let stderr = std::fs::read_to_string(&stderr_file).unwrap_or_default();
    (status.and_then(|s| s.code()), took, stderr)
}

/// An agent that writes a marker, commits some work, then works for a long time (ignoring
/// SIGTERM when `stubborn`).
fn long_agent(stubborn: bool) -> Value {
    let mut steps = vec![json!({"claude_init": {}})];
    if stubborn {
        steps.push(json!({"ignore_sigterm": true}));
    }
    steps.extend([
        json!({"append_file": {"path": "work.txt", "content": "committed\n"}}),
        json!({"git_commit": "agent: work"}),
        json!({"append_file": {"path": "wip.txt", "content": "not committed yet\n"}}),
        json!({"write_file": {"path": "agent-started", "content": ""}}),
        json!({"sleep_ms": 60_000}),
        json!({"claude_result": {"text": "late"}}),
    ]);
    json!({"invocations": [], "default": steps})
}

#[test]
fn sigterm_pushes_the_checkpoint_and_releases_the_lease_within_the_shutdown_timeout() {
    for stubborn in [false, true] {
        let r = Remote::new(2, &long_agent(stubborn));
        let dir = r.clone("worker");
        std::fs::write(dir.join(".git/info/exclude"), "agent-started\n").unwrap();
        let (code, took, stderr) = shutdown(
            &r,
            &dir,
            &["--shutdown-timeout", "6s"],
            &[],
            &[(Duration::ZERO, nix::sys::signal::Signal::SIGTERM)],
        );
        assert_eq!(code, Some(130), "stubborn={stubborn}: {stderr}");
        assert!(
            took < Duration::from_secs(6),
            "stubborn={stubborn}: took {took:?}"
        );
        // Checkpointed with the uncommitted work, pushed, lease released.
        assert_eq!(
            r.remote_log()[1..],
            ["agent: work", "ralph: iteration 1 (US-001)"],
            "{stderr}"
        );
        let tip = r.remote_git(&["show", &format!("{BRANCH}:wip.txt")]);
        assert_eq!(tip, "not committed yet\n");
        assert!(r.lease().unwrap().contains("State: released"), "{stderr}");
        let record = ledger(&dir).pop().unwrap();
        assert_eq!(record["outcome"], "interrupted");
        assert_eq!(record["push"]["status"], "pushed");
        let sd = &record["shutdown"];
        assert_eq!(sd["signal"], "SIGTERM", "{record}");
        assert_eq!(sd["timeout_s"], 6.0);
        let agent = sd["agent_stopped_s"].as_f64().unwrap();
        let recorded = sd["recorded_s"].as_f64().unwrap();
        // A stubborn agent gets two fifths of the timeout (2.4 s), then SIGKILL.
        if stubborn {
            assert!((2.3..4.0).contains(&agent), "{record}");
        } else {
            assert!(agent < 1.5, "{record}");
        }
        assert!(recorded >= agent && recorded < 6.0, "{record}");
        // A fresh clone resumes after it.
        r.env.script(&working_agent(0));
        let fresh = r.clone("fresh");
        let out = r.ralph(&fresh, &["run", "--push"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
        assert_eq!(r.remote_iterations(), [1, 2, 3]);
    }
}

#[test]
fn github_actions_cancel_sequence_is_finished_before_sigkill() {
    use nix::sys::signal::Signal;
    let r = Remote::new(1, &long_agent(true));
    let dir = r.clone("worker");
    std::fs::write(dir.join(".git/info/exclude"), "agent-started\n").unwrap();
    let outputs = r.env.root.path().join("github_output");
    let summary = r.env.root.path().join("step_summary");
    // The runner's cancel: SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after that.
    let (code, took, stderr) = shutdown(
        &r,
        &dir,
        &[],
        &[
            ("GITHUB_ACTIONS", "true"),
            ("GITHUB_OUTPUT", path(&outputs)),
            ("GITHUB_STEP_SUMMARY", path(&summary)),
        ],
        &[
            (Duration::ZERO, Signal::SIGINT),
            (Duration::from_millis(7_500), Signal::SIGTERM),
            (Duration::from_millis(10_000), Signal::SIGKILL),
        ],
    );
    // ralph (9 s shutdown under GitHub Actions: the agent 3.6 s) ends before the SIGTERM.
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        took < Duration::from_millis(7_500),
        "took {took:?}: {stderr}"
    );
    assert!(r.lease().unwrap().contains("State: released"));
    assert_eq!(
        r.remote_log().last().unwrap(),
        "ralph: iteration 1 (US-001)"
    );
    let record = ledger(&dir).pop().unwrap();
    assert_eq!(record["shutdown"]["signal"], "SIGINT");
    assert_eq!(record["shutdown"]["timeout_s"], 9.0);
    let outputs = std::fs::read_to_string(&outputs).unwrap();
    assert!(outputs.contains("exit_code=130\n"), "{outputs}");
    assert!(outputs.contains("stop_reason=interrupted\n"), "{outputs}");
    assert!(outputs.contains("branch=ralph/demo\n"), "{outputs}");
    assert!(outputs.contains("unpushed_commits=0\n"), "{outputs}");
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(md.contains("## ralph: Demo"), "{md}");
    assert!(
        stderr.contains("::group::iteration 1 · US-001 Story 1"),
        "{stderr}"
    );
}

#[test]
fn preempted_at_random_points_a_fresh_clone_finishes_with_nothing_lost() {
    use nix::sys::signal::Signal;
    let seed = std::env::var("RALPH_PREEMPT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("preemption seed {seed} (replay with RALPH_PREEMPT_SEED={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    for case in 0..6 {
        let r = Remote::new(3, &working_agent(rng.u64(50..400)));
        let first = r.clone("first");
        let timeout = Duration::from_secs(3);
        let mut child = r
            .ralph(
                &first,
                &["run", "--push", "--shutdown-timeout", "3s", "--quiet"],
            )
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Anywhere in the run: startup, an iteration, a checkpoint or a push.
        std::thread::sleep(Duration::from_millis(rng.u64(50..1_500)));
        signal(&child, Signal::SIGTERM);
        if wait_for(&mut child, timeout).is_none() {
            signal(&child, Signal::SIGKILL);
            child.wait().unwrap();
        }
        crate::fault_injection::wait_no_processes(&r.env.script, Duration::from_secs(5));
        // Every commit the agent made in the first clone before the signal.
        let agent_commits: Vec<String> =
            run_git(&first, &r.env, &["log", "--all", "--format=%H %s"])
                .lines()
                .filter(|l| l.ends_with(" agent: work"))
                .map(|l| l[..40].to_owned())
                .collect();
        let before = r.remote_iterations();
        let fresh = r.clone("fresh");
        r.env.script(&working_agent(0));
        let out = r.ralph(&fresh, &["run", "--push"]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "case {case} (seed {seed}): {}",
            out_text(&out)
        );
        for sha in &agent_commits {
            assert!(
                r.remote_has(sha),
                "case {case} (seed {seed}): agent commit {sha} lost"
            );
        }
        // Iteration numbers continue: strictly increasing from 1, the first worker's first.
        let iterations = r.remote_iterations();
        assert!(
            iterations.starts_with(&before),
            "case {case}: {before:?} then {iterations:?}"
        );
        let expected: Vec<u32> = (1..=iterations.len() as u32).collect();
        assert_eq!(iterations, expected, "case {case} (seed {seed})");
        assert!(r.lease().unwrap().contains("State: released"));
    }
    eprintln!("6 preemptions in {:?}", started.elapsed());
}

/// The token of the credential tests (GitHub's shape, so the redaction patterns apply too).
const TOKEN: &str = "ghp_TestToken1234567890";

#[test]
fn the_git_token_reaches_git_through_the_credential_helper_and_nothing_else() {
    use std::io::{BufRead, BufReader, Write};
    // An HTTP "git server" that asks for credentials (401), then refuses what it gets (403),
    // and keeps the Authorization headers it was sent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let server_seen = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten().take(20) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(&stream);
            let mut auth = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("Authorization: ") {
                    auth = Some(v.trim().to_owned());
                }
            }
            let status = if let Some(a) = auth {
                server_seen.lock().unwrap().push(a);
                "403 Forbidden"
            } else {
                "401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\""
            };
            let _ = write!(
                &stream,
                "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    let r = Remote::new(1, &working_agent(0));
    let dir = r.clone("worker");
    run_git(
        &dir,
        &r.env,
        &[
            "remote",
            "set-url",
            "origin",
            &format!("http://127.0.0.1:{port}/o/r.git"),
        ],
    );
    std::fs::write(dir.join("ralph.toml"), "push_attempts = 1\n").unwrap();
    std::fs::write(dir.join(".git/info/exclude"), "ralph.toml\n").unwrap();
    let out = r
        .ralph(&dir, &["run", "--push"])
        .env("RALPH_GIT_TOKEN", TOKEN)
        .output()
        .unwrap();
    // The remote refused the credentials: nothing was done, and the run can be retried later.
    assert_eq!(out.status.code(), Some(75), "{}", out_text(&out));
    let expected = "Basic eC1hY2Nlc3MtdG9rZW46Z2hwX1Rlc3RUb2tlbjEyMzQ1Njc4OTA=";
    assert!(
        seen.lock().unwrap().iter().any(|a| a == expected),
        "{:?}\n{}",
        seen.lock().unwrap(),
        out_text(&out)
    );
    assert!(!out_text(&out).contains(TOKEN), "{}", out_text(&out));
    // The token is in no argument either: the helper reads the variable.
    assert!(!std::fs::read_to_string(dir.join(".git/config"))
        .unwrap()
        .contains(TOKEN));
}

#[test]
fn the_git_token_is_kept_from_the_agent_the_ledger_and_the_transcripts() {
    let mut script = working_agent(0);
    script["record_env"] = json!(["RALPH_GIT_TOKEN"]);
    let r = Remote::new(1, &script);
    let dir = r.clone("worker");
    let out = r
        .ralph(&dir, &["run", "--push"])
        .env("RALPH_GIT_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    let calls = std::fs::read_to_string(format!("{}.calls.jsonl", r.env.script.display())).unwrap();
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert!(call["env"]["RALPH_GIT_TOKEN"].is_null(), "{call}");
    // Nowhere in what ralph wrote: .ralph/ (ledger, state, transcripts), the commits, the lease.
    let mut stack = vec![dir.join(".ralph")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else {
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
            assert!(!text.contains(TOKEN), "{}", p.display());
        }
    }
    let log = r.remote_git(&["log", "--all", "--format=%B"]);
    assert!(!log.contains(TOKEN));
    assert!(!out_text(&out).contains(TOKEN));
}

/// A worker killed mid-iteration, whose lease another worker took over and whose branch it moved
/// on: restarted in its own clone, ralph says what happened and how to keep the leftover
/// changes, and following that hint the clone follows the remote.
#[test]
fn a_killed_worker_whose_branch_moved_on_says_how_to_keep_its_leftovers() {
    let mut script = working_agent(0);
    script["invocations"] = json!([[
        {"claude_init": {}},
        {"write_file": {"path": "work.txt", "content": "c1's half-done work\n"}},
        {"write_file": {"path": "agent-started", "content": ""}},
        {"sleep_ms": 60_000}
    ]]);
    let r = Remote::new(1, &script);
    let c1 = r.clone("c1");
    std::fs::write(c1.join(".git/info/exclude"), "agent-started\n").unwrap();
    let mut child = r
        .ralph(&c1, &["run", "--push", "--quiet"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    agent_started(&c1);
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    crate::fault_injection::wait_no_processes(&r.env.script, Duration::from_secs(5));

    let c2 = r.clone("c2");
    let out = r.ralph(&c2, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));

    let out = r.ralph(&c1, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", out_text(&out));
    let text = out_text(&out);
    assert!(text.contains("ralph/demo moved on at origin"), "{text}");
    assert!(
        text.contains("git stash push --include-untracked"),
        "{text}"
    );
    run_git(
        &c1,
        &r.env,
        &["stash", "push", "--include-untracked", "-m", "kept"],
    );
    let out = r.ralph(&c1, &["run", "--push"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    assert!(
        run_git(&c1, &r.env, &["stash", "show", "-p", "--include-untracked"])
            .contains("c1's half-done work")
    );
}
