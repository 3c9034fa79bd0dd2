//! Stage 4 of an iteration, pure: from how the agent's process ended, what it reported and what
//! stage 3 observed, decide the [`Outcome`], the message the ledger and terminal show, the
//! findings beyond the story, and the feedback for the next prompts.
//!
//! The outcome is decided in a fixed order: how the process ended (ralph's own kills), then a
//! stop that cut the verify gate short (`interrupted`: the iteration could not be judged), then
//! the agent's failure class, then prd.json validity, then the verify gate, then the claim (the
//! promise printed too early, or a pass ralph refused: no work, or rewritten criteria), then the
//! story, then errors, then change (what the checkpoint changes beyond notes).

use std::time::Duration;

use super::inspect::{Observation, Refusal};
use crate::completion::promise_in_final_text;
use crate::process::{EndReason, ProcessOutcome};
use crate::protocol::{AgentReport, FailureClass, Outcome};
use crate::run::feedback::Feedback;

/// The settings the messages quote.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--timeout`.
    pub timeout: Duration,
    /// The timeout this iteration had (shorter when `--max-duration` cut it).
    pub iteration_timeout: Duration,
    /// `--idle-timeout`.
    pub idle_timeout: Duration,
    /// `--max-duration`.
    pub max_duration: Option<Duration>,
}

/// What the classifier needs besides the observation.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The iteration's story.
    pub story_id: &'a str,
    /// The run id (named in the history-rewrite finding).
    pub run_id: &'a str,
    /// The iteration number.
    pub iteration: u32,
    /// How the agent's process ended.
    pub process: &'a ProcessOutcome,
    /// What the agent reported.
    pub report: &'a AgentReport,
    /// Whether the backend has a terminal event (exec does not).
    pub has_final_event: bool,
    /// The limits quoted in messages.
    pub limits: Limits,
}

/// Stage 4's value.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The outcome.
    pub outcome: Outcome,
    /// Why, for the ledger and the terminal (findings appended).
    pub message: Option<String>,
    /// What changed beyond the story, one sentence each.
    pub findings: Vec<String>,
    /// Lines for the next prompts, each tagged with the story it is about.
    pub feedback: Vec<Feedback>,
    /// Whether the completion promise ended the agent's final text.
    pub promise_seen: bool,
}

/// Runs stage 4 (see the module docs).
pub fn classify(f: &Facts<'_>, obs: &Observation) -> Verdict {
    let promise_seen = f
        .report
        .final_text
        .as_deref()
        .is_some_and(promise_in_final_text);
    let outcome = outcome(f, obs, promise_seen);
    // A premature claim is either the promise printed too early or a refused pass.
    let promise_claim = promise_seen && !obs.open_after.is_empty();
    let mut message = outcome_message(outcome, f, obs)
        .filter(|_| outcome != Outcome::PrematureClaim || promise_claim);
    let mut feedback: Vec<Feedback> =
        outcome_feedback(outcome, f.story_id, obs, message.as_deref())
            .filter(|_| outcome != Outcome::PrematureClaim || promise_claim)
            .into_iter()
            .collect();
    for (id, why) in &obs.refused {
        let (said, told) = refusal_text(id, *why);
        append(&mut message, said);
        feedback.push(Feedback::about(id, told));
    }
    if !obs.criteria_proposals.is_empty() {
        let ids: Vec<&str> = obs
            .criteria_proposals
            .iter()
            .map(|p| p.story_id.as_str())
            .collect();
        feedback.push(Feedback::general(format!(
            "In the previous iteration you rewrote the acceptance criteria of {} in prd.json. A story's criteria are not yours to change: ralph put the original text back, and it is what the story is judged against. If a criterion is wrong, do the rest of the work and explain the problem in the story's `notes`; a person will decide.",
            ids.join(", ")
        )));
    }
    for id in &obs.already_satisfied {
        append(
            &mut message,
            format!("{id} was already satisfied: the iteration changed no code, and its verify command passes on the tree as it is (verified, no code change needed)"),
        );
    }
    if obs.marked_by_ralph {
        append(
            &mut message,
            format!(
                "{} passes its verify command, so ralph marked it passing (verify_marks_passing)",
                f.story_id
            ),
        );
    }
    for v in obs.verify.iter().filter(|v| v.interrupted) {
        append(
            &mut message,
            format!(
                "verify for {}: `{}` {}; passes set back to false",
                v.story_id,
                v.command,
                v.result.as_deref().unwrap_or("was interrupted")
            ),
        );
    }
    for v in obs.verify.iter().filter(|v| !v.passed && !v.interrupted) {
        let result = v.result.as_deref().unwrap_or("failed");
        append(
            &mut message,
            format!(
                "verify failed for {}: `{}` {result}; passes set back to false",
                v.story_id, v.command
            ),
        );
        feedback.push(Feedback::about(
            &v.story_id,
            format!(
                "ralph ran the check for {} (`{}`) after you marked it passing, and it failed ({result}), so its passes was set back to false. The end of its output:\n{}",
                v.story_id, v.command, v.output_tail
            ),
        ));
    }
    let findings = findings(f, obs);
    if !findings.is_empty() {
        feedback.push(Feedback::general(format!(
            "ralph noticed changes beyond your story's passes and notes in the previous iteration ({}'s): {}. Work only on the current story, change only its `passes` and `notes` in prd.json, and never rewrite git history or switch branches.",
            f.story_id,
            findings.join("; ")
        )));
        append(&mut message, findings.join("; "));
    }
    Verdict {
        outcome,
        message,
        findings,
        feedback,
        promise_seen,
    }
}

