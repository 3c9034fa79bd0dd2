//! Tool calls written as JSON in a message's text, for models without native tool calling.
//!
//! Small local models such as Qwen2.5-Coder-0.5B-Instruct answer a tools request with the right
//! call as *text* and leave `tool_calls` empty (`shared/notes/local-model.md` §3 B): a ```json
//! fenced block, a `<tool_call>…</tool_call>` tagged object, or a bare
//! `{"name": …, "arguments": …}` object after some prose. [`parse_text_tool_calls`] finds those
//! so the loop can run them like native calls.

use serde_json::Value;

use crate::native::llm::ToolCall;

/// The tool calls written as JSON objects in `content`, in the order they appear.
///
/// An object counts when it has a string `name` that is one of `tool_names` and an `arguments`
/// (or `parameters`) member. It may sit anywhere: inside a ```json or plain ``` fence, between
/// `<tool_call>` tags, in a JSON array, or bare among prose; several calls are all returned.
/// Arguments given as a JSON string are parsed; arguments that are not valid JSON are kept as
/// `{"_raw": "<text>"}` so the loop can tell the model. Ids are `text-1`, `text-2`, … in order
/// (unique within one message only; the caller may renumber them across a conversation).
/// Objects with an unknown name, and text that is not JSON, are ignored.
pub fn parse_text_tool_calls(content: &str, tool_names: &[&str]) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some(found) = content[pos..].find('{') {
        let start = pos + found;
        let mut values = serde_json::Deserializer::from_str(&content[start..]).into_iter::<Value>();
        let parsed = values.next();
        let end = start + values.byte_offset();
        match parsed {
            Some(Ok(value)) => match call_shape(&value) {
                Some((name, args)) => {
                    if tool_names.contains(&name) {
                        calls.push(ToolCall {
                            id: format!("text-{}", calls.len() + 1),
                            name: name.to_string(),
                            arguments: parse_arguments(args),
                        });
                    }
                    // A call object is consumed whole, so nothing inside it is read as a call.
                    pos = end.max(start + 1);
                }
                // Some other object: a call may still be nested in it (`{"function": {...}}`).
                None => pos = start + 1,
            },
            _ => pos = start + 1,
        }
    }
    calls
}

/// `(name, arguments)` of an object shaped like a call.
fn call_shape(value: &Value) -> Option<(&str, &Value)> {
    let name = value.get("name")?.as_str()?;
    let args = value.get("arguments").or_else(|| value.get("parameters"))?;
    Some((name, args))
}

/// Arguments as an object: an object as is, a JSON string holding an object parsed, an empty
/// string or `null` as `{}`, anything else as `{"_raw": "<text>"}`.
fn parse_arguments(args: &Value) -> Value {
    match args {
        Value::Object(_) => args.clone(),
        Value::Null => Value::Object(Default::default()),
        Value::String(text) if text.trim().is_empty() => Value::Object(Default::default()),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => serde_json::json!({ "_raw": text }),
        },
        other => serde_json::json!({ "_raw": other.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOOLS: &[&str] = &["write_file", "read_file", "run_command"];

    fn names_and_args(calls: &[ToolCall]) -> Vec<(String, Value)> {
        calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect()
    }

    #[test]
    fn qwen_fenced_json_block() {
        // The exact shape Qwen2.5-Coder-0.5B gave in the probe.
        let text = "```json\n{\"name\":\"write_file\",\"arguments\":{\"path\":\"hello.txt\",\"content\":\"hi\"}}\n```";
        let calls = parse_text_tool_calls(text, TOOLS);
        assert_eq!(
            names_and_args(&calls),
            vec![(
                "write_file".into(),
                json!({"path": "hello.txt", "content": "hi"})
            )]
        );
        assert_eq!(calls[0].id, "text-1");
    }

    #[test]
    fn qwen_bare_object_and_plain_fence_with_prose() {
        let bare = "{\"name\": \"write_file\", \"arguments\": {\"path\": \"hello.txt\", \"content\": \"hi\"}}";
        assert_eq!(parse_text_tool_calls(bare, TOOLS).len(), 1);
        let prose = "Sure! I will create the file.\n```\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"x {y}\"}}\n```\nThis writes `a.txt`.";
        let calls = parse_text_tool_calls(prose, TOOLS);
        assert_eq!(
            names_and_args(&calls),
            vec![(
                "write_file".into(),
                json!({"path": "a.txt", "content": "x {y}"})
            )]
        );
    }

    #[test]
    fn tool_call_tags_and_several_calls() {
        let text = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"run_command\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        let calls = parse_text_tool_calls(text, TOOLS);
        assert_eq!(
            names_and_args(&calls),
            vec![
                ("read_file".into(), json!({"path": "a"})),
                ("run_command".into(), json!({"command": "ls"})),
            ]
        );
        assert_eq!(
            calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["text-1", "text-2"]
        );
    }

    #[test]
    fn parameters_alias_string_arguments_and_arrays() {
        let text = r#"[{"name": "read_file", "parameters": {"path": "x"}}, {"name": "run_command", "arguments": "{\"command\": \"pwd\"}"}]"#;
        assert_eq!(
            names_and_args(&parse_text_tool_calls(text, TOOLS)),
            vec![
                ("read_file".into(), json!({"path": "x"})),
                ("run_command".into(), json!({"command": "pwd"})),
            ]
        );
        let broken = r#"{"name": "run_command", "arguments": "{\"command\": "}"#;
        assert_eq!(
            parse_text_tool_calls(broken, TOOLS)[0].arguments,
            json!({"_raw": "{\"command\": "})
        );
    }

    #[test]
    fn unknown_names_plain_json_and_prose_are_ignored() {
        assert!(parse_text_tool_calls("I am done. All tests pass.", TOOLS).is_empty());
        let unknown = r#"{"name": "delete_everything", "arguments": {}}"#;
        assert!(parse_text_tool_calls(unknown, TOOLS).is_empty());
        // A JSON document that merely has a `name` (a package.json) is not a call.
        let package = r#"```json
{"name": "write_file", "version": "1.0.0"}
```"#;
        assert!(parse_text_tool_calls(package, TOOLS).is_empty());
        assert!(parse_text_tool_calls("{ not json {\"name\": ", TOOLS).is_empty());
    }

    #[test]
    fn a_call_nested_in_a_wrapper_object_is_found() {
        let text = r#"{"type": "function", "function": {"name": "read_file", "arguments": {"path": "b"}}}"#;
        assert_eq!(
            names_and_args(&parse_text_tool_calls(text, TOOLS)),
            vec![("read_file".into(), json!({"path": "b"}))]
        );
    }
}
