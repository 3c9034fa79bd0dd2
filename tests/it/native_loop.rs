//! ralph's own agent loop ([`ralph::native::run_session`]) run in-process against the scripted
//! LLM server (`support_llm`), on a temporary git repository with a prd.json and a progress.txt.
//! One test per loop-control rule of issue 3, asserting on the requests the loop sends: call ids
//! paired with results, repeated calls, the step limit, `length` continuations, filters and
//! refusals, context shrinking, errors the model can fix, HTTP failures, cancellation, tool
//! calls written as text, and JSON tool mode.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ralph::native::llm::{Provider, RetryPolicy};
use ralph::native::tools::{ToolContext, ToolRegistry};
use ralph::native::{run_session, SessionConfig, SessionEnd, SessionResult, REPEAT_STOP_AT};
use ralph::protocol::AgentEvent;
use ralph::protocol::{ProviderKind, ToolMode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::common::group_has_live_members;
use crate::support_llm::{scripted_call_id, RecordedRequest, ScriptedLlm, ScriptedReply};

const KINDS: [ProviderKind; 2] = [ProviderKind::Openai, ProviderKind::Anthropic];

const SYSTEM: &str = "You are ralph's test agent. Use the tools to implement the story.";
const STORY: &str =
    "Story ID: US-001\nTitle: Say hello\nCreate hello.txt containing `hi` and mark the story.";

/// The eight tools of [`ToolRegistry::standard`], in the order they are offered.
const ALL_TOOLS: [&str; 8] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "search",
    "run_command",
    "mark_story",
    "append_progress",
];

/// A temporary git repository with prd.json and progress.txt, and a tool context for it.
struct Repo {
    _dir: tempfile::TempDir,
    ctx: ToolContext,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let git = Command::new("git")
            .args(["init", "-q", "-b", "main"])
            .current_dir(&root)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(git.status.success(), "git init: {git:?}");
        let prd = json!({"project": "Demo", "branchName": "ralph/demo",
            "userStories": [{"id": "US-001", "title": "Say hello", "priority": 1,
                             "passes": false, "notes": ""}]});
        fs::write(
            root.join("prd.json"),
            serde_json::to_string_pretty(&prd).unwrap(),
        )
        .unwrap();
        fs::write(root.join("progress.txt"), "").unwrap();
        let ctx = ToolContext::new(
            root.clone(),
            root.join("prd.json"),
            root.join("progress.txt"),
        );
        Repo { _dir: dir, ctx }
    }

    fn root(&self) -> &Path {
        &self.ctx.repo_root
    }

    fn write(&self, rel: &str, content: &str) {
        fs::write(self.root().join(rel), content).unwrap();
    }

    fn read(&self, rel: &str) -> Option<String> {
        fs::read_to_string(self.root().join(rel)).ok()
    }
}

fn config() -> SessionConfig {
    SessionConfig {
        model: "test-model".into(),
        system_prompt: SYSTEM.into(),
        max_steps: 20,
        max_tokens: 256,
        context_window: 100_000,
        max_continuations: 2,
        temperature: Some(0.0),
        seed: Some(7),
        tool_mode: ToolMode::Native,
        // Fast retries unless the server says otherwise.
        retry: RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(10),
            cap: Duration::from_secs(10),
        },
        allowed_tools: None,
        redact: Vec::new(),
        mark_protocol: false,
    }
}

/// Runs one session against `server`, collecting its events.
async fn session(
    server: &ScriptedLlm,
    stream: bool,
    repo: &Repo,
    cfg: &SessionConfig,
) -> (SessionResult, Vec<AgentEvent>) {
    session_with(server, stream, repo, cfg, &CancellationToken::new()).await
}

async fn session_with(
    server: &ScriptedLlm,
    stream: bool,
    repo: &Repo,
    cfg: &SessionConfig,
    cancel: &CancellationToken,
) -> (SessionResult, Vec<AgentEvent>) {
    let provider = Provider::new(server.config(stream)).unwrap();
    let tools = ToolRegistry::standard();
    let mut events = Vec::new();
    let result = run_session(&provider, &tools, &repo.ctx, cfg, STORY, cancel, &mut |e| {
        events.push(e)
    })
    .await;
    (result, events)
}

