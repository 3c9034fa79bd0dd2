//! What a fresh `--parallel` story worktree lacks before its agent starts: a git worktree is a
//! bare checkout, without the ignored files the project needs (`.env`, `node_modules`, a local
//! config), without its submodules, and without whatever `npm ci` or a build step makes.
//! [`set_up`] copies the declared ignored paths in from the main checkout (`worktree_copy` in
//! ralph.toml), checks the submodules out when the repository has any, and runs the declared
//! setup command (`worktree_setup`). A failure is a [`SetupFailed`] naming the step, the reason
//! and the command's output: the dispatcher records the story as `setup_failed` (no agent ran,
//! no attempt spent) and blocks it.
//!
//! Commands run through [`crate::process::capture_stoppable`] (only `process/` spawns) with the
//! iteration's process tag, the same environment treatment as an agent's
//! ([`crate::agent::session::decorate`]), a time limit, and ralph's stop signals.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::process::{self, SpawnSpec, StopSignals};

/// Bytes kept of a failed step's output (its end: where the explanation is).
pub const OUTPUT_TAIL_BYTES: usize = 4 * 1024;

/// What [`set_up`] needs to know about one worktree.
#[derive(Debug, Clone, Copy)]
pub struct TreeSetup<'a> {
    /// The main checkout's root (absolute): where `copy` paths are read from.
    pub main_root: &'a Path,
    /// The story's worktree root (absolute), already made ([`crate::git::Repo::add_worktree`]).
    pub root: &'a Path,
    /// `worktree_copy`: repository-relative paths (files or directories) git ignores, copied from
    /// the main checkout into the worktree.
    pub copy: &'a [String],
    /// `worktree_setup`: a shell command (`sh -c`) run in the worktree after the copies and the
    /// submodules; `None`: none.
    pub command: Option<&'a str>,
    /// Time limit of the setup command and of the submodule checkout, each.
    pub timeout: Duration,
    /// The process tag the commands carry ([`crate::process::agent_tag`] of the iteration the
    /// worktree is for), so that a restart's sweep finds what they left running.
    pub tag: &'a str,
}

/// What [`set_up`] did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SetupReport {
    /// The `worktree_copy` paths copied, in the order given.
    pub copied: Vec<String>,
    /// Whether the submodules were checked out (the repository has a `.gitmodules`).
    pub submodules: bool,
    /// How long the setup command took, in seconds; `None` without one.
    pub command_s: Option<f64>,
}

/// A setup step that failed: the story cannot start in this worktree.
///
/// Displays as ``<step> failed (<reason>): <output>`` (without the output when there is none;
/// an output of several lines starts on a line of its own), e.g. ``worktree_setup `npm ci`
/// failed (exit code 1): npm ERR! …``.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{step} failed ({reason}){}", output_suffix(output))]
pub struct SetupFailed {
    /// The step, e.g. ``worktree_copy `.env` `` or ``worktree_setup `npm ci` ``.
    pub step: String,
    /// Why, in a few words with the fix when there is one, e.g. `exit code 1`, `timed out after
    /// 10m`, or ``not found in the main checkout; fix `worktree_copy` in ralph.toml``.
    pub reason: String,
    /// The end of the step's output (stdout and stderr), at most [`OUTPUT_TAIL_BYTES`] bytes,
    /// secrets redacted, ANSI codes removed; empty for a step that ran no command.
    pub output: String,
    /// A stop (Ctrl-C, SIGTERM) cut the step short: not the setup's fault, so the story should
    /// not be blocked for it.
    pub interrupted: bool,
}

/// `: <output>` for a one-line output, `:` and the output on lines of their own for a longer
/// one, nothing for none.
fn output_suffix(output: &str) -> String {
    match output {
        "" => String::new(),
        o if o.contains('\n') => format!(":\n{o}"),
        o => format!(": {o}"),
    }
}

