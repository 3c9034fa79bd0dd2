//! End-to-end runs of the real Claude Code CLI (pinned by `scripts/install-claude.sh`) against
//! `ralph-scripted-model`, offline: first the CLI alone, as ralph invokes it, then `ralph run`
//! over the textkit example. Harness: `testing/README-model.md`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support_model::{
    claude_bin_or_skip, example_dir, git, hermetic_env, init_repo_from_example, isolated,
    read_jsonl, run_with_deadline, with_scripted_model, RunOutput,
};

/// Generous: a scripted iteration takes about 2 s, but CI machines are slow and shared.
const DEADLINE: Duration = Duration::from_secs(600);

/// A fresh copy of the textkit example as a git repository, plus a sandbox for HOME/TMPDIR.
pub(crate) struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    pub(crate) repo: PathBuf,
    sandbox: PathBuf,
}

impl Fixture {
    pub(crate) fn textkit() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let repo = root.join("textkit");
        let sandbox = root.join("sandbox");
        init_repo_from_example(&example_dir("textkit"), &repo, &sandbox);
        Fixture {
            _tmp: tmp,
            root,
            repo,
            sandbox,
        }
    }

    fn git(&self, args: &[&str]) -> String {
        git(&self.repo, &self.sandbox, args)
    }

    /// Runs `cmd` (cwd = the repo, hermetic env) with the scripted model serving `scenario`,
    /// both in one network namespace when available.
    fn run_with_model(&self, mut cmd: Command, scenario: &Path, name: &str) -> RunOutput {
        cmd.current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        let log = self.root.join(format!("{name}-model-log.jsonl"));
        let wrapped = isolated(&with_scripted_model(&cmd, scenario, &log));
        let mut out = run_with_deadline(wrapped, &self.root.join(name), DEADLINE);
        out.extra_log = Some(log);
        out
    }

    /// `ralph run --agent claude ARGS…` with the real CLI, under the scripted model.
    pub(crate) fn ralph_with_model(
        &self,
        claude: &Path,
        args: &[&str],
        scenario: &Path,
        name: &str,
    ) -> RunOutput {
        let mut ralph = Command::new(env!("CARGO_BIN_EXE_ralph"));
        ralph
            .args(["run", "--agent", "claude"])
            .args(args)
            .env("RALPH_AGENT_PROGRAM", claude);
        self.run_with_model(ralph, scenario, name)
    }

    /// `.ralph/ledger.jsonl`, one value per iteration.
    pub(crate) fn ledger(&self) -> Vec<Value> {
        read_jsonl(&self.repo.join(".ralph/ledger.jsonl"))
    }

    pub(crate) fn prd_passes(&self) -> Vec<(String, bool)> {
        let prd: Value = serde_json::from_str(
            &fs::read_to_string(self.repo.join("prd.json")).expect("prd.json"),
        )
        .expect("prd.json is JSON");
        prd["userStories"]
            .as_array()
            .expect("userStories")
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().expect("id").to_owned(),
                    s["passes"].as_bool().expect("passes"),
                )
            })
            .collect()
    }

    /// Runs the project's own test command; returns its stderr (where unittest reports).
    fn project_tests(&self) -> String {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "unittest", "discover", "-s", "tests", "-q"])
            .current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        let out = cmd.output().expect("run python3");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the project's tests fail:\n{stderr}");
        stderr
    }
}

/// The prompt ralph sends, reduced to what the scripted model reads.
fn prompt(story: &str) -> String {
    format!(
        "You are an autonomous coding agent working on the project in this repository.\n\n\
         Story ID: {story}\n\nImplement the story, run the tests, set its `passes` to true in \
         prd.json, and commit. When every story passes, end with <promise>COMPLETE</promise>.\n"
    )
}

/// `claude` exactly as ralph runs it: prompt on stdin, stream-json out.
fn claude_command(claude: &Path, story: &str) -> Command {
    // The prompt goes through a shell pipe because `run_with_deadline` closes stdin.
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        r#"printf '%s' "$1" | "$2" -p --output-format stream-json --verbose --dangerously-skip-permissions"#,
        "sh",
    ])
    .arg(prompt(story))
    .arg(claude);
    cmd
}

/// The parsed `type == "result"` line of a stream-json transcript.
fn result_line(stdout: &str) -> Value {
    stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result line in:\n{stdout}"))
}

