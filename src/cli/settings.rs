//! Every setting of `ralph run` (and of the agent sessions of `ralph plan` and `ralph convert`),
//! declared once: one entry of the [`settings!`] table below gives a setting's flag and
//! `RALPH_*` variable (clap attributes), its help (the doc comment), its ralph.toml key and type,
//! and whether an `[[agents]]` table may set it. From the one table the macro writes the clap
//! structs ([`RunArgs`], [`AgentArgs`]), the ralph.toml structs ([`FileConfig`], [`AgentTable`])
//! and [`SETTINGS`], the list the table-driven tests walk (every flag, variable and key must reach
//! the resolved [`crate::config::RunConfig`]). Defaults and checks live in the named steps of
//! [`crate::config::RunConfig::resolve`]; the precedence is flag > `RALPH_*` > ralph.toml > default
//! (clap merges the first two).
//!
//! Entry forms (`{ … }` holds the clap attributes, or serde's for a key alone):
//! - `agent NAME: FLAG_TYPE { #[arg(…)] } => KEY_TYPE;` an agent flag (in [`AgentArgs`], shared
//!   by `run`, `plan` and `convert`), the top-level key `NAME` and the `[[agents]]` key `NAME`;
//! - `both NAME: FLAG_TYPE { #[arg(…)] } => KEY: KEY_TYPE;` a `ralph run` flag and the key `KEY`;
//! - `table NAME: …` as `both`, and also an `[[agents]]` key;
//! - `shared NAME: …` as `both`, and also a flag of `plan` and `convert` ([`SessionArgs`]);
//! - `flag NAME: TYPE { #[arg(…)] };` a flag with no key (`--json`, `--config`); `session` the
//!   same for [`SessionArgs`] (its `--timeout` is one session's, with no variable);
//! - `key KEY: TYPE { #[serde(…)] };` a key with no flag; `table_key` also an `[[agents]]` key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::NotifyFlags;
use crate::protocol::{AgentKind, PrdGuard, Price, ProviderKind, ToolMode};

/// ralph.toml's `push`: `push = true` (the remote `origin`), `push = "upstream"`, or `false`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum PushSetting {
    /// `true`: push to `origin`; `false`: do not push.
    On(bool),
    /// Push to this remote.
    Remote(String),
}

/// One declared setting, as [`SETTINGS`] lists it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    /// Its ralph.toml key (`None`: a flag alone).
    pub key: Option<&'static str>,
    /// Its clap argument's id, the field of [`RunArgs`] or [`AgentArgs`] (`None`: a key alone).
    /// The flag and the `RALPH_*` variable are clap's (`--max-iter`, `RALPH_MAX_ITER`).
    pub arg: Option<&'static str>,
    /// An `[[agents]]` table may set it too.
    pub agent: bool,
    /// Its built-in default (`None`: it declares none; the setting is unset, or off for a
    /// switch).
    pub default: Option<DefaultSpec>,
}

/// A condition under which a setting's built-in default differs (`local`, `local_small`,
/// `anthropic`, `github_actions` in the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The agent is `local` (ralph's own built-in model).
    Local,
    /// The agent is `local` and serves the small built-in model (`--local-model small`).
    LocalSmall,
    /// The native API is Anthropic's (`--provider anthropic`, not for `local`).
    Anthropic,
    /// ralph runs under GitHub Actions (`GITHUB_ACTIONS=true` in its environment).
    GithubActions,
}

/// One setting's built-in default, as its `default(…)` clause declares it: the value of the
/// last condition of `when` that holds (a later, narrower one overrides), else `base`. A value is the text a user would write
/// for the flag or key (`"30m"`, `"5"`, `"json"`), parsed by [`DefaultValue`]; `None` is "unset".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultSpec {
    /// The value when no condition holds.
    pub base: Option<&'static str>,
    /// The conditions, in the table's order; the last that holds wins.
    pub when: &'static [(When, Option<&'static str>)],
}

/// What the defaults depend on: the resolved agent, built-in model and API (and, read when
/// asked, the environment's `GITHUB_ACTIONS`). Its accessors, one per setting with a default
/// and named after its ralph.toml key, are written by the settings table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultsFor {
    /// The agent backend.
    pub agent: AgentKind,
    /// `--agent local`'s built-in model.
    pub local_model: crate::local::BuiltinModel,
    /// The native API's wire format.
    pub provider: ProviderKind,
}

impl DefaultsFor {
    /// The defaults with the default agent, model and API (the `agent`, `local_model` and
    /// `provider` entries' defaults, which depend on nothing): no condition holds but
    /// `github_actions`.
    pub fn base() -> DefaultsFor {
        fn plain<T: DefaultValue>(key: &str) -> T {
            let text = SETTINGS
                .iter()
                .find(|s| s.key == Some(key))
                .and_then(|s| s.default)
                .and_then(|d| d.base)
                .unwrap_or_else(|| bad_default(key, "", "the table declares none"));
            T::from_default(key, text)
        }
        DefaultsFor {
            agent: plain("agent"),
            local_model: plain("local_model"),
            provider: plain("provider"),
        }
    }

