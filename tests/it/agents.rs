//! The agent backends against `ralph-fake-agent`: the command a backend builds is started with
//! std::process (the real runner lives in `ralph::process`), the fake's output is split into
//! lines the way the runner does, and fed to the backend's parser. This keeps the fake and the
//! parsers in agreement, and checks the fake's own script actions other tests rely on.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::claude_clock_in;
use ralph::agent::{backend, AgentSettings, Backend};
use ralph::completion::promise_in_final_text;
use ralph::process::{OutputLine, SpawnSpec, StreamKind};
use ralph::protocol::AgentKind;
use ralph::protocol::{AgentEvent, AgentReport, FailureClass};
use serde_json::{json, Value};

const FAKE: &str = env!("CARGO_BIN_EXE_ralph-fake-agent");

struct Fixture {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Fixture {
    fn new(script: Value) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let script_path = dir.path().join("script.json");
        std::fs::write(&script_path, script.to_string()).expect("write script");
        Fixture {
            dir,
            script: script_path,
        }
    }

    fn repo(&self) -> &Path {
        self.dir.path()
    }

    fn claude(&self) -> Box<dyn Backend> {
        let settings = AgentSettings {
            repo: self.repo().to_path_buf(),
            model: Some("sonnet".into()),
            program: Some(PathBuf::from(FAKE)),
            ..AgentSettings::default()
        };
        backend(AgentKind::Claude, settings).expect("claude backend")
    }

    fn exec(&self, args: &str) -> Box<dyn Backend> {
        let fake = shlex::try_quote(FAKE).expect("quotable path");
        let settings = AgentSettings {
            repo: self.repo().to_path_buf(),
            agent_cmd: Some(format!("{fake} {args}")),
            ..AgentSettings::default()
        };
        backend(AgentKind::Exec, settings).expect("exec backend")
    }

