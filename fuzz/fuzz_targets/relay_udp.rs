//! Any datagrams, from any of a few addresses, given to the relay's UDP forwarder
//! (`hurtle_relay::udp::Forwarder::on_datagram`), between allocations, binds with the real
//! tokens, and a clock that moves: never a panic, and
//!
//! - an answer is exactly as long as its request (no amplification) and names the request's
//!   nonce and source (and, when it names one, the source's bound peer);
//! - a datagram is forwarded only from an address that bound an end with a real token, only
//!   to the other end of that allocation, never back to its source, and never a relay
//!   request;
//! - what one client forwards stays within its byte rate (the bucket's burst plus the rate
//!   times the time passed);
//! - every datagram gets one verdict, and the forwarder's counts say so.
//!
//! The input is a list of operations (see `Op` below); bytes run out, operations end.
#![no_main]
use hurtle_relay::limit::client_key;
use hurtle_relay::udp::{
    bind_request, observe_request, parse_answer, Dropped, Forwarder, Limits, Token, Verdict,
    BIND_LEN, MIN_REQUEST, TAG,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

const RATE: u64 = 100_000;
/// The forwarder's bucket holds a quarter of a second of the rate, and at least 64 KiB.
const BURST: f64 = 65_536.0;

fn addrs() -> Vec<SocketAddr> {
    [
        "192.0.2.1:1000",
        "192.0.2.1:1001",
        "192.0.2.2:1000",
        "198.51.100.7:5",
        "[2001:db8::1]:7",
        "[2001:db8::2]:7",
        "[::ffff:192.0.2.2]:1000",
        "[2001:db8:1::9]:65535",
    ]
    .iter()
    .map(|a| a.parse().unwrap())
    .collect()
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn nonce(&mut self) -> [u8; 8] {
        let mut n = [0u8; 8];
        let got = self.take(8);
        n[..got.len()].copy_from_slice(got);
        n
    }
}

struct Run {
    fw: Forwarder,
    t0: Instant,
    now: Instant,
    addrs: Vec<SocketAddr>,
    tokens: Vec<Token>,
    bound: HashSet<SocketAddr>,
    sent: u64,
    forwarded: HashMap<IpAddr, u64>,
    forwarded_bytes: u64,
}

impl Run {
    fn datagram(&mut self, from: SocketAddr, d: &[u8]) {
        let verdict = self.fw.on_datagram(self.now, from, d);
        self.sent += 1;
        match verdict {
            Verdict::Answer(answer) => {
                assert_eq!(answer.len(), d.len(), "an answer as long as its request");
                assert!(d.len() >= MIN_REQUEST && d[0] == TAG);
                let (nonce, own, peer) = parse_answer(&answer).expect("an answer parses");
                let at = if d[1] == b'b' { 18 } else { 2 };
                assert_eq!(nonce[..], d[at..at + 8]);
                assert_eq!(own, canonical(from));
                if let Some(p) = peer {
                    assert_eq!(Some(p), self.fw.peer_of(from).map(canonical));
                }
                if d[1] == b'b' {
                    self.bound.insert(from);
                }
            }
            Verdict::Forward(to) => {
                assert!(d.first() != Some(&TAG), "a relay request forwarded");
                assert_ne!(to, from, "forwarded back to its source");
                assert!(
                    self.bound.contains(&from),
                    "forwarded from {from}, never bound"
                );
                assert_eq!(self.fw.peer_of(from), Some(to));
                let client = client_key(from.ip());
                let total = self.forwarded.entry(client).or_default();
                *total += d.len() as u64;
                let elapsed = self.now.duration_since(self.t0).as_secs_f64();
                assert!(
                    (*total as f64) <= BURST + RATE as f64 * elapsed + 1.0,
                    "{client} forwarded {total} bytes in {elapsed} s"
                );
                self.forwarded_bytes += d.len() as u64;
            }
            Verdict::Drop(why) => {
                if why == Dropped::Malformed {
                    assert_eq!(d.first(), Some(&TAG));
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut run = Run {
        fw: Forwarder::with_limits(Limits {
            allocations: 6,
            per_address: 3,
            bytes_per_sec: RATE,
        }),
        t0,
        now: t0,
        addrs: addrs(),
        tokens: Vec::new(),
        bound: HashSet::new(),
        sent: 0,
        forwarded: HashMap::new(),
        forwarded_bytes: 0,
    };
    let mut input = Bytes(data);
    while let Some(op) = input.byte() {
        let n = run.addrs.len();
        let from = run.addrs[usize::from(input.byte().unwrap_or(0)) % n];
        match op % 6 {
            // Allocate for the client of `from`.
            0 => {
                if let Some((a, b)) = run.fw.allocate(run.now, from.ip()) {
                    run.tokens.extend([a, b]);
                }
                assert!(run.fw.len() <= 6);
            }
            // Bind an end with a real token (or a made-up one when none is held).
            1 => {
                let pick = usize::from(input.byte().unwrap_or(0));
                let token = run
                    .tokens
                    .get(pick % run.tokens.len().max(1))
                    .copied()
                    .unwrap_or([pick as u8; 16]);
                let mut d = bind_request(&token, input.nonce()).to_vec();
                d.resize(BIND_LEN + usize::from(input.byte().unwrap_or(0) % 64), 0);
                run.datagram(from, &d);
            }
            // Any bytes.
            2 => {
                let len = usize::from(input.byte().unwrap_or(0));
                let d = input.take(len).to_vec();
                run.datagram(from, &d);
            }
            // A burst of data datagrams.
            3 => {
                let size = 1 + usize::from(input.byte().unwrap_or(0)) * 8;
                let count = input.byte().unwrap_or(0);
                let d = vec![0x40u8; size];
                for _ in 0..count {
                    run.datagram(from, &d);
                }
            }
            // The clock moves (and idle allocations are forgotten).
            4 => {
                let ms = u16::from_be_bytes([input.byte().unwrap_or(0), input.byte().unwrap_or(0)]);
                run.now += Duration::from_millis(u64::from(ms));
                run.fw.expire(run.now);
            }
            // An observe request, padded.
            _ => {
                let mut d = observe_request(input.nonce()).to_vec();
                d.resize(MIN_REQUEST + usize::from(input.byte().unwrap_or(0)), 0);
                run.datagram(from, &d);
            }
        }
    }
    let c = run.fw.counts();
    assert_eq!(
        c.forwarded + c.answered + c.dropped.iter().sum::<u64>(),
        run.sent
    );
    assert_eq!(c.bytes, run.forwarded_bytes);
});
