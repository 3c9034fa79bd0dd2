//! The policy as tables: one row per rule, each a situation and the decision it must give.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, TimeZone as _, Utc};

use super::agents::Others;
use super::*;
use crate::prd::model::Prd;

fn budgets() -> Budgets {
    Budgets {
        max_iter: 10,
        max_duration: None,
        max_cost: None,
        max_attempts: 3,
        max_failures: 3,
        max_no_progress: 3,
        max_transient_retries: 2,
        transient_backoff: Duration::from_secs(30),
        max_usage_limit_waits: 2,
        no_wait: false,
        usage_limit_fallback: Duration::from_secs(3600),
        usage_limit_margin: Duration::from_secs(30),
        timeout: Duration::from_secs(1800),
        stop_on_block: false,
    }
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
}

fn prd(stories: &[(&str, bool)]) -> Prd {
    let stories: Vec<serde_json::Value> = stories
        .iter()
        .enumerate()
        .map(|(i, (id, passes))| {
            serde_json::json!({"id": id, "title": id, "description": "", "acceptanceCriteria": ["x"],
                "priority": i + 1, "passes": passes, "notes": ""})
        })
        .collect();
    serde_json::from_value(
        serde_json::json!({"project": "p", "description": "", "userStories": stories}),
    )
    .unwrap()
}

fn record(outcome: Outcome, changed: bool) -> LedgerRecord {
    let mut r = LedgerRecord::new("r", 4, "US-001", outcome, now());
    if changed {
        r.files_changed = vec!["a.txt".into()];
    }
    r.message = Some("why".into());
    r
}

/// One other agent in the rotation, ready to run now.
fn a_free_fallback() -> Others {
    Others {
        left: 1,
        ready: true,
        earliest_reset: None,
    }
}

/// `left` other agents in the rotation, every one limited, the earliest back at `earliest_reset`.
fn all_limited(left: usize, earliest_reset: DateTime<Utc>) -> Others {
    Others {
        left,
        ready: false,
        earliest_reset: Some(earliest_reset),
    }
}

fn after(record: &LedgerRecord) -> Aftermath<'_> {
    Aftermath {
        record,
        story_passes: record.outcome == Outcome::StoryPassed,
        attempts: 1,
        already_blocked: false,
        resume_at: None,
        elapsed: Duration::from_secs(60),
        now: now(),
        jitter: 0.0,
        limit_repeats: 0,
        others: Default::default(),
        known_reset: None,
    }
}

/// What a decision says, short enough for a table.
fn kind(d: &Decision) -> String {
    match &d.next {
        Next::Continue if d.block => "block".into(),
        Next::Stop(r) if d.block => format!("block and stop {}", r.kind()),
        Next::Continue => "continue".into(),
        Next::Retry { wait } => format!("retry {}s", wait.as_secs()),
        Next::WaitUntil { until } => format!("wait until {}", until.format("%H:%M:%S")),
        Next::Stop(r) => format!("stop {}", r.kind()),
    }
}

