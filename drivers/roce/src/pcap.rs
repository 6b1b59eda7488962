//! A small classic-pcap reader and writer (safe code, no allocation when
//! reading).
//!
//! The reader takes a whole capture file as a byte slice and yields
//! [`Record`]s that borrow from it; files in either byte order with
//! microsecond or nanosecond timestamps are accepted. A truncated or
//! corrupt file yields a typed [`Error`], never a panic; after an error the
//! iterator ends. The writer emits the global header and then one record
//! per call, in little-endian order.
//!
//! ```
//! use std::time::Duration;
//! use rnic_roce::pcap::{LinkType, Reader, Resolution, Writer};
//!
//! let mut w = Writer::new(Vec::new(), LinkType::ETHERNET, Resolution::Nano)?;
//! w.write_record(Duration::new(1, 5), &[0xAA; 60])?;
//! let file = w.into_inner();
//! let mut r = Reader::new(&file)?;
//! assert_eq!(r.header().link_type, LinkType::ETHERNET);
//! let rec = r.next().expect("one record")?;
//! assert_eq!((rec.timestamp(), rec.data.len()), (Duration::new(1, 5), 60));
//! assert!(r.next().is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, Write};
use std::time::Duration;

use crate::wire::EtherType;

/// Global header length.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Per-record header length.
pub const RECORD_HEADER_LEN: usize = 16;

const MAGIC_MICRO: u32 = 0xa1b2_c3d4;
const MAGIC_NANO: u32 = 0xa1b2_3c4d;
const DEFAULT_SNAPLEN: u32 = 262_144;

/// What went wrong reading a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file ends inside the global header, a record header or a record's data.
    #[error("pcap truncated in {what} at byte {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// Which part was cut short.
        what: &'static str,
        /// File offset where that part starts.
        offset: usize,
        /// Bytes the part needs.
        need: usize,
        /// Bytes left in the file.
        have: usize,
    },
    /// The magic number is not a classic pcap one (pcapng is not supported).
    #[error("not a classic pcap file: magic {0:#010x} (pcapng files must be converted first)")]
    BadMagic(u32),
}

/// Byte order of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Little-endian (written by x86 and most ARM hosts).
    Little,
    /// Big-endian.
    Big,
}

/// Timestamp resolution of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Microseconds (magic 0xa1b2c3d4).
    Micro,
    /// Nanoseconds (magic 0xa1b23c4d).
    Nano,
}

/// A pcap link-layer type (LINKTYPE_* number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkType(pub u32);

impl LinkType {
    /// Ethernet II.
    pub const ETHERNET: LinkType = LinkType(1);
    /// Raw IPv4/IPv6, no link header.
    pub const RAW: LinkType = LinkType(101);
    /// Linux cooked capture v1 (`tcpdump -i any`, older).
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// Linux cooked capture v2 (`tcpdump -i any`, newer).
    pub const LINUX_SLL2: LinkType = LinkType(276);
}

/// The file's global header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GlobalHeader {
    /// Byte order of every header field.
    pub byte_order: ByteOrder,
    /// Timestamp resolution.
    pub resolution: Resolution,
    /// Format major version (2).
    pub version_major: u16,
    /// Format minor version (4).
    pub version_minor: u16,
    /// GMT offset (0 in practice).
    pub thiszone: i32,
    /// Timestamp accuracy (0 in practice).
    pub sigfigs: u32,
    /// Maximum bytes captured per packet.
    pub snaplen: u32,
    /// Link-layer type of every record.
    pub link_type: LinkType,
}

/// One captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Seconds since the epoch.
    pub ts_sec: u32,
    /// Sub-second part, in the file's [`Resolution`].
    pub ts_frac: u32,
    /// The file's timestamp resolution.
    pub resolution: Resolution,
    /// Length of the packet on the wire (≥ `data.len()` when snapped).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

impl Record<'_> {
    /// The timestamp as a duration since the epoch.
    pub fn timestamp(&self) -> Duration {
        let nanos = match self.resolution {
            Resolution::Micro => u64::from(self.ts_frac) * 1_000,
            Resolution::Nano => u64::from(self.ts_frac),
        };
        Duration::from_secs(u64::from(self.ts_sec)) + Duration::from_nanos(nanos)
    }

    /// Whether the capture kept fewer bytes than the packet had.
    pub fn is_truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

