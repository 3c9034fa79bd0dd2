//! Errors the user must fix ([`UserError`]), and the one printer for every error a command
//! returns ([`report`]).
//!
//! Two tiers: a [`UserError`] says what is wrong, how to fix it (its hint) and which exit code it
//! means; anything else is an `anyhow::Error` built from the modules' own `thiserror` enums and
//! exits 1. An error whose exit code is not 1 is a [`UserError`] anywhere in the chain (e.g. a
//! refused flag value, a usage error with exit 2, which `commands/run.rs` turns into one).
//!
//! The printer writes, on stderr:
//! ```text
//! error: <the outermost message>
//!   caused by: <each cause whose text was not printed yet>
//! hint: <each hint, once, last>
//! ```
//! Many messages embed their cause (`cannot read x: {source}`) and also return it as their
//! `source()`, so a cause whose text is already contained in what was printed (messages and
//! hints) is skipped: nothing prints twice. Hints written inside a message, as a line starting
//! with `hint:` (or the older indented `  hint:`), are taken out of it and printed last; the rule
//! is in [`split_hint`]. Colours follow the terminal: `error:` red and `hint:` cyan on a tty,
//! none when stderr is not a terminal or `NO_COLOR` is set.
//!
//! Layering: this file uses only [`crate::protocol`], so every module may return a
//! [`UserError`].

use std::fmt;
use std::io::Write as _;

use crate::protocol::ExitStatus;

