//! Unit tests of [`super`]: landing a story's work, salvage refs and moving the checkout, on real repositories.

use super::*;
use crate::git::tests::git;
use crate::git::worktree::tests::repo_with_commit;
use std::os::unix::fs::PermissionsExt as _;

/// A story's worktree of `main` at `base`, opened.
fn worktree(main: &Repo, name: &str, base: &str) -> (std::path::PathBuf, Repo) {
    let root = main.root().join(".ralph/worktrees/run").join(name);
    main.add_worktree(&root, base).unwrap();
    let wt = Repo::discover(&root).unwrap();
    (root, wt)
}

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn read(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path)).ok()
}

#[test]
fn commit_leftovers_commits_what_the_agent_left_but_not_ignored_files() {
    let (_d, main, base) = repo_with_commit();
    write(main.root(), ".gitignore", ".ralph/\n*.log\n");
    write(main.root(), "gone.txt", "x\n");
    let base2 = main.commit_all("two", "", &[]).unwrap().unwrap();
    let (root, wt) = worktree(&main, "US-1", &base2);
    assert_eq!(commit_leftovers(&wt, "nothing").unwrap(), base2);
    write(&root, "a.txt", "changed\n");
    write(&root, "new/file.rs", "fn x() {}\n");
    write(&root, "build.log", "ignored\n");
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    let head = commit_leftovers(&wt, "ralph: leftovers of US-1").unwrap();
    assert_ne!(head, base2);
    assert_eq!(
        wt.commit_subject(&head).unwrap(),
        "ralph: leftovers of US-1"
    );
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    let files = git(&root, &["ls-files"]);
    assert!(
        files.contains("new/file.rs") && !files.contains("gone.txt"),
        "{files}"
    );
    assert!(!files.contains("build.log"), "{files}");
    assert!(root.join("build.log").exists());
    let _ = base;
}

#[test]
fn integrate_fast_forwards_when_the_tip_has_not_moved() {
    let (_d, main, base) = repo_with_commit();
    let (root, wt) = worktree(&main, "US-1", &base);
    write(&root, "b.txt", "story\n");
    let story = commit_leftovers(&wt, "story").unwrap();
    let got = integrate(&wt, &base, &["prd.json", "progress.txt"]).unwrap();
    assert_eq!(
        got,
        Integration::Clean {
            commit: story.clone(),
            fast_forward: true
        }
    );
    assert_eq!(wt.head_sha().unwrap(), Some(story));
}

#[test]
fn integrate_merges_disjoint_work_with_the_tip_first() {
    let (_d, main, base) = repo_with_commit();
    let (root, wt) = worktree(&main, "US-2", &base);
    write(&root, "story.txt", "story\n");
    let story = commit_leftovers(&wt, "story work").unwrap();
    write(main.root(), "landed.txt", "landed\n");
    let tip = main.commit_all("US-1 landed", "", &[]).unwrap().unwrap();

    let Integration::Clean {
        commit,
        fast_forward: false,
    } = integrate(&wt, &tip, &["prd.json"]).unwrap()
    else {
        panic!("not a clean merge");
    };
    assert_eq!(wt.head_sha().unwrap().as_deref(), Some(commit.as_str()));
    assert_eq!(wt.current_branch(), None);
    let parents = git(&root, &["log", "-1", "--format=%P", &commit]);
    assert_eq!(parents.trim(), format!("{tip} {story}"));
    let subject = wt.commit_subject(&commit).unwrap();
    assert!(
        subject.contains(&tip[..12]) && subject.contains(&story[..12]),
        "{subject}"
    );
    assert_eq!(read(&root, "landed.txt").as_deref(), Some("landed\n"));
    assert_eq!(read(&root, "story.txt").as_deref(), Some("story\n"));
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    // The main checkout's branch can move forward to it.
    assert!(main.is_ancestor(&tip, &commit).unwrap());
}

