//! `ralph run --parallel N`: what a worktree's setup and its agent do around the landing that
//! ralph must not take as the agent's work or lose (the tester's findings on landing), with the
//! scripted per-story agents of tests/it/common/par.rs.

use serde_json::{json, Value};

use crate::common::par::{does, findings, simple_stories, Par, BRANCH};
use crate::common::text;

/// Files `worktree_setup` creates (not ignored) are not the agent's uncommitted work: they are
/// in no commit on the run branch, and the record says why; a setup file the agent changed, and
/// the agent's own uncommitted files, are committed as its work. (An agent that commits with
/// `git add -A` takes them in its own commit: that is its choice, not ralph's.)
#[test]
fn files_the_worktree_setup_made_are_not_committed_as_the_agents_work() {
    let par = Par::new(
        &simple_stories(2),
        &[(
            "ralph.toml",
            "worktree_setup = \"echo setup > setup.out; mkdir -p gen; echo gen > gen/made.txt; echo one > tweak.txt\"\n",
        )],
    );
    par.story(
        "US-001",
        json!([[
            {"write_file": {"path": "file-1.txt", "content": "1\n"}},
            {"write_file": {"path": "tweak.txt", "content": "the agent changed it\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"stdout": "US-001 done"}
        ]]),
    );
    par.story(
        "US-002",
        json!([[
            {"write_file": {"path": "file-2.txt", "content": "2\n"}},
            {"set_passes": {"id": "US-002", "passes": true}},
            {"stdout": "US-002 done"}
        ]]),
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for setup_file in ["setup.out", "gen/made.txt"] {
        let holding = par
            .env
            .git(&["log", "--format=%h %s", BRANCH, "--", setup_file]);
        assert_eq!(
            holding,
            "",
            "{setup_file} (made by worktree_setup) was committed as an agent's work\n{}",
            text(&out)
        );
    }
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n");
    assert_eq!(par.show(BRANCH, "tweak.txt"), "the agent changed it\n");
    assert_eq!(par.show(BRANCH, "file-2.txt"), "2\n");
    let a = &par.records("US-001")[0];
    let said = findings(a);
    assert!(
        said.contains("setup.out")
            && said.contains("worktree_setup")
            && !said.contains("tweak.txt"),
        "the record does not say the setup's files were left out: {said}"
    );
}

/// An agent that commits and then runs `git worktree remove --force` on its own worktree does
/// not lose its commit: the worktree is locked, the removal is refused, and the story lands in
/// that iteration.
#[test]
fn an_agent_cannot_remove_its_own_worktree_and_lose_its_commit() {
    let par = Par::new(&simple_stories(1), &[]);
    par.story(
        "US-001",
        json!([[
            {"write_file": {"path": "file-1.txt", "content": "1\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"git_commit": "feat: US-001"},
            {"stdout": "US-001 done"}
        ]]),
    );
    par.post(
        "US-001",
        0,
        "W=$PWD\nif git -C \"$W\" worktree remove --force \"$W\"; then echo removed; else echo refused; fi\n",
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let subjects = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(
        subjects.contains("feat: US-001"),
        "the agent's commit is not on the run branch:\n{subjects}\n{}",
        text(&out)
    );
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n");
    let r = &par.records("US-001")[0];
    assert_eq!(r["outcome"], "story_passed", "{r:#}");
    assert_eq!(par.calls("US-001"), 1, "the story needed another attempt");
    assert_eq!(par.registered_worktrees(), 1, "a worktree is left");
}

/// An agent that runs `git checkout main` in its worktree and commits there moves `main`: the
/// record names `main` as serial mode does ("HEAD moved from … to main; … left main as it is"),
/// not only "the agent rewrote history", and the story lands with a valid prd.json.
#[test]
fn an_agent_moving_main_from_its_worktree_is_told_by_name() {
    let par = Par::new(&simple_stories(2), &[]);
    let main_before = par.env.git(&["rev-parse", "main"]);
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    par.pre("US-001", 0, "git checkout -q main\n");
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_ne!(
        par.env.git(&["rev-parse", "main"]),
        main_before,
        "main did not move"
    );
    let r = &par.records("US-001")[0];
    let said = findings(r);
    assert!(
        said.contains("to main") && said.contains("left main as it is"),
        "the record does not name main: {said}\n{r:#}"
    );
    for id in ["US-001", "US-002"] {
        let r = &par.records(id)[0];
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
    }
    let prd: Value = serde_json::from_str(&par.show(BRANCH, "prd.json"))
        .expect("the run branch's prd.json is valid JSON");
    assert!(
        prd["userStories"]
            .as_array()
            .is_some_and(|a| a.iter().all(|s| s["passes"] == true)),
        "{prd:#}"
    );
}

/// An agent that commits and then deletes its own worktree (`rm -rf`, past the lock): its
/// commit is kept under a salvage ref (git's registration still names it), the record says what
/// happened, the registration is pruned, and the story's next attempt lands.
#[test]
fn an_agent_deleting_its_own_worktree_keeps_its_commit_under_a_salvage_ref() {
    let par = Par::new(&simple_stories(1), &[]);
    par.story(
        "US-001",
        json!([
            [
                {"write_file": {"path": "file-1.txt", "content": "1\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 first try"},
                {"stdout": "US-001 done"}
            ],
            [
                {"write_file": {"path": "file-1.txt", "content": "1 again\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 second try"},
                {"stdout": "US-001 done"}
            ]
        ]),
    );
    par.post("US-001", 0, "W=$PWD\ncd /\nrm -rf \"$W\"\n");
    let out = par.run(2, &[]);
    let first = &par.records("US-001")[0];
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was deleted while the agent ran")
            && message.contains("refs/ralph/salvage/"),
        "the record does not say what happened: {first:#}\n{}",
        text(&out)
    );
    let sha = par.env.git(&[
        "log",
        "--all",
        "--format=%H",
        "--grep",
        "feat: US-001 first try",
    ]);
    let sha = sha.trim();
    assert!(
        !sha.is_empty(),
        "the agent's first commit is reachable from no ref"
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1 again\n");
    assert_eq!(
        par.registered_worktrees(),
        1,
        "a worktree is left registered"
    );
}

/// An agent that commits in the user's checkout (`git -C <checkout> commit`) from its worktree
/// moves the run branch forward: the record and the run's warnings name the commit as an
/// agent's (ralph takes it off the branch, kept under a salvage ref: see
/// parallel_findings.rs).
#[test]
fn an_agent_committing_in_the_main_checkout_is_named() {
    let par = Par::new(&simple_stories(1), &[]);
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let main = par.env.repo.display().to_string();
    par.pre(
        "US-001",
        0,
        &format!(
            "echo side > '{main}/side.txt'\ngit -C '{main}' add side.txt\ngit -C '{main}' commit -q -m 'agent: side file'\n"
        ),
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let sha = par
        .env
        .git(&["log", "--format=%h", "--grep", "agent: side file", "--all"]);
    let sha = sha.trim();
    assert!(!sha.is_empty(), "the agent's commit is kept by no ref");
    let r = &par.records("US-001")[0];
    let said = findings(r);
    assert!(
        said.contains("an agent of this run committing in your checkout")
            && said.contains(&sha[..7]),
        "the record does not name the agent's commit in the checkout: {said}\n{r:#}"
    );
    assert!(
        text(&out).contains("committing in your checkout"),
        "no warning:\n{}",
        text(&out)
    );
}

/// The agent of the story above moves `main` and its check fails: the story's next attempt
/// meets a valid prd.json, and no iteration ends `prd_corrupted` (the tester saw one; this
/// path does not reproduce it, see the report).
#[test]
fn an_agent_moving_main_then_failing_its_check_leaves_a_valid_prd() {
    let par = Par::new(&simple_stories(2), &[]);
    par.story(
        "US-001",
        json!([
            does("US-001", "wrong.txt", "w\n", 0),
            does("US-001", "file-1.txt", "1\n", 0)
        ]),
    );
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    par.pre("US-001", 0, "git checkout -q main\n");
    let out = par.run(2, &[]);
    let outcomes: Vec<String> = par
        .records("US-001")
        .iter()
        .map(|r| format!("{} {}", r["outcome"], r["message"]))
        .collect();
    assert_eq!(out.status.code(), Some(0), "{outcomes:#?}\n{}", text(&out));
    assert!(
        !outcomes.iter().any(|o| o.contains("prd_corrupted")),
        "{outcomes:#?}"
    );
}

/// A worker's agent that writes the main checkout's prd.json (its path is easy to find), marking
/// every story passing and changing another story's check, and commits nothing there, does not
/// end the run "complete": ralph sets those stories back with a warning naming them, puts the
/// check back, and every story runs and passes its own check (the tester's false completion:
/// US-004 never ran, yet the run said 4 of 4 passed).
#[test]
fn an_agent_marking_stories_passing_in_the_main_checkout_does_not_complete_the_run() {
    let par = Par::new(&simple_stories(4), &[]);
    for i in 1..=4 {
        let id = format!("US-{i:03}");
        par.story(
            &id,
            json!([does(&id, &format!("file-{i}.txt"), &format!("{i}\n"), 0)]),
        );
    }
    let main = par.env.repo.display().to_string();
    let marker = par.agents.join("main-prd-written");
    par.post(
        "US-002",
        0,
        &format!(
            "sed -i -e 's/\"passes\": false/\"passes\": true/' -e 's/\"test -f file-4.txt\"/\"true\"/' '{main}/prd.json'\ngrep -q '\"passes\": false' '{main}/prd.json' && exit 1\ntouch '{}'\n",
            marker.display()
        ),
    );
    // US-001 ends after the checkout's prd.json was written: the next pick meets it.
    par.wait("US-001", 0, &format!("test -f '{}'", marker.display()));
    let out = par.run(2, &[]);
    let said = text(&out);
    assert!(marker.exists(), "the agent's step did not run:\n{said}");
    assert!(
        said.contains("passing outside ralph's landing: set back") && said.contains("US-004"),
        "no warning naming the stories set back:\n{said}"
    );
    assert!(
        said.contains("put back to the run branch's version"),
        "no warning about US-004's changed check:\n{said}"
    );
    for i in 1..=4 {
        let id = format!("US-{i:03}");
        assert!(par.calls(&id) >= 1, "{id}'s agent never ran:\n{said}");
        let records = par.records(&id);
        assert!(
            records.iter().any(|r| r["outcome"] == "story_passed"),
            "{id} has no story_passed record: {records:#?}\n{said}"
        );
        assert_eq!(
            par.show(BRANCH, &format!("file-{i}.txt")),
            format!("{i}\n"),
            "{id}'s work is not on the run branch:\n{said}"
        );
    }
    assert_eq!(out.status.code(), Some(0), "{said}");
    let prd: Value = serde_json::from_str(&par.show(BRANCH, "prd.json")).expect("prd.json");
    assert_eq!(
        prd["userStories"][3]["verify"], "test -f file-4.txt",
        "US-004's check is still the agent's: {prd:#}"
    );
}

/// A pause in a `--parallel` run is the user's turn: their edit of a story's criteria made
/// while the run is paused is kept and committed, not put back as a worker's write to the
/// checkout's prd.json (which the guard above does while workers run).
#[test]
fn the_users_edit_during_a_parallel_pause_is_kept() {
    let par = Par::new(&simple_stories(3), &[]);
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        par.story(
            &id,
            json!([does(&id, &format!("file-{i}.txt"), &format!("{i}\n"), 0)]),
        );
    }
    let go = par.agents.join("go");
    for id in ["US-001", "US-002"] {
        par.wait(id, 0, &format!("test -f '{}'", go.display()));
    }
    let mut child = par.spawn(2, &["--json"]);
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never happened"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    until("both agents started", &|| {
        par.calls("US-001") >= 1 && par.calls("US-002") >= 1
    });
    let paused = par.env.ralph(&["pause"]);
    assert_eq!(paused.status.code(), Some(0), "{}", text(&paused));
    std::fs::write(&go, "").expect("go");
    // The run holds (its `paused` event), not only "nothing in flight and a pause asked": a
    // user who resumes before the run got to hold is not given the turn (docs/decisions.md).
    until("the run holds", &|| {
        par.env.spawned_output().contains(r#""event":"paused""#)
    });
    // The user rewrites US-003's criterion while the run holds.
    let path = par.env.repo.join("prd.json");
    let edited = std::fs::read_to_string(&path).expect("prd.json").replace(
        "file-3.txt exists",
        "file-3.txt exists and holds the number 3",
    );
    std::fs::write(&path, edited).expect("edit prd.json");
    let resumed = par.env.ralph(&["resume"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    let code = child.wait().expect("run").code();
    let said = par.env.spawned_output();
    assert_eq!(code, Some(0), "{said}");
    assert!(
        !said.contains("put back to the run branch's version"),
        "{said}"
    );
    assert!(
        par.prompt("US-003", 0).contains("holds the number 3"),
        "US-003's agent did not get the user's criterion"
    );
    let prd: Value = serde_json::from_str(&par.show(BRANCH, "prd.json")).expect("prd.json");
    assert_eq!(
        prd["userStories"][2]["acceptanceCriteria"][0], "file-3.txt exists and holds the number 3",
        "{prd:#}"
    );
}

/// `--max-iter` met at a launch while an iteration still runs: the stop reason names the
/// stories open once that iteration has landed (it named the running story as open).
#[test]
fn the_max_iter_stop_names_the_stories_open_after_the_last_landing() {
    let par = Par::new(&simple_stories(4), &[]);
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 3000)]));
    let args = par.args_max(2, 2, &["--json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = par.env.ralph(&args);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let finished: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "run_finished")
        .expect("run_finished");
    assert_eq!(
        finished["stop_reason"]["open"],
        json!(["US-003", "US-004"]),
        "{finished:#}"
    );
    let status = par.env.ralph(&["status"]);
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains("US-003, US-004 open") && !said.contains("US-002, US-003"),
        "{said}"
    );
}

/// Two stories on one file: US-002 (after US-001) rewrites `shared.txt` and so undoes US-001,
/// whose check then fails on the branch. With `stories` more open, the run stops at `--max-iter
/// 2` before every story passes.
fn undone_by_a_later_story(open_after: usize) -> Par {
    let mut stories = vec![
        crate::common::par::story(1, "grep -q 'line from US-001' shared.txt", &[]),
        crate::common::par::story(2, "grep -q 'line from US-002' shared.txt", &["US-001"]),
    ];
    for i in 3..3 + open_after {
        stories.push(crate::common::par::story(
            i,
            &format!("test -f file-{i}.txt"),
            &["US-002"],
        ));
    }
    let par = Par::new(
        &crate::common::par::prd_of(stories),
        &[("shared.txt", "base\n")],
    );
    par.story(
        "US-001",
        json!([does("US-001", "shared.txt", "base\nline from US-001\n", 0)]),
    );
    par.story(
        "US-002",
        json!([does("US-002", "shared.txt", "base\nline from US-002\n", 0)]),
    );
    par
}

/// A `--max-iter` stop is no "complete", yet every story may pass by then: the final check runs
/// there too, so a story a later landing undid is set back and named, never left passing while
/// its check fails on the branch (a tester's false completion: "0 of 2 stories open", both
/// passing, US-001's check failing).
#[test]
fn a_max_iter_stop_rechecks_a_story_a_later_landing_undid() {
    let par = undone_by_a_later_story(0);
    let args = par.args_max(2, 2, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = par.env.ralph(&args);
    let said = text(&out);
    let prd = par.env.prd();
    assert_eq!(prd["userStories"][0]["passes"], false, "{said}");
    assert_eq!(prd["userStories"][1]["passes"], true, "{said}");
    assert!(
        said.contains("final check") && said.contains("1 of 2 stories open"),
        "{said}"
    );
    assert_ne!(out.status.code(), Some(0), "{said}");
}

/// The same for a serial run that stops at `--max-iter` with a story still open: the story the
/// later iteration undid is set back too.
#[test]
fn a_serial_max_iter_stop_with_stories_open_rechecks_an_undone_story() {
    let par = undone_by_a_later_story(1);
    let args = par.args_max(1, 2, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = par.env.ralph(&args);
    let said = text(&out);
    let prd = par.env.prd();
    assert_eq!(prd["userStories"][0]["passes"], false, "{said}");
    assert!(said.contains("2 of 3 stories open"), "{said}");
}
