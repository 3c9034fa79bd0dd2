//! GitHub Actions awareness, only when `GITHUB_ACTIONS=true` (the runner sets it):
//!
//! - each iteration's log lines are folded into a `::group::` (opened at `iteration_started`,
//!   closed before whatever comes after the iteration); groups do not nest, so while more than
//!   one iteration is in flight (`--parallel`) there is no group: each start and end is a plain
//!   line starting with `[iteration N]` (story, outcome, worker, landing), and a landing that
//!   conflicted or was undone is a `::notice::` naming the ref that keeps the work;
//! - a blocked story becomes a `::warning::` annotation, an auth or config error (and a push the
//!   remote refused) an `::error::` one, a push that could not reach the remote a `::warning::`;
//! - at the end, the Markdown report is appended to `$GITHUB_STEP_SUMMARY`, and the run's
//!   numbers are written to `$GITHUB_OUTPUT`: `exit_code`, `stop_reason`, `passed`, `open`,
//!   `open_stories`, `blocked`, `cost_usd`, `branch`, `resume_at`, `run_id`,
//!   `unpushed_commits`.
//!
//! Workflow commands go to stderr, where the terminal output goes (the runner reads commands
//! from both streams, and `--json` keeps stdout to itself). Missing or unwritable files are
//! skipped with a warning on stderr: the run never fails for its CI decorations.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;

use super::Sink;
use crate::protocol::run_event::RunSummary;
use crate::protocol::{LedgerRecord, Outcome, PushStatus, RunEvent};

/// Renders the Markdown report of the run that just finished (called once, at the end).
pub type MarkdownReport = Box<dyn FnMut() -> Option<String> + Send>;

/// The GitHub Actions sink (see the module docs).
pub struct GitHubActions {
    summary_file: Option<PathBuf>,
    output_file: Option<PathBuf>,
    branch: Option<String>,
    run_id: Option<String>,
    report: MarkdownReport,
    in_group: bool,
    /// The iterations started and not yet finished.
    in_flight: BTreeSet<u32>,
    /// The iteration whose group is open (the only one in flight when it started).
    grouped: Option<u32>,
    err: Box<dyn std::io::Write + Send>,
}

/// What the sink reads from the environment.
#[derive(Debug, Clone, Default)]
pub struct RunnerEnv {
    /// `GITHUB_ACTIONS`: the sink exists only when it is `true`.
    pub github_actions: bool,
    /// `GITHUB_STEP_SUMMARY`: the file the step's Markdown summary is appended to.
    pub step_summary: Option<PathBuf>,
    /// `GITHUB_OUTPUT`: the file the step's outputs are appended to.
    pub output: Option<PathBuf>,
}

impl RunnerEnv {
    /// The runner's variables from this process's environment.
    pub fn from_env() -> RunnerEnv {
        let path = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        RunnerEnv {
            github_actions: std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true"),
            step_summary: path("GITHUB_STEP_SUMMARY"),
            output: path("GITHUB_OUTPUT"),
        }
    }
}

impl GitHubActions {
    /// The sink, when `env` says the run is under GitHub Actions (else `None`). `branch` is
    /// prd.json's `branchName`; `report` renders the Markdown summary at the end.
    pub fn new(
        env: &RunnerEnv,
        branch: Option<String>,
        report: MarkdownReport,
    ) -> Option<GitHubActions> {
        Self::with_writer(env, branch, report, Box::new(std::io::stderr()))
    }

    /// [`GitHubActions::new`] writing the workflow commands to `err` (tests).
    pub fn with_writer(
        env: &RunnerEnv,
        branch: Option<String>,
        report: MarkdownReport,
        err: Box<dyn std::io::Write + Send>,
    ) -> Option<GitHubActions> {
        env.github_actions.then(|| GitHubActions {
            summary_file: env.step_summary.clone(),
            output_file: env.output.clone(),
            branch,
            run_id: None,
            report,
            in_group: false,
            in_flight: BTreeSet::new(),
            grouped: None,
            err,
        })
    }

