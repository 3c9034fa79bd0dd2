//! Fault injection: `ralph run` SIGKILLed at random points of the iteration lifecycle, then
//! resumed (cases 22 and 17 of shared/cases.md, generalised).
//!
//! Each case starts a repository with three open stories and a scripted claude-dialect agent that
//! writes files, marks the open story passing, sometimes commits and sometimes leaves work
//! uncommitted, with random pauses between its steps. ralph is killed one to three times per case at a
//! point drawn from one of four phases, each timed from what a calibration run measured:
//! - `startup`: during preflight, before the first agent starts;
//! - `agent`: while the agent writes files, edits prd.json or commits;
//! - `after-agent`: after the agent exited, while ralph classifies, checkpoints, commits, appends
//!   progress.txt and the ledger and saves state.json;
//! - `anywhere`: uniformly over the whole run.
//!
//! After every kill: prd.json loads with ralph's own loader (or, if the killed agent was
//! rewriting it, the resume must restore it), the ledger parses (a torn last line is tolerated)
//! and state.json loads. Sometimes the test then tears the ledger's last line itself, as a power
//! loss could. After the final `ralph run`: it exits 0 with every story passing, the ledger has
//! no torn line, its iteration numbers run 1, 2, 3, ... without duplicates (a gap only where a
//! torn record was cut off), every file the agent had written before a kill is committed with
//! the same content, the tree is clean, and no process of the case is left.
//!
//! The RNG seed is printed; replay with `RALPH_FAULT_SEED=<seed>` (and `RALPH_FAULT_CASE=<n>`
//! for one case): `cargo test --features test-fakes fault_injection -- --nocapture`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, TestEnv};

/// Cases per test run (about 15 s on 2 cores; a kill and a resume take well under a second).
const CASES: u64 = 30;
/// Stories in each case's prd.json.
const STORIES: usize = 3;
/// Agent invocations scripted per case: enough for every story plus the interrupted ones.
const INVOCATIONS: usize = 16;
/// The longest a single `ralph run` may take before the test calls it hung.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// The seed: `RALPH_FAULT_SEED` or a fresh random one.
fn seed() -> u64 {
    match std::env::var("RALPH_FAULT_SEED") {
        Ok(s) => s.trim().parse().expect("RALPH_FAULT_SEED must be a u64"),
        Err(_) => fastrand::u64(..),
    }
}

/// The cases to run: `RALPH_FAULT_CASE` alone, or `RALPH_FAULT_CASES` (default [`CASES`]) of
/// them, for a longer soak.
fn cases() -> Vec<u64> {
    if let Ok(s) = std::env::var("RALPH_FAULT_CASE") {
        return vec![s.trim().parse().expect("RALPH_FAULT_CASE must be a number")];
    }
    let count = std::env::var("RALPH_FAULT_CASES")
        .map(|s| {
            s.trim()
                .parse()
                .expect("RALPH_FAULT_CASES must be a number")
        })
        .unwrap_or(CASES);
    (0..count).collect()
}

/// One case's agent script: `INVOCATIONS` invocations, each writing uniquely named files.
fn agent_script(rng: &mut fastrand::Rng) -> Value {
    let invocations: Vec<Value> = (0..INVOCATIONS)
        .map(|k| {
            let mut steps = vec![
                json!({"claude_init": {}}),
                json!({"sleep_ms": rng.u64(0..=30)}),
                json!({"write_file": {"path": format!("w-{k}-a.txt"), "content": format!("invocation {k} a\n")}}),
                json!({"claude_tool": {"name": "Write", "input": {"file_path": format!("w-{k}-a.txt")}, "result": "ok"}}),
                json!({"sleep_ms": rng.u64(0..=30)}),
                json!({"write_file": {"path": format!("sub/w-{k}-b.txt"), "content": format!("invocation {k} b\n")}}),
                json!({"set_passes": {"id": "@next", "passes": true}}),
            ];
            if rng.bool() {
                steps.push(json!({"append_file": {"path": "progress.txt", "content": format!("- agent note {k}\n")}}));
            }
            steps.push(json!({"sleep_ms": rng.u64(0..=30)}));
            if rng.u8(0..3) > 0 {
                steps.push(json!({"git_commit": format!("feat: invocation {k}")}));
            }
            steps.push(json!({"write_file": {"path": format!("w-{k}-c.txt"), "content": format!("invocation {k} c, uncommitted\n")}}));
            steps.push(json!({"claude_result": {"text": format!("did invocation {k}"), "cost_usd": 0.01}}));
            Value::Array(steps)
        })
        .collect();
    json!({"invocations": invocations})
}

