//! rnic: userspace RDMA.
#![forbid(unsafe_code)]
pub use rnic_core as core;
pub use rnic_roce as roce;
