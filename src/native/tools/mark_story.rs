//! `mark_story`: ralph's own tool for recording a story's status. The model never rewrites
//! prd.json itself: ralph changes the bytes of `passes` (and `notes`) only, keeping every other
//! byte (formatting, key order, unknown fields), checks that the result still loads, and replaces
//! the file atomically.
//!
//! With a [`StoryCheck`] in the context (the `local` backend), `passes: true` is recorded only
//! when the story's check passes: its `verify` from prd.json, else the run's `--verify`, run the
//! way ralph's verify gate runs it (`bash -c` in the repository, `RALPH_STORY_ID` set, its own
//! process group, a time limit). A failing check is refused with the end of its output, as an
//! error the model can fix, so it can repair the change within the same iteration instead of
//! learning about it in the next one. The verify gate after the iteration still decides.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::write_file::write_atomic;
use super::{blocking, lenient, summary, ToolContext, ToolError, ToolOutput};
use crate::prd::store::{parse_bytes, set_notes, set_passes, LoadedPrd};
use crate::process::{self, EndReason, Limits, LineVerdict, SpawnSpec};

pub(super) const DESCRIPTION: &str = "Record a story's status in prd.json: `passes` true once \
    every acceptance criterion is met and checked, false otherwise. When the story has a check \
    command, `passes` true is refused until that check passes, and the error shows its output. \
    `notes` (optional) replaces the story's notes, e.g. what was done or what blocks it. Use \
    this instead of editing prd.json.";

/// Lines of a failed check's output kept for the model (as the verify gate keeps).
pub const CHECK_TAIL_LINES: usize = 30;
/// Bytes of a failed check's output kept for the model (as the verify gate keeps).
pub const CHECK_TAIL_BYTES: usize = 4096;

/// How long output is still read after the check's shell exited.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Between SIGTERM and SIGKILL when the check times out.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// The check `mark_story` runs before it records `passes: true` (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoryCheck {
    /// The command for stories without their own `verify` (the run's `--verify`); `None`: such
    /// stories are recorded without a check.
    pub fallback: Option<String>,
    /// Time limit of one check; the whole process group is killed after it.
    pub timeout: Duration,
    /// Values replaced by `[REDACTED]` in the output shown to the model (secret-looking
    /// environment values, as the verify gate redacts them).
    pub secrets: Vec<String>,
}

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

/// Runs the story's check when `passes` is true and the context asks for it, then records.
pub(super) async fn run(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let mut checked = None;
    if let (true, Some(check)) = (args.passes, &ctx.story_check) {
        let id = args.id.trim().to_string();
        let (_, loaded) = blocking((), ctx, |(), ctx| load(ctx)).await?;
        story_exists(&loaded, &id)?;
        let command = loaded
            .prd
            .story(&id)
            .and_then(|s| s.verify.clone())
            .or_else(|| check.fallback.clone())
            .filter(|c| !c.trim().is_empty());
        if let Some(command) = command {
            run_check(&command, &id, check, ctx).await?;
            checked = Some(command);
        }
    }
    let mut output = blocking(args, ctx, record).await?;
    if let Some(command) = checked {
        output.content = format!(
            "{} Its check `{command}` passed.",
            output.content.trim_end()
        );
    }
    Ok(output)
}

/// prd.json read and parsed: `(raw bytes, loaded)`.
fn load(ctx: &ToolContext) -> Result<(Vec<u8>, LoadedPrd), ToolError> {
    let path = &ctx.prd_path;
    let raw = std::fs::read(path).map_err(|err| {
        ToolError::Fatal(format!("mark_story cannot read {}: {err}", path.display()))
    })?;
    let loaded = parse_bytes(path, &raw).map_err(|err| {
        ToolError::RespondToModel(format!(
            "prd.json is not valid right now, so ralph cannot record the story:\n{err}\nFix \
             prd.json first (edit_file), then call mark_story again."
        ))
    })?;
    Ok((raw, loaded))
}

