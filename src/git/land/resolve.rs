//! `--resolve-conflicts`: the git side of a conflict's resolution iteration
//! (docs/decisions.md, "Resolving a landing's conflict").
//!
//! [`prepare`] puts the conflict into a fresh worktree at the run branch's tip: one commit on
//! the tip whose files hold the merge of the story's work, with git's markers where it
//! conflicts (a modify/delete conflict: the modified side's file). [`facts`] reads what the
//! agent made of it, [`judge`] (pure) decides, and [`merge_commit`] turns an accepted result
//! into a merge of the tip and the story's work, so that the landed history holds the story's
//! own commits and not the commit with the markers.

use std::collections::BTreeSet;
use std::path::Path;

use git2::{build::CheckoutBuilder, IndexEntry, MergeFileOptions, Oid};

use super::{
    commit_message, covered, identity, op, real_conflicts, side_summary, take_from_tip, GitError,
    Repo,
};

/// A conflict made ready for its resolution (what [`prepare`] did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The merge base of the tip and the story's work (full sha).
    pub base: String,
    /// The commit with the markers, on the tip: where the agent starts (full sha).
    pub start: String,
    /// The conflicting files, repository-relative, sorted.
    pub files: Vec<String>,
    /// Those of `files` that one side deleted and the other changed, sorted.
    pub modify_delete: Vec<String>,
}

/// In worktree `wt`, whose HEAD is the run branch's tip (a fresh worktree), merges the story's
/// work `story` (a sha) in: every path `keep` covers is the tip's; a conflicting file gets the
/// merge with git's markers (`<<<<<<< run branch`, `=======`, `>>>>>>> <story_id>`), or, for a
/// modify/delete conflict, the changed side's content. The result is committed on the tip and
/// checked out (HEAD detached there, a clean index).
///
/// # Errors
/// [`GitError::UnknownRevision`] when HEAD or `story` is not a commit; [`GitError::Git`].
pub fn prepare(
    wt: &Repo,
    story: &str,
    story_id: &str,
    keep: &[&str],
) -> Result<Prepared, GitError> {
    let tip = wt.head_commit()?.ok_or_else(|| GitError::UnknownRevision {
        rev: "HEAD".to_owned(),
    })?;
    let story = wt.resolve_commit(story)?;
    let repo = &wt.repo;
    let base = repo
        .merge_base(tip.id(), story.id())
        .map_err(op("find the merge base"))?;
    let base_tree = repo
        .find_commit(base)
        .and_then(|c| c.tree())
        .map_err(op("read tree"))?;
    let tip_tree = tip.tree().map_err(op("read tree"))?;
    let story_tree = story.tree().map_err(op("read tree"))?;
    let mut index = repo
        .merge_trees(&base_tree, &tip_tree, &story_tree, None)
        .map_err(op("merge"))?;
    let files = real_conflicts(&index, keep)?;
    take_from_tip(wt, &mut index, &tip_tree, keep)?;
    let mut written = Vec::new();
    let mut modify_delete = Vec::new();
    let empty = repo.blob(b"").map_err(op("write blob"))?;
    for conflict in index.conflicts().map_err(op("read conflicts"))?.flatten() {
        let (ours, theirs) = (conflict.our, conflict.their);
        let path = [&ours, &theirs, &conflict.ancestor]
            .into_iter()
            .flatten()
            .map(|e| e.path.clone())
            .next()
            .unwrap_or_default();
        let entry = match (ours, theirs) {
            (Some(ours), Some(theirs)) => {
                let ancestor = conflict.ancestor.unwrap_or_else(|| IndexEntry {
                    ctime: ours.ctime,
                    mtime: ours.mtime,
                    dev: 0,
                    ino: 0,
                    mode: ours.mode,
                    uid: 0,
                    gid: 0,
                    file_size: 0,
                    id: empty,
                    flags: 0,
                    flags_extended: 0,
                    path: ours.path.clone(),
                });
                let mut opts = MergeFileOptions::new();
                opts.our_label("run branch").their_label(story_id);
                let merged = repo
                    .merge_file_from_index(&ancestor, &ours, &theirs, Some(&mut opts))
                    .map_err(op("merge a file"))?;
                let id = repo.blob(merged.content()).map_err(op("write blob"))?;
                IndexEntry {
                    id,
                    file_size: merged.content().len() as u32,
                    flags: 0,
                    ..ours
                }
            }
            (Some(side), None) | (None, Some(side)) => {
                modify_delete.push(String::from_utf8_lossy(&path).into_owned());
                IndexEntry { flags: 0, ..side }
            }
            (None, None) => continue,
        };
        written.push((path, entry));
    }
    for (path, mut entry) in written {
        let _ = index.conflict_remove(Path::new(&*String::from_utf8_lossy(&path)));
        entry.path = path;
        index.add(&entry).map_err(op("build index"))?;
    }
    let tree_id = index.write_tree_to(repo).map_err(op("write tree"))?;
    let tree = repo.find_tree(tree_id).map_err(op("read tree"))?;
    let config = repo.config().map_err(op("read config"))?;
    let env = |key: &str| std::env::var(key).ok();
    let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
    let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
    let message = commit_message(
        &format!("{START_SUBJECT}{story_id} to resolve (git's markers in the files)"),
        &format!(
            "The run branch's tip {} with the story's work {} merged in; conflicting: {}. This commit never lands.",
            tip.id(),
            story.id(),
            files.join(", ")
        ),
        &[],
    );
    let start = repo
        .commit(None, &author, &committer, &message, &tree, &[&tip])
        .map_err(op("commit"))?;
    // A fresh worktree of ralph's: nothing in it is anyone's work yet.
    let mut checkout = CheckoutBuilder::new();
    checkout.force();
    repo.checkout_tree(tree.as_object(), Some(&mut checkout))
        .map_err(op("checkout"))?;
    repo.set_head_detached(start).map_err(op("move HEAD"))?;
    modify_delete.sort();
    modify_delete.dedup();
    Ok(Prepared {
        base: base.to_string(),
        start: start.to_string(),
        files,
        modify_delete,
    })
}

