//! `ralph run --parallel N` as a user meets it in the field (issue 20, "Tests and benchmark"):
//! the whole mix of the issue's acceptance with the real claude CLI against the scripted model,
//! `--push` with several workers, and the fixes of the final tester's findings (a checkout
//! switched mid-run, a user's own commit, an agent checking out `main`, `--max-cost` with three
//! workers, a hint without `--story`, an agent's `.env.local`).
//!
//! Order is decided by scripts, never by timing: an agent that must meet another's landing waits
//! for it (a bash condition polled every 100 ms: a file on the run branch, another agent's start
//! marker, a go file the test writes), so a loaded machine runs the same story in every run.
//!
//! The fake-agent tests drive the per-story scripted agent of tests/it/common/par.rs
//! ([`Field`], a [`Par`] whose agent also stands in for claude with `--agent-program`): it
//! keeps each prompt (`agents/<story>.prompt.<n>`, n from 0), runs `agents/<story>.pre.<n>` in
//! its directory (a shell step an agent would take), waits for `agents/<story>.wait.<n>`, plays
//! the fake agent with the story's script (`agents/<story>.json`), then runs
//! `agents/<story>.post.<n>`.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::par::{
    assert_no_worktrees, assert_numbering, landing_kind, prd_of, simple_stories, story, Par,
    BRANCH, USER_TEXT,
};
use crate::common::{text, wait_exit};

/// The user's own file, ignored by git (`*.mine`): no landing may touch it.
const USER_FILE: &str = "notes.mine";

/// A repository for a parallel run with the scripted fake agent, one script per story: a
/// [`Par`] whose user file is [`USER_FILE`], whose agent answers `--version` and passes claude's
/// arguments on (so that `--agent claude --agent-program` can run it too) and waits up to 180 s,
/// with the helpers below.
struct Field(Par);

impl Deref for Field {
    type Target = Par;

    fn deref(&self) -> &Par {
        &self.0
    }
}

impl Field {
    /// A repository with `prd`, a `.gitignore` for `*.mine`, the user's ignored file and `extra`
    /// files, all committed on `main`.
    fn new(prd: &Value, extra: &[(&str, &str)]) -> Field {
        Field(
            Par::builder(prd, extra)
                .user_file(USER_FILE)
                .answers_version()
                .passes_args()
                .wait_secs(180)
                .build(),
        )
    }

    /// Writes `name` in the agents' folder.
    fn put(&self, name: &str, content: &str) {
        std::fs::write(self.agents.join(name), content).expect("write in agents/");
    }

    /// The go file the test writes when the agents waiting on [`Field::go`] may finish.
    fn go_file(&self) -> PathBuf {
        self.agents.join("go")
    }

    /// A bash condition: the test said go.
    fn go(&self) -> String {
        format!("test -f '{}'", self.go_file().display())
    }

    /// A bash condition: each of `ids`' agents has started.
    fn started(&self, ids: &[&str]) -> String {
        ids.iter()
            .map(|id| self.0.started(id))
            .collect::<Vec<_>>()
            .join(" && ")
    }

