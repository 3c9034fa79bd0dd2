//! Settings for `ralph run`, resolved once from four layers, highest first:
//! command-line flags, `RALPH_*` environment variables (both through clap), `ralph.toml`, and the
//! built-in defaults. Everything below `commands::run` takes the resolved [`RunConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use crate::cli::RunArgs;
use crate::protocol::AgentKind;
use crate::protocol::ExitStatus;
use crate::protocol::Price;
use crate::protocol::ProviderKind;
use crate::protocol::{PrdGuard, ToolMode};

mod file_errors;
pub mod profile;
mod resolve;
#[cfg(test)]
mod settings_tests;
pub use crate::cli::settings::{AgentTable, FileConfig, PushSetting};
pub use profile::AgentProfile;

/// The configuration file looked for in the current directory.
pub const CONFIG_FILE_NAME: &str = "ralph.toml";

/// Settings of ralph's own tool loop (`--agent native` and `--agent local`).
#[derive(Debug, Clone, PartialEq)]
pub struct NativeOptions {
    /// Wire format.
    pub provider: ProviderKind,
    /// Base URL; for `local`, `None` means "the server ralph starts".
    pub base_url: Option<String>,
    /// Environment variable with the API key (`None`: no key).
    pub api_key_env: Option<String>,
    /// local: the built-in model to serve when `model_file` is `None`.
    pub local_model: crate::local::BuiltinModel,
    /// local: the GGUF to serve (`None`: the built-in model `local_model`).
    pub model_file: Option<PathBuf>,
    /// How tool calls are requested.
    pub tool_mode: ToolMode,
    /// Tool-using steps per iteration.
    pub max_steps: u32,
    /// Output tokens per request.
    pub max_tokens: u32,
    /// The model's context window, in tokens.
    pub context_window: u32,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Price table (USD per million tokens) by model name.
    pub prices: BTreeMap<String, Price>,
    /// Tools offered to the model (`None`: all).
    pub tools: Option<Vec<String>>,
    /// The JSON Schema of an answer session's reply (`ralph plan` and `ralph convert` set it for
    /// each session; never read from ralph.toml): no tools, one schema-shaped reply.
    pub answer_schema: Option<serde_json::Value>,
}

/// How ralph talks to the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Live status line on stderr, one line per iteration, a final summary.
    Human,
    /// Only warnings, errors and the final summary.
    Quiet,
    /// JSONL events on stdout; diagnostics on stderr.
    Json,
}

