//! Table-driven tests over the settings table ([`crate::cli::settings::SETTINGS`]): a setting
//! added to the table is tested without a line here. For each, a sample value is found (clap's possible values, else a few candidates)
//! that the flag takes and that changes the resolved configuration; then its `RALPH_*`
//! variable (in a child process, so that no other test sees it) and its ralph.toml key must
//! give exactly the same configuration, and an `[[agents]]` key must reach the fallback's
//! profile. Each declared default must be what resolution uses: writing it as the key (and the
//! flag) changes nothing, for an agent CLI and under each condition the default names.

use std::path::Path;

use clap::{ArgAction, CommandFactory, Parser};

use crate::cli::settings::{DefaultSpec, DefaultsFor, When, SETTINGS};
use crate::cli::{Cli, Command};
use crate::config::RunConfig;
use crate::protocol::{AgentKind, ProviderKind};

/// Values tried in turn for a flag with no possible values.
const CANDIDATES: &[&str] = &["7", "7m", "true", "codex"];
/// Values tried in turn for a key with no flag (TOML literals).
const KEY_CANDIDATES: &[&str] = &[
    "7",
    "\"7m\"",
    "\"7\"",
    "true",
    "[\"7\"]",
    "{ \"m\" = { input = 1.0, output = 2.0 } }",
    "{ usage_limit = [\"x\"] }",
    "{ command = \"x\" }",
    "[{ name = \"codex\" }]",
];
/// The child process's directory, when this test binary runs as [`env_probe`]'s child.
const PROBE_DIR: &str = "RALPH_SETTINGS_PROBE_DIR";

fn run_command() -> clap::Command {
    Cli::command()
        .find_subcommand("run")
        .expect("the run command")
        .clone()
}

