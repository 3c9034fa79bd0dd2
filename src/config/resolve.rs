//! The named steps of [`RunConfig::resolve`]: each reads one group of settings from the two
//! layers clap does not merge (the flags with their `RALPH_*` variables, and ralph.toml), applies
//! the defaults and checks the values, naming where a refused value came from ([`Origin`]). The
//! order of the steps is the order in which errors are reported. Every default is read from the
//! settings table ([`crate::cli::settings`]) through [`DefaultsFor`], which the agent step
//! builds once the agent, its built-in model and its API are known.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    absolute, notify_config, program_path, ConfigError, FileConfig, NativeOptions, Origin,
    OutputMode, PushSetting, RunConfig,
};
use crate::cli::settings::DefaultsFor;
use crate::cli::RunArgs;
use crate::protocol::{AgentKind, ProviderKind, ToolMode};

/// The two layers of one resolution: the flags (clap already merged the `RALPH_*` variables into
/// them) and ralph.toml (`file`, read from `file_path`; relative paths in it are taken from
/// `file_dir`, the flags' from `cwd`).
pub(super) struct Layers<'a> {
    pub args: &'a RunArgs,
    pub file: &'a FileConfig,
    pub config_path: Option<PathBuf>,
    file_path: PathBuf,
    file_dir: PathBuf,
    cwd: &'a Path,
}

/// The agent's settings, as the agent step resolves them.
pub(super) struct AgentPart {
    /// The defaults for this agent, for the later steps.
    pub defaults: DefaultsFor,
    pub agent: AgentKind,
    pub agent_cmd: Option<String>,
    pub agent_program: Option<PathBuf>,
    pub model: Option<String>,
    pub template: Option<PathBuf>,
    pub timeout: Duration,
    pub idle_timeout: Duration,
    pub native: NativeOptions,
}

/// The counted limits and budgets of a run.
pub(super) struct Limits {
    pub max_attempts: u32,
    pub parallel: u32,
    pub max_failures: u32,
    pub max_no_progress: u32,
    pub max_duration: Option<Duration>,
    pub max_cost: Option<f64>,
}

/// `--push` and the shutdown deadline.
pub(super) struct Remote {
    pub push: Option<String>,
    pub shutdown_timeout: Duration,
    pub lease_ttl: Duration,
    pub push_attempts: u32,
    pub push_backoff: Duration,
}

