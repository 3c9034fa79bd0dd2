//! Benchmark, not a test: ralph's own overhead per step of its native tool loop, excluding model
//! latency (issue 3: "under 1 ms median over a 100-step scripted session").
//!
//! Run with `cargo bench --features test-fakes --bench native_overhead`.
//!
//! Part 1 replays what [`ralph::native::run_session`] does between two model replies, for 100
//! scripted steps (writes and reads of ~1.5 KB files, alternating), and times each piece
//! directly, with no HTTP in the way:
//! - `bookkeeping`: the repeated-call key and count, and the call summary for the event;
//! - `write_file`, `read_file`: `ToolRegistry::dispatch` of each on a temp repo (every other
//!   step; `write_file` writes a temp file, syncs it to disk and renames it into place);
//! - `event write`: the `AgentEvent` JSON lines (tool call, tool result) written and flushed to
//!   a file, as `ralph __native-agent` writes them to its stdout for the transcript;
//! - `context`: appending the turn, `context::shrink` to a 4096-token window (the local
//!   model's) and `context::estimate_tokens`;
//! - `request build`: the `ChatRequest` the loop builds each step (the conversation cloned) and
//!   its JSON encoding.
//!
//! Part 2 runs a whole 100-step session in-process against a scripted Chat Completions server
//! on 127.0.0.1 and reports the wall time per step. That figure includes loopback HTTP, the
//! client's JSON encoding and decoding, and the scripted server's own work, so it is an upper
//! bound on ralph's overhead, not the overhead itself. It is measured twice: against a minimal
//! server with `TCP_NODELAY` that writes each response in one piece, and against `tiny_http`
//! (what the tests use), whose small separate writes can meet the peer's delayed ACK.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ralph::native::context::{estimate_tokens, shrink};
use ralph::native::llm::{
    ChatRequest, Message, Provider, ProviderConfig, RetryPolicy, Role, ToolCall,
};
use ralph::native::tools::{ToolContext, ToolRegistry};
use ralph::native::{call_key, run_session, tool_specs, SessionConfig};
use ralph::protocol::{AgentEvent, ProviderKind, ToolMode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// Tool-using steps per session.
const STEPS: usize = 100;
/// Sessions measured in part 1 (the first is a warm-up and not counted).
const ROUNDS: usize = 6;
/// The local model's context window and reply budget, in tokens.
const CONTEXT_WINDOW: usize = 4096;
const MAX_TOKENS: usize = 512;
/// The per-step goal, in microseconds.
const GOAL_US: f64 = 1000.0;

const SYSTEM: &str = "You are a coding agent working in a git repository. Use the tools to \
    implement the story, one step at a time, then mark it with mark_story.";
const STORY: &str = "Story ID: US-001\nTitle: Write the files\nCreate f0.txt … f99.txt with \
    the given content and check each one.";

/// A temp repository and a tool context for it.
fn repo() -> (tempfile::TempDir, ToolContext) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
    std::fs::write(root.join("prd.json"), r#"{"userStories": []}"#).expect("write prd.json");
    std::fs::write(root.join("progress.txt"), "").expect("write progress.txt");
    let ctx = ToolContext::new(
        root.clone(),
        root.join("prd.json"),
        root.join("progress.txt"),
    );
    (dir, ctx)
}

/// About 1.5 KB of code-like text, different per step.
fn file_content(step: usize) -> String {
    (0..40)
        .map(|line| format!("fn item_{step}_{line}() -> u32 {{ {line} }}\n"))
        .collect()
}

/// The call the scripted model makes at `step`: write `f<step>.txt` on even steps, read back
/// the file written just before on odd ones.
fn scripted_call(step: usize) -> (String, Value) {
    if step.is_multiple_of(2) {
        (
            "write_file".into(),
            json!({"path": format!("f{step}.txt"), "content": file_content(step)}),
        )
    } else {
        (
            "read_file".into(),
            json!({"path": format!("f{}.txt", step - 1)}),
        )
    }
}

/// Microsecond samples of one measured piece.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn add(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }

    /// (median, p90, max) in microseconds.
    fn summary(&self) -> (f64, f64, f64) {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (at(0.5), at(0.9), v[v.len() - 1])
    }
}

fn print_row(name: &str, s: &Samples) {
    let (median, p90, max) = s.summary();
    println!("{name:<16} {median:>10.1} {p90:>10.1} {max:>10.1}");
}