fn take<'a>(
    data: &'a [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], Error> {
    let have = data.len().saturating_sub(offset);
    data.get(offset..)
        .and_then(|rest| rest.get(..len))
        .ok_or(Error::Truncated {
            what,
            offset,
            need: len,
            have,
        })
}

fn u32_at(bytes: &[u8], at: usize, order: ByteOrder) -> u32 {
    let b = bytes
        .get(at..)
        .and_then(|s| s.first_chunk::<4>())
        .copied()
        .unwrap_or([0; 4]);
    match order {
        ByteOrder::Little => u32::from_le_bytes(b),
        ByteOrder::Big => u32::from_be_bytes(b),
    }
}

fn u16_at(bytes: &[u8], at: usize, order: ByteOrder) -> u16 {
    let b = bytes
        .get(at..)
        .and_then(|s| s.first_chunk::<2>())
        .copied()
        .unwrap_or([0; 2]);
    match order {
        ByteOrder::Little => u16::from_le_bytes(b),
        ByteOrder::Big => u16::from_be_bytes(b),
    }
}

/// Reads records out of a capture file held in memory.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    header: GlobalHeader,
    data: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Reader<'a> {
    /// Parse the global header of `file`.
    pub fn new(file: &'a [u8]) -> Result<Reader<'a>, Error> {
        let hdr = take(file, 0, GLOBAL_HEADER_LEN, "global header")?;
        let magic = u32_at(hdr, 0, ByteOrder::Little);
        let (byte_order, resolution) = match magic {
            MAGIC_MICRO => (ByteOrder::Little, Resolution::Micro),
            MAGIC_NANO => (ByteOrder::Little, Resolution::Nano),
            m if m.swap_bytes() == MAGIC_MICRO => (ByteOrder::Big, Resolution::Micro),
            m if m.swap_bytes() == MAGIC_NANO => (ByteOrder::Big, Resolution::Nano),
            other => return Err(Error::BadMagic(other)),
        };
        let o = byte_order;
        let header = GlobalHeader {
            byte_order,
            resolution,
            version_major: u16_at(hdr, 4, o),
            version_minor: u16_at(hdr, 6, o),
            thiszone: i32::from_ne_bytes(u32_at(hdr, 8, o).to_ne_bytes()),
            sigfigs: u32_at(hdr, 12, o),
            snaplen: u32_at(hdr, 16, o),
            link_type: LinkType(u32_at(hdr, 20, o)),
        };
        Ok(Reader {
            header,
            data: file,
            pos: GLOBAL_HEADER_LEN,
            done: false,
        })
    }

    /// The global header.
    pub fn header(&self) -> &GlobalHeader {
        &self.header
    }

    /// The next record, an error, or `None` at the end of the file.
    pub fn next_record(&mut self) -> Option<Result<Record<'a>, Error>> {
        if self.done || self.pos >= self.data.len() {
            return None;
        }
        let result = self.read_at(self.pos);
        match &result {
            Ok((_, next)) => self.pos = *next,
            Err(_) => self.done = true,
        }
        Some(result.map(|(rec, _)| rec))
    }

    fn read_at(&self, pos: usize) -> Result<(Record<'a>, usize), Error> {
        let o = self.header.byte_order;
        let rh = take(self.data, pos, RECORD_HEADER_LEN, "record header")?;
        let incl = u32_at(rh, 8, o);
        let start = pos + RECORD_HEADER_LEN;
        let incl = usize::try_from(incl).unwrap_or(usize::MAX);
        let data = take(self.data, start, incl, "record data")?;
        let rec = Record {
            ts_sec: u32_at(rh, 0, o),
            ts_frac: u32_at(rh, 4, o),
            resolution: self.header.resolution,
            orig_len: u32_at(rh, 12, o),
            data,
        };
        Ok((rec, start + incl))
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}

