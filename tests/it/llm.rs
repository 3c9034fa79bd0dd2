//! The native loop's LLM clients against the scripted server (`support_llm`): what goes on the
//! wire for both APIs, streaming and not, and which failures are retried.

use std::time::{Duration, Instant};

use ralph::native::llm::{
    complete_with_retry, ChatRequest, LlmError, Message, Provider, RetryPolicy, Role, StopReason,
    ToolCall, ToolSpec,
};
use ralph::protocol::{ProviderKind, ToolMode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::support_llm::{scripted_call_id, ScriptedLlm, ScriptedReply, SCRIPTED_API_KEY};

const KINDS: [ProviderKind; 2] = [ProviderKind::Openai, ProviderKind::Anthropic];

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "write_file".into(),
            description: "Write a file.".into(),
            parameters: json!({"type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}),
        },
        ToolSpec {
            name: "run_command".into(),
            description: "Run a shell command.".into(),
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"}},
                               "required": ["command"]}),
        },
    ]
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "test-model".into(),
        messages: vec![
            Message::text(Role::System, "You are a coding agent."),
            Message::text(Role::User, "Implement story US-001."),
        ],
        tools: tools(),
        max_tokens: 256,
        temperature: Some(0.0),
        seed: Some(42),
        tool_mode: ToolMode::Native,
        answer_schema: None,
    }
}

/// Retries fast unless the server says otherwise.
fn quick() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base: Duration::from_millis(10),
        cap: Duration::from_secs(10),
    }
}

fn provider(server: &ScriptedLlm, stream: bool) -> Provider {
    Provider::new(server.config(stream)).expect("client builds")
}

#[tokio::test]
async fn streaming_text_with_auth_headers_usage_and_model() {
    for kind in KINDS {
        let server = ScriptedLlm::start(kind, |_| {
            ScriptedReply::text("Hello from a streamed answer, in many pieces.").usage(120, 9)
        });
        let r = provider(&server, true).complete(&request()).await.unwrap();
        assert_eq!(
            r.content, "Hello from a streamed answer, in many pieces.",
            "{kind:?}"
        );
        assert_eq!(r.stop, StopReason::EndTurn);
        assert!(r.tool_calls.is_empty());
        assert_eq!(
            (r.usage.input_tokens, r.usage.output_tokens),
            (120, 9),
            "{kind:?}"
        );
        assert_eq!(r.model.as_deref(), Some("test-model"));

        let req = &server.requests()[0];
        assert!(req.is_stream());
        assert_eq!(req.tool_names(), ["write_file", "run_command"]);
        match kind {
            ProviderKind::Openai => {
                assert_eq!(req.path, "/v1/chat/completions");
                assert_eq!(
                    req.header("authorization"),
                    Some(format!("Bearer {SCRIPTED_API_KEY}").as_str())
                );
                assert_eq!(req.body["stream_options"], json!({"include_usage": true}));
                assert_eq!(req.body["seed"], json!(42));
                assert_eq!(req.messages()[0]["role"], json!("system"));
            }
            ProviderKind::Anthropic => {
                assert_eq!(req.path, "/v1/messages");
                assert_eq!(req.header("x-api-key"), Some(SCRIPTED_API_KEY));
                assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
                assert_eq!(req.body["system"], json!("You are a coding agent."));
                assert_eq!(
                    req.messages().len(),
                    1,
                    "the system prompt is not a message"
                );
            }
        }
        assert_eq!(req.system_text(), "You are a coding agent.");
    }
}

