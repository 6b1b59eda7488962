//! The neighbour engine against the Linux kernel's ARP and IPv6 neighbour
//! discovery, over a veth pair between two network namespaces.
//!
//! Namespace A holds one veth end, on which an AF_PACKET socket carries the
//! engine's frames (the engine owns 10.77.0.2 and fd77::2 at
//! 02:00:00:00:77:02; the kernel in A owns nothing there). Namespace B holds
//! the other end with the kernel's 10.77.0.1 and fd77::1 at
//! 02:00:00:00:77:01. The kernel resolves the engine's addresses (a UDP
//! datagram sent from B makes it ask), and `ip neigh` in B must show the
//! engine's MAC; the engine resolves the kernel's, and must learn its MAC.
//! Nothing the kernel sends may count as malformed.
//!
//! Seen on Debian 12's host kernel: the kernel answers the ARP request at
//! once, but joins fd77::1's solicited-node group only when its address
//! work runs, about a second after the link comes up (its MLD report goes
//! out then), so the engine's first solicitation for fd77::1 is dropped by
//! the kernel's multicast filter and the retransmission one second later is
//! answered — the retry path, on a real peer.
//!
//! Needs root (network namespaces, AF_PACKET): skipped with a message
//! otherwise. About a second.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant as StdInstant};

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, LinkAddr, MsgFlags, SockFlag, SockProtocol, SockType, recvfrom, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use rnic_roce::neigh::{Config, Counters, Event, Instant, Neighbours, Resolution};
use rnic_roce::wire::EthernetAddress;

const ENGINE_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0x77, 2]);
const KERNEL_MAC: &str = "02:00:00:00:77:01";
const ENGINE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const KERNEL_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const ENGINE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
const KERNEL_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);
/// AF_PACKET's pkttype of frames this host sent.
const PACKET_OUTGOING: u8 = 4;

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces and the veth between them; removed on drop.
struct Link {
    a: String,
    b: String,
}

