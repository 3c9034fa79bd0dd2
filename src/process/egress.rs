//! `--sandbox strict`'s network: an egress proxy owned by ralph ([`Egress`]) on a unix socket
//! of the host, and the bridge ([`bridge`], `ralph __bridge`) that runs inside the sandbox's
//! network namespace (only loopback) and carries the agent's connections to it.
//!
//! The proxy speaks HTTP proxy: `CONNECT host:port` (HTTPS, any TLS: the proxy never sees
//! inside) and plain HTTP forwarding (`GET http://host/path`, sent on as `GET /path` with
//! `Connection: close`). A host not on the allowlist gets `403` and is recorded
//! ([`Egress::take_refused`]). Inside, the bridge listens on `127.0.0.1:`[`PROXY_PORT`] (where
//! `HTTPS_PROXY` points) and on each forwarded loopback port (a model server on the host's
//! loopback: the agent's base URL stays `http://127.0.0.1:<port>`), then starts the agent and
//! exits with its status.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::sandbox::{PROXY_PORT, PROXY_SOCKET};

/// The longest request head the proxy reads, in bytes.
const MAX_HEAD: usize = 16 * 1024;

/// The allowlist, shared with the connections in flight.
type Allow = Arc<Mutex<Vec<String>>>;

/// A running egress proxy (see the module docs). Stops when dropped (its socket directory is
/// removed).
#[derive(Debug)]
pub struct Egress {
    dir: tempfile::TempDir,
    allow: Allow,
    refused: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Egress {
    /// Starts the proxy on a new unix socket in a private directory of the host's temporary
    /// directory, allowing `hosts` (`host`: any port; `host:port`; `*.domain`). Must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    /// The socket could not be created.
    pub fn start(hosts: Vec<String>) -> io::Result<Egress> {
        let dir = tempfile::Builder::new().prefix("ralph-egress-").tempdir()?;
        let listener = UnixListener::bind(dir.path().join("proxy.sock"))?;
        let allow: Allow = Arc::new(Mutex::new(hosts));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (a, r) = (allow.clone(), refused.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (a, r) = (a.clone(), r.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, a, r).await;
                });
            }
        });
        Ok(Egress {
            dir,
            allow,
            refused,
            task,
        })
    }

    /// The proxy's socket on the host.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("proxy.sock")
    }

    /// Allows one more host (`host` or `host:port`), e.g. the local model server once it runs.
    pub fn allow(&self, host: &str) {
        if let Ok(mut a) = self.allow.lock() {
            if !a.iter().any(|h| h == host) {
                a.push(host.to_owned());
            }
        }
    }

    /// The allowlist as it stands.
    pub fn hosts(&self) -> Vec<String> {
        self.allow.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// The loopback ports on the allowlist (`127.0.0.1:8080`, `localhost:8080`), which the
    /// bridge serves inside the sandbox as they are.
    pub fn loopback_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .hosts()
            .iter()
            .filter_map(|h| split_host(h))
            .filter(|(host, _)| is_loopback(host))
            .filter_map(|(_, port)| port)
            .filter(|p| *p != PROXY_PORT)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The refused `host:port`s since the last call, each once, in the order first refused.
    pub fn take_refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host` and its port, when given (`[::1]:80`, `a.com:443`, `a.com`).
fn split_host(entry: &str) -> Option<(String, Option<u16>)> {
    let entry = entry.trim().to_ascii_lowercase();
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
        return Some((host.to_owned(), port));
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host.to_owned(), port.parse().ok())),
        _ => Some((entry, None)),
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `host:port` is on `allow` (see [`Egress::start`]); the loopback names stand for each
/// other.
pub fn allowed(allow: &[String], host: &str, port: u16) -> bool {
    let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
    allow.iter().filter_map(|e| split_host(e)).any(|(h, p)| {
        let name = h == host
            || (is_loopback(&h) && is_loopback(&host))
            || h.strip_prefix("*.")
                .is_some_and(|d| host.ends_with(&format!(".{d}")));
        name && p.is_none_or(|p| p == port)
    })
}

/// One proxy connection: read the head, check the host, connect, relay.
async fn serve(
    mut conn: UnixStream,
    allow: Allow,
    refused: Arc<Mutex<Vec<String>>>,
) -> io::Result<()> {
    let (head, rest) = read_head(&mut conn).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut words = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target, version) = (
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or("HTTP/1.1"),
    );
    let (host, port, path) = if method.eq_ignore_ascii_case("CONNECT") {
        let (h, p) = split_host(target).unwrap_or_default();
        (h, p.unwrap_or(443), None)
    } else if let Some(after) = target.strip_prefix("http://") {
        let (authority, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, "/"),
        };
        let (h, p) = split_host(authority).unwrap_or_default();
        (h, p.unwrap_or(80), Some(path.to_owned()))
    } else {
        conn.write_all(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await?;
        return Ok(());
    };
    let ok = allow
        .lock()
        .map(|a| allowed(&a, &host, port))
        .unwrap_or(false);
    let shown = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    if !ok {
        if let Ok(mut r) = refused.lock() {
            if !r.contains(&shown) {
                r.push(shown.clone());
            }
        }
        let body =
            format!("ralph --sandbox strict: {shown} is not on the allowlist (--allow-host)\n");
        conn.write_all(
            format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
        return Ok(());
    }
    let mut upstream = match TcpStream::connect((host.as_str(), port)).await {
        Ok(u) => u,
        Err(e) => {
            let body = format!("ralph --sandbox strict: cannot reach {shown}: {e}\n");
            conn.write_all(
                format!(
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
            return Ok(());
        }
    };
    match path {
        None => {
            conn.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await?
        }
        Some(path) => {
            let mut out = format!("{method} {path} {version}\r\n");
            for line in text.lines().skip(1) {
                let lower = line.to_ascii_lowercase();
                if line.is_empty()
                    || lower.starts_with("proxy-")
                    || lower.starts_with("connection:")
                    || lower.starts_with("keep-alive:")
                {
                    continue;
                }
                out.push_str(line);
                out.push_str("\r\n");
            }
            out.push_str("Connection: close\r\n\r\n");
            upstream.write_all(out.as_bytes()).await?;
        }
    }
    upstream.write_all(&rest).await?;
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
    Ok(())
}

/// Reads up to the end of the request head (`\r\n\r\n`): `(head, bytes read past it)`.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::other("request head too long"));
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before the head ended",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `ralph __bridge [--forward=PORT]… -- PROGRAM ARGS…`, inside a strict sandbox: listens on
/// `127.0.0.1:`[`PROXY_PORT`] and on each forwarded port (IPv4 and IPv6 loopback), relays each
/// connection to the proxy at [`PROXY_SOCKET`] (a forwarded port through `CONNECT
/// 127.0.0.1:<port>`), runs the program with the inherited stdio and returns its exit code
/// (128 + the signal that killed it).
///
/// # Errors
/// A listener could not be bound, or the program could not be started.
pub fn bridge(forwards: &[u16], program: &Path, args: &[String]) -> io::Result<i32> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        listen(PROXY_PORT, None).await?;
        for port in forwards {
            listen(*port, Some(*port)).await?;
        }
        Ok::<_, io::Error>(())
    })?;
    let mut command = std::process::Command::new(program);
    command.args(args);
    let mut child = command.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot start `{}`: {e}", program.display()),
        )
    })?;
    let status = child.wait()?;
    // The listeners' threads are not waited for: the caller exits at once, and a shutdown that
    // joins them only delays the agent's exit status reaching ralph.
    runtime.shutdown_background();
    use std::os::unix::process::ExitStatusExt as _;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Binds `port` on the sandbox's loopback and relays every connection to the proxy; `connect`:
