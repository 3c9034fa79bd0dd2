//! ralph's own inner agent: a tool loop over an LLM HTTP API.
//!
//! [`run_session`] takes a prompt, a provider, the tools and a cancel token, and runs the model
//! until it answers without asking for tools, or a limit stops it. It knows nothing about the
//! outer loop: `ralph run` drives it through a child process (`ralph __native-agent`, see
//! [`crate::commands::native_agent`]) like any other agent CLI.
//!
//! Loop control, as the harness literature describes it:
//! - continue while the model asks for tools (from the API's tool calls, JSON mode, or — for
//!   models without tool calling — a call written as JSON in the text);
//! - `length` / `max_tokens` without a tool call: ask it to continue, at most
//!   [`SessionConfig::max_continuations`] times;
//! - `content_filter` / `refusal`: stop with that reason;
//! - a step limit: the model is told so and asked for a final summary with no tools offered;
//! - the same call (tool name + canonical arguments) repeated: a warning at
//!   [`REPEAT_WARN_AT`], a stop as stuck at [`REPEAT_STOP_AT`] (not `mark_story` under
//!   [`SessionConfig::mark_protocol`], where repeating it after a fix is how the check runs
//!   again);
//! - transient HTTP errors are retried by [`llm::complete_with_retry`]; others end the session;
//! - close to the context window, old tool results and then old turns are dropped
//!   ([`context::shrink`]), never the system prompt or the story;
//! - cancellation drops the in-flight request and the running tool at once.

pub mod context;
pub mod llm;
pub mod textcalls;
pub mod tools;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::AgentEvent;
use crate::protocol::{ToolMode, Usage};
use llm::{
    ChatRequest, ChatResponse, LlmError, Message, Provider, RetryPolicy, Role, StopReason, ToolSpec,
};
use tools::{ToolContext, ToolError, ToolRegistry};

/// Identical calls before the model is warned.
pub const REPEAT_WARN_AT: u32 = 3;
/// Identical calls before the session stops as stuck.
pub const REPEAT_STOP_AT: u32 = 5;
/// JSON-mode replies cut off by the output limit in a row before the session ends as
/// [`SessionEnd::Length`]: at temperature 0 a model that ran away inside a string (a small model
/// copying a regex full of escapes) tends to run away again, and each try costs the whole output
/// limit of generation time.
pub const JSON_CUTOFFS_IN_A_ROW: u32 = 2;
/// How often a session with [`SessionConfig::mark_protocol`] reminds the model to call
/// `mark_story` when it answers without having called it.
pub const MARK_REMINDERS: u32 = 2;

/// The reminder sent when a [`SessionConfig::mark_protocol`] session's model answers before any
/// successful `mark_story` call.
pub const MARK_REMINDER: &str = "You have not called mark_story yet. If the change is made, call mark_story with the story's id and passes=true: it runs the story's check and shows you its output if the check fails. If the change is not made yet, make it first.";

/// Settings of one session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Model name sent to the API.
    pub model: String,
    /// The system prompt (already rendered).
    pub system_prompt: String,
    /// Tool-using steps allowed before the final summary is requested.
    pub max_steps: u32,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// The model's context window, in tokens.
    pub context_window: u32,
    /// How many times a reply cut off by the output limit is continued.
    pub max_continuations: u32,
    /// Sampling temperature (`None`: the server's default).
    pub temperature: Option<f32>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// How tool calls are requested.
    pub tool_mode: ToolMode,
    /// Retries of transient HTTP errors.
    pub retry: RetryPolicy,
    /// The tools offered, by name; `None` offers every tool. Small models choose better from a
    /// short list.
    pub allowed_tools: Option<Vec<String>>,
    /// Secrets (the API key) replaced by `[REDACTED]` in every tool result before the model sees
    /// it: a command the model runs can read the key from ralph's own process, but the key
    /// must not travel on to the model, the transcript or the terminal.
    pub redact: Vec<String>,
    /// `mark_story` is how the session ends (the `local` backend, whose small model forgets to
    /// record its work or stops before it is checked): a final answer before any successful
    /// `mark_story` call gets [`MARK_REMINDER`] (at most [`MARK_REMINDERS`] times, each a step),
    /// and a successful `mark_story` with `passes: true` (the story's check passed, see
    /// [`tools::StoryCheck`]) ends the session at once, its result as the final text.
    pub mark_protocol: bool,
}

