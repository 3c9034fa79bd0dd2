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
//!
//! A prompt is never rendered once for the whole command: the callers hand over a renderer
//! ([`Render`]), and every session renders it for the agent that runs it ([`PromptStyle`]), so
//! that after a switch to a fallback agent, a CLI agent still reads the reply's format and an
//! example, and a native or local model gets the schema's wording with no example to copy (the
//! local model its compact template).

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

/// How a prompt is written for the agent that runs the session: what that agent's profile
/// (its backend) needs to read. Chosen by [`PromptStyle::for_agent`] for every session, so
/// that a fallback agent gets its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptStyle {
    /// An agent CLI (claude, codex, opencode, gemini, amp, cursor, exec): no schema reaches the
    /// model, so the prompt describes the reply's format and shows an example of it.
    Example,
    /// `native`: the reply's JSON Schema goes as `response_format`; the full prompt names the
    /// fields and shows no example (a model may copy it as its answer).
    Schema,
    /// `local`: the schema goes as `response_format` (llama.cpp enforces it with a grammar) and
    /// the prompt is the compact template: no example, less prose, so that a small model on a
    /// CPU reads fewer tokens and has nothing to copy.
    Compact,
}

impl PromptStyle {
    /// The style for an agent of backend `kind`.
    pub fn for_agent(kind: AgentKind) -> PromptStyle {
        match kind {
            AgentKind::Native => PromptStyle::Schema,
            AgentKind::Local => PromptStyle::Compact,
            _ => PromptStyle::Example,
        }
    }

    /// Whether the reply's JSON Schema reaches the model as `response_format` (native and
    /// local): then the prompt needs no example of the reply, which a small model would copy.
    pub fn sends_schema(self) -> bool {
        !matches!(self, PromptStyle::Example)
    }

    /// Whether the prompt shows an example reply (only for the agent CLIs).
    pub fn shows_example(self) -> bool {
        !self.sends_schema()
    }

    /// Whether the prompt is the compact template (the local model).
    pub fn compact(self) -> bool {
        matches!(self, PromptStyle::Compact)
    }
}

/// A prompt renderer: the whole prompt text of one session for the agent that runs it
/// ([`PromptStyle`]). Called once per session, so that each agent reads its own.
pub type Render<'a> = dyn Fn(PromptStyle) -> String + Send + Sync + 'a;

/// The agent's reply to one session.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The final text (for native/local: the schema-shaped reply).
    pub text: String,
    /// What the backend's parser reported.
    pub report: AgentReport,
}

/// Runs answer sessions with the run's agents: the primary first, then each fallback agent
/// (`--fallback-agent`, ralph.toml's `fallback_agents`/`[[agents]]`) once the ones before it hit
/// a usage limit or cannot log in, each with its own profile (backend, program, model, limits).
/// Holds the local model's servers, when there are any, until [`Asker::close`] (or drop, which
/// kills them).
pub struct Asker {
    /// Every agent, in the order they are tried.
    agents: Vec<AskAgent>,
    /// The agent in use (an index into `agents`); it only moves forward.
    current: std::sync::atomic::AtomicUsize,
    /// Why each agent before `current` was left: `claude hit a usage limit: …`.
    failures: std::sync::Mutex<Vec<String>>,
    paths: RunPaths,
    /// The local model servers started so far.
    servers: tokio::sync::Mutex<Vec<LocalServer>>,
    stop: StopSignals,
    /// The tag prefix of this command's sessions (`ask-<pid>-<unix ms>`), numbered by
    /// `sessions`.
    session_id: String,
    sessions: std::sync::atomic::AtomicU32,
}

/// One agent of an [`Asker`], built and checked.
struct AskAgent {
    /// Its profile's name (`claude`, or an `[[agents]]` table's name).
    name: String,
    /// The settings with this agent, tuned for answer sessions.
    cfg: RunConfig,
    /// The API base URL once known (for `local` without `--base-url`: set when its server
    /// starts, on first use).
    base_url: std::sync::Mutex<Option<String>>,
    /// `--sandbox`: the sandbox of its sessions (`None`: off).
    sandbox: Option<crate::process::sandbox::Sandbox>,
}

impl AskAgent {
    /// `backup (codex)`, or `codex` when the profile is named after its backend.
    fn label(&self) -> String {
        if self.name == self.cfg.agent.as_str() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.cfg.agent.as_str())
        }
    }
}

/// Why one session gave no answer.
enum Failed {
    /// The agent cannot be used now (a usage limit, a failed login): the next agent may be.
    Unavailable(UserError),
    /// Anything else: the command stops.
    Stop(anyhow::Error),
}

