//! Keeping secrets out of everything ralph writes or sends: progress.txt, checkpoint commit
//! messages, the ledger, transcripts, state.json, the terminal, `--json`, `ralph log`/`show`/
//! `report`, notifications and the GitHub Actions outputs.
//!
//! One [`Redactor`] per process ([`current`]) replaces by [`REDACTED`]:
//! - the values (at least [`MIN_SECRET_LEN`] bytes) of the environment's secret-looking variables
//!   ([`is_secret_name`]: names containing KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL,
//!   PRIVATE, COOKIE or AUTH, but not AUTHOR);
//! - the same for the `.env` files of the repository's root (`.env`, `.env.local`, `.env.*`),
//!   plus any value there that looks generated (16+ characters mixing letters and digits, no
//!   spaces), since such a file is where a project keeps its keys;
//! - well-known token shapes wherever they come from (Anthropic/OpenAI `sk-…`, GitHub `ghp_…`
//!   and `github_pat_…`, GitLab `glpat-…`, Slack `xox?-…`, AWS `AKIA…`, Google `AIza…`, Hugging
//!   Face `hf_…`, Stripe `sk_live_…`, JWTs, PEM private key blocks);
//! - the password of a URL (`https://user:<redacted>@host`) and the credential of an
//!   `Authorization:` header.
//!
//! Each literal secret is matched as written, in its JSON-escaped form (so that a serialized
//! line, the ledger or a transcript, can be redacted as text), URL-encoded (`%2B`, `%2b`, with
//! and without `-._~` kept) and base64-encoded (standard and URL-safe alphabets, at each of the
//! three alignments a secret can have inside a longer encoded text: [`encoded_forms`]). A secret
//! split across two lines (a stream that wrapped it, two writes) is matched by its ends: a line
//! that ends with the secret's first [`MIN_FRAGMENT_LEN`]+ bytes, or starts with its last
//! ones, has that part redacted. The process-wide redactor is built
//! on first use from the environment and the repository around the working directory;
//! [`install`] builds it for a given repository root instead (`ralph run` does, once).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use regex::Regex;

/// Shortest value treated as a secret (shorter values, such as `1`, would redact common text).
pub const MIN_SECRET_LEN: usize = 8;

/// Shortest part of a secret split across two lines that is redacted on its own (shorter
/// parts, a few characters, would redact common line endings).
pub const MIN_FRAGMENT_LEN: usize = 6;

/// The text that replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// Whether an environment variable's name says it holds a secret: it contains KEY, TOKEN,
/// SECRET, PASSWORD, PASSWD, CREDENTIAL, PRIVATE, COOKIE or AUTH (case-insensitive), AUTHOR
/// excepted (`GIT_AUTHOR_NAME` is not a secret).
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase().replace("AUTHOR", "");
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
        "COOKIE",
        "AUTH",
    ]
    .iter()
    .any(|s| upper.contains(s))
}

/// Whether a `.env` value looks generated (a key, a token): at least 16 characters, no
/// whitespace, letters and digits both present. A `.env` file's `NODE_ENV=production` is not
/// redacted; its `STRIPE=sk9f8e7d6c5b4a3f2e1d` is.
fn looks_generated(value: &str) -> bool {
    value.len() >= 16
        && !value.chars().any(char::is_whitespace)
        && value.chars().any(|c| c.is_ascii_alphabetic())
        && value.chars().any(|c| c.is_ascii_digit())
        && !value.starts_with('/')
}

