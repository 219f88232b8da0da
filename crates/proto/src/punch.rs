//! Hole punching: how two peers behind NATs find a direct UDP path between their data sockets
//! ([`Puncher`], one per side and socket).
//!
//! Each side knows the other's candidates: the addresses its data socket has on its own host
//! ([`CandidateKind::Local`]) and the one the relay saw it come from
//! ([`CandidateKind::Reflexive`]), exchanged through the relay. Both sides start at the same
//! moment (the relay times it) and send a [`Message::Probe`] to every candidate, again after
//! [`FIRST_RETRY`], then at doubling intervals, for at most [`PUNCH_FOR`]. A probe opens the
//! sender's own NAT toward that address; the other side's probes, crossing it, find the door
//! open. A side that gets a probe answers it at the address it came from
//! ([`Message::Answer`]), and probes that address too ([`CandidateKind::PeerReflexive`]): that
//! is how a NAT that gives each destination a port of its own ("symmetric") is reached from a
//! side whose NAT keeps one port (the easy side answers every probe where it came from). A side
//! whose probe is answered has a path both ways: [`PunchEvent::Direct`] names the address;
//! after [`PUNCH_FOR`] without one, [`PunchEvent::GaveUp`] (the session stays relayed).
//!
//! Every message carries a nonce and a tag made with a key of the session's
//! ([`Puncher::new`]), and an answer must echo the nonce of one of this side's probes, so a
//! third party on the path can neither steer a session to an address of its choosing nor
//! confirm one; anything else is dropped and counted ([`Puncher::dropped`]).
//!
//! Sans-IO: time comes in as arguments, datagrams to send come out of
//! [`Puncher::poll_transmit`], datagrams that arrived go in through [`Puncher::on_datagram`].
//! The datagrams start with [`TAG_BYTE`], which no data datagram does (its kind is in the low
//! nibble of its first byte, and 0xF is none), so a driver tells them apart on one socket.

use ring::hmac;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// First byte of every punching datagram.
pub const TAG_BYTE: u8 = 0xF0;
/// Length of a punching datagram.
pub const MESSAGE_LEN: usize = 1 + 1 + 1 + 8 + 16;
/// The first probes go again after this long (a probe can be dropped by the other side's NAT
/// before that side's own probe opened it).
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// How long a side probes before it gives up on a direct path.
pub const PUNCH_FOR: Duration = Duration::from_secs(5);
/// Most candidates a side probes (a peer cannot make it probe the world).
pub const MAX_CANDIDATES: usize = 16;

/// Which end of the session a puncher is: the two make different tags, so a side's own probe
/// reflected back to it is not taken for the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The sending peer.
    Sender = 1,
    /// The receiving peer.
    Receiver = 2,
}

impl Role {
    fn other(self) -> Role {
        match self {
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        }
    }
}

/// Where a candidate address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateKind {
    /// An address of the peer's socket on its own host.
    Local,
    /// The address the relay saw the peer's socket come from (its NAT's mapping toward the
    /// relay).
    Reflexive,
    /// The address a probe of the peer's came from (its NAT's mapping toward us).
    PeerReflexive,
}

/// A peer's address to probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The address.
    pub addr: SocketAddr,
    /// Where it came from.
    pub kind: CandidateKind,
}

/// A punching datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// "Here I am": answer it where it came from.
    Probe {
        /// The sending side.
        from: Role,
        /// Echoed by the answer.
        nonce: u64,
    },
    /// "Your probe reached me": a path both ways.
    Answer {
        /// The answering side.
        from: Role,
        /// The probe's nonce.
        nonce: u64,
    },
}

impl Message {
    /// The datagram: [`TAG_BYTE`], kind, role, nonce, and a tag over them made with `key`.
    pub fn encode(&self, key: &hmac::Key) -> [u8; MESSAGE_LEN] {
        let (kind, from, nonce) = match *self {
            Message::Probe { from, nonce } => (1u8, from, nonce),
            Message::Answer { from, nonce } => (2u8, from, nonce),
        };
        let mut out = [0u8; MESSAGE_LEN];
        out[0] = TAG_BYTE;
        out[1] = kind;
        out[2] = from as u8;
        out[3..11].copy_from_slice(&nonce.to_be_bytes());
        let tag = hmac::sign(key, &out[..11]);
        out[11..].copy_from_slice(&tag.as_ref()[..16]);
        out
    }

