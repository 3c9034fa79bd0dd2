//! The run's summary, pure: from why it stopped, the final prd.json and this run's ledger
//! records, the numbers and sentences that `run_finished` carries and the terminal prints.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::prd::model::Prd;
use crate::protocol::run_event::{PushSummary, RunSummary};
use crate::protocol::{AgentKind, LedgerRecord, Outcome, StopReason};

/// This run's iterations as running totals: what the summary and the loop need of them, kept
/// without holding every [`LedgerRecord`] in memory (a night of 10,000 iterations stays flat;
/// the ledger on disk has them all).
#[derive(Debug, Clone, Default)]
pub struct RunTotals {
    /// Iterations recorded in this run.
    pub iterations: u32,
    /// The lowest number among them (with `--parallel`, iterations are written down in the
    /// order they land, not the order they started).
    pub first_iteration: Option<u32>,
    /// The highest number among them.
    pub last_iteration: Option<u32>,
    /// The latest record, whole.
    pub last: Option<LedgerRecord>,
    /// Sum of the reported or priced costs, USD; `None` when no iteration had one.
    pub cost_usd: Option<f64>,
    /// Sum of input tokens (cache reads and writes included), when any iteration reported them.
    pub tokens_in: Option<u64>,
    /// Sum of output tokens, when any iteration reported them.
    pub tokens_out: Option<u64>,
    /// "Marked passing outside its own iteration" sentences, one per such iteration.
    pub flipped_elsewhere: Vec<String>,
    /// Per agent, for records that name one (runs with fallback agents).
    pub by_agent: Vec<crate::protocol::run_event::AgentTotals>,
    /// `--parallel`: per story, the ref its last work that did not land is kept under (a
    /// conflict, a check failing on the landed tip, an interrupted worker); a story that landed
    /// since is not in it.
    pub salvaged: std::collections::BTreeMap<String, String>,
}

impl RunTotals {
    /// Adds one iteration's record (oldest first).
    pub fn add(&mut self, r: LedgerRecord) {
        self.iterations += 1;
        self.first_iteration = Some(
            self.first_iteration
                .map_or(r.iteration, |f| f.min(r.iteration)),
        );
        self.last_iteration = Some(
            self.last_iteration
                .map_or(r.iteration, |l| l.max(r.iteration)),
        );
        let sum_f = |acc: Option<f64>, v: Option<f64>| match (acc, v) {
            (a, None) => a,
            (a, Some(v)) => Some(a.unwrap_or(0.0) + v),
        };
        let sum_u = |acc: Option<u64>, v: Option<u64>| match (acc, v) {
            (a, None) => a,
            (a, Some(v)) => Some(a.unwrap_or(0).saturating_add(v)),
        };
        self.cost_usd = sum_f(self.cost_usd, r.cost_usd);
        if let Some(landing) = &r.landing {
            use crate::protocol::LandingKind;
            match (&landing.salvage_ref, landing.kind) {
                (Some(kept), _) => {
                    self.salvaged.insert(r.story_id.clone(), kept.clone());
                }
                (None, LandingKind::FastForward | LandingKind::Merge) => {
                    self.salvaged.remove(&r.story_id);
                }
                _ => {}
            }
        }
        if let Some(agent) = &r.agent {
            match self.by_agent.iter_mut().find(|a| a.agent == *agent) {
                Some(a) => {
                    a.iterations += 1;
                    a.cost_usd = sum_f(a.cost_usd, r.cost_usd);
                }
                None => self.by_agent.push(crate::protocol::run_event::AgentTotals {
                    agent: agent.clone(),
                    iterations: 1,
                    cost_usd: r.cost_usd,
                }),
            }
        }
        self.tokens_in = sum_u(self.tokens_in, r.input_tokens());
        self.tokens_out = sum_u(self.tokens_out, r.tokens_out);
        let others: Vec<&str> = r
            .passes_flipped
            .iter()
            .filter(|id| **id != r.story_id)
            .map(String::as_str)
            .collect();
        if !others.is_empty() {
            let one = others.len() == 1;
            self.flipped_elsewhere.push(format!(
                "{} {} marked passing during iteration {} ({}), not in {} own iteration: check them",
                others.join(", "),
                if one { "was" } else { "were" },
                r.iteration,
                r.story_id,
                if one { "its" } else { "their" },
            ));
        }
        self.last = Some(r);
    }
}

