//! `ralph-fake-agent`: a scripted stand-in for agent CLIs, used only by ralph's tests (built with
//! `--features test-fakes`). It can speak claude's stream-json dialect (shapes from
//! `notes/agent-protocols.md` §1 and what claude 2.1.332 prints, `notes/real-clis.md` §1) or plain
//! text, touch the repository like an agent would, and misbehave on purpose (hang, ignore
//! SIGTERM, leave a grandchild holding stdout, print invalid UTF-8).
//!
//! Driven by `RALPH_FAKE_SCRIPT=<path to a JSON script>`. Command-line arguments are ignored
//! (only recorded), so the fake can stand in for `claude -p ...` or any `--agent-cmd`; only a
//! lone `--version` is answered directly (`ralph-fake-agent 0.0.0 (test stand-in)`), without
//! playing or counting the script, as ralph asks every CLI for its version.
//!
//! # Script
//! ```json
//! {
//!   "invocations": [ [ACTION, ...], [ACTION, ...] ],
//!   "default": [ACTION, ...],
//!   "record_env": ["EXTRA_VAR"]
//! }
//! ```
//! Invocation `n` (0-based, counted across processes in `<script>.count`) runs
//! `invocations[n]`; past the end it runs `"default"` when present, else the last invocation
//! again. Actions run in order; the process exits 0 after the last one unless an `exit` action
//! came first. Unknown keys are refused, so a typo in a test script fails loudly (exit 97).
//!
//! Each run appends one line to `<script>.calls.jsonl`:
//! `{"n": 0, "pid": 4242, "argv": ["-p", ...], "cwd": "/abs", "env": {"CLAUDECODE": null, "IS_SANDBOX": "1", ...}}`
//! where `env` holds `CLAUDECODE`, `CLAUDE_CODE_ENTRYPOINT`, `CLAUDE_CODE_SSE_PORT`,
//! `IS_SANDBOX`, `NO_COLOR` and every name in `record_env` (`null` when unset).
//!
//! # Actions (one key each)
//! Output:
//! - `{"stdout": "text"}` / `{"stderr": "text"}`: the text plus `\n`.
//! - `{"stdout_raw": "text"}`: the text exactly (no newline: a partial last line).
//! - `{"stdout_bytes": [255, 254, 10]}`: exact bytes (invalid UTF-8, CRLF, ...).
//! - `{"stdout_repeat": {"text": "x", "count": 6000000, "newline": true}}`: one huge line.
//! - `{"stdout_flood": {"line": "text", "bytes": 2147483648}}`: the line over and over until that
//!   many bytes went out (streamed: the fake stays small).
//! - `{"json": {...}}`: the value as one compact JSON line.
//!
//! Claude stream-json helpers (message ids, session id and `type`-last result order are filled
//! in like claude 2.1.332 does; blocks of one turn share a `message.id`, a tool result ends the
//! turn):
//! - `{"claude_init": {"session_id": "s", "model": "m", "version": "2.1.332"}}` (all optional).
//! - `{"claude_text": "text"}`: one top-level assistant text block.
//! - `{"claude_tool": {"name": "Bash", "input": {...}, "result": "out", "is_error": false}}`:
//!   an assistant `tool_use` block, then (when `result` is given) the `user` tool_result line.
//! - `{"claude_tool_result": {"content": "text", "repeat": 1, "is_error": false}}`: a `user`
//!   tool_result line whose content is `content` repeated `repeat` times.
//! - `{"claude_result": {"text": "..", "is_error": false, "cost_usd": 0.01, "subtype": "success",
//!   "api_error_status": null, "terminal_reason": "completed", "usage": {..}, "omit_cost": false}}`: the terminal
//!   line, `"type":"result"` last. `text` omitted means no `result` field.
//! - `{"claude_usage_limit": {"message": "You've hit your ...", "resets_at": 1790161200}}`
//!   (or `"resets_in_s": 2`, counted from when the fake plays it): a
//!   rejected `rate_limit_event`, the synthetic assistant message and an `is_error` result with
//!   status 429 (add `{"exit": 1}` after it, as claude does).
//! - `{"claude_api_error": {"status": 500, "message": "API Error: 500 ..."}}`: an `api_retry`
//!   line, the synthetic assistant message, and a `subtype:"success", is_error:true` result.
//!
//! Stdin and files (paths relative to the working directory):
//! - `{"read_stdin": true}`: read stdin to EOF (kept for the actions below).
//! - `{"save_stdin": "path"}`: write the exact stdin bytes to `path` (reads to EOF first).
//! - `{"echo_stdin": true}`: copy the stdin bytes to stdout (reads to EOF first).
//! - `{"write_file": {"path": "p", "content": "c"}}` / `{"append_file": {...}}`.
//! - `{"set_passes": {"id": "US-001", "passes": true, "prd": "prd.json"}}`: edit the story's
//!   `passes` in `prd` (default `./prd.json`), keeping key order and other fields, pretty-printed.
//!   The id `"@next"` means the open story ralph would pick: the lowest `priority` among those
//!   with `passes: false` (first in file order on a tie).
//! - `{"corrupt_prd": true}`: make `./prd.json` invalid JSON (its first comma removed).
//! - `{"git_commit": "message"}`: `git add -A && git commit -m message` as "ralph-fake-agent".
//!
//! Processes and time:
//! - `{"sleep_ms": 250}`.
//! - `{"ignore_sigterm": true}`: this process ignores SIGTERM from now on.
//! - `{"spawn_grandchild": {"ignore_term": true, "hold_stdout": true, "sleep_s": 60,
//!   "pid_file": "gc.pid", "setsid": false}}`: start `sh -c 'sleep N'` in the background,
//!   optionally ignoring SIGTERM, inheriting (holding open) stdout, and leaving the agent's process
//!   group and session with `setsid(2)` (as daemons and dev servers do); its pid is written to
//!   `pid_file` when given.
//! - `{"exit": 3}`: exit now with that code.
//!
//! Exit code 97 means the fake itself failed (bad script, I/O error); the message is on stderr.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

