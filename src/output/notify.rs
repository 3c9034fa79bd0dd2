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
//!
//! After a stop signal, `--shutdown-timeout` is a hard deadline for notifications too (see
//! [`Notify::with_deadline`]): an attempt still running at the deadline is cut, no retry starts
//! after it, and every notification that did not go out is recorded as undelivered, in
//! `.ralph/notifications.jsonl` (`"ok": false, "undelivered": true`) and as a warning naming its
//! kind and target, so that ralph exits within the timeout whatever the endpoint does.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;

use super::{Sink, Warnings};
use crate::notify::{deliver, Kind, Notification, NotifyConfig, Origin, Target};
use crate::process::StopSignals;
use crate::protocol::run_event::{SwitchReason, WaitReason};
use crate::protocol::{LedgerRecord, Outcome, RunEvent, StopReason};

/// First wait before a retry; doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Most of `--shutdown-timeout` kept back from notifications for ralph's own exit after them.
const EXIT_MARGIN: Duration = Duration::from_millis(500);

/// When notifications must be out after a stop: `--shutdown-timeout` after the first signal,
/// less a margin for ralph's exit (a tenth of the timeout, at most [`EXIT_MARGIN`]). Before any
/// stop there is no deadline.
#[derive(Debug, Clone)]
pub struct Deadline {
    stop: StopSignals,
    timeout: Duration,
    within: Duration,
}

impl Deadline {
    /// The deadline `shutdown_timeout` after `stop`'s first signal.
    pub fn new(stop: StopSignals, shutdown_timeout: Duration) -> Deadline {
        let margin = (shutdown_timeout / 10).min(EXIT_MARGIN);
        Deadline {
            stop,
            timeout: shutdown_timeout,
            within: shutdown_timeout.saturating_sub(margin),
        }
    }

    /// The instant notifications must be out by; `None` while no stop was asked.
    pub fn at(&self) -> Option<Instant> {
        self.stop.stopped().map(|cause| cause.at + self.within)
    }

    /// What ran out, for messages: e.g. `the shutdown deadline (--shutdown-timeout 3s after
    /// SIGTERM)`.
    fn describe(&self) -> String {
        let timeout = humantime::format_duration(self.timeout);
        match self.stop.cause.get() {
            Some(cause) => format!(
                "the shutdown deadline (--shutdown-timeout {timeout} after {})",
                cause.signal
            ),
            None => format!("the shutdown deadline (--shutdown-timeout {timeout})"),
        }
    }

    /// Resolves when the deadline has passed; never before a stop.
    async fn passed(&self) {
        loop {
            if let Some(at) = self.at() {
                tokio::time::sleep_until(at.into()).await;
                return;
            }
            self.stop.stop.cancelled().await;
        }
    }

    /// Whether the deadline has passed.
    fn is_past(&self) -> bool {
        self.at().is_some_and(|at| Instant::now() >= at)
    }
}

/// The notification sink.
pub struct Notify {
    cfg: NotifyConfig,
    /// The project, PRD and branch every message names.
    origin: Origin,
    run_id: String,
    /// One worker per target: a dead endpoint never delays another.
    workers: Vec<Worker>,
    warnings: Warnings,
    /// Set by [`Notify::with_deadline`], read by the workers.
    deadline: Arc<OnceLock<Deadline>>,
}

/// One target's queue and thread.
struct Worker {
    target: Target,
    tx: Option<mpsc::Sender<Notification>>,
    done: mpsc::Receiver<()>,
    handle: Option<JoinHandle<()>>,
}

impl Notify {
    /// A sink sending `cfg`'s notifications about `origin` (project, PRD, branch); deliveries are recorded in
    /// `log` (`.ralph/notifications.jsonl`) and failures reported through `warnings`. Commands run
    /// in `cwd` (the repository).
    pub fn new(
        cfg: NotifyConfig,
        origin: Origin,
        cwd: PathBuf,
        log: PathBuf,
        warnings: Warnings,
    ) -> Notify {
        let deadline: Arc<OnceLock<Deadline>> = Arc::default();
        let workers = cfg
            .targets()
            .into_iter()
            .filter_map(|target| {
                let (tx, rx) = mpsc::channel::<Notification>();
                let (done_tx, done) = mpsc::channel::<()>();
                let job = Job {
                    target: target.clone(),
                    cfg: cfg.clone(),
                    cwd: cwd.clone(),
                    log: log.clone(),
                    warnings: warnings.clone(),
                    deadline: Arc::clone(&deadline),
                };
                let handle = std::thread::Builder::new()
                    .name("ralph-notify".into())
                    .spawn(move || {
                        work(rx, &job);
                        let _ = done_tx.send(());
                    })
                    .ok()?;
                Some(Worker {
                    target,
                    tx: Some(tx),
                    done,
                    handle: Some(handle),
                })
            })
            .collect();
        Notify {
            cfg,
            origin,
            run_id: String::new(),
            workers,
            warnings,
            deadline,
        }
    }

