//! The integrations shipped in the repository: the GitHub Action's steps and the job entrypoint
//! run locally (a simulated runner: `GITHUB_ACTIONS`, `GITHUB_OUTPUT` and `GITHUB_STEP_SUMMARY`
//! files; a local bare remote), and every file passes its linter or validator (actionlint,
//! hadolint, kubernetes-validate against the bundled API schemas, ShellCheck), each installed by
//! scripts/install-linters.sh. A missing linter fails the test with that command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;

use crate::common::{text, TestEnv};
use crate::scale_out::{path, Remote};

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A linter from `.tools/lint/bin` (scripts/install-linters.sh); fails when it is missing.
fn linter(name: &str) -> PathBuf {
    let p = manifest().join(".tools/lint/bin").join(name);
    assert!(
        p.exists(),
        "{name} is not installed at {}: run scripts/install-linters.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run")
}

/// A directory on PATH with `ralph` (the built one) next to the fake `claude`.
fn path_with_ralph(env: &TestEnv) -> String {
    let link = env.bin.join("ralph");
    if !link.exists() {
        std::os::unix::fs::symlink(crate::common::ralph_bin(), &link).unwrap();
    }
    format!("{}:/usr/local/bin:/usr/bin:/bin", env.bin.display())
}

/// One step script of the action (deploy/github/), as action.yml runs it, in `env`'s repository
/// with the runner's variables.
fn action_step(env: &TestEnv, script: &str, inputs: &[(&str, &str)], runner: &Path) -> Output {
    let action = std::fs::read_to_string(manifest().join("action.yml")).unwrap();
    assert!(
        action.contains(&format!("\"$GITHUB_ACTION_PATH/deploy/github/{script}\"")),
        "action.yml does not run deploy/github/{script}"
    );
    let mut cmd = Command::new(manifest().join("deploy/github").join(script));
    cmd.current_dir(&env.repo)
        .env_clear()
        .envs(env.envs())
        .env("PATH", path_with_ralph(env))
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_ACTION_PATH", manifest())
        .env("GITHUB_OUTPUT", runner.join("output"))
        .env("GITHUB_STEP_SUMMARY", runner.join("summary.md"))
        .env("GITHUB_PATH", runner.join("path"))
        .env("RUNNER_TEMP", runner.join("temp"))
        .envs(inputs.iter().copied());
    run(&mut cmd)
}

