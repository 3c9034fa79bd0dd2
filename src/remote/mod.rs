//! `--push`: ralph's side of running as a job on a scheduler (GitHub Actions, Kubernetes,
//! Slurm), where any worker may pick a run up where another left it because all the state is in
//! git on a shared remote (docs/scale-out.md).
//!
//! - **The lease** ([`lease`]): before its first iteration a worker takes
//!   `refs/ralph/lease/<branch>` on the remote, renews it with every push and every third of
//!   `--lease-ttl` from a background thread, and releases it at the end. A live lease held by
//!   another worker ends the run before it starts (exit 5).
//! - **The push**: after each iteration's checkpoint, one atomic `git push` of the run branch,
//!   `refs/ralph/*` and the lease renewal. Never forced: a branch someone else moved is refused
//!   by the remote and the run stops (exit 1) with its work kept locally; a lease renewal refused
//!   means another worker took over (exit 5). A remote that cannot be reached is retried with a
//!   doubling backoff; then the run goes on locally and the summary (and exit 75) say what is
//!   not pushed.
//! - **Resume**: at the start, the remote's branch is fetched; a clone without the branch
//!   checks it out from there, one behind it moves forward to it.
//!
//! Git's network operations go through the `git` program (run by [`crate::process::capture`]),
//! so the user's credential helpers, SSH agent and URL rewrites apply; `RALPH_GIT_TOKEN`, when
//! set, is offered to git over HTTPS by a credential helper that reads the variable (the token
//! never appears on a command line). Git's messages are kept with URL credentials and the values
//! of secret-looking variables removed; the agent never sees `RALPH_GIT_TOKEN`.
//!
//! Every call blocks (a git process, and the backoff between attempts).

pub mod books;
pub mod lease;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use self::lease::{Holder, Judgement, LeaseCommit};
use crate::error::UserError;
use crate::git::Repo;
use crate::process::{Captured, SpawnSpec, StopSignals};
use crate::protocol::run_event::PushSummary;
use crate::protocol::{ExitStatus, PushRecord, PushStatus, StopReason};

/// The variable holding a token for HTTPS remotes (GitHub: a token with `contents: write`).
pub const TOKEN_VAR: &str = "RALPH_GIT_TOKEN";
/// The user name sent with [`TOKEN_VAR`] (default `x-access-token`, which GitHub expects).
pub const TOKEN_USER_VAR: &str = "RALPH_GIT_USER";

/// How `--push` talks to the remote.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The remote's name, e.g. `origin`.
    pub remote: String,
    /// How long a lease lasts without a renewal.
    pub lease_ttl: Duration,
    /// Push attempts when the remote cannot be reached (at least 1).
    pub attempts: u32,
    /// The wait after the first failed attempt; it doubles after each one.
    pub backoff: Duration,
    /// Time limit of one git network operation.
    pub op_timeout: Duration,
    /// `--shutdown-timeout`: after a signal, every push and the release end within it.
    pub shutdown_timeout: Duration,
}

/// The lease and push bookkeeping shared with the renewal thread.
#[derive(Debug, Default)]
struct Book {
    /// This worker's newest lease commit on the remote (full sha).
    last: Option<String>,
    /// Whether this worker holds the lease.
    held: bool,
    /// Another worker took the lease: who (as [`Holder::describe`] says).
    lost: Option<String>,
    /// The newest commit of the branch the remote has from this worker.
    pushed_head: Option<String>,
    /// The last push error, when the last push did not land.
    last_error: Option<String>,
    /// Whether the lease was released.
    released: bool,
    /// Whether the remote takes `--atomic` pushes.
    no_atomic: bool,
    /// Whether the local books ref starts from the remote's (fetched, or the remote has none),
    /// so that books written on top of it move the remote's ref forward.
    books_ready: bool,
}

#[derive(Debug)]
struct Shared {
    book: Mutex<Book>,
    quit: Mutex<bool>,
    wake: Condvar,
}

/// What [`Remote::open`] found and did.
#[derive(Debug, Clone, Default)]
pub struct Opened {
    /// Warnings to show: an expired or abandoned lease taken over.
    pub warnings: Vec<String>,
    /// The remote's branch head, when the remote has the branch.
    pub remote_head: Option<String>,
    /// A usage-limit reset recorded by the worker that released the lease.
    pub resume_at: Option<DateTime<Utc>>,
    /// Fallback agents: each agent's reset that worker recorded (those still ahead), by name.
    pub agent_resets: std::collections::BTreeMap<String, DateTime<Utc>>,
    /// The remote's books of the branch (`refs/ralph/books/<branch>`, fetched here), when it
    /// has them.
    pub books: Option<String>,
}

