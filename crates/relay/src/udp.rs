//! UDP at the relay: the address a socket is seen from (for hole punching), and the forwarding
//! of a paired session's datagrams between its peers' sockets when no direct path is found,
//! so that the session keeps hurtle's pacing and repair instead of TCP's.
//!
//! The relay's UDP port has the number of its TCP port. It answers two requests, each at least
//! [`MIN_REQUEST`] bytes (padding included), with an answer never longer than the request (no
//! reflection amplification):
//!
//! - **observe** `[TAG, b'o', nonce(8), padding]`: the answer `[TAG, b's', nonce(8), family,
//!   address (4 or 16), port(2), padding]` names the address and port the request came from.
//!   The nonce binds the answer to the request: an off-path stranger cannot forge it.
//! - **bind** `[TAG, b'b', token(16), nonce(8), padding to BIND_LEN]`: the same answer, with the
//!   other end's address behind the first once that end is bound (where the peers may try a
//!   direct path: hole punching, `hurtle_proto::punch`), and the request's source becomes the
//!   token's end of its allocation (again on every bind: a NAT that moves the mapping is
//!   followed). A bind of `BIND_WITH_CANDIDATES_LEN` bytes may carry the end's own addresses
//!   after the request (`hurtle_engine::net::punch::with_candidates`, at most three IPv6
//!   ones): the relay keeps them, and its answer to the other end's bind of that length
//!   carries them at the same place, so that the peers may probe each other there too.
//!
//! An **allocation** ([`Forwarder::allocate`]) joins two ends, each named by a random 16-byte
//! token that the relay gives to one peer only (over that peer's TCP connection to it). Once
//! both ends are bound, every other datagram from one end's address goes, unchanged, to the
//! other's: the peers' datagrams are sealed end to end, and the relay holds no key and cannot
//! read or forge them. Datagrams from any other address are dropped. An allocation unused for
//! [`ALLOCATION_IDLE`] is forgotten; there are at most [`Limits::allocations`] of them, and at
//! most [`Limits::per_address`] made for one client address ([`crate::limit::client_key`]: an
//! IPv4 address or an IPv6 /64).
//!
//! **Bytes.** What one client address sends through the relay is limited to a rate
//! ([`Limits::bytes_per_sec`], a token bucket holding a quarter of a second of it): a datagram
//! over it is dropped and counted, which the peers' rate control sees as loss and slows for,
//! as on any path narrower than its sender. A rate and not a budget: a budget would cap the
//! size of a transfer (hurtle moves big files), where a rate only keeps one address from taking
//! all of the relay's bandwidth while others wait.
//!
//! The table ([`Forwarder`]) is pure, with an injected clock; [`serve`] is its thread.

use crate::limit::{client_key, Limiter, MAX_CLIENTS};
use hurtle_engine::net::dial::RELAY_TAG;
use hurtle_engine::net::punch::{
    candidates_in, with_candidates, BIND_WITH_CANDIDATES_LEN, CANDIDATES_AT,
};
use hurtle_engine::net::udp::{
    ChannelOptions, RecvBatch, UdpChannel, UdpError, GRO_BUF_SIZE, MAX_RECV_BUFFERS,
};
use rand::RngCore;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// First byte of the relay's own UDP messages (the engine's [`RELAY_TAG`]: no data or
/// punching datagram starts with it).
pub const TAG: u8 = RELAY_TAG;
/// Shortest request the relay answers.
pub const MIN_REQUEST: usize = 32;
/// Length of a bind request: room for an answer that names two IPv6 addresses.
pub const BIND_LEN: usize = 64;
/// An allocation that forwarded nothing for this long is forgotten.
pub const ALLOCATION_IDLE: Duration = Duration::from_secs(60);
/// Most allocations made for one client address at once, by default (a session needs one per
/// channel, at most [`crate::wire::MAX_UDP_CHANNELS`]: 16 sessions of 16 channels).
pub const ALLOCATIONS_PER_IP: usize = 256;
/// Bytes a second one client address may send through the relay, by default (1 Gbit/s).
pub const BYTES_PER_SEC: u64 = 125_000_000;

/// The forwarder's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most allocations held at once.
    pub allocations: usize,
    /// Most allocations made for one client address at once.
    pub per_address: usize,
    /// Bytes a second one client address may send through the relay (0: no limit).
    pub bytes_per_sec: u64,
}

impl Limits {
    /// At most `allocations`, and the per-address defaults.
    pub fn new(allocations: usize) -> Limits {
        Limits {
            allocations,
            per_address: ALLOCATIONS_PER_IP,
            bytes_per_sec: BYTES_PER_SEC,
        }
    }
}

/// A token naming one end of an allocation.
pub type Token = [u8; 16];

/// One end of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum End {
    A,
    B,
}