impl<'a> Layers<'a> {
    pub fn new(
        args: &'a RunArgs,
        file: &'a FileConfig,
        config_path: Option<PathBuf>,
        cwd: &'a Path,
    ) -> Layers<'a> {
        let file_dir = match &config_path {
            Some(path) => path.parent().unwrap_or(cwd).to_path_buf(),
            None => cwd.to_path_buf(),
        };
        Layers {
            args,
            file,
            file_path: config_path.clone().unwrap_or_default(),
            config_path,
            file_dir,
            cwd,
        }
    }

    /// Where a value came from: the command line when the flag (or its variable) was given.
    fn origin(&self, from_flag: bool) -> Origin {
        if from_flag {
            Origin::CommandLine
        } else {
            Origin::File(self.file_path.clone())
        }
    }

    /// ralph.toml's duration `raw` of `key` (`"30m"`), parsed.
    fn duration(
        &self,
        key: &'static str,
        raw: &Option<String>,
    ) -> Result<Option<Duration>, ConfigError> {
        super::durations_of(&self.file_path)(key, raw)
    }

    /// A path from the flag (relative to the directory ralph runs in) or the file (relative to
    /// the file's directory).
    fn path(&self, flag: &Option<PathBuf>, key: &Option<PathBuf>) -> Option<PathBuf> {
        match (flag, key) {
            (Some(p), _) => Some(absolute(self.cwd, p)),
            (None, Some(p)) => Some(absolute(&self.file_dir, p)),
            (None, None) => None,
        }
    }

    /// A count limit: the flag, else the key, else `default`; 0 is refused.
    fn count(
        &self,
        name: &'static str,
        key: &'static str,
        (flag, file): (Option<u32>, Option<u32>),
        default: u32,
    ) -> Result<u32, ConfigError> {
        match flag.or(file).unwrap_or(default) {
            0 => Err(ConfigError::ZeroLimit {
                name,
                key,
                default,
                origin: self.origin(flag.is_some()),
            }),
            n => Ok(n),
        }
    }

    /// A duration limit from the flag or the key; 0 is refused.
    fn nonzero(
        &self,
        (name, key): (&'static str, &'static str),
        flag: Option<Duration>,
        value: Duration,
    ) -> Result<Duration, ConfigError> {
        if value.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name,
                key,
                origin: self.origin(flag.is_some()),
            });
        }
        Ok(value)
    }

    /// `--max-iter`: at least 1.
    pub fn max_iter(&self) -> Result<u32, ConfigError> {
        let max_iter = self
            .args
            .max_iter
            .or(self.file.max_iter)
            .unwrap_or_else(|| DefaultsFor::base().max_iter());
        if max_iter == 0 {
            return Err(ConfigError::ZeroIterations {
                origin: self.origin(self.args.max_iter.is_some()),
            });
        }
        Ok(max_iter)
    }

    /// The agent: its backend (exec needs a command), program, model (native needs one),
    /// template, time limits and the native/local options.
    pub fn agent(&self) -> Result<AgentPart, ConfigError> {
        let (a, f) = (&self.args.agent_args, self.file);
        let base = DefaultsFor::base();
        let agent = a.agent.or(f.agent).unwrap_or_else(|| base.agent());
        let defaults = DefaultsFor {
            agent,
            local_model: a
                .local_model
                .or(f.local_model)
                .unwrap_or_else(|| base.local_model()),
            // local always speaks the OpenAI format to the server ralph starts.
            provider: match agent {
                AgentKind::Local => ProviderKind::Openai,
                _ => a.provider.or(f.provider).unwrap_or_else(|| base.provider()),
            },
        };
        let d = &defaults;
        let agent_cmd = a.agent_cmd.clone().or(f.agent_cmd.clone());
        if agent == AgentKind::Exec && agent_cmd.as_deref().is_none_or(|c| c.trim().is_empty()) {
            return Err(ConfigError::MissingAgentCmd {
                agent: self.origin(a.agent.is_some()),
            });
        }
        let template = self.path(&self.args.template, &f.template);
        let agent_program = match (&a.agent_program, &f.agent_program) {
            (Some(p), _) => Some(program_path(self.cwd, p)),
            (None, Some(p)) => Some(program_path(&self.file_dir, p)),
            (None, None) => None,
        };
        let timeout = self
            .args
            .timeout
            .or(self.duration("timeout", &f.timeout)?)
            .unwrap_or_else(|| d.timeout());
        let idle_timeout = self
            .args
            .idle_timeout
            .or(self.duration("idle_timeout", &f.idle_timeout)?)
            .unwrap_or_else(|| d.idle_timeout());
        let timeout = self.nonzero(("--timeout", "timeout"), self.args.timeout, timeout)?;
        let idle_timeout = self.nonzero(
            ("--idle-timeout", "idle_timeout"),
            self.args.idle_timeout,
            idle_timeout,
        )?;
        let model = a.model.clone().or(f.model.clone());
        if agent == AgentKind::Native && model.is_none() {
            return Err(ConfigError::MissingModel {
                agent: self.origin(a.agent.is_some()),
            });
        }
        Ok(AgentPart {
            native: self.native(d),
            defaults,
            agent,
            agent_cmd,
            agent_program,
            model,
            template,
            timeout,
            idle_timeout,
        })
    }

    /// The native and local backends' options (`d`: the defaults for the agent, its built-in
    /// model and its API).
    fn native(&self, d: &DefaultsFor) -> NativeOptions {
        let (a, f) = (&self.args.agent_args, self.file);
        NativeOptions {
            provider: d.provider,
            base_url: a
                .base_url
                .clone()
                .or(f.base_url.clone())
                .or_else(|| d.base_url()),
            api_key_env: a
                .api_key_env
                .clone()
                .or(f.api_key_env.clone())
                .or_else(|| d.api_key_env()),
            local_model: d.local_model,
            model_file: self.path(&a.model_file, &f.model_file),
            tool_mode: self
                .args
                .tool_mode
                .or(f.tool_mode)
                .unwrap_or_else(|| d.tool_mode()),
            max_steps: self
                .args
                .max_steps
                .or(f.max_steps)
                .unwrap_or_else(|| d.max_steps()),
            max_tokens: f.max_tokens.unwrap_or_else(|| d.max_tokens()),
            context_window: f.context_window.unwrap_or_else(|| d.context_window()),
            temperature: f.temperature.or_else(|| d.temperature()),
            seed: f.seed.or_else(|| d.seed()),
            prices: f.prices.clone(),
            tools: f.tools.clone().or_else(|| d.tools()),
            answer_schema: None,
        }
    }

    /// `--verify`'s time limit and the first wait after a transient failure.
    pub fn check_waits(&self, d: &DefaultsFor) -> Result<(Duration, Duration), ConfigError> {
        let verify_timeout = self
            .duration("verify_timeout", &self.file.verify_timeout)?
            .unwrap_or_else(|| d.verify_timeout());
        let transient_backoff = self
            .duration("transient_backoff", &self.file.transient_backoff)?
            .unwrap_or_else(|| d.transient_backoff());
        Ok((verify_timeout, transient_backoff))
    }

    /// The native options that cannot work: no steps, JSON tool mode with the Anthropic API.
    pub fn check_native(&self, native: &NativeOptions) -> Result<(), ConfigError> {
        if native.max_steps == 0 {
            return Err(ConfigError::ZeroSteps {
                origin: self.origin(self.args.max_steps.is_some()),
            });
        }
        if native.tool_mode == ToolMode::Json && native.provider == ProviderKind::Anthropic {
            return Err(ConfigError::JsonModeNeedsOpenai {
                tool_mode: self.origin(self.args.tool_mode.is_some()),
                provider: self.origin(self.args.agent_args.provider.is_some()),
            });
        }
        Ok(())
    }

    /// The usage-limit wait without a reset time, and the margin after a reset.
    pub fn usage_limit_waits(&self, d: &DefaultsFor) -> Result<(Duration, Duration), ConfigError> {
        let fallback = self
            .duration("usage_limit_fallback", &self.file.usage_limit_fallback)?
            .unwrap_or_else(|| d.usage_limit_fallback());
        let margin = self
            .duration("usage_limit_margin", &self.file.usage_limit_margin)?
            .unwrap_or_else(|| d.usage_limit_margin());
        Ok((fallback, margin))
    }

    /// The run's limits: its duration, the story and failure counts, `--parallel`, the cost.
    pub fn limits(&self, d: &DefaultsFor) -> Result<Limits, ConfigError> {
        let (a, f) = (self.args, self.file);
        let max_duration = match a.max_duration {
            Some(d) => Some(d),
            None => self.duration("max_duration", &f.max_duration)?,
        };
        if max_duration == Some(Duration::ZERO) {
            return Err(ConfigError::ZeroDuration {
                name: "--max-duration",
                key: "max_duration",
                origin: self.origin(a.max_duration.is_some()),
            });
        }
        let max_attempts = self.count(
            "--max-attempts",
            "max_attempts",
            (a.max_attempts, f.max_attempts),
            d.max_attempts(),
        )?;
        let parallel = self.count(
            "--parallel",
            "parallel",
            (a.parallel, f.parallel),
            d.parallel(),
        )?;
        let max_failures = self.count(
            "--max-failures",
            "max_failures",
            (a.max_failures, f.max_failures),
            d.max_failures(),
        )?;
        let max_no_progress = self.count(
            "--max-no-progress",
            "max_no_progress",
            (a.max_no_progress, f.max_no_progress),
            d.max_no_progress(),
        )?;
        Ok(Limits {
            max_attempts,
            parallel,
            max_failures,
            max_no_progress,
            max_duration,
            max_cost: None,
        })
    }

    /// The shutdown deadline, `--push`'s remote and lease, and the cost limit (checked in this
    /// order).
    pub fn remote(&self, d: &DefaultsFor, limits: &mut Limits) -> Result<Remote, ConfigError> {
        let (a, f) = (self.args, self.file);
        let shutdown_timeout = match a.shutdown_timeout {
            Some(d) => d,
            None => self
                .duration("shutdown_timeout", &f.shutdown_timeout)?
                .unwrap_or_else(|| d.shutdown_timeout()),
        };
        let shutdown_timeout = self.nonzero(
            ("--shutdown-timeout", "shutdown_timeout"),
            a.shutdown_timeout,
            shutdown_timeout,
        )?;
        let lease_ttl = match a.lease_ttl {
            Some(d) => d,
            None => self
                .duration("lease_ttl", &f.lease_ttl)?
                .unwrap_or_else(|| d.lease_ttl()),
        };
        let lease_ttl = self.nonzero(("--lease-ttl", "lease_ttl"), a.lease_ttl, lease_ttl)?;
        let push = self.push()?;
        let max_cost = a.max_cost.or(f.max_cost);
        if let Some(value) = max_cost.filter(|c| !c.is_finite() || *c <= 0.0) {
            return Err(ConfigError::BadCost {
                value,
                origin: self.origin(a.max_cost.is_some()),
            });
        }
        limits.max_cost = max_cost;
        Ok(Remote {
            push,
            shutdown_timeout,
            lease_ttl,
            push_attempts: f.push_attempts.unwrap_or_else(|| d.push_attempts()).max(1),
            push_backoff: self
                .duration("push_backoff", &f.push_backoff)?
                .unwrap_or_else(|| d.push_backoff()),
        })
    }

    /// `--push`: the remote's name (`true` is `origin`), or `None`.
    fn push(&self) -> Result<Option<String>, ConfigError> {
        let push = match (&self.args.push, &self.file.push) {
            // RALPH_PUSH=true / false, as for the other switches.
            (Some(v), _) if ["true", "1", "yes", "on"].contains(&v.trim()) => {
                Some("origin".to_owned())
            }
            (Some(v), _) if ["false", "0", "no", "off"].contains(&v.trim()) => None,
            (Some(remote), _) => Some(remote.trim().to_owned()),
            (None, Some(PushSetting::On(true))) => Some("origin".to_owned()),
            (None, Some(PushSetting::Remote(r))) => Some(r.trim().to_owned()),
            (None, Some(PushSetting::On(false)) | None) => None,
        };
        if let Some(remote) = push.as_deref() {
            if remote.is_empty() || remote.starts_with('-') || remote.contains(char::is_whitespace)
            {
                return Err(ConfigError::BadRemote {
                    value: remote.to_owned(),
                    origin: self.origin(self.args.push.is_some()),
                });
            }
        }
        Ok(push)
    }

    /// The output mode: `--json`, else `--quiet`, else the live display.
    pub fn output(&self) -> OutputMode {
        if self.args.json {
            OutputMode::Json
        } else if self.args.quiet {
            OutputMode::Quiet
        } else {
            OutputMode::Human
        }
    }

    /// The whole configuration from the steps' parts and the settings that need no check.
    pub fn assemble(&self, parts: Parts) -> Result<RunConfig, ConfigError> {
        let (a, f) = (self.args, self.file);
        let Parts {
            max_iter,
            agent: ag,
            waits,
            usage,
            limits,
            remote,
        } = parts;
        let duration = super::durations_of(&self.file_path);
        let d = &ag.defaults;
        Ok(RunConfig {
            push_attempts: remote.push_attempts,
            push_backoff: remote.push_backoff,
            push: remote.push,
            shutdown_timeout: remote.shutdown_timeout,
            lease_ttl: remote.lease_ttl,
            max_cost: limits.max_cost,
            budget_scope: a
                .budget_scope
                .or(f.budget_scope)
                .unwrap_or_else(|| d.budget_scope()),
            resume_only: a.resume_only || f.resume_only.unwrap_or(false),
            max_attempts: limits.max_attempts,
            max_failures: limits.max_failures,
            max_no_progress: limits.max_no_progress,
            prd_guard: a.prd_guard.or(f.prd_guard).unwrap_or_else(|| d.prd_guard()),
            unblock: a.unblock,
            stop_on_block: a.stop_on_block || f.stop_on_block.unwrap_or(false),
            parallel: limits.parallel,
            resolve_conflicts: a.resolve_conflicts || f.resolve_conflicts.unwrap_or(false),
            worktree_copy: f.worktree_copy.clone().unwrap_or_default(),
            worktree_setup: f.worktree_setup.clone().filter(|c| !c.trim().is_empty()),
            sandbox: a.sandbox.or(f.sandbox).unwrap_or_else(|| d.sandbox()),
            allow_hosts: a
                .allow_hosts
                .iter()
                .chain(f.allow_hosts.iter().flatten())
                .cloned()
                .collect(),
            sandbox_writable: a
                .sandbox_writable
                .iter()
                .chain(f.sandbox_writable.iter().flatten())
                .map(|p| absolute(self.cwd, p))
                .collect(),
            keep_api_key: a.keep_api_key || f.keep_api_key.unwrap_or(false),
            max_duration: limits.max_duration,
            patterns: f.patterns.clone(),
            notify: notify_config(a, &f.notify, &duration)?,
            no_wait: a.no_wait,
            usage_limit_fallback: usage.0,
            usage_limit_margin: usage.1,
            max_usage_limit_waits: f
                .max_usage_limit_waits
                .unwrap_or_else(|| d.max_usage_limit_waits()),
            transient_backoff: waits.1,
            max_transient_retries: f
                .max_transient_retries
                .unwrap_or_else(|| d.max_transient_retries()),
            verify: a.verify.clone().or(f.verify.clone()),
            verify_marks_passing: a
                .verify_marks_passing
                .or(f.verify_marks_passing)
                .unwrap_or_else(|| d.verify_marks_passing()),
            verify_timeout: waits.0,
            prd_path: match (&a.prd, &f.prd) {
                (None, None) => self.cwd.join(d.prd::<PathBuf>()),
                (flag, key) => self.path(flag, key).unwrap_or_default(),
            },
            agent: ag.agent,
            agent_cmd: ag.agent_cmd,
            agent_program: ag.agent_program,
            model: ag.model,
            native: ag.native,
            max_iter,
            timeout: ag.timeout,
            idle_timeout: ag.idle_timeout,
            kill_grace: duration("kill_grace", &f.kill_grace)?.unwrap_or_else(|| d.kill_grace()),
            allow_dirty: a.allow_dirty || f.allow_dirty.unwrap_or(false),
            output: self.output(),
            verbose: a.verbose,
            template: ag.template,
            progress_tail_bytes: f
                .progress_tail_bytes
                .unwrap_or_else(|| d.progress_tail_bytes()),
            config_file: self.config_path.clone(),
            fallbacks: Vec::new(),
        })
    }
}

/// What the checked steps resolved, for [`Layers::assemble`].
pub(super) struct Parts {
    pub max_iter: u32,
    pub agent: AgentPart,
    /// `verify_timeout`, `transient_backoff`.
    pub waits: (Duration, Duration),
    /// `usage_limit_fallback`, `usage_limit_margin`.
    pub usage: (Duration, Duration),
    pub limits: Limits,
    pub remote: Remote,
}
