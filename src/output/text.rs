//! Small text formats shared by the terminal outputs and the readers of history (`ralph status`,
//! `log`, `show`, `report`): money, durations, shortened text.

use std::time::Duration;

/// `$1.23`, or `$0.0047` below a cent (so a cheap iteration does not read as free).
pub fn usd(c: f64) -> String {
    if c > 0.0 && c < 0.01 {
        format!("${c:.4}")
    } else {
        format!("${c:.2}")
    }
}

/// `$1.23`, or `?` when the cost is unknown.
pub fn usd_or_unknown(c: Option<f64>) -> String {
    c.map(usd).unwrap_or_else(|| "?".to_owned())
}

/// A short duration: `850ms`, `42s`, `3m05s`, `2h03m`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    if s < 60 {
        return format!("{s}s");
    }
    if s < 3600 {
        return format!("{}m{:02}s", s / 60, s % 60);
    }
    format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
}

/// An iteration's wall time for a table: [`short_secs`], or `?` for a record rebuilt from git
/// (its trailers keep no time).
pub fn record_secs(r: &crate::protocol::LedgerRecord) -> String {
    if r.from_git {
        "?".to_owned()
    } else {
        short_secs(r.duration_s)
    }
}

/// Whether iteration `r` left its own story passing, as the ledger says: its outcome is
/// `story_passed`, or the story's `passes` flip was kept (`passes_flipped` names it) though the
/// iteration ended otherwise. A timeout that came after the agent committed the story's work and
/// marked it passing, and after which its check passed, is such an iteration: the story passes,
/// and its time to pass ends there.
/// A record whose own outcome undoes the pass (a failed check, a claim refused, a broken
/// prd.json) or whose check of the story failed never counts, whatever `passes_flipped` says
/// (older ledgers listed such flips too).
pub fn passed_own_story(r: &crate::protocol::LedgerRecord) -> bool {
    use crate::protocol::Outcome;
    if r.outcome == Outcome::StoryPassed {
        return true;
    }
    let undone = matches!(
        r.outcome,
        Outcome::VerifyFailed | Outcome::PrematureClaim | Outcome::PrdCorrupted
    ) || r
        .verify
        .iter()
        .any(|v| v.story_id == r.story_id && !v.passed);
    !undone && r.passes_flipped.contains(&r.story_id)
}

/// A count of an iteration's agent commits or changed files for a table: `n`, or `?` for a
/// record rebuilt from git (its trailers keep neither).
pub fn record_count(r: &crate::protocol::LedgerRecord, n: usize) -> String {
    if r.from_git {
        "?".to_owned()
    } else {
        n.to_string()
    }
}

/// A `--parallel` landing in a few words, for an iteration's line (`ralph log`, the terminal):
/// `ff`, `merge`, `conflict → refs/ralph/salvage/<run>/<story>`, `reverted → <ref>`,
/// `not landed` (the salvage ref always in full: it is what a person types to get the work).
pub fn landing_short(l: &crate::protocol::record::LandingRecord) -> String {
    use crate::protocol::record::LandingKind;
    let kind = match (l.kind, l.resolves) {
        (LandingKind::Resolution, Some(n)) => format!("resolved iteration {n}'s conflict"),
        (LandingKind::Conflict, Some(n)) => format!("resolution of iteration {n} refused"),
        (LandingKind::Refused, _) => refused_words(l.message.as_deref()).to_owned(),
        _ => landing_kind(l.kind).to_owned(),
    };
    match (l.kind, &l.salvage_ref) {
        (LandingKind::FastForward | LandingKind::Merge | LandingKind::Resolution, _)
        | (_, None) => kind,
        (_, Some(r)) => format!("{kind} → {r}"),
    }
}

