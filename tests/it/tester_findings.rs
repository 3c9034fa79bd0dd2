//! What a new-user tester found against issue 18 ("Keep the promise off the happy path"), each
//! through the real binary:
//! - untracked secret-looking files (`.env`, `*.pem`, `id_rsa`, …) never reach a checkpoint,
//!   `--allow-dirty` or not, and the run says which it left out;
//! - the books under `.ralph/` are redacted when written, so a reader without the key in the
//!   environment sees none; a commit that holds a key is flagged in the record and by
//!   `ralph show --diff`, which redacts the well-known shapes whoever reads it;
//! - a known key URL-encoded, base64-encoded (both alphabets) or split across two lines is
//!   redacted too;
//! - a stop during the verify gate leaves the check on record as interrupted (cut short, or not
//!   run), never an empty `verify`;
//! - a notification that could not be delivered is said when it fails, and `ralph log` and
//!   `ralph status` name it afterwards;
//! - `--resume-only` with nothing to resume ends like any run: a `run_finished` event with its
//!   reason, and the GitHub outputs;
//! - what a 7 a.m. reader sees reads right: no terminal escape codes from the agent in `log`,
//!   `show` or `report`, a reset time with its UTC offset, "a valid PRD";
//! - a story an earlier story's work already satisfied passes on its own passing `verify`
//!   (the outcome says so); without a `verify` it stays refused;

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::{
    failing_iteration, plan_once_with_exec, prd_with_stories, script_file, signal, text, wait_exit,
    wait_for, TestEnv,
};

/// `ralph run` with the exec agent `agent` for at most `max_iter` iterations, and `extra` flags.
fn run_exec(
    env: &TestEnv,
    agent: &std::path::Path,
    max_iter: u32,
    extra: &[&str],
) -> std::process::Command {
    let agent = agent.display().to_string();
    let max_iter = max_iter.to_string();
    let mut args = vec![
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent,
        "--max-iter",
        &max_iter,
    ];
    args.extend_from_slice(extra);
    env.ralph_cmd(&args)
}

/// The files of every commit on the current branch.
fn committed_files(env: &TestEnv) -> String {
    env.git(&["log", "--name-only", "--format=", "HEAD"])
}

#[test]
fn allow_dirty_never_commits_an_untracked_secret_file() {
    let env = TestEnv::new(&prd_with_stories(1));
    // The user's own untracked work (--allow-dirty includes it), and their keys (never).
    env.write("notes.md", "my notes\n");
    env.write(".env", "OPENAI_API_KEY=sk-proj-0123456789abcdefABCDEF\n");
    env.write("certs/server.pem", "-----BEGIN PRIVATE KEY-----\nMIIE\n");
    env.write(".env.example", "OPENAI_API_KEY=\n");
    // The agent does the work, writes a key of its own and stages another secret file itself.
    let agent = script_file(
        &env,
        "agent.sh",
        "echo done > file-1.txt\n\
         echo 'PRIVATE' > id_rsa\n\
         echo 'TOKEN=abc' > .env.production\n\
         git add .env.production\n\
         exit 0\n",
    );
    let out = run_exec(&env, &agent, 1, &["--allow-dirty"])
        .output()
        .unwrap();
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{}", text(&out));
    let files = committed_files(&env);
    for kept in ["file-1.txt", "notes.md", ".env.example"] {
        assert!(
            files.lines().any(|l| l == kept),
            "{kept} should be committed:\n{files}\n{}",
            text(&out)
        );
    }
    for secret in [".env", "certs/server.pem", "id_rsa", ".env.production"] {
        assert!(
            !files.lines().any(|l| l == secret),
            "{secret} was committed:\n{files}\n{}",
            text(&out)
        );
        assert!(env.path(secret).exists(), "{secret} was removed");
    }
    // The run says so at the start and in the iteration's record.
    let all = text(&out);
    assert!(
        all.contains("not committed (secret-looking, untracked): .env"),
        "{all}"
    );
    // Those the agent left: in the iteration's record (what was there at the start was said
    // then, once).
    let findings = ledger[0]["findings"].to_string();
    for secret in [".env.production", "id_rsa"] {
        assert!(findings.contains(secret), "{secret} not named: {findings}");
    }
    assert_eq!(
        all.matches("not committed (secret-looking").count(),
        2,
        "said once each: {all}"
    );
    // `git status` still shows them as the user's untracked files.
    let status = env.git(&["status", "--porcelain"]);
    assert!(status.contains("?? .env\n"), "{status}");
    assert!(status.contains("?? .env.production"), "{status}");
}

