//! Reading *when* a usage limit resets from the words an agent CLI uses for it.
//!
//! Each CLI says it differently (sources: `notes/agent-protocols.md` §1 claude, §2 codex, §5
//! gemini; the Anthropic API's billing message):
//!
//! | form | example |
//! |---|---|
//! | claude, legacy (1.0.x) | `Claude AI usage limit reached\|1753441200` (epoch seconds) |
//! | claude, time of day | `You've hit your session limit · resets 2pm (Europe/Berlin)`, `resets 3:45pm` |
//! | claude, date and time | `resets Apr 23 at 4pm (Asia/Kuala_Lumpur)` |
//! | codex, time of day | `try again at 3:28 PM` |
//! | codex, date | `try again at Aug 18th, 2026 3:28 PM`, `Try again Aug 18.` |
//! | Anthropic API key billing | `You will regain access on 2026-04-01 at 00:00 UTC.` |
//! | gemini, relative | `Your quota will reset after 2h30m40s.`, `Please retry in 12s` |
//! | cursor, US date | `Your usage limits will reset when your monthly cycle ends on 11/17/2025.` |
//!
//! | claude, weekly | `Weekly limit reached ∙ resets Mon 5am`, `resets Oct 9, 10am`, `resets at 5am` |
//!
//! A time without a zone is in the machine's local zone, which is the zone the CLI formatted it
//! in. A time of day (and a weekday) means its next occurrence: a time that has passed today is
//! tomorrow's, except that one passed by at most a few minutes means *now* (the message was read
//! just after the reset; claude prints minutes when the reset is not on the hour, so a bare
//! `5am` is exact). A date without a year means the next such date. So a clock time never
//! yields a time in the past. The absolute forms (an epoch, a date with its year) can be in the
//! past: [`judge`] calls such a time stale, and the report then carries no reset time (the run
//! waits `usage_limit_fallback`) and says why. Anything else gives `None`, and the caller falls
//! back to a configured wait.

use std::sync::LazyLock;

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveTime, TimeZone, Utc};
use regex::Regex;

/// How late a parsed time of day may be and still count as "today": a message read this long
/// after the reset time means the reset is now, not tomorrow.
const LATE_TOLERANCE_MINUTES: i64 = 10;

/// How far in the past a reset time may lie and still mean "now" (the reset is due) rather than
/// a stale time: a clock's skew, the seconds between the agent's message and ralph's reading.
pub const STALE_AFTER_SECONDS: i64 = 60;

/// The reset time in `text`, relative to the current time and the machine's local zone.
/// `None` when the text names no reset time ralph can read. An absolute time (an epoch, a date
/// with its year) may be in the past: see [`judge`].
pub fn resume_at_from_text(text: &str) -> Option<DateTime<Utc>> {
    resume_at_from_text_at(text, Utc::now(), &chrono::Local)
}

/// A reset time an agent gave, judged against the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// A time to wait for: now or later.
    At(DateTime<Utc>),
    /// A time that has already passed (by more than [`STALE_AFTER_SECONDS`]): never a time to
    /// wait for; the caller waits its fallback and says the agent's time was stale.
    Stale(DateTime<Utc>),
}

/// Judges `at` against `now`: [`Reset::Stale`] when it passed more than
/// [`STALE_AFTER_SECONDS`] ago, else [`Reset::At`] of `at`, or of `now` when `at` is a moment
/// ago (a reset time shown to a user is never in the past).
pub fn judge(at: DateTime<Utc>, now: DateTime<Utc>) -> Reset {
    if at < now - Duration::seconds(STALE_AFTER_SECONDS) {
        Reset::Stale(at)
    } else {
        Reset::At(at.max(now))
    }
}

