//! The L2 neighbour layer of a port that has no kernel netdev: an ARP
//! (RFC 826) and IPv6 neighbour discovery (RFC 4861) responder for the
//! port's own addresses (its GIDs' IP addresses) and a resolver with a
//! neighbour cache for its peers — sans-IO, like the transport engine.
//!
//! A ConnectX function bound to vfio-pci has no kernel netdev, so nobody
//! else answers ARP or neighbour solicitations for its GIDs or finds a
//! peer's MAC. The driver (`rnic-mlx5`) feeds [`Neighbours`] the frames its
//! flow table steers to the raw Ethernet receive queue and posts the frames
//! it hands back on the raw Ethernet send queue; the emulator's tests feed
//! it frames from a veth or a QEMU socket link. Nothing here does I/O or
//! reads a clock: time is an [`Instant`] the caller passes in.
//!
//! # Driving it
//!
//! | input | output |
//! |---|---|
//! | [`Neighbours::on_frame`] for every received frame | an [`Outcome`] (answered, learned, or why not — every frame is counted by cause in [`Counters`]) |
//! | [`Neighbours::resolve`] when a QP or address handle needs a peer's MAC | a [`Resolution`]: [`Known`](Resolution::Known), [`Pending`](Resolution::Pending) until a deadline, or [`Failed`](Resolution::Failed) naming the address and the tries |
//! | [`Neighbours::poll`] at [`Neighbours::next_deadline`] | retransmissions, probes, announcements; failures |
//! | [`Neighbours::add_own`] / [`remove_own`](Neighbours::remove_own) when a GID is set or cleared | a gratuitous ARP / unsolicited advertisement |
//! | [`Neighbours::set_static`] / [`remove_static`](Neighbours::remove_static) for networks without ARP | |
//! | [`Neighbours::confirm`] when the peer is known to be alive (an ACK arrived) | |
//!
//! After any call, drain [`Neighbours::transmit`] (complete Ethernet frames,
//! VLAN-tagged when [`Config::vlan`] says so, ready to post as they are) and
//! [`Neighbours::event`] ([`Event::Resolved`] wakes whoever waits for a
//! [`Resolution::Pending`], [`Event::Failed`] ends that wait with an error).
//! [`Neighbours::entries`] lists the cache for `rnicctl neigh`.
//!
//! # States and timers (RFC 4861 §7.3.2, Linux's defaults)
//!
//! An entry exists only because [`Neighbours::resolve`] or
//! [`Neighbours::set_static`] created it. [`State::Incomplete`]: a
//! broadcast ARP request or a multicast solicitation (to the target's
//! solicited-node address) every [`Config::retrans_time`] (1 s), at most
//! [`Config::mcast_solicit`] (3) times, then [`State::Failed`]. An answer
//! makes it [`State::Reachable`] for a random 0.5–1.5 ×
//! [`Config::base_reachable_time`] (30 s), then [`State::Stale`]; a stale
//! entry still resolves, and its first use starts [`State::Delay`]
//! ([`Config::delay_first_probe_time`], 5 s) then [`State::Probe`]: up to
//! [`Config::ucast_solicit`] (3) unicast probes 1 s apart, then Failed. A
//! failed entry answers `Failed` for [`Config::failed_hold`] (3 s); a
//! resolve after that starts over. [`State::Static`] entries never change.
//!
//! # What is answered, learned and ignored
//!
//! * Answered: an ARP request, and a neighbour solicitation sent to the
//!   target's solicited-node or unicast address, whose target is an own
//!   address — a unicast reply from that address's MAC; a duplicate address
//!   detection probe for an own address gets an advertisement to all nodes
//!   (the address is defended). Replies are rate-limited per source MAC and
//!   in total ([`Config::reply_per_source`], [`Config::reply_total`]).
//! * Learned: replies, advertisements and requests whose sender (ARP) or
//!   target (advertisement) is an address the cache already tracks, by the
//!   rules of RFC 4861 §7.2.5 (a solicited answer confirms reachability; a
//!   different MAC without the Override flag is not applied).
//! * Ignored and counted: frames for other MACs or VLANs, own reflected
//!   frames, other protocols, router discovery, requests for other
//!   addresses, replies nobody asked for (they never create an entry),
//!   information that would change a static entry, another station
//!   claiming an own address ([`Event::Conflict`]; the address is defended
//!   by an announcement at most every [`Config::defend_interval`]).
//! * Malformed and counted by cause: truncation, foreign ARP formats, bad
//!   ICMPv6 checksums, hop limits other than 255, the other RFC 4861
//!   validity rules, group addresses where a station's belongs.
//!
//! # Bounded memory
//!
//! At most [`Config::max_entries`] cache entries (the least recently used
//! learned entry makes room; static and incomplete ones are never evicted),
//! [`Config::max_incomplete`] resolutions at once, [`Config::max_own`] own
//! addresses, [`Config::rate_sources`] rate-limited sources, and bounded
//! transmit and event queues. No received frame creates state.
//!
//! # Example
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use rnic_roce::neigh::{Config, Event, Instant, Neighbours, Resolution};
//! use rnic_roce::wire::{arp, EthernetAddress};
//!
//! let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
//! let mut n = Neighbours::new(Config::default())?;
//! let t0 = Instant::from_nanos(0);
//! n.add_own(t0, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), mac)?;
//! let garp = n.transmit().expect("a gratuitous ARP");
//! assert_eq!(&garp[..6], &[0xff; 6]);
//!
//! let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
//! assert!(matches!(n.resolve(t0, peer)?, Resolution::Pending { .. }));
//! let request = n.transmit().expect("an ARP request");
//!
//! // The peer answers: build its reply to our request.
//! let asked = arp::Repr::parse(&arp::Packet::new_checked(&request[14..])?)?;
//! let peer_mac = EthernetAddress([2, 0, 0, 0, 0, 2]);
//! let mut reply = [0u8; 42];
//! reply[..6].copy_from_slice(&mac.0);
//! reply[6..12].copy_from_slice(&peer_mac.0);
//! reply[12..14].copy_from_slice(&[0x08, 0x06]);
//! arp::Repr::reply_to(&asked, peer_mac).emit(&mut reply[14..])?;
//! n.on_frame(t0, &reply);
//!
//! assert_eq!(n.event(), Some(Event::Resolved { ip: peer, mac: peer_mac }));
//! assert_eq!(n.resolve(t0, peer)?, Resolution::Known(peer_mac));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod counters;
mod frame;
mod limit;
mod rx;
#[cfg(test)]
mod tests;