/// The run's remote: its lease and its pushes (see the module docs). Dropping it stops the
/// renewal thread and releases a lease still held (best effort, a few seconds at most).
#[derive(Debug)]
pub struct Remote {
    settings: Settings,
    root: PathBuf,
    branch: String,
    me: Holder,
    stop: StopSignals,
    shared: Arc<Shared>,
    renewer: Option<std::thread::JoinHandle<()>>,
    /// Whether this value owns the lease (the renewal thread's copy does not).
    owner: bool,
}

/// The refspec of ralph's own refs (`start`, `end` and `lost-*` pins), pushed never forced.
const RALPH_REFS: &str = "refs/ralph/*:refs/ralph/*";

/// How one `git push` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pushed {
    Ok,
    /// The remote could not be reached (or refused us in a way a retry may fix).
    Unreachable(String),
    /// The branch (or one of ralph's refs) was refused.
    Rejected(String),
    /// The lease ref was refused.
    LeaseRefused(String),
}

impl Remote {
    /// Checks that the remote exists, takes the branch's lease on it and fetches the branch,
    /// then starts the renewal thread. `run_id` names this run in the lease.
    ///
    /// # Errors
    /// A [`UserError`]: no such remote (exit 1); the remote cannot be reached after the retries
    /// (exit 75); another worker holds a live lease (exit 5, naming it).
    pub fn open(
        settings: Settings,
        root: &Path,
        branch: &str,
        run_id: &str,
        stop: &StopSignals,
    ) -> Result<(Remote, Opened), UserError> {
        let mut remote = Remote {
            settings,
            root: root.to_path_buf(),
            branch: branch.to_owned(),
            me: Holder::me(run_id),
            stop: stop.clone(),
            shared: Arc::new(Shared {
                book: Mutex::new(Book::default()),
                quit: Mutex::new(false),
                wake: Condvar::new(),
            }),
            renewer: None,
            owner: true,
        };
        remote.check_remote()?;
        let mut opened = remote.acquire()?;
        opened.remote_head = remote.fetch_branch()?;
        remote.book().pushed_head = opened.remote_head.clone();
        match remote.fetch_books() {
            Ok(books) => {
                opened.books = books;
                remote.book().books_ready = true;
            }
            Err(e) => opened.warnings.push(format!(
                "could not fetch the books of {} from {} ({e}); this run's books stay local",
                remote.branch, remote.settings.remote
            )),
        }
        remote.start_renewer();
        Ok((remote, opened))
    }

    /// The remote's name.
    pub fn name(&self) -> &str {
        &self.settings.remote
    }

    /// The run branch.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Pushes the branch, `refs/ralph/*` and a lease renewal in one atomic push, retrying an
    /// unreachable remote with backoff (within `--shutdown-timeout` after a signal). Never
    /// fails: the record says what happened.
    pub fn push(&self) -> PushRecord {
        let started = Instant::now();
        let mut book = self.book();
        let head = self.local_head();
        let mut record = PushRecord {
            remote: self.settings.remote.clone(),
            branch: self.branch.clone(),
            status: PushStatus::Pushed,
            head: head.clone(),
            attempts: 0,
            duration_s: 0.0,
            error: None,
        };
        if let Some(holder) = &book.lost {
            record.status = PushStatus::LeaseLost;
            record.error = Some(format!("the lease is held by {holder}"));
            return record;
        }
        let deadline = self.deadline(true);
        let mut wait = self.settings.backoff;
        loop {
            record.attempts += 1;
            let result = self.push_once(&mut book, head.as_deref(), deadline);
            let outcome = match result {
                Pushed::LeaseRefused(message) => match self.adopt_if_ours(&mut book) {
                    // A renewal that timed out had landed: the lease is still ours.
                    Ok(true) => continue_with(&mut record, message),
                    Ok(false) => {
                        let holder = self.remote_holder().unwrap_or(message);
                        book.held = false;
                        book.lost = Some(holder.clone());
                        record.status = PushStatus::LeaseLost;
                        record.error = Some(format!("the lease is held by {holder}"));
                        None
                    }
                    Err(message) => Some(message),
                },
                Pushed::Ok => {
                    book.pushed_head = head.clone();
                    book.last_error = None;
                    record.status = PushStatus::Pushed;
                    record.error = None;
                    None
                }
                Pushed::Rejected(message) => {
                    book.last_error = Some(message.clone());
                    record.status = PushStatus::Rejected;
                    record.error = Some(message);
                    None
                }
                Pushed::Unreachable(message) => Some(message),
            };
            let Some(message) = outcome else { break };
            // Unreachable: retry after the backoff, if the attempts and the deadline allow.
            book.last_error = Some(message.clone());
            record.status = PushStatus::Unreachable;
            record.error = Some(message);
            let out_of_time = deadline.is_some_and(|d| Instant::now() + wait >= d);
            if record.attempts >= self.settings.attempts.max(1) || out_of_time {
                break;
            }
            drop(book);
            self.sleep(wait, deadline);
            book = self.book();
            wait = wait.saturating_mul(2);
        }
        record.duration_s = started.elapsed().as_secs_f64();
        record
    }