#[test]
fn prd_and_progress_edited_on_both_sides_are_no_conflict_and_end_as_the_tips() {
    let (_d, main, _) = repo_with_commit();
    write(main.root(), "prd.json", "{\"passes\": [false, false]}\n");
    write(main.root(), "progress.txt", "start\n");
    let base = main.commit_all("prd", "", &[]).unwrap().unwrap();
    let (root, wt) = worktree(&main, "US-2", &base);
    write(&root, "prd.json", "{\"passes\": [false, true]}\n");
    write(&root, "progress.txt", "start\nUS-2 done\n");
    write(&root, "progress-history/US-2.md", "mine\n");
    write(&root, "code.rs", "story\n");
    commit_leftovers(&wt, "story").unwrap();
    write(main.root(), "prd.json", "{\"passes\": [true, false]}\n");
    write(main.root(), "progress.txt", "start\nUS-1 done\n");
    let tip = main.commit_all("US-1 landed", "", &[]).unwrap().unwrap();

    let got = integrate(
        &wt,
        &tip,
        &["prd.json", "progress.txt", "progress-history/"],
    )
    .unwrap();
    assert!(
        matches!(
            got,
            Integration::Clean {
                fast_forward: false,
                ..
            }
        ),
        "{got:?}"
    );
    assert_eq!(
        read(&root, "prd.json").unwrap(),
        "{\"passes\": [true, false]}\n"
    );
    assert_eq!(read(&root, "progress.txt").unwrap(), "start\nUS-1 done\n");
    assert_eq!(
        read(&root, "progress-history/US-2.md"),
        None,
        "absent in the tip"
    );
    assert_eq!(read(&root, "code.rs").unwrap(), "story\n");
    assert_eq!(git(&root, &["status", "--porcelain"]), "");

    // Only the kept files differ from the tip and the tip is in the story's history: still a
    // merge commit, with the tip's prd.json.
    let (root3, wt3) = worktree(&main, "US-3", &tip);
    write(&root3, "prd.json", "{\"passes\": [true, true]}\n");
    commit_leftovers(&wt3, "claims").unwrap();
    let got = integrate(&wt3, &tip, &["prd.json"]).unwrap();
    let Integration::Clean {
        commit,
        fast_forward: false,
    } = got
    else {
        panic!("{got:?}")
    };
    assert_eq!(
        wt3.file_at(&commit, "prd.json").unwrap(),
        main.file_at(&tip, "prd.json").unwrap()
    );
}

#[test]
fn a_real_conflict_leaves_the_worktree_clean_at_the_story_and_summarises_both_sides() {
    let (_d, main, _) = repo_with_commit();
    write(
        main.root(),
        "lib.rs",
        "fn a() {}\nfn shared() -> u8 { 1 }\nfn z() {}\n",
    );
    write(main.root(), "prd.json", "{}\n");
    let base = main.commit_all("base", "", &[]).unwrap().unwrap();
    let (root, wt) = worktree(&main, "US-2", &base);
    write(
        &root,
        "lib.rs",
        "fn a() {}\nfn shared() -> u8 { 2 }\nfn z() {}\n",
    );
    write(&root, "prd.json", "{\"mine\": 1}\n");
    write(&root, "other.rs", "ok\n");
    let story = commit_leftovers(&wt, "US-2: shared returns 2").unwrap();
    write(
        main.root(),
        "lib.rs",
        "fn a() {}\nfn shared() -> u8 { 3 }\nfn z() {}\n",
    );
    write(main.root(), "prd.json", "{\"tip\": 1}\n");
    let tip = main
        .commit_all("US-1: shared returns 3", "", &[])
        .unwrap()
        .unwrap();

    let got = integrate(&wt, &tip, &["prd.json"]).unwrap();
    let Integration::Conflict {
        files,
        ours,
        theirs,
    } = got
    else {
        panic!("{got:?}")
    };
    assert_eq!(files, vec!["lib.rs".to_owned()]);
    assert_eq!(wt.head_sha().unwrap(), Some(story));
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    let text = read(&root, "lib.rs").unwrap();
    assert!(
        !text.contains("<<<<<<<") && text.contains("{ 2 }"),
        "{text}"
    );
    // `ours` is the run branch's side (the merge's first parent), `theirs` the story's.
    assert!(
        theirs.starts_with("1 commit since ")
            && theirs.contains("\"US-2: shared returns 2\"")
            && theirs.contains(
                "lib.rs: changed:\n  - fn shared() -> u8 { 1 }\n  + fn shared() -> u8 { 2 }"
            ),
        "{theirs}"
    );
    assert!(
        ours.contains("US-1: shared returns 3") && ours.contains("+ fn shared() -> u8 { 3 }"),
        "{ours}"
    );
    assert!(
        !ours.contains("US-2") && !theirs.contains("US-1"),
        "{ours}\n{theirs}"
    );
    assert!(!ours.contains("\n\n") && !theirs.contains("\n\n"));
}

