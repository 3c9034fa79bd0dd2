//! `archive/<date>-<branch>/`: keeping a finished feature's prd.json and progress.txt when the
//! user starts the next feature.
//!
//! The original Ralph (shared/notes/original-ralph.md §2.3, §2.5) archives at start-up when
//! `prd.json`'s `branchName` differs from the one it saw last, but it copies the *new* prd.json
//! (the old one is lost), creates nested folders for branch names containing `/`, silently
//! overwrites a same-day archive of the same branch, and skips everything when `jq` is missing.
//! This module fixes each of those:
//!
//! - [`remember`] keeps a copy of the prd.json the current run works on, in
//!   `.ralph/prd-memory.json`, so that the *old* file can be archived after the user replaced it.
//!   When that memory is gone, [`check`] falls back to the prd.json committed in the newest ralph
//!   commit (the one with a `Ralph-Run` trailer).
//! - Folder names are flat (`team/x/feature-c` → `team-x-feature-c`) and unique: an existing
//!   folder is never reused; `-2`, `-3`, … are appended instead.
//! - The copies are written and synced before progress.txt is reset, so a crash at any point
//!   loses nothing (at worst it archives twice).
//! - It is plain Rust: no external tool can be missing.
//!
//! The folder lives beside prd.json (as progress.txt does), so with the usual layout it is
//! `<repo>/archive/`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use chrono::{DateTime, Local, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::error::UserError;
use crate::git::Repo;
use crate::lock::{LockError, RunLock};
use crate::progress;
use crate::workspace::{ensure_ralph_dir, RunPaths};

/// Name of the folder, beside prd.json, that holds one sub-folder per archived run.
pub const ARCHIVE_DIR: &str = "archive";
/// File inside `.ralph/` holding the remembered prd.json of each PRD path (see [`remember`]).
pub const MEMORY_FILE: &str = "prd-memory.json";
/// Folder-name stand-in for a prd.json without a `branchName` (manual archives only).
pub const NO_BRANCH: &str = "no-branch";
/// Longest flattened branch name used in a folder name, in bytes; file systems cap a name at
/// 255 bytes and the date and a `-N` suffix need room too.
const MAX_BRANCH_BYTES: usize = 200;
/// Version of the [`MEMORY_FILE`] layout.
const MEMORY_VERSION: u32 = 1;

/// Where the archived prd.json came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Source {
    /// The copy [`remember`] kept in `.ralph/prd-memory.json`.
    Remembered,
    /// prd.json as committed in the newest ralph commit (`.ralph/` was gone).
    GitCommit {
        /// Full sha of that commit.
        sha: String,
    },
    /// The prd.json on disk, archived by hand with `ralph archive`.
    Current,
}

/// What an archive did, for the caller to print (see [`Archived::describe`]) and commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Archived {
    /// The new folder, e.g. `<prd dir>/archive/2026-01-31-ralph-feature-a-2` (absolute when the
    /// prd path was).
    pub folder: PathBuf,
    /// Every file written into `folder`: `prd.json`, then `progress.txt` when there was one,
    /// then the `progress-history/` folder when progress.txt had moved older entries there.
    pub files: Vec<PathBuf>,
    /// The archived prd.json's `branchName`; `None` only for a manual archive of a prd.json
    /// without one (the folder then says [`NO_BRANCH`]).
    pub branch: Option<String>,
    /// Where the archived prd.json came from.
    pub source: Source,
    /// Whether progress.txt held anything beyond ralph's header (see
    /// [`progress::initial_contents`]); `false` also when there was no progress.txt.
    pub progress_had_entries: bool,
    /// Whether progress.txt was reset to a fresh header (it is whenever it existed).
    pub progress_reset: bool,
}

impl Archived {
    /// One line for the terminal, paths shown relative to `base` when inside it, e.g.
    /// `archived branch ralph/a (prd.json, progress.txt) to archive/2026-01-31-ralph-a/;
    /// progress.txt was reset`. It says when progress.txt held only its header or was missing.
    pub fn describe(&self, base: &Path) -> String {
        let folder = self.folder.strip_prefix(base).unwrap_or(&self.folder);
        let names: Vec<String> = self
            .files
            .iter()
            .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let what = match &self.branch {
            Some(branch) => format!("branch {branch}"),
            None => "the run without a branchName".to_owned(),
        };
        let from = match &self.source {
            Source::Remembered | Source::Current => String::new(),
            Source::GitCommit { sha } => format!(
                " (prd.json as of ralph commit {})",
                sha.get(..12).unwrap_or(sha)
            ),
        };
        let progress = match (self.progress_reset, self.progress_had_entries) {
            (true, true) => "; progress.txt was reset",
            (true, false) => "; progress.txt held only its header and was reset",
            (false, _) => "; there was no progress.txt",
        };
        format!(
            "archived {what}{from} ({}) to {}/{progress}",
            names.join(", "),
            folder.display()
        )
    }
}

