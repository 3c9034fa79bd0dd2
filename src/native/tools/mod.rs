//! The tools ralph's native loop offers the model: reading, writing, editing, listing and
//! searching files, running shell commands, and ralph's two own tools that record progress
//! (`mark_story`, `append_progress`).
//!
//! This module owns the tool *contract*: each tool's name, description and argument schema
//! ([`ToolRegistry::specs`]), argument parsing, and the split between errors the model can fix
//! ([`ToolError::RespondToModel`], sent back as the tool result) and errors that end the session
//! ([`ToolError::Fatal`]). One file per tool; `paths.rs` confines every path to the repository.
//!
//! Arguments are parsed leniently where small models are known to slip: a JSON object encoded as
//! a string is accepted, `null` means `{}`, and numbers or booleans written as strings (`"10"`,
//! `"true"`) are accepted. Unknown fields are ignored.

use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

mod append_progress;
mod edit_file;
mod list_files;
mod mark_story;
mod paths;
mod read_file;
mod run_command;
mod search;
mod write_file;

pub use mark_story::{StoryCheck, CHECK_TAIL_BYTES, CHECK_TAIL_LINES};

/// Default wall-clock limit for one `run_command` call: 120 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Default cap on one tool result's content: 16 KiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 * 1024;

/// What the tools need to know about the session.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The repository root, canonical (symlinks resolved). Every path argument is confined to it.
    pub repo_root: PathBuf,
    /// The prd.json `mark_story` edits (ralph's file: not confined to the repository).
    pub prd_path: PathBuf,
    /// The progress.txt `append_progress` appends to (ralph's file: not confined).
    pub progress_path: PathBuf,
    /// Default wall-clock limit of `run_command`; the model may ask for another with `timeout_s`.
    pub command_timeout: Duration,
    /// Cap in bytes on the content of one tool result (file excerpts, listings, search results,
    /// command output). Longer results are cut with a note saying how to get the rest.
    pub max_output_bytes: usize,
    /// Ctrl-C / timeout of the session: stops a running command (its whole process group) and a
    /// walk over the repository.
    pub stop: crate::process::StopSignals,
    /// Environment variables removed before `run_command` starts its shell, e.g. the API key
    /// variable, so the model cannot print a secret into the transcript.
    pub env_remove: Vec<String>,
    /// The check `mark_story` runs before it records `passes: true` (`None`: it records without
    /// one). See [`StoryCheck`].
    pub story_check: Option<StoryCheck>,
}

impl ToolContext {
    /// A context with the defaults: [`DEFAULT_COMMAND_TIMEOUT`], [`DEFAULT_MAX_OUTPUT_BYTES`], no
    /// stop requested, nothing removed from the environment, no story check. `repo_root` must be canonical
    /// (see [`std::fs::canonicalize`]).
    pub fn new(repo_root: PathBuf, prd_path: PathBuf, progress_path: PathBuf) -> ToolContext {
        ToolContext {
            repo_root,
            prd_path,
            progress_path,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            stop: crate::process::StopSignals::default(),
            env_remove: Vec::new(),
            story_check: None,
        }
    }
}

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The model can fix it (bad arguments, a path outside the repository, an edit that matched
    /// nothing, an unknown story id): the message goes back as the tool result, flagged as an
    /// error, and the loop goes on. The message says what was expected.
    #[error("{0}")]
    RespondToModel(String),
    /// An invariant ralph relies on is broken (the repository root is gone, prd.json cannot be
    /// read or written, `bash` cannot be started): the session must stop.
    #[error("{0}")]
    Fatal(String),
}

/// The result of a successful tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// What the model reads as the tool result (at most about `max_output_bytes`).
    pub content: String,
    /// One line for the terminal, at most 120 characters.
    pub summary: String,
}

/// Longest [`ToolOutput::summary`], in characters.
const SUMMARY_CHARS: usize = 120;

/// The tools ralph knows. The order is the order offered to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    ReadFile,
    WriteFile,
    EditFile,
    ListFiles,
    Search,
    RunCommand,
    MarkStory,
    AppendProgress,
}

impl Tool {
    const ALL: [Tool; 8] = [
        Tool::ReadFile,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::ListFiles,
        Tool::Search,
        Tool::RunCommand,
        Tool::MarkStory,
        Tool::AppendProgress,
    ];

