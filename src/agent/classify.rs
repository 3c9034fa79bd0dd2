//! Sorting an agent's *own* error signals into a [`FailureClass`].
//!
//! The rules are data ([`RULES`]): each entry pairs a class with one pattern. Patterns are matched
//! only against what the agent itself says about its run: stderr lines, the terminal result text
//! when it is an error, the `error` field of assistant messages, `api_error_status`,
//! `terminal_reason`, retry notices and rate-limit events. Tool output is never fed in: an agent
//! that runs `grep "Invalid API key"` over the codebase has not lost its credentials.
//!
//! Text is compared case-insensitively after removing ANSI escapes. Besides the plain substrings,
//! three things are read out of every text signal:
//! - the **usage-limit family** ([`Family::LimitNotice`]): any `<kind> limit reached` (5-hour,
//!   weekly, session, Opus, …) or `out of … usage` that names a reset (`· resets 9pm`,
//!   `∙ resets Oct 9, 10am`, the legacy `…|<epoch>`), whatever the separator;
//! - a **missing model** ([`Family::MissingModel`]): every CLI's wording for a model that does
//!   not exist or the account cannot use (claude's `There's an issue with the selected model
//!   (…)`, an Anthropic `not_found_error` about `model: …`, OpenAI's ``The model `…` does not
//!   exist``, Google's `models/… is not found`, opencode's `Model not found: …`), a
//!   [`FailureClass::Config`] whose model name [`Classifier::missing_model`] keeps;
//! - **HTTP statuses written in the text** ([`statuses_in_text`]: `API Error: 500 {…}`,
//!   `unexpected status 401 Unauthorized`, `last status: 503`, `(HTTP 529)`, `"statusCode":502`),
//!   which count like a structured status: older CLIs print the status only there.
//!
//! Several signals can match in one run (retry chatter with status 429, then a final "You've
//! hit your session limit"), so [`Classifier`] keeps every match and reports the most decisive
//! class ([`precedence`]): config > auth > usage limit > context > transient. The most specific
//! reading wins: `exceeded retry limit, last status: 401 Unauthorized` is retry chatter wrapped
//! around an auth failure, so auth; a 429 that says `You've hit your session limit` is a usage
//! limit, not a rate limit. What the backends add on top (`crate::agent::stream`): structured
//! fields decide before text when a dialect reads them (gemini's error class, opencode's error
//! name), and nothing is classified at all when the agent's own terminal event says the run
//! succeeded, so an answer that only *discusses* limits or keys is never a failure.
//!
//! Sources for the patterns: `notes/agent-protocols.md` §1 (Claude Code errors, limits and exit
//! codes), §2 (codex `CodexErr` texts), §4–§6 (opencode, gemini, cursor) and `notes/real-clis.md`
//! (the real CLIs' error runs). Users add their own with `[patterns]` in ralph.toml
//! ([`ExtraPatterns`]).

use std::sync::LazyLock;

use regex::Regex;

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
    /// [`Signal::Text`] belongs to a family of wordings too varied for one substring.
    Family(Family),
}

