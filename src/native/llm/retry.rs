//! Error classification and retries for both LLM wire formats.
//!
//! This module owns the one table that decides whether a failed request is tried again
//! (`shared/notes/agent-protocols.md` §10, issue 3 "Loop control"):
//!
//! | signal | [`LlmError`] | retried |
//! |---|---|---|
//! | 402, or 400/403/429 whose body says `insufficient_quota`, "credit balance" or "billing" | `Quota` | no |
//! | a body that says `context_length_exceeded`, "prompt is too long", "maximum context length" | `ContextLength` | no |
//! | 401, 403 | `Auth` | no |
//! | 408, 409, 429, 5xx (529 included), dropped connection or stream | `Transient` | yes |
//! | any other 4xx | `BadRequest` | no |
//!
//! [`complete_with_retry`] then retries `Transient` errors with capped exponential backoff
//! that waits at least as long as the server's `retry-after-ms` / `retry-after`.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use serde_json::Value;

use super::{ChatRequest, ChatResponse, LlmError, Provider};

/// How [`complete_with_retry`] retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 5). `0` is treated as `1`.
    pub max_attempts: u32,
    /// The first backoff; attempt `n` waits about `base · 2^(n-1)` (default 1 s).
    pub base: Duration,
    /// The longest single wait, also applied to a server's `retry-after` (default 60 s).
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based) that failed with `error`:
    /// `max(min(retry_after, cap), min(base · 2^(attempt-1), cap) · (1 − 0.25·r))` with `r`
    /// uniform in `[0, 1)`. The jitter spreads out clients that failed together; the server's
    /// `retry-after` is a floor, because retrying before it only earns another 429.
    pub fn backoff(&self, error: &LlmError, attempt: u32) -> Duration {
        let exp = 2f64.powi(attempt.saturating_sub(1).min(30) as i32);
        let raw = self.base.as_secs_f64() * exp;
        let capped = raw.min(self.cap.as_secs_f64());
        let jittered = Duration::from_secs_f64(capped * (1.0 - 0.25 * fastrand::f64()));
        let server = match error {
            LlmError::Transient {
                retry_after: Some(after),
                ..
            } => (*after).min(self.cap),
            _ => Duration::ZERO,
        };
        jittered.max(server)
    }
}

