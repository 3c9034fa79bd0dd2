//! The deterministic converter: a Markdown PRD in ralph's documented layout → prd.json, with no
//! model. The layout (README.md, "The Markdown PRD layout"):
//!
//! ```markdown
//! # PRD: Reverse flag for textkit
//!
//! ## Introduction
//!
//! One paragraph: what the feature is and why. It becomes prd.json's `description`.
//!
//! ## User Stories
//!
//! ### US-001: Add a reverse helper
//!
//! **Description:** As a user, I want `textkit.reverse(text)` so that I can flip words.
//!
//! **Acceptance Criteria:**
//! - [ ] `reverse("abc") == "cba"`
//! - [ ] Tests pass
//!
//! **Depends on:** US-002
//! **Verify:** `python3 -m unittest discover -s tests -q`
//! ```
//!
//! - The first `#` heading is the title (a leading `PRD:` is dropped); `branchName` is
//!   `ralph/<title in kebab case>`.
//! - The first paragraph after the title, or under an `Introduction`/`Overview` heading, is the
//!   `description`. Optional `Project: NAME` and `Branch: NAME` lines before the first story set
//!   `project` and `branchName`.
//! - A story is a heading (any level from 2) `US-<digits>: Title` (`-` or `—` may replace the
//!   colon); it runs to the next heading of the same or a higher level. Inside it:
//!   `Description:` (or a first plain paragraph), an `Acceptance Criteria` label (a paragraph or a
//!   heading) followed by a list (`- [ ]` task items or plain items), optional `Depends on:` (ids,
//!   separated by commas or spaces; `none` for none) and `Verify:` (a shell command, backticks
//!   dropped). Labels may be bold. Anything else (technical notes, other sections) is ignored.
//! - Priorities follow the dependencies, then document order; every story starts with `passes:
//!   false` and empty `notes`.
//!
//! Everything that breaks the layout is reported at once, each problem with its 1-based line.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use regex::Regex;
use serde_json::Map;

use crate::prd::model::{Prd, Story};

/// One way a Markdown PRD breaks the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

/// A Markdown PRD that does not follow the layout: every problem, each naming its line.
/// `Display` gives `<file>:<line>: <message>` and an indented `hint:` line per problem.
#[derive(Debug, thiserror::Error)]
#[error("{}", render(path, errors))]
pub struct MarkdownErrors {
    /// The Markdown file, as given.
    pub path: PathBuf,
    /// The problems, in line order.
    pub errors: Vec<LayoutError>,
}

fn render(path: &Path, errors: &[LayoutError]) -> String {
    let file = path.display();
    let count = errors.len();
    let noun = if count == 1 { "problem" } else { "problems" };
    let mut out = format!("{file} does not follow ralph's PRD layout ({count} {noun}):");
    for e in errors {
        let _ = write!(
            out,
            "\n{file}:{}: {}\n  hint: {}",
            e.line, e.message, e.hint
        );
    }
    out
}

/// What the Markdown says beyond the stories, before ralph fills in defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedPrd {
    /// The title, without a leading `PRD:`.
    pub title: String,
    /// The introduction's first paragraph ("" when there is none).
    pub description: String,
    /// A `Project:` line's value.
    pub project: Option<String>,
    /// A `Branch:` line's value.
    pub branch: Option<String>,
    /// The stories, in document order, priorities set.
    pub stories: Vec<Story>,
}

impl ParsedPrd {
    /// The prd.json: `project` from the `Project:` line, else `default_project`; `branchName`
    /// from the `Branch:` line, else `ralph/<kebab title>`.
    pub fn into_prd(self, default_project: &str) -> Prd {
        let branch = self
            .branch
            .unwrap_or_else(|| format!("ralph/{}", kebab(&self.title)));
        let description = if self.description.is_empty() {
            self.title.clone()
        } else {
            self.description
        };
        Prd {
            schema: None,
            project: self.project.unwrap_or_else(|| default_project.to_string()),
            branch_name: Some(branch),
            base_branch: None,
            description,
            user_stories: self.stories,
            extra: Map::new(),
            index: Default::default(),
        }
    }
}