    /// [`Remote::push`], unless the remote already has the local branch's head from this worker
    /// and nothing failed since (`None`: nothing to do).
    pub fn push_if_needed(&self) -> Option<PushRecord> {
        {
            let book = self.book();
            let head = self.local_head();
            if book.last_error.is_none() && (head.is_none() || book.pushed_head == head) {
                return None;
            }
        }
        Some(self.push())
    }

    /// Writes the run's books (`paths`' ledger and state.json) as the next commit of
    /// `refs/ralph/books/<branch>` ([`books::record`]); the next push (or the lease's release)
    /// takes it to the remote with `refs/ralph/*`. Nothing is written when the remote's books
    /// could not be fetched (a commit not on top of them would be refused, and the whole atomic
    /// push with it).
    ///
    /// # Errors
    /// A message when the commit or the ref cannot be written.
    pub fn record_books(&self, paths: &crate::workspace::RunPaths) -> Result<(), String> {
        if !self.book().books_ready {
            return Ok(());
        }
        let repo = Repo::discover(&self.root).map_err(|e| e.to_string())?;
        books::record(&repo, &self.branch, paths)
            .map(|_| ())
            .map_err(|e| format!("cannot write the books of {}: {e}", self.branch))
    }

    /// Why the run must stop because another worker took the lease, if one did.
    pub fn lost(&self) -> Option<StopReason> {
        self.book()
            .lost
            .clone()
            .map(|holder| StopReason::LeaseLost {
                remote: self.settings.remote.clone(),
                branch: self.branch.clone(),
                holder: Some(holder),
            })
    }

    /// Releases the lease (a child commit marked released, naming `resume_at` when the run
    /// stopped at a usage limit), within `--shutdown-timeout` after a signal. Returns whether
    /// the remote has the release; a lease not released lapses after `--lease-ttl`.
    pub fn release(&self, resets: &lease::Resets) -> bool {
        self.stop_renewer();
        let mut book = self.book();
        if !book.held || book.released {
            return book.released;
        }
        let deadline = self.deadline(false);
        let Ok(sha) = self.lease_commit(&book, lease::State::Released, resets) else {
            return false;
        };
        let refspec = format!("{sha}:{}", self.lease_ref());
        let timeout = self.timeout(deadline);
        // ralph's refs go along (the `end` pin written at the end of the run), not atomically:
        // a refused ralph ref must not keep the lease held.
        let landed = match self.git_push(&[&refspec, RALPH_REFS], false, timeout) {
            Pushed::Ok => true,
            Pushed::Rejected(_) => self
                .ls_remote(&[&self.lease_ref()])
                .is_ok_and(|refs| refs.iter().any(|(s, _)| *s == sha)),
            _ => false,
        };
        if landed {
            book.last = Some(sha);
            book.held = false;
            book.released = true;
        }
        landed
    }

    /// Where the remote stands for this run: the local head, the newest pushed commit, how many
    /// commits only this clone has, the last error, whether the lease was released.
    pub fn summary(&self) -> PushSummary {
        let book = self.book();
        let local_head = self.local_head();
        let unpushed = match (&local_head, Repo::discover(&self.root)) {
            (Some(head), Ok(repo)) => {
                let mut hide: Vec<String> = repo.remote_tracking_shas(&self.settings.remote);
                hide.extend(book.pushed_head.clone());
                repo.commits_not_in(head, &hide)
                    .map(|c| c.len())
                    .unwrap_or(0)
            }
            _ => 0,
        };
        PushSummary {
            remote: self.settings.remote.clone(),
            branch: self.branch.clone(),
            local_head,
            pushed_head: book.pushed_head.clone(),
            unpushed_commits: u32::try_from(unpushed).unwrap_or(u32::MAX),
            last_error: if unpushed > 0 {
                book.last_error.clone()
            } else {
                None
            },
            lease_released: book.released,
        }
    }

