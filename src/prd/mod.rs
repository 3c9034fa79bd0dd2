//! prd.json: the model (single source of truth), its generated JSON Schema, loading and validation.

pub mod model;
pub mod schema;
pub mod store;
