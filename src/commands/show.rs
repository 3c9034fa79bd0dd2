//! `ralph show <iteration>` (or `<run>:<n>`): one iteration, readable, from its ledger record,
//! its transcript and git: the header (story, backend, model, agent version, times, outcome, cost
//! and tokens), the prompt's size and where it is, the agent's messages, each tool call with its
//! input summary and its result, the verify commands and their output, the guard's findings, the
//! commits and the files changed with a diffstat; `--diff` adds the patch, `--raw` prints the
//! transcript's lines, `--json` the record and the normalized events. Works for every backend
//! (ralph's own native loop keeps its tool results in the transcript, bounded and redacted).

use std::fmt::Write as _;

use crate::cli::ShowArgs;
use crate::error::UserError;
use crate::git::Repo;
use crate::history::{History, Source};
use crate::output::text::{one_line, run_label, short_secs, usd_or_unknown};
use crate::protocol::{AgentEvent, ExitStatus, LedgerRecord};
use crate::workspace::RunPaths;

/// Longest agent message or tool result shown, head and tail, in characters.
const SHOWN_CHARS: usize = 1200;
/// Largest patch shown with `--diff`, in bytes.
const PATCH_MAX_BYTES: usize = 512 * 1024;

/// Shows one iteration (see the module docs).
///
/// # Errors
/// No prd.json; an iteration that is not recorded (naming the ones that are); an unreadable
/// ledger.
pub fn run(args: &ShowArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_books(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);
    let repo = Repo::discover(&paths.repo_root).ok();
    let history = History::load(&paths, repo.as_ref())?;
    let found = find(&history, &args.iteration)?;
    let filled = found
        .from_git
        .then(|| fill_from_git(found, repo.as_ref(), &prd));
    let record = filled.as_ref().unwrap_or(found);
    // Where the record says, else where this PRD's books keep it now (books moved into
    // `.ralph/books/<path>/` from where an older ralph wrote them).
    let transcript = record
        .transcript
        .as_ref()
        .map(|t| paths.repo_root.join(t))
        .filter(|p| p.exists())
        .or_else(|| Some(paths.transcript(&record.run_id, record.iteration)))
        .and_then(|p| crate::transcript::read_with(&p, replayer).ok());
    if args.raw {
        let Some(t) = transcript else {
            return Err(UserError::new(format!(
                "iteration {} has no transcript (it is kept in .ralph/runs/, which is missing or was cleaned)",
                record.iteration
            ))
            .into());
        };
        page(&(t.lines.join("\n") + "\n"), args.no_pager);
        return Ok(ExitStatus::Success);
    }
    if args.json {
        let events: Vec<&AgentEvent> = transcript
            .as_ref()
            .map(|t| t.events.iter().map(|(_, e)| e).collect())
            .unwrap_or_default();
        let doc = serde_json::json!({"record": record, "events": events,
            "source": history.source.as_str()});
        let doc = serde_json::to_string_pretty(&doc)?;
        println!("{}", crate::redact::redact_env(&doc));
        return Ok(ExitStatus::Success);
    }
    let mut out = String::new();
    header(
        &mut out,
        record,
        &paths,
        transcript.as_ref(),
        history.source,
    );
    agent(&mut out, transcript.as_ref());
    checks(&mut out, record);
    landing(&mut out, record);
    changes(&mut out, record, repo.as_ref(), args.diff);
    page(&out, args.no_pager);
    Ok(ExitStatus::Success)
}

/// A record rebuilt from git with what git still knows beyond the trailers: the story's title
/// (from prd.json now), the iteration's start (its `refs/ralph/<run>/<n>/start` pin, so that
/// `--diff` and the diffstat work) and the agent's own commits (from the start to ralph's
/// checkpoint, which is left out).
fn fill_from_git(r: &LedgerRecord, repo: Option<&Repo>, prd: &std::path::Path) -> LedgerRecord {
    let mut r = r.clone();
    if r.story_title.is_empty() {
        if let Ok(loaded) = crate::prd::store::load(prd) {
            if let Some(s) = loaded.prd.story(&r.story_id) {
                r.story_title = s.title.clone();
            }
        }
    }
    let Some(repo) = repo else {
        return r;
    };
    let start = repo.ref_sha(&format!("refs/ralph/{}/{}/start", r.run_id, r.iteration));
    if let (Some(start), Some(end)) = (&start, &r.checkpoint_commit) {
        if let Ok(commits) = repo.commits_between(Some(start), end) {
            r.commits = commits.into_iter().filter(|c| c != end).collect();
        }
        r.head_before = Some(start.clone());
    }
    r
}

