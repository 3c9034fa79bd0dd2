//! The Anthropic Messages API as Claude Code 2.1.332 uses it (`notes/real-clis.md` §1):
//! `POST /v1/messages` answered with a `text/event-stream` of `message_start`,
//! `content_block_*`, `message_delta` and `message_stop`; errors in the API's envelope
//! `{"type":"error","error":{"type","message"}}`.
//!
//! Conversation state: the story from the first user message, the repository from claude's
//! `Primary working directory:` line (a system block or a `role:"system"` message), the step from
//! the number of `tool_result` blocks. Portable steps become claude's `Write` (absolute
//! `file_path`) and `Bash` tools.

use serde_json::{json, Value};

use crate::scenario::{find_repo, find_story, strings, Call, Conversation, ErrorReply, Turn};
use crate::{Rendered, Wire};

/// Size of the pieces a text or tool input is streamed in, in bytes (the real API streams
/// small deltas; clients must concatenate them).
const DELTA_CHUNK_BYTES: usize = 64;

/// The Messages protocol.
pub(crate) struct Anthropic;

impl Wire for Anthropic {
    fn conversation(&self, body: &Value) -> Conversation {
        read_conversation(body)
    }

    fn render(&self, turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Rendered {
        let sse = render_sse(
            turn,
            model,
            &format!("msg_scripted_{n:06}"),
            &format!("toolu_scripted_{n:06}"),
            input_tokens,
        );
        Rendered::sse(sse)
    }

    fn error_body(&self, e: &ErrorReply) -> Value {
        let kind = e
            .error_type
            .clone()
            .unwrap_or_else(|| default_error_type(e.status).to_owned());
        json!({"type": "error", "error": {"type": kind, "message": e.message}})
    }
}

/// The Messages API's `error.type` for an HTTP status.
fn default_error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// Claude Code's tool name and input for `call`.
fn tool(call: &Call) -> (String, Value) {
    match call {
        Call::Write { path, content } => (
            "Write".to_owned(),
            json!({"file_path": path, "content": content}),
        ),
        Call::Shell {
            command,
            description,
        } => (
            "Bash".to_owned(),
            json!({"command": command, "description": description.as_deref().unwrap_or("Run a command")}),
        ),
        Call::Raw { name, input } => (name.clone(), input.clone()),
    }
}

/// Reads the conversation state from a Messages request body.
fn read_conversation(body: &Value) -> Conversation {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut conv = Conversation {
        model: body.get("model").and_then(Value::as_str).map(str::to_owned),
        ..Conversation::default()
    };
    if let Some(first_user) = messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    {
        let mut texts = Vec::new();
        if let Some(content) = first_user.get("content") {
            strings(content, &mut texts);
        }
        conv.story = find_story(&texts);
        conv.user_text = texts.join("\n");
    }
    let mut texts = Vec::new();
    if let Some(system) = body.get("system") {
        strings(system, &mut texts);
    }
    for m in messages {
        strings(m, &mut texts);
    }
    conv.repo = find_repo(&texts);
    for block in messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
    {
        conv.step += 1;
        let is_error = block.get("is_error").and_then(Value::as_bool) == Some(true);
        conv.last_tool_error = is_error.then(|| {
            let mut parts = Vec::new();
            if let Some(c) = block.get("content") {
                strings(c, &mut parts);
            }
            let text = parts.concat();
            text.chars().take(500).collect()
        });
    }
    conv
}

/// Splits `s` into pieces of at most [`DELTA_CHUNK_BYTES`] bytes on char boundaries.
pub(crate) fn chunks(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = rest.len().min(DELTA_CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (head, tail) = rest.split_at(end);
        out.push(head);
        rest = tail;
    }
    if out.is_empty() {
        out.push("");
    }
    out
}

/// Renders one streamed Messages reply (SSE `event:`/`data:` pairs) for a tool call or a final
/// text. `input_tokens` and the output token count are rough byte/4 estimates, deterministic.
fn render_sse(turn: &Turn, model: &str, msg_id: &str, tool_id: &str, input_tokens: u64) -> String {
    let mut events: Vec<(&str, Value)> = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    let mut index = 0;
    let mut out_bytes = 0;
    let mut text_block = |events: &mut Vec<(&str, Value)>, index: &mut usize, text: &str| {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": *index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in chunks(text) {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": *index,
                       "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": *index}),
        ));
        *index += 1;
        out_bytes += text.len();
    };
    let stop_reason = match turn {
        Turn::Tool { call, text } => {
            let (name, input) = tool(call);
            if let Some(t) = text {
                text_block(&mut events, &mut index, t);
            }
            let partial = input.to_string();
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}}),
            ));
            for piece in chunks(&partial) {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
            out_bytes += partial.len();
            "tool_use"
        }
        Turn::Final { text, .. } => {
            text_block(&mut events, &mut index, text);
            "end_turn"
        }
        // Errors are not streamed; see `Wire::error_body`.
        Turn::Error(_) => "end_turn",
    };
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": out_bytes as u64 / 4 + 1}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    let mut body = String::new();
    for (name, data) in events {
        body.push_str("event: ");
        body.push_str(name);
        body.push_str("\ndata: ");
        body.push_str(&data.to_string());
        body.push_str("\n\n");
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(story_line: &str, repo: &str, tool_results: usize) -> Value {
        let mut messages = vec![
            json!({"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": format!("Work on this.\n{story_line}\nTitle: x")}]}),
            json!({"role": "system", "content": format!("Here is env:\nPrimary working directory: {repo}\nIs git: yes")}),
        ];
        for i in 0..tool_results {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": format!("t{i}"), "name": "Bash", "input": {}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "boom", "is_error": true}]}));
        }
        json!({"model": "claude-x", "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages})
    }

    #[test]
    fn reads_story_repo_and_step_from_the_conversation() {
        let conv = read_conversation(&request("Story ID: `US-007`", "/w/repo", 2));
        assert_eq!(conv.story.as_deref(), Some("US-007"));
        assert_eq!(conv.repo.as_deref(), Some("/w/repo"));
        assert_eq!(conv.step, 2);
        assert_eq!(conv.last_tool_error.as_deref(), Some("boom"));
        assert_eq!(conv.model.as_deref(), Some("claude-x"));
    }

    #[test]
    fn story_id_only_counts_in_the_first_user_message() {
        let mut req = request("no id here", "/w", 0);
        req["messages"]
            .as_array_mut()
            .expect("messages")
            .push(json!({"role": "user", "content": "Story ID: US-9"}));
        assert_eq!(read_conversation(&req).story, None);
    }

    /// Parses an SSE body back into `(event, data)` pairs.
    fn events(body: &str) -> Vec<(String, Value)> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut lines = e.lines();
                let name = lines
                    .next()
                    .and_then(|l| l.strip_prefix("event: "))
                    .expect("event line");
                let data = lines
                    .next()
                    .and_then(|l| l.strip_prefix("data: "))
                    .expect("data line");
                (
                    name.to_owned(),
                    serde_json::from_str(data).expect("data is JSON"),
                )
            })
            .collect()
    }

    #[test]
    fn tool_use_streams_input_json_that_reassembles_to_the_input() {
        let long = "é".repeat(100);
        let input = json!({"command": long, "description": "run"});
        let turn = Turn::Tool {
            call: Call::Raw {
                name: "Bash".into(),
                input: input.clone(),
            },
            text: Some("Running.".into()),
        };
        let ev = events(&render_sse(&turn, "m", "msg_1", "toolu_1", 10));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        let partial: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .map(|(_, d)| d["delta"]["partial_json"].as_str().expect("str").to_owned())
            .collect();
        assert!(
            ev.iter()
                .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
                .count()
                > 1
        );
        assert_eq!(
            serde_json::from_str::<Value>(&partial).expect("json"),
            input
        );
        let start = ev
            .iter()
            .find(|(_, d)| d["content_block"]["type"] == "tool_use")
            .expect("tool_use block");
        assert_eq!(start.1["index"], 1, "the text block comes first");
        assert_eq!(start.1["content_block"]["id"], "toolu_1");
        let delta = ev
            .iter()
            .find(|(n, _)| n == "message_delta")
            .expect("message_delta");
        assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn final_text_streams_as_text_deltas_with_end_turn() {
        let turn = Turn::Final {
            text: "Done.\n<promise>COMPLETE</promise>".into(),
            promise: true,
        };
        let ev = events(&render_sse(&turn, "m", "msg_1", "toolu_1", 10));
        let text: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .map(|(_, d)| d["delta"]["text"].as_str().expect("str").to_owned())
            .collect();
        assert_eq!(text, "Done.\n<promise>COMPLETE</promise>");
        let delta = ev
            .iter()
            .find(|(n, _)| n == "message_delta")
            .expect("message_delta");
        assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    }
}
