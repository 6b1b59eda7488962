//! Received frames: filter (VLAN, MAC, own reflections), dissect, then
//! answer requests for own addresses and apply answers to tracked entries.

use std::net::{IpAddr, Ipv6Addr};

use super::frame::{self, Payload};
use super::{Event, Ignored, Instant, Malformed, Neighbours, Outcome, State};
use crate::wire::icmpv6::{self, AdvertFlags, NdRepr};
use crate::wire::{EthernetAddress, EthernetPacket, Ipv6Repr, arp};

/// How a piece of link-layer information may change an entry (RFC 4861
/// §7.2.5's two flags; ARP maps onto them).
#[derive(Debug, Clone, Copy)]
struct Claim {
    /// An answer to our own solicitation: proves two-way reachability.
    solicited: bool,
    /// May replace a different cached MAC.
    override_: bool,
}

/// A reply to a request of ours (ARP reply unicast to us, solicited NA).
const CONFIRMS: Claim = Claim {
    solicited: true,
    override_: true,
};
/// A request, announcement or unsolicited override: the MAC may change,
/// reachability is not proven.
const HINTS: Claim = Claim {
    solicited: false,
    override_: true,
};

impl Neighbours {
    /// Handle one received Ethernet frame (no FCS; an 802.1Q tag allowed).
    /// Replies go to the transmit queue, changes to the event queue; the
    /// outcome is counted in [`Neighbours::counters`].
    pub fn on_frame(&mut self, now: Instant, frame: &[u8]) -> Outcome {
        let outcome = self.receive(now, frame);
        self.counters.count(&outcome);
        outcome
    }

    fn is_own_mac(&self, mac: EthernetAddress) -> bool {
        self.own.values().any(|o| o.mac == mac)
    }

    fn own_mac(&self, ip: IpAddr) -> Option<EthernetAddress> {
        self.own.get(&ip).map(|o| o.mac)
    }

    fn receive(&mut self, now: Instant, frame: &[u8]) -> Outcome {
        let Ok(eth) = EthernetPacket::new_checked(frame) else {
            return Outcome::Malformed(Malformed::Truncated);
        };
        let (src, dst) = (eth.src_addr(), eth.dst_addr());
        if src.is_multicast() {
            return Outcome::Malformed(Malformed::EthernetSource);
        }
        if let Some(tag) = eth.vlan()
            && tag.vid != self.config.vlan.map_or(0, |v| v.vid)
        {
            return Outcome::Ignored(Ignored::OtherVlan);
        }
        if self.is_own_mac(src) {
            return Outcome::Ignored(Ignored::OwnFrame);
        }
        let for_us = dst.is_broadcast() || dst.0[..2] == [0x33, 0x33] || self.is_own_mac(dst);
        if !for_us {
            return Outcome::Ignored(Ignored::OtherMac);
        }
        match frame::dissect(eth.ethertype(), eth.payload()) {
            Err(m) => Outcome::Malformed(m),
            Ok(Payload::Other) => Outcome::Ignored(Ignored::OtherProtocol),
            Ok(Payload::Router) => Outcome::Ignored(Ignored::RouterDiscovery),
            Ok(Payload::Arp(a)) => self.arp(now, src, dst, &a),
            Ok(Payload::Nd(ip, nd)) => self.nd(now, src, &ip, &nd),
        }
    }