    /// The message in `datagram`, if it is one and its tag is `key`'s.
    pub fn decode(datagram: &[u8], key: &hmac::Key) -> Option<Message> {
        if datagram.len() != MESSAGE_LEN || datagram[0] != TAG_BYTE {
            return None;
        }
        let want = hmac::sign(key, &datagram[..11]);
        // A constant-time comparison of the truncated tag.
        if !constant_time_eq(&want.as_ref()[..16], &datagram[11..]) {
            return None;
        }
        let from = match datagram[2] {
            1 => Role::Sender,
            2 => Role::Receiver,
            _ => return None,
        };
        let nonce = u64::from_be_bytes(datagram[3..11].try_into().ok()?);
        match datagram[1] {
            1 => Some(Message::Probe { from, nonce }),
            2 => Some(Message::Answer { from, nonce }),
            _ => None,
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the driver must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PunchEvent {
    /// A probe of ours was answered from `addr`: the peer is reachable there, both ways.
    Direct {
        /// The peer's address, as seen from here.
        addr: SocketAddr,
        /// How long after the start.
        after: Duration,
    },
    /// No probe was answered within [`PUNCH_FOR`].
    GaveUp,
}

/// One side's hole punching for one socket (see the module docs).
#[derive(Debug)]
pub struct Puncher {
    role: Role,
    key: hmac::Key,
    candidates: Vec<Candidate>,
    start: Option<Instant>,
    /// When the next round of probes goes, and the wait after it.
    next_round: Option<Instant>,
    wait: Duration,
    /// Nonces of the probes sent, by candidate (the next one is `base + sent`).
    nonce_base: u64,
    sent: u64,
    done: bool,
    dropped: u64,
    transmits: VecDeque<(SocketAddr, [u8; MESSAGE_LEN])>,
    events: VecDeque<PunchEvent>,
}

impl Puncher {
    /// A puncher for `role`, whose messages are tagged with `key` (both sides derive the same
    /// key from the session's keys), probing `candidates` (at most [`MAX_CANDIDATES`]).
    /// `nonce_base` is random: a peer that sees our nonces cannot predict the next ones' tags
    /// anyway, but distinct bases keep two sessions' nonces apart.
    pub fn new(role: Role, key: &[u8; 32], candidates: &[Candidate], nonce_base: u64) -> Puncher {
        let mut cs: Vec<Candidate> = Vec::new();
        for c in candidates {
            if cs.len() < MAX_CANDIDATES && !cs.iter().any(|k| k.addr == c.addr) {
                cs.push(*c);
            }
        }
        Puncher {
            role,
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            candidates: cs,
            start: None,
            next_round: None,
            wait: FIRST_RETRY,
            nonce_base,
            sent: 0,
            done: false,
            dropped: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Probing starts at `now` (both sides at the same moment): the first round goes at once.
    pub fn start(&mut self, now: Instant) {
        if self.start.is_none() {
            self.start = Some(now);
            self.next_round = Some(now);
            self.handle_timeout(now);
        }
    }

    /// A datagram that arrived from `from` at `now`. Returns false if it is not a punching
    /// datagram at all (the driver's to handle); a punching datagram that fails its tag, or an
    /// answer to no probe of ours, is dropped and counted.
    pub fn on_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> bool {
        if datagram.first() != Some(&TAG_BYTE) {
            return false;
        }
        match Message::decode(datagram, &self.key) {
            Some(Message::Probe { from: role, nonce }) if role == self.role.other() => {
                let answer = Message::Answer {
                    from: self.role,
                    nonce,
                };
                self.transmits.push_back((from, answer.encode(&self.key)));
                // Where the peer's probe came from is where its NAT opened toward us.
                if !self.done
                    && self.candidates.len() < MAX_CANDIDATES
                    && !self.candidates.iter().any(|c| c.addr == from)
                {
                    self.candidates.push(Candidate {
                        addr: from,
                        kind: CandidateKind::PeerReflexive,
                    });
                    self.probe(from);
                }
            }
            Some(Message::Answer { from: role, nonce })
                if role == self.role.other() && self.is_ours(nonce) =>
            {
                if !self.done {
                    self.done = true;
                    let after = self
                        .start
                        .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
                    self.events
                        .push_back(PunchEvent::Direct { addr: from, after });
                }
            }
            _ => self.dropped += 1,
        }
        true
    }

    /// Timers due at `now`: a round of probes, or the end.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.done {
            return;
        }
        let Some(start) = self.start else {
            return;
        };
        if now >= start + PUNCH_FOR {
            self.done = true;
            self.events.push_back(PunchEvent::GaveUp);
            return;
        }
        if self.next_round.is_some_and(|t| now >= t) {
            for c in self.candidates.clone() {
                self.probe(c.addr);
            }
            self.next_round = Some(now + self.wait);
            self.wait *= 2;
        }
    }

    /// When [`Puncher::handle_timeout`] wants to be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.done {
            return None;
        }
        let end = self.start? + PUNCH_FOR;
        Some(self.next_round.map_or(end, |t| t.min(end)))
    }

    /// The next datagram to send, and where.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, [u8; MESSAGE_LEN])> {
        self.transmits.pop_front()
    }

