//! ralph's integration tests: one test binary (built with `--features test-fakes`).

mod agents;
mod common;
mod examples;
mod llm;
mod local;
mod local_e2e;
mod native_loop;
mod prd;
mod process;
mod real_claude;
mod real_opencode;
mod run_cases;
mod store;
mod support_llm;
mod support_model;
mod tools;
