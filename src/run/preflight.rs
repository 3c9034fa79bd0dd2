//! Every check that can fail before anything is written or started: prd.json exists, the
//! repository, the prompt template, the backend's settings, the agent program on PATH, the API key
//! variable of the native backend, and the agent CLI's version (a warning when it does not say).

use std::path::Path;

use anyhow::bail;

use crate::agent::native::NativeSettings;
use crate::agent::{self, AgentSettings, Backend};
use crate::config::RunConfig;
use crate::git::Repo;
use crate::output::Outputs;
use crate::prompt::PromptTemplate;
use crate::protocol::AgentKind;
use crate::workspace::RunPaths;

/// What preflight found: the pieces every later step uses.
pub struct Preflight {
    /// The repository holding prd.json.
    pub repo: Repo,
    /// The workspace.
    pub paths: RunPaths,
    /// Every agent of the run, built and checked, in the order they are tried: the primary
    /// first, then the fallback agents.
    pub agents: Vec<AgentSetup>,
}

/// One agent, built and checked from its [`crate::config::AgentProfile`].
pub struct AgentSetup {
    /// Its profile's name.
    pub name: String,
    /// The run's settings with this agent (see [`RunConfig::for_agent`]).
    pub cfg: RunConfig,
    /// Its prompt template (the compact one for `local` unless it names its own).
    pub template: PromptTemplate,
    /// Its backend (for `local`, rebuilt once its server runs).
    pub backend: Box<dyn Backend>,
    /// Its argv as shown in the run header.
    pub agent_words: String,
    /// Its CLI's `--version`, when it answered.
    pub agent_version: Option<String>,
    /// `--sandbox`: its sandbox, built for its backend (bwrap works, strict's proxy runs with
    /// this backend's hosts); `None`: off.
    pub sandbox: Option<crate::process::sandbox::Sandbox>,
}

impl AgentSetup {
    /// The agent as configured, for keying its usage-limit reset: backend, command line,
    /// program and model (`exec cmd=Some("./a.sh") program=None model=None`). Two agents with
    /// one name but another command or model are two identities.
    pub fn identity(&self) -> String {
        format!(
            "{} cmd={:?} program={:?} model={:?}",
            self.cfg.agent.as_str(),
            self.cfg.agent_cmd,
            self.cfg.agent_program,
            self.cfg.model
        )
    }
}

impl Preflight {
    /// The primary agent.
    pub fn primary(&self) -> &AgentSetup {
        &self.agents[0]
    }
}

/// Runs every preflight check (see the module docs).
///
/// # Errors
/// A missing prd.json, not a git repository, a bad template, a misconfigured backend, a missing
/// agent program or API key variable; each names what to fix.
pub fn check(cfg: &RunConfig, out: &mut Outputs) -> anyhow::Result<Preflight> {
    let prd_dir = cfg
        .prd_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if !cfg.prd_path.exists() {
        bail!(
            "{} does not exist\nhint: create one with `ralph init`, or point ralph at yours with --prd PATH",
            cfg.prd_path.display()
        );
    }
    let repo = Repo::discover(&prd_dir)?;
    if cfg.parallel > 1 {
        // A `worktree_copy` path missing from the checkout would fail every story's setup.
        crate::worktree::check_copies(&repo, &cfg.worktree_copy)?;
    }
    let paths = RunPaths::new(repo.root(), &cfg.prd_path);
    let mut agents = vec![setup_agent(cfg, &paths, &Names::Primary, out)?];
    for profile in &cfg.fallbacks {
        let names = Names::Fallback {
            name: &profile.name,
            file: cfg.config_file.as_deref().filter(|_| profile.table),
        };
        let setup = setup_agent(&cfg.for_agent(profile), &paths, &names, out)
            .map_err(|e| anyhow::anyhow!("fallback agent `{}`: {e:#}", profile.name))?;
        agents.push(AgentSetup {
            name: profile.name.clone(),
            ..setup
        });
    }
    Ok(Preflight {
        repo,
        paths,
        agents,
    })
}

