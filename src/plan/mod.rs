//! `ralph plan`: from a feature description to a Markdown PRD (`tasks/prd-<slug>.md`) through an
//! agent session.
//!
//! The agent answers in JSON, never in Markdown: first (on a terminal) the clarifying questions,
//! [`Question`]s with options that ralph shows numbered with lettered options; then the PRD
//! itself, a [`PlanDoc`] (title, introduction, goals, user stories, functional requirements,
//! non-goals, assumptions, open questions). ralph renders the PRD in its documented layout
//! ([`render`]), so `ralph convert` reads it with no model, and checks every draft the way
//! `ralph convert` does: the reply must parse, have 1 to 10 stories with a title and at least
//! one criterion each, and render to a layout document that converts. Problems go back to the
//! agent a bounded number of times ([`crate::ask::ask_until_valid`]).
//!
//! Each prompt is written for the agent of the session ([`PromptStyle`]): an agent CLI reads the
//! reply's format with an example, native reads the schema's field names (the schema itself goes
//! as `response_format`), and the local model gets the compact template
//! (`templates/plan/plan_prompt_local.md`).

pub mod skills;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::ask::{Checked, PromptStyle};
use crate::convert::markdown;

const QUESTIONS_PROMPT: &str = include_str!("../../templates/plan/questions_prompt.md");
const PLAN_PROMPT: &str = include_str!("../../templates/plan/plan_prompt.md");
/// The compact PRD prompt of the local model ([`PromptStyle::Compact`]).
const PLAN_PROMPT_LOCAL: &str = include_str!("../../templates/plan/plan_prompt_local.md");

/// Questions asked at most (the prompt asks for 3 to 5).
pub const MAX_QUESTIONS: usize = 5;
/// Options shown per question at most.
pub const MAX_OPTIONS: usize = 6;

/// One clarifying question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// The question.
    pub question: String,
    /// Its answer options, most likely first (shown as A, B, C, …).
    pub options: Vec<String>,
}

/// A question and the user's answer, as the PRD prompt and the PRD's `Decisions` section show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The question.
    pub question: String,
    /// The chosen option, the user's own words, or that the agent may decide.
    pub answer: String,
}

/// One user story of a planned PRD (ralph numbers them `US-001`… in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanStory {
    /// Short title.
    pub title: String,
    /// "As a [user], I want [feature] so that [benefit]."
    #[serde(default)]
    pub description: String,
    /// Checkable criteria.
    pub acceptance_criteria: Vec<String>,
    /// Ids of earlier stories that must pass first (`US-001` is the first story); rendered as
    /// the story's `**Depends on:**` line, prd.json's `dependsOn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// A shell command, run in the repository root, that exits 0 when the story is done;
    /// rendered as the story's `**Verify:**` line, prd.json's `verify`. Without one, ralph takes
    /// the story's pass on the agent's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
}

/// A planned PRD, as the agent returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanDoc {
    /// The feature's name.
    pub title: String,
    /// What the feature is and why, one paragraph.
    #[serde(default)]
    pub introduction: String,
    /// Goals.
    #[serde(default)]
    pub goals: Vec<String>,
    /// The stories, in the order they should be built.
    pub user_stories: Vec<PlanStory>,
    /// Functional requirements (rendered `FR-1: …`).
    #[serde(default)]
    pub functional_requirements: Vec<String>,
    /// What the feature will not do.
    #[serde(default)]
    pub non_goals: Vec<String>,
    /// What was assumed where the request did not say.
    #[serde(default)]
    pub assumptions: Vec<String>,
    /// What is still to decide.
    #[serde(default)]
    pub open_questions: Vec<String>,
}

fn strings(min: usize, max: usize) -> Value {
    json!({"type": "array", "minItems": min, "maxItems": max, "items": {"type": "string"}})
}

/// The JSON Schema of the clarifying questions reply.
pub fn questions_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "questions": {
                "type": "array", "minItems": 1, "maxItems": MAX_QUESTIONS,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "options": strings(2, 4)
                    },
                    "required": ["question", "options"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["questions"],
        "additionalProperties": false
    })
}