/// `finish_reason` / `stop_reason` for an output-limit stop.
fn length_reason(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai => "length",
        ProviderKind::Anthropic => "max_tokens",
    }
}

/// The first text of the first user message: the story prompt (anthropic merges later user
/// text into the same turn as further blocks).
fn first_user_text(req: &RecordedRequest) -> String {
    let first = req
        .messages()
        .iter()
        .find(|m| m["role"] == "user")
        .cloned()
        .unwrap_or(Value::Null);
    match &first["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .find(|b| b["type"] == "text")
            .and_then(|b| b["text"].as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

fn ids(results: &[(String, String, bool)]) -> Vec<String> {
    results.iter().map(|(id, ..)| id.clone()).collect()
}

fn tool_call_names(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCall { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// Every tool result in `req` answers a call replayed in the same request, and every replayed
/// call has its result (the APIs reject either kind of orphan).
fn assert_calls_and_results_paired(req: &RecordedRequest) {
    let calls: Vec<String> = req.tool_calls().into_iter().map(|(id, ..)| id).collect();
    let results = ids(&req.tool_results());
    for id in &results {
        assert!(
            calls.contains(id),
            "request {}: orphaned result {id}",
            req.n
        );
    }
    for id in &calls {
        assert!(
            results.contains(id),
            "request {}: call {id} has no result",
            req.n
        );
    }
}

#[tokio::test]
async fn each_result_carries_its_call_id_and_the_loop_runs_while_tools_are_asked() {
    for kind in KINDS {
        for stream in [true, false] {
            let repo = Repo::new();
            let server = ScriptedLlm::sequence(
                kind,
                vec![
                    ScriptedReply::tool_calls(vec![
                        (
                            "write_file",
                            json!({"path": "hello.txt", "content": "hi\n"}),
                        ),
                        ("read_file", json!({"path": "hello.txt"})),
                    ]),
                    ScriptedReply::tool_calls(vec![("list_files", json!({}))]),
                    ScriptedReply::text("All done: hello.txt says hi."),
                ],
            );
            let (r, events) = session(&server, stream, &repo, &config()).await;
            let what = format!("{kind:?} stream={stream}");
            assert_eq!(r.end, SessionEnd::Completed, "{what}");
            assert_eq!(r.final_text, "All done: hello.txt says hi.", "{what}");
            assert_eq!((r.steps, r.requests), (2, 3), "{what}");
            assert_eq!(
                (r.usage.input_tokens, r.usage.output_tokens),
                (30, 15),
                "{what}"
            );
            assert_eq!(repo.read("hello.txt").as_deref(), Some("hi\n"), "{what}");

            let reqs = server.requests();
            assert_eq!(reqs.len(), 3, "{what}");
            for req in &reqs {
                assert_eq!(req.is_stream(), stream, "{what}");
                assert_eq!(req.system_text(), SYSTEM, "{what}");
                assert_eq!(first_user_text(req), STORY, "{what}");
                assert_eq!(req.tool_names(), ALL_TOOLS, "{what}");
                assert_calls_and_results_paired(req);
            }
            let first = reqs[1].tool_results();
            assert_eq!(
                ids(&first),
                [scripted_call_id(kind, 0, 0), scripted_call_id(kind, 0, 1)],
                "{what}"
            );
            assert!(
                first.iter().all(|(_, _, error)| !error),
                "{what}: {first:?}"
            );
            assert!(first[1].1.contains("hi"), "{what}: {}", first[1].1);
            let second = reqs[2].tool_results();
            assert_eq!(
                ids(&second),
                [
                    scripted_call_id(kind, 0, 0),
                    scripted_call_id(kind, 0, 1),
                    scripted_call_id(kind, 1, 0)
                ],
                "{what}"
            );
            assert!(second[2].1.contains("hello.txt"), "{what}: {}", second[2].1);
            assert_eq!(
                tool_call_names(&events),
                ["write_file", "read_file", "list_files"],
                "{what}"
            );
        }
    }
}

/// The code's promise: calls 1–4 of the same (name, canonical arguments) run, the 3rd and 4th
/// results carry a warning, and the 5th is not run: the session ends `Stuck` after 5 requests.
#[tokio::test]
async fn identical_calls_are_warned_at_three_and_stopped_at_five() {
    for (kind, stream) in [
        (ProviderKind::Openai, true),
        (ProviderKind::Anthropic, false),
    ] {
        let repo = Repo::new();
        // The same call with its keys in a different order each time.
        let server = ScriptedLlm::start(kind, |req| {
            let args = if req.n % 2 == 0 {
                json!({"command": "echo run >> runs.txt", "timeout_s": 30})
            } else {
                json!({"timeout_s": 30, "command": "echo run >> runs.txt"})
            };
            ScriptedReply::tool_calls(vec![("run_command", args)])
        });
        let (r, events) = session(&server, stream, &repo, &config()).await;
        let what = format!("{kind:?}");
        assert_eq!(
            r.end,
            SessionEnd::Stuck {
                tool: "run_command".into()
            },
            "{what}"
        );
        let reqs = server.requests();
        assert_eq!(reqs.len(), REPEAT_STOP_AT as usize, "{what}");
        assert_eq!(r.requests, REPEAT_STOP_AT, "{what}");
        // The key order really differs on the wire.
        let calls = reqs[2].tool_calls();
        assert_ne!(
            calls[0].2.to_string(),
            calls[1].2.to_string(),
            "{what}: the scripted calls should differ in key order"
        );
        // Four calls ran; the fifth did not.
        assert_eq!(
            repo.read("runs.txt").unwrap_or_default().lines().count(),
            4,
            "{what}"
        );
        assert_eq!(tool_call_names(&events).len(), 4, "{what}");
        let latest = |n: usize| reqs[n].tool_results().last().unwrap().1.clone();
        for n in 1..=2 {
            assert!(!latest(n).contains("Warning"), "{what}: {}", latest(n));
            assert!(latest(n).contains("exit code 0"), "{what}: {}", latest(n));
        }
        assert!(
            latest(3).contains("you have made this exact call 3 times"),
            "{what}: {}",
            latest(3)
        );
        assert!(
            latest(4).contains("you have made this exact call 4 times"),
            "{what}: {}",
            latest(4)
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, AgentEvent::Error { message }
                if message.contains("repeated the same run_command call 5 times"))),
            "{what}: {events:?}"
        );
    }
}

#[tokio::test]
async fn the_step_limit_asks_for_a_summary_with_no_tools_offered() {
    const SUMMARY: &str = "Summary: I read prd.json twice; nothing is written yet.";
    for kind in KINDS {
        let repo = Repo::new();
        let server = ScriptedLlm::start(kind, |req| {
            if req.tool_names().is_empty() {
                ScriptedReply::text(SUMMARY)
            } else {
                ScriptedReply::tool_calls(vec![(
                    "read_file",
                    json!({"path": "prd.json", "offset": req.n + 1}),
                )])
            }
        });
        let cfg = SessionConfig {
            max_steps: 2,
            ..config()
        };
        let (r, _) = session(&server, true, &repo, &cfg).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::StepLimit, "{what}");
        assert_eq!(r.final_text, SUMMARY, "{what}");
        assert_eq!((r.steps, r.requests), (2, 3), "{what}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3, "{what}");
        assert_eq!(reqs[1].tool_names(), ALL_TOOLS, "{what}");
        let last = &reqs[2];
        assert!(last.body.get("tools").is_none(), "{what}: {}", last.body);
        assert!(last.body.get("tool_choice").is_none(), "{what}");
        let ask = last.last_user_text();
        assert!(
            ask.contains("limit of 2 tool-using steps") && ask.contains("Do not call any tool"),
            "{what}: {ask}"
        );
        assert_eq!(first_user_text(last), STORY, "{what}");
        if kind == ProviderKind::Anthropic {
            // With no tools defined, Messages rejects tool_use blocks: they become text.
            assert!(last.tool_calls().is_empty(), "{what}: {}", last.body);
            assert!(last.body_text().contains("[tool call read_file"), "{what}");
        }
    }

    // A weak model that still calls a tool in the final round: the call is not run.
    let repo = Repo::new();
    let server = ScriptedLlm::start(ProviderKind::Openai, |req| {
        if req.tool_names().is_empty() {
            ScriptedReply::tool_calls(vec![(
                "write_file",
                json!({"path": "late.txt", "content": "x"}),
            )])
            .with_text("One more thing.")
        } else {
            ScriptedReply::tool_calls(vec![("list_files", json!({"path": "."}))])
        }
    });
    let cfg = SessionConfig {
        max_steps: 1,
        ..config()
    };
    let (r, _) = session(&server, false, &repo, &cfg).await;
    assert_eq!(r.end, SessionEnd::StepLimit);
    assert_eq!(r.final_text, "One more thing.");
    assert_eq!(server.request_count(), 2);
    assert_eq!(repo.read("late.txt"), None);
}

#[tokio::test]
async fn a_length_stop_is_continued_up_to_the_bound() {
    for kind in KINDS {
        let repo = Repo::new();
        let server = ScriptedLlm::start(kind, move |req| {
            ScriptedReply::text(format!("part {}", req.n)).stop(length_reason(kind))
        });
        let cfg = SessionConfig {
            max_continuations: 2,
            ..config()
        };
        let (r, _) = session(&server, true, &repo, &cfg).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Length, "{what}");
        assert_eq!(r.final_text, "part 2", "{what}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3, "{what}: 1 request + 2 continuations");
        assert_eq!(reqs[0].last_user_text(), STORY, "{what}");
        for (n, req) in reqs.iter().enumerate().skip(1) {
            assert!(
                req.last_user_text().contains("cut off by the output limit"),
                "{what}: {}",
                req.last_user_text()
            );
            // The cut-off text is replayed so the model can go on from it.
            assert!(
                req.body_text().contains(&format!("part {}", n - 1)),
                "{what}: {}",
                req.body
            );
            assert_eq!(req.tool_names(), ALL_TOOLS, "{what}");
        }

        // Continued once, then finished normally.
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::text("The first half").stop(length_reason(kind)),
                ScriptedReply::text("and the second half."),
            ],
        );
        let (r, _) = session(&server, false, &repo, &cfg).await;
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        assert_eq!(r.final_text, "and the second half.", "{what}");
        assert_eq!(server.request_count(), 2, "{what}");
    }
}

#[tokio::test]
async fn content_filter_and_refusal_end_the_session_with_that_reason() {
    let repo = Repo::new();
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![ScriptedReply::text("Here is how to").stop("content_filter")],
    );
    let (r, _) = session(&server, true, &repo, &config()).await;
    assert_eq!(r.end, SessionEnd::ContentFilter);
    assert_eq!(r.final_text, "Here is how to");
    assert_eq!(server.request_count(), 1);

    for kind in KINDS {
        for stream in [true, false] {
            let server = ScriptedLlm::sequence(
                kind,
                vec![ScriptedReply::refusal("I can't help with that request.")],
            );
            let (r, _) = session(&server, stream, &repo, &config()).await;
            let what = format!("{kind:?} stream={stream}");
            assert_eq!(r.end, SessionEnd::Refusal, "{what}");
            assert!(
                r.final_text.contains("I can't help with that request."),
                "{what}: {}",
                r.final_text
            );
            assert_eq!(server.request_count(), 1, "{what}");
        }
    }
}