/// `.ralph/prd-memory.json`: the last prd.json each PRD path was run with.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Memory {
    version: u32,
    /// Keyed by the prd.json path relative to the repository root (see [`memory_key`]): progress.txt
    /// sits beside its prd.json, so two PRDs in one repository are two separate histories.
    prds: BTreeMap<String, Remembered>,
}

/// The previous run's prd.json, as [`check`] found it.
struct Previous {
    /// Its exact bytes.
    bytes: Vec<u8>,
    /// Its `branchName`.
    branch: Option<String>,
    /// Where it came from.
    source: Source,
}

/// One remembered prd.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Remembered {
    /// Its `branchName`, as the caller gave it.
    branch: Option<String>,
    /// When it was remembered.
    saved_at: DateTime<Utc>,
    /// The exact file content (a loadable prd.json is always UTF-8).
    text: String,
}

/// Remembers `prd_bytes` as the content of the prd.json at `prd` that the current run works on,
/// with its `branchName` `branch` (pass the PRD's `branchName`; `None` or empty when it has
/// none), so that [`check`] can archive exactly this content after the user replaces the file.
///
/// Call it after every iteration and at the end of a run (with prd.json as it is then). The
/// memory is `<ralph_dir>/prd-memory.json`, one entry per prd path, replaced atomically
/// (temp file, rename) only when the entry changes; `ralph_dir` is created with its self-ignoring `.gitignore` when
/// missing. `ralph_dir` must be the `.ralph` directory at the repository root.
///
/// # Errors
/// `prd_bytes` that are not UTF-8 (never a loadable prd.json); I/O errors naming the file. An
/// unreadable or corrupt memory file is not an error: it is replaced.
pub fn remember(
    ralph_dir: &Path,
    prd: &Path,
    prd_bytes: &[u8],
    branch: Option<&str>,
) -> anyhow::Result<()> {
    let text = std::str::from_utf8(prd_bytes)
        .with_context(|| format!("cannot remember {}: it is not UTF-8", prd.display()))?;
    // The books hold no secret whoever reads them later (an agent's note may quote a key).
    let text = &*crate::redact::current().redact(text);
    crate::workspace::ensure_ralph_dir(ralph_dir)?;
    let mut memory = read_memory(ralph_dir);
    let key = memory_key(ralph_dir, prd);
    let branch = branch.filter(|b| !b.trim().is_empty());
    // Called every iteration: an unchanged prd.json costs a read, not a write.
    if memory.version == MEMORY_VERSION
        && memory
            .prds
            .get(&key)
            .is_some_and(|r| r.text == text && r.branch.as_deref() == branch)
    {
        return Ok(());
    }
    memory.version = MEMORY_VERSION;
    memory.prds.insert(
        key,
        Remembered {
            branch: branch.map(str::to_owned),
            saved_at: Utc::now(),
            text: text.to_owned(),
        },
    );
    let json = serde_json::to_vec_pretty(&memory)?;
    // Not fsynced: rewritten whenever prd.json changes, and a power loss only brings back the
    // previous version (see docs/durability.md).
    crate::fsutil::write_volatile(&ralph_dir.join(MEMORY_FILE), &json)
        .with_context(|| format!("cannot write {}", ralph_dir.join(MEMORY_FILE).display()))
}

