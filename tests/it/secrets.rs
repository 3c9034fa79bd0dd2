//! Secrets and the one agent launcher, through the real binary:
//! - a key an agent prints (planted in the environment, in the repository's `.env`, and one of a
//!   well-known shape configured nowhere) reaches none of the places ralph writes or sends:
//!   progress.txt, the checkpoint commits, the ledger, state.json, the transcripts, `ralph log`
//!   (text and JSON), `ralph show`, `ralph report` (HTML and Markdown), the webhook's body, the
//!   terminal, `--json`, and under GitHub Actions the annotations, `$GITHUB_OUTPUT` and
//!   `$GITHUB_STEP_SUMMARY`; each of those places does show `<redacted>` where the key was;
//! - `ralph plan`'s agent session goes through the iteration's launcher: it carries the process
//!   tag, never sees `RALPH_GIT_TOKEN`, has what it left running killed, and its failure is
//!   classified with the user's `[patterns]`;
//! - notifications name the project, the PRD and the branch, in the text and as fields.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::common::{plan_once_with_exec, prd_with_stories, script_file, text, TestEnv};

/// In the environment, under a secret-looking name; no well-known shape.
const ENV_KEY: &str = "acme-env-key-7f3a9c2e";
/// In `.env`, under a secret-looking name.
const DOTENV_PASSWORD: &str = "dotenv-pw-91b2c3d4e5";
/// In `.env`, under a plain name, but shaped like a generated key.
const DOTENV_GENERATED: &str = "Zq8Xw3Vt6Yu1Pk4Lm7Nb";
/// Configured nowhere: an Anthropic key's shape.
const SHAPED: &str = "sk-ant-api03-Xb12Cd34Ef56Gh78Ij90Kl";

const ALL: [&str; 4] = [ENV_KEY, DOTENV_PASSWORD, DOTENV_GENERATED, SHAPED];

