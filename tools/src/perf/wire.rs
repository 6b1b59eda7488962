//! perftest's out-of-band TCP exchange, byte for byte as perftest 4.5-0.17
//! (Debian bookworm's `perftest 4.5+0.17`, reporting version "6.06") speaks it
//! without `-R` (rdma_cm) — facts read from `src/perftest_communication.c`
//! and `src/perftest_parameters.h` of that tag:
//!
//! * Every exchange is symmetric: the client (the side given a server name)
//!   writes its message then reads the peer's; the server reads then writes.
//!   perftest reads each message with one `read()` of exactly its size, so
//!   each message here leaves in one `write()`.
//! * Negotiation (`exchange_versions`, `check_sys_data`, `check_mtu`):
//!   the version string in a 16-byte NUL-padded field (perftest refuses a
//!   peer below "5.70"); the cycle buffer (page size) and the cache-line size
//!   as big-endian `int`s (4 bytes each; each side keeps the larger); the
//!   port's active MTU as the `ibv_mtu` enum printed with `"%d"` in 2 bytes
//!   (`"3\0"` = 1024; each side keeps the smaller).
//! * The QP endpoint (`struct pingpong_dest`) as text. On RoCE a GID index
//!   is always set, so it is the 108-byte form
//!   `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"` + NUL
//!   (LID, outstanding reads, QPN, PSN, R_Key, VA, GID bytes, SRQN); without a
//!   GID the 59-byte form `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` + NUL.
//! * Bandwidth reports (`xchg_bw_reports`, peer version >= 5.33): size and
//!   iterations as big-endian u64, then peak BW, average BW and message rate
//!   as big-endian IEEE doubles, each in its own exchange.
//! * Closing (`ctx_close_connection`): one more endpoint exchange, then each
//!   side writes `"done\0"` (5 bytes) and closes without reading the peer's.

use std::io::{self, Read, Write};

use rnic::core::Gid;

/// The version rnicctl announces: the one perftest 4.5-0.17 announces.
pub const VERSION: &str = "6.06";
/// Size of the version field.
pub const VERSION_LEN: usize = 16;
/// The 59-byte endpoint message (no GID).
pub const DEST_LEN: usize = 59;
/// The 108-byte endpoint message (with GID).
pub const DEST_GID_LEN: usize = 108;
/// The closing token, with its NUL.
pub const DONE: &[u8; 5] = b"done\0";
/// Oldest peer version perftest accepts.
pub const MIN_PEER_VERSION: f64 = 5.70;

/// Which end of the TCP connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connected to a server: writes first.
    Client,
    /// Accepted a connection: reads first.
    Server,
}

/// One exchange: write ours and read theirs in perftest's order.
pub fn xchg<S: Read + Write>(
    s: &mut S,
    role: Role,
    mine: &[u8],
    theirs: &mut [u8],
) -> io::Result<()> {
    match role {
        Role::Client => {
            s.write_all(mine)?;
            s.flush()?;
            s.read_exact(theirs)
        }
        Role::Server => {
            s.read_exact(theirs)?;
            s.write_all(mine)?;
            s.flush()
        }
    }
}

/// The 16-byte version field.
pub fn version_field(v: &str) -> [u8; VERSION_LEN] {
    let mut f = [0u8; VERSION_LEN];
    let n = v.len().min(VERSION_LEN - 1);
    f[..n].copy_from_slice(&v.as_bytes()[..n]);
    f
}

/// The text of a version field (up to its NUL).
pub fn version_text(f: &[u8]) -> String {
    let end = f.iter().position(|b| *b == 0).unwrap_or(f.len());
    String::from_utf8_lossy(&f[..end]).into_owned()
}

/// `atof` of a version ("6.06" → 6.06); 0 when unparsable, as atof.
pub fn version_number(v: &str) -> f64 {
    let t: String = v
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    t.parse().unwrap_or(0.0)
}

/// The MTU field: the `ibv_mtu` enum value as `"%d"` in 2 bytes.
pub fn mtu_field(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// `strtol` of the MTU field.
pub fn parse_mtu_field(f: &[u8; 2]) -> Option<u8> {
    let d = f[0];
    d.is_ascii_digit().then(|| d - b'0')
}

/// `struct pingpong_dest` as far as the wire carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA reads the side allows.
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// R_Key of the side's buffer.
    pub rkey: u32,
    /// Address of the side's buffer for this QP.
    pub vaddr: u64,
    /// The GID (absent in the 59-byte form).
    pub gid: Option<Gid>,
    /// SRQ number (0 without XRC/DC).
    pub srqn: u32,
}

