//! Keeping the conversation inside the model's context window.
//!
//! Token counts are estimated (about 4 bytes a token, plus a small per-message overhead): the
//! providers' tokenizers differ and the estimate only has to say "close to the window". When the
//! estimate passes the budget, old tool results are shortened first (oldest first, never the
//! latest turn's), then the oldest whole turns (an assistant message together with its tool
//! results, so call ids stay paired) are dropped. The system prompt (message 0) and the story
//! prompt (message 1) are never touched.

use super::llm::{Message, Role};

/// Estimated bytes per token.
const BYTES_PER_TOKEN: usize = 4;
/// Estimated tokens of framing per message.
const MESSAGE_OVERHEAD_TOKENS: usize = 4;
/// What a shortened tool result keeps of its start, in bytes.
const KEEP_OF_OLD_RESULT: usize = 200;
/// Messages at the start that are never shortened or dropped (system prompt, story prompt).
const PROTECTED: usize = 2;

/// Estimated tokens of `messages`.
pub fn estimate_tokens(messages: &[Message]) -> usize {
    messages.iter().map(estimate_message).sum()
}

fn estimate_message(m: &Message) -> usize {
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|c| c.name.len() + c.arguments.to_string().len())
        .sum();
    (m.content.len() + calls) / BYTES_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS
}

/// What [`shrink`] did, for the transcript.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShrinkReport {
    /// Tool results shortened.
    pub results_shortened: usize,
    /// Messages dropped.
    pub messages_dropped: usize,
}

/// Shrinks `messages` until the estimate is at most `budget` tokens, or nothing more may be
/// removed. Returns what was done (all zero when nothing was needed).
pub fn shrink(messages: &mut Vec<Message>, budget: usize) -> ShrinkReport {
    let mut report = ShrinkReport::default();
    if estimate_tokens(messages) <= budget {
        return report;
    }
    // 1. Shorten old tool results, oldest first; the latest turn's results stay whole.
    let last_assistant = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .unwrap_or(messages.len());
    for i in PROTECTED..last_assistant {
        if estimate_tokens(messages) <= budget {
            return report;
        }
        let m = &mut messages[i];
        if m.role == Role::Tool && m.content.len() > KEEP_OF_OLD_RESULT + 64 {
            let mut cut = KEEP_OF_OLD_RESULT;
            while !m.content.is_char_boundary(cut) {
                cut -= 1;
            }
            let omitted = m.content.len() - cut;
            m.content = format!(
                "{}\n[… {omitted} bytes of this old tool result were removed to save context …]",
                &m.content[..cut]
            );
            report.results_shortened += 1;
        }
    }
    // 2. Drop the oldest turns: an assistant message and the tool results that follow it.
    // The note that then says so counts against the budget too (an existing note is already
    // in the estimate and is only rewritten).
    let has_note = matches!(messages.get(PROTECTED), Some(m) if is_note(m));
    let note_tokens = if has_note {
        0
    } else {
        estimate_message(&Message::text(Role::User, drop_note(usize::MAX)))
    };
    let mut over = estimate_tokens(messages) > budget;
    while over {
        let Some(start) =
            (PROTECTED..messages.len()).find(|&i| messages[i].role == Role::Assistant)
        else {
            break;
        };
        let mut end = start + 1;
        while end < messages.len() && messages[end].role == Role::Tool {
            end += 1;
        }
        // Keep at least the latest turn: the model must see what it just did.
        if end >= messages.len() {
            break;
        }
        let removed = end - start;
        messages.drain(start..end);
        report.messages_dropped += removed;
        over = estimate_tokens(messages) + note_tokens > budget;
    }
    if report.messages_dropped > 0 {
        let note = drop_note(report.messages_dropped);
        match messages.get_mut(PROTECTED) {
            Some(m) if is_note(m) => m.content = note,
            _ => messages.insert(
                PROTECTED.min(messages.len()),
                Message::text(Role::User, note),
            ),
        }
    }
    report
}

/// The user message that stands in for `dropped` removed messages.
fn drop_note(dropped: usize) -> String {
    format!(
        "[{dropped} earlier messages were removed to fit the context window; re-read files if you need them]"
    )
}

/// Whether `m` is a note written by [`drop_note`].
fn is_note(m: &Message) -> bool {
    m.role == Role::User && m.content.starts_with('[')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::llm::ToolCall;

    fn convo(turns: usize, result_bytes: usize) -> Vec<Message> {
        let mut m = vec![
            Message::text(Role::System, "SYSTEM PROMPT"),
            Message::text(Role::User, "Story ID: US-001 do the thing"),
        ];
        for i in 0..turns {
            let mut a = Message::text(Role::Assistant, format!("step {i}"));
            a.tool_calls.push(ToolCall {
                id: format!("c{i}"),
                name: "read_file".into(),
                arguments: serde_json::json!({"path": "a.txt"}),
            });
            m.push(a);
            m.push(Message::tool_result(
                &format!("c{i}"),
                "x".repeat(result_bytes),
                false,
            ));
        }
        m
    }

    #[test]
    fn nothing_changes_under_the_budget() {
        let mut m = convo(3, 100);
        let before = m.clone();
        assert_eq!(shrink(&mut m, 10_000), ShrinkReport::default());
        assert_eq!(m, before);
    }

    #[test]
    fn old_tool_results_are_shortened_before_turns_are_dropped() {
        let mut m = convo(4, 4000);
        let r = shrink(&mut m, 1500);
        assert!(r.results_shortened >= 1);
        assert_eq!(r.messages_dropped, 0);
        assert_eq!(m[0].content, "SYSTEM PROMPT");
        assert_eq!(m[1].content, "Story ID: US-001 do the thing");
        // The latest result is whole.
        assert_eq!(m.last().unwrap().content.len(), 4000);
    }

    #[test]
    fn oldest_turns_go_next_and_ids_stay_paired() {
        let mut m = convo(10, 4000);
        let r = shrink(&mut m, 1200);
        assert!(r.messages_dropped > 0);
        assert_eq!(m[0].content, "SYSTEM PROMPT");
        assert_eq!(m[1].content, "Story ID: US-001 do the thing");
        assert!(m[2].content.contains("earlier messages were removed"));
        // Every tool result follows an assistant message that made its call.
        for (i, msg) in m.iter().enumerate() {
            if msg.role == Role::Tool {
                let id = msg.tool_call_id.clone().unwrap();
                let owner = m[..i]
                    .iter()
                    .rev()
                    .find(|x| x.role == Role::Assistant)
                    .unwrap();
                assert!(
                    owner.tool_calls.iter().any(|c| c.id == id),
                    "orphaned result {id}"
                );
            }
        }
        // The budget is reachable (the latest turn alone is about 1030 tokens), so it is met
        // with the note counted.
        assert!(estimate_tokens(&m) <= 1200, "{}", estimate_tokens(&m));
        assert_eq!(m.last().unwrap().content.len(), 4000);
    }
}