/// Builds and checks the agent `cfg` names (its template, backend, program, API key variable and
/// version); named after its backend.
///
/// # Errors
/// A bad template, a misconfigured backend, a missing agent program or API key variable.
fn setup_agent(
    cfg: &RunConfig,
    paths: &RunPaths,
    names: &Names<'_>,
    out: &mut Outputs,
) -> anyhow::Result<AgentSetup> {
    let template =
        PromptTemplate::load_with_default(cfg.template.as_deref(), cfg.agent == AgentKind::Local)?;
    let CheckedAgent { backend, probe } = build_checked(cfg, paths, names, out)?;
    let info = backend.info();
    // The CLI's version goes into the run header and every ledger record (a CLI that changed
    // overnight is the first suspect when its output stops parsing). Only for CLIs that answer
    // `--version`: an exec command may do anything with it.
    let agent_version = if info.version_probe {
        match agent::probe::version(&probe.program, agent::probe::VERSION_TIMEOUT) {
            Ok(v) => Some(v),
            Err(e) => {
                out.warn(format!("cannot tell the agent's version: {e}"));
                None
            }
        }
    } else {
        None
    };
    // A sandbox that cannot be built stops the run here, before the first iteration.
    let sandbox = agent::sandbox::build(&sandbox_ask(cfg), info)?;
    Ok(AgentSetup {
        name: cfg.agent.as_str().to_owned(),
        cfg: cfg.clone(),
        template,
        backend,
        agent_words: shell_words(&probe),
        agent_version,
        sandbox,
    })
}

/// An agent's backend, built and checked by [`build_checked`].
pub struct CheckedAgent {
    /// The backend (for `local` without `--base-url`: built before its server runs, so its URL
    /// is a placeholder until it is rebuilt with the server's).
    pub backend: Box<dyn Backend>,
    /// The backend's command for an empty prompt (its program was found).
    pub probe: crate::process::SpawnSpec,
}

/// Builds the backend of one agent profile (`cfg`, the run's settings with that agent: see
/// [`RunConfig::for_agent`]) and checks it: the exec-with-`--model` warning, the backend's own
/// refusal, the agent program on PATH (or at its path), an exec agent's script, the native
/// backend's API key variable; the backend's notices go to `out` as warnings. The one place
/// where an agent is built and checked: `ralph run`'s preflight (every agent of the run),
/// `ralph plan`/`convert` (each agent of the session, [`crate::ask::Asker`]) and `ralph doctor`
/// (each configured agent) call it. `names` says how errors name the settings (the primary's
/// flags, or a fallback's `[[agents]]` table).
///
/// # Errors
/// A misconfigured backend, a missing agent program, script or API key variable; each with the
/// fix.
pub fn build_checked(
    cfg: &RunConfig,
    paths: &RunPaths,
    names: &Names<'_>,
    out: &mut Outputs,
) -> anyhow::Result<CheckedAgent> {
    if cfg.agent == AgentKind::Exec && cfg.model.is_some() {
        out.warn(format!(
            "{} is not passed to an exec agent; put it in {} instead",
            names.setting("--model", "model"),
            names.setting("--agent-cmd", "agent_cmd")
        ));
    }
    // The local backend's server starts later (after the lock); its URL is not known yet.
    let backend = build_backend(cfg, paths, cfg.native.base_url.clone())?;
    let probe = check_agent_named(cfg, backend.as_ref(), &paths.repo_root, names)?;
    for notice in backend.notices() {
        out.warn(notice);
    }
    Ok(CheckedAgent { backend, probe })
}

/// The stories of `prd` that nothing but the agent's word can mark done: their `passes` is
/// `open` (`false`: the stories a run will take on; `true`: the ones already marked), they have
/// no `verify` of their own, and the run has no `--verify` for stories without one
/// (`default_verify`; a blank command counts as none). Ids in prd.json's order.
pub fn unchecked_stories(
    prd: &crate::prd::model::Prd,
    default_verify: Option<&str>,
    passes: bool,
) -> Vec<String> {
    let blank = |v: Option<&str>| v.is_none_or(|v| v.trim().is_empty());
    if !blank(default_verify) {
        return Vec::new();
    }
    prd.user_stories
        .iter()
        .filter(|s| s.passes == passes && blank(s.verify.as_deref()))
        .map(|s| s.id.clone())
        .collect()
}

/// `ids` for a sentence: all of them up to 10, else the first 10 and how many more.
pub fn id_list(ids: &[String]) -> String {
    const SHOWN: usize = 10;
    if ids.len() <= SHOWN {
        ids.join(", ")
    } else {
        format!(
            "{}, and {} more",
            ids[..SHOWN].join(", "),
            ids.len() - SHOWN
        )
    }
}