/// The parser that rebuilds the events of a transcript written by `backend`, when there is one
/// ([`crate::agent::replay_parser`]).
fn replayer(backend: &str) -> Option<crate::transcript::Replay> {
    crate::agent::replayer(backend)
}

/// Prints `text` (redacted: a transcript or ledger written before redaction may hold a secret;
/// and without the terminal escape sequences an agent printed).
fn page(text: &str, no_pager: bool) {
    let text = &crate::output::text::readable(text);
    if no_pager {
        print!("{text}");
    } else {
        crate::process::pager::page(text);
    }
}

/// The record `wanted` names: `<n>` or `<run>:<n>` (the run as an id, prefix or suffix).
fn find<'a>(history: &'a History, wanted: &str) -> Result<&'a LedgerRecord, UserError> {
    let (run, n) = match wanted.rsplit_once(':') {
        Some((run, n)) => (Some(run), n),
        None => (None, wanted),
    };
    let n: u32 = n.trim_start_matches('#').parse().map_err(|_| {
        UserError::usage(format!("`{wanted}` is not an iteration"))
            .with_hint("give its number (`ralph show 7`) or `<run>:<n>`; `ralph log` lists them")
    })?;
    let hits: Vec<&LedgerRecord> = history
        .records
        .iter()
        .filter(|r| r.iteration == n)
        .filter(|r| {
            run.is_none_or(|id| {
                r.run_id == id || r.run_id.starts_with(id) || r.run_id.ends_with(id)
            })
        })
        .collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => {
            let last = history.last_iteration();
            Err(
                UserError::usage(format!("no iteration {wanted} is recorded")).with_hint(
                    if last == 0 {
                        "no iteration is recorded yet: start with `ralph run`".to_owned()
                    } else {
                        format!("iterations 1 to {last} are recorded; `ralph log` lists them")
                    },
                ),
            )
        }
        many => Err(UserError::usage(format!(
            "iteration {n} was recorded by {} runs: {}",
            many.len(),
            many.iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .with_hint(format!("name the run: `ralph show {}:{n}`", many[0].run_id))),
    }
}

fn header(
    out: &mut String,
    r: &LedgerRecord,
    paths: &RunPaths,
    t: Option<&crate::transcript::Recorded>,
    source: Source,
) {
    let _ = writeln!(
        out,
        "iteration {} · {} {} · {}",
        r.iteration, r.story_id, r.story_title, r.outcome
    );
    let row = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "  {k:<11} {v}");
    };
    row(
        out,
        "run",
        format!("{} ({})", r.run_id, run_label(&r.run_id)),
    );
    if source == Source::Git || r.from_git {
        row(
            out,
            "source",
            "git history only: this iteration is known from its commit's trailers, not the ledger, so there is no record of times, cost, messages or the transcript".into(),
        );
    }
    let mut backend = r.backend.clone();
    if let Some(agent) = r.agent.as_ref().filter(|a| **a != r.backend) {
        backend = format!("{agent} ({backend})");
    }
    if let Some(m) = &r.model {
        backend.push_str(&format!(", model {m}"));
    }
    if let Some(v) = &r.agent_version {
        backend.push_str(&format!(", agent {v}"));
    }
    if !backend.is_empty() {
        row(out, "backend", backend);
    }
    row(
        out,
        "time",
        format!(
            "{} → {} UTC ({})",
            r.started_at.format("%Y-%m-%d %H:%M:%S"),
            r.ended_at.format("%H:%M:%S"),
            crate::output::text::record_secs(r)
        ),
    );
    let tokens = match (r.tokens_in, r.tokens_out) {
        (None, None) => "tokens not reported".to_owned(),
        (i, o) => format!(
            "{} tokens in ({} cache read, {} cache write), {} out",
            i.unwrap_or(0),
            r.cache_read_tokens.unwrap_or(0),
            r.cache_creation_tokens.unwrap_or(0),
            o.unwrap_or(0)
        ),
    };
    let source_note = match r.cost_source {
        Some(crate::protocol::CostSource::PriceTable) => " (estimated from [prices])",
        _ => "",
    };
    row(
        out,
        "cost",
        format!("{}{source_note}, {tokens}", usd_or_unknown(r.cost_usd)),
    );
    let mut ended = match (r.exit_code, r.signal) {
        (Some(c), _) => format!("the agent exited with code {c}"),
        (None, Some(s)) => format!("the agent was killed by signal {s}"),
        _ => String::new(),
    };
    if r.promise_seen {
        ended.push_str(if ended.is_empty() { "" } else { "; " });
        ended.push_str("it printed the completion promise");
    }
    if !ended.is_empty() {
        row(out, "ended", ended);
    }
    if let Some(w) = r.worker {
        row(
            out,
            "worker",
            match &r.worktree {
                Some(tree) => format!("w{w}, in the worktree {tree}"),
                None => format!("w{w}"),
            },
        );
    } else if let Some(tree) = &r.worktree {
        row(out, "worktree", tree.clone());
    }
    if let Some(m) = &r.message {
        row(out, "why", m.clone());
    }
    if let Some(tp) = &r.transcript {
        let prompt = paths.repo_root.join(tp).with_extension("prompt.md");
        let size = std::fs::metadata(&prompt)
            .map(|m| m.len())
            .ok()
            .or_else(|| {
                t.and_then(|t| {
                    t.meta
                        .get("prompt_bytes")
                        .and_then(serde_json::Value::as_u64)
                })
            });
        row(
            out,
            "prompt",
            match size {
                Some(b) => format!("{} ({})", paths.rel(&prompt), bytes(b)),
                None => format!("{} (not kept)", paths.rel(&prompt)),
            },
        );
        row(
            out,
            "transcript",
            if t.is_some() {
                tp.clone()
            } else {
                format!("{tp} (missing)")
            },
        );
    }
}

