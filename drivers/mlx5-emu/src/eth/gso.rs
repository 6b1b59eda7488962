//! What an AF_PACKET socket with `PACKET_VNET_HDR` hands over, made into the frames a wire
//! carries. A host stack sending on a veth leaves work for "the NIC": a checksum only
//! partially computed (`VIRTIO_NET_HDR_F_NEEDS_CSUM`) and UDP segmentation offload (one
//! large skb standing for many datagrams, `VIRTIO_NET_HDR_GSO_UDP_L4`, as rnic-rxe's and
//! kernel rxe's UDP GSO sends are). The peer veth passes the skb through as it is, so the
//! emulated port does what the sender's NIC would have done before the bytes reached a
//! cable: finish the checksum, cut the datagrams. Layout: `include/uapi/linux/virtio_net.h`
//! (`struct virtio_net_hdr`, host byte order on a packet socket), segmentation as the
//! kernel's `__udp_gso_segment` does it (IPv4 ID incremented per segment).

use rnic_mlx5_prm::eth_cs_flags;
use rnic_roce::wire::ip::{checksum_add, checksum_fold};

use super::frame::fill_checksums;

/// Bytes of `struct virtio_net_hdr` in front of every frame.
pub(crate) const VNET_HDR_LEN: usize = 10;
const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_UDP: u8 = 3;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

/// The header fields used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub(crate) fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }
}

/// Why a frame from the packet socket was not passed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unusable {
    /// A segmentation offload other than UDP (TCP: no RoCE there), or one whose headers do
    /// not parse.
    Gso,
    /// A checksum offset outside the frame.
    Checksum,
}

/// The frames `frame` (its vnet header `h` taken off) stands for, in order.
pub(crate) fn frames(h: VnetHdr, frame: &[u8]) -> Result<Vec<Vec<u8>>, Unusable> {
    match h.gso_type & !GSO_ECN {
        GSO_NONE => {
            let mut f = frame.to_vec();
            if h.flags & F_NEEDS_CSUM != 0 {
                finish_checksum(&mut f, h.csum_start.into(), h.csum_offset.into())?;
            }
            Ok(vec![f])
        }
        GSO_UDP | GSO_UDP_L4 if h.gso_size > 0 => segment_udp(frame, h.gso_size.into()),
        _ => Err(Unusable::Gso),
    }
}

