//! `ralph-scripted-model`: a scripted model API server, so the real agent CLIs can run offline in
//! ralph's end-to-end tests and in `scripts/demo-claude.sh`.
//!
//! One module per wire protocol a loopback stand-in must speak to a pinned CLI (probed in the
//! project's notes on real CLIs); [`anthropic`] serves Claude Code's Messages API. Which reply a
//! request gets is decided from the conversation the request carries ([`scenario`]), never from a
//! request counter, so a CLI retry or an extra side request cannot shift the script:
//!
//! * the story: the first `Story ID: <id>` in the first user message (ralph's prompt);
//! * the repository: the working directory the CLI announces (or ralph's prompt names);
//! * the step: how many tool results the conversation holds.
//!
//! The scenario format and the test harness around it are described in `testing/README-model.md`.
//!
//! Two modes: serve until SIGTERM/SIGINT or the parent dies, or (with `-- COMMAND…`) serve while
//! running one command with the base-URL variables of every CLI pointing here, then exit with its
//! status. The
//! second mode exists so that the server and ralph can share one `unshare -n` network namespace.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use serde_json::{json, Value};

mod anthropic;
mod chat;
mod gemini;
mod responses;
mod scenario;

use scenario::{decide, Conversation, ErrorReply, Scenario, Turn};

/// Largest request body read, in bytes; Claude Code's requests are a few hundred KiB.
const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;

/// Command line of `ralph-scripted-model`.
#[derive(Debug, Parser)]
#[command(
    name = "ralph-scripted-model",
    about = "Scripted model API server for ralph's tests and demo (binds 127.0.0.1 only)"
)]
struct Args {
    /// Scenario JSON: the tool calls and final text to answer for each story id.
    #[arg(long, value_name = "PATH")]
    scenario: PathBuf,
    /// TCP port on 127.0.0.1; 0 picks a free ephemeral port.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Once listening, write the port (decimal, then a newline) to this file, atomically.
    #[arg(long, value_name = "PATH")]
    port_file: Option<PathBuf>,
    /// Append one JSON line per request (story, step, reply kind, status) to this file.
    #[arg(long, value_name = "PATH")]
    log: Option<PathBuf>,
    /// Run this command while serving, with the base-URL variables set to this server; stop the
    /// server when it ends and exit with its status (128+N when killed by signal N).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}
/// One line of the request log.
#[derive(Debug, Default, serde::Serialize)]
struct LogEntry {
    /// RFC 3339 UTC time the reply was sent.
    ts: String,
    method: String,
    path: String,
    /// HTTP status sent.
    status: u16,
    /// `tool_use`, `text`, `error`, `count_tokens`, `ok` (HEAD/GET) or `not_found`.
    reply: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    story: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    promise: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_tool_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// A side request answered without consuming a step (e.g. opencode's title request).
    #[serde(skip_serializing_if = "Option::is_none")]
    side: Option<bool>,
}

/// A reply body and its content type.
pub(crate) struct Rendered {
    /// The `Content-Type` header.
    pub(crate) content_type: &'static str,
    /// The body.
    pub(crate) body: Vec<u8>,
}

impl Rendered {
    /// A `text/event-stream` body.
    pub(crate) fn sse(body: String) -> Rendered {
        Rendered {
            content_type: "text/event-stream; charset=utf-8",
            body: body.into_bytes(),
        }
    }
}

/// One wire protocol: how its requests carry the conversation and how its replies look.
pub(crate) trait Wire: Sync {
    /// The conversation state in a request body.
    fn conversation(&self, body: &Value) -> Conversation;
    /// A reply for a side request that must not consume a scripted step (e.g. opencode's title
    /// request), or `None` for a scripted turn.
    fn side_reply(&self, _body: &Value) -> Option<Turn> {
        None
    }
    /// The streamed (or plain) reply for `turn`; `n` is unique per reply, for ids.
    fn render(&self, turn: &Turn, model: &str, n: u64, input_tokens: u64) -> Rendered;
    /// The JSON error body for `e`, in the protocol's envelope.
    fn error_body(&self, e: &ErrorReply) -> Value;
}

/// The protocol served at `path`, if any.
fn route(path: &str) -> Option<&'static dyn Wire> {
    match path {
        "/v1/messages" => Some(&anthropic::Anthropic),
        "/v1/responses" => Some(&responses::Responses),
        p if p.starts_with("/v1beta/models/") => gemini::route(p),
        "/v1/chat/completions" => Some(&chat::Chat),
        _ => None,
    }
}

/// Shared state of the request handlers.
struct ServerState {
    scenario: Scenario,
    log: Option<Mutex<File>>,
    /// Source of unique message and tool-use ids.
    counter: AtomicU64,
}

