//! `ralph init --skills claude|amp|codex`: ralph's PRD-writing and conversion skills written
//! where each agent CLI reads project skills, never over existing files, and consistent with
//! what `ralph validate` and `ralph convert` accept.

use std::path::Path;

use crate::common::{prd_with_stories, text, TestEnv};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The body of the first fenced block of `lang` in `text`.
fn fenced<'a>(text: &'a str, lang: &str) -> &'a str {
    let open = format!("```{lang}\n");
    let start = text.find(&open).unwrap_or_else(|| panic!("no {open}")) + open.len();
    let len = text[start..].find("\n```").expect("closing fence");
    &text[start..start + len + 1]
}

#[test]
fn init_skills_writes_both_skills_where_each_cli_reads_them() {
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env.ralph(&["init", "--dir", "fresh", "--skills", "claude,codex"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let fresh = env.path("fresh");
    for rel in [
        "prd.json",
        "ralph.toml",
        ".claude/skills/ralph-prd/SKILL.md",
        ".claude/skills/ralph-convert/SKILL.md",
        ".agents/skills/ralph-prd/SKILL.md",
        ".agents/skills/ralph-convert/SKILL.md",
    ] {
        assert!(fresh.join(rel).is_file(), "{rel}: {}", text(&out));
        assert!(
            stdout(&out).contains(&format!("wrote fresh/{rel}\n")),
            "{rel}: {}",
            text(&out)
        );
    }
    // The next steps commit the skills with the rest.
    assert!(
        stdout(&out).contains("ralph.toml .claude/skills .agents/skills && git commit"),
        "{}",
        text(&out)
    );
    for name in ["ralph-prd", "ralph-convert"] {
        let claude =
            std::fs::read_to_string(fresh.join(format!(".claude/skills/{name}/SKILL.md"))).unwrap();
        let codex =
            std::fs::read_to_string(fresh.join(format!(".agents/skills/{name}/SKILL.md"))).unwrap();
        assert_eq!(claude, codex, "{name}: one text for every CLI");
        assert!(
            claude.starts_with(&format!("---\nname: {name}\ndescription: ")),
            "{claude}"
        );
        assert!(
            !claude.contains("{{"),
            "{name}: unrendered template\n{claude}"
        );
        // The conversion rules of `ralph convert`'s agent path, word for word.
        assert!(claude.contains("`branchName` is `ralph/` followed by the feature's name"));
        assert!(claude.contains("if you cannot describe the change in 2–3 sentences, split it"));
    }
    let prd_skill =
        std::fs::read_to_string(fresh.join(".claude/skills/ralph-prd/SKILL.md")).unwrap();
    assert!(
        prd_skill.contains("3 to 5 clarifying questions"),
        "{prd_skill}"
    );
    assert!(prd_skill.contains("tasks/prd-"), "{prd_skill}");
    assert!(
        prd_skill.contains("### US-001: <Short title>"),
        "{prd_skill}"
    );
}

#[test]
fn skills_only_adds_the_skills_to_an_initialised_project_and_never_overwrites_them() {
    let env = TestEnv::new(&prd_with_stories(1));
    let prd_before = env.read("prd.json");

    // The starter files are in the way: nothing is written, and the hint names --skills-only.
    let out = env.ralph(&["init", "--skills", "amp"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("prd.json"), "{}", text(&out));
    assert!(stderr(&out).contains("--skills-only"), "{}", text(&out));
    assert!(!env.path(".agents").exists());

    let out = env.ralph(&["init", "--skills", "amp", "--skills-only"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = stdout(&out);
    let wrote: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("wrote "))
        .map(|l| l.rsplit('/').nth(1).unwrap())
        .collect();
    assert_eq!(wrote, ["ralph-prd", "ralph-convert"], "{}", text(&out));
    assert!(env.path(".agents/skills/ralph-prd/SKILL.md").is_file());
    assert!(
        !env.path("ralph.toml").exists(),
        "--skills-only wrote a starter file"
    );
    assert_eq!(env.read("prd.json"), prd_before);
    assert!(
        stdout(&out).contains("git add .agents/skills"),
        "{}",
        text(&out)
    );

    // A second time the skills themselves are in the way: --force, not --skills-only.
    env.write(".agents/skills/ralph-prd/SKILL.md", "mine\n");
    let out = env.ralph(&["init", "--skills", "codex", "--skills-only"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out)
            .contains(".agents/skills/ralph-prd/SKILL.md, .agents/skills/ralph-convert/SKILL.md"),
        "{}",
        text(&out)
    );
    assert!(stderr(&out).contains("--force"), "{}", text(&out));
    assert_eq!(env.read(".agents/skills/ralph-prd/SKILL.md"), "mine\n");
    let out = env.ralph(&["init", "--skills", "codex", "--skills-only", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(env
        .read(".agents/skills/ralph-prd/SKILL.md")
        .starts_with("---\nname: ralph-prd\n"));

    // --skills-only needs --skills; an unknown CLI is a usage error.
    for args in [
        &["init", "--skills-only"][..],
        &["init", "--skills", "vim", "--skills-only"][..],
    ] {
        let out = env.ralph(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
}

#[test]
fn the_skills_examples_are_what_validate_and_convert_accept() {
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env.ralph(&[
        "init",
        "--dir",
        "skills",
        "--skills",
        "claude",
        "--skills-only",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let read =
        |rel: &str| std::fs::read_to_string(Path::new(&env.path("skills")).join(rel)).unwrap();

    // The prd.json the conversion skill shows passes `ralph validate --strict`.
    let example = fenced(&read(".claude/skills/ralph-convert/SKILL.md"), "json").to_owned();
    env.write("example.json", &example);
    let out = env.ralph(&["validate", "--strict", "example.json"]);
    assert_eq!(out.status.code(), Some(0), "{example}\n{}", text(&out));

    // The layout the PRD skill asks for converts without a model.
    // (Filled in: `<Feature name>` becomes `Feature name`, the optional lines and the second
    // story's placeholder are left out.)
    let layout = fenced(&read(".claude/skills/ralph-prd/SKILL.md"), "markdown")
        .split("### US-002")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.contains("<optional"))
        .map(|l| format!("{}\n", l.replace(['<', '>'], "")))
        .collect::<String>();
    env.write("tasks/prd-layout.md", &layout);
    let out = env.ralph(&["convert", "tasks/prd-layout.md", "--out", "layout.json"]);
    assert_eq!(out.status.code(), Some(0), "{layout}\n{}", text(&out));
    assert!(stdout(&out).contains("no model"), "{}", text(&out));
    let converted: serde_json::Value =
        serde_json::from_str(&env.read("layout.json")).expect("layout.json");
    assert_eq!(converted["userStories"][0]["id"], "US-001", "{converted}");
    assert_eq!(
        converted["userStories"][0]["acceptanceCriteria"][1], "Tests pass",
        "{converted}"
    );
}
