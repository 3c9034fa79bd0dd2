//! `ralph run --parallel N --resolve-conflicts` (issue 20, "Landing"): a landing that conflicts
//! gets an iteration of its own in which an agent resolves the conflict; ralph lands the result
//! only when no marker remains, every modify/delete conflict is named, no other file changed
//! and the story's check passes on it.
//!
//! The scenario: US-001 and US-002 start from the same tip and write the same line of
//! `shared.txt`; US-001 lands first, US-002's landing conflicts (its attempt 0). Its resolution
//! is US-002's agent's attempt 1 (the scripted agent keys on the prompt's `Story ID:`); when it
//! is refused, attempt 2 redoes the story on the tip. Real git, scripted exec agents
//! (tests/it/common/par.rs).

use std::process::Output;

use serde_json::{json, Value};

use crate::common::par::{does, landing_kind, prd_of, story, Par, BRANCH};
use crate::common::text;

/// The two conflicting stories with `shared.txt` and an untouched `other.txt`; US-002's check
/// is `check_b`, its resolution (attempt 1) plays `resolver` after the shell step `pre` (run in
/// the resolution's worktree), its attempt 2 redoes the story on the tip.
fn conflicting(check_b: &str, resolver: Value, pre: Option<&str>) -> Par {
    let par = Par::new(
        &prd_of(vec![
            story(1, "grep -q A shared.txt", &[]),
            story(2, check_b, &[]),
        ]),
        &[
            ("shared.txt", "original line\n"),
            ("other.txt", "nobody's\n"),
        ],
    );
    par.story(
        "US-001",
        json!([does("US-001", "shared.txt", "A's line\n", 100)]),
    );
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            resolver,
            does("US-002", "shared.txt", "A's line\nB's line\n", 0)
        ]),
    );
    if let Some(pre) = pre {
        par.pre("US-002", 1, pre);
    }
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait(
        "US-002",
        0,
        &format!(
            "git -C '{}' show '{BRANCH}:shared.txt' 2>/dev/null | grep -q \"A's line\"",
            par.env.repo.display()
        ),
    );
    par
}

/// US-002's records: the conflict, then its resolution; with the conflict's iteration number.
fn conflict_then_resolution(par: &Par, out: &Output) -> (Value, Value, u64) {
    let b = par.records("US-002");
    assert!(b.len() >= 2, "{b:#?}\n{}", text(out));
    assert_eq!(b[0]["outcome"], "conflict", "{:#}", b[0]);
    assert_eq!(landing_kind(&b[0]), "conflict", "{:#}", b[0]);
    let n = b[0]["iteration"].as_u64().expect("an iteration");
    assert_eq!(b[1]["landing"]["resolves"], n, "{:#}", b[1]);
    assert!(b[1]["iteration"].as_u64() > Some(n), "{:#}", b[1]);
    // The resolution's prompt names the file, both sides and the rules.
    let prompt = par.prompt("US-002", 1);
    for needle in [
        "resolve",
        "shared.txt",
        "The run branch's side",
        "The story's side",
        "Resolved <path>: kept",
        &format!("iteration {n}"),
    ] {
        assert!(
            prompt.contains(needle),
            "no {needle:?} in the resolution's prompt:\n{prompt}"
        );
    }
    (b[0].clone(), b[1].clone(), n)
}

/// A refused resolution: nothing of it landed, the story's salvage ref is named, the branch
/// has no marker and a clean index, and the story's next attempt redid it on the tip.
fn assert_refused(par: &Par, out: &Output, why: &str) {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    let (conflict, resolution, _) = conflict_then_resolution(par, out);
    assert_eq!(resolution["outcome"], "conflict", "{resolution:#}");
    assert_eq!(landing_kind(&resolution), "conflict", "{resolution:#}");
    assert!(resolution["landing"]["commit"].is_null(), "{resolution:#}");
    let message = resolution["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("refused") && message.contains(why),
        "{message}"
    );
    let salvage = conflict["landing"]["salvage_ref"]
        .as_str()
        .expect("a salvage ref");
    assert_eq!(
        resolution["landing"]["salvage_ref"], salvage,
        "{resolution:#}"
    );
    assert!(message.contains(salvage), "{message}");
    assert_eq!(par.show(salvage, "shared.txt"), "B's line\n");
    assert_eq!(par.on_branch("other.txt"), "nobody's\n");
    assert!(!par
        .env
        .git(&["log", "--format=%s", BRANCH])
        .contains("to resolve"));
    // The story went on as after any conflict: its next attempt passed from the tip.
    let b = par.records("US-002");
    assert_eq!(b.len(), 3, "{b:#?}");
    assert_eq!(b[2]["outcome"], "story_passed", "{:#}", b[2]);
    assert_eq!(par.on_branch("shared.txt"), "A's line\nB's line\n");
    assert_eq!(par.env.git(&["diff", "--cached", "--name-only"]), "");
    par.assert_tidy(out);
}