/// Finish a partial checksum: the field at `start + offset` holds the pseudo-header sum, the
/// checksum covers `start..`.
fn finish_checksum(f: &mut [u8], start: usize, offset: usize) -> Result<(), Unusable> {
    let at = start + offset;
    if at + 2 > f.len() || start > f.len() {
        return Err(Unusable::Checksum);
    }
    let mut c = checksum_fold(checksum_add(0, &f[start..]));
    if c == 0 {
        c = 0xffff;
    }
    f[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Where the headers of an Ethernet (+ 802.1Q) / IPv4-or-IPv6 / UDP frame are.
struct Layout {
    l3: usize,
    v4: bool,
    l4: usize,
}

fn layout(f: &[u8]) -> Option<Layout> {
    let mut l3 = 14;
    let mut ty = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    if ty == 0x8100 {
        ty = u16::from_be_bytes([*f.get(16)?, *f.get(17)?]);
        l3 = 18;
    }
    match ty {
        0x0800 => {
            let ihl = usize::from(f.get(l3)? & 0x0f) * 4;
            (ihl >= 20 && *f.get(l3 + 9)? == 17).then_some(Layout {
                l3,
                v4: true,
                l4: l3 + ihl,
            })
        }
        0x86dd => (*f.get(l3 + 6)? == 17).then_some(Layout {
            l3,
            v4: false,
            l4: l3 + 40,
        }),
        _ => None,
    }
}

/// Cut a UDP GSO frame into datagrams of `size` payload bytes (the last shorter): headers
/// copied, lengths set, the IPv4 ID incremented, then the IPv4 header and UDP checksums
/// filled as a raw send's checksum offloads fill them ([`fill_checksums`]). The super-frame's
/// own length fields are not trusted: [`layout`] finds the headers without them.
fn segment_udp(f: &[u8], size: usize) -> Result<Vec<Vec<u8>>, Unusable> {
    let l = layout(f).ok_or(Unusable::Gso)?;
    let hdr = l.l4 + 8;
    if f.len() <= hdr {
        return Err(Unusable::Gso);
    }
    let id0 = u16::from_be_bytes([f[l.l3 + 4], f[l.l3 + 5]]);
    let mut out = Vec::new();
    for (i, chunk) in f[hdr..].chunks(size).enumerate() {
        let mut s = Vec::with_capacity(hdr + chunk.len());
        s.extend_from_slice(&f[..hdr]);
        s.extend_from_slice(chunk);
        let udp_len = (8 + chunk.len()) as u16;
        if l.v4 {
            let total = (s.len() - l.l3) as u16;
            s[l.l3 + 2..l.l3 + 4].copy_from_slice(&total.to_be_bytes());
            s[l.l3 + 4..l.l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        } else {
            s[l.l3 + 4..l.l3 + 6].copy_from_slice(&udp_len.to_be_bytes());
        }
        s[l.l4 + 4..l.l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        fill_checksums(&mut s, eth_cs_flags::L3_CSUM | eth_cs_flags::L4_CSUM);
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_roce::wire::ip::internet_checksum;

    /// An Ethernet / IPv4 / UDP frame with `payload`, IPv4 ID `id`.
    fn v4_frame(payload: &[u8], id: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        let total = (20 + 8 + payload.len()) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    fn udp_ok(s: &[u8], l3: usize, l4: usize, v4: bool) -> bool {
        let udp_len = u16::from_be_bytes([s[l4 + 4], s[l4 + 5]]);
        let (src, len) = if v4 { (l3 + 12, 8) } else { (l3 + 8, 32) };
        let mut sum = checksum_add(0, &s[src..src + len]);
        sum = checksum_add(sum, &[0, 17]);
        sum = checksum_add(sum, &udp_len.to_be_bytes());
        checksum_fold(checksum_add(sum, &s[l4..])) == 0
    }

    #[test]
    fn a_udp_gso_frame_becomes_datagrams_with_incremented_ids_and_valid_checksums() {
        let payload: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let f = v4_frame(&payload, 0);
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            gso_size: 1000,
            csum_start: 34,
            csum_offset: 6,
        };
        let segs = frames(h, &f).unwrap();
        assert_eq!(segs.len(), 3);
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let n = if i < 2 { 1000 } else { 500 };
            assert_eq!(s.len(), 14 + 20 + 8 + n);
            assert_eq!(u16::from_be_bytes([s[16], s[17]]) as usize, 20 + 8 + n);
            assert_eq!(u16::from_be_bytes([s[18], s[19]]), i as u16, "IPv4 ID");
            assert_eq!(internet_checksum(&s[14..34]), 0, "IPv4 header checksum");
            assert_eq!(u16::from_be_bytes([s[38], s[39]]) as usize, 8 + n);
            assert!(udp_ok(s, 14, 34, true));
            assert_eq!(&s[..14], &f[..14]);
            joined.extend_from_slice(&s[42..]);
        }
        assert_eq!(joined, payload, "the payload, cut in order");
    }

    #[test]
    fn ipv6_segments_and_partial_checksums_are_finished() {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        let mut ip = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        ip.extend_from_slice(&[0xfd, 0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        ip.extend_from_slice(&[0xfd, 0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 0, 0, 0]);
        f.extend_from_slice(&[7u8; 1500]);
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            gso_size: 1024,
            csum_start: 54,
            csum_offset: 6,
        };
        let segs = frames(h, &f).unwrap();
        assert_eq!(segs.len(), 2);
        for s in &segs {
            let plen = u16::from_be_bytes([s[18], s[19]]) as usize;
            assert_eq!(plen, s.len() - 54, "IPv6 payload length");
            assert!(udp_ok(s, 14, 54, false));
        }
        // No GSO, a partial checksum: the pseudo-header sum in the field, finished here.
        let mut one = segs[1].clone();
        let udp_len = u16::from_be_bytes([one[58], one[59]]);
        let mut pseudo = checksum_add(0, &one[22..54]);
        pseudo = checksum_add(pseudo, &[0, 17]);
        pseudo = checksum_add(pseudo, &udp_len.to_be_bytes());
        let partial = !checksum_fold(pseudo);
        one[60..62].copy_from_slice(&partial.to_be_bytes());
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            gso_size: 0,
            csum_start: 54,
            csum_offset: 6,
        };
        let done = frames(h, &one).unwrap();
        assert_eq!(done, vec![segs[1].clone()]);
    }

    #[test]
    fn unusable_offloads_are_refused_not_passed_on() {
        let f = v4_frame(&[1; 100], 9);
        let tcp = VnetHdr {
            flags: 0,
            gso_type: 1,
            gso_size: 10,
            csum_start: 0,
            csum_offset: 0,
        };
        assert_eq!(frames(tcp, &f), Err(Unusable::Gso));
        let bad = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            gso_size: 0,
            csum_start: 200,
            csum_offset: 6,
        };
        assert_eq!(frames(bad, &f), Err(Unusable::Checksum));
        assert_eq!(
            frames(
                VnetHdr {
                    gso_type: GSO_UDP_L4,
                    gso_size: 10,
                    ..bad
                },
                &f[..20]
            ),
            Err(Unusable::Gso)
        );
    }
}