/// Fully resolved settings of one `ralph run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Absolute path of prd.json.
    pub prd_path: PathBuf,
    /// The backend.
    pub agent: AgentKind,
    /// Command line for the exec backend.
    pub agent_cmd: Option<String>,
    /// Path to the agent CLI, when overridden.
    pub agent_program: Option<PathBuf>,
    /// Model passed to the agent.
    pub model: Option<String>,
    /// Iteration budget of this run (≥ 1).
    pub max_iter: u32,
    /// Per-iteration wall-clock limit.
    pub timeout: Duration,
    /// Kill the agent after this long without output.
    pub idle_timeout: Duration,
    /// Wait between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Start even when the tree is dirty.
    pub allow_dirty: bool,
    /// Terminal mode.
    pub output: OutputMode,
    /// Stream the agent's text to the terminal.
    pub verbose: bool,
    /// Absolute path of a prompt template replacing the built-in one.
    pub template: Option<PathBuf>,
    /// Bytes of progress.txt shown in the prompt.
    pub progress_tail_bytes: usize,
    /// The ralph.toml that was read, if any.
    pub config_file: Option<PathBuf>,
    /// Settings of the native and local backends.
    pub native: NativeOptions,
    /// Verify command for stories without their own `verify`.
    pub verify: Option<String>,
    /// Time limit of one verify command.
    pub verify_timeout: Duration,
    /// When the current story's verify command passes, ralph marks it passing itself.
    pub verify_marks_passing: bool,
    /// First wait after a transient failure (doubled each time, capped at 10 minutes).
    pub transient_backoff: Duration,
    /// Transient failures in a row before the run stops.
    pub max_transient_retries: u32,
    /// Stop (exit 75) at a usage limit instead of waiting.
    pub no_wait: bool,
    /// Wait for a usage limit without a reset time.
    pub usage_limit_fallback: Duration,
    /// Extra wait after a usage limit's reset time.
    pub usage_limit_margin: Duration,
    /// Usage-limit waits in one run before it stops.
    pub max_usage_limit_waits: u32,
    /// claude: keep `ANTHROPIC_API_KEY` in its environment.
    pub keep_api_key: bool,
    /// Wall-clock limit of the whole run (`None`: no limit).
    pub max_duration: Option<Duration>,
    /// Failure patterns from ralph.toml, added to the built-in ones.
    pub patterns: crate::agent::classify::ExtraPatterns,
    /// Notifications.
    pub notify: crate::notify::NotifyConfig,
    /// Cost limit in USD (`None`: no limit), counted over `budget_scope`.
    pub max_cost: Option<f64>,
    /// What `max_cost` counts: the feature's runs (default) or this run.
    pub budget_scope: crate::protocol::BudgetScope,
    /// `--resume-only`: run only when the last run's stop passes by itself.
    pub resume_only: bool,
    /// Iterations a story may take without passing before it is blocked (≥ 1).
    pub max_attempts: u32,
    /// Failed iterations in a row before the run stops (≥ 1).
    pub max_failures: u32,
    /// Iterations in a row without any change before the run stops (≥ 1).
    pub max_no_progress: u32,
    /// What happens to prd.json changes beyond the current story's passes/notes.
    pub prd_guard: PrdGuard,
    /// Clear blocked stories (and their attempts) before the run.
    pub unblock: bool,
    /// Stop the run as soon as a story is blocked.
    pub stop_on_block: bool,
    /// `--parallel`: stories worked on at once, each in its own worktree (≥ 1; 1: serial, in
    /// the checkout).
    pub parallel: u32,
    /// `--resolve-conflicts`: a conflicting landing under `--parallel` gets a resolution
    /// iteration (docs/decisions.md, "Resolving a landing's conflict"); default off.
    pub resolve_conflicts: bool,
    /// `worktree_copy`: ignored files copied from the checkout into each worktree, relative to
    /// the repository root.
    pub worktree_copy: Vec<String>,
    /// `worktree_setup`: the shell command run in each new worktree before its agent.
    pub worktree_setup: Option<String>,
    /// `--sandbox`: how the agent and the verify commands are confined.
    pub sandbox: crate::protocol::SandboxMode,
    /// `--allow-host` and `allow_hosts`: hosts a strict sandbox lets the agent reach, beyond its
    /// backend's API hosts, as given (`host` or `host:port`).
    pub allow_hosts: Vec<String>,
    /// `--sandbox-writable` and `sandbox_writable`: more paths a sandboxed agent and its checks
    /// may write, absolute (relative ones are taken from the directory ralph runs in).
    pub sandbox_writable: Vec<PathBuf>,
    /// `--push`: the remote to push to after every checkpoint (`None`: never push).
    pub push: Option<String>,
    /// The deadline of a shutdown on SIGTERM, SIGINT or SIGHUP.
    pub shutdown_timeout: Duration,
    /// `--push`: how long the branch's lease lasts without a renewal.
    pub lease_ttl: Duration,
    /// `--push`: attempts at a push (or a lease read) when the remote cannot be reached.
    pub push_attempts: u32,
    /// `--push`: the first wait between those attempts (it doubles).
    pub push_backoff: Duration,
    /// The agents to switch to, in order, when the ones before them hit a usage limit
    /// (`--fallback-agent`, ralph.toml's `fallback_agents` and `[[agents]]`); empty: none.
    pub fallbacks: Vec<AgentProfile>,
}

impl RunConfig {
    /// How long the agent's group may take to exit after SIGTERM: `kill_grace`, but at most
    /// two fifths of `--shutdown-timeout`, so that the checkpoint, the push and the lease
    /// release still fit in it.
    pub fn agent_grace(&self) -> Duration {
        self.kill_grace.min(self.shutdown_timeout.mul_f64(0.4))
    }
}

/// Where the value of a setting came from. It decides the exit code of an error about it (see
/// [`ConfigError::exit_status`]) and how the error names the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A flag, or its `RALPH_*` environment variable (clap merges the two).
    CommandLine,
    /// A key in this ralph.toml.
    File(PathBuf),
    /// A key in the `[[agents]]` table named `name` of the ralph.toml at `path` (a fallback
    /// agent's own settings).
    Table {
        /// The ralph.toml.
        path: PathBuf,
        /// The table's `name`.
        name: String,
    },
}

impl Origin {
    /// `flag` when the value came from the command line, else `` `key` in <file> ``.
    fn name(&self, flag: &str, key: &str) -> String {
        match self {
            Origin::CommandLine => flag.to_owned(),
            Origin::File(path) => format!("`{key}` in {}", path.display()),
            Origin::Table { path, name } => format!(
                "`{key}` in the [[agents]] table `{name}` of {}",
                path.display()
            ),
        }
    }

