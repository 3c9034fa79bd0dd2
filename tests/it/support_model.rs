//! Test support for runs against the real Claude Code CLI and `ralph-scripted-model`.
//!
//! It owns the harness shape described in `testing/README-model.md`:
//!
//! * [`claude_bin_or_skip`] finds the pinned CLI (`RALPH_CLAUDE_BIN`, else
//!   `<crate>/.tools/claude/node_modules/.bin/claude`, installed by `scripts/install-claude.sh`);
//!   a missing CLI fails the test, except outside CI with `RALPH_SKIP_REAL_CLI=1`.
//! * [`hermetic_env`] gives every run its own HOME and TMPDIR, a dummy API key, the settings that
//!   stop the CLI from phoning home, and a git that ignores the host's configuration.
//! * [`with_scripted_model`] wraps a command so that `ralph-scripted-model` serves while it runs
//!   (in the same process tree, hence the same network namespace), and [`isolated`] wraps that in
//!   `unshare -n` when the kernel allows it, so nothing can leave the machine.
//! * [`ScriptedModel`] runs the server on its own (for tests whose client is not isolated) and
//!   stops it on drop.

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// Path of the scripted model binary built for this test run.
pub const SCRIPTED_MODEL: &str = env!("CARGO_BIN_EXE_ralph-scripted-model");

/// The fixed identity and date of every commit made in a hermetic run (git CLI). ralph's own
/// commits through libgit2 take the identity from the repository's config, set by
/// [`init_repo_from_example`].
pub const GIT_NAME: &str = "Ralph Test";
/// See [`GIT_NAME`].
pub const GIT_EMAIL: &str = "ralph-test@example.invalid";
/// See [`GIT_NAME`]; ISO 8601, UTC.
pub const GIT_DATE: &str = "2026-01-01T00:00:00+00:00";

/// The crate root (where `examples/`, `scripts/` and `.tools/` live).
pub fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The example project `examples/<name>` (e.g. `textkit`).
pub fn example_dir(name: &str) -> PathBuf {
    crate_root().join("examples").join(name)
}

/// Whether this looks like a CI run (`CI` set to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// The real `<cli>` executable (`claude`, `codex`, `opencode`, `gemini`) to test with, or `None`
/// when the test should return early.
///
/// Looks at `RALPH_<CLI>_BIN`, then `<crate>/.tools/<cli>/node_modules/.bin/<cli>` (where
/// `scripts/install-<cli>.sh` puts the pinned version). Returns `None` (after printing that `test`
/// was skipped) only when the CLI is missing, `RALPH_SKIP_REAL_CLI=1` is set and `CI` is not.
///
/// # Panics
/// When `RALPH_<CLI>_BIN` names a missing file, or the CLI is missing under CI, or missing
/// locally without `RALPH_SKIP_REAL_CLI=1`; the message names the install script.
pub fn real_cli_or_skip(cli: &str, test: &str) -> Option<PathBuf> {
    let var = format!("RALPH_{}_BIN", cli.to_ascii_uppercase());
    let script = format!("scripts/install-{cli}.sh");
    if let Some(bin) = std::env::var_os(&var).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "{var}={} does not exist; run {script} or unset it",
            bin.display()
        );
        return Some(bin);
    }
    let bin = crate_root().join(format!(".tools/{cli}/node_modules/.bin/{cli}"));
    if bin.exists() {
        return Some(bin);
    }
    let skip = std::env::var("RALPH_SKIP_REAL_CLI").is_ok_and(|v| v == "1");
    if skip && !in_ci() {
        eprintln!(
            "skipping {test}: the real {cli} CLI is not installed at {} and \
             RALPH_SKIP_REAL_CLI=1 asks to skip (run {script} to run it)",
            bin.display()
        );
        return None;
    }
    panic!(
        "{test} needs the real {cli} CLI, which is not installed at {} (nor named by {var}): \
         run {script}; set RALPH_SKIP_REAL_CLI=1 to opt out locally{}",
        bin.display(),
        if in_ci() {
            " (RALPH_SKIP_REAL_CLI is ignored under CI)"
        } else {
            ""
        }
    );
}

/// [`real_cli_or_skip`] for claude.
pub fn claude_bin_or_skip(test: &str) -> Option<PathBuf> {
    real_cli_or_skip("claude", test)
}

