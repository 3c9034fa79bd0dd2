//! The books of a feature across runs, clones and PRDs (issue 18, items 11–15): budgets that
//! last across runs, `--resume-only`, one history reader for `status` and `run`, books per
//! PRD, and the ledger that travels with `--push`.

use serde_json::{json, Value};

use crate::common::{failing_iteration, prd_with_stories, text, TestEnv};

/// An iteration that passes story `id` (`@next` for the story ralph picked), writing `file`,
/// and reports `cost` USD.
fn passing(id: &str, file: &str, cost: f64) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": file, "content": "done\n"}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {file}")},
        {"claude_result": {"text": "Implemented it.", "cost_usd": cost}}
    ])
}

fn status_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = vec!["status", "--json"];
    all.extend_from_slice(args);
    let out = env.ralph(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status --json")
}

/// Item 12: in a fresh clone (no `.ralph/`), the attempts come from git's trailers. `status`
/// must block the stories `run` blocks (with the run's own `max_attempts` from ralph.toml), so
/// the next story it names is the one `run` then works on.
#[test]
fn status_and_run_agree_on_the_next_story_from_git_history() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.write("ralph.toml", "max_attempts = 2\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [failing_iteration(), failing_iteration(), passing("@next", "f2.txt", 0.1)]}));
    let out = env.ralph(&[
        "run",
        "--max-iter",
        "2",
        "--max-failures",
        "10",
        "--max-no-progress",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    // A fresh clone: no .ralph/, the attempts are in the trailers only.
    std::fs::remove_dir_all(env.path(".ralph")).unwrap();

    let doc = status_json(&env, &[]);
    assert_eq!(doc["source"], "git", "{doc}");
    assert_eq!(doc["stories"][0]["attempts"], 2, "{doc}");
    assert_eq!(doc["stories"][0]["blocked"], true, "{doc}");
    assert_eq!(doc["next_story"], "US-002", "{doc}");
    let human = env.ralph(&["status"]);
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(stdout.contains("next story: US-002"), "{stdout}");

    let out = env.ralph(&["run", "--max-iter", "1"]);
    let ledger = env.ledger();
    assert_eq!(
        ledger.last().expect("a record")["story_id"],
        "US-002",
        "run works on the story status named: {}",
        text(&out)
    );
}

/// Item 15: `nohup ralph run` survives the terminal's hang-up. A SIGHUP ignored when ralph
/// starts stays ignored (on main, ralph installed its own handler and stopped with 130).
#[test]
fn a_run_started_under_nohup_survives_sighup() {
    let env = TestEnv::new(&prd_with_stories(1));
    let mut step = passing("US-001", "f1.txt", 0.1);
    step.as_array_mut()
        .unwrap()
        .insert(1, json!({"sleep_ms": 3000}));
    env.script(&json!({"invocations": [step]}));
    let mut cmd = std::process::Command::new("nohup");
    cmd.arg(crate::common::ralph_bin())
        .args(["run", "--max-iter", "1"])
        .current_dir(&env.repo)
        .env_clear()
        .envs(env.envs());
    let mut child = env.ralph_spawn_with(cmd);
    // Until the agent runs (the fake records its start), then the hang-up.
    let t = std::time::Instant::now();
    while env.agent_calls() == 0 && t.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(env.agent_calls(), 1, "{}", env.spawned_output());
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", env.spawned_output());
    assert_eq!(env.ledger()[0]["outcome"], "story_passed");
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Item 11: `--max-cost` counts every run of the feature, so rerunning ralph (an hourly
/// schedule) does not start a fresh budget; `--budget-scope run` is the per-run reading.
#[test]
fn max_cost_counts_the_features_earlier_runs() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        passing("@next", "f1.txt", 0.2),
        passing("@next", "f2.txt", 0.2),
        passing("@next", "f3.txt", 0.2)
    ]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--max-cost", "0.3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    // $0.20 before, $0.20 now: the second run crosses $0.30 (on main it started at $0).
    let out = env.ralph(&["run", "--max-iter", "1", "--max-cost", "0.3"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        stderr(&out).contains("reached --max-cost $0.30"),
        "{}",
        text(&out)
    );
    // Already over: stops before calling the agent.
    let out = env.ralph(&["run", "--max-cost", "0.3"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(env.agent_calls(), 2, "{}", text(&out));
    assert!(stderr(&out).contains("$0.40"), "{}", text(&out));
    // The per-run reading: a new run starts at $0.
    let out = env.ralph(&["run", "--max-cost", "0.3", "--budget-scope", "run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.agent_calls(), 3);
}

/// Item 11: `--resume-only` goes on after a usage limit, and does nothing (exit 0, saying why)
/// after a stop a human must look at, or when the feature is complete.
#[test]
fn resume_only_resumes_a_usage_limit_but_not_a_stop_for_a_human() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [failing_iteration(), failing_iteration()]}));
    let out = env.ralph(&["run", "--max-failures", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let out = env.ralph(&["run", "--resume-only"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("not resumed"), "{}", text(&out));
    assert!(stderr(&out).contains("--max-failures"), "{}", text(&out));
    assert_eq!(env.agent_calls(), 1, "the agent was not called again");
    // The reason survives for the next tick of the schedule.
    let out = env.ralph(&["run", "--resume-only"]);
    assert!(stderr(&out).contains("not resumed"), "{}", text(&out));

    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"0s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [
            {"claude_init": {}},
            {"claude_usage_limit": {"message": "You've hit your limit", "resets_in_s": 1}},
            {"exit": 1}
        ],
        passing("US-001", "f1.txt", 0.1)
    ]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let out = env.ralph(&["run", "--resume-only", "--no-wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.agent_calls(), 2, "resumed: {}", text(&out));
    // Complete: nothing to do.
    let out = env.ralph(&["run", "--resume-only"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("nothing to resume"), "{}", text(&out));
    assert_eq!(env.agent_calls(), 2);
}

/// A prd.json with one open story, on branch `branch`.
fn one_story_prd(branch: &str, id: &str) -> Value {
    json!({
        "project": format!("Project {branch}"),
        "branchName": branch,
        "description": "a feature",
        "userStories": [{
            "id": id, "title": format!("Story {id}"), "description": "As a user I want it",
            "acceptanceCriteria": ["it exists"], "priority": 1, "passes": false, "notes": ""
        }]
    })
}

/// An iteration that passes story `id` of the prd.json at `prd`, writing `file`, for `cost`.
fn passing_in(prd: &str, id: &str, file: &str, cost: f64) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": file, "content": "done\n"}},
        {"set_passes": {"id": id, "passes": true, "prd": prd}},
        {"claude_result": {"text": "done", "cost_usd": cost}}
    ])
}

/// Item 13: two PRDs in one repository keep their books apart (`.ralph/books/<path>/`), and
/// `log`/`report` at the repository root find them.
#[test]
fn two_prds_in_one_repository_keep_their_books_apart() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.git(&["rm", "-q", "prd.json"]);
    for (dir, branch, id) in [("a", "ralph/a", "A-1"), ("b", "ralph/b", "B-1")] {
        let prd = serde_json::to_string_pretty(&one_story_prd(branch, id)).unwrap();
        env.write(&format!("prds/{dir}/prd.json"), &format!("{prd}\n"));
    }
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "two PRDs"]);
    env.script(&json!({"invocations": [
        passing_in("prds/a/prd.json", "A-1", "a.txt", 0.5),
        passing_in("prds/b/prd.json", "B-1", "b.txt", 0.25)
    ]}));
    let out = env.ralph(&["run", "--prd", "prds/a/prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        env.path(".ralph/books/prds/a/prd.json/ledger.jsonl")
            .is_file(),
        "{}",
        text(&out)
    );
    assert!(!env.path(".ralph/ledger.jsonl").exists());
    assert_eq!(
        env.read(".ralph/.gitignore"),
        "*\n",
        ".ralph/ stays out of git"
    );

    // b has no run: neither a's stop nor a's iterations are b's.
    let b = status_json(&env, &["--prd", "prds/b/prd.json"]);
    assert_eq!(b["stop_reason"], Value::Null, "{b}");
    assert_eq!(b["total_iterations"], 0, "{b}");
    assert_eq!(b["next_story"], "B-1", "{b}");
    let a = status_json(&env, &["--prd", "prds/a/prd.json"]);
    assert_eq!(a["stop_reason"]["kind"], "complete", "{a}");
    assert_eq!(a["total_cost_usd"], 0.5, "{a}");

    // At the root (no prd.json there), log and report find the one PRD with books.
    let log = env.ralph(&["log", "--no-pager"]);
    assert_eq!(log.status.code(), Some(0), "{}", text(&log));
    assert!(
        String::from_utf8_lossy(&log.stdout).contains("A-1"),
        "{}",
        text(&log)
    );
    let report = env.ralph(&["report", "--markdown"]);
    assert_eq!(report.status.code(), Some(0), "{}", text(&report));
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("A-1"),
        "{}",
        text(&report)
    );

    // Once b has books too, the root asks which, and each log shows only its own stories.
    let out = env.ralph(&["run", "--prd", "prds/b/prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = env.ralph(&["log", "--no-pager"]);
    assert_ne!(log.status.code(), Some(0), "{}", text(&log));
    let err = stderr(&log);
    assert!(
        err.contains("prds/a/prd.json") && err.contains("prds/b/prd.json") && err.contains("--prd"),
        "{}",
        text(&log)
    );
    let log_b = env.ralph(&["log", "--no-pager", "--prd", "prds/b/prd.json"]);
    let shown = String::from_utf8_lossy(&log_b.stdout);
    assert!(
        shown.contains("B-1") && !shown.contains("A-1"),
        "{}",
        text(&log_b)
    );
    let b = status_json(&env, &["--prd", "prds/b/prd.json"]);
    assert_eq!(b["total_cost_usd"], 0.25, "{b}");
}

/// Item 14: with `--push` the books travel with the branch (`refs/ralph/books/<branch>`): a
/// clone that fetches them has the costs, the next pod's `--max-cost` counts the earlier pods'
/// spending, and a later pod's `--resume-only` sees why the last one stopped.
#[test]
fn pushed_books_travel_with_the_branch_to_any_clone() {
    use crate::scale_out::{run_git, working_agent, Remote, BRANCH};
    let r = Remote::new(3, &working_agent(0));
    let first = r.clone("first");
    let out = r
        .ralph(&first, &["run", "--push", "--max-iter", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        r.has_ref(&format!("refs/ralph/books/{BRANCH}")),
        "{}",
        text(&out)
    );

    // A morning report from any clone: fetch the books, read the costs.
    let reader = r.clone("reader");
    run_git(
        &reader,
        &r.env,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/ralph/books/*:refs/ralph/books/*",
        ],
    );
    let status = r.ralph(&reader, &["status", "--json"]).output().unwrap();
    let doc: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    assert_eq!(doc["total_cost_usd"], 0.01, "{}", text(&status));
    assert_eq!(doc["source"], "ledger", "{doc}");
    let report = r
        .ralph(&reader, &["report", "--markdown"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("$0.01"),
        "{}",
        text(&report)
    );

    // The next pod: $0.01 before, $0.01 now, over --max-cost $0.015 (a fresh budget would not be).
    let second = r.clone("second");
    let out = r
        .ralph(&second, &["run", "--push", "--max-cost", "0.015"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(r.remote_iterations(), [1, 2], "{}", text(&out));
    // A scheduled pod after that: the books say a budget stopped it; nothing runs.
    let third = r.clone("third");
    let out = r
        .ralph(&third, &["run", "--push", "--resume-only"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("--max-cost"), "{}", text(&out));
    assert_eq!(r.remote_iterations(), [1, 2]);
}

fn manifest() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The documents of a YAML file as JSON, read by the linters' Python (PyYAML; installed by
/// scripts/install-linters.sh). Fails with that command when it is missing.
fn yaml_documents(file: &std::path::Path) -> Vec<Value> {
    let python = manifest().join(".tools/lint/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-linters.sh (scripts/test.sh does)",
        python.display()
    );
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(file)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Item 11: the Kubernetes manifests define the Job once (the CronJob's template), run it with
/// `--resume-only`, and fail an index on exactly the exit codes ralph says a retry now cannot
/// change (`ExitStatus::retry`); docs/scale-out.md's table says the same for every code.
#[test]
fn the_schedulers_follow_ralphs_exit_codes() {
    use ralph::protocol::{ExitStatus, Retry};
    let mut job_specs = Vec::new();
    for entry in std::fs::read_dir(manifest().join("deploy/kubernetes")).unwrap() {
        for doc in yaml_documents(&entry.unwrap().path()) {
            match doc["kind"].as_str() {
                Some("Job") => job_specs.push(doc["spec"].clone()),
                Some("CronJob") => job_specs.push(doc["spec"]["jobTemplate"]["spec"].clone()),
                _ => {}
            }
        }
    }
    assert_eq!(
        job_specs.len(),
        1,
        "one Job definition, not copies: {job_specs:#?}"
    );
    let spec = &job_specs[0];
    let rules = spec["podFailurePolicy"]["rules"].as_array().expect("rules");
    let mut fail: Vec<u64> = rules
        .iter()
        .filter(|r| r["action"] == "FailIndex")
        .flat_map(|r| {
            r["onExitCodes"]["values"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_u64())
        .collect();
    fail.sort_unstable();
    let expected: Vec<u64> = ExitStatus::ALL
        .iter()
        .filter(|s| **s != ExitStatus::Success && s.retry() != Retry::Now)
        .map(|s| u64::from(s.code()))
        .collect();
    assert_eq!(fail, expected, "FailIndex exit codes");
    let env = spec["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    assert!(
        env.iter()
            .any(|e| e["name"] == "RALPH_RESUME_ONLY" && e["value"] == "1"),
        "the scheduled Job runs --resume-only: {env:?}"
    );

    // docs/scale-out.md's exit-code table: the retry column of every code ralph has.
    let doc = std::fs::read_to_string(manifest().join("docs/scale-out.md")).unwrap();
    let table: Vec<Vec<String>> = doc
        .lines()
        .skip_while(|l| !l.starts_with("| code | meaning | retry? |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(|c| c.trim().to_owned()).collect())
        .collect();
    for status in ExitStatus::ALL {
        let row = table
            .iter()
            .find(|r| {
                r[1].split([',', '/'])
                    .any(|c| c.trim() == status.code().to_string())
            })
            .unwrap_or_else(|| panic!("no row for exit {} in {table:?}", status.code()));
        let said = &row[3];
        let ok = match status.retry() {
            Retry::No => said.starts_with("no"),
            Retry::Later => said.starts_with("later"),
            Retry::Now => said.starts_with("at once"),
        };
        assert!(
            ok,
            "exit {}: {:?} says {said:?}",
            status.code(),
            status.retry()
        );
    }
}

/// Item 11: the action's `args` are split as a shell splits them, so a quoted
/// `--verify "test -f file-1.txt"` reaches ralph as one value; `resume-only` reaches ralph.
#[test]
fn the_actions_args_keep_quoted_words_together() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [passing("US-001", "file-1.txt", 0.1)]}));
    let link = env.bin.join("ralph");
    std::os::unix::fs::symlink(crate::common::ralph_bin(), &link).unwrap();
    let runner = env.root.path().join("runner");
    std::fs::create_dir_all(&runner).unwrap();
    let step = |inputs: &[(&str, &str)]| {
        std::process::Command::new(manifest().join("deploy/github/run.sh"))
            .current_dir(&env.repo)
            .env_clear()
            .envs(env.envs())
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_OUTPUT", runner.join("output"))
            .env("GITHUB_STEP_SUMMARY", runner.join("summary.md"))
            .envs(inputs.iter().copied())
            .output()
            .expect("run.sh")
    };
    let out = step(&[(
        "INPUT_ARGS",
        "--verify \"test -f file-1.txt\" --max-attempts 2",
    )]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rec = &env.ledger()[0];
    assert_eq!(rec["outcome"], "story_passed", "{rec}");
    assert_eq!(rec["verify"][0]["command"], "test -f file-1.txt", "{rec}");
    assert_eq!(rec["verify"][0]["passed"], true, "{rec}");
    // Unbalanced quotes are an error that says so, not a run with mangled flags.
    let out = step(&[("INPUT_ARGS", "--verify \"test -f")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("unbalanced quotes"),
        "{}",
        text(&out)
    );
    let out = step(&[("INPUT_RESUME_ONLY", "true")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("nothing to resume"), "{}", text(&out));
}

/// Item 13: books an older ralph kept in `.ralph/` for a prd.json in a folder are moved into
/// that PRD's books on its next run, without loss (the ledger, its costs, the transcripts).
#[test]
fn an_older_ralphs_books_of_a_nested_prd_move_into_its_own() {
    let env = TestEnv::new(&prd_with_stories(2));
    std::fs::create_dir_all(env.path("docs")).unwrap();
    env.git(&["mv", "prd.json", "docs/prd.json"]);
    env.git(&["commit", "-qm", "prd in docs"]);
    env.script(&json!({"invocations": [
        passing_in("docs/prd.json", "US-001", "f1.txt", 0.2),
        passing_in("docs/prd.json", "US-002", "f2.txt", 0.2)
    ]}));
    let out = env.ralph(&["run", "--prd", "docs/prd.json", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    // The layout of ralph before books per PRD: everything in .ralph/ itself.
    let books = env.path(".ralph/books/docs/prd.json");
    for entry in std::fs::read_dir(&books).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != ".gitignore" {
            std::fs::rename(entry.path(), env.path(".ralph").join(entry.file_name())).unwrap();
        }
    }
    std::fs::remove_dir_all(env.path(".ralph/books")).unwrap();
    let ledger = env
        .read(".ralph/ledger.jsonl")
        .replace(".ralph/books/docs/prd.json/runs/", ".ralph/runs/");
    env.write(".ralph/ledger.jsonl", &ledger);

    let out = env.ralph(&["run", "--prd", "docs/prd.json", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("moved this PRD's books"),
        "{}",
        text(&out)
    );
    assert!(!env.path(".ralph/ledger.jsonl").exists());
    let status = status_json(&env, &["--prd", "docs/prd.json"]);
    assert_eq!(status["total_iterations"], 2, "{status}");
    assert_eq!(status["total_cost_usd"], 0.4, "{status}");
    let show = env.ralph(&["show", "1", "--prd", "docs/prd.json", "--raw"]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show));
}

/// A run stopped by `--max-cost` before its first iteration (the feature's earlier runs spent
/// the budget) says so: the earlier runs' cost against the limit, the scope, how to get a fresh
/// budget; no iteration of its own, and no "not reported" cost for the iterations it never ran.
#[test]
fn a_budget_spent_by_earlier_runs_is_named_as_such() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        passing("@next", "f1.txt", 0.6),
        passing("@next", "f2.txt", 0.6),
        passing("@next", "f3.txt", 0.6)
    ]}));
    let out = env.ralph(&["run", "--max-iter", "2", "--max-cost", "5"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = env.ralph(&["run", "--max-cost", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(env.agent_calls(), 2, "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("earlier runs already spent $1.20 of the --max-cost $1.00"),
        "{err}"
    );
    assert!(err.contains("--budget-scope run"), "{err}");
    assert!(err.contains("before any iteration ran"), "{err}");
    assert!(!err.contains("is committed and recorded"), "{err}");
    assert!(!err.contains("not reported by the agent"), "{err}");
    assert!(err.contains("none this run (no iteration ran)"), "{err}");
}

/// `ralph` in directory `dir` (another clone) with `env`'s hermetic environment.
fn ralph_in(env: &TestEnv, dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    env.ralph_cmd(args).current_dir(dir).output().unwrap()
}

/// `git` in directory `dir`: its stdout, trimmed, or `None` when it failed.
fn git_in(env: &TestEnv, dir: &std::path::Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.envs())
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A fresh clone checked out on `main`, whose run branch exists only as `origin/ralph/demo`:
/// `status` shows that branch's prd.json and history, and `run` creates the local branch from
/// it (tracking it) and goes on with the next story, never starting over from `main`. A tree
/// with the user's changes is refused before any branch is created.
#[test]
fn a_fresh_clone_on_main_goes_on_from_the_remotes_run_branch() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        passing("@next", "f1.txt", 0.1),
        passing("@next", "f2.txt", 0.1)
    ]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    env.git(&["checkout", "-q", "main"]);
    let clone = env.root.path().join("clone");
    env.git(&[
        "clone",
        "-q",
        env.repo.to_str().unwrap(),
        clone.to_str().unwrap(),
    ]);
    assert_eq!(
        git_in(&env, &clone, &["branch", "--show-current"]).unwrap(),
        "main"
    );

    let out = ralph_in(&env, &clone, &["status", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(doc["next_story"], "US-002", "{doc}");
    assert_eq!(doc["shown_from"], "origin/ralph/demo", "{doc}");
    let out = ralph_in(&env, &clone, &["status"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("next story: US-002"), "{shown}");

    // The user's uncommitted work: refused, and no branch made.
    std::fs::write(clone.join("mine.txt"), "mine\n").unwrap();
    let out = ralph_in(&env, &clone, &["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("uncommitted changes"),
        "{}",
        text(&out)
    );
    assert_eq!(
        git_in(&env, &clone, &["branch", "--list", "ralph/demo"]).unwrap(),
        ""
    );
    assert_eq!(
        git_in(&env, &clone, &["branch", "--show-current"]).unwrap(),
        "main"
    );
    std::fs::remove_file(clone.join("mine.txt")).unwrap();

    let out = ralph_in(&env, &clone, &["run", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("ralph/demo (created from origin/ralph/demo, tracking it)"),
        "{err}"
    );
    assert!(err.contains("iteration 2 (1/1) · US-002"), "{err}");
    assert_eq!(
        git_in(
            &env,
            &clone,
            &["rev-parse", "--abbrev-ref", "ralph/demo@{upstream}"]
        )
        .unwrap(),
        "origin/ralph/demo"
    );
    let origin_tip = env.git(&["rev-parse", "ralph/demo"]);
    assert!(
        git_in(
            &env,
            &clone,
            &[
                "merge-base",
                "--is-ancestor",
                origin_tip.trim(),
                "ralph/demo"
            ]
        )
        .is_some(),
        "the clone's branch continues the remote's"
    );
    let ledger = std::fs::read_to_string(clone.join(".ralph/ledger.jsonl")).unwrap();
    let last: Value = serde_json::from_str(ledger.lines().last().unwrap()).unwrap();
    assert_eq!(last["story_id"], "US-002", "{ledger}");
}

/// Two PRDs on their own branches: `status --prd` of the one not checked out shows its own
/// branch's prd.json, so the next story it names is the one `run --prd` takes.
#[test]
fn status_of_a_prd_whose_branch_is_not_checked_out_names_the_story_run_takes() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.git(&["rm", "-q", "prd.json"]);
    let mut a = one_story_prd("ralph/a", "A-001");
    let mut second = a["userStories"][0].clone();
    second["id"] = json!("A-002");
    second["priority"] = json!(2);
    a["userStories"].as_array_mut().unwrap().push(second);
    let b = one_story_prd("ralph/b", "B-001");
    for (dir, prd) in [("a", &a), ("b", &b)] {
        let text = serde_json::to_string_pretty(prd).unwrap();
        env.write(&format!("prds/{dir}/prd.json"), &format!("{text}\n"));
    }
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "two PRDs"]);
    env.script(&json!({"invocations": [
        passing_in("prds/a/prd.json", "A-001", "a1.txt", 0.1),
        passing_in("prds/b/prd.json", "B-001", "b1.txt", 0.1),
        passing_in("prds/a/prd.json", "A-002", "a2.txt", 0.1)
    ]}));
    let out = env.ralph(&["run", "--prd", "prds/a/prd.json", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    env.git(&["checkout", "-q", "main"]);
    let out = env.ralph(&["run", "--prd", "prds/b/prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.git(&["branch", "--show-current"]).trim(), "ralph/b");

    let doc = status_json(&env, &["--prd", "prds/a/prd.json"]);
    assert_eq!(doc["next_story"], "A-002", "{doc}");
    assert_eq!(doc["shown_from"], "ralph/a", "{doc}");
    let out = env.ralph(&["status", "--prd", "prds/a/prd.json"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("next story: A-002"), "{shown}");
    assert!(shown.contains("ralph/a is not checked out here"), "{shown}");

    let out = env.ralph(&["run", "--prd", "prds/a/prd.json", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("A-002"), "{}", text(&out));
}