/// `text` with every secret of at least 8 characters replaced by `[REDACTED]`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 8) {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "[REDACTED]");
        }
    }
    out
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SessionEnd {
    /// The model answered without asking for tools.
    Completed,
    /// The step limit was reached; the final text is the model's summary.
    StepLimit,
    /// The model repeated the same call [`REPEAT_STOP_AT`] times.
    Stuck {
        /// The repeated tool.
        tool: String,
    },
    /// The provider filtered the reply.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// The reply was still cut off after every continuation.
    Length,
    /// A request failed for good.
    Error {
        /// The classified error.
        error: String,
        /// `auth`, `quota`, `context`, `bad_request`, `transient` or `decode`.
        class: String,
    },
    /// A tool hit a broken invariant.
    ToolFatal {
        /// The message.
        message: String,
    },
    /// Cancelled from outside (Ctrl-C, timeout).
    Cancelled,
}

/// What a session produced.
#[derive(Debug, Clone, Serialize)]
pub struct SessionResult {
    /// The model's final text (where the completion promise is looked for).
    pub final_text: String,
    /// Why it ended.
    pub end: SessionEnd,
    /// Tokens over all requests.
    pub usage: Usage,
    /// Tool-using steps taken.
    pub steps: u32,
    /// Requests sent (retries not counted).
    pub requests: u32,
    /// The model name the server reported.
    pub model: Option<String>,
}

/// The tool list in the providers' shape.
pub fn tool_specs(tools: &ToolRegistry) -> Vec<ToolSpec> {
    tools
        .specs()
        .into_iter()
        .map(|(name, description, parameters)| ToolSpec {
            name,
            description,
            parameters,
        })
        .collect()
}

/// A stable hash of a call: tool name plus its arguments with object keys sorted.
pub fn call_key(name: &str, arguments: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    canonical(arguments).hash(&mut h);
    h.finish()
}

fn canonical(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// Whether `mark_story` arguments say `passes: true` (also as `"true"`, or inside arguments sent
/// as a JSON string, as the tool's lenient parser accepts them).
fn passes_true(arguments: &Value) -> bool {
    let decoded;
    let args = match arguments {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(value) => {
                decoded = value;
                &decoded
            }
            Err(_) => return false,
        },
        other => other,
    };
    match args.get("passes") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.trim().eq_ignore_ascii_case("true"),
        _ => false,
    }
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
    total.cache_creation_tokens += u.cache_creation_tokens;
}

fn error_class(e: &LlmError) -> &'static str {
    match e {
        LlmError::Auth { .. } => "auth",
        LlmError::Quota { .. } => "quota",
        LlmError::ContextLength { .. } => "context",
        LlmError::BadRequest { .. } => "bad_request",
        LlmError::Transient { .. } => "transient",
        LlmError::Decode { .. } => "decode",
    }
}