fn append(message: &mut Option<String>, more: String) {
    *message = Some(match message.take() {
        Some(m) => format!("{m}; {more}"),
        None => more,
    });
}

/// What the ledger says about a refused pass, and what the next prompt tells the agent.
fn refusal_text(id: &str, why: Refusal) -> (String, String) {
    match why {
        Refusal::NotesOnly => (
            format!("{id} was marked passing on an iteration that changed nothing but notes (prd.json, progress.txt, progress-history/), and no earlier iteration of it did any work; ralph set its passes back to false"),
            format!("In the previous iteration you set {id}'s passes to true, but the iteration changed nothing except notes (prd.json, progress.txt): no code, no test, no commit. ralph set it back to false. A story passes only on an iteration that does its work: change the code (and tests) it needs, then mark it passing."),
        ),
        Refusal::AgentFailed => (
            format!("{id} was marked passing by an agent that then failed, and it has no check that passed; ralph set its passes back to false"),
            format!("In the previous iteration you set {id}'s passes to true, but you then ended with an error, so ralph did not count the pass. Finish {id}, make sure its checks pass, and end without an error."),
        ),
        Refusal::CriteriaEdited => (
            format!("{id} was marked passing in the iteration that rewrote its acceptance criteria; ralph put the criteria back and set its passes back to false"),
            format!("In the previous iteration you rewrote {id}'s acceptance criteria and marked it passing. ralph put the original criteria back and did not count the pass: meet the criteria as written, then mark it passing."),
        ),
    }
}

/// The outcome, in the order the module docs give.
fn outcome(f: &Facts<'_>, obs: &Observation, promise_seen: bool) -> Outcome {
    match f.process.end {
        EndReason::Cancelled => return Outcome::Interrupted,
        EndReason::TimedOut => return Outcome::Timeout,
        EndReason::Idle => return Outcome::Stalled,
        EndReason::Exited | EndReason::KilledAfterFinal => {}
    }
    // The agent ended, but a stop came before its checks could run or while one ran.
    if obs.stopped_in_gate {
        return Outcome::Interrupted;
    }
    match f.report.failure {
        Some(FailureClass::Auth) => return Outcome::AuthError,
        Some(FailureClass::Config) => return Outcome::ConfigError,
        Some(FailureClass::UsageLimit) => return Outcome::UsageLimit,
        Some(FailureClass::Transient) => return Outcome::Transient,
        Some(FailureClass::Context) | None => {}
    }
    if obs.corrupted.is_some() {
        return Outcome::PrdCorrupted;
    }
    if obs.verify.iter().any(|v| !v.passed && !v.interrupted) {
        return Outcome::VerifyFailed;
    }
    if promise_seen && !obs.open_after.is_empty() {
        return Outcome::PrematureClaim;
    }
    // A pass set by an agent that failed is the agent's error, with the claim refused.
    if obs
        .refused
        .iter()
        .any(|(id, why)| id == f.story_id && *why == Refusal::AgentFailed)
    {
        return Outcome::AgentError;
    }
    // A pass the iteration did not earn (notes only, or its criteria rewritten) is a claim, not
    // a pass.
    if obs.refused.iter().any(|(id, _)| id == f.story_id) {
        return Outcome::PrematureClaim;
    }
    if obs.flipped.iter().any(|id| id == f.story_id) {
        return Outcome::StoryPassed;
    }
    // Notes in prd.json or progress.txt alone are not work: an agent that only writes down
    // that it is stuck must reach the no-progress limit like one that changes nothing. An
    // agent's commits count by what they change (a commit that removes every file from the
    // index, which the checkpoint stages back, changes nothing).
    let changed = !obs.files_changed.is_empty() && !obs.memory_only;
    let exited = f.process.end == EndReason::Exited;
    let failed_exit = exited && f.process.exit_code != Some(0);
    let no_final = f.has_final_event && !f.report.saw_final;
    if f.report.is_error || failed_exit || (no_final && exited && !changed) {
        return Outcome::AgentError;
    }
    if changed {
        Outcome::Progress
    } else {
        Outcome::NoProgress
    }
}