/// The configuration `ralph run ARGV` resolves in `dir`, as text (its `Debug`).
fn with_flags(dir: &Path, argv: &[String]) -> Result<String, String> {
    let cli = Cli::try_parse_from(
        ["ralph", "run"]
            .into_iter()
            .map(String::from)
            .chain(argv.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    let Command::Run(args) = cli.command else {
        return Err("not run".into());
    };
    RunConfig::resolve(&args, dir)
        .map(|c| format!("{c:?}"))
        .map_err(|e| e.to_string())
}

/// The configuration with `toml` as `dir`'s ralph.toml and no flags.
fn with_toml(dir: &Path, toml: &str) -> Result<String, String> {
    std::fs::write(dir.join("ralph.toml"), toml).unwrap();
    let out = with_flags(dir, &[]);
    std::fs::write(dir.join("ralph.toml"), "").unwrap();
    out
}

/// The configuration `ralph run` resolves in `dir` with only `var=value` set in its
/// environment, read by a child process running [`env_probe`].
fn with_env(dir: &Path, var: &str, value: &str) -> Result<String, String> {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "config::settings_tests::env_probe",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("RALPH_")) {
        cmd.env_remove(k);
    }
    let out = cmd.env(PROBE_DIR, dir).env(var, value).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        // The harness prints the test's name on the same line first.
        .find_map(|l| l.split_once("RESOLVED:").map(|(_, rest)| rest))
        .map(|l| match l.strip_prefix("ERR:") {
            Some(e) => Err(e.to_owned()),
            None => Ok(l.to_owned()),
        })
        .unwrap_or_else(|| Err(format!("the probe printed nothing: {stdout}")))
}

/// The child side of [`with_env`]: does nothing unless started by it.
#[test]
fn env_probe() {
    let Some(dir) = std::env::var_os(PROBE_DIR) else {
        return;
    };
    match RunConfig::resolve_here(Path::new(&dir)) {
        Ok(c) => println!("RESOLVED:{c:?}"),
        Err(e) => println!("RESOLVED:ERR:{}", e.to_string().replace('\n', " ")),
    }
}

/// A sample for `arg`: the command-line words, the value for its variable, and the TOML
/// literals to try for its key; the first one the flag takes and that changes the
/// configuration.
fn sample(dir: &Path, arg: &clap::Arg, default: &str) -> (Vec<String>, String, Vec<String>) {
    let long = format!("--{}", arg.get_long().expect("a long flag"));
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return (vec![long], "true".into(), vec!["true".into()]);
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .rev()
        .map(|v| v.get_name().to_owned())
        .collect();
    let values = if possible.is_empty() {
        CANDIDATES.iter().map(|s| s.to_string()).collect()
    } else {
        possible
    };
    for v in values {
        let words = vec![long.clone(), v.clone()];
        if with_flags(dir, &words).is_ok_and(|c| c != default) {
            // A boolish value (`1`, `yes`) is a TOML boolean.
            let literals = vec![
                v.clone(),
                format!("{v:?}"),
                format!("[{v:?}]"),
                "true".into(),
            ];
            return (words, v, literals);
        }
    }
    panic!("no sample value of {long} changes the resolved configuration");
}

#[test]
fn every_flag_variable_and_key_reaches_the_resolved_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("ralph.toml"), "").unwrap();
    let default = with_flags(dir, &[]).unwrap();
    let cmd = run_command();
    let mut checked = 0;
    for setting in SETTINGS {
        let (Some(key), Some(id)) = (setting.key, setting.arg) else {
            continue;
        };
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("`{id}` is no argument of `ralph run`"));
        let (words, env_value, literals) = sample(dir, arg, &default);
        let by_flag = with_flags(dir, &words).unwrap();
        let by_key = literals
            .iter()
            .map(|l| with_toml(dir, &format!("{key} = {l}\n")))
            .find(|c| c.as_ref() == Ok(&by_flag));
        assert!(
            by_key.is_some(),
            "ralph.toml's `{key}` does not give what {words:?} gives"
        );
        if let Some(var) = arg.get_env() {
            let var = var.to_string_lossy();
            assert_eq!(
                with_env(dir, &var, &env_value),
                Ok(by_flag.clone()),
                "{var}={env_value} does not give what {words:?} gives"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 30,
        "only {checked} settings with a flag and a key"
    );
}

#[test]
fn every_key_without_a_flag_reaches_the_resolved_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("ralph.toml"), "").unwrap();
    let default = with_flags(dir, &[]).unwrap();
    for setting in SETTINGS.iter().filter(|s| s.arg.is_none()) {
        let key = setting.key.expect("a key");
        let reached = KEY_CANDIDATES
            .iter()
            .any(|l| with_toml(dir, &format!("{key} = {l}\n")).is_ok_and(|c| c != default));
        assert!(
            reached,
            "no value of ralph.toml's `{key}` changes the configuration"
        );
    }
}

#[test]
fn every_agent_key_reaches_the_fallback_agents_profile() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("ralph.toml"), "").unwrap();
    let table = "[[agents]]\nname = \"b\"\nagent = \"codex\"\n";
    let without = with_toml(dir, table);
    for setting in SETTINGS.iter().filter(|s| s.agent) {
        let key = setting.key.expect("a key");
        let head = match key {
            // The backend itself: a table named after none, so that only the key sets it.
            "agent" => "[[agents]]\nname = \"b\"\n",
            _ => table,
        };
        let mut literals: Vec<String> = KEY_CANDIDATES.iter().map(|s| s.to_string()).collect();
        literals.extend(["\"gemini\"", "\"json\"", "\"anthropic\"", "\"small\""].map(String::from));
        let reached = literals.iter().any(|l| {
            let toml = format!("{head}{key} = {l}\n");
            with_toml(dir, &toml).is_ok_and(|c| Ok(&c) != without.as_ref())
        });
        assert!(
            reached,
            "no value of `{key}` in an [[agents]] table changes that agent"
        );
    }
}

