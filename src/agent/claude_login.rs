//! What ralph does with `ANTHROPIC_API_KEY` for claude, and why ([`ApiKey::decide`]).
//!
//! With the key in its environment, `claude -p` always bills that key, even when the user is
//! logged in with a subscription (`notes/agent-protocols.md` §0.9): a night's run would quietly
//! move to pay-per-token billing. So ralph removes the key, but only when that cannot break the
//! run:
//!
//! | situation | the key is |
//! |---|---|
//! | `--keep-api-key` (or `keep_api_key = true`, `RALPH_KEEP_API_KEY=1`) | kept |
//! | `ANTHROPIC_BASE_URL` or `ANTHROPIC_AUTH_TOKEN` is set (a gateway, a proxy, a local model) | kept |
//! | claude has no stored login | kept: it is how claude authenticates |
//! | claude has a stored login | **removed**, with a one-line notice ([`ApiKey::notice`]) |
//!
//! A stored login is looked for in files only, offline, where Claude Code keeps it (read from
//! the 2.1.332 binary): `CLAUDE_CODE_OAUTH_TOKEN` (a `claude setup-token` token) in the
//! environment; `<dir>/.credentials.json` holding `claudeAiOauth`, `<dir>` being
//! `$CLAUDE_SECURESTORAGE_CONFIG_DIR`, else `$CLAUDE_CONFIG_DIR`, else `~/.claude`; the global
//! config `$CLAUDE_CONFIG_DIR/.claude.json` (else `~/.claude.json`), or the legacy
//! `<config dir>/.config.json`, holding `oauthAccount` (a claude.ai login) or `primaryApiKey` (a
//! Console login's stored key). The macOS keychain is not looked at: there a login found by
//! none of these keeps the key.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The variable ralph may remove from claude's environment.
pub const API_KEY_VAR: &str = "ANTHROPIC_API_KEY";

/// Why the key stays in claude's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptBecause {
    /// `--keep-api-key`, `keep_api_key = true` or `RALPH_KEEP_API_KEY`.
    Asked,
    /// `ANTHROPIC_BASE_URL` is set: the key belongs to that endpoint.
    BaseUrl,
    /// `ANTHROPIC_AUTH_TOKEN` is set: claude authenticates against a gateway.
    AuthToken,
    /// claude has no stored login: the key is how it authenticates.
    NoLogin,
}

/// What ralph does with `ANTHROPIC_API_KEY` for the claude it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiKey {
    /// The key is not set: nothing to do.
    Unset,
    /// The key stays in claude's environment.
    Kept(KeptBecause),
    /// The key is removed: claude has a login of its own, `login` (where it was found).
    Removed {
        /// Where the login was found, e.g. `/home/u/.claude/.credentials.json`.
        login: String,
    },
}

impl ApiKey {
    /// The decision for this process's environment and files.
    pub fn from_env(keep: bool) -> ApiKey {
        ApiKey::decide(keep, &|var| std::env::var(var).ok())
    }

    /// The decision, with `env` answering for environment variables (blank counts as unset)
    /// and `keep` for `--keep-api-key`. Reads only files (see the module docs).
    pub fn decide(keep: bool, env: &dyn Fn(&str) -> Option<String>) -> ApiKey {
        let set = |var: &str| env(var).filter(|v| !v.trim().is_empty());
        if set(API_KEY_VAR).is_none() {
            return ApiKey::Unset;
        }
        if keep {
            return ApiKey::Kept(KeptBecause::Asked);
        }
        if set("ANTHROPIC_BASE_URL").is_some() {
            return ApiKey::Kept(KeptBecause::BaseUrl);
        }
        if set("ANTHROPIC_AUTH_TOKEN").is_some() {
            return ApiKey::Kept(KeptBecause::AuthToken);
        }
        match stored_login(env) {
            Some(login) => ApiKey::Removed { login },
            None => ApiKey::Kept(KeptBecause::NoLogin),
        }
    }

