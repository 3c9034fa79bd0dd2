//! The codex dialect of `ralph-fake-agent` (filled in by the codex backend work).

use serde_json::Value;

use crate::Dialect;

/// Plays one `{"codex": ...}` action.
pub fn play(action: &Value, _d: &mut Dialect<'_>) -> anyhow::Result<()> {
    anyhow::bail!("the codex dialect has no actions yet (got {action})")
}
