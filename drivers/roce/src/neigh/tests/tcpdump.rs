//! tcpdump as an independent oracle: the frames the engine sends, written
//! to a pcap file with this crate's writer, must read back as the ARP and
//! neighbour discovery messages they claim to be, with no checksum
//! complaint. Skipped (with a message) where tcpdump is not installed.

use std::process::Command;

use super::*;
use crate::pcap::{LinkType, Resolution as TsResolution, Writer};

#[test]
fn tcpdump_reads_the_frames_the_engine_sends() {
    let mut n = Neighbours::new(Config {
        announcements: 1,
        ..Config::default()
    })
    .expect("config");
    n.add_own(ms(0), v4(1), OWN_MAC).expect("own");
    n.add_own(ms(0), v6("fe80::1"), OWN_MAC).expect("own");
    n.resolve(ms(0), v4(2)).expect("resolve");
    n.resolve(ms(0), v6("fe80::2")).expect("resolve");
    n.on_frame(
        ms(0),
        &arp_in(EthernetAddress::BROADCAST, &request(PEER_MAC, 2, 1)),
    );
    let ns = NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr: Some(PEER_MAC),
    };
    n.on_frame(
        ms(0),
        &nd_in(
            (OWN_MAC, PEER_MAC),
            "fe80::5054:ff:fe12:3456",
            "fe80::1",
            &ns,
        ),
    );
    let frames = drain(&mut n);
    assert_eq!(frames.len(), 6);

    let path = std::env::temp_dir().join(format!("rnic-neigh-{}.pcap", std::process::id()));
    let mut w = Writer::new(Vec::new(), LinkType::ETHERNET, TsResolution::Micro).expect("pcap");
    for f in &frames {
        w.write_record(Duration::from_secs(1), f).expect("record");
    }
    std::fs::write(&path, w.into_inner()).expect("write pcap");
    let out = Command::new("tcpdump")
        .args(["-nn", "-e", "-vv", "-r"])
        .arg(&path)
        .output();
    if std::env::var_os("RNIC_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_file(&path);
    }
    let out = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!("tcpdump failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!(
                "SKIP tcpdump_reads_the_frames_the_engine_sends: tcpdump not runnable ({e}); apt-get install tcpdump"
            );
            return;
        }
    };
    for want in [
        "Request who-has 10.0.0.1 tell 10.0.0.1",
        "Request who-has 10.0.0.2 tell 10.0.0.1",
        "Reply 10.0.0.1 is-at 02:00:00:00:00:01",
        "neighbor advertisement, length 32, tgt is fe80::1, Flags [override]",
        "neighbor solicitation, length 32, who has fe80::2",
        "neighbor advertisement, length 32, tgt is fe80::1, Flags [solicited, override]",
        "source link-address option (1), length 8 (1): 02:00:00:00:00:01",
        "destination link-address option (2), length 8 (1): 02:00:00:00:00:01",
        "02:00:00:00:00:01 > 33:33:ff:00:00:02",
        "02:00:00:00:00:01 > 52:54:00:12:34:56",
    ] {
        assert!(out.contains(want), "tcpdump does not show {want:?}:\n{out}");
    }
    assert!(!out.contains("bad"), "tcpdump complains:\n{out}");
    assert_eq!(out.matches("[icmp6 sum ok]").count(), 3, "{out}");
}
