//! The scripted parallel-run scenario of tests/it/parallel.rs, shared by the `--parallel` test
//! files: a repository with per-story scripted agents ([`Par`]) and the story helpers.
//!
//! The agent is scripted per story: an exec agent ([`Par::wrapper`]) reads its prompt, finds
//! the story (`Story ID: US-00x`), keeps the prompt (`agents/<story>.prompt.<n>`, n from 0),
//! logs its start (`agents/starts.log`: story, attempt, time, directory, files present), runs
//! `agents/<story>.pre.<n>` when the test gave one (a shell step an agent takes first), waits
//! for a condition when the test gave one (`agents/<story>.wait.<n>`, a bash script polled every
//! 100 ms for at most 60 s, or [`ParBuilder::wait_secs`]), then runs the fake agent with that
//! story's own script (`agents/<story>.json`, whose invocations count per story) and then
//! `agents/<story>.post.<n>` when the test gave one (a shell step at the agent's end), so that
//! the order in which the workers start cannot change what each story's agent does.

use std::path::PathBuf;
use std::process::Output;

use serde_json::{json, Value};

use super::{fake_agent_bin, prd_with_stories, script_file, text, TestEnv};

/// The run branch of [`prd_with_stories`].
pub(crate) const BRANCH: &str = "ralph/demo";
/// The user's own file, ignored by git: no landing may touch it.
pub(crate) const USER_FILE: &str = "mine.local";
pub(crate) const USER_TEXT: &str = "my notes, not ralph's\n";

/// A repository for a parallel run and its per-story scripted agents.
pub(crate) struct Par {
    pub(crate) env: TestEnv,
    /// Where the stories' scripts, prompts and the start log live (beside the repository).
    pub(crate) agents: PathBuf,
    /// The exec agent every worker runs.
    pub(crate) wrapper: PathBuf,
    /// The user's own ignored file ([`USER_FILE`] unless [`ParBuilder::user_file`] named
    /// another), holding [`USER_TEXT`].
    user_file: &'static str,
}

/// How [`ParBuilder::build`] makes a [`Par`]: [`Par::new`] takes every default; a test that
/// needs more says so (`Par::builder(&prd, &[]).user_file("notes.mine").build()`).
pub(crate) struct ParBuilder<'a> {
    prd: &'a Value,
    extra: &'a [(&'a str, &'a str)],
    user_file: &'static str,
    answers_version: bool,
    passes_args: bool,
    wait_secs: u32,
}

impl ParBuilder<'_> {
    /// The user's ignored file is `name` (default [`USER_FILE`]); `.gitignore` ignores every
    /// file with its extension (`*.<ext>`; `name` itself when it has none).
    pub(crate) fn user_file(mut self, name: &'static str) -> Self {
        self.user_file = name;
        self
    }

    /// The agent answers `--version` as the fake agent does, before it reads any prompt (what
    /// the claude backend asks its program first). Off by default.
    pub(crate) fn answers_version(mut self) -> Self {
        self.answers_version = true;
        self
    }

    /// The agent hands the arguments it was started with to the fake agent (the claude
    /// backend's flags, with `--agent-program`). Off by default: the fake agent gets none.
    pub(crate) fn passes_args(mut self) -> Self {
        self.passes_args = true;
        self
    }

    /// A wait condition ([`Par::wait`]) is polled for at most `secs` seconds before the agent
    /// plays on anyway (default 60).
    pub(crate) fn wait_secs(mut self, secs: u32) -> Self {
        self.wait_secs = secs;
        self
    }

    /// The repository with the PRD, a `.gitignore` for the user's file, the user's file and the
    /// `extra` files (which may replace `.gitignore`), all but the user's file committed on
    /// `main`, and the agent script beside it. Panics when a file cannot be written or git
    /// fails.
    pub(crate) fn build(self) -> Par {
        let env = TestEnv::new(self.prd);
        let ignore = match self.user_file.rsplit_once('.') {
            Some((_, ext)) => format!("*.{ext}\n"),
            None => format!("{}\n", self.user_file),
        };
        env.write(".gitignore", &ignore);
        for (path, content) in self.extra {
            env.write(path, content);
        }
        env.git(&["add", "-A"]);
        env.git(&["commit", "-q", "-m", "project files"]);
        env.write(self.user_file, USER_TEXT);
        let agents = env.root.path().join("agents");
        std::fs::create_dir_all(&agents).expect("mkdir agents");
        let fake = fake_agent_bin();
        let version = if self.answers_version {
            format!("if [ \"$1\" = --version ]; then exec '{fake}' --version; fi\n")
        } else {
            String::new()
        };
        let args = if self.passes_args { " \"$@\"" } else { "" };
        let body = format!(
            r#"dir='{agents}'
{version}prompt=$(cat)
story=$(printf '%s\n' "$prompt" | sed -n 's/^Story ID: //p' | head -n 1)
n=$(ls "$dir/$story".prompt.* 2>/dev/null | wc -l)
printf '%s' "$prompt" > "$dir/$story.prompt.$n"
echo "$story $n $(date +%s%N) $PWD $(ls | tr '\n' ' ')" >> "$dir/starts.log"
if [ -f "$dir/$story.pre.$n" ]; then bash -e "$dir/$story.pre.$n" || exit 1; fi
if [ -f "$dir/$story.wait.$n" ]; then
  for _ in $(seq {polls}); do bash "$dir/$story.wait.$n" && break; sleep 0.1; done
fi
if [ -f "$dir/$story.post.$n" ]; then
  RALPH_FAKE_SCRIPT="$dir/$story.json" '{fake}'{args}; code=$?
  bash -e "$dir/$story.post.$n" || exit 1
  exit $code
fi
RALPH_FAKE_SCRIPT="$dir/$story.json" exec '{fake}'{args}
"#,
            agents = agents.display(),
            polls = self.wait_secs * 10,
        );
        let wrapper = script_file(&env, "story-agent.sh", &body);
        Par {
            env,
            agents,
            wrapper,
            user_file: self.user_file,
        }
    }
}