    /// The fake's recorded calls, one JSON object per invocation.
    fn calls(&self) -> Vec<Value> {
        let path = PathBuf::from(format!("{}.calls.jsonl", self.script.display()));
        std::fs::read_to_string(path)
            .expect("calls.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).expect("call line is JSON"))
            .collect()
    }

    /// Runs `backend` for `prompt` with `extra_env` in the inherited environment (before the
    /// spec's removals, so removal is observable).
    fn run(&self, backend: &dyn Backend, prompt: &str, extra_env: &[(&str, &str)]) -> Outcome {
        let spec = backend.command(prompt).expect("spawn spec");
        let output = spawn(&spec, &self.script, extra_env);
        let mut parser = backend.parser(prompt);
        let stdout = split_lines(&output.stdout, StreamKind::Stdout);
        let stderr = split_lines(&output.stderr, StreamKind::Stderr);
        let events = stdout
            .iter()
            .chain(&stderr)
            .flat_map(|l| parser.on_line(l))
            .collect();
        let exit = output.status.code();
        Outcome {
            events,
            report: parser.finish(exit),
            stdout: output.stdout,
            exit,
        }
    }
}

struct Outcome {
    events: Vec<AgentEvent>,
    report: AgentReport,
    stdout: Vec<u8>,
    exit: Option<i32>,
}

impl Outcome {
    fn claims_completion(&self) -> bool {
        promise_in_final_text(self.report.final_text.as_deref().unwrap_or_default())
    }
}

fn spawn(spec: &SpawnSpec, script: &Path, extra_env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args).current_dir(&spec.cwd);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    for k in &spec.env_remove {
        cmd.env_remove(k);
    }
    for (k, v) in &spec.env_set {
        cmd.env(k, v);
    }
    cmd.env("RALPH_FAKE_SCRIPT", script)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the fake agent");
    let writer = child.stdin.take().map(|mut pipe| {
        let bytes = spec.stdin.clone().unwrap_or_default();
        // A fake that never reads stdin closes the pipe: a write error is expected then.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let output = child.wait_with_output().expect("wait for the fake agent");
    if let Some(w) = writer {
        w.join().expect("stdin writer");
    }
    output
}

/// Splits like `ralph::process` does: on `\n`, lossy UTF-8, trailing `\r` trimmed, a final
/// partial line kept.
fn split_lines(bytes: &[u8], stream: StreamKind) -> Vec<OutputLine> {
    let mut parts: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    if parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
        .into_iter()
        .map(|p| {
            let text = String::from_utf8_lossy(p);
            OutputLine {
                stream,
                text: text.strip_suffix('\r').unwrap_or(&text).to_owned(),
                truncated_from: None,
            }
        })
        .collect()
}

#[test]
fn claude_dialect_end_to_end_through_the_parser() {
    let fx = Fixture::new(json!({"invocations": [[
        {"claude_init": {}},
        {"claude_text": "Running the tests first."},
        {"claude_tool": {"name": "Bash", "input": {"command": "cargo test", "description": "Run tests"},
                         "result": "test result: ok. 12 passed"}},
        {"claude_text": "All stories pass.\n<promise>COMPLETE</promise>"},
        {"claude_result": {"text": "All stories pass.\n<promise>COMPLETE</promise>", "cost_usd": 0.4231}},
        {"exit": 0}
    ]]}));
    let claude = fx.claude();
    let out = fx.run(
        claude.as_ref(),
        "Work on US-001.",
        &[("CLAUDECODE", "1"), ("CLAUDE_CODE_ENTRYPOINT", "cli")],
    );

    assert_eq!(out.exit, Some(0));
    assert_eq!(
        out.events,
        vec![
            AgentEvent::Session {
                session_id: Some("fake-session-0".into()),
                model: Some("claude-fake-1".into()),
                version: Some("2.1.332".into()),
            },
            AgentEvent::AssistantText {
                text: "Running the tests first.".into()
            },
            AgentEvent::ToolCall {
                name: "Bash".into(),
                summary: "cargo test".into()
            },
            AgentEvent::ToolResult {
                is_error: false,
                output: Some("test result: ok. 12 passed".into()),
                exit_code: None
            },
            AgentEvent::AssistantText {
                text: "All stories pass.\n<promise>COMPLETE</promise>".into()
            },
            AgentEvent::Final {
                text: Some("All stories pass.\n<promise>COMPLETE</promise>".into()),
                is_error: false
            },
        ]
    );
    assert!(out.claims_completion());
    assert!(out.report.saw_final && !out.report.is_error);
    assert_eq!(out.report.cost_usd, Some(0.4231));
    assert_eq!(out.report.usage.output_tokens, 50);
    assert_eq!(out.report.session_id.as_deref(), Some("fake-session-0"));
    assert_eq!(out.report.agent_version.as_deref(), Some("2.1.332"));

    // Like claude 2.1.332, the result line does not start with `type`.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        !last.starts_with(r#"{"type""#) && last.ends_with(r#""type":"result"}"#),
        "{last}"
    );

    let calls = fx.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]["argv"],
        json!([
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            "sonnet"
        ])
    );
    assert_eq!(
        calls[0]["env"]["CLAUDECODE"],
        Value::Null,
        "CLAUDECODE must be scrubbed"
    );
    assert_eq!(calls[0]["env"]["CLAUDE_CODE_ENTRYPOINT"], Value::Null);
    assert_eq!(calls[0]["env"]["NO_COLOR"], json!("1"));
    let expect_sandbox = if nix::unistd::geteuid().is_root() {
        json!("1")
    } else {
        Value::Null
    };
    assert_eq!(calls[0]["env"]["IS_SANDBOX"], expect_sandbox);
    assert_eq!(
        calls[0]["cwd"],
        json!(fx.repo().canonicalize().expect("cwd").to_string_lossy())
    );
}

/// Case 5 through the fake: the promise inside a file the agent read is not a claim.
#[test]
fn claude_promise_in_tool_output_is_no_completion() {
    let fx = Fixture::new(json!({"invocations": [[
        {"claude_init": {}},
        {"claude_tool": {"name": "Read", "input": {"file_path": "prompt.md"},
                         "result": "When done, reply <promise>COMPLETE</promise>"}},
        {"claude_text": "I read the instructions; US-002 is still open."},
        {"claude_result": {"text": "I read the instructions; US-002 is still open."}}
    ]]}));
    let out = fx.run(fx.claude().as_ref(), "prompt", &[]);
    assert!(out.events.contains(&AgentEvent::ToolCall {
        name: "Read".into(),
        summary: "prompt.md".into()
    }));
    assert!(!out.claims_completion());
}

