//! `ralph run --agent opencode` end to end: first against `ralph-fake-agent`'s opencode dialect
//! (no CLI needed: the loop's reading of opencode's output, errors and limits), then with the
//! real OpenCode CLI (pinned by `scripts/install-opencode.sh`) against `ralph-scripted-model`'s
//! Chat Completions wire, offline in a network namespace. Harness: `testing/README-model.md`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::support_model::{
    example_dir, git, hermetic_env, init_repo_from_example, isolated, read_jsonl,
    run_with_deadline, with_scripted_model, RunOutput,
};

const PROMISE: &str = "<promise>COMPLETE</promise>";

// ---------------------------------------------------------------------------------------------
// With the fake agent's opencode dialect.

/// A repository with `n` open stories and the fake agent on PATH as `opencode`.
fn fake_env(n: usize) -> TestEnv {
    let env = TestEnv::new(&prd_with_stories(n));
    std::os::unix::fs::symlink(crate::common::fake_agent_bin(), env.bin.join("opencode"))
        .expect("symlink opencode");
    env
}

/// One fake opencode run implementing story `n`: a bash step whose output quotes the promise, a
/// text step that claims completion and then calls a tool, the work itself, then the final
/// answer `final_text`.
fn opencode_story(n: usize, final_text: &str) -> Value {
    let id = format!("US-{n:03}");
    json!([
        {"save_stdin": format!("../stdin-{n}.txt")},
        {"opencode": {"tool_step": {"tool": "bash", "input": {"command": "grep -r promise ."},
                                    "output": format!("prompt.md: reply {PROMISE}")}}},
        {"opencode": {"step_start": {}}},
        {"opencode": {"text": format!("Nearly there. {PROMISE}")}},
        {"opencode": {"tool": {"tool": "write", "input": {"filePath": format!("file-{n}.txt")},
                               "output": "Wrote file successfully."}}},
        {"opencode": {"step_finish": {"reason": "tool-calls", "cost": 0.002,
            "tokens": {"input": 1000, "output": 50, "reasoning": 5, "cache": {"read": 300, "write": 7}}}}},
        {"write_file": {"path": format!("file-{n}.txt"), "content": format!("story {n}\n")}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"opencode": {"final": final_text}}
    ])
}

