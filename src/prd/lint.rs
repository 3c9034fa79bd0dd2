//! The PRD linter: the habits that make overnight runs fail, found in a prd.json that is valid
//! by the schema.
//!
//! Most failed runs start with the PRD: stories too big for one context, criteria nobody can
//! check, stories that depend on later ones. Each rule here names one such habit; a finding names
//! the JSON path (`$.userStories[2].acceptanceCriteria[1]`), what is wrong and the fix.
//! `ralph validate` prints findings as warnings (`--strict` makes them errors) and `ralph
//! convert` runs the linter on every prd.json it writes (its agent path feeds findings back to
//! the agent). The rules, with their codes:
//!
//! | code | finding |
//! |---|---|
//! | `vague-criterion` | a criterion that says nothing checkable: one of [`VAGUE_PHRASES`] |
//! | `no-checkable-criterion` | a story with no `verify` and no criterion that names something to check ([`is_checkable`]): ralph would take its pass on the agent's word |
//! | `long-description` | a story description over [`MAX_DESCRIPTION_SENTENCES`] sentences or [`MAX_DESCRIPTION_WORDS`] words: too big for one iteration |
//! | `too-many-criteria` | more than [`MAX_CRITERIA`] criteria |
//! | `depends-on-later` | a `dependsOn` id whose story has a higher `priority` number (it is planned later) |
//! | `duplicate-title` | two stories with the same title (case and spacing ignored) |
//! | `new-prd-passing` | a brand-new PRD (nothing recorded yet) with stories already passing |
//! | `bad-branch-name` | a `branchName` git would refuse as a branch name |
//! | `starter-story` | a story still as `ralph init` wrote it (same title and description): a placeholder, not work |
//!
//! The linter is pure: it reads the typed [`Prd`] and [`LintOptions`], never a file.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::prd::model::{Prd, Story};

/// Criteria phrases that cannot be checked (matched case-insensitively anywhere in a criterion).
pub const VAGUE_PHRASES: &[&str] = &[
    "works correctly",
    "work correctly",
    "works properly",
    "work properly",
    "works as expected",
    "as expected",
    "works as intended",
    "works well",
    "handles edge cases",
    "handle edge cases",
    "handles all edge cases",
    "all edge cases",
    "good ux",
    "good user experience",
    "user-friendly",
    "user friendly",
    "is intuitive",
    "looks good",
    "is fast",
    "performs well",
    "bug-free",
    "no bugs",
];

/// More criteria than this in one story is a finding (`too-many-criteria`).
pub const MAX_CRITERIA: usize = 8;
/// A story description with more sentences than this is a finding (`long-description`): "if you
/// cannot describe the change in 2–3 sentences, split it".
pub const MAX_DESCRIPTION_SENTENCES: usize = 3;
/// A story description with more words than this is a finding (`long-description`).
pub const MAX_DESCRIPTION_WORDS: usize = 80;

/// One rule of the linter (see the module docs for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// A criterion that says nothing checkable.
    VagueCriterion,
    /// A story without `verify` and without a criterion that names something to check.
    NoCheckableCriterion,
    /// A story description too long for one iteration.
    LongDescription,
    /// More than [`MAX_CRITERIA`] criteria.
    TooManyCriteria,
    /// A dependency planned after the story that needs it.
    DependsOnLater,
    /// Two stories with one title.
    DuplicateTitle,
    /// A brand-new PRD with stories already passing.
    NewPrdPassing,
    /// A `branchName` that is not a valid git branch name.
    BadBranchName,
    /// A story still as `ralph init`'s starter prd.json has it.
    StarterStory,
}

impl Rule {
    /// The rule's code as printed and in `--json` (`vague-criterion`, …).
    pub fn code(self) -> &'static str {
        match self {
            Rule::VagueCriterion => "vague-criterion",
            Rule::NoCheckableCriterion => "no-checkable-criterion",
            Rule::LongDescription => "long-description",
            Rule::TooManyCriteria => "too-many-criteria",
            Rule::DependsOnLater => "depends-on-later",
            Rule::DuplicateTitle => "duplicate-title",
            Rule::NewPrdPassing => "new-prd-passing",
            Rule::BadBranchName => "bad-branch-name",
            Rule::StarterStory => "starter-story",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// One finding: where, which rule, what is wrong, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Where, as a JSONPath: `$.userStories[2].acceptanceCriteria[1]`.
    pub json_path: String,
    /// The rule.
    pub rule: Rule,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [{}]\n  hint: {}",
            self.json_path, self.message, self.rule, self.hint
        )
    }
}