/// One script, several invocations: each picks its own entry, the last one repeats.
#[test]
fn claude_failures_are_classified_one_invocation_at_a_time() {
    let fx = Fixture::new(json!({"invocations": [
        [{"claude_init": {}}, {"claude_usage_limit": {}}, {"exit": 1}],
        [{"claude_init": {}}, {"claude_api_error": {"status": 401, "message": "Failed to authenticate. API Error: 401"}}, {"exit": 1}],
        [{"claude_api_error": {"status": 529, "message": "API Error: 529 Overloaded"}}, {"exit": 1}],
        [{"stderr": "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons"}, {"exit": 1}]
    ]}));
    let claude = fx.claude();
    let expected = [
        FailureClass::UsageLimit,
        FailureClass::Auth,
        FailureClass::Transient,
        FailureClass::Config,
        FailureClass::Config,
    ];
    for (n, class) in expected.into_iter().enumerate() {
        let out = fx.run(claude.as_ref(), "prompt", &[]);
        assert_eq!(out.exit, Some(1), "invocation {n}");
        assert!(out.report.is_error, "invocation {n}");
        assert_eq!(
            out.report.failure,
            Some(class),
            "invocation {n}: {:?}",
            out.report
        );
        assert!(!out.claims_completion());
    }
    let calls = fx.calls();
    let ns: Vec<u64> = calls.iter().filter_map(|c| c["n"].as_u64()).collect();
    assert_eq!(ns, [0, 1, 2, 3, 4]);
    let repeat = fx.run(claude.as_ref(), "prompt", &[]);
    assert_eq!(
        repeat.report.error_message.as_deref(),
        Some("--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons")
    );
}

#[test]
fn default_entry_runs_once_invocations_are_used_up() {
    let fx = Fixture::new(json!({
        "invocations": [[{"stdout": "first"}]],
        "default": [{"stdout": "later"}, {"exit": 2}]
    }));
    let exec = fx.exec("");
    let texts: Vec<(Option<String>, Option<i32>)> = (0..3)
        .map(|_| {
            let out = fx.run(exec.as_ref(), "prompt", &[]);
            (out.report.final_text, out.exit)
        })
        .collect();
    assert_eq!(
        texts,
        [
            (Some("first".into()), Some(0)),
            (Some("later".into()), Some(2)),
            (Some("later".into()), Some(2))
        ]
    );
}

/// Case 27: quotes, `$(...)`, backticks and non-ASCII in a 200 KB prompt reach the agent byte
/// for byte through stdin; nothing in the prompt or the command line is executed.
#[test]
fn prompt_reaches_the_agent_byte_for_byte_and_nothing_runs() {
    let fx = Fixture::new(json!({"invocations": [[
        {"save_stdin": "received/prompt.bin"},
        {"stdout": "saved"}
    ]]}));
    let mut prompt = String::from(
        "# Story US-007: Fix \"quoted\" title, 'single', $(touch pwned-subst) `touch pwned-tick` \
         ${HOME} ~ \\ ünïcødé 日本語 🚀\n",
    );
    while prompt.len() < 200 * 1024 {
        prompt.push_str("Acceptance: the `parser` handles $(rm -rf ~) and \"quotes\" — ok.\n");
    }
    let exec = fx.exec("--flag 'two words' '$(touch pwned-arg)'");
    let out = fx.run(exec.as_ref(), &prompt, &[]);

    assert_eq!(out.exit, Some(0));
    let received = std::fs::read(fx.repo().join("received/prompt.bin")).expect("saved stdin");
    assert_eq!(received.len(), prompt.len());
    assert!(
        received == prompt.as_bytes(),
        "stdin differs from the prompt"
    );
    assert_eq!(
        fx.calls()[0]["argv"],
        json!(["--flag", "two words", "$(touch pwned-arg)"])
    );
    for name in ["pwned-subst", "pwned-tick", "pwned-arg"] {
        assert!(
            !fx.repo().join(name).exists(),
            "{name} was created: something ran a shell"
        );
    }
    assert_eq!(out.report.final_text.as_deref(), Some("saved"));
}

