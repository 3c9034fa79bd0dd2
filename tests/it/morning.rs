//! The morning after, as a user reads it: `ralph log`, `ralph show` and `ralph report
//! --markdown` over a fixed three-run history (tests/fixtures/history/: every outcome, a
//! usage-limit wait, a verify failure, a blocked story, a rewritten history with a lost commit,
//! an interrupted iteration), snapshot-tested; then the same with `.ralph/` deleted, from git
//! trailers alone.

use std::path::Path;

use serde_json::Value;

use crate::common::{text, TestEnv};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/history");

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// A repository holding the fixture's prd.json and progress.txt, one ralph commit (with the
/// trailers) per ledger record, and `.ralph/` with the ledger, state and transcripts.
pub(crate) fn history() -> TestEnv {
    let prd: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/prd.json")).unwrap())
            .unwrap();
    let env = TestEnv::new(&prd);
    env.git(&["checkout", "-q", "-b", "ralph/textkit"]);
    std::fs::copy(format!("{FIXTURE}/progress.txt"), env.path("progress.txt")).unwrap();
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "progress"]);
    let ledger = std::fs::read_to_string(format!("{FIXTURE}/ledger.jsonl")).unwrap();
    for line in ledger.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let msg = format!(
            "ralph: iteration {n} ({story})\n\nOutcome: {o}.\n\nRalph-Run: {run}\nRalph-Iteration: {n}\nRalph-Story: {story}\nRalph-Outcome: {o}\nRalph-Feature: ralph/textkit\n",
            n = r["iteration"],
            story = r["story_id"].as_str().unwrap(),
            o = r["outcome"].as_str().unwrap(),
            run = r["run_id"].as_str().unwrap()
        );
        env.git(&["commit", "-q", "--allow-empty", "-m", &msg]);
    }
    let ralph = env.path(".ralph");
    copy_dir(&Path::new(FIXTURE).join("runs"), &ralph.join("runs"));
    std::fs::copy(
        format!("{FIXTURE}/ledger.jsonl"),
        ralph.join("ledger.jsonl"),
    )
    .unwrap();
    std::fs::copy(format!("{FIXTURE}/state.json"), ralph.join("state.json")).unwrap();
    std::fs::write(ralph.join(".gitignore"), "*\n").unwrap();
    env
}

