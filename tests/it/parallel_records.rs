//! What a `--parallel` run records and shows about each iteration (issue 20, hB2): an agent
//! that deletes its own worktree ran (its real time, one line saying what was kept, no "could
//! not run"); `ralph show N` lists only iteration N's own commits and files.

use serde_json::json;

use crate::common::par::{does, simple_stories, Par, BRANCH};
use crate::common::text;

/// US-001's first attempt works 1.2 s, commits, then deletes its own worktree (`rm -rf`);
/// its later attempts do the work and stay.
fn deleting_agent(par: &Par) {
    par.story(
        "US-001",
        json!([
            does("US-001", "file-1.txt", "1\n", 1200),
            does("US-001", "file-1.txt", "1\n", 0)
        ]),
    );
    par.post("US-001", 0, "W=$PWD\ncd /\nrm -rf \"$W\"\n");
}

#[test]
fn an_agent_that_deletes_its_worktree_ran_and_says_so_once() {
    let par = Par::new(&simple_stories(1), &[]);
    deleting_agent(&par);
    let out = par.run(2, &[]);
    let all = text(&out);
    assert!(
        !all.contains("could not run"),
        "the iteration ran; it is not 'could not run': {all}"
    );
    assert!(
        !all.contains("cannot restore"),
        "no error about a file in a directory that no longer exists: {all}"
    );
    let first = &par.records("US-001")[0];
    assert!(
        first["duration_s"].as_f64().unwrap_or(0.0) >= 1.0,
        "the record keeps the agent's time (it worked 1.2 s): {first:#}"
    );
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was deleted while the agent ran")
            && message.contains("refs/ralph/salvage/")
            && !message.contains("cannot restore"),
        "{first:#}"
    );
    let said = all
        .matches("US-001-1 was deleted while the agent ran")
        .count();
    assert_eq!(said, 1, "said once, not {said} times: {all}");
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n");
}

