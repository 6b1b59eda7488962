//! The RDMA data path on the firmware layer ([`crate::firmware`]): CQs
//! ([`cq`]), QPs and their commands ([`qp`]), the work queues a poster
//! fills ([`wq`]) from the WQE builders ([`wqe`]), the ring memory both
//! share ([`ring`]), what is outstanding on each queue ([`track`]) and
//! BlueFlame halves ([`bf`]).

pub mod bf;
pub mod cq;
#[cfg(test)]
mod datapath_tests;
#[doc(hidden)]
pub mod fuzzing;
pub mod qp;
pub(crate) mod ring;
pub(crate) mod track;
pub mod wq;
pub mod wqe;