/// Whether a file's name says it holds secrets, so that ralph never commits it when git does
/// not already track it (docs/decisions.md, "Testers' findings"): `.env` and `.env.*` (but not
/// the templates `.env.example`, `.env.sample`, `.env.template`, `.env.dist`), private keys and
/// keystores (`*.pem`, `*.key`, `*.p12`, `*.pfx`, `*.jks`, `*.keystore`, `id_rsa`, `id_dsa`,
/// `id_ecdsa`, `id_ed25519` and their variants, `.pub` public keys excepted), and credential
/// files (`credentials`, `credentials.json`, `*credentials*.json`, `.netrc`, `.pgpass`,
/// `service-account*.json`). `path` is repository-relative with `/` separators; only its last
/// component is read.
pub fn is_secret_file(path: &str) -> bool {
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
        .to_ascii_lowercase();
    if name == ".env" {
        return true;
    }
    if let Some(suffix) = name.strip_prefix(".env.") {
        return !matches!(
            suffix,
            "example" | "sample" | "template" | "dist" | "defaults"
        );
    }
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    if matches!(ext, "pem" | "key" | "p12" | "pfx" | "jks" | "keystore") {
        return true;
    }
    if ["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"]
        .iter()
        .any(|k| name.starts_with(k))
    {
        return ext != "pub";
    }
    matches!(name.as_str(), "credentials" | ".netrc" | ".pgpass")
        || (ext == "json" && (name.contains("credentials") || name.starts_with("service-account")))
}

/// Well-known secret shapes, redacted wherever they appear.
const TOKEN_PATTERNS: &[&str] = &[
    r"\bsk-[A-Za-z0-9_\-]{16,}",
    r"\b[rs]k_(?:live|test)_[0-9A-Za-z]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bglpat-[A-Za-z0-9_\-]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_\-]{35}",
    r"\bhf_[A-Za-z0-9]{30,}",
    r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
];

/// Literals one of which every match of [`TOKEN_PATTERNS`] and [`KEEP_PREFIX_PATTERNS`] contains
/// (compared ASCII case-insensitively). A line holding none of them, nor a literal secret, is
/// returned as it is without running a regex: agent output is mostly such lines, and a flood of
/// it (gigabytes) must not cost a regex scan per byte.
const PREFILTER_LITERALS: &[&str] = &[
    "sk-",
    "sk_",
    "rk_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xox",
    "akia",
    "asia",
    "aiza",
    "hf_",
    "eyj",
    "private key-----",
    "://",
    "authorization",
];

/// Secrets that keep their surroundings (group `keep` before, `end` after): the password of
/// `scheme://user:password@`, and the credential after `Authorization: Bearer|Basic|Token`.
const KEEP_PREFIX_PATTERNS: &[&str] = &[
    r"(?i)(?P<keep>\b[a-z][a-z0-9+.\-]*://[^/\s:@]+:)[^\s@/]+(?P<end>@)",
    r#"(?i)(?P<keep>\bauthorization:\s*(?:bearer|basic|token)\s+)[^\s"',;]+(?P<end>)"#,
];

/// The text redactor (see the module docs). Cheap to share ([`current`] hands out an `Arc`).
#[derive(Debug)]
pub struct Redactor {
    /// The literal secrets (raw, JSON-escaped and encoded), longest first.
    secrets: Vec<String>,
    /// The raw secrets long enough to be matched by their ends across a line break
    /// (2 × [`MIN_FRAGMENT_LEN`] bytes or more).
    splittable: Vec<String>,
    /// Every [`MIN_FRAGMENT_LEN`]-byte window of the splittable secrets: (secret, offset).
    windows: std::collections::HashMap<Vec<u8>, Vec<(usize, usize)>>,
    /// The literal secrets and the token shapes, one alternation.
    whole: Option<Regex>,
    /// [`KEEP_PREFIX_PATTERNS`].
    keep_prefix: Vec<Regex>,
    /// [`PREFILTER_LITERALS`] and the literal secrets; `None` when it could not be built (then
    /// every text goes through the regexes).
    prefilter: Option<aho_corasick::AhoCorasick>,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(Vec::new())
    }
}