/// The start-up archive check: when prd.json's `branchName` differs from the previous run's,
/// archives the previous run and resets progress.txt. Call it once per `ralph run`, holding the
/// run lock, before anything else writes prd.json or progress.txt or checks out a branch.
///
/// - `repo_root`: the repository's working-tree root; `prd`: the prd.json (absolute);
///   `progress`: the progress.txt beside it; `ralph_dir`: `<repo_root>/.ralph`; `today`: the
///   local date, used in the folder name.
/// - The previous prd.json is the one [`remember`]ed for this prd path; when there is none
///   (`.ralph/` deleted, or the first run of this ralph version), it is prd.json as committed in
///   the newest commit with a `Ralph-Run` trailer on HEAD's first-parent history (none when
///   prd.json is not tracked, e.g. git-ignored).
/// - It archives only when both the previous and the current prd.json name a non-empty
///   `branchName` and they differ. No previous prd.json (the first run ever), a `branchName`
///   missing on either side, or a current prd.json that is not JSON: nothing is archived.
/// - Archiving creates `<prd dir>/archive/<today>-<previous branch, flattened>[-N]/` (never an
///   existing folder, see [`folder_name`]), writes the *previous* prd.json and the current
///   progress.txt into it and syncs them, and only then resets progress.txt to
///   [`progress::initial_contents`]. A progress.txt with only its header is archived and reset
///   too ([`Archived::progress_had_entries`] is `false`, and [`Archived::describe`] says so); a
///   missing one is not created.
/// - Nothing is archived twice: when some folder under `archive/` already holds a byte-identical
///   prd.json and progress.txt has nothing beyond its header (e.g. after `ralph archive`, or a
///   crash right after the reset), it returns `Ok(None)`.
/// - Finally the current prd.json becomes the remembered one (when it is JSON), so a run that
///   fails later in its preflight does not archive again on the next start.
///
/// Returns what was archived, for the caller to print and commit; `None` when nothing was.
///
/// # Errors
/// I/O errors on prd.json, progress.txt, the archive folder or the memory file, each naming the
/// path; git errors while reading history. When an error happens before progress.txt is reset,
/// progress.txt is untouched.
pub fn check(
    repo_root: &Path,
    prd: &Path,
    progress: &Path,
    ralph_dir: &Path,
    today: NaiveDate,
) -> anyhow::Result<Option<Archived>> {
    let current = match fs::read(prd) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", prd.display())),
    };
    let Some(new_branch) = branch_of(&current) else {
        // The run refuses an invalid prd.json itself; keep the memory for when it is fixed.
        return Ok(None);
    };

    let previous = match read_memory(ralph_dir)
        .prds
        .remove(&memory_key(ralph_dir, prd))
    {
        Some(r) => Some(Previous {
            bytes: r.text.into_bytes(),
            branch: r.branch,
            source: Source::Remembered,
        }),
        None => from_git(repo_root, prd)?,
    };

    let mut archived = None;
    if let Some(old) = previous {
        let differs = matches!((&old.branch, &new_branch), (Some(a), Some(b)) if a != b);
        if differs && !already_archived(prd, &old.bytes, progress)? {
            archived = Some(archive_into(
                prd, progress, &old.bytes, old.branch, old.source, today,
            )?);
        }
    }
    remember(ralph_dir, prd, &current, new_branch.as_deref())?;
    Ok(archived)
}

/// `ralph archive`: archives the prd.json at `prd` as it is now, and `progress`, into
/// `<prd dir>/archive/<today>-<its branchName, flattened, or "no-branch">[-N]/`, then resets
/// progress.txt (see [`check`] for the order and the guarantees). The prd.json is also
/// [`remember`]ed, so the next `ralph run` does not archive it a second time. A prd.json that
/// is not JSON is archived byte for byte (as `no-branch`). The caller holds the run lock.
///
/// # Errors
/// A missing prd.json (with a hint), and I/O errors naming the path.
pub fn archive_current(
    prd: &Path,
    progress: &Path,
    ralph_dir: &Path,
    today: NaiveDate,
) -> anyhow::Result<Archived> {
    let bytes = match fs::read(prd) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == ErrorKind::NotFound => bail!(
            "{} does not exist, so there is nothing to archive\nhint: point ralph at your PRD with --prd PATH",
            prd.display()
        ),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", prd.display())),
    };
    let branch = branch_of(&bytes).flatten();
    let archived = archive_into(
        prd,
        progress,
        &bytes,
        branch.clone(),
        Source::Current,
        today,
    )?;
    if std::str::from_utf8(&bytes).is_ok() {
        remember(ralph_dir, prd, &bytes, branch.as_deref())?;
    }
    Ok(archived)
}

/// [`archive_current`] for the workspace `paths`, holding the run lock (`.ralph/lock`) so that it
/// never races a `ralph run` appending to progress.txt: `ralph archive`, and `ralph convert` when
/// it replaces a prd.json.
///
/// # Errors
/// A `ralph run` holding the lock (naming its pid, with a hint), a missing prd.json, I/O errors
/// naming the path.
pub fn archive_locked(paths: &RunPaths, today: NaiveDate) -> anyhow::Result<Archived> {
    ensure_ralph_dir(&paths.ralph_dir)?;
    let acquired = match RunLock::acquire(&paths.ralph_dir) {
        Ok(acquired) => acquired,
        Err(LockError::Held { pid, host, .. }) => {
            return Err(UserError::new(format!(
                "a `ralph run` (pid {pid} on {host}) is working on this repository; archiving now could lose what it is writing to progress.txt"
            ))
            .with_hint(format!(
                "wait for the run to finish (or stop it: `kill {pid}`), then try again"
            ))
            .into())
        }
        Err(LockError::HeldUnknown { path }) => {
            return Err(UserError::new(format!(
                "a `ralph run` holds {} ; archiving now could lose what it is writing to progress.txt",
                path.display()
            ))
            .with_hint("wait for the run to finish, then try again")
            .into())
        }
        Err(err) => return Err(err.into()),
    };
    if let Some(stale) = &acquired.stale {
        tracing::warn!(
            "taking over a stale lock from pid {} on {} (that ralph is no longer running)",
            stale.pid,
            stale.host
        );
    }
    let done = archive_current(&paths.prd, &paths.progress, &paths.ralph_dir, today)?;
    drop(acquired);
    Ok(done)
}