/// The two sides of a conflict on `files` between the run branch's `tip` and the story's work
/// at `wt`'s HEAD, for the resolution's prompt: (the tip's, the story's), each its commit
/// subjects since the merge base and a few changed lines per file (as a conflicting story's
/// next prompt shows them).
///
/// # Errors
/// [`GitError`] reading the commits or trees.
pub fn sides(wt: &Repo, tip: &str, files: &[String]) -> Result<(String, String), GitError> {
    let story = wt.head_commit()?.ok_or_else(|| GitError::UnknownRevision {
        rev: "HEAD".to_owned(),
    })?;
    let tip = wt.resolve_commit(tip)?;
    let base = wt
        .repo
        .merge_base(story.id(), tip.id())
        .map_err(op("find the merge base"))?;
    let base_tree = wt
        .repo
        .find_commit(base)
        .and_then(|c| c.tree())
        .map_err(op("read tree"))?;
    let base = base.to_string();
    let ours = side_summary(wt, Some(&base), &tip, &base_tree, files)?;
    let theirs = side_summary(wt, Some(&base), &story, &base_tree, files)?;
    Ok((ours, theirs))
}

/// Subject prefix of the commit [`prepare`] makes (never landed).
const START_SUBJECT: &str = "ralph: the conflict of ";

/// Whether commit `sha` is (or descends, along first parents, within 64 commits, from) the
/// commit with the markers that [`prepare`] made: work of a resolution iteration, which a
/// story's next attempt must not start from (a killed ralph's recovery keeps it under a
/// salvage ref like any interrupted work). `false` when `sha` cannot be read.
pub fn holds_markers_commit(wt: &Repo, sha: &str) -> bool {
    let Ok(mut commit) = wt.resolve_commit(sha) else {
        return false;
    };
    for _ in 0..64 {
        let message = commit.message().unwrap_or_default();
        if message.starts_with(START_SUBJECT) && message.contains("This commit never lands.") {
            return true;
        }
        match commit.parent(0) {
            Ok(parent) => commit = parent,
            Err(_) => return false,
        }
    }
    false
}

/// What the agent's result is, for [`judge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Files the result changes since the merge base (ralph's own files left out).
    pub changed: Vec<String>,
    /// Files the tip or the story changed since the merge base.
    pub touched: BTreeSet<String>,
    /// Files holding more conflict-marker lines than the tip's and the story's versions do.
    pub markers: Vec<String>,
    /// Each modify/delete path, with whether the result keeps it.
    pub modify_delete: Vec<(String, bool)>,
    /// The messages of the commits the agent made in the resolution (start..result).
    pub messages: String,
}

