//! The stores behind a run, through the library: git, the run lock, state.json, the ledger and
//! progress.txt (cases 19, 20, 22 and 23 of the field cases).

use std::fs;
use std::path::Path;

use chrono::{DateTime, Local, TimeZone, Utc};
use git2::{Repository, RepositoryInitOptions, Signature};
use ralph::git::{BranchAction, GitError, Repo};
use ralph::ledger::{self, LedgerError};
use ralph::lock::{LockError, LockInfo, RunLock};
use ralph::progress::{self, Entry};
use ralph::protocol::{LedgerRecord, Outcome};
use ralph::state::{InFlight, State, StateError};

/// A fresh repository whose first branch is `main`, with an explicit identity so the developer's
/// global git config does not matter.
fn init_repo(dir: &Path) -> Repository {
    let mut opts = RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(dir, &opts).unwrap();
    let mut config = repo.config().unwrap();
    config.set_str("user.name", "Test User").unwrap();
    config.set_str("user.email", "test@example.com").unwrap();
    repo
}

/// Writes `files` and commits everything on HEAD with plain git2 (independent of the code under
/// test). Returns the new sha.
fn commit_files(repo: &Repository, files: &[(&str, &str)], message: &str) -> String {
    let root = repo.workdir().unwrap().to_path_buf();
    for (name, contents) in files {
        let path = root.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::now("Test User", "test@example.com").unwrap();
    let parent = repo.head().ok().map(|h| h.peel_to_commit().unwrap());
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap()
        .to_string()
}

fn trailers(iteration: u32, story: &str, outcome: Outcome) -> Vec<(&'static str, String)> {
    vec![
        (ralph::git::TRAILER_RUN, "run-1".to_owned()),
        (ralph::git::TRAILER_ITERATION, iteration.to_string()),
        (ralph::git::TRAILER_STORY, story.to_owned()),
        (ralph::git::TRAILER_OUTCOME, outcome.to_string()),
    ]
}

// ---------------------------------------------------------------------------------------------
// git

#[test]
fn outside_a_repository_the_error_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = Repo::discover(dir.path()).unwrap_err();
    assert!(matches!(err, GitError::NotARepo { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("is not inside a git repository"), "{msg}");
    assert!(msg.contains("git init"), "{msg}");
}

#[test]
fn discover_finds_the_root_from_a_subdirectory() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    commit_files(&repo, &[("src/lib.rs", "")], "init");
    let found = Repo::discover(&dir.path().join("src")).unwrap();
    assert_eq!(
        found.root().canonicalize().unwrap(),
        dir.path().canonicalize().unwrap()
    );
    assert_eq!(found.current_branch().as_deref(), Some("main"));
}

/// Case 20: the team integrates on `develop`, which is ahead of `main`; the new branch must start
/// from `develop`, not from a hard-coded `main`.
#[test]
fn new_branch_starts_from_base_branch_not_main() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    let main_sha = commit_files(&repo, &[("README.md", "hello\n")], "init");
    let main_commit = repo.find_commit(main_sha.parse().unwrap()).unwrap();
    repo.branch("develop", &main_commit, false).unwrap();
    repo.set_head("refs/heads/develop").unwrap();
    commit_files(&repo, &[("develop.txt", "1\n")], "develop 1");
    let develop_sha = commit_files(&repo, &[("develop.txt", "2\n")], "develop 2");
    // Back on main, with a clean tree.
    repo.set_head("refs/heads/main").unwrap();
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
        .unwrap();
    assert!(!dir.path().join("develop.txt").exists());

    let git = Repo::discover(dir.path()).unwrap();
    let action = git.ensure_branch("ralph/feature", Some("develop")).unwrap();
    assert_eq!(
        action,
        BranchAction::Created {
            from: "develop".into(),
            sha: develop_sha.clone()
        }
    );
    assert_eq!(git.current_branch().as_deref(), Some("ralph/feature"));
    assert_eq!(git.head_sha().unwrap(), Some(develop_sha.clone()));
    assert_eq!(
        fs::read_to_string(dir.path().join("develop.txt")).unwrap(),
        "2\n"
    );
    assert!(git.dirty_paths().unwrap().is_empty());

    // Running again changes nothing; switching back to an existing branch checks it out.
    assert_eq!(
        git.ensure_branch("ralph/feature", Some("develop")).unwrap(),
        BranchAction::AlreadyOn
    );
    assert_eq!(
        git.ensure_branch("main", None).unwrap(),
        BranchAction::CheckedOut
    );
    assert_eq!(git.head_sha().unwrap(), Some(main_sha.clone()));
    assert!(!dir.path().join("develop.txt").exists());

    // Without a base, the branch starts at the current HEAD.
    let action = git.ensure_branch("ralph/other", None).unwrap();
    assert_eq!(
        action,
        BranchAction::Created {
            from: "HEAD".into(),
            sha: main_sha
        }
    );
}

