//! Finding and signalling an agent's process group, including descendants that left it.
//!
//! An agent runs in its own process group (pgid = the agent's pid), so one `killpg` reaches it and
//! every tool it started. Tools may still leave the group with `setsid`/`setpgid` (daemons, dev
//! servers); on Linux those are found, best effort, by walking parent links in `/proc/*/stat`
//! from the group's members before each signal, and are signalled one by one. A process that
//! escaped *and* lost its parent before we looked (reparented to init) cannot be found this way.
//!
//! Zombies (state `Z`/`X`) count as gone everywhere here: they hold no pipes and run nothing, and
//! in a container whose PID 1 never reaps they would otherwise look alive forever.

use std::collections::HashSet;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// How often [`kill_group`] checks whether the group is gone.
const POLL: Duration = Duration::from_millis(25);

/// How long [`kill_group`] waits for the kernel to remove SIGKILLed processes.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(2);

/// Whether a live (non-zombie) process is in process group `pgid`.
///
/// Reads `/proc` on Linux; elsewhere asks the kernel with `killpg(pgid, 0)`, which also counts
/// zombies. `pgid <= 1` is never a valid agent group and returns `false`.
pub fn group_alive(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // One syscall answers the usual case (the group is gone, zombies and all) without reading
    // every process; EPERM means it exists but belongs to someone else.
    if matches!(killpg(Pid::from_raw(pgid), None), Err(Errno::ESRCH)) {
        return false;
    }
    match proc_stats() {
        Some(stats) => stats.iter().any(|s| s.pgrp == pgid && s.is_live()),
        None => true,
    }
}

/// Pids of the live (non-zombie) processes in process group `pgid`, ascending.
///
/// Read from `/proc/*/stat` (see proc(5)); empty on systems without `/proc` and for `pgid <= 1`.
/// Meant for tests and diagnostics: the answer can be stale the moment it returns.
pub fn group_members(pgid: i32) -> Vec<i32> {
    if pgid <= 1 {
        return Vec::new();
    }
    let mut pids: Vec<i32> = proc_stats()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.pgrp == pgid && s.is_live())
        .map(|s| s.pid)
        .collect();
    pids.sort_unstable();
    pids
}

/// Ends process group `pgid`: SIGTERM, up to `grace` for it to exit, then SIGKILL.
///
/// For a group recorded by an earlier ralph that was itself SIGKILLed, so its agent outlived it.
/// Descendants that left the group are signalled too (Linux, best effort). Returns once no live
/// member is left, or about 2 s after the SIGKILL if the kernel is slow to remove them. A group
/// that is already gone is a no-op. `pgid <= 1` and ralph's own group are refused (logged), since
/// signalling them would hit unrelated processes or ralph itself.
///
/// The caller must make sure `pgid` still names the agent's group (pids are reused); checking
/// that the group is alive and was recorded recently is the usual guard.
pub async fn kill_group(pgid: i32, grace: Duration) {
    if pgid <= 1 || pgid == nix::unistd::getpgrp().as_raw() {
        tracing::warn!(pgid, "refusing to signal process group: not an agent group");
        return;
    }
    if !group_alive(pgid) {
        return;
    }
    let mut tree = Tree::new(pgid);
    tree.signal(Signal::SIGTERM);
    if !wait_gone(pgid, grace).await {
        tree.signal(Signal::SIGKILL);
        wait_gone(pgid, AFTER_KILL_WAIT).await;
    }
}

/// Polls until group `pgid` has no live member; `false` if `limit` passed first.
async fn wait_gone(pgid: i32, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One agent's process group plus the descendants seen leaving it.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The group id (= the agent's pid).
    pgid: i32,
    /// Descendants outside the group: `(pid, start time)`, the start time guarding against pid
    /// reuse between the scan and a later signal.
    escaped: Vec<(i32, u64)>,
}

impl Tree {
    /// The tree rooted at group `pgid`; nothing is scanned yet.
    pub(crate) fn new(pgid: i32) -> Self {
        Tree {
            pgid,
            escaped: Vec::new(),
        }
    }

