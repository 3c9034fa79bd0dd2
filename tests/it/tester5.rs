//! The fifth tester's findings (issues 18 and 20: "never lies about being done, never loses
//! work"), with small exec agents (shell scripts) that misbehave.
//!
//! - an agent that does the work, sets `passes` and then exits 1 gets no pass on a story with no
//!   `verify` (its own word was failure), and the record says so; with a `verify` that passes,
//!   the check is the evidence and the story passes.

use serde_json::json;

use crate::common::{prd_with_stories, text, TestEnv};
use crate::trust_iteration::{agent, run, strings, FLIP};

/// Shell that does US-00n's work (commits `file-<n>.txt`) and sets its `passes`, then runs
/// `then`.
fn work_flip_then(then: &str) -> String {
    format!(
        "id=$(sed -n 's/^Story ID: //p' | head -1)\nn=${{id#US-00}}\necho done > file-$n.txt\n\
         git add file-$n.txt && git commit -qm \"feat: $id\"\n{FLIP}{then}"
    )
}

/// [`work_flip_then`], then a failure: a message on stderr and exit 1.
fn work_flip_fail() -> String {
    work_flip_then("echo 'something went wrong' >&2\nexit 1\n")
}

#[test]
fn an_agent_that_sets_passes_and_exits_1_gets_no_pass_without_a_check() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cmd = agent(&env, &work_flip_fail());
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        env.prd()["userStories"][0]["passes"],
        false,
        "{}",
        text(&out)
    );
    let first = &env.ledger()[0];
    assert_eq!(first["outcome"], "agent_error", "{first}");
    assert_eq!(first["exit_code"], 1, "{first}");
    assert_eq!(strings(&first["passes_refused"]), ["US-001"], "{first}");
    assert!(strings(&first["passes_flipped"]).is_empty(), "{first}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("US-001") && message.contains("then failed"),
        "the ledger names the refused claim: {message}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("complete"), "{}", text(&out));
}

#[test]
fn an_agent_that_sets_passes_and_exits_1_passes_on_its_passing_check() {
    // The check passing is evidence the agent's exit code cannot take away
    // (docs/decisions.md, "A failed agent's pass").
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!("test -f file-1.txt");
    let env = TestEnv::new(&prd);
    let cmd = agent(&env, &work_flip_fail());
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
    let first = &env.ledger()[0];
    assert_eq!(first["outcome"], "story_passed", "{first}");
    assert_eq!(first["exit_code"], 1, "{first}");
}

/// Shell that commits the story's work, sets its `passes`, and deletes every local branch git
/// lets it (`git branch -D`: all but the checked-out ones).
fn work_flip_delete_branches() -> String {
    work_flip_then(
        "for b in $(git for-each-ref --format='%(refname:short)' refs/heads); do git branch -D \"$b\" 2>&1; done\nexit 0\n",
    )
}

/// A `side` branch with one commit no other branch has; returns (main's tip, side's tip).
fn side_branch(env: &TestEnv) -> (String, String) {
    let main = env.git(&["rev-parse", "main"]).trim().to_owned();
    env.git(&["checkout", "-q", "-b", "side"]);
    env.write("side.txt", "unmerged\n");
    env.git(&["add", "side.txt"]);
    env.git(&["commit", "-qm", "side work"]);
    let side = env.git(&["rev-parse", "HEAD"]).trim().to_owned();
    env.git(&["checkout", "-q", "main"]);
    (main, side)
}

fn assert_branches_put_back(env: &TestEnv, out: &std::process::Output, main: &str, side: &str) {
    let all = text(out);
    assert_eq!(
        env.git(&["rev-parse", "refs/heads/main"]).trim(),
        main,
        "{all}"
    );
    assert_eq!(
        env.git(&["rev-parse", "refs/heads/side"]).trim(),
        side,
        "{all}"
    );
    let findings: Vec<String> = env
        .ledger()
        .iter()
        .flat_map(|r| strings(&r["findings"]))
        .collect();
    for name in ["main", "side"] {
        let said = format!("deleted branch {name}; ralph put it back");
        assert!(
            findings.iter().any(|f| f.contains(&said)),
            "the record names {name}: {findings:?}"
        );
        assert!(all.contains(&said), "a warning names {name}: {all}");
    }
}