/// Budget: `context_window − max_tokens − tools/4` tokens, about 4 bytes a token. Each
/// `read_file` result here is about 800 tokens and the budget is 1400, so from the second
/// result on, old results are shortened; after about eight turns the oldest turns go.
#[tokio::test]
async fn shrinking_the_context_keeps_the_system_prompt_and_the_story() {
    const READS: usize = 10;
    for kind in KINDS {
        let repo = Repo::new();
        for i in 1..=READS {
            let line = format!("{}\n", char::from(b'a' + i as u8).to_string().repeat(99));
            repo.write(&format!("big{i}.txt"), &line.repeat(30));
        }
        let server = ScriptedLlm::start(kind, |req| {
            if req.n < READS {
                ScriptedReply::tool_calls(vec![(
                    "read_file",
                    json!({"path": format!("big{}.txt", req.n + 1)}),
                )])
            } else {
                ScriptedReply::text("Read them all.")
            }
        });
        let tools = ralph::native::tool_specs(&ToolRegistry::standard())
            .into_iter()
            .filter(|t| t.name == "read_file")
            .collect::<Vec<_>>();
        let tools_tokens = serde_json::to_string(&tools).unwrap().len() / 4;
        let cfg = SessionConfig {
            allowed_tools: Some(vec!["read_file".into()]),
            max_tokens: 256,
            context_window: (256 + tools_tokens + 1400) as u32,
            ..config()
        };
        let (r, events) = session(&server, true, &repo, &cfg).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), READS + 1, "{what}");
        let shortened = "bytes of this old tool result were removed to save context";
        for req in &reqs {
            assert_eq!(req.system_text(), SYSTEM, "{what}: request {}", req.n);
            assert_eq!(first_user_text(req), STORY, "{what}: request {}", req.n);
            assert_calls_and_results_paired(req);
            let results = req.tool_results();
            if let Some((_, latest, _)) = results.last() {
                assert!(!latest.contains(shortened), "{what}: request {}", req.n);
                assert!(latest.len() > 3000, "{what}: request {}", req.n);
            }
        }
        // From the second result on, the older ones are shortened, the latest is whole.
        let second = reqs[2].tool_results();
        assert_eq!(second.len(), 2, "{what}");
        assert!(second[0].1.contains(shortened), "{what}: {}", second[0].1);
        // Later, whole old turns are dropped and a note says so.
        let last = &reqs[READS];
        assert!(
            last.tool_results().len() < READS,
            "{what}: no turn was dropped"
        );
        assert!(
            last.body_text().contains("earlier messages were removed"),
            "{what}"
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, AgentEvent::AssistantText { text }
                if text.contains("context near the window"))),
            "{what}"
        );
    }
}

