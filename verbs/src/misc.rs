//! The exports that need no device: enum strings (`ibv_wc_status_str`, …),
//! rate conversions, the `ibv_copy_*_kern` marshalling helpers librdmacm
//! imports, and fork support.

use std::ffi::{c_char, c_int, c_void};

use crate::abi::{
    IBV_FORK_UNNEEDED, ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_ah_attr,
    ibv_gid, ibv_qp_attr, ibv_sa_path_rec,
};

/// `ibv_wc_status_str`: rdma-core's texts (rnic's `WcStatus::as_str`, plus
/// the two tag-matching statuses rnic never produces).
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match status {
        22 => c"TM error",
        23 => c"TM software rendezvous",
        s => match u32::try_from(s).map(rnic::core::WcStatus::from_raw) {
            Ok(rnic::core::WcStatus::Unknown(_)) | Err(_) => c"unknown",
            Ok(st) => wc_status_cstr(st),
        },
    };
    s.as_ptr()
}

fn wc_status_cstr(st: rnic::core::WcStatus) -> &'static std::ffi::CStr {
    use rnic::core::WcStatus as S;
    match st {
        S::Success => c"success",
        S::LocLenErr => c"local length error",
        S::LocQpOpErr => c"local QP operation error",
        S::LocEecOpErr => c"local EE context operation error",
        S::LocProtErr => c"local protection error",
        S::WrFlushErr => c"Work Request Flushed Error",
        S::MwBindErr => c"memory management operation error",
        S::BadRespErr => c"bad response error",
        S::LocAccessErr => c"local access error",
        S::RemInvReqErr => c"remote invalid request error",
        S::RemAccessErr => c"remote access error",
        S::RemOpErr => c"remote operation error",
        S::RetryExcErr => c"transport retry counter exceeded",
        S::RnrRetryExcErr => c"RNR retry counter exceeded",
        S::LocRddViolErr => c"local RDD violation error",
        S::RemInvRdReqErr => c"remote invalid RD request",
        S::RemAbortErr => c"aborted error",
        S::InvEecnErr => c"invalid EE context number",
        S::InvEecStateErr => c"invalid EE context state",
        S::FatalErr => c"fatal error",
        S::RespTimeoutErr => c"response timeout error",
        S::GeneralErr => c"general error",
        S::Unknown(_) => c"unknown",
    }
}

/// `ibv_node_type_str`.
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    }
    .as_ptr()
}

/// `ibv_port_state_str`.
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    match state {
        0 => c"no state change (NOP)",
        1 => c"down",
        2 => c"init",
        3 => c"armed",
        4 => c"active",
        5 => c"active defer",
        _ => c"unknown",
    }
    .as_ptr()
}

/// `ibv_event_type_str`.
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `enum ibv_rate` → (multiple of 2.5 Gb/s where it is one, Mb/s).
const RATES: [(c_int, Option<c_int>, c_int); 24] = [
    (2, Some(1), 2_500),
    (5, Some(2), 5_000),
    (3, Some(4), 10_000),
    (6, Some(8), 20_000),
    (4, Some(12), 30_000),
    (7, Some(16), 40_000),
    (8, Some(24), 60_000),
    (9, Some(32), 80_000),
    (10, Some(48), 120_000),
    (11, None, 14_062),
    (12, None, 56_250),
    (13, None, 112_500),
    (14, None, 168_750),
    (15, None, 25_781),
    (16, None, 103_125),
    (17, None, 206_250),
    (18, None, 309_375),
    (19, Some(11), 28_125),
    (20, Some(20), 53_125),
    (21, Some(160), 425_000),
    (22, Some(240), 637_500),
    (23, Some(320), 850_000),
    (24, Some(480), 1_275_000),
    (0, None, -1),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, -1 if none.
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && rate != 0)
        .and_then(|r| r.1)
        .unwrap_or(-1)
}

/// `mult_to_ibv_rate`: `IBV_RATE_MAX` (0) if no rate is that multiple.
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == Some(mult)).map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && rate != 0)
        .map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: `IBV_RATE_MAX` (0) for an unknown speed.
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps && r.0 != 0)
        .map_or(0, |r| r.0)
}

