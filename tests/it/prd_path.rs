//! Engineer h6's part of issue 18, end to end: the PRD path (`ralph plan` keeps `verify` and
//! `dependsOn`, the linter and the run say which stories are taken on the agent's word) and
//! the agent lines that were misread (claude's plain-text limit sentence in stream-json mode,
//! gemini's session turn limit before a `success` result).

use serde_json::{json, Value};

use crate::common::{
    claude_clock_in, fake_agent_bin, native_flags, prd_with_stories, text, TestEnv,
};

/// claude prints its limit sentence as a plain line on stdout in stream-json mode, instead of
/// the JSON lines or among them, then exits 1: the run reads a usage limit with its reset time
/// (exit 75 with --no-wait, the reset in state.json), not "exited with code 1 and gave no error
/// message", and no attempt is spent.
#[test]
fn claude_plain_text_limit_line_is_a_usage_limit_with_its_reset() {
    for (script, reset_within_h) in [
        // Instead of the JSON lines: the 5-hour wording with a relative reset.
        (
            json!([{"stdout": "5-hour limit reached \u{2219} resets in 2h 30m"}, {"exit": 1}]),
            (2, 3),
        ),
        // Among them: the extra-usage wording with a clock time.
        (
            json!([{"claude_init": {}}, {"stdout": format!("You're out of extra usage \u{00b7} resets {}", claude_clock_in(3))}, {"exit": 1}]),
            (0, 25),
        ),
        // The weekly wording with a day and a time.
        (
            json!([{"claude_init": {}}, {"stdout": "Weekly limit reached \u{2219} resets Mon 5am"}, {"exit": 1}]),
            (0, 24 * 8),
        ),
    ] {
        let env = TestEnv::new(&prd_with_stories(1));
        env.script(&json!({ "invocations": [script] }));
        let out = env.ralph(&["run", "--no-wait"]);
        assert_eq!(out.status.code(), Some(75), "{script}: {}", text(&out));
        assert_eq!(env.outcomes(), ["usage_limit"], "{script}");
        let record = &env.ledger()[0];
        let message = record["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("gave no error message") && message.contains("reset"),
            "{script}: {message}"
        );
        let state = env.state();
        let at = chrono::DateTime::parse_from_rfc3339(
            state["resume_at"]
                .as_str()
                .unwrap_or_else(|| panic!("{script}: no resume_at in {state}")),
        )
        .unwrap()
        .with_timezone(&chrono::Utc);
        let hours = (at - chrono::Utc::now()).num_minutes() as f64 / 60.0;
        let (lo, hi) = reset_within_h;
        assert!(
            hours >= f64::from(lo) - 0.1 && hours <= f64::from(hi) + 0.1,
            "{script}: resets in {hours} h"
        );
        assert_eq!(
            state["attempts"]["US-001"].as_u64().unwrap_or(0),
            0,
            "{state}"
        );
    }
}