#[derive(Debug)]
struct Allocation {
    owner: IpAddr,
    ends: [Option<SocketAddr>; 2],
    /// Each end's own addresses, as its last bind gave them (see the module docs).
    candidates: [Vec<SocketAddr>; 2],
    tokens: [Token; 2],
    used: Instant,
    forwarded: u64,
}

/// What to do with a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send this answer back to where the request came from.
    Answer(Vec<u8>),
    /// Send the datagram, unchanged, here.
    Forward(SocketAddr),
    /// Nothing; the reason is counted.
    Drop(Dropped),
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A request shorter than [`MIN_REQUEST`], or of no known kind.
    Malformed,
    /// A bind with a token no allocation has.
    UnknownToken,
    /// Data from an address that is no end of an allocation.
    Stranger,
    /// Data from an end whose other end is not bound yet.
    Unpaired,
    /// Data over its sender's address's rate ([`Limits::bytes_per_sec`]).
    OverRate,
}

/// Counts of what the forwarder did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Datagrams forwarded, and their bytes.
    pub forwarded: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Requests answered.
    pub answered: u64,
    /// Dropped: malformed, unknown token, stranger, unpaired, over the rate.
    pub dropped: [u64; 5],
    /// Bytes dropped over the rate.
    pub over_rate_bytes: u64,
    /// Allocations refused: the relay's bound, one address's.
    pub refused: [u64; 2],
}

/// The allocations and the address table (see the module docs).
#[derive(Debug)]
pub struct Forwarder {
    limits: Limits,
    /// Bytes by sending client, when limited.
    rate: Option<Limiter>,
    allocations: HashMap<u64, Allocation>,
    by_token: HashMap<Token, (u64, End)>,
    by_addr: HashMap<SocketAddr, (u64, End)>,
    next_id: u64,
    counts: Counts,
}

impl Forwarder {
    /// A forwarder holding at most `max` allocations, with the per-address defaults.
    pub fn new(max: usize) -> Forwarder {
        Forwarder::with_limits(Limits::new(max))
    }

    /// A forwarder within `limits`.
    pub fn with_limits(limits: Limits) -> Forwarder {
        let rate = (limits.bytes_per_sec > 0).then(|| {
            let per_sec = limits.bytes_per_sec as f64;
            // A quarter of a second at the rate, and never less than a GRO buffer's worth.
            Limiter::with_capacity((per_sec / 4.0).max(65_536.0), per_sec, MAX_CLIENTS)
        });
        Forwarder {
            limits,
            rate,
            allocations: HashMap::new(),
            by_token: HashMap::new(),
            by_addr: HashMap::new(),
            next_id: 1,
            counts: Counts::default(),
        }
    }

