//! A relayed channel's try for a direct path ([`SocketPunch`], one per channel socket, on the
//! thread that reads that socket): it binds the socket's end of the channel's allocation at
//! the relay again until the relay's answer names the other end's address (the peer's socket
//! as the relay sees it, through the peer's NAT), then runs `hurtle_proto::punch`'s
//! [`Puncher`] against that address. A punched path is a direct one both ways: the driver
//! moves the channel there ([`PunchStep::Direct`]); until then, and if none is found, the
//! channel stays on the relay.
//!
//! It takes the relay's answers ([`RELAY_TAG`]) and punching datagrams
//! ([`hurtle_proto::punch::TAG_BYTE`]) that arrive on the socket; anything else is the
//! driver's. What it sends goes from the channel's own socket, so it opens the same NAT
//! mapping the data uses.

use crate::net::dial::RELAY_TAG;
use hurtle_proto::punch::{Candidate, CandidateKind, PunchEvent, Puncher, Role, TAG_BYTE};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// How often a socket binds again while the relay's answer does not name the other end yet.
pub const REBIND_EVERY: Duration = Duration::from_millis(100);
/// How long it binds again at most, waiting for the other end.
pub const REBIND_FOR: Duration = Duration::from_secs(5);

/// Reads the relay's answer to a bind: the address it saw the socket come from, and the other
/// end's address once that end is bound.
pub type ParseAnswer = fn(&[u8]) -> Option<(SocketAddr, Option<SocketAddr>)>;

/// What a datagram or a timer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PunchStep {
    /// Not a datagram of the relay's or of punching: the driver's.
    NotMine,
    /// Taken.
    Taken,
    /// A direct path to the peer's socket at this address, both ways: move the channel.
    Direct(SocketAddr),
}

/// One socket's relay binding and punching (see the module docs).
#[derive(Debug)]
pub struct SocketPunch {
    relay: SocketAddr,
    bind: Vec<u8>,
    parse: ParseAnswer,
    role: Role,
    key: [u8; 32],
    nonce_base: u64,
    started: Instant,
    next_bind: Option<Instant>,
    puncher: Option<Puncher>,
    direct: Option<SocketAddr>,
}

impl SocketPunch {
    /// A socket bound (or binding) to `relay` with `bind`, for the side `role`, its probes
    /// tagged with the session's punching `key`; from `now`.
    pub fn new(
        (relay, bind, parse): (SocketAddr, Vec<u8>, ParseAnswer),
        role: Role,
        key: [u8; 32],
        now: Instant,
    ) -> SocketPunch {
        SocketPunch {
            relay,
            bind,
            parse,
            role,
            key,
            nonce_base: rand::random(),
            started: now,
            next_bind: Some(now),
            puncher: None,
            direct: None,
        }
    }

    /// A datagram from `src` on `sock` at `now`.
    pub fn on_datagram(
        &mut self,
        now: Instant,
        sock: &UdpSocket,
        src: SocketAddr,
        datagram: &[u8],
    ) -> PunchStep {
        match datagram.first() {
            Some(&RELAY_TAG) if src == self.relay => {
                if let Some((_, Some(peer))) = (self.parse)(datagram) {
                    self.next_bind = None;
                    if self.puncher.is_none() {
                        let candidate = Candidate {
                            addr: peer,
                            kind: CandidateKind::Reflexive,
                        };
                        let mut p =
                            Puncher::new(self.role, &self.key, &[candidate], self.nonce_base);
                        p.start(now);
                        self.puncher = Some(p);
                        self.flush(sock);
                    }
                }
                PunchStep::Taken
            }
            Some(&TAG_BYTE) => {
                let Some(p) = self.puncher.as_mut() else {
                    return PunchStep::Taken;
                };
                p.on_datagram(now, src, datagram);
                self.flush(sock);
                self.event()
            }
            _ => PunchStep::NotMine,
        }
    }

    /// Timers due at `now`: a bind again, a round of probes.
    pub fn tick(&mut self, now: Instant, sock: &UdpSocket) -> PunchStep {
        if let Some(at) = self.next_bind.filter(|&at| now >= at) {
            let _ = sock.send_to(&self.bind, self.relay);
            self.next_bind =
                (now < self.started + REBIND_FOR).then_some(at.max(now) + REBIND_EVERY);
        }
        if let Some(p) = self.puncher.as_mut() {
            p.handle_timeout(now);
        }
        self.flush(sock);
        self.event()
    }

