//! End-to-end runs of `ralph run --agent gemini` with the real Gemini CLI (pinned by
//! `scripts/install-gemini.sh`) against `ralph-scripted-model`'s Gemini v1beta wire, offline, in
//! one `unshare -n` network namespace: the textkit example to completion, then the CLI's quota
//! and auth failures as ralph records them. Harness: `testing/README-model.md`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support_model::{
    example_dir, git, hermetic_env, init_repo_from_example, isolated, read_jsonl,
    run_with_deadline, with_scripted_model, RunOutput,
};

/// Generous: a scripted iteration takes about 5 s (most of it the CLI's start-up), but CI
/// machines are slow and shared.
const DEADLINE: Duration = Duration::from_secs(300);

/// Pinned by the tests (ralph's `--model`, passed as `-m`) so the CLI's model router, which
/// would send an extra classification request, stays off.
const MODEL: &str = "gemini-2.5-flash";

/// `~/.gemini/settings.json` for an offline run. With only `GOOGLE_GEMINI_BASE_URL` set,
/// 0.61.0 derives the auth type "gateway", refuses it ("Invalid auth method selected.", exit
/// 41), so the API-key type is pinned; telemetry and usage statistics are off so that nothing
/// tries to reach Google's logging hosts.
const SETTINGS: &str = r#"{
  "security": { "auth": { "selectedType": "gemini-api-key" } },
  "telemetry": { "enabled": false },
  "privacy": { "usageStatisticsEnabled": false }
}
"#;

pub(crate) fn gemini_bin_or_skip(test: &str) -> Option<PathBuf> {
    crate::support_model::real_cli_or_skip("gemini", test)
}

