//! One agent as one value ([`AgentProfile`]): which backend runs, with which program, model,
//! provider, prompt template, time limits and prices. The primary agent's profile comes from the
//! flat settings (`--agent`, `--model`, … and their ralph.toml keys); each fallback agent's from
//! an `[[agents]]` table of ralph.toml ([`AgentTable`]) or from a bare backend name
//! (`--fallback-agent codex`), resolved by the same rules as the primary's and checked in the
//! same place. A fallback never inherits the primary's model, program or template: only the
//! run-wide time limits (`timeout`, `idle_timeout`), the `[prices]` table and `keep_api_key` apply
//! to every agent that does not set its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{AgentTable, ConfigError, FileConfig, NativeOptions, Origin, RunConfig};
use crate::cli::RunArgs;
use crate::protocol::AgentKind;
#[cfg(test)]
use crate::protocol::ToolMode;

/// Everything that says which agent runs and how. Built by [`RunConfig::resolve`]; used by
/// preflight (to build and check its backend), the loop (to launch it) and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentProfile {
    /// Its name: an `[[agents]]` table's `name`, else the backend's name (`claude`). State
    /// (usage-limit resets) and the ledger key agents by it.
    pub name: String,
    /// The backend.
    pub agent: AgentKind,
    /// Command line for the exec backend.
    pub agent_cmd: Option<String>,
    /// Path to the agent CLI, when overridden.
    pub agent_program: Option<PathBuf>,
    /// Model passed to the agent.
    pub model: Option<String>,
    /// Settings of the native and local backends (provider, base URL, API key variable, prices).
    pub native: NativeOptions,
    /// Absolute path of a prompt template replacing the built-in one (`None`: the built-in one;
    /// the compact one for `local`).
    pub template: Option<PathBuf>,
    /// Per-iteration wall-clock limit.
    pub timeout: Duration,
    /// Kill the agent after this long without output.
    pub idle_timeout: Duration,
    /// claude: keep `ANTHROPIC_API_KEY` in its environment.
    pub keep_api_key: bool,
    /// Whether an `[[agents]]` table of ralph.toml sets this agent up (`false`: the primary, or
    /// a fallback named by its backend alone, whose settings no table holds yet).
    pub table: bool,
}

impl RunConfig {
    /// The primary agent's profile (named after its backend).
    pub fn profile(&self) -> AgentProfile {
        AgentProfile {
            name: self.agent.as_str().to_owned(),
            agent: self.agent,
            agent_cmd: self.agent_cmd.clone(),
            agent_program: self.agent_program.clone(),
            model: self.model.clone(),
            native: self.native.clone(),
            template: self.template.clone(),
            timeout: self.timeout,
            idle_timeout: self.idle_timeout,
            keep_api_key: self.keep_api_key,
            table: false,
        }
    }

    /// Every agent of the run in the order they are tried: the primary, then the fallbacks.
    pub fn agents(&self) -> Vec<AgentProfile> {
        std::iter::once(self.profile())
            .chain(self.fallbacks.iter().cloned())
            .collect()
    }

    /// These settings with `p` as the agent: what an iteration on `p` runs with.
    pub fn for_agent(&self, p: &AgentProfile) -> RunConfig {
        RunConfig {
            agent: p.agent,
            agent_cmd: p.agent_cmd.clone(),
            agent_program: p.agent_program.clone(),
            model: p.model.clone(),
            native: p.native.clone(),
            template: p.template.clone(),
            timeout: p.timeout,
            idle_timeout: p.idle_timeout,
            keep_api_key: p.keep_api_key,
            ..self.clone()
        }
    }
}