static STORY_HEADING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?i:(US-\d+))\s*(?::|\s-\s|\s–\s|\s—\s|-|–|—)\s*(.*)$").expect("valid regex")
});
static LOOKS_LIKE_STORY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(?i)US[-_ ]?\d+").expect("valid regex"));
static STORY_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)^US-\d+$").expect("valid regex"));

/// Whether `text` uses the layout: it has at least one story heading (`## US-001: …` at any
/// level from 2). Free-form Markdown without one goes to the agent path.
pub fn uses_layout(text: &str) -> bool {
    blocks(text).iter().any(|b| match b {
        Block::Heading { level, text, .. } => *level >= 2 && LOOKS_LIKE_STORY.is_match(text),
        _ => false,
    })
}

/// Parses a Markdown PRD in the layout (see the module docs).
///
/// # Errors
/// [`MarkdownErrors`] naming `path` and every problem with its line: no title, a story heading
/// without an id or title, a duplicate id, a story without an acceptance-criteria list, an empty
/// criterion, an unknown or circular dependency, an empty `Verify:`, no story at all.
pub fn parse(text: &str, path: &Path) -> Result<ParsedPrd, MarkdownErrors> {
    let blocks = blocks(text);
    let mut errors = Vec::new();
    let mut title: Option<String> = None;
    let mut description = String::new();
    let mut in_intro = false;
    let mut project = None;
    let mut branch = None;
    let mut drafts: Vec<Draft> = Vec::new();
    let mut story_level = 0usize;
    let mut current: Option<Draft> = None;
    let mut pending_criteria: Option<usize> = None;

    for block in &blocks {
        match block {
            Block::Heading { level, text, line } => {
                if let Some(label_line) = pending_criteria.take() {
                    errors.push(no_list(label_line));
                }
                let starts_story = *level >= 2 && LOOKS_LIKE_STORY.is_match(text);
                if current.is_some() && (starts_story || *level <= story_level) {
                    drafts.extend(current.take());
                }
                if *level == 1 && title.is_none() {
                    let t = strip_prefix_ci(text.trim(), "prd:").trim().to_string();
                    if t.is_empty() {
                        errors.push(LayoutError {
                            line: *line,
                            message: "the title heading is empty".into(),
                            hint: "write the feature's name after `#`, e.g. `# PRD: Reverse flag`"
                                .into(),
                        });
                    }
                    title = Some(t);
                    in_intro = true;
                    continue;
                }
                if starts_story {
                    in_intro = false;
                    story_level = *level;
                    current = Some(story_heading(text, *line, &mut errors));
                    continue;
                }
                if let Some(story) = current.as_mut() {
                    if is_label(text, "acceptance criteria") {
                        pending_criteria = Some(*line);
                        story.criteria_line.get_or_insert(*line);
                    }
                    continue;
                }
                let name = text.trim().trim_end_matches(':').to_lowercase();
                in_intro = drafts.is_empty()
                    && (name.starts_with("introduction") || name.starts_with("overview"));
            }
            Block::Paragraph { lines } => {
                if let Some(label_line) = pending_criteria.take() {
                    errors.push(no_list(label_line));
                }
                match current.as_mut() {
                    Some(story) => {
                        pending_criteria = story_paragraph(story, lines, &mut errors);
                    }
                    None => {
                        let mut rest = Vec::new();
                        for (line, text) in lines {
                            if let Some(v) = label_value(text, "project") {
                                project = Some(v.to_string()).filter(|v| !v.is_empty());
                            } else if let Some(v) = label_value(text, "branch") {
                                branch =
                                    Some(v.trim_matches('`').to_string()).filter(|v| !v.is_empty());
                            } else {
                                rest.push((*line, text.as_str()));
                            }
                        }
                        if in_intro && description.is_empty() && !rest.is_empty() {
                            description = join_lines(rest.iter().map(|(_, t)| *t));
                        }
                    }
                }
            }
            Block::List { items } => {
                let Some(story) = current.as_mut() else {
                    continue;
                };
                if pending_criteria.take().is_none() {
                    continue;
                }
                for (line, item) in items {
                    if item.trim().is_empty() {
                        errors.push(LayoutError {
                            line: *line,
                            message: format!("{}: an empty acceptance criterion", story.id),
                            hint: "write the check on the item, or remove the item".into(),
                        });
                    } else {
                        story.criteria.push(item.trim().to_string());
                    }
                }
                story.has_criteria = true;
            }
        }
    }
    if let Some(label_line) = pending_criteria.take() {
        errors.push(no_list(label_line));
    }
    drafts.extend(current.take());

    let title = match title {
        Some(t) => t,
        None => {
            errors.push(LayoutError {
                line: 1,
                message: "no `# Title` heading".into(),
                hint: "start the PRD with the feature's name, e.g. `# PRD: Reverse flag`".into(),
            });
            String::new()
        }
    };
    if drafts.is_empty() {
        errors.push(LayoutError {
            line: 1,
            message: "no story: no heading reads `### US-001: Title`".into(),
            hint: "write each story as a `### US-001: Title` heading with an `Acceptance \
                   Criteria:` list, or pass --agent to have an agent convert free-form Markdown"
                .into(),
        });
    }
    let stories = finish_stories(drafts, &mut errors);
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.line);
        return Err(MarkdownErrors {
            path: path.to_path_buf(),
            errors,
        });
    }
    Ok(ParsedPrd {
        title,
        description,
        project,
        branch,
        stories,
    })
}