    /// The setting with its value: `--agent exec`, or `` `agent = "exec"` in <file> `` (or in
    /// its `[[agents]]` table).
    fn value(&self, flag: &str, key: &str, value: &str) -> String {
        match self {
            Origin::CommandLine => format!("{flag} {value}"),
            Origin::File(path) => format!("`{key} = \"{value}\"` in {}", path.display()),
            Origin::Table { path, name } => format!(
                "`{key} = \"{value}\"` in the [[agents]] table `{name}` of {}",
                path.display()
            ),
        }
    }

    /// How to give the setting another value: `pass <flag> <example>` or `set <key> to <example>`
    /// (in that `[[agents]]` table, for a table's key).
    fn change(&self, flag: &str, key: &str, example: &str) -> String {
        match self {
            Origin::CommandLine => format!("pass {flag} {example}"),
            Origin::File(_) => format!("set {key} to {example}"),
            Origin::Table { .. } => format!("set {key} to {example} in that [[agents]] table"),
        }
    }

    /// How to set a missing setting that goes with this one: the flag or the file's key (both
    /// work for the primary agent), or the key of this `[[agents]]` table (only it works for a
    /// fallback agent: the flags set the primary's).
    fn add(&self, flag: &str, key: &str, example: &str) -> String {
        match self {
            Origin::Table { name, .. } => {
                format!("set {key} = {example} in the [[agents]] table `{name}`")
            }
            _ => format!("pass {flag} {example}, or set {key} in ralph.toml"),
        }
    }

    /// How to fall back to the default: `leave it out` (a flag) or `remove it` (a key).
    fn drop(&self) -> &'static str {
        match self {
            Origin::CommandLine => "leave it out",
            Origin::File(_) | Origin::Table { .. } => "remove it",
        }
    }

    /// This origin as the `[[agents]]` table `name` of `path` when it was `path` itself; a flag
    /// stays a flag.
    fn in_table(self, path: &Path, name: &str) -> Origin {
        match self {
            Origin::File(p) if p == path => Origin::Table {
                path: p,
                name: name.to_owned(),
            },
            other => other,
        }
    }
}