#[tokio::test]
async fn tool_errors_the_model_can_fix_go_back_as_error_results() {
    for kind in KINDS {
        let repo = Repo::new();
        repo.write("hello.txt", "hello\n");
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::tool_calls(vec![(
                    "edit_file",
                    json!({"path": "hello.txt", "old_string": "goodbye", "new_string": "hi"}),
                )]),
                ScriptedReply::tool_calls(vec![
                    ("delete_everything", json!({})),
                    ("read_file", json!({"path": "../outside.txt"})),
                ]),
                ScriptedReply::tool_call_raw("write_file", r#"{"path": "a.txt", "#),
                ScriptedReply::text("I could not do it."),
            ],
        );
        let (r, events) = session(&server, true, &repo, &config()).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 4, "{what}");
        let results = reqs[3].tool_results();
        assert_eq!(
            ids(&results),
            [
                scripted_call_id(kind, 0, 0),
                scripted_call_id(kind, 1, 0),
                scripted_call_id(kind, 1, 1),
                scripted_call_id(kind, 2, 0)
            ],
            "{what}"
        );
        assert!(
            results.iter().all(|(_, _, error)| *error),
            "{what}: {results:?}"
        );
        assert!(results[0].1.contains("old_string was not found"), "{what}");
        assert!(
            results[1].1.contains("unknown tool `delete_everything`"),
            "{what}: {}",
            results[1].1
        );
        assert!(results[2].1.contains("outside the repository"), "{what}");
        assert!(
            results[3].1.contains("invalid arguments for `write_file`"),
            "{what}: {}",
            results[3].1
        );
        assert_eq!(repo.read("hello.txt").as_deref(), Some("hello\n"), "{what}");
        let flags: Vec<bool> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::ToolResult { is_error, .. } => Some(*is_error),
                _ => None,
            })
            .collect();
        assert_eq!(flags, [true; 4], "{what}");
    }
}

