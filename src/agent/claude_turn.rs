//! The fast reading of the stream-json lines that carry nearly all of a claude run's bytes:
//! `assistant` and `user` messages (text, tool calls, tool results with whole files and command
//! outputs). They are deserialized into borrowed structs ([`Turn`]) that keep only the fields
//! the rules of [`crate::agent::claude_shape`] read: strings without escapes are borrowed from the
//! line, tool inputs are passed through as [`RawValue`], and every other field is skipped
//! without being built. No `serde_json::Value` map is built for them.
//!
//! The typed structs are strict: a field of an unexpected type (a `message` that is a string,
//! a non-string `model`, a duplicate key) fails the typed read, and the caller then reads the
//! line as a `Value` through the general handlers, so every line gets exactly the events and
//! facts the general rules give it (the tests at the end compare the two, odd shapes included).
//! One difference is deliberate: fields ralph does not read are skipped without checking their
//! `\u` escapes, so a line whose only flaw is a lone surrogate escape (`"\ud800"`) in such a field
//! is read, where the general path refuses the whole line as invalid JSON.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::claude_shape::LastMessage;
use crate::agent::stream::{tool_output, StreamCore};
use crate::process::strip_ansi;
use crate::protocol::fields::{summarize_tool_input, summarize_with};
use crate::protocol::AgentEvent;

/// An `assistant` or `user` line, the fields ralph reads, borrowed from the line.
#[derive(Debug, Deserialize)]
pub struct Turn<'a> {
    /// `type`: `assistant` or `user` (other lines are not read this way).
    #[serde(rename = "type", borrow)]
    kind: Option<Text<'a>>,
    /// `session_id`.
    #[serde(borrow)]
    session_id: Option<Text<'a>>,
    /// `parent_tool_use_id`: set (not null) on a subagent's lines.
    parent_tool_use_id: Option<IgnoredAny>,
    /// `message`: `None` when missing, `Some(None)` when `null`.
    #[serde(default, borrow, deserialize_with = "present")]
    message: Option<Option<Obj<Message<'a>>>>,
    /// `error`: the code of a synthetic API-error message.
    #[serde(borrow)]
    error: Option<Text<'a>>,
}

/// The message of a [`Turn`].
#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    id: Option<Text<'a>>,
    #[serde(borrow)]
    model: Option<Text<'a>>,
    #[serde(borrow)]
    content: Option<Vec<Obj<Block<'a>>>>,
}

/// One content block of a [`Message`]: text, a tool call or a tool result.
#[derive(Debug, Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    text: Option<Text<'a>>,
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    is_error: Option<bool>,
    #[serde(borrow)]
    content: Option<ToolContent<'a>>,
}

/// The string fields of a tool call's input that its summary may use
/// ([`summarize_with`]), and the length of its `todos`.
#[derive(Debug, Deserialize)]
#[allow(non_snake_case)]
struct InputKeys<'a> {
    #[serde(borrow)]
    command: Option<Text<'a>>,
    #[serde(borrow)]
    cmd: Option<Text<'a>>,
    #[serde(borrow)]
    file_path: Option<Text<'a>>,
    #[serde(borrow)]
    filePath: Option<Text<'a>>,
    #[serde(borrow)]
    notebook_path: Option<Text<'a>>,
    #[serde(borrow)]
    dir_path: Option<Text<'a>>,
    #[serde(borrow)]
    pattern: Option<Text<'a>>,
    #[serde(borrow)]
    path: Option<Text<'a>>,
    #[serde(borrow)]
    url: Option<Text<'a>>,
    #[serde(borrow)]
    query: Option<Text<'a>>,
    #[serde(borrow)]
    description: Option<Text<'a>>,
    #[serde(borrow)]
    prompt: Option<Text<'a>>,
    #[serde(borrow)]
    skill: Option<Text<'a>>,
    todos: Option<Count>,
}

impl InputKeys<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let field = match key {
            "command" => &self.command,
            "cmd" => &self.cmd,
            "file_path" => &self.file_path,
            "filePath" => &self.filePath,
            "notebook_path" => &self.notebook_path,
            "dir_path" => &self.dir_path,
            "pattern" => &self.pattern,
            "path" => &self.path,
            "url" => &self.url,
            "query" => &self.query,
            "description" => &self.description,
            "prompt" => &self.prompt,
            "skill" => &self.skill,
            _ => &None,
        };
        field.as_ref().map(Text::as_str)
    }
}