/// The run-start warning about the open stories ralph will take on the agent's word
/// ([`unchecked_stories`]), or `None` when every open story has a check.
pub fn unchecked_warning(
    prd: &crate::prd::model::Prd,
    default_verify: Option<&str>,
) -> Option<String> {
    let ids = unchecked_stories(prd, default_verify, false);
    if ids.is_empty() {
        return None;
    }
    let open = prd.user_stories.iter().filter(|s| !s.passes).count();
    let one = ids.len() == 1;
    Some(format!(
        "{} of {open} open {} {} no `verify` command ({}): ralph will take {} pass on the agent's \
         word; add a `verify` to {} in prd.json, or pass --verify CMD for every story without one",
        ids.len(),
        if open == 1 { "story" } else { "stories" },
        if one { "has" } else { "have" },
        id_list(&ids),
        if one { "its" } else { "their" },
        if one { "it" } else { "them" },
    ))
}

/// How an error about an agent names its settings: the primary agent's flags (and their
/// ralph.toml keys), or the keys of a fallback agent's `[[agents]]` table (the flags set the
/// primary's, so naming them would send the user to the wrong place).
#[derive(Debug, Clone, Copy)]
pub enum Names<'a> {
    /// The primary agent: `--agent-cmd (agent_cmd in ralph.toml)`.
    Primary,
    /// A fallback agent: `` `agent_cmd` in the [[agents]] table `cx` of /repo/ralph.toml ``;
    /// one named by its backend alone (no table yet): `` `agent_cmd` in a new [[agents]] table
    /// with name = "codex" in ralph.toml ``.
    Fallback {
        /// The agent's (and its table's) name.
        name: &'a str,
        /// The ralph.toml its `[[agents]]` table is in (`None`: it has no table).
        file: Option<&'a Path>,
    },
}

impl Names<'_> {
    /// The setting `flag`/`key` as the fix should name it.
    pub fn setting(&self, flag: &str, key: &str) -> String {
        match self {
            Names::Primary => format!("{flag} ({key} in ralph.toml)"),
            Names::Fallback {
                name,
                file: Some(file),
            } => format!(
                "`{key}` in the [[agents]] table `{name}` of {}",
                file.display()
            ),
            Names::Fallback { name, file: None } => format!(
                "`{key}` in a new [[agents]] table with name = \"{name}\" in ralph.toml (the fallback `{name}` is its backend's bare name, with no table of its own)"
            ),
        }
    }
}

/// The checks on the agent that need no run: the native backend's API key variable is set, and
/// the agent program exists (on PATH, or at its path). Returns the probe spec (the backend's
/// command for an empty prompt). Also used by `ralph plan` and `ralph convert`.
///
/// # Errors
/// A missing API key variable or agent program, each with the way to fix it.
pub fn check_agent(
    cfg: &RunConfig,
    backend: &dyn Backend,
    repo_root: &Path,
) -> anyhow::Result<crate::process::SpawnSpec> {
    check_agent_named(cfg, backend, repo_root, &Names::Primary)
}

/// [`check_agent`], its hints naming the settings as `names` says.
///
/// # Errors
/// As [`check_agent`].
fn check_agent_named(
    cfg: &RunConfig,
    backend: &dyn Backend,
    repo_root: &Path,
    names: &Names<'_>,
) -> anyhow::Result<crate::process::SpawnSpec> {
    if cfg.agent == AgentKind::Native {
        if let Some(var) = &cfg.native.api_key_env {
            if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                bail!(
                    "the API key variable {var} is not set\nhint: export {var}=<your key>, or name the variable that holds it with {}",
                    names.setting("--api-key-env VAR", "api_key_env")
                );
            }
        }
    }
    let probe = backend.command("")?;
    let info = backend.info();
    if let (AgentKind::Exec, Some(cmd)) = (cfg.agent, &cfg.agent_cmd) {
        if let Some(script) = crate::agent::exec::missing_script(cmd, repo_root) {
            bail!(
                "the agent script `{script}` of {} `{cmd}` does not exist (the agent runs in {})\nhint: fix {}: give the script's path relative to the repository root, or an absolute one",
                match names {
                    Names::Primary => "--agent-cmd",
                    Names::Fallback { .. } => "agent_cmd",
                },
                repo_root.display(),
                names.setting("--agent-cmd", "agent_cmd")
            );
        }
    }
    if which::which_in(&probe.program, std::env::var_os("PATH"), repo_root).is_err() {
        let place = if probe.program.components().count() > 1 {
            "does not exist or is not executable"
        } else {
            "was not found on PATH"
        };
        let how = match (cfg.agent, info.program, names) {
            (AgentKind::Exec, _, _) => format!("fix {}", names.setting("--agent-cmd", "agent_cmd")),
            (_, Some(_), Names::Primary) => format!(
                "{}, or point ralph at it with --agent-program PATH; `ralph doctor --agent {}` checks the setup, and `--agent local` runs a small local model with no account",
                info.install_hint,
                cfg.agent.as_str()
            ),
            (_, Some(_), Names::Fallback { .. }) => format!(
                "{}, or point ralph at it with {}",
                info.install_hint,
                names.setting("--agent-program", "agent_program")
            ),
            (_, None, _) => format!(
                "point ralph at it with {}",
                names.setting("--agent-program PATH", "agent_program")
            ),
        };
        bail!(
            "the agent program `{}` {place}\nhint: {how}",
            probe.program.display()
        );
    }
    Ok(probe)
}

