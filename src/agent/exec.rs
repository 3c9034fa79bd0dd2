//! The exec backend: any command, the prompt on stdin, plain-text output.
//!
//! `--agent-cmd` is split into words like a POSIX shell would (quotes, backslashes; the `shlex`
//! crate) but never run through one: no expansion, no substitution. The prompt goes to stdin,
//! byte for byte, so nothing in a story title can reach a command line.
//!
//! Reading: every non-blank stdout line is shown as assistant text. The *final text* — the
//! only place the completion promise counts (design: "Completion: never lie") — is the last
//! non-empty stdout line after every echo of the prompt has been removed. An echo is the
//! prompt's lines as a contiguous block (leading and trailing blank lines of the prompt
//! ignored, trailing whitespace of each line ignored); the block may start at the end of a
//! line and end at the start of one, so the prompt embedded verbatim in longer output (e.g.
//! `Prompt: <prompt>`) is found too. Only the part that is the prompt is removed.
//!
//! Failures: stderr is the agent's error channel (classified when the run failed). Stdout is
//! mostly the agent's work and its tools' output, so ralph trusts it only this far: the final
//! line alone (the agent's last word, echoes removed) is read, and only
//! - as a **usage-limit notice** ([`is_limit_notice`]: the line starts with one of the limit
//!   wordings and names a reset, e.g. `Weekly limit reached ∙ resets 5am`, or
//!   `Claude AI usage limit reached|1753441200`), whatever the exit code: `claude -p` in text
//!   mode prints its limit as its answer, and some versions exit 0 after it. The run is then a
//!   usage limit with that reset time;
//! - as one of the **error answers** a CLI prints in text mode instead of an answer
//!   ([`ANSWER_ERRORS`]: `API Error: 500 …`, `Invalid API key · …`, `There's an issue with the
//!   selected model (…)`, …), only when the run failed (exit code not 0).
//!
//! Exit code 127 or 126 with no class from stderr or the final line is `config_error`: a shell,
//! `env` or a wrapper script says so when it could not run a command (not found, not
//! executable), and it would fail the same way every iteration.
//!
//! No other stdout line is ever classified: a test's `401 Unauthorized`, a grep for
//! "usage limit", or an answer that discusses limits stays what it is.
//!
//! Memory stays bounded whatever the output length: the parser keeps a window of as many
//! lines as the prompt has, plus the last non-empty line that left the window.
//!
//! **Answer sessions** (`ralph plan`, `ralph convert`, [`ExecParser::for_answer`]) read the
//! whole stdout instead of its last line: the document the agent answers with may be
//! pretty-printed over many lines, fenced, or come after log lines. The final text is then every
//! stdout line, echoes of the prompt cut out as above, at most [`ANSWER_MAX_BYTES`] (the end is
//! kept: the document comes last).

use std::collections::VecDeque;
use std::path::PathBuf;

use crate::agent::classify::{is_limit_notice, Signal};
use crate::agent::claude::ENV_REMOVED;
use crate::agent::registry::{no_traps, BackendInfo, PromptVia, SandboxNeeds};
use crate::agent::stream::{Dialect, Parser, StreamCore};
use crate::agent::{AgentSettings, Backend, OutputParser};
use crate::process::{strip_ansi, SpawnSpec};
use crate::protocol::AgentEvent;
use crate::protocol::AgentKind;
use crate::protocol::FailureClass;

/// Facts about the exec backend: no CLI of its own (the program is `--agent-cmd`'s, which may
/// do anything with `--version`), and plain text has no terminal event.
pub const INFO: BackendInfo = BackendInfo {
    kind: AgentKind::Exec,
    program: None,
    install_hint: "see README.md",
    version_probe: false,
    final_event: false,
    prompt: PromptVia::Stdin,
    doctor: no_traps,
    notes: crate::agent::registry::no_notes,
    build: |settings| Ok(Box::new(Exec::new(settings)?)),
    sandbox: SandboxNeeds::NONE,
};