/// Families of wordings, each recognised by a small set of regular expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A usage-limit notice: `<kind> limit reached` for a plan's kinds (`5-hour`, `weekly`,
    /// `session`, `Opus`, `usage`, …), any `… limit reached` that names a reset (`· resets 5am`,
    /// `∙ resets Oct 9, 10am`, `|1753441200`), `out of extra usage` and any `out of … usage`
    /// that names a reset, `reached your weekly limit`, `you hit your … limit`.
    LimitNotice,
    /// A model that does not exist or the account may not use ([`missing_model`]).
    MissingModel,
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
    // A model that does not exist, in each CLI's words, and claude's assistant error code for
    // it: the same request fails the same way every time.
    (FailureClass::Config, Pattern::Family(Family::MissingModel)),
    (FailureClass::Config, Pattern::ErrorCode("model_not_found")),
    // A commander-style CLI (amp) refusing an option's value, e.g. `--mode`.
    (FailureClass::Config, Pattern::StartsWith("error: option")),
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
    // Every plan's and version's `<kind> limit reached ∙ resets …`, `out of extra usage`.
    (
        FailureClass::UsageLimit,
        Pattern::Family(Family::LimitNotice),
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
    // The Anthropic error envelope's types, when a CLI quotes the body without the status.
    (
        FailureClass::Transient,
        Pattern::Contains("\"type\":\"api_error\""),
    ),
    (
        FailureClass::Transient,
        Pattern::Contains("rate_limit_error"),
    ),
    // A per-minute rate limit (OpenAI's `Rate limit reached for … Please try again in 20s`):
    // not a plan's allowance, which the limit family covers.
    (
        FailureClass::Transient,
        Pattern::Contains("rate limit reached"),
    ),
    (
        FailureClass::Transient,
        Pattern::Contains("rate limit exceeded"),
    ),
    (FailureClass::Auth, Pattern::Contains("permission_error")),
    (
        FailureClass::Transient,
        Pattern::Contains("internal server error"),
    ),
    (FailureClass::Transient, Pattern::Contains("bad gateway")),
    (
        FailureClass::Transient,
        Pattern::Contains("gateway timeout"),
    ),
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
    // Claude Code's `Context limit reached · /compact or /clear to continue`.
    (
        FailureClass::Context,
        Pattern::Contains("context limit reached"),
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
                // A reset time that has passed is no time to wait for.
                report.resume_at = resume_at_from_text(message)
                    .filter(|at| *at >= chrono::Utc::now() - chrono::Duration::minutes(1));
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

/// The most decisive class among the [`RULES`] that match `signal`, if any. A text signal also
/// counts as each HTTP status written in it ([`statuses_in_text`]).
pub fn classify(signal: Signal<'_>) -> Option<FailureClass> {
    // Lowercase once per signal, not once per rule.
    let text = match signal {
        Signal::Text(t) => Some(strip_ansi(t).to_lowercase()),
        _ => None,
    };
    let statuses = text.as_deref().map(statuses_in_text).unwrap_or_default();
    let by_status = statuses
        .into_iter()
        .filter_map(|status| classify(Signal::ApiStatus(status)));
    RULES
        .iter()
        .filter(|(_, pattern)| matches(*pattern, signal, text.as_deref()))
        .map(|(class, _)| *class)
        .chain(by_status)
        .max_by_key(|class| precedence(*class))
}

fn matches(pattern: Pattern, signal: Signal<'_>, lower_text: Option<&str>) -> bool {
    match (pattern, signal) {
        (Pattern::Contains(p), Signal::Text(_)) => lower_text.is_some_and(|t| t.contains(p)),
        (Pattern::StartsWith(p), Signal::Text(_)) => {
            lower_text.is_some_and(|t| t.trim_start().starts_with(p))
        }
        (Pattern::Family(family), Signal::Text(_)) => lower_text.is_some_and(|t| match family {
            Family::LimitNotice => limit_notice_at(t).is_some(),
            Family::MissingModel => missing_model(t).is_some(),
        }),
        (Pattern::ErrorCode(p), Signal::ErrorCode(code)) => code.trim().eq_ignore_ascii_case(p),
        (Pattern::Status(lo, hi), Signal::ApiStatus(status)) => (lo..=hi).contains(&status),
        (Pattern::TerminalReason(p), Signal::TerminalReason(reason)) => reason == p,
        (Pattern::RateLimitStatus(p), Signal::RateLimitStatus(status)) => status == p,
        _ => false,
    }
}

/// Where a usage-limit notice ([`Family::LimitNotice`]) starts in `text` (a byte offset), if
/// `text` holds one. Case-insensitive; the separator before `resets` does not matter (`·`,
/// `∙`, `-`, `|`).
pub fn limit_notice_at(text: &str) -> Option<usize> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?ix)
              \b(?:usage|\d+-hour|five-hour|hourly|daily|weekly|monthly|session|opus|sonnet|haiku
                  |plan|spend|extra\ usage|(?:fast|premium|free)\ requests?)
                \ limits?\ (?:has\ been\ |was\ )?reached\b
            | \blimit\ reached\b[^\n]{0,80}?\b(?:resets?|try\ again)\b
            | \blimit\ reached\s*\|\s*\d{9,11}
            | \bout\ of\ (?:your\ )?(?:extra|included|free|monthly|weekly)\ usage\b
            | \bout\ of\ [^\n.]{0,40}?\busage\b[^\n]{0,80}?\bresets?\b
            | \breached\ your\ (?:(?:weekly|daily|monthly|session|usage|plan|spend|\d+-hour|five-hour|opus|sonnet)\ )+limit
            | \byou\ (?:have\ )?hit\ your\b[^\n.]{0,40}?\blimit\b",
        )
        .expect("static regex")
    });
    // `… limit reached` of something that is not a plan's allowance (a rate limit, a context
    // or output limit, max turns) is no usage limit, even with "try again" after it.
    const NOT_USAGE: &[&str] = &[
        "rate",
        "context",
        "token",
        "tokens",
        "turn",
        "turns",
        "output",
        "length",
        "size",
        "recursion",
        "loop",
        "step",
        "steps",
        "iteration",
    ];
    RE.find_iter(text)
        .find(|m| {
            let before = text[..m.start()].trim_end();
            let word = before
                .rsplit(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_lowercase();
            let generic = m.as_str().to_lowercase().starts_with("limit");
            !(generic && NOT_USAGE.contains(&word.as_str()))
        })
        .map(|m| m.start())
}