#[test]
fn uncommitted_work_in_the_way_of_the_merge_is_an_error_and_changes_nothing() {
    let (_d, main, base) = repo_with_commit();
    let (root, wt) = worktree(&main, "US-2", &base);
    write(&root, "story.txt", "story\n");
    let story = commit_leftovers(&wt, "story").unwrap();
    write(main.root(), "landed.txt", "landed\n");
    let tip = main.commit_all("landed", "", &[]).unwrap().unwrap();
    // Left uncommitted where the merge puts the tip's file.
    write(&root, "landed.txt", "the agent's, uncommitted\n");
    let err = integrate(&wt, &tip, &[]).unwrap_err();
    assert!(matches!(err, GitError::CheckoutConflict { .. }), "{err}");
    assert_eq!(wt.head_sha().unwrap(), Some(story));
    assert_eq!(
        read(&root, "landed.txt").as_deref(),
        Some("the agent's, uncommitted\n")
    );
}

#[test]
fn a_modify_delete_conflict_is_a_conflict() {
    let (_d, main, base) = repo_with_commit();
    let (root, wt) = worktree(&main, "US-2", &base);
    write(&root, "a.txt", "story changed it\n");
    let story = commit_leftovers(&wt, "change a").unwrap();
    std::fs::remove_file(main.root().join("a.txt")).unwrap();
    let tip = main.commit_all("delete a", "", &[]).unwrap().unwrap();
    let got = integrate(&wt, &tip, &[]).unwrap();
    let Integration::Conflict { files, ours, .. } = got else {
        panic!("{got:?}")
    };
    assert_eq!(files, vec!["a.txt".to_owned()]);
    assert!(ours.contains("a.txt: deleted."), "{ours}");
    assert_eq!(wt.head_sha().unwrap(), Some(story));
    assert_eq!(read(&root, "a.txt").as_deref(), Some("story changed it\n"));
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
}

/// The main checkout with an untracked and an ignored file of the user's, and a landed
/// descendant `to` of its HEAD that changes, adds and deletes tracked files.
fn checkout_to_advance() -> (tempfile::TempDir, Repo, String, String, String) {
    let (d, main, _) = repo_with_commit();
    write(main.root(), ".gitignore", ".ralph/\n*.secret\n");
    write(main.root(), "old.txt", "old\n");
    let from = main.commit_all("base", "", &[]).unwrap().unwrap();
    let branch = main.current_branch().unwrap();
    let (root, wt) = worktree(&main, "US-1", &from);
    write(&root, "a.txt", "landed\n");
    write(&root, "src/new.rs", "new\n");
    std::fs::remove_file(root.join("old.txt")).unwrap();
    let to = commit_leftovers(&wt, "story").unwrap();
    (d, main, branch, from, to)
}

#[test]
fn finish_advance_completes_a_half_done_move_and_leaves_a_users_change_alone() {
    // Half done: a.txt written (and staged), old.txt still there, the branch at `from`.
    let (_d, main, branch, from, to) = checkout_to_advance();
    let root = main.root().to_path_buf();
    write(&root, "a.txt", "landed\n");
    git(&root, &["add", "a.txt"]);
    assert!(finish_advance(&main, &branch, &from, &to).unwrap());
    assert_eq!(main.head_sha().unwrap(), Some(to.clone()));
    assert_eq!(read(&root, "src/new.rs").as_deref(), Some("new\n"));
    assert!(!root.join("old.txt").exists());
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    // Already there: nothing to do.
    assert!(!finish_advance(&main, &branch, &from, &to).unwrap());

    // A file holding neither side's version is the user's: nothing moves.
    let (_d, main, branch, from, to) = checkout_to_advance();
    let root = main.root().to_path_buf();
    write(&root, "a.txt", "my own edit\n");
    assert!(!finish_advance(&main, &branch, &from, &to).unwrap());
    assert_eq!(main.head_sha().unwrap(), Some(from.clone()));
    assert_eq!(read(&root, "a.txt").as_deref(), Some("my own edit\n"));
    assert!(root.join("old.txt").exists());
}

