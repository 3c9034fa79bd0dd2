//! Notifications: a few moments of a run worth telling someone who is not watching (the run
//! finished, a story passed, a story is blocked, the run waits for a usage limit, an auth or
//! config error needs a human), delivered to webhooks, a command, or the desktop.
//!
//! This module holds the settings ([`NotifyConfig`], from ralph.toml's `[notify]` table and the
//! `--notify-*` flags), the message ([`Notification`]) and the delivery of one message to one
//! target ([`deliver`]), with a time limit per attempt. `output/notify.rs` is the sink that turns
//! run events into notifications and delivers them in order on a worker, with retries, after
//! the iteration is written down.
//!
//! Webhook bodies: `json` (the [`Notification`] itself), `slack` (`{"text": …}`) or `discord`
//! (`{"content": …}`). With a secret, the body is signed with HMAC-SHA256 and the signature sent as
//! `X-Ralph-Signature: sha256=<hex>` (GitHub's convention), so a receiver can check the sender.
//! Secrets (webhook URLs with tokens, the HMAC secret) are never written to the ledger,
//! transcripts or reports; [`redact_url`] is how a URL appears in messages.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::process::{capture, SpawnSpec};
use crate::protocol::time::rfc3339;

/// Default time limit of one delivery attempt.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default attempts per notification and target (the first and the retries).
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// Which kinds of notification exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The run ended (with its typed stop reason).
    RunFinished,
    /// A story passed.
    StoryPassed,
    /// A story is blocked after `--max-attempts`.
    StoryBlocked,
    /// The run waits for a usage limit to reset (with the time).
    UsageLimitWait,
    /// An auth or config error: a human must act.
    NeedsAttention,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [
        Kind::RunFinished,
        Kind::StoryPassed,
        Kind::StoryBlocked,
        Kind::UsageLimitWait,
        Kind::NeedsAttention,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RunFinished => "run_finished",
            Kind::StoryPassed => "story_passed",
            Kind::StoryBlocked => "story_blocked",
            Kind::UsageLimitWait => "usage_limit_wait",
            Kind::NeedsAttention => "needs_attention",
        }
    }
}

/// How a webhook's body is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// The notification as JSON.
    #[default]
    Json,
    /// Slack incoming webhook: `{"text": "<the sentence>"}`.
    Slack,
    /// Discord webhook: `{"content": "<the sentence>"}`.
    Discord,
}

/// ralph.toml's `[notify]` table, as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyFile {
    /// Webhook URLs, each POSTed every notification (one URL or a list).
    #[serde(default, deserialize_with = "one_or_many")]
    pub webhook: Vec<String>,
    /// Environment variables holding webhook URLs (keeps tokens out of ralph.toml, which is
    /// usually committed and which an agent can read).
    #[serde(default, deserialize_with = "one_or_many")]
    pub webhook_env: Vec<String>,
    /// The body's shape for every webhook.
    pub format: Option<WebhookFormat>,
    /// The HMAC-SHA256 key (prefer `secret_env`: ralph.toml is usually committed).
    pub secret: Option<String>,
    /// The environment variable holding the HMAC-SHA256 key.
    pub secret_env: Option<String>,
    /// A shell command run with the notification's JSON on stdin.
    pub command: Option<String>,
    /// Desktop notifications (notify-send, or osascript on macOS).
    pub desktop: Option<bool>,
    /// Which kinds to send (default: all).
    pub events: Option<Vec<Kind>>,
    /// Time limit of one attempt, humantime syntax (`10s`).
    pub timeout: Option<String>,
    /// Attempts per notification and target.
    pub attempts: Option<u32>,
}