    /// Waits (at most 120 s) until every one of `ids`' agents has started.
    fn wait_started(&self, ids: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while ids.iter().any(|id| self.calls(id) == 0) {
            assert!(
                Instant::now() < deadline,
                "the agents of {ids:?} never all started:\n{}",
                self.env.spawned_output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The files on `rev`.
    fn files_at(&self, rev: &str) -> Vec<String> {
        self.env
            .git(&["ls-tree", "-r", "--name-only", rev])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `git rev-parse <rev>`.
    fn sha(&self, rev: &str) -> String {
        self.env.git(&["rev-parse", rev]).trim().to_owned()
    }

    /// Every reference under `prefix`, with its commit: `sha refname` lines.
    fn refs(&self, prefix: &str) -> String {
        self.env
            .git(&["for-each-ref", "--format=%(objectname) %(refname)", prefix])
    }
}

/// An exec-agent attempt that writes `file`, marks `id` passing and commits.
fn does(id: &str, file: &str, content: &str) -> Value {
    crate::common::par::does(id, file, content, 0)
}

/// Whether every story of prd.json passes.
fn all_pass(prd: &Value) -> bool {
    prd["userStories"]
        .as_array()
        .is_some_and(|a| a.iter().all(|s| s["passes"] == true))
}

/// Scripts both stories of [`simple_stories`]`(2)`: attempt `n` of `US-00<i>` writes
/// `file-<i>.txt` holding `contents[n]` (the last one again past the end), marks the story
/// passing and commits; the first attempt waits for the test's go ([`Field::go`]).
fn two_stories_waiting_for_go(f: &Field, contents: &[&str]) {
    for i in 1..=2 {
        let id = format!("US-{i:03}");
        let file = format!("file-{i}.txt");
        let attempts: Vec<Value> = contents.iter().map(|c| does(&id, &file, c)).collect();
        f.story(&id, Value::Array(attempts));
        f.wait(&id, 0, &f.go());
    }
}

/// `ralph run --parallel 2 <extra>` in the background: once both stories' agents started,
/// `meanwhile` does what the user does mid-run, then the test says go and waits for the run's
/// end (at most 300 s). Returns what `meanwhile` returned, the run's exit code and what it
/// printed.
fn with_user_mid_run<T>(
    f: &Field,
    extra: &[&str],
    meanwhile: impl FnOnce() -> T,
) -> (T, i32, String) {
    let mut child = f.spawn(2, extra);
    f.wait_started(&["US-001", "US-002"]);
    let seen = meanwhile();
    std::fs::write(f.go_file(), "").expect("go");
    let (code, _) = wait_exit(&f.env, &mut child, Duration::from_secs(300));
    (seen, code, f.env.spawned_output())
}

/// The user commits `file` holding `content` in the checkout, with `message`: the commit's sha.
fn user_commits(f: &Field, file: &str, content: &str, message: &str) -> String {
    f.env.write(file, content);
    f.env.git(&["add", file]);
    f.env.git(&["commit", "-q", "-m", message]);
    f.sha("HEAD")
}

/// Whether `commit` is in `rev`'s history (`git merge-base --is-ancestor`).
fn is_ancestor(f: &Field, commit: &str, rev: &str) -> bool {
    Command::new("git")
        .args(["merge-base", "--is-ancestor", commit, rev])
        .current_dir(&f.env.repo)
        .env_clear()
        .envs(f.env.envs())
        .status()
        .expect("git merge-base")
        .success()
}

/// A bare repository beside the project, added as `origin`, with `main` pushed: its path.
fn with_remote(f: &Field) -> PathBuf {
    let bare = f.env.root.path().join("remote.git");
    let bare_s = bare.display().to_string();
    f.env.git(&["init", "-q", "--bare", "-b", "main", &bare_s]);
    f.env.git(&["remote", "add", "origin", &bare_s]);
    f.env.git(&["push", "-q", "origin", "main"]);
    bare
}

/// Asserts that each of `files` is on the run branch.
fn assert_on_branch(f: &Field, files: &[&str]) {
    let on_branch = f.files_at(BRANCH);
    for file in files {
        assert!(
            on_branch.contains(&(*file).to_owned()),
            "{file}: {on_branch:?}"
        );
    }
}

/// The `sha refname` lines of the refs under `refs/ralph/` whose line holds `name`.
fn ralph_refs_with(f: &Field, name: &str) -> Vec<String> {
    f.refs("refs/ralph/")
        .lines()
        .filter(|l| l.contains(name))
        .map(str::to_owned)
        .collect()
}

/// Scripts `n` stories for `--agent claude`: story `i` writes `file-<i>.txt`, marks itself
/// passing, commits and reports `cost_usd` dollars.
fn costing_stories(f: &Field, n: usize, cost_usd: f64) {
    for i in 1..=n {
        let id = format!("US-{i:03}");
        f.story(
            &id,
            json!([[
                {"claude_init": {}},
                {"write_file": {"path": format!("file-{i}.txt"), "content": "x\n"}},
                {"set_passes": {"id": id, "passes": true}},
                {"git_commit": format!("feat: {id}")},
                {"claude_result": {"text": format!("{id} done"), "cost_usd": cost_usd}}
            ]]),
        );
    }
}

/// `ralph run --parallel 3 --agent claude --agent-program <the scripted agent>` with `extra`
/// flags, to its end.
fn run_as_claude(f: &Field, extra: &[&str]) -> Output {
    let wrapper = f.wrapper.display().to_string();
    let mut args = vec![
        "run",
        "--parallel",
        "3",
        "--agent",
        "claude",
        "--agent-program",
        &wrapper,
    ];
    args.extend_from_slice(extra);
    f.env.ralph(&args)
}

/// What the ledger's iterations cost in all, in dollars.
fn spent(ledger: &[Value]) -> f64 {
    ledger
        .iter()
        .map(|r| r["cost_usd"].as_f64().unwrap_or(0.0))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// 1. The issue's acceptance with the real claude CLI against the scripted model.
// ---------------------------------------------------------------------------------------------

/// The run branch of the field PRD.
const FIELD_BRANCH: &str = "ralph/field";

/// A project for the real CLI: `src` is copied into a fresh repository (one commit on `main`)
/// by the harness of `support_model`; the agents' scripts live in `agents/` beside it.
struct RealField {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    repo: PathBuf,
    sandbox: PathBuf,
    agents: PathBuf,
}

impl RealField {
    fn new(prd: &Value, files: &[(&str, &str)]) -> RealField {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let src = root.join("src");
        std::fs::create_dir_all(&src).expect("mkdir src");
        let mut all: Vec<(&str, String)> = vec![(
            "prd.json",
            format!("{}\n", serde_json::to_string_pretty(prd).expect("json")),
        )];
        all.extend(files.iter().map(|(p, c)| (*p, (*c).to_owned())));
        for (path, content) in all {
            let p = src.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, content).expect("write a project file");
        }
        let repo = root.join("project");
        let sandbox = root.join("sandbox");
        crate::support_model::init_repo_from_example(&src, &repo, &sandbox);
        let agents = root.join("agents");
        std::fs::create_dir_all(&agents).expect("mkdir agents");
        RealField {
            _tmp: tmp,
            root,
            repo,
            sandbox,
            agents,
        }
    }

    fn git(&self, args: &[&str]) -> String {
        crate::support_model::git(&self.repo, &self.sandbox, args)
    }

    /// `git show rev:rel`, empty when there is no such file.
    fn show(&self, rev: &str, rel: &str) -> String {
        let mut cmd = Command::new("git");
        cmd.args(["show", &format!("{rev}:{rel}")])
            .current_dir(&self.repo);
        crate::support_model::hermetic_env(&mut cmd, &self.sandbox);
        let out = cmd.output().expect("git show");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn put(&self, name: &str, content: &str) {
        std::fs::write(self.agents.join(name), content).expect("write in agents/");
    }

    /// `ralph <args>` with the hermetic environment of the real-CLI harness, no model.
    fn ralph(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(crate::common::ralph_bin());
        cmd.args(args).current_dir(&self.repo);
        crate::support_model::hermetic_env(&mut cmd, &self.sandbox);
        cmd.output().expect("run ralph")
    }

    fn ledger(&self) -> Vec<Value> {
        crate::support_model::read_jsonl(&self.repo.join(".ralph/ledger.jsonl"))
    }

    fn records(&self, id: &str) -> Vec<Value> {
        self.ledger()
            .into_iter()
            .filter(|r| r["story_id"] == id)
            .collect()
    }

    /// The prompt ralph gave the iteration of `record` (kept with `--verbose`).
    fn prompt(&self, run_id: &str, record: &Value) -> String {
        let n = record["iteration"].as_u64().unwrap_or(0);
        std::fs::read_to_string(
            self.repo
                .join(format!(".ralph/runs/{run_id}/iter-{n:03}.prompt.md")),
        )
        .unwrap_or_default()
    }

    /// The start marker of `id`'s attempt `n`: its directory, then the files it found.
    fn started(&self, id: &str, n: usize) -> Option<String> {
        std::fs::read_to_string(self.agents.join(format!("{id}.started.{n}"))).ok()
    }
}

/// The shell step every story's claude runs first and again to do its work:
/// `step.sh <story> <tree> start|work`. `start` notes the attempt (`<story>.started.<n>`: the
/// directory, then the files present) and waits for `<story>.wait.<n>` when there is one; `work`
/// runs `<story>.work.<n>` (the last one again past the end) in the tree, then marks the story
/// passing in the tree's prd.json and commits everything.
fn step_script(agents: &Path) -> String {
    format!(
        r#"#!/bin/bash
story=$1; tree=$2; phase=$3; dir='{agents}'
cd "$tree" || exit 1
if [ "$phase" = start ]; then
  n=$(ls "$dir/$story".started.* 2>/dev/null | wc -l)
  printf '%s\n%s\n' "$PWD" "$(ls | tr '\n' ' ')" > "$dir/$story.started.$n"
  echo "$n" > "$dir/$story.current"
  if [ -f "$dir/$story.wait.$n" ]; then
    for _ in $(seq 3000); do bash "$dir/$story.wait.$n" && break; sleep 0.1; done
  fi
  echo "attempt $n of $story in $PWD"
  exit 0
fi
n=$(cat "$dir/$story.current")
while [ "$n" -gt 0 ] && [ ! -f "$dir/$story.work.$n" ]; do n=$((n - 1)); done
bash -e "$dir/$story.work.$n" || exit 1
python3 - "$story" <<'EOF'
import collections, json, pathlib, sys
p = pathlib.Path("prd.json")
d = json.loads(p.read_text(encoding="utf-8"), object_pairs_hook=collections.OrderedDict)
for s in d["userStories"]:
    if s["id"] == sys.argv[1]:
        s["passes"] = True
p.write_text(json.dumps(d, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
EOF
git add -A && git commit -q -m "feat: $story"
echo "committed $story"
"#,
        agents = agents.display()
    )
}

/// The scripted model's turns for every story: a Bash call to `step.sh start` (which may wait
/// for another story), a Write of the story's notes, a Bash call to `step.sh work`, the answer.
fn field_scenario(agents: &Path, ids: &[&str]) -> Value {
    let step = agents.join("step.sh");
    let bash = |phase: &str, what: &str| {
        json!({
            "text": format!("{what} {{story}}."),
            "tool": "Bash",
            "input": {
                "command": format!("bash '{}' {{story}} '{{repo}}' {phase}", step.display()),
                "description": format!("{what} {{story}}"),
                "timeout": 600_000
            }
        })
    };
    let steps = json!([
        bash("start", "Look at the project for"),
        {"write": {"path": "notes/{story}.md", "content": "# {story}\n\nWhat I did.\n"}},
        bash("work", "Implement and commit"),
        {"final": "Implemented {story}.", "promise": "never"}
    ]);
    let stories: serde_json::Map<String, Value> = ids
        .iter()
        .map(|id| ((*id).to_owned(), steps.clone()))
        .collect();
    json!({"description": "parallel field mix", "stories": stories})
}

/// The mix of the issue's acceptance, 8 stories, `--parallel 3`, the real claude CLI:
///
/// - US-001 independent; US-002 depends on it (a chain) and finds its file;
/// - US-003 and US-004 write one line of shared.txt from the same tip: US-004 meets US-003's
///   landing as a conflict, its work kept under a salvage ref, and passes at its second
///   attempt from the new tip;
/// - US-005's check passes alone but fails once US-002 landed (reverted, verify_failed), and its
///   next attempt passes;
/// - US-006 never passes its check (blocked after two attempts) and US-007, which depends on
///   it, is blocked too ("waits for US-006") and never started;
/// - US-008's worktree setup fails: setup_failed, no agent.
///
/// Order comes from waits in the agents' scripts: US-003 finishes once US-004's agent runs,
/// US-004 once US-003 landed; US-002 once US-005's agent runs, US-005 once US-002 landed.
#[test]
fn real_claude_runs_the_whole_mix_three_at_a_time() {
    let Some(claude) =
        crate::support_model::claude_bin_or_skip("real_claude_runs_the_whole_mix_three_at_a_time")
    else {
        return;
    };
    let v5 = "test -f e.txt && { test ! -f b.txt || grep -qx with-b e.txt; }";
    let mut prd = prd_of(vec![
        story(1, "test -f a.txt", &[]),
        story(2, "test -f a.txt && test -f b.txt", &["US-001"]),
        story(3, "grep -q \"A's line\" shared.txt", &[]),
        story(4, "grep -q \"B's line\" shared.txt", &[]),
        story(5, v5, &[]),
        story(6, "test -f never.txt", &[]),
        story(7, "test -f g.txt", &["US-006"]),
        story(8, "test -f h.txt", &[]),
    ]);
    prd["branchName"] = json!(FIELD_BRANCH);
    let fx = RealField::new(
        &prd,
        &[
            ("README.md", "field project\n"),
            ("shared.txt", "original line\n"),
            (
                "ralph.toml",
                "worktree_setup = \"case \\\"$PWD\\\" in */US-008-*) echo 'setup broke for US-008' >&2; exit 1;; esac\"\n",
            ),
        ],
    );
    let agents = fx.agents.clone();
    let repo = fx.repo.display().to_string();
    fx.put("step.sh", &step_script(&agents));
    let started = |id: &str| {
        format!(
            "test -f '{}'",
            agents.join(format!("{id}.started.0")).display()
        )
    };
    fx.put(
        "US-001.work.0",
        "test -f shared.txt\nprintf 'a\\n' > a.txt\n",
    );
    fx.put("US-002.work.0", "test -f a.txt\nprintf 'b\\n' > b.txt\n");
    fx.put("US-002.wait.0", &started("US-005"));
    fx.put("US-003.work.0", "printf \"A's line\\n\" > shared.txt\n");
    fx.put("US-003.wait.0", &started("US-004"));
    fx.put("US-004.work.0", "printf \"B's line\\n\" > shared.txt\n");
    fx.put(
        "US-004.work.1",
        "printf \"A's line\\nB's line\\n\" > shared.txt\n",
    );
    fx.put(
        "US-004.wait.0",
        &format!(
            "git -C '{repo}' show '{FIELD_BRANCH}:shared.txt' 2>/dev/null | grep -q \"A's line\""
        ),
    );
    fx.put("US-005.work.0", "printf 'alone\\n' > e.txt\n");
    fx.put("US-005.work.1", "printf 'with-b\\n' > e.txt\n");
    fx.put(
        "US-005.wait.0",
        &format!("git -C '{repo}' cat-file -e '{FIELD_BRANCH}:b.txt' 2>/dev/null"),
    );
    fx.put("US-006.work.0", "printf 'f\\n' > f.txt\n");
    fx.put("US-007.work.0", "printf 'g\\n' > g.txt\n");
    fx.put("US-008.work.0", "printf 'h\\n' > h.txt\n");
    let ids = [
        "US-001", "US-002", "US-003", "US-004", "US-005", "US-006", "US-007", "US-008",
    ];
    let scenario = fx.root.join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec_pretty(&field_scenario(&agents, &ids)).expect("json"),
    )
    .expect("write the scenario");

    let mut ralph = Command::new(crate::common::ralph_bin());
    ralph
        .args([
            "run",
            "--agent",
            "claude",
            "--parallel",
            "3",
            "--max-iter",
            "20",
            "--max-attempts",
            "2",
            "--keep-api-key",
            // Keeps each prompt beside its transcript (iter-NNN.prompt.md).
            "--verbose",
        ])
        .env("RALPH_AGENT_PROGRAM", &claude)
        .current_dir(&fx.repo);
    crate::support_model::hermetic_env(&mut ralph, &fx.sandbox);
    let log = fx.root.join("model-log.jsonl");
    let wrapped = crate::support_model::isolated(&crate::support_model::with_scripted_model(
        &ralph, &scenario, &log,
    ));
    let mut out = crate::support_model::run_with_deadline(
        wrapped,
        &fx.root.join("run"),
        Duration::from_secs(1200),
    );
    out.extra_log = Some(log.clone());
    let status = fx.ralph(&["status"]);
    let run_said = format!("{out}\n--- ralph status\n{}", text(&status));

    // Three stories blocked (US-006 failing, US-007 behind it, US-008's setup): exit 4.
    assert_eq!(out.status.and_then(|s| s.code()), Some(4), "{run_said}");
    let ledger = fx.ledger();
    assert_numbering(&ledger, "the run");
    let outcomes = |id: &str| -> Vec<String> {
        fx.records(id)
            .iter()
            .map(|r| r["outcome"].as_str().unwrap_or("?").to_owned())
            .collect()
    };
    for id in ["US-001", "US-002", "US-003"] {
        assert_eq!(outcomes(id), ["story_passed"], "{id}: {ledger:#?}");
    }
    // Every agent worked in its own worktree, three at most at once.
    for r in &ledger {
        if r["outcome"] == "setup_failed" {
            continue;
        }
        assert!(
            r["worker"].as_u64().is_some_and(|w| (1..=3).contains(&w)),
            "{r:#}"
        );
        let wt = r["worktree"].as_str().unwrap_or("");
        assert!(wt.starts_with(".ralph/worktrees/"), "{r:#}");
    }
    // The chain: US-002's agent found US-001's file in its worktree.
    let b_start = fx.started("US-002", 0).unwrap_or_default();
    assert!(
        b_start.contains(".ralph/worktrees/") && b_start.contains("a.txt"),
        "US-002 did not start from US-001's landed work: {b_start}"
    );

    // The conflict: kept under the salvage ref the record names, then passed from the new tip.
    let d = fx.records("US-004");
    assert_eq!(outcomes("US-004"), ["conflict", "story_passed"], "{d:#?}");
    assert_eq!(landing_kind(&d[0]), "conflict", "{:#}", d[0]);
    assert_eq!(
        d[0]["landing"]["files"],
        json!(["shared.txt"]),
        "{:#}",
        d[0]
    );
    let run_id = d[0]["run_id"].as_str().expect("run id").to_owned();
    let salvage_d = format!("refs/ralph/salvage/{run_id}/US-004");
    assert_eq!(
        d[0]["landing"]["salvage_ref"],
        salvage_d.as_str(),
        "{:#}",
        d[0]
    );
    assert_eq!(fx.show(&salvage_d, "shared.txt"), "B's line\n");
    assert_eq!(fx.show(FIELD_BRANCH, "shared.txt"), "A's line\nB's line\n");
    // The retry's prompt told the agent about the conflict.
    let retry = fx.prompt(&run_id, &d[1]);
    assert!(
        retry.contains("conflict") && retry.contains("shared.txt"),
        "US-004's retry was not told about the conflict:\n{retry}"
    );

    // The check that fails once another story landed: reverted, then passed.
    let e = fx.records("US-005");
    assert_eq!(
        outcomes("US-005"),
        ["verify_failed", "story_passed"],
        "{e:#?}"
    );
    assert_eq!(landing_kind(&e[0]), "reverted", "{:#}", e[0]);
    assert!(
        e[0]["landing"]["landed_since"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("US-002"))),
        "{:#}",
        e[0]
    );
    let salvage_e = e[0]["landing"]["salvage_ref"]
        .as_str()
        .expect("salvage_ref")
        .to_owned();
    assert_eq!(fx.show(&salvage_e, "e.txt"), "alone\n");
    let retry = fx.prompt(&run_id, &e[1]);
    assert!(
        retry.contains("US-002"),
        "US-005's retry does not name the landed story its check failed with:\n{retry}"
    );
    assert_eq!(fx.show(FIELD_BRANCH, "e.txt"), "with-b\n");

    // The failing story: two attempts, blocked; its dependent never started.
    assert_eq!(
        outcomes("US-006"),
        ["verify_failed", "verify_failed"],
        "{ledger:#?}"
    );
    assert!(fx.records("US-007").is_empty(), "{ledger:#?}");
    assert!(fx.started("US-007", 0).is_none(), "an agent ran for US-007");
    assert!(
        run_said.contains("waits for US-006"),
        "no 'waits for US-006' in the run's or status's output:\n{run_said}"
    );
    // The failed setup: its output on record, no agent, no model request for it.
    let h = fx.records("US-008");
    assert_eq!(outcomes("US-008"), ["setup_failed"], "{h:#?}");
    assert!(
        format!("{:#}", h[0]).contains("setup broke for US-008"),
        "{:#}",
        h[0]
    );
    assert!(fx.started("US-008", 0).is_none(), "an agent ran for US-008");
    let requests = crate::support_model::read_jsonl(&log);
    assert!(
        !requests
            .iter()
            .any(|r| r["story"] == "US-008" || r["story"] == "US-007"),
        "the model was asked about US-007 or US-008"
    );
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(fx.repo.join(".ralph/state.json")).expect("state.json"),
    )
    .expect("state.json is JSON");
    let mut blocked: Vec<&str> = state["blocked"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    blocked.sort_unstable();
    assert_eq!(blocked, ["US-006", "US-008"], "{state:#}");

    // prd.json in the checkout: what landed passes, nothing else.
    let prd: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.repo.join("prd.json")).expect("prd.json"))
            .expect("prd.json is JSON");
    let passes: Vec<(String, bool)> = prd["userStories"]
        .as_array()
        .expect("stories")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or("?").to_owned(),
                s["passes"] == true,
            )
        })
        .collect();
    let want: Vec<(String, bool)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ((*id).to_owned(), i < 5))
        .collect();
    assert_eq!(passes, want, "{run_said}");
    // The run branch has the landed stories' work and nothing of the others.
    let files: Vec<String> = fx
        .git(&["ls-tree", "-r", "--name-only", FIELD_BRANCH])
        .lines()
        .map(str::to_owned)
        .collect();
    for f in [
        "a.txt",
        "b.txt",
        "e.txt",
        "shared.txt",
        "notes/US-001.md",
        "notes/US-002.md",
        "notes/US-003.md",
        "notes/US-004.md",
        "notes/US-005.md",
    ] {
        assert!(
            files.contains(&f.to_owned()),
            "{f} is not on {FIELD_BRANCH}: {files:?}"
        );
    }
    for f in ["f.txt", "g.txt", "h.txt", "notes/US-006.md", "never.txt"] {
        assert!(
            !files.contains(&f.to_owned()),
            "{f} is on {FIELD_BRANCH}: {files:?}"
        );
    }
    // The salvage refs named in the records exist.
    let salvage = fx.git(&["for-each-ref", "--format=%(refname)", "refs/ralph/salvage/"]);
    for r in &ledger {
        if let Some(name) = r["landing"]["salvage_ref"].as_str() {
            assert!(
                salvage.lines().any(|l| l == name),
                "{name} missing: {salvage}"
            );
        }
    }
    // The morning: on the run branch, clean, no conflict marker, no worktree left.
    assert_eq!(
        fx.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        FIELD_BRANCH
    );
    assert_eq!(fx.git(&["status", "--porcelain"]), "", "{run_said}");
    assert_eq!(
        fx.git(&["diff", "--cached", "--name-only"]),
        "",
        "the index is not clean"
    );
    let markers = fx.show(FIELD_BRANCH, "shared.txt");
    assert!(
        !markers.contains("<<<<<<<") && !markers.contains(">>>>>>>"),
        "{markers}"
    );
    assert_no_worktrees(&fx.repo, &fx.git(&["worktree", "list", "--porcelain"]));
}

