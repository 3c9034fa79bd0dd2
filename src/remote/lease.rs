//! The branch lease's format and rules, pure: what a lease commit says ([`LeaseCommit`], written
//! as `Ralph-Lease-*` trailers on an empty-tree commit at `refs/ralph/lease/<branch>` on the
//! remote) and whether this worker may take it ([`judge`]).
//!
//! Compare-and-swap on a plain git server: every new lease commit (taken, renewed, released) is
//! a child of the lease commit its writer last saw, pushed without force. A racing writer's
//! commit is a child of the same parent, so once one push has landed the other is not a
//! fast-forward and the remote refuses it (the client's check, and the server's own compare of
//! the old value when both pushes are in flight at once).

use chrono::{DateTime, Utc};

/// Trailer naming the branch the lease is for.
pub const TRAILER_BRANCH: &str = "Ralph-Lease-Branch";
/// Trailer: `held` or `released`.
pub const TRAILER_STATE: &str = "Ralph-Lease-State";
/// Trailer: when a held lease expires unless renewed (RFC 3339 UTC, holder's clock).
pub const TRAILER_EXPIRES: &str = "Ralph-Lease-Expires";
/// Trailer: the holder's host name.
pub const TRAILER_HOST: &str = "Ralph-Lease-Host";
/// Trailer: the holder's process id.
pub const TRAILER_PID: &str = "Ralph-Lease-Pid";
/// Trailer: the holder's scheduler job (Slurm job and array task, Kubernetes job and index,
/// GitHub Actions run), when it runs under one.
pub const TRAILER_JOB: &str = "Ralph-Lease-Job";
/// Trailer: the holder's machine and pid namespace (boot id, pid namespace), which tells
/// whether its pid can be checked from here.
pub const TRAILER_MACHINE: &str = "Ralph-Lease-Machine";
/// Trailer: a random token per ralph process: which lease commits are this process's own.
pub const TRAILER_TOKEN: &str = "Ralph-Lease-Token";
/// Trailer: the holder's run id.
pub const TRAILER_RUN: &str = "Ralph-Lease-Run";
/// Trailer on a release: when a usage limit the run stopped at resets (the next worker waits
/// for it, or exits 75 at once under `--no-wait`).
pub const TRAILER_RESUME_AT: &str = "Ralph-Resume-At";

/// Trailer on a release, one per limited agent of a run with fallback agents: `<agent name>
/// <reset, RFC 3339 UTC>` (`Ralph-Agent-Reset: claude 2026-12-01T14:00:00Z`). The next worker
/// takes each agent's reset as its own; a ralph from before per-agent resets ignores them and
/// reads [`TRAILER_RESUME_AT`], which a release still carries when every agent is limited.
pub const TRAILER_AGENT_RESET: &str = "Ralph-Agent-Reset";

/// The usage-limit resets a release hands on to the next worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resets {
    /// When the run may go on ([`TRAILER_RESUME_AT`]): the reset it stopped at or waited for
    /// (with fallback agents: the earliest, when every agent is limited).
    pub resume_at: Option<DateTime<Utc>>,
    /// Fallback agents: each limited agent's reset, by agent (profile) name
    /// ([`TRAILER_AGENT_RESET`]).
    pub agents: std::collections::BTreeMap<String, DateTime<Utc>>,
}

/// Who holds (or held) a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Host name.
    pub host: String,
    /// Process id of the ralph that holds it.
    pub pid: u32,
    /// Scheduler job, when known (see [`job_id`]).
    pub job: Option<String>,
    /// Boot id and pid namespace of the holder's machine (Linux), when known.
    pub machine: Option<String>,
    /// Random token of the holding process (hex).
    pub token: String,
    /// The holder's run id.
    pub run_id: Option<String>,
}

impl Holder {
    /// This process: host name, pid, scheduler job, machine, a fresh random token.
    pub fn me(run_id: &str) -> Holder {
        Holder {
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|n| n.into_string().ok())
                .unwrap_or_else(|| "unknown".to_owned()),
            pid: std::process::id(),
            job: job_id(&|k| std::env::var(k).ok()),
            machine: machine_id(),
            token: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            run_id: Some(run_id.to_owned()),
        }
    }

    /// `host web-1 pid 42 job slurm 17_2`: how messages name a holder.
    pub fn describe(&self) -> String {
        let mut s = format!("host {} pid {}", self.host, self.pid);
        if let Some(job) = &self.job {
            s.push_str(&format!(" job {job}"));
        }
        s
    }
}

/// Whether a lease is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Held until `expires`.
    Held,
    /// Given up by its holder: anyone may take it.
    Released,
}

