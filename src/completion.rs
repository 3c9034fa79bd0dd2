//! The completion promise: the exact marker an agent prints to claim that every story passes,
//! and the one rule that decides whether a piece of final text makes that claim.
//!
//! ralph never takes the claim on trust (design: "Completion: never lie"): the run is complete
//! only when every story in `prd.json` has `passes: true`. The promise is still recorded, and a
//! promise while stories remain open is a *premature claim*. This module only answers "did the
//! agent make the claim?"; which text counts as the agent's *final text* is each backend's job
//! (see [`crate::agent`]): for claude, the terminal `result` text or the last top-level assistant
//! message; for plain-text backends, the last non-empty stdout line after removing any echo of
//! the prompt. Echoed prompts, tool inputs and tool outputs never reach this function.

/// The marker an agent prints, as the last thing it says, to claim that every story passes.
/// Same spelling as the original shell Ralph.
pub const PROMISE: &str = "<promise>COMPLETE</promise>";

/// Whether `text` (an agent's final assistant text) makes the completion claim.
///
/// Rule: the text, with trailing whitespace (spaces, tabs, `\r`, `\n`) removed, must **end with**
/// [`PROMISE`], spelled exactly (case-sensitive). So all of these count:
/// - `"Done.\n<promise>COMPLETE</promise>"` (promise on its own last line),
/// - `"All pass. <promise>COMPLETE</promise>"` (promise at the end of the last sentence),
/// - `"<promise>COMPLETE</promise>"` with or without a trailing newline;
///
/// and these do not:
/// - `"I will not print <promise>COMPLETE</promise> until every story passes."` (the marker is
///   mentioned, not claimed: text follows it),
/// - `"<promise>complete</promise>"` (wrong spelling).
///
/// Why "ends with" rather than "contains": agents quote their instructions back ("I must output
/// <promise>COMPLETE</promise> only when ..."), and a mention followed by more text is never a
/// claim. A claim is the last thing said.
pub fn promise_in_final_text(text: &str) -> bool {
    text.trim_end().ends_with(PROMISE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promise_on_its_own_last_line_counts() {
        assert!(promise_in_final_text("Done.\n<promise>COMPLETE</promise>"));
        assert!(promise_in_final_text(
            "Done.\n<promise>COMPLETE</promise>\n"
        ));
        assert!(promise_in_final_text(
            "Done.\r\n<promise>COMPLETE</promise>\r\n  \n"
        ));
    }

    #[test]
    fn promise_ending_the_last_sentence_counts() {
        assert!(promise_in_final_text(
            "All pass. <promise>COMPLETE</promise>"
        ));
    }

    /// Case 6: the promise is the last line of a final message that has no trailing newline.
    #[test]
    fn case_6_last_line_without_trailing_newline_counts() {
        assert!(promise_in_final_text(
            "Implemented US-003.\nAll stories pass.\n<promise>COMPLETE</promise>"
        ));
    }

    /// Case 2: a mention of the marker followed by more text is not a claim.
    #[test]
    fn case_2_promise_mentioned_mid_sentence_does_not_count() {
        assert!(!promise_in_final_text(
            "I will not print <promise>COMPLETE</promise> until every story passes."
        ));
        assert!(!promise_in_final_text(
            "<promise>COMPLETE</promise>\nActually, US-002 still fails."
        ));
    }

    #[test]
    fn wrong_spelling_or_empty_text_does_not_count() {
        assert!(!promise_in_final_text("<promise>complete</promise>"));
        assert!(!promise_in_final_text("<promise>COMPLETE</promise"));
        assert!(!promise_in_final_text(""));
        assert!(!promise_in_final_text("   \n"));
    }
}