#[test]
fn an_untracked_env_file_alone_does_not_refuse_the_run() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(".env", "DB_PASSWORD=hunter2hunter2\n");
    let agent = script_file(&env, "agent.sh", "echo done > file-1.txt\n");
    let out = run_exec(&env, &agent, 1, &[]).output().unwrap();
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    let files = committed_files(&env);
    assert!(files.lines().any(|l| l == "file-1.txt"), "{files}");
    assert!(!files.lines().any(|l| l == ".env"), "{files}");
    // Any other untracked file still refuses the run without --allow-dirty.
    env.write("scratch.txt", "mine\n");
    let refused = env.ralph(&["run", "--agent", "exec", "--agent-cmd", "true"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("scratch.txt"), "{}", text(&refused));
}

/// Every file under `dir`, concatenated with its name, but `skip`.
fn all_files_but(dir: &std::path::Path, skip: &str) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.ends_with(skip) {
                out.push_str(&format!("--- {}\n", p.display()));
                out.push_str(&String::from_utf8_lossy(
                    &std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    out
}

/// In the run's environment only: the morning reader does not have it.
const RUN_KEY: &str = "night-only-key-5d6e7f8a9b";
/// A well-known shape, configured nowhere.
const SHAPED_KEY: &str = "sk-ant-api03-Qw12Er34Ty56Ui78Op90As";

#[test]
fn books_are_redacted_when_written_and_a_committed_key_is_flagged() {
    let env = TestEnv::new(&prd_with_stories(2));
    // The agent quotes the key in prd.json's notes (which the next prompt and the books carry)
    // and commits it in code.
    let agent = script_file(
        &env,
        "agent.sh",
        &format!(
            "python3 - <<'PY'\n\
             import json,os\n\
             p=json.load(open('prd.json'))\n\
             p['userStories'][0]['notes']='used key '+os.environ['ACME_API_KEY']\n\
             open('prd.json','w').write(json.dumps(p,indent=2))\n\
             open('config.py','w').write('KEY = \"%s\"\\nOTHER = \"{SHAPED_KEY}\"\\n' % os.environ['ACME_API_KEY'])\n\
             PY\n\
             exit 0\n"
        ),
    );
    let out = run_exec(&env, &agent, 2, &[])
        .env("ACME_API_KEY", RUN_KEY)
        .output()
        .unwrap();
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 2, "{}", text(&out));
    // The key is in the repository (the agent put it there), and the record says so loudly.
    assert!(
        env.read("config.py").contains(RUN_KEY),
        "{}\n{}",
        env.read("config.py"),
        text(&out)
    );
    let findings = ledger[0]["findings"].to_string();
    assert!(
        findings.contains("SECRET COMMITTED") && findings.contains("config.py"),
        "{findings}\n{}",
        text(&out)
    );
    // Nothing under .ralph/ holds it (prd.snapshot.json is prd.json's own bytes, kept to put
    // prd.json back after a crash), so no reader's environment matters.
    let books = all_files_but(&env.path(".ralph"), "prd.snapshot.json");
    assert!(books.contains("prd-memory.json"), "{books}");
    assert!(books.contains(".prompt.md"), "{books}");
    for key in [RUN_KEY, SHAPED_KEY] {
        assert!(!books.contains(key), "{key} is in the books:\n{books}");
    }
    // The morning reader (no ACME_API_KEY): `show --diff` warns and redacts the shape.
    let show = env.ralph(&["show", "1", "--diff", "--no-pager"]);
    assert!(show.status.success(), "{}", text(&show));
    let shown = text(&show);
    assert!(!shown.contains(SHAPED_KEY), "{shown}");
    assert!(
        shown.contains("warning: this diff adds secret-looking values in config.py"),
        "{shown}"
    );
    assert!(shown.contains("SECRET COMMITTED"), "{shown}");
    // With the key in the environment, it is redacted too.
    let show = env
        .ralph_cmd(&["show", "1", "--diff", "--no-pager"])
        .env("ACME_API_KEY", RUN_KEY)
        .output()
        .unwrap();
    assert!(!text(&show).contains(RUN_KEY), "{}", text(&show));
    let report = env.ralph(&["report", "--markdown"]);
    assert!(!text(&report).contains(SHAPED_KEY), "{}", text(&report));
}

#[test]
fn encoded_and_split_forms_of_a_key_are_redacted_everywhere() {
    let env = TestEnv::new(&prd_with_stories(1));
    let key = "acme+env/key=7f3a9c2e";
    let agent = script_file(
        &env,
        "agent.sh",
        "python3 - <<'PY'\n\
         import base64,os,sys,urllib.parse\n\
         k=os.environ['ACME_API_KEY']\n\
         print('GET /auth?key='+urllib.parse.quote(k, safe=''))\n\
         print('basic '+base64.b64encode(('bot:'+k).encode()).decode())\n\
         print('cookie '+base64.urlsafe_b64encode(('xy'+k).encode()).decode())\n\
         sys.stderr.write('error: invalid key '+k[:9]+'\\n'+k[9:]+' rejected\\n')\n\
         PY\n\
         exit 1\n",
    );
    let out = run_exec(&env, &agent, 1, &[])
        .env("ACME_API_KEY", key)
        .output()
        .unwrap();
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    let log = env.ralph(&["log", "--no-pager"]);
    let places = format!(
        "{}\n{}\n{}\n{}",
        text(&out),
        all_files_but(&env.path(".ralph"), "-none-"),
        env.read("progress.txt"),
        text(&log)
    );
    // The agent did print them (the transcript keeps the lines, redacted).
    assert!(places.contains("GET /auth?key=<redacted>"), "{places}");
    assert!(places.contains("basic "), "{places}");
    use base64::Engine as _;
    let forms = [
        "acme%2Benv%2Fkey%3D7f3a9c2e".to_string(),
        base64::engine::general_purpose::STANDARD.encode(format!("bot:{key}")),
        base64::engine::general_purpose::URL_SAFE.encode(format!("xy{key}")),
        key[..9].to_string(),
        key[9..].to_string(),
    ];
    for form in &forms {
        assert!(!places.contains(form.as_str()), "{form} leaked:\n{places}");
    }
}

/// Two stories with checks; the agent marks both passing. The first check signals that it
/// started and sleeps, so a stop lands while it runs and before the second one's turn.
fn gate_env() -> TestEnv {
    let mut prd = prd_with_stories(2);
    prd["userStories"][0]["verify"] = json!("touch .check-started; sleep 30");
    prd["userStories"][1]["verify"] = json!("true");
    TestEnv::new(&prd)
}

#[test]
fn a_stop_during_the_verify_gate_records_the_checks_as_interrupted() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let env = gate_env();
        env.write(".gitignore", ".check-started\n");
        env.git(&["add", ".gitignore"]);
        env.git(&["commit", "-qm", "ignore the marker"]);
        let agent = script_file(
            &env,
            "agent.sh",
            "echo done > file-1.txt\n\
             python3 - <<'PY'\n\
             import json\n\
             p=json.load(open('prd.json'))\n\
             for s in p['userStories']: s['passes']=True\n\
             open('prd.json','w').write(json.dumps(p,indent=2))\n\
             PY\n",
        );
        let mut child = env.ralph_spawn_with(run_exec(&env, &agent, 1, &[]));
        wait_for(&env, ".check-started", Duration::from_secs(30));
        signal(&child, sig);
        let (code, _) = wait_exit(&env, &mut child, Duration::from_secs(30));
        assert_eq!(code, 130, "{sig}: {}", env.spawned_output());
        let ledger = env.ledger();
        assert_eq!(ledger.len(), 1, "{sig}: {}", env.spawned_output());
        let r = &ledger[0];
        assert_eq!(r["outcome"], "interrupted", "{sig}: {r}");
        let verify = r["verify"]
            .as_array()
            .unwrap_or_else(|| panic!("{sig}: no verify: {r}"));
        assert_eq!(verify.len(), 2, "{sig}: {r}");
        assert_eq!(verify[0]["story_id"], "US-001", "{r}");
        assert_eq!(verify[0]["interrupted"], true, "{r}");
        assert!(
            verify[0]["result"]
                .as_str()
                .unwrap_or("")
                .contains("interrupted"),
            "{r}"
        );
        assert_eq!(verify[1]["story_id"], "US-002", "{r}");
        assert_eq!(verify[1]["interrupted"], true, "{r}");
        assert!(
            verify[1]["result"]
                .as_str()
                .unwrap_or("")
                .contains("not run"),
            "{r}"
        );
        // Neither story passes on a check that did not finish, and `show` says why.
        let prd = env.prd();
        assert_eq!(prd["userStories"][0]["passes"], false);
        assert_eq!(prd["userStories"][1]["passes"], false);
        let show = env.ralph(&["show", "1", "--no-pager"]);
        assert!(
            text(&show).contains("was interrupted by the stop"),
            "{}",
            text(&show)
        );
    }
}

