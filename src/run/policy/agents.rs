//! Which agent runs next, as pure functions of each agent's standing ([`AgentBook`]) and the
//! time. Agents are tried in their configured order (the primary first): the first one that is
//! neither limited nor taken out runs. An agent whose usage-limit reset has passed is tried again
//! (a probe: the iteration tells whether the limit is really gone); a probe that finds it still
//! limited gives it a new reset with backoff ([`super::usage_limit_until`] with its limits in a
//! row). When every agent left is limited, the run waits until the earliest reset. An agent with
//! an auth error is taken out for the rest of the run.
//!
//! The pick is per launch, so a pool of workers can ask it for each worker it starts.

use chrono::{DateTime, Utc};

/// One agent's standing in this run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentBook {
    /// Its profile's name.
    pub name: String,
    /// When its usage limit resets (`None`: not known to be limited).
    pub reset_at: Option<DateTime<Utc>>,
    /// Usage limits in a row on this agent (a limit right after its reset backs off).
    pub limits_in_a_row: u32,
    /// Taken out of the rotation for the rest of the run (an auth error).
    pub removed: bool,
    /// The agent as configured (`AgentSetup::identity`; empty when not known), stored beside
    /// its reset in state.json.
    pub identity: String,
}

impl AgentBook {
    /// A fresh book for `name`, limited until `reset_at` when that is still ahead of `now`.
    pub fn new(name: &str, reset_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> AgentBook {
        AgentBook {
            name: name.to_owned(),
            reset_at: reset_at.filter(|at| *at > now),
            limits_in_a_row: 0,
            removed: false,
            identity: String::new(),
        }
    }
}

/// The answer of [`choose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentPick {
    /// Run the agent at `index` (of the books); `probe`: its reset passed and this iteration
    /// tells whether the limit is gone.
    Run {
        /// Its place in the order.
        index: usize,
        /// Whether this is the first iteration after its reset.
        probe: bool,
    },
    /// Every agent left is limited: wait until the earliest reset.
    WaitUntil(DateTime<Utc>),
    /// Every agent was taken out.
    NoneLeft,
}

/// The agent for the next iteration at `now` (see the module docs).
pub fn choose(books: &[AgentBook], now: DateTime<Utc>) -> AgentPick {
    let mut earliest: Option<DateTime<Utc>> = None;
    for (index, b) in books.iter().enumerate() {
        if b.removed {
            continue;
        }
        match b.reset_at {
            Some(at) if at > now => earliest = Some(earliest.map_or(at, |e| e.min(at))),
            Some(_) => return AgentPick::Run { index, probe: true },
            None => {
                return AgentPick::Run {
                    index,
                    probe: false,
                }
            }
        }
    }
    earliest.map_or(AgentPick::NoneLeft, AgentPick::WaitUntil)
}

/// What the agents other than the current one offer, for [`super::decide`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Others {
    /// How many are still in the rotation (limited or not).
    pub left: usize,
    /// Whether one of them can run now.
    pub ready: bool,
    /// The earliest reset among the limited ones.
    pub earliest_reset: Option<DateTime<Utc>>,
}

/// [`Others`] of the agent at `current`, at `now`.
pub fn others(books: &[AgentBook], current: usize, now: DateTime<Utc>) -> Others {
    let mut o = Others::default();
    for (i, b) in books.iter().enumerate() {
        if i == current || b.removed {
            continue;
        }
        o.left += 1;
        match b.reset_at {
            Some(at) if at > now => {
                o.earliest_reset = Some(o.earliest_reset.map_or(at, |e| e.min(at)));
            }
            _ => o.ready = true,
        }
    }
    o
}

/// The earliest reset among the agents still in the rotation that are limited at `now` (what
/// state.json's `resume_at` says a restarted run waits for when no agent is free).
pub fn earliest_reset(books: &[AgentBook], now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    match choose(books, now) {
        AgentPick::WaitUntil(at) => Some(at),
        AgentPick::Run { .. } | AgentPick::NoneLeft => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(min: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + min * 60, 0).unwrap()
    }

    fn book(name: &str, reset: Option<i64>, removed: bool) -> AgentBook {
        AgentBook {
            name: name.into(),
            reset_at: reset.map(at),
            limits_in_a_row: 0,
            removed,
            identity: String::new(),
        }
    }

    /// Each agent's (reset minute, taken out).
    type Books = &'static [(Option<i64>, bool)];

    #[test]
    fn the_first_agent_neither_limited_nor_removed_runs_and_a_passed_reset_is_a_probe() {
        use AgentPick::*;
        #[rustfmt::skip]
        let rows: &[(Books, AgentPick)] = &[
            // (claude, codex, local) at minute 10
            (&[(None, false), (None, false)], Run { index: 0, probe: false }),
            (&[(Some(60), false), (None, false)], Run { index: 1, probe: false }),
            (&[(Some(5), false), (None, false)], Run { index: 0, probe: true }),
            (&[(Some(10), false), (None, false)], Run { index: 0, probe: true }),
            (&[(Some(60), false), (Some(30), false), (None, false)], Run { index: 2, probe: false }),
            (&[(Some(60), false), (Some(30), false)], WaitUntil(at(30))),
            (&[(None, true), (Some(30), false)], WaitUntil(at(30))),
            (&[(None, true), (Some(5), false)], Run { index: 1, probe: true }),
            (&[(None, true), (None, true)], NoneLeft),
        ];
        for (books, want) in rows {
            let books: Vec<AgentBook> = books
                .iter()
                .enumerate()
                .map(|(i, (r, x))| book(&format!("a{i}"), *r, *x))
                .collect();
            assert_eq!(choose(&books, at(10)), *want, "{books:?}");
        }
    }

    #[test]
    fn others_say_whether_a_fallback_is_free_and_when_the_next_reset_is() {
        let books = [
            book("claude", Some(60), false),
            book("codex", Some(30), false),
            book("gemini", None, true),
        ];
        assert_eq!(
            others(&books, 0, at(10)),
            Others {
                left: 1,
                ready: false,
                earliest_reset: Some(at(30))
            }
        );
        assert_eq!(
            others(&books, 1, at(40)),
            Others {
                left: 1,
                ready: false,
                earliest_reset: Some(at(60))
            }
        );
        assert!(others(&books, 1, at(61)).ready);
        assert_eq!(others(&books[..1], 0, at(0)), Others::default());
        assert_eq!(earliest_reset(&books, at(10)), Some(at(30)));
        assert_eq!(earliest_reset(&books, at(31)), None);
    }
}
