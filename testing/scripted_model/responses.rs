//! The OpenAI Responses API as the Codex CLI 0.171.0 uses it (`notes/real-clis.md` §2):
//! `POST /v1/responses` answered with a `text/event-stream` of `response.created`,
//! `response.output_item.added|done`, `response.content_part.*`, `response.output_text.*`,
//! `response.function_call_arguments.*` and `response.completed`; errors in OpenAI's envelope
//! `{"error":{"message","type","code"}}`.
//!
//! Conversation state, from the request's `input` items:
//! - story: the first `Story ID:` among the `role:"user"` messages. codex sends its
//!   `<environment_context>` (and any AGENTS.md) as user messages *before* ralph's prompt, so
//!   "the first user message" would be the wrong one;
//! - repo: [`find_repo`] over every string of the request (codex's `<cwd>…</cwd>`);
//! - step: the number of `function_call_output` items.
//!
//! Portable steps become codex's `exec_command` tool (the only file-writing or shell tool
//! 0.171.0 offers a model it has no metadata for; no `apply_patch`, no `shell`): `shell` runs
//! its command as `cmd`; `write` becomes a `cmd` that creates the parent directories and
//! decodes the content from base64 into the absolute path, so no content can break the
//! shell's quoting.

use serde_json::{json, Value};

use crate::anthropic::chunks;
use crate::scenario::{find_repo, find_story, strings, Call, Conversation, ErrorReply, Turn};
use crate::{Rendered, Wire};

/// How long `exec_command` waits for a command before it hands back a session id instead of
/// the output, in milliseconds. codex 0.171.0's default is 10 s: a slower step (a test suite on
/// a loaded CI machine) would come back unfinished, the script would move on, and codex would
/// kill the command when it exits.
const YIELD_TIME_MS: u64 = 60_000;

/// Seconds after the request that a scripted `usage_limit_reached` error says the limit
/// resets (`resets_at`).
pub(crate) const USAGE_LIMIT_RESETS_IN_SECONDS: i64 = 3600;

/// The Responses protocol.
pub(crate) struct Responses;

impl Wire for Responses {
    fn conversation(&self, body: &Value) -> Conversation {
        read_conversation(body)
    }

    fn render(&self, turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Rendered {
        Rendered::sse(render_sse(turn, model, n, input_tokens))
    }

    /// OpenAI's envelope. A `usage_limit_reached` type (the ChatGPT backend's) also gets
    /// `plan_type: "plus"` and `resets_at` (epoch seconds, [`USAGE_LIMIT_RESETS_IN_SECONDS`]
    /// from now): from those codex 0.171.0 writes its documented `You’ve hit your usage limit.
    /// Upgrade to Pro (…) or try again at <local time>.` and exits 1. Without `resets_at` it
    /// would only say "try again later".
    fn error_body(&self, e: &ErrorReply) -> Value {
        let (kind, code) = match &e.error_type {
            Some(t) => (t.clone(), Value::String(t.clone())),
            None => {
                let (kind, code) = default_error_type(e.status);
                (kind.to_owned(), code.map_or(Value::Null, Value::from))
            }
        };
        let mut error = json!({"message": e.message, "type": kind, "param": null, "code": code});
        if kind == "usage_limit_reached" {
            let resets_at = chrono::Utc::now().timestamp() + USAGE_LIMIT_RESETS_IN_SECONDS;
            error["plan_type"] = json!("plus");
            error["resets_at"] = json!(resets_at);
            error["resets_in_seconds"] = json!(USAGE_LIMIT_RESETS_IN_SECONDS);
        }
        json!({ "error": error })
    }
}

/// OpenAI's `error.type` and `error.code` for an HTTP status.
fn default_error_type(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        403 => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
        ),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        400..=499 => ("invalid_request_error", None),
        _ => ("server_error", None),
    }
}

/// Reads the conversation state from a Responses request body.
fn read_conversation(body: &Value) -> Conversation {
    let items = body
        .get("input")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut conv = Conversation {
        model: body.get("model").and_then(Value::as_str).map(str::to_owned),
        ..Conversation::default()
    };
    let mut user_texts = Vec::new();
    for item in items.iter().filter(|i| {
        i.get("role").and_then(Value::as_str) == Some("user")
            && i.get("type").and_then(Value::as_str).unwrap_or("message") == "message"
    }) {
        if let Some(content) = item.get("content") {
            strings(content, &mut user_texts);
        }
    }
    conv.story = find_story(&user_texts);
    conv.user_text = user_texts.join("\n");
    let mut all = Vec::new();
    if let Some(instructions) = body.get("instructions") {
        strings(instructions, &mut all);
    }
    for item in items {
        strings(item, &mut all);
    }
    conv.repo = find_repo(&all);
    for output in items
        .iter()
        .filter(|i| i.get("type").and_then(Value::as_str) == Some("function_call_output"))
    {
        conv.step += 1;
        let mut parts = Vec::new();
        if let Some(o) = output.get("output") {
            strings(o, &mut parts);
        }
        let text = parts.concat();
        conv.last_tool_error = command_failed(&text).then(|| text.chars().take(500).collect());
    }
    conv
}

