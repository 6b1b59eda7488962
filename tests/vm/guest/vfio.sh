#!/bin/sh
# Scenario vfio, guest side: q35 + intel-iommu + edu, 2 NUMA nodes. Binds edu to vfio-pci
# via driver_override and runs the static VFIO self-test driver from the share.
. /mnt/host/common.sh
echo "cmdline: $(cat /proc/cmdline)"
dmesg | grep -E 'DMAR: IOMMU enabled|DMAR-IR: Enabled|Default domain type'
nodes=$(ls -d /sys/devices/system/node/node[0-9]* | wc -l)
echo "NUMA nodes: $nodes"
for n in /sys/devices/system/node/node[0-9]*; do
  echo "${n##*/}: cpus $(cat "$n/cpulist"), $(grep MemTotal "$n/meminfo" | awk '{print $4, $5}')"
done
BDF=$(lspci -D -n -d 1234:11e8 | cut -d' ' -f1)
[ -n "$BDF" ] || { echo "no edu device (1234:11e8)"; exit 1; }
GROUP=$(basename "$(readlink "/sys/bus/pci/devices/$BDF/iommu_group")")
echo "edu $BDF, iommu group $GROUP, numa_node $(cat "/sys/bus/pci/devices/$BDF/numa_node")"
modprobe vfio-pci || exit 1
echo vfio-pci > "/sys/bus/pci/devices/$BDF/driver_override"
[ -e "/sys/bus/pci/devices/$BDF/driver" ] && echo "$BDF" > "/sys/bus/pci/devices/$BDF/driver/unbind"
echo "$BDF" > /sys/bus/pci/drivers_probe
echo "edu driver: $(basename "$(readlink "/sys/bus/pci/devices/$BDF/driver")")"
export BDF GROUP
step "vfio_edu" timeout 120 "$S/vfio_edu" "$GROUP" "$BDF"
dmesg | grep -E 'DMAR: \[DMA' | tail -2
run_extra || exit 1
[ "$nodes" -eq 2 ] || { echo "expected 2 NUMA nodes"; exit 1; }
exit $fail