#[test]
fn show_lists_only_the_iterations_own_files_not_another_landing() {
    let par = Par::new(&simple_stories(2), &[]);
    deleting_agent(&par);
    // US-001's first attempt ends only once US-002 has landed: the run branch then holds
    // US-002's files, which are not US-001's.
    par.wait("US-001", 0, &par.landed("file-2.txt"));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = &par.records("US-001")[0];
    assert_eq!(first["outcome"], "agent_error", "{first:#}");
    let n = first["iteration"].as_u64().expect("a number").to_string();
    let shown = par.env.ralph(&["show", &n, "--no-pager"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("files changed"),
        "show lists the record's files: {shown}"
    );
    for other in ["file-2.txt", "feat: US-002"] {
        assert!(
            !shown.contains(other),
            "`ralph show {n}` (US-001, nothing landed) lists US-002's {other}: {shown}"
        );
    }
    let second = &par.records("US-002")[0];
    let m = second["iteration"].as_u64().expect("a number").to_string();
    let shown = par.env.ralph(&["show", &m, "--no-pager"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("file-2.txt"), "{shown}");
    assert!(!shown.contains("file-1.txt"), "{shown}");
}

#[test]
fn allow_dirty_keeps_the_users_prd_and_progress_edits_uncommitted() {
    let par = Par::new(&simple_stories(2), &[("progress.txt", "# progress\n")]);
    for id in ["US-001", "US-002"] {
        let n = &id[5..];
        par.story(id, json!([does(id, &format!("file-{n}.txt"), "x\n", 0)]));
    }
    // The user's uncommitted edits: another story's description, a line of progress.txt.
    let prd_path = par.env.repo.join("prd.json");
    let prd = std::fs::read_to_string(&prd_path).expect("prd.json");
    let edited = prd.replacen("As a user I want feature 2", "USER EDIT of story 2", 1);
    assert_ne!(prd, edited, "the PRD has story 2's description");
    std::fs::write(&prd_path, &edited).expect("write prd.json");
    par.env.write("progress.txt", "# progress\nmy own line\n");
    let out = par.run(2, &["--allow-dirty"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let committed = par.show(BRANCH, "prd.json");
    let doc: serde_json::Value = serde_json::from_str(&committed).expect("valid JSON");
    assert!(
        doc["userStories"]
            .as_array()
            .is_some_and(|a| a.iter().all(|s| s["passes"] == true)),
        "the run branch has the passes: {committed}"
    );
    assert!(
        !committed.contains("USER EDIT"),
        "the user's uncommitted prd.json edit was committed: {committed}"
    );
    let progress = par.show(BRANCH, "progress.txt");
    assert!(
        !progress.contains("my own line") && progress.contains("US-001"),
        "progress.txt on the branch: ralph's entries, not the user's line: {progress}"
    );
    let working = std::fs::read_to_string(&prd_path).expect("prd.json");
    assert!(working.contains("USER EDIT of story 2"), "{working}");
    let working = std::fs::read_to_string(par.env.repo.join("progress.txt")).expect("progress");
    assert!(
        working.contains("my own line") && working.contains("US-002"),
        "{working}"
    );
    let status = par
        .env
        .git(&["status", "--porcelain", "prd.json", "progress.txt"]);
    assert!(
        status.contains(" M prd.json") && status.contains(" M progress.txt"),
        "the user's edits are unstaged changes: {status}"
    );
}

/// US-002's agent commits in the user's checkout (`git -C`) while US-001's agent, which
/// deleted its own worktree, also ran: the commit is named as made in the checkout by US-002's
/// iteration, kept apart (`checkout-commits`), never under US-001's salvage ref nor as its next
/// start, and `ralph show` of US-001's iteration does not list it.
#[test]
fn a_commit_made_in_the_checkout_is_named_by_its_iteration_not_salvaged_as_a_story() {
    let par = Par::new(&simple_stories(2), &[]);
    deleting_agent(&par);
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    let main = par.env.repo.display().to_string();
    par.pre(
        "US-002",
        0,
        &format!(
            "echo side > '{main}/side.txt'\ngit -C '{main}' add side.txt\ngit -C '{main}' commit -q -m 'agent: side file'\n"
        ),
    );
    // US-001 ends (its worktree deleted) only once US-002 has landed.
    par.wait("US-001", 0, &par.landed("file-2.txt"));
    let out = par.run(2, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let side = par
        .env
        .git(&["log", "--format=%H", "--grep", "agent: side file", "--all"]);
    let side = side.trim().to_owned();
    assert!(
        !side.is_empty(),
        "the agent's commit is kept by no ref: {all}"
    );
    let second = &par.records("US-002")[0];
    let n = second["iteration"].as_u64().expect("a number");
    let said = crate::common::par::findings(second);
    assert!(
        said.contains(&format!("made by the agent of iteration {n}"))
            && said.contains("checkout-commits"),
        "the finding names the iteration that made it: {said}"
    );
    for r in par.salvage_refs().iter().filter(|r| r.contains("/US-")) {
        let history = par.env.git(&["log", "--format=%H", r]);
        assert!(
            !history.lines().any(|c| c == side),
            "{r} (a story's salvage) holds the checkout commit\n{all}"
        );
    }
    let first = &par.records("US-001")[0];
    let message = first["message"].as_str().unwrap_or_default();
    assert!(!message.contains(&side[..8]), "{message}");
    let m = first["iteration"].as_u64().expect("a number").to_string();
    let shown = par.env.ralph(&["show", &m, "--no-pager"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        !shown.contains("side.txt") && !shown.contains("agent: side file"),
        "`ralph show {m}` lists the checkout commit: {shown}"
    );
}

/// The iteration whose agent deleted its worktree keeps its transcript and prompt copy: a
/// `--parallel` worker writes them straight into the main checkout's `.ralph/runs/<run>/`, so
/// `ralph show N` has the agent's section, `--raw` prints what it printed, and `log` and
/// `report` name the iteration (issue 20, tester 6).
#[test]
fn an_agent_that_deletes_its_worktree_keeps_its_transcript_and_prompt() {
    let par = Par::new(&simple_stories(1), &[]);
    deleting_agent(&par);
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = &par.records("US-001")[0];
    let n = first["iteration"].as_u64().expect("a number");
    let run = first["run_id"].as_str().expect("a run id");
    let dir = par.env.repo.join(".ralph/runs").join(run);
    for file in [
        format!("iter-{n:03}.jsonl"),
        format!("iter-{n:03}.prompt.md"),
    ] {
        assert!(
            dir.join(&file).is_file(),
            "{file} is in {} although the worktree was deleted",
            dir.display()
        );
    }
    assert_eq!(
        first["transcript"].as_str(),
        Some(format!(".ralph/runs/{run}/iter-{n:03}.jsonl").as_str()),
        "{first:#}"
    );
    let n = n.to_string();
    let shown = text(&par.env.ralph(&["show", &n, "--no-pager"]));
    assert!(
        shown.lines().any(|l| l == "agent"),
        "`ralph show {n}` has the agent's section: {shown}"
    );
    let raw = par.env.ralph(&["show", &n, "--raw", "--no-pager"]);
    let raw_text = text(&raw);
    assert!(
        raw.status.success() && !raw_text.contains("has no transcript"),
        "`ralph show {n} --raw` prints the transcript: {raw_text}"
    );
    let log = par.env.ralph(&["log"]);
    assert!(
        log.status.success() && text(&log).contains("US-001"),
        "ralph log: {}",
        text(&log)
    );
    let report = par.env.ralph(&["report"]);
    let html = String::from_utf8_lossy(&report.stdout).trim().to_string();
    let html = std::fs::read_to_string(&html).unwrap_or_default();
    assert!(
        report.status.success() && html.contains("US-001"),
        "ralph report: {}",
        text(&report)
    );
}
