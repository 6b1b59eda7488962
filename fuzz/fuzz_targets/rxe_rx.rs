//! cargo-fuzz target `rxe_rx`: rnic_fuzz_harness::rxe::rx (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::rxe::rx(data);
});
