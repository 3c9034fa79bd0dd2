//! `ralph doctor [--agent KIND] [--json]`: before a night's run, is each agent CLI installed, which
//! version is it, and which known traps would bite (`notes/agent-protocols.md` §0 and each CLI's
//! gotchas)?
//!
//! For every CLI backend (or only `--agent`'s): the program ralph would start (the default name,
//! or `--agent-program` / `RALPH_AGENT_PROGRAM` / ralph.toml's `agent_program` for the configured
//! agent), where it is on PATH, its `--version`, and the traps that apply on this machine.
//! Human output is one block per backend on stdout; `--json` prints
//! `{"agents": [{"agent", "program", "path", "version", "error", "traps": [..]}], "configured": KIND, "ok": bool}`.
//!
//! Exit code: 0 when the configured agent (ralph.toml's `agent` or `RALPH_AGENT`, else claude) is
//! installed and answers `--version`, 1 otherwise.

use std::path::{Path, PathBuf};

use console::style;
use serde::Serialize;

use crate::agent::{self, probe, AgentSettings, DoctorContext};
use crate::cli::DoctorArgs;
use crate::config::FileConfig;
use crate::protocol::AgentKind;
use crate::protocol::ExitStatus;

/// What doctor found for one backend.
#[derive(Debug, Serialize)]
struct Finding {
    agent: &'static str,
    /// The program ralph would start.
    program: String,
    /// Where it was found (`None`: not found).
    path: Option<PathBuf>,
    /// Its `--version` line.
    version: Option<String>,
    /// Why it is not usable, with the fix.
    error: Option<String>,
    /// Known traps that apply here, each with what ralph does about it or what to do.
    traps: Vec<String>,
}

/// Runs `ralph doctor`.
///
/// # Errors
/// An unreadable or invalid ralph.toml (the same error `ralph run` would give).
pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let config_path = args
        .config
        .clone()
        .or_else(|| Some(cwd.join(crate::config::CONFIG_FILE_NAME)).filter(|p| p.is_file()));
    let file: FileConfig = match &config_path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            toml::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{} is not a valid ralph configuration: {e}", path.display())
            })?
        }
        None => FileConfig::default(),
    };
    let env_agent = std::env::var("RALPH_AGENT")
        .ok()
        .and_then(|v| <AgentKind as clap::ValueEnum>::from_str(&v, true).ok());
    let configured = env_agent.or(file.agent).unwrap_or(AgentKind::Claude);
    let configured_program = std::env::var_os("RALPH_AGENT_PROGRAM")
        .map(PathBuf::from)
        .or(file.agent_program.clone());

    let kinds: Vec<AgentKind> = match args.agent {
        Some(k) => vec![k],
        None => agent::registry::clis().map(|i| i.kind).collect(),
    };
    let findings: Vec<Finding> = kinds
        .iter()
        .map(|&kind| {
            let program = (kind == configured)
                .then(|| configured_program.clone())
                .flatten();
            examine(kind, program, &cwd, &file)
        })
        .collect();
    // `--agent X` asks about X: its readiness decides the exit code.
    let configured = args.agent.unwrap_or(configured);
    let configured_ok = if agent::info(configured).is_cli() {
        match findings.iter().find(|f| f.agent == configured.as_str()) {
            Some(f) => f.error.is_none(),
            None => examine(configured, configured_program.clone(), &cwd, &file)
                .error
                .is_none(),
        }
    } else {
        // exec, native and local have no CLI to look for here.
        true
    };

    if args.json {
        let doc = serde_json::json!({
            "agents": findings,
            "configured": configured.as_str(),
            "ok": configured_ok,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for f in &findings {
            print_finding(f);
        }
        let verdict = if configured_ok {
            style("ready").green()
        } else {
            style("NOT ready").red().bold()
        };
        let which = if args.agent.is_some() {
            "agent"
        } else {
            "configured agent"
        };
        println!("{which}: {} — {verdict}", configured.as_str());
    }
    Ok(if configured_ok {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}

fn print_finding(f: &Finding) {
    let head = match (&f.error, &f.version) {
        (None, Some(v)) => format!("{} {v}", style("ok").green()),
        (None, None) => style("ok").green().to_string(),
        (Some(_), _) if f.path.is_none() => style("missing").red().to_string(),
        (Some(_), _) => style("broken").red().to_string(),
    };
    println!("{:<9} {head}", style(f.agent).bold());
    match &f.path {
        Some(p) => println!("          {}", p.display()),
        None if f.program.contains('/') => {
            println!(
                "          `{}` does not exist or is not executable",
                f.program
            )
        }
        None => println!("          `{}` not found on PATH", f.program),
    }
    if let Some(e) = &f.error {
        println!("          {} {e}", style("✗").red());
    }
    for t in &f.traps {
        println!("          {} {t}", style("!").yellow());
    }
    println!();
}

/// Looks at one backend: program, PATH, version, traps.
fn examine(kind: AgentKind, program: Option<PathBuf>, cwd: &Path, file: &FileConfig) -> Finding {
    let settings = AgentSettings {
        repo: cwd.to_path_buf(),
        program,
        ..AgentSettings::default()
    };
    let program = match agent::backend(kind, settings).and_then(|b| b.command("")) {
        Ok(spec) => spec.program,
        Err(e) => {
            return Finding {
                agent: kind.as_str(),
                program: String::new(),
                path: None,
                version: None,
                error: Some(e.to_string()),
                traps: Vec::new(),
            }
        }
    };
    let path = which::which_in(&program, std::env::var_os("PATH"), cwd).ok();
    let (version, error) = match &path {
        None => (
            None,
            Some(format!(
                "`{}` is not installed or not on PATH; {}; or point ralph at it with --agent-program PATH",
                program.display(),
                agent::info(kind).install_hint
            )),
        ),
        Some(p) => match probe::version(p, probe::VERSION_TIMEOUT) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Finding {
        agent: kind.as_str(),
        program: program.display().to_string(),
        path,
        version,
        error,
        traps: traps(kind, cwd, file),
    }
}

/// The traps that apply to `kind` on this machine, in this directory (each backend knows its
/// own: [`agent::BackendInfo::doctor`]).
fn traps(kind: AgentKind, cwd: &Path, file: &FileConfig) -> Vec<String> {
    let cx = DoctorContext {
        cwd,
        agent_cmd: file.agent_cmd.as_deref(),
        root: nix::unistd::geteuid().is_root(),
    };
    (agent::info(kind).doctor)(&cx)
}