/// Errors while resolving settings. Each names the source (flag or file and key) and the fix.
///
/// A refused value given on the command line is a usage error (exit 2); the same value written
/// in ralph.toml, and an unreadable or invalid ralph.toml, are configuration errors (exit 1). See
/// [`ConfigError::exit_status`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--max-iter 0` (or `max_iter = 0`).
    #[error(
        "{} must be at least 1 (got 0)\nhint: {} with N ≥ 1, or {} for the default of \
         {}",
        origin.name("--max-iter", "max_iter"),
        origin.change("--max-iter", "max_iter", "N"),
        origin.drop(),
        crate::cli::settings::DefaultsFor::base().max_iter::<u32>()
    )]
    ZeroIterations {
        /// Where the 0 came from.
        origin: Origin,
    },
    /// ralph.toml could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// ralph.toml is not valid TOML or has a wrong key or type.
    #[error("{path} is not a valid ralph configuration: {message}\nhint: every key and its default is in the ralph.toml that `ralph init` writes, and in README.md, section Configuration")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message, which names the key and line.
        message: String,
    },
    /// A duration in ralph.toml could not be parsed.
    #[error("{path}: `{key} = \"{value}\"` is not a duration: {message}\nhint: write durations like \"30m\", \"90s\" or \"1h 30m\"")]
    Duration {
        /// The file.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// The raw value.
        value: String,
        /// The parser's message.
        message: String,
    },
    /// A zero `--timeout` / `--idle-timeout` / `--max-duration`.
    #[error(
        "{} must be longer than 0 seconds\nhint: use a duration like \"30m\" or \"90s\", or {} \
         for the default",
        origin.name(name, key),
        origin.drop()
    )]
    ZeroDuration {
        /// The flag.
        name: &'static str,
        /// The ralph.toml key.
        key: &'static str,
        /// Where the 0 came from.
        origin: Origin,
    },
    /// A count limit of 0 (`--max-attempts`, `--max-failures`, `--max-no-progress`).
    #[error(
        "{} must be at least 1 (got 0)\nhint: {} for the default of {default}",
        origin.name(name, key),
        origin.drop()
    )]
    ZeroLimit {
        /// The flag.
        name: &'static str,
        /// The ralph.toml key.
        key: &'static str,
        /// Its default.
        default: u32,
        /// Where the 0 came from.
        origin: Origin,
    },
    /// A negative or non-finite `--max-cost`.
    #[error(
        "{} must be a positive amount in USD (got {value})\nhint: e.g. {} for five dollars",
        origin.name("--max-cost", "max_cost"),
        match origin { Origin::CommandLine => "--max-cost 5", _ => "max_cost = 5" }
    )]
    BadCost {
        /// The value given.
        value: f64,
        /// Where it came from.
        origin: Origin,
    },
    /// `--max-steps 0`.
    #[error(
        "{} must be at least 1 (got 0)\nhint: {} for the default",
        origin.name("--max-steps", "max_steps"),
        origin.drop()
    )]
    ZeroSteps {
        /// Where the 0 came from.
        origin: Origin,
    },
    /// JSON tool mode with the Anthropic API.
    #[error(
        "{} json needs {} openai (the Anthropic Messages API has no response_format)\nhint: use \
         --tool-mode native with --provider anthropic",
        tool_mode.name("--tool-mode", "tool_mode"),
        provider.name("--provider", "provider")
    )]
    JsonModeNeedsOpenai {
        /// Where `json` came from.
        tool_mode: Origin,
        /// Where `anthropic` came from.
        provider: Origin,
    },
    /// `--agent native` without a model.
    #[error(
        "{} needs the model name\nhint: {} (e.g. gpt-4.1-mini, claude-sonnet-4-5)",
        agent.value("--agent", "agent", "native"),
        agent.add("--model", "model", "NAME")
    )]
    MissingModel {
        /// Where `native` came from.
        agent: Origin,
    },
    /// `--push` (or `push` in ralph.toml) names no usable remote.
    #[error(
        "{} `{value}` is not a git remote's name\nhint: {} (a remote from `git remote -v`), or {} to push to origin",
        origin.name("--push", "push"),
        origin.change("--push", "push", "\"origin\""),
        match origin { Origin::CommandLine => "pass --push alone", _ => "set push = true" }
    )]
    BadRemote {
        /// The value given.
        value: String,
        /// Where it came from.
        origin: Origin,
    },
    /// A fallback agent's name that is neither an `[[agents]]` table nor a backend, or one
    /// given twice.
    #[error("{message}\nhint: {hint}")]
    BadFallback {
        /// What is wrong, naming the agent.
        message: String,
        /// How to fix it.
        hint: String,
        /// Where the name came from.
        origin: Origin,
    },
    /// A fallback agent's own settings are wrong.
    #[error("fallback agent `{name}`: {source}")]
    Fallback {
        /// The agent's name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<ConfigError>,
    },
    /// `--agent exec` without a command line.
    #[error(
        "{} needs the command to run\nhint: {}",
        agent.value("--agent", "agent", "exec"),
        agent.add("--agent-cmd", "agent_cmd", "\"my-agent --flag\"")
    )]
    MissingAgentCmd {
        /// Where `exec` came from.
        agent: Origin,
    },
}

impl ConfigError {
    /// This error of a fallback agent's `[[agents]]` table `name` (resolved from the ralph.toml
    /// at `path` as if it were the primary's settings): the settings it names are that table's
    /// keys, so the fix points there and not at the primary's flags or top-level keys.
    pub fn in_table(self, path: &Path, name: &str) -> ConfigError {
        let at = |o: Origin| o.in_table(path, name);
        match self {
            ConfigError::ZeroIterations { origin } => {
                ConfigError::ZeroIterations { origin: at(origin) }
            }
            ConfigError::ZeroDuration {
                name: n,
                key,
                origin,
            } => ConfigError::ZeroDuration {
                name: n,
                key,
                origin: at(origin),
            },
            ConfigError::ZeroLimit {
                name: n,
                key,
                default,
                origin,
            } => ConfigError::ZeroLimit {
                name: n,
                key,
                default,
                origin: at(origin),
            },
            ConfigError::BadCost { value, origin } => ConfigError::BadCost {
                value,
                origin: at(origin),
            },
            ConfigError::ZeroSteps { origin } => ConfigError::ZeroSteps { origin: at(origin) },
            ConfigError::JsonModeNeedsOpenai {
                tool_mode,
                provider,
            } => ConfigError::JsonModeNeedsOpenai {
                tool_mode: at(tool_mode),
                provider: at(provider),
            },
            ConfigError::MissingModel { agent } => ConfigError::MissingModel { agent: at(agent) },
            ConfigError::MissingAgentCmd { agent } => {
                ConfigError::MissingAgentCmd { agent: at(agent) }
            }
            ConfigError::Duration {
                path: p,
                key,
                value,
                message,
            } if p == path => ConfigError::Duration {
                path: p,
                key,
                value,
                message: format!("{message} (in the [[agents]] table `{name}`)"),
            },
            other => other,
        }
    }