/// One lease commit's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCommit {
    /// The branch.
    pub branch: String,
    /// Held or released.
    pub state: State,
    /// When a held lease lapses without a renewal.
    pub expires: DateTime<Utc>,
    /// The holder (for a release: who released it).
    pub holder: Holder,
    /// On a release: when the usage limit the run stopped at resets.
    pub resume_at: Option<DateTime<Utc>>,
    /// On a release of a run with fallback agents: each limited agent's reset, by name.
    pub agent_resets: std::collections::BTreeMap<String, DateTime<Utc>>,
}

impl LeaseCommit {
    /// The commit message: a subject naming the holder, then the trailers.
    pub fn message(&self) -> String {
        let h = &self.holder;
        let subject = match self.state {
            State::Held => format!("ralph lease: {} held by {}", self.branch, h.describe()),
            State::Released => format!("ralph lease: {} released by {}", self.branch, h.describe()),
        };
        let mut lines = vec![
            (TRAILER_BRANCH, self.branch.clone()),
            (
                TRAILER_STATE,
                match self.state {
                    State::Held => "held".to_owned(),
                    State::Released => "released".to_owned(),
                },
            ),
            (TRAILER_EXPIRES, stamp(self.expires)),
            (TRAILER_HOST, h.host.clone()),
            (TRAILER_PID, h.pid.to_string()),
        ];
        if let Some(job) = &h.job {
            lines.push((TRAILER_JOB, job.clone()));
        }
        if let Some(m) = &h.machine {
            lines.push((TRAILER_MACHINE, m.clone()));
        }
        if let Some(r) = &h.run_id {
            lines.push((TRAILER_RUN, r.clone()));
        }
        lines.push((TRAILER_TOKEN, h.token.clone()));
        if let Some(at) = self.resume_at {
            lines.push((TRAILER_RESUME_AT, stamp(at)));
        }
        for (agent, at) in &self.agent_resets {
            // A name is one word in the trailer (its last word is the time).
            let name = agent.split_whitespace().collect::<Vec<_>>().join("-");
            lines.push((TRAILER_AGENT_RESET, format!("{name} {}", stamp(*at))));
        }
        let one_line = |v: &str| v.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut message = format!("{}\n\n", one_line(&subject));
        for (k, v) in lines {
            message.push_str(&format!("{k}: {}\n", one_line(&v)));
        }
        message
    }

    /// Reads a lease commit's message; `None` when it is not one (a foreign commit at the
    /// lease ref counts as no lease ralph understands).
    pub fn parse(message: &str) -> Option<LeaseCommit> {
        let mut get = std::collections::BTreeMap::new();
        let mut agent_resets = std::collections::BTreeMap::new();
        for line in message.lines() {
            if let Some((k, v)) = line.split_once(": ") {
                if k == TRAILER_AGENT_RESET {
                    // `<name> <time>`; a line that is not one is skipped, not the lease.
                    let parsed = v.trim().rsplit_once(' ').and_then(|(name, at)| {
                        let at = DateTime::parse_from_rfc3339(at).ok()?;
                        Some((name.trim().to_owned(), at.with_timezone(&Utc)))
                    });
                    if let Some((name, at)) = parsed.filter(|(n, _)| !n.is_empty()) {
                        agent_resets.insert(name, at);
                    }
                } else if k.starts_with("Ralph-") {
                    get.insert(k.to_owned(), v.trim().to_owned());
                }
            }
        }
        let time = |k: &str| {
            get.get(k)
                .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
                .map(|t| t.with_timezone(&Utc))
        };
        Some(LeaseCommit {
            branch: get.get(TRAILER_BRANCH)?.clone(),
            state: match get.get(TRAILER_STATE)?.as_str() {
                "held" => State::Held,
                "released" => State::Released,
                _ => return None,
            },
            expires: time(TRAILER_EXPIRES)?,
            holder: Holder {
                host: get.get(TRAILER_HOST)?.clone(),
                pid: get.get(TRAILER_PID)?.parse().ok()?,
                job: get.get(TRAILER_JOB).cloned(),
                machine: get.get(TRAILER_MACHINE).cloned(),
                token: get.get(TRAILER_TOKEN)?.clone(),
                run_id: get.get(TRAILER_RUN).cloned(),
            },
            resume_at: time(TRAILER_RESUME_AT),
            agent_resets,
        })
    }
}

