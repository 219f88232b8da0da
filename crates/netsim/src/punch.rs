//! Hole punching between two simulated peers, each behind a NAT of its own (or none), with a
//! relay on a public address ([`PunchScenario`], run by [`PunchScenario::run`]).
//!
//! What it runs is `hurtle-proto`'s [`Puncher`], on both sides, after the steps a real session
//! takes to get there: each peer's data socket sends a datagram to the relay and learns the
//! address the relay saw it come from (its reflexive address); each tells the relay its
//! candidates (that address and its own) over its control connection; once the relay has both
//! it hands each the other's, with a moment to start at that both reach (so their first probes
//! cross); then both probe until a probe of each is answered, or they give up.
//!
//! The network: every datagram goes from a socket through its host's NAT ([`crate::nat`]), if
//! any, and arrives after the one-way delay between the two hosts, through the other host's
//! NAT, if it lets it in; addresses no host owns (a peer's private address, seen from the
//! other network) go nowhere. A seeded share of datagrams is lost. The control connections to
//! the relay are reliable, with the peers' one-way delays to it.

use crate::nat::{Nat, NatConfig};
use hurtle_proto::punch::{Candidate, CandidateKind, PunchEvent, Puncher, Role};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The relay's public address.
pub const RELAY: &str = "192.0.2.1:7401";

/// Two peers, their NATs, the delays between them and the relay.
#[derive(Debug, Clone)]
pub struct PunchScenario {
    /// The sender's NAT (`None`: its socket has a public address).
    pub sender_nat: Option<NatConfig>,
    /// The receiver's NAT.
    pub receiver_nat: Option<NatConfig>,
    /// One-way delay from the sender, and from the receiver, to the relay.
    pub to_relay: (Duration, Duration),
    /// One-way delay between the peers.
    pub direct: Duration,
    /// Share of datagrams lost, each way, on every path.
    pub loss: f64,
    /// Seed of the losses.
    pub seed: u64,
    /// The run stops here.
    pub max_virtual: Duration,
}

impl Default for PunchScenario {
    fn default() -> Self {
        PunchScenario {
            sender_nat: Some(NatConfig::port_restricted(ip("198.51.100.1"))),
            receiver_nat: Some(NatConfig::port_restricted(ip("203.0.113.1"))),
            to_relay: (Duration::from_millis(30), Duration::from_millis(40)),
            direct: Duration::from_millis(50),
            loss: 0.0,
            seed: 1,
            max_virtual: Duration::from_secs(10),
        }
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PunchOutcome {
    /// When both had their candidates and started probing, from time zero.
    pub started: Duration,
    /// Each side's end: a direct path (with the peer's address and the time from the start),
    /// or given up; `None` if the run stopped first.
    pub sender: Option<PunchEvent>,
    /// The receiver's.
    pub receiver: Option<PunchEvent>,
    /// The addresses the relay saw each peer's socket come from.
    pub reflexive: (SocketAddr, SocketAddr),
    /// Datagrams sent by both peers (relay datagrams included), lost on the way, and dropped
    /// by a NAT's filter.
    pub datagrams: u64,
    /// Lost.
    pub lost: u64,
    /// Filtered.
    pub filtered: u64,
}

impl PunchOutcome {
    /// When both sides had a direct path, from the start of probing: the later of the two.
    pub fn direct_after(&self) -> Option<Duration> {
        match (self.sender, self.receiver) {
            (
                Some(PunchEvent::Direct { after: a, .. }),
                Some(PunchEvent::Direct { after: b, .. }),
            ) => Some(a.max(b)),
            _ => None,
        }
    }
}

impl fmt::Display for PunchOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "started at {:?}; sender {:?}; receiver {:?}; reflexive {} / {}; {} datagrams, {} lost, {} filtered",
            self.started,
            self.sender,
            self.receiver,
            self.reflexive.0,
            self.reflexive.1,
            self.datagrams,
            self.lost,
            self.filtered
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Host {
    Sender,
    Receiver,
    Relay,
}

/// A datagram on its way: when it arrives, where, from which public address.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    to_host: Host,
    from: SocketAddr,
    to: SocketAddr,
    payload: Vec<u8>,
}

/// One peer: its socket, NAT, what it learnt and its puncher once it has candidates.
struct Peer {
    inside: SocketAddr,
    nat: Option<Nat>,
    reflexive: Option<SocketAddr>,
    /// When it told the relay its candidates.
    told: Option<Instant>,
    puncher: Option<Puncher>,
    end: Option<PunchEvent>,
}

impl Peer {
    fn public_ip(&self) -> IpAddr {
        self.nat.as_ref().map_or(self.inside.ip(), Nat::public_ip)
    }

