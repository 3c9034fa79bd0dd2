//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitStatus>`.

pub mod archive;
pub mod bridge;
pub mod completions;
pub mod convert;
pub mod doctor;
pub mod hint;
pub mod init;
pub mod log;
pub mod man;
pub mod native_agent;
pub mod notify;
pub mod pause;
pub mod plan;
pub mod report;
pub mod run;
pub mod show;
pub mod status;
pub mod stop;
pub mod validate;
pub mod watch;
