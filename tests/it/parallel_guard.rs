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
    assert_eq!(
        par.env
            .git(&["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1,
        "a worktree is left"
    );
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
        par.env
            .git(&["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
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
