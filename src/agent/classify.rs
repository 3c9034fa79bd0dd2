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
//! codes), §2 (codex `CodexErr` texts), §4–§6 (opencode, gemini, cursor) and `notes/real-clis.md`
//! (the real CLIs' error runs). Users add their own with `[patterns]` in ralph.toml
//! ([`ExtraPatterns`]).

use crate::process::strip_ansi;
use crate::protocol::FailureClass;

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
    // codex: `unexpected status 401 Unauthorized: …` and refresh-token failures.
    (FailureClass::Auth, Pattern::Contains("401 unauthorized")),
    (FailureClass::Auth, Pattern::Contains("refresh token")),
    (FailureClass::Auth, Pattern::Contains("please log in again")),
    (
        FailureClass::Auth,
        Pattern::Contains("please log out and sign in again"),
    ),
    // codex: the provider's key variable is unset; a ChatGPT plan without Codex.
    (
        FailureClass::Auth,
        Pattern::Contains("missing environment variable:"),
    ),
    (
        FailureClass::Auth,
        Pattern::Contains("to use codex with your chatgpt plan"),
    ),
    // gemini's error class name, and amp/cursor's key variables when missing.
    (
        FailureClass::Auth,
        Pattern::Contains("fatalauthenticationerror"),
    ),
    // cursor-agent without a login or with a bad key; gemini/Google's bad-key text.
    (
        FailureClass::Auth,
        Pattern::Contains("authentication required"),
    ),
    (FailureClass::Auth, Pattern::Contains("api key is invalid")),
    (FailureClass::Auth, Pattern::Contains("api key not valid")),
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
    // codex outside a git repository without --skip-git-repo-check.
    (
        FailureClass::Config,
        Pattern::Contains("not inside a trusted directory"),
    ),
    // gemini in an untrusted folder without --skip-trust.
    (
        FailureClass::Config,
        Pattern::Contains("not running in a trusted directory"),
    ),
    (
        FailureClass::Config,
        Pattern::Contains("invalid auth method selected"),
    ),
    // cursor-agent in an untrusted folder.
    (
        FailureClass::Config,
        Pattern::Contains("workspace trust required"),
    ),
    (
        FailureClass::Config,
        Pattern::Contains("is no longer supported"),
    ),
    (FailureClass::Config, Pattern::StartsWith("error: unknown")),
    // clap's wording (codex) for a flag the installed version does not have.
    (
        FailureClass::Config,
        Pattern::StartsWith("error: unexpected argument"),
    ),
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
    // Claude Code's 2025 wording: `5-hour limit reached ∙ resets 7pm`.
    (
        FailureClass::UsageLimit,
        Pattern::Contains("hour limit reached"),
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
    // codex: the API error type behind "You've hit your usage limit", the workspace and spend
    // variants, and an API key without quota.
    (
        FailureClass::UsageLimit,
        Pattern::Contains("usage_limit_reached"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("out of credits"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("hit your spend cap"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("check your plan and billing details"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::ErrorCode("insufficient_quota"),
    ),
    // gemini's TerminalQuotaError: a daily quota.
    (
        FailureClass::UsageLimit,
        Pattern::Contains("exhausted your capacity"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("terminalquotaerror"),
    ),
    (
        FailureClass::UsageLimit,
        Pattern::Contains("exhausted your daily quota"),
    ),
    // OpenAI-compatible APIs (opencode, native) when the account's money is gone.
    (
        FailureClass::UsageLimit,
        Pattern::Contains("exceeded your current quota"),
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
    // codex: generic replacements for 5xx and exhausted retries; a model at capacity.
    (
        FailureClass::Transient,
        Pattern::Contains("experiencing high demand"),
    ),
    (
        FailureClass::Transient,
        Pattern::Contains("exceeded retry limit"),
    ),
    (FailureClass::Transient, Pattern::Contains("is at capacity")),
    (
        FailureClass::Transient,
        Pattern::Contains("stream disconnected before completion"),
    ),
    // gemini's per-minute quota ("Please retry in 12s"), network trouble in any CLI.
    (
        FailureClass::Transient,
        Pattern::Contains("retryablequotaerror"),
    ),
    (FailureClass::Transient, Pattern::Contains("econnreset")),
    (FailureClass::Transient, Pattern::Contains("econnrefused")),
    (FailureClass::Transient, Pattern::Contains("etimedout")),
    (FailureClass::Transient, Pattern::Contains("socket hang up")),
    (
        FailureClass::Transient,
        Pattern::Contains("service unavailable"),
    ),
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
    // codex and opencode.
    (
        FailureClass::Context,
        Pattern::Contains("ran out of room in the model's context window"),
    ),
    (
        FailureClass::Context,
        Pattern::Contains("contextoverflowerror"),
    ),
    (
        FailureClass::Context,
        Pattern::Contains("maximum context length"),
    ),
];

/// Failure patterns a user adds in ralph.toml, next to the built-in [`RULES`]:
///
/// ```toml
/// [patterns]
/// usage_limit = ["monthly token budget exhausted"]
/// transient = ["upstream connect error"]
/// ```
///
/// Each entry is a case-insensitive substring, matched like the built-in text rules: only
/// against the agent's own error channel (the report's error message and the stderr lines the
/// backend kept), after removing ANSI escapes, and only when the run failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraPatterns {
    /// Texts that mean a usage limit (wait for the reset).
    #[serde(default)]
    pub usage_limit: Vec<String>,
    /// Texts that mean a transient failure (retry after a backoff).
    #[serde(default)]
    pub transient: Vec<String>,
    /// Texts that mean bad or expired credentials (stop the run).
    #[serde(default)]
    pub auth: Vec<String>,
    /// Texts that mean a deterministic setup problem (stop the run).
    #[serde(default)]
    pub config: Vec<String>,
    /// Texts that mean the context window overflowed.
    #[serde(default)]
    pub context: Vec<String>,
}

impl ExtraPatterns {
    /// Whether no pattern is configured.
    pub fn is_empty(&self) -> bool {
        self.groups().all(|(_, list)| list.is_empty())
    }

    fn groups(&self) -> impl Iterator<Item = (FailureClass, &Vec<String>)> {
        [
            (FailureClass::UsageLimit, &self.usage_limit),
            (FailureClass::Transient, &self.transient),
            (FailureClass::Auth, &self.auth),
            (FailureClass::Config, &self.config),
            (FailureClass::Context, &self.context),
        ]
        .into_iter()
    }

    /// The most decisive class whose pattern occurs in `text`, if any.
    pub fn classify(&self, text: &str) -> Option<FailureClass> {
        let lower = strip_ansi(text).to_lowercase();
        self.groups()
            .filter(|(_, list)| {
                list.iter()
                    .any(|p| !p.trim().is_empty() && lower.contains(&p.to_lowercase()))
            })
            .map(|(class, _)| class)
            .max_by_key(|class| precedence(*class))
    }

    /// Applies the patterns to a finished run's report: when the run failed (`is_error`) and its
    /// error message matches a class more decisive than the one the backend found, that class
    /// wins; a usage limit then also gets its reset time from the message when it names one.
    pub fn apply(&self, report: &mut crate::protocol::AgentReport) {
        if self.is_empty() || !report.is_error {
            return;
        }
        let Some(message) = report.error_message.as_deref() else {
            return;
        };
        let Some(class) = self.classify(message) else {
            return;
        };
        if report
            .failure
            .is_none_or(|current| precedence(class) > precedence(current))
        {
            report.failure = Some(class);
            if class == FailureClass::UsageLimit && report.resume_at.is_none() {
                report.resume_at = resume_at_from_text(message);
            }
        }
    }
}

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

/// The reset time written in a usage-limit message (every form in [`crate::agent::reset_time`]),
/// relative to now and the local zone; `None` when the text names none.
pub use crate::agent::reset_time::resume_at_from_text;

#[cfg(test)]
mod tests {
    use super::*;

    /// One realistic line per built-in text rule, from the notes on each CLI, with the class it
    /// must get. The test also fails when a text rule has no line here.
    const REALISTIC: &[(&str, FailureClass)] = &[
        ("Invalid API key · Please run /login", FailureClass::Auth),
        ("Not logged in · Please run /login", FailureClass::Auth),
        ("Failed to authenticate. API Error: 401 {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\"}}", FailureClass::Auth),
        ("OAuth token has expired. Please obtain a new token or refresh your existing token.", FailureClass::Auth),
        ("unexpected status 401 Unauthorized: {\"error\":{\"message\":\"Incorrect API key provided\"}}", FailureClass::Auth),
        ("Your access token could not be refreshed because your refresh token was already used. Please log out and sign in again.", FailureClass::Auth),
        ("Your session has expired; please log in again.", FailureClass::Auth),
        ("Your access token could not be refreshed because your refresh token has expired. Please log out and sign in again.", FailureClass::Auth),
        ("Missing environment variable: `SCRIPTED_MODEL_API_KEY`.", FailureClass::Auth),
        ("To use Codex with your ChatGPT plan, upgrade to Plus: https://chatgpt.com/explore/plus.", FailureClass::Auth),
        ("error: unexpected argument '--full-auto' found", FailureClass::Config),
        ("Error: Authentication required. Please run 'agent login' first, or set CURSOR_API_KEY environment variable.", FailureClass::Auth),
        ("\u{26a0} Warning: The provided API key is invalid.", FailureClass::Auth),
        ("[API Error: API key not valid. Please pass a valid API key.]", FailureClass::Auth),
        ("Workspace Trust Required: Pass --trust, --yolo, or -f if you trust this directory", FailureClass::Config),
        ("[API Error: You have exhausted your daily quota on this model.]", FailureClass::UsageLimit),
        ("You exceeded your current quota, please check your plan and billing details.", FailureClass::UsageLimit),
        ("This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.", FailureClass::Context),
        ("FatalAuthenticationError: [API Error: API key not valid. Please pass a valid API key.]", FailureClass::Auth),
        ("--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons", FailureClass::Config),
        ("Error: Claude Code cannot be launched inside another Claude Code session.", FailureClass::Config),
        ("Error: When using --print, --output-format=stream-json requires --verbose", FailureClass::Config),
        ("error: unknown option '--frobnicate'", FailureClass::Config),
        ("error: unknown command 'x'", FailureClass::Config),
        ("Not inside a trusted directory and --skip-git-repo-check was not specified.", FailureClass::Config),
        ("Gemini CLI is not running in a trusted directory. To proceed, either use --skip-trust, set the GEMINI_CLI_TRUST_WORKSPACE=true environment variable, or trust this directory in interactive mode.", FailureClass::Config),
        ("Invalid auth method selected.", FailureClass::Config),
        ("`wire_api = \"chat\"` is no longer supported. How to fix: set `wire_api = \"responses\"`", FailureClass::Config),
        ("You've hit your session limit · resets 2pm (Europe/Helsinki)", FailureClass::UsageLimit),
        ("You\u{2019}ve hit your usage limit. Upgrade to Pro or try again at 3:28 PM.", FailureClass::UsageLimit),
        ("Claude AI usage limit reached|1753441200", FailureClass::UsageLimit),
        ("5-hour limit reached \u{2219} resets 7pm", FailureClass::UsageLimit),
        ("You have reached your specified API usage limits. You will regain access on 2026-04-01 at 00:00 UTC.", FailureClass::UsageLimit),
        ("Credit balance is too low", FailureClass::UsageLimit),
        ("Your usage allocation has been disabled by your admin", FailureClass::UsageLimit),
        ("{\"error\":{\"type\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\"}}", FailureClass::UsageLimit),
        ("Your workspace is out of credits. Add credits to keep using Codex.", FailureClass::UsageLimit),
        ("You hit your spend cap for this month.", FailureClass::UsageLimit),
        ("Quota exceeded. Check your plan and billing details.", FailureClass::UsageLimit),
        ("[API Error: You have exhausted your capacity on this model. Your quota will reset after 2h30m40s.]", FailureClass::UsageLimit),
        ("TerminalQuotaError: daily limit reached", FailureClass::UsageLimit),
        ("API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}", FailureClass::Transient),
        ("No messages returned", FailureClass::Transient),
        ("We\u{2019}re currently experiencing high demand, which may cause temporary errors.", FailureClass::Transient),
        ("exceeded retry limit, last status: 429 Too Many Requests", FailureClass::Transient),
        ("Selected model is at capacity. Please try a different model.", FailureClass::Transient),
        ("Reconnecting... 2/5 (stream disconnected before completion: error sending request)", FailureClass::Transient),
        ("RetryableQuotaError: Please retry in 12s", FailureClass::Transient),
        ("Error: read ECONNRESET", FailureClass::Transient),
        ("connect ECONNREFUSED 127.0.0.1:443", FailureClass::Transient),
        ("Error: connect ETIMEDOUT 10.0.0.1:443", FailureClass::Transient),
        ("Error: socket hang up", FailureClass::Transient),
        ("503 Service Unavailable", FailureClass::Transient),
        ("Prompt is too long", FailureClass::Context),
        ("Codex ran out of room in the model's context window. Start a new thread or clear earlier history before retrying.", FailureClass::Context),
        ("ContextOverflowError: prompt exceeds the model's context", FailureClass::Context),
        ("Failed to authenticate. API Error: 401 authentication_error", FailureClass::Auth),
    ];

    #[test]
    fn every_built_in_text_rule_has_a_realistic_line_that_it_classifies() {
        for (line, class) in REALISTIC {
            assert_eq!(classify(Signal::Text(line)), Some(*class), "{line}");
        }
        for (class, pattern) in RULES {
            let covered = REALISTIC.iter().any(|(line, c)| {
                c == class && matches(*pattern, Signal::Text(line), Some(&line.to_lowercase()))
            });
            let is_text = matches!(pattern, Pattern::Contains(_) | Pattern::StartsWith(_));
            assert!(
                !is_text || covered,
                "no realistic line for {class:?} {pattern:?}"
            );
        }
    }

    #[test]
    fn extra_patterns_from_ralph_toml_extend_the_built_in_ones() {
        let extra: ExtraPatterns = toml::from_str(
            "usage_limit = [\"Monthly Token Budget exhausted\"]\ntransient = [\"upstream connect error\"]",
        )
        .unwrap();
        assert_eq!(
            extra.classify("\x1b[31mmonthly token budget EXHAUSTED; resets in 3 hours\x1b[0m"),
            Some(FailureClass::UsageLimit)
        );
        let mut report = crate::protocol::AgentReport {
            is_error: true,
            error_message: Some("monthly token budget exhausted; resets in 3 hours".into()),
            failure: Some(FailureClass::Transient),
            ..Default::default()
        };
        extra.apply(&mut report);
        assert_eq!(report.failure, Some(FailureClass::UsageLimit));
        let wait = report.resume_at.unwrap() - chrono::Utc::now();
        assert!((2..=3).contains(&wait.num_hours()), "{wait:?}");

        // A run that did not fail is left alone, and a weaker class never replaces a stronger.
        let mut ok = crate::protocol::AgentReport {
            error_message: Some("upstream connect error".into()),
            ..Default::default()
        };
        extra.apply(&mut ok);
        assert_eq!(ok.failure, None);
        let mut auth = crate::protocol::AgentReport {
            is_error: true,
            error_message: Some("upstream connect error".into()),
            failure: Some(FailureClass::Auth),
            ..Default::default()
        };
        extra.apply(&mut auth);
        assert_eq!(auth.failure, Some(FailureClass::Auth));
        assert!(toml::from_str::<ExtraPatterns>("usage_limits = []").is_err());
    }

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