impl Redactor {
    /// A redactor for `secrets` (values shorter than [`MIN_SECRET_LEN`] are ignored) and the
    /// well-known token shapes.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut all: Vec<String> = Vec::new();
        let mut splittable: Vec<String> = Vec::new();
        for s in secrets {
            if s.len() < MIN_SECRET_LEN {
                continue;
            }
            if let Ok(json) = serde_json::to_string(&s) {
                let escaped = json[1..json.len() - 1].to_string();
                if escaped != s {
                    all.push(escaped);
                }
            }
            all.extend(encoded_forms(&s).into_iter().filter(|e| *e != s));
            if s.len() >= 2 * MIN_FRAGMENT_LEN {
                splittable.push(s.clone());
            }
            all.push(s);
        }
        all.sort_by_key(|v| std::cmp::Reverse(v.len()));
        all.dedup();
        splittable.sort_by_key(|v| std::cmp::Reverse(v.len()));
        splittable.dedup();
        let mut windows: std::collections::HashMap<Vec<u8>, Vec<(usize, usize)>> =
            std::collections::HashMap::new();
        for (i, secret) in splittable.iter().enumerate() {
            for (pos, w) in secret.as_bytes().windows(MIN_FRAGMENT_LEN).enumerate() {
                windows.entry(w.to_vec()).or_default().push((i, pos));
            }
        }
        let alternatives: Vec<String> = all
            .iter()
            .map(|s| regex::escape(s))
            .chain(TOKEN_PATTERNS.iter().map(|p| (*p).to_string()))
            .collect();
        // The literals are escaped and the shapes fixed: only a size beyond the limit can fail,
        // and then the shapes alone still apply.
        let whole = build(&alternatives.join("|")).or_else(|| build(&TOKEN_PATTERNS.join("|")));
        let prefilter = aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(
                PREFILTER_LITERALS
                    .iter()
                    .map(|l| l.as_bytes())
                    .chain(all.iter().map(|s| s.as_bytes())),
            )
            .ok();
        Redactor {
            prefilter,
            secrets: all,
            splittable,
            windows,
            whole,
            keep_prefix: KEEP_PREFIX_PATTERNS
                .iter()
                .filter_map(|p| build(p))
                .collect(),
        }
    }

    /// The redactor of the environment `vars` and the `.env` files of `root` (see the module
    /// docs). An unreadable `.env` file is skipped.
    pub fn from_sources(
        vars: impl IntoIterator<Item = (String, String)>,
        root: Option<&Path>,
    ) -> Redactor {
        let mut secrets: Vec<String> = vars
            .into_iter()
            .filter(|(k, v)| is_secret_name(k) && v.len() >= MIN_SECRET_LEN)
            .map(|(_, v)| v)
            .collect();
        if let Some(root) = root {
            for file in dotenv_files(root) {
                let Ok(text) = std::fs::read_to_string(&file) else {
                    continue;
                };
                secrets.extend(
                    parse_dotenv(&text)
                        .into_iter()
                        .filter(|(k, v)| {
                            v.len() >= MIN_SECRET_LEN && (is_secret_name(k) || looks_generated(v))
                        })
                        .map(|(_, v)| v),
                );
            }
        }
        Redactor::new(secrets)
    }

    /// The literal secrets this redactor knows (raw and JSON-escaped), longest first.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// `text` with every secret replaced by [`REDACTED`]; borrowed when nothing was found.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let out = self.redact_whole(text);
        if self.splittable.is_empty() {
            return out;
        }
        match self.redact_fragments(&out) {
            Some(s) => Cow::Owned(s),
            None => out,
        }
    }

    /// The ends of a secret split across a line break ([`MIN_FRAGMENT_LEN`]): every line that
    /// ends with a long enough first part of a secret, or starts with a long enough last part,
    /// has that part replaced. `None` when no line has one. The cost is two hash lookups per
    /// line, whatever the number of secrets.
    fn redact_fragments(&self, text: &str) -> Option<String> {
        let mut out: Option<String> = None;
        let mut done = 0;
        let mut offset = 0;
        for piece in text.split_inclusive('\n') {
            let line = piece.trim_end_matches(['\n', '\r']);
            let head = self.fragment_at_start(line);
            let tail = self.fragment_at_end(line);
            if head + tail > 0 && head + tail <= line.len() {
                let o = out.get_or_insert_with(String::new);
                o.push_str(&text[done..offset]);
                if head > 0 {
                    o.push_str(REDACTED);
                }
                o.push_str(&line[head..line.len() - tail]);
                if tail > 0 {
                    o.push_str(REDACTED);
                }
                done = offset + line.len();
            }
            offset += piece.len();
        }
        out.map(|mut o| {
            o.push_str(&text[done..]);
            o
        })
    }

    /// The length of the longest proper last part (at least [`MIN_FRAGMENT_LEN`] bytes) of a
    /// splittable secret that `line` starts with; 0 when none. One hash lookup of the line's
    /// first bytes, then a comparison per candidate.
    fn fragment_at_start(&self, line: &str) -> usize {
        let Some(key) = line.as_bytes().get(..MIN_FRAGMENT_LEN) else {
            return 0;
        };
        let mut best = 0;
        for &(i, pos) in self.windows.get(key).into_iter().flatten() {
            let rest = &self.splittable[i].as_bytes()[pos..];
            if pos > 0
                && rest.len() > best
                && line.as_bytes().starts_with(rest)
                && line.is_char_boundary(rest.len())
            {
                best = rest.len();
            }
        }
        best
    }

    /// The length of the longest proper first part (at least [`MIN_FRAGMENT_LEN`] bytes) of a
    /// splittable secret that `line` ends with; 0 when none (as [`Redactor::fragment_at_start`]).
    fn fragment_at_end(&self, line: &str) -> usize {
        let bytes = line.as_bytes();
        let Some(key) = bytes
            .len()
            .checked_sub(MIN_FRAGMENT_LEN)
            .and_then(|from| bytes.get(from..))
        else {
            return 0;
        };
        let mut best = 0;
        for &(i, pos) in self.windows.get(key).into_iter().flatten() {
            let secret = self.splittable[i].as_bytes();
            let first = &secret[..pos + MIN_FRAGMENT_LEN];
            if first.len() < secret.len()
                && first.len() > best
                && bytes.ends_with(first)
                && line.is_char_boundary(bytes.len() - first.len())
            {
                best = first.len();
            }
        }
        best
    }

    /// The whole-secret pass of [`Redactor::redact`]: the literals, the shapes and the kept
    /// prefixes.
    fn redact_whole<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if let Some(pre) = &self.prefilter {
            if !pre.is_match(text) {
                return Cow::Borrowed(text);
            }
        }
        let mut out = match &self.whole {
            Some(re) => re.replace_all(text, REDACTED),
            None => Cow::Borrowed(text),
        };
        let replacement = format!("${{keep}}{REDACTED}${{end}}");
        for re in &self.keep_prefix {
            let next = match re.replace_all(&out, replacement.as_str()) {
                Cow::Owned(s) => Some(s),
                Cow::Borrowed(_) => None,
            };
            if let Some(s) = next {
                out = Cow::Owned(s);
            }
        }
        out
    }

    /// [`Redactor::redact`] as an owned `String`.
    pub fn redact_string(&self, text: &str) -> String {
        self.redact(text).into_owned()
    }

    /// Redacts `text` where it is (no copy when nothing is found).
    pub fn redact_in_place(&self, text: &mut String) {
        let redacted = match self.redact(text) {
            Cow::Owned(r) => Some(r),
            Cow::Borrowed(_) => None,
        };
        if let Some(r) = redacted {
            *text = r;
        }
    }

    /// Redacts every string in `value` (object keys are left alone: they are field names).
    pub fn redact_value(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => self.redact_in_place(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.redact_value(v)),
            _ => {}
        }
    }
}