/// gemini stops the agent at its `maxSessionTurns` with an `error` event, then prints a
/// `success` result and exits 0. The iteration failed (agent_error) and its reason names the
/// turn limit, not "changed nothing".
#[test]
fn gemini_session_turn_limit_fails_the_iteration_and_says_so() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"gemini": {"init": {"session_id": "s-1"}}},
        {"gemini": {"text": "Let me look at the files first."}},
        {"gemini": {"error": {"message": "Maximum session turns exceeded", "severity": "error"}}},
        {"gemini": {"result": {}}}
    ]]}));
    let out = env.ralph(&[
        "run",
        "--agent",
        "gemini",
        "--agent-program",
        fake_agent_bin(),
        "--max-iter",
        "1",
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.outcomes(), ["agent_error"], "{}", text(&out));
    let message = env.ledger()[0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("session turn limit")
            && message.contains("Maximum session turns exceeded"),
        "{message}"
    );
    assert!(!message.contains("changed nothing"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// The PRD path: plan → convert → validate keeps each story's check.

fn plan_cmd(
    env: &TestEnv,
    llm: &crate::support_llm::ScriptedLlm,
    description: &str,
) -> std::process::Command {
    let flags = native_flags(&llm.base_url(), "PLAN_TEST_KEY");
    let mut args = vec!["plan", description];
    args.extend(flags.iter().map(String::as_str));
    let mut cmd = env.ralph_cmd(&args);
    cmd.env("PLAN_TEST_KEY", crate::support_llm::SCRIPTED_API_KEY)
        .stdin(std::process::Stdio::null());
    cmd
}

/// `ralph plan` keeps the `verify` and `dependsOn` the agent planned: they are in the Markdown
/// PRD (`**Depends on:**`, `**Verify:**`), `ralph convert` carries them into prd.json without a
/// model, and `ralph validate --strict` accepts the result. The prompt asked for them.
#[test]
fn plan_keeps_verify_and_depends_on_through_convert_and_strict_validate() {
    let doc = json!({
        "title": "Reverse flag",
        "introduction": "Add a --reverse flag to textkit.",
        "goals": ["Reverse output with one flag"],
        "userStories": [
            {"title": "Add a reverse helper",
             "description": "As a developer, I want `textkit.reverse(text)` so that the CLI can use it.",
             "acceptanceCriteria": ["`reverse(\"abc\")` returns `\"cba\"`", "Tests pass"],
             "dependsOn": [],
             "verify": "python3 -m unittest discover -s tests -q"},
            {"title": "Wire the --reverse flag",
             "description": "As a user, I want `--reverse` so that the output comes out reversed.",
             "acceptanceCriteria": ["`textkit --reverse abc` prints `cba`"],
             "dependsOn": ["US-1"],
             "verify": "python3 -m textkit --reverse abc | grep -qx cba"}
        ],
        "functionalRequirements": [], "nonGoals": [], "assumptions": [], "openQuestions": []
    });
    let llm = crate::support_llm::ScriptedLlm::sequence(
        ralph::protocol::ProviderKind::Openai,
        vec![crate::support_llm::ScriptedReply::text(doc.to_string())],
    );
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(
        "README.md",
        "Run the tests: `python3 -m unittest discover -s tests -q`\n",
    );
    let out = plan_cmd(&env, &llm, "add a --reverse flag")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let prompt = llm.requests()[0].last_user_text();
    assert!(
        prompt.contains("set its `verify` to `python3 -m unittest discover -s tests -q`"),
        "{prompt}"
    );
    let md = env.read("tasks/prd-reverse-flag.md");
    assert!(
        md.contains("- [ ] Tests pass\n\n**Verify:** `python3 -m unittest discover -s tests -q`\n"),
        "{md}"
    );
    assert!(
        md.contains(
            "\n**Depends on:** US-001\n**Verify:** `python3 -m textkit --reverse abc | grep -qx cba`\n"
        ),
        "{md}"
    );
    let conv = env.ralph(&[
        "convert",
        "tasks/prd-reverse-flag.md",
        "--out",
        "next/prd.json",
    ]);
    assert!(conv.status.success(), "{}", text(&conv));
    let prd: Value = serde_json::from_str(&env.read("next/prd.json")).unwrap();
    let stories = prd["userStories"].as_array().unwrap();
    assert_eq!(
        stories[0]["verify"],
        "python3 -m unittest discover -s tests -q"
    );
    assert_eq!(stories[1]["dependsOn"], json!(["US-001"]));
    assert_eq!(
        stories[1]["verify"],
        "python3 -m textkit --reverse abc | grep -qx cba"
    );
    let validate = env.ralph(&["validate", "--strict", "next/prd.json"]);
    assert!(validate.status.success(), "{}", text(&validate));
}

/// A planned dependency on a later story (or on no story) goes back to the agent; the next
/// draft, without it, is the one written.
#[test]
fn plan_feeds_back_a_dependency_on_a_later_story() {
    let bad = json!({
        "title": "Reverse flag", "introduction": "i", "goals": ["g"],
        "userStories": [
            {"title": "A", "description": "As a user, I want a.", "acceptanceCriteria": ["`a()` returns 1"],
             "dependsOn": ["US-002"], "verify": "true"},
            {"title": "B", "description": "As a user, I want b.", "acceptanceCriteria": ["`b()` returns 2"]}
        ],
        "functionalRequirements": [], "nonGoals": [], "assumptions": [], "openQuestions": []
    });
    let mut good = bad.clone();
    good["userStories"][0]["dependsOn"] = json!([]);
    let llm = crate::support_llm::ScriptedLlm::sequence(
        ralph::protocol::ProviderKind::Openai,
        vec![
            crate::support_llm::ScriptedReply::text(bad.to_string()),
            crate::support_llm::ScriptedReply::text(good.to_string()),
        ],
    );
    let env = TestEnv::new(&prd_with_stories(1));
    let out = plan_cmd(&env, &llm, "a and b").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the bad draft was fed back once");
    let feedback = reqs[1].last_user_text();
    assert!(
        feedback.contains("$.userStories[0].dependsOn[0]: \"US-002\" is not an earlier story"),
        "{feedback}"
    );
    assert!(!env.read("tasks/prd-reverse-flag.md").contains("Depends on"));
}

/// A story with no `verify` and criteria that only the agent's word can confirm is a lint
/// finding: `validate --strict` fails naming it. A criterion that names an output, or a verify
/// command, clears it.
#[test]
fn a_story_that_only_the_agents_word_can_confirm_fails_strict_validation() {
    let mut prd = prd_with_stories(2);
    prd["userStories"][1]["acceptanceCriteria"] = json!([
        "Users can export their notes",
        "The export feature is implemented"
    ]);
    let env = TestEnv::new(&prd);
    let out = env.ralph(&["validate", "--strict"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("$.userStories[1]: US-002 has no `verify` command and no acceptance criterion that names something to check")
            && all.contains("[no-checkable-criterion]"),
        "{all}"
    );
    // The other story names a file: checkable, no finding.
    assert!(!all.contains("$.userStories[0]:"), "{all}");
    prd["userStories"][1]["verify"] = json!("test -f notes.md");
    env.write("prd.json", &serde_json::to_string_pretty(&prd).unwrap());
    let out = env.ralph(&["validate", "--strict"]);
    assert!(out.status.success(), "{}", text(&out));
}

// ---------------------------------------------------------------------------------------------
// The run says which stories it takes on the agent's word.

fn claude_pass(id: &str, n: usize) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": format!("file-{n}.txt"), "content": format!("story {n}\n")}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"claude_result": {"text": "done", "is_error": false, "cost_usd": 0.01}}
    ])
}

/// At start, `ralph run` says how many open stories have no check and names them; the summary
/// lists the stories that passed with no check as a caveat (terminal and `--json`). A story
/// with its own `verify` is not among them, and `--verify` covers every story.
#[test]
fn the_run_names_the_stories_it_takes_on_the_agents_word() {
    let mut prd = prd_with_stories(3);
    prd["userStories"][1]["verify"] = json!("test -f file-2.txt");
    let env = TestEnv::new(&prd);
    env.script(&json!({"invocations": [
        claude_pass("US-001", 1), claude_pass("US-002", 2), claude_pass("US-003", 3)
    ]}));
    let out = env.ralph(&["run", "--max-iter", "3", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "2 of 3 open stories have no `verify` command (US-001, US-003): ralph will take their \
             pass on the agent's word"
        ),
        "{stderr}"
    );
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let warned = events.iter().any(|e| {
        e["event"] == "warning"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("2 of 3 open stories have no `verify` command"))
    });
    assert!(warned, "{events:?}");
    let finished = events
        .iter()
        .find(|e| e["event"] == "run_finished")
        .expect("run_finished");
    // The summary's fields sit in the event, beside `event` and `at`.
    let caveats = finished.to_string();
    assert!(
        caveats.contains(
            "taken on the agent's word: US-001, US-003 are passing with no `verify` command to check them"
        ),
        "{finished}"
    );

    // With --verify, every story has a check: no warning, no caveat.
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [claude_pass("US-001", 1)]}));
    let out = env.ralph(&["run", "--max-iter", "1", "--verify", "test -f file-1.txt"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("agent's word"), "{}", text(&out));
}

