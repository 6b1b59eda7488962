//! rnicctl as a user runs it: list/doctor on this machine's real sysfs,
//! bind/unbind/list against a synthetic sysfs tree, and perf client↔server
//! over loopback as two processes.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_rnicctl");

fn rnicctl(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn json_of(o: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
fn help_explains_every_command() {
    let o = rnicctl(&["--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    for c in ["list", "bind", "unbind", "doctor", "info", "stats", "perf"] {
        assert!(s.contains(c), "{s}");
    }
    let o = rnicctl(&["perf", "--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "--size",
        "--iters",
        "--duration",
        "--all",
        "--qp",
        "--tx-depth",
        "--mtu",
        "--gid-index",
        "--inline_size",
        "--report_gbits",
        "--ib-dev",
        "--port",
        "--events",
        "--json",
    ] {
        assert!(s.contains(opt), "{opt} missing: {s}");
    }
}

#[test]
fn list_shows_loopback_and_eth0_with_their_gids() {
    let o = rnicctl(&["list", "--json"]);
    assert!(o.status.success());
    let j = json_of(&o);
    let rxe = j["rxe"].as_array().unwrap();
    let lo = rxe.iter().find(|e| e["netdev"] == "lo").expect("lo listed");
    let gids: Vec<&str> = lo["gids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    assert!(gids.contains(&"::ffff:127.0.0.1"), "{gids:?}");
    assert_eq!(
        lo["active_mtu"], 4096,
        "lo's 65536 MTU allows the largest path MTU"
    );
    // eth0, when this machine has one with IPv4, appears with that address's GID.
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs.filter(|a| a.interface_name == "eth0") {
            if let Some(v4) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                let e = rxe
                    .iter()
                    .find(|e| e["netdev"] == "eth0")
                    .expect("eth0 listed");
                let want = format!("::ffff:{}", v4.ip());
                assert!(
                    e["gids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|g| g == want.as_str()),
                    "{e}"
                );
                let mtu: u64 = fs::read_to_string("/sys/class/net/eth0/mtu")
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                assert_eq!(e["mtu"], mtu);
            }
        }
    }
    let text = rnicctl(&["list"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("rxe:lo"));
}

/// The check named `n` in `rnicctl doctor --json`'s output `j`.
fn doctor_check<'a>(j: &'a serde_json::Value, n: &str) -> &'a serde_json::Value {
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == n)
        .unwrap_or_else(|| panic!("{n} missing"))
}

#[test]
fn doctor_reports_real_facts_and_its_exit_code_follows_failures() {
    let _g = UDP_4791
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let o = rnicctl(&["doctor", "--json"]);
    let j = json_of(&o);
    let checks = j["checks"].as_array().unwrap();
    let get = |n: &str| doctor_check(&j, n);
    // memlock: the value getrlimit gives this (child-identical) process.
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).unwrap();
    let m = get("memlock")["detail"].as_str().unwrap();
    if soft == nix::sys::resource::RLIM_INFINITY {
        assert!(m.contains("unlimited"), "{m}");
    } else {
        assert!(m.contains(&format!("RLIMIT_MEMLOCK {soft} bytes")), "{m}");
    }
    // udp/4791: OK exactly when the port could be bound; FAIL carries a fix.
    let u = get("udp/4791");
    if u["level"] == "FAIL" {
        assert!(
            u["fix"].as_str().unwrap().contains("rdma link delete"),
            "{u}"
        );
    } else {
        assert_eq!(u["level"], "OK");
    }
    // IOMMU: OK exactly when /sys/kernel/iommu_groups has entries.
    let groups = fs::read_dir("/sys/kernel/iommu_groups")
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(get("iommu")["level"] == "OK", groups > 0);
    // icrc: OK exactly when this process may open a raw socket (the tap).
    let raw = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Raw,
        nix::sys::socket::SockFlag::empty(),
        nix::sys::socket::SockProtocol::Udp,
    )
    .is_ok();
    let icrc = get("icrc");
    let recovery_env = std::env::var_os("RNIC_RXE_IDENT_RECOVERY").is_some();
    if !recovery_env {
        assert_eq!(icrc["level"] == "OK", raw, "{icrc}");
    }
    if !raw {
        assert!(
            icrc["fix"].as_str().unwrap().contains("CAP_NET_RAW"),
            "{icrc}"
        );
    }
    // rxe-rx-path names the receive moderation this environment gives a
    // progress thread: the default, or off with RNIC_RXE_RX_MODERATION_US=0.
    let path = get("rxe-rx-path")["detail"].as_str().unwrap().to_owned();
    if std::env::var_os("RNIC_RXE_RX_MODERATION_US").is_none() {
        let d = rnic::rxe::RxModeration::default();
        let want = format!(
            "nap {}-{} us between rounds (longer the larger the requester window) while 2.0 GB/s",
            d.nap.as_micros(),
            d.max_nap.as_micros()
        );
        assert!(path.contains(&want), "{path}");
    }
    let off = Command::new(BIN)
        .args(["doctor", "--json"])
        .env("RNIC_RXE_RX_MODERATION_US", "0")
        .output()
        .unwrap();
    let off = json_of(&off);
    let off_path = doctor_check(&off, "rxe-rx-path")["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(off_path.contains("receive moderation off"), "{off_path}");
    // rxe-rx-ring: OK exactly when a packet ring opens: a raw socket (as
    // the tap) on Linux 6.2+.
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let new_enough = rnic::rxe::ring::kernel_version(release.trim())
        .is_some_and(|v| v >= rnic::rxe::ring::MIN_KERNEL);
    let ring = get("rxe-rx-ring");
    assert_eq!(ring["level"] == "OK", raw && new_enough, "{ring}");
    // rxe-tx-frames: OK with a raw socket; on lo exactly when both sysctls
    // are set (read here from /proc, not through the code under test).
    let frames = get("rxe-tx-frames");
    assert_eq!(frames["level"] == "OK", raw, "{frames}");
    if raw {
        let lo_ok = lo_conf_on("accept_local") && lo_conf_on("route_localnet");
        let detail = frames["detail"].as_str().unwrap();
        assert_eq!(detail.contains("keep the UDP socket"), !lo_ok, "{frames}");
    }
    // icrc-crc: the CRC kernel this CPU's flags (read from /proc/cpuinfo,
    // not through the detection under test) allow.
    let flags = fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default();
    let has = |f: &str| flags.iter().any(|x| x == f);
    let crc = get("icrc-crc");
    let detail = crc["detail"].as_str().unwrap();
    if has("vpclmulqdq") && has("avx2") && has("pclmulqdq") && has("avx512f") {
        assert!(detail.contains("512-bit"), "{crc}");
    } else if has("vpclmulqdq") && has("avx2") && has("pclmulqdq") {
        assert!(
            detail.contains("256-bit") && detail.contains("no AVX-512F"),
            "{crc}"
        );
    } else if has("pclmulqdq") {
        assert!(
            detail.contains("128-bit") && detail.contains("no VPCLMULQDQ"),
            "{crc}"
        );
    } else if cfg!(target_arch = "x86_64") {
        assert_eq!(crc["level"], "WARN", "{crc}");
    }
    for n in [
        "vfio-pci",
        "/dev/vfio",
        "hugepages",
        "numa",
        "cuda",
        "af_packet",
        "udp-gso",
        "udp-gro",
    ] {
        get(n);
    }
    let fails = checks.iter().filter(|c| c["level"] == "FAIL").count();
    assert_eq!(j["failures"], fails);
    assert_eq!(o.status.success(), fails == 0);
    for c in checks.iter().filter(|c| c["level"] != "OK") {
        assert!(!c["fix"].as_str().unwrap().is_empty(), "{c}");
    }
    let text = rnicctl(&["doctor"]);
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.lines()
            .all(|l| l.starts_with("OK") || l.starts_with("WARN") || l.starts_with("FAIL")),
        "{t}"
    );
}

