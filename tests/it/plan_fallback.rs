//! `ralph plan` and `ralph convert` after a switch to a fallback agent: each session's prompt is
//! written for the agent that runs it. A claude (the fake) at its usage limit hands over to a
//! `native` agent on the scripted model server, which gets the reply's schema as
//! `response_format` and a prompt with no example reply (one a model could copy); a `native`
//! primary refused by the server (a spent quota, a rejected key) hands over to an `exec` agent
//! (the fake), whose prompt on stdin carries the reply's format and the example. A retry after
//! an invalid draft is rendered for the agent in use too, with the previous draft's problems.

use std::path::PathBuf;
use std::process::{Output, Stdio};

use ralph::convert::agent::EXAMPLE_STORY_DESCRIPTION;
use ralph::protocol::ProviderKind;
use serde_json::{json, Value};

use crate::common::{fake_agent_bin, native_flags, text, TestEnv};
use crate::convert::{bad_draft, fixed_draft, FREE_FORM};
use crate::fallback::env_with;
use crate::plan::plan_doc;
use crate::support_llm::{ScriptedLlm, ScriptedReply, SCRIPTED_API_KEY};

/// The variable holding the scripted server's key.
const KEY_VAR: &str = "FALLBACK_TEST_KEY";
/// What a prompt written for a schema session says instead of showing an example.
const SCHEMA_WORDING: &str = "the fields of the JSON schema that comes with this request";
/// What a prompt written for an agent CLI says before its example reply.
const EXAMPLE_WORDING: &str = "nothing before or after it, in this shape";

/// claude's usage limit (the fake as `claude`), resetting in an hour.
fn claude_limited() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 3600}},
        {"exit": 1}
    ])
}

/// ralph.toml with one `[[agents]]` table, `api`: the native backend on `llm`.
fn native_fallback(llm: &ScriptedLlm) -> String {
    format!(
        "[[agents]]\nname = \"api\"\nagent = \"native\"\nmodel = \"scripted\"\nbase_url = {:?}\n\
         api_key_env = \"{KEY_VAR}\"\n",
        llm.base_url()
    )
}

/// ralph.toml with one `[[agents]]` table, `cli`: the exec backend running the fake agent.
fn exec_fallback() -> String {
    format!(
        "[[agents]]\nname = \"cli\"\nagent = \"exec\"\nagent_cmd = {:?}\n",
        fake_agent_bin()
    )
}

/// The fake as an exec agent: keeps its stdin (the prompt) in `saved` and prints `reply`.
fn exec_answers(saved: &std::path::Path, reply: &Value) -> Value {
    json!([
        {"save_stdin": saved.display().to_string()},
        {"stdout": reply.to_string()}
    ])
}

/// Where the exec fake keeps the prompt it read: beside the repository, not in it.
fn saved_prompt(env: &TestEnv) -> PathBuf {
    env.root.path().join("exec-prompt.txt")
}

