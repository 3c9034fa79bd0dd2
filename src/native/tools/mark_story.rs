//! `mark_story`: ralph's own tool for recording a story's status. The model never rewrites
//! prd.json itself: ralph changes the bytes of `passes` (and `notes`) only, keeping every other
//! byte (formatting, key order, unknown fields), checks that the result still loads, and replaces
//! the file atomically.

use serde::Deserialize;
use serde_json::{json, Value};

use super::write_file::write_atomic;
use super::{lenient, summary, ToolContext, ToolError, ToolOutput};
use crate::prd::store::{parse_bytes, set_notes, set_passes};

pub(super) const DESCRIPTION: &str = "Record a story's status in prd.json: `passes` true once \
    every acceptance criterion is met and checked, false otherwise. `notes` (optional) replaces \
    the story's notes, e.g. what was done or what blocks it. Use this instead of editing \
    prd.json.";

pub(super) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "The story id, e.g. `US-001`."},
            "passes": {"type": "boolean", "description": "Whether the story is done and verified."},
            "notes": {"type": "string", "description": "New notes for the story (optional)."}
        },
        "required": ["id", "passes"]
    })
}

/// `mark_story` arguments.
#[derive(Debug, Deserialize)]
pub(super) struct Args {
    #[serde(alias = "story_id")]
    pub id: String,
    #[serde(deserialize_with = "lenient::bool")]
    pub passes: bool,
    #[serde(default)]
    pub notes: Option<String>,
}

pub(super) fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let path = &ctx.prd_path;
    let shown = path.display();
    let raw = std::fs::read(path)
        .map_err(|err| ToolError::Fatal(format!("mark_story cannot read {shown}: {err}")))?;
    let loaded = parse_bytes(path, &raw).map_err(|err| {
        ToolError::RespondToModel(format!(
            "prd.json is not valid right now, so ralph cannot record the story:\n{err}\nFix \
             prd.json first (edit_file), then call mark_story again."
        ))
    })?;
    let id = args.id.trim();
    if loaded.prd.story(id).is_none() {
        let ids: Vec<&str> = loaded
            .prd
            .user_stories
            .iter()
            .map(|story| story.id.as_str())
            .collect();
        return Err(ToolError::RespondToModel(format!(
            "there is no story with id `{id}` in prd.json; the story ids are: {}",
            ids.join(", ")
        )));
    }

    // The story exists with a `passes` field (the file just validated), so a failure below is
    // ralph's bug, not the model's.
    let broken = |what: String| ToolError::Fatal(format!("mark_story on {shown}: {what}"));
    let mut updated = set_passes(&raw, id, args.passes).map_err(|e| broken(e.to_string()))?;
    if let Some(notes) = &args.notes {
        updated = set_notes(&updated, id, notes).map_err(|e| broken(e.to_string()))?;
    }
    let reloaded = parse_bytes(path, &updated)
        .map_err(|e| broken(format!("the edited file would not load: {e}")))?;
    let story = reloaded
        .prd
        .story(id)
        .ok_or_else(|| broken(format!("story {id} vanished from the edited file")))?;
    if story.passes != args.passes || args.notes.as_ref().is_some_and(|n| *n != story.notes) {
        return Err(broken(format!(
            "the edited file does not hold the new values of story {id}"
        )));
    }
    if updated != raw {
        write_atomic(path, &updated)
            .map_err(|err| ToolError::Fatal(format!("mark_story cannot write {shown}: {err}")))?;
    }

    let status = if args.passes {
        "passing"
    } else {
        "not passing"
    };
    let notes = if args.notes.is_some() {
        "; notes updated"
    } else {
        ""
    };
    Ok(ToolOutput {
        content: format!("Story {id} is now marked {status} in prd.json{notes}."),
        summary: summary(&format!("mark_story {id}: passes={}{notes}", args.passes)),
    })
}