    fn name(self) -> &'static str {
        match self {
            Tool::ReadFile => "read_file",
            Tool::WriteFile => "write_file",
            Tool::EditFile => "edit_file",
            Tool::ListFiles => "list_files",
            Tool::Search => "search",
            Tool::RunCommand => "run_command",
            Tool::MarkStory => "mark_story",
            Tool::AppendProgress => "append_progress",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Tool::ReadFile => read_file::DESCRIPTION,
            Tool::WriteFile => write_file::DESCRIPTION,
            Tool::EditFile => edit_file::DESCRIPTION,
            Tool::ListFiles => list_files::DESCRIPTION,
            Tool::Search => search::DESCRIPTION,
            Tool::RunCommand => run_command::DESCRIPTION,
            Tool::MarkStory => mark_story::DESCRIPTION,
            Tool::AppendProgress => append_progress::DESCRIPTION,
        }
    }

    fn schema(self) -> Value {
        match self {
            Tool::ReadFile => read_file::schema(),
            Tool::WriteFile => write_file::schema(),
            Tool::EditFile => edit_file::schema(),
            Tool::ListFiles => list_files::schema(),
            Tool::Search => search::schema(),
            Tool::RunCommand => run_command::schema(),
            Tool::MarkStory => mark_story::schema(),
            Tool::AppendProgress => append_progress::schema(),
        }
    }

    async fn run(self, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        match self {
            Tool::ReadFile => blocking(parse(self, args)?, ctx, read_file::run).await,
            Tool::WriteFile => blocking(parse(self, args)?, ctx, write_file::run).await,
            Tool::EditFile => blocking(parse(self, args)?, ctx, edit_file::run).await,
            Tool::ListFiles => blocking(parse(self, args)?, ctx, list_files::run).await,
            Tool::Search => blocking(parse(self, args)?, ctx, search::run).await,
            Tool::RunCommand => run_command::run(parse(self, args)?, ctx).await,
            Tool::MarkStory => mark_story::run(parse(self, args)?, ctx).await,
            Tool::AppendProgress => blocking(parse(self, args)?, ctx, append_progress::run).await,
        }
    }
}

/// Runs a tool's file-system work on the blocking pool, so a walk over a large repository does
/// not stall the runtime that also drives the HTTP stream and the signal handling.
async fn blocking<A: Send + 'static, T: Send + 'static>(
    args: A,
    ctx: &ToolContext,
    work: fn(A, &ToolContext) -> Result<T, ToolError>,
) -> Result<T, ToolError> {
    let ctx = ctx.clone();
    tokio::task::spawn_blocking(move || work(args, &ctx))
        .await
        .map_err(|err| ToolError::Fatal(format!("a tool task failed: {err}")))?
}

/// The set of tools offered to the model, and the dispatcher that runs a call.
#[derive(Debug, Clone)]
pub struct ToolRegistry {
    tools: Vec<Tool>,
}

impl ToolRegistry {
    /// All eight tools: `read_file`, `write_file`, `edit_file`, `list_files`, `search`,
    /// `run_command`, `mark_story`, `append_progress`.
    pub fn standard() -> ToolRegistry {
        ToolRegistry {
            tools: Tool::ALL.to_vec(),
        }
    }

    /// The tool names, in the order they are offered.
    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|tool| tool.name()).collect()
    }

    /// What is sent to the model for each tool: `(name, description, parameters)`, where
    /// `parameters` is the JSON Schema (draft 2020-12 subset: `type`, `properties`,
    /// `description`, `required`) of the arguments object. Mapped to the provider's tool format
    /// by the caller.
    pub fn specs(&self) -> Vec<(String, String, Value)> {
        self.tools
            .iter()
            .map(|tool| {
                (
                    tool.name().to_string(),
                    tool.description().to_string(),
                    tool.schema(),
                )
            })
            .collect()
    }

    /// Runs the tool `name` with the arguments object `args`.
    ///
    /// Dropping the future stops a running command at once (its process group is killed);
    /// [`ToolContext::stop`] stops it too, and also ends a walk over the repository.
    ///
    /// # Errors
    /// [`ToolError::RespondToModel`] for an unknown tool (listing the known ones), arguments that
    /// do not fit the schema (saying which fields and types are expected), and every failure the
    /// model can fix (see each tool). [`ToolError::Fatal`] when the session cannot go on.
    pub async fn dispatch(
        &self,
        name: &str,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.tools.iter().find(|tool| tool.name() == name) else {
            return Err(ToolError::RespondToModel(format!(
                "unknown tool `{name}`; the available tools are: {}",
                self.names().join(", ")
            )));
        };
        tool.run(args, ctx).await
    }
}

