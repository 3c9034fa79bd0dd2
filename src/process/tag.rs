//! Tagging an agent's processes through their environment, and finding them again by that tag.
//!
//! Every process an agent starts inherits its environment, so `RALPH_AGENT_TAG=<run id>/<iteration>`
//! set on the agent marks the whole tree, including processes that left the agent's process group
//! (`setsid`, a daemonized dev server) and those whose parent already died. Linux only (the tag is
//! read from `/proc/<pid>/environ`); elsewhere nothing is found. A process that cleared or
//! replaced its environment before `exec` is not found either.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::SpawnSpec;

/// Environment variable marking every process of an agent with `<run id>/<iteration>`.
pub const AGENT_TAG_VAR: &str = "RALPH_AGENT_TAG";

/// The value of [`AGENT_TAG_VAR`] for one iteration of one run.
pub fn agent_tag(run_id: &str, iteration: u32) -> String {
    format!("{run_id}/{iteration}")
}

impl SpawnSpec {
    /// Sets [`AGENT_TAG_VAR`] to `tag` (replacing a value already set), so that [`kill_tagged`]
    /// and [`group_is_tagged`] can find the process and everything it starts.
    pub fn set_tag(&mut self, tag: &str) {
        self.env_set.retain(|(name, _)| name != AGENT_TAG_VAR);
        self.env_set
            .push((AGENT_TAG_VAR.to_owned(), tag.to_owned()));
    }
}

/// Whether any live process of group `pgid` carries `tag` in its environment, i.e. the group is
/// still the agent ralph started and not an unrelated group that reuses the id (pids are reused).
pub fn group_is_tagged(pgid: i32, tag: &str) -> bool {
    let needle = needle(tag);
    super::group_members(pgid)
        .into_iter()
        .any(|pid| carries(pid, &needle))
}

/// SIGKILLs every live process carrying `tag` in its environment (ralph itself excepted), in any
/// process group; returns how many were signalled.
///
/// For what an agent left running after it exited, or what an agent of a ralph that was killed
/// left behind: once the agent is gone its descendants are no longer linked to it by parent or
/// group, but they still carry its tag.
pub fn kill_tagged(tag: &str) -> usize {
    let needle = needle(tag);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id() as i32;
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me || !carries(pid, &needle) {
            continue;
        }
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            tracing::debug!(pid, tag, "killed a process carrying the agent tag");
            killed += 1;
        }
    }
    killed
}

/// `RALPH_AGENT_TAG=<tag>` as it appears in `/proc/<pid>/environ`.
fn needle(tag: &str) -> Vec<u8> {
    format!("{AGENT_TAG_VAR}={tag}").into_bytes()
}

/// Whether process `pid`'s environment holds the exact entry `needle`; `false` when it cannot be
/// read (gone, or another user's).
fn carries(pid: i32, needle: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_names_the_run_and_iteration_and_replaces_an_old_one() {
        assert_eq!(agent_tag("20250101-abc", 7), "20250101-abc/7");
        let mut spec = SpawnSpec::default();
        spec.set_tag("a/1");
        spec.set_tag("a/2");
        assert_eq!(spec.env_set, [(AGENT_TAG_VAR.to_owned(), "a/2".to_owned())]);
    }

    #[test]
    fn an_unknown_tag_finds_nothing() {
        let tag = format!("no-such-run-{}/1", std::process::id());
        assert_eq!(kill_tagged(&tag), 0);
        assert!(!group_is_tagged(nix::unistd::getpgrp().as_raw(), &tag));
    }
}
