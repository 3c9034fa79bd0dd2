//! Tokens and money: one [`Usage`] type for every backend (the agent CLIs and ralph's own native
//! loop), the price table entry that turns tokens into USD, and where a cost came from.

use serde::{Deserialize, Serialize};

/// Token counts of one iteration or one model request (tokens). A count the agent did not report
/// is 0 here; the ledger records it as absent (`null`), never as zero.
///
/// On the wire (transcripts, the native loop's result line) the fields are `input_tokens`,
/// `output_tokens`, `cache_read_tokens`, `cache_creation_tokens`; the native loop's older
/// spellings `input`, `output`, `cache_read`, `cache_write` are read too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    #[serde(default, alias = "input")]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default, alias = "output")]
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default, alias = "cache_read")]
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default, alias = "cache_write")]
    pub cache_creation_tokens: u64,
}

impl Usage {
    /// Whether no token count at all was reported.
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_creation_tokens += other.cache_creation_tokens;
    }

    /// All input tokens: uncached, cache reads and cache writes.
    pub fn total_input(&self) -> u64 {
        self.input_tokens + self.cache_read_tokens + self.cache_creation_tokens
    }
}

/// USD per million tokens for one model (from `[prices."<model>"]` in ralph.toml).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// USD per million uncached input tokens (cache writes are billed at this price too).
    pub input: f64,
    /// USD per million output tokens.
    pub output: f64,
    /// USD per million cached input tokens read (default: the input price).
    #[serde(default)]
    pub cache_read: Option<f64>,
}

impl Price {
    /// The cost in USD of `usage`.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let per = 1_000_000.0;
        (usage.input_tokens + usage.cache_creation_tokens) as f64 * self.input / per
            + usage.output_tokens as f64 * self.output / per
            + usage.cache_read_tokens as f64 * self.cache_read.unwrap_or(self.input) / per
    }
}

/// Where an iteration's cost came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CostSource {
    /// The agent reported it (claude's `total_cost_usd`, opencode's step costs).
    Agent,
    /// ralph computed it from the tokens and `[prices."<model>"]` in ralph.toml (USD per million
    /// tokens).
    PriceTable,
}
