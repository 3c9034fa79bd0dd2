//! Command-line surface (clap derive). Raw values only: defaults that may also come from
//! `RALPH_*` variables or `ralph.toml` are `Option`s here and are resolved in [`crate::config`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::protocol::AgentKind;

pub mod settings;
pub use settings::{AgentArgs, RunArgs, SessionArgs};

/// ralph's version and the git commit it was built from (see build.rs):
/// `0.1.0 (a1b2c3d4e5f6 2026-12-01)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("RALPH_BUILD_COMMIT"),
    ")"
);

/// `ralph`: run a coding agent in a loop over a prd.json until every story passes.
#[derive(Debug, Parser)]
#[command(name = "ralph", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a starter prd.json, progress.txt, ralph.toml and .ralph/.gitignore (and, with
    /// --skills, the PRD skills for an agent CLI).
    Init(InitArgs),
    /// Write a Markdown PRD (tasks/prd-<slug>.md) for a feature through one agent session.
    Plan(PlanArgs),
    /// Turn a Markdown PRD into prd.json: ralph's layout with no model, free-form through an agent.
    Convert(ConvertArgs),
    /// Check a prd.json against the schema and the semantic rules, and lint it; exit 0 (valid) or 1.
    Validate(ValidateArgs),
    /// Run the agent loop until every story passes or a limit is hit.
    #[command(after_help = crate::protocol::ExitStatus::help_table())]
    Run(Box<RunArgs>),
    /// Show the stories, the next story and the latest run's iterations.
    Status(StatusArgs),
    /// One line per iteration across runs, newest last: story, outcome, time, cost, why.
    Log(LogArgs),
    /// One iteration, readable: what the agent did, what it cost, why it ended.
    Show(ShowArgs),
    /// Write the morning report: one self-contained HTML file (or Markdown, or JSON).
    Report(ReportArgs),
    /// Check each agent CLI: installed, which version, and the known traps on this machine.
    Doctor(DoctorArgs),
    /// Ask the `ralph run` in this repository to stop after its current iteration.
    Stop(StopArgs),
    /// Leave a note for the next iteration's prompt without stopping the run (`--list`, `--drop N`).
    Hint(HintArgs),
    /// Let the running iteration finish and be recorded, then hold the run until `ralph resume`.
    Pause(StopArgs),
    /// End a `ralph pause`: the run starts its next iteration.
    Resume(StopArgs),
    /// A live view of the run in this repository (stories, the running iteration, budgets,
    /// hints); keys h hint, p pause/resume, s stop, q quit. Without a terminal: one snapshot.
    Watch(StopArgs),
    /// Archive prd.json and progress.txt into archive/<date>-<branch>/ and reset progress.txt.
    Archive(ArchiveArgs),
    /// Send a sample of each configured notification kind and say what happened.
    Notify(NotifyArgs),
    /// Print a shell completion script: `ralph completions bash > ~/.local/share/bash-completion/completions/ralph`.
    Completions(CompletionsArgs),
    /// Print ralph's man page (roff), or write one page per command into a directory.
    Man(ManArgs),
    /// Internal: one session of ralph's own tool loop (started by `ralph run`).
    #[command(name = "__native-agent", hide = true)]
    NativeAgent,
    /// Internal: the network bridge inside a `--sandbox strict` sandbox (started by ralph).
    #[command(name = "__bridge", hide = true)]
    Bridge(BridgeArgs),
}

