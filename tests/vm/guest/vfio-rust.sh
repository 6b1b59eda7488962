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
BDF=$(lspci -D -n -d 1234:11e8 | cut -d' ' -f1 | head -1)
[ -n "$BDF" ] || { echo "no edu device (1234:11e8)"; exit 1; }
drv() { l=$(readlink "/sys/bus/pci/devices/$BDF/driver") && basename "$l" || echo none; }
echo "edu $BDF driver before: $(drv)"
modprobe vfio-pci || exit 1
step "edu" timeout 150 "$S/edu" "$BDF"
echo "edu $BDF driver after: $(drv)"
echo "DMAR faults: $(dmesg | grep -c 'DMAR: \[DMA')"
dmesg | grep -E 'DMAR: \[DMA|fault addr' | tail -3
# A peer BAR in edu's IOMMU domain: ivshmem-plain's BAR2 stands in for a GPU's BAR1.
SHM=$(lspci -D -n -d 1af4:1110 | cut -d' ' -f1 | head -1)
[ -n "$SHM" ] || { echo "no ivshmem-plain (1af4:1110)"; exit 1; }
f0=$(dmesg | grep -c 'DMAR: \[DMA')
step "peer_bar" timeout 120 "$S/peer_bar" "$BDF" "$SHM"
echo "peer DMAR faults: $(( $(dmesg | grep -c 'DMAR: \[DMA') - f0 ))"
dmesg | grep -E 'DMAR: \[DMA|fault addr' | tail -2
# rnic-mlx5's registration of application memory in place, kernel-VFIO route, on edu.
f0=$(dmesg | grep -c 'DMAR: \[DMA')
step "user_pages_edu" timeout 120 "$S/user_pages_edu" "$BDF"
echo "user-pages DMAR faults: $(( $(dmesg | grep -c 'DMAR: \[DMA') - f0 ))"
dmesg | grep -E 'DMAR: \[DMA|fault addr' | tail -1
# MSI-X, reset and restoring a real driver: an e1000e bound to the kernel's e1000e first.
NIC_BDF=$(lspci -D -n -d 8086:10d3 | cut -d' ' -f1 | head -1)
[ -n "$NIC_BDF" ] || { echo "no e1000e (8086:10d3)"; exit 1; }
modprobe e1000e || exit 1
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "/sys/bus/pci/devices/$NIC_BDF/driver" ] && break; sleep 0.5; done
echo "e1000e $NIC_BDF driver before: $(BDF=$NIC_BDF drv)"
step "e1000e_msix" timeout 120 "$S/e1000e_msix" "$NIC_BDF"
echo "e1000e $NIC_BDF driver after: $(BDF=$NIC_BDF drv)"
# The real kernel's error paths, through rnic-vfio's messages.
group() { basename "$(readlink "/sys/bus/pci/devices/$1/iommu_group")"; }
EDU2=$(lspci -D -n -d 1234:11e8 | cut -d' ' -f1 | sed -n 2p)
NIC2=$(lspci -D -n -d 1af4:1000 | cut -d' ' -f1 | head -1)
echo "behind the bridge: edu $EDU2 group $(group "$EDU2"), virtio-net $NIC2 group $(group "$NIC2") driver $(BDF=$NIC2 drv)"
echo vfio-pci > "/sys/bus/pci/devices/$EDU2/driver_override"
echo "$EDU2" > /sys/bus/pci/drivers_probe
echo "errors: non-viable group"; "$S/vfio_open" "$EDU2"
echo "errors: bound to a host driver"; "$S/vfio_open" "$NIC_BDF"
echo "errors: no such device"; "$S/vfio_open" 0000:0e:1f.7
echo "errors: the bridge's edu once its group is viable"
echo "$NIC2" > "/sys/bus/pci/devices/$NIC2/driver/unbind"
"$S/vfio_open" "$EDU2"
echo "errors: permission (uid 65534)"
setpriv --reuid=65534 --regid=65534 --clear-groups "$S/vfio_open" "$EDU2"
echo "errors: RLIMIT_MEMLOCK (uid 65534 owning the group, limit 1 MiB, 64 MiB mapped)"
chown 65534 "/dev/vfio/$(group "$EDU2")"
(ulimit -l 1024 && setpriv --reuid=65534 --regid=65534 --clear-groups "$S/vfio_open" "$EDU2" --map 64)
echo "errors: the same as root"
"$S/vfio_open" "$EDU2" --map 64
chown 0 "/dev/vfio/$(group "$EDU2")"
export BDF
run_extra || exit 1
[ "$nodes" -eq 2 ] || { echo "expected 2 NUMA nodes"; exit 1; }
exit $fail
