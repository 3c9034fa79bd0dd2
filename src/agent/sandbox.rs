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
    for host in &ask.allow_hosts {
        check_allow_host(host).map_err(|why| {
            UserError::new(format!("--allow-host {host:?}: {why}")).with_hint(
                "give a host name or address, with a port when only one port may be reached: `--allow-host pypi.org` or `--allow-host pypi.org:443` (no scheme or path; `*.example.com` for every name under a domain)",
            )
        })?;
    }
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    for path in &ask.writable {
        check_writable(path, home.as_deref()).map_err(|why| {
            UserError::new(format!("--sandbox-writable {}: {why}", path.display())).with_hint(
                "name the one folder the agent's tools must write outside the tree, e.g. a package cache (`~/.cache/pip`)",
            )
        })?;
    }
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
        readable: info
            .sandbox
            .config_vars
            .iter()
            .filter_map(std::env::var_os)
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute())
            .collect(),
        absent_config: Default::default(),
        findings: Default::default(),
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

/// Checks one `--allow-host` value: a host name, `*.` and a domain (its subdomains), an IPv4
/// address or a bracketed IPv6 address, optionally with `:PORT` (1–65535).
///
/// # Errors
/// What is wrong with it, in words.
pub fn check_allow_host(value: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address needs its closing `]`")?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("`{addr}` is no IPv6 address"));
        }
        match after.strip_prefix(':') {
            Some(port) => ("v6", Some(port)),
            None if after.is_empty() => ("v6", None),
            None => return Err(format!("unexpected `{after}` after the address")),
        }
    } else {
        match value.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (value, None),
        }
    };
    if value.contains("://") {
        return Err("a host, not a URL: leave out the scheme".into());
    }
    // `*.example.com`: every name under example.com (the egress proxy's suffix rule).
    let host = host.strip_prefix("*.").unwrap_or(host);
    if host != "v6" {
        let ok = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !ok {
            return Err(format!("`{host}` is no host name or address"));
        }
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("`{port}` is no port (1 to 65535)")),
        }
    }
    Ok(())
}

/// Checks one `--sandbox-writable` path (absolute): it must not give the agent the system, the
/// kernel's views, a whole top-level folder, or where credentials live. (A folder that holds
/// `$HOME` is fine: the home is mounted empty after it.)
///
/// # Errors
/// What the path would give away.
pub fn check_writable(
    path: &std::path::Path,
    home: Option<&std::path::Path>,
) -> Result<(), String> {
    use std::path::Path;
    if path == Path::new("/") {
        return Err("the whole file system; the sandbox would protect nothing".into());
    }
    for system in [
        "/proc", "/sys", "/dev", "/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32",
        "/lib64", "/libx32",
    ] {
        if path.starts_with(system) {
            return Err(format!(
                "{system} is the system's; the sandbox keeps it read-only"
            ));
        }
    }
    for top in [
        "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/media", "/run",
    ] {
        if path == Path::new(top) {
            return Err(format!("all of {top}; name a folder inside it"));
        }
    }
    if let Some(home) = home {
        for secret in [
            ".ssh",
            ".aws",
            ".gnupg",
            ".config/gh",
            ".netrc",
            ".git-credentials",
            ".docker",
            ".kube",
        ] {
            if path.starts_with(home.join(secret)) {
                return Err(format!("~/{secret} holds credentials the sandbox hides"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn allow_host_values_are_hosts_with_an_optional_port() {
        for ok in [
            "pypi.org",
            "pypi.org:443",
            "10.0.0.1",
            "10.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
            "a-b.example",
            "*.pypi.org",
        ] {
            assert_eq!(check_allow_host(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://pypi.org",
            "",
            ":80",
            "a b",
            "*",
            "*.",
            "*.*.org",
            "pypi.org:abc",
            "pypi.org:99999",
            "pypi.org:0",
            "pypi.org/simple",
            "[::1",
            "-a.org",
        ] {
            assert!(check_allow_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn writable_paths_that_give_away_the_system_or_the_secrets_are_refused() {
        let home = Some(Path::new("/home/u"));
        for bad in [
            "/",
            "/proc",
            "/proc/1",
            "/sys",
            "/etc",
            "/etc/cron.d",
            "/usr/local",
            "/home",
            "/home/u/.ssh",
            "/home/u/.aws/x",
            "/var",
        ] {
            assert!(check_writable(Path::new(bad), home).is_err(), "{bad}");
        }
        for ok in [
            "/home/u/.cache/pip",
            "/var/cache/npm",
            "/tmp/x",
            "/opt/cache",
        ] {
            assert_eq!(check_writable(Path::new(ok), home), Ok(()), "{ok}");
        }
    }
}