/// Interpreters whose first argument (not a flag) is the script to run.
const INTERPRETERS: &[&str] = &[
    "bash", "sh", "dash", "zsh", "ksh", "fish", "python", "python3", "node", "deno", "bun", "ruby",
    "perl", "php",
];

/// The script an `--agent-cmd` runs through an interpreter (`bash ./agent.sh`, `python3
/// tools/agent.py`) when it does not exist, relative to `dir` (the repository root, where the
/// agent runs); `None` when the command is not an interpreter with a script argument, or the
/// script exists. `-c`/`-e`/`-m` forms (code, not a file) are never a script.
pub fn missing_script(agent_cmd: &str, dir: &std::path::Path) -> Option<String> {
    let words = shlex::split(agent_cmd)?;
    let (program, args) = words.split_first()?;
    let name = std::path::Path::new(program).file_name()?.to_str()?;
    if !INTERPRETERS.contains(&name) {
        return None;
    }
    let mut script = None;
    for arg in args {
        if matches!(arg.as_str(), "-c" | "-e" | "-m" | "--eval" | "-") {
            return None;
        }
        if !arg.starts_with('-') {
            script = Some(arg);
            break;
        }
    }
    let script = script?;
    (!dir.join(script).exists()).then(|| script.clone())
}

/// Why an exec backend could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// `--agent exec` without a command.
    #[error(
        "`--agent exec` needs a command to run: pass --agent-cmd \"my-agent --flag\" \
         (or set RALPH_AGENT_CMD)"
    )]
    MissingCommand,
    /// The command line has an unclosed quote or a trailing backslash.
    #[error(
        "--agent-cmd `{cmd}` cannot be split into words: close the quote or remove the \
         trailing backslash (it is split like a shell command line but never run by a shell)"
    )]
    Unsplittable {
        /// The command line as given.
        cmd: String,
    },
    /// The command line has no words.
    #[error("--agent-cmd is empty: give the program to run, e.g. --agent-cmd \"my-agent --flag\"")]
    Empty,
}

/// The exec backend: runs `--agent-cmd` as `program args...` in the repository.
#[derive(Debug, Clone)]
pub struct Exec {
    program: String,
    args: Vec<String>,
    repo: PathBuf,
}

impl Exec {
    /// A backend for `settings.agent_cmd`, run in `settings.repo`. `settings.program` and
    /// `settings.model` are not used: the command line says everything.
    ///
    /// # Errors
    /// [`ExecError::MissingCommand`] when `agent_cmd` is `None`, [`ExecError::Unsplittable`]
    /// when it has an unclosed quote, [`ExecError::Empty`] when it has no words.
    pub fn new(settings: AgentSettings) -> anyhow::Result<Self> {
        let cmd = settings.agent_cmd.ok_or(ExecError::MissingCommand)?;
        let mut words =
            shlex::split(&cmd).ok_or_else(|| ExecError::Unsplittable { cmd: cmd.clone() })?;
        if words.is_empty() {
            return Err(ExecError::Empty.into());
        }
        let program = words.remove(0);
        Ok(Exec {
            program,
            args: words,
            repo: settings.repo,
        })
    }

    /// The program (first word of `--agent-cmd`).
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The arguments (the remaining words of `--agent-cmd`).
    pub fn args(&self) -> &[String] {
        &self.args
    }
}

impl Backend for Exec {
    fn info(&self) -> &'static BackendInfo {
        &INFO
    }

    /// `program args...` in the repository, the prompt on stdin, `NO_COLOR=1`, and the Claude
    /// Code session variables removed (a wrapped `claude` would otherwise refuse to start when
    /// ralph runs inside a Claude Code session). Never fails: the command was checked in
    /// [`Exec::new`].
    fn command(&self, prompt: &str) -> anyhow::Result<SpawnSpec> {
        Ok(SpawnSpec {
            program: PathBuf::from(&self.program),
            args: self.args.clone(),
            cwd: self.repo.clone(),
            env_remove: ENV_REMOVED.iter().map(|s| (*s).to_owned()).collect(),
            env_set: vec![("NO_COLOR".to_owned(), "1".to_owned())],
            stdin: Some(prompt.as_bytes().to_vec()),
        })
    }

    fn parser(&self, prompt: &str) -> Box<dyn OutputParser> {
        Box::new(ExecParser::new(prompt, &self.program))
    }

    /// The whole stdout is the answer ([`ExecParser::for_answer`]).
    fn answer_parser(&self, prompt: &str) -> Box<dyn OutputParser> {
        Box::new(ExecParser::for_answer(prompt, &self.program))
    }
}