#[test]
fn missing_base_branch_is_named_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    let sha = commit_files(&repo, &[("a.txt", "a")], "init");
    let git = Repo::discover(dir.path()).unwrap();
    let err = git.ensure_branch("ralph/x", Some("develop")).unwrap_err();
    assert!(matches!(err, GitError::BaseNotFound { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("base branch `develop` does not exist"),
        "{err}"
    );
    assert_eq!(git.current_branch().as_deref(), Some("main"));
    assert_eq!(git.head_sha().unwrap(), Some(sha));
    assert!(repo
        .find_branch("ralph/x", git2::BranchType::Local)
        .is_err());

    let err = git.ensure_branch("bad..name", None).unwrap_err();
    assert!(matches!(err, GitError::InvalidBranchName { .. }), "{err:?}");
}

/// A switch that would overwrite the user's uncommitted edit is refused and loses nothing.
#[test]
fn checkout_never_overwrites_uncommitted_changes() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    let first = commit_files(&repo, &[("a.txt", "v1\n")], "v1");
    let first = repo.find_commit(first.parse().unwrap()).unwrap();
    repo.branch("develop", &first, false).unwrap();
    commit_files(&repo, &[("a.txt", "v2\n")], "v2 on main");
    fs::write(dir.path().join("a.txt"), "my edit\n").unwrap();

    let git = Repo::discover(dir.path()).unwrap();
    let err = git.ensure_branch("ralph/x", Some("develop")).unwrap_err();
    assert!(matches!(err, GitError::CheckoutConflict { .. }), "{err:?}");
    assert!(err.to_string().contains("commit or stash"), "{err}");
    assert_eq!(
        fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "my edit\n"
    );
    assert_eq!(git.current_branch().as_deref(), Some("main"));
    assert!(repo
        .find_branch("ralph/x", git2::BranchType::Local)
        .is_err());
}

/// Case 19: every kind of uncommitted change is reported; ignored files are not.
#[test]
fn dirty_paths_lists_every_uncommitted_change_but_not_ignored_files() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    commit_files(
        &repo,
        &[
            (".gitignore", "target/\n*.log\n"),
            ("kept.txt", "k"),
            ("modified.txt", "m"),
            ("deleted.txt", "d"),
            ("staged.txt", "s"),
        ],
        "init",
    );
    let git = Repo::discover(dir.path()).unwrap();
    assert!(git.dirty_paths().unwrap().is_empty());

    fs::write(dir.path().join("modified.txt"), "m2").unwrap();
    fs::remove_file(dir.path().join("deleted.txt")).unwrap();
    fs::write(dir.path().join("staged.txt"), "s2").unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("staged.txt")).unwrap();
    index.write().unwrap();
    fs::write(dir.path().join("untracked.txt"), "u").unwrap();
    fs::create_dir_all(dir.path().join("newdir")).unwrap();
    fs::write(dir.path().join("newdir/x.txt"), "x").unwrap();
    fs::create_dir_all(dir.path().join("target")).unwrap();
    fs::write(dir.path().join("target/out.bin"), "o").unwrap();
    fs::write(dir.path().join("debug.log"), "l").unwrap();
    fs::create_dir_all(dir.path().join(".ralph")).unwrap();
    fs::write(dir.path().join(".ralph/.gitignore"), "*\n").unwrap();
    fs::write(dir.path().join(".ralph/state.json"), "{}").unwrap();

    assert_eq!(
        git.dirty_paths().unwrap(),
        [
            "deleted.txt",
            "modified.txt",
            "newdir/",
            "staged.txt",
            "untracked.txt"
        ]
    );
}

