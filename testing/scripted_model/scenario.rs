//! The scenario: what the scripted model answers, decided from the conversation a request
//! carries, whatever wire protocol carried it. Each protocol module reads its request body into a
//! [`Conversation`] and renders the [`Turn`] that [`decide`] picks. Format:
//! `testing/README-model.md`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The text appended to the final answer when every story in prd.json passes.
pub(crate) const PROMISE: &str = "<promise>COMPLETE</promise>";

/// Why a scenario file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The scenario path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not JSON of the expected shape.
    #[error("scenario {path} is not valid: {source} (format: testing/README-model.md)")]
    Parse {
        /// The scenario path.
        path: PathBuf,
        /// The JSON error, with line and column.
        source: serde_json::Error,
    },
    /// The JSON parsed but a field breaks a rule.
    #[error("scenario {path}: {at}: {message} (format: testing/README-model.md)")]
    Invalid {
        /// The scenario path.
        path: PathBuf,
        /// Where: `stories.US-001[2]`, `error`, …
        at: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// The scenario file as written (see `testing/README-model.md`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScenarioFile {
    /// Free text for humans; read only so that it is not refused as unknown.
    #[serde(default, rename = "description")]
    _description: Option<String>,
    /// Story id → steps.
    #[serde(default)]
    stories: BTreeMap<String, Vec<StepFile>>,
    /// For requests with no `Story ID:` line (ralph plan's and ralph convert's prompts): a
    /// piece of text of the user's messages → steps. The first key (in sorted order) found in
    /// them applies.
    #[serde(default)]
    prompts: BTreeMap<String, Vec<StepFile>>,
    /// When set, every Messages request gets this error.
    #[serde(default)]
    error: Option<ErrorFile>,
}

/// One step as written: exactly one of `write`, `shell`, `tool`, `final`, `error`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepFile {
    /// Write a file, with whichever tool the client's CLI offers for that.
    write: Option<WriteFile>,
    /// Run a shell command, with whichever tool the client's CLI offers for that.
    shell: Option<ShellFile>,
    /// A tool name for one wire protocol only, e.g. claude's `Write`, `Bash`.
    tool: Option<String>,
    /// The tool's input object.
    input: Option<Value>,
    /// Text block sent before the tool call.
    text: Option<String>,
    /// Final text of an `end_turn` turn.
    #[serde(rename = "final")]
    final_text: Option<String>,
    /// When the final text gets the promise; default [`Promise::Auto`].
    promise: Option<Promise>,
    /// An HTTP error instead of a turn.
    error: Option<ErrorFile>,
}

/// A `write` step as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteFile {
    /// Path relative to the repository.
    path: String,
    /// The file's new content.
    content: String,
}

/// A `shell` step as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellFile {
    /// The command line (run by the CLI's shell tool in the repository).
    command: String,
    /// A short description, for CLIs whose shell tool takes one.
    #[serde(default)]
    description: Option<String>,
}

/// An HTTP error reply as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorFile {
    /// HTTP status, 400..=599.
    status: u16,
    /// The API's `error.message`.
    message: String,
    /// The API's `error.type`; default: the one matching `status`.
    #[serde(rename = "type")]
    error_type: Option<String>,
}

/// When the final text gets the completion promise appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Promise {
    /// Iff prd.json in the repository, read when the final turn is answered, has every story
    /// passing.
    Auto,
    /// Always (a premature claim when stories are still open).
    Always,
    /// Never.
    Never,
}

/// A validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scenario {
    pub(crate) stories: BTreeMap<String, Vec<Step>>,
    /// Text to look for in the user's messages → steps, for requests without a story id.
    pub(crate) prompts: BTreeMap<String, Vec<Step>>,
    pub(crate) error: Option<ErrorReply>,
}

/// One scripted model turn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Ask the client to run a tool (`{repo}` and `{story}` are substituted in every string
    /// of the call and in `text`).
    Tool { call: Call, text: Option<String> },
    /// End the turn with this text.
    Final { text: String, promise: Promise },
    /// Answer with an HTTP error.
    Error(ErrorReply),
}