/// Whether an `exec_command` result reports a non-zero exit: codex 0.171.0 writes
/// `Process exited with code N` into the output text.
fn command_failed(output: &str) -> bool {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Process exited with code "))
        .and_then(|code| code.trim().parse::<i64>().ok())
        .is_some_and(|code| code != 0)
}

/// codex's tool name and arguments for `call`.
fn tool(call: &Call) -> (String, Value) {
    match call {
        Call::Write { path, content } => (
            "exec_command".to_owned(),
            json!({"cmd": write_command(path, content), "yield_time_ms": YIELD_TIME_MS}),
        ),
        Call::Shell { command, .. } => (
            "exec_command".to_owned(),
            json!({"cmd": command, "yield_time_ms": YIELD_TIME_MS}),
        ),
        Call::Raw { name, input } => (name.clone(), input.clone()),
    }
}

/// A shell command that writes `content` to the absolute `path` exactly, creating its parent
/// directories: `mkdir -p '<dir>' && printf '%s' '<base64>' | base64 -d > '<path>'`.
fn write_command(path: &str, content: &str) -> String {
    let dir = std::path::Path::new(path)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_owned());
    format!(
        "mkdir -p {} && printf '%s' '{}' | base64 -d > {}",
        quote(&dir),
        base64(content.as_bytes()),
        quote(path)
    )
}

/// `s` in single quotes for a POSIX shell (`'` becomes `'\''`).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Standard base64 with padding (RFC 4648 §4), what `base64 -d` reads.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Token counts for a reply: `input_tokens` (the body estimate) with the part OpenAI would
/// serve from its prompt cache, and the output estimate (bytes / 4 + 1).
///
/// The cache is a deterministic stand-in for OpenAI's: prompts of 1024 tokens or more get
/// three quarters of their tokens, rounded down to a multiple of 128, as `cached_tokens` (the
/// API caches prefixes of at least 1024 tokens in 128-token steps). It lets the real-CLI tests
/// see that codex's `input_tokens` include the cached ones.
fn usage(input_tokens: u64, output_bytes: usize) -> Value {
    let cached = if input_tokens >= 1024 {
        input_tokens * 3 / 4 / 128 * 128
    } else {
        0
    };
    let output_tokens = output_bytes as u64 / 4 + 1;
    json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    })
}

/// Renders one streamed Responses reply for a tool call (an optional message item, then a
/// `function_call` item) or a final text (one message item).
fn render_sse(turn: &Turn, model: &str, n: u64, input_tokens: u64) -> String {
    let resp_id = format!("resp_scripted_{n:06}");
    let mut events: Vec<(&'static str, Value)> = Vec::new();
    let response = |status: &str, output: Vec<Value>, usage: Value| {
        json!({"id": resp_id, "object": "response", "created_at": 1_767_225_600, "status": status,
               "model": model, "output": output, "usage": usage})
    };
    events.push((
        "response.created",
        json!({"type": "response.created", "response": response("in_progress", Vec::new(), Value::Null)}),
    ));
    let mut output = Vec::new();
    let mut out_bytes = 0;
    let text = match turn {
        Turn::Tool { text, .. } => text.clone(),
        Turn::Final { text, .. } => Some(text.clone()),
        Turn::Error(_) => None,
    };
    if let Some(text) = text {
        let index = output.len();
        let item_id = format!("msg_scripted_{n:06}");
        events.extend(message_events(index, &item_id, &text));
        output.push(message_item(&item_id, &text, "completed"));
        out_bytes += text.len();
    }
    if let Turn::Tool { call, .. } = turn {
        let index = output.len();
        let (name, input) = tool(call);
        let arguments = input.to_string();
        let item = |status: &str, arguments: &str| {
            json!({"type": "function_call", "id": format!("fc_scripted_{n:06}"),
                   "call_id": format!("call_scripted_{n:06}"), "name": name,
                   "arguments": arguments, "status": status})
        };
        events.push((
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": index,
                   "item": item("in_progress", "")}),
        ));
        for piece in chunks(&arguments) {
            events.push((
                "response.function_call_arguments.delta",
                json!({"type": "response.function_call_arguments.delta", "output_index": index,
                       "item_id": format!("fc_scripted_{n:06}"), "delta": piece}),
            ));
        }
        events.push((
            "response.function_call_arguments.done",
            json!({"type": "response.function_call_arguments.done", "output_index": index,
                   "item_id": format!("fc_scripted_{n:06}"), "arguments": arguments}),
        ));
        let done = item("completed", &arguments);
        events.push((
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": index, "item": done}),
        ));
        output.push(done);
        out_bytes += arguments.len();
    }
    events.push((
        "response.completed",
        json!({"type": "response.completed",
               "response": response("completed", output, usage(input_tokens, out_bytes))}),
    ));
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

