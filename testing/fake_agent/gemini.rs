//! The gemini dialect of `ralph-fake-agent` (filled in by the gemini backend work).

use serde_json::Value;

use crate::Dialect;

/// Plays one `{"gemini": ...}` action.
pub fn play(action: &Value, _d: &mut Dialect<'_>) -> anyhow::Result<()> {
    anyhow::bail!("the gemini dialect has no actions yet (got {action})")
}
