//! The opencode dialect of `ralph-fake-agent` (filled in by the opencode backend work).

use serde_json::Value;

use crate::Dialect;

/// Plays one `{"opencode": ...}` action.
pub fn play(action: &Value, _d: &mut Dialect<'_>) -> anyhow::Result<()> {
    anyhow::bail!("the opencode dialect has no actions yet (got {action})")
}