/// A synthetic /sys: two ConnectX-5 functions in IOMMU group 7, on mlx5_core,
/// with netdevs ens1f0 / ens1f1.
fn fake_sys(root: &Path) {
    for d in [
        "bus/pci/drivers/mlx5_core",
        "bus/pci/drivers/vfio-pci",
        "kernel/iommu_groups/7/devices",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("bus/pci/drivers_probe"), "").unwrap();
    for d in ["mlx5_core", "vfio-pci"] {
        for f in ["bind", "unbind"] {
            fs::write(root.join("bus/pci/drivers").join(d).join(f), "").unwrap();
        }
    }
    for (bdf, ifname) in [("0000:3b:00.0", "ens1f0"), ("0000:3b:00.1", "ens1f1")] {
        let d = root.join("bus/pci/devices").join(bdf);
        fs::create_dir_all(d.join("net").join(ifname)).unwrap();
        fs::write(d.join("vendor"), "0x15b3\n").unwrap();
        fs::write(d.join("device"), "0x1017\n").unwrap();
        fs::write(d.join("numa_node"), "1\n").unwrap();
        fs::write(d.join("current_link_speed"), "8.0 GT/s PCIe\n").unwrap();
        fs::write(d.join("current_link_width"), "16\n").unwrap();
        fs::write(d.join("driver_override"), "(null)\n").unwrap();
        symlink(root.join("bus/pci/drivers/mlx5_core"), d.join("driver")).unwrap();
        symlink(root.join("kernel/iommu_groups/7"), d.join("iommu_group")).unwrap();
        symlink(&d, root.join("kernel/iommu_groups/7/devices").join(bdf)).unwrap();
    }
    // A non-Mellanox function that list must skip.
    let other = root.join("bus/pci/devices/0000:00:1f.0");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("vendor"), "0x8086\n").unwrap();
    fs::write(other.join("device"), "0x1017\n").unwrap();
}

