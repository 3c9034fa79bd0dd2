//! ralph's integration tests: one test binary (built with `--features test-fakes`).

mod agents;
mod agents_amp_cursor;
mod architecture;
mod archive;
mod common;
mod doctor;
mod examples;
mod fake_gemini;
mod fault_injection;
mod llm;
mod local;
mod local_e2e;
mod native_loop;
mod prd;
mod process;
mod process_trees;
mod real_claude;
mod real_codex;
mod real_gemini;
mod real_opencode;
mod run_cases;
mod stop_conditions;
mod store;
mod support_llm;
mod support_model;
mod tools;
