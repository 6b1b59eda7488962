//! The binaries as separate processes: `kv_decode` and `kv_prefill` over
//! loopback, and (as root, else skipped) in two network namespaces joined
//! by a veth pair. Both must produce the single-node reference's tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rnic_kvcache::model::ModelConfig;
use rnic_kvcache::net::loopback_pair;
use rnic_kvcache::reference;

const PROMPT: u32 = 48;
const GENERATE: u32 = 8;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Wait for `child` at most `limit`, killing it past that.
fn wait_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "process ran past {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `"tokens":[…]` array of a JSON report.
fn tokens_of(json: &str) -> Vec<u32> {
    let start = json.rfind("\"tokens\":[").expect("tokens field") + 10;
    let end = start + json[start..].find(']').expect("array end");
    json[start..end]
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("token"))
        .collect()
}

/// Run `kv_decode` and `kv_prefill` (in namespaces `ns` = (decode,
/// prefill) when given) and check the decode node's tokens and digest.
fn run_pair(ns: Option<(&str, &str)>, decode_dev: &str, prefill_dev: &str, connect_ip: &str) {
    let port = free_port();
    let spawn = |ns: Option<&str>, bin: &str, args: Vec<String>| -> Child {
        let mut c = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        c.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (dns, pns) = (ns.map(|n| n.0), ns.map(|n| n.1));
    let common = |v: &mut Vec<String>| {
        v.extend(["--tiny", "--json", "-q", "--timeout", "20"].map(String::from));
    };
    let mut dargs = vec![
        "--listen".into(),
        port.to_string(),
        "--device".into(),
        decode_dev.into(),
        "--accept-timeout".into(),
        "30".into(),
    ];
    common(&mut dargs);
    let mut d = spawn(dns, env!("CARGO_BIN_EXE_kv_decode"), dargs);
    let mut pargs = vec![
        "--connect".into(),
        format!("{connect_ip}:{port}"),
        "--device".into(),
        prefill_dev.into(),
        "--prompt".into(),
        PROMPT.to_string(),
        "--generate".into(),
        GENERATE.to_string(),
        "--chunk".into(),
        "8192".into(),
        "--window".into(),
        "4".into(),
    ];
    common(&mut pargs);
    // The prefill node connects once: wait until the decode node listens (in its
    // namespace; a fixed 300 ms head start is a guess).
    if !rnic_testkit::wait_listening(&mut d, port, Duration::from_secs(30)) {
        let _ = d.kill();
        let o = d.wait_with_output().expect("output");
        panic!(
            "kv_decode never listened on port {port}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let p = spawn(pns, env!("CARGO_BIN_EXE_kv_prefill"), pargs);
    let pout = wait_within(p, Duration::from_secs(60));
    let dout = wait_within(d, Duration::from_secs(60));
    assert!(
        pout.status.success() && dout.status.success(),
        "prefill: {}\ndecode: {}",
        String::from_utf8_lossy(&pout.stderr),
        String::from_utf8_lossy(&dout.stderr)
    );
    let json = String::from_utf8_lossy(&dout.stdout);
    let r = reference::run(&ModelConfig::TINY, PROMPT, 1, GENERATE).expect("reference");
    assert_eq!(tokens_of(&json), r.tokens, "{json}");
    assert!(
        json.contains(&format!("\"kv_digest\":\"{:016x}\"", r.digest)),
        "{json}"
    );
}

#[test]
fn two_processes_over_loopback() {
    let (a, b) = loopback_pair();
    run_pair(None, &format!("rxe:{a}"), &format!("rxe:{b}"), "127.0.0.1");
}

/// Deletes the namespaces (and with them the veth pair) on drop.
struct Netns(&'static [&'static str]);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn sh(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn two_processes_in_two_network_namespaces() {
    let ns = ["kvcacheA", "kvcacheB"];
    let _ = Command::new("ip").args(["netns", "del", ns[0]]).status();
    let _ = Command::new("ip").args(["netns", "del", ns[1]]).status();
    if !sh(&["netns", "add", ns[0]]) {
        eprintln!("SKIP: cannot create network namespaces (run as root)");
        return;
    }
    let _guard = Netns(&["kvcacheA", "kvcacheB"]);
    let ok = sh(&["netns", "add", ns[1]])
        && sh(&[
            "-n", ns[0], "link", "add", "kvc0", "type", "veth", "peer", "name", "kvc1", "netns",
            ns[1],
        ])
        && sh(&["-n", ns[0], "addr", "add", "10.78.0.1/24", "dev", "kvc0"])
        && sh(&["-n", ns[1], "addr", "add", "10.78.0.2/24", "dev", "kvc1"])
        && sh(&["-n", ns[0], "link", "set", "kvc0", "up"])
        && sh(&["-n", ns[1], "link", "set", "kvc1", "up"])
        && sh(&["-n", ns[0], "link", "set", "lo", "up"])
        && sh(&["-n", ns[1], "link", "set", "lo", "up"]);
    if !ok {
        eprintln!("SKIP: cannot set up the veth pair");
        return;
    }
    run_pair(
        Some((ns[1], ns[0])),
        "rxe:10.78.0.2",
        "rxe:10.78.0.1",
        "10.78.0.2",
    );
}

/// `kv_decode --kv-memory gpu:0` without a CUDA driver (forced with
/// `RNIC_GPU=off` where one exists) fails at once, before listening, with
/// the typed no-driver error and its fix; a bad spec is refused by the
/// argument parser.
#[test]
fn kv_decode_on_gpu_without_a_driver_says_how_to_fix_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_kv_decode"))
        .args(["--listen", &free_port().to_string(), "--kv-memory", "gpu:0"])
        .args(["--accept-timeout", "5", "--quiet"])
        .env("RNIC_GPU", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("kv_decode: KV memory: no CUDA driver: "),
        "{err}"
    );
    assert!(err.contains("Install the NVIDIA driver"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_kv_decode"))
        .args(["--kv-memory", "vram"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("expected host, gpu, gpu:<ordinal> or gpu-emulated"),
        "{err}"
    );
}
