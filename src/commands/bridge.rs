//! `ralph __bridge` (hidden): the network bridge inside a `--sandbox strict` sandbox, which
//! starts the agent and exits with its status (see [`crate::process::egress::bridge`]).

use crate::cli::BridgeArgs;
use crate::error::UserError;
use crate::protocol::ExitStatus;

/// Runs the bridge and the agent, then exits the process with the agent's exit code (128 + a
/// signal that killed it): ralph reads the agent's own status.
///
/// # Errors
/// A listener could not be bound or the agent could not be started.
pub fn run(args: &BridgeArgs) -> anyhow::Result<ExitStatus> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(UserError::new("ralph __bridge: no command after `--`").into());
    };
    let code = crate::process::egress::bridge(&args.forwards, program.as_ref(), rest)
        .map_err(|e| UserError::new(format!("ralph __bridge: {e}")))?;
    std::process::exit(code)
}