fn ah_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid = ibv_gid { raw: src.grh.dgid };
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// `ibv_copy_ah_attr_from_kern`: the kernel ABI's AH attributes as verbs'.
///
/// # Safety
///
/// Both pointers are valid structures.
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *mut ib_uverbs_ah_attr,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller's structure.
    let d = unsafe { &mut *dst };
    // SAFETY: likewise.
    let s = unsafe { &*src };
    ah_from_kern(d, s);
}

/// `ibv_copy_qp_attr_from_kern`.
///
/// # Safety
///
/// Both pointers are valid structures.
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *mut ib_uverbs_qp_attr,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller's structure.
    let d = unsafe { &mut *dst };
    // SAFETY: likewise.
    let s = unsafe { &*src };
    d.cur_qp_state = s.cur_qp_state;
    d.path_mtu = s.path_mtu;
    d.path_mig_state = s.path_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    ah_from_kern(&mut d.ah_attr, &s.ah_attr);
    ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

/// `ibv_copy_path_rec_from_kern`.
///
/// # Safety
///
/// Both pointers are valid structures.
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *mut ib_user_path_rec,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller's structure.
    let d = unsafe { &mut *dst };
    // SAFETY: likewise.
    let s = unsafe { &*src };
    d.dgid = ibv_gid { raw: s.dgid };
    d.sgid = ibv_gid { raw: s.sgid };
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as c_int;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as c_int;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u8;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}

/// `ibv_copy_path_rec_to_kern`.
///
/// # Safety
///
/// Both pointers are valid structures.
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *mut ibv_sa_path_rec,
) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: the caller's structure.
    let d = unsafe { &mut *dst };
    // SAFETY: likewise.
    let s = unsafe { &*src };
    // SAFETY: every bit pattern of a GID's bytes is valid.
    d.dgid = unsafe { s.dgid.raw };
    // SAFETY: likewise.
    d.sgid = unsafe { s.sgid.raw };
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as u32;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as u32;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = u32::from(s.mtu);
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}

/// `ibv_fork_init`: nothing to do. rnic reaches registered memory through
/// the process's own virtual addresses (rxe), or shares it with the device
/// as `MAP_SHARED` memfd mappings (mlx5), so a fork neither breaks the
/// parent's registrations nor needs `MADV_DONTFORK`.
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (see [`ibv_fork_init`]).
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED as c_int
}

/// `ibv_dontfork_range`: nothing to do (see [`ibv_fork_init`]).
pub extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_dofork_range`: nothing to do (see [`ibv_fork_init`]).
pub extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    let _ = (base, size);
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: every string these functions return is a static C literal.
        unsafe { CStr::from_ptr(p) }.to_str().expect("ascii")
    }

    #[test]
    fn strings_are_rdma_cores() {
        assert_eq!(s(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(s(ibv_wc_status_str(12)), "transport retry counter exceeded");
        assert_eq!(s(ibv_wc_status_str(23)), "TM software rendezvous");
        assert_eq!(s(ibv_wc_status_str(99)), "unknown");
        assert_eq!(s(ibv_wc_status_str(-1)), "unknown");
        assert_eq!(
            s(ibv_event_type_str(1)),
            "local work queue catastrophic error"
        );
        assert_eq!(s(ibv_event_type_str(20)), "unknown");
        assert_eq!(s(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(ibv_port_state_str(4)), "active");
    }

    #[test]
    fn rates_convert_both_ways() {
        assert_eq!(ibv_rate_to_mult(3), 4); // 10 Gb/s
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(ibv_rate_to_mult(16), -1); // 100 Gb/s is not a multiple
        assert_eq!(ibv_rate_to_mbps(16), 103_125);
        assert_eq!(mbps_to_ibv_rate(103_125), 16);
        assert_eq!(ibv_rate_to_mbps(0), -1);
        assert_eq!(mbps_to_ibv_rate(1), 0);
        assert_eq!(mult_to_ibv_rate(3), 0);
    }
}