/// Arguments of `ralph __bridge` (see `process::egress::bridge`).
#[derive(Debug, Args)]
pub struct BridgeArgs {
    /// A loopback port to serve inside and forward to the same port on the host's loopback.
    #[arg(long = "forward", value_name = "PORT")]
    pub forwards: Vec<u16>,
    /// The agent's program and arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Parses the command line like [`clap::Parser::parse`], printing clap's message and exiting
/// with its code (2 for a usage error, 0 for `--help`/`--version`) when it fails. A value clap
/// refuses that came from a `RALPH_*` environment variable (e.g. `RALPH_MAX_ITER=abc`) gets a
/// hint naming the variable: clap's message names only the flag.
pub fn parse() -> Cli {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match <Cli as clap::Parser>::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            if matches!(
                e.kind(),
                ErrorKind::InvalidValue | ErrorKind::ValueValidation
            ) {
                if let Some(ContextValue::String(value)) = e.get(ContextKind::InvalidValue) {
                    let mut from_env: Vec<String> = std::env::vars()
                        .filter(|(k, v)| k.starts_with("RALPH_") && v == value)
                        .map(|(k, _)| k)
                        .collect();
                    from_env.sort();
                    if !from_env.is_empty() {
                        eprintln!(
                            "hint: the value comes from the environment ({}={value}): fix or unset it",
                            from_env.join(", ")
                        );
                    }
                }
            }
            std::process::exit(e.exit_code());
        }
    }
}

/// The command line as users see it: [`Cli`] without hidden commands (`__native-agent`), for
/// the completion scripts and the man pages, which would otherwise offer them.
pub fn visible_command() -> clap::Command {
    let full = <Cli as clap::CommandFactory>::command();
    let mut cmd = clap::Command::new("ralph")
        .version(VERSION)
        .about(full.get_about().cloned().unwrap_or_default())
        .subcommand_required(true);
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        cmd = cmd.subcommand(sub.clone());
    }
    cmd
}

/// Arguments of `ralph log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// The prd.json whose repository to read (default: found upward from the current directory).
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
    /// Only this run (its id, or a unique prefix or suffix of it).
    #[arg(long, value_name = "ID")]
    pub run: Option<String>,
    /// Only this story.
    #[arg(long, value_name = "ID")]
    pub story: Option<String>,
    /// Only these outcomes (comma-separated, e.g. `verify_failed,agent_error`).
    #[arg(long, value_name = "OUTCOMES", value_delimiter = ',')]
    pub outcome: Vec<String>,
    /// Only iterations that started after this: a date (`2026-12-01`), a time
    /// (`2026-12-01T08:00:00Z`), or an age (`12h`, `3days`).
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only the last N iterations (after the other filters).
    #[arg(short = 'n', long = "max-count", value_name = "N")]
    pub max_count: Option<usize>,
    /// Print the ledger records as JSON lines instead.
    #[arg(long)]
    pub json: bool,
    /// Never page the output.
    #[arg(long)]
    pub no_pager: bool,
}

/// Arguments of `ralph notify`.
#[derive(Debug, Args)]
pub struct NotifyArgs {
    /// Send one sample notification of each kind to every configured target.
    #[arg(long)]
    pub test: bool,
    /// The notification settings, as for `ralph run` (`--notify-webhook`, `--config`, …).
    #[command(flatten)]
    pub run: NotifyRunArgs,
}

/// The `ralph run` options `ralph notify` reads.
#[derive(Debug, Args, Default)]
pub struct NotifyRunArgs {
    /// The configuration file (default: ./ralph.toml when it exists).
    #[arg(long, value_name = "PATH", env = "RALPH_CONFIG")]
    pub config: Option<PathBuf>,
    /// The notification flags.
    #[command(flatten)]
    pub notify: NotifyFlags,
}

/// The notification flags of `ralph run` and `ralph notify`.
#[derive(Debug, Args, Default, Clone)]
pub struct NotifyFlags {
    /// POST notifications (run finished, story passed or blocked, usage-limit wait, needs
    /// attention) to this webhook URL too; repeatable; adds to `[notify] webhook` in ralph.toml.
    #[arg(long, value_name = "URL")]
    pub notify_webhook: Vec<String>,
    /// The webhook body: json (default), slack or discord.
    #[arg(long, value_enum, value_name = "FORMAT", env = "RALPH_NOTIFY_FORMAT")]
    pub notify_format: Option<crate::notify::WebhookFormat>,
    /// Also run this shell command for each notification, with its JSON on stdin.
    #[arg(long, value_name = "CMD", env = "RALPH_NOTIFY_COMMAND")]
    pub notify_command: Option<String>,
    /// Also show desktop notifications (notify-send, or osascript on macOS).
    #[arg(long, env = "RALPH_NOTIFY_DESKTOP", value_parser = clap::builder::BoolishValueParser::new())]
    pub notify_desktop: bool,
}

