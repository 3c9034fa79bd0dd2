
mod agents;