/// Sends `req` through `provider`, retrying [`LlmError::is_retryable`] failures.
///
/// At most `policy.max_attempts` requests are sent. Before each retry, `on_retry(error,
/// attempt, wait)` is called with the error of failed attempt `attempt` (1-based) and the
/// wait ([`RetryPolicy::backoff`]) that follows, so the caller can log or show it.
///
/// Cancellation: drop the returned future (for example the losing branch of a
/// `tokio::select!` on a cancel token). Every wait is a `tokio::time::sleep` and every request
/// an async `reqwest` call, so dropping aborts the wait or closes the HTTP connection at once;
/// nothing blocks a thread.
///
/// # Errors
/// The first error that is not retryable, or the last error once the attempts are used up.
pub async fn complete_with_retry(
    provider: &Provider,
    req: &ChatRequest,
    policy: &RetryPolicy,
    mut on_retry: impl FnMut(&LlmError, u32, Duration),
) -> Result<ChatResponse, LlmError> {
    let max = policy.max_attempts.max(1);
    let mut attempt = 1;
    loop {
        match provider.complete(req).await {
            Ok(response) => return Ok(response),
            Err(error) if error.is_retryable() && attempt < max => {
                let wait = policy.backoff(&error, attempt);
                on_retry(&error, attempt, wait);
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Classifies a non-2xx HTTP answer (status, headers, body text) into an [`LlmError`].
///
/// The body may be an OpenAI envelope `{"error":{"message","type","code"}}`, an Anthropic
/// envelope `{"type":"error","error":{"type","message"}}`, or anything else (used verbatim,
/// shortened). Quota and context-length markers are looked for in the whole body, case
/// insensitively, so they are found whichever field carries them.
pub fn classify_http(status: u16, headers: &HeaderMap, body: &str) -> LlmError {
    let message = error_message(status, body);
    let lower = body.to_ascii_lowercase();
    if status == 402 || (matches!(status, 400 | 403 | 429) && says_quota(&lower)) {
        return LlmError::Quota { message };
    }
    if says_context_length(&lower) {
        return LlmError::ContextLength { message };
    }
    match status {
        401 | 403 => LlmError::Auth { status, message },
        408 | 409 | 429 | 500..=599 => LlmError::Transient {
            status: Some(status),
            message,
            retry_after: retry_after(headers, SystemTime::now()),
        },
        _ => LlmError::BadRequest { status, message },
    }
}

/// Classifies an error object that arrived inside a 200 response (an SSE `error` event or a
/// `data: {"error":…}` chunk), after mapping its type to the HTTP status it stands for:
/// Anthropic `overloaded_error` → 529, `rate_limit_error` → 429, `api_error` → 500,
/// `invalid_request_error` → 400, `authentication_error` → 401, `permission_error` → 403,
/// `billing_error` → 402, `not_found_error` → 404, `request_too_large` → 413; OpenAI
/// `insufficient_quota` → 429, a numeric `code` or `status` as is. Unknown types count as a
/// server error (500, retried): the request itself was accepted.
pub fn classify_stream_error(event: &Value) -> LlmError {
    let error = event.get("error").unwrap_or(event);
    let status = ["status", "code"]
        .iter()
        .find_map(|k| {
            let v = error.get(*k)?;
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse::<u64>().ok()))
        })
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| (400..600).contains(n));
    let kind = error
        .get("type")
        .and_then(Value::as_str)
        .or_else(|| error.get("code").and_then(Value::as_str))
        .unwrap_or("");
    let status = status.unwrap_or(match kind {
        "overloaded_error" => 529,
        "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" => 429,
        "invalid_request_error" => 400,
        "authentication_error" | "invalid_api_key" => 401,
        "permission_error" => 403,
        "billing_error" => 402,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "timeout_error" => 504,
        _ => 500,
    });
    classify_http(status, &HeaderMap::new(), &event.to_string())
}

/// Whether a lower-cased error body is about money rather than rate.
fn says_quota(lower: &str) -> bool {
    ["insufficient_quota", "credit balance", "billing"]
        .iter()
        .any(|m| lower.contains(m))
}

/// Whether a lower-cased error body says the prompt does not fit the model's context.
fn says_context_length(lower: &str) -> bool {
    [
        "context_length_exceeded",
        "prompt is too long",
        "maximum context length",
    ]
    .iter()
    .any(|m| lower.contains(m))
}

/// The human part of an error body: the provider's `message` plus its `type`/`code` in
/// brackets, or the body itself shortened to 300 characters, or a note that it was empty.
pub fn error_message(status: u16, body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        let error = v.get("error").unwrap_or(&v);
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str());
        if let Some(message) = message {
            let tag = ["code", "type"]
                .iter()
                .find_map(|k| error.get(*k).and_then(Value::as_str))
                .filter(|t| !t.is_empty());
            return match tag {
                Some(tag) => format!("{} [{tag}]", message.trim()),
                None => message.trim().to_string(),
            };
        }
    }
    let text = body.trim();
    if text.is_empty() {
        return format!("HTTP {status} with an empty body");
    }
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_string(),
    }
}