#[test]
fn decide_table() {
    type Setup = fn(&mut Tally, &mut Budgets, &mut Aftermath<'_>);
    let none: Setup = |_, _, _| {};
    let rows: Vec<(&str, Outcome, bool, Setup, &str)> = vec![
        (
            "a passing story goes on",
            Outcome::StoryPassed,
            true,
            none,
            "continue",
        ),
        (
            "progress goes on",
            Outcome::Progress,
            true,
            none,
            "continue",
        ),
        (
            "Ctrl-C stops",
            Outcome::Interrupted,
            false,
            none,
            "stop interrupted",
        ),
        (
            "auth needs a human",
            Outcome::AuthError,
            false,
            none,
            "stop needs_human",
        ),
        (
            "config needs a human even on a no-change streak",
            Outcome::ConfigError,
            false,
            |t, _, _| t.unchanged_in_a_row = 2,
            "stop needs_human",
        ),
        (
            "the third attempt blocks",
            Outcome::AgentError,
            true,
            |_, _, a| a.attempts = 3,
            "block",
        ),
        (
            "an already blocked story is not blocked again",
            Outcome::AgentError,
            true,
            |_, _, a| {
                a.attempts = 3;
                a.already_blocked = true
            },
            "continue",
        ),
        (
            "the third failure in a row stops",
            Outcome::VerifyFailed,
            true,
            |t, _, _| t.failures_in_a_row = 2,
            "stop max_failures",
        ),
        (
            "no progress is not a failure",
            Outcome::NoProgress,
            false,
            |t, _, _| t.failures_in_a_row = 2,
            "continue",
        ),
        (
            "the third unchanged iteration stops",
            Outcome::NoProgress,
            false,
            |t, _, _| t.unchanged_in_a_row = 2,
            "stop no_progress",
        ),
        (
            "the third iteration that only wrote notes stops",
            Outcome::NoProgress,
            true,
            |t, _, _| t.unchanged_in_a_row = 2,
            "stop no_progress",
        ),
        (
            "the cost limit stops",
            Outcome::Progress,
            true,
            |t, b, _| {
                b.max_cost = Some(1.0);
                t.cost_usd = 1.5
            },
            "stop max_cost",
        ),
        (
            "a transient failure retries",
            Outcome::Transient,
            false,
            none,
            "retry 30s",
        ),
        (
            "the second retry waits twice as long",
            Outcome::Transient,
            false,
            |t, _, _| t.transient_in_a_row = 1,
            "retry 60s",
        ),
        (
            "too many transient failures stop",
            Outcome::Transient,
            false,
            |t, _, _| t.transient_in_a_row = 2,
            "stop transient_retries",
        ),
        (
            "a retry past --max-duration stops",
            Outcome::Transient,
            false,
            |_, b, _| b.max_duration = Some(Duration::from_secs(70)),
            "stop max_duration",
        ),
        (
            "a usage limit waits for its reset plus the margin",
            Outcome::UsageLimit,
            false,
            |_, _, a| a.resume_at = Some(now() + chrono::Duration::hours(2)),
            "wait until 14:00:30",
        ),
        (
            "a usage limit without a time waits the fallback",
            Outcome::UsageLimit,
            false,
            none,
            "wait until 13:00:30",
        ),
        (
            "a reset in the past never means waiting for the past",
            Outcome::UsageLimit,
            false,
            |_, _, a| a.resume_at = Some(now() - chrono::Duration::hours(2)),
            "wait until 12:00:30",
        ),
        (
            "--no-wait stops at a usage limit",
            Outcome::UsageLimit,
            false,
            |_, b, _| b.no_wait = true,
            "stop usage_limit",
        ),
        (
            "too many usage-limit waits stop",
            Outcome::UsageLimit,
            false,
            |t, _, _| t.usage_waits = 2,
            "stop usage_limit",
        ),
        (
            "a reset after --max-duration stops",
            Outcome::UsageLimit,
            false,
            |_, b, _| b.max_duration = Some(Duration::from_secs(600)),
            "stop usage_limit",
        ),
        (
            "a usage limit with a free fallback agent goes on at once, even with --no-wait",
            Outcome::UsageLimit,
            false,
            |_, b, a| {
                b.no_wait = true;
                a.others = a_free_fallback();
            },
            "continue",
        ),
        (
            "every agent limited: one wait until the earliest reset",
            Outcome::UsageLimit,
            false,
            |_, _, a| {
                a.resume_at = Some(now() + chrono::Duration::hours(2));
                a.others = all_limited(2, now() + chrono::Duration::minutes(10));
            },
            "wait until 12:10:30",
        ),
        (
            "every agent limited and --no-wait: stop",
            Outcome::UsageLimit,
            false,
            |_, b, a| {
                b.no_wait = true;
                a.others = all_limited(1, now());
            },
            "stop usage_limit",
        ),
        (
            "an auth error with another agent left takes this one out and goes on",
            Outcome::AuthError,
            false,
            |_, _, a| a.others = a_free_fallback(),
            "continue",
        ),
        (
            "an auth error while every other agent is limited waits for the earliest reset",
            Outcome::AuthError,
            false,
            |_, _, a| a.others = all_limited(1, now() + chrono::Duration::hours(1)),
            "wait until 13:00:30",
        ),
        (
            "an auth error while every other agent is limited stops with --no-wait",
            Outcome::AuthError,
            false,
            |_, b, a| {
                b.no_wait = true;
                a.others = all_limited(1, now() + chrono::Duration::hours(1))
            },
            "stop usage_limit",
        ),
        (
            "a limit met again while the agent's reset is ahead keeps the later reset, no backoff",
            Outcome::UsageLimit,
            false,
            |_, _, a| {
                a.limit_repeats = 1;
                a.known_reset = Some(now() + chrono::Duration::seconds(20));
                a.resume_at = Some(now() + chrono::Duration::seconds(21));
            },
            "wait until 12:00:51",
        ),
        (
            "an auth error on the last agent left stops",
            Outcome::AuthError,
            false,
            |_, _, a| a.others = Others::default(),
            "stop needs_human",
        ),
    ];
    for (name, outcome, changed, setup, want) in rows {
        let r = record(outcome, changed);
        let mut t = Tally::default();
        let mut b = budgets();
        let mut a = after(&r);
        setup(&mut t, &mut b, &mut a);
        let d = decide(&t, &b, &a);
        assert_eq!(kind(&d), want, "{name}");
    }
}

#[test]
fn a_probe_that_finds_the_agent_still_limited_backs_off_and_stays_on_the_fallback() {
    let b = budgets();
    let r = record(Outcome::UsageLimit, false);
    // The agent's stated reset has passed (a loose reset time): its second limit in a row.
    let a = Aftermath {
        resume_at: Some(now() - chrono::Duration::minutes(1)),
        limit_repeats: 1,
        others: a_free_fallback(),
        ..after(&r)
    };
    let d = decide(&Tally::default(), &b, &a);
    assert_eq!(kind(&d), "continue");
    assert_eq!(d.limit_repeats, 2);
    assert_eq!(d.resume_at, Some(now() + chrono::Duration::minutes(5)));
    assert_eq!(d.tally.usage_waits, 0, "a switch is not a wait");
    assert!(!d.drop_agent);
    let auth = record(Outcome::AuthError, false);
    let d = decide(
        &Tally::default(),
        &b,
        &Aftermath {
            others: a.others,
            ..after(&auth)
        },
    );
    assert!(d.drop_agent);
    assert_eq!(d.limit_repeats, 0);
    assert_eq!(d.tally.slot, 0, "a failed login does not use --max-iter");
}

#[test]
fn counters_follow_the_outcome_rules() {
    let b = budgets();
    let r = record(Outcome::UsageLimit, false);
    let d = decide(&Tally::default(), &b, &after(&r));
    assert_eq!(d.tally.slot, 0, "a usage limit does not use the budget");
    assert!(
        d.resume_at.is_some(),
        "the reset is persisted whatever comes next"
    );
    let r = record(Outcome::VerifyFailed, true);
    let d = decide(&Tally::default(), &b, &after(&r));
    assert_eq!((d.tally.slot, d.tally.failures_in_a_row), (1, 1));
    let blocked = decide(
        &Tally {
            failures_in_a_row: 2,
            unchanged_in_a_row: 2,
            ..Tally::default()
        },
        &b,
        &Aftermath {
            attempts: 3,
            ..after(&r)
        },
    );
    assert!(blocked.block);
    assert_eq!(
        (
            blocked.tally.failures_in_a_row,
            blocked.tally.unchanged_in_a_row
        ),
        (0, 0),
        "blocking starts the failure streak again; a changed iteration ends the no-change one"
    );
    // An agent that changes nothing: its third unchanged iteration blocks the story (the attempt
    // limit comes first) and keeps the no-change streak; the next story's first unchanged
    // iteration stops the run. A story that changed something in an earlier attempt is merely
    // hard: its block starts the streak again.
    let idle = record(Outcome::NoProgress, false);
    let blocked = decide(
        &Tally {
            unchanged_in_a_row: 2,
            ..Tally::default()
        },
        &b,
        &Aftermath {
            attempts: 3,
            ..after(&idle)
        },
    );
    assert_eq!(kind(&blocked), "block");
    assert_eq!(blocked.tally.unchanged_in_a_row, 3);
    let next = decide(&blocked.tally, &b, &after(&idle));
    assert_eq!(kind(&next), "stop no_progress");
    let hard = decide(
        &Tally {
            unchanged_in_a_row: 1,
            ..Tally::default()
        },
        &b,
        &Aftermath {
            attempts: 3,
            ..after(&idle)
        },
    );
    assert_eq!(kind(&hard), "block");
    assert_eq!(hard.tally.unchanged_in_a_row, 0);
}

#[test]
fn pick_table() {
    let b = budgets();
    let ids: BTreeSet<String> = ["US-001".to_string(), "US-002".to_string()].into();
    let open = prd(&[("US-001", false), ("US-002", false)]);
    let done = prd(&[("US-001", true), ("US-002", true)]);
    let shrunk = prd(&[("US-001", true)]);
    let blocked = vec!["US-001".to_string(), "US-002".to_string()];
    let base = |p: &'static Prd| Situation {
        prd: p,
        expected_ids: Box::leak(Box::new(ids.clone())),
        blocked: &[],
        elapsed: Duration::from_secs(1),
        interrupted: false,
        stop_requested: false,
        run_id: "r",
    };
    let open: &'static Prd = Box::leak(Box::new(open));
    let done: &'static Prd = Box::leak(Box::new(done));
    let shrunk: &'static Prd = Box::leak(Box::new(shrunk));
    let reason = |r: Result<Pick, StopReason>| match r {
        Ok(p) => format!("pick {}", p.story_id),
        Err(r) => r.kind().to_string(),
    };
    let t = Tally::default();
    assert_eq!(reason(pick(&t, &b, &base(open))), "pick US-001");
    assert_eq!(reason(pick(&t, &b, &base(done))), "complete");
    assert_eq!(reason(pick(&t, &b, &base(shrunk))), "stories_deleted");
    let s = Situation {
        interrupted: true,
        ..base(open)
    };
    assert_eq!(reason(pick(&t, &b, &s)), "interrupted");
    let s = Situation {
        stop_requested: true,
        ..base(open)
    };
    assert_eq!(reason(pick(&t, &b, &s)), "stop_requested");
    let spent = Tally {
        slot: 10,
        ..Tally::default()
    };
    assert_eq!(reason(pick(&spent, &b, &base(open))), "max_iterations");
    let short = Budgets {
        max_duration: Some(Duration::from_secs(1)),
        ..budgets()
    };
    assert_eq!(reason(pick(&t, &short, &base(open))), "max_duration");
    let s = Situation {
        blocked: &blocked,
        ..base(open)
    };
    assert_eq!(reason(pick(&t, &b, &s)), "all_blocked");
    // The last iteration's timeout is cut to what is left of --max-duration.
    let soon = Budgets {
        max_duration: Some(Duration::from_secs(61)),
        ..budgets()
    };
    let p = pick(&t, &soon, &base(open)).unwrap();
    assert_eq!(p.timeout, Duration::from_secs(60));
}

