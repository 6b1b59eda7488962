//! The ABI check: every structure of [`crate::abi`] against the C compiler's
//! view of the system's `<infiniband/verbs.h>` (`libibverbs-dev`).
//!
//! A C program is generated from `abi::LAYOUTS` (so a structure added there
//! is checked without touching this file), compiled with `cc` and run; its
//! `sizeof`/`alignof`/`offsetof` lines must equal Rust's for every type and
//! every field. The members of the header's anonymous unions, which have no
//! type to name, are checked as members of their parent.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::process::Command;

use crate::abi::{self, SendWrTso, ibv_send_wr, ibv_wc};

/// The C spelling of a field (Rust cannot name one `priv`).
fn c_field(rust: &str) -> &str {
    rust.strip_suffix('_').unwrap_or(rust)
}

/// `(C type, field path, Rust offset, Rust size)` of the anonymous unions'
/// other members.
fn anonymous_members() -> Vec<(&'static str, &'static str, usize, usize)> {
    vec![
        (
            "struct ibv_wc",
            "invalidated_rkey",
            offset_of!(ibv_wc, imm_data),
            4,
        ),
        (
            "struct ibv_send_wr",
            "invalidate_rkey",
            offset_of!(ibv_send_wr, imm_data),
            4,
        ),
        (
            "struct ibv_send_wr",
            "tso",
            offset_of!(ibv_send_wr, bind_mw),
            size_of::<SendWrTso>(),
        ),
        (
            "struct ibv_send_wr",
            "tso.mss",
            offset_of!(ibv_send_wr, bind_mw) + offset_of!(SendWrTso, mss),
            2,
        ),
        (
            "struct ibv_send_wr",
            "bind_mw.bind_info.mw_access_flags",
            120,
            4,
        ),
    ]
}

/// The program, and the lines Rust expects it to print.
fn program() -> (String, Vec<String>) {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n\
         #include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n\
         #include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n\
         #define M(T, f) printf(\"%s.%s %zu %zu\\n\", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))\n\
         int main(void) {\n",
    );
    let mut want = Vec::new();
    for l in abi::LAYOUTS {
        if l.c.starts_with('@') {
            continue;
        }
        let _ = writeln!(
            c,
            "  printf(\"%s %zu %zu\\n\", \"{}\", sizeof({}), alignof({}));",
            l.rust, l.c, l.c
        );
        want.push(format!("{} {} {}", l.rust, l.size, l.align));
        for (name, off, size) in l.fields {
            let _ = writeln!(
                c,
                "  printf(\"%s.%s %zu %zu\\n\", \"{}\", \"{}\", offsetof({}, {}), sizeof((({} *)0)->{}));",
                l.rust,
                name,
                l.c,
                c_field(name),
                l.c,
                c_field(name)
            );
            want.push(format!("{}.{} {} {}", l.rust, name, off, size));
        }
    }
    for (ty, path, off, size) in anonymous_members() {
        let _ = writeln!(c, "  M({ty}, {path});");
        want.push(format!("{ty}.{path} {off} {size}"));
    }
    c.push_str("  return 0;\n}\n");
    (c, want)
}

#[test]
fn every_structure_matches_the_system_header() {
    let (src, want) = program();
    let dir = std::env::temp_dir().join(format!("rnic-verbs-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, &src).expect("write the C program");
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("run cc (scripts/test.sh installs gcc and libibverbs-dev)");
    assert!(
        out.status.success(),
        "cc failed (is libibverbs-dev installed? scripts/test.sh installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success());
    let got: Vec<String> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got.len(), want.len(), "one line per type and field");
    let mismatches: Vec<String> = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g != w)
        .map(|(g, w)| format!("C: {g:<60} Rust: {w}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layouts differ:\n{}",
        mismatches.join("\n")
    );
    // The numbers the header's inline functions depend on, named.
    assert_eq!(size_of::<abi::verbs_context>(), 648);
    assert_eq!(abi::VERBS_CONTEXT_OFFSET, 320);
    assert_eq!(
        offset_of!(abi::ibv_context, ops) + offset_of!(abi::ibv_context_ops, post_send),
        208
    );
    assert_eq!(offset_of!(abi::ibv_qp_ex, wr_id), 168);
    assert!(abi::LAYOUTS.len() >= 50, "{} types", abi::LAYOUTS.len());
    let _ = std::fs::remove_dir_all(&dir);
}
