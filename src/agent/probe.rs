//! Asking an agent CLI for its version (`<program> --version`), for the ledger, the run header
//! and `ralph doctor`. Every CLI ralph drives answers `--version` with one line on stdout
//! (`2.1.332 (Claude Code)`, `codex-cli 0.171.0`, `0.61.0`, `1.18.33`).

use std::path::Path;
use std::time::Duration;

use crate::process::{ProcessError, SpawnSpec};

/// How long `--version` may take before it is killed: node-based CLIs start in about a second.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(15);

/// Longest version text kept, in characters.
const MAX_CHARS: usize = 120;

/// Why a version could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The program could not be started (missing, not executable).
    #[error("cannot run `{program} --version`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why it could not start.
        source: ProcessError,
    },
    /// It ran longer than the timeout and was killed.
    #[error("`{program} --version` did not finish within {seconds} s")]
    Timeout {
        /// The program.
        program: String,
        /// The timeout, in seconds.
        seconds: u64,
    },
    /// It exited with a failure or printed nothing.
    #[error("`{program} --version` failed ({}): {output}", crate::protocol::exit::describe_end(*.code, None))]
    Failed {
        /// The program.
        program: String,
        /// Its exit code (`None`: killed by a signal).
        code: Option<i32>,
        /// What it printed (first line, ANSI stripped).
        output: String,
    },
}

/// Runs `program --version` through [`crate::process::capture`] (stdin `/dev/null`,
/// `NO_COLOR=1`, its own process group, killed with the group after `timeout`; anything it leaves
/// running is killed when it exits) and returns the first non-empty output line, ANSI stripped,
/// at most 120 characters.
///
/// # Errors
/// [`ProbeError`] when it cannot start, times out, exits non-zero or prints nothing.
pub fn version(program: &Path, timeout: Duration) -> Result<String, ProbeError> {
    let name = program.display().to_string();
    let spec = SpawnSpec {
        program: program.to_owned(),
        args: vec!["--version".to_owned()],
        env_set: vec![("NO_COLOR".to_owned(), "1".to_owned())],
        ..SpawnSpec::default()
    };
    let out =
        crate::process::capture(&spec, Some(timeout)).map_err(|source| ProbeError::Spawn {
            program: name.clone(),
            source,
        })?;
    if out.timed_out {
        return Err(ProbeError::Timeout {
            program: name,
            seconds: timeout.as_secs(),
        });
    }
    let first = |s: &str| {
        s.lines()
            .map(|l| crate::process::strip_ansi(l).trim().to_owned())
            .find(|l| !l.is_empty())
    };
    let line = first(&out.stdout)
        .or_else(|| first(&out.stderr))
        .unwrap_or_default();
    let line: String = line.chars().take(MAX_CHARS).collect();
    if !out.success() || line.is_empty() {
        return Err(ProbeError::Failed {
            program: name,
            code: out.exit.code,
            output: line,
        });
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn reads_the_first_line_and_reports_each_failure() {
        let dir = tempfile::tempdir().unwrap();
        let ok = script(
            dir.path(),
            "ok",
            "printf '\\n\\033[1m2.1.332 (Claude Code)\\033[0m\\nmore\\n'",
        );
        assert_eq!(
            version(&ok, VERSION_TIMEOUT).unwrap(),
            "2.1.332 (Claude Code)"
        );

        let fails = script(dir.path(), "fails", "echo 'unknown flag' >&2; exit 2");
        let err = version(&fails, VERSION_TIMEOUT).unwrap_err().to_string();
        assert!(
            err.contains("(exit 2)") && err.contains("unknown flag") && !err.contains("Some("),
            "{err}"
        );

        let hangs = script(dir.path(), "hangs", "sleep 30");
        let t = Instant::now();
        let err = version(&hangs, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(err, ProbeError::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));

        let err = version(Path::new("/nonexistent/cli"), VERSION_TIMEOUT).unwrap_err();
        assert!(matches!(err, ProbeError::Spawn { .. }), "{err}");
    }
}