fn route_table(dir: &Path, default_if: &str) -> String {
    let p = dir.join("route");
    fs::write(
        &p,
        format!("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n{default_if}\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n ens1f0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"),
    )
    .unwrap();
    p.to_string_lossy().into_owned()
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}

#[test]
fn synthetic_sysfs_list_bind_refusal_bind_and_restore() {
    let t = tempfile::tempdir().unwrap();
    let sys = t.path().join("sys");
    fake_sys(&sys);
    let state = t.path().join("state");
    let root = sys.to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("RNICCTL_STATE_DIR", &state)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    // list
    let j = json_of(&run(&["list", "--json", "--sysfs-root", &root]));
    let m = j["mlx5"].as_array().unwrap();
    assert_eq!(m.len(), 2, "{j}");
    assert_eq!(m[0]["bdf"], "0000:3b:00.0");
    assert_eq!(m[0]["part"], "ConnectX-5");
    assert_eq!(m[0]["driver"], "mlx5_core");
    assert_eq!(m[0]["iommu_group"], 7);
    assert_eq!(m[0]["numa_node"], 1);
    assert_eq!(m[0]["link_speed"], "8.0 GT/s PCIe");
    assert_eq!(m[0]["link_width"], "16");
    assert_eq!(m[0]["netdevs"][0], "ens1f0");

    let dev0 = sys.join("bus/pci/devices/0000:3b:00.0");
    // Refusal: the group's other member carries the default route.
    let routes = route_table(t.path(), "ens1f1");
    let o = run(&[
        "bind",
        "0000:3b:00.0",
        "--sysfs-root",
        &root,
        "--route-table",
        &routes,
    ]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        out.contains("0000:3b:00.1 driver mlx5_core"),
        "group preview: {out}"
    );
    assert!(
        err.contains("ens1f1") && err.contains("default route") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        read(&dev0.join("driver_override")),
        "(null)\n",
        "nothing written"
    );

    // Dry run: the plan, nothing written.
    let routes = route_table(t.path(), "eth9");
    let o = run(&[
        "bind",
        "0000:3b:00.0",
        "--dry-run",
        "--sysfs-root",
        &root,
        "--route-table",
        &routes,
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("write vfio-pci to"));
    assert_eq!(read(&dev0.join("driver_override")), "(null)\n");
    assert_eq!(read(&sys.join("bus/pci/drivers_probe")), "");

    // Bind (rnic-vfio's Sysfs::bind): override, unbind from the current
    // driver, probe; the previous driver is remembered. No kernel answers in
    // a synthetic tree, so the function stays on mlx5_core and bind says so.
    let o = run(&[
        "bind",
        "0000:3b:00.0",
        "--sysfs-root",
        &root,
        "--route-table",
        &routes,
    ]);
    assert_eq!(read(&dev0.join("driver_override")), "vfio-pci\n");
    assert_eq!(
        read(&sys.join("bus/pci/drivers/mlx5_core/unbind")),
        "0000:3b:00.0"
    );
    assert_eq!(read(&sys.join("bus/pci/drivers_probe")), "0000:3b:00.0");
    assert_eq!(read(&state.join("0000:3b:00.0.driver")), "mlx5_core");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bind 0000:3b:00.0 to vfio-pci")
            && err.contains("bound to mlx5_core")
            && err.contains("dmesg"),
        "{err}"
    );

    // --force overrides the refusal.
    let routes_hit = route_table(t.path(), "ens1f1");
    let o = run(&[
        "bind",
        "0000:3b:00.1",
        "--force",
        "--dry-run",
        "--sysfs-root",
        &root,
        "--route-table",
        &routes_hit,
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning (--force)"));

    // What the kernel does on drivers_probe: the function moves to vfio-pci.
    let relink = |drv: &str| {
        fs::remove_file(dev0.join("driver")).unwrap();
        symlink(sys.join("bus/pci/drivers").join(drv), dev0.join("driver")).unwrap();
    };
    relink("vfio-pci");
    let j = json_of(&run(&["list", "--json", "--sysfs-root", &root]));
    assert_eq!(j["mlx5"][0]["driver"], "vfio-pci");
    let o = run(&[
        "bind",
        "0000:3b:00.0",
        "--sysfs-root",
        &root,
        "--route-table",
        &routes,
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("already bound to vfio-pci"));

    // Unbind restores the remembered driver (rnic-vfio's Sysfs::restore):
    // unbind from vfio-pci, override to mlx5_core, probe, clear the override.
    fs::write(sys.join("bus/pci/drivers_probe"), "").unwrap();
    let o = run(&["unbind", "0000:3b:00.0", "--sysfs-root", &root]);
    assert_eq!(
        read(&sys.join("bus/pci/drivers/vfio-pci/unbind")),
        "0000:3b:00.0"
    );
    assert_eq!(read(&sys.join("bus/pci/drivers_probe")), "0000:3b:00.0");
    assert_eq!(
        read(&dev0.join("driver_override")),
        "\n",
        "override cleared"
    );
    // Again no kernel: still on vfio-pci, reported; the remembered driver stays.
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("to mlx5_core") && err.contains("bound to vfio-pci"),
        "{err}"
    );
    assert!(state.join("0000:3b:00.0.driver").exists());
    // Once the kernel has moved it back, unbind completes and forgets it.
    relink("mlx5_core");
    let o = run(&["unbind", "0000:3b:00.0", "--sysfs-root", &root]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("given back to mlx5_core"));
    assert!(!state.join("0000:3b:00.0.driver").exists());

    // Bad addresses are explained.
    let o = run(&["bind", "3b:00", "--sysfs-root", &root]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected a PCI address"));
}

/// Perf tests and the doctor's 0.0.0.0:4791 probe must not overlap.
static UDP_4791: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn perf_pair(test: &str, port: u16, extra: &[&str]) -> (String, String) {
    let (c, s) = perf_pair_env(test, port, extra, &[]);
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(
            o.status.success(),
            "{who}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (
        String::from_utf8_lossy(&c.stdout).into_owned(),
        String::from_utf8_lossy(&s.stdout).into_owned(),
    )
}

/// A server on 127.0.0.6 and a client on 127.0.0.7 with the rxe path
/// variables set as `env` says (absent otherwise); both outputs, whatever
/// their exit status.
fn perf_pair_env(test: &str, port: u16, extra: &[&str], env: &[(&str, &str)]) -> (Output, Output) {
    let _g = UDP_4791
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cmd = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args)
            .env_remove("RNIC_RXE_RX_RING")
            .env_remove("RNIC_RXE_TX_FRAMES")
            .envs(env.iter().copied());
        c
    };
    let p = port.to_string();
    let mut sargs = vec!["perf", test, "-d", "rxe:127.0.0.6", "-p", &p];
    sargs.extend_from_slice(extra);
    let mut server = cmd(&sargs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut cargs = vec!["perf", test, "-d", "rxe:127.0.0.7", "-p", &p];
    cargs.extend_from_slice(extra);
    cargs.push("127.0.0.1");
    let c = cmd(&cargs).output().unwrap();
    if !c.status.success() {
        // A client that failed before connecting leaves the server waiting.
        let _ = server.kill();
    }
    (c, server.wait_with_output().unwrap())
}

/// Whether IPv4 switch `key` is on for `lo` (in `conf/all` or `conf/lo`),
/// read from /proc, not through the code under test.
fn lo_conf_on(key: &str) -> bool {
    ["all", "lo"].iter().any(|d| {
        fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{d}/{key}"))
            .is_ok_and(|v| v.trim() == "1")
    })
}

#[test]
fn perf_reports_the_packet_ring_and_what_left_as_frames() {
    let (c, s) = perf_pair_env(
        "write-lat",
        19326,
        &["-s", "8", "-n", "300"],
        &[("RNIC_RXE_RX_RING", "1")],
    );
    let (cs, ss) = (
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&s.stdout),
    );
    if !c.status.success() {
        let err = String::from_utf8_lossy(&c.stderr);
        assert!(
            err.contains("packet-ring receive path"),
            "client: {cs}\n{err}"
        );
        eprintln!("skipping: no packet ring here: {err}");
        return;
    }
    assert!(s.status.success(), "server: {ss}");
    // On lo a frame reaches IP input only with accept_local and, for
    // 127/8, route_localnet (frames.rs); a ring would take it either way.
    let frames = lo_conf_on("accept_local") && lo_conf_on("route_localnet");
    for out in [&cs, &ss] {
        let path = out
            .lines()
            .find_map(|l| l.strip_prefix(" Data path       : "))
            .unwrap_or_else(|| panic!("no data path line: {out}"));
        let (rx, tx) = path.split_once("; ").expect("rx; tx");
        assert_eq!(rx, "rx packet ring (1 of 1 addresses)", "{out}");
        if frames {
            // The first datagram to a peer leaves before its hop has been
            // seen; every one after as a frame.
            assert!(
                tx.starts_with("tx frames (all ") || tx.contains(" datagrams as frames, the rest "),
                "{out}"
            );
        } else {
            assert!(tx.starts_with("tx UDP socket (no peer's next hop"), "{out}");
        }
    }
}

/// The numeric row after a perftest header line.
fn row_after<'a>(out: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = out.lines();
    lines
        .find(|l| l.contains(header))
        .unwrap_or_else(|| panic!("{header} missing: {out}"));
    lines.next().unwrap().split_whitespace().collect()
}

