//! Iteration integrity (issue 18, items 1, 2 and 4): small exec agents (shell scripts) that cheat
//! must not get a story passed, nor erase ralph's trail.
//!
//! - an agent that only flips `passes` (with or without a `verify`, with
//!   `--verify-marks-passing`) gets no pass;
//! - an agent that runs `git reset --hard HEAD~1` every iteration does not take ralph's
//!   checkpoints, progress entries or earlier passes off the branch;
//! - an agent that commits `git rm -r --cached .` has not made progress;
//! - an agent that rewrites its story's acceptance criteria and sets `passes` gets no pass, and
//!   its proposed text is kept in the ledger.

use std::os::unix::fs::PermissionsExt as _;

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// Writes an exec agent (a `/bin/sh` script) beside the repository and returns its path.
pub(crate) fn agent(env: &TestEnv, body: &str) -> String {
    let path = env.root.path().join("agent.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Shell that saves the prompt as `../prompt-<n>.txt` (n counts the agent's runs) and puts the
/// current story's id in `$id`.
const READ_PROMPT: &str = r#"n=$(( $(cat ../runs 2>/dev/null || echo 0) + 1 )); echo $n > ../runs
cat > ../prompt-$n.txt
id=$(sed -n 's/^Story ID: //p' ../prompt-$n.txt | head -1)
"#;

/// Shell that sets `passes` of story `$id` to true in prd.json (python3, same layout as ralph's).
pub(crate) const FLIP: &str = r#"python3 - "$id" <<'PY'
import json, sys
p = json.load(open('prd.json'))
for s in p['userStories']:
    if s['id'] == sys.argv[1]:
        s['passes'] = True
open('prd.json', 'w').write(json.dumps(p, indent=2) + '\n')
PY
"#;

pub(crate) fn run(env: &TestEnv, agent_cmd: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "--agent", "exec", "--agent-cmd", agent_cmd];
    args.extend_from_slice(extra);
    env.ralph(&args)
}

fn outcomes(env: &TestEnv) -> Vec<String> {
    env.ledger()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn prompt(env: &TestEnv, n: usize) -> String {
    std::fs::read_to_string(env.root.path().join(format!("prompt-{n}.txt"))).unwrap_or_default()
}

pub(crate) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_agent_that_only_flips_passes_gets_no_pass() {
    // No `verify` on the story: the agent's word is all there is, and it wrote nothing.
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(
        &env,
        &format!("{READ_PROMPT}{FLIP}echo 'all done, US-001 passes'\n"),
    );
    let out = run(&env, &cmd, &["--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["premature_claim", "premature_claim"],
        "{}",
        text(&out)
    );
    assert_eq!(env.prd()["userStories"][0]["passes"], false);
    let first = &env.ledger()[0];
    assert_eq!(strings(&first["passes_refused"]), ["US-001"], "{first}");
    assert!(strings(&first["passes_flipped"]).is_empty(), "{first}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("changed nothing but notes"),
        "the ledger says why: {message}"
    );
    // The next attempt is told.
    assert!(
        prompt(&env, 2).contains("changed nothing except notes"),
        "{}",
        prompt(&env, 2)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("complete"), "{}", text(&out));
}

#[test]
fn a_check_that_passes_on_an_unchanged_tree_does_not_mark_the_story() {
    // --verify-marks-passing with a check that already holds: ralph must not mark the story
    // passing for an iteration that did nothing.
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!("test -f README.md");
    let env = TestEnv::new(&prd);
    let cmd = agent(&env, &format!("{READ_PROMPT}echo 'nothing to do'\n"));
    let out = run(
        &env,
        &cmd,
        &["--max-iter", "1", "--verify-marks-passing", "true"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["no_progress"], "{}", text(&out));
    assert_eq!(env.prd()["userStories"][0]["passes"], false);
}

#[test]
fn an_agent_that_commits_its_work_and_flips_passes_still_passes() {
    // The control: commits count as change.
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(
        &env,
        &format!(
            "{READ_PROMPT}echo done > file-1.txt\ngit add file-1.txt && git commit -qm 'feat: US-001'\n{FLIP}"
        ),
    );
    let out = run(&env, &cmd, &["--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(outcomes(&env), ["story_passed"], "{}", text(&out));
    let files = strings(&env.ledger()[0]["files_changed"]);
    assert!(files.contains(&"file-1.txt".to_owned()), "{files:?}");
}

#[test]
fn an_agent_that_resets_every_iteration_does_not_erase_ralphs_trail() {
    let env = TestEnv::new(&prd_with_stories(2));
    // Throws away the last commit (ralph's previous checkpoint), then does its story.
    let cmd = agent(
        &env,
        &format!(
            "{READ_PROMPT}git reset -q --hard HEAD~1 2>/dev/null\necho done > $id.txt\n{FLIP}"
        ),
    );
    let out = run(&env, &cmd, &["--max-iter", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["story_passed", "story_passed"],
        "{}",
        text(&out)
    );
    let ledger = env.ledger();
    let first_checkpoint = ledger[0]["checkpoint_commit"].as_str().unwrap().to_owned();
    // The branch contains ralph's first checkpoint again, and both stories' work.
    env.git(&["merge-base", "--is-ancestor", &first_checkpoint, "HEAD"]);
    for f in ["US-001.txt", "US-002.txt"] {
        assert!(env.path(f).exists(), "{f} is missing");
        env.git(&["cat-file", "-e", &format!("HEAD:{f}")]);
    }
    let prd = env.prd();
    assert_eq!(prd["userStories"][0]["passes"], true, "US-001 stays passed");
    assert_eq!(prd["userStories"][1]["passes"], true);
    // progress.txt on the branch keeps the first iteration's entry.
    let progress = env.git(&["show", "HEAD:progress.txt"]);
    assert!(
        progress.contains("US-001") && progress.contains("US-002"),
        "{progress}"
    );
    // The agent's rewritten history is kept under a ref, named in full.
    let second = &ledger[1];
    let rewrite = &second["history_rewrite"];
    assert_eq!(rewrite["restored"], true, "{second}");
    let run_id = second["run_id"].as_str().unwrap();
    let kept = format!("refs/ralph/{run_id}/2/rewritten");
    assert_eq!(rewrite["kept_at"], json!(kept), "{second}");
    assert_eq!(
        env.git(&["rev-parse", &kept]).trim(),
        rewrite["agent_head"].as_str().unwrap()
    );
    let message = second["message"].as_str().unwrap_or_default();
    assert!(message.contains(&kept), "{message}");
    let log = env.ralph(&["log", "--no-pager"]);
    let log_text = String::from_utf8_lossy(&log.stdout);
    assert!(log_text.contains(&kept), "{log_text}");
}

#[test]
fn removing_every_file_from_the_index_is_not_progress() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(
        &env,
        &format!("{READ_PROMPT}git rm -rq --cached . && git commit -qm 'wipe'\n"),
    );
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(outcomes(&env), ["no_progress"], "{}", text(&out));
    let rec = &env.ledger()[0];
    let files = strings(&rec["files_changed"]);
    // files_changed is what the checkpoint changed against the start.
    let before = rec["head_before"].as_str().unwrap();
    let after = rec["head_after"].as_str().unwrap();
    let diff = env.git(&["diff", "--name-only", before, after]);
    for f in &files {
        assert!(diff.lines().any(|l| l == f), "{f} not in the diff:\n{diff}");
    }
    assert!(!files.contains(&"README.md".to_owned()), "{files:?}");
    env.git(&["cat-file", "-e", "HEAD:README.md"]);
}

#[test]
fn an_agent_that_rewrites_its_criteria_and_sets_passes_gets_no_pass() {
    for guard in ["report", "restore"] {
        let env = TestEnv::new(&prd_with_stories(1));
        // Does some work, weakens the criterion, adds none, sets passes.
        let cmd = agent(
            &env,
            &format!(
                r#"{READ_PROMPT}echo half > file-1.txt
python3 - <<'PY'
import json
p = json.load(open('prd.json'))
p['userStories'][0]['acceptanceCriteria'] = ['file-1.txt may exist']
p['userStories'][0]['passes'] = True
open('prd.json', 'w').write(json.dumps(p, indent=2) + '\n')
PY
"#
            ),
        );
        let out = run(&env, &cmd, &["--max-iter", "2", "--prd-guard", guard]);
        assert_eq!(out.status.code(), Some(3), "{guard}: {}", text(&out));
        assert_eq!(
            outcomes(&env),
            ["premature_claim", "premature_claim"],
            "{guard}: {}",
            text(&out)
        );
        let prd = env.prd();
        assert_eq!(prd["userStories"][0]["passes"], false, "{guard}");
        assert_eq!(
            prd["userStories"][0]["acceptanceCriteria"],
            json!(["file-1.txt exists"]),
            "{guard}: the original criteria are back"
        );
        let rec = &env.ledger()[0];
        assert_eq!(strings(&rec["passes_refused"]), ["US-001"], "{rec}");
        let proposal = &rec["criteria_proposals"][0];
        assert_eq!(proposal["story_id"], "US-001", "{rec}");
        assert_eq!(proposal["original"], json!(["file-1.txt exists"]), "{rec}");
        assert_eq!(
            proposal["proposed"],
            json!(["file-1.txt may exist"]),
            "{rec}"
        );
        // The next attempt works against the original criteria.
        let second = prompt(&env, 2);
        assert!(second.contains("file-1.txt exists"), "{second}");
        assert!(!second.contains("file-1.txt may exist"), "{second}");
        let show = env.ralph(&["show", "1", "--no-pager"]);
        let show_text = String::from_utf8_lossy(&show.stdout);
        assert!(
            show_text.contains("file-1.txt may exist"),
            "{guard}: `ralph show` names the proposal:\n{}",
            text(&show)
        );
    }
}

#[test]
fn marking_passing_after_an_earlier_iteration_did_the_work_is_a_pass() {
    // An agent that wrote the code in one iteration and only set passes in the next (it ran out
    // of turns, say) finishes work that exists: that is not a claim without work.
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(
        &env,
        &format!("{READ_PROMPT}if [ $n = 1 ]; then echo done > file-1.txt; else\n{FLIP}fi\n"),
    );
    let out = run(&env, &cmd, &["--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        outcomes(&env),
        ["progress", "story_passed"],
        "{}",
        text(&out)
    );
}

#[test]
fn a_rewrite_that_changes_the_same_lines_keeps_the_agents_version_and_both_notes() {
    let env = TestEnv::new(&prd_with_stories(2));
    env.write("app.txt", "line1\nline2\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "app"]);
    // Every iteration: throw away ralph's last checkpoint, rewrite the same line, add a note.
    let cmd = agent(
        &env,
        &format!(
            "{READ_PROMPT}git reset -q --hard HEAD~1 2>/dev/null\nprintf \"line1 by $id\\nline2\\n\" > app.txt\necho \"- note on $id\" >> progress.txt\n{FLIP}"
        ),
    );
    let out = run(&env, &cmd, &["--max-iter", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.read("app.txt"), "line1 by US-002\nline2\n");
    let rewrite = &env.ledger()[1]["history_rewrite"];
    assert_eq!(rewrite["restored"], true, "{rewrite}");
    assert_eq!(rewrite["conflicts"], json!(["app.txt"]), "{rewrite}");
    // progress.txt keeps ralph's entry for iteration 1 and both of the agent's notes.
    let progress = env.git(&["show", "HEAD:progress.txt"]);
    for line in [
        "- note on US-001",
        "- note on US-002",
        "(ralph, iteration 1)",
    ] {
        assert!(progress.contains(line), "{line} missing:\n{progress}");
    }
}

/// Shell that deletes every ralph reference, throws away the last two commits and prunes
/// everything no longer reachable (the tester's d1.sh), then does the story's work and commits.
const PRUNE: &str = r#"git for-each-ref refs/ralph --format='delete %(refname)' | git update-ref --stdin
git reset -q --hard HEAD~2 2>/dev/null
git reflog expire --expire=now --all; git gc -q --prune=now 2>/dev/null
echo work > "work-$id.txt"
"#;

#[test]
fn an_agent_that_deletes_ralphs_refs_and_prunes_does_not_leave_ralph_stuck() {
    let env = TestEnv::new(&prd_with_stories(4));
    let cmd = agent(
        &env,
        &format!("{READ_PROMPT}{PRUNE}{FLIP}git add -A; git commit -qm \"w $id\"\necho done\n"),
    );
    let out = run(&env, &cmd, &["--max-iter", "3"]);
    // Every iteration is recorded; none ends the run with an error.
    assert_ne!(out.status.code(), Some(1), "{}", text(&out));
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 3, "{}", text(&out));
    let second = &ledger[1];
    let findings = strings(&second["findings"]).join("\n");
    assert!(
        findings.contains("the agent destroyed history") && findings.contains("could not put back"),
        "the loss is named: {second}"
    );
    let start = second["head_before"].as_str().unwrap_or_default();
    assert!(
        findings.contains(start.get(..12).unwrap_or(start)),
        "the lost start is named: {findings}"
    );
    let log = env.ralph(&["log"]);
    assert!(text(&log).contains("destroyed history"), "{}", text(&log));
    // A later run is not stuck on the pruned start.
    let again = run(&env, &cmd, &["--max-iter", "1"]);
    assert_ne!(again.status.code(), Some(1), "{}", text(&again));
    assert_eq!(env.ledger().len(), 4, "{}", text(&again));
}

#[test]
fn recovery_copes_with_an_in_flight_start_that_no_longer_exists() {
    let env = TestEnv::new(&prd_with_stories(2));
    let cmd = agent(&env, &format!("{READ_PROMPT}echo work > \"w-$id.txt\"\n"));
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    // A killed ralph left an iteration in flight whose start the agent then pruned away.
    let state_path = env.path(".ralph/state.json");
    let mut state: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    let run_id = env.ledger()[0]["run_id"].clone();
    state["in_flight"] = json!({
        "run_id": run_id, "iteration": 2, "story_id": "US-001", "pid": 0,
        "started_at": "2026-01-01T00:00:00Z",
        "start_sha": "0123456789abcdef0123456789abcdef01234567"
    });
    std::fs::write(&state_path, state.to_string()).unwrap();
    env.write("left.txt", "partial\n");
    let again = run(&env, &cmd, &["--max-iter", "1"]);
    assert_ne!(again.status.code(), Some(1), "{}", text(&again));
    let ledger = env.ledger();
    let recovered = ledger
        .iter()
        .find(|r| r["outcome"] == "interrupted")
        .unwrap_or_else(|| panic!("{}", text(&again)));
    assert!(
        strings(&recovered["findings"])
            .join("\n")
            .contains("0123456789ab"),
        "{recovered}"
    );
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    assert!(state["in_flight"].is_null(), "{state}");
}

/// The tester's a4b.sh: renames US-002 and weakens the current story's criteria, sets its pass.
const RENAME_AND_WEAKEN: &str = r#"python3 - "$id" <<'PY'
import json, sys
p = json.load(open('prd.json'))
for s in p['userStories']:
    if s['id'] == 'US-002':
        s['title'] = 'Renamed by agent'
    if s['id'] == sys.argv[1]:
        s['acceptanceCriteria'] = ['anything goes']
        s['passes'] = True
open('prd.json', 'w').write(json.dumps(p, indent=2) + '\n')
PY
echo work > "work-$id.txt"
"#;

#[test]
fn prd_guard_report_puts_back_only_criteria_and_says_so() {
    for extra in [&[][..], &["--prd-guard", "report"][..]] {
        let env = TestEnv::new(&prd_with_stories(2));
        let cmd = agent(&env, &format!("{READ_PROMPT}{RENAME_AND_WEAKEN}"));
        let mut args = vec!["--max-iter", "2"];
        args.extend_from_slice(extra);
        let out = run(&env, &cmd, &args);
        let prd = env.prd();
        // The criteria are put back; the title edit stays (it is only reported).
        assert_eq!(
            strings(&prd["userStories"][0]["acceptanceCriteria"]),
            ["file-1.txt exists"],
            "{}",
            text(&out)
        );
        assert_eq!(
            prd["userStories"][1]["title"],
            "Renamed by agent",
            "{}",
            text(&out)
        );
        let findings = strings(&env.ledger()[0]["findings"]).join("\n");
        assert!(
            findings.contains("prd_guard = report") && !findings.contains("prd_guard = restore"),
            "the mode in force is named: {findings}"
        );
        assert!(findings.contains("US-002 edited (title)"), "{findings}");
        // The next prompt calls the agent's own criteria edit what it is.
        let next = prompt(&env, 2);
        assert!(
            next.contains("acceptance criteria of US-001 (its own story)")
                && !next.contains("changes outside your story"),
            "{next}"
        );
    }
}

#[test]
fn an_iteration_that_only_wrote_notes_says_notes_only() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(
        &env,
        &format!("{READ_PROMPT}echo 'a note' >> progress.txt\n{FLIP}echo done\n"),
    );
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_eq!(outcomes(&env), ["premature_claim"], "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("premature_claim"))
        .unwrap_or_default();
    assert!(
        line.contains("notes only") && !line.contains("file changed"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_agent_that_switches_branch_leaves_its_work_on_the_feature_branch() {
    // Iteration 1 branches off HEAD (a fast-forward for ralph); iteration 2 branches off the
    // commit before iteration 1's work (a history rewrite for ralph).
    let env = TestEnv::new(&prd_with_stories(2));
    let cmd = agent(
        &env,
        &format!(
            "{READ_PROMPT}if [ $n = 1 ]; then git checkout -q -b side-1; else git checkout -q -b side-2 HEAD~2; fi\necho work > \"work-$id.txt\"\n{FLIP}git add -A; git commit -qm \"side $id\"\necho done\n"
        ),
    );
    let out = run(&env, &cmd, &["--max-iter", "2"]);
    assert_eq!(env.git(&["branch", "--show-current"]).trim(), "ralph/demo");
    // The work of both iterations is on the feature branch, with ralph's checkpoints.
    for f in ["work-US-001.txt", "work-US-002.txt"] {
        env.git(&["cat-file", "-e", &format!("ralph/demo:{f}")]);
    }
    let first_checkpoint = env.ledger()[0]["checkpoint_commit"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    env.git(&[
        "merge-base",
        "--is-ancestor",
        &first_checkpoint,
        "ralph/demo",
    ]);
    // The agent's branches are left as they are.
    let side2 = env.git(&["log", "--format=%s", "side-2"]);
    assert!(side2.starts_with("side US-002"), "{side2}");
    assert!(!side2.contains("ralph: iteration"), "{side2}");
    env.git(&["rev-parse", "--verify", "side-1"]);
    let findings = strings(&env.ledger()[1]["findings"]).join("\n");
    assert!(
        findings.contains("ralph put HEAD back on ralph/demo")
            && findings.contains("re-applied")
            && findings.contains("left side-2 as it is"),
        "{findings}"
    );
    // What ralph reports is what the feature branch has.
    let prd: Value = serde_json::from_str(&env.git(&["show", "ralph/demo:prd.json"])).unwrap();
    let passing = prd["userStories"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["passes"] == true)
        .count();
    assert_eq!(passing, 2, "{}", text(&out));
    assert!(text(&out).contains("complete"), "{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
