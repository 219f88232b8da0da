//! NATs for simulated hosts, with the behaviours RFC 4787 names: how a NAT maps an inside
//! socket to a public port ([`Mapping`]) and which outside datagrams it lets back in
//! ([`Filtering`]). The presets are the four classic kinds: [`NatConfig::full_cone`],
//! [`NatConfig::restricted_cone`], [`NatConfig::port_restricted`] and
//! [`NatConfig::symmetric`].
//!
//! A [`Nat`] translates: [`Nat::outbound`] gives the public source of a datagram an inside
//! socket sends (making a mapping if there is none), [`Nat::inbound`] the inside socket a
//! datagram to a public port goes to, or `None` where the NAT drops it. Ports are handed out in
//! order from [`NatConfig::first_port`], so a scenario replays exactly. Mappings do not expire
//! (a punching attempt lasts seconds; real NATs keep UDP mappings for tens of seconds at least).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

/// How an inside socket's datagrams get their public source port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// One public port per inside socket, whatever the destination ("cone").
    EndpointIndependent,
    /// A public port of its own for each destination address and port ("symmetric").
    EndpointDependent,
}

/// Which outside datagrams reach an inside socket through its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtering {
    /// Any ("full cone").
    EndpointIndependent,
    /// From an address the socket has sent to, any port ("restricted cone").
    AddressDependent,
    /// From an address and port the socket has sent to ("port-restricted").
    AddressAndPortDependent,
}

/// A NAT's behaviour and its public address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatConfig {
    /// Its public address.
    pub public_ip: IpAddr,
    /// How it maps.
    pub mapping: Mapping,
    /// How it filters.
    pub filtering: Filtering,
    /// The first public port it hands out.
    pub first_port: u16,
}

impl NatConfig {
    fn new(public_ip: IpAddr, mapping: Mapping, filtering: Filtering) -> NatConfig {
        NatConfig {
            public_ip,
            mapping,
            filtering,
            first_port: 40_000,
        }
    }

    /// One port per socket, anyone may send to it.
    pub fn full_cone(public_ip: IpAddr) -> NatConfig {
        NatConfig::new(
            public_ip,
            Mapping::EndpointIndependent,
            Filtering::EndpointIndependent,
        )
    }

    /// One port per socket, open to addresses it sent to.
    pub fn restricted_cone(public_ip: IpAddr) -> NatConfig {
        NatConfig::new(
            public_ip,
            Mapping::EndpointIndependent,
            Filtering::AddressDependent,
        )
    }

    /// One port per socket, open to the addresses and ports it sent to (most home routers).
    pub fn port_restricted(public_ip: IpAddr) -> NatConfig {
        NatConfig::new(
            public_ip,
            Mapping::EndpointIndependent,
            Filtering::AddressAndPortDependent,
        )
    }

    /// A port per destination, open only to that destination (Linux's masquerade when ports
    /// clash, many carrier-grade NATs).
    pub fn symmetric(public_ip: IpAddr) -> NatConfig {
        NatConfig::new(
            public_ip,
            Mapping::EndpointDependent,
            Filtering::AddressAndPortDependent,
        )
    }
}

/// One mapping: the inside socket, and where it has sent from this public port.
#[derive(Debug, Clone)]
struct Binding {
    inside: SocketAddr,
    sent_to: HashSet<SocketAddr>,
}

/// A NAT's state (see the module docs).
#[derive(Debug, Clone)]
pub struct Nat {
    cfg: NatConfig,
    next_port: u16,
    /// (inside socket, destination for endpoint-dependent mapping) -> public port.
    ports: HashMap<(SocketAddr, Option<SocketAddr>), u16>,
    bindings: HashMap<u16, Binding>,
    /// Datagrams dropped by the filter.
    pub filtered: u64,
}