    // ---- set-up ----

    fn check_remote(&self) -> Result<(), UserError> {
        let out = self
            .git(&["remote", "get-url", &self.settings.remote], None)
            .map_err(|e| UserError::new(format!("cannot run git for --push: {e}")))?;
        if !out.success() {
            return Err(UserError::new(format!(
                "--push: this repository ({}) has no remote named `{}`",
                self.root.display(),
                self.settings.remote
            ))
            .with_hint(format!(
                "add it (`git remote add {} <url>`), or name another with --push REMOTE (`git remote -v` lists them)",
                self.settings.remote
            )));
        }
        Ok(())
    }

    /// Takes the lease (see [`lease::judge`]); retries when a racing worker's push landed
    /// first, to read who it was.
    fn acquire(&self) -> Result<Opened, UserError> {
        let mut opened = Opened::default();
        for _ in 0..3 {
            let current = self.with_retries("read the lease", || self.read_lease())?;
            let commit = current.as_ref().and_then(|(_, c)| c.clone());
            let judgement = lease::judge(commit.as_ref(), &self.me, Utc::now(), &pid_alive);
            match &judgement {
                Judgement::Held { holder, expires } => {
                    return Err(self.held_error(holder, *expires));
                }
                Judgement::Expired { holder, expires } => opened.warnings.push(format!(
                    "took over the lease on {} at {}: {} let it lapse at {} (that worker is presumed dead)",
                    self.branch,
                    self.settings.remote,
                    holder.describe(),
                    expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )),
                Judgement::Abandoned { holder } => opened.warnings.push(format!(
                    "took over the lease on {} at {}: its holder ({}) ran on this machine and is gone",
                    self.branch,
                    self.settings.remote,
                    holder.describe()
                )),
                Judgement::Free | Judgement::Released | Judgement::Ours => {}
            }
            opened.resume_at = commit
                .as_ref()
                .and_then(|c| c.resume_at)
                .filter(|at| *at > Utc::now());
            opened.agent_resets = commit
                .as_ref()
                .map(|c| c.agent_resets.clone())
                .unwrap_or_default();
            opened.agent_resets.retain(|_, at| *at > Utc::now());
            let mut book = self.book();
            book.last = current.map(|(sha, _)| sha);
            let sha = self
                .lease_commit(&book, lease::State::Held, &lease::Resets::default())
                .map_err(|e| {
                    UserError::new(format!("--push: cannot write the lease commit: {e}"))
                })?;
            let refspec = format!("{sha}:{}", self.lease_ref());
            let pushed = self.with_retries("take the lease", || {
                match self.git_push(&[&refspec], false, Some(self.settings.op_timeout)) {
                    Pushed::Unreachable(m) => Err(m),
                    other => Ok(other),
                }
            })?;
            if pushed == Pushed::Ok {
                book.last = Some(sha);
                book.held = true;
                return Ok(opened);
            }
            // Someone else's lease landed first: read it again.
        }
        let holder = self
            .remote_holder()
            .unwrap_or_else(|| "another worker".into());
        Err(UserError::new(format!(
            "--push: the lease on {} at {} kept changing while this worker tried to take it (last held by {holder})",
            self.branch, self.settings.remote
        ))
        .with_status(ExitStatus::LeaseHeld)
        .with_hint("another worker is taking this branch at the same time; leave it to that one"))
    }

    fn held_error(&self, holder: &Holder, expires: DateTime<Utc>) -> UserError {
        UserError::new(format!(
            "--push: another worker holds the lease on {} at {}: {}, run {}, until {} unless it renews it",
            self.branch,
            self.settings.remote,
            holder.describe(),
            holder.run_id.as_deref().unwrap_or("?"),
            expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))
        .with_status(ExitStatus::LeaseHeld)
        .with_hint(format!(
            "only one worker may drive a branch; this one did nothing. Retry after that time if the holder is gone (its lease lapses then), or stop it first (`git fetch {} {} && git log -1 FETCH_HEAD` shows the lease)",
            self.settings.remote,
            self.lease_ref()
        ))
    }