use core::fmt;
use core::time::Duration;
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use self::counters::{Counters, IgnoredCounts, MalformedCounts};
pub use self::frame::{Frame, MAX_FRAME_LEN};
pub use self::limit::Rate;
pub use crate::transport::Instant;
use crate::wire::{EthernetAddress, NdViolation, VlanTag};

/// The engine's knobs. The defaults are Linux's neighbour defaults
/// (`ucast_solicit` 3, `mcast_solicit` 3, `retrans_time_ms` 1000,
/// `base_reachable_time_ms` 30000, `delay_first_probe_time` 5 s,
/// `gc_thresh3` 1024 entries) and RFC 4861's constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The 802.1Q tag (VLAN id and priority) frames are sent with; received
    /// frames must be untagged (the NIC may strip the tag) or carry this
    /// VLAN id (0 when `None`: priority-tagged frames).
    pub vlan: Option<VlanTag>,
    /// Broadcast/multicast solicitations before an unresolved address fails.
    pub mcast_solicit: u32,
    /// Unicast probes before a stale entry that does not answer fails.
    pub ucast_solicit: u32,
    /// Time between solicitations (RFC 4861 RetransTimer).
    pub retrans_time: Duration,
    /// An answer keeps an entry reachable for a random 0.5–1.5 times this.
    pub base_reachable_time: Duration,
    /// How long a stale entry in use waits for a confirmation before probing.
    pub delay_first_probe_time: Duration,
    /// How long a failed entry answers `Failed` before a resolve starts over.
    pub failed_hold: Duration,
    /// Announcements (gratuitous ARP / unsolicited advertisement) sent when
    /// an own address is added, `retrans_time` apart (RFC 4861's
    /// MAX_NEIGHBOR_ADVERTISEMENT is 3).
    pub announcements: u32,
    /// Least time between two defences of an own address another station
    /// claims (RFC 5227 DEFEND_INTERVAL).
    pub defend_interval: Duration,
    /// Cache entries, static ones included.
    pub max_entries: usize,
    /// Resolutions in progress at once.
    pub max_incomplete: usize,
    /// Own addresses (the GID table's IP addresses).
    pub max_own: usize,
    /// Reply rate per source MAC.
    pub reply_per_source: Rate,
    /// Reply rate of the whole port.
    pub reply_total: Rate,
    /// Source MACs the per-source limit tracks at once.
    pub rate_sources: usize,
    /// Frames waiting in the transmit queue before new ones are dropped.
    pub tx_queue: usize,
    /// Events waiting before the oldest is dropped.
    pub event_queue: usize,
    /// Seed of the generator that randomises the reachable time.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            vlan: None,
            mcast_solicit: 3,
            ucast_solicit: 3,
            retrans_time: Duration::from_secs(1),
            base_reachable_time: Duration::from_secs(30),
            delay_first_probe_time: Duration::from_secs(5),
            failed_hold: Duration::from_secs(3),
            announcements: 3,
            defend_interval: Duration::from_secs(10),
            max_entries: 1024,
            max_incomplete: 256,
            max_own: 256,
            reply_per_source: Rate {
                burst: 10,
                per_second: 10,
            },
            reply_total: Rate {
                burst: 256,
                per_second: 2000,
            },
            rate_sources: 64,
            tx_queue: 512,
            event_queue: 1024,
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<(), Error> {
        let bad = |field, why| Err(Error::Config { field, why });
        if self.mcast_solicit == 0 {
            return bad("mcast_solicit", "must be at least 1");
        }
        if self.ucast_solicit == 0 {
            return bad("ucast_solicit", "must be at least 1");
        }
        if self.retrans_time.is_zero() {
            return bad("retrans_time", "must be longer than 0");
        }
        if self.max_entries == 0 || self.max_incomplete == 0 || self.max_own == 0 {
            return bad("max_entries/max_incomplete/max_own", "must be at least 1");
        }
        if self.tx_queue == 0 || self.event_queue == 0 {
            return bad("tx_queue/event_queue", "must be at least 1");
        }
        if let Some(tag) = self.vlan
            && (tag.vid > 4094 || tag.pcp > 7)
        {
            return bad("vlan", "needs a VLAN id 0..=4094 and a priority 0..=7");
        }
        Ok(())
    }
}