/// [`resume_at_from_text`] with an explicit `now` and local zone (`local` is used for times
/// written without a zone), so that tests are deterministic.
pub fn resume_at_from_text_at<Z: TimeZone>(
    text: &str,
    now: DateTime<Utc>,
    local: &Z,
) -> Option<DateTime<Utc>> {
    legacy_epoch(text)
        .or_else(|| iso_regain(text))
        .or_else(|| us_date(text, local))
        .or_else(|| relative(text, now))
        .or_else(|| wall_clock(text, now, local))
}

/// `…|1753441200`: epoch seconds after the last `|`.
fn legacy_epoch(text: &str) -> Option<DateTime<Utc>> {
    let (_, tail) = text.rsplit_once('|')?;
    let digits: String = tail
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    if !(9..=11).contains(&digits.len()) {
        return None;
    }
    DateTime::from_timestamp(digits.parse().ok()?, 0)
}

/// `regain access on 2026-04-01 at 00:00 UTC`.
fn iso_regain(text: &str) -> Option<DateTime<Utc>> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)regain access on (\d{4}-\d{2}-\d{2})(?: at (\d{1,2}:\d{2}))?\s*(?:UTC)?")
            .expect("static regex")
    });
    let caps = RE.captures(text)?;
    let date = NaiveDate::parse_from_str(&caps[1], "%Y-%m-%d").ok()?;
    let time = match caps.get(2) {
        Some(t) => NaiveTime::parse_from_str(t.as_str(), "%H:%M").ok()?,
        None => NaiveTime::MIN,
    };
    Some(Utc.from_utc_datetime(&date.and_time(time)))
}

/// `reset(s) … on 11/17/2025` (month/day/year, cursor's US format): midnight local time.
fn us_date<Z: TimeZone>(text: &str, local: &Z) -> Option<DateTime<Utc>> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)reset[^.]*?\bon (\d{1,2})/(\d{1,2})/(\d{4})").expect("static regex")
    });
    let caps = RE.captures(text)?;
    let date = NaiveDate::from_ymd_opt(
        caps[3].parse().ok()?,
        caps[1].parse().ok()?,
        caps[2].parse().ok()?,
    )?;
    local
        .from_local_datetime(&date.and_time(NaiveTime::MIN))
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

/// `reset after 2h30m40s`, `retry in 12s`, `resets in 3 hours`: now plus a duration.
fn relative(text: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)(?:reset(?:s)? (?:after|in)|retry in|try again in)\s+((?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*(?:and\s+)?)+)",
        )
        .expect("static regex")
    });
    let caps = RE.captures(text)?;
    let spec = caps[1].replace(',', " ").replace(" and ", " ");
    // Fractional seconds ("12.5s") are rounded up to whole seconds for humantime.
    let spec = Regex::new(r"(\d+)\.\d+")
        .ok()?
        .replace_all(&spec, |c: &regex::Captures<'_>| {
            (c[1].parse::<u64>().unwrap_or(0) + 1).to_string()
        })
        .into_owned();
    let d = humantime::parse_duration(spec.trim()).ok()?;
    Some(now + Duration::from_std(d).ok()?)
}

/// `resets [at] [Apr 23 at | Mon] 2pm [(Europe/Berlin)]`, `try again at [Aug 18th, 2026] 3:28
/// PM`, `try again Aug 18`.
fn wall_clock<Z: TimeZone>(text: &str, now: DateTime<Utc>, local: &Z) -> Option<DateTime<Utc>> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?ix)
            (?:\breset(?:s)?(?:\ (?:at|on))?|try\ again(?:\ at)?)\s+
            (?:(?P<wday>monday|mon|tuesday|tues|tue|wednesday|wed|thursday|thurs|thur|thu|friday|fri|saturday|sat|sunday|sun)\b\.?,?\s+(?:at\s+)?)?
            (?:(?P<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+
               (?P<day>\d{1,2})(?:st|nd|rd|th)?,?
               (?:\s+(?P<year>\d{4}),?)?
               (?:\s+at)?\s*)?
            (?P<time>\d{1,2}(?::\d{2})?\s*(?:am|pm)?)?
            (?:\s*\((?P<tz>[A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)*)\))?",
        )
        .expect("static regex")
    });
    for caps in RE.captures_iter(text) {
        let time = caps.name("time").map(|t| t.as_str().trim());
        let has_date = caps.name("mon").is_some() || caps.name("wday").is_some();
        let time = match time.filter(|t| !t.is_empty()) {
            Some(t) => match parse_time_of_day(t) {
                Some(t) => Some(t),
                // A bare number after a date is a day, not a time ("Aug 18").
                None if has_date => None,
                None => continue,
            },
            None if has_date => None,
            None => continue,
        };
        let at = match caps.name("tz") {
            Some(tz) => match tz.as_str().parse::<chrono_tz::Tz>() {
                Ok(zone) => resolve(&caps, time, now, &zone),
                // Not a zone name: a parenthesised remark; read the time as local.
                Err(_) => resolve(&caps, time, now, local),
            },
            None => resolve(&caps, time, now, local),
        };
        if at.is_some() {
            return at;
        }
    }
    None
}