mod amp;
mod codex;
mod cursor;
mod gemini;
mod opencode;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Exit code when the fake itself fails.
const FAKE_FAILED: u8 = 97;
/// Environment variables always recorded in `<script>.calls.jsonl`.
const RECORDED_ENV: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SSE_PORT",
    "IS_SANDBOX",
    "NO_COLOR",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    #[serde(default)]
    invocations: Vec<Vec<Action>>,
    #[serde(default)]
    default: Option<Vec<Action>>,
    #[serde(default)]
    record_env: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Action {
    Stdout(String),
    Stderr(String),
    StdoutRaw(String),
    StdoutBytes(Vec<u8>),
    StdoutRepeat(Repeat),
    StdoutFlood(Flood),
    Json(Value),
    ClaudeInit(ClaudeInit),
    ClaudeText(String),
    ClaudeTool(ClaudeTool),
    ClaudeToolResult(ClaudeToolResult),
    ClaudeResult(ClaudeResult),
    ClaudeUsageLimit(ClaudeUsageLimit),
    ClaudeApiError(ClaudeApiError),
    ReadStdin(bool),
    SaveStdin(PathBuf),
    EchoStdin(bool),
    WriteFile(FileWrite),
    AppendFile(FileWrite),
    SetPasses(SetPasses),
    CorruptPrd(bool),
    GitCommit(String),
    SleepMs(u64),
    IgnoreSigterm(bool),
    SpawnGrandchild(Grandchild),
    Exit(i32),
    /// Codex `exec --json` dialect; shapes in `codex.rs`.
    Codex(Value),
    /// OpenCode `run --format json` dialect; shapes in `opencode.rs`.
    Opencode(Value),
    /// Gemini CLI `--output-format stream-json` dialect; shapes in `gemini.rs`.
    Gemini(Value),
    /// Amp `--stream-json` dialect; shapes in `amp.rs`.
    Amp(Value),
    /// Cursor `cursor-agent --output-format stream-json` dialect; shapes in `cursor.rs`.
    Cursor(Value),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Repeat {
    text: String,
    count: usize,
    #[serde(default = "yes")]
    newline: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Flood {
    /// One line (a newline is added after each copy).
    line: String,
    /// Total bytes to print, newlines included; the last copy may be cut short.
    bytes: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ClaudeInit {
    session_id: Option<String>,
    model: Option<String>,
    version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaudeTool {
    name: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaudeToolResult {
    content: String,
    #[serde(default = "one")]
    repeat: usize,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ClaudeResult {
    text: Option<String>,
    is_error: bool,
    cost_usd: Option<f64>,
    /// Leave `total_cost_usd` out (claude always prints it; this shapes a CLI that does not).
    omit_cost: bool,
    subtype: Option<String>,
    api_error_status: Option<u16>,
    terminal_reason: Option<String>,
    usage: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaudeUsageLimit {
    #[serde(default = "default_limit_message")]
    message: String,
    #[serde(default = "default_resets_at")]
    resets_at: i64,
    /// Seconds from when the fake plays the action (not from when the script was written):
    /// overrides `resets_at`, so that a test's "resets in 2 s" does not depend on how soon
    /// ralph gets to the invocation.
    #[serde(default)]
    resets_in_s: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaudeApiError {
    #[serde(default = "default_error_status")]
    status: u16,
    #[serde(default = "default_api_error_message")]
    message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWrite {
    path: PathBuf,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetPasses {
    id: String,
    passes: bool,
    #[serde(default = "default_prd")]
    prd: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grandchild {
    #[serde(default)]
    ignore_term: bool,
    #[serde(default)]
    hold_stdout: bool,
    #[serde(default = "default_sleep_s")]
    sleep_s: u64,
    #[serde(default)]
    pid_file: Option<PathBuf>,
    #[serde(default)]
    setsid: bool,
}

fn yes() -> bool {
    true
}
fn one() -> usize {
    1
}
fn default_prd() -> PathBuf {
    PathBuf::from("prd.json")
}
fn default_sleep_s() -> u64 {
    60
}
fn default_limit_message() -> String {
    "You've hit your session limit · resets 2pm (Europe/Helsinki)".to_owned()
}
fn default_resets_at() -> i64 {
    1_790_161_200
}
fn default_error_status() -> u16 {
    500
}
fn default_api_error_message() -> String {
    "API Error: 500 scripted failure. This is a server-side issue, usually temporary.".to_owned()
}

/// What the fake remembers while it plays one invocation.
struct Player {
    n: u64,
    stdin: Option<Vec<u8>>,
    session_id: String,
    model: String,
    /// The current turn's `message.id`; `None` once a tool result closed the turn.
    message_id: Option<String>,
    messages: u64,
    tools: u64,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ralph-fake-agent: {e:#}");
            ExitCode::from(FAKE_FAILED)
        }
    }
}

fn run() -> anyhow::Result<u8> {
    // Like every real CLI, answer `--version` alone without playing (or counting) the script.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args == ["--version"] {
        println!("ralph-fake-agent 0.0.0 (test stand-in)");
        return Ok(0);
    }
    let script_path = std::env::var_os("RALPH_FAKE_SCRIPT")
        .map(PathBuf::from)
        .context(
            "RALPH_FAKE_SCRIPT is not set: point it at a JSON script (see testing/README.md)",
        )?;
    let text = fs::read_to_string(&script_path)
        .with_context(|| format!("reading the script {}", script_path.display()))?;
    let script: Script = serde_json::from_str(&text)
        .with_context(|| format!("parsing the script {}", script_path.display()))?;

    let n = bump_counter(&sibling(&script_path, "count"))?;
    record_call(&sibling(&script_path, "calls.jsonl"), n, &script.record_env)?;

    let actions = match script
        .invocations
        .get(usize::try_from(n).unwrap_or(usize::MAX))
    {
        Some(actions) => actions,
        None => match (&script.default, script.invocations.last()) {
            (Some(default), _) => default,
            (None, Some(last)) => last,
            (None, None) => bail!(
                "{} has no invocations and no default",
                script_path.display()
            ),
        },
    };

    let mut player = Player {
        n,
        stdin: None,
        session_id: format!("fake-session-{n}"),
        model: "claude-fake-1".to_owned(),
        message_id: None,
        messages: 0,
        tools: 0,
    };
    for action in actions {
        if let Some(code) = player.play(action)? {
            std::io::stdout().flush().context("flushing stdout")?;
            // Codes outside 0..=255 wrap like a shell's `exit` would.
            return Ok((code & 0xff) as u8);
        }
    }
    Ok(0)
}

/// `<script>.<ext>` next to the script.
fn sibling(script: &Path, ext: &str) -> PathBuf {
    let mut name = script.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    PathBuf::from(name)
}

/// Reads the invocation counter (0 when the file is missing), stores the next value atomically.
fn bump_counter(path: &Path) -> anyhow::Result<u64> {
    let n = match fs::read_to_string(path) {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{} does not hold a number", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    // Written aside and renamed over, so a fake killed mid-write (ralph's fault-injection tests
    // SIGKILL it) never leaves an empty counter behind.
    let tmp = sibling(path, &format!("tmp-{}", std::process::id()));
    fs::write(&tmp, format!("{}\n", n + 1))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} over {}", tmp.display(), path.display()))?;
    Ok(n)
}

fn record_call(path: &Path, n: u64, extra_env: &[String]) -> anyhow::Result<()> {
    let mut env = Map::new();
    for name in RECORDED_ENV
        .iter()
        .copied()
        .chain(extra_env.iter().map(String::as_str))
    {
        let value = std::env::var_os(name).map(|v| Value::String(v.to_string_lossy().into_owned()));
        env.insert(name.to_owned(), value.unwrap_or(Value::Null));
    }
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cwd = std::env::current_dir().context("reading the working directory")?;
    let line = json!({"n": n, "pid": std::process::id(), "argv": argv, "cwd": cwd.to_string_lossy(), "env": env});
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "{line}").with_context(|| format!("writing {}", path.display()))
}

fn out(bytes: &[u8]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).context("writing stdout")?;
    // Flush per action so tests that watch timing see each line when it is "printed".
    stdout.flush().context("flushing stdout")
}

/// Prints `f.line` + `\n` over and over until `f.bytes` bytes went out, through a 1 MiB buffer,
/// so the fake itself stays small however much it prints.
fn flood(f: &Flood) -> anyhow::Result<()> {
    let mut unit = f.line.clone().into_bytes();
    unit.push(b'\n');
    let mut chunk = Vec::with_capacity(1 << 20);
    while chunk.len() + unit.len() <= 1 << 20 {
        chunk.extend_from_slice(&unit);
    }
    let mut stdout = std::io::stdout().lock();
    let mut left = f.bytes;
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        stdout.write_all(&chunk[..n]).context("writing stdout")?;
        left -= n as u64;
    }
    stdout.flush().context("flushing stdout")
}

fn out_json(value: &Value) -> anyhow::Result<()> {
    out(format!("{value}\n").as_bytes())
}

/// What a dialect module may use while it plays one action: the invocation number (for
/// unique ids) and the stdin bytes read so far.
pub struct Dialect<'a> {
    /// 0-based invocation number across processes.
    pub n: u64,
    /// A counter the dialect may bump for unique ids within this invocation.
    pub seq: &'a mut u64,
}

impl Dialect<'_> {
    /// The next id number within this invocation.
    pub fn next_id(&mut self) -> u64 {
        *self.seq += 1;
        *self.seq
    }

    /// Prints `value` as one compact JSON line on stdout (flushed).
    pub fn line(&self, value: &Value) -> anyhow::Result<()> {
        out_json(value)
    }

    /// Prints `text` plus a newline on stderr.
    pub fn stderr(&self, text: &str) -> anyhow::Result<()> {
        let mut stderr = std::io::stderr().lock();
        writeln!(stderr, "{text}").context("writing stderr")
    }
}

impl Player {
    fn dialect(&mut self) -> Dialect<'_> {
        Dialect {
            n: self.n,
            seq: &mut self.tools,
        }
    }

    /// Runs one action; `Some(code)` means exit now.
    fn play(&mut self, action: &Action) -> anyhow::Result<Option<i32>> {
        match action {
            Action::Stdout(text) => out(format!("{text}\n").as_bytes())?,
            Action::StdoutRaw(text) => out(text.as_bytes())?,
            Action::StdoutBytes(bytes) => out(bytes)?,
            Action::StdoutRepeat(r) => {
                let mut line = r.text.repeat(r.count);
                if r.newline {
                    line.push('\n');
                }
                out(line.as_bytes())?;
            }
            Action::StdoutFlood(f) => flood(f)?,
            Action::Stderr(text) => {
                let mut stderr = std::io::stderr().lock();
                writeln!(stderr, "{text}").context("writing stderr")?;
            }
            Action::Json(value) => out_json(value)?,
            Action::Codex(v) => codex::play(v, &mut self.dialect())?,
            Action::Opencode(v) => opencode::play(v, &mut self.dialect())?,
            Action::Gemini(v) => gemini::play(v, &mut self.dialect())?,
            Action::Amp(v) => amp::play(v, &mut self.dialect())?,
            Action::Cursor(v) => cursor::play(v, &mut self.dialect())?,
            Action::ClaudeInit(init) => self.claude_init(init)?,
            Action::ClaudeText(text) => {
                let block = json!({"type": "text", "text": text});
                self.assistant(block, &self.model.clone(), None)?;
            }
            Action::ClaudeTool(tool) => {
                self.tools += 1;
                let id = format!("toolu_fake_{}_{}", self.n, self.tools);
                let block =
                    json!({"type": "tool_use", "id": id, "name": tool.name, "input": tool.input});
                self.assistant(block, &self.model.clone(), None)?;
                if let Some(result) = &tool.result {
                    self.tool_result(&id, result.clone(), tool.is_error)?;
                }
            }
            Action::ClaudeToolResult(r) => {
                let id = format!("toolu_fake_{}_{}", self.n, self.tools);
                self.tool_result(&id, r.content.repeat(r.repeat), r.is_error)?;
            }
            Action::ClaudeResult(r) => self.claude_result(r)?,
            Action::ClaudeUsageLimit(limit) => {
                let resets_at = match limit.resets_in_s {
                    Some(s) => {
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs() as i64)
                            + s
                    }
                    None => limit.resets_at,
                };
                out_json(&json!({
                    "type": "rate_limit_event",
                    "rate_limit_info": {"status": "rejected", "resetsAt": resets_at,
                        "rateLimitType": "five_hour", "overageStatus": "rejected",
                        "overageDisabledReason": "org_level_disabled"},
                    "uuid": "fake-uuid", "session_id": self.session_id,
                }))?;
                self.message_id = None;
                let block = json!({"type": "text", "text": limit.message});
                self.assistant(block, "<synthetic>", Some("rate_limit"))?;
                self.claude_result(&ClaudeResult {
                    text: Some(limit.message.clone()),
                    is_error: true,
                    cost_usd: Some(0.0),
                    subtype: None,
                    api_error_status: Some(429),
                    terminal_reason: Some("api_error".to_owned()),
                    usage: Some(json!({"input_tokens": 0, "output_tokens": 0})),
                    omit_cost: false,
                })?;
            }
            Action::ClaudeApiError(e) => {
                let code = match e.status {
                    401 | 403 => "authentication_failed",
                    429 => "rate_limit",
                    _ => "server_error",
                };
                out_json(&json!({
                    "type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 1,
                    "retry_delay_ms": 500, "error_status": e.status, "error": code,
                    "session_id": self.session_id, "uuid": "fake-uuid",
                }))?;
                self.message_id = None;
                let block = json!({"type": "text", "text": e.message});
                self.assistant(block, "<synthetic>", Some(code))?;
                self.claude_result(&ClaudeResult {
                    text: Some(e.message.clone()),
                    is_error: true,
                    cost_usd: Some(0.0),
                    subtype: None,
                    api_error_status: Some(e.status),
                    terminal_reason: Some("api_error".to_owned()),
                    usage: None,
                    omit_cost: false,
                })?;
            }
            Action::ReadStdin(read) => {
                if *read {
                    self.stdin_bytes()?;
                }
            }
            Action::SaveStdin(path) => {
                let bytes = self.stdin_bytes()?.to_vec();
                write_creating_dirs(path, &bytes)?;
            }
            Action::EchoStdin(echo) => {
                if *echo {
                    let bytes = self.stdin_bytes()?.to_vec();
                    out(&bytes)?;
                }
            }
            Action::WriteFile(w) => write_creating_dirs(&w.path, w.content.as_bytes())?,
            Action::AppendFile(w) => {
                if let Some(parent) = w.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
                let mut file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&w.path)
                    .with_context(|| format!("opening {}", w.path.display()))?;
                file.write_all(w.content.as_bytes())
                    .with_context(|| format!("appending to {}", w.path.display()))?;
            }
            Action::SetPasses(s) => set_passes(s)?,
            Action::CorruptPrd(corrupt) => {
                if *corrupt {
                    corrupt_prd(Path::new("prd.json"))?;
                }
            }
            Action::GitCommit(message) => git_commit(message)?,
            Action::SleepMs(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Action::IgnoreSigterm(ignore) => {
                if *ignore {
                    use nix::sys::signal::{signal, SigHandler, Signal};
                    // SAFETY: installing SIG_IGN runs no handler code, so nothing can race with
                    // this single-threaded program.
                    unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }
                        .context("ignoring SIGTERM")?;
                }
            }
            Action::SpawnGrandchild(g) => spawn_grandchild(g)?,
            Action::Exit(code) => return Ok(Some(*code)),
        }
        Ok(None)
    }

    fn stdin_bytes(&mut self) -> anyhow::Result<&[u8]> {
        if self.stdin.is_none() {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading stdin")?;
            self.stdin = Some(buf);
        }
        Ok(self.stdin.as_deref().unwrap_or_default())
    }

    fn claude_init(&mut self, init: &ClaudeInit) -> anyhow::Result<()> {
        if let Some(id) = &init.session_id {
            self.session_id = id.clone();
        }
        if let Some(model) = &init.model {
            self.model = model.clone();
        }
        let cwd = std::env::current_dir().context("reading the working directory")?;
        out_json(&json!({
            "type": "system", "subtype": "init", "cwd": cwd.to_string_lossy(),
            "session_id": self.session_id,
            "tools": ["Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "TodoWrite"],
            "mcp_servers": [], "model": self.model, "permissionMode": "bypassPermissions",
            "apiKeySource": "none",
            "claude_code_version": init.version.as_deref().unwrap_or("2.1.332"),
            "uuid": "fake-uuid",
        }))
    }

    /// One top-level assistant line holding one content block (claude prints one per block).
    fn assistant(&mut self, block: Value, model: &str, error: Option<&str>) -> anyhow::Result<()> {
        let id = match &self.message_id {
            Some(id) => id.clone(),
            None => {
                self.messages += 1;
                let id = format!("msg_fake_{}_{}", self.n, self.messages);
                self.message_id = Some(id.clone());
                id
            }
        };
        let mut line = json!({
            "type": "assistant",
            "message": {"id": id, "type": "message", "role": "assistant", "model": model,
                "content": [block], "stop_reason": null,
                "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0, "output_tokens": 9}},
            "parent_tool_use_id": null, "session_id": self.session_id, "uuid": "fake-uuid",
        });
        if let (Some(error), Some(obj)) = (error, line.as_object_mut()) {
            obj.insert("error".to_owned(), Value::String(error.to_owned()));
        }
        out_json(&line)
    }

    fn tool_result(
        &mut self,
        tool_use_id: &str,
        content: String,
        is_error: bool,
    ) -> anyhow::Result<()> {
        // A tool result ends the model turn: the next assistant block is a new message.
        self.message_id = None;
        out_json(&json!({
            "type": "user",
            "message": {"role": "user", "content": [{"tool_use_id": tool_use_id, "type": "tool_result",
                "content": content, "is_error": is_error}]},
            "parent_tool_use_id": null, "session_id": self.session_id, "uuid": "fake-uuid",
            "tool_use_result": {"stdout": "", "stderr": "", "interrupted": false},
        }))
    }

    /// The terminal line, keys in claude 2.1.332's order: `type` comes last.
    fn claude_result(&mut self, r: &ClaudeResult) -> anyhow::Result<()> {
        let mut obj = Map::new();
        obj.insert("duration_ms".into(), json!(1234));
        obj.insert("duration_api_ms".into(), json!(1000));
        obj.insert("stop_reason".into(), json!("end_turn"));
        obj.insert("session_id".into(), json!(self.session_id));
        if !r.omit_cost {
            obj.insert("total_cost_usd".into(), json!(r.cost_usd.unwrap_or(0.01)));
        }
        let usage = r.usage.clone().unwrap_or_else(|| {
            json!({"input_tokens": 100, "cache_creation_input_tokens": 10,
                "cache_read_input_tokens": 1000, "output_tokens": 50})
        });
        obj.insert("usage".into(), usage);
        let mut model_usage = Map::new();
        model_usage.insert(self.model.clone(), json!({"inputTokens": 100}));
        obj.insert("modelUsage".into(), Value::Object(model_usage));
        obj.insert("permission_denials".into(), json!([]));
        let reason = r
            .terminal_reason
            .clone()
            .unwrap_or_else(|| "completed".to_owned());
        obj.insert("terminal_reason".into(), json!(reason));
        obj.insert("is_error".into(), json!(r.is_error));
        obj.insert("num_turns".into(), json!(self.messages.max(1)));
        obj.insert(
            "subtype".into(),
            json!(r.subtype.as_deref().unwrap_or("success")),
        );
        obj.insert("api_error_status".into(), json!(r.api_error_status));
        if let Some(text) = &r.text {
            obj.insert("result".into(), json!(text));
        }
        obj.insert("uuid".into(), json!("fake-uuid"));
        obj.insert("type".into(), json!("result"));
        out_json(&Value::Object(obj))
    }
}

fn write_creating_dirs(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn set_passes(s: &SetPasses) -> anyhow::Result<()> {
    let text =
        fs::read_to_string(&s.prd).with_context(|| format!("reading {}", s.prd.display()))?;
    let mut prd: Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .with_context(|| format!("parsing {}", s.prd.display()))?;
    let story = prd
        .get_mut("userStories")
        .and_then(Value::as_array_mut)
        .and_then(|stories| {
            if s.id == "@next" {
                next_open(stories)
            } else {
                stories
                    .iter_mut()
                    .find(|st| st.get("id").and_then(Value::as_str) == Some(s.id.as_str()))
            }
        })
        .and_then(Value::as_object_mut)
        .with_context(|| format!("{} has no story with id {}", s.prd.display(), s.id))?;
    story.insert("passes".to_owned(), Value::Bool(s.passes));
    let mut pretty = serde_json::to_string_pretty(&prd).context("serializing prd.json")?;
    pretty.push('\n');
    fs::write(&s.prd, pretty).with_context(|| format!("writing {}", s.prd.display()))
}

/// The open story with the lowest `priority` (first in file order on a tie): the one ralph picks
/// when no story is blocked and none has dependencies.
fn next_open(stories: &mut [Value]) -> Option<&mut Value> {
    let mut best: Option<(usize, i64)> = None;
    for (i, story) in stories.iter().enumerate() {
        if story.get("passes").and_then(Value::as_bool) != Some(false) {
            continue;
        }
        let priority = story
            .get("priority")
            .and_then(Value::as_i64)
            .unwrap_or(i64::MAX);
        if best.is_none_or(|(_, p)| priority < p) {
            best = Some((i, priority));
        }
    }
    stories.get_mut(best?.0)
}

/// Removes the first comma (the classic hand-edit mistake), or writes a stub when there is none.
fn corrupt_prd(path: &Path) -> anyhow::Result<()> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let broken = match text.find(',') {
        Some(i) => format!("{}{}", &text[..i], &text[i + 1..]),
        None => "{ not json".to_owned(),
    };
    fs::write(path, broken).with_context(|| format!("writing {}", path.display()))
}

fn git_commit(message: &str) -> anyhow::Result<()> {
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=ralph-fake-agent",
                "-c",
                "user.email=fake-agent@ralph.invalid",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running git")?;
        if !output.status.success() {
            bail!(
                "git {} failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    };
    git(&["add", "-A"])?;
    git(&["commit", "-q", "--no-verify", "-m", message])
}

fn spawn_grandchild(g: &Grandchild) -> anyhow::Result<()> {
    // `exec` keeps an ignored SIGTERM disposition, so the sleep itself ignores TERM.
    let script = if g.ignore_term {
        format!("trap '' TERM; exec sleep {}", g.sleep_s)
    } else {
        format!("exec sleep {}", g.sleep_s)
    };
    let mut command = Command::new("sh");
    if g.setsid {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid(2) is async-signal-safe and touches no memory of this process.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
    }
    let child = command
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(if g.hold_stdout {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null())
        .spawn()
        .context("starting the grandchild (sh)")?;
    // Go on only once `sh` has become `sleep`, as a real daemon is running its own program by the
    // time the agent that started it exits: a sweep that reads the command line sooner would see
    // `sh -c exec sleep N` some of the time, and a test naming the process would vary.
    wait_for_exec(child.id(), "sleep");
    if let Some(path) = &g.pid_file {
        write_creating_dirs(path, format!("{}\n", child.id()).as_bytes())?;
    }
    // Dropping `child` neither waits for nor kills it: it outlives this process on purpose.
    Ok(())
}

/// Waits (up to 10 s, polling every 2 ms) until process `pid`'s command line starts with
/// `program`; returns at once when it has ended or `/proc` cannot be read.
fn wait_for_exec(pid: u32, program: &str) {
    let path = format!("/proc/{pid}/cmdline");
    for _ in 0..5000 {
        match fs::read(&path) {
            Ok(cmdline) if cmdline.starts_with(program.as_bytes()) => return,
            Ok(cmdline) if cmdline.is_empty() => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return,
        }
    }
}
