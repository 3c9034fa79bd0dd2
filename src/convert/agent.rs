//! The agent path of `ralph convert`: free-form Markdown → prd.json through one agent session per
//! attempt.
//!
//! The prompt (`templates/plan/convert_prompt.md`) carries the conversion rules
//! (`templates/plan/rules.md`, the same text the skills of `ralph init --skills` use), the project
//! name, the project's test command when ralph can tell it ([`crate::ask::facts`]), an example
//! of the reply, and the Markdown. Native and local backends also get [`draft_schema`] as the
//! reply's `response_format`, and a prompt with no example; the local model gets the compact
//! template (`templates/plan/convert_prompt_local.md`). The prompt is rendered for each
//! session's agent ([`PromptStyle`]), so a fallback agent gets its own.
//!
//! Each draft is normalized where the rules leave one right value (`passes: false`, `notes: ""`)
//! and then checked: the schema and semantic rules ([`crate::prd::store::validate_value`]), the
//! linter ([`crate::prd::lint::lint_value`], brand-new), and the conversion rules the schema
//! cannot say (ids `US-001`…, `branchName` under `ralph/`). Schema problems make a draft unusable;
//! lint and rule findings are fed back too, but a draft with only those can be written, with
//! them as warnings, once the attempts run out.

use std::path::Path;

use serde_json::{json, Value};

use crate::ask::{self, Asker, Checked, Loop, PromptStyle, Settled};
use crate::output::Outputs;
use crate::prd::lint::{self, LintOptions};
use crate::prd::model::Prd;
use crate::prd::store;

/// The conversion rules, shared with the skills of `ralph init --skills`.
pub const RULES: &str = include_str!("../../templates/plan/rules.md");
const PROMPT: &str = include_str!("../../templates/plan/convert_prompt.md");
/// The compact prompt of the local model ([`PromptStyle::Compact`]).
const PROMPT_LOCAL: &str = include_str!("../../templates/plan/convert_prompt_local.md");

/// The JSON Schema of a draft prd.json as the agent should write it: every field ralph writes,
/// all required except `dependsOn` and `verify`, no others; lists kept short (at most 10
/// stories of at most 8 criteria) so that a small model's grammar-bound reply stays bounded.
pub fn draft_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "project": {"type": "string"},
            "branchName": {"type": "string"},
            "description": {"type": "string"},
            "userStories": {
                "type": "array", "minItems": 1, "maxItems": 10,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "title": {"type": "string"},
                        "description": {"type": "string"},
                        "acceptanceCriteria": {
                            "type": "array", "minItems": 1, "maxItems": 8,
                            "items": {"type": "string"}
                        },
                        "priority": {"type": "integer"},
                        "passes": {"type": "boolean"},
                        "notes": {"type": "string"},
                        "dependsOn": {"type": "array", "items": {"type": "string"}},
                        "verify": {"type": "string"}
                    },
                    "required": ["id", "title", "description", "acceptanceCriteria", "priority",
                                 "passes", "notes"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["project", "branchName", "description", "userStories"],
        "additionalProperties": false
    })
}

/// The story description of the example replies in the prompts of `ralph convert` and `ralph
/// plan`: a draft with this very sentence copied the example instead of converting the PRD.
pub const EXAMPLE_STORY_DESCRIPTION: &str =
    "As a user, I want `notes export ID` so that I get that note as a file.";

