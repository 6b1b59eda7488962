//! The export table: every symbol of Debian's `libibverbs.so.1` (rdma-core
//! 44), bound to its version node.
//!
//! `libibverbs.map` (the version script, passed to the linker by
//! `build.rs`) declares the 13 version nodes; each entry here defines one
//! versioned symbol with `.symver`: `name@@NODE` is the default version a
//! program links against, `name@NODE` a compatibility version only old
//! binaries name. The implementations are ordinary, unexported Rust
//! functions: a trampoline `__rnicv_<name>_<kind>` jumps to them, and
//! the version script's `local: *` hides everything but the versioned
//! names. So the library exports exactly the 180 `name@version` entries of
//! the real one (`tests/exports.rs` compares them), and the linker refuses
//! to link if a name of the script has no definition here.
//!
//! The table is left out of unit-test builds (a test executable has no
//! version script to give the versions meaning).

#[cfg(not(test))]
use crate::{context, cq, device, misc, pd, qp, srq, unsupported};

// `verbs_allow_disassociate_destroy` (`int`, IBVERBS_PRIVATE_34): whether
// destroy calls succeed after a device disassociated. rnic devices never
// disassociate; 0, as rdma-core has it unless RDMAV_ALLOW_DISASSOC_DESTROY.
#[cfg(not(test))]
core::arch::global_asm!(
    ".pushsection .data.rnicv_allow_disassociate_destroy,\"aw\",@progbits",
    ".balign 4",
    ".globl __rnicv_verbs_allow_disassociate_destroy",
    ".type __rnicv_verbs_allow_disassociate_destroy,@object",
    ".size __rnicv_verbs_allow_disassociate_destroy,4",
    "__rnicv_verbs_allow_disassociate_destroy: .long 0",
    ".popsection",
    ".symver __rnicv_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34",
);

/// One `global_asm!` per exported symbol: a two-byte trampoline (`jmp` to
/// the implementation, in the same object as its `.symver`, which the
/// assembler needs to bind a default version), versioned with `.symver`.
macro_rules! exports {
    ($($name:ident $node:literal $kind:ident => $f:path;)*) => { $(
        #[cfg(not(test))]
        core::arch::global_asm!(
            concat!(".pushsection .text.__rnicv_", stringify!($name), "_", stringify!($kind), ",\"ax\",@progbits"),
            concat!(".globl __rnicv_", stringify!($name), "_", stringify!($kind)),
            concat!(".type __rnicv_", stringify!($name), "_", stringify!($kind), ",@function"),
            concat!("__rnicv_", stringify!($name), "_", stringify!($kind), ":"),
            "jmp {f}",
            concat!(".size __rnicv_", stringify!($name), "_", stringify!($kind), ", . - __rnicv_", stringify!($name), "_", stringify!($kind)),
            ".popsection",
            concat!(
                ".symver __rnicv_", stringify!($name), "_", stringify!($kind), ", ",
                stringify!($name), exports!(@at $kind), $node
            ),
            f = sym $f,
        );
    )* };
    (@at default) => { "@@" };
    (@at compat) => { "@" };
}