/// Reads [`Facts`] of `result` (a commit in `wt`, descending from `p.start`) against the tip
/// `tip` and the story's work `story`; paths `keep` covers are left out.
///
/// # Errors
/// [`GitError`] reading commits, trees or blobs.
pub fn facts(
    wt: &Repo,
    p: &Prepared,
    (tip, story, result): (&str, &str, &str),
    keep: &[&str],
) -> Result<Facts, GitError> {
    let own =
        |v: Vec<String>| -> Vec<String> { v.into_iter().filter(|f| !covered(f, keep)).collect() };
    let changed = own(super::files_between(wt, &p.base, result)?);
    let mut touched: BTreeSet<String> = own(super::files_between(wt, &p.base, tip)?)
        .into_iter()
        .collect();
    touched.extend(own(super::files_between(wt, &p.base, story)?));
    let mut looked: BTreeSet<&String> = changed.iter().collect();
    looked.extend(p.files.iter());
    let mut markers = Vec::new();
    for path in looked {
        let count = |rev: &str| marker_lines(&blob_of(wt, rev, path).unwrap_or_default());
        let now = count(result);
        if now > count(tip).max(count(story)) {
            markers.push(path.clone());
        }
    }
    let modify_delete = p
        .modify_delete
        .iter()
        .map(|f| (f.clone(), blob_of(wt, result, f).is_some()))
        .collect();
    let mut messages = String::new();
    let mut walk = wt.repo.revwalk().map_err(op("walk history"))?;
    walk.push(Oid::from_str(result).map_err(op("read sha"))?)
        .map_err(op("walk history"))?;
    walk.hide(Oid::from_str(&p.start).map_err(op("read sha"))?)
        .map_err(op("walk history"))?;
    for oid in walk.flatten() {
        if let Ok(commit) = wt.repo.find_commit(oid) {
            messages.push_str(commit.message().unwrap_or_default());
            messages.push('\n');
        }
    }
    Ok(Facts {
        changed,
        touched,
        markers,
        modify_delete,
        messages,
    })
}

/// The content of `path` at commit `rev` (`None`: absent, or not a file).
fn blob_of(wt: &Repo, rev: &str, path: &str) -> Option<Vec<u8>> {
    let tree = wt.resolve_commit(rev).ok()?.tree().ok()?;
    let entry = tree.get_path(Path::new(path)).ok()?;
    let blob = wt.repo.find_blob(entry.id()).ok()?;
    Some(blob.content().to_vec())
}

/// Lines of `content` that are conflict markers: starting with `<<<<<<<` or `>>>>>>>`, or
/// exactly `=======`; 0 for binary content (a NUL byte).
pub fn marker_lines(content: &[u8]) -> usize {
    if content.contains(&0) {
        return 0;
    }
    content
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| l.starts_with(b"<<<<<<<") || l.starts_with(b">>>>>>>") || *l == b"=======")
        .count()
}

/// Why a resolution is refused, one sentence per broken rule (empty: accepted). The rules:
/// no file holds more conflict markers than both sides had; every modify/delete path is named
/// in a commit message line `Resolved <path>: kept` or `Resolved <path>: deleted` that matches
/// the result; no file changed that neither side changed since the merge base. (The story's
/// check is the caller's: it runs code.)
pub fn judge(f: &Facts) -> Vec<String> {
    let mut refusals = Vec::new();
    if !f.markers.is_empty() {
        refusals.push(format!(
            "conflict markers remain in {}",
            f.markers.join(", ")
        ));
    }
    for (path, kept) in &f.modify_delete {
        let said = |how: &str| {
            f.messages.lines().any(|l| {
                l.trim()
                    .eq_ignore_ascii_case(&format!("Resolved {path}: {how}"))
            })
        };
        let how = if *kept { "kept" } else { "deleted" };
        if !said(how) {
            refusals.push(format!(
                "the modify/delete conflict on {path} was resolved silently (the file is {how}; a commit message line `Resolved {path}: {how}` says so)"
            ));
        }
    }
    let untouched: Vec<&str> = f
        .changed
        .iter()
        .filter(|p| !f.touched.contains(*p))
        .map(String::as_str)
        .collect();
    if !untouched.is_empty() {
        refusals.push(format!(
            "it changed files neither side touched: {}",
            untouched.join(", ")
        ));
    }
    refusals
}