/// What the linter cannot read from the file itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct LintOptions {
    /// The PRD is brand-new: just converted, or no run has recorded anything for it yet. Only
    /// then are passing stories a finding.
    pub brand_new: bool,
}

/// Every finding in `prd`, by story in document order (document-wide findings first).
pub fn lint(prd: &Prd, options: &LintOptions) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(branch) = &prd.branch_name {
        if !valid_branch_name(branch) {
            out.push(Finding {
                json_path: "$.branchName".into(),
                rule: Rule::BadBranchName,
                message: format!("{branch:?} is not a valid git branch name"),
                hint: "use a name git accepts, e.g. \"ralph/my-feature\": no spaces, no `..`, \
                       `~`, `^`, `:`, `?`, `*`, `[` or `\\`, no leading `-` or trailing `/` or `.lock`"
                    .into(),
            });
        }
    }
    let priorities: HashMap<&str, (usize, i64)> = prd
        .user_stories
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), (i, s.priority)))
        .rev() // the first story of a duplicated id wins, as in validation
        .collect();
    let mut titles: HashMap<String, usize> = HashMap::new();
    for (i, story) in prd.user_stories.iter().enumerate() {
        let at = |rest: &str| format!("$.userStories[{i}]{rest}");
        lint_criteria(story, &at, &mut out);
        lint_description(story, &at, &mut out);
        for (j, dep) in story.depends_on.iter().enumerate() {
            if let Some(&(k, priority)) = priorities.get(dep.as_str()) {
                if priority > story.priority {
                    out.push(Finding {
                        json_path: at(&format!(".dependsOn[{j}]")),
                        rule: Rule::DependsOnLater,
                        message: format!(
                            "{} (priority {}) depends on {dep} (priority {priority}), which is \
                             planned later",
                            story.id, story.priority
                        ),
                        hint: format!(
                            "give $.userStories[{k}] ({dep}) a lower priority number than {}, or \
                             drop the dependency",
                            story.priority
                        ),
                    });
                }
            }
        }
        let key = normalize_title(&story.title);
        if !key.is_empty() {
            match titles.get(&key) {
                Some(&first) => out.push(Finding {
                    json_path: at(".title"),
                    rule: Rule::DuplicateTitle,
                    message: format!(
                        "title {:?} is already used by $.userStories[{first}]",
                        story.title
                    ),
                    hint: "give each story a title that says what it changes; merge the two \
                           stories if they are one change"
                        .into(),
                }),
                None => {
                    titles.insert(key, i);
                }
            }
        }
        if is_starter_story(story) {
            out.push(Finding {
                json_path: at(""),
                rule: Rule::StarterStory,
                message: format!(
                    "{} is still the example story `ralph init` wrote ({:?}): an agent would work on a placeholder",
                    story.id, story.title
                ),
                hint: "replace the example stories with your own (`ralph plan \"<the feature>\"` drafts them), or remove them"
                    .into(),
            });
        }
        if options.brand_new && story.passes {
            out.push(Finding {
                json_path: at(".passes"),
                rule: Rule::NewPrdPassing,
                message: format!(
                    "{} already passes in a brand-new PRD: the loop would never work on it",
                    story.id
                ),
                hint: "set `passes` to false; remove the story if the work is already done".into(),
            });
        }
    }
    out
}