#[test]
fn perf_write_bw_two_processes_over_loopback() {
    let (c, s) = perf_pair("write-bw", 19321, &["-s", "8192", "-n", "300"]);
    for out in [&c, &s] {
        assert!(
            out.contains(" Data path       : rx UDP socket; tx UDP socket\n"),
            "{out}"
        );
        let r = row_after(
            out,
            "#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
        );
        assert_eq!(r[0], "8192");
        assert_eq!(r[1], "300");
        let (peak, avg, rate): (f64, f64, f64) = (
            r[2].parse().unwrap(),
            r[3].parse().unwrap(),
            r[4].parse().unwrap(),
        );
        assert!(avg > 0.0 && peak >= avg && rate > 0.0, "{r:?}");
    }
}

#[test]
fn perf_send_lat_two_processes_percentiles_ordered() {
    let (c, _) = perf_pair("send-lat", 19322, &["-s", "64", "-n", "200"]);
    let r = row_after(&c, "t_min[usec]");
    assert_eq!(r[0], "64");
    assert_eq!(r[1], "200");
    let v: Vec<f64> = r[2..].iter().map(|x| x.parse().unwrap()).collect();
    let (min, max, typ, _avg, _sd, p99, p999) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    assert!(
        min > 0.0 && min <= typ && typ <= p99 && p99 <= p999 && p999 <= max,
        "{v:?}"
    );
}