/// The JSON Schema of the PRD reply ([`PlanDoc`]); lists are kept short so that a small
/// model's grammar-bound reply stays bounded.
pub fn plan_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "introduction": {"type": "string"},
            "goals": strings(1, 5),
            "userStories": {
                "type": "array", "minItems": 1, "maxItems": 6,
                "items": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "description": {"type": "string"},
                        "acceptanceCriteria": strings(1, 6),
                        "dependsOn": {"type": "array", "maxItems": 5, "items": {"type": "string"}},
                        "verify": {"type": "string"}
                    },
                    "required": ["title", "description", "acceptanceCriteria"],
                    "additionalProperties": false
                }
            },
            "functionalRequirements": strings(0, 8),
            "nonGoals": strings(0, 5),
            "assumptions": strings(0, 6),
            "openQuestions": strings(0, 5)
        },
        "required": ["title", "introduction", "goals", "userStories", "functionalRequirements",
                     "nonGoals", "assumptions", "openQuestions"],
        "additionalProperties": false
    })
}

fn render_template(template: &str, ctx: minijinja::Value) -> String {
    let env = minijinja::Environment::new();
    env.template_from_str(template)
        .and_then(|t| t.render(ctx))
        // The templates are built in: an error is a ralph bug; show it rather than nothing.
        .unwrap_or_else(|e| format!("{template}\n\n(ralph could not render this prompt: {e})"))
}

/// The prompt asking for clarifying questions about `description`, written for an agent of
/// `style` (an example reply only for the agent CLIs).
pub fn questions_prompt(description: &str, style: PromptStyle) -> String {
    render_template(
        QUESTIONS_PROMPT,
        minijinja::context! {
            description => description.trim(),
            example => style.shows_example(),
        },
    )
}

/// The prompt asking for the PRD of `description`, with the user's `answers` (none: the agent
/// writes its assumptions into the PRD) and the project's test command when known, written for
/// an agent of `style`: an agent CLI's shows an example reply, native's names the schema's
/// fields, the local model's is the compact template.
pub fn plan_prompt(
    description: &str,
    answers: &[Decision],
    test_command: Option<&str>,
    style: PromptStyle,
) -> String {
    // An example from another domain, so that a small model cannot pass it off as the answer.
    // Its `verify` is the project's own test command when ralph knows it.
    let verify = test_command.unwrap_or("npm test");
    let example = json!({
        "title": "Notes export",
        "introduction": "Let users export their notes as Markdown files so that they can keep them outside the app.",
        "goals": ["Export any note in one step"],
        "userStories": [{
            "title": "Export one note",
            "description": crate::convert::agent::EXAMPLE_STORY_DESCRIPTION,
            "acceptanceCriteria": ["`notes export 3` writes `note-3.md` with the note's text", "Tests pass"],
            "dependsOn": [],
            "verify": verify
        }],
        "functionalRequirements": ["FR-1: `notes export ID` writes `note-ID.md` in the current directory"],
        "nonGoals": ["Importing notes"],
        "assumptions": ["Files are UTF-8"],
        "openQuestions": []
    });
    render_template(
        if style.compact() {
            PLAN_PROMPT_LOCAL
        } else {
            PLAN_PROMPT
        },
        minijinja::context! {
            description => description.trim(),
            answers => answers,
            test_command => test_command,
            rules => crate::convert::agent::RULES.trim_end(),
            example => style.shows_example().then(|| serde_json::to_string_pretty(&example).unwrap_or_default()),
        },
    )
}

/// Checks a questions reply: at least one question with a text; questions beyond
/// [`MAX_QUESTIONS`] and options beyond [`MAX_OPTIONS`] are dropped.
pub fn check_questions(value: &Value) -> Checked<Vec<Question>> {
    #[derive(Deserialize)]
    struct Reply {
        questions: Vec<Question>,
    }
    match serde_json::from_value::<Reply>(value.clone()) {
        Ok(reply) => {
            let questions: Vec<Question> = reply
                .questions
                .into_iter()
                .filter(|q| !q.question.trim().is_empty())
                .take(MAX_QUESTIONS)
                .map(|mut q| {
                    q.options.retain(|o| !o.trim().is_empty());
                    q.options.truncate(MAX_OPTIONS);
                    q
                })
                .collect();
            if questions.is_empty() {
                Checked {
                    usable: None,
                    problems: vec![
                        "$.questions: no question (fix: ask 3 to 5 questions, each with 2 to 4 \
                         options)"
                            .into(),
                    ],
                }
            } else {
                Checked {
                    usable: Some(questions),
                    problems: Vec::new(),
                }
            }
        }
        Err(e) => Checked {
            usable: None,
            problems: vec![format!(
                "$: {e} (fix: reply {{\"questions\": [{{\"question\": \"…\", \"options\": [\"…\", \
                 \"…\"]}}]}})"
            )],
        },
    }
}

