//! Leftovers of issues 19, 21 and 22 that a user would notice:
//! - `--sandbox`: bubblewrap failing mid-run stops the run as a sandbox (config) failure naming
//!   bubblewrap, not as the agent's error; the `$ …` command line of a sandboxed iteration says
//!   it runs inside bubblewrap; a `ralph.toml` an agent creates where there was none is moved
//!   aside, named in the record's findings and never committed; writes the sandbox refused are
//!   counted in the record;
//! - fallback agents: a failed login uses neither `--max-iter` nor the story's attempt;
//! - ralph.toml's `[[agents]]` and price errors name the file, the table and the field;
//! - `ralph watch` after a run says how the last run ended.

use serde_json::{json, Value};

use crate::common::{prd_with_stories, script_file, text, TestEnv};

/// A `bwrap` on PATH that passes ralph's start-of-run probe (`… -- true`) and then fails as
/// bubblewrap does when it cannot build a sandbox any more: its own `bwrap: …` line, exit 1.
fn breaking_bwrap(env: &TestEnv) {
    let path = env.bin.join("bwrap");
    std::fs::write(
        &path,
        "#!/bin/sh\nfor last; do :; done\n[ \"$last\" = true ] && exit 0\necho 'bwrap: Creating new namespace failed: No space left on device' >&2\nexit 1\n",
    )
    .expect("write bwrap");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
}

#[test]
fn bubblewrap_failing_mid_run_stops_the_run_as_a_sandbox_failure_not_an_agent_error() {
    let env = TestEnv::new(&prd_with_stories(2));
    breaking_bwrap(&env);
    env.script(&json!({"invocations": [[{"claude_result": {"text": "ran"}}]]}));
    let out = env.ralph(&["run", "--max-iter", "3", "--sandbox", "fs", "-v"]);
    let all = text(&out);
    assert_eq!(env.agent_calls(), 0, "the agent ran: {all}");
    assert_eq!(env.outcomes(), vec!["config_error"], "{all}");
    let record = &env.ledger()[0];
    let message = record["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("--sandbox fs: bubblewrap could not start the agent")
            && message.contains("bwrap: Creating new namespace failed"),
        "{message}"
    );
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("bubblewrap could not start the agent"),
        "{all}"
    );
    // The command line shown (`-v`) and kept in the transcript says where it runs.
    assert!(
        all.contains("$ [sandbox fs: runs inside bubblewrap"),
        "{all}"
    );
    let transcript = env.read(record["transcript"].as_str().unwrap_or_default());
    assert!(
        transcript.contains("\"command\":\"[sandbox fs: runs inside bubblewrap"),
        "{transcript}"
    );
}

#[test]
fn a_ralph_toml_the_sandboxed_agent_creates_is_moved_aside_flagged_and_never_committed() {
    if !crate::sandbox::bwrap_or_skip("a_ralph_toml_the_sandboxed_agent_creates_…") {
        return;
    }
    let env = TestEnv::new(&prd_with_stories(1));
    let agent = script_file(
        &env,
        "agent.sh",
        "cat > /dev/null\nprintf 'sandbox = \"off\"\\n' > ralph.toml\necho work > work.txt\n",
    );
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
        "--sandbox",
        "fs",
        "--max-iter",
        "1",
    ]);
    let all = text(&out);
    assert!(!env.path("ralph.toml").exists(), "{all}");
    assert_eq!(
        env.read(".ralph/refused/ralph.toml.1"),
        "sandbox = \"off\"\n",
        "{all}"
    );
    let tracked = env.git(&["ls-tree", "-r", "--name-only", "HEAD"]);
    assert!(
        tracked.contains("work.txt") && !tracked.contains("ralph.toml"),
        "{tracked}"
    );
    let ledger = env.ledger();
    let findings: Vec<&str> = ledger[0]["findings"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        findings
            .iter()
            .any(|f| f.contains("the agent created ralph.toml")
                && f.contains(".ralph/refused/ralph.toml.1")),
        "{findings:?}\n{all}"
    );
    assert!(all.contains("the agent created ralph.toml"), "{all}");
    let files: Vec<&str> = ledger[0]["files_changed"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(!files.contains(&"ralph.toml"), "{files:?}");
}