#[test]
fn real_claude_implements_a_story_against_the_scripted_model() {
    let Some(claude) =
        claude_bin_or_skip("real_claude_implements_a_story_against_the_scripted_model")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");

    let out = fx.run_with_model(claude_command(&claude, "US-001"), &scenario, "us-001");
    assert!(out.success(), "{out}");
    let result = result_line(&out.stdout);
    assert_eq!(result["is_error"], false, "{out}");
    let text = result["result"].as_str().expect("result text");
    assert!(text.starts_with("Implemented US-001"), "{text}");
    assert!(
        !text.contains("<promise>"),
        "two stories are still open: {text}"
    );

    assert_eq!(
        fx.prd_passes(),
        [
            ("US-001".into(), true),
            ("US-002".into(), false),
            ("US-003".into(), false)
        ]
    );
    assert_eq!(
        fx.git(&["log", "-1", "--format=%s"]).trim(),
        "feat: US-001 add slugify"
    );
    assert_eq!(
        fx.git(&["status", "--porcelain"]),
        "",
        "the agent committed everything"
    );
    assert!(fx.project_tests().contains("Ran 6 tests"));

    // The last story's final answer carries the promise, because prd.json then has every story
    // passing.
    for story in ["US-002", "US-003"] {
        let out = fx.run_with_model(claude_command(&claude, story), &scenario, story);
        assert!(out.success(), "{out}");
    }
    let text = result_line(&fs::read_to_string(fx.root.join("US-003/stdout.txt")).expect("out"))
        ["result"]
        .as_str()
        .expect("result text")
        .to_owned();
    assert!(text.ends_with("\n<promise>COMPLETE</promise>"), "{text}");
}

#[test]
fn real_claude_reports_the_scripted_auth_error() {
    let Some(claude) = claude_bin_or_skip("real_claude_reports_the_scripted_auth_error") else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.root.join("auth-error.json");
    fs::write(
        &scenario,
        r#"{"error": {"status": 401, "message": "invalid x-api-key"}}"#,
    )
    .expect("write scenario");

    let out = fx.run_with_model(claude_command(&claude, "US-001"), &scenario, "auth");
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    let result = result_line(&out.stdout);
    assert_eq!(result["is_error"], true, "{out}");
    assert_eq!(result["api_error_status"], 401, "{out}");
    assert_eq!(
        fx.git(&["status", "--porcelain"]),
        "",
        "nothing was touched"
    );
}