#[test]
fn commit_all_stages_everything_and_trailers_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    let base = commit_files(
        &repo,
        &[
            (".gitignore", "*.log\n"),
            ("old.txt", "o"),
            ("keep.txt", "k"),
        ],
        "init",
    );
    let git = Repo::discover(dir.path()).unwrap();

    // Nothing changed: no commit.
    assert_eq!(
        git.commit_all(
            "ralph: iteration 1 (US-001)",
            "",
            &trailers(1, "US-001", Outcome::NoProgress)
        )
        .unwrap(),
        None
    );

    // The agent commits once itself, then leaves more changes behind.
    let agent_commit = commit_files(&repo, &[("feature.rs", "fn f() {}\n")], "feat: US-001");
    fs::remove_file(dir.path().join("old.txt")).unwrap();
    fs::create_dir_all(dir.path().join("src/deep")).unwrap();
    fs::write(dir.path().join("src/deep/new.rs"), "// new\n").unwrap();
    fs::write(dir.path().join("keep.txt"), "k2").unwrap();
    fs::write(dir.path().join("noise.log"), "ignored").unwrap();
    assert_eq!(
        git.changed_files(&base).unwrap(),
        ["feature.rs", "keep.txt", "old.txt", "src/deep/new.rs"]
    );

    let sha = git
        .commit_all(
            "ralph: iteration 2 (US-001)",
            "The agent stopped before committing.",
            &trailers(2, "US-001", Outcome::Progress),
        )
        .unwrap()
        .expect("changes were committed");
    assert_eq!(git.head_sha().unwrap(), Some(sha.clone()));
    assert!(
        git.dirty_paths().unwrap().is_empty(),
        "everything but ignored files committed"
    );

    let commit = repo.find_commit(sha.parse().unwrap()).unwrap();
    let tree = commit.tree().unwrap();
    assert!(
        tree.get_path(Path::new("old.txt")).is_err(),
        "deletion committed"
    );
    assert!(
        tree.get_path(Path::new("src/deep/new.rs")).is_ok(),
        "untracked file committed"
    );
    assert!(
        tree.get_path(Path::new("noise.log")).is_err(),
        "ignored file not committed"
    );
    assert_eq!(
        commit.message().unwrap(),
        "ralph: iteration 2 (US-001)\n\nThe agent stopped before committing.\n\n\
         Ralph-Run: run-1\nRalph-Iteration: 2\nRalph-Story: US-001\nRalph-Outcome: progress\n"
    );
    assert_eq!(commit.author().name(), Some("Test User"));

    assert_eq!(
        git.commits_between(Some(&base), "HEAD").unwrap(),
        [agent_commit.clone(), sha.clone()]
    );
    assert_eq!(
        git.commits_between(Some(&base), &agent_commit).unwrap(),
        [agent_commit]
    );
    assert_eq!(git.commits_between(None, "HEAD").unwrap().len(), 3);
    assert!(matches!(
        git.commits_between(Some("nope"), "HEAD").unwrap_err(),
        GitError::UnknownRevision { .. }
    ));

    fs::write(dir.path().join("keep.txt"), "k3").unwrap();
    let sha3 = git
        .commit_all(
            "ralph: iteration 3 (US-002)",
            "",
            &trailers(3, "US-002", Outcome::StoryPassed),
        )
        .unwrap()
        .unwrap();

    let history = git.trailer_history(10).unwrap();
    assert_eq!(history.len(), 2, "plain commits are skipped");
    assert_eq!(history[0].sha, sha3);
    assert_eq!(history[0].run_id, "run-1");
    assert_eq!(history[0].iteration, Some(3));
    assert_eq!(history[0].story_id.as_deref(), Some("US-002"));
    assert_eq!(history[0].outcome, Some(Outcome::StoryPassed));
    assert_eq!(history[1].sha, sha);
    assert_eq!(history[1].iteration, Some(2));
    assert_eq!(history[1].outcome, Some(Outcome::Progress));
    assert_eq!(git.trailer_history(1).unwrap().len(), 1);
}