/// The `key=value` lines of a `$GITHUB_OUTPUT` file (the last value of a key wins).
fn outputs(file: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn the_actions_steps_run_in_a_simulated_runner() {
    let env = TestEnv::new(&crate::common::prd_with_stories(2));
    env.script(&crate::scale_out::working_agent(0));
    let runner = env.root.path().join("runner");
    std::fs::create_dir_all(runner.join("temp")).unwrap();
    let out = action_step(
        &env,
        "install-agent.sh",
        &[("INPUT_AGENT", "exec")],
        &runner,
    );
    assert!(out.status.success(), "{}", text(&out));
    let inputs = [
        ("INPUT_PRD", "prd.json"),
        ("INPUT_AGENT", "claude"),
        ("INPUT_MAX_ITER", "5"),
        ("INPUT_MAX_COST", "3"),
        ("INPUT_PUSH", "false"),
        ("INPUT_SHUTDOWN_TIMEOUT", "9s"),
        ("INPUT_WORKING_DIRECTORY", "."),
    ];
    let out = action_step(&env, "run.sh", &inputs, &runner);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let o = outputs(&runner.join("output"));
    assert_eq!(o["exit_code"], "0", "{o:?}");
    assert_eq!(o["stop_reason"], "complete");
    assert_eq!(o["passed"], "2");
    assert_eq!(o["open"], "0");
    assert_eq!(o["branch"], "ralph/demo");
    assert_eq!(o["cost_usd"], "0.0200");
    assert_eq!(o["resume_at"], "");
    // The repository's own prd.json: no "prd.json" in the name.
    assert!(
        o["artifact_name"].starts_with("ralph-") && !o["artifact_name"].contains("json"),
        "{o:?}"
    );
    let summary = std::fs::read_to_string(runner.join("summary.md")).unwrap();
    assert!(summary.contains("## ralph: Demo"), "{summary}");
    assert!(
        summary.contains("| US-002 | Story 2 | passes |"),
        "{summary}"
    );
    assert!(summary.contains("**Exit code:** 0 (complete)"), "{summary}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("::group::iteration 1 · US-001 Story 1"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("::endgroup::").count(), 2, "{stderr}");
    // The report step, as action.yml runs it, writes what the artifact step uploads.
    let action = std::fs::read_to_string(manifest().join("action.yml")).unwrap();
    let report = "ralph report --prd \"$INPUT_PRD\" --out .ralph/report.html";
    assert!(action.contains(report));
    let out = run(Command::new("bash")
        .args(["-c", report])
        .current_dir(&env.repo)
        .env_clear()
        .envs(env.envs())
        .env("PATH", path_with_ralph(&env))
        .env("INPUT_PRD", "prd.json"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.path(".ralph/report.html").exists());
    assert!(env.path(".ralph/ledger.jsonl").exists());

    // A usage limit under `no-wait`: exit 75, resume_at in the outputs, and the step succeeds
    // with a notice (the scheduled workflow resumes it).
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    let resets = chrono::Utc::now().timestamp() + 3600;
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your limit", "resets_at": resets}},
        {"exit": 1}
    ]]}));
    let runner = env.root.path().join("runner");
    std::fs::create_dir_all(runner.join("temp")).unwrap();
    let mut inputs = inputs.to_vec();
    inputs.push(("INPUT_NO_WAIT", "true"));
    let out = action_step(&env, "run.sh", &inputs, &runner);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("::notice title=ralph::resumable later (exit 75)"));
    let o = outputs(&runner.join("output"));
    assert_eq!(o["exit_code"], "75", "{o:?}");
    assert_eq!(o["stop_reason"], "usage_limit");
    let at = chrono::DateTime::parse_from_rfc3339(&o["resume_at"]).expect("resume_at");
    assert!((at.timestamp() - resets).abs() < 120, "{o:?}");
    let summary = std::fs::read_to_string(runner.join("summary.md")).unwrap();
    assert!(summary.contains("**Resumable at:**"), "{summary}");
    // Failing early (a broken prd.json) still gives the step its exit code.
    env.write("prd.json", "{ not json");
    let runner = env.root.path().join("runner-broken");
    std::fs::create_dir_all(runner.join("temp")).unwrap();
    let out = action_step(&env, "run.sh", &inputs, &runner);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(outputs(&runner.join("output"))["exit_code"], "1");
}

#[test]
fn outside_github_actions_nothing_is_written_for_it() {
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    env.script(&crate::scale_out::working_agent(0));
    let runner = env.root.path().join("runner");
    std::fs::create_dir_all(&runner).unwrap();
    let out = env
        .ralph_cmd(&["run"])
        .env("GITHUB_OUTPUT", runner.join("output"))
        .env("GITHUB_STEP_SUMMARY", runner.join("summary.md"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!runner.join("output").exists() && !runner.join("summary.md").exists());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("::group::"));
}

