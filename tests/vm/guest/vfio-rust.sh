#!/bin/sh
# Scenario vfio-rust, guest side: reserve 2 MiB hugepages on both nodes, load vfio-pci and
# run the Rust edu driver from the share (it binds edu to vfio-pci itself and restores it).
. /mnt/host/common.sh
dmesg | grep -E 'DMAR: IOMMU enabled|DMAR-IR: Enabled|Default domain type'
nodes=$(ls -d /sys/devices/system/node/node[0-9]* | wc -l)
echo "NUMA nodes: $nodes"
echo 16 > /proc/sys/vm/nr_hugepages
for n in /sys/devices/system/node/node[0-9]*; do
  echo "${n##*/}: cpus $(cat "$n/cpulist"), 2 MiB hugepages $(cat "$n/hugepages/hugepages-2048kB/nr_hugepages")"
done
BDF=$(lspci -D -n -d 1234:11e8 | cut -d' ' -f1)
[ -n "$BDF" ] || { echo "no edu device (1234:11e8)"; exit 1; }
drv() { l=$(readlink "/sys/bus/pci/devices/$BDF/driver") && basename "$l" || echo none; }
echo "edu $BDF driver before: $(drv)"
modprobe vfio-pci || exit 1
step "edu" timeout 150 "$S/edu" "$BDF"
echo "edu $BDF driver after: $(drv)"
echo "DMAR faults: $(dmesg | grep -c 'DMAR: \[DMA')"
dmesg | grep -E 'DMAR: \[DMA|fault addr' | tail -3
export BDF
run_extra || exit 1
[ "$nodes" -eq 2 ] || { echo "expected 2 NUMA nodes"; exit 1; }
exit $fail