impl SetupFailed {
    fn of(step: String, reason: String) -> SetupFailed {
        SetupFailed {
            step,
            reason,
            output: String::new(),
            interrupted: false,
        }
    }
}

/// Prepares the worktree `s.root` for its agent, in this order:
/// 1. each `s.copy` path is copied from `s.main_root` (a file, or a directory with everything in
///    it; file modes and symbolic links inside directories are kept; a path that is itself a
///    link is copied as what it points to; what the worktree already has there is overwritten).
///    A path must be relative, stay inside the repository and be ignored by git in the worktree
///    (else the story's commit would take it in);
/// 2. `git submodule update --init --recursive` when the worktree has a `.gitmodules` (with
///    `protocol.file.allow=always` for this command only, so that submodules cloned from a local
///    path work as they do in the main checkout);
/// 3. `sh -c <s.command>` in the worktree, with `RALPH_MAIN_CHECKOUT` and `RALPH_WORKTREE` set.
///
/// Blocks; call it from `spawn_blocking` in async code.
///
/// # Errors
/// [`SetupFailed`] for the first step that fails (a missing, escaping or tracked copy path, a
/// failed copy, a failing or timed-out command, a stop).
pub fn set_up(s: &TreeSetup, stop: &StopSignals) -> Result<SetupReport, SetupFailed> {
    let mut report = SetupReport::default();
    if !s.copy.is_empty() {
        let wt = crate::git::Repo::discover(s.root).map_err(|e| {
            SetupFailed::of(
                format!("opening the worktree {}", s.root.display()),
                e.to_string(),
            )
        })?;
        for path in s.copy {
            copy_in(s, &wt, path)?;
            report.copied.push(path.clone());
        }
    }
    if s.root.join(".gitmodules").is_file() {
        let spec = SpawnSpec {
            program: "git".into(),
            args: [
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "update",
                "--init",
                "--recursive",
            ]
            .map(str::to_owned)
            .to_vec(),
            ..SpawnSpec::default()
        };
        run_step(s, stop, spec, "git submodule update --init --recursive")?;
        report.submodules = true;
    }
    if let Some(command) = s.command.filter(|c| !c.trim().is_empty()) {
        let spec = SpawnSpec {
            program: "sh".into(),
            // One stream, in order: the tail reads as the command printed it.
            args: vec!["-c".into(), format!("exec 2>&1\n{command}")],
            ..SpawnSpec::default()
        };
        let took = run_step(s, stop, spec, &format!("worktree_setup `{command}`"))?;
        report.command_s = Some(took.as_secs_f64());
    }
    Ok(report)
}

/// Checks `worktree_copy` against the main checkout before any worktree is made, so that a
/// mistake in ralph.toml stops the run at its start instead of failing every story's setup:
/// each path must be relative, stay inside the repository, exist in the main checkout
/// `main` and be ignored by git there (the same rules [`set_up`] applies in each worktree).
///
/// # Errors
/// The first path that breaks a rule, as a [`SetupFailed`] naming it and the fix.
pub fn check_copies(main: &crate::git::Repo, copy: &[String]) -> Result<(), SetupFailed> {
    for path in copy {
        let step = format!("worktree_copy `{path}`");
        let rel = checked_rel(path).map_err(|reason| SetupFailed::of(step.clone(), reason))?;
        let from = main.root().join(rel);
        let meta = std::fs::metadata(&from).map_err(|_| {
            SetupFailed::of(
                step.clone(),
                format!(
                    "it does not exist in {}; create it or fix `worktree_copy` in ralph.toml",
                    main.root().display()
                ),
            )
        })?;
        ignored(main, rel, meta.is_dir())
            .map_err(|reason| SetupFailed::of(step.clone(), reason))?;
    }
    Ok(())
}

