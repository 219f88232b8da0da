//! Hostile datagrams fed to channel receivers through the same admission the engine's channel
//! threads use (`hurtle_proto::admit`): admission never panics, gives every datagram exactly
//! one verdict, counts only what it admitted, and a receiver never counts more bytes than its
//! stripe holds. Parity is kept and rebuilt from without a panic, whatever its descriptor.
#![no_main]
use hurtle_proto::admit::{Admit, Tally};
use hurtle_proto::fec::{self, ParityStore};
use hurtle_proto::wire::{Header, HEADER_LEN};
use hurtle_proto::{Admission, ChannelReceiver, Layout, RecvConfig};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

const SESSION: u32 = 0;

fuzz_target!(|data: &[u8]| {
    let layout = Layout::new(&[10_000, 0, 5000], 1024, 2).unwrap();
    let t0 = Instant::now();
    let mut admissions: Vec<Admission> = (0..2)
        .map(|c| Admission::new(SESSION, c..c + 1, t0))
        .collect();
    let mut recv: Vec<ChannelReceiver> = (0..2)
        .map(|c| ChannelReceiver::new(c, layout.stripe_len(c), RecvConfig::default()))
        .collect();
    let mut stores = vec![ParityStore::new(); 2];
    let (mut admitted, mut admitted_bytes, mut probes, mut verdicts) = (0u64, 0u64, 0u64, 0u64);
    for (i, chunk) in data.chunks(48).enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        // As on one socket per channel: the header's channel picks the socket, and a datagram
        // that names none (or does not decode) lands on channel 0's.
        let ch = Header::decode(chunk).map_or(0, |(h, _)| usize::from(h.channel));
        let ch = if ch < admissions.len() { ch } else { 0 };
        let (verdict, payload) = admissions[ch].admit_datagram(now, &layout, chunk);
        verdicts += 1;
        let r = &mut recv[ch];
        match verdict {
            Admit::Data(p) => {
                assert_eq!(p.place.channel as usize, ch);
                assert_eq!(payload.len() as u64, p.len);
                r.on_data(now, p.place.pos, p.len, p.retransmit, p.place.block_stripe);
                admitted += 1;
                admitted_bytes += (HEADER_LEN + payload.len()) as u64;
            }
            Admit::Final {
                channel,
                stripe_len,
            } => {
                assert_eq!(usize::from(channel), ch);
                assert!(
                    r.on_final(now, stripe_len),
                    "admission checked the stripe length"
                );
                r.resend_done();
                admitted += 1;
                admitted_bytes += HEADER_LEN as u64 + payload.len() as u64;
            }
            Admit::Parity { place, desc } => {
                assert_eq!(place.place.channel as usize, ch);
                assert_eq!(payload.len(), usize::from(desc.piece));
                let pos = place.place.pos;
                stores[ch].add(pos, place.file, place.offset, desc, payload);
                if let Some(g) = stores[ch].get(pos) {
                    if let Some(rebuilt) = fec::recover(&g.desc, |_| None, &g.shards) {
                        assert!(rebuilt.len() <= g.desc.pieces());
                    }
                }
                admitted += 1;
                admitted_bytes += (HEADER_LEN + fec::DESC_LEN + payload.len()) as u64;
            }
            Admit::Probe { channel, size } => {
                assert_eq!(usize::from(channel), ch);
                assert_eq!(usize::from(size), chunk.len());
                probes += 1;
            }
            Admit::Reject(_) => {}
        }
        let _ = r.poll_nack(now);
    }
    let mut totals = Tally::default();
    for (a, r) in admissions.iter().zip(&recv) {
        totals.add(&a.tally());
        assert_eq!(a.tally().rejected, a.rejected().total());
        assert!(r.received_bytes() <= layout.stripe_len(a.channels().start));
    }
    assert_eq!((totals.datagrams, totals.bytes), (admitted, admitted_bytes));
    assert_eq!(totals.datagrams + totals.rejected + probes, verdicts);
    assert_eq!(totals.delay_count, totals.datagrams);
});
