//! Every declared PRM structure, grouped by role. All views and offset modules are
//! re-exported at the crate root.

use crate::{Source, prm_struct};

pub mod cmdif;
pub mod cmds;
pub mod contexts;
pub mod eth;
pub mod events;
pub mod flow;
pub mod init;
pub mod resources;
pub mod ud;
pub mod wqe;

pub use cmdif::*;
pub use cmds::*;
pub use contexts::*;
pub use eth::*;
pub use events::*;
pub use flow::*;
pub use init::*;
pub use resources::*;
pub use ud::*;
pub use wqe::*;
