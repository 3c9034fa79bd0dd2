//! The one agent launcher: every agent session ralph starts — an iteration of `ralph run`
//! (`run/iteration/execute.rs`) and an answer session of `ralph plan`/`convert` (`ask/`) — goes
//! through [`run_session`], so each one gets the same treatment:
//!
//! - the process tag ([`crate::process::AGENT_TAG_VAR`]) on the agent and all it starts, so
//!   that what it leaves running can be found and a restarted ralph only kills its own;
//! - the environment: `NO_COLOR=1` unless the backend sets it, and `RALPH_GIT_TOKEN` (`--push`'s
//!   token, for ralph's git alone) removed, and git's automatic housekeeping kept in the
//!   foreground (`maintenance.autoDetach=false`, `gc.autoDetach=false`: a `git commit` would
//!   otherwise leave a detached `git maintenance run` behind, killed as a stray) ([`decorate`]);
//! - every output line redacted ([`crate::redact`]) before the parser, the transcript or an
//!   output sees it, and the report's texts redacted again after the parser;
//! - the user's extra error patterns (`[patterns]` in ralph.toml) applied to the report;
//! - after the agent exits, whatever still carries its tag is killed (the stray kill);
//! - `--sandbox fs|strict`: the decorated process wrapped in bubblewrap
//!   ([`crate::process::sandbox`]), its environment cut down to an allowlist.
//!
//! The process itself is started by [`crate::process::run`] (only `process/` spawns).

use crate::agent::classify::ExtraPatterns;
use crate::agent::OutputParser;
use crate::process::{self, LineVerdict, OutputLine, ProcessError, ProcessOutcome, SpawnSpec};
use crate::protocol::{AgentEvent, AgentReport};

/// `--push`'s token variable, which no agent may see (`crate::remote::TOKEN_VAR`).
pub const HIDDEN_VARS: &[&str] = &[crate::remote::TOKEN_VAR];

/// Sets what every agent process carries: the tag `tag` ([`crate::process::agent_tag`]),
/// `NO_COLOR=1` unless the backend sets it (colour codes only get in the way of parsing and of
/// the transcript), the removal of [`HIDDEN_VARS`], and [`GIT_FOREGROUND`] (see
/// [`keep_git_in_foreground`]). Idempotent, so a caller may decorate early to show the final
/// command line ([`SpawnSpec::shell_line`]). The verify gate's commands get it too.
pub fn decorate(spec: &mut SpawnSpec, tag: &str) {
    spec.set_tag(tag);
    spec.set_env_default("NO_COLOR", "1");
    for var in HIDDEN_VARS {
        if !spec.env_remove.iter().any(|v| v == var) {
            spec.env_remove.push((*var).to_owned());
        }
        spec.env_set.retain(|(name, _)| name != var);
    }
    keep_git_in_foreground(spec, std::env::var("GIT_CONFIG_COUNT").ok().as_deref());
}

/// The git settings every agent and verify process gets: git's automatic housekeeping (`git
/// maintenance run --auto`, `git gc --auto`, started by `git commit` and friends) runs in the
/// foreground instead of detaching, so it is not left running after the agent exits (where
/// the stray kill would find it and kill it).
pub const GIT_FOREGROUND: &[(&str, &str)] = &[
    ("maintenance.autoDetach", "false"),
    ("gc.autoDetach", "false"),
];

/// Adds [`GIT_FOREGROUND`] through git's `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/
/// `GIT_CONFIG_VALUE_<n>` variables (git-config(1)), after the entries already set: the spec's
/// own `GIT_CONFIG_COUNT`, else `inherited` (ralph's environment's), else none. Idempotent.
fn keep_git_in_foreground(spec: &mut SpawnSpec, inherited: Option<&str>) {
    let (first_key, _) = GIT_FOREGROUND[0];
    let done = spec
        .env_set
        .iter()
        .any(|(n, v)| n.starts_with("GIT_CONFIG_KEY_") && v == first_key);
    if done {
        return;
    }
    let own = spec
        .env_set
        .iter()
        .find(|(n, _)| n == "GIT_CONFIG_COUNT")
        .map(|(_, v)| v.as_str());
    let removed = spec.env_remove.iter().any(|v| v == "GIT_CONFIG_COUNT");
    let count: usize = own
        .or(inherited.filter(|_| !removed))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    spec.env_set.retain(|(n, _)| n != "GIT_CONFIG_COUNT");
    spec.env_remove.retain(|v| v != "GIT_CONFIG_COUNT");
    for (i, (key, value)) in GIT_FOREGROUND.iter().enumerate() {
        let n = count + i;
        spec.env_set
            .push((format!("GIT_CONFIG_KEY_{n}"), (*key).to_owned()));
        spec.env_set
            .push((format!("GIT_CONFIG_VALUE_{n}"), (*value).to_owned()));
    }
    spec.env_set.push((
        "GIT_CONFIG_COUNT".to_owned(),
        (count + GIT_FOREGROUND.len()).to_string(),
    ));
}

/// One agent session to run: the process and how to read it.
pub struct Session<'a> {
    /// The process (decorated here again, see [`decorate`]).
    pub spec: SpawnSpec,
    /// The backend's parser for this session.
    pub parser: Box<dyn OutputParser>,
    /// The tag of this session's processes.
    pub tag: String,
    /// Time and size limits.
    pub limits: &'a process::Limits,
    /// Stop tokens (Ctrl-C, SIGTERM).
    pub stop: &'a process::StopSignals,
    /// The user's extra error patterns.
    pub patterns: &'a ExtraPatterns,
    /// `--sandbox`: the sandbox the agent runs in (`None`: off).
    pub sandbox: Option<&'a process::sandbox::Sandbox>,
}