/// The backend for `cfg`; `base_url` is the native/local API URL (for local: the server ralph
/// started, or the user's `--base-url`).
///
/// # Errors
/// The backend's own refusal (e.g. exec without `--agent-cmd`).
pub fn build_backend(
    cfg: &RunConfig,
    paths: &RunPaths,
    base_url: Option<String>,
) -> anyhow::Result<Box<dyn Backend>> {
    let native = matches!(cfg.agent, AgentKind::Native | AgentKind::Local).then(|| {
        let model = cfg
            .model
            .clone()
            .unwrap_or_else(|| cfg.native.local_model.pin().name.to_string());
        NativeSettings {
            provider: cfg.native.provider,
            base_url: base_url.unwrap_or_else(|| "http://127.0.0.1:0/v1".to_string()),
            api_key_env: cfg.native.api_key_env.clone(),
            price: cfg.native.prices.get(&model).copied(),
            model,
            max_steps: cfg.native.max_steps,
            max_tokens: cfg.native.max_tokens,
            context_window: cfg.native.context_window,
            temperature: cfg.native.temperature,
            seed: cfg.native.seed,
            tool_mode: cfg.native.tool_mode,
            stream: true,
            command_timeout_s: 120,
            repo_root: paths.repo_root.clone(),
            prd_path: paths.prd.clone(),
            progress_path: paths.progress.clone(),
            tools: cfg.native.tools.clone(),
            mark_protocol: cfg.agent == AgentKind::Local,
            verify: cfg.verify.clone(),
            verify_timeout_s: cfg.verify_timeout.as_secs().max(1),
            answer_schema: cfg.native.answer_schema.clone(),
        }
    });
    agent::backend(
        cfg.agent,
        AgentSettings {
            repo: paths.repo_root.clone(),
            model: cfg.model.clone(),
            agent_cmd: cfg.agent_cmd.clone(),
            program: cfg.agent_program.clone(),
            native,
            keep_api_key: cfg.keep_api_key,
        },
    )
}