/// The fallback agents of a run: `--fallback-agent` (or `RALPH_FALLBACK_AGENT`), else
/// ralph.toml's `fallback_agents`, else every `[[agents]]` table in the file's order. `primary`
/// is the run's own resolved settings.
///
/// # Errors
/// [`ConfigError::BadFallback`] for an unknown or repeated name or a bad `[[agents]]` table;
/// [`ConfigError::Fallback`] for an agent whose settings fail the checks the primary's would.
pub(super) fn fallbacks(
    args: &RunArgs,
    file: &FileConfig,
    config_path: Option<&Path>,
    cwd: &Path,
    primary: &RunConfig,
) -> Result<Vec<AgentProfile>, ConfigError> {
    let file_origin = Origin::File(config_path.map(Path::to_path_buf).unwrap_or_default());
    let file_name =
        config_path.map_or_else(|| "ralph.toml".to_owned(), |p| p.display().to_string());
    if let Some(message) = table_names_problem(&file.agents, &file_name) {
        return Err(ConfigError::BadFallback {
            message,
            hint: "give each [[agents]] table a `name` of its own (`fallback_agents` and --fallback-agent use it)".into(),
            origin: file_origin,
        });
    }
    // An empty name is no name: `RALPH_FALLBACK_AGENT=` (or `--fallback-agent ''`) is unset.
    let given: Vec<String> = args
        .fallback_agent
        .iter()
        .filter(|n| !n.trim().is_empty())
        .cloned()
        .collect();
    let (names, origin): (Vec<String>, Origin) = if !given.is_empty() {
        (given, Origin::CommandLine)
    } else if let Some(names) = &file.fallback_agents {
        (names.clone(), file_origin.clone())
    } else {
        (
            file.agents.iter().map(|t| t.name.clone()).collect(),
            file_origin.clone(),
        )
    };
    let mut used = vec![primary.agent.as_str().to_owned()];
    let mut out = Vec::new();
    let list = match &origin {
        Origin::CommandLine if from_env(&args.fallback_agent) => "RALPH_FALLBACK_AGENT".to_owned(),
        Origin::CommandLine => "--fallback-agent".to_owned(),
        _ if file.fallback_agents.is_some() => format!("`fallback_agents` in {file_name}"),
        _ => format!("the [[agents]] tables of {file_name}"),
    };
    for raw in names {
        let name = raw.trim().to_owned();
        if used.contains(&name) {
            let primary_name = primary.agent.as_str();
            let (message, hint) = if name == primary_name
                && file.agents.iter().any(|t| t.name == name)
            {
                (
                    format!("the [[agents]] table `{name}` in {file_name} has the primary agent's name (the primary agent is `{primary_name}`: --agent, else `agent` at the top of ralph.toml, else claude)"),
                    format!("rename the table (e.g. name = \"{name}-2\"); a table adds a fallback agent and cannot change the primary one, whose settings are the top-level keys"),
                )
            } else if name == primary_name {
                (
                    format!("{list} names `{name}`, which is the primary agent"),
                    "leave the primary agent out of the fallbacks; a second setup of its backend needs an [[agents]] table with a name of its own".to_owned(),
                )
            } else {
                (
                    format!("{list} names `{name}` twice"),
                    "name each fallback agent once".to_owned(),
                )
            };
            return Err(ConfigError::BadFallback {
                message,
                hint,
                origin,
            });
        }
        let table = match file.agents.iter().find(|t| t.name == name) {
            Some(t) => t.clone(),
            None => AgentTable {
                name: name.clone(),
                ..AgentTable::default()
            },
        };
        let kind = match table
            .agent
            .or_else(|| <AgentKind as clap::ValueEnum>::from_str(&name, true).ok())
        {
            Some(kind) => kind,
            None => {
                let tables: Vec<&str> = file.agents.iter().map(|t| t.name.as_str()).collect();
                return Err(ConfigError::BadFallback {
                    message: format!(
                        "fallback agent `{name}` is neither an [[agents]] table in {}{} nor a backend (named by {list})",
                        if config_path.is_some() { file_name.as_str() } else { "ralph.toml (there is none)" },
                        if tables.is_empty() { String::new() } else { format!(" ({})", tables.join(", ")) }
                    ),
                    hint: "use a backend's name (claude, codex, opencode, gemini, amp, cursor, native, local, exec), or add `[[agents]]` with `name` and `agent` to ralph.toml".into(),
                    origin,
                });
            }
        };
        let is_table = file.agents.iter().any(|t| t.name == name);
        let profile = resolve_table(args, file, config_path, cwd, &table, kind).map_err(|e| {
            // A bare backend name has no keys of its own to fix: the error names the list that
            // gave the name, and the fix is a table (in the ralph.toml there is, or a new one).
            let needs = match e {
                ConfigError::MissingModel { .. } => Some((
                    "the model name",
                    "model = \"NAME\", e.g. gpt-4.1-mini",
                )),
                ConfigError::MissingAgentCmd { .. } => Some((
                    "the command to run",
                    "agent_cmd = \"my-agent --flag\"",
                )),
                _ => None,
            };
            if !is_table {
                if let Some((what, key)) = needs {
                    let table = format!(
                        "an [[agents]] table (name = \"my-{name}\", agent = \"{name}\", {key})"
                    );
                    return ConfigError::BadFallback {
                        message: format!(
                            "{list} names `{name}`, a backend that needs {what}, which a bare backend name cannot give"
                        ),
                        hint: match config_path {
                            Some(path) => format!("add {table} to {} and name that table instead", path.display()),
                            None => format!("no ralph.toml: add one with {table} and name that table instead"),
                        },
                        origin: origin.clone(),
                    };
                }
            }
            // The table's own keys are what to fix (a bare backend name has no table).
            let e = match config_path {
                Some(path) if file.agents.iter().any(|t| t.name == name) => e.in_table(path, &name),
                _ => e,
            };
            ConfigError::Fallback {
                name: name.clone(),
                source: Box::new(e),
            }
        })?;
        used.push(name);
        out.push(profile);
    }
    Ok(out)
}

