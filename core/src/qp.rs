//! Queue-pair types, attributes and the state-transition check.
//!
//! A queue pair is brought up RESET → INIT → RTR → RTS by `modify` calls, each
//! carrying a [`QpAttr`] and a [`QpAttrMask`] that says which attributes the
//! call sets. Which transitions exist, and which attributes each one requires
//! or accepts for each QP type, follows the Linux kernel's
//! `ib_modify_qp_is_ok` table (`drivers/infiniband/core/verbs.c`), which in
//! turn follows the InfiniBand spec (IBA vol. 1, §10.3 and §11.2.5.3).
//! [`check_modify`] runs that check before any provider is involved, so an
//! illegal request fails with an error naming the transition and the
//! attributes at fault instead of a bare `EINVAL` from the device.
//!
//! Legal transitions (for every type unless noted):
//!
//! | from \ to | RESET | INIT | RTR | RTS | SQD | SQE | ERR |
//! |---|---|---|---|---|---|---|---|
//! | RESET | ✓ | ✓ |   |   |   |   | ✓ |
//! | INIT  | ✓ | ✓ | ✓ |   |   |   | ✓ |
//! | RTR   | ✓ |   |   | ✓ |   |   | ✓ |
//! | RTS   | ✓ |   |   | ✓ | ✓ |   | ✓ |
//! | SQD   | ✓ |   |   | ✓ | ✓ |   | ✓ |
//! | SQE   | ✓ |   |   | UC, UD |   |   | ✓ |
//! | ERR   | ✓ |   |   |   |   |   | ✓ |
//!
//! One deliberate difference from the kernel table: SQE → RTS is refused for
//! RC. An RC queue pair never enters SQE (IBA §10.3.1: a send-queue error moves
//! it to ERR); the kernel accepts the request with no attributes only because
//! its validity bit is shared by all types.
//!
//! rnic has no automatic path migration, so the `ALT_PATH` and
//! `PATH_MIG_STATE` attributes are refused ([`QpTransitionError::Unsupported`])
//! even where the table would accept them.

use std::fmt;
use std::time::Duration;

use bitflags::bitflags;
use thiserror::Error;

use crate::access::AccessFlags;
use crate::types::{Gid, Mtu, Psn, Qpn};

