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
    assert!(out.contains("ANTHROPIC_API_KEY is set"), "{out}");

    let (_, out) = doctor(
        tmp.path(),
        &bin,
        &["--agent", "claude"],
        &[("IS_SANDBOX", "1")],
    );
    assert!(!out.contains("without IS_SANDBOX"), "{out}");
    assert!(!out.contains("ANTHROPIC_API_KEY"), "{out}");
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
