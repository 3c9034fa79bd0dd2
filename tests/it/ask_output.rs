//! What an agent answers `ralph plan` and `ralph convert` with, read whole: an exec agent
//! (`--agent exec --agent-cmd …`, here small shell scripts) that pretty-prints its JSON over
//! many lines, prints log lines before it, fences it in ```` ```json ````, or echoes the prompt
//! (whose example reply has the same fields) first, still gets its document read; an agent that
//! answers with junk gets a clear failure: each problem with its JSON path and fix, the last
//! draft kept, no prd.json.

use std::path::PathBuf;
use std::process::{Output, Stdio};

use serde_json::{json, Value};

use crate::common::{text, TestEnv};

/// A clean conversion of the notes below: two stories, each with a check.
fn draft() -> Value {
    json!({
        "project": "notes",
        "branchName": "ralph/notes-export",
        "description": "Export notes as Markdown files.",
        "userStories": [
            {"id": "US-001", "title": "Export one note",
             "description": "As a user, I want `notes export 3` to write `note-3.md` so that I can keep a note.",
             "acceptanceCriteria": ["`notes export 3` writes `note-3.md`"],
             "priority": 1, "passes": false, "notes": "",
             "verify": "python3 -m unittest tests.test_export_one"},
            {"id": "US-002", "title": "Export all notes",
             "description": "As a user, I want `notes export --all` to write every note at once.",
             "acceptanceCriteria": ["`notes export --all` writes one `note-<id>.md` per note"],
             "priority": 2, "passes": false, "notes": "", "dependsOn": ["US-001"],
             "verify": "python3 -m unittest tests.test_export_all"}
        ]
    })
}

const NOTES: &str = "# Notes export\n\nWe need a way to get notes out of the app. First a single \
                     note, then all of them at once, as Markdown files.\n";

/// A repository with notes.md and no prd.json.
fn notes_env() -> TestEnv {
    let env = TestEnv::new(&json!({}));
    env.git(&["rm", "-q", "prd.json"]);
    env.write("notes.md", NOTES);
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "notes"]);
    env
}

/// Writes `body` as a shell script outside the repository (beside it) and returns the
/// `--agent-cmd` that runs it. `$DOC` in the body is a file holding `doc` pretty-printed.
fn agent_script(env: &TestEnv, name: &str, doc: &Value, body: &str) -> String {
    let dir = env.root.path();
    let doc_path = dir.join(format!("{name}.json"));
    std::fs::write(&doc_path, serde_json::to_string_pretty(doc).unwrap()).unwrap();
    let script: PathBuf = dir.join(format!("{name}.sh"));
    std::fs::write(&script, format!("DOC='{}'\n{body}\n", doc_path.display())).unwrap();
    format!("sh {}", script.display())
}

fn exec_convert(env: &TestEnv, agent_cmd: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "convert",
        "notes.md",
        "--agent",
        "exec",
        "--agent-cmd",
        agent_cmd,
    ];
    args.extend_from_slice(extra);
    env.ralph_cmd(&args).stdin(Stdio::null()).output().unwrap()
}

/// The stories of the prd.json written are the draft's, in order.
fn assert_converted(env: &TestEnv, out: &Output, what: &str) {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", text(out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "✓ wrote prd.json: 2 stories from notes.md (converted by the agent in 1 attempt)"
        ),
        "{what}: {}",
        text(out)
    );
    let prd = env.prd();
    let titles: Vec<&str> = prd["userStories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["Export one note", "Export all notes"], "{what}");
    assert_eq!(
        prd["userStories"][1]["dependsOn"],
        json!(["US-001"]),
        "{what}"
    );
    assert_eq!(prd["branchName"], "ralph/notes-export", "{what}");
    assert!(!env.path("prd.draft.json").exists(), "{what}");
}

#[test]
fn convert_reads_an_exec_agents_multi_line_json_after_chatter_or_in_a_fence() {
    let cases = [
        (
            "pretty-printed, nothing else",
            "cat >/dev/null\ncat \"$DOC\"",
        ),
        (
            "after log lines, one of them JSON and one with a brace",
            "cat >/dev/null\necho 'loading model {fast}'\necho '{\"level\":\"info\",\"msg\":\"ready\"}'\n\
             echo 'thinking...'\ncat \"$DOC\"",
        ),
        (
            "in a ```json fence between sentences",
            "cat >/dev/null\necho 'Here is the prd.json:'\necho\necho '```json'\ncat \"$DOC\"\n\
             echo\necho '```'\necho 'Let me know if you want changes.'",
        ),
        (
            "after an echo of the whole prompt (its example reply has userStories too)",
            "cat\necho\ncat \"$DOC\"",
        ),
    ];
    for (i, (what, body)) in cases.iter().enumerate() {
        let env = notes_env();
        let cmd = agent_script(&env, &format!("agent{i}"), &draft(), body);
        let out = exec_convert(&env, &cmd, &["--attempts", "1"]);
        assert_converted(&env, &out, what);
    }
}

