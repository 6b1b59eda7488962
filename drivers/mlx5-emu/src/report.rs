//! The emulator's state as JSON, for another process to read: what the
//! binary's `--state-file` holds (docs/mlx5-emu.md, "State file").
//!
//! ```json
//! {"version":1,"pid":4242,"socket":"/run/rnic/emu/emu0.sock","running":true,
//!  "connections":1,
//!  "accounting":{"phase":"disabled","pages_held":0,"uars":0,"pds":0,"tds":0,"eqs":0,
//!                "cqs":0,"qps":0,"mkeys":0,"gids":0,"dma_mappings":0,"clean":true},
//!  "last_driver":{"connection":1,"left":{"phase":"initialized","pages_held":48,…,"clean":false}},
//!  "device":{"resets":2,"command_doorbells":57,"uar_doorbells":12,"contained_panics":0},
//!  "hca":{"dma_faults":0,"wqe_errors":0,"tx_packets":10,"rx_packets":10,"cqes":10,
//!         "injected_error_cqes":0},
//!  "faults":{"injected":0,"swallowed":0,"delayed":1,"late_pending":0,"late_dropped":0,
//!            "ignored_busy":0,…},
//!  "strictness":{"page-requests":false,"blueflame":false,…},
//!  "wire":"packet:veth0","port":{"rx_frames":12,"rx_other_mac":3,"rx_no_rule":2,…}}
//! ```
//!
//! `accounting` is what the function holds when the file was written (after
//! a driver left, the reset has reclaimed everything: it reads clean);
//! `last_driver.left` is what the last driver left behind before that reset
//! (a driver that tore down leaves `clean: true`; one that was killed does
//! not). The file is replaced atomically (written beside it, then renamed),
//! so a reader never sees half of it.

use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::Device;
use crate::firmware::{Accounting, FirmwareHandle, Phase};
use crate::server::{Disconnect, Emulator};

/// Takes [`StateReport`]s of one emulator from any thread (the hook of
/// [`Emulator::on_disconnect`] included): the parts of it a report reads.
#[derive(Clone, Debug)]
pub struct Reporter {
    dev: Arc<Device>,
    firmware: Option<FirmwareHandle>,
    socket: String,
}

impl Reporter {
    /// A reporter for `emu`.
    pub fn new(emu: &Emulator) -> Reporter {
        Reporter {
            dev: emu.device().clone(),
            firmware: emu.firmware().cloned(),
            socket: emu.socket().display().to_string(),
        }
    }

    /// A snapshot now; `running` and `last_driver` are the caller's to say.
    pub fn report(&self, running: bool, last_driver: Option<Disconnect>) -> StateReport {
        let s = self.dev.stats();
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StateReport {
            pid: std::process::id(),
            socket: self.socket.clone(),
            running,
            connections: n(&s.connections),
            accounting: self.firmware.as_ref().map(FirmwareHandle::accounting),
            last_driver,
            device: [
                ("resets", n(&s.resets)),
                ("command_doorbells", n(&s.command_doorbells)),
                ("uar_doorbells", n(&s.uar_doorbells)),
                ("contained_panics", n(&s.contained_panics)),
            ],
            hca: self.firmware.as_ref().map(|fw| {
                let h = fw.hca_stats();
                vec![
                    ("dma_faults", h.dma_faults),
                    ("wqe_errors", h.wqe_errors),
                    ("tx_packets", h.tx_packets),
                    ("rx_packets", h.rx_packets),
                    ("cqes", h.cqes),
                    ("injected_error_cqes", h.injected_error_cqes),
                    ("eq_overruns", h.eq_overruns),
                    ("cq_overruns", h.cq_overruns),
                    ("link_down_drops", h.link_down_drops),
                    ("halted_drops", h.halted_drops),
                    ("bf_uncombined", fw.stats().bf_uncombined),
                    ("bf_interleaved", fw.stats().bf_interleaved),
                ]
            }),
            faults: self.firmware.as_ref().map(|fw| {
                let f = fw.stats();
                vec![
                    ("injected", f.injected),
                    ("swallowed", f.swallowed),
                    ("delayed", f.delayed),
                    ("late_pending", fw.late_pending() as u64),
                    ("late_dropped", f.late_dropped),
                    ("ignored_busy", f.ignored_busy),
                    ("ignored_dead", f.ignored_dead),
                    ("ignored_nic_state", f.ignored_nic_state),
                ]
            }),
            strictness: self
                .firmware
                .as_ref()
                .map(|_| self.dev.options().firmware.strictness.iter().collect()),
            wire: self.dev.options().wire.to_string(),
            port: self.dev.port_counters().snapshot().iter().collect(),
        }
    }
}

