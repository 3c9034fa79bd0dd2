//! Process trees: an agent whose grandchildren ignore SIGTERM, hold its stdout open or leave its
//! process group with `setsid`, ended by an interrupt (SIGINT, SIGTERM, a double Ctrl-C) or by
//! `--timeout` / `--idle-timeout` (cases 7 and 8 of shared/cases.md, generalised).
//!
//! Each of the randomized runs draws the trigger, whether the agent itself ignores SIGTERM, and
//! one to three grandchildren with random `ignore_term` / `hold_stdout` / `setsid`. After ralph
//! exits: its exit code is the documented one (130 for interrupts, 3 for a timed-out single
//! iteration), the ledger records the iteration as `interrupted`, `timeout` or `stalled`, and no
//! process of the run is left (none carries the run's environment, which every descendant
//! inherits with `RALPH_AGENT_TAG`, and every recorded grandchild pid is dead).
//!
//! The RNG seed is printed; replay with `RALPH_TREES_SEED=<seed>` (and `RALPH_TREES_CASE=<n>`):
//! `cargo test --features test-fakes process_trees -- --nocapture`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, TestEnv};
use crate::fault_injection::{processes_of, wait_no_processes};

/// Randomized runs per test run (about 25 s on 2 cores: a third of them wait out a 1 s limit).
const CASES: u64 = 30;

/// The longest a run may take before the test calls it hung.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Sigint,
    Sigterm,
    /// Two Ctrl-Cs: the second kills at once.
    DoubleSigint,
    /// `--timeout 1s` while the agent keeps printing.
    Timeout,
    /// `--idle-timeout 1s` while the agent is silent.
    IdleTimeout,
    /// The agent finishes its story and exits, leaving its grandchildren running (case 8).
    AgentExits,
}

#[derive(Debug, Clone, Copy)]
struct Grandchild {
    ignore_term: bool,
    hold_stdout: bool,
    setsid: bool,
}

#[derive(Debug)]
struct Case {
    trigger: Trigger,
    agent_ignores_term: bool,
    grandchildren: Vec<Grandchild>,
    /// For interrupts: how long after the last grandchild started the signal is sent.
    signal_delay: Duration,
}

fn draw(rng: &mut fastrand::Rng) -> Case {
    let trigger = match rng.u8(0..12) {
        0..=2 => Trigger::Sigint,
        3..=4 => Trigger::Sigterm,
        5 => Trigger::DoubleSigint,
        6..=7 => Trigger::Timeout,
        8..=9 => Trigger::IdleTimeout,
        _ => Trigger::AgentExits,
    };
    let grandchildren = (0..rng.usize(1..=3))
        .map(|_| Grandchild {
            ignore_term: rng.u8(0..10) < 7,
            hold_stdout: rng.bool(),
            setsid: rng.u8(0..3) == 0,
        })
        .collect();
    Case {
        trigger,
        agent_ignores_term: rng.bool(),
        grandchildren,
        signal_delay: Duration::from_millis(rng.u64(0..=300)),
    }
}

/// The agent: starts its grandchildren (pids to `../gc-<i>.pid`, outside the repository), writes
/// a file, then hangs: printing a line every 100 ms for `Timeout`, silent otherwise; for
/// `AgentExits` it marks the story passing and exits instead.
fn script(case: &Case) -> Value {
    let mut steps = vec![json!({"claude_init": {}})];
    if case.agent_ignores_term {
        steps.push(json!({"ignore_sigterm": true}));
    }
    for (i, g) in case.grandchildren.iter().enumerate() {
        steps.push(json!({"spawn_grandchild": {
            "ignore_term": g.ignore_term, "hold_stdout": g.hold_stdout, "setsid": g.setsid,
            "sleep_s": 300, "pid_file": format!("../gc-{i}.pid")}}));
    }
    steps.push(json!({"write_file": {"path": "wip.txt", "content": "work in progress\n"}}));
    if case.trigger == Trigger::AgentExits {
        steps.push(json!({"set_passes": {"id": "US-001", "passes": true}}));
        steps.push(json!({"claude_result": {"text": "done"}}));
        return json!({"invocations": [steps]});
    }
    if case.trigger == Trigger::Timeout {
        for i in 0..100 {
            steps.push(json!({"claude_text": format!("still working {i}")}));
            steps.push(json!({"sleep_ms": 100}));
        }
    }
    steps.push(json!({"sleep_ms": 3_600_000}));
    json!({"invocations": [steps]})
}