/// Why a peer's message could not be parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Reading or writing the socket failed.
    #[error(
        "perftest exchange: {what}: {source} (is the peer a perftest 4.5-0.17 compatible tool with the same test and options?)"
    )]
    Io {
        /// The step.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The peer's endpoint message did not parse.
    #[error("perftest exchange: couldn't parse the peer's address line <{text}>: {why}")]
    BadDest {
        /// What arrived.
        text: String,
        /// What was wrong.
        why: &'static str,
    },
    /// The peer is older than perftest accepts.
    #[error(
        "perftest exchange: the peer announces version {0:?}; perftest's exchange needs >= 5.70 — upgrade the peer's perftest"
    )]
    OldPeer(String),
}

impl Dest {
    /// The message perftest writes for this endpoint.
    pub fn to_wire(self) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        match &self.gid {
            Some(g) => {
                for b in g.raw() {
                    s.push_str(&format!("{b:02x}:"));
                }
                s.push_str(&format!("{:08x}:", self.srqn));
                let mut v = s.into_bytes();
                v.resize(DEST_GID_LEN, 0);
                v
            }
            None => {
                s.push_str(&format!("{:08x}", self.srqn));
                let mut v = s.into_bytes();
                v.resize(DEST_LEN, 0);
                v
            }
        }
    }

    /// Parse a peer's message (either form, told apart by its length).
    pub fn from_wire(raw: &[u8]) -> Result<Dest, WireError> {
        let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
        let text = String::from_utf8_lossy(&raw[..end]).into_owned();
        let bad = |why| WireError::BadDest {
            text: text.clone(),
            why,
        };
        let fields: Vec<&str> = text.split(':').collect();
        let hex = |i: usize| -> Result<u64, WireError> {
            let f = fields.get(i).ok_or_else(|| bad("too few fields"))?;
            u64::from_str_radix(f, 16).map_err(|_| bad("a field is not hexadecimal"))
        };
        let with_gid = raw.len() == DEST_GID_LEN;
        let lid = hex(0)? as u16;
        let out_reads = hex(1)? as u16;
        let qpn = (hex(2)? & 0xff_ffff) as u32;
        let psn = (hex(3)? & 0xff_ffff) as u32;
        let rkey = hex(4)? as u32;
        let vaddr = hex(5)?;
        let (gid, srqn) = if with_gid {
            let mut g = [0u8; 16];
            for (i, b) in g.iter_mut().enumerate() {
                *b = hex(6 + i)? as u8;
            }
            (
                Some(Gid::from_ipv6(std::net::Ipv6Addr::from(g))),
                hex(22)? as u32,
            )
        } else {
            (None, hex(6)? as u32)
        };
        Ok(Dest {
            lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            gid,
            srqn,
        })
    }
}

/// A bandwidth report as `xchg_bw_reports` carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth (MB/s, or Gb/s with `--report_gbits`).
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Message rate in Mpps.
    pub msg_rate: f64,
}

/// Negotiated facts.
#[derive(Clone, Debug, PartialEq)]
pub struct Negotiated {
    /// The peer's version text.
    pub peer_version: String,
    /// max(ours, theirs).
    pub cycle_buffer: u32,
    /// max(ours, theirs).
    pub cache_line: u32,
    /// min(ours, theirs) as the `ibv_mtu` enum.
    pub mtu_enum: u8,
}

/// A perftest session over one TCP stream.
#[derive(Debug)]
pub struct Session<S> {
    /// The stream.
    pub stream: S,
    /// Our role.
    pub role: Role,
    /// Whether endpoint messages carry a GID (always on RoCE).
    pub with_gid: bool,
}

fn io(what: &'static str) -> impl FnOnce(io::Error) -> WireError {
    move |source| WireError::Io { what, source }
}

impl<S: Read + Write> Session<S> {
    /// A session; `with_gid` selects the 108-byte endpoint form.
    pub fn new(stream: S, role: Role, with_gid: bool) -> Session<S> {
        Session {
            stream,
            role,
            with_gid,
        }
    }

    /// Versions, system data and MTU, as every perftest test starts.
    pub fn negotiate(
        &mut self,
        cycle_buffer: u32,
        cache_line: u32,
        mtu_enum: u8,
    ) -> Result<Negotiated, WireError> {
        let mut theirs = [0u8; VERSION_LEN];
        xchg(
            &mut self.stream,
            self.role,
            &version_field(VERSION),
            &mut theirs,
        )
        .map_err(io("exchanging versions"))?;
        let peer_version = version_text(&theirs);
        if version_number(&peer_version) < MIN_PEER_VERSION {
            return Err(WireError::OldPeer(peer_version));
        }
        let mut rc = [0u8; 4];
        xchg(
            &mut self.stream,
            self.role,
            &cycle_buffer.to_be_bytes(),
            &mut rc,
        )
        .map_err(io("exchanging the cycle buffer size"))?;
        let mut rl = [0u8; 4];
        xchg(
            &mut self.stream,
            self.role,
            &cache_line.to_be_bytes(),
            &mut rl,
        )
        .map_err(io("exchanging the cache line size"))?;
        let mut rm = [0u8; 2];
        xchg(&mut self.stream, self.role, &mtu_field(mtu_enum), &mut rm)
            .map_err(io("exchanging the MTU"))?;
        let rem_mtu = parse_mtu_field(&rm).filter(|m| (1..=5).contains(m));
        Ok(Negotiated {
            peer_version,
            cycle_buffer: cycle_buffer.max(u32::from_be_bytes(rc)),
            cache_line: cache_line.max(u32::from_be_bytes(rl)),
            mtu_enum: rem_mtu.map_or(mtu_enum, |r| r.min(mtu_enum)),
        })
    }