#[test]
fn a_resolved_conflict_lands_both_stories_with_both_changes() {
    let par = conflicting(
        "grep -q B shared.txt",
        json!([
            {"stdout": "resolving"},
            {"write_file": {"path": "shared.txt", "content": "A's line\nB's line\n"}},
            {"git_commit": "resolve shared.txt"}
        ]),
        None,
    );
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("(conflicts: resolved by an agent, then checked)"),
        "the header does not say conflicts are resolved:\n{}",
        text(&out)
    );
    let (_, resolution, n) = conflict_then_resolution(&par, &out);
    assert_eq!(resolution["outcome"], "story_passed", "{resolution:#}");
    assert_eq!(landing_kind(&resolution), "resolution", "{resolution:#}");
    let verify = resolution["verify"].as_array().cloned().unwrap_or_default();
    assert!(
        verify.iter().any(|v| v["passed"] == true),
        "no passed check on the result: {resolution:#}"
    );
    assert_eq!(par.calls("US-002"), 2, "no third attempt was needed");
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
    assert_eq!(par.on_branch("shared.txt"), "A's line\nB's line\n");
    // The landed history holds the story's own commit, not the commit with the markers.
    let log = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(log.contains("feat: US-002"), "{log}");
    assert!(!log.contains("to resolve"), "{log}");
    // What the user sees: the outcome line and `ralph show` name what it resolved.
    let said = text(&out);
    assert!(
        said.contains(&format!("resolved iteration {n}'s conflict")),
        "{said}"
    );
    let iteration = resolution["iteration"].to_string();
    let show = text(&par.env.ralph(&["show", &iteration]));
    assert!(
        show.contains("resolution") && show.contains(&format!("the conflict of iteration {n}")),
        "{show}"
    );
    let report = text(&par.env.ralph(&["report", "--markdown"]));
    assert!(
        report.contains(&format!(
            "resolution of iteration {n}'s conflict on shared.txt"
        )),
        "{report}"
    );
    par.assert_tidy(&out);
}

#[test]
fn a_resolution_that_leaves_markers_is_refused() {
    let par = conflicting(
        "grep -q B shared.txt",
        json!([{"stdout": "I give up"}]),
        None,
    );
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_refused(&par, &out, "conflict markers remain in shared.txt");
}

#[test]
fn a_resolution_that_changes_an_untouched_file_is_refused() {
    let par = conflicting(
        "grep -q B shared.txt",
        json!([
            {"write_file": {"path": "shared.txt", "content": "A's line\nB's line\n"}},
            {"write_file": {"path": "other.txt", "content": "mine now\n"}},
            {"git_commit": "resolve"}
        ]),
        None,
    );
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_refused(&par, &out, "neither side touched: other.txt");
}

#[test]
fn a_resolution_whose_check_fails_is_refused() {
    let par = conflicting(
        "grep -q B shared.txt",
        json!([
            {"write_file": {"path": "shared.txt", "content": "A's line\n"}},
            {"git_commit": "resolve: keep A's line"}
        ]),
        None,
    );
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_refused(&par, &out, "the story's check fails on it");
}