// ---------------------------------------------------------------------------------------------
// The local model's prompt is repeatable.

/// The first two requests `ralph run --agent local` sends for one story, from a repository at
/// a fresh temporary path: the scripted model first calls `mark_story` (whose check fails,
/// naming a file by its absolute path), then gives up with a final answer.
fn local_requests(prd: &Value) -> Vec<crate::support_llm::RecordedRequest> {
    use crate::support_llm::ScriptedReply;
    let env = TestEnv::new(prd);
    let mark = json!({"name": "mark_story", "arguments": {"id": "US-001", "passes": true}});
    let mut replies = vec![ScriptedReply::text(mark.to_string())];
    replies.extend(vec![ScriptedReply::text("I stop here.").stop("stop"); 6]);
    let llm =
        crate::support_llm::ScriptedLlm::sequence(ralph::protocol::ProviderKind::Openai, replies);
    let out = env
        .ralph_cmd(&[
            "run",
            "--agent",
            "local",
            "--base-url",
            &llm.base_url(),
            "--max-iter",
            "1",
        ])
        .output()
        .unwrap();
    let requests = llm.requests();
    assert!(
        requests.len() >= 2,
        "{} requests: {}",
        requests.len(),
        text(&out)
    );
    let repo = std::fs::canonicalize(&env.repo).unwrap();
    for req in &requests[..2] {
        assert!(
            !req.body_text().contains(&repo.display().to_string())
                && !req.body_text().contains(&env.repo.display().to_string()),
            "request {} holds the repository's path {}: {}",
            req.n,
            repo.display(),
            req.body_text()
        );
    }
    requests
}