/// Whether the fallback names the command line gave (`names`) came from `RALPH_FALLBACK_AGENT`
/// rather than `--fallback-agent` (clap merges the two): the variable is set and splits into
/// the same names.
fn from_env(names: &[String]) -> bool {
    std::env::var("RALPH_FALLBACK_AGENT").is_ok_and(|v| {
        let from: Vec<&str> = v.split(',').collect();
        from.len() == names.len() && from.iter().zip(names).all(|(a, b)| *a == b)
    })
}

/// What is wrong with the names of the `[[agents]]` tables of `file_name`, if anything: a
/// table without a name, or two tables with the same name (both named, by position: "the 1st
/// and the 3rd [[agents]] table").
fn table_names_problem(tables: &[AgentTable], file_name: &str) -> Option<String> {
    for (i, t) in tables.iter().enumerate() {
        if t.name.trim().is_empty() {
            return Some(format!(
                "the {} [[agents]] table in {file_name} has an empty `name`",
                ordinal(i + 1)
            ));
        }
        if let Some(j) = tables[..i].iter().position(|o| o.name == t.name) {
            return Some(format!(
                "two [[agents]] tables in {file_name} are named `{}`: the {} and the {}",
                t.name,
                ordinal(j + 1),
                ordinal(i + 1)
            ));
        }
    }
    None
}