/// Writes the sandbox refused (the agent's tools say `Read-only file system`) are counted in
/// the iteration's record, with where a path that must be writable goes.
#[test]
fn writes_the_sandbox_refused_are_counted_in_the_record() {
    if !crate::sandbox::bwrap_or_skip("writes_the_sandbox_refused_are_counted_in_the_record") {
        return;
    }
    let env = TestEnv::new(&prd_with_stories(1));
    let agent = script_file(
        &env,
        "agent.sh",
        "cat > /dev/null\ntouch /etc/ralph-denied-x 2>&1\nmkdir /usr/ralph-denied-y 2>&1\necho work > work.txt\n",
    );
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
        "--sandbox",
        "fs",
        "--max-iter",
        "1",
    ]);
    let all = text(&out);
    assert!(!std::path::Path::new("/etc/ralph-denied-x").exists());
    let findings = env.ledger()[0]["findings"].clone();
    assert!(
        findings.as_array().into_iter().flatten().any(|f| f
            .as_str()
            .is_some_and(|f| f.starts_with("the sandbox refused writes: 2 lines"))),
        "{findings}\n{all}"
    );
    assert!(all.contains("the sandbox refused writes: 2 lines"), "{all}");
    let show = env.ralph(&["show", "1"]);
    assert!(
        text(&show).contains("the sandbox refused writes"),
        "{}",
        text(&show)
    );
}

