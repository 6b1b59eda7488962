//! rnic-roce: RoCEv2 as a sans-IO library.
#![forbid(unsafe_code)]

pub mod pcap;
pub mod wire;
