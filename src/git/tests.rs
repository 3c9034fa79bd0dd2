//! Unit tests of [`super`]: checkpoints, diffs, history and housekeeping on real repositories.

use super::*;

/// A config that reads only `path`, so the developer's global config cannot leak in.
fn isolated_config(dir: &Path, contents: &str) -> git2::Config {
    let path = dir.join("config");
    std::fs::write(&path, contents).unwrap();
    git2::Config::open(&path).unwrap()
}

/// `git <args>` in `dir`, its stdout (the test fails when git does); also for `pack`'s and
/// `crate::worktree`'s tests.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_checkpoint_stages_what_git_add_all_would_and_leaves_the_tree_clean() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    git2::Repository::init(root).unwrap();
    let repo = Repo::discover(root).unwrap();
    std::fs::write(root.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(root.join("keep.txt"), "keep\n").unwrap();
    std::fs::write(root.join("edit.txt"), "v1\n").unwrap();
    std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(root.join("run.sh"), "echo\n").unwrap();
    assert!(repo.checkpoint("one", "", &[]).unwrap().commit.is_some());

    std::fs::write(root.join("edit.txt"), "v2\n").unwrap();
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    std::fs::create_dir_all(root.join("new/deep")).unwrap();
    std::fs::write(root.join("new/deep/file.rs"), "fn main() {}\n").unwrap();
    std::fs::write(root.join("debug.log"), "ignored\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("keep.txt", root.join("link")).unwrap();
    let cp = repo.checkpoint("two", "", &[]).unwrap();
    assert!(cp.commit.is_some() && cp.clean, "{cp:?}");
    assert_eq!(git(root, &["status", "--porcelain"]), "");
    let files = git(root, &["ls-files", "-s"]);
    assert!(
        files.contains("100755") && files.contains("run.sh"),
        "{files}"
    );
    assert!(
        files.contains("120000") && files.contains("link"),
        "{files}"
    );
    assert!(files.contains("new/deep/file.rs"), "{files}");
    assert!(
        !files.contains("gone.txt") && !files.contains("debug.log"),
        "{files}"
    );
    assert_eq!(git(root, &["show", "HEAD:edit.txt"]), "v2\n");
    // Nothing left: no empty commit.
    assert_eq!(repo.checkpoint("three", "", &[]).unwrap().commit, None);
}

/// A repository with one commit (`a.txt`, `.gitignore` ignoring `*.log`) and its handle.
fn committed_repo() -> (tempfile::TempDir, Repo) {
    let dir = tempfile::tempdir().unwrap();
    git2::Repository::init(dir.path()).unwrap();
    let repo = Repo::discover(dir.path()).unwrap();
    std::fs::write(dir.path().join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    repo.checkpoint("one", "", &[]).unwrap();
    (dir, repo)
}

#[test]
fn a_checkpoint_after_a_staging_walks_only_the_paths_written_since() {
    let (dir, repo) = committed_repo();
    let root = dir.path();
    std::fs::write(root.join("work.txt"), "the agent's work\n").unwrap();
    let prior = repo.stage().unwrap();
    // After the walk: ralph writes its memory files (one in a directory, one ignored), and
    // a file outside them changes. Only the named paths are walked again, so that file is
    // not staged: the walk was not repeated.
    std::fs::write(root.join("progress.txt"), "entry\n").unwrap();
    std::fs::create_dir_all(root.join("hist")).unwrap();
    std::fs::write(root.join("hist/part-1.txt"), "old entries\n").unwrap();
    std::fs::write(root.join("hist/skip.log"), "ignored\n").unwrap();
    std::fs::write(root.join("a.txt"), "changed outside\n").unwrap();
    let written = ["progress.txt".to_owned(), "hist".to_owned()];
    let cp = repo
        .checkpoint_after("two", "", &[], Some(&prior), &written)
        .unwrap();
    assert!(cp.commit.is_some(), "{cp:?}");
    let files = git(root, &["ls-files"]);
    for f in ["work.txt", "progress.txt", "hist/part-1.txt"] {
        assert!(files.lines().any(|l| l == f), "{f} not committed: {files}");
    }
    assert!(
        !files.contains("skip.log"),
        "an ignored file was committed: {files}"
    );
    assert_eq!(git(root, &["show", "HEAD:a.txt"]), "a\n");
    // The staging is not reused once HEAD moved: the next checkpoint walks everything.
    let cp = repo
        .checkpoint_after("three", "", &[], Some(&prior), &written)
        .unwrap();
    assert!(cp.commit.is_some() && cp.clean, "{cp:?}");
    assert_eq!(git(root, &["show", "HEAD:a.txt"]), "changed outside\n");
    assert_eq!(git(root, &["status", "--porcelain"]), "");
}

#[test]
fn a_staging_is_not_reused_after_the_index_changed_or_in_another_tree() {
    let (dir, repo) = committed_repo();
    let root = dir.path();
    let prior = repo.stage().unwrap();
    std::fs::write(root.join("b.txt"), "b\n").unwrap();
    // Someone else staged a file: the index file is another one, so everything is walked.
    git(root, &["add", "b.txt"]);
    std::fs::write(root.join("c.txt"), "c\n").unwrap();
    let staged = repo
        .restage(Some(&prior), &["progress.txt".to_owned()])
        .unwrap();
    assert_eq!(
        repo.staged_diff(&staged, Some("HEAD")).unwrap(),
        ["b.txt", "c.txt"]
    );
    // A staging of another repository's tree is never applied here.
    let (other_dir, other) = committed_repo();
    std::fs::write(other_dir.path().join("d.txt"), "d\n").unwrap();
    let foreign = other.stage().unwrap();
    let cp = repo
        .checkpoint_after("x", "", &[], Some(&foreign), &[])
        .unwrap();
    assert!(cp.commit.is_some() && cp.clean, "{cp:?}");
    let files = git(root, &["ls-files"]);
    assert!(
        files.contains("c.txt") && !files.contains("d.txt"),
        "{files}"
    );
}

#[test]
fn a_restaged_secret_file_is_still_withheld() {
    let (dir, repo) = committed_repo();
    let root = dir.path();
    let prior = repo.stage().unwrap();
    std::fs::write(root.join(".env"), "KEY=1\n").unwrap();
    let cp = repo
        .checkpoint_after("x", "", &[], Some(&prior), &[".env".to_owned()])
        .unwrap();
    assert_eq!(cp.commit, None);
    assert_eq!(cp.withheld, [".env"]);
}

#[test]
fn stale_stat_data_is_refreshed_once_and_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    git2::Repository::init(root).unwrap();
    let repo = Repo::discover(root).unwrap();
    std::fs::write(root.join("a.txt"), "same\n").unwrap();
    let head = repo.commit_all("one", "", &[]).unwrap().unwrap();
    // Same content, new times: what `cp -a` or a tool touching files leaves.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(120);
    std::fs::File::options()
        .write(true)
        .open(root.join("a.txt"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let index_mtime = |r: &Repo| {
        let mut index = r.repo.index().unwrap();
        index.read(true).unwrap();
        index
            .get_path(Path::new("a.txt"), 0)
            .unwrap()
            .mtime
            .seconds()
    };
    let file_mtime = std::fs::metadata(root.join("a.txt"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i32;
    assert_ne!(index_mtime(&repo), file_mtime);
    assert!(repo.changed_files(&head).unwrap().is_empty());
    // The checkpoint's status refreshes it (and commits nothing: the content is the same).
    assert_eq!(repo.checkpoint("none", "", &[]).unwrap().commit, None);
    let reopened = Repo::discover(root).unwrap();
    assert_eq!(
        index_mtime(&reopened),
        file_mtime,
        "the refreshed stat data was not written"
    );
}

#[test]
fn file_at_reads_a_file_as_committed_and_none_when_absent() {
    let dir = tempfile::tempdir().unwrap();
    git2::Repository::init(dir.path()).unwrap();
    let repo = Repo::discover(dir.path()).unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/prd.json"), "first\n").unwrap();
    let first = repo.commit_all("one", "", &[]).unwrap().unwrap();
    std::fs::write(dir.path().join("sub/prd.json"), "second\n").unwrap();
    repo.commit_all("two", "", &[]).unwrap().unwrap();
    // The working tree moves on; history keeps each version.
    std::fs::write(dir.path().join("sub/prd.json"), "uncommitted\n").unwrap();
    assert_eq!(
        repo.file_at(&first, "sub/prd.json").unwrap().as_deref(),
        Some(&b"first\n"[..])
    );
    assert_eq!(
        repo.file_at("HEAD", "sub/prd.json").unwrap().as_deref(),
        Some(&b"second\n"[..])
    );
    assert_eq!(repo.file_at("HEAD", "missing.json").unwrap(), None);
    assert_eq!(
        repo.file_at("HEAD", "sub").unwrap(),
        None,
        "a directory is not a file"
    );
    assert!(matches!(
        repo.file_at("no-such-rev", "sub/prd.json"),
        Err(GitError::UnknownRevision { .. })
    ));
}

#[test]
fn identity_falls_back_to_ralph_when_nothing_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let config = isolated_config(dir.path(), "");
    let sig = identity(&config, &|_| None, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL").unwrap();
    assert_eq!(sig.name(), Some("ralph"));
    assert_eq!(sig.email(), Some("ralph@localhost"));
}

#[test]
fn identity_prefers_env_then_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = isolated_config(
        dir.path(),
        "[user]\n\tname = Ada\n\temail = ada@example.com\n",
    );
    let sig = identity(&config, &|_| None, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL").unwrap();
    assert_eq!(sig.name(), Some("Ada"));
    assert_eq!(sig.email(), Some("ada@example.com"));

    let env = |key: &str| (key == "GIT_AUTHOR_NAME").then(|| "Bot".to_owned());
    let sig = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL").unwrap();
    assert_eq!(sig.name(), Some("Bot"));
    assert_eq!(sig.email(), Some("ada@example.com"));
}

#[test]
fn commit_message_layout_keeps_trailers_parseable() {
    let msg = commit_message(
        "ralph: iteration 3\n(US-001)",
        "",
        &[
            ("Ralph-Run", "r1".into()),
            ("Ralph-Story", "US-001\nx".into()),
        ],
    );
    assert_eq!(
        msg,
        "ralph: iteration 3 (US-001)\n\nRalph-Run: r1\nRalph-Story: US-001 x\n"
    );
    let msg = commit_message("s", "  body text \n", &[("K", "v".into())]);
    assert_eq!(msg, "s\n\nbody text\n\nK: v\n");
    let parsed: Vec<(String, String)> = git2::message_trailers_strs(&msg)
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(parsed, vec![("K".to_owned(), "v".to_owned())]);
}