/// US-001 deletes `shared.txt`, US-002 changes it: a modify/delete conflict. The resolution
/// (US-002's attempt 1) plays `resolver`; attempt 2 redoes the story on the tip. ralph.toml
/// says `resolve_conflicts = true`.
fn modify_delete(resolver: Value) -> Par {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "grep -q B shared.txt", &[]),
        ]),
        &[
            ("shared.txt", "original line\n"),
            ("ralph.toml", "resolve_conflicts = true\n"),
        ],
    );
    par.pre("US-001", 0, "git rm -q shared.txt");
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 100)]));
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            resolver,
            does("US-002", "shared.txt", "B's line\n", 0)
        ]),
    );
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait("US-002", 0, &par.landed("file-1.txt"));
    par
}

#[test]
fn a_modify_delete_conflict_resolved_silently_is_refused() {
    // The resolution keeps US-002's file and says nothing about it.
    let par = modify_delete(json!([
        {"write_file": {"path": "shared.txt", "content": "B's line\nand more\n"}},
        {"git_commit": "resolve"}
    ]));
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (conflict, resolution, _) = conflict_then_resolution(&par, &out);
    assert_eq!(resolution["outcome"], "conflict", "{resolution:#}");
    let message = resolution["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("modify/delete conflict on shared.txt was resolved silently"),
        "{message}"
    );
    let salvage = conflict["landing"]["salvage_ref"]
        .as_str()
        .expect("a salvage ref");
    assert!(message.contains(salvage), "{message}");
    assert_eq!(resolution["landing"]["salvage_ref"], salvage);
    // Nothing of the resolution landed: the story's redo on the tip did.
    assert_eq!(par.on_branch("shared.txt"), "B's line\n");
    let b = par.records("US-002");
    assert_eq!(b.len(), 3, "{b:#?}");
    assert_eq!(b[2]["outcome"], "story_passed", "{:#}", b[2]);
    assert_eq!(par.env.git(&["diff", "--cached", "--name-only"]), "");
    par.assert_tidy(&out);
}

#[test]
fn a_modify_delete_conflict_named_in_the_commit_lands() {
    let par = modify_delete(json!([
        {"write_file": {"path": "shared.txt", "content": "B's line\nkept\n"}},
        {"git_commit": "resolve the conflict\n\nResolved shared.txt: kept"}
    ]));
    // No flag: ralph.toml's `resolve_conflicts = true` turns it on.
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, resolution, _) = conflict_then_resolution(&par, &out);
    assert_eq!(resolution["outcome"], "story_passed", "{resolution:#}");
    assert_eq!(landing_kind(&resolution), "resolution", "{resolution:#}");
    assert_eq!(par.calls("US-002"), 2);
    assert_eq!(par.on_branch("shared.txt"), "B's line\nkept\n");
    assert!(par.branch_files().contains(&"file-1.txt".to_owned()));
    par.assert_tidy(&out);
}

#[test]
fn without_the_flag_a_conflict_gets_no_resolution_iteration() {
    let par = conflicting("grep -q B shared.txt", json!([{"stdout": "unused"}]), None);
    // Without --resolve-conflicts the story's attempt 1 is its redo on the tip.
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            does("US-002", "shared.txt", "A's line\nB's line\n", 0)
        ]),
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let b = par.records("US-002");
    assert_eq!(b.len(), 2, "{b:#?}");
    assert!(
        b.iter().all(|r| r["landing"]["resolves"].is_null()),
        "{b:#?}"
    );
    assert!(!par.prompt("US-002", 1).contains("Resolved <path>"));
    assert_eq!(b[1]["outcome"], "story_passed");
    par.assert_tidy(&out);
}