/// `2pm`, `3:45pm`, `3:28 PM`, `14:00`.
fn parse_time_of_day(t: &str) -> Option<NaiveTime> {
    let lower = t.to_ascii_lowercase().replace(' ', "");
    let (digits, pm) = if let Some(d) = lower.strip_suffix("pm") {
        (d, Some(true))
    } else if let Some(d) = lower.strip_suffix("am") {
        (d, Some(false))
    } else {
        (lower.as_str(), None)
    };
    let (h, m) = match digits.split_once(':') {
        Some((h, m)) => (h.parse::<u32>().ok()?, m.parse::<u32>().ok()?),
        // A bare hour needs am/pm: "resets 2" is not a time.
        None if pm.is_some() => (digits.parse::<u32>().ok()?, 0),
        None => return None,
    };
    let h = match pm {
        Some(true) if (1..=11).contains(&h) => h + 12,
        Some(false) if h == 12 => 0,
        Some(_) if !(1..=12).contains(&h) => return None,
        _ => h,
    };
    NaiveTime::from_hms_opt(h, m, 0)
}

/// The instant in `zone` that the captured date (optional) and `time` (optional: midnight) name,
/// choosing the next occurrence after `now` when the year or the day is left out.
fn resolve<Z: TimeZone>(
    caps: &regex::Captures<'_>,
    time: Option<NaiveTime>,
    now: DateTime<Utc>,
    zone: &Z,
) -> Option<DateTime<Utc>> {
    let now_local = now.with_timezone(zone).naive_local();
    let earliest = now - Duration::minutes(LATE_TOLERANCE_MINUTES);
    let time = time.unwrap_or(NaiveTime::MIN);
    let to_utc = |naive: chrono::NaiveDateTime| -> Option<DateTime<Utc>> {
        match zone.from_local_datetime(&naive) {
            LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
            LocalResult::Ambiguous(a, _) => Some(a.with_timezone(&Utc)),
            // A time skipped by a DST change: an hour later exists.
            LocalResult::None => zone
                .from_local_datetime(&(naive + Duration::hours(1)))
                .earliest()
                .map(|t| t.with_timezone(&Utc)),
        }
    };
    let not_past = |t: DateTime<Utc>| t.max(now);
    if let (Some(wday), None) = (caps.name("wday"), caps.name("mon")) {
        let want = weekday_number(wday.as_str())?;
        let today = now_local.date();
        return (0..=7)
            .filter_map(|n| today.checked_add_days(chrono::Days::new(n)))
            .filter(|d| d.weekday().num_days_from_monday() == want)
            .filter_map(|d| to_utc(d.and_time(time)))
            .find(|t| *t >= earliest)
            .map(not_past);
    }
    match (caps.name("mon"), caps.name("day")) {
        (Some(mon), Some(day)) => {
            let month = month_number(mon.as_str())?;
            let day: u32 = day.as_str().parse().ok()?;
            if let Some(year) = caps.name("year") {
                let date = NaiveDate::from_ymd_opt(year.as_str().parse().ok()?, month, day)?;
                return to_utc(date.and_time(time));
            }
            (now_local.year()..=now_local.year() + 1)
                .filter_map(|y| NaiveDate::from_ymd_opt(y, month, day))
                .filter_map(|d| to_utc(d.and_time(time)))
                .find(|t| *t >= earliest)
                .map(not_past)
        }
        _ => {
            let today = now_local.date();
            [today, today.succ_opt()?]
                .into_iter()
                .filter_map(|d| to_utc(d.and_time(time)))
                .find(|t| *t >= earliest)
                .map(not_past)
        }
    }
}

