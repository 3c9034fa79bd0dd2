//! The cursor dialect of `ralph-fake-agent` (filled in by the cursor backend work).

use serde_json::Value;

use crate::Dialect;

/// Plays one `{"cursor": ...}` action.
pub fn play(action: &Value, _d: &mut Dialect<'_>) -> anyhow::Result<()> {
    anyhow::bail!("the cursor dialect has no actions yet (got {action})")
}
