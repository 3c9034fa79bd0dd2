//! A scripted LLM server for the native loop's tests, speaking both wire formats.
//!
//! [`ScriptedLlm::start`] serves on `127.0.0.1` (an ephemeral port, `tiny_http` on a thread,
//! one thread per request so a hung reply blocks nothing else) and stops on drop. Every request
//! is recorded ([`ScriptedLlm::requests`]) with the time it arrived, its path, headers and JSON
//! body, and a responder closure decides each reply from the request, so a test can script a
//! whole conversation from its state (how many tool results came back, what the last user
//! message says…). [`ScriptedReply`] describes a reply once; it is rendered in the request's
//! format: Chat Completions or Messages ([`ProviderKind`]), streaming (SSE) when the request
//! says `"stream": true`, else one JSON body.
//!
//! Requests to a path other than `/v1/chat/completions` (openai) or `/v1/messages` (anthropic)
//! are recorded and answered 404 without asking the responder. A responder that panics gets
//! its request answered 400 (so nothing retries), and the panic is raised again when the server
//! is dropped, so the test fails with the responder's message.

#![allow(dead_code)]

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ralph::native::llm::ProviderConfig;
use ralph::protocol::ProviderKind;
use serde_json::{json, Value};

/// The API key [`ScriptedLlm::config`] sets; tests check it never leaks.
pub const SCRIPTED_API_KEY: &str = "sk-scripted-7c1f0e5d9b2a4e86-SECRET";