/// A string or a list of strings.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The resolved notification settings of a run.
#[derive(Clone, Default, PartialEq)]
pub struct NotifyConfig {
    /// Webhook URLs.
    pub webhooks: Vec<String>,
    /// The body's shape.
    pub format: WebhookFormat,
    /// The HMAC key, when set.
    pub secret: Option<String>,
    /// The command, when set.
    pub command: Option<String>,
    /// Desktop notifications.
    pub desktop: bool,
    /// The kinds to send.
    pub kinds: Vec<Kind>,
    /// Time limit of one attempt.
    pub timeout: Duration,
    /// Attempts per notification and target (≥ 1).
    pub attempts: u32,
}

impl std::fmt::Debug for NotifyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyConfig")
            .field(
                "webhooks",
                &self
                    .webhooks
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("format", &self.format)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("command", &self.command)
            .field("desktop", &self.desktop)
            .field("kinds", &self.kinds)
            .field("timeout", &self.timeout)
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl NotifyConfig {
    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        self.webhooks.is_empty() && self.command.is_none() && !self.desktop
    }

    /// The targets, in the order notifications go to them.
    pub fn targets(&self) -> Vec<Target> {
        let mut out: Vec<Target> = self.webhooks.iter().cloned().map(Target::Webhook).collect();
        if let Some(c) = &self.command {
            out.push(Target::Command(c.clone()));
        }
        if self.desktop {
            out.push(Target::Desktop);
        }
        out
    }

    /// Whether `kind` is sent.
    pub fn wants(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind)
    }
}

/// One place a notification goes.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// A webhook URL.
    Webhook(String),
    /// A shell command.
    Command(String),
    /// The desktop.
    Desktop,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Webhook(url) => write!(f, "webhook {}", redact_url(url)),
            // Only the program: the rest of a command line may carry a token.
            Target::Command(c) => {
                write!(f, "command {}", c.split_whitespace().next().unwrap_or("?"))
            }
            Target::Desktop => f.write_str("desktop"),
        }
    }
}

/// Where a notification comes from: a reader with several projects, PRDs or branches on one
/// channel must tell them apart.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Origin {
    /// The project (prd.json's `project`).
    pub project: String,
    /// prd.json's path relative to the repository root, e.g. `prd.json` or `prds/a/prd.json`.
    pub prd: String,
    /// The branch the run works on (prd.json's `branchName`, else the checked-out branch);
    /// empty when unknown.
    pub branch: String,
}

impl Origin {
    /// The origin of the run of `prd_path` (a prd.json path): its project, its path relative
    /// to its repository root and its branch. A prd.json that cannot be read gives the project
    /// `ralph` and the path as given.
    pub fn of_prd(prd_path: &Path) -> Origin {
        let paths = crate::workspace::RunPaths::of_prd(prd_path);
        let loaded = crate::prd::store::load_shared(prd_path).ok();
        let prd = loaded
            .as_ref()
            .map(|l| l.path.clone())
            .unwrap_or_else(|| prd_path.to_path_buf());
        let rel = prd
            .strip_prefix(&paths.repo_root)
            .map(Path::to_path_buf)
            .unwrap_or(prd);
        let branch = loaded
            .as_ref()
            .and_then(|l| l.prd.branch_name.clone())
            .or_else(|| {
                crate::git::Repo::discover(&paths.repo_root)
                    .ok()
                    .and_then(|r| r.current_branch())
            })
            .unwrap_or_default();
        Origin {
            project: loaded
                .map(|l| l.prd.project.clone())
                .unwrap_or_else(|| "ralph".into()),
            prd: rel.display().to_string(),
            branch,
        }
    }

    /// How a message names it: `Demo (prds/a/prd.json on ralph/demo)`, without the parts that
    /// are unknown.
    pub fn label(&self) -> String {
        match (self.prd.is_empty(), self.branch.is_empty()) {
            (false, false) => format!("{} ({} on {})", self.project, self.prd, self.branch),
            (false, true) => format!("{} ({})", self.project, self.prd),
            (true, false) => format!("{} (on {})", self.project, self.branch),
            (true, true) => self.project.clone(),
        }
    }
}