/// An error the user must fix: what is wrong, optionally how to fix it, and the exit code.
///
/// `Display` is the message, then `\nhint: <hint>` when there is one, so the hint survives being
/// used as an `anyhow` context or printed with `to_string()`; [`report`] prints it after the
/// causes.
#[derive(Debug)]
pub struct UserError {
    message: String,
    hint: Option<String>,
    status: ExitStatus,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl UserError {
    /// An error the user must fix, exit 1 ([`ExitStatus::Failure`]).
    pub fn new(message: impl Into<String>) -> UserError {
        UserError {
            message: message.into(),
            hint: None,
            status: ExitStatus::Failure,
            source: None,
        }
    }

    /// A usage error: the command line is wrong on its face, exit 2 ([`ExitStatus::Usage`]).
    pub fn usage(message: impl Into<String>) -> UserError {
        UserError::new(message).with_status(ExitStatus::Usage)
    }

    /// Adds how to fix it (one `hint:` line, printed last).
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> UserError {
        self.hint = Some(hint.into());
        self
    }

    /// Sets the exit code.
    #[must_use]
    pub fn with_status(mut self, status: ExitStatus) -> UserError {
        self.status = status;
        self
    }

    /// Adds the underlying error (printed as a cause unless the message already says it).
    #[must_use]
    pub fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> UserError {
        self.source = Some(Box::new(source));
        self
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How to fix it, if known.
    pub fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }

    /// The exit code it means.
    pub fn status(&self) -> ExitStatus {
        self.status
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match &self.hint {
            Some(hint) => write!(f, "\nhint: {hint}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for UserError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The exit code for `err`: that of a [`UserError`] in its chain (also as an
/// `anyhow` context), the outermost first, else [`ExitStatus::Failure`].
pub fn exit_status(err: &anyhow::Error) -> ExitStatus {
    if let Some(user) = err.downcast_ref::<UserError>() {
        return user.status();
    }
    chain(err.as_ref())
        .find_map(|e| e.downcast_ref::<UserError>().map(UserError::status))
        .unwrap_or(ExitStatus::Failure)
}

/// Prints `err` on stderr (see the module docs) and returns its exit code ([`exit_status`]).
pub fn report(err: &anyhow::Error) -> ExitStatus {
    let text = render(err.as_ref(), console::colors_enabled_stderr());
    // An error may quote an agent or a command: no secret in what is printed (crate::redact).
    let text = crate::redact::redact_env(&text);
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
    exit_status(err)
}

/// `err` as the printer shows it, one `\n`-terminated line at a time; with `color`, the labels
/// carry ANSI colours.
pub fn render(err: &(dyn std::error::Error + 'static), color: bool) -> String {
    let mut messages: Vec<String> = Vec::new();
    let mut hints: Vec<String> = Vec::new();
    // Everything that will be printed, to tell whether a cause would repeat it.
    let mut shown = String::new();
    for e in chain(err) {
        let (message, hint) = match e.downcast_ref::<UserError>() {
            Some(user) => (user.message().to_owned(), user.hint().map(str::to_owned)),
            None => split_hint(&e.to_string()),
        };
        if let Some(hint) = hint.filter(|h| !h.is_empty() && !hints.contains(h)) {
            shown.push_str(&hint);
            shown.push('\n');
            hints.push(hint);
        }
        let message = message.trim_end();
        if message.is_empty() || shown.contains(message) {
            continue;
        }
        shown.push_str(message);
        shown.push('\n');
        messages.push(message.to_owned());
    }
    let label =
        |text: &str, paint: fn(console::StyledObject<&str>) -> console::StyledObject<&str>| {
            if color {
                paint(console::style(text)).force_styling(true).to_string()
            } else {
                text.to_owned()
            }
        };
    let mut out = String::new();
    for (i, message) in messages.iter().enumerate() {
        let mut lines = message.lines();
        let first = lines.next().unwrap_or_default();
        if i == 0 {
            out.push_str(&format!(
                "{} {first}\n",
                label("error:", |s| s.red().bold())
            ));
            for line in lines {
                out.push_str(&format!("{line}\n"));
            }
        } else {
            out.push_str(&format!("  caused by: {first}\n"));
            for line in lines {
                out.push_str(&format!("    {line}\n"));
            }
        }
    }
    if messages.is_empty() {
        out.push_str(&format!(
            "{} (no message)\n",
            label("error:", |s| s.red().bold())
        ));
    }
    for hint in &hints {
        let mut lines = hint.lines();
        let first = lines.next().unwrap_or_default();
        out.push_str(&format!(
            "{} {first}\n",
            label("hint:", |s| s.cyan().bold())
        ));
        for line in lines {
            out.push_str(&format!("      {line}\n"));
        }
    }
    out
}

/// Splits a message into its text and its hint.
///
/// A hint is a line that starts with `hint:` (`\nhint: …`, or the older indented
/// `\n  hint: …`); it runs to the end of the message. A message with one such line loses it to
/// the hint. A message with several is a list whose items carry their own fix (the problems of a
/// prd.json, or a program's output quoting its own hints), and is kept whole, hints in place.
pub fn split_hint(message: &str) -> (String, Option<String>) {
    let is_hint = |line: &str| {
        let line = line.trim_start();
        line == "hint:" || line.starts_with("hint: ")
    };
    let lines: Vec<&str> = message.split('\n').collect();
    let at: Vec<usize> = (0..lines.len()).filter(|&i| is_hint(lines[i])).collect();
    let [at] = at[..] else {
        return (message.to_owned(), None);
    };
    let first = lines[at].trim_start()["hint:".len()..].trim();
    let mut hint = first.to_owned();
    for line in &lines[at + 1..] {
        hint.push('\n');
        hint.push_str(line.trim());
    }
    (lines[..at].join("\n"), Some(hint.trim_end().to_owned()))
}

/// `err` and its causes, outermost first.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error as many `thiserror` enums write it: the cause in the message *and* as `source`,
    /// with a hint in between.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the prompt template t.md: {source}\nhint: fix `template` in ralph.toml")]
    struct Doubled {
        source: std::io::Error,
    }

    /// An error with the older indented hint and a cause it does not quote.
    #[derive(Debug, thiserror::Error)]
    #[error("prd.json:3:1: not valid JSON\n  hint: fix the JSON syntax at line 3")]
    struct Indented {
        #[source]
        inner: std::io::Error,
    }

    fn io(text: &str) -> std::io::Error {
        std::io::Error::other(text.to_owned())
    }

    #[test]
    fn a_cause_in_the_message_prints_once_and_the_hint_last() {
        let err = anyhow::Error::new(Doubled {
            source: io("entity not found"),
        });
        assert_eq!(
            render(err.as_ref(), false),
            "error: cannot read the prompt template t.md: entity not found\n\
             hint: fix `template` in ralph.toml\n"
        );
    }

    #[test]
    fn context_causes_and_hints_in_either_format_come_in_order() {
        let err = anyhow::Error::new(Indented {
            inner: io("disk on fire"),
        })
        .context(UserError::new("cannot start the run").with_hint("run `ralph doctor`"))
        .context("preparing iteration 3");
        assert_eq!(
            render(err.as_ref(), false),
            "error: preparing iteration 3\n\
             \x20 caused by: cannot start the run\n\
             \x20 caused by: prd.json:3:1: not valid JSON\n\
             \x20 caused by: disk on fire\n\
             hint: run `ralph doctor`\n\
             hint: fix the JSON syntax at line 3\n"
        );
        assert_eq!(exit_status(&err), ExitStatus::Failure);
    }

    #[test]
    fn a_user_error_carries_its_status_through_context_and_colours_only_on_request() {
        let err = anyhow::Error::new(
            UserError::usage("--max-iter must be at least 1")
                .with_hint("pass --max-iter N")
                .with_source(io("got 0")),
        )
        .context("resolving the settings");
        assert_eq!(exit_status(&err), ExitStatus::Usage);
        assert_eq!(UserError::new("m").with_hint("h").to_string(), "m\nhint: h");
        let plain = render(err.as_ref(), false);
        assert_eq!(
            plain,
            "error: resolving the settings\n\
             \x20 caused by: --max-iter must be at least 1\n\
             \x20 caused by: got 0\n\
             hint: pass --max-iter N\n"
        );
        let coloured = render(err.as_ref(), true);
        assert!(coloured.contains("\u{1b}["), "{coloured:?}");
        assert_eq!(console::strip_ansi_codes(&coloured), plain);
    }

    #[test]
    fn multi_line_messages_keep_their_lines_and_a_repeated_hint_prints_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("the server exited; its log:\nline 1\nline 2\nhint: check the model")]
        struct Exited;
        let err =
            anyhow::Error::new(Exited).context(UserError::new("x").with_hint("check the model"));
        assert_eq!(
            render(err.as_ref(), false),
            "error: x\n\
             \x20 caused by: the server exited; its log:\n\
             \x20   line 1\n\
             \x20   line 2\n\
             hint: check the model\n"
        );
    }

    #[test]
    fn split_hint_takes_one_hint_and_keeps_a_list_of_them() {
        assert_eq!(
            split_hint("bad\nhint: do this"),
            ("bad".to_owned(), Some("do this".to_owned()))
        );
        assert_eq!(
            split_hint("bad\n  hint: do this\nand that"),
            ("bad".to_owned(), Some("do this\nand that".to_owned()))
        );
        let list = "2 problems:\na: x\n  hint: fix a\nb: y\n  hint: fix b";
        assert_eq!(split_hint(list), (list.to_owned(), None));
        assert_eq!(
            split_hint("no hint here"),
            ("no hint here".to_owned(), None)
        );
        assert_eq!(
            split_hint("a hint: is not a line start"),
            ("a hint: is not a line start".to_owned(), None)
        );
    }
}
