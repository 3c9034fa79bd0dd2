//! `ralph run --parallel N`: the findings of the hostile tester (issue 20), each a scenario a
//! user meets, with the scripted per-story agents of tests/it/common/par.rs.

use std::process::Output;

use serde_json::{json, Value};

use crate::common::par::{does, landing_kind, prd_of, story, Par, BRANCH};
use crate::common::text;

/// Every commit on the run branch since `main` (full shas).
fn run_commits(par: &Par) -> Vec<String> {
    par.env
        .git(&["rev-list", &format!("main..{BRANCH}")])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The files a commit changed (against its first parent).
fn changed_by(par: &Par, commit: &str) -> Vec<String> {
    par.env
        .git(&[
            "diff-tree",
            "--no-commit-id",
            "--name-only",
            "-r",
            "-m",
            "--first-parent",
            commit,
        ])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Whether any commit ralph made on the run branch holds `rel` with `content`.
fn committed_with(par: &Par, rel: &str, content: &str) -> Vec<String> {
    run_commits(par)
        .into_iter()
        .filter(|c| changed_by(par, c).iter().any(|f| f == rel) && par.show(c, rel) == content)
        .collect()
}

const USER_EDIT: &str = "my own notes, not committed\n";
const USER_DRAFT: &str = "a draft of mine\n";

/// Two stories with `--allow-dirty`: US-001 writes its own file, US-002 also rewrites
/// `notes.md`, a tracked file the user has edited (uncommitted) before the run; the user also
/// has an untracked `draft.txt`.
fn dirty_start() -> (Par, Output) {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
        ]),
        &[("notes.md", "committed notes\n")],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.story(
        "US-002",
        json!([[
            {"write_file": {"path": "notes.md", "content": "the agent's notes\n"}},
            {"write_file": {"path": "file-2.txt", "content": "2\n"}},
            {"set_passes": {"id": "US-002", "passes": true}},
            {"git_commit": "feat: US-002"},
            {"stdout": "US-002 done"}
        ]]),
    );
    // US-001 lands first: once US-002's landing is refused, the run stops for the user, and an
    // iteration still running then lands nothing.
    par.wait("US-002", 0, &par.landed("file-1.txt"));
    par.env.write("notes.md", USER_EDIT);
    par.env.write("draft.txt", USER_DRAFT);
    let out = par.run(2, &["--allow-dirty"]);
    (par, out)
}

#[test]
fn allow_dirty_files_are_never_committed_nor_overwritten_by_a_landing() {
    let (par, out) = dirty_start();
    // The landing that would overwrite the user's edit stops the run for them.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(par.env.read("notes.md"), USER_EDIT, "{}", text(&out));
    assert_eq!(par.env.read("draft.txt"), USER_DRAFT);
    for (rel, content) in [("notes.md", USER_EDIT), ("draft.txt", USER_DRAFT)] {
        let commits = committed_with(&par, rel, content);
        assert!(
            commits.is_empty(),
            "ralph committed the user's {rel} in {commits:?}\n{}",
            par.env.git(&["log", "--stat", BRANCH])
        );
    }
    let said = text(&out);
    assert!(
        said.contains("notes.md"),
        "the stop does not name the user's file:\n{said}"
    );
    // US-001 does not touch the user's files: it landed.
    assert_eq!(par.records("US-001")[0]["outcome"], "story_passed");
    assert_eq!(par.on_branch("file-1.txt"), "1\n");
    // US-002's work is kept, not lost.
    let b = par.records("US-002");
    assert_eq!(b.len(), 1, "{b:#?}");
    let salvage = b[0]["landing"]["salvage_ref"].as_str().unwrap_or("");
    assert!(!salvage.is_empty(), "{:#}", b[0]);
    assert_eq!(par.show(salvage, "notes.md"), "the agent's notes\n");
    assert_eq!(par.show(salvage, "file-2.txt"), "2\n");
    assert_eq!(par.env.prd()["userStories"][1]["passes"], false);
    // Still dirty as the user left it: notes.md modified, draft.txt untracked.
    let status = par.env.git(&["status", "--porcelain"]);
    assert!(
        status.contains(" M notes.md") && status.contains("?? draft.txt"),
        "{status}"
    );
}

/// What the user does after a landing was refused for their edit, before the next run.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// `git checkout -- <file>`, then `ralph run`.
    PutAway,
    /// Nothing: `ralph run --allow-dirty` with the edit still there.
    AllowDirty,
}

#[test]
fn after_a_landing_refused_for_the_users_edit_the_next_run_resumes_from_the_salvaged_work() {
    refused_then_resumed("notes.md", Then::PutAway, false);
}

#[test]
fn after_a_landing_refused_once_another_story_landed_the_next_run_resumes_from_the_merge() {
    refused_then_resumed("notes.md", Then::PutAway, true);
}

#[test]
fn after_a_landing_refused_the_next_run_with_allow_dirty_resumes_and_keeps_the_edit_out() {
    refused_then_resumed("notes.md", Then::AllowDirty, false);
}