    /// Prints a workflow command (the job's log is often public: secrets redacted).
    fn command(&mut self, line: String) {
        let line = crate::redact::redact_env(&line);
        let _ = writeln!(self.err, "{line}");
        let _ = self.err.flush();
    }

    fn end_group(&mut self) {
        self.grouped = None;
        if std::mem::take(&mut self.in_group) {
            self.command("::endgroup::".into());
        }
    }

    /// An iteration starts: its group when it is the only one in flight, else a plain line
    /// (and the group of the one before is closed: groups cannot overlap).
    fn started(&mut self, iteration: u32, story: &str, worker: Option<u32>) {
        self.end_group();
        self.in_flight.insert(iteration);
        if self.in_flight.len() == 1 {
            self.command(format!(
                "::group::iteration {iteration} · {}",
                escape_data(story)
            ));
            self.in_group = true;
            self.grouped = Some(iteration);
        } else {
            let worker = worker.map(|w| format!(" (worker {w})")).unwrap_or_default();
            // A plain line, on one line: a story's text cannot start a workflow command.
            self.command(super::text::one_line(
                &format!("[iteration {iteration}] started: {story}{worker}"),
                500,
            ));
        }
    }

    /// An iteration that ran outside a group (beside others) ends: one plain line, and a
    /// notice when its work did not land.
    fn ended(&mut self, r: &LedgerRecord) {
        let was_alone = self.grouped == Some(r.iteration);
        self.in_flight.remove(&r.iteration);
        if was_alone {
            return;
        }
        let worker = r.worker.map(|w| format!(" [w{w}]")).unwrap_or_default();
        let landing = r
            .landing
            .as_ref()
            .map(|l| format!(" · landed: {}", super::text::landing_short(l)))
            .unwrap_or_default();
        let why = r
            .primary_message()
            .map(|m| format!(" · {m}"))
            .unwrap_or_default();
        self.command(super::text::one_line(
            &format!(
                "[iteration {}]{worker} {}: {}{landing}{why}",
                r.iteration,
                r.story_id,
                r.outcome.as_str()
            ),
            500,
        ));
    }

    fn annotate(&mut self, level: &str, title: &str, message: &str) {
        // Redacted before escaping, which could split a secret.
        self.command(format!(
            "::{level} title={}::{}",
            escape_property(&crate::redact::redact_env(title)),
            escape_data(&crate::redact::redact_env(message))
        ));
    }

    fn iteration(&mut self, r: &LedgerRecord) {
        self.ended(r);
        let why = r.primary_message().unwrap_or("no message");
        match r.outcome {
            Outcome::AuthError => self.annotate(
                "error",
                "ralph: the agent is not logged in",
                &format!("iteration {} ({}): {why}", r.iteration, r.story_id),
            ),
            Outcome::ConfigError => self.annotate(
                "error",
                "ralph: the agent's configuration is wrong",
                &format!("iteration {} ({}): {why}", r.iteration, r.story_id),
            ),
            _ => {}
        }
        if let Some(l) = &r.landing {
            use crate::protocol::record::LandingKind;
            if let (LandingKind::Conflict | LandingKind::Reverted, Some(saved)) =
                (l.kind, &l.salvage_ref)
            {
                let what = match l.kind {
                    LandingKind::Conflict => "conflicted with the run branch",
                    _ => "failed its check with the other landed stories present and was undone",
                };
                self.annotate(
                    "notice",
                    &format!("ralph: {} did not land", r.story_id),
                    &format!(
                        "iteration {} ({}): its work {what}; kept under {saved}{}",
                        r.iteration,
                        r.story_id,
                        l.message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ),
                );
            }
        }
        if let Some(p) = &r.push {
            let detail = p.error.as_deref().unwrap_or("no message");
            match p.status {
                PushStatus::Pushed => {}
                PushStatus::Unreachable => self.annotate(
                    "warning",
                    "ralph: push failed",
                    &format!(
                        "iteration {} is not on {} yet ({} attempts): {detail}",
                        r.iteration, p.remote, p.attempts
                    ),
                ),
                PushStatus::Rejected => self.annotate(
                    "error",
                    "ralph: push rejected",
                    &format!("{} refused {}: {detail}", p.remote, p.branch),
                ),
                PushStatus::LeaseLost => self.annotate(
                    "error",
                    "ralph: lease lost",
                    &format!("{}: {detail}", p.branch),
                ),
            }
        }
    }