/// Reads `line` (already trimmed) as an `assistant` or `user` line; `None` for any other line,
/// or when its shape is not the usual one (the caller then reads it as a `Value`).
pub fn read(line: &str) -> Option<Turn<'_>> {
    let Obj(turn) = serde_json::from_str::<Obj<Turn<'_>>>(line).ok()?;
    matches!(turn.kind(), Some("assistant" | "user")).then_some(turn)
}

impl<'a> Turn<'a> {
    /// The line's `type`.
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_ref().map(Text::as_str)
    }

    /// The line's `session_id`.
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_ref().map(Text::as_str)
    }

    fn is_subagent(&self) -> bool {
        self.parent_tool_use_id.is_some()
    }

    /// The content blocks, empty when there are none.
    fn blocks(&self) -> &[Obj<Block<'a>>] {
        match &self.message {
            Some(Some(Obj(m))) => m.content.as_deref().unwrap_or_default(),
            _ => &[],
        }
    }

    /// [`crate::agent::claude_shape::on_assistant`] for a typed line.
    pub fn on_assistant(&self, core: &mut StreamCore, last: &mut LastMessage) -> Vec<AgentEvent> {
        if self.is_subagent() {
            return Vec::new();
        }
        let Some(message) = &self.message else {
            return Vec::new();
        };
        let message = message.as_ref().map(|Obj(m)| m);
        let blocks = self.blocks();
        let texts: Vec<&str> = blocks
            .iter()
            .filter(|Obj(b)| b.kind() == Some("text"))
            .filter_map(|Obj(b)| b.text.as_ref().map(Text::as_str))
            .collect();

        if let Some(code) = &self.error {
            core.classifier.observe(Signal::ErrorCode(code.as_str()));
            let message = if texts.is_empty() {
                code.as_str().to_owned()
            } else {
                texts.join("\n")
            };
            core.classifier.observe(Signal::Text(&message));
            core.error_event = Some(message.clone());
            return vec![AgentEvent::Error {
                message: strip_ansi(&message),
            }];
        }

        if core.model.is_none() {
            core.model = message
                .and_then(|m| m.model.as_ref())
                .map(Text::as_str)
                .filter(|m| *m != "<synthetic>")
                .map(str::to_owned);
        }
        let id = message
            .and_then(|m| m.id.as_ref())
            .map(|t| t.as_str().to_owned());
        last.push(id, &texts);

        let mut events = Vec::new();
        for Obj(block) in blocks {
            match block.kind() {
                Some("text") => {
                    if let Some(text) = &block.text {
                        events.push(AgentEvent::AssistantText {
                            text: text.as_str().to_owned(),
                        });
                    }
                }
                Some("tool_use") => {
                    let name = block
                        .name
                        .as_ref()
                        .map_or_else(|| "?".to_owned(), |n| n.as_str().to_owned());
                    events.push(AgentEvent::ToolCall {
                        name,
                        summary: summary(block.input),
                    });
                }
                _ => {}
            }
        }
        events
    }

    /// [`crate::agent::claude_shape::on_user`] for a typed line.
    pub fn on_user(&self) -> Vec<AgentEvent> {
        if self.is_subagent() {
            return Vec::new();
        }
        self.blocks()
            .iter()
            .filter(|Obj(b)| b.kind() == Some("tool_result"))
            .map(|Obj(b)| AgentEvent::ToolResult {
                is_error: b.is_error.unwrap_or(false),
                output: b.content.as_ref().and_then(ToolContent::output),
                exit_code: None,
            })
            .collect()
    }
}

impl Block<'_> {
    fn kind(&self) -> Option<&str> {
        self.kind.as_ref().map(Text::as_str)
    }
}

