//! Notifications through a real `ralph run`: a webhook server on 127.0.0.1 receives each event
//! once, in order, only after the iteration's ledger line exists; the HMAC signature; a failing
//! endpoint (retried, then a warning, the exit code unchanged); a hanging one (cut at its
//! timeout); the command sink; and `ralph notify --test`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::run_cases::claude_story;

/// One request the webhook received.
#[derive(Debug, Clone)]
struct Received {
    body: Value,
    raw: Vec<u8>,
    signature: Option<String>,
    /// Ledger lines when the request arrived.
    ledger_lines: usize,
}

/// How the webhook answers.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Ok,
    Fail,
    Hang,
}

/// A webhook on 127.0.0.1 that records what it receives; stopped when dropped.
struct Webhook {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Webhook {
    fn start(behaviour: Behaviour, ledger: PathBuf) -> Webhook {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!(
            "http://127.0.0.1:{}/hook/secret-token",
            server.server_addr().to_ip().unwrap().port()
        );
        let received = Arc::new(Mutex::new(Vec::new()));
        let (srv, rec) = (server.clone(), received.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut req in srv.incoming_requests() {
                let mut raw = Vec::new();
                let _ = req.as_reader().read_to_end(&mut raw);
                let signature = req
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("X-Ralph-Signature"))
                    .map(|h| h.value.to_string());
                let ledger_lines = std::fs::read_to_string(&ledger)
                    .map(|t| t.lines().count())
                    .unwrap_or(0);
                rec.lock().unwrap().push(Received {
                    body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
                    raw,
                    signature,
                    ledger_lines,
                });
                match behaviour {
                    Behaviour::Ok => {
                        let _ = req.respond(tiny_http::Response::from_string("ok"));
                    }
                    Behaviour::Fail => {
                        let _ = req.respond(
                            tiny_http::Response::from_string("down").with_status_code(500),
                        );
                    }
                    // Never answer: keep the request (and its socket) open.
                    Behaviour::Hang => held.push(req),
                }
            }
        });
        Webhook {
            url,
            received,
            server,
            thread: Some(thread),
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn failing() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ])
}

fn configure(env: &TestEnv, toml: &str) {
    env.write("ralph.toml", toml);
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "notify config"]);
}