/// One notification: the JSON a webhook (format `json`) or the command receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Which kind.
    pub kind: Kind,
    /// One sentence for a person, naming the project, the PRD and the branch first, e.g.
    /// `Demo (prd.json on ralph/demo): US-002 passed in iteration 4`.
    pub text: String,
    /// When it happened (RFC 3339 UTC).
    #[serde(with = "rfc3339")]
    pub at: DateTime<Utc>,
    /// The project (prd.json's `project`).
    pub project: String,
    /// prd.json's path relative to the repository root.
    #[serde(default)]
    pub prd: String,
    /// The branch the run works on (empty when unknown).
    #[serde(default)]
    pub branch: String,
    /// The run id.
    pub run_id: String,
    /// The event's details: the story, the iteration, the stop reason, the reset time, …
    pub details: serde_json::Value,
}

impl Notification {
    /// A notification of `kind` from `origin`: `text` is `sentence` after
    /// [`Origin::label`] (`Demo (prd.json on ralph/demo): US-001 passed …`), and the origin's
    /// parts are fields of their own.
    pub fn new(
        kind: Kind,
        origin: &Origin,
        sentence: &str,
        run_id: &str,
        details: serde_json::Value,
    ) -> Notification {
        Notification {
            kind,
            text: format!("{}: {sentence}", origin.label()),
            at: Utc::now(),
            project: origin.project.clone(),
            prd: origin.prd.clone(),
            branch: origin.branch.clone(),
            run_id: run_id.to_owned(),
            details,
        }
    }

    /// This notification with every string in it redacted ([`crate::redact::current`]): what
    /// goes out to a webhook, a command or the desktop.
    pub fn redacted(&self) -> Notification {
        let redactor = crate::redact::current();
        let mut n = self.clone();
        for s in [&mut n.text, &mut n.project, &mut n.prd, &mut n.branch] {
            redactor.redact_in_place(s);
        }
        redactor.redact_value(&mut n.details);
        n
    }
}

/// The deliveries log's file name inside a PRD's books (`.ralph/notifications.jsonl`): one JSON
/// line per delivery, written by the notification sink as each one ends.
pub const DELIVERIES_FILE: &str = "notifications.jsonl";

/// One notification that did not go out, as `.ralph/notifications.jsonl` records it.
#[derive(Debug, Clone, Deserialize)]
pub struct FailedDelivery {
    /// When the delivery was given up.
    pub at: DateTime<Utc>,
    /// The notification's kind (`finished`, `blocked`, …).
    pub kind: String,
    /// The run it was about.
    #[serde(default)]
    pub run_id: String,
    /// Where it was going (URLs redacted).
    pub target: String,
    /// Attempts made.
    #[serde(default)]
    pub attempts: u32,
    /// The last attempt's error.
    #[serde(default)]
    pub error: Option<String>,
    /// The shutdown deadline cut it off (rather than every attempt failing).
    #[serde(default)]
    pub undelivered: bool,
}

impl FailedDelivery {
    /// One line for a reader, e.g. `2026-01-01 03:04:05 +01:00 the finished notification to
    /// webhook http://…: failed after 3 attempts: connection refused`.
    pub fn describe(&self) -> String {
        format!(
            "{} the {} notification to {}: {} after {} attempt{}: {}",
            self.at
                .with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M:%S %:z"),
            self.kind,
            self.target,
            if self.undelivered {
                "not delivered"
            } else {
                "failed"
            },
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.error.as_deref().unwrap_or("no reason recorded")
        )
    }
}

/// The failed deliveries recorded in `ralph_dir`'s deliveries log ([`DELIVERIES_FILE`]), oldest
/// first; a missing or unreadable log is none, and unreadable lines are skipped.
pub fn failed_deliveries(ralph_dir: &Path) -> Vec<FailedDelivery> {
    let Ok(text) = std::fs::read_to_string(ralph_dir.join(DELIVERIES_FILE)) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.contains("\"ok\":false"))
        .filter_map(|l| serde_json::from_str::<FailedDelivery>(l).ok())
        .collect()
}