    /// The exit code for this error. [`ExitStatus::Usage`] (2) when the command line alone is
    /// wrong on its face: a flag (or its `RALPH_*` variable) with a value ralph refuses without
    /// looking at anything else (a zero count or duration, a negative cost), flags that cannot
    /// work together, or a flag that needs another one. [`ExitStatus::Failure`] (1) when a value
    /// in ralph.toml is involved, and for an unreadable or invalid ralph.toml.
    pub fn exit_status(&self) -> ExitStatus {
        let from_command_line = match self {
            ConfigError::ZeroIterations { origin }
            | ConfigError::ZeroDuration { origin, .. }
            | ConfigError::ZeroLimit { origin, .. }
            | ConfigError::BadCost { origin, .. }
            | ConfigError::ZeroSteps { origin }
            | ConfigError::BadRemote { origin, .. }
            | ConfigError::MissingModel { agent: origin }
            | ConfigError::BadFallback { origin, .. }
            | ConfigError::MissingAgentCmd { agent: origin } => *origin == Origin::CommandLine,
            ConfigError::Fallback { .. } => false,
            ConfigError::JsonModeNeedsOpenai {
                tool_mode,
                provider,
            } => *tool_mode == Origin::CommandLine && *provider == Origin::CommandLine,
            ConfigError::Read { .. } | ConfigError::Parse { .. } | ConfigError::Duration { .. } => {
                false
            }
        };
        if from_command_line {
            ExitStatus::Usage
        } else {
            ExitStatus::Failure
        }
    }
}

impl RunConfig {
    /// Only the notification settings of `args` and the ralph.toml `resolve` would read (for
    /// `ralph notify --test`, which must work whatever the rest of the file says about agents).
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable or invalid file or a bad `notify.timeout`.
    pub fn resolve_notify(
        args: &RunArgs,
        cwd: &Path,
    ) -> Result<crate::notify::NotifyConfig, ConfigError> {
        let config_path = match &args.config {
            Some(p) => Some(absolute(cwd, p)),
            None => Some(cwd.join(CONFIG_FILE_NAME)).filter(|p| p.is_file()),
        };
        let file = match &config_path {
            Some(p) => load_file(p)?,
            None => FileConfig::default(),
        };
        let file_path = config_path.unwrap_or_default();
        let duration = durations_of(&file_path);
        notify_config(args, &file.notify, &duration)
    }

    /// The settings `ralph run` would use if started in `cwd` with no flags: the `RALPH_*`
    /// environment, `./ralph.toml` and the defaults. Readers of history (`ralph status`) use
    /// it to apply the run's own limits (`max_attempts`).
    ///
    /// # Errors
    /// [`ConfigError`] as [`RunConfig::resolve`] gives it (an invalid ralph.toml, a bad value
    /// in the environment); a `RALPH_*` value clap refuses reads as the run would refuse it.
    pub fn resolve_here(cwd: &Path) -> Result<RunConfig, ConfigError> {
        RunConfig::resolve(&*env_args()?, cwd)
    }