    /// The remote's branch, fetched into `refs/remotes/<remote>/<branch>`; `None` when the remote
    /// has no such branch.
    fn fetch_branch(&self) -> Result<Option<String>, UserError> {
        let branch_ref = format!("refs/heads/{}", self.branch);
        let tracking = format!("refs/remotes/{}/{}", self.settings.remote, self.branch);
        let refspec = format!("+{branch_ref}:{tracking}");
        let listed = self.with_retries("list the remote's branch", || {
            self.ls_remote(&[&branch_ref])
        })?;
        if listed.is_empty() {
            return Ok(None);
        }
        self.with_retries("fetch the branch", || {
            let out = self.fetch_refspec(&refspec)?;
            if out.success() {
                Ok(())
            } else {
                Err(self.clean(&out.stderr))
            }
        })?;
        Ok(Repo::discover(&self.root)
            .ok()
            .and_then(|r| r.ref_sha(&tracking)))
    }

    /// The remote's books of the branch, fetched (forced) into the local books ref; `None` when
    /// the remote has none. `Err` is an unreachable remote or a failed fetch.
    fn fetch_books(&self) -> Result<Option<String>, String> {
        let name = books::books_ref(&self.branch);
        let listed = self.ls_remote(&[&name])?;
        if listed.is_empty() {
            return Ok(None);
        }
        let refspec = format!("+{name}:{name}");
        let out = self.fetch_refspec(&refspec)?;
        if !out.success() {
            return Err(self.clean(&out.stderr));
        }
        Ok(Repo::discover(&self.root)
            .ok()
            .and_then(|r| r.ref_sha(&name)))
    }

    /// The lease on the remote: its sha and what it says (`None` inside when ralph cannot read
    /// it), or `None` when there is none. `Err` is an unreachable remote.
    fn read_lease(&self) -> Result<Option<(String, Option<LeaseCommit>)>, String> {
        let lease_ref = self.lease_ref();
        if self.ls_remote(&[&lease_ref])?.is_empty() {
            return Ok(None);
        }
        let local = self.local_lease_ref();
        let refspec = format!("+{lease_ref}:{local}");
        let out = self.fetch_refspec(&refspec)?;
        if !out.success() {
            if out.stderr.contains("couldn't find remote ref") {
                return Ok(None);
            }
            return Err(self.clean(&out.stderr));
        }
        let repo = Repo::discover(&self.root).map_err(|e| e.to_string())?;
        let Some(sha) = repo.ref_sha(&local) else {
            return Ok(None);
        };
        let parsed = repo
            .message_of(&sha)
            .ok()
            .and_then(|m| LeaseCommit::parse(&m));
        Ok(Some((sha, parsed)))
    }

    /// After the remote refused a lease renewal: whether the lease there is still this
    /// process's own (a renewal that timed out had landed); if so it is adopted as the newest.
    fn adopt_if_ours(&self, book: &mut Book) -> Result<bool, String> {
        match self.read_lease()? {
            Some((sha, Some(commit))) if commit.holder.token == self.me.token => {
                book.last = Some(sha);
                Ok(commit.state == lease::State::Held)
            }
            _ => Ok(false),
        }
    }

    /// Who holds the lease on the remote now, as far as one look tells.
    fn remote_holder(&self) -> Option<String> {
        match self.read_lease() {
            Ok(Some((_, Some(c)))) => Some(c.holder.describe()),
            _ => None,
        }
    }

    // ---- the renewal thread ----

    fn start_renewer(&mut self) {
        let every = self.renew_every();
        let shared = Arc::clone(&self.shared);
        let mut settings = self.settings.clone();
        // A renewal never outlasts the next one's turn, nor holds up a shutdown for long.
        settings.op_timeout = settings.op_timeout.min(every).min(Duration::from_secs(20));
        let worker = Remote {
            settings,
            root: self.root.clone(),
            branch: self.branch.clone(),
            me: self.me.clone(),
            stop: self.stop.clone(),
            shared: Arc::clone(&self.shared),
            renewer: None,
            owner: false,
        };
        self.renewer = Some(std::thread::spawn(move || loop {
            {
                let quit = shared.quit.lock().unwrap_or_else(|e| e.into_inner());
                let (quit, _) = shared
                    .wake
                    .wait_timeout(quit, every)
                    .unwrap_or_else(|e| e.into_inner());
                if *quit {
                    break;
                }
            }
            worker.renew();
        }));
    }