/// The network-layer packet inside a captured frame and its EtherType, for
/// the link types RoCE captures use (Ethernet with an optional 802.1Q tag,
/// Linux cooked SLL / SLL2, raw IP). `None` when the frame is too short or
/// the link type is another one.
pub fn network_layer(link_type: LinkType, frame: &[u8]) -> Option<(EtherType, &[u8])> {
    let be16 = |at: usize| {
        frame
            .get(at..)
            .and_then(|s| s.first_chunk::<2>())
            .map(|b| u16::from_be_bytes(*b))
    };
    match link_type {
        LinkType::ETHERNET => {
            let eth = crate::wire::EthernetPacket::new_checked(frame).ok()?;
            Some((eth.ethertype(), frame.get(eth.header_len()..)?))
        }
        LinkType::LINUX_SLL => Some((EtherType(be16(14)?), frame.get(16..)?)),
        LinkType::LINUX_SLL2 => Some((EtherType(be16(0)?), frame.get(20..)?)),
        LinkType::RAW => {
            let et = match frame.first()? >> 4 {
                4 => EtherType::IPV4,
                6 => EtherType::IPV6,
                _ => return None,
            };
            Some((et, frame))
        }
        _ => None,
    }
}

/// Writes a classic pcap file.
#[derive(Debug)]
pub struct Writer<W: Write> {
    inner: W,
    resolution: Resolution,
}