// ---------------------------------------------------------------------------------------------
// 2. --push with --parallel.
// ---------------------------------------------------------------------------------------------

/// With `--push`, the remote gets the run branch with every landed story and ralph's refs
/// (salvage refs and the lease), never a branch an agent made in its worktree.
#[test]
fn push_with_three_workers_sends_the_run_branch_and_ralphs_refs_only() {
    let f = Field::new(
        &prd_of(vec![
            story(1, "grep -q A shared.txt", &[]),
            story(2, "grep -q B shared.txt", &[]),
            story(3, "test -f file-3.txt", &[]),
        ]),
        &[("shared.txt", "original line\n")],
    );
    let bare = with_remote(&f);
    // US-001 and US-002 conflict on one line (US-002 writes it once US-001 landed); US-003's
    // agent makes a branch of its own in its worktree and commits there.
    f.story(
        "US-001",
        json!([does("US-001", "shared.txt", "A's line\n")]),
    );
    f.story(
        "US-002",
        json!([
            does("US-002", "shared.txt", "B's line\n"),
            does("US-002", "shared.txt", "A's line\nB's line\n")
        ]),
    );
    f.wait("US-001", 0, &f.started(&["US-002"]));
    f.wait(
        "US-002",
        0,
        &format!(
            "git -C '{}' show '{BRANCH}:shared.txt' 2>/dev/null | grep -q \"A's line\"",
            f.env.repo.display()
        ),
    );
    f.story("US-003", json!([does("US-003", "file-3.txt", "3\n")]));
    f.put("US-003.pre.0", "git checkout -q -b wip/US-003\n");
    let out = f.run(3, &["--push"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    assert_eq!(f.records("US-002")[0]["outcome"], "conflict");

    let remote_refs = Command::new("git")
        .args(["for-each-ref", "--format=%(objectname) %(refname)"])
        .current_dir(&bare)
        .env_clear()
        .envs(f.env.envs())
        .output()
        .expect("git for-each-ref");
    let remote_refs = String::from_utf8_lossy(&remote_refs.stdout).into_owned();
    let names: Vec<&str> = remote_refs
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, n)| n))
        .collect();
    // The worker's own branch exists here, not on the remote; nothing but main (pushed by the
    // test), the run branch and refs/ralph/* is there.
    assert!(
        f.env
            .git(&["branch", "--list", "wip/US-003"])
            .contains("wip/US-003"),
        "the agent's branch is gone locally"
    );
    for name in &names {
        assert!(
            *name == "refs/heads/main"
                || *name == format!("refs/heads/{BRANCH}")
                || name.starts_with("refs/ralph/"),
            "the remote has {name}:\n{remote_refs}"
        );
    }
    assert!(
        names.contains(&format!("refs/ralph/lease/{BRANCH}").as_str()),
        "no lease on the remote:\n{remote_refs}"
    );
    // The remote branch is the local one, with every landed story.
    let tip = f.sha(BRANCH);
    assert!(
        remote_refs.contains(&format!("{tip} refs/heads/{BRANCH}")),
        "the remote branch is not at {tip}:\n{remote_refs}"
    );
    assert_on_branch(&f, &["shared.txt", "file-3.txt"]);
    assert_eq!(f.show(BRANCH, "shared.txt"), "A's line\nB's line\n");
    // Every salvage ref is on the remote at the same commit.
    let salvage = f.refs("refs/ralph/salvage/");
    assert!(
        salvage.contains("/US-002"),
        "no salvage ref for the conflict: {salvage}"
    );
    for line in salvage.lines() {
        assert!(
            remote_refs.lines().any(|l| l == line),
            "{line} is not on the remote:\n{remote_refs}"
        );
    }
    f.assert_tidy(&out);
}

