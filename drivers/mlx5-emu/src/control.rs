//! The control socket (`rnic-mlx5-emu --control PATH`): the firmware's fault
//! hooks and the state report, for another process (a driver's tests,
//! `rnicctl emu fault`). A UNIX stream socket; one request per line, one
//! JSON line per reply (docs/mlx5-emu.md, "Control socket"):
//!
//! ```text
//! > fail-next ALLOC_PD EXCEED_LIM 0x1234
//! < {"ok":true,"request":"fail-next","opcode":"0x800","status":"0x08","syndrome":"0x1234"}
//! > pages +8
//! < {"ok":true,"request":"pages","pages":8,"event":true}
//! > frobnicate
//! < {"ok":false,"error":"unknown request \"frobnicate\": type `help` for the list"}
//! ```
//!
//! Malformed input gets `{"ok":false,...}` and the connection stays open; it
//! never stops the emulator. One client is served at a time, any number one
//! after another. The socket file is removed when the [`ControlListener`] is
//! shut down (or dropped).

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rnic_mlx5_prm::{CmdOpcode, CmdStatus, CqeSyndrome, HealthSyndrome, NicState};

use crate::device::Device;
use crate::firmware::cmdq::ReplyRewrite;
use crate::firmware::{Faults, MAX_DELAY};
use crate::hca::{CqeInjection, InjectSide};
use crate::report::{Reporter, json_str};
use crate::server::{Disconnect, Emulator};

/// The refusal of a request that needs a device when the firmware has none attached.
const NO_DEVICE: &str = "no device is attached to the firmware: nothing to act on";

/// The longest request line accepted (longer ones are refused, the rest of
/// the line skipped).
pub const MAX_LINE: usize = 1024;

/// The requests, one line each, as `help` lists them.
pub const HELP: &[&str] = &[
    "state",
    "fail-next <OPCODE_NAME|0xNNN> <STATUS_NAME|0xNN> <syndrome>",
    "swallow-next [<OPCODE_NAME|0xNNN>]",
    "delay-next [<OPCODE_NAME|0xNNN>] <ms>",
    "error-cqe <qpn|any> <SYNDROME_NAME|0xNN> [vendor_syndrome]",
    "error-cqe-recv <qpn|any> <SYNDROME_NAME|0xNN> [vendor_syndrome]",
    "health <SYNDROME|0xNN> [rfr]",
    "health-warn <SYNDROME|0xNN>",
    "health-stop",
    "nic-state <disabled|sw-reset>",
    "link <up|down>",
    "pages <+N|-N>",
    "take-zero <N>",
    "rewrite-reply <tokens|blocks|entry|all>...",
    "clear",
    "help",
];

/// One parsed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// The state report (the `--state-file` JSON, live).
    State,
    /// [`Faults::fail_next`].
    FailNext {
        /// The command to fail.
        opcode: CmdOpcode,
        /// Its status.
        status: CmdStatus,
        /// Its syndrome (0: the firmware's `INJECTED`).
        syndrome: u32,
    },
    /// [`Faults::swallow_next`]: that command never completes.
    SwallowNext(Option<CmdOpcode>),
    /// [`Faults::delay_next`]: that command completes `ms` milliseconds late.
    DelayNext {
        /// The command (any when `None`).
        opcode: Option<CmdOpcode>,
        /// The delay, 1..=600000 ms.
        ms: u64,
    },
    /// [`Faults::error_cqe`]: that QP's next send (`error-cqe`) or receive
    /// (`error-cqe-recv`) completion is an error CQE.
    ErrorCqe(CqeInjection),
    /// [`Faults::health`]: a health syndrome, fatal (`rfr`: `health`) or a warning
    /// (`health-warn`).
    Health {
        /// The syndrome.
        syndrome: HealthSyndrome,
        /// Reset firmware required: fatal.
        rfr: bool,
    },
    /// [`Device::stop_health_counter`]: the counter stops, no syndrome.
    HealthStop,
    /// [`Faults::nic_state`]: the NIC interface state goes disabled or SW reset.
    NicState(NicState),
    /// [`Faults::set_link`]: the port's link up (`true`) or down.
    Link(bool),
    /// [`Faults::request_pages`]: a PAGE_REQUEST of `n` (< 0: reclaim).
    Pages(i32),
    /// [`Faults::take_zero`]: the next `n` MANAGE_PAGES takes return nothing.
    TakeZero(u32),
    /// [`Faults::rewrite_next_reply`]: the next reply's headers rewritten.
    RewriteReply(ReplyRewrite),
    /// [`Faults::clear`]: drop pending fail/swallow/delay/error-CQE hooks.
    Clear,
    /// The list of requests.
    Help,
}

