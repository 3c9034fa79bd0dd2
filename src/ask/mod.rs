//! Answer sessions: one agent session that returns a document instead of changing the code, for
//! `ralph plan` and `ralph convert`.
//!
//! [`Asker`] resolves the settings the way `ralph run` does (flags > `RALPH_*` > ralph.toml >
//! defaults, [`crate::config::RunConfig`]), builds the backend with the same
//! [`crate::run::preflight::build_backend`] (so every backend works: the agent CLIs, `native`,
//! and `local`, whose model server it starts with [`crate::run::session::start_local_server`]),
//! and runs each session through the one agent launcher,
//! [`crate::agent::session::run_session`], like an iteration (tag, environment without
//! `RALPH_GIT_TOKEN`, redaction, error patterns, stray kill). Native and local
//! sessions offer no tools and send the answer's JSON Schema as `response_format`, which
//! llama.cpp enforces with a grammar, so even a small local model's reply has the right shape.
//!
//! [`ask_until_valid`] is the feedback loop both commands share: ask, pull the JSON out of the
//! reply ([`json::extract`]), check it, and when it has problems ask again with the previous reply
//! and the problems, a bounded number of times; then give up naming the file that keeps the last
//! draft.

pub mod facts;
pub mod json;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::agent::session::{run_session, Session, SessionEnd};
use crate::cli::SessionArgs;
use crate::config::RunConfig;
use crate::error::UserError;
use crate::local::LocalServer;
use crate::output::Outputs;
use crate::process::{self, StopSignals};
use crate::protocol::{AgentKind, AgentReport, FailureClass, RunEvent};
use crate::workspace::RunPaths;

/// Output tokens an answer of the local model may take (a prd.json of a few stories).
const LOCAL_ANSWER_TOKENS: u32 = 3072;
/// The local model's context for answer sessions: the prompt, a PRD and the answer.
const LOCAL_ANSWER_CONTEXT: u32 = 8192;

/// The agent's reply to one session.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The final text (for native/local: the schema-shaped reply).
    pub text: String,
    /// What the backend's parser reported.
    pub report: AgentReport,
}

/// Runs answer sessions with one backend (see the module docs). Holds the local model's server,
/// when there is one, until [`Asker::close`] (or drop, which kills it).
pub struct Asker {
    cfg: RunConfig,
    paths: RunPaths,
    base_url: Option<String>,
    server: Option<LocalServer>,
    stop: StopSignals,
    /// The tag prefix of this command's sessions (`ask-<pid>-<unix ms>`), numbered by
    /// `sessions`.
    session_id: String,
    sessions: std::sync::atomic::AtomicU32,
    /// `--sandbox`: the sandbox of every session (`None`: off).
    sandbox: Option<crate::process::sandbox::Sandbox>,
}

impl Asker {
    /// Resolves the settings from `args` in `cwd` (whose repository root is the agent's working
    /// directory), checks the agent (program on PATH, API key variable) and, for `local`, starts
    /// the model server. `stop` cancels a session in flight (Ctrl-C).
    ///
    /// # Errors
    /// Invalid settings (exit 2 for a bad flag value), a missing agent program or API key
    /// variable, a local model that cannot be set up or started.
    pub async fn open(
        args: &SessionArgs,
        cwd: &Path,
        out: &mut Outputs,
        stop: StopSignals,
    ) -> anyhow::Result<Asker> {
        let mut cfg = RunConfig::resolve(&args.run_args(), cwd).map_err(|e| {
            let status = e.exit_status();
            UserError::new(e.to_string()).with_status(status)
        })?;
        // One reply with no tools; for the small local model, room for a PRD and its answer.
        cfg.native.tools = Some(Vec::new());
        if cfg.agent == AgentKind::Local {
            cfg.native.max_tokens = cfg.native.max_tokens.max(LOCAL_ANSWER_TOKENS);
            cfg.native.context_window = cfg.native.context_window.max(LOCAL_ANSWER_CONTEXT);
        }
        let root = crate::git::Repo::discover(cwd)
            .map(|r| r.root().to_path_buf())
            .unwrap_or_else(|_| cwd.to_path_buf());
        let paths = RunPaths::new(&root, &cfg.prd_path);
        // Secrets of this repository's environment and `.env` files stay out of what is shown
        // and written (crate::redact).
        crate::redact::install(&root);
        let probe_cfg = with_schema(&cfg, &Value::Bool(true));
        let probe = crate::run::preflight::build_backend(&probe_cfg, &paths, None)?;
        crate::run::preflight::check_agent(&probe_cfg, probe.as_ref(), &paths.repo_root)?;
        for notice in probe.notices() {
            out.warn(notice);
        }
        let mut base_url = cfg.native.base_url.clone();
        let mut server = None;
        // A sandbox that cannot be built stops here, before any session.
        let sandbox =
            crate::agent::sandbox::build(&crate::run::preflight::sandbox_ask(&cfg), probe.info())?;
        if cfg.agent == AgentKind::Local && base_url.is_none() {
            let started = crate::run::session::start_local_server(&cfg, out).await?;
            base_url = Some(started.base_url());
            server = Some(started);
        }
        crate::agent::sandbox::allow_url(sandbox.as_ref(), base_url.as_deref());
        Ok(Asker {
            cfg,
            paths,
            base_url,
            server,
            stop,
            session_id: format!(
                "ask-{}-{}",
                std::process::id(),
                chrono::Utc::now().timestamp_millis()
            ),
            sessions: std::sync::atomic::AtomicU32::new(0),
            sandbox,
        })
    }