/// Arguments of `ralph show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The iteration: its number (`7`), or `<run>:<n>` when several runs share it.
    #[arg(value_name = "ITERATION")]
    pub iteration: String,
    /// The prd.json whose repository to read (default: found upward from the current directory).
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
    /// Add the iteration's patch (its start to its end).
    #[arg(long)]
    pub diff: bool,
    /// Print the transcript's lines as recorded instead.
    #[arg(long, conflicts_with_all = ["json", "diff"])]
    pub raw: bool,
    /// Print the ledger record and the normalized events as JSON instead.
    #[arg(long)]
    pub json: bool,
    /// Never page the output.
    #[arg(long)]
    pub no_pager: bool,
}

/// Arguments of `ralph report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The prd.json whose repository to read (default: found upward from the current directory).
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
    /// Report this run (its id, or a unique prefix or suffix) instead of the latest.
    #[arg(long, value_name = "ID", conflicts_with = "all")]
    pub run: Option<String>,
    /// Report every run.
    #[arg(long)]
    pub all: bool,
    /// Where to write the report (default: the HTML to .ralph/report.html, `--markdown` and
    /// `--json` to stdout).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Open the HTML in the browser when written.
    #[arg(long, conflicts_with_all = ["markdown", "json"])]
    pub open: bool,
    /// Print the summary as Markdown on stdout instead (for a CI step summary or a PR comment).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print the report's data as JSON on stdout instead.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ralph completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `ralph man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write `ralph.1` and one `ralph-<command>.1` per command into this directory instead of
    /// printing `ralph.1` on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Arguments of `ralph init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
    /// Directory to initialise (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Also write ralph's PRD-writing and conversion skills where this agent CLI reads them
    /// (claude: .claude/skills/; amp and codex: .agents/skills/); repeatable or comma-separated.
    #[arg(long, value_enum, value_name = "CLI", value_delimiter = ',')]
    pub skills: Vec<SkillTarget>,
    /// With --skills: write only the skills, not the starter files.
    #[arg(long, requires = "skills")]
    pub skills_only: bool,
}

/// An agent CLI that `ralph init --skills` writes skills for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SkillTarget {
    /// Claude Code: `.claude/skills/<name>/SKILL.md`.
    Claude,
    /// Amp: `.agents/skills/<name>/SKILL.md`.
    Amp,
    /// OpenAI Codex CLI: `.agents/skills/<name>/SKILL.md`.
    Codex,
}

impl SessionArgs {
    /// The same settings as `ralph run` arguments, for [`crate::config::RunConfig::resolve`].
    pub fn run_args(&self) -> RunArgs {
        RunArgs {
            agent_args: self.agent_args.clone(),
            fallback_agent: self.fallback_agent.clone(),
            timeout: self.timeout,
            verbose: self.verbose,
            config: self.config.clone(),
            sandbox: self.sandbox,
            allow_hosts: self.allow_hosts.clone(),
            sandbox_writable: self.sandbox_writable.clone(),
            ..RunArgs::default()
        }
    }
}

/// Arguments of `ralph convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The Markdown PRD (e.g. tasks/prd-my-feature.md).
    #[arg(value_name = "PRD.md")]
    pub input: PathBuf,
    /// Where to write prd.json (default: ./prd.json).
    #[arg(long, short, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Replace a prd.json that still has open stories (it is archived first).
    #[arg(long)]
    pub force: bool,
    /// Agent sessions at most on the agent path: the first draft, then one per round of
    /// feedback (default 3).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub attempts: u32,
    /// Refuse to write a prd.json with lint findings (exit 1).
    #[arg(long)]
    pub strict: bool,
    /// How the agent path runs its agent (ralph's layout needs none).
    #[command(flatten)]
    pub session: SessionArgs,
}