/// A cache entry's state (RFC 4861 §7.3.2, plus Failed and Static as in
/// Linux's `ip neigh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Being resolved: solicitations sent, no answer yet.
    Incomplete,
    /// Answered within the reachable time.
    Reachable,
    /// Has a MAC that has not been confirmed lately; still used.
    Stale,
    /// Stale and in use: waiting for a confirmation before probing.
    Delay,
    /// Sending unicast probes.
    Probe,
    /// No answer to the last solicitations or probes.
    Failed,
    /// Set by [`Neighbours::set_static`]; never changed by the network.
    Static,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Incomplete => "INCOMPLETE",
            State::Reachable => "REACHABLE",
            State::Stale => "STALE",
            State::Delay => "DELAY",
            State::Probe => "PROBE",
            State::Failed => "FAILED",
            State::Static => "PERMANENT",
        })
    }
}

/// One cache entry, as [`Neighbours::entries`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// The peer's address.
    pub ip: IpAddr,
    /// Its MAC (none while incomplete or failed).
    pub mac: Option<EthernetAddress>,
    /// Its state.
    pub state: State,
    /// Time since the MAC was last set or confirmed (incomplete: since the
    /// resolution started; failed: since it failed; static: since set).
    pub age: Duration,
    /// Solicitations or probes sent in the current (or last) attempt.
    pub tries: u32,
}

impl Neighbour {
    /// Whether the entry was set by [`Neighbours::set_static`] rather than learned.
    pub fn is_static(&self) -> bool {
        self.state == State::Static
    }
}

impl fmt::Display for Neighbour {
    /// `ip neigh`'s format: `10.0.0.2 lladdr 02:00:00:00:00:02 REACHABLE age 1.5s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ip)?;
        if let Some(mac) = self.mac {
            write!(f, " lladdr {mac}")?;
        }
        write!(f, " {} age {:.1?}", self.state, self.age)?;
        if matches!(self.state, State::Incomplete | State::Probe | State::Failed) {
            write!(f, " tries {}", self.tries)?;
        }
        Ok(())
    }
}

/// The answer to [`Neighbours::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Use this MAC (multicast addresses map to their group MAC; own
    /// addresses to their own MAC).
    Known(EthernetAddress),
    /// Solicitations are out; an [`Event::Resolved`] or [`Event::Failed`]
    /// for the address follows by `deadline` (if [`Neighbours::poll`] is
    /// called on time).
    Pending {
        /// When the last solicitation times out.
        deadline: Instant,
    },
    /// The address did not answer `tries` solicitations or probes.
    Failed {
        /// The address that did not answer.
        ip: IpAddr,
        /// Solicitations or probes sent.
        tries: u32,
    },
}