/// The argv of `spec`, quoted so that it can be pasted into a shell.
pub fn shell_words(spec: &crate::process::SpawnSpec) -> String {
    let mut words = vec![spec.program.display().to_string()];
    words.extend(spec.args.iter().cloned());
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

/// What `cfg` asks of `--sandbox` (for [`agent::sandbox::build`]; `ask/` uses it too).
pub fn sandbox_ask(cfg: &RunConfig) -> agent::sandbox::SandboxAsk {
    agent::sandbox::SandboxAsk {
        mode: cfg.sandbox,
        allow_hosts: cfg.allow_hosts.clone(),
        base_url: cfg.native.base_url.clone(),
        api_key_env: cfg.native.api_key_env.clone(),
        writable: cfg.sandbox_writable.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unchecked_warning_counts_and_names_the_open_stories_without_a_check() {
        let story = |id: &str, passes: bool, verify: Option<&str>| {
            serde_json::json!({"id": id, "title": id, "acceptanceCriteria": ["x"], "priority": 1,
                "passes": passes, "verify": verify})
        };
        let prd = |stories: Vec<serde_json::Value>| -> crate::prd::model::Prd {
            serde_json::from_value(serde_json::json!({"project": "p", "userStories": stories}))
                .unwrap()
        };
        let two = prd(vec![
            story("US-001", false, None),
            story("US-002", false, Some("make test")),
            story("US-003", true, None),
        ]);
        assert_eq!(
            unchecked_warning(&two, None).unwrap(),
            "1 of 2 open stories has no `verify` command (US-001): ralph will take its pass on \
             the agent's word; add a `verify` to it in prd.json, or pass --verify CMD for every \
             story without one"
        );
        assert_eq!(unchecked_stories(&two, None, true), ["US-003"]);
        assert_eq!(unchecked_warning(&two, Some("make test")), None);
        assert!(unchecked_warning(&two, Some("  ")).is_some());
        let one = prd(vec![story("US-001", false, Some(" "))]);
        assert!(unchecked_warning(&one, None)
            .unwrap()
            .starts_with("1 of 1 open story has no `verify` command (US-001)"));
        let many: Vec<String> = (1..=12).map(|i| format!("US-{i:03}")).collect();
        assert_eq!(
            id_list(&many),
            "US-001, US-002, US-003, US-004, US-005, US-006, US-007, US-008, US-009, US-010, and \
             2 more"
        );
    }

    /// The keys ralph.toml takes at the top (`top`) or in an `[[agents]]` table: whether
    /// `key = "x"` parses there without an unknown-field error.
    fn is_key(key: &str, top: bool) -> bool {
        let text = if top {
            format!("{key} = \"x\"\n")
        } else {
            format!("[[agents]]\nname = \"t\"\n{key} = \"x\"\n")
        };
        match toml::from_str::<crate::config::FileConfig>(&text) {
            Ok(_) => true,
            Err(e) => !e.to_string().contains("unknown field"),
        }
    }

    /// Whether `[name]` (or `[[agents]]`) is a table of ralph.toml.
    fn is_table(name: &str) -> bool {
        let text = if name == "agents" {
            "[[agents]]\nname = \"t\"\n".to_owned()
        } else {
            format!("[{name}]\n")
        };
        match toml::from_str::<crate::config::FileConfig>(&text) {
            Ok(_) => true,
            Err(e) => !e.to_string().contains("unknown field"),
        }
    }

    /// Every ralph.toml key or table that a message in src/ names ("`KEY` in ralph.toml",
    /// "(KEY in ralph.toml)", "ralph.toml's `KEY`", "[TABLE] ... ralph.toml") exists: a hint
    /// never sends the user to a setting ralph does not read.
    #[test]
    fn every_ralph_toml_key_and_table_a_message_names_exists() {
        assert!(is_key("agent_cmd", true) && !is_key("agent_cmds", true));
        assert!(is_key("agent_program", false) && !is_key("fallback_agents", false));
        assert!(is_table("prices") && is_table("agents") && !is_table("codex"));
        let keys = [
            regex::Regex::new(r"`([a-z_]+)` in ralph\.toml").unwrap(),
            regex::Regex::new(r"(?:\(|\bor )([a-z_]+) in ralph\.toml").unwrap(),
            regex::Regex::new(r"ralph\.toml's `([a-z_]+)`").unwrap(),
        ];
        let tables = regex::Regex::new(r"\[\[?([a-z_]+)[\].]").unwrap();
        let mut wrong = Vec::new();
        let mut seen = 0;
        let mut stack = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    if !line.contains("ralph.toml") {
                        continue;
                    }
                    let at = format!("{}:{}", path.display(), n + 1);
                    for re in &keys {
                        for c in re.captures_iter(line) {
                            seen += 1;
                            if !is_key(&c[1], true) {
                                wrong.push(format!("{at}: key `{}`", &c[1]));
                            }
                        }
                    }
                    // Tables, in a string (a line with a quote) that names ralph.toml.
                    if line.contains('"') {
                        for c in tables.captures_iter(line) {
                            seen += 1;
                            if !is_table(&c[1]) {
                                wrong.push(format!("{at}: table [{}]", &c[1]));
                            }
                        }
                    }
                }
            }
        }
        assert!(seen > 20, "the scan found only {seen} names");
        assert!(
            wrong.is_empty(),
            "settings named that ralph.toml does not have:\n{}",
            wrong.join("\n")
        );
    }

    /// The keys the agent checks name exist where [`Names`] sends the user: ralph.toml's top
    /// level for the primary, the fallback's own `[[agents]]` table, or a new one for a fallback
    /// named by its backend alone (never "the [[agents]] table `codex`" that is not there).
    #[test]
    fn names_send_each_agent_to_a_setting_that_exists() {
        let file = std::path::Path::new("/repo/ralph.toml");
        for key in ["api_key_env", "agent_cmd", "agent_program", "model"] {
            assert!(is_key(key, true) && is_key(key, false), "{key}");
            let primary = Names::Primary.setting("--x", key);
            assert_eq!(primary, format!("--x ({key} in ralph.toml)"));
            let table = Names::Fallback {
                name: "cx",
                file: Some(file),
            }
            .setting("--x", key);
            assert_eq!(
                table,
                format!("`{key}` in the [[agents]] table `cx` of /repo/ralph.toml")
            );
            let bare = Names::Fallback {
                name: "codex",
                file: None,
            }
            .setting("--x", key);
            assert!(
                bare.starts_with(&format!(
                    "`{key}` in a new [[agents]] table with name = \"codex\""
                )),
                "{bare}"
            );
            assert!(!bare.contains("table `codex`"), "{bare}");
        }
    }
}