/// The example reply shown in the prompt; its story carries `dependsOn` and, when ralph knows
/// the project's test command, that command as `verify`, so that the agent sees where both go.
fn example(project: &str, test_command: Option<&str>) -> String {
    // Another domain than any real PRD, so that a small model cannot pass it off as the answer.
    let doc = json!({
        "project": project,
        "branchName": "ralph/notes-export",
        "description": "Export notes as Markdown files.",
        "userStories": [{
            "id": "US-001",
            "title": "Export one note",
            "description": EXAMPLE_STORY_DESCRIPTION,
            "acceptanceCriteria": ["`notes export 3` writes `note-3.md`", "Tests pass"],
            "priority": 1,
            "passes": false,
            "notes": "",
            "dependsOn": []
        }]
    });
    let mut doc = doc;
    if let Some(command) = test_command {
        doc["userStories"][0]["verify"] = Value::String(command.to_owned());
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The first prompt for converting `markdown` (read from `source`), written for an agent of
/// `style`: an agent CLI's shows an example reply ([`PromptStyle::Example`]); native's names the
/// schema's fields instead; the local model's is the compact template.
pub fn prompt(
    markdown: &str,
    source: &str,
    project: &str,
    test_command: Option<&str>,
    style: PromptStyle,
) -> String {
    let env = minijinja::Environment::new();
    let template = if style.compact() {
        PROMPT_LOCAL
    } else {
        PROMPT
    };
    let rendered = env.template_from_str(template).and_then(|t| {
        t.render(minijinja::context! {
            rules => RULES.trim_end(),
            project => project,
            test_command => test_command,
            example => style.shows_example().then(|| example(project, test_command)),
            source => source,
            markdown => markdown.trim_end(),
        })
    });
    // The template is built in; a rendering error is a ralph bug, and the plain parts still work.
    rendered.unwrap_or_else(|e| format!("{}\n\n{e}\n\nPRD:\n\n{markdown}", RULES.trim_end()))
}

/// Converts `markdown` (from `source`) with the agent behind `asker`, at most `attempts`
/// sessions; the last draft is saved to `draft_path` when none is usable.
///
/// # Errors
/// A failed agent session; no usable draft after the last attempt (naming `draft_path`).
pub async fn convert(
    asker: &Asker,
    markdown: &str,
    source: &Path,
    project: &str,
    attempts: u32,
    draft_path: &Path,
    out: &mut Outputs,
) -> anyhow::Result<Settled<Prd>> {
    let test_command = ask::facts::test_command(asker.root());
    let source = source.display().to_string();
    // Rendered for each session's agent: a fallback agent after a limit gets its own prompt.
    let first =
        |style: PromptStyle| prompt(markdown, &source, project, test_command.as_deref(), style);
    let schema = draft_schema();
    let settings = Loop {
        prompt: &first,
        schema: &schema,
        key: "userStories",
        max_attempts: attempts,
        draft_path: draft_path.to_path_buf(),
        what: "prd.json",
    };
    ask::ask_until_valid(asker, &settings, out, check).await
}

/// Checks one draft (see the module docs).
pub fn check(draft: &Value) -> Checked<Prd> {
    let mut value = draft.clone();
    normalize(&mut value);
    // A dependency on the story itself or on a later one (the stories are in build order) goes
    // back to the agent; the draft stays usable without it, so that a weak model's stray edge
    // (a self-loop, a cycle through a later story) is a warning when the attempts run out, not
    // a lost conversion.
    let forward = drop_forward_dependencies(&mut value);
    let mut problems: Vec<String> = store::validate_value(&value)
        .into_iter()
        .map(|v| format!("{}: {} (fix: {})", v.json_path, v.message, v.hint))
        .collect();
    let usable = if problems.is_empty() {
        serde_json::from_value::<Prd>(value.clone()).ok()
    } else {
        None
    };
    problems.extend(forward);
    problems.extend(
        lint::lint_value(&value, &LintOptions { brand_new: true })
            .into_iter()
            .map(|f| {
                format!(
                    "{}: {} [{}] (fix: {})",
                    f.json_path, f.message, f.rule, f.hint
                )
            }),
    );
    problems.extend(rule_findings(&value));
    problems.extend(copied_example(&value));
    problems.extend(placeholders(&value));
    Checked { usable, problems }
}

/// The rules' placeholders (`[user]`, `[feature]`, `[benefit]`) left in a story's title,
/// description or criteria, one problem each: the agent copied the rule instead of filling it in.
pub fn placeholders(value: &Value) -> Vec<String> {
    const HOLES: &[&str] = &["[user]", "[feature]", "[benefit]"];
    let stories = value
        .get("userStories")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, story) in stories.iter().enumerate() {
        let mut fields: Vec<(String, &str)> = ["title", "description"]
            .iter()
            .filter_map(|f| Some((format!(".{f}"), story.get(*f)?.as_str()?)))
            .collect();
        if let Some(criteria) = story.get("acceptanceCriteria").and_then(Value::as_array) {
            fields.extend(
                criteria
                    .iter()
                    .enumerate()
                    .filter_map(|(j, c)| Some((format!(".acceptanceCriteria[{j}]"), c.as_str()?))),
            );
        }
        for (path, text) in fields {
            let lower = text.to_lowercase();
            if let Some(hole) = HOLES.iter().find(|h| lower.contains(*h)) {
                out.push(format!(
                    "$.userStories[{i}]{path}: holds the placeholder {hole} (fix: write what the \
                     PRD says there, in its own words)"
                ));
            }
        }
    }
    out
}

/// Removes from each story's `dependsOn` the ids of itself and of the stories listed after it,
/// returning one problem (JSON path, what, fix) per removed id. Unknown ids are left for the
/// schema's checks.
fn drop_forward_dependencies(value: &mut Value) -> Vec<String> {
    let Some(stories) = value.get_mut("userStories").and_then(Value::as_array_mut) else {
        return Vec::new();
    };
    let ids: Vec<Option<String>> = stories
        .iter()
        .map(|s| s.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let mut problems = Vec::new();
    for (i, story) in stories.iter_mut().enumerate() {
        let Some(deps) = story.get_mut("dependsOn").and_then(Value::as_array_mut) else {
            continue;
        };
        let mut j = 0;
        deps.retain(|dep| {
            let at = j;
            j += 1;
            let Some(dep) = dep.as_str() else {
                return true;
            };
            let later = ids[i..].iter().any(|id| id.as_deref() == Some(dep));
            if later {
                problems.push(format!(
                    "$.userStories[{i}].dependsOn[{at}]: {dep:?} is this story or a later one \
                     (fix: list the stories in the order they are built and name only earlier \
                     ones in dependsOn)"
                ));
            }
            !later
        });
    }
    problems
}

/// A finding for each story copied from the prompt's example reply (see
/// [`EXAMPLE_STORY_DESCRIPTION`]): a small model's habit, which would send the loop off to
/// build the example's feature.
pub fn copied_example(value: &Value) -> Vec<String> {
    value
        .get("userStories")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, story)| {
            story
                .get("description")
                .and_then(Value::as_str)
                .map(str::trim)
                == Some(EXAMPLE_STORY_DESCRIPTION)
        })
        .map(|(i, _)| {
            format!(
                "$.userStories[{i}]: copied from the example in the prompt, not written from \
                 this PRD (fix: write the stories of the PRD you were given, in its own words)"
            )
        })
        .collect()
}

