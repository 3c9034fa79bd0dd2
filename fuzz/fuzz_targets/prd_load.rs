//! Arbitrary bytes as prd.json through ralph's loader and its surgical edits (see
//! `ralph_fuzz::check_prd`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ralph_fuzz::check_prd(data));