/// How much of an answer session's stdout [`ExecParser::for_answer`] keeps, in bytes (the end of
/// it when there is more): 4 MiB, far above a prd.json of hundreds of stories.
pub const ANSWER_MAX_BYTES: usize = 4 << 20;

/// How an agent CLI's error answer starts in text mode (`claude -p` without stream-json prints
/// these as its whole answer and exits 1), lowercase. The final line of a failed exec run that
/// starts so is classified like the agent's error channel.
pub const ANSWER_ERRORS: &[&str] = &[
    "api error",
    "invalid api key",
    "not logged in",
    "failed to authenticate",
    "oauth token has expired",
    "credit balance is too low",
    "prompt is too long",
    "there's an issue with the selected model",
    "there\u{2019}s an issue with the selected model",
    "you've hit your",
    "you\u{2019}ve hit your",
    "claude ai usage limit reached",
];

/// Reads plain-text output, removing echoes of the prompt to find the final text.
pub type ExecParser = Parser<ExecDialect>;

impl ExecParser {
    /// A parser for one run of `prompt`; `program` names the agent in error messages.
    pub fn new(prompt: &str, program: &str) -> Self {
        Parser::with(ExecDialect::new(prompt, program))
    }

    /// A parser for an answer session of `prompt` (`ralph plan`, `ralph convert`): the final
    /// text is the whole stdout with echoes of the prompt cut out (at most
    /// [`ANSWER_MAX_BYTES`], the end kept), not only its last line, so that a document printed
    /// over many lines, fenced or after log lines reaches the caller whole. Everything else
    /// (events, failure classes) is as [`ExecParser::new`].
    pub fn for_answer(prompt: &str, program: &str) -> Self {
        let mut dialect = ExecDialect::new(prompt, program);
        dialect.whole = Some(AnswerText::default());
        Parser::with(dialect)
    }
}

/// The stdout lines of an answer session that left the echo window, bounded to
/// [`ANSWER_MAX_BYTES`] (the oldest lines go first).
#[derive(Debug, Default)]
struct AnswerText {
    lines: VecDeque<String>,
    bytes: usize,
}

impl AnswerText {
    fn push(&mut self, line: String) {
        self.bytes += line.len() + 1;
        self.lines.push_back(line);
        while self.bytes > ANSWER_MAX_BYTES {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.len() + 1,
                None => break,
            }
        }
    }
}

/// The plain-text dialect (see the module docs).
#[derive(Debug)]
pub struct ExecDialect {
    program: String,
    /// The prompt's lines, trailing whitespace trimmed, outer blank lines dropped.
    prompt_lines: Vec<String>,
    /// The last `max(prompt_lines.len(), 1)` stdout lines, ANSI stripped, trailing whitespace
    /// trimmed, with any echoed prompt text already cut out.
    window: VecDeque<String>,
    /// The last non-empty line that left the window (no echo can cover it any more).
    last_outside: Option<String>,
    /// An answer session's whole stdout so far (the lines that left the window), `None` for an
    /// iteration (see [`ExecParser::for_answer`]).
    whole: Option<AnswerText>,
}

impl ExecDialect {
    /// The dialect for one run of `prompt`; `program` names the agent in error messages.
    pub fn new(prompt: &str, program: &str) -> Self {
        let lines: Vec<String> = prompt.lines().map(|l| l.trim_end().to_owned()).collect();
        let first = lines.iter().position(|l| !l.is_empty());
        let last = lines.iter().rposition(|l| !l.is_empty());
        let prompt_lines = match (first, last) {
            (Some(a), Some(b)) => lines[a..=b].to_vec(),
            _ => Vec::new(),
        };
        ExecDialect {
            program: program.to_owned(),
            window: VecDeque::with_capacity(prompt_lines.len().max(1) + 1),
            prompt_lines,
            last_outside: None,
            whole: None,
        }
    }

