# Scenario vfio-rust: the machine of `vfio` (q35 + intel-iommu with caching mode and
# interrupt remapping + edu, 2 NUMA nodes of 1 GiB) plus an e1000e, running rnic-vfio's
# examples host-built from the share: the edu driver (drivers/vfio/examples/edu.rs) and the
# MSI-X check on the e1000e (e1000e_msix.rs), which the guest first binds to its kernel driver;
# then the real kernel's error paths through vfio_open.rs: a second edu and a virtio-net behind
# one PCIe-to-PCI bridge share an IOMMU group, so with the virtio-net on virtio-pci the edu's
# group is not viable. (A second e1000e there tripped QEMU 7.2's e1000e MSI-X throttling-timer
# assertion, `msix_enabled(timer->core->owner)`, after the kernel driver probed it.)
# A peer BAR (issue 28): an ivshmem-plain whose BAR2 is backed by a host file stands in for a
# GPU BAR; peer_bar.rs maps it into edu's IOMMU domain (rnic-dma's PeerRegion), has edu DMA into
# it, and scenario_check reads the bytes back from the file on the host.
# Application memory in place (issue 29): rnic-mlx5's map_user (kernel-VFIO route) maps a
# program's heap pages into edu's IOMMU domain (drivers/mlx5/examples/user_pages_edu.rs).
# tests/vm.rs builds them and passes their folder in RNIC_VFIO_EXAMPLES; by hand, this builds them.
SCENARIO_TIMEOUT=240

scenario_prepare() {
  local dir=${RNIC_VFIO_EXAMPLES:-}
  if [ -z "$dir" ]; then
    (cd "$REPO" && cargo build -q -p rnic-vfio --example edu --example e1000e_msix --example vfio_open \
      --example peer_bar && cargo build -q -p rnic-mlx5 --example user_pages_edu) || return 1
    dir=${CARGO_TARGET_DIR:-$REPO/target}/debug/examples
  fi
  cp "$dir/edu" "$dir/e1000e_msix" "$dir/vfio_open" "$dir/peer_bar" "$dir/user_pages_edu" "$SHARE/"
}

scenario_main() {
  VM_APPEND="intel_iommu=on" vm_start vfio-rust \
    -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on \
    -object memory-backend-ram,id=mem0,size=1G -object memory-backend-ram,id=mem1,size=1G \
    -numa node,nodeid=0,cpus=0,memdev=mem0 -numa node,nodeid=1,cpus=1,memdev=mem1 \
    -device edu -device e1000e \
    -object memory-backend-file,id=peer0,mem-path="$RESULTS/ivshmem.bin",size=1M,share=on \
    -device ivshmem-plain,memdev=peer0,addr=0x10 \
    -device pcie-pci-bridge,id=pb -device edu,bus=pb,addr=1 -device virtio-net-pci,bus=pb,addr=2
  vm_wait vfio-rust
  guest_ok vfio-rust
}

scenario_check() {
  local ok=0 o=$SHARE/vfio-rust.out
  expect "$o" '^NUMA nodes: 2$' "guest sees 2 NUMA nodes" || ok=1
  expect "$o" '^CHECK dma-roundtrip: PASS' "DMA round trip through the vIOMMU" || ok=1
  expect "$o" '^edu rc=0$' "Rust edu driver" || ok=1
  expect "$o" '^e1000e_msix rc=0$' "MSI-X on the e1000e" || ok=1
  expect "$o" '^CHECK peer-dma: PASS' "edu DMA into the ivshmem BAR through the peer region" || ok=1
  expect "$o" '^peer_bar rc=0$' "peer-BAR checks" || ok=1
  expect "$o" '^CHECK user-dma: PASS' "edu DMA through application pages mapped by rnic-mlx5" || ok=1
  expect "$o" '^user_pages_edu rc=0$' "rnic-mlx5 map_user on kernel VFIO" || ok=1
  # The bytes edu wrote, read from the ivshmem's backing file on the host: pattern A at 0,
  # pattern B at 8 KiB (written after the ivshmem handles were dropped), never pattern C.
  if python3 - "$RESULTS/ivshmem.bin" <<'PY'
import sys
b = open(sys.argv[1], "rb").read()
a = bytes((i * 7 + 3) & 0xff for i in range(2048))
bb = bytes((i * 13 + 5) & 0xff for i in range(2048))
sys.exit(0 if b[:2048] == a and b[8192:8192 + 2048] == bb else 1)
PY
  then say "PASS host file holds edu's DMA (A at 0, B at 8 KiB)"; else say "FAIL host file lacks edu's DMA"; ok=1; fi
  return $ok
}