#[test]
fn waits_end_the_run_on_ctrl_c_and_ralph_stop() {
    assert_eq!(after_wait(WaitEnd::Elapsed, During::RetryWait), None);
    assert_eq!(
        after_wait(WaitEnd::StopRequested, During::UsageLimitWait),
        Some(StopReason::StopRequested {
            during: During::UsageLimitWait
        })
    );
    assert!(matches!(
        after_wait(WaitEnd::Interrupted, During::RetryWait),
        Some(StopReason::Interrupted {
            agent_running: false
        })
    ));
}

#[test]
fn a_usage_limit_repeating_right_after_a_wait_backs_off() {
    let now = now();
    let hour = Duration::from_secs(3600);
    let given = now + chrono::Duration::minutes(30);
    assert_eq!(usage_limit_until(Some(given), now, hour, 1), given);
    assert_eq!(
        usage_limit_until(None, now, hour, 1),
        now + chrono::Duration::hours(1)
    );
    let past = now - chrono::Duration::minutes(1);
    assert_eq!(
        usage_limit_until(Some(past), now, hour, 2),
        now + chrono::Duration::minutes(5)
    );
    assert_eq!(
        usage_limit_until(Some(past), now, hour, 3),
        now + chrono::Duration::minutes(10)
    );
    assert_eq!(
        usage_limit_until(Some(past), now, hour, 9),
        now + chrono::Duration::hours(1)
    );
    assert_eq!(usage_limit_until(Some(given), now, hour, 2), given);
}