    /// A new allocation for a session of a client at `owner`: its two tokens, one for each
    /// peer. `None` when the relay or that client holds too many.
    pub fn allocate(&mut self, now: Instant, owner: IpAddr) -> Option<(Token, Token)> {
        self.expire(now);
        let owner = client_key(owner);
        let held = self
            .allocations
            .values()
            .filter(|a| a.owner == owner)
            .count();
        if self.allocations.len() >= self.limits.allocations {
            self.counts.refused[0] += 1;
            return None;
        }
        if held >= self.limits.per_address {
            self.counts.refused[1] += 1;
            return None;
        }
        let mut tokens = [[0u8; 16]; 2];
        for t in &mut tokens {
            rand::rng().fill_bytes(t);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_token.insert(tokens[0], (id, End::A));
        self.by_token.insert(tokens[1], (id, End::B));
        self.allocations.insert(
            id,
            Allocation {
                owner,
                ends: [None, None],
                candidates: [Vec::new(), Vec::new()],
                tokens,
                used: now,
                forwarded: 0,
            },
        );
        Some((tokens[0], tokens[1]))
    }

    /// A datagram from `from` at `now`.
    pub fn on_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Verdict {
        let verdict = self.judge(now, from, datagram);
        match &verdict {
            Verdict::Answer(_) => self.counts.answered += 1,
            Verdict::Forward(_) => {
                self.counts.forwarded += 1;
                self.counts.bytes += datagram.len() as u64;
            }
            Verdict::Drop(why) => {
                self.counts.dropped[*why as usize] += 1;
                if *why == Dropped::OverRate {
                    self.counts.over_rate_bytes += datagram.len() as u64;
                }
            }
        }
        verdict
    }

    fn judge(&mut self, now: Instant, from: SocketAddr, d: &[u8]) -> Verdict {
        if d.first() == Some(&TAG) {
            if d.len() < MIN_REQUEST {
                return Verdict::Drop(Dropped::Malformed);
            }
            return match d[1] {
                b'o' => Verdict::Answer(seen(&d[2..10], from, None, d.len())),
                b'b' if d.len() >= BIND_LEN => {
                    let token: Token = d[2..18].try_into().unwrap_or_default();
                    let Some(&(id, end)) = self.by_token.get(&token) else {
                        return Verdict::Drop(Dropped::UnknownToken);
                    };
                    self.bind(now, id, end, from);
                    let peer = self.peer_of(from);
                    let answer = seen(&d[18..26], from, peer, d.len());
                    let Some(a) = self.allocations.get_mut(&id) else {
                        return Verdict::Answer(answer);
                    };
                    a.candidates[end as usize] = candidates_in(d);
                    // The other end's own addresses, once it is bound, where the request left
                    // room for them (never a longer answer than the request).
                    let theirs = &a.candidates[1 - end as usize];
                    if peer.is_none() || theirs.is_empty() || d.len() < BIND_WITH_CANDIDATES_LEN {
                        return Verdict::Answer(answer);
                    }
                    let mut answer = with_candidates(&answer[..CANDIDATES_AT], theirs);
                    answer.resize(d.len(), 0);
                    Verdict::Answer(answer)
                }
                _ => Verdict::Drop(Dropped::Malformed),
            };
        }
        let Some(&(id, end)) = self.by_addr.get(&from) else {
            return Verdict::Drop(Dropped::Stranger);
        };
        let Some(a) = self.allocations.get_mut(&id) else {
            return Verdict::Drop(Dropped::Stranger);
        };
        let other = match end {
            End::A => a.ends[1],
            End::B => a.ends[0],
        };
        match other {
            Some(_)
                if self
                    .rate
                    .as_mut()
                    .is_some_and(|r| !r.allow_n(from.ip(), d.len() as f64, now)) =>
            {
                Verdict::Drop(Dropped::OverRate)
            }
            Some(to) => {
                a.used = now;
                a.forwarded += 1;
                Verdict::Forward(to)
            }
            None => Verdict::Drop(Dropped::Unpaired),
        }
    }

    fn bind(&mut self, now: Instant, id: u64, end: End, from: SocketAddr) {
        let Some(a) = self.allocations.get_mut(&id) else {
            return;
        };
        let slot = &mut a.ends[end as usize];
        if let Some(old) = slot.replace(from) {
            if old != from {
                self.by_addr.remove(&old);
            }
        }
        a.used = now;
        // An address is one end of one allocation: the newest bind wins.
        if let Some((old_id, old_end)) = self.by_addr.insert(from, (id, end)) {
            if (old_id, old_end) != (id, end) {
                if let Some(old) = self.allocations.get_mut(&old_id) {
                    old.ends[old_end as usize] = None;
                }
            }
        }
    }

    /// Forgets the allocations unused for [`ALLOCATION_IDLE`].
    pub fn expire(&mut self, now: Instant) {
        let stale: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| now.saturating_duration_since(a.used) >= ALLOCATION_IDLE)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.release(id);
        }
    }

    fn release(&mut self, id: u64) {
        if let Some(a) = self.allocations.remove(&id) {
            for t in &a.tokens {
                self.by_token.remove(t);
            }
            for e in a.ends.into_iter().flatten() {
                if self.by_addr.get(&e).is_some_and(|&(i, _)| i == id) {
                    self.by_addr.remove(&e);
                }
            }
        }
    }

    /// Where data from `from` goes now: the other end of its allocation, if both are bound.
    pub fn peer_of(&self, from: SocketAddr) -> Option<SocketAddr> {
        let &(id, end) = self.by_addr.get(&from)?;
        let a = self.allocations.get(&id)?;
        match end {
            End::A => a.ends[1],
            End::B => a.ends[0],
        }
    }

    /// Allocations held now.
    pub fn len(&self) -> usize {
        self.allocations.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }

    /// What it did so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }
}

/// The answer to a request of `len` bytes with `nonce` from `from` (and the other end of its
/// allocation, `peer`, where it fits): as long as the request.
fn seen(nonce: &[u8], from: SocketAddr, peer: Option<SocketAddr>, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    out.push(TAG);
    out.push(b's');
    out.extend_from_slice(nonce);
    put_addr(&mut out, from);
    if let Some(p) = peer {
        let mut more = Vec::new();
        put_addr(&mut more, p);
        if out.len() + more.len() <= len {
            out.extend_from_slice(&more);
        }
    }
    out.resize(len.max(out.len()), 0);
    out.truncate(len);
    out
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a.ip().to_canonical() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&a.port().to_be_bytes());
}