/// One line as the caller sees it: already redacted, with the events the parser read from it.
pub struct SeenLine<'l> {
    /// The line, secrets redacted.
    pub line: &'l OutputLine,
    /// Whether the parser read the line whole as one JSON value (a transcript may keep it as
    /// JSON, see [`OutputParser::line_is_json`]).
    pub is_json: bool,
    /// The events the parser read from it.
    pub events: Vec<AgentEvent>,
}

/// How a session ended.
#[derive(Debug)]
pub struct SessionEnd {
    /// How the process ended.
    pub process: ProcessOutcome,
    /// What the parser concluded, with the extra patterns applied and secrets redacted.
    pub report: AgentReport,
    /// The processes the agent left running under its tag, killed after it exited (pid and
    /// command line, unredacted: the caller redacts what it records).
    pub strays: Vec<process::Stray>,
}

/// Runs `session` (see the module docs). `on_spawn` gets the process group id as soon as it
/// exists; `on_line` each line with its events (an `AgentEvent::Final` ends the session early
/// through the process runner's final grace).
///
/// # Errors
/// The agent could not be started ([`ProcessError`]); nothing ran.
pub async fn run_session(
    session: Session<'_>,
    on_spawn: impl FnOnce(u32) + Send,
    mut on_line: impl FnMut(SeenLine<'_>) + Send,
) -> Result<SessionEnd, ProcessError> {
    let Session {
        mut spec,
        mut parser,
        tag,
        limits,
        stop,
        patterns,
        sandbox,
    } = session;
    decorate(&mut spec, &tag);
    let cwd = spec.cwd.clone();
    // After the decoration: the tag and the environment go into the sandbox with the agent.
    if let Some(sandbox) = sandbox {
        spec = sandbox.apply(spec);
    }
    let redactor = crate::redact::current();
    let parser_ref = &mut parser;
    let process = process::run(spec, limits, stop, on_spawn, |mut line| {
        redactor.redact_in_place(&mut line.text);
        let events = parser_ref.on_line(&line);
        let verdict = if events.iter().any(|e| matches!(e, AgentEvent::Final { .. })) {
            LineVerdict::Final
        } else {
            LineVerdict::Continue
        };
        on_line(SeenLine {
            line: &line,
            is_json: parser_ref.line_is_json(),
            events,
        });
        verdict
    })
    .await?;
    if let Some(sandbox) = sandbox {
        sandbox.settle(&cwd);
    }
    // Anything the agent left running in a session of its own (setsid, a daemonized dev server)
    // is no longer linked to it once the agent exited; its tag still names it.
    let strays = process::sweep_tagged_since(&tag, process.pid, process.forks_before);
    let mut report = parser.finish(process.exit_code);
    patterns.apply(&mut report);
    redact_report(&mut report, &redactor);
    Ok(SessionEnd {
        process,
        report,
        strays,
    })
}

/// The report's texts with secrets redacted (the lines were; a parser may still assemble a
/// secret from pieces, or a backend add text of its own).
fn redact_report(report: &mut AgentReport, redactor: &crate::redact::Redactor) {
    for text in [&mut report.error_message, &mut report.final_text]
        .into_iter()
        .flatten()
    {
        redactor.redact_in_place(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decorate_tags_hides_the_token_and_is_idempotent() {
        let mut spec = SpawnSpec {
            program: "agent".into(),
            env_set: vec![(crate::remote::TOKEN_VAR.to_owned(), "t0ken-value".into())],
            ..SpawnSpec::default()
        };
        decorate(&mut spec, "run/1");
        decorate(&mut spec, "run/1");
        assert_eq!(
            spec.env_remove,
            vec![crate::remote::TOKEN_VAR.to_owned()],
            "{spec:?}"
        );
        assert!(spec
            .env_set
            .iter()
            .all(|(n, _)| n != crate::remote::TOKEN_VAR));
        let tags: Vec<_> = spec
            .env_set
            .iter()
            .filter(|(n, _)| n == process::AGENT_TAG_VAR)
            .collect();
        assert_eq!(tags.len(), 1);
        assert!(spec
            .env_set
            .iter()
            .any(|(n, v)| n == "NO_COLOR" && v == "1"));
        let counts: Vec<_> = spec
            .env_set
            .iter()
            .filter(|(n, _)| n == "GIT_CONFIG_COUNT")
            .collect();
        assert_eq!(counts.len(), 1, "{spec:?}");
    }

    #[test]
    fn git_settings_go_after_those_already_set() {
        let get = |spec: &SpawnSpec, name: &str| {
            spec.env_set
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let mut spec = SpawnSpec::default();
        keep_git_in_foreground(&mut spec, Some("2"));
        keep_git_in_foreground(&mut spec, Some("2"));
        assert_eq!(get(&spec, "GIT_CONFIG_COUNT").as_deref(), Some("4"));
        assert_eq!(
            get(&spec, "GIT_CONFIG_KEY_2").as_deref(),
            Some("maintenance.autoDetach")
        );
        assert_eq!(get(&spec, "GIT_CONFIG_VALUE_3").as_deref(), Some("false"));
        // The backend's own count wins over the inherited one.
        let mut spec = SpawnSpec {
            env_set: vec![("GIT_CONFIG_COUNT".into(), "1".into())],
            ..SpawnSpec::default()
        };
        keep_git_in_foreground(&mut spec, None);
        assert_eq!(
            get(&spec, "GIT_CONFIG_KEY_1").as_deref(),
            Some("maintenance.autoDetach")
        );
        assert_eq!(get(&spec, "GIT_CONFIG_COUNT").as_deref(), Some("3"));
    }
}