#[tokio::test]
async fn streamed_tool_calls_assemble_and_results_carry_their_ids() {
    for kind in KINDS {
        let server = ScriptedLlm::start(kind, |req| {
            if req.tool_results().is_empty() {
                ScriptedReply::tool_calls(vec![
                    (
                        "write_file",
                        json!({"path": "hello.txt", "content": "hi \"there\" {}"}),
                    ),
                    ("run_command", json!({"command": "cat hello.txt"})),
                ])
                .with_text("Writing it.")
            } else {
                ScriptedReply::text("Done.")
            }
        });
        let provider = provider(&server, true);
        let mut req = request();
        let r = provider.complete(&req).await.unwrap();
        assert_eq!(r.stop, StopReason::ToolCalls, "{kind:?}");
        assert_eq!(r.content, "Writing it.");
        let expect = vec![
            ToolCall {
                id: scripted_call_id(kind, 0, 0),
                name: "write_file".into(),
                arguments: json!({"path": "hello.txt", "content": "hi \"there\" {}"}),
            },
            ToolCall {
                id: scripted_call_id(kind, 0, 1),
                name: "run_command".into(),
                arguments: json!({"command": "cat hello.txt"}),
            },
        ];
        assert_eq!(r.tool_calls, expect, "{kind:?}");

        let mut assistant = Message::text(Role::Assistant, r.content.clone());
        assistant.tool_calls = r.tool_calls.clone();
        req.messages.push(assistant);
        req.messages
            .push(Message::tool_result(&expect[0].id, "wrote 14 bytes", false));
        req.messages
            .push(Message::tool_result(&expect[1].id, "exit 1", true));
        let done = provider.complete(&req).await.unwrap();
        assert_eq!(done.content, "Done.");

        let second = &server.requests()[1];
        let results = second.tool_results();
        let ids: Vec<&str> = results.iter().map(|(id, _, _)| id.as_str()).collect();
        assert_eq!(
            ids,
            [expect[0].id.as_str(), expect[1].id.as_str()],
            "{kind:?}"
        );
        assert!(
            !results[0].2 && results[1].2,
            "the failed tool is flagged: {results:?}"
        );
        let replayed: Vec<(String, String, Value)> = second.tool_calls();
        assert_eq!(replayed[0].0, expect[0].id);
        assert_eq!(replayed[0].2, expect[0].arguments);
        if kind == ProviderKind::Anthropic {
            // Both results share one user turn, right after the assistant's tool_use turn.
            assert_eq!(second.messages().len(), 3);
        }
    }
}

#[tokio::test]
async fn non_streaming_requests_and_replies() {
    for kind in KINDS {
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::tool_calls(vec![("run_command", json!({"command": "ls"}))]),
                ScriptedReply::text("All good."),
            ],
        );
        let provider = provider(&server, false);
        let r = provider.complete(&request()).await.unwrap();
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].id, scripted_call_id(kind, 0, 0));
        assert_eq!(r.tool_calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(r.stop, StopReason::ToolCalls);
        let r = provider.complete(&request()).await.unwrap();
        assert_eq!(
            (r.content.as_str(), r.stop),
            ("All good.", StopReason::EndTurn)
        );
        assert!(server
            .requests()
            .iter()
            .all(|r| r.body.get("stream").is_none()));
    }
}

#[tokio::test]
async fn stop_reasons_length_filter_and_refusal() {
    let cases = [
        (
            ProviderKind::Openai,
            ScriptedReply::text("cut").stop("length"),
            StopReason::Length,
        ),
        (
            ProviderKind::Openai,
            ScriptedReply::text("").stop("content_filter"),
            StopReason::ContentFilter,
        ),
        (
            ProviderKind::Openai,
            ScriptedReply::refusal("I won't."),
            StopReason::Refusal,
        ),
        (
            ProviderKind::Anthropic,
            ScriptedReply::text("cut").stop("max_tokens"),
            StopReason::Length,
        ),
        (
            ProviderKind::Anthropic,
            ScriptedReply::refusal("I won't."),
            StopReason::Refusal,
        ),
    ];
    for (kind, reply, stop) in cases {
        for stream in [true, false] {
            let server = ScriptedLlm::sequence(kind, vec![reply.clone()]);
            let r = provider(&server, stream)
                .complete(&request())
                .await
                .unwrap();
            assert_eq!(r.stop, stop, "{kind:?} stream={stream}");
            if stop == StopReason::Refusal {
                assert_eq!(r.content, "I won't.");
            }
        }
    }
}