impl Asker {
    /// Resolves the settings from `args` in `cwd` (whose repository root is the agent's working
    /// directory), builds and checks every agent (program on PATH, API key variable) through
    /// [`crate::run::preflight::build_checked`], as `ralph run`'s preflight does, and, for a
    /// primary `local`, starts the model server (a fallback's starts when it is first used).
    /// `stop` cancels a session in flight (Ctrl-C).
    ///
    /// # Errors
    /// Invalid settings (exit 2 for a bad flag value), a missing agent program or API key
    /// variable (a fallback agent's named after it), a local model that cannot be set up or
    /// started.
    pub async fn open(
        args: &SessionArgs,
        cwd: &Path,
        out: &mut Outputs,
        stop: StopSignals,
    ) -> anyhow::Result<Asker> {
        let run_cfg = RunConfig::resolve(&args.run_args(), cwd).map_err(|e| {
            let status = e.exit_status();
            UserError::new(e.to_string()).with_status(status)
        })?;
        let root = crate::git::Repo::discover(cwd)
            .map(|r| r.root().to_path_buf())
            .unwrap_or_else(|_| cwd.to_path_buf());
        let paths = RunPaths::new(&root, &run_cfg.prd_path);
        // Secrets of this repository's environment and `.env` files stay out of what is shown
        // and written (crate::redact).
        crate::redact::install(&root);
        let mut agents = Vec::new();
        for (i, profile) in run_cfg.agents().iter().enumerate() {
            let names = match i {
                0 => crate::run::preflight::Names::Primary,
                _ => crate::run::preflight::Names::Fallback {
                    name: &profile.name,
                    file: run_cfg.config_file.as_deref().filter(|_| profile.table),
                },
            };
            let agent = open_agent(&run_cfg.for_agent(profile), &paths, &names, out).map_err(
                |e| match i {
                    0 => e,
                    _ => anyhow::anyhow!("fallback agent `{}`: {e:#}", profile.name),
                },
            )?;
            agents.push(AskAgent {
                name: profile.name.clone(),
                ..agent
            });
        }
        let asker = Asker {
            agents,
            current: std::sync::atomic::AtomicUsize::new(0),
            failures: std::sync::Mutex::new(Vec::new()),
            paths,
            servers: tokio::sync::Mutex::new(Vec::new()),
            stop,
            session_id: format!(
                "ask-{}-{}",
                std::process::id(),
                chrono::Utc::now().timestamp_millis()
            ),
            sessions: std::sync::atomic::AtomicU32::new(0),
        };
        asker.base_url(0, out).await?;
        Ok(asker)
    }

    fn current(&self) -> &AskAgent {
        &self.agents[self.current.load(std::sync::atomic::Ordering::Relaxed)]
    }

    /// The backend in use.
    pub fn agent(&self) -> AgentKind {
        self.current().cfg.agent
    }

    /// The agent in use, for messages: `claude`, or `backup (codex)` for an `[[agents]]` table
    /// named other than its backend.
    pub fn agent_label(&self) -> String {
        self.current().label()
    }

    /// The repository root (or the directory ralph was started in, outside a repository): the
    /// agent's working directory.
    pub fn root(&self) -> &Path {
        &self.paths.repo_root
    }

    /// The API base URL of agent `i`, starting its local model server first when it needs one.
    async fn base_url(&self, i: usize, out: &mut Outputs) -> anyhow::Result<Option<String>> {
        let agent = &self.agents[i];
        if let Some(url) = agent.base_url.lock().map(|u| u.clone()).unwrap_or_default() {
            return Ok(Some(url));
        }
        if agent.cfg.agent != AgentKind::Local {
            return Ok(None);
        }
        let started = crate::run::session::start_local_server(&agent.cfg, out).await?;
        let url = started.base_url();
        crate::agent::sandbox::allow_url(agent.sandbox.as_ref(), Some(&url));
        if let Ok(mut slot) = agent.base_url.lock() {
            *slot = Some(url.clone());
        }
        self.servers.lock().await.push(started);
        Ok(Some(url))
    }