/// Part 1: the loop's own work per step, timed piece by piece.
fn per_step_pieces(rt: &tokio::runtime::Runtime) {
    let tools = ToolRegistry::standard();
    let specs = tool_specs(&tools);
    let tools_tokens = serde_json::to_string(&specs).map_or(0, |s| s.len() / 4);
    let budget = (CONTEXT_WINDOW - MAX_TOKENS)
        .saturating_sub(tools_tokens)
        .max(256);
    let names = [
        "bookkeeping",
        "write_file",
        "read_file",
        "event write",
        "context",
        "request build",
        "loop w/o tool",
        "total, writes",
        "total, reads",
        "total, all",
    ];
    let mut samples: Vec<Samples> = names.iter().map(|_| Samples::default()).collect();

    for round in 0..ROUNDS {
        let (_dir, ctx) = repo();
        let mut transcript = BufWriter::new(
            File::create(ctx.repo_root.join("transcript.jsonl")).expect("create the transcript"),
        );
        let mut messages = vec![
            Message::text(Role::System, SYSTEM),
            Message::text(Role::User, STORY),
        ];
        let mut repeats: HashMap<u64, u32> = HashMap::new();
        for step in 0..STEPS {
            let (name, arguments) = scripted_call(step);
            let call = ToolCall {
                id: format!("call_{step}"),
                name,
                arguments,
            };
            let mut took = [Duration::ZERO; 5];

            let t = Instant::now();
            let count = repeats
                .entry(call_key(&call.name, &call.arguments))
                .or_insert(0);
            *count += 1;
            let summary = ralph::protocol::fields::summarize_tool_input(&call.arguments);
            took[0] = t.elapsed();

            let t = Instant::now();
            let outcome = rt.block_on(tools.dispatch(&call.name, &call.arguments, &ctx));
            took[1] = t.elapsed();
            let (content, is_error) = match outcome {
                Ok(out) => (out.content, false),
                Err(err) => (format!("Error: {err}"), true),
            };
            assert!(!is_error, "step {step}: {content}");

            let t = Instant::now();
            for event in [
                AgentEvent::ToolCall {
                    name: call.name.clone(),
                    summary,
                },
                AgentEvent::ToolResult {
                    is_error,
                    output: Some(ralph::protocol::fields::bounded_output(
                        &ralph::redact::redact_env(&content),
                    )),
                    exit_code: None,
                },
            ] {
                let line = json!({"type": "event", "event": event});
                writeln!(transcript, "{line}").expect("write the transcript");
                transcript.flush().expect("flush the transcript");
            }
            took[2] = t.elapsed();

            let t = Instant::now();
            let mut assistant = Message::text(Role::Assistant, "");
            assistant.tool_calls = vec![call.clone()];
            messages.push(assistant);
            messages.push(Message::tool_result(&call.id, content, is_error));
            let report = shrink(&mut messages, budget);
            let estimate = estimate_tokens(&messages);
            took[3] = t.elapsed();
            std::hint::black_box((report, estimate));

            let t = Instant::now();
            let request = ChatRequest {
                model: "bench".into(),
                messages: messages.clone(),
                tools: specs.clone(),
                max_tokens: MAX_TOKENS as u32,
                temperature: Some(0.0),
                seed: Some(1),
                tool_mode: ToolMode::Native,
            };
            let body = serde_json::to_vec(&request).expect("encode the request");
            took[4] = t.elapsed();
            std::hint::black_box(body);

            if round > 0 {
                samples[0].add(took[0]);
                // Dispatch is reported per tool: write_file syncs the file to disk.
                samples[if step.is_multiple_of(2) { 1 } else { 2 }].add(took[1]);
                for (i, d) in took.iter().enumerate().skip(2) {
                    samples[i + 1].add(*d);
                }
                let total: Duration = took.iter().sum();
                samples[6].add(total - took[1]);
                samples[if step.is_multiple_of(2) { 7 } else { 8 }].add(total);
                samples[9].add(total);
            }
        }
    }

    println!(
        "Part 1: ralph's own work per loop step, no model and no HTTP \
         ({} sessions x {STEPS} steps, {CONTEXT_WINDOW}-token window)",
        ROUNDS - 1
    );
    println!(
        "{:<16} {:>10} {:>10} {:>10}",
        "piece (us)", "median", "p90", "max"
    );
    for (name, s) in names.iter().zip(&samples) {
        print_row(name, s);
    }
    let verdict = |median: f64| if median < GOAL_US { "MET" } else { "NOT MET" };
    let (all, ..) = samples[9].summary();
    let (writes, ..) = samples[7].summary();
    let (loop_only, ..) = samples[6].summary();
    println!(
        "median per step: {all:.1} us (goal < {GOAL_US:.0} us: {}); write steps alone: \
         {writes:.1} us ({}); the loop without the tool: {loop_only:.1} us ({})",
        verdict(all),
        verdict(writes),
        verdict(loop_only)
    );
}

