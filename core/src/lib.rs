//! rnic-core: the verbs object model every rnic driver implements.
#![forbid(unsafe_code)]

pub mod error;
pub mod types;

pub use error::ValueError;
pub use types::{Gid, Iova, Lkey, Mtu, Psn, Qpn, Rkey};