impl ServerState {
    fn write_log(&self, mut entry: LogEntry) {
        let Some(log) = &self.log else { return };
        entry.ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let Ok(mut line) = serde_json::to_string(&entry) else {
            return;
        };
        line.push('\n');
        // A poisoned lock only means another handler panicked mid-write; keep logging.
        let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            eprintln!("ralph-scripted-model: warning: cannot write the request log: {e}");
        }
    }

    /// Answers one request. The log line is written before the reply is sent, so whoever got
    /// the reply can already read its log line.
    fn handle(&self, mut req: tiny_http::Request) {
        let method = req.method().as_str().to_owned();
        let url = req.url().to_owned();
        let path = url.split('?').next().unwrap_or("").to_owned();
        let mut entry = LogEntry {
            method: method.clone(),
            path: path.clone(),
            ..LogEntry::default()
        };
        let response = match (method.as_str(), path.as_str()) {
            ("HEAD" | "GET", _) => {
                entry.reply = "ok";
                json_response(200, &json!({"ok": true, "server": "ralph-scripted-model"}))
            }
            ("POST", _) if path == "/v1/messages/count_tokens" || route(&path).is_some() => {
                let wire = route(&path).unwrap_or(&anthropic::Anthropic);
                let mut raw = Vec::new();
                let read = req.as_reader().take(MAX_BODY_BYTES).read_to_end(&mut raw);
                let parsed = read
                    .map_err(|e| format!("cannot read the request body: {e}"))
                    .and_then(|_| {
                        serde_json::from_slice::<Value>(&raw)
                            .map_err(|e| format!("the request body is not JSON: {e}"))
                    });
                match parsed {
                    Err(message) => error_response(
                        wire,
                        &ErrorReply::new(400, format!("ralph-scripted-model: {message}")),
                        &mut entry,
                    ),
                    Ok(_) if path.ends_with("/count_tokens") => {
                        entry.reply = "count_tokens";
                        json_response(200, &json!({"input_tokens": raw.len() / 4 + 1}))
                    }
                    Ok(body) => self.answer(wire, &body, raw.len(), &mut entry),
                }
            }
            _ => {
                let response = error_response(
                    &anthropic::Anthropic,
                    &ErrorReply::new(
                        404,
                        format!(
                            "ralph-scripted-model: no route for {method} {path}; it serves \
                             POST /v1/messages, POST /v1/messages/count_tokens, and HEAD/GET"
                        ),
                    ),
                    &mut entry,
                );
                entry.reply = "not_found";
                response
            }
        };
        entry.status = response.status_code().0;
        self.write_log(entry);
        if let Err(e) = req.respond(response) {
            eprintln!("ralph-scripted-model: warning: cannot answer {method} {url}: {e}");
        }
    }

    /// The reply to a model request in `wire`'s protocol, and what the log should say about it.
    fn answer(
        &self,
        wire: &dyn Wire,
        body: &Value,
        body_len: usize,
        entry: &mut LogEntry,
    ) -> Response {
        let conv = wire.conversation(body);
        let turn = match wire.side_reply(body) {
            Some(turn) => {
                entry.side = Some(true);
                turn
            }
            None => {
                entry.story = conv.story.clone();
                entry.step = Some(conv.step);
                entry.repo = conv.repo.clone();
                entry.last_tool_error = conv.last_tool_error.clone();
                decide(&self.scenario, &conv)
            }
        };
        match &turn {
            Turn::Error(e) => return error_response(wire, e, entry),
            Turn::Tool { call, .. } => {
                entry.reply = "tool_use";
                entry.tool = Some(call.label());
            }
            Turn::Final { promise, .. } => {
                entry.reply = "text";
                entry.promise = Some(*promise);
            }
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let model = conv.model.as_deref().unwrap_or("scripted-model");
        let rendered = wire.render(&turn, model, n, body_len as u64 / 4 + 1);
        with_headers(
            tiny_http::Response::from_data(rendered.body),
            &[
                ("Content-Type", rendered.content_type),
                ("Cache-Control", "no-cache"),
                ("request-id", &format!("req_scripted_{n:06}")),
            ],
        )
    }
}

/// Every reply is built in memory first.
type Response = tiny_http::Response<io::Cursor<Vec<u8>>>;

/// An API error reply in `wire`'s envelope; records it in `entry`.
fn error_response(wire: &dyn Wire, e: &ErrorReply, entry: &mut LogEntry) -> Response {
    entry.reply = "error";
    entry.message = Some(e.message.clone());
    json_response(e.status, &wire.error_body(e))
}

