//! HTTP transport shared by the two clients: TLS set-up, the `reqwest` client, sending a JSON
//! POST, turning transport failures into [`LlmError`]s, reading an SSE body as events, and
//! keeping the API key out of error text.
//!
//! Both clients go through here so that a dropped connection, a timeout or a broken stream
//! is classified the same way for both APIs (always `Transient`, see [`super::retry`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use eventsource_stream::{Event, EventStreamError, Eventsource as _};
use futures_util::{Stream, StreamExt as _};
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use serde_json::Value;

use super::{LlmError, ProviderConfig};

/// Installs rustls' `ring` crypto provider as the process default, once. The crate enables
/// reqwest's `rustls-no-provider` (ring builds much faster than aws-lc-rs), and reqwest panics
/// when it builds a client with no provider installed. A second call, or a provider some other
/// part of the process installed first, is fine: the error only says one is already there.
pub(crate) fn init_tls() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the HTTP client for `config`: the whole-request timeout, no automatic redirects (a
/// POST silently turned into a GET would hide a wrong base URL), and the system proxy settings.
///
/// # Errors
/// `BadRequest` with status 0 when the base URL does not parse or the client cannot be built.
pub(crate) fn build_http(config: &ProviderConfig) -> Result<reqwest::Client, LlmError> {
    init_tls();
    reqwest::Url::parse(&config.base_url).map_err(|e| LlmError::BadRequest {
        status: 0,
        message: format!(
            "base URL `{}` is not a valid URL ({e}); set it like `http://127.0.0.1:8080/v1`",
            config.base_url
        ),
    })?;
    reqwest::Client::builder()
        .timeout(config.request_timeout)
        .connect_timeout(
            config
                .request_timeout
                .min(std::time::Duration::from_secs(30)),
        )
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| LlmError::BadRequest {
            status: 0,
            message: format!("could not build the HTTP client: {}", chain(&e)),
        })
}

/// POSTs through `post(stream)`, streaming when `want_stream` is on and the server has not
/// refused streaming before (`no_stream`). A server that says it cannot stream is remembered and
/// asked again without streaming. Returns the 2xx response, body unread.
///
/// # Errors
/// The refusal, classified by [`super::retry::classify_http`]; errors from `post`.
pub(crate) async fn post_with_fallback<F, Fut>(
    no_stream: &std::sync::atomic::AtomicBool,
    want_stream: bool,
    url: &str,
    mut post: F,
) -> Result<reqwest::Response, LlmError>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<Answer, LlmError>>,
{
    use std::sync::atomic::Ordering;
    let stream = want_stream && !no_stream.load(Ordering::Relaxed);
    let refused = match post(stream).await? {
        Answer::Ok(response) => return Ok(response),
        Answer::Refused { status, body, .. }
            if stream && says_stream_unsupported(status, &body) =>
        {
            no_stream.store(true, Ordering::Relaxed);
            tracing::warn!(
                url = %url,
                "the server refused a streaming request; using non-streaming requests"
            );
            match post(false).await? {
                Answer::Ok(response) => return Ok(response),
                refused => refused,
            }
        }
        refused => refused,
    };
    match refused {
        Answer::Refused {
            status,
            headers,
            body,
        } => Err(super::retry::classify_http(status, &headers, &body)),
        Answer::Ok(response) => Ok(response),
    }
}

/// What the server answered to a POST.
pub(crate) enum Answer {
    /// A 2xx response, body not yet read.
    Ok(reqwest::Response),
    /// Any other status, with its headers and body text, for classification.
    Refused {
        /// HTTP status.
        status: u16,
        /// Response headers (`retry-after`…).
        headers: HeaderMap,
        /// Body text (lossy UTF-8).
        body: String,
    },
}

/// POSTs `body` as JSON to `url` with `headers`.
///
/// # Errors
/// `Transient` when the connection fails or times out before an answer.
pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &Value,
) -> Result<Answer, LlmError> {
    let response = client
        .post(url)
        .headers(headers)
        .json(body)
        .send()
        .await
        .map_err(|e| transport_error(&e))?;
    let status = response.status();
    if status.is_success() {
        return Ok(Answer::Ok(response));
    }
    let headers = response.headers().clone();
    let body = response.text().await.map_err(|e| transport_error(&e))?;
    Ok(Answer::Refused {
        status: status.as_u16(),
        headers,
        body,
    })
}

/// Whether a 2xx response is an SSE stream (as opposed to one JSON body, which some servers
/// send even when asked to stream).
pub(crate) fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

/// Reads a whole response body as JSON.
///
/// # Errors
/// `Transient` when the body breaks off; `Decode` when it is not JSON.
pub(crate) async fn read_json(response: reqwest::Response) -> Result<Value, LlmError> {
    let bytes = response.bytes().await.map_err(|e| transport_error(&e))?;
    serde_json::from_slice(&bytes).map_err(|e| LlmError::Decode {
        message: format!(
            "the response body is not JSON ({e}): {}",
            super::retry::error_message(200, &String::from_utf8_lossy(&bytes))
        ),
    })
}

/// The SSE events of a streaming response, in order.
///
/// A transport failure mid-body is `Transient` ("the stream broke"); bytes that are not
/// UTF-8 or not SSE are `Decode`.
pub(crate) fn events(
    response: reqwest::Response,
) -> impl Stream<Item = Result<Event, LlmError>> + Unpin {
    response.bytes_stream().eventsource().map(|item| {
        item.map_err(|e| match e {
            EventStreamError::Transport(e) => LlmError::Transient {
                status: None,
                message: format!("the stream broke off: {}", chain(&e)),
                retry_after: None,
            },
            EventStreamError::Utf8(e) => LlmError::Decode {
                message: format!("the stream is not UTF-8: {e}"),
            },
            EventStreamError::Parser(e) => LlmError::Decode {
                message: format!("the stream is not server-sent events: {e}"),
            },
        })
    })
}