/// `path` as a relative path that stays inside the repository and is not git's own directory;
/// else why not.
fn checked_rel(path: &str) -> Result<&Path, String> {
    let rel = Path::new(path.trim_end_matches('/'));
    let escapes = rel.as_os_str().is_empty()
        || rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err("the path must be relative to the repository and stay inside it (no `..`, not absolute); fix `worktree_copy` in ralph.toml".to_owned());
    }
    if rel.components().next() == Some(Component::Normal(".git".as_ref())) {
        return Err(
            "git's own directory is not copied; fix `worktree_copy` in ralph.toml".to_owned(),
        );
    }
    Ok(rel)
}

/// Ok when git ignores `rel` in `repo` (asked as a directory when `dir`); else why that matters.
fn ignored(repo: &crate::git::Repo, rel: &Path, dir: bool) -> Result<(), String> {
    let rel_str = rel.to_string_lossy();
    let asked = if dir {
        format!("{rel_str}/")
    } else {
        rel_str.to_string()
    };
    match repo.is_ignored(&asked) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "git does not ignore `{rel_str}`, so the story's commit would take the copy in; add it to .gitignore, or remove it from `worktree_copy` in ralph.toml"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Copies `path` (see [`set_up`], step 1).
fn copy_in(s: &TreeSetup, wt: &crate::git::Repo, path: &str) -> Result<(), SetupFailed> {
    let step = format!("worktree_copy `{path}`");
    let fail = |reason: String| SetupFailed::of(step.clone(), reason);
    let rel = checked_rel(path).map_err(&fail)?;
    let from = s.main_root.join(rel);
    // A link on the way (not the path itself) must not lead out of the repository.
    let main_real = s
        .main_root
        .canonicalize()
        .unwrap_or(s.main_root.to_path_buf());
    if let Some(parent) = from.parent().and_then(|p| p.canonicalize().ok()) {
        if !parent.starts_with(&main_real) {
            return Err(fail(
                "a symbolic link on the way leads out of the repository; fix `worktree_copy` in ralph.toml".to_owned(),
            ));
        }
    }
    let Ok(meta) = std::fs::metadata(&from) else {
        return Err(fail(format!(
            "it does not exist in the main checkout {}; create it or fix `worktree_copy` in ralph.toml",
            s.main_root.display()
        )));
    };
    let link = std::fs::symlink_metadata(&from).is_ok_and(|m| m.file_type().is_symlink());
    ignored(wt, rel, meta.is_dir() && !link).map_err(&fail)?;
    let to = s.root.join(rel);
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| fail(format!("cannot create {}: {e}", parent.display())))?;
    }
    let copied = if link {
        copy_link(&from, &to, s.root)
    } else if meta.is_dir() {
        copy_dir(&from, &to)
    } else {
        std::fs::copy(&from, &to).map(|_| ())
    };
    copied.map_err(|e| fail(format!("cannot copy it into the worktree: {e}")))
}

/// Makes `to` (in the worktree `root`) a symbolic link to what the link `from` (in the main
/// checkout) points at: its own target when that is absolute or, relative, leads to something
/// inside the worktree (a link to a tracked file), else the absolute path it resolves to from
/// `from` (a link to something the worktree does not have), so that the worktree sees what the
/// checkout sees.
fn copy_link(from: &Path, to: &Path, root: &Path) -> std::io::Result<()> {
    let target = std::fs::read_link(from)?;
    let resolved = |link: &Path| {
        link.parent()
            .map(|dir| dir.join(&target))
            .and_then(|p| p.canonicalize().ok())
    };
    let inside = root.canonicalize().ok();
    let target = if target.is_absolute()
        || resolved(to).is_some_and(|p| inside.as_ref().is_some_and(|r| p.starts_with(r)))
    {
        target
    } else {
        resolved(from).unwrap_or(target)
    };
    if std::fs::symlink_metadata(to).is_ok() {
        std::fs::remove_file(to)?;
    }
    std::os::unix::fs::symlink(target, to)
}

