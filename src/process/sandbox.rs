//! `--sandbox fs|strict`: the agent and the verify commands run inside bubblewrap (`bwrap`).
//!
//! [`wrap`] is pure: it turns a [`SpawnSpec`] into the spec of `bwrap … -- <program> <args>`
//! from the paths in [`Roots`]. [`Roots::discover`] finds those paths (the git directories, the
//! run branch, ralph's books) and [`probe`] says whether bwrap works on this machine.
//!
//! The mount table, in bwrap's order (a later mount covers an earlier one):
//! 1. `/` read-only, a fresh `/dev` and `/proc` (of the new PID namespace), a private `/tmp`,
//!    for a worktree inside its main checkout (a `--parallel` worker's) the main checkout
//!    hidden behind an empty tmpfs (read-only once the rest is bound), the user's
//!    `sandbox_writable` paths read-write;
//! 2. `$HOME` an empty tmpfs, then the backend's state paths (`~/.claude`, `~/.codex`, …)
//!    bound read-write onto the host copies (a token refresh lands there) and `~/.gitconfig`
//!    read-only (the agent's commits keep the user's name);
//! 3. the worktree read-write;
//! 4. git: the git directory read-write (git writes `index.lock` and `COMMIT_EDITMSG` beside
//!    it), then read-only again: `config`, `hooks`, `info`, `HEAD`, `packed-refs`, `refs`
//!    (ralph's `refs/ralph/*` pins, tags and other branches), and read-write again the
//!    directory holding the run branch's ref (`refs/heads/<branch>` and its `.lock`). A linked
//!    worktree's common directory is read-only but for the branch's ref and reflog
//!    directories; a linked worktree on a detached HEAD (a `--parallel` worker's) has no branch
//!    there and commits by moving its own `HEAD`, which is writable. So an agent can commit on
//!    the run branch (or its worker's HEAD), and cannot add a hook or a remote, move the
//!    checkout's `HEAD` or touch other branches and ralph's refs;
//! 5. ralph's books (`.ralph/`) read-only;
//! 6. strict: the egress proxy's unix socket at [`PROXY_SOCKET`].
//!
//! Then `--unshare-pid` (the agent cannot see or signal ralph), `--unshare-net` (strict: only
//! loopback), `--new-session` (no `TIOCSTI` into ralph's terminal), `--die-with-parent`, and
//! `--cap-drop ALL` (as root, bwrap otherwise keeps every capability, and a root agent could
//! remount `/` read-write).
//!
//! The environment is an allowlist ([`allowed_env`]): PATH, HOME, the user and locale names,
//! TERM, proxies and CA bundles (fs), `RALPH_*` but for `RALPH_GIT_TOKEN`, and the backend's
//! own prefixes; every other inherited variable is removed.

use std::path::{Path, PathBuf};

use crate::protocol::SandboxMode;

use super::SpawnSpec;

/// Where the egress proxy's unix socket appears inside a strict sandbox (in its private /tmp).
pub const PROXY_SOCKET: &str = "/tmp/.ralph-egress.sock";
/// The folder, in the common git directory, that takes the objects git writes inside a sandbox
/// (`GIT_OBJECT_DIRECTORY`); `objects/` itself is read-only there, so an agent cannot delete or
/// rewrite the history it did not write. ralph moves what it finds there into `objects/` before
/// each sandboxed process starts, and git outside reads it meanwhile through
/// `objects/info/alternates` ([`settle_agent_objects`]).
pub const AGENT_OBJECTS: &str = "ralph-agent-objects";
/// The loopback port inside a strict sandbox where the bridge takes proxy connections
/// (`HTTPS_PROXY=http://127.0.0.1:<port>`).
pub const PROXY_PORT: u16 = 3128;

/// Inherited variables that pass into every sandbox by exact name.
pub const BASE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "TZ",
];
/// Inherited variables that pass by prefix: the locale, ralph's own settings.
pub const BASE_PREFIXES: &[&str] = &["LC_", "RALPH_", "XDG_CONFIG_HOME", "XDG_DATA_HOME"];
/// Inherited variables that pass in `fs` mode only: the user's proxies and CA bundles (strict
/// sets its own proxy).
pub const FS_ONLY_ENV: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];
/// CA bundle variables, passed in both modes (a corporate CA must keep working).
pub const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];
/// Language toolchains under `$HOME`, bound read-only when they exist, so that the agent's and
/// the checks' `python3`, `node`, `cargo` … resolve as outside (pyenv's shims need its
/// versions, cargo's proxies need `~/.rustup`). Package caches that must be written (cargo's
/// registry, npm's cache) are the user's to add with `sandbox_writable`.
pub const TOOLCHAINS: &[&str] = &[
    ".rustup",
    ".cargo/bin",
    ".pyenv",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    ".asdf",
    ".sdkman",
    ".local/bin",
    ".npm-global",
    "go/bin",
];
/// Never passed, whatever prefix would let them in: `--push`'s token.
pub const NEVER_ENV: &[&str] = &["RALPH_GIT_TOKEN"];

/// The paths and facts [`wrap`] builds the sandbox from. Absolute paths throughout.
#[derive(Debug, Clone, Default)]
pub struct Roots {
    /// The `bwrap` program.
    pub bwrap: PathBuf,
    /// The worktree (read-write; the agent's working directory is in it).
    pub worktree: PathBuf,
    /// The git directory of the worktree (`.git`, or `<common>/worktrees/<name>`), when it is
    /// a repository.
    pub git_dir: Option<PathBuf>,
    /// The common git directory (the same as `git_dir` outside linked worktrees).
    pub git_common_dir: Option<PathBuf>,
    /// The run branch's full ref (`refs/heads/ralph/x`), when HEAD is on a branch.
    pub branch_ref: Option<String>,
    /// ralph's books (the `.ralph/` directory), bound read-only.
    pub books: Vec<PathBuf>,
    /// `$HOME`, hidden behind an empty tmpfs.
    pub home: Option<PathBuf>,
    /// The backend's state paths under `$HOME` that exist on the host, bound read-write.
    pub state: Vec<PathBuf>,
    /// Paths under `$HOME` bound read-only when they exist (`~/.gitconfig`).
    pub home_readable: Vec<PathBuf>,
    /// More paths bound read-only (an agent program a private /tmp or the hidden home would
    /// hide).
    pub extra_readable: Vec<PathBuf>,
    /// Links created inside, `(target, link)`: an agent program reached through a link in a
    /// hidden place.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// The user's extra writable paths (`sandbox_writable`: a package cache, a shared
    /// directory), bound read-write before `$HOME` is hidden (so one holding `$HOME` does not
    /// show it).
    pub writable: Vec<PathBuf>,
    /// The names of every variable in ralph's environment.
    pub inherited: Vec<String>,
    /// The backend's own variable prefixes (`ANTHROPIC_`, `CLAUDE_`, …).
    pub env_prefixes: Vec<String>,
    /// strict: the egress proxy's socket on the host and the loopback ports the bridge forwards
    /// to the same port on the host (a model server on the host's loopback).
    pub egress: Option<EgressEnd>,
    /// Folders hidden behind an empty tmpfs that is made read-only once everything else is
    /// bound (what is bound into them stays as bound). A linked worktree inside its main
    /// checkout (`--parallel`'s `.ralph/worktrees/<run>/<story>-<n>`) hides the main checkout:
    /// its files, ralph's books and the other workers' worktrees are not visible, and a write
    /// there fails with `Read-only file system`.
    pub hidden: Vec<PathBuf>,
}