/// The `Transient` error for a stream that ended before its terminal event.
pub(crate) fn stream_dropped(what: &str) -> LlmError {
    LlmError::Transient {
        status: None,
        message: format!("stream dropped: the response ended before {what}"),
        retry_after: None,
    }
}

/// Classifies a `reqwest` failure: everything on the wire (connect, timeout, a body cut off)
/// is `Transient`; a request that could not even be built is `BadRequest` (status 0).
pub(crate) fn transport_error(e: &reqwest::Error) -> LlmError {
    if e.is_builder() {
        return LlmError::BadRequest {
            status: 0,
            message: format!("could not build the request: {}", chain(e)),
        };
    }
    let what = if e.is_timeout() {
        "the request timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the response broke off"
    } else {
        "the connection failed"
    };
    LlmError::Transient {
        status: None,
        message: format!("{what}: {}", chain(e)),
        retry_after: None,
    }
}

/// An error and its sources, joined with `: ` (reqwest's own text hides the cause).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Whether a 400 answer to a streaming request says the server cannot stream (then the
/// clients retry once without `stream`, and stop asking for it).
pub(crate) fn says_stream_unsupported(status: u16, body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    status == 400
        && lower.contains("stream")
        && [
            "not supported",
            "unsupported",
            "not support",
            "not available",
            "not allowed",
        ]
        .iter()
        .any(|m| lower.contains(m))
}

/// `error` with every occurrence of `secret` replaced by `<redacted>`, so an API key that a
/// server echoes back never reaches a log, the ledger or the model.
pub(crate) fn redact(error: LlmError, secret: Option<&str>) -> LlmError {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return error;
    };
    let scrub = |m: String| m.replace(secret, "<redacted>");
    match error {
        LlmError::Auth { status, message } => LlmError::Auth {
            status,
            message: scrub(message),
        },
        LlmError::Quota { message } => LlmError::Quota {
            message: scrub(message),
        },
        LlmError::ContextLength { message } => LlmError::ContextLength {
            message: scrub(message),
        },
        LlmError::BadRequest { status, message } => LlmError::BadRequest {
            status,
            message: scrub(message),
        },
        LlmError::Transient {
            status,
            message,
            retry_after,
        } => LlmError::Transient {
            status,
            message: scrub(message),
            retry_after,
        },
        LlmError::Decode { message } => LlmError::Decode {
            message: scrub(message),
        },
    }
}

/// A counter for ids ralph makes up (`json-<n>`, `call-<n>`), shared by clones of a client so
/// ids stay unique within a conversation.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdCounter(Arc<AtomicU64>);

impl IdCounter {
    /// The next number, starting at 1.
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Parses tool-call arguments as they arrive on the wire: an object is kept, a JSON string
/// holding an object is parsed, an empty string or `null` is `{}`, and anything else is kept
/// as `{"_raw": "<text>"}` so the loop can tell the model its arguments were not valid JSON.
pub(crate) fn parse_arguments(raw: &Value) -> Value {
    match raw {
        Value::Object(_) => raw.clone(),
        Value::Null => Value::Object(Default::default()),
        Value::String(text) => parse_argument_text(text),
        other => serde_json::json!({ "_raw": other.to_string() }),
    }
}

/// [`parse_arguments`] for arguments given as text.
pub(crate) fn parse_argument_text(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Default::default());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => v,
        // Some servers double-encode: a JSON string that itself holds the object.
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => v,
            _ => serde_json::json!({ "_raw": text }),
        },
        _ => serde_json::json!({ "_raw": text }),
    }
}

/// The wire text of arguments ralph sends back: the raw text for arguments that were not
/// valid JSON (the assistant message goes back as received), else the JSON.
pub(crate) fn argument_text(arguments: &Value) -> String {
    if let Some(map) = arguments.as_object() {
        if map.len() == 1 {
            if let Some(raw) = map.get("_raw").and_then(Value::as_str) {
                return raw.to_string();
            }
        }
    }
    arguments.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_parsed_leniently() {
        assert_eq!(parse_arguments(&json!({"a": 1})), json!({"a": 1}));
        assert_eq!(parse_arguments(&json!("{\"a\":1}")), json!({"a": 1}));
        assert_eq!(parse_arguments(&json!("")), json!({}));
        assert_eq!(parse_arguments(&Value::Null), json!({}));
        assert_eq!(
            parse_arguments(&json!("\"{\\\"a\\\":1}\"")),
            json!({"a": 1})
        );
        assert_eq!(
            parse_arguments(&json!("{\"a\":")),
            json!({"_raw": "{\"a\":"})
        );
        assert_eq!(argument_text(&json!({"_raw": "{\"a\":"})), "{\"a\":");
        assert_eq!(argument_text(&json!({"a": 1})), "{\"a\":1}");
    }

    #[test]
    fn secrets_are_scrubbed_from_every_variant() {
        let e = LlmError::Auth {
            status: 401,
            message: "Incorrect API key provided: sk-secret".into(),
        };
        let e = redact(e, Some("sk-secret"));
        assert!(!e.to_string().contains("sk-secret"), "{e}");
        assert!(e.to_string().contains("<redacted>"));
    }

    #[test]
    fn stream_unsupported_needs_a_400_that_says_so() {
        assert!(says_stream_unsupported(
            400,
            r#"{"error":{"message":"Streaming is not supported for this model"}}"#
        ));
        assert!(says_stream_unsupported(
            400,
            "stream: unsupported parameter"
        ));
        assert!(!says_stream_unsupported(400, "max_tokens is too large"));
        assert!(!says_stream_unsupported(500, "streaming not supported"));
    }
}
