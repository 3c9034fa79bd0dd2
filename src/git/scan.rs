//! What a range of commits added, line by line, for the secret scan after a checkpoint
//! ([`Repo::added_text`]).
//!
//! A line diff costs time in the size of the files, not of the change: a 40 MB prd.json whose
//! one `passes` changed took 0.35 s of xdiff, most of ralph's work after a Ctrl-C on a
//! 100,000-story PRD (issue 18, item 9). Files over [`LINE_DIFF_MAX_BYTES`] are therefore not
//! line-diffed: their common beginning and end are cut off (a byte comparison), and the lines of
//! what is left in the new version count as added. For an edit in place that is the edit's own
//! lines; for a file rewritten throughout it is the whole file, which is what a diff would say
//! of it too.

use super::{op, GitError, Repo};

/// Files larger than this (either side, in bytes) are compared by their common ends, not by a
/// line diff.
pub const LINE_DIFF_MAX_BYTES: u64 = 1 << 20;

impl Repo {
    /// The lines that commits `from`..`to` add, as a patch-shaped text: for each file a
    /// `+++ b/<path>` line, then its added lines, each with a leading `+` (no context, no
    /// removed lines). The text is cut after about `max_bytes` bytes. Binary files are left out.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when either is not a commit; [`GitError::Git`].
    pub fn added_text(&self, from: &str, to: &str, max_bytes: usize) -> Result<String, GitError> {
        let a = self.resolve_commit(from)?.tree().map_err(op("read tree"))?;
        let b = self.resolve_commit(to)?.tree().map_err(op("read tree"))?;
        let diff = self
            .repo
            .diff_tree_to_tree(Some(&a), Some(&b), None)
            .map_err(op("diff"))?;
        let mut text = String::new();
        for delta in diff.deltas() {
            if text.len() >= max_bytes {
                break;
            }
            let new = delta.new_file();
            if new.id().is_zero() {
                continue;
            }
            let path = new
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let new_blob = self.repo.find_blob(new.id()).map_err(op("read blob"))?;
            let old_blob = match delta.old_file().id() {
                id if id.is_zero() => None,
                id => Some(self.repo.find_blob(id).map_err(op("read blob"))?),
            };
            if new_blob.is_binary() || old_blob.as_ref().is_some_and(git2::Blob::is_binary) {
                continue;
            }
            let old = old_blob.as_ref().map_or(&[][..], git2::Blob::content);
            let added = if new_blob.size() as u64 > LINE_DIFF_MAX_BYTES
                || old.len() as u64 > LINE_DIFF_MAX_BYTES
            {
                changed_middle(old, new_blob.content())
                    .split(|b| *b == b'\n')
                    .map(|l| String::from_utf8_lossy(l).into_owned())
                    .collect()
            } else {
                line_diff_added(old, new_blob.content(), &path)?
            };
            if added.is_empty() {
                continue;
            }
            text.push_str("+++ b/");
            text.push_str(&path);
            text.push('\n');
            for line in added {
                if text.len() >= max_bytes {
                    break;
                }
                text.push('+');
                text.push_str(line.strip_suffix('\r').unwrap_or(&line));
                text.push('\n');
            }
        }
        Ok(text)
    }
}

/// The added lines of a line diff of `old` → `new` (both small).
fn line_diff_added(old: &[u8], new: &[u8], path: &str) -> Result<Vec<String>, GitError> {
    let mut added = Vec::new();
    let patch = git2::Patch::from_buffers(old, Some(path.as_ref()), new, Some(path.as_ref()), None)
        .map_err(op("diff"))?;
    for h in 0..patch.num_hunks() {
        let lines = patch.num_lines_in_hunk(h).map_err(op("diff"))?;
        for l in 0..lines {
            let line = patch.line_in_hunk(h, l).map_err(op("diff"))?;
            if line.origin() == '+' {
                let content = String::from_utf8_lossy(line.content());
                added.push(content.strip_suffix('\n').unwrap_or(&content).to_owned());
            }
        }
    }
    Ok(added)
}

/// The part of `new` that differs from `old` once their common beginning and common end are
/// cut off, widened to whole lines (empty when they are equal).
fn changed_middle<'a>(old: &[u8], new: &'a [u8]) -> &'a [u8] {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let max_suffix = old.len().min(new.len()) - prefix;
    let suffix = old
        .iter()
        .rev()
        .zip(new.iter().rev())
        .take(max_suffix)
        .take_while(|(a, b)| a == b)
        .count();
    let (start, end) = (prefix, new.len() - suffix);
    if start >= end {
        // Nothing new: equal, or only a deletion.
        return &[];
    }
    // Whole lines: back to the start of the first changed line, on to the end of the last.
    let start = new[..start.min(new.len())]
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let last = end - 1;
    let end = new[last..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(new.len(), |i| last + i);
    let middle = &new[start..end];
    middle.strip_suffix(b"\n").unwrap_or(middle)
}

#[cfg(test)]
mod tests {
    use super::{changed_middle, LINE_DIFF_MAX_BYTES};
    use crate::git::Repo;

    #[test]
    fn added_text_names_the_added_lines_of_small_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        git2::Repository::init(root).unwrap();
        let repo = Repo::discover(root).unwrap();
        let big: String = (0..(LINE_DIFF_MAX_BYTES / 20 + 10))
            .map(|i| format!("line {i:>12}\n"))
            .collect();
        std::fs::write(root.join("big.json"), &big).unwrap();
        std::fs::write(root.join("small.txt"), "one\ntwo\n").unwrap();
        std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
        let from = repo.checkpoint("one", "", &[]).unwrap().commit.unwrap();
        let edited = big.replacen("line            7\n", "line 7 TOKEN=abc\n", 1);
        std::fs::write(root.join("big.json"), edited).unwrap();
        std::fs::write(root.join("small.txt"), "one\nSECRET=x\ntwo\n").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        let to = repo.checkpoint("two", "", &[]).unwrap().commit.unwrap();
        let added = repo.added_text(&from, &to, 1 << 20).unwrap();
        assert_eq!(
            added,
            "+++ b/big.json\n+line 7 TOKEN=abc\n+++ b/small.txt\n+SECRET=x\n"
        );
        // Cut after the limit.
        assert!(repo.added_text(&from, &to, 10).unwrap().len() < 40);
    }

    #[test]
    fn the_changed_middle_is_the_edited_lines_whole() {
        let old = b"a\nbb: false\nc\n";
        let new = b"a\nbb: true\nc\n";
        assert_eq!(changed_middle(old, new), b"bb: true");
        assert_eq!(changed_middle(old, old), b"");
        // An insertion: the new line, whole.
        assert_eq!(changed_middle(b"a\nc\n", b"a\nKEY=1\nc\n"), b"KEY=1");
        // Appended at the end, with and without a final newline.
        assert_eq!(changed_middle(b"a\n", b"a\nz\n"), b"z");
        assert_eq!(changed_middle(b"a", b"az"), b"az");
        // A deletion adds nothing but the line it joins.
        assert_eq!(changed_middle(b"a\nx\nc\n", b"a\nc\n"), b"");
        // A new file: all of it.
        assert_eq!(changed_middle(b"", b"p\nq\n"), b"p\nq");
    }
}
