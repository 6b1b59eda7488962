//! The engine's counters: every received frame lands in exactly one
//! disposition (answered, learned, one ignore cause, one malformed cause),
//! so `frames_in` equals their sum; the rest count what was sent and what
//! happened to the cache.

use super::{Ignored, Malformed, Outcome};

/// Malformed frames by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MalformedCounts {
    /// A header, or a length field, runs past the end of the frame.
    pub truncated: u64,
    /// The Ethernet source address is a group address.
    pub ethernet_source: u64,
    /// ARP for another hardware/protocol type or address lengths.
    pub arp_format: u64,
    /// ARP operation neither request nor reply.
    pub arp_operation: u64,
    /// ARP sender hardware address not unicast, or sender protocol address
    /// multicast, broadcast or loopback.
    pub arp_address: u64,
    /// IPv6 header: wrong version, or a multicast source.
    pub ipv6_header: u64,
    /// ICMPv6 checksum wrong.
    pub icmpv6_checksum: u64,
    /// Neighbour discovery with a hop limit other than 255 (possibly
    /// forwarded from off-link).
    pub nd_hop_limit: u64,
    /// Neighbour discovery breaking another RFC 4861 validity rule.
    pub nd_rule: u64,
    /// A link-layer address option that is not a unicast MAC.
    pub nd_link_layer_address: u64,
}

impl MalformedCounts {
    /// Malformed frames of every cause.
    pub fn total(&self) -> u64 {
        self.truncated
            + self.ethernet_source
            + self.arp_format
            + self.arp_operation
            + self.arp_address
            + self.ipv6_header
            + self.icmpv6_checksum
            + self.nd_hop_limit
            + self.nd_rule
            + self.nd_link_layer_address
    }

    fn count(&mut self, m: Malformed) {
        let c = match m {
            Malformed::Truncated => &mut self.truncated,
            Malformed::EthernetSource => &mut self.ethernet_source,
            Malformed::ArpFormat => &mut self.arp_format,
            Malformed::ArpOperation => &mut self.arp_operation,
            Malformed::ArpAddress => &mut self.arp_address,
            Malformed::Ipv6Header => &mut self.ipv6_header,
            Malformed::Icmpv6Checksum => &mut self.icmpv6_checksum,
            Malformed::NdHopLimit(_) => &mut self.nd_hop_limit,
            Malformed::Nd(_) => &mut self.nd_rule,
            Malformed::NdLinkLayerAddress => &mut self.nd_link_layer_address,
        };
        *c += 1;
    }
}

/// Well-formed frames ignored, by cause (see [`Ignored`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IgnoredCounts {
    /// Unicast to a MAC that is not one of the own addresses'.
    pub other_mac: u64,
    /// Tagged with another VLAN.
    pub other_vlan: u64,
    /// Sent from one of the own MACs (a reflection of our own frame).
    pub own_frame: u64,
    /// Not ARP and not neighbour discovery.
    pub other_protocol: u64,
    /// Router solicitations, advertisements and redirects.
    pub router_discovery: u64,
    /// Requests for addresses that are not ours, from senders not tracked.
    pub not_for_us: u64,
    /// Replies and advertisements for addresses nobody asked to resolve.
    pub unsolicited: u64,
    /// Information that would have changed a static entry.
    pub static_kept: u64,
    /// Another station claims one of the own addresses.
    pub conflict: u64,
    /// Requests for an own address beyond the reply rate limits.
    pub rate_limited: u64,
    /// Advertisements RFC 4861 §7.2.5 says not to apply (no link-layer
    /// address, or a different one without the Override flag).
    pub not_applied: u64,
}

impl IgnoredCounts {
    /// Ignored frames of every cause.
    pub fn total(&self) -> u64 {
        self.other_mac
            + self.other_vlan
            + self.own_frame
            + self.other_protocol
            + self.router_discovery
            + self.not_for_us
            + self.unsolicited
            + self.static_kept
            + self.conflict
            + self.rate_limited
            + self.not_applied
    }

    fn count(&mut self, i: Ignored) {
        let c = match i {
            Ignored::OtherMac => &mut self.other_mac,
            Ignored::OtherVlan => &mut self.other_vlan,
            Ignored::OwnFrame => &mut self.own_frame,
            Ignored::OtherProtocol => &mut self.other_protocol,
            Ignored::RouterDiscovery => &mut self.router_discovery,
            Ignored::NotForUs => &mut self.not_for_us,
            Ignored::Unsolicited => &mut self.unsolicited,
            Ignored::StaticKept => &mut self.static_kept,
            Ignored::Conflict => &mut self.conflict,
            Ignored::RateLimited => &mut self.rate_limited,
            Ignored::NotApplied => &mut self.not_applied,
        };
        *c += 1;
    }
}

/// What the neighbour engine has seen and done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames handed to `on_frame`.
    pub frames_in: u64,
    /// ARP requests and neighbour solicitations for an own address
    /// answered (reply queued).
    pub answered: u64,
    /// Replies, advertisements and requests that gave a tracked entry its
    /// MAC or confirmed/updated it.
    pub learned: u64,
    /// Ignored frames by cause.
    pub ignored: IgnoredCounts,
    /// Malformed frames by cause.
    pub malformed: MalformedCounts,

    /// Broadcast/multicast solicitations sent to resolve an address
    /// (first tries and retransmissions).
    pub solicitations_sent: u64,
    /// Unicast probes sent to re-check a stale entry.
    pub probes_sent: u64,
    /// Gratuitous ARPs and unsolicited advertisements sent for own
    /// addresses (on `add_own`, and in defence of a claimed address).
    pub announcements_sent: u64,
    /// Announcements sent because another station claimed an own address.
    pub defended: u64,
    /// Frames not queued because the transmit queue was full.
    pub tx_dropped: u64,
    /// Events dropped because the event queue was full (the oldest goes).
    pub events_dropped: u64,

    /// Resolutions that completed (an incomplete entry got a MAC).
    pub resolved: u64,
    /// Resolutions and probes that ran out of tries.
    pub failed: u64,
    /// Entries whose MAC changed.
    pub mac_changed: u64,
    /// Learned entries evicted to make room for new ones.
    pub evicted: u64,
}

impl Counters {
    /// Answered + learned + ignored + malformed: every frame lands in
    /// exactly one, so this equals `frames_in`.
    pub fn dispositions(&self) -> u64 {
        self.answered + self.learned + self.ignored.total() + self.malformed.total()
    }

    pub(super) fn count(&mut self, o: &Outcome) {
        self.frames_in += 1;
        match *o {
            Outcome::Answered { .. } => self.answered += 1,
            Outcome::Learned { .. } => self.learned += 1,
            Outcome::Ignored(i) => self.ignored.count(i),
            Outcome::Malformed(m) => self.malformed.count(m),
        }
    }
}
