//! The final check (run/final_check.rs): a run never says "complete" while a story's check fails
//! on the finished tree because a later story undid its work (a tester's case: two stories
//! writing one file, the second landing last).

use serde_json::json;
use serde_json::Value;

use crate::common::par::{does, prd_of, story, Par, BRANCH};
use crate::common::text;

/// US-001 writes `one` into shared.txt and checks for it; US-002 writes `two` there (after
/// US-001 landed) and checks for that. US-001's second attempt keeps both lines when `fixes`.
fn undone(fixes: bool) -> Par {
    let par = Par::new(
        &prd_of(vec![
            story(1, "grep -q '^one$' shared.txt", &[]),
            story(2, "grep -q '^two$' shared.txt", &[]),
        ]),
        &[],
    );
    let retry = if fixes { "one\ntwo\n" } else { "one\n" };
    par.story(
        "US-001",
        json!([
            does("US-001", "shared.txt", "one\n", 0),
            does("US-001", "shared.txt", retry, 0)
        ]),
    );
    par.story("US-002", json!([does("US-002", "shared.txt", "two\n", 0)]));
    // In a parallel run US-002 writes only once US-001 landed (its first attempt then
    // conflicts, its second lands on top).
    par.wait("US-002", 0, &par.landed("shared.txt"));
    par
}

fn outcomes(par: &Par) -> Vec<(String, String)> {
    par.env
        .ledger()
        .iter()
        .map(|r| {
            (
                r["story_id"].as_str().unwrap_or_default().to_owned(),
                r["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn check_reopened_and_fixed(parallel: u32) {
    let par = undone(true);
    let out = par.run(parallel, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("final check: US-001's check")
            && shown.contains("fails on the finished tree")
            && shown.contains("US-002 changed shared.txt"),
        "the reopening is not said:\n{shown}"
    );
    // US-001 passed, was undone by US-002, reopened, and passed again with both lines.
    let passes: Vec<String> = outcomes(&par)
        .into_iter()
        .filter(|(_, o)| o == "story_passed")
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        passes.iter().filter(|s| *s == "US-001").count(),
        2,
        "{passes:?}"
    );
    assert_eq!(par.on_branch("shared.txt"), "one\ntwo\n");
    // Its retry was told why.
    let retry = par.prompt("US-001", 1);
    assert!(
        retry.contains("its check fails now that US-002 changed shared.txt"),
        "the retry's prompt does not say why:\n{retry}"
    );
    // ralph committed the reopening, naming it.
    let log = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(log.contains("ralph: final check reopens US-001"), "{log}");
    let prd: Value = serde_json::from_str(&par.on_branch("prd.json")).expect("prd.json");
    for s in prd["userStories"].as_array().expect("stories") {
        assert_eq!(s["passes"], true, "{s}");
    }
}

#[test]
fn a_story_undone_by_a_later_one_is_reopened_before_the_run_says_complete() {
    check_reopened_and_fixed(1);
}

#[test]
fn a_story_undone_by_a_later_one_is_reopened_before_a_parallel_run_says_complete() {
    check_reopened_and_fixed(2);
}

#[test]
fn stories_that_keep_undoing_each_other_end_blocked_not_complete() {
    let par = undone(false);
    let out = par.run(1, &["--max-attempts", "2"]);
    let shown = text(&out);
    assert_ne!(out.status.code(), Some(0), "{shown}");
    assert!(
        !shown.contains("complete: every story passes"),
        "a run whose stories undo each other said complete:\n{shown}"
    );
    // The file says one thing; the story that needs the other does not pass.
    let prd: Value = serde_json::from_str(&par.on_branch("prd.json")).expect("prd.json");
    let passing: Vec<&str> = prd["userStories"]
        .as_array()
        .expect("stories")
        .iter()
        .filter(|s| s["passes"] == true)
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert!(
        passing.len() < 2,
        "both pass on {:?}",
        par.on_branch("shared.txt")
    );
}