/// A tool call a step asks for, before it is put into a wire protocol's words.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    /// Write `content` to `path` (absolute once substituted: the repository joined with the
    /// scenario's relative path).
    Write { path: String, content: String },
    /// Run `command` in a shell.
    Shell {
        command: String,
        description: Option<String>,
    },
    /// A tool call spelt for one protocol: this name and input, as written.
    Raw { name: String, input: Value },
}

impl Call {
    /// A short label for the request log: the raw tool's name, `write` or `shell`.
    pub(crate) fn label(&self) -> String {
        match self {
            Call::Write { .. } => "write".to_owned(),
            Call::Shell { .. } => "shell".to_owned(),
            Call::Raw { name, .. } => name.clone(),
        }
    }
}

/// An HTTP error reply; each wire protocol puts it into its own envelope.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ErrorReply {
    /// HTTP status, 400..=599.
    pub(crate) status: u16,
    /// The API's error type or code, when the scenario names one (e.g. `authentication_error`,
    /// `insufficient_quota`); otherwise each protocol uses the one that matches `status`.
    pub(crate) error_type: Option<String>,
    /// The error message.
    pub(crate) message: String,
}

impl ErrorReply {
    /// An error with the protocol's default type for `status`.
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        ErrorReply {
            status,
            error_type: None,
            message: message.into(),
        }
    }
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the file and, for rule violations, the step.
    pub(crate) fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let bytes = fs::read(path).map_err(|source| ScenarioError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: ScenarioFile =
            serde_json::from_slice(&bytes).map_err(|source| ScenarioError::Parse {
                path: path.to_owned(),
                source,
            })?;
        Scenario::from_file(file).map_err(|(at, message)| ScenarioError::Invalid {
            path: path.to_owned(),
            at,
            message,
        })
    }

    /// Validates the parsed file; errors are `(where, what)`.
    pub(crate) fn from_file(file: ScenarioFile) -> Result<Scenario, (String, String)> {
        let error = file
            .error
            .map(|e| error_reply(e).map_err(|m| ("error".to_owned(), m)))
            .transpose()?;
        if file.stories.is_empty() && file.prompts.is_empty() && error.is_none() {
            return Err((
                "stories".to_owned(),
                "no stories, no prompts and no scenario-level error: add `\"stories\": \
                 {\"US-001\": [...]}`"
                    .to_owned(),
            ));
        }
        if let Some(key) = file.prompts.keys().find(|k| k.trim().is_empty()) {
            return Err((
                format!("prompts.{key:?}"),
                "an empty key matches every request: use a piece of the prompt's text".to_owned(),
            ));
        }
        let stories = steps_by_key(file.stories, "stories")?;
        let prompts = steps_by_key(file.prompts, "prompts")?;
        Ok(Scenario {
            stories,
            prompts,
            error,
        })
    }
}

/// Validates each list of steps of `lists` (`stories` or `prompts`, named by `field`).
fn steps_by_key(
    lists: BTreeMap<String, Vec<StepFile>>,
    field: &str,
) -> Result<BTreeMap<String, Vec<Step>>, (String, String)> {
    let mut stories = BTreeMap::new();
    for (id, steps) in lists {
        if steps.is_empty() {
            return Err((
                format!("{field}.{id}"),
                "empty step list: end it with a `final` step".to_owned(),
            ));
        }
        let last = steps.len() - 1;
        let mut parsed = Vec::with_capacity(steps.len());
        for (i, step) in steps.into_iter().enumerate() {
            let at = format!("{field}.{id}[{i}]");
            let step = parse_step(step).map_err(|m| (at.clone(), m))?;
            let terminal = !matches!(step, Step::Tool { .. });
            if terminal && i != last {
                return Err((
                    at,
                    "a `final` or `error` step must be the last one".to_owned(),
                ));
            }
            if !terminal && i == last {
                return Err((
                    at,
                    "the last step must be `final` (or `error`): the client needs an answer \
                     after the last tool result"
                        .to_owned(),
                ));
            }
            parsed.push(step);
        }
        stories.insert(id, parsed);
    }
    Ok(stories)
}