// ---------------------------------------------------------------------------------------------
// 3. The fixes of the final tester's findings.
// ---------------------------------------------------------------------------------------------

/// (a) The user switches the checkout to `main` while two stories run: the run stops without
/// landing, committing or moving any branch. Back on the run branch, the next run records the
/// flights and completes.
#[test]
fn a_checkout_switched_mid_run_stops_without_landing_and_the_next_run_completes() {
    let f = Field::new(&simple_stories(2), &[]);
    two_stories_waiting_for_go(&f, &["first\n", "again\n"]);
    let ((branches, status_before), code, first) = with_user_mid_run(&f, &[], || {
        f.env.git(&["checkout", "-q", "main"]);
        (f.refs("refs/heads/"), f.env.git(&["status", "--porcelain"]))
    });
    assert_eq!(code, 1, "{first}");
    assert!(
        first.contains("switched"),
        "the run does not say why:\n{first}"
    );
    // Nothing landed, nothing committed, no branch moved, the user's checkout as they left it.
    assert_eq!(f.refs("refs/heads/"), branches, "{first}");
    assert_eq!(
        f.env.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "main"
    );
    assert_eq!(f.env.git(&["status", "--porcelain"]), status_before);
    assert!(
        f.env
            .ledger()
            .iter()
            .all(|r| r["outcome"] != "story_passed"),
        "{:#?}",
        f.env.ledger()
    );
    assert_eq!(f.env.read(USER_FILE), USER_TEXT);

    f.env.git(&["checkout", "-q", BRANCH]);
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{first}\n{}", text(&out));
    let ledger = f.env.ledger();
    assert_numbering(&ledger, "the run");
    // The first run's two iterations are on record, as the first two.
    let first_two: Vec<&str> = ledger
        .iter()
        .filter(|r| r["iteration"].as_u64().is_some_and(|n| n <= 2))
        .filter_map(|r| r["story_id"].as_str())
        .collect();
    assert_eq!(first_two.len(), 2, "{ledger:#?}");
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    assert_on_branch(&f, &["file-1.txt", "file-2.txt"]);
    f.assert_tidy(&out);
}