/// Checks a PRD reply (see the module docs); `decisions` go into the rendered PRD.
pub fn check_plan(value: &Value, decisions: &[Decision]) -> Checked<PlanDoc> {
    let mut doc = match serde_json::from_value::<PlanDoc>(value.clone()) {
        Ok(doc) => doc,
        Err(e) => {
            return Checked {
                usable: None,
                problems: vec![format!(
                    "$: {e} (fix: reply with one object that has `title`, `introduction`, \
                     `goals`, `userStories` (each with `title`, `description`, \
                     `acceptanceCriteria` and, where they apply, `dependsOn` and `verify`), \
                     `functionalRequirements`, `nonGoals`, `assumptions` and `openQuestions`)"
                )],
            }
        }
    };
    let mut problems = Vec::new();
    if doc.title.trim().is_empty() {
        problems.push("$.title: empty (fix: name the feature in a few words)".to_string());
    }
    if doc.user_stories.is_empty() || doc.user_stories.len() > 10 {
        problems.push(format!(
            "$.userStories: {} stories (fix: write 1 to 10 stories, each small enough for one \
             agent session)",
            doc.user_stories.len()
        ));
    }
    // A dependency that is not on an earlier story (the story itself, a later one, an unknown
    // id) is fed back to the agent; the draft stays usable without it, and keeps it as a
    // warning when the attempts run out: a weak model's stray edge must not cost the whole plan,
    // and the Markdown PRD is reviewed before it is converted.
    let mut dep_problems = Vec::new();
    for (i, s) in doc.user_stories.iter_mut().enumerate() {
        let bad = dependency_problems(i, s);
        if !bad.is_empty() {
            dep_problems.extend(bad);
            s.depends_on = normalized_deps(s)
                .into_iter()
                .filter(|d| is_earlier(d, i))
                .collect();
        }
    }
    for (i, s) in doc.user_stories.iter().enumerate() {
        if s.title.trim().is_empty() {
            problems.push(format!(
                "$.userStories[{i}].title: empty (fix: a short title saying what changes)"
            ));
        }
        if s.acceptance_criteria.iter().all(|c| c.trim().is_empty()) {
            problems.push(format!(
                "$.userStories[{i}].acceptanceCriteria: no criterion (fix: list the checks that \
                 show the story is done, e.g. an exact output, then \"Tests pass\")"
            ));
        }
        if s.verify.as_deref().is_some_and(|v| v.contains('`')) {
            problems.push(format!(
                "$.userStories[{i}].verify: contains a backtick, which the Markdown layout cannot \
                 hold (fix: write the command without backticks, e.g. with $(…))"
            ));
        }
    }
    if problems.is_empty() {
        // The rendered PRD must convert without a model; anything else is a ralph bug, but it
        // is reported rather than written.
        match markdown::parse(&render(&doc, decisions), std::path::Path::new("PRD.md")) {
            Err(errors) => problems.extend(
                errors
                    .errors
                    .into_iter()
                    .map(|e| format!("$: {} (fix: {})", e.message, e.hint)),
            ),
            // What `ralph convert` reads back must be what the agent planned: a check or a
            // dependency lost on the way would leave a story with nothing to check it.
            Ok(parsed) => {
                for (i, (planned, read)) in doc.user_stories.iter().zip(&parsed.stories).enumerate()
                {
                    let verify = planned
                        .verify
                        .as_deref()
                        .map(line)
                        .filter(|v| !v.is_empty());
                    if read.verify != verify || read.depends_on != normalized_deps(planned) {
                        problems.push(format!(
                            "$.userStories[{i}]: its verify or dependsOn does not survive the \
                             Markdown layout (fix: a one-line shell command without backticks, \
                             ids like \"US-001\")"
                        ));
                    }
                }
            }
        }
    }
    // A copy of the prompt's example is usable (it converts) but fed back, and left as a
    // warning when the attempts run out.
    let usable = problems.is_empty().then_some(doc);
    problems.extend(dep_problems);
    problems.extend(crate::convert::agent::copied_example(value));
    Checked { usable, problems }
}

