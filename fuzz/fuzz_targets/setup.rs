//! Hostile control messages into both set-up machines (`hurtle_proto::session`), driven the way
//! the engine drives them: never a panic, and a set-up that ends ready agrees with itself.
//!
//! The input is cut into messages, each a one-byte length and that many bytes of a control
//! message body; what does not decode is skipped. The first byte picks what the receiver
//! decides for every entry (send, have, unchanged, resume) and the sender's capabilities.
//!
//! The receiver checks the first message as the hello ([`check_hello`], as the engine does with
//! what comes behind the key agreement's `Agree`); if it is not a good one, the receiver takes
//! the sender's own hello instead and reads every message, so that a fuzzer which has not found
//! a hello's encoding still reaches the rest of the machine. It opens the data path at once
//! ([`ReceiverSetup::accept`]).
#![no_main]
use hurtle_proto::session::{
    check_hello, data_session, files, Agreed, Intake, ReceiverEvent, ReceiverLimits, ReceiverSetup,
    SenderEvent, SenderParams, SenderSetup, Setup,
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
            replace_ok: pick.is_multiple_of(2),
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
        target: String::new(),
    };
    // A link among the files: no file id, no data, whatever the receiver answers for it.
    let link = Entry {
        kind: EntryKind::Symlink,
        target: "../a".into(),
        mode: 0o777,
        ..file("l", 0)
    };
    vec![file("a", 3 << 16), link, file("b", 0), file("c", 10)]
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let msgs = messages(rest);
    let t0 = Instant::now();

    let params = SenderParams {
        channels: 4,
        payload: hurtle_proto::wire::DEFAULT_PAYLOAD,
        block_size: 1 << 16,
        session: 7,
        tcp: pick % 2 == 1,
        race: pick % 4 < 2,
        checksum: pick % 3 == 0,
    };
    let mut s = SenderSetup::new(params, manifest(), t0);

    let limits = ReceiverLimits { max_channels: 8 };
    let (hello, rest) = match msgs.split_first() {
        Some((first, rest)) => match check_hello(first.clone(), &limits) {
            Ok(h) => (h, rest),
            Err(_) => (own_hello(&s, &limits), &msgs[..]),
        },
        None => (own_hello(&s, &limits), &msgs[..]),
    };
    let mut r = ReceiverSetup::new(hello, t0);
    let port = hello.race.then_some(9999);
    let _ = r.accept((0..hello.channels).collect(), port, Intake::default(), t0);
    for (i, m) in rest.iter().enumerate() {
        let now = t0 + Duration::from_millis(i as u64 + 1);
        let _ = r.handle(m.clone(), now);
        let _ = r.handle_timeout(now);
        while let Some(ev) = r.poll_event() {
            match ev {
                ReceiverEvent::Manifest => {
                    let d = (0..r.entries().len()).map(|i| decision(pick, i)).collect();
                    let _ = r.reply(d, now);
                }
                ReceiverEvent::Ready => {
                    let a = r.agreed().expect("an outcome when ready");
                    assert_eq!(a.skips.len(), files(r.entries()).count());
                    assert_eq!(a.layout.channels(), a.channels);
                    assert_eq!(a.session, data_session(hello.session, a.early));
                    if a.early {
                        // The early data counts: the outcome is the provisional one.
                        let p = Agreed::provisional(
                            r.entries(),
                            hello.block_size,
                            hello.channels,
                            hello.session,
                        );
                        assert_eq!(p.ok().as_ref(), Some(&a));
                    }
                }
            }
        }
        while r.poll_transmit().is_some() {}
    }

    let mut provisional = None;
    for (i, m) in msgs.into_iter().enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        let _ = s.handle(m, now);
        while let Some(ev) = s.poll_event() {
            match ev {
                SenderEvent::HashWanted { file } => {
                    let _ = s.hashed(file, [pick; 32]);
                }
                SenderEvent::Accepted(_) => {
                    let p = s
                        .provisional()
                        .expect("a provisional outcome once accepted");
                    if let Ok(p) = &p {
                        assert!(p.early);
                        assert_eq!(p.session, 7);
                        assert_eq!(p.skips.len(), 3);
                    }
                    provisional = p.ok();
                }
                SenderEvent::Ready => {
                    let a = s.agreed().expect("an outcome when ready");
                    assert_eq!(a.skips.len(), 3);
                    assert!(a.channels >= 1 && a.channels <= 4);
                    assert_eq!(a.session, data_session(7, a.early));
                    if a.early {
                        assert_eq!(provisional.as_ref(), Some(&a));
                    }
                }
                SenderEvent::ProbeAck { .. } => {}
            }
        }
        while s.poll_transmit().is_some() {}
    }
});

/// The sender's own hello, checked as the receiver would (it always passes).
fn own_hello(s: &SenderSetup, limits: &ReceiverLimits) -> hurtle_proto::session::HelloParams {
    check_hello(s.hello(), limits).expect("the sender's own hello is good")
}