/// The one-line summary of a tool call's `input` ([`summarize_tool_input`]), reading only its
/// few string fields when one of them says enough.
fn summary(input: Option<&RawValue>) -> String {
    let Some(raw) = input else {
        return summarize_tool_input(&Value::Null);
    };
    let whole = || serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null);
    match serde_json::from_str::<Obj<InputKeys<'_>>>(raw.get()) {
        Ok(Obj(keys)) => summarize_with(
            |k| keys.get(k),
            keys.todos.as_ref().map(|Count(n)| *n),
            || match whole() {
                Value::Null => String::new(),
                other => other.to_string(),
            },
        ),
        Err(_) => summarize_tool_input(&whole()),
    }
}

/// `Some` of whatever the field holds, `null` included (so a missing field and a `null` one
/// differ).
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A JSON string, borrowed from the line unless it had escapes to undo.
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A JSON object read as `T`; anything else (an array in particular, which serde would
/// otherwise read into a struct field by field) is a mismatch.
#[derive(Debug)]
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        deserializer.deserialize_map(V(PhantomData))
    }
}

/// The length of a JSON array whose elements are skipped.
#[derive(Debug)]
struct Count(usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        deserializer.deserialize_seq(V)
    }
}

/// A tool result's `content`, read as the general rule reads it: a string, or an array whose
/// elements' `text` strings are joined with newlines; anything else holds no text.
#[derive(Debug)]
enum ToolContent<'a> {
    Text(Text<'a>),
    Parts(Vec<Text<'a>>),
    None,
}

impl ToolContent<'_> {
    /// The tool's output as events keep it ([`tool_output`]).
    fn output(&self) -> Option<String> {
        match self {
            ToolContent::Text(t) => tool_output(t.as_str()),
            ToolContent::Parts(parts) => tool_output(
                &parts
                    .iter()
                    .map(Text::as_str)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            ToolContent::None => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for ToolContent<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ToolContent<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ToolContent::Text(Text(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ToolContent::Text(Text(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(ToolContent::Text(Text(Cow::Owned(v))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element::<PartText<'de>>()? {
                    parts.extend(part.0);
                }
                Ok(ToolContent::Parts(parts))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ToolContent::None)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ToolContent::None)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ToolContent::None)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ToolContent::None)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ToolContent::None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ToolContent::None)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One element of a tool result's content array: its `text` when it is an object whose `text`
/// is a string (the last one, when the key repeats), else nothing.
struct PartText<'a>(Option<Text<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for PartText<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut text = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    if key.as_str() == "text" {
                        text = match map.next_value::<ToolContent<'de>>()? {
                            ToolContent::Text(t) => Some(t),
                            _ => None,
                        };
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(PartText(text))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(PartText(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(PartText(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    //! The fast path must give exactly what the general `Value` handlers give: the same events
    //! and the same facts in the core and the last message, line by line and over a sequence,
    //! for the usual lines (which it must take) and for odd shapes (which it may hand back).

    use super::*;
    use crate::agent::claude_shape::{self as shape};

    /// What reading `lines` left behind: the events, the core and the last message (as Debug
    /// text, which shows every field).
    type Outcome = (Vec<AgentEvent>, String, String);

    /// The general path alone: every line read as a `Value`.
    fn general(lines: &[&str]) -> Outcome {
        let mut core = StreamCore::default();
        let mut last = LastMessage::default();
        let mut events = Vec::new();
        for line in lines {
            let Some(v) = shape::read_line(line, &mut core) else {
                continue;
            };
            events.extend(match shape::line_type(&v) {
                Some("assistant") => shape::on_assistant(&v, &mut core, &mut last),
                Some("user") => shape::on_user(&v),
                _ => Vec::new(),
            });
        }
        (events, format!("{core:?}"), format!("{last:?}"))
    }

    /// The claude reader's way: the typed read first, the general one when it declines.
    fn fast(lines: &[&str]) -> Outcome {
        let mut core = StreamCore::default();
        let mut last = LastMessage::default();
        let mut events = Vec::new();
        for line in lines {
            if let Some(turn) = shape::read_turn(line, &mut core) {
                events.extend(match turn.kind() {
                    Some("assistant") => turn.on_assistant(&mut core, &mut last),
                    _ => turn.on_user(),
                });
                continue;
            }
            let Some(v) = shape::read_line(line, &mut core) else {
                continue;
            };
            events.extend(match shape::line_type(&v) {
                Some("assistant") => shape::on_assistant(&v, &mut core, &mut last),
                Some("user") => shape::on_user(&v),
                _ => Vec::new(),
            });
        }
        (events, format!("{core:?}"), format!("{last:?}"))
    }

    /// The usual lines: the typed read takes each of them.
    const USUAL: &[&str] = &[
        r#"{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"toolu_01","name":"Write","input":{"file_path":"/w/repo/hello.txt","content":"hi\n"}}],"stop_reason":null,"usage":{"input_tokens":4,"output_tokens":9}},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111","uuid":"u2"}"#,
        r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01","type":"tool_result","content":"File created successfully at: /w/repo/hello.txt"}]},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111","tool_use_result":{"type":"create","filePath":"/w/repo/hello.txt","content":"hi\n"}}"#,
        r#"{"type":"assistant","message":{"id":"msg_02","model":"claude-opus-5-5","content":[{"type":"text","text":"Created hello.txt. <promise>COMPLETE</promise>"}]},"parent_tool_use_id":null,"session_id":"3f2a9c40-1111"}"#,
        r#"{"type":"assistant","message":{"id":"msg_02","content":[{"type":"text","text":"second block, \"quoted\", caf\u00e9\nnext line"}]},"session_id":"3f2a9c40-1111"}"#,
        r#"{"type":"assistant","message":{"id":"msg_03","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":null},{"type":"tool_use","name":"Bash","input":{"command":"cargo  test\n-q","description":"run tests"}},{"type":"tool_use","name":"Grep","input":{"pattern":"fn main","path":"src"}},{"type":"tool_use","name":"TodoWrite","input":{"todos":[{"a":1},2,"x"]}},{"type":"tool_use","name":"Odd","input":{"z":1,"a":[true,null],"m":{"k":"v"}}},{"type":"tool_use","input":null},{"type":"tool_use","name":"NoInput"},{"type":"tool_use","name":"Arr","input":[1,2]},{"type":"tool_use","name":"Str","input":"just text"}]}}"#,
        r#"{"type":"user","message":{"content":[{"type":"tool_result","is_error":true,"content":[{"type":"text","text":"part one"},{"type":"image","source":{}},{"type":"text","text":"part two"},"loose",{"text":5},{"text":"a","text":"last wins"}]},{"type":"tool_result","content":null},{"type":"tool_result","content":7},{"type":"tool_result","content":{"text":"not read"}},{"type":"tool_result","content":"   "},{"type":"tool_result","content":[]},{"type":"text","text":"echoed prompt"}]}}"#,
        r#"{"type":"assistant","message":{"content":[{"type":"text","text":"no id, a message of its own"}]}}"#,
        r#"{"type":"assistant","message":{"id":"msg_s","model":"<synthetic>","content":[{"type":"text","text":"API Error: 529 overloaded"}]},"error":"overloaded_error"}"#,
        r#"{"type":"assistant","message":{"content":[]},"error":"rate_limit"}"#,
        r#"{"type":"assistant","message":{"id":"msg_sub","content":[{"type":"text","text":"subagent says"}]},"parent_tool_use_id":"toolu_09"}"#,
        r#"{"type":"user","message":{"content":[{"type":"tool_result","content":"sub result"}]},"parent_tool_use_id":"toolu_09"}"#,
        r#"{"type":"assistant","message":null}"#,
        r#"{"type":"assistant"}"#,
        r#"{"type":"user","message":{"content":null}}"#,
        "  \t{\"type\":\"assistant\",\"message\":{\"id\":\"msg_ws\",\"content\":[{\"type\":\"text\",\"text\":\"padded line\"}]}}  ",
        r#"{"t\u0079pe":"assistant","message":{"id":"msg_esc","content":[{"type":"text","text":"escaped key"}]}}"#,
    ];

    /// Odd shapes: the typed read may decline them; either way the outcome must not change.
    const ODD: &[&str] = &[
        r#"{"type":"user","message":{"role":"user","content":"the prompt, as a string"}}"#,
        r#"{"type":"assistant","message":"a string"}"#,
        r#"{"type":"assistant","message":[1,2]}"#,
        r#"{"type":"assistant","message":{"content":{"type":"text","text":"an object"}}}"#,
        r#"{"type":"assistant","message":{"content":["a string block",{"type":"text","text":"then text"}]}}"#,
        r#"{"type":"assistant","type":"user","message":{"content":[{"type":"tool_result","content":"dup type"}]}}"#,
        r#"{"type":5,"message":{"content":[{"type":"text","text":"numeric type"}]}}"#,
        r#"{"type":"assistant","session_id":7,"message":{"id":"m9","model":7,"content":[{"type":"text","text":"odd ids"}]}}"#,
        r#"{"type":"assistant","message":{"id":5,"content":[{"type":"text","text":7},{"type":"tool_use","name":9,"input":{"command":5,"path":"p"}}]}}"#,
        r#"{"type":"assistant","message":{"content":[{"type":"tool_use","name":"T","input":{"command":"a","command":"b"}},{"type":"tool_use","name":"U","input":{"todos":"x"}}]}}"#,
        r#"{"type":"assistant","message":{"content":[]},"error":{"code":"nested"}}"#,
        r#"{"type":"user","message":{"content":[{"type":"tool_result","is_error":"yes","content":"x"},{"type":"tool_result","is_error":1,"content":"y"}]}}"#,
        r#"{"type":"assistant","parent_tool_use_id":null,"parent_tool_use_id":"x","message":{"content":[{"type":"text","text":"dup parent"}]}}"#,
        r#"{"type":"system","subtype":"init","session_id":"s-init","model":"m"}"#,
        r#"{"type":"result","result":"done","session_id":"s-res"}"#,
        r#"[{"type":"assistant"}]"#,
        r#""a string""#,
        "not json at all",
        r#"{"type":"assistant","message":{"content":[{"type":"text","text":"torn"#,
        "",
    ];

    #[test]
    fn the_usual_lines_take_the_typed_read() {
        for line in USUAL {
            assert!(read(line.trim()).is_some(), "declined: {line}");
        }
        assert!(read(r#"{"type":"result","result":"x"}"#).is_none());
        assert!(read(r#"{"type":"system","subtype":"init"}"#).is_none());
    }

    #[test]
    fn each_line_reads_the_same_both_ways() {
        for line in USUAL.iter().chain(ODD) {
            assert_eq!(fast(&[line]), general(&[line]), "line: {line}");
        }
    }

    #[test]
    fn a_whole_stream_reads_the_same_both_ways() {
        let all: Vec<&str> = USUAL.iter().chain(ODD).copied().collect();
        assert_eq!(fast(&all), general(&all));
        let mut reversed = all.clone();
        reversed.reverse();
        assert_eq!(fast(&reversed), general(&reversed));
        // The odd lines first: the session and the model come from them, or not, the same way.
        let odd_first: Vec<&str> = ODD.iter().chain(USUAL).copied().collect();
        assert_eq!(fast(&odd_first), general(&odd_first));
    }

    #[test]
    fn long_tool_outputs_are_bounded_the_same_way() {
        let body = "x\\ty \\\"z\\\" é→\\n".repeat(2000);
        let user = format!(
            r#"{{"type":"user","message":{{"content":[{{"type":"tool_result","content":"{body}"}},{{"type":"tool_result","content":[{{"type":"text","text":"{body}"}},{{"type":"text","text":"{body}"}}]}}]}}}}"#
        );
        let assistant = format!(
            r#"{{"type":"assistant","message":{{"id":"m","content":[{{"type":"text","text":"{body}"}},{{"type":"tool_use","name":"Bash","input":{{"command":"{body}"}}}}]}}}}"#
        );
        assert!(read(&user).is_some() && read(&assistant).is_some());
        let lines = [user.as_str(), assistant.as_str()];
        assert_eq!(fast(&lines), general(&lines));
    }

    #[test]
    fn a_lone_surrogate_in_a_skipped_field_does_not_lose_the_line() {
        let line = r#"{"type":"user","message":{"content":[{"type":"tool_result","content":"ok"}]},"tool_use_result":{"stdout":"\ud800"}}"#;
        assert_eq!(
            general(&[line]).0,
            Vec::new(),
            "the general path refuses it"
        );
        assert_eq!(
            fast(&[line]).0,
            vec![AgentEvent::ToolResult {
                is_error: false,
                output: Some("ok".into()),
                exit_code: None
            }]
        );
    }
}
