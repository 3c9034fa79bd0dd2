//! Putting ralph's trail back after an agent rewrote the branch's history (`git reset --hard
//! HEAD~1`, a rebase, an amended checkpoint): the branch returns to the iteration's start, the
//! agent's work is re-applied on top of it, and what the agent left is kept under a reference.

use git2::{build::CheckoutBuilder, FileFavor, Index, IndexEntry, MergeOptions, Oid};

use super::{op, GitError, Repo};

/// What [`Repo::restore_history`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// HEAD as the agent left it (full sha), kept under the reference the caller named.
    pub agent_head: String,
    /// Files where both sides changed the same lines, or one deleted what the other changed:
    /// they hold the agent's version (absent when the agent deleted them). Files for which
    /// `union` is true keep both sides' lines and are not listed. Sorted.
    pub conflicts: Vec<String>,
}

/// The stage bits of an index entry's flags (0 for a merged entry, 1-3 for a conflict's sides).
const STAGE_MASK: u16 = 0x3000;

impl Repo {
    /// Undoes an agent's rewrite of history while keeping its work. When HEAD no longer
    /// contains `start` (the iteration's start, a sha), this:
    /// 1. points reference `keep_as` (a full name such as `refs/ralph/<run>/<n>/rewritten`) at
    ///    HEAD as the agent left it, so its commits stay reachable;
    /// 2. stages the working tree (as [`Repo::checkpoint`] would) and merges the agent's changes
    ///    since the common ancestor of `start` and its HEAD onto `start`'s tree (a three-way
    ///    merge; conflicting hunks take the agent's side, except in files for which
    ///    `union(path)` is true, append-only notes such as progress.txt, which keep both sides'
    ///    lines);
    /// 3. writes that tree to the index and the working tree (ignored files untouched), and
    ///    moves the checked-out branch (or a detached HEAD) back to `start`; with `onto` (a
    ///    local branch name: the agent switched away from it), that branch is moved to `start`
    ///    and checked out instead, and the branch the agent left HEAD on stays as it is.
    ///
    /// The next [`Repo::checkpoint`] then commits the agent's work on top of `start`.
    ///
    /// # Errors
    /// [`GitError::UnknownRevision`] when `start` is not a commit; [`GitError::Conflicted`] when
    /// the index has unresolved conflicts; [`GitError::Git`] for an unborn HEAD or a failed
    /// merge, checkout or reference write. Nothing is moved when the merge fails.
    pub fn restore_history(
        &self,
        start: &str,
        keep_as: &str,
        onto: Option<&str>,
        union: &dyn Fn(&str) -> bool,
    ) -> Result<Restored, GitError> {
        let Some(agent_head) = self.head_commit()? else {
            return Err(GitError::UnknownRevision {
                rev: "HEAD".to_owned(),
            });
        };
        let agent_head = agent_head.id();
        self.set_ref(keep_as, &agent_head.to_string())?;
        let start = self.resolve_commit(start)?;
        let (theirs_id, _, _) = self.stage_walk(&[])?;
        let theirs = self.repo.find_tree(theirs_id).map_err(op("read tree"))?;
        let ours = start.tree().map_err(op("read tree"))?;
        let base = match self.repo.merge_base(start.id(), agent_head) {
            Ok(oid) => self
                .repo
                .find_commit(oid)
                .and_then(|c| c.tree())
                .map_err(op("read tree"))?,
            Err(_) => {
                let empty = self
                    .repo
                    .treebuilder(None)
                    .and_then(|b| b.write())
                    .map_err(op("write tree"))?;
                self.repo.find_tree(empty).map_err(op("read tree"))?
            }
        };
        let merge = |favor: FileFavor| {
            let mut opts = MergeOptions::new();
            opts.file_favor(favor);
            self.repo
                .merge_trees(&base, &ours, &theirs, Some(&opts))
                .map_err(op("merge"))
        };
        // Where both sides changed the same lines (or one deleted what the other changed): named
        // in the result, whichever side the merges below then keep.
        let plain = merge(FileFavor::Normal)?;
        let mut conflicts = Vec::new();
        for conflict in plain.conflicts().map_err(op("merge"))? {
            let conflict = conflict.map_err(op("merge"))?;
            let path = [&conflict.their, &conflict.our, &conflict.ancestor]
                .into_iter()
                .flatten()
                .next()
                .map(|e| String::from_utf8_lossy(&e.path).into_owned());
            // Notes files keep both sides' lines: nothing of either side is lost there.
            conflicts.extend(path.filter(|p| !union(p)));
        }
        let agent_side = merge(FileFavor::Theirs)?;
        let both_sides = merge(FileFavor::Union)?;
        let mut merged = Index::new().map_err(op("merge"))?;
        for (index, keep) in [(&agent_side, false), (&both_sides, true)] {
            let wanted = |e: &IndexEntry| union(&String::from_utf8_lossy(&e.path)) == keep;
            for entry in index.iter() {
                if entry.flags & STAGE_MASK == 0 && wanted(&entry) {
                    merged.add(&entry).map_err(op("merge"))?;
                }
            }
            for conflict in index.conflicts().map_err(op("merge"))? {
                let conflict = conflict.map_err(op("merge"))?;
                let path = [&conflict.their, &conflict.our, &conflict.ancestor]
                    .into_iter()
                    .flatten()
                    .next()
                    .map(|e| String::from_utf8_lossy(&e.path).into_owned());
                if path.is_none_or(|p| union(&p) != keep) {
                    continue;
                }
                if let Some(mut theirs) = conflict.their {
                    theirs.flags &= !STAGE_MASK;
                    merged.add(&theirs).map_err(op("merge"))?;
                }
            }
        }
        conflicts.sort();
        conflicts.dedup();
        let tree_id: Oid = merged.write_tree_to(&self.repo).map_err(op("merge"))?;
        let tree = self.repo.find_tree(tree_id).map_err(op("read tree"))?;
        let mut checkout = CheckoutBuilder::new();
        checkout.force();
        self.repo
            .checkout_tree(tree.as_object(), Some(&mut checkout))
            .map_err(op("check out the restored tree"))?;
        // The checkout removes what HEAD had and the tree has not; files the agent created and
        // the merge dropped are removed here (they are in the kept history).
        let dropped = self
            .repo
            .diff_tree_to_tree(Some(&theirs), Some(&tree), None)
            .map_err(op("diff"))?;
        for delta in dropped.deltas() {
            if delta.status() == git2::Delta::Deleted {
                if let Some(path) = delta.old_file().path() {
                    let _ = std::fs::remove_file(self.root.join(path));
                }
            }
        }
        let mut index = self.repo.index().map_err(op("read index"))?;
        index.read_tree(&tree).map_err(op("write index"))?;
        index.write().map_err(op("write index"))?;
        let message = "ralph: put back the iteration's start after the agent rewrote history";
        if let Some(branch) = onto {
            let refname = format!("refs/heads/{branch}");
            self.repo
                .reference(&refname, start.id(), true, message)
                .map_err(op("move the branch back"))?;
            self.repo
                .set_head(&refname)
                .map_err(op("switch HEAD back"))?;
            return Ok(Restored {
                agent_head: agent_head.to_string(),
                conflicts,
            });
        }
        let head = self.repo.head().map_err(op("read HEAD"))?;
        match head.name().filter(|_| head.is_branch()) {
            Some(branch) => {
                self.repo
                    .reference(branch, start.id(), true, message)
                    .map_err(op("move the branch back"))?;
            }
            None => self
                .repo
                .set_head_detached(start.id())
                .map_err(op("move HEAD back"))?,
        }
        Ok(Restored {
            agent_head: agent_head.to_string(),
            conflicts,
        })
    }
}
