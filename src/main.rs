//! The `ralph` binary: parse the command line, run the command, map the result to an exit code.

use std::process::ExitCode;

use ralph::cli::Command;

fn main() -> ExitCode {
    // The strict sandbox's bridge starts once per sandboxed process: no parser, no logging.
    ralph::commands::bridge::run_early();
    let cli = ralph::cli::parse();
    init_logging();
    if matches!(
        cli.command,
        Command::Validate(_)
            | Command::Status(_)
            | Command::Log(_)
            | Command::Report(_)
            | Command::Show(_)
            | Command::Doctor(_)
            | Command::Completions(_)
            | Command::Man(_)
    ) {
        ralph::process::pager::die_quietly_on_closed_stdout();
    }
    let result = match &cli.command {
        Command::Init(args) => ralph::commands::init::run(args),
        Command::Validate(args) => ralph::commands::validate::run(args),
        Command::Plan(args) => ralph::commands::plan::run(args),
        Command::Convert(args) => ralph::commands::convert::run(args),
        Command::Run(args) => ralph::commands::run::run(args),
        Command::Status(args) => ralph::commands::status::run(args),
        Command::Log(args) => ralph::commands::log::run(args),
        Command::Report(args) => ralph::commands::report::run(args),
        Command::Show(args) => ralph::commands::show::run(args),
        Command::Doctor(args) => ralph::commands::doctor::run(args),
        Command::Stop(args) => ralph::commands::stop::run(args),
        Command::Hint(args) => ralph::commands::hint::run(args),
        Command::Pause(args) => ralph::commands::pause::pause(args),
        Command::Resume(args) => ralph::commands::pause::resume(args),
        Command::Watch(args) => ralph::commands::watch::run(args),
        Command::Archive(args) => ralph::commands::archive::run(args),
        Command::Notify(args) => ralph::commands::notify::run(args),
        Command::Completions(args) => ralph::commands::completions::run(args),
        Command::Man(args) => ralph::commands::man::run(args),
        Command::NativeAgent => ralph::commands::native_agent::run(),
        Command::Bridge(args) => ralph::commands::bridge::run(args),
    };
    match result {
        Ok(status) => status.into(),
        // The one error printer: message, new causes, hints last; the exit code comes from the
        // error (2 for a usage error, else 1).
        Err(err) => ralph::error::report(&err).into(),
    }
}

/// Diagnostics from inside ralph (warnings by default) go to stderr; `RALPH_LOG=debug` (any
/// tracing filter) shows more, e.g. every process-group signal.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RALPH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .try_init();
}