impl Request {
    /// The request's keyword.
    pub fn keyword(&self) -> &'static str {
        match self {
            Request::State => "state",
            Request::FailNext { .. } => "fail-next",
            Request::SwallowNext(_) => "swallow-next",
            Request::DelayNext { .. } => "delay-next",
            Request::ErrorCqe(CqeInjection {
                side: InjectSide::Send,
                ..
            }) => "error-cqe",
            Request::ErrorCqe(CqeInjection {
                side: InjectSide::Recv,
                ..
            }) => "error-cqe-recv",
            Request::Health { rfr: true, .. } => "health",
            Request::Health { rfr: false, .. } => "health-warn",
            Request::HealthStop => "health-stop",
            Request::NicState(_) => "nic-state",
            Request::Link(_) => "link",
            Request::Pages(_) => "pages",
            Request::TakeZero(_) => "take-zero",
            Request::RewriteReply(_) => "rewrite-reply",
            Request::Clear => "clear",
            Request::Help => "help",
        }
    }
}

fn hex(s: &str) -> Option<&str> {
    s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))
}

/// A number: decimal or `0x` hex.
fn number(s: &str) -> Option<u64> {
    match hex(s) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The first word of a table name (`"EXCEED_LIM (limits exceeded)"` →
/// `EXCEED_LIM`).
fn first_word(name: &str) -> &str {
    name.split(' ').next().unwrap_or(name)
}

fn opcode(s: &str) -> Result<CmdOpcode, String> {
    if let Some(n) = number(s) {
        return u16::try_from(n).map(CmdOpcode::from_raw).map_err(|_| {
            format!("opcode {s} does not fit 16 bits: type a name (ALLOC_PD) or 0xNNN")
        });
    }
    CmdOpcode::ALL
        .iter()
        .copied()
        .find(|o| o.name().is_some_and(|n| n.eq_ignore_ascii_case(s)))
        .ok_or_else(|| {
            format!("unknown opcode {s:?}: type a PRM name (ALLOC_PD, CREATE_CQ, ...) or 0xNNN")
        })
}

fn status(s: &str) -> Result<CmdStatus, String> {
    if let Some(n) = number(s) {
        return match u8::try_from(n) {
            Ok(0) => Err("status 0 is OK, not a failure: type a nonzero status".to_owned()),
            Ok(n) => Ok(CmdStatus::from_raw(n)),
            Err(_) => Err(format!(
                "status {s} does not fit 8 bits: type a name (EXCEED_LIM) or 0xNN"
            )),
        };
    }
    match CmdStatus::ALL.iter().copied().find(|c| {
        c.name()
            .is_some_and(|n| first_word(n).eq_ignore_ascii_case(s))
    }) {
        Some(CmdStatus::Ok) => Err("status OK is not a failure: type a nonzero status".to_owned()),
        Some(c) => Ok(c),
        None => Err(format!(
            "unknown status {s:?}: type a PRM name (BAD_PARAM, EXCEED_LIM, NO_RES, ...) or 0xNN"
        )),
    }
}

fn health(s: &str) -> Result<HealthSyndrome, String> {
    if let Some(n) = number(s) {
        return match u8::try_from(n) {
            Ok(0) => Err("health syndrome 0 is not fatal: type a nonzero syndrome".to_owned()),
            Ok(n) => Ok(HealthSyndrome::from_raw(n)),
            Err(_) => Err(format!(
                "health syndrome {s} does not fit 8 bits: type 0xNN"
            )),
        };
    }
    // Names have spaces ("firmware internal error"): accept them with `_` or `-`.
    let want = s.replace(['_', '-'], " ");
    HealthSyndrome::ALL
        .iter()
        .copied()
        .find(|h| h.name().is_some_and(|n| n.eq_ignore_ascii_case(&want)))
        .ok_or_else(|| format!("unknown health syndrome {s:?}: type 0xNN (0x01 firmware internal error, 0x08 hardware fatal error, ...)"))
}

/// The error CQE syndromes by the Linux kernel's names (`MLX5_CQE_SYNDROME_…`).
const CQE_SYNDROME_NAMES: &[(&str, CqeSyndrome)] = &[
    ("LOCAL_LENGTH_ERR", CqeSyndrome::LocalLength),
    ("LOCAL_QP_OP_ERR", CqeSyndrome::LocalQpOp),
    ("LOCAL_PROT_ERR", CqeSyndrome::LocalProt),
    ("WR_FLUSH_ERR", CqeSyndrome::WrFlushed),
    ("MW_BIND_ERR", CqeSyndrome::MwBind),
    ("BAD_RESP_ERR", CqeSyndrome::BadResp),
    ("LOCAL_ACCESS_ERR", CqeSyndrome::LocalAccess),
    ("REMOTE_INVAL_REQ_ERR", CqeSyndrome::RemoteInvalReq),
    ("REMOTE_ACCESS_ERR", CqeSyndrome::RemoteAccess),
    ("REMOTE_OP_ERR", CqeSyndrome::RemoteOp),
    (
        "TRANSPORT_RETRY_EXC_ERR",
        CqeSyndrome::TransportRetryExceeded,
    ),
    ("RNR_RETRY_EXC_ERR", CqeSyndrome::RnrRetryExceeded),
    ("REMOTE_ABORTED_ERR", CqeSyndrome::RemoteAborted),
];

/// A CQE syndrome: a kernel name (`REMOTE_ACCESS_ERR`, with or without
/// `MLX5_CQE_SYNDROME_`), the PRM description with `_` or `-` for spaces
/// (`remote_access_error`), or a nonzero `0xNN` (any byte: one the PRM does
/// not define tests the driver's fallback).
fn cqe_syndrome(s: &str) -> Result<u8, String> {
    if let Some(n) = number(s) {
        return match u8::try_from(n) {
            Ok(0) => Err("CQE syndrome 0 is not an error: type a nonzero syndrome".to_owned()),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("CQE syndrome {s} does not fit 8 bits: type 0xNN")),
        };
    }
    let upper = s.to_ascii_uppercase();
    let bare = upper.strip_prefix("MLX5_CQE_SYNDROME_").unwrap_or(&upper);
    if let Some((_, syn)) = CQE_SYNDROME_NAMES.iter().find(|(n, _)| *n == bare) {
        return Ok(syn.as_raw());
    }
    let want = s.replace(['_', '-'], " ");
    CQE_SYNDROME_NAMES
        .iter()
        .map(|(_, syn)| *syn)
        .find(|syn| syn.name().is_some_and(|n| n.eq_ignore_ascii_case(&want)))
        .map(CqeSyndrome::as_raw)
        .ok_or_else(|| {
            format!(
                "unknown CQE syndrome {s:?}: type a name (LOCAL_LENGTH_ERR, REMOTE_ACCESS_ERR, \
                 RNR_RETRY_EXC_ERR, ...) or 0xNN"
            )
        })
}

fn error_cqe(keyword: &str, side: InjectSide, args: &[&str]) -> Result<Request, String> {
    if !(2..=3).contains(&args.len()) {
        return Err(usage(keyword));
    }
    let qpn = if args[0].eq_ignore_ascii_case("any") {
        None
    } else {
        Some(
            number(args[0])
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n <= 0xff_ffff)
                .ok_or_else(|| {
                    format!(
                        "QPN {:?}: type a 24-bit QP number (decimal or 0x) or `any`",
                        args[0]
                    )
                })?,
        )
    };
    let syndrome = cqe_syndrome(args[1])?;
    let vendor = match args.get(2) {
        None => 0,
        Some(v) => number(v)
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| format!("vendor syndrome {v:?}: type a byte, 0..=255 or 0xNN"))?,
    };
    Ok(Request::ErrorCqe(CqeInjection {
        qpn,
        side,
        syndrome,
        vendor,
    }))
}