    /// Pushes a lease renewal alone (between the pushes after iterations).
    fn renew(&self) {
        // A shutdown has the remote to itself: its push renews the lease anyway.
        if self.stop.stop.is_cancelled() {
            return;
        }
        let mut book = self.book();
        if !book.held || book.lost.is_some() || book.released {
            return;
        }
        let Ok(sha) = self.lease_commit(&book, lease::State::Held, &lease::Resets::default())
        else {
            return;
        };
        let refspec = format!("{sha}:{}", self.lease_ref());
        match self.git_push(&[&refspec], false, Some(self.settings.op_timeout)) {
            Pushed::Ok => book.last = Some(sha),
            Pushed::LeaseRefused(message) | Pushed::Rejected(message) => {
                if !matches!(self.adopt_if_ours(&mut book), Ok(true)) {
                    book.held = false;
                    book.lost = Some(self.remote_holder().unwrap_or(message));
                }
            }
            // The next renewal tries again; the lease may lapse meanwhile.
            Pushed::Unreachable(_) => {}
        }
    }

    fn stop_renewer(&self) {
        *self.shared.quit.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
    }

    // ---- git ----

    /// One push of the branch, ralph's refs and a lease renewal (atomic where the remote can).
    fn push_once(&self, book: &mut Book, head: Option<&str>, deadline: Option<Instant>) -> Pushed {
        let Ok(sha) = self.lease_commit(book, lease::State::Held, &lease::Resets::default()) else {
            return Pushed::Unreachable("cannot write the lease commit".into());
        };
        let branch = format!("refs/heads/{0}:refs/heads/{0}", self.branch);
        let lease = format!("{sha}:{}", self.lease_ref());
        let mut refspecs: Vec<&str> = vec![&lease];
        if head.is_some() {
            refspecs.push(&branch);
        }
        refspecs.push(RALPH_REFS);
        let atomic = !book.no_atomic;
        let mut result = self.git_push(&refspecs, atomic, self.timeout(deadline));
        if let Pushed::Unreachable(m) | Pushed::Rejected(m) = &result {
            if atomic && m.contains("does not support --atomic") {
                book.no_atomic = true;
                result = self.git_push(&refspecs, false, self.timeout(deadline));
            }
        }
        if result == Pushed::Ok {
            book.last = Some(sha);
        }
        result
    }

    /// `git push --porcelain` of `refspecs`, never forced, classified.
    fn git_push(&self, refspecs: &[&str], atomic: bool, timeout: Option<Duration>) -> Pushed {
        let mut args = vec!["push", "--porcelain", "--no-verify"];
        if atomic {
            args.push("--atomic");
        }
        args.push(&self.settings.remote);
        args.extend_from_slice(refspecs);
        let out = match self.git(&args, timeout) {
            Ok(out) => out,
            Err(e) => return Pushed::Unreachable(e.to_string()),
        };
        if out.timed_out {
            return Pushed::Unreachable(format!(
                "git push did not finish within {}",
                humantime::format_duration(timeout.unwrap_or_default())
            ));
        }
        if out.success() {
            return Pushed::Ok;
        }
        classify_push(&out.stdout, &self.clean(&out.stderr), &self.lease_ref())
    }