/// The body of a webhook POST in `format`, and the `X-Ralph-Signature` header value when a
/// secret is set: `(body, signature)`.
pub fn webhook_body(
    n: &Notification,
    format: WebhookFormat,
    secret: Option<&str>,
) -> (Vec<u8>, Option<String>) {
    let n = &n.redacted();
    let value = match format {
        WebhookFormat::Json => serde_json::to_value(n).unwrap_or_default(),
        WebhookFormat::Slack => serde_json::json!({ "text": n.text }),
        WebhookFormat::Discord => serde_json::json!({ "content": n.text }),
    };
    let body = serde_json::to_vec(&value).unwrap_or_default();
    let signature = secret.map(|key| format!("sha256={}", sign(key.as_bytes(), &body)));
    (body, signature)
}

/// HMAC-SHA256 of `body` with `key`, lowercase hex.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        // HMAC takes keys of any length; this cannot happen.
        Err(_) => return String::new(),
    };
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A URL as it may appear in messages: scheme and host only (webhook URLs carry tokens in their
/// path or query), read from the text as written, so no spelling of the URL can show its path.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.trim().split_once("://") else {
        return "<an invalid URL>".to_owned();
    };
    // The authority ends at the first `/`, `?` or `#`; user info (`user:token@`) is dropped.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if scheme.is_empty()
        || host.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return "<an invalid URL>".to_owned();
    }
    format!(
        "{}://{}/…",
        scheme.to_ascii_lowercase(),
        host.to_ascii_lowercase()
    )
}

/// Delivers `n` to `target` once, within `cfg.timeout`, secrets redacted
/// ([`Notification::redacted`]).
///
/// # Errors
/// A sentence saying what failed (HTTP status, timeout, exit code), secrets redacted.
pub async fn deliver(
    client: &reqwest::Client,
    target: &Target,
    n: &Notification,
    cfg: &NotifyConfig,
    cwd: &Path,
) -> Result<(), String> {
    let n = &n.redacted();
    match target {
        Target::Webhook(url) => {
            let (body, signature) = webhook_body(n, cfg.format, cfg.secret.as_deref());
            let mut req = client
                .post(url)
                .timeout(cfg.timeout)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("X-Ralph-Event", n.kind.as_str())
                .body(body);
            if let Some(sig) = signature {
                req = req.header("X-Ralph-Signature", sig);
            }
            match req.send().await {
                Ok(resp) if resp.status().is_success() => Ok(()),
                Ok(resp) => Err(format!("HTTP {}", resp.status())),
                Err(e) if e.is_timeout() => Err(format!(
                    "no answer within {}",
                    humantime::format_duration(cfg.timeout)
                )),
                Err(e) => Err(describe_http_error(&e.without_url())),
            }
        }
        Target::Command(command) => {
            let spec = SpawnSpec {
                program: "bash".into(),
                args: vec!["-c".into(), command.clone()],
                cwd: cwd.to_path_buf(),
                env_remove: Vec::new(),
                env_set: vec![("RALPH_NOTIFY_KIND".into(), n.kind.as_str().into())],
                stdin: Some(serde_json::to_vec(n).unwrap_or_default()),
            };
            run_blocking(spec, cfg.timeout).await
        }
        Target::Desktop => {
            let Some(spec) = desktop_spec(n, cwd) else {
                return Err("neither notify-send nor osascript is installed".into());
            };
            run_blocking(spec, cfg.timeout).await
        }
    }
}

