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

/// The start of `GIT_REFLOG_ACTION` in a tagged process ([`SpawnSpec::set_tag`]): the reflog
/// entries git writes for its commits read `ralph agent <run id>/<iteration>: <subject>`.
pub const REFLOG_ACTION_PREFIX: &str = "ralph agent ";

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
        // git writes this as the reflog message's prefix of a commit, a reset, a merge: a
        // commit an agent makes in the user's checkout (`git -C <checkout> commit`) is then
        // told from the user's own by the checkout's HEAD reflog (run/parallel/land.rs).
        self.env_set.retain(|(name, _)| name != "GIT_REFLOG_ACTION");
        self.env_set.push((
            "GIT_REFLOG_ACTION".to_owned(),
            format!("{REFLOG_ACTION_PREFIX}{tag}"),
        ));
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
    sweep_tagged(tag).len()
}

/// A process a sweep killed: its pid and command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stray {
    /// Its process id.
    pub pid: u32,
    /// Its command line (`/proc/<pid>/cmdline`, arguments joined by spaces), read before the
    /// kill; empty when it could not be read.
    pub command: String,
}

/// [`kill_tagged`], returning what it killed, for the iteration's record.
pub fn sweep_tagged(tag: &str) -> Vec<Stray> {
    kill_matching(tag, |_| true)
}

/// How many processes (and threads) the machine has forked since boot: the `processes` line of
/// `/proc/stat` (proc(5)); `None` where it cannot be read.
pub fn fork_count() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("processes "))
        .and_then(|n| n.trim().parse().ok())
}

/// [`kill_tagged`] for what an agent that just exited left running, reading only the processes
/// that can be its own: Linux hands out pids upwards from the agent's own `first_pid` (skipping
/// pids in use) up to the most recently created pid (`/proc/loadavg`), so as long as pids did
/// not wrap around since the spawn, everything the agent started has a pid in that window.
/// Wrapping is ruled out when the last pid is not below `first_pid` and fewer than half of
/// `pid_max` forks happened on the machine since `forks_before` (see [`fork_count`]): a full
/// cycle needs more. Otherwise (or where `/proc` does not tell) every process is read, as
/// [`kill_tagged`] does. Returns how many were signalled.
pub fn kill_tagged_since(tag: &str, first_pid: u32, forks_before: Option<u64>) -> usize {
    sweep_tagged_since(tag, first_pid, forks_before).len()
}

/// [`kill_tagged_since`], returning what it killed, for the iteration's record.
pub fn sweep_tagged_since(tag: &str, first_pid: u32, forks_before: Option<u64>) -> Vec<Stray> {
    let window =
        forks_before
            .zip(fork_count())
            .zip(last_pid())
            .and_then(|((before, now), last)| {
                let forks = now.checked_sub(before)?;
                (last >= first_pid && forks < pid_max() / 2).then_some(last)
            });
    match window {
        Some(last) => kill_matching(tag, |pid| (first_pid..=last).contains(&pid)),
        None => sweep_tagged(tag),
    }
}

/// The most recently created pid on the machine: the last field of `/proc/loadavg` (proc(5)).
fn last_pid() -> Option<u32> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_ascii_whitespace()
        .nth(4)?
        .parse()
        .ok()
}

/// The kernel's `pid_max` (`/proc/sys/kernel/pid_max`), read once; 32768 (the smallest default)
/// when unreadable, which only makes [`kill_tagged_since`] fall back to a full scan sooner.
fn pid_max() -> u64 {
    static PID_MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PID_MAX.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(32_768)
    })
}

/// SIGKILLs the processes among `pids` that carry `tag` (ralph itself excepted); returns them.
fn kill_matching_pids(tag: &str, pids: impl Iterator<Item = i32>) -> Vec<Stray> {
    let needle = needle(tag);
    let me = std::process::id() as i32;
    let mut killed = Vec::new();
    for pid in pids {
        if pid == me || !carries(pid, &needle) {
            continue;
        }
        let command = command_line(pid);
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            tracing::debug!(pid, tag, command, "killed a process carrying the agent tag");
            killed.push(Stray {
                pid: pid.unsigned_abs(),
                command,
            });
        }
    }
    killed
}

/// Process `pid`'s command line (`/proc/<pid>/cmdline`), arguments joined by spaces; empty when
/// it cannot be read (gone, another user's, or not Linux).
pub fn command_line(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(String::from_utf8_lossy)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// SIGKILLs every listed process for which `wanted(pid)` holds and that carries `tag`.
fn kill_matching(tag: &str, wanted: impl Fn(u32) -> bool) -> Vec<Stray> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids = entries.flatten().filter_map(|entry| {
        entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|pid| wanted(*pid))
            .and_then(|pid| i32::try_from(pid).ok())
    });
    kill_matching_pids(tag, pids)
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
        assert_eq!(
            spec.env_set,
            [
                (AGENT_TAG_VAR.to_owned(), "a/2".to_owned()),
                ("GIT_REFLOG_ACTION".to_owned(), "ralph agent a/2".to_owned())
            ]
        );
    }

    #[test]
    fn a_tagged_process_the_agent_left_is_found_in_its_pid_window() {
        let tag = format!("window-test-{}/1", std::process::id());
        let before = fork_count();
        assert!(before.is_some(), "/proc/stat has no processes line");
        // The "agent" (sh) starts a background sleep that outlives it, then exits.
        let mut agent = std::process::Command::new("sh")
            .args(["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
            .env(AGENT_TAG_VAR, &tag)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let first = agent.id();
        let mut out = String::new();
        std::io::Read::read_to_string(agent.stdout.as_mut().unwrap(), &mut out).unwrap();
        agent.wait().unwrap();
        let stray: i32 = out.trim().parse().unwrap();
        let swept = sweep_tagged_since(&tag, first, before);
        assert_eq!(
            swept,
            [Stray {
                pid: stray as u32,
                command: "sleep 30".into()
            }]
        );
        // Reaped by init or a subreaper; wait until it is no longer a live process.
        let gone_by = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{stray}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                std::time::Instant::now() < gone_by,
                "the stray sleep survived"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(kill_tagged_since(&tag, first, before), 0);
    }

    #[test]
    fn an_unknown_tag_finds_nothing() {
        let tag = format!("no-such-run-{}/1", std::process::id());
        assert_eq!(kill_tagged(&tag), 0);
        assert!(!group_is_tagged(nix::unistd::getpgrp().as_raw(), &tag));
    }
}
