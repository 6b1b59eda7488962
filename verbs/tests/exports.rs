//! The export set: the built library must export exactly the `name@version`
//! symbols of Debian's `libibverbs.so.1` (rdma-core 44), under its soname,
//! and the stock tools must load against it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const SYSTEM: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// The defined `name@version` / `name@@version` symbols of `lib`'s
/// `.dynsym` (version-node `ABS` markers left out: GNU ld emits them, the
/// LLVM linker rust uses does not, and no loader reads them).
fn exports(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(lib)
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success(), "readelf {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() == 8 && c[6] != "UND" && c[6] != "ABS" && (c[3] == "FUNC" || c[3] == "OBJECT"))
                .then(|| c[7].to_owned())
        })
        .collect()
}

/// The version definitions (`readelf -V`) other than the file's own.
fn version_nodes(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("readelf")
        .arg("-V")
        .arg(lib)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let defs = text
        .split("Version definition section")
        .nth(1)
        .unwrap_or("");
    let defs = defs.split("Version needs section").next().unwrap_or("");
    defs.lines()
        .filter(|l| l.contains("Flags: none"))
        .filter_map(|l| l.rsplit("Name: ").next().map(|n| n.trim().to_owned()))
        .collect()
}

#[test]
fn exports_equal_the_system_librarys() {
    assert!(
        Path::new(SYSTEM).exists(),
        "{SYSTEM} missing: install Debian's libibverbs1 (scripts/test.sh installs it)"
    );
    let ours = common::lib_dir().join("libibverbs.so.1");
    let (mine, theirs) = (exports(&ours), exports(Path::new(SYSTEM)));
    assert_eq!(
        theirs.len(),
        180,
        "Debian 12's rdma-core 44 exports 180 name@version entries"
    );
    let missing: Vec<_> = theirs.difference(&mine).collect();
    let extra: Vec<_> = mine.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing: {missing:?}\nextra: {extra:?}"
    );
    // Defaults and compat versions both, e.g.
    assert!(mine.contains("ibv_get_device_list@@IBVERBS_1.1"));
    assert!(mine.contains("ibv_get_device_list@IBVERBS_1.0"));
    assert!(mine.contains("ibv_register_driver@IBVERBS_1.1"));
    assert!(mine.contains("verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"));
    assert_eq!(version_nodes(&ours), version_nodes(Path::new(SYSTEM)));
    assert_eq!(version_nodes(&ours).len(), 13);
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&ours)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&dynamic.stdout).contains("Library soname: [libibverbs.so.1]"),
        "soname"
    );
}

#[test]
fn stock_binaries_resolve_every_import_against_it() {
    // `ldd -r` resolves every symbol (data and functions) of the program and
    // of libraries it loads (perftest: librdmacm, libmlx5, libefa, which
    // need IBVERBS_PRIVATE_34), and names each one it cannot.
    for (tool, pkg) in [
        ("ibv_devinfo", "ibverbs-utils"),
        ("ibv_rc_pingpong", "ibverbs-utils"),
        ("ib_write_bw", "perftest"),
        ("ib_send_lat", "perftest"),
    ] {
        common::require(tool, pkg);
        let path = which(tool);
        let out = common::verbs_cmd("ldd")
            .arg("-r")
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ldd -r {tool}: {text}");
        assert!(
            !text.contains("undefined symbol") && !text.contains("not found"),
            "{tool}:\n{text}"
        );
        assert!(
            text.contains(
                &common::lib_dir()
                    .join("libibverbs.so.1")
                    .display()
                    .to_string()
            ),
            "{tool} did not pick the drop-in:\n{text}"
        );
    }
}

fn which(tool: &str) -> std::path::PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(tool))
        .find(|p| p.exists())
        .unwrap()
}