/// What this worker may do with the lease it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// No lease exists, or a commit ralph does not understand is there: take it.
    Free,
    /// Released by its last holder: take it.
    Released,
    /// It lapsed at `expires` without a renewal: take it over, with a warning.
    Expired {
        /// Who held it.
        holder: Holder,
        /// When it lapsed.
        expires: DateTime<Utc>,
    },
    /// Its holder ran on this machine (same boot and pid namespace) and its process is gone:
    /// take it over, with a warning.
    Abandoned {
        /// Who held it.
        holder: Holder,
    },
    /// This process holds it (its token): go on.
    Ours,
    /// Another live worker holds it until `expires`: do not touch the branch.
    Held {
        /// Who holds it.
        holder: Holder,
        /// When it lapses unless renewed.
        expires: DateTime<Utc>,
    },
}

/// Decides what `me` may do with `current` (the lease commit on the remote, if any) at `now`;
/// `pid_alive` says whether a pid on this machine is alive.
pub fn judge(
    current: Option<&LeaseCommit>,
    me: &Holder,
    now: DateTime<Utc>,
    pid_alive: &dyn Fn(u32) -> bool,
) -> Judgement {
    let Some(lease) = current else {
        return Judgement::Free;
    };
    if lease.holder.token == me.token {
        return Judgement::Ours;
    }
    if lease.state == State::Released {
        return Judgement::Released;
    }
    if lease.expires <= now {
        return Judgement::Expired {
            holder: lease.holder.clone(),
            expires: lease.expires,
        };
    }
    let same_machine = lease.holder.machine.is_some()
        && lease.holder.machine == me.machine
        && lease.holder.host == me.host;
    if same_machine && lease.holder.pid != me.pid && !pid_alive(lease.holder.pid) {
        return Judgement::Abandoned {
            holder: lease.holder.clone(),
        };
    }
    Judgement::Held {
        holder: lease.holder.clone(),
        expires: lease.expires,
    }
}

/// The scheduler job this process runs in, from the variables each engine sets: `RALPH_JOB_ID`
/// (set it yourself elsewhere), Slurm (`SLURM_ARRAY_JOB_ID`/`SLURM_ARRAY_TASK_ID`, else
/// `SLURM_JOB_ID`, with `SLURM_RESTART_COUNT`), a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`
/// with the pod's host name), GitHub Actions (`GITHUB_RUN_ID`, `GITHUB_RUN_ATTEMPT`,
/// `GITHUB_JOB`).
pub fn job_id(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(id) = get("RALPH_JOB_ID") {
        return Some(id);
    }
    let restart = get("SLURM_RESTART_COUNT")
        .map(|n| format!(" restart {n}"))
        .unwrap_or_default();
    if let (Some(array), Some(task)) = (get("SLURM_ARRAY_JOB_ID"), get("SLURM_ARRAY_TASK_ID")) {
        return Some(format!("slurm {array}_{task}{restart}"));
    }
    if let Some(job) = get("SLURM_JOB_ID") {
        return Some(format!("slurm {job}{restart}"));
    }
    if let Some(index) = get("JOB_COMPLETION_INDEX") {
        return Some(format!("k8s index {index}"));
    }
    if let Some(run) = get("GITHUB_RUN_ID") {
        return Some(format!(
            "github run {run} attempt {} job {}",
            get("GITHUB_RUN_ATTEMPT").unwrap_or_else(|| "1".into()),
            get("GITHUB_JOB").unwrap_or_else(|| "?".into())
        ));
    }
    None
}