/// The files of a unified diff (as [`crate::git::Repo::patch`] writes it: `+++ b/<path>`
/// headers, added lines starting with `+`) whose added lines hold a secret `redactor` knows,
/// in the order found, each once. The diff is the repository's content: ralph cannot redact it,
/// only say that it holds one.
pub fn files_with_secrets(redactor: &Redactor, patch: &str) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    let mut current: Option<&str> = None;
    for line in patch.lines() {
        if let Some(path) = line.strip_prefix("+++ ") {
            current = Some(path.strip_prefix("b/").unwrap_or(path));
        } else if let Some(added) = line.strip_prefix('+') {
            if let (Some(file), Cow::Owned(_)) = (current, redactor.redact(added)) {
                if !files.iter().any(|f| f == file) {
                    files.push(file.to_string());
                }
            }
        }
    }
    files
}

/// The encoded forms of `secret` that are matched as literals beside it: URL-encoded (every
/// byte but letters and digits as `%XX`, and with `-._~` kept as RFC 3986 allows; upper- and
/// lower-case hex), and base64 in the standard and the URL-safe alphabets. A secret inside a
/// longer base64 text is encoded differently at each of the 3 byte alignments, so each
/// alignment gives the characters that depend on the secret's bytes alone (without the
/// characters shared with its neighbours); forms shorter than [`MIN_SECRET_LEN`] are left out.
pub fn encoded_forms(secret: &str) -> Vec<String> {
    use base64::Engine as _;
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    const UNRESERVED: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let mut forms = Vec::new();
    for set in [NON_ALPHANUMERIC, UNRESERVED] {
        let upper = utf8_percent_encode(secret, set).to_string();
        let lower = lowercase_escapes(&upper);
        forms.push(upper);
        forms.push(lower);
    }
    let bytes = secret.as_bytes();
    for shift in 0..3usize {
        let mut padded = vec![0u8; shift];
        padded.extend_from_slice(bytes);
        let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&padded);
        // Characters made only of the secret's bits: after the ones the filler touches, and up
        // to the last one whose 6 bits are all inside the text.
        let first = (shift * 8).div_ceil(6);
        let last = (padded.len() * 8) / 6;
        if let Some(core) = encoded.get(first..last) {
            forms.push(core.to_string());
            forms.push(core.replace('+', "-").replace('/', "_"));
        }
    }
    forms.retain(|f| f.len() >= MIN_SECRET_LEN);
    forms.sort();
    forms.dedup();
    forms
}