/// Copies directory `from` to `to` recursively: files with their modes, symbolic links as links,
/// directories with their modes (set once filled, so a read-only one can be filled); sockets
/// and pipes are skipped.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut dirs: Vec<(PathBuf, PathBuf, std::fs::Permissions)> = Vec::new();
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        let meta = std::fs::metadata(&src)?;
        std::fs::create_dir_all(&dst)?;
        dirs.push((src.clone(), dst.clone(), meta.permissions()));
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push((s, d));
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&s)?;
                if std::fs::symlink_metadata(&d).is_ok() {
                    std::fs::remove_file(&d)?;
                }
                std::os::unix::fs::symlink(target, &d)?;
            } else if kind.is_file() {
                std::fs::copy(&s, &d)?;
            }
        }
    }
    for (_, dst, perms) in dirs.into_iter().rev() {
        std::fs::set_permissions(&dst, perms)?;
    }
    Ok(())
}

/// Runs one setup command (`spec`, in the worktree) under `s.timeout` and `stop`; its
/// wall time when it succeeded.
fn run_step(
    s: &TreeSetup,
    stop: &StopSignals,
    mut spec: SpawnSpec,
    step: &str,
) -> Result<Duration, SetupFailed> {
    spec.cwd = s.root.to_path_buf();
    spec.env_set.push((
        "RALPH_MAIN_CHECKOUT".into(),
        s.main_root.to_string_lossy().into_owned(),
    ));
    spec.env_set.push((
        "RALPH_WORKTREE".into(),
        s.root.to_string_lossy().into_owned(),
    ));
    spec.env_set
        .push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
    for var in ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"] {
        spec.env_remove.push(var.to_owned());
    }
    crate::agent::session::decorate(&mut spec, s.tag);
    if stop.stop.is_cancelled() || stop.kill_now.is_cancelled() {
        return Err(SetupFailed {
            interrupted: true,
            ..SetupFailed::of(step.to_owned(), "stopped before it ran".to_owned())
        });
    }
    let out = process::capture_stoppable(&spec, Some(s.timeout), stop)
        .map_err(|e| SetupFailed::of(step.to_owned(), format!("could not start: {e}")))?;
    // What the command left running (a daemon it started) goes with it.
    process::kill_tagged(s.tag);
    if out.success() {
        return Ok(out.elapsed);
    }
    let reason = if out.stopped {
        "interrupted by the stop (Ctrl-C or SIGTERM)".to_owned()
    } else if out.timed_out {
        format!("timed out after {}", humantime::format_duration(s.timeout))
    } else {
        out.exit.to_string()
    };
    Err(SetupFailed {
        step: step.to_owned(),
        reason,
        output: tail(&format!("{}{}", out.stdout, out.stderr)),
        interrupted: out.stopped,
    })
}