/// An address at the start of `b` (as `put_addr` writes it), and the bytes after it.
fn get_addr(b: &[u8]) -> Option<(SocketAddr, &[u8])> {
    let (ip, rest): (IpAddr, &[u8]) = match *b.first()? {
        4 => {
            let o: [u8; 4] = b.get(1..5)?.try_into().ok()?;
            (IpAddr::from(o), &b[5..])
        }
        6 => {
            let o: [u8; 16] = b.get(1..17)?.try_into().ok()?;
            (IpAddr::from(o), &b[17..])
        }
        _ => return None,
    };
    let port = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
    Some((SocketAddr::new(ip, port), &rest[2..]))
}

/// A token from its hex form (as the relay protocol carries it).
pub fn parse_token(hex: &str) -> Option<Token> {
    if hex.len() != 32 {
        return None;
    }
    let mut t = [0u8; 16];
    for (i, b) in t.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(t)
}

/// An observe request with `nonce`.
pub fn observe_request(nonce: [u8; 8]) -> [u8; MIN_REQUEST] {
    let mut out = [0u8; MIN_REQUEST];
    out[0] = TAG;
    out[1] = b'o';
    out[2..10].copy_from_slice(&nonce);
    out
}

/// A bind request for `token` with `nonce`.
pub fn bind_request(token: &Token, nonce: [u8; 8]) -> [u8; BIND_LEN] {
    let mut out = [0u8; BIND_LEN];
    out[0] = TAG;
    out[1] = b'b';
    out[2..18].copy_from_slice(token);
    out[18..26].copy_from_slice(&nonce);
    out
}

/// The address an answer to the request with `nonce` names, if `datagram` is that answer.
pub fn parse_seen(datagram: &[u8], nonce: [u8; 8]) -> Option<SocketAddr> {
    parse_answer(datagram).filter(|a| a.0 == nonce).map(|a| a.1)
}

/// Any answer of the relay's: its nonce, the address the request came from, and the other
/// end's address if the answer names it (a bind's, once both ends are bound).
pub fn parse_answer(datagram: &[u8]) -> Option<([u8; 8], SocketAddr, Option<SocketAddr>)> {
    if datagram.len() < 13 || datagram[0] != TAG || datagram[1] != b's' {
        return None;
    }
    let nonce: [u8; 8] = datagram[2..10].try_into().ok()?;
    let (own, rest) = get_addr(&datagram[10..])?;
    let peer = get_addr(rest)
        .map(|(p, _)| p)
        .filter(|p| !p.ip().is_unspecified());
    Some((nonce, own, peer))
}

/// Socket buffers the relay asks for, each way: a session's bursts at line rate wait here, not
/// in drops (the kernel grants at most `net.core.rmem_max` / `wmem_max`).
pub const SOCKET_BUFFER: usize = 16 << 20;

/// The relay's UDP socket on `addr`, with [`SOCKET_BUFFER`] asked for, GRO and GSO where the
/// kernel has them, and batched receives. A port taken is [`io::ErrorKind::AddrInUse`].
pub fn bind(addr: SocketAddr) -> io::Result<UdpChannel> {
    let opts = ChannelOptions {
        recv_buffer: SOCKET_BUFFER,
        send_buffer: SOCKET_BUFFER,
        read_timeout: Some(Duration::from_secs(1)),
        gso: true,
    };
    UdpChannel::bind(addr, &opts).map_err(|e| match &e {
        hurtle_engine::net::udp::UdpError::Bind { source, .. } => io::Error::new(source.kind(), e),
        _ => io::Error::other(e),
    })
}

