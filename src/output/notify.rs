//! The notification sink: turns run events into [`Notification`]s (see [`crate::notify`]) and
//! delivers them, in order, on a worker thread of its own, so that a slow or dead endpoint never
//! holds the run. Each notification goes to every target; a failed delivery is retried with a
//! doubling backoff (1 s, 2 s, …) up to the configured attempts, each attempt cut at its time
//! limit, then given up with a warning. Every delivery is recorded in
//! `.ralph/notifications.jsonl` (targets redacted). The events it reacts to are sent by the loop
//! only after the iteration is committed, in the ledger and in state.json.
//!
//! At the end of the run, [`Sink::close`] waits for the queue to drain (each attempt is bounded,
//! so the wait is too).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use super::{Sink, Warnings};
use crate::notify::{deliver, Kind, Notification, NotifyConfig, Target};
use crate::protocol::run_event::WaitReason;
use crate::protocol::{LedgerRecord, Outcome, RunEvent, StopReason};

/// First wait before a retry; doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The notification sink.
pub struct Notify {
    cfg: NotifyConfig,
    project: String,
    run_id: String,
    tx: Option<mpsc::Sender<Notification>>,
    worker: Option<JoinHandle<()>>,
}

impl Notify {
    /// A sink sending `cfg`'s notifications about `project`; deliveries are recorded in
    /// `log` (`.ralph/notifications.jsonl`) and failures reported through `warnings`. Commands run
    /// in `cwd` (the repository).
    pub fn new(
        cfg: NotifyConfig,
        project: String,
        cwd: PathBuf,
        log: PathBuf,
        warnings: Warnings,
    ) -> Notify {
        let (tx, rx) = mpsc::channel::<Notification>();
        let worker_cfg = cfg.clone();
        let worker = std::thread::Builder::new()
            .name("ralph-notify".into())
            .spawn(move || work(rx, worker_cfg, cwd, log, warnings))
            .ok();
        Notify {
            cfg,
            project,
            run_id: String::new(),
            tx: worker.as_ref().map(|_| tx),
            worker,
        }
    }

    fn send(&self, kind: Kind, text: String, details: serde_json::Value) {
        if !self.cfg.wants(kind) {
            return;
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(Notification {
                kind,
                text,
                at: Utc::now(),
                project: self.project.clone(),
                run_id: self.run_id.clone(),
                details,
            });
        }
    }

    fn iteration(&self, r: &LedgerRecord) {
        let p = &self.project;
        match r.outcome {
            Outcome::StoryPassed => self.send(
                Kind::StoryPassed,
                format!(
                    "{p}: {} passed in iteration {}{}",
                    r.story_id,
                    r.iteration,
                    r.cost_usd
                        .map(|c| format!(" ({})", super::text::usd(c)))
                        .unwrap_or_default()
                ),
                json!({"story_id": r.story_id, "story_title": r.story_title,
                    "iteration": r.iteration, "cost_usd": r.cost_usd}),
            ),
            Outcome::AuthError | Outcome::ConfigError => self.send(
                Kind::NeedsAttention,
                format!(
                    "{p}: iteration {} ended with {}; the run stops until a human fixes it: {}",
                    r.iteration,
                    r.outcome,
                    r.message.as_deref().unwrap_or("see the transcript")
                ),
                json!({"outcome": r.outcome, "iteration": r.iteration, "message": r.message}),
            ),
            _ => {}
        }
    }
}

impl Sink for Notify {
    fn on(&mut self, event: &RunEvent) {
        let p = self.project.clone();
        match event {
            RunEvent::RunStarted { run_id, .. } => self.run_id = run_id.clone(),
            RunEvent::IterationFinished { record, .. } => self.iteration(record),
            RunEvent::StoryBlocked {
                story_id,
                attempts,
                last_outcome,
                last_message,
            } => self.send(
                Kind::StoryBlocked,
                format!(
                    "{p}: {story_id} is blocked after {attempts} attempts (last: {last_outcome})"
                ),
                json!({"story_id": story_id, "attempts": attempts, "last_outcome": last_outcome,
                    "last_message": last_message}),
            ),
            RunEvent::Waiting {
                reason: WaitReason::UsageLimit,
                until,
                story_id,
                ..
            } => {
                self.send(
                    Kind::UsageLimitWait,
                    format!(
                    "{p}: the agent hit a usage limit; ralph waits until {} UTC, then goes on{}",
                    until.format("%Y-%m-%d %H:%M"),
                    story_id.as_deref().map(|s| format!(" with {s}")).unwrap_or_default()
                ),
                    json!({"until": until, "story_id": story_id}),
                )
            }
            RunEvent::RunFinished(summary) => {
                let text = match summary.stop_reason {
                    StopReason::Complete => format!("{p}: {}", summary.headline),
                    _ => format!(
                        "{p}: stopped: {} ({} passed, {} open)",
                        summary.stop_reason.sentence(),
                        summary.passed,
                        summary.open.len()
                    ),
                };
                self.send(
                    Kind::RunFinished,
                    text,
                    serde_json::to_value(summary.as_ref()).unwrap_or_default(),
                );
            }
            _ => {}
        }
    }

    fn close(&mut self) {
        // Closing the channel lets the worker finish the queue and stop.
        self.tx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Notify {
    fn drop(&mut self) {
        self.close();
    }
}

/// The worker: delivers each notification to each target in order, with retries.
fn work(
    rx: mpsc::Receiver<Notification>,
    cfg: NotifyConfig,
    cwd: PathBuf,
    log: PathBuf,
    warnings: Warnings,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        warnings.push("notifications are off: cannot start their worker".into());
        return;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            warnings.push(format!("notifications are off: {e}"));
            return;
        }
    };
    let targets = cfg.targets();
    while let Ok(n) = rx.recv() {
        for target in &targets {
            let (result, attempts) =
                runtime.block_on(deliver_with_retries(&client, target, &n, &cfg, &cwd));
            record(&log, &n, target, &result, attempts);
            if let Err(why) = result {
                warnings.push(format!(
                    "the {} notification to {target} failed after {attempts} attempt{}: {why}",
                    n.kind.as_str(),
                    if attempts == 1 { "" } else { "s" }
                ));
            }
        }
    }
}

/// Delivers with retries; returns the last result and how many attempts it took.
pub async fn deliver_with_retries(
    client: &reqwest::Client,
    target: &Target,
    n: &Notification,
    cfg: &NotifyConfig,
    cwd: &std::path::Path,
) -> (Result<(), String>, u32) {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let result = deliver(client, target, n, cfg, cwd).await;
        if result.is_ok() || attempt >= cfg.attempts.max(1) {
            return (result, attempt);
        }
        tokio::time::sleep(backoff).await;
        backoff *= 2;
        attempt += 1;
    }
}

/// Appends one delivery to `.ralph/notifications.jsonl`.
fn record(
    log: &PathBuf,
    n: &Notification,
    target: &Target,
    result: &Result<(), String>,
    attempts: u32,
) {
    let line = json!({
        "at": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "kind": n.kind, "run_id": n.run_id, "target": target.to_string(),
        "ok": result.is_ok(), "attempts": attempts, "error": result.as_ref().err(),
    });
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{line}");
    }
}