fn seed() -> u64 {
    match std::env::var("RALPH_TREES_SEED") {
        Ok(s) => s.trim().parse().expect("RALPH_TREES_SEED must be a u64"),
        Err(_) => fastrand::u64(..),
    }
}

/// The cases to run: `RALPH_TREES_CASE` alone, or `RALPH_TREES_CASES` (default [`CASES`]) of
/// them, for a longer soak.
fn cases() -> Vec<u64> {
    if let Ok(s) = std::env::var("RALPH_TREES_CASE") {
        return vec![s.trim().parse().expect("RALPH_TREES_CASE must be a number")];
    }
    let count = std::env::var("RALPH_TREES_CASES")
        .map(|s| {
            s.trim()
                .parse()
                .expect("RALPH_TREES_CASES must be a number")
        })
        .unwrap_or(CASES);
    (0..count).collect()
}

/// The grandchild pids the agent recorded so far.
fn grandchild_pids(env: &TestEnv, n: usize) -> Vec<Option<i32>> {
    (0..n)
        .map(|i| {
            std::fs::read_to_string(env.root.path().join(format!("gc-{i}.pid")))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let i = stat.rfind(')')?;
            stat[i + 1..].split_whitespace().next().map(str::to_owned)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("signal ralph");
}

/// Runs case `n`; `Err` says what broke. Kills whatever it finds left over before returning.
fn run_case(seed: u64, n: u64) -> Result<String, String> {
    run_case_in(seed, n, None)
}

/// [`run_case`] with `--sandbox <mode>` when `sandbox` is given (tests/it/sandbox.rs); the test's
/// directory is made writable inside, as the fake agent keeps its pid files there.
pub(crate) fn run_case_in(seed: u64, n: u64, sandbox: Option<&str>) -> Result<String, String> {
    let mut rng = fastrand::Rng::with_seed(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let case = draw(&mut rng);
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "kill_grace = \"300ms\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&script(&case));
    let root = env.root.path().display().to_string();
    let mut args = vec!["run", "--max-iter", "1"];
    if let Some(mode) = sandbox {
        args.extend(["--sandbox", mode, "--sandbox-writable", &root]);
    }
    match case.trigger {
        Trigger::Timeout => args.extend(["--timeout", "1s"]),
        Trigger::IdleTimeout => args.extend(["--idle-timeout", "1s"]),
        _ => {}
    }
    let stderr_path = env.root.path().join("ralph.stderr");
    let mut child = env
        .ralph_cmd(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("start ralph");
    let started = Instant::now();
    let result = (|| {
        let count = case.grandchildren.len();
        if matches!(
            case.trigger,
            Trigger::Sigint | Trigger::Sigterm | Trigger::DoubleSigint
        ) {
            // Wait for the whole tree (and the agent's file), then interrupt.
            while !(grandchild_pids(&env, count).iter().all(Option::is_some)
                && env.path("wip.txt").exists())
            {
                if started.elapsed() > RUN_DEADLINE {
                    return Err("the agent never started its grandchildren".to_string());
                }
                if child.try_wait().expect("try_wait").is_some() {
                    return Err(format!(
                        "ralph exited before the interrupt:\n{}",
                        std::fs::read_to_string(&stderr_path).unwrap_or_default()
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(case.signal_delay);
            use nix::sys::signal::Signal::{SIGINT, SIGTERM};
            match case.trigger {
                Trigger::Sigterm => signal(child.id(), SIGTERM),
                Trigger::DoubleSigint => {
                    signal(child.id(), SIGINT);
                    std::thread::sleep(Duration::from_millis(rng.u64(0..=200)));
                    if child.try_wait().expect("try_wait").is_none() {
                        signal(child.id(), SIGINT);
                    }
                }
                _ => signal(child.id(), SIGINT),
            }
        }
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > RUN_DEADLINE {
                return Err(format!("ralph hung for {RUN_DEADLINE:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = started.elapsed();
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let (code, outcome) = match case.trigger {
            Trigger::Timeout => (3, "timeout"),
            Trigger::IdleTimeout => (3, "stalled"),
            Trigger::AgentExits => (0, "story_passed"),
            _ => (130, "interrupted"),
        };
        if status.code() != Some(code) {
            return Err(format!(
                "exit {:?}, expected {code}:\n{stderr}",
                status.code()
            ));
        }
        let outcomes: Vec<String> = env
            .ledger()
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or("?").to_string())
            .collect();
        if outcomes != [outcome] {
            return Err(format!(
                "ledger outcomes {outcomes:?}, expected [{outcome}]"
            ));
        }
        // The interrupted or killed iteration's work is kept in a checkpoint commit.
        let log = env.git(&["log", "--format=%s", "--", "wip.txt"]);
        if !log.contains("ralph: iteration 1 (US-001)") {
            return Err(format!("wip.txt is not in a checkpoint commit: {log:?}"));
        }
        // Nothing of the tree may outlive ralph. A moment for the kernel to finish the kills.
        // (A setsid grandchild of an agent that exited normally once survived here; ralph now
        // kills every process tagged with the iteration's RALPH_AGENT_TAG, and
        // an_agent_exiting_normally_leaves_no_setsid_grandchild_behind reproduces it.)
        let left = wait_no_processes(&env.script, Duration::from_secs(3));
        if !left.is_empty() {
            return Err(format!("survivors after ralph exited: {left:?}"));
        }
        // Inside a sandbox's PID namespace the recorded pids are the namespace's, not the
        // host's: the environment scan above is the check there.
        let recorded = if sandbox.is_some() {
            Vec::new()
        } else {
            grandchild_pids(&env, count)
        };
        if let Some(pid) = recorded.iter().flatten().find(|&&pid| alive(pid)) {
            return Err(format!("recorded grandchild {pid} is alive"));
        }
        Ok(format!("exit {code} after {took:?}"))
    })();
    // Whatever happened, leave nothing running.
    let _ = child.kill();
    let _ = child.wait();
    for (pid, _) in processes_of(&env.script) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    result.map_err(|e| format!("{case:?}: {e}"))
}

#[test]
fn interrupts_and_timeouts_leave_no_process_of_the_agent_tree() {
    let seed = seed();
    eprintln!(
        "process trees seed {seed} (replay: RALPH_TREES_SEED={seed} cargo test --features test-fakes process_trees)"
    );
    let started = Instant::now();
    let mut failures = Vec::new();
    for n in cases() {
        if let Err(e) = run_case(seed, n) {
            failures.push(format!(
                "case {n} (RALPH_TREES_SEED={seed} RALPH_TREES_CASE={n}): {e}"
            ));
        }
    }
    eprintln!(
        "process trees: {} cases in {:?}",
        cases().len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {} cases failed:\n{}",
        failures.len(),
        cases().len(),
        failures.join("\n")
    );
}

/// Case 8 with a grandchild that also left the agent's session: the agent exits normally, and
/// its `setsid` child (now orphaned, so no parent link leads to it) must not outlive the
/// iteration.
#[test]
fn an_agent_exiting_normally_leaves_no_setsid_grandchild_behind() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"spawn_grandchild": {"ignore_term": true, "hold_stdout": false, "setsid": true,
            "sleep_s": 300, "pid_file": "../escapee.pid"}},
        {"write_file": {"path": "work.txt", "content": "work\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    let escapee: i32 = std::fs::read_to_string(env.root.path().join("escapee.pid"))
        .expect("the grandchild was started")
        .trim()
        .parse()
        .expect("pid");
    let left = wait_no_processes(&env.script, Duration::from_secs(1));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(escapee),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::text(&out));
    assert!(
        left.is_empty(),
        "the agent's setsid grandchild survived the iteration: {left:?}"
    );
}