fn stdout(env: &TestEnv, args: &[&str]) -> String {
    let out = env.ralph(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn log_show_and_report_read_a_multi_run_history() {
    let env = history();
    insta::assert_snapshot!("log", stdout(&env, &["log", "--no-pager"]));
    insta::assert_snapshot!(
        "log_filtered",
        stdout(
            &env,
            &[
                "log",
                "--no-pager",
                "--outcome",
                "verify_failed,usage_limit",
                "--run",
                "0a0a"
            ]
        )
    );
    insta::assert_snapshot!(
        "log_last_3",
        stdout(&env, &["log", "--no-pager", "-n", "3"])
    );
    insta::assert_snapshot!(
        "show_verify_failed",
        stdout(&env, &["show", "2", "--no-pager"])
    );
    insta::assert_snapshot!(
        "show_rewritten_history",
        stdout(&env, &["show", "20261201T060000-0b0b:14", "--no-pager"])
    );
    insta::assert_snapshot!(
        "show_interrupted",
        stdout(&env, &["show", "7", "--no-pager"])
    );
    insta::assert_snapshot!(
        "report_markdown_latest",
        stdout(&env, &["report", "--markdown"])
    );
    insta::assert_snapshot!(
        "report_markdown_all",
        stdout(&env, &["report", "--markdown", "--all"])
    );
    // `--out` takes the Markdown too: the same text in the file, its path on stdout.
    let printed = stdout(
        &env,
        &["report", "--markdown", "--all", "--out", "summary.md"],
    );
    assert!(printed.trim_end().ends_with("summary.md"), "{printed}");
    assert_eq!(
        env.read("summary.md"),
        stdout(&env, &["report", "--markdown", "--all"])
    );
    let json: Vec<Value> = stdout(&env, &["log", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(json.len(), 16);
    assert_eq!(json[1]["verify"][0]["passed"], false);
}

#[test]
fn log_and_report_work_from_git_alone() {
    let env = history();
    std::fs::remove_dir_all(env.path(".ralph")).unwrap();
    insta::assert_snapshot!("log_git_only", stdout(&env, &["log", "--no-pager"]));
    insta::assert_snapshot!(
        "report_markdown_git_only",
        stdout(&env, &["report", "--markdown", "--all"])
    );
    let show = stdout(&env, &["show", "2", "--no-pager"]);
    assert!(show.contains("git history only"), "{show}");
}

#[test]
fn bad_arguments_name_the_fix() {
    let env = history();
    let out = env.ralph(&["show", "99"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("iterations 1 to 16 are recorded"));
    let out = env.ralph(&["log", "--outcome", "passed"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown outcome `passed`"));
    let out = env.ralph(&["log", "--since", "last tuesday"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = env.ralph(&["report", "--run", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `ralph show` for ralph's own native loop: its transcript keeps each tool's result (bounded,
/// redacted), so the morning reader sees what the model saw.
#[test]
fn show_reads_a_native_iteration_with_its_tool_results() {
    use crate::support_llm::{ScriptedLlm, ScriptedReply, SCRIPTED_API_KEY};
    use ralph::protocol::ProviderKind;
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::tool_calls(vec![(
                "run_command",
                serde_json::json!({"command": "echo hello-from-the-tool; echo key=$SHOW_TEST_KEY"}),
            )]),
            ScriptedReply::text("I ran it."),
        ],
    );
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    let base = llm.base_url();
    let out = env
        .ralph_cmd(&[
            "run",
            "--agent",
            "native",
            "--model",
            "scripted",
            "--base-url",
            &base,
            "--api-key-env",
            "SHOW_TEST_KEY",
            "--max-iter",
            "1",
        ])
        .env("SHOW_TEST_KEY", SCRIPTED_API_KEY)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let show = stdout(&env, &["show", "1", "--no-pager"]);
    assert!(
        show.contains("backend     native, model scripted"),
        "{show}"
    );
    assert!(
        show.contains("→ run_command: echo hello-from-the-tool"),
        "{show}"
    );
    assert!(show.contains("hello-from-the-tool"), "{show}");
    assert!(show.contains("I ran it."), "{show}");
    // The API key never reaches the transcript, even when a tool prints it.
    let transcript = std::fs::read_dir(env.path(".ralph/runs"))
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .collect::<String>();
    assert!(
        !transcript.contains(SCRIPTED_API_KEY),
        "the key is in the transcript"
    );
    let json: Value = serde_json::from_str(&stdout(&env, &["show", "1", "--json"])).unwrap();
    assert!(json["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "tool_result"
            && e["output"]
                .as_str()
                .is_some_and(|o| o.contains("hello-from-the-tool"))));
}

/// `ralph show` for an exec agent: its output lines and its changes.
#[test]
fn show_reads_an_exec_iteration() {
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    env.script(&serde_json::json!({"invocations": [[
        {"stdout": "looking at the repository"},
        {"write_file": {"path": "notes.txt", "content": "n\n"}},
        {"stdout": "wrote notes.txt"}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "claude",
        "--max-iter",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let show = stdout(&env, &["show", "1", "--no-pager"]);
    assert!(
        show.contains("iteration 1 · US-001 Story 1 · progress"),
        "{show}"
    );
    assert!(show.contains("wrote notes.txt"), "{show}");
    assert!(show.contains("notes.txt"), "{show}");
    assert!(
        show.contains("cost        ?, tokens not reported"),
        "{show}"
    );
}

/// A claude iteration's transcript keeps each stdout line once (no event records beside it):
/// `ralph show` rebuilds the events from the raw lines, and they are the ones `ralph run
/// --json --verbose` showed live.
#[test]
fn show_rebuilds_a_claude_iteration_from_its_raw_lines() {
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    let assistant = serde_json::json!({"type": "assistant", "message": {"id": "m1", "content": [
        {"type": "text", "text": "Looking at \"the\" repo"},
        {"type": "tool_use", "name": "Grep", "input": {"pattern": "fn main", "path": "src"}}]}});
    let result = serde_json::json!({"type": "user", "message": {"content": [
        {"type": "tool_result", "is_error": true, "content": [{"type": "text", "text": "no match"}]}]}});
    env.script(&serde_json::json!({"invocations": [[
        {"claude_init": {}},
        {"stdout": assistant.to_string()},
        {"claude_tool": {"name": "Bash", "input": {"command": "ls -la"}, "result": "a\nb"}},
        {"stdout": result.to_string()},
        {"stderr": "a warning on stderr"},
        {"claude_result": {"text": "Done."}}
    ]]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--json", "--verbose"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let live: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "agent_event")
        .map(|e| e["agent_event"].clone())
        .collect();
    assert!(live.len() >= 7, "{live:?}");
    let json: Value = serde_json::from_str(&stdout(&env, &["show", "1", "--json"])).unwrap();
    assert_eq!(json["events"].as_array().unwrap(), &live);
    let transcript = env.read(env.ledger()[0]["transcript"].as_str().unwrap());
    let written: Vec<&str> = transcript
        .lines()
        .filter(|l| l.starts_with(r#"{"type":"event""#))
        .collect();
    assert_eq!(
        written.len(),
        1,
        "only the stderr line's event: {written:?}"
    );
    let show = stdout(&env, &["show", "1", "--no-pager"]);
    assert!(show.contains("→ Grep: fn main in src"), "{show}");
    assert!(show.contains("→ Bash: ls -la"), "{show}");
}

#[test]
fn a_run_stopped_at_a_usage_limit_reports_when_it_resumes() {
    // Exit 75 and its reset: `resume_at` in the report's Markdown, HTML and JSON.
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    let resets = chrono::Utc::now().timestamp() + 3600;
    env.script(&serde_json::json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your limit", "resets_at": resets}},
        {"exit": 1}
    ]]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let data: Value = serde_json::from_str(&stdout(&env, &["report", "--json"])).unwrap();
    let at = data["summary"]["resume_at"]
        .as_str()
        .unwrap_or_else(|| panic!("resume_at in {data}"));
    let parsed = chrono::DateTime::parse_from_rfc3339(at).unwrap();
    assert!((parsed.timestamp() - resets).abs() < 120, "{at}");
    let md = stdout(&env, &["report", "--markdown"]);
    assert!(md.contains(&format!("**Resumes at:** {at}")), "{md}");
    stdout(&env, &["report"]);
    let html = env.read(".ralph/report.html");
    assert!(html.contains(&format!("data-at=\"{at}\"")), "{at}");
}
