//! The verify gate's command runner: a story's `verify` (else `--verify`) run with `bash -c` in
//! the repository, in its own process group under the verify time limit, with `RALPH_STORY_ID`
//! set. Its result and, when it fails, the bounded and redacted tail of its output become a
//! [`VerifyRecord`]. Whatever the command left running under the iteration's tag is killed when
//! it ends, and listed ([`Checked::strays`], `after_verify`).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Context as _;

use std::path::Path;

use super::Cx;
use crate::config::RunConfig;
use crate::process::{self, EndReason, Limits, LineVerdict, StopSignals};
use crate::protocol::{StrayFound, StrayProcess, VerifyRecord};

/// A check's `result` when a stop (Ctrl-C, SIGTERM) cut it short.
pub const INTERRUPTED: &str = "was interrupted by the stop (Ctrl-C or SIGTERM) before it finished";

/// A check's `result` when a stop came before its turn.
pub const NOT_RUN: &str = "was not run: a stop (Ctrl-C or SIGTERM) came before its turn";

/// The record of a check a stop cut short (`record`, marked interrupted) or left unrun
/// (`record` is `None`).
pub fn interrupted(record: Option<VerifyRecord>, command: &str, story_id: &str) -> VerifyRecord {
    match record {
        Some(mut r) => {
            r.passed = false;
            r.interrupted = true;
            r.result = Some(INTERRUPTED.to_string());
            r
        }
        None => VerifyRecord {
            story_id: story_id.to_string(),
            command: command.to_string(),
            passed: false,
            result: Some(NOT_RUN.to_string()),
            output_tail: String::new(),
            interrupted: true,
        },
    }
}

/// How long output is still read after the command exited.
const EXIT_DRAIN: Duration = Duration::from_secs(2);

/// Runs `command` for `story_id` after iteration `iteration` (see the module docs). The
/// command carries the iteration's process tag, like its agent, so that whatever it starts is
/// found by a restart's sweep if ralph is killed while it runs.
///
/// # Errors
/// The command could not be started (e.g. no `bash`), naming it.
pub async fn run(
    cx: &Cx<'_>,
    iteration: u32,
    command: &str,
    story_id: &str,
) -> anyhow::Result<Checked> {
    let check = Check {
        cfg: cx.cfg,
        repo_root: &cx.paths.repo_root,
        stop: cx.stop,
        tag: process::agent_tag(cx.run_id, iteration),
        sandbox: cx.sandbox,
    };
    check.run(command, story_id).await
}

/// Where and how a check runs, for the verify gate and for a restart that checks the work an
/// interrupted iteration left (run/recover.rs).
pub struct Check<'a> {
    /// The settings (`verify_timeout`, `kill_grace`).
    pub cfg: &'a RunConfig,
    /// The repository, the command's working directory.
    pub repo_root: &'a Path,
    /// Ctrl-C and friends: a stop ends the check.
    pub stop: &'a StopSignals,
    /// The iteration's process tag ([`process::agent_tag`]).
    pub tag: String,
    /// `--sandbox`: checks run agent-written code, in the agent's sandbox (`None`: off).
    pub sandbox: Option<&'a process::sandbox::Sandbox>,
}

impl Check<'_> {
    /// Runs `command` for `story_id` (see the module docs).
    ///
    /// # Errors
    /// The command could not be started (e.g. no `bash`), naming it.
    pub async fn run(&self, command: &str, story_id: &str) -> anyhow::Result<Checked> {
        let mut spec = process::SpawnSpec {
            program: "bash".into(),
            args: vec!["-c".into(), command.to_string()],
            cwd: self.repo_root.to_path_buf(),
            env_remove: Vec::new(),
            env_set: vec![
                ("RALPH_STORY_ID".into(), story_id.to_string()),
                ("NO_COLOR".into(), "1".into()),
            ],
            stdin: None,
        };
        // The agent's treatment: its tag, no `--push` token, git's housekeeping in the
        // foreground (agent/session.rs).
        crate::agent::session::decorate(&mut spec, &self.tag);
        let cwd = spec.cwd.clone();
        if let Some(sandbox) = self.sandbox {
            spec = sandbox.apply(spec);
        }
        let checked = run_spec(self, spec, command, story_id).await;
        if let Some(sandbox) = self.sandbox {
            sandbox.settle(&cwd);
        }
        checked
    }
}

