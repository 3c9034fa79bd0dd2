//! The Amp backend (Sourcegraph): `amp -x --stream-json --dangerously-allow-all`, prompt on
//! stdin.
//!
//! This module owns amp's command line, its facts ([`INFO`], doctor traps) and what its
//! `--stream-json` output (a Claude Code-compatible subset, read by [`crate::agent::claude_shape`])
//! does differently. Schema source: `notes/agent-protocols.md` §3 (Amp) and §0 (rules for every
//! CLI); the shared Claude shapes are §1.
//!
//! Choices, each forced by what amp does:
//! - the prompt goes to stdin (`-x` without a value, then stdin closed): the notes' stdin form,
//!   with no argv size limit and no quoting;
//! - amp has no model flag; its model family is chosen by `-m/--mode` (`smart`, `rush`,
//!   `deep`). ralph's `--model M` is passed as `--mode M`, so `--agent amp --model rush` does
//!   what a user means; amp itself refuses a mode it does not know;
//! - amp echoes the prompt as a `user` line, which the shape never reads as text;
//! - amp's lines usually carry no `message.id`, so each assistant line is then a message of its
//!   own;
//! - amp prints no run total for tokens: usage is summed over `assistant` lines, once per
//!   distinct `message.id` (a repeated id is the same turn printed again and is not added twice);
//!   lines without an id are each added. `total_cost_usd` is read when a build prints it (the
//!   notes say amp does not);
//! - failures: a `result` with `is_error:true` (subtypes `error_during_execution`,
//!   `error_max_turns`) and an `error` string; its text, the result text of an error result and
//!   stderr lines go through the classifier. The notes found no verified wording for amp's
//!   credit or auth errors, so classification rests on the classifier's shared text rules.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::agent::classify::Signal;
use crate::agent::claude_shape::{self as shape, LastMessage, ResultLine};
use crate::agent::registry::{BackendInfo, DoctorContext, PromptVia, SandboxNeeds};
use crate::agent::stream::{Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::SpawnSpec;
use crate::protocol::fields::str_field;
use crate::protocol::{AgentEvent, AgentKind, Usage};

/// Program run when [`AgentSettings::program`] is not set (looked up on PATH).
pub const DEFAULT_PROGRAM: &str = "amp";

/// Facts about the amp backend.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Amp,
    program: Some(DEFAULT_PROGRAM),
    install_hint: "install it with `npm install -g @sourcegraph/amp`",
    version_probe: true,
    final_event: true,
    prompt: PromptVia::Stdin,
    doctor: traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Amp::new(settings))),
    sandbox: SandboxNeeds {
        state: &[".config/amp", ".local/share/amp", ".cache/amp"],
        env_prefixes: &["AMP_"],
        hosts: &["ampcode.com:443"],
        base_url_hosts: || crate::agent::registry::env_url_hosts(&["AMP_URL"]),
        config_env: Vec::new,
        state_vars: &[],
        config_vars: &[],
    },
};

/// The amp backend. Stateless apart from its settings; each [`Backend::parser`] call returns a
/// fresh [`AmpParser`].
#[derive(Debug, Clone)]
pub struct Amp {
    settings: AgentSettings,
}

impl Amp {
    /// A backend that runs `settings.program` (default [`DEFAULT_PROGRAM`]) in `settings.repo`,
    /// with `--mode settings.model` when a model is set (amp selects models by mode).
    pub fn new(settings: AgentSettings) -> Self {
        Amp { settings }
    }
}

impl Backend for Amp {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `amp -x --stream-json --dangerously-allow-all [--mode M]`, the prompt on stdin (then
    /// closed), `NO_COLOR=1`. Never fails.
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        // `-x` with no value: amp takes the message from the piped stdin.
        let args = self.settings.args_with_model(
            &["-x", "--stream-json", "--dangerously-allow-all"],
            "--mode",
        );
        Ok(self.settings.cli_spec(DEFAULT_PROGRAM, args, Some(prompt)))
    }

    fn parser(&self, _prompt: &str) -> Box<dyn OutputParser> {
        // The echoed prompt arrives as a `user` line, which never feeds the final text.
        Box::new(AmpParser::new())
    }
}

/// A headless amp needs `AMP_API_KEY` (or a saved login).
fn traps(cx: &DoctorContext<'_>) -> Vec<String> {
    cx.unless_set(
        "AMP_API_KEY",
        "no AMP_API_KEY: amp needs it (or a saved `amp login`) to run headless",
    )
}

