//! What the local loop gives a small model, with the scripted model server (no real model):
//! `mark_story` runs the story's check and refuses `passes: true` while it fails, with the
//! check's output as the tool result, so the model fixes the file within the same iteration;
//! a final answer before any `mark_story` gets a reminder; a successful mark ends the session;
//! and, through `ralph run --agent local --base-url`, the compact prompt states the repository
//! root, the story's files and its check, and the whole exchange passes the verify gate in one
//! iteration.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ralph::native::llm::{Provider, RetryPolicy};
use ralph::native::tools::{StoryCheck, ToolContext, ToolRegistry};
use ralph::native::{
    run_session, SessionConfig, SessionEnd, SessionResult, MARK_REMINDER, MARK_REMINDERS,
};
use ralph::protocol::{ProviderKind, ToolMode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::common::{text, TestEnv};
use crate::support_llm::{RecordedRequest, ScriptedLlm, ScriptedReply};

const KIND: ProviderKind = ProviderKind::Openai;

/// A temporary repository with a prd.json of one story (`verify` as given) and a tool context
/// whose `mark_story` runs the story's check.
struct Repo {
    _dir: tempfile::TempDir,
    ctx: ToolContext,
}

impl Repo {
    fn new(verify: Option<&str>, fallback: Option<&str>, timeout: Duration) -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let mut story = json!({"id": "US-001", "title": "Say hi", "priority": 1,
            "acceptanceCriteria": ["hello.txt holds hi"], "passes": false, "notes": ""});
        if let Some(verify) = verify {
            story["verify"] = json!(verify);
        }
        let prd = json!({"project": "Demo", "branchName": "ralph/demo", "userStories": [story]});
        fs::write(
            root.join("prd.json"),
            serde_json::to_string_pretty(&prd).unwrap(),
        )
        .unwrap();
        fs::write(root.join("progress.txt"), "").unwrap();
        let mut ctx = ToolContext::new(
            root.clone(),
            root.join("prd.json"),
            root.join("progress.txt"),
        );
        ctx.story_check = Some(StoryCheck {
            fallback: fallback.map(str::to_string),
            timeout,
            secrets: vec!["sekrit-value-123".into()],
        });
        Repo { _dir: dir, ctx }
    }

    fn passes(&self) -> bool {
        let prd: Value =
            serde_json::from_str(&fs::read_to_string(&self.ctx.prd_path).unwrap()).unwrap();
        prd["userStories"][0]["passes"] == json!(true)
    }
}

fn config(mark_protocol: bool) -> SessionConfig {
    SessionConfig {
        model: "test-model".into(),
        system_prompt: "You are ralph's test agent.".into(),
        max_steps: 12,
        max_tokens: 256,
        context_window: 100_000,
        max_continuations: 2,
        temperature: Some(0.0),
        seed: Some(42),
        tool_mode: ToolMode::Native,
        retry: RetryPolicy {
            max_attempts: 2,
            base: Duration::from_millis(10),
            cap: Duration::from_secs(1),
        },
        allowed_tools: None,
        redact: Vec::new(),
        mark_protocol,
    }
}

async fn session(server: &ScriptedLlm, repo: &Repo, cfg: &SessionConfig) -> SessionResult {
    let provider = Provider::new(server.config(false)).unwrap();
    run_session(
        &provider,
        &ToolRegistry::standard(),
        &repo.ctx,
        cfg,
        "Story US-001: Say hi. Write hi into hello.txt.",
        &CancellationToken::new(),
        &mut |_| {},
    )
    .await
}

fn write(path: &str, content: &str) -> ScriptedReply {
    ScriptedReply::tool_calls(vec![(
        "write_file",
        json!({"path": path, "content": content}),
    )])
}

fn mark(passes: bool) -> ScriptedReply {
    ScriptedReply::tool_calls(vec![(
        "mark_story",
        json!({"id": "US-001", "passes": passes}),
    )])
}