/// Runs one answer session: a single request for `prompt` with no tools, whose whole reply must
/// follow the JSON Schema `schema` (sent as `response_format` to OpenAI-compatible servers; see
/// [`ChatRequest::answer_schema`]). `cfg.tool_mode`, `max_steps` and `allowed_tools` do not
/// apply. Used by `ralph plan` and `ralph convert`, which check the answer themselves.
///
/// Never fails: a reply cut off by the output limit ends as [`SessionEnd::Length`] with the
/// partial text; a failed request as [`SessionEnd::Error`].
pub async fn answer(
    provider: &Provider,
    cfg: &SessionConfig,
    schema: &Value,
    prompt: &str,
    cancel: &CancellationToken,
    on_event: &mut (dyn FnMut(AgentEvent) + Send),
) -> SessionResult {
    let request = ChatRequest {
        model: cfg.model.clone(),
        messages: vec![
            Message::text(Role::System, cfg.system_prompt.clone()),
            Message::text(Role::User, prompt.to_string()),
        ],
        tools: Vec::new(),
        max_tokens: cfg.max_tokens,
        temperature: cfg.temperature,
        seed: cfg.seed,
        tool_mode: ToolMode::Native,
        answer_schema: Some(schema.clone()),
    };
    let mut result = SessionResult {
        final_text: String::new(),
        end: SessionEnd::Completed,
        usage: Usage::default(),
        steps: 0,
        requests: 1,
        model: None,
    };
    let response = tokio::select! {
        biased;
        _ = cancel.cancelled() => {
            result.end = SessionEnd::Cancelled;
            return result;
        }
        r = llm::complete_with_retry(provider, &request, &cfg.retry, |e, attempt, wait| {
            tracing::warn!(%e, attempt, wait_ms = wait.as_millis() as u64, "retrying the model request");
        }) => r,
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            on_event(AgentEvent::Error {
                message: e.to_string(),
            });
            result.end = SessionEnd::Error {
                error: e.to_string(),
                class: error_class(&e).into(),
            };
            return result;
        }
    };
    add_usage(&mut result.usage, &response.usage);
    result.model = response.model.clone();
    if !response.content.trim().is_empty() {
        on_event(AgentEvent::AssistantText {
            text: response.content.clone(),
        });
    }
    result.end = match response.stop {
        StopReason::Length => SessionEnd::Length,
        StopReason::ContentFilter => SessionEnd::ContentFilter,
        StopReason::Refusal => SessionEnd::Refusal,
        _ => SessionEnd::Completed,
    };
    result.final_text = response.content;
    result
}

/// Runs one session for `prompt`. Events (assistant text, tool calls and results, errors) go to
/// `on_event` as they happen.
///
/// Never fails: every way a session can end is a [`SessionEnd`].
pub async fn run_session(
    provider: &Provider,
    tools: &ToolRegistry,
    ctx: &ToolContext,
    cfg: &SessionConfig,
    prompt: &str,
    cancel: &CancellationToken,
    on_event: &mut (dyn FnMut(AgentEvent) + Send),
) -> SessionResult {
    let mut turn = Turns::new(tools, cfg, prompt);
    loop {
        let final_round = turn.result.steps >= cfg.max_steps;
        let response = match turn.ask(provider, final_round, cancel, on_event).await {
            Ok(response) => response,
            Err(end) => return turn.end(end),
        };
        let calls = turn.calls_of(&response, final_round);
        if !response.content.trim().is_empty() {
            on_event(AgentEvent::AssistantText {
                text: response.content.clone(),
            });
        }
        match turn.after_stop(response, calls, final_round, on_event) {
            Flow::Again => continue,
            Flow::End(end) => return turn.end(end),
            Flow::Calls(response, calls) => {
                if let Some(end) = turn
                    .run_calls(&response, &calls, (tools, ctx), cancel, on_event)
                    .await
                {
                    return turn.end(end);
                }
            }
        }
    }
}

/// What [`run_session`] does after a reply.
enum Flow {
    /// Ask the model again (the messages say why).
    Again,
    /// The session is over.
    End(SessionEnd),
    /// Run the reply's tool calls.
    Calls(ChatResponse, Vec<llm::ToolCall>),
}

/// One tool session's conversation and counters (see [`run_session`]).
struct Turns<'a> {
    cfg: &'a SessionConfig,
    /// The tools the model may call, as sent.
    specs: Vec<ToolSpec>,
    /// Their names (for text tool calls and the "no such tool" answer).
    names: Vec<&'a str>,
    messages: Vec<Message>,
    result: SessionResult,
    /// How often each exact call was made.
    repeats: HashMap<u64, u32>,
    /// Continuations asked after replies cut off by the output limit.
    continuations: u32,
    /// mark_protocol: whether `mark_story` succeeded yet, and the reminders sent.
    marked: bool,
    reminders: u32,
    /// JSON mode: replies in a row cut off by the output limit.
    cutoffs: u32,
    /// Room for the conversation in the context window, in tokens.
    budget: usize,
}

