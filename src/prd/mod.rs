//! prd.json: the model (single source of truth), its generated JSON Schema, loading and
//! validation, and the linter.

pub mod files;
pub mod lint;
pub mod model;
pub mod schema;
pub mod store;