fn error_reply(e: ErrorFile) -> Result<ErrorReply, String> {
    if !(400..=599).contains(&e.status) {
        return Err(format!(
            "status {} is not an HTTP error (use 400..=599)",
            e.status
        ));
    }
    let mut reply = ErrorReply::new(e.status, e.message);
    reply.error_type = e.error_type;
    Ok(reply)
}

fn parse_step(step: StepFile) -> Result<Step, String> {
    let kinds = [
        step.write.is_some(),
        step.shell.is_some(),
        step.tool.is_some(),
        step.final_text.is_some(),
        step.error.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err(
            "a step needs exactly one of `write`, `shell`, `tool`, `final` or `error`".to_owned(),
        );
    }
    let portable = match (step.write, step.shell) {
        (Some(w), _) => Some(Call::Write {
            path: w.path,
            content: w.content,
        }),
        (_, Some(s)) => Some(Call::Shell {
            command: s.command,
            description: s.description,
        }),
        _ => None,
    };
    if let Some(call) = portable {
        if step.promise.is_some() || step.input.is_some() {
            return Err(
                "`promise` and `input` do not belong on a `write` or `shell` step".to_owned(),
            );
        }
        return Ok(Step::Tool {
            call,
            text: step.text,
        });
    }
    if let Some(name) = step.tool {
        if step.promise.is_some() {
            return Err("`promise` belongs on a `final` step".to_owned());
        }
        let input = step
            .input
            .ok_or_else(|| format!("tool `{name}` needs an `input` object"))?;
        if !input.is_object() {
            return Err(format!("tool `{name}`: `input` must be a JSON object"));
        }
        return Ok(Step::Tool {
            call: Call::Raw { name, input },
            text: step.text,
        });
    }
    if step.input.is_some() || step.text.is_some() {
        return Err("`input` and `text` belong on a `tool`, `write` or `shell` step".to_owned());
    }
    if let Some(text) = step.final_text {
        return Ok(Step::Final {
            text,
            promise: step.promise.unwrap_or(Promise::Auto),
        });
    }
    if step.promise.is_some() {
        return Err("`promise` belongs on a `final` step".to_owned());
    }
    match step.error {
        Some(e) => error_reply(e).map(Step::Error),
        None => Err(
            "a step needs exactly one of `write`, `shell`, `tool`, `final` or `error`".to_owned(),
        ),
    }
}

/// What the server reads from one request, whatever its protocol.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Conversation {
    /// The first `Story ID: <id>` in the first user message.
    pub(crate) story: Option<String>,
    /// The text of the user's messages (each protocol's first user message, or all of them),
    /// where the scenario's `prompts` keys are looked for when there is no story id.
    pub(crate) user_text: String,
    /// The repository: see [`find_repo`].
    pub(crate) repo: Option<String>,
    /// How many tool results the conversation holds: the index of the step to answer.
    pub(crate) step: usize,
    /// The text of the latest tool result when it was an error (for the log).
    pub(crate) last_tool_error: Option<String>,
    /// The requested model, echoed back.
    pub(crate) model: Option<String>,
}

/// Collects every string inside `v`, depth first, in document order.
pub(crate) fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => map.values().for_each(|i| strings(i, out)),
        _ => {}
    }
}

/// The text right after `marker` up to the end of its line, trimmed; `None` when absent or
/// empty.
pub(crate) fn after_marker<'a>(haystack: &'a str, marker: &str) -> Option<&'a str> {
    let start = haystack.find(marker)? + marker.len();
    let rest = &haystack[start..];
    let line = rest.split(['\n', '\r']).next().unwrap_or("").trim();
    (!line.is_empty()).then_some(line)
}

/// The story id of the first `Story ID: <id>` line among `texts` (the first user message's
/// strings); Markdown quotes or stars around the id are ignored.
pub(crate) fn find_story(texts: &[&str]) -> Option<String> {
    texts.iter().find_map(|t| {
        let token = after_marker(t, "Story ID:")?.split_whitespace().next()?;
        let id = token.trim_matches(|c| matches!(c, '`' | '*' | '"' | '\''));
        (!id.is_empty()).then(|| id.to_owned())
    })
}