#[test]
fn advance_checkout_moves_tracked_files_and_keeps_the_users_untracked_and_ignored_files() {
    let (_d, main, branch, from, to) = checkout_to_advance();
    let root = main.root().to_path_buf();
    write(&root, "notes.md", "mine\n");
    write(&root, "db.secret", "hunter2\n");
    std::fs::set_permissions(
        root.join("notes.md"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("db.secret"),
        std::fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };

    advance_checkout(&main, &branch, &from, &to).unwrap();
    assert_eq!(main.head_sha().unwrap(), Some(to.clone()));
    assert_eq!(main.current_branch().as_deref(), Some(branch.as_str()));
    assert_eq!(read(&root, "a.txt").as_deref(), Some("landed\n"));
    assert_eq!(read(&root, "src/new.rs").as_deref(), Some("new\n"));
    assert!(!root.join("old.txt").exists());
    assert_eq!(read(&root, "notes.md").as_deref(), Some("mine\n"));
    assert_eq!(read(&root, "db.secret").as_deref(), Some("hunter2\n"));
    assert_eq!((mode("notes.md"), mode("db.secret")), (0o600, 0o751));
    assert_eq!(git(&root, &["status", "--porcelain"]), "?? notes.md\n");
    // Again from the new HEAD: nothing to do.
    advance_checkout(&main, &branch, &to, &to).unwrap();
}

#[test]
fn advance_checkout_keeps_the_users_edits_and_staged_changes_to_files_it_does_not_change() {
    let (_d, main, branch, from, to) = checkout_to_advance();
    let root = main.root().to_path_buf();
    write(&root, ".gitignore", ".ralph/\n*.secret\n# staged\n");
    git(&root, &["add", ".gitignore"]);
    write(&root, ".gitignore", ".ralph/\n*.secret\n# mine\n");
    advance_checkout(&main, &branch, &from, &to).unwrap();
    assert_eq!(main.head_sha().unwrap(), Some(to.clone()));
    assert_eq!(read(&root, "a.txt").as_deref(), Some("landed\n"));
    assert_eq!(
        read(&root, ".gitignore").as_deref(),
        Some(".ralph/\n*.secret\n# mine\n")
    );
    assert_eq!(git(&root, &["status", "--porcelain"]), "MM .gitignore\n");
    assert_eq!(
        git(&root, &["show", ":.gitignore"]),
        ".ralph/\n*.secret\n# staged\n"
    );
}

#[test]
fn advance_checkout_refuses_a_user_edit_or_a_file_in_the_way_and_changes_nothing() {
    let (_d, main, branch, from, to) = checkout_to_advance();
    let root = main.root().to_path_buf();
    let unchanged = |main: &Repo| {
        assert_eq!(main.head_sha().unwrap(), Some(from.clone()));
        assert_eq!(read(&root, "old.txt").as_deref(), Some("old\n"));
        assert!(!root.join("src/new.rs.keep").exists());
    };

    // A tracked file the user edited that the landing changes.
    write(&root, "a.txt", "mine\n");
    let err = advance_checkout(&main, &branch, &from, &to).unwrap_err();
    let GitError::CheckoutBlocked { files, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(files, &vec!["a.txt".to_owned()]);
    assert!(
        err.to_string().contains("a.txt") && err.to_string().contains("never stashes"),
        "{err}"
    );
    unchanged(&main);
    assert_eq!(read(&root, "a.txt").as_deref(), Some("mine\n"));
    // A file the landing deletes.
    git(&root, &["checkout", "--", "a.txt"]);
    write(&root, "old.txt", "my old\n");
    let err = advance_checkout(&main, &branch, &from, &to).unwrap_err();
    assert!(err.to_string().contains("old.txt"), "{err}");
    assert_eq!(read(&root, "old.txt").as_deref(), Some("my old\n"));
    git(&root, &["checkout", "--", "old.txt"]);

    // A change the user staged.
    write(&root, "a.txt", "staged by the user\n");
    git(&root, &["add", "a.txt"]);
    write(&root, "a.txt", "a\n");
    let err = advance_checkout(&main, &branch, &from, &to).unwrap_err();
    assert!(err.to_string().contains("a.txt"), "{err}");
    unchanged(&main);
    git(&root, &["reset", "-q", "a.txt"]);

    // An untracked file where the landing puts a tracked one.
    write(&root, "src/new.rs", "the user's own\n");
    let err = advance_checkout(&main, &branch, &from, &to).unwrap_err();
    assert!(err.to_string().contains("src/new.rs"), "{err}");
    assert_eq!(
        read(&root, "src/new.rs").as_deref(),
        Some("the user's own\n")
    );
    unchanged(&main);
    std::fs::remove_file(root.join("src/new.rs")).unwrap();

    // HEAD elsewhere, or `to` not a descendant.
    assert!(advance_checkout(&main, "other", &from, &to).is_err());
    assert!(advance_checkout(&main, &branch, &to, &from).is_err());
    let err = advance_checkout(&main, &branch, &from, &from).map(|_| ());
    assert!(err.is_ok());
    unchanged(&main);
    advance_checkout(&main, &branch, &from, &to).unwrap();
}

#[test]
fn salvage_never_overwrites_a_salvage() {
    let (_d, main, first) = repo_with_commit();
    write(main.root(), "b.txt", "b\n");
    let second = main.commit_all("two", "", &[]).unwrap().unwrap();
    let name = salvage(&main, "20250101-ab", "a/b", &first).unwrap();
    assert_eq!(name, "refs/ralph/salvage/20250101-ab/a%2Fb");
    assert_eq!(salvage(&main, "20250101-ab", "a/b", &first).unwrap(), name);
    let next = salvage(&main, "20250101-ab", "a/b", &second).unwrap();
    assert_eq!(next, "refs/ralph/salvage/20250101-ab/a%2Fb-2");
    assert_eq!(main.ref_sha(&name), Some(first.clone()));
    assert_eq!(main.ref_sha(&next), Some(second.clone()));
    assert_eq!(
        salvage(&main, "20250101-ab", "a/b", &first).unwrap(),
        name,
        "the same work is not saved twice"
    );
    let plain = salvage(&main, "20250101-ab", "US-001", &second).unwrap();
    assert_eq!(plain, "refs/ralph/salvage/20250101-ab/US-001");
    assert!(matches!(
        salvage(&main, "r", "US-1", "no-such"),
        Err(GitError::UnknownRevision { .. })
    ));
}

#[test]
fn commit_own_files_commits_ralphs_files_and_leaves_the_users_changes_alone() {
    let (_d, main, _) = repo_with_commit();
    let root = main.root().to_path_buf();
    write(&root, "prd.json", "{}\n");
    write(&root, "progress.txt", "start\n");
    write(&root, "progress-history/0001.txt", "old part\n");
    write(&root, "README.md", "readme\n");
    write(&root, "staged.txt", "v1\n");
    let before = main.commit_all("base", "", &[]).unwrap().unwrap();
    // The user, during the run: an edit, a staged change, a new file.
    write(&root, "README.md", "readme\nmy edit\n");
    write(&root, "staged.txt", "v2\n");
    git(&root, &["add", "staged.txt"]);
    write(&root, "mine.txt", "new\n");
    // ralph, at landing.
    write(&root, "prd.json", "{\"passes\": true}\n");
    write(&root, "progress.txt", "start\nentry\n");
    write(&root, "progress-history/0002.txt", "new part\n");
    std::fs::remove_file(root.join("progress-history/0001.txt")).unwrap();

    let own = ["prd.json", "progress.txt", "progress-history/"];
    let commit = commit_own_files(
        &main,
        &own,
        "ralph: iteration 2 (US-001)",
        "",
        &[("Ralph-Run", "r".into())],
    )
    .unwrap()
    .unwrap();
    assert_ne!(commit, before);
    let changed = git(&root, &["diff", "--name-status", &before, &commit]);
    assert_eq!(
        changed,
        "M\tprd.json\nD\tprogress-history/0001.txt\nA\tprogress-history/0002.txt\nM\tprogress.txt\n"
    );
    assert!(main.message_of(&commit).unwrap().contains("Ralph-Run: r"));
    // The user's changes are as they were: the edit unstaged, the staged change staged, the
    // new file untracked.
    assert_eq!(
        git(&root, &["status", "--porcelain"]),
        " M README.md\nM  staged.txt\n?? mine.txt\n"
    );
    assert_eq!(
        read(&root, "README.md").as_deref(),
        Some("readme\nmy edit\n")
    );
    // Nothing left of ralph's: no empty commit.
    assert_eq!(
        commit_own_files(&main, &own, "again", "", &[]).unwrap(),
        None
    );
}

#[test]
fn commit_own_files_waits_for_an_index_lock_another_process_lets_go_of() {
    let (_d, main, base) = repo_with_commit();
    let root = main.root().to_path_buf();
    write(&root, "progress.txt", "entry\n");
    // Another git process's `git add` holds the index for a moment.
    let lock = main.index_lock();
    std::fs::write(&lock, b"").unwrap();
    let releaser = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::remove_file(lock).unwrap();
        })
    };
    let made = commit_own_files(&main, &["progress.txt"], "ralph: entry", "", &[]);
    releaser.join().unwrap();
    let made = made.unwrap().unwrap();
    assert_ne!(made, base);
    assert_eq!(main.head_sha().unwrap().as_deref(), Some(made.as_str()));
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
}