/// (b) A commit the user makes on the run branch in the checkout while stories run is kept:
/// the branch builds on it, nothing is put back.
#[test]
fn a_users_own_commit_on_the_run_branch_mid_run_is_kept() {
    let f = Field::new(&simple_stories(2), &[]);
    two_stories_waiting_for_go(&f, &["x\n"]);
    let (mine, code, said) = with_user_mid_run(&f, &[], || {
        user_commits(
            &f,
            "docs-by-me.txt",
            "the user's own change\n",
            "my own change",
        )
    });
    assert_eq!(code, 0, "{said}");
    assert!(all_pass(&f.env.prd()), "{said}");
    // The user's commit is in the branch's history, its file on the branch.
    assert!(
        is_ancestor(&f, &mine, BRANCH),
        "the user's commit was put back:\n{said}"
    );
    assert_eq!(f.show(BRANCH, "docs-by-me.txt"), "the user's own change\n");
    assert_on_branch(&f, &["file-1.txt", "file-2.txt"]);
    // Not taken for an agent moving the branch.
    let moved = ralph_refs_with(&f, "moved-branch");
    assert!(moved.is_empty(), "{moved:?}\n{said}");
    for r in f.env.ledger() {
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
    }
    let out = f.env.ralph(&["status"]);
    f.assert_tidy(&out);
}

/// (c) An agent runs `git checkout main` in its worktree and commits there: `main` moves by that
/// commit only (ralph puts the worktree's start back without moving it), and every story lands.
#[test]
fn an_agent_checking_out_main_in_its_worktree_moves_main_only_by_its_own_commit() {
    let f = Field::new(&simple_stories(2), &[]);
    let main_before = f.sha("main");
    f.story("US-001", json!([does("US-001", "file-1.txt", "1\n")]));
    f.story("US-002", json!([does("US-002", "file-2.txt", "2\n")]));
    f.put("US-001.pre.0", "git checkout -q main\n");
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    // main holds the agent's one commit on top of where it was, nothing else.
    let on_main = f
        .env
        .git(&["log", "--format=%s", &format!("{main_before}..main")]);
    assert_eq!(on_main, "feat: US-001\n", "{}", text(&out));
    assert_eq!(f.sha("main^"), main_before);
    // The run branch has both stories; main is not part of it beyond its old tip.
    assert_on_branch(&f, &["file-1.txt", "file-2.txt"]);
    for r in f.env.ledger() {
        assert_eq!(r["outcome"], "story_passed", "{r:#}");
    }
    f.assert_tidy(&out);
}