/// The repository path among `texts` (every string of the request): claude's `Primary working
/// directory: <path>` line, codex's `<cwd><path></cwd>` environment block, or ralph's own
/// prompt line ``…the git repository at `<path>`…``, in that order of preference.
pub(crate) fn find_repo(texts: &[&str]) -> Option<String> {
    let primary = texts
        .iter()
        .find_map(|t| after_marker(t, "Primary working directory:"));
    let cwd_tag = || {
        texts.iter().find_map(|t| {
            let start = t.find("<cwd>")? + "<cwd>".len();
            let end = t[start..].find("</cwd>")? + start;
            let path = t[start..end].trim();
            (!path.is_empty()).then_some(path)
        })
    };
    let prompt = || {
        texts.iter().find_map(|t| {
            let marker = "git repository at `";
            let start = t.find(marker)? + marker.len();
            let end = t[start..].find('`')? + start;
            let path = t[start..end].trim();
            (!path.is_empty()).then_some(path)
        })
    };
    primary.or_else(cwd_tag).or_else(prompt).map(str::to_owned)
}

/// The reply decided for a request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Turn {
    /// A tool call (already substituted).
    Tool { call: Call, text: Option<String> },
    /// The final text (already substituted, promise appended when due).
    Final { text: String, promise: bool },
    /// An HTTP error.
    Error(ErrorReply),
}

