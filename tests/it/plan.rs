//! `ralph plan` against the scripted model server (the native backend): without a terminal (or
//! with `--yes`) one session writes the PRD with its assumptions; on a terminal (a pty from
//! `script`) the agent's clarifying questions are asked and the answers reach the PRD prompt;
//! `--convert` chains into `ralph convert`; a reply without stories is fed back.

use std::process::{Command, Stdio};

use ralph::protocol::ProviderKind;
use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::support_llm::{RecordedRequest, ScriptedLlm, ScriptedReply, SCRIPTED_API_KEY};

/// The PRD the scripted model writes.
pub(crate) fn plan_doc() -> Value {
    json!({
        "title": "Reverse flag",
        "introduction": "Add a --reverse flag to the textkit command line so that users can flip its output.",
        "goals": ["Reverse any output line with one flag"],
        "userStories": [
            {"title": "Add a reverse helper",
             "description": "As a developer, I want `textkit.reverse(text)` so that the CLI can use it.",
             "acceptanceCriteria": ["`reverse(\"abc\")` returns `\"cba\"`", "Tests pass"]},
            {"title": "Wire the --reverse flag",
             "description": "As a user, I want `--reverse` so that the output comes out reversed.",
             "acceptanceCriteria": ["`textkit --reverse abc` prints `cba`", "Tests pass"]}
        ],
        "functionalRequirements": ["FR-1: --reverse reverses each line by characters"],
        "nonGoals": ["Reversing files in place"],
        "assumptions": ["Reversal is by Unicode characters, not bytes"],
        "openQuestions": ["Should --reverse combine with other flags?"]
    })
}

fn questions() -> Value {
    json!({"questions": [
        {"question": "What should --reverse flip?",
         "options": ["The characters of each line", "The order of the lines"]},
        {"question": "Which commands get the flag?", "options": ["All of them", "Only slugify"]},
        {"question": "Is Unicode handled?", "options": ["Yes, by characters", "ASCII only"]}
    ]})
}