    /// Runs one session on the agent in use, with the prompt `render` writes for it (its
    /// [`PromptStyle`]); when it hits a usage limit or cannot log in and a fallback agent is
    /// left, says so on stderr and asks the next agent (with its own profile, and the prompt
    /// rendered again for it), which stays in use for the later sessions. `schema` is the JSON
    /// Schema of the expected reply: sent to native/local backends as `response_format`; CLI
    /// agents read the format from the prompt. Assistant text and tool calls reach `out` as
    /// agent events (shown with `--verbose`).
    ///
    /// # Errors
    /// The agent could not start, was stopped (Ctrl-C), timed out, or ended without a reply;
    /// each error names the backend and what it said. When every agent was tried, the error
    /// names each agent and how it failed.
    pub async fn ask(
        &self,
        render: &Render<'_>,
        schema: &Value,
        out: &mut Outputs,
    ) -> anyhow::Result<Answer> {
        use std::sync::atomic::Ordering;
        loop {
            let i = self.current.load(Ordering::Relaxed);
            let prompt = render(PromptStyle::for_agent(self.agents[i].cfg.agent));
            let why = match self.ask_agent(i, &prompt, schema, out).await {
                Ok(answer) => return Ok(answer),
                Err(Failed::Stop(e)) => return Err(e),
                Err(Failed::Unavailable(e)) => e,
            };
            let label = self.agents[i].label();
            let mut failures = self.failures.lock().map(|f| f.clone()).unwrap_or_default();
            failures.push(format!("{label}: {}", why.message()));
            if let Ok(mut f) = self.failures.lock() {
                *f = failures.clone();
            }
            let Some(next) = self.agents.get(i + 1) else {
                if failures.len() == 1 {
                    return Err(why.into());
                }
                return Err(UserError::new(format!(
                    "every agent failed:\n  - {}",
                    failures.join("\n  - ")
                ))
                .with_hint(
                    "run again after the usage limits reset or once the agents are logged in; \
                     `ralph doctor` checks each agent",
                )
                .into());
            };
            out.warn(format!(
                "{}; trying the next agent, {}",
                why.message(),
                next.label()
            ));
            self.current.store(i + 1, Ordering::Relaxed);
        }
    }

    /// One session for `prompt` on agent `i` (see [`Asker::ask`]).
    async fn ask_agent(
        &self,
        i: usize,
        prompt: &str,
        schema: &Value,
        out: &mut Outputs,
    ) -> Result<Answer, Failed> {
        let agent = &self.agents[i];
        let base_url = self.base_url(i, out).await.map_err(Failed::Stop)?;
        let cfg = with_schema(&agent.cfg, schema);
        let backend = crate::run::preflight::build_backend(&cfg, &self.paths, base_url)
            .map_err(Failed::Stop)?;
        // A native or local session answers in one message, printed when the whole reply has
        // arrived: it is silent until then, so only the session's --timeout bounds it (a small
        // local model on a busy machine takes minutes for a prd.json).
        let one_message = matches!(cfg.agent, AgentKind::Native | AgentKind::Local);
        let limits = process::Limits {
            timeout: cfg.timeout,
            idle_timeout: if one_message {
                cfg.idle_timeout.max(cfg.timeout)
            } else {
                cfg.idle_timeout
            },
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
            spec: backend.command(prompt).map_err(Failed::Stop)?,
            parser: backend.answer_parser(prompt),
            tag: process::agent_tag(&self.session_id, n),
            limits: &limits,
            stop: &self.stop,
            patterns: &cfg.patterns,
            sandbox: agent.sandbox.as_ref(),
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
        .await
        .map_err(|e| Failed::Stop(e.into()))?;
        // Messages name the agent as the run does (`backup (codex)`); `ralph doctor --agent`
        // takes its backend.
        let (label, kind) = (agent.label(), agent.cfg.agent.as_str());
        warn_strays(&label, &strays, out);
        let text = judge((&label, kind), &outcome, &report, &limits)?;
        Ok(Answer { text, report })
    }

    /// Stops the local model servers that were started.
    pub async fn close(self) {
        for server in self.servers.into_inner() {
            server.stop().await;
        }
    }
}

/// Warns that a session left processes running (they were killed), naming them redacted.
fn warn_strays(agent: &str, strays: &[process::Stray], out: &mut Outputs) {
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
}

/// The reply of a finished session, or why it has none: stopped, timed out, a usage limit or a
/// failed login (for which another agent may do better), another known failure, or no text.
fn judge(
    (agent, kind): (&str, &str),
    outcome: &process::ProcessOutcome,
    report: &AgentReport,
    limits: &process::Limits,
) -> Result<String, Failed> {
    match outcome.end {
        process::EndReason::Cancelled => {
            return Err(Failed::Stop(
                UserError::new(format!("the {agent} session was stopped"))
                    .with_status(crate::protocol::ExitStatus::Interrupted)
                    .into(),
            ))
        }
        process::EndReason::TimedOut => {
            return Err(Failed::Stop(
                UserError::new(format!(
                    "the {agent} session timed out after {} (--timeout)",
                    humantime::format_duration(limits.timeout)
                ))
                .with_hint("raise --timeout, or try a faster model")
                .into(),
            ))
        }
        process::EndReason::Idle => {
            return Err(Failed::Stop(
                UserError::new(format!(
                    "the {agent} session printed nothing for {} and was stopped (the idle limit, \
                     ralph.toml's `idle_timeout`)",
                    humantime::format_duration(limits.idle_timeout)
                ))
                .with_hint(
                    "raise `idle_timeout` in ralph.toml if the agent works silently for that long",
                )
                .into(),
            ))
        }
        _ => {}
    }
    let text = report.final_text.clone().unwrap_or_default();
    // A limit or a failed login is no reply, even when the agent printed a sentence about
    // it as its final text (claude's `You've hit your session limit`).
    let failed = report.is_error || outcome.exit_code.is_some_and(|c| c != 0);
    if failed
        && matches!(
            report.failure,
            Some(FailureClass::UsageLimit | FailureClass::Auth)
        )
    {
        let said = report
            .error_message
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| text.trim().to_owned());
        if let Some((err, _)) = classified_error((agent, kind), report, &said) {
            return Err(Failed::Unavailable(err));
        }
    }
    if text.trim().is_empty() {
        let said = report
            .error_message
            .clone()
            .unwrap_or_else(|| "nothing".to_string());
        if let Some((err, unavailable)) = classified_error((agent, kind), report, &said) {
            return Err(match unavailable {
                true => Failed::Unavailable(err),
                false => Failed::Stop(err.into()),
            });
        }
        return Err(Failed::Stop(
            UserError::new(format!(
                "the {agent} session ended without a reply (exit code {}; it said: {said})",
                outcome
                    .exit_code
                    .map_or_else(|| "none".to_string(), |c| c.to_string())
            ))
            .with_hint(format!(
                "check the agent on its own (`ralph doctor --agent {kind}`), or run again with \
             --verbose to see what it did"
            ))
            .into(),
        ));
    }
    Ok(text)
}

