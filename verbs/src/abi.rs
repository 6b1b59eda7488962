//! The C structures of `<infiniband/verbs.h>` (rdma-core 44, Debian 12's
//! `libibverbs-dev`), laid out exactly as the header lays them out on
//! x86_64 (LP64), and the constants the library uses.
//!
//! Applications compile the header's inline functions into themselves
//! (`ibv_post_send`, `ibv_poll_cq`, `ibv_query_port`, `ibv_wr_*`, …): they
//! read these structures at fixed offsets, so every offset here is ABI.
//! Each type is declared through [`c_abi!`], which also records its size,
//! alignment and top-level field offsets; the test `abi_tests` compiles a C
//! program against the system header and compares every recorded number
//! with the compiler's (see `verbs/src/abi_tests.rs`).
//!
//! Field names are the header's, so the C side can name them; a few C
//! names (`ABI_placeholder1`, `_compat_*`) are not snake case.
//! Function pointers are `Option<unsafe extern "C" fn …>`: NULL is `None`.

#![allow(
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_debug_implementations
)]

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// One recorded type: its C spelling, size, alignment and top-level fields
/// `(name, offset, size)`.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CLayout {
    /// The Rust name.
    pub rust: &'static str,
    /// The C type (`struct ibv_qp`, or a `__typeof__` expression for the
    /// header's anonymous members).
    pub c: &'static str,
    /// `sizeof`.
    pub size: usize,
    /// `alignof`.
    pub align: usize,
    /// Fields as `(name, offsetof, sizeof)`.
    pub fields: &'static [(&'static str, usize, usize)],
}

