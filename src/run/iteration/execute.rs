//! Stage 2 of an iteration: run the agent. Its output is parsed line by line by the backend's
//! parser, kept in the transcript and sent to the outputs as [`RunEvent::AgentEvent`]s; the
//! process group id is saved in state.json as soon as it exists. Whatever the agent left running
//! under its tag is killed when it ends. The process goes through the one agent launcher,
//! [`crate::agent::session::run_session`] (tag, environment, redaction, error patterns, strays).

use std::path::PathBuf;

use super::prepare::Launch;
use super::Cx;
use crate::agent::session::{run_session, Session, SessionEnd};
use crate::output::Outputs;
use crate::process::{self, ProcessOutcome};
use crate::protocol::{AgentEvent, AgentReport, RunEvent, StrayFound, StrayProcess};
use crate::state::State;

/// Stage 2's value: how the process ended and what the agent reported.
#[derive(Debug)]
pub struct Execution {
    /// How the process ended.
    pub process: ProcessOutcome,
    /// What the parser concluded.
    pub report: AgentReport,
    /// The transcript's path.
    pub transcript: PathBuf,
    /// What the agent left running after it exited, killed (the record's `strays`).
    pub strays: Vec<StrayProcess>,
}

/// Runs stage 2 (see the module docs). `limits.timeout` is the iteration's own limit.
///
/// # Errors
/// The agent could not be started (nothing ran: the iteration is taken back in state.json), or
/// state.json could not be written.
pub async fn execute(
    cx: &Cx<'_>,
    state: &mut State,
    launch: Launch,
    iteration: u32,
    limits: &process::Limits,
    out: &mut Outputs,
) -> anyhow::Result<Execution> {
    let Launch {
        prompt,
        spec,
        mut transcript,
    } = launch;
    let ralph_dir = cx.paths.ralph_dir.clone();
    // The one agent launcher (tag, environment, redaction, error patterns, stray kill), shared
    // with `ralph plan`/`convert`.
    let session = Session {
        spec,
        parser: cx.backend.parser(&prompt),
        tag: process::agent_tag(cx.run_id, iteration),
        limits,
        stop: cx.stop,
        patterns: &cx.cfg.patterns,
        sandbox: cx.sandbox,
    };
    let run_result = {
        let state_ref = &mut *state;
        let transcript_ref = &mut transcript;
        let out_ref = &mut *out;
        run_session(
            session,
            |pid| {
                // Persist the group id at once: a ralph killed now must find it on restart.
                if let Some(f) = state_ref.in_flight.as_mut() {
                    f.pid = pid;
                }
                let _ = state_ref.save(&ralph_dir);
            },
            |seen| {
                transcript_ref.line_as(seen.line, seen.is_json);
                for event in seen.events {
                    transcript_ref.event(&event);
                    if matches!(
                        event,
                        AgentEvent::ToolCall { .. } | AgentEvent::AssistantText { .. }
                    ) {
                        transcript_ref.flush_now();
                    }
                    out_ref.emit(RunEvent::AgentEvent {
                        iteration,
                        agent_event: event,
                    });
                }
            },
        )
        .await
    };
    let SessionEnd {
        process,
        report,
        strays: swept,
    } = match run_result {
        Ok(o) => o,
        Err(e) => {
            // The agent could not even start: nothing ran, so nothing to record as an iteration.
            state.in_flight = None;
            state.iteration = iteration - 1;
            state.save(&cx.paths.ralph_dir)?;
            return Err(e.into());
        }
    };
    let strays = stray_records(&swept, StrayFound::AfterAgent);
    // Saved with the in-flight iteration at once: a ralph killed before this iteration's record
    // is written must still list them (the restart's record, run/recover.rs).
    state.note_strays(&cx.paths.ralph_dir, &strays)?;
    if !strays.is_empty() {
        out.warn_in(
            iteration,
            format!(
                "iteration {iteration}: killed {} the agent left running: {}",
                plural_processes(strays.len()),
                describe_strays(&strays)
            ),
        );
    }
    transcript.note(
        "end",
        serde_json::json!({"end": process.end, "exit_code": process.exit_code,
            "signal": process.signal, "report": &report}),
    );
    let fallback = cx.paths.transcript(cx.run_id, iteration);
    let transcript_path = match transcript.finish() {
        Ok(p) => p,
        Err(e) => {
            out.warn_in(
                iteration,
                format!("transcript of iteration {iteration} is incomplete: {e}"),
            );
            fallback
        }
    };
    Ok(Execution {
        process,
        report,
        transcript: transcript_path,
        strays,
    })
}

/// The processes a sweep killed, as the ledger keeps them: the command line with secrets
/// redacted and cut to 300 characters.
pub fn stray_records(swept: &[process::Stray], found: StrayFound) -> Vec<StrayProcess> {
    let redactor = crate::redact::current();
    swept
        .iter()
        .map(|s| {
            let command = redactor.redact_string(&s.command);
            // Cut at a character boundary.
            let command = match command.char_indices().nth(300) {
                Some((cut, _)) => format!("{}…", &command[..cut]),
                None => command,
            };
            StrayProcess {
                pid: s.pid,
                command,
                found,
            }
        })
        .collect()
}

/// `pid 123 (sleep 300), pid 456 (node server.js)`.
pub fn describe_strays(strays: &[StrayProcess]) -> String {
    strays
        .iter()
        .map(|s| format!("pid {} ({})", s.pid, s.command))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1 process`, `2 processes`.
pub fn plural_processes(n: usize) -> String {
    format!("{n} process{}", if n == 1 { "" } else { "es" })
}
