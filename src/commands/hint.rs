//! `ralph hint "text" [--story ID]`, `ralph hint --list`, `ralph hint --drop N`: the user's notes
//! for the next iteration (see [`crate::hints`]). A hint is stored at once, whether or not a run
//! is active; the next iteration that starts (of the named story, with `--story`) carries it.
//!
//! Exits 0; 1 when `--story` names a story prd.json does not have, or `--drop` names no pending
//! hint.

use crate::cli::HintArgs;
use crate::error::UserError;
use crate::hints::{self, Dropped, Hint};
use crate::protocol::ExitStatus;
use crate::workspace::RunPaths;

/// Runs `ralph hint`.
///
/// # Errors
/// No prd.json found, an unknown `--story`, or `.ralph/hints/` cannot be written.
pub fn run(args: &HintArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_prd(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);
    if args.list {
        print!("{}", list(&hints::all(&paths.ralph_dir)));
        return Ok(ExitStatus::Success);
    }
    if let Some(id) = args.drop {
        return match hints::drop(&paths.ralph_dir, id)? {
            Dropped::Removed(h) => {
                println!("dropped hint {}: {}", h.id, h.text);
                Ok(ExitStatus::Success)
            }
            Dropped::Missing => Err(UserError::new(format!("there is no hint {id}"))
                .with_hint("`ralph hint --list` shows the hints and their numbers")
                .into()),
            Dropped::AlreadyDelivered(h) => Err(UserError::new(format!(
                "hint {id} was already delivered to iteration {}; only a pending hint can be dropped",
                h.delivered.map_or(0, |d| d.iteration)
            ))
            .into()),
        };
    }
    let text = args.text.as_deref().unwrap_or_default().trim();
    if text.is_empty() {
        return Err(UserError::usage("the hint is empty")
            .with_hint("ralph hint \"use the helper in src/util.rs\"")
            .into());
    }
    let mut passed_note = String::new();
    if let Some(story) = &args.story {
        let loaded = crate::prd::store::load(&paths.prd)?;
        if loaded.prd.story(story).is_some_and(|s| s.passes) {
            // Kept (the user may reopen the story), but said: no iteration of it is coming.
            passed_note = format!(
                "\nnote: {story} already passes, so no iteration of it runs unless you set its `passes` back to false"
            );
        }
        if loaded.prd.story(story).is_none() {
            let ids: Vec<&str> = loaded
                .prd
                .user_stories
                .iter()
                .map(|s| s.id.as_str())
                .collect();
            return Err(
                UserError::new(format!("{} has no story {story}", paths.rel(&paths.prd)))
                    .with_hint(format!("--story takes one of: {}", ids.join(", ")))
                    .into(),
            );
        }
    }
    let hint = hints::add(&paths.ralph_dir, text, args.story.as_deref())?;
    let target = match &hint.story {
        Some(s) => format!("the next iteration of {s}"),
        None => "the next iteration".to_owned(),
    };
    println!(
        "hint {} saved; {target} gets it (`ralph hint --drop {}` takes it back){passed_note}",
        hint.id, hint.id
    );
    Ok(ExitStatus::Success)
}

/// `--list`: one line per hint, pending first, then delivered.
fn list(all: &[Hint]) -> String {
    if all.is_empty() {
        return "no hints (give one with `ralph hint \"text\"`)\n".to_owned();
    }
    let mut out = String::new();
    for (title, pending) in [("pending", true), ("delivered", false)] {
        let group: Vec<&Hint> = all.iter().filter(|h| h.is_pending() == pending).collect();
        if group.is_empty() {
            continue;
        }
        out.push_str(&format!("{title}:\n"));
        for h in group {
            let story = h
                .story
                .as_deref()
                .map(|s| format!(" [{s}]"))
                .unwrap_or_default();
            let when = match &h.delivered {
                Some(d) => format!(" (iteration {})", d.iteration),
                None => String::new(),
            };
            out.push_str(&format!("  {:>3}{story}{when}  {}\n", h.id, h.text));
        }
    }
    out
}