/// Arguments of `ralph plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The feature, in a sentence or a few (or use --from FILE).
    #[arg(
        value_name = "DESCRIPTION",
        required_unless_present = "from",
        conflicts_with = "from"
    )]
    pub description: Option<String>,
    /// Read the feature's description from this file.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Ask no clarifying questions: the agent writes its assumptions into the PRD (the default
    /// when stdin or stdout is not a terminal).
    #[arg(long, short)]
    pub yes: bool,
    /// Then convert the PRD into prd.json (as `ralph convert` does).
    #[arg(long)]
    pub convert: bool,
    /// Where to write the PRD (default: tasks/prd-<slug>.md at the repository root).
    #[arg(long, short, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Overwrite an existing PRD file; with --convert, also replace a prd.json with open stories.
    #[arg(long)]
    pub force: bool,
    /// Agent sessions at most for the PRD: the first draft, then one per round of feedback
    /// (default 3).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub attempts: u32,
    /// How the agent runs.
    #[command(flatten)]
    pub session: SessionArgs,
}

/// Arguments of `ralph validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The prd.json to check (default: the one found from here upward to the repository root).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Treat the linter's findings (vague criteria, oversized stories, …) as errors: exit 1.
    #[arg(long)]
    pub strict: bool,
}

/// Arguments of `ralph status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The prd.json to read (default: ./prd.json).
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
    /// Print the status as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ralph stop` (and of `ralph pause` and `ralph resume`).
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The prd.json of the run (default: ./prd.json); its repository's `.ralph/` gets
    /// the request.
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
}

/// Arguments of `ralph hint`.
#[derive(Debug, Args)]
pub struct HintArgs {
    /// The note, shown to the next iteration in a "From the user" block of its prompt.
    #[arg(required_unless_present_any = ["list", "drop"], conflicts_with_all = ["list", "drop"])]
    pub text: Option<String>,
    /// Give the note only to the next iteration of this story (its id in prd.json).
    #[arg(long, value_name = "ID")]
    pub story: Option<String>,
    /// List the pending and delivered hints.
    #[arg(long, conflicts_with = "drop")]
    pub list: bool,
    /// Remove pending hint N (its number in `--list`).
    #[arg(long, value_name = "N")]
    pub drop: Option<u32>,
    /// The prd.json of the run (default: ./prd.json); its books under `.ralph/` keep the hints.
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
}

/// Arguments of `ralph doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Check only this backend (default: every agent CLI).
    #[arg(long, value_enum)]
    pub agent: Option<AgentKind>,
    /// Print the findings as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// The configuration file (default: ./ralph.toml when it exists).
    #[arg(long, value_name = "PATH", env = "RALPH_CONFIG")]
    pub config: Option<PathBuf>,
    /// --agent exec: the command line to check (as `ralph run --agent-cmd`).
    #[arg(long, value_name = "CMD", env = "RALPH_AGENT_CMD")]
    pub agent_cmd: Option<String>,
    /// --agent local: which built-in model to check, `default` or `small` (as `ralph run
    /// --local-model`).
    #[arg(long, value_enum, value_name = "MODEL", env = "RALPH_LOCAL_MODEL")]
    pub local_model: Option<crate::local::BuiltinModel>,
    /// The run's fallback agents to check, in order (as `ralph run --fallback-agent`; repeat
    /// it or separate names with commas): an `[[agents]]` table's name in ralph.toml, or a
    /// backend such as `codex`. Replaces ralph.toml's `fallback_agents`. RALPH_FALLBACK_AGENT
    /// is read as `ralph run` reads it.
    #[arg(long = "fallback-agent", value_name = "NAME", value_delimiter = ',')]
    pub fallback_agent: Vec<String>,
}

/// Arguments of `ralph archive`.
#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// The prd.json to archive (default: ./prd.json); progress.txt is the one beside it.
    #[arg(long, value_name = "PATH", env = "RALPH_PRD")]
    pub prd: Option<PathBuf>,
    /// Print what was archived as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}