/// Declare `#[repr(C)]` structs and unions and record their layouts in
/// `LAYOUTS` (tests only).
macro_rules! c_abi {
    ($(
        $(#[$m:meta])*
        $kind:ident $name:ident = $cname:literal {
            $( $(#[$fm:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    )*) => {
        $(
            c_abi!(@one $(#[$m])* $kind $name { $( $(#[$fm])* $field : $ty ),* });
        )*

        /// Every type declared here, for the layout test.
        #[cfg(test)]
        pub(crate) const LAYOUTS: &[CLayout] = &[
            $(
                CLayout {
                    rust: stringify!($name),
                    c: $cname,
                    size: std::mem::size_of::<$name>(),
                    align: std::mem::align_of::<$name>(),
                    fields: &[
                        $( (stringify!($field), std::mem::offset_of!($name, $field), std::mem::size_of::<$ty>()) ),*
                    ],
                }
            ),*
        ];
    };
    (@one $(#[$m:meta])* struct $name:ident { $( $(#[$fm:meta])* $field:ident : $ty:ty ),* }) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name { $( $(#[$fm])* pub $field: $ty ),* }
    };
    (@one $(#[$m:meta])* union $name:ident { $( $(#[$fm:meta])* $field:ident : $ty:ty ),* }) => {
        $(#[$m])*
        #[repr(C)]
        pub union $name { $( $(#[$fm])* pub $field: $ty ),* }
    };
}

/// A function pointer slot this library leaves NULL or never calls.
pub type OpaqueFn = Option<unsafe extern "C" fn()>;

/// `pthread_mutex_t` (40 bytes on x86_64 glibc); the library initializes it
/// and never uses it (applications do not either).
pub type PthreadMutex = libc::pthread_mutex_t;
/// `pthread_cond_t` (48 bytes), likewise.
pub type PthreadCond = libc::pthread_cond_t;

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

c_abi! {
    /// `struct _ibv_device_ops` (obsolete, kept for its size).
    struct _ibv_device_ops = "struct _ibv_device_ops" {
        _dummy1: OpaqueFn,
        _dummy2: OpaqueFn,
    }

    /// `struct ibv_device`.
    struct ibv_device = "struct ibv_device" {
        _ops: _ibv_device_ops,
        node_type: c_int,
        transport_type: c_int,
        name: [c_char; IBV_SYSFS_NAME_MAX],
        dev_name: [c_char; IBV_SYSFS_NAME_MAX],
        dev_path: [c_char; IBV_SYSFS_PATH_MAX],
        ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    }

    /// `struct ibv_context_ops`: the per-request entry points the header's
    /// inline functions call.
    struct ibv_context_ops = "struct ibv_context_ops" {
        _compat_query_device: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
        _compat_query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int>,
        _compat_alloc_pd: OpaqueFn,
        _compat_dealloc_pd: OpaqueFn,
        _compat_reg_mr: OpaqueFn,
        _compat_rereg_mr: OpaqueFn,
        _compat_dereg_mr: OpaqueFn,
        alloc_mw: OpaqueFn,
        bind_mw: OpaqueFn,
        dealloc_mw: OpaqueFn,
        _compat_create_cq: OpaqueFn,
        poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
        req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
        _compat_cq_event: OpaqueFn,
        _compat_resize_cq: OpaqueFn,
        _compat_destroy_cq: OpaqueFn,
        _compat_create_srq: OpaqueFn,
        _compat_modify_srq: OpaqueFn,
        _compat_query_srq: OpaqueFn,
        _compat_destroy_srq: OpaqueFn,
        post_srq_recv: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        _compat_create_qp: OpaqueFn,
        _compat_query_qp: OpaqueFn,
        _compat_modify_qp: OpaqueFn,
        _compat_destroy_qp: OpaqueFn,
        post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
        post_recv: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
        _compat_create_ah: OpaqueFn,
        _compat_destroy_ah: OpaqueFn,
        _compat_attach_mcast: OpaqueFn,
        _compat_detach_mcast: OpaqueFn,
        _compat_async_event: OpaqueFn,
    }

    /// `struct ibv_context`: what applications hold. The library's own
    /// context is a [`verbs_context`] whose last member is this.
    struct ibv_context = "struct ibv_context" {
        device: *mut ibv_device,
        ops: ibv_context_ops,
        cmd_fd: c_int,
        async_fd: c_int,
        num_comp_vectors: c_int,
        mutex: PthreadMutex,
        abi_compat: *mut c_void,
    }

    /// `struct verbs_context`: the extended operations, reached by the
    /// header's `verbs_get_ctx_op` at `ibv_context - 320`.
    struct verbs_context = "struct verbs_context" {
        query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
        advise_mr: OpaqueFn,
        alloc_null_mr: OpaqueFn,
        read_counters: OpaqueFn,
        attach_counters_point_flow: OpaqueFn,
        create_counters: OpaqueFn,
        destroy_counters: OpaqueFn,
        reg_dm_mr: OpaqueFn,
        alloc_dm: OpaqueFn,
        free_dm: OpaqueFn,
        modify_flow_action_esp: OpaqueFn,
        destroy_flow_action: OpaqueFn,
        create_flow_action_esp: OpaqueFn,
        modify_qp_rate_limit: OpaqueFn,
        alloc_parent_domain: OpaqueFn,
        dealloc_td: OpaqueFn,
        alloc_td: OpaqueFn,
        modify_cq: OpaqueFn,
        post_srq_ops: OpaqueFn,
        destroy_rwq_ind_table: OpaqueFn,
        create_rwq_ind_table: OpaqueFn,
        destroy_wq: OpaqueFn,
        modify_wq: OpaqueFn,
        create_wq: OpaqueFn,
        query_rt_values: OpaqueFn,
        create_cq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
        priv_: *mut c_void,
        query_device_ex: Option<unsafe extern "C" fn(*mut ibv_context, *const ibv_query_device_ex_input, *mut ibv_device_attr_ex, usize) -> c_int>,
        ibv_destroy_flow: OpaqueFn,
        ABI_placeholder2: OpaqueFn,
        ibv_create_flow: OpaqueFn,
        ABI_placeholder1: OpaqueFn,
        open_qp: OpaqueFn,
        create_qp_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
        get_srq_num: OpaqueFn,
        create_srq_ex: OpaqueFn,
        open_xrcd: OpaqueFn,
        close_xrcd: OpaqueFn,
        _ABI_placeholder3: u64,
        sz: usize,
        context: ibv_context,
    }

    /// `struct ibv_pd`.
    struct ibv_pd = "struct ibv_pd" {
        context: *mut ibv_context,
        handle: u32,
    }

    /// `struct ibv_mr`.
    struct ibv_mr = "struct ibv_mr" {
        context: *mut ibv_context,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        handle: u32,
        lkey: u32,
        rkey: u32,
    }

    /// `struct ibv_cq`.
    struct ibv_cq = "struct ibv_cq" {
        context: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
        handle: u32,
        cqe: c_int,
        mutex: PthreadMutex,
        cond: PthreadCond,
        comp_events_completed: u32,
        async_events_completed: u32,
    }

    /// `struct ibv_cq_ex`: an `ibv_cq` followed by the iterator API
    /// (`ibv_start_poll` / `ibv_next_poll` / `ibv_wc_read_*`).
    struct ibv_cq_ex = "struct ibv_cq_ex" {
        context: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        cq_context: *mut c_void,
        handle: u32,
        cqe: c_int,
        mutex: PthreadMutex,
        cond: PthreadCond,
        comp_events_completed: u32,
        async_events_completed: u32,
        comp_mask: u32,
        status: c_uint,
        wr_id: u64,
        start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
        next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
        end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
        read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
        read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
        read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
        read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
        read_completion_ts: OpaqueFn,
        read_cvlan: OpaqueFn,
        read_flow_tag: OpaqueFn,
        read_tm_info: OpaqueFn,
        read_completion_wallclock_ns: OpaqueFn,
    }

    /// `struct ibv_qp`.
    struct ibv_qp = "struct ibv_qp" {
        context: *mut ibv_context,
        qp_context: *mut c_void,
        pd: *mut ibv_pd,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut ibv_srq,
        handle: u32,
        qp_num: u32,
        state: c_uint,
        qp_type: c_uint,
        mutex: PthreadMutex,
        cond: PthreadCond,
        events_completed: u32,
    }

    /// `struct ibv_qp_ex`: an `ibv_qp` followed by the `ibv_wr_*` post API.
    struct ibv_qp_ex = "struct ibv_qp_ex" {
        qp_base: ibv_qp,
        comp_mask: u64,
        wr_id: u64,
        wr_flags: c_uint,
        wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
        wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
        wr_bind_mw: OpaqueFn,
        wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
        wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
        wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
        wr_set_inline_data_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
        wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
        wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
        wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    }

    /// `struct ibv_srq` (rnic has no shared receive queues; the type is here
    /// for its size and for the `element` of async events).
    struct ibv_srq = "struct ibv_srq" {
        context: *mut ibv_context,
        srq_context: *mut c_void,
        pd: *mut ibv_pd,
        handle: u32,
        mutex: PthreadMutex,
        cond: PthreadCond,
        events_completed: u32,
    }

    /// `struct ibv_ah`.
    struct ibv_ah = "struct ibv_ah" {
        context: *mut ibv_context,
        pd: *mut ibv_pd,
        handle: u32,
    }

    /// `struct ibv_comp_channel`.
    struct ibv_comp_channel = "struct ibv_comp_channel" {
        context: *mut ibv_context,
        fd: c_int,
        refcnt: c_int,
    }

    /// The anonymous union of `struct ibv_wc` (`imm_data` / `invalidated_rkey`).
    #[derive(Clone, Copy)]
    union WcImm = "@anonymous" {
        imm_data: u32,
        invalidated_rkey: u32,
    }

    /// `struct ibv_wc`.
    #[derive(Clone, Copy)]
    struct ibv_wc = "struct ibv_wc" {
        wr_id: u64,
        status: c_uint,
        opcode: c_uint,
        vendor_err: u32,
        byte_len: u32,
        imm_data: WcImm,
        qp_num: u32,
        src_qp: u32,
        wc_flags: c_uint,
        pkey_index: u16,
        slid: u16,
        sl: u8,
        dlid_path_bits: u8,
    }

    /// `struct ibv_sge`.
    #[derive(Clone, Copy, Debug, Default)]
    struct ibv_sge = "struct ibv_sge" {
        addr: u64,
        length: u32,
        lkey: u32,
    }

    /// `ibv_send_wr.wr.rdma`.
    #[derive(Clone, Copy)]
    struct SendWrRdma = "__typeof__(((struct ibv_send_wr *)0)->wr.rdma)" {
        remote_addr: u64,
        rkey: u32,
    }

    /// `ibv_send_wr.wr.atomic`.
    #[derive(Clone, Copy)]
    struct SendWrAtomic = "__typeof__(((struct ibv_send_wr *)0)->wr.atomic)" {
        remote_addr: u64,
        compare_add: u64,
        swap: u64,
        rkey: u32,
    }

    /// `ibv_send_wr.wr.ud`.
    #[derive(Clone, Copy)]
    struct SendWrUd = "__typeof__(((struct ibv_send_wr *)0)->wr.ud)" {
        ah: *mut ibv_ah,
        remote_qpn: u32,
        remote_qkey: u32,
    }

    /// `ibv_send_wr.wr`.
    #[derive(Clone, Copy)]
    union SendWrOp = "__typeof__(((struct ibv_send_wr *)0)->wr)" {
        rdma: SendWrRdma,
        atomic: SendWrAtomic,
        ud: SendWrUd,
    }

    /// `ibv_send_wr.qp_type.xrc`.
    #[derive(Clone, Copy)]
    struct SendWrXrc = "__typeof__(((struct ibv_send_wr *)0)->qp_type.xrc)" {
        remote_srqn: u32,
    }

    /// `ibv_send_wr.qp_type`.
    #[derive(Clone, Copy)]
    union SendWrQpType = "__typeof__(((struct ibv_send_wr *)0)->qp_type)" {
        xrc: SendWrXrc,
    }

    /// `ibv_send_wr.bind_mw`.
    #[derive(Clone, Copy)]
    struct SendWrBindMw = "__typeof__(((struct ibv_send_wr *)0)->bind_mw)" {
        mw: *mut c_void,
        rkey: u32,
        bind_info: ibv_mw_bind_info,
    }

    /// `ibv_send_wr.tso`.
    #[derive(Clone, Copy)]
    struct SendWrTso = "__typeof__(((struct ibv_send_wr *)0)->tso)" {
        hdr: *mut c_void,
        hdr_sz: u16,
        mss: u16,
    }

    /// The anonymous union of `ibv_send_wr` holding `bind_mw` and `tso`.
    #[derive(Clone, Copy)]
    union SendWrExt = "@anonymous" {
        bind_mw: SendWrBindMw,
        tso: SendWrTso,
    }

    /// `struct ibv_send_wr`.
    struct ibv_send_wr = "struct ibv_send_wr" {
        wr_id: u64,
        next: *mut ibv_send_wr,
        sg_list: *mut ibv_sge,
        num_sge: c_int,
        opcode: c_uint,
        send_flags: c_uint,
        imm_data: u32,
        wr: SendWrOp,
        qp_type: SendWrQpType,
        bind_mw: SendWrExt,
    }

    /// `struct ibv_recv_wr`.
    struct ibv_recv_wr = "struct ibv_recv_wr" {
        wr_id: u64,
        next: *mut ibv_recv_wr,
        sg_list: *mut ibv_sge,
        num_sge: c_int,
    }

    /// `union ibv_gid.global`.
    #[derive(Clone, Copy)]
    struct GidGlobal = "__typeof__(((union ibv_gid *)0)->global)" {
        subnet_prefix: u64,
        interface_id: u64,
    }

    /// `union ibv_gid`.
    #[derive(Clone, Copy)]
    union ibv_gid = "union ibv_gid" {
        raw: [u8; 16],
        global: GidGlobal,
    }

    /// `struct ibv_global_route`.
    #[derive(Clone, Copy)]
    struct ibv_global_route = "struct ibv_global_route" {
        dgid: ibv_gid,
        flow_label: u32,
        sgid_index: u8,
        hop_limit: u8,
        traffic_class: u8,
    }

    /// `struct ibv_ah_attr`.
    #[derive(Clone, Copy)]
    struct ibv_ah_attr = "struct ibv_ah_attr" {
        grh: ibv_global_route,
        dlid: u16,
        sl: u8,
        src_path_bits: u8,
        static_rate: u8,
        is_global: u8,
        port_num: u8,
    }

    /// `struct ibv_qp_cap`.
    #[derive(Clone, Copy, Debug, Default)]
    struct ibv_qp_cap = "struct ibv_qp_cap" {
        max_send_wr: u32,
        max_recv_wr: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline_data: u32,
    }

    /// `struct ibv_qp_attr`.
    #[derive(Clone, Copy)]
    struct ibv_qp_attr = "struct ibv_qp_attr" {
        qp_state: c_uint,
        cur_qp_state: c_uint,
        path_mtu: c_uint,
        path_mig_state: c_uint,
        qkey: u32,
        rq_psn: u32,
        sq_psn: u32,
        dest_qp_num: u32,
        qp_access_flags: c_uint,
        cap: ibv_qp_cap,
        ah_attr: ibv_ah_attr,
        alt_ah_attr: ibv_ah_attr,
        pkey_index: u16,
        alt_pkey_index: u16,
        en_sqd_async_notify: u8,
        sq_draining: u8,
        max_rd_atomic: u8,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
        port_num: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        alt_port_num: u8,
        alt_timeout: u8,
        rate_limit: u32,
    }

    /// `struct ibv_qp_init_attr`.
    struct ibv_qp_init_attr = "struct ibv_qp_init_attr" {
        qp_context: *mut c_void,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut ibv_srq,
        cap: ibv_qp_cap,
        qp_type: c_uint,
        sq_sig_all: c_int,
    }

    /// `struct ibv_rx_hash_conf`.
    struct ibv_rx_hash_conf = "struct ibv_rx_hash_conf" {
        rx_hash_function: u8,
        rx_hash_key_len: u8,
        rx_hash_key: *mut u8,
        rx_hash_fields_mask: u64,
    }

    /// `struct ibv_qp_init_attr_ex`.
    struct ibv_qp_init_attr_ex = "struct ibv_qp_init_attr_ex" {
        qp_context: *mut c_void,
        send_cq: *mut ibv_cq,
        recv_cq: *mut ibv_cq,
        srq: *mut ibv_srq,
        cap: ibv_qp_cap,
        qp_type: c_uint,
        sq_sig_all: c_int,
        comp_mask: u32,
        pd: *mut ibv_pd,
        xrcd: *mut c_void,
        create_flags: u32,
        max_tso_header: u16,
        rwq_ind_tbl: *mut c_void,
        rx_hash_conf: ibv_rx_hash_conf,
        source_qpn: u32,
        send_ops_flags: u64,
    }

    /// `struct ibv_cq_init_attr_ex`.
    struct ibv_cq_init_attr_ex = "struct ibv_cq_init_attr_ex" {
        cqe: u32,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: u32,
        wc_flags: u64,
        comp_mask: u32,
        flags: u32,
        parent_domain: *mut ibv_pd,
    }

    /// `struct ibv_port_attr` (the header's current one, 52 bytes).
    #[derive(Clone, Copy, Default)]
    struct ibv_port_attr = "struct ibv_port_attr" {
        state: c_uint,
        max_mtu: c_uint,
        active_mtu: c_uint,
        gid_tbl_len: c_int,
        port_cap_flags: u32,
        max_msg_sz: u32,
        bad_pkey_cntr: u32,
        qkey_viol_cntr: u32,
        pkey_tbl_len: u16,
        lid: u16,
        sm_lid: u16,
        lmc: u8,
        max_vl_num: u8,
        sm_sl: u8,
        subnet_timeout: u8,
        init_type_reply: u8,
        active_width: u8,
        active_speed: u8,
        phys_state: u8,
        link_layer: u8,
        flags: u8,
        port_cap_flags2: u16,
    }

    /// `struct ibv_device_attr`.
    #[derive(Clone, Copy)]
    struct ibv_device_attr = "struct ibv_device_attr" {
        fw_ver: [c_char; 64],
        node_guid: u64,
        sys_image_guid: u64,
        max_mr_size: u64,
        page_size_cap: u64,
        vendor_id: u32,
        vendor_part_id: u32,
        hw_ver: u32,
        max_qp: c_int,
        max_qp_wr: c_int,
        device_cap_flags: c_uint,
        max_sge: c_int,
        max_sge_rd: c_int,
        max_cq: c_int,
        max_cqe: c_int,
        max_mr: c_int,
        max_pd: c_int,
        max_qp_rd_atom: c_int,
        max_ee_rd_atom: c_int,
        max_res_rd_atom: c_int,
        max_qp_init_rd_atom: c_int,
        max_ee_init_rd_atom: c_int,
        atomic_cap: c_uint,
        max_ee: c_int,
        max_rdd: c_int,
        max_mw: c_int,
        max_raw_ipv6_qp: c_int,
        max_raw_ethy_qp: c_int,
        max_mcast_grp: c_int,
        max_mcast_qp_attach: c_int,
        max_total_mcast_qp_attach: c_int,
        max_ah: c_int,
        max_fmr: c_int,
        max_map_per_fmr: c_int,
        max_srq: c_int,
        max_srq_wr: c_int,
        max_srq_sge: c_int,
        max_pkeys: u16,
        local_ca_ack_delay: u8,
        phys_port_cnt: u8,
    }

    /// `ibv_odp_caps.per_transport_caps`.
    #[derive(Clone, Copy)]
    struct OdpPerTransport = "__typeof__(((struct ibv_odp_caps *)0)->per_transport_caps)" {
        rc_odp_caps: u32,
        uc_odp_caps: u32,
        ud_odp_caps: u32,
    }

    /// `struct ibv_odp_caps`.
    #[derive(Clone, Copy)]
    struct ibv_odp_caps = "struct ibv_odp_caps" {
        general_caps: u64,
        per_transport_caps: OdpPerTransport,
    }

    /// `struct ibv_tso_caps`.
    #[derive(Clone, Copy)]
    struct ibv_tso_caps = "struct ibv_tso_caps" {
        max_tso: u32,
        supported_qpts: u32,
    }

    /// `struct ibv_rss_caps`.
    #[derive(Clone, Copy)]
    struct ibv_rss_caps = "struct ibv_rss_caps" {
        supported_qpts: u32,
        max_rwq_indirection_tables: u32,
        max_rwq_indirection_table_size: u32,
        rx_hash_fields_mask: u64,
        rx_hash_function: u8,
    }

    /// `struct ibv_packet_pacing_caps`.
    #[derive(Clone, Copy)]
    struct ibv_packet_pacing_caps = "struct ibv_packet_pacing_caps" {
        qp_rate_limit_min: u32,
        qp_rate_limit_max: u32,
        supported_qpts: u32,
    }

    /// `struct ibv_tm_caps`.
    #[derive(Clone, Copy)]
    struct ibv_tm_caps = "struct ibv_tm_caps" {
        max_rndv_hdr_size: u32,
        max_num_tags: u32,
        flags: u32,
        max_ops: u32,
        max_sge: u32,
    }

    /// `struct ibv_cq_moderation_caps`.
    #[derive(Clone, Copy)]
    struct ibv_cq_moderation_caps = "struct ibv_cq_moderation_caps" {
        max_cq_count: u16,
        max_cq_period: u16,
    }

    /// `struct ibv_pci_atomic_caps`.
    #[derive(Clone, Copy)]
    struct ibv_pci_atomic_caps = "struct ibv_pci_atomic_caps" {
        fetch_add: u16,
        swap: u16,
        compare_swap: u16,
    }

    /// `struct ibv_device_attr_ex`.
    #[derive(Clone, Copy)]
    struct ibv_device_attr_ex = "struct ibv_device_attr_ex" {
        orig_attr: ibv_device_attr,
        comp_mask: u32,
        odp_caps: ibv_odp_caps,
        completion_timestamp_mask: u64,
        hca_core_clock: u64,
        device_cap_flags_ex: u64,
        tso_caps: ibv_tso_caps,
        rss_caps: ibv_rss_caps,
        max_wq_type_rq: u32,
        packet_pacing_caps: ibv_packet_pacing_caps,
        raw_packet_caps: u32,
        tm_caps: ibv_tm_caps,
        cq_mod_caps: ibv_cq_moderation_caps,
        max_dm_size: u64,
        pci_atomic_caps: ibv_pci_atomic_caps,
        xrc_odp_caps: u32,
        phys_port_cnt_ex: u32,
    }

    /// `struct ibv_gid_entry`.
    #[derive(Clone, Copy)]
    struct ibv_gid_entry = "struct ibv_gid_entry" {
        gid: ibv_gid,
        gid_index: u32,
        port_num: u32,
        gid_type: u32,
        ndev_ifindex: u32,
    }

    /// `ibv_async_event.element`.
    #[derive(Clone, Copy)]
    union AsyncElement = "__typeof__(((struct ibv_async_event *)0)->element)" {
        cq: *mut ibv_cq,
        qp: *mut ibv_qp,
        srq: *mut ibv_srq,
        wq: *mut c_void,
        port_num: c_int,
    }

    /// `struct ibv_async_event`.
    #[derive(Clone, Copy)]
    struct ibv_async_event = "struct ibv_async_event" {
        element: AsyncElement,
        event_type: c_uint,
    }

    /// `struct ibv_mw_bind_info`.
    #[derive(Clone, Copy)]
    struct ibv_mw_bind_info = "struct ibv_mw_bind_info" {
        mr: *mut ibv_mr,
        addr: u64,
        length: u64,
        mw_access_flags: c_uint,
    }

    /// `struct ibv_data_buf`.
    struct ibv_data_buf = "struct ibv_data_buf" {
        addr: *mut c_void,
        length: usize,
    }

    /// `struct ibv_poll_cq_attr`.
    struct ibv_poll_cq_attr = "struct ibv_poll_cq_attr" {
        comp_mask: u32,
    }

    /// `struct ibv_query_device_ex_input`.
    struct ibv_query_device_ex_input = "struct ibv_query_device_ex_input" {
        comp_mask: u32,
    }

    /// `struct ibv_srq_attr`.
    struct ibv_srq_attr = "struct ibv_srq_attr" {
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    }

    /// `struct ibv_srq_init_attr`.
    struct ibv_srq_init_attr = "struct ibv_srq_init_attr" {
        srq_context: *mut c_void,
        attr: ibv_srq_attr,
    }

    /// `struct ib_uverbs_global_route` (`<rdma/ib_user_verbs.h>`), for the
    /// `ibv_copy_*_from_kern` helpers librdmacm calls.
    #[derive(Clone, Copy)]
    struct ib_uverbs_global_route = "struct ib_uverbs_global_route" {
        dgid: [u8; 16],
        flow_label: u32,
        sgid_index: u8,
        hop_limit: u8,
        traffic_class: u8,
        reserved: u8,
    }

    /// `struct ib_uverbs_ah_attr`.
    #[derive(Clone, Copy)]
    struct ib_uverbs_ah_attr = "struct ib_uverbs_ah_attr" {
        grh: ib_uverbs_global_route,
        dlid: u16,
        sl: u8,
        src_path_bits: u8,
        static_rate: u8,
        is_global: u8,
        port_num: u8,
        reserved: u8,
    }

    /// `struct ib_uverbs_qp_attr`.
    struct ib_uverbs_qp_attr = "struct ib_uverbs_qp_attr" {
        qp_attr_mask: u32,
        qp_state: u32,
        cur_qp_state: u32,
        path_mtu: u32,
        path_mig_state: u32,
        qkey: u32,
        rq_psn: u32,
        sq_psn: u32,
        dest_qp_num: u32,
        qp_access_flags: u32,
        ah_attr: ib_uverbs_ah_attr,
        alt_ah_attr: ib_uverbs_ah_attr,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline_data: u32,
        pkey_index: u16,
        alt_pkey_index: u16,
        en_sqd_async_notify: u8,
        sq_draining: u8,
        max_rd_atomic: u8,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
        port_num: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        alt_port_num: u8,
        alt_timeout: u8,
        reserved: [u8; 5],
    }

    /// `struct ib_user_path_rec` (`<rdma/ib_user_sa.h>`).
    struct ib_user_path_rec = "struct ib_user_path_rec" {
        dgid: [u8; 16],
        sgid: [u8; 16],
        dlid: u16,
        slid: u16,
        raw_traffic: u32,
        flow_label: u32,
        reversible: u32,
        mtu: u32,
        pkey: u16,
        hop_limit: u8,
        traffic_class: u8,
        numb_path: u8,
        sl: u8,
        mtu_selector: u8,
        rate_selector: u8,
        rate: u8,
        packet_life_time_selector: u8,
        packet_life_time: u8,
        preference: u8,
    }

    /// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
    struct ibv_sa_path_rec = "struct ibv_sa_path_rec" {
        dgid: ibv_gid,
        sgid: ibv_gid,
        dlid: u16,
        slid: u16,
        raw_traffic: c_int,
        flow_label: u32,
        hop_limit: u8,
        traffic_class: u8,
        reversible: c_int,
        numb_path: u8,
        pkey: u16,
        sl: u8,
        mtu_selector: u8,
        mtu: u8,
        rate_selector: u8,
        rate: u8,
        packet_life_time_selector: u8,
        packet_life_time: u8,
        preference: u8,
    }
}

/// A C structure the library shares with applications: the C part is
/// mutated by both sides (applications write `ibv_qp_ex.wr_id` before each
/// `ibv_wr_*` call), so Rust reaches it only through the cell's raw pointer.
#[repr(transparent)]
pub struct Shared<T>(pub UnsafeCell<T>);

// SAFETY: a `Shared<T>` is only read or written through its raw pointer by
// the thread that is inside a verbs call on the object; the verbs API makes
// concurrent calls on one object the application's responsibility (as
// rdma-core does), and every Rust-side state beside it is behind a lock.
unsafe impl<T> Sync for Shared<T> {}
// SAFETY: the C structs hold raw pointers to objects that live until their
// destroy call, which any thread may make.
unsafe impl<T> Send for Shared<T> {}

impl<T> Shared<T> {
    /// Wrap `value`.
    pub const fn new(value: T) -> Shared<T> {
        Shared(UnsafeCell::new(value))
    }

    /// The C structure's address.
    pub const fn get(&self) -> *mut T {
        self.0.get()
    }

    /// Run `f` on the C structure.
    ///
    /// # Safety
    ///
    /// During the call no other reference to the structure is live and no
    /// other thread writes it (the verbs API leaves concurrent calls on one
    /// object to the application, as rdma-core does).
    pub unsafe fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: the caller's guarantee above.
        f(unsafe { &mut *self.0.get() })
    }
}

impl<T> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared({:p})", self.0.get())
    }
}

/// A zeroed C structure (all of these are plain data for which all-zero
/// bytes are valid: integers, raw pointers, `Option` of function pointers).
pub fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `Zeroable` is implemented only for the plain-data C structs
    // above, for which the all-zero bit pattern is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Types whose all-zero bytes are a valid value.
///
/// # Safety
///
/// Implement only for `#[repr(C)]` plain data: integers, raw pointers,
/// `Option<fn>`, arrays and unions of those.
pub unsafe trait Zeroable {}

macro_rules! zeroable {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: plain C data: integers, raw pointers and nullable function
        // pointers only (see the declarations above).
        unsafe impl Zeroable for $t {}
    )* };
}

zeroable!(
    ibv_device,
    ibv_context,
    verbs_context,
    ibv_pd,
    ibv_mr,
    ibv_cq,
    ibv_cq_ex,
    ibv_qp,
    ibv_qp_ex,
    ibv_ah,
    ibv_comp_channel,
    ibv_wc,
    ibv_port_attr,
    ibv_device_attr,
    ibv_device_attr_ex,
    ibv_qp_attr,
    ibv_qp_init_attr,
    ibv_ah_attr,
    ibv_gid_entry,
    ibv_async_event,
    ib_uverbs_qp_attr,
    ib_uverbs_ah_attr,
    ib_user_path_rec,
    ibv_sa_path_rec,
    ibv_send_wr,
    ibv_recv_wr,
);

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context.abi_compat` of a context that is
/// a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// Offset of `context` in `verbs_context`.
pub const VERBS_CONTEXT_OFFSET: usize = std::mem::offset_of!(verbs_context, context);

// enum ibv_node_type / ibv_transport_type
/// `IBV_NODE_CA`.
pub const IBV_NODE_CA: c_int = 1;
/// `IBV_TRANSPORT_IB`.
pub const IBV_TRANSPORT_IB: c_int = 0;

// enum ibv_qp_type
/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: c_uint = 2;
/// `IBV_QPT_UC`.
pub const IBV_QPT_UC: c_uint = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: c_uint = 4;

// enum ibv_port_state
/// `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: c_uint = 4;
// enum ibv_link_layer
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_CM_SUP`.
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;
/// `IBV_PORT_IP_BASED_GIDS`.
pub const IBV_PORT_IP_BASED_GIDS: u32 = 1 << 26;

// enum ibv_device_cap_flags
/// `IBV_DEVICE_SYS_IMAGE_GUID`.
pub const IBV_DEVICE_SYS_IMAGE_GUID: c_uint = 1 << 11;
/// `IBV_DEVICE_RC_RNR_NAK_GEN`.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;

// enum ibv_gid_type
/// `IBV_GID_TYPE_ROCE_V1`.
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
// enum ibv_gid_type_sysfs (rdma-core's driver.h)
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1`.
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: c_uint = 0;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_uint = 1;

// enum ibv_wr_opcode
/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
/// `IBV_WR_SEND`.
pub const IBV_WR_SEND: c_uint = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: c_uint = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
/// `IBV_WR_SEND_WITH_INV`.
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;

// enum ibv_send_flags
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
/// The send flags rnic carries (`FENCE | SIGNALED | SOLICITED | INLINE`);
/// `IBV_SEND_IP_CSUM` (raw packet QPs only) is not among them.
pub const IBV_SEND_KNOWN: c_uint = 0xf;

// enum ibv_wc_flags
/// `IBV_WC_GRH`.
pub const IBV_WC_GRH: c_uint = 1;
/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
/// `IBV_WC_WITH_INV`.
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

// enum ibv_qp_init_attr_mask
/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

// enum ibv_qp_create_send_ops_flags
/// `IBV_QP_EX_WITH_RDMA_WRITE`.
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
/// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`.
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
/// `IBV_QP_EX_WITH_SEND`.
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
/// `IBV_QP_EX_WITH_SEND_WITH_IMM`.
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
/// `IBV_QP_EX_WITH_RDMA_READ`.
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
/// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`.
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
/// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`.
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
/// `IBV_QP_EX_WITH_SEND_WITH_INV`.
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
/// The `ibv_wr_*` operations rnic carries.
pub const IBV_QP_EX_SUPPORTED: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_SEND_WITH_INV;

// enum ibv_qp_attr_mask
/// `IBV_QP_STATE`.
pub const IBV_QP_STATE: c_int = 1 << 0;
/// `IBV_QP_AV`.
pub const IBV_QP_AV: c_int = 1 << 7;
/// `IBV_QP_CAP`.
pub const IBV_QP_CAP: c_int = 1 << 19;
/// The `ibv_qp_attr_mask` bits 0..=20, which rnic's `QpAttrMask` carries
/// with the same values.
pub const IBV_QP_ATTR_MASK_KNOWN: c_int = (1 << 21) - 1;
/// `IBV_QP_RATE_LIMIT`.
pub const IBV_QP_RATE_LIMIT: c_int = 1 << 25;

// enum ibv_access_flags
/// The access bits rnic carries (`LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ |
/// REMOTE_ATOMIC`).
pub const IBV_ACCESS_RNIC: c_uint = 0xf;
/// `IBV_ACCESS_ZERO_BASED`.
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
/// `IBV_ACCESS_ON_DEMAND`.
pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
/// `IBV_ACCESS_HUGETLB`: a hint about the memory, nothing to do.
pub const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_RANGE` (`0x3ff00000`): best-effort flags a device
/// may ignore (`IBV_ACCESS_RELAXED_ORDERING` is the first).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;

// enum ibv_cq_init_attr_mask / ibv_create_cq_wc_flags
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
/// The `wc_flags` an `ibv_cq_ex` of this library can read
/// (`IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits).
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;

// enum ibv_event_type
/// `IBV_EVENT_QP_FATAL`.
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
/// `IBV_EVENT_PORT_ACTIVE`.
pub const IBV_EVENT_PORT_ACTIVE: c_uint = 9;
/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_uint = 15;
/// `IBV_EVENT_QP_LAST_WQE_REACHED`.
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_uint = 16;

// enum ibv_fork_status
/// `IBV_FORK_UNNEEDED`.
pub const IBV_FORK_UNNEEDED: c_uint = 2;

/// `IBV_WC_RECV` (the receive bit of `ibv_wc_opcode`).
pub const IBV_WC_RECV: c_uint = 1 << 7;
