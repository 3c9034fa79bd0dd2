//! Building a child process from a [`SpawnSpec`], shared by every way process/ runs one: the
//! agent supervisor ([`super::run`]), [`super::capture`] and [`super::Service`].
//!
//! Every child gets its own process group (pgid = its pid), so one `killpg` reaches it and what it
//! starts, and on Linux `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with ralph.

use std::io;
use std::process::Command;

use nix::sys::signal::Signal;

use super::{ProcessError, SpawnSpec};

/// The command for `spec`: program, arguments, working directory, environment, its own process
/// group and the parent-death signal. Standard streams are left to the caller.
///
/// # Errors
/// [`ProcessError::Spawn`] when `spec.cwd` is set but is not a directory (checked here because a
/// missing cwd fails the spawn with the same ENOENT as a missing program, and the message must
/// name the right one).
pub(super) fn command(spec: &SpawnSpec) -> Result<Command, ProcessError> {
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    if !spec.cwd.as_os_str().is_empty() {
        if !spec.cwd.is_dir() {
            return Err(ProcessError::Spawn {
                program: spec.program.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "working directory `{}` does not exist or is not a directory",
                        spec.cwd.display()
                    ),
                ),
            });
        }
        command.current_dir(&spec.cwd);
    }
    for name in &spec.env_remove {
        command.env_remove(name);
    }
    for (name, value) in &spec.env_set {
        command.env(name, value);
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    die_with_parent(&mut command);
    Ok(command)
}

/// Makes the child of `command` get SIGKILL when ralph dies (`PR_SET_PDEATHSIG`), so no agent or
/// server runs on unsupervised. The signal fires when the *spawning thread* exits: spawn from a
/// thread that lives as long as the child should (a tokio worker thread, the main thread, or a
/// thread that waits for the child), never from `spawn_blocking`, whose threads exit when idle.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child before exec, where only
        // async-signal-safe calls are allowed: it makes two syscalls (prctl, getppid) and
        // allocates nothing (an `io::Error` from an errno is a plain integer).
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                // If ralph died between fork and prctl, no death signal will ever come.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, Signal::SIGKILL);
}

/// Maps a spawn failure to [`ProcessError`]; ENOENT means the program was not found, unless the
/// named file exists (then its interpreter or loader is what is missing).
pub(super) fn spawn_error(spec: &SpawnSpec, source: io::Error) -> ProcessError {
    let program = spec.program.display().to_string();
    if source.kind() != io::ErrorKind::NotFound {
        return ProcessError::Spawn { program, source };
    }
    let path = if spec.program.components().count() > 1 {
        Some(spec.program.clone())
    } else {
        which::which(&spec.program).ok()
    };
    match path.filter(|p| p.is_file()) {
        Some(path) => {
            let mut head = [0u8; 256];
            let n = std::fs::File::open(&path)
                .and_then(|mut f| io::Read::read(&mut f, &mut head))
                .unwrap_or(0);
            let first = String::from_utf8_lossy(&head[..n]);
            let why = match first.lines().next().and_then(|l| l.strip_prefix("#!")) {
                Some(interp) => format!(
                    "its interpreter `{}` (from its #! line) does not exist",
                    interp.trim()
                ),
                None => "its dynamic loader or a library it needs is missing".to_string(),
            };
            ProcessError::Unrunnable { program, why }
        }
        None => ProcessError::NotFound { program },
    }
}

/// The pid of a just-spawned child as a process group id.
///
/// # Errors
/// [`ProcessError::Spawn`] when there is no pid (only once reaped) or it does not fit an `i32`.
pub(super) fn pgid_of(spec: &SpawnSpec, pid: Option<u32>) -> Result<(u32, i32), ProcessError> {
    let program = spec.program.display().to_string();
    let Some(pid) = pid else {
        return Err(ProcessError::Spawn {
            program,
            source: io::Error::other("the child's pid was not available right after spawn"),
        });
    };
    let pgid = i32::try_from(pid).map_err(|_| ProcessError::Spawn {
        program,
        source: io::Error::other(format!("pid {pid} does not fit a process group id")),
    })?;
    Ok((pid, pgid))
}
