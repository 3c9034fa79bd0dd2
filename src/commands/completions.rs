//! `ralph completions <shell>`: a completion script for bash, zsh, fish, PowerShell or elvish,
//! generated from the clap definition (so it always matches the flags), printed on stdout.
//!
//! Install, e.g.: `ralph completions bash > ~/.local/share/bash-completion/completions/ralph`,
//! `ralph completions zsh > ~/.zfunc/_ralph`, `ralph completions fish >
//! ~/.config/fish/completions/ralph.fish`.

use std::io::Write as _;

use crate::cli::CompletionsArgs;
use crate::protocol::ExitStatus;

/// Prints the completion script for `args.shell`.
///
/// # Errors
/// None: a closed stdout is ignored.
pub fn run(args: &CompletionsArgs) -> anyhow::Result<ExitStatus> {
    let mut cmd = crate::cli::visible_command();
    // Into a buffer first: clap_complete panics on a write error, and a closed stdout
    // (`| head`) must not.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "ralph", &mut script);
    let _ = std::io::stdout().write_all(&script);
    Ok(ExitStatus::Success)
}
