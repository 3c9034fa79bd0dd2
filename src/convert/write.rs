//! Putting a converted prd.json in place.
//!
//! The rules: the new file is written atomically ([`crate::fsutil::write_atomic`]), so a crash
//! leaves the old file or the new one, never half of one. An existing prd.json with open stories
//! (or one ralph cannot read, so it cannot tell) is never replaced without `--force`. A replaced
//! prd.json is archived first by the archive rules ([`crate::archive::archive_locked`]:
//! `archive/<date>-<branch>/` beside it, with progress.txt, which is then reset), except the
//! untouched starter file of `ralph init`, which holds nothing worth keeping.

use std::path::{Path, PathBuf};

use crate::archive::Archived;
use crate::error::UserError;
use crate::prd::model::Prd;
use crate::prd::store;
use crate::workspace::RunPaths;

/// The starter prd.json `ralph init` writes (replaced without archiving while untouched).
pub const INIT_TEMPLATE: &str = include_str!("../../templates/prd.json");

/// What happened to the file that was there before.
#[derive(Debug)]
pub enum Replaced {
    /// There was no file.
    Nothing,
    /// It held exactly the new content: nothing was written.
    Identical,
    /// It was `ralph init`'s untouched starter file: replaced, not archived.
    Template,
    /// It was archived, then replaced.
    Archived(Archived),
}

/// The text of `prd` as ralph writes it: pretty-printed JSON (two-space indent) and a newline.
pub fn render(prd: &Prd) -> String {
    let mut text = serde_json::to_string_pretty(prd).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    text
}

/// Writes `text` (a prd.json that [`store::parse_bytes`] accepts) to `out` by the rules in the
/// module docs; `force` allows replacing a file with open stories.
///
/// # Errors
/// A [`UserError`] naming `out` when it has open stories (or is not a readable prd.json) and
/// `force` is false, with the way out; archive and I/O errors naming the path. Nothing is written
/// then.
pub fn write_prd(out: &Path, text: &str, force: bool) -> anyhow::Result<Replaced> {
    let old = match std::fs::read(out) {
        Ok(bytes) => Some(bytes),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => {
            return Err(
                UserError::new(format!("cannot read {}: {err}", out.display()))
                    .with_hint("make the file readable, or choose another place with --out PATH")
                    .into(),
            )
        }
    };
    let replaced = match old {
        None => Replaced::Nothing,
        Some(bytes) if bytes == text.as_bytes() => return Ok(Replaced::Identical),
        Some(bytes) if bytes == INIT_TEMPLATE.as_bytes() => Replaced::Template,
        Some(bytes) => {
            if !force {
                refuse(out, &bytes)?;
            }
            let paths = RunPaths::of_prd(&absolute(out));
            Replaced::Archived(crate::archive::archive_locked(
                &paths,
                chrono::Local::now().date_naive(),
            )?)
        }
    };
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            UserError::new(format!("cannot create {}: {e}", parent.display()))
                .with_hint("choose another place with --out PATH")
        })?;
    }
    crate::fsutil::write_atomic(out, text.as_bytes()).map_err(|e| {
        UserError::new(format!("cannot write {}: {e}", out.display()))
            .with_hint("check the directory's permissions, or choose another place with --out PATH")
    })?;
    Ok(replaced)
}

/// Errors unless the prd.json `bytes` at `out` may be replaced without `--force`: it is valid
/// and every story passes.
fn refuse(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    match store::parse_bytes(out, bytes) {
        Ok(loaded) => {
            let open: Vec<&str> = loaded
                .prd
                .open_stories()
                .iter()
                .map(|s| s.id.as_str())
                .collect();
            if open.is_empty() {
                return Ok(());
            }
            let shown = if open.len() > 5 {
                format!("{}, … ({} in all)", open[..5].join(", "), open.len())
            } else {
                open.join(", ")
            };
            Err(UserError::new(format!(
                "{} has open stories ({shown}); refusing to replace it",
                out.display()
            ))
            .with_hint(
                "finish that feature first, write elsewhere with --out PATH, or pass --force to \
                 replace it (the old prd.json and progress.txt are archived under archive/)",
            )
            .into())
        }
        Err(err) => Err(UserError::new(format!(
            "{} exists and is not a valid prd.json, so ralph cannot tell whether it has open \
             stories; refusing to replace it",
            out.display()
        ))
        .with_hint(
            "check it with `ralph validate`, write elsewhere with --out PATH, or pass --force to \
             replace it (the old file is archived under archive/)",
        )
        .with_source(err)
        .into()),
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