impl<'a> Turns<'a> {
    fn new(tools: &'a ToolRegistry, cfg: &'a SessionConfig, prompt: &str) -> Turns<'a> {
        let allowed = |name: &str| allowed(cfg, name);
        let specs: Vec<ToolSpec> = tool_specs(tools)
            .into_iter()
            .filter(|s| allowed(&s.name))
            .collect();
        let names: Vec<&str> = tools.names().into_iter().filter(|n| allowed(n)).collect();
        // Room for the reply and the tool list inside the window.
        let tools_tokens = serde_json::to_string(&specs)
            .map(|s| s.len() / 4)
            .unwrap_or(0);
        let budget = (cfg.context_window as usize)
            .saturating_sub(cfg.max_tokens as usize)
            .saturating_sub(tools_tokens)
            .max(256);
        Turns {
            cfg,
            specs,
            names,
            messages: vec![
                Message::text(Role::System, cfg.system_prompt.clone()),
                Message::text(Role::User, prompt.to_string()),
            ],
            result: SessionResult {
                final_text: String::new(),
                end: SessionEnd::Completed,
                usage: Usage::default(),
                steps: 0,
                requests: 0,
                model: None,
            },
            repeats: HashMap::new(),
            continuations: 0,
            marked: false,
            reminders: 0,
            cutoffs: 0,
            budget,
        }
    }

    /// The session's result, ended by `end`.
    fn end(self, end: SessionEnd) -> SessionResult {
        SessionResult { end, ..self.result }
    }

    /// Sends the conversation (shrunk to the window; no tools in the final round) and returns
    /// the model's reply, or how the session ends (cancelled, the request failed).
    async fn ask(
        &mut self,
        provider: &Provider,
        final_round: bool,
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(AgentEvent) + Send),
    ) -> Result<ChatResponse, SessionEnd> {
        let cfg = self.cfg;
        if final_round {
            self.messages.push(Message::text(
                Role::User,
                format!(
                    "You have reached the limit of {} tool-using steps for this session. Do not call any tool. Reply now with a short summary: what you did, what works, and what is left to do.",
                    cfg.max_steps
                ),
            ));
        }
        let shrunk = context::shrink(&mut self.messages, self.budget);
        if shrunk.results_shortened + shrunk.messages_dropped > 0 {
            on_event(AgentEvent::AssistantText {
                text: format!(
                    "[ralph: context near the window; shortened {} old tool results and dropped {} old messages]",
                    shrunk.results_shortened, shrunk.messages_dropped
                ),
            });
        }
        let request = ChatRequest {
            model: cfg.model.clone(),
            messages: self.messages.clone(),
            tools: if final_round {
                Vec::new()
            } else {
                self.specs.clone()
            },
            max_tokens: cfg.max_tokens,
            temperature: cfg.temperature,
            seed: cfg.seed,
            tool_mode: if final_round {
                ToolMode::Native
            } else {
                cfg.tool_mode
            },
            answer_schema: None,
        };
        self.result.requests += 1;
        let response: ChatResponse = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(SessionEnd::Cancelled),
            r = llm::complete_with_retry(provider, &request, &cfg.retry, |e, attempt, wait| {
                tracing::warn!(%e, attempt, wait_ms = wait.as_millis() as u64, "retrying the model request");
            }) => match r {
                Ok(r) => r,
                Err(e) => {
                    on_event(AgentEvent::Error { message: e.to_string() });
                    return Err(SessionEnd::Error { error: e.to_string(), class: error_class(&e).into() });
                }
            }
        };
        add_usage(&mut self.result.usage, &response.usage);
        if response.model.is_some() {
            self.result.model = response.model.clone();
        }
        Ok(response)
    }

    /// The reply's tool calls: native ones, else (not in the final round) calls written in its
    /// text, each with an id unique in the whole conversation.
    fn calls_of(&self, response: &ChatResponse, final_round: bool) -> Vec<llm::ToolCall> {
        let mut calls = response.tool_calls.clone();
        if calls.is_empty() && !final_round {
            calls = textcalls::parse_text_tool_calls(&response.content, &self.names);
            // The parser numbers calls within one message (`text-1`…); ids must be unique in
            // the whole conversation, or a result could pair with an earlier turn's call.
            for (i, call) in calls.iter_mut().enumerate() {
                call.id = format!("text-{}-{}", self.result.requests, i + 1);
            }
        }
        calls
    }

    /// What a reply's stop reason and calls mean: the end of the session, another request
    /// (a cut-off reply, a reminder to call `mark_story`), or calls to run.
    fn after_stop(
        &mut self,
        response: ChatResponse,
        calls: Vec<llm::ToolCall>,
        final_round: bool,
        on_event: &mut (dyn FnMut(AgentEvent) + Send),
    ) -> Flow {
        let cfg = self.cfg;
        match response.stop {
            StopReason::ContentFilter => {
                self.result.final_text = response.content;
                return Flow::End(SessionEnd::ContentFilter);
            }
            StopReason::Refusal => {
                self.result.final_text = response.content;
                return Flow::End(SessionEnd::Refusal);
            }
            // In JSON mode a cut-off reply is broken JSON that no continuation can mend (small
            // models also run away inside a string): ask again for a short action, as one step.
            StopReason::Length
                if calls.is_empty() && cfg.tool_mode == ToolMode::Json && !final_round =>
            {
                self.cutoffs += 1;
                if self.cutoffs >= JSON_CUTOFFS_IN_A_ROW {
                    on_event(AgentEvent::Error {
                        message: format!(
                            "stopped: {} replies in a row were cut off by the output limit \
                             ({} tokens)",
                            self.cutoffs, cfg.max_tokens
                        ),
                    });
                    return Flow::End(SessionEnd::Length);
                }
                self.result.steps += 1;
                self.messages.push(Message::text(
                    Role::User,
                    "Your last reply was cut off by the output limit, so it was not a valid action. Reply again with one short action.",
                ));
                return Flow::Again;
            }
            StopReason::Length if calls.is_empty() => {
                if self.continuations < cfg.max_continuations {
                    self.continuations += 1;
                    self.messages
                        .push(Message::text(Role::Assistant, response.content));
                    self.messages.push(Message::text(
                        Role::User,
                        "Your reply was cut off by the output limit. Continue exactly where you stopped.",
                    ));
                    return Flow::Again;
                }
                self.result.final_text = response.content;
                return Flow::End(SessionEnd::Length);
            }
            _ => {}
        }
        self.cutoffs = 0;
        let remind = cfg.mark_protocol && !self.marked && self.reminders < MARK_REMINDERS;
        if calls.is_empty() && !final_round && remind {
            self.reminders += 1;
            self.result.steps += 1;
            self.messages
                .push(Message::text(Role::Assistant, response.content));
            self.messages.push(Message::text(Role::User, MARK_REMINDER));
            return Flow::Again;
        }
        if calls.is_empty() || final_round {
            self.result.final_text = response.content;
            return Flow::End(if final_round {
                SessionEnd::StepLimit
            } else {
                SessionEnd::Completed
            });
        }
        Flow::Calls(response, calls)
    }

    /// Runs a reply's tool calls in order, each result going back into the conversation;
    /// returns how the session ends when a call ends it (a stuck model, a fatal tool error, a
    /// passing mark under the mark protocol, a cancel).
    async fn run_calls(
        &mut self,
        response: &ChatResponse,
        calls: &[llm::ToolCall],
        (tools, ctx): (&ToolRegistry, &ToolContext),
        cancel: &CancellationToken,
        on_event: &mut (dyn FnMut(AgentEvent) + Send),
    ) -> Option<SessionEnd> {
        let cfg = self.cfg;
        self.result.steps += 1;
        let mut assistant = Message::text(Role::Assistant, response.content.clone());
        assistant.tool_calls = calls.to_vec();
        self.messages.push(assistant);
        for call in calls {
            // Under the mark protocol the same mark_story call after each fix is the expected
            // way to have the check run again, not a loop: the step limit bounds it.
            let count = if cfg.mark_protocol && call.name == "mark_story" {
                0
            } else {
                let count = self
                    .repeats
                    .entry(call_key(&call.name, &call.arguments))
                    .or_insert(0);
                *count += 1;
                *count
            };
            if count >= REPEAT_STOP_AT {
                self.messages.push(Message::tool_result(
                    &call.id,
                    "Not run: you made this exact call too many times.",
                    true,
                ));
                self.result.final_text = response.content.clone();
                on_event(AgentEvent::Error {
                    message: format!(
                        "stopped: the model repeated the same {} call {count} times",
                        call.name
                    ),
                });
                return Some(SessionEnd::Stuck {
                    tool: call.name.clone(),
                });
            }
            let summary_args = crate::protocol::fields::summarize_tool_input(&call.arguments);
            on_event(AgentEvent::ToolCall {
                name: call.name.clone(),
                summary: summary_args,
            });
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Some(SessionEnd::Cancelled),
                o = async {
                    if allowed(cfg, &call.name) {
                        tools.dispatch(&call.name, &call.arguments, ctx).await
                    } else {
                        Err(ToolError::RespondToModel(format!(
                            "there is no tool named `{}`; the tools are: {}",
                            call.name,
                            self.names.join(", ")
                        )))
                    }
                } => o,
            };
            let (mut content, is_error) = match outcome {
                Ok(out) => (out.content, false),
                Err(ToolError::RespondToModel(msg)) => (format!("Error: {msg}"), true),
                Err(ToolError::Fatal(msg)) => {
                    on_event(AgentEvent::Error {
                        message: msg.clone(),
                    });
                    return Some(SessionEnd::ToolFatal { message: msg });
                }
            };
            // The transcript keeps what the tool returned (bounded, secrets redacted), so that
            // `ralph show` can tell what the model saw.
            on_event(AgentEvent::ToolResult {
                is_error,
                output: Some(crate::protocol::fields::bounded_output(
                    &crate::redact::redact_env(&content),
                )),
                exit_code: None,
            });
            let marks_passing =
                call.name == "mark_story" && !is_error && passes_true(&call.arguments);
            self.marked |= call.name == "mark_story" && !is_error;
            if cfg.mark_protocol && marks_passing {
                self.result.final_text = content;
                return Some(SessionEnd::Completed);
            }
            if count >= REPEAT_WARN_AT {
                content.push_str(&format!(
                    "\n\nWarning: you have made this exact call {count} times. Repeating it will not help; do something different. At {REPEAT_STOP_AT} identical calls the session stops."
                ));
            }
            let content = redact(&content, &cfg.redact);
            // Paths under the repository read relative to it (a traceback, a check's output),
            // and measured durations are taken out, so that the model is told the same thing
            // wherever the repository lies and however busy the machine is.
            let content = crate::prd::files::steady_text(&content, &ctx.repo_root);
            self.messages
                .push(Message::tool_result(&call.id, content, is_error));
        }
        None
    }
}

/// Whether the session may use the tool `name` (`allowed_tools`, when set).
fn allowed(cfg: &SessionConfig, name: &str) -> bool {
    cfg.allowed_tools
        .as_ref()
        .is_none_or(|list| list.iter().any(|t| t == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn passes_true_reads_the_lenient_forms() {
        assert!(passes_true(&json!({"id": "US-001", "passes": true})));
        assert!(passes_true(&json!({"id": "US-001", "passes": " TRUE "})));
        assert!(passes_true(&json!(r#"{"id": "US-001", "passes": true}"#)));
        assert!(!passes_true(&json!({"id": "US-001", "passes": false})));
        assert!(!passes_true(&json!({"id": "US-001"})));
        assert!(!passes_true(&json!("not json")));
    }

    #[test]
    fn call_key_ignores_key_order_but_not_values() {
        let a = json!({"path": "a.txt", "content": "x"});
        let b = json!({"content": "x", "path": "a.txt"});
        let c = json!({"content": "y", "path": "a.txt"});
        assert_eq!(call_key("write_file", &a), call_key("write_file", &b));
        assert_ne!(call_key("write_file", &a), call_key("write_file", &c));
        assert_ne!(call_key("write_file", &a), call_key("read_file", &a));
    }
}
