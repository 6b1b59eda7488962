# Scenario vfio-rust: the machine of `vfio` (q35 + intel-iommu with caching mode and
# interrupt remapping + edu, 2 NUMA nodes of 1 GiB) running the Rust edu driver
# (drivers/vfio/examples/edu.rs on rnic-vfio + rnic-dma), host-built, from the share.
# tests/vm.rs builds it and passes its path in RNIC_VFIO_EDU; by hand, this builds it.
SCENARIO_TIMEOUT=240

scenario_prepare() {
  local bin=${RNIC_VFIO_EDU:-}
  if [ -z "$bin" ]; then
    (cd "$REPO" && cargo build -q -p rnic-vfio --example edu) || return 1
    bin=${CARGO_TARGET_DIR:-$REPO/target}/debug/examples/edu
  fi
  cp "$bin" "$SHARE/edu"
}

scenario_main() {
  VM_APPEND="intel_iommu=on" vm_start vfio-rust \
    -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on \
    -object memory-backend-ram,id=mem0,size=1G -object memory-backend-ram,id=mem1,size=1G \
    -numa node,nodeid=0,cpus=0,memdev=mem0 -numa node,nodeid=1,cpus=1,memdev=mem1 \
    -device edu
  vm_wait vfio-rust
  guest_ok vfio-rust
}

scenario_check() {
  local ok=0 o=$SHARE/vfio-rust.out
  expect "$o" '^NUMA nodes: 2$' "guest sees 2 NUMA nodes" || ok=1
  expect "$o" '^CHECK dma-roundtrip: PASS' "DMA round trip through the vIOMMU" || ok=1
  expect "$o" '^RESULT: PASS$' "Rust edu driver" || ok=1
  return $ok
}