/// Reads amp's `--stream-json` output. Memory use is bounded by the largest assistant message,
/// a few stderr lines and one usage entry per distinct `message.id`.
pub type AmpParser = Parser<AmpDialect>;

/// amp's dialect of the shared shape (see the module docs).
#[derive(Debug, Default)]
pub struct AmpDialect {
    last: LastMessage,
    /// Usage per distinct `message.id` (the largest count seen for each field).
    usage_by_id: BTreeMap<String, Usage>,
    /// Usage of assistant lines without an id, summed.
    usage_unkeyed: Usage,
}

impl Dialect for AmpDialect {
    fn stdout(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        let Some(v) = shape::read_line(line, core) else {
            return Vec::new();
        };
        match shape::line_type(&v) {
            Some("system") if shape::is_init(&v) => shape::on_init(&v, core, None),
            Some("assistant") => {
                self.count_usage(&v);
                shape::on_assistant(&v, core, &mut self.last)
            }
            Some("user") => shape::on_user(&v),
            Some("result") => on_result(&v, core),
            _ => Vec::new(),
        }
    }

    /// Usage is the total over the run's messages; the last top-level assistant message stands
    /// in for a missing `result.result`.
    fn settle(&mut self, core: &mut StreamCore, _exit_code: Option<i32>) {
        core.usage = self
            .usage_by_id
            .values()
            .fold(self.usage_unkeyed, |sum, u| add_usage(sum, *u));
        self.last.settle(core);
    }
}

impl AmpDialect {
    /// Adds an assistant line's `message.usage`, once per distinct `message.id`. Usage counts
    /// whoever spent it, subagents included.
    fn count_usage(&mut self, v: &Value) {
        let Some(message) = v.get("message") else {
            return;
        };
        let Some(u) = message.get("usage") else {
            return;
        };
        let usage = shape::usage_of(u);
        match str_field(message, "id") {
            Some(id) => {
                let seen = self.usage_by_id.entry(id).or_default();
                *seen = max_usage(*seen, usage);
            }
            None => self.usage_unkeyed = add_usage(self.usage_unkeyed, usage),
        }
    }
}

/// The `result` line: the shared fields, then amp's cost and, for an error, its `error` string
/// (the amp SDK's shape) and text, classified; the message is the error, else the text, else
/// the subtype.
fn on_result(v: &Value, core: &mut StreamCore) -> Vec<AgentEvent> {
    let result = ResultLine::read(v, core, shape::error_prefix);
    let error = v
        .get("error")
        .and_then(shape::error_text)
        .filter(|s| !s.trim().is_empty());
    shape::observe_api_status(v, core);
    if result.is_error {
        // Only an error result's text is the agent's own error message; a successful
        // result is the assistant's answer, which may quote anything.
        for t in error.iter().chain(result.text.iter()).chain(&result.errors) {
            core.classifier.observe(Signal::Text(t));
        }
    }
    core.error_message = result.is_error.then(|| {
        error
            .or_else(|| result.nonblank_text())
            .or_else(|| result.joined_errors())
            .unwrap_or_else(|| result.ended_with("amp", "error"))
    });
    core.cost_usd = v.get("total_cost_usd").and_then(Value::as_f64);
    vec![result.event()]
}

fn add_usage(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens.saturating_add(b.input_tokens),
        output_tokens: a.output_tokens.saturating_add(b.output_tokens),
        cache_read_tokens: a.cache_read_tokens.saturating_add(b.cache_read_tokens),
        cache_creation_tokens: a
            .cache_creation_tokens
            .saturating_add(b.cache_creation_tokens),
    }
}

