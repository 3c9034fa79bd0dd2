//! What a person reads after a `--parallel` run, from a hand-written history (no agent runs):
//! three iterations that overlapped in time on three workers, landed by fast-forward, by merge
//! and not at all (a conflict, its work kept under a salvage ref), then a retry of the
//! conflicting story whose landing was undone; a story in flight on a worker; a chain of
//! stories waiting on the blocked one. `ralph log`, `show`, `report --markdown` and `status`
//! are snapshot-tested; the HTML report is checked for one lane per worker.

use serde_json::{json, Value};

use crate::common::{text, TestEnv};

const RUN: &str = "20261202T010000-0d0d";
const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SHA_C: &str = "cccccccccccccccccccccccccccccccccccccccc";

fn story(i: usize, title: &str, passes: bool, depends_on: &[&str]) -> Value {
    json!({
        "id": format!("US-{i:03}"),
        "title": title,
        "description": format!("As a user I want {title}"),
        "acceptanceCriteria": ["it works"],
        "priority": i,
        "passes": passes,
        "notes": "",
        "dependsOn": depends_on,
    })
}

/// One ledger line of the run: `overrides` on top of a plain record.
fn record(
    iteration: u32,
    story: &str,
    outcome: &str,
    (start, end): (&str, &str),
    overrides: Value,
) -> Value {
    let started: chrono::DateTime<chrono::Utc> = start.parse().unwrap();
    let ended: chrono::DateTime<chrono::Utc> = end.parse().unwrap();
    let mut r = json!({
        "run_id": RUN, "iteration": iteration, "story_id": story,
        "story_title": format!("Title of {story}"), "backend": "claude",
        "started_at": start, "ended_at": end,
        "duration_s": (ended - started).num_milliseconds() as f64 / 1000.0,
        "outcome": outcome, "exit_code": 0, "signal": null,
        "tokens_in": 1000, "tokens_out": 200, "cost_usd": 0.25, "cost_source": "agent",
        "commits": [], "files_changed": ["src/app.py"], "promise_seen": false,
        "passes_flipped": [], "passes_reverted": [], "message": null, "verify": [],
        "findings": [], "lost_commits": [], "feature": "ralph/par",
        "worktree": format!(".ralph/worktrees/{RUN}/{story}"),
    });
    for (k, v) in overrides.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

/// The repository with the hand-written books (see the module docs).
fn history() -> TestEnv {
    let prd = json!({
        "project": "Par", "branchName": "ralph/par", "description": "parallel views",
        "userStories": [
            story(1, "Parse input", true, &[]),
            story(2, "Format output", true, &[]),
            story(3, "Add a CLI flag", false, &[]),
            story(4, "Document the flag", false, &["US-003"]),
            story(5, "Release notes", false, &["US-004"]),
            story(6, "Colour output", false, &[]),
        ]
    });
    let env = TestEnv::new(&prd);
    env.git(&["checkout", "-q", "-b", "ralph/par"]);
    // In landing order: #1 (ff), #3 (conflict), #2 (merge), #4 (reverted).
    let ledger = [
        record(
            1,
            "US-001",
            "story_passed",
            ("2026-12-02T01:00:00Z", "2026-12-02T01:05:00Z"),
            json!({
            "worker": 1, "commits": [SHA_A], "passes_flipped": ["US-001"],
            "landing": {"kind": "fast_forward", "onto": SHA_A.replace('a', "0"), "commit": SHA_A}}),
        ),
        record(
            3,
            "US-003",
            "conflict",
            ("2026-12-02T01:00:04Z", "2026-12-02T01:06:00Z"),
            json!({
            "worker": 3, "message": "US-003's work conflicts with what landed meanwhile (src/app.py); it runs again from the new tip",
            "landing": {"kind": "conflict", "onto": SHA_A,
                "salvage_ref": format!("refs/ralph/salvage/{RUN}/US-003"),
                "files": ["src/app.py"], "landed_since": ["US-001"],
                "message": "both sides changed parse() in src/app.py"}}),
        ),
        record(
            2,
            "US-002",
            "story_passed",
            ("2026-12-02T01:00:02Z", "2026-12-02T01:07:00Z"),
            json!({
            "worker": 2, "commits": [SHA_B], "passes_flipped": ["US-002"],
            "landing": {"kind": "merge", "onto": SHA_A, "commit": SHA_B, "landed_since": ["US-001"]}}),
        ),
        record(
            4,
            "US-003",
            "verify_failed",
            ("2026-12-02T01:06:10Z", "2026-12-02T01:09:00Z"),
            json!({
            "worker": 3, "commits": [SHA_C],
            "message": "US-003's check failed with US-002 present; the landing was undone",
            "verify": [{"story_id": "US-003", "command": "pytest -q", "passed": false,
                "result": "exited with code 1", "output_tail": "1 failed, 4 passed"}],
            "landing": {"kind": "reverted", "onto": SHA_B,
                "salvage_ref": format!("refs/ralph/salvage/{RUN}/US-003-2"),
                "landed_since": ["US-002"],
                "message": "pytest -q failed once US-002 was present"}}),
        ),
    ];
    let lines: String = ledger.iter().map(|r| format!("{r}\n")).collect();
    env.write(".ralph/ledger.jsonl", &lines);
    env.write(".ralph/.gitignore", "*\n");
    let state = json!({
        "version": 1, "run_id": RUN, "iteration": 5,
        "attempts": {"US-001": 1, "US-002": 1, "US-003": 2},
        "blocked": ["US-003"], "last_outcome": "verify_failed", "in_flight": null,
        "flights": [{
            "run_id": RUN, "iteration": 5, "story_id": "US-006", "pid": 0,
            "started_at": "2026-12-02T01:09:10.000Z", "start_sha": SHA_B,
            "worktree": {"worker": 1,
                "root": env.repo.join(format!(".ralph/worktrees/{RUN}/US-006")), "base": SHA_B}
        }],
        "resume_at": null, "feature": "ralph/par", "stop_reason": null,
    });
    env.write(
        ".ralph/state.json",
        &serde_json::to_string_pretty(&state).unwrap(),
    );
    env
}

fn stdout(env: &TestEnv, args: &[&str]) -> String {
    let out = env.ralph(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn log_show_and_report_read_overlapping_iterations_with_their_landings() {
    let env = history();
    let log = stdout(&env, &["log", "--no-pager"]);
    insta::assert_snapshot!("parallel_log", log);
    // The salvage refs in full: what a person types to get the work back.
    for r in ["US-003", "US-003-2"] {
        assert!(
            log.contains(&format!("refs/ralph/salvage/{RUN}/{r}\n"))
                || log.contains(&format!("refs/ralph/salvage/{RUN}/{r} ")),
            "{log}"
        );
    }
    insta::assert_snapshot!(
        "parallel_show_conflict",
        stdout(&env, &["show", "3", "--no-pager"])
    );
    insta::assert_snapshot!(
        "parallel_show_merge",
        stdout(&env, &["show", "2", "--no-pager"])
    );
    insta::assert_snapshot!(
        "parallel_report_markdown",
        stdout(&env, &["report", "--markdown"])
    );
}

#[test]
fn the_html_report_has_one_lane_per_worker_with_the_overlapping_iterations() {
    let env = history();
    let printed = stdout(&env, &["report", "--out", "report.html"]);
    assert!(printed.trim_end().ends_with("report.html"), "{printed}");
    let html = env.read("report.html").replace("&#x2f;", "/");
    let lanes: Vec<&str> = html
        .match_indices("data-lane=\"")
        .map(|(i, _)| &html[i + 11..i + 13])
        .collect();
    assert_eq!(lanes, ["w1", "w2", "w3"], "one lane per worker");
    // Worker 3's lane holds its two iterations, in time, with their landings.
    let w3 = &html[html.find("data-lane=\"w3\"").unwrap()..];
    let w3 = &w3[..w3.find("</div></div>").unwrap()];
    let i3 = w3.find("data-iteration=\"3\"").expect("#3 in w3's lane");
    let i4 = w3.find("data-iteration=\"4\"").expect("#4 in w3's lane");
    assert!(i3 < i4, "{w3}");
    assert!(
        w3.contains(&format!(
            "data-landing=\"conflict → refs/ralph/salvage/{RUN}/US-003\""
        )),
        "{w3}"
    );
    assert!(w3.contains("landing-reverted"), "{w3}");
    // The card says where the work went, in full.
    assert!(html.contains(&format!("conflict on src/app.py onto aaaaaaaa, work kept at refs/ralph/salvage/{RUN}/US-003 (landed meanwhile: US-001): both sides changed parse() in src/app.py")), "card of #3");
    assert!(html.contains(
        "<span class=\"pill worker\" title=\"the worker that ran it (--parallel)\">w2</span>"
    ));
}

/// The story in flight on its worker, and the chain of stories held up by the blocked one.
#[test]
fn status_lists_the_stories_in_flight_and_what_waits_for_a_blocked_story() {
    let env = history();
    // No ralph holds the lock: the flight was cut short.
    let interrupted = stdout(&env, &["status"]);
    // A live ralph (this test's process) holds it: the flight is running.
    env.write(
        ".ralph/lock",
        &json!({"pid": std::process::id(), "host": "testhost", "started_at": "2026-12-02T01:00:00.000Z"}).to_string(),
    );
    let running = stdout(&env, &["status"]);
    // The elapsed time depends on the clock: shown as <elapsed>, with the padding before it
    // (its width changes with the elapsed time's: `9h59m`, `10h00m`).
    let elapsed = regex::Regex::new(r"(#5 +US-006 +w1) +\S+").unwrap();
    let pid = regex::Regex::new(r"ralph pid \d+").unwrap();
    let repo = env.repo.display().to_string();
    let normal = |s: &str| {
        pid.replace_all(
            &elapsed.replace_all(s, "${1}    <elapsed>"),
            "ralph pid <pid>",
        )
        .replace(&repo, "<repo>")
    };
    insta::assert_snapshot!("parallel_status_interrupted", normal(&interrupted));
    insta::assert_snapshot!("parallel_status_running", normal(&running));
    let json: Value = serde_json::from_str(&stdout(&env, &["status", "--json"])).unwrap();
    let flight = &json["flights"][0];
    assert_eq!(flight["iteration"], 5, "{json}");
    assert_eq!(flight["story_id"], "US-006");
    assert_eq!(flight["worker"], 1);
    assert_eq!(flight["worktree"], format!(".ralph/worktrees/{RUN}/US-006"));
    assert_eq!(flight["running"], true);
    assert!(flight["elapsed_s"].as_u64().unwrap() > 0);
}