/// A story's `dependsOn` as the layout writes it: trimmed, upper case, blanks dropped, and
/// `US-<n>` written with three digits (`US-1` → `US-001`, the id ralph gives the first story).
fn normalized_deps(story: &PlanStory) -> Vec<String> {
    story
        .depends_on
        .iter()
        .map(|d| {
            let d = d.trim().to_uppercase();
            match d.strip_prefix("US-").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => format!("US-{n:03}"),
                None => d,
            }
        })
        .filter(|d| !d.is_empty())
        .collect()
}

/// Problems with story `i`'s `dependsOn`: an id that is not `US-<n>` of an earlier story (the
/// stories are numbered `US-001`… in order, and a story can only wait for one planned before
/// it).
fn dependency_problems(i: usize, story: &PlanStory) -> Vec<String> {
    normalized_deps(story)
        .into_iter()
        .enumerate()
        .filter_map(|(j, dep)| {
            (!is_earlier(&dep, i)).then(|| {
                format!(
                    "$.userStories[{i}].dependsOn[{j}]: {dep:?} is not an earlier story (fix: \
                     the stories are US-001, US-002, … in order; list only ids before \
                     US-{:03}, or none)",
                    i + 1
                )
            })
        })
        .collect()
}

/// Whether the normalized id `dep` names a story before story `i` (0-based): `US-<n>` with
/// `1 <= n <= i`.
fn is_earlier(dep: &str, i: usize) -> bool {
    dep.strip_prefix("US-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n >= 1 && n <= i)
}

/// One line of text: newlines folded into spaces, so a value cannot break the layout.
fn line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn bullets(out: &mut String, heading: &str, items: &[String], numbered: Option<&str>) {
    let items: Vec<String> = items
        .iter()
        .map(|i| line(i))
        .filter(|i| !i.is_empty())
        .collect();
    if items.is_empty() {
        return;
    }
    let _ = write!(out, "\n## {heading}\n\n");
    for (n, item) in items.iter().enumerate() {
        match numbered {
            Some(prefix) if !item.starts_with(prefix) => {
                let _ = writeln!(out, "- {prefix}{}: {item}", n + 1);
            }
            _ => {
                let _ = writeln!(out, "- {item}");
            }
        }
    }
}

/// The PRD in ralph's Markdown layout (README.md, "The Markdown PRD layout"): title,
/// introduction, goals, user stories `### US-001: …` with their description, criteria and
/// `**Depends on:**` / `**Verify:**` lines (when the story has them),
/// functional requirements, non-goals, the user's decisions, assumptions, open questions.
pub fn render(doc: &PlanDoc, decisions: &[Decision]) -> String {
    let title = line(strip_prd_prefix(&doc.title));
    let mut out = format!("# PRD: {title}\n");
    let intro = line(&doc.introduction);
    if !intro.is_empty() {
        let _ = write!(out, "\n## Introduction\n\n{intro}\n");
    }
    bullets(&mut out, "Goals", &doc.goals, None);
    out.push_str("\n## User Stories\n");
    for (i, story) in doc.user_stories.iter().enumerate() {
        let _ = write!(out, "\n### US-{:03}: {}\n", i + 1, line(&story.title));
        let description = line(&story.description);
        if !description.is_empty() {
            let _ = write!(out, "\n**Description:** {description}\n");
        }
        out.push_str("\n**Acceptance Criteria:**\n\n");
        for criterion in &story.acceptance_criteria {
            let c = line(criterion);
            if !c.is_empty() {
                let _ = writeln!(out, "- [ ] {c}");
            }
        }
        let deps = normalized_deps(story);
        let verify = story.verify.as_deref().map(line).filter(|v| !v.is_empty());
        if !deps.is_empty() || verify.is_some() {
            out.push('\n');
        }
        if !deps.is_empty() {
            let _ = writeln!(out, "**Depends on:** {}", deps.join(", "));
        }
        if let Some(v) = verify {
            let _ = writeln!(out, "**Verify:** `{v}`");
        }
    }
    bullets(
        &mut out,
        "Functional Requirements",
        &doc.functional_requirements,
        Some("FR-"),
    );
    bullets(&mut out, "Non-Goals", &doc.non_goals, None);
    if !decisions.is_empty() {
        out.push_str("\n## Decisions\n\n");
        for d in decisions {
            let _ = writeln!(out, "- {} → {}", line(&d.question), line(&d.answer));
        }
    }
    bullets(&mut out, "Assumptions", &doc.assumptions, None);
    bullets(&mut out, "Open Questions", &doc.open_questions, None);
    out
}

fn strip_prd_prefix(title: &str) -> &str {
    let t = title.trim();
    match t.get(..4) {
        Some(head) if head.eq_ignore_ascii_case("prd:") => t[4..].trim(),
        _ => t,
    }
}

/// The file name slug of a PRD titled `title`: [`markdown::kebab`].
pub fn slug(title: &str) -> String {
    markdown::kebab(strip_prd_prefix(title))
}

/// The answer to `q` from what the user typed: a letter picks that option, text is the
/// user's own answer, nothing lets the agent decide.
pub fn answer_from_input(q: &Question, input: &str) -> String {
    let input = input.trim();
    if input.is_empty() {
        return "no preference: choose the most sensible option and say so under assumptions"
            .into();
    }
    let mut chars = input.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        if c.is_ascii_alphabetic() {
            let index = (c.to_ascii_uppercase() as u8 - b'A') as usize;
            if let Some(option) = q.options.get(index) {
                return option.clone();
            }
        }
    }
    input.to_string()
}