/// What [`summarize`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Why the run ended.
    pub reason: &'a StopReason,
    /// prd.json at the end.
    pub prd: &'a Prd,
    /// This run's iterations.
    pub totals: &'a RunTotals,
    /// The run's wall time.
    pub elapsed: Duration,
    /// The ledger's path, for display.
    pub ledger: &'a str,
    /// The backend.
    pub agent: AgentKind,
    /// native: the API key variable.
    pub api_key_env: Option<&'a str>,
    /// Blocked stories at the end.
    pub blocked: &'a [String],
    /// Attempts per story at the end.
    pub attempts: &'a BTreeMap<String, u32>,
    /// `--push`: where the remote stands.
    pub push: Option<&'a PushSummary>,
    /// Seconds from the first signal to the end of the shutdown, when a signal ended the run.
    pub shutdown_s: Option<f64>,
    /// A usage-limit reset still pending in state.json (UTC), e.g. when Ctrl-C or SIGTERM ended
    /// the wait for it: the summary's `resume_at` when it is still in the future.
    pub pending_reset: Option<chrono::DateTime<chrono::Utc>>,
    /// `--verify`: the check of every story without its own `verify` (none: such stories are
    /// taken on the agent's word, a caveat).
    pub default_verify: Option<&'a str>,
}

/// The summary of a run (see the module docs).
pub fn summarize(i: &Input<'_>) -> RunSummary {
    let open = crate::run::policy::open_ids(i.prd);
    let total = i.prd.user_stories.len();
    let passed = total - open.len();
    let t = i.totals;
    let unpushed = i.push.is_some_and(|p| p.unpushed_commits > 0);
    let status = i.reason.exit_status().with_unpushed(unpushed);
    RunSummary {
        stop_reason: i.reason.clone(),
        exit_code: status.code(),
        headline: headline(i, open.len(), total),
        success: matches!(
            i.reason,
            StopReason::Complete | StopReason::NothingToResume { .. }
        ),
        passed,
        open,
        blocked: i.blocked.to_vec(),
        iterations: t.iterations,
        iteration_range: t.first_iteration.zip(t.last_iteration),
        elapsed_s: i.elapsed.as_secs_f64(),
        cost_usd: t.cost_usd,
        tokens_in: t.tokens_in,
        tokens_out: t.tokens_out,
        ledger: i.ledger.to_owned(),
        next: next(i),
        caveats: caveats(i),
        resume_at: i
            .reason
            .resume_at()
            .or(i.pending_reset.filter(|at| *at > chrono::Utc::now())),
        push: i.push.cloned(),
        by_agent: t.by_agent.clone(),
        shutdown_s: i.shutdown_s,
    }
}

fn headline(i: &Input<'_>, open: usize, total: usize) -> String {
    match i.reason {
        StopReason::Complete => format!("complete: every story passes ({total} of {total})"),
        StopReason::NothingToResume { why } => format!("nothing to resume: {why}"),
        StopReason::MaxIterations { max_iter, .. } => {
            format!("stopped: --max-iter {max_iter} reached with {open} of {total} stories open")
        }
        StopReason::Interrupted {
            agent_running: true,
        } => "interrupted: the current iteration was stopped and checkpointed".into(),
        StopReason::Interrupted {
            agent_running: false,
        } => "interrupted between iterations: every iteration so far is recorded and committed"
            .into(),
        // `--parallel`: the checkout switched mid-run; the iterations in flight are not written
        // down (the next run records them), so none "ended with" anything yet.
        StopReason::NeedsHuman {
            outcome: Outcome::Interrupted,
            message: Some(m),
            ..
        } if m.contains("was switched from the run branch") => {
            "stopped: the checkout was switched to another branch during the run; what landed before is on the run branch, nothing more landed, and the next run records the iterations that were in flight".into()
        }
        StopReason::NeedsHuman {
            outcome, iteration, ..
        } => format!("stopped: iteration {iteration} ended with {outcome}"),
        StopReason::UsageLimit { .. } => {
            "stopped at a usage limit before every story passed: resumable later".into()
        }
        StopReason::PushRejected { remote, .. } => {
            format!("stopped: {remote} refused the push; the work is kept on the local branch")
        }
        StopReason::LeaseLost { .. } => {
            "stopped: another worker took the branch over; the work is kept on the local branch"
                .into()
        }
        _ => "stopped by a limit before every story passed".into(),
    }
}

