//! Both nodes in one process (threads), over loopback: what `kv_demo` and
//! the tests run.

use std::net::TcpListener;

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
}

impl PairOutcome {
    /// Both reports, or the first error (the decode node's first: it names
    /// the stream's state).
    pub fn into_result(self) -> Result<(PrefillReport, DecodeReport), KvError> {
        let d = self.decode?;
        let p = self.prefill?;
        Ok((p, d))
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
        .spawn(move || decode::serve(&listener, &d))
        .map_err(KvError::io("starting the decode thread"))?;
    let prefill = prefill::run(&p);
    let decode = decode.join().unwrap_or_else(|_| {
        Err(KvError::Protocol {
            reason: "the decode thread panicked".into(),
        })
    });
    Ok(PairOutcome { prefill, decode })
}