/// Field-wise maximum: a message printed again (more blocks, a later snapshot) never counts
/// twice, and its most complete count wins.
fn max_usage(a: Usage, b: Usage) -> Usage {
    Usage {
        input_tokens: a.input_tokens.max(b.input_tokens),
        output_tokens: a.output_tokens.max(b.output_tokens),
        cache_read_tokens: a.cache_read_tokens.max(b.cache_read_tokens),
        cache_creation_tokens: a.cache_creation_tokens.max(b.cache_creation_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stream::test_support::{self, err, out};
    use crate::completion::promise_in_final_text;
    use crate::process::OutputLine;
    use crate::protocol::{AgentReport, FailureClass};
    use std::path::PathBuf;

    fn run(lines: &[OutputLine], exit: Option<i32>) -> (Vec<AgentEvent>, AgentReport) {
        test_support::run_plain::<AmpDialect>(lines, exit)
    }

    fn claims(report: &AgentReport) -> bool {
        promise_in_final_text(report.final_text.as_deref().unwrap_or_default())
    }

    // Shapes from notes/agent-protocols.md §3 (amp --stream-json).
    const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"/w/repo","session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83","tools":["Bash","Read","edit_file","create_file","Grep","glob","oracle","Task"],"mcp_servers":[]}"#;
    /// amp echoes the prompt; ralph's prompt explains the promise, here as its last words.
    const USER_ECHO: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"Work on US-001. When every story passes, end with <promise>COMPLETE</promise>"}]},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const TOOL_USE: &str = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"cmd":"cargo test"}}],"stop_reason":"tool_use","usage":{"input_tokens":12783,"cache_creation_input_tokens":367,"cache_read_input_tokens":12416,"output_tokens":28,"max_tokens":224000,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const TOOL_RESULT: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"ok","is_error":false}]},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const FINAL_TEXT: &str = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"Done.\n<promise>COMPLETE</promise>"}],"stop_reason":"end_turn","usage":{"input_tokens":13100,"cache_creation_input_tokens":0,"cache_read_input_tokens":12783,"output_tokens":14,"max_tokens":224000,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;
    const RESULT: &str = r#"{"type":"result","subtype":"success","duration_ms":2906,"is_error":false,"num_turns":3,"result":"Done.\n<promise>COMPLETE</promise>","session_id":"T-2775dc92-90ed-4f85-8b73-8f9766029e83"}"#;

    #[test]
    fn successful_run_reads_events_final_text_usage_and_session() {
        let lines = [
            out(INIT),
            out(USER_ECHO),
            out(TOOL_USE),
            out(TOOL_RESULT),
            out(FINAL_TEXT),
            out(RESULT),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(
            events,
            vec![
                AgentEvent::Session {
                    session_id: Some("T-2775dc92-90ed-4f85-8b73-8f9766029e83".into()),
                    model: None,
                    version: None,
                },
                AgentEvent::ToolCall {
                    name: "Bash".into(),
                    summary: "cargo test".into()
                },
                AgentEvent::tool_result(false),
                AgentEvent::AssistantText {
                    text: "Done.\n<promise>COMPLETE</promise>".into()
                },
                AgentEvent::Final {
                    text: Some("Done.\n<promise>COMPLETE</promise>".into()),
                    is_error: false
                },
            ]
        );
        assert!(report.saw_final && !report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
        assert!(claims(&report));
        assert_eq!(
            report.session_id.as_deref(),
            Some("T-2775dc92-90ed-4f85-8b73-8f9766029e83")
        );
        // Two assistant messages without ids: both counted, once each.
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 12783 + 13100,
                output_tokens: 28 + 14,
                cache_read_tokens: 12416 + 12783,
                cache_creation_tokens: 367,
            }
        );
        assert_eq!(report.cost_usd, None, "amp prints no cost");
    }

    /// The same `message.id` printed once per content block is one message: its usage is
    /// counted once, its blocks form the fallback final text together.
    #[test]
    fn usage_counts_each_message_id_once() {
        let block = |id: &str, text: &str, out_tokens: u64| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"{id}","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input_tokens":100,"cache_read_input_tokens":50,"output_tokens":{out_tokens}}}}},"parent_tool_use_id":null,"session_id":"T-1"}}"#
            )
        };
        let lines = [
            out(&block("msg_1", "Part one.", 5)),
            out(&block("msg_1", "Part two.", 9)),
            out(&block("msg_2", "Second turn.", 3)),
            out(&block("msg_2", "Still second.", 3)),
        ];
        // Killed before its result line.
        let (_, report) = run(&lines, None);
        assert_eq!(
            report.usage,
            Usage {
                input_tokens: 200,
                output_tokens: 12,
                cache_read_tokens: 100,
                cache_creation_tokens: 0,
            }
        );
        assert_eq!(
            report.final_text.as_deref(),
            Some("Second turn.\nStill second.")
        );
        assert_eq!(report.model.as_deref(), Some("claude-opus-5-5"));
        assert!(
            report.is_error && !report.saw_final,
            "killed without a result line"
        );
    }

    /// A successful result that discusses limits is no limit; an `error_during_execution`
    /// result without text shows its `errors[]`.
    #[test]
    fn answer_about_limits_and_errors_array() {
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"result":"Added a retry for 'Weekly limit reached ∙ resets 5am'.","session_id":"T-1"}"#;
        let (_, report) = run(&[out(ok)], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);

        let failed = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["Weekly limit reached ∙ resets 5am"],"session_id":"T-1"}"#;
        let (_, report) = run(&[out(failed)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(
            report.error_message.as_deref(),
            Some("Weekly limit reached ∙ resets 5am")
        );
        assert!(report.resume_at.is_some());
    }

    /// The promise in the echoed prompt or in a tool result is never a claim, with or without
    /// a result line.
    #[test]
    fn promise_in_echoed_prompt_or_tool_result_does_not_count() {
        let tool_result_with_promise = r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"prompt.md: end with <promise>COMPLETE</promise>","is_error":false}]},"parent_tool_use_id":null,"session_id":"T-1"}"#;
        let (events, report) = run(
            &[
                out(INIT),
                out(USER_ECHO),
                out(TOOL_USE),
                out(tool_result_with_promise),
            ],
            Some(0),
        );
        assert!(!events
            .iter()
            .any(|e| matches!(e, AgentEvent::AssistantText { .. })));
        assert_eq!(report.final_text, None);
        assert!(!claims(&report));

        let no_text_result = r#"{"type":"result","subtype":"success","duration_ms":10,"is_error":false,"num_turns":1,"session_id":"T-1"}"#;
        let (_, report) = run(&[out(USER_ECHO), out(no_text_result)], Some(0));
        assert!(report.saw_final && !report.is_error);
        assert!(!claims(&report));

        let said = r#"{"type":"result","subtype":"success","duration_ms":10,"is_error":false,"num_turns":1,"result":"I read the instructions; US-002 is still open.","session_id":"T-1"}"#;
        let (_, report) = run(
            &[out(USER_ECHO), out(tool_result_with_promise), out(said)],
            Some(0),
        );
        assert!(!claims(&report));
    }

    /// A subagent's text is never the final text; its tokens still count.
    #[test]
    fn subagent_text_is_not_the_final_text() {
        let top = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"Delegating."}],"usage":{"input_tokens":10,"output_tokens":1}},"parent_tool_use_id":null}"#;
        let sub = r#"{"type":"assistant","message":{"type":"message","role":"assistant","content":[{"type":"text","text":"<promise>COMPLETE</promise>"}],"usage":{"input_tokens":7,"output_tokens":2}},"parent_tool_use_id":"toolu_9"}"#;
        let (events, report) = run(&[out(top), out(sub)], Some(0));
        assert_eq!(
            events,
            vec![AgentEvent::AssistantText {
                text: "Delegating.".into()
            }]
        );
        assert_eq!(report.final_text.as_deref(), Some("Delegating."));
        assert_eq!(report.usage.input_tokens, 17);
        assert!(!report.is_error, "exit 0 without a result line");
    }

    /// The amp SDK's error result: `is_error`, an error subtype and an `error` string. amp's own
    /// wording for credit and auth failures is not known (notes §3), so these use the texts the
    /// shared classifier knows.
    #[test]
    fn error_results_are_classified_from_their_error_text() {
        for (error, class) in [
            // What amp's TUI shows at an exhausted balance.
            ("Out of Credits", FailureClass::UsageLimit),
            ("Credit balance is too low", FailureClass::UsageLimit),
            (
                "401 Unauthorized: Invalid API key. Run amp login or set AMP_API_KEY.",
                FailureClass::Auth,
            ),
            (
                "API Error: 529 Overloaded. This is a server-side issue",
                FailureClass::Transient,
            ),
            ("Prompt is too long", FailureClass::Context),
        ] {
            let line = serde_json::json!({"type": "result", "subtype": "error_during_execution",
                "duration_ms": 412, "is_error": true, "num_turns": 1, "error": error,
                "session_id": "T-9"})
            .to_string();
            let (events, report) = run(&[out(INIT), out(&line)], Some(1));
            assert!(report.is_error && report.saw_final, "{error}");
            assert_eq!(report.failure, Some(class), "{error}");
            assert_eq!(report.error_message.as_deref(), Some(error));
            assert_eq!(report.session_id.as_deref(), Some("T-9"));
            assert!(!claims(&report));
            assert_eq!(
                events.last(),
                Some(&AgentEvent::Final {
                    text: None,
                    is_error: true
                })
            );
        }
    }

    #[test]
    fn usage_limit_reset_time_comes_from_the_error_text() {
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"error":"Claude AI usage limit reached|4102444800","session_id":"T-1"}"#;
        let (_, report) = run(&[out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.resume_at.map(|t| t.timestamp()), Some(4_102_444_800));

        // The epoch of a limit long past: stale, so no reset time, and the message says so.
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"error":"Claude AI usage limit reached|1753441200","session_id":"T-1"}"#;
        let (_, report) = run(&[out(line)], Some(1));
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        assert_eq!(report.resume_at, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Claude AI usage limit reached|1753441200; the reset time it gave (2025-07-25 11:00 UTC) has already passed, so ralph waits usage_limit_fallback instead")
        );
    }

    #[test]
    fn max_turns_without_text_is_an_error_without_a_class() {
        let line = r#"{"type":"result","subtype":"error_max_turns","duration_ms":90000,"is_error":true,"num_turns":200,"session_id":"T-1"}"#;
        let (_, report) = run(&[out(FINAL_TEXT), out(line)], Some(1));
        assert!(report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(
            report.error_message.as_deref(),
            Some("amp ended with error_max_turns")
        );
        // The run was cut short: the last assistant message stands in for the result text.
        assert!(claims(&report));
    }

    /// Failures reported only on stderr (no JSON at all), ANSI-coloured.
    #[test]
    fn stderr_errors_without_a_result() {
        let (events, report) = run(&[err("\x1b[31mError: Invalid API key\x1b[0m")], Some(1));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert!(report.is_error && !report.saw_final);
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: Invalid API key")
        );
        assert_eq!(
            events,
            vec![AgentEvent::Error {
                message: "Error: Invalid API key".into()
            }]
        );
    }

    /// A successful result after retry chatter on stderr is not a failure, and the assistant's
    /// successful answer is never fed to the classifier however it reads.
    #[test]
    fn success_is_not_a_failure_whatever_the_text_says() {
        let answer = r#"{"type":"result","subtype":"success","is_error":false,"result":"Fixed the 'Invalid API key' message in login.rs.","session_id":"T-1"}"#;
        let (_, report) = run(
            &[err("API Error: 529 Overloaded, retrying"), out(answer)],
            Some(0),
        );
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);
    }

    /// Non-JSON lines, JSON that is not an object, unknown types, lossy UTF-8: no event and no
    /// crash; the real lines are still read.
    #[test]
    fn hostile_lines_are_ignored() {
        let invalid_utf8 = String::from_utf8_lossy(b"{\"type\":\"result\xff\"}").into_owned();
        let lines = [
            out("Amp CLI v0.0.1 (not JSON)"),
            out(""),
            out("[1,2]"),
            out("\"type\":\"result\",\"result\":\"<promise>COMPLETE</promise>\""),
            out(r#"{"type":"some_future_type","result":"<promise>COMPLETE</promise>"}"#),
            out(&invalid_utf8),
            out(&format!("{RESULT}\r")),
        ];
        let (events, report) = run(&lines, Some(0));
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(report.saw_final && claims(&report));
    }

    #[test]
    fn command_line_stdin_and_mode() {
        let amp = Amp::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            model: Some("rush".into()),
            ..AgentSettings::default()
        });
        let prompt = "Story \"US-1\" `$(rm -rf ~)` — ünïcode\n-x --help";
        let spec = amp.command(prompt).unwrap();
        assert_eq!(spec.program, PathBuf::from("amp"));
        assert_eq!(
            spec.args,
            [
                "-x",
                "--stream-json",
                "--dangerously-allow-all",
                "--mode",
                "rush"
            ]
        );
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);

        let custom = Amp::new(AgentSettings {
            program: Some(PathBuf::from("/opt/amp/bin/amp")),
            ..AgentSettings::default()
        });
        let spec = custom.command(&"x".repeat(300 * 1024)).unwrap();
        assert_eq!(spec.program, PathBuf::from("/opt/amp/bin/amp"));
        assert_eq!(spec.args.len(), 3, "no --mode without a model");
        assert_eq!(spec.stdin.map(|s| s.len()), Some(300 * 1024));
    }
}