/// Runs `spec` to completion on a blocking thread (through [`capture`]).
async fn run_blocking(spec: SpawnSpec, timeout: Duration) -> Result<(), String> {
    let program = spec.program.display().to_string();
    let done = tokio::task::spawn_blocking(move || capture(&spec, Some(timeout))).await;
    match done {
        Ok(Ok(c)) if c.success() => Ok(()),
        Ok(Ok(c)) if c.timed_out => Err(format!(
            "{program} did not finish within {}",
            humantime::format_duration(timeout)
        )),
        Ok(Ok(c)) => Err(format!(
            "{program} ended with {}{}",
            c.exit,
            c.stderr
                .lines()
                .last()
                .map(|l| format!(": {}", l.trim()))
                .unwrap_or_default()
        )),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The desktop notifier of this machine: `notify-send` (Linux) or `osascript` (macOS).
fn desktop_spec(n: &Notification, cwd: &Path) -> Option<SpawnSpec> {
    let title = format!("ralph: {}", n.project);
    let (program, args) = if which::which("notify-send").is_ok() {
        ("notify-send", vec![title, n.text.clone()])
    } else if which::which("osascript").is_ok() {
        let script = format!(
            "display notification {} with title {}",
            applescript_string(&n.text),
            applescript_string(&title)
        );
        ("osascript", vec!["-e".to_owned(), script])
    } else {
        return None;
    };
    Some(SpawnSpec {
        program: PathBuf::from(program),
        args,
        cwd: cwd.to_path_buf(),
        env_remove: Vec::new(),
        env_set: Vec::new(),
        stdin: None,
    })
}

fn applescript_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// An HTTP failure in words, without the URL (reqwest's message names the URL it used).
fn describe_http_error(e: &reqwest::Error) -> String {
    if e.is_connect() {
        "cannot connect".to_owned()
    } else if e.is_builder() {
        "not a valid URL".to_owned()
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Notification {
        Notification {
            kind: Kind::StoryPassed,
            text: "demo: US-001 passed".into(),
            at: Utc::now(),
            project: "demo".into(),
            prd: "prd.json".into(),
            branch: "ralph/demo".into(),
            run_id: "r".into(),
            details: serde_json::json!({"story_id": "US-001"}),
        }
    }

    #[test]
    fn messages_name_the_project_the_prd_and_the_branch() {
        let origin = Origin {
            project: "Demo".into(),
            prd: "prds/a/prd.json".into(),
            branch: "ralph/a".into(),
        };
        let n = Notification::new(
            Kind::StoryPassed,
            &origin,
            "US-001 passed",
            "r1",
            serde_json::json!({}),
        );
        assert_eq!(n.text, "Demo (prds/a/prd.json on ralph/a): US-001 passed");
        let (body, _) = webhook_body(&n, WebhookFormat::Json, None);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["project"], "Demo");
        assert_eq!(body["prd"], "prds/a/prd.json");
        assert_eq!(body["branch"], "ralph/a");
        let bare = Origin {
            project: "Demo".into(),
            ..Origin::default()
        };
        assert_eq!(bare.label(), "Demo");
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let (body, sig) = webhook_body(&sample(), WebhookFormat::Json, Some("k"));
        assert_eq!(sig.unwrap(), format!("sha256={}", sign(b"k", &body)));
    }

    #[test]
    fn slack_and_discord_bodies_carry_the_sentence() {
        let (slack, _) = webhook_body(&sample(), WebhookFormat::Slack, None);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&slack).unwrap(),
            serde_json::json!({"text": "demo: US-001 passed"})
        );
        let (discord, sig) = webhook_body(&sample(), WebhookFormat::Discord, None);
        assert!(sig.is_none());
        assert!(String::from_utf8_lossy(&discord).contains("\"content\""));
    }

    #[test]
    fn urls_lose_their_tokens_in_messages() {
        assert_eq!(
            redact_url("https://hooks.slack.com/services/T0/B0/secret-token"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:9/x?token=1"),
            "http://127.0.0.1:9/…"
        );
        let cfg = NotifyConfig {
            webhooks: vec!["https://h.example/tok".into()],
            secret: Some("s3cret".into()),
            ..NotifyConfig::default()
        };
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("tok") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
