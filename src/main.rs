//! The `ralph` binary: parse the command line, run the command, map the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use ralph::cli::{Cli, Command};
use ralph::exit::ExitStatus;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Init(args) => ralph::commands::init::run(args),
        Command::Validate(args) => ralph::commands::validate::run(args),
        Command::Run(args) => ralph::commands::run::run(args),
        Command::Status(args) => ralph::commands::status::run(args),
    };
    match result {
        Ok(status) => status.into(),
        Err(err) => {
            eprintln!(
                "{} {err:#}",
                console::style("error:").red().bold().for_stderr()
            );
            ExitStatus::Failure.into()
        }
    }
}