fn native_args(base: &str) -> Vec<String> {
    [
        "--agent",
        "native",
        "--model",
        "scripted",
        "--base-url",
        base,
        "--api-key-env",
        "PLAN_TEST_KEY",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn plan_cmd(env: &TestEnv, llm: &ScriptedLlm, args: &[&str]) -> Command {
    let mut all: Vec<String> = vec!["plan".into()];
    all.extend(args.iter().map(|s| s.to_string()));
    all.extend(native_args(&llm.base_url()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut cmd = env.ralph_cmd(&refs);
    cmd.env("PLAN_TEST_KEY", SCRIPTED_API_KEY);
    cmd
}

fn first_prompt(req: &RecordedRequest) -> String {
    req.last_user_text()
}

#[test]
fn without_a_terminal_the_prd_holds_assumptions_and_converts_without_a_model() {
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![ScriptedReply::text(plan_doc().to_string())],
    );
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "README.md",
        "Run the tests: `python3 -m unittest discover -s tests -q`\n",
    );
    let out = plan_cmd(&env, &llm, &["add a --reverse flag to textkit's CLI"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(
            "✓ wrote tasks/prd-reverse-flag.md: 2 stories (no questions asked; the agent's \
             assumptions are in it)\nnext: review and edit it, then `ralph convert \
             tasks/prd-reverse-flag.md`"
        ),
        "{stdout}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "no question round without a terminal");
    let prompt = first_prompt(&reqs[0]);
    assert!(
        prompt.contains("add a --reverse flag to textkit's CLI"),
        "{prompt}"
    );
    assert!(prompt.contains("write it under `assumptions`"), "{prompt}");
    assert!(
        prompt.contains("tests run with `python3 -m unittest discover -s tests -q`"),
        "{prompt}"
    );
    let schema = &reqs[0].body["response_format"]["json_schema"]["schema"];
    assert_eq!(schema["properties"]["userStories"]["maxItems"], 6);

    let md = env.read("tasks/prd-reverse-flag.md");
    insta::assert_snapshot!("plan_prd_markdown", md);
    let conv = env.ralph(&[
        "convert",
        "tasks/prd-reverse-flag.md",
        "--out",
        "next/prd.json",
    ]);
    assert!(conv.status.success(), "{}", text(&conv));
    let valid = env.ralph(&["validate", "next/prd.json"]);
    assert!(valid.status.success(), "{}", text(&valid));
    let prd: Value = serde_json::from_str(&env.read("next/prd.json")).unwrap();
    assert_eq!(prd["branchName"], "ralph/reverse-flag");
    assert_eq!(prd["userStories"][1]["id"], "US-002");
}

#[test]
fn plan_convert_chains_into_prd_json_and_refuses_to_overwrite_the_prd_file() {
    let llm = ScriptedLlm::start(ProviderKind::Openai, |_| {
        ScriptedReply::text(plan_doc().to_string())
    });
    let env = TestEnv::new(&prd_with_stories(1));
    let out = plan_cmd(
        &env,
        &llm,
        &["--yes", "--convert", "--force", "reverse flag"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "✓ wrote prd.json: 2 stories from tasks/prd-reverse-flag.md (ralph's PRD layout, no \
             model)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("archived branch ralph/demo"), "{stdout}");
    assert_eq!(env.prd()["userStories"][0]["title"], "Add a reverse helper");
    assert_eq!(llm.request_count(), 1, "the layout needs no second session");

    let again = plan_cmd(&env, &llm, &["--yes", "reverse flag"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr)
            .contains("prd-reverse-flag.md already exists; refusing to overwrite it"),
        "{}",
        text(&again)
    );
}

#[test]
fn a_reply_without_stories_is_fed_back() {
    let mut empty = plan_doc();
    empty["userStories"] = json!([]);
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(empty.to_string()),
            ScriptedReply::text(plan_doc().to_string()),
        ],
    );
    let env = TestEnv::new(&prd_with_stories(1));
    let out = plan_cmd(&env, &llm, &["--yes", "reverse flag"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let feedback = first_prompt(&reqs[1]);
    assert!(
        feedback.contains("- $.userStories: 0 stories (fix: write 1 to 10 stories"),
        "{feedback}"
    );
    assert!(env.path("tasks/prd-reverse-flag.md").is_file());
}

/// A small model copies a prompt's example as its answer, so a native (or local) session,
/// which gets the reply's schema as `response_format`, is shown none; a reply that copies the
/// example of the CLI agents' prompt anyway is fed back, and left as a warning when the
/// attempts run out.
#[test]
fn a_schema_session_gets_no_example_and_a_copied_example_is_fed_back() {
    let mut copied = plan_doc();
    copied["userStories"][0]["description"] =
        json!("As a user, I want `notes export ID` so that I get that note as a file.");
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(copied.to_string()),
            ScriptedReply::text(plan_doc().to_string()),
            ScriptedReply::text(copied.to_string()),
        ],
    );
    let env = TestEnv::new(&prd_with_stories(1));
    let out = plan_cmd(&env, &llm, &["--yes", "reverse flag"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let first = first_prompt(&reqs[0]);
    assert!(!first.contains("notes export"), "no example: {first}");
    assert!(
        first.contains("the JSON schema that comes with this request"),
        "{first}"
    );
    let feedback = first_prompt(&reqs[1]);
    assert!(
        feedback.contains("- $.userStories[0]: copied from the example in the prompt"),
        "{feedback}"
    );
    assert!(!env
        .read("tasks/prd-reverse-flag.md")
        .contains("notes export"));

    // One attempt, a copy: written (it converts), with the warning.
    let out = plan_cmd(
        &env,
        &llm,
        &["--yes", "--attempts", "1", "--force", "reverse flag"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "warning: tasks/prd-reverse-flag.md: $.userStories[0]: copied from the example in the \
             prompt"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn on_a_terminal_the_clarifying_questions_are_asked_and_answered() {
    let llm = ScriptedLlm::start(ProviderKind::Openai, |req| {
        if req
            .last_user_text()
            .contains("Ask the 3 to 5 clarifying questions")
        {
            ScriptedReply::text(questions().to_string())
        } else {
            ScriptedReply::text(plan_doc().to_string())
        }
    });
    let env = TestEnv::new(&prd_with_stories(1));
    // `script` gives ralph a pseudo-terminal for stdin and stdout; the answers are typed ahead.
    let mut words = vec![
        crate::common::ralph_bin().to_string(),
        "plan".into(),
        "reverse flag".into(),
    ];
    words.extend(native_args(&llm.base_url()));
    let line = shlex::try_join(words.iter().map(String::as_str)).unwrap();
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .current_dir(&env.repo)
        .env_clear()
        .envs(env.envs())
        .env("PLAN_TEST_KEY", SCRIPTED_API_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"b\nOnly the slugify command\n\n").unwrap();
        // Keep stdin open until ralph is done, or `script` may end the session at EOF.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !env.path("tasks/prd-reverse-flag.md").exists()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{screen}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        screen.contains("1. What should --reverse flip?\r\n   A. The characters of each line\r\n   B. The order of the lines\r\n> "),
        "{screen}"
    );
    assert!(screen.contains("from your answers"), "{screen}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "questions, then the PRD");
    let prompt = first_prompt(&reqs[1]);
    assert!(
        prompt.contains("- What should --reverse flip? → The order of the lines\n"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- Which commands get the flag? → Only the slugify command\n"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- Is Unicode handled? → no preference: choose the most sensible option"),
        "{prompt}"
    );
    let md = env.read("tasks/prd-reverse-flag.md");
    assert!(
        md.contains("## Decisions\n\n- What should --reverse flip? → The order of the lines\n"),
        "{md}"
    );
}

/// `ralph plan` with claude logged out (the fake as `claude`, answering 401) goes on with the
/// fallback agent named by `--fallback-agent` (the fake as `codex`), says so on stderr, and
/// writes the PRD from codex's answer.
#[test]
fn a_primary_that_cannot_log_in_hands_the_plan_to_the_fallback_agent() {
    let env = crate::fallback::env_with(1, "");
    env.script(&json!({"invocations": [
        crate::fallback::claude_login_failure(),
        [
            {"read_stdin": true},
            {"codex": {"start": {}}},
            {"codex": {"message": plan_doc().to_string()}},
            {"codex": {"completed": {}}}
        ],
    ]}));
    let out = env
        .ralph_cmd(&[
            "plan",
            "add a --reverse flag to textkit's CLI",
            "--yes",
            "--fallback-agent",
            "codex",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the claude session is not logged in (auth_error)")
            && stderr.contains("trying the next agent, codex"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("✓ wrote tasks/prd-reverse-flag.md: 2 stories"),
        "{stdout}"
    );
    assert_eq!(
        env.agent_calls(),
        2,
        "one claude session, one codex session"
    );
}