/// `text` with the hex digits of its `%XX` escapes in lower case.
fn lowercase_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut left = 0;
    for c in text.chars() {
        if c == '%' {
            left = 2;
            out.push(c);
        } else if left > 0 {
            left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `data` as JSON with every string redacted by [`current`], for a renderer that escapes text
/// (HTML) and so could split a secret if redacted afterwards. `Null` when `data` cannot be
/// serialized (plain data always can).
pub fn redacted_value(data: &impl serde::Serialize) -> serde_json::Value {
    let mut value = serde_json::to_value(data).unwrap_or(serde_json::Value::Null);
    current().redact_value(&mut value);
    value
}

fn build(pattern: &str) -> Option<Regex> {
    regex::RegexBuilder::new(pattern)
        .size_limit(64 << 20)
        .build()
        .ok()
}

/// The `.env` files of a directory: `.env` and `.env.*` (`.env.local`, `.env.production`, …).
fn dotenv_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            (name == ".env" || name.starts_with(".env.")) && e.path().is_file()
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// `NAME=value` pairs of a `.env` file: `export` prefixes, comments, blank lines and quotes
/// handled as dotenv tools do (no variable expansion).
pub fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = match value.chars().next() {
            Some(q @ ('"' | '\'')) => match value[1..].find(q) {
                Some(end) => &value[1..=end],
                None => &value[1..],
            },
            _ => value.split(" #").next().unwrap_or(value).trim_end(),
        };
        pairs.push((name.trim().to_string(), value.to_string()));
    }
    pairs
}

/// The repository root around `dir`: the nearest ancestor holding `.git`, else `dir`.
fn repo_root_of(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(".git").exists())
        .unwrap_or(dir)
        .to_path_buf()
}

static INSTALLED: RwLock<Option<Arc<Redactor>>> = RwLock::new(None);