    fn window_size(&self) -> usize {
        self.prompt_lines.len().max(1)
    }

    fn push_stdout(&mut self, line: String) {
        self.window.push_back(line);
        while self.window.len() > self.window_size() {
            if let Some(old) = self.window.pop_front() {
                if let Some(whole) = &mut self.whole {
                    whole.push(old.clone());
                }
                if !old.trim().is_empty() {
                    self.last_outside = Some(old);
                }
            }
        }
        self.cut_echo();
    }

    /// If the window's lines hold the prompt, cut the prompt's text out of them.
    fn cut_echo(&mut self) {
        let p = &self.prompt_lines;
        let n = p.len();
        if n == 0 || self.window.len() < n {
            return;
        }
        let w = &mut self.window;
        if n == 1 {
            if w[0].contains(p[0].as_str()) {
                w[0] = w[0].replace(p[0].as_str(), "");
            }
            return;
        }
        let inner_equal = (1..n - 1).all(|i| w[i] == p[i]);
        if inner_equal && w[0].ends_with(p[0].as_str()) && w[n - 1].starts_with(p[n - 1].as_str()) {
            let keep_head = w[0].len() - p[0].len();
            w[0].truncate(keep_head);
            for line in w.iter_mut().take(n - 1).skip(1) {
                line.clear();
            }
            w[n - 1] = w[n - 1][p[n - 1].len()..].to_owned();
        }
    }

    /// The last non-empty stdout line, echoes cut out, trimmed: an iteration's final text, and
    /// the line read for a limit notice or an error answer.
    fn last_line(&self) -> Option<String> {
        self.window
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .or(self.last_outside.as_ref())
            .map(|l| l.trim().to_owned())
    }

    /// The final text: an answer session's whole stdout (trimmed), else [`Self::last_line`].
    fn final_text(&self) -> Option<String> {
        let Some(whole) = &self.whole else {
            return self.last_line();
        };
        let text = whole
            .lines
            .iter()
            .chain(&self.window)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n");
        // The window adds up to a prompt's worth of lines to the bounded part: cut the head
        // again, at a line's start.
        let mut start = text.len().saturating_sub(ANSWER_MAX_BYTES);
        if start > 0 {
            while !text.is_char_boundary(start) {
                start += 1;
            }
            start = text[start..]
                .find('\n')
                .map_or(text.len(), |i| start + i + 1);
        }
        let text = text[start..].trim();
        (!text.is_empty()).then(|| text.to_owned())
    }
}

impl Dialect for ExecDialect {
    /// Plain text: every stdout line is the agent's.
    fn json_lines(&self) -> bool {
        false
    }

    /// Every non-blank line is shown as assistant text.
    fn stdout(&mut self, line: &str, _core: &mut StreamCore) -> Vec<AgentEvent> {
        let clean = strip_ansi(line).trim_end().to_owned();
        let events = if clean.trim().is_empty() {
            Vec::new()
        } else {
            vec![AgentEvent::AssistantText {
                text: clean.clone(),
            }]
        };
        self.push_stdout(clean);
        events
    }

    /// Classified and kept, not shown: stderr of an arbitrary command is diagnostics, not
    /// necessarily errors.
    fn stderr(&mut self, line: &str, core: &mut StreamCore) -> Vec<AgentEvent> {
        core.note_stderr(line);
        Vec::new()
    }