/// An assistant message item holding `text`.
fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content: Vec<Value> = if status == "completed" {
        vec![json!({"type": "output_text", "text": text, "annotations": []})]
    } else {
        Vec::new()
    };
    json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": content})
}

/// The events that stream one assistant message item at `index`: added, the content part, the
/// text in deltas of at most 64 bytes, then done.
fn message_events(index: usize, item_id: &str, text: &str) -> Vec<(&'static str, Value)> {
    let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": []});
    let mut events = vec![
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": index,
                   "item": message_item(item_id, "", "in_progress")}),
        ),
        (
            "response.content_part.added",
            json!({"type": "response.content_part.added", "output_index": index,
                   "item_id": item_id, "content_index": 0, "part": part("")}),
        ),
    ];
    for piece in chunks(text) {
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "output_index": index,
                   "item_id": item_id, "content_index": 0, "delta": piece}),
        ));
    }
    events.push((
        "response.output_text.done",
        json!({"type": "response.output_text.done", "output_index": index,
               "item_id": item_id, "content_index": 0, "text": text}),
    ));
    events.push((
        "response.content_part.done",
        json!({"type": "response.content_part.done", "output_index": index,
               "item_id": item_id, "content_index": 0, "part": part(text)}),
    ));
    events.push((
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": index,
               "item": message_item(item_id, text, "completed")}),
    ));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request shaped like codex 0.171.0's: developer messages, the environment context as a
    /// user message, then ralph's prompt, then `tool_results` call/output pairs.
    fn request(prompt: &str, repo: &str, outputs: &[&str]) -> Value {
        let mut input = vec![
            json!({"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "You are a coding agent running in the Codex CLI."}]}),
            json!({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": format!(
                    "<environment_context>\n  <cwd>{repo}</cwd>\n  <shell>bash</shell>\n</environment_context>")}]}),
            json!({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": prompt}]}),
        ];
        for (i, output) in outputs.iter().enumerate() {
            input.push(json!({"type": "function_call", "name": "exec_command",
                "arguments": "{\"cmd\":\"true\"}", "call_id": format!("call_{i}")}));
            input.push(
                json!({"type": "function_call_output", "call_id": format!("call_{i}"),
                "output": output}),
            );
        }
        json!({"model": "scripted-model", "instructions": "", "input": input, "stream": true})
    }

    const OK: &str = "Chunk ID: 4be672\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 0\nOutput:\n";
    const FAILED: &str = "Chunk ID: 1\nWall time: 0.1 seconds\nProcess exited with code 2\nOriginal token count: 3\nOutput:\nno such file\n";

    #[test]
    fn reads_story_repo_and_step_from_the_input_items() {
        let conv = read_conversation(&request(
            "Work on this.\nStory ID: `US-007`\n",
            "/w/repo",
            &[OK, FAILED],
        ));
        assert_eq!(conv.story.as_deref(), Some("US-007"));
        assert_eq!(conv.repo.as_deref(), Some("/w/repo"));
        assert_eq!(conv.step, 2);
        assert!(conv
            .last_tool_error
            .as_deref()
            .is_some_and(|e| e.contains("no such file")));
        assert_eq!(conv.model.as_deref(), Some("scripted-model"));

        let conv = read_conversation(&request("Story ID: US-1", "/w", &[FAILED, OK]));
        assert_eq!(conv.last_tool_error, None, "the latest output succeeded");
    }

    #[test]
    fn story_ids_in_tool_output_or_developer_text_do_not_count() {
        let mut req = request(
            "no id here",
            "/w",
            &["Story ID: US-9\nProcess exited with code 0"],
        );
        req["input"].as_array_mut().expect("input").insert(
            0,
            json!({"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "Story ID: US-8"}]}),
        );
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
                assert_eq!(data_type(data), name, "data.type matches the event name");
                (
                    name.to_owned(),
                    serde_json::from_str(data).expect("data is JSON"),
                )
            })
            .collect()
    }

    fn data_type(data: &str) -> String {
        serde_json::from_str::<Value>(data).expect("json")["type"]
            .as_str()
            .expect("type")
            .to_owned()
    }

    #[test]
    fn a_write_step_becomes_an_exec_command_that_writes_the_file_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub dir/it's.txt");
        let content = "line 1\n'quoted' \"double\" $HOME `x` \\ é ✓\n\nno newline at end";
        let turn = Turn::Tool {
            call: Call::Write {
                path: path.to_string_lossy().into_owned(),
                content: content.into(),
            },
            text: Some("Writing it.".into()),
        };
        let ev = events(&render_sse(&turn, "m", 7, 2000));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"response.created"));
        assert_eq!(names.last(), Some(&"response.completed"));
        let done: Vec<&Value> = ev
            .iter()
            .filter(|(n, _)| n == "response.output_item.done")
            .map(|(_, d)| &d["item"])
            .collect();
        assert_eq!(done.len(), 2, "the text, then the call");
        assert_eq!(done[0]["content"][0]["text"], "Writing it.");
        assert_eq!(done[1]["type"], "function_call");
        assert_eq!(done[1]["name"], "exec_command");
        assert_eq!(done[1]["call_id"], "call_scripted_000007");
        let streamed: String = ev
            .iter()
            .filter(|(n, _)| n == "response.function_call_arguments.delta")
            .map(|(_, d)| d["delta"].as_str().expect("delta").to_owned())
            .collect();
        assert_eq!(streamed, done[1]["arguments"].as_str().expect("arguments"));
        let args: Value = serde_json::from_str(&streamed).expect("arguments are JSON");
        let cmd = args["cmd"].as_str().expect("cmd");

        let status = std::process::Command::new("bash")
            .args(["-lc", cmd])
            .status()
            .expect("run bash");
        assert!(status.success(), "{cmd}");
        assert_eq!(std::fs::read_to_string(&path).expect("written"), content);

        let completed = &ev.last().expect("completed").1["response"];
        assert_eq!(completed["output"].as_array().map(Vec::len), Some(2));
        assert_eq!(completed["usage"]["input_tokens"], 2000);
        assert_eq!(
            completed["usage"]["input_tokens_details"]["cached_tokens"],
            1408
        );
    }

    #[test]
    fn final_text_streams_as_one_message_item() {
        let turn = Turn::Final {
            text: "Done.\n<promise>COMPLETE</promise>".repeat(3),
            promise: true,
        };
        let ev = events(&render_sse(&turn, "m", 1, 10));
        let text: String = ev
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().expect("delta").to_owned())
            .collect();
        assert_eq!(text, "Done.\n<promise>COMPLETE</promise>".repeat(3));
        assert!(!ev.iter().any(|(n, _)| n.contains("function_call")));
        let completed = &ev.last().expect("completed").1["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(
            completed["usage"]["input_tokens_details"]["cached_tokens"],
            0
        );
    }

    #[test]
    fn shell_steps_run_the_command_and_errors_use_openais_envelope() {
        let (name, args) = tool(&Call::Shell {
            command: "cd /w && ls".into(),
            description: Some("list".into()),
        });
        assert_eq!(name, "exec_command");
        assert_eq!(args["cmd"], "cd /w && ls");

        let body = Responses.error_body(&ErrorReply::new(401, "Incorrect API key provided"));
        assert_eq!(
            body,
            json!({"error": {"message": "Incorrect API key provided",
                             "type": "invalid_request_error", "param": null,
                             "code": "invalid_api_key"}})
        );
        let limit = Responses.error_body(&ErrorReply {
            status: 429,
            error_type: Some("usage_limit_reached".into()),
            message: "The usage limit has been reached".into(),
        });
        assert_eq!(limit["error"]["type"], "usage_limit_reached");
        let resets_at = limit["error"]["resets_at"].as_i64().expect("resets_at");
        let expected = chrono::Utc::now().timestamp() + USAGE_LIMIT_RESETS_IN_SECONDS;
        assert!(
            (expected - 5..=expected).contains(&resets_at),
            "{resets_at}"
        );
        assert_eq!(
            Responses.error_body(&ErrorReply::new(503, "down"))["error"]["type"],
            "server_error"
        );
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
    }
}