/// Whether `line` *is* a usage-limit notice rather than a sentence that mentions one: the
/// notice ([`limit_notice_at`], or `you've hit your …`) starts the line (after at most an
/// `Error:`-like prefix: no other word, no quote), the line is short, and it names a reset time
/// ralph can read. Used where ralph reads an agent's plain answer (the exec backend), which may
/// be a limit notice or prose about one.
pub fn is_limit_notice(line: &str) -> bool {
    let clean = strip_ansi(line);
    let clean = clean.trim();
    if clean.is_empty() || clean.chars().count() > 300 {
        return false;
    }
    let lower = clean.to_lowercase();
    let start = ["you've hit your", "you\u{2019}ve hit your"]
        .iter()
        .filter_map(|p| lower.find(p))
        .chain(limit_notice_at(&lower))
        .min();
    // Only an `Error:`-like prefix (or the notice's own `You're`, `Claude AI`) may come first:
    // no other word, no quote (prose quoting a notice is not one).
    let bare_prefix = |at: usize| {
        lower.get(..at).is_some_and(|prefix| {
            let mut rest = prefix.to_owned();
            for word in [
                "error",
                "claude ai",
                "you're",
                "you\u{2019}re",
                "you've",
                "you\u{2019}ve",
                "you have",
                "you",
            ] {
                rest = rest.replace(word, "");
            }
            !rest.chars().any(|c| {
                c.is_alphanumeric() || matches!(c, '`' | '\'' | '"' | '\u{201c}' | '\u{2018}')
            })
        })
    };
    start.is_some_and(|at| at <= 12 && bare_prefix(at))
        && crate::agent::reset_time::resume_at_from_text_at(
            clean,
            chrono::Utc::now(),
            &chrono::Local,
        )
        .is_some()
}

/// A model the agent's API refused as missing or not available to the account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingModel {
    /// The model's name as the error gives it, when it gives one.
    pub name: Option<String>,
}

/// Whether `text` says that the requested model does not exist (or is not available to the
/// account), and which model, in the wordings of every CLI ralph drives: claude's
/// `There's an issue with the selected model (claude-x)`, an Anthropic `not_found_error` whose
/// message is `model: claude-x`, OpenAI's ``The model `gpt-x` does not exist or you do not have
/// access to it`` (codex, opencode), codex's `The 'gpt-x' model is not supported when using
/// Codex with a ChatGPT account`, Google's `models/gemini-x is not found for API version …`,
/// opencode's `ProviderModelNotFoundError: Model not found: p/m`, gemini's
/// `ModelNotFoundError`, cursor's `Cannot use this model: x`, and `invalid model name`.
///
/// Not a missing model: claude's warning that it does not recognise a custom model's context
/// window, and codex's `Model metadata for `x` not found` (both say the run goes on).
pub fn missing_model(text: &str) -> Option<MissingModel> {
    static NAMED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
        [
            r"(?i)issue with the selected model \(([^)\s]+)\)",
            r#"(?i)not_found_error[^\n]{0,80}?"message"\s*:\s*"model:\s*([^"\s]+)"#,
            r#"(?i)\bthe model [`'"]?([^\s`'"]+?)[`'"]? does not exist"#,
            r#"(?i)\bthe [`'"]([^`'"\s]+)[`'"] model is not supported"#,
            r"(?i)\bmodels/([\w.\-]+) is not found",
            r"(?i)\bmodel not found:?\s+([^\s,;]+)",
            r"(?i)\bcannot use this model:?\s+([^\s,;]+)",
            r#"(?i)\binvalid model(?: name| id)?:?\s+[`'"]?([^\s`'",;]+)"#,
            r#"(?i)\bmodel [`'"]([^`'"\s]+)[`'"] (?:does not exist|is not available|not found|is not found)"#,
        ]
        .iter()
        .map(|re| Regex::new(re).expect("static regex"))
        .collect()
    });
    static BARE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)\b(?:provider)?modelnotfounderror\b|\bmodel_not_found\b|\bmodel not found\b|\binvalid model(?: name| id)?\b",
        )
        .expect("static regex")
    });
    let clean = strip_ansi(text);
    for re in NAMED.iter() {
        if let Some(caps) = re.captures(&clean) {
            let name = caps[1]
                .trim_end_matches(['.', ',', ')', '`', '\'', '"'])
                .to_owned();
            // "Invalid model name" names no model: the word after it is not one.
            let generic = [
                "name",
                "id",
                "specified",
                "provided",
                "given",
                "selected",
                "requested",
            ]
            .contains(&name.to_ascii_lowercase().as_str());
            return Some(MissingModel {
                name: (!name.is_empty() && !generic).then_some(name),
            });
        }
    }
    BARE.is_match(&clean).then_some(MissingModel { name: None })
}