fn next(i: &Input<'_>) -> String {
    if let Some(p) = i.push.filter(|p| p.unpushed_commits > 0) {
        if !matches!(
            i.reason,
            StopReason::PushRejected { .. } | StopReason::LeaseLost { .. }
        ) {
            return format!(
                "push {} to {} once it can be reached (`git push {} {}`), or run `ralph run --push` again here",
                p.branch, p.remote, p.remote, p.branch
            );
        }
    }
    match i.reason {
        StopReason::Complete => "review the commits (git log) and merge the branch".into(),
        StopReason::NothingToResume { .. } if i.prd.all_pass() => {
            "nothing for a schedule to do: every story passes; review the commits (git log) and merge the branch".into()
        }
        StopReason::NothingToResume { .. } => {
            "nothing for a schedule to do: read `ralph status`, fix what stopped the last run, then `ralph run`".into()
        }
        StopReason::Interrupted { .. } => {
            "run `ralph run` again to resume where it stopped".into()
        }
        StopReason::NeedsHuman {
            outcome: Outcome::AuthError,
            ..
        } => match i.agent {
            AgentKind::Native => format!(
                "check the API key in {} (--api-key-env), then `ralph run`",
                i.api_key_env.unwrap_or("the key variable")
            ),
            _ => "log the agent in again (e.g. `claude /login`), then `ralph run`".into(),
        },
        StopReason::NeedsHuman {
            outcome: Outcome::Interrupted,
            message: Some(m),
            ..
        } if !m.contains("kept in refs/") => "fix what is named above in your checkout (changed files to commit or move, or a switch to another branch to undo: ralph never resets or moves them), then `ralph run` on the run branch: it records the stories that were in flight and keeps their work under refs/ralph/salvage/".into(),
        StopReason::NeedsHuman {
            outcome: Outcome::Interrupted,
            ..
        } => "fix what is named above in your checkout (changed files to commit or move, or a switch to another branch to undo: ralph never resets or moves them), then `ralph run`; the stories' work is kept under the refs named above".into(),
        // `--parallel`: the story landed; only ralph's own commit of its files waited.
        StopReason::NeedsHuman {
            outcome: Outcome::LandingRefused,
            message: Some(m),
            ..
        } if m.contains("another git process holds") && m.contains("left uncommitted in your checkout") => "let the other git command finish (or, if none runs, delete the lock file named above), then `ralph run`: ralph's prd.json and progress.txt, left in your checkout, go with its next commit".into(),
        StopReason::NeedsHuman {
            outcome: Outcome::LandingRefused,
            message: Some(m),
            ..
        } if m.contains("another git process holds") => "let the other git command finish (or, if none runs, delete the lock file named above), then `ralph run`: the story's next attempt starts from the ref named above".into(),
        StopReason::NeedsHuman {
            outcome: Outcome::LandingRefused,
            ..
        } => "commit or move your change named above in your checkout (ralph never resets, stashes or overwrites it), then `ralph run`: the story's next attempt starts from the ref named above".into(),
        StopReason::NeedsHuman { .. } => format!("fix the agent's setup shown above (see `{}` for the transcript), then `ralph run`", runs_dir(i.ledger)),
        StopReason::UsageLimit { .. } => {
            "`ralph run` again after the reset (it waits for a reset that has not passed)".into()
        }
        StopReason::PushRejected { remote, branch, .. } => format!(
            "reconcile the two histories (`git fetch {remote}` and `git log --oneline --graph {branch} {remote}/{branch}`), push, then `ralph run --push`"
        ),
        StopReason::LeaseLost { .. } => {
            "check who drives the branch now (the warning above names it) before running again here"
                .into()
        }
        _ => format!(
            "check `ralph status` and the transcripts in {}, then `ralph run` to continue",
            runs_dir(i.ledger)
        ),
    }
}

/// The transcripts' folder beside the ledger at `ledger` (as shown: `.ralph/runs/`, or
/// `.ralph/books/<prd path>/runs/` for a prd.json in a folder).
fn runs_dir(ledger: &str) -> String {
    match ledger.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/runs/"),
        None => "runs/".to_owned(),
    }
}