/// Whether `story` has the title and description of one of the stories in `ralph init`'s
/// starter prd.json (`templates/prd.json`).
pub fn is_starter_story(story: &Story) -> bool {
    static STARTER: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    let starter = STARTER.get_or_init(|| {
        let value: Value =
            serde_json::from_str(include_str!("../../templates/prd.json")).unwrap_or_default();
        value["userStories"]
            .as_array()
            .map(|stories| {
                stories
                    .iter()
                    .map(|s| {
                        (
                            s["title"].as_str().unwrap_or_default().to_owned(),
                            s["description"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    starter
        .iter()
        .any(|(title, description)| *title == story.title && *description == story.description)
}

/// [`lint`] for a JSON document that may break the schema (an agent's draft): each field is
/// read leniently (a missing or mistyped one counts as empty), so criteria, titles and
/// dependencies are linted even where another field is wrong. The schema's own problems are for
/// [`crate::prd::store::validate_value`] to report. No findings for a value that is not an object.
pub fn lint_value(value: &Value, options: &LintOptions) -> Vec<Finding> {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let strings = |v: &Value, key: &str| -> Vec<String> {
        v.get(key)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    if !value.is_object() {
        return Vec::new();
    }
    let stories = value
        .get("userStories")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| Story {
            id: text(s, "id"),
            title: text(s, "title"),
            description: text(s, "description"),
            acceptance_criteria: strings(s, "acceptanceCriteria"),
            priority: s.get("priority").and_then(Value::as_i64).unwrap_or(0),
            passes: s.get("passes").and_then(Value::as_bool).unwrap_or(false),
            notes: String::new(),
            depends_on: strings(s, "dependsOn"),
            verify: s.get("verify").and_then(Value::as_str).map(str::to_string),
            extra: serde_json::Map::new(),
        })
        .collect();
    let prd = Prd {
        schema: None,
        project: text(value, "project"),
        branch_name: value
            .get("branchName")
            .and_then(Value::as_str)
            .map(str::to_string),
        base_branch: None,
        description: text(value, "description"),
        user_stories: stories,
        extra: serde_json::Map::new(),
        index: Default::default(),
    };
    lint(&prd, options)
}

fn lint_criteria(story: &Story, at: &dyn Fn(&str) -> String, out: &mut Vec<Finding>) {
    let mut checkable = 0;
    for (j, criterion) in story.acceptance_criteria.iter().enumerate() {
        match vague_phrase(criterion) {
            Some(phrase) => out.push(Finding {
                json_path: at(&format!(".acceptanceCriteria[{j}]")),
                rule: Rule::VagueCriterion,
                message: format!("vague criterion {criterion:?}: {phrase:?} cannot be checked"),
                hint: "say what to observe: a command that passes, an output, a value, a file, \
                       e.g. \"`textkit --reverse abc` prints `cba`\""
                    .into(),
            }),
            None if is_checkable(criterion) => checkable += 1,
            None => {}
        }
    }
    let has_verify = story
        .verify
        .as_deref()
        .is_some_and(|v| !v.trim().is_empty());
    if checkable == 0 && !has_verify {
        out.push(Finding {
            json_path: at(""),
            rule: Rule::NoCheckableCriterion,
            message: format!(
                "{} has no `verify` command and no acceptance criterion that names something to \
                 check (a command, an output, a value, a file): nothing can tell when it is \
                 done, so ralph would take its pass on the agent's word",
                story.id
            ),
            hint: "add a `verify` command that exits 0 when the story is done (e.g. the \
                   project's test command), or a criterion that names what to observe, e.g. \
                   \"`textkit --reverse abc` prints `cba`\" or \"Tests pass\""
                .into(),
        });
    }
    if story.acceptance_criteria.len() > MAX_CRITERIA {
        out.push(Finding {
            json_path: at(".acceptanceCriteria"),
            rule: Rule::TooManyCriteria,
            message: format!(
                "{} has {} acceptance criteria (more than {MAX_CRITERIA}): likely too big for \
                 one iteration",
                story.id,
                story.acceptance_criteria.len()
            ),
            hint: "split the story into smaller ones, each with its own few criteria".into(),
        });
    }
}

fn lint_description(story: &Story, at: &dyn Fn(&str) -> String, out: &mut Vec<Finding>) {
    let words = story.description.split_whitespace().count();
    let sentences = sentence_count(&story.description);
    if sentences > MAX_DESCRIPTION_SENTENCES || words > MAX_DESCRIPTION_WORDS {
        out.push(Finding {
            json_path: at(".description"),
            rule: Rule::LongDescription,
            message: format!(
                "the description has {sentences} sentences and {words} words (at most \
                 {MAX_DESCRIPTION_SENTENCES} sentences and {MAX_DESCRIPTION_WORDS} words fit \
                 one iteration)"
            ),
            hint: "if you cannot describe the change in 2–3 sentences, split the story".into(),
        });
    }
}

/// Phrases that name a check a command runs (matched case-insensitively on word boundaries).
pub const CHECK_PHRASES: &[&str] = &[
    "tests pass",
    "test passes",
    "tests still pass",
    "test suite passes",
    "typecheck passes",
    "typechecks",
    "type check passes",
    "lint passes",
    "linter passes",
    "build passes",
    "build succeeds",
    "builds without errors",
    "compiles",
    "exits 0",
    "exit code 0",
    "exits with 0",
];

/// Whether `criterion` names something a command or a look can confirm: code or a command in
/// backticks, a quoted value, a number, a file name (`hello.py`, `src/app.js`, `README`), or a
/// check a command runs ([`CHECK_PHRASES`]: "Tests pass", "Typecheck passes", …). A
/// [`vague_phrase`] never counts, and neither does prose such as "Users can export their
/// notes", which only the agent's word can confirm.
pub fn is_checkable(criterion: &str) -> bool {
    let text = criterion.trim();
    if text.is_empty() || vague_phrase(text).is_some() {
        return false;
    }
    let lower = text.to_lowercase();
    let quoted = |q: char| text.matches(q).count() >= 2;
    text.contains('`')
        || quoted('"')
        || quoted('\u{201c}')
        || text.chars().any(|c| c.is_ascii_digit())
        || CHECK_PHRASES.iter().any(|p| contains_phrase(&lower, p))
        || crate::prd::files::names_a_file(text)
}

/// The first [`VAGUE_PHRASES`] entry found in `criterion`, if any.
pub fn vague_phrase(criterion: &str) -> Option<&'static str> {
    let lower = criterion.to_lowercase();
    VAGUE_PHRASES
        .iter()
        .copied()
        .find(|phrase| contains_phrase(&lower, phrase))
}

/// Whether `phrase` occurs in `text` on word boundaries (so "is fast" does not match "is
/// faster than 2 s").
fn contains_phrase(text: &str, phrase: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(phrase).any(|(start, _)| {
        let before = text[..start].chars().next_back();
        let after = text[start + phrase.len()..].chars().next();
        !word(before) && !word(after)
    })
}

/// Sentences in `text`: runs of text ended by `.`, `!` or `?` followed by whitespace (or the
/// end), that hold at least one letter or digit. Dots inside `a.b` or `1.5` do not end one.
fn sentence_count(text: &str) -> usize {
    let mut count = 0;
    let mut has_word = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() {
            has_word = true;
        }
        let ends = matches!(c, '.' | '!' | '?') && chars.peek().is_none_or(|n| n.is_whitespace());
        if ends && has_word {
            count += 1;
            has_word = false;
        }
    }
    count + usize::from(has_word)
}

fn normalize_title(title: &str) -> String {
    title
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Whether git accepts `name` as a branch name (`git check-ref-format --branch`).
pub fn valid_branch_name(name: &str) -> bool {
    !name.is_empty() && name != "HEAD" && git2::Branch::name_is_valid(name).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_and_phrases() {
        assert_eq!(sentence_count(""), 0);
        assert_eq!(sentence_count("As a user, I want x so that y"), 1);
        assert_eq!(sentence_count("One. Two! Three? Four"), 4);
        assert_eq!(
            sentence_count("Call `textkit.slug.slugify(x)` with 1.5 values."),
            1
        );
        assert!(vague_phrase("It works correctly").is_some());
        assert!(vague_phrase("Handles edge cases.").is_some());
        assert!(vague_phrase("the page is fast").is_some());
        assert!(vague_phrase("the page is faster than 2 s").is_none());
        assert!(vague_phrase("`slugify(\"a b\")` returns \"a-b\"").is_none());
        for checkable in [
            "`slugify(\"a b\")` returns \"a-b\"",
            "The page is faster than 2 s",
            "Tests pass",
            "Typecheck passes",
            "file-1.txt exists",
            "README mentions the flag",
            "The title reads \"Notes\"",
        ] {
            assert!(is_checkable(checkable), "{checkable}");
        }
        for prose in [
            "Users can export their notes",
            "The feature is implemented",
            "It works correctly",
            "",
        ] {
            assert!(!is_checkable(prose), "{prose}");
        }
        assert!(valid_branch_name("ralph/my-feature"));
        assert!(!valid_branch_name("ralph/my feature"));
        assert!(!valid_branch_name("ralph/x..y"));
        assert!(!valid_branch_name("-x"));
        assert!(!valid_branch_name("x.lock"));
    }
}
