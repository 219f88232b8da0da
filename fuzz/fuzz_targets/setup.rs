//! Hostile control messages into both set-up machines (`hurtle_proto::session`), driven the way
//! the engine drives them: never a panic, and a set-up that ends ready agrees with itself.
//!
//! The input is cut into messages, each a one-byte length and that many bytes of a control
//! message body; what does not decode is skipped. The first byte picks what the receiver
//! decides for every entry (send, have, unchanged, resume).
#![no_main]
use hurtle_proto::session::{
    files, Intake, ReceiverEvent, ReceiverLimits, ReceiverSetup, SenderEvent, SenderParams,
    SenderSetup, Setup,
};
use hurtle_proto::wire::{Control, Decision, Entry, EntryKind};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

fn messages(data: &[u8]) -> Vec<Control> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        if let Ok(msg) = Control::from_body(&tail[..len]) {
            out.push(msg);
        }
        rest = &tail[len..];
    }
    out
}

fn decision(pick: u8, i: usize) -> Decision {
    match (pick as usize + i) % 4 {
        0 => Decision::SendAll,
        1 => Decision::Have {
            hash: [pick; 32],
            replace_ok: pick % 2 == 0,
        },
        2 => Decision::Unchanged,
        _ => Decision::Resume {
            blocks: vec![(0, 1)],
        },
    }
}

fn manifest() -> Vec<Entry> {
    let file = |path: &str, size| Entry {
        path: path.into(),
        kind: EntryKind::File,
        size,
        mode: 0o644,
        mtime_ns: 1,
        holes: Vec::new(),
    };
    vec![file("a", 3 << 16), file("b", 0), file("c", 10)]
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let msgs = messages(rest);
    let t0 = Instant::now();

    let mut r = ReceiverSetup::new(ReceiverLimits { max_channels: 8 }, t0);
    for (i, m) in msgs.iter().enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        let _ = r.handle(m.clone(), now);
        let _ = r.handle_timeout(now);
        while let Some(ev) = r.poll_event() {
            match ev {
                ReceiverEvent::Hello(h) => {
                    let port = h.race.then_some(9999);
                    let _ = r.accept((0..h.channels).collect(), port, Intake::default(), now);
                }
                ReceiverEvent::Manifest => {
                    let d = (0..r.entries().len()).map(|i| decision(pick, i)).collect();
                    let _ = r.reply(d, now);
                }
                ReceiverEvent::Ready => {
                    let a = r.agreed().expect("an outcome when ready");
                    assert_eq!(a.skips.len(), files(r.entries()).count());
                    assert_eq!(a.layout.channels(), a.channels);
                }
            }
        }
        while r.poll_transmit().is_some() {}
    }

    let params = SenderParams {
        channels: 4,
        payload: 1384,
        block_size: 1 << 16,
        session: 7,
        tcp: pick % 2 == 1,
        race: pick % 4 < 2,
        checksum: pick % 3 == 0,
    };
    let mut s = SenderSetup::new(params, manifest(), t0);
    for (i, m) in msgs.into_iter().enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        let _ = s.handle(m, now);
        while let Some(ev) = s.poll_event() {
            match ev {
                SenderEvent::HashWanted { file } => {
                    let _ = s.hashed(file, [pick; 32]);
                }
                SenderEvent::Ready => {
                    let a = s.agreed().expect("an outcome when ready");
                    assert_eq!(a.skips.len(), 3);
                    assert!(a.channels >= 1 && a.channels <= 4);
                    let _ = s.start(1384, 1000);
                }
                SenderEvent::Accepted(_) | SenderEvent::ProbeAck { .. } => {}
            }
        }
        while s.poll_transmit().is_some() {}
    }
});