fn no_list(line: usize) -> LayoutError {
    LayoutError {
        line,
        message: "`Acceptance Criteria` is not followed by a list".into(),
        hint: "put the criteria right below it, one `- [ ] …` item each".into(),
    }
}

/// A story while its section is read.
#[derive(Debug)]
struct Draft {
    id: String,
    title: String,
    line: usize,
    description: String,
    criteria: Vec<String>,
    criteria_line: Option<usize>,
    has_criteria: bool,
    depends_on: Vec<(String, usize)>,
    verify: Option<String>,
}

fn story_heading(text: &str, line: usize, errors: &mut Vec<LayoutError>) -> Draft {
    let (id, title) = match STORY_HEADING.captures(text.trim()) {
        Some(c) => (
            c[1].to_uppercase(),
            c.get(2).map_or("", |m| m.as_str()).trim().to_string(),
        ),
        None => {
            errors.push(LayoutError {
                line,
                message: format!(
                    "story heading {:?} does not read `US-001: Title`",
                    text.trim()
                ),
                hint: "write the id as `US-` and digits, then a colon and the title, e.g. `### \
                       US-001: Add a reverse helper`"
                    .into(),
            });
            (String::new(), String::new())
        }
    };
    if !id.is_empty() && title.is_empty() {
        errors.push(LayoutError {
            line,
            message: format!("{id} has no title"),
            hint: format!("write a short title after the colon: `### {id}: Add …`"),
        });
    }
    Draft {
        id,
        title,
        line,
        description: String::new(),
        criteria: Vec::new(),
        criteria_line: None,
        has_criteria: false,
        depends_on: Vec::new(),
        verify: None,
    }
}

