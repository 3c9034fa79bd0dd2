//! `ralph init`: write the starter files a ralph loop needs into a directory.
//!
//! Files: `prd.json` (two example stories, pointing at the schema through `"$schema"`),
//! `prd.schema.json` (generated from [`crate::prd::model`], for editors), `progress.txt` (the
//! original Ralph's header and an empty Codebase Patterns section), `ralph.toml` (every key
//! commented out with its default) and `.ralph/.gitignore` (`*`, so transcripts, which can hold
//! secrets, and the rest of ralph's local state stay out of git).
//!
//! It never overwrites: if any of these files exists and `--force` is not given, it writes
//! nothing and lists them.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::Local;

use crate::cli::InitArgs;
use crate::protocol::ExitStatus;

/// The starter prd.json.
const PRD_TEMPLATE: &str = include_str!("../../templates/prd.json");
/// The commented default configuration.
const CONFIG_TEMPLATE: &str = include_str!("../../templates/ralph.toml");
/// `.ralph/` ignores everything in it, itself included.
const RALPH_GITIGNORE: &str = "*\n";

/// `ralph init` would overwrite files and `--force` was not given.
#[derive(Debug, thiserror::Error)]
#[error("refusing to overwrite existing files in {}: {}\nhint: pass --force to overwrite them, or remove them first", dir.display(), files.join(", "))]
pub struct WouldOverwrite {
    /// The target directory.
    pub dir: PathBuf,
    /// The files that already exist, relative to `dir`.
    pub files: Vec<String>,
}

/// The files `init` writes, relative to the target directory, with their contents.
fn starter_files() -> Vec<(&'static str, String)> {
    vec![
        ("prd.json", PRD_TEMPLATE.to_owned()),
        ("prd.schema.json", crate::prd::schema::schema_json()),
        (
            "progress.txt",
            crate::progress::initial_contents(Local::now()),
        ),
        ("ralph.toml", CONFIG_TEMPLATE.to_owned()),
        (".ralph/.gitignore", RALPH_GITIGNORE.to_owned()),
    ]
}

/// Runs `ralph init`: writes the starter files into `--dir` (default: the current directory,
/// created when missing), prints what it wrote and the next steps on stdout.
///
/// # Errors
/// [`WouldOverwrite`] (exit 1) when a file exists and `--force` is not set, in which case
/// nothing is written; an I/O error naming the file that could not be written.
pub fn run(args: &InitArgs) -> anyhow::Result<ExitStatus> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let written = write_starter_files(&dir, args.force)?;
    for name in &written {
        println!("wrote {}", dir.join(name).display());
    }
    println!();
    println!("next steps:");
    let mut step = 1;
    if crate::git::Repo::discover(&dir).is_err() {
        println!("  {step}. make it a git repository: git init");
        step += 1;
    }
    println!("  {step}. edit prd.json: project, branchName and your stories; check it with `ralph validate`");
    step += 1;
    println!("  {step}. commit the files: git add prd.json prd.schema.json progress.txt ralph.toml .ralph/.gitignore && git commit -m \"ralph: init\"");
    step += 1;
    println!("  {step}. start the loop: ralph run");
    Ok(ExitStatus::Success)
}

/// Writes the starter files into `dir` and returns their names, in order. Without `force`,
/// nothing is written when any of them exists.
fn write_starter_files(dir: &Path, force: bool) -> anyhow::Result<Vec<&'static str>> {
    let files = starter_files();
    if !force {
        let existing: Vec<String> = files
            .iter()
            .filter(|(name, _)| dir.join(name).symlink_metadata().is_ok())
            .map(|(name, _)| (*name).to_owned())
            .collect();
        if !existing.is_empty() {
            return Err(WouldOverwrite {
                dir: dir.to_path_buf(),
                files: existing,
            }
            .into());
        }
    }
    let mut written = Vec::new();
    for (name, contents) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create directory {}", parent.display()))?;
        }
        fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(name);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [&str; 5] = [
        "prd.json",
        "prd.schema.json",
        "progress.txt",
        "ralph.toml",
        ".ralph/.gitignore",
    ];

    #[test]
    fn writes_every_starter_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("new");
        let written = write_starter_files(&target, false).unwrap();
        assert_eq!(written, ALL);
        for name in ALL {
            assert!(target.join(name).is_file(), "{name}");
        }
        let prd: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(target.join("prd.json")).unwrap()).unwrap();
        assert_eq!(prd["$schema"], "./prd.schema.json");
        assert_eq!(prd["userStories"][0]["passes"], false);
        let progress = fs::read_to_string(target.join("progress.txt")).unwrap();
        assert!(progress.starts_with("# Ralph Progress Log\nStarted: "));
        assert_eq!(
            fs::read_to_string(target.join(".ralph/.gitignore")).unwrap(),
            "*\n"
        );
    }

    #[test]
    fn refuses_to_overwrite_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("progress.txt"), "mine").unwrap();
        fs::write(dir.path().join("ralph.toml"), "max_iter = 3\n").unwrap();
        let err = write_starter_files(dir.path(), false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("progress.txt, ralph.toml"), "{msg}");
        assert!(msg.contains("--force"), "{msg}");
        assert!(!dir.path().join("prd.json").exists());
        assert!(!dir.path().join(".ralph").exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("progress.txt")).unwrap(),
            "mine"
        );

        write_starter_files(dir.path(), true).unwrap();
        assert!(fs::read_to_string(dir.path().join("progress.txt"))
            .unwrap()
            .starts_with("# Ralph Progress Log"));
    }

    #[test]
    fn config_template_lists_every_default_commented_out() {
        for line in CONFIG_TEMPLATE.lines() {
            let line = line.trim();
            assert!(
                line.is_empty() || line.starts_with('#'),
                "uncommented: {line}"
            );
        }
        let uncommented: String = CONFIG_TEMPLATE
            .lines()
            .filter_map(|line| line.strip_prefix("# "))
            .filter(|line| line.contains(" = ") || line.starts_with('['))
            .map(|line| format!("{line}\n"))
            .collect();
        let table: toml::Table = uncommented.parse().unwrap();
        for key in [
            "agent",
            "agent_cmd",
            "agent_program",
            "model",
            "max_iter",
            "timeout",
            "idle_timeout",
            "kill_grace",
            "allow_dirty",
            "prd",
            "template",
            "progress_tail_bytes",
        ] {
            assert!(table.contains_key(key), "missing {key}");
        }
        assert_eq!(table["max_iter"].as_integer(), Some(10));
        assert_eq!(table["progress_tail_bytes"].as_integer(), Some(16384));
    }
}