    /// Resolves flags and environment (already merged by clap into `args`), then `ralph.toml`
    /// (`args.config`, else `<cwd>/ralph.toml` when it exists), then defaults. Relative paths in
    /// the file are taken relative to the file's directory; flag paths relative to `cwd`.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable or invalid file, a bad duration, `max_iter` 0, or exec
    /// without a command.
    pub fn resolve(args: &RunArgs, cwd: &Path) -> Result<RunConfig, ConfigError> {
        let config_path = match &args.config {
            Some(p) => Some(absolute(cwd, p)),
            None => Some(cwd.join(CONFIG_FILE_NAME)).filter(|p| p.is_file()),
        };
        let file = match &config_path {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        let mut cfg = RunConfig::resolve_with(args, &file, config_path.clone(), cwd)?;
        cfg.fallbacks = profile::fallbacks(args, &file, config_path.as_deref(), cwd, &cfg)?;
        Ok(cfg)
    }

    /// [`RunConfig::resolve`] with ralph.toml already read (`file`, from `config_path`), without
    /// the fallback agents: the named steps of [`resolve::Layers`], in the order their errors
    /// are reported.
    fn resolve_with(
        args: &RunArgs,
        file: &FileConfig,
        config_path: Option<PathBuf>,
        cwd: &Path,
    ) -> Result<RunConfig, ConfigError> {
        let layers = resolve::Layers::new(args, file, config_path, cwd);
        let max_iter = layers.max_iter()?;
        let agent = layers.agent()?;
        let waits = layers.check_waits(&agent.defaults)?;
        layers.check_native(&agent.native)?;
        let usage = layers.usage_limit_waits(&agent.defaults)?;
        let mut limits = layers.limits(&agent.defaults)?;
        let remote = layers.remote(&agent.defaults, &mut limits)?;
        layers.assemble(resolve::Parts {
            max_iter,
            agent,
            waits,
            usage,
            limits,
            remote,
        })
    }
}

/// The parser of ralph.toml's durations (`"30m"`): a wrong one names the key and `file`.
fn durations_of(
    file: &Path,
) -> impl Fn(&'static str, &Option<String>) -> Result<Option<Duration>, ConfigError> + '_ {
    move |key, raw| {
        raw.as_ref()
            .map(|value| {
                humantime::parse_duration(value).map_err(|e| ConfigError::Duration {
                    path: file.to_path_buf(),
                    key,
                    value: value.clone(),
                    message: e.to_string(),
                })
            })
            .transpose()
    }
}

/// Parses a humantime value of ralph.toml's key, naming the key and file when it is wrong.
type DurationOf<'a> =
    &'a dyn Fn(&'static str, &Option<String>) -> Result<Option<Duration>, ConfigError>;

/// The notification settings: the `--notify-*` flags add to ralph.toml's `[notify]` table.
fn notify_config(
    args: &RunArgs,
    file: &crate::notify::NotifyFile,
    duration: DurationOf<'_>,
) -> Result<crate::notify::NotifyConfig, ConfigError> {
    use crate::notify::{Kind, NotifyConfig, DEFAULT_ATTEMPTS, DEFAULT_TIMEOUT};
    let mut webhooks = file.webhook.clone();
    for var in &file.webhook_env {
        match std::env::var(var) {
            Ok(url) if !url.trim().is_empty() => webhooks.push(url),
            // A missing variable is not an error: the notification just has one target less
            // (e.g. a local run without the CI secret).
            _ => tracing::warn!("[notify] webhook_env {var} is not set; that webhook is skipped"),
        }
    }
    webhooks.extend(args.notify.notify_webhook.iter().cloned());
    let secret = file.secret.clone().or_else(|| {
        file.secret_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|v| !v.is_empty())
    });
    Ok(NotifyConfig {
        webhooks,
        format: args
            .notify
            .notify_format
            .or(file.format)
            .unwrap_or_default(),
        secret,
        command: args.notify.notify_command.clone().or(file.command.clone()),
        desktop: args.notify.notify_desktop || file.desktop.unwrap_or(false),
        kinds: file.events.clone().unwrap_or_else(|| Kind::ALL.to_vec()),
        timeout: duration("notify.timeout", &file.timeout)?.unwrap_or(DEFAULT_TIMEOUT),
        attempts: file.attempts.unwrap_or(DEFAULT_ATTEMPTS).max(1),
    })
}

/// The `ralph run` arguments the `RALPH_*` environment alone gives (no flags), as clap reads
/// them; `ralph doctor` adds its own few flags to them.
///
/// # Errors
/// [`ConfigError::Parse`] naming the environment when clap refuses a `RALPH_*` value.
pub fn env_args() -> Result<Box<RunArgs>, ConfigError> {
    use clap::Parser;
    match crate::cli::Cli::try_parse_from(["ralph", "run"]) {
        Ok(crate::cli::Cli {
            command: crate::cli::Command::Run(args),
        }) => Ok(args),
        Ok(_) => Ok(Box::default()),
        Err(e) => Err(ConfigError::Parse {
            path: PathBuf::from("the environment (RALPH_*)"),
            message: e.to_string(),
        }),
    }
}

