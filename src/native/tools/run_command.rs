//! `run_command`: `bash -lc <command>` in the repository, through [`crate::process::run`], so the
//! command gets its own process group, a wall-clock limit that kills the whole group, and the
//! session's stop signals. Output is kept as head plus tail within the output cap, with the size
//! of what was left out, so a noisy build cannot flood the context yet its verdict (usually at
//! the end) survives. The model reads the output and `[exit code N]`, not how long the command
//! took (the transcript's timestamps show that, `ralph show`), so the same command reads the same
//! on every run.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{lenient, summary, ToolContext, ToolError, ToolOutput};
use crate::process::{self, EndReason, Limits, LineVerdict, ProcessError, SpawnSpec};

pub(super) const DESCRIPTION: &str = "Run a shell command with `bash -lc` in the repository \
    root. Returns its combined stdout and stderr (long output keeps its beginning and end) and \
    its exit code; a non-zero exit code is reported, not hidden. Non-interactive: stdin is empty. \
    Processes it leaves running in the background are killed when it ends. Killed after \
    `timeout_s` seconds (default 120).";

/// Longest `timeout_s` accepted: one hour.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Between SIGTERM and SIGKILL when the command times out or the session stops.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long output is still read after bash exited, while a background process holds the pipe.
const EXIT_DRAIN: Duration = Duration::from_secs(1);
/// Longest single line kept whole (bytes); the head-and-tail cut happens later.
const MAX_LINE_BYTES: usize = 1024 * 1024;

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command line, e.g. `cargo test 2>&1 | tail -n 30`."},
            "timeout_s": {"type": "integer", "description": "Seconds before the command is killed (default 120, at most 3600)."}
        },
        "required": ["command"]
    })
}

/// `run_command` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    pub command: String,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub timeout_s: Option<u64>,
}

pub(super) async fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    if args.command.trim().is_empty() {
        return Err(ToolError::RespondToModel(
            "command is empty; give a bash command line".into(),
        ));
    }
    let timeout = args
        .timeout_s
        .map_or(ctx.command_timeout, Duration::from_secs)
        .clamp(Duration::from_secs(1), MAX_TIMEOUT);
    let spec = SpawnSpec {
        program: "bash".into(),
        // The outer shell sends stderr into stdout and then becomes the login shell: one pipe
        // keeps the two streams in the order they were written (two pipes would interleave them
        // by arrival), and the login profile's own messages land in the same place.
        args: vec![
            "-c".into(),
            "exec 2>&1; exec bash -lc \"$1\"".into(),
            "bash".into(),
            args.command.clone(),
        ],
        cwd: ctx.repo_root.clone(),
        env_remove: ctx.env_remove.clone(),
        env_set: vec![
            ("PAGER".into(), "cat".into()),
            ("GIT_PAGER".into(), "cat".into()),
            ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ],
        stdin: None,
    };
    let limits = Limits {
        timeout,
        // Silence is normal (a compiler thinking); only the wall clock counts.
        idle_timeout: timeout,
        kill_grace: KILL_GRACE,
        exit_drain: EXIT_DRAIN,
        final_grace: timeout,
        max_line_bytes: MAX_LINE_BYTES,
    };
    let mut output = HeadTail::new(ctx.max_output_bytes);
    let outcome = process::run(
        spec,
        &limits,
        &ctx.stop,
        |_| {},
        |line| {
            output.push(line.text.as_bytes());
            if let Some(full) = line.truncated_from {
                output.skip(full.saturating_sub(line.text.len()));
            }
            output.push(b"\n");
            LineVerdict::Continue
        },
    )
    .await
    .map_err(|err| match err {
        ProcessError::NotFound { .. } => ToolError::Fatal(
            "run_command needs `bash`, which was not found on PATH; install bash".into(),
        ),
        other @ (ProcessError::Spawn { .. } | ProcessError::Unrunnable { .. }) => {
            ToolError::Fatal(format!("run_command could not start bash: {other}"))
        }
    })?;

    let seconds = outcome.elapsed.as_secs_f64();
    let status = match (outcome.end, outcome.exit_code, outcome.signal) {
        (EndReason::TimedOut, ..) => format!(
            "timed out after {} s: the command and every process it started were killed; give \
             a larger timeout_s or split the work",
            timeout.as_secs()
        ),
        (EndReason::Cancelled, ..) => "stopped: ralph is shutting down".to_string(),
        (_, Some(code), _) => format!("exit code {code}"),
        (_, None, Some(signal)) => format!("killed by signal {signal}"),
        (_, None, None) => "ended without an exit status".to_string(),
    };
    let mut content = output.render();
    if content.is_empty() {
        content.push_str("(no output)\n");
    }
    let size = if output.omitted() > 0 {
        format!("; output was {} bytes", output.total)
    } else {
        String::new()
    };
    // How long it took is not in what the model reads (the transcript's timestamps show it):
    // the same command must read the same on a busy machine and an idle one, so that a local
    // model at temperature 0 is asked the same thing on every run.
    let _ = write!(content, "[{status}{size}]");
    let short_status = match outcome.end {
        EndReason::TimedOut => "timed out".to_string(),
        EndReason::Cancelled => "stopped".to_string(),
        _ => outcome
            .exit_code
            .map_or_else(|| "killed".to_string(), |code| format!("exit {code}")),
    };
    // The status goes first so a long command cannot push it out of the summary.
    Ok(ToolOutput {
        content,
        summary: summary(&format!(
            "run_command ({short_status}, {seconds:.1} s): {}",
            args.command.trim()
        )),
    })
}

