//! cargo-fuzz target `mlx5_cqe`: rnic_fuzz_harness::mlx5::cqe::completions (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::mlx5::cqe::completions(data);
});