/// Case 1 and case 6 through a plain-text agent: an echo of the prompt (which ends with the
/// promise) is no claim; a real last line without a trailing newline is.
#[test]
fn exec_echo_is_not_a_claim_but_a_last_line_promise_is() {
    let fx = Fixture::new(json!({"invocations": [
        [{"echo_stdin": true}],
        [{"echo_stdin": true}, {"stdout": "Done."}, {"stdout_raw": "<promise>COMPLETE</promise>"}]
    ]}));
    let prompt = "# Instructions\n\nImplement US-001.\nWhen all stories pass, print\n<promise>COMPLETE</promise>\n";
    let exec = fx.exec("");
    let echo_only = fx.run(exec.as_ref(), prompt, &[]);
    assert!(String::from_utf8_lossy(&echo_only.stdout).contains("<promise>COMPLETE</promise>"));
    assert!(!echo_only.claims_completion(), "{:?}", echo_only.report);
    let claim = fx.run(exec.as_ref(), prompt, &[]);
    assert!(!claim.stdout.ends_with(b"\n"));
    assert!(claim.claims_completion(), "{:?}", claim.report);
    assert_eq!(fx.calls()[1]["env"]["NO_COLOR"], json!("1"));
}

/// Case 14 through the fake: invalid UTF-8, CRLF, a non-JSON line, a 6 MB line and a final
/// partial line do not stop the claude parser from finding the result.
#[test]
fn claude_parser_survives_hostile_output() {
    let fx = Fixture::new(json!({"invocations": [[
        {"claude_init": {}},
        {"stdout_bytes": [0xff, 0xfe, 0x7b, 0x0a]},
        {"stdout": "plain text, not JSON\r"},
        {"claude_tool_result": {"content": "x", "repeat": 6_000_000}},
        {"stderr": "\u{1b}[33mwarning: coloured\u{1b}[0m"},
        {"claude_text": "Done. <promise>COMPLETE</promise>"},
        {"claude_result": {"text": "Done. <promise>COMPLETE</promise>"}},
        {"stdout_raw": "partial line without newline"}
    ]]}));
    let out = fx.run(fx.claude().as_ref(), "prompt", &[]);
    assert!(out.stdout.len() > 6_000_000);
    assert!(out.events.iter().any(|e| matches!(
        e,
        AgentEvent::ToolResult {
            is_error: false,
            ..
        }
    )));
    assert!(out.events.contains(&AgentEvent::Error {
        message: "warning: coloured".into()
    }));
    assert!(out.report.saw_final && !out.report.is_error);
    assert_eq!(out.report.failure, None);
    assert!(out.claims_completion());
}

/// The repository actions other tests script: set_passes keeps key order and unknown fields,
/// git_commit commits everything, corrupt_prd leaves invalid JSON.
#[test]
fn fake_edits_prd_and_commits_like_an_agent() {
    let fx = Fixture::new(json!({"invocations": [
        [
            {"set_passes": {"id": "US-002", "passes": true}},
            {"append_file": {"path": "progress.txt", "content": "worked on US-002\n"}},
            {"write_file": {"path": "src/new.txt", "content": "hi"}},
            {"git_commit": "feat: US-002"}
        ],
        [{"corrupt_prd": true}]
    ]}));
    let repo = fx.repo();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(repo)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q"]);
    let prd = r#"{"project": "x", "branchName": "ralph/x", "userStories": [
        {"id": "US-001", "title": "a", "priority": 1, "passes": false, "notes": "keep"},
        {"id": "US-002", "title": "b", "priority": 2, "passes": false, "notes": "", "custom": [1, 2]}
    ], "zLast": true}"#;
    std::fs::write(repo.join("prd.json"), prd).expect("write prd");
    std::fs::write(repo.join(".gitignore"), "script.json*\n").expect("write .gitignore");

    let out = fx.run(fx.exec("").as_ref(), "prompt", &[]);
    assert_eq!(out.exit, Some(0), "{:?}", out.report);
    let text = std::fs::read_to_string(repo.join("prd.json")).expect("read prd");
    let value: Value = serde_json::from_str(&text).expect("prd stays valid");
    assert_eq!(value["userStories"][1]["passes"], json!(true));
    assert_eq!(value["userStories"][0]["passes"], json!(false));
    assert_eq!(value["userStories"][1]["custom"], json!([1, 2]));
    let keys: Vec<&String> = value.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["project", "branchName", "userStories", "zLast"]);
    assert_eq!(
        git(&["log", "-1", "--format=%s|%an"]).trim(),
        "feat: US-002|ralph-fake-agent"
    );
    assert_eq!(git(&["status", "--porcelain"]), "");
    assert!(git(&["show", "--name-only", "--format="]).contains("src/new.txt"));

    fx.run(fx.exec("").as_ref(), "prompt", &[]);
    let text = std::fs::read_to_string(repo.join("prd.json")).expect("read prd");
    assert!(
        serde_json::from_str::<Value>(&text).is_err(),
        "prd.json should be corrupt: {text}"
    );
}