#[tokio::test]
async fn auth_and_quota_errors_end_the_session_after_one_request() {
    for kind in KINDS {
        let repo = Repo::new();
        let cases = [
            (
                ScriptedReply::api_error(401, "authentication_error", "invalid x-api-key"),
                "auth",
            ),
            (
                ScriptedReply::api_error(429, "insufficient_quota", "You exceeded your quota."),
                "quota",
            ),
        ];
        for (reply, class) in cases {
            let server = ScriptedLlm::start(kind, move |_| reply.clone());
            let (r, events) = session(&server, true, &repo, &config()).await;
            let what = format!("{kind:?} {class}");
            match &r.end {
                SessionEnd::Error { class: got, .. } => assert_eq!(got, class, "{what}"),
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(r.requests, 1, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(server.request_count(), 1, "{what}: retried");
            assert!(
                events.iter().any(|e| matches!(e, AgentEvent::Error { .. })),
                "{what}"
            );
        }
    }
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_and_the_session_goes_on() {
    for kind in KINDS {
        let repo = Repo::new();
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::api_error(429, "rate_limit_error", "slow down")
                    .with_header("retry-after", "1"),
                ScriptedReply::tool_calls(vec![(
                    "write_file",
                    json!({"path": "hello.txt", "content": "hi\n"}),
                )]),
                ScriptedReply::text("Done."),
            ],
        );
        let (r, _) = session(&server, true, &repo, &config()).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        assert_eq!(r.requests, 2, "{what}: retries are not counted as requests");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3, "{what}");
        let gap = reqs[1].at - reqs[0].at;
        assert!(
            gap >= Duration::from_secs(1),
            "{what}: retried after {gap:?}"
        );
        assert_eq!(
            reqs[0].body, reqs[1].body,
            "{what}: the retry is the same request"
        );
        assert_eq!(
            ids(&reqs[2].tool_results()),
            [scripted_call_id(kind, 1, 0)],
            "{what}"
        );
        assert_eq!(repo.read("hello.txt").as_deref(), Some("hi\n"), "{what}");
    }
}