/// The user edits `edited` in the checkout while US-001 runs (its landing is refused), then
/// does `then` and runs again. With `other`, US-002 lands while US-001 runs, before the edit.
fn refused_then_resumed(edited: &str, then: Then, other: bool) {
    let mut stories = vec![story(1, "test -f file-1.txt && test -f part-1.txt", &[])];
    if other {
        stories.push(story(2, "test -f file-2.txt", &[]));
    }
    let par = Par::new(&prd_of(stories), &[("notes.md", "committed notes\n")]);
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    let after_other = if other {
        format!("{} && ", par.landed("file-2.txt"))
    } else {
        String::new()
    };
    let path = par.env.repo.join(edited);
    // The first attempt does the whole story (also in notes.md); while it runs, the user edits
    // a file in the checkout. The second attempt only finishes, on top of what it finds.
    par.story(
        "US-001",
        json!([
            [
                {"write_file": {"path": "part-1.txt", "content": "part\n"}},
                {"write_file": {"path": "notes.md", "content": "the agent's notes\n"}},
                {"write_file": {"path": "file-1.txt", "content": "1\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001"},
                {"stdout": "US-001 done"}
            ],
            [
                {"set_passes": {"id": "US-001", "passes": true}},
                {"stdout": "US-001 was done already"}
            ]
        ]),
    );
    par.wait(
        "US-001",
        0,
        &format!(
            "{after_other}printf '%s\\n' '{}' > '{}'",
            USER_EDIT.trim_end(),
            path.display()
        ),
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let first = par.records("US-001");
    assert_eq!(first.len(), 1, "{first:#?}");
    let salvage = first[0]["landing"]["salvage_ref"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert_eq!(par.show(&salvage, "part-1.txt"), "part\n", "{:#}", first[0]);
    assert_eq!(par.env.read(edited), USER_EDIT);
    let again = match then {
        Then::PutAway => {
            par.env.git(&["checkout", "--", edited]);
            par.run(2, &[])
        }
        Then::AllowDirty => par.run(2, &["--allow-dirty"]),
    };
    let starts = par.starts("US-001");
    assert_eq!(starts.len(), 2, "{starts:?}\n{}", text(&again));
    assert!(
        starts[1].3.contains(&"part-1.txt".to_owned()),
        "the second attempt did not start from the salvaged work {salvage}: {:?}\n{}",
        starts[1],
        text(&again)
    );
    if then == Then::AllowDirty {
        // Still the user's edit in the way: refused again, the edit kept out of every commit.
        assert_eq!(again.status.code(), Some(1), "{}", text(&again));
        assert_eq!(par.env.read(edited), USER_EDIT);
        assert!(committed_with(&par, edited, USER_EDIT).is_empty());
        return;
    }
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    let records = par.records("US-001");
    assert_eq!(
        records.last().map(|r| r["outcome"].clone()),
        Some(Value::from("story_passed")),
        "{records:#?}"
    );
    assert_eq!(par.on_branch("notes.md"), "the agent's notes\n");
    assert!(matches!(
        landing_kind(records.last().expect("a record")),
        "fast_forward" | "merge"
    ));
    par.assert_tidy(&again);
}

use crate::common::par::{findings, simple_stories};

#[test]
fn ignored_files_an_agent_writes_in_its_worktree_are_kept_not_deleted_with_it() {
    let par = Par::new(
        &simple_stories(2),
        &[
            (".gitignore", "*.local\n*.log\nbuild/\nlogs/\n"),
            (
                "ralph.toml",
                "worktree_setup = \"echo setup > setup.log\"\n",
            ),
        ],
    );
    par.story(
        "US-001",
        json!([[
            {"write_file": {"path": "out.log", "content": "what the agent's test run printed\n"}},
            {"write_file": {"path": "logs/deep/run.log", "content": "deep\n"}},
            {"write_file": {"path": "build/app.o", "content": "object code\n"}},
            {"write_file": {"path": "file-1.txt", "content": "1\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"git_commit": "feat: US-001"},
            {"stdout": "US-001 done"}
        ]]),
    );
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let a = &par.records("US-001")[0];
    let run_id = a["run_id"].as_str().expect("run id");
    let n = a["iteration"].as_u64().expect("iteration");
    let kept = format!(".ralph/kept/{run_id}/{n}");
    assert_eq!(
        par.env.read(&format!("{kept}/out.log")),
        "what the agent's test run printed\n",
        "{a:#}"
    );
    assert_eq!(par.env.read(&format!("{kept}/logs/deep/run.log")), "deep\n");
    // A build directory is made again; what the setup wrote before the agent is not its work.
    assert!(!par.env.path(&format!("{kept}/build")).exists());
    assert!(!par.env.path(&format!("{kept}/setup.log")).exists());
    let said = findings(a);
    assert!(
        said.contains("out.log") && said.contains("logs/deep/run.log") && said.contains(&kept),
        "the record does not name the kept files: {said}"
    );
    assert!(!said.contains("build/app.o"), "{said}");
    // US-002 wrote no ignored file: nothing kept, nothing said.
    let b = &par.records("US-002")[0];
    assert!(!findings(b).contains("ignored files"), "{b:#}");
    par.assert_tidy(&out);
}

#[test]
fn a_story_an_agent_marked_passing_in_its_worktree_is_no_caveat_when_it_never_passed() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            // Its check passes in US-001's worktree too.
            story(2, "test -f file-1.txt", &["US-001"]),
        ]),
        &[],
    );
    // US-001's agent also marks US-002 passing in its worktree's prd.json (which never lands);
    // US-002's own agent never gets there.
    par.story(
        "US-001",
        json!([[
            {"write_file": {"path": "file-1.txt", "content": "1\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"set_passes": {"id": "US-002", "passes": true}},
            {"git_commit": "feat: US-001"},
            {"stdout": "US-001 done"}
        ]]),
    );
    par.story("US-002", json!([[{"stdout": "not today"}]]));
    let out = par.run(2, &["--max-attempts", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(par.env.prd()["userStories"][1]["passes"], false);
    let said = text(&out);
    assert!(
        !said.contains("US-002 was marked passing"),
        "a caveat for a story that does not pass:\n{said}"
    );
    let a = &par.records("US-001")[0];
    assert_eq!(a["passes_flipped"], json!(["US-001"]), "{a:#}");
    assert!(
        findings(a).contains("US-002"),
        "the record does not say the agent marked US-002 in its worktree: {a:#}"
    );
}

#[test]
fn a_parallel_usage_limit_wait_names_no_story_in_its_json_event() {
    let par = Par::new(
        &prd_of(vec![story(1, "test -f file-1.txt", &[])]),
        &[("ralph.toml", "usage_limit_margin = \"0s\"\n")],
    );
    // The agent meets a usage limit that resets 2 s after it says so (computed when it acts),
    // then does the story.
    let agent = crate::common::script_file(
        &par.env,
        "limited-agent.sh",
        &format!(
            r#"cat > /dev/null
mark='{mark}'
if [ ! -f "$mark" ]; then
  touch "$mark"
  echo "Claude AI usage limit reached|$(( $(date +%s) + 2 ))"
  exit 0
fi
echo 1 > file-1.txt
sed -i 's/"passes": false/"passes": true/' prd.json
git add -A && git commit -qm 'feat: US-001'
echo done
"#,
            mark = par.agents.join("limited-once").display()
        ),
    );
    let agent = agent.display().to_string();
    let out = par.env.ralph(&[
        "run",
        "--parallel",
        "2",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent,
        "--max-iter",
        "5",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let waits: Vec<&Value> = events.iter().filter(|e| e["event"] == "waiting").collect();
    assert_eq!(waits.len(), 1, "{events:#?}");
    assert_eq!(waits[0]["reason"], "usage_limit", "{:#}", waits[0]);
    assert!(
        waits[0].get("story_id").is_none(),
        "a usage-limit wait of a parallel run names a story: {:#}",
        waits[0]
    );
}

#[test]
fn a_worktree_copy_symlink_arrives_in_the_worktree_as_a_symlink() {
    let par = Par::new(
        &prd_of(vec![story(1, "test -f file-1.txt", &[])]),
        &[(
            "ralph.toml",
            "worktree_copy = [\"shared.local\", \"readme.local\"]\n",
        )],
    );
    // A link to a file outside the repository (a shared secret store), and a relative link to
    // a tracked file.
    let outside = par.env.root.path().join("secrets.env");
    std::fs::write(&outside, "TOKEN=shared\n").expect("write");
    std::os::unix::fs::symlink(&outside, par.env.repo.join("shared.local")).expect("symlink");
    std::os::unix::fs::symlink("README.md", par.env.repo.join("readme.local")).expect("symlink");
    let seen = par.agents.join("links.txt");
    // What the agent finds in its worktree when it starts.
    par.wait(
        "US-001",
        0,
        &format!(
            "for f in shared.local readme.local; do if [ -L $f ]; then echo \"$f -> $(readlink $f): $(cat $f)\"; else echo \"$f is no link\"; fi; done > '{}'",
            seen.display()
        ),
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = std::fs::read_to_string(&seen).unwrap_or_default();
    assert_eq!(
        said,
        format!(
            "shared.local -> {}: TOKEN=shared\nreadme.local -> README.md: demo\n",
            outside.display()
        ),
        "{}",
        text(&out)
    );
    // The links in the checkout are as they were.
    assert_eq!(
        std::fs::read_link(par.env.repo.join("shared.local")).ok(),
        Some(outside.clone())
    );
    par.assert_tidy(&out);
}

/// `ralph run --parallel 2 --max-iter 5` in the background, SIGKILLed once `ready` holds (the
/// test fails with `never` if it does not within 120 s), then run again to its end, which must
/// exit 0: that rerun's output.
fn killed_then_rerun(par: &Par, never: &str, ready: impl Fn() -> bool) -> Output {
    use std::time::{Duration, Instant};
    let args = par.args_max(2, 5, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = par.env.ralph_spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{never}:\n{}",
            par.env.spawned_output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    crate::common::signal(&child, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let out = par.env.ralph(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    out
}

#[test]
fn after_kill_9_the_recovered_row_shows_the_time_worked_and_the_files_its_work_holds() {
    let par = Par::new(
        &prd_of(vec![story(
            1,
            "test -f file-1.txt && test -f part-1.txt",
            &[],
        )]),
        &[],
    );
    // The first attempt says something, works quietly for 1.5 s (no transcript line), commits
    // part of its work, leaves a file uncommitted, then works on until ralph is killed.
    par.story(
        "US-001",
        json!([
            [
                {"stdout": "starting"},
                {"sleep_ms": 1500},
                {"write_file": {"path": "part-1.txt", "content": "part\n"}},
                {"git_commit": "wip: US-001"},
                {"write_file": {"path": "trace.local", "content": "ignored by git\n"}},
                {"write_file": {"path": "loose-1.txt", "content": "uncommitted\n"}},
                {"sleep_ms": 60000}
            ],
            does("US-001", "file-1.txt", "1\n", 0)
        ]),
    );
    let trees = par.env.repo.join(".ralph").join("worktrees");
    let written = || {
        std::fs::read_dir(&trees).ok().is_some_and(|runs| {
            runs.flatten().any(|run| {
                std::fs::read_dir(run.path()).is_ok_and(|t| {
                    t.flatten()
                        .any(|tree| tree.path().join("loose-1.txt").exists())
                })
            })
        })
    };
    let out = killed_then_rerun(&par, "the agent never wrote its file", written);
    let first = &par.records("US-001")[0];
    assert_eq!(first["outcome"], "interrupted", "{first:#}");
    let secs = first["duration_s"].as_f64().unwrap_or(0.0);
    assert!(
        secs >= 1.5,
        "the recovered row says {secs} s, though its agent worked at least 1.5 s: {first:#}"
    );
    let files: Vec<&str> = first["files_changed"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        files.contains(&"part-1.txt") && files.contains(&"loose-1.txt"),
        "the recovered row does not name the files of its salvaged work: {first:#}"
    );
    // The file git ignores, which no commit takes, is kept like a landing keeps it.
    let kept = format!(
        ".ralph/kept/{}/{}/trace.local",
        first["run_id"].as_str().expect("run id"),
        first["iteration"]
    );
    assert_eq!(par.env.read(&kept), "ignored by git\n", "{first:#}");
    assert!(findings(first).contains("trace.local"), "{first:#}");
    let log = par.env.ralph(&["log"]);
    let row = String::from_utf8_lossy(&log.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("1 ") && l.contains("interrupted"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        !row.is_empty() && !row.contains(" 0s "),
        "`ralph log`'s row: {row:?}\n{}",
        text(&log)
    );
    par.assert_tidy(&out);
}

/// A run where US-001's agent adds a 60 MiB file (zeros) with its work: `--parallel 2`, or
/// serial (`None`).
fn big_file_run(parallel: Option<u32>) -> (Par, Output) {
    let par = Par::new(&prd_of(vec![story(1, "test -f file-1.txt", &[])]), &[]);
    par.wait("US-001", 0, "truncate -s 60M big.bin");
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let out = match parallel {
        Some(n) => par.run(n, &[]),
        None => {
            let wrapper = par.wrapper.display().to_string();
            par.env.ralph(&[
                "run",
                "--agent",
                "exec",
                "--agent-cmd",
                &wrapper,
                "--max-iter",
                "5",
            ])
        }
    };
    (par, out)
}

#[test]
fn a_file_over_50_mib_an_agent_adds_is_named_with_the_limit_serial_and_parallel() {
    for parallel in [Some(2), None] {
        let (par, out) = big_file_run(parallel);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let r = &par.records("US-001")[0];
        let said = findings(r);
        assert!(
            said.contains("big.bin (60 MiB)") && said.contains("50 MiB"),
            "{parallel:?}: no warning naming the file and the limit: {r:#}"
        );
        let printed = text(&out);
        assert!(
            printed.contains("big.bin (60 MiB)"),
            "{parallel:?}: the run's output does not warn:\n{printed}"
        );
        assert!(par.branch_files().contains(&"big.bin".to_owned()));
    }
}

#[test]
fn the_recheck_at_landing_prints_its_verify_line_with_its_iteration_like_the_others() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
        ]),
        &[],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.story("US-002", json!([does("US-002", "file-2.txt", "2\n", 0)]));
    // US-002 finishes once US-001 landed: its check runs again at its landing, alone by then.
    par.wait("US-001", 0, &par.started("US-002"));
    par.wait("US-002", 0, &par.landed("file-1.txt"));
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = text(&out);
    let verify: Vec<&str> = printed
        .lines()
        .filter(|l| l.contains("verify US-00"))
        .collect();
    let b = &par.records("US-002")[0];
    assert_eq!(b["landing"]["landed_since"], json!(["US-001"]), "{b:#}");
    let n = b["iteration"].as_u64().expect("iteration");
    let b_lines: Vec<&&str> = verify.iter().filter(|l| l.contains("US-002")).collect();
    assert_eq!(b_lines.len(), 2, "the check and its re-check: {printed}");
    for line in &verify {
        assert!(
            line.trim_start().starts_with('#'),
            "a verify line without its iteration: {line:?}\n{printed}"
        );
    }
    for line in b_lines {
        assert!(line.contains(&format!("#{n} verify US-002")), "{line:?}");
    }
}

/// ralph killed after a landing had moved the checkout's files and index to the landed work
/// but before it moved the run branch (a tester's random kill point): the next run took the
/// landed files for the user's uncommitted changes and refused to start. It now finishes the
/// move from the note the landing leaves (`.ralph/landing.json`) and goes on.
#[test]
fn a_landing_killed_between_the_files_and_the_branch_is_finished_by_the_next_run() {
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
        serde_json::json!([does("US-001", "file-1.txt", "1\n", 0)]),
    );
    par.story(
        "US-002",
        serde_json::json!([does("US-002", "file-2.txt", "2\n", 0)]),
    );
    let env = &par.env;
    env.git(&["checkout", "-q", "-b", BRANCH]);
    let from = env.git(&["rev-parse", "HEAD"]).trim().to_owned();
    // The landed work: US-001's file on top of the tip.
    env.git(&["checkout", "-q", "-b", "landed"]);
    env.write("file-1.txt", "1\n");
    env.git(&["add", "file-1.txt"]);
    env.git(&["commit", "-q", "-m", "feat: US-001"]);
    let to = env.git(&["rev-parse", "HEAD"]).trim().to_owned();
    env.git(&["checkout", "-q", BRANCH]);
    // Files and index at the landed work, the branch still at the tip: where the kill left it.
    env.git(&["read-tree", "-m", "-u", &from, &to]);
    assert!(
        !env.git(&["status", "--porcelain", "--untracked-files=no"])
            .trim()
            .is_empty(),
        "the half-done landing should look like uncommitted changes"
    );
    std::fs::create_dir_all(env.path(".ralph")).expect("mkdir .ralph");
    env.write(
        ".ralph/landing.json",
        &serde_json::json!({"branch": BRANCH, "from": from, "to": to}).to_string(),
    );
    let out = par.run(2, &[]);
    let shown = crate::common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("finished moving the checkout to"),
        "the finished landing is not said:\n{shown}"
    );
    // The landed commit is on the run branch, and the note is gone.
    let contains = std::process::Command::new("git")
        .args(["merge-base", "--is-ancestor", &to, BRANCH])
        .current_dir(&env.repo)
        .status()
        .expect("git");
    assert!(contains.success(), "{to} is not on {BRANCH}:\n{shown}");
    assert!(!env.path(".ralph/landing.json").exists());
    assert_eq!(par.on_branch("file-2.txt"), "2\n");
}

/// An agent that commits and then deletes its worktree with `post` (a shell step run in the
/// worktree after its script): the story's first attempt commits `feat: US-001 first try` (or
/// leaves it uncommitted when `commit` is false), the second lands `1 again`. Returns the run's
/// output and the first record.
fn deleted_worktree(post: &str, commit: bool) -> (Par, Output, Value) {
    let par = Par::new(&prd_of(vec![story(1, "test -f file-1.txt", &[])]), &[]);
    let mut first = vec![
        json!({"write_file": {"path": "file-1.txt", "content": "1\n"}}),
        json!({"set_passes": {"id": "US-001", "passes": true}}),
    ];
    if commit {
        first.push(json!({"git_commit": "feat: US-001 first try"}));
    }
    first.push(json!({"stdout": "US-001 done"}));
    par.story(
        "US-001",
        json!([
            first,
            [
                {"write_file": {"path": "file-1.txt", "content": "1 again\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 second try"},
                {"stdout": "US-001 done"}
            ]
        ]),
    );
    par.post("US-001", 0, post);
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1 again\n");
    assert_eq!(
        par.registered_worktrees(),
        1,
        "a worktree is left registered"
    );
    let first = par.records("US-001")[0].clone();
    (par, out, first)
}

/// [`deleted_worktree`] with `post` and a committed first attempt: that commit is kept under
/// the salvage ref its record names, and that record says the uncommitted rest went with the
/// worktree.
/// When git's record of the worktree went too (`dangling`), the commit is found among git's
/// dangling commits, which any live agent may have made: it is kept and named, but the story's
/// next attempt starts from the run branch.
fn first_try_is_kept(post: &str, dangling: bool) {
    let (par, out, first) = deleted_worktree(post, true);
    let message = first["message"].as_str().unwrap_or_default();
    let salvage = message
        .split_whitespace()
        .find(|w| w.starts_with("refs/ralph/salvage/"))
        .map(|w| w.trim_end_matches([',', ';', ')']))
        .unwrap_or_else(|| panic!("the record names no salvage ref: {first:#}\n{}", text(&out)));
    let kept = par.env.git(&["log", "--format=%s", salvage]);
    assert!(
        kept.lines().any(|s| s == "feat: US-001 first try"),
        "{salvage} does not hold the first try's commit:\n{kept}\n{first:#}"
    );
    assert!(
        message.contains("was deleted while the agent ran (by this or another agent)")
            && message.contains("anything it had not committed was deleted with the worktree"),
        "{first:#}"
    );
    assert_eq!(first["outcome"], "agent_error", "{first:#}");
    let history = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(history.contains("feat: US-001 second try"), "{history}");
    // From the kept commit when git's record named it; else from the run branch.
    assert_eq!(
        history.contains("feat: US-001 first try"),
        !dangling,
        "{history}\n{first:#}"
    );
    if dangling {
        assert!(
            message.contains(&format!("work that may be yours is kept in {salvage}")),
            "{first:#}"
        );
    }
}

/// `git worktree remove -f -f` removes even a locked worktree and git's record of it: the
/// commit the agent made there is reachable from nothing, yet it is kept under the salvage ref
/// its record names (the story's next attempt starts from the run branch: a dangling commit may
/// be any agent's).
#[test]
fn a_double_forced_worktree_removal_keeps_the_agents_commit_under_a_salvage_ref() {
    first_try_is_kept(
        "W=$PWD\ncd /\ngit -C \"$W\" worktree remove -f -f \"$W\"\n",
        true,
    );
}

/// `rm -rf` of the worktree and `git worktree prune` (the lock lifted first, so that git
/// prunes the record too): the commit is kept the same way.
#[test]
fn an_unlocked_deleted_and_pruned_worktree_keeps_the_agents_commit_under_a_salvage_ref() {
    first_try_is_kept(
        "W=$PWD\nC=$(git rev-parse --path-format=absolute --git-common-dir)\ngit worktree unlock \"$W\"\ncd /\nrm -rf \"$W\"\ngit --git-dir=\"$C\" worktree prune\n",
        true,
    );
}

/// `rm -rf` and `git worktree prune` of the (locked) worktree: git keeps its record, which
/// still names the commit; it is kept too.
#[test]
fn a_deleted_worktree_pruned_by_the_agent_keeps_the_agents_commit_under_a_salvage_ref() {
    first_try_is_kept(
        "W=$PWD\nC=$(git rev-parse --path-format=absolute --git-common-dir)\ncd /\nrm -rf \"$W\"\ngit --git-dir=\"$C\" worktree prune\n",
        false,
    );
}

/// Work never committed is gone with a `-f -f` removal (git keeps no copy): the record says so
/// honestly, names no salvage ref, and the story's next attempt starts from the run branch.
#[test]
fn uncommitted_work_removed_with_its_worktree_is_said_to_be_lost() {
    let (par, out, first) = deleted_worktree(
        "W=$PWD\ncd /\ngit -C \"$W\" worktree remove -f -f \"$W\"\n",
        false,
    );
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no commit of its was left to keep")
            && message.contains("anything it had not committed was deleted with the worktree")
            && !message.contains("refs/ralph/salvage/"),
        "{first:#}\n{}",
        text(&out)
    );
    assert_eq!(
        par.env.git(&["for-each-ref", "refs/ralph/salvage/"]),
        "",
        "a salvage ref was made for work that was never committed"
    );
}

/// A landing refused for the user's edit is recorded as what it is, not as a stop signal: the
/// outcome `landing_refused`, the landing `refused` with its salvage ref, and `ralph log`'s row
/// and the terminal say "refused" and name no interruption.
#[test]
fn a_landing_refused_for_a_dirty_checkout_is_labelled_refused_not_interrupted() {
    let (par, out) = dirty_start();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let b = &par.records("US-002")[0];
    assert_eq!(b["outcome"], "landing_refused", "{b:#}");
    assert_eq!(b["landing"]["kind"], "refused", "{b:#}");
    let salvage = b["landing"]["salvage_ref"].as_str().unwrap_or_default();
    let message = b["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the landing was refused")
            && message.contains("notes.md")
            && !salvage.is_empty()
            && message.contains(salvage)
            && !message.contains("interrupted"),
        "{b:#}"
    );
    let said = text(&out);
    // US-001's iteration may still be running when US-002's landing is refused: it then lands
    // nothing (the run stops for the user) and is `interrupted`, as it should be; only what is
    // said of US-002's refusal and of the run's stop is looked at here.
    let refusal: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("iteration 2 ") || l.starts_with("ralph: stopped"))
        .collect();
    assert!(
        said.contains("landing_refused")
            && refusal.len() >= 2
            && refusal.iter().all(|l| !l.contains("interrupted"))
            && said.contains("commit or move your change named above"),
        "the terminal calls it an interruption, or its next step is not about the change:\n{said}"
    );
    let log = par.env.ralph(&["log"]);
    let rows = String::from_utf8_lossy(&log.stdout).into_owned();
    let row = rows
        .lines()
        .find(|l| l.contains("US-002"))
        .unwrap_or_default();
    assert!(
        row.contains("landing_refused") && !row.contains("interrupted"),
        "`ralph log`'s row for US-002: {row:?}\n{rows}"
    );
}

/// One story whose agent first runs `pre` (a shell step; `{main}` is the user's checkout):
/// returns the run's output.
fn agent_in_checkout(pre: &str) -> (Par, Output) {
    let par = Par::new(
        &prd_of(vec![story(1, "test -f file-1.txt", &[])]),
        &[("notes.md", "committed notes\n")],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let main = par.env.repo.display().to_string();
    par.pre("US-001", 0, &pre.replace("{main}", &main));
    let out = par.run(2, &[]);
    (par, out)
}

/// The salvage ref a record's findings name, and the findings.
fn named_salvage(r: &Value) -> (String, String) {
    let said = findings(r);
    let name = said
        .split_whitespace()
        .find(|w| w.starts_with("refs/ralph/salvage/"))
        .map(|w| w.trim_end_matches([',', ';', ')']).to_owned())
        .unwrap_or_default();
    (name, said)
}

/// An agent's `git -C <checkout> commit` is taken off the run branch and the checkout with
/// `git reset --keep` (the user's uncommitted edit stays), kept under the salvage ref the
/// record names; the story's own work lands as usual.
#[test]
fn an_agents_commit_in_the_main_checkout_is_taken_off_the_branch_and_kept() {
    let (par, out) = agent_in_checkout(
        "echo 'my edit' > '{main}/notes.md'\necho side > '{main}/side.txt'\ngit -C '{main}' add side.txt\ngit -C '{main}' commit -q -m 'agent: side file'\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let on_branch = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(
        !on_branch.contains("agent: side file"),
        "the agent's commit in the checkout is still on the run branch:\n{on_branch}\n{}",
        text(&out)
    );
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n");
    let r = &par.records("US-001")[0];
    assert_eq!(r["outcome"], "story_passed", "{r:#}");
    let (salvage, said) = named_salvage(r);
    assert!(
        !salvage.is_empty() && said.contains("reset --keep"),
        "the record does not name where the agent's commit went: {said}"
    );
    let kept = par.env.git(&["log", "--format=%s", &salvage]);
    assert!(kept.contains("agent: side file"), "{salvage}: {kept}");
    assert!(
        !par.env.repo.join("side.txt").exists(),
        "the agent's file is still in the checkout"
    );
    assert_eq!(
        par.env.read("notes.md"),
        "my edit\n",
        "the user's edit was lost"
    );
    assert!(
        text(&out).contains(&salvage),
        "the terminal does not name {salvage}:\n{}",
        text(&out)
    );
}

/// When the user has changed a file the agent's checkout commit changed, `reset --keep`
/// cannot take the commit off: nothing moves, the user's edit stays, the run stops as a
/// refused landing (exit 1, `landing_refused`), and the commit is still kept under its ref.
#[test]
fn an_agents_checkout_commit_under_a_users_edit_stops_the_run_and_loses_nothing() {
    let (par, out) = agent_in_checkout(
        "echo side > '{main}/side.txt'\ngit -C '{main}' add side.txt\ngit -C '{main}' commit -q -m 'agent: side file'\necho 'my edit of it' > '{main}/side.txt'\n",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(par.env.read("side.txt"), "my edit of it\n");
    let r = &par.records("US-001")[0];
    assert_eq!(r["outcome"], "landing_refused", "{r:#}");
    let (salvage, said) = named_salvage(r);
    assert!(!salvage.is_empty(), "{said}");
    let kept = par.env.git(&["log", "--format=%s", &salvage]);
    assert!(kept.contains("agent: side file"), "{salvage}: {kept}");
    assert_eq!(r["landing"]["kind"], "refused", "{r:#}");
    let story_work = r["landing"]["salvage_ref"].as_str().unwrap_or_default();
    assert!(
        !story_work.is_empty() && par.show(story_work, "file-1.txt") == "1\n",
        "the story's own work is not kept: {r:#}"
    );
}

/// ralph is killed (SIGKILL) after an agent committed and removed its own worktree with
/// `git worktree remove -f -f`: the next run's recovery still finds the commit, keeps it under
/// the salvage ref the recovered record names; the story's next attempt starts from the run
/// branch (a dangling commit may be any agent's).
#[test]
fn after_kill_9_a_double_forced_worktree_removal_still_keeps_the_agents_commit() {
    let par = Par::new(&prd_of(vec![story(1, "test -f file-1.txt", &[])]), &[]);
    par.story(
        "US-001",
        json!([
            [
                {"write_file": {"path": "file-1.txt", "content": "1\n"}},
                {"git_commit": "feat: US-001 first try"}
            ],
            [
                {"write_file": {"path": "file-1.txt", "content": "1 again\n"}},
                {"set_passes": {"id": "US-001", "passes": true}},
                {"git_commit": "feat: US-001 second try"},
                {"stdout": "US-001 done"}
            ]
        ]),
    );
    let marker = par.agents.join("removed");
    par.post(
        "US-001",
        0,
        &format!(
            "W=$PWD\ncd /\ngit -C \"$W\" worktree remove -f -f \"$W\"\ntouch '{}'\nsleep 60\n",
            marker.display()
        ),
    );
    let out = killed_then_rerun(&par, "the agent never removed its worktree", || {
        marker.exists()
    });
    let first = &par.records("US-001")[0];
    let (salvage, said) = named_salvage(first);
    assert!(
        !salvage.is_empty()
            && said.contains("anything it had not committed was deleted with the worktree"),
        "{first:#}\n{}",
        text(&out)
    );
    let kept = par.env.git(&["log", "--format=%s", &salvage]);
    assert!(kept.contains("feat: US-001 first try"), "{salvage}: {kept}");
    assert!(said.contains("work that may be yours is kept in"), "{said}");
    // A dangling commit may be any agent's: the next attempt starts from the run branch.
    let history = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(
        !history.contains("feat: US-001 first try") && history.contains("feat: US-001 second try"),
        "{history}\n{}",
        text(&out)
    );
}

// ---- hA2: work lost in parallel runs (issue 20, tester's killsib) ----

/// One agent (US-001) runs `git worktree remove -f -f` on its sibling's (US-002's) worktree
/// after the sibling committed; the sibling's agent ends a little later (its worker then
/// fails to read its gone worktree). The sibling's commit is kept under its salvage ref, which
/// its record names, the record does not blame the sibling's own agent, and the story's next
/// attempt starts from the kept commit.
#[test]
fn a_sibling_worktree_removed_by_another_agent_keeps_the_siblings_commit() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
        ]),
        &[],
    );
    let marker = par.agents.join("US-002.committed");
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    par.wait("US-001", 0, &format!("test -f '{}'", marker.display()));
    par.post(
        "US-001",
        0,
        &format!(
            "M='{}'\nfor w in $(git -C \"$M\" worktree list --porcelain | sed -n 's/^worktree //p' | grep '/US-002-'); do git -C \"$M\" worktree remove -f -f \"$w\"; done\n",
            par.env.repo.display()
        ),
    );
    par.story(
        "US-002",
        json!([
            [
                {"write_file": {"path": "file-2.txt", "content": "2\n"}},
                {"set_passes": {"id": "US-002", "passes": true}},
                {"git_commit": "feat: US-002 first try"},
                {"stdout": "US-002 done"}
            ],
            [
                {"write_file": {"path": "file-2.txt", "content": "2 again\n"}},
                {"set_passes": {"id": "US-002", "passes": true}},
                {"git_commit": "feat: US-002 second try"},
                {"stdout": "US-002 done"}
            ]
        ]),
    );
    // The sibling's agent ends a while after its worktree went (its landing then comes more
    // than a second after its commit).
    par.post(
        "US-002",
        0,
        &format!(
            "W=$PWD\ntouch '{}'\ni=0\nwhile [ -e \"$W/.git\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\ncd /\nsleep 2.5\n",
            marker.display()
        ),
    );
    let out = par.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = par.records("US-002")[0].clone();
    let message = first["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was deleted while the agent ran (by this or another agent)")
            && !message.contains("deleted its own worktree"),
        "{first:#}\n{}",
        text(&out)
    );
    let salvage = message
        .split_whitespace()
        .find(|w| w.starts_with("refs/ralph/salvage/"))
        .map(|w| w.trim_end_matches([',', ';', ')']))
        .unwrap_or_else(|| panic!("the record names no salvage ref: {first:#}\n{}", text(&out)));
    assert!(salvage.ends_with("/US-002"), "{salvage}");
    let kept = par.env.git(&["log", "--format=%s", salvage]);
    assert!(
        kept.lines().any(|s| s == "feat: US-002 first try"),
        "{salvage} does not hold the sibling's commit:\n{kept}\n{first:#}"
    );
    assert_eq!(par.show(BRANCH, "file-2.txt"), "2 again\n");
    assert_eq!(par.show(BRANCH, "file-1.txt"), "1\n");
}

/// With `--allow-dirty` and the user's uncommitted edit of a tracked file, an agent runs
/// `git -C <checkout> add -A` and `commit -am`: its commit swept the edit in. ralph takes the
/// commit off the branch (`git reset --keep`) and puts the user's edit back in the checkout,
/// uncommitted, as it was; the record says so and names the file.
#[test]
fn a_users_edit_swept_into_an_agents_checkout_commit_is_put_back_uncommitted() {
    let par = Par::new(
        &prd_of(vec![story(1, "test -f file-1.txt", &[])]),
        &[("notes.md", "committed notes\n")],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let main = par.env.repo.display().to_string();
    par.pre(
        "US-001",
        0,
        &format!("git -C '{main}' add -A\ngit -C '{main}' commit -qam 'x from the agent'\n"),
    );
    par.env.write("notes.md", USER_EDIT);
    let out = par.run(2, &["--allow-dirty"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let on_branch = par.env.git(&["log", "--format=%s", BRANCH]);
    assert!(
        !on_branch.contains("x from the agent"),
        "the agent's commit is still on the run branch:\n{on_branch}"
    );
    assert_eq!(par.show(BRANCH, "notes.md"), "committed notes\n");
    assert_eq!(
        par.env.read("notes.md"),
        USER_EDIT,
        "the user's uncommitted edit is not in the checkout:\n{}",
        text(&out)
    );
    assert!(
        par.env
            .git(&["status", "--porcelain"])
            .lines()
            .any(|l| l.ends_with("notes.md")),
        "the user's edit is not an uncommitted change any more"
    );
    let r = &par.records("US-001")[0];
    let (salvage, said) = named_salvage(r);
    assert!(
        !salvage.is_empty() && said.contains("notes.md") && said.contains("back in your checkout"),
        "{said}"
    );
}

/// The tester's `killsib` with `--parallel 3`: US-001's agent removes both siblings' worktrees
/// (`git worktree remove -f -f`) after each committed. Both commits are kept under salvage
/// refs that the siblings' records name (a record that finds its commit already kept for the
/// other sibling names that ref), no record blames its own agent, and both stories pass later.
#[test]
fn two_sibling_worktrees_removed_by_another_agent_keep_both_commits() {
    let par = Par::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
            story(3, "test -f file-3.txt", &[]),
        ]),
        &[],
    );
    par.story("US-001", json!([does("US-001", "file-1.txt", "1\n", 0)]));
    let mut wait = Vec::new();
    for n in [2, 3] {
        let id = format!("US-00{n}");
        let marker = par.agents.join(format!("{id}.committed"));
        wait.push(format!("test -f '{}'", marker.display()));
        par.story(
            &id,
            json!([
                [
                    {"write_file": {"path": format!("file-{n}.txt"), "content": format!("{n}\n")}},
                    {"set_passes": {"id": id, "passes": true}},
                    {"git_commit": format!("feat: {id} first try")}
                ],
                [
                    {"write_file": {"path": format!("file-{n}.txt"), "content": format!("{n} again\n")}},
                    {"set_passes": {"id": id, "passes": true}},
                    {"git_commit": format!("feat: {id} second try")}
                ]
            ]),
        );
        par.post(
            &id,
            0,
            &format!(
                "W=$PWD\ntouch '{}'\ni=0\nwhile [ -e \"$W/.git\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\ncd /\nsleep 2.5\n",
                marker.display()
            ),
        );
    }
    par.wait("US-001", 0, &wait.join(" && "));
    par.post(
        "US-001",
        0,
        &format!(
            "M='{}'\nfor w in $(git -C \"$M\" worktree list --porcelain | sed -n 's/^worktree //p' | grep -E '/US-00[23]-'); do git -C \"$M\" worktree remove -f -f \"$w\"; done\n",
            par.env.repo.display()
        ),
    );
    let out = par.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let mut kept = String::new();
    for id in ["US-002", "US-003"] {
        let first = par.records(id)[0].clone();
        let message = first["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("was deleted while the agent ran (by this or another agent)")
                && !message.contains("deleted its own worktree")
                && message.contains("refs/ralph/salvage/"),
            "{first:#}\n{}",
            text(&out)
        );
        for name in message
            .split_whitespace()
            .filter(|w| w.starts_with("refs/ralph/salvage/"))
        {
            let name = name.trim_end_matches([',', ';', ')']);
            kept.push_str(&par.env.git(&["log", "--format=%s", name]));
        }
        let n = &id[5..];
        assert_eq!(
            par.show(BRANCH, &format!("file-{n}.txt")),
            format!("{n} again\n")
        );
    }
    for lost in ["feat: US-002 first try", "feat: US-003 first try"] {
        assert!(
            kept.lines().any(|s| s == lost),
            "no named salvage ref holds {lost}:\n{kept}\n{}",
            text(&out)
        );
    }
}
// ---- end hA2 ----