#[test]
fn set_ref_pins_the_iteration_start_even_after_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let repo = init_repo(dir.path());
    commit_files(&repo, &[("a", "1")], "one");
    let two = commit_files(&repo, &[("a", "2")], "two");
    let git = Repo::discover(dir.path()).unwrap();
    git.set_ref("refs/ralph/run-1/3/start", &two).unwrap();
    // The agent rewrites history.
    let one = repo
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .parent(0)
        .unwrap();
    repo.reset(one.as_object(), git2::ResetType::Hard, None)
        .unwrap();
    let pinned = repo
        .find_reference("refs/ralph/run-1/3/start")
        .unwrap()
        .target()
        .unwrap();
    assert_eq!(pinned.to_string(), two);
    assert!(matches!(
        git.set_ref("refs/ralph/run-1/4/start", "0000000")
            .unwrap_err(),
        GitError::UnknownRevision { .. }
    ));
}

#[test]
fn unborn_repository_gets_its_first_commit_on_the_prd_branch() {
    let dir = tempfile::tempdir().unwrap();
    init_repo(dir.path());
    let git = Repo::discover(dir.path()).unwrap();
    assert_eq!(git.head_sha().unwrap(), None);
    assert_eq!(git.current_branch().as_deref(), Some("main"));
    assert!(git.trailer_history(5).unwrap().is_empty());
    assert!(git.dirty_paths().unwrap().is_empty());

    assert_eq!(
        git.ensure_branch("ralph/first", None).unwrap(),
        BranchAction::Unborn
    );
    assert_eq!(git.current_branch().as_deref(), Some("ralph/first"));
    // An empty tree is not worth a commit.
    assert_eq!(
        git.commit_all(
            "ralph: iteration 1 (US-001)",
            "",
            &trailers(1, "US-001", Outcome::NoProgress)
        )
        .unwrap(),
        None
    );

    fs::write(dir.path().join("main.rs"), "fn main() {}\n").unwrap();
    assert_eq!(git.dirty_paths().unwrap(), ["main.rs"]);
    let sha = git
        .commit_all(
            "ralph: iteration 1 (US-001)",
            "",
            &trailers(1, "US-001", Outcome::Progress),
        )
        .unwrap()
        .unwrap();
    assert_eq!(git.head_sha().unwrap(), Some(sha.clone()));
    assert_eq!(git.current_branch().as_deref(), Some("ralph/first"));
    assert_eq!(git.commits_between(None, "HEAD").unwrap(), [sha]);
    assert_eq!(git.trailer_history(5).unwrap()[0].iteration, Some(1));
}

// ---------------------------------------------------------------------------------------------
// lock