    /// Report rules: `final_text` is the last non-empty stdout line after removing prompt
    /// echoes (trimmed); `saw_final` is "the process exited by itself" (plain text has no
    /// terminal event); `is_error` is "exit code was not 0" (a signal counts as an error) or
    /// "the final line is a usage-limit notice"; `failure` and `error_message` come from stderr
    /// and the final line as the module docs say, and are reported only for a failed run. No
    /// cost, usage, session or model: plain text does not carry them.
    fn settle(&mut self, core: &mut StreamCore, exit_code: Option<i32>) {
        let final_text = self.final_text();
        core.saw_final = exit_code.is_some();
        core.is_error = exit_code != Some(0);
        if let Some(line) = &self.last_line() {
            let lower = line.to_lowercase();
            if is_limit_notice(line) {
                core.classifier.observe(Signal::Text(line));
                core.error_message = Some(line.clone());
                core.is_error = true;
            } else if core.is_error && ANSWER_ERRORS.iter().any(|p| lower.starts_with(p)) {
                core.classifier.observe(Signal::Text(line));
                core.error_message = Some(line.clone());
            }
        }
        // 126 and 127 are how a shell (or env, or a wrapper script) says it could not run a
        // command: not executable, not found. The same command fails the same way next time,
        // so it is a setup error that stops the run, not a failure to retry.
        if let Some(code @ (126 | 127)) = exit_code {
            if core.failure.is_none() && core.classifier.best().is_none() {
                let said = core
                    .stderr_tail
                    .joined()
                    .and_then(|t| t.lines().last().map(str::to_owned));
                let why = if code == 127 {
                    "not found"
                } else {
                    "not executable"
                };
                core.failure = Some(FailureClass::Config);
                core.error_message = Some(format!(
                    "`{}` exited with code {code}: a command it runs was {why}{}; it would fail the same way every iteration, so fix --agent-cmd (agent_cmd in ralph.toml) and run again",
                    self.program,
                    said.map(|s| format!(" ({s})")).unwrap_or_default()
                ));
            }
        }
        core.final_text = final_text;
    }