/// `q` as shown on the terminal: `N. question`, then `   A. option` lines.
pub fn show_question(n: usize, q: &Question) -> String {
    let mut out = format!("{n}. {}\n", line(&q.question));
    for (i, option) in q.options.iter().enumerate() {
        let letter = char::from(b'A' + u8::try_from(i).unwrap_or(25));
        let _ = writeln!(out, "   {letter}. {}", line(option));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> PlanDoc {
        serde_json::from_value(json!({
            "title": "PRD: Reverse flag",
            "introduction": "Add a\n--reverse flag.",
            "goals": ["Flip output"],
            "userStories": [
                {"title": "Add reverse()", "description": "As a dev, I want reverse().",
                 "acceptanceCriteria": ["`reverse(\"ab\")` returns `\"ba\"`", "Tests pass"]},
                {"title": "Wire the flag", "description": "",
                 "acceptanceCriteria": ["`textkit --reverse ab` prints `ba`"]}
            ],
            "functionalRequirements": ["FR-1: reverse lines", "keep newlines"],
            "nonGoals": [], "assumptions": ["Characters, not bytes"], "openQuestions": []
        }))
        .unwrap()
    }

    #[test]
    fn rendered_prd_converts_without_a_model() {
        let decisions = [Decision {
            question: "What to flip?".into(),
            answer: "Characters".into(),
        }];
        let text = render(&doc(), &decisions);
        assert!(
            text.starts_with("# PRD: Reverse flag\n\n## Introduction\n\nAdd a --reverse flag.\n")
        );
        assert!(
            text.contains("- FR-1: reverse lines\n- FR-2: keep newlines\n"),
            "{text}"
        );
        assert!(
            text.contains("## Decisions\n\n- What to flip? → Characters\n"),
            "{text}"
        );
        let parsed = markdown::parse(&text, std::path::Path::new("x.md")).unwrap();
        assert_eq!(parsed.title, "Reverse flag");
        assert_eq!(parsed.stories.len(), 2);
        assert_eq!(parsed.stories[1].id, "US-002");
        assert_eq!(
            parsed.stories[1].acceptance_criteria,
            ["`textkit --reverse ab` prints `ba`"]
        );
        assert_eq!(slug("PRD: Reverse flag!"), "reverse-flag");
    }

    #[test]
    fn check_plan_reports_missing_criteria_and_bad_shapes() {
        let mut bad = serde_json::to_value(doc()).unwrap();
        bad["userStories"][1]["acceptanceCriteria"] = json!([" "]);
        let checked = check_plan(&bad, &[]);
        assert!(checked.usable.is_none());
        assert!(checked.problems[0].starts_with("$.userStories[1].acceptanceCriteria"));
        let checked = check_plan(&json!({"title": 3}), &[]);
        assert!(
            checked.problems[0].starts_with("$: invalid type"),
            "{:?}",
            checked.problems
        );
        assert!(check_plan(&serde_json::to_value(doc()).unwrap(), &[])
            .usable
            .is_some());
    }

    /// Each agent reads the prompt of its own style: an agent CLI the example reply, native the
    /// schema's field names, the local model the compact template (no example, no field list,
    /// less prose); the description, the answers, the test command and the rules reach all three.
    #[test]
    fn each_style_gets_its_own_prd_prompt_and_local_gets_the_compact_template() {
        let answers = [Decision {
            question: "What to flip?".into(),
            answer: "Characters".into(),
        }];
        let render = |style| plan_prompt("reverse flag", &answers, Some("make test"), style);
        let (cli, native, local) = (
            render(PromptStyle::Example),
            render(PromptStyle::Schema),
            render(PromptStyle::Compact),
        );
        let example = crate::convert::agent::EXAMPLE_STORY_DESCRIPTION;
        assert!(
            cli.contains(example) && cli.contains("in this shape"),
            "{cli}"
        );
        assert!(!native.contains(example), "{native}");
        assert!(
            native.contains("the fields of the JSON schema that comes with this request"),
            "{native}"
        );
        assert!(!local.contains(example), "{local}");
        assert!(!local.contains("that comes with this request"), "{local}");
        assert!(
            local.contains("follows the JSON schema of this request"),
            "{local}"
        );
        assert!(
            local.len() < native.len(),
            "compact: {} vs {}",
            local.len(),
            native.len()
        );
        for (name, p) in [("cli", &cli), ("native", &native), ("local", &local)] {
            assert!(p.contains("reverse flag"), "{name}: {p}");
            assert!(p.contains("- What to flip? → Characters"), "{name}: {p}");
            assert!(p.contains("`make test`"), "{name}: {p}");
            assert!(
                p.contains("Never \"works correctly\""),
                "{name}: the rules: {p}"
            );
        }
        // Without answers, the agent is told to write its assumptions down.
        let alone = plan_prompt("reverse flag", &[], None, PromptStyle::Compact);
        assert!(alone.contains("write it under `assumptions`"), "{alone}");
        assert!(
            alone.contains("`verify` is a one-line shell command"),
            "{alone}"
        );
        // The questions: an example only for the agent CLIs.
        let asked = questions_prompt("reverse flag", PromptStyle::Example);
        assert!(asked.contains("Which notes can be exported?"), "{asked}");
        for style in [PromptStyle::Schema, PromptStyle::Compact] {
            let asked = questions_prompt("reverse flag", style);
            assert!(!asked.contains("Which notes can be exported?"), "{asked}");
            assert!(
                asked.contains("Ask the 3 to 5 clarifying questions"),
                "{asked}"
            );
        }
    }

    #[test]
    fn answers_by_letter_text_or_nothing() {
        let q = Question {
            question: "Q?".into(),
            options: vec!["One".into(), "Two".into()],
        };
        assert_eq!(answer_from_input(&q, "b\n"), "Two");
        assert_eq!(answer_from_input(&q, "z"), "z");
        assert_eq!(answer_from_input(&q, "my own"), "my own");
        assert!(answer_from_input(&q, "").starts_with("no preference"));
        assert_eq!(show_question(2, &q), "2. Q?\n   A. One\n   B. Two\n");
        let checked = check_questions(&json!({"questions": [
            {"question": "a", "options": ["x", "y"]}, {"question": " ", "options": []}]}));
        assert_eq!(checked.usable.unwrap().len(), 1);
    }
}
