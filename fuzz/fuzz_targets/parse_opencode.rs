//! Arbitrary bytes through the opencode backend's stream parser (see `ralph_fuzz::feed_parser`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ralph::protocol::AgentKind;

fuzz_target!(|data: &[u8]| ralph_fuzz::feed_parser(AgentKind::Opencode, data));
