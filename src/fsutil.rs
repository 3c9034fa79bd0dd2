//! Crash-safe file replacement, the one way ralph rewrites a file it or the user owns
//! (prd.json, progress.txt, state.json, the prompt copies, `.ralph/.gitignore`, …).
//!
//! [`write_atomic`] writes a temporary file in the same directory, gives it the mode of the file
//! it replaces (so a user's 0644 prd.json stays 0644; a new file gets 0644 minus the umask, like
//! any file a program creates), fsyncs it, renames it over the target and fsyncs the directory,
//! so that after a crash the target holds either the old or the new bytes, never a mix, and a
//! completed write survives a power loss.

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
    tmp.as_file().sync_all().map_err(named)?;
    tmp.persist(path).map_err(|e| named(e.error))?;
    Ok(())
}

/// The process's umask, from `/proc/self/status` (Linux 4.7+; race-free, unlike setting and
/// restoring it); 0o022 when it cannot be read.
fn current_umask() -> u32 {
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
    fn an_unwritable_directory_is_an_error_naming_the_file() {
        let err = write_atomic(Path::new("/nonexistent-dir/x.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x.json"), "{err}");
    }
}
