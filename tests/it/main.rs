//! ralph's integration tests: one test binary (built with `--features test-fakes`).

mod agents;
mod common;
mod prd;
mod process;
mod run_cases;
mod store;