exports! {
    // IBVERBS_1.0
    ibv_ack_async_event "IBVERBS_1.0" compat => unsupported::compat_void;
    ibv_ack_cq_events "IBVERBS_1.0" compat => unsupported::compat_void;
    ibv_alloc_pd "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_attach_mcast "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_close_device "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_copy_path_rec_from_kern "IBVERBS_1.0" default => misc::ibv_copy_path_rec_from_kern;
    ibv_copy_path_rec_to_kern "IBVERBS_1.0" default => misc::ibv_copy_path_rec_to_kern;
    ibv_copy_qp_attr_from_kern "IBVERBS_1.0" default => misc::ibv_copy_qp_attr_from_kern;
    ibv_create_ah "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_create_comp_channel "IBVERBS_1.0" default => cq::ibv_create_comp_channel;
    ibv_create_cq "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_create_qp "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_create_srq "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_dealloc_pd "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_dereg_mr "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_destroy_ah "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_destroy_comp_channel "IBVERBS_1.0" default => cq::ibv_destroy_comp_channel;
    ibv_destroy_cq "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_destroy_qp "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_destroy_srq "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_detach_mcast "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_free_device_list "IBVERBS_1.0" compat => unsupported::compat_void;
    ibv_get_async_event "IBVERBS_1.0" compat => unsupported::compat_neg;
    ibv_get_cq_event "IBVERBS_1.0" compat => unsupported::compat_neg;
    ibv_get_device_guid "IBVERBS_1.0" compat => unsupported::compat_guid;
    ibv_get_device_list "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_get_device_name "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_get_sysfs_path "IBVERBS_1.0" default => device::ibv_get_sysfs_path;
    ibv_modify_qp "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_modify_srq "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_open_device "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_query_device "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_query_gid "IBVERBS_1.0" compat => unsupported::compat_neg;
    ibv_query_pkey "IBVERBS_1.0" compat => unsupported::compat_neg;
    ibv_query_port "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_query_qp "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_query_srq "IBVERBS_1.0" compat => unsupported::compat_errno;
    ibv_rate_to_mult "IBVERBS_1.0" default => misc::ibv_rate_to_mult;
    ibv_read_sysfs_file "IBVERBS_1.0" default => device::ibv_read_sysfs_file;
    ibv_reg_mr "IBVERBS_1.0" compat => unsupported::compat_null;
    ibv_resize_cq "IBVERBS_1.0" compat => unsupported::compat_errno;
    mult_to_ibv_rate "IBVERBS_1.0" default => misc::mult_to_ibv_rate;
    // IBVERBS_1.1
    ibv_ack_async_event "IBVERBS_1.1" default => context::ibv_ack_async_event;
    ibv_ack_cq_events "IBVERBS_1.1" default => cq::ibv_ack_cq_events;
    ibv_alloc_pd "IBVERBS_1.1" default => pd::ibv_alloc_pd;
    ibv_attach_mcast "IBVERBS_1.1" default => unsupported::ibv_attach_mcast;
    ibv_close_device "IBVERBS_1.1" default => context::ibv_close_device;
    ibv_copy_ah_attr_from_kern "IBVERBS_1.1" default => misc::ibv_copy_ah_attr_from_kern;
    ibv_create_ah "IBVERBS_1.1" default => pd::ibv_create_ah;
    ibv_create_ah_from_wc "IBVERBS_1.1" default => pd::ibv_create_ah_from_wc;
    ibv_create_cq "IBVERBS_1.1" default => cq::ibv_create_cq;
    ibv_create_qp "IBVERBS_1.1" default => qp::ibv_create_qp;
    ibv_create_srq "IBVERBS_1.1" default => srq::ibv_create_srq;
    ibv_dealloc_pd "IBVERBS_1.1" default => pd::ibv_dealloc_pd;
    ibv_dereg_mr "IBVERBS_1.1" default => pd::ibv_dereg_mr;
    ibv_destroy_ah "IBVERBS_1.1" default => pd::ibv_destroy_ah;
    ibv_destroy_cq "IBVERBS_1.1" default => cq::ibv_destroy_cq;
    ibv_destroy_qp "IBVERBS_1.1" default => qp::ibv_destroy_qp;
    ibv_destroy_srq "IBVERBS_1.1" default => srq::ibv_destroy_srq;
    ibv_detach_mcast "IBVERBS_1.1" default => unsupported::ibv_detach_mcast;
    ibv_dofork_range "IBVERBS_1.1" default => misc::ibv_dofork_range;
    ibv_dontfork_range "IBVERBS_1.1" default => misc::ibv_dontfork_range;
    ibv_event_type_str "IBVERBS_1.1" default => misc::ibv_event_type_str;
    ibv_fork_init "IBVERBS_1.1" default => misc::ibv_fork_init;
    ibv_free_device_list "IBVERBS_1.1" default => device::ibv_free_device_list;
    ibv_get_async_event "IBVERBS_1.1" default => context::ibv_get_async_event;
    ibv_get_cq_event "IBVERBS_1.1" default => cq::ibv_get_cq_event;
    ibv_get_device_guid "IBVERBS_1.1" default => device::ibv_get_device_guid;
    ibv_get_device_list "IBVERBS_1.1" default => device::ibv_get_device_list;
    ibv_get_device_name "IBVERBS_1.1" default => device::ibv_get_device_name;
    ibv_init_ah_from_wc "IBVERBS_1.1" default => pd::ibv_init_ah_from_wc;
    ibv_modify_qp "IBVERBS_1.1" default => qp::ibv_modify_qp;
    ibv_modify_srq "IBVERBS_1.1" default => srq::ibv_modify_srq;
    ibv_node_type_str "IBVERBS_1.1" default => misc::ibv_node_type_str;
    ibv_open_device "IBVERBS_1.1" default => context::ibv_open_device;
    ibv_port_state_str "IBVERBS_1.1" default => misc::ibv_port_state_str;
    ibv_query_device "IBVERBS_1.1" default => context::ibv_query_device;
    ibv_query_gid "IBVERBS_1.1" default => context::ibv_query_gid;
    ibv_query_pkey "IBVERBS_1.1" default => context::ibv_query_pkey;
    ibv_query_port "IBVERBS_1.1" default => context::ibv_query_port;
    ibv_query_qp "IBVERBS_1.1" default => qp::ibv_query_qp;
    ibv_query_srq "IBVERBS_1.1" default => srq::ibv_query_srq;
    ibv_rate_to_mbps "IBVERBS_1.1" default => misc::ibv_rate_to_mbps;
    ibv_reg_mr "IBVERBS_1.1" default => pd::ibv_reg_mr;
    ibv_register_driver "IBVERBS_1.1" compat => unsupported::ibv_register_driver;
    ibv_rereg_mr "IBVERBS_1.1" default => pd::ibv_rereg_mr;
    ibv_resize_cq "IBVERBS_1.1" default => cq::ibv_resize_cq;
    ibv_resolve_eth_l2_from_gid "IBVERBS_1.1" default => unsupported::ibv_resolve_eth_l2_from_gid;
    ibv_wc_status_str "IBVERBS_1.1" default => misc::ibv_wc_status_str;
    mbps_to_ibv_rate "IBVERBS_1.1" default => misc::mbps_to_ibv_rate;
    // IBVERBS_1.5
    ibv_get_pkey_index "IBVERBS_1.5" default => context::ibv_get_pkey_index;
    // IBVERBS_1.6
    ibv_qp_to_qp_ex "IBVERBS_1.6" default => qp::ibv_qp_to_qp_ex;
    // IBVERBS_1.7
    ibv_reg_mr_iova "IBVERBS_1.7" default => pd::ibv_reg_mr_iova;
    // IBVERBS_1.8
    ibv_reg_mr_iova2 "IBVERBS_1.8" default => pd::ibv_reg_mr_iova2;
    // IBVERBS_1.9
    ibv_get_device_index "IBVERBS_1.9" default => device::ibv_get_device_index;
    // IBVERBS_1.10
    ibv_import_device "IBVERBS_1.10" default => unsupported::ibv_import_device;
    ibv_import_mr "IBVERBS_1.10" default => unsupported::ibv_import_mr;
    ibv_import_pd "IBVERBS_1.10" default => unsupported::ibv_import_pd;
    ibv_query_ece "IBVERBS_1.10" default => unsupported::ibv_query_ece;
    ibv_set_ece "IBVERBS_1.10" default => unsupported::ibv_set_ece;
    ibv_unimport_mr "IBVERBS_1.10" default => unsupported::ibv_unimport_mr;
    ibv_unimport_pd "IBVERBS_1.10" default => unsupported::ibv_unimport_pd;
    // IBVERBS_1.11
    _ibv_query_gid_ex "IBVERBS_1.11" default => context::_ibv_query_gid_ex;
    _ibv_query_gid_table "IBVERBS_1.11" default => context::_ibv_query_gid_table;
    // IBVERBS_1.12
    ibv_reg_dmabuf_mr "IBVERBS_1.12" default => unsupported::ibv_reg_dmabuf_mr;
    // IBVERBS_1.13
    ibv_import_dm "IBVERBS_1.13" default => unsupported::ibv_import_dm;
    ibv_is_fork_initialized "IBVERBS_1.13" default => misc::ibv_is_fork_initialized;
    ibv_unimport_dm "IBVERBS_1.13" default => unsupported::ibv_unimport_dm;
    // IBVERBS_1.14
    ibv_query_qp_data_in_order "IBVERBS_1.14" default => unsupported::ibv_query_qp_data_in_order;
    // IBVERBS_PRIVATE_34
    __ioctl_final_num_attrs "IBVERBS_PRIVATE_34" default => unsupported::ioctl_final_num_attrs;
    __verbs_log "IBVERBS_PRIVATE_34" default => unsupported::verbs_log;
    _verbs_init_and_alloc_context "IBVERBS_PRIVATE_34" default => unsupported::verbs_init_and_alloc_context;
    execute_ioctl "IBVERBS_PRIVATE_34" default => unsupported::execute_ioctl;
    ibv_cmd_advise_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_alloc_dm "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_alloc_mw "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_alloc_pd "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_attach_mcast "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_close_xrcd "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_ah "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_counters "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_cq_ex "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_flow "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_flow_action_esp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_qp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_qp_ex "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_qp_ex2 "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_rwq_ind_table "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_srq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_srq_ex "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_create_wq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_dealloc_mw "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_dealloc_pd "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_dereg_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_ah "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_counters "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_flow "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_flow_action "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_qp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_rwq_ind_table "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_srq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_destroy_wq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_detach_mcast "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_free_dm "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_get_context "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_flow_action_esp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_qp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_qp_ex "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_srq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_modify_wq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_open_qp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_open_xrcd "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_poll_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_post_recv "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_post_send "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_post_srq_recv "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_context "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_device_any "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_port "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_qp "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_query_srq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_read_counters "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_reg_dm_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_reg_dmabuf_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_reg_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_req_notify_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_rereg_mr "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_cmd_resize_cq "IBVERBS_PRIVATE_34" default => unsupported::cmd_enosys;
    ibv_query_gid_type "IBVERBS_PRIVATE_34" default => context::ibv_query_gid_type;
    ibv_read_ibdev_sysfs_file "IBVERBS_PRIVATE_34" default => unsupported::ibv_read_ibdev_sysfs_file;
    verbs_init_cq "IBVERBS_PRIVATE_34" default => unsupported::verbs_init_cq;
    verbs_open_device "IBVERBS_PRIVATE_34" default => unsupported::verbs_open_device;
    verbs_register_driver_34 "IBVERBS_PRIVATE_34" default => unsupported::verbs_register_driver;
    verbs_set_ops "IBVERBS_PRIVATE_34" default => unsupported::provider_noop;
    verbs_uninit_context "IBVERBS_PRIVATE_34" default => unsupported::provider_noop;
}