/// Reads one paragraph inside a story; returns the line of an `Acceptance Criteria` label that
/// still waits for its list.
fn story_paragraph(
    story: &mut Draft,
    lines: &[(usize, String)],
    errors: &mut Vec<LayoutError>,
) -> Option<usize> {
    let mut pending = None;
    let mut in_description = false;
    for (line, text) in lines {
        let text = text.trim();
        if let Some(v) = label_value(text, "description") {
            story.description = v.to_string();
            in_description = true;
        } else if let Some(v) = label_value(text, "depends on") {
            in_description = false;
            for id in v
                .split([',', ' ', ';'])
                .map(|s| s.trim().trim_matches('`'))
                .filter(|s| !s.is_empty())
            {
                if ["none", "-", "—", "n/a", "and"].contains(&id.to_lowercase().as_str()) {
                    continue;
                }
                story.depends_on.push((id.to_uppercase(), *line));
            }
        } else if let Some(v) = label_value(text, "verify") {
            in_description = false;
            let command = v.trim().trim_matches('`').trim().to_string();
            if command.is_empty() {
                errors.push(LayoutError {
                    line: *line,
                    message: format!("{}: `Verify:` has no command", story.id),
                    hint: "write the shell command that exits 0 when the story is done, e.g. \
                           `Verify: `make test``, or remove the line"
                        .into(),
                });
            }
            story.verify = Some(command);
        } else if is_label(text, "acceptance criteria") {
            in_description = false;
            pending = Some(*line);
            story.criteria_line.get_or_insert(*line);
        } else if in_description {
            story.description = join_lines([story.description.as_str(), text]);
        } else if story.description.is_empty() && !story.has_criteria && !text.ends_with(':') {
            story.description = text.to_string();
            in_description = true;
        } else {
            in_description = false;
        }
    }
    pending
}

/// Checks ids, criteria and dependencies, and sets priorities: dependencies first, then
/// document order.
fn finish_stories(drafts: Vec<Draft>, errors: &mut Vec<LayoutError>) -> Vec<Story> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for d in &drafts {
        if d.id.is_empty() {
            continue;
        }
        if let Some(first) = seen.get(&d.id) {
            errors.push(LayoutError {
                line: d.line,
                message: format!("{} is used twice (first on line {first})", d.id),
                hint: "give each story its own id: the next free US-NNN number".into(),
            });
        } else {
            seen.insert(d.id.clone(), d.line);
        }
        if !d.has_criteria {
            let (line, message) = match d.criteria_line {
                Some(l) => (
                    l,
                    format!("{}: the acceptance criteria list is empty", d.id),
                ),
                None => (
                    d.line,
                    format!("{} has no `Acceptance Criteria:` list", d.id),
                ),
            };
            errors.push(LayoutError {
                line,
                message,
                hint: "add `**Acceptance Criteria:**` and below it one `- [ ] …` item per check"
                    .into(),
            });
        }
        for (dep, line) in &d.depends_on {
            if !STORY_ID.is_match(dep) || !drafts.iter().any(|o| &o.id == dep) {
                errors.push(LayoutError {
                    line: *line,
                    message: format!("{} depends on {dep:?}, which is not a story here", d.id),
                    hint: "name the ids of stories in this PRD, e.g. `Depends on: US-001`".into(),
                });
            } else if dep == &d.id {
                errors.push(LayoutError {
                    line: *line,
                    message: format!("{} depends on itself", d.id),
                    hint: "remove its own id from `Depends on:`".into(),
                });
            }
        }
    }
    let order = dependency_order(&drafts, errors);
    let mut priority = vec![0i64; drafts.len()];
    for (rank, &i) in order.iter().enumerate() {
        priority[i] = i64::try_from(rank + 1).unwrap_or(i64::MAX);
    }
    drafts
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut depends_on: Vec<String> = Vec::new();
            for (dep, _) in d.depends_on {
                if !depends_on.contains(&dep) {
                    depends_on.push(dep);
                }
            }
            Story {
                id: d.id,
                title: d.title,
                description: d.description,
                acceptance_criteria: d.criteria,
                priority: priority[i],
                passes: false,
                notes: String::new(),
                depends_on,
                verify: d.verify.filter(|v| !v.is_empty()),
                extra: Map::new(),
            }
        })
        .collect()
}

