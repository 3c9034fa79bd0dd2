//! Feedback for the next prompts: short notes ralph writes into a prompt about what went wrong
//! before (a failed check, a premature claim, changes outside the story). Each note belongs to the
//! story it is about and reaches only that story's next attempt; a general note (a broken
//! prd.json, a premature claim, changes outside the story, which name their story) reaches the
//! next iteration whatever its story.

/// One feedback note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// The story it is about; `None` for a general note.
    pub story_id: Option<String>,
    /// The text put in the prompt.
    pub text: String,
}

impl Feedback {
    /// A note for `story_id`'s next attempt.
    pub fn about(story_id: &str, text: String) -> Feedback {
        Feedback {
            story_id: Some(story_id.to_owned()),
            text,
        }
    }

    /// A note for the next iteration, whatever its story.
    pub fn general(text: String) -> Feedback {
        Feedback {
            story_id: None,
            text,
        }
    }
}

/// The notes not yet given to a prompt, in the order they were written.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    notes: Vec<Feedback>,
}

impl Pending {
    /// Keeps `notes` for later prompts.
    pub fn add(&mut self, notes: impl IntoIterator<Item = Feedback>) {
        self.notes.extend(notes);
    }

    /// Takes the notes for an iteration of `story_id`: general notes and those about it. Notes
    /// about other stories wait for their story.
    pub fn take_for(&mut self, story_id: &str) -> Vec<String> {
        let (take, keep): (Vec<Feedback>, Vec<Feedback>) = std::mem::take(&mut self.notes)
            .into_iter()
            .partition(|f| f.story_id.as_deref().is_none_or(|s| s == story_id));
        self.notes = keep;
        take.into_iter().map(|f| f.text).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reaches_only_its_own_story() {
        let mut p = Pending::default();
        p.add([
            Feedback::about("US-001", "check failed for US-001".into()),
            Feedback::general("prd.json was restored".into()),
        ]);
        assert_eq!(p.take_for("US-003"), ["prd.json was restored"]);
        assert!(p.take_for("US-003").is_empty());
        assert_eq!(p.take_for("US-001"), ["check failed for US-001"]);
    }
}
