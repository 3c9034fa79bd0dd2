//! `ralph run --parallel N` end to end (issue 20, "Tests and benchmark"): several stories at once,
//! each in its own worktree with its own agent, landed on the run branch one at a time.
//!
//! Each test asserts what a user checks in the morning: the exit code, prd.json's `passes`, the
//! run branch's files (`git ls-tree`), the ledger's `outcome`, `worker` and `landing`, the
//! `refs/ralph/salvage/...` refs, that no worktree is left under `.ralph/worktrees/`, and that a
//! file of the user's (ignored by git) is untouched.
//!
//! The scripted agents and helpers are in tests/it/common/par.rs.

use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::par::{
    assert_numbering, does, in_worktree_of, landing_kind, overlapped, prd_of, story, Par, BRANCH,
};
use crate::common::text;

#[test]
fn four_independent_stories_run_three_at_a_time_and_all_land() {
    let stories = (1..=4)
        .map(|i| story(i, &format!("test -f file-{i}.txt"), &[]))
        .collect();
    let par = Par::new(&prd_of(stories), &[]);
    for i in 1..=4 {
        let id = format!("US-{i:03}");
        par.story(
            &id,
            json!([does(&id, &format!("file-{i}.txt"), &format!("{i}\n"), 1500)]),
        );
    }
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let prd = par.env.prd();
    for s in prd["userStories"].as_array().expect("stories") {
        assert_eq!(
            s["passes"],
            true,
            "{} does not pass\n{}",
            s["id"],
            text(&out)
        );
    }
    let files = par.branch_files();
    for i in 1..=4 {
        assert!(
            files.contains(&format!("file-{i}.txt")),
            "file-{i}.txt is not on {BRANCH}: {files:?}"
        );
        assert_eq!(par.calls(&format!("US-{i:03}")), 1);
    }
    let ledger = par.env.ledger();
    assert_eq!(ledger.len(), 4, "{ledger:#?}");
    for r in &ledger {
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
        let worker = r["worker"].as_u64().unwrap_or(0);
        assert!((1..=3).contains(&worker), "worker slot {worker}: {r:#}");
        assert!(
            matches!(landing_kind(r), "fast_forward" | "merge"),
            "landing {}: {r:#}",
            landing_kind(r)
        );
        // Every agent worked in a worktree of its own, not in the checkout.
        let id = r["story_id"].as_str().expect("story");
        let dir = &par.starts(id)[0].2;
        assert!(in_worktree_of(dir, id), "{id}'s agent ran in {dir}");
    }
    let pairs = (0..4)
        .flat_map(|i| (i + 1..4).map(move |j| (i, j)))
        .filter(|(i, j)| overlapped(&ledger[*i], &ledger[*j]))
        .count();
    assert!(
        pairs >= 2,
        "iterations did not overlap in time ({pairs} overlapping pairs)"
    );
    // Numbering: one record per iteration, 1..=4 without gaps.
    assert_numbering(&ledger, "four iterations");
    par.assert_tidy(&out);
}

#[test]
fn a_dependent_story_starts_after_its_dependency_landed_and_sees_its_work() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            // Its check needs the dependency's file: it passes only where A's work is present.
            story(2, "test -f file-1.txt && test -f file-2.txt", &["US-001"]),
            story(3, "test -f file-3.txt", &[]),
        ]),
        &[],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 1500)]));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 100)]));
    par.story("US-003", json!([does("US-003", "file-3.txt", "3\n", 100)]));
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let a = par.records("US-001");
    let b = par.records("US-002");
    assert_eq!(a.len(), 1, "{a:#?}");
    assert_eq!(b.len(), 1, "B passed at its first attempt: {b:#?}");
    assert_eq!(b[0]["outcome"], "story_passed", "{:#}", b[0]);
    let t = |r: &Value, k: &str| {
        chrono::DateTime::parse_from_rfc3339(r[k].as_str().expect("time")).expect("RFC 3339")
    };
    assert!(
        t(&b[0], "started_at") >= t(&a[0], "ended_at"),
        "B started before A landed: A {:#} / B {:#}",
        a[0],
        b[0]
    );
    // B's agent found A's file in its worktree when it started.
    let starts = par.starts("US-002");
    assert_eq!(starts.len(), 1);
    assert!(
        starts[0].3.contains(&"file-1.txt".to_owned()),
        "B's worktree had no file-1.txt when its agent started: {:?}",
        starts[0]
    );
    let files = par.branch_files();
    for f in ["file-1.txt", "file-2.txt", "file-3.txt"] {
        assert!(files.contains(&f.to_owned()), "{f} missing: {files:?}");
    }
    par.assert_tidy(&out);
}