    /// When [`SocketPunch::tick`] wants to be called next.
    pub fn next_timeout(&self) -> Option<Instant> {
        let probe = self.puncher.as_ref().and_then(Puncher::poll_timeout);
        match (self.next_bind, probe) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The direct path, once found.
    pub fn direct(&self) -> Option<SocketAddr> {
        self.direct
    }

    fn flush(&mut self, sock: &UdpSocket) {
        if let Some(p) = self.puncher.as_mut() {
            while let Some((to, d)) = p.poll_transmit() {
                let _ = sock.send_to(&d, to);
            }
        }
    }

    fn event(&mut self) -> PunchStep {
        match self.puncher.as_mut().and_then(Puncher::poll_event) {
            Some(PunchEvent::Direct { addr, .. }) if self.direct.is_none() => {
                self.direct = Some(addr);
                PunchStep::Direct(addr)
            }
            _ => PunchStep::Taken,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relay's answer format, as the relay writes it (v4 only here).
    fn answer(own: SocketAddr, peer: Option<SocketAddr>) -> Vec<u8> {
        let mut out = vec![RELAY_TAG, b's', 0, 0, 0, 0, 0, 0, 0, 0];
        for a in std::iter::once(own).chain(peer) {
            let SocketAddr::V4(v4) = a else { panic!("v4") };
            out.push(4);
            out.extend_from_slice(&v4.ip().octets());
            out.extend_from_slice(&v4.port().to_be_bytes());
        }
        out
    }

    fn parse(d: &[u8]) -> Option<(SocketAddr, Option<SocketAddr>)> {
        let addr = |b: &[u8]| -> Option<SocketAddr> {
            (b.first() == Some(&4) && b.len() >= 7).then(|| {
                SocketAddr::from(([b[1], b[2], b[3], b[4]], u16::from_be_bytes([b[5], b[6]])))
            })
        };
        Some((addr(&d[10..])?, addr(d.get(17..).unwrap_or(&[]))))
    }

    #[test]
    fn two_sockets_bind_learn_each_other_and_find_the_direct_path() {
        let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
        relay
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let r = relay.local_addr().unwrap();
        let (a, b) = (
            UdpSocket::bind("127.0.0.1:0").unwrap(),
            UdpSocket::bind("127.0.0.1:0").unwrap(),
        );
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
        }
        let t0 = Instant::now();
        let key = [9; 32];
        let mut pa = SocketPunch::new((r, b"bind-a".to_vec(), parse), Role::Sender, key, t0);
        let mut pb = SocketPunch::new((r, b"bind-b".to_vec(), parse), Role::Receiver, key, t0);
        assert_eq!(pa.tick(t0, &a), PunchStep::Taken);
        assert_eq!(pb.tick(t0, &b), PunchStep::Taken);
        let mut buf = [0u8; 128];
        // The relay got both binds; it answers each with the other's address.
        for _ in 0..2 {
            let (n, from) = relay.recv_from(&mut buf).unwrap();
            let (own, peer) = if &buf[..n] == b"bind-a" {
                (a.local_addr().unwrap(), b.local_addr().unwrap())
            } else {
                (b.local_addr().unwrap(), a.local_addr().unwrap())
            };
            relay.send_to(&answer(own, Some(peer)), from).unwrap();
        }
        // Each hears its answer, starts probing; the probes and answers cross.
        let (mut da, mut db) = (None, None);
        for _ in 0..20 {
            for (p, s, d) in [(&mut pa, &a, &mut da), (&mut pb, &b, &mut db)] {
                if let Ok((n, from)) = s.recv_from(&mut buf) {
                    if let PunchStep::Direct(addr) =
                        p.on_datagram(Instant::now(), s, from, &buf[..n])
                    {
                        *d = Some(addr);
                    }
                }
            }
            if da.is_some() && db.is_some() {
                break;
            }
        }
        assert_eq!(da, Some(b.local_addr().unwrap()));
        assert_eq!(db, Some(a.local_addr().unwrap()));
        // Data is not its business.
        assert_eq!(pa.on_datagram(t0, &a, r, &[0x21, 1, 2]), PunchStep::NotMine);
    }

    #[test]
    fn an_answer_without_the_other_end_keeps_it_binding_for_a_while_then_it_stops() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let relay: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let t0 = Instant::now();
        let mut p = SocketPunch::new((relay, vec![1], parse), Role::Sender, [0; 32], t0);
        let own = sock.local_addr().unwrap();
        assert_eq!(
            p.on_datagram(t0, &sock, relay, &answer(own, None)),
            PunchStep::Taken
        );
        let mut binds = 0;
        let mut now = t0;
        while let Some(t) = p.next_timeout() {
            now = t;
            p.tick(now, &sock);
            binds += 1;
        }
        assert_eq!(
            binds,
            (REBIND_FOR.as_millis() / REBIND_EVERY.as_millis()) as usize + 1
        );
        assert!(now >= t0 + REBIND_FOR);
        // A relay's answer from anyone else is not the relay's.
        let stranger: SocketAddr = "127.0.0.1:10".parse().unwrap();
        assert_eq!(
            p.on_datagram(now, &sock, stranger, &answer(own, Some(stranger))),
            PunchStep::NotMine
        );
    }
}
