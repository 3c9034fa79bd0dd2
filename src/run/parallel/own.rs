//! In a `--parallel` run ralph owns the checkout's prd.json: a worker's agent can find it (its
//! path is in the prompt) and write it, but what it writes there is never trusted
//! (docs/decisions.md, "The checkout's prd.json belongs to ralph in a parallel run").
//!
//! Before every read that picks a story or decides that the run is complete, and before every
//! commit of the user's edits, [`guard`] compares the checkout's prd.json with the one committed
//! at the run branch's tip (ralph's: every landing commits it):
//! - a story marked passing there that ralph did not land (not passing at the tip, not landed
//!   by this run) is set back to not passing;
//! - a story's other fields (title, description, criteria, verify, priority, dependsOn) changed
//!   from the tip's are put back to the tip's;
//!
//! and says so, naming the stories. Stories the user adds, and `notes`, are left as they are.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{land, Board};
use crate::output::Outputs;
use crate::prd::store;
use crate::run::session::Session;

/// The story fields ralph puts back to the tip's: everything but `passes` and `notes`.
const KEPT: &[&str] = &["passes", "notes"];

/// Sets the checkout's prd.json back to what ralph wrote (see the module docs) and warns once per
/// repair; returns whether it wrote the file. Nothing is done when the checkout is switched, when
/// prd.json is missing or invalid (the callers' reads report that). Trusted passes: the stories
/// of [`Board::passing_at_start`] and [`Board::landed`]; the other fields are the tip's (none
/// put back when the tip has no prd.json committed).
///
/// # Errors
/// git failing to read the run branch's tip, or prd.json failing to be written.
pub fn guard(s: &Session, board: &Board, out: &mut Outputs) -> anyhow::Result<bool> {
    if land::switched(s, board).is_some() {
        return Ok(false);
    }
    let paths = &s.pre.paths;
    let Ok(raw) = std::fs::read(&paths.prd) else {
        return Ok(false);
    };
    let tip = board
        .branch
        .as_deref()
        .and_then(|b| s.pre.repo.ref_sha(&format!("refs/heads/{b}")))
        .or(s.pre.repo.head_sha()?);
    let rel = paths
        .prd
        .strip_prefix(&paths.repo_root)
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .unwrap_or_else(|_| "prd.json".to_owned());
    let committed = match &tip {
        Some(tip) => s.pre.repo.file_at(tip, &rel)?,
        None => None,
    };
    // The user's uncommitted edit from before the run (`--allow-dirty`) is theirs, not a change
    // to put back: compared with the tip plus that edit.
    let committed =
        committed.map(|c| crate::git::held::with_held(&paths.repo_root, &rel, &c).unwrap_or(c));
    // Passes are checked on every call (a parse shared with the run's other reads): a worker's
    // write that slipped into a landing's commit is in the tip too, so the tip's passes are not
    // trusted, only the start's and this run's landings.
    let Ok(current) = store::parse_shared(&paths.prd, raw.clone()) else {
        return Ok(false);
    };
    let mut trusted: BTreeSet<&str> = board.landed.iter().map(String::as_str).collect();
    trusted.extend(board.passing_at_start.iter().map(String::as_str));
    let untrusted = current
        .prd
        .user_stories
        .iter()
        .any(|u| u.passes && !trusted.contains(u.id.as_str()));
    let same = committed.as_deref() == Some(raw.as_slice());
    if same && !untrusted {
        // The common case: nothing written since ralph's last commit.
        return Ok(false);
    }
    let committed = if same {
        None
    } else {
        committed.and_then(|c| store::parse_bytes(&paths.prd, &c).ok())
    };
    let mut value = current.value.clone();
    let mut set_back = Vec::new();
    let mut put_back = Vec::new();
    if let Some(stories) = value.get_mut("userStories").and_then(Value::as_array_mut) {
        for story in stories.iter_mut() {
            let Some(id) = story.get("id").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            if story.get("passes") == Some(&Value::Bool(true)) && !trusted.contains(id.as_str()) {
                story["passes"] = Value::Bool(false);
                set_back.push(id.clone());
            }
            let theirs = committed
                .as_ref()
                .and_then(|c| c.prd.story(&id).map(|_| c))
                .and_then(|c| ralphs_story(&c.value, &id));
            if let Some(theirs) = theirs {
                if restore_fields(story, theirs) {
                    put_back.push(id);
                }
            }
        }
    }
    if set_back.is_empty() && put_back.is_empty() {
        return Ok(false);
    }
    let bytes = if put_back.is_empty() {
        // Only `passes` changes: every other byte stays as it is.
        let edits: Vec<(&str, bool)> = set_back.iter().map(|id| (id.as_str(), false)).collect();
        store::set_passes_many(&raw, &edits, Some(&current))?
    } else {
        let mut text = serde_json::to_string_pretty(&value)?;
        text.push('\n');
        text.into_bytes()
    };
    crate::fsutil::write_atomic(&paths.prd, &bytes)?;
    if !set_back.is_empty() {
        out.warn(format!(
            "prd.json in the checkout marked {} passing outside ralph's landing: set back (in a parallel run a story passes only when ralph lands it)",
            set_back.join(", ")
        ));
    }
    if !put_back.is_empty() {
        out.warn(format!(
            "prd.json in the checkout had {} changed outside ralph's landing (criteria, verify or other fields): put back to the run branch's version",
            put_back.join(", ")
        ));
    }
    Ok(true)
}

