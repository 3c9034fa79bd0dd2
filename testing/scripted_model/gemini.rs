//! The Gemini v1beta API as Gemini CLI 0.61.0 uses it (`notes/real-clis.md` §4):
//! `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` answered with a
//! `text/event-stream` of `data: <GenerateContentResponse>\r\n\r\n` events,
//! `POST …:generateContent` with one plain `GenerateContentResponse`, and `POST …:countTokens`
//! with `{"totalTokens": N}`; errors in Google's envelope `{"error":{"code","message","status"}}`.
//!
//! Conversation state: the story from the text parts of the first `user` content (the CLI sends
//! its `<session_context>` block and the prompt as two parts of that content); the repository
//! from ralph's prompt line (any string of the request), else the CLI's own
//! `- **Workspace Directories:**` list; the step from the number of `functionResponse` parts.
//! Portable steps become the CLI's `write_file` (`{file_path (absolute), content}`) and
//! `run_shell_command` (`{command, description}`) tools.
//!
//! Side requests: a request whose `generationConfig` asks for JSON (the model router without
//! `-m`, the next-speaker check) is answered with a JSON object filled in from its schema and
//! consumes no step; `:countTokens` consumes none either.

use serde_json::{json, Map, Value};

use crate::anthropic::chunks;
use crate::scenario::{find_repo, find_story, strings, Call, Conversation, ErrorReply, Turn};
use crate::{Rendered, Wire};

/// How a request at one of the model's paths is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gemini {
    /// `:streamGenerateContent` (the CLI always adds `?alt=sse`): SSE events.
    Stream,
    /// `:generateContent`: one JSON response.
    Plain,
    /// `:countTokens`: `{"totalTokens": N}`, no step consumed.
    CountTokens,
}

static STREAM: Gemini = Gemini::Stream;
static PLAIN: Gemini = Gemini::Plain;
static COUNT_TOKENS: Gemini = Gemini::CountTokens;

/// The Gemini protocol served at `path` (`/v1beta/models/<model>:<method>`, no query), if the
/// method is one this module answers.
pub(crate) fn route(path: &str) -> Option<&'static dyn Wire> {
    let (_, method) = path.strip_prefix("/v1beta/models/")?.rsplit_once(':')?;
    match method {
        "streamGenerateContent" => Some(&STREAM),
        "generateContent" => Some(&PLAIN),
        "countTokens" => Some(&COUNT_TOKENS),
        _ => None,
    }
}

impl Wire for Gemini {
    fn conversation(&self, body: &Value) -> Conversation {
        read_conversation(body)
    }

    fn side_reply(&self, body: &Value) -> Option<Turn> {
        if *self == Gemini::CountTokens {
            // Rendered as `{"totalTokens": …}` by `render`; the text is not used.
            return Some(Turn::Final {
                text: String::new(),
                promise: false,
            });
        }
        let config = body.get("generationConfig")?;
        let schema = config
            .get("responseJsonSchema")
            .or_else(|| config.get("responseSchema"));
        let wants_json =
            config.get("responseMimeType").and_then(Value::as_str) == Some("application/json");
        if schema.is_none() && !wants_json {
            return None;
        }
        let value = schema.map_or_else(|| json!({}), fill_schema);
        Some(Turn::Final {
            text: value.to_string(),
            promise: false,
        })
    }

