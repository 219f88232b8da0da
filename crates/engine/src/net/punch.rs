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
//!
//! **Candidates beside the relay's view.** A socket bound to every IPv6 address as well as
//! IPv4 (dual-stack) has the host's global and unique-local IPv6 addresses too, reachable
//! without a NAT where both peers have IPv6 ([`local_v6_candidates`]). Its binds carry them
//! after the relay's request ([`with_candidates`], at [`CANDIDATES_AT`]), the relay keeps them
//! for that end and appends the other end's to its answers, at the same place
//! ([`candidates_in`]), and they are probed beside the address the relay saw
//! ([`CandidateKind::Local`]). A relay that does not know them ignores them.

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

/// Where a bind's candidates, and those of the other end in the relay's answer, start: after
/// the relay's request or answer and its padding.
pub const CANDIDATES_AT: usize = 64;
/// Most candidates of its own a socket sends.
pub const MAX_LOCAL_CANDIDATES: usize = 3;
/// The length of a bind that carries candidates (padded: the relay's answer, which carries
/// the other end's at the same place, is never longer than the request).
pub const BIND_WITH_CANDIDATES_LEN: usize = 128;
/// Bytes of one candidate: an IPv6 address and a port.
const CANDIDATE_LEN: usize = 18;

/// `request` (a bind, at most [`CANDIDATES_AT`] bytes) with `candidates` (IPv6 ones, at most
/// [`MAX_LOCAL_CANDIDATES`]) after it: padded to [`CANDIDATES_AT`], a count, then each
/// address and port, padded to [`BIND_WITH_CANDIDATES_LEN`]. Without candidates, `request` as
/// it is.
pub fn with_candidates(request: &[u8], candidates: &[SocketAddr]) -> Vec<u8> {
    let v6: Vec<(std::net::Ipv6Addr, u16)> = candidates
        .iter()
        .filter_map(|c| match c {
            SocketAddr::V6(a) => Some((*a.ip(), a.port())),
            SocketAddr::V4(_) => None,
        })
        .take(MAX_LOCAL_CANDIDATES)
        .collect();
    if v6.is_empty() || request.len() > CANDIDATES_AT {
        return request.to_vec();
    }
    let mut out = request.to_vec();
    out.resize(CANDIDATES_AT, 0);
    out.push(v6.len() as u8);
    for (ip, port) in v6 {
        out.extend_from_slice(&ip.octets());
        out.extend_from_slice(&port.to_be_bytes());
    }
    out.resize(BIND_WITH_CANDIDATES_LEN, 0);
    out
}

/// The candidates a bind or an answer carries at [`CANDIDATES_AT`] (none if it is shorter, or
/// they do not read): at most [`MAX_LOCAL_CANDIDATES`], no unspecified, loopback, multicast
/// or IPv4-mapped address, no port 0.
pub fn candidates_in(datagram: &[u8]) -> Vec<SocketAddr> {
    let Some(rest) = datagram.get(CANDIDATES_AT..) else {
        return Vec::new();
    };
    let Some((&count, list)) = rest.split_first() else {
        return Vec::new();
    };
    list.chunks_exact(CANDIDATE_LEN)
        .take(usize::from(count).min(MAX_LOCAL_CANDIDATES))
        .filter_map(|c| {
            let ip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).ok()?);
            let port = u16::from_be_bytes([c[16], c[17]]);
            let usable = !(ip.is_unspecified()
                || ip.is_loopback()
                || ip.is_multicast()
                || ip.to_ipv4_mapped().is_some()
                || port == 0);
            usable.then(|| SocketAddr::new(ip.into(), port))
        })
        .collect()
}