fn outcome_message(outcome: Outcome, f: &Facts<'_>, obs: &Observation) -> Option<String> {
    let report = f.report;
    let agent_said = || {
        report
            .error_message
            .as_deref()
            .map(|m| truncate_chars(m.lines().last().unwrap_or(m), 300))
    };
    let dur = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
    let open = &obs.open_after;
    match outcome {
        Outcome::PrematureClaim => Some(format!(
            "completion promise printed while {} still ha{} passes=false",
            open.join(", "),
            if open.len() == 1 { "s" } else { "ve" }
        )),
        Outcome::PrdCorrupted => obs.corrupted.as_deref().map(|e| {
            format!(
                "prd.json was invalid after the iteration and was restored: {}",
                // The error's lines name the problems (a list after a header ending in `:`);
                // its hints are for humans editing by hand.
                truncate_chars(
                    &e.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty() && !l.starts_with("hint:"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    500
                )
            )
        }),
        // The last iteration of a run with --max-duration gets only what is left of it.
        Outcome::Timeout if f.limits.iteration_timeout < f.limits.timeout => Some(format!(
            "killed when the run reached --max-duration {} ({} into the iteration)",
            dur(f.limits.max_duration.unwrap_or_default()),
            dur(f.limits.iteration_timeout)
        )),
        Outcome::Timeout => Some(format!(
            "killed after the iteration time limit of {}",
            dur(f.limits.timeout)
        )),
        Outcome::Stalled => Some(format!(
            "killed after {} without output (idle limit)",
            dur(f.limits.idle_timeout)
        )),
        Outcome::Interrupted if f.process.end != EndReason::Cancelled => Some(
            "interrupted by Ctrl-C or a stop signal while ralph checked the stories the agent marked passing; changes kept in a checkpoint commit".into(),
        ),
        Outcome::Interrupted => {
            Some("interrupted by Ctrl-C or a stop signal; changes kept in a checkpoint commit".into())
        }
        Outcome::AgentError => agent_said().or_else(|| {
            Some(match (f.process.exit_code, report.saw_final) {
                (Some(0), false) => "the agent exited 0 without its final result event; its output is in the transcript".to_string(),
                (Some(code), _) => format!("the agent exited with code {code} and gave no error message; its output is in the transcript"),
                (None, _) => "the agent was killed by a signal; its output is in the transcript".to_string(),
            })
        }),
        Outcome::AuthError
        | Outcome::ConfigError
        | Outcome::UsageLimit
        | Outcome::Transient => agent_said(),
        _ => None,
    }
}

/// Feedback for the next attempt, by outcome: about the story itself, or (a premature claim, a
/// broken prd.json) for whichever story comes next.
fn outcome_feedback(
    outcome: Outcome,
    story: &str,
    obs: &Observation,
    message: Option<&str>,
) -> Option<Feedback> {
    let msg = message.unwrap_or("");
    let open = &obs.open_after;
    Some(match outcome {
        Outcome::PrematureClaim => Feedback::general(format!(
            "Your completion claim was premature: {} still ha{} passes=false in prd.json. Print the promise only when every story passes.",
            open.join(", "),
            if open.len() == 1 { "s" } else { "ve" }
        )),
        Outcome::PrdCorrupted => Feedback::general(format!(
            "prd.json was not valid after the previous iteration, so ralph restored the earlier version ({msg}). Edit only the `passes` and `notes` fields, and keep it valid JSON."
        )),
        Outcome::Timeout => Feedback::about(story, format!("The previous iteration was {msg}. Work in smaller steps and commit as you go.")),
        Outcome::Stalled => Feedback::about(story, format!("The previous iteration was {msg}. Avoid commands that wait for input or run forever.")),
        Outcome::AgentError => Feedback::about(story, format!("The previous iteration ended with an agent error: {msg}")),
        Outcome::NoProgress => Feedback::about(story, format!(
            "The previous iteration changed nothing but notes (no commit, no file change beyond prd.json and progress.txt). Make concrete progress on {story}."
        )),
        Outcome::Progress => Feedback::about(story, format!(
            "The previous iteration made changes but {story} does not pass yet: finish it, run the checks, and mark it as passing (set its passes to true in prd.json, or call mark_story if you have that tool)."
        )),
        _ => return None,
    })
}

/// What the iteration did beyond its story, in a fixed order.
fn findings(f: &Facts<'_>, obs: &Observation) -> Vec<String> {
    let mut out = Vec::new();
    let others: Vec<&str> = obs
        .flipped
        .iter()
        .filter(|id| *id != f.story_id)
        .map(String::as_str)
        .collect();
    if !others.is_empty() {
        out.push(format!(
            "passes set to true on {} during {}'s iteration",
            others.join(", "),
            f.story_id
        ));
    }
    if !obs.reverted.is_empty() {
        out.push(format!(
            "passes set back to false on {}",
            obs.reverted.join(", ")
        ));
    }
    out.extend(obs.guard.iter().cloned());
    out.extend(obs.guard_restored.iter().cloned());
    if !obs.destroyed.is_empty() {
        let short: Vec<&str> = obs
            .destroyed
            .iter()
            .map(|s| s.get(..12).unwrap_or(s))
            .collect();
        out.push(format!(
            "the agent destroyed history: it deleted ralph's references and pruned the commits they kept, so ralph could not put back {} commit{} it had recorded ({}; the first is this iteration's start); the branch holds only what the agent left, and the ledger keeps the record of those iterations",
            short.len(),
            if short.len() == 1 { "" } else { "s" },
            short.join(", ")
        ));
    } else if let Some(rewrite) = &obs.history_rewrite {
        out.push(rewrite.sentence(&format!("refs/ralph/{}/{}/start", f.run_id, f.iteration)));
    }
    if !obs.passes_kept.is_empty() {
        out.push(format!(
            "{} passed before the history rewrite and still pass{} (ralph put {} passes back)",
            obs.passes_kept.join(", "),
            if obs.passes_kept.len() == 1 { "es" } else { "" },
            if obs.passes_kept.len() == 1 {
                "its"
            } else {
                "their"
            }
        ));
    }
    if !obs.lost_commits.is_empty() {
        let short: Vec<&str> = obs
            .lost_commits
            .iter()
            .map(|s| s.get(..12).unwrap_or(s))
            .collect();
        out.push(format!(
            "the agent's commit{} {} {} on no branch any more (reset or deleted); kept as {}",
            if short.len() == 1 { "" } else { "s" },
            short.join(", "),
            if short.len() == 1 { "is" } else { "are" },
            short
                .iter()
                .map(|s| format!("refs/ralph/{}/{}/lost-{s}", f.run_id, f.iteration))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out.extend(obs.branches_kept.iter().cloned());
    if let Some((before, after)) = &obs.branch_moved {
        out.push(format!(
            "HEAD moved from {} to {}{}",
            before.as_deref().unwrap_or("a detached HEAD"),
            after.as_deref().unwrap_or("a detached HEAD"),
            obs.branch_back
                .as_deref()
                .map(|b| format!("; {b}"))
                .unwrap_or_default()
        ));
    }
    if !obs.refused_off_branch.is_empty() {
        out.push(format!(
            "{} set back to not passing: the work is not on the feature branch",
            obs.refused_off_branch.join(", ")
        ));
    }
    out
}

/// `s` cut to `max` characters with `…`.
pub fn truncate_chars(s: &str, max: usize) -> String {
    crate::protocol::fields::truncate_chars(s, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::VerifyRecord;

    fn facts<'a>(process: &'a ProcessOutcome, report: &'a AgentReport) -> Facts<'a> {
        Facts {
            story_id: "US-001",
            run_id: "r",
            iteration: 1,
            process,
            report,
            has_final_event: true,
            limits: Limits {
                timeout: Duration::from_secs(60),
                iteration_timeout: Duration::from_secs(60),
                idle_timeout: Duration::from_secs(30),
                max_duration: None,
            },
        }
    }

    fn exited(code: i32) -> ProcessOutcome {
        ProcessOutcome {
            forks_before: None,
            end: EndReason::Exited,
            exit_code: Some(code),
            signal: None,
            pid: 1,
            elapsed: Duration::from_secs(1),
        }
    }

    fn done() -> AgentReport {
        AgentReport {
            saw_final: true,
            ..AgentReport::default()
        }
    }

    #[test]
    fn a_failed_verify_of_another_story_feeds_back_to_that_story_only() {
        let p = exited(0);
        let r = done();
        let obs = Observation {
            verify: vec![VerifyRecord {
                story_id: "US-002".into(),
                command: "./check.sh".into(),
                passed: false,
                result: Some("exited with code 1".into()),
                output_tail: "boom".into(),
                interrupted: false,
            }],
            files_changed: vec!["a".into()],
            open_after: vec!["US-001".into(), "US-002".into()],
            ..Observation::default()
        };
        let v = classify(&facts(&p, &r), &obs);
        assert_eq!(v.outcome, Outcome::VerifyFailed);
        let about_2: Vec<_> = v
            .feedback
            .iter()
            .filter(|f| f.story_id.as_deref() == Some("US-002"))
            .collect();
        assert_eq!(about_2.len(), 1, "{:?}", v.feedback);
        assert!(about_2[0].text.contains("boom"));
        assert!(v
            .feedback
            .iter()
            .all(|f| f.story_id.is_some() || !f.text.contains("US-002")));
    }

    #[test]
    fn the_order_of_outcomes_holds() {
        let r = done();
        let mut obs = Observation {
            open_after: vec!["US-002".into()],
            flipped: vec!["US-001".into()],
            ..Observation::default()
        };
        assert_eq!(
            outcome(&facts(&exited(0), &r), &obs, false),
            Outcome::StoryPassed
        );
        assert_eq!(
            outcome(&facts(&exited(0), &r), &obs, true),
            Outcome::PrematureClaim
        );
        obs.corrupted = Some("bad".into());
        assert_eq!(
            outcome(&facts(&exited(0), &r), &obs, true),
            Outcome::PrdCorrupted
        );
        let mut limited = done();
        limited.failure = Some(FailureClass::UsageLimit);
        assert_eq!(
            outcome(&facts(&exited(0), &limited), &obs, true),
            Outcome::UsageLimit
        );
        let mut timed_out = exited(0);
        timed_out.end = EndReason::TimedOut;
        assert_eq!(
            outcome(&facts(&timed_out, &limited), &obs, true),
            Outcome::Timeout
        );
        // A refused pass is a claim, whatever else the iteration did.
        let refused = Observation {
            refused: vec![("US-001".into(), Refusal::NotesOnly)],
            files_changed: vec!["prd.json".into()],
            memory_only: true,
            open_after: vec!["US-001".into()],
            ..Observation::default()
        };
        assert_eq!(
            outcome(&facts(&exited(0), &r), &refused, false),
            Outcome::PrematureClaim
        );
        let v = classify(&facts(&exited(0), &r), &refused);
        assert!(v
            .message
            .as_deref()
            .is_some_and(|m| m.contains("changed nothing but notes")));
        assert!(v
            .feedback
            .iter()
            .any(|f| f.story_id.as_deref() == Some("US-001")
                && f.text.contains("set it back to false")));
        assert!(!v
            .feedback
            .iter()
            .any(|f| f.text.contains("completion claim")));
        // A stop that cut the verify gate short: the iteration could not be judged.
        let cut = Observation {
            stopped_in_gate: true,
            unchecked: vec!["US-001".into()],
            files_changed: vec!["a".into()],
            ..Observation::default()
        };
        assert_eq!(
            outcome(&facts(&exited(0), &r), &cut, false),
            Outcome::Interrupted
        );
        // Agent commits that change nothing in the end are no progress.
        let undone = Observation {
            agent_commits: vec!["abc".into()],
            ..Observation::default()
        };
        assert_eq!(
            outcome(&facts(&exited(0), &r), &undone, false),
            Outcome::NoProgress
        );
        let quiet = Observation::default();
        assert_eq!(
            outcome(&facts(&exited(0), &r), &quiet, false),
            Outcome::NoProgress
        );
        assert_eq!(
            outcome(&facts(&exited(2), &r), &quiet, false),
            Outcome::AgentError
        );
    }
}