/// The host end of a strict sandbox's network (see [`Roots::egress`]).
#[derive(Debug, Clone, Default)]
pub struct EgressEnd {
    /// The proxy's unix socket on the host.
    pub socket: PathBuf,
    /// The ralph executable that runs the bridge inside (`ralph __bridge`).
    pub ralph: PathBuf,
    /// Loopback ports forwarded to the host's loopback (allowed `127.0.0.1:<port>` hosts).
    pub forwards: Vec<u16>,
}

/// The sandboxed spec of `spec` in `mode` (see the module docs). `Off` returns `spec`
/// unchanged. The program, arguments, working directory and stdin are kept; the environment
/// is cut down to [`allowed_env`].
pub fn wrap(spec: SpawnSpec, mode: SandboxMode, roots: &Roots) -> SpawnSpec {
    if !mode.is_on() {
        return spec;
    }
    let mut a = Args::default();
    a.push(["--ro-bind", "/", "/"]);
    a.push(["--dev", "/dev"]);
    a.push(["--proc", "/proc"]);
    a.push(["--tmpfs", "/tmp"]);
    for path in &roots.hidden {
        a.path1("--tmpfs", path);
    }
    for path in &roots.writable {
        a.path2("--bind-try", path);
    }
    if let Some(home) = &roots.home {
        a.path1("--tmpfs", home);
        for path in &roots.state {
            a.path2("--bind", path);
        }
        for path in &roots.home_readable {
            a.path2("--ro-bind-try", path);
        }
    }
    for path in &roots.extra_readable {
        a.path2("--ro-bind-try", path);
    }
    for (target, link) in &roots.links {
        a.args.push("--symlink".into());
        a.args.push(target.to_string_lossy().into_owned());
        a.args.push(link.to_string_lossy().into_owned());
    }
    a.path2("--bind", &roots.worktree);
    // ralph's own settings in the tree are the user's: an agent that could write
    // `sandbox = "off"` there would run unconfined from the next run on.
    a.path2("--ro-bind-try", &roots.worktree.join(CONFIG_FILE));
    git_mounts(&mut a, roots);
    for books in &roots.books {
        a.path2("--ro-bind-try", books);
    }
    // Not recursive: the mounts inside (the worktree, the git directory) keep their own modes.
    for path in &roots.hidden {
        a.path1("--remount-ro", path);
    }
    if mode == SandboxMode::Strict {
        if let Some(egress) = &roots.egress {
            a.args.push("--bind".into());
            a.args.push(egress.socket.to_string_lossy().into_owned());
            a.args.push(PROXY_SOCKET.into());
        }
        a.push(["--unshare-net"]);
    }
    a.push(["--unshare-pid", "--new-session", "--die-with-parent"]);
    a.push(["--cap-drop", "ALL"]);
    if !spec.cwd.as_os_str().is_empty() {
        a.path1("--chdir", &spec.cwd);
    }
    a.push(["--"]);
    if let (SandboxMode::Strict, Some(egress)) = (mode, &roots.egress) {
        a.args.push(egress.ralph.to_string_lossy().into_owned());
        a.args.push(BRIDGE_SUBCOMMAND.into());
        for port in &egress.forwards {
            a.args.push(format!("--forward={port}"));
        }
        a.args.push("--".into());
    }
    a.args.push(spec.program.to_string_lossy().into_owned());
    a.args.extend(spec.args.iter().cloned());

    let (env_remove, mut env_set) = allowed_env(&spec, mode, roots);
    if let Some(common) = &roots.git_common_dir {
        for (name, value) in [
            ("GIT_OBJECT_DIRECTORY", common.join(AGENT_OBJECTS)),
            ("GIT_ALTERNATE_OBJECT_DIRECTORIES", common.join("objects")),
        ] {
            env_set.retain(|(n, _)| n != name);
            env_set.push((name.to_owned(), value.to_string_lossy().into_owned()));
        }
    }
    if mode == SandboxMode::Strict {
        let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
        for name in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            env_set.retain(|(n, _)| n != name);
            env_set.push((name.to_owned(), proxy.clone()));
        }
        // The loopback is the sandbox's own: the forwarded ports answer there directly.
        for name in ["NO_PROXY", "no_proxy"] {
            env_set.retain(|(n, _)| n != name);
            env_set.push((name.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
        }
    }
    SpawnSpec {
        program: roots.bwrap.clone(),
        args: a.args,
        cwd: spec.cwd,
        env_remove,
        env_set,
        stdin: spec.stdin,
    }
}

/// The hidden subcommand that runs the strict sandbox's bridge (`ralph __bridge`).
pub const BRIDGE_SUBCOMMAND: &str = "__bridge";

/// The environment of a sandboxed spec: `(removed, set)`. Every inherited name that is not
/// allowed is removed (with the spec's own removals); the spec's own settings are kept, but for
/// [`NEVER_ENV`]. Allowed: [`BASE_ENV`], [`BASE_PREFIXES`], [`CA_ENV`], [`FS_ONLY_ENV`] in `fs`
/// mode, and the backend's [`Roots::env_prefixes`].
pub fn allowed_env(
    spec: &SpawnSpec,
    mode: SandboxMode,
    roots: &Roots,
) -> (Vec<String>, Vec<(String, String)>) {
    let allowed = |name: &str| {
        !NEVER_ENV.contains(&name)
            && !spec.env_remove.iter().any(|r| r == name)
            && (BASE_ENV.contains(&name)
                || CA_ENV.contains(&name)
                || (mode == SandboxMode::Fs && FS_ONLY_ENV.contains(&name))
                || BASE_PREFIXES.iter().any(|p| name.starts_with(p))
                || roots
                    .env_prefixes
                    .iter()
                    .any(|p| name.starts_with(p.as_str())))
    };
    let mut removed: Vec<String> = roots
        .inherited
        .iter()
        .filter(|name| !allowed(name))
        .cloned()
        .collect();
    for name in &spec.env_remove {
        if !removed.contains(name) {
            removed.push(name.clone());
        }
    }
    for name in NEVER_ENV {
        if !removed.iter().any(|r| r == name) {
            removed.push((*name).to_owned());
        }
    }
    // Temporary directories of the host are not there: the private /tmp is.
    for name in ["TMPDIR", "TMP", "TEMP"] {
        if roots.inherited.iter().any(|n| n == name) && !removed.iter().any(|r| r == name) {
            removed.push(name.to_owned());
        }
    }
    let set = spec
        .env_set
        .iter()
        .filter(|(n, _)| !NEVER_ENV.contains(&n.as_str()))
        .cloned()
        .collect();
    (removed, set)
}

/// The git part of the mount table (module docs, step 4).
fn git_mounts(a: &mut Args, roots: &Roots) {
    let (Some(git_dir), Some(common)) = (&roots.git_dir, &roots.git_common_dir) else {
        return;
    };
    let linked = common != git_dir;
    // Read-write where git writes for a commit …
    if linked {
        a.path2("--ro-bind", common);
        // The branch's reflog (a detached HEAD's is in the worktree's own git directory).
        if let Some(parent) = roots
            .branch_ref
            .as_ref()
            .and_then(|b| common.join("logs").join(b).parent().map(Path::to_path_buf))
        {
            a.path2("--bind-try", &parent);
        }
    }
    a.path2("--bind", git_dir);
    // The history is read-only; new objects go to the agent's own folder (AGENT_OBJECTS).
    a.path2("--ro-bind-try", &common.join("objects"));
    a.path2("--bind-try", &common.join(AGENT_OBJECTS));
    // … read-only where a change would reach ralph or the user outside the sandbox …
    let dirs: &[&PathBuf] = if common == git_dir {
        &[git_dir]
    } else {
        &[git_dir, common]
    };
    for dir in dirs {
        for name in [
            "config",
            "config.worktree",
            "hooks",
            "info",
            "HEAD",
            "packed-refs",
            "refs",
            "commondir",
            "gitdir",
        ] {
            // A linked worktree on a detached HEAD (a `--parallel` worker's) commits by moving
            // its own HEAD: that one file is its branch, and git replaces it by a rename, which
            // a file bound on its own would refuse.
            if name == "HEAD" && linked && *dir == git_dir && roots.branch_ref.is_none() {
                continue;
            }
            a.path2("--ro-bind-try", &dir.join(name));
        }
    }
    // … and read-write again where the run branch's ref lives.
    if let Some(branch) = &roots.branch_ref {
        let dir = common.join(branch);
        if let Some(parent) = dir.parent() {
            a.path2("--bind-try", parent);
        }
    }
}

/// bwrap's argument list being built.
#[derive(Default)]
struct Args {
    args: Vec<String>,
}

impl Args {
    fn push<const N: usize>(&mut self, words: [&str; N]) {
        self.args.extend(words.iter().map(|w| (*w).to_owned()));
    }

    fn path1(&mut self, option: &str, path: &Path) {
        self.args.push(option.to_owned());
        self.args.push(path.to_string_lossy().into_owned());
    }

    fn path2(&mut self, option: &str, path: &Path) {
        let p = path.to_string_lossy().into_owned();
        self.args.push(option.to_owned());
        self.args.push(p.clone());
        self.args.push(p);
    }
}

impl Roots {
    /// The roots for an agent or check working in `cwd`: its repository's worktree (`git
    /// rev-parse --show-toplevel` without running git: the first ancestor holding `.git`), the
    /// git directories and run branch read from `.git` and `HEAD`, `.ralph/` as the books,
    /// `$HOME`, and of `state` (paths under `$HOME`, e.g. `.claude`) those that exist. The
    /// environment's names are read here. `cwd` outside a repository is the worktree itself.
    pub fn discover(bwrap: &Path, cwd: &Path, state: &[PathBuf], env_prefixes: &[String]) -> Roots {
        let worktree = worktree_of(cwd);
        let (git_dir, git_common_dir) = git_dirs(&worktree);
        let branch_ref = git_dir
            .as_ref()
            .and_then(|g| std::fs::read_to_string(g.join("HEAD")).ok())
            .and_then(|h| h.trim().strip_prefix("ref: ").map(str::to_owned));
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute() && h != Path::new("/"));
        let (state, home_readable) = match &home {
            Some(h) => (
                state
                    .iter()
                    .map(|p| h.join(p))
                    .filter(|p| p.exists())
                    .collect(),
                [".gitconfig", ".config/git/config"]
                    .iter()
                    .chain(TOOLCHAINS)
                    .map(|p| h.join(p))
                    .filter(|p| p.exists())
                    .collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let hidden = hidden_main_checkout(&worktree, git_dir.as_deref(), git_common_dir.as_deref())
            .into_iter()
            .collect();
        Roots {
            bwrap: bwrap.to_path_buf(),
            books: vec![worktree.join(".ralph")],
            worktree,
            git_dir,
            git_common_dir,
            branch_ref,
            home,
            state,
            home_readable,
            extra_readable: Vec::new(),
            links: Vec::new(),
            writable: Vec::new(),
            inherited: std::env::vars_os()
                .filter_map(|(k, _)| k.into_string().ok())
                .collect(),
            env_prefixes: env_prefixes.to_vec(),
            egress: None,
            hidden,
        }
    }
}

/// The main checkout a linked worktree lies inside (`--parallel`'s trees are under the main
/// checkout's `.ralph/worktrees/`), which its sandbox hides ([`Roots::hidden`]); `None` for the
/// main checkout itself, a worktree elsewhere, or a common git directory not named `.git`.
fn hidden_main_checkout(
    worktree: &Path,
    git_dir: Option<&Path>,
    common: Option<&Path>,
) -> Option<PathBuf> {
    let (git_dir, common) = (git_dir?, common?);
    if git_dir == common || common.file_name()? != ".git" {
        return None;
    }
    let main = common.parent()?;
    let tree = worktree.canonicalize().ok()?;
    (tree != main && tree.starts_with(main)).then(|| main.to_path_buf())
}

/// The worktree a process working in `cwd` is in: the first ancestor holding `.git` (a folder,
/// or a linked worktree's `.git` file), else `cwd` itself.
pub fn worktree_of(cwd: &Path) -> PathBuf {
    cwd.ancestors()
        .find(|d| d.join(".git").exists())
        .unwrap_or(cwd)
        .to_path_buf()
}

/// The git directory and the common git directory of `worktree`: `.git` itself, or the
/// directory a `.git` file names (`gitdir: …`) and the one its `commondir` file names.
fn git_dirs(worktree: &Path) -> (Option<PathBuf>, Option<PathBuf>) {
    let dot_git = worktree.join(".git");
    if dot_git.is_dir() {
        return (Some(dot_git.clone()), Some(dot_git));
    }
    let Some(git_dir) = std::fs::read_to_string(&dot_git)
        .ok()
        .and_then(|t| {
            t.trim()
                .strip_prefix("gitdir:")
                .map(|p| p.trim().to_owned())
        })
        .map(|p| worktree.join(p))
    else {
        return (None, None);
    };
    let common = std::fs::read_to_string(git_dir.join("commondir"))
        .ok()
        .map(|c| git_dir.join(c.trim()))
        .and_then(|c| c.canonicalize().ok())
        .unwrap_or_else(|| git_dir.clone());
    (Some(git_dir), Some(common))
}

/// Whether bwrap can build a sandbox here: `Ok(path of bwrap)`, or why not (missing, or user
/// namespaces refused), as a sentence with the fix. Runs `bwrap … true` with the namespaces a
/// strict sandbox uses (about 5 ms) the first time; a success is remembered for the rest of the
/// process (each `--parallel` worker builds its own sandbox).
///
/// # Errors
/// The sentence saying what is missing.
pub fn probe() -> Result<PathBuf, String> {
    static WORKS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(bwrap) = WORKS.get() {
        return Ok(bwrap.clone());
    }
    let bwrap = probe_once()?;
    Ok(WORKS.get_or_init(|| bwrap).clone())
}

fn probe_once() -> Result<PathBuf, String> {
    let bwrap = which::which("bwrap").map_err(|_| {
        "bubblewrap (`bwrap`) is not installed: install it (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora: `dnf install bubblewrap`) or run without --sandbox".to_owned()
    })?;
    let spec = SpawnSpec {
        program: bwrap.clone(),
        args: [
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--unshare-pid",
            "--unshare-net",
            "--new-session",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--",
            "true",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
        ..SpawnSpec::default()
    };
    match super::capture(&spec, Some(std::time::Duration::from_secs(10))) {
        Ok(c) if c.exit.success() => Ok(bwrap),
        Ok(c) => Err(format!(
            "`{}` cannot build a sandbox here ({}: {}): user namespaces may be disabled (`sysctl kernel.unprivileged_userns_clone=1`, or AppArmor's `kernel.apparmor_restrict_unprivileged_userns=0`), or run ralph as root",
            bwrap.display(),
            c.exit,
            c.stderr.trim()
        )),
        Err(e) => Err(format!("`{}` could not be run: {e}", bwrap.display())),
    }
}

/// A sandbox ready for every agent and check of one command (`ralph run`, `plan`, `convert`),
/// built once by `agent::sandbox::build` after [`probe`] said bwrap works.
#[derive(Debug)]
pub struct Sandbox {
    /// `Fs` or `Strict`.
    pub mode: SandboxMode,
    /// The `bwrap` program.
    pub bwrap: PathBuf,
    /// The backend's state paths, relative to `$HOME` or absolute ([`Roots::state`]).
    pub state: Vec<PathBuf>,
    /// The backend's variable prefixes ([`Roots::env_prefixes`]).
    pub env_prefixes: Vec<String>,
    /// strict: the running egress proxy.
    pub egress: Option<super::egress::Egress>,
    /// The ralph executable (the strict bridge).
    pub ralph: PathBuf,
    /// `sandbox_writable`: the user's extra writable paths ([`Roots::writable`]).
    pub writable: Vec<PathBuf>,
    /// Settings files the backend's variables name (its `SandboxNeeds::config_vars`), absolute;
    /// bound read-only where the private `/tmp` or the hidden `$HOME` would hide them.
    pub readable: Vec<PathBuf>,
    /// The worktrees' `ralph.toml` paths that did not exist when a sandboxed process started
    /// there ([`Sandbox::apply`]); [`Sandbox::settle`] moves one the process created aside.
    pub absent_config: std::sync::Mutex<std::collections::BTreeSet<PathBuf>>,
    /// What [`Sandbox::settle`] found and did and what [`Sandbox::note`] was told, one sentence
    /// each, with the worktree they are about ([`worktree_of`]), until
    /// [`Sandbox::take_findings`] takes those of a worktree (the iteration's record's
    /// `findings`; under `--parallel` each worker's worktree has its own).
    pub findings: std::sync::Mutex<Vec<(PathBuf, String)>>,
}

/// ralph's settings file at a worktree's root, which no sandboxed process may change: bound
/// read-only when it exists ([`wrap`]); one created where there was none is moved into
/// [`CONFIG_REFUSED_DIR`] after the process ([`Sandbox::settle`]).
pub const CONFIG_FILE: &str = "ralph.toml";
/// Where, under the worktree, a `ralph.toml` that a sandboxed process created is moved to
/// (`.ralph/refused/ralph.toml.<n>`, `n` from 1; the folder has a `.gitignore` of `*`): never
/// committed, never read as settings, kept for the user to look at.
pub const CONFIG_REFUSED_DIR: &str = ".ralph/refused";

/// Moves the `ralph.toml` at `worktree`'s root, which a sandboxed process created, to
/// `<worktree>/.ralph/refused/ralph.toml.<n>` (the first free `n` from 1) and returns the
/// finding that says so (paths relative to the worktree).
///
/// # Errors
/// The folder cannot be created or the file cannot be moved (then it is still in place).
pub fn refuse_created_config(worktree: &Path) -> std::io::Result<String> {
    let dir = worktree.join(CONFIG_REFUSED_DIR);
    std::fs::create_dir_all(&dir)?;
    // Ignored wherever it is: `.ralph/`'s own `.gitignore` is the main checkout's alone, and a
    // `--parallel` worker's worktree must not commit what was refused.
    let ignore = dir.join(".gitignore");
    if !ignore.exists() {
        crate::fsutil::write_atomic(&ignore, b"*\n")?;
    }
    let mut n = 1u32;
    let target = loop {
        let candidate = dir.join(format!("{CONFIG_FILE}.{n}"));
        if std::fs::symlink_metadata(&candidate).is_err() {
            break candidate;
        }
        n += 1;
    };
    std::fs::rename(worktree.join(CONFIG_FILE), &target)?;
    Ok(format!(
        "the agent created {CONFIG_FILE} (ralph's own settings; the tree had none): moved to {CONFIG_REFUSED_DIR}/{CONFIG_FILE}.{n}, not committed and not read. Under --sandbox an agent may not change ralph's settings; move it back yourself if you want it"
    ))
}

impl Sandbox {
    /// `spec` wrapped in this sandbox ([`wrap`] over [`Roots::discover`] for `spec.cwd`). The
    /// backend's missing state directories are created on the host first (so what the agent
    /// writes there lands on the host); the program, the `PATH` entries under `$HOME` and the
    /// directory of the program's resolved file stay readable (a CLI installed in
    /// `~/.local/bin`), and so does the ralph executable in strict mode.
    pub fn apply(&self, spec: SpawnSpec) -> SpawnSpec {
        let mut roots = Roots::discover(&self.bwrap, &spec.cwd, &self.state, &self.env_prefixes);
        roots.writable = self.writable.clone();
        let config = roots.worktree.join(CONFIG_FILE);
        if let Ok(mut absent) = self.absent_config.lock() {
            if std::fs::symlink_metadata(&config).is_err() {
                absent.insert(config);
            } else {
                absent.remove(&config);
            }
        }
        if let Some(common) = &roots.git_common_dir {
            if let Err(e) = settle_agent_objects(common) {
                tracing::warn!(
                    "cannot move the sandboxed agent's git objects into the history: {e}"
                );
            }
            // A linked worktree on a branch writes the branch's reflog in the common directory,
            // whose folder is bound read-write only when it exists.
            if let (Some(branch), false) =
                (&roots.branch_ref, roots.git_dir.as_ref() == Some(common))
            {
                if let Some(parent) = common.join("logs").join(branch).parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
            }
        }
        if let Some(home) = &roots.home {
            for p in &self.state {
                let path = home.join(p);
                if path.extension().is_none() && !path.exists() {
                    let _ = std::fs::create_dir_all(&path);
                }
            }
            roots.state = self
                .state
                .iter()
                .map(|p| home.join(p))
                .filter(|p| p.exists())
                .collect();
            let path_var = roots_path_var(&spec);
            for dir in std::env::split_paths(&path_var) {
                if dir.starts_with(home) && dir.is_dir() {
                    roots.extra_readable.push(dir);
                }
            }
        }
        let resolved = if spec.program.is_absolute() {
            Some(spec.program.clone())
        } else {
            which::which(&spec.program).ok()
        };
        if let Some(program) = resolved {
            keep_program_visible(&mut roots, &program);
        }
        for file in &self.readable {
            if file.is_file() && !visible(&roots, file) {
                roots.extra_readable.push(file.clone());
            }
        }
        if let Some(home) = &roots.home {
            roots
                .extra_readable
                .retain(|p| !home.starts_with(p) && !p.starts_with(home.join(".ssh")));
        }
        if let Some(egress) = &self.egress {
            let ralph = self.ralph.clone();
            keep_program_visible(&mut roots, &ralph);
            roots.egress = Some(EgressEnd {
                socket: egress.socket(),
                ralph: self.ralph.clone(),
                forwards: egress.loopback_ports(),
            });
        }
        wrap(spec, self.mode, &roots)
    }

    /// After a sandboxed process in `cwd` ended: moves the git objects it wrote into the history
    /// ([`settle_agent_objects`]), so that ralph's own git (whose object database was opened
    /// before the alternates file named the agent's folder) finds them. A failure is logged;
    /// the next [`Sandbox::apply`] tries again. A `ralph.toml` the process created where there
    /// was none (the read-only bind needs an existing file) is moved aside
    /// ([`refuse_created_config`]) and a finding says so ([`Sandbox::take_findings`]).
    pub fn settle(&self, cwd: &Path) {
        let roots = Roots::discover(&self.bwrap, cwd, &self.state, &self.env_prefixes);
        let config = roots.worktree.join(CONFIG_FILE);
        let was_absent = self
            .absent_config
            .lock()
            .map(|mut absent| absent.remove(&config))
            .unwrap_or(false);
        if was_absent && std::fs::symlink_metadata(&config).is_ok() {
            let finding = refuse_created_config(&roots.worktree).unwrap_or_else(|e| {
                format!(
                    "the agent created {CONFIG_FILE} (ralph's own settings; the tree had none) and ralph could not move it aside ({e}): check it before the next run, which would read it"
                )
            });
            if let Ok(mut findings) = self.findings.lock() {
                findings.push((roots.worktree.clone(), finding));
            }
        }
        if let Some(common) = &roots.git_common_dir {
            if let Err(e) = settle_agent_objects(common) {
                tracing::warn!(
                    "cannot move the sandboxed agent's git objects into the history: {e}"
                );
            }
        }
    }

    /// Adds `finding` about the sandboxed process that ran in `cwd` to those
    /// [`Sandbox::take_findings`] returns for its worktree (e.g. the agent's refused writes,
    /// counted by the launcher).
    pub fn note(&self, cwd: &Path, finding: String) {
        if let Ok(mut findings) = self.findings.lock() {
            findings.push((worktree_of(cwd), finding));
        }
    }

    /// What [`Sandbox::settle`] and [`Sandbox::note`] found since the last call about the
    /// worktree holding `cwd`, one sentence each, oldest first (empty when nothing). Those of
    /// other worktrees stay.
    pub fn take_findings(&self, cwd: &Path) -> Vec<String> {
        let worktree = worktree_of(cwd);
        let Ok(mut findings) = self.findings.lock() else {
            return Vec::new();
        };
        let (mine, others): (Vec<_>, Vec<_>) =
            findings.drain(..).partition(|(w, _)| *w == worktree);
        *findings = others;
        mine.into_iter().map(|(_, f)| f).collect()
    }

    /// strict: the hosts refused since the last call (`host:port`); empty in `fs` mode.
    pub fn take_refused(&self) -> Vec<String> {
        self.egress
            .as_ref()
            .map(super::egress::Egress::take_refused)
            .unwrap_or_default()
    }
}

/// Readies [`AGENT_OBJECTS`] in the common git directory `common` for the next sandboxed
/// process: creates it, makes sure `objects/info/alternates` names it (so git outside the
/// sandbox reads what an agent wrote there), and moves every object an earlier sandboxed
/// process left there into `objects/` (loose objects and packs; names are content hashes, so
/// an object already in `objects/` is not replaced). After this the folder is empty, and the
/// history an agent may not touch holds everything written so far.
///
/// # Errors
/// The folder, the alternates file or a move fails.
pub fn settle_agent_objects(common: &Path) -> std::io::Result<()> {
    let scratch = common.join(AGENT_OBJECTS);
    let objects = common.join("objects");
    std::fs::create_dir_all(scratch.join("pack"))?;
    std::fs::create_dir_all(objects.join("info"))?;
    let alternates = objects.join("info/alternates");
    let listed = std::fs::read_to_string(&alternates).unwrap_or_default();
    let line = scratch.to_string_lossy().into_owned();
    if !listed.lines().any(|l| l.trim() == line) {
        let mut text = listed;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&line);
        text.push('\n');
        // Whole or not at all: `--parallel` workers' git reads it while another settles.
        crate::fsutil::write_atomic(&alternates, text.as_bytes())?;
    }
    for entry in std::fs::read_dir(&scratch)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_fanout = name.len() == 2 && name.chars().all(|c| c.is_ascii_hexdigit());
        if !(is_fanout || name == "pack") || !entry.file_type()?.is_dir() {
            continue;
        }
        let to = objects.join(&*name);
        std::fs::create_dir_all(&to)?;
        let mut files = Vec::new();
        for file in std::fs::read_dir(entry.path())? {
            let file = file?;
            if file.file_type()?.is_file() {
                files.push(file.file_name().to_string_lossy().into_owned());
            }
        }
        for file in movable(&files) {
            let from = entry.path().join(&file);
            let dest = to.join(&file);
            if dest.exists() {
                std::fs::remove_file(&from)?;
            } else {
                std::fs::rename(&from, &dest)?;
            }
        }
        // The emptied fan-out folder stays: another `--parallel` worker's git may be about to
        // write its next object there, and would fail on a folder removed under it.
    }
    Ok(())
}

/// Of the files in one folder of [`AGENT_OBJECTS`], those that are finished and may move, in
/// the order to move them. A git still running (another `--parallel` worker's agent) writes an
/// object as `tmp_obj_*` and a pack as `tmp_pack_*`/`tmp_idx_*` beside its final name, and
/// renames it when whole: those stay. A pack moves only once its `.idx` exists, the `.idx`
/// last, so `objects/pack` never shows an index without its pack.
fn movable(files: &[String]) -> Vec<String> {
    let finished = |f: &&String| !f.starts_with("tmp_") && !f.starts_with('.');
    let mut out: Vec<String> = files
        .iter()
        .filter(finished)
        .filter(
            |f| match f.strip_prefix("pack-").and_then(|r| r.split_once('.')) {
                Some((stem, _)) => files.contains(&format!("pack-{stem}.idx")),
                None => true,
            },
        )
        .cloned()
        .collect();
    out.sort_by_key(|f| f.ends_with(".idx"));
    out
}

/// Whether `path` is seen inside as on the host: not under the private `/tmp` or the hidden
/// `$HOME`, or under a path bound back (state, `sandbox_writable`, read-only extras).
fn visible(roots: &Roots, path: &Path) -> bool {
    let hidden = path.starts_with("/tmp")
        || roots.home.as_ref().is_some_and(|h| path.starts_with(h))
        || roots.hidden.iter().any(|h| path.starts_with(h));
    !hidden
        || roots
            .writable
            .iter()
            .chain(&roots.state)
            .chain(&roots.extra_readable)
            .chain(std::iter::once(&roots.worktree))
            .any(|p| path.starts_with(p))
}

/// Makes the program at `program` runnable inside. A link (`~/.local/bin/claude` →
/// `~/.local/share/claude/versions/…`, a test's `bin/claude` → the fake agent, an npm
/// `node_modules/.bin/codex` → `../@openai/codex/bin/codex.js`) has its target's install folder
/// bound read-only when that is hidden, whether or not the link itself is visible (a link in a
/// `sandbox_writable` folder or the tree may point into a hidden `/tmp` or `$HOME`), and is
/// recreated inside when it is still hidden then. A hidden plain file is bound read-only.
fn keep_program_visible(roots: &mut Roots, program: &Path) {
    let is_link = std::fs::symlink_metadata(program).is_ok_and(|m| m.file_type().is_symlink());
    match (is_link, program.canonicalize()) {
        (true, Ok(target)) => {
            if !visible(roots, &target) {
                roots.extra_readable.push(install_root(&target));
            }
            if !visible(roots, program) {
                roots.links.push((target, program.to_path_buf()));
            }
        }
        _ if !visible(roots, program) => roots.extra_readable.push(program.to_path_buf()),
        _ => {}
    }
}

/// The folder a program file at `target` needs readable: the outermost `node_modules` above it
/// (an npm CLI's launcher loads its own package and a platform package beside it), else the
/// file's own folder.
fn install_root(target: &Path) -> PathBuf {
    target
        .ancestors()
        .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
        .last()
        .or_else(|| target.parent())
        .unwrap_or(target)
        .to_path_buf()
}

/// The `PATH` the spec's program is looked up on: the spec's own, else ralph's.
fn roots_path_var(spec: &SpawnSpec) -> std::ffi::OsString {
    spec.env_set
        .iter()
        .find(|(n, _)| n == "PATH")
        .map(|(_, v)| v.into())
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ralph_toml_a_sandboxed_process_created_is_moved_aside_and_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path();
        let sandbox = Sandbox {
            mode: SandboxMode::Fs,
            bwrap: "/usr/bin/bwrap".into(),
            state: Vec::new(),
            env_prefixes: Vec::new(),
            egress: None,
            ralph: "ralph".into(),
            writable: Vec::new(),
            readable: Vec::new(),
            absent_config: Default::default(),
            findings: Default::default(),
        };
        let spec = || SpawnSpec {
            program: "true".into(),
            cwd: tree.to_path_buf(),
            ..SpawnSpec::default()
        };
        for round in 1..=2 {
            let _ = sandbox.apply(spec());
            std::fs::write(tree.join(CONFIG_FILE), "sandbox = \"off\"\n").expect("write");
            sandbox.settle(tree);
            assert!(!tree.join(CONFIG_FILE).exists(), "round {round}");
            let kept = tree.join(format!("{CONFIG_REFUSED_DIR}/{CONFIG_FILE}.{round}"));
            assert_eq!(
                std::fs::read_to_string(&kept).expect("kept"),
                "sandbox = \"off\"\n"
            );
            let findings = sandbox.take_findings(tree);
            assert_eq!(findings.len(), 1, "{findings:?}");
            assert!(
                findings[0].contains(&format!("moved to .ralph/refused/ralph.toml.{round}")),
                "{findings:?}"
            );
            assert!(sandbox.take_findings(tree).is_empty(), "taken once");
        }
        assert_eq!(
            std::fs::read_to_string(tree.join(CONFIG_REFUSED_DIR).join(".gitignore")).unwrap(),
            "*\n"
        );
        // Under --parallel each worktree's findings go to its own iteration.
        let other = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(other.path().join(".git")).expect("mkdir");
        sandbox.note(&other.path().join("src"), "theirs".into());
        sandbox.note(tree, "mine".into());
        assert_eq!(sandbox.take_findings(tree), ["mine"]);
        assert_eq!(sandbox.take_findings(other.path()), ["theirs"]);
        // One that was there when the process started is the user's: left alone.
        std::fs::write(tree.join(CONFIG_FILE), "# mine\n").expect("write");
        let _ = sandbox.apply(spec());
        sandbox.settle(tree);
        assert!(tree.join(CONFIG_FILE).exists());
        assert!(sandbox.take_findings(tree).is_empty());
    }

    fn roots() -> Roots {
        Roots {
            bwrap: "/usr/bin/bwrap".into(),
            worktree: "/w/repo".into(),
            git_dir: Some("/w/repo/.git".into()),
            git_common_dir: Some("/w/repo/.git".into()),
            branch_ref: Some("refs/heads/ralph/feat".into()),
            books: vec!["/w/repo/.ralph".into()],
            home: Some("/home/u".into()),
            state: vec!["/home/u/.claude".into()],
            home_readable: vec!["/home/u/.gitconfig".into()],
            extra_readable: Vec::new(),
            links: Vec::new(),
            writable: Vec::new(),
            inherited: [
                "PATH",
                "HOME",
                "AWS_SECRET_ACCESS_KEY",
                "ANTHROPIC_API_KEY",
                "RALPH_GIT_TOKEN",
                "LC_ALL",
                "TMPDIR",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
            env_prefixes: vec!["ANTHROPIC_".into()],
            egress: None,
            hidden: Vec::new(),
        }
    }

    fn spec() -> SpawnSpec {
        SpawnSpec {
            program: "claude".into(),
            args: vec!["-p".into()],
            cwd: "/w/repo".into(),
            env_remove: vec!["CLAUDECODE".into()],
            env_set: vec![("RALPH_AGENT_TAG".into(), "r/1".into())],
            stdin: Some(b"prompt".to_vec()),
        }
    }

    /// The position of `words` as consecutive arguments.
    fn at(args: &[String], words: &[&str]) -> usize {
        args.windows(words.len())
            .position(|w| w.iter().zip(words).all(|(a, b)| a == b))
            .unwrap_or_else(|| panic!("{words:?} not in {args:?}"))
    }

    #[test]
    fn off_changes_nothing() {
        let wrapped = wrap(spec(), SandboxMode::Off, &roots());
        assert_eq!(wrapped.program, PathBuf::from("claude"));
        assert_eq!(wrapped.args, ["-p"]);
    }

    #[test]
    fn fs_mounts_in_the_order_that_protects_books_git_and_home() {
        let w = wrap(spec(), SandboxMode::Fs, &roots());
        assert_eq!(w.program, PathBuf::from("/usr/bin/bwrap"));
        let a = &w.args;
        let root = at(a, &["--ro-bind", "/", "/"]);
        let home = at(a, &["--tmpfs", "/home/u"]);
        let state = at(a, &["--bind", "/home/u/.claude", "/home/u/.claude"]);
        let tree = at(a, &["--bind", "/w/repo", "/w/repo"]);
        let git = at(a, &["--bind", "/w/repo/.git", "/w/repo/.git"]);
        let hooks = at(
            a,
            &["--ro-bind-try", "/w/repo/.git/hooks", "/w/repo/.git/hooks"],
        );
        let config = at(
            a,
            &[
                "--ro-bind-try",
                "/w/repo/.git/config",
                "/w/repo/.git/config",
            ],
        );
        let refs = at(
            a,
            &["--ro-bind-try", "/w/repo/.git/refs", "/w/repo/.git/refs"],
        );
        let branch = at(
            a,
            &[
                "--bind-try",
                "/w/repo/.git/refs/heads/ralph",
                "/w/repo/.git/refs/heads/ralph",
            ],
        );
        let books = at(a, &["--ro-bind-try", "/w/repo/.ralph", "/w/repo/.ralph"]);
        assert!(root < home && home < state && state < tree && tree < git);
        assert!(git < hooks && git < config && git < refs && refs < branch);
        assert!(tree < books);
        for flag in ["--unshare-pid", "--new-session", "--die-with-parent"] {
            assert!(a.iter().any(|x| x == flag), "{flag}");
        }
        at(a, &["--cap-drop", "ALL"]);
        assert!(!a.iter().any(|x| x == "--unshare-net"));
        let end = at(a, &["--", "claude", "-p"]);
        assert_eq!(end + 3, a.len());
        assert_eq!(w.stdin.as_deref(), Some(&b"prompt"[..]));
    }

    #[test]
    fn the_environment_is_an_allowlist_and_never_holds_the_push_token() {
        let w = wrap(spec(), SandboxMode::Fs, &roots());
        for gone in [
            "AWS_SECRET_ACCESS_KEY",
            "RALPH_GIT_TOKEN",
            "CLAUDECODE",
            "TMPDIR",
        ] {
            assert!(
                w.env_remove.iter().any(|r| r == gone),
                "{gone}: {:?}",
                w.env_remove
            );
        }
        for kept in ["PATH", "HOME", "ANTHROPIC_API_KEY", "LC_ALL"] {
            assert!(!w.env_remove.iter().any(|r| r == kept), "{kept}");
        }
        assert!(w
            .env_set
            .iter()
            .any(|(n, v)| n == "RALPH_AGENT_TAG" && v == "r/1"));
        let mut s = spec();
        s.env_set.push(("RALPH_GIT_TOKEN".into(), "t".into()));
        let w = wrap(s, SandboxMode::Fs, &roots());
        assert!(w.env_set.iter().all(|(n, _)| n != "RALPH_GIT_TOKEN"));
    }

    #[test]
    fn strict_cuts_the_network_and_bridges_the_proxy() {
        let mut r = roots();
        r.egress = Some(EgressEnd {
            socket: "/run/ralph/e.sock".into(),
            ralph: "/usr/bin/ralph".into(),
            forwards: vec![8080],
        });
        let w = wrap(spec(), SandboxMode::Strict, &r);
        let a = &w.args;
        at(a, &["--unshare-net"]);
        at(a, &["--bind", "/run/ralph/e.sock", PROXY_SOCKET]);
        at(
            a,
            &[
                "--",
                "/usr/bin/ralph",
                "__bridge",
                "--forward=8080",
                "--",
                "claude",
                "-p",
            ],
        );
        assert!(w
            .env_set
            .iter()
            .any(|(n, v)| n == "HTTPS_PROXY" && v == "http://127.0.0.1:3128"));
    }

    #[test]
    fn a_linked_worktree_writes_objects_and_its_branch_in_the_common_dir() {
        let mut r = roots();
        r.git_dir = Some("/m/.git/worktrees/w".into());
        r.git_common_dir = Some("/m/.git".into());
        r.branch_ref = Some("refs/heads/main".into());
        let wrapped = wrap(spec(), SandboxMode::Fs, &r);
        let a = wrapped.args;
        let common = at(a.as_slice(), &["--ro-bind", "/m/.git", "/m/.git"]);
        // The history read-only, new objects in the agent's own folder.
        let history = at(&a, &["--ro-bind-try", "/m/.git/objects", "/m/.git/objects"]);
        let objects = at(
            &a,
            &[
                "--bind-try",
                "/m/.git/ralph-agent-objects",
                "/m/.git/ralph-agent-objects",
            ],
        );
        assert!(common < history);
        assert!(wrapped.env_set.contains(&(
            "GIT_OBJECT_DIRECTORY".into(),
            "/m/.git/ralph-agent-objects".into()
        )));
        assert!(wrapped.env_set.contains(&(
            "GIT_ALTERNATE_OBJECT_DIRECTORIES".into(),
            "/m/.git/objects".into()
        )));
        let refs = at(&a, &["--ro-bind-try", "/m/.git/refs", "/m/.git/refs"]);
        let heads = at(
            &a,
            &["--bind-try", "/m/.git/refs/heads", "/m/.git/refs/heads"],
        );
        assert!(common < objects && refs < heads);
    }

    /// A `--parallel` worker's tree (detached HEAD, inside the main checkout): the main
    /// checkout is hidden and read-only, the tree and its own git directory (HEAD included)
    /// writable, and nothing of the common directory's refs or logs.
    #[test]
    fn a_parallel_workers_tree_hides_the_checkout_and_moves_only_its_own_head() {
        let mut r = roots();
        r.worktree = "/m/.ralph/worktrees/r1/US-001-1".into();
        r.git_dir = Some("/m/.git/worktrees/US-001-1".into());
        r.git_common_dir = Some("/m/.git".into());
        r.branch_ref = None;
        r.books = vec!["/m/.ralph/worktrees/r1/US-001-1/.ralph".into()];
        r.hidden = vec!["/m".into()];
        let mut s = spec();
        s.cwd = r.worktree.clone();
        let a = wrap(s, SandboxMode::Fs, &r).args;
        let hide = at(&a, &["--tmpfs", "/m"]);
        let tree = at(
            &a,
            &[
                "--bind",
                "/m/.ralph/worktrees/r1/US-001-1",
                "/m/.ralph/worktrees/r1/US-001-1",
            ],
        );
        let common = at(&a, &["--ro-bind", "/m/.git", "/m/.git"]);
        let own = at(
            &a,
            &[
                "--bind",
                "/m/.git/worktrees/US-001-1",
                "/m/.git/worktrees/US-001-1",
            ],
        );
        let sealed = at(&a, &["--remount-ro", "/m"]);
        assert!(hide < tree && tree < common && common < own && own < sealed);
        assert_eq!(sealed + 2, at(&a, &["--unshare-pid"]));
        let joined = a.join(" ");
        assert!(
            !joined.contains("/m/.git/worktrees/US-001-1/HEAD"),
            "the worker's HEAD is its branch: {joined}"
        );
        for rw in ["/m/.git/logs", "/m/.git/refs/heads"] {
            assert!(
                !joined.contains(&format!("--bind-try {rw}")),
                "{rw} is writable: {joined}"
            );
        }
        at(
            &a,
            &[
                "--ro-bind-try",
                "/m/.git/worktrees/US-001-1/commondir",
                "/m/.git/worktrees/US-001-1/commondir",
            ],
        );
    }

    /// Which worktrees hide their main checkout: a linked one inside it, not the checkout
    /// itself nor a linked one elsewhere.
    #[test]
    fn only_a_worktree_inside_its_checkout_hides_the_checkout() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().canonicalize().unwrap().join("m");
        let inside = main.join(".ralph/worktrees/r/US-1-1");
        let outside = dir.path().canonicalize().unwrap().join("elsewhere");
        std::fs::create_dir_all(main.join(".git/worktrees/x")).unwrap();
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let (git, common) = (main.join(".git/worktrees/x"), main.join(".git"));
        assert_eq!(
            hidden_main_checkout(&inside, Some(&git), Some(&common)),
            Some(main.clone())
        );
        assert_eq!(
            hidden_main_checkout(&outside, Some(&git), Some(&common)),
            None
        );
        assert_eq!(
            hidden_main_checkout(&main, Some(&common), Some(&common)),
            None
        );
    }

    /// A link that is itself visible (in a writable folder) but points into a hidden place gets
    /// its target's install folder bound; an npm launcher's whole `node_modules` is bound, and
    /// the link, visible then, is not recreated.
    #[test]
    fn a_programs_hidden_target_is_bound_wherever_its_link_is() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let fake = base.join("target/debug/ralph-fake-agent");
        std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
        std::fs::write(&fake, "").unwrap();
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::os::unix::fs::symlink(&fake, base.join("bin/claude")).unwrap();
        let mut r = roots();
        r.writable = vec![base.join("bin")];
        keep_program_visible(&mut r, &base.join("bin/claude"));
        let fake_dir = fake.canonicalize().unwrap().parent().unwrap().to_path_buf();
        assert!(
            r.extra_readable.contains(&fake_dir),
            "{:?}",
            r.extra_readable
        );
        assert!(r.links.is_empty(), "{:?}", r.links);

        let nm = base.join("tools/codex/node_modules");
        std::fs::create_dir_all(nm.join("@openai/codex/bin")).unwrap();
        std::fs::create_dir_all(nm.join(".bin")).unwrap();
        std::fs::write(nm.join("@openai/codex/bin/codex.js"), "").unwrap();
        std::os::unix::fs::symlink("../@openai/codex/bin/codex.js", nm.join(".bin/codex")).unwrap();
        let mut r = roots();
        keep_program_visible(&mut r, &nm.join(".bin/codex"));
        assert_eq!(r.extra_readable, vec![nm.canonicalize().unwrap()]);
        // The link lies in the bound node_modules: visible, not recreated.
        assert!(
            r.links.is_empty() || !nm.starts_with("/tmp"),
            "{:?}",
            r.links
        );
    }

    /// What an agent wrote in its objects folder moves into the history before the next
    /// sandboxed process, and git outside reads it meanwhile through the alternates file.
    #[test]
    fn the_agents_objects_move_into_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let common = dir.path();
        std::fs::create_dir_all(common.join("objects/ab")).unwrap();
        std::fs::write(common.join("objects/ab/cdef"), "old").unwrap();
        settle_agent_objects(common).unwrap();
        let alternates = std::fs::read_to_string(common.join("objects/info/alternates")).unwrap();
        assert_eq!(alternates.lines().count(), 1, "{alternates}");
        let scratch = common.join(AGENT_OBJECTS);
        std::fs::create_dir_all(scratch.join("ab")).unwrap();
        std::fs::write(scratch.join("ab/cdef"), "same name").unwrap();
        std::fs::write(scratch.join("ab/0123"), "new").unwrap();
        std::fs::write(scratch.join("pack/pack-1.pack"), "pack").unwrap();
        std::fs::write(scratch.join("pack/pack-1.idx"), "idx").unwrap();
        // Still being written by a git that runs on (another worker's agent): left in place.
        std::fs::write(scratch.join("ab/tmp_obj_Xy12"), "half").unwrap();
        std::fs::write(scratch.join("pack/pack-2.pack"), "no index yet").unwrap();
        settle_agent_objects(common).unwrap();
        assert_eq!(
            std::fs::read_to_string(common.join("objects/ab/cdef")).unwrap(),
            "old"
        );
        assert_eq!(
            std::fs::read_to_string(common.join("objects/ab/0123")).unwrap(),
            "new"
        );
        assert!(common.join("objects/pack/pack-1.pack").is_file());
        assert!(common.join("objects/pack/pack-1.idx").is_file());
        assert!(scratch.join("ab/tmp_obj_Xy12").is_file());
        assert!(!common.join("objects/ab/tmp_obj_Xy12").exists());
        assert!(scratch.join("pack/pack-2.pack").is_file());
        assert!(!common.join("objects/pack/pack-2.pack").exists());
        let alternates = std::fs::read_to_string(common.join("objects/info/alternates")).unwrap();
        assert_eq!(alternates.lines().count(), 1, "listed once: {alternates}");
    }
}
