//! The firmware layer: the command queue and its mailboxes ([`cmd`]), the
//! bring-up of a function and the [`init::Hca`] it yields ([`init`]),
//! firmware pages ([`pages`]), the event queue and its thread ([`events`]),
//! health ([`health`]), PD / UAR / memory keys ([`resources`]) and where a
//! peer's MAC comes from ([`neigh`]). It sits on the function layer
//! ([`crate::function`]) and knows nothing of rings or work requests.

pub mod cmd;
pub mod events;
pub mod health;
pub mod init;
pub mod neigh;
pub mod pages;
pub mod resources;

pub use cmd::{CmdQueue, CmdQueueOptions};

use crate::{Mlx5Error, PciFunction};

/// Read the dword holding `field` from the init segment and extract it.
pub(crate) fn read_iseg(
    function: &dyn PciFunction,
    field: &rnic_mlx5_prm::FieldLayout,
) -> Result<u32, Mlx5Error> {
    let dword = function
        .bar0()
        .read32_be(field.dword_offset())
        .map_err(Mlx5Error::Bar)?;
    Ok(field.extract(dword))
}