    /// One `ctx_hand_shake`: our endpoint for theirs.
    pub fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, WireError> {
        let mut d = *mine;
        if !self.with_gid {
            d.gid = None;
        }
        let out = d.to_wire();
        let mut buf = vec![0u8; out.len()];
        xchg(&mut self.stream, self.role, &out, &mut buf).map_err(io("exchanging QP endpoints"))?;
        Dest::from_wire(&buf)
    }

    /// One handshake per QP.
    pub fn hand_shake_all(&mut self, mine: &[Dest]) -> Result<Vec<Dest>, WireError> {
        mine.iter().map(|d| self.hand_shake(d)).collect()
    }

    /// `xchg_bw_reports` (peer version >= 5.33; no per-port reports).
    pub fn bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, WireError> {
        let mut r = BwReport::default();
        let mut b8 = [0u8; 8];
        let what = "exchanging bandwidth reports";
        xchg(
            &mut self.stream,
            self.role,
            &mine.size.to_be_bytes(),
            &mut b8,
        )
        .map_err(io(what))?;
        r.size = u64::from_be_bytes(b8);
        xchg(
            &mut self.stream,
            self.role,
            &mine.iters.to_be_bytes(),
            &mut b8,
        )
        .map_err(io(what))?;
        r.iters = u64::from_be_bytes(b8);
        xchg(
            &mut self.stream,
            self.role,
            &mine.bw_peak.to_bits().to_be_bytes(),
            &mut b8,
        )
        .map_err(io(what))?;
        r.bw_peak = f64::from_bits(u64::from_be_bytes(b8));
        xchg(
            &mut self.stream,
            self.role,
            &mine.bw_avg.to_bits().to_be_bytes(),
            &mut b8,
        )
        .map_err(io(what))?;
        r.bw_avg = f64::from_bits(u64::from_be_bytes(b8));
        xchg(
            &mut self.stream,
            self.role,
            &mine.msg_rate.to_bits().to_be_bytes(),
            &mut b8,
        )
        .map_err(io(what))?;
        r.msg_rate = f64::from_bits(u64::from_be_bytes(b8));
        Ok(r)
    }

    /// `ctx_close_connection`: a last handshake, then `"done\0"`.
    pub fn close(&mut self, mine: &Dest) -> Result<(), WireError> {
        self.hand_shake(mine)?;
        self.stream
            .write_all(DONE)
            .and_then(|()| self.stream.flush())
            .map_err(io("writing done"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dest() -> Dest {
        Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x5599_0000_1000,
            gid: Some(Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 2, 15))),
            srqn: 0,
        }
    }

    #[test]
    fn gid_form_is_108_bytes_exactly_as_perftest_prints() {
        let w = dest().to_wire();
        assert_eq!(w.len(), DEST_GID_LEN);
        let text = "0000:0010:000011:abcdef:00001234:0000559900001000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f:00000000:";
        assert_eq!(text.len(), 107);
        assert_eq!(&w[..107], text.as_bytes());
        assert_eq!(w[107], 0);
        assert_eq!(Dest::from_wire(&w).unwrap(), dest());
    }

    #[test]
    fn plain_form_is_59_bytes() {
        let d = Dest {
            gid: None,
            ..dest()
        };
        let w = d.to_wire();
        assert_eq!(w.len(), DEST_LEN);
        assert_eq!(
            &w[..58],
            b"0000:0010:000011:abcdef:00001234:0000559900001000:00000000"
        );
        assert_eq!(Dest::from_wire(&w).unwrap(), d);
    }

    #[test]
    fn garbage_is_an_error_with_the_text() {
        let e = Dest::from_wire(&[b'z'; DEST_GID_LEN]).unwrap_err();
        assert!(e.to_string().contains("zzzz"), "{e}");
    }

    #[test]
    fn version_fields() {
        let f = version_field(VERSION);
        assert_eq!(&f[..5], b"6.06\0");
        assert_eq!(version_text(&f), "6.06");
        assert!((version_number("6.06") - 6.06).abs() < 1e-9);
        assert_eq!(version_number("x"), 0.0);
        assert_eq!(mtu_field(3), *b"3\0");
        assert_eq!(parse_mtu_field(b"5\0"), Some(5));
    }
}
