//! `ralph::process` and `ralph::signals` against real `sh` children: timeouts, stray
//! grandchildren, idle and final-event kills, stdin delivery, hostile output and signals
//! (cases 7-10, 14, 15 and 22 of the field notes).
//!
//! Every child is killed by the code under test; each test then checks through `/proc` that no
//! live process of its group is left, so a leak fails the test instead of lingering.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ralph::process::{
    group_alive, group_members, kill_group, run, strip_ansi, EndReason, Limits, LineVerdict,
    OutputLine, ProcessError, ProcessOutcome, SpawnSpec, StopSignals, StreamKind,
};

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;

/// A child running `script` under `sh -c`.
fn sh(script: &str) -> SpawnSpec {
    SpawnSpec {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..SpawnSpec::default()
    }
}

/// Short limits so every test stays within a few seconds; each test widens what it exercises.
fn limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(20),
        idle_timeout: Duration::from_secs(20),
        kill_grace: Duration::from_millis(500),
        exit_drain: Duration::from_millis(500),
        final_grace: Duration::from_millis(500),
        max_line_bytes: 1 << 20,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Runs `spec`, collecting every line; `is_final` decides which line is the terminal event.
async fn run_collect(
    spec: SpawnSpec,
    limits: &Limits,
    stop: &StopSignals,
    is_final: impl Fn(&OutputLine) -> bool + Send + Sync,
) -> (ProcessOutcome, Vec<OutputLine>) {
    let mut lines = Vec::new();
    let outcome = run(
        spec,
        limits,
        stop,
        |_| {},
        |line| {
            let verdict = if is_final(&line) {
                LineVerdict::Final
            } else {
                LineVerdict::Continue
            };
            lines.push(line);
            verdict
        },
    )
    .await
    .expect("child starts");
    (outcome, lines)
}

fn texts(lines: &[OutputLine], stream: StreamKind) -> Vec<&str> {
    lines
        .iter()
        .filter(|l| l.stream == stream)
        .map(|l| l.text.as_str())
        .collect()
}

