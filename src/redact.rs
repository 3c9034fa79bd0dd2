//! Keeping secrets out of what ralph records: the values of secret-looking environment variables
//! (names containing KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL or AUTH) are replaced by
//! `<redacted>` in command output that goes into the ledger, the terminal and reports.

/// Shortest value treated as a secret (shorter values, such as `1`, would redact common text).
pub const MIN_SECRET_LEN: usize = 8;

/// The text that replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// Whether an environment variable's name says it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
    ]
    .iter()
    .any(|s| upper.contains(s))
}

/// The values of this process's secret-looking environment variables (at least
/// [`MIN_SECRET_LEN`] bytes), longest first.
pub fn env_secrets() -> Vec<String> {
    let mut values: Vec<String> = std::env::vars()
        .filter(|(k, v)| is_secret_name(k) && v.len() >= MIN_SECRET_LEN)
        .map(|(_, v)| v)
        .collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values.dedup();
    values
}

/// [`env_secrets`] read once per process (the environment of a run does not change).
pub fn env_secrets_cached() -> &'static [String] {
    static SECRETS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SECRETS.get_or_init(env_secrets)
}

/// `text` with the values of this process's secret-looking environment variables redacted.
pub fn redact_env(text: &str) -> String {
    redact(text, env_secrets_cached())
}

/// `text` with every occurrence of each of `secrets` replaced by [`REDACTED`].
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_and_names_decide() {
        assert!(is_secret_name("OPENAI_API_KEY"));
        assert!(is_secret_name("github_token"));
        assert!(!is_secret_name("HOME"));
        let secrets = vec!["sk-live-123456789".to_string()];
        assert_eq!(
            redact("auth failed for sk-live-123456789 (x)", &secrets),
            "auth failed for <redacted> (x)"
        );
        assert_eq!(redact("nothing here", &secrets), "nothing here");
    }
}