/// A fresh copy of the textkit example as a git repository, plus a sandbox for HOME/TMPDIR.
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
        let settings = sandbox.join("home/.gemini/settings.json");
        fs::create_dir_all(settings.parent().expect("parent")).expect("create ~/.gemini");
        fs::write(&settings, SETTINGS).expect("write settings.json");
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

    /// `ralph run --agent gemini --model gemini-2.5-flash <extra>` in the repository with the
    /// hermetic env, no inherited `GEMINI_*`/`GOOGLE_*` variables, `GEMINI_API_KEY=dummy`, and
    /// the scripted model serving `scenario` in the same network namespace (its run mode sets
    /// `GOOGLE_GEMINI_BASE_URL`).
    pub(crate) fn ralph(
        &self,
        gemini: &Path,
        scenario: &Path,
        extra: &[&str],
        name: &str,
    ) -> RunOutput {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ralph"));
        cmd.args(["run", "--agent", "gemini", "--model", MODEL])
            .args(extra)
            .env("RALPH_AGENT_PROGRAM", gemini)
            .current_dir(&self.repo);
        hermetic_env(&mut cmd, &self.sandbox);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("GEMINI_") || k.starts_with("GOOGLE_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("GEMINI_API_KEY", "dummy");
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

    pub(crate) fn ledger(&self) -> Vec<Value> {
        read_jsonl(&self.repo.join(".ralph/ledger.jsonl"))
    }

    /// A scenario file answering every model request with one HTTP error.
    fn error_scenario(&self, status: u16, message: &str) -> PathBuf {
        let path = self.root.join(format!("error-{status}.json"));
        let scenario = serde_json::json!({"error": {"status": status, "message": message}});
        fs::write(&path, scenario.to_string()).expect("write scenario");
        path
    }
}

#[test]
fn ralph_runs_the_textkit_example_to_completion_with_the_real_gemini_cli() {
    let Some(gemini) =
        gemini_bin_or_skip("ralph_runs_the_textkit_example_to_completion_with_the_real_gemini_cli")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    let out = fx.ralph(&gemini, &scenario, &["--max-iter", "6"], "ralph");
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");

    // Every story passes, and the project's tests (written through gemini's own write_file
    // and run_shell_command tools) pass.
    assert!(
        fx.prd_passes().iter().all(|(_, passes)| *passes),
        "{:?}",
        fx.prd_passes()
    );
    let mut tests = Command::new("python3");
    tests
        .args(["-m", "unittest", "discover", "-s", "tests", "-q"])
        .current_dir(&fx.repo);
    hermetic_env(&mut tests, &fx.sandbox);
    let tests = tests.output().expect("run python3");
    let stderr = String::from_utf8_lossy(&tests.stderr);
    assert!(
        tests.status.success(),
        "the project's tests fail:\n{stderr}"
    );
    assert!(stderr.contains("Ran 15 tests"), "{stderr}");

    // One ledger record per iteration, each a passed story in priority order, with what the
    // stream-json output said: the session, the model, tokens from `result.stats`, and the
    // promise only in the last iteration's final text (the echoed prompt holds it every time).
    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for (i, (record, story)) in ledger
        .iter()
        .zip(["US-001", "US-002", "US-003"])
        .enumerate()
    {
        assert_eq!(record["iteration"], i as u64 + 1, "{record}");
        assert_eq!(record["outcome"], "story_passed", "{record}");
        assert_eq!(record["story_id"], story, "{record}");
        assert_eq!(record["backend"], "gemini", "{record}");
        assert_eq!(record["model"], MODEL, "{record}");
        assert_eq!(record["exit_code"], 0, "{record}");
        assert!(
            record["session_id"].as_str().is_some_and(|s| !s.is_empty()),
            "{record}"
        );
        assert!(
            record["tokens_in"].as_u64().is_some_and(|n| n > 0),
            "{record}"
        );
        assert!(
            record["tokens_out"].as_u64().is_some_and(|n| n > 0),
            "{record}"
        );
        assert_eq!(record["promise_seen"], i == 2, "{record}");
    }

    // The agent's commit for each story, ralph's branch, nothing left uncommitted.
    let log = fx.git(&["log", "--format=%s"]);
    for story in ["US-001", "US-002", "US-003"] {
        assert!(
            log.lines()
                .any(|s| s.starts_with(&format!("feat: {story} "))),
            "no agent commit for {story}:\n{log}"
        );
    }
    assert_eq!(
        fx.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "ralph/textkit"
    );
    assert_eq!(fx.git(&["status", "--porcelain"]), "");
}

/// The API's "exhausted your capacity" 429: the real CLI retries twice, prints an error result
/// (type `unknown` in 0.61.0) and exits 173; ralph records a usage limit and, with `--no-wait`,
/// stops with exit 4 instead of waiting for the reset.
#[test]
fn ralph_records_the_real_gemini_quota_error_as_a_usage_limit() {
    let Some(gemini) =
        gemini_bin_or_skip("ralph_records_the_real_gemini_quota_error_as_a_usage_limit")
    else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.error_scenario(
        429,
        "You have exhausted your capacity on this model. Your quota will reset after 2h13m5s.",
    );
    let out = fx.ralph(
        &gemini,
        &scenario,
        &["--max-iter", "3", "--no-wait"],
        "quota",
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(75), "{out}");
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains("usage limit"),
        "{out}"
    );

    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "usage_limit", "{}", ledger[0]);
    assert_eq!(ledger[0]["exit_code"], 173, "{}", ledger[0]);
    assert!(
        ledger[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("exhausted your capacity")),
        "{}",
        ledger[0]
    );
    assert!(fx.prd_passes().iter().all(|(_, passes)| !*passes));
}

/// A 401 from the API: the CLI exits 145 (401 & 0xFF) with the API's JSON in its error result;
/// ralph records an auth error and stops at once with exit 1.
#[test]
fn ralph_stops_on_the_real_gemini_auth_error() {
    let Some(gemini) = gemini_bin_or_skip("ralph_stops_on_the_real_gemini_auth_error") else {
        return;
    };
    let fx = Fixture::textkit();
    let scenario = fx.error_scenario(401, "API key not valid. Please pass a valid API key.");
    let out = fx.ralph(&gemini, &scenario, &["--max-iter", "3"], "auth");
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");

    let ledger = fx.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0]["outcome"], "auth_error", "{}", ledger[0]);
    assert_eq!(ledger[0]["exit_code"], 145, "{}", ledger[0]);
}