/// Configures `cmd` for a hermetic, offline run of the real CLI (and of ralph and git under it)
/// with its state in `sandbox` (created if needed): `sandbox/home` is HOME and the XDG dirs,
/// `sandbox/tmp` is TMPDIR.
///
/// Inherited `ANTHROPIC_*`, `CLAUDE*`, `GIT_*` and `RALPH_*` variables are removed first (unless
/// already set on `cmd`), so neither a developer's login, nor a git hook's `GIT_DIR`, nor their
/// ralph settings leak in.
/// `ANTHROPIC_BASE_URL` is left to [`with_scripted_model`] (or set it yourself).
///
/// # Panics
/// When the sandbox directories cannot be created.
pub fn hermetic_env(cmd: &mut Command, sandbox: &Path) {
    let home = sandbox.join("home");
    let tmp = sandbox.join("tmp");
    for dir in [&home, &tmp] {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    }
    // Variables the caller already set on `cmd` (e.g. RALPH_AGENT_PROGRAM) are kept.
    let explicit: Vec<std::ffi::OsString> = cmd.get_envs().map(|(k, _)| k.to_owned()).collect();
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if ["ANTHROPIC_", "CLAUDE", "GIT_", "RALPH_"]
            .iter()
            .any(|p| k.starts_with(p))
            && !explicit.contains(&key)
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env("HOME", &home)
        .env("TMPDIR", &tmp)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        // Claude Code against a loopback model, offline, as root (see testing/README-model.md).
        .env("ANTHROPIC_API_KEY", "dummy")
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "1")
        // git: no host configuration (signing, hooks paths, aliases), fixed identity and dates.
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", GIT_NAME)
        .env("GIT_AUTHOR_EMAIL", GIT_EMAIL)
        .env("GIT_COMMITTER_NAME", GIT_NAME)
        .env("GIT_COMMITTER_EMAIL", GIT_EMAIL)
        .env("GIT_AUTHOR_DATE", GIT_DATE)
        .env("GIT_COMMITTER_DATE", GIT_DATE)
        // The example's tests must not leave __pycache__ behind.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_COLOR", "1");
}

/// Copies `from` into `dest` (which must not exist yet) as a new git repository on branch
/// `main` with one commit, leaving out `scenario.json` (the scripted model's script is not part
/// of the project). The repository's own config gets [`GIT_NAME`]/[`GIT_EMAIL`], which both
/// the git CLI and libgit2 read.
///
/// # Panics
/// When copying or a git command fails.
pub fn init_repo_from_example(from: &Path, dest: &Path, sandbox: &Path) {
    assert!(!dest.exists(), "{} already exists", dest.display());
    fs::create_dir_all(dest).unwrap_or_else(|e| panic!("create {}: {e}", dest.display()));
    let status = Command::new("cp")
        .arg("-R")
        .arg(from.join("."))
        .arg(dest)
        .status()
        .unwrap_or_else(|e| panic!("run cp: {e}"));
    assert!(
        status.success(),
        "cp -R {} {} failed",
        from.display(),
        dest.display()
    );
    let scenario = dest.join("scenario.json");
    if scenario.exists() {
        fs::remove_file(&scenario).unwrap_or_else(|e| panic!("remove {}: {e}", scenario.display()));
    }
    git(dest, sandbox, &["init", "-q", "-b", "main"]);
    git(dest, sandbox, &["config", "user.name", GIT_NAME]);
    git(dest, sandbox, &["config", "user.email", GIT_EMAIL]);
    git(dest, sandbox, &["add", "-A"]);
    git(dest, sandbox, &["commit", "-q", "-m", "Initial commit"]);
}