/// Replaces `{repo}` and `{story}` in every string inside `v`.
fn substitute(v: &Value, repo: &str, story: &str) -> Value {
    match v {
        Value::String(s) => Value::String(subst_str(s, repo, story)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| substitute(i, repo, story)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, i)| (k.clone(), substitute(i, repo, story)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn subst_str(s: &str, repo: &str, story: &str) -> String {
    s.replace("{repo}", repo).replace("{story}", story)
}

/// Whether `<repo>/prd.json` has at least one story and every story has `passes: true`.
///
/// # Errors
/// A message naming the file when it cannot be read or has no `userStories` array.
pub(crate) fn all_stories_pass(repo: &Path) -> Result<bool, String> {
    let path = repo.join("prd.json");
    let bytes = fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let prd: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let stories = prd
        .get("userStories")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{} has no `userStories` array", path.display()))?;
    Ok(!stories.is_empty()
        && stories
            .iter()
            .all(|s| s.get("passes").and_then(Value::as_bool) == Some(true)))
}

/// Decides the reply for `conv` from the scenario.
pub(crate) fn decide(scenario: &Scenario, conv: &Conversation) -> Turn {
    if let Some(e) = &scenario.error {
        return Turn::Error(e.clone());
    }
    let prompt = || {
        scenario
            .prompts
            .iter()
            .find(|(key, _)| conv.user_text.contains(key.as_str()))
    };
    let (story, steps) = match (conv.story.as_deref(), prompt()) {
        (Some(story), _) => (story, scenario.stories.get(story)),
        (None, Some((key, steps))) => (key.as_str(), Some(steps)),
        (None, None) => {
            return Turn::Error(ErrorReply::new(
                400,
                "ralph-scripted-model: no `Story ID: <id>` line in the first user message and \
                 none of the scenario's `prompts` in it, so no scripted answer applies",
            ))
        }
    };
    let Some(steps) = steps else {
        let known: Vec<&str> = scenario.stories.keys().map(String::as_str).collect();
        return Turn::Error(ErrorReply::new(
            400,
            format!(
                "ralph-scripted-model: the scenario has no story `{story}` (it scripts: {})",
                known.join(", ")
            ),
        ));
    };
    let Some(step) = steps.get(conv.step) else {
        return Turn::Error(ErrorReply::new(
            400,
            format!(
                "ralph-scripted-model: story `{story}` has {} steps but the conversation already \
                 holds {} tool results",
                steps.len(),
                conv.step
            ),
        ));
    };
    let Some(repo) = conv.repo.as_deref() else {
        return Turn::Error(ErrorReply::new(
            400,
            "ralph-scripted-model: no working directory in the request (ralph's prompt line \
             `git repository at `<path>``, claude's `Primary working directory:`, codex's \
             `<cwd>`), so `{repo}` cannot be substituted",
        ));
    };
    match step {
        Step::Tool { call, text } => Turn::Tool {
            call: match call {
                Call::Write { path, content } => Call::Write {
                    path: Path::new(repo)
                        .join(subst_str(path, repo, story))
                        .to_string_lossy()
                        .into_owned(),
                    content: subst_str(content, repo, story),
                },
                Call::Shell {
                    command,
                    description,
                } => Call::Shell {
                    command: subst_str(command, repo, story),
                    description: description.as_deref().map(|d| subst_str(d, repo, story)),
                },
                Call::Raw { name, input } => Call::Raw {
                    name: name.clone(),
                    input: substitute(input, repo, story),
                },
            },
            text: text.as_deref().map(|t| subst_str(t, repo, story)),
        },
        Step::Final { text, promise } => {
            let promise = match promise {
                Promise::Always => true,
                Promise::Never => false,
                // An unreadable prd.json means "not complete": the server must not claim more
                // than the files show.
                Promise::Auto => all_stories_pass(Path::new(repo)).unwrap_or(false),
            };
            let mut text = subst_str(text, repo, story);
            if promise {
                text.push('\n');
                text.push_str(PROMISE);
            }
            Turn::Final { text, promise }
        }
        Step::Error(e) => Turn::Error(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn scenario(v: Value) -> Result<Scenario, (String, String)> {
        Scenario::from_file(serde_json::from_value(v).expect("scenario JSON shape"))
    }

    fn two_step() -> Scenario {
        scenario(json!({"stories": {"US-001": [
            {"tool": "Write", "input": {"file_path": "{repo}/a.txt", "content": "{story}"}},
            {"final": "Implemented {story}."}
        ]}}))
        .expect("valid scenario")
    }

    fn conv(story: &str, repo: &str, step: usize) -> Conversation {
        Conversation {
            story: Some(story.into()),
            repo: Some(repo.into()),
            step,
            ..Conversation::default()
        }
    }

    #[test]
    fn finds_the_repository_in_each_clients_words() {
        assert_eq!(
            find_repo(&["x\nPrimary working directory: /a/b\ny"]).as_deref(),
            Some("/a/b")
        );
        assert_eq!(
            find_repo(&["<environment_context>\n  <cwd>/c/d</cwd>"]).as_deref(),
            Some("/c/d")
        );
        assert_eq!(
            find_repo(&["You are an agent working in the git repository at `/e/f`.\n"]).as_deref(),
            Some("/e/f")
        );
        assert_eq!(find_repo(&["nothing here"]), None);
        assert_eq!(
            find_story(&["a", "Story ID: **US-003**\n"]).as_deref(),
            Some("US-003")
        );
    }

    #[test]
    fn raw_tool_steps_substitute_repo_and_story() {
        let turn = decide(&two_step(), &conv("US-001", "/w/r", 0));
        assert_eq!(
            turn,
            Turn::Tool {
                call: Call::Raw {
                    name: "Write".into(),
                    input: json!({"file_path": "/w/r/a.txt", "content": "US-001"}),
                },
                text: None
            }
        );
    }

    #[test]
    fn portable_steps_become_absolute_writes_and_shell_commands() {
        let s = scenario(json!({"stories": {"US-1": [
            {"write": {"path": "src/{story}.txt", "content": "for {story}"}, "text": "Writing."},
            {"shell": {"command": "cd {repo} && ls", "description": "list"}},
            {"final": "done"}
        ]}}))
        .expect("valid");
        assert_eq!(
            decide(&s, &conv("US-1", "/w/r", 0)),
            Turn::Tool {
                call: Call::Write {
                    path: "/w/r/src/US-1.txt".into(),
                    content: "for US-1".into()
                },
                text: Some("Writing.".into())
            }
        );
        assert_eq!(
            decide(&s, &conv("US-1", "/w/r", 1)),
            Turn::Tool {
                call: Call::Shell {
                    command: "cd /w/r && ls".into(),
                    description: Some("list".into())
                },
                text: None
            }
        );
    }

    #[test]
    fn final_text_gets_the_promise_only_when_prd_has_every_story_passing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().to_str().expect("utf-8 path").to_owned();
        let prd = |passes: [bool; 2]| {
            json!({"userStories": [{"id": "A", "passes": passes[0]}, {"id": "B", "passes": passes[1]}]})
                .to_string()
        };
        let c = conv("US-001", &repo, 1);

        fs::write(dir.path().join("prd.json"), prd([true, false])).expect("write prd");
        assert_eq!(
            decide(&two_step(), &c),
            Turn::Final {
                text: "Implemented US-001.".into(),
                promise: false
            }
        );

        fs::write(dir.path().join("prd.json"), prd([true, true])).expect("write prd");
        assert_eq!(
            decide(&two_step(), &c),
            Turn::Final {
                text: format!("Implemented US-001.\n{PROMISE}"),
                promise: true
            }
        );

        fs::remove_file(dir.path().join("prd.json")).expect("remove prd");
        assert!(matches!(
            decide(&two_step(), &c),
            Turn::Final { promise: false, .. }
        ));
    }

    #[test]
    fn unknown_story_and_exhausted_steps_are_400s_that_say_why() {
        let s = two_step();
        let Turn::Error(e) = decide(&s, &conv("US-404", "/w", 0)) else {
            panic!("expected an error reply")
        };
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains("no story `US-404`") && e.message.contains("US-001"),
            "{}",
            e.message
        );
        let Turn::Error(e) = decide(&s, &conv("US-001", "/w", 5)) else {
            panic!("expected an error reply")
        };
        assert!(e.message.contains("has 2 steps"), "{}", e.message);
    }

    #[test]
    fn a_request_without_a_story_id_is_answered_by_the_prompt_it_contains() {
        let s = scenario(json!({"prompts": {
            "writing a product requirements document": [{"final": "{\"title\": \"x\"}", "promise": "never"}],
            "clarifying questions": [{"final": "questions", "promise": "never"}]
        }}))
        .expect("valid");
        let asked = |text: &str| {
            decide(
                &s,
                &Conversation {
                    repo: Some("/w".into()),
                    user_text: text.into(),
                    ..Conversation::default()
                },
            )
        };
        assert_eq!(
            asked("You are writing a product requirements document (PRD)"),
            Turn::Final {
                text: "{\"title\": \"x\"}".into(),
                promise: false
            }
        );
        let Turn::Error(e) = asked("Story-free text nobody scripted") else {
            panic!("expected an error reply")
        };
        assert_eq!(e.status, 400);
        assert!(e.message.contains("`prompts`"), "{}", e.message);

        let (at, _) = scenario(json!({"prompts": {" ": [{"final": "x"}]}})).expect_err("empty");
        assert_eq!(at, "prompts.\" \"");
    }

    #[test]
    fn scenario_level_error_answers_every_request() {
        let s = scenario(json!({"error": {"status": 401, "message": "invalid x-api-key"}}))
            .expect("valid");
        assert_eq!(
            decide(&s, &Conversation::default()),
            Turn::Error(ErrorReply {
                status: 401,
                error_type: None,
                message: "invalid x-api-key".into()
            })
        );
    }

    #[test]
    fn invalid_scenarios_name_the_step_and_the_fix() {
        let (at, msg) = scenario(json!({"stories": {"US-1": [{"final": "x"}, {"final": "y"}]}}))
            .expect_err("final not last");
        assert_eq!(at, "stories.US-1[0]");
        assert!(msg.contains("last"), "{msg}");

        let (at, msg) = scenario(json!({"stories": {"US-1": [{"tool": "Bash", "input": {}}]}}))
            .expect_err("no final");
        assert_eq!(at, "stories.US-1[0]");
        assert!(msg.contains("must be `final`"), "{msg}");

        let (_, msg) = scenario(json!({"stories": {"US-1": [{"tool": "Bash", "final": "x"}]}}))
            .expect_err("two kinds");
        assert!(msg.contains("exactly one"), "{msg}");

        let (at, _) = scenario(json!({"error": {"status": 200, "message": "x"}})).expect_err("200");
        assert_eq!(at, "error");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.json");
        fs::write(&path, r#"{"stories": {}, "typo": 1}"#).expect("write");
        let err = Scenario::load(&path)
            .expect_err("unknown field")
            .to_string();
        assert!(err.contains("typo") && err.contains("s.json"), "{err}");
    }
}