/// The HTTP statuses written in an error text: `API Error: 500 {…}` (claude before it had
/// `api_error_status`), `unexpected status 401 Unauthorized` and `last status: 429` (codex),
/// `HTTP 503`, `"status": 529` / `"statusCode": 502` / `"code": 404` in a quoted body, and a
/// status followed by its reason phrase (`503 Service Unavailable`).
pub fn statuses_in_text(text: &str) -> Vec<u16> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r#"(?ix)
              (?: \bapi\ error:?\s*
                | \b(?:unexpected\ |last\ )?status(?:\ code)?:?\s*
                | \bhttp(?:/[\d.]+)?\s*
                | "(?:status|statuscode|status_code|error_status|code)"\s*:\s* )
              (?P<s>[1-5]\d\d)\b
            | \b(?P<r>[45]\d\d)\ (?:unauthorized|forbidden|not\ found|too\ many\ requests
                |internal\ server\ error|bad\ gateway|service\ unavailable|gateway\ timeout|overloaded)\b"#,
        )
        .expect("static regex")
    });
    let mut out: Vec<u16> = RE
        .captures_iter(text)
        .filter_map(|c| c.name("s").or_else(|| c.name("r")))
        .filter_map(|m| m.as_str().parse().ok())
        .collect();
    out.dedup();
    out
}

/// Accumulates the signals of one agent run and remembers the most decisive class seen, plus
/// the first message that produced it (for the report's `error_message`), and a missing model.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    best: Option<FailureClass>,
    message: Option<String>,
    missing_model: Option<MissingModel>,
}

