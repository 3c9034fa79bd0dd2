//! Building `--sandbox`'s [`Sandbox`] for a backend: bwrap probed (a sandbox that cannot be
//! built is an error, never a silent run without one), the backend's state paths and variables
//! from its [`SandboxNeeds`](crate::agent::registry::SandboxNeeds), and in strict mode the
//! egress proxy with the backend's API hosts, the base URL this machine points it at, the
//! native backends' `base_url` and `--allow-host`.

use crate::agent::registry::{url_host, BackendInfo};
use crate::error::UserError;
use crate::process::egress::Egress;
use crate::process::sandbox::{probe, Sandbox};
use crate::protocol::SandboxMode;

/// What the user asked of the sandbox (`--sandbox`, `--allow-host`, `--sandbox-writable`, and
/// the native backends' settings).
#[derive(Debug, Clone, Default)]
pub struct SandboxAsk {
    /// The mode.
    pub mode: SandboxMode,
    /// `--allow-host`/`allow_hosts`, as given.
    pub allow_hosts: Vec<String>,
    /// native/local: the base URL, when set.
    pub base_url: Option<String>,
    /// native/local: the API key's variable, when set.
    pub api_key_env: Option<String>,
    /// `--sandbox-writable`/`sandbox_writable`, absolute.
    pub writable: Vec<std::path::PathBuf>,
}

/// The sandbox `ask.mode` asks for, for the backend `info`; `None` when it is `off`. Must be
/// called inside a tokio runtime (strict starts its proxy there).
///
/// # Errors
/// bwrap is missing or cannot build a sandbox here (the reason and the fix), or the proxy's
/// socket cannot be created.
pub fn build(ask: &SandboxAsk, info: &BackendInfo) -> anyhow::Result<Option<Sandbox>> {
    if !ask.mode.is_on() {
        return Ok(None);
    }
    let mode = ask.mode.as_str();
    let bwrap = probe().map_err(|why| {
        UserError::new(format!("--sandbox {mode} cannot be built: {why}"))
            .with_hint("ralph never runs the agent unsandboxed when a sandbox was asked for; `ralph doctor` checks bubblewrap")
    })?;
    let egress = if ask.mode == SandboxMode::Strict {
        let hosts = allowlist(ask, info);
        Some(Egress::start(hosts).map_err(|e| {
            UserError::new(format!(
                "--sandbox strict: cannot start the egress proxy: {e}"
            ))
        })?)
    } else {
        None
    };
    Ok(Some(Sandbox {
        mode: ask.mode,
        bwrap,
        state: info
            .sandbox
            .state
            .iter()
            .map(Into::into)
            .chain(
                info.sandbox
                    .state_vars
                    .iter()
                    .filter_map(std::env::var_os)
                    .map(std::path::PathBuf::from)
                    .filter(|p| p.is_absolute()),
            )
            .collect(),
        env_prefixes: info
            .sandbox
            .env_prefixes
            .iter()
            .map(|p| (*p).to_owned())
            .chain((info.sandbox.config_env)())
            .chain(ask.api_key_env.clone())
            .collect(),
        egress,
        ralph: std::env::current_exe().unwrap_or_else(|_| "ralph".into()),
        writable: ask.writable.clone(),
    }))
}

/// The strict allowlist: the backend's API hosts, its base URLs on this machine, the native
/// backends' `base_url`, and `allow_hosts`.
pub fn allowlist(ask: &SandboxAsk, info: &BackendInfo) -> Vec<String> {
    let mut hosts: Vec<String> = info.sandbox.hosts.iter().map(|h| (*h).to_owned()).collect();
    hosts.extend((info.sandbox.base_url_hosts)());
    hosts.extend(ask.base_url.as_deref().and_then(url_host));
    hosts.extend(ask.allow_hosts.iter().cloned());
    hosts.dedup();
    hosts
}

/// strict: lets the agent reach the host of `url` too (the local model server ralph started
/// after the sandbox was built). Nothing without a strict sandbox or a URL.
pub fn allow_url(sandbox: Option<&Sandbox>, url: Option<&str>) {
    if let (Some(egress), Some(host)) = (
        sandbox.and_then(|s| s.egress.as_ref()),
        url.and_then(url_host),
    ) {
        egress.allow(&host);
    }
}
