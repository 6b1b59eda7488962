//! Both nodes in one process (threads), over loopback: what `kv_demo` and
//! the tests run.

use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use crate::KvError;
use crate::decode::{self, DecodeOptions, DecodeReport};
use crate::net::loopback_pair;
use crate::prefill::{self, PrefillOptions, PrefillReport};

/// What each node ended with.
#[derive(Debug)]
pub struct PairOutcome {
    /// The prefill node's result.
    pub prefill: Result<PrefillReport, KvError>,
    /// The decode node's result.
    pub decode: Result<DecodeReport, KvError>,
    /// When the prefill node finished.
    pub prefill_done: Instant,
    /// When the decode node finished.
    pub decode_done: Instant,
}

impl PairOutcome {
    /// Both reports, or the error that happened first: the other node's
    /// failure is usually its consequence (a closed connection, a truncated
    /// stream), and the first one names the cause (issue 26 item 5: a
    /// device the prefill node could not use surfaced as the decode node's
    /// "KV stream truncated").
    pub fn into_result(self) -> Result<(PrefillReport, DecodeReport), KvError> {
        match (self.prefill, self.decode) {
            (Ok(p), Ok(d)) => Ok((p, d)),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            (Err(p), Err(d)) => Err(if self.prefill_done < self.decode_done {
                p
            } else {
                d
            }),
        }
    }
}

/// Device specs for a same-host pair on `device`: plain `rxe` becomes two
/// distinct loopback addresses (decode, prefill); anything else is used
/// for both nodes as given.
pub fn device_pair(device: &str) -> (String, String) {
    if device == "rxe" {
        let (a, b) = loopback_pair();
        (format!("rxe:{a}"), format!("rxe:{b}"))
    } else {
        (device.to_owned(), device.to_owned())
    }
}

/// Run a decode node on a thread and a prefill node on this one, joined by
/// a loopback TCP control connection. `p.connect` is filled in.
pub fn run_pair(mut p: PrefillOptions, d: DecodeOptions) -> Result<PairOutcome, KvError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(KvError::io("binding the control port"))?;
    let addr = listener
        .local_addr()
        .map_err(KvError::io("reading the control port"))?;
    p.connect = addr.to_string();
    let decode = std::thread::Builder::new()
        .name("kv-decode".into())
        .spawn(move || {
            let r = decode::serve(&listener, &d);
            (r, Instant::now())
        })
        .map_err(KvError::io("starting the decode thread"))?;
    let prefill = prefill::run(&p);
    let prefill_done = Instant::now();
    if prefill.is_err() && !decode.is_finished() {
        // A prefill node that failed before it connected would leave the
        // decode node waiting out its accept timeout: a connection closed at
        // once ends that wait.
        let _ = TcpStream::connect(addr);
    }
    let (decode, decode_done) = decode.join().unwrap_or_else(|_| {
        (
            Err(KvError::Protocol {
                reason: "the decode thread panicked".into(),
            }),
            Instant::now(),
        )
    });
    Ok(PairOutcome {
        prefill,
        decode,
        prefill_done,
        decode_done,
    })
}
