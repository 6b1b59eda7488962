//! Endpoint exchange: what two queue pairs must learn about each other
//! before they can talk, and the out-of-band TCP handshake that carries it.
//!
//! The handshake is byte-compatible with rdma-core's `ibv_rc_pingpong`, so an
//! rnic program can face the stock tool (and a kernel rxe or mlx5 peer):
//!
//! * each side's message is the text `"%04x:%06x:%06x:%s"` — LID, QPN, PSN
//!   and the GID as 32 lower-case hex digits — followed by a NUL, 52 bytes in
//!   all ([`PINGPONG_MSG_LEN`]);
//! * the client connects (default port 18515) and writes its message first;
//! * the server reads it, **connects its QP (RTR/RTS) before replying**, then
//!   writes its own message — so the client's first packet can never reach a
//!   QP still in RESET or INIT;
//! * the client reads the reply, then writes `"done\0"`, which the server waits
//!   for.
//!
//! ```
//! use rnic_core::exchange::QpEndpoint;
//! use rnic_core::{Gid, Psn, Qpn};
//!
//! let ep = QpEndpoint {
//!     lid: 0,
//!     qpn: Qpn::new(0x11).unwrap(),
//!     psn: Psn::new(0xabcdef).unwrap(),
//!     gid: "::ffff:10.0.0.1".parse::<Gid>().unwrap(),
//! };
//! let wire = ep.to_pingpong_wire();
//! assert_eq!(&wire[..51], b"0000:000011:abcdef:00000000000000000000ffff0a000001");
//! assert_eq!(QpEndpoint::from_pingpong_wire(&wire).unwrap(), ep);
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use thiserror::Error;

use crate::types::{Gid, Psn, Qpn};

/// Length of one ibv_rc_pingpong exchange message, terminating NUL included:
/// `sizeof "0000:000000:000000:" + 32 hex digits`.
pub const PINGPONG_MSG_LEN: usize = 52;

/// ibv_rc_pingpong's default TCP port.
pub const PINGPONG_DEFAULT_PORT: u16 = 18515;

/// The client's closing sync message, NUL included (`sizeof "done"`).
const DONE: &[u8; 5] = b"done\0";

/// What a peer needs to know to connect to one of our queue pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpEndpoint {
    /// Local identifier: 0 on RoCE (Ethernet has no LIDs).
    pub lid: u16,
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first PSN this side will send (the peer's `rq_psn`).
    pub psn: Psn,
    /// The GID to address this side with (an IPv4-mapped or IPv6 address).
    pub gid: Gid,
}

/// Errors of the out-of-band exchange.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The peer's message is not in ibv_rc_pingpong's format.
    #[error(
        "malformed endpoint message {text:?}: {reason} (expected \"LLLL:QQQQQQ:PPPPPP:<32 hex GID>\")"
    )]
    Malformed {
        /// The message as received, lossily decoded.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Connecting to the server failed.
    #[error(
        "cannot connect to {addr}: {source} (is the server running and listening on that port?)"
    )]
    Connect {
        /// The address tried last.
        addr: String,
        /// The socket error.
        source: io::Error,
    },
    /// Accepting the client's connection failed.
    #[error("accept on {addr} failed: {source}")]
    Accept {
        /// The listening address.
        addr: String,
        /// The socket error.
        source: io::Error,
    },
    /// Reading or writing the exchange failed (peer closed early, timeout, …).
    #[error("endpoint exchange with {peer} failed while {step}: {source}")]
    Io {
        /// The peer's address.
        peer: String,
        /// Which step failed ("sending our endpoint", "reading the peer's endpoint", …).
        step: &'static str,
        /// The socket error.
        source: io::Error,
    },
    /// The server's hook (which connects its QP before replying) failed.
    #[error("connecting the local QP to the client's endpoint {remote:?} failed: {reason}")]
    ConnectQp {
        /// The endpoint the client sent.
        remote: QpEndpoint,
        /// Why the hook refused.
        reason: String,
    },
}

