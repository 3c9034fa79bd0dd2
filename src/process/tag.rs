//! The tag every agent process carries (`RALPH_AGENT_TAG=<run id>/<iteration>` in its
//! environment), so that ralph can find and kill exactly an iteration's processes, wherever they
//! moved (their own groups, setsid), and never a process group that merely reuses a recorded id.

/// Environment variable marking every process of an agent with `<run id>/<iteration>`.
pub const AGENT_TAG_VAR: &str = "RALPH_AGENT_TAG";

/// The value of [`AGENT_TAG_VAR`] for one iteration.
pub fn agent_tag(run_id: &str, iteration: u32) -> String {
    format!("{run_id}/{iteration}")
}

/// Whether `pid`'s environment carries `tag`.
fn carries(pid: i32, tag: &str) -> bool {
    let needle = format!("{AGENT_TAG_VAR}={tag}");
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
        .unwrap_or(false)
}

/// Whether any live process of group `pgid` carries `tag` in its environment, i.e. the group is
/// still the agent ralph started and not an unrelated group that reuses the id.
pub fn group_is_tagged(pgid: i32, tag: &str) -> bool {
    super::group_members(pgid)
        .into_iter()
        .any(|pid| carries(pid, tag))
}

/// SIGKILLs every live process carrying `tag` in its environment; returns how many were
/// signalled.
pub fn kill_tagged(tag: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        if carries(pid, tag)
            && nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
        {
            killed += 1;
        }
    }
    killed
}