/// A webhook on 127.0.0.1 that keeps the bodies it receives; stopped when dropped.
struct Webhook {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Webhook {
    fn start() -> Webhook {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1"));
        let port = server.server_addr().to_ip().expect("ip").port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (srv, rec) = (server.clone(), bodies.clone());
        let thread = std::thread::spawn(move || {
            for mut req in srv.incoming_requests() {
                let mut raw = String::new();
                let _ = req.as_reader().read_to_string(&mut raw);
                rec.lock().unwrap().push(raw);
                let _ = req.respond(tiny_http::Response::from_string("ok"));
            }
        });
        Webhook {
            url: format!("http://127.0.0.1:{port}/hook"),
            bodies,
            server,
            thread: Some(thread),
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
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

/// The places checked, and what was wrong with each (all of them are reported at the end, so
/// that one run names every leak).
#[derive(Default)]
struct Checks {
    problems: Vec<String>,
}

impl Checks {
    /// `place` must hold no planted secret and show `<redacted>` where the key was (the text
    /// that carried it must have reached it).
    fn clean(&mut self, place: &str, haystack: &str) {
        self.clean_as(place, haystack, "<redacted>");
    }

    /// [`Checks::clean`] for a place that shows `<redacted>` as `marker` (HTML escapes it).
    fn clean_as(&mut self, place: &str, haystack: &str, marker: &str) {
        self.absent(place, haystack);
        if !haystack.contains(marker) {
            self.problems.push(format!(
                "{place} does not show {marker} where the key was (did the message reach it?):\n{haystack}"
            ));
        }
    }

    /// `place` must hold no planted secret (for a place the message need not reach).
    fn absent(&mut self, place: &str, haystack: &str) {
        for secret in ALL.into_iter().filter(|s| haystack.contains(s)) {
            self.problems
                .push(format!("{place} holds the secret {secret}:\n{haystack}"));
        }
    }

    fn finish(self) {
        let places: Vec<&str> = self
            .problems
            .iter()
            .map(|p| p.lines().next().unwrap_or_default())
            .collect();
        assert!(
            self.problems.is_empty(),
            "{} problem(s):\n{}\n\nin full:\n{}",
            places.len(),
            places.join("\n"),
            self.problems.join("\n\n")
        );
    }
}

/// Every file under `dir`, concatenated with its name.
fn all_files(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push_str(&format!("--- {}\n", p.display()));
                out.push_str(&String::from_utf8_lossy(
                    &std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    out
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn leaky_env() -> TestEnv {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(".gitignore", ".env\n");
    env.git(&["add", ".gitignore"]);
    env.git(&["commit", "-qm", "ignore .env"]);
    env.write(
        ".env",
        &format!(
            "# local settings\nDB_PASSWORD={DOTENV_PASSWORD}\nWEBHOOK_SIGNING=\"{DOTENV_GENERATED}\"\nNODE_ENV=production\n"
        ),
    );
    env
}

#[test]
fn a_key_the_agent_prints_reaches_nothing_ralph_writes_or_sends() {
    let env = leaky_env();
    let agent = script_file(
        &env,
        "leaky-agent.sh",
        &format!(
            "echo \"working with $ACME_API_KEY\"\n\
             echo \"error: invalid api key $ACME_API_KEY (db {DOTENV_PASSWORD}, signing {DOTENV_GENERATED}, fallback {SHAPED})\" >&2\n\
             exit 1\n"
        ),
    );
    let hook = Webhook::start();
    let gh_output = env.root.path().join("github_output");
    let gh_summary = env.root.path().join("github_summary");
    let agent_cmd = agent.display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--agent",
            "exec",
            "--agent-cmd",
            &agent_cmd,
            "--max-iter",
            "1",
            "--notify-webhook",
            &hook.url,
        ];
        args.extend_from_slice(extra);
        let mut cmd = env.ralph_cmd(&args);
        cmd.env("ACME_API_KEY", ENV_KEY)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_OUTPUT", &gh_output)
            .env("GITHUB_STEP_SUMMARY", &gh_summary);
        cmd.output().expect("run ralph")
    };
    let mut c = Checks::default();
    let first = run(&[]);
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{}", text(&first));
    assert_eq!(ledger[0]["outcome"], "auth_error", "{}", text(&first));
    // The terminal and the GitHub annotations (both on stderr here).
    c.clean("ralph run's output", &text(&first));
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("::error title="),
        "{}",
        text(&first)
    );
    // The `--json` stream of a second run.
    let second = run(&["--json", "--verbose"]);
    c.clean("ralph run --json", &stdout(&second));

    c.clean("progress.txt", &env.read("progress.txt"));
    c.clean("the ledger", &env.read(".ralph/ledger.jsonl"));
    c.clean(
        "every commit and diff",
        &env.git(&["log", "--all", "-p", "--format=%H%n%B"]),
    );
    c.clean(
        "$GITHUB_STEP_SUMMARY",
        &std::fs::read_to_string(&gh_summary).unwrap(),
    );
    // The outputs carry no message on a run that ends normally.
    c.absent(
        "$GITHUB_OUTPUT",
        &std::fs::read_to_string(&gh_output).unwrap(),
    );
    let bodies = hook.bodies();
    assert!(!bodies.is_empty(), "no notification arrived");
    c.clean("the webhook bodies", &bodies.join("\n"));

    for (place, args) in [
        ("ralph log", vec!["log", "--no-pager"]),
        ("ralph log --json", vec!["log", "--json"]),
        ("ralph show", vec!["show", "1", "--no-pager"]),
        ("ralph show --json", vec!["show", "1", "--json"]),
        ("ralph show --raw", vec!["show", "1", "--raw", "--no-pager"]),
        ("ralph report --markdown", vec!["report", "--markdown"]),
    ] {
        let out = env.ralph(&args);
        assert!(out.status.success(), "{place}: {}", text(&out));
        c.clean(place, &stdout(&out));
    }
    let status = env.ralph(&["status"]);
    c.absent("ralph status", &text(&status));
    let html = env.ralph(&["report"]);
    assert!(html.status.success(), "{}", text(&html));
    c.clean_as(
        "the HTML report",
        &env.read(".ralph/report.html"),
        "&lt;redacted&gt;",
    );

    // Last: everything under .ralph (transcripts, state.json, notifications, the report).
    let transcripts = all_files(&env.path(".ralph/runs"));
    c.clean("the transcripts", &transcripts);
    c.absent("the files under .ralph", &all_files(&env.path(".ralph")));
    c.finish();
}

/// A plan session that records what it was given, leaves a process running in a session of its
/// own, and fails with a message only the user's `[patterns]` classify.
#[test]
fn a_plan_session_goes_through_the_iteration_launcher() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "ralph.toml",
        "[patterns]\nusage_limit = [\"night quota exhausted\"]\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "patterns"]);
    let seen = env.root.path().join("seen.txt");
    let stray_pid = env.root.path().join("stray.pid");
    let agent = script_file(
        &env,
        "plan-agent.sh",
        &format!(
            "echo \"tag=${{RALPH_AGENT_TAG:-none}} token=${{RALPH_GIT_TOKEN:-unset}}\" > '{}'\n\
             setsid sh -c 'echo $$ > \"{}\"; exec sleep 300' >/dev/null 2>&1 < /dev/null &\n\
             for i in 1 2 3 4 5 6 7 8 9 10; do [ -s '{}' ] && break; sleep 0.1; done\n\
             echo \"provider says: night quota exhausted for key $ACME_API_KEY\" >&2\n\
             exit 1\n",
            seen.display(),
            stray_pid.display(),
            stray_pid.display()
        ),
    );
    let out = plan_once_with_exec(&env, &agent)
        .env("RALPH_GIT_TOKEN", "ghp_PlanSessionMustNotSeeThis0123")
        .env("ACME_API_KEY", ENV_KEY)
        .output()
        .expect("run ralph plan");
    assert!(!out.status.success(), "{}", text(&out));
    let seen = std::fs::read_to_string(&seen).expect("the agent ran");
    assert!(
        seen.contains("token=unset"),
        "the token reached the agent: {seen}"
    );
    assert!(seen.starts_with("tag=ask-"), "no process tag: {seen}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("hit a usage limit") && stderr.contains("night quota exhausted"),
        "the failure is not classified with [patterns]: {}",
        text(&out)
    );
    assert!(
        !stderr.contains(ENV_KEY) && stderr.contains("for key <redacted>"),
        "the error quotes the key: {}",
        text(&out)
    );
    let pid: i32 = std::fs::read_to_string(&stray_pid)
        .expect("the stray started")
        .trim()
        .parse()
        .unwrap();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_string()))
            .is_some_and(|r| !r.starts_with('Z'))
    };
    // The kill is sent before ralph exits; give the kernel a moment to end the process.
    for _ in 0..50 {
        if !alive() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if alive() {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        panic!(
            "the process the plan session left running (pid {pid}) outlived ralph: {}",
            text(&out)
        );
    }
}

#[test]
fn notifications_name_the_project_the_prd_and_the_branch() {
    let env = TestEnv::new(&json!({"project": "Root", "branchName": "ralph/root",
        "userStories": []}));
    let mut prd = prd_with_stories(1);
    prd["project"] = json!("Alpha");
    prd["branchName"] = json!("ralph/alpha");
    env.write(
        "prds/a/prd.json",
        &serde_json::to_string_pretty(&prd).unwrap(),
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "a second PRD"]);
    let hook = Webhook::start();
    let out = env.ralph(&[
        "run",
        "--prd",
        "prds/a/prd.json",
        "--agent",
        "exec",
        "--agent-cmd",
        "true",
        "--max-iter",
        "1",
        "--notify-webhook",
        &hook.url,
    ]);
    let bodies = hook.bodies();
    assert!(!bodies.is_empty(), "no notification: {}", text(&out));
    for body in bodies {
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["project"], "Alpha", "{body}");
        assert_eq!(v["prd"], "prds/a/prd.json", "{body}");
        assert_eq!(v["branch"], "ralph/alpha", "{body}");
        let sentence = v["text"].as_str().unwrap();
        assert!(
            sentence.starts_with("Alpha (prds/a/prd.json on ralph/alpha): "),
            "{sentence}"
        );
    }
}