fn usage(keyword: &str) -> String {
    let line = HELP
        .iter()
        .find(|h| first_word(h) == keyword)
        .copied()
        .unwrap_or(keyword);
    format!("usage: {line}")
}

/// Parse one request line (surrounding whitespace ignored). The error says
/// what to type instead.
pub fn parse(line: &str) -> Result<Request, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&keyword, args)) = words.split_first() else {
        return Err("empty request: type `help` for the list".to_owned());
    };
    let arity = |n: std::ops::RangeInclusive<usize>| {
        if n.contains(&args.len()) {
            Ok(())
        } else {
            Err(usage(keyword))
        }
    };
    match keyword {
        "state" => arity(0..=0).map(|()| Request::State),
        "help" => arity(0..=0).map(|()| Request::Help),
        "clear" => arity(0..=0).map(|()| Request::Clear),
        "health-stop" => arity(0..=0).map(|()| Request::HealthStop),
        "fail-next" => {
            arity(3..=3)?;
            let syndrome = number(args[2])
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    format!(
                        "syndrome {:?} is not a 32-bit number: type 0xNNNN or decimal",
                        args[2]
                    )
                })?;
            Ok(Request::FailNext {
                opcode: opcode(args[0])?,
                status: status(args[1])?,
                syndrome,
            })
        }
        "swallow-next" => {
            arity(0..=1)?;
            args.first()
                .map(|a| opcode(a))
                .transpose()
                .map(Request::SwallowNext)
        }
        "delay-next" => {
            arity(1..=2)?;
            let (op, ms) = match args {
                [ms] => (None, ms),
                [op, ms] => (Some(opcode(op)?), ms),
                _ => return Err(usage(keyword)),
            };
            let max = MAX_DELAY.as_millis() as u64;
            let ms = number(ms)
                .filter(|&n| (1..=max).contains(&n))
                .ok_or_else(|| format!("delay {ms:?}: type milliseconds, 1..={max}"))?;
            Ok(Request::DelayNext { opcode: op, ms })
        }
        "error-cqe" => error_cqe(keyword, InjectSide::Send, args),
        "error-cqe-recv" => error_cqe(keyword, InjectSide::Recv, args),
        "health" => {
            arity(1..=2)?;
            if args.get(1).is_some_and(|a| !a.eq_ignore_ascii_case("rfr")) {
                return Err(format!(
                    "health {} {}: the optional word is `rfr` (fatal, the default); for a \
                     syndrome without rfr type `health-warn {}`",
                    args[0], args[1], args[0]
                ));
            }
            Ok(Request::Health {
                syndrome: health(args[0])?,
                rfr: true,
            })
        }
        "health-warn" => {
            arity(1..=1)?;
            Ok(Request::Health {
                syndrome: health(args[0])?,
                rfr: false,
            })
        }
        "nic-state" => {
            arity(1..=1)?;
            match args[0].to_ascii_lowercase().as_str() {
                "disabled" => Ok(Request::NicState(NicState::Disabled)),
                "sw-reset" | "sw_reset" => Ok(Request::NicState(NicState::SwReset)),
                other => Err(format!(
                    "nic-state {other:?}: type `disabled` (1) or `sw-reset` (7); a function \
                     reset returns it to full driver"
                )),
            }
        }
        "link" => {
            arity(1..=1)?;
            match args[0].to_ascii_lowercase().as_str() {
                "up" => Ok(Request::Link(true)),
                "down" => Ok(Request::Link(false)),
                other => Err(format!("link {other:?}: type `up` or `down`")),
            }
        }
        "take-zero" => {
            arity(1..=1)?;
            number(args[0])
                .and_then(|n| u32::try_from(n).ok())
                .map(Request::TakeZero)
                .ok_or_else(|| format!("take-zero {:?}: type a count, 0..=4294967295", args[0]))
        }
        "rewrite-reply" => {
            if args.is_empty() {
                return Err(usage(keyword));
            }
            let mut how = ReplyRewrite::default();
            for a in args {
                match a.to_ascii_lowercase().as_str() {
                    "tokens" => how.mailbox_tokens = true,
                    "blocks" => how.block_numbers = true,
                    "entry" => how.entry_token = true,
                    "all" => {
                        how = ReplyRewrite {
                            mailbox_tokens: true,
                            block_numbers: true,
                            entry_token: true,
                        };
                    }
                    other => {
                        return Err(format!(
                            "rewrite-reply {other:?}: type `tokens` (output-block tokens), \
                             `blocks` (block numbers), `entry` (the entry's token) or `all`"
                        ));
                    }
                }
            }
            Ok(Request::RewriteReply(how))
        }
        "pages" => {
            arity(1..=1)?;
            let a = args[0];
            let (neg, digits) = match (a.strip_prefix('+'), a.strip_prefix('-')) {
                (Some(d), _) => (false, d),
                (_, Some(d)) => (true, d),
                _ => return Err(format!("pages {a:?}: type +N (give) or -N (reclaim)")),
            };
            let n = number(digits)
                .and_then(|n| i32::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("pages {a:?}: N must be 1..=2147483647; type +N or -N"))?;
            Ok(Request::Pages(if neg { -n } else { n }))
        }
        other => Err(format!(
            "unknown request {:?}: type `help` for the list",
            truncate(other)
        )),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// A refusal, as one JSON line (no newline).