/// Story indices in priority order: repeatedly the first story (in document order) whose
/// dependencies are all placed. Stories caught in a cycle are reported and placed last.
fn dependency_order(drafts: &[Draft], errors: &mut Vec<LayoutError>) -> Vec<usize> {
    let index: HashMap<&str, usize> = drafts
        .iter()
        .enumerate()
        .rev()
        .map(|(i, d)| (d.id.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            d.depends_on
                .iter()
                .filter_map(|(dep, _)| index.get(dep.as_str()).copied())
                .filter(|&j| j != i)
                .collect()
        })
        .collect();
    let mut placed: HashSet<usize> = HashSet::new();
    let mut order = Vec::new();
    while order.len() < drafts.len() {
        let next = (0..drafts.len())
            .find(|i| !placed.contains(i) && deps[*i].iter().all(|d| placed.contains(d)));
        match next {
            Some(i) => {
                placed.insert(i);
                order.push(i);
            }
            None => {
                let stuck: Vec<usize> = (0..drafts.len()).filter(|i| !placed.contains(i)).collect();
                let ids: Vec<&str> = stuck.iter().map(|&i| drafts[i].id.as_str()).collect();
                let line = stuck.first().map_or(1, |&i| drafts[i].line);
                errors.push(LayoutError {
                    line,
                    message: format!("dependency cycle among {}", ids.join(", ")),
                    hint: "remove one `Depends on:` entry so the stories can run in some order"
                        .into(),
                });
                order.extend(stuck);
            }
        }
    }
    order
}

/// `text` without a case-insensitive `prefix`.
fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> &'a str {
    match text.get(..prefix.len()) {
        Some(head) if head.eq_ignore_ascii_case(prefix) => &text[prefix.len()..],
        _ => text,
    }
}

/// The value after `label:` at the start of `text` (case-insensitive, bold already dropped).
fn label_value<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let rest = strip_prefix_ci(text.trim_start(), label);
    if rest.len() == text.trim_start().len() {
        return None;
    }
    rest.trim_start().strip_prefix(':').map(str::trim)
}

/// Whether `text` is the label `label` alone (`Acceptance Criteria`, with or without a colon).
fn is_label(text: &str, label: &str) -> bool {
    text.trim()
        .trim_end_matches(':')
        .trim()
        .eq_ignore_ascii_case(label)
}