#[test]
fn a_failed_login_on_a_fallback_run_spends_neither_max_iter_nor_the_attempt() {
    use crate::fallback::{codex_story, env_with, pairs, sequence};
    let env = env_with(1, "");
    env.script(&json!({"invocations": [
        crate::fallback::claude_login_failure(),
        codex_story("US-001", 0),
    ]}));
    let out = env.ralph(&[
        "run",
        "--fallback-agent",
        "codex",
        "--max-iter",
        "1",
        "--max-attempts",
        "1",
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(
        sequence(&env),
        pairs(&[("claude", "auth_error"), ("codex", "story_passed")]),
        "{all}"
    );
    assert_eq!(env.state()["attempts"]["US-001"], json!(1), "{all}");
    assert_eq!(env.state()["blocked"], json!([]), "{all}");
}

/// `ralph watch` counts a usage-limit wait down to the moment the run itself waits for (the
/// reset plus `usage_limit_margin`), not to the bare reset: the two used to differ by the margin.
#[test]
fn watch_counts_a_usage_limit_wait_down_to_the_runs_own_end_of_the_wait() {
    use std::time::{Duration, Instant};
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "usage_limit_margin = \"40s\"\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    // The reset is counted from when the fake plays the limit, so it is at least 5 s after now.
    let earliest_reset = chrono::Utc::now().timestamp() + 5;
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 5}},
        {"exit": 1}
    ]]}));
    let mut child = env.ralph_spawn(&["run", "--json"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let until = loop {
        let out = env.spawned_output();
        let waiting = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "waiting");
        if let Some(e) = waiting {
            let at = e["until"].as_str().expect("until");
            break chrono::DateTime::parse_from_rfc3339(at).expect("rfc3339");
        }
        assert!(Instant::now() < deadline, "no wait:\n{out}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The run's terminal says it waits past the reset by the margin.
    assert!(until.timestamp() >= earliest_reset + 39, "until {until}");
    let shown = String::from_utf8_lossy(&env.ralph(&["watch"]).stdout).into_owned();
    let left = (until.timestamp() - chrono::Utc::now().timestamp()).max(0);
    let countdown = shown
        .split("usage limit: waits ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no countdown in:\n{shown}"));
    let (m, sec) = countdown.split_once(':').expect("M:SS");
    let shown_left: i64 =
        m.parse::<i64>().expect("minutes") * 60 + sec.parse::<i64>().expect("seconds");
    assert!(
        (shown_left - left).abs() <= 3,
        "watch shows {countdown}, the run waits {left}s more:\n{shown}"
    );
    assert!(
        shown.contains(&format!("(until {} UTC)", until.format("%H:%M"))),
        "{shown}"
    );
    let stop = env.ralph(&["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let (code, _) = crate::common::wait_exit(&env, &mut child, Duration::from_secs(30));
    assert_ne!(code, -1, "{}", env.spawned_output());
    assert!(env.state().get("wait_until").is_none(), "{}", env.state());
    // After the run: the header says how it ended, not that a run is stopping.
    let shown = String::from_utf8_lossy(&env.ralph(&["watch"]).stdout).into_owned();
    let header = shown.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("ralph watch · last run ended ")
            && header.contains("UTC: stop requested"),
        "{shown}"
    );
    assert!(!header.contains("stopping"), "{shown}");
}

/// ralph.toml's `[[agents]]` and price mistakes read as sentences naming the file, the table and
/// the field, with a fix that points at that table (never at the primary agent's flags).
#[test]
fn agents_table_and_price_mistakes_name_the_file_the_table_and_the_field() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "a typo in an [[agents]] table",
            "[[agents]]\nname = \"cx\"\nagent = \"codex\"\nagent_cmdd = \"x\"\n",
            &["unknown key `agent_cmdd` in [[agents]] (name = \"cx\"): did you mean `agent_cmd`?"],
        ),
        (
            "a run-wide key in an [[agents]] table",
            "[[agents]]\nname = \"cx\"\nagent = \"codex\"\nmax_iter = 3\n",
            &["`max_iter` is a run-wide setting, not an agent's: put it above the first [[agents]] table", "an [[agents]] table takes name, agent, agent_cmd"],
        ),
        (
            "a price given as a number",
            "[prices]\n\"gpt-5\" = -1\n",
            &["in [prices]: a model's price is a table of USD per million tokens, not a single value", "line 2"],
        ),
        (
            "a negative price in an [[agents]] table",
            "[[agents]]\nname = \"cx\"\nagent = \"codex\"\n[agents.prices.\"gpt-5\"]\ninput = 1\noutput = -3\n",
            &["the prices of the [[agents]] table `cx`: the price of `gpt-5` has `output = -3`: a price is USD per million tokens, 0 or more"],
        ),
        (
            "two tables with one name",
            "[[agents]]\nname = \"a\"\nagent = \"codex\"\n[[agents]]\nname = \"b\"\nagent = \"gemini\"\n[[agents]]\nname = \"a\"\nagent = \"opencode\"\n",
            &["two [[agents]] tables in ", "ralph.toml are named `a`: the 1st and the 3rd"],
        ),
        (
            "a table named like the primary agent",
            "[[agents]]\nname = \"claude\"\nmodel = \"opus\"\n",
            &["the [[agents]] table `claude` in ", "ralph.toml has the primary agent's name", "rename the table"],
        ),
        (
            "an exec table without its command",
            "[[agents]]\nname = \"ex\"\nagent = \"exec\"\n",
            &["`agent = \"exec\"` in the [[agents]] table `ex` of ", "hint: set agent_cmd = \"my-agent --flag\" in the [[agents]] table `ex`"],
        ),
    ];
    for (what, toml, needles) in cases {
        let env = TestEnv::new(&prd_with_stories(1));
        env.write("ralph.toml", toml);
        env.git(&["add", "-A"]);
        env.git(&["commit", "-qm", "config"]);
        let out = env.ralph(&["run", "--max-iter", "1"]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {all}");
        let path = env.path("ralph.toml").display().to_string();
        assert!(all.contains(&path), "{what}: the file is not named:\n{all}");
        for needle in *needles {
            assert!(
                all.contains(needle),
                "{what}: missing {needle:?} in:\n{all}"
            );
        }
        for wrong in [
            "expected struct",
            "--agent-cmd",
            "--agent-program",
            "is empty or used twice",
        ] {
            assert!(!all.contains(wrong), "{what}: says {wrong:?}:\n{all}");
        }
        assert_eq!(env.agent_calls(), 0, "{what}: the agent ran");
    }
}
