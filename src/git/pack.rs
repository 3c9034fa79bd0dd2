//! Housekeeping of the repository a long run writes to: ralph's loose refs into `packed-refs`,
//! and the loose objects this run wrote into one pack (issue 13, P3 and P5), every
//! [`crate::run::iteration::commit::PACK_REFS_EVERY`] iterations and at the end of a run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{op, GitError, Repo};

/// Most loose objects [`Repo::housekeeping`] packs at once: past that, packing is left to `git gc`
/// (a repository that large was filled by something else than ralph's checkpoints).
pub const MAX_LOOSE_TO_PACK: usize = 20_000;

/// Up to `limit` loose objects under `objects` (`<xx>/<38 hex>` files), with their paths.
fn loose_objects(objects: &Path, limit: usize) -> Vec<(git2::Oid, PathBuf)> {
    let mut found = Vec::new();
    let Ok(dirs) = std::fs::read_dir(objects) else {
        return found;
    };
    for dir in dirs.flatten() {
        let prefix = dir.file_name();
        let Some(prefix) = prefix
            .to_str()
            .filter(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            continue;
        };
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name();
            let Some(rest) = name.to_str().filter(|r| r.len() == 38) else {
                continue;
            };
            if let Ok(oid) = git2::Oid::from_str(&format!("{prefix}{rest}")) {
                found.push((oid, file.path()));
                if found.len() >= limit {
                    return found;
                }
            }
        }
    }
    found
}

/// Removes the empty folders under `dir` (deepest first; `dir` itself too when it ends up empty).
/// Best effort: a folder that cannot be read or removed is left.
fn remove_empty_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty_dirs(&entry.path());
        }
    }
    // Fails, as it should, when something is still inside.
    let _ = std::fs::remove_dir(dir);
}

/// Packs the references of the repository whose git directory is `git_dir` (libgit2's
/// `git_refdb_compress`, which `git2` does not wrap).
fn pack_refs_at(git_dir: &Path) -> Result<(), GitError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    let failed = |what: &str| GitError::Git {
        op: "pack references",
        source: git2::Error::from_str(&format!(
            "{what}: {}",
            git2::Error::last_error(-1).message()
        )),
    };
    let path = CString::new(git_dir.as_os_str().as_bytes())
        .map_err(|_| failed("the repository path holds a NUL byte"))?;
    libgit2_sys::init();
    // SAFETY: plain libgit2 calls on pointers it hands out; each object is freed exactly once,
    // on every path, and none escapes this function.
    unsafe {
        let mut repo: *mut libgit2_sys::git_repository = std::ptr::null_mut();
        if libgit2_sys::git_repository_open(&mut repo, path.as_ptr()) != 0 {
            return Err(failed("cannot reopen the repository"));
        }
        let mut refdb: *mut libgit2_sys::git_refdb = std::ptr::null_mut();
        let opened = libgit2_sys::git_repository_refdb(&mut refdb, repo);
        let packed = if opened == 0 {
            let rc = libgit2_sys::git_refdb_compress(refdb);
            libgit2_sys::git_refdb_free(refdb);
            rc
        } else {
            opened
        };
        libgit2_sys::git_repository_free(repo);
        if packed != 0 {
            return Err(failed("cannot pack the references"));
        }
    }
    // The folders of ralph's per-iteration refs are left empty (git pack-refs removes them too).
    remove_empty_dirs(&git_dir.join("refs").join("ralph"));
    Ok(())
}
impl Repo {
    /// Packs the repository's loose refs ([`Repo::pack_refs`]) and loose objects
    /// ([`Repo::pack_loose_objects`], at most [`MAX_LOOSE_TO_PACK`] of them): what ralph does
    /// every [`crate::run::iteration::commit::PACK_REFS_EVERY`] iterations and at the end of a
    /// run, so that a long night leaves a compact repository. Failures are returned as warnings
    /// (nothing is lost when packing fails: the loose files stay).
    pub fn housekeeping(&self) -> Vec<String> {
        self.housekeeping_until(None)
    }