/// An error naming the story ids when `id` is not one of them.
fn story_exists(loaded: &LoadedPrd, id: &str) -> Result<(), ToolError> {
    if loaded.prd.story(id).is_some() {
        return Ok(());
    }
    let ids: Vec<&str> = loaded
        .prd
        .user_stories
        .iter()
        .map(|story| story.id.as_str())
        .collect();
    Err(ToolError::RespondToModel(format!(
        "there is no story with id `{id}` in prd.json; the story ids are: {}",
        ids.join(", ")
    )))
}

/// Runs `command` for story `id` like the verify gate does; a failure is refused with the end
/// of its output.
async fn run_check(
    command: &str,
    id: &str,
    check: &StoryCheck,
    ctx: &ToolContext,
) -> Result<(), ToolError> {
    let spec = SpawnSpec {
        program: "bash".into(),
        args: vec!["-c".into(), command.to_string()],
        cwd: ctx.repo_root.clone(),
        env_remove: ctx.env_remove.clone(),
        env_set: vec![
            ("RALPH_STORY_ID".into(), id.to_string()),
            ("NO_COLOR".into(), "1".into()),
        ],
        stdin: None,
    };
    let limits = Limits {
        timeout: check.timeout,
        idle_timeout: check.timeout,
        kill_grace: KILL_GRACE,
        exit_drain: EXIT_DRAIN,
        final_grace: EXIT_DRAIN,
        max_line_bytes: 64 * 1024,
    };
    let mut tail: VecDeque<String> = VecDeque::new();
    let outcome = process::run(
        spec,
        &limits,
        &ctx.stop,
        |_| {},
        |line| {
            if tail.len() == CHECK_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(process::strip_ansi(&line.text));
            LineVerdict::Continue
        },
    )
    .await
    .map_err(|err| {
        ToolError::Fatal(format!(
            "mark_story cannot run the check `{command}`: {err}"
        ))
    })?;
    let failure = match (outcome.end, outcome.exit_code) {
        (EndReason::Exited, Some(0)) => return Ok(()),
        (EndReason::Exited, Some(code)) => format!("exited with code {code}"),
        (EndReason::TimedOut | EndReason::Idle, _) => format!(
            "was killed after its time limit of {} s",
            check.timeout.as_secs()
        ),
        (EndReason::Cancelled, _) => "was interrupted".to_string(),
        _ => format!("was killed (signal {:?})", outcome.signal),
    };
    let output = bounded(&tail, &check.secrets);
    let output = if output.trim().is_empty() {
        "It printed nothing.".to_string()
    } else {
        format!("The end of its output:\n{output}")
    };
    Err(ToolError::RespondToModel(redact(
        &format!(
            "{id} was NOT marked passing: its check `{command}` (run with bash in the repository \
             root) {failure}. {output}\nFix the files so that the check passes, then call \
             mark_story again."
        ),
        &check.secrets,
    )))
}

/// `text` with each secret of at least 8 bytes replaced by `[REDACTED]`.
fn redact(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 8) {
        text = text.replace(secret.as_str(), "[REDACTED]");
    }
    text
}

/// The kept lines joined, secrets replaced, cut to the last [`CHECK_TAIL_BYTES`] bytes.
fn bounded(lines: &VecDeque<String>, secrets: &[String]) -> String {
    let text = redact(
        &lines.iter().cloned().collect::<Vec<_>>().join("\n"),
        secrets,
    );
    if text.len() <= CHECK_TAIL_BYTES {
        return text;
    }
    let mut cut = text.len() - CHECK_TAIL_BYTES;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    text[cut..].to_string()
}

/// Records the story's `passes` (and `notes`) in prd.json.
fn record(args: Args, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    let path = &ctx.prd_path;
    let shown = path.display();
    let (raw, loaded) = load(ctx)?;
    let id = args.id.trim();
    story_exists(&loaded, id)?;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_tail_is_bounded_and_secrets_are_replaced() {
        let mut lines = VecDeque::new();
        for i in 0..CHECK_TAIL_LINES {
            lines.push_back(format!("{i:03} {}", "y".repeat(300)));
        }
        lines.push_back("token=supersecretvalue".into());
        let text = bounded(&lines, &["supersecretvalue".to_string()]);
        assert!(text.len() <= CHECK_TAIL_BYTES, "{}", text.len());
        assert!(text.ends_with("token=[REDACTED]"), "{text}");
    }
}
