//! Tests: every dialect keeps what a tool returned in its `ToolResult` event (bounded, secrets
//! redacted), so that `ralph show` can say what the agent saw. Lines in each CLI's own shape.

use crate::agent::amp::AmpDialect;
use crate::agent::claude::ClaudeDialect;
use crate::agent::codex::CodexDialect;
use crate::agent::cursor::CursorDialect;
use crate::agent::gemini::GeminiDialect;
use crate::agent::opencode::OpencodeDialect;
use crate::agent::stream::test_support::{out, run};
use crate::protocol::AgentEvent;

/// The tool results of a run: `(is_error, output, exit code)`.
fn results(events: Vec<AgentEvent>) -> Vec<(bool, Option<String>, Option<i32>)> {
    events
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ToolResult {
                is_error,
                output,
                exit_code,
            } => Some((is_error, output, exit_code)),
            _ => None,
        })
        .collect()
}

#[test]
fn claude_and_amp_keep_the_tool_result_content() {
    let line = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"t1","type":"tool_result","content":"2 passed in 0.01s","is_error":false}]},"parent_tool_use_id":null,"session_id":"s"}"#;
    let blocks = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"t2","type":"tool_result","content":[{"type":"text","text":"error: no such file"}],"is_error":true}]},"parent_tool_use_id":null,"session_id":"s"}"#;
    let (events, _) = run::<ClaudeDialect>(&[out(line), out(blocks)], Some(0));
    assert_eq!(
        results(events),
        [
            (false, Some("2 passed in 0.01s".into()), None),
            (true, Some("error: no such file".into()), None)
        ]
    );
    let (events, _) = run::<AmpDialect>(&[out(line)], Some(0));
    assert_eq!(
        results(events),
        [(false, Some("2 passed in 0.01s".into()), None)]
    );
}

#[test]
fn codex_keeps_the_command_output_and_exit_code() {
    let line = r#"{"type":"item.completed","item":{"id":"item_3","type":"command_execution","command":"/bin/bash -lc 'pytest -q'","aggregated_output":"F\n1 failed\n","exit_code":1,"status":"failed"}}"#;
    let (events, _) = run::<CodexDialect>(&[out(line)], Some(0));
    assert_eq!(
        results(events),
        [(true, Some("F\n1 failed\n".into()), Some(1))]
    );
}

#[test]
fn cursor_keeps_stdout_and_exit_code() {
    let line = r#"{"type":"tool_call","subtype":"completed","call_id":"c1","tool_call":{"shellToolCall":{"args":{"command":"cargo test"},"result":{"success":{"command":"cargo test","exitCode":0,"stdout":"test result: ok","stderr":""}}}},"session_id":"s"}"#;
    let (events, _) = run::<CursorDialect>(&[out(line)], Some(0));
    assert_eq!(
        results(events),
        [(false, Some("test result: ok\n".into()), Some(0))]
    );
}

#[test]
fn gemini_keeps_the_output() {
    let line = r#"{"type":"tool_result","timestamp":"t","tool_id":"run_shell_command_1","status":"success","output":"hello"}"#;
    let (events, _) = run::<GeminiDialect>(&[out(line)], Some(0));
    assert_eq!(results(events), [(false, Some("hello".into()), None)]);
}

#[test]
fn opencode_keeps_the_state_output() {
    let line = r#"{"type":"tool_use","timestamp":1,"sessionID":"s","part":{"id":"p","sessionID":"s","messageID":"m","type":"tool","callID":"c","tool":"bash","state":{"status":"completed","input":{"command":"ls"},"output":"a.txt\nb.txt\n","title":"ls","metadata":{"exit":0}}}}"#;
    let (events, _) = run::<OpencodeDialect>(&[out(line)], Some(0));
    assert_eq!(
        results(events),
        [(false, Some("a.txt\nb.txt\n".into()), Some(0))]
    );
}

#[test]
fn big_outputs_keep_their_head_and_tail() {
    let big = format!("first line\n{}\nlast line", "x".repeat(20_000));
    let line =
        serde_json::json!({"type":"item.completed","item":{"id":"i","type":"command_execution",
        "command":"cat big","aggregated_output": big,"exit_code":0,"status":"completed"}})
        .to_string();
    let (events, _) = run::<CodexDialect>(&[out(&line)], Some(0));
    let (_, output, _) = results(events).remove(0);
    let output = output.unwrap();
    assert!(output.len() < 4200, "{} bytes kept", output.len());
    assert!(output.starts_with("first line") && output.ends_with("last line"));
    assert!(output.contains("of 20021 bytes left out"), "{output}");
}
