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

/// `ralph __bridge --forward=PORT… -- PROGRAM ARGS…` taken straight from the process's
/// arguments, before the full command line is parsed and logging is set up: the bridge starts
/// once per strict-sandboxed process, and building every command's parser is measurable there.
/// Runs the bridge and exits the process (with the agent's code, or 1 and the reason when the
/// bridge cannot start) when the arguments are the bridge's in that exact shape; returns
/// otherwise (any other command, or a shape for clap to judge and explain).
pub fn run_early() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some((forwards, command)) = early_args(&args) else {
        return;
    };
    let Some((program, rest)) = command.split_first() else {
        return;
    };
    match crate::process::egress::bridge(&forwards, program.as_ref(), rest) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ralph __bridge: {e}");
            std::process::exit(1)
        }
    }
}

/// The forwarded ports and the command of `__bridge --forward=PORT… -- COMMAND…` (`None`: not
/// that shape: another command, a flag in another form, a bad port, no command, or an argument
/// that is not UTF-8).
fn early_args(args: &[std::ffi::OsString]) -> Option<(Vec<u16>, Vec<String>)> {
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (first, rest) = args.split_first()?;
    if *first != "__bridge" {
        return None;
    }
    let split = rest.iter().position(|a| *a == "--")?;
    let forwards = rest[..split]
        .iter()
        .map(|a| a.strip_prefix("--forward=")?.parse::<u16>().ok())
        .collect::<Option<Vec<u16>>>()?;
    let command: Vec<String> = rest[split + 1..].iter().map(|a| (*a).to_owned()).collect();
    (!command.is_empty()).then_some((forwards, command))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    #[test]
    fn the_early_bridge_takes_only_its_own_exact_shape() {
        assert_eq!(
            early_args(&os(&[
                "__bridge",
                "--forward=8080",
                "--forward=9",
                "--",
                "claude",
                "-p"
            ])),
            Some((vec![8080, 9], vec!["claude".to_owned(), "-p".to_owned()]))
        );
        assert_eq!(
            early_args(&os(&["__bridge", "--", "true"])),
            Some((vec![], vec!["true".to_owned()]))
        );
        for other in [
            &["run", "--", "x"][..],
            &["__bridge", "--forward", "80", "--", "x"],
            &["__bridge", "--forward=http", "--", "x"],
            &["__bridge", "--"],
            &["__bridge", "x"],
            &[],
        ] {
            assert_eq!(early_args(&os(other)), None, "{other:?}");
        }
    }
}