impl<W: Write> Writer<W> {
    /// Write the global header (little-endian, version 2.4, snaplen 262144).
    pub fn new(mut inner: W, link_type: LinkType, resolution: Resolution) -> io::Result<Writer<W>> {
        let magic = match resolution {
            Resolution::Micro => MAGIC_MICRO,
            Resolution::Nano => MAGIC_NANO,
        };
        let mut hdr = [0u8; GLOBAL_HEADER_LEN];
        let fields: [(usize, &[u8]); 5] = [
            (0, &magic.to_le_bytes()),
            (4, &2u16.to_le_bytes()),
            (6, &4u16.to_le_bytes()),
            (16, &DEFAULT_SNAPLEN.to_le_bytes()),
            (20, &link_type.0.to_le_bytes()),
        ];
        for (at, bytes) in fields {
            if let Some(dst) = hdr.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
        inner.write_all(&hdr)?;
        Ok(Writer { inner, resolution })
    }

    /// Append a record of the whole `data` captured at `timestamp` (since the epoch).
    pub fn write_record(&mut self, timestamp: Duration, data: &[u8]) -> io::Result<()> {
        let orig =
            u32::try_from(data.len()).map_err(|_| io::Error::other("record longer than 4 GiB"))?;
        self.write_record_snapped(timestamp, data, orig)
    }

    /// Append a record whose `data` may be a snapped prefix of an `orig_len`-byte packet.
    pub fn write_record_snapped(
        &mut self,
        timestamp: Duration,
        data: &[u8],
        orig_len: u32,
    ) -> io::Result<()> {
        let incl =
            u32::try_from(data.len()).map_err(|_| io::Error::other("record longer than 4 GiB"))?;
        let secs = u32::try_from(timestamp.as_secs())
            .map_err(|_| io::Error::other("timestamp past 2106"))?;
        let frac = match self.resolution {
            Resolution::Micro => timestamp.subsec_micros(),
            Resolution::Nano => timestamp.subsec_nanos(),
        };
        let mut rh = [0u8; RECORD_HEADER_LEN];
        for (i, v) in [secs, frac, incl, orig_len].into_iter().enumerate() {
            if let Some(dst) = rh.get_mut(i * 4..i * 4 + 4) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        self.inner.write_all(&rh)?;
        self.inner.write_all(data)
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// Unwrap the underlying writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_records(res: Resolution) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), LinkType::LINUX_SLL2, res).expect("vec");
        w.write_record(Duration::new(10, 123_456_789), &[1, 2, 3])
            .expect("vec");
        w.write_record_snapped(Duration::new(11, 0), &[4; 5], 100)
            .expect("vec");
        w.into_inner()
    }

    #[test]
    fn writer_reader_round_trip() {
        for (res, frac) in [
            (Resolution::Micro, 123_456),
            (Resolution::Nano, 123_456_789),
        ] {
            let file = two_records(res);
            assert_eq!(file.len(), 24 + 16 + 3 + 16 + 5);
            let r = Reader::new(&file).expect("header");
            let h = *r.header();
            assert_eq!(
                (h.byte_order, h.resolution, h.version_major, h.version_minor),
                (ByteOrder::Little, res, 2, 4)
            );
            assert_eq!(
                (h.snaplen, h.link_type, h.thiszone),
                (262_144, LinkType::LINUX_SLL2, 0)
            );
            let recs: Vec<Record<'_>> = r.map(|x| x.expect("record")).collect();
            assert_eq!(recs.len(), 2);
            assert_eq!(
                (recs[0].ts_sec, recs[0].ts_frac, recs[0].data),
                (10, frac, &[1u8, 2, 3][..])
            );
            assert!(!recs[0].is_truncated());
            assert_eq!((recs[1].orig_len, recs[1].data.len()), (100, 5));
            assert!(recs[1].is_truncated());
            assert_eq!(recs[1].timestamp(), Duration::from_secs(11));
        }
    }

    #[test]
    fn big_endian_files() {
        // Byte-swap every header field of a little-endian file.
        let le = two_records(Resolution::Nano);
        let mut be = le.clone();
        let swap32 = |b: &mut [u8], at: usize| b[at..at + 4].reverse();
        for at in [0, 8, 12, 16, 20] {
            swap32(&mut be, at);
        }
        be[4..6].reverse();
        be[6..8].reverse();
        for rec in [24, 24 + 16 + 3] {
            for k in 0..4 {
                swap32(&mut be, rec + 4 * k);
            }
        }
        assert_eq!(&be[..4], &[0xa1, 0xb2, 0x3c, 0x4d]);
        let r = Reader::new(&be).expect("header");
        assert_eq!(r.header().byte_order, ByteOrder::Big);
        assert_eq!(r.header().link_type, LinkType::LINUX_SLL2);
        let a: Vec<_> = Reader::new(&le)
            .expect("le")
            .map(|x| x.expect("rec"))
            .collect();
        let b: Vec<_> = r.map(|x| x.expect("rec")).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn truncated_files_are_typed_errors() {
        let file = two_records(Resolution::Micro);
        assert_eq!(
            Reader::new(&file[..10]).map(|_| ()),
            Err(Error::Truncated {
                what: "global header",
                offset: 0,
                need: 24,
                have: 10
            })
        );
        assert_eq!(Reader::new(&[0u8; 24]).map(|_| ()), Err(Error::BadMagic(0)));
        // Every cut inside the records yields exactly one error, then the end.
        for cut in 25..file.len() {
            let mut r = Reader::new(&file[..cut]).expect("header");
            let items: Vec<_> = r.by_ref().collect();
            let errs = items.iter().filter(|i| i.is_err()).count();
            let at_boundary = cut == 24 + 16 + 3;
            assert_eq!(errs, usize::from(!at_boundary), "cut {cut}");
            assert!(r.next().is_none());
        }
        let mut r = Reader::new(&file[..24 + 16 + 2]).expect("header");
        assert_eq!(
            r.next(),
            Some(Err(Error::Truncated {
                what: "record data",
                offset: 40,
                need: 3,
                have: 2
            }))
        );
        // A huge incl_len is an error, not an allocation or a panic.
        let mut huge = file.clone();
        huge[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Reader::new(&huge).expect("header").next(),
            Some(Err(Error::Truncated { .. }))
        ));
    }

    #[test]
    fn network_layers() {
        let ip = [0x45u8, 0, 0, 20];
        let mut eth = vec![0u8; 12];
        eth.extend([0x08, 0x00]);
        eth.extend(ip);
        assert_eq!(
            network_layer(LinkType::ETHERNET, &eth),
            Some((EtherType::IPV4, &ip[..]))
        );
        let mut sll = vec![0u8; 14];
        sll.extend([0x86, 0xdd]);
        sll.extend(ip);
        assert_eq!(
            network_layer(LinkType::LINUX_SLL, &sll),
            Some((EtherType::IPV6, &ip[..]))
        );
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend([0u8; 18]);
        sll2.extend(ip);
        assert_eq!(
            network_layer(LinkType::LINUX_SLL2, &sll2),
            Some((EtherType::IPV4, &ip[..]))
        );
        assert_eq!(
            network_layer(LinkType::RAW, &ip),
            Some((EtherType::IPV4, &ip[..]))
        );
        assert_eq!(network_layer(LinkType::LINUX_SLL2, &sll2[..10]), None);
        assert_eq!(network_layer(LinkType(147), &ip), None);
    }
}