#[test]
fn each_event_reaches_the_webhook_once_in_order_after_its_ledger_line() {
    let env = TestEnv::new(&prd_with_stories(2));
    let hook = Webhook::start(Behaviour::Ok, env.path(".ralph/ledger.jsonl"));
    configure(
        &env,
        &format!(
            "[notify]\nwebhook = [\"{}\"]\nsecret_env = \"HOOK_SECRET\"\n",
            hook.url
        ),
    );
    env.script(&json!({"invocations": [claude_story("US-001", 1, "one"), failing(), failing()]}));
    let out = env
        .ralph_cmd(&["run", "--max-iter", "5", "--max-attempts", "2"])
        .env("HOOK_SECRET", "s3cret-key")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let got = hook.received();
    let kinds: Vec<&str> = got
        .iter()
        .map(|r| r.body["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["story_passed", "story_blocked", "run_finished"],
        "{got:#?}"
    );
    // Sent only once the iteration is written down.
    assert!(
        got[0].ledger_lines >= 1,
        "story_passed before its ledger line"
    );
    assert!(
        got[1].ledger_lines >= 3,
        "story_blocked before its ledger line"
    );
    assert_eq!(got[2].body["details"]["stop_reason"]["kind"], "all_blocked");
    assert!(got[0].body["text"]
        .as_str()
        .unwrap()
        .contains("US-001 passed"));
    // Signed with HMAC-SHA256 of the exact body.
    for r in &got {
        let want = format!("sha256={}", ralph::notify::sign(b"s3cret-key", &r.raw));
        assert_eq!(r.signature.as_deref(), Some(want.as_str()));
    }
    // Recorded, and no secret anywhere ralph writes.
    let log = env.read(".ralph/notifications.jsonl");
    assert_eq!(log.lines().count(), 3, "{log}");
    for file in [
        ".ralph/notifications.jsonl",
        ".ralph/ledger.jsonl",
        ".ralph/state.json",
    ] {
        let content = env.read(file);
        assert!(
            !content.contains("secret-token"),
            "{file} has the webhook token"
        );
        assert!(
            !content.contains("s3cret-key"),
            "{file} has the HMAC secret"
        );
    }
}

#[test]
fn a_failing_endpoint_is_retried_then_warned_about_and_the_exit_code_stays() {
    let env = TestEnv::new(&prd_with_stories(1));
    let hook = Webhook::start(Behaviour::Fail, env.path(".ralph/ledger.jsonl"));
    // Spelled as a URL parser would rewrite it: the token must not show anyway. The URL comes
    // from the environment, so it is not in ralph.toml either.
    let url = hook.url.replace("127.0.0.1", "LOCALHOST");
    configure(
        &env,
        "[notify]\nwebhook_env = \"HOOK_URL\"\nattempts = 2\nevents = [\"run_finished\"]\n",
    );
    env.script(&json!({"invocations": [claude_story("US-001", 1, "one")]}));
    let out = env
        .ralph_cmd(&["run", "--max-iter", "3"])
        .env("HOOK_URL", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(hook.received().len(), 2, "one notification, two attempts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: the run_finished notification to webhook http://localhost:")
            && err.contains("failed after 2 attempts: HTTP 500"),
        "{err}"
    );
    assert!(!err.contains("secret-token"), "{err}");
    assert!(!env
        .read(".ralph/notifications.jsonl")
        .contains("secret-token"));
}

#[test]
fn a_hanging_endpoint_is_cut_at_its_timeout() {
    let env = TestEnv::new(&prd_with_stories(1));
    let hook = Webhook::start(Behaviour::Hang, env.path(".ralph/ledger.jsonl"));
    configure(
        &env,
        &format!(
            "[notify]\nwebhook = [\"{}\"]\ntimeout = \"1s\"\nattempts = 1\n",
            hook.url
        ),
    );
    env.script(&json!({"invocations": [claude_story("US-001", 1, "one")]}));
    let t = Instant::now();
    let out = env.ralph(&["run", "--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Two notifications (story_passed, run_finished), one second each at most, plus the run.
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no answer within 1s"), "{err}");
}

#[test]
fn the_command_sink_gets_the_notification_json_on_stdin() {
    let env = TestEnv::new(&prd_with_stories(1));
    let got = env.root.path().join("notes.jsonl");
    env.script(&json!({"invocations": [claude_story("US-001", 1, "one")]}));
    let command = format!("cat >> {} && echo >> {}", got.display(), got.display());
    let out = env.ralph(&["run", "--max-iter", "3", "--notify-command", &command]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<Value> = std::fs::read_to_string(&got)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["story_passed", "run_finished"]);
    assert_eq!(lines[0]["project"], "Demo");
    assert_eq!(lines[1]["details"]["stop_reason"]["kind"], "complete");
}

#[test]
fn notify_test_sends_each_kind_and_says_what_happened() {
    let env = TestEnv::new(&prd_with_stories(1));
    let hook = Webhook::start(Behaviour::Ok, env.path(".ralph/ledger.jsonl"));
    let out = env.ralph(&[
        "notify",
        "--test",
        "--notify-webhook",
        &hook.url,
        "--notify-format",
        "slack",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        shown.lines().filter(|l| l.starts_with("ok ")).count(),
        5,
        "{shown}"
    );
    let got = hook.received();
    assert_eq!(got.len(), 5);
    assert!(got[0].body["text"].as_str().unwrap().contains("[test]"));
    let dead = env.ralph(&[
        "notify",
        "--test",
        "--notify-webhook",
        "http://127.0.0.1:9/x",
    ]);
    assert_eq!(dead.status.code(), Some(1), "{}", text(&dead));
    assert!(String::from_utf8_lossy(&dead.stdout).contains("FAILED"));
}