/// Makes the accepted resolution `result` a merge commit of `tip` (first parent) and the
/// story's work `story`, with `result`'s tree, and moves `wt`'s HEAD (detached) to it; the
/// files and the index already hold that tree. Returns its sha.
///
/// # Errors
/// [`GitError`] reading the commits or committing.
pub fn merge_commit(
    wt: &Repo,
    (tip, story, result): (&str, &str, &str),
    subject: &str,
    body: &str,
) -> Result<String, GitError> {
    let repo = &wt.repo;
    let tree = wt.resolve_commit(result)?.tree().map_err(op("read tree"))?;
    let tip = wt.resolve_commit(tip)?;
    let story = wt.resolve_commit(story)?;
    let config = repo.config().map_err(op("read config"))?;
    let env = |key: &str| std::env::var(key).ok();
    let author = identity(&config, &env, "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL")?;
    let committer = identity(&config, &env, "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")?;
    let message = commit_message(subject, body, &[]);
    let merged = repo
        .commit(None, &author, &committer, &message, &tree, &[&tip, &story])
        .map_err(op("commit"))?;
    repo.set_head_detached(merged).map_err(op("move HEAD"))?;
    Ok(merged.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> Facts {
        Facts {
            changed: vec!["a.txt".into()],
            touched: ["a.txt".to_string(), "b.txt".to_string()]
                .into_iter()
                .collect(),
            ..Facts::default()
        }
    }

    #[test]
    fn a_clean_resolution_is_accepted() {
        assert!(judge(&clean()).is_empty());
    }

    #[test]
    fn each_rule_refuses_with_its_reason() {
        let mut f = clean();
        f.markers = vec!["a.txt".into()];
        assert!(judge(&f)[0].contains("conflict markers remain in a.txt"));
        let mut f = clean();
        f.changed.push("c.txt".into());
        assert!(judge(&f)[0].contains("neither side touched: c.txt"));
        let mut f = clean();
        f.modify_delete = vec![("b.txt".into(), false)];
        assert!(judge(&f)[0].contains("resolved silently"));
        f.messages = "fix\n\nResolved b.txt: kept\n".into();
        assert!(
            !judge(&f).is_empty(),
            "a note that does not match the result"
        );
        f.messages = "fix\n\nResolved b.txt: deleted\n".into();
        assert!(judge(&f).is_empty());
    }

    /// A repository at `root` where the tip and the story changed `shared.txt`'s one line:
    /// (tip, story), HEAD detached at the tip.
    fn two_sides(root: &Path) -> (String, String) {
        let git = |args: &[&str]| crate::git::tests::git(root, args).trim().to_owned();
        git(&["init", "-q"]);
        git(&["config", "user.name", "t"]);
        git(&["config", "user.email", "t@example.com"]);
        std::fs::write(root.join("shared.txt"), "original\n").unwrap();
        std::fs::write(root.join("other.txt"), "nobody's\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "base"]);
        let base = git(&["rev-parse", "HEAD"]);
        std::fs::write(root.join("shared.txt"), "A\n").unwrap();
        git(&["commit", "-qam", "A"]);
        let tip = git(&["rev-parse", "HEAD"]);
        git(&["checkout", "-q", "--detach", &base]);
        std::fs::write(root.join("shared.txt"), "B\n").unwrap();
        git(&["commit", "-qam", "B"]);
        let story = git(&["rev-parse", "HEAD"]);
        git(&["checkout", "-q", "--detach", &tip]);
        (tip, story)
    }

    #[test]
    fn prepare_leaves_the_markers_in_a_commit_on_the_tip_and_facts_read_the_result() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (tip, story) = two_sides(root);
        let wt = Repo::discover(root).unwrap();
        let p = prepare(&wt, &story, "US-002", &[]).unwrap();
        assert_eq!(p.files, ["shared.txt"]);
        assert!(p.modify_delete.is_empty());
        let text = std::fs::read_to_string(root.join("shared.txt")).unwrap();
        assert!(
            text.starts_with("<<<<<<< run branch\nA\n=======\nB\n>>>>>>> US-002"),
            "{text}"
        );
        assert_eq!(crate::git::tests::git(root, &["status", "--porcelain"]), "");
        assert_eq!(wt.head_sha().unwrap().as_deref(), Some(p.start.as_str()));
        assert!(holds_markers_commit(&wt, &p.start));
        assert!(!holds_markers_commit(&wt, &tip));
        // Left as it is: the markers are found.
        let f = super::facts(&wt, &p, (&tip, &story, &p.start), &[]).unwrap();
        assert_eq!(f.markers, ["shared.txt"]);
        // Resolved, and another file changed too.
        std::fs::write(root.join("shared.txt"), "A\nB\n").unwrap();
        std::fs::write(root.join("other.txt"), "mine\n").unwrap();
        crate::git::tests::git(root, &["commit", "-qam", "resolve"]);
        let result = wt.head_sha().unwrap().unwrap();
        let f = super::facts(&wt, &p, (&tip, &story, &result), &[]).unwrap();
        assert!(f.markers.is_empty(), "{f:?}");
        assert!(holds_markers_commit(&wt, &result));
        assert_eq!(
            judge(&f),
            ["it changed files neither side touched: other.txt"]
        );
        let merged = merge_commit(&wt, (&tip, &story, &result), "s", "b").unwrap();
        let parents = crate::git::tests::git(root, &["rev-list", "--parents", "-n1", &merged]);
        assert_eq!(parents.trim(), format!("{merged} {tip} {story}"));
    }

    #[test]
    fn marker_lines_are_counted() {
        assert_eq!(marker_lines(b"<<<<<<< a\nx\n=======\ny\n>>>>>>> b\n"), 3);
        assert_eq!(marker_lines(b"======== not\n= ======\n"), 0);
        assert_eq!(marker_lines(b"<<<<<<<\0"), 0);
    }
}