#[test]
fn under_github_actions_a_blocked_story_warns_and_an_auth_error_is_an_error_annotation() {
    let runner_env = |env: &TestEnv, args: &[&str]| {
        let runner = env.root.path().join("runner");
        std::fs::create_dir_all(&runner).unwrap();
        env.ralph_cmd(args)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_OUTPUT", runner.join("output"))
            .env("GITHUB_STEP_SUMMARY", runner.join("summary.md"))
            .output()
            .unwrap()
    };
    // A story that fails its one attempt: blocked, a warning naming it.
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_result": {"text": "I could not do it", "is_error": true}},
        {"exit": 1}
    ]]}));
    let out = runner_env(&env, &["run", "--max-attempts", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains(
            "::warning title=ralph%3A story blocked::US-001 is blocked after 1 attempt ("
        ),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("::error"), "{}", text(&out));
    // The agent is not logged in: an error annotation, and one that says a human must act.
    let env = TestEnv::new(&crate::common::prd_with_stories(1));
    env.script(&json!({"invocations": [[
        {"claude_init": {}},
        {"claude_result": {"text": "Invalid API key · Please run /login", "is_error": true}},
        {"exit": 1}
    ]]}));
    let out = runner_env(&env, &["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("::error title=ralph%3A the agent is not logged in::iteration 1 (US-001): "),
        "{all}"
    );
    assert!(
        all.contains("::error title=ralph%3A a human must act::"),
        "{all}"
    );
}

/// Runs deploy/job/ralph-job.sh (the container's entrypoint, Slurm's task) for task `index` of
/// `list` with `envs`.
fn job(r: &Remote, list: &Path, index: &str, envs: &[(&str, &str)]) -> Output {
    let work = r.env.root.path().join("work");
    run(Command::new(manifest().join("deploy/job/ralph-job.sh"))
        .current_dir(r.env.root.path())
        .env_clear()
        .envs(r.env.envs())
        .env("RALPH_BIN", crate::common::ralph_bin())
        .env("RALPH_PRD_LIST", list)
        .env("RALPH_INDEX", index)
        .env("RALPH_WORKDIR", &work)
        .envs(envs.iter().copied()))
}

#[test]
fn the_job_entrypoint_clones_runs_pushes_and_maps_exit_codes() {
    let r = Remote::new(2, &crate::scale_out::working_agent(0));
    let list = r.env.root.path().join("prds.txt");
    std::fs::write(
        &list,
        format!(
            "# repository and prd.json, one per task\n{} prd.json\n/nowhere/gone.git prd.json\n",
            r.bare.display()
        ),
    )
    .unwrap();
    let termlog = r.env.root.path().join("termination-log");
    let result = r.env.root.path().join("result");
    let envs = [
        ("RALPH_TERMINATION_LOG", path(&termlog)),
        ("RALPH_RESULT_FILE", path(&result)),
    ];
    let out = job(&r, &list, "0", &envs);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(r.remote_iterations(), [1, 2]);
    assert_eq!(
        std::fs::read_to_string(&termlog).unwrap(),
        "ralph exit 0: complete\n"
    );
    assert!(std::fs::read_to_string(&result)
        .unwrap()
        .starts_with("rc=0\n"));
    // Run again: a fresh clone finds the work done.
    let out = job(&r, &list, "0", &envs);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(r.remote_iterations(), [1, 2], "nothing ran twice");
    // The remote cannot be reached: resumable later.
    let out = job(&r, &list, "1", &envs);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot clone the repository"));
    // No line for the index: a configuration error naming the file.
    let out = job(&r, &list, "7", &envs);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no line for task 7"));
}

#[test]
fn actionlint_passes_on_the_action_and_the_example_workflow() {
    let actionlint = linter("actionlint");
    // actionlint reads an action's metadata where a workflow uses it: a probe workflow uses the
    // action (a copy, in a repository of its own) with every input and reads every output.
    let dir = tempfile::tempdir().unwrap();
    let action = std::fs::read_to_string(manifest().join("action.yml")).unwrap();
    std::fs::write(dir.path().join("action.yml"), &action).unwrap();
    std::fs::create_dir_all(dir.path().join(".github/workflows")).unwrap();
    let probe = |action_text: &str| -> Output {
        std::fs::write(dir.path().join("action.yml"), action_text).unwrap();
        std::fs::write(
            dir.path().join(".github/workflows/probe.yml"),
            "on: push\njobs:\n  probe:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v5\n      - id: ralph\n        uses: ./\n        with:\n          prd: prd.json\n          agent: claude\n          agent-version: 2.1.332\n          max-iter: \"5\"\n          max-duration: 1h\n          max-cost: \"2\"\n          push: \"true\"\n          no-wait: \"false\"\n          shutdown-timeout: 9s\n          args: --verbose\n          working-directory: .\n          fail-on-resumable: \"false\"\n          resume-only: \"false\"\n          upload-transcripts: \"false\"\n      - run: echo \"$A $B $C $D $E $F $G $H\"\n        env:\n          A: ${{ steps.ralph.outputs.exit-code }}\n          B: ${{ steps.ralph.outputs.stop-reason }}\n          C: ${{ steps.ralph.outputs.passed }}\n          D: ${{ steps.ralph.outputs.open }}\n          E: ${{ steps.ralph.outputs.cost-usd }}\n          F: ${{ steps.ralph.outputs.branch }}\n          G: ${{ steps.ralph.outputs.resume-at }}\n          H: ${{ steps.ralph.outputs.unpushed-commits }}\n",
        )
        .unwrap();
        run(Command::new(&actionlint)
            .arg(".github/workflows/probe.yml")
            .current_dir(dir.path()))
    };
    let _ = run(Command::new("git")
        .args(["init", "-q"])
        .current_dir(dir.path()));
    let out = probe(&action);
    assert!(out.status.success(), "action.yml: {}", text(&out));
    // The probe can fail: an action without `runs.using` is caught.
    let broken = action.replace("  using: composite\n", "");
    assert!(
        !probe(&broken).status.success(),
        "actionlint missed a broken action.yml"
    );
    let out = run(Command::new(&actionlint)
        .arg(manifest().join("deploy/github/ralph-prds.yml"))
        .current_dir(manifest()));
    assert!(out.status.success(), "ralph-prds.yml: {}", text(&out));
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let out =
        run(Command::new(linter("hadolint")).arg(manifest().join("deploy/docker/Dockerfile")));
    assert!(out.status.success(), "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("Dockerfile");
    std::fs::write(&bad, "FROM debian\nRUN cd /tmp && apt-get install curl\n").unwrap();
    assert!(!run(Command::new(linter("hadolint")).arg(&bad))
        .status
        .success());
}

#[test]
fn the_kubernetes_manifests_validate_against_the_api_schema() {
    let validate = linter("kubernetes-validate");
    for file in ["ralph-prds.yaml"] {
        let p = manifest().join("deploy/kubernetes").join(file);
        for version in ["1.31", "1.33"] {
            let out = run(Command::new(&validate)
                .args(["--strict", "-k", version])
                .arg(&p));
            assert!(out.status.success(), "{file} on {version}: {}", text(&out));
        }
        // A misspelt field is caught (the validator is not vacuous).
        let text_ = std::fs::read_to_string(&p).unwrap();
        let bad = text_.replacen("backoffLimitPerIndex", "backofLimitPerIndex", 1);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), bad).unwrap();
        let out = run(Command::new(&validate)
            .args(["--strict", "-k", "1.33"])
            .arg(dir.path().join(file)));
        assert!(!out.status.success(), "{file}: a misspelt field passed");
    }
    // The Job's grace period holds ralph's shutdown timeout (its failure policy is checked
    // against ralph's exit codes in books.rs).
    let job =
        std::fs::read_to_string(manifest().join("deploy/kubernetes/ralph-prds.yaml")).unwrap();
    assert!(job.contains("terminationGracePeriodSeconds: 30"));
    assert!(job.contains("value: 25s"));
}

#[test]
fn the_integration_scripts_pass_shellcheck() {
    let files = [
        "deploy/job/ralph-job.sh",
        "deploy/slurm/ralph-array.sbatch",
        "deploy/github/install-ralph.sh",
        "deploy/github/install-agent.sh",
        "deploy/github/run.sh",
        "scripts/slurm-local.sh",
        "scripts/install-slurm.sh",
        "scripts/install-linters.sh",
        "scripts/install-test-deps.sh",
        "scripts/test.sh",
    ];
    let out = run(Command::new(linter("shellcheck"))
        .args(files.iter().map(|f| manifest().join(f)))
        .current_dir(manifest()));
    assert!(out.status.success(), "{}", text(&out));
}