/// Why a landing was refused, in a few words, from its message (the landing's, else the
/// record's): `refused: index locked` (another git process held the checkout's index),
/// `refused: checkout switched` (the checkout is on another branch), `refused: branch moved`
/// (something else committed on the run branch under the landing), `refused: your uncommitted
/// change` (a change of the user's where the landing writes), `refused: files in the way`
/// (untracked files), `refused: files changed meanwhile`; `refused` when the message says none
/// of these (or there is none).
pub fn refused_words(message: Option<&str>) -> &'static str {
    let m = message.unwrap_or_default();
    if m.contains("another git process holds") {
        "refused: index locked"
    } else if m.contains("not on the run branch") || m.contains("was switched from the run branch")
    {
        "refused: checkout switched"
    } else if m.contains("where the landing started")
        || m.contains("does not descend from")
        || m.contains("while ralph committed on")
    {
        "refused: branch moved"
    } else if m.contains("did not commit") || m.contains("without touching your change") {
        "refused: your uncommitted change"
    } else if m.contains("are in the way") {
        "refused: files in the way"
    } else if m.contains("changed meanwhile") {
        "refused: files changed meanwhile"
    } else {
        "refused"
    }
}

/// A landing kind's word: `ff`, `merge`, `conflict`, `reverted`, `not landed`, `refused` (its
/// reason, from the message, is [`refused_words`]'s).
pub fn landing_kind(kind: crate::protocol::record::LandingKind) -> &'static str {
    use crate::protocol::record::LandingKind;
    match kind {
        LandingKind::FastForward => "ff",
        LandingKind::Merge => "merge",
        LandingKind::Conflict => "conflict",
        LandingKind::Reverted => "reverted",
        LandingKind::NotLanded => "not landed",
        LandingKind::Refused => "refused",
        LandingKind::Resolution => "resolution",
    }
}

/// [`short_duration`] of a number of seconds.
pub fn short_secs(secs: f64) -> String {
    short_duration(Duration::from_secs_f64(secs.max(0.0)))
}

/// `s` on one line (whitespace collapsed), cut to `max` characters with `…`.
pub fn one_line(s: &str, max: usize) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::protocol::fields::truncate_chars(&joined, max)
}

/// A run id (`20261201T120354-4eba`) as a short local-looking label: `12-01 12:03:54`; the id
/// itself when it has another shape.
pub fn run_label(run_id: &str) -> String {
    let b = run_id.as_bytes();
    if run_id.len() >= 15 && b[8] == b'T' && run_id[..8].bytes().all(|c| c.is_ascii_digit()) {
        format!(
            "{}-{} {}:{}:{}",
            &run_id[4..6],
            &run_id[6..8],
            &run_id[9..11],
            &run_id[11..13],
            &run_id[13..15]
        )
    } else {
        run_id.to_owned()
    }
}

/// Longest reason, in characters.
const REASON_CHARS: usize = 110;

/// Why the iteration ended as it did, on one line: for a failed check, the command, how it
/// ended and the last line of its output; else the iteration's message.
pub fn reason(r: &crate::protocol::LedgerRecord) -> String {
    if let Some(v) = r.verify_failures().next() {
        let last = v
            .output_tail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        let text = format!(
            "{}'s check `{}` {}{last}",
            v.story_id,
            one_line(&v.command, 40),
            v.result.as_deref().unwrap_or("failed")
        );
        return one_line(&text, REASON_CHARS);
    }
    let mut text = r.primary_message().unwrap_or_default().to_owned();
    if text.is_empty() {
        if let Some(first) = r.findings.first() {
            text = first.clone();
        }
    }
    one_line(&text, REASON_CHARS)
}

/// `text` as a reader of history is shown it (`log`, `show`, `report`): secrets redacted
/// (`crate::redact`, with the reader's environment and the well-known shapes) and terminal
/// escape sequences an agent printed (colours, cursor moves) removed.
pub fn readable(text: &str) -> String {
    crate::process::strip_ansi(&crate::redact::redact_env(text))
}

/// Every string in `value` made [`readable`]'s way, but only of its escape sequences (the
/// strings were redacted as a whole before).
pub fn strip_ansi_value(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\u{1b}') => *s = crate::process::strip_ansi(s),
        Value::Array(items) => items.iter_mut().for_each(strip_ansi_value),
        Value::Object(map) => map.values_mut().for_each(strip_ansi_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(usd(0.0047), "$0.0047");
        assert_eq!(usd_or_unknown(None), "?");
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(short_duration(Duration::from_secs(7380)), "2h03m");
        assert_eq!(one_line("a\n  b", 10), "a b");
        assert_eq!(run_label("20261201T120354-4eba"), "12-01 12:03:54");
        assert_eq!(run_label("r1"), "r1");
    }
}