/// Serves `socket` with `forwarder` until the socket fails. Datagrams come in batches (one
/// `recvmmsg`, GRO merging a flow's datagrams of one size into one buffer); each is judged by
/// the table, and a merged buffer whose datagrams all go to one place leaves whole, in one GSO
/// send, so that a bulk flow costs a few system calls per batch, not two per datagram.
pub fn serve(mut socket: UdpChannel, forwarder: Arc<Mutex<Forwarder>>) -> io::Result<()> {
    let mut batch = RecvBatch::new(MAX_RECV_BUFFERS, GRO_BUF_SIZE);
    let mut last_expiry = Instant::now();
    // What to send: where, which bytes of which buffer (or an answer), per batch.
    let mut out: Vec<(SocketAddr, Range<usize>, usize, Vec<u8>)> = Vec::new();
    let mut verdicts: Vec<Verdict> = Vec::new();
    // The rate datagrams arrive at (bytes a second), measured over 10 ms or more: how long
    // they may gather ([`coalesce_time`]). Until measured, and after a quiet spell (a burst may
    // start at any rate), [`PRESUMED_RATE`].
    let (mut rate_since, mut rate_bytes, mut bytes_per_sec) = (Instant::now(), 0u64, PRESUMED_RATE);
    loop {
        let got = match socket.recv_batch(&mut batch) {
            Ok(n) => n,
            // An ICMP error for an earlier send surfaces on a receive.
            Err(UdpError::PeerUnreachable(_)) => continue,
            Err(UdpError::Io(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io::Error::other(e)),
        };
        let now = Instant::now();
        out.clear();
        {
            let mut f = forwarder.lock().unwrap_or_else(|e| e.into_inner());
            if now.duration_since(last_expiry) >= Duration::from_secs(1) {
                last_expiry = now;
                f.expire(now);
            }
            for (b, (from, buf, stride)) in batch.merged().enumerate() {
                verdicts.clear();
                verdicts.extend(buf.chunks(stride).map(|d| f.on_datagram(now, from, d)));
                let to = match verdicts.first() {
                    Some(Verdict::Forward(to)) => Some(*to),
                    _ => None,
                };
                if let Some(to) =
                    to.filter(|&to| verdicts.iter().all(|v| *v == Verdict::Forward(to)))
                {
                    out.push((to, 0..buf.len(), b, Vec::new()));
                    continue;
                }
                for (i, v) in verdicts.drain(..).enumerate() {
                    let at = i * stride..(i * stride + stride).min(buf.len());
                    match v {
                        Verdict::Forward(to) => out.push((to, at, b, Vec::new())),
                        Verdict::Answer(answer) => out.push((from, 0..0, b, answer)),
                        Verdict::Drop(_) => {}
                    }
                }
            }
        }
        // A send that fails (the peer's buffer, a route) loses datagrams, as the path would.
        let bufs: Vec<(&[u8], usize)> = batch.merged().map(|(_, buf, s)| (buf, s)).collect();
        rate_bytes += bufs.iter().map(|(b, _)| b.len() as u64).sum::<u64>();
        let measured = now.saturating_duration_since(rate_since);
        if measured >= Duration::from_millis(100) {
            bytes_per_sec = PRESUMED_RATE;
            (rate_since, rate_bytes) = (now, 0);
        } else if measured >= Duration::from_millis(10) {
            bytes_per_sec = rate_bytes as f64 / measured.as_secs_f64();
            (rate_since, rate_bytes) = (now, 0);
        }
        let mut forwarded = false;
        for (to, range, b, answer) in &out {
            let (buf, stride) = bufs[*b];
            forwarded |= answer.is_empty();
            let _ = if answer.is_empty() {
                socket.send_batch(*to, &buf[range.clone()], stride)
            } else {
                socket.send_batch(*to, answer, answer.len())
            };
        }
        if forwarded && got < COALESCE_BELOW {
            std::thread::sleep(coalesce_time(bytes_per_sec, socket.granted_recv_buffer()));
        }
    }
}

/// How long datagrams arriving at `bytes_per_sec` may gather in a receive buffer of `room`
/// bytes: [`COALESCE`], or less if that would fill more than an eighth of it (the kernel
/// charges each datagram up to about twice its size, and a burst may come meanwhile).
pub fn coalesce_time(bytes_per_sec: f64, room: usize) -> Duration {
    Duration::from_secs_f64(room as f64 / 8.0 / bytes_per_sec.max(1.0)).min(COALESCE)
}

/// After a batch that forwarded data but held fewer than [`COALESCE_BELOW`] datagrams, the
/// relay lets datagrams gather up to this long before it reads again ([`coalesce_time`]: less
/// where the socket's buffer would fill). A paced session's datagrams come one by one; read as
/// they come, each wake-up (a `poll` and a `recvmmsg`) carried about three of them, and the
/// relay spent 2.8-3.0 CPU-s per GiB forwarded at 430 Mbit/s with 1400-byte datagrams (63,000
/// context switches in 8 s). Gathered for a while, a read takes what arrived meanwhile (GRO
/// merges a flow's datagrams into one buffer, sent on in one GSO send), and a forwarded
/// datagram waits at most this much longer: nothing on a path where relaying is worth it.
/// Wake-ups are most of what is left (a third of the relay's samples in the scheduler's
/// context switch on a VM): at 440 Mbit/s on loopback, with nothing emulated, the relay took
/// 1.0-1.1 CPU-s/GiB gathering 200 µs, 0.55-0.67 with 1 ms, 0.45-0.50 with 2 ms; through the
/// emulated intercontinental path 2.16-2.29 with 200 µs, 1.71-1.80 with 2 ms, at the same
/// goodput (433-440 against 433-435 Mbit/s, 4 runs each; BENCHMARKS.md 5b). Full batches (a
/// busy relay) never wait.
pub const COALESCE: Duration = Duration::from_millis(2);
/// The arrival rate the relay presumes, bytes a second, before it has measured one over 10 ms
/// (and after 100 ms without a datagram): 10 Gbit/s, so that a burst's first wait cannot
/// overflow the socket's buffer.
pub const PRESUMED_RATE: f64 = 1.25e9;
/// Batches of fewer datagrams than this are followed by [`coalesce_time`].
pub const COALESCE_BELOW: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn observe_names_the_source_and_is_never_longer_than_the_request() {
        let mut f = Forwarder::new(8);
        let t0 = Instant::now();
        for from in [a("198.51.100.7:40000"), a("[2001:db8::7]:40001")] {
            let req = observe_request([1, 2, 3, 4, 5, 6, 7, 8]);
            let Verdict::Answer(ans) = f.on_datagram(t0, from, &req) else {
                panic!("no answer");
            };
            assert!(ans.len() <= req.len());
            assert_eq!(parse_seen(&ans, [1, 2, 3, 4, 5, 6, 7, 8]), Some(from));
            // Another request's nonce: not our answer.
            assert_eq!(parse_seen(&ans, [0; 8]), None);
        }
        // Short or unknown requests get nothing.
        assert_eq!(
            f.on_datagram(t0, a("198.51.100.7:1"), &observe_request([0; 8])[..20]),
            Verdict::Drop(Dropped::Malformed)
        );
        let mut odd = observe_request([0; 8]);
        odd[1] = b'x';
        assert_eq!(
            f.on_datagram(t0, a("198.51.100.7:1"), &odd),
            Verdict::Drop(Dropped::Malformed)
        );
    }

    #[test]
    fn datagrams_gather_at_most_2_ms_and_never_past_an_eighth_of_the_buffer() {
        // 440 Mbit/s into 4 MiB: the full 2 ms (110 kB, under 512 kB).
        assert_eq!(coalesce_time(55e6, 4 << 20), COALESCE);
        // 10 Gbit/s into 4 MiB: 512 kB lasts 0.42 ms.
        let t = coalesce_time(1.25e9, 4 << 20);
        assert!(
            t > Duration::from_micros(400) && t < Duration::from_micros(430),
            "{t:?}"
        );
        // 440 Mbit/s into the kernel's default 208 kB: 26 kB lasts 0.47 ms.
        let t = coalesce_time(55e6, 212_992);
        assert!(
            t > Duration::from_micros(470) && t < Duration::from_micros(490),
            "{t:?}"
        );
        // Nothing measured yet: the full time.
        assert_eq!(coalesce_time(0.0, 212_992), COALESCE);
    }

    #[test]
    fn binds_carry_each_end_s_own_addresses_to_the_other_and_answers_stay_as_long() {
        use hurtle_engine::net::punch::{candidates_in, with_candidates};
        let mut f = Forwarder::new(8);
        let t0 = Instant::now();
        let (ta, tb) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        let (pa, pb) = (a("198.51.100.7:40000"), a("203.0.113.9:50000"));
        let (va, vb) = (a("[fd00::1]:40000"), a("[2001:db8::2]:50000"));
        let bind = |t: &Token, own: SocketAddr| with_candidates(&bind_request(t, [3; 8]), &[own]);
        let answer = |f: &mut Forwarder, from, d: &[u8]| match f.on_datagram(t0, from, d) {
            Verdict::Answer(x) => x,
            v => panic!("{v:?}"),
        };
        // Alone: no other end, so none of its addresses.
        let first = answer(&mut f, pa, &bind(&ta, va));
        assert_eq!(first.len(), BIND_WITH_CANDIDATES_LEN);
        assert!(candidates_in(&first).is_empty());
        // The second end hears the first's address as seen, and its own.
        let second = answer(&mut f, pb, &bind(&tb, vb));
        assert_eq!(parse_answer(&second), Some(([3; 8], pb, Some(pa))));
        assert_eq!(candidates_in(&second), vec![va]);
        assert_eq!(second.len(), BIND_WITH_CANDIDATES_LEN);
        // And the first, binding again, the second's.
        let again = answer(&mut f, pa, &bind(&ta, va));
        assert_eq!(parse_answer(&again), Some(([3; 8], pa, Some(pb))));
        assert_eq!(candidates_in(&again), vec![vb]);
        // A plain bind (no room) gets a plain answer, no longer than it.
        let plain = answer(&mut f, pa, &bind_request(&ta, [4; 8]));
        assert_eq!(plain.len(), BIND_LEN);
        assert!(candidates_in(&plain).is_empty());
        assert_eq!(parse_answer(&plain), Some(([4; 8], pa, Some(pb))));
        // That plain bind said the first end has no addresses of its own now.
        let later = answer(&mut f, pb, &bind(&tb, vb));
        assert!(candidates_in(&later).is_empty());
    }

    #[test]
    fn bound_ends_forward_to_each_other_and_strangers_are_dropped() {
        let mut f = Forwarder::new(8);
        let t0 = Instant::now();
        let (ta, tb) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        let (pa, pb, evil) = (
            a("198.51.100.7:40000"),
            a("203.0.113.9:50000"),
            a("192.0.2.66:666"),
        );
        let data = [0x21u8; 1200];
        // Before the other end is there.
        let Verdict::Answer(first) = f.on_datagram(t0, pa, &bind_request(&ta, [9; 8])) else {
            panic!("no answer");
        };
        // Alone so far: the answer names no other end.
        assert_eq!(parse_answer(&first), Some(([9; 8], pa, None)));
        assert_eq!(
            f.on_datagram(t0, pa, &data),
            Verdict::Drop(Dropped::Unpaired)
        );
        f.on_datagram(t0, pb, &bind_request(&tb, [8; 8]));
        assert_eq!(f.on_datagram(t0, pa, &data), Verdict::Forward(pb));
        assert_eq!(f.on_datagram(t0, pb, &data), Verdict::Forward(pa));
        assert_eq!(
            f.on_datagram(t0, evil, &data),
            Verdict::Drop(Dropped::Stranger)
        );
        // A bind's answer names the other end once it is bound.
        let Verdict::Answer(ans) = f.on_datagram(t0, pb, &bind_request(&tb, [5; 8])) else {
            panic!("no answer");
        };
        assert_eq!(parse_answer(&ans), Some(([5; 8], pb, Some(pa))));
        // A guessed token binds nothing.
        assert_eq!(
            f.on_datagram(t0, evil, &bind_request(&[0; 16], [0; 8])),
            Verdict::Drop(Dropped::UnknownToken)
        );
        // An end's NAT moved its mapping: the next bind follows it, the old address is out.
        let pa2 = a("198.51.100.7:40002");
        f.on_datagram(t0, pa2, &bind_request(&ta, [7; 8]));
        assert_eq!(f.on_datagram(t0, pb, &data), Verdict::Forward(pa2));
        assert_eq!(
            f.on_datagram(t0, pa, &data),
            Verdict::Drop(Dropped::Stranger)
        );
        let c = f.counts();
        assert_eq!((c.forwarded, c.bytes), (3, 3 * 1200));
    }

    #[test]
    fn allocations_are_bounded_per_client_and_in_all_and_expire_when_unused() {
        let mut f = Forwarder::new(ALLOCATIONS_PER_IP + 2);
        let t0 = Instant::now();
        let greedy: IpAddr = "192.0.2.1".parse().unwrap();
        let (first, _) = f.allocate(t0, greedy).unwrap();
        for _ in 1..ALLOCATIONS_PER_IP {
            assert!(f.allocate(t0, greedy).is_some());
        }
        assert!(f.allocate(t0, greedy).is_none(), "one client's share");
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(f.allocate(t0, other).is_some());
        assert!(f.allocate(t0, other).is_some());
        assert!(f.allocate(t0, other).is_none(), "the relay's bound");
        // Unused for the idle time: gone, and their tokens with them.
        let later = t0 + ALLOCATION_IDLE;
        f.expire(later);
        assert!(f.is_empty());
        let from = a("198.51.100.1:1");
        assert_eq!(
            f.on_datagram(later, from, &bind_request(&first, [0; 8])),
            Verdict::Drop(Dropped::UnknownToken)
        );
        let (fresh, _) = f.allocate(later, greedy).unwrap();
        assert!(matches!(
            f.on_datagram(later, from, &bind_request(&fresh, [0; 8])),
            Verdict::Answer(_)
        ));
    }

    proptest::proptest! {
        /// Whatever arrives from whom, in any order: no panic, an answer never longer than
        /// its request, and a datagram forwarded only from one bound end to the other's
        /// address as last bound.
        #[test]
        fn forwarding_follows_the_binds_whatever_arrives(
            steps in proptest::collection::vec((0usize..4, 0u8..5, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)), 0..60)
        ) {
            let mut f = Forwarder::new(4);
            let t0 = Instant::now();
            let (ta, tb) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
            let addrs = [a("198.51.100.1:1"), a("198.51.100.2:2"), a("203.0.113.3:3"), a("192.0.2.4:4")];
            let mut ends: [Option<SocketAddr>; 2] = [None, None];
            for (i, (who, kind, bytes)) in steps.into_iter().enumerate() {
                let from = addrs[who];
                let now = t0 + Duration::from_millis(i as u64);
                let dgram: Vec<u8> = match kind {
                    0 => bind_request(&ta, [1; 8]).to_vec(),
                    1 => bind_request(&tb, [2; 8]).to_vec(),
                    2 => observe_request([3; 8]).to_vec(),
                    3 => { let mut d = vec![TAG]; d.extend(&bytes); d }
                    _ => { let mut d = vec![0x21]; d.extend(&bytes); d }
                };
                match f.on_datagram(now, from, &dgram) {
                    Verdict::Answer(ans) => proptest::prop_assert!(ans.len() <= dgram.len()),
                    Verdict::Forward(to) => {
                        let (mine, other) = if ends[0] == Some(from) { (0, 1) } else { (1, 0) };
                        proptest::prop_assert_eq!(ends[mine], Some(from));
                        proptest::prop_assert_eq!(ends[other], Some(to));
                    }
                    Verdict::Drop(_) => {}
                }
                // The model: a bind moves its end to the binder, and takes the binder off the
                // other end.
                if kind < 2 {
                    let e = usize::from(kind);
                    if ends[1 - e] == Some(from) {
                        ends[1 - e] = None;
                    }
                    ends[e] = Some(from);
                }
            }
        }
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_its_share_is_configurable() {
        let mut f = Forwarder::with_limits(Limits {
            per_address: 2,
            ..Limits::new(100)
        });
        let t0 = Instant::now();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(f.allocate(t0, ip("2001:db8:1:2::1")).is_some());
        assert!(f.allocate(t0, ip("2001:db8:1:2:ffff::9")).is_some());
        assert!(f.allocate(t0, ip("2001:db8:1:2::3")).is_none(), "one /64");
        assert!(f.allocate(t0, ip("2001:db8:1:3::1")).is_some());
        assert_eq!(f.counts().refused, [0, 1]);
    }

    #[test]
    fn an_addresses_bytes_over_its_rate_are_dropped_and_counted() {
        // 100 kB/s per address: a burst of 65,536 bytes (the floor), then the rate.
        let mut f = Forwarder::with_limits(Limits {
            allocations: 8,
            per_address: 8,
            bytes_per_sec: 100_000,
        });
        let t0 = Instant::now();
        let (ta, tb) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        let (tc, td) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        let (pa, pb) = (a("198.51.100.7:40000"), a("203.0.113.9:50000"));
        // A second session from the same address (another port): the same budget.
        let pc = a("198.51.100.7:40001");
        let pd = a("203.0.113.10:50000");
        f.on_datagram(t0, pa, &bind_request(&ta, [0; 8]));
        f.on_datagram(t0, pb, &bind_request(&tb, [0; 8]));
        f.on_datagram(t0, pc, &bind_request(&tc, [0; 8]));
        f.on_datagram(t0, pd, &bind_request(&td, [0; 8]));
        let d = [0x21u8; 1000];
        let mut passed = 0u64;
        // 2 seconds of 10 MB/s from 198.51.100.7, alternating its two sockets.
        for i in 0..20_000u64 {
            let now = t0 + Duration::from_micros(100 * i);
            let from = if i % 2 == 0 { pa } else { pc };
            match f.on_datagram(now, from, &d) {
                Verdict::Forward(_) => passed += 1000,
                v => assert_eq!(v, Verdict::Drop(Dropped::OverRate)),
            }
        }
        assert!(
            (200_000..=65_536 + 200_000 + 1000).contains(&passed),
            "{passed} bytes in 2 s"
        );
        // The other end, another address, is not held back by it.
        assert_eq!(f.on_datagram(t0, pb, &d), Verdict::Forward(pa));
        let c = f.counts();
        assert_eq!(
            c.dropped[Dropped::OverRate as usize] * 1000,
            c.over_rate_bytes
        );
        assert_eq!(c.over_rate_bytes, 20_000 * 1000 - passed);
        // Off: everything passes.
        let mut free = Forwarder::with_limits(Limits {
            bytes_per_sec: 0,
            ..Limits::new(8)
        });
        let (ta, tb) = free.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        free.on_datagram(t0, pa, &bind_request(&ta, [0; 8]));
        free.on_datagram(t0, pb, &bind_request(&tb, [0; 8]));
        assert!((0..1000).all(|_| free.on_datagram(t0, pa, &d) == Verdict::Forward(pb)));
    }

    #[test]
    fn forwarding_keeps_an_allocation_alive() {
        let mut f = Forwarder::new(8);
        let t0 = Instant::now();
        let (ta, tb) = f.allocate(t0, "192.0.2.1".parse().unwrap()).unwrap();
        let (pa, pb) = (a("198.51.100.7:40000"), a("203.0.113.9:50000"));
        f.on_datagram(t0, pa, &bind_request(&ta, [0; 8]));
        f.on_datagram(t0, pb, &bind_request(&tb, [0; 8]));
        let t1 = t0 + ALLOCATION_IDLE / 2;
        assert_eq!(f.on_datagram(t1, pa, &[1; 100]), Verdict::Forward(pb));
        f.expire(t0 + ALLOCATION_IDLE);
        assert_eq!(f.len(), 1);
        f.expire(t1 + ALLOCATION_IDLE);
        assert!(f.is_empty());
        assert_eq!(
            f.on_datagram(t1, pa, &[1; 100]),
            Verdict::Drop(Dropped::Stranger)
        );
    }
}