impl Nat {
    /// A NAT with no mappings yet.
    pub fn new(cfg: NatConfig) -> Nat {
        Nat {
            next_port: cfg.first_port,
            cfg,
            ports: HashMap::new(),
            bindings: HashMap::new(),
            filtered: 0,
        }
    }

    /// Its public address.
    pub fn public_ip(&self) -> IpAddr {
        self.cfg.public_ip
    }

    /// The public source of a datagram `inside` sends to `to`.
    pub fn outbound(&mut self, inside: SocketAddr, to: SocketAddr) -> SocketAddr {
        let key = match self.cfg.mapping {
            Mapping::EndpointIndependent => (inside, None),
            Mapping::EndpointDependent => (inside, Some(to)),
        };
        let port = match self.ports.get(&key) {
            Some(&p) => p,
            None => {
                let p = self.next_port;
                self.next_port = self.next_port.wrapping_add(1).max(1024);
                self.ports.insert(key, p);
                self.bindings.insert(
                    p,
                    Binding {
                        inside,
                        sent_to: HashSet::new(),
                    },
                );
                p
            }
        };
        if let Some(b) = self.bindings.get_mut(&port) {
            b.sent_to.insert(to);
        }
        SocketAddr::new(self.cfg.public_ip, port)
    }

    /// The inside socket a datagram from `from` to public port `port` reaches, or `None`
    /// where there is no mapping or the filter drops it.
    pub fn inbound(&mut self, port: u16, from: SocketAddr) -> Option<SocketAddr> {
        let Some(b) = self.bindings.get(&port) else {
            self.filtered += 1;
            return None;
        };
        let open = match self.cfg.filtering {
            Filtering::EndpointIndependent => true,
            Filtering::AddressDependent => b.sent_to.iter().any(|a| a.ip() == from.ip()),
            Filtering::AddressAndPortDependent => b.sent_to.contains(&from),
        };
        if open {
            Some(b.inside)
        } else {
            self.filtered += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    const PUBLIC: &str = "198.51.100.1";

    fn nat(cfg: fn(IpAddr) -> NatConfig) -> Nat {
        Nat::new(cfg(PUBLIC.parse().unwrap()))
    }

    #[test]
    fn a_cone_keeps_one_port_and_a_symmetric_nat_gives_one_per_destination() {
        let inside = a("10.0.0.2:5000");
        let (r, p) = (a("203.0.113.1:7401"), a("192.0.2.9:6000"));
        let mut cone = nat(NatConfig::port_restricted);
        assert_eq!(cone.outbound(inside, r), cone.outbound(inside, p));
        let mut sym = nat(NatConfig::symmetric);
        let (to_r, to_p) = (sym.outbound(inside, r), sym.outbound(inside, p));
        assert_ne!(to_r, to_p);
        assert_eq!(
            sym.outbound(inside, r),
            to_r,
            "the same destination, the same port"
        );
    }

    #[test]
    fn each_filter_lets_in_what_its_kind_allows() {
        let inside = a("10.0.0.2:5000");
        let relay = a("203.0.113.1:7401");
        let same_ip_other_port = a("203.0.113.1:9999");
        let stranger = a("192.0.2.9:6000");
        let check = |cfg: fn(IpAddr) -> NatConfig| {
            let mut n = nat(cfg);
            let public = n.outbound(inside, relay);
            [relay, same_ip_other_port, stranger]
                .map(|from| n.inbound(public.port(), from).is_some())
        };
        assert_eq!(check(NatConfig::full_cone), [true, true, true]);
        assert_eq!(check(NatConfig::restricted_cone), [true, true, false]);
        assert_eq!(check(NatConfig::port_restricted), [true, false, false]);
        assert_eq!(check(NatConfig::symmetric), [true, false, false]);
        // No mapping at all: nothing gets in.
        let mut n = nat(NatConfig::full_cone);
        assert_eq!(n.inbound(40_000, relay), None);
        assert_eq!(n.filtered, 1);
    }
}