/// A check's result: its record, and what it left running (killed).
#[derive(Debug)]
pub struct Checked {
    /// The check's record.
    pub record: VerifyRecord,
    /// The processes carrying the iteration's tag that were still running after the command
    /// ended, killed (`after_verify`).
    pub strays: Vec<StrayProcess>,
}

async fn run_spec(
    cx: &Check<'_>,
    spec: process::SpawnSpec,
    command: &str,
    story_id: &str,
) -> anyhow::Result<Checked> {
    let limits = Limits {
        timeout: cx.cfg.verify_timeout,
        idle_timeout: cx.cfg.verify_timeout,
        kill_grace: cx.cfg.kill_grace,
        exit_drain: EXIT_DRAIN,
        final_grace: EXIT_DRAIN,
        max_line_bytes: 64 * 1024,
    };
    let mut tail: VecDeque<String> = VecDeque::new();
    let outcome = process::run(
        spec,
        &limits,
        cx.stop,
        |_| {},
        |line| {
            if tail.len() == VerifyRecord::TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(process::strip_ansi(&line.text));
            LineVerdict::Continue
        },
    )
    .await
    .with_context(|| format!("cannot run the verify command `{command}`"))?;
    // What the command started in a session of its own (setsid, a daemonized server) is no
    // longer linked to it; the iteration's tag still names it.
    let swept = process::sweep_tagged_since(&cx.tag, outcome.pid, outcome.forks_before);
    let strays = super::execute::stray_records(&swept, StrayFound::AfterVerify);
    let result = match (outcome.end, outcome.exit_code) {
        (EndReason::Exited, Some(0)) => None,
        (EndReason::Exited, Some(code)) => Some(format!("exited with code {code}")),
        (EndReason::TimedOut | EndReason::Idle, _) => Some(format!(
            "timed out after {}",
            humantime::format_duration(cx.cfg.verify_timeout)
        )),
        (EndReason::Cancelled, _) => Some(INTERRUPTED.to_string()),
        (_, Some(code)) => Some(format!("exited with code {code}")),
        _ => Some(match outcome.signal {
            Some(signal) => format!("was killed by signal {signal}"),
            None => "was killed".to_string(),
        }),
    };
    let output_tail = match result {
        None => String::new(),
        Some(_) => bounded_tail(&tail, &crate::redact::env_secrets()),
    };
    let record = VerifyRecord {
        story_id: story_id.to_string(),
        command: command.to_string(),
        passed: result.is_none(),
        interrupted: outcome.end == EndReason::Cancelled,
        result,
        output_tail,
    };
    Ok(Checked { record, strays })
}

/// The kept lines joined, secrets redacted, cut to the last [`VerifyRecord::TAIL_BYTES`] bytes
/// (at a line start when one is near).
fn bounded_tail(lines: &VecDeque<String>, secrets: &[String]) -> String {
    let joined = lines.iter().cloned().collect::<Vec<_>>().join("\n");
    let text = crate::redact::redact(&joined, secrets);
    if text.len() <= VerifyRecord::TAIL_BYTES {
        return text;
    }
    let mut cut = text.len() - VerifyRecord::TAIL_BYTES;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    let rest = &text[cut..];
    match rest.find('\n') {
        Some(i) if i < 200 => rest[i + 1..].to_string(),
        _ => rest.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_bounded_and_redacted() {
        let mut lines = VecDeque::new();
        for i in 0..30 {
            lines.push_back(format!("{i:03} {}", "x".repeat(300)));
        }
        lines.push_back("token=supersecretvalue".into());
        let tail = bounded_tail(&lines, &["supersecretvalue".to_string()]);
        assert!(tail.len() <= VerifyRecord::TAIL_BYTES, "{}", tail.len());
        assert!(tail.ends_with("token=<redacted>"), "{tail}");
        assert!(!tail.contains("000 "), "the oldest lines go first");
    }
}
