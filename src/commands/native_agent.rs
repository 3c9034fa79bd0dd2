//! `ralph __native-agent` (hidden): one session of ralph's own tool loop, started by `ralph run`
//! for the `native` and `local` backends. Prompt on stdin, settings in
//! [`crate::agent::native::SETTINGS_VAR`], events and the result as JSON lines on stdout (see
//! [`crate::agent::native`]).

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::agent::native::{NativeSettings, SETTINGS_VAR};
use crate::error::UserError;
use crate::native::llm::{Provider, ProviderConfig, RetryPolicy};
use crate::native::tools::{StoryCheck, ToolContext, ToolRegistry};
use crate::native::{run_session, SessionConfig};
use crate::process::StopSignals;
use crate::protocol::AgentEvent;
use crate::protocol::ExitStatus;

/// The built-in system prompt of the native loop.
pub const SYSTEM_TEMPLATE: &str = include_str!("../../templates/native_system.md");

fn emit(value: &serde_json::Value) {
    emit_line(&value.to_string());
}

fn emit_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs one session.
///
/// # Errors
/// Missing or invalid settings, an unreadable stdin, a missing API key variable.
pub fn run() -> anyhow::Result<ExitStatus> {
    let raw = std::env::var(SETTINGS_VAR).with_context(|| {
        format!("{SETTINGS_VAR} is not set: this command is started by `ralph run --agent native|local`")
    })?;
    let settings: NativeSettings =
        serde_json::from_str(&raw).with_context(|| format!("{SETTINGS_VAR} is not valid"))?;
    let mut prompt = String::new();
    std::io::stdin()
        .read_to_string(&mut prompt)
        .context("cannot read the prompt from stdin")?;
    let api_key = match &settings.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            UserError::new(format!("the API key variable {var} is not set")).with_hint(format!(
                "export {var}=<your key>, or name another variable with --api-key-env"
            ))
        })?),
        None => None,
    };
    let api_key_for_redaction = api_key.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = StopSignals::default();
        let _signals = crate::signals::install(stop.clone())?;
        let provider = Provider::new(ProviderConfig {
            kind: settings.provider,
            base_url: settings.base_url.clone(),
            api_key,
            stream: settings.stream,
            request_timeout: Duration::from_secs(600),
        })?;
        let tools = ToolRegistry::standard();
        let ctx = ToolContext {
            repo_root: std::fs::canonicalize(&settings.repo_root)
                .unwrap_or_else(|_| settings.repo_root.clone()),
            prd_path: settings.prd_path.clone(),
            progress_path: settings.progress_path.clone(),
            command_timeout: Duration::from_secs(settings.command_timeout_s),
            max_output_bytes: 16 * 1024,
            stop: StopSignals::default(),
            // The model must not be able to print the API key through a shell command.
            env_remove: settings.api_key_env.iter().cloned().collect(),
            story_check: settings.mark_protocol.then(|| StoryCheck {
                fallback: settings.verify.clone(),
                timeout: Duration::from_secs(settings.verify_timeout_s.max(1)),
                secrets: crate::redact::env_secrets(),
            }),
        };
        // A stop for the session also stops the running tool.
        let tool_stop = ctx.stop.clone();
        let session_stop = stop.clone();
        tokio::spawn(async move {
            session_stop.stop.cancelled().await;
            tool_stop.kill_now.cancel();
        });
        let system_prompt = minijinja::Environment::new()
            .template_from_str(SYSTEM_TEMPLATE)
            .and_then(|t| t.render(json!({"repo_root": ctx.repo_root})))
            .context("rendering the native system prompt")?;
        let cfg = SessionConfig {
            model: settings.model.clone(),
            system_prompt,
            max_steps: settings.max_steps,
            max_tokens: settings.max_tokens,
            context_window: settings.context_window,
            max_continuations: 3,
            temperature: settings.temperature,
            seed: settings.seed,
            tool_mode: settings.tool_mode,
            retry: RetryPolicy::default(),
            allowed_tools: settings.tools.clone(),
            redact: api_key_for_redaction.clone().into_iter().collect(),
            mark_protocol: settings.mark_protocol,
        };
        let secrets: Vec<String> = api_key_for_redaction.into_iter().collect();
        let mut on_event = |event: AgentEvent| {
            let line = json!({"type": "event", "event": event}).to_string();
            emit_line(&crate::native::redact(&line, &secrets));
        };
        let result = run_session(
            &provider,
            &tools,
            &ctx,
            &cfg,
            &prompt,
            &stop.stop,
            &mut on_event,
        )
        .await;
        let cost = settings.price.map(|p| p.cost(&result.usage));
        emit(&json!({
            "type": "result",
            "final_text": result.final_text,
            "end": result.end,
            "usage": result.usage,
            "steps": result.steps,
            "requests": result.requests,
            "model": result.model,
            "cost_usd": cost,
        }));
        Ok(ExitStatus::Success)
    })
}