pub fn refusal(error: &str) -> String {
    format!("{{\"ok\":false,\"error\":{}}}", json_str(error))
}

/// Executes requests against one emulator.
#[derive(Clone, Debug)]
pub struct Controller {
    reporter: Reporter,
    faults: Option<Faults>,
    device: Arc<Device>,
    last: Arc<Mutex<Option<Disconnect>>>,
}

impl Controller {
    /// A controller for `emu`; `last` is what the last driver left (for
    /// `state`, as the state file reports it).
    pub fn new(emu: &Emulator, last: Arc<Mutex<Option<Disconnect>>>) -> Controller {
        Controller {
            reporter: Reporter::new(emu),
            faults: emu.firmware().map(|f| f.faults()),
            device: emu.device().clone(),
            last,
        }
    }

    fn faults(&self) -> Result<&Faults, String> {
        self.faults.as_ref().ok_or_else(|| {
            "this emulator has no firmware (no fault hooks): only `state` and `help` work"
                .to_owned()
        })
    }

    /// Parse and execute one line; the reply (one JSON line, no newline).
    pub fn handle(&self, line: &str) -> String {
        match parse(line).and_then(|r| self.execute(r)) {
            Ok(reply) => reply,
            Err(e) => refusal(&e),
        }
    }

    /// Execute one request; the reply, or the refusal's text.
    pub fn execute(&self, req: Request) -> Result<String, String> {
        let head = format!("{{\"ok\":true,\"request\":\"{}\"", req.keyword());
        match req {
            Request::State => {
                let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
                Ok(format!(
                    "{head},\"state\":{}}}",
                    self.reporter.report(true, last).to_json()
                ))
            }
            Request::Help => {
                let list: Vec<String> = HELP.iter().map(|h| json_str(h)).collect();
                Ok(format!("{head},\"requests\":[{}]}}", list.join(",")))
            }
            Request::Clear => {
                self.faults()?.clear();
                Ok(format!("{head}}}"))
            }
            Request::FailNext {
                opcode,
                status,
                syndrome,
            } => {
                self.faults()?.fail_next(opcode, status, syndrome);
                Ok(format!(
                    "{head},\"opcode\":\"{:#x}\",\"status\":\"{:#04x}\",\"syndrome\":\"{syndrome:#x}\"}}",
                    opcode.as_raw(),
                    status.as_raw()
                ))
            }
            Request::SwallowNext(op) => {
                self.faults()?.swallow_next(op);
                let op = op.map_or_else(|| "null".to_owned(), |o| format!("\"{:#x}\"", o.as_raw()));
                Ok(format!("{head},\"opcode\":{op}}}"))
            }
            Request::DelayNext { opcode, ms } => {
                if !self.faults()?.delay_next(opcode, Duration::from_millis(ms)) {
                    return Err(format!(
                        "delay of {ms} ms is longer than the firmware allows"
                    ));
                }
                let op =
                    opcode.map_or_else(|| "null".to_owned(), |o| format!("\"{:#x}\"", o.as_raw()));
                Ok(format!("{head},\"opcode\":{op},\"ms\":{ms}}}"))
            }
            Request::ErrorCqe(i) => {
                if !self.faults()?.error_cqe(i) {
                    return Err("CQE syndrome 0 is not an error".to_owned());
                }
                let qpn = i
                    .qpn
                    .map_or_else(|| "null".to_owned(), |q| format!("\"{q:#x}\""));
                Ok(format!(
                    "{head},\"qpn\":{qpn},\"syndrome\":\"{:#04x}\",\"vendor_syndrome\":\"{:#04x}\"}}",
                    i.syndrome, i.vendor
                ))
            }
            Request::Health { syndrome, rfr } => {
                if !self.faults()?.health(syndrome, rfr) {
                    return Err(NO_DEVICE.to_owned());
                }
                Ok(format!(
                    "{head},\"syndrome\":\"{:#04x}\",\"rfr\":{rfr}}}",
                    syndrome.as_raw()
                ))
            }
            Request::NicState(state) => {
                if !self.faults()?.nic_state(state) {
                    return Err(NO_DEVICE.to_owned());
                }
                Ok(format!("{head},\"nic_state\":{}}}", state.as_raw()))
            }
            Request::Link(up) => {
                let changed = self.device.link_up() != up;
                let event = self.faults()?.set_link(up);
                Ok(format!(
                    "{head},\"up\":{up},\"changed\":{changed},\"event\":{event}}}"
                ))
            }
            Request::TakeZero(n) => {
                self.faults()?.take_zero(n);
                Ok(format!("{head},\"count\":{n}}}"))
            }
            Request::RewriteReply(how) => {
                self.faults()?.rewrite_next_reply(how);
                Ok(format!(
                    "{head},\"tokens\":{},\"blocks\":{},\"entry\":{}}}",
                    how.mailbox_tokens, how.block_numbers, how.entry_token
                ))
            }
            Request::HealthStop => {
                self.device.stop_health_counter();
                Ok(format!("{head}}}"))
            }
            Request::Pages(n) => {
                let event = self.faults()?.request_pages(n);
                Ok(format!("{head},\"pages\":{n},\"event\":{event}}}"))
            }
        }
    }
}