#[tokio::test]
async fn invalid_tool_arguments_are_kept_raw() {
    for stream in [true, false] {
        let server = ScriptedLlm::sequence(
            ProviderKind::Openai,
            vec![ScriptedReply::tool_call_raw(
                "run_command",
                "{\"command\": \"ls",
            )],
        );
        let r = provider(&server, stream)
            .complete(&request())
            .await
            .unwrap();
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"_raw": "{\"command\": \"ls"})
        );
    }
}

#[tokio::test]
async fn a_429_with_retry_after_2_is_retried_no_sooner_than_2_s_later() {
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::api_error(429, "rate_limit_exceeded", "Rate limit reached")
                .with_header("retry-after", "2"),
            ScriptedReply::text("ok"),
        ],
    );
    let mut waits = Vec::new();
    let r = complete_with_retry(
        &provider(&server, true),
        &request(),
        &quick(),
        |e, n, wait| waits.push((e.clone(), n, wait)),
    )
    .await
    .unwrap();
    assert_eq!(r.content, "ok");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let gap = reqs[1].at - reqs[0].at;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(4), "waited far too long: {gap:?}");
    assert_eq!(waits.len(), 1);
    assert!(matches!(
        waits[0].0,
        LlmError::Transient {
            status: Some(429),
            retry_after: Some(d),
            ..
        } if d == Duration::from_secs(2)
    ));
    assert_eq!(waits[0].1, 1);
}

#[tokio::test]
async fn retry_after_ms_is_honoured() {
    let server = ScriptedLlm::sequence(
        ProviderKind::Anthropic,
        vec![
            ScriptedReply::api_error(529, "overloaded_error", "Overloaded")
                .with_header("retry-after-ms", "400"),
            ScriptedReply::text("ok"),
        ],
    );
    let r = complete_with_retry(&provider(&server, true), &request(), &quick(), |_, _, _| {})
        .await
        .unwrap();
    assert_eq!(r.content, "ok");
    let reqs = server.requests();
    let gap = reqs[1].at - reqs[0].at;
    assert!(gap >= Duration::from_millis(400), "retried after {gap:?}");
}

/// Sends with retries and returns the error and how many requests the server saw.
async fn fails_with(kind: ProviderKind, reply: ScriptedReply) -> (LlmError, usize) {
    let server = ScriptedLlm::start(kind, move |_| reply.clone());
    let e = complete_with_retry(&provider(&server, true), &request(), &quick(), |_, _, _| {})
        .await
        .unwrap_err();
    (e, server.request_count())
}

#[tokio::test]
async fn auth_quota_context_and_other_4xx_are_not_retried() {
    for kind in KINDS {
        let (e, n) = fails_with(
            kind,
            ScriptedReply::api_error(401, "authentication_error", "invalid x-api-key"),
        )
        .await;
        assert!(matches!(e, LlmError::Auth { status: 401, .. }), "{e:?}");
        assert_eq!(n, 1, "{kind:?}: a 401 is sent once");

        let (e, n) = fails_with(
            kind,
            ScriptedReply::api_error(404, "not_found_error", "model"),
        )
        .await;
        assert!(
            matches!(e, LlmError::BadRequest { status: 404, .. }),
            "{e:?}"
        );
        assert_eq!(n, 1);
    }
    let (e, n) = fails_with(
        ProviderKind::Openai,
        ScriptedReply::api_error(429, "insufficient_quota", "You exceeded your current quota")
            .with_header("retry-after", "1"),
    )
    .await;
    assert!(matches!(e, LlmError::Quota { .. }), "{e:?}");
    assert_eq!(n, 1, "insufficient_quota is never retried");

    let (e, n) = fails_with(
        ProviderKind::Anthropic,
        ScriptedReply::api_error(
            400,
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API.",
        ),
    )
    .await;
    assert!(matches!(e, LlmError::Quota { .. }), "{e:?}");
    assert_eq!(n, 1);

    let (e, n) = fails_with(
        ProviderKind::Openai,
        ScriptedReply::status(
            400,
            r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            &[],
        ),
    )
    .await;
    assert!(matches!(e, LlmError::ContextLength { .. }), "{e:?}");
    assert_eq!(n, 1);

    let (e, n) = fails_with(
        ProviderKind::Anthropic,
        ScriptedReply::api_error(
            400,
            "invalid_request_error",
            "prompt is too long: 215000 tokens > 200000 maximum",
        ),
    )
    .await;
    assert!(matches!(e, LlmError::ContextLength { .. }), "{e:?}");
    assert_eq!(n, 1);
}