    fn render(&self, turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Rendered {
        match self {
            Gemini::CountTokens => Rendered {
                content_type: "application/json",
                body: json!({"totalTokens": input_tokens})
                    .to_string()
                    .into_bytes(),
            },
            Gemini::Plain => Rendered {
                content_type: "application/json",
                body: whole_response(turn, model, n, input_tokens)
                    .to_string()
                    .into_bytes(),
            },
            Gemini::Stream => {
                let mut body = String::new();
                for event in stream_events(turn, model, n, input_tokens) {
                    body.push_str("data: ");
                    body.push_str(&event.to_string());
                    body.push_str("\r\n\r\n");
                }
                Rendered::sse(body)
            }
        }
    }

    fn error_body(&self, e: &ErrorReply) -> Value {
        let status = e
            .error_type
            .clone()
            .unwrap_or_else(|| default_status(e.status).to_owned());
        json!({"error": {"code": e.status, "message": e.message, "status": status}})
    }
}

/// Google's canonical `error.status` for an HTTP status.
fn default_status(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// The CLI's tool name and arguments for `call`.
fn tool(call: &Call) -> (String, Value) {
    match call {
        Call::Write { path, content } => (
            "write_file".to_owned(),
            json!({"file_path": path, "content": content}),
        ),
        Call::Shell {
            command,
            description,
        } => (
            "run_shell_command".to_owned(),
            json!({"command": command, "description": description.as_deref().unwrap_or("Run a command")}),
        ),
        Call::Raw { name, input } => (name.clone(), input.clone()),
    }
}

/// The `contents[].parts[]` of a request, flattened, with the role of each part's content.
fn parts(body: &Value) -> impl Iterator<Item = (&str, &Value)> {
    body.get("contents")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .flat_map(|c| {
            let role = c.get("role").and_then(Value::as_str).unwrap_or("user");
            c.get("parts")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(move |p| (role, p))
        })
}

/// Reads the conversation state from a `generateContent` request body.
fn read_conversation(body: &Value) -> Conversation {
    let mut conv = Conversation::default();
    let first_user = body
        .get("contents")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("role").and_then(Value::as_str) == Some("user"))
        });
    if let Some(content) = first_user {
        let texts: Vec<&str> = content
            .get("parts")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        conv.story = find_story(&texts);
        conv.user_text = texts.join("\n");
    }
    let mut texts = Vec::new();
    if let Some(system) = body.get("systemInstruction") {
        strings(system, &mut texts);
    }
    if let Some(contents) = body.get("contents") {
        strings(contents, &mut texts);
    }
    conv.repo = find_repo(&texts).or_else(|| workspace_dir(&texts));
    for (_, part) in parts(body) {
        let Some(response) = part.get("functionResponse") else {
            continue;
        };
        conv.step += 1;
        conv.last_tool_error = tool_error(response.get("response").unwrap_or(&Value::Null));
    }
    conv
}

/// The first directory of the CLI's own `- **Workspace Directories:**` list in its
/// `<session_context>` block: the working directory it was started in.
fn workspace_dir(texts: &[&str]) -> Option<String> {
    texts.iter().find_map(|t| {
        let start = t.find("**Workspace Directories:**")?;
        let line = t[start..].lines().nth(1)?.trim();
        let path = line.strip_prefix("- ")?.trim();
        (!path.is_empty()).then(|| path.to_owned())
    })
}

/// The text of a failed tool's `functionResponse.response` (its `error`, or a shell output
/// reporting a non-zero `Exit Code:`), first 500 characters; `None` for a success.
fn tool_error(response: &Value) -> Option<String> {
    let text = match response.get("error") {
        Some(Value::String(e)) => e.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => {
            let output = response.get("output").and_then(Value::as_str)?;
            let failed = output
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Exit Code:"))
                .any(|code| code.trim() != "0");
            if !failed {
                return None;
            }
            output.to_owned()
        }
    };
    Some(text.chars().take(500).collect())
}

/// A value matching a JSON schema (the subset the CLI's side requests use: `object` with
/// `properties`, `string` with optional `enum`, `number`, `integer`, `boolean`, `array`):
/// strings are the first enum value or empty, numbers 1, booleans false, arrays empty.
fn fill_schema(schema: &Value) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let kind = schema
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase);
    match kind.as_deref() {
        Some("string") => json!(""),
        Some("number" | "integer") => json!(1),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        _ => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    out.insert(name.clone(), fill_schema(prop));
                }
            }
            Value::Object(out)
        }
    }
}

/// `usageMetadata` for a reply: byte/4 estimates, deterministic.
fn usage(input_tokens: u64, output_bytes: usize) -> Value {
    let output_tokens = output_bytes as u64 / 4 + 1;
    json!({"promptTokenCount": input_tokens, "candidatesTokenCount": output_tokens,
           "totalTokenCount": input_tokens + output_tokens})
}

/// One candidate holding `parts`.
fn response(parts: Vec<Value>, model: &str, n: u64, last: Option<Value>) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut resp = json!({"modelVersion": model, "responseId": format!("scripted-{n:06}")});
    if let Some(usage) = last {
        candidate["finishReason"] = json!("STOP");
        resp["usageMetadata"] = usage;
    }
    resp["candidates"] = json!([candidate]);
    resp
}

/// The streamed reply: text in pieces of at most 64 bytes (one event each, as the real API
/// streams), then the function call; the last event carries `finishReason` and `usageMetadata`.
fn stream_events(turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Vec<Value> {
    let (text, call) = turn_parts(turn, n);
    let output_bytes =
        text.as_deref().map_or(0, str::len) + call.as_ref().map_or(0, |c| c.to_string().len());
    let mut parts: Vec<Vec<Value>> = text
        .as_deref()
        .map(|t| {
            chunks(t)
                .into_iter()
                .map(|c| vec![json!({"text": c})])
                .collect()
        })
        .unwrap_or_default();
    if let Some(call) = call {
        parts.push(vec![call]);
    }
    if parts.is_empty() {
        parts.push(vec![json!({"text": ""})]);
    }
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let usage = (i == last).then(|| usage(input_tokens, output_bytes));
            response(p, model, n, usage)
        })
        .collect()
}

