//! Crash-safe file replacement, the one way ralph rewrites a file it or the user owns
//! (prd.json, progress.txt, state.json, the prompt copies, `.ralph/.gitignore`, …).
//!
//! [`write_atomic`] writes a temporary file in the same directory, gives it the mode of the file
//! it replaces (so a user's 0644 prd.json stays 0644; a new file gets 0644 minus the umask, like
//! any file a program creates), fsyncs it, renames it over the target and fsyncs the directory,
//! so that after a crash the target holds either the old or the new bytes, never a mix, and a
//! completed write survives a power loss.
//!
//! Two lighter variants exist for files written every iteration, chosen on purpose (see
//! `docs/durability.md`): [`replace`] skips the directory sync, and [`write_volatile`] skips
//! every sync. Both stay atomic against ralph being killed at any instant (the kernel's page
//! cache outlives the process); only a power loss or kernel crash can bring back the old file.

use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Replaces `path` with `bytes` atomically and durably, keeping the file's mode (see the module
/// docs).
///
/// # Errors
/// The I/O error of whichever step failed (creating the temporary file in `path`'s directory,
/// writing, syncing, renaming, syncing the directory); the target is unchanged unless the final
/// rename happened. The error message names `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes)?;
    // The rename is durable only once the directory entry is on disk.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))
}

/// [`write_atomic`] without the directory sync: atomic (old or new bytes, never a mix) and the
/// file's mode kept, but a power loss right after may bring back the old file. For files a later
/// commit makes durable anyway (the native loop's `write_file` and `edit_file` tools, whose
/// every write the iteration's checkpoint commits), where a directory sync per write would cost
/// milliseconds each.
///
/// # Errors
/// As [`write_atomic`].
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    swap_in(path, bytes, true)
}

/// Replaces `path` with `bytes` atomically (old or new bytes, never a mix, mode kept) without
/// any fsync: what ralph being SIGKILLed at any instant cannot tear, but a power loss may undo.
/// For state ralph can rebuild or re-derive: `.ralph/state.json` (from the ledger and git), the
/// prd.json snapshot and the prd memory (rewritten every iteration).
///
/// # Errors
/// As [`write_atomic`].
pub fn write_volatile(path: &Path, bytes: &[u8]) -> io::Result<()> {
    swap_in(path, bytes, false)
}

/// [`write_volatile`] unless `path` already holds exactly `bytes` (then nothing is written and
/// `false` is returned): a rewrite with the same content costs a read, not a new inode.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_volatile_if_changed(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    if let Ok(meta) = fs::metadata(path) {
        if meta.len() == bytes.len() as u64 && fs::read(path).is_ok_and(|old| old == bytes) {
            return Ok(false);
        }
    }
    write_volatile(path, bytes)?;
    Ok(true)
}

fn swap_in(path: &Path, bytes: &[u8], sync: bool) -> io::Result<()> {
    let named =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mode = match fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0o666 & !current_umask(),
        Err(e) => return Err(named(e)),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".ralph-tmp-")
        .tempfile_in(dir)
        .map_err(named)?;
    tmp.write_all(bytes).map_err(named)?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(named)?;
    if sync {
        tmp.as_file().sync_all().map_err(named)?;
    }
    tmp.persist(path).map_err(|e| named(e.error))?;
    Ok(())
}

/// The process's umask, from `/proc/self/status` (Linux 4.7+; race-free, unlike setting and
/// restoring it); 0o022 when it cannot be read.
fn current_umask() -> u32 {
    // Read once: ralph never changes its umask, and files are written every iteration.
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(read_umask)
}

fn read_umask() -> u32 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_mode_of_the_file_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prd.json");
        fs::write(&path, b"old").unwrap();
        for mode in [0o644, 0o600, 0o755] {
            fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
            write_atomic(&path, b"new").unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"new");
            let got = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, mode, "mode {mode:o} was changed to {got:o}");
        }
        // Nothing left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_new_file_gets_the_usual_mode_not_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.txt");
        write_atomic(&path, b"x").unwrap();
        let got = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, 0o666 & !current_umask());
    }

    #[test]
    fn volatile_writes_keep_the_mode_and_skip_unchanged_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        write_volatile(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let before = inode(&path);
        assert!(!write_volatile_if_changed(&path, b"new").unwrap());
        assert_eq!(inode(&path), before, "an unchanged file was rewritten");
        assert!(write_volatile_if_changed(&path, b"newer").unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"newer");
        let fresh = dir.path().join("fresh.json");
        assert!(write_volatile_if_changed(&fresh, b"x").unwrap());
        assert_eq!(fs::read(&fresh).unwrap(), b"x");
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_the_file() {
        let err = write_atomic(Path::new("/nonexistent-dir/x.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x.json"), "{err}");
    }
}