/// What changed, for whoever waits on the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An address being resolved got its MAC.
    Resolved {
        /// The address.
        ip: IpAddr,
        /// Its MAC.
        mac: EthernetAddress,
    },
    /// An address did not answer: resolution or probing ran out of tries.
    Failed {
        /// The address.
        ip: IpAddr,
        /// Solicitations or probes sent.
        tries: u32,
    },
    /// A known address moved to another MAC.
    MacChanged {
        /// The address.
        ip: IpAddr,
        /// The MAC it had.
        old: EthernetAddress,
        /// The MAC it has now.
        new: EthernetAddress,
    },
    /// Another station (`mac`) claims the own address `ip`.
    Conflict {
        /// The own address.
        ip: IpAddr,
        /// The other station's MAC.
        mac: EthernetAddress,
    },
}

/// What [`Neighbours::on_frame`] did with a frame. Each maps to one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A request for an own address: a reply is queued.
    Answered {
        /// The own address asked for.
        target: IpAddr,
    },
    /// A tracked entry was given, confirmed or updated its MAC.
    Learned {
        /// The entry's address.
        ip: IpAddr,
        /// Its MAC now.
        mac: EthernetAddress,
    },
    /// Well-formed, nothing to do.
    Ignored(Ignored),
    /// Not well-formed.
    Malformed(Malformed),
}

/// Why a well-formed frame was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ignored {
    /// Unicast to a MAC that is not one of the own addresses' (or a
    /// multicast group other than broadcast and IPv6's 33:33:…).
    OtherMac,
    /// Tagged with another VLAN id.
    OtherVlan,
    /// Sent from an own MAC: our own frame reflected back.
    OwnFrame,
    /// Neither ARP nor neighbour discovery.
    OtherProtocol,
    /// Router solicitation, advertisement or redirect: rnic is not a router
    /// and takes no configuration from them.
    RouterDiscovery,
    /// A request for an address that is not ours from a sender not tracked.
    NotForUs,
    /// A reply or advertisement for an address nobody asked to resolve.
    Unsolicited,
    /// It would have changed a static entry.
    StaticKept,
    /// Another station claims an own address.
    Conflict,
    /// A request for an own address beyond the reply rate limits.
    RateLimited,
    /// An advertisement RFC 4861 §7.2.5 says not to apply.
    NotApplied,
}

/// Why a frame is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Malformed {
    /// A header or length field runs past the end of the frame.
    Truncated,
    /// The Ethernet source is a group address.
    EthernetSource,
    /// ARP for another hardware/protocol type or address lengths.
    ArpFormat,
    /// ARP operation neither request nor reply.
    ArpOperation,
    /// ARP sender hardware address not unicast, or sender protocol address
    /// multicast, broadcast or loopback.
    ArpAddress,
    /// IPv6 header of the wrong version, or from a multicast source.
    Ipv6Header,
    /// Wrong ICMPv6 checksum.
    Icmpv6Checksum,
    /// Neighbour discovery with a hop limit other than 255.
    NdHopLimit(u8),
    /// Neighbour discovery breaking another RFC 4861 validity rule.
    Nd(NdViolation),
    /// A link-layer address option that is not a unicast MAC.
    NdLinkLayerAddress,
}

/// Errors of the neighbour engine's control calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is unusable.
    #[error("invalid neighbour configuration: {field} {why}")]
    Config {
        /// The field at fault.
        field: &'static str,
        /// What it must be.
        why: &'static str,
    },
    /// The address is not one a neighbour can have (unspecified, loopback).
    #[error("{ip} cannot be resolved on a link: give a peer's unicast or a multicast address")]
    Unresolvable {
        /// The address.
        ip: IpAddr,
    },
    /// No own address of the target's family to solicit from.
    #[error(
        "no own IPv{family} address to send the solicitation for {ip} from: add the GID's address first (Neighbours::add_own)"
    )]
    NoSourceAddress {
        /// The address to resolve.
        ip: IpAddr,
        /// 4 or 6.
        family: u8,
    },
    /// Every entry is static or being resolved.
    #[error(
        "neighbour cache full ({capacity} entries, none evictable): remove static entries or raise Config::max_entries"
    )]
    CacheFull {
        /// Config::max_entries.
        capacity: usize,
    },
    /// Too many resolutions at once.
    #[error(
        "{limit} resolutions already in progress: wait for one to finish or raise Config::max_incomplete"
    )]
    TooManyPending {
        /// Config::max_incomplete.
        limit: usize,
    },
    /// The own address table is full.
    #[error("{capacity} own addresses already: remove one or raise Config::max_own")]
    OwnTableFull {
        /// Config::max_own.
        capacity: usize,
    },
    /// Not an address a station can own or have as a neighbour.
    #[error(
        "{ip} is not a unicast address (unspecified, loopback, multicast or broadcast): give a station's address"
    )]
    NotUnicastIp {
        /// The address.
        ip: IpAddr,
    },
    /// Not a MAC a station can have.
    #[error("{mac} is not a unicast MAC: give a station's address (I/G bit clear, not all zeros)")]
    NotUnicastMac {
        /// The MAC.
        mac: EthernetAddress,
    },
    /// A static entry for an own address.
    #[error("{ip} is an own address: remove it with remove_own first")]
    OwnAddress {
        /// The address.
        ip: IpAddr,
    },
}

