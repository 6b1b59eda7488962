//! The receive side of the Ethernet port: every frame from the wire (or looped back from the
//! function itself) goes through the MAC filter, then RoCE v2 for an address of the GID
//! table goes to the RDMA engine, and everything else through the NIC RX flow tables into a
//! raw receive queue. Each drop is counted by cause ([`crate::eth::PortCounters`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;

use super::Hca;
use super::port::frame_len;
use super::raw::Delivery;
use super::steer::Verdict;
use crate::device::Device;
use crate::eth::{EthPort, Headers, L4, MacClass, match_key};

impl Hca {
    /// A frame of `full_len` bytes arrived (`frame` holds what fit the buffer); `looped`:
    /// the function sent it itself (the transport domain of its SQ, or `None` for RoCE) —
    /// else it came from the wire.
    pub(crate) fn on_frame(
        &mut self,
        port: &EthPort,
        frame: &[u8],
        full_len: usize,
        looped: Option<Option<u32>>,
    ) {
        let c = &*port.counters;
        let Some(h) = Headers::parse(frame) else {
            c.rx_malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if full_len > frame.len() || full_len - h.l3 > port.mtu as usize {
            c.rx_mtu.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let class = MacClass::of(&h.dmac, &port.mac);
        port.count_rx(class, frame.len());
        if class == MacClass::Other {
            return;
        }
        if looped.is_some() {
            c.rx_loopback.fetch_add(1, Ordering::Relaxed);
        }
        let Some(dev) = self.dev.upgrade() else {
            return;
        };
        if !dev.serving() {
            self.stats.halted_drops += 1;
            return;
        }
        if !dev.link_up() {
            self.stats.link_down_drops += 1;
            return;
        }
        if class == MacClass::Own && h.vlan.is_none() && self.is_roce(&h) {
            match rnic_roce::wire::Frame::parse(frame) {
                Ok(f) => {
                    c.rx_roce.fetch_add(1, Ordering::Relaxed);
                    let d = &f.datagram;
                    let icrc_ok = d.verify_icrc().is_ok();
                    let (src, dst) = match d.ip {
                        rnic_roce::wire::IpRepr::V4(r) => {
                            (IpAddr::V4(r.src_addr), IpAddr::V4(r.dst_addr))
                        }
                        rnic_roce::wire::IpRepr::V6(r) => {
                            (IpAddr::V6(r.src_addr), IpAddr::V6(r.dst_addr))
                        }
                    };
                    let roce = d.ip_packet.get(d.ip.header_len() + 8..).unwrap_or(&[]);
                    self.on_packet(dst, SocketAddr::new(src, d.udp.src_port), roce, icrc_ok);
                }
                Err(e) => {
                    // Addressed to the RDMA engine, not a RoCE v2 packet it can take.
                    c.rx_malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%e, "malformed RoCE frame dropped");
                }
            }
            return;
        }
        // A group address reaches the flow table only when the vport subscribed to it (its
        // multicast list, broadcast included, or promisc_mc): a ConnectX's e-switch replicates
        // broadcast and multicast to a vport by that list (mlx5e programs it with broadcast
        // and every multicast address of the netdev).
        if matches!(class, MacClass::Broadcast | MacClass::Multicast)
            && !self.promisc_mc
            && !self.mc_list.contains(&h.dmac)
        {
            c.rx_not_subscribed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.steer.lookup(&match_key(&h)) {
            Verdict::NoRule => {
                c.rx_no_rule.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Drop => {
                c.rx_rule_drop.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Forward { tirs, flow_tag } => {
                for tirn in tirs {
                    let d = self.raw_deliver(&dev, tirn, frame, flow_tag, looped.flatten());
                    let counter = match d {
                        Delivery::Delivered => &c.rx_delivered,
                        Delivery::RqEmpty => &c.rx_rq_empty,
                        Delivery::LoopbackBlocked => &c.rx_lb_blocked,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether `h` is RoCE v2 for the RDMA engine: UDP to port 4791 at an address of the GID
    /// table (not a fragment).
    fn is_roce(&self, h: &Headers) -> bool {
        let Some(ip) = h.ip else { return false };
        if ip.frag || !matches!(ip.l4, Some(L4::Udp { dport: 4791, .. })) {
            return false;
        }
        let dst = if ip.version == 4 {
            IpAddr::V4(std::net::Ipv4Addr::new(
                ip.dst[12], ip.dst[13], ip.dst[14], ip.dst[15],
            ))
        } else {
            IpAddr::V6(std::net::Ipv6Addr::from(ip.dst))
        };
        self.gids.iter().flatten().any(|g| g.ip == dst)
    }

    /// Run the frames the function sent to itself through its receive path (those that
    /// doing so produces are run too, in order).
    pub(crate) fn drain_loopback(&mut self, _dev: &Device) {
        if self.draining || self.loopback.is_empty() {
            return;
        }
        let Some(port) = self.eth.clone() else {
            self.loopback.clear();
            return;
        };
        self.draining = true;
        // Bounded: a ping-pong between two of the function's own QPs ends when their work
        // does; a runaway is cut after this many frames.
        for _ in 0..65_536 {
            let Some((frame, td)) = self.loopback.pop_front() else {
                break;
            };
            let len = frame.len();
            self.on_frame(&port, &frame, len, Some(td));
        }
        self.loopback.clear();
        self.draining = false;
    }

    /// Count a RoCE datagram the udp wire received at `local` (`len` UDP payload bytes) as
    /// the frame it stands for.
    pub(crate) fn count_udp_rx(&self, local: IpAddr, len: usize) {
        let c = &*self.counters;
        let n = frame_len(local, len);
        c.rx_frames.fetch_add(1, Ordering::Relaxed);
        c.rx_octets.fetch_add(n, Ordering::Relaxed);
        c.rx_unicast.fetch_add(1, Ordering::Relaxed);
        c.rx_unicast_octets.fetch_add(n, Ordering::Relaxed);
        c.rx_roce.fetch_add(1, Ordering::Relaxed);
    }
}
