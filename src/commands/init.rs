//! `ralph init`: write the starter files a ralph loop needs into a directory.
//!
//! Files: `prd.json` (two example stories, pointing at the schema through `"$schema"`),
//! `prd.schema.json` (generated from [`crate::prd::model`], for editors), `progress.txt` (the
//! original Ralph's header and an empty Codebase Patterns section), `ralph.toml` (every key
//! commented out with its default) and `.ralph/.gitignore` (`*`, so transcripts, which can hold
//! secrets, and the rest of ralph's local state stay out of git).
//!
//! With `--skills claude|amp|codex` it also writes ralph's PRD skills where that CLI reads them
//! ([`crate::plan::skills`]); `--skills-only` writes just those.
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
const PRD_TEMPLATE: &str = crate::convert::write::INIT_TEMPLATE;
/// The commented default configuration.
const CONFIG_TEMPLATE: &str = include_str!("../../templates/ralph.toml");
/// `.ralph/` ignores everything in it, itself included.
const RALPH_GITIGNORE: &str = "*\n";

/// `ralph init` would overwrite files and `--force` was not given.
#[derive(Debug, thiserror::Error)]
#[error("refusing to overwrite existing files in {}: {}\nhint: {hint}", dir.display(), files.join(", "))]
pub struct WouldOverwrite {
    /// The target directory.
    pub dir: PathBuf,
    /// The files that already exist, relative to `dir`.
    pub files: Vec<String>,
    /// What to do instead: `--force`, or `--skills-only` when only the starter files are in
    /// the way of new skills.
    pub hint: String,
}

/// The hint of [`WouldOverwrite`].
const FORCE_HINT: &str = "pass --force to overwrite them, or remove them first";

/// The files `init` writes, relative to the target directory, with their contents.
fn starter_files() -> Vec<(String, String)> {
    [
        ("prd.json", PRD_TEMPLATE.to_owned()),
        ("prd.schema.json", crate::prd::schema::schema_json()),
        (
            "progress.txt",
            crate::progress::initial_contents(Local::now()),
        ),
        ("ralph.toml", CONFIG_TEMPLATE.to_owned()),
        (".ralph/.gitignore", RALPH_GITIGNORE.to_owned()),
    ]
    .into_iter()
    .map(|(name, text)| (name.to_owned(), text))
    .collect()
}

/// The files `ralph init` writes for `args`: the starter files (unless `--skills-only`), then
/// the skills.
fn files_for(args: &InitArgs) -> Vec<(String, String)> {
    let mut files = if args.skills_only {
        Vec::new()
    } else {
        starter_files()
    };
    files.extend(crate::plan::skills::skill_files(&args.skills));
    files
}

/// Runs `ralph init`: writes the starter files (and the skills of `--skills`; with
/// `--skills-only` just those) into `--dir` (default: the current directory, created when
/// missing), prints what it wrote and the next steps on stdout.
///
/// # Errors
/// [`WouldOverwrite`] (exit 1) when a file exists and `--force` is not set, in which case
/// nothing is written; an I/O error naming the file that could not be written.
pub fn run(args: &InitArgs) -> anyhow::Result<ExitStatus> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let written = match write_files(&dir, files_for(args), args.force) {
        Err(e) => return Err(with_skills_only_hint(e, args)),
        Ok(written) => written,
    };
    for name in &written {
        println!("wrote {}", dir.join(name).display());
    }
    let skills: Vec<&str> = written
        .iter()
        .filter_map(|name| name.strip_suffix("/ralph-prd/SKILL.md"))
        .collect();
    if args.skills_only {
        println!();
        println!("next steps:");
        println!(
            "  1. commit the skills: git add {} && git commit -m \"ralph: PRD skills\"",
            skills.join(" ")
        );
        println!("  2. in the agent CLI, ask for a PRD (the ralph-prd skill), then for prd.json (the ralph-convert skill, or `ralph convert tasks/prd-<name>.md`)");
        println!("  3. start the loop: ralph run");
        return Ok(ExitStatus::Success);
    }
    println!();
    println!("next steps:");
    let mut step = 1;
    if crate::git::Repo::discover(&dir).is_err() {
        println!("  {step}. make it a git repository: git init");
        step += 1;
    }
    let in_cli = if skills.is_empty() {
        ""
    } else {
        ", or in the agent CLI with the ralph-prd and ralph-convert skills"
    };
    println!("  {step}. write your stories: `ralph plan \"<the feature>\"` then `ralph convert tasks/prd-<name>.md`{in_cli}, or edit prd.json by hand; check it with `ralph validate`");
    step += 1;
    // Not .ralph/.gitignore: it ignores itself (`*`), so `git add` would refuse it.
    let mut add = String::from("prd.json prd.schema.json progress.txt ralph.toml");
    for dir in &skills {
        add.push(' ');
        add.push_str(dir);
    }
    println!("  {step}. commit the files: git add {add} && git commit -m \"ralph: init\"");
    step += 1;
    println!("  {step}. start the loop: ralph run");
    Ok(ExitStatus::Success)
}

/// When `--skills` met only the starter files of an earlier `ralph init`, the hint says
/// `--skills-only` writes just the skills.
fn with_skills_only_hint(err: anyhow::Error, args: &InitArgs) -> anyhow::Error {
    match err.downcast::<WouldOverwrite>() {
        Ok(mut refusal) => {
            let skills_free = refusal.files.iter().all(|f| !f.ends_with("/SKILL.md"));
            if !args.skills.is_empty() && !args.skills_only && skills_free {
                refusal.hint = "to add only the skills to an initialised project, pass \
                                --skills-only; to overwrite these files, --force"
                    .to_owned();
            }
            refusal.into()
        }
        Err(other) => other,
    }
}

/// Writes `files` into `dir` and returns their names, in order. Without `force`, nothing is
/// written when any of them exists.
fn write_files(
    dir: &Path,
    files: Vec<(String, String)>,
    force: bool,
) -> anyhow::Result<Vec<String>> {
    if !force {
        let existing: Vec<String> = files
            .iter()
            .filter(|(name, _)| dir.join(name).symlink_metadata().is_ok())
            .map(|(name, _)| name.clone())
            .collect();
        if !existing.is_empty() {
            return Err(WouldOverwrite {
                dir: dir.to_path_buf(),
                files: existing,
                hint: FORCE_HINT.to_owned(),
            }
            .into());
        }
    }
    let mut written = Vec::new();
    for (name, contents) in files {
        let path = dir.join(&name);
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
        let written = write_files(&target, starter_files(), false).unwrap();
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
        let err = write_files(dir.path(), starter_files(), false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("progress.txt, ralph.toml"), "{msg}");
        assert!(msg.contains("--force"), "{msg}");
        assert!(!dir.path().join("prd.json").exists());
        assert!(!dir.path().join(".ralph").exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("progress.txt")).unwrap(),
            "mine"
        );

        write_files(dir.path(), starter_files(), true).unwrap();
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
