//! How an iteration ended ([`Outcome`], a closed set written to the ledger, the commit trailers
//! and progress.txt) and the one table of what each outcome counts toward ([`OutcomeRules`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How an iteration ended. Every ledger record has exactly one; on the wire it is the snake_case
/// name (`story_passed`, `usage_limit`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The picked story went from `passes: false` to `true` and prd.json is valid.
    StoryPassed,
    /// The agent committed or changed files, but the story does not pass yet.
    Progress,
    /// The agent exited normally without changing anything.
    NoProgress,
    /// The agent printed the completion promise while stories were still open, or marked its
    /// story passing on an iteration that did no work for it (nothing but notes changed, here
    /// and in its earlier iterations) or that rewrote its acceptance criteria; that `passes` was
    /// set back to false.
    PrematureClaim,
    /// The agent failed (non-zero exit or an error result) for a reason not classified below.
    AgentError,
    /// The iteration hit its wall-clock limit and was killed.
    Timeout,
    /// The agent produced no output for the idle limit and was killed.
    Stalled,
    /// A subscription or API usage limit; the run waits for the reset (`resume_at`).
    UsageLimit,
    /// Overload, 5xx or network trouble; retried with backoff.
    Transient,
    /// Bad or expired credentials; the run stops.
    AuthError,
    /// A deterministic setup problem (bad flag, nested session, root without sandbox); the run
    /// stops.
    ConfigError,
    /// The agent left prd.json unparsable or invalid; ralph restored the snapshot.
    PrdCorrupted,
    /// The user's verify command failed after the agent finished.
    VerifyFailed,
    /// Stopped by Ctrl-C, SIGTERM or SIGHUP (or found in flight after a crash).
    Interrupted,
    /// `--parallel`: the story's work could not land on the run branch because it conflicts
    /// with stories landed meanwhile (a check failing once they are present is `verify_failed`,
    /// landing `reverted`). Nothing is lost: its commits are kept under
    /// `refs/ralph/salvage/<run>/<story>` (the record's `landing`) and its next attempt starts
    /// from the new tip with the conflict as feedback.
    Conflict,
    /// `--parallel`: the story's worktree could not be set up (`worktree_copy`,
    /// `worktree_setup` or the submodules failed). No agent ran; the story is blocked.
    SetupFailed,
    /// `--parallel`: the story passed in its worktree, but ralph refused to land it because
    /// the main checkout holds a change of the user's where the landing would write (an edited
    /// tracked file, an untracked file in the way). Nothing of the user's is touched; the
    /// story's work is kept under `refs/ralph/salvage/<run>/<story>` (the record's `landing`)
    /// and the run stops for the user. Not an attempt: the story's next attempt starts from there.
    LandingRefused,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 17] = [
        Outcome::StoryPassed,
        Outcome::Progress,
        Outcome::NoProgress,
        Outcome::PrematureClaim,
        Outcome::AgentError,
        Outcome::Timeout,
        Outcome::Stalled,
        Outcome::UsageLimit,
        Outcome::Transient,
        Outcome::AuthError,
        Outcome::ConfigError,
        Outcome::PrdCorrupted,
        Outcome::VerifyFailed,
        Outcome::Interrupted,
        Outcome::Conflict,
        Outcome::SetupFailed,
        Outcome::LandingRefused,
    ];

    /// The snake_case wire name, e.g. `"story_passed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::StoryPassed => "story_passed",
            Outcome::Progress => "progress",
            Outcome::NoProgress => "no_progress",
            Outcome::PrematureClaim => "premature_claim",
            Outcome::AgentError => "agent_error",
            Outcome::Timeout => "timeout",
            Outcome::Stalled => "stalled",
            Outcome::UsageLimit => "usage_limit",
            Outcome::Transient => "transient",
            Outcome::AuthError => "auth_error",
            Outcome::ConfigError => "config_error",
            Outcome::PrdCorrupted => "prd_corrupted",
            Outcome::VerifyFailed => "verify_failed",
            Outcome::Interrupted => "interrupted",
            Outcome::Conflict => "conflict",
            Outcome::SetupFailed => "setup_failed",
            Outcome::LandingRefused => "landing_refused",
        }
    }

    /// What this outcome counts toward and what the run does next: the one table the policy
    /// ([`crate::protocol`] users such as `run::policy`) and the state rebuild read.
    pub fn rules(self) -> OutcomeRules {
        use Next::*;
        use Streak::*;
        let (uses_budget, attempt, streak, next) = match self {
            Outcome::StoryPassed => (true, true, Reset, Continue),
            Outcome::Progress => (true, true, Reset, Continue),
            Outcome::NoProgress => (true, true, Reset, Continue),
            Outcome::PrematureClaim => (true, true, Reset, Continue),
            Outcome::AgentError => (true, true, Failure, Continue),
            Outcome::Timeout => (true, true, Failure, Continue),
            Outcome::Stalled => (true, true, Failure, Continue),
            Outcome::PrdCorrupted => (true, true, Failure, Continue),
            Outcome::VerifyFailed => (true, true, Failure, Continue),
            // Not the agent's work: retried without using the budget or an attempt.
            Outcome::UsageLimit => (false, false, Neutral, WaitForReset),
            Outcome::Transient => (false, false, Neutral, RetryAfterBackoff),
            // The agent never got to work (its login failed): neither the budget nor an attempt,
            // and nothing said of the story's streaks. A human must log in: the run stops, or
            // with fallback agents left this agent is taken out and the story goes on with them.
            Outcome::AuthError => (false, false, Neutral, StopNeedsHuman),
            // A human must act: the run stops at once.
            Outcome::ConfigError => (true, true, Reset, StopNeedsHuman),
            // The user's Ctrl-C, or a crash: not the story's failure.
            Outcome::Interrupted => (true, false, Neutral, StopInterrupted),
            // The agent worked, its work did not fit with the others': an attempt, retried from
            // the new tip (no streak: the agent did nothing wrong).
            Outcome::Conflict => (true, true, Neutral, Continue),
            // No agent ran: neither the budget nor an attempt; the loop blocks the story.
            Outcome::SetupFailed => (false, false, Neutral, Continue),
            // The agent's work is done and kept; the user's checkout is in the way: the run
            // stops for the user, no attempt spent.
            Outcome::LandingRefused => (true, false, Neutral, StopNeedsHuman),
        };
        OutcomeRules {
            uses_budget,
            attempt,
            streak,
            next,
        }
    }

    /// Whether this iteration uses up one of the run's `--max-iter` budget (see
    /// [`OutcomeRules::uses_budget`]).
    pub fn counts_as_iteration(self) -> bool {
        self.rules().uses_budget
    }

    /// Whether this iteration is an attempt at its story (see [`OutcomeRules::attempt`]).
    pub fn is_attempt(self) -> bool {
        self.rules().attempt
    }

    /// Whether this outcome is a failure of the iteration (it extends the `--max-failures`
    /// streak).
    pub fn is_failure(self) -> bool {
        self.rules().streak == Streak::Failure
    }
}