/// `Key: value` trailers of one commit message.
fn trailers(message: &str) -> Vec<(String, String)> {
    message
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| k.starts_with("Ralph-"))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn ralph_runs_the_textkit_example_to_completion_with_the_real_claude_cli() {
    let Some(claude) =
        claude_bin_or_skip("ralph_runs_the_textkit_example_to_completion_with_the_real_claude_cli")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    // The scripted server takes a dummy API key, kept anyway for ANTHROPIC_BASE_URL; the flag
    // must still be accepted.
    let out = fx.ralph_with_model(
        &claude,
        &["--max-iter", "6", "--keep-api-key"],
        &scenario,
        "ralph",
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");

    // Every story passes, and the project's tests (written by the agent) pass.
    assert!(
        fx.prd_passes().iter().all(|(_, passes)| *passes),
        "{:?}",
        fx.prd_passes()
    );
    assert!(fx.project_tests().contains("Ran 15 tests"));

    // One ledger record per iteration, each a passed story, in priority order.
    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for (i, (record, story)) in ledger
        .iter()
        .zip(["US-001", "US-002", "US-003"])
        .enumerate()
    {
        assert_eq!(record["iteration"], i as u64 + 1, "{record}");
        assert_eq!(record["outcome"], "story_passed", "{record}");
        let recorded = record.get("story").or_else(|| record.get("story_id"));
        assert_eq!(recorded.and_then(Value::as_str), Some(story), "{record}");
    }

    // ralph worked on the PRD's branch, and left nothing uncommitted.
    assert_eq!(
        fx.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "ralph/textkit"
    );
    assert_eq!(fx.git(&["status", "--porcelain"]), "");

    // The agent's three commits, plus ralph's own commits with trailers, one per iteration at
    // least (the progress.txt entry).
    let log = fx.git(&["log", "--format=%B%x1e"]);
    let messages: Vec<&str> = log
        .split('\x1e')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    for story in ["US-001", "US-002", "US-003"] {
        assert!(
            messages
                .iter()
                .any(|m| m.starts_with(&format!("feat: {story} "))),
            "no agent commit for {story}:\n{log}"
        );
    }
    let ralph_commits: Vec<&str> = messages
        .iter()
        .copied()
        .filter(|m| m.starts_with("ralph:"))
        .collect();
    let mut runs = BTreeSet::new();
    let mut iterations = BTreeSet::new();
    for message in &ralph_commits {
        let t = trailers(message);
        for key in [
            "Ralph-Run",
            "Ralph-Iteration",
            "Ralph-Story",
            "Ralph-Outcome",
        ] {
            assert!(
                t.iter().any(|(k, v)| k == key && !v.is_empty()),
                "ralph commit without {key}:\n{message}"
            );
        }
        for (k, v) in t {
            match k.as_str() {
                "Ralph-Run" => runs.insert(v),
                "Ralph-Iteration" => iterations.insert(v),
                _ => false,
            };
        }
    }
    assert_eq!(runs.len(), 1, "one run, one run id: {runs:?}");
    assert_eq!(
        iterations,
        BTreeSet::from(["1".to_owned(), "2".to_owned(), "3".to_owned()]),
        "a ralph commit per iteration:\n{log}"
    );

    // progress.txt has ralph's entry for each iteration.
    let progress = fs::read_to_string(fx.repo.join("progress.txt")).expect("progress.txt");
    for n in 1..=3 {
        assert!(
            progress.contains(&format!("(ralph, iteration {n})")),
            "no entry for iteration {n}:\n{progress}"
        );
    }
}

/// The default environment handling with a key that is meant for a gateway: with
/// `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` set (the scripted model) and no claude login
/// in HOME, ralph keeps the key without `--keep-api-key`, and the real CLI completes a story.
#[test]
fn ralph_keeps_the_api_key_for_a_base_url_without_keep_api_key() {
    let Some(claude) =
        claude_bin_or_skip("ralph_keeps_the_api_key_for_a_base_url_without_keep_api_key")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let home = fx.sandbox.join("home");
    assert!(
        !home.join(".claude/.credentials.json").exists() && !home.join(".claude.json").exists(),
        "the sandbox HOME must have no claude login"
    );
    let scenario = example_dir("textkit").join("scenario.json");
    let out = fx.ralph_with_model(&claude, &["--max-iter", "1"], &scenario, "ralph-no-keep");
    // One iteration of three stories: stopped by --max-iter (exit 3) with US-001 done.
    assert_eq!(out.status.and_then(|s| s.code()), Some(3), "{out}");
    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "story_passed", "{}", ledger[0]);
    assert_eq!(
        fx.prd_passes()[0],
        ("US-001".to_owned(), true),
        "{:?}",
        fx.prd_passes()
    );
}