#[tokio::test]
async fn cancelling_drops_the_in_flight_request_at_once() {
    for (kind, stream) in [
        (ProviderKind::Openai, true),
        (ProviderKind::Anthropic, false),
    ] {
        let repo = Repo::new();
        let server = ScriptedLlm::start(kind, |_| ScriptedReply::hang());
        let cancel = CancellationToken::new();
        let cfg = config();
        let (r, cancelled_at) =
            tokio::join!(session_with(&server, stream, &repo, &cfg, &cancel), async {
                assert!(server.wait_requests(1, Duration::from_secs(5)).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
                cancel.cancel();
                Instant::now()
            });
        let took = cancelled_at.elapsed();
        let what = format!("{kind:?}");
        assert_eq!(r.0.end, SessionEnd::Cancelled, "{what}");
        assert!(took < Duration::from_secs(1), "{what}: took {took:?}");
        assert!(
            server.wait_hangs_closed(1, Duration::from_secs(3)).await,
            "{what}: the server never saw the connection close"
        );
        assert_eq!(server.request_count(), 1, "{what}");
    }
}

#[tokio::test]
async fn cancelling_kills_a_running_command_and_its_group() {
    let repo = Repo::new();
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![ScriptedReply::tool_calls(vec![(
            "run_command",
            json!({"command": "echo $$ > cmd.pid; sleep 30; echo survived > survived.txt"}),
        )])],
    );
    let cancel = CancellationToken::new();
    let cfg = config();
    let pid_file = repo.root().join("cmd.pid");
    let (r, (cancelled_at, pgid)) =
        tokio::join!(session_with(&server, true, &repo, &cfg, &cancel), async {
            let end = Instant::now() + Duration::from_secs(10);
            let pgid = loop {
                let pid = fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok());
                if let Some(pid) = pid {
                    break pid;
                }
                assert!(Instant::now() < end, "the command never started");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
            (Instant::now(), pgid)
        });
    let took = cancelled_at.elapsed();
    assert_eq!(r.0.end, SessionEnd::Cancelled);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(server.request_count(), 1);
    let end = Instant::now() + Duration::from_secs(2);
    while group_has_live_members(pgid) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !group_has_live_members(pgid),
        "the command's process group {pgid} outlived the cancel"
    );
    assert_eq!(repo.read("survived.txt"), None);
}

