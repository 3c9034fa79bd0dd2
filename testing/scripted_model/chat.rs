//! The OpenAI Chat Completions API as OpenCode 1.18.33 uses it (`notes/real-clis.md` §3, through
//! its bundled `@ai-sdk/openai-compatible` provider): `POST /v1/chat/completions` with
//! `stream: true`, answered with a `text/event-stream` of `chat.completion.chunk` objects
//! (`data: {…}` lines) ending with a usage chunk and `data: [DONE]`; errors in OpenAI's envelope
//! `{"error":{"message","type","param","code"}}`.
//!
//! Conversation state: the story from the first `role:"user"` message, the repository from
//! [`find_repo`] over every string of the request (ralph's prompt names it) or else opencode's
//! own `<env>` line `Working directory: <path>`, the step from the number of `role:"tool"`
//! messages. A request without `tools` is opencode's title request, a side request answered with
//! a short text that consumes no step. Portable steps become opencode's `write`
//! (`{filePath, content}`, an absolute path) and `bash` (`{command}`: the only properties its
//! 1.18.33 schema declares are `command`, `timeout` and `workdir`, so a scenario's description
//! is not sent).

use serde_json::{json, Value};

use crate::anthropic::chunks;
use crate::scenario::{
    after_marker, find_repo, find_story, strings, Call, Conversation, ErrorReply, Turn,
};
use crate::{Rendered, Wire};

/// The title the side request gets: short, one line, like a title model's answer.
const TITLE: &str = "Scripted ralph session";

/// The Chat Completions protocol.
pub(crate) struct Chat;

impl Wire for Chat {
    fn conversation(&self, body: &Value) -> Conversation {
        read_conversation(body)
    }

    /// opencode's title request carries no `tools` (its main turns always do).
    fn side_reply(&self, body: &Value) -> Option<Turn> {
        let has_tools = body
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        (!has_tools).then(|| Turn::Final {
            text: TITLE.to_owned(),
            promise: false,
        })
    }

    fn render(&self, turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Rendered {
        Rendered::sse(render_sse(
            turn,
            model,
            &format!("chatcmpl-scripted-{n:06}"),
            &format!("call_scripted_{n:06}"),
            input_tokens,
        ))
    }

    fn error_body(&self, e: &ErrorReply) -> Value {
        let (default_type, default_code) = default_error(e.status);
        // A scenario's `type` names OpenAI's error kind, which is also its code in the cases
        // that matter to clients (`insufficient_quota`, `invalid_api_key`, ...).
        let (kind, code) = match &e.error_type {
            Some(t) => (t.clone(), Some(t.clone())),
            None => (default_type.to_owned(), default_code.map(str::to_owned)),
        };
        json!({"error": {"message": e.message, "type": kind, "param": null, "code": code}})
    }
}

/// OpenAI's `error.type` and `error.code` for an HTTP status.
fn default_error(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        403 => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
        ),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        500..=599 => ("server_error", None),
        _ => ("invalid_request_error", None),
    }
}

/// opencode's tool name and arguments for `call`.
fn tool(call: &Call) -> (String, Value) {
    match call {
        Call::Write { path, content } => (
            "write".to_owned(),
            json!({"filePath": path, "content": content}),
        ),
        Call::Shell { command, .. } => ("bash".to_owned(), json!({"command": command})),
        Call::Raw { name, input } => (name.clone(), input.clone()),
    }
}

/// Reads the conversation state from a Chat Completions request body.
fn read_conversation(body: &Value) -> Conversation {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let role = |m: &Value, r: &str| m.get("role").and_then(Value::as_str) == Some(r);
    let mut conv = Conversation {
        model: body.get("model").and_then(Value::as_str).map(str::to_owned),
        ..Conversation::default()
    };
    if let Some(first_user) = messages.iter().find(|m| role(m, "user")) {
        let mut texts = Vec::new();
        if let Some(content) = first_user.get("content") {
            strings(content, &mut texts);
        }
        conv.story = find_story(&texts);
        conv.user_text = texts.join("\n");
    }
    let mut texts = Vec::new();
    for m in messages {
        strings(m, &mut texts);
    }
    conv.repo = find_repo(&texts).or_else(|| {
        texts
            .iter()
            .find_map(|t| after_marker(t, "Working directory:"))
            .map(str::to_owned)
    });
    // Tool messages carry no error flag; opencode words a failed tool's result as text.
    conv.step = messages.iter().filter(|m| role(m, "tool")).count();
    conv
}