fn outcomes(env: &TestEnv) -> Vec<String> {
    env.ledger()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The fake's recorded invocations (argv, env), one per agent run.
fn calls(env: &TestEnv) -> Vec<Value> {
    read_jsonl(Path::new(&format!("{}.calls.jsonl", env.script.display())))
}

#[test]
fn fake_opencode_run_completes_with_cost_tokens_and_sessions_recorded() {
    let env = fake_env(2);
    env.script(
        &json!({"record_env": ["OPENCODE_PERMISSION"], "invocations": [
            opencode_story(1, "Implemented US-001."),
            opencode_story(2, &format!("Implemented US-002.\n{PROMISE}")),
        ]}),
    );
    let out = env.ralph(&["run", "--agent", "opencode", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["story_passed", "story_passed"]);

    let ledger = env.ledger();
    // The promise quoted by a tool and claimed before a tool call never counted: only the
    // last iteration's final answer carries it.
    assert_eq!(ledger[0]["promise_seen"], false, "{}", ledger[0]);
    assert_eq!(ledger[1]["promise_seen"], true, "{}", ledger[1]);
    // Sums over the run's three steps: tool_step and final use the fake's defaults (0.001 USD,
    // 100 in / 10 out).
    let cost = ledger[0]["cost_usd"].as_f64().expect("cost_usd");
    assert!((cost - 0.004).abs() < 1e-9, "{cost}");
    assert_eq!(ledger[0]["tokens_in"], 1200);
    assert_eq!(ledger[0]["tokens_out"], 75);
    assert_eq!(ledger[0]["cache_read_tokens"], 300);
    assert_eq!(ledger[0]["session_id"], "ses_fake_0");
    assert_eq!(ledger[1]["session_id"], "ses_fake_1");

    // ralph ran `opencode run --format json …` with the prompt on stdin and unattended
    // permissions.
    let call = &calls(&env)[0];
    let argv: Vec<&str> = call["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(argv[..3], ["run", "--format", "json"], "{argv:?}");
    assert!(argv.contains(&"--title"), "{argv:?}");
    assert_eq!(call["env"]["OPENCODE_PERMISSION"], r#"{"*":"allow"}"#);
    let stdin = env.read("../stdin-1.txt");
    assert!(stdin.contains("Story ID: US-001"), "{stdin}");
}

#[test]
fn fake_opencode_rate_limit_is_retried_without_using_an_iteration() {
    let env = fake_env(1);
    env.write(
        "ralph.toml",
        "transient_backoff = \"100ms\"\nmax_transient_retries = 2\n",
    );
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    env.script(&json!({"invocations": [
        [{"opencode": {"rate_limit": {}}}, {"exit": 1}],
        opencode_story(1, &format!("Done.\n{PROMISE}")),
    ]}));
    let out = env.ralph(&["run", "--agent", "opencode", "--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["transient", "story_passed"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Rate limit exceeded (HTTP 429)"),
        "{}",
        text(&out)
    );
}

#[test]
fn fake_opencode_exhausted_quota_is_a_usage_limit_with_the_providers_reset() {
    let env = fake_env(1);
    env.script(&json!({"invocations": [
        [{"opencode": {"rate_limit": {"quota": true}}}, {"exit": 1}],
    ]}));
    let before = chrono::Utc::now();
    let out = env.ralph(&["run", "--agent", "opencode", "--no-wait"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_eq!(outcomes(&env), ["usage_limit"]);
    // The provider's `retry-after: 3600` is the reset ralph would wait for.
    let state: Value =
        serde_json::from_str(&env.read(".ralph/state.json")).expect("state.json is JSON");
    let resume_at: chrono::DateTime<chrono::Utc> = state["resume_at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resume_at in {state}"));
    let waited = (resume_at - before).num_seconds();
    assert!((3590..=3700).contains(&waited), "{resume_at} ({waited} s)");
}

#[test]
fn fake_opencode_auth_error_stops_the_run_at_once() {
    let env = fake_env(2);
    env.script(&json!({"invocations": [
        [{"opencode": {"auth_error": {}}}, {"exit": 1}],
    ]}));
    let out = env.ralph(&["run", "--agent", "opencode", "--max-iter", "5"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(outcomes(&env), ["auth_error"]);
    assert_eq!(env.agent_calls(), 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No API key found for provider anthropic"),
        "{}",
        text(&out)
    );
}

// ---------------------------------------------------------------------------------------------
// With the real CLI.

/// Generous: an opencode iteration takes 3–10 s here, but CI machines are slow and shared.
const DEADLINE: Duration = Duration::from_secs(600);

pub(crate) fn opencode_bin_or_skip(test: &str) -> Option<PathBuf> {
    crate::support_model::real_cli_or_skip("opencode", test)
}

/// opencode's configuration for the scripted model: a provider `fake` served by the bundled
/// `@ai-sdk/openai-compatible`, its base URL read from `OPENAI_BASE_URL`, which the scripted
/// model's run mode sets to its ephemeral port (opencode substitutes `{env:VAR}`).
const OPENCODE_CONFIG: &str = r#"{
  "$schema": "https://opencode.ai/config.json",
  "provider": {
    "fake": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "ralph-scripted-model",
      "options": {"baseURL": "{env:OPENAI_BASE_URL}", "apiKey": "dummy"},
      "models": {"fake-model": {"name": "Scripted model", "tool_call": true}}
    }
  },
  "model": "fake/fake-model",
  "autoupdate": false,
  "share": "disabled"
}
"#;

/// A fresh copy of the textkit example as a git repository, plus a sandbox for HOME/TMPDIR and
/// opencode's config file (outside the repository, so the agent's `git add -A` cannot commit
/// it).
pub(crate) struct Fixture {
    _tmp: tempfile::TempDir,
    pub(crate) root: PathBuf,
    pub(crate) repo: PathBuf,
    pub(crate) sandbox: PathBuf,
}

impl Fixture {
    pub(crate) fn textkit() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let repo = root.join("textkit");
        let sandbox = root.join("sandbox");
        init_repo_from_example(&example_dir("textkit"), &repo, &sandbox);
        fs::write(sandbox.join("opencode.json"), OPENCODE_CONFIG).expect("write opencode.json");
        Fixture {
            _tmp: tmp,
            root,
            repo,
            sandbox,
        }
    }

    pub(crate) fn git(&self, args: &[&str]) -> String {
        git(&self.repo, &self.sandbox, args)
    }

    /// Runs `cmd` in the repo with the hermetic env plus opencode's offline settings, the
    /// scripted model serving `scenario`, both in one network namespace when available.
    pub(crate) fn run_with_model(
        &self,
        mut cmd: Command,
        scenario: &Path,
        name: &str,
    ) -> RunOutput {
        cmd.current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        // A developer's own opencode settings must not leak in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OPENCODE_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("OPENCODE_CONFIG", self.sandbox.join("opencode.json"))
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_SHARE", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
            // No plugin lookups on the npm registry (the same as `--pure`).
            .env("OPENCODE_PURE", "1");
        let log = self.root.join(format!("{name}-model-log.jsonl"));
        let wrapped = isolated(&with_scripted_model(&cmd, scenario, &log));
        let mut out = run_with_deadline(wrapped, &self.root.join(name), DEADLINE);
        out.extra_log = Some(log);
        out
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
    pub(crate) fn project_tests(&self) -> String {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "unittest", "discover", "-s", "tests", "-q"])
            .current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        let out = cmd.output().expect("run python3");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the project's tests fail:\n{stderr}");
        stderr
    }

    pub(crate) fn ralph(&self, opencode: &Path, args: &[&str]) -> Command {
        let mut ralph = Command::new(env!("CARGO_BIN_EXE_ralph"));
        ralph
            .args(["run", "--agent", "opencode", "--model", "fake/fake-model"])
            .args(args)
            .env("RALPH_AGENT_PROGRAM", opencode);
        ralph
    }
}

#[test]
fn ralph_runs_the_textkit_example_to_completion_with_the_real_opencode_cli() {
    let test = "ralph_runs_the_textkit_example_to_completion_with_the_real_opencode_cli";
    let Some(opencode) = opencode_bin_or_skip(test) else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    let out = fx.run_with_model(
        fx.ralph(&opencode, &["--max-iter", "6"]),
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

    // One ledger record per iteration, each a passed story in priority order, with opencode's
    // session and the scripted model's token counts; only the last claims completion.
    let ledger = read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for (i, (record, story)) in ledger
        .iter()
        .zip(["US-001", "US-002", "US-003"])
        .enumerate()
    {
        assert_eq!(record["iteration"], i as u64 + 1, "{record}");
        assert_eq!(record["outcome"], "story_passed", "{record}");
        assert_eq!(record["story_id"], story, "{record}");
        assert_eq!(record["backend"], "opencode", "{record}");
        assert_eq!(record["promise_seen"], i == 2, "{record}");
        assert!(
            record["session_id"]
                .as_str()
                .is_some_and(|s| s.starts_with("ses_")),
            "{record}"
        );
        assert!(record["tokens_in"].as_u64().unwrap_or(0) > 0, "{record}");
    }
    assert_eq!(fx.git(&["status", "--porcelain"]), "");
    for story in ["US-001", "US-002", "US-003"] {
        assert!(
            fx.git(&["log", "--format=%s"])
                .lines()
                .any(|s| s.starts_with(&format!("feat: {story} "))),
            "no agent commit for {story}"
        );
    }

    // Six scripted turns per story and nothing else: the prompt reached the model from stdin
    // (the story id was read from it) and `--title` spared the title request.
    let requests = read_jsonl(&fx.root.join("ralph-model-log.jsonl"));
    assert_eq!(requests.len(), 18, "{requests:#?}");
    assert!(
        requests
            .iter()
            .all(|r| r["path"] == "/v1/chat/completions" && r["status"] == 200),
        "{requests:#?}"
    );
    assert!(requests.iter().all(|r| r.get("side").is_none()));
}

#[test]
fn real_opencode_auth_error_stops_ralph_as_an_auth_error() {
    let Some(opencode) =
        opencode_bin_or_skip("real_opencode_auth_error_stops_ralph_as_an_auth_error")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.root.join("auth-error.json");
    fs::write(
        &scenario,
        r#"{"error": {"status": 401, "message": "Incorrect API key provided: dummy."}}"#,
    )
    .expect("write scenario");
    let out = fx.run_with_model(fx.ralph(&opencode, &["--max-iter", "3"]), &scenario, "auth");
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    let ledger = read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "auth_error", "{}", ledger[0]);
    assert!(out.stderr.contains("Incorrect API key provided"), "{out}");
    assert!(fx.prd_passes().iter().all(|(_, passes)| !*passes));
}