impl Classifier {
    /// An empty classifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one signal; returns the class it matched, if any.
    pub fn observe(&mut self, signal: Signal<'_>) -> Option<FailureClass> {
        self.note_missing_model(signal);
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
        } else if self.message.is_none() && self.best == Some(class) {
            // The same class again, now in words: keep the words for the message.
            if let Signal::Text(t) = signal {
                self.message = Some(strip_ansi(t).trim().to_owned());
            }
        }
        Some(class)
    }

    fn note_missing_model(&mut self, signal: Signal<'_>) {
        let found = match signal {
            Signal::Text(t) => missing_model(t),
            Signal::ErrorCode(code) if code.trim().eq_ignore_ascii_case("model_not_found") => {
                Some(MissingModel { name: None })
            }
            _ => None,
        };
        if let Some(found) = found {
            if self
                .missing_model
                .as_ref()
                .is_none_or(|m| m.name.is_none() && found.name.is_some())
            {
                self.missing_model = Some(found);
            }
        }
    }

    /// The most decisive class seen so far.
    pub fn best(&self) -> Option<FailureClass> {
        self.best
    }

    /// The text (ANSI stripped, trimmed) of the signal that set [`Classifier::best`], when it was
    /// a [`Signal::Text`] (or a later text of the same class, when the deciding signal was not).
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The model the agent's API refused as missing, when one of its signals said so (the
    /// first one that named it).
    pub fn missing_model(&self) -> Option<&MissingModel> {
        self.missing_model.as_ref()
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
        // Every plan's and version's limit notice, either separator, every channel.
        ("Weekly limit reached \u{2219} resets 5am", FailureClass::UsageLimit),
        ("Session limit reached \u{2219} resets 10am", FailureClass::UsageLimit),
        ("You're out of extra usage \u{00b7} resets 9pm", FailureClass::UsageLimit),
        // Claude Code's own context notice, which is no usage limit.
        ("Context limit reached \u{00b7} /compact or /clear to continue", FailureClass::Context),
        // Statuses only in the text (claude before `api_error_status`), and quoted envelopes.
        ("API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}", FailureClass::Transient),
        ("{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of requests has exceeded your rate limit\"}}", FailureClass::Transient),
        ("{\"type\":\"error\",\"error\":{\"type\":\"permission_error\",\"message\":\"Your API key does not have permission to use the specified resource.\"}}", FailureClass::Auth),
        ("upstream replied: Internal Server Error", FailureClass::Transient),
        ("Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.", FailureClass::Transient),
        ("Rate limit exceeded", FailureClass::Transient),
        ("upstream replied: Bad Gateway", FailureClass::Transient),
        ("upstream replied: Gateway Timeout", FailureClass::Transient),
        // A missing model, in each CLI's words (real claude 2.1.332, codex 0.171.0, opencode
        // 1.18.33, gemini 0.61.0 against a 404), and amp refusing an option's value.
        ("There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model.", FailureClass::Config),
        ("error: option '-m, --mode <mode>' argument 'turbo' is invalid. Allowed choices are smart, rush, deep.", FailureClass::Config),
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

    /// Claude's limit wordings across plans and versions are one family, whatever the separator
    /// and wherever they appear; a notice is told from prose about one.
    #[test]
    fn limit_family_covers_every_kind_and_separator() {
        for text in [
            "5-hour limit reached \u{2219} resets 7pm",
            "Weekly limit reached \u{2219} resets 5am",
            "Session limit reached \u{2219} resets 10am",
            "Opus weekly limit reached \u{00b7} resets Oct 9, 10am",
            "You're out of extra usage \u{00b7} resets 9pm",
            "You\u{2019}re out of extra usage",
            "Claude AI usage limit reached|1753441200",
            "Monthly limit reached - resets Dec 1",
            "Daily limit reached | resets 12am (America/New_York)",
            "Error: Weekly limit reached \u{2219} resets Mon 5am",
            "You've reached your weekly limit.",
            "You hit your monthly limit",
        ] {
            assert_eq!(
                classify(Signal::Text(text)),
                Some(FailureClass::UsageLimit),
                "{text}"
            );
        }
        for text in [
            "Context limit reached \u{00b7} /compact or /clear to continue",
            "Max turns limit reached",
            "rate limit reached, retrying in 2s",
            "Rate limit reached for requests. Please try again in 1s.",
            "Output token limit reached, try again with a shorter answer",
        ] {
            assert_ne!(
                classify(Signal::Text(text)),
                Some(FailureClass::UsageLimit),
                "{text}"
            );
        }
        assert!(is_limit_notice("Weekly limit reached \u{2219} resets 5am"));
        assert!(is_limit_notice(
            "You're out of extra usage \u{00b7} resets 9pm"
        ));
        assert!(is_limit_notice("Claude AI usage limit reached|1753441200"));
        assert!(is_limit_notice(
            "Error: You've hit your limit \u{00b7} resets 4pm"
        ));
        // Prose about a notice, a notice without a reset time, a long line: not a notice.
        assert!(!is_limit_notice(
            "I added handling for \"Weekly limit reached \u{2219} resets 5am\" to parse.rs."
        ));
        assert!(!is_limit_notice("Weekly limit reached"));
        assert!(!is_limit_notice(&format!(
            "Weekly limit reached \u{2219} resets 5am {}",
            "x".repeat(400)
        )));
    }

    /// The status is often only in the text: older claude prints `API Error: 500 {…}` without
    /// `api_error_status`; codex writes it into its messages.
    #[test]
    fn statuses_written_in_the_text_count() {
        assert_eq!(
            statuses_in_text(
                "API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\"}}"
            ),
            [500]
        );
        assert_eq!(
            statuses_in_text("exceeded retry limit, last status: 401 Unauthorized"),
            [401]
        );
        assert_eq!(statuses_in_text("Rate limit exceeded (HTTP 429)"), [429]);
        assert_eq!(statuses_in_text("{\"error\":{\"code\": 503}}"), [503]);
        assert_eq!(statuses_in_text("upstream: 502 Bad Gateway"), [502]);
        assert!(statuses_in_text("wrote 500 lines, exit status 1").is_empty());
        for (text, class) in [
            (
                "API Error: 500 Internal server error. This is a server-side issue",
                FailureClass::Transient,
            ),
            (
                "API Error: 502 <html>bad gateway</html>",
                FailureClass::Transient,
            ),
            (
                "API Error: 503 upstream connect error",
                FailureClass::Transient,
            ),
            ("API Error: 504 timeout", FailureClass::Transient),
            (
                "API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}",
                FailureClass::Transient,
            ),
            (
                "API Error: 401 {\"type\":\"error\",\"error\":{\"message\":\"invalid x-api-key\"}}",
                FailureClass::Auth,
            ),
            (
                "API Error: 403 {\"error\":{\"message\":\"Request not allowed\"}}",
                FailureClass::Auth,
            ),
        ] {
            assert_eq!(classify(Signal::Text(text)), Some(class), "{text}");
        }
    }

    /// A missing model, in every CLI's words, is a config error naming the model; the
    /// warnings that mention an unknown model while the run goes on are not.
    #[test]
    fn missing_model_wordings_name_the_model() {
        assert_eq!(
            missing_model("Error: Invalid model name").map(|m| m.name),
            Some(None)
        );
        assert_eq!(
            missing_model("ModelNotFoundError: Requested entity was not found.").map(|m| m.name),
            Some(None)
        );
        for (text, name) in [
            ("There's an issue with the selected model (claude-nope-9). It may not exist or you may not have access to it. Run --model to pick a different model.", Some("claude-nope-9")),
            ("API Error: 404 {\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"model: claude-3-opus-nope\"},\"request_id\":\"req_011\"}", Some("claude-3-opus-nope")),
            ("unexpected status 404 Not Found: The model `gpt-nope-9` does not exist or you do not have access to it., url: http://127.0.0.1:1/v1/responses", Some("gpt-nope-9")),
            ("Reconnecting... 2/5 (unexpected status 404 Not Found: The model `gpt-nope-9` does not exist or you do not have access to it.)", Some("gpt-nope-9")),
            ("The 'gpt-4.1' model is not supported when using Codex with a ChatGPT account.", Some("gpt-4.1")),
            ("ProviderModelNotFoundError: Model not found: fake/nope-model. Did you mean: fake-model?", Some("fake/nope-model")),
            ("[API Error: models/gemini-nope-9 is not found for API version v1beta, or is not supported for generateContent.]", Some("gemini-nope-9")),
            ("Cannot use this model: gpt-9. Available models: auto, sonnet-4.5", Some("gpt-9")),
            ("Invalid model name: sonet", Some("sonet")),
            ("{\"error\":{\"code\":\"model_not_found\"}}", None),
            ("ModelNotFoundError: Requested entity was not found.", None),
        ] {
            let found = missing_model(text);
            assert_eq!(found.map(|m| m.name), Some(name.map(str::to_owned)), "{text}");
            assert_eq!(classify(Signal::Text(text)), Some(FailureClass::Config), "{text}");
        }
        for text in [
            "Claude Code doesn't recognize the model \"claude-nope-9\", so it assumes a context window of 1m tokens.",
            "[claude-code:unrecognized_model] {\"model\":\"claude-nope-9\",\"query_source\":\"sdk\"}",
            "Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.",
            "API Error: 404 {\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"no route for /v1/x\"}}",
        ] {
            assert_eq!(missing_model(text), None, "{text}");
            assert_ne!(classify(Signal::Text(text)), Some(FailureClass::Config), "{text}");
        }
        let mut c = Classifier::new();
        c.observe(Signal::ErrorCode("model_not_found"));
        c.observe(Signal::ApiStatus(404));
        c.observe(Signal::Text("There's an issue with the selected model (claude-x). Run --model to pick a different model."));
        assert_eq!(c.best(), Some(FailureClass::Config));
        assert_eq!(
            c.missing_model().and_then(|m| m.name.as_deref()),
            Some("claude-x")
        );
    }

    /// codex's retry chatter comes before the real failure; `exceeded retry limit, last status:
    /// 401 Unauthorized` is an auth failure, not a transient one, in whatever order.
    #[test]
    fn most_specific_class_wins_over_retry_chatter() {
        let mut c = Classifier::new();
        for n in 1..=5 {
            c.observe(Signal::Text(&format!(
                "Reconnecting... {n}/5 (stream disconnected before completion: error sending request)"
            )));
        }
        assert_eq!(c.best(), Some(FailureClass::Transient));
        c.observe(Signal::Text(
            "exceeded retry limit, last status: 401 Unauthorized",
        ));
        assert_eq!(c.best(), Some(FailureClass::Auth));
        assert_eq!(
            c.message(),
            Some("exceeded retry limit, last status: 401 Unauthorized")
        );
        assert_eq!(
            classify(Signal::Text(
                "exceeded retry limit, last status: 503 Service Unavailable"
            )),
            Some(FailureClass::Transient)
        );
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