/// One `chat.completion.chunk` with a single choice.
fn chunk(id: &str, model: &str, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"id": id, "object": "chat.completion.chunk", "created": 1_767_225_600, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
}

/// Renders one streamed reply for a tool call or a final text: a role chunk, text deltas of at
/// most 64 bytes, for a tool call a first fragment with `id`/`type`/`name` and empty
/// `arguments` followed by argument pieces, the `finish_reason` chunk (`tool_calls` or `stop`),
/// a usage chunk with `choices: []`, and `[DONE]`. Token counts are deterministic byte/4
/// estimates.
fn render_sse(turn: &Turn, model: &str, id: &str, call_id: &str, input_tokens: u64) -> String {
    let mut data = vec![chunk(
        id,
        model,
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    let mut out_bytes = 0;
    let mut text = |data: &mut Vec<Value>, t: &str| {
        for piece in chunks(t) {
            data.push(chunk(id, model, json!({"content": piece}), None));
        }
        out_bytes += t.len();
    };
    let finish = match turn {
        Turn::Tool { call, text: before } => {
            if let Some(t) = before {
                text(&mut data, t);
            }
            let (name, input) = tool(call);
            data.push(chunk(
                id,
                model,
                json!({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]}),
                None,
            ));
            let arguments = input.to_string();
            for piece in chunks(&arguments) {
                data.push(chunk(
                    id,
                    model,
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
            out_bytes += arguments.len();
            "tool_calls"
        }
        Turn::Final { text: t, .. } => {
            text(&mut data, t);
            "stop"
        }
        // Errors are not streamed; see `Wire::error_body`.
        Turn::Error(_) => "stop",
    };
    data.push(chunk(id, model, json!({}), Some(finish)));
    let output_tokens = out_bytes as u64 / 4 + 1;
    data.push(
        json!({"id": id, "object": "chat.completion.chunk", "created": 1_767_225_600,
        "model": model, "choices": [],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                  "total_tokens": input_tokens + output_tokens}}),
    );
    let mut body = String::new();
    for d in data {
        body.push_str("data: ");
        body.push_str(&d.to_string());
        body.push_str("\n\n");
    }
    body.push_str("data: [DONE]\n\n");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A main-turn request shaped like opencode 1.18.33's: system prompt with its `<env>`
    /// block, ralph's prompt as the user message, `tool_results` assistant/tool pairs.
    fn request(prompt: &str, tool_results: usize) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You are opencode.\n<env>\n  Working directory: /w/env\n  Is directory a git repo: yes\n</env>"}),
            json!({"role": "user", "content": prompt}),
        ];
        for i in 0..tool_results {
            messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": format!("call_{i}"), "type": "function",
                 "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}));
            messages.push(
                json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "(no output)"}),
            );
        }
        json!({"model": "fake-model", "max_tokens": 32000, "stream": true,
               "stream_options": {"include_usage": true}, "tool_choice": "auto",
               "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
               "messages": messages})
    }

    #[test]
    fn reads_story_repo_and_step_from_the_conversation() {
        let prompt = "You are working in the git repository at `/w/repo`.\n\nStory ID: US-007\n";
        let conv = read_conversation(&request(prompt, 2));
        assert_eq!(conv.story.as_deref(), Some("US-007"));
        assert_eq!(
            conv.repo.as_deref(),
            Some("/w/repo"),
            "ralph's prompt first"
        );
        assert_eq!(conv.step, 2);
        assert_eq!(conv.model.as_deref(), Some("fake-model"));
        // Without ralph's line, opencode's own environment block names the directory.
        let conv = read_conversation(&request("Story ID: US-1", 0));
        assert_eq!(conv.repo.as_deref(), Some("/w/env"));
        assert_eq!(conv.step, 0);
    }

    /// The title request: no tools, a system prompt, then "Generate a title…" before the
    /// user's message. It is answered with plain text and is not a scripted step.
    #[test]
    fn title_request_is_a_side_request() {
        let title = json!({"model": "fake-model", "stream": true, "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": "Story ID: US-001"}]});
        assert_eq!(
            Chat.side_reply(&title),
            Some(Turn::Final {
                text: TITLE.into(),
                promise: false
            })
        );
        assert_eq!(Chat.side_reply(&request("Story ID: US-1", 1)), None);
    }

    /// Parses an SSE body back into its `data:` JSON values; checks the `[DONE]` end.
    fn chunks_of(body: &str) -> Vec<Value> {
        let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.last(), Some(&"data: [DONE]"));
        events[..events.len() - 1]
            .iter()
            .map(|e| {
                serde_json::from_str(e.strip_prefix("data: ").expect("data line")).expect("JSON")
            })
            .collect()
    }

    #[test]
    fn tool_call_streams_arguments_that_reassemble_to_opencodes_write_input() {
        let content = "é".repeat(100);
        let turn = Turn::Tool {
            call: Call::Write {
                path: "/w/repo/a.txt".into(),
                content: content.clone(),
            },
            text: Some("Writing.".into()),
        };
        let data = chunks_of(&render_sse(&turn, "m", "c1", "call_1", 10));
        let deltas: Vec<&Value> = data
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta"))
            .collect();
        let text: String = deltas
            .iter()
            .filter_map(|d| d["content"].as_str())
            .collect();
        assert_eq!(text, "Writing.");
        let fragments: Vec<&Value> = deltas
            .iter()
            .filter_map(|d| d.pointer("/tool_calls/0"))
            .collect();
        assert!(fragments.len() > 2, "arguments come in pieces");
        assert_eq!(fragments[0]["id"], "call_1");
        assert_eq!(fragments[0]["function"]["name"], "write");
        assert!(
            fragments[1].get("id").is_none(),
            "id only in the first fragment"
        );
        let arguments: String = fragments
            .iter()
            .filter_map(|f| f["function"]["arguments"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).expect("arguments are JSON"),
            json!({"filePath": "/w/repo/a.txt", "content": content})
        );
        let finish: Vec<&str> = data
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/finish_reason")
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(finish, ["tool_calls"]);
        let usage = data.last().expect("usage chunk");
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 10);
    }

    #[test]
    fn shell_becomes_bash_with_only_declared_arguments_and_final_text_stops() {
        let (name, input) = tool(&Call::Shell {
            command: "cd /w && ls".into(),
            description: Some("list".into()),
        });
        assert_eq!(name, "bash");
        assert_eq!(input, json!({"command": "cd /w && ls"}));

        let turn = Turn::Final {
            text: "Done.\n<promise>COMPLETE</promise>".into(),
            promise: true,
        };
        let data = chunks_of(&render_sse(&turn, "m", "c1", "call_1", 10));
        let text: String = data
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(text, "Done.\n<promise>COMPLETE</promise>");
        assert!(data
            .iter()
            .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("stop"))));
    }

    #[test]
    fn errors_use_openais_envelope() {
        assert_eq!(
            Chat.error_body(&ErrorReply::new(429, "Rate limit reached")),
            json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null,
                             "code": "rate_limit_exceeded"}})
        );
        let mut quota = ErrorReply::new(429, "You exceeded your current quota");
        quota.error_type = Some("insufficient_quota".into());
        assert_eq!(
            Chat.error_body(&quota)["error"]["code"],
            json!("insufficient_quota")
        );
        assert_eq!(
            Chat.error_body(&ErrorReply::new(401, "bad key"))["error"]["code"],
            json!("invalid_api_key")
        );
    }
}
