//! cargo-fuzz target `wire`: rnic_fuzz_harness::wire::packet (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::wire::packet(data);
});