/// (d) `--max-cost 1.0` with three workers and $0.30 iterations: no new story starts while
/// the iterations in flight would likely cross the limit, so the run spends at most the limit
/// plus the one iteration started while the estimate was still under it.
///
/// The first three stories start at once (no cost is known yet) and land in turn (US-002 waits
/// for US-001's landing, US-003 for US-002's). After each landing, the iterations in flight at
/// the average cost would cross $1.00: nothing starts. With nothing in flight at $0.90, one more
/// starts (as in a serial run); at $1.20 the run stops.
#[test]
fn max_cost_with_three_workers_stops_launching_before_flights_would_cross_it() {
    let f = Field::new(&simple_stories(6), &[]);
    costing_stories(&f, 6, 0.3);
    f.wait("US-002", 0, &f.landed("file-1.txt"));
    f.wait("US-003", 0, &f.landed("file-2.txt"));
    let out = run_as_claude(&f, &["--max-iter", "20", "--max-cost", "1.0"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("max-cost"),
        "the run does not say it stopped on --max-cost:\n{}",
        text(&out)
    );
    let ledger = f.env.ledger();
    let spent = spent(&ledger);
    assert!(
        spent <= 1.0 + 0.3 + 1e-9,
        "spent ${spent:.2} against a $1.00 limit: {ledger:#?}"
    );
    assert_eq!(ledger.len(), 4, "{ledger:#?}");
    assert_numbering(&ledger, "the run");
    for id in ["US-005", "US-006"] {
        assert_eq!(f.calls(id), 0, "{id} started past the limit");
    }
    f.assert_tidy(&out);
}

/// (e) A hint without `--story`, given before a run whose three workers start at once, reaches
/// exactly one iteration: one prompt, one record.
#[test]
fn a_hint_without_story_reaches_exactly_one_of_three_workers() {
    const NOTE: &str = "Keep the files short";
    let f = Field::new(&simple_stories(3), &[]);
    let all = ["US-001", "US-002", "US-003"];
    for (i, id) in all.iter().enumerate() {
        f.story(id, json!([does(id, &format!("file-{}.txt", i + 1), "x\n")]));
        // None finishes before all three have their prompts.
        f.wait(id, 0, &f.started(&all));
    }
    let hint = f.env.ralph(&["hint", NOTE]);
    assert_eq!(hint.status.code(), Some(0), "{}", text(&hint));
    let out = f.run(3, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let with_note: Vec<&str> = all
        .iter()
        .copied()
        .filter(|id| f.prompt(id, 0).contains(NOTE))
        .collect();
    assert_eq!(with_note.len(), 1, "the hint reached {with_note:?}");
    let ledger = f.env.ledger();
    let carried: Vec<&Value> = ledger
        .iter()
        .filter(|r| r.get("hints").is_some_and(|h| h != &json!([])))
        .collect();
    assert_eq!(carried.len(), 1, "{ledger:#?}");
    assert_eq!(carried[0]["hints"], json!([{"id": 1, "text": NOTE}]));
    assert_eq!(carried[0]["story_id"], with_note[0]);
    f.assert_tidy(&out);
}

/// (f) An agent leaves an untracked `.env.local` in its worktree: it is not committed (not on
/// the branch, not in any ref), it is kept under `.ralph/kept/<run>/<iteration>/`, and the
/// iteration's findings name it.
#[test]
fn an_agents_untracked_env_local_is_kept_not_committed_and_named() {
    let f = Field::new(&simple_stories(2), &[]);
    f.story("US-001", json!([does("US-001", "file-1.txt", "1\n")]));
    f.story("US-002", json!([does("US-002", "file-2.txt", "2\n")]));
    // After the agent's own commit: the file stays untracked.
    f.put(
        "US-001.post.0",
        "printf 'API_KEY=sk-test-123\\n' > .env.local\n",
    );
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    let r = f.records("US-001");
    assert_eq!(r.len(), 1, "{r:#?}");
    let run_id = r[0]["run_id"].as_str().expect("run id");
    let iteration = r[0]["iteration"].as_u64().expect("iteration");
    let kept = format!(".ralph/kept/{run_id}/{iteration}/.env.local");
    assert_eq!(
        f.env.read(&kept),
        "API_KEY=sk-test-123\n",
        "{kept} is not kept"
    );
    let findings = r[0]["findings"].to_string();
    assert!(
        findings.contains(".env.local")
            && findings.contains(&format!(".ralph/kept/{run_id}/{iteration}")),
        "the findings do not name the kept file: {findings}"
    );
    // Never committed: not on the branch, not in any commit of any ref.
    assert!(!f.files_at(BRANCH).contains(&".env.local".to_owned()));
    let everywhere = f
        .env
        .git(&["log", "--all", "--format=%H", "--", ".env.local"]);
    assert_eq!(everywhere, "", "a commit holds .env.local");
    assert!(
        !f.env.path(".env.local").exists(),
        "it landed in the checkout"
    );
    f.assert_tidy(&out);
}

/// (e, continued) The iteration a hint went to fails to set its worktree up (no agent saw the
/// hint): the hint is free again and reaches the next iteration that starts, once.
#[test]
fn a_hint_given_to_a_worktree_that_failed_to_set_up_goes_to_the_next_iteration() {
    const NOTE: &str = "Keep the files short";
    let f = Field::new(
        &simple_stories(3),
        &[(
            "ralph.toml",
            "worktree_setup = \"case \\\"$PWD\\\" in */US-001-*) echo 'no setup for US-001' >&2; exit 1;; esac\"\n",
        )],
    );
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        f.story(&id, json!([does(&id, &format!("file-{i}.txt"), "x\n")]));
    }
    // US-002 (started beside US-001, without the hint) finishes only once US-003 started in the
    // worker US-001 left: US-003 is the next iteration.
    f.wait("US-002", 0, &f.started(&["US-003"]));
    let hint = f.env.ralph(&["hint", NOTE]);
    assert_eq!(hint.status.code(), Some(0), "{}", text(&hint));
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(f.calls("US-001"), 0);
    assert_eq!(f.records("US-001")[0]["outcome"], "setup_failed");
    let with_note: Vec<&str> = ["US-002", "US-003"]
        .into_iter()
        .filter(|id| f.prompt(id, 0).contains(NOTE))
        .collect();
    assert_eq!(
        with_note,
        ["US-003"],
        "the hint reached {with_note:?}\n{}",
        text(&out)
    );
    let ledger = f.env.ledger();
    let carried: Vec<&str> = ledger
        .iter()
        .filter(|r| r["outcome"] == "story_passed")
        .filter(|r| r.get("hints").is_some_and(|h| h != &json!([])))
        .filter_map(|r| r["story_id"].as_str())
        .collect();
    assert_eq!(carried, with_note, "{ledger:#?}");
    let list = f.env.ralph(&["hint", "--list"]);
    assert!(
        !text(&list).contains("pending"),
        "the hint is still pending:\n{}",
        text(&list)
    );
    f.assert_tidy(&out);
}

/// (c, continued) The agent checks `main` out in its worktree and leaves its work uncommitted
/// there: `main` does not move at all, and the work lands on the run branch.
#[test]
fn an_agent_on_main_with_uncommitted_work_moves_no_branch_and_its_work_lands() {
    let f = Field::new(&simple_stories(2), &[]);
    let main_before = f.sha("main");
    f.story(
        "US-001",
        json!([[
            {"write_file": {"path": "file-1.txt", "content": "1\n"}},
            {"set_passes": {"id": "US-001", "passes": true}},
            {"stdout": "done, not committed"}
        ]]),
    );
    f.story("US-002", json!([does("US-002", "file-2.txt", "2\n")]));
    f.put("US-001.pre.0", "git checkout -q main\n");
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    assert_eq!(f.sha("main"), main_before, "main moved\n{}", text(&out));
    assert_eq!(f.show(BRANCH, "file-1.txt"), "1\n");
    assert_eq!(f.show(BRANCH, "file-2.txt"), "2\n");
    f.assert_tidy(&out);
}

/// (a, with `--push`) The checkout switched to `main` mid-run: what ralph pushes on its way out
/// is the run branch and its refs, never `main` nor `main`'s commits under the run branch's
/// name.
#[test]
fn a_checkout_switched_mid_run_with_push_pushes_no_other_branch() {
    let f = Field::new(&simple_stories(2), &[]);
    let bare = with_remote(&f);
    two_stories_waiting_for_go(&f, &["x\n"]);
    let (run_tip, code, said) = with_user_mid_run(&f, &["--push"], || {
        f.env.git(&["checkout", "-q", "main"]);
        // The user's own commit on main, not to be pushed by ralph.
        user_commits(&f, "local-only.txt", "mine\n", "local work on main");
        f.sha(BRANCH)
    });
    assert_eq!(code, 1, "{said}");
    let remote = |rev: &str| {
        let out = Command::new("git")
            .args(["rev-parse", "--verify", "-q", rev])
            .current_dir(&bare)
            .env_clear()
            .envs(f.env.envs())
            .output()
            .expect("git rev-parse");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_ne!(
        remote("refs/heads/main"),
        f.sha("main"),
        "ralph pushed main\n{said}"
    );
    let remote_run = remote(&format!("refs/heads/{BRANCH}"));
    assert_eq!(
        remote_run, run_tip,
        "the remote's {BRANCH} is not the run's tip\n{said}"
    );
    assert_eq!(f.sha(BRANCH), run_tip, "{said}");
}

/// (f, the other way round) The user's own ignored `.env`, copied into every worktree by
/// `worktree_copy`, is theirs, not an agent's leftover: it is never committed, never kept under
/// `.ralph/kept/` again for each iteration, and no record names it.
#[test]
fn a_users_env_copied_into_worktrees_is_not_kept_or_named_as_an_agents_file() {
    let f = Field::new(
        &simple_stories(2),
        &[
            (".gitignore", "*.mine\n.env\n"),
            ("ralph.toml", "worktree_copy = [\".env\"]\n"),
        ],
    );
    f.env.write(".env", "API_KEY=the-users-own\n");
    for i in 1..=2 {
        let id = format!("US-{i:03}");
        f.story(&id, json!([does(&id, &format!("file-{i}.txt"), "x\n")]));
        // The agent found the user's .env in its worktree.
        f.put(&format!("{id}.pre.0"), "grep -q the-users-own .env\n");
    }
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(all_pass(&f.env.prd()), "{}", text(&out));
    assert_eq!(f.env.read(".env"), "API_KEY=the-users-own\n");
    let everywhere = f.env.git(&["log", "--all", "--format=%H", "--", ".env"]);
    assert_eq!(everywhere, "", "a commit holds .env");
    let mut kept = Vec::new();
    let mut todo = vec![f.env.path(".ralph/kept")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            } else {
                kept.push(e.path());
            }
        }
    }
    assert!(
        kept.is_empty(),
        "the user's .env was kept as an agent's file: {kept:?}"
    );
    for r in f.env.ledger() {
        assert!(
            !r["findings"].to_string().contains(".env"),
            "a record names the user's .env: {r:#}"
        );
    }
    f.assert_tidy(&out);
}