fn malformed(raw: &[u8], reason: &'static str) -> ExchangeError {
    ExchangeError::Malformed {
        text: String::from_utf8_lossy(raw).into_owned(),
        reason,
    }
}

fn parse_hex_field(
    raw: &[u8],
    field: &[u8],
    digits: usize,
    what: &'static str,
) -> Result<u32, ExchangeError> {
    if field.is_empty() || field.len() > digits {
        return Err(malformed(raw, what));
    }
    let text = std::str::from_utf8(field).map_err(|_| malformed(raw, what))?;
    u32::from_str_radix(text, 16).map_err(|_| malformed(raw, what))
}

impl QpEndpoint {
    /// The 52-byte ibv_rc_pingpong message for this endpoint.
    pub fn to_pingpong_wire(&self) -> [u8; PINGPONG_MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.get(),
            self.psn.get(),
            self.gid.to_hex()
        );
        let mut out = [0u8; PINGPONG_MSG_LEN];
        // LID ≤ 4 digits, QPN and PSN ≤ 6 (24 bits), GID exactly 32: 51 bytes.
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parse an ibv_rc_pingpong message (NUL-terminated or not).
    ///
    /// Accepts what the stock tool's `sscanf("%x:%x:%x:%s")` accepts from a
    /// well-formed peer: hex fields of at most 4/6/6 digits and a 32-digit
    /// GID. Anything else is a typed error — the bytes come from the network.
    pub fn from_pingpong_wire(raw: &[u8]) -> Result<QpEndpoint, ExchangeError> {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let text = &raw[..end];
        let mut fields = text.split(|&b| b == b':');
        let (Some(lid), Some(qpn), Some(psn), Some(gid), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(malformed(raw, "expected four ':'-separated fields"));
        };
        let lid = parse_hex_field(raw, lid, 4, "LID is not 1-4 hex digits")?;
        let qpn = parse_hex_field(raw, qpn, 6, "QPN is not 1-6 hex digits")?;
        let psn = parse_hex_field(raw, psn, 6, "PSN is not 1-6 hex digits")?;
        let gid = std::str::from_utf8(gid)
            .ok()
            .and_then(|g| Gid::from_hex(g).ok())
            .ok_or_else(|| malformed(raw, "GID is not 32 hex digits"))?;
        Ok(QpEndpoint {
            lid: lid as u16,
            qpn: Qpn::from_wire(qpn),
            psn: Psn::from_wire(psn),
            gid,
        })
    }
}

fn io_err(stream: &TcpStream, step: &'static str, source: io::Error) -> ExchangeError {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "<unknown peer>".to_owned(), |a| a.to_string());
    ExchangeError::Io { peer, step, source }
}

/// Client side of the ibv_rc_pingpong exchange: connect to `server`, send
/// `local`, read the server's endpoint, send `"done"`.
///
/// The server has already connected its QP when this returns; the caller
/// now moves its own QP to RTR/RTS with the returned endpoint.
pub fn client_exchange<A: ToSocketAddrs>(
    server: A,
    local: &QpEndpoint,
    timeout: Option<Duration>,
) -> Result<QpEndpoint, ExchangeError> {
    let addrs: Vec<SocketAddr> = server
        .to_socket_addrs()
        .map_err(|source| ExchangeError::Connect {
            addr: "<unresolved>".to_owned(),
            source,
        })?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        let attempt = match timeout {
            Some(t) => TcpStream::connect_timeout(addr, t),
            None => TcpStream::connect(addr),
        };
        match attempt {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some((addr.to_string(), e)),
        }
    }
    let mut stream = match (stream, last) {
        (Some(s), _) => s,
        (None, Some((addr, source))) => return Err(ExchangeError::Connect { addr, source }),
        (None, None) => {
            return Err(ExchangeError::Connect {
                addr: "<no address>".to_owned(),
                source: io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address"),
            });
        }
    };
    set_timeouts(&stream, timeout)?;
    stream
        .write_all(&local.to_pingpong_wire())
        .map_err(|e| io_err(&stream, "sending our endpoint", e))?;
    let mut msg = [0u8; PINGPONG_MSG_LEN];
    stream
        .read_exact(&mut msg)
        .map_err(|e| io_err(&stream, "reading the server's endpoint", e))?;
    let remote = QpEndpoint::from_pingpong_wire(&msg)?;
    stream
        .write_all(DONE)
        .map_err(|e| io_err(&stream, "sending \"done\"", e))?;
    Ok(remote)
}