/// The error of a session that failed with a known class (the backend's or the user's
/// `[patterns]`): what it means and what to do, as `ralph run` says it. `None` for other
/// failures; `true` with it when another agent may do better (a usage limit, a failed login).
fn classified_error(
    (agent, kind): (&str, &str),
    report: &AgentReport,
    said: &str,
) -> Option<(UserError, bool)> {
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
            format!("log in to {agent} (`ralph doctor --agent {kind}` shows how)"),
        ),
        FailureClass::Config => (
            "cannot run as configured (config_error)".to_string(),
            format!("`ralph doctor --agent {kind}` checks the agent's setup"),
        ),
        _ => return None,
    };
    let unavailable = matches!(class, FailureClass::UsageLimit | FailureClass::Auth);
    Some((
        UserError::new(format!("the {agent} session {what}: {said}")).with_hint(hint),
        unavailable,
    ))
}

/// Builds and checks one agent for answer sessions (`cfg`: the run's settings with that agent):
/// no tools, one reply; for the local model, room for a PRD and its answer; its sandbox built.
fn open_agent(
    cfg: &RunConfig,
    paths: &RunPaths,
    names: &crate::run::preflight::Names<'_>,
    out: &mut Outputs,
) -> anyhow::Result<AskAgent> {
    let mut cfg = cfg.clone();
    cfg.native.tools = Some(Vec::new());
    if cfg.agent == AgentKind::Local {
        cfg.native.max_tokens = cfg.native.max_tokens.max(LOCAL_ANSWER_TOKENS);
        cfg.native.context_window = cfg.native.context_window.max(LOCAL_ANSWER_CONTEXT);
    }
    let probe_cfg = with_schema(&cfg, &Value::Bool(true));
    let checked = crate::run::preflight::build_checked(&probe_cfg, paths, names, out)?;
    // A sandbox that cannot be built stops here, before any session.
    let sandbox = crate::agent::sandbox::build(
        &crate::run::preflight::sandbox_ask(&cfg),
        checked.backend.info(),
    )?;
    let base_url = cfg.native.base_url.clone();
    crate::agent::sandbox::allow_url(sandbox.as_ref(), base_url.as_deref());
    Ok(AskAgent {
        name: cfg.agent.as_str().to_owned(),
        cfg,
        base_url: std::sync::Mutex::new(base_url),
        sandbox,
    })
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
#[derive(Clone)]
pub struct Loop<'a> {
    /// The first prompt, rendered for the agent of each session ([`PromptStyle`]); later
    /// prompts append the previous reply and its problems to it.
    pub prompt: &'a Render<'a>,
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
/// previous reply and its problems appended to the prompt ([`feedback_prompt`]), which is rendered
/// for the agent of that session (a fallback agent after a limit gets its own). A clean draft is
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
    let mut best: Option<(T, Vec<String>, u32)> = None;
    let mut last = (String::new(), Vec::new());
    for attempt in 1..=max {
        out.notice(format!(
            "asking {} for the {} (attempt {attempt} of {max})",
            asker.agent_label(),
            settings.what
        ));
        let answer = if attempt == 1 {
            asker.ask(settings.prompt, settings.schema, out).await?
        } else {
            let (previous, problems) = (&last.0, &last.1);
            let retry =
                |style: PromptStyle| feedback_prompt(&(settings.prompt)(style), previous, problems);
            asker.ask(&retry, settings.schema, out).await?
        };
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