/// A cache entry.
#[derive(Debug, Clone)]
struct Entry {
    mac: Option<EthernetAddress>,
    state: State,
    tries: u32,
    /// The next retransmission, probe or end of Delay.
    deadline: Option<Instant>,
    /// See [`Neighbour::age`].
    since: Instant,
    /// When Reachable turns Stale.
    reachable_until: Instant,
    /// Last resolve or confirm: the eviction order.
    used: Instant,
    /// Incomplete: when the last solicitation times out.
    gives_up: Instant,
}

impl Entry {
    /// The state at `now` (Reachable turns Stale by itself).
    fn state_at(&self, now: Instant) -> State {
        if self.state == State::Reachable && now >= self.reachable_until {
            State::Stale
        } else {
            self.state
        }
    }
}

/// An own address.
#[derive(Debug, Clone)]
struct Own {
    mac: EthernetAddress,
    announce_left: u32,
    announce_at: Option<Instant>,
    defended_at: Option<Instant>,
}

/// The neighbour engine: own addresses, static entries and the cache (see
/// the [module docs](self)).
#[derive(Debug)]
pub struct Neighbours {
    config: Config,
    own: BTreeMap<IpAddr, Own>,
    cache: BTreeMap<IpAddr, Entry>,
    limiter: limit::Limiter,
    tx: VecDeque<Frame>,
    events: VecDeque<Event>,
    counters: Counters,
    rng: u64,
}

/// Whether a station can have `ip`: not unspecified, loopback, multicast or
/// the IPv4 limited broadcast.
fn is_station_ip(ip: IpAddr) -> bool {
    !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast())
        && ip != IpAddr::V4(Ipv4Addr::BROADCAST)
}

/// IPv6 link-local unicast (fe80::/10).
fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// How well `own` suits as the source of a solicitation for `target` of the
/// same family: same IPv6 scope first, then the longest common prefix.
fn source_rank(own: IpAddr, target: IpAddr) -> Option<(bool, u32)> {
    match (own, target) {
        (IpAddr::V4(o), IpAddr::V4(t)) => Some((true, (o.to_bits() ^ t.to_bits()).leading_zeros())),
        (IpAddr::V6(o), IpAddr::V6(t)) => Some((
            is_link_local(o) == is_link_local(t),
            (o.to_bits() ^ t.to_bits()).leading_zeros(),
        )),
        _ => None,
    }
}