/// `mon` … `sun` as days from Monday.
fn weekday_number(name: &str) -> Option<u32> {
    const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let prefix = name.get(..3)?.to_ascii_lowercase();
    DAYS.iter()
        .position(|d| *d == prefix)
        .and_then(|i| u32::try_from(i).ok())
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let prefix = name.get(..3)?.to_ascii_lowercase();
    MONTHS
        .iter()
        .position(|m| *m == prefix)
        .and_then(|i| u32::try_from(i + 1).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30 10:00 UTC (11:00 in Berlin, 18:00 in Kuala Lumpur).
    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 10, 0, 0).unwrap()
    }

    fn at(text: &str) -> Option<String> {
        resume_at_from_text_at(text, now(), &Utc).map(|t| t.to_rfc3339())
    }

    #[test]
    fn claude_legacy_epoch_suffix() {
        assert_eq!(
            at("Claude AI usage limit reached|1753441200").as_deref(),
            Some("2025-07-25T11:00:00+00:00")
        );
        assert_eq!(at("a|b"), None);
    }

    #[test]
    fn claude_time_of_day_in_a_named_zone_is_its_next_occurrence() {
        // 2pm Berlin (UTC+1 in winter) = 13:00 UTC, later today.
        assert_eq!(
            at("You've hit your session limit · resets 2pm (Europe/Berlin)").as_deref(),
            Some("2026-11-30T13:00:00+00:00")
        );
        // 4pm Kuala Lumpur (UTC+8) = 08:00 UTC, already past today: tomorrow.
        assert_eq!(
            at("You've hit your limit · resets 4pm (Asia/Kuala_Lumpur)").as_deref(),
            Some("2026-12-01T08:00:00+00:00")
        );
        // Minutes, and no zone: the local zone (UTC in this test).
        assert_eq!(
            at("You've hit your session limit · resets 3:45pm").as_deref(),
            Some("2026-11-30T15:45:00+00:00")
        );
    }

    #[test]
    fn claude_date_and_time_with_zone() {
        assert_eq!(
            at("You've hit your weekly limit · resets Dec 3 at 4pm (America/New_York)").as_deref(),
            Some("2026-12-03T21:00:00+00:00")
        );
        // A date already past this year means next year.
        assert_eq!(
            at("You've hit your Opus limit · resets Apr 23 at 4pm (Europe/Berlin)").as_deref(),
            Some("2027-04-23T14:00:00+00:00")
        );
    }

    #[test]
    fn codex_try_again_forms() {
        assert_eq!(
            at("You've hit your usage limit. Upgrade to Pro or try again at 3:28 PM.").as_deref(),
            Some("2026-11-30T15:28:00+00:00")
        );
        assert_eq!(
            at("You've hit your usage limit. Try again at Dec 18th, 2026 3:28 PM.").as_deref(),
            Some("2026-12-18T15:28:00+00:00")
        );
        assert_eq!(
            at("You've hit your usage limit. Try again Aug 18.").as_deref(),
            Some("2027-08-18T00:00:00+00:00")
        );
    }

    #[test]
    fn local_zone_is_used_for_times_without_one() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        assert_eq!(
            resume_at_from_text_at("try again at 3:28 PM", now(), &berlin)
                .map(|t| t.to_rfc3339())
                .as_deref(),
            Some("2026-11-30T14:28:00+00:00")
        );
    }

    #[test]
    fn a_reset_just_passed_is_now_not_tomorrow_and_never_in_the_past() {
        // 10:00 UTC now; "resets 9:55am" was five minutes ago: the reset is due now.
        assert_eq!(
            at("You've hit your session limit · resets 9:55am").as_deref(),
            Some("2026-11-30T10:00:00+00:00")
        );
        // An hour ago is not "now": the next 9am is tomorrow's.
        assert_eq!(
            at("Session limit reached \u{2219} resets 9am").as_deref(),
            Some("2026-12-01T09:00:00+00:00")
        );
    }

    /// The wordings claude has used across plans and versions, with either separator.
    #[test]
    fn claude_limit_family_reset_times() {
        for (text, expect) in [
            (
                "Weekly limit reached \u{2219} resets 5am",
                "2026-12-01T05:00:00+00:00",
            ),
            (
                "Session limit reached \u{2219} resets 11am",
                "2026-11-30T11:00:00+00:00",
            ),
            (
                "You're out of extra usage \u{00b7} resets 9pm",
                "2026-11-30T21:00:00+00:00",
            ),
            (
                "5-hour limit reached \u{00b7} resets 7pm (Europe/Berlin)",
                "2026-11-30T18:00:00+00:00",
            ),
            (
                "Weekly limit reached \u{2219} resets Oct 9, 10am",
                "2027-10-09T10:00:00+00:00",
            ),
            (
                "Weekly limit reached \u{2219} resets Dec 3 at 4pm",
                "2026-12-03T16:00:00+00:00",
            ),
            // 2026-11-30 is a Monday.
            (
                "Weekly limit reached \u{2219} resets Mon 5am",
                "2026-12-07T05:00:00+00:00",
            ),
            (
                "Weekly limit reached \u{2219} resets Thursday at 9:30am",
                "2026-12-03T09:30:00+00:00",
            ),
            (
                "Opus limit reached - resets at 5pm",
                "2026-11-30T17:00:00+00:00",
            ),
        ] {
            assert_eq!(at(text).as_deref(), Some(expect), "{text}");
        }
    }

    #[test]
    fn absolute_times_in_the_past_are_stale() {
        let stale = resume_at_from_text_at("Claude AI usage limit reached|1753441200", now(), &Utc)
            .map(|t| judge(t, now()));
        assert!(matches!(stale, Some(Reset::Stale(_))), "{stale:?}");
        let past = Utc.with_ymd_and_hms(2026, 11, 30, 9, 59, 30).unwrap();
        assert_eq!(judge(past, now()), Reset::At(now()));
        let later = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        assert_eq!(judge(later, now()), Reset::At(later));
    }

    #[test]
    fn api_billing_and_relative_forms() {
        assert_eq!(
            at("You have reached your specified API usage limits. You will regain access on 2026-12-01 at 00:00 UTC.").as_deref(),
            Some("2026-12-01T00:00:00+00:00")
        );
        assert_eq!(
            at("[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h30m40s.]").as_deref(),
            Some("2026-11-30T12:30:40+00:00")
        );
        assert_eq!(
            at("Please retry in 12.5s").as_deref(),
            Some("2026-11-30T10:00:13+00:00")
        );
    }

    #[test]
    fn cursor_us_date() {
        assert_eq!(
            at("You've hit your usage limit. Your usage limits will reset when your monthly cycle ends on 12/17/2026.").as_deref(),
            Some("2026-12-17T00:00:00+00:00")
        );
    }

    #[test]
    fn texts_without_a_readable_time_give_none() {
        for text in [
            "You've hit your org's monthly usage limit",
            "Credit balance is too low",
            "resets soon",
            "try again later",
            "resets 2 (Europe/Berlin)",
            "resets 25:00",
        ] {
            assert_eq!(at(text), None, "{text}");
        }
    }
}