fn join_lines<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    parts
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` in kebab case: ASCII letters and digits kept (lower case), everything else one `-`,
/// at most 50 characters, cut at a hyphen where possible. Empty input gives `feature`.
pub fn kebab(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let mut out = out.trim_end_matches('-').to_string();
    if out.len() > 50 {
        let cut = out[..50].rfind('-').filter(|&i| i >= 20).unwrap_or(50);
        out.truncate(cut);
        out = out.trim_end_matches('-').to_string();
    }
    if out.is_empty() {
        "feature".into()
    } else {
        out
    }
}

/// A block of the document, as far as the layout cares.
#[derive(Debug)]
enum Block {
    Heading {
        level: usize,
        text: String,
        line: usize,
    },
    /// The paragraph's lines (split at line breaks), each with its line number.
    Paragraph { lines: Vec<(usize, String)> },
    /// Every item of a list (nested items too), in order, with its line.
    List { items: Vec<(usize, String)> },
}

/// The document's headings, paragraphs and lists, with inline code kept as `` `code` `` and
/// emphasis dropped.
fn blocks(text: &str) -> Vec<Block> {
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let line_of = |offset: usize| line_starts.partition_point(|&s| s <= offset);
    let mut options = Options::empty();
    options.insert(Options::ENABLE_TASKLISTS);
    let mut out = Vec::new();
    let mut heading: Option<(usize, usize, String)> = None;
    let mut paragraph: Option<Vec<(usize, String)>> = None;
    let mut list_depth = 0usize;
    let mut items: Vec<(usize, String)> = Vec::new();
    // Open list items: index into `items` of each open item, innermost last.
    let mut open_items: Vec<usize> = Vec::new();
    let mut in_code_block = false;

    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        let line = line_of(range.start);
        let in_list = list_depth > 0;
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                heading = Some((heading_level(level), line, String::new()));
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((level, line, text)) = heading.take() {
                    out.push(Block::Heading {
                        level,
                        text: text.trim().to_string(),
                        line,
                    });
                }
            }
            Event::Start(Tag::Paragraph) if list_depth == 0 => {
                paragraph = Some(vec![(line, String::new())]);
            }
            Event::End(TagEnd::Paragraph) if list_depth == 0 => {
                if let Some(lines) = paragraph.take() {
                    let lines: Vec<(usize, String)> = lines
                        .into_iter()
                        .map(|(l, t)| (l, t.trim().to_string()))
                        .filter(|(_, t)| !t.is_empty())
                        .collect();
                    if !lines.is_empty() {
                        out.push(Block::Paragraph { lines });
                    }
                }
            }
            Event::Start(Tag::List(_)) => {
                list_depth += 1;
            }
            Event::End(TagEnd::List(_)) => {
                list_depth = list_depth.saturating_sub(1);
                if list_depth == 0 {
                    out.push(Block::List {
                        items: std::mem::take(&mut items)
                            .into_iter()
                            .map(|(l, t)| (l, t.trim().to_string()))
                            .collect(),
                    });
                    open_items.clear();
                }
            }
            Event::Start(Tag::Item) => {
                items.push((line, String::new()));
                open_items.push(items.len() - 1);
            }
            Event::End(TagEnd::Item) => {
                open_items.pop();
            }
            Event::Start(Tag::CodeBlock(_)) => in_code_block = true,
            Event::End(TagEnd::CodeBlock) => in_code_block = false,
            Event::Text(t) if !in_code_block => {
                push_text(
                    &mut heading,
                    &mut paragraph,
                    &mut items,
                    &open_items,
                    in_list,
                    &t,
                );
            }
            Event::Code(c) => {
                let quoted = format!("`{c}`");
                push_text(
                    &mut heading,
                    &mut paragraph,
                    &mut items,
                    &open_items,
                    in_list,
                    &quoted,
                );
            }
            Event::SoftBreak | Event::HardBreak => {
                if heading.is_some() || in_list {
                    push_text(
                        &mut heading,
                        &mut paragraph,
                        &mut items,
                        &open_items,
                        in_list,
                        " ",
                    );
                } else if let Some(lines) = paragraph.as_mut() {
                    lines.push((line + 1, String::new()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Appends inline text to whatever is open: a heading, the innermost list item, or the
/// paragraph's last line.
fn push_text(
    heading: &mut Option<(usize, usize, String)>,
    paragraph: &mut Option<Vec<(usize, String)>>,
    items: &mut [(usize, String)],
    open_items: &[usize],
    in_list: bool,
    s: &str,
) {
    if let Some((_, _, t)) = heading.as_mut() {
        t.push_str(s);
    } else if let (Some(&i), true) = (open_items.last(), in_list) {
        items[i].1.push_str(s);
    } else if let Some(lines) = paragraph.as_mut() {
        if let Some(last) = lines.last_mut() {
            last.1.push_str(s);
        }
    }
}

fn heading_level(level: HeadingLevel) -> usize {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kebab_cases() {
        assert_eq!(
            kebab("PRD: Reverse flag for textkit!"),
            "prd-reverse-flag-for-textkit"
        );
        assert_eq!(kebab("  Crème brûlée  "), "cr-me-br-l-e");
        assert_eq!(kebab("***"), "feature");
        let long = kebab(&"word ".repeat(30));
        assert!(long.len() <= 50 && !long.ends_with('-'), "{long}");
    }

    #[test]
    fn labels() {
        assert_eq!(
            label_value("Depends on: US-001", "depends on"),
            Some("US-001")
        );
        assert_eq!(
            label_value("depends ON : US-001", "depends on"),
            Some("US-001")
        );
        assert_eq!(label_value("Dependencies: x", "depends on"), None);
        assert!(is_label("Acceptance Criteria:", "acceptance criteria"));
        assert!(is_label("acceptance criteria", "acceptance criteria"));
        assert!(!is_label("Acceptance Criteria: x", "acceptance criteria"));
    }

    #[test]
    fn soft_breaks_split_paragraph_lines() {
        let b = blocks("x\n\n**Depends on:** US-001\n**Verify:** `make test`\n");
        match &b[1] {
            Block::Paragraph { lines } => {
                assert_eq!(
                    lines,
                    &[
                        (3, "Depends on: US-001".to_string()),
                        (4, "Verify: `make test`".to_string())
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