    fn finished(&mut self, s: &RunSummary) {
        if s.exit_code == 1 {
            let text = s.stop_reason.sentence();
            self.annotate("error", "ralph: a human must act", &text);
        }
        if let Some(file) = self.summary_file.clone() {
            if let Some(mut md) = (self.report)() {
                md.push_str(&format!(
                    "\n**Exit code:** {} ({})\n",
                    s.exit_code,
                    s.stop_reason.kind()
                ));
                if let Some(at) = s.resume_at {
                    md.push_str(&format!(
                        "\n**Resumable at:** {} (rerun the job then)\n",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ));
                }
                if let Some(p) = s.push.as_ref().filter(|p| p.unpushed_commits > 0) {
                    md.push_str(&format!(
                        "\n**Not pushed:** {} commit(s) of {} are not on {}\n",
                        p.unpushed_commits, p.branch, p.remote
                    ));
                }
                self.append(&file, &format!("{md}\n"), "GITHUB_STEP_SUMMARY");
            }
        }
        if let Some(file) = self.output_file.clone() {
            let text = outputs(s, self.branch.as_deref(), self.run_id.as_deref())
                .into_iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect::<String>();
            self.append(&file, &text, "GITHUB_OUTPUT");
        }
    }

    /// Appends to `$GITHUB_STEP_SUMMARY` or `$GITHUB_OUTPUT` (secrets redacted: the summary is
    /// often public, the outputs reach other jobs).
    fn append(&mut self, file: &PathBuf, text: &str, var: &str) {
        let text = crate::redact::redact_env(text);
        let result = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = result {
            let message = format!("cannot write ${var} ({}): {e}", file.display());
            self.annotate("warning", "ralph", &message);
        }
    }
}

impl Sink for GitHubActions {
    fn on(&mut self, event: &RunEvent) {
        match event {
            RunEvent::RunStarted { run_id, .. } => self.run_id = Some(run_id.clone()),
            RunEvent::IterationStarted {
                iteration,
                story_id,
                story_title,
                worker,
                agent,
                backend,
                ..
            } => {
                // Fallback agents: the title names the agent (`… · backup (codex)`).
                let on = agent
                    .as_deref()
                    .map(|a| format!(" · {}", super::human::agent_label(Some(a), backend)))
                    .unwrap_or_default();
                self.started(
                    *iteration,
                    &format!("{story_id} {story_title}{on}"),
                    *worker,
                )
            }
            RunEvent::IterationFinished { record, .. } => self.iteration(record),
            RunEvent::StoryBlocked {
                story_id,
                attempts,
                last_outcome,
                last_message,
            } => {
                self.end_group();
                self.annotate(
                    "warning",
                    "ralph: story blocked",
                    &format!(
                        "{story_id} is blocked after {attempts} attempt{} (last: {last_outcome}{})",
                        if *attempts == 1 { "" } else { "s" },
                        last_message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ),
                );
            }
            RunEvent::Waiting { .. } => self.end_group(),
            RunEvent::RunFinished(summary) => {
                self.end_group();
                self.finished(summary);
            }
            _ => {}
        }
    }

    fn close(&mut self) {
        self.end_group();
    }

