//! The real local model (whichever `--agent local` serves by default), from an idea to a loop
//! that starts: `ralph plan --yes --agent local` on a one-sentence feature for examples/textkit,
//! `ralph convert`, `ralph validate`, then `ralph run` starting on the first story; and the agent
//! path of `ralph convert` on free-form Markdown, which must end in a valid prd.json about the
//! document. The stories a small model writes are printed (with the linter's
//! findings) for the record; the assertions are about what ralph guarantees, not the model's
//! taste. Needs `scripts/setup-local-model.sh`; see tests/it/local.rs for the skip rules.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::common::{text, TestEnv};
use crate::local::{one_model_at_a_time, prepared_or_skip};

/// A copy of examples/textkit as a repository with no prd.json yet (a new feature).
fn textkit_env() -> TestEnv {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/textkit");
    let env = TestEnv::new(&serde_json::json!({}));
    env.git(&["rm", "-q", "prd.json"]);
    for rel in [
        "README.md",
        "textkit/__init__.py",
        "tests/__init__.py",
        "tests/test_package.py",
    ] {
        env.write(rel, &std::fs::read_to_string(example.join(rel)).unwrap());
    }
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "textkit"]);
    env
}

fn local(env: &TestEnv, args: &[&str]) -> Output {
    env.ralph_cmd(args)
        .env("RALPH_CACHE_DIR", ralph::local::cache_dir())
        .output()
        .unwrap()
}

#[test]
fn local_model_plans_a_textkit_feature_that_converts_validates_and_runs() {
    if prepared_or_skip(
        "local_model_plans_a_textkit_feature_that_converts_validates_and_runs",
        ralph::local::BuiltinModel::Small,
    )
    .is_none()
    {
        return;
    }
    // One model server at a time (see `one_model_at_a_time`): two on 2 cores slow each other
    // down many times over, which made the end-to-end tests time out now and then.
    let _one = one_model_at_a_time();
    let env = textkit_env();
    let started = std::time::Instant::now();
    let out = local(
        &env,
        &[
            "plan",
            "add a --reverse flag to textkit's CLI",
            "--yes",
            "--agent",
            "local",
            "--local-model",
            "small",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let tasks: Vec<_> = std::fs::read_dir(env.path("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let md_rel = format!("tasks/{}", tasks[0].file_name().unwrap().to_string_lossy());
    let md = env.read(&md_rel);
    eprintln!(
        "--- the local model's PRD ({:.0} s) ---\n{md}",
        started.elapsed().as_secs_f64()
    );

    // ralph rendered the PRD in its layout: convert needs no model.
    let conv = env.ralph(&["convert", &md_rel]);
    assert!(conv.status.success(), "{}", text(&conv));
    assert!(
        String::from_utf8_lossy(&conv.stdout).contains("(ralph's PRD layout, no model)"),
        "{}",
        text(&conv)
    );
    let validate = env.ralph(&["validate"]);
    assert!(validate.status.success(), "{}", text(&validate));
    eprintln!(
        "--- prd.json and the linter's findings ---\n{}\n{}",
        env.read("prd.json"),
        String::from_utf8_lossy(&validate.stderr)
    );
    let prd = env.prd();
    let stories = prd["userStories"].as_array().unwrap();
    assert!(!stories.is_empty());
    assert!(prd["branchName"].as_str().unwrap().starts_with("ralph/"));
    assert!(stories.iter().all(|s| s["passes"] == false));

    // The loop starts on it: one iteration on the first story (an agent that does nothing).
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "plan the feature"]);
    let run = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        "true",
        "--max-iter",
        "1",
    ]);
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{}", text(&run));
    assert_eq!(ledger[0]["story_id"], stories[0]["id"], "{}", text(&run));
    assert_eq!(
        env.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        prd["branchName"].as_str().unwrap()
    );
}

/// `ralph convert` of free-form prose with the local default model (1.5B): the conversion
/// works, and its stories are the two helpers the notes ask for. (With the 0.5B model the
/// draft copies the rules' placeholders and repeats stories until the schema's limit: it is
/// no model for conversions, and `ralph convert --agent local` uses the default one.) The
/// prompt is the same bytes for the same notes and project, and the model runs at temperature
/// 0 with a fixed seed, so the reply is the same on every run on this hardware.
#[test]
fn local_model_converts_free_form_markdown_into_the_stories_it_asks_for() {
    if prepared_or_skip(
        "local_model_converts_free_form_markdown_into_the_stories_it_asks_for",
        ralph::local::BuiltinModel::Default,
    )
    .is_none()
    {
        return;
    }
    let _one = one_model_at_a_time();
    let env = textkit_env();
    env.write(
        "notes.md",
        "# Word tools for textkit\n\nWe want two helpers in textkit. First `textkit.words.word_count(text)`, \
         which counts whitespace-separated words (0 for blank text). Then \
         `textkit.words.longest_word(text)`, which returns the longest word (the first one on a \
         tie, \"\" for blank text). Both need unit tests in tests/.\n",
    );
    let out = local(&env, &["convert", "notes.md", "--agent", "local"]);
    eprintln!("--- convert --agent local ---\n{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("converted by the agent"),
        "{}",
        text(&out)
    );
    let validate = env.ralph(&["validate"]);
    assert!(validate.status.success(), "{}", text(&validate));
    let prd: Value = env.prd();
    eprintln!("{prd:#}");
    let stories = prd["userStories"].as_array().unwrap();
    // One story per helper (a story of tests alone may come beside them), none copied from the
    // rules' placeholders, none passing.
    assert!((2..=4).contains(&stories.len()), "{prd}");
    let says = |s: &Value| s.to_string();
    for helper in ["word_count", "longest_word"] {
        assert!(
            stories.iter().any(|s| says(s).contains(helper)),
            "no story names {helper}: {prd}"
        );
    }
    for s in stories {
        assert_eq!(s["passes"], false, "{s}");
        assert!(
            !says(s).contains("[feature]"),
            "a placeholder was copied: {s}"
        );
    }
    assert!(prd["branchName"]
        .as_str()
        .is_some_and(|b| b.starts_with("ralph/")));
    assert!(!env.path("prd.draft.json").exists());
    // A conversion that cannot work says why and keeps the draft: that path has a test with
    // the scripted model (tests/it/convert.rs), where the failure is certain.
}