    fn candidates(&self) -> Vec<Candidate> {
        let mut cs = vec![Candidate {
            addr: self.inside,
            kind: CandidateKind::Local,
        }];
        if let Some(r) = self.reflexive.filter(|&r| r != self.inside) {
            cs.push(Candidate {
                addr: r,
                kind: CandidateKind::Reflexive,
            });
        }
        cs
    }
}

/// The asking datagram a socket sends the relay, and the relay's answer's first bytes.
const BIND: &[u8] = b"bind";
const SEEN: &[u8] = b"seen ";
/// How often a peer asks the relay again while it has no answer.
const BIND_RETRY: Duration = Duration::from_millis(200);

struct Run {
    sc: PunchScenario,
    t0: Instant,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: u64,
    peers: [Peer; 2],
    datagrams: u64,
    lost: u64,
    /// When each peer asked the relay last.
    asked: [Option<Instant>; 2],
    started: Option<Instant>,
}

impl PunchScenario {
    /// Runs the scenario to both sides' end, or [`PunchScenario::max_virtual`].
    pub fn run(&self) -> PunchOutcome {
        let t0 = Instant::now();
        let peer = |nat: &Option<NatConfig>, private: &str, public: &str| Peer {
            inside: if nat.is_some() {
                private.parse().expect("an address")
            } else {
                public.parse().expect("an address")
            },
            nat: nat.clone().map(Nat::new),
            reflexive: None,
            told: None,
            puncher: None,
            end: None,
        };
        let mut run = Run {
            sc: self.clone(),
            t0,
            queue: BinaryHeap::new(),
            seq: 0,
            rng: self.seed ^ 0x9e37_79b9_7f4a_7c15,
            peers: [
                peer(&self.sender_nat, "10.1.0.2:5000", "198.51.100.20:5000"),
                peer(&self.receiver_nat, "10.2.0.2:6000", "203.0.113.20:6000"),
            ],
            datagrams: 0,
            lost: 0,
            asked: [None, None],
            started: None,
        };
        run.drive();
        run.outcome()
    }
}

impl Run {
    fn relay(&self) -> SocketAddr {
        RELAY.parse().expect("an address")
    }

    fn delay(&self, a: Host, b: Host) -> Duration {
        match (a.min(b), a.max(b)) {
            (Host::Sender, Host::Receiver) => self.sc.direct,
            (Host::Sender, Host::Relay) => self.sc.to_relay.0,
            (Host::Receiver, Host::Relay) => self.sc.to_relay.1,
            _ => Duration::ZERO,
        }
    }