#[test]
fn plan_reads_an_exec_agents_pretty_printed_prd_after_log_lines() {
    let plan = json!({
        "title": "Notes export",
        "introduction": "Let users export notes as Markdown files, one at a time or all at once.",
        "goals": ["Get notes out of the app as Markdown"],
        "userStories": [
            {"title": "Export one note",
             "description": "As a user, I want `notes export 3` so that I can keep a note.",
             "acceptanceCriteria": ["`notes export 3` writes `note-3.md`"]},
            {"title": "Export all notes",
             "description": "As a user, I want `notes export --all` so that I can back up every note.",
             "acceptanceCriteria": ["`notes export --all` writes one `note-<id>.md` per note"]}
        ],
        "functionalRequirements": ["FR-1: export writes Markdown files"],
        "nonGoals": ["Importing notes"],
        "assumptions": ["One file per note"],
        "openQuestions": []
    });
    let env = notes_env();
    let cmd = agent_script(
        &env,
        "planner",
        &plan,
        "cat >/dev/null\necho '[info] reading the repository'\necho 'draft ready:'\ncat \"$DOC\"",
    );
    let out = env
        .ralph_cmd(&[
            "plan",
            "export notes as Markdown",
            "--yes",
            "--agent",
            "exec",
            "--agent-cmd",
            &cmd,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("✓ wrote tasks/prd-notes-export.md: 2 stories"),
        "{}",
        text(&out)
    );
    let md = env.read("tasks/prd-notes-export.md");
    assert!(
        md.contains("Export one note") && md.contains("Export all notes"),
        "{md}"
    );
    // ralph's layout: convert needs no model.
    let conv = env.ralph(&["convert", "tasks/prd-notes-export.md"]);
    assert_eq!(conv.status.code(), Some(0), "{}", text(&conv));
    assert_eq!(env.prd()["userStories"].as_array().unwrap().len(), 2);
}

/// The failure path, certain with an agent that answers junk: exit 1, the last draft's
/// problems each with its JSON path and fix, the draft kept, no prd.json written.
#[test]
fn an_agent_that_answers_junk_fails_clearly_with_the_draft_kept() {
    // No JSON at all.
    let env = notes_env();
    let cmd = agent_script(
        &env,
        "prose",
        &json!({}),
        "cat >/dev/null\necho 'I would rather describe the stories in prose.'\necho 'First export one note {maybe}.'",
    );
    let out = exec_convert(&env, &cmd, &["--attempts", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the agent did not produce a valid prd.json in 2 attempts"),
        "{err}"
    );
    assert!(err.contains("$: the reply holds no JSON object"), "{err}");
    assert!(
        err.contains("the last draft is saved in prd.draft.json"),
        "{err}"
    );
    assert_eq!(
        env.read("prd.draft.json"),
        "I would rather describe the stories in prose.\nFirst export one note {maybe}.\n"
    );
    assert!(!env.path("prd.json").exists());

    // JSON, pretty-printed, with a wrong type and no stories' ids: every problem is named.
    let env = notes_env();
    let mut junk = draft();
    junk["userStories"][0]["priority"] = json!("high");
    junk["userStories"][1]["acceptanceCriteria"] = json!("all of them");
    let cmd = agent_script(
        &env,
        "junk",
        &junk,
        "cat >/dev/null\necho 'here:'\ncat \"$DOC\"",
    );
    let out = exec_convert(&env, &cmd, &["--attempts", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = err
        .lines()
        .filter(|l| l.trim_start().starts_with("- $"))
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("$.userStories[0].priority") && p.contains("(fix: ")),
        "{err}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("$.userStories[1].acceptanceCriteria") && p.contains("(fix: ")),
        "{err}"
    );
    let kept: Value = serde_json::from_str(&env.read("prd.draft.json")).unwrap_or_else(|e| {
        panic!(
            "the draft kept is the agent's JSON ({e}): {}",
            env.read("prd.draft.json")
        )
    });
    assert_eq!(kept["userStories"][0]["priority"], "high");
    assert!(!env.path("prd.json").exists());
}