/// The folder name for `branch` archived on `today`: `<YYYY-MM-DD>-<branch>`, where every `/`
/// and `\` (and any character not allowed in a file name on common systems: control characters,
/// `:*?"<>|`) becomes `-`, so `team/x/feature-c` gives `2026-01-31-team-x-feature-c`. The branch
/// part is cut to at most 200 bytes; a missing or blank branch gives `<date>-no-branch`.
/// [`check`] and [`archive_current`] append `-2`, `-3`, … when the folder exists.
pub fn folder_name(today: NaiveDate, branch: Option<&str>) -> String {
    let flat: String = branch
        .unwrap_or("")
        .trim()
        .chars()
        .map(|c| match c {
            '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' => '-',
            c if c.is_control() => '-',
            c => c,
        })
        .collect();
    let mut cut = flat.len().min(MAX_BRANCH_BYTES);
    while !flat.is_char_boundary(cut) {
        cut -= 1;
    }
    let flat = &flat[..cut];
    let flat = if flat.is_empty() { NO_BRANCH } else { flat };
    format!("{}-{flat}", today.format("%Y-%m-%d"))
}

/// Whether progress.txt's text holds anything beyond ralph's header (the `# Ralph Progress Log`
/// title, a `Started:` line, `---` rules, an empty `## Codebase Patterns` section, blank lines).
pub fn progress_has_entries(text: &str) -> bool {
    text.lines().map(str::trim).any(|line| {
        !(line.is_empty()
            || line == "# Ralph Progress Log"
            || line.starts_with("Started:")
            || line == "---"
            || line.eq_ignore_ascii_case(progress::PATTERNS_HEADING))
    })
}

/// Copies `old_prd` and progress.txt into a new unique folder, syncs them, then resets
/// progress.txt.
fn archive_into(
    prd: &Path,
    progress: &Path,
    old_prd: &[u8],
    branch: Option<String>,
    source: Source,
    today: NaiveDate,
) -> anyhow::Result<Archived> {
    // Read progress.txt before creating anything, so an unreadable file leaves no half archive.
    let progress_bytes = match fs::read(progress) {
        Ok(bytes) => Some(bytes),
        Err(err) if err.kind() == ErrorKind::NotFound => None,
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", progress.display())),
    };
    let root = prd.parent().unwrap_or(Path::new(".")).join(ARCHIVE_DIR);
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let folder = create_unique(&root, &folder_name(today, branch.as_deref()))?;

    let mut files = vec![folder.join("prd.json")];
    write_synced(&files[0], old_prd)?;
    if let Some(bytes) = &progress_bytes {
        let copy = folder.join("progress.txt");
        write_synced(&copy, bytes)?;
        files.push(copy);
    }
    // The entries progress.txt moved out earlier (progress::roll) belong to the same feature.
    let history = progress.with_file_name(progress::HISTORY_DIR);
    if history.is_dir() {
        let moved = folder.join(progress::HISTORY_DIR);
        fs::rename(&history, &moved)
            .with_context(|| format!("cannot move {} to {}", history.display(), moved.display()))?;
        files.push(moved);
    }
    sync_dir(&folder)?;
    sync_dir(&root)?;
    if let Some(dir) = progress.parent().filter(|d| !d.as_os_str().is_empty()) {
        sync_dir(dir)?;
    }

    // Only now that the copies are durable is the original replaced.
    let progress_had_entries = progress_bytes
        .as_deref()
        .is_some_and(|b| progress_has_entries(&String::from_utf8_lossy(b)));
    if progress_bytes.is_some() {
        write_atomic(
            progress,
            progress::initial_contents(Local::now()).as_bytes(),
        )?;
    }
    Ok(Archived {
        folder,
        files,
        branch,
        source,
        progress_had_entries,
        progress_reset: progress_bytes.is_some(),
    })
}

/// Creates `<root>/<base>`, or `<base>-2`, `<base>-3`, … when taken; `create_dir` (not
/// `create_dir_all`) makes the choice race-free.
fn create_unique(root: &Path, base: &str) -> anyhow::Result<PathBuf> {
    for n in 1..=10_000u32 {
        let name = if n == 1 {
            base.to_owned()
        } else {
            format!("{base}-{n}")
        };
        let path = root.join(name);
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(err) if err.kind() == ErrorKind::AlreadyExists => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("cannot create {}", path.display()))
            }
        }
    }
    bail!(
        "cannot find a free folder name for {base} in {}",
        root.display()
    )
}