/// A serial run never lands one story over another's work, so `--resolve-conflicts` has nothing
/// to do there: the header says so instead of taking the flag silently.
#[test]
fn a_serial_run_says_resolve_conflicts_has_nothing_to_do() {
    let par = Par::new(
        &prd_of(vec![story(1, "grep -q A shared.txt", &[])]),
        &[("shared.txt", "original line\n")],
    );
    par.story(
        "US-001",
        json!([does("US-001", "shared.txt", "A's line\n", 0)]),
    );
    let out = par.run(1, &["--resolve-conflicts"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("--resolve-conflicts / resolve_conflicts has nothing to do (it takes --parallel N, N > 1)"),
        "{shown}"
    );
}

/// ralph SIGKILLed while a resolution's agent runs (it has committed a resolution of its own on
/// the commit with the markers and works on), then `ralph run` again: the interrupted
/// resolution is on record with its own work kept, the story's conflict salvage ref still holds
/// the story's work, numbering has no gap, no story passes unchecked, no marker and no commit
/// with the markers reaches the branch, no worktree is left, and the story ends passing (its
/// next attempt, from the tip).
#[test]
fn sigkill_during_a_resolution_then_restart_loses_nothing() {
    use std::time::{Duration, Instant};
    let par = conflicting("grep -q B shared.txt", json!([{"stdout": "unused"}]), None);
    // The resolution's agent (US-002's attempt 1) commits a resolution in a shell step, says so
    // and then waits for a file no one writes: ralph is killed there, before the fake agent
    // plays (so the next attempt plays the script's second invocation, the redo on the tip).
    let resolving = par.agents.join("resolving");
    par.pre(
        "US-002",
        1,
        &format!(
            "printf \"A's line\\nB's line\\n\" > shared.txt\n\
             git -c user.name=agent -c user.email=agent@example.com commit -qam 'resolve shared.txt'\n\
             touch '{}'",
            resolving.display()
        ),
    );
    par.wait(
        "US-002",
        1,
        &format!("test -f '{}'", par.agents.join("never").display()),
    );
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            does("US-002", "shared.txt", "A's line\nB's line\n", 0)
        ]),
    );
    let mut child = par.spawn(2, &["--resolve-conflicts"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !resolving.exists() {
        assert!(
            Instant::now() < deadline,
            "the resolution's agent never committed:\n{}",
            par.env.spawned_output()
        );
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "ralph ended ({status}) before the resolution ran:\n{}",
                par.env.spawned_output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        par.prompt("US-002", 1).contains("Resolved <path>"),
        "attempt 1 is no resolution:\n{}",
        par.prompt("US-002", 1)
    );
    crate::common::signal(&child, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let out = par.run(2, &["--resolve-conflicts"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        par.env.spawned_output()
    );
    let ledger = par.env.ledger();
    crate::common::par::assert_numbering(&ledger, "killed in a resolution");
    let b = par.records("US-002");
    assert!(b.len() >= 3, "{b:#?}\n{}", text(&out));
    // The conflict, its salvage ref with the story's own work, still there.
    assert_eq!(b[0]["outcome"], "conflict", "{:#}", b[0]);
    let salvage = b[0]["landing"]["salvage_ref"]
        .as_str()
        .expect("a salvage ref");
    assert_eq!(par.show(salvage, "shared.txt"), "B's line\n", "{salvage}");
    // The resolution: interrupted, its own commit kept under a ref of its own.
    let n = b[0]["iteration"].as_u64().expect("an iteration");
    let resolution = &b[1];
    assert_eq!(resolution["outcome"], "interrupted", "{resolution:#}");
    assert!(resolution["iteration"].as_u64() > Some(n), "{resolution:#}");
    let kept = resolution["landing"]["salvage_ref"]
        .as_str()
        .expect("the resolution's work is kept");
    assert_ne!(kept, salvage, "the resolution's work replaced the story's");
    assert_eq!(
        par.show(kept, "shared.txt"),
        "A's line\nB's line\n",
        "{kept}"
    );
    // The story ends passing, through a check on record.
    let last = b.last().expect("a record");
    assert_eq!(last["outcome"], "story_passed", "{b:#?}");
    assert!(
        last["verify"]
            .as_array()
            .is_some_and(|v| v.iter().any(|c| c["passed"] == true)),
        "{last:#}"
    );
    for s in par.env.prd()["userStories"].as_array().expect("stories") {
        assert_eq!(s["passes"], true, "{s}\n{}", text(&out));
    }
    assert_eq!(par.on_branch("shared.txt"), "A's line\nB's line\n");
    let log = par.env.git(&["log", "--format=%s%n%b", BRANCH]);
    assert!(
        !log.contains("This commit never lands") && !log.contains("to resolve"),
        "{log}"
    );
    par.assert_tidy(&out);
}
