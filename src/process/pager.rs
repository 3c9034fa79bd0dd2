//! The pager for long output (`ralph log`, `ralph show`), the way git does it: when stdout is a
//! terminal, output goes through `$RALPH_PAGER`, else `$PAGER`, else `less` (with `LESS=FRX` when
//! `LESS` is unset: quit if one screen, keep colours, do not clear the screen). No pager when
//! stdout is not a terminal, or the pager is empty or `cat`.
//!
//! Unlike every other child of ralph, the pager stays in ralph's own process group: it reads
//! keys from the terminal, which only the foreground group may do.

use std::io::{IsTerminal as _, Write};
use std::process::{Child, Command, Stdio};

/// Writes `text` through the pager when there is one (see the module docs), else to stdout. A
/// closed pipe (the user quit the pager early, `| head`) is not an error.
pub fn page(text: &str) {
    if let Some(mut child) = start() {
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(text.as_bytes());
        }
        // The input is closed above; wait until the user quits the pager.
        let _ = child.wait();
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// For the commands that only print (`status`, `log`, `show`, `report`, `doctor`, ...): a closed
/// stdout (`ralph status | head -2`) ends ralph quietly, as it does `git log` or `ls`, through
/// SIGPIPE's default action (exit by signal 13, 141 in a shell), instead of a panic in the
/// middle of a `println!`. Not for `ralph run`, whose closed output must not stop a night's run.
pub fn die_quietly_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: called at the start of main, before any thread exists; SIG_DFL installs no
    // handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// Starts the pager, or `None` when output should go to stdout directly (see the module docs)
/// or the pager cannot start.
fn start() -> Option<Child> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let choice = std::env::var("RALPH_PAGER")
        .ok()
        .or_else(|| std::env::var("PAGER").ok())
        .unwrap_or_else(|| "less".to_owned());
    let words = shlex::split(&choice)?;
    let (program, args) = words.split_first()?;
    if program == "cat" {
        return None;
    }
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::piped());
    if std::env::var_os("LESS").is_none() {
        cmd.env("LESS", "FRX");
    }
    cmd.spawn().ok()
}