/// Builds the process-wide redactor from the environment and the `.env` files of `root` (the
/// repository root) and makes it [`current`]. Called by `ralph run` once the repository is known.
pub fn install(root: &Path) -> Arc<Redactor> {
    let r = Arc::new(Redactor::from_sources(std::env::vars(), Some(root)));
    if let Ok(mut slot) = INSTALLED.write() {
        *slot = Some(r.clone());
    }
    r
}

/// The process-wide redactor: the one [`install`] built, else one built (once) from the
/// environment and the `.env` files of the repository around the working directory.
pub fn current() -> Arc<Redactor> {
    if let Some(r) = INSTALLED.read().ok().and_then(|s| s.clone()) {
        return r;
    }
    static LAZY: OnceLock<Arc<Redactor>> = OnceLock::new();
    LAZY.get_or_init(|| {
        let root = std::env::current_dir().ok().map(|d| repo_root_of(&d));
        Arc::new(Redactor::from_sources(std::env::vars(), root.as_deref()))
    })
    .clone()
}

/// The literal secrets of [`current`] (the environment's and the `.env` files'), longest first.
pub fn env_secrets() -> Vec<String> {
    current().secrets().to_vec()
}

/// `text` redacted by the process-wide redactor ([`current`]).
pub fn redact_env(text: &str) -> String {
    current().redact_string(text)
}