/// Case 23: a second run in the same repository refuses, naming the pid that holds the lock.
#[test]
fn second_run_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let ralph_dir = dir.path().join(".ralph");
    let first = RunLock::acquire(&ralph_dir).unwrap();
    assert!(first.stale.is_none());

    // A separate open file description conflicts even within one process (flock semantics).
    let err = RunLock::acquire(&ralph_dir).unwrap_err();
    let pid = std::process::id();
    match &err {
        LockError::Held { pid: held_by, .. } => assert_eq!(*held_by, pid),
        other => panic!("expected Held, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("another ralph run (pid {pid} on host ")),
        "{msg}"
    );
    assert!(msg.contains("holds"), "{msg}");
    // The refused attempt did not disturb the holder's file.
    let info: LockInfo =
        serde_json::from_str(&fs::read_to_string(ralph_dir.join("lock")).unwrap()).unwrap();
    assert_eq!(info.pid, pid);

    drop(first);
    assert!(!ralph_dir.join("lock").exists());
    let second = RunLock::acquire(&ralph_dir).unwrap();
    assert!(second.stale.is_none());
}

/// Case 22 (lock part): a run killed with SIGKILL leaves its lock file behind but the kernel
/// released the lock; the next run takes it over and learns who held it.
#[test]
fn stale_lock_from_a_dead_process_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let ralph_dir = dir.path().join(".ralph");
    fs::create_dir_all(&ralph_dir).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    fs::write(
        ralph_dir.join("lock"),
        format!(
            r#"{{"pid":{dead_pid},"host":"old-host","started_at":"2025-01-31T14:05:09.000Z"}}"#
        ),
    )
    .unwrap();

    let acquired = RunLock::acquire(&ralph_dir).unwrap();
    let stale = acquired
        .stale
        .clone()
        .expect("the previous holder is reported");
    assert_eq!(stale.pid, dead_pid);
    assert_eq!(stale.host, "old-host");
    assert_eq!(acquired.lock.info().pid, std::process::id());
    let info: LockInfo =
        serde_json::from_str(&fs::read_to_string(ralph_dir.join("lock")).unwrap()).unwrap();
    assert_eq!(info.pid, std::process::id());
}

// ---------------------------------------------------------------------------------------------
// state

fn sample_state() -> State {
    let at: DateTime<Utc> = "2025-01-31T14:05:09.123Z".parse().unwrap();
    let mut state = State {
        run_id: Some("run-1".into()),
        iteration: 3,
        last_outcome: Some(Outcome::Progress.to_string()),
        blocked: vec!["US-009".into()],
        resume_at: Some(at),
        in_flight: Some(InFlight {
            run_id: "run-1".into(),
            iteration: 3,
            story_id: "US-002".into(),
            pid: 4242,
            started_at: at,
            start_sha: Some("abc123".into()),
            strays: Vec::new(),
            worktree: None,
            agent: None,
        }),
        ..State::default()
    };
    state.attempts.insert("US-002".into(), 2);
    state
}