    /// The usual sources, then the exit code.
    fn error_message(&self, core: &StreamCore, exit_code: Option<i32>) -> Option<String> {
        core.error_message_chain().or_else(|| match exit_code {
            Some(code) => Some(format!("`{}` exited with code {code}", self.program)),
            None => Some(format!("`{}` was killed by a signal", self.program)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::promise_in_final_text;
    use crate::process::{OutputLine, StreamKind};
    use crate::protocol::{AgentReport, FailureClass};

    const PROMPT: &str = "# Ralph agent instructions\n\nWork on story US-001.\n\nWhen every story passes, reply with\n<promise>COMPLETE</promise>\n";

    fn run(
        prompt: &str,
        stdout: &str,
        stderr: &[&str],
        exit: Option<i32>,
    ) -> (Vec<AgentEvent>, AgentReport) {
        let mut parser: Box<dyn OutputParser> = Box::new(ExecParser::new(prompt, "my-agent"));
        let mut events = Vec::new();
        for l in stdout.split('\n') {
            let line = OutputLine {
                stream: StreamKind::Stdout,
                text: l.to_owned(),
                truncated_from: None,
            };
            events.extend(parser.on_line(&line));
        }
        for l in stderr {
            let line = OutputLine {
                stream: StreamKind::Stderr,
                text: (*l).to_owned(),
                truncated_from: None,
            };
            events.extend(parser.on_line(&line));
        }
        (events, parser.finish(exit))
    }

    fn claims(report: &AgentReport) -> bool {
        promise_in_final_text(report.final_text.as_deref().unwrap_or_default())
    }

    /// Case 1: the agent echoes its whole prompt (which ends with the promise) and nothing else.
    #[test]
    fn case_1_echoed_prompt_only_is_no_completion() {
        let (events, report) = run(PROMPT, PROMPT, &[], Some(0));
        assert!(!claims(&report));
        assert_eq!(report.final_text, None);
        // The echo is still shown as output.
        assert!(events.contains(&AgentEvent::AssistantText {
            text: "<promise>COMPLETE</promise>".into()
        }));
    }

    #[test]
    fn echo_with_text_before_is_removed_and_earlier_text_is_final() {
        let stdout = format!("Reading prompt...\n{PROMPT}\n\n");
        let (_, report) = run(PROMPT, &stdout, &[], Some(0));
        assert_eq!(report.final_text.as_deref(), Some("Reading prompt..."));
        assert!(!claims(&report));
    }

    /// The prompt embedded mid-line (`Prompt: <prompt>`) with text glued after it.
    #[test]
    fn verbatim_echo_inside_lines_is_removed() {
        let prompt = PROMPT.trim_end();
        let stdout = format!("\x1b[2mPrompt: {prompt}\x1b[0m (received)");
        let (_, report) = run(PROMPT, &stdout, &[], Some(0));
        assert_eq!(report.final_text.as_deref(), Some("(received)"));

        let one_line = "Reply <promise>COMPLETE</promise>";
        let (_, report) = run(one_line, &format!("got: {one_line}"), &[], Some(0));
        assert_eq!(report.final_text.as_deref(), Some("got:"));
    }

    #[test]
    fn promise_after_the_echo_counts_as_last_line() {
        let stdout = format!("{PROMPT}Working...\nAll stories pass.\n<promise>COMPLETE</promise>");
        let (_, report) = run(PROMPT, &stdout, &[], Some(0));
        assert!(claims(&report));

        // Echoed twice, then a real claim at the end of a sentence.
        let stdout = format!("{PROMPT}{PROMPT}Done. <promise>COMPLETE</promise>\n\n");
        let (_, report) = run(PROMPT, &stdout, &[], Some(0));
        assert!(claims(&report));
        assert!(!report.is_error);
        assert!(report.saw_final);
    }

    /// Case 2 for plain text, and a promise that is not on the last non-empty line.
    #[test]
    fn case_2_and_promise_not_last_do_not_count() {
        let (_, report) = run(
            PROMPT,
            "I will not print <promise>COMPLETE</promise> until every story passes.\n",
            &[],
            Some(0),
        );
        assert!(!claims(&report));
        let (_, report) = run(
            PROMPT,
            "<promise>COMPLETE</promise>\nUS-002 still fails\n",
            &[],
            Some(0),
        );
        assert!(!claims(&report));
    }

    /// Case 6: the promise as the last line, no trailing newline, ANSI colour around it.
    #[test]
    fn case_6_last_line_without_newline_counts() {
        let (_, report) = run(
            PROMPT,
            "Done.\n\x1b[32m<promise>COMPLETE</promise>\x1b[0m",
            &[],
            Some(0),
        );
        assert!(claims(&report));
    }

    #[test]
    fn long_output_keeps_only_the_last_line() {
        let mut stdout = String::new();
        for i in 0..10_000 {
            stdout.push_str(&format!("line {i}\n"));
        }
        let (events, report) = run(PROMPT, &stdout, &[], Some(0));
        assert_eq!(events.len(), 10_000);
        assert_eq!(report.final_text.as_deref(), Some("line 9999"));
    }

    /// An answer session's parser: the whole stdout, pretty-printed JSON after an echo of the
    /// prompt and log lines, with the echo cut out; the limit notice still read from the last
    /// line; and the window of kept bytes bounded, keeping the end.
    #[test]
    fn an_answer_session_reads_the_whole_stdout_without_the_echo() {
        let answer = |stdout: &str, exit: Option<i32>| {
            let mut parser: Box<dyn OutputParser> =
                Box::new(ExecParser::for_answer(PROMPT, "my-agent"));
            for l in stdout.split('\n') {
                parser.on_line(&OutputLine {
                    stream: StreamKind::Stdout,
                    text: l.to_owned(),
                    truncated_from: None,
                });
            }
            parser.finish(exit)
        };
        let stdout = format!("{PROMPT}starting\n{{\n  \"userStories\": []\n}}\n");
        let report = answer(&stdout, Some(0));
        assert_eq!(
            report.final_text.as_deref(),
            Some("starting\n{\n  \"userStories\": []\n}")
        );
        assert!(!report.is_error);

        let report = answer("{\n}\nClaude AI usage limit reached|1753441200", Some(0));
        assert!(report.is_error);
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));

        let line = "x".repeat(1023);
        let flood = format!("{}tail\n", format!("{line}\n").repeat(5000));
        let text = answer(&flood, Some(0)).final_text.unwrap();
        assert!(text.ends_with("\ntail"), "the end is kept");
        assert!(text.len() <= ANSWER_MAX_BYTES, "{}", text.len());
        assert!(text.len() > ANSWER_MAX_BYTES - 2048, "{}", text.len());
    }

    #[test]
    fn failure_from_stderr_only_when_the_exit_code_says_so() {
        let (_, report) = run(
            PROMPT,
            "",
            &["\x1b[31mError: Invalid API key\x1b[0m"],
            Some(1),
        );
        assert!(report.is_error);
        assert_eq!(report.failure, Some(FailureClass::Auth));
        assert_eq!(
            report.error_message.as_deref(),
            Some("Error: Invalid API key")
        );

        let (_, report) = run(PROMPT, "ok", &["retrying: Overloaded"], Some(0));
        assert!(!report.is_error);
        assert_eq!(report.failure, None);
        assert_eq!(report.error_message, None);

        let (_, report) = run(PROMPT, "", &[], Some(3));
        assert_eq!(
            report.error_message.as_deref(),
            Some("`my-agent` exited with code 3")
        );
        let (_, report) = run(PROMPT, "", &[], None);
        assert!(report.is_error && !report.saw_final);
    }

    /// Exit 127 or 126 (a shell's "not found" and "not executable", e.g. `bash agent.sh` with
    /// no agent.sh) is a setup error that stops the run, naming the command and what the shell
    /// said; a classified failure or any other exit code is left as it was.
    #[test]
    fn a_missing_script_of_an_interpreter_is_found_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agent.sh"), "echo hi\n").unwrap();
        let missing = |cmd: &str| missing_script(cmd, dir.path());
        assert_eq!(
            missing("bash ./missing.sh"),
            Some("./missing.sh".to_owned())
        );
        assert_eq!(
            missing("/usr/bin/python3 -u tools/agent.py --x"),
            Some("tools/agent.py".to_owned())
        );
        assert_eq!(missing("bash ./agent.sh"), None);
        assert_eq!(missing("bash -c 'claude -p'"), None);
        assert_eq!(missing("python3 -m my_agent"), None);
        assert_eq!(missing("my-agent --flag"), None);
        assert_eq!(missing("bash"), None);
    }

    #[test]
    fn a_command_the_shell_could_not_run_is_a_config_error() {
        let (_, report) = run(
            PROMPT,
            "",
            &["bash: ./agent.sh: No such file or directory"],
            Some(127),
        );
        assert_eq!(report.failure, Some(FailureClass::Config));
        let msg = report.error_message.unwrap();
        assert!(msg.contains("`my-agent` exited with code 127"), "{msg}");
        assert!(
            msg.contains("./agent.sh: No such file or directory"),
            "{msg}"
        );
        assert!(msg.contains("--agent-cmd"), "{msg}");

        let (_, report) = run(
            PROMPT,
            "",
            &["/bin/sh: 1: ./a: Permission denied"],
            Some(126),
        );
        assert_eq!(report.failure, Some(FailureClass::Config));
        assert!(report.error_message.unwrap().contains("not executable"));

        let (_, report) = run(PROMPT, "", &["Error: Invalid API key"], Some(127));
        assert_eq!(report.failure, Some(FailureClass::Auth));
        let (_, report) = run(PROMPT, "", &["boom"], Some(2));
        assert_ne!(report.failure, Some(FailureClass::Config));
    }

    /// `claude -p` without stream-json (driven through `--agent exec`) prints its limit as its
    /// answer, with `∙` or `·`, and may exit 0: a usage limit with its reset time.
    #[test]
    fn a_limit_notice_as_the_last_line_is_a_usage_limit() {
        // A clock reset that has just passed ("resets 5am" read at 5:02) is due now, not
        // tomorrow: never before the test began, whatever the time of day.
        let began = chrono::Utc::now() - chrono::Duration::seconds(1);
        for exit in [Some(0), Some(1)] {
            for notice in [
                "Weekly limit reached \u{2219} resets 5am",
                "You're out of extra usage \u{00b7} resets 9pm",
                "5-hour limit reached \u{00b7} resets 7pm (Europe/Berlin)",
            ] {
                let (_, report) = run(PROMPT, &format!("{notice}\n"), &[], exit);
                assert!(report.is_error, "{notice} {exit:?}");
                assert_eq!(report.failure, Some(FailureClass::UsageLimit), "{notice}");
                assert_eq!(report.error_message.as_deref(), Some(notice));
                assert!(
                    report.resume_at.is_some_and(|t| t >= began),
                    "{notice}: {:?}",
                    report.resume_at
                );
            }
        }
    }

    /// A failed text-mode run whose answer is one of claude's error lines is classified by it;
    /// the same line after exit 0, and any other stdout line, are not.
    #[test]
    fn error_answers_count_only_for_a_failed_run() {
        for (answer, class) in [
            ("Invalid API key · Please run /login", FailureClass::Auth),
            ("API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}", FailureClass::Transient),
            ("API Error: 529 Overloaded. This is a server-side issue, usually temporary", FailureClass::Transient),
            ("There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model.", FailureClass::Config),
        ] {
            let (_, report) = run(PROMPT, answer, &[], Some(1));
            assert_eq!(report.failure, Some(class), "{answer}");
            let (_, report) = run(PROMPT, answer, &[], Some(0));
            assert_eq!(report.failure, None, "{answer}");
        }
        let (_, report) = run(
            PROMPT,
            "There's an issue with the selected model (claude-nope-9). Run --model to pick a different model.",
            &[],
            Some(1),
        );
        assert!(report
            .error_message
            .unwrap_or_default()
            .starts_with("the model `claude-nope-9` does not exist"));

        // Tool output on stdout is never read for a class, even in a failed run.
        let stdout = "curl: (22) The requested URL returned error: 401 Unauthorized\nYou've hit your usage limit in the fixture\ntests failed";
        let (_, report) = run(PROMPT, stdout, &[], Some(1));
        assert_eq!(report.failure, None);
        // An answer that discusses a limit and finishes its story is no limit.
        let answer =
            "Added the 'Weekly limit reached ∙ resets 5am' parser.\n<promise>COMPLETE</promise>";
        let (_, report) = run(PROMPT, answer, &[], Some(0));
        assert!(!report.is_error && report.failure.is_none() && claims(&report));
        let answer = "Documented `Weekly limit reached ∙ resets 5am` in README.md.";
        let (_, report) = run(PROMPT, answer, &[], Some(0));
        assert!(!report.is_error && report.failure.is_none());
    }

    #[test]
    fn command_splits_without_a_shell_and_feeds_stdin() {
        let exec = Exec::new(AgentSettings {
            repo: PathBuf::from("/w/repo"),
            agent_cmd: Some(r#"my-agent --flag "two words" '$(rm -rf ~)' a\ b"#.into()),
            ..AgentSettings::default()
        });
        let exec = match exec {
            Ok(e) => e,
            Err(e) => panic!("{e:#}"),
        };
        let prompt = "Story \"quoted\" `backticks` $(rm -rf ~) — ünïcode";
        let spec = match exec.command(prompt) {
            Ok(s) => s,
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(spec.program, PathBuf::from("my-agent"));
        assert_eq!(spec.args, ["--flag", "two words", "$(rm -rf ~)", "a b"]);
        assert_eq!(spec.cwd, PathBuf::from("/w/repo"));
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(spec.env_set, [("NO_COLOR".to_owned(), "1".to_owned())]);
        assert!(spec.env_remove.iter().any(|v| v == "CLAUDECODE"));
        assert_eq!(exec.kind(), AgentKind::Exec);
    }

    #[test]
    fn bad_agent_cmd_is_a_clear_error() {
        let err = |cmd: Option<&str>| match Exec::new(AgentSettings {
            agent_cmd: cmd.map(str::to_owned),
            ..AgentSettings::default()
        }) {
            Ok(_) => panic!("{cmd:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err(None).contains("--agent-cmd"));
        assert!(err(Some("agent 'unclosed")).contains("cannot be split"));
        assert!(err(Some("   ")).contains("empty"));
    }
}