/// Parses a tool's arguments, leniently about the envelope (see the module doc).
fn parse<T: DeserializeOwned>(tool: Tool, args: &Value) -> Result<T, ToolError> {
    let decoded;
    let args = match args {
        Value::Null => {
            decoded = Value::Object(serde_json::Map::new());
            &decoded
        }
        // Some models send the arguments object as a JSON string.
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(value @ Value::Object(_)) => {
                decoded = value;
                &decoded
            }
            _ => args,
        },
        other => other,
    };
    let problem = if args.is_object() {
        match T::deserialize(args) {
            Ok(parsed) => return Ok(parsed),
            Err(err) => err.to_string(),
        }
    } else {
        format!("expected a JSON object, got {}", kind_of(args))
    };
    Err(ToolError::RespondToModel(format!(
        "invalid arguments for `{}`: {problem}. Expected {}",
        tool.name(),
        expected_shape(&tool.schema())
    )))
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `{"path": string, "offset"?: integer}` from a schema: the shape shown in argument errors
/// (`?` marks optional fields).
fn expected_shape(schema: &Value) -> String {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fields: Vec<String> = schema["properties"]
        .as_object()
        .map(|props| {
            props
                .iter()
                .map(|(name, prop)| {
                    let optional = if required.contains(&name.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    let kind = prop["type"].as_str().unwrap_or("any");
                    format!("\"{name}\"{optional}: {kind}")
                })
                .collect()
        })
        .unwrap_or_default();
    format!("{{{}}}", fields.join(", "))
}

/// `text` on one line (newlines and tabs become spaces), cut to 120 characters with `…`.
fn summary(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= SUMMARY_CHARS {
        return flat;
    }
    let mut cut: String = flat.chars().take(SUMMARY_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Deserializers that accept what small models write instead of the schema's types.
mod lenient {
    use super::{Deserialize, Deserializer, Value};
    use serde::de::Error;

    /// A whole number ≥ 0, also written as `10.0` or `"10"`; `null` is `None`.
    pub(super) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let value = Value::deserialize(d)?;
        let parsed = match &value {
            Value::Null => return Ok(None),
            Value::Number(n) => n.as_u64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(53))
                    .map(|f| f as u64)
            }),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        parsed
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected a whole number ≥ 0, got {value}")))
    }

    /// `true` / `false`, also written as `"true"` / `"false"`.
    pub(super) fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        let value = Value::deserialize(d)?;
        match &value {
            Value::Bool(b) => Ok(*b),
            Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Ok(true),
            Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Ok(false),
            _ => Err(D::Error::custom(format!(
                "expected true or false, got {value}"
            ))),
        }
    }

    /// Like [`bool`], with `null` meaning `false`.
    pub(super) fn bool_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        let value = Value::deserialize(d)?;
        if value.is_null() {
            return Ok(false);
        }
        bool(value).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_schema_is_an_object_with_documented_properties_and_known_required_fields() {
        for (name, description, schema) in ToolRegistry::standard().specs() {
            assert!(!description.is_empty(), "{name}");
            assert_eq!(schema["type"], "object", "{name}");
            let props = schema["properties"].as_object().unwrap();
            for (field, prop) in props {
                assert!(prop["type"].is_string(), "{name}.{field}");
                assert!(prop["description"].is_string(), "{name}.{field}");
            }
            for required in schema["required"].as_array().unwrap() {
                assert!(props.contains_key(required.as_str().unwrap()), "{name}");
            }
        }
    }

    #[test]
    fn argument_errors_say_what_is_expected() {
        let err = parse::<read_file::Args>(Tool::ReadFile, &json!({"offset": 3})).unwrap_err();
        let ToolError::RespondToModel(message) = err else {
            panic!("{err:?}")
        };
        assert!(message.contains("missing field `path`"), "{message}");
        assert!(
            message.contains(r#"{"path": string, "offset"?: integer, "limit"?: integer}"#),
            "{message}"
        );

        let err = parse::<read_file::Args>(Tool::ReadFile, &json!([1])).unwrap_err();
        assert!(err
            .to_string()
            .contains("expected a JSON object, got an array"));

        let err = parse::<read_file::Args>(Tool::ReadFile, &json!({"path": "a", "limit": -2}))
            .unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
    }

    #[test]
    fn lenient_envelopes_and_scalars_are_accepted() {
        let args: read_file::Args = parse(
            Tool::ReadFile,
            &json!(r#"{"path": "a.txt", "offset": "3", "limit": 10.0}"#),
        )
        .unwrap();
        assert_eq!(
            (args.path.as_str(), args.offset, args.limit),
            ("a.txt", Some(3), Some(10))
        );
        let args: edit_file::Args = parse(
            Tool::EditFile,
            &json!({"path": "a", "old_string": "x", "new_string": "y", "replace_all": "TRUE"}),
        )
        .unwrap();
        assert!(args.replace_all);
        let args: list_files::Args = parse(Tool::ListFiles, &Value::Null).unwrap();
        assert!(args.pattern.is_none() && args.path.is_none());
    }

    #[test]
    fn summaries_are_one_short_line() {
        assert_eq!(summary("a\nb\tc"), "a b c");
        let long = summary(&"x".repeat(500));
        assert_eq!(long.chars().count(), 120);
        assert!(long.ends_with('…'));
    }
}
