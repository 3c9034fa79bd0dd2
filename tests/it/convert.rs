//! `ralph convert`, as a user runs it: Markdown PRDs in ralph's layout to prd.json with no model
//! (a table of fixtures, snapshot-tested, each round-tripped through `ralph validate`), layout
//! errors naming their lines, the rules for replacing an existing prd.json, and the agent path
//! for free-form Markdown against the scripted model server: a first draft with a schema error
//! and a vague criterion, the feedback request ralph sends, the corrected draft written; and a
//! model that never answers with JSON, which makes ralph give up with the draft kept.

use std::path::Path;

use ralph::protocol::ProviderKind;
use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::support_llm::{ScriptedLlm, ScriptedReply, SCRIPTED_API_KEY};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/convert");

/// A repository without a prd.json.
fn empty_env() -> TestEnv {
    let env = TestEnv::new(&prd_with_stories(1));
    env.git(&["rm", "-q", "prd.json"]);
    env.git(&["commit", "-qm", "no prd yet"]);
    env
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn layout_prds_convert_without_a_model_and_validate() {
    for name in ["skill-layout", "plain-labels", "checked-items"] {
        let env = empty_env();
        let md = Path::new(FIXTURES).join(format!("{name}.md"));
        env.write("tasks/prd.md", &std::fs::read_to_string(&md).unwrap());
        let out = env.ralph(&["convert", "tasks/prd.md"]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(
            stdout(&out).starts_with(
                "✓ wrote prd.json: 2 stories from tasks/prd.md (ralph's PRD layout, no model)\n"
            ) || name == "checked-items",
            "{name}: {}",
            text(&out)
        );
        assert_eq!(env.agent_calls(), 0, "{name}: no agent runs on this path");
        insta::assert_snapshot!(format!("convert_{name}"), env.read("prd.json"));
        let valid = env.ralph(&["validate", "prd.json"]);
        assert!(valid.status.success(), "{name}: {}", text(&valid));
        assert!(stdout(&valid).starts_with("✓ prd.json is valid"), "{name}");
    }
}

/// The example of README.md's "The Markdown PRD layout" converts as the README says, with no
/// model, to a prd.json that passes `ralph validate --strict`.
#[test]
fn the_readme_layout_example_converts_as_documented() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("### The Markdown PRD layout")
        .nth(1)
        .expect("README section 'The Markdown PRD layout'");
    let start = section.find("```markdown\n").expect("a markdown block") + "```markdown\n".len();
    let example = &section[start..start + section[start..].find("\n```").unwrap() + 1];
    let env = empty_env();
    env.write("tasks/prd-reverse-flag.md", example);
    let out = env.ralph(&["convert", "tasks/prd-reverse-flag.md"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout(&out).contains("(ralph's PRD layout, no model)"),
        "{}",
        text(&out)
    );
    let prd = env.prd();
    assert_eq!(prd["branchName"], "ralph/reverse-flag-for-textkit", "{prd}");
    assert_eq!(prd["project"], "repo", "the repository's directory name");
    assert_eq!(
        prd["description"],
        "Add a --reverse flag to the textkit command line so that users can flip its output."
    );
    let stories = prd["userStories"].as_array().unwrap();
    assert_eq!(stories.len(), 2, "{prd}");
    assert_eq!(stories[1]["dependsOn"], json!(["US-001"]));
    assert_eq!(
        stories[1]["verify"],
        "python3 -m unittest discover -s tests -q"
    );
    assert_eq!(stories[0]["priority"], 1);
    let valid = env.ralph(&["validate", "--strict"]);
    assert!(valid.status.success(), "{}", text(&valid));
}

#[test]
fn lint_findings_of_a_converted_prd_are_warnings_and_strict_refuses_them() {
    let env = empty_env();
    let md = std::fs::read_to_string(Path::new(FIXTURES).join("checked-items.md")).unwrap();
    env.write("prd.md", &md);
    let out = env.ralph(&["convert", "prd.md", "--strict"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).contains("$.userStories[0].acceptanceCriteria[3]: vague criterion"),
        "{}",
        text(&out)
    );
    assert!(stderr(&out).contains("(--strict)"), "{}", text(&out));
    assert!(
        !env.path("prd.json").exists(),
        "nothing written under --strict"
    );

    let out = env.ralph(&["convert", "prd.md"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains(
            "warning: prd.json: $.userStories[0].acceptanceCriteria[3]: vague criterion \
             \"Works correctly\""
        ),
        "{}",
        text(&out)
    );
    assert!(
        stdout(&out).contains("✓ wrote prd.json: 1 story"),
        "{}",
        text(&out)
    );
}

#[test]
fn malformed_layout_gets_errors_naming_the_line() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "no criteria",
            "# PRD: X\n\n## User Stories\n\n### US-001: First\n\nAs a user, I want x.\n",
            &["PRD.md:5: US-001 has no `Acceptance Criteria:` list"],
        ),
        (
            "label without a list",
            "# X\n\n### US-001: First\n\n**Acceptance Criteria:**\n\nJust words.\n",
            &["PRD.md:5: `Acceptance Criteria` is not followed by a list"],
        ),
        (
            "heading without a title, duplicate id, unknown dependency",
            "# X\n\n### US-001:\n\nAcceptance Criteria:\n- a\n\n### US-001: Again\n\nAcceptance Criteria:\n- b\n\nDepends on: US-009\n",
            &[
                "PRD.md:3: US-001 has no title",
                "PRD.md:8: US-001 is used twice (first on line 3)",
                "PRD.md:13: US-001 depends on \"US-009\", which is not a story here",
            ],
        ),
        (
            "bad story heading and no title heading",
            "Intro only.\n\n## US-1 First story\n\nAcceptance Criteria:\n- a\n",
            &[
                "PRD.md:1: no `# Title` heading",
                "PRD.md:3: story heading \"US-1 First story\" does not read `US-001: Title`",
            ],
        ),
        (
            "dependency cycle and empty verify",
            "# X\n\n### US-001: A\n\nAcceptance Criteria:\n- a\n\nDepends on: US-002\n\n### US-002: B\n\nAcceptance Criteria:\n- b\n\nDepends on: US-001\nVerify:\n",
            &[
                "PRD.md:3: dependency cycle among US-001, US-002",
                "PRD.md:16: US-002: `Verify:` has no command",
            ],
        ),
    ];
    for (what, md, expected) in cases {
        let env = empty_env();
        env.write("PRD.md", md);
        let out = env.ralph(&["convert", "PRD.md"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("PRD.md does not follow ralph's PRD layout"),
            "{what}: {err}"
        );
        for line in *expected {
            assert!(err.contains(line), "{what}: missing {line:?} in\n{err}");
        }
        assert!(!env.path("prd.json").exists(), "{what}: nothing written");
        assert_eq!(env.agent_calls(), 0, "{what}");
    }
}

const SMALL_PRD: &str = "# PRD: Search box\n\n## Introduction\n\nFind notes by title.\n\n## User Stories\n\n### US-001: Search field\n\n**Description:** As a user, I want a search field so that I can find a note.\n\n**Acceptance Criteria:**\n- [ ] Typing `abc` lists only notes whose title contains `abc`\n- [ ] Tests pass\n";

#[test]
fn a_prd_with_open_stories_is_replaced_only_with_force_and_then_archived() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.write(
        "progress.txt",
        "# Ralph Progress Log\nStarted: x\n---\n\n## it 1\nlearned a thing\n",
    );
    env.write("tasks/prd-search.md", SMALL_PRD);
    let before = env.read("prd.json");
    let out = env.ralph(&["convert", "tasks/prd-search.md"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("prd.json has open stories (US-001, US-002); refusing to replace it"),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(env.read("prd.json"), before, "untouched");

    let out = env.ralph(&["convert", "tasks/prd-search.md", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout(&out).contains("archived branch ralph/demo"),
        "{}",
        text(&out)
    );
    let prd = env.prd();
    assert_eq!(prd["branchName"], "ralph/search-box");
    assert_eq!(
        prd["project"], "Demo",
        "the replaced prd.json names the project"
    );
    let archive: Vec<_> = std::fs::read_dir(env.path("archive"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(archive.len(), 1, "{archive:?}");
    let old: Value =
        serde_json::from_str(&std::fs::read_to_string(archive[0].join("prd.json")).unwrap())
            .unwrap();
    assert_eq!(old["branchName"], "ralph/demo");
    assert!(std::fs::read_to_string(archive[0].join("progress.txt"))
        .unwrap()
        .contains("learned a thing"));
    assert!(
        !env.read("progress.txt").contains("learned a thing"),
        "reset"
    );
}

#[test]
fn a_finished_prd_is_archived_and_the_init_template_simply_replaced() {
    let mut done = prd_with_stories(1);
    done["userStories"][0]["passes"] = json!(true);
    let env = TestEnv::new(&done);
    env.write("tasks/prd-search.md", SMALL_PRD);
    let out = env.ralph(&["convert", "tasks/prd-search.md"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.path("archive").is_dir(), "{}", text(&out));

    let env = empty_env();
    let init = env.ralph(&["init"]);
    assert!(init.status.success(), "{}", text(&init));
    env.write("tasks/prd-search.md", SMALL_PRD);
    let out = env.ralph(&["convert", "tasks/prd-search.md"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !env.path("archive").exists(),
        "the untouched template is not archived"
    );
    assert_eq!(env.prd()["userStories"][0]["title"], "Search field");
    assert_eq!(
        env.prd()["project"],
        "repo",
        "the repository's directory name"
    );
}

/// A draft the scripted model writes: `priority` as a word (a schema error) in US-001 and a
/// vague criterion in US-002.
pub(crate) fn bad_draft() -> Value {
    json!({
        "project": "repo",
        "branchName": "ralph/notes-export",
        "description": "Export notes as Markdown files.",
        "userStories": [
            {"id": "US-001", "title": "Export one note",
             "description": "As a user, I want to export a note so that I can keep it.",
             "acceptanceCriteria": ["`notes export 3` writes `note-3.md`", "Tests pass"],
             "priority": "high", "passes": false, "notes": ""},
            {"id": "US-002", "title": "Export all notes",
             "description": "As a user, I want to export every note at once.",
             "acceptanceCriteria": ["Export works correctly"],
             "priority": 2, "passes": false, "notes": "", "dependsOn": ["US-001"]}
        ]
    })
}

pub(crate) fn fixed_draft() -> Value {
    let mut v = bad_draft();
    v["userStories"][0]["priority"] = json!(1);
    v["userStories"][1]["acceptanceCriteria"] = json!([
        "`notes export --all` writes one `note-<id>.md` per note",
        "Tests pass"
    ]);
    v
}

pub(crate) const FREE_FORM: &str = "# Notes export\n\nWe need a way to get notes out of the app. First a single note, then all of them at once, as Markdown files.\n";

fn native_convert(env: &TestEnv, llm: &ScriptedLlm, extra: &[&str]) -> std::process::Output {
    let base = llm.base_url();
    let mut args = vec![
        "convert",
        "notes.md",
        "--agent",
        "native",
        "--model",
        "scripted",
        "--base-url",
        &base,
        "--api-key-env",
        "CONVERT_TEST_KEY",
    ];
    args.extend_from_slice(extra);
    env.ralph_cmd(&args)
        .env("CONVERT_TEST_KEY", SCRIPTED_API_KEY)
        .output()
        .unwrap()
}

#[test]
fn agent_path_feeds_schema_and_lint_problems_back_and_writes_the_corrected_draft() {
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            // A chatty first reply: the JSON is fenced, with words around it.
            ScriptedReply::text(format!(
                "Here is the prd.json:\n```json\n{}\n```\nLet me know!",
                serde_json::to_string_pretty(&bad_draft()).unwrap()
            )),
            ScriptedReply::text(fixed_draft().to_string()),
        ],
    );
    let env = empty_env();
    env.write("notes.md", FREE_FORM);
    let out = native_convert(&env, &llm, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout(&out).contains(
            "✓ wrote prd.json: 2 stories from notes.md (converted by the agent in 2 attempts)"
        ),
        "{}",
        text(&out)
    );
    assert!(
        stderr(&out).contains("prd.json draft 1 has 3 problems; asking again"),
        "{}",
        text(&out)
    );
    let prd = env.prd();
    assert_eq!(prd["userStories"][0]["priority"], 1);
    assert_eq!(prd["userStories"][1]["dependsOn"], json!(["US-001"]));

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    // An answer session: no tools, the draft's schema as response_format, ralph's own
    // system prompt, the rules and the Markdown in the prompt.
    for req in &reqs {
        assert!(req.tool_names().is_empty(), "{:?}", req.tool_names());
        assert_eq!(req.body["response_format"]["type"], "json_schema");
        let schema = &req.body["response_format"]["json_schema"]["schema"];
        assert_eq!(
            schema["required"],
            json!(["project", "branchName", "description", "userStories"])
        );
        assert!(
            req.system_text().contains("You have no tools"),
            "{}",
            req.system_text()
        );
    }
    let first = reqs[0].last_user_text();
    assert!(
        first.contains("We need a way to get notes out of the app"),
        "{first}"
    );
    assert!(first.contains("if you cannot describe the change in 2–3 sentences, split it"));
    assert!(!first.contains("previous reply"), "{first}");
    // The feedback request: the previous reply and each problem with its path and fix.
    let feedback = reqs[1].last_user_text();
    assert!(
        feedback.starts_with(first.trim_end()),
        "the first prompt comes first"
    );
    assert!(
        feedback.contains("## Your previous reply had problems"),
        "{feedback}"
    );
    assert!(
        feedback.contains("\"priority\": \"high\""),
        "the previous reply: {feedback}"
    );
    assert!(
        feedback.contains(
            "- $.userStories[0].priority: expected an integer, got \"high\" (fix: set `priority` \
             to a whole number without quotes; 1 runs first)"
        ),
        "{feedback}"
    );
    assert!(
        feedback.contains(
            "- $.userStories[1].acceptanceCriteria[0]: vague criterion \"Export works correctly\""
        ),
        "{feedback}"
    );
    assert!(
        feedback.contains("[vague-criterion] (fix: say what to observe"),
        "{feedback}"
    );
    assert!(!env.path("prd.draft.json").exists());
}

#[test]
fn a_model_that_never_answers_with_json_gives_up_with_the_draft_kept() {
    let llm = ScriptedLlm::start(ProviderKind::Openai, |_| {
        ScriptedReply::text("I would rather describe the stories in prose: first export one note.")
    });
    let env = TestEnv::new(&prd_with_stories(1));
    let before = env.read("prd.json");
    env.write("notes.md", FREE_FORM);
    let out = native_convert(&env, &llm, &["--attempts", "2", "--force"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the agent did not produce a valid prd.json in 2 attempts"),
        "{err}"
    );
    assert!(err.contains("$: the reply holds no JSON object"), "{err}");
    assert!(
        err.contains("the last draft is saved in prd.draft.json"),
        "{err}"
    );
    assert_eq!(llm.request_count(), 2);
    assert_eq!(
        env.read("prd.draft.json"),
        "I would rather describe the stories in prose: first export one note.\n"
    );
    assert_eq!(env.read("prd.json"), before, "prd.json untouched");
    assert!(!env.path("archive").exists(), "nothing archived");
}

/// claude's usage limit in an answer session (the fake as `claude`), resetting in an hour.
fn claude_limited() -> Value {
    json!([
        {"claude_init": {}},
        {"claude_usage_limit": {"message": "You've hit your session limit", "resets_in_s": 3600}},
        {"exit": 1}
    ])
}

/// codex (the fake as `codex`) answering with `reply` as its final message.
fn codex_answers(reply: &str) -> Value {
    json!([
        {"read_stdin": true},
        {"codex": {"start": {}}},
        {"codex": {"message": reply}},
        {"codex": {"completed": {}}}
    ])
}

/// The fake's argv of its `n`th run (0-based), joined.
fn fake_argv(env: &TestEnv, n: usize) -> String {
    crate::fallback::argv(env, n).join(" ")
}

/// `ralph convert` on the agent path asks the fallback agent, with its own `[[agents]]` profile,
/// when the primary hits its usage limit; it says so on stderr, and the limit costs no attempt.
#[test]
fn convert_goes_on_with_the_fallback_agent_when_the_primary_is_limited() {
    let env = crate::fallback::env_with(
        1,
        "model = \"opus\"\n\n[[agents]]\nname = \"backup\"\nagent = \"codex\"\nmodel = \"gpt-5-mini\"\n",
    );
    env.write("notes.md", FREE_FORM);
    env.script(&json!({"invocations": [
        claude_limited(),
        codex_answers(&fixed_draft().to_string()),
    ]}));
    let out = env.ralph(&["convert", "notes.md", "--out", "new-prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the claude session hit a usage limit")
            && err.contains("trying the next agent, backup (codex)"),
        "{err}"
    );
    assert!(
        stdout(&out).contains("converted by the agent in 1 attempt)"),
        "{}",
        text(&out)
    );
    let written: Value = serde_json::from_str(&env.read("new-prd.json")).unwrap();
    assert_eq!(written["userStories"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        env.agent_calls(),
        2,
        "one claude session, one codex session"
    );
    // Each agent with its own profile: the fallback does not inherit the primary's model.
    let (claude, codex) = (fake_argv(&env, 0), fake_argv(&env, 1));
    assert!(
        claude.contains("opus") && !claude.contains("gpt-5-mini"),
        "{claude}"
    );
    assert!(
        codex.contains("gpt-5-mini") && !codex.contains("opus"),
        "{codex}"
    );
}

/// A conversion that every agent fails (the primary limited, the fallback not logged in) says
/// which agent failed how, and exits 1 without writing prd.json.
#[test]
fn convert_names_each_agent_and_its_failure_when_every_agent_fails() {
    let env = crate::fallback::env_with(1, "");
    env.write("notes.md", FREE_FORM);
    env.script(&json!({"invocations": [
        claude_limited(),
        [
            {"read_stdin": true},
            {"codex": {"start": {}}},
            {"codex": {"failed": "unexpected status 401 Unauthorized: Incorrect API key provided"}},
            {"exit": 1}
        ],
    ]}));
    let out = env.ralph(&[
        "convert",
        "notes.md",
        "--out",
        "new-prd.json",
        "--fallback-agent",
        "codex",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("every agent failed"), "{err}");
    assert!(
        err.contains("claude: the claude session hit a usage limit"),
        "{err}"
    );
    assert!(
        err.contains("codex: the codex session is not logged in"),
        "{err}"
    );
    assert!(!env.path("new-prd.json").exists());
}

/// A native (or local) session answers in one message, so it prints nothing until the reply
/// is complete: a reply slower than `idle_timeout` but within `--timeout` is waited for (a
/// small local model on a busy machine took over 10 minutes for a prd.json, and was cut off by
/// the idle limit with a hint to raise `--timeout`, which was not the limit that fired).
#[test]
fn a_slow_one_message_reply_is_waited_for_up_to_the_timeout_not_the_idle_limit() {
    let llm = ScriptedLlm::sequence(
        ProviderKind::Openai,
        vec![
            ScriptedReply::text(fixed_draft().to_string()).after(std::time::Duration::from_secs(4))
        ],
    );
    let env = empty_env();
    env.write("notes.md", FREE_FORM);
    env.write("ralph.toml", "idle_timeout = \"1s\"\n");
    let out = native_convert(&env, &llm, &["--timeout", "5m"]);
    assert!(out.status.success(), "{}", text(&out));
    let prd: Value = env.prd();
    assert_eq!(
        prd["userStories"].as_array().map(Vec::len),
        Some(2),
        "{prd}"
    );
}

/// An agent CLI that goes silent past ralph.toml's `idle_timeout` is stopped, and the error
/// names that limit and its setting, not `--timeout`.
#[test]
fn a_silent_agent_cli_is_stopped_by_the_idle_limit_and_the_error_names_it() {
    let env = empty_env();
    env.write("notes.md", FREE_FORM);
    env.write("silent.sh", "#!/bin/sh\ncat > /dev/null\nsleep 60\n");
    env.write("ralph.toml", "idle_timeout = \"2s\"\n");
    std::fs::set_permissions(
        env.path("silent.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = env
        .ralph_cmd(&[
            "convert",
            "notes.md",
            "--agent",
            "exec",
            "--agent-cmd",
            "./silent.sh",
            "--timeout",
            "10m",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        err.contains("printed nothing for 2s") && err.contains("idle_timeout"),
        "{err}"
    );
    assert!(!err.contains("raise --timeout"), "{err}");
    assert!(!env.path("prd.json").exists());
}