    /// Makes `deadline` (`--shutdown-timeout` after a stop signal) a hard limit for every
    /// delivery and for [`Sink::close`]'s wait: what cannot go out by then is recorded as
    /// undelivered (see the module docs).
    pub fn with_deadline(self, deadline: Deadline) -> Notify {
        let _ = self.deadline.set(deadline);
        self
    }

    /// The longest wait for the last notifications at the end of a run: every attempt of one
    /// notification with its backoffs, at most a minute.
    /// After a stop, at most until the deadline (and a moment for the workers to record what
    /// they dropped).
    fn close_wait(&self) -> Duration {
        let attempts = self.cfg.attempts.max(1);
        let backoffs = FIRST_BACKOFF * ((1u32 << (attempts - 1).min(10)) - 1);
        let wait = (self.cfg.timeout * attempts + backoffs).min(Duration::from_secs(60));
        match self.deadline.get().and_then(Deadline::at) {
            Some(at) => {
                wait.min(at.saturating_duration_since(Instant::now()) + Duration::from_millis(200))
            }
            None => wait,
        }
    }

    fn send(&self, kind: Kind, text: String, details: serde_json::Value) {
        if !self.cfg.wants(kind) {
            return;
        }
        let n = Notification::new(kind, &self.origin, &text, &self.run_id, details);
        for w in &self.workers {
            if let Some(tx) = &w.tx {
                let _ = tx.send(n.clone());
            }
        }
    }

