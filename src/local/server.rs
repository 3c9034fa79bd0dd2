//! [`LocalServer`]: llama.cpp's HTTP server (through the `xllamacpp` wheel) on 127.0.0.1 for one
//! run, with OpenAI-compatible `/v1/chat/completions`.
//!
//! No server may outlive ralph, whatever way ralph ends: the server runs as a
//! [`crate::process::Service`] (its own process group with `PR_SET_PDEATHSIG(SIGKILL)` on Linux),
//! its launcher also exits when its parent changes, [`LocalServer::stop`] ends the group
//! (SIGTERM, 3 s, SIGKILL) and dropping a [`LocalServer`] that was not stopped SIGKILLs the group
//! at once. [`LocalServer::pgid`] lets the caller record the group so a later ralph can kill it
//! after a crash ([`crate::process::kill_group`]). This file only says what to run and reads the
//! result; process/ spawns and kills.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::process::{ProcessError, Service, SpawnSpec};

use super::setup::cache_dir;

/// The launcher script, run with the venv's Python (`templates/llama_server.py`).
const LAUNCHER: &str = include_str!("../../templates/llama_server.py");

/// How long [`LocalServer::stop`] waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How often readiness is polled while the model loads.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// Attempts at starting when the chosen port was taken between picking and binding.
const PORT_ATTEMPTS: usize = 3;

/// Lines of the server log quoted in errors.
const LOG_TAIL_LINES: usize = 15;

/// How the server is started.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// CPU threads for prompt processing and generation (llama.cpp `n_threads`). Default 2.
    pub threads: u32,
    /// Context window in tokens (llama.cpp `n_ctx`), one slot. Default 4096.
    pub ctx: u32,
    /// Where the server's stdout and stderr go, truncated at start; the launcher script
    /// `llama_server.py` is written to the same folder. Default `<cache>/server-<pid>.log`
    /// ([`cache_dir`], ralph's process id): two ralphs sharing the cache must not write into one
    /// file. Logs of the default name older than a day are deleted when a server starts.
    pub log_file: PathBuf,
    /// How long to wait for `GET /health` to answer 200 (model loaded). Default 120 s.
    pub ready_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            threads: 2,
            ctx: 4096,
            log_file: cache_dir().join(format!("server-{}.log", std::process::id())),
            ready_timeout: Duration::from_secs(120),
        }
    }
}

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file-system or socket operation failed before the server ran.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `write the launcher`.
        action: &'static str,
        /// The file concerned (empty for the port probe).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The venv's Python could not be started.
    #[error(
        "cannot start the local model server with {python}: {source}\nhint: run \
         scripts/setup-local-model.sh (or let ralph set up the local model again) to recreate \
         the virtualenv"
    )]
    Spawn {
        /// The Python that was run.
        python: PathBuf,
        /// Why it could not start.
        #[source]
        source: ProcessError,
    },
    /// The server process ended before it was ready.
    #[error(
        "the local model server exited before it was ready ({status}); the end of its log \
         {log}:\n{log_tail}\nhint: check that the model file is a llama.cpp GGUF and that the \
         machine has enough free memory (about 2.5 GB for the default model, 1 GB for the small one)"
    )]
    Exited {
        /// How it ended, e.g. `exit code 1`.
        status: String,
        /// The log file.
        log: PathBuf,
        /// Its last lines.
        log_tail: String,
    },
    /// `/health` did not answer 200 in time; the server has been killed.
    #[error(
        "the local model server did not become ready within {seconds} s; the end of its log \
         {log}:\n{log_tail}\nhint: a slow or busy machine may need more time; or use \
         `--base-url` with a server you start yourself"
    )]
    NotReady {
        /// The timeout, in seconds.
        seconds: u64,
        /// The log file.
        log: PathBuf,
        /// Its last lines.
        log_tail: String,
    },
}

/// A running llama.cpp server on 127.0.0.1. Stop it with [`LocalServer::stop`]; dropping it
/// SIGKILLs it.
#[derive(Debug)]
pub struct LocalServer {
    /// The server process; dropping it SIGKILLs its group.
    service: Service,
    port: u16,
    log_file: PathBuf,
}

