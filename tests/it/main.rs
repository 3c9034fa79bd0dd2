// End-to-end runs of the real Claude Code CLI against the scripted model.
mod real_claude;
// Harness for those runs: the scripted model, hermetic env, network namespace.
mod support_model;
