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

use crate::agent::{self, probe, AgentSettings};
use crate::cli::DoctorArgs;
use crate::config::FileConfig;
use crate::protocol::AgentKind;
use crate::protocol::ExitStatus;

/// The CLI backends, in the order they are shown.
const CLIS: [AgentKind; 6] = [
    AgentKind::Claude,
    AgentKind::Codex,
    AgentKind::Opencode,
    AgentKind::Gemini,
    AgentKind::Amp,
    AgentKind::Cursor,
];

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
        None => CLIS.to_vec(),
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
    let configured_ok = if CLIS.contains(&configured) {
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
                install_hint(kind)
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

fn install_hint(kind: AgentKind) -> &'static str {
    match kind {
        AgentKind::Claude => "install it with `npm install -g @anthropic-ai/claude-code`",
        AgentKind::Codex => "install it with `npm install -g @openai/codex`",
        AgentKind::Opencode => "install it with `npm install -g opencode-ai`",
        AgentKind::Gemini => "install it with `npm install -g @google/gemini-cli`",
        AgentKind::Amp => "install it with `npm install -g @sourcegraph/amp`",
        AgentKind::Cursor => "install it from https://cursor.com/cli (`cursor-agent`)",
        AgentKind::Exec | AgentKind::Native | AgentKind::Local => "see README.md",
    }
}

fn set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty())
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// The traps that apply to `kind` on this machine, in this directory.
fn traps(kind: AgentKind, cwd: &Path, file: &FileConfig) -> Vec<String> {
    let mut out = Vec::new();
    let root = nix::unistd::geteuid().is_root();
    match kind {
        AgentKind::Claude => {
            if root && std::env::var("IS_SANDBOX").as_deref() != Ok("1") {
                out.push(
                    "running as root without IS_SANDBOX=1: claude refuses --dangerously-skip-permissions as root; ralph sets IS_SANDBOX=1 for the claude it starts, a claude you start by hand needs `export IS_SANDBOX=1` (only in a sandbox or container)"
                        .to_owned(),
                );
            }
            if set("ANTHROPIC_API_KEY") {
                out.push(
                    "ANTHROPIC_API_KEY is set: with it claude bills the API key, not your subscription; ralph removes it for claude unless --keep-api-key"
                        .to_owned(),
                );
            }
            if set("CLAUDECODE") {
                out.push(
                    "running inside a Claude Code session (CLAUDECODE is set): ralph removes CLAUDECODE, CLAUDE_CODE_ENTRYPOINT and CLAUDE_CODE_SSE_PORT for its claude"
                        .to_owned(),
                );
            }
            let cmd = file.agent_cmd.as_deref().unwrap_or("");
            if cmd.contains("claude") && cmd.contains("stream-json") && !cmd.contains("--verbose") {
                out.push(format!(
                    "agent_cmd `{cmd}` uses claude's stream-json without --verbose, which claude refuses with -p; add --verbose (or use --agent claude)"
                ));
            }
        }
        AgentKind::Codex => {
            let codex_home = std::env::var_os("CODEX_HOME")
                .map(PathBuf::from)
                .or_else(|| home().map(|h| h.join(".codex")));
            let logged_in = codex_home.is_some_and(|h| h.join("auth.json").is_file());
            if !set("CODEX_API_KEY") && !set("OPENAI_API_KEY") && !logged_in {
                out.push(
                    "no CODEX_API_KEY and no saved login ($CODEX_HOME/auth.json): run `codex login` or export CODEX_API_KEY"
                        .to_owned(),
                );
            }
        }
        AgentKind::Gemini => {
            let trusted = home()
                .map(|h| h.join(".gemini").join("trustedFolders.json"))
                .and_then(|p| std::fs::read_to_string(p).ok())
                .is_some_and(|t| t.contains(&*cwd.to_string_lossy()));
            if !trusted && std::env::var("GEMINI_CLI_TRUST_WORKSPACE").as_deref() != Ok("true") {
                out.push(format!(
                    "{} is not a trusted gemini folder: headless gemini refuses it (exit 55) or silently drops --yolo; ralph passes --skip-trust",
                    cwd.display()
                ));
            }
            if !set("GEMINI_API_KEY") && !set("GOOGLE_API_KEY") && !set("GOOGLE_CLOUD_PROJECT") {
                out.push(
                    "no GEMINI_API_KEY (or Vertex settings): a headless gemini cannot log in by browser"
                        .to_owned(),
                );
            }
        }
        AgentKind::Cursor => {
            if !set("CURSOR_API_KEY") {
                out.push(
                    "no CURSOR_API_KEY: cursor-agent's first run tries a browser login and hangs until the idle timeout"
                        .to_owned(),
                );
            }
        }
        AgentKind::Amp => {
            if !set("AMP_API_KEY") {
                out.push(
                    "no AMP_API_KEY: amp needs it (or a saved `amp login`) to run headless"
                        .to_owned(),
                );
            }
        }
        AgentKind::Opencode | AgentKind::Exec | AgentKind::Native | AgentKind::Local => {}
    }
    out
}