/// Server side of the ibv_rc_pingpong exchange on an already-bound
/// listener: accept one client, read its endpoint, call `connect_qp` with it
/// (move the local QP to RTR and RTS there), reply with `local`, and wait
/// for the client's `"done"`.
pub fn server_exchange<F, E>(
    listener: &TcpListener,
    local: &QpEndpoint,
    timeout: Option<Duration>,
    connect_qp: F,
) -> Result<QpEndpoint, ExchangeError>
where
    F: FnOnce(&QpEndpoint) -> Result<(), E>,
    E: std::fmt::Display,
{
    let (mut stream, _) = listener.accept().map_err(|source| ExchangeError::Accept {
        addr: listener
            .local_addr()
            .map_or_else(|_| "<unknown>".to_owned(), |a| a.to_string()),
        source,
    })?;
    set_timeouts(&stream, timeout)?;
    let mut msg = [0u8; PINGPONG_MSG_LEN];
    stream
        .read_exact(&mut msg)
        .map_err(|e| io_err(&stream, "reading the client's endpoint", e))?;
    let remote = QpEndpoint::from_pingpong_wire(&msg)?;
    connect_qp(&remote).map_err(|e| ExchangeError::ConnectQp {
        remote,
        reason: e.to_string(),
    })?;
    stream
        .write_all(&local.to_pingpong_wire())
        .map_err(|e| io_err(&stream, "sending our endpoint", e))?;
    // The client sends "done\0" (5 bytes) and closes; accept exactly that.
    let mut done = [0u8; DONE.len()];
    stream
        .read_exact(&mut done)
        .map_err(|e| io_err(&stream, "waiting for the client's \"done\"", e))?;
    if &done != DONE {
        return Err(malformed(&done, "expected the client's \"done\" sync"));
    }
    Ok(remote)
}