impl Link {
    fn new() -> Result<Link, String> {
        let id = std::process::id();
        let link = Link {
            a: format!("rnic-l2a-{id}"),
            b: format!("rnic-l2b-{id}"),
        };
        ip(&["netns", "add", &link.a])?;
        ip(&["netns", "add", &link.b])?;
        let (a, b) = (link.a.as_str(), link.b.as_str());
        for args in [
            &[
                "link", "add", "l2a", "netns", a, "type", "veth", "peer", "name", "l2b", "netns", b,
            ][..],
            &["-n", b, "link", "set", "l2b", "address", KERNEL_MAC],
            &["-n", b, "addr", "add", "10.77.0.1/24", "dev", "l2b"],
            &["-n", b, "addr", "add", "fd77::1/64", "dev", "l2b", "nodad"],
            &["-n", a, "link", "set", "l2a", "up"],
            &["-n", b, "link", "set", "l2b", "up"],
        ] {
            ip(args)?;
        }
        Ok(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn enter(ns: &str) {
    let f = File::open(format!("/var/run/netns/{ns}")).expect("the namespace file");
    setns(f, CloneFlags::CLONE_NEWNET).expect("setns");
}

/// The link-layer address of `ifname` (ifindex set) in this thread's namespace.
fn link_addr(ifname: &str) -> LinkAddr {
    nix::ifaddrs::getifaddrs()
        .expect("getifaddrs")
        .filter(|i| i.interface_name == ifname)
        .find_map(|i| i.address.and_then(|a| a.as_link_addr().copied()))
        .expect("the veth's link-layer address")
}

/// What the engine thread saw.
struct EngineEnd {
    resolved: Vec<(IpAddr, EthernetAddress)>,
    counters: Counters,
}

/// Run the engine on `l2a` in namespace `ns`: answer for its own
/// addresses; once `go` is set, resolve the kernel's, and return when both
/// are resolved (or 5 s after `go`). `ready` is passed once the socket is
/// open.
fn engine(ns: String, ready: Arc<Barrier>, go: Arc<AtomicBool>) -> EngineEnd {
    enter(&ns);
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::empty(),
        SockProtocol::EthAll,
    )
    .expect("AF_PACKET socket");
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 20_000)).expect("timeout");
    let veth = link_addr("l2a");
    ready.wait();
    let t0 = StdInstant::now();
    let now = || Instant::from_nanos(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let mut n = Neighbours::new(Config::default()).expect("config");
    n.add_own(now(), IpAddr::V4(ENGINE_V4), ENGINE_MAC)
        .expect("own v4");
    n.add_own(now(), IpAddr::V6(ENGINE_V6), ENGINE_MAC)
        .expect("own v6");
    let mut resolved = Vec::new();
    let mut buf = [0u8; 2048];
    let mut started: Option<StdInstant> = None;
    let give_up = Duration::from_secs(5);
    while resolved.len() < 2 && started.is_none_or(|t| t.elapsed() < give_up) {
        if started.is_none() && go.load(Ordering::Relaxed) {
            for peer in [IpAddr::V4(KERNEL_V4), IpAddr::V6(KERNEL_V6)] {
                let r = n.resolve(now(), peer).expect("resolve");
                assert!(matches!(r, Resolution::Pending { .. }), "{r:?}");
            }
            started = Some(StdInstant::now());
        }
        while let Some(f) = n.transmit() {
            sendto(fd.as_raw_fd(), &f, &veth, MsgFlags::empty()).expect("send");
        }
        while let Some(e) = n.event() {
            match e {
                Event::Resolved { ip, mac } => resolved.push((ip, mac)),
                Event::Failed { ip, tries } => {
                    panic!("the kernel did not answer for {ip} ({tries} tries)")
                }
                _ => {}
            }
        }
        match recvfrom::<LinkAddr>(fd.as_raw_fd(), &mut buf) {
            Ok((len, Some(from)))
                if from.ifindex() == veth.ifindex() && from.pkttype() != PACKET_OUTGOING =>
            {
                n.on_frame(now(), &buf[..len]);
            }
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => panic!("recvfrom: {e}"),
        }
        if n.next_deadline().is_some_and(|d| d <= now()) {
            n.poll(now());
        }
    }
    EngineEnd {
        resolved,
        counters: *n.counters(),
    }
}

/// Make the kernel in `ns` resolve the engine's addresses (a datagram to
/// each), then wait until `ip neigh` has their MAC.
fn kernel_resolves(ns: &str) -> Vec<String> {
    let ns_owned = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns_owned);
        for (from, to) in [
            (
                SocketAddr::new(IpAddr::V4(KERNEL_V4), 0),
                SocketAddr::new(IpAddr::V4(ENGINE_V4), 9),
            ),
            (
                SocketAddr::new(IpAddr::V6(KERNEL_V6), 0),
                SocketAddr::new(IpAddr::V6(ENGINE_V6), 9),
            ),
        ] {
            let s = UdpSocket::bind(from).expect("bind in B");
            s.send_to(b"who are you", to).expect("send in B");
        }
    })
    .join()
    .expect("the sender thread");
    let deadline = StdInstant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<String> = [ENGINE_V4.to_string(), ENGINE_V6.to_string()]
            .iter()
            .map(|a| ip(&["-n", ns, "neigh", "show", a]).unwrap_or_default())
            .collect();
        if lines.iter().all(|l| l.contains("lladdr")) || StdInstant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_kernel_and_the_engine_resolve_each_other_over_veth() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!(
            "SKIP the_kernel_and_the_engine_resolve_each_other_over_veth: needs root (network namespaces, AF_PACKET)"
        );
        return;
    }
    let link = match Link::new() {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "SKIP the_kernel_and_the_engine_resolve_each_other_over_veth: cannot build the veth link ({e})"
            );
            return;
        }
    };
    let go = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(2));
    let engine_thread = {
        let (ns, ready, go) = (link.a.clone(), Arc::clone(&ready), Arc::clone(&go));
        std::thread::spawn(move || engine(ns, ready, go))
    };
    // The kernel asks first (the engine has sent nothing it could learn
    // from but its announcements, which Linux ignores by default), then
    // the engine resolves the kernel's addresses.
    ready.wait();
    let kernel_view = kernel_resolves(&link.b);
    go.store(true, Ordering::Relaxed);
    let end = engine_thread.join().expect("the engine thread");

    let mac = ENGINE_MAC.to_string();
    for line in &kernel_view {
        assert!(
            line.contains(&format!("lladdr {mac}")),
            "the kernel's neighbour table: {kernel_view:?}"
        );
    }
    let kernel_mac: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0x77, 1]);
    let mut resolved = end.resolved.clone();
    resolved.sort();
    assert_eq!(
        resolved,
        vec![
            (IpAddr::V4(KERNEL_V4), kernel_mac),
            (IpAddr::V6(KERNEL_V6), kernel_mac)
        ],
        "the engine resolved the kernel's addresses"
    );
    let c = end.counters;
    assert!(
        c.answered >= 2,
        "the kernel's ARP request and solicitation were answered: {c:?}"
    );
    assert_eq!(
        c.malformed.total(),
        0,
        "nothing the kernel sends is malformed: {c:?}"
    );
    assert_eq!(c.dispositions(), c.frames_in);
    eprintln!("kernel neigh: {kernel_view:?}; engine counters: {c:?}");
}
