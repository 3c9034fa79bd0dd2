//! `ralph validate` on the prd.json variants of case 26 (tests/fixtures/prd/), plus
//! `set_passes` on the BOM and CRLF fixtures.

use std::path::PathBuf;

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/prd")
        .join(name)
}

fn ralph() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ralph"));
    cmd.env("NO_COLOR", "1");
    cmd
}

/// Runs `ralph validate <fixture>`, asserts exit 1, and returns stderr.
fn rejected(name: &str) -> String {
    let out = ralph()
        .arg("validate")
        .arg(fixture(name))
        .assert()
        .code(1)
        .stdout("")
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(name),
        "stderr should name the file:\n{stderr}"
    );
    assert!(
        stderr.contains("hint: "),
        "stderr should say how to fix it:\n{stderr}"
    );
    stderr
}

/// Runs `ralph validate --json <fixture>` and returns the parsed report.
fn json_report(name: &str, code: i32) -> Value {
    let out = ralph()
        .args(["validate", "--json"])
        .arg(fixture(name))
        .assert()
        .code(code)
        .get_output()
        .clone();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn json_paths(report: &Value) -> Vec<String> {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["jsonPath"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn valid_prd_reports_story_counts() {
    ralph()
        .arg("validate")
        .arg(fixture("valid.json"))
        .assert()
        .success()
        .stdout(predicate::str::ends_with(
            "valid.json is valid: 2 stories (1 passing)\n",
        ))
        .stdout(predicate::str::starts_with("✓ "));
}

#[test]
fn bom_and_crlf_are_accepted() {
    for name in ["bom.json", "crlf.json", "bom-crlf.json"] {
        ralph()
            .arg("validate")
            .arg(fixture(name))
            .assert()
            .success()
            .stdout(predicate::str::contains("is valid: 2 stories (1 passing)"));
    }
}

#[test]
fn not_json_names_line_and_column() {
    let stderr = rejected("not-json.json");
    assert!(
        stderr.contains("not-json.json:4:35: not valid JSON: trailing comma"),
        "{stderr}"
    );
}

#[test]
fn top_level_array_is_refused_at_the_root() {
    let stderr = rejected("array.json");
    assert!(
        stderr.contains("array.json: $: expected an object, got an array"),
        "{stderr}"
    );
}

#[test]
fn story_without_id_names_its_path() {
    let stderr = rejected("missing-id.json");
    assert!(
        stderr.contains("$.userStories[1].id: required field `id` is missing"),
        "{stderr}"
    );
}

#[test]
fn duplicate_ids_name_both_stories() {
    let stderr = rejected("duplicate-id.json");
    assert!(
        stderr.contains(
            "$.userStories[1].id: duplicate id \"US-001\", already used by $.userStories[0]"
        ),
        "{stderr}"
    );
}

#[test]
fn priority_as_string_is_refused() {
    let stderr = rejected("priority-string.json");
    assert!(
        stderr.contains(
            "priority-string.json: $.userStories[2].priority: expected an integer, got \"high\"\n  \
             hint: set `priority` to a whole number"
        ),
        "{stderr}"
    );
}

#[test]
fn missing_passes_is_refused() {
    let stderr = rejected("passes-missing.json");
    assert!(
        stderr.contains("$.userStories[0].passes: required field `passes` is missing"),
        "{stderr}"
    );
}

#[test]
fn unknown_dependency_is_refused() {
    let stderr = rejected("depends-unknown.json");
    assert!(
        stderr.contains("$.userStories[1].dependsOn[1]: unknown story id \"US-009\""),
        "{stderr}"
    );
}

#[test]
fn dependency_cycle_is_refused() {
    let stderr = rejected("cycle.json");
    assert!(
        stderr.contains(
            "$.userStories[0].dependsOn: dependency cycle: US-001 → US-003 → US-002 → US-001"
        ),
        "{stderr}"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let stderr = rejected("many-problems.json");
    assert!(stderr.contains("(7 problems)"), "{stderr}");
    // The blank id is not offered as a known id.
    assert!(stderr.contains("(known ids: US-001)\n"), "{stderr}");
    let report = json_report("many-problems.json", 1);
    assert_eq!(report["valid"], Value::Bool(false));
    assert_eq!(
        json_paths(&report),
        [
            "$.project",
            "$.userStories[0].acceptanceCriteria",
            "$.userStories[0].passes",
            "$.userStories[1].id",
            "$.userStories[2].title",
            "$.userStories[2].id",
            "$.userStories[2].dependsOn[0]",
        ]
    );
}

#[test]
fn json_report_shapes() {
    let report = json_report("valid.json", 0);
    assert_eq!(report["valid"], Value::Bool(true));
    assert_eq!(report["violations"], serde_json::json!([]));
    let path = PathBuf::from(report["path"].as_str().unwrap());
    assert!(path.is_absolute() && path.ends_with("tests/fixtures/prd/valid.json"));

    let report = json_report("priority-string.json", 1);
    let violation = &report["violations"][0];
    assert_eq!(violation["jsonPath"], "$.userStories[2].priority");
    assert_eq!(violation["message"], "expected an integer, got \"high\"");
    assert!(violation["hint"].as_str().unwrap().contains("whole number"));

    let report = json_report("not-json.json", 1);
    assert_eq!(json_paths(&report), ["$"]);
}

#[test]
fn missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    ralph()
        .arg("validate")
        .current_dir(dir.path())
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("cannot read prd.json"))
        .stderr(predicate::str::contains("ralph init"));
}

#[test]
fn set_passes_keeps_bom_and_crlf_bytes() {
    for name in ["valid.json", "bom-crlf.json"] {
        let raw = std::fs::read(fixture(name)).unwrap();
        let edited = ralph::prd::store::set_passes(&raw, "US-002", true).unwrap();
        let text = String::from_utf8(raw.clone()).unwrap();
        let needle = "\"passes\": false,";
        assert_eq!(text.matches(needle).count(), 1);
        let expected = text.replacen(needle, "\"passes\": true,", 1);
        assert_eq!(String::from_utf8(edited.clone()).unwrap(), expected);
        let loaded = ralph::prd::store::parse_bytes(&fixture(name), &edited).unwrap();
        assert!(loaded.prd.all_pass());
    }
}