/// The listener thread of a control socket.
#[derive(Debug)]
pub struct ControlListener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often an idle client's read wakes to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

impl ControlListener {
    /// Listen on `path` (a stale socket nobody listens on is replaced; a live
    /// one is an error) and serve `controller` from a thread.
    pub fn start(path: &Path, controller: Controller) -> io::Result<ControlListener> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: something listens there already", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = crate::server::listen_unix(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("mlx5-emu-control".into())
                .spawn(move || accept_loop(&listener, &controller, &stop))?
        };
        tracing::info!(path = %path.display(), "control socket listening");
        Ok(ControlListener {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop serving, join the thread and remove the socket.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::Release);
        // Wake the accept.
        let _ = UnixStream::connect(&self.path);
        let _ = t.join();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn accept_loop(listener: &UnixListener, controller: &Controller, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match conn {
            Ok(s) => {
                if let Err(e) = serve(s, controller, stop) {
                    tracing::debug!(%e, "control client");
                }
            }
            Err(e) => {
                tracing::warn!(%e, "control socket accept");
                std::thread::sleep(POLL);
            }
        }
    }
}

/// Serve one client until it closes (or the listener stops).
fn serve(mut s: UnixStream, controller: &Controller, stop: &AtomicBool) -> io::Result<()> {
    s.set_read_timeout(Some(POLL))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    let mut buf = [0u8; 512];
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let n = match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                if line.len() < MAX_LINE {
                    line.push(b);
                } else {
                    overlong = true;
                }
                continue;
            }
            let reply = if overlong {
                refusal(&format!(
                    "request longer than {MAX_LINE} bytes: type `help` for the list"
                ))
            } else {
                match std::str::from_utf8(&line) {
                    Ok(text) => controller.handle(text.trim_end_matches('\r')),
                    Err(_) => refusal("request is not UTF-8: type `help` for the list"),
                }
            };
            line.clear();
            overlong = false;
            s.write_all(reply.as_bytes())?;
            s.write_all(b"\n")?;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_request_parses() {
        assert_eq!(parse("state"), Ok(Request::State));
        assert_eq!(parse("  help \r"), Ok(Request::Help));
        assert_eq!(parse("clear"), Ok(Request::Clear));
        assert_eq!(parse("health-stop"), Ok(Request::HealthStop));
        assert_eq!(
            parse("fail-next ALLOC_PD EXCEED_LIM 0x1234"),
            Ok(Request::FailNext {
                opcode: CmdOpcode::AllocPd,
                status: CmdStatus::ExceedLim,
                syndrome: 0x1234
            })
        );
        assert_eq!(
            parse("fail-next 0x800 0x3 4660"),
            Ok(Request::FailNext {
                opcode: CmdOpcode::AllocPd,
                status: CmdStatus::BadParam,
                syndrome: 4660
            })
        );
        assert_eq!(
            parse("fail-next create_cq no_res 0"),
            Ok(Request::FailNext {
                opcode: CmdOpcode::CreateCq,
                status: CmdStatus::NoRes,
                syndrome: 0
            })
        );
        assert_eq!(parse("swallow-next"), Ok(Request::SwallowNext(None)));
        assert_eq!(
            parse("swallow-next ALLOC_PD"),
            Ok(Request::SwallowNext(Some(CmdOpcode::AllocPd)))
        );
        assert_eq!(
            parse("swallow-next 0x7ff"),
            Ok(Request::SwallowNext(Some(CmdOpcode::from_raw(0x7ff))))
        );
        let health = |syndrome, rfr| Ok(Request::Health { syndrome, rfr });
        assert_eq!(parse("health 0x08"), health(HealthSyndrome::HwFatal, true));
        assert_eq!(
            parse("health 0x08 RFR"),
            health(HealthSyndrome::HwFatal, true)
        );
        assert_eq!(
            parse("health firmware_internal_error"),
            health(HealthSyndrome::FwInternal, true)
        );
        assert_eq!(
            parse("health-warn high_temperature"),
            health(HealthSyndrome::HighTemp, false)
        );
        assert_eq!(parse("health-warn 0x10").unwrap().keyword(), "health-warn");
        assert_eq!(
            parse("nic-state disabled"),
            Ok(Request::NicState(NicState::Disabled))
        );
        assert_eq!(
            parse("nic-state SW-RESET"),
            Ok(Request::NicState(NicState::SwReset))
        );
        assert_eq!(parse("link down"), Ok(Request::Link(false)));
        assert_eq!(parse("link Up"), Ok(Request::Link(true)));
        assert_eq!(parse("take-zero 3"), Ok(Request::TakeZero(3)));
        assert_eq!(
            parse("rewrite-reply tokens blocks"),
            Ok(Request::RewriteReply(ReplyRewrite {
                mailbox_tokens: true,
                block_numbers: true,
                entry_token: false
            }))
        );
        assert_eq!(
            parse("rewrite-reply all"),
            Ok(Request::RewriteReply(ReplyRewrite {
                mailbox_tokens: true,
                block_numbers: true,
                entry_token: true
            }))
        );
        assert_eq!(
            parse("delay-next 250"),
            Ok(Request::DelayNext {
                opcode: None,
                ms: 250
            })
        );
        assert_eq!(
            parse("delay-next alloc_pd 0x10"),
            Ok(Request::DelayNext {
                opcode: Some(CmdOpcode::AllocPd),
                ms: 16
            })
        );
        let inj = |qpn, side, syndrome, vendor| {
            Ok(Request::ErrorCqe(CqeInjection {
                qpn,
                side,
                syndrome,
                vendor,
            }))
        };
        assert_eq!(
            parse("error-cqe 0x12 REMOTE_ACCESS_ERR 0x88"),
            inj(Some(0x12), InjectSide::Send, 0x13, 0x88)
        );
        assert_eq!(
            parse("error-cqe any MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR"),
            inj(None, InjectSide::Send, 0x01, 0)
        );
        assert_eq!(
            parse("error-cqe 7 rnr_retry_counter_exceeded 3"),
            inj(Some(7), InjectSide::Send, 0x16, 3)
        );
        assert_eq!(
            parse("error-cqe-recv ANY 0x7f"),
            inj(None, InjectSide::Recv, 0x7f, 0)
        );
        assert_eq!(
            parse("error-cqe-recv 1 0x7f").unwrap().keyword(),
            "error-cqe-recv"
        );
        assert_eq!(parse("pages +8"), Ok(Request::Pages(8)));
        assert_eq!(parse("pages -0x10"), Ok(Request::Pages(-16)));
    }

    fn refused(line: &str, needle: &str) {
        let e = parse(line).unwrap_err();
        assert!(e.contains(needle), "{line:?} → {e:?}, wanted {needle:?}");
    }

    #[test]
    fn every_refusal_says_what_to_type() {
        refused("", "type `help`");
        refused("   ", "type `help`");
        refused("frobnicate", "unknown request \"frobnicate\"");
        refused(&"x".repeat(500), "type `help`");
        refused("state now", "usage: state");
        refused("help me", "usage: help");
        refused("clear all", "usage: clear");
        refused("health-stop 1", "usage: health-stop");
        refused("fail-next ALLOC_PD", "usage: fail-next <OPCODE_NAME");
        refused("fail-next ALLOC_PD EXCEED_LIM 1 2", "usage: fail-next");
        refused("fail-next NOPE EXCEED_LIM 1", "unknown opcode \"NOPE\"");
        refused("fail-next 0x10000 EXCEED_LIM 1", "does not fit 16 bits");
        refused("fail-next ALLOC_PD NOPE 1", "unknown status \"NOPE\"");
        refused("fail-next ALLOC_PD OK 1", "not a failure");
        refused("fail-next ALLOC_PD 0 1", "not a failure");
        refused("fail-next ALLOC_PD 0x100 1", "does not fit 8 bits");
        refused("fail-next ALLOC_PD EXCEED_LIM zz", "not a 32-bit number");
        refused(
            "fail-next ALLOC_PD EXCEED_LIM 0x100000000",
            "not a 32-bit number",
        );
        refused("swallow-next A B", "usage: swallow-next");
        refused("swallow-next NOPE", "unknown opcode");
        refused("delay-next", "usage: delay-next [<OPCODE_NAME");
        refused("delay-next ALLOC_PD 1 2", "usage: delay-next");
        refused("delay-next 0", "type milliseconds, 1..=600000");
        refused("delay-next 600001", "1..=600000");
        refused("delay-next ALLOC_PD soon", "type milliseconds");
        refused("delay-next NOPE 5", "unknown opcode \"NOPE\"");
        refused("error-cqe", "usage: error-cqe <qpn|any>");
        refused("error-cqe 1", "usage: error-cqe <qpn|any>");
        refused("error-cqe 1 0x13 0 0", "usage: error-cqe");
        refused("error-cqe-recv 1", "usage: error-cqe-recv <qpn|any>");
        refused("error-cqe 0x1000000 0x13", "24-bit QP number");
        refused("error-cqe some 0x13", "24-bit QP number");
        refused("error-cqe 1 0", "not an error");
        refused("error-cqe 1 0x100", "does not fit 8 bits");
        refused("error-cqe 1 SUNBURN", "unknown CQE syndrome \"SUNBURN\"");
        refused("error-cqe 1 0x13 0x100", "vendor syndrome");
        refused("health", "usage: health <SYNDROME");
        refused("health 0x08 now", "type `health-warn 0x08`");
        refused("health 0x08 rfr x", "usage: health <SYNDROME");
        refused("health-warn", "usage: health-warn <SYNDROME");
        refused("health-warn 0", "not fatal");
        refused("nic-state", "usage: nic-state <disabled|sw-reset>");
        refused("nic-state full", "type `disabled` (1) or `sw-reset` (7)");
        refused("link", "usage: link <up|down>");
        refused("link sideways", "type `up` or `down`");
        refused("take-zero", "usage: take-zero <N>");
        refused("take-zero -1", "type a count");
        refused("rewrite-reply", "usage: rewrite-reply <tokens");
        refused("rewrite-reply tokens nope", "rewrite-reply \"nope\"");
        refused("health 0", "not fatal");
        refused("health 0x100", "does not fit 8 bits");
        refused("health sunburn", "unknown health syndrome");
        refused("pages", "usage: pages");
        refused("pages 8", "type +N (give) or -N");
        refused("pages +0", "N must be 1..=2147483647");
        refused("pages +x", "N must be");
        refused("pages -2147483648", "N must be");
        refused("pages +1 +2", "usage: pages");
    }

    #[test]
    fn refusals_are_json_with_escapes() {
        assert_eq!(
            refusal("a \"b\" \\ \n"),
            "{\"ok\":false,\"error\":\"a \\\"b\\\" \\\\ \\u000a\"}"
        );
    }

    #[test]
    fn help_lists_every_keyword() {
        for k in [
            "state",
            "fail-next",
            "swallow-next",
            "delay-next",
            "error-cqe",
            "error-cqe-recv",
            "health",
            "health-warn",
            "health-stop",
            "nic-state",
            "link",
            "pages",
            "take-zero",
            "rewrite-reply",
            "clear",
            "help",
        ] {
            assert!(HELP.iter().any(|h| first_word(h) == k), "{k}");
        }
    }
}