    /// The next thing the driver must act on.
    pub fn poll_event(&mut self) -> Option<PunchEvent> {
        self.events.pop_front()
    }

    /// The candidates probed so far (the peer-reflexive ones learnt included).
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Punching datagrams dropped: wrong tag, our own role, or an answer to no probe of ours.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn probe(&mut self, to: SocketAddr) {
        let nonce = self.nonce_base.wrapping_add(self.sent);
        self.sent += 1;
        let probe = Message::Probe {
            from: self.role,
            nonce,
        };
        self.transmits.push_back((to, probe.encode(&self.key)));
    }

    fn is_ours(&self, nonce: u64) -> bool {
        nonce.wrapping_sub(self.nonce_base) < self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn reflexive(s: &str) -> Candidate {
        Candidate {
            addr: addr(s),
            kind: CandidateKind::Reflexive,
        }
    }

    fn sent(p: &mut Puncher) -> Vec<(SocketAddr, Message)> {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &KEY);
        std::iter::from_fn(|| p.poll_transmit())
            .map(|(a, d)| (a, Message::decode(&d, &key).unwrap()))
            .collect()
    }

    #[test]
    fn messages_round_trip_and_a_wrong_key_or_a_flipped_bit_is_refused() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &KEY);
        let other = hmac::Key::new(hmac::HMAC_SHA256, &[8; 32]);
        for m in [
            Message::Probe {
                from: Role::Sender,
                nonce: 42,
            },
            Message::Answer {
                from: Role::Receiver,
                nonce: u64::MAX,
            },
        ] {
            let d = m.encode(&key);
            assert_eq!(Message::decode(&d, &key), Some(m));
            assert_eq!(Message::decode(&d, &other), None);
            for i in 0..d.len() {
                let mut bad = d;
                bad[i] ^= 1;
                assert_eq!(Message::decode(&bad, &key), None, "byte {i}");
            }
            assert_eq!(Message::decode(&d[..d.len() - 1], &key), None);
        }
    }

    #[test]
    fn probes_go_to_every_candidate_at_the_start_then_at_doubling_intervals_until_given_up() {
        let t0 = Instant::now();
        let cs = [reflexive("203.0.113.5:4000"), reflexive("192.168.1.5:4000")];
        let mut p = Puncher::new(Role::Sender, &KEY, &cs, 1000);
        assert_eq!(p.poll_timeout(), None, "nothing before the start");
        p.start(t0);
        let first = sent(&mut p);
        assert_eq!(first.len(), 2);
        let mut rounds = vec![Duration::ZERO];
        while let Some(t) = p.poll_timeout() {
            p.handle_timeout(t);
            if !sent(&mut p).is_empty() {
                rounds.push(t - t0);
            }
        }
        assert_eq!(
            rounds,
            [0, 100, 300, 700, 1500, 3100]
                .map(Duration::from_millis)
                .to_vec()
        );
        assert_eq!(p.poll_event(), Some(PunchEvent::GaveUp));
    }

    #[test]
    fn a_probe_is_answered_where_it_came_from_and_an_answer_to_ours_is_a_direct_path() {
        let t0 = Instant::now();
        let (a_addr, b_addr) = (addr("198.51.100.1:5000"), addr("203.0.113.9:6000"));
        let mut a = Puncher::new(Role::Sender, &KEY, &[reflexive("203.0.113.9:6000")], 10);
        let mut b = Puncher::new(Role::Receiver, &KEY, &[reflexive("198.51.100.1:5000")], 77);
        a.start(t0);
        b.start(t0);
        // A's probe reaches B from an address B did not know (A's NAT's mapping toward B).
        let a_mapped = addr("198.51.100.1:5999");
        let (to, probe) = a.poll_transmit().unwrap();
        assert_eq!(to, b_addr);
        assert!(b.on_datagram(t0, a_mapped, &probe));
        // B answers there, and probes it too.
        let out = sent(&mut b);
        assert!(out.contains(&(
            a_mapped,
            Message::Answer {
                from: Role::Receiver,
                nonce: 10
            }
        )));
        assert!(out
            .iter()
            .any(|(to, m)| *to == a_mapped && matches!(m, Message::Probe { .. })));
        assert_eq!(b.candidates().len(), 2);
        // The answer reaches A: a path, from where it came.
        let key = hmac::Key::new(hmac::HMAC_SHA256, &KEY);
        let answer = Message::Answer {
            from: Role::Receiver,
            nonce: 10,
        }
        .encode(&key);
        let t1 = t0 + Duration::from_millis(40);
        assert!(a.on_datagram(t1, b_addr, &answer));
        assert_eq!(
            a.poll_event(),
            Some(PunchEvent::Direct {
                addr: b_addr,
                after: Duration::from_millis(40)
            })
        );
        assert_eq!(a.poll_timeout(), None, "done");
        let _ = a_addr;
    }

    #[test]
    fn forged_reflected_and_unasked_messages_are_dropped() {
        let t0 = Instant::now();
        let mut a = Puncher::new(Role::Sender, &KEY, &[reflexive("203.0.113.9:6000")], 10);
        a.start(t0);
        sent(&mut a);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &KEY);
        let evil = addr("192.0.2.66:666");
        // Another key's answer; our own probe reflected; an answer to a nonce we never sent.
        let wrong = hmac::Key::new(hmac::HMAC_SHA256, &[9; 32]);
        let forged = Message::Answer {
            from: Role::Receiver,
            nonce: 10,
        }
        .encode(&wrong);
        let reflected = Message::Probe {
            from: Role::Sender,
            nonce: 10,
        }
        .encode(&key);
        let unasked = Message::Answer {
            from: Role::Receiver,
            nonce: 500,
        }
        .encode(&key);
        for d in [&forged[..], &reflected[..], &unasked[..]] {
            assert!(a.on_datagram(t0, evil, d));
        }
        assert_eq!(a.dropped(), 3);
        assert_eq!(a.poll_event(), None);
        assert!(a.poll_transmit().is_none(), "nothing answered");
        // Not a punching datagram at all: the driver's.
        assert!(!a.on_datagram(t0, evil, &[1, 2, 3]));
    }

    #[test]
    fn a_peer_cannot_make_it_probe_more_than_the_cap() {
        let t0 = Instant::now();
        let many: Vec<Candidate> = (0..40)
            .map(|i| reflexive(&format!("203.0.113.{i}:6000")))
            .collect();
        let mut a = Puncher::new(Role::Sender, &KEY, &many, 0);
        a.start(t0);
        assert_eq!(sent(&mut a).len(), MAX_CANDIDATES);
        // Probes from new addresses add no candidates past it (they are still answered).
        let key = hmac::Key::new(hmac::HMAC_SHA256, &KEY);
        let probe = Message::Probe {
            from: Role::Receiver,
            nonce: 1,
        }
        .encode(&key);
        a.on_datagram(t0, addr("192.0.2.1:1"), &probe);
        assert_eq!(sent(&mut a).len(), 1, "the answer only");
        assert_eq!(a.candidates().len(), MAX_CANDIDATES);
    }
}