#[test]
fn perf_read_bw_json_and_stats() {
    let (c, s) = perf_pair(
        "read-bw",
        19323,
        &["-s", "4096", "-n", "100", "-q", "2", "--json", "--stats"],
    );
    let j: serde_json::Value = serde_json::from_str(c.trim()).unwrap();
    assert_eq!(j["test"], "ib_read_bw");
    assert_eq!(j["role"], "client");
    assert_eq!(j["results"][0]["bytes"], 4096);
    assert_eq!(j["results"][0]["iterations"], 100, "per QP, as perftest");
    let qps = j["stats"]["device"]["qps"].as_array().unwrap();
    assert_eq!(qps.len(), 2);
    assert!(qps.iter().all(|q| q["rx_packets"].as_u64().unwrap() >= 100));
    assert!(j["stats"]["cq"]["high_water_mark"].as_u64().unwrap() >= 1);
    assert_eq!(j["data_path"], "rx UDP socket; tx UDP socket");
    let js: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
    assert_eq!(js["role"], "server");
    assert_eq!(js["results"][0]["iterations"], 100);
    // `rnicctl stats` reads the saved run.
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("run.json");
    fs::write(&f, &c).unwrap();
    let o = rnicctl(&["stats", f.to_str().unwrap()]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("retransmits") && text.contains("high_water_mark"),
        "{text}"
    );
}