/// The same story gets the same request bytes (system prompt, compact prompt, tools, sampling,
/// and a tool result that named a file by its absolute path) wherever its repository lies: the
/// local model, at temperature 0 with a fixed seed, is asked the same thing on every run, so
/// its end-to-end test is repeatable.
#[test]
fn the_local_prompt_is_the_same_bytes_for_the_same_story_in_any_directory() {
    let mut prd = prd_with_stories(1);
    // The check fails naming the missing file by its absolute path, as a traceback does.
    prd["userStories"][0]["verify"] = json!("echo \"no such file: $PWD/file-1.txt\"; exit 1");
    let a = local_requests(&prd);
    let b = local_requests(&prd);
    assert_eq!(a[0].body, b[0].body);
    assert_eq!(a[1].body, b[1].body);
    let prompt = a[0].user_texts().join("\n");
    assert!(
        prompt.contains(
            "The repository root is the current directory: every path is relative to it."
        ),
        "{prompt}"
    );
    assert!(
        a[1].body_text().contains("no such file: file-1.txt"),
        "{}",
        a[1].body_text()
    );
}

// ---------------------------------------------------------------------------------------------
// GitHub outputs no other test asserts.

/// `$GITHUB_OUTPUT`'s `open_stories`, `blocked` and `run_id` (the other keys have their tests in
/// integrations.rs, run_cases.rs and scale_out.rs): a run where US-001 is blocked after one
/// failed attempt, US-002 passes and US-003 is left open by --max-iter.
#[test]
fn github_outputs_name_the_open_and_blocked_stories_and_the_run() {
    let env = TestEnv::new(&prd_with_stories(3));
    env.script(&json!({"invocations": [
        [{"claude_init": {}}, {"stderr": "something broke"}, {"exit": 1}],
        claude_pass("US-002", 2)
    ]}));
    let outputs = env.root.path().join("github-output");
    let out = env
        .ralph_cmd(&["run", "--max-iter", "2", "--max-attempts", "1"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &outputs)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(env.outcomes(), ["agent_error", "story_passed"]);
    let written = std::fs::read_to_string(&outputs).unwrap();
    let value = |key: &str| -> String {
        written
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.to_owned())
            .next_back()
            .unwrap_or_else(|| panic!("no {key}= in {written}"))
    };
    assert_eq!(value("open_stories"), "US-001,US-003", "{written}");
    assert_eq!(value("blocked"), "US-001", "{written}");
    let run_id = env.ledger()[0]["run_id"].as_str().unwrap().to_owned();
    assert!(!run_id.is_empty());
    assert_eq!(value("run_id"), run_id, "{written}");
}

// ---------------------------------------------------------------------------------------------
// The suite: real-CLI tests never run online under CI.

/// Under CI=true a real-CLI test that cannot cut the network fails, naming the fix, instead of
/// running online with a note on stderr; outside CI it may run online (with the note); where
/// `unshare` works it is always isolated. And this machine's own answer, under CI, is isolation
/// or that failure: never online.
#[test]
fn real_cli_tests_under_ci_fail_when_they_cannot_cut_the_network() {
    use crate::support_model::{isolation, netns_flag};
    assert_eq!(isolation(Some("-n"), true), Ok(Some("-n")));
    assert_eq!(isolation(Some("-rn"), false), Ok(Some("-rn")));
    assert_eq!(isolation(None, false), Ok(None));
    let why = isolation(None, true).unwrap_err();
    assert!(
        why.contains("must run without network under CI=true")
            && why.contains("scripts/install-test-deps.sh"),
        "{why}"
    );
    assert_ne!(isolation(netns_flag(), true), Ok(None));
}

/// scripts/test.sh installs what the suite runs (man-db for the man page test, util-linux and
/// iproute2 for the network namespace) before anything else, and the installer knows each
/// program's package.
#[test]
fn test_sh_installs_the_system_programs_the_suite_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let test_sh = std::fs::read_to_string(root.join("scripts/test.sh")).unwrap();
    let deps = test_sh
        .find("./scripts/install-test-deps.sh")
        .expect("test.sh runs scripts/install-test-deps.sh");
    let first_install = test_sh.find("./scripts/install-claude.sh").unwrap();
    assert!(deps < first_install, "install-test-deps.sh runs first");
    let script = std::fs::read_to_string(root.join("scripts/install-test-deps.sh")).unwrap();
    for pair in [
        "\"man:man-db\"",
        "\"unshare:util-linux\"",
        "\"ip:iproute2\"",
        "\"script:bsdutils\"",
    ] {
        assert!(script.contains(pair), "install-test-deps.sh lacks {pair}");
    }
    // It runs here: everything is present (or gets installed) and it says so.
    let out = std::process::Command::new(root.join("scripts/install-test-deps.sh"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for program in ["man", "unshare", "script"] {
        assert!(
            which::which(program).is_ok(),
            "{program} missing after the install"
        );
    }
}
