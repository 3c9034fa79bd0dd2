//! The amp dialect of `ralph-fake-agent` (filled in by the amp backend work).

use serde_json::Value;

use crate::Dialect;

/// Plays one `{"amp": ...}` action.
pub fn play(action: &Value, _d: &mut Dialect<'_>) -> anyhow::Result<()> {
    anyhow::bail!("the amp dialect has no actions yet (got {action})")
}