#[test]
fn state_round_trips_and_leaves_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let ralph_dir = dir.path().join(".ralph");
    assert_eq!(State::load(&ralph_dir).unwrap(), None);

    let state = sample_state();
    state.save(&ralph_dir).unwrap();
    assert_eq!(State::load(&ralph_dir).unwrap(), Some(state.clone()));

    let mut next = state;
    next.iteration = 4;
    next.in_flight = None;
    next.save(&ralph_dir).unwrap();
    assert_eq!(State::load(&ralph_dir).unwrap(), Some(next));

    let names: Vec<String> = fs::read_dir(&ralph_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["state.json"]);
    let text = fs::read_to_string(ralph_dir.join("state.json")).unwrap();
    assert!(text.contains(r#""version": 1"#), "{text}");
    assert!(
        text.contains(r#""resume_at": "2025-01-31T14:05:09.123Z""#),
        "{text}"
    );
}

#[test]
fn corrupt_state_names_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("state.json"),
        r#"{"version":1,"iteration":"#,
    )
    .unwrap();
    let err = State::load(dir.path()).unwrap_err();
    assert!(matches!(err, StateError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("state.json is corrupt"), "{msg}");
    assert!(msg.contains("delete it"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// ledger

fn record(iteration: u32, outcome: Outcome) -> LedgerRecord {
    let at: DateTime<Utc> = "2025-01-31T14:05:09Z".parse().unwrap();
    let mut r = LedgerRecord::new("run-1", iteration, "US-001", outcome, at);
    r.story_title = "Add login".into();
    r.backend = "exec".into();
    r.ended_at = at + chrono::Duration::milliseconds(2500);
    r.duration_s = 2.5;
    r.exit_code = Some(0);
    r.head_before = Some("a".into());
    r.head_after = Some("b".into());
    r.checkpoint_commit = Some("b".into());
    r.files_changed = vec!["src/main.rs".into()];
    r.transcript = Some(".ralph/runs/run-1/iter-001.jsonl".into());
    r
}

#[test]
fn ledger_skips_a_torn_last_line_but_rejects_a_bad_middle_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".ralph/ledger.jsonl");
    assert!(ledger::read_all(&path).unwrap().records.is_empty());

    ledger::append(&path, &record(1, Outcome::Progress)).unwrap();
    ledger::append(&path, &record(2, Outcome::StoryPassed)).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.lines().all(|l| l.starts_with(r#"{"run_id":"run-1""#)));

    // A crash mid-write leaves a fragment of a third line.
    let mut torn = text.clone();
    torn.push_str(r#"{"run_id":"run-1","iteration":3,"sto"#);
    fs::write(&path, &torn).unwrap();
    let contents = ledger::read_all(&path).unwrap();
    assert_eq!(
        contents.records,
        [
            record(1, Outcome::Progress),
            record(2, Outcome::StoryPassed)
        ]
    );
    assert_eq!(contents.torn_last_line, Some(3));

    // The same garbage in the middle is an error naming file:line.
    let lines: Vec<&str> = text.lines().collect();
    fs::write(&path, format!("{}\nnot json\n{}\n", lines[0], lines[1])).unwrap();
    let err = ledger::read_all(&path).unwrap_err();
    assert!(
        matches!(err, LedgerError::BadLine { line: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("ledger.jsonl:2:"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// progress

#[test]
fn progress_excerpt_keeps_codebase_patterns_and_the_newest_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("progress.txt");
    let start = Local.with_ymd_and_hms(2025, 1, 31, 9, 0, 0).unwrap();
    assert!(progress::ensure_exists(&path, start).unwrap());
    // The agent curates its patterns at the top, as the original prompt asks.
    let text = fs::read_to_string(&path).unwrap();
    let text = text.replace(
        "## Codebase Patterns\n",
        "## Codebase Patterns\n- Run `make check` before committing\n- Use the `db::tx` helper\n",
    );
    fs::write(&path, text).unwrap();

    for iteration in 1..=60 {
        progress::append_entry(
            &path,
            &Entry {
                at: start + chrono::Duration::minutes(iteration.into()),
                iteration,
                story_id: format!("US-{iteration:03}"),
                story_title: "Story".into(),
                outcome: Outcome::Progress,
                commit: Some(format!("{iteration:040}")),
                summary: "changed some files\nand learned something".into(),
            },
        )
        .unwrap();
    }
    let full = fs::read_to_string(&path).unwrap();
    assert!(full.len() > 4096);

    let excerpt = progress::excerpt(&path, 2048).unwrap();
    assert!(excerpt.len() <= 2048 + 64, "{}", excerpt.len());
    assert!(excerpt.starts_with(
        "## Codebase Patterns\n- Run `make check` before committing\n- Use the `db::tx` helper\n"
    ));
    assert!(excerpt.contains("earlier bytes omitted"), "{excerpt}");
    assert!(
        excerpt.contains("(ralph, iteration 60)"),
        "newest entry kept"
    );
    assert!(
        !excerpt.contains("(ralph, iteration 1)\n"),
        "oldest entry dropped"
    );
    assert!(excerpt.ends_with("---\n"));
    // The tail starts at an entry heading, not mid-entry.
    let after_marker = excerpt.split("omitted …]\n").nth(1).unwrap();
    assert!(after_marker.starts_with("## 2025-01-31 "), "{after_marker}");
    // Every entry is whole and appended after the earlier content.
    assert!(full.starts_with("# Ralph Progress Log\nStarted: 2025-01-31 09:00:00"));
}