    /// Whether the key is removed from claude's environment.
    pub fn removed(&self) -> bool {
        matches!(self, ApiKey::Removed { .. })
    }

    /// The one-line notice for a run that removes the key, `None` otherwise.
    pub fn notice(&self) -> Option<String> {
        match self {
            ApiKey::Removed { login } => Some(format!(
                "ANTHROPIC_API_KEY is not passed to claude: claude has a login of its own ({login}) and uses it instead of billing the key; pass --keep-api-key to use the key"
            )),
            _ => None,
        }
    }

    /// The hint added to an auth error when the key was removed.
    pub fn auth_hint(&self) -> Option<&'static str> {
        self.removed().then_some(
            "hint: ralph removed ANTHROPIC_API_KEY from claude's environment because claude has a login of its own; if that login is what failed, run with --keep-api-key to authenticate with the key",
        )
    }

    /// What `ralph doctor` says about the key: which case applies.
    pub fn describe(&self) -> String {
        match self {
            ApiKey::Unset => {
                "ANTHROPIC_API_KEY: not set; claude authenticates with its own login".to_owned()
            }
            ApiKey::Kept(KeptBecause::Asked) => {
                "ANTHROPIC_API_KEY: kept for claude (--keep-api-key / keep_api_key): claude bills the API key".to_owned()
            }
            ApiKey::Kept(KeptBecause::BaseUrl) => {
                "ANTHROPIC_API_KEY: kept for claude, because ANTHROPIC_BASE_URL is set (the key belongs to that endpoint)".to_owned()
            }
            ApiKey::Kept(KeptBecause::AuthToken) => {
                "ANTHROPIC_API_KEY: kept for claude, because ANTHROPIC_AUTH_TOKEN is set (a gateway)".to_owned()
            }
            ApiKey::Kept(KeptBecause::NoLogin) => {
                "ANTHROPIC_API_KEY: kept for claude, because claude has no stored login (no .credentials.json with claudeAiOauth, no oauthAccount in .claude.json): the key is how it authenticates, and it is billed".to_owned()
            }
            ApiKey::Removed { login } => format!(
                "ANTHROPIC_API_KEY: removed for claude, because claude has a login of its own ({login}), which it uses instead of billing the key; --keep-api-key keeps the key"
            ),
        }
    }
}