#[tokio::test]
async fn server_errors_are_retried_until_success_or_attempts_run_out() {
    for kind in KINDS {
        let server = ScriptedLlm::sequence(
            kind,
            vec![
                ScriptedReply::api_error(500, "api_error", "Internal server error"),
                ScriptedReply::status(503, "upstream unavailable", &[]),
                ScriptedReply::text("recovered"),
            ],
        );
        let mut retries = Vec::new();
        let r = complete_with_retry(
            &provider(&server, false),
            &request(),
            &quick(),
            |e, n, _| retries.push((n, e.to_string())),
        )
        .await
        .unwrap();
        assert_eq!(r.content, "recovered");
        assert_eq!(server.request_count(), 3);
        assert_eq!(retries.len(), 2);
        assert!(retries[1].1.contains("HTTP 503"), "{retries:?}");
    }
    let server = ScriptedLlm::start(ProviderKind::Openai, |_| {
        ScriptedReply::status(502, "bad gateway", &[])
    });
    let policy = RetryPolicy {
        max_attempts: 3,
        ..quick()
    };
    let e = complete_with_retry(&provider(&server, true), &request(), &policy, |_, _, _| {})
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        LlmError::Transient {
            status: Some(502),
            ..
        }
    ));
    assert_eq!(
        server.request_count(),
        3,
        "max_attempts counts every request"
    );
}

#[tokio::test]
async fn dropped_and_truncated_streams_are_retried() {
    for kind in KINDS {
        for broken in [
            ScriptedReply::drop_stream("I will now wri"),
            ScriptedReply::truncated_stream("I will now wri"),
            ScriptedReply::stream_error("Partial", "overloaded_error", "Overloaded"),
        ] {
            let server =
                ScriptedLlm::sequence(kind, vec![broken.clone(), ScriptedReply::text("whole")]);
            let provider = provider(&server, true);
            let e = provider.complete(&request()).await.unwrap_err();
            assert!(e.is_retryable(), "{kind:?} {broken:?}: {e:?}");
            let r = complete_with_retry(&provider, &request(), &quick(), |_, _, _| {})
                .await
                .unwrap();
            assert_eq!(r.content, "whole", "{kind:?} {broken:?}");
        }
    }
    // A dropped non-streaming body is a transport failure too.
    let server = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::drop_stream("half"),
            ScriptedReply::text("whole"),
        ],
    );
    let r = complete_with_retry(
        &provider(&server, false),
        &request(),
        &quick(),
        |_, _, _| {},
    )
    .await
    .unwrap();
    assert_eq!(r.content, "whole");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn a_server_that_cannot_stream_gets_non_streaming_requests() {
    for kind in KINDS {
        let server = ScriptedLlm::start(kind, |req| {
            if req.is_stream() {
                ScriptedReply::api_error(
                    400,
                    "invalid_request_error",
                    "Streaming is not supported by this server",
                )
            } else {
                ScriptedReply::text("plain")
            }
        });
        let provider = provider(&server, true);
        assert_eq!(
            provider.complete(&request()).await.unwrap().content,
            "plain"
        );
        assert_eq!(
            provider.complete(&request()).await.unwrap().content,
            "plain"
        );
        let streams: Vec<bool> = server.requests().iter().map(|r| r.is_stream()).collect();
        assert_eq!(
            streams,
            [true, false, false],
            "{kind:?}: falls back once, then stays"
        );
    }
}