/// (b, continued) The user commits on the run branch mid-run and goes on working: the next
/// change is staged (`git add`) but not committed when ralph next looks. The commit is still
/// the user's: kept, not put back, and the staged file is left as it is.
#[test]
fn a_users_commit_followed_by_a_staged_change_is_still_kept() {
    let f = Field::new(&simple_stories(2), &[]);
    two_stories_waiting_for_go(&f, &["x\n"]);
    let (mine, code, said) = with_user_mid_run(&f, &[], || {
        let mine = user_commits(
            &f,
            "docs-by-me.txt",
            "the user's own change\n",
            "my own change",
        );
        f.env.write("next-by-me.txt", "work in progress\n");
        f.env.git(&["add", "next-by-me.txt"]);
        mine
    });
    let kept = is_ancestor(&f, &mine, BRANCH);
    let moved = ralph_refs_with(&f, "moved-branch");
    assert!(
        kept && moved.is_empty(),
        "the user's commit was put back (kept as {moved:?}); exit {code}\n{said}\n{}",
        f.env.git(&["status", "--short"])
    );
    assert_eq!(f.env.read("next-by-me.txt"), "work in progress\n");
    assert_eq!(
        f.env.git(&["diff", "--cached", "--name-only"]),
        "next-by-me.txt\n",
        "the user's staged file is not as they left it\n{said}"
    );
}

/// (a, continued) The checkout is switched to `main` while a worker is free, and `main`'s
/// prd.json has a story open that landed on the run branch: the run still starts nothing and
/// stops once the running story ends, without landing or moving any branch.
#[test]
fn a_checkout_switched_while_a_worker_is_free_stops_the_run() {
    let f = Field::new(
        &prd_of(vec![
            story(1, "test -f file-1.txt", &[]),
            story(2, "test -f file-2.txt", &[]),
            story(3, "test -f file-3.txt", &["US-002"]),
        ]),
        &[],
    );
    for i in 1..=3 {
        let id = format!("US-{i:03}");
        f.story(&id, json!([does(&id, &format!("file-{i}.txt"), "x\n")]));
    }
    f.wait("US-002", 0, &f.go());
    let mut child = f.spawn(2, &[]);
    // US-001 landed, US-002 runs, US-003 waits for it: one worker is free.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !f
        .records("US-001")
        .iter()
        .any(|r| r["outcome"] == "story_passed")
    {
        assert!(Instant::now() < deadline, "{}", f.env.spawned_output());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Taken before the switch: ralph may read the checkout while git rewrites it, and takes
    // back at once a commit it made from those files (docs/decisions.md, hX).
    let branches = f.refs("refs/heads/");
    f.env.git(&["checkout", "-q", "main"]);
    std::fs::write(f.go_file(), "").expect("go");
    let (code, _) = wait_exit(&f.env, &mut child, Duration::from_secs(120));
    let said = f.env.spawned_output();
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("switched"), "{said}");
    assert_eq!(f.refs("refs/heads/"), branches, "{said}");
    // The summary counts the run branch's stories (US-001 landed), not main's prd.json's.
    assert!(
        said.contains("1 passed, 2 open")
            && said.contains("what landed before is on the run branch"),
        "{said}"
    );
    assert_eq!(f.calls("US-003"), 0);
    assert_eq!(
        f.calls("US-001"),
        1,
        "US-001 started again on main's prd.json\n{said}"
    );
}

/// (d, across runs) `--max-cost` counts every run of the feature: a second run that starts
/// with $0.90 of the $1.00 spent (the average iteration known from the first: $0.30) starts one
/// story, not three at once, as a serial run would.
#[test]
fn max_cost_with_three_workers_in_a_later_run_starts_no_more_than_the_rest_allows() {
    let f = Field::new(&simple_stories(6), &[]);
    costing_stories(&f, 6, 0.3);
    let first = run_as_claude(&f, &["--max-iter", "3"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first));
    assert_eq!(f.env.ledger().len(), 3);
    let second = run_as_claude(&f, &["--max-iter", "20", "--max-cost", "1.0"]);
    let ledger = f.env.ledger();
    let spent = spent(&ledger);
    assert!(
        spent <= 1.0 + 0.3 + 1e-9,
        "spent ${spent:.2} against a $1.00 limit over the feature's runs ({} iterations)\n{}",
        ledger.len(),
        text(&second)
    );
    // The stop line names what the feature spent in the end (every iteration written down).
    let total = format!("${spent:.2}");
    assert!(
        text(&second).contains(&total),
        "the stop does not name the final total {total}:
{}",
        text(&second)
    );
}