impl Par {
    /// A repository with `prd` (stories may carry `verify` and `dependsOn`), a `.gitignore` for
    /// `*.local`, the user's ignored file, and `extra` files, all committed on `main`: the
    /// defaults of [`Par::builder`].
    pub(crate) fn new(prd: &Value, extra: &[(&str, &str)]) -> Par {
        Par::builder(prd, extra).build()
    }

    /// A [`ParBuilder`] for `prd` and the `extra` files, with the defaults of [`Par::new`].
    pub(crate) fn builder<'a>(prd: &'a Value, extra: &'a [(&'a str, &'a str)]) -> ParBuilder<'a> {
        ParBuilder {
            prd,
            extra,
            user_file: USER_FILE,
            answers_version: false,
            passes_args: false,
            wait_secs: 60,
        }
    }

    /// `id`'s agent plays these invocations, one per attempt (the last one again past the end).
    pub(crate) fn story(&self, id: &str, invocations: Value) {
        std::fs::write(
            self.agents.join(format!("{id}.json")),
            serde_json::to_vec_pretty(&json!({ "invocations": invocations })).expect("json"),
        )
        .expect("write a story's script");
    }

    /// `id`'s attempt `n` (from 0) waits until `condition` (bash, run in the agent's directory)
    /// holds before it plays its script.
    pub(crate) fn wait(&self, id: &str, n: usize, condition: &str) {
        std::fs::write(self.agents.join(format!("{id}.wait.{n}")), condition)
            .expect("write a wait condition");
    }

    /// `id`'s attempt `n` (from 0) runs `script` (bash -e, in the agent's directory) before it
    /// plays its script: a shell step an agent takes first.
    pub(crate) fn pre(&self, id: &str, n: usize, script: &str) {
        std::fs::write(self.agents.join(format!("{id}.pre.{n}")), script)
            .expect("write a pre step");
    }

    /// `id`'s attempt `n` (from 0) runs `script` (bash -e, in the agent's directory) after it
    /// played its script: a shell step an agent takes at its end.
    pub(crate) fn post(&self, id: &str, n: usize, script: &str) {
        std::fs::write(self.agents.join(format!("{id}.post.{n}")), script)
            .expect("write a post step");
    }

    /// A bash condition: the run branch has `file` (another story's work landed).
    pub(crate) fn landed(&self, file: &str) -> String {
        format!(
            "git -C '{}' cat-file -e '{BRANCH}:{file}' 2>/dev/null",
            self.env.repo.display()
        )
    }

    /// A bash condition: `id`'s agent has started (its first prompt is kept).
    pub(crate) fn started(&self, id: &str) -> String {
        format!(
            "test -f '{}'",
            self.agents.join(format!("{id}.prompt.0")).display()
        )
    }