    /// Whether `when` holds here.
    pub fn holds(&self, when: When) -> bool {
        let local = self.agent == AgentKind::Local;
        match when {
            When::Local => local,
            When::LocalSmall => local && self.local_model == crate::local::BuiltinModel::Small,
            When::Anthropic => !local && self.provider == ProviderKind::Anthropic,
            When::GithubActions => std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true"),
        }
    }

    /// The text of `spec`'s value here (`None`: unset).
    pub fn text(&self, spec: &DefaultSpec) -> Option<&'static str> {
        match spec.when.iter().rev().find(|(when, _)| self.holds(*when)) {
            Some((_, value)) => *value,
            None => spec.base,
        }
    }
}

/// A resolved setting's type, read from a default's text in the settings table. The texts are
/// the table's own, so a text that does not parse is a defect of the table, caught by the
/// table-driven tests (`config::settings_tests`); it panics naming the key.
pub trait DefaultValue: Sized {
    /// `text` (the default of the ralph.toml key `key`) as this type.
    fn from_default(key: &str, text: &str) -> Self;
}

/// The panic of a default's text that does not parse.
fn bad_default(key: &str, text: &str, why: impl std::fmt::Display) -> ! {
    panic!("the settings table's default {text:?} of `{key}` does not parse: {why}")
}

/// [`DefaultValue`] by [`std::str::FromStr`].
macro_rules! default_by_parse {
    ($($t:ty),*) => {$(
        impl DefaultValue for $t {
            fn from_default(key: &str, text: &str) -> Self {
                text.parse().unwrap_or_else(|e| bad_default(key, text, e))
            }
        }
    )*};
}
default_by_parse!(u32, u64, usize, f32, f64, bool, String, PathBuf);

/// [`DefaultValue`] by the value names clap shows (`--agent local`).
macro_rules! default_by_value_enum {
    ($($t:ty),*) => {$(
        impl DefaultValue for $t {
            fn from_default(key: &str, text: &str) -> Self {
                <$t as clap::ValueEnum>::from_str(text, false).unwrap_or_else(|e| bad_default(key, text, e))
            }
        }
    )*};
}
default_by_value_enum!(
    AgentKind,
    ProviderKind,
    ToolMode,
    PrdGuard,
    crate::protocol::BudgetScope,
    crate::protocol::SandboxMode,
    crate::local::BuiltinModel
);

impl DefaultValue for Duration {
    /// humantime's syntax, as the flags and keys (`"30m"`).
    fn from_default(key: &str, text: &str) -> Self {
        humantime::parse_duration(text).unwrap_or_else(|e| bad_default(key, text, e))
    }
}

impl DefaultValue for Vec<String> {
    /// A comma-separated list, as the `RALPH_*` variables of repeatable flags.
    fn from_default(_key: &str, text: &str) -> Self {
        text.split(',').map(|s| s.trim().to_owned()).collect()
    }
}

