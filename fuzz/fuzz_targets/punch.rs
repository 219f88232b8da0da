//! Any datagrams, from any addresses, given to a started hole puncher: never a panic, and
//! never a direct path without an answer that carries the session key's tag and one of our
//! nonces (which random bytes do not forge).
#![no_main]
use hurtle_proto::punch::{Candidate, CandidateKind, Message, PunchEvent, Puncher, Role};
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let key = [3u8; 32];
    let peer: SocketAddr = "203.0.113.9:6000".parse().unwrap();
    let mut p = Puncher::new(
        Role::Sender,
        &key,
        &[Candidate {
            addr: peer,
            kind: CandidateKind::Reflexive,
        }],
        7,
    );
    let t0 = Instant::now();
    p.start(t0);
    // Chunks of the input: a port byte, then up to 40 bytes of datagram.
    for (i, chunk) in data.chunks(41).enumerate() {
        let (&port, dgram) = chunk.split_first().unwrap_or((&0, &[]));
        let from = SocketAddr::new("192.0.2.1".parse().unwrap(), u16::from(port));
        let now = t0 + Duration::from_millis(i as u64 * 10);
        p.on_datagram(now, from, dgram);
        p.handle_timeout(now);
        while p.poll_transmit().is_some() {}
        if let Some(PunchEvent::Direct { .. }) = p.poll_event() {
            panic!("a direct path from bytes without the key");
        }
        let _ = Message::decode(dgram, &ring_key(&key));
    }
});

fn ring_key(key: &[u8; 32]) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key)
}