/// Reads and parses the ralph.toml at `path` as [`RunConfig::resolve`] does (its errors name the
/// table and the closest key, and refuse negative prices).
///
/// # Errors
/// [`ConfigError::Read`] or [`ConfigError::Parse`].
pub fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: FileConfig = toml::from_str(&text).map_err(|e| {
        let table = e
            .span()
            .and_then(|span| file_errors::table_at(&text, span.start));
        ConfigError::Parse {
            path: path.to_path_buf(),
            message: file_errors::explain(&e.to_string(), table.as_ref(), &top_level_keys()),
        }
    })?;
    let mut problem = file_errors::price_problem(&file.prices, "[prices]");
    for t in &file.agents {
        problem = problem.or_else(|| {
            file_errors::price_problem(
                &t.prices,
                &format!("the prices of the [[agents]] table `{}`", t.name),
            )
        });
    }
    match problem {
        Some(message) => Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        }),
        None => Ok(file),
    }
}

/// The keys valid at the top level of ralph.toml, read from the parser's own list (so an
/// `[[agents]]` table's error can tell a run-wide key put in it from a typo). Only on an error.
fn top_level_keys() -> Vec<String> {
    let message = toml::from_str::<FileConfig>("zz_not_a_ralph_key = 1")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    message
        .split("expected one of ")
        .nth(1)
        .and_then(|l| l.lines().next())
        .unwrap_or_default()
        .split(", ")
        .map(|k| k.trim_matches('`').to_owned())
        .collect()
}

