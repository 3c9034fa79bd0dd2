//! What ralph can tell an agent about the project without running anything: the command that
//! runs its tests, read from the files that usually declare it. `ralph convert` and `ralph plan`
//! put it in their prompts, so that "Tests pass" criteria (and `verify` commands) name a command
//! that exists.

use std::path::Path;

/// The project's test command, when one of these says it (first match wins):
/// a command in the README (backquoted, or a line of its own) that starts with `python3 -m
/// unittest`, `python3 -m pytest`, `pytest`, `cargo test`, `npm test`, `go test` or `make test`; `Cargo.toml` (`cargo test`); `package.json` with a
/// `scripts.test` (`npm test`); `go.mod` (`go test ./...`); a `Makefile` with a `test:` target
/// (`make test`); `pyproject.toml`/`setup.py`/`tests/` with Python files (`python3 -m pytest`
/// when pytest is configured, else `python3 -m unittest discover -s tests`).
pub fn test_command(root: &Path) -> Option<String> {
    readme_command(root).or_else(|| manifest_command(root))
}

fn readme_command(root: &Path) -> Option<String> {
    const PREFIXES: &[&str] = &[
        "python3 -m unittest",
        "python -m unittest",
        "python3 -m pytest",
        "python -m pytest",
        "pytest",
        "cargo test",
        "npm test",
        "npm run test",
        "go test",
        "make test",
    ];
    let text = ["README.md", "README", "readme.md"]
        .iter()
        .find_map(|n| std::fs::read_to_string(root.join(n)).ok())?;
    // Backquoted spans first, then whole lines (fenced or indented commands).
    let mut spans: Vec<&str> = text.split('`').skip(1).step_by(2).collect();
    spans.extend(text.lines());
    spans
        .into_iter()
        .map(|s| s.trim().trim_start_matches("$ ").trim())
        .find(|s| s.len() < 120 && !s.contains('\n') && PREFIXES.iter().any(|p| s.starts_with(p)))
        .map(str::to_string)
}

fn manifest_command(root: &Path) -> Option<String> {
    let has = |name: &str| root.join(name).exists();
    if has("Cargo.toml") {
        return Some("cargo test".into());
    }
    if let Ok(text) = std::fs::read_to_string(root.join("package.json")) {
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if doc.pointer("/scripts/test").is_some() {
            return Some("npm test".into());
        }
    }
    if has("go.mod") {
        return Some("go test ./...".into());
    }
    if std::fs::read_to_string(root.join("Makefile"))
        .is_ok_and(|t| t.lines().any(|l| l.starts_with("test:")))
    {
        return Some("make test".into());
    }
    let pytest = std::fs::read_to_string(root.join("pyproject.toml"))
        .is_ok_and(|t| t.contains("pytest"))
        || has("pytest.ini");
    if pytest {
        return Some("python3 -m pytest".into());
    }
    let python_tests = std::fs::read_dir(root.join("tests")).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "py"))
    });
    if python_tests || has("setup.py") || has("pyproject.toml") {
        return Some("python3 -m unittest discover -s tests".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_command_wins_then_manifests() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(test_command(dir.path()), None);
        std::fs::create_dir(dir.path().join("tests")).unwrap();
        std::fs::write(dir.path().join("tests/test_x.py"), "").unwrap();
        assert_eq!(
            test_command(dir.path()).as_deref(),
            Some("python3 -m unittest discover -s tests")
        );
        std::fs::write(
            dir.path().join("README.md"),
            "Run:\n\n```sh\npython3 -m unittest discover -s tests -q\n```\n",
        )
        .unwrap();
        assert_eq!(
            test_command(dir.path()).as_deref(),
            Some("python3 -m unittest discover -s tests -q")
        );
        let rust = tempfile::tempdir().unwrap();
        std::fs::write(rust.path().join("Cargo.toml"), "[package]\n").unwrap();
        assert_eq!(test_command(rust.path()).as_deref(), Some("cargo test"));
    }
}
