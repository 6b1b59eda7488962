//! [`KvRegion`]: the KV cache as tensor views over registered memory.
//!
//! The decode node never copies the cache out of the region the prefill
//! wrote into: each attention step reads the one K or V row it needs
//! (`heads × head_dim` floats) straight from the region with a bulk
//! `Memory::read` into a row-sized scratch buffer, and appends its own
//! positions with `Memory::write` at their offsets. No reference into the
//! region is ever formed (the region may be device-visible memory).

use std::cell::RefCell;
use std::sync::Arc;

use rnic::core::Memory;

use crate::KvError;
use crate::layout::KvGeometry;
use crate::model::{Fnv, KvStore};

/// K/V tensor views over a region laid out as [`KvGeometry`] says.
#[derive(Debug)]
pub struct KvRegion {
    mem: Arc<dyn Memory>,
    g: KvGeometry,
    d_model: usize,
    /// One row of bytes: the only staging a read needs.
    row: RefCell<Vec<u8>>,
}

impl KvRegion {
    /// Views over `mem`; checks the geometry fits.
    pub fn new(mem: Arc<dyn Memory>, g: KvGeometry, d_model: usize) -> Result<KvRegion, KvError> {
        g.check(d_model, mem.len() as u64)?;
        Ok(KvRegion {
            mem,
            g,
            d_model,
            row: RefCell::new(vec![0; d_model * 4]),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &KvGeometry {
        &self.g
    }

    fn read_row(&self, offset: u64, out: &mut [f32]) -> Result<(), KvError> {
        if out.len() != self.d_model {
            return Err(KvError::Config {
                reason: "row buffer is not d_model wide",
            });
        }
        let mut row = self.row.borrow_mut();
        self.mem
            .read(offset as usize, &mut row)
            .map_err(KvError::mem("reading a KV row"))?;
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    fn write_row(&self, offset: u64, src: &[f32]) -> Result<(), KvError> {
        let mut row = self.row.borrow_mut();
        for (b, x) in row.chunks_exact_mut(4).zip(src) {
            b.copy_from_slice(&x.to_le_bytes());
        }
        self.mem
            .write(offset as usize, &row)
            .map_err(KvError::mem("appending a KV row"))
    }

    fn check_pos(&self, layer: usize, pos: usize) -> Result<(), KvError> {
        if layer >= self.g.layers as usize || pos >= self.g.capacity as usize {
            return Err(KvError::Config {
                reason: "KV position beyond the region's capacity",
            });
        }
        Ok(())
    }

    /// FNV-1a of the shipped part of the cache (positions `0..tokens` of
    /// every layer's K and V), read through the region row by row.
    pub fn digest(&self) -> Result<u64, KvError> {
        digest_rows(&*self.mem, &self.g)
    }
}

/// FNV-1a of positions `0..tokens` of every layer's K then V in `mem`.
pub fn digest_rows(mem: &dyn Memory, g: &KvGeometry) -> Result<u64, KvError> {
    let mut h = Fnv::new();
    let mut row = vec![0u8; g.token_stride as usize];
    for l in 0..g.layers as usize {
        for v in [false, true] {
            for p in 0..g.tokens as usize {
                let off = if v { g.v_row(l, p) } else { g.k_row(l, p) };
                mem.read(off as usize, &mut row)
                    .map_err(KvError::mem("hashing the KV cache"))?;
                h.bytes(&row);
            }
        }
    }
    Ok(h.finish())
}

impl KvStore for KvRegion {
    fn read_k(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError> {
        self.check_pos(layer, pos)?;
        self.read_row(self.g.k_row(layer, pos), out)
    }

    fn read_v(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError> {
        self.check_pos(layer, pos)?;
        self.read_row(self.g.v_row(layer, pos), out)
    }

    fn write_kv(&self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        self.check_pos(layer, pos)?;
        self.write_row(self.g.k_row(layer, pos), k)?;
        self.write_row(self.g.v_row(layer, pos), v)
    }
}

/// Little-endian bytes of `rows` (what the prefill stages and ships).
pub fn f32_bytes(rows: &[f32], out: &mut Vec<u8>) {
    out.clear();
    append_f32(rows, out);
}

/// Append the little-endian bytes of `rows` to `out`.
pub fn append_f32(rows: &[f32], out: &mut Vec<u8>) {
    out.reserve(rows.len() * 4);
    for x in rows {
        out.extend_from_slice(&x.to_le_bytes());
    }
}