/// Whether a folder under `<prd dir>/archive/` already holds `old_prd` byte for byte while
/// progress.txt holds nothing beyond its header: then archiving again would add nothing.
fn already_archived(prd: &Path, old_prd: &[u8], progress: &Path) -> anyhow::Result<bool> {
    match fs::read(progress) {
        Ok(bytes) if progress_has_entries(&String::from_utf8_lossy(&bytes)) => return Ok(false),
        Ok(_) => {}
        Err(err) if err.kind() == ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", progress.display())),
    }
    let root = prd.parent().unwrap_or(Path::new(".")).join(ARCHIVE_DIR);
    let Ok(entries) = fs::read_dir(&root) else {
        return Ok(false);
    };
    Ok(entries
        .flatten()
        .any(|e| fs::read(e.path().join("prd.json")).is_ok_and(|b| b == old_prd)))
}

/// The previous prd.json from git: its content in the newest `Ralph-Run` commit, with its
/// branch, when prd.json lies inside the repository and that commit tracks it.
fn from_git(repo_root: &Path, prd: &Path) -> anyhow::Result<Option<Previous>> {
    let Ok(repo) = Repo::discover(repo_root) else {
        return Ok(None);
    };
    let Some(rel) = relative_to(repo.root(), prd) else {
        return Ok(None);
    };
    let Some(newest) = repo.trailer_history(1)?.into_iter().next() else {
        return Ok(None);
    };
    let Some(bytes) = repo.file_at(&newest.sha, &rel)? else {
        return Ok(None);
    };
    Ok(Some(Previous {
        branch: branch_of(&bytes).flatten(),
        bytes,
        source: Source::GitCommit { sha: newest.sha },
    }))
}

/// The memory key of `prd`: its path relative to the repository root (`ralph_dir`'s parent)
/// with `/` separators, or its absolute path when it lies outside.
fn memory_key(ralph_dir: &Path, prd: &Path) -> String {
    match ralph_dir.parent().and_then(|root| relative_to(root, prd)) {
        Some(rel) => rel,
        None => prd.to_string_lossy().into_owned(),
    }
}

/// `path` relative to `root` as a `/`-separated string, comparing canonical directories so that
/// symlinked temp dirs and libgit2's trailing slash do not matter.
fn relative_to(root: &Path, path: &Path) -> Option<String> {
    let root = fs::canonicalize(root).ok()?;
    let dir = fs::canonicalize(path.parent()?).ok()?;
    let full = dir.join(path.file_name()?);
    let rel = full.strip_prefix(&root).ok()?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Some(parts.join("/"))
}

/// Reads the memory file; a missing, unreadable or corrupt one reads as empty (it only ever
/// saves an archive, so losing it must not stop a run).
fn read_memory(ralph_dir: &Path) -> Memory {
    let path = ralph_dir.join(MEMORY_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!(path = %path.display(), %err, "ignoring an unreadable prd memory file");
            Memory::default()
        }),
        Err(_) => Memory::default(),
    }
}

/// The `branchName` of prd.json bytes read leniently (a UTF-8 BOM is skipped, the schema is not
/// validated): `None` when they are not a JSON object, `Some(None)` when it has no non-blank
/// string `branchName`. Only that member is kept: the stories are skipped, not built (a
/// 100,000-story prd.json is read at every start).
fn branch_of(bytes: &[u8]) -> Option<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "branchName", default)]
        branch_name: Option<serde_json::Value>,
    }
    let body = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let head: Head = serde_json::from_slice(body).ok()?;
    Some(
        head.branch_name
            .as_ref()
            .and_then(|v| v.as_str())
            .filter(|b| !b.trim().is_empty())
            .map(str::to_owned),
    )
}

/// Creates `path` (which must not exist) with `bytes` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Replaces `path` with `bytes` through [`crate::fsutil::write_atomic`] (mode kept, durable).
fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(crate::fsutil::write_atomic(path, bytes)?)
}