/// Writes the structs of the settings table; see the module docs for the entry forms.
macro_rules! settings {
    // Done: write the structs.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($dkey:ident ($($dd:tt)*))*]) => {
        /// Arguments of `ralph run`. Every option also reads a `RALPH_*` variable; flags win over
        /// the environment, which wins over `ralph.toml`, which wins over the built-in defaults.
        /// Declared in the settings table ([`crate::cli::settings`]).
        #[derive(Debug, clap::Args, Default)]
        pub struct RunArgs { $($run)* }

        /// How `ralph plan` and `ralph convert` run their agent session: the `ralph run`
        /// options that choose and configure the backend (same flags, `RALPH_*` variables and
        /// ralph.toml keys). Declared in the settings table ([`crate::cli::settings`]).
        #[derive(Debug, clap::Args, Default, Clone)]
        pub struct SessionArgs { $($session)* }

        /// The options that choose and configure the agent, one definition shared by `ralph
        /// run`, `ralph plan` and `ralph convert` (each also reads its `RALPH_*` variable and,
        /// through [`crate::config::RunConfig::resolve`], its ralph.toml key). Declared in the
        /// settings table ([`crate::cli::settings`]).
        #[derive(Debug, clap::Args, Default, Clone)]
        pub struct AgentArgs { $($agent)* }

        /// `ralph.toml`, as written by the user. Every key is optional; unknown keys are an
        /// error so that a typo does not silently fall back to a default. Declared in the
        /// settings table ([`crate::cli::settings`]).
        #[derive(Debug, Default, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct FileConfig { $($file)* }

        /// One `[[agents]]` table of ralph.toml: a named agent with its own settings (the agent
        /// keys of the top level). Unknown keys are an error. Declared in the settings table
        /// ([`crate::cli::settings`]).
        #[derive(Debug, Default, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct AgentTable {
            /// The name `fallback_agents` and `--fallback-agent` use.
            pub name: String,
            $($table)*
        }

        impl AgentTable {
            /// This table's keys as a ralph.toml of their own (every other key unset).
            pub fn keys(&self) -> FileConfig {
                FileConfig {
                    $($tkeys: self.$tkeys.clone(),)*
                    ..FileConfig::default()
                }
            }
        }

        /// Every declared setting, in the table's order.
        pub const SETTINGS: &[Setting] = &[$($meta)*];

        /// The built-in default of each setting that declares one, by its ralph.toml key, as
        /// the table declares it (`T` is the resolved type: `u32`, [`Duration`], an enum, …).
        /// A setting whose every default is a value returns `T`; one with a `none` returns
        /// `Option<T>`.
        impl DefaultsFor {
            $(default_method!($dkey; $($dd)*);)*
        }
    };
    // An agent flag: AgentArgs, the top-level key and the [[agents]] key.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        $(#[doc = $doc:literal])* agent $name:ident : $fty:ty { $(#[$c:meta])* } => $kty:ty $(, default($($def:tt)*))? ; $($rest:tt)*) => {
        settings!(@munch
            [$($run)*]
            [$($agent)* $(#[doc = $doc])* #[arg(help = arg_help!([$($doc)*] [$($($def)*)?]))] $(#[$c])* pub $name: $fty,]
            [$($session)*]
            [$($file)* $(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? pub $name: $kty,]
            [$($table)* $(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? pub $name: $kty,]
            [$($tkeys)* $name]
            [$($meta)* Setting { key: Some(stringify!($name)), arg: Some(stringify!($name)), agent: true, default: opt_default!($($($def)*)?) },]
            [$($defs)* $($name ($($def)*))?]
            $($rest)*);
    };
    // A flag with a ralph.toml key (`both`: a `ralph run` flag; `table`: one an [[agents]]
    // table has too; `shared`: one `ralph plan` and `ralph convert` have too): its pieces (the
    // flag, the key's field, the key, its `Setting` but `agent`, its default), which `@keyed`
    // puts where its kind goes.
    (@munch $run:tt $agent:tt $session:tt $file:tt $table:tt $tkeys:tt $meta:tt $defs:tt
        $(#[doc = $doc:literal])* $kind:ident $name:ident : $fty:ty { $(#[$c:meta])* } => $key:ident : $kty:ty $(, default($($def:tt)*))? ; $($rest:tt)*) => {
        settings!(@keyed $kind $run $agent $session $file $table $tkeys $meta $defs
            [$(#[doc = $doc])* #[arg(help = arg_help!([$($doc)*] [$($($def)*)?]))] $(#[$c])* pub $name: $fty,]
            [$(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? pub $key: $kty,]
            [$key]
            [key: Some(stringify!($key)), arg: Some(stringify!($name)), default: opt_default!($($($def)*)?)]
            [$($key ($($def)*))?]
            $($rest)*);
    };
    (@keyed both [$($run:tt)*] $agent:tt $session:tt [$($file:tt)*] $table:tt $tkeys:tt [$($meta:tt)*] [$($defs:tt)*]
        [$($flag:tt)*] [$($field:tt)*] [$key:ident] [$($setting:tt)*] [$($def:tt)*] $($rest:tt)*) => {
        settings!(@munch [$($run)* $($flag)*] $agent $session [$($file)* $($field)*] $table $tkeys
            [$($meta)* Setting { $($setting)*, agent: false },] [$($defs)* $($def)*] $($rest)*);
    };
    (@keyed table [$($run:tt)*] $agent:tt $session:tt [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        [$($flag:tt)*] [$($field:tt)*] [$key:ident] [$($setting:tt)*] [$($def:tt)*] $($rest:tt)*) => {
        settings!(@munch [$($run)* $($flag)*] $agent $session [$($file)* $($field)*] [$($table)* $($field)*] [$($tkeys)* $key]
            [$($meta)* Setting { $($setting)*, agent: true },] [$($defs)* $($def)*] $($rest)*);
    };
    (@keyed shared [$($run:tt)*] $agent:tt [$($session:tt)*] [$($file:tt)*] $table:tt $tkeys:tt [$($meta:tt)*] [$($defs:tt)*]
        [$($flag:tt)*] [$($field:tt)*] [$key:ident] [$($setting:tt)*] [$($def:tt)*] $($rest:tt)*) => {
        settings!(@munch [$($run)* $($flag)*] $agent [$($session)* $($flag)*] [$($file)* $($field)*] $table $tkeys
            [$($meta)* Setting { $($setting)*, agent: false },] [$($defs)* $($def)*] $($rest)*);
    };
    // A flag alone.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        $(#[doc = $doc:literal])* flag $name:ident : $fty:ty { $(#[$c:meta])* } ; $($rest:tt)*) => {
        settings!(@munch
            [$($run)* $(#[doc = $doc])* $(#[$c])* pub $name: $fty,]
            [$($agent)*]
            [$($session)*]
            [$($file)*]
            [$($table)*]
            [$($tkeys)*]
            [$($meta)* Setting { key: None, arg: Some(stringify!($name)), agent: false, default: None },]
            [$($defs)*]
            $($rest)*);
    };
    // A key alone.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        $(#[doc = $doc:literal])* key $key:ident : $kty:ty { $(#[$s:meta])* } $(, default($($def:tt)*))? ; $($rest:tt)*) => {
        settings!(@munch
            [$($run)*]
            [$($agent)*]
            [$($session)*]
            [$($file)* $(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? $(#[$s])* pub $key: $kty,]
            [$($table)*]
            [$($tkeys)*]
            [$($meta)* Setting { key: Some(stringify!($key)), arg: None, agent: false, default: opt_default!($($($def)*)?) },]
            [$($defs)* $($key ($($def)*))?]
            $($rest)*);
    };
    // A key alone, also an [[agents]] key.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        $(#[doc = $doc:literal])* table_key $key:ident : $kty:ty { $(#[$s:meta])* } $(, default($($def:tt)*))? ; $($rest:tt)*) => {
        settings!(@munch
            [$($run)*]
            [$($agent)*]
            [$($session)*]
            [$($file)* $(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? $(#[$s])* pub $key: $kty,]
            [$($table)* $(#[doc = $doc])* $(#[doc = default_help!($($def)*)])? $(#[$s])* pub $key: $kty,]
            [$($tkeys)* $key]
            [$($meta)* Setting { key: Some(stringify!($key)), arg: None, agent: true, default: opt_default!($($($def)*)?) },]
            [$($defs)* $($key ($($def)*))?]
            $($rest)*);
    };
    // A flag of `ralph plan` and `ralph convert` alone.
    (@munch [$($run:tt)*] [$($agent:tt)*] [$($session:tt)*] [$($file:tt)*] [$($table:tt)*] [$($tkeys:ident)*] [$($meta:tt)*] [$($defs:tt)*]
        $(#[doc = $doc:literal])* session $name:ident : $fty:ty { $(#[$c:meta])* } ; $($rest:tt)*) => {
        settings!(@munch
            [$($run)*]
            [$($agent)*]
            [$($session)* $(#[doc = $doc])* $(#[$c])* pub $name: $fty,]
            [$($file)*]
            [$($table)*]
            [$($tkeys)*]
            [$($meta)*]
            [$($defs)*]
            $($rest)*);
    };
    ($($entries:tt)*) => {
        settings!(@munch [] [] [] [] [] [] [] [] $($entries)*);
    };
}

/// A condition of a `default(…)` clause, by its name in the table.
macro_rules! when {
    (local) => {
        When::Local
    };
    (local_small) => {
        When::LocalSmall
    };
    (anthropic) => {
        When::Anthropic
    };
    (github_actions) => {
        When::GithubActions
    };
}

/// A condition as `--help` names it.
macro_rules! when_label {
    (local) => {
        "--agent local"
    };
    (local_small) => {
        "--local-model small"
    };
    (anthropic) => {
        "--provider anthropic"
    };
    (github_actions) => {
        "under GitHub Actions"
    };
}

/// One value of a `default(…)` clause: a literal, or `none`.
macro_rules! default_text {
    (none) => {
        None
    };
    ($lit:literal) => {
        Some($lit)
    };
}

/// One value of a `default(…)` clause as `--help` shows it.
macro_rules! default_shown {
    (none) => {
        "none"
    };
    ($lit:literal) => {
        $lit
    };
}

/// A `default(…)` clause as a [`DefaultSpec`].
macro_rules! default_spec {
    ($base:tt $(, $cond:ident $val:tt)*) => {
        DefaultSpec {
            base: default_text!($base),
            when: &[$((when!($cond), default_text!($val))),*],
        }
    };
}

/// `Some(DefaultSpec)` for a `default(…)` clause, `None` without one.
macro_rules! opt_default {
    () => {
        None
    };
    ($($def:tt)+) => {
        Some(default_spec!($($def)+))
    };
}

/// A `default(…)` clause as the line `--help` and the key's docs end with: clap's
/// `[default: 3]`, with each condition (`[default: 3; --agent local: 5]`).
macro_rules! default_help {
    ($base:tt $(, $cond:ident $val:tt)*) => {
        concat!("[default: ", default_shown!($base) $(, "; ", when_label!($cond), ": ", default_shown!($val))*, "]")
    };
}

/// The short help of a flag: what clap makes of its doc comment (the first paragraph, its
/// lines joined, without a final period), then its default as clap shows one
/// (`[default: 3]`).
macro_rules! arg_help {
    ([$($doc:literal)*] []) => {
        help_text(&[$($doc),*], None)
    };
    ([$($doc:literal)*] [$($def:tt)+]) => {
        help_text(&[$($doc),*], Some(default_help!($($def)+)))
    };
}

/// A flag's short help from its doc comment's lines `doc` (as clap's derive reads them: the
/// first paragraph, each line trimmed, joined by spaces, a final `.` dropped), followed by
/// `default` (`[default: 3]`) when the table declares one.
pub fn help_text(doc: &[&str], default: Option<&str>) -> String {
    let mut text = doc
        .iter()
        .map(|line| line.trim())
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if text.ends_with('.') && !text.ends_with("..") {
        text.pop();
    }
    if let Some(default) = default {
        text.push(' ');
        text.push_str(default);
    }
    text
}

/// `ralph plan --timeout`'s help: one session's limit, whose default is `ralph run`'s
/// (`timeout` in the table).
fn session_timeout_help() -> String {
    let default = format!("[default: {}]", DefaultsFor::base().timeout::<String>());
    help_text(
        &["Wall-clock limit of one agent session, e.g. `10m` (else ralph.toml's `timeout`)"],
        Some(&default),
    )
}

/// The accessor of one setting's default in [`DefaultsFor`]: `T` when every value of its clause
/// is a literal, `Option<T>` when one is `none`.
macro_rules! default_method {
    ($key:ident; $base:literal $(, $cond:ident $val:literal)*) => {
        #[doc = concat!("`", stringify!($key), "`'s default here.")]
        pub fn $key<T: DefaultValue>(&self) -> T {
            T::from_default(stringify!($key), self.text(&default_spec!($base $(, $cond $val)*)).unwrap_or($base))
        }
    };
    ($key:ident; $($def:tt)*) => {
        #[doc = concat!("`", stringify!($key), "`'s default here (`None`: the setting is unset).")]
        pub fn $key<T: DefaultValue>(&self) -> Option<T> {
            self.text(&default_spec!($($def)*)).map(|text| T::from_default(stringify!($key), text))
        }
    };
}

settings! {
    /// The PRD file (relative: to the directory ralph runs in). Its directory must be inside a
    /// git repository.
    both prd: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_PRD")] } => prd: Option<PathBuf>, default("prd.json");
    /// Agent backend.
    agent agent: Option<AgentKind> { #[arg(long, value_enum, env = "RALPH_AGENT")] } => Option<AgentKind>, default("claude");
    /// Command line for `--agent exec`, split into words without a shell (e.g. "my-agent --flag").
    agent agent_cmd: Option<String> { #[arg(long, value_name = "CMD", env = "RALPH_AGENT_CMD")] } => Option<String>;
    /// Model name passed to the agent (e.g. `sonnet`).
    agent model: Option<String> { #[arg(long, env = "RALPH_MODEL")] } => Option<String>;
    /// Path to the agent CLI, when it is not on PATH under its usual name (e.g. `claude`).
    agent agent_program: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_AGENT_PROGRAM")] } => Option<PathBuf>;
    /// native: the API's wire format (openai: Chat Completions; local always speaks openai).
    agent provider: Option<crate::protocol::ProviderKind> { #[arg(long, value_enum, env = "RALPH_PROVIDER")] } => Option<ProviderKind>, default("openai");
    /// native/local: the API base URL (openai: including /v1), e.g. http://127.0.0.1:11434/v1.
    agent base_url: Option<String> { #[arg(long, value_name = "URL", env = "RALPH_BASE_URL")] } => Option<String>,
        default("https://api.openai.com/v1", local none, anthropic "https://api.anthropic.com");
    /// native: the environment variable holding the API key.
    agent api_key_env: Option<String> { #[arg(long, value_name = "VAR", env = "RALPH_API_KEY_ENV")] } => Option<String>,
        default("OPENAI_API_KEY", local none, anthropic "ANTHROPIC_API_KEY");
    /// local: which built-in model to serve: `default` (Qwen2.5-Coder-1.5B, about 2 GB of RAM)
    /// or `small` (Qwen2.5-Coder-0.5B: faster, weaker).
    agent local_model: Option<crate::local::BuiltinModel> { #[arg(long, value_enum, value_name = "MODEL", env = "RALPH_LOCAL_MODEL")] } => Option<crate::local::BuiltinModel>, default("default");
    /// local: a GGUF model file to serve instead of a built-in model.
    agent model_file: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_MODEL_FILE")] } => Option<PathBuf>;
    /// The agent.
    flag agent_args: AgentArgs { #[command(flatten)] };
    /// The agent, as for `ralph run`.
    session agent_args: AgentArgs { #[command(flatten)] };
    /// An agent to switch to when the agents before it hit a usage limit or cannot log in
    /// (repeatable, in order; comma-separated in the variable): the name of an `[[agents]]` table
    /// in ralph.toml, or a backend such as `codex`. Replaces ralph.toml's `fallback_agents`.
    shared fallback_agent: Vec<String> { #[arg(long = "fallback-agent", value_name = "NAME", env = "RALPH_FALLBACK_AGENT", value_delimiter = ',' )] } => fallback_agents: Option<Vec<String>>;
    /// Maximum number of iterations in this run (0 is refused).
    both max_iter: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_MAX_ITER")] } => max_iter: Option<u32>, default("10");
    /// Wall-clock limit per iteration, e.g. `30m`, `90s`.
    table timeout: Option<Duration> { #[arg(long, value_name = "DUR", env = "RALPH_TIMEOUT", value_parser = humantime::parse_duration)] } => timeout: Option<String>, default("30m");
    /// Kill the agent after this long without any output, e.g. `10m`.
    table idle_timeout: Option<Duration> { #[arg(long, value_name = "DUR", env = "RALPH_IDLE_TIMEOUT", value_parser = humantime::parse_duration)] } => idle_timeout: Option<String>, default("10m");
    /// Start even when the working tree has uncommitted changes.
    both allow_dirty: bool { #[arg(long, env = "RALPH_ALLOW_DIRTY", value_parser = clap::builder::BoolishValueParser::new())] } => allow_dirty: Option<bool>;
    /// Print machine-readable events (JSONL) on stdout instead of the live display.
    flag json: bool { #[arg(long, env = "RALPH_JSON", value_parser = clap::builder::BoolishValueParser::new())] };
    /// Print only warnings, errors and the final summary.
    flag quiet: bool { #[arg(long, short, env = "RALPH_QUIET", value_parser = clap::builder::BoolishValueParser::new(), conflicts_with = "verbose")] };
    /// Stream the agent's text and tool calls to the terminal.
    flag verbose: bool { #[arg(long, short, env = "RALPH_VERBOSE", value_parser = clap::builder::BoolishValueParser::new())] };
    /// Prompt template that replaces the built-in `templates/prompt.md`.
    table template: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_TEMPLATE")] } => template: Option<PathBuf>;
    /// native/local: how tool calls are requested (json: response_format json_schema, for models
    /// without tool calling).
    table tool_mode: Option<crate::protocol::ToolMode> { #[arg(long, value_enum, env = "RALPH_TOOL_MODE")] } => tool_mode: Option<ToolMode>,
        default("native", local "json");
    /// native/local: tool-using steps per iteration before the model must summarize. The small
    /// built-in model gets few (it answers one explicit action; more steps mostly let it
    /// wander), the default one room to read a failed check's output and fix it.
    table max_steps: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_MAX_STEPS")] } => max_steps: Option<u32>,
        default("40", local "12", local_small "8");
    /// A shell command that must exit 0 whenever an iteration marks a story passing (run with
    /// `bash -c` in the repository, with RALPH_STORY_ID set); a story's own `verify` field wins.
    both verify: Option<String> { #[arg(long, value_name = "CMD", env = "RALPH_VERIFY")] } => verify: Option<String>;
    /// When the current story's verify command passes after an iteration, mark the story passing
    /// even if the agent did not (on for --agent local, whose small model often forgets).
    both verify_marks_passing: Option<bool> { #[arg(long, env = "RALPH_VERIFY_MARKS_PASSING", value_parser = clap::builder::BoolishValueParser::new())] } => verify_marks_passing: Option<bool>,
        default("false", local "true");
    /// When the agent hits a usage limit, stop (exit 75, resumable later) instead of waiting for
    /// the reset.
    flag no_wait: bool { #[arg(long, env = "RALPH_NO_WAIT", value_parser = clap::builder::BoolishValueParser::new())] };
    /// Stop the run (exit 4) once the feature's agents cost this much, in USD (from the ledger;
    /// the iteration that crosses it is finished, committed and recorded first). Earlier runs of
    /// the same feature count too, unless `--budget-scope run`.
    both max_cost: Option<f64> { #[arg(long, value_name = "USD", env = "RALPH_MAX_COST")] } => max_cost: Option<f64>;
    /// What `--max-cost` counts: `feature` (every recorded iteration of prd.json's
    /// `branchName`, over all its runs) or `run` (this run only).
    both budget_scope: Option<crate::protocol::BudgetScope> { #[arg(long, value_enum, value_name = "SCOPE", env = "RALPH_BUDGET_SCOPE")] } => budget_scope: Option<crate::protocol::BudgetScope>,
        default("feature");
    /// For schedules (cron, a CronJob, a GitHub schedule): run only when the last run of this
    /// PRD stopped for a reason that passes by itself (a usage limit, `--max-duration`, a
    /// signal, a killed ralph); otherwise do nothing, say why and exit 0.
    both resume_only: bool { #[arg(long, env = "RALPH_RESUME_ONLY", value_parser = clap::builder::BoolishValueParser::new())] } => resume_only: Option<bool>;
    /// Iterations a story may take without passing before it is blocked and skipped (a local
    /// model costs only time per attempt, and a small model's success is partly chance, so it
    /// gets more).
    both max_attempts: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_MAX_ATTEMPTS")] } => max_attempts: Option<u32>,
        default("3", local "5");
    /// Failed iterations in a row (agent error, timeout, stall, broken prd.json, failed verify)
    /// before the run stops with exit 4.
    both max_failures: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_MAX_FAILURES")] } => max_failures: Option<u32>, default("3");
    /// Iterations in a row that change nothing but notes (no commit, no file beyond prd.json and
    /// progress.txt) before the run stops with exit 4; it goes on across a story blocked without
    /// a single change.
    both max_no_progress: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_MAX_NO_PROGRESS")] } => max_no_progress: Option<u32>,
        default("3", local "5");
    /// What to do when an iteration changes prd.json beyond the current story's passes/notes:
    /// report it or restore it.
    both prd_guard: Option<crate::protocol::PrdGuard> { #[arg(long, value_enum, env = "RALPH_PRD_GUARD")] } => prd_guard: Option<PrdGuard>, default("report");
    /// Give blocked stories another chance: clear their blocked mark and attempt counts.
    flag unblock: bool { #[arg(long, env = "RALPH_UNBLOCK", value_parser = clap::builder::BoolishValueParser::new())] };
    /// The notification flags.
    flag notify: NotifyFlags { #[command(flatten)] };
    /// Stop the run (exit 4) as soon as a story is blocked, instead of moving on to the next
    /// story: for jobs where a blocked story needs a human before anything else.
    both stop_on_block: bool { #[arg(long, env = "RALPH_STOP_ON_BLOCK", value_parser = clap::builder::BoolishValueParser::new())] } => stop_on_block: Option<bool>;
    /// Work on up to N stories at once, each in its own git worktree with its own agent; the
    /// stories' work lands on the run branch one at a time, checked on the landed tip (1: one
    /// story at a time, in the checkout itself). Worth it for stories that touch different
    /// files; it costs N agents' tokens and N times the load of the checks.
    both parallel: Option<u32> { #[arg(long, value_name = "N", env = "RALPH_PARALLEL")] } => parallel: Option<u32>, default("1");
    /// `--parallel`: a landing that conflicts starts an iteration of its own in which an agent
    /// resolves the conflict (git's markers left in the files); ralph lands its result only when
    /// no marker remains, every modify/delete conflict is named, no other file changed and the
    /// story's check passes on it. Off: the story's next attempt redoes its work on the tip.
    both resolve_conflicts: bool { #[arg(long, env = "RALPH_RESOLVE_CONFLICTS", value_parser = clap::builder::BoolishValueParser::new())] } => resolve_conflicts: Option<bool>;
    /// claude: always keep ANTHROPIC_API_KEY in claude's environment. Without this ralph removes
    /// it only when claude has a login of its own (the key would bill the API instead of your
    /// subscription) and no ANTHROPIC_BASE_URL or ANTHROPIC_AUTH_TOKEN is set.
    table keep_api_key: bool { #[arg(long, env = "RALPH_KEEP_API_KEY", value_parser = clap::builder::BoolishValueParser::new())] } => keep_api_key: Option<bool>;
    /// Stop the run (exit 4) once it has run this long, e.g. `8h`; an iteration in progress is
    /// finished and committed first, and a usage-limit wait past it stops at once.
    both max_duration: Option<Duration> { #[arg(long, value_name = "DUR", env = "RALPH_MAX_DURATION", value_parser = humantime::parse_duration)] } => max_duration: Option<String>;
    /// The configuration file (default: ./ralph.toml when it exists).
    flag config: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_CONFIG")] };
    /// After each iteration's checkpoint, push the run branch and ralph's refs (refs/ralph/*)
    /// to REMOTE (default origin), never forced, holding a lease on the branch there so that no
    /// other worker drives it at the same time; a fresh clone resumes from the remote.
    /// Credentials: git's own (credential helpers, SSH agent), or RALPH_GIT_TOKEN for HTTPS.
    both push: Option<String> { #[arg(long, value_name = "REMOTE", env = "RALPH_PUSH", num_args = 0..=1, default_missing_value = "origin")] } => push: Option<PushSetting>;
    /// On SIGTERM/SIGINT/SIGHUP, finish within this long: the agent gets a short grace, then
    /// the checkpoint, ledger, state, push and lease release (the default fits in Kubernetes'
    /// 30 s grace period, and in GitHub Actions', whose cancel sends SIGKILL 10 s after SIGINT).
    both shutdown_timeout: Option<Duration> { #[arg(long, value_name = "DUR", env = "RALPH_SHUTDOWN_TIMEOUT", value_parser = humantime::parse_duration)] } => shutdown_timeout: Option<String>,
        default("25s", github_actions "9s");
    /// --push: how long the branch's lease on the remote lasts without a renewal (renewed every
    /// third of it while the run lives). A worker that dies leaves it for this long before
    /// another may take the branch over.
    both lease_ttl: Option<Duration> { #[arg(long, value_name = "DUR", env = "RALPH_LEASE_TTL", value_parser = humantime::parse_duration)] } => lease_ttl: Option<String>, default("10m");
    /// Run the agent and the verify commands inside bubblewrap: `fs` (system read-only, the
    /// worktree writable, ralph's books read-only, $HOME hidden but for the agent's own state,
    /// private /tmp and PID namespace) or `strict` (`fs`, and the network only to the agent's
    /// API hosts and --allow-host). A sandbox that cannot be built stops the run.
    both sandbox: Option<crate::protocol::SandboxMode> { #[arg(long, value_enum, value_name = "MODE", env = "RALPH_SANDBOX")] } => sandbox: Option<crate::protocol::SandboxMode>,
        default("off");
    /// --sandbox strict: one more host the agent may reach (`host` for any port, `host:port`,
    /// `*.domain`), e.g. a package mirror; repeatable.
    both allow_hosts: Vec<String> { #[arg(long = "allow-host", value_name = "HOST")] } => allow_hosts: Option<Vec<String>>;
    /// --sandbox: one more path the agent and its checks may write (a package cache such as
    /// ~/.cargo/registry); repeatable.
    both sandbox_writable: Vec<PathBuf> { #[arg(long = "sandbox-writable", value_name = "PATH")] } => sandbox_writable: Option<Vec<PathBuf>>;
    /// Bytes of progress.txt shown in the prompt.
    key progress_tail_bytes: Option<usize> {  }, default("16384");
    /// Wait between SIGTERM and SIGKILL, humantime syntax (`5s`).
    key kill_grace: Option<String> {  }, default("5s");
    /// Time limit of one verify command, humantime syntax (`10m`).
    key verify_timeout: Option<String> {  }, default("10m");
    /// First wait after a transient agent failure, humantime syntax (`30s`); doubles each time.
    key transient_backoff: Option<String> {  }, default("30s");
    /// Transient failures in a row before the run stops (exit 4).
    key max_transient_retries: Option<u32> {  }, default("5");
    /// How long to wait for a usage limit whose reset time the agent did not give (`1h`).
    key usage_limit_fallback: Option<String> {  }, default("1h");
    /// Extra wait after a usage limit's reset time (`30s`).
    key usage_limit_margin: Option<String> {  }, default("30s");
    /// Usage-limit waits in one run before it stops (exit 75).
    key max_usage_limit_waits: Option<u32> {  }, default("3");
    /// native/local: output tokens per request (the small built-in model gets short replies,
    /// the default one room to write a small file in one reply).
    table_key max_tokens: Option<u32> {  }, default("8192", local "768", local_small "256");
    /// native/local: the model's context window in tokens.
    table_key context_window: Option<u32> {  }, default("128000", local "8192", local_small "4096");
    /// native/local: sampling temperature.
    key temperature: Option<f32> {  }, default(none, local "0");
    /// native/local: sampling seed.
    key seed: Option<u64> {  }, default(none, local "42");
    /// native/local: the tools offered to the model, by name (none: all; local: the few a small
    /// model uses well).
    key tools: Option<Vec<String>> {  },
        default(none, local "write_file,edit_file,read_file,run_command,mark_story");
    /// Model prices in USD per million tokens: `[prices."gpt-4.1"] input = 2.0, output = 8.0`.
    /// Used by the native backends and by CLIs that report tokens but no cost (codex, gemini).
    table_key prices: BTreeMap<String, Price> { #[serde(default)] };
    /// `--parallel`: ignored files copied from the checkout into each story's worktree (paths
    /// relative to the repository root, e.g. `.env`).
    key worktree_copy: Option<Vec<String>> {  };
    /// `--parallel`: a shell command run in each new worktree before its agent (e.g. `npm ci`).
    key worktree_setup: Option<String> {  };
    /// Extra failure patterns, added to the built-in ones: `[patterns] usage_limit = ["…"]`.
    key patterns: crate::agent::classify::ExtraPatterns { #[serde(default)] };
    /// `--push`: attempts when the remote cannot be reached.
    key push_attempts: Option<u32> {  }, default("4");
    /// `--push`: the first wait between attempts, humantime syntax (`2s`); it doubles.
    key push_backoff: Option<String> {  }, default("2s");
    /// Notifications: `[notify] webhook = ["…"]`, `command`, `desktop`, … (see
    /// [`crate::notify`]).
    key notify: crate::notify::NotifyFile { #[serde(default)] };
    /// Named agent profiles: `[[agents]]` tables (see [`AgentTable`]).
    key agents: Vec<AgentTable> { #[serde(default)] };

    /// Wall-clock limit of one agent session, e.g. `10m` (else ralph.toml's `timeout`, else
    /// `ralph run --timeout`'s default).
    session timeout: Option<Duration> { #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration, help = session_timeout_help())] };
    /// Stream the agent's text and tool calls to the terminal.
    session verbose: bool { #[arg(long, short)] };
    /// The configuration file (default: ./ralph.toml when it exists).
    session config: Option<PathBuf> { #[arg(long, value_name = "PATH", env = "RALPH_CONFIG")] };
    /// Run the agent inside bubblewrap, as `ralph run --sandbox` (off, fs, strict).
    session sandbox: Option<crate::protocol::SandboxMode> { #[arg(long, value_enum, value_name = "MODE", env = "RALPH_SANDBOX")] };
    /// --sandbox strict: one more host the agent may reach; repeatable.
    session allow_hosts: Vec<String> { #[arg(long = "allow-host", value_name = "HOST")] };
    /// --sandbox: one more path the agent and its checks may write (a package cache such as
    /// ~/.cargo/registry); repeatable.
    session sandbox_writable: Vec<PathBuf> { #[arg(long = "sandbox-writable", value_name = "PATH")] };
}
