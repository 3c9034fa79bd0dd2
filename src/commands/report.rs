//! `ralph report`: the morning report of the latest run (or `--run ID`, `--all`), as one
//! self-contained HTML file (default `.ralph/report.html`, `--open` to view it), as Markdown
//! (`--markdown`, on stdout) or as JSON (`--json`, on stdout). See [`crate::report`].

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cli::ReportArgs;
use crate::error::UserError;
use crate::git::Repo;
use crate::history::History;
use crate::report::{self, Inputs, Scope};
use crate::state::State;
use crate::workspace::RunPaths;

/// Writes or prints the report (see the module docs).
///
/// # Errors
/// No prd.json, an unreadable ledger, an unknown `--run`, the HTML file cannot be written.
pub fn run(args: &ReportArgs) -> anyhow::Result<crate::protocol::ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd_path = crate::workspace::locate_books(args.prd.as_deref(), &cwd)?;
    let prd = crate::prd::store::load(&prd_path)?;
    let paths = RunPaths::of_prd(&prd.path);
    let repo = Repo::discover(&paths.repo_root).ok();
    let history = History::load(&paths, repo.as_ref())?;
    let scope = match (&args.run, args.all) {
        (_, true) => Scope::All,
        (Some(id), _) => Scope::Run(
            history
                .resolve_run(id)
                .map_err(|e| UserError::usage(format!("--run: {e}")))?,
        ),
        (None, false) => Scope::Latest,
    };
    let state = State::load(&paths.ralph_dir).ok().flatten();
    let progress = std::fs::read_to_string(&paths.progress).unwrap_or_default();
    let data = report::build(
        &history,
        &scope,
        &Inputs {
            prd: &prd.prd,
            state: state.as_ref(),
            repo: repo.as_ref(),
            progress: &progress,
        },
    )
    .map_err(|e| UserError::usage(e).with_hint("`ralph log` lists the runs"))?;
    let given = args.out.as_ref().map(|p| {
        if p.is_absolute() {
            p.clone()
        } else {
            cwd.join(p)
        }
    });
    if args.json || args.markdown {
        let text = if args.json {
            serde_json::to_string_pretty(&data)? + "\n"
        } else {
            report::markdown::render(&data)
        };
        let text = crate::redact::redact_env(&text);
        // On stdout, or into `--out` when given (then its path is printed, as for the HTML).
        match &given {
            None => print!("{text}"),
            Some(out) => {
                write_report(out, &text)?;
                println!("{}", out.display());
            }
        }
        return Ok(crate::protocol::ExitStatus::Success);
    }
    let html = report::html::render(&data).context("cannot render the report")?;
    let out: PathBuf = match given {
        Some(p) => p,
        None => {
            // `.ralph/` ignores itself in git, also when the report is what creates it.
            crate::workspace::ensure_ralph_dir(&paths.ralph_dir)?;
            paths.ralph_dir.join("report.html")
        }
    };
    write_report(&out, &html)?;
    println!("{}", out.display());
    if args.open {
        open(&out);
    }
    Ok(crate::protocol::ExitStatus::Success)
}

/// Writes `text` to `out` atomically, creating its directory.
fn write_report(out: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    crate::fsutil::write_atomic(out, text.as_bytes())?;
    Ok(())
}

/// Opens `file` with the desktop's handler (xdg-open, or open on macOS); a failure only warns.
fn open(file: &std::path::Path) {
    let program = if which::which("xdg-open").is_ok() {
        "xdg-open"
    } else {
        "open"
    };
    let spec = crate::process::SpawnSpec {
        program: program.into(),
        args: vec![file.display().to_string()],
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        env_remove: Vec::new(),
        env_set: Vec::new(),
        stdin: None,
    };
    match crate::process::capture(&spec, Some(std::time::Duration::from_secs(10))) {
        Ok(c) if c.success() => {}
        Ok(c) => eprintln!(
            "warning: {program} ended with {}; open {} yourself",
            c.exit,
            file.display()
        ),
        Err(e) => eprintln!(
            "warning: cannot open the report ({e}); open {} yourself",
            file.display()
        ),
    }
}