/// What the reader should check even when the run completed: stories marked passing outside
/// their own iteration, stories that pass on the agent's word alone (no `verify` checked them),
/// and blocked stories (unless that is why the run stopped).
fn caveats(i: &Input<'_>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = i.push.filter(|p| p.unpushed_commits > 0) {
        out.push(format!(
            "not pushed: {} commit{} of {} {} only in this clone{}",
            p.unpushed_commits,
            if p.unpushed_commits == 1 { "" } else { "s" },
            p.branch,
            if p.unpushed_commits == 1 { "is" } else { "are" },
            p.last_error
                .as_deref()
                .map(|e| format!(" ({} said: {e})", p.remote))
                .unwrap_or_default()
        ));
    }
    out.extend(i.totals.flipped_elsewhere.iter().cloned());
    // `--parallel`: work that did not land is never lost; say where it is.
    for (story, kept) in &i.totals.salvaged {
        if i.prd.story(story).is_some_and(|s| !s.passes) {
            out.push(format!("not landed: {story}'s last work is kept in {kept}"));
        }
    }
    let unchecked = crate::run::preflight::unchecked_stories(i.prd, i.default_verify, true);
    if !unchecked.is_empty() {
        let one = unchecked.len() == 1;
        out.push(format!(
            "taken on the agent's word: {} {} passing with no `verify` command to check {}; \
             review {} by hand",
            crate::run::preflight::id_list(&unchecked),
            if one { "is" } else { "are" },
            if one { "it" } else { "them" },
            if one { "it" } else { "them" },
        ));
    }
    let blocked_is_the_reason = matches!(
        i.reason,
        StopReason::AllBlocked { .. } | StopReason::StoryBlocked { .. }
    );
    if !i.blocked.is_empty() && !blocked_is_the_reason {
        let detail: Vec<String> = i
            .blocked
            .iter()
            .map(|id| {
                format!(
                    "{id} ({} attempts)",
                    i.attempts.get(id).copied().unwrap_or(0)
                )
            })
            .collect();
        out.push(format!(
            "blocked, so skipped: {}; `ralph run --unblock` gives {} another chance",
            detail.join(", "),
            if detail.len() == 1 { "it" } else { "them" }
        ));
    }
    if let Some(waits) = waiting_for_blocked(i.prd, i.blocked) {
        out.push(waits);
    }
    out
}

/// The open stories never attempted because they wait, directly or through other open stories,
/// for a blocked one, grouped by that story: `not attempted: US-003 waits for US-002 (blocked)`;
/// `None` when there are none.
fn waiting_for_blocked(prd: &Prd, blocked: &[String]) -> Option<String> {
    let pairs = crate::run::policy::ready::blocked_by_dependency(prd, blocked);
    if pairs.is_empty() {
        return None;
    }
    let mut roots: Vec<(&str, Vec<String>)> = Vec::new();
    for (story, root) in &pairs {
        match roots.iter_mut().find(|(r, _)| *r == root.as_str()) {
            Some((_, stories)) => stories.push(story.clone()),
            None => roots.push((root.as_str(), vec![story.clone()])),
        }
    }
    let parts: Vec<String> = roots
        .iter()
        .map(|(root, stories)| match stories.as_slice() {
            [one] => format!("{one} {}", crate::run::policy::ready::waits_for(root)),
            many => format!(
                "{} wait for {root} (blocked)",
                crate::run::preflight::id_list(many)
            ),
        })
        .collect();
    Some(format!("not attempted: {}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prd(rows: &[(&str, bool, &[&str])]) -> Prd {
        let stories: Vec<serde_json::Value> = rows
            .iter()
            .enumerate()
            .map(|(i, (id, passes, deps))| {
                serde_json::json!({"id": id, "title": id, "acceptanceCriteria": ["x"],
                    "priority": i + 1, "passes": passes, "dependsOn": deps})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"project": "p", "userStories": stories})).unwrap()
    }

    #[test]
    fn stories_waiting_for_blocked_ones_are_grouped_by_the_blocked_story() {
        let p = prd(&[
            ("A", false, &[]),
            ("B", false, &[]),
            ("C", false, &["A"]),
            ("D", false, &["B"]),
            ("E", false, &["C"]),
            ("F", true, &[]),
            ("G", false, &["F"]),
        ]);
        let blocked = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(waiting_for_blocked(&p, &[]), None);
        assert_eq!(
            waiting_for_blocked(&p, &blocked(&["B"])).as_deref(),
            Some("not attempted: D waits for B (blocked)")
        );
        assert_eq!(
            waiting_for_blocked(&p, &blocked(&["A", "B"])).as_deref(),
            Some("not attempted: C, E wait for A (blocked); D waits for B (blocked)")
        );
        // A passing story in the blocked list holds nothing back.
        assert_eq!(waiting_for_blocked(&p, &blocked(&["F"])), None);
    }

    #[test]
    fn a_long_list_of_waiting_stories_is_cut() {
        let mut rows: Vec<(String, Vec<&str>)> = vec![("A".into(), vec![])];
        rows.extend((1..=12).map(|i| (format!("S{i:02}"), vec!["A"])));
        let rows: Vec<(&str, bool, &[&str])> = rows
            .iter()
            .map(|(id, deps)| (id.as_str(), false, deps.as_slice()))
            .collect();
        let text = waiting_for_blocked(&prd(&rows), &["A".to_string()]).unwrap();
        assert_eq!(
            text,
            "not attempted: S01, S02, S03, S04, S05, S06, S07, S08, S09, S10, and 2 more wait for \
             A (blocked)"
        );
    }
}