/// What one [`Outcome`] counts toward, and what the run does after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeRules {
    /// Uses one iteration of the run's `--max-iter` budget. Usage limits, transient errors and
    /// auth errors do not: the agent never got to work.
    pub uses_budget: bool,
    /// Counts as an attempt at the story (toward `--max-attempts`, after which it is blocked).
    /// Usage limits, transient errors, auth errors and interruptions do not.
    pub attempt: bool,
    /// What it does to the `--max-failures` and `--max-no-progress` streaks.
    pub streak: Streak,
    /// What the run does next.
    pub next: Next,
}

/// An outcome's effect on the streak counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streak {
    /// Extends the failure streak (`--max-failures`).
    Failure,
    /// Ends the failure streak (the no-change streak is decided by what changed).
    Reset,
    /// Neither counts nor resets any streak (not the agent's doing).
    Neutral,
}

/// What the run does after an outcome, before the budgets are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Pick the next story.
    Continue,
    /// Wait (doubling backoff) and run the same story again.
    RetryAfterBackoff,
    /// Wait for the usage limit to reset and run the same story again.
    WaitForReset,
    /// Stop: credentials or setup need a human.
    StopNeedsHuman,
    /// Stop: the user interrupted the run.
    StopInterrupted,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the [`Outcome`] wire names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown outcome `{0}` (expected one of: story_passed, progress, no_progress, premature_claim, agent_error, timeout, stalled, usage_limit, transient, auth_error, config_error, prd_corrupted, verify_failed, interrupted, conflict, setup_failed, landing_refused)")]
pub struct UnknownOutcome(pub String);

impl FromStr for Outcome {
    type Err = UnknownOutcome;

    /// Parses a snake_case wire name (exact match).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Outcome::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == s)
            .ok_or_else(|| UnknownOutcome(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_wire_names_round_trip() {
        for outcome in Outcome::ALL {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
            assert_eq!(outcome.as_str().parse::<Outcome>().unwrap(), outcome);
            assert_eq!(outcome.to_string(), outcome.as_str());
        }
        let err = "done".parse::<Outcome>().unwrap_err();
        assert!(err.to_string().contains("unknown outcome `done`"));
    }

    #[test]
    fn budget_helpers_follow_the_design() {
        assert!(!Outcome::UsageLimit.counts_as_iteration());
        assert!(!Outcome::Transient.counts_as_iteration());
        assert!(Outcome::Interrupted.counts_as_iteration());
        assert!(!Outcome::NoProgress.is_failure());
        assert!(Outcome::VerifyFailed.is_failure());
        assert!(!Outcome::Progress.is_failure());
        assert_eq!(Outcome::AuthError.rules().next, Next::StopNeedsHuman);
        assert_eq!(Outcome::Timeout.rules().next, Next::Continue);
        // Interruptions, retried failures and failed logins are never attempts at the story.
        assert!(!Outcome::AuthError.counts_as_iteration());
        for o in [
            Outcome::Interrupted,
            Outcome::UsageLimit,
            Outcome::Transient,
            Outcome::AuthError,
        ] {
            assert!(!o.is_attempt(), "{o}");
            assert_eq!(o.rules().streak, Streak::Neutral, "{o}");
        }
    }
}