fn absolute(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// A bare program name (`claude`) stays a name to look up on PATH; anything with a slash is a path.
fn program_path(base: &Path, p: &Path) -> PathBuf {
    if p.components().count() == 1 && !p.is_absolute() {
        p.to_path_buf()
    } else {
        absolute(base, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RunArgs {
        RunArgs::default()
    }

    #[test]
    fn defaults_apply_without_flags_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RunConfig::resolve(&args(), dir.path()).unwrap();
        assert_eq!(cfg.max_iter, 10);
        assert_eq!(cfg.agent, AgentKind::Claude);
        assert_eq!(cfg.timeout, Duration::from_secs(1800));
        assert_eq!(cfg.idle_timeout, Duration::from_secs(600));
        assert_eq!(cfg.prd_path, dir.path().join("prd.json"));
        assert!(cfg.config_file.is_none());
    }

    #[test]
    fn the_local_model_gets_more_attempts_unless_told_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RunConfig::resolve(&args(), dir.path()).unwrap();
        assert_eq!((cfg.max_attempts, cfg.max_no_progress), (3, 3));
        let mut a = args();
        a.agent_args.agent = Some(AgentKind::Local);
        let cfg = RunConfig::resolve(&a, dir.path()).unwrap();
        assert_eq!((cfg.max_attempts, cfg.max_no_progress), (5, 5));
        a.max_attempts = Some(2);
        let cfg = RunConfig::resolve(&a, dir.path()).unwrap();
        assert_eq!((cfg.max_attempts, cfg.max_no_progress), (2, 5));
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("ralph.toml"),
            "max_iter = 4\ntimeout = \"2m\"\nmodel = \"haiku\"\nprd = \"docs/prd.json\"\n",
        )
        .unwrap();
        let mut a = args();
        a.max_iter = Some(7);
        let cfg = RunConfig::resolve(&a, dir.path()).unwrap();
        assert_eq!(cfg.max_iter, 7);
        assert_eq!(cfg.timeout, Duration::from_secs(120));
        assert_eq!(cfg.model.as_deref(), Some("haiku"));
        assert_eq!(cfg.prd_path, dir.path().join("docs/prd.json"));
    }

    #[test]
    fn push_takes_a_remote_or_a_switch_from_flags_env_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let resolve = |push: Option<&str>| {
            let mut a = args();
            a.push = push.map(str::to_owned);
            RunConfig::resolve(&a, dir.path()).unwrap().push
        };
        assert_eq!(resolve(None), None);
        // `--push` alone is `origin` (clap's default_missing_value); RALPH_PUSH=true too.
        for on in ["origin", "true", "1", "yes", "on"] {
            assert_eq!(resolve(Some(on)).as_deref(), Some("origin"), "{on}");
        }
        for off in ["false", "0", "no", "off"] {
            assert_eq!(resolve(Some(off)), None, "{off}");
        }
        assert_eq!(resolve(Some(" upstream ")).as_deref(), Some("upstream"));
        let toml = dir.path().join("ralph.toml");
        std::fs::write(&toml, "push = true\n").unwrap();
        assert_eq!(resolve(None).as_deref(), Some("origin"));
        std::fs::write(&toml, "push = \"backup\"\n").unwrap();
        assert_eq!(resolve(None).as_deref(), Some("backup"));
        // The flag (or RALPH_PUSH) wins over the file, also to turn it off.
        assert_eq!(resolve(Some("false")), None);
        std::fs::write(&toml, "push = false\n").unwrap();
        assert_eq!(resolve(None), None);
        let mut a = args();
        a.push = Some("--force".to_owned());
        assert!(RunConfig::resolve(&a, dir.path()).is_err());
    }

    #[test]
    fn zero_iterations_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args();
        a.max_iter = Some(0);
        let err = RunConfig::resolve(&a, dir.path()).unwrap_err();
        assert!(err.to_string().contains("--max-iter must be at least 1"));
    }

    #[test]
    fn unknown_key_and_bad_duration_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ralph.toml");
        std::fs::write(&path, "max_iters = 3\n").unwrap();
        let err = RunConfig::resolve(&args(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ralph.toml") && err.contains("max_iters"),
            "{err}"
        );
        std::fs::write(&path, "timeout = \"soon\"\n").unwrap();
        let err = RunConfig::resolve(&args(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("timeout = \"soon\""), "{err}");
    }

    #[test]
    fn every_key_in_the_init_template_is_accepted() {
        // `ralph init` writes templates/ralph.toml with every key commented out; uncommented, it
        // must be a valid configuration (no unknown or mistyped key).
        let template = include_str!("../templates/ralph.toml");
        let uncommented: String = template
            .lines()
            .map(|l| {
                let t = l.strip_prefix("# ").unwrap_or(l);
                let key_like = t.split(['=', ' ']).next().is_some_and(|k| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                });
                if (key_like && t.contains(" = "))
                    || t.starts_with("[prices")
                    || t == "[patterns]"
                    || t == "[notify]"
                {
                    format!("{t}\n")
                } else {
                    "\n".to_string()
                }
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ralph.toml"), &uncommented).unwrap();
        let mut a = args();
        a.agent_args.agent = Some(AgentKind::Claude);
        let cfg = RunConfig::resolve(&a, dir.path());
        assert!(cfg.is_ok(), "{:?}\n{uncommented}", cfg.err());
        // Top-level keys must not have fallen into a table: they took effect.
        let cfg = cfg.unwrap();
        assert_eq!(cfg.max_duration, Some(Duration::from_secs(8 * 3600)));
        assert_eq!(cfg.max_usage_limit_waits, 3);
        assert!(cfg.native.prices.contains_key("gpt-4.1-mini"));
        assert_eq!(cfg.patterns.usage_limit, ["monthly token budget exhausted"]);
        assert_eq!(cfg.notify.timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_refused_value_is_a_usage_error_only_when_the_command_line_gave_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args();
        a.max_failures = Some(0);
        let err = RunConfig::resolve(&a, dir.path()).unwrap_err();
        assert_eq!(err.exit_status(), ExitStatus::Usage, "{err}");

        std::fs::write(
            dir.path().join("ralph.toml"),
            "max_failures = 0\ntool_mode = \"json\"\n",
        )
        .unwrap();
        let err = RunConfig::resolve(&args(), dir.path()).unwrap_err();
        assert_eq!(err.exit_status(), ExitStatus::Failure, "{err}");
        assert!(
            err.to_string().starts_with("`max_failures` in ")
                && err.to_string().contains("ralph.toml must be at least 1"),
            "{err}"
        );

        // Half of a conflict in the file: the fix may be there, so not a usage error.
        std::fs::write(dir.path().join("ralph.toml"), "tool_mode = \"json\"\n").unwrap();
        let mut a = args();
        a.agent_args.provider = Some(ProviderKind::Anthropic);
        let err = RunConfig::resolve(&a, dir.path()).unwrap_err();
        assert_eq!(err.exit_status(), ExitStatus::Failure, "{err}");
        assert!(
            err.to_string().starts_with("`tool_mode` in ")
                && err.to_string().contains("json needs --provider openai"),
            "{err}"
        );
        a.tool_mode = Some(ToolMode::Json);
        let err = RunConfig::resolve(&a, dir.path()).unwrap_err();
        assert_eq!(err.exit_status(), ExitStatus::Usage, "{err}");

        std::fs::write(dir.path().join("ralph.toml"), "max_iters = 1\n").unwrap();
        let err = RunConfig::resolve(&args(), dir.path()).unwrap_err();
        assert_eq!(err.exit_status(), ExitStatus::Failure, "{err}");
    }

    #[test]
    fn exec_needs_a_command() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args();
        a.agent_args.agent = Some(AgentKind::Exec);
        assert!(matches!(
            RunConfig::resolve(&a, dir.path()),
            Err(ConfigError::MissingAgentCmd {
                agent: Origin::CommandLine
            })
        ));
    }
}