#[tokio::test]
async fn json_tool_mode_sends_a_schema_and_turns_the_reply_into_a_call() {
    let server = ScriptedLlm::start(ProviderKind::Openai, |req| {
        if req
            .user_texts()
            .iter()
            .any(|t| t.contains("Result of write_file"))
        {
            ScriptedReply::text(r#"{"name": "final_answer", "arguments": {"text": "Created it."}}"#)
        } else {
            ScriptedReply::text(
                r#"{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi"}}"#,
            )
        }
    });
    let provider = provider(&server, false);
    let mut req = request();
    req.tool_mode = ToolMode::Json;
    let r = provider.complete(&req).await.unwrap();
    assert_eq!(r.stop, StopReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert!(
        r.tool_calls[0].id.starts_with("json-"),
        "{:?}",
        r.tool_calls[0]
    );
    assert_eq!(r.tool_calls[0].name, "write_file");
    assert_eq!(
        r.tool_calls[0].arguments,
        json!({"path": "hello.txt", "content": "hi"})
    );

    let sent = &server.requests()[0];
    assert!(sent.body.get("tools").is_none(), "JSON mode sends no tools");
    let format = &sent.body["response_format"];
    assert_eq!(format["type"], json!("json_schema"));
    let names: Vec<&str> = format["json_schema"]["schema"]["anyOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["properties"]["name"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["write_file", "run_command", "final_answer"]);
    assert!(sent.system_text().contains("- write_file: Write a file."));

    let mut assistant = Message::text(Role::Assistant, r.content.clone());
    assistant.tool_calls = r.tool_calls.clone();
    req.messages.push(assistant);
    req.messages.push(Message::tool_result(
        &r.tool_calls[0].id,
        "wrote 2 bytes",
        false,
    ));
    let done = provider.complete(&req).await.unwrap();
    assert_eq!(
        (done.content.as_str(), done.stop),
        ("Created it.", StopReason::EndTurn)
    );
    assert!(done.tool_calls.is_empty());
}

#[tokio::test]
async fn cancelling_drops_the_in_flight_request_at_once() {
    for kind in KINDS {
        for stream in [true, false] {
            let server = ScriptedLlm::start(kind, |_| ScriptedReply::hang());
            let provider = provider(&server, stream);
            let token = CancellationToken::new();
            let canceller = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                canceller.cancel();
            });
            let started = Instant::now();
            let req = request();
            let policy = RetryPolicy::default();
            tokio::select! {
                r = complete_with_retry(&provider, &req, &policy, |_, _, _| {}) => {
                    panic!("a hung server answered: {r:?}")
                }
                _ = token.cancelled() => {}
            }
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(1),
                "{kind:?}: cancel took {took:?}"
            );
            assert!(
                server.wait_hangs_closed(1, Duration::from_secs(3)).await,
                "{kind:?} stream={stream}: the server never saw the connection close"
            );
            assert_eq!(server.request_count(), 1);
        }
    }
}

#[tokio::test]
async fn the_api_key_never_shows_in_debug_or_errors() {
    for kind in KINDS {
        // A server that echoes the key back in its error message.
        let server = ScriptedLlm::start(kind, |_| {
            ScriptedReply::api_error(
                401,
                "invalid_api_key",
                &format!("Incorrect API key provided: {SCRIPTED_API_KEY}"),
            )
        });
        let provider = provider(&server, true);
        assert!(!format!("{provider:?}").contains(SCRIPTED_API_KEY));
        assert!(!format!("{:?}", server.config(true)).contains(SCRIPTED_API_KEY));
        let e = provider.complete(&request()).await.unwrap_err();
        assert!(matches!(e, LlmError::Auth { .. }));
        assert!(!e.to_string().contains(SCRIPTED_API_KEY), "{e}");
        assert!(!format!("{e:?}").contains(SCRIPTED_API_KEY), "{e:?}");
    }
    // Nor in a transport error.
    let config = ralph::native::llm::ProviderConfig {
        kind: ProviderKind::Openai,
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: Some(SCRIPTED_API_KEY.into()),
        stream: true,
        request_timeout: Duration::from_secs(5),
    };
    let e = Provider::new(config)
        .unwrap()
        .complete(&request())
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "a refused connection is transient: {e:?}");
    assert!(!format!("{e:?}").contains(SCRIPTED_API_KEY));
}