/// open it with `CONNECT 127.0.0.1:<port>` first (a forwarded port), else relay as is (the
/// proxy port).
async fn listen(port: u16, connect: Option<u16>) -> io::Result<()> {
    let v4 = TcpListener::bind(("127.0.0.1", port)).await?;
    let v6 = TcpListener::bind(("::1", port)).await.ok();
    for listener in std::iter::once(v4).chain(v6) {
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = relay(conn, connect).await;
                });
            }
        });
    }
    Ok(())
}

async fn relay(mut conn: TcpStream, connect: Option<u16>) -> io::Result<()> {
    let mut proxy = UnixStream::connect(PROXY_SOCKET).await?;
    if let Some(port) = connect {
        proxy
            .write_all(
                format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let (head, rest) = read_head(&mut proxy).await?;
        if !head.starts_with(b"HTTP/1.1 200") {
            conn.write_all(&head).await?;
            conn.write_all(&rest).await?;
            return Ok(());
        }
        conn.write_all(&rest).await?;
    }
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut proxy).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_matches_hosts_ports_wildcards_and_loopback_names() {
        let allow: Vec<String> = [
            "api.anthropic.com:443",
            "pypi.org",
            "*.example.com",
            "localhost:8080",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert!(allowed(&allow, "api.anthropic.com", 443));
        assert!(!allowed(&allow, "api.anthropic.com", 80));
        assert!(allowed(&allow, "PyPI.org", 8443));
        assert!(allowed(&allow, "files.example.com", 443));
        assert!(!allowed(&allow, "example.com.evil.net", 443));
        assert!(allowed(&allow, "127.0.0.1", 8080));
        assert!(!allowed(&allow, "127.0.0.1", 8081));
        assert!(!allowed(&allow, "github.com", 443));
    }

    #[tokio::test]
    async fn the_proxy_relays_allowed_hosts_and_names_the_refused_ones() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = server.accept().await {
                tokio::spawn(async move {
                    let (head, _) = read_head(&mut c).await.unwrap();
                    let first = String::from_utf8_lossy(&head)
                        .lines()
                        .next()
                        .unwrap()
                        .to_owned();
                    let body = format!("saw {first}");
                    c.write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await
                    .unwrap();
                });
            }
        });
        let egress = Egress::start(vec![format!("127.0.0.1:{port}")]).unwrap();
        let ask = |req: String| {
            let socket = egress.socket();
            async move {
                let mut s = UnixStream::connect(socket).await.unwrap();
                s.write_all(req.as_bytes()).await.unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        let got = ask(format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        ))
        .await;
        assert!(got.ends_with("saw GET /x HTTP/1.1"), "{got}");
        let got = ask("GET http://example.org/ HTTP/1.1\r\n\r\n".to_owned()).await;
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        let got = ask("CONNECT github.com:443 HTTP/1.1\r\n\r\n".to_owned()).await;
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        assert_eq!(egress.take_refused(), ["example.org:80", "github.com:443"]);
        assert!(egress.take_refused().is_empty());
        assert_eq!(egress.loopback_ports(), [port]);
    }
}