    fn arp(
        &mut self,
        now: Instant,
        src: EthernetAddress,
        dst: EthernetAddress,
        a: &arp::Repr,
    ) -> Outcome {
        let (sha, spa, tpa) = (
            a.source_hardware_addr,
            IpAddr::V4(a.source_protocol_addr),
            IpAddr::V4(a.target_protocol_addr),
        );
        if self.is_own_mac(sha) {
            return Outcome::Ignored(Ignored::OwnFrame);
        }
        if self.own.contains_key(&spa) {
            return self.conflict(now, spa, sha);
        }
        let target_is_own = self.own.contains_key(&tpa);
        // RFC 826: a sender already in the table is updated, whatever the
        // operation; a reply unicast to us for an own address is the answer
        // to our request and confirms reachability.
        let learned = if a.is_probe() {
            None
        } else {
            let answers_us = a.operation == arp::Operation::Reply
                && !a.is_gratuitous()
                && target_is_own
                && !dst.is_multicast();
            self.apply(
                now,
                spa,
                Some(sha),
                if answers_us { CONFIRMS } else { HINTS },
            )
        };
        if a.operation == arp::Operation::Request && target_is_own && !a.is_gratuitous() {
            let Some(mac) = self.own_mac(tpa) else {
                return Outcome::Ignored(Ignored::NotForUs);
            };
            if !self.limiter.admit(src, now) {
                return Outcome::Ignored(Ignored::RateLimited);
            }
            let reply = arp::Repr::reply_to(a, mac);
            let frame = frame::arp(sha, mac, self.config.vlan, &reply);
            self.queue(frame);
            return Outcome::Answered { target: tpa };
        }
        learned.unwrap_or(Outcome::Ignored(match a.operation {
            arp::Operation::Request if !a.is_gratuitous() => Ignored::NotForUs,
            _ => Ignored::Unsolicited,
        }))
    }

    fn nd(&mut self, now: Instant, src: EthernetAddress, ip: &Ipv6Repr, nd: &NdRepr) -> Outcome {
        let target = IpAddr::V6(nd.target());
        match *nd {
            NdRepr::Solicit { lladdr, .. } => {
                let from = IpAddr::V6(ip.src_addr);
                if self.own.contains_key(&from) {
                    return self.conflict(now, from, lladdr.unwrap_or(src));
                }
                let learned = match lladdr {
                    Some(mac) if !ip.src_addr.is_unspecified() => {
                        self.apply(now, from, Some(mac), HINTS)
                    }
                    _ => None,
                };
                let to_target = ip.dst_addr == icmpv6::solicited_node(nd.target())
                    || ip.dst_addr == nd.target();
                match self.own_mac(target) {
                    Some(mac) if to_target => {
                        self.answer_solicitation(now, src, ip, nd.target(), lladdr, mac)
                    }
                    _ => learned.unwrap_or(Outcome::Ignored(Ignored::NotForUs)),
                }
            }
            NdRepr::Advert { flags, lladdr, .. } => {
                if self.own.contains_key(&target) {
                    return self.conflict(now, target, lladdr.unwrap_or(src));
                }
                let claim = Claim {
                    solicited: flags.solicited,
                    override_: flags.override_,
                };
                self.apply(now, target, lladdr, claim)
                    .unwrap_or(Outcome::Ignored(Ignored::Unsolicited))
            }
        }
    }

    /// Answer a solicitation for the own address `target` (MAC `mac`):
    /// unicast to the solicitor, or to all nodes for duplicate address
    /// detection (RFC 4861 §7.2.4).
    fn answer_solicitation(
        &mut self,
        now: Instant,
        src: EthernetAddress,
        ip: &Ipv6Repr,
        target: Ipv6Addr,
        lladdr: Option<EthernetAddress>,
        mac: EthernetAddress,
    ) -> Outcome {
        if !self.limiter.admit(src, now) {
            return Outcome::Ignored(Ignored::RateLimited);
        }
        let dad = ip.src_addr.is_unspecified();
        let (eth_dst, ip_dst) = if dad {
            let all = icmpv6::ALL_NODES;
            (EthernetAddress::from_ipv6_multicast(all), all)
        } else {
            (lladdr.unwrap_or(src), ip.src_addr)
        };
        let na = NdRepr::Advert {
            flags: AdvertFlags {
                router: false,
                solicited: !dad,
                override_: true,
            },
            target,
            lladdr: Some(mac),
        };
        let frame = frame::nd(eth_dst, mac, self.config.vlan, target, ip_dst, &na);
        self.queue(frame);
        Outcome::Answered {
            target: IpAddr::V6(target),
        }
    }