/// Runs `git <args>` in `repo` with the hermetic env and returns its stdout.
///
/// # Panics
/// When git cannot start or exits non-zero (the message has its stderr).
pub fn git(repo: &Path, sandbox: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("git");
    cmd.args(args).current_dir(repo);
    hermetic_env(&mut cmd, sandbox);
    let out = cmd.output().unwrap_or_else(|e| panic!("run git: {e}"));
    assert!(
        out.status.success(),
        "git {args:?} in {} failed: {}",
        repo.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A copy of `cmd` (program, arguments, env changes, working directory) with a different
/// program and arguments in front of it: `front_program front_args… program args…`.
fn prefixed(cmd: &Command, front_program: &OsStr, front_args: &[&OsStr]) -> Command {
    let mut wrapped = Command::new(front_program);
    wrapped
        .args(front_args)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => wrapped.env(key, v),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Wraps `cmd` so that `ralph-scripted-model --scenario <scenario> --log <log>` serves on an
/// ephemeral 127.0.0.1 port while `cmd` runs, with `ANTHROPIC_BASE_URL` pointing at it; the
/// wrapper exits with `cmd`'s status and forwards SIGTERM to it. Env and working directory are
/// kept.
pub fn with_scripted_model(cmd: &Command, scenario: &Path, log: &Path) -> Command {
    prefixed(
        cmd,
        OsStr::new(SCRIPTED_MODEL),
        &[
            OsStr::new("--scenario"),
            scenario.as_os_str(),
            OsStr::new("--log"),
            log.as_os_str(),
            OsStr::new("--"),
        ],
    )
}

/// The `unshare` flag that gives a private network namespace with a working loopback here:
/// `-n` (root), else `-rn` (an unprivileged user namespace, mapped to root inside), else `None`.
/// Probed once per test run; `RALPH_TEST_NETNS=0` forces `None`, e.g. to trace a run from
/// outside.
pub fn netns_flag() -> Option<&'static str> {
    static PROBE: OnceLock<Option<&'static str>> = OnceLock::new();
    *PROBE.get_or_init(|| {
        if std::env::var("RALPH_TEST_NETNS").is_ok_and(|v| v == "0") {
            return None;
        }
        ["-n", "-rn"].into_iter().find(|flag| {
            Command::new("unshare")
                .args([flag, "sh", "-c", "ip link set lo up"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// How a real-CLI test may run, from the namespace probe ([`netns_flag`]) and whether this is
/// CI ([`in_ci`]): `Ok(Some(flag))` isolated; `Ok(None)` online, allowed only outside CI (with a
/// note on stderr); `Err` under CI when the network cannot be cut, naming how to fix it, so that
/// a CI run never reaches a real API by accident and never passes on a hidden note.
pub fn isolation(flag: Option<&'static str>, ci: bool) -> Result<Option<&'static str>, String> {
    match (flag, ci) {
        (Some(flag), _) => Ok(Some(flag)),
        (None, false) => Ok(None),
        (None, true) => Err(
            "the real-CLI tests must run without network under CI=true, but neither `unshare -n` \
             nor `unshare -rn` could create a network namespace with a loopback here (or \
             RALPH_TEST_NETNS=0 was set): run the tests as root or allow unprivileged user \
             namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu \
             kernel.apparmor_restrict_unprivileged_userns=0), and install util-linux and \
             iproute2 (scripts/install-test-deps.sh does)"
                .to_string(),
        ),
    }
}

/// `cmd` run in a fresh network namespace holding only a loopback interface
/// (`unshare -n sh -c 'ip link set lo up && exec "$@"' sh cmd…`) when [`netns_flag`] finds a
/// way; otherwise, outside CI, `cmd` unchanged (as a copy run through `env`) with a note, and
/// under CI a panic naming the fix ([`isolation`]). Anything that talks to `cmd` over the
/// network must run inside it too: wrap with [`with_scripted_model`] first.
pub fn isolated(cmd: &Command) -> Command {
    let flag = match isolation(netns_flag(), in_ci()) {
        Ok(Some(flag)) => flag,
        Ok(None) => {
            eprintln!(
                "note: cannot cut the network here (unshare -n and -rn failed, or \
                 RALPH_TEST_NETNS=0); running WITHOUT network isolation (under CI=true this \
                 fails instead)"
            );
            return prefixed(cmd, OsStr::new("env"), &[]);
        }
        Err(why) => panic!("{why}"),
    };
    prefixed(
        cmd,
        OsStr::new("unshare"),
        &[
            OsStr::new(flag),
            OsStr::new("sh"),
            OsStr::new("-c"),
            OsStr::new(r#"ip link set lo up && exec "$@""#),
            OsStr::new("sh"),
        ],
    )
}

/// The end of a command run by [`run_with_deadline`].
pub struct RunOutput {
    /// Exit status (`None` when the deadline passed and the run was killed).
    pub status: Option<ExitStatus>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// A file whose tail is worth showing on failure (e.g. the model's request log).
    pub extra_log: Option<PathBuf>,
}

impl RunOutput {
    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl fmt::Display for RunOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(s) => writeln!(f, "status: {s}")?,
            None => writeln!(f, "status: killed at the deadline")?,
        }
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        writeln!(f, "--- stderr ---\n{}", self.stderr)?;
        if let Some(log) = &self.extra_log {
            let text = fs::read_to_string(log).unwrap_or_else(|e| format!("(unreadable: {e})"));
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            writeln!(f, "--- {} (last {} lines) ---", log.display(), tail.len())?;
            for line in tail.into_iter().rev() {
                writeln!(f, "{line}")?;
            }
        }
        Ok(())
    }
}

/// Runs `cmd` with stdin closed and stdout/stderr captured in files under `out_dir`, in its own
/// process group; past `deadline` the whole group gets SIGTERM, then SIGKILL 5 s later.
///
/// # Panics
/// When `cmd` cannot start or the capture files cannot be created or read.
pub fn run_with_deadline(mut cmd: Command, out_dir: &Path, deadline: Duration) -> RunOutput {
    fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("create {}: {e}", out_dir.display()));
    let out_path = out_dir.join("stdout.txt");
    let err_path = out_dir.join("stderr.txt");
    let file =
        |p: &Path| fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    cmd.stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
    let status = wait_or_kill_group(&mut child, deadline);
    let read = |p: &Path| {
        let bytes = fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        String::from_utf8_lossy(&bytes).into_owned()
    };
    RunOutput {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
        extra_log: None,
    }
}

/// Waits for `child` (a process-group leader) until `deadline`; then kills its group.
fn wait_or_kill_group(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() < deadline => thread_sleep(),
            Ok(None) | Err(_) => break,
        }
    }
    let pgid = Pid::from_raw(child.id() as i32);
    let _ = killpg(pgid, Signal::SIGTERM);
    let grace = Instant::now();
    while grace.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        thread_sleep();
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    let _ = child.wait();
    None
}

fn thread_sleep() {
    std::thread::sleep(Duration::from_millis(50));
}

/// A `ralph-scripted-model` child serving on an ephemeral 127.0.0.1 port, in the test's own
/// network namespace. Dropping it sends SIGTERM and waits (SIGKILL after 5 s).
pub struct ScriptedModel {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl ScriptedModel {
    /// Starts the server for `scenario`, with its port file and request log
    /// (`model-log.jsonl`) in `dir`, and waits (at most 20 s) until it listens.
    ///
    /// # Panics
    /// When the server cannot start, exits early (its stderr is in the message) or does not
    /// report a port in time.
    pub fn start(scenario: &Path, dir: &Path) -> ScriptedModel {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let port_file = dir.join("model.port");
        let log = dir.join("model-log.jsonl");
        let stderr_path = dir.join("model-stderr.txt");
        let stderr = fs::File::create(&stderr_path)
            .unwrap_or_else(|e| panic!("create {}: {e}", stderr_path.display()));
        let mut child = Command::new(SCRIPTED_MODEL)
            .arg("--scenario")
            .arg(scenario)
            .args(["--port", "0", "--port-file"])
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {SCRIPTED_MODEL}: {e}"));
        let start = Instant::now();
        let port = loop {
            if let Some(port) = fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse::<u16>().ok())
            {
                break port;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "ralph-scripted-model exited early ({status}): {}",
                    fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ralph-scripted-model did not write {} within 20 s",
                    port_file.display()
                );
            }
            thread_sleep();
        };
        ScriptedModel { child, port, log }
    }

    /// The TCP port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`: the value for `ANTHROPIC_BASE_URL` (no `/v1`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// The request log so far, one JSON value per request.
    ///
    /// # Panics
    /// When the log holds a line that is not JSON.
    pub fn log_entries(&self) -> Vec<Value> {
        read_jsonl(&self.log)
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread_sleep();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON values of a JSONL file (empty when the file does not exist).
///
/// # Panics
/// When a non-empty line is not JSON.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", path.display()))
        })
        .collect()
}

/// Sends one HTTP/1.1 request to `base_url` (`http://host:port`, as from
/// [`ScriptedModel::base_url`]) and returns `(status, body)`.
///
/// # Errors
/// Connection or I/O errors, or a base URL that is not `http://host:port`.
pub fn http(base_url: &str, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let authority = base_url
        .strip_prefix("http://")
        .map(|a| a.trim_end_matches('/'))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not http://host:port: {base_url}"),
            )
        })?;
    let mut stream = TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[test]
fn scripted_model_serves_the_scripted_turn_logs_it_and_stops_on_drop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = example_dir("textkit").join("scenario.json");
    let model = ScriptedModel::start(&scenario, dir.path());
    let pid = Pid::from_raw(model.child.id() as i32);

    let request = serde_json::json!({
        "model": "claude-test",
        "system": [{"type": "text", "text": "Primary working directory: /w/textkit\nmore"}],
        "messages": [{"role": "user", "content": "Story ID: US-002\nImplement it."}]
    });
    let (status, body) = http(
        &model.base_url(),
        "POST",
        "/v1/messages?beta=true",
        &request.to_string(),
    )
    .expect("POST /v1/messages");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("event: message_start"), "{body}");
    assert!(body.contains(r#""name":"Write""#), "{body}");
    assert!(
        body.contains("/w/textkit/textkit/words.py"),
        "{{repo}} substituted: {body}"
    );
    assert!(body.contains(r#""stop_reason":"tool_use""#), "{body}");

    let (status, body) =
        http(&model.base_url(), "POST", "/v2/unknown", "{}").expect("POST unknown");
    assert_eq!(status, 404);
    assert!(body.contains("no route for POST /v2/unknown"), "{body}");

    let log = model.log_entries();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0]["story"], "US-002");
    assert_eq!(log[0]["step"], 0);
    assert_eq!(log[0]["reply"], "tool_use");
    assert_eq!(log[1]["reply"], "not_found");

    drop(model);
    // The pid is reaped by the drop, so signal 0 must now fail.
    assert!(kill(pid, None).is_err(), "the server outlived its guard");
}