#[test]
fn an_undelivered_notification_is_named_by_the_run_log_and_status() {
    let env = TestEnv::new(&prd_with_stories(1));
    // A port nothing listens on: every attempt is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let hook = format!("http://127.0.0.1:{port}/hook");
    env.write("ralph.toml", "[notify]\nattempts = 1\n");
    env.git(&["add", "ralph.toml"]);
    env.git(&["commit", "-qm", "notify settings"]);
    let agent = script_file(&env, "agent.sh", "echo 'boom' >&2\nexit 1\n");
    let out = run_exec(&env, &agent, 1, &["--notify-webhook", &hook])
        .output()
        .unwrap();
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    let run_id = env.ledger()[0]["run_id"].as_str().unwrap().to_string();
    assert!(
        text(&out).contains("notification to webhook") && text(&out).contains("failed"),
        "no warning in the run's output:\n{}",
        text(&out)
    );
    let log = env.ralph(&["log", "--no-pager"]);
    let log = text(&log);
    assert!(log.contains("notifications not delivered (1"), "{log}");
    assert!(log.contains(&format!("127.0.0.1:{port}")), "{log}");
    let status = text(&env.ralph(&["status"]));
    assert!(
        status.contains(&format!("notifications: 1 not delivered in run {run_id}")),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.ralph(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        json["notifications_failed"].as_array().map(Vec::len),
        Some(1),
        "{json}"
    );
}

#[test]
fn resume_only_with_nothing_to_resume_sends_run_finished_and_the_github_outputs() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [failing_iteration(), failing_iteration()]}));
    let out = env.ralph(&["run", "--max-failures", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let gh_output = env.root.path().join("github_output");
    let out = env
        .ralph_cmd(&["run", "--resume-only", "--json"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &gh_output)
        .env("GITHUB_STEP_SUMMARY", env.root.path().join("summary.md"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.agent_calls(), 1, "the agent ran again: {}", text(&out));
    let finished: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "run_finished")
        .collect();
    assert_eq!(finished.len(), 1, "{}", text(&out));
    let f = &finished[0];
    assert_eq!(f["stop_reason"]["kind"], "nothing_to_resume", "{f}");
    assert!(
        f["stop_reason"]["why"]
            .as_str()
            .unwrap_or("")
            .contains("--max-failures"),
        "{f}"
    );
    assert_eq!(f["exit_code"], 0, "{f}");
    assert_eq!(f["success"], true, "{f}");
    assert_eq!(f["iterations"], 0, "{f}");
    let outputs = std::fs::read_to_string(&gh_output).unwrap_or_default();
    assert!(
        outputs.contains("stop_reason=nothing_to_resume"),
        "{outputs}"
    );
    assert!(outputs.contains("exit_code=0"), "{outputs}");
    // The human output says it once, with the reason.
    let out = env.ralph(&["run", "--resume-only"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("nothing to resume: "), "{said}");
}

#[test]
fn the_morning_reader_sees_no_escape_codes_and_reset_times_with_their_offset() {
    let env = TestEnv::new(&prd_with_stories(1));
    let agent = script_file(
        &env,
        "agent.sh",
        "printf '\\033[1;31merror:\\033[0m the \\033[4mwidget\\033[0m broke\\n' >&2\nexit 1\n",
    );
    let out = run_exec(&env, &agent, 1, &[]).output().unwrap();
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    assert!(
        env.read(".ralph/ledger.jsonl").contains("widget"),
        "the message did not reach the ledger"
    );
    for args in [
        vec!["log", "--no-pager"],
        vec!["show", "1", "--no-pager"],
        vec!["show", "1", "--raw", "--no-pager"],
        vec!["report", "--markdown"],
    ] {
        let shown = text(&env.ralph(&args));
        assert!(
            !shown.contains('\u{1b}'),
            "{args:?} shows escape codes:\n{shown:?}"
        );
        assert!(shown.contains("widget"), "{args:?}: {shown}");
    }
    assert!(env.ralph(&["report"]).status.success());
    let html = env.read(".ralph/report.html");
    assert!(html.contains("widget") && !html.contains("\\u001b") && !html.contains('\u{1b}'));

    // A usage limit the run does not wait for: its reset is said with the offset.
    let env = TestEnv::new(&prd_with_stories(1));
    let resets_at = chrono::Utc::now().timestamp() + 7200;
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your limit", "resets_at": resets_at}},
        {"exit": 1}
    ]]}));
    let out = env.ralph(&["run", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    let offset = regex::Regex::new(r"\d\d:\d\d [+-]\d\d:\d\d").unwrap();
    let said = text(&out);
    let line = said
        .lines()
        .find(|l| l.contains("resets") || l.contains("reset at"))
        .unwrap_or_else(|| panic!("no reset time said:\n{said}"));
    assert!(offset.is_match(line), "no offset in {line:?}");
    let status = text(&env.ralph(&["status"]));
    let line = status
        .lines()
        .find(|l| l.contains("resets at"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(offset.is_match(line), "no offset in {line:?}");
}

#[test]
fn a_plan_that_never_becomes_valid_reads_as_english() {
    let env = TestEnv::new(&prd_with_stories(1));
    let agent = script_file(&env, "plan-agent.sh", "echo 'no JSON here'\n");
    let out = plan_once_with_exec(&env, &agent).output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("asking exec for the PRD"), "{said}");
    assert!(
        said.contains("did not produce a valid PRD in 1 attempt"),
        "{said}"
    );
    assert!(!said.contains("valid the"), "{said}");
}

/// Two stories the same file satisfies; the agent writes it (once) and marks the first open
/// story passing. `verify` is each story's check, or none.
fn already_done_run(verify: Option<&str>) -> (TestEnv, std::process::Output) {
    let mut prd = prd_with_stories(2);
    if let Some(v) = verify {
        prd["userStories"][0]["verify"] = json!(v);
        prd["userStories"][1]["verify"] = json!(v);
    }
    let env = TestEnv::new(&prd);
    let agent = script_file(
        &env,
        "agent.sh",
        "[ -f shared.txt ] || echo both > shared.txt\n\
         python3 - <<'PY'\n\
         import json\n\
         p=json.load(open('prd.json'))\n\
         s=next(s for s in p['userStories'] if not s['passes'])\n\
         s['passes']=True\n\
         open('prd.json','w').write(json.dumps(p,indent=2))\n\
         PY\n",
    );
    let out = run_exec(&env, &agent, 2, &[]).output().unwrap();
    (env, out)
}

#[test]
fn a_story_already_satisfied_passes_on_its_own_check_and_not_without_one() {
    let (env, out) = already_done_run(Some("test -f shared.txt"));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 2, "{}", text(&out));
    assert_eq!(ledger[0]["outcome"], "story_passed", "{}", text(&out));
    assert_eq!(ledger[1]["story_id"], "US-002");
    assert_eq!(ledger[1]["outcome"], "story_passed", "{}", text(&out));
    let message = ledger[1]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("US-002 was already satisfied"),
        "{message}"
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.prd()["userStories"][1]["passes"], true);
    let log = text(&env.ralph(&["log", "--no-pager"]));
    assert!(log.contains("already satisfied"), "{log}");

    // Without a check, the agent's word on a notes-only iteration is still refused.
    let (env, out) = already_done_run(None);
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 2, "{}", text(&out));
    assert_eq!(ledger[1]["story_id"], "US-002");
    assert_eq!(ledger[1]["outcome"], "premature_claim", "{}", text(&out));
    assert_eq!(env.prd()["userStories"][1]["passes"], false);
}