#[test]
fn a_story_whose_dependency_is_blocked_is_blocked_and_never_started() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &["US-001"]),
            story(3, "test -f file-3.txt", &[]),
        ]),
        &[],
    );
    // A's agent works but never gets its check to pass.
    par.story(
        "US-001",
        json!([[
            {"write_file": {"path": "wrong.txt", "content": "not it\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"git_commit": "feat: US-001 attempt"},
            {"stdout": "done, I think"}
        ]]),
    );
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    par.story("US-003", json!([does("US-003", "file-3.txt", "3\n", 300)]));
    let out = par.run(3, &["--max-attempts", "2"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "every open story blocked: exit 4\n{}",
        text(&out)
    );
    assert_eq!(par.calls("US-002"), 0, "an agent ran for B");
    assert!(
        par.records("US-002").is_empty(),
        "{:#?}",
        par.records("US-002")
    );
    assert_eq!(par.calls("US-001"), 2);
    let prd = par.env.prd();
    let passes = |i: usize| prd["userStories"][i]["passes"].clone();
    assert_eq!(
        (passes(0), passes(1), passes(2)),
        (json!(false), json!(false), json!(true))
    );
    let state = par.env.state();
    let blocked: Vec<&str> = state["blocked"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // B's block is derived from A's (docs/decisions.md: "waits for a blocked story" is never
    // stored), and said in the summary and by `ralph status`.
    assert_eq!(blocked, ["US-001"]);
    let status = par.env.ralph(&["status"]);
    let said = format!("{}{}", text(&out), text(&status));
    assert!(
        said.contains("waits for US-001"),
        "no 'waits for US-001' in the run's or status's output:\n{said}"
    );
    assert!(!par.branch_files().contains(&"file-2.txt".to_owned()));
    par.assert_tidy(&out);
}

#[test]
fn two_stories_editing_one_line_conflict_without_losing_work_and_the_loser_retries() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "grep -q A shared.txt", &[]),
            story(2, "grep -q B shared.txt", &[]),
        ]),
        &[("shared.txt", "original line\n")],
    );
    par.story(
        "US-001",
        json!([does("US-001", "shared.txt", "A's line\n", 100)]),
    );
    // B's first attempt starts with A's and writes the same line once A has landed; its second
    // attempt (from the new tip) keeps A's line and adds its own.
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            does("US-002", "shared.txt", "A's line\nB's line\n", 0)
        ]),
    );
    // Both start from the same tip: A finishes only once B's agent runs, B writes its line only
    // once A landed.
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait(
        "US-002",
        0,
        &format!(
            "git -C '{}' show '{BRANCH}:shared.txt' 2>/dev/null | grep -q \"A's line\"",
            par.env.repo.display()
        ),
    );
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let b = par.records("US-002");
    assert!(b.len() >= 2, "{b:#?}");
    assert_eq!(b[0]["outcome"], "conflict", "{:#}", b[0]);
    assert_eq!(landing_kind(&b[0]), "conflict", "{:#}", b[0]);
    let files: Vec<&str> = b[0]["landing"]["files"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(files, ["shared.txt"], "{:#}", b[0]);
    // B's work is kept under the salvage ref the record names.
    let run_id = b[0]["run_id"].as_str().expect("run id");
    let salvage = format!("refs/ralph/salvage/{run_id}/US-002");
    assert_eq!(
        b[0]["landing"]["salvage_ref"],
        salvage.as_str(),
        "{:#}",
        b[0]
    );
    assert!(
        par.salvage_refs().contains(&salvage),
        "{salvage} missing: {:?}",
        par.salvage_refs()
    );
    assert_eq!(par.show(&salvage, "shared.txt"), "B's line\n");
    // Its next attempt was told about the conflict, and passed from the new tip.
    let retry = par.prompt("US-002", 1);
    assert!(
        retry.contains("conflict") && retry.contains("shared.txt"),
        "the retry's prompt does not name the conflict:\n{retry}"
    );
    assert_eq!(b.last().expect("a record")["outcome"], "story_passed");
    assert_eq!(par.on_branch("shared.txt"), "A's line\nB's line\n");
    assert_eq!(par.conflict_markers(), "", "conflict markers on {BRANCH}");
    par.assert_tidy(&out);
}

