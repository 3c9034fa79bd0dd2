//! `--sandbox fs|strict` with the real opencode and gemini CLIs (pinned under `.tools`, see
//! `scripts/install-opencode.sh` and `scripts/install-gemini.sh`) against the scripted model
//! server on loopback: each completes the textkit stories, writes nothing outside the
//! repository but its own state directories, and (strict) reaches only the model server
//! through ralph's egress proxy, no host refused.
//!
//! bwrap and the CLIs are required under `CI=true` (these tests fail without them there).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::support_model::{example_dir, read_jsonl, RunOutput};

/// Every file under `dir` (relative path → size and modification time), skipping the relative
/// prefixes in `skip` (the CLI's own state directories, which it may write by design).
fn files(dir: &Path, skip: &[&str]) -> BTreeMap<String, (u64, Option<std::time::SystemTime>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(dir)
                .expect("under dir")
                .to_string_lossy()
                .into_owned();
            if skip
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.insert(rel, (meta.len(), meta.modified().ok()));
            }
        }
    }
    out
}

/// What changed between two [`files`] snapshots, as readable lines.
fn changes(
    before: &BTreeMap<String, (u64, Option<std::time::SystemTime>)>,
    after: &BTreeMap<String, (u64, Option<std::time::SystemTime>)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => out.push(format!("new {k}")),
            Some(b) if b != v => out.push(format!("changed {k}")),
            _ => {}
        }
    }
    out
}

/// The checks shared by both CLIs: exit 0, every story passed in `mode`, no refused host but
/// those in `may_refuse`, the model server reached, and nothing written under HOME (outside
/// `state`) or the test's TMPDIR.
fn assert_sandboxed_run(
    out: &RunOutput,
    mode: &str,
    may_refuse: &[&str],
    passes: &[(String, bool)],
    ledger: &[Value],
    model_log: &Path,
    written: &[String],
) {
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "{out}");
    assert!(passes.iter().all(|(_, p)| *p), "{passes:?}\n{out}");
    assert_eq!(ledger.len(), 3, "{ledger:#?}");
    for r in ledger {
        assert_eq!(r["outcome"], "story_passed", "{r}");
        assert_eq!(r["sandbox"], mode, "{r}");
        let refused = r["refused_hosts"].as_array().cloned().unwrap_or_default();
        assert!(
            refused
                .iter()
                .all(|h| h.as_str().is_some_and(|h| may_refuse.contains(&h))),
            "a host off the allowlist was tried: {r}"
        );
    }
    let requests = read_jsonl(model_log);
    assert!(
        requests.len() >= 3 && requests.iter().all(|r| r["status"] == 200),
        "{requests:#?}"
    );
    assert!(
        written.is_empty(),
        "--sandbox {mode}: the agent wrote outside the repository and its state directories:\n{}",
        written.join("\n")
    );
}

/// opencode's state directories under HOME (its `SandboxNeeds::state`).
const OPENCODE_STATE: &[&str] = &[
    "home/.config/opencode",
    "home/.local/share/opencode",
    "home/.local/state/opencode",
    "home/.cache/opencode",
];

fn opencode_under(mode: &str) {
    let test = format!("real_opencode_passes_the_textkit_stories_under_sandbox_{mode}");
    if !crate::sandbox::bwrap_or_skip(&test) {
        return;
    }
    let Some(opencode) = crate::real_opencode::opencode_bin_or_skip(&test) else {
        return;
    };
    let fx = crate::real_opencode::Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    // HOME and TMPDIR exist before the run so that a write there shows.
    for d in ["home", "tmp"] {
        std::fs::create_dir_all(fx.sandbox.join(d)).expect("mkdir");
    }
    let before = files(&fx.sandbox, OPENCODE_STATE);
    let out = fx.run_with_model(
        fx.ralph(&opencode, &["--max-iter", "6", "--sandbox", mode]),
        &scenario,
        mode,
    );
    let after = files(&fx.sandbox, OPENCODE_STATE);
    let ledger = read_jsonl(&fx.repo.join(".ralph/ledger.jsonl"));
    // opencode looks its provider package up on the npm registry, which is not on its
    // allowlist (`--allow-host registry.npmjs.org` lets it in): refused, counted, and the
    // bundled provider serves the run.
    let may_refuse: &[&str] = if mode == "strict" {
        &["registry.npmjs.org:443"]
    } else {
        &[]
    };
    assert_sandboxed_run(
        &out,
        mode,
        may_refuse,
        &fx.prd_passes(),
        &ledger,
        &fx.root.join(format!("{mode}-model-log.jsonl")),
        &changes(&before, &after),
    );
    assert!(fx.project_tests().contains("Ran 15 tests"));
    assert_eq!(fx.git(&["status", "--porcelain"]), "");
}

#[test]
fn real_opencode_passes_the_textkit_stories_under_sandbox_fs() {
    opencode_under("fs");
}

#[test]
fn real_opencode_passes_the_textkit_stories_under_sandbox_strict() {
    opencode_under("strict");
}

/// gemini's state directory under HOME (its `SandboxNeeds::state`).
const GEMINI_STATE: &[&str] = &["home/.gemini"];

fn gemini_under(mode: &str) {
    let test = format!("real_gemini_passes_the_textkit_stories_under_sandbox_{mode}");
    if !crate::sandbox::bwrap_or_skip(&test) {
        return;
    }
    let Some(gemini) = crate::real_gemini::gemini_bin_or_skip(&test) else {
        return;
    };
    let fx = crate::real_gemini::Fixture::textkit();
    let scenario = example_dir("textkit").join("scenario.json");
    for d in ["home", "tmp"] {
        std::fs::create_dir_all(fx.sandbox.join(d)).expect("mkdir");
    }
    let before = files(&fx.sandbox, GEMINI_STATE);
    let out = fx.ralph(
        &gemini,
        &scenario,
        &["--max-iter", "6", "--sandbox", mode],
        mode,
    );
    let after = files(&fx.sandbox, GEMINI_STATE);
    assert_sandboxed_run(
        &out,
        mode,
        &[],
        &fx.prd_passes(),
        &fx.ledger(),
        &fx.root.join(format!("{mode}-model-log.jsonl")),
        &changes(&before, &after),
    );
    assert_eq!(fx.git(&["status", "--porcelain"]), "");
}

#[test]
fn real_gemini_passes_the_textkit_stories_under_sandbox_fs() {
    gemini_under("fs");
}

#[test]
fn real_gemini_passes_the_textkit_stories_under_sandbox_strict() {
    gemini_under("strict");
}
