//! `ralph convert`: a Markdown PRD → prd.json.
//!
//! Two paths: [`markdown`] converts ralph's documented layout with no model (chosen whenever the
//! document has a `US-001: …` story heading); [`agent`] runs an agent session for free-form
//! Markdown (or for a layout document that does not parse, when `--agent` is given), checks its
//! draft against the schema and the linter, and feeds the problems back a bounded number of
//! times. Either way the result is linted ([`crate::prd::lint`], as a brand-new PRD) and [`write`]
//! puts it in place: atomically, never over a prd.json with open stories without `--force`,
//! archiving the one it replaces.

pub mod agent;
pub mod markdown;
pub mod write;

use std::path::{Path, PathBuf};

use crate::ask::Asker;
use crate::cli::SessionArgs;
use crate::error::UserError;
use crate::output::Outputs;
use crate::prd::lint::{self, LintOptions};
use crate::prd::model::Prd;
use crate::process::StopSignals;

/// What to convert, and how.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The Markdown PRD.
    pub input: &'a Path,
    /// Where prd.json goes.
    pub out: &'a Path,
    /// Replace a prd.json with open stories.
    pub force: bool,
    /// Agent sessions at most on the agent path.
    pub attempts: u32,
    /// Refuse to write a prd.json with lint findings.
    pub strict: bool,
    /// How the agent path runs its agent.
    pub session: &'a SessionArgs,
}

/// Which path converted the PRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// ralph's layout, no model.
    Layout,
    /// An agent, in this many sessions.
    Agent {
        /// Sessions it took.
        attempts: u32,
    },
}

/// What a conversion did.
#[derive(Debug)]
pub struct Converted {
    /// The prd.json written.
    pub out: PathBuf,
    /// Its content.
    pub prd: Prd,
    /// Which path converted it.
    pub route: Route,
    /// Lint findings (and, on the agent path, conversion-rule findings) left in it, one line
    /// each: `<json path>: <message> [<rule>] (fix: …)`.
    pub warnings: Vec<String>,
    /// What happened to the prd.json that was there.
    pub replaced: write::Replaced,
}

/// Converts `req.input` into `req.out` (see the module docs). `asker` is an agent session
/// already open (`ralph plan --convert`); without one the agent path opens its own from
/// `req.session`, in `cwd`.
///
/// # Errors
/// An unreadable input; layout errors naming each line (without `--agent`); a failed agent
/// path (naming the saved draft); lint findings under `--strict`; a prd.json with open stories
/// without `--force`; I/O errors naming the file. Nothing is written on error.
pub async fn convert(
    req: &Request<'_>,
    asker: Option<&Asker>,
    cwd: &Path,
    out: &mut Outputs,
    stop: &StopSignals,
) -> anyhow::Result<Converted> {
    let text = std::fs::read_to_string(req.input).map_err(|e| {
        UserError::new(format!("cannot read {}: {e}", req.input.display())).with_hint(
            "pass the path of your Markdown PRD, or write one with `ralph plan \"<feature>\"`",
        )
    })?;
    let project = default_project(req.out);
    let explicit_agent = req.session.agent_args.agent.is_some();
    let layout = if markdown::uses_layout(&text) {
        match markdown::parse(&text, req.input) {
            Ok(parsed) => Some(parsed.into_prd(&project)),
            Err(errors) if explicit_agent => {
                out.warn(format!(
                    "{} does not follow ralph's PRD layout ({} problems); converting it with the \
                     agent",
                    req.input.display(),
                    errors.errors.len()
                ));
                None
            }
            Err(errors) => return Err(errors.into()),
        }
    } else {
        None
    };
    let (prd, route, warnings) = match layout {
        Some(prd) => {
            let warnings = lint::lint(&prd, &LintOptions { brand_new: true })
                .into_iter()
                .map(|f| {
                    format!(
                        "{}: {} [{}] (fix: {})",
                        f.json_path, f.message, f.rule, f.hint
                    )
                })
                .collect();
            (prd, Route::Layout, warnings)
        }
        None => {
            let draft_path = draft_path(req.out);
            let settled = match asker {
                Some(asker) => {
                    agent::convert(
                        asker,
                        &text,
                        req.input,
                        &project,
                        req.attempts,
                        &draft_path,
                        out,
                    )
                    .await?
                }
                None => {
                    let asker = Asker::open(req.session, cwd, out, stop.clone()).await?;
                    let result = agent::convert(
                        &asker,
                        &text,
                        req.input,
                        &project,
                        req.attempts,
                        &draft_path,
                        out,
                    )
                    .await;
                    asker.close().await;
                    result?
                }
            };
            let route = Route::Agent {
                attempts: settled.attempts,
            };
            (settled.value, route, settled.warnings)
        }
    };
    if req.strict && !warnings.is_empty() {
        let mut message = format!(
            "{} was not written: the converted PRD has {} lint finding{} (--strict):",
            req.out.display(),
            warnings.len(),
            if warnings.len() == 1 { "" } else { "s" }
        );
        for w in &warnings {
            message.push_str("\n  - ");
            message.push_str(w);
        }
        return Err(UserError::new(message)
            .with_hint(format!(
                "fix these in {} and convert again, or drop --strict to write it with warnings",
                req.input.display()
            ))
            .into());
    }
    let rendered = write::render(&prd);
    // The converter's output always validates; this guards the two from drifting apart.
    crate::prd::store::parse_bytes(req.out, rendered.as_bytes())?;
    let replaced = write::write_prd(req.out, &rendered, req.force)?;
    Ok(Converted {
        out: req.out.to_path_buf(),
        prd,
        route,
        warnings,
        replaced,
    })
}

/// Where the agent path keeps its last draft when it gives up: `<out stem>.draft.json` beside
/// `out` (`prd.json` → `prd.draft.json`).
pub fn draft_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prd".into());
    out.with_file_name(format!("{stem}.draft.json"))
}

/// The `project` of a converted PRD: that of the prd.json being replaced (unless it is
/// `ralph init`'s placeholder), else the name of the repository's directory, else of `out`'s
/// directory.
pub fn default_project(out: &Path) -> String {
    let existing = std::fs::read(out)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| {
            v.get("project")
                .and_then(|p| p.as_str())
                .map(str::to_string)
        })
        .filter(|p| !p.trim().is_empty() && p != "my-project");
    if let Some(p) = existing {
        return p;
    }
    let abs = std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf());
    let dir = abs.parent().map(Path::to_path_buf).unwrap_or_default();
    let root = crate::git::Repo::discover(&dir)
        .map(|r| r.root().to_path_buf())
        .unwrap_or(dir);
    root.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "project".into())
}