/// Runs `steps` (story, outcome, message) through [`decide`] as the loop does: each story's
/// attempts counted, a blocked story remembered, the tally carried from one decision to the
/// next. No step changes a file.
fn replay(b: &Budgets, steps: &[(&str, Outcome, &str)]) -> Vec<Decision> {
    let mut t = Tally::default();
    let mut attempts: std::collections::HashMap<String, u32> = Default::default();
    let mut blocked: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (n, (story, outcome, message)) in steps.iter().enumerate() {
        let mut r = LedgerRecord::new("r", n as u32 + 1, story, *outcome, now());
        r.message = (!message.is_empty()).then(|| message.to_string());
        let tries = attempts.entry(story.to_string()).or_default();
        if outcome.is_attempt() {
            *tries += 1;
        }
        let a = Aftermath {
            attempts: *tries,
            already_blocked: blocked.iter().any(|s| s == story),
            ..after(&r)
        };
        let d = decide(&t, b, &a);
        if d.block {
            blocked.push(story.to_string());
        }
        t = d.tally.clone();
        out.push(d);
    }
    out
}

fn stop_reason(d: &Decision) -> &StopReason {
    match &d.next {
        Next::Stop(r) => r,
        other => panic!("expected a stop, got {other:?}"),
    }
}

#[test]
fn a_failure_that_repeats_across_a_block_stops_the_run_naming_it() {
    use Outcome::*;
    // A crashing agent and a hanging one, with the default limits (3 attempts, 3 failures, 3
    // unchanged): the first story is blocked after its 3 attempts (case 24), and the second
    // story's first identical failure ends the run with that failure as its cause, counted
    // right, with its last message.
    for class in [AgentError, Stalled, Timeout] {
        let steps: Vec<(&str, Outcome, &str)> = vec![
            ("US-001", class, "boom 1"),
            ("US-001", class, "boom 2"),
            ("US-001", class, "boom 3"),
            ("US-002", class, "boom 4"),
        ];
        let ds = replay(&budgets(), &steps);
        let kinds: Vec<String> = ds.iter().map(kind).collect();
        assert_eq!(
            kinds,
            ["continue", "continue", "block", "stop max_failures"],
            "{class}"
        );
        let reason = stop_reason(&ds[3]);
        let StopReason::MaxFailures {
            failures,
            cause: Some(cause),
            ..
        } = reason
        else {
            panic!("{reason:?}")
        };
        assert_eq!(*failures, 4, "{class}");
        assert_eq!(
            cause.outcomes,
            [OutcomeCount {
                outcome: class,
                count: 4
            }]
        );
        assert_eq!(cause.stories, ["US-001", "US-002"]);
        assert_eq!(cause.last_message.as_deref(), Some("boom 4"));
        let why = reason.why().unwrap();
        assert_eq!(
            why,
            format!("stopped: 4 failed iterations in a row (--max-failures 3): {class} ×4 across US-001 (blocked after failing every attempt the same way) and US-002; the last: boom 4"),
        );
    }
}