    /// [`Repo::housekeeping`] that ends by `deadline` (after a stop signal, the share of
    /// `--shutdown-timeout` the end of a run gives it): packing the loose objects is skipped when
    /// the deadline has passed, and abandoned (the loose files all kept, with a warning) when it
    /// passes meanwhile. Refs are always packed: one short rewrite of `packed-refs`.
    pub fn housekeeping_until(&self, deadline: Option<Instant>) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Err(e) = self.pack_refs() {
            warnings.push(e.to_string());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            warnings.push(
                "the loose objects of this run were not packed: no time was left before the \
                 shutdown deadline (`git gc` packs them)"
                    .into(),
            );
            return warnings;
        }
        if let Err(e) = self.pack_loose_objects_until(MAX_LOOSE_TO_PACK, deadline) {
            warnings.push(e.to_string());
        }
        warnings
    }

    /// Moves the loose objects of the repository into one new pack with deltas between them
    /// (what `git repack -d` does for loose objects), and returns how many it packed. Each
    /// iteration's checkpoint adds loose objects, chief among them a whole new copy of
    /// progress.txt, deflated but not deltified; packed, successive copies cost about what was
    /// appended (issue 13, P5).
    ///
    /// Only loose objects written since this handle was opened (the run's start) are packed: a
    /// user's older loose objects are left to `git gc` and cost ralph nothing. The pack and its
    /// index are synced to disk before any loose file is removed, and only the objects written
    /// into the pack are removed, so neither a kill nor a power loss can lose one. Nothing is
    /// done when there are fewer than 2 or more than `max` such objects (so many are left to
    /// `git gc` too).
    ///
    /// # Errors
    /// [`GitError::Git`] when the pack cannot be built or written, or a file cannot be synced;
    /// the loose objects are then all still there.
    pub fn pack_loose_objects(&self, max: usize) -> Result<usize, GitError> {
        self.pack_loose_objects_until(max, None)
    }

    /// [`Repo::pack_loose_objects`], given up when `deadline` passes: before the pack is written
    /// the loose objects are all kept and [`GitError::Git`] says the deadline ran out. libgit2
    /// reports progress about every half second while it builds the pack, which is when the
    /// deadline is checked.
    ///
    /// # Errors
    /// As [`Repo::pack_loose_objects`], and when the deadline passes before the pack is written.
    pub fn pack_loose_objects_until(
        &self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, GitError> {
        let late = move || deadline.is_some_and(|d| Instant::now() >= d);
        let ran_out = || {
            GitError::Git {
            op: "pack objects",
            source: git2::Error::from_str(
                "stopped at the shutdown deadline; the loose objects are kept (`git gc` packs them)",
            ),
        }
        };
        let objects = self.repo.path().join("objects");
        // A second of slack: file times may be coarser than the clock.
        let since = self.opened_at - std::time::Duration::from_secs(1);
        let loose: Vec<_> = loose_objects(&objects, usize::MAX)
            .into_iter()
            .filter(|(_, path)| {
                std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= since)
            })
            .take(max + 1)
            .collect();
        if loose.len() < 2 || loose.len() > max {
            return Ok(0);
        }
        let io = |what: &'static str| {
            move |e: std::io::Error| GitError::Git {
                op: what,
                source: git2::Error::from_str(&e.to_string()),
            }
        };
        let mut pb = self.repo.packbuilder().map_err(op("pack objects"))?;
        pb.set_threads(1);
        if deadline.is_some() {
            // Returning false makes libgit2 abort the pack it is building.
            pb.set_progress_callback(move |_, _, _| !late())
                .map_err(op("pack objects"))?;
        }
        for (oid, _) in &loose {
            if late() {
                return Err(ran_out());
            }
            pb.insert_object(*oid, None).map_err(op("pack objects"))?;
        }
        let pack_dir = objects.join("pack");
        std::fs::create_dir_all(&pack_dir).map_err(io("pack objects"))?;
        if let Err(e) = pb.write(&pack_dir, 0o444) {
            // The progress callback's refusal reads as a user abort: say why.
            return Err(if late() {
                ran_out()
            } else {
                op("pack objects")(e)
            });
        }
        let name = pb
            .name()
            .ok_or_else(|| GitError::Git {
                op: "pack objects",
                source: git2::Error::from_str("libgit2 wrote a pack without a name"),
            })?
            .to_owned();
        for ext in ["pack", "idx"] {
            let file = pack_dir.join(format!("pack-{name}.{ext}"));
            std::fs::File::open(&file)
                .and_then(|f| f.sync_all())
                .map_err(io("sync the new pack"))?;
        }
        std::fs::File::open(&pack_dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync the new pack"))?;
        // Every object inserted is in the synced pack; only then do their loose files go.
        if pb.written() != loose.len() {
            return Err(GitError::Git {
                op: "pack objects",
                source: git2::Error::from_str(&format!(
                    "libgit2 wrote {} of {} objects into pack-{name}; the loose objects are kept",
                    pb.written(),
                    loose.len()
                )),
            });
        }
        let removed = loose
            .iter()
            .filter(|(_, path)| std::fs::remove_file(path).is_ok())
            .count();
        // Emptied fan-out folders go, as `git prune-packed` removes them.
        for (_, path) in &loose {
            if let Some(fan_out) = path.parent() {
                let _ = std::fs::remove_dir(fan_out);
            }
        }
        if let Ok(odb) = self.repo.odb() {
            let _ = odb.refresh();
        }
        Ok(removed)
    }

    /// Moves every loose reference into `packed-refs` (what `git pack-refs --all` does), so that
    /// the two refs ralph writes per iteration do not pile up as thousands of files that slow
    /// down every listing of references, ralph's and git's.
    ///
    /// # Errors
    /// [`GitError::Git`] when the repository cannot be reopened or the refs cannot be packed
    /// (e.g. another process holds `packed-refs.lock`); nothing is lost then, the refs stay loose.
    pub fn pack_refs(&self) -> Result<(), GitError> {
        pack_refs_at(self.repo.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::tests::git;

    #[test]
    fn packing_refs_keeps_every_ref_and_leaves_no_loose_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        git2::Repository::init(root).unwrap();
        let repo = Repo::discover(root).unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        let head = repo.commit_all("one", "", &[]).unwrap().unwrap();
        for n in 1..=3 {
            repo.set_ref(&format!("refs/ralph/run/{n}/start"), &head)
                .unwrap();
        }
        repo.pack_refs().unwrap();
        assert!(!root.join(".git/refs/ralph/run/1/start").exists());
        assert!(
            !root.join(".git/refs/ralph").exists(),
            "empty ref folders are removed"
        );
        let packed = std::fs::read_to_string(root.join(".git/packed-refs")).unwrap();
        assert!(packed.contains("refs/ralph/run/3/start"), "{packed}");
        let listed = git(
            root,
            &["for-each-ref", "--format=%(refname)", "refs/ralph/"],
        );
        assert_eq!(listed.lines().count(), 3, "{listed}");
        // A ref written after packing is loose again and wins over nothing.
        repo.set_ref("refs/ralph/run/4/start", &head).unwrap();
        assert_eq!(
            git(root, &["rev-parse", "refs/ralph/run/4/start"]).trim(),
            head
        );
    }

    #[test]
    fn packing_loose_objects_keeps_every_object_and_deltifies_a_growing_log() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        git2::Repository::init(root).unwrap();
        // A user's loose objects from before the run are left to git gc.
        std::fs::write(root.join("user.txt"), "the user's own work\n").unwrap();
        git(root, &["add", "user.txt"]);
        let user_blob = git(root, &["hash-object", "user.txt"]);
        let user_blob = user_blob.trim();
        std::thread::sleep(std::time::Duration::from_millis(1200));
        let repo = Repo::discover(root).unwrap();
        let mut log = String::new();
        let mut heads = Vec::new();
        for n in 0..40 {
            for k in 0..40 {
                log.push_str(&format!("entry {n}.{k}: the agent did {} things\n", n * k));
            }
            std::fs::write(root.join("progress.txt"), &log).unwrap();
            heads.push(
                repo.commit_all(&format!("iteration {n}"), "", &[])
                    .unwrap()
                    .unwrap(),
            );
        }
        let loose_bytes: u64 = loose_objects(&root.join(".git/objects"), usize::MAX)
            .iter()
            .map(|(_, p)| std::fs::metadata(p).unwrap().len())
            .sum();
        let packed = repo.pack_loose_objects(MAX_LOOSE_TO_PACK).unwrap();
        assert_eq!(packed, 120, "40 commits, trees and blobs");
        let left: Vec<_> = loose_objects(&root.join(".git/objects"), usize::MAX)
            .into_iter()
            .map(|(oid, _)| oid.to_string())
            .collect();
        assert_eq!(
            left,
            [user_blob],
            "only the user's older object stays loose"
        );
        let fan_out = std::fs::read_dir(root.join(".git/objects"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().len() == 2)
            .count();
        assert_eq!(fan_out, 1, "emptied fan-out folders are removed");
        let pack_bytes: u64 = std::fs::read_dir(root.join(".git/objects/pack"))
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert!(
            pack_bytes * 5 < loose_bytes,
            "pack {pack_bytes} B vs loose {loose_bytes} B: successive copies are not deltified"
        );
        // git itself reads every object and finds the repository sound.
        git(root, &["fsck", "--strict", "--no-dangling"]);
        assert_eq!(git(root, &["show", "HEAD:progress.txt"]), log);
        assert_eq!(git(root, &["rev-list", "--count", "HEAD"]).trim(), "40");
        // The handle that packed goes on working: a new commit, then packing again.
        std::fs::write(root.join("progress.txt"), format!("{log}one more\n")).unwrap();
        repo.commit_all("after", "", &[]).unwrap().unwrap();
        assert_eq!(repo.pack_loose_objects(MAX_LOOSE_TO_PACK).unwrap(), 3);
        git(root, &["fsck", "--strict", "--no-dangling"]);
        // Too many loose objects: left alone.
        std::fs::write(root.join("progress.txt"), "x").unwrap();
        repo.commit_all("x", "", &[]).unwrap().unwrap();
        assert_eq!(repo.pack_loose_objects(2).unwrap(), 0);
    }

    #[test]
    fn packing_after_the_shutdown_deadline_keeps_every_loose_object_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        git2::Repository::init(root).unwrap();
        let repo = Repo::discover(root).unwrap();
        for n in 0..5 {
            std::fs::write(root.join("progress.txt"), format!("entry {n}\n")).unwrap();
            repo.commit_all(&format!("iteration {n}"), "", &[])
                .unwrap()
                .unwrap();
        }
        let count = || loose_objects(&root.join(".git/objects"), usize::MAX).len();
        let before = count();
        assert!(before >= 10, "{before} loose objects");
        let past = Instant::now() - std::time::Duration::from_millis(1);
        let err = repo
            .pack_loose_objects_until(MAX_LOOSE_TO_PACK, Some(past))
            .expect_err("the deadline has passed");
        assert!(err.to_string().contains("shutdown deadline"), "{err}");
        assert_eq!(count(), before, "no loose object is removed");
        let warnings = repo.housekeeping_until(Some(past));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("shutdown deadline"), "{warnings:?}");
        assert_eq!(count(), before);
        // With time left, the same objects are packed.
        let later = Instant::now() + std::time::Duration::from_secs(60);
        assert_eq!(
            repo.pack_loose_objects_until(MAX_LOOSE_TO_PACK, Some(later))
                .unwrap(),
            before
        );
        git(root, &["fsck", "--strict", "--no-dangling"]);
    }
}