/// The story `id` in the committed document `doc`.
fn ralphs_story<'a>(doc: &'a Value, id: &str) -> Option<&'a Value> {
    doc.get("userStories")?
        .as_array()?
        .iter()
        .find(|u| u.get("id").and_then(Value::as_str) == Some(id))
}

/// Puts `story`'s fields (all but `passes` and `notes`) back to `theirs`; whether any changed.
fn restore_fields(story: &mut Value, theirs: &Value) -> bool {
    let (Some(mine), Some(theirs)) = (story.as_object_mut(), theirs.as_object()) else {
        return false;
    };
    let mut changed = false;
    let keys: BTreeSet<String> = mine.keys().chain(theirs.keys()).cloned().collect();
    for key in keys {
        if KEPT.contains(&key.as_str()) {
            continue;
        }
        match theirs.get(&key) {
            Some(v) if mine.get(&key) != Some(v) => {
                mine.insert(key, v.clone());
                changed = true;
            }
            None if mine.contains_key(&key) => {
                mine.remove(&key);
                changed = true;
            }
            _ => {}
        }
    }
    changed
}

/// The stories passing in prd.json as committed at the checkout's HEAD (the run branch, once
/// [`super::drive`] committed the run's own files); prd.json as the run started when none is
/// committed there.
///
/// # Errors
/// git failing to read HEAD's tree.
pub fn passing_at_start(s: &Session) -> anyhow::Result<BTreeSet<String>> {
    let paths = &s.pre.paths;
    let rel = paths
        .prd
        .strip_prefix(&paths.repo_root)
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .unwrap_or_else(|_| "prd.json".to_owned());
    let committed = match s.pre.repo.head_sha()? {
        Some(head) => s.pre.repo.file_at(&head, &rel)?,
        None => None,
    };
    let passing = |prd: &crate::prd::model::Prd| -> BTreeSet<String> {
        prd.user_stories
            .iter()
            .filter(|u| u.passes)
            .map(|u| u.id.clone())
            .collect()
    };
    Ok(
        match committed.and_then(|c| store::parse_bytes(&paths.prd, &c).ok()) {
            Some(c) => passing(&c.prd),
            None => passing(&s.initial.prd),
        },
    )
}

/// With `--allow-dirty`: holds the user's uncommitted edits of ralph's own files (`own`:
/// prd.json, progress.txt) out of ralph's commits of them
/// ([`crate::git::held`]): each such file as HEAD has it and as the working tree has it now.
///
/// # Errors
/// git failing to read HEAD.
pub fn hold_user_edits(s: &Session, own: &[String]) -> anyhow::Result<()> {
    let Some(head) = s.pre.repo.head_sha()? else {
        return Ok(());
    };
    for rel in own.iter().filter(|p| !p.ends_with('/')) {
        let (Some(committed), Ok(working)) = (
            s.pre.repo.file_at(&head, rel)?,
            std::fs::read(s.pre.paths.repo_root.join(rel)),
        ) else {
            continue;
        };
        if committed != working {
            crate::git::held::hold(crate::git::held::HeldEdit {
                root: s.pre.paths.repo_root.clone(),
                path: rel.clone(),
                committed,
                working,
            });
        }
    }
    Ok(())
}