/// The first and last halves of a byte stream within a budget, and how much was in between.
#[derive(Debug)]
struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    half: usize,
    /// Every byte seen, kept or not.
    total: usize,
}

impl HeadTail {
    /// Keeps at most `budget` bytes: half from the start, half from the end.
    fn new(budget: usize) -> HeadTail {
        let half = (budget / 2).max(1);
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            half,
            total: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len();
        let room = self.half - self.head.len();
        let (front, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(front);
        if rest.len() >= self.half {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.half..]);
        } else {
            self.tail.extend(rest);
            let excess = self.tail.len().saturating_sub(self.half);
            self.tail.drain(..excess);
        }
    }

    /// Counts `n` bytes that were never delivered (the cut end of an over-long line).
    fn skip(&mut self, n: usize) {
        self.total += n;
    }

    fn omitted(&self) -> usize {
        self.total - self.head.len() - self.tail.len()
    }

    /// The kept text, with `[… N bytes omitted …]` where the middle was dropped. Bytes are
    /// decoded lossily (a character cut at a boundary shows as U+FFFD).
    fn render(&self) -> String {
        let (tail_a, tail_b) = self.tail.as_slices();
        let tail = [tail_a, tail_b].concat();
        let omitted = self.omitted();
        if omitted == 0 {
            return String::from_utf8_lossy(&[self.head.as_slice(), &tail].concat()).into_owned();
        }
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = writeln!(out, "[… {omitted} bytes omitted …]");
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut buf = HeadTail::new(100);
        buf.push(b"hello\n");
        buf.push(b"world\n");
        assert_eq!(buf.omitted(), 0);
        assert_eq!(buf.render(), "hello\nworld\n");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_middle() {
        let mut buf = HeadTail::new(20);
        for i in 0..100 {
            buf.push(format!("{i:03}\n").as_bytes());
        }
        assert_eq!(buf.total, 400);
        assert_eq!(buf.omitted(), 380);
        let text = buf.render();
        assert!(text.starts_with("000\n001\n"), "{text}");
        assert!(text.ends_with("098\n099\n"), "{text}");
        assert!(text.contains("[… 380 bytes omitted …]"), "{text}");
    }

    #[test]
    fn one_huge_chunk_is_split_between_head_and_tail() {
        let mut buf = HeadTail::new(10);
        buf.push(&[b'a'; 50]);
        buf.push(b"xyz");
        buf.skip(7);
        assert_eq!(buf.total, 60);
        assert_eq!(buf.omitted(), 50);
        assert!(buf.render().ends_with("aaxyz"));
    }
}