    fn chance(&mut self) -> f64 {
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn host_of(&self, addr: IpAddr) -> Option<Host> {
        if addr == self.relay().ip() {
            Some(Host::Relay)
        } else if addr == self.peers[0].public_ip() {
            Some(Host::Sender)
        } else if addr == self.peers[1].public_ip() {
            Some(Host::Receiver)
        } else {
            None
        }
    }

    /// Peer `i`'s socket sends `payload` to `to` at `now`.
    fn peer_sends(&mut self, now: Instant, i: usize, to: SocketAddr, payload: Vec<u8>) {
        self.datagrams += 1;
        let inside = self.peers[i].inside;
        let from = match self.peers[i].nat.as_mut() {
            Some(nat) => nat.outbound(inside, to),
            None => inside,
        };
        let me = [Host::Sender, Host::Receiver][i];
        self.route(now, me, from, to, payload);
    }

    fn route(
        &mut self,
        now: Instant,
        me: Host,
        from: SocketAddr,
        to: SocketAddr,
        payload: Vec<u8>,
    ) {
        let Some(to_host) = self.host_of(to.ip()) else {
            return;
        };
        if self.chance() < self.sc.loss {
            self.lost += 1;
            return;
        }
        self.seq += 1;
        self.queue.push(Reverse(InFlight {
            at: now + self.delay(me, to_host),
            seq: self.seq,
            to_host,
            from,
            to,
            payload,
        }));
    }

    fn deliver(&mut self, d: InFlight) {
        let now = d.at;
        match d.to_host {
            Host::Relay => {
                if d.payload == BIND {
                    let mut answer = SEEN.to_vec();
                    answer.extend_from_slice(d.from.to_string().as_bytes());
                    let relay = self.relay();
                    self.route(now, Host::Relay, relay, d.from, answer);
                }
            }
            Host::Sender | Host::Receiver => {
                let i = usize::from(d.to_host == Host::Receiver);
                let inside = match self.peers[i].nat.as_mut() {
                    Some(nat) => nat.inbound(d.to.port(), d.from),
                    None => Some(d.to).filter(|&t| t == self.peers[i].inside),
                };
                if inside.is_none() {
                    return;
                }
                if let Some(seen) = d.payload.strip_prefix(SEEN) {
                    let p = &mut self.peers[i];
                    if p.reflexive.is_none() {
                        p.reflexive = std::str::from_utf8(seen).ok().and_then(|s| s.parse().ok());
                        // Its candidates go to the relay on its control connection.
                        p.told = Some(now);
                    }
                    return;
                }
                if let Some(p) = self.peers[i].puncher.as_mut() {
                    p.on_datagram(now, d.from, &d.payload);
                }
            }
        }
    }

    /// When the relay has both peers' candidates, and when both have the other's (the start).
    fn relay_pairs(&mut self) {
        if self.started.is_some() {
            return;
        }
        let (Some(s), Some(r)) = (self.peers[0].told, self.peers[1].told) else {
            return;
        };
        let (ds, dr) = self.sc.to_relay;
        let at_relay = (s + ds).max(r + dr);
        let start = at_relay + ds.max(dr);
        self.started = Some(start);
        let key = [0x5a; 32];
        let (cs, cr) = (self.peers[0].candidates(), self.peers[1].candidates());
        self.peers[0].puncher = Some(Puncher::new(Role::Sender, &key, &cr, 1 << 40));
        self.peers[1].puncher = Some(Puncher::new(Role::Receiver, &key, &cs, 2 << 40));
    }

    fn next_time(&self) -> Option<Instant> {
        let mut next = self.queue.peek().map(|Reverse(d)| d.at);
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        for (i, p) in self.peers.iter().enumerate() {
            if p.reflexive.is_none() {
                consider(Some(self.asked[i].map_or(self.t0, |t| t + BIND_RETRY)));
            }
            match (&p.puncher, self.started) {
                (Some(pu), Some(start)) if p.end.is_none() => {
                    consider(Some(pu.poll_timeout().unwrap_or(start)).map(|t| t.max(start)));
                }
                _ => {}
            }
        }
        next
    }

    fn drive(&mut self) {
        let end = self.t0 + self.sc.max_virtual;
        while self.peers.iter().any(|p| p.end.is_none()) {
            let Some(now) = self.next_time() else {
                return;
            };
            if now > end {
                return;
            }
            while self.queue.peek().is_some_and(|Reverse(d)| d.at <= now) {
                if let Some(Reverse(d)) = self.queue.pop() {
                    self.deliver(d);
                }
            }
            let relay = self.relay();
            for i in 0..2 {
                if self.peers[i].reflexive.is_none()
                    && self.asked[i].is_none_or(|t| now >= t + BIND_RETRY)
                {
                    self.asked[i] = Some(now);
                    self.peer_sends(now, i, relay, BIND.to_vec());
                }
            }
            self.relay_pairs();
            let Some(start) = self.started.filter(|&s| now >= s) else {
                continue;
            };
            for i in 0..2 {
                let mut out = Vec::new();
                if let Some(p) = self.peers[i].puncher.as_mut() {
                    p.start(start);
                    p.handle_timeout(now);
                    while let Some(t) = p.poll_transmit() {
                        out.push(t);
                    }
                    if let Some(ev) = p.poll_event() {
                        self.peers[i].end.get_or_insert(ev);
                    }
                }
                for (to, d) in out {
                    self.peer_sends(now, i, to, d.to_vec());
                }
            }
        }
    }

    fn outcome(&self) -> PunchOutcome {
        let unknown: SocketAddr = "0.0.0.0:0".parse().expect("an address");
        PunchOutcome {
            started: self.started.map_or(Duration::ZERO, |s| s - self.t0),
            sender: self.peers[0].end,
            receiver: self.peers[1].end,
            reflexive: (
                self.peers[0].reflexive.unwrap_or(unknown),
                self.peers[1].reflexive.unwrap_or(unknown),
            ),
            datagrams: self.datagrams,
            lost: self.lost,
            filtered: self
                .peers
                .iter()
                .filter_map(|p| p.nat.as_ref())
                .map(|n| n.filtered)
                .sum(),
        }
    }
}
