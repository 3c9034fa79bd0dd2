//! The PRD linter through `ralph validate`: one test per rule, each with a prd.json that passes
//! and one that fails, plus `--strict` turning findings into errors and the human output.

use serde_json::{json, Value};

use crate::common::{text, TestEnv};

/// A clean two-story PRD: no rule fires on it.
fn clean() -> Value {
    json!({
        "project": "Demo",
        "branchName": "ralph/demo",
        "description": "A demo.",
        "userStories": [
            {"id": "US-001", "title": "Add slugify",
             "description": "As a writer, I want slugify(text) so that I can build URLs.",
             "acceptanceCriteria": ["slugify(\"A b\") == \"a-b\"", "Tests pass"],
             "priority": 1, "passes": false, "notes": ""},
            {"id": "US-002", "title": "Add word_count",
             "description": "As a writer, I want word_count(text) so that I can check a draft.",
             "acceptanceCriteria": ["word_count(\"a b\") == 2", "Tests pass"],
             "priority": 2, "passes": false, "notes": "", "dependsOn": ["US-001"]}
        ]
    })
}

/// `(jsonPath, rule)` of every warning `ralph validate --json` reports for `prd` in a fresh
/// repository; `setup` runs first (to make the PRD less than brand-new, say).
fn findings_with(prd: &Value, setup: impl Fn(&TestEnv)) -> Vec<(String, String)> {
    let env = TestEnv::new(prd);
    setup(&env);
    let out = env.ralph(&["validate", "--json"]);
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["jsonPath"].as_str().unwrap().to_string(),
                w["rule"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn findings(prd: &Value) -> Vec<(String, String)> {
    findings_with(prd, |_| {})
}

fn one(path: &str, rule: &str) -> Vec<(String, String)> {
    vec![(path.to_string(), rule.to_string())]
}

#[test]
fn the_clean_prd_has_no_findings() {
    assert_eq!(findings(&clean()), []);
}

#[test]
fn vague_criteria() {
    let mut prd = clean();
    prd["userStories"][1]["acceptanceCriteria"][0] = json!("The counter handles edge cases");
    assert_eq!(
        findings(&prd),
        one("$.userStories[1].acceptanceCriteria[0]", "vague-criterion")
    );
    // "as expected", "good UX", "works correctly" too; "is faster than 2 s" is checkable.
    for vague in ["Output is as expected", "Good UX", "It works correctly"] {
        prd["userStories"][1]["acceptanceCriteria"][0] = json!(vague);
        assert_eq!(findings(&prd).len(), 1, "{vague}");
    }
    prd["userStories"][1]["acceptanceCriteria"][0] = json!("The page is faster than 2 s");
    assert_eq!(findings(&prd), []);
}

#[test]
fn a_story_without_a_checkable_criterion_or_verify() {
    let mut prd = clean();
    prd["userStories"][0]["acceptanceCriteria"] = json!(["Works as expected"]);
    assert_eq!(
        findings(&prd),
        [
            (
                "$.userStories[0].acceptanceCriteria[0]".to_string(),
                "vague-criterion".to_string()
            ),
            (
                "$.userStories[0]".to_string(),
                "no-checkable-criterion".to_string()
            )
        ]
    );
    prd["userStories"][0]["acceptanceCriteria"] = json!([]);
    assert_eq!(
        findings(&prd),
        one("$.userStories[0]", "no-checkable-criterion")
    );
    // A verify command is a check of its own.
    prd["userStories"][0]["verify"] = json!("python3 -m unittest -q");
    assert_eq!(findings(&prd), []);
}

#[test]
fn descriptions_too_long_for_one_iteration() {
    let mut prd = clean();
    prd["userStories"][0]["description"] =
        json!("As a writer, I want slugify. It lowers case. It drops accents. It joins words.");
    assert_eq!(
        findings(&prd),
        one("$.userStories[0].description", "long-description")
    );
    prd["userStories"][0]["description"] = json!("word ".repeat(81));
    assert_eq!(
        findings(&prd),
        one("$.userStories[0].description", "long-description")
    );
    prd["userStories"][0]["description"] =
        json!("As a writer, I want slugify. It lowers case and drops accents.");
    assert_eq!(findings(&prd), []);
}

#[test]
fn more_than_eight_criteria() {
    let mut prd = clean();
    let nine: Vec<String> = (1..=9)
        .map(|i| format!("slugify(\"{i}\") == \"{i}\""))
        .collect();
    prd["userStories"][0]["acceptanceCriteria"] = json!(nine);
    assert_eq!(
        findings(&prd),
        one("$.userStories[0].acceptanceCriteria", "too-many-criteria")
    );
    prd["userStories"][0]["acceptanceCriteria"] = json!(nine[..8]);
    assert_eq!(findings(&prd), []);
}

#[test]
fn depends_on_a_later_priority() {
    let mut prd = clean();
    prd["userStories"][0]["dependsOn"] = json!(["US-002"]);
    prd["userStories"][1]["dependsOn"] = json!([]);
    assert_eq!(
        findings(&prd),
        one("$.userStories[0].dependsOn[0]", "depends-on-later")
    );
    prd["userStories"][0]["priority"] = json!(3);
    assert_eq!(findings(&prd), []);
}

#[test]
fn duplicate_titles() {
    let mut prd = clean();
    prd["userStories"][1]["title"] = json!("add  SLUGIFY");
    assert_eq!(
        findings(&prd),
        one("$.userStories[1].title", "duplicate-title")
    );
}

#[test]
fn a_brand_new_prd_with_stories_already_passing() {
    let mut prd = clean();
    prd["userStories"][0]["passes"] = json!(true);
    assert_eq!(
        findings(&prd),
        one("$.userStories[0].passes", "new-prd-passing")
    );
    // Once a run has recorded progress, a passing story is just done work.
    let progressed = findings_with(&prd, |env| {
        env.write(
            "progress.txt",
            "# Ralph Progress Log\nStarted: x\n---\n\n## 2026-01-01 - US-001\n- did it\n",
        );
    });
    assert_eq!(progressed, []);
}

#[test]
fn a_branch_name_git_refuses() {
    let mut prd = clean();
    for bad in [
        "ralph/my feature",
        "ralph/x..y",
        "ralph/x.lock",
        "-x",
        "ralph/",
    ] {
        prd["branchName"] = json!(bad);
        assert_eq!(
            findings(&prd),
            one("$.branchName", "bad-branch-name"),
            "{bad}"
        );
    }
    prd["branchName"] = json!("ralph/my-feature_2");
    assert_eq!(findings(&prd), []);
}

#[test]
fn strict_makes_findings_errors_and_humans_see_warnings() {
    let mut prd = clean();
    prd["userStories"][1]["acceptanceCriteria"][0] = json!("It works correctly");
    let env = TestEnv::new(&prd);
    let out = env.ralph(&["validate"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "warning: prd.json: $.userStories[1].acceptanceCriteria[0]: vague criterion \"It \
             works correctly\": \"works correctly\" cannot be checked [vague-criterion]\n  hint: \
             say what to observe"
        ),
        "{stderr}"
    );
    let out = env.ralph(&["validate", "--strict"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("✗ prd.json has 1 lint finding (--strict makes them errors):\n"),
        "{stderr}"
    );
    let out = env.ralph(&["validate", "--strict", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert_eq!(report["violations"], json!([]));
    assert_eq!(report["warnings"][0]["rule"], "vague-criterion");
}

#[test]
fn stories_still_as_ralph_init_wrote_them() {
    let starter: Value = serde_json::from_str(include_str!("../../templates/prd.json")).unwrap();
    let got = findings(&starter);
    for path in ["$.userStories[0]", "$.userStories[1]"] {
        assert!(
            got.contains(&(path.to_string(), "starter-story".to_string())),
            "{got:?}"
        );
    }
    // Edited (a new title), a story is the user's own.
    let mut own = starter.clone();
    own["userStories"][0]["title"] = json!("Add the invoices table");
    own["userStories"][1]["title"] = json!("List invoices on the dashboard");
    assert!(
        !findings(&own)
            .iter()
            .any(|(_, rule)| rule == "starter-story"),
        "{:?}",
        findings(&own)
    );
    // `ralph run` says so before it spends anything on them.
    let env = TestEnv::new(&starter);
    env.script(&json!({"default": [{"claude_init": {}}, {"claude_result": {"text": "ok"}}]}));
    let out = env.ralph(&["run", "--max-iter", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("US-001 is still the example story `ralph init` wrote"),
        "{stderr}"
    );
}