impl Neighbours {
    /// An engine with no own addresses and an empty cache.
    pub fn new(config: Config) -> Result<Neighbours, Error> {
        config.validate()?;
        Ok(Neighbours {
            limiter: limit::Limiter::new(
                config.reply_per_source,
                config.reply_total,
                config.rate_sources,
            ),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            own: BTreeMap::new(),
            cache: BTreeMap::new(),
            counters: Counters::default(),
            rng: config.seed | 1,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Answer for `ip` with `mac` from now on (a GID was set), and announce
    /// it: a gratuitous ARP or an unsolicited advertisement now, and
    /// [`Config::announcements`] in all `retrans_time` apart. A cache entry
    /// for `ip` is dropped (the address is ours now). Adding an address
    /// again (another MAC, say) replaces it and announces again.
    pub fn add_own(&mut self, now: Instant, ip: IpAddr, mac: EthernetAddress) -> Result<(), Error> {
        if !is_station_ip(ip) {
            return Err(Error::NotUnicastIp { ip });
        }
        if !mac.is_unicast() {
            return Err(Error::NotUnicastMac { mac });
        }
        if !self.own.contains_key(&ip) && self.own.len() >= self.config.max_own {
            return Err(Error::OwnTableFull {
                capacity: self.config.max_own,
            });
        }
        self.cache.remove(&ip);
        let left = self.config.announcements;
        self.own.insert(
            ip,
            Own {
                mac,
                announce_left: left,
                announce_at: (left > 0).then_some(now),
                defended_at: None,
            },
        );
        self.announce_due(now);
        Ok(())
    }

    /// Stop answering for `ip` (pending announcements are dropped); whether
    /// it was an own address.
    pub fn remove_own(&mut self, ip: IpAddr) -> bool {
        self.own.remove(&ip).is_some()
    }

    /// The own addresses and their MACs, in address order.
    pub fn own_addresses(&self) -> impl Iterator<Item = (IpAddr, EthernetAddress)> + '_ {
        self.own.iter().map(|(ip, o)| (*ip, o.mac))
    }

    /// Pin `ip` to `mac` (for networks without ARP, or to override it):
    /// frames never change a static entry. Replaces a learned entry; one
    /// being resolved completes ([`Event::Resolved`]).
    pub fn set_static(
        &mut self,
        now: Instant,
        ip: IpAddr,
        mac: EthernetAddress,
    ) -> Result<(), Error> {
        if !is_station_ip(ip) {
            return Err(Error::NotUnicastIp { ip });
        }
        if !mac.is_unicast() {
            return Err(Error::NotUnicastMac { mac });
        }
        if self.own.contains_key(&ip) {
            return Err(Error::OwnAddress { ip });
        }
        let was_incomplete = match self.cache.get(&ip) {
            Some(e) => e.state == State::Incomplete,
            None => {
                self.make_room()?;
                false
            }
        };
        self.cache.insert(
            ip,
            Entry {
                mac: Some(mac),
                state: State::Static,
                tries: 0,
                deadline: None,
                since: now,
                reachable_until: now,
                used: now,
                gives_up: now,
            },
        );
        if was_incomplete {
            self.counters.resolved += 1;
            self.push_event(Event::Resolved { ip, mac });
        }
        Ok(())
    }

    /// Remove the static entry for `ip`; whether there was one (learned
    /// entries are left alone).
    pub fn remove_static(&mut self, ip: IpAddr) -> bool {
        if self
            .cache
            .get(&ip)
            .is_some_and(|e| e.state == State::Static)
        {
            self.cache.remove(&ip);
            true
        } else {
            false
        }
    }

    /// Drop the learned entry for `ip` (`ip neigh del`); whether there was
    /// one. Static entries stay (use [`Neighbours::remove_static`]).
    pub fn forget(&mut self, ip: IpAddr) -> bool {
        if self
            .cache
            .get(&ip)
            .is_some_and(|e| e.state != State::Static)
        {
            self.cache.remove(&ip);
            true
        } else {
            false
        }
    }

    /// The MAC to send to `ip`, starting or continuing its resolution.
    ///
    /// Multicast addresses map to their group MAC and 255.255.255.255 to
    /// broadcast, with no entry; an own address gives its own MAC. A stale
    /// entry is returned as known and starts the Delay → Probe check.
    pub fn resolve(&mut self, now: Instant, ip: IpAddr) -> Result<Resolution, Error> {
        if ip.is_unspecified() || ip.is_loopback() {
            return Err(Error::Unresolvable { ip });
        }
        match ip {
            IpAddr::V4(v4) if v4.is_broadcast() => {
                return Ok(Resolution::Known(EthernetAddress::BROADCAST));
            }
            IpAddr::V4(v4) if v4.is_multicast() => {
                return Ok(Resolution::Known(EthernetAddress::from_ipv4_multicast(v4)));
            }
            IpAddr::V6(v6) if v6.is_multicast() => {
                return Ok(Resolution::Known(EthernetAddress::from_ipv6_multicast(v6)));
            }
            _ => {}
        }
        if let Some(own) = self.own.get(&ip) {
            return Ok(Resolution::Known(own.mac));
        }
        let delay = self.config.delay_first_probe_time;
        let failed_hold = self.config.failed_hold;
        if let Some(e) = self.cache.get_mut(&ip) {
            e.used = now;
            match (e.state_at(now), e.mac) {
                (State::Incomplete, _) => {
                    return Ok(Resolution::Pending {
                        deadline: e.gives_up,
                    });
                }
                (State::Failed, _) if now < e.since.after(failed_hold) => {
                    return Ok(Resolution::Failed { ip, tries: e.tries });
                }
                (State::Failed, _) => {} // start over below
                (State::Stale, Some(mac)) => {
                    e.state = State::Delay;
                    e.deadline = Some(now.after(delay));
                    return Ok(Resolution::Known(mac));
                }
                (_, Some(mac)) => return Ok(Resolution::Known(mac)),
                // Only Incomplete and Failed entries lack a MAC.
                (_, None) => {}
            }
        }
        self.start_resolution(now, ip)
    }

    /// Create (or restart) an incomplete entry for `ip` and send the first
    /// solicitation.
    fn start_resolution(&mut self, now: Instant, ip: IpAddr) -> Result<Resolution, Error> {
        let family = if ip.is_ipv4() { 4 } else { 6 };
        let source = self
            .source_for(ip)
            .ok_or(Error::NoSourceAddress { ip, family })?;
        let incomplete = self
            .cache
            .values()
            .filter(|e| e.state == State::Incomplete)
            .count();
        if incomplete >= self.config.max_incomplete {
            return Err(Error::TooManyPending {
                limit: self.config.max_incomplete,
            });
        }
        if !self.cache.contains_key(&ip) {
            self.make_room()?;
        }
        let retrans = self.config.retrans_time;
        let tries = self.config.mcast_solicit;
        let gives_up = now.after(retrans.saturating_mul(tries));
        self.cache.insert(
            ip,
            Entry {
                mac: None,
                state: State::Incomplete,
                tries: 1,
                deadline: Some(now.after(retrans)),
                since: now,
                reachable_until: now,
                used: now,
                gives_up,
            },
        );
        self.counters.solicitations_sent += 1;
        let frame = frame::solicitation(self.config.vlan, source, ip, None);
        self.queue(frame);
        Ok(Resolution::Pending { deadline: gives_up })
    }

    /// Evict one learned entry if the cache is full: failed first, then
    /// stale, then the rest, least recently used first; never static or
    /// incomplete entries.
    fn make_room(&mut self) -> Result<(), Error> {
        if self.cache.len() < self.config.max_entries {
            return Ok(());
        }
        let victim = self
            .cache
            .iter()
            .filter(|(_, e)| !matches!(e.state, State::Static | State::Incomplete))
            .min_by_key(|(_, e)| {
                let rank = match e.state_at(e.used) {
                    State::Failed => 0,
                    State::Stale => 1,
                    _ => 2,
                };
                (rank, e.used)
            })
            .map(|(ip, _)| *ip);
        let ip = victim.ok_or(Error::CacheFull {
            capacity: self.config.max_entries,
        })?;
        self.cache.remove(&ip);
        self.counters.evicted += 1;
        Ok(())
    }

    /// The own address (and its MAC) to solicit `target` from.
    fn source_for(&self, target: IpAddr) -> Option<(IpAddr, EthernetAddress)> {
        self.own
            .iter()
            .filter_map(|(ip, o)| source_rank(*ip, target).map(|r| (r, *ip, o.mac)))
            // Ties go to the lowest address (max_by_key keeps the last maximum).
            .rev()
            .max_by_key(|(r, _, _)| *r)
            .map(|(_, ip, mac)| (ip, mac))
    }

    /// The entry for `ip` as [`Neighbours::entries`] would list it, with no
    /// side effects (for waiters that must not restart a resolution).
    pub fn lookup(&self, now: Instant, ip: IpAddr) -> Option<Neighbour> {
        self.cache.get(&ip).map(|e| Self::listing(now, ip, e))
    }

    fn listing(now: Instant, ip: IpAddr, e: &Entry) -> Neighbour {
        Neighbour {
            ip,
            mac: e.mac,
            state: e.state_at(now),
            age: Duration::from_nanos(now.nanos().saturating_sub(e.since.nanos())),
            tries: e.tries,
        }
    }

    /// Every cache entry, in address order (`rnicctl neigh`).
    pub fn entries(&self, now: Instant) -> Vec<Neighbour> {
        self.cache
            .iter()
            .map(|(ip, e)| Self::listing(now, *ip, e))
            .collect()
    }

    /// Cache entries (static ones included).
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The peer at `ip` is alive (an upper layer heard from it, e.g. an RC
    /// ACK arrived): a learned entry with a MAC becomes reachable again,
    /// which spares the probes. Whether there was such an entry.
    pub fn confirm(&mut self, now: Instant, ip: IpAddr) -> bool {
        let reachable = self.reachable_time();
        match self.cache.get_mut(&ip) {
            Some(e) if e.mac.is_some() && !matches!(e.state, State::Static | State::Failed) => {
                e.state = State::Reachable;
                e.reachable_until = now.after(reachable);
                e.since = now;
                e.used = now;
                e.deadline = None;
                e.tries = 0;
                true
            }
            _ => false,
        }
    }

    /// Run the timers due at `now`: retransmit solicitations, move Delay to
    /// Probe, send probes, fail entries out of tries, send announcements.
    pub fn poll(&mut self, now: Instant) {
        let due: Vec<IpAddr> = self
            .cache
            .iter()
            .filter(|(_, e)| e.deadline.is_some_and(|d| d <= now))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in due {
            self.entry_timer(now, ip);
        }
        self.announce_due(now);
    }

    fn entry_timer(&mut self, now: Instant, ip: IpAddr) {
        let cfg = &self.config;
        let (retrans, mcast, ucast) = (cfg.retrans_time, cfg.mcast_solicit, cfg.ucast_solicit);
        let source = self.source_for(ip);
        let Some(e) = self.cache.get_mut(&ip) else {
            return;
        };
        let (limit, probe) = match e.state {
            State::Incomplete => (mcast, None),
            State::Delay => {
                e.state = State::Probe;
                e.tries = 0;
                (ucast, e.mac)
            }
            State::Probe => (ucast, e.mac),
            _ => {
                e.deadline = None;
                return;
            }
        };
        if e.tries >= limit || source.is_none() {
            // Out of tries (or the own address to solicit from is gone).
            let tries = e.tries;
            e.state = State::Failed;
            e.mac = None;
            e.deadline = None;
            e.since = now;
            self.counters.failed += 1;
            self.push_event(Event::Failed { ip, tries });
            return;
        }
        e.tries += 1;
        e.deadline = Some(now.after(retrans));
        if probe.is_some() {
            self.counters.probes_sent += 1;
        } else {
            self.counters.solicitations_sent += 1;
        }
        if let Some(source) = source {
            let frame = frame::solicitation(self.config.vlan, source, ip, probe);
            self.queue(frame);
        }
    }

    /// Send the announcements due at `now`.
    fn announce_due(&mut self, now: Instant) {
        let retrans = self.config.retrans_time;
        let mut due = Vec::new();
        for (ip, o) in &mut self.own {
            if o.announce_at.is_some_and(|t| t <= now) && o.announce_left > 0 {
                o.announce_left -= 1;
                o.announce_at = (o.announce_left > 0).then(|| now.after(retrans));
                due.push((*ip, o.mac));
            }
        }
        for (ip, mac) in due {
            self.counters.announcements_sent += 1;
            let frame = frame::announcement(self.config.vlan, ip, mac);
            self.queue(frame);
        }
    }

    /// When [`Neighbours::poll`] has something to do next.
    pub fn next_deadline(&self) -> Option<Instant> {
        let entries = self.cache.values().filter_map(|e| e.deadline);
        let own = self
            .own
            .values()
            .filter(|o| o.announce_left > 0)
            .filter_map(|o| o.announce_at);
        entries.chain(own).min()
    }

    /// The next frame to transmit, oldest first.
    pub fn transmit(&mut self) -> Option<Frame> {
        self.tx.pop_front()
    }

    /// Frames waiting in the transmit queue.
    pub fn pending_transmit(&self) -> usize {
        self.tx.len()
    }

    /// The next event, oldest first.
    pub fn event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn queue(&mut self, frame: Result<Frame, crate::wire::Error>) {
        match frame {
            Ok(f) if self.tx.len() < self.config.tx_queue => self.tx.push_back(f),
            // Full, or a frame that could not be built (cannot happen: every
            // frame fits MAX_FRAME_LEN); either way it is not sent.
            _ => self.counters.tx_dropped += 1,
        }
    }

    fn push_event(&mut self, e: Event) {
        if self.events.len() >= self.config.event_queue {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    /// A reachable time: base × a random factor in [0.5, 1.5).
    fn reachable_time(&mut self) -> Duration {
        // xorshift64
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let base = self.config.base_reachable_time;
        let factor = 512 + u32::try_from(x % 1024).unwrap_or(0);
        base.saturating_mul(factor) / 1024
    }
}