#[test]
fn a_lying_agent_stops_on_no_progress_naming_its_premature_claims() {
    use Outcome::*;
    let claim = "completion promise printed while US-001 still has passes=false";
    let steps = vec![("US-001", PrematureClaim, claim); 3]
        .into_iter()
        .chain([("US-002", PrematureClaim, claim)])
        .collect::<Vec<_>>();
    let ds = replay(&budgets(), &steps);
    assert_eq!(kind(&ds[2]), "block");
    let reason = stop_reason(&ds[3]);
    let why = reason.why().unwrap();
    assert!(
        why.ends_with(&format!(": premature_claim ×4 across US-001 (blocked after every attempt changed nothing) and US-002; the last: {claim}")),
        "{why}"
    );
    assert!(
        why.starts_with("stopped: 4 iterations in a row changed nothing"),
        "{why}"
    );
}

#[test]
fn mixed_failures_name_the_dominant_one_and_a_hard_story_starts_the_streak_again() {
    use Outcome::*;
    // --max-attempts 10: three failures in a row, two of one kind.
    let b = Budgets {
        max_attempts: 10,
        ..budgets()
    };
    let ds = replay(
        &b,
        &[
            ("US-001", AgentError, "exit 1: segfault"),
            ("US-001", VerifyFailed, "verify failed for US-001"),
            ("US-001", AgentError, "exit 1: segfault again"),
        ],
    );
    let reason = stop_reason(&ds[2]);
    let why = reason.why().unwrap();
    assert_eq!(
        why,
        "stopped: 3 failed iterations in a row (--max-failures 3): agent_error ×2, verify_failed ×1; the last agent_error: exit 1: segfault again"
    );
    // On a tie the latest outcome leads.
    let ds = replay(
        &Budgets {
            max_failures: 2,
            ..b.clone()
        },
        &[("US-001", AgentError, "a"), ("US-001", Timeout, "t")],
    );
    let StopReason::MaxFailures {
        cause: Some(cause), ..
    } = stop_reason(&ds[1])
    else {
        panic!()
    };
    assert_eq!(cause.dominant(), Some(Timeout));
    assert_eq!(cause.last_message.as_deref(), Some("t"));
    // A story whose attempts failed in different ways is hard, not a broken agent: its block
    // starts the failure streak again (the no-change streak is another rule's).
    let ds = replay(
        &Budgets {
            max_no_progress: 10,
            ..budgets()
        },
        &[
            ("US-001", Timeout, ""),
            ("US-001", AgentError, ""),
            ("US-001", Timeout, ""),
            ("US-002", AgentError, ""),
        ],
    );
    assert_eq!(kind(&ds[2]), "block");
    assert_eq!(ds[2].tally.failures_in_a_row, 0);
    assert_eq!(kind(&ds[3]), "continue");
    // A streak carried across a block goes on only with the same failure: another one starts
    // it again from itself.
    let five = Budgets {
        max_failures: 5,
        max_no_progress: 10,
        ..budgets()
    };
    let ds = replay(
        &five,
        &[
            ("US-001", AgentError, ""),
            ("US-001", AgentError, ""),
            ("US-001", AgentError, ""),
            ("US-002", Timeout, ""),
        ],
    );
    assert_eq!(ds[2].tally.failures_in_a_row, 3);
    assert_eq!(kind(&ds[3]), "continue");
    assert_eq!(ds[3].tally.failures_in_a_row, 1);
    // A story that passes in between ends every streak.
    let ds = replay(
        &five,
        &[
            ("US-001", AgentError, ""),
            ("US-001", AgentError, ""),
            ("US-001", AgentError, ""),
            ("US-002", StoryPassed, ""),
            ("US-003", AgentError, ""),
        ],
    );
    assert_eq!(ds[4].tally.failures_in_a_row, 1);
}