/// `2026-12-01T12:00:00.000Z`: the format of the time trailers.
fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// This machine's boot id and pid namespace (`<boot id>/<pid ns inode>`), on Linux; `None`
/// elsewhere. Two processes with the same value see the same pids.
fn machine_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(token: &str) -> Holder {
        Holder {
            host: "node-1".into(),
            pid: 100,
            job: Some("slurm 7_1".into()),
            machine: Some("boot/pid:[1]".into()),
            token: token.into(),
            run_id: Some("r".into()),
        }
    }

    fn lease(state: State, expires_in_s: i64, token: &str) -> LeaseCommit {
        LeaseCommit {
            branch: "ralph/x".into(),
            state,
            expires: Utc::now() + chrono::Duration::seconds(expires_in_s),
            holder: holder(token),
            resume_at: None,
            agent_resets: Default::default(),
        }
    }

    #[test]
    fn the_message_round_trips() {
        let mut l = lease(State::Released, 60, "abc");
        l.expires = DateTime::parse_from_rfc3339("2026-12-01T12:00:00.000Z")
            .unwrap()
            .with_timezone(&Utc);
        l.resume_at = Some(l.expires);
        let msg = l.message();
        assert!(
            msg.starts_with(
                "ralph lease: ralph/x released by host node-1 pid 100 job slurm 7_1\n\n"
            ),
            "{msg}"
        );
        assert_eq!(LeaseCommit::parse(&msg), Some(l));
        assert_eq!(LeaseCommit::parse("a commit\n\nSigned-off-by: x\n"), None);
    }

    #[test]
    fn a_release_carries_each_agents_reset_and_an_old_release_still_reads() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let mut l = lease(State::Released, 60, "abc");
        l.expires = at("2026-12-01T12:00:00.000Z");
        l.resume_at = Some(at("2026-12-01T13:00:00.000Z"));
        l.agent_resets = [
            ("claude".to_owned(), at("2026-12-01T14:00:00.000Z")),
            ("backup".to_owned(), at("2026-12-01T13:00:00.000Z")),
        ]
        .into();
        let msg = l.message();
        assert!(
            msg.contains("Ralph-Agent-Reset: backup 2026-12-01T13:00:00.000Z\nRalph-Agent-Reset: claude 2026-12-01T14:00:00.000Z\n"),
            "{msg}"
        );
        assert!(
            msg.contains("Ralph-Resume-At: 2026-12-01T13:00:00.000Z\n"),
            "{msg}"
        );
        assert_eq!(LeaseCommit::parse(&msg), Some(l.clone()));
        // A release written before per-agent resets: its one reset, no agent's.
        let old: String = msg
            .lines()
            .filter(|line| !line.starts_with(TRAILER_AGENT_RESET))
            .map(|line| format!("{line}\n"))
            .collect();
        let read = LeaseCommit::parse(&old).unwrap();
        assert_eq!(read.resume_at, l.resume_at);
        assert!(read.agent_resets.is_empty());
        // A garbled agent line is skipped; the lease still reads.
        let garbled = old.replace(
            "Ralph-Resume-At",
            "Ralph-Agent-Reset: claude yesterday\nRalph-Resume-At",
        );
        let read = LeaseCommit::parse(&garbled).unwrap();
        assert!(read.agent_resets.is_empty());
        assert_eq!(read.resume_at, l.resume_at);
    }

    #[test]
    fn a_live_lease_of_another_is_held_an_expired_or_released_one_is_taken() {
        let me = Holder {
            pid: 200,
            token: "mine".into(),
            ..holder("mine")
        };
        let alive = |_: u32| true;
        let dead = |_: u32| false;
        let now = Utc::now();
        assert_eq!(judge(None, &me, now, &alive), Judgement::Free);
        assert!(matches!(
            judge(Some(&lease(State::Held, 60, "other")), &me, now, &alive),
            Judgement::Held { .. }
        ));
        assert!(matches!(
            judge(Some(&lease(State::Held, -1, "other")), &me, now, &alive),
            Judgement::Expired { .. }
        ));
        assert_eq!(
            judge(Some(&lease(State::Released, 60, "other")), &me, now, &alive),
            Judgement::Released
        );
        assert_eq!(
            judge(Some(&lease(State::Held, 60, "mine")), &me, now, &alive),
            Judgement::Ours
        );
        // Same machine and pid namespace, its process gone: abandoned.
        assert!(matches!(
            judge(Some(&lease(State::Held, 60, "other")), &me, now, &dead),
            Judgement::Abandoned { .. }
        ));
        // Another machine: its pid means nothing here, so only the expiry frees it.
        let elsewhere = Holder {
            machine: Some("other-boot/pid:[1]".into()),
            ..me.clone()
        };
        assert!(matches!(
            judge(
                Some(&lease(State::Held, 60, "other")),
                &elsewhere,
                now,
                &dead
            ),
            Judgement::Held { .. }
        ));
    }

    #[test]
    fn job_ids_come_from_each_scheduler() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            job_id(&env(&[
                ("SLURM_JOB_ID", "18"),
                ("SLURM_ARRAY_JOB_ID", "17"),
                ("SLURM_ARRAY_TASK_ID", "2"),
                ("SLURM_RESTART_COUNT", "1")
            ])),
            Some("slurm 17_2 restart 1".into())
        );
        assert_eq!(
            job_id(&env(&[("JOB_COMPLETION_INDEX", "4")])),
            Some("k8s index 4".into())
        );
        assert_eq!(
            job_id(&env(&[("GITHUB_RUN_ID", "9"), ("GITHUB_JOB", "ralph")])),
            Some("github run 9 attempt 1 job ralph".into())
        );
        assert_eq!(
            job_id(&env(&[("RALPH_JOB_ID", "mine"), ("SLURM_JOB_ID", "1")])),
            Some("mine".into())
        );
        assert_eq!(job_id(&env(&[])), None);
    }
}
