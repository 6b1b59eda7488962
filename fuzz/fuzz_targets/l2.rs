//! cargo-fuzz target `l2`: rnic_fuzz_harness::l2::frames (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::l2::frames(data);
});