#[test]
fn resume_only_goes_on_only_after_stops_that_pass_by_themselves() {
    let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let go: [Option<StopReason>; 5] = [
        None,
        Some(StopReason::UsageLimit {
            resume_at: at,
            why: UsageLimitStop::NoWait,
            agents: Vec::new(),
        }),
        Some(StopReason::MaxDuration {
            max_duration_s: 60,
            during: During::BetweenIterations,
        }),
        Some(StopReason::Interrupted {
            agent_running: true,
        }),
        Some(StopReason::Interrupted {
            agent_running: false,
        }),
    ];
    for last in &go {
        assert_eq!(resumable(last.as_ref()), Ok(()), "{last:?}");
    }
    let stay: [StopReason; 6] = [
        StopReason::Complete,
        StopReason::MaxIterations {
            max_iter: 3,
            open: vec!["US-002".into()],
        },
        StopReason::MaxCost {
            spent_usd: 5.0,
            max_usd: 5.0,
            iteration: 9,
            before_start: false,
        },
        StopReason::AllBlocked {
            blocked: vec!["US-001".into()],
        },
        StopReason::StopRequested {
            during: During::BetweenIterations,
        },
        StopReason::NoWorkableStory,
    ];
    for last in &stay {
        let why = resumable(Some(last)).expect_err("not resumable");
        assert!(why.contains("resume"), "{why}");
    }
}