/// Adds `headers` to `response`. The names and values are ASCII built in this file, which
/// `tiny_http` always accepts; one it refused would only be left out.
fn with_headers<R: Read>(
    mut response: tiny_http::Response<R>,
    headers: &[(&str, &str)],
) -> tiny_http::Response<R> {
    for (name, value) in headers {
        if let Ok(h) = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(h);
        }
    }
    response
}

fn json_response(status: u16, body: &Value) -> Response {
    with_headers(
        tiny_http::Response::from_data(body.to_string().into_bytes()).with_status_code(status),
        &[("Content-Type", "application/json")],
    )
}

/// Writes `port` to `path` via a temporary file and a rename, so a reader polling the file
/// never sees a partial number.
fn write_port_file(path: &Path, port: u16) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, format!("{port}\n"))?;
    fs::rename(&tmp, path)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ralph-scripted-model: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let scenario = Scenario::load(&args.scenario)?;
    let run_mode = !args.command.is_empty();

    // SIGTERM (and the parent's death, delivered as SIGTERM) ends serving, or is forwarded to
    // the command in run mode. SIGINT ends serving; in run mode it is only swallowed, since a
    // terminal's Ctrl-C already reaches the command through the process group, and forwarding
    // it would look like a second Ctrl-C to ralph.
    let term = Arc::new(AtomicBool::new(false));
    let int = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&term))
        .context("cannot install the SIGTERM handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&int))
        .context("cannot install the SIGINT handler")?;
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .context("cannot set the parent-death signal")?;
    let parent_gone = move || nix::unistd::getppid() != parent;

    let log = args
        .log
        .as_deref()
        .map(|p| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open the request log {}", p.display()))
        })
        .transpose()?
        .map(Mutex::new);

    let server = tiny_http::Server::http(("127.0.0.1", args.port))
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{}: {e}", args.port))?;
    let port = server
        .server_addr()
        .to_ip()
        .map(|a| a.port())
        .context("the server is not bound to a TCP address")?;
    if let Some(p) = &args.port_file {
        write_port_file(p, port)
            .with_context(|| format!("cannot write the port file {}", p.display()))?;
    }
    let banner = format!("listening on http://127.0.0.1:{port}");
    if run_mode {
        // stdout belongs to the command.
        eprintln!("ralph-scripted-model: {banner}");
    } else {
        println!("{banner}");
        io::stdout().flush().context("cannot write to stdout")?;
    }

    let state = Arc::new(ServerState {
        scenario,
        log,
        counter: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = Arc::clone(&stop);
        let state = Arc::clone(&state);
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match server.recv_timeout(Duration::from_millis(100)) {
                    Ok(Some(req)) => {
                        let state = Arc::clone(&state);
                        thread::spawn(move || state.handle(req));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("ralph-scripted-model: error: accepting a request failed: {e}");
                        break;
                    }
                }
            }
        })
    };

    let code = if run_mode {
        run_command(&args.command, port, &term, &parent_gone)?
    } else {
        while !term.load(Ordering::SeqCst) && !int.load(Ordering::SeqCst) && !parent_gone() {
            thread::sleep(Duration::from_millis(50));
        }
        ExitCode::SUCCESS
    };
    stop.store(true, Ordering::SeqCst);
    // The acceptor wakes within its 100 ms poll; a panic there has already been printed.
    let _ = acceptor.join();
    Ok(code)
}

/// Runs `command` with the base-URL variables of the CLIs pointing at the server
/// (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL` with `/v1`, `GOOGLE_GEMINI_BASE_URL`) and
/// `RALPH_SCRIPTED_MODEL_PORT`, forwarding SIGTERM (or the parent's death) to it as SIGTERM, and
/// returns its exit status as ours.
fn run_command(
    command: &[OsString],
    port: u16,
    term: &AtomicBool,
    parent_gone: &dyn Fn() -> bool,
) -> anyhow::Result<ExitCode> {
    let (program, rest) = command
        .split_first()
        .context("no command given after `--`")?;
    let mut child = Command::new(program)
        .args(rest)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("RALPH_SCRIPTED_MODEL_PORT", port.to_string())
        .spawn()
        .with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(child.id()).context("the child's pid does not fit in an i32")?,
    );
    let mut forwarded = false;
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for the command")? {
            use std::os::unix::process::ExitStatusExt as _;
            let code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1);
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        if !forwarded && (term.load(Ordering::SeqCst) || parent_gone()) {
            // The child may have exited in between; then there is nothing to signal.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            forwarded = true;
        }
        thread::sleep(Duration::from_millis(50));
    }
}