    /// `git ls-remote` of `refs`: the `(sha, ref)` pairs the remote has. `Err`: unreachable.
    fn ls_remote(&self, refs: &[&str]) -> Result<Vec<(String, String)>, String> {
        let mut args = vec!["ls-remote", "--refs", self.settings.remote.as_str()];
        args.extend_from_slice(refs);
        let out = self
            .git(&args, Some(self.settings.op_timeout))
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(self.clean(&out.stderr));
        }
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(_, r)| refs.contains(r))
            .map(|(s, r)| (s.to_owned(), r.to_owned()))
            .collect())
    }

    /// Runs `f` until it succeeds or the attempts run out (with the doubling backoff); the
    /// error says the remote cannot be reached (exit 75).
    fn with_retries<T>(
        &self,
        what: &str,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> Result<T, UserError> {
        let mut wait = self.settings.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match f() {
                Ok(v) => return Ok(v),
                Err(message) if attempt >= self.settings.attempts.max(1) => {
                    return Err(UserError::new(format!(
                        "--push: cannot {what} at {} after {attempt} attempt{}: {message}",
                        self.settings.remote,
                        if attempt == 1 { "" } else { "s" }
                    ))
                    .with_status(ExitStatus::TempFail)
                    .with_hint(
                        "check the network and the credentials (git's own, or RALPH_GIT_TOKEN); nothing was changed, so running again later is safe",
                    ));
                }
                Err(_) => {
                    self.sleep(wait, self.deadline(false));
                    wait = wait.saturating_mul(2);
                }
            }
        }
    }

    /// `git fetch --no-tags --quiet <remote> <refspec>` under the operation timeout; `Err` when
    /// git could not be run (its own failure is in the returned output).
    fn fetch_refspec(&self, refspec: &str) -> Result<Captured, String> {
        self.git(
            &[
                "fetch",
                "--no-tags",
                "--quiet",
                &self.settings.remote,
                refspec,
            ],
            Some(self.settings.op_timeout),
        )
        .map_err(|e| e.to_string())
    }

    /// `git <args>` in the repository, with ralph's environment for git (no prompts, C
    /// locale, the token helper when `RALPH_GIT_TOKEN` is set).
    fn git(
        &self,
        args: &[&str],
        timeout: Option<Duration>,
    ) -> Result<Captured, crate::process::ProcessError> {
        let mut all: Vec<String> = Vec::new();
        if std::env::var(TOKEN_VAR).is_ok_and(|t| !t.is_empty()) {
            all.extend([
                "-c".to_owned(),
                "credential.helper=".to_owned(),
                "-c".to_owned(),
                format!(
                    "credential.helper=!f() {{ test \"$1\" = get && echo \"username=${{{TOKEN_USER_VAR}:-x-access-token}}\" && echo \"password=${TOKEN_VAR}\"; }}; f"
                ),
            ]);
        }
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let spec = SpawnSpec {
            program: "git".into(),
            args: all,
            cwd: self.root.clone(),
            env_remove: Vec::new(),
            env_set: vec![
                ("GIT_TERMINAL_PROMPT".into(), "0".into()),
                ("LC_ALL".into(), "C".into()),
            ],
            stdin: None,
        };
        crate::process::capture(&spec, timeout)
    }

    // ---- small helpers ----

    fn book(&self) -> MutexGuard<'_, Book> {
        self.shared.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lease_ref(&self) -> String {
        format!("refs/ralph/lease/{}", self.branch)
    }

    /// Where the remote's lease is fetched to: outside `refs/ralph/`, which is pushed.
    fn local_lease_ref(&self) -> String {
        format!("refs/ralph-lease/{}/{}", self.settings.remote, self.branch)
    }

    fn local_head(&self) -> Option<String> {
        Repo::discover(&self.root)
            .ok()
            .and_then(|r| r.ref_sha(&format!("refs/heads/{}", self.branch)))
    }

    /// A new lease commit on top of this worker's newest one.
    fn lease_commit(
        &self,
        book: &Book,
        state: lease::State,
        resets: &lease::Resets,
    ) -> Result<String, crate::git::GitError> {
        let ttl = chrono::Duration::from_std(self.settings.lease_ttl)
            .unwrap_or_else(|_| chrono::Duration::minutes(10));
        let commit = LeaseCommit {
            branch: self.branch.clone(),
            state,
            expires: Utc::now() + ttl,
            holder: self.me.clone(),
            resume_at: resets.resume_at,
            agent_resets: resets.agents.clone(),
        };
        Repo::discover(&self.root)?.write_detached_commit(&commit.message(), book.last.as_deref())
    }

    /// After a signal: the end of `--shutdown-timeout`, less a share kept for the lease release
    /// when `keep_for_release`; `None` before any signal.
    fn deadline(&self, keep_for_release: bool) -> Option<Instant> {
        let cause = self.stop.stopped()?;
        let total = self.settings.shutdown_timeout;
        let keep = if keep_for_release {
            total
                .mul_f64(0.15)
                .max(Duration::from_millis(500))
                .min(total / 2)
        } else {
            Duration::ZERO
        };
        Some(cause.at + total - keep)
    }

    /// One git operation's time limit: the op timeout, cut to what is left before `deadline`.
    fn timeout(&self, deadline: Option<Instant>) -> Option<Duration> {
        let op = self.settings.op_timeout;
        Some(match deadline {
            Some(d) => op
                .min(d.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(200)),
            None => op,
        })
    }

    fn sleep(&self, wait: Duration, deadline: Option<Instant>) {
        let wait = match deadline {
            Some(d) => wait.min(d.saturating_duration_since(Instant::now())),
            None => wait,
        };
        std::thread::sleep(wait);
    }

    /// git's message, one line, credentials removed.
    fn clean(&self, stderr: &str) -> String {
        clean_message(stderr)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // The renewal thread's own handle (a clone without a thread) owns nothing.
        let Some(renewer) = self.renewer.take() else {
            if !self.owner {
                return;
            }
            self.give_back();
            return;
        };
        self.stop_renewer();
        // A renewal in flight ends within its own time limit; wait a little for it, no more (the
        // process ends soon anyway).
        let deadline = Instant::now() + Duration::from_secs(2);
        while !renewer.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if renewer.is_finished() {
            let _ = renewer.join();
        }
        self.give_back();
    }
}