    /// Another station (`mac`) uses the own address `ip`: report it, and
    /// defend the address with an announcement unless one went out within
    /// the defend interval (RFC 5227 §2.4 (b)).
    fn conflict(&mut self, now: Instant, ip: IpAddr, mac: EthernetAddress) -> Outcome {
        self.push_event(Event::Conflict { ip, mac });
        let interval = self.config.defend_interval;
        let defend = match self.own.get_mut(&ip) {
            Some(o) if o.defended_at.is_none_or(|t| now >= t.after(interval)) => {
                o.defended_at = Some(now);
                Some(o.mac)
            }
            _ => None,
        };
        if let Some(own_mac) = defend {
            self.counters.defended += 1;
            self.counters.announcements_sent += 1;
            let frame = frame::announcement(self.config.vlan, ip, own_mac);
            self.queue(frame);
        }
        Outcome::Ignored(Ignored::Conflict)
    }

    /// Apply `mac` for the tracked address `ip` by RFC 4861 §7.2.5 (RFC
    /// 826's merge for ARP); `None` if `ip` is not tracked — nothing is
    /// ever created here.
    fn apply(
        &mut self,
        now: Instant,
        ip: IpAddr,
        mac: Option<EthernetAddress>,
        claim: Claim,
    ) -> Option<Outcome> {
        let reachable = self.reachable_time();
        let e = self.cache.get_mut(&ip)?;
        let state = e.state_at(now);
        if state == State::Static {
            return Some(Outcome::Ignored(Ignored::StaticKept));
        }
        let mut event = None;
        // What the information proves: reachability (an answer to us), or
        // only a (new) MAC, which then has to be confirmed before use.
        let (mut confirm, mut restale) = (false, false);
        let outcome = match (state, mac, e.mac) {
            // An answer without an address confirms the cached one at most.
            (State::Incomplete | State::Failed, None, _) => Outcome::Ignored(Ignored::NotApplied),
            (_, None, Some(cached)) if claim.solicited => {
                confirm = true;
                Outcome::Learned { ip, mac: cached }
            }
            (_, None, _) => Outcome::Ignored(Ignored::NotApplied),
            // An answer (late ones too: a failed entry was asked about).
            (State::Incomplete | State::Failed, Some(new), _) => {
                e.mac = Some(new);
                (confirm, restale) = (claim.solicited, !claim.solicited);
                event = Some(Event::Resolved { ip, mac: new });
                Outcome::Learned { ip, mac: new }
            }
            // The same MAC: confirmed if solicited, otherwise unchanged.
            (_, Some(new), Some(cached)) if new == cached => {
                confirm = claim.solicited;
                Outcome::Learned { ip, mac: new }
            }
            (_, Some(new), old) if claim.override_ => {
                e.mac = Some(new);
                (confirm, restale) = (claim.solicited, !claim.solicited);
                if let Some(old) = old {
                    event = Some(Event::MacChanged { ip, old, new });
                }
                Outcome::Learned { ip, mac: new }
            }
            // A different MAC without Override: a reachable entry turns
            // stale (someone disagrees), the MAC stays.
            (_, Some(_), _) => {
                if state == State::Reachable {
                    e.state = State::Stale;
                    e.reachable_until = now;
                }
                Outcome::Ignored(Ignored::NotApplied)
            }
        };
        if confirm || restale {
            e.state = if confirm {
                State::Reachable
            } else {
                State::Stale
            };
            e.reachable_until = if confirm { now.after(reachable) } else { now };
            // Reachable and Stale run no timer (Stale starts one when used).
            e.deadline = None;
            e.tries = 0;
            e.since = now;
        }
        match event {
            Some(ev @ Event::Resolved { .. }) => {
                self.counters.resolved += 1;
                self.push_event(ev);
            }
            Some(ev) => {
                self.counters.mac_changed += 1;
                self.push_event(ev);
            }
            None => {}
        }
        Some(outcome)
    }
}