#[test]
fn an_agent_that_deletes_the_users_branches_gets_them_put_back() {
    let env = TestEnv::new(&prd_with_stories(1));
    let (main, side) = side_branch(&env);
    let cmd = agent(&env, &work_flip_delete_branches());
    let out = run(&env, &cmd, &["--max-iter", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_branches_put_back(&env, &out, &main, &side);
}

#[test]
fn a_parallel_agent_that_deletes_the_users_branches_gets_them_put_back() {
    let env = TestEnv::new(&prd_with_stories(2));
    let (main, side) = side_branch(&env);
    let cmd = agent(&env, &work_flip_delete_branches());
    let out = run(&env, &cmd, &["--max-iter", "4", "--parallel", "2"]);
    assert_branches_put_back(&env, &out, &main, &side);
}

/// Shell that does the story's work (commits `file-<n>.txt` unless it is there), sets its
/// `passes` in the PRD file the prompt names, writes `<marks>/started-<id>`, and then waits
/// (at most a minute) until `<marks>/again` exists.
fn work_flip_then_wait(marks: &std::path::Path) -> String {
    let marks = marks.display();
    format!(
        r#"p=$(cat)
id=$(printf '%s\n' "$p" | sed -n 's/^Story ID: //p' | head -1)
prd=$(printf '%s\n' "$p" | sed -n 's/^PRD file: `\(.*\)`$/\1/p' | head -1)
n=${{id#US-00}}
if [ ! -f file-$n.txt ]; then echo done > file-$n.txt; git add file-$n.txt; git commit -qm "feat: $id"; fi
python3 - "$prd" "$id" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for s in p['userStories']:
    if s['id'] == sys.argv[2]:
        s['passes'] = True
open(sys.argv[1], 'w').write(json.dumps(p, indent=2) + '\n')
PY
touch {marks}/started-$id
i=0; while [ ! -f {marks}/again ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
exit 0
"#
    )
}

#[test]
fn work_salvaged_from_a_stopped_parallel_iteration_counts_as_earlier_work() {
    use nix::sys::signal::Signal;
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        let env = TestEnv::new(&prd_with_stories(2));
        let marks = env.root.path().to_path_buf();
        let cmd = agent(&env, &work_flip_then_wait(&marks));
        let args = [
            "run",
            "--agent",
            "exec",
            "--agent-cmd",
            cmd.as_str(),
            "--parallel",
            "2",
            "--max-iter",
            "4",
            "--shutdown-timeout",
            "1s",
        ];
        let mut child = env.ralph_spawn(&args);
        let within = std::time::Duration::from_secs(120);
        crate::common::wait_for(&env, "../started-US-001", within);
        crate::common::wait_for(&env, "../started-US-002", within);
        crate::common::signal(&child, sig);
        crate::common::wait_exit(&env, &mut child, within);
        // The next attempts find the work done and end at once (and a SIGKILL's orphaned agents
        // stop waiting).
        std::fs::write(marks.join("again"), "").unwrap();
        let out = env.ralph(&args);
        let all = text(&out);
        for r in env.ledger() {
            let message = r["message"].as_str().unwrap_or_default();
            assert!(
                !message.contains("no earlier iteration of it did any work"),
                "{sig}: the stopped iteration did the work: {r}\n{all}"
            );
        }
        assert_eq!(out.status.code(), Some(0), "{sig}: {all}");
        for s in env.prd()["userStories"].as_array().unwrap() {
            assert_eq!(s["passes"], true, "{sig}: {s}\n{all}");
        }
    }
}

// ---- hD1: issue 20, another agent's dangling commit is not a story's next start ----

/// US-002's agent leaves an orphan commit (`git commit-tree`, a file `other.txt`) on the run
/// branch's start and lands; US-001's agent commits, waits for that landing and deletes its
/// worktree with `git worktree remove -f -f`. Both dangling commits are kept under salvage refs
/// and named ("work that may be yours is kept in ..."), but US-001's next attempt starts from
/// the run branch: the other agent's `other.txt` never lands, nor does US-001's first try.
#[test]
fn another_agents_dangling_commit_is_kept_but_never_a_storys_next_start() {
    use crate::common::par::{does, prd_of, story, Par, BRANCH};
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
        ]),
        &[],
    );
    par.story(
        "US-001",
        json!([
            [
                {"write_file": {"path": "file-1.txt", "content": "1\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 first try"},
                {"stdout": "US-001 done"}
            ],
            [
                {"write_file": {"path": "file-1.txt", "content": "1 again\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 second try"},
                {"stdout": "US-001 done"}
            ]
        ]),
    );
    par.post(
        "US-001",
        0,
        &format!(
            "until {}; do sleep 0.1; done\nW=$PWD\ncd /\ngit -C \"$W\" worktree remove -f -f \"$W\"\n",
            par.landed("file-2.txt")
        ),
    );
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    par.pre(
        "US-002",
        0,
        "echo other > other.txt\ngit add other.txt\ngit commit-tree $(git write-tree) -p HEAD -m 'orphan from US-002' >/dev/null\ngit reset -q\nrm -f other.txt\n",
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let files = par.branch_files();
    assert!(
        !files.iter().any(|f| f == "other.txt"),
        "another agent's dangling commit landed with US-001: {files:?}\n{}",
        text(&out)
    );
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1 again\n");
    let history = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(
        !history.contains("orphan from US-002") && !history.contains("feat: US-001 first try"),
        "US-001's next attempt started from a dangling commit:\n{history}"
    );
    let first = &par.records("US-001")[0];
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("work that may be yours is kept in refs/ralph/salvage/")
            && message.contains("look at it with git show")
            && message.contains("next attempt starts from the run branch"),
        "{first:#}"
    );
    // Nothing lost: both dangling commits are kept under salvage refs.
    let kept: String = par
        .salvage_refs()
        .iter()
        .map(|r| par.env.git(&["log", "-1", "--format=%s", r]))
        .collect();
    assert!(
        kept.contains("orphan from US-002") && kept.contains("feat: US-001 first try"),
        "{kept}"
    );
    let prompt = par.prompt("US-001", 1);
    assert!(
        prompt.contains("work that may be yours is kept in")
            || prompt.contains("Work that may be yours is kept in"),
        "US-001's next prompt does not name the kept work:\n{prompt}"
    );
}

/// US-002's agent waits for US-001 to land, then runs `git -C <checkout> reset --hard HEAD~1`
/// of the run branch: nothing of the agent's is to keep (no `checkout-commits` ref), ralph puts
/// the branch forward again to its own tip and says so, and US-001 is not run again.
#[test]
fn an_agents_reset_of_the_run_branch_in_the_checkout_is_put_forward_again() {
    use crate::common::par::{does, prd_of, story, Par, BRANCH};
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
        ]),
        &[],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    // After US-001's landing is done (its pass committed on the branch, its record written):
    // ralph no longer moves HEAD.
    let main = par.env.repo.display().to_string();
    par.wait(
        "US-002",
        0,
        &format!(
            "git -C '{main}' show HEAD:prd.json | python3 -c \"import json,sys; sys.exit(not any(u['id'] == 'US-001' and u['passes'] for u in json.load(sys.stdin)['userStories']))\" && grep -s '\"US-001\"' '{main}/.ralph/ledger.jsonl' | grep -q story_passed"
        ),
    );
    par.pre(
        "US-002",
        0,
        // Two seconds after US-001's record: ralph is past US-001's landing and waits for
        // US-002 (a read of prd.json while git rewrites it is a known race, see the note of
        // 2026-12-02 on issue 20).
        &format!("sleep 2; until git -C '{main}' reset -q --hard HEAD~1; do sleep 0.1; done\n"),
    );
    let out = par.run(2, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(par.calls("US-001"), 1, "US-001 was run again:\n{all}");
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n", "{all}");
    assert_eq!(par.show(BRANCH, "file-2.txt"), "2\n", "{all}");
    assert!(
        !all.contains("checkout-commits") && par.salvage_refs().is_empty(),
        "ralph kept its own landing as an agent's commit: {:?}\n{all}",
        par.salvage_refs()
    );
    // Found at the next launch, landing or the run's end: the terminal says it.
    let reflog = par.env.git(&["reflog", "--format=%H %gs", "HEAD"]);
    assert!(
        all.contains("an agent moved the run branch back in your checkout (git reset")
            && all.contains("ralph put it forward again"),
        "{all}\n{reflog}"
    );
}

/// A `--resolve-conflicts` resolution agent that commits a third file on top of ralph's commit
/// with git's conflict markers and then deletes its worktree (`git worktree remove -f -f`): its
/// dangling commit is kept, but the story's next attempt starts from the run branch, so neither
/// the markers nor the third file ever land.
#[test]
fn a_resolution_that_deletes_its_worktree_never_lands_its_markers() {
    use crate::common::par::{does, prd_of, story, Par, BRANCH};
    let par = Par::new(
        &prd_of(vec![
            story(1, "grep -q A shared.txt", &[]),
            story(2, "grep -q B shared.txt", &[]),
        ]),
        &[("shared.txt", "original line\n")],
    );
    par.story(
        "US-001",
        json!([does("US-001", "shared.txt", "A's line\n", 100)]),
    );
    par.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n", 0),
            [
                {"write_file": {"path": "third.txt", "content": "hacked\n"}},
                {"git_commit": "resolve + third"}
            ],
            does("US-002", "shared.txt", "A's line\nB's line\n", 0)
        ]),
    );
    par.post(
        "US-002",
        1,
        "W=$PWD\ncd /\ngit -C \"$W\" worktree remove -f -f \"$W\"\n",
    );
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait(
        "US-002",
        0,
        &format!(
            "git -C '{}' show '{BRANCH}:shared.txt' 2>/dev/null | grep -q \"A's line\"",
            par.env.repo.display()
        ),
    );
    let out = par.run(2, &["--resolve-conflicts"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let files = par.branch_files();
    assert!(
        !files.iter().any(|f| f == "third.txt"),
        "the resolution's third file landed: {files:?}\n{all}"
    );
    assert_eq!(par.conflict_markers(), "", "{all}");
    assert_eq!(par.on_branch("shared.txt"), "A's line\nB's line\n", "{all}");
}
