//! Facts about each backend ([`BackendInfo`]) and the registry that finds them by
//! [`AgentKind`], for code that has only a kind (doctor, preflight) and for the [`backend`]
//! factory. Each backend file defines its own `INFO`; adding a backend adds one line to
//! [`BACKENDS`].
//!
//! [`backend`]: crate::agent::backend

use std::path::{Path, PathBuf};

use crate::agent::{amp, claude, codex, cursor, exec, gemini, native, opencode};
use crate::agent::{AgentSettings, Backend};
use crate::protocol::AgentKind;

/// How a backend hands the prompt to its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptVia {
    /// Written to stdin, which is then closed: no size limit.
    Stdin,
    /// As a command-line argument, refused above `max_bytes`.
    Arg {
        /// The largest prompt, in bytes.
        max_bytes: usize,
    },
}

/// What `ralph doctor` knows of the machine when it asks a backend for its traps.
#[derive(Debug, Clone, Copy)]
pub struct DoctorContext<'a> {
    /// The directory ralph would run in.
    pub cwd: &'a Path,
    /// ralph.toml's `agent_cmd`, when set.
    pub agent_cmd: Option<&'a str>,
    /// ralph runs as root (effective uid 0).
    pub root: bool,
    /// `--keep-api-key` is in force (ralph.toml's `keep_api_key`, `RALPH_KEEP_API_KEY`).
    pub keep_api_key: bool,
}

impl DoctorContext<'_> {
    /// Whether the environment variable `var` is set and not empty.
    pub fn env_set(&self, var: &str) -> bool {
        std::env::var_os(var).is_some_and(|v| !v.is_empty())
    }

    /// `trap` alone, unless the environment variable `var` (a key the CLI needs to run
    /// headless) is set; nothing when it is.
    pub fn unless_set(&self, var: &str, trap: &str) -> Vec<String> {
        if self.env_set(var) {
            Vec::new()
        } else {
            vec![trap.to_owned()]
        }
    }

    /// The value of the environment variable `var`, when it is set and valid UTF-8.
    pub fn env(&self, var: &str) -> Option<String> {
        std::env::var(var).ok()
    }

    /// The environment variable `var` as a path, when it is set.
    pub fn env_path(&self, var: &str) -> Option<PathBuf> {
        std::env::var_os(var).map(PathBuf::from)
    }

    /// The user's home directory (`$HOME`).
    pub fn home(&self) -> Option<PathBuf> {
        self.env_path("HOME")
    }
}

/// Facts about one backend that do not depend on its settings.
#[derive(Debug)]
pub struct BackendInfo {
    /// Which backend this is.
    pub kind: AgentKind,
    /// The CLI's usual program name, looked up on PATH; `None` when there is no CLI to install
    /// (exec runs `--agent-cmd`; native and local run ralph itself).
    pub program: Option<&'static str>,
    /// How to install the CLI, as a clause: "install it with `npm install -g …`".
    pub install_hint: &'static str,
    /// The program answers `--version` (the CLIs do; an exec command may do anything with it).
    pub version_probe: bool,
    /// The agent prints a terminal event when its run is over (exec's plain text has none).
    pub final_event: bool,
    /// How the prompt reaches the agent.
    pub prompt: PromptVia,
    /// The known traps that apply on this machine, each a sentence saying what ralph does
    /// about it or what to do (`ralph doctor`).
    pub doctor: fn(&DoctorContext<'_>) -> Vec<String>,
    /// What ralph will do on this machine that is worth knowing but not a problem, each a
    /// sentence (`ralph doctor`'s notes; claude: what happens to `ANTHROPIC_API_KEY`).
    pub notes: fn(&DoctorContext<'_>) -> Vec<String>,
    /// Builds the backend from `settings` (see [`crate::agent::backend`]).
    pub build: fn(AgentSettings) -> anyhow::Result<Box<dyn Backend>>,
    /// What the agent needs inside `--sandbox` (its state, variables and API hosts).
    pub sandbox: SandboxNeeds,
}

/// What a backend's agent needs inside `--sandbox fs|strict` (process/sandbox.rs).
#[derive(Debug, Clone, Copy)]
pub struct SandboxNeeds {
    /// Its state under `$HOME`, bound read-write onto the host copy so that a login or a token
    /// refresh survives the iteration (`.claude`, `.claude.json`); a missing directory (no
    /// dot-file extension) is created first.
    pub state: &'static [&'static str],
    /// Prefixes of the environment variables it reads (`ANTHROPIC_`, `CLAUDE_`).
    pub env_prefixes: &'static [&'static str],
    /// The API hosts `strict` lets it reach (`host` or `host:port`); the base URL it is pointed
    /// at on this machine (an environment variable, its own config) is added by `base_url_hosts`.
    pub hosts: &'static [&'static str],
    /// The hosts of the base URLs this machine points it at (`ANTHROPIC_BASE_URL`,
    /// `base_url` in `$CODEX_HOME/config.toml`), as `host:port`.
    pub base_url_hosts: fn() -> Vec<String>,
    /// The variables its configuration on this machine names as its keys (codex's
    /// `env_key` of a custom provider), passed into the sandbox with its own.
    pub config_env: fn() -> Vec<String>,
    /// Variables naming a state directory elsewhere than under `$HOME` (`CODEX_HOME`,
    /// `CLAUDE_CONFIG_DIR`): bound read-write too when set.
    pub state_vars: &'static [&'static str],
    /// Variables naming a settings file it reads (`OPENCODE_CONFIG`,
    /// `GEMINI_CLI_SYSTEM_SETTINGS_PATH`): when set to an absolute path the sandbox would hide
    /// (under `/tmp` or `$HOME`), that file is bound read-only, so the agent runs with the
    /// settings the user gave it.
    pub config_vars: &'static [&'static str],
}