/// The tool results of `request` with their error flags, in order.
fn results(request: &RecordedRequest) -> Vec<(String, bool)> {
    request
        .tool_results()
        .into_iter()
        .map(|(_, text, is_error)| (text, is_error))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_refuses_mark_story_and_its_output_lets_the_model_fix_the_file() {
    let check = "echo \"checking $RALPH_STORY_ID\"; echo sekrit-value-123; \
                 test \"$(cat hello.txt)\" = hi || { echo 'FAIL: hello.txt is not hi' >&2; exit 3; }";
    let repo = Repo::new(Some(check), None, Duration::from_secs(30));
    let server = ScriptedLlm::sequence(
        KIND,
        vec![
            write("hello.txt", "hello"),
            mark(true),
            write("hello.txt", "hi"),
            mark(true),
        ],
    );
    let result = session(&server, &repo, &config(true)).await;
    let requests = server.requests();

    // The refusal came back as an error result, with the check's output: the story id it was
    // run for, stderr, the exit code; the secret replaced.
    let (refusal, is_error) = results(&requests[2]).pop().unwrap();
    assert!(is_error, "{refusal}");
    for needle in [
        "US-001 was NOT marked passing",
        "exited with code 3",
        "checking US-001",
        "FAIL: hello.txt is not hi",
        "[REDACTED]",
        "call mark_story again",
    ] {
        assert!(refusal.contains(needle), "missing {needle:?} in {refusal}");
    }
    assert!(!refusal.contains("sekrit-value-123"), "{refusal}");

    // The fixed file passed the check, the story was recorded, and the successful mark ended
    // the session: no request for a final answer.
    assert_eq!(requests.len(), 4, "{result:?}");
    assert_eq!(result.end, SessionEnd::Completed);
    assert!(
        result.final_text.contains("US-001 is now marked passing")
            && result.final_text.contains("passed"),
        "{}",
        result.final_text
    );
    assert!(repo.passes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_again_after_each_fix_is_not_taken_for_a_stuck_model() {
    let repo = Repo::new(
        Some("test \"$(cat hello.txt)\" = hi"),
        None,
        Duration::from_secs(30),
    );
    // Five wrong fixes, each followed by the same mark_story call, then the right one.
    let mut replies = Vec::new();
    for wrong in ["a", "b", "c", "d", "e"] {
        replies.push(write("hello.txt", wrong));
        replies.push(mark(true));
    }
    replies.push(write("hello.txt", "hi"));
    replies.push(mark(true));
    let server = ScriptedLlm::sequence(KIND, replies);
    let mut cfg = config(true);
    cfg.max_steps = 20;
    let result = session(&server, &repo, &cfg).await;
    assert_eq!(result.end, SessionEnd::Completed, "{result:?}");
    assert_eq!(server.request_count(), 12);
    assert!(repo.passes());
    let last = results(&server.requests()[11]);
    assert!(
        last.iter().all(|(text, _)| !text.contains("exact call")),
        "no repeat warning for mark_story: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_check_applies_to_stories_without_verify_and_false_needs_no_check() {
    let repo = Repo::new(
        None,
        Some("test \"$RALPH_STORY_ID\" = US-001 && test -f done.txt"),
        Duration::from_secs(30),
    );
    let server = ScriptedLlm::sequence(
        KIND,
        vec![mark(true), mark(false), write("done.txt", "ok"), mark(true)],
    );
    let result = session(&server, &repo, &config(true)).await;
    let requests = server.requests();
    let (first, is_error) = results(&requests[1]).pop().unwrap();
    assert!(is_error && first.contains("NOT marked passing"), "{first}");
    assert!(first.contains("It printed nothing."), "{first}");
    // passes=false is recorded without running the check.
    let (second, is_error) = results(&requests[2]).pop().unwrap();
    assert!(
        !is_error && second.contains("marked not passing"),
        "{second}"
    );
    assert_eq!(requests.len(), 4, "{result:?}");
    assert!(repo.passes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_over_its_time_limit_is_killed_and_refused() {
    let repo = Repo::new(Some("echo started; sleep 30"), None, Duration::from_secs(1));
    let server = ScriptedLlm::sequence(
        KIND,
        vec![mark(true), ScriptedReply::text("I could not finish.")],
    );
    let started = Instant::now();
    let result = session(&server, &repo, &config(false)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let (refusal, is_error) = results(&server.requests()[1]).pop().unwrap();
    assert!(is_error, "{refusal}");
    assert!(
        refusal.contains("killed after its time limit of 1 s") && refusal.contains("started"),
        "{refusal}"
    );
    assert_eq!(result.end, SessionEnd::Completed);
    assert!(!repo.passes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_answer_before_mark_story_gets_a_reminder_then_the_session_ends() {
    // The model that "forgets": it writes the file and answers, is reminded, marks.
    let repo = Repo::new(Some("test -f hello.txt"), None, Duration::from_secs(30));
    let server = ScriptedLlm::sequence(
        KIND,
        vec![
            write("hello.txt", "hi"),
            ScriptedReply::text("Done: hello.txt holds hi."),
            mark(true),
        ],
    );
    let result = session(&server, &repo, &config(true)).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{result:?}");
    assert_eq!(requests[2].last_user_text(), MARK_REMINDER);
    assert!(repo.passes());
    assert_eq!(result.end, SessionEnd::Completed);

    // A model that never marks is reminded MARK_REMINDERS times, then the session ends.
    let repo = Repo::new(Some("test -f hello.txt"), None, Duration::from_secs(30));
    let server = ScriptedLlm::start(KIND, |_| ScriptedReply::text("All done."));
    let result = session(&server, &repo, &config(true)).await;
    assert_eq!(server.request_count(), 1 + MARK_REMINDERS as usize);
    assert_eq!(result.end, SessionEnd::Completed);
    assert_eq!(result.final_text, "All done.");

    // Without the protocol (the native backend), no reminder.
    let server = ScriptedLlm::start(KIND, |_| ScriptedReply::text("All done."));
    session(&server, &repo, &config(false)).await;
    assert_eq!(server.request_count(), 1);
}

/// `ralph run --agent local --base-url <scripted server>`: the settings reach the child (JSON
/// tool mode, the check in `mark_story`), the compact prompt names the root, the file and the
/// check, and the refusal's output comes back within the iteration, which passes the verify
/// gate at once.
#[test]
fn a_local_run_fixes_a_failed_check_within_one_iteration() {
    let verify = "grep -qx hi greeting.txt";
    let prd = json!({
        "project": "demo", "branchName": "ralph/demo",
        "userStories": [{
            "id": "US-001", "title": "Create greeting.txt",
            "description": "Create greeting.txt containing the line hi.",
            "acceptanceCriteria": ["greeting.txt holds exactly the line hi"],
            "priority": 1, "passes": false, "notes": "", "verify": verify
        }]
    });
    let env = TestEnv::new(&prd);
    let action = |name: &str, arguments: Value| {
        ScriptedReply::text(json!({"name": name, "arguments": arguments}).to_string())
    };
    let server = ScriptedLlm::start(KIND, move |req| {
        let last = req.last_user_text();
        match req.n {
            0 => {
                let prompt = req.user_texts().join("\n");
                for needle in [
                    "Story US-001: Create greeting.txt",
                    "The repository root is ",
                    "Files for this story, exactly as named: greeting.txt (in the repository \
                     root, not in a folder).",
                    "ralph checks this story by running `grep -qx hi greeting.txt`",
                ] {
                    assert!(prompt.contains(needle), "missing {needle:?} in {prompt}");
                }
                assert!(req.body["response_format"].is_object(), "JSON tool mode");
                action(
                    "write_file",
                    json!({"path": "greeting.txt", "content": "hello\n"}),
                )
            }
            1 => action("mark_story", json!({"id": "US-001", "passes": true})),
            2 => {
                assert!(
                    last.contains("Error from mark_story")
                        && last.contains("NOT marked passing")
                        && last.contains("exited with code 1"),
                    "{last}"
                );
                action(
                    "write_file",
                    json!({"path": "greeting.txt", "content": "hi\n"}),
                )
            }
            3 => action("mark_story", json!({"id": "US-001", "passes": true})),
            n => panic!("unexpected request {n}: the session should have ended: {last}"),
        }
    });
    let out = env
        .ralph_cmd(&[
            "run",
            "--agent",
            "local",
            "--base-url",
            &server.base_url(),
            "--max-iter",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.request_count(), 4);
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["outcome"], "story_passed", "{ledger:?}");
    assert_eq!(env.read("greeting.txt"), "hi\n");
    let checked = Command::new("bash")
        .args(["-c", verify])
        .current_dir(env.path(""))
        .status()
        .unwrap();
    assert!(checked.success());
    assert!(Path::new(&env.path("greeting.txt")).exists());
}

/// A JSON-mode reply cut off by the output limit is asked again once; a second cut-off in a row
/// ends the session instead of paying the whole output limit again and again (at temperature 0
/// a model that ran away inside a string tends to do it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_mode_cut_offs_in_a_row_end_the_session() {
    let repo = Repo::new(Some("test -f hello.txt"), None, Duration::from_secs(30));
    let runaway = || {
        ScriptedReply::text("{\"name\": \"write_file\", \"arguments\": {\"path\": \"a\\n\\n\\n")
            .stop("length")
    };
    let action = |name: &str, arguments: Value| {
        ScriptedReply::text(json!({"name": name, "arguments": arguments}).to_string())
    };
    let mut cfg = config(true);
    cfg.tool_mode = ToolMode::Json;

    // One cut-off, then a good action: the session goes on.
    let server = ScriptedLlm::sequence(
        KIND,
        vec![
            runaway(),
            action("write_file", json!({"path": "hello.txt", "content": "hi"})),
            runaway(),
            action("mark_story", json!({"id": "US-001", "passes": true})),
        ],
    );
    let result = session(&server, &repo, &cfg).await;
    assert_eq!(result.end, SessionEnd::Completed, "{result:?}");
    assert_eq!(server.request_count(), 4);
    assert!(repo.passes());

    // Two in a row: the session ends.
    let repo = Repo::new(Some("test -f hello.txt"), None, Duration::from_secs(30));
    let server = ScriptedLlm::start(KIND, move |_| runaway());
    let result = session(&server, &repo, &cfg).await;
    assert_eq!(result.end, SessionEnd::Length, "{result:?}");
    assert_eq!(server.request_count(), 2);
}