/// Polls until group `pgid` has no live member; the kernel needs a moment to tear processes
/// down after SIGKILL.
async fn assert_group_gone(pgid: u32) {
    let pgid = pgid as i32;
    let deadline = Instant::now() + Duration::from_secs(2);
    while group_alive(pgid) {
        assert!(
            Instant::now() < deadline,
            "processes of group {pgid} survived: {:?}",
            group_members(pgid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` is a live (non-zombie) process.
fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

// (a) case 8 variant: the wall-clock limit fires while a grandchild that ignores SIGTERM holds
// stdout open. The direct child dies on SIGTERM, the grandchild only to the SIGKILL that follows
// the exit drain.
#[tokio::test]
async fn timeout_kills_a_term_ignoring_grandchild_that_holds_stdout() {
    let limits = Limits {
        timeout: secs(1.0),
        ..limits()
    };
    let started = Instant::now();
    let (outcome, lines) = run_collect(
        sh("(trap '' TERM; echo grandchild; exec sleep 30) & echo parent; exec sleep 30"),
        &limits,
        &StopSignals::default(),
        |_| false,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(outcome.end, EndReason::TimedOut);
    assert_eq!(
        outcome.signal,
        Some(SIGTERM),
        "the direct child died of SIGTERM"
    );
    assert!(took >= secs(1.0), "returned before the timeout: {took:?}");
    assert!(took < secs(1.0 + 0.5 + 3.0), "took {took:?}");
    let mut seen = texts(&lines, StreamKind::Stdout);
    seen.sort_unstable();
    assert_eq!(seen, ["grandchild", "parent"]);
    assert_group_gone(outcome.pid).await;
}

// (a) with the whole group ignoring SIGTERM: the kill grace, not the exit drain, ends it.
#[tokio::test]
async fn timeout_escalates_to_sigkill_when_everyone_ignores_sigterm() {
    let limits = Limits {
        timeout: secs(1.0),
        exit_drain: secs(10.0),
        ..limits()
    };
    let started = Instant::now();
    let (outcome, _) = run_collect(
        sh("trap '' TERM; sleep 30 & sleep 30"),
        &limits,
        &StopSignals::default(),
        |_| false,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(outcome.end, EndReason::TimedOut);
    assert_eq!(outcome.signal, Some(SIGKILL));
    assert!(
        took >= secs(1.5),
        "SIGKILL came before the grace ran out: {took:?}"
    );
    assert!(took < secs(1.5 + 3.0), "took {took:?}");
    assert_group_gone(outcome.pid).await;
}

// (b) case 8: the agent exits 0 after starting a background child that ignores SIGTERM and keeps
// stdout. ralph must not wait for EOF (30 s away) and must leave no survivor.
#[tokio::test]
async fn exit_does_not_wait_for_a_grandchild_holding_stdout() {
    let started = Instant::now();
    let (outcome, lines) = run_collect(
        sh("(trap '' TERM; echo ready; exec sleep 30) & sleep 0.2; echo bye; exit 0"),
        &limits(),
        &StopSignals::default(),
        |_| false,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.signal, None);
    assert!(took < secs(4.0), "waited for the grandchild: {took:?}");
    let mut seen = texts(&lines, StreamKind::Stdout);
    seen.sort_unstable();
    assert_eq!(seen, ["bye", "ready"]);
    assert_group_gone(outcome.pid).await;
}

// A background child that closed its output is still killed when the run ends.
#[tokio::test]
async fn a_silent_survivor_is_killed_even_when_the_pipes_close() {
    let (outcome, _) = run_collect(
        sh("sleep 30 >/dev/null 2>&1 & exit 0"),
        &limits(),
        &StopSignals::default(),
        |_| false,
    )
    .await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_group_gone(outcome.pid).await;
}

// (c) case 7: no line for the idle limit.
#[tokio::test]
async fn silence_hits_the_idle_limit() {
    let limits = Limits {
        idle_timeout: secs(1.0),
        ..limits()
    };
    let started = Instant::now();
    let (outcome, lines) = run_collect(
        sh("echo hello; exec sleep 30"),
        &limits,
        &StopSignals::default(),
        |_| false,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(outcome.end, EndReason::Idle);
    assert!(
        took >= secs(1.0) && took < secs(1.0 + 0.5 + 3.0),
        "took {took:?}"
    );
    assert_eq!(texts(&lines, StreamKind::Stdout), ["hello"]);
    assert_group_gone(outcome.pid).await;
}

// Lines on stderr count as activity too.
#[tokio::test]
async fn stderr_lines_keep_the_idle_limit_away() {
    let limits = Limits {
        idle_timeout: secs(1.2),
        ..limits()
    };
    let (outcome, lines) = run_collect(
        sh("for i in 1 2 3 4 5; do echo tick >&2; sleep 0.4; done; exit 4"),
        &limits,
        &StopSignals::default(),
        |_| false,
    )
    .await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(4));
    assert_eq!(texts(&lines, StreamKind::Stderr).len(), 5);
}

// (d) case 9: the terminal event arrives, then the agent never exits.
#[tokio::test]
async fn hanging_after_the_final_event_is_killed_after_the_grace() {
    let started = Instant::now();
    let (outcome, lines) = run_collect(
        sh(r#"echo '{"type":"result","subtype":"success"}'; exec sleep 30"#),
        &limits(),
        &StopSignals::default(),
        |line| line.text.contains(r#""type":"result""#),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(outcome.end, EndReason::KilledAfterFinal);
    assert!(
        took >= secs(0.5) && took < secs(0.5 + 0.5 + 3.0),
        "took {took:?}"
    );
    assert_eq!(
        texts(&lines, StreamKind::Stdout),
        [r#"{"type":"result","subtype":"success"}"#]
    );
    assert_group_gone(outcome.pid).await;
}

// An agent that exits on its own within the final grace is a plain exit.
#[tokio::test]
async fn exiting_within_the_final_grace_is_a_normal_exit() {
    let (outcome, _) = run_collect(
        sh("echo result; sleep 0.1; exit 3"),
        &limits(),
        &StopSignals::default(),
        |line| line.text == "result",
    )
    .await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(3));
}

// (e) cases 10 and 27: a child reading stdin to EOF gets the prompt byte for byte, and nothing in
// it is executed.
#[tokio::test]
async fn stdin_reader_gets_the_prompt_byte_for_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pwned = dir.path().join("pwned");
    let received = dir.path().join("received");
    let mut prompt = format!(
        "Story \"quotes\" and 'single' $(touch {p}) `touch {p}` ; rm -rf ~ \n\
         non-ASCII: Grüße, 日本語, emoji 🦀\r\ncontrol: \t\u{1b}[31m\n",
        p = pwned.display()
    )
    .into_bytes();
    prompt.extend_from_slice(&[0, 0xff, 0xfe, b'\n']);
    prompt.extend((0..200 * 1024).map(|i| b"abcdefghijklmnopqrstuvwxyz\n"[i % 27]));
    let spec = SpawnSpec {
        stdin: Some(prompt.clone()),
        cwd: dir.path().to_path_buf(),
        ..sh("cat > received; echo done")
    };
    let (outcome, lines) = run_collect(spec, &limits(), &StopSignals::default(), |_| false).await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(texts(&lines, StreamKind::Stdout), ["done"]);
    let got = std::fs::read(&received).expect("child wrote what it read");
    assert_eq!(got.len(), prompt.len());
    assert!(got == prompt, "stdin bytes differ from the prompt");
    assert!(!pwned.exists(), "part of the prompt was executed");
}

// A child that never reads stdin must not make the prompt write hang or fail the run.
#[tokio::test]
async fn child_ignoring_a_large_stdin_still_exits_cleanly() {
    let spec = SpawnSpec {
        stdin: Some(vec![b'x'; 1 << 20]),
        ..sh("echo ignored stdin; exit 0")
    };
    let started = Instant::now();
    let (outcome, lines) = run_collect(spec, &limits(), &StopSignals::default(), |_| false).await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(texts(&lines, StreamKind::Stdout), ["ignored stdin"]);
    assert!(started.elapsed() < secs(3.0));
}

// Without a prompt stdin is /dev/null: `cat` sees EOF at once instead of hanging.
#[tokio::test]
async fn no_prompt_means_stdin_is_dev_null() {
    let spec = SpawnSpec {
        program: "cat".into(),
        ..SpawnSpec::default()
    };
    let (outcome, lines) = run_collect(spec, &limits(), &StopSignals::default(), |_| false).await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    assert!(lines.is_empty());
}

// (f) case 14: a 6 MB single line, invalid UTF-8, CRLF, ANSI colours and a final partial line.
#[tokio::test]
async fn hostile_output_is_delivered_and_oversize_lines_truncated() {
    let script = r"head -c 6000000 /dev/zero | tr '\000' a; printf '\n'
printf '\377\376bad\n'
printf 'crlf\r\n'
printf '\033[31mred\033[0m\n'
printf 'to stderr\r\n' >&2
printf 'partial'";
    let (outcome, lines) =
        run_collect(sh(script), &limits(), &StopSignals::default(), |_| false).await;
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(outcome.exit_code, Some(0));
    let stdout: Vec<&OutputLine> = lines
        .iter()
        .filter(|l| l.stream == StreamKind::Stdout)
        .collect();
    assert_eq!(
        stdout.len(),
        5,
        "{:?}",
        texts(&lines, StreamKind::Stdout).get(1..)
    );
    assert_eq!(stdout[0].text.len(), 1 << 20);
    assert!(stdout[0].text.bytes().all(|b| b == b'a'));
    assert_eq!(stdout[0].truncated_from, Some(6_000_000));
    assert_eq!(stdout[1].text, "\u{fffd}\u{fffd}bad");
    assert_eq!(stdout[2].text, "crlf");
    assert_eq!(stdout[3].text, "\u{1b}[31mred\u{1b}[0m");
    assert_eq!(strip_ansi(&stdout[3].text), "red");
    assert_eq!(stdout[4].text, "partial");
    assert!(stdout[1..].iter().all(|l| l.truncated_from.is_none()));
    assert_eq!(texts(&lines, StreamKind::Stderr), ["to stderr"]);
}

// Case 15 in small: 64 MB on one line and 20 MB of short lines go through without error; the
// line buffer is capped (see the unit tests in src/process/lines.rs for the memory bound).
#[tokio::test]
async fn a_flood_of_output_is_streamed_not_buffered() {
    let script =
        "head -c 67108864 /dev/zero; printf '\\n'; yes 0123456789012345678 | head -c 20000000";
    let limits = Limits {
        max_line_bytes: 4096,
        ..limits()
    };
    let mut count = 0usize;
    let mut first = None;
    let outcome = run(
        sh(script),
        &limits,
        &StopSignals::default(),
        |_| {},
        |line| {
            if first.is_none() {
                first = Some(line.truncated_from);
            }
            count += 1;
            LineVerdict::Continue
        },
    )
    .await
    .expect("child starts");
    assert_eq!(outcome.end, EndReason::Exited);
    assert_eq!(first, Some(Some(64 << 20)));
    assert_eq!(count, 1 + 1_000_000);
}

// (g) a graceful stop request during a run.
#[tokio::test]
async fn stop_request_ends_the_run_as_cancelled() {
    let stop = StopSignals::default();
    let trigger = stop.stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let (outcome, lines) = run_collect(
        sh("echo up; sleep 30 & exec sleep 30"),
        &limits(),
        &stop,
        |_| false,
    )
    .await;
    assert_eq!(outcome.end, EndReason::Cancelled);
    assert_eq!(outcome.signal, Some(SIGTERM));
    assert!(
        started.elapsed() < secs(3.0),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(texts(&lines, StreamKind::Stdout), ["up"]);
    assert_group_gone(outcome.pid).await;
}

// The second Ctrl-C: kill at once, without waiting out a long grace.
#[tokio::test]
async fn kill_now_does_not_wait_for_the_grace() {
    let stop = StopSignals::default();
    let (graceful, now) = (stop.stop.clone(), stop.kill_now.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        graceful.cancel();
        tokio::time::sleep(Duration::from_millis(300)).await;
        now.cancel();
    });
    let limits = Limits {
        kill_grace: secs(30.0),
        ..limits()
    };
    let started = Instant::now();
    let (outcome, _) = run_collect(sh("trap '' TERM; sleep 30"), &limits, &stop, |_| false).await;
    assert_eq!(outcome.end, EndReason::Cancelled);
    assert_eq!(outcome.signal, Some(SIGKILL));
    assert!(
        started.elapsed() < secs(3.0),
        "took {:?}",
        started.elapsed()
    );
    assert_group_gone(outcome.pid).await;
}

// A descendant that left the group with setsid is found through /proc and killed too.
#[tokio::test]
async fn setsid_escapee_is_killed_with_the_group() {
    let limits = Limits {
        timeout: secs(1.0),
        ..limits()
    };
    let (outcome, lines) = run_collect(
        sh("setsid sh -c 'echo $$; exec sleep 30' & exec sleep 30"),
        &limits,
        &StopSignals::default(),
        |_| false,
    )
    .await;
    assert_eq!(outcome.end, EndReason::TimedOut);
    let escaped: i32 = texts(&lines, StreamKind::Stdout)
        .first()
        .and_then(|pid| pid.parse().ok())
        .expect("the escapee printed its pid");
    assert_ne!(escaped, outcome.pid as i32);
    assert_group_gone(outcome.pid).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while pid_alive(escaped) {
        assert!(
            Instant::now() < deadline,
            "setsid escapee {escaped} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// on_spawn gets the pid (= pgid) while the group is alive, so a caller can persist it.
#[tokio::test]
async fn on_spawn_reports_the_live_group() {
    let seen = Arc::new(Mutex::new(None));
    let record = Arc::clone(&seen);
    let outcome = run(
        sh("exec sleep 0.3"),
        &limits(),
        &StopSignals::default(),
        move |pid| {
            let alive = group_alive(pid as i32);
            *record.lock().expect("lock") = Some((pid, alive));
        },
        |_| LineVerdict::Continue,
    )
    .await
    .expect("child starts");
    assert_eq!(*seen.lock().expect("lock"), Some((outcome.pid, true)));
}

#[tokio::test]
async fn missing_program_is_not_found() {
    let spec = SpawnSpec {
        program: "ralph-test-no-such-program".into(),
        ..SpawnSpec::default()
    };
    let err = run(
        spec,
        &limits(),
        &StopSignals::default(),
        |_| {},
        |_| LineVerdict::Continue,
    )
    .await
    .expect_err("must not start");
    assert!(
        matches!(&err, ProcessError::NotFound { program } if program == "ralph-test-no-such-program"),
        "{err:?}"
    );
}

/// A script whose `#!` interpreter is missing also fails with ENOENT; the error must say the
/// file exists and name the interpreter, not claim the program is missing from PATH.
#[tokio::test]
async fn a_script_with_a_missing_interpreter_names_the_interpreter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("agent");
    std::fs::write(&script, "#!/nonexistent/interpreter\necho hi\n").expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let spec = SpawnSpec {
        program: script.clone(),
        ..SpawnSpec::default()
    };
    let err = run(
        spec,
        &limits(),
        &StopSignals::default(),
        |_| {},
        |_| LineVerdict::Continue,
    )
    .await
    .expect_err("must not start");
    let text = err.to_string();
    assert!(matches!(err, ProcessError::Unrunnable { .. }), "{err:?}");
    assert!(
        text.contains("exists but cannot be run") && text.contains("/nonexistent/interpreter"),
        "{text}"
    );
}

#[tokio::test]
async fn missing_working_directory_names_the_directory() {
    let spec = SpawnSpec {
        cwd: "/nonexistent/ralph-test-dir".into(),
        ..sh("true")
    };
    let err = run(
        spec,
        &limits(),
        &StopSignals::default(),
        |_| {},
        |_| LineVerdict::Continue,
    )
    .await
    .expect_err("must not start");
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/ralph-test-dir"),
        "{err}"
    );
}

#[tokio::test]
async fn environment_is_removed_then_set() {
    let spec = SpawnSpec {
        env_remove: vec!["HOME".into()],
        env_set: vec![("RALPH_TEST_VALUE".into(), "it works".into())],
        ..sh("echo \"home=${HOME:-unset} value=$RALPH_TEST_VALUE\"")
    };
    let (_, lines) = run_collect(spec, &limits(), &StopSignals::default(), |_| false).await;
    assert_eq!(
        texts(&lines, StreamKind::Stdout),
        ["home=unset value=it works"]
    );
}

// (h) case 22: a group left behind by a ralph that was SIGKILLed is found and killed.
#[tokio::test]
async fn kill_group_ends_an_orphaned_group() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut child = std::process::Command::new("sh")
        .args(["-c", "trap '' TERM; sleep 30 & exec sleep 30"])
        .process_group(0)
        .spawn()
        .expect("spawn sh");
    let pgid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(2);
    while group_members(pgid).len() < 2 {
        assert!(Instant::now() < deadline, "group never had 2 members");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(group_alive(pgid));
    assert!(group_members(pgid).contains(&pgid));

    let started = Instant::now();
    kill_group(pgid, Duration::from_millis(300)).await;
    assert!(
        started.elapsed() < secs(3.0),
        "took {:?}",
        started.elapsed()
    );
    assert!(!group_alive(pgid), "survivors: {:?}", group_members(pgid));
    assert!(group_members(pgid).is_empty());
    let status = child.wait().expect("reap");
    assert_eq!(
        status.signal(),
        Some(SIGKILL),
        "TERM was ignored, so KILL ended it"
    );

    // Killing it again, or a group that never existed, is a quick no-op.
    let again = Instant::now();
    kill_group(pgid, Duration::from_secs(5)).await;
    assert!(again.elapsed() < secs(1.0));
}

// A group that obeys SIGTERM does not have to wait out the grace.
#[tokio::test]
async fn kill_group_returns_as_soon_as_sigterm_works() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .expect("spawn sleep");
    let pgid = child.id() as i32;
    let started = Instant::now();
    // The direct child stays a zombie until we reap it; group_alive ignores zombies.
    kill_group(pgid, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < secs(2.0),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(child.wait().expect("reap").signal(), Some(SIGTERM));
}

// The child dies with the thread that spawned it (PR_SET_PDEATHSIG), even if nothing else ever
// kills it: here the supervising future is leaked, so neither it nor kill_on_drop can act.
#[test]
fn child_dies_when_the_spawning_thread_exits() {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawner = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let limits = limits();
            let stop = StopSignals::default();
            let mut fut = Box::pin(run(
                sh("exec sleep 30"),
                &limits,
                &stop,
                move |pid| tx.send(pid).expect("send pid"),
                |_| LineVerdict::Continue,
            ));
            let polled = tokio::time::timeout(Duration::from_millis(200), &mut fut).await;
            assert!(polled.is_err(), "the child should still be running");
            std::mem::forget(fut);
        });
        // Forget the runtime too, so its shutdown cannot touch the child either.
        std::mem::forget(runtime);
    });
    let pid = rx.recv_timeout(Duration::from_secs(5)).expect("pid") as i32;
    spawner.join().expect("spawner thread");
    let deadline = Instant::now() + Duration::from_secs(3);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "child {pid} outlived its spawning thread"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// signals::install: the first signal asks for a stop, the second for an immediate kill.
// Only this test sends signals to the test process; tokio's handlers are installed by the time
// install() returns, so the default action (exit) cannot happen.
#[tokio::test]
async fn first_signal_stops_second_kills_now() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let stop = StopSignals::default();
    let watcher = ralph::signals::install(stop.clone()).expect("install handlers");
    assert_eq!(watcher.received(), None);

    kill(Pid::this(), Signal::SIGHUP).expect("send SIGHUP");
    tokio::time::timeout(Duration::from_secs(5), stop.stop.cancelled())
        .await
        .expect("first signal cancels stop");
    assert!(!stop.kill_now.is_cancelled());
    assert_eq!(watcher.received(), Some("SIGHUP"));

    kill(Pid::this(), Signal::SIGTERM).expect("send SIGTERM");
    tokio::time::timeout(Duration::from_secs(5), stop.kill_now.cancelled())
        .await
        .expect("second signal cancels kill_now");
    assert_eq!(
        watcher.received(),
        Some("SIGHUP"),
        "the first signal is the one named"
    );
}
