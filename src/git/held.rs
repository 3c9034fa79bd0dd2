//! The user's uncommitted edits to ralph's own files (prd.json, progress.txt) when a
//! `--parallel --allow-dirty` run starts: held out of every commit ralph makes of those files.
//!
//! A parallel run commits prd.json and progress.txt itself (the start, each landing). When the
//! user had uncommitted edits to them, the commit takes ralph's change (a pass, notes, a
//! progress entry) and leaves the user's edit out: the committed content is the working file
//! with the user's edit taken back off (a line-level three-way merge: base = the file as the
//! user left it at the start, ours = the working file now, theirs = the file as committed at the
//! start). The working file keeps both. When the two overlap on a line, nothing is held (the
//! commit takes the working file, as before) and a warning says so.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One held edit: the file as HEAD had it and as the working tree had it when the run started.
#[derive(Debug, Clone)]
pub struct HeldEdit {
    /// The repository's root (as given; compared canonicalized).
    pub root: PathBuf,
    /// The file, relative to the root, `/`-separated.
    pub path: String,
    /// Its content at HEAD when the run started.
    pub committed: Vec<u8>,
    /// Its content in the working tree when the run started (the user's edit in it).
    pub working: Vec<u8>,
}

static HELD: Mutex<Vec<HeldEdit>> = Mutex::new(Vec::new());

fn same_root(a: &Path, b: &Path) -> bool {
    a == b || (a.canonicalize().ok().is_some() && a.canonicalize().ok() == b.canonicalize().ok())
}

/// Holds `edit` out of this process's later commits of its file (replacing an earlier hold of
/// the same file).
pub fn hold(edit: HeldEdit) {
    if let Ok(mut held) = HELD.lock() {
        held.retain(|h| !(h.path == edit.path && same_root(&h.root, &edit.root)));
        held.push(edit);
    }
}

fn held(root: &Path, path: &str) -> Option<HeldEdit> {
    HELD.lock()
        .ok()?
        .iter()
        .find(|h| h.path == path && same_root(&h.root, root))
        .cloned()
}

/// Whether `path` under `root` has a held edit.
pub fn is_held(root: &Path, path: &str) -> bool {
    held(root, path).is_some()
}

/// What to commit of `path` whose working content is `working`: the content with the user's
/// held edit taken off. `None` when nothing is held for it, or the edit cannot be taken off
/// (it overlaps a later change: the caller commits `working`).
pub fn without_held(root: &Path, path: &str, working: &[u8]) -> Option<Vec<u8>> {
    let h = held(root, path)?;
    merge3(&h.working, working, &h.committed)
}

/// `committed` (a commit's content of `path`) with the user's held edit applied on top: what the
/// working file is expected to hold. `None` when nothing is held or the edit does not apply.
pub fn with_held(root: &Path, path: &str, committed: &[u8]) -> Option<Vec<u8>> {
    let h = held(root, path)?;
    merge3(&h.committed, committed, &h.working)
}

/// One change of a side against the base: base lines `start..end` become `lines`.
struct Change<'a> {
    start: usize,
    end: usize,
    lines: Vec<&'a [u8]>,
}

fn lines(text: &[u8]) -> Vec<&[u8]> {
    text.split_inclusive(|b| *b == b'\n').collect()
}

/// The changes from `base` to `side` (a zero-context line diff).
fn changes<'a>(base: &[u8], side: &'a [u8]) -> Option<Vec<Change<'a>>> {
    let mut opts = git2::DiffOptions::new();
    opts.context_lines(0);
    let patch = git2::Patch::from_buffers(base, None, side, None, Some(&mut opts)).ok()?;
    let side_lines = lines(side);
    let mut out = Vec::new();
    for i in 0..patch.num_hunks() {
        let (hunk, _) = patch.hunk(i).ok()?;
        let (old_start, old_n) = (hunk.old_start() as usize, hunk.old_lines() as usize);
        let (new_start, new_n) = (hunk.new_start() as usize, hunk.new_lines() as usize);
        // Zero lines: the position is the line after which the change goes (1-based).
        let start = if old_n == 0 { old_start } else { old_start - 1 };
        let from = if new_n == 0 { 0 } else { new_start - 1 };
        out.push(Change {
            start,
            end: start + old_n,
            lines: side_lines.get(from..from + new_n)?.to_vec(),
        });
    }
    Some(out)
}

/// A line-level three-way merge: `base` with the changes of `a` and of `b`; `None` when a change
/// of one overlaps one of the other (an insertion next to the other's lines is no overlap; two
/// insertions at one place: `b`'s, then `a`'s).
pub fn merge3(base: &[u8], a: &[u8], b: &[u8]) -> Option<Vec<u8>> {
    let base_lines = lines(base);
    // `b`'s first: of two insertions at one place, `b`'s goes first (the user's lines at the
    // start come before the entries ralph appended since).
    let mut all = changes(base, b)?;
    all.extend(changes(base, a)?);
    all.sort_by_key(|c| (c.start, c.end));
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let mut pos = 0;
    for c in &all {
        if c.start < pos || c.end > base_lines.len() {
            return None;
        }
        for l in &base_lines[pos..c.start] {
            out.extend_from_slice(l);
        }
        for l in &c.lines {
            out.extend_from_slice(l);
        }
        pos = c.end;
    }
    for l in &base_lines[pos..] {
        out.extend_from_slice(l);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::merge3;

    #[test]
    fn an_edit_and_an_append_merge() {
        let base = b"# progress\nuser line\n";
        let ours = b"# progress\nuser line\nentry 1\n";
        let theirs = b"# progress\n";
        assert_eq!(
            merge3(base, ours, theirs).as_deref(),
            Some(&b"# progress\nentry 1\n"[..])
        );
        // And the other way: the user's line on top of a later commit.
        assert_eq!(
            merge3(theirs, b"# progress\nentry 1\n", base).as_deref(),
            Some(&b"# progress\nuser line\nentry 1\n"[..])
        );
    }

    #[test]
    fn separate_lines_merge_and_overlapping_ones_do_not() {
        let base = b"a\nb\nc\nd\n";
        assert_eq!(
            merge3(base, b"A\nb\nc\nd\n", b"a\nb\nc\nD\n").as_deref(),
            Some(&b"A\nb\nc\nD\n"[..])
        );
        assert_eq!(merge3(base, b"a\nB\nc\nd\n", b"a\nX\nc\nd\n"), None);
    }
}
