//! Arbitrary bytes through the amp backend's stream parser (see `ralph_fuzz::feed_parser`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ralph::protocol::AgentKind;

fuzz_target!(|data: &[u8]| ralph_fuzz::feed_parser(AgentKind::Amp, data));
