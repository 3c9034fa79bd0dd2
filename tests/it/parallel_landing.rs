//! The landing path of `ralph run --parallel N` under other git processes (issue 20, the
//! tester's r11 and d2 runs), with real git and small exec agents (shell scripts):
//!
//! - an agent's `git -C <checkout> add/commit` holds the checkout's `.git/index.lock` for a
//!   moment: ralph waits for it and lands; a lock that stays stops the run cleanly
//!   (`landing_refused`, the lock named, nothing lost), never an `error:` exit;
//! - once a landing is refused, nothing more lands: an iteration already running finishes and
//!   its work is kept under a salvage ref and named;
//! - an agent's commit in the checkout made between two of ralph's own steps of one landing is
//!   taken off the run branch and kept under `refs/ralph/salvage/<run>/checkout-commits`, not
//!   buried under ralph's commit.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{prd_with_stories, text, TestEnv};
use crate::trust_iteration::{agent, strings, FLIP};

/// What the test's agents write into the lock they hold, so that the test removes only theirs.
const HELD: &str = "held by the test's agent\n";

/// Shell for every story: puts the story id in `$id` and its number in `$n`, does its work
/// (`file-<n>.txt`, committed in its worktree) and sets its `passes`, then runs the story's
/// own step `steps` gives (`case "$id" in … esac` arms), then exits 0.
fn story_agent(env: &TestEnv, steps: &str) -> String {
    agent(
        env,
        &format!(
            "main='{main}'\nid=$(sed -n 's/^Story ID: //p' | head -1)\nn=${{id#US-00}}\n\
             echo done > file-$n.txt\ngit add file-$n.txt && git commit -qm \"feat: $id\"\n\
             {FLIP}case \"$id\" in\n{steps}\nesac\nexit 0\n",
            main = env.repo.display()
        ),
    )
}