    /// An `::error` annotation, a line in the step summary, and the outputs a workflow can
    /// branch on: `exit_code`, `stop_reason=error`, `branch` (the others empty).
    fn failed(&mut self, exit_code: i32, message: &str) {
        self.end_group();
        self.annotate("error", "ralph: the run ended with an error", message);
        if let Some(file) = self.summary_file.clone() {
            let md = format!(
                "## ralph\n\n**The run ended with an error** (exit code {exit_code}): {message}\n\n"
            );
            self.append(&file, &md, "GITHUB_STEP_SUMMARY");
        }
        if let Some(file) = self.output_file.clone() {
            let one_line = message
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let text = format!(
                "exit_code={exit_code}\nstop_reason=error\nerror={one_line}\nbranch={}\nrun_id={}\n",
                self.branch.as_deref().unwrap_or_default(),
                self.run_id.as_deref().unwrap_or_default()
            );
            self.append(&file, &text, "GITHUB_OUTPUT");
        }
    }
}

/// The `$GITHUB_OUTPUT` pairs of a finished run (values on one line; absent ones empty).
pub fn outputs(
    s: &RunSummary,
    branch: Option<&str>,
    run_id: Option<&str>,
) -> Vec<(&'static str, String)> {
    let branch = s
        .push
        .as_ref()
        .map(|p| p.branch.clone())
        .or(branch.map(str::to_owned))
        .unwrap_or_default();
    vec![
        ("exit_code", s.exit_code.to_string()),
        ("stop_reason", s.stop_reason.kind().to_owned()),
        ("passed", s.passed.to_string()),
        ("open", s.open.len().to_string()),
        ("open_stories", s.open.join(",")),
        ("blocked", s.blocked.join(",")),
        (
            "cost_usd",
            s.cost_usd.map(|c| format!("{c:.4}")).unwrap_or_default(),
        ),
        ("branch", branch),
        (
            "resume_at",
            s.resume_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default(),
        ),
        ("run_id", run_id.unwrap_or_default().to_owned()),
        (
            "unpushed_commits",
            s.push
                .as_ref()
                .map(|p| p.unpushed_commits.to_string())
                .unwrap_or_default(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.replace(['\r', '\n'], " ")))
    .collect()
}

/// A workflow command's message: `%`, CR and LF escaped.
fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value: as [`escape_data`], and `:` and `,` too.
fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_escape_what_would_end_them() {
        assert_eq!(escape_data("50% done\nnext"), "50%25 done%0Anext");
        assert_eq!(escape_property("a: b, c"), "a%3A b%2C c");
    }

    #[test]
    fn nothing_happens_outside_github_actions() {
        let env = RunnerEnv {
            github_actions: false,
            step_summary: Some("/tmp/x".into()),
            output: Some("/tmp/y".into()),
        };
        assert!(GitHubActions::new(&env, None, Box::new(|| None)).is_none());
    }

    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    fn sink() -> (GitHubActions, Buffer) {
        let env = RunnerEnv {
            github_actions: true,
            step_summary: None,
            output: None,
        };
        let err = Buffer::default();
        let sink = GitHubActions::with_writer(&env, None, Box::new(|| None), Box::new(err.clone()))
            .unwrap();
        (sink, err)
    }

    fn started(iteration: u32, story: &str, worker: Option<u32>) -> RunEvent {
        RunEvent::IterationStarted {
            iteration,
            slot: iteration,
            max_iter: 5,
            story_id: story.into(),
            story_title: "Title".into(),
            backend: "claude".into(),
            agent: None,
            worker,
        }
    }

    fn finished(
        iteration: u32,
        story: &str,
        outcome: Outcome,
        landing: Option<LandingRecord>,
    ) -> RunEvent {
        let mut record = LedgerRecord::new("r", iteration, story, outcome, chrono::Utc::now());
        record.worker = landing.as_ref().map(|_| iteration);
        record.landing = landing;
        RunEvent::IterationFinished {
            iteration,
            record: Box::new(record),
            slot: iteration,
            max_iter: 5,
        }
    }

    use crate::protocol::record::{LandingKind, LandingRecord};

    /// Serial: one group per iteration, closed before what comes next, as always.
    #[test]
    fn a_serial_run_folds_each_iteration_into_a_group() {
        let (mut sink, err) = sink();
        sink.on(&started(1, "US-001", None));
        sink.on(&finished(1, "US-001", Outcome::StoryPassed, None));
        sink.on(&started(2, "US-002", None));
        sink.on(&finished(2, "US-002", Outcome::StoryPassed, None));
        sink.close();
        assert_eq!(
            err.lines(),
            [
                "::group::iteration 1 · US-001 Title",
                "::endgroup::",
                "::group::iteration 2 · US-002 Title",
                "::endgroup::",
            ]
        );
    }

    /// Overlapping iterations (1 starts, 2 starts, 2 ends, 1 ends): no nested or interleaved
    /// groups; the first one's group closes when the second starts, and every later start and
    /// end is a plain line naming its iteration, story, worker and landing; a conflict is a
    /// notice naming the salvage ref in full.
    #[test]
    fn overlapping_iterations_get_plain_lines_named_by_iteration_instead_of_groups() {
        let (mut sink, err) = sink();
        let ff = LandingRecord {
            kind: LandingKind::FastForward,
            resolves: None,
            onto: None,
            commit: None,
            salvage_ref: None,
            files: Vec::new(),
            landed_since: Vec::new(),
            message: None,
        };
        let conflict = LandingRecord {
            kind: LandingKind::Conflict,
            resolves: None,
            salvage_ref: Some("refs/ralph/salvage/r/US-001".into()),
            files: vec!["src/a.rs".into()],
            ..ff.clone()
        };
        sink.on(&started(1, "US-001", Some(1)));
        sink.on(&started(2, "US-002", Some(2)));
        sink.on(&finished(2, "US-002", Outcome::StoryPassed, Some(ff)));
        sink.on(&finished(1, "US-001", Outcome::Conflict, Some(conflict)));
        sink.on(&started(3, "US-003", Some(1)));
        sink.close();
        let lines = err.lines();
        assert_eq!(
            lines,
            [
                "::group::iteration 1 · US-001 Title",
                "::endgroup::",
                "[iteration 2] started: US-002 Title (worker 2)",
                "[iteration 2] [w2] US-002: story_passed · landed: ff",
                "[iteration 1] [w1] US-001: conflict · landed: conflict → refs/ralph/salvage/r/US-001",
                "::notice title=ralph%3A US-001 did not land::iteration 1 (US-001): its work conflicted with the run branch; kept under refs/ralph/salvage/r/US-001",
                // Alone again: a group.
                "::group::iteration 3 · US-003 Title",
                "::endgroup::",
            ],
            "{lines:#?}"
        );
    }

    /// A run that ends with an error quoting a key (a shape redacted wherever it comes from):
    /// the annotation, the step summary and the `error` output show `<redacted>`.
    #[test]
    fn a_failed_run_quotes_no_key_in_annotations_summary_or_outputs() {
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Shared {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let env = RunnerEnv {
            github_actions: true,
            step_summary: Some(dir.path().join("summary.md")),
            output: Some(dir.path().join("output")),
        };
        let err = Shared::default();
        let mut sink =
            GitHubActions::with_writer(&env, None, Box::new(|| None), Box::new(err.clone()))
                .unwrap();
        let key = "sk-ant-api03-Qw12Er34Ty56Ui78Op90As";
        sink.failed(1, &format!("the agent said: invalid x-api-key {key}"));
        let annotations = String::from_utf8(err.0.lock().unwrap().clone()).unwrap();
        let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
        let output = std::fs::read_to_string(dir.path().join("output")).unwrap();
        for (place, text) in [
            ("annotations", &annotations),
            ("summary", &summary),
            ("outputs", &output),
        ] {
            assert!(!text.contains(key), "{place}: {text}");
            assert!(
                text.contains("invalid x-api-key <redacted>"),
                "{place}: {text}"
            );
        }
    }
}
