//! `ralph validate [PATH] [--json] [--strict]`: check a prd.json against the schema and the
//! semantic rules, then lint it ([`crate::prd::lint`]).
//!
//! Human output: on success one line on stdout, `✓ prd.json is valid: N stories (M passing)`,
//! then each lint finding on stderr as `warning: <file>: <json path>: <message> [<rule>]` with an
//! indented `hint:` line; on failure every problem on stderr (`<file>: <json path>: <message>`
//! and an indented `hint:` line). With `--strict`, lint findings make the file invalid (exit 1).
//! With `--json`, one document on stdout in every case: `{"valid": bool, "path": "<absolute
//! path>", "violations": [{"jsonPath", "message", "hint"}], "warnings": [{"jsonPath", "rule",
//! "message", "hint"}]}`; an unreadable or non-JSON file is reported as one violation at `$`.
//!
//! The PRD counts as brand-new for the linter (passing stories are then a finding) when no run
//! has recorded anything for it: no ledger in `.ralph/` and nothing beyond the header in the
//! progress.txt beside it.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::cli::ValidateArgs;
use crate::prd::lint::{self, Finding, LintOptions};
use crate::prd::store::{self, LoadedPrd, PrdError, Violation};
use crate::protocol::ExitStatus;

/// The `--json` report.
#[derive(Serialize)]
struct Report<'a> {
    valid: bool,
    path: String,
    violations: &'a [Violation],
    warnings: &'a [Finding],
}

/// Run `ralph validate`. `args.path` defaults to the prd.json found from the current directory
/// upward (as for `ralph status`), else `./prd.json`.
///
/// Returns [`ExitStatus::Success`] when the file is valid (lint findings are printed as
/// warnings) and [`ExitStatus::Failure`] when it is missing, unreadable, not JSON or invalid, or
/// has lint findings under `--strict` (after printing why).
///
/// # Errors
/// Only when stdout or stderr cannot be written.
pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitStatus> {
    // Without a path, the prd.json the other commands use: here, or found upward up to the
    // repository root; when there is none, ./prd.json (whose error says how to create one).
    let found = match &args.path {
        Some(_) => None,
        None => std::env::current_dir().ok().and_then(|cwd| {
            let found = crate::workspace::locate_prd(None, &cwd).ok()?;
            // Shown as given when it is here (`prd.json`), absolute when found above.
            Some(
                found
                    .strip_prefix(&cwd)
                    .map(Path::to_path_buf)
                    .unwrap_or(found),
            )
        }),
    };
    let path = args
        .path
        .as_deref()
        .or(found.as_deref())
        .unwrap_or(Path::new("prd.json"));
    let result = store::load(path);
    let warnings = match &result {
        Ok(loaded) => lint_loaded(loaded),
        Err(_) => Vec::new(),
    };
    let lint_ok = !args.strict || warnings.is_empty();
    if args.json {
        let (valid, violations) = match &result {
            Ok(_) => (lint_ok, Vec::new()),
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
            warnings: &warnings,
        };
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &report).context("writing the report to stdout")?;
        writeln!(out).context("writing the report to stdout")?;
        return Ok(status(valid));
    }
    match result {
        Ok(_) if !lint_ok => {
            let mut err = std::io::stderr().lock();
            let count = warnings.len();
            let noun = if count == 1 { "finding" } else { "findings" };
            writeln!(
                err,
                "✗ {} has {count} lint {noun} (--strict makes them errors):",
                path.display()
            )
            .context("writing to stderr")?;
            for finding in &warnings {
                writeln!(err, "{}: {finding}", path.display()).context("writing to stderr")?;
            }
            Ok(ExitStatus::Failure)
        }
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
            let mut err = std::io::stderr().lock();
            for finding in &warnings {
                writeln!(err, "warning: {}: {finding}", path.display())
                    .context("writing to stderr")?;
            }
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

/// The lint findings of a loaded prd.json, brand-new when nothing was recorded for it yet.
fn lint_loaded(loaded: &LoadedPrd) -> Vec<Finding> {
    let paths = crate::workspace::RunPaths::of_prd(&loaded.path);
    let ledger_empty = std::fs::metadata(&paths.ledger).map_or(true, |m| m.len() == 0);
    let progress_empty = std::fs::read_to_string(&paths.progress)
        .map_or(true, |text| !crate::archive::progress_has_entries(&text));
    lint::lint(
        &loaded.prd,
        &LintOptions {
            brand_new: ledger_empty && progress_empty,
        },
    )
}

fn status(valid: bool) -> ExitStatus {
    if valid {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    }
}