/// The last [`OUTPUT_TAIL_BYTES`] bytes of `text` (from a line start when one is near),
/// without ANSI codes, secrets redacted, trimmed.
fn tail(text: &str) -> String {
    let text = crate::redact::redact_env(&process::strip_ansi(text));
    let text = text.trim();
    if text.len() <= OUTPUT_TAIL_BYTES {
        return text.to_owned();
    }
    let mut cut = text.len() - OUTPUT_TAIL_BYTES;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    let rest = &text[cut..];
    match rest.find('\n') {
        Some(nl) if nl < 200 => rest[nl + 1..].to_owned(),
        _ => rest.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::Repo;
    use std::os::unix::fs::PermissionsExt as _;

    use crate::git::tests::git;

    /// A main checkout with `.env` and `node_modules/` ignored and present, and a worktree of it.
    fn main_and_worktree() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("main");
        std::fs::create_dir_all(&main).unwrap();
        git2::Repository::init(&main).unwrap();
        std::fs::write(
            main.join(".gitignore"),
            ".ralph/\n.env\nnode_modules/\nlocal.toml\n",
        )
        .unwrap();
        std::fs::write(main.join("app.txt"), "app\n").unwrap();
        std::fs::write(main.join("tracked.txt"), "tracked\n").unwrap();
        let repo = Repo::discover(&main).unwrap();
        let sha = repo.commit_all("one", "", &[]).unwrap().unwrap();
        std::fs::write(main.join(".env"), "API_TOKEN=abc\n").unwrap();
        std::fs::set_permissions(main.join(".env"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::create_dir_all(main.join("node_modules/pkg/bin")).unwrap();
        std::fs::write(
            main.join("node_modules/pkg/index.js"),
            "module.exports = 1\n",
        )
        .unwrap();
        std::fs::write(main.join("node_modules/pkg/bin/run"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            main.join("node_modules/pkg/bin/run"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("../pkg/bin/run", main.join("node_modules/pkg/link")).unwrap();
        let wt = main.join(".ralph/worktrees/r/US-1");
        repo.add_worktree(&wt, &sha).unwrap();
        (dir, main, wt)
    }

    /// Each setup its own tag: a step's sweep must not kill another test's commands.
    static NEXT_TAG: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

    fn setup<'a>(
        main: &'a Path,
        wt: &'a Path,
        copy: &'a [String],
        command: Option<&'a str>,
    ) -> TreeSetup<'a> {
        TreeSetup {
            main_root: main,
            root: wt,
            copy,
            command,
            timeout: Duration::from_secs(30),
            tag: Box::leak(
                format!(
                    "test-run/{}",
                    NEXT_TAG.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                )
                .into_boxed_str(),
            ),
        }
    }

    #[test]
    fn set_up_copies_env_and_a_directory_keeping_modes_then_runs_the_command() {
        let (_d, main, wt) = main_and_worktree();
        let copy = vec![".env".to_owned(), "node_modules".to_owned()];
        let command = "test -f .env && echo \"main=$RALPH_MAIN_CHECKOUT\" > setup.out";
        let report = set_up(
            &setup(&main, &wt, &copy, Some(command)),
            &StopSignals::default(),
        )
        .unwrap();
        assert_eq!(report.copied, copy);
        assert!(!report.submodules);
        assert!(report.command_s.is_some());
        assert_eq!(
            std::fs::read_to_string(wt.join(".env")).unwrap(),
            "API_TOKEN=abc\n"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&wt.join(".env")), 0o600);
        assert_eq!(mode(&wt.join("node_modules/pkg/bin/run")), 0o755);
        assert_eq!(
            std::fs::read_link(wt.join("node_modules/pkg/link")).unwrap(),
            PathBuf::from("../pkg/bin/run")
        );
        assert_eq!(
            std::fs::read_to_string(wt.join("setup.out")).unwrap(),
            format!("main={}\n", main.display())
        );
        // The copies are ignored: nothing for the story's commit but the command's own file.
        assert_eq!(git(&wt, &["status", "--porcelain"]), "?? setup.out\n");
    }

    #[test]
    fn a_missing_escaping_or_tracked_copy_fails_naming_the_path_and_the_setting() {
        let (_d, main, wt) = main_and_worktree();
        let run = |copy: &[&str]| {
            let copy: Vec<String> = copy.iter().map(|s| s.to_string()).collect();
            set_up(
                &setup(&main, &wt, &copy, Some("touch ran")),
                &StopSignals::default(),
            )
            .unwrap_err()
        };
        let err = run(&["local.toml"]);
        assert_eq!(err.step, "worktree_copy `local.toml`");
        assert!(
            err.to_string()
                .contains("does not exist in the main checkout")
                && err.to_string().contains("`worktree_copy` in ralph.toml"),
            "{err}"
        );
        assert!(!err.interrupted);
        for escaping in ["../outside", "/etc/hostname", "a/../../x"] {
            let err = run(&[escaping]);
            assert!(err.reason.contains("stay inside it"), "{escaping}: {err}");
        }
        let err = run(&["tracked.txt"]);
        assert!(
            err.reason.contains("git does not ignore `tracked.txt`"),
            "{err}"
        );
        assert!(!wt.join("ran").exists(), "no step runs after a failed one");

        // The same rules at the run's start, against the main checkout.
        let repo = Repo::discover(&main).unwrap();
        let check = |copy: &[&str]| {
            check_copies(
                &repo,
                &copy.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
        };
        assert!(check(&[".env", "node_modules", "node_modules/"]).is_ok());
        let err = check(&[".env", "local.toml"]).unwrap_err();
        assert_eq!(err.step, "worktree_copy `local.toml`");
        assert!(err.reason.contains("does not exist in"), "{err}");
        assert!(check(&["../x"])
            .unwrap_err()
            .reason
            .contains("stay inside it"));
        assert!(check(&["tracked.txt"])
            .unwrap_err()
            .reason
            .contains("does not ignore"));
        assert!(check(&[".git/config"])
            .unwrap_err()
            .reason
            .contains("git's own directory"));
    }

    #[test]
    fn a_failing_setup_command_fails_with_its_exit_and_the_end_of_its_output() {
        let (_d, main, wt) = main_and_worktree();
        let err = set_up(
            &setup(&main, &wt, &[], Some("echo installing; echo 'npm ERR! token sk-abcdefghijklmnopqrstuvwx' >&2; exit 3")),
            &StopSignals::default(),
        )
        .unwrap_err();
        assert!(
            err.step.starts_with("worktree_setup `echo installing;"),
            "{}",
            err.step
        );
        assert_eq!(err.reason, "exit code 3");
        assert!(
            err.output.starts_with("installing\nnpm ERR!"),
            "{}",
            err.output
        );
        assert!(
            !err.output.contains("sk-abcdef"),
            "a secret reached the output: {}",
            err.output
        );
        assert!(
            err.to_string()
                .contains("failed (exit code 3):\ninstalling\n"),
            "{err}"
        );

        let mut slow = setup(&main, &wt, &[], Some("sleep 20"));
        slow.timeout = Duration::from_millis(300);
        let err = set_up(&slow, &StopSignals::default()).unwrap_err();
        assert!(err.reason.starts_with("timed out after"), "{err}");

        let stop = StopSignals::default();
        stop.stop.cancel();
        let err = set_up(&setup(&main, &wt, &[], Some("true")), &stop).unwrap_err();
        assert!(err.interrupted, "{err}");
    }

    #[test]
    fn set_up_checks_out_submodules() {
        let (d, main, _) = main_and_worktree();
        let sub = d.path().join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        git(&sub, &["init", "-q"]);
        std::fs::write(sub.join("lib.txt"), "from the submodule\n").unwrap();
        git(&sub, &["add", "."]);
        git(
            &sub,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "sub",
            ],
        );
        let sub_path = sub.to_string_lossy().into_owned();
        git(
            &main,
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                &sub_path,
                "vendor/sub",
            ],
        );
        git(
            &main,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "add sub",
            ],
        );
        let repo = Repo::discover(&main).unwrap();
        let head = repo.head_sha().unwrap().unwrap();
        let wt = main.join(".ralph/worktrees/r/US-2");
        repo.add_worktree(&wt, &head).unwrap();
        assert!(
            !wt.join("vendor/sub/lib.txt").exists(),
            "a bare worktree lacks it"
        );

        let report = set_up(&setup(&main, &wt, &[], None), &StopSignals::default()).unwrap();
        assert!(report.submodules && report.command_s.is_none());
        assert_eq!(
            std::fs::read_to_string(wt.join("vendor/sub/lib.txt")).unwrap(),
            "from the submodule\n"
        );
        assert_eq!(git(&wt, &["status", "--porcelain"]), "");
        // Removing the worktree takes the submodule's checkout with it, and git's entries.
        repo.remove_worktree(&wt).unwrap();
        assert!(!wt.exists());
        assert!(
            repo.worktrees_under(&main.join(".ralph")).len() == 1,
            "US-1's is left"
        );
        assert!(!git(&main, &["worktree", "list"]).contains("US-2"));
    }
}
