//! A C program written against the system `<infiniband/verbs.h>` and linked
//! with `-libverbs`, run on the drop-in (`tests/c/verbs_check.c`): RDMA
//! write, read and both atomics checked byte for byte, send with immediate
//! into a receive, a completion channel's fd woken by poll(2) and read with
//! ibv_get_cq_event (and EAGAIN when non-blocking), inline data from
//! unregistered memory through the ibv_wr_* API, the errors of unsupported
//! verbs and bad input (EOPNOTSUPP, EFAULT, EINVAL, EBUSY, bad_wr), and that
//! ibv_dereg_mr revokes remote access to a region a QP still retained,
//! shared receive queues (order, the limit event, LAST_WQE_REACHED, no flush).
//! On rxe's `rnic_lo` and on an emulated mlx5 function (rnic-mlx5-emu).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

/// The C program, built once per test binary.
fn verbs_check() -> &'static std::path::Path {
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/verbs_check.c");
        let exe = common::lib_dir().join("verbs_check");
        let cc = Command::new("cc")
            .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .expect("cc (scripts/test.sh installs gcc and libibverbs-dev)");
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        exe
    })
}

#[test]
fn a_c_program_gets_what_libibverbs_promises() {
    check(&mut common::verbs_cmd(verbs_check()));
}

/// The same program on an emulated mlx5 function (rnic-mlx5-emu): the two
/// RC QPs of one context talk through the function's own RoCE port, the
/// buffers registered in place (big-endian atomics), the completion channel
/// woken through the CQ's eventfd.
#[test]
fn the_c_program_on_an_emulated_mlx5_function() {
    let (_emu, spec) = common::Emulator::start("semantics", "127.0.0.35");
    let mut c = common::verbs_cmd(verbs_check());
    c.env("RNIC_DEVICES", spec).arg("rnic_mlx5");
    check(&mut c);
}

fn check(c: &mut Command) {
    let child = c
        .env("RNIC_VERBS_QUIET", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output(child, Duration::from_secs(120), "verbs_check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "ok device, port and GID queries",
        "ok RDMA write",
        "ok RDMA read",
        "ok atomics",
        "ok send with immediate, completion channel",
        "ok inline data and the ibv_wr_* API",
        "ok errors of unsupported verbs and bad input",
        "ok shared receive queue",
        "ok deregistration revokes remote access",
        "ok teardown",
    ] {
        assert!(text.lines().any(|l| l == step), "missing {step:?}:\n{text}");
    }
}