/// fsyncs a directory so entries created or renamed in it survive a crash.
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 1, 31).unwrap()
    }

    fn prd_json(branch: Option<&str>, story: &str) -> String {
        let branch = branch
            .map(|b| format!("\"branchName\": \"{b}\",\n  "))
            .unwrap_or_default();
        format!(
            "{{\n  \"project\": \"P\",\n  {branch}\"userStories\": [{{\"id\": \"{story}\", \"title\": \"T\", \"priority\": 1, \"passes\": true}}]\n}}\n"
        )
    }

    /// A repository-like layout (no git): root, `.ralph`, prd.json and progress.txt.
    struct Layout {
        _dir: tempfile::TempDir,
        root: PathBuf,
        ralph: PathBuf,
        prd: PathBuf,
        progress: PathBuf,
    }

    impl Layout {
        fn new() -> Layout {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().to_path_buf();
            Layout {
                ralph: root.join(".ralph"),
                prd: root.join("prd.json"),
                progress: root.join("progress.txt"),
                root,
                _dir: dir,
            }
        }

        /// Runs a "previous run" on `branch`: prd.json written and remembered, progress.txt
        /// with one entry.
        fn previous_run(&self, branch: &str, story: &str) -> String {
            let text = prd_json(Some(branch), story);
            fs::write(&self.prd, &text).unwrap();
            remember(&self.ralph, &self.prd, text.as_bytes(), Some(branch)).unwrap();
            fs::write(
                &self.progress,
                format!("# Ralph Progress Log\nStarted: x\n---\n\n## {story} done\n---\n"),
            )
            .unwrap();
            text
        }

        fn check(&self) -> Option<Archived> {
            check(&self.root, &self.prd, &self.progress, &self.ralph, day()).unwrap()
        }

        fn folders(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(self.root.join(ARCHIVE_DIR))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            names
        }
    }

    #[test]
    fn folder_names_are_flat_and_safe() {
        assert_eq!(
            folder_name(day(), Some("team/x/feature-c")),
            "2026-01-31-team-x-feature-c"
        );
        assert_eq!(
            folder_name(day(), Some("a\\b:c*d\ne")),
            "2026-01-31-a-b-c-d-e"
        );
        assert_eq!(folder_name(day(), None), "2026-01-31-no-branch");
        assert_eq!(folder_name(day(), Some("  ")), "2026-01-31-no-branch");
        let long = folder_name(day(), Some(&"é".repeat(300)));
        assert!(long.len() <= 11 + MAX_BRANCH_BYTES, "{}", long.len());
        assert!(!long.contains('/'));
    }

    #[test]
    fn header_only_progress_has_no_entries() {
        let header = progress::initial_contents(Local::now());
        assert!(!progress_has_entries(&header));
        assert!(!progress_has_entries(""));
        assert!(progress_has_entries(&format!("{header}- use pnpm\n")));
        assert!(progress_has_entries(&format!("{header}## US-001 done\n")));
    }

    #[test]
    fn branch_change_archives_the_old_prd_not_the_new_one_then_resets_progress() {
        let l = Layout::new();
        let old = l.previous_run("ralph/feature-a", "US-001");
        let old_progress = fs::read_to_string(&l.progress).unwrap();
        let new = prd_json(Some("ralph/feature-b"), "US-900");
        fs::write(&l.prd, &new).unwrap();

        let archived = l.check().expect("archived");
        assert_eq!(
            archived.folder,
            l.root.join("archive/2026-01-31-ralph-feature-a")
        );
        assert_eq!(archived.branch.as_deref(), Some("ralph/feature-a"));
        assert_eq!(archived.source, Source::Remembered);
        assert!(archived.progress_had_entries && archived.progress_reset);
        assert_eq!(
            fs::read_to_string(archived.folder.join("prd.json")).unwrap(),
            old
        );
        assert_eq!(
            fs::read_to_string(archived.folder.join("progress.txt")).unwrap(),
            old_progress
        );
        // The new prd.json is untouched; progress.txt is a fresh header.
        assert_eq!(fs::read_to_string(&l.prd).unwrap(), new);
        let reset = fs::read_to_string(&l.progress).unwrap();
        assert!(reset.starts_with("# Ralph Progress Log\n"), "{reset}");
        assert!(!progress_has_entries(&reset), "{reset}");
        let line = archived.describe(&l.root);
        assert!(
            line.contains("archive/2026-01-31-ralph-feature-a/") && line.contains("reset"),
            "{line}"
        );
        // The new prd.json is now the remembered one: a second start archives nothing.
        assert_eq!(l.check(), None);
        assert_eq!(l.folders(), ["2026-01-31-ralph-feature-a"]);
    }

    #[test]
    fn the_progress_history_of_the_old_feature_moves_into_its_archive() {
        let l = Layout::new();
        l.previous_run("ralph/feature-a", "US-001");
        let history = l.progress.with_file_name(progress::HISTORY_DIR);
        fs::create_dir_all(&history).unwrap();
        fs::write(history.join("0001.txt"), "# moved\n\n## old entry\n").unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/feature-b"), "US-900")).unwrap();

        let archived = l.check().expect("archived");
        let moved = archived.folder.join(progress::HISTORY_DIR);
        assert_eq!(
            fs::read_to_string(moved.join("0001.txt")).unwrap(),
            "# moved\n\n## old entry\n"
        );
        assert!(archived.files.contains(&moved));
        assert!(
            !history.exists(),
            "the new feature starts without the old history"
        );
    }

    #[test]
    fn same_day_archives_never_overwrite_each_other() {
        let l = Layout::new();
        fs::create_dir_all(l.root.join("archive/2026-01-31-team-x-a")).unwrap();
        fs::write(l.root.join("archive/2026-01-31-team-x-a/prd.json"), "keep").unwrap();
        l.previous_run("team/x/a", "US-001");
        fs::write(&l.prd, prd_json(Some("team/x/b"), "US-002")).unwrap();
        let first = l.check().expect("archived");
        assert_eq!(first.folder, l.root.join("archive/2026-01-31-team-x-a-2"));
        // Back to a again, same day: yet another folder.
        l.previous_run("team/x/b", "US-002");
        fs::write(&l.prd, prd_json(Some("team/x/a"), "US-003")).unwrap();
        l.check().expect("archived");
        l.previous_run("team/x/a", "US-003");
        fs::write(&l.prd, prd_json(Some("team/x/c"), "US-004")).unwrap();
        let third = l.check().expect("archived");
        assert_eq!(third.folder, l.root.join("archive/2026-01-31-team-x-a-3"));
        assert_eq!(
            fs::read_to_string(l.root.join("archive/2026-01-31-team-x-a/prd.json")).unwrap(),
            "keep"
        );
        assert_eq!(
            l.folders(),
            [
                "2026-01-31-team-x-a",
                "2026-01-31-team-x-a-2",
                "2026-01-31-team-x-a-3",
                "2026-01-31-team-x-b"
            ]
        );
    }

    #[test]
    fn nothing_is_archived_without_a_previous_prd_or_a_branch_on_both_sides() {
        // First run ever: nothing remembered, no git.
        let l = Layout::new();
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-001")).unwrap();
        fs::write(&l.progress, "# Ralph Progress Log\n## notes\n").unwrap();
        assert_eq!(l.check(), None);
        // It is remembered now, so switching branch afterwards archives it.
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        assert!(l.check().is_some());

        // Previous without branchName.
        let l = Layout::new();
        let text = prd_json(None, "US-001");
        remember(&l.ralph, &l.prd, text.as_bytes(), None).unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        assert_eq!(l.check(), None);

        // Current without branchName.
        let l = Layout::new();
        l.previous_run("ralph/a", "US-001");
        let before = fs::read_to_string(&l.progress).unwrap();
        fs::write(&l.prd, prd_json(None, "US-002")).unwrap();
        assert_eq!(l.check(), None);
        assert_eq!(fs::read_to_string(&l.progress).unwrap(), before);
        assert!(l.folders().is_empty());

        // Same branch, different content: the same feature goes on.
        let l = Layout::new();
        l.previous_run("ralph/a", "US-001");
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-002")).unwrap();
        assert_eq!(l.check(), None);
    }

    #[test]
    fn an_invalid_current_prd_archives_nothing_and_keeps_the_memory() {
        let l = Layout::new();
        let old = l.previous_run("ralph/a", "US-001");
        fs::write(&l.prd, "{ not json").unwrap();
        assert_eq!(l.check(), None);
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        let archived = l.check().expect("archived once fixed");
        assert_eq!(
            fs::read_to_string(archived.folder.join("prd.json")).unwrap(),
            old
        );
    }

    #[test]
    fn header_only_progress_still_archives_the_prd_and_says_so() {
        let l = Layout::new();
        l.previous_run("ralph/a", "US-001");
        fs::write(&l.progress, progress::initial_contents(Local::now())).unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        let archived = l.check().expect("archived");
        assert!(!archived.progress_had_entries);
        assert_eq!(archived.files.len(), 2);
        assert!(
            archived.describe(&l.root).contains("only its header"),
            "{}",
            archived.describe(&l.root)
        );

        // No progress.txt at all: the prd alone, and none is created.
        let l = Layout::new();
        l.previous_run("ralph/a", "US-001");
        fs::remove_file(&l.progress).unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        let archived = l.check().expect("archived");
        assert_eq!(archived.files, [archived.folder.join("prd.json")]);
        assert!(!archived.progress_reset);
        assert!(!l.progress.exists());
    }

    #[test]
    fn manual_archive_then_a_branch_change_does_not_archive_twice() {
        let l = Layout::new();
        let text = l.previous_run("ralph/a", "US-001");
        let archived = archive_current(&l.prd, &l.progress, &l.ralph, day()).unwrap();
        assert_eq!(archived.folder, l.root.join("archive/2026-01-31-ralph-a"));
        assert_eq!(archived.source, Source::Current);
        assert_eq!(
            fs::read_to_string(archived.folder.join("prd.json")).unwrap(),
            text
        );
        assert!(!progress_has_entries(
            &fs::read_to_string(&l.progress).unwrap()
        ));
        // prd.json itself stays; replacing it and starting a run archives nothing more.
        assert_eq!(fs::read_to_string(&l.prd).unwrap(), text);
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        assert_eq!(l.check(), None);
        assert_eq!(l.folders(), ["2026-01-31-ralph-a"]);
    }

    #[test]
    fn manual_archive_without_branch_or_json_uses_no_branch() {
        let l = Layout::new();
        fs::write(&l.prd, "not json at all").unwrap();
        let archived = archive_current(&l.prd, &l.progress, &l.ralph, day()).unwrap();
        assert_eq!(archived.folder, l.root.join("archive/2026-01-31-no-branch"));
        assert_eq!(archived.branch, None);
        assert!(!archived.progress_reset);
        let again = archive_current(&l.prd, &l.progress, &l.ralph, day()).unwrap();
        assert_eq!(again.folder, l.root.join("archive/2026-01-31-no-branch-2"));
        fs::remove_file(&l.prd).unwrap();
        let err = archive_current(&l.prd, &l.progress, &l.ralph, day()).unwrap_err();
        assert!(format!("{err:#}").contains("nothing to archive"), "{err:#}");
    }

    #[test]
    fn without_memory_the_prd_of_the_newest_ralph_commit_is_archived() {
        let l = Layout::new();
        git2::Repository::init(&l.root).unwrap();
        let repo = Repo::discover(&l.root).unwrap();
        fs::write(l.root.join(".gitignore"), ".ralph/\n").unwrap();
        let old = prd_json(Some("ralph/a"), "US-001");
        fs::write(&l.prd, &old).unwrap();
        fs::write(&l.progress, "# Ralph Progress Log\n## US-001 done\n").unwrap();
        let sha = repo
            .commit_all(
                "ralph: iteration 1 (US-001)",
                "",
                &[(crate::git::TRAILER_RUN, "r1".to_owned())],
            )
            .unwrap()
            .unwrap();
        // A later commit by the user, without trailers, that edits prd.json: not the run's.
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-002")).unwrap();
        repo.commit_all("user edit", "", &[]).unwrap();
        // .ralph/ is gone; the user starts the next feature.
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-003")).unwrap();
        let archived = l.check().expect("archived from git");
        assert_eq!(archived.source, Source::GitCommit { sha: sha.clone() });
        assert_eq!(archived.branch.as_deref(), Some("ralph/a"));
        assert_eq!(
            fs::read_to_string(archived.folder.join("prd.json")).unwrap(),
            old
        );
        assert!(
            archived.describe(&l.root).contains(&sha[..12]),
            "{}",
            archived.describe(&l.root)
        );

        // The same branch in the newest ralph commit: nothing to archive.
        let l = Layout::new();
        git2::Repository::init(&l.root).unwrap();
        let repo = Repo::discover(&l.root).unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-001")).unwrap();
        repo.commit_all("r", "", &[(crate::git::TRAILER_RUN, "r1".to_owned())])
            .unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-009")).unwrap();
        assert_eq!(l.check(), None);
    }

    #[test]
    fn an_untracked_prd_has_no_git_fallback() {
        let l = Layout::new();
        git2::Repository::init(&l.root).unwrap();
        let repo = Repo::discover(&l.root).unwrap();
        fs::write(
            l.root.join(".gitignore"),
            "prd.json\nprogress.txt\n.ralph/\n",
        )
        .unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/a"), "US-001")).unwrap();
        repo.commit_all("r", "", &[(crate::git::TRAILER_RUN, "r1".to_owned())])
            .unwrap();
        fs::write(&l.prd, prd_json(Some("ralph/b"), "US-002")).unwrap();
        fs::write(&l.progress, "# Ralph Progress Log\n## kept\n").unwrap();
        assert_eq!(l.check(), None);
        assert_eq!(
            fs::read_to_string(&l.progress).unwrap(),
            "# Ralph Progress Log\n## kept\n"
        );
    }

    #[test]
    fn a_corrupt_memory_file_is_replaced_and_paths_are_separate_histories() {
        let l = Layout::new();
        fs::create_dir_all(&l.ralph).unwrap();
        fs::write(l.ralph.join(MEMORY_FILE), "garbage").unwrap();
        l.previous_run("ralph/a", "US-001");
        // A second PRD in a subfolder with its own branch does not count as a change of the first.
        fs::create_dir_all(l.root.join("sub")).unwrap();
        let sub = l.root.join("sub/prd.json");
        fs::write(&sub, prd_json(Some("ralph/other"), "US-500")).unwrap();
        assert_eq!(
            check(
                &l.root,
                &sub,
                &l.root.join("sub/progress.txt"),
                &l.ralph,
                day()
            )
            .unwrap(),
            None
        );
        assert_eq!(l.check(), None);
        let memory = read_memory(&l.ralph);
        assert_eq!(
            memory.prds.keys().cloned().collect::<Vec<_>>(),
            ["prd.json", "sub/prd.json"]
        );
        assert!(l.ralph.join(".gitignore").exists());
        assert!(remember(&l.ralph, &l.prd, b"\xff\xfe", None).is_err());
    }
}