/// A run of `cmd` with `--parallel 2` and `extra` arguments, with `envs` set.
fn run_parallel(
    env: &TestEnv,
    cmd: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> std::process::Output {
    let mut args = vec![
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        cmd,
        "--parallel",
        "2",
    ];
    args.extend_from_slice(extra);
    let mut command = env.ralph_cmd(&args);
    command.envs(envs.iter().copied());
    command.output().expect("run ralph")
}

/// The record of story `id` (the last one).
fn record_of(env: &TestEnv, id: &str) -> Value {
    env.ledger()
        .into_iter()
        .rev()
        .find(|r| r["story_id"] == id)
        .unwrap_or(Value::Null)
}

fn ref_exists(env: &TestEnv, name: &str) -> bool {
    std::process::Command::new("git")
        .args(["rev-parse", "--verify", "--quiet", name])
        .current_dir(&env.repo)
        .env_clear()
        .envs(env.envs())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Removes the lock at `lock` once it holds [`HELD`] and `hold` has passed since it was seen
/// (or after 5 minutes, so that a run that never lands does not hang the test); returns
/// whether it saw the lock.
fn release_after(lock: &Path, hold: Duration) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if std::fs::read_to_string(lock).is_ok_and(|t| t == HELD) {
            std::thread::sleep(hold);
            let _ = std::fs::remove_file(lock);
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The shell step that takes the checkout's index lock as a git command does (and leaves it).
const TAKE_LOCK: &str = "printf 'held by the test'\"'\"'s agent\\n' > \"$main/.git/index.lock\"";

#[test]
fn a_landing_waits_for_an_index_lock_an_agent_holds_for_a_moment() {
    let env = TestEnv::new(&prd_with_stories(2));
    // US-001's agent leaves the checkout's index locked as it exits (an agent's `git -C
    // <checkout> add` in progress when ralph lands); the test lets go of it 3 s later.
    let cmd = story_agent(&env, &format!("US-001) {TAKE_LOCK};;"));
    let lock = env.repo.join(".git/index.lock");
    let releaser = {
        let lock = lock.clone();
        std::thread::spawn(move || release_after(&lock, Duration::from_secs(3)))
    };
    let out = run_parallel(&env, &cmd, &["--max-iter", "4"], &[]);
    let saw = releaser.join().unwrap();
    let all = text(&out);
    assert!(saw, "the agent never took the lock: {all}");
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(!all.contains("error:"), "{all}");
    assert_eq!(env.outcomes(), ["story_passed", "story_passed"], "{all}");
    let prd = env.git(&["show", "ralph/demo:prd.json"]);
    let prd: Value = serde_json::from_str(&prd).unwrap();
    for story in prd["userStories"].as_array().unwrap() {
        assert_eq!(story["passes"], true, "{all}");
    }
    assert_eq!(env.read("file-1.txt"), "done\n");
    assert_eq!(env.read("file-2.txt"), "done\n");
}

#[test]
fn an_index_lock_that_stays_stops_the_run_cleanly_naming_it() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = story_agent(&env, &format!("US-001) {TAKE_LOCK};;"));
    let out = run_parallel(
        &env,
        &cmd,
        &["--max-iter", "3"],
        &[("RALPH_GIT_LOCK_WAIT_MS", "1500")],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(!all.contains("error:"), "no error exit mid-run: {all}");
    let lock = env.repo.join(".git/index.lock");
    assert!(lock.exists(), "ralph left the lock alone: {all}");
    let record = record_of(&env, "US-001");
    assert_eq!(record["outcome"], "landing_refused", "{record}\n{all}");
    let message = record["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&lock.display().to_string()) && message.contains("if none runs, delete"),
        "the record names the lock and what to do: {message}"
    );
    // Nothing lost: the story's work is under the salvage ref the record names.
    let salvage = record["landing"]["salvage_ref"]
        .as_str()
        .unwrap_or_default();
    assert!(salvage.starts_with("refs/ralph/salvage/"), "{record}");
    let kept = env.git(&["show", &format!("{salvage}:file-1.txt")]);
    assert_eq!(kept, "done\n");
    assert_eq!(env.ledger().len(), 1, "nothing more started: {all}");
    assert!(
        all.contains("if none runs, delete"),
        "the summary says what to do: {all}"
    );
}

#[test]
fn after_a_refused_landing_a_running_iteration_finishes_but_does_not_land() {
    let env = TestEnv::new(&prd_with_stories(3));
    let dir = env.root.path().display().to_string();
    // US-002 waits until US-003 runs, then changes README.md in the checkout (the user's
    // uncommitted edit, as it were) and in its own work: its landing is refused. US-003 runs
    // until that refusal is on record, then does its work.
    let steps = format!(
        "US-002) for i in $(seq 600); do [ -e '{dir}/started-US-003' ] && break; sleep 0.1; done\n\
         echo edited >> \"$main/README.md\"; echo mine >> README.md; git commit -qam 'readme';;\n\
         US-003) : > '{dir}/started-US-003'\n\
         for i in $(seq 600); do grep -q landing_refused \"$main/.ralph/ledger.jsonl\" 2>/dev/null && break; sleep 0.1; done;;"
    );
    let cmd = story_agent(&env, &steps);
    let out = run_parallel(&env, &cmd, &["--max-iter", "6"], &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert_eq!(
        record_of(&env, "US-002")["outcome"],
        "landing_refused",
        "{all}"
    );
    let third = record_of(&env, "US-003");
    assert_eq!(third["outcome"], "interrupted", "{third}\n{all}");
    assert_ne!(third["landing"]["kind"], "merge", "{third}");
    assert_ne!(third["landing"]["kind"], "fast_forward", "{third}");
    let salvage = third["landing"]["salvage_ref"].as_str().unwrap_or_default();
    assert!(ref_exists(&env, salvage), "{third}");
    assert_eq!(
        env.git(&["show", &format!("{salvage}:file-3.txt")]),
        "done\n"
    );
    let message = third["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(salvage),
        "the record names the ref: {message}"
    );
    // Nothing of it is on the run branch, and it does not pass; no iteration started after.
    let files = env.git(&["ls-tree", "--name-only", "ralph/demo"]);
    assert!(!files.lines().any(|f| f == "file-3.txt"), "{files}");
    let prd: Value = serde_json::from_str(&env.git(&["show", "ralph/demo:prd.json"])).unwrap();
    assert_eq!(prd["userStories"][2]["passes"], false);
    assert_eq!(env.ledger().len(), 3, "{all}");
    // The user's edit is as they left it.
    assert_eq!(env.read("README.md"), "demo\nedited\n");
}

/// One story run with `--parallel`; right after its landing moved the checkout and marked the
/// story passing, before ralph commits prd.json and progress.txt, an agent of the run commits in
/// the checkout (tagged as ralph tags its agents' git commands), `git commit -a` taking ralph's
/// files in too. Returns the environment and the run's output.
fn agent_commits_between_ralphs_steps() -> (TestEnv, String) {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = story_agent(&env, "*) ;;");
    let once = env.root.path().join("hook-done");
    let hook = format!(
        "[ -e '{once}' ] && exit 0; : > '{once}'; cd '{repo}' && echo agent >> README.md && \
         GIT_REFLOG_ACTION='ralph agent test' git commit -qam 'agent commit in the checkout'",
        once = once.display(),
        repo = env.repo.display()
    );
    let out = run_parallel(
        &env,
        &cmd,
        &["--max-iter", "2"],
        &[
            ("RALPH_TEST_RUN_AT", "landing-marked"),
            ("RALPH_TEST_RUN_CMD", &hook),
        ],
    );
    let all = text(&out);
    assert!(once.exists(), "the hook never ran: {all}");
    (env, all)
}

#[test]
fn an_agents_commit_between_two_of_ralphs_steps_is_taken_off_not_buried() {
    let (env, all) = agent_commits_between_ralphs_steps();
    let log = env.git(&["log", "--format=%s", "ralph/demo"]);
    assert!(
        !log.contains("agent commit in the checkout"),
        "the agent's commit is not buried on the run branch: {log}\n{all}"
    );
    let kept = env
        .git(&["for-each-ref", "--format=%(refname)", "refs/ralph/salvage/"])
        .lines()
        .find(|r| r.contains("checkout-commits"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(!kept.is_empty(), "kept under checkout-commits: {all}");
    let kept_log = env.git(&["log", "--format=%s", &kept]);
    assert!(
        kept_log.contains("agent commit in the checkout"),
        "{kept_log}"
    );
    let record = record_of(&env, "US-001");
    assert_eq!(record["outcome"], "story_passed", "{record}\n{all}");
    assert!(
        strings(&record["findings"])
            .iter()
            .any(|f| f.contains("checkout-commits")),
        "the record names it: {record}"
    );
    // ralph's own commit is on the branch with the story passing.
    let prd: Value = serde_json::from_str(&env.git(&["show", "ralph/demo:prd.json"])).unwrap();
    assert_eq!(prd["userStories"][0]["passes"], true, "{all}");
    assert_eq!(env.read("README.md"), "demo\n", "{all}");
}

/// How many times `needle` is in `hay`.
fn times(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn an_agents_commit_in_the_checkout_is_warned_about_once_with_its_iteration() {
    let (_env, all) = agent_commits_between_ralphs_steps();
    let said = "committing in your checkout";
    assert_eq!(times(&all, said), 1, "said once: {all}");
    assert!(
        all.contains(&format!("warning: iteration 1: the run branch ralph/demo was moved by an agent of this run {said}")),
        "in the iteration's line: {all}"
    );
}

#[test]
fn an_index_lock_on_ralphs_own_commit_is_named_once_not_again_in_the_summary() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = story_agent(&env, "*) ;;");
    // After the landing moved the checkout, before ralph commits prd.json and progress.txt:
    // another git process takes the checkout's index lock and keeps it.
    let lock = env.repo.join(".git/index.lock");
    let hook = format!("printf 'held\\n' > '{}'", lock.display());
    let out = run_parallel(
        &env,
        &cmd,
        &["--max-iter", "2"],
        &[
            ("RALPH_GIT_LOCK_WAIT_MS", "1500"),
            ("RALPH_TEST_RUN_AT", "landing-marked"),
            ("RALPH_TEST_RUN_CMD", &hook),
        ],
    );
    let all = text(&out);
    assert!(lock.exists(), "the hook took the lock: {all}");
    let record = record_of(&env, "US-001");
    assert!(
        strings(&record["findings"])
            .iter()
            .any(|f| f.contains("are not committed yet")),
        "the record says so: {record}\n{all}"
    );
    assert_eq!(
        times(&all, "are not committed yet ("),
        1,
        "said once: {all}"
    );
    let named = format!("another git process holds {}", lock.display());
    assert_eq!(times(&all, &named), 1, "the lock named once: {all}");
    // The story landed: the summary does not send the user to a salvage ref.
    assert!(!all.contains("starts from the ref"), "{all}");
    assert!(all.contains("let the other git command finish"), "{all}");
}

#[test]
fn a_landing_refused_for_an_index_lock_is_labelled_so_not_as_a_dirty_checkout() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = story_agent(&env, &format!("US-001) {TAKE_LOCK};;"));
    let out = run_parallel(
        &env,
        &cmd,
        &["--max-iter", "3"],
        &[("RALPH_GIT_LOCK_WAIT_MS", "1500")],
    );
    let all = text(&out);
    assert_eq!(
        record_of(&env, "US-001")["outcome"],
        "landing_refused",
        "{all}"
    );
    assert!(all.contains("landed: refused: index locked"), "{all}");
    assert!(!all.contains("dirty checkout"), "{all}");
    let _ = std::fs::remove_file(env.repo.join(".git/index.lock"));
    let log = env.ralph(&["log"]);
    let log = text(&log);
    assert!(log.contains("refused: index locked"), "ralph log: {log}");
    assert!(!log.contains("dirty checkout"), "ralph log: {log}");
    let show = text(&env.ralph(&["show", "1"]));
    assert!(show.contains("refused: index locked"), "ralph show: {show}");
}