/// A new repository for one case, with its agent script.
fn case_env(rng: &mut fastrand::Rng) -> TestEnv {
    let env = TestEnv::new(&prd_with_stories(STORIES));
    env.script(&agent_script(rng));
    env
}

/// `ralph run` started in the background, its output going to files beside the repository.
struct Running {
    child: Child,
    started: Instant,
    stdout: PathBuf,
    stderr: PathBuf,
}

fn start_ralph(env: &TestEnv, tag: &str) -> Running {
    let stdout = env.root.path().join(format!("{tag}.stdout"));
    let stderr = env.root.path().join(format!("{tag}.stderr"));
    let child = env
        .ralph_cmd(&["run", "--max-iter", "20"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("start ralph");
    Running {
        child,
        started: Instant::now(),
        stdout,
        stderr,
    }
}

impl Running {
    /// Waits for the exit (at most [`RUN_DEADLINE`], then kills it); returns the code and stderr.
    fn finish(mut self) -> Result<(Option<i32>, String), String> {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if self.started.elapsed() > RUN_DEADLINE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!(
                    "ralph run hung for {RUN_DEADLINE:?}; stderr:\n{}",
                    self.stderr_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Ok((status.code(), self.stderr_text()))
    }

    fn stderr_text(&self) -> String {
        let mut s = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        if !out.is_empty() {
            let _ = write!(s, "\n--- stdout\n{out}");
        }
        s
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// SIGKILLs ralph (if still running) and reaps it; `false` if it had already exited.
    fn sigkill(&mut self) -> bool {
        if self.exited() {
            return false;
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL ralph");
        let status = self.child.wait().expect("wait");
        // It may have exited by itself between the check and the signal.
        status.code().is_none()
    }
}

/// Pids of the agents started so far in the case, in order (from the fake's call log).
fn agent_pids(env: &TestEnv) -> Vec<i32> {
    env.read("../script.json.calls.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// Whether `pid` is gone or a zombie.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Live processes started for this case: they carry its fake-agent script path in their
/// environment (ralph passes its environment on to the agent and everything the agent starts).
pub(crate) fn processes_of(script: &Path) -> Vec<(i32, String)> {
    let needle = format!("RALPH_FAKE_SCRIPT={}", script.display());
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !environ.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        if dead(pid) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        found.push((pid, cmdline));
    }
    found
}

/// Waits (bounded) until no process of the case is left; returns the survivors, if any.
pub(crate) fn wait_no_processes(script: &Path, limit: Duration) -> Vec<(i32, String)> {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes_of(script);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the calibration run measured (typical durations of the lifecycle's phases).
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// From `ralph run` to the first agent start.
    startup: Duration,
    /// One agent's life, start to exit.
    agent: Duration,
    /// From an agent's exit to the next agent start or to ralph's exit.
    after_agent: Duration,
    /// The whole run.
    total: Duration,
}

/// Where a kill lands.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// `delay` after ralph started, before the first agent.
    Startup { delay: Duration },
    /// `delay` after agent number `nth` (1-based, counted in this ralph run) started.
    Agent { nth: usize, delay: Duration },
    /// `delay` after agent number `nth` exited.
    AfterAgent { nth: usize, delay: Duration },
    /// `delay` after ralph started.
    Anywhere { delay: Duration },
}

/// A kill point for a run that has `open` stories left (at least 1).
fn pick_phase(rng: &mut fastrand::Rng, t: &Timing, open: usize) -> Phase {
    // A fraction of the phase, so that a replay draws the same numbers whatever the timing.
    let within = |rng: &mut fastrand::Rng, d: Duration| d.mul_f64(rng.f64());
    let open = open.clamp(1, STORIES);
    match rng.u8(0..4) {
        0 => Phase::Startup {
            delay: within(rng, t.startup),
        },
        1 => Phase::Agent {
            nth: rng.usize(1..=open),
            delay: within(rng, t.agent),
        },
        2 => Phase::AfterAgent {
            nth: rng.usize(1..=open),
            delay: within(rng, t.after_agent),
        },
        _ => Phase::Anywhere {
            delay: within(rng, t.total.mul_f64(open as f64 / STORIES as f64)),
        },
    }
}

/// Waits until `phase`'s point in `run` and SIGKILLs ralph there. `agents_before` is how many
/// agents earlier runs of the case started. Returns whether ralph was killed (`false`: it
/// finished first).
fn kill_at(env: &TestEnv, run: &mut Running, phase: Phase, agents_before: usize) -> bool {
    let wait_for = |run: &mut Running, cond: &mut dyn FnMut() -> bool| -> bool {
        loop {
            if cond() {
                return true;
            }
            if run.exited() || run.started.elapsed() > RUN_DEADLINE {
                return false;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    };
    let (anchor, delay) = match phase {
        Phase::Startup { delay } | Phase::Anywhere { delay } => (run.started, delay),
        Phase::Agent { nth, delay } => {
            if !wait_for(run, &mut || agent_pids(env).len() >= agents_before + nth) {
                return run.sigkill();
            }
            (Instant::now(), delay)
        }
        Phase::AfterAgent { nth, delay } => {
            let mut pid = None;
            let found = wait_for(run, &mut || {
                if pid.is_none() {
                    pid = agent_pids(env).get(agents_before + nth - 1).copied();
                }
                pid.is_some_and(dead)
            });
            if !found {
                return run.sigkill();
            }
            (Instant::now(), delay)
        }
    };
    let at = anchor + delay;
    while Instant::now() < at {
        if run.exited() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    run.sigkill()
}

/// The agent's files (`w-*.txt`, also under `sub/`) and their contents.
fn agent_files(env: &TestEnv) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for dir in ["", "sub/"] {
        let Ok(entries) = std::fs::read_dir(env.path(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("w-") && name.ends_with(".txt") {
                let rel = format!("{dir}{name}");
                files.insert(rel.clone(), env.read(&rel));
            }
        }
    }
    files
}

/// Cuts the ledger's last line short at a random byte (a power loss mid-append); returns the
/// iteration of the record that was cut, if the cut made it unparsable.
fn tear_ledger(env: &TestEnv, rng: &mut fastrand::Rng) -> Option<Option<u64>> {
    let path = env.path(".ralph/ledger.jsonl");
    let bytes = std::fs::read(&path).ok()?;
    if bytes.last() != Some(&b'\n') {
        return None;
    }
    let body = &bytes[..bytes.len() - 1];
    let start = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let record: Value = serde_json::from_slice(&body[start..]).ok()?;
    // Anything from one byte of the line to the whole line without its newline.
    let cut = rng.usize(start + 1..=body.len());
    std::fs::write(&path, &bytes[..cut]).expect("tear the ledger");
    Some((cut < body.len()).then(|| record["iteration"].as_u64().unwrap_or(0)))
}

/// What happened in one case, for the failure report.
#[derive(Debug, Default)]
struct CaseLog {
    lines: Vec<String>,
}

impl CaseLog {
    fn note(&mut self, s: impl Into<String>) {
        self.lines.push(s.into());
    }
}

/// Runs case `n`; `Err` describes what broke.
fn run_case(seed: u64, n: u64, timing: &Timing, log: &mut CaseLog) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let env = case_env(&mut rng);
    let kills = rng.usize(1..=3);
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut prd_broken_by_agent = false;
    let mut torn_iterations: Vec<u64> = Vec::new();
    let mut injected_tear = false;
    let mut tear_pending = false;
    let mut killed = 0;
    for k in 0..kills {
        let open = ralph::prd::store::load(&env.path("prd.json"))
            .map(|l| l.prd.user_stories.iter().filter(|s| !s.passes).count())
            .unwrap_or(STORIES);
        let phase = pick_phase(&mut rng, timing, open);
        let wait_orphans = rng.u8(0..4) > 0;
        let agents_before = agent_pids(&env).len();
        let mut run = start_ralph(&env, &format!("kill{k}"));
        let was_killed = kill_at(&env, &mut run, phase, agents_before);
        let elapsed = run.started.elapsed();
        // A restart that restored prd.json says so, whether it then finished or was killed.
        const RESTORED: &str = "restored it from the iteration's snapshot";
        if !was_killed {
            let (code, stderr) = run.finish()?;
            prd_broken_by_agent &= !stderr.contains(RESTORED);
            log.note(format!(
                "run {k}: {phase:?} missed: ralph exited {code:?} first"
            ));
            if code == Some(0) {
                break;
            }
            return Err(format!("ralph exited {code:?} before the kill:\n{stderr}"));
        }
        prd_broken_by_agent &= !run.stderr_text().contains(RESTORED);
        killed += 1;
        log.note(format!(
            "run {k}: killed at {phase:?} ({elapsed:?} after start); agents so far {}; {}",
            agent_pids(&env).len(),
            if wait_orphans {
                "orphans may finish"
            } else {
                "restart at once"
            }
        ));
        // The killed ralph's agent dies with it (PR_SET_PDEATHSIG); its own children (a `git
        // commit`) may run on for a moment.
        for pid in agent_pids(&env) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !dead(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if wait_orphans {
            let left = wait_no_processes(&env.script, Duration::from_secs(15));
            if !left.is_empty() {
                return Err(format!("processes outlived the killed run: {left:?}"));
            }
        }

        // prd.json: ralph writes it only atomically, so only a killed agent can leave it torn;
        // the resume must then restore it.
        if let Err(e) = ralph::prd::store::load(&env.path("prd.json")) {
            log.note(format!(
                "prd.json invalid after the kill (agent torn write): {e}"
            ));
            prd_broken_by_agent = true;
        }
        match ralph::ledger::read_all(&env.path(".ralph/ledger.jsonl")) {
            Ok(contents) => match contents.torn_last_line {
                // A tear the test made earlier that no run has appended after (and so repaired).
                Some(_) if tear_pending => {}
                Some(line) => log.note(format!("ledger torn at line {line} by the kill")),
                None => tear_pending = false,
            },
            Err(e) => return Err(format!("ledger unreadable after the kill: {e}")),
        }
        if let Err(e) = ralph::state::State::load(&env.path(".ralph")) {
            return Err(format!("state.json unreadable after the kill: {e}"));
        }
        for (path, content) in agent_files(&env) {
            written.insert(path, content);
        }
        if rng.u8(0..4) == 0 {
            if let Some(cut) = tear_ledger(&env, &mut rng) {
                injected_tear = true;
                tear_pending = true;
                log.note(format!(
                    "tore the ledger's last line (dropped record: {cut:?})"
                ));
                torn_iterations.extend(cut);
            }
        }
    }

    const RESTORED: &str = "restored it from the iteration's snapshot";
    let ledger_before = std::fs::read(env.path(".ralph/ledger.jsonl")).unwrap_or_default();
    let resume = start_ralph(&env, "resume0");
    let (code, stderr) = resume.finish()?;
    log.note(format!("resume exited {code:?}"));
    if code != Some(0) {
        return Err(format!("the resumed run exited {code:?}:\n{stderr}"));
    }
    if prd_broken_by_agent && !stderr.contains(RESTORED) {
        return Err(format!(
            "prd.json was broken by the killed agent but the resume did not say it restored it:\n{stderr}"
        ));
    }
    let prd = ralph::prd::store::load(&env.path("prd.json"))
        .map_err(|e| format!("prd.json invalid after the resume: {e}"))?;
    if !prd.prd.all_pass() {
        return Err(format!("exit 0 but stories are open:\n{stderr}"));
    }

    // The ledger: whole lines only, numbering 1, 2, 3... with no duplicate.
    let ledger_path = env.path(".ralph/ledger.jsonl");
    let contents = ralph::ledger::read_all(&ledger_path)
        .map_err(|e| format!("ledger unreadable after the resume: {e}"))?;
    let appended = std::fs::read(&ledger_path).unwrap_or_default() != ledger_before;
    if contents.torn_last_line.is_some() {
        if appended || !injected_tear {
            return Err(format!(
                "the ledger still has a torn last line after the resume:\n{}",
                env.read(".ralph/ledger.jsonl")
            ));
        }
        // Nothing was appended, so nothing repaired it: the known gap covered by
        // `a_torn_ledger_line_is_repaired_even_when_the_resume_has_nothing_to_do`.
        log.note("torn line left: the resume appended nothing");
    }
    let iterations: Vec<u64> = contents
        .records
        .iter()
        .map(|r| u64::from(r.iteration))
        .collect();
    let mut expected = 1u64;
    for &it in &iterations {
        while it > expected && torn_iterations.contains(&expected) {
            expected += 1;
        }
        if it != expected {
            return Err(format!(
                "ledger iterations {iterations:?} do not continue 1, 2, 3... (torn: {torn_iterations:?})"
            ));
        }
        expected += 1;
    }
    let interrupted = contents
        .records
        .iter()
        .filter(|r| r.outcome == ralph::protocol::Outcome::Interrupted)
        .count();
    if interrupted > killed {
        return Err(format!(
            "{interrupted} interrupted iterations for {killed} kills: {iterations:?}"
        ));
    }
    if injected_tear && appended && !torn_iterations.is_empty() {
        let kept = std::fs::read_dir(env.path(".ralph"))
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("ledger.torn-"))
            })
            .unwrap_or(false);
        if !kept {
            return Err("the torn ledger bytes were not kept in .ralph/ledger.torn-*".into());
        }
    }

    // No agent change lost: each file is committed with the content it had at the kill.
    for (path, content) in &written {
        let now = env.read(path);
        if &now != content {
            return Err(format!(
                "{path} changed from {content:?} to {now:?} after the resume"
            ));
        }
        let committed = std::process::Command::new("git")
            .args(["show", &format!("HEAD:{path}")])
            .current_dir(&env.repo)
            .env_clear()
            .envs(env.envs())
            .output()
            .expect("git show");
        if String::from_utf8_lossy(&committed.stdout) != *content || !committed.status.success() {
            return Err(format!(
                "{path} (written by the agent before the kill) is not committed as {content:?}"
            ));
        }
    }
    let status = env.git(&["status", "--porcelain"]);
    if !status.trim().is_empty() {
        return Err(format!("the tree is not clean after the resume:\n{status}"));
    }
    let left = wait_no_processes(&env.script, Duration::from_secs(5));
    if !left.is_empty() {
        return Err(format!("processes left after the resume: {left:?}"));
    }
    log.note(format!(
        "ok: ledger iterations {iterations:?}, {} agent files checked",
        written.len()
    ));
    Ok(())
}

/// Runs one case without kills and measures the lifecycle's phases.
fn calibrate(seed: u64) -> Timing {
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = case_env(&mut rng);
    let mut run = start_ralph(&env, "calibrate");
    let mut starts: Vec<(i32, Instant)> = Vec::new();
    let mut exits: BTreeMap<i32, Instant> = BTreeMap::new();
    let end = loop {
        for pid in agent_pids(&env) {
            if !starts.iter().any(|(p, _)| *p == pid) {
                starts.push((pid, Instant::now()));
            }
        }
        for (pid, _) in &starts {
            if !exits.contains_key(pid) && dead(*pid) {
                exits.insert(*pid, Instant::now());
            }
        }
        if run.exited() {
            break Instant::now();
        }
        assert!(run.started.elapsed() < RUN_DEADLINE, "calibration run hung");
        std::thread::sleep(Duration::from_micros(500));
    };
    let run_started = run.started;
    let (code, stderr) = run.finish().expect("calibration run");
    assert_eq!(code, Some(0), "calibration run failed:\n{stderr}");
    assert!(!starts.is_empty(), "calibration run started no agent");
    let startup = starts[0].1 - run_started;
    let mut agent = Duration::ZERO;
    let mut after = Duration::ZERO;
    for (i, (pid, at)) in starts.iter().enumerate() {
        let exit = exits.get(pid).copied().unwrap_or(end);
        agent = agent.max(exit - *at);
        let next = starts.get(i + 1).map_or(end, |(_, t)| *t);
        after = after.max(next.saturating_duration_since(exit));
    }
    let total = end - run_started;
    // Margins: the machine is shared, and a kill just past the phase is still a useful kill.
    Timing {
        startup: startup.mul_f32(1.3),
        agent: agent.mul_f32(1.3),
        after_agent: after.mul_f32(1.3),
        total: total.mul_f32(1.1),
    }
}

#[test]
fn sigkill_at_random_points_then_resume_loses_nothing() {
    let seed = seed();
    eprintln!(
        "fault injection seed {seed} (replay: RALPH_FAULT_SEED={seed} cargo test --features test-fakes fault_injection)"
    );
    let timing = calibrate(seed);
    eprintln!("fault injection timing: {timing:?}");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut kills_landed = 0;
    let mut prd_torn = 0;
    let mut ledger_torn_by_kill = 0;
    let mut ledger_torn_by_test = 0;
    for n in cases() {
        let mut log = CaseLog::default();
        let result = run_case(seed, n, &timing, &mut log);
        let count = |what: &str| log.lines.iter().filter(|l| l.contains(what)).count();
        kills_landed += count("killed at");
        prd_torn += count("prd.json invalid after the kill");
        ledger_torn_by_kill += count("ledger torn at line");
        ledger_torn_by_test += count("tore the ledger");
        if let Err(e) = result {
            failures.push(format!(
                "case {n} (RALPH_FAULT_SEED={seed} RALPH_FAULT_CASE={n}):\n  {}\n  => {e}",
                log.lines.join("\n  ")
            ));
        }
    }
    eprintln!(
        "fault injection: {} cases, {kills_landed} kills ({prd_torn} left prd.json torn by the agent, {ledger_torn_by_kill} a torn ledger; {ledger_torn_by_test} ledgers torn by the test), in {:?}",
        cases().len(),
        started.elapsed()
    );
    // A run of cases whose kills all missed (ralph finished first each time) would check
    // nothing: at least one kill per two cases must have landed.
    let minimum = cases().len().div_ceil(2);
    assert!(
        kills_landed >= minimum,
        "seed {seed}: only {kills_landed} of the kills landed in {} cases (at least {minimum} \
         expected): the kill points missed the runs",
        cases().len()
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {} cases failed:\n{}",
        failures.len(),
        cases().len(),
        failures.join("\n\n")
    );
}

/// One claude-dialect invocation that finishes the open story.
fn finishing_invocation() -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": "done.txt", "content": "done\n"}},
        {"set_passes": {"id": "@next", "passes": true}},
        {"claude_result": {"text": "done"}}
    ])
}

/// A ledger whose last line a crash tore is repaired by the next `ralph run` even when that run
/// has no iteration to do (every story already passes), and the torn bytes are kept.
#[test]
fn a_torn_ledger_line_is_repaired_even_when_the_resume_has_nothing_to_do() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [finishing_invocation()]}));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::text(&out));
    let ledger = env.path(".ralph/ledger.jsonl");
    let whole = std::fs::read(&ledger).unwrap();
    let fragment = br#"{"run_id":"2026-01-01T00-00-00Z-1","iteration":2,"story_"#;
    let mut torn = whole.clone();
    torn.extend_from_slice(fragment);
    std::fs::write(&ledger, &torn).unwrap();

    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::text(&out));
    assert_eq!(
        std::fs::read(&ledger).unwrap(),
        whole,
        "the torn line is still there"
    );
    let kept: Vec<Vec<u8>> = std::fs::read_dir(env.path(".ralph"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ledger.torn-"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    assert_eq!(kept, [fragment.to_vec()]);
}

/// A run that ends before its first checkpoint (here the agent cannot be executed: a script
/// whose interpreter does not exist; a SIGKILL between start-up and the first iteration does the
/// same) leaves ralph's freshly created progress.txt untracked. The next `ralph run` must not
/// refuse that as the user's uncommitted work.
#[test]
fn a_run_that_ends_before_its_first_checkpoint_does_not_block_the_next_one() {
    let env = TestEnv::new(&prd_with_stories(1));
    let broken = env.root.path().join("broken-agent");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    env.script(&json!({"invocations": [finishing_invocation()]}));
    let out = env.ralph(&["run", "--agent-program", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", crate::common::text(&out));
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::text(&out));
    assert_eq!(env.read("done.txt"), "done\n");
}

/// A ralph SIGKILLed while it holds a git lock (inside `index.write()` of its checkpoint commit,
/// or while creating the branch) leaves `.git/index.lock` (or `refs/heads/<branch>.lock`)
/// behind; no process holds it any more. The restart, which knows the previous ralph died,
/// must not fail on it. Emulated here: the kill mid-iteration, then the lock file a kill inside
/// the commit leaves.
#[test]
fn a_git_lock_left_by_a_killed_ralph_does_not_block_the_restart() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"write_file": {"path": "partial.txt", "content": "half\n"}},
         {"sleep_ms": 3_600_000}],
        finishing_invocation()
    ]}));
    let mut run = start_ralph(&env, "first");
    let deadline = Instant::now() + RUN_DEADLINE;
    while !env.path("partial.txt").exists() {
        assert!(Instant::now() < deadline, "the agent never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(run.sigkill(), "ralph exited before the kill");
    std::fs::write(env.path(".git/index.lock"), b"").unwrap();
    let resume = start_ralph(&env, "resume");
    let (code, stderr) = resume.finish().unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(env.read("partial.txt"), "half\n");
    assert!(!env.path(".git/index.lock").exists());
}

/// A ralph SIGKILLed inside `ensure_ralph_dir`, between creating `.ralph/.gitignore` and writing
/// `*` into it, leaves an empty ignore file. The next runs must still ignore `.ralph/` (and so
/// neither refuse a "dirty" tree nor, with `--allow-dirty`, commit transcripts that can hold
/// secrets). Found by the fault injection (seed 16184628232820842631, case 171).
#[test]
fn a_ralph_killed_while_creating_its_directory_does_not_block_the_next_run() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [finishing_invocation()]}));
    std::fs::create_dir_all(env.path(".ralph")).unwrap();
    std::fs::write(env.path(".ralph/.gitignore"), "").unwrap();
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::common::text(&out));
    let tracked = env.git(&["ls-files", ".ralph"]);
    assert!(
        tracked.is_empty(),
        "ralph's own files were committed: {tracked}"
    );
}
