//! cargo-fuzz target `requester`: rnic_fuzz_harness::engine::requester (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::engine::requester(data);
});