/// The tool-call id the server gives call `call` (0-based) of the reply to request `request`
/// (0-based, in arrival order): `call_<request>_<call>` (openai), `toolu_<request>_<call>`
/// (anthropic).
pub fn scripted_call_id(kind: ProviderKind, request: usize, call: usize) -> String {
    match kind {
        ProviderKind::Openai => format!("call_{request}_{call}"),
        ProviderKind::Anthropic => format!("toolu_{request}_{call}"),
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// When it arrived (after its body was read).
    pub at: Instant,
    /// Arrival order, from 0.
    pub n: usize,
    /// The request path (`/v1/chat/completions`).
    pub path: String,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The JSON body (a string value when the body was not JSON).
    pub body: Value,
    /// Which API the server speaks.
    pub kind: ProviderKind,
}

impl RecordedRequest {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the request asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.body["stream"] == json!(true)
    }

    /// The `messages` array (empty when missing).
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }

    /// Names of the tools offered (`tools[].function.name` or `tools[].name`); empty when the
    /// request offers none.
    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| {
                        t.pointer("/function/name")
                            .or_else(|| t.get("name"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every tool result in the conversation as `(call id, text, is_error)`, in order: openai
    /// `role: "tool"` messages, anthropic `tool_result` blocks. (OpenAI has no error flag:
    /// there it is whether the text starts with "Error".)
    pub fn tool_results(&self) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        for m in self.messages() {
            if m["role"] == "tool" {
                let text = m["content"].as_str().unwrap_or_default().to_string();
                let error = text.starts_with("Error");
                out.push((
                    m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                    text,
                    error,
                ));
            }
            for block in m["content"].as_array().map_or(&[][..], Vec::as_slice) {
                if block["type"] == "tool_result" {
                    out.push((
                        block["tool_use_id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        content_text(&block["content"]),
                        block["is_error"] == json!(true),
                    ));
                }
            }
        }
        out
    }

    /// Every tool call the conversation replays as `(id, name, arguments)`: openai assistant
    /// `tool_calls` (arguments parsed from their string), anthropic `tool_use` blocks.
    pub fn tool_calls(&self) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for m in self.messages() {
            for c in m["tool_calls"].as_array().map_or(&[][..], Vec::as_slice) {
                let args = c["function"]["arguments"].as_str().unwrap_or("{}");
                out.push((
                    c["id"].as_str().unwrap_or_default().to_string(),
                    c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    serde_json::from_str(args).unwrap_or(Value::String(args.to_string())),
                ));
            }
            for block in m["content"].as_array().map_or(&[][..], Vec::as_slice) {
                if block["type"] == "tool_use" {
                    out.push((
                        block["id"].as_str().unwrap_or_default().to_string(),
                        block["name"].as_str().unwrap_or_default().to_string(),
                        block["input"].clone(),
                    ));
                }
            }
        }
        out
    }

    /// The system prompt: anthropic's top-level `system`, or the openai system messages
    /// joined by blank lines.
    pub fn system_text(&self) -> String {
        if let Some(s) = self.body["system"].as_str() {
            return s.to_string();
        }
        if self.body["system"].is_array() {
            return content_text(&self.body["system"]);
        }
        self.messages()
            .iter()
            .filter(|m| m["role"] == "system")
            .map(|m| content_text(&m["content"]))
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    /// The text of every user message (tool results left out), in order.
    pub fn user_texts(&self) -> Vec<String> {
        self.messages()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| content_text(&m["content"]))
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// The text of the last user message that has text.
    pub fn last_user_text(&self) -> String {
        self.user_texts().pop().unwrap_or_default()
    }

    /// The whole body as JSON text, for quick `contains` checks.
    pub fn body_text(&self) -> String {
        self.body.to_string()
    }
}

/// Text of a message `content`: a string, or the `text` of its text blocks joined by newlines.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Tool-call arguments in a scripted reply.
#[derive(Debug, Clone)]
enum Args {
    /// Sent as JSON (a JSON string for openai, `input` / `partial_json` for anthropic).
    Json(Value),
    /// Sent verbatim as the arguments text (possibly invalid JSON).
    Raw(String),
}

#[derive(Debug, Clone)]
enum Body {
    Message {
        text: String,
        refusal: String,
        calls: Vec<(String, Args)>,
        stop: Option<String>,
        usage: (u64, u64),
    },
    Status {
        code: u16,
        body: String,
    },
    ApiError {
        code: u16,
        kind: String,
        message: String,
    },
    StreamError {
        partial: String,
        kind: String,
        message: String,
    },
    Drop {
        partial: String,
    },
    Truncated {
        partial: String,
    },
    Hang,
}

/// One scripted reply, rendered in the request's wire format. Build with the constructors,
/// refine with the `with_*`/`stop`/`usage`/`after` modifiers.
#[derive(Debug, Clone)]
pub struct ScriptedReply {
    body: Body,
    headers: Vec<(String, String)>,
    delay: Duration,
}

impl ScriptedReply {
    fn new(body: Body) -> Self {
        ScriptedReply {
            body,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// A final text answer (`finish_reason: stop` / `stop_reason: end_turn`).
    pub fn text(content: impl Into<String>) -> Self {
        Self::new(Body::Message {
            text: content.into(),
            refusal: String::new(),
            calls: Vec::new(),
            stop: None,
            usage: (10, 5),
        })
    }

    /// Tool calls `(name, arguments object)` (`tool_calls` / `tool_use`), ids from
    /// [`scripted_call_id`]. Streamed, the arguments arrive in small fragments.
    pub fn tool_calls(calls: Vec<(&str, Value)>) -> Self {
        Self::new(Body::Message {
            text: String::new(),
            refusal: String::new(),
            calls: calls
                .into_iter()
                .map(|(n, a)| (n.to_string(), Args::Json(a)))
                .collect(),
            stop: None,
            usage: (10, 5),
        })
    }

    /// One tool call whose arguments text is sent verbatim (e.g. invalid JSON).
    pub fn tool_call_raw(name: &str, raw_arguments: &str) -> Self {
        Self::new(Body::Message {
            text: String::new(),
            refusal: String::new(),
            calls: vec![(name.to_string(), Args::Raw(raw_arguments.to_string()))],
            stop: None,
            usage: (10, 5),
        })
    }

    /// A refusal: openai's `refusal` field with `finish_reason: stop`; anthropic
    /// `stop_reason: refusal` with the text as content.
    pub fn refusal(text: impl Into<String>) -> Self {
        Self::new(Body::Message {
            text: String::new(),
            refusal: text.into(),
            calls: Vec::new(),
            stop: None,
            usage: (10, 5),
        })
    }

    /// A non-2xx answer with a verbatim body; add headers with [`ScriptedReply::with_header`]
    /// (e.g. `retry-after`).
    pub fn status(code: u16, body: impl Into<String>, headers: &[(&str, &str)]) -> Self {
        let mut reply = Self::new(Body::Status {
            code,
            body: body.into(),
        });
        for (k, v) in headers {
            reply = reply.with_header(k, v);
        }
        reply
    }

    /// A non-2xx answer in the API's own error envelope: openai
    /// `{"error":{"message","type","code":type}}`, anthropic
    /// `{"type":"error","error":{"type","message"}}`.
    pub fn api_error(code: u16, error_type: &str, message: &str) -> Self {
        Self::new(Body::ApiError {
            code,
            kind: error_type.to_string(),
            message: message.to_string(),
        })
    }

    /// HTTP 200, then an error inside the body: streamed, `partial` text and then an `error`
    /// event (anthropic) or a `data: {"error":…}` chunk (openai); not streamed, the error
    /// envelope as a 200 body.
    pub fn stream_error(partial: &str, error_type: &str, message: &str) -> Self {
        Self::new(Body::StreamError {
            partial: partial.to_string(),
            kind: error_type.to_string(),
            message: message.to_string(),
        })
    }

    /// A connection cut mid-answer: the first events with `partial` text (or the start of the
    /// JSON body), then broken chunked framing, which the client sees exactly as a connection
    /// that dropped mid-body (`tiny_http` cannot close a kept-alive socket on demand).
    pub fn drop_stream(partial: &str) -> Self {
        Self::new(Body::Drop {
            partial: partial.to_string(),
        })
    }

    /// A body that ends cleanly too early: streamed, `partial` text and no `finish_reason` /
    /// `[DONE]` / `message_stop`; not streamed, half a JSON body.
    pub fn truncated_stream(partial: &str) -> Self {
        Self::new(Body::Truncated {
            partial: partial.to_string(),
        })
    }

    /// Never answers: sends the status line and headers, then only keep-alive filler (SSE
    /// comments, or JSON whitespace) every 50 ms until the client closes the connection
    /// (counted by [`ScriptedLlm::hangs_closed`]) or the server stops.
    pub fn hang() -> Self {
        Self::new(Body::Hang)
    }

    /// Adds text beside tool calls (or replaces a text answer's text).
    pub fn with_text(mut self, content: &str) -> Self {
        if let Body::Message { text, .. } = &mut self.body {
            *text = content.to_string();
        }
        self
    }

    /// Sets `finish_reason` / `stop_reason` verbatim (`length`, `max_tokens`,
    /// `content_filter`, `refusal`…).
    pub fn stop(mut self, reason: &str) -> Self {
        if let Body::Message { stop, .. } = &mut self.body {
            *stop = Some(reason.to_string());
        }
        self
    }

    /// Sets the reported usage (input, output tokens).
    pub fn usage(mut self, input: u64, output: u64) -> Self {
        if let Body::Message { usage, .. } = &mut self.body {
            *usage = (input, output);
        }
        self
    }

    /// Adds a response header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Waits `delay` before answering.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Responder = dyn Fn(&RecordedRequest) -> ScriptedReply + Send + Sync + 'static;

struct State {
    kind: ProviderKind,
    responder: Box<Responder>,
    requests: Mutex<Vec<RecordedRequest>>,
    stop: AtomicBool,
    hangs_closed: AtomicUsize,
    panics: Mutex<Vec<String>>,
}

/// The running server. Stops (and joins its accept thread) on drop.
pub struct ScriptedLlm {
    kind: ProviderKind,
    port: u16,
    server: Arc<tiny_http::Server>,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl ScriptedLlm {
    /// Starts a server for `kind` whose replies come from `responder`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(
        kind: ProviderKind,
        responder: impl Fn(&RecordedRequest) -> ScriptedReply + Send + Sync + 'static,
    ) -> ScriptedLlm {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
        let port = server.server_addr().to_ip().expect("an IP listener").port();
        let state = Arc::new(State {
            kind,
            responder: Box::new(responder),
            requests: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            hangs_closed: AtomicUsize::new(0),
            panics: Mutex::new(Vec::new()),
        });
        let accept = {
            let server = Arc::clone(&server);
            let state = Arc::clone(&state);
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    if state.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || handle(&state, request));
                }
            })
        };
        ScriptedLlm {
            kind,
            port,
            server,
            state,
            accept: Some(accept),
        }
    }

    /// Starts a server that gives request `n` the reply `replies[n]`; requests beyond the list
    /// get a 400 saying so (never retried).
    pub fn sequence(kind: ProviderKind, replies: Vec<ScriptedReply>) -> ScriptedLlm {
        Self::start(kind, move |req| {
            replies.get(req.n).cloned().unwrap_or_else(|| {
                ScriptedReply::status(
                    400,
                    format!(
                        "scripted server: no reply scripted for request {} (only {})",
                        req.n,
                        replies.len()
                    ),
                    &[],
                )
            })
        })
    }

    /// Which API it speaks.
    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// The base URL to configure: `http://127.0.0.1:<port>/v1` (openai) or
    /// `http://127.0.0.1:<port>` (anthropic).
    pub fn base_url(&self) -> String {
        match self.kind {
            ProviderKind::Openai => format!("http://127.0.0.1:{}/v1", self.port),
            ProviderKind::Anthropic => format!("http://127.0.0.1:{}", self.port),
        }
    }

    /// A provider config for this server: [`SCRIPTED_API_KEY`], `stream` as given, a 30 s
    /// request timeout.
    pub fn config(&self, stream: bool) -> ProviderConfig {
        ProviderConfig {
            kind: self.kind,
            base_url: self.base_url(),
            api_key: Some(SCRIPTED_API_KEY.to_string()),
            stream,
            request_timeout: Duration::from_secs(30),
        }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        lock(&self.state.requests).len()
    }

    /// How many [`ScriptedReply::hang`] connections the client has closed.
    pub fn hangs_closed(&self) -> usize {
        self.state.hangs_closed.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` until at least `n` hung connections were closed by the client.
    /// Async, so a current-thread runtime keeps running the client's connection tasks (which
    /// do the closing) while it waits.
    pub async fn wait_hangs_closed(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.hangs_closed() >= n).await
    }

    /// Waits up to `timeout` until at least `n` requests arrived (async, like
    /// [`ScriptedLlm::wait_hangs_closed`]).
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.request_count() >= n).await
    }
}

impl Drop for ScriptedLlm {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let panics = lock(&self.state.panics).clone();
        if !panics.is_empty() && !std::thread::panicking() {
            panic!("the scripted LLM responder panicked: {}", panics.join("; "));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// Reads, records and answers one request.
fn handle(state: &State, mut request: tiny_http::Request) {
    let mut raw = Vec::new();
    let _ = request.as_reader().read_to_end(&mut raw);
    let body = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
    let recorded = {
        let mut requests = lock(&state.requests);
        let recorded = RecordedRequest {
            at: Instant::now(),
            n: requests.len(),
            path: request.url().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|h| {
                    (
                        h.field.as_str().as_str().to_ascii_lowercase(),
                        h.value.as_str().to_string(),
                    )
                })
                .collect(),
            body,
            kind: state.kind,
        };
        requests.push(recorded.clone());
        recorded
    };
    let expected = match state.kind {
        ProviderKind::Openai => "/v1/chat/completions",
        ProviderKind::Anthropic => "/v1/messages",
    };
    let reply = if recorded.path != expected {
        ScriptedReply::status(
            404,
            format!(
                "scripted server: no route {} (expected {expected})",
                recorded.path
            ),
            &[],
        )
    } else {
        match catch_unwind(AssertUnwindSafe(|| (state.responder)(&recorded))) {
            Ok(reply) => reply,
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(no message)".into());
                lock(&state.panics).push(format!("request {}: {text}", recorded.n));
                ScriptedReply::status(400, format!("scripted responder panicked: {text}"), &[])
            }
        }
    };
    let end = Instant::now() + reply.delay;
    while Instant::now() < end {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10).min(end - Instant::now()));
    }
    let writer = request.into_writer();
    // A client that went away mid-answer is not the test's concern here.
    let _ = respond(state, &recorded, &reply, writer);
}

/// Writes the reply as raw HTTP/1.1 (so streams can be cut or held open at will).
fn respond(
    state: &State,
    req: &RecordedRequest,
    reply: &ScriptedReply,
    mut w: Box<dyn Write + Send>,
) -> std::io::Result<()> {
    let kind = state.kind;
    let stream = req.is_stream();
    let sse_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    match &reply.body {
        Body::Status { code, body } => {
            write_full(&mut w, *code, "application/json", &reply.headers, body)
        }
        Body::ApiError {
            code,
            kind: etype,
            message,
        } => write_full(
            &mut w,
            *code,
            "application/json",
            &reply.headers,
            &error_envelope(kind, etype, message).to_string(),
        ),
        Body::Message { .. } if !stream => write_full(
            &mut w,
            200,
            "application/json",
            &reply.headers,
            &message_json(kind, req, &reply.body).to_string(),
        ),
        Body::Message { .. } => {
            write_head(&mut w, 200, sse_type, &reply.headers)?;
            for event in message_events(kind, req, &reply.body) {
                write_chunk(&mut w, &event)?;
            }
            end_chunks(&mut w)
        }
        Body::StreamError {
            partial,
            kind: etype,
            message,
        } => {
            let envelope = error_envelope(kind, etype, message);
            if !stream {
                return write_full(
                    &mut w,
                    200,
                    "application/json",
                    &reply.headers,
                    &envelope.to_string(),
                );
            }
            write_head(&mut w, 200, sse_type, &reply.headers)?;
            for event in partial_events(kind, req, partial) {
                write_chunk(&mut w, &event)?;
            }
            let event = match kind {
                ProviderKind::Openai => format!("data: {envelope}\n\n"),
                ProviderKind::Anthropic => format!("event: error\ndata: {envelope}\n\n"),
            };
            write_chunk(&mut w, &event)?;
            end_chunks(&mut w)
        }
        Body::Drop { partial } | Body::Truncated { partial } => {
            write_head(&mut w, 200, sse_type, &reply.headers)?;
            if stream {
                for event in partial_events(kind, req, partial) {
                    write_chunk(&mut w, &event)?;
                }
            } else {
                let full =
                    message_json(kind, req, &ScriptedReply::text(partial.clone()).body).to_string();
                let cut = (0..=full.len() / 2)
                    .rev()
                    .find(|&i| full.is_char_boundary(i))
                    .unwrap_or(0);
                write_chunk(&mut w, &full[..cut])?;
            }
            if matches!(reply.body, Body::Drop { .. }) {
                // Not a hex chunk size: the client's HTTP parser gives up on the connection.
                w.write_all(b"zz\r\nbroken\r\n")?;
                w.flush()
            } else {
                end_chunks(&mut w)
            }
        }
        Body::Hang => {
            write_head(&mut w, 200, sse_type, &reply.headers)?;
            let filler = if stream { ": keep-alive\n\n" } else { " " };
            while !state.stop.load(Ordering::SeqCst) {
                if write_chunk(&mut w, filler).is_err() {
                    state.hangs_closed.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

fn write_head(
    w: &mut dyn Write,
    code: u16,
    content_type: &str,
    headers: &[(String, String)],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n",
        reason(code)
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.flush()
}

fn write_chunk(w: &mut dyn Write, data: &str) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    write!(w, "{:x}\r\n{data}\r\n", data.len())?;
    w.flush()
}

fn end_chunks(w: &mut dyn Write) -> std::io::Result<()> {
    w.write_all(b"0\r\n\r\n")?;
    w.flush()
}

fn write_full(
    w: &mut dyn Write,
    code: u16,
    content_type: &str,
    headers: &[(String, String)],
    body: &str,
) -> std::io::Result<()> {
    write_head(w, code, content_type, headers)?;
    write_chunk(w, body)?;
    end_chunks(w)
}

fn error_envelope(kind: ProviderKind, etype: &str, message: &str) -> Value {
    match kind {
        ProviderKind::Openai => {
            json!({"error": {"message": message, "type": etype, "param": null, "code": etype}})
        }
        ProviderKind::Anthropic => {
            json!({"type": "error", "error": {"type": etype, "message": message},
                   "request_id": "req_scripted"})
        }
    }
}

fn model_of(req: &RecordedRequest) -> String {
    req.body["model"].as_str().unwrap_or("scripted").to_string()
}

fn args_text(args: &Args) -> String {
    match args {
        Args::Json(v) => v.to_string(),
        Args::Raw(s) => s.clone(),
    }
}

/// Splits `s` into pieces of at most `n` characters (on char boundaries).
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// The stop reason a message reply reports.
fn stop_of(kind: ProviderKind, body: &Body) -> String {
    let Body::Message {
        stop,
        calls,
        refusal,
        ..
    } = body
    else {
        return String::new();
    };
    if let Some(stop) = stop {
        return stop.clone();
    }
    match (kind, calls.is_empty(), refusal.is_empty()) {
        (ProviderKind::Openai, false, _) => "tool_calls".into(),
        (ProviderKind::Openai, true, _) => "stop".into(),
        (ProviderKind::Anthropic, false, _) => "tool_use".into(),
        (ProviderKind::Anthropic, true, false) => "refusal".into(),
        (ProviderKind::Anthropic, true, true) => "end_turn".into(),
    }
}

/// A non-streaming body for a message reply.
fn message_json(kind: ProviderKind, req: &RecordedRequest, body: &Body) -> Value {
    let Body::Message {
        text,
        refusal,
        calls,
        usage,
        ..
    } = body
    else {
        return Value::Null;
    };
    let stop = stop_of(kind, body);
    match kind {
        ProviderKind::Openai => {
            let mut message = json!({"role": "assistant",
                "content": if text.is_empty() { Value::Null } else { json!(text) },
                "refusal": if refusal.is_empty() { Value::Null } else { json!(refusal) }});
            if !calls.is_empty() {
                message["tool_calls"] = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, args))| {
                        json!({"id": scripted_call_id(kind, req.n, i), "type": "function",
                               "function": {"name": name, "arguments": args_text(args)}})
                    })
                    .collect();
            }
            json!({"id": format!("chatcmpl-{}", req.n), "object": "chat.completion",
                   "created": 1_760_000_000, "model": model_of(req),
                   "choices": [{"index": 0, "finish_reason": stop, "message": message}],
                   "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1,
                             "total_tokens": usage.0 + usage.1}})
        }
        ProviderKind::Anthropic => {
            let mut content = Vec::new();
            let shown = if text.is_empty() { refusal } else { text };
            if !shown.is_empty() {
                content.push(json!({"type": "text", "text": shown}));
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                let input = match args {
                    Args::Json(v) => v.clone(),
                    Args::Raw(s) => json!({"_raw": s}),
                };
                content.push(
                    json!({"type": "tool_use", "id": scripted_call_id(kind, req.n, i),
                                    "name": name, "input": input}),
                );
            }
            json!({"id": format!("msg_{}", req.n), "type": "message", "role": "assistant",
                   "model": model_of(req), "content": content, "stop_reason": stop,
                   "stop_sequence": null,
                   "usage": {"input_tokens": usage.0, "output_tokens": usage.1,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
        }
    }
}

fn openai_chunk(req: &RecordedRequest, choices: Value) -> String {
    let chunk = json!({"id": format!("chatcmpl-{}", req.n), "object": "chat.completion.chunk",
                       "created": 1_760_000_000, "model": model_of(req), "choices": choices});
    format!("data: {chunk}\n\n")
}

fn anthropic_event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The opening events and `partial` text of a stream, with no terminal event.
fn partial_events(kind: ProviderKind, req: &RecordedRequest, partial: &str) -> Vec<String> {
    let mut out = Vec::new();
    match kind {
        ProviderKind::Openai => {
            out.push(openai_chunk(
                req,
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
            ));
            for p in pieces(partial, 8) {
                out.push(openai_chunk(
                    req,
                    json!([{"index": 0, "delta": {"content": p}, "finish_reason": null}]),
                ));
            }
        }
        ProviderKind::Anthropic => {
            out.push(anthropic_start(req, 10));
            out.push(anthropic_event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            for p in pieces(partial, 8) {
                out.push(anthropic_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": p}}),
                ));
            }
        }
    }
    out
}

fn anthropic_start(req: &RecordedRequest, input_tokens: u64) -> String {
    anthropic_event(
        "message_start",
        json!({"type": "message_start", "message": {"id": format!("msg_{}", req.n),
               "type": "message", "role": "assistant", "model": model_of(req), "content": [],
               "stop_reason": null, "stop_sequence": null,
               "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
    )
}

/// The SSE events of a message reply, terminal events included.
fn message_events(kind: ProviderKind, req: &RecordedRequest, body: &Body) -> Vec<String> {
    let Body::Message {
        text,
        refusal,
        calls,
        usage,
        ..
    } = body
    else {
        return Vec::new();
    };
    let stop = stop_of(kind, body);
    let mut out = Vec::new();
    match kind {
        ProviderKind::Openai => {
            out.extend(partial_events(kind, req, text));
            for p in pieces(refusal, 8) {
                out.push(openai_chunk(
                    req,
                    json!([{"index": 0, "delta": {"refusal": p}, "finish_reason": null}]),
                ));
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                out.push(openai_chunk(
                    req,
                    json!([{"index": 0, "delta": {"tool_calls": [{"index": i,
                        "id": scripted_call_id(kind, req.n, i), "type": "function",
                        "function": {"name": name, "arguments": ""}}]}, "finish_reason": null}]),
                ));
                for p in pieces(&args_text(args), 7) {
                    out.push(openai_chunk(
                        req,
                        json!([{"index": 0, "delta": {"tool_calls": [{"index": i,
                            "function": {"arguments": p}}]}, "finish_reason": null}]),
                    ));
                }
            }
            out.push(openai_chunk(
                req,
                json!([{"index": 0, "delta": {}, "finish_reason": stop}]),
            ));
            let mut last = json!({"id": format!("chatcmpl-{}", req.n),
                "object": "chat.completion.chunk", "created": 1_760_000_000,
                "model": model_of(req), "choices": []});
            last["usage"] = json!({"prompt_tokens": usage.0, "completion_tokens": usage.1,
                                   "total_tokens": usage.0 + usage.1});
            out.push(format!("data: {last}\n\n"));
            out.push("data: [DONE]\n\n".into());
        }
        ProviderKind::Anthropic => {
            out.push(anthropic_start(req, usage.0));
            out.push(anthropic_event("ping", json!({"type": "ping"})));
            let shown = if text.is_empty() { refusal } else { text };
            let mut index = 0;
            if !shown.is_empty() {
                out.extend(partial_events(kind, req, shown).into_iter().skip(1));
                out.push(anthropic_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ));
                index = 1;
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                out.push(anthropic_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index,
                           "content_block": {"type": "tool_use",
                               "id": scripted_call_id(kind, req.n, i), "name": name,
                               "input": {}}}),
                ));
                for p in pieces(&args_text(args), 7) {
                    out.push(anthropic_event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta", "partial_json": p}}),
                    ));
                }
                out.push(anthropic_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                ));
                index += 1;
            }
            out.push(anthropic_event(
                "message_delta",
                json!({"type": "message_delta",
                       "delta": {"stop_reason": stop, "stop_sequence": null},
                       "usage": {"output_tokens": usage.1}}),
            ));
            out.push(anthropic_event(
                "message_stop",
                json!({"type": "message_stop"}),
            ));
        }
    }
    out
}