    /// Sends `signal` to the group and to every known or newly found escaped descendant.
    ///
    /// "No such process" counts as success; other errors are logged, since there is nothing
    /// better to do with them mid-shutdown.
    pub(crate) fn signal(&mut self, signal: Signal) {
        // A group without any member (not even a zombie) has no member to walk down from:
        // nothing new can be found, so only the escapees already known are signalled.
        let group_empty = matches!(killpg(Pid::from_raw(self.pgid), None), Err(Errno::ESRCH));
        if group_empty && self.escaped.is_empty() {
            return;
        }
        if !group_empty {
            self.scan();
        }
        match killpg(Pid::from_raw(self.pgid), signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => {
                tracing::warn!(pgid = self.pgid, ?signal, %err, "could not signal process group")
            }
        }
        for &(pid, start) in &self.escaped {
            let still_same = read_stat(pid).is_some_and(|s| s.start_time == start && s.is_live());
            if !still_same {
                continue;
            }
            tracing::debug!(
                pid,
                pgid = self.pgid,
                ?signal,
                "signalling a descendant that left the group"
            );
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(err) => {
                    tracing::warn!(pid, ?signal, %err, "could not signal escaped descendant")
                }
            }
        }
    }

    /// Blocks until no live process is left in the group or among the escaped descendants
    /// already found, polling `/proc` every 25 ms; `false` if `limit` passed first.
    ///
    /// Death after SIGKILL is asynchronous: a killed process closes its pipes before it is
    /// removed, so a caller that promises "nothing of the command stays" waits here.
    pub(crate) fn wait_gone_blocking(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let escaped_live = self.escaped.iter().any(|&(pid, start)| {
                read_stat(pid).is_some_and(|s| s.start_time == start && s.is_live())
            });
            if !escaped_live && !group_alive(self.pgid) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Records live descendants of the group's members that are not in the group.
    fn scan(&mut self) {
        let Some(stats) = proc_stats() else {
            return;
        };
        let mut frontier: Vec<i32> = stats
            .iter()
            .filter(|s| s.pgrp == self.pgid)
            .map(|s| s.pid)
            .collect();
        // Walk down from the members alive now: the kernel reparents a dead process's children
        // at once, so links through processes that already exited are lost.
        let mut seen: HashSet<i32> = frontier.iter().copied().collect();
        while let Some(parent) = frontier.pop() {
            for child in stats.iter().filter(|s| s.ppid == parent) {
                if !seen.insert(child.pid) {
                    continue;
                }
                frontier.push(child.pid);
                let outside = child.pgrp != self.pgid;
                let known = self.escaped.iter().any(|&(pid, _)| pid == child.pid);
                if outside && child.is_live() && !known {
                    self.escaped.push((child.pid, child.start_time));
                }
            }
        }
    }
}

/// The fields of `/proc/<pid>/stat` this module needs.
#[derive(Debug, Clone, Copy)]
struct Stat {
    pid: i32,
    /// One of `R S D Z T t X I ...`, see proc(5).
    state: u8,
    ppid: i32,
    pgrp: i32,
    /// Clock ticks after boot; with `pid` it identifies a process across pid reuse.
    start_time: u64,
}

impl Stat {
    fn is_live(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x')
    }
}

/// Reads `/proc/<pid>/stat`; `None` if the process is gone or the format is unexpected.
fn read_stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses one `/proc/<pid>/stat` line (proc(5)): `pid (comm) state ppid pgrp ... starttime ...`.
///
/// `comm` may hold spaces and parentheses, so fields are counted from the *last* `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    // Fields 3.. of proc(5); index 0 here is field 3 (state), so field N is index N - 3.
    let fields: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    Some(Stat {
        pid,
        state: *fields.first()?.as_bytes().first()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Every process's stat; `None` when `/proc` cannot be read (not Linux, or not mounted).
fn proc_stats() -> Option<Vec<Stat>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let stats = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect();
    Some(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_and_parens_in_comm() {
        let line =
            "4242 (my (odd) cmd) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 100 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = parse_stat(line).expect("valid stat line");
        assert_eq!(stat.pid, 4242);
        assert_eq!(stat.state, b'S');
        assert_eq!(stat.ppid, 17);
        assert_eq!(stat.pgrp, 4242);
        assert_eq!(stat.start_time, 987654);
        assert!(stat.is_live());
    }

    #[test]
    fn zombie_is_not_live_and_garbage_is_rejected() {
        let line = "7 (z) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(!parse_stat(line).expect("valid").is_live());
        assert!(parse_stat("not a stat line").is_none());
        assert!(parse_stat("1 (x) S 1").is_none());
    }

    #[test]
    fn reads_own_process() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return; // not Linux
        }
        let me = std::process::id() as i32;
        let stat = read_stat(me).expect("own stat");
        assert_eq!(stat.pid, me);
        assert_eq!(stat.pgrp, nix::unistd::getpgrp().as_raw());
        assert!(group_members(stat.pgrp).contains(&me));
    }

    #[test]
    fn refuses_special_groups() {
        assert!(!group_alive(0));
        assert!(!group_alive(1));
        assert!(group_members(-5).is_empty());
    }
}
