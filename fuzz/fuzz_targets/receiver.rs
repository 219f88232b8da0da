//! Hostile datagrams fed to a channel receiver through the same checks the driver makes: the
//! receiver's accounting never panics and never counts more bytes than its stripe holds.
#![no_main]
use hurtle_proto::wire::{Header, Kind, FLAG_RETRANSMIT};
use hurtle_proto::{ChannelReceiver, Layout, RecvConfig};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let layout = Layout::new(&[10_000, 0, 5000], 1024, 2).unwrap();
    let mut recv: Vec<ChannelReceiver> = (0..2).map(|c| ChannelReceiver::new(c, layout.stripe_len(c), RecvConfig::default())).collect();
    let t0 = Instant::now();
    for (i, chunk) in data.chunks(48).enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        let Ok((h, _)) = Header::decode(chunk) else { continue };
        let Some(r) = recv.get_mut(usize::from(h.channel)) else { continue };
        match h.kind {
            Kind::Data => {
                if let Ok(p) = layout.place(h.file, h.offset, u64::from(h.len)) {
                    if p.channel == h.channel {
                        r.on_data(now, p.pos, u64::from(h.len), h.flags & FLAG_RETRANSMIT != 0, p.block_stripe);
                    }
                }
            }
            Kind::Final => {
                r.on_final(now, h.offset);
            }
            Kind::Probe => {}
        }
        let _ = r.poll_nack(now);
    }
    for (c, r) in recv.iter().enumerate() {
        assert!(r.received_bytes() <= layout.stripe_len(c as u16));
    }
});