#[tokio::test]
async fn tool_calls_written_as_text_are_run_with_ids_unique_in_the_session() {
    for kind in KINDS {
        let repo = Repo::new();
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::text(
                    "I will create the file.\n```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"hello.txt\", \"content\": \"hi\\n\"}}\n```",
                ),
                ScriptedReply::text(
                    "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"hello.txt\"}}\n</tool_call>",
                ),
                ScriptedReply::text("Done: hello.txt says hi."),
            ],
        );
        let (r, events) = session(&server, false, &repo, &config()).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        assert_eq!(r.final_text, "Done: hello.txt says hi.", "{what}");
        assert_eq!(r.steps, 2, "{what}");
        assert_eq!(repo.read("hello.txt").as_deref(), Some("hi\n"), "{what}");
        assert_eq!(
            tool_call_names(&events),
            ["write_file", "read_file"],
            "{what}"
        );
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3, "{what}");
        for req in &reqs {
            assert_calls_and_results_paired(req);
        }
        let results = reqs[2].tool_results();
        assert_eq!(results.len(), 2, "{what}");
        assert!(results[1].1.contains("hi"), "{what}: {}", results[1].1);
        assert_ne!(
            results[0].0, results[1].0,
            "{what}: two calls of one session share an id"
        );
    }
}

#[tokio::test]
async fn json_tool_mode_asks_for_a_schema_and_runs_the_reply() {
    let repo = Repo::new();
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(
                r#"{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi\n"}}"#,
            ),
            ScriptedReply::text(
                r#"{"name": "final_answer", "arguments": {"text": "Wrote hello.txt."}}"#,
            ),
        ],
    );
    let cfg = SessionConfig {
        tool_mode: ToolMode::Json,
        ..config()
    };
    let (r, _) = session(&server, true, &repo, &cfg).await;
    assert_eq!(r.end, SessionEnd::Completed);
    assert_eq!(r.final_text, "Wrote hello.txt.");
    assert_eq!(repo.read("hello.txt").as_deref(), Some("hi\n"));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    for req in &reqs {
        assert!(req.body.get("tools").is_none(), "{}", req.body);
        assert_eq!(req.body["response_format"]["type"], "json_schema");
        assert!(req.system_text().starts_with(SYSTEM));
    }
    let texts = reqs[1].user_texts();
    let last = texts.last().unwrap();
    assert!(last.contains("Result of write_file"), "{last}");
    assert!(last.contains("What is the next action?"), "{last}");

    // The final round after the step limit asks for plain text: no schema, no tools.
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(r#"{"name": "read_file", "arguments": {"path": "hello.txt"}}"#),
            ScriptedReply::text("Summary: I read hello.txt."),
        ],
    );
    let cfg = SessionConfig {
        tool_mode: ToolMode::Json,
        max_steps: 1,
        ..config()
    };
    let (r, _) = session(&server, false, &repo, &cfg).await;
    assert_eq!(r.end, SessionEnd::StepLimit);
    assert_eq!(r.final_text, "Summary: I read hello.txt.");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].body.get("response_format").is_some());
    assert!(
        reqs[1].body.get("response_format").is_none(),
        "{}",
        reqs[1].body
    );
    assert!(reqs[1].body.get("tools").is_none());
}

#[tokio::test]
async fn secrets_in_tool_output_never_reach_the_model() {
    for kind in KINDS {
        let repo = Repo::new();
        // As if the command read the key from ralph's own environment.
        repo.write("leak.txt", "key=sk-test-secret-0123456789\n");
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::tool_calls(vec![(
                    "run_command",
                    json!({"command": "cat leak.txt"}),
                )]),
                ScriptedReply::text("done"),
            ],
        );
        let cfg = SessionConfig {
            redact: vec!["sk-test-secret-0123456789".into()],
            mark_protocol: false,
            ..config()
        };
        let (r, _) = session(&server, false, &repo, &cfg).await;
        let what = format!("{kind:?}");
        assert_eq!(r.end, SessionEnd::Completed, "{what}");
        let body = server.requests()[1].body.to_string();
        assert!(
            !body.contains("sk-test-secret-0123456789"),
            "{what}: the key reached the model"
        );
        assert!(body.contains("key=[REDACTED]"), "{what}: {body}");
    }
}