/// The server's requested wait: `retry-after-ms` (milliseconds, may be fractional), else
/// `retry-after` as seconds or as an HTTP date (RFC 7231 IMF-fixdate, counted from `now`;
/// a date in the past means zero). Unparseable or negative values are ignored.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::from(date);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn classify(status: u16, body: &str) -> LlmError {
        classify_http(status, &HeaderMap::new(), body)
    }

    #[test]
    fn statuses_map_to_the_retry_table() {
        for status in [408, 409, 429, 500, 502, 503, 504, 529] {
            let e = classify(status, "");
            assert!(e.is_retryable(), "{status} should be retried: {e:?}");
        }
        for status in [401, 403] {
            assert!(matches!(classify(status, "{}"), LlmError::Auth { .. }));
        }
        for status in [400, 404, 413, 422] {
            assert!(matches!(
                classify(status, "nope"),
                LlmError::BadRequest { .. }
            ));
        }
    }

    #[test]
    fn quota_bodies_are_never_retried_even_on_429() {
        let openai = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(matches!(classify(429, openai), LlmError::Quota { .. }));
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
        assert!(matches!(classify(400, anthropic), LlmError::Quota { .. }));
        assert!(matches!(
            classify(403, "billing disabled"),
            LlmError::Quota { .. }
        ));
        assert!(matches!(classify(402, "{}"), LlmError::Quota { .. }));
        // A plain rate limit stays retryable.
        let rate = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert!(classify(429, rate).is_retryable());
    }

    #[test]
    fn context_length_bodies_of_both_apis() {
        let openai = r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
        for body in [openai, anthropic] {
            let e = classify(400, body);
            assert!(matches!(e, LlmError::ContextLength { .. }), "{e:?}");
        }
    }

    #[test]
    fn messages_come_from_either_envelope() {
        let openai = r#"{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert_eq!(
            error_message(401, openai),
            "Incorrect API key [invalid_api_key]"
        );
        let anthropic =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            error_message(529, anthropic),
            "Overloaded [overloaded_error]"
        );
        assert_eq!(error_message(502, "  "), "HTTP 502 with an empty body");
        let long = "x".repeat(1000);
        assert!(error_message(500, &long).ends_with("(1000 bytes)"));
    }

    #[test]
    fn retry_after_in_ms_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_470);
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "1500")]), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        // 2015-10-21T07:28:00Z is 10 s after `now`.
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
                now
            ),
            Some(Duration::from_secs(10))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        // ms wins over seconds.
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "9"), ("retry-after-ms", "20")]),
                now
            ),
            Some(Duration::from_millis(20))
        );
        let e = classify_http(429, &headers(&[("retry-after", "3")]), "");
        assert!(matches!(
            e,
            LlmError::Transient {
                retry_after: Some(d),
                ..
            } if d == Duration::from_secs(3)
        ));
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(4),
        };
        let plain = LlmError::Transient {
            status: Some(500),
            message: String::new(),
            retry_after: None,
        };
        let first = policy.backoff(&plain, 1);
        assert!(first <= Duration::from_secs(1) && first >= Duration::from_millis(750));
        let third = policy.backoff(&plain, 3);
        assert!(third <= Duration::from_secs(4) && third >= Duration::from_secs(3));
        assert!(policy.backoff(&plain, 30) <= Duration::from_secs(4));
        let told = LlmError::Transient {
            status: Some(429),
            message: String::new(),
            retry_after: Some(Duration::from_secs(2)),
        };
        assert!(policy.backoff(&told, 1) >= Duration::from_secs(2));
        let too_long = LlmError::Transient {
            status: Some(429),
            message: String::new(),
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(policy.backoff(&too_long, 1), Duration::from_secs(4));
    }

    #[test]
    fn stream_errors_map_to_their_status() {
        let overloaded = serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
        assert!(matches!(
            classify_stream_error(&overloaded),
            LlmError::Transient {
                status: Some(529),
                ..
            }
        ));
        let auth = serde_json::json!({"error":{"type":"authentication_error","message":"bad key"}});
        assert!(matches!(
            classify_stream_error(&auth),
            LlmError::Auth { status: 401, .. }
        ));
        let ctx = serde_json::json!({"error":{"message":"maximum context length is 4096","code":"context_length_exceeded"}});
        assert!(matches!(
            classify_stream_error(&ctx),
            LlmError::ContextLength { .. }
        ));
    }
}
