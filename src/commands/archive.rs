//! `ralph archive [--prd PATH] [--json]`: archive the current prd.json and progress.txt by hand
//! (e.g. before writing the next feature's prd.json), then reset progress.txt.
//!
//! The work is [`crate::archive::archive_locked`] (which takes the run lock so that it never
//! races a `ralph run`, which appends to progress.txt); this module resolves the paths and
//! prints.
//! Human output: one line naming the folder and a hint to commit; `--json`: one document on
//! stdout, the [`crate::archive::Archived`] fields plus `"folder_rel"`.

use anyhow::Context as _;

use crate::archive;
use crate::cli::ArchiveArgs;
use crate::protocol::ExitStatus;
use crate::workspace::RunPaths;

/// Runs `ralph archive`: archives `args.prd` (default `./prd.json`) and the progress.txt beside
/// it into `archive/<today>-<branchName or no-branch>[-N]/` beside prd.json, and resets
/// progress.txt to its header. Nothing is committed.
///
/// # Errors
/// A missing prd.json; a `ralph run` holding `.ralph/lock` (naming its pid); I/O errors naming
/// the path.
pub fn run(args: &ArchiveArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let prd = crate::workspace::locate_prd(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);

    let done = archive::archive_locked(&paths, chrono::Local::now().date_naive())?;

    let folder_rel = done
        .folder
        .strip_prefix(&cwd)
        .unwrap_or(&done.folder)
        .to_path_buf();
    if args.json {
        let mut doc = serde_json::to_value(&done)?;
        doc["folder_rel"] = serde_json::json!(folder_rel);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", done.describe(&cwd));
        println!(
            "hint: commit it (`git add -A {} && git commit -m \"Archive {}\"`), then write the next feature's prd.json",
            folder_rel.display(),
            done.branch.as_deref().unwrap_or(archive::NO_BRANCH)
        );
    }
    Ok(ExitStatus::Success)
}