impl LocalServer {
    /// Starts the server for `model_file` with `python` (a Python that imports `xllamacpp`, e.g.
    /// [`super::LocalModel::python`]) and waits until `GET /health` answers 200.
    ///
    /// Picks a free port on 127.0.0.1 (bind port 0, read it, release it; when the server then
    /// finds it taken, another port is tried, 3 attempts in all), writes the launcher to
    /// `llama_server.py` next to `opts.log_file` (by default in the cache folder), and starts it
    /// in its own process group with `PR_SET_PDEATHSIG(SIGKILL)`, output to `opts.log_file`.
    /// The death signal fires when the
    /// *thread* that spawned the child exits, so await this on a thread that lives as long as the
    /// server should (a tokio worker or the main thread, never `spawn_blocking`).
    /// Loading takes about 2 s for the small model and 3–8 s for the default one on 2 cores.
    ///
    /// # Errors
    /// [`ServerError::Io`] (cache folder, launcher or log file, port probe);
    /// [`ServerError::Spawn`] when `python` cannot run; [`ServerError::Exited`] when the server
    /// ends before it is ready (bad model file, out of memory), with the log's tail;
    /// [`ServerError::NotReady`] after `opts.ready_timeout` (the server is killed).
    pub async fn start(
        python: &Path,
        model_file: &Path,
        opts: ServerOptions,
    ) -> Result<LocalServer, ServerError> {
        // reqwest is built without a default TLS provider (see Cargo.toml); plain HTTP needs
        // none, but building a client requires one to be installed. A second install is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = match opts.log_file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let launcher = write_launcher(&dir)?;
        prune_old_logs(&dir, Duration::from_secs(24 * 3600));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .no_proxy()
            .build()
            .map_err(|e| ServerError::Io {
                action: "build an HTTP client for",
                path: PathBuf::from("/health"),
                source: io::Error::other(e),
            })?;
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            let server = Self::spawn(python, &launcher, model_file, port, &opts)?;
            match server.wait_ready(&client, &opts).await {
                Ok(server) => return Ok(server),
                Err(ServerError::Exited { log, .. })
                    if attempt < PORT_ATTEMPTS
                        && fs::read(&log)
                            .is_ok_and(|l| port_was_taken(&String::from_utf8_lossy(&l))) =>
                {
                    tracing::debug!(
                        port,
                        "port taken before the local server bound it; retrying"
                    );
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Spawns the launcher; the returned value kills the group if dropped.
    fn spawn(
        python: &Path,
        launcher: &Path,
        model_file: &Path,
        port: u16,
        opts: &ServerOptions,
    ) -> Result<LocalServer, ServerError> {
        let log =
            File::create(&opts.log_file).map_err(io_err("create the log file", &opts.log_file))?;
        let log_err = log
            .try_clone()
            .map_err(io_err("open the log file", &opts.log_file))?;
        let spec = SpawnSpec {
            program: python.to_owned(),
            args: vec![
                launcher.to_string_lossy().into_owned(),
                "--model".to_owned(),
                model_file.to_string_lossy().into_owned(),
                "--port".to_owned(),
                port.to_string(),
                "--threads".to_owned(),
                opts.threads.to_string(),
                "--ctx".to_owned(),
                opts.ctx.to_string(),
            ],
            env_set: vec![("PYTHONUNBUFFERED".to_owned(), "1".to_owned())],
            ..SpawnSpec::default()
        };
        let service = Service::start(&spec, log, log_err).map_err(|source| ServerError::Spawn {
            python: python.to_owned(),
            source,
        })?;
        tracing::debug!(pgid = service.pgid(), port, "local model server started");
        Ok(LocalServer {
            service,
            port,
            log_file: opts.log_file.clone(),
        })
    }

    /// Polls `/health` until 200, the child exits, or the timeout passes (then kills it).
    async fn wait_ready(
        mut self,
        client: &reqwest::Client,
        opts: &ServerOptions,
    ) -> Result<LocalServer, ServerError> {
        let deadline = Instant::now() + opts.ready_timeout;
        let url = format!("http://127.0.0.1:{}/health", self.port);
        loop {
            if let Some(exit) = self.service.try_exit() {
                return Err(ServerError::Exited {
                    status: exit.to_string(),
                    log: self.log_file.clone(),
                    log_tail: log_tail(&self.log_file),
                });
            }
            // 503 while the model loads, connection refused before the socket listens.
            if let Ok(response) = client.get(&url).send().await {
                if response.status() == reqwest::StatusCode::OK {
                    return Ok(self);
                }
            }
            if Instant::now() >= deadline {
                self.service.kill_now();
                return Err(ServerError::NotReady {
                    seconds: opts.ready_timeout.as_secs(),
                    log: self.log_file.clone(),
                    log_tail: log_tail(&self.log_file),
                });
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }

    /// The OpenAI-compatible base URL, `http://127.0.0.1:<port>/v1` (append
    /// `/chat/completions`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process group id (= its pid), for recording so a later ralph can kill an
    /// orphaned server ([`crate::process::kill_group`]).
    pub fn pgid(&self) -> i32 {
        self.service.pgid()
    }

    /// The file receiving the server's output.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Stops the server: SIGTERM to its group, up to 3 s to exit, then SIGKILL; returns once no
    /// live process of the group is left (or about 2 s after the SIGKILL), with the child reaped.
    /// Dropping a server instead SIGKILLs its group at once.
    pub async fn stop(self) {
        self.service.stop(STOP_GRACE).await;
    }
}

/// Writes the launcher to `<dir>/llama_server.py` unless it is already there with this content;
/// atomically (temp file + rename), since two ralphs may start at once.
fn write_launcher(dir: &Path) -> Result<PathBuf, ServerError> {
    let path = dir.join("llama_server.py");
    if fs::read_to_string(&path).is_ok_and(|text| text == LAUNCHER) {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(io_err("create the folder", dir))?;
    crate::fsutil::write_atomic(&path, LAUNCHER.as_bytes())
        .map_err(io_err("write the launcher", &path))?;
    Ok(path)
}

/// Deletes `server-<pid>.log` files in `dir` not modified for `age` (best effort).
fn prune_old_logs(dir: &Path, age: Duration) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("server-") && name.ends_with(".log")) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> Result<u16, ServerError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(io_err("bind a free port on", Path::new("127.0.0.1")))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(io_err("read the free port of", Path::new("127.0.0.1")))
}

/// Whether the server's log says its port was taken (llama.cpp logs "couldn't bind HTTP server
/// socket, hostname: …, port: …").
fn port_was_taken(log_tail: &str) -> bool {
    let text = log_tail.to_ascii_lowercase();
    text.contains("address already in use") || text.contains("couldn't bind")
}

/// The last [`LOG_TAIL_LINES`] non-empty lines of the log (read from its last 16 KiB).
fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    let read = File::open(path).and_then(|mut file| {
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(err) = read {
        return format!("(could not read the log: {err})");
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ServerError + 'a {
    move |source| ServerError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in for the venv's Python: a shell script run as `<script> <launcher> --model M
    /// --port P --threads T --ctx C`, so `$5` is the port.
    fn fake_python(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("fake-python");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn options(dir: &Path, ready_timeout: Duration) -> ServerOptions {
        ServerOptions {
            log_file: dir.join("logs").join("server.log"),
            ready_timeout,
            ..ServerOptions::default()
        }
    }

    /// Serves 200 on every path at 127.0.0.1:$5, like a loaded llama.cpp server's /health.
    const HEALTHY: &str = r#"echo $$ > "$(dirname "$0")/pid"
exec python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{\"status\":\"ok\"}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
' "$5""#;

    fn wait_gone(pgid: i32) -> bool {
        for _ in 0..100 {
            if !crate::process::group_alive(pgid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        false
    }

    #[test]
    fn each_ralph_logs_to_its_own_file_and_old_logs_are_pruned() {
        let name = ServerOptions::default().log_file;
        assert!(
            name.ends_with(format!("server-{}.log", std::process::id())),
            "{}",
            name.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("server-1.log");
        let new = dir.path().join("server-2.log");
        let other = dir.path().join("notes.log");
        for file in [&old, &new, &other] {
            fs::write(file, "x").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
        for file in [&old, &other] {
            File::options()
                .write(true)
                .open(file)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        prune_old_logs(dir.path(), Duration::from_secs(24 * 3600));
        assert!(!old.exists() && new.exists() && other.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_healthy_server_is_reported_ready_and_stop_ends_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path(), HEALTHY);
        let opts = options(dir.path(), Duration::from_secs(20));
        let server = LocalServer::start(&python, Path::new("m.gguf"), opts)
            .await
            .unwrap();
        assert_eq!(
            server.base_url(),
            format!("http://127.0.0.1:{}/v1", server.port())
        );
        assert!(server.log_file().ends_with("logs/server.log"));
        assert_eq!(
            fs::read_to_string(dir.path().join("logs/llama_server.py")).unwrap(),
            LAUNCHER
        );
        let pgid = server.pgid();
        assert!(crate::process::group_alive(pgid));
        server.stop().await;
        assert!(
            !crate::process::group_alive(pgid),
            "stop left the group alive"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_a_server_kills_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path(), HEALTHY);
        let opts = options(dir.path(), Duration::from_secs(20));
        let server = LocalServer::start(&python, Path::new("m.gguf"), opts)
            .await
            .unwrap();
        let pgid = server.pgid();
        drop(server);
        assert!(wait_gone(pgid), "drop left the group alive");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_port_taken_before_the_server_binds_it_is_retried_with_another() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            r#"count="$(dirname "$0")/count"; n=$(cat "$count" 2>/dev/null || echo 0)
echo $((n + 1)) > "$count"
if [ "$n" = 0 ]; then echo "E srv start: couldn't bind HTTP server socket, port: $5"; exit 1; fi
{HEALTHY}"#
        );
        let python = fake_python(dir.path(), &body);
        let opts = options(dir.path(), Duration::from_secs(20));
        let server = LocalServer::start(&python, Path::new("m.gguf"), opts)
            .await
            .unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("count")).unwrap(), "2\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_server_that_exits_early_fails_with_its_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(
            dir.path(),
            "echo 'loading model'; echo 'bad magic' >&2; exit 3",
        );
        let err = LocalServer::start(
            &python,
            Path::new("m.gguf"),
            options(dir.path(), Duration::from_secs(20)),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ServerError::Exited { .. }), "{text}");
        assert!(text.contains("exit code 3"), "{text}");
        assert!(text.contains("loading model\nbad magic"), "{text}");
    }

    #[tokio::test]
    async fn a_server_that_never_gets_ready_is_killed_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(
            dir.path(),
            r#"echo $$ > "$(dirname "$0")/pid"; echo still loading; exec sleep 60"#,
        );
        let started = std::time::Instant::now();
        let err = LocalServer::start(
            &python,
            Path::new("m.gguf"),
            options(dir.path(), Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let text = err.to_string();
        assert!(
            matches!(err, ServerError::NotReady { seconds: 1, .. }),
            "{text}"
        );
        assert!(text.contains("still loading"), "{text}");
        let pid: i32 = fs::read_to_string(dir.path().join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_gone(pid), "the unready server was left running");
    }

    #[tokio::test]
    async fn a_missing_python_is_a_spawn_error_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = LocalServer::start(
            &dir.path().join("no-python"),
            Path::new("m.gguf"),
            options(dir.path(), Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ServerError::Spawn { .. }), "{text}");
        assert!(text.contains("scripts/setup-local-model.sh"), "{text}");
    }

    #[test]
    fn port_conflicts_are_recognised_in_the_log() {
        assert!(port_was_taken(
            "srv    init: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 4000"
        ));
        assert!(port_was_taken("bind: Address already in use"));
        assert!(!port_was_taken("llama_model_load: error loading model"));
    }

    #[test]
    fn the_log_tail_keeps_the_last_non_empty_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let text: String = (1..=40).map(|i| format!("line {i}\n\n")).collect();
        fs::write(&log, text).unwrap();
        let tail = log_tail(&log);
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert!(tail.starts_with("line 26\nline 27"), "{tail}");
        assert!(tail.ends_with("line 40"), "{tail}");
        assert!(log_tail(&dir.path().join("none")).starts_with("(could not read the log"));
    }
}
