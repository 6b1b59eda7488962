//! `rnicctl mlx5 …`: facts about the mlx5 driver that need no device.

use clap::Subcommand;

/// The `mlx5` subcommands.
#[derive(Subcommand, Debug)]
pub enum Mlx5Cmd {
    /// Print the PRM structure layouts the mlx5 driver and emulator use.
    ///
    /// One line per structure (name, size in bits, number of fields) or, with
    /// --json, the whole table as `{"structs": {NAME: {"fields": {FIELD:
    /// [bit_offset, width]}, "size_bits": N}}}`: bit offsets MSB-first in
    /// big-endian dwords, nested structures also as dotted paths — the format
    /// of shared/reference/mlx5_ifc_layout.md, so it can be held against the
    /// kernel header's layout JSON.
    Layouts {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `mlx5` subcommand.
pub fn main(cmd: &Mlx5Cmd) {
    match cmd {
        Mlx5Cmd::Layouts { json: true } => print!("{}", rnic_mlx5_prm::export::layouts_json()),
        Mlx5Cmd::Layouts { json: false } => {
            for l in rnic_mlx5_prm::ALL_LAYOUTS {
                let source = if l.source.is_ifc() {
                    "mlx5_ifc.h"
                } else {
                    "mlx5.md"
                };
                println!(
                    "{:<32} {:>7} bits  {:>3} fields  ({source})",
                    l.name,
                    l.size_bits,
                    l.fields.len()
                );
            }
        }
    }
}