#[test]
fn info_lists_limits_and_gids() {
    let _g = UDP_4791
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let o = rnicctl(&["info", "rxe:127.0.0.8", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = json_of(&o);
    assert!(j["limits"]["max_qp"].as_u64().unwrap() > 0);
    assert!(j["limits"]["max_sge"].as_u64().unwrap() > 0);
    assert_eq!(j["ports"][0]["gids"][0]["gid"], "::ffff:127.0.0.8");
    assert_eq!(j["ports"][0]["active_mtu"], 4096);
}

#[test]
fn live_counters_from_a_running_perf_server() {
    let _g = UDP_4791
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let t = tempfile::tempdir().unwrap();
    let server = Command::new(BIN)
        .args([
            "perf",
            "write-bw",
            "-d",
            "rxe:127.0.0.6",
            "-p",
            "19324",
            "-D",
            "3",
            "--stats-socket",
        ])
        .env("RNIC_RUN_DIR", t.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(BIN)
        .args([
            "perf",
            "write-bw",
            "-d",
            "rxe:127.0.0.7",
            "-p",
            "19324",
            "-D",
            "3",
            "127.0.0.1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = t.path().join(format!("{}.sock", server.id()));
    let t0 = std::time::Instant::now();
    while !sock.exists() && t0.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(sock.exists(), "no stats socket {}", sock.display());
    // Mid-run: the server's QP has received WRITEs.
    let mut rx = 0;
    while rx == 0 && t0.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let o = Command::new(BIN)
            .args(["stats", &server.id().to_string(), "--json"])
            .env("RNIC_RUN_DIR", t.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j = json_of(&o);
        assert_eq!(j["pid"], server.id());
        assert!(j["cq"]["depth"].as_u64().unwrap() > 0);
        rx = j["device"]["qps"][0]["rx_packets"].as_u64().unwrap_or(0);
    }
    assert!(rx > 0, "the live counters never showed received packets");
    let all = Command::new(BIN)
        .args(["stats", "--json"])
        .env("RNIC_RUN_DIR", t.path())
        .output()
        .unwrap();
    assert_eq!(json_of(&all).as_array().unwrap().len(), 1);
    let c = client.wait_with_output().unwrap();
    let s = server.wait_with_output().unwrap();
    assert!(
        c.status.success() && s.status.success(),
        "{}",
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(!sock.exists(), "the socket is removed at exit");
}

#[test]
fn mlx5_layouts_json_prints_the_prm_table() {
    let o = rnicctl(&["mlx5", "layouts", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json_of(&o);
    let qp = &v["structs"]["create_qp_in"];
    assert_eq!(qp["size_bits"], 2176);
    assert_eq!(qp["fields"]["pas"], serde_json::json!([2176, 64]));
    assert_eq!(qp["fields"]["qpc.pd"], serde_json::json!([0xc0 + 0x28, 24]));
    assert_eq!(v["structs"]["cqe64"]["size_bits"], 512);

    let o = rnicctl(&["mlx5", "layouts"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.lines()
            .any(|l| l.starts_with("create_qp_in ") && l.contains("2176 bits")),
        "{s}"
    );

    let o = rnicctl(&["mlx5", "layouts", "--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("--json") && s.contains("bit_offset"), "{s}");
}
