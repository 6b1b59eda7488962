# Scenario vfio-rust: the machine of `vfio` (q35 + intel-iommu with caching mode and
# interrupt remapping + edu, 2 NUMA nodes of 1 GiB) plus an e1000e, running rnic-vfio's
# examples host-built from the share: the edu driver (drivers/vfio/examples/edu.rs) and the
# MSI-X check on the e1000e (e1000e_msix.rs), which the guest first binds to its kernel driver;
# then the real kernel's error paths through vfio_open.rs: a second edu and a virtio-net behind
# one PCIe-to-PCI bridge share an IOMMU group, so with the virtio-net on virtio-pci the edu's
# group is not viable. (A second e1000e there tripped QEMU 7.2's e1000e MSI-X throttling-timer
# assertion, `msix_enabled(timer->core->owner)`, after the kernel driver probed it.)
# tests/vm.rs builds them and passes their folder in RNIC_VFIO_EXAMPLES; by hand, this builds them.
SCENARIO_TIMEOUT=240

scenario_prepare() {
  local dir=${RNIC_VFIO_EXAMPLES:-}
  if [ -z "$dir" ]; then
    (cd "$REPO" && cargo build -q -p rnic-vfio --example edu --example e1000e_msix --example vfio_open) || return 1
    dir=${CARGO_TARGET_DIR:-$REPO/target}/debug/examples
  fi
  cp "$dir/edu" "$dir/e1000e_msix" "$dir/vfio_open" "$SHARE/"
}

scenario_main() {
  VM_APPEND="intel_iommu=on" vm_start vfio-rust \
    -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on \
    -object memory-backend-ram,id=mem0,size=1G -object memory-backend-ram,id=mem1,size=1G \
    -numa node,nodeid=0,cpus=0,memdev=mem0 -numa node,nodeid=1,cpus=1,memdev=mem1 \
    -device edu -device e1000e \
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
  return $ok
}