#[test]
fn a_story_whose_check_fails_once_another_landed_is_reverted_and_retried() {
    // B's check counts the feature files against what B expects: alone in its worktree there is
    // one (its own), once A landed there are two.
    let check_b = "test \"$(ls feature-*.txt | wc -l)\" -eq \"$(cat expected-count.txt)\"";
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f feature-a.txt", &[]),
            story(2, check_b, &[]),
        ]),
        &[],
    );
    par.story(
        "US-001",
        json!([does("US-001", "feature-a.txt", "a\n", 100)]),
    );
    let b_attempt = |expected: &str| {
        json!([
            {"write_file": {"path": "feature-b.txt", "content": "b\n"}},
            {"write_file": {"path": "expected-count.txt", "content": expected}},
            {"set_passes": {"id": "US-002", "passes": true}},
            {"git_commit": "feat: US-002"},
            {"stdout": "US-002 done"}
        ])
    };
    par.story("US-002", json!([b_attempt("1\n"), b_attempt("2\n")]));
    // B starts from the tip without A's work, and finishes once A landed.
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait("US-002", 0, &par.landed("feature-a.txt"));
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let b = par.records("US-002");
    assert!(b.len() >= 2, "{b:#?}");
    assert_eq!(
        landing_kind(&b[0]),
        "reverted",
        "{:#?}\n{}",
        par.env.ledger(),
        text(&out)
    );
    // README ("--parallel"): not landed, as a failed check (`verify_failed`, landing
    // `reverted`).
    assert_eq!(b[0]["outcome"], "verify_failed", "{:#}", b[0]);
    let landed_since: Vec<&str> = b[0]["landing"]["landed_since"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(landed_since, ["US-001"], "{:#}", b[0]);
    // The branch as that iteration left it does not hold B's work; the salvage ref does.
    let after = b[0]["head_after"].as_str().expect("head_after");
    assert_eq!(
        par.show(after, "feature-b.txt"),
        "",
        "B's work stayed on the branch"
    );
    let salvage = b[0]["landing"]["salvage_ref"]
        .as_str()
        .expect("salvage_ref");
    assert_eq!(par.show(salvage, "expected-count.txt"), "1\n");
    // The check's failure is the retry's feedback, and the retry passed.
    assert_eq!(b.last().expect("a record")["outcome"], "story_passed");
    assert_eq!(par.calls("US-002"), 2);
    assert!(
        par.prompt("US-002", 1).contains("US-001"),
        "the retry's prompt does not say which landed story broke the check:\n{}",
        par.prompt("US-002", 1)
    );
    assert_eq!(par.on_branch("expected-count.txt"), "2\n");
    assert_eq!(par.env.prd()["userStories"][1]["passes"], true);
    par.assert_tidy(&out);
}

