//! Sorting an agent's *own* error signals into a [`FailureClass`].
//!
//! The rules are data ([`RULES`]): each entry pairs a class with one pattern. Patterns are matched
//! only against what the agent itself says about its run: stderr lines, the terminal result text
//! when it is an error, the `error` field of assistant messages, `api_error_status`,
//! `terminal_reason`, retry notices and rate-limit events. Tool output is never fed in: an agent
//! that runs `grep "Invalid API key"` over the codebase has not lost its credentials.
//!
//! Text is compared case-insensitively after removing ANSI escapes. Several signals can match
//! in one run (retry chatter with status 429, then a final "You've hit your session limit"), so
//! [`Classifier`] keeps every match and reports the most decisive class ([`precedence`]).
//!
//! Sources for the patterns: `notes/agent-protocols.md` §1 (Claude Code errors, limits and exit
//! codes) and `notes/real-clis.md` §1 (claude 2.1.332 error runs).

use crate::agent::FailureClass;
use crate::process::strip_ansi;

/// One error signal from an agent, as parsed from its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal<'a> {
    /// Free text from the agent's error channel: a stderr line, the result text of an error
    /// result, an entry of `result.errors[]`. ANSI codes may still be present.
    Text(&'a str),
    /// A machine-readable error code: claude's assistant `error` field
    /// (`authentication_failed`, `rate_limit`, `billing_error`, ...) or `api_retry.error`.
    ErrorCode(&'a str),
    /// An HTTP status from the agent's API calls: `result.api_error_status`,
    /// `system/api_retry.error_status`.
    ApiStatus(u16),
    /// claude's `result.terminal_reason` (`completed`, `api_error`, `prompt_too_long`, ...).
    TerminalReason(&'a str),
    /// `rate_limit_event.rate_limit_info.status` (`allowed`, `allowed_warning`, `rejected`).
    RateLimitStatus(&'a str),
}

/// What a rule looks for. Text patterns are lowercase (matching lowercases the input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// [`Signal::Text`] contains this (case-insensitive, ANSI stripped).
    Contains(&'static str),
    /// [`Signal::Text`], with leading whitespace removed, starts with this (case-insensitive).
    /// Used for CLI-parser messages such as `error: unknown option '--foo'`, which would be
    /// too broad as a substring ("API Error: unknown ...").
    StartsWith(&'static str),
    /// [`Signal::ErrorCode`] equals this (case-insensitive).
    ErrorCode(&'static str),
    /// [`Signal::ApiStatus`] lies in this inclusive range.
    Status(u16, u16),
    /// [`Signal::TerminalReason`] equals this.
    TerminalReason(&'static str),
    /// [`Signal::RateLimitStatus`] equals this.
    RateLimitStatus(&'static str),
}

/// The classification table: every (class, pattern) pair ralph knows. Order does not matter;
/// [`precedence`] decides between classes.
pub const RULES: &[(FailureClass, Pattern)] = &[
    // Auth: a human must log in again; retrying cannot help.
    (FailureClass::Auth, Pattern::Contains("invalid api key")),
    (FailureClass::Auth, Pattern::Contains("not logged in")),
    (FailureClass::Auth, Pattern::Contains("please run /login")),
    (
        FailureClass::Auth,
        Pattern::Contains("failed to authenticate"),
    ),
    (
        FailureClass::Auth,
        Pattern::Contains("oauth token has expired"),
    ),
    (
        FailureClass::Auth,
        Pattern::Contains("authentication_error"),
    ),
    (
        FailureClass::Auth,
        Pattern::ErrorCode("authentication_failed"),
    ),
    (FailureClass::Auth, Pattern::Status(401, 401)),
    (FailureClass::Auth, Pattern::Status(403, 403)),
    // Config: deterministic setup problems; the same command fails the same way every time.
    (
        FailureClass::Config,
        Pattern::Contains("cannot be used with root/sudo privileges"),
    ),
    (
        FailureClass::Config,
        Pattern::Contains("cannot be launched inside another claude code session"),
    ),
    (
        FailureClass::Config,
        Pattern::Contains("requires --verbose"),
    ),
    (FailureClass::Config, Pattern::Contains("unknown option")),
    (FailureClass::Config, Pattern::StartsWith("error: unknown")),
    // Usage limit: wait for the reset, then resume.
    (
        FailureClass::UsageLimit,
        Pattern::Contains("you've hit your"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("you\u{2019}ve hit your"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("usage limit reached"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("reached your specified api usage limits"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("credit balance is too low"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("usage allocation has been disabled"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::ErrorCode("billing_error"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::RateLimitStatus("rejected"),
    ),
    // Transient: overload, rate limiting, server errors; retry after a backoff.
    (FailureClass::Transient, Pattern::Status(429, 429)),
    (FailureClass::Transient, Pattern::Status(500, 599)),
    (FailureClass::Transient, Pattern::Contains("overloaded")),
    (
        FailureClass::Transient,
        Pattern::Contains("no messages returned"),
    ),
    (FailureClass::Transient, Pattern::ErrorCode("rate_limit")),
    (FailureClass::Transient, Pattern::ErrorCode("server_error")),
    (FailureClass::Transient, Pattern::ErrorCode("overloaded")),
    // Context: the prompt no longer fits; retrying as-is loops.
    (
        FailureClass::Context,
        Pattern::Contains("prompt is too long"),
    ),
    (
        FailureClass::Context,
        Pattern::TerminalReason("prompt_too_long"),
    ),
    (
        FailureClass::Context,
        Pattern::TerminalReason("blocking_limit"),
    ),
];

/// How decisive a class is when several matched in one run; higher wins.
///
/// Config and auth stop the run and need a human, so they outrank everything. A usage limit
/// outranks transient trouble because claude reports a subscription limit with status 429 and
/// error code `rate_limit` as well. Transient is lowest: retry chatter precedes most failures.
pub fn precedence(class: FailureClass) -> u8 {
    match class {
        FailureClass::Config => 5,
        FailureClass::Auth => 4,
        FailureClass::UsageLimit => 3,
        FailureClass::Context => 2,
        FailureClass::Transient => 1,
    }
}

/// The most decisive class among the [`RULES`] that match `signal`, if any.
pub fn classify(signal: Signal<'_>) -> Option<FailureClass> {
    // Lowercase once per signal, not once per rule.
    let text = match signal {
        Signal::Text(t) => Some(strip_ansi(t).to_lowercase()),
        _ => None,
    };
    RULES
        .iter()
        .filter(|(_, pattern)| matches(*pattern, signal, text.as_deref()))
        .map(|(class, _)| *class)
        .max_by_key(|class| precedence(*class))
}

fn matches(pattern: Pattern, signal: Signal<'_>, lower_text: Option<&str>) -> bool {
    match (pattern, signal) {
        (Pattern::Contains(p), Signal::Text(_)) => lower_text.is_some_and(|t| t.contains(p)),
        (Pattern::StartsWith(p), Signal::Text(_)) => {
            lower_text.is_some_and(|t| t.trim_start().starts_with(p))
        }
        (Pattern::ErrorCode(p), Signal::ErrorCode(code)) => code.trim().eq_ignore_ascii_case(p),
        (Pattern::Status(lo, hi), Signal::ApiStatus(status)) => (lo..=hi).contains(&status),
        (Pattern::TerminalReason(p), Signal::TerminalReason(reason)) => reason == p,
        (Pattern::RateLimitStatus(p), Signal::RateLimitStatus(status)) => status == p,
        _ => false,
    }
}

/// Accumulates the signals of one agent run and remembers the most decisive class seen, plus
/// the first message that produced it (for the report's `error_message`).
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    best: Option<FailureClass>,
    message: Option<String>,
}

impl Classifier {
    /// An empty classifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one signal; returns the class it matched, if any.
    pub fn observe(&mut self, signal: Signal<'_>) -> Option<FailureClass> {
        let class = classify(signal)?;
        let better = self
            .best
            .is_none_or(|best| precedence(class) > precedence(best));
        if better {
            self.best = Some(class);
            self.message = match signal {
                Signal::Text(t) => Some(strip_ansi(t).trim().to_owned()),
                _ => None,
            };
        }
        Some(class)
    }

    /// The most decisive class seen so far.
    pub fn best(&self) -> Option<FailureClass> {
        self.best
    }

    /// The text (ANSI stripped, trimmed) of the signal that set [`Classifier::best`], when it was
    /// a [`Signal::Text`].
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_texts_codes_and_statuses() {
        for text in [
            "Invalid API key · Please run /login",
            "Not logged in · Please run /login",
            "Failed to authenticate. API Error: 401 {\"type\":\"error\"}",
            "OAuth token has expired. Please obtain a new token or refresh your existing token.",
        ] {
            assert_eq!(
                classify(Signal::Text(text)),
                Some(FailureClass::Auth),
                "{text}"
            );
        }
        assert_eq!(
            classify(Signal::ErrorCode("authentication_failed")),
            Some(FailureClass::Auth)
        );
        assert_eq!(classify(Signal::ApiStatus(401)), Some(FailureClass::Auth));
        assert_eq!(classify(Signal::ApiStatus(403)), Some(FailureClass::Auth));
    }

    #[test]
    fn config_texts_including_ansi_coloured_stderr() {
        for text in [
            "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons",
            "Error: Claude Code cannot be launched inside another Claude Code session.",
            "Error: When using --print, --output-format=stream-json requires --verbose",
            "\x1b[31merror: unknown option '--frobnicate'\x1b[0m",
        ] {
            assert_eq!(classify(Signal::Text(text)), Some(FailureClass::Config), "{text}");
        }
    }

    #[test]
    fn error_unknown_only_counts_at_the_start_of_a_message() {
        assert_eq!(
            classify(Signal::Text("  error: unknown command 'x'")),
            Some(FailureClass::Config)
        );
        assert_eq!(classify(Signal::Text("API Error: unknown failure")), None);
    }

    #[test]
    fn usage_limit_texts_and_rate_limit_event() {
        for text in [
            "You've hit your session limit · resets 2pm (Europe/Helsinki)",
            "You\u{2019}ve hit your limit · resets 4pm (Asia/Kuala_Lumpur)",
            "Claude AI usage limit reached|1753441200",
            "Credit balance is too low",
        ] {
            assert_eq!(
                classify(Signal::Text(text)),
                Some(FailureClass::UsageLimit),
                "{text}"
            );
        }
        assert_eq!(
            classify(Signal::RateLimitStatus("rejected")),
            Some(FailureClass::UsageLimit)
        );
        assert_eq!(classify(Signal::RateLimitStatus("allowed_warning")), None);
    }

    #[test]
    fn transient_and_context() {
        assert_eq!(
            classify(Signal::ApiStatus(529)),
            Some(FailureClass::Transient)
        );
        assert_eq!(
            classify(Signal::ApiStatus(500)),
            Some(FailureClass::Transient)
        );
        assert_eq!(
            classify(Signal::ApiStatus(429)),
            Some(FailureClass::Transient)
        );
        assert_eq!(classify(Signal::ApiStatus(400)), None);
        assert_eq!(
            classify(Signal::Text(
                "API Error: 529 Overloaded. This is a server-side issue"
            )),
            Some(FailureClass::Transient)
        );
        assert_eq!(
            classify(Signal::Text("No messages returned")),
            Some(FailureClass::Transient)
        );
        assert_eq!(
            classify(Signal::Text("Prompt is too long")),
            Some(FailureClass::Context)
        );
        assert_eq!(
            classify(Signal::TerminalReason("prompt_too_long")),
            Some(FailureClass::Context)
        );
        assert_eq!(classify(Signal::TerminalReason("completed")), None);
    }

    #[test]
    fn ordinary_text_is_not_a_failure() {
        assert_eq!(
            classify(Signal::Text("Warning: no stdin data received in 3s")),
            None
        );
        assert_eq!(classify(Signal::Text("")), None);
    }

    /// Claude's subscription limit comes with status 429 and code `rate_limit` too: the usage
    /// limit must win over the transient reading, whatever the order of the signals.
    #[test]
    fn classifier_keeps_the_most_decisive_class() {
        let mut c = Classifier::new();
        c.observe(Signal::ApiStatus(429));
        c.observe(Signal::ErrorCode("rate_limit"));
        c.observe(Signal::Text(
            "You've hit your session limit · resets 2pm (Europe/Helsinki)",
        ));
        c.observe(Signal::ApiStatus(429));
        assert_eq!(c.best(), Some(FailureClass::UsageLimit));
        assert_eq!(
            c.message(),
            Some("You've hit your session limit · resets 2pm (Europe/Helsinki)")
        );

        let mut c = Classifier::new();
        c.observe(Signal::Text("API Error: 529 Overloaded"));
        c.observe(Signal::Text(
            "\x1b[1mInvalid API key\x1b[0m · Please run /login",
        ));
        assert_eq!(c.best(), Some(FailureClass::Auth));
        assert_eq!(c.message(), Some("Invalid API key · Please run /login"));
    }
}

/// The reset time written in a usage-limit message, when it carries one ralph can read: the
/// legacy Claude form `Claude AI usage limit reached|1753441200` (epoch seconds). Other forms
/// ("resets 2pm (Europe/Berlin)") are not parsed yet; the caller falls back to a configured wait.
pub fn resume_at_from_text(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let (_, tail) = text.rsplit_once('|')?;
    let digits: String = tail
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    if !(9..=11).contains(&digits.len()) {
        return None;
    }
    chrono::DateTime::from_timestamp(digits.parse().ok()?, 0)
}

#[cfg(test)]
mod resume_tests {
    use super::*;

    #[test]
    fn legacy_epoch_suffix_is_read() {
        let t = resume_at_from_text("Claude AI usage limit reached|1753441200").unwrap();
        assert_eq!(t.timestamp(), 1_753_441_200);
        assert!(
            resume_at_from_text("You've hit your limit · resets 2pm (Europe/Berlin)").is_none()
        );
        assert!(resume_at_from_text("a|b").is_none());
    }
}