/// A `--parallel` iteration's landing: how its work came onto the run branch, or where it is
/// kept when it did not (the ref in full, to `git checkout` or `git cherry-pick`).
fn landing(out: &mut String, r: &LedgerRecord) {
    let Some(l) = &r.landing else {
        return;
    };
    use crate::protocol::record::LandingKind;
    let what = match l.kind {
        LandingKind::FastForward => "ff: the run branch had not moved; it now points at the story's work",
        LandingKind::Merge => "merge: other stories had landed meanwhile; the story's commits were merged onto the tip",
        LandingKind::Conflict => "conflict: nothing landed; the run branch is as it was",
        LandingKind::Reverted => "reverted: the story's check failed with the other landed stories present; the landing was undone",
        LandingKind::NotLanded => "not landed: the iteration did not pass its story",
        LandingKind::Refused => &format!(
            "{}: nothing moved on the run branch",
            crate::output::text::refused_words(l.message.as_deref().or(r.message.as_deref()))
        ),
        LandingKind::Resolution => "resolution: an agent resolved an earlier landing's conflict; ralph checked it and merged the tip and the story's work",
    };
    let _ = writeln!(
        out,
        "
landing
  {what}"
    );
    let row = |out: &mut String, k: &str, v: &str| {
        let _ = writeln!(out, "  {k:<13} {v}");
    };
    if let Some(n) = l.resolves {
        row(out, "resolves", &format!("the conflict of iteration {n}"));
    }
    if let Some(onto) = &l.onto {
        row(out, "onto", onto);
    }
    if let Some(commit) = &l.commit {
        row(out, "commit", commit);
    }
    if let Some(saved) = &l.salvage_ref {
        row(out, "kept at", saved);
    }
    if !l.files.is_empty() {
        row(out, "files", &l.files.join(", "));
    }
    if !l.landed_since.is_empty() {
        row(out, "landed since", &l.landed_since.join(", "));
    }
    if let Some(m) = &l.message {
        row(out, "message", m);
    }
}

fn bytes(b: u64) -> String {
    if b < 1024 {
        format!("{b} bytes")
    } else if b < 1024 * 1024 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    }
}

/// Most lines shown of one message or result (head and tail halves).
const SHOWN_LINES: usize = 30;

/// `text` cut to its head and tail, around [`SHOWN_LINES`] lines and [`SHOWN_CHARS`]
/// characters, the size of what was left out noted.
fn head_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > SHOWN_LINES {
        let half = SHOWN_LINES / 2;
        let text = format!(
            "{}\n… ({} of {} lines left out) …\n{}",
            lines[..half].join("\n"),
            lines.len() - 2 * half,
            lines.len(),
            lines[lines.len() - half..].join("\n")
        );
        return head_tail_chars(&text);
    }
    head_tail_chars(text)
}