/// `ralph <args>` with the scripted server's key set and no terminal.
fn ralph(env: &TestEnv, args: &[&str]) -> Output {
    env.ralph_cmd(args)
        .env(KEY_VAR, SCRIPTED_API_KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The flags of a native primary agent on `llm`.
fn native_primary(llm: &ScriptedLlm) -> Vec<String> {
    native_flags(&llm.base_url(), KEY_VAR)
}

/// Asserts that `prompt` was written for a schema session: the schema's wording, no example.
fn assert_schema_prompt(prompt: &str, what: &str) {
    assert!(prompt.contains(SCHEMA_WORDING), "{what}: {prompt}");
    assert!(!prompt.contains(EXAMPLE_WORDING), "{what}: {prompt}");
    assert!(
        !prompt.contains(EXAMPLE_STORY_DESCRIPTION),
        "{what}: an example reply: {prompt}"
    );
}

/// Asserts that `prompt` was written for an agent CLI: the format and the example reply.
fn assert_example_prompt(prompt: &str, what: &str) {
    assert!(prompt.contains(EXAMPLE_WORDING), "{what}: {prompt}");
    assert!(prompt.contains("```json\n{"), "{what}: {prompt}");
    assert!(
        prompt.contains(EXAMPLE_STORY_DESCRIPTION),
        "{what}: {prompt}"
    );
    assert!(!prompt.contains(SCHEMA_WORDING), "{what}: {prompt}");
}

/// Asserts that the native request `body` sent the reply's schema as `response_format`, with
/// `field` among its properties.
fn assert_response_format(body: &Value, field: &str) {
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema", "{body}");
    assert!(
        format["json_schema"]["schema"]["properties"][field].is_object(),
        "{body}"
    );
}

#[test]
fn plan_after_claudes_limit_asks_the_native_fallback_with_the_schema_and_no_example() {
    let llm = ScriptedLlm::start(ProviderKind::Openai, |_| {
        ScriptedReply::text(plan_doc().to_string())
    });
    let env = env_with(1, &native_fallback(&llm));
    env.script(&json!({"invocations": [claude_limited()]}));
    let out = ralph(
        &env,
        &["plan", "add a --reverse flag to textkit's CLI", "--yes"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the claude session hit a usage limit")
            && stderr.contains("trying the next agent, api (native)"),
        "{stderr}"
    );
    assert_eq!(env.agent_calls(), 1, "one claude session");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "one native session, one request");
    assert_response_format(&reqs[0].body, "userStories");
    assert!(
        reqs[0].tool_names().is_empty(),
        "an answer session has no tools"
    );
    let prompt = reqs[0].last_user_text();
    assert_schema_prompt(&prompt, "the native fallback's PRD prompt");
    assert!(
        prompt.contains("add a --reverse flag to textkit's CLI"),
        "{prompt}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("✓ wrote tasks/prd-reverse-flag.md: 2 stories"),
        "{stdout}"
    );
    // The PRD is ralph's layout: it converts with no model and validates.
    let conv = ralph(
        &env,
        &[
            "convert",
            "tasks/prd-reverse-flag.md",
            "--out",
            "next/prd.json",
        ],
    );
    assert!(conv.status.success(), "{}", text(&conv));
    let valid = ralph(&env, &["validate", "next/prd.json"]);
    assert!(valid.status.success(), "{}", text(&valid));
}

#[test]
fn convert_after_claudes_limit_asks_the_native_fallback_and_its_retry_keeps_the_schema_prompt() {
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(bad_draft().to_string()),
            ScriptedReply::text(fixed_draft().to_string()),
        ],
    );
    let env = env_with(1, &native_fallback(&llm));
    env.write("notes.md", FREE_FORM);
    env.script(&json!({"invocations": [claude_limited()]}));
    let out = ralph(&env, &["convert", "notes.md", "--out", "new-prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("trying the next agent, api (native)"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("converted by the agent in 2 attempts)"),
        "{}",
        text(&out)
    );
    assert_eq!(env.agent_calls(), 1, "one claude session");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "a draft and its retry");
    for (i, req) in reqs.iter().enumerate() {
        assert_response_format(&req.body, "userStories");
        assert_schema_prompt(&req.last_user_text(), &format!("native request {i}"));
    }
    let retry = reqs[1].last_user_text();
    assert!(
        retry.contains("## Your previous reply had problems")
            && retry.contains("$.userStories[0].priority"),
        "{retry}"
    );
    let written: Value = serde_json::from_str(&env.read("new-prd.json")).unwrap();
    assert_eq!(written["userStories"][1]["dependsOn"], json!(["US-001"]));
    let valid = ralph(&env, &["validate", "new-prd.json"]);
    assert!(valid.status.success(), "{}", text(&valid));
}

#[test]
fn plan_after_the_native_primarys_spent_quota_gives_the_exec_fallback_the_format_and_example() {
    let llm = ScriptedLlm::start(ProviderKind::Openai, |_| {
        ScriptedReply::api_error(429, "insufficient_quota", "You exceeded your current quota")
    });
    let env = env_with(1, &exec_fallback());
    let saved = saved_prompt(&env);
    env.script(&json!({"invocations": [exec_answers(&saved, &plan_doc())]}));
    let mut args = vec!["plan".to_string(), "reverse flag".into(), "--yes".into()];
    args.extend(native_primary(&llm));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ralph(&env, &args);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the native session hit a usage limit")
            && stderr.contains("trying the next agent, cli (exec)"),
        "{stderr}"
    );
    assert_eq!(llm.request_count(), 1, "a spent quota is not retried");
    assert_response_format(&llm.requests()[0].body, "userStories");
    assert_eq!(env.agent_calls(), 1, "one exec session");
    let prompt = std::fs::read_to_string(&saved).expect("the exec agent's stdin");
    assert_example_prompt(&prompt, "the exec fallback's PRD prompt");
    assert!(prompt.contains("reverse flag"), "{prompt}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .starts_with("✓ wrote tasks/prd-reverse-flag.md: 2 stories"),
        "{}",
        text(&out)
    );
}

/// A draft refused by the check, then a key the server rejects: the retry goes to the exec
/// fallback with the CLI agent's prompt (format and example) and the first draft's problems.
#[test]
fn convert_retry_after_the_native_primarys_login_fails_is_written_for_the_exec_fallback() {
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(bad_draft().to_string()),
            ScriptedReply::api_error(401, "authentication_error", "invalid x-api-key"),
        ],
    );
    let env = env_with(1, &exec_fallback());
    env.write("notes.md", FREE_FORM);
    let saved = saved_prompt(&env);
    env.script(&json!({"invocations": [exec_answers(&saved, &fixed_draft())]}));
    let mut args: Vec<String> = ["convert", "notes.md", "--out", "new-prd.json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(native_primary(&llm));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ralph(&env, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the native session is not logged in (auth_error)")
            && stderr.contains("trying the next agent, cli (exec)"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("converted by the agent in 2 attempts)"),
        "{}",
        text(&out)
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the draft, then the refused retry");
    assert_schema_prompt(&reqs[0].last_user_text(), "the native first prompt");
    let prompt = std::fs::read_to_string(&saved).expect("the exec agent's stdin");
    assert_example_prompt(&prompt, "the exec fallback's retry prompt");
    assert!(
        prompt.contains("## Your previous reply had problems")
            && prompt.contains("$.userStories[0].priority"),
        "{prompt}"
    );
    let valid = ralph(&env, &["validate", "new-prd.json"]);
    assert!(valid.status.success(), "{}", text(&valid));
}