/// The non-streamed reply: every part in one response.
fn whole_response(turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Value {
    let (text, call) = turn_parts(turn, n);
    let output_bytes =
        text.as_deref().map_or(0, str::len) + call.as_ref().map_or(0, |c| c.to_string().len());
    let mut parts = Vec::new();
    if let Some(t) = text {
        parts.push(json!({"text": t}));
    }
    parts.extend(call);
    response(parts, model, n, Some(usage(input_tokens, output_bytes)))
}

/// The text (if any) and the `functionCall` part (for a tool turn) of `turn`.
fn turn_parts(turn: &Turn, n: u64) -> (Option<String>, Option<Value>) {
    match turn {
        Turn::Tool { call, text } => {
            let (name, args) = tool(call);
            let id = format!("scripted_{name}_{n:06}");
            (
                text.clone(),
                Some(json!({"functionCall": {"id": id, "name": name, "args": args}})),
            )
        }
        Turn::Final { text, .. } => (Some(text.clone()), None),
        // Errors are not streamed; see `Wire::error_body`.
        Turn::Error(_) => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request shaped like Gemini CLI 0.61.0's: the session context and the prompt as two
    /// parts of the first user content, then one model/user pair per tool call.
    fn request(prompt: &str, workspace: &str, tool_results: &[Value]) -> Value {
        let context = format!(
            "<session_context>\nThis is the Gemini CLI.\n- **Workspace Directories:**\n  - {workspace}\n- **Directory Structure:**\n</session_context>"
        );
        let mut contents =
            vec![json!({"role": "user", "parts": [{"text": context}, {"text": prompt}]})];
        for (i, response) in tool_results.iter().enumerate() {
            contents.push(json!({"role": "model", "parts": [
                {"functionCall": {"id": format!("c{i}"), "name": "run_shell_command", "args": {}}}]}));
            contents.push(json!({"role": "user", "parts": [
                {"functionResponse": {"id": format!("c{i}"), "name": "run_shell_command", "response": response}}]}));
        }
        json!({"contents": contents, "systemInstruction": {"parts": [{"text": "You are a CLI agent."}]},
               "generationConfig": {"temperature": 1}})
    }

    #[test]
    fn routes_each_method_of_the_model_path() {
        let wire = |p: &str| {
            route(p).map(|w| {
                w.render(&Turn::Error(ErrorReply::new(500, "x")), "m", 1, 7)
                    .content_type
            })
        };
        assert_eq!(
            wire("/v1beta/models/gemini-2.5-flash:streamGenerateContent"),
            Some("text/event-stream; charset=utf-8")
        );
        assert_eq!(
            wire("/v1beta/models/gemini-2.5-flash:generateContent"),
            Some("application/json")
        );
        assert!(route("/v1beta/models/gemini-2.5-flash:countTokens").is_some());
        assert!(route("/v1beta/models/gemini-2.5-flash:embedContent").is_none());
        assert!(route("/v1beta/models").is_none());
        assert!(route("/v1/messages").is_none());
    }

    #[test]
    fn reads_story_repo_and_step_from_the_conversation() {
        let prompt = "You are an autonomous coding agent working in the git repository at `/w/repo`.\n\nStory ID: `US-007`\n";
        let req = request(
            prompt,
            "/w/other",
            &[
                json!({"output": "Output: (empty)\nProcess Group PGID: 1"}),
                json!({"output": "Output: boom\nExit Code: 1\nProcess Group PGID: 2"}),
            ],
        );
        let conv = read_conversation(&req);
        assert_eq!(conv.story.as_deref(), Some("US-007"));
        assert_eq!(conv.repo.as_deref(), Some("/w/repo"), "ralph's prompt wins");
        assert_eq!(conv.step, 2);
        assert_eq!(
            conv.last_tool_error.as_deref(),
            Some("Output: boom\nExit Code: 1\nProcess Group PGID: 2")
        );

        let conv = read_conversation(&request(
            "Story ID: US-1",
            "/w/ws",
            &[json!({"error": "File not found"})],
        ));
        assert_eq!(
            conv.repo.as_deref(),
            Some("/w/ws"),
            "the CLI's workspace list"
        );
        assert_eq!(conv.last_tool_error.as_deref(), Some("File not found"));
    }

    #[test]
    fn story_id_only_counts_in_the_first_user_content() {
        let mut req = request("no id here", "/w", &[]);
        req["contents"]
            .as_array_mut()
            .expect("contents")
            .push(json!({"role": "user", "parts": [{"text": "Story ID: US-9"}]}));
        assert_eq!(read_conversation(&req).story, None);
    }

    /// Parses an SSE body back into its `data:` JSON values, checking the `\r\n\r\n` framing.
    fn events(body: &[u8]) -> Vec<Value> {
        let body = std::str::from_utf8(body).expect("utf-8");
        assert!(body.ends_with("\r\n\r\n"), "{body}");
        body.split("\r\n\r\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                serde_json::from_str(e.strip_prefix("data: ").expect("data: prefix"))
                    .expect("data is JSON")
            })
            .collect()
    }

    #[test]
    fn portable_write_becomes_write_file_after_streamed_text() {
        let turn = Turn::Tool {
            call: Call::Write {
                path: "/w/r/a.txt".into(),
                content: "é".repeat(50),
            },
            text: Some("x".repeat(100)),
        };
        let ev = events(&STREAM.render(&turn, "gemini-2.5-flash", 3, 10).body);
        assert!(ev.len() >= 3, "text in pieces, then the call: {ev:?}");
        let text: String = ev
            .iter()
            .filter_map(|e| e["candidates"][0]["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "x".repeat(100));
        let last = ev.last().expect("events");
        let call = &last["candidates"][0]["content"]["parts"][0]["functionCall"];
        assert_eq!(call["name"], "write_file");
        assert_eq!(
            call["args"],
            json!({"file_path": "/w/r/a.txt", "content": "é".repeat(50)})
        );
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(last["usageMetadata"]["promptTokenCount"], 10);
        assert!(ev[..ev.len() - 1]
            .iter()
            .all(|e| e.get("usageMetadata").is_none()));
    }

    #[test]
    fn portable_shell_becomes_run_shell_command_and_final_text_is_plain_json() {
        let turn = Turn::Tool {
            call: Call::Shell {
                command: "ls".into(),
                description: None,
            },
            text: None,
        };
        let ev = events(&STREAM.render(&turn, "m", 1, 1).body);
        assert_eq!(ev.len(), 1);
        assert_eq!(
            ev[0]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"],
            json!({"command": "ls", "description": "Run a command"})
        );

        let fin = Turn::Final {
            text: "Done.\n<promise>COMPLETE</promise>".into(),
            promise: true,
        };
        let plain: Value =
            serde_json::from_slice(&PLAIN.render(&fin, "m", 2, 5).body).expect("json");
        assert_eq!(
            plain["candidates"][0]["content"]["parts"],
            json!([{"text": "Done.\n<promise>COMPLETE</promise>"}])
        );
        assert_eq!(plain["candidates"][0]["finishReason"], "STOP");
    }

    #[test]
    fn json_side_requests_and_count_tokens_consume_no_step() {
        let mut req = request("Story ID: US-1", "/w", &[]);
        assert_eq!(STREAM.side_reply(&req), None);
        req["generationConfig"] = json!({"responseMimeType": "application/json",
            "responseJsonSchema": {"type": "object", "properties": {
                "complexity_reasoning": {"type": "string"},
                "complexity_score": {"type": "integer"},
                "next_speaker": {"type": "string", "enum": ["user", "model"]}}}});
        let Some(Turn::Final { text, promise }) = PLAIN.side_reply(&req) else {
            panic!("a side reply")
        };
        assert!(!promise);
        assert_eq!(
            serde_json::from_str::<Value>(&text).expect("json"),
            json!({"complexity_reasoning": "", "complexity_score": 1, "next_speaker": "user"})
        );

        assert!(COUNT_TOKENS.side_reply(&json!({})).is_some());
        let body: Value = serde_json::from_slice(
            &COUNT_TOKENS
                .render(
                    &Turn::Final {
                        text: String::new(),
                        promise: false,
                    },
                    "m",
                    1,
                    42,
                )
                .body,
        )
        .expect("json");
        assert_eq!(body, json!({"totalTokens": 42}));
    }

    #[test]
    fn errors_use_googles_envelope() {
        assert_eq!(
            STREAM.error_body(&ErrorReply::new(
                429,
                "You have exhausted your capacity on this model."
            )),
            json!({"error": {"code": 429, "message": "You have exhausted your capacity on this model.", "status": "RESOURCE_EXHAUSTED"}})
        );
        let mut e = ErrorReply::new(400, "bad");
        e.error_type = Some("FAILED_PRECONDITION".into());
        assert_eq!(
            STREAM.error_body(&e)["error"]["status"],
            "FAILED_PRECONDITION"
        );
        assert_eq!(
            STREAM.error_body(&ErrorReply::new(401, "k"))["error"]["status"],
            "UNAUTHENTICATED"
        );
    }
}