#[test]
fn a_failing_worktree_setup_blocks_only_its_story_and_spends_no_agent() {
    let stories = (1..=3)
        .map(|i| story(i, &format!("test -f file-{i}.txt"), &[]))
        .collect();
    // The worktree's directory is named after its story (`<story>-<iteration>`): the setup
    // fails for US-002 only.
    let par = Par::new(
        &prd_of(stories),
        &[(
            "ralph.toml",
            "worktree_setup = \"case \\\"$PWD\\\" in */US-002-*) echo 'setup broke for US-002' >&2; exit 1;; esac; touch setup-ran.local\"\n",
        )],
    );
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        par.story(
            &id,
            json!([does(&id, &format!("file-{i}.txt"), "x\n", 200)]),
        );
    }
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(par.calls("US-002"), 0, "an agent ran for US-002");
    let b = par.records("US-002");
    assert_eq!(b.len(), 1, "{b:#?}");
    assert_eq!(b[0]["outcome"], "setup_failed", "{:#}", b[0]);
    let said = format!("{:#}", b[0]);
    assert!(
        said.contains("setup broke for US-002"),
        "the setup's output is not on record: {said}"
    );
    // The others ran after their setup and landed.
    for id in ["US-001", "US-003"] {
        assert_eq!(par.records(id)[0]["outcome"], "story_passed");
        assert!(par.starts(id)[0].3.contains(&"setup-ran.local".to_owned()));
    }
    let prd = par.env.prd();
    assert_eq!(prd["userStories"][1]["passes"], false);
    let blocked = par.env.state()["blocked"].clone();
    assert_eq!(blocked, json!(["US-002"]));
    par.assert_tidy(&out);
}

/// The same three-story run, serial and with `--parallel 1`.
fn three_story_run(parallel: Option<u32>) -> (Par, Output) {
    let stories = (1..=3)
        .map(|i| story(i, &format!("test -f file-{i}.txt"), &[]))
        .collect();
    let par = Par::new(&prd_of(stories), &[]);
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        let first = if i == 2 {
            // One failed attempt first, so the outcomes are not all the same.
            json!([{"write_file": {"path": "tmp-2.txt", "content": "wip\n"}}, {"stdout": "not yet"}])
        } else {
            does(&id, &format!("file-{i}.txt"), "x\n", 0)
        };
        par.story(
            &id,
            json!([first, does(&id, &format!("file-{i}.txt"), "x\n", 0)]),
        );
    }
    let out = match parallel {
        Some(n) => par.run(n, &[]),
        None => {
            let wrapper = par.wrapper.display().to_string();
            par.env.ralph(&[
                "run",
                "--agent",
                "exec",
                "--agent-cmd",
                &wrapper,
                "--max-iter",
                "20",
            ])
        }
    };
    (par, out)
}

