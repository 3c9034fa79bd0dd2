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
//!   ([`crate::process::sandbox`]), its environment cut down to an allowlist. When bubblewrap
//!   itself fails before the agent starts (it exits 1 with its own `bwrap: …` lines and the
//!   agent printed nothing), the report says so as a config failure naming bubblewrap
//!   ([`SandboxStart`]), not as the agent's error; lines of its output saying a write was refused
//!   (`Read-only file system`) are counted into a finding of the iteration's record.
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

/// The command line shown for an agent session (the run's `$ …` line, the ledger's `command`):
/// [`SpawnSpec::shell_line`] of the decorated `spec`, and, under `--sandbox fs|strict`, a
/// `[sandbox MODE: bubblewrap, …]` prefix, because the process that runs is bubblewrap around
/// that command (the system read-only, the environment cut to an allowlist, strict's network
/// through ralph's proxy): pasted without the prefix, the line runs the agent unconfined.
/// `stdin_file` as for [`SpawnSpec::shell_line`].
pub fn shown_command_line(
    spec: &SpawnSpec,
    sandbox: Option<crate::protocol::SandboxMode>,
    stdin_file: Option<&std::path::Path>,
) -> String {
    let line = spec.shell_line(stdin_file);
    match sandbox.filter(|m| m.is_on()) {
        Some(mode) => format!(
            "[sandbox {}: runs inside bubblewrap, environment cut to an allowlist] {line}",
            mode.as_str()
        ),
        None => line,
    }
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
    let mut start = SandboxStart::default();
    let start_ref = &mut start;
    let process = process::run(spec, limits, stop, on_spawn, |mut line| {
        if sandbox.is_some() {
            start_ref.see(&line);
        }
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
    if let Some(sandbox) = sandbox {
        start.judge(sandbox.mode.as_str(), process.exit_code, &mut report);
        if let Some(finding) = start.denied_finding() {
            sandbox.note(&cwd, finding);
        }
    }
    redact_report(&mut report, &redactor);
    Ok(SessionEnd {
        process,
        report,
        strays,
    })
}

/// What a sandboxed session's output says of bubblewrap's own start: the `bwrap: …` lines it
/// printed on stderr before any other output. bubblewrap prefixes its own errors with `bwrap: `
/// and exits 1 when it cannot build the sandbox (a mount refused, user namespaces turned off
/// since the run started, a path gone); the agent has not run then, so the failure is the
/// sandbox's, and no retry of the agent fixes it.
#[derive(Debug, Default)]
pub struct SandboxStart {
    /// bubblewrap's own lines, in order (ANSI codes stripped).
    bwrap_lines: Vec<String>,
    /// Whether any other line came (then the agent, or bubblewrap's child, ran).
    other_output: bool,
    /// Lines of the agent's output (its tools' results included) that report a write the
    /// read-only file system refused ([`DENIED_WRITE`]).
    denied_writes: u32,
}

/// `strerror(EROFS)`, what a tool prints when the sandbox's read-only mounts refuse a write.
pub const DENIED_WRITE: &str = "Read-only file system";

impl SandboxStart {
    /// Takes one output line of the sandboxed process, before redaction.
    pub fn see(&mut self, line: &process::OutputLine) {
        let text = process::strip_ansi(&line.text);
        let text = text.trim();
        // git ≥ 2.45 deletes the `AUTO_MERGE` pseudo-ref on every commit, which locks
        // `packed-refs` in the common git directory; a `--parallel` worker's sandbox keeps that
        // read-only, and the commit succeeds regardless: not a write the agent's tools need.
        if text.contains(DENIED_WRITE) && !text.contains("packed-refs.lock") {
            self.denied_writes += 1;
        }
        if !self.other_output
            && line.stream == process::StreamKind::Stderr
            && text.starts_with("bwrap: ")
        {
            self.bwrap_lines.push(text.to_owned());
        } else if !text.is_empty() {
            self.other_output = true;
        }
    }

    /// Whether bubblewrap failed before the agent started: exit code 1, its own lines, and
    /// nothing else printed.
    pub fn failed(&self, exit_code: Option<i32>) -> bool {
        exit_code == Some(1) && !self.bwrap_lines.is_empty() && !self.other_output
    }

    /// The finding for the record when the agent's output reported writes the sandbox refused
    /// (`None` when it reported none): how many lines say so, and where a path that must be
    /// writable goes.
    pub fn denied_finding(&self) -> Option<String> {
        (self.denied_writes > 0).then(|| {
            format!(
                "the sandbox refused writes: {} of the agent's output {} `{DENIED_WRITE}`; a path its tools must write outside the worktree goes in --sandbox-writable (sandbox_writable in ralph.toml)",
                if self.denied_writes == 1 {
                    "1 line".to_owned()
                } else {
                    format!("{} lines", self.denied_writes)
                },
                if self.denied_writes == 1 { "says" } else { "say" }
            )
        })
    }

    /// When [`SandboxStart::failed`]: makes `report` a config failure (the run stops, as for a
    /// sandbox that cannot be built at its start) whose message quotes bubblewrap and names
    /// `--sandbox <mode>`.
    pub fn judge(&self, mode: &str, exit_code: Option<i32>, report: &mut AgentReport) {
        if !self.failed(exit_code) {
            return;
        }
        report.is_error = true;
        report.failure = Some(crate::protocol::FailureClass::Config);
        report.error_message = Some(format!(
            "--sandbox {mode}: bubblewrap could not start the agent ({}); the agent did not run. `ralph doctor` checks bubblewrap; ralph never runs the agent unsandboxed when a sandbox was asked for",
            self.bwrap_lines.join("; ")
        ));
    }
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
    use crate::process::OutputLine;

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
    fn bubblewrap_failing_before_the_agent_is_a_config_failure_naming_it() {
        let err = |t: &str| OutputLine {
            stream: process::StreamKind::Stderr,
            text: t.into(),
            truncated_from: None,
        };
        let mut start = SandboxStart::default();
        start.see(&err(
            "bwrap: Can't mount proc on /newroot/proc: Operation not permitted",
        ));
        let mut report = AgentReport::default();
        start.judge("fs", Some(1), &mut report);
        assert_eq!(report.failure, Some(crate::protocol::FailureClass::Config));
        let message = report.error_message.unwrap_or_default();
        assert!(
            message.contains("--sandbox fs: bubblewrap could not start the agent")
                && message.contains("Can't mount proc"),
            "{message}"
        );
        // Another exit code, or output before bwrap's line: the agent ran; its failure is its own.
        let mut report = AgentReport::default();
        start.judge("fs", Some(2), &mut report);
        assert_eq!(report.failure, None);
        let mut ran = SandboxStart::default();
        ran.see(&OutputLine::stdout("{\"type\":\"system\"}"));
        ran.see(&err("bwrap: late message"));
        let mut report = AgentReport::default();
        ran.judge("fs", Some(1), &mut report);
        assert_eq!(report.failure, None);
        assert!(!ran.failed(Some(1)));
    }

    #[test]
    fn writes_the_sandbox_refused_are_counted_into_a_finding() {
        let mut start = SandboxStart::default();
        assert_eq!(start.denied_finding(), None);
        start.see(&OutputLine::stdout(
            "touch: cannot touch '/etc/x': Read-only file system",
        ));
        start.see(&OutputLine::stdout("all good"));
        let one = start.denied_finding().unwrap_or_default();
        assert!(
            one.starts_with("the sandbox refused writes: 1 line of the agent's output says"),
            "{one}"
        );
        start.see(&OutputLine::stdout(
            "{\"type\":\"user\",\"content\":\"mkdir: cannot create directory '/usr/x': Read-only file system\"}",
        ));
        start.see(&OutputLine::stdout(
            "error: Unable to create '/m/.git/packed-refs.lock': Read-only file system",
        ));
        let two = start.denied_finding().unwrap_or_default();
        assert!(
            two.contains("2 lines") && two.contains("--sandbox-writable"),
            "{two}"
        );
    }

    #[test]
    fn the_shown_command_line_says_it_runs_in_the_sandbox() {
        let spec = SpawnSpec {
            program: "claude".into(),
            cwd: "/w".into(),
            ..SpawnSpec::default()
        };
        let plain = shown_command_line(&spec, None, None);
        assert_eq!(plain, "cd /w && claude < /dev/null");
        assert_eq!(
            shown_command_line(&spec, Some(crate::protocol::SandboxMode::Off), None),
            plain
        );
        assert_eq!(
            shown_command_line(&spec, Some(crate::protocol::SandboxMode::Strict), None),
            format!(
                "[sandbox strict: runs inside bubblewrap, environment cut to an allowlist] {plain}"
            )
        );
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