/// `text` cut to its head and tail around [`SHOWN_CHARS`] characters.
fn head_tail_chars(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= SHOWN_CHARS + SHOWN_CHARS / 4 {
        return text.to_owned();
    }
    let half = SHOWN_CHARS / 2;
    let head: String = chars[..half].iter().collect();
    let tail: String = chars[chars.len() - half..].iter().collect();
    format!(
        "{head}\n… ({} characters left out of {}) …\n{tail}",
        chars.len() - 2 * half,
        chars.len()
    )
}

fn indent(text: &str, prefix: &str) -> String {
    text.lines()
        .map(|l| format!("{prefix}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn agent(out: &mut String, t: Option<&crate::transcript::Recorded>) {
    let Some(t) = t else {
        return;
    };
    let _ = writeln!(out, "\nagent");
    if t.events.is_empty() {
        let _ = writeln!(
            out,
            "  (no events: see `ralph show --raw` for what it printed)"
        );
    }
    for (ms, e) in &t.events {
        let at = format!("{:>6}", short_secs(*ms as f64 / 1000.0));
        match e {
            AgentEvent::Session { model, version, .. } => {
                let _ = writeln!(
                    out,
                    "{at}  session{}{}",
                    model
                        .as_ref()
                        .map(|m| format!(" · {m}"))
                        .unwrap_or_default(),
                    version
                        .as_ref()
                        .map(|v| format!(" · {v}"))
                        .unwrap_or_default()
                );
            }
            AgentEvent::AssistantText { text } => {
                let _ = writeln!(
                    out,
                    "{at}  says:\n{}",
                    indent(&head_tail(text.trim()), "          ")
                );
            }
            AgentEvent::ToolCall { name, summary } => {
                let _ = writeln!(out, "{at}  → {name}: {}", one_line(summary, 200));
            }
            AgentEvent::ToolResult { is_error, .. } => {
                let _ = writeln!(out, "{at}    ← {}", tool_result(e, *is_error));
            }
            AgentEvent::Error { message } => {
                let _ = writeln!(out, "{at}  error: {}", one_line(message, 300));
            }
            AgentEvent::Final { text, is_error } => {
                let what = if *is_error { "final (error)" } else { "final" };
                let body = text.as_deref().map(str::trim).unwrap_or("");
                let _ = writeln!(
                    out,
                    "{at}  {what}:\n{}",
                    indent(&head_tail(body), "          ")
                );
            }
        }
    }
    for note in &t.notes {
        let _ = writeln!(out, "  note: {note}");
    }
}

/// A tool result's line: its output (head and tail) when the transcript kept it, else how it
/// ended.
fn tool_result(e: &AgentEvent, is_error: bool) -> String {
    let v = serde_json::to_value(e).unwrap_or_default();
    let output = v.get("output").and_then(serde_json::Value::as_str);
    let exit = v.get("exit_code").and_then(serde_json::Value::as_i64);
    let status = match (exit, is_error) {
        (Some(c), _) => format!("exit {c}"),
        (None, true) => "error".into(),
        (None, false) => "ok".into(),
    };
    match output {
        Some(o) if !o.trim().is_empty() => {
            format!(
                "{status}:\n{}",
                indent(&head_tail(o.trim_end()), "            ")
            )
        }
        _ => status,
    }
}

fn checks(out: &mut String, r: &LedgerRecord) {
    if !r.verify.is_empty() {
        let _ = writeln!(
            out,
            "\nverify{}",
            if r.checked_at_restart {
                " (run by the restart, on the work this interrupted iteration left)"
            } else {
                ""
            }
        );
        for v in &r.verify {
            let result = if v.passed {
                "passed".to_owned()
            } else {
                v.result.clone().unwrap_or_else(|| "failed".into())
            };
            let _ = writeln!(out, "  {}: `{}` {result}", v.story_id, v.command);
            if !v.output_tail.is_empty() {
                let _ = writeln!(out, "{}", indent(&v.output_tail, "    │ "));
            }
        }
    }
    if !r.findings.is_empty() || !r.lost_commits.is_empty() {
        let _ = writeln!(out, "\nfindings");
        for f in &r.findings {
            let _ = writeln!(out, "  ⚠ {f}");
        }
    }
    if let Some(h) = &r.history_rewrite {
        let _ = writeln!(out, "\nhistory rewritten by the agent");
        let _ = writeln!(out, "  iteration start  {}", h.start);
        let _ = writeln!(out, "  agent's HEAD     {}", h.agent_head);
        match (&h.kept_at, h.restored) {
            (Some(kept), true) => {
                let _ = writeln!(
                    out,
                    "  ralph put the branch back on the start, with the agent's changes on top"
                );
                let _ = writeln!(out, "  kept at          {kept}");
                if !h.conflicts.is_empty() {
                    let _ = writeln!(
                        out,
                        "  agent's version kept where both changed: {}",
                        h.conflicts.join(", ")
                    );
                }
            }
            _ => {
                let _ = writeln!(
                    out,
                    "  not put back: {}",
                    h.error.as_deref().unwrap_or("unknown reason")
                );
            }
        }
    }
    for p in &r.criteria_proposals {
        let _ = writeln!(
            out,
            "\nacceptance criteria the agent proposed for {} (ralph put the original back; to accept, copy them into prd.json)",
            p.story_id
        );
        let _ = writeln!(out, "  original");
        for c in &p.original {
            let _ = writeln!(out, "    - {c}");
        }
        let _ = writeln!(out, "  proposed");
        if p.proposed.is_empty() {
            let _ = writeln!(out, "    (none)");
        }
        for c in &p.proposed {
            let _ = writeln!(out, "    - {c}");
        }
    }
    if !r.strays.is_empty() {
        let _ = writeln!(out, "\nleft running, killed by ralph");
        for s in &r.strays {
            let when = match s.found {
                crate::protocol::StrayFound::AfterAgent => "after the agent exited",
                crate::protocol::StrayFound::AtRestart => "by the restart",
                crate::protocol::StrayFound::AfterVerify => "after a verify command",
            };
            let _ = writeln!(out, "  pid {} `{}` ({when})", s.pid, s.command);
        }
    }
    if r.sandbox.is_on() {
        let _ = writeln!(out, "\nsandbox  {}", r.sandbox.as_str());
        if !r.refused_hosts.is_empty() {
            let _ = writeln!(out, "  refused connections: {}", r.refused_hosts.join(", "));
        }
    }
}

fn changes(out: &mut String, r: &LedgerRecord, repo: Option<&Repo>, diff: bool) {
    let _ = writeln!(out, "\ncommits");
    if r.commits.is_empty() && r.checkpoint_commit.is_none() {
        let _ = writeln!(out, "  none");
    }
    let subject = |sha: &str| {
        repo.and_then(|g| g.commit_subject(sha).ok())
            .unwrap_or_default()
    };
    for c in &r.commits {
        let _ = writeln!(out, "  {} {} (the agent's)", short(c), subject(c));
    }
    if let Some(c) = &r.checkpoint_commit {
        let _ = writeln!(out, "  {} {} (ralph's checkpoint)", short(c), subject(c));
    }
    for c in &r.lost_commits {
        let _ = writeln!(
            out,
            "  {} {} (thrown away by the agent; kept under refs/ralph/)",
            short(c),
            subject(c)
        );
    }
    let (Some(repo), Some(a), Some(b)) = (repo, &r.head_before, &r.head_after) else {
        if !r.files_changed.is_empty() {
            let _ = writeln!(out, "\nfiles changed\n  {}", r.files_changed.join("\n  "));
        }
        return;
    };
    match repo.patch(a, b, PATCH_MAX_BYTES) {
        Ok((patch, stat)) => {
            let _ = writeln!(out, "\nfiles changed ({} → {})", short(a), short(b));
            let width = stat.iter().map(|s| s.0.len()).max().unwrap_or(0).min(60);
            for (path, add, del) in &stat {
                let _ = writeln!(out, "  {path:<width$} | +{add} -{del}");
            }
            if stat.is_empty() {
                let _ = writeln!(out, "  none");
            }
            if diff {
                let files = crate::redact::files_with_secrets(&crate::redact::current(), &patch);
                if !files.is_empty() {
                    let warning = format!(
                        "warning: this diff adds secret-looking values in {} (shown <redacted> here, but the commit holds them): rotate the key, and rewrite the commit before pushing",
                        files.join(", ")
                    );
                    eprintln!("{warning}");
                    let _ = writeln!(out, "\n{warning}");
                }
                let _ = writeln!(out, "\n{patch}");
            }
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "\nfiles changed: cannot diff {}..{}: {e}",
                short(a),
                short(b)
            );
        }
    }
}

fn short(sha: &str) -> &str {
    sha.get(..10).unwrap_or(sha)
}