impl Remote {
    /// Releases a lease still held when the run ended early (an error after it was taken).
    fn give_back(&mut self) {
        let held = {
            let book = self.book();
            book.held && !book.released
        };
        if held {
            // An early return (an error after the lease was taken): give the branch back.
            self.settings.op_timeout = self.settings.op_timeout.min(Duration::from_secs(5));
            self.release(&lease::Resets::default());
        }
    }

    /// How often the renewal thread renews: a third of `--lease-ttl` (at least 200 ms).
    fn renew_every(&self) -> Duration {
        (self.settings.lease_ttl / 3).max(Duration::from_millis(200))
    }
}

/// Keeps a refused lease renewal's message while the loop tries again.
fn continue_with(record: &mut PushRecord, message: String) -> Option<String> {
    record.error = Some(message.clone());
    Some(message)
}

/// Classifies a failed `git push --porcelain` from its ref lines (`!\t<src>:<dst>\t<why>`) and
/// its stderr.
fn classify_push(stdout: &str, stderr: &str, lease_ref: &str) -> Pushed {
    let mut lease_refused = None;
    let mut refused = None;
    for line in stdout.lines() {
        let mut parts = line.split('\t');
        let (Some(flag), Some(refs), Some(why)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if flag != "!" || why.contains("atomic") {
            continue;
        }
        let dst = refs.rsplit(':').next().unwrap_or(refs);
        let text = format!("{dst} {why}");
        if dst == lease_ref {
            lease_refused = Some(text);
        } else {
            refused = Some(text);
        }
    }
    if let Some(m) = lease_refused {
        return Pushed::LeaseRefused(m);
    }
    if let Some(m) = refused {
        return Pushed::Rejected(m);
    }
    if stderr.contains("does not support --atomic") {
        return Pushed::Rejected(stderr.to_owned());
    }
    Pushed::Unreachable(if stderr.trim().is_empty() {
        "git push failed without a message".to_owned()
    } else {
        stderr.to_owned()
    })
}

/// git's message as one line (at most 300 characters), with URL credentials and the values of
/// secret-looking variables removed.
pub fn clean_message(text: &str) -> String {
    static USERINFO: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = USERINFO.get_or_init(|| {
        regex::Regex::new(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@").expect("regex")
    });
    let one: String = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let one = re.replace_all(&one, "${scheme}<redacted>@").into_owned();
    let one = crate::redact::redact_env(&one);
    if one.chars().count() > 300 {
        let cut: String = one.chars().take(300).collect();
        format!("{cut}…")
    } else {
        one
    }
}

/// Whether process `pid` exists on this machine (Linux `/proc`).
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_lose_url_credentials() {
        let m = clean_message(
            "fatal: unable to access 'https://bot:ghp_abcdef123456@github.com/o/r.git/': 403\n",
        );
        assert_eq!(
            m,
            "fatal: unable to access 'https://<redacted>@github.com/o/r.git/': 403"
        );
    }

    #[test]
    fn refused_refs_are_told_apart_from_an_unreachable_remote() {
        let lease = "refs/ralph/lease/ralph/x";
        let out = "To /r.git\n!\trefs/heads/ralph/x:refs/heads/ralph/x\t[rejected] (fetch first)\n!\tabc:refs/ralph/lease/ralph/x\t[rejected] (atomic push failed)\nDone\n";
        assert!(
            matches!(classify_push(out, "", lease), Pushed::Rejected(m) if m.contains("fetch first"))
        );
        let out = "To /r.git\n!\trefs/heads/ralph/x:refs/heads/ralph/x\t[rejected] (atomic push failed)\n!\tabc:refs/ralph/lease/ralph/x\t[rejected] (non-fast-forward)\nDone\n";
        assert!(matches!(
            classify_push(out, "", lease),
            Pushed::LeaseRefused(_)
        ));
        assert!(matches!(
            classify_push(
                "",
                "fatal: '/gone.git' does not appear to be a git repository",
                lease
            ),
            Pushed::Unreachable(_)
        ));
    }
}