    /// The backend in use.
    pub fn agent(&self) -> AgentKind {
        self.cfg.agent
    }

    /// Whether the reply's JSON Schema reaches the model as `response_format` (native and
    /// local, where llama.cpp enforces it): then a prompt needs no example of the reply, which
    /// a small model would copy as its answer.
    pub fn sends_schema(&self) -> bool {
        matches!(self.cfg.agent, AgentKind::Native | AgentKind::Local)
    }

    /// The repository root (or the directory ralph was started in, outside a repository): the
    /// agent's working directory.
    pub fn root(&self) -> &Path {
        &self.paths.repo_root
    }

    /// Runs one session for `prompt`. `schema` is the JSON Schema of the expected reply: sent to
    /// native/local backends as `response_format`; CLI agents read the format from the prompt.
    /// Assistant text and tool calls reach `out` as agent events (shown with `--verbose`).
    ///
    /// # Errors
    /// The agent could not start, was stopped (Ctrl-C), timed out, or ended without a reply;
    /// each error names the backend and what it said.
    pub async fn ask(
        &self,
        prompt: &str,
        schema: &Value,
        out: &mut Outputs,
    ) -> anyhow::Result<Answer> {
        let cfg = with_schema(&self.cfg, schema);
        let backend =
            crate::run::preflight::build_backend(&cfg, &self.paths, self.base_url.clone())?;
        let limits = process::Limits {
            timeout: cfg.timeout,
            idle_timeout: cfg.idle_timeout,
            kill_grace: cfg.kill_grace,
            ..process::Limits::default()
        };
        // The one agent launcher, as an iteration's: the tag, the environment (no
        // RALPH_GIT_TOKEN), redaction, the error patterns, the stray kill.
        let n = self
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let session = Session {
            spec: backend.command(prompt)?,
            parser: backend.answer_parser(prompt),
            tag: process::agent_tag(&self.session_id, n),
            limits: &limits,
            stop: &self.stop,
            patterns: &cfg.patterns,
            sandbox: self.sandbox.as_ref(),
        };
        let SessionEnd {
            process: outcome,
            report,
            strays,
        } = run_session(
            session,
            |_| {},
            |seen| {
                for event in seen.events {
                    // An answer session is no iteration of a run: 0 (see the event's docs).
                    out.emit(RunEvent::AgentEvent {
                        iteration: 0,
                        agent_event: event,
                    });
                }
            },
        )
        .await?;
        let agent = self.cfg.agent.as_str();
        if !strays.is_empty() {
            out.warn(format!(
                "the {agent} session left {} process{} running; killed: {}",
                strays.len(),
                if strays.len() == 1 { "" } else { "es" },
                strays
                    .iter()
                    .map(|s| format!(
                        "pid {} `{}`",
                        s.pid,
                        crate::redact::current().redact_string(&s.command)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        match outcome.end {
            process::EndReason::Cancelled => {
                return Err(UserError::new(format!("the {agent} session was stopped"))
                    .with_status(crate::protocol::ExitStatus::Interrupted)
                    .into())
            }
            process::EndReason::TimedOut | process::EndReason::Idle => {
                return Err(UserError::new(format!(
                    "the {agent} session timed out after {}",
                    humantime::format_duration(match outcome.end {
                        process::EndReason::Idle => limits.idle_timeout,
                        _ => limits.timeout,
                    })
                ))
                .with_hint("raise --timeout, or try a faster model")
                .into())
            }
            _ => {}
        }
        let text = report.final_text.clone().unwrap_or_default();
        if text.trim().is_empty() {
            let said = report
                .error_message
                .clone()
                .unwrap_or_else(|| "nothing".to_string());
            if let Some(err) = classified_error(agent, &report, &said) {
                return Err(err.into());
            }
            return Err(UserError::new(format!(
                "the {agent} session ended without a reply (exit code {}; it said: {said})",
                outcome
                    .exit_code
                    .map_or_else(|| "none".to_string(), |c| c.to_string())
            ))
            .with_hint(format!(
                "check the agent on its own (`ralph doctor --agent {agent}`), or run again with \
                 --verbose to see what it did"
            ))
            .into());
        }
        Ok(Answer { text, report })
    }

    /// Stops the local model's server, if one was started.
    pub async fn close(self) {
        if let Some(server) = self.server {
            server.stop().await;
        }
    }
}

/// The error of a session that failed with a known class (the backend's or the user's
/// `[patterns]`): what it means and what to do, as `ralph run` says it. `None` for other
/// failures.
fn classified_error(agent: &str, report: &AgentReport, said: &str) -> Option<UserError> {
    let class = report.failure?;
    let (what, hint) = match class {
        FailureClass::UsageLimit => (
            match report.resume_at {
                Some(at) => format!(
                    "hit a usage limit (it resets at {})",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                None => "hit a usage limit".to_string(),
            },
            "run again after the reset, or use another agent (--agent/--model)".to_string(),
        ),
        FailureClass::Auth => (
            "is not logged in (auth_error)".to_string(),
            format!("log in to {agent} (`ralph doctor --agent {agent}` shows how)"),
        ),
        FailureClass::Config => (
            "cannot run as configured (config_error)".to_string(),
            format!("`ralph doctor --agent {agent}` checks the agent's setup"),
        ),
        _ => return None,
    };
    Some(UserError::new(format!("the {agent} session {what}: {said}")).with_hint(hint))
}

fn with_schema(cfg: &RunConfig, schema: &Value) -> RunConfig {
    let mut cfg = cfg.clone();
    cfg.native.answer_schema = Some(schema.clone());
    cfg
}

/// The result of checking one draft (see [`ask_until_valid`]).
#[derive(Debug)]
pub struct Checked<T> {
    /// The draft as a usable value: `Some` when it may be written (perhaps with `problems` left
    /// as warnings), `None` when it may not.
    pub usable: Option<T>,
    /// Everything to tell the agent, one line each (path, problem, fix).
    pub problems: Vec<String>,
}

/// What [`ask_until_valid`] settled on.
#[derive(Debug)]
pub struct Settled<T> {
    /// The accepted value.
    pub value: T,
    /// The problems left (warnings), empty when the last draft was clean.
    pub warnings: Vec<String>,
    /// Sessions it took.
    pub attempts: u32,
}

/// The feedback loop settings of [`ask_until_valid`].
#[derive(Debug, Clone)]
pub struct Loop<'a> {
    /// The first prompt; later prompts append the previous reply and its problems.
    pub prompt: &'a str,
    /// The JSON Schema of the reply.
    pub schema: &'a Value,
    /// A top-level key the wanted JSON object has (picks it among several in a chatty reply).
    pub key: &'a str,
    /// Sessions at most (at least 1).
    pub max_attempts: u32,
    /// Where the last draft is kept when ralph gives up.
    pub draft_path: PathBuf,
    /// What is asked for, for messages, as a bare noun (`prd.json`, `PRD`, `clarifying
    /// questions`): "asking claude for the PRD", "PRD draft 2 has 3 problems", "did not
    /// produce a valid PRD" ("valid clarifying questions" for a plural).
    pub what: &'a str,
}

/// Asks until `check` finds no problem, at most `settings.max_attempts` times, each time with the
/// previous reply and its problems appended to the prompt ([`feedback_prompt`]). A clean draft is
/// returned at once; when the attempts run out, the last usable draft is returned with its
/// problems as warnings.
///
/// # Errors
/// An agent session that fails (see [`Asker::ask`]); no usable draft after the last attempt: a
/// [`UserError`] listing the last problems and naming `draft_path`, where the last draft was
/// saved (the reply's JSON document pretty-printed, or the whole reply when it holds none).
pub async fn ask_until_valid<T>(
    asker: &Asker,
    settings: &Loop<'_>,
    out: &mut Outputs,
    check: impl Fn(&Value) -> Checked<T>,
) -> anyhow::Result<Settled<T>> {
    let max = settings.max_attempts.max(1);
    let mut prompt = settings.prompt.to_string();
    let mut best: Option<(T, Vec<String>, u32)> = None;
    let mut last = (String::new(), Vec::new());
    for attempt in 1..=max {
        out.notice(format!(
            "asking {} for the {} (attempt {attempt} of {max})",
            asker.agent().as_str(),
            settings.what
        ));
        let answer = asker.ask(&prompt, settings.schema, out).await?;
        let found = json::extract(&answer.text, settings.key);
        // The draft as the agent meant it: the JSON document alone (an exec agent's log lines
        // and sentences around it are not part of it), else the whole reply.
        let draft = found
            .as_ref()
            .and_then(|v| serde_json::to_string_pretty(v).ok())
            .unwrap_or_else(|| answer.text.clone());
        let checked = match found {
            Some(value) => check(&value),
            None => Checked {
                usable: None,
                problems: vec![format!(
                    "$: the reply holds no JSON object (fix: reply with exactly one JSON object \
                     that has a {:?} field, and nothing else)",
                    settings.key
                )],
            },
        };
        match checked.usable {
            Some(value) if checked.problems.is_empty() => {
                return Ok(Settled {
                    value,
                    warnings: Vec::new(),
                    attempts: attempt,
                })
            }
            Some(value) => best = Some((value, checked.problems.clone(), attempt)),
            None => {}
        }
        if attempt < max {
            out.warn(format!(
                "{} draft {attempt} has {} problem{}; asking again",
                settings.what,
                checked.problems.len(),
                if checked.problems.len() == 1 { "" } else { "s" }
            ));
        }
        prompt = feedback_prompt(settings.prompt, &draft, &checked.problems);
        last = (draft, checked.problems);
    }
    if let Some((value, warnings, attempts)) = best {
        return Ok(Settled {
            value,
            warnings,
            attempts,
        });
    }
    let (text, problems) = last;
    let saved = save_draft(&settings.draft_path, &text);
    let mut message = format!(
        "the agent did not produce {}valid {} in {max} attempt{}; the last draft's problems:",
        if settings.what.ends_with('s') {
            ""
        } else {
            "a "
        },
        settings.what,
        if max == 1 { "" } else { "s" }
    );
    for p in problems.iter().take(20) {
        message.push_str("\n  - ");
        message.push_str(p);
    }
    if problems.len() > 20 {
        message.push_str(&format!("\n  - … ({} in all)", problems.len()));
    }
    let hint = match saved {
        Ok(()) => format!(
            "the last draft is saved in {}: fix it by hand, or run again (more attempts: \
             --attempts N; a stronger model: --agent/--model)",
            settings.draft_path.display()
        ),
        Err(e) => format!(
            "the last draft could not be saved in {} ({e}); run again with --verbose to see it",
            settings.draft_path.display()
        ),
    };
    Err(UserError::new(message).with_hint(hint).into())
}

/// The prompt of a retry: the first prompt, then the previous reply and its problems.
pub fn feedback_prompt(prompt: &str, previous: &str, problems: &[String]) -> String {
    let mut text = prompt.trim_end().to_string();
    text.push_str(
        "\n\n## Your previous reply had problems\n\nralph checked your previous reply and found \
         the problems listed below. Reply again with the complete, corrected JSON document (not \
         only the changes), and nothing else.\n\nYour previous reply:\n\n```\n",
    );
    let shown: String = previous.trim().chars().take(12_000).collect();
    text.push_str(&shown);
    text.push_str("\n```\n\nThe problems (where, what, and the fix):\n\n");
    for p in problems {
        text.push_str("- ");
        text.push_str(p);
        text.push('\n');
    }
    text
}

fn save_draft(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut body = text.trim().to_string();
    body.push('\n');
    crate::fsutil::write_atomic(path, body.as_bytes())
}
