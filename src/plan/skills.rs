//! The skills `ralph init --skills` writes, so that the same PRD flow works inside an agent CLI:
//! `ralph-prd` (write a PRD in ralph's layout after clarifying questions) and `ralph-convert`
//! (turn a PRD into prd.json). Their text is ralph's own and carries the same rules
//! (`templates/plan/rules.md`) and layout (`templates/plan/layout.md`) that `ralph plan` and
//! `ralph convert` use, so a PRD written in the CLI converts without a model.
//!
//! Where each CLI reads project skills (a folder per skill holding `SKILL.md`, with `name` and
//! `description` in its front matter): Claude Code `.claude/skills/`; Amp and the Codex CLI
//! `.agents/skills/`.

use crate::cli::SkillTarget;

/// The `ralph-prd` skill, a minijinja template (`layout`, `rules`).
const PRD_SKILL: &str = include_str!("../../templates/skills/ralph-prd.md");
/// The `ralph-convert` skill, a minijinja template (`rules`, `example`).
const CONVERT_SKILL: &str = include_str!("../../templates/skills/ralph-convert.md");
/// ralph's Markdown PRD layout, as `ralph plan` writes it.
const LAYOUT: &str = include_str!("../../templates/plan/layout.md");

/// The folder, relative to the project root, where `target` reads project skills.
pub fn skills_dir(target: SkillTarget) -> &'static str {
    match target {
        SkillTarget::Claude => ".claude/skills",
        SkillTarget::Amp | SkillTarget::Codex => ".agents/skills",
    }
}

/// The skill files for `targets`, as `(path relative to the project root, content)`, each path
/// once (Amp and Codex share `.agents/skills/`), in the order of `targets`.
pub fn skill_files(targets: &[SkillTarget]) -> Vec<(String, String)> {
    let example = serde_json::to_string_pretty(&serde_json::json!({
        "project": "notes-app",
        "branchName": "ralph/notes-export",
        "description": "Export notes as Markdown files.",
        "userStories": [{
            "id": "US-001",
            "title": "Export one note",
            "description": "As a user, I want `notes export ID` so that I get that note as a file.",
            "acceptanceCriteria": ["`notes export 3` writes `note-3.md`", "Tests pass"],
            "priority": 1,
            "passes": false,
            "notes": "",
            "dependsOn": [],
            "verify": "npm test"
        }]
    }))
    .unwrap_or_default();
    let env = minijinja::Environment::new();
    let render = |template: &str| {
        env.template_from_str(template)
            .and_then(|t| {
                t.render(minijinja::context! {
                    rules => crate::convert::agent::RULES.trim_end(),
                    layout => LAYOUT.trim_end(),
                    example => example,
                })
            })
            // Built-in templates: an error is a ralph bug; the raw text is still useful.
            .unwrap_or_else(|_| template.to_string())
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for target in targets {
        let dir = skills_dir(*target);
        for (name, template) in [("ralph-prd", PRD_SKILL), ("ralph-convert", CONVERT_SKILL)] {
            let path = format!("{dir}/{name}/SKILL.md");
            if !out.iter().any(|(p, _)| *p == path) {
                let mut text = render(template);
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                out.push((path, text));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cli_gets_both_skills_once_with_the_shared_rules() {
        let files = skill_files(&[SkillTarget::Claude, SkillTarget::Amp, SkillTarget::Codex]);
        let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".claude/skills/ralph-prd/SKILL.md",
                ".claude/skills/ralph-convert/SKILL.md",
                ".agents/skills/ralph-prd/SKILL.md",
                ".agents/skills/ralph-convert/SKILL.md",
            ]
        );
        for (path, text) in &files {
            let name = path.split('/').nth(2).unwrap();
            assert!(
                text.starts_with(&format!("---\nname: {name}\ndescription: ")),
                "{path}"
            );
            assert!(
                text.contains("if you cannot describe the change in 2–3 sentences, split it"),
                "{path}"
            );
            assert!(!text.contains("{{"), "{path}: unrendered");
            // The front matter is YAML that every CLI reads: a plain one-line description
            // (no `: ` or ` #`, which would end or comment the scalar), within the Agent Skills
            // limit of 1024 characters.
            let description = text
                .lines()
                .nth(2)
                .and_then(|l| l.strip_prefix("description: "))
                .unwrap();
            assert!(
                !description.contains(": ") && !description.contains(" #"),
                "{path}"
            );
            assert!(description.len() <= 1024, "{path}");
            assert_eq!(text.lines().nth(3), Some("---"), "{path}");
        }
        assert!(files[0].1.contains("### US-001: <Short title>"));
        assert!(files[1]
            .1
            .contains("\"branchName\": \"ralph/notes-export\""));
    }
}
