//! cargo-fuzz target `mlx5_firmware`: rnic_fuzz_harness::mlx5::firmware::command_queue (its docs list the invariants asserted).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rnic_fuzz_harness::mlx5::firmware::command_queue(data);
});