    fn iteration(&self, r: &LedgerRecord) {
        match r.outcome {
            Outcome::StoryPassed => self.send(
                Kind::StoryPassed,
                format!(
                    "{} passed in iteration {}{}",
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
                    "iteration {} ended with {}; the run stops until a human fixes it: {}",
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
                    "{story_id} is blocked after {attempts} attempt{} (last: {last_outcome})",
                    if *attempts == 1 { "" } else { "s" }
                ),
                json!({"story_id": story_id, "attempts": attempts, "last_outcome": last_outcome,
                    "last_message": last_message}),
            ),
            RunEvent::Waiting {
                reason: WaitReason::UsageLimit,
                until,
                story_id,
                ..
            } => self.send(
                Kind::UsageLimitWait,
                format!(
                    "the agent hit a usage limit; ralph waits until {} UTC, then goes on{}",
                    until.format("%Y-%m-%d %H:%M"),
                    story_id
                        .as_deref()
                        .map(|s| format!(" with {s}"))
                        .unwrap_or_default()
                ),
                json!({"until": until, "story_id": story_id}),
            ),
            RunEvent::AgentSwitched {
                from,
                to,
                reason,
                from_resets_at,
            } if *reason != SwitchReason::ResetPassed => self.send(
                if *reason == SwitchReason::AuthError {
                    Kind::NeedsAttention
                } else {
                    Kind::UsageLimitWait
                },
                super::human::switch_text(from, to, *reason, *from_resets_at),
                json!({"from": from, "to": to, "reason": reason, "from_resets_at": from_resets_at}),
            ),
            RunEvent::RunFinished(summary) => {
                let text = match summary.stop_reason {
                    StopReason::Complete => summary.headline.clone(),
                    _ => format!(
                        "stopped: {} ({} passed, {} open)",
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
        // Closing the channels lets each worker finish its queue and stop; a worker still busy
        // when the wait is over is left behind (ralph exits) with a warning.
        for w in &mut self.workers {
            w.tx.take();
        }
        // Said to the tenth of a second.
        let wait = Duration::from_millis(self.close_wait().as_millis().div_ceil(100) as u64 * 100);
        let deadline = Instant::now() + wait;
        let mut said = false;
        for w in &mut self.workers {
            let first = w.done.recv_timeout(Duration::from_millis(300));
            if first.is_err() && !said {
                let _ = writeln!(
                    std::io::stderr(),
                    "ralph: delivering the last notifications (at most {})…",
                    humantime::format_duration(wait)
                );
                said = true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if first.is_ok() || w.done.recv_timeout(left).is_ok() {
                if let Some(h) = w.handle.take() {
                    let _ = h.join();
                }
            } else {
                self.warnings.push(format!(
                    "gave up waiting for notifications to {}: they were still being sent when the run ended",
                    w.target
                ));
            }
        }
        self.workers.clear();
    }
}

impl Drop for Notify {
    fn drop(&mut self) {
        self.close();
    }
}

/// What one target's worker needs.
struct Job {
    target: Target,
    cfg: NotifyConfig,
    cwd: PathBuf,
    log: PathBuf,
    warnings: Warnings,
    deadline: Arc<OnceLock<Deadline>>,
}

/// One target's worker: delivers each notification in order, with retries; after a stop, what
/// the deadline cuts off is recorded as undelivered.
fn work(rx: mpsc::Receiver<Notification>, job: &Job) {
    let warnings = &job.warnings;
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
    let target = &job.target;
    while let Ok(n) = rx.recv() {
        let deadline = job.deadline.get();
        let (result, attempts) = runtime.block_on(deliver_with_retries_until(
            &client, target, &n, &job.cfg, &job.cwd, deadline,
        ));
        match result {
            Delivery::Sent => record(&job.log, &n, target, &Ok(()), attempts, false),
            Delivery::Failed(why) => {
                record(&job.log, &n, target, &Err(why.clone()), attempts, false);
                warnings.push(format!(
                    "the {} notification to {target} failed after {attempts} attempt{}: {why}",
                    n.kind.as_str(),
                    if attempts == 1 { "" } else { "s" }
                ));
            }
            Delivery::OutOfTime(what) => {
                let why = format!("not delivered: {what} ran out");
                record(&job.log, &n, target, &Err(why.clone()), attempts, true);
                warnings.push(format!(
                    "the {} notification to {target} was not delivered: {what} ran out{}",
                    n.kind.as_str(),
                    match attempts {
                        0 => " before it could be sent".to_owned(),
                        1 => " during its first attempt".to_owned(),
                        k => format!(" during attempt {k}"),
                    }
                ));
            }
        }
    }
}

/// How one notification's delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The target took it.
    Sent,
    /// Every attempt failed; the last one's reason.
    Failed(String),
    /// The shutdown deadline (described) passed before it went out.
    OutOfTime(String),
}

/// [`deliver_with_retries`] within `deadline`: an attempt is cut when the deadline passes, no
/// attempt or retry starts after it. Returns how the delivery ended and how many attempts began.
pub async fn deliver_with_retries_until(
    client: &reqwest::Client,
    target: &Target,
    n: &Notification,
    cfg: &NotifyConfig,
    cwd: &std::path::Path,
    deadline: Option<&Deadline>,
) -> (Delivery, u32) {
    let Some(deadline) = deadline else {
        let (result, attempts) = deliver_with_retries(client, target, n, cfg, cwd).await;
        return (
            result.map_or_else(Delivery::Failed, |()| Delivery::Sent),
            attempts,
        );
    };
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        if deadline.is_past() {
            return (Delivery::OutOfTime(deadline.describe()), attempt);
        }
        attempt += 1;
        // A command target's own time limit is cut too, so its process ends with the attempt.
        let mut cut = cfg.clone();
        if let Some(at) = deadline.at() {
            cut.timeout = cut
                .timeout
                .min(at.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(1));
        }
        let result = tokio::select! {
            biased;
            () = deadline.passed() => return (Delivery::OutOfTime(deadline.describe()), attempt),
            result = deliver(client, target, n, &cut, cwd) => result,
        };
        match result {
            Ok(()) => return (Delivery::Sent, attempt),
            Err(why) if attempt >= cfg.attempts.max(1) => return (Delivery::Failed(why), attempt),
            Err(_) => {}
        }
        tokio::select! {
            biased;
            () = deadline.passed() => return (Delivery::OutOfTime(deadline.describe()), attempt),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff *= 2;
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

/// Appends one delivery to `.ralph/notifications.jsonl`; `undelivered` marks a notification the
/// shutdown deadline cut off (`"undelivered": true`).
fn record(
    log: &PathBuf,
    n: &Notification,
    target: &Target,
    result: &Result<(), String>,
    attempts: u32,
    undelivered: bool,
) {
    let mut line = json!({
        "at": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "kind": n.kind, "run_id": n.run_id, "target": target.to_string(),
        "ok": result.is_ok(), "attempts": attempts, "error": result.as_ref().err(),
    });
    if undelivered {
        line["undelivered"] = json!(true);
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{line}");
    }
}