/// The real CLI told to use a model the API does not have (a 404 `not_found_error`): ralph
/// stops at once with a config error that names the model, without spending the failure budget.
#[test]
fn ralph_stops_at_once_when_the_real_claude_names_a_missing_model() {
    let Some(claude) =
        claude_bin_or_skip("ralph_stops_at_once_when_the_real_claude_names_a_missing_model")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.root.join("missing-model.json");
    fs::write(
        &scenario,
        r#"{"error": {"status": 404, "message": "model: claude-nope-9", "type": "not_found_error"}}"#,
    )
    .expect("write scenario");
    let out = fx.ralph_with_model(
        &claude,
        &["--model", "claude-nope-9", "--max-failures", "5"],
        &scenario,
        "missing-model",
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "config_error", "{}", ledger[0]);
    let message = ledger[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`claude-nope-9`"), "{message}");
}

/// `ralph plan --yes --agent claude` then `ralph convert`, the real CLI under the scripted
/// model: the plan prompt gets the PRD as JSON (the scenario's `prompts` answer requests
/// without a story id), ralph renders it in its layout, and `ralph convert` turns that into a
/// prd.json `ralph validate --strict` accepts, with no model. Then the agent path of `ralph
/// convert` through claude: free-form Markdown, one draft, written.
#[test]
fn real_claude_plans_a_feature_that_converts_and_validates() {
    let Some(claude) =
        claude_bin_or_skip("real_claude_plans_a_feature_that_converts_and_validates")
    else {
        return;
    };
    let fx = Fixture::textkit();
    // A new feature: the example's own prd.json goes.
    fs::remove_file(fx.repo.join("prd.json")).expect("rm prd.json");
    fx.git(&["commit", "-qam", "no prd.json yet"]);

    let plan_doc = serde_json::json!({
        "title": "Reverse flag",
        "introduction": "Add a --reverse flag to the textkit command line so that users can flip its output.",
        "goals": ["Reverse any output line with one flag"],
        "userStories": [
            {"title": "Add a reverse helper",
             "description": "As a developer, I want `textkit.reverse(text)` so that the CLI can use it.",
             "acceptanceCriteria": ["`reverse(\"abc\")` returns `\"cba\"`", "Tests pass"]},
            {"title": "Wire the --reverse flag",
             "description": "As a user, I want `--reverse` so that the output comes out reversed.",
             "acceptanceCriteria": ["`python3 -m textkit --reverse abc` prints `cba`", "Tests pass"]}
        ],
        "functionalRequirements": ["FR-1: --reverse reverses each line by characters"],
        "nonGoals": ["Reversing files in place"],
        "assumptions": ["Reversal is by Unicode characters, not bytes"],
        "openQuestions": ["Should --reverse combine with other flags?"]
    });
    let converted = serde_json::json!({
        "project": "textkit",
        "branchName": "ralph/word-count",
        "description": "Count the words of a text.",
        "userStories": [{
            "id": "US-001", "title": "Add word_count",
            "description": "As a writer, I want `textkit.word_count(text)` so that I can check a draft's length.",
            "acceptanceCriteria": ["`word_count(\"a b\")` returns 2", "Tests pass"],
            "priority": 1, "passes": false, "notes": ""
        }]
    });
    let scenario = fx.root.join("plan-scenario.json");
    fs::write(
        &scenario,
        serde_json::to_vec_pretty(&serde_json::json!({
            "description": "ralph plan and ralph convert's agent path through claude",
            "prompts": {
                "You are writing a product requirements document":
                    [{"final": plan_doc.to_string(), "promise": "never"}],
                "You are converting a product requirements document":
                    [{"final": converted.to_string(), "promise": "never"}]
            }
        }))
        .expect("json"),
    )
    .expect("write scenario");

    let ralph = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ralph"));
        cmd.args(args).env("RALPH_AGENT_PROGRAM", &claude);
        cmd
    };
    let out = fx.run_with_model(
        ralph(&[
            "plan",
            "add a --reverse flag to textkit's CLI",
            "--yes",
            "--agent",
            "claude",
        ]),
        &scenario,
        "plan",
    );
    assert!(out.success(), "{out}");
    assert!(
        out.stdout
            .starts_with("✓ wrote tasks/prd-reverse-flag.md: 2 stories"),
        "{out}"
    );
    let md = fs::read_to_string(fx.repo.join("tasks/prd-reverse-flag.md")).expect("the PRD");
    assert!(md.contains("### US-002: Wire the --reverse flag"), "{md}");
    assert!(md.contains("## Assumptions"), "{md}");
    // The model was asked once, with the plan prompt and the description.
    let log = read_jsonl(out.extra_log.as_ref().expect("model log"));
    let answered: Vec<&Value> = log.iter().filter(|e| e["reply"] == "text").collect();
    assert_eq!(answered.len(), 1, "{log:?}");

    // ralph convert needs no model for ralph's layout; the result passes validate --strict.
    let run = |args: &[&str], name: &str| {
        let mut cmd = ralph(args);
        cmd.current_dir(&fx.repo);
        hermetic_env(&mut cmd, &fx.sandbox);
        run_with_deadline(cmd, &fx.root.join(name), DEADLINE)
    };
    let out = run(&["convert", "tasks/prd-reverse-flag.md"], "convert");
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains("(ralph's PRD layout, no model)"),
        "{out}"
    );
    let out = run(&["validate", "--strict"], "validate");
    assert!(out.success(), "{out}");
    let prd: Value =
        serde_json::from_str(&fs::read_to_string(fx.repo.join("prd.json")).expect("prd.json"))
            .expect("JSON");
    assert_eq!(prd["branchName"], "ralph/reverse-flag");
    assert_eq!(prd["userStories"][1]["id"], "US-002");

    // Free-form Markdown goes through claude: one draft, checked and written.
    fs::write(
        fx.repo.join("notes.md"),
        "# Word count\n\nWriters want to know how long a draft is. Add word_count(text) to \
         textkit; it returns the number of words.\n",
    )
    .expect("notes.md");
    let out = fx.run_with_model(
        ralph(&[
            "convert",
            "notes.md",
            "--out",
            "words.json",
            "--agent",
            "claude",
        ]),
        &scenario,
        "convert-agent",
    );
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains("converted by the agent in 1 attempt"),
        "{out}"
    );
    let words: Value =
        serde_json::from_str(&fs::read_to_string(fx.repo.join("words.json")).expect("words.json"))
            .expect("JSON");
    assert_eq!(words["userStories"][0]["title"], "Add word_count");
}