/// Sets what the rules fix to one value: `passes: false` and `notes: ""` on every story.
fn normalize(value: &mut Value) {
    if let Some(stories) = value.get_mut("userStories").and_then(Value::as_array_mut) {
        for story in stories.iter_mut().filter_map(Value::as_object_mut) {
            story.insert("passes".into(), Value::Bool(false));
            story.insert("notes".into(), Value::String(String::new()));
        }
    }
}

/// The conversion rules the schema and the linter do not check: ids `US-001`, `US-002`, … in
/// order, and `branchName` under `ralph/`.
fn rule_findings(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(branch) = value.get("branchName").and_then(Value::as_str) {
        if !branch.starts_with("ralph/") {
            out.push(format!(
                "$.branchName: {branch:?} does not start with \"ralph/\" (fix: use \"ralph/\" and \
                 the feature's name in kebab case, e.g. \"ralph/notes-export\")"
            ));
        }
    }
    let stories = value
        .get("userStories")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, story) in stories.iter().enumerate() {
        let want = format!("US-{:03}", i + 1);
        if let Some(id) = story.get("id").and_then(Value::as_str) {
            if id != want {
                out.push(format!(
                    "$.userStories[{i}].id: {id:?} should be {want:?} (fix: number the stories \
                     US-001, US-002, … in order, and update dependsOn to match)"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_cycle_through_a_later_story_is_fed_back_and_dropped() {
        // Through `check`: the draft stays usable, the problem goes back to the agent.
        let cyclic = json!({
            "project": "p", "branchName": "ralph/x", "description": "d",
            "userStories": [
                {"id": "US-001", "title": "a", "description": "As a user, I want a.",
                 "acceptanceCriteria": ["`a()` returns 1"], "priority": 1,
                 "passes": false, "notes": "", "dependsOn": ["US-002"]},
                {"id": "US-002", "title": "b", "description": "As a user, I want b.",
                 "acceptanceCriteria": ["`b()` returns 2"], "priority": 2,
                 "passes": false, "notes": "", "dependsOn": ["US-001"]}
            ]
        });
        let checked = check(&cyclic);
        let prd = checked.usable.expect("usable without the forward edge");
        assert!(prd.user_stories[0].depends_on.is_empty());
        assert!(
            checked
                .problems
                .iter()
                .any(|p| p.starts_with("$.userStories[0].dependsOn[0]: \"US-002\"")),
            "{:?}",
            checked.problems
        );
        let mut draft = json!({"userStories": [
            {"id": "US-001", "dependsOn": ["US-002", "US-001"]},
            {"id": "US-002", "dependsOn": ["US-001", "US-009"]}
        ]});
        let problems = drop_forward_dependencies(&mut draft);
        assert_eq!(draft["userStories"][0]["dependsOn"], json!([]));
        // An earlier story stays; an unknown id is left for the schema's check to name.
        assert_eq!(
            draft["userStories"][1]["dependsOn"],
            json!(["US-001", "US-009"])
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("$.userStories[0].dependsOn[0]: \"US-002\""));
        assert!(problems[1].starts_with("$.userStories[0].dependsOn[1]: \"US-001\""));
    }

    #[test]
    fn a_schema_error_is_unusable_and_lint_findings_are_reported_too() {
        let draft = json!({
            "project": "p", "branchName": "ralph/x", "description": "d",
            "userStories": [
                {"id": "US-001", "title": "a", "description": "d",
                 "acceptanceCriteria": ["It works correctly"], "priority": "high",
                 "passes": true, "notes": "x"}
            ]
        });
        let checked = check(&draft);
        assert!(checked.usable.is_none());
        let text = checked.problems.join("\n");
        assert!(
            text.contains("$.userStories[0].priority: expected an integer"),
            "{text}"
        );
        assert!(text.contains("[vague-criterion]"), "{text}");
        assert!(!text.contains("new-prd-passing"), "normalized: {text}");
    }

    #[test]
    fn a_copy_of_the_example_is_usable_but_fed_back_and_schema_sessions_see_no_example() {
        let draft: Value = serde_json::from_str(&example("demo", Some("make test"))).unwrap();
        let checked = check(&draft);
        assert!(checked.usable.is_some());
        assert_eq!(
            checked.problems,
            [
                "$.userStories[0]: copied from the example in the prompt, not written from this \
              PRD (fix: write the stories of the PRD you were given, in its own words)"
            ]
        );
        let with = prompt("# T\n\ntext", "x.md", "demo", None, PromptStyle::Example);
        assert!(with.contains(EXAMPLE_STORY_DESCRIPTION), "{with}");
        let without = prompt("# T\n\ntext", "x.md", "demo", None, PromptStyle::Schema);
        assert!(!without.contains(EXAMPLE_STORY_DESCRIPTION), "{without}");
        assert!(
            without.contains("the JSON schema that comes with this request"),
            "{without}"
        );
    }

    /// The local model gets the compact template: the rules, the project, the test command and
    /// the PRD, with neither an example nor the full prompt's prose.
    #[test]
    fn the_local_model_gets_the_compact_convert_prompt() {
        let render = |style| prompt("# T\n\nfree text", "x.md", "demo", Some("make test"), style);
        let (native, local) = (render(PromptStyle::Schema), render(PromptStyle::Compact));
        assert!(!local.contains(EXAMPLE_STORY_DESCRIPTION), "{local}");
        assert!(!local.contains("that comes with this request"), "{local}");
        assert!(
            local.contains("follows the JSON schema of this request"),
            "{local}"
        );
        assert!(local.contains(RULES.trim_end()), "{local}");
        assert!(
            local.contains("\"demo\"") && local.contains("`make test`"),
            "{local}"
        );
        assert!(local.contains("PRD (x.md):\n\n# T\n\nfree text"), "{local}");
        assert!(
            local.len() < native.len(),
            "compact: {} vs {}",
            local.len(),
            native.len()
        );
        assert_eq!(
            [
                crate::protocol::AgentKind::Local,
                crate::protocol::AgentKind::Native,
                crate::protocol::AgentKind::Claude,
                crate::protocol::AgentKind::Exec,
            ]
            .map(PromptStyle::for_agent),
            [
                PromptStyle::Compact,
                PromptStyle::Schema,
                PromptStyle::Example,
                PromptStyle::Example
            ]
        );
    }

    #[test]
    fn a_placeholder_of_the_rules_left_in_a_story_is_fed_back() {
        let filled = json!({"userStories": [{"title": "t",
            "description": "As a [user], I want [feature] so that [benefit].",
            "acceptanceCriteria": ["ok", "the [Feature] works"]}]});
        assert_eq!(
            placeholders(&filled),
            [
                "$.userStories[0].description: holds the placeholder [user] (fix: write what \
                 the PRD says there, in its own words)",
                "$.userStories[0].acceptanceCriteria[1]: holds the placeholder [feature] (fix: \
                 write what the PRD says there, in its own words)"
            ]
        );
    }

    #[test]
    fn a_clean_draft_is_usable_without_problems() {
        let draft = json!({
            "project": "p", "branchName": "ralph/x", "description": "d",
            "userStories": [
                {"id": "US-001", "title": "a", "description": "As a user, I want a.",
                 "acceptanceCriteria": ["`a()` returns 1", "Tests pass"], "priority": 1,
                 "passes": false, "notes": ""}
            ]
        });
        let checked = check(&draft);
        assert!(checked.problems.is_empty(), "{:?}", checked.problems);
        assert_eq!(checked.usable.unwrap().user_stories[0].id, "US-001");
        let p = prompt(
            "# Title\n\nfree text",
            "x.md",
            "demo",
            Some("make test"),
            PromptStyle::Example,
        );
        assert!(p.contains("`make test`") && p.contains("\"demo\"") && p.contains("free text"));
        // The example shows where the check goes: the project's test command as `verify`.
        assert!(p.contains("\"verify\": \"make test\""), "{p}");
        assert!(p.contains("if you cannot describe the change in 2–3 sentences"));
    }
}
