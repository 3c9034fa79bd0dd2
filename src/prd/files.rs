//! File names in a PRD's text: which words of a story name a file (`hello.py`, `src/app.js`,
//! `README`). Used by the compact prompt (`crate::prompt::story_files`) and the linter
//! (a criterion that names a file is checkable).

/// File extensions [`file_word`] takes as naming a file (a dotted name with another ending,
/// such as `mathutil.add` or `0.1.0`, is code or a version, not a file).
pub const FILE_EXTENSIONS: &[&str] = &[
    "py", "pyi", "rs", "js", "mjs", "cjs", "ts", "tsx", "jsx", "json", "toml", "yaml", "yml", "md",
    "rst", "txt", "sh", "bash", "zsh", "c", "h", "cc", "cpp", "hpp", "go", "rb", "java", "kt",
    "swift", "php", "pl", "lua", "r", "html", "htm", "css", "scss", "csv", "tsv", "cfg", "ini",
    "conf", "xml", "sql", "lock", "gradle", "ipynb", "vue", "svelte", "dart", "scala", "ex", "exs",
    "hs", "ml", "zig", "tex", "bat", "ps1", "mk", "cmake", "proto", "svg", "log", "env", "tf",
];

/// File names without an extension that [`file_word`] knows.
pub const BARE_FILE_NAMES: &[&str] = &[
    "README",
    "VERSION",
    "LICENSE",
    "CHANGELOG",
    "NOTICE",
    "AUTHORS",
    "CONTRIBUTORS",
    "TODO",
    "Makefile",
    "Dockerfile",
    "Procfile",
    "Gemfile",
    "Rakefile",
    "Justfile",
    ".gitignore",
    ".dockerignore",
    ".editorconfig",
    ".env",
];

/// `word` as a relative file path, if it looks like one: without quotes, backticks, a leading
/// `./` or sentence punctuation; its last part has a known file extension ([`FILE_EXTENSIONS`])
/// or is a well-known bare file name ([`BARE_FILE_NAMES`]); absolute paths, `..`, URLs,
/// options and words with shell syntax give `None`.
pub fn file_word(word: &str) -> Option<String> {
    let word = word
        .trim_start_matches(['"', '\'', '(', '[', '{', '<'])
        .trim_end_matches(['"', '\'', ')', ']', '}', '>', ',', ';', ':', '!', '?', '.']);
    let word = word.strip_prefix("./").unwrap_or(word);
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if word.is_empty() || !plain || word.starts_with(['/', '-']) || word.ends_with('/') {
        return None;
    }
    if word.split('/').any(|part| part.is_empty() || part == "..") {
        return None;
    }
    let name = word.rsplit('/').next().unwrap_or(word);
    let known_ext = name
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && FILE_EXTENSIONS.contains(&ext));
    (known_ext || BARE_FILE_NAMES.contains(&name)).then(|| word.to_string())
}

/// Whether `text` names a file: one of its words (split on whitespace and backticks) is a
/// [`file_word`].
pub fn names_a_file(text: &str) -> bool {
    text.split(|c: char| c.is_whitespace() || c == '`')
        .any(|w| file_word(w).is_some())
}

/// `text` with the absolute path of the repository `root` taken out: `<root>/src/app.py`
/// becomes `src/app.py` and `<root>` alone `.`, for `root` as given and as canonicalized
/// (a path that merely starts with the root's text, such as `<root>2/x`, is left alone). What a
/// model is told about its files (a check's output, a traceback, a tool result, the feedback of a
/// failed attempt) then reads the same wherever the repository lies, so the same story gets the
/// same words on every run; the paths stay valid, relative to the repository root.
pub fn relative_to_root(text: &str, root: &std::path::Path) -> String {
    let mut roots: Vec<String> = vec![root.display().to_string()];
    if let Ok(canonical) = std::fs::canonicalize(root) {
        roots.push(canonical.display().to_string());
    }
    // The longer root first, so that one that contains the other is taken out whole.
    roots.sort_by_key(|r| std::cmp::Reverse(r.len()));
    roots.dedup();
    let mut out = text.to_owned();
    for root in roots.iter().map(|r| r.trim_end_matches('/')) {
        if root.len() < 2 || !out.contains(root) {
            continue;
        }
        let mut replaced = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(root) {
            let after = &rest[at + root.len()..];
            let next = after.chars().next();
            replaced.push_str(&rest[..at]);
            match next {
                Some('/') => {
                    rest = &after[1..];
                }
                Some(c) if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') => {
                    replaced.push_str(root);
                    rest = after;
                }
                _ => {
                    replaced.push('.');
                    rest = after;
                }
            }
        }
        replaced.push_str(rest);
        out = replaced;
    }
    out
}

/// `text` as a model should read it on every run of the same story: [`relative_to_root`], then
/// each measured duration a command printed (a decimal number of seconds or milliseconds:
/// `Ran 3 tests in 0.002s`, `1 passed in 0.12s`, `Time: 1.5 s`, `12.3ms`) replaced by
/// `[time]`. A check's or a command's output then reads the same on a busy machine and an idle
/// one, so the local model, at temperature 0 with a fixed seed, is asked the same thing on every
/// run. Whole numbers (`timeout 5s`, a setting) are left alone.
pub fn steady_text(text: &str, root: &std::path::Path) -> String {
    static DURATION: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let text = relative_to_root(text, root);
    let re = DURATION.get_or_init(|| {
        regex::Regex::new(r"\b\d+\.\d+ ?(?:ms|s|sec|secs|seconds)\b").expect("a valid regex")
    });
    match re.replace_all(&text, "[time]") {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(changed) => changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_repository_root_is_taken_out_of_text() {
        let root = Path::new("/tmp/.tmpAbC/repo");
        assert_eq!(
            relative_to_root(
                "File \"/tmp/.tmpAbC/repo/hello.py\", line 1\ncd /tmp/.tmpAbC/repo: ok",
                root
            ),
            "File \"hello.py\", line 1\ncd .: ok"
        );
        assert_eq!(
            relative_to_root("/tmp/.tmpAbC/repo2/x and /tmp/.tmpAbC/repo.bak", root),
            "/tmp/.tmpAbC/repo2/x and /tmp/.tmpAbC/repo.bak"
        );
        assert_eq!(relative_to_root("nothing here", root), "nothing here");
        assert_eq!(relative_to_root("/x", Path::new("/")), "/x");
    }

    #[test]
    fn measured_durations_are_taken_out_of_text() {
        let root = Path::new("/tmp/.tmpAbC/repo");
        assert_eq!(
            steady_text(
                "Ran 3 tests in 0.002s\n1 passed in 0.12s\nTime: 1.5 s\nok  pkg\t12.30ms\n\
                 File \"/tmp/.tmpAbC/repo/t.py\", timeout 5s, version 1.2.3, 2.5 seconds",
                root
            ),
            "Ran 3 tests in [time]\n1 passed in [time]\nTime: [time]\nok  pkg\t[time]\n\
             File \"t.py\", timeout 5s, version 1.2.3, [time]"
        );
    }
}