/// One snapshot of an emulator's state (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateReport {
    /// The emulator's process.
    pub pid: u32,
    /// The socket it listens on.
    pub socket: String,
    /// Whether it still serves (false in the last report, written as it stops).
    pub running: bool,
    /// Driver connections that ended.
    pub connections: u64,
    /// What the function holds now (`None` without the firmware).
    pub accounting: Option<Accounting>,
    /// The last driver that left, and what it left behind.
    pub last_driver: Option<Disconnect>,
    /// Device counters: resets, command doorbells, UAR doorbells, contained panics.
    pub device: [(&'static str, u64); 4],
    /// HCA counters (`None` without the firmware).
    pub hca: Option<Vec<(&'static str, u64)>>,
    /// Fault-hook counters: commands failed, swallowed, delayed, delayed ones still pending
    /// and dropped by a reset, rings of a busy slot, rings ignored by a stopped function
    /// (`None` without the firmware).
    pub faults: Option<Vec<(&'static str, u64)>>,
    /// Which checks of [`crate::Strictness`] are on (`None` without the firmware).
    pub strictness: Option<Vec<(&'static str, bool)>>,
    /// What the port is cabled to (`--wire` syntax).
    pub wire: String,
    /// The port's counters ([`crate::PortStats`]): frames by direction and cast, drops by
    /// cause.
    pub port: Vec<(&'static str, u64)>,
}

impl StateReport {
    /// The JSON object (one line).
    pub fn to_json(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"version\":1,\"pid\":{},\"socket\":{},\"running\":{},\"connections\":{},\"accounting\":",
            self.pid,
            json_str(&self.socket),
            self.running,
            self.connections
        );
        push_accounting(&mut o, self.accounting.as_ref());
        o.push_str(",\"last_driver\":");
        match &self.last_driver {
            None => o.push_str("null"),
            Some(d) => {
                let _ = write!(o, "{{\"connection\":{},\"left\":", d.connection);
                push_accounting(&mut o, d.left.as_ref());
                o.push('}');
            }
        }
        o.push_str(",\"device\":");
        push_counters(&mut o, &self.device);
        o.push_str(",\"hca\":");
        match &self.hca {
            None => o.push_str("null"),
            Some(h) => push_counters(&mut o, h),
        }
        o.push_str(",\"faults\":");
        match &self.faults {
            None => o.push_str("null"),
            Some(f) => push_counters(&mut o, f),
        }
        o.push_str(",\"strictness\":");
        match &self.strictness {
            None => o.push_str("null"),
            Some(s) => push_counters(&mut o, s),
        }
        let _ = write!(o, ",\"wire\":{},\"port\":", json_str(&self.wire));
        push_counters(&mut o, &self.port);
        o.push('}');
        o
    }

    /// Replace `path` with this report (written to `path` + ".tmp", then
    /// renamed over it).
    pub fn write_atomic(&self, path: &Path) -> io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let mut text = self.to_json();
        text.push('\n');
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Disabled => "disabled",
        Phase::Enabled => "enabled",
        Phase::Initialized => "initialized",
    }
}

fn push_accounting(o: &mut String, a: Option<&Accounting>) {
    let Some(a) = a else {
        o.push_str("null");
        return;
    };
    let _ = write!(
        o,
        "{{\"phase\":\"{}\",\"pages_held\":{},\"uars\":{},\"pds\":{},\"tds\":{},\"eqs\":{},\
         \"cqs\":{},\"qps\":{},\"mkeys\":{},\"gids\":{},\"eth_objects\":{},\"flow_objects\":{},\
         \"dma_mappings\":{},\"clean\":{}}}",
        phase_name(a.phase),
        a.pages_held,
        a.uars,
        a.pds,
        a.tds,
        a.eqs,
        a.cqs,
        a.qps,
        a.mkeys,
        a.gids,
        a.eth_objects,
        a.flow_objects,
        a.dma_mappings,
        a.is_clean()
    );
}

/// `{"name":value,…}` (numbers or booleans).
fn push_counters<T: std::fmt::Display>(o: &mut String, c: &[(&'static str, T)]) {
    o.push('{');
    for (i, (k, v)) in c.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "\"{k}\":{v}");
    }
    o.push('}');
}

/// `s` as a JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", u32::from(c));
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_and_reports_are_one_json_line() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        let a = Accounting {
            phase: Phase::Initialized,
            pages_held: 48,
            uars: 1,
            pds: 1,
            tds: 0,
            eqs: 1,
            cqs: 2,
            qps: 1,
            mkeys: 1,
            gids: 1,
            eth_objects: 0,
            flow_objects: 0,
            dma_mappings: 9,
        };
        let r = StateReport {
            pid: 7,
            socket: "/tmp/x.sock".into(),
            running: false,
            connections: 1,
            accounting: None,
            last_driver: Some(Disconnect {
                connection: 1,
                left: Some(a),
            }),
            device: [("resets", 2), ("a", 0), ("b", 0), ("c", 0)],
            hca: None,
            faults: None,
            strictness: Some(vec![("page-requests", true), ("cq-pas", false)]),
            wire: "packet:veth0".into(),
            port: vec![("rx_frames", 3), ("rx_other_mac", 1)],
        };
        assert_eq!(
            r.to_json(),
            "{\"version\":1,\"pid\":7,\"socket\":\"/tmp/x.sock\",\"running\":false,\
             \"connections\":1,\"accounting\":null,\"last_driver\":{\"connection\":1,\"left\":\
             {\"phase\":\"initialized\",\"pages_held\":48,\"uars\":1,\"pds\":1,\"tds\":0,\
             \"eqs\":1,\"cqs\":2,\"qps\":1,\"mkeys\":1,\"gids\":1,\"eth_objects\":0,\
             \"flow_objects\":0,\"dma_mappings\":9,\
             \"clean\":false}},\"device\":{\"resets\":2,\"a\":0,\"b\":0,\"c\":0},\"hca\":null,\
             \"faults\":null,\"strictness\":{\"page-requests\":true,\"cq-pas\":false},\
             \"wire\":\"packet:veth0\",\"port\":{\"rx_frames\":3,\"rx_other_mac\":1}}"
        );
    }
}