/// Where claude keeps a login, when it has one (see the module docs): a description naming the
/// variable or file.
pub fn stored_login(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let set = |var: &str| env(var).filter(|v| !v.trim().is_empty());
    if set("CLAUDE_CODE_OAUTH_TOKEN").is_some() {
        return Some("CLAUDE_CODE_OAUTH_TOKEN is set".to_owned());
    }
    let home = set("HOME").map(PathBuf::from);
    let config_dir = set("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".claude")))?;
    let secure_dir = set("CLAUDE_SECURESTORAGE_CONFIG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| config_dir.clone());
    let credentials = secure_dir.join(".credentials.json");
    if json_has(&credentials, &["claudeAiOauth"]) {
        return Some(credentials.display().to_string());
    }
    let global = match set("CLAUDE_CONFIG_DIR") {
        Some(dir) => PathBuf::from(dir).join(".claude.json"),
        None => home?.join(".claude.json"),
    };
    [global, config_dir.join(".config.json")]
        .into_iter()
        .find(|file| json_has(file, &["oauthAccount", "primaryApiKey"]))
        .map(|file| file.display().to_string())
}

/// Whether `file` is a JSON object holding one of `keys` with a value that is not null, `{}`
/// or `""`.
fn json_has(file: &Path, keys: &[&str]) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    keys.iter().any(|k| match map.get(*k) {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(_) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn decide(keep: bool, vars: &[(&str, &str)]) -> ApiKey {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ApiKey::decide(keep, &|k| vars.get(k).cloned())
    }

    #[test]
    fn the_key_is_removed_only_when_claude_has_a_login_of_its_own() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().to_str().unwrap();
        let key = ("ANTHROPIC_API_KEY", "sk-ant-api03-x");

        assert_eq!(decide(false, &[("HOME", h)]), ApiKey::Unset);
        // No login anywhere: the key is how claude authenticates.
        assert_eq!(
            decide(false, &[("HOME", h), key]),
            ApiKey::Kept(KeptBecause::NoLogin)
        );

        // A login in ~/.claude/.credentials.json: removed, with a notice naming the file.
        std::fs::create_dir_all(home.path().join(".claude")).unwrap();
        let creds = home.path().join(".claude/.credentials.json");
        std::fs::write(
            &creds,
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x","refreshToken":"r","expiresAt":1796000000000,"scopes":["user:inference"],"subscriptionType":"max"}}"#,
        )
        .unwrap();
        let removed = decide(false, &[("HOME", h), key]);
        assert_eq!(
            removed,
            ApiKey::Removed {
                login: creds.display().to_string()
            }
        );
        assert!(removed.notice().unwrap().contains("--keep-api-key"));
        assert!(removed.auth_hint().unwrap().contains("--keep-api-key"));

        // Kept whenever the key has another purpose, or the user asked.
        assert_eq!(
            decide(true, &[("HOME", h), key]),
            ApiKey::Kept(KeptBecause::Asked)
        );
        assert_eq!(
            decide(
                false,
                &[
                    ("HOME", h),
                    key,
                    ("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080")
                ]
            ),
            ApiKey::Kept(KeptBecause::BaseUrl)
        );
        assert_eq!(
            decide(false, &[("HOME", h), key, ("ANTHROPIC_AUTH_TOKEN", "t")]),
            ApiKey::Kept(KeptBecause::AuthToken)
        );
        for kept in [
            ApiKey::Unset,
            ApiKey::Kept(KeptBecause::NoLogin),
            ApiKey::Kept(KeptBecause::BaseUrl),
        ] {
            assert_eq!(kept.notice(), None);
            assert_eq!(kept.auth_hint(), None);
        }

        // A logged-out credentials file (no claudeAiOauth) is no login.
        std::fs::write(&creds, r#"{"mcpOAuth":{"srv":{"accessToken":"x"}}}"#).unwrap();
        assert_eq!(
            decide(false, &[("HOME", h), key]),
            ApiKey::Kept(KeptBecause::NoLogin)
        );
    }

    #[test]
    fn logins_in_the_global_config_token_and_config_dir() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().to_str().unwrap();
        let key = ("ANTHROPIC_API_KEY", "sk-ant-api03-x");
        std::fs::write(
            home.path().join(".claude.json"),
            r#"{"numStartups":3,"oauthAccount":{"accountUuid":"a","emailAddress":"u@example.com","organizationUuid":"o"}}"#,
        )
        .unwrap();
        assert!(decide(false, &[("HOME", h), key]).removed());
        std::fs::write(home.path().join(".claude.json"), r#"{"numStartups":3}"#).unwrap();
        assert!(!decide(false, &[("HOME", h), key]).removed());
        std::fs::write(home.path().join(".claude.json"), "not json").unwrap();
        assert!(!decide(false, &[("HOME", h), key]).removed());

        assert!(decide(
            false,
            &[
                ("HOME", h),
                key,
                ("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-x")
            ]
        )
        .removed());

        // CLAUDE_CONFIG_DIR moves both files.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        std::fs::write(
            dir.path().join(".claude.json"),
            r#"{"primaryApiKey":"sk-ant-api03-stored"}"#,
        )
        .unwrap();
        assert!(decide(false, &[("HOME", h), key, ("CLAUDE_CONFIG_DIR", d)]).removed());
        std::fs::remove_file(dir.path().join(".claude.json")).unwrap();
        std::fs::write(
            dir.path().join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"x"}}"#,
        )
        .unwrap();
        assert!(decide(false, &[("HOME", h), key, ("CLAUDE_CONFIG_DIR", d)]).removed());
    }
}
