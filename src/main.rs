//! The `ralph` binary: parse the command line, run the command, map the result to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ralph::cli::Cli::parse();
    let _ = cli;
    ExitCode::SUCCESS
}