/// (f, continued) The same `.env.local` in the worktree of a story whose run ended before it
/// landed (the checkout was switched mid-run): the next run records the flight and removes its
/// worktree, and keeps the file under `.ralph/kept/<run>/<iteration>/` first, naming it.
#[test]
fn an_agents_env_local_in_a_recovered_flight_is_kept_not_deleted() {
    let f = Field::new(&simple_stories(2), &[]);
    two_stories_waiting_for_go(&f, &["first\n", "again\n"]);
    f.put(
        "US-001.post.0",
        "printf 'API_KEY=sk-test-123\\n' > .env.local\n",
    );
    let ((), code, said) = with_user_mid_run(&f, &[], || {
        f.env.git(&["checkout", "-q", "main"]);
    });
    assert_eq!(code, 1, "{said}");
    f.env.git(&["checkout", "-q", BRANCH]);
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let first = f
        .records("US-001")
        .into_iter()
        .next()
        .expect("US-001's first iteration is recorded");
    let kept: Vec<PathBuf> = std::fs::read_dir(f.env.path(".ralph/kept"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|run| {
            std::fs::read_dir(run.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|it| it.path().join(".env.local"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "the agent's .env.local was deleted with its worktree, not kept under .ralph/kept/:\n{first:#}\n{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&kept[0]).unwrap_or_default(),
        "API_KEY=sk-test-123\n"
    );
    let said = format!("{first}\n{}", text(&out));
    assert!(
        said.contains(".env.local"),
        "nothing names the kept file:\n{said}"
    );
    let everywhere = f
        .env
        .git(&["log", "--all", "--format=%H", "--", ".env.local"]);
    assert_eq!(everywhere, "", "a commit holds .env.local");
}

/// (f, continued) The run ends with two stories done but not landed (the checkout was switched
/// to `main`): it says so once, and its next step does not point at refs it never named. Back
/// on the run branch, the next run records both iterations as left by the switch (ralph was not
/// killed), and keeps what each agent wrote that no commit takes (an ignored log) under
/// `.ralph/kept/`, but not the file the worktree's setup wrote before the agent started.
#[test]
fn a_flight_left_by_a_switch_is_recorded_as_such_and_keeps_only_its_agents_files() {
    let f = Field::new(
        &simple_stories(2),
        &[
            (".gitignore", "*.mine\n*.log\n"),
            (
                "ralph.toml",
                "worktree_setup = \"echo 'the setup wrote this' > setup.log\"\n",
            ),
        ],
    );
    two_stories_waiting_for_go(&f, &["first\n", "again\n"]);
    for id in ["US-001", "US-002"] {
        f.put(
            &format!("{id}.post.0"),
            "printf 'the agent ran its tests\\n' > agent.log\n",
        );
    }
    let ((), code, first) = with_user_mid_run(&f, &[], || {
        f.env.git(&["checkout", "-q", "main"]);
    });
    assert_eq!(code, 1, "{first}");
    assert_eq!(
        first.matches("during the run; ralph lands nothing").count(),
        1,
        "the switch is not said exactly once:\n{first}"
    );
    assert!(
        first.contains("stopped: the checkout was switched"),
        "the headline does not say why the run stopped:\n{first}"
    );
    assert!(
        !first.contains("kept under the refs named above"),
        "the next step points at refs it never named:\n{first}"
    );

    f.env.git(&["checkout", "-q", BRANCH]);
    let out = f.run(2, &[]);
    assert_eq!(out.status.code(), Some(0), "{first}\n{}", text(&out));
    for id in ["US-001", "US-002"] {
        let r = f
            .records(id)
            .into_iter()
            .next()
            .expect("the first iteration is recorded");
        assert_eq!(r["outcome"], "interrupted", "{r:#}");
        let said = format!("{r}");
        assert!(
            !said.contains("killed") && said.contains("switched"),
            "the record of an iteration left by a switch:\n{r:#}"
        );
        let kept = f.env.path(&format!(
            ".ralph/kept/{}/{}",
            r["run_id"].as_str().unwrap_or_default(),
            r["iteration"]
        ));
        assert_eq!(
            std::fs::read_to_string(kept.join("agent.log")).unwrap_or_default(),
            "the agent ran its tests\n",
            "the agent's ignored log was not kept:\n{r:#}"
        );
        assert!(
            !kept.join("setup.log").exists(),
            "the setup's log was kept as the agent's:\n{r:#}"
        );
    }
    assert!(
        !text(&out).contains("when ralph was killed"),
        "{}",
        text(&out)
    );
}

/// (d, the stop line) Three workers start at once before any cost is known; the second
/// landing reaches `--max-cost` while the third still runs, and that one lands too: the stop
/// line names what the run spent in the end ($1.50), not the $1.00 the limit was reached at.
#[test]
fn a_max_cost_stop_with_an_iteration_still_running_names_the_final_total() {
    let f = Field::new(&simple_stories(3), &[]);
    costing_stories(&f, 3, 0.5);
    let out = run_as_claude(&f, &["--max-iter", "20", "--max-cost", "1.0"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(f.env.ledger().len(), 3, "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("$1.50") && !said.contains("$1.00, reached"),
        "the stop line does not name the final total $1.50:\n{said}"
    );
}

/// (b, the other side) An agent moves the run branch from its worktree (`git update-ref` to
/// its own commit): that move is in no reflog of the main checkout's HEAD, so it is not taken
/// for the user's. ralph puts the branch back, keeps what it pointed at under
/// `refs/ralph/<run>/moved-branch-1`, says so, and the stories still land through ralph.
#[test]
fn an_agent_moving_the_run_branch_from_its_worktree_is_put_back_and_kept() {
    let f = Field::new(&simple_stories(2), &[]);
    for i in 1..=2 {
        let id = format!("US-{i:03}");
        f.story(&id, json!([does(&id, &format!("file-{i}.txt"), "x\n")]));
    }
    f.put(
        "US-001.post.0",
        &format!("git update-ref refs/heads/{BRANCH} HEAD\n"),
    );
    let out = f.run(2, &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let moved = ralph_refs_with(&f, "moved-branch-1");
    assert_eq!(
        moved.len(),
        1,
        "the agent's move was not kept: {moved:?}\n{said}\n{}",
        f.env
            .git(&["log", "--all", "--graph", "--oneline", "--decorate"]),
    );
    assert!(said.contains("moved behind ralph's back"), "{said}");
    assert!(!said.contains("cherry-pick"), "{said}");
    assert!(all_pass(&f.env.prd()), "{said}");
    assert_on_branch(&f, &["file-1.txt", "file-2.txt"]);
}

/// (b, both) An agent moves the run branch from its worktree and the user, not knowing, commits
/// on top of it in the checkout: the chain of moves the checkout made does not reach where ralph
/// left the branch, so the move is put back whole; the user's commit is kept under the same ref
/// (the warning tells them to cherry-pick it) and their file stays in the checkout.
#[test]
fn a_users_commit_on_top_of_an_agents_move_is_kept_under_the_ref_and_named() {
    let f = Field::new(&simple_stories(2), &[]);
    for i in 1..=2 {
        let id = format!("US-{i:03}");
        f.story(&id, json!([does(&id, &format!("file-{i}.txt"), "x\n")]));
    }
    let moved_mark = f.agents.join("moved");
    let go = f.go_file();
    f.put(
        "US-001.post.0",
        &format!(
            "git update-ref refs/heads/{BRANCH} HEAD\ntouch '{}'\nfor _ in $(seq 1800); do test -f '{}' && break; sleep 0.1; done\n",
            moved_mark.display(),
            go.display()
        ),
    );
    f.wait("US-002", 0, &f.go());
    let mut child = f.spawn(2, &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !moved_mark.exists() {
        assert!(Instant::now() < deadline, "{}", f.env.spawned_output());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mine = user_commits(
        &f,
        "docs-by-me.txt",
        "the user's own change\n",
        "my own change",
    );
    std::fs::write(&go, "").expect("go");
    let (code, _) = wait_exit(&f.env, &mut child, Duration::from_secs(300));
    let said = f.env.spawned_output();
    assert_eq!(code, 0, "{said}");
    let kept = ralph_refs_with(&f, "moved-branch-1")
        .first()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no moved-branch ref:\n{said}"));
    assert_eq!(kept, mine, "{said}");
    assert!(said.contains("cherry-pick"), "{said}");
    assert_eq!(f.env.read("docs-by-me.txt"), "the user's own change\n");
    assert!(all_pass(&f.env.prd()), "{said}");
}
