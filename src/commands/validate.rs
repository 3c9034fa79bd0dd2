//! `ralph validate [PATH] [--json]`: check a prd.json against the schema and the semantic rules.
//!
//! Human output: on success one line on stdout, `✓ prd.json is valid: N stories (M passing)`; on
//! failure every problem on stderr (`<file>: <json path>: <message>` and an indented `hint:`
//! line). With `--json`, one document on stdout in both cases:
//! `{"valid": bool, "path": "<absolute path>", "violations": [{"jsonPath", "message", "hint"}]}`;
//! an unreadable or non-JSON file is reported as one violation at `$`.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::cli::ValidateArgs;
use crate::prd::store::{self, PrdError, Violation};
use crate::protocol::ExitStatus;

/// The `--json` report.
#[derive(Serialize)]
struct Report<'a> {
    valid: bool,
    path: String,
    violations: &'a [Violation],
}

/// Run `ralph validate`. `args.path` defaults to `./prd.json`.
///
/// Returns [`ExitStatus::Success`] when the file is valid and [`ExitStatus::Failure`] when it is
/// missing, unreadable, not JSON or invalid (after printing why).
///
/// # Errors
/// Only when stdout or stderr cannot be written.
pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitStatus> {
    let path = args.path.as_deref().unwrap_or(Path::new("prd.json"));
    let result = store::load(path);
    if args.json {
        let (valid, violations) = match &result {
            Ok(_) => (true, Vec::new()),
            Err(err) => (false, err.violations()),
        };
        let shown = match &result {
            Ok(loaded) => loaded.path.clone(),
            Err(_) => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        };
        let report = Report {
            valid,
            path: shown.display().to_string(),
            violations: &violations,
        };
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &report).context("writing the report to stdout")?;
        writeln!(out).context("writing the report to stdout")?;
        return Ok(status(valid));
    }
    match result {
        Ok(loaded) => {
            let count = loaded.prd.user_stories.len();
            let noun = if count == 1 { "story" } else { "stories" };
            writeln!(
                std::io::stdout(),
                "✓ {} is valid: {count} {noun} ({} passing)",
                path.display(),
                loaded.prd.passing_count()
            )
            .context("writing to stdout")?;
            Ok(ExitStatus::Success)
        }
        Err(err @ PrdError::Invalid { .. }) => {
            // The error's Display lists every violation with its JSON path and hint.
            writeln!(std::io::stderr(), "✗ {err}").context("writing to stderr")?;
            Ok(ExitStatus::Failure)
        }
        Err(err) => Ok(crate::error::report(&err.into())),
    }
}

fn status(valid: bool) -> ExitStatus {
    if valid {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    }
}
