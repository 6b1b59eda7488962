//! What the kernel lets a VFIO owner pin and map (audit row 23).

use crate::Mlx5Error;

/// What the kernel lets a VFIO owner pin and map (audit row 23): every
/// firmware page, queue and mailbox is pinned through VFIO type1, one DMA
/// mapping per buffer. `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaBudget {
    /// `RLIMIT_MEMLOCK` in bytes, unless the process has `CAP_IPC_LOCK`.
    pub memlock: Option<u64>,
    /// vfio_iommu_type1's `dma_entry_limit`.
    pub entries: Option<u64>,
}

/// Bytes pinned besides the firmware pages (command queue, mailboxes, EQ,
/// a first CQ and QP): what bring-up needs before the firmware asks.
pub const BASE_PIN_BYTES: u64 = 1 << 20;

impl DmaBudget {
    /// Refuse to pin `bytes` more on top of `pinned` (in `buffers` more
    /// mappings on top of `mapped`) when the budget cannot hold them, with
    /// the fix.
    pub fn check(
        &self,
        function: &str,
        pinned: u64,
        bytes: u64,
        mapped: u64,
        buffers: u64,
    ) -> Result<(), Mlx5Error> {
        if let Some(limit) = self.memlock
            && pinned.saturating_add(bytes) > limit
        {
            return Err(Mlx5Error::DmaBudget {
                function: function.into(),
                what: "RLIMIT_MEMLOCK",
                needed: pinned.saturating_add(bytes),
                limit,
                fix: "run with `ulimit -l unlimited` (limits.conf `memlock unlimited`, systemd \
                      `LimitMEMLOCK=infinity`) or give the process CAP_IPC_LOCK: every firmware \
                      page is pinned through VFIO",
            });
        }
        if let Some(limit) = self.entries
            && mapped.saturating_add(buffers) > limit
        {
            return Err(Mlx5Error::DmaBudget {
                function: function.into(),
                what: "vfio_iommu_type1 dma_entry_limit",
                needed: mapped.saturating_add(buffers),
                limit,
                fix: "raise it: `echo 262144 > /sys/module/vfio_iommu_type1/parameters/\
                      dma_entry_limit` (or modprobe vfio_iommu_type1 dma_entry_limit=262144)",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_memlock_or_the_mapping_limit_cannot_hold_with_the_fix() {
        let b = DmaBudget {
            memlock: Some(64 << 20),
            entries: Some(100),
        };
        b.check("f", 1 << 20, 32 << 20, 10, 64).unwrap();
        let e = b.check("f", 1 << 20, 64 << 20, 10, 1).unwrap_err();
        assert!(
            matches!(e, Mlx5Error::DmaBudget { what: "RLIMIT_MEMLOCK", limit, .. } if limit == 64 << 20),
            "{e}"
        );
        assert!(e.to_string().contains("ulimit -l unlimited"), "{e}");
        let e = b.check("f", 0, 4096, 99, 2).unwrap_err();
        assert!(e.to_string().contains("dma_entry_limit"), "{e}");
        DmaBudget::default()
            .check("f", u64::MAX / 2, u64::MAX / 2, u64::MAX / 2, 1)
            .unwrap();
    }
}