#[test]
fn flags_and_keys_are_declared_once() {
    let mut keys: Vec<&str> = SETTINGS.iter().filter_map(|s| s.key).collect();
    let mut args: Vec<&str> = SETTINGS.iter().filter_map(|s| s.arg).collect();
    let (k, a) = (keys.len(), args.len());
    keys.sort_unstable();
    keys.dedup();
    args.sort_unstable();
    args.dedup();
    assert_eq!(
        (keys.len(), args.len()),
        (k, a),
        "a key or a flag is declared twice"
    );
}

/// Where a default is checked: the flags (or the variable) that make conditions hold, and
/// those conditions.
struct Context {
    name: &'static str,
    flags: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
    holds: &'static [When],
}

impl Context {
    /// The default `spec` declares here: the last condition that holds, else the base.
    fn expected(&self, spec: &DefaultSpec) -> Option<&'static str> {
        match spec.when.iter().rev().find(|(w, _)| self.holds.contains(w)) {
            Some((_, value)) => *value,
            None => spec.base,
        }
    }
}

/// The contexts a default is checked in: an agent CLI and `--agent local` always, and the one
/// of each condition it names.
fn contexts(when: &[(When, Option<&'static str>)]) -> Vec<Context> {
    let mut out = vec![
        Context {
            name: "an agent CLI",
            flags: &[],
            env: None,
            holds: &[],
        },
        Context {
            name: "--agent local",
            flags: &["--agent", "local"],
            env: None,
            holds: &[When::Local],
        },
    ];
    for (w, _) in when {
        out.push(match w {
            When::Local => continue,
            When::LocalSmall => Context {
                name: "--agent local --local-model small",
                flags: &["--agent", "local", "--local-model", "small"],
                env: None,
                holds: &[When::Local, When::LocalSmall],
            },
            When::Anthropic => Context {
                name: "--agent native --provider anthropic",
                flags: &[
                    "--agent",
                    "native",
                    "--model",
                    "m",
                    "--provider",
                    "anthropic",
                ],
                env: None,
                holds: &[When::Anthropic],
            },
            When::GithubActions => Context {
                name: "GITHUB_ACTIONS=true",
                flags: &[],
                env: Some(("GITHUB_ACTIONS", "true")),
                holds: &[When::GithubActions],
            },
        });
    }
    out
}

/// The configuration in `cx` with `toml` as ralph.toml and `extra` flags.
fn in_context(dir: &Path, cx: &Context, toml: &str, extra: &[String]) -> Result<String, String> {
    std::fs::write(dir.join("ralph.toml"), toml).unwrap();
    let out = match cx.env {
        // The variable is read only by a child process, as for the `RALPH_*` variables.
        Some((var, value)) => with_env(dir, var, value),
        None => {
            let argv: Vec<String> = cx.flags.iter().map(|s| s.to_string()).collect();
            with_flags(dir, &[argv, extra.to_vec()].concat())
        }
    };
    std::fs::write(dir.join("ralph.toml"), "").unwrap();
    out
}

#[test]
fn every_declared_default_is_what_resolution_uses() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let cmd = run_command();
    let mut checked = 0;
    for setting in SETTINGS {
        let (Some(key), Some(spec)) = (setting.key, setting.default) else {
            continue;
        };
        for cx in contexts(spec.when) {
            let unset = in_context(dir, &cx, "", &[]).unwrap();
            // `none`: nothing to write; the other tests show a value of the key changes it.
            let Some(text) = cx.expected(&spec) else {
                continue;
            };
            // The default as a TOML value: a number or boolean, a string, or a list.
            let items: Vec<String> = text.split(',').map(|i| format!("{i:?}")).collect();
            let literals = [
                text.to_owned(),
                format!("{text:?}"),
                format!("[{}]", items.join(", ")),
            ];
            let by_key = literals
                .iter()
                .map(|l| in_context(dir, &cx, &format!("{key} = {l}\n"), &[]))
                .find(|c| c.is_ok());
            assert_eq!(
                by_key,
                Some(Ok(unset.clone())),
                "{}: `{key} = {text}` in ralph.toml is not the default (`{key}` declares {text:?})",
                cx.name
            );
            // The flag too, where it has one and the context does not set it already.
            let flag = setting
                .arg
                .and_then(|id| cmd.get_arguments().find(|a| a.get_id() == id))
                .and_then(|a| a.get_long())
                .map(|l| format!("--{l}"));
            if let Some(flag) = flag.filter(|f| cx.env.is_none() && !cx.flags.contains(&f.as_str()))
            {
                assert_eq!(
                    in_context(dir, &cx, "", &[flag.clone(), text.to_owned()]),
                    Ok(unset.clone()),
                    "{}: `{flag} {text}` is not the default",
                    cx.name
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 60, "only {checked} defaults checked");
}

#[test]
fn run_help_shows_every_declared_default() {
    let cmd = run_command();
    for setting in SETTINGS {
        let (Some(id), Some(spec)) = (setting.arg, setting.default) else {
            continue;
        };
        let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let base = spec.base.unwrap_or("none");
        assert!(
            help.contains(&format!("[default: {base}")),
            "--{}'s help does not show its default {base}: {help}",
            arg.get_long().unwrap_or(id)
        );
        for (_, value) in spec.when {
            assert!(
                help.contains(&format!(": {}", value.unwrap_or("none"))),
                "--{}'s help does not show the default {value:?}: {help}",
                arg.get_long().unwrap_or(id)
            );
        }
    }
}

#[test]
fn the_conditions_hold_where_the_tests_say() {
    let cli = DefaultsFor::base();
    let local = DefaultsFor {
        agent: AgentKind::Local,
        ..cli
    };
    let small = DefaultsFor {
        local_model: crate::local::BuiltinModel::Small,
        ..local
    };
    let anthropic = DefaultsFor {
        agent: AgentKind::Native,
        provider: ProviderKind::Anthropic,
        ..cli
    };
    for (d, holds) in [
        (cli, vec![]),
        (local, vec![When::Local]),
        (small, vec![When::Local, When::LocalSmall]),
        (anthropic, vec![When::Anthropic]),
        // local speaks openai whatever --provider says.
        (
            DefaultsFor {
                provider: ProviderKind::Anthropic,
                ..local
            },
            vec![When::Local],
        ),
    ] {
        for w in [When::Local, When::LocalSmall, When::Anthropic] {
            assert_eq!(d.holds(w), holds.contains(&w), "{w:?} for {d:?}");
        }
    }
}

#[test]
fn the_ralph_toml_that_init_writes_shows_the_declared_defaults() {
    // templates/ralph.toml documents each key as `# key = value`, the value being the default
    // where the key has one (an example otherwise).
    let template = include_str!("../../templates/ralph.toml");
    let mut checked = 0;
    for setting in SETTINGS {
        let (Some(key), Some(base)) = (setting.key, setting.default.and_then(|d| d.base)) else {
            continue;
        };
        let prefix = format!("# {key} = ");
        let Some(shown) = template
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
        else {
            continue;
        };
        // A comment may follow the value (`provider = "openai"  # or "anthropic"`).
        let shown = shown.split(" #").next().unwrap_or_default().trim();
        let items: Vec<String> = base.split(',').map(|i| format!("{i:?}")).collect();
        let forms = [
            base.to_owned(),
            format!("{base:?}"),
            format!("[{}]", items.join(", ")),
        ];
        assert!(
            forms.iter().any(|f| f == shown),
            "templates/ralph.toml shows `{key} = {shown}`, the settings table declares {base:?}"
        );
        checked += 1;
    }
    assert!(
        checked >= 20,
        "only {checked} defaults found in templates/ralph.toml"
    );
}