/// The transport service of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC` = 2).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC` = 3).
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD` = 4).
    Ud,
}

impl QpType {
    /// The three types.
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

    /// The ibverbs value (`enum ibv_qp_type`).
    pub const fn as_raw(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
        }
    }

    /// From the ibverbs value; `None` for types rnic does not implement.
    pub const fn from_raw(raw: u32) -> Option<QpType> {
        match raw {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            _ => None,
        }
    }

    /// `true` for the connected types (RC, UC), which talk to one peer QP.
    pub const fn is_connected(self) -> bool {
        !matches!(self, QpType::Ud)
    }

    const fn index(self) -> usize {
        match self {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

/// The state of a queue pair (`enum ibv_qp_state`; same numbering).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: no work is processed, posted work is discarded (0).
    #[default]
    Reset,
    /// Receives may be posted; nothing is processed yet (1).
    Init,
    /// Ready to receive: incoming packets are processed (2).
    Rtr,
    /// Ready to send: both directions work (3).
    Rts,
    /// Send queue drain: no new sends start (4).
    Sqd,
    /// Send queue error (UC, UD): receives continue, sends stopped (5).
    Sqe,
    /// Error: all outstanding work completes with flush errors (6).
    Err,
}

impl QpState {
    /// All seven states, in ibverbs order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The ibverbs value (0 = RESET … 6 = ERR).
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// From the ibverbs value; `None` above 6.
    pub const fn from_raw(raw: u32) -> Option<QpState> {
        match raw {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// `true` where send work requests may be posted (RTS, SQD, SQE, ERR —
    /// in SQE and ERR they complete with flush errors).
    pub const fn can_post_send(self) -> bool {
        matches!(
            self,
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
        )
    }

    /// `true` where receive work requests may be posted (every state but RESET).
    pub const fn can_post_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

bitflags! {
    /// Which attributes of a [`QpAttr`] a modify call sets (`enum
    /// ibv_qp_attr_mask`; same bit positions).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`: the state to move to.
        const STATE = 1 << 0;
        /// `cur_qp_state`: the caller's assertion of the current state.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`: the address vector of the peer.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`: local ACK timeout.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// Alternate path (automatic path migration; not implemented by rnic).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// Path migration state (not implemented by rnic).
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`: queue capacities (resizing is not a legal modify).
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
    }
}

impl fmt::Display for QpAttrMask {
    /// `AV|PATH_MTU|DEST_QPN`, or `none` for the empty mask.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, (name, _)) in self.iter_names().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

/// Where packets to the peer go: the RoCE address vector (`ibv_ah_attr` with
/// its global route header, which RoCE always uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The peer's GID (destination IP address).
    pub dgid: Gid,
    /// Index of the local GID (source IP address) in the port's GID table.
    pub sgid_index: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IP traffic class / TOS (DSCP and ECN bits).
    pub traffic_class: u8,
    /// IPv6 flow label: 20 bits.
    pub flow_label: u32,
    /// UDP source port; `None` lets the provider derive it (rxe hashes the
    /// QPNs into 0xC000..=0xFFFF).
    pub udp_sport: Option<u16>,
    /// Destination MAC; `None` lets the provider resolve it (neighbour table,
    /// or derived from a link-local GID).
    pub dmac: Option<[u8; 6]>,
}

impl AddressVector {
    /// The largest flow label (20 bits).
    pub const MAX_FLOW_LABEL: u32 = 0xF_FFFF;

    /// An address vector to `dgid` from GID index 0, hop limit 64.
    pub const fn new(dgid: Gid) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_sport: None,
            dmac: None,
        }
    }

    /// Check the field ranges (the flow label is 20 bits).
    pub const fn validate(&self) -> Result<(), QpAttrError> {
        if self.flow_label > Self::MAX_FLOW_LABEL {
            Err(QpAttrError::FlowLabel {
                value: self.flow_label,
            })
        } else {
            Ok(())
        }
    }
}

impl Default for AddressVector {
    fn default() -> AddressVector {
        AddressVector::new(Gid::ZERO)
    }
}

/// RNR NAK timer code → delay in microseconds (IBA table 45; `IB_RNR_TIMER_*`).
///
/// Code 0 is the longest delay (655.36 ms), not zero. Code 25 is 61.44 ms;
/// rxe's table has a typo there (61.41 ms). See rocev2.md §4.1.
pub const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The delay an RNR NAK carrying timer `code` asks for; `None` above 31.
pub fn rnr_timer_delay(code: u8) -> Option<Duration> {
    RNR_TIMER_MICROS
        .get(usize::from(code))
        .map(|&us| Duration::from_micros(u64::from(us)))
}

/// The local ACK timeout for a `timeout` exponent: `None` for 0 (wait
/// forever), else 4.096 µs × 2^`timeout`; exponents above 31 saturate at 31.
pub fn ack_timeout_delay(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4_096u64 << timeout.min(31)))
    }
}

/// Capacities of a queue pair's work queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// Send work requests that may be outstanding.
    pub max_send_wr: u32,
    /// Receive work requests that may be outstanding.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes a send work request may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    /// 64 sends, 64 receives, one SGE each, no inline data.
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What a queue pair is created with (the CQs and PD are passed as objects).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpInitAttr {
    /// Transport service.
    pub qp_type: QpType,
    /// Requested capacities; the provider may round them up.
    pub caps: QpCaps,
    /// Every send work request is signaled, whatever its flags say.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// A queue pair of `qp_type` with `caps`, signaling selectively.
    pub const fn new(qp_type: QpType, caps: QpCaps) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            caps,
            sq_sig_all: false,
        }
    }
}

/// Queue-pair attributes (`struct ibv_qp_attr`, minus InfiniBand-only and
/// path-migration fields). Only the fields named in the accompanying
/// [`QpAttrMask`] are read by a modify call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// The state to move to (`STATE`).
    pub qp_state: QpState,
    /// The caller's assertion of the current state (`CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Ask for an affiliated event when the SQ has drained (`EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// Incoming remote operations the responder serves (`ACCESS_FLAGS`).
    pub qp_access_flags: AccessFlags,
    /// P_Key table index (`PKEY_INDEX`).
    pub pkey_index: u16,
    /// Physical port, starting at 1 (`PORT`).
    pub port_num: u8,
    /// Q_Key for UD (`QKEY`).
    pub qkey: u32,
    /// Address vector of the peer (`AV`).
    pub ah_attr: AddressVector,
    /// Path MTU (`PATH_MTU`).
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent, 0..=31 (`TIMEOUT`); see [`QpAttr::ack_timeout`].
    pub timeout: u8,
    /// Transport retries after a timeout or NAK, 0..=7 (`RETRY_CNT`).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK, 0..=7; 7 retries forever (`RNR_RETRY`).
    pub rnr_retry: u8,
    /// First PSN expected from the peer (`RQ_PSN`).
    pub rq_psn: Psn,
    /// RDMA reads and atomics this QP may have outstanding as requester
    /// (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// RNR NAK timer code this QP sends as responder, 0..=31
    /// (`MIN_RNR_TIMER`); see [`RNR_TIMER_MICROS`].
    pub min_rnr_timer: u8,
    /// First PSN this QP sends (`SQ_PSN`).
    pub sq_psn: Psn,
    /// RDMA reads and atomics the peer may have outstanding at this QP as
    /// responder (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// Queue capacities (`CAP`; reported by query, not modifiable).
    pub cap: QpCaps,
    /// The peer's QPN (`DEST_QPN`).
    pub dest_qp_num: Qpn,
}

impl QpAttr {
    /// `rnr_retry` value that retries forever.
    pub const RNR_RETRY_INFINITE: u8 = 7;

    /// The local ACK timeout: `None` when `timeout` is 0 (wait forever), else
    /// 4.096 µs × 2^`timeout`.
    pub fn ack_timeout(&self) -> Option<Duration> {
        ack_timeout_delay(self.timeout)
    }

    /// The delay `min_rnr_timer` asks a peer to wait after an RNR NAK;
    /// `None` when the code is out of range.
    pub fn min_rnr_delay(&self) -> Option<Duration> {
        rnr_timer_delay(self.min_rnr_timer)
    }

    /// Check the ranges of the fields named in `mask`.
    pub fn validate(&self, mask: QpAttrMask) -> Result<(), QpAttrError> {
        if mask.contains(QpAttrMask::RETRY_CNT) && self.retry_cnt > 7 {
            return Err(QpAttrError::RetryCnt {
                value: self.retry_cnt,
            });
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && self.rnr_retry > 7 {
            return Err(QpAttrError::RnrRetry {
                value: self.rnr_retry,
            });
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && self.min_rnr_timer > 31 {
            return Err(QpAttrError::MinRnrTimer {
                value: self.min_rnr_timer,
            });
        }
        if mask.contains(QpAttrMask::TIMEOUT) && self.timeout > 31 {
            return Err(QpAttrError::Timeout {
                value: self.timeout,
            });
        }
        if mask.contains(QpAttrMask::PORT) && self.port_num == 0 {
            return Err(QpAttrError::PortNum {
                value: self.port_num,
            });
        }
        if mask.contains(QpAttrMask::AV) {
            self.ah_attr.validate()?;
        }
        Ok(())
    }
}

impl Default for QpAttr {
    /// RESET, port 1, and ibv_rc_pingpong's tuning: MTU 1024, timeout 14,
    /// retry_cnt 7, rnr_retry 7, min_rnr_timer 12, one outstanding read/atomic
    /// each way.
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            en_sqd_async_notify: false,
            qp_access_flags: AccessFlags::empty(),
            pkey_index: 0,
            port_num: 1,
            qkey: 0,
            ah_attr: AddressVector::default(),
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::default(),
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            sq_psn: Psn::default(),
            max_dest_rd_atomic: 1,
            cap: QpCaps::default(),
            dest_qp_num: Qpn::default(),
        }
    }
}

/// A queue-pair attribute outside its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QpAttrError {
    /// `retry_cnt` above 7.
    #[error("retry_cnt {value} is out of range: use 0..=7 (ibv_rc_pingpong uses 7)")]
    RetryCnt {
        /// The refused value.
        value: u8,
    },
    /// `rnr_retry` above 7.
    #[error("rnr_retry {value} is out of range: use 0..=7, where 7 retries forever")]
    RnrRetry {
        /// The refused value.
        value: u8,
    },
    /// `min_rnr_timer` above 31.
    #[error("min_rnr_timer {value} is out of range: use a timer code 0..=31 (12 = 0.64 ms)")]
    MinRnrTimer {
        /// The refused value.
        value: u8,
    },
    /// `timeout` above 31.
    #[error(
        "timeout {value} is out of range: use 0..=31 (0 waits forever, n waits 4.096 µs × 2^n; \
         14 ≈ 67 ms)"
    )]
    Timeout {
        /// The refused value.
        value: u8,
    },
    /// A flow label wider than 20 bits.
    #[error("flow label {value:#x} does not fit 20 bits (max 0xfffff)")]
    FlowLabel {
        /// The refused value.
        value: u32,
    },
    /// Port number 0.
    #[error("port_num {value} is invalid: port numbers start at 1")]
    PortNum {
        /// The refused value.
        value: u8,
    },
}

/// Why a modify request was refused before reaching the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QpTransitionError {
    /// The transition does not exist for this QP type.
    #[error(
        "an {qp_type} QP cannot move from {from} to {to}; from {from} it may move to {}",
        LegalTargets { qp_type: *.qp_type, from: *.from }
    )]
    IllegalTransition {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// Required attributes are absent from the mask.
    #[error(
        "{qp_type} {from}->{to} requires attributes {missing}: set them in QpAttr and add them \
         to the mask"
    )]
    MissingAttributes {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The required attributes the mask lacks.
        missing: QpAttrMask,
    },
    /// The mask names attributes this transition does not accept.
    #[error("{qp_type} {from}->{to} does not accept attributes {extra}: remove them from the mask")]
    AttributesNotAllowed {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes that are neither required nor optional here.
        extra: QpAttrMask,
    },
    /// The mask names attributes rnic does not implement.
    #[error(
        "attributes {attrs} belong to automatic path migration, which rnic does not implement: \
         remove them from the mask"
    )]
    Unsupported {
        /// The unimplemented attributes.
        attrs: QpAttrMask,
    },
    /// An attribute named in the mask is out of range.
    #[error("invalid QP attribute: {source}")]
    InvalidAttribute {
        /// The range error.
        #[from]
        source: QpAttrError,
    },
}

/// The attributes a legal transition requires and accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransitionAttrs {
    /// Attributes the mask must contain (besides `STATE`).
    pub required: QpAttrMask,
    /// Attributes the mask may contain.
    pub optional: QpAttrMask,
}

/// One cell of the table: legality and attributes per QP type (RC, UC, UD).
#[derive(Clone, Copy)]
struct Rule {
    legal: [bool; 3],
    req: [QpAttrMask; 3],
    opt: [QpAttrMask; 3],
}

macro_rules! mask {
    ($($flag:ident)|*) => {
        QpAttrMask::from_bits_retain(0 $(| QpAttrMask::$flag.bits())*)
    };
}

const NONE: QpAttrMask = QpAttrMask::empty();
const ILLEGAL: Option<Rule> = None;
/// A transition legal for every type that takes only `STATE`.
const BARE: Option<Rule> = Some(Rule {
    legal: [true; 3],
    req: [NONE; 3],
    opt: [NONE; 3],
});

/// Attributes accepted when returning to RTS (from RTR as optional, RTS, SQD).
const RC_RTS_OPT: QpAttrMask =
    mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE);
const UC_RTS_OPT: QpAttrMask = mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE);
const UD_RTS_OPT: QpAttrMask = mask!(CUR_STATE | QKEY);

/// `TABLE[from][to]`, states in ibverbs order, types in order RC, UC, UD.
/// Facts from the kernel's `qp_state_table` (see the module docs).
const TABLE: [[Option<Rule>; 7]; 7] = [
    // from RESET
    [
        BARE,
        Some(Rule {
            legal: [true; 3],
            req: [
                mask!(PKEY_INDEX | PORT | ACCESS_FLAGS),
                mask!(PKEY_INDEX | PORT | ACCESS_FLAGS),
                mask!(PKEY_INDEX | PORT | QKEY),
            ],
            opt: [NONE; 3],
        }),
        ILLEGAL,
        ILLEGAL,
        ILLEGAL,
        ILLEGAL,
        BARE,
    ],
    // from INIT
    [
        BARE,
        Some(Rule {
            legal: [true; 3],
            req: [NONE; 3],
            opt: [
                mask!(PKEY_INDEX | PORT | ACCESS_FLAGS),
                mask!(PKEY_INDEX | PORT | ACCESS_FLAGS),
                mask!(PKEY_INDEX | PORT | QKEY),
            ],
        }),
        Some(Rule {
            legal: [true; 3],
            req: [
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN),
                NONE,
            ],
            opt: [
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
                mask!(PKEY_INDEX | QKEY),
            ],
        }),
        ILLEGAL,
        ILLEGAL,
        ILLEGAL,
        BARE,
    ],
    // from RTR
    [
        BARE,
        ILLEGAL,
        ILLEGAL,
        Some(Rule {
            legal: [true; 3],
            req: [
                mask!(TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC),
                mask!(SQ_PSN),
                mask!(SQ_PSN),
            ],
            opt: [RC_RTS_OPT, UC_RTS_OPT, UD_RTS_OPT],
        }),
        ILLEGAL,
        ILLEGAL,
        BARE,
    ],
    // from RTS
    [
        BARE,
        ILLEGAL,
        ILLEGAL,
        Some(Rule {
            legal: [true; 3],
            req: [NONE; 3],
            opt: [RC_RTS_OPT, UC_RTS_OPT, UD_RTS_OPT],
        }),
        Some(Rule {
            legal: [true; 3],
            req: [NONE; 3],
            opt: [mask!(EN_SQD_ASYNC_NOTIFY); 3],
        }),
        ILLEGAL,
        BARE,
    ],
    // from SQD
    [
        BARE,
        ILLEGAL,
        ILLEGAL,
        Some(Rule {
            legal: [true; 3],
            req: [NONE; 3],
            opt: [RC_RTS_OPT, UC_RTS_OPT, UD_RTS_OPT],
        }),
        Some(Rule {
            legal: [true; 3],
            req: [NONE; 3],
            opt: [
                mask!(
                    PORT | AV
                        | TIMEOUT
                        | RETRY_CNT
                        | RNR_RETRY
                        | MAX_QP_RD_ATOMIC
                        | MAX_DEST_RD_ATOMIC
                        | ALT_PATH
                        | ACCESS_FLAGS
                        | PKEY_INDEX
                        | MIN_RNR_TIMER
                        | PATH_MIG_STATE
                ),
                mask!(AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE),
                mask!(PKEY_INDEX | QKEY),
            ],
        }),
        ILLEGAL,
        BARE,
    ],
    // from SQE
    [
        BARE,
        ILLEGAL,
        ILLEGAL,
        Some(Rule {
            // RC never enters SQE; see the module docs.
            legal: [false, true, true],
            req: [NONE; 3],
            opt: [
                NONE,
                mask!(CUR_STATE | ACCESS_FLAGS),
                mask!(CUR_STATE | QKEY),
            ],
        }),
        ILLEGAL,
        ILLEGAL,
        BARE,
    ],
    // from ERR
    [BARE, ILLEGAL, ILLEGAL, ILLEGAL, ILLEGAL, ILLEGAL, BARE],
];

/// Attributes rnic refuses even where the table accepts them.
const UNSUPPORTED: QpAttrMask = mask!(ALT_PATH | PATH_MIG_STATE);

/// The attributes `from → to` requires and accepts for `qp_type`, or `None`
/// when the transition is illegal.
pub fn transition_attrs(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionAttrs> {
    let rule = TABLE[from.index()][to.index()]?;
    let t = qp_type.index();
    rule.legal[t].then_some(TransitionAttrs {
        required: rule.req[t],
        optional: rule.opt[t],
    })
}

/// Check a modify request the way the kernel's `ib_modify_qp_is_ok` does,
/// plus the value ranges of the attributes the mask names.
///
/// The state moved from is `attr.cur_qp_state` when the mask has
/// `CUR_STATE` (the caller asserts it, e.g. after the device moved the QP to
/// SQE), else `current`. The state moved to is `attr.qp_state` when the mask
/// has `STATE`, else the state moved from (an attribute-only modify).
/// Returns the state the QP will be in.
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr_mask: QpAttrMask,
    attr: &QpAttr,
) -> Result<QpState, QpTransitionError> {
    let from = if attr_mask.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state
    } else {
        current
    };
    let to = if attr_mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        from
    };
    let Some(rule) = transition_attrs(qp_type, from, to) else {
        return Err(QpTransitionError::IllegalTransition { qp_type, from, to });
    };
    let missing = rule.required.difference(attr_mask);
    if !missing.is_empty() {
        return Err(QpTransitionError::MissingAttributes {
            qp_type,
            from,
            to,
            missing,
        });
    }
    let extra = attr_mask.difference(rule.required | rule.optional | QpAttrMask::STATE);
    if !extra.is_empty() {
        return Err(QpTransitionError::AttributesNotAllowed {
            qp_type,
            from,
            to,
            extra,
        });
    }
    let unsupported = attr_mask.intersection(UNSUPPORTED);
    if !unsupported.is_empty() {
        return Err(QpTransitionError::Unsupported { attrs: unsupported });
    }
    attr.validate(attr_mask)?;
    Ok(to)
}

/// Displays the states reachable from one state, for error messages.
struct LegalTargets {
    qp_type: QpType,
    from: QpState,
}

impl fmt::Display for LegalTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for to in QpState::ALL {
            if transition_attrs(self.qp_type, self.from, to).is_some() {
                if !first {
                    f.write_str(", ")?;
                }
                first = false;
                write!(f, "{to}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    const ERR: QpState = QpState::Err;

    /// The legal (from, to) pairs per type, written out independently of
    /// `TABLE` from the kernel's `qp_state_table`, with the attributes each
    /// requires.
    fn expected(qp_type: QpType, from: QpState, to: QpState) -> Option<QpAttrMask> {
        let rc = qp_type == QpType::Rc;
        let ud = qp_type == QpType::Ud;
        match (from, to) {
            (_, Reset) | (_, ERR) => Some(QpAttrMask::empty()),
            (Reset, Init) if ud => Some(mask!(PKEY_INDEX | PORT | QKEY)),
            (Reset, Init) => Some(mask!(PKEY_INDEX | PORT | ACCESS_FLAGS)),
            (Init, Init) => Some(QpAttrMask::empty()),
            (Init, Rtr) if rc => Some(mask!(
                AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
            )),
            (Init, Rtr) if ud => Some(QpAttrMask::empty()),
            (Init, Rtr) => Some(mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN)),
            (Rtr, Rts) if rc => Some(mask!(
                TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
            )),
            (Rtr, Rts) => Some(mask!(SQ_PSN)),
            (Rts, Rts) | (Rts, Sqd) | (Sqd, Rts) | (Sqd, Sqd) => Some(QpAttrMask::empty()),
            (Sqe, Rts) if !rc => Some(QpAttrMask::empty()),
            _ => None,
        }
    }

    fn attr_to(to: QpState) -> QpAttr {
        QpAttr {
            qp_state: to,
            ..QpAttr::default()
        }
    }

    #[test]
    fn every_state_pair_for_every_type() {
        let mut legal_count = [0usize; 3];
        for qp_type in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let attr = QpAttr {
                        cur_qp_state: from,
                        ..attr_to(to)
                    };
                    match expected(qp_type, from, to) {
                        Some(req) => {
                            legal_count[qp_type.index()] += 1;
                            assert_eq!(
                                check_modify(qp_type, from, QpAttrMask::STATE | req, &attr),
                                Ok(to),
                                "{qp_type} {from}->{to} with {req}"
                            );
                            for bit in req.iter() {
                                assert_eq!(
                                    check_modify(
                                        qp_type,
                                        from,
                                        QpAttrMask::STATE | (req - bit),
                                        &attr
                                    ),
                                    Err(QpTransitionError::MissingAttributes {
                                        qp_type,
                                        from,
                                        to,
                                        missing: bit
                                    }),
                                    "{qp_type} {from}->{to} without {bit}"
                                );
                            }
                        }
                        None => {
                            for mask in [QpAttrMask::STATE, QpAttrMask::all()] {
                                assert_eq!(
                                    check_modify(qp_type, from, mask, &attr),
                                    Err(QpTransitionError::IllegalTransition { qp_type, from, to }),
                                    "{qp_type} {from}->{to} must be illegal"
                                );
                            }
                            assert_eq!(transition_attrs(qp_type, from, to), None);
                        }
                    }
                }
            }
        }
        // 7 pairs into RESET + 7 into ERR + RESET->INIT, INIT->INIT, INIT->RTR,
        // RTR->RTS, RTS->RTS, RTS->SQD, SQD->RTS, SQD->SQD (+ SQE->RTS for UC, UD).
        assert_eq!(legal_count, [22, 23, 23]);
    }

    #[test]
    fn pingpong_bring_up_masks() {
        let rc = QpType::Rc;
        let init = mask!(STATE | PKEY_INDEX | PORT | ACCESS_FLAGS);
        assert_eq!(check_modify(rc, Reset, init, &attr_to(Init)), Ok(Init));
        let rtr =
            mask!(STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER);
        assert_eq!(check_modify(rc, Init, rtr, &attr_to(Rtr)), Ok(Rtr));
        let rts = mask!(STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC);
        assert_eq!(check_modify(rc, Rtr, rts, &attr_to(Rts)), Ok(Rts));
        // UD: RESET->INIT needs QKEY, not ACCESS_FLAGS.
        assert_eq!(
            check_modify(QpType::Ud, Reset, init, &attr_to(Init)),
            Err(QpTransitionError::MissingAttributes {
                qp_type: QpType::Ud,
                from: Reset,
                to: Init,
                missing: QpAttrMask::QKEY
            })
        );
    }

    #[test]
    fn extra_attributes_are_named() {
        // DEST_QPN does not belong in RESET->INIT.
        let mask = mask!(STATE | PKEY_INDEX | PORT | ACCESS_FLAGS | DEST_QPN);
        assert_eq!(
            check_modify(QpType::Rc, Reset, mask, &attr_to(Init)),
            Err(QpTransitionError::AttributesNotAllowed {
                qp_type: QpType::Rc,
                from: Reset,
                to: Init,
                extra: QpAttrMask::DEST_QPN
            })
        );
        // Optional attributes pass; MIN_RNR_TIMER is optional for RC RTR->RTS only.
        let rts = mask!(
            STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC | MIN_RNR_TIMER
        );
        assert_eq!(check_modify(QpType::Rc, Rtr, rts, &attr_to(Rts)), Ok(Rts));
        assert!(matches!(
            check_modify(QpType::Uc, Rtr, rts - mask!(TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC), &attr_to(Rts)),
            Err(QpTransitionError::AttributesNotAllowed { extra, .. }) if extra == QpAttrMask::MIN_RNR_TIMER
        ));
        // CUR_STATE is accepted leaving RTR/RTS/SQD/SQE only, and then decides `from`.
        let attr = QpAttr {
            cur_qp_state: Sqe,
            ..attr_to(Rts)
        };
        assert_eq!(
            check_modify(QpType::Ud, Rts, mask!(STATE | CUR_STATE), &attr),
            Ok(Rts)
        );
        let attr = QpAttr {
            cur_qp_state: Init,
            ..attr_to(Init)
        };
        assert!(matches!(
            check_modify(QpType::Rc, Init, mask!(STATE | CUR_STATE), &attr),
            Err(QpTransitionError::AttributesNotAllowed { extra, .. }) if extra == QpAttrMask::CUR_STATE
        ));
    }

    #[test]
    fn attribute_only_modify_stays_in_state() {
        // No STATE bit: INIT->INIT changing the access flags.
        assert_eq!(
            check_modify(
                QpType::Rc,
                Init,
                QpAttrMask::ACCESS_FLAGS,
                &QpAttr::default()
            ),
            Ok(Init)
        );
        // RTR->RTR does not exist.
        assert!(matches!(
            check_modify(
                QpType::Rc,
                Rtr,
                QpAttrMask::ACCESS_FLAGS,
                &QpAttr::default()
            ),
            Err(QpTransitionError::IllegalTransition {
                from: Rtr,
                to: Rtr,
                ..
            })
        ));
    }

    #[test]
    fn path_migration_is_refused() {
        let mask = mask!(STATE | ALT_PATH);
        assert_eq!(
            check_modify(QpType::Rc, Rts, mask, &attr_to(Rts)),
            Err(QpTransitionError::Unsupported {
                attrs: QpAttrMask::ALT_PATH
            })
        );
    }

    #[test]
    fn ranges_are_checked_for_masked_fields_only() {
        let rts = mask!(STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC);
        let cases = [
            (
                QpAttr {
                    retry_cnt: 8,
                    ..attr_to(Rts)
                },
                QpAttrError::RetryCnt { value: 8 },
            ),
            (
                QpAttr {
                    rnr_retry: 9,
                    ..attr_to(Rts)
                },
                QpAttrError::RnrRetry { value: 9 },
            ),
            (
                QpAttr {
                    timeout: 32,
                    ..attr_to(Rts)
                },
                QpAttrError::Timeout { value: 32 },
            ),
        ];
        for (attr, err) in cases {
            assert_eq!(check_modify(QpType::Rc, Rtr, rts, &attr), Err(err.into()));
        }
        // Out-of-range fields outside the mask are ignored.
        let attr = QpAttr {
            retry_cnt: 8,
            min_rnr_timer: 40,
            ..attr_to(Rts)
        };
        assert_eq!(
            check_modify(QpType::Uc, Rtr, mask!(STATE | SQ_PSN), &attr),
            Ok(Rts)
        );
        let rtr =
            mask!(STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER);
        let attr = QpAttr {
            min_rnr_timer: 32,
            ..attr_to(Rtr)
        };
        assert_eq!(
            check_modify(QpType::Rc, Init, rtr, &attr),
            Err(QpAttrError::MinRnrTimer { value: 32 }.into())
        );
        let mut attr = attr_to(Rtr);
        attr.ah_attr.flow_label = 0x10_0000;
        assert_eq!(
            check_modify(QpType::Rc, Init, rtr, &attr),
            Err(QpAttrError::FlowLabel { value: 0x10_0000 }.into())
        );
        let init = mask!(STATE | PKEY_INDEX | PORT | ACCESS_FLAGS);
        let attr = QpAttr {
            port_num: 0,
            ..attr_to(Init)
        };
        assert_eq!(
            check_modify(QpType::Rc, Reset, init, &attr),
            Err(QpAttrError::PortNum { value: 0 }.into())
        );
    }

    #[test]
    fn error_messages_name_the_transition() {
        let err =
            check_modify(QpType::Rc, Reset, QpAttrMask::STATE, &attr_to(Rts)).expect_err("illegal");
        assert_eq!(
            err.to_string(),
            "an RC QP cannot move from RESET to RTS; from RESET it may move to RESET, INIT, ERR"
        );
        let err = check_modify(
            QpType::Rc,
            Init,
            mask!(STATE | AV | PATH_MTU),
            &attr_to(Rtr),
        )
        .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "RC INIT->RTR requires attributes RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN: \
             set them in QpAttr and add them to the mask"
        );
    }

    #[test]
    fn timers() {
        let attr = QpAttr::default();
        // timeout 14: 4.096 µs × 16384 = 67.108864 ms.
        assert_eq!(attr.ack_timeout(), Some(Duration::from_nanos(67_108_864)));
        assert_eq!(QpAttr { timeout: 0, ..attr }.ack_timeout(), None);
        assert_eq!(
            QpAttr { timeout: 1, ..attr }.ack_timeout(),
            Some(Duration::from_nanos(8_192))
        );
        assert_eq!(
            QpAttr {
                timeout: 31,
                ..attr
            }
            .ack_timeout(),
            Some(Duration::from_nanos(4_096 << 31))
        );
        assert_eq!(attr.min_rnr_delay(), Some(Duration::from_micros(640)));
        assert_eq!(rnr_timer_delay(0), Some(Duration::from_micros(655_360)));
        assert_eq!(rnr_timer_delay(1), Some(Duration::from_micros(10)));
        assert_eq!(rnr_timer_delay(25), Some(Duration::from_micros(61_440)));
        assert_eq!(rnr_timer_delay(31), Some(Duration::from_micros(491_520)));
        assert_eq!(rnr_timer_delay(32), None);
        // Codes 1..=31 grow monotonically.
        assert!(RNR_TIMER_MICROS[1..].windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn raw_values() {
        for (i, s) in QpState::ALL.into_iter().enumerate() {
            assert_eq!(s.as_raw(), i as u32);
            assert_eq!(QpState::from_raw(i as u32), Some(s));
        }
        assert_eq!(QpState::from_raw(7), None);
        for t in QpType::ALL {
            assert_eq!(QpType::from_raw(t.as_raw()), Some(t));
        }
        assert_eq!(QpType::Rc.as_raw(), 2);
        assert_eq!(QpType::Ud.as_raw(), 4);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::MIN_RNR_TIMER.bits(), 1 << 15);
        assert_eq!(QpAttrMask::all().bits(), (1 << 21) - 1);
        assert_eq!(Mtu::default(), Mtu::Mtu1024);
    }
}