#[test]
fn parallel_1_is_the_serial_run() {
    let (serial, s_out) = three_story_run(None);
    let (one, o_out) = three_story_run(Some(1));
    assert_eq!(s_out.status.code(), Some(0), "{}", text(&s_out));
    assert_eq!(o_out.status.code(), o_out.status.code());
    assert_eq!(o_out.status.code(), Some(0), "{}", text(&o_out));
    let shape = |p: &Par| -> Vec<(String, String)> {
        p.env
            .ledger()
            .iter()
            .map(|r| {
                (
                    r["story_id"].as_str().unwrap_or("?").to_owned(),
                    r["outcome"].as_str().unwrap_or("?").to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(shape(&serial), shape(&one));
    for r in one.env.ledger() {
        for field in ["worker", "worktree", "landing"] {
            assert!(
                r.get(field).is_none(),
                "--parallel 1 recorded {field}: {r:#}"
            );
        }
    }
    // The agent works in the checkout itself, as in a serial run; the history has the same
    // commits.
    for id in ["US-001", "US-002", "US-003"] {
        let dir = &one.starts(id)[0].2;
        assert_eq!(
            std::path::Path::new(dir).canonicalize().ok(),
            one.env.repo.canonicalize().ok(),
            "{id}'s agent ran in {dir}"
        );
    }
    let subjects = |p: &Par| p.env.git(&["log", "--format=%s", BRANCH]);
    assert_eq!(subjects(&serial), subjects(&one));
    assert!(!one.env.path(".ralph/worktrees").exists());
    one.assert_tidy(&o_out);
}

#[test]
fn sigkill_with_three_workers_in_flight_then_restart_loses_nothing() {
    // A few kill points per test run, each case its own seed (printed): replay one with
    // RALPH_PARALLEL_KILL_SEED=<seed>; RALPH_PARALLEL_KILL_CASES=<n> for a longer soak.
    let seeds: Vec<u64> = match std::env::var("RALPH_PARALLEL_KILL_SEED") {
        Ok(s) => vec![s
            .trim()
            .parse()
            .expect("RALPH_PARALLEL_KILL_SEED must be a u64")],
        Err(_) => {
            let n = std::env::var("RALPH_PARALLEL_KILL_CASES")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(3);
            (0..n).map(|_| fastrand::u64(..)).collect()
        }
    };
    for seed in seeds {
        eprintln!("RALPH_PARALLEL_KILL_SEED={seed}");
        kill_case(seed);
    }
}

/// One case of [`sigkill_with_three_workers_in_flight_then_restart_loses_nothing`].
fn kill_case(seed: u64) {
    use std::time::Instant;
    let mut rng = fastrand::Rng::with_seed(seed);
    let stories = (1..=3)
        .map(|i| {
            story(
                i,
                &format!("test -f file-{i}.txt && test -f part-{i}.txt"),
                &[],
            )
        })
        .collect();
    let par = Par::new(&prd_of(stories), &[]);
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        // The first attempt commits part of the work, works on (1 to 3 s), then finishes; the
        // kill may come anywhere in it, or in its landing. A second attempt does the whole story
        // (it may start from the tip without the first attempt's work, which is then kept under
        // a salvage ref).
        par.story(
            &id,
            json!([
                [
                    {"write_file": {"path": format!("part-{i}.txt"), "content": "part\n"}},
                    {"git_commit": format!("wip: {id}")},
                    {"write_file": {"path": format!("loose-{i}.txt"), "content": "uncommitted\n"}},
                    {"sleep_ms": 1000 * i as u64},
                    {"write_file": {"path": format!("file-{i}.txt"), "content": "done\n"}},
                    {"set_passes": {"id": id, "passes": true}},
                    {"git_commit": format!("feat: {id}")},
                    {"stdout": "done"}
                ],
                [
                    {"write_file": {"path": format!("part-{i}.txt"), "content": "part\n"}},
                    {"write_file": {"path": format!("file-{i}.txt"), "content": "done\n"}},
                    {"set_passes": {"id": id, "passes": true}},
                    {"git_commit": format!("feat: {id}, again")},
                    {"stdout": "done"}
                ]
            ]),
        );
    }
    let args = par.args(3, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = par.env.ralph_spawn(&args);
    // All three agents started, then the kill at a random point of the next 3.5 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (1..=3).any(|i| par.calls(&format!("US-{i:03}")) == 0) {
        assert!(
            Instant::now() < deadline,
            "three workers never ran at once:\n{}",
            par.env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each first attempt has committed part of its work and left a file uncommitted (what
    // recovery must keep): the kill comes after that, anywhere in the agents' remaining work
    // (1 to 3 s) or in the landings. (A kill before the agents wrote anything would leave
    // nothing to keep, and what a killed agent half-wrote is not what this test is about.)
    let loose_written = || {
        let trees = par.env.repo.join(".ralph").join("worktrees");
        (1..=3).all(|i| {
            walk_has(&trees, &format!("loose-{i}.txt"))
                || par
                    .records(&format!("US-{i:03}"))
                    .iter()
                    .any(|r| r["outcome"] == "story_passed")
        })
    };
    while !loose_written() {
        assert!(
            Instant::now() < deadline,
            "the agents never wrote their files:\n{}",
            par.env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(rng.u64(0..3000)));
    crate::common::signal(&child, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let out = par.env.ralph(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "seed {seed}\n{}\n{}",
        text(&out),
        par.env.spawned_output()
    );
    let ledger = par.env.ledger();
    assert_numbering(&ledger, &format!("seed {seed}"));
    // Every agent run has its record: started agents = records (setup never fails here).
    let started: usize = (1..=3).map(|i| par.calls(&format!("US-{i:03}"))).sum();
    assert_eq!(ledger.len(), started, "seed {seed}: {ledger:#?}");
    for r in ledger.iter().filter(|r| r["outcome"] == "interrupted") {
        // Its work landed, or is kept under a salvage ref the record names.
        match landing_kind(r) {
            "fast_forward" | "merge" => {}
            _ => {
                let salvage = r["landing"]["salvage_ref"].as_str().unwrap_or("");
                assert!(
                    salvage.starts_with("refs/ralph/salvage/") && par.salvage_refs().contains(&salvage.to_owned()),
                    "seed {seed}: an interrupted iteration's work is neither landed nor saved: {r:#}"
                );
                let i = r["story_id"]
                    .as_str()
                    .expect("id")
                    .trim_start_matches("US-")
                    .parse::<usize>()
                    .expect("n");
                // What it committed and what it left uncommitted are both in the ref.
                for (f, content) in [
                    (format!("part-{i}.txt"), "part\n"),
                    (format!("loose-{i}.txt"), "uncommitted\n"),
                ] {
                    assert_eq!(par.show(salvage, &f), content, "seed {seed}: {f} in {r:#}");
                }
            }
        }
    }
    // Every story passes, through a check that ran on the branch (no pass left unchecked).
    assert_every_pass_checked(&par, &format!("seed {seed}"));
    let stories = par.env.prd()["userStories"]
        .as_array()
        .expect("stories")
        .len();
    for i in 1..=stories {
        for f in [format!("file-{i}.txt"), format!("part-{i}.txt")] {
            assert!(
                par.branch_files().contains(&f),
                "seed {seed}: {f} not on {BRANCH}"
            );
        }
    }
    par.assert_tidy(&out);
}

/// Every story of prd.json passes, and its last `story_passed` record has a check that passed
/// (no pass prd.json kept with no record, none left unchecked); `what` starts the failure
/// messages (a seed, a kill point).
fn assert_every_pass_checked(par: &Par, what: &str) {
    for s in par.env.prd()["userStories"].as_array().expect("stories") {
        assert_eq!(s["passes"], true, "{what}: {s}");
        let id = s["id"].as_str().expect("id");
        let passed = par
            .records(id)
            .into_iter()
            .rev()
            .find(|r| r["outcome"] == "story_passed")
            .unwrap_or_else(|| {
                panic!(
                    "{what}: {id} passes without a story_passed record: {:#?}",
                    par.env.ledger()
                )
            });
        assert!(
            passed["verify"]
                .as_array()
                .is_some_and(|v| v.iter().any(|c| c["passed"] == true)),
            "{what}: {id}'s pass has no check: {passed:#}"
        );
    }
}

/// ralph SIGKILLed at one point of its first landing (the test hook `RALPH_TEST_KILL_AT`,
/// feature test-fakes), then run again: every story passes through a `story_passed` record
/// with a check (never a pass prd.json kept with no record), numbering has no gaps, no worktree
/// is left registered, and the checkout is clean.
fn killed_in_landing_then_restart(point: &str) {
    let stories = (1..=2)
        .map(|i| story(i, &format!("test -f file-{i}.txt"), &[]))
        .collect();
    let par = Par::new(&prd_of(stories), &[]);
    for i in 1..=2 {
        let id = format!("US-{i:03}");
        let attempt = json!([
            {"write_file": {"path": format!("file-{i}.txt"), "content": "done\n"}},
            {"set_passes": {"id": id, "passes": true}},
            {"git_commit": format!("feat: {id}")},
            {"stdout": "done"}
        ]);
        par.story(&id, json!([attempt.clone(), attempt]));
    }
    let args = par.args(2, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = par.env.ralph_cmd(&args);
    cmd.env("RALPH_TEST_KILL_AT", point);
    let killed = cmd.output().expect("run ralph");
    assert_eq!(
        killed.status.code(),
        None,
        "{point}: ralph was not killed at its landing\n{}",
        text(&killed)
    );
    let out = par.env.ralph(&args);
    assert_eq!(out.status.code(), Some(0), "{point}\n{}", text(&out));
    let ledger = par.env.ledger();
    assert_numbering(&ledger, point);
    assert_every_pass_checked(&par, point);
    // At every commit of the run branch, a story prd.json marks passing has its record by then
    // or is set back by the next commit: the branch's last prd.json is checked above; the
    // landing the kill cut short is on record as landed or kept.
    for r in ledger.iter().filter(|r| r["outcome"] == "interrupted") {
        let kind = landing_kind(r);
        let salvage = r["landing"]["salvage_ref"].as_str().unwrap_or("");
        // (An iteration killed before its agent changed anything has nothing to keep.)
        let no_work = r["commits"].as_array().is_none_or(Vec::is_empty)
            && r["files_changed"].as_array().is_none_or(Vec::is_empty);
        assert!(
            matches!(kind, "fast_forward" | "merge")
                || par.salvage_refs().contains(&salvage.to_owned())
                || no_work,
            "{point}: an interrupted iteration's work is neither landed nor kept: {r:#}"
        );
    }
    par.assert_tidy(&out);
}

#[test]
fn killed_after_the_landing_note_then_restart_checks_every_pass() {
    killed_in_landing_then_restart("landing-noted");
}

#[test]
fn killed_after_the_checkout_moved_then_restart_checks_every_pass() {
    killed_in_landing_then_restart("landing-moved");
}

#[test]
fn killed_after_prd_json_marked_the_pass_then_restart_checks_every_pass() {
    killed_in_landing_then_restart("landing-marked");
}

#[test]
fn killed_after_the_landing_commit_before_its_record_then_restart_checks_every_pass() {
    killed_in_landing_then_restart("commit-checkpointed");
}

#[test]
fn killed_after_the_landing_was_recorded_then_restart_leaves_no_worktree() {
    killed_in_landing_then_restart("landing-recorded");
}

/// The real claude CLI (scripts/install-claude.sh) against the scripted model: the textkit
/// example's three stories with `--parallel 2`, each worker's claude working in its own
/// worktree (the scenario writes under the directory the CLI reports as its own).
#[test]
fn real_claude_runs_three_stories_two_at_a_time() {
    let Some(claude) =
        crate::support_model::claude_bin_or_skip("real_claude_runs_three_stories_two_at_a_time")
    else {
        return;
    };
    let fx = crate::real_claude::Fixture::textkit();
    let scenario = crate::support_model::example_dir("textkit").join("scenario.json");
    let out = fx.ralph_with_model(
        &claude,
        &["--max-iter", "8", "--keep-api-key", "--parallel", "2"],
        &scenario,
        "ralph-parallel",
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");
    assert!(
        fx.prd_passes().iter().all(|(_, passes)| *passes),
        "{:?}",
        fx.prd_passes()
    );
    let ledger = fx.ledger();
    let passed: Vec<&Value> = ledger
        .iter()
        .filter(|r| r["outcome"] == "story_passed")
        .collect();
    assert_eq!(passed.len(), 3, "{ledger:#?}");
    for r in &passed {
        assert!(
            r["worker"].as_u64().is_some_and(|w| (1..=2).contains(&w)),
            "{r:#}"
        );
        assert!(matches!(landing_kind(r), "fast_forward" | "merge"), "{r:#}");
        let wt = r["worktree"].as_str().unwrap_or("");
        assert!(wt.starts_with(".ralph/worktrees/"), "{r:#}");
    }
    let status = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&fx.repo)
        .output()
        .expect("git status");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "", "{out}");
    // The project's own tests, written by the three agents, pass together on the branch.
    let tests = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-q"])
        .current_dir(&fx.repo)
        .output()
        .expect("python3");
    let said = String::from_utf8_lossy(&tests.stderr);
    assert!(
        tests.status.success() && said.contains("Ran 15 tests"),
        "{said}"
    );
}

/// Whether a file named `name` lies anywhere under `dir` (two levels: `<run>/<tree>/name`).
fn walk_has(dir: &std::path::Path, name: &str) -> bool {
    let Ok(runs) = std::fs::read_dir(dir) else {
        return false;
    };
    runs.flatten().any(|run| {
        std::fs::read_dir(run.path())
            .is_ok_and(|trees| trees.flatten().any(|tree| tree.path().join(name).exists()))
    })
}