impl SandboxNeeds {
    /// Nothing: no state, no variables, no hosts (exec: what it needs is the user's to add).
    pub const NONE: SandboxNeeds = SandboxNeeds {
        state: &[],
        env_prefixes: &[],
        hosts: &[],
        base_url_hosts: Vec::new,
        config_env: Vec::new,
        state_vars: &[],
        config_vars: &[],
    };
}

/// `host:port` of a URL (`https://api.x.com/v1` → `api.x.com:443`), or `None` when it is not
/// an http(s) URL.
pub fn url_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    Some(if has_port {
        authority.to_ascii_lowercase()
    } else {
        format!("{}:{default_port}", authority.to_ascii_lowercase())
    })
}

/// The hosts of the URLs in the environment variables `vars` that are set.
pub fn env_url_hosts(vars: &[&str]) -> Vec<String> {
    vars.iter()
        .filter_map(|v| std::env::var(v).ok())
        .filter_map(|u| url_host(&u))
        .collect()
}

impl BackendInfo {
    /// Whether this backend runs an agent CLI the user installs (one `ralph doctor` examines).
    pub fn is_cli(&self) -> bool {
        self.program.is_some()
    }
}

/// Doctor checks of a backend that has none.
pub fn no_traps(_: &DoctorContext<'_>) -> Vec<String> {
    Vec::new()
}

/// Doctor notes of a backend that has none.
pub fn no_notes(_: &DoctorContext<'_>) -> Vec<String> {
    Vec::new()
}

/// Every backend, in the order `ralph doctor` shows them.
pub const BACKENDS: [&BackendInfo; 9] = [
    &claude::INFO,
    &codex::INFO,
    &opencode::INFO,
    &gemini::INFO,
    &amp::INFO,
    &cursor::INFO,
    &exec::INFO,
    &native::NATIVE_INFO,
    &native::LOCAL_INFO,
];

/// The facts about `kind`'s backend.
///
/// # Panics
/// Never for a registered kind; every [`AgentKind`] is in [`BACKENDS`] (a unit test checks).
pub fn info(kind: AgentKind) -> &'static BackendInfo {
    match BACKENDS.iter().find(|i| i.kind == kind) {
        Some(info) => info,
        None => panic!("no BackendInfo registered for {}", kind.as_str()),
    }
}

/// The backends that run an agent CLI the user installs, in doctor's order.
pub fn clis() -> impl Iterator<Item = &'static BackendInfo> {
    BACKENDS.into_iter().filter(|i| i.is_cli())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn every_kind_is_registered_once_with_its_own_facts() {
        for kind in AgentKind::value_variants() {
            assert_eq!(info(*kind).kind, *kind);
            assert_eq!(BACKENDS.iter().filter(|i| i.kind == *kind).count(), 1);
        }
        let names: Vec<&str> = clis().map(|i| i.kind.as_str()).collect();
        assert_eq!(
            names,
            ["claude", "codex", "opencode", "gemini", "amp", "cursor"]
        );
        for kind in [AgentKind::Exec, AgentKind::Native, AgentKind::Local] {
            assert!(!info(kind).version_probe, "{kind:?}");
        }
        assert!(!info(AgentKind::Exec).final_event);
        assert!(clis().all(|i| i.version_probe && i.final_event));
        assert_eq!(
            info(AgentKind::Cursor).prompt,
            PromptVia::Arg {
                max_bytes: cursor::PROMPT_ARG_MAX_BYTES
            }
        );
    }
}