/// `text` with every occurrence of each of `secrets`, and every well-known token shape,
/// replaced by [`REDACTED`].
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    current().redact_string(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_and_names_decide() {
        assert!(is_secret_name("OPENAI_API_KEY"));
        assert!(is_secret_name("github_token"));
        assert!(is_secret_name("SSH_AUTH_SOCK"));
        assert!(!is_secret_name("HOME"));
        assert!(!is_secret_name("GIT_AUTHOR_NAME"));
        let secrets = vec!["live-123456789".to_string()];
        assert_eq!(
            redact("auth failed for live-123456789 (x)", &secrets),
            "auth failed for <redacted> (x)"
        );
        assert_eq!(redact("nothing here", &secrets), "nothing here");
    }

    #[test]
    fn env_values_and_their_json_form_are_redacted() {
        let r = Redactor::from_sources(
            [
                (
                    "MY_API_KEY".to_string(),
                    "abc\"quoted\"-value-1".to_string(),
                ),
                ("HOME".to_string(), "/home/someone".to_string()),
                ("SHORT_TOKEN".to_string(), "1234".to_string()),
            ],
            None,
        );
        assert_eq!(r.redact("key abc\"quoted\"-value-1 !"), "key <redacted> !");
        let json = serde_json::to_string("said abc\"quoted\"-value-1").unwrap();
        assert_eq!(r.redact(&json), "\"said <redacted>\"");
        assert_eq!(r.redact("/home/someone 1234"), "/home/someone 1234");
        assert!(matches!(r.redact("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn dotenv_values_are_redacted_by_name_or_shape() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".env"),
            "# keys\nexport SERVICE_PASSWORD='hunter2hunter2'\nNODE_ENV=production\n\
             PLAIN_ID=q7w8e9r0t1y2u3i4o5p6 # generated\nQUOTED=\"has spaces in it 123456\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".env.local"), "DB_TOKEN=zzzzzzzzzzzz\n").unwrap();
        let r = Redactor::from_sources(Vec::new(), Some(dir.path()));
        let text = "hunter2hunter2 production q7w8e9r0t1y2u3i4o5p6 zzzzzzzzzzzz has spaces";
        assert_eq!(
            r.redact(text),
            "<redacted> production <redacted> <redacted> has spaces"
        );
    }

    #[test]
    fn well_known_shapes_and_url_credentials_are_redacted_without_being_configured() {
        let r = Redactor::default();
        for (input, want) in [
            (
                "error: invalid x-api-key sk-ant-api03-AbCdEf0123456789xyz end",
                "error: invalid x-api-key <redacted> end",
            ),
            (
                "token ghp_0123456789abcdefABCDEF0123 ok",
                "token <redacted> ok",
            ),
            ("AKIAABCDEFGHIJKLMNOP", "<redacted>"),
            (
                "fatal: https://bot:s3cr3tpass@github.com/o/r.git",
                "fatal: https://bot:<redacted>@github.com/o/r.git",
            ),
            (
                "Authorization: Bearer abcdef.ghijkl",
                "Authorization: Bearer <redacted>",
            ),
            (
                "ask the task-runner about risk-free sk-1",
                "ask the task-runner about risk-free sk-1",
            ),
            ("sk_live_0123456789abcdefABCD", "<redacted>"),
            ("rk_test_0123456789abcdefABCD", "<redacted>"),
            ("github_pat_0123456789abcdefABCDEF_xyz", "<redacted>"),
            ("glpat-0123456789abcdefABCDEF", "<redacted>"),
            ("xoxb-0123456789-abcdef", "<redacted>"),
            ("ASIAABCDEFGHIJKLMNOP", "<redacted>"),
            ("AIzaSyA0123456789abcdefghijklmnopqrstuv", "<redacted>"),
            ("hf_0123456789abcdefghijklmnopqrstuvwxyz", "<redacted>"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
                "<redacted>",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----",
                "<redacted>",
            ),
            (
                "AUTHORIZATION: token abcdef0123",
                "AUTHORIZATION: token <redacted>",
            ),
        ] {
            assert_eq!(r.redact(input), want, "{input}");
        }
    }

    #[test]
    fn encoded_and_split_forms_of_a_known_secret_are_redacted() {
        use base64::Engine as _;
        let secret = "p@ss/word+Key=42~x";
        let r = Redactor::new([secret.to_string()]);
        // URL-encoded, both hex cases, with and without the unreserved characters kept.
        for encoded in [
            "p%40ss%2Fword%2BKey%3D42~x",
            "p%40ss%2fword%2bkey%3d42~x".replace("key", "Key").as_str(),
            "p%40ss%2Fword%2BKey%3D42%7Ex",
        ] {
            let line = format!("GET /login?pw={encoded}&next=1");
            assert_eq!(
                r.redact(&line),
                "GET /login?pw=<redacted>&next=1",
                "{encoded}"
            );
        }
        // base64 at every alignment inside a longer encoded text, in both alphabets.
        for prefix in ["", "a", "ab", "abc", "user:"] {
            let plain = format!("{prefix}{secret} trailing");
            for engine in [
                base64::engine::general_purpose::STANDARD,
                base64::engine::general_purpose::URL_SAFE,
            ] {
                let encoded = engine.encode(plain.as_bytes());
                let line = format!("Authorization-ish {encoded} end");
                let out = r.redact(&line);
                assert!(out.contains(REDACTED), "{prefix:?} {encoded}: {out}");
                // What is left decodes to no more than a few bytes of the secret.
                assert!(!out.contains(&encoded), "{out}");
            }
        }
        // Split across two lines, at any point that leaves both parts long enough.
        let long = "acme-env-key-7f3a9c2e";
        let r = Redactor::new([long.to_string()]);
        for cut in MIN_FRAGMENT_LEN..=long.len() - MIN_FRAGMENT_LEN {
            let text = format!("key: {}\n{} ok\n", &long[..cut], &long[cut..]);
            assert_eq!(
                r.redact(&text),
                "key: <redacted>\n<redacted> ok\n",
                "cut {cut}"
            );
        }
        // A line ending with a few common characters of it is left alone.
        assert!(matches!(r.redact("the acme\nnothing"), Cow::Borrowed(_)));
    }

    #[test]
    fn text_with_no_secret_literal_is_returned_without_a_copy() {
        let r = Redactor::new(["Sup3rSecretValue".to_string()]);
        let chatter = "some agent chatter that is not JSON, over and over ".repeat(20);
        assert!(matches!(r.redact(&chatter), Cow::Borrowed(_)));
        // A configured secret is found whatever the line around it.
        assert_eq!(r.redact("x Sup3rSecretValue y"), format!("x {REDACTED} y"));
    }
}