/// `1st`, `2nd`, `3rd`, `4th`, …, `11th`, `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// One fallback agent's profile: `table`'s settings over the run-wide time limits, prices and
/// `keep_api_key`, through the same resolution (defaults and checks) as the primary's.
fn resolve_table(
    args: &RunArgs,
    file: &FileConfig,
    config_path: Option<&Path>,
    cwd: &Path,
    table: &AgentTable,
    kind: AgentKind,
) -> Result<AgentProfile, ConfigError> {
    let mut prices = file.prices.clone();
    prices.extend(table.prices.clone());
    // The table's own keys (declared once, in the settings table), over the run-wide time
    // limits, `keep_api_key` and prices it does not set.
    let layer = FileConfig {
        agent: Some(kind),
        timeout: table.timeout.clone().or(file.timeout.clone()),
        idle_timeout: table.idle_timeout.clone().or(file.idle_timeout.clone()),
        keep_api_key: table.keep_api_key.or(file.keep_api_key),
        prices,
        ..table.keys()
    };
    // The run-wide flags that apply to every agent; a table's own value wins over them.
    let flags = RunArgs {
        timeout: args.timeout.filter(|_| table.timeout.is_none()),
        idle_timeout: args.idle_timeout.filter(|_| table.idle_timeout.is_none()),
        keep_api_key: args.keep_api_key,
        ..RunArgs::default()
    };
    let cfg = RunConfig::resolve_with(&flags, &layer, config_path.map(Path::to_path_buf), cwd)?;
    Ok(AgentProfile {
        name: table.name.clone(),
        table: file.agents.iter().any(|t| t.name == table.name),
        ..cfg.profile()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(toml: &str, flags: &[&str]) -> Result<RunConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ralph.toml"), toml).unwrap();
        let args = RunArgs {
            fallback_agent: flags.iter().map(|s| s.to_string()).collect(),
            ..RunArgs::default()
        };
        RunConfig::resolve(&args, dir.path())
    }

    #[test]
    fn agents_tables_are_the_fallbacks_in_order_with_their_own_settings() {
        let cfg = resolve(
            "model = \"opus\"\ntimeout = \"20m\"\n\
             [[agents]]\nname = \"codex-mini\"\nagent = \"codex\"\nmodel = \"gpt-5-mini\"\n\
             [[agents]]\nname = \"local\"\ntimeout = \"5m\"\n",
            &[],
        )
        .unwrap();
        let agents = cfg.agents();
        let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["claude", "codex-mini", "local"]);
        assert_eq!(agents[0].model.as_deref(), Some("opus"));
        // A fallback never inherits the primary's model; the run-wide timeout applies unless
        // the table sets its own.
        assert_eq!(agents[1].agent, AgentKind::Codex);
        assert_eq!(agents[1].model.as_deref(), Some("gpt-5-mini"));
        assert_eq!(agents[1].timeout, Duration::from_secs(20 * 60));
        assert_eq!(agents[2].agent, AgentKind::Local);
        assert_eq!(agents[2].model, None);
        assert_eq!(agents[2].timeout, Duration::from_secs(5 * 60));
        assert_eq!(agents[2].native.tool_mode, ToolMode::Json);
        let on_local = cfg.for_agent(&agents[2]);
        assert_eq!(
            (on_local.agent, on_local.timeout, on_local.max_iter),
            (AgentKind::Local, Duration::from_secs(300), cfg.max_iter)
        );
    }

    #[test]
    fn the_flag_replaces_the_file_order_and_takes_bare_backends() {
        let cfg = resolve(
            "fallback_agents = [\"mini\"]\n[[agents]]\nname = \"mini\"\nagent = \"codex\"\n",
            &["gemini", "mini"],
        )
        .unwrap();
        let names: Vec<String> = cfg.agents().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["claude", "gemini", "mini"]);
        let cfg = resolve(
            "fallback_agents = [\"mini\"]\n[[agents]]\nname = \"mini\"\nagent = \"codex\"\n\
             [[agents]]\nname = \"other\"\nagent = \"gemini\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(cfg.fallbacks.len(), 1);
    }

    #[test]
    fn unknown_repeated_or_misconfigured_fallbacks_are_named() {
        let e = resolve("", &["codx"]).unwrap_err();
        assert!(
            e.to_string().contains("fallback agent `codx` is neither"),
            "{e}"
        );
        assert_eq!(e.exit_status(), crate::protocol::ExitStatus::Usage);
        let e = resolve("", &["claude"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("--fallback-agent names `claude`, which is the primary agent"),
            "{e}"
        );
        let e = resolve("", &["codex", "codex"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("--fallback-agent names `codex` twice"),
            "{e}"
        );
        let e = resolve("[[agents]]\nname = \"x\"\nagent = \"exec\"\n", &[]).unwrap_err();
        assert!(
            e.to_string().starts_with("fallback agent `x`: ")
                && e.to_string().contains("agent_cmd"),
            "{e}"
        );
        let e = resolve("[[agents]]\nname = \"x\"\nmodle = \"y\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("modle"), "{e}");
    }
}