/// The host's IPv6 addresses a peer may reach `sock` at without a NAT (global and unique-local
/// ones, not link-local, tentative, failed or deprecated), with its port: none unless `sock` is
/// bound to every IPv6 address (a dual-stack data socket). At most [`MAX_LOCAL_CANDIDATES`].
/// Read from `/proc/net/if_inet6` (Linux; elsewhere none).
pub fn local_v6_candidates(sock: &UdpSocket) -> Vec<SocketAddr> {
    match sock.local_addr() {
        Ok(SocketAddr::V6(a)) if a.ip().is_unspecified() => {
            std::fs::read_to_string("/proc/net/if_inet6")
                .map(|t| v6_addresses(&t, a.port()))
                .unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

/// [`local_v6_candidates`] from the text of `/proc/net/if_inet6` (address, interface index,
/// prefix length, scope, flags, name; hexadecimal), with `port`.
fn v6_addresses(table: &str, port: u16) -> Vec<SocketAddr> {
    /// Scope "global" (unique-local addresses have it too).
    const GLOBAL: u32 = 0x00;
    /// IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE.
    const UNUSABLE: u32 = 0x08 | 0x20 | 0x40;
    let mut out = Vec::new();
    for line in table.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, _, _, scope, flags, ..] = f[..] else {
            continue;
        };
        let (Ok(bits), Ok(scope), Ok(flags)) = (
            u128::from_str_radix(addr, 16),
            u32::from_str_radix(scope, 16),
            u32::from_str_radix(flags, 16),
        ) else {
            continue;
        };
        let ip = std::net::Ipv6Addr::from(bits);
        if addr.len() != 32
            || scope != GLOBAL
            || flags & UNUSABLE != 0
            || ip.is_loopback()
            || ip.is_multicast()
            || ip.to_ipv4_mapped().is_some()
        {
            continue;
        }
        out.push(SocketAddr::new(ip.into(), port));
        if out.len() == MAX_LOCAL_CANDIDATES {
            break;
        }
    }
    out
}

/// Sends `d` to `to` from `sock`, writing an IPv4 `to` as IPv4-mapped IPv6 when `sock` is an
/// IPv6 (dual-stack) socket, which takes no plain IPv4 address.
pub fn send_to(sock: &UdpSocket, d: &[u8], to: SocketAddr) -> std::io::Result<usize> {
    let to = match (sock.local_addr(), to) {
        (Ok(SocketAddr::V6(_)), SocketAddr::V4(v4)) => {
            SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
        }
        _ => to,
    };
    sock.send_to(d, to)
}

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
    /// `bind` with the socket's own candidates, once made (at its first bind).
    with_candidates: Option<Vec<u8>>,
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
            with_candidates: None,
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
                        let mut candidates = vec![Candidate {
                            addr: peer,
                            kind: CandidateKind::Reflexive,
                        }];
                        // The other end's own addresses, where this socket can reach them.
                        if matches!(sock.local_addr(), Ok(SocketAddr::V6(_))) {
                            candidates.extend(candidates_in(datagram).into_iter().map(|addr| {
                                Candidate {
                                    addr,
                                    kind: CandidateKind::Local,
                                }
                            }));
                        }
                        let mut p =
                            Puncher::new(self.role, &self.key, &candidates, self.nonce_base);
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
            if self.with_candidates.is_none() {
                self.with_candidates =
                    Some(with_candidates(&self.bind, &local_v6_candidates(sock)));
            }
            let bind = self.with_candidates.as_deref().unwrap_or(&self.bind);
            let _ = send_to(sock, bind, self.relay);
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
                let _ = send_to(sock, &d, to);
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

    #[test]
    fn candidates_ride_after_the_request_and_read_back_checked() {
        let bind = [RELAY_TAG; 40];
        let v6: Vec<SocketAddr> = [
            "[fd00::1]:7",
            "[2001:db8::9]:8",
            "[2001:db8::a]:9",
            "[2001:db8::b]:10",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let v4: SocketAddr = "192.0.2.1:7".parse().unwrap();
        // No IPv6 candidate: the request as it was.
        assert_eq!(with_candidates(&bind, &[v4]), bind.to_vec());
        let d = with_candidates(&bind, &[v4, v6[0], v6[1], v6[2], v6[3]]);
        assert_eq!(d.len(), BIND_WITH_CANDIDATES_LEN);
        assert_eq!(&d[..40], &bind[..]);
        // At most three, IPv6 only, in order.
        assert_eq!(candidates_in(&d), v6[..3].to_vec());
        assert!(candidates_in(&d[..CANDIDATES_AT]).is_empty());
        // A count beyond what is there, loopback, mapped, port 0: not taken.
        let mut bad = vec![0u8; CANDIDATES_AT];
        bad.push(200);
        for (ip, port) in [
            (std::net::Ipv6Addr::LOCALHOST, 5u16),
            ("::ffff:192.0.2.1".parse().unwrap(), 5),
            ("fd00::2".parse().unwrap(), 0),
            ("fd00::3".parse().unwrap(), 6),
        ] {
            bad.extend_from_slice(&ip.octets());
            bad.extend_from_slice(&port.to_be_bytes());
        }
        assert_eq!(
            candidates_in(&bad),
            Vec::<SocketAddr>::new(),
            "only the first three read"
        );
        bad[CANDIDATES_AT] = 3;
        assert!(candidates_in(&bad).is_empty());
    }

    #[test]
    fn the_host_s_global_and_unique_local_ipv6_addresses_are_candidates() {
        let table = "\
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
20010db8000000000000000000000005 05 40 00 40     eth1
20010db8000000000000000000000006 05 40 00 20     eth1
20010db8000000000000000000000007 05 40 00 00     eth1
garbage
";
        let got = v6_addresses(table, 4242);
        let want: Vec<SocketAddr> = ["[fd00::2]:4242", "[2001:db8::7]:4242"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        // Not loopback, link-local, tentative (0x40) or deprecated (0x20).
        assert_eq!(got, want);
        // An IPv4 socket offers none.
        let v4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(local_v6_candidates(&v4).is_empty());
    }

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