/// A Chat Completions reply: a tool call for `step < STEPS`, then a final answer.
fn scripted_reply(step: usize) -> String {
    let message = if step < STEPS {
        let (name, args) = scripted_call(step);
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{step}"), "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]})
    } else {
        json!({"role": "assistant", "content": "All files written."})
    };
    let finish = if step < STEPS { "tool_calls" } else { "stop" };
    json!({"id": format!("chatcmpl-{step}"), "object": "chat.completion", "created": 0,
           "model": "bench", "choices": [{"index": 0, "finish_reason": finish,
           "message": message}],
           "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})
    .to_string()
}

/// A scripted Chat Completions server on 127.0.0.1 for part 2; stops on drop.
trait ScriptedServer {
    /// Its port.
    fn port(&self) -> u16;
}

/// `tiny_http` (as the tests use), one thread per request. It writes the status line, headers
/// and body in separate small writes and cannot set `TCP_NODELAY`.
struct TinyHttp {
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TinyHttp {
    fn start() -> TinyHttp {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
        let served = AtomicUsize::new(0);
        let thread = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                for mut request in server.incoming_requests() {
                    let mut body = Vec::new();
                    let _ = request.as_reader().read_to_end(&mut body);
                    let step = served.fetch_add(1, Ordering::SeqCst);
                    let header = tiny_http::Header::from_bytes("Content-Type", "application/json")
                        .expect("a valid header");
                    let _ = request.respond(
                        tiny_http::Response::from_string(scripted_reply(step)).with_header(header),
                    );
                }
            })
        };
        TinyHttp {
            server,
            thread: Some(thread),
        }
    }
}

impl ScriptedServer for TinyHttp {
    fn port(&self) -> u16 {
        self.server
            .server_addr()
            .to_ip()
            .expect("an IP listener")
            .port()
    }
}

impl Drop for TinyHttp {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A minimal HTTP/1.1 server on a `TcpListener` with `TCP_NODELAY`, each response written in
/// one piece, keep-alive: close to the least a server can add.
struct RawHttp {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RawHttp {
    fn start() -> RawHttp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("a local address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let served = Arc::clone(&served);
                    // Ends when the client closes the connection.
                    std::thread::spawn(move || serve_connection(stream, &served));
                }
            })
        };
        RawHttp {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl ScriptedServer for RawHttp {
    fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RawHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers requests on one keep-alive connection until it closes.
fn serve_connection(stream: TcpStream, served: &AtomicUsize) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let reply = scripted_reply(served.fetch_add(1, Ordering::SeqCst));
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// Part 2: a whole session against an in-process scripted server (includes loopback HTTP).
fn whole_session(rt: &tokio::runtime::Runtime, label: &str, server: &dyn ScriptedServer) {
    let provider = Provider::new(ProviderConfig {
        kind: ProviderKind::Openai,
        base_url: format!("http://127.0.0.1:{}/v1", server.port()),
        api_key: None,
        stream: false,
        request_timeout: Duration::from_secs(30),
    })
    .expect("the client builds");
    let cfg = SessionConfig {
        model: "bench".into(),
        system_prompt: SYSTEM.into(),
        max_steps: STEPS as u32 + 10,
        max_tokens: MAX_TOKENS as u32,
        context_window: CONTEXT_WINDOW as u32,
        max_continuations: 0,
        temperature: Some(0.0),
        seed: Some(1),
        tool_mode: ToolMode::Native,
        retry: RetryPolicy::default(),
        allowed_tools: None,
        redact: Vec::new(),
        mark_protocol: false,
    };
    let (_dir, ctx) = repo();
    let tools = ToolRegistry::standard();
    let cancel = CancellationToken::new();
    let mut transcript = BufWriter::new(
        File::create(ctx.repo_root.join("transcript.jsonl")).expect("create the transcript"),
    );
    let mut on_event = |event: AgentEvent| {
        let _ = writeln!(transcript, "{}", json!({"type": "event", "event": event}));
        let _ = transcript.flush();
    };
    let started = Instant::now();
    let result = rt.block_on(run_session(
        &provider,
        &tools,
        &ctx,
        &cfg,
        STORY,
        &cancel,
        &mut on_event,
    ));
    let elapsed = started.elapsed();
    println!(
        "{label:<34} ended {:?} after {} steps, {} requests: {:.1} ms in all, {:.1} us per step",
        result.end,
        result.steps,
        result.requests,
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / f64::from(result.steps.max(1))
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    per_step_pieces(&rt);
    println!();
    println!(
        "Part 2: one whole {STEPS}-step session in-process against a scripted Chat Completions \
         server on 127.0.0.1; these figures INCLUDE loopback HTTP, JSON both ways and the \
         server's own work"
    );
    whole_session(&rt, "raw TCP server (TCP_NODELAY)", &RawHttp::start());
    whole_session(&rt, "tiny_http server (as the tests)", &TinyHttp::start());
}