    /// The arguments of `ralph run --parallel <n>` with the scripted exec agent and
    /// `--max-iter 20`, then the `extra` flags.
    pub(crate) fn args(&self, parallel: u32, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--parallel",
            &parallel.to_string(),
            "--agent",
            "exec",
            "--agent-cmd",
            &self.wrapper.display().to_string(),
            "--max-iter",
            "20",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// `ralph run --parallel <n>` with the scripted agent, and `extra` flags, to its end.
    pub(crate) fn run(&self, parallel: u32, extra: &[&str]) -> Output {
        let args = self.args(parallel, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.env.ralph(&args)
    }

    /// The run of [`Par::run`] in the background ([`TestEnv::ralph_spawn`]).
    pub(crate) fn spawn(&self, parallel: u32, extra: &[&str]) -> std::process::Child {
        let args = self.args(parallel, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.env.ralph_spawn(&args)
    }

    /// How many times `id`'s agent was started.
    pub(crate) fn calls(&self, id: &str) -> usize {
        (0..)
            .take_while(|n| self.agents.join(format!("{id}.prompt.{n}")).exists())
            .count()
    }

    /// The prompt of `id`'s attempt `n`.
    pub(crate) fn prompt(&self, id: &str, n: usize) -> String {
        std::fs::read_to_string(self.agents.join(format!("{id}.prompt.{n}"))).unwrap_or_default()
    }

    /// The start log's lines for `id`: (attempt, time in ns, directory, files present).
    pub(crate) fn starts(&self, id: &str) -> Vec<(usize, u128, String, Vec<String>)> {
        std::fs::read_to_string(self.agents.join("starts.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == id).then_some(())?;
                let n = f.next()?.parse().ok()?;
                let at = f.next()?.parse().ok()?;
                let dir = f.next()?.to_owned();
                Some((n, at, dir, f.map(str::to_owned).collect()))
            })
            .collect()
    }

    /// The ledger records of `id`, in order.
    pub(crate) fn records(&self, id: &str) -> Vec<Value> {
        self.env
            .ledger()
            .into_iter()
            .filter(|r| r["story_id"] == id)
            .collect()
    }

    /// The files on the run branch.
    pub(crate) fn branch_files(&self) -> Vec<String> {
        self.env
            .git(&["ls-tree", "-r", "--name-only", BRANCH])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `rel` on the run branch (empty when it has no such file).
    pub(crate) fn on_branch(&self, rel: &str) -> String {
        self.show(BRANCH, rel)
    }

    /// `rel` at `rev` (empty when it has no such file).
    pub(crate) fn show(&self, rev: &str, rel: &str) -> String {
        let out = std::process::Command::new("git")
            .args(["show", &format!("{rev}:{rel}")])
            .current_dir(&self.env.repo)
            .env_clear()
            .envs(self.env.envs())
            .output()
            .expect("git show");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The refs under `refs/ralph/salvage/`.
    pub(crate) fn salvage_refs(&self) -> Vec<String> {
        self.env
            .git(&["for-each-ref", "--format=%(refname)", "refs/ralph/salvage/"])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// What a morning check of any parallel run finds, whatever happened: the checkout is on
    /// the run branch with a clean status and no conflict marker, no worktree is left (not
    /// under `.ralph/worktrees/`, not in `git worktree list`), and the user's file is as it
    /// was.
    pub(crate) fn assert_tidy(&self, out: &Output) {
        let env = &self.env;
        assert_eq!(
            env.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
            BRANCH,
            "{}",
            text(out)
        );
        assert_eq!(
            env.git(&["status", "--porcelain"]),
            "",
            "the checkout is not clean after the run\n{}",
            text(out)
        );
        assert_eq!(self.conflict_markers(), "", "conflict markers on {BRANCH}");
        assert_no_worktrees(&env.repo, &env.git(&["worktree", "list", "--porcelain"]));
        assert_eq!(
            env.read(self.user_file),
            USER_TEXT,
            "the user's ignored file changed"
        );
    }
}

impl Par {
    /// Lines of the run branch that look like conflict markers (`git grep` exits 1 when
    /// nothing matches, which [`TestEnv::git`] would take for a failure).
    pub(crate) fn conflict_markers(&self) -> String {
        let out = std::process::Command::new("git")
            .args([
                "grep",
                "-n",
                "-E",
                "^(<<<<<<<|=======|>>>>>>>)",
                BRANCH,
                "--",
            ])
            .current_dir(&self.env.repo)
            .env_clear()
            .envs(self.env.envs())
            .output()
            .expect("git grep");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// No story worktree is left: `porcelain` (`git worktree list --porcelain` of `repo`) lists the
/// main checkout alone, and no checkout (a `.git` entry) remains under `.ralph/worktrees/`.
pub(crate) fn assert_no_worktrees(repo: &std::path::Path, porcelain: &str) {
    assert_eq!(
        porcelain
            .lines()
            .filter(|l| l.starts_with("worktree "))
            .count(),
        1,
        "worktrees left registered:\n{porcelain}"
    );
    let left = walk_dirs(&repo.join(".ralph").join("worktrees"));
    assert!(
        left.iter().all(|d| !d.join(".git").exists()),
        "worktrees left under .ralph/worktrees: {left:?}"
    );
}

/// Every directory under `dir` (itself included when it exists).
pub(crate) fn walk_dirs(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        out.push(d);
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    out
}

/// Whether `dir` is a story worktree of `id`: `.ralph/worktrees/<run>/<id>-<iteration>` (README,
/// "--parallel").
pub(crate) fn in_worktree_of(dir: &str, id: &str) -> bool {
    let name = dir.rsplit('/').next().unwrap_or("");
    dir.contains("/.ralph/worktrees/")
        && name
            .strip_prefix(id)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| n.parse::<u32>().is_ok())
}

/// A story of `prd_with_stories`' shape with a check of its own.
pub(crate) fn story(i: usize, verify: &str, depends_on: &[&str]) -> Value {
    json!({
        "id": format!("US-{i:03}"),
        "title": format!("Story {i}"),
        "description": format!("As a user I want feature {i}"),
        "acceptanceCriteria": [format!("file-{i}.txt exists")],
        "priority": i,
        "passes": false,
        "notes": "",
        "verify": verify,
        "dependsOn": depends_on,
    })
}

/// A PRD of `stories` (the rest of [`prd_with_stories`]' shape).
pub(crate) fn prd_of(stories: Vec<Value>) -> Value {
    let mut prd = prd_with_stories(0);
    prd["userStories"] = Value::Array(stories);
    prd
}

/// An attempt that writes `file`, marks `id` passing and commits, after `sleep_ms`.
pub(crate) fn does(id: &str, file: &str, content: &str, sleep_ms: u64) -> Value {
    json!([
        {"stdout": format!("working on {id}")},
        {"sleep_ms": sleep_ms},
        {"write_file": {"path": file, "content": content}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"stdout": format!("{id} done")}
    ])
}

/// Whether ledger records `a` and `b` ran at the same time (their started_at/ended_at overlap).
pub(crate) fn overlapped(a: &Value, b: &Value) -> bool {
    let t = |r: &Value, k: &str| {
        chrono::DateTime::parse_from_rfc3339(r[k].as_str().expect("a time")).expect("RFC 3339")
    };
    t(a, "started_at") < t(b, "ended_at") && t(b, "started_at") < t(a, "ended_at")
}

pub(crate) fn landing_kind(r: &Value) -> &str {
    r["landing"]["kind"].as_str().unwrap_or("(none)")
}

/// A PRD of `n` independent stories whose check is `test -f file-<i>.txt`.
pub(crate) fn simple_stories(n: usize) -> Value {
    prd_of(
        (1..=n)
            .map(|i| story(i, &format!("test -f file-{i}.txt"), &[]))
            .collect(),
    )
}

/// The findings of ledger record `r`, one a line (empty when it has none).
pub(crate) fn findings(r: &Value) -> String {
    r["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

impl Par {
    /// How many worktrees `git worktree list` names: 1 when only the main checkout is left.
    pub(crate) fn registered_worktrees(&self) -> usize {
        self.env
            .git(&["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count()
    }

    /// [`Par::args`] with `--max-iter <max_iter>` in place of 20.
    pub(crate) fn args_max(&self, parallel: u32, max_iter: u32, extra: &[&str]) -> Vec<String> {
        let mut args = self.args(parallel, extra);
        let at = args
            .iter()
            .position(|a| a == "--max-iter")
            .expect("Par::args has --max-iter");
        args[at + 1] = max_iter.to_string();
        args
    }
}

/// The ledger's iteration numbers, sorted, are 1..=n (one record an iteration, no gap, no
/// repeat); `what` starts the failure message (a seed, a kill point).
pub(crate) fn assert_numbering(ledger: &[Value], what: &str) {
    let mut numbers: Vec<u64> = ledger
        .iter()
        .map(|r| r["iteration"].as_u64().expect("iteration"))
        .collect();
    numbers.sort_unstable();
    let want: Vec<u64> = (1..=numbers.len() as u64).collect();
    assert_eq!(
        numbers, want,
        "{what}: numbering has gaps or repeats: {ledger:#?}"
    );
}