fn set_timeouts(stream: &TcpStream, timeout: Option<Duration>) -> Result<(), ExchangeError> {
    stream
        .set_read_timeout(timeout)
        .and_then(|()| stream.set_write_timeout(timeout))
        .map_err(|e| io_err(stream, "setting socket timeouts", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::thread;

    /// A message in the exact shape the stock tool sends: the literal an
    /// `ibv_rc_pingpong -g 1` on rxe with QPN 0x11, PSN 0x3f2a1c and GID
    /// ::ffff:10.0.0.1 writes (sprintf output + NUL, 52 bytes).
    const STOCK: &[u8; 52] = b"0000:000011:3f2a1c:00000000000000000000ffff0a000001\0";

    fn ep(qpn: u32, psn: u32, gid: &str) -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn: Qpn::from_wire(qpn),
            psn: Psn::from_wire(psn),
            gid: gid.parse().expect("gid"),
        }
    }

    #[test]
    fn stock_literal_round_trips() {
        let e = ep(0x11, 0x3f2a1c, "::ffff:10.0.0.1");
        assert_eq!(&e.to_pingpong_wire(), STOCK);
        assert_eq!(QpEndpoint::from_pingpong_wire(STOCK).expect("parse"), e);
        // Without the NUL too, and with upper-case hex as sscanf would take it.
        let upper = b"0000:000011:3F2A1C:00000000000000000000FFFF0A000001";
        assert_eq!(QpEndpoint::from_pingpong_wire(upper).expect("parse"), e);
    }

    #[test]
    fn malformed_messages_are_typed_errors() {
        for bad in [
            &b""[..],
            b"0000:000011:3f2a1c",
            b"0000:000011:3f2a1c:00000000000000000000ffff0a00000",
            b"0000:000011:3f2a1c:00000000000000000000ffff0a000001:extra",
            b"00000:000011:3f2a1c:00000000000000000000ffff0a000001",
            b"0000:1000011:3f2a1c:00000000000000000000ffff0a000001",
            b"0000:00zz11:3f2a1c:00000000000000000000ffff0a000001",
            b"0000::3f2a1c:00000000000000000000ffff0a000001",
            b"\xff\xfe:000011:3f2a1c:00000000000000000000ffff0a000001",
        ] {
            assert!(
                matches!(
                    QpEndpoint::from_pingpong_wire(bad),
                    Err(ExchangeError::Malformed { .. })
                ),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest! {
        #[test]
        fn any_endpoint_round_trips(lid: u16, qpn in 0u32..(1 << 24), psn in 0u32..(1 << 24), gid: [u8; 16]) {
            let e = QpEndpoint { lid, qpn: Qpn::from_wire(qpn), psn: Psn::from_wire(psn), gid: Gid(gid) };
            let wire = e.to_pingpong_wire();
            prop_assert_eq!(wire[51], 0);
            prop_assert_eq!(QpEndpoint::from_pingpong_wire(&wire).expect("parse"), e);
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = QpEndpoint::from_pingpong_wire(&raw);
        }
    }

    #[test]
    fn tcp_handshake_orders_connect_before_reply() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server_ep = ep(0x22, 0x000042, "::ffff:127.0.0.1");
        let client_ep = ep(0x11, 0xfffffe, "::ffff:127.0.0.1");
        let t = Some(Duration::from_secs(10));
        let server = thread::spawn(move || {
            let mut seen = None;
            let got = server_exchange(&listener, &server_ep, t, |remote| {
                seen = Some(*remote);
                Ok::<(), String>(())
            });
            (got.expect("server"), seen)
        });
        let got = client_exchange(("127.0.0.1", port), &client_ep, t).expect("client");
        let (server_got, hook_saw) = server.join().expect("join");
        assert_eq!(got, server_ep);
        assert_eq!(server_got, client_ep);
        assert_eq!(
            hook_saw,
            Some(client_ep),
            "the server connects its QP before it replies"
        );
    }

    #[test]
    fn server_speaks_to_a_byte_exact_stock_client() {
        // Play the stock client by hand: 52 bytes, read 52, "done\0".
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server_ep = ep(0x1234, 0x00beef, "fe80::5054:ff:fe12:3456");
        let server = thread::spawn(move || {
            server_exchange(&listener, &server_ep, Some(Duration::from_secs(10)), |_| {
                Ok::<(), String>(())
            })
        });
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.write_all(STOCK).expect("write");
        let mut reply = [0u8; 52];
        s.read_exact(&mut reply).expect("read");
        assert_eq!(
            &reply,
            b"0000:001234:00beef:fe80000000000000505400fffe123456\0"
        );
        s.write_all(b"done\0").expect("done");
        let got = server.join().expect("join").expect("server");
        assert_eq!(got, ep(0x11, 0x3f2a1c, "::ffff:10.0.0.1"));
    }

    #[test]
    fn hook_failure_is_reported_and_nothing_is_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = thread::spawn(move || {
            server_exchange(
                &listener,
                &QpEndpoint::default(),
                Some(Duration::from_secs(10)),
                |_| Err("QP is in ERR"),
            )
        });
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.write_all(STOCK).expect("write");
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        assert!(
            reply.is_empty(),
            "no endpoint is sent when the QP could not be connected"
        );
        assert!(matches!(
            server.join().expect("join"),
            Err(ExchangeError::ConnectQp { .. })
        ));
    }

    #[test]
    fn client_reports_refused_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = client_exchange(
            ("127.0.0.1", port),
            &QpEndpoint::default(),
            Some(Duration::from_secs(2)),
        );
        assert!(matches!(err, Err(ExchangeError::Connect { .. })));
    }
}
