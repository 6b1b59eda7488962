# Scenario (c): q35 + intel-iommu (caching mode, interrupt remapping) + edu, 2 NUMA nodes;
# the guest binds edu to vfio-pci and runs vfio_edu (static C, built here) from the share.
SCENARIO_TIMEOUT=200

scenario_prepare() {
  gcc -static -O2 -Wall -o "$SHARE/vfio_edu" "$HERE/vfio_edu.c"
}

scenario_main() {
  VM_APPEND="intel_iommu=on" vm_start vfio \
    -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on \
    -object memory-backend-ram,id=mem0,size=1G -object memory-backend-ram,id=mem1,size=1G \
    -numa node,nodeid=0,cpus=0,memdev=mem0 -numa node,nodeid=1,cpus=1,memdev=mem1 \
    -device edu
  vm_wait vfio
  guest_ok vfio
}

scenario_check() {
  local ok=0 o=$SHARE/vfio.out
  expect "$o" '^NUMA nodes: 2$' "guest sees 2 NUMA nodes" || ok=1
  expect "$o" '^edu driver: vfio-pci$' "edu bound to vfio-pci" || ok=1
  expect "$o" 'DMA round trip .*MATCH$' "DMA round trip through the vIOMMU" || ok=1
  expect "$o" '^RESULT: PASS$' "vfio_edu self-test" || ok=1
  return $ok
}