/// spawn_grandchild leaves a process running after the fake exits (the test stops it).
#[test]
fn fake_grandchild_outlives_the_fake() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let fx = Fixture::new(json!({"invocations": [[
        {"spawn_grandchild": {"ignore_term": true, "hold_stdout": false, "sleep_s": 30, "pid_file": "gc.pid"}},
        {"stdout": "bye"}
    ]]}));
    let out = fx.run(fx.exec("").as_ref(), "prompt", &[]);
    assert_eq!(out.exit, Some(0));
    let pid: i32 = std::fs::read_to_string(fx.repo().join("gc.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let pid = Pid::from_raw(pid);
    // `sh` installs the trap, then execs `sleep`: once it is `sleep`, SIGTERM is ignored.
    let comm = format!("/proc/{pid}/comm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
        assert!(
            std::time::Instant::now() < deadline,
            "grandchild never became `sleep`"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    kill(pid, Signal::SIGTERM).expect("send SIGTERM");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let alive_after_term = kill(pid, None).is_ok();
    kill(pid, Signal::SIGKILL).ok();
    assert!(alive_after_term, "the grandchild ignores SIGTERM");
}

/// Through the fake, the shapes older and newer claude versions end with: the status only in
/// the text (`API Error: 500 {…}`, no `api_error_status`), an `error_during_execution` result
/// whose reason is in `errors[]`, and a limit notice on stderr with no result at all.
#[test]
fn claude_older_shapes_errors_array_and_stderr_limits() {
    let fx = Fixture::new(json!({"invocations": [
        [{"claude_init": {}},
         {"claude_result": {"text": "API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}", "is_error": true, "terminal_reason": "api_error"}},
         {"exit": 1}],
        [{"claude_init": {}},
         {"json": {"type": "result", "subtype": "error_during_execution", "is_error": true,
                   "session_id": "s", "num_turns": 4, "total_cost_usd": 0.03,
                   "errors": ["Error: Request was aborted."], "terminal_reason": "aborted_streaming"}},
         {"exit": 1}],
        [{"stderr": format!("Session limit reached \u{2219} resets {}", claude_clock_in(3))}, {"exit": 1}]
    ]}));
    let claude = fx.claude();

    let out = fx.run(claude.as_ref(), "prompt", &[]);
    assert_eq!(
        out.report.failure,
        Some(FailureClass::Transient),
        "{:?}",
        out.report
    );

    let out = fx.run(claude.as_ref(), "prompt", &[]);
    assert!(out.report.is_error);
    assert_eq!(out.report.failure, None);
    assert_eq!(
        out.report.error_message.as_deref(),
        Some("Error: Request was aborted.")
    );

    let out = fx.run(claude.as_ref(), "prompt", &[]);
    assert_eq!(out.report.failure, Some(FailureClass::UsageLimit));
    let at = out.report.resume_at.expect("a reset time");
    assert!(at > chrono::Utc::now() && at < chrono::Utc::now() + chrono::Duration::hours(25));
}
