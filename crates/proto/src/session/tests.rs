//! The two set-up machines against each other, with the receiver's file system as data, and
//! each against hostile or out-of-order messages. (`hurtle-netsim` runs them over a delayed
//! control path on virtual time, with the data phase after.)

use super::*;
use crate::rate::bottleneck::BufferCap;
use crate::wire::{AbortCause, Decision, DEFAULT_PAYLOAD, MAGIC};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

fn file(path: &str, size: u64) -> Entry {
    Entry {
        path: path.into(),
        kind: EntryKind::File,
        size,
        mode: 0o644,
        mtime_ns: 7,
        holes: Vec::new(),
        target: String::new(),
    }
}

fn dir(path: &str) -> Entry {
    Entry {
        kind: EntryKind::Dir,
        size: 0,
        ..file(path, 0)
    }
}

fn params(channels: u16) -> SenderParams {
    SenderParams {
        channels,
        payload: DEFAULT_PAYLOAD,
        block_size: 1 << 16,
        session: 0x1234_5679,
        tcp: false,
        race: false,
        checksum: false,
    }
}

/// The receiver's file system, as facts: what is at a path (and the hash of a file there),
/// and the blocks a part file vouches for.
#[derive(Default)]
struct Disk {
    found: HashMap<String, (Found, [u8; 32])>,
    parts: HashMap<String, Vec<(u64, u64)>>,
    overwrite: bool,
}

impl Disk {
    fn decide(&self, e: &Entry, checksum: bool) -> Decision {
        let (found, hash) = self
            .found
            .get(&e.path)
            .copied()
            .unwrap_or((Found::Nothing, [0; 32]));
        match first_look(e, found, checksum, self.overwrite) {
            Look::Decided(d) => d,
            Look::HashExisting { replace_ok } => Look::with_hash(replace_ok, hash),
            Look::LookForPart => Look::with_part(self.parts.get(&e.path).cloned()),
        }
    }
}

/// The sender's hashes of its files, by path (zeros where not given).
type Mine = HashMap<String, [u8; 32]>;

#[derive(Debug)]
enum Who {
    Sender,
    Receiver,
}

/// Runs both machines until both are ready (or one fails), moving messages between them as a
/// driver would, with the receiver offering at most `max_channels`.
fn run(
    sender: SenderParams,
    entries: Vec<Entry>,
    max_channels: u16,
    disk: &Disk,
    mine: &Mine,
) -> Result<(Agreed, Agreed), (Who, SetupError)> {
    let now = Instant::now();
    let checksum = sender.checksum;
    let mut s = SenderSetup::new(sender, entries, now);
    // The hello comes with the key agreement; the receiver opens its data path at once.
    let h =
        check_hello(s.hello(), &ReceiverLimits { max_channels }).map_err(|e| (Who::Receiver, e))?;
    let mut r = ReceiverSetup::new(h, now);
    let ports = (0..h.channels).map(|c| 9000 + c).collect();
    r.accept(
        ports,
        h.race.then_some(9999),
        Intake {
            ceiling_bps: 1_000_000_000,
            ..Intake::default()
        },
        now,
    )
    .unwrap();
    let (mut s_done, mut r_done) = (None, None);
    for _ in 0..1000 {
        while let Some(m) = s.poll_transmit() {
            r.handle(m, now).map_err(|e| (Who::Receiver, e))?;
        }
        while let Some(ev) = r.poll_event() {
            match ev {
                ReceiverEvent::Manifest => {
                    let d = r
                        .entries()
                        .iter()
                        .map(|e| disk.decide(e, checksum))
                        .collect();
                    r.reply(d, now).map_err(|e| (Who::Receiver, e))?;
                }
                ReceiverEvent::Ready => r_done = r.agreed(),
            }
        }
        while let Some(m) = r.poll_transmit() {
            s.handle(m, now).map_err(|e| (Who::Sender, e))?;
        }
        while let Some(ev) = s.poll_event() {
            match ev {
                SenderEvent::Accepted(_) => {
                    // The early data's outcome: every file whole, under the hello's session.
                    let p = s.provisional().expect("after the HelloAck");
                    let p = p.map_err(|e| (Who::Sender, e))?;
                    assert!(p.early && p.session == params_session(&s));
                    assert!(p.skips.iter().all(|k| !k.is_skipped()));
                }
                SenderEvent::ProbeAck { .. } => {}
                SenderEvent::HashWanted { file } => {
                    let path = &files(s.entries()).nth(file as usize).unwrap().path;
                    let h = mine.get(path).copied().unwrap_or([0; 32]);
                    s.hashed(file, h).map_err(|e| (Who::Sender, e))?;
                }
                SenderEvent::Ready => s_done = s.agreed(),
            }
        }
        if let (Some(a), Some(b)) = (&s_done, &r_done) {
            return Ok((a.clone(), b.clone()));
        }
    }
    panic!("the set-up did not end");
}

fn params_session(s: &SenderSetup) -> u32 {
    match s.hello() {
        Control::Hello { session, .. } => session,
        _ => unreachable!(),
    }
}

/// Both sides built the same outcome, and it is the provisional one (same session id) exactly
/// when every file is sent whole.
fn same(a: &Agreed, b: &Agreed) {
    assert_eq!(a, b);
    let whole = a.skips.iter().all(|k| !k.is_skipped()) && a.held.resumed_bytes == 0;
    assert_eq!(a.early, whole, "{a:?}");
}

#[test]
fn fresh_files_agree_on_the_same_layout() {
    let entries = vec![dir("d"), file("d/a", 300_000), file("b", 0), file("c", 5)];
    let (s, r) = run(params(4), entries, 16, &Disk::default(), &Mine::new()).unwrap();
    same(&s, &r);
    assert_eq!(s.channels, 4);
    assert_eq!(s.skips, vec![Skipped::No; 3]);
    assert_eq!(s.sent_bytes, 300_005);
    assert_eq!(s.moving_bytes(), 300_005);
}

#[test]
fn the_receiver_clamps_the_channels_and_both_use_its_count() {
    let (s, r) = run(
        params(64),
        vec![file("a", 10)],
        3,
        &Disk::default(),
        &Mine::new(),
    )
    .unwrap();
    same(&s, &r);
    assert_eq!(s.channels, 3);
    let (s, _) = run(
        params(0),
        vec![file("a", 10)],
        0,
        &Disk::default(),
        &Mine::new(),
    )
    .unwrap();
    assert_eq!(s.channels, 1, "at least one channel, whatever is asked");
}

#[test]
fn an_empty_manifest_is_one_part_and_agrees() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), Vec::new(), now);
    assert_eq!(
        s.poll_transmit(),
        Some(Control::Manifest {
            entries: Vec::new(),
            last: true
        })
    );
    assert_eq!(s.poll_transmit(), None);
    let (s, r) = run(params(2), Vec::new(), 8, &Disk::default(), &Mine::new()).unwrap();
    same(&s, &r);
}

#[test]
fn a_big_manifest_goes_in_parts() {
    let entries: Vec<Entry> = (0..MANIFEST_PART * 2 + 1)
        .map(|i| file(&format!("f{i}"), 1))
        .collect();
    let mut s = SenderSetup::new(params(2), entries.clone(), Instant::now());
    let parts: Vec<Control> = std::iter::from_fn(|| s.poll_transmit()).collect();
    assert_eq!(parts.len(), 3);
    assert!(matches!(&parts[2], Control::Manifest { entries, last: true } if entries.len() == 1));
    let (s, r) = run(params(2), entries, 8, &Disk::default(), &Mine::new()).unwrap();
    same(&s, &r);
}

#[test]
fn identical_files_are_skipped_by_hash_and_changed_ones_sent_with_overwrite() {
    let entries = vec![file("same", 100), file("changed", 100), file("new", 100)];
    let mut disk = Disk {
        overwrite: true,
        ..Disk::default()
    };
    let other = Found::File {
        len: 100,
        mtime_ns: 1,
    };
    disk.found.insert("same".into(), (other, [1; 32]));
    disk.found.insert("changed".into(), (other, [2; 32]));
    let mine: Mine = [("same".into(), [1; 32]), ("changed".into(), [3; 32])].into();
    let (s, r) = run(params(2), entries, 8, &disk, &mine).unwrap();
    same(&s, &r);
    assert_eq!(
        s.skips,
        vec![Skipped::Same([1; 32]), Skipped::No, Skipped::No]
    );
    assert_eq!(s.sent_bytes, 200);
}

#[test]
fn a_different_file_without_overwrite_stops_the_sender() {
    let mut disk = Disk::default();
    let there = Found::File {
        len: 100,
        mtime_ns: 1,
    };
    disk.found.insert("a".into(), (there, [2; 32]));
    let mine: Mine = [("a".into(), [3; 32])].into();
    let err = run(params(2), vec![file("a", 100)], 8, &disk, &mine).unwrap_err();
    assert!(
        matches!(err, (Who::Sender, SetupError::Refused { ref path, .. }) if path == "a"),
        "{err:?}"
    );
}

#[test]
fn unchanged_files_are_skipped_unread_unless_checksums_are_asked() {
    let mut disk = Disk::default();
    let there = Found::File {
        len: 100,
        mtime_ns: 7,
    };
    disk.found.insert("a".into(), (there, [5; 32]));
    let (s, r) = run(params(2), vec![file("a", 100)], 8, &disk, &Mine::new()).unwrap();
    same(&s, &r);
    assert_eq!(s.skips, vec![Skipped::Unchecked]);
    assert_eq!(s.skips[0].kept_hash(), Some([0; 32]));
    // With checksums the receiver hashes, and the sender compares.
    let mine: Mine = [("a".into(), [5; 32])].into();
    let checked = SenderParams {
        checksum: true,
        ..params(2)
    };
    let (s, _) = run(checked, vec![file("a", 100)], 8, &disk, &mine).unwrap();
    assert_eq!(s.skips, vec![Skipped::Same([5; 32])]);
}

#[test]
fn something_in_the_way_is_refused_and_the_sender_learns_which() {
    let mut disk = Disk::default();
    disk.found.insert("a".into(), (Found::Other, [0; 32]));
    let err = run(
        params(2),
        vec![file("ok", 1), file("a", 100)],
        8,
        &disk,
        &Mine::new(),
    )
    .unwrap_err();
    // The receiver fails first (after queuing its reply), so the sender's side is not run
    // here; see `a_refusal_reaches_the_sender`.
    assert!(matches!(err, (Who::Receiver, SetupError::Refused { ref path, .. }) if path == "a"));
}

#[test]
fn a_refusal_reaches_the_sender() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(1), vec![file("a", 1)], now);
    s.handle(ack(1), now).unwrap();
    let err = s
        .handle(
            Control::ManifestReply {
                decisions: vec![Decision::Refuse("no room".into())],
                last: true,
            },
            now,
        )
        .unwrap_err();
    assert!(matches!(err, SetupError::Refused { ref reason, .. } if reason == "no room"));
    assert_eq!(s.poll_transmit().map(|m| m.name()), Some("Manifest"));
}

#[test]
fn resumed_blocks_and_holes_are_held_alike_on_both_sides() {
    let block = 1u64 << 16;
    let mut sparse = file("sparse", 8 * block);
    sparse.holes = vec![(2, 5)];
    let entries = vec![file("resumed", 10 * block + 3), sparse];
    let mut disk = Disk::default();
    disk.parts.insert("resumed".into(), vec![(0, 4), (6, 7)]);
    let (s, r) = run(params(3), entries, 8, &disk, &Mine::new()).unwrap();
    same(&s, &r);
    assert_eq!(s.resumed[0], vec![(0, 4), (6, 7)]);
    assert_eq!(s.held.resumed_bytes, 5 * block);
    assert_eq!(s.held.hole_bytes, 3 * block);
    assert_eq!(s.moving_bytes(), 18 * block + 3 - 8 * block);
}

#[test]
fn resumed_blocks_outside_the_file_fail_the_set_up() {
    let mut disk = Disk::default();
    disk.parts.insert("a".into(), vec![(0, 9)]);
    // The receiver finds it first: with nothing offered for hashing, it builds the outcome
    // at its decisions.
    let err = run(params(1), vec![file("a", 1 << 16)], 8, &disk, &Mine::new()).unwrap_err();
    assert!(
        matches!(err, (Who::Receiver, SetupError::Layout(_))),
        "{err:?}"
    );
}

fn hello() -> Control {
    Control::hello(0, 2, DEFAULT_PAYLOAD, 1 << 16, 3)
}

fn ack(ports: usize) -> Control {
    Control::HelloAck {
        version: VERSION,
        caps: 0,
        ports: vec![9000; ports],
        payload: DEFAULT_PAYLOAD,
        rate_ceiling: 0,
        recv_buffer: 0,
        recv_buffer_wanted: 0,
        tcp_port: 0,
    }
}

const LIMITS: ReceiverLimits = ReceiverLimits { max_channels: 8 };

/// A receiver that took the hello, before its answer.
fn receiver() -> ReceiverSetup {
    ReceiverSetup::new(check_hello(hello(), &LIMITS).unwrap(), Instant::now())
}

/// A receiver that took the hello and acknowledged it.
fn opened() -> ReceiverSetup {
    let mut r = receiver();
    r.accept(vec![1, 2], None, Intake::default(), Instant::now())
        .unwrap();
    r
}

#[test]
fn another_version_or_protocol_is_incompatible() {
    for (magic, version) in [(MAGIC, VERSION - 1), (*b"GET ", VERSION)] {
        let msg = Control::Hello {
            magic,
            version,
            caps: 0,
            channels: 1,
            payload: DEFAULT_PAYLOAD,
            block_size: 1 << 16,
            session: 1,
        };
        let err = check_hello(msg, &LIMITS).unwrap_err();
        assert!(matches!(err, SetupError::Incompatible { .. }), "{err:?}");
    }
}

#[test]
fn a_bad_block_size_is_refused_at_hello() {
    for block_size in [0, 1000, 3 << 16, 1 << 40] {
        let msg = Control::Hello {
            magic: MAGIC,
            version: VERSION,
            caps: 0,
            channels: 2,
            payload: DEFAULT_PAYLOAD,
            block_size,
            session: 3,
        };
        let err = check_hello(msg, &LIMITS).unwrap_err();
        assert!(
            matches!(err, SetupError::Layout(_)),
            "{block_size}: {err:?}"
        );
    }
}

#[test]
fn the_receiver_takes_messages_only_in_order() {
    let now = Instant::now();
    // Not a hello first (the key agreement's driver checks it).
    let err = check_hello(Control::Skip { files: vec![] }, &LIMITS).unwrap_err();
    assert!(matches!(
        err,
        SetupError::Unexpected {
            wanted: "Hello",
            ..
        }
    ));
    // Skip before the manifest.
    let mut r = opened();
    let err = r.handle(Control::Skip { files: vec![] }, now).unwrap_err();
    assert!(matches!(
        err,
        SetupError::Unexpected {
            wanted: "Manifest",
            ..
        }
    ));
    // A failed set-up takes nothing more.
    assert!(matches!(r.handle(hello(), now), Err(SetupError::Driver(_))));
    // A second hello.
    let mut r = opened();
    let err = r.handle(hello(), now).unwrap_err();
    assert!(matches!(err, SetupError::Unexpected { .. }));
    // Data-phase messages during set-up, and the retired `Start`.
    let mut r = opened();
    let start = Control::Start {
        payload: DEFAULT_PAYLOAD,
        report_interval_us: 1,
    };
    assert!(r.handle(start, now).is_err());
    let mut r = opened();
    assert!(r.handle(Control::Done, now).is_err());
}

#[test]
fn the_peers_abort_is_handed_up_as_it_came() {
    let mut r = opened();
    let abort = Control::Abort {
        cause: AbortCause::Interrupted,
        reason: "ctrl-c".into(),
    };
    match r.handle(abort, Instant::now()).unwrap_err() {
        SetupError::PeerAborted { cause, reason } => {
            assert_eq!(cause, AbortCause::Interrupted);
            assert_eq!(reason, "ctrl-c");
        }
        other => panic!("{other:?}"),
    }
    // Another version's `Reject`, in the sender's set-up.
    let mut s = SenderSetup::new(params(1), vec![], Instant::now());
    let reject = Control::Reject {
        reason: "use the same hurtle version".into(),
    };
    assert!(matches!(
        s.handle(reject, Instant::now()),
        Err(SetupError::PeerAborted {
            cause: AbortCause::Failed,
            ..
        })
    ));
}

#[test]
fn skips_must_name_files_the_receiver_offered() {
    let now = Instant::now();
    let setup = |skip: Vec<u32>| {
        let mut r = opened();
        let entries = vec![file("a", 5), dir("d"), file("b", 5)];
        r.handle(
            Control::Manifest {
                entries,
                last: true,
            },
            now,
        )
        .unwrap();
        assert_eq!(r.poll_event(), Some(ReceiverEvent::Manifest));
        let have = Decision::Have {
            hash: [9; 32],
            replace_ok: false,
        };
        r.reply(vec![have, Decision::SendAll, Decision::SendAll], now)
            .unwrap();
        r.handle(Control::Skip { files: skip }, now)
    };
    assert!(matches!(setup(vec![1]), Err(SetupError::SkipNotOffered { ref path }) if path == "b"));
    assert!(matches!(setup(vec![7]), Err(SetupError::SkipUnknown(7))));
    setup(vec![0]).unwrap();
}

#[test]
fn a_manifest_beyond_the_layout_or_with_bad_holes_is_refused() {
    let now = Instant::now();
    let mut r = opened();
    let huge = file("huge", MAX_BLOCKS_BYTES);
    let err = r
        .handle(
            Control::Manifest {
                entries: vec![huge],
                last: true,
            },
            now,
        )
        .unwrap_err();
    assert!(matches!(err, SetupError::Layout(_)), "{err:?}");
    let mut r = opened();
    let mut holey = file("h", 3 << 16);
    holey.holes = vec![(2, 9)];
    let err = r
        .handle(
            Control::Manifest {
                entries: vec![holey],
                last: true,
            },
            now,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            SetupError::BadHoles {
                start: 2,
                end: 9,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_manifest_with_a_bad_link_is_refused_and_a_good_one_taken() {
    let now = Instant::now();
    let link = |target: &str| Entry {
        kind: EntryKind::Symlink,
        target: target.into(),
        ..file("t/l", 0)
    };
    let long = "a/".repeat(2048);
    let bad = [
        (link(""), "an empty target"),
        (link("a\0b"), "a NUL in its target"),
        (link(&long), "a target too long"),
        (
            Entry {
                size: 1,
                ..link("x")
            },
            "a size",
        ),
        (
            Entry {
                target: "x".into(),
                ..file("f", 1)
            },
            "a target, and it is not a link",
        ),
    ];
    for (entry, what) in bad {
        let mut r = opened();
        let err = r
            .handle(
                Control::Manifest {
                    entries: vec![dir("t"), entry],
                    last: true,
                },
                now,
            )
            .unwrap_err();
        assert!(
            matches!(&err, SetupError::BadLink { why, .. } if *why == what),
            "{what}: {err:?}"
        );
    }
    // Where it points is the receiver's to judge: an absolute or climbing target is text here.
    let mut r = opened();
    r.handle(
        Control::Manifest {
            entries: vec![dir("t"), link("/etc/passwd"), link(&long[..4094])],
            last: true,
        },
        now,
    )
    .unwrap();
}

/// Bytes of one more block than a layout takes at the test's block size.
const MAX_BLOCKS_BYTES: u64 = (crate::layout::MAX_BLOCKS + 1) << 16;

#[test]
fn the_sender_takes_messages_only_in_order() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    let reply = Control::ManifestReply {
        decisions: vec![Decision::SendAll],
        last: true,
    };
    let err = s.handle(reply.clone(), now).unwrap_err();
    assert!(matches!(
        err,
        SetupError::Unexpected {
            wanted: "HelloAck",
            ..
        }
    ));
    // No ports, or another version.
    let old = Control::HelloAck {
        version: 1,
        caps: 0,
        ports: vec![9000; 2],
        payload: DEFAULT_PAYLOAD,
        rate_ceiling: 0,
        recv_buffer: 0,
        recv_buffer_wanted: 0,
        tcp_port: 0,
    };
    for bad in [ack(0), old] {
        let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
        assert!(matches!(
            s.handle(bad, now),
            Err(SetupError::NoChannels { .. })
        ));
    }
    // A reply of the wrong length.
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    s.handle(ack(2), now).unwrap();
    let short = Control::ManifestReply {
        decisions: vec![],
        last: true,
    };
    assert!(matches!(s.handle(short, now), Err(SetupError::ReplyLength)));
    // "Unchanged" for a directory.
    let mut s = SenderSetup::new(params(2), vec![dir("d")], now);
    s.handle(ack(2), now).unwrap();
    let unchanged = Control::ManifestReply {
        decisions: vec![Decision::Unchanged],
        last: true,
    };
    assert!(matches!(
        s.handle(unchanged, now),
        Err(SetupError::UncheckedSkip { .. })
    ));
}

#[test]
fn the_sender_reports_probe_acks_and_accepts_keep_alives_while_waiting() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    s.handle(ack(2), now).unwrap();
    assert!(matches!(s.poll_event(), Some(SenderEvent::Accepted(a)) if a.channels() == 2));
    s.handle(Control::KeepAlive, now).unwrap();
    s.handle(
        Control::ProbeAck {
            channel: 1,
            size: 1400,
        },
        now,
    )
    .unwrap();
    assert_eq!(
        s.poll_event(),
        Some(SenderEvent::ProbeAck {
            channel: 1,
            size: 1400
        })
    );
}

#[test]
fn the_receivers_capped_buffers_reach_the_sender() {
    let now = Instant::now();
    let mut r = receiver();
    let intake = Intake {
        ceiling_bps: 5_000_000_000,
        recv_buffer: 212_992,
        recv_buffer_wanted: 4 << 20,
    };
    r.accept(vec![1, 2], None, intake, now).unwrap();
    let ack = r.poll_transmit().unwrap();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    s.handle(ack, now).unwrap();
    let Some(SenderEvent::Accepted(a)) = s.poll_event() else {
        panic!("no answer")
    };
    assert_eq!(a.rate_ceiling, 5_000_000_000);
    assert_eq!(a.buffer_cap, BufferCap::of(212_992, 4 << 20));
    assert!(a.buffer_cap.is_some());
}

#[test]
fn a_sender_that_may_fall_back_gets_a_tcp_data_port_and_only_then() {
    let now = Instant::now();
    for (race, tcp) in [(true, false), (false, false), (true, true)] {
        let p = SenderParams {
            race,
            tcp,
            ..params(2)
        };
        let mut s = SenderSetup::new(p, vec![file("a", 1)], now);
        let h = check_hello(s.hello(), &LIMITS).unwrap();
        let mut r = ReceiverSetup::new(h, now);
        // Asked for with UDP only: data over TCP has no use for a second port.
        assert_eq!(h.race, race && !tcp, "race {race}, tcp {tcp}");
        // The port must be there exactly when it was asked for.
        let wrong = (!h.race).then_some(7401);
        assert!(matches!(
            r.accept(vec![1, 2], wrong, Intake::default(), now),
            Err(SetupError::Driver(_))
        ));
        let mut r = ReceiverSetup::new(h, now);
        let port = h.race.then_some(7401);
        r.accept(vec![1, 2], port, Intake::default(), now).unwrap();
        s.handle(r.poll_transmit().unwrap(), now).unwrap();
        let Some(SenderEvent::Accepted(a)) = s.poll_event() else {
            panic!("no answer")
        };
        assert_eq!(a.tcp_port, port);
    }
    // A port the sender did not ask for is not used.
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    let mut unasked = ack(2);
    if let Control::HelloAck { tcp_port, .. } = &mut unasked {
        *tcp_port = 7401;
    }
    s.handle(unasked, now).unwrap();
    let Some(SenderEvent::Accepted(a)) = s.poll_event() else {
        panic!("no answer")
    };
    assert_eq!(a.tcp_port, None);
}

#[test]
fn the_driver_cannot_answer_out_of_turn() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    assert!(matches!(s.hashed(0, [0; 32]), Err(SetupError::Driver(_))));
    assert!(s.provisional().is_none(), "no outcome before the HelloAck");
    let mut r = receiver();
    assert!(matches!(r.reply(vec![], now), Err(SetupError::Driver(_))));
    assert!(matches!(
        r.accept(vec![1, 2, 3], None, Intake::default(), now),
        Err(SetupError::Driver(_))
    ));
    let mut r = opened();
    assert!(matches!(
        r.accept(vec![1, 2], None, Intake::default(), now),
        Err(SetupError::Driver(_))
    ));
}

#[test]
fn silence_past_the_deadline_fails_and_each_message_restarts_it() {
    let t0 = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], t0);
    assert_eq!(s.poll_timeout(), Some(t0 + SETUP_TIMEOUT));
    s.handle_timeout(t0 + SETUP_TIMEOUT / 2).unwrap();
    s.handle(ack(2), t0 + SETUP_TIMEOUT / 2).unwrap();
    s.handle(Control::KeepAlive, t0 + SETUP_TIMEOUT).unwrap();
    assert_eq!(s.poll_timeout(), Some(t0 + SETUP_TIMEOUT * 2));
    assert!(matches!(
        s.handle_timeout(t0 + SETUP_TIMEOUT * 2),
        Err(SetupError::Timeout(_))
    ));
    let mut r = opened();
    let late = Instant::now() + SETUP_TIMEOUT;
    assert!(matches!(
        r.handle_timeout(late),
        Err(SetupError::Timeout(_))
    ));
}

#[test]
fn the_wait_for_skips_runs_from_the_reply_however_long_deciding_took() {
    let t0 = Instant::now();
    let mut r = ReceiverSetup::new(check_hello(hello(), &LIMITS).unwrap(), t0);
    r.accept(vec![1, 2], None, Intake::default(), t0).unwrap();
    let manifest = Control::Manifest {
        entries: vec![file("a", 1)],
        last: true,
    };
    r.handle(manifest, t0).unwrap();
    assert_eq!(
        r.poll_timeout(),
        None,
        "no deadline while the receiver decides"
    );
    let replied = t0 + SETUP_TIMEOUT * 3;
    let have = Decision::Have {
        hash: [1; 32],
        replace_ok: true,
    };
    r.reply(vec![have], replied).unwrap();
    assert_eq!(r.poll_timeout(), Some(replied + SETUP_TIMEOUT));
    r.handle_timeout(replied + SETUP_TIMEOUT / 2).unwrap();
}

#[test]
fn a_long_reply_goes_in_parts_and_the_sender_takes_them_whole() {
    // Many files the receiver has, with long resumed lists: more than one frame's worth.
    let n = 3 * MANIFEST_PART + 5;
    let entries: Vec<Entry> = (0..n).map(|i| file(&format!("f{i}"), 1 << 20)).collect();
    let mut disk = Disk::default();
    for (i, e) in entries.iter().enumerate() {
        if i % 2 == 0 {
            let there = Found::File {
                len: e.size,
                mtime_ns: 1,
            };
            disk.found.insert(e.path.clone(), (there, [1; 32]));
        } else {
            disk.parts
                .insert(e.path.clone(), vec![(0, 1), (2, 3), (4, 5)]);
        }
    }
    let mine: Mine = entries.iter().map(|e| (e.path.clone(), [1; 32])).collect();
    let (s, r) = run(params(2), entries.clone(), 8, &disk, &mine).unwrap();
    assert_eq!(s, r);
    assert_eq!(
        s.skips.iter().filter(|k| k.is_skipped()).count(),
        n.div_ceil(2)
    );
    // The receiver's reply, part by part.
    let now = Instant::now();
    let mut rcv = opened();
    assert!(matches!(
        rcv.poll_transmit(),
        Some(Control::HelloAck { .. })
    ));
    let mut sent = SenderSetup::new(params(2), entries, now);
    while let Some(m) = sent.poll_transmit() {
        rcv.handle(m, now).unwrap();
    }
    rcv.poll_event();
    let d: Vec<Decision> = rcv
        .entries()
        .iter()
        .map(|e| disk.decide(e, false))
        .collect();
    rcv.reply(d, now).unwrap();
    let replies: Vec<Control> = std::iter::from_fn(|| rcv.poll_transmit()).collect();
    assert_eq!(replies.len(), 4);
    for (i, m) in replies.iter().enumerate() {
        let Control::ManifestReply { decisions, last } = m else {
            panic!("{m:?}")
        };
        assert!(decisions.len() <= MANIFEST_PART);
        assert_eq!(*last, i == 3);
        assert!(m.to_frame().len() < crate::wire::MAX_FRAME / 4);
    }
}

#[test]
fn parts_stay_under_a_quarter_frame_whatever_the_items_carry() {
    let sizes = [PART_BYTES / 3; 10];
    let cut = parts(&sizes, |&n| n);
    assert_eq!(cut.len(), 4);
    assert!(cut.iter().all(|p| p.iter().sum::<usize>() <= PART_BYTES));
    // One item bigger than a part still goes, alone.
    let cut = parts(&[1, PART_BYTES * 2, 1], |&n| n);
    assert_eq!(cut, vec![&[1][..], &[PART_BYTES * 2][..], &[1][..]]);
    assert_eq!(parts(&[] as &[usize], |&n| n), vec![&[][..]]);
}

#[test]
fn a_reply_longer_than_the_manifest_fails_at_once() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    s.handle(ack(2), now).unwrap();
    let part = Control::ManifestReply {
        decisions: vec![Decision::SendAll; 2],
        last: false,
    };
    assert!(matches!(s.handle(part, now), Err(SetupError::ReplyLength)));
}

#[test]
fn more_ports_than_channels_offered_are_refused() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now);
    assert!(matches!(
        s.handle(ack(3), now),
        Err(SetupError::TooManyPorts {
            ports: 3,
            offered: 2
        })
    ));
}

#[test]
fn the_early_data_counts_only_when_every_file_is_sent_whole() {
    let now = Instant::now();
    let entries = vec![file("a", 1 << 17), dir("d"), file("b", 5)];
    // The receiver decides: every file sent whole. Both sides are done at the decisions,
    // with the provisional outcome, and no `Skip` goes.
    let mut s = SenderSetup::new(params(2), entries.clone(), now);
    s.handle(ack(2), now).unwrap();
    let early = s.provisional().unwrap().unwrap();
    let mut r = ReceiverSetup::new(check_hello(s.hello(), &LIMITS).unwrap(), now);
    r.accept(vec![1, 2], None, Intake::default(), now).unwrap();
    assert!(matches!(r.poll_transmit(), Some(Control::HelloAck { .. })));
    while let Some(m) = s.poll_transmit() {
        r.handle(m, now).unwrap();
    }
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Manifest));
    r.reply(vec![Decision::SendAll; 3], now).unwrap();
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Ready));
    let theirs = r.agreed().unwrap();
    while let Some(m) = r.poll_transmit() {
        s.handle(m, now).unwrap();
    }
    assert!(matches!(s.poll_event(), Some(SenderEvent::Accepted(_))));
    assert_eq!(s.poll_event(), Some(SenderEvent::Ready));
    let ours = s.agreed().unwrap();
    assert_eq!(s.poll_transmit(), None, "no Skip when nothing was offered");
    assert_eq!(ours, early);
    assert_eq!(theirs, early);
    assert!(early.early);
    assert_eq!(early.session, 0x1234_5679, "the hello's session");

    // One file unchanged on size and time: skipped without a `Skip`, another layout, the
    // next session id.
    let mut disk = Disk::default();
    let there = Found::File {
        len: 5,
        mtime_ns: 7,
    };
    disk.found.insert("b".into(), (there, [0; 32]));
    let (s2, r2) = run(params(2), entries.clone(), 8, &disk, &Mine::new()).unwrap();
    same(&s2, &r2);
    assert!(!s2.early);
    assert_eq!(s2.session, data_session(0x1234_5679, false));
    assert_ne!(s2.session, early.session);
    assert_ne!(s2.layout, early.layout);

    // Resumed: the same files, but blocks held: not the provisional outcome either.
    let mut disk = Disk::default();
    disk.parts.insert("a".into(), vec![(0, 1)]);
    let (s3, r3) = run(params(2), entries, 8, &disk, &Mine::new()).unwrap();
    same(&s3, &r3);
    assert!(!s3.early);
    assert_eq!(s3.session, early.session.wrapping_add(2));
}

#[test]
fn the_receiver_waits_for_skip_only_after_offering_hashes() {
    let now = Instant::now();
    let mut r = opened();
    r.handle(
        Control::Manifest {
            entries: vec![file("a", 5), file("b", 5)],
            last: true,
        },
        now,
    )
    .unwrap();
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Manifest));
    r.reply(vec![Decision::Unchanged, Decision::SendAll], now)
        .unwrap();
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Ready), "no wait");
    assert_eq!(r.agreed().unwrap().skips[0], Skipped::Unchecked);
    // A `Skip` now is out of turn.
    assert!(r.handle(Control::Skip { files: vec![0] }, now).is_err());
}

fn any_entry() -> impl Strategy<Value = Entry> {
    (
        any::<bool>(),
        0u64..1 << 20,
        proptest::collection::vec((0u64..40, 0u64..40), 0..3),
    )
        .prop_map(|(is_file, size, holes)| Entry {
            kind: if is_file {
                EntryKind::File
            } else {
                EntryKind::Dir
            },
            holes,
            ..file("x", size)
        })
}

fn any_decision() -> impl Strategy<Value = Decision> {
    prop_oneof![
        Just(Decision::SendAll),
        Just(Decision::Unchanged),
        Just(Decision::Refuse("no".into())),
        (any::<[u8; 32]>(), any::<bool>())
            .prop_map(|(hash, replace_ok)| Decision::Have { hash, replace_ok }),
        proptest::collection::vec((0u64..40, 0u64..40), 0..3)
            .prop_map(|blocks| Decision::Resume { blocks }),
    ]
}

/// Messages of every set-up kind with any fields, and a few of the data phase's.
fn any_control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u64>(),
            any::<u16>(),
            any::<u16>(),
            any::<u64>()
        )
            .prop_map(
                |(version, caps, channels, payload, block_size)| Control::Hello {
                    magic: MAGIC,
                    version: if version % 2 == 0 { VERSION } else { version },
                    caps,
                    channels,
                    payload,
                    block_size: if caps % 2 == 0 { 1 << 16 } else { block_size },
                    session: 1,
                }
            ),
        (proptest::collection::vec(any::<u16>(), 0..5), any::<u16>()).prop_map(
            |(ports, payload)| Control::HelloAck {
                version: VERSION,
                caps: 0,
                ports,
                payload,
                rate_ceiling: 0,
                recv_buffer: 0,
                recv_buffer_wanted: 0,
                tcp_port: 0,
            }
        ),
        (proptest::collection::vec(any_entry(), 0..4), any::<bool>())
            .prop_map(|(entries, last)| Control::Manifest { entries, last }),
        (
            proptest::collection::vec(any_decision(), 0..4),
            any::<bool>()
        )
            .prop_map(|(decisions, last)| Control::ManifestReply { decisions, last }),
        proptest::collection::vec(0u32..6, 0..4).prop_map(|files| Control::Skip { files }),
        (any::<u16>(), any::<u16>())
            .prop_map(|(channel, size)| Control::ProbeAck { channel, size }),
        Just(Control::KeepAlive),
        Just(Control::Done),
        Just(Control::Abort {
            cause: AbortCause::Failed,
            reason: "x".into()
        }),
    ]
}

fn real_or_random(real: Vec<Control>) -> impl Strategy<Value = Vec<Control>> {
    let n = real.len();
    proptest::collection::vec((any::<bool>(), 0..n.max(1), any_control()), 0..12).prop_map(
        move |picks| {
            picks
                .into_iter()
                .map(|(take_real, i, random)| {
                    if take_real && n > 0 {
                        real[i].clone()
                    } else {
                        random
                    }
                })
                .collect()
        },
    )
}

proptest! {
    /// Any sequence of messages, real ones out of order among random ones, ends in an error
    /// or a consistent set-up: never a panic.
    #[test]
    fn hostile_sequences_never_panic_the_receiver(msgs in real_or_random(vec![
        Control::Manifest { entries: vec![file("a", 70_000), dir("d")], last: false },
        Control::Manifest { entries: vec![file("b", 3)], last: true },
        Control::Skip { files: vec![0, 1, 5] },
        Control::KeepAlive,
    ])) {
        let now = Instant::now();
        let mut r = opened();
        for m in msgs {
            let _ = r.handle(m, now);
            while let Some(ev) = r.poll_event() {
                match ev {
                    ReceiverEvent::Manifest => {
                        let d = vec![Decision::Have { hash: [0; 32], replace_ok: false }; r.entries().len()];
                        let _ = r.reply(d, now);
                    }
                    ReceiverEvent::Ready => {
                        let a = r.agreed().unwrap();
                        prop_assert_eq!(a.skips.len(), files(r.entries()).count());
                    }
                }
            }
        }
    }

    #[test]
    fn hostile_sequences_never_panic_the_sender(msgs in real_or_random(vec![
        ack(3),
        Control::ManifestReply { decisions: vec![
            Decision::Resume { blocks: vec![(0, 1)] },
            Decision::Have { hash: [1; 32], replace_ok: true },
            Decision::SendAll,
        ], last: true },
        Control::ProbeAck { channel: 9, size: 0 },
        Control::KeepAlive,
    ])) {
        let now = Instant::now();
        let entries = vec![file("a", 70_000), file("b", 3), dir("d")];
        let mut s = SenderSetup::new(params(3), entries, now);
        for m in msgs {
            let _ = s.handle(m, now);
            while let Some(ev) = s.poll_event() {
                match ev {
                    SenderEvent::HashWanted { file } => {
                        let _ = s.hashed(file, [2; 32]);
                    }
                    SenderEvent::Accepted(_) => {
                        let p = s.provisional();
                        prop_assert!(p.is_some_and(|p| p.is_ok_and(|p| p.early)));
                    }
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn early_block_values_are_kept_for_an_outcome_that_keeps_the_early_data_and_dropped_otherwise() {
    let now = Instant::now();
    let values = |session: u32| Control::BlockHashes {
        session,
        blocks: vec![(0, [7; 32])],
    };
    let manifest = || Control::Manifest {
        entries: vec![file("a", 5)],
        last: true,
    };
    // Every file sent: the values that came while the receiver decided are the data phase's.
    let mut r = opened();
    r.handle(manifest(), now).unwrap();
    r.handle(values(3), now).unwrap();
    assert_eq!(r.early_values(), vec![], "not before the outcome");
    r.reply(vec![Decision::SendAll], now).unwrap();
    assert_eq!(r.early_values(), vec![(0, [7; 32])]);
    assert_eq!(r.early_values(), vec![], "taken once");
    // Resumed: another layout, the values are dropped.
    let mut r = opened();
    r.handle(manifest(), now).unwrap();
    r.handle(values(3), now).unwrap();
    r.reply(vec![Decision::Resume { blocks: vec![] }], now)
        .unwrap();
    assert_eq!(r.early_values(), vec![]);
    // Waiting for `Skip`, values of the early data are dropped; values of another session are
    // an error.
    let mut r = opened();
    r.handle(manifest(), now).unwrap();
    let have = Decision::Have {
        hash: [1; 32],
        replace_ok: true,
    };
    r.reply(vec![have], now).unwrap();
    r.handle(values(3), now).unwrap();
    assert!(r.handle(values(5), now).is_err());
    // A flood of values before the outcome is refused.
    let mut r = opened();
    let flood = Control::BlockHashes {
        session: 3,
        blocks: vec![(0, [0; 32]); MAX_EARLY_VALUES + 1],
    };
    assert!(matches!(r.handle(flood, now), Err(SetupError::Driver(_))));
}

#[test]
fn a_mirror_and_a_dry_run_are_asked_in_the_hello_and_the_rules_come_first() {
    let now = Instant::now();
    let entries = vec![dir("t"), file("t/a", 10)];
    let rules = vec!["- *.tmp".to_string()];
    let mut s = SenderSetup::new(params(2), entries.clone(), now)
        .dry_run()
        .mirror(rules.clone(), true);
    let h = check_hello(s.hello(), &LIMITS).unwrap();
    assert!(h.dry_run && h.delete);
    let plain = check_hello(SenderSetup::new(params(2), entries, now).hello(), &LIMITS).unwrap();
    assert!(!plain.dry_run && !plain.delete);
    let mut r = ReceiverSetup::new(h, now);
    r.accept(vec![1, 2], None, Intake::default(), now).unwrap();
    let first = s.poll_transmit().unwrap();
    assert_eq!(
        first,
        Control::Mirror {
            rules: rules.clone(),
            root: true
        }
    );
    r.handle(first, now).unwrap();
    while let Some(m) = s.poll_transmit() {
        r.handle(m, now).unwrap();
    }
    assert_eq!(r.poll_event(), Some(ReceiverEvent::Manifest));
    assert_eq!(r.mirror(), Some((&rules[..], true)));
}

#[test]
fn a_mirror_whose_rules_do_not_come_first_fails_the_set_up() {
    let now = Instant::now();
    let mut s = SenderSetup::new(params(2), vec![file("a", 1)], now).mirror(Vec::new(), false);
    let h = check_hello(s.hello(), &LIMITS).unwrap();
    let mut r = ReceiverSetup::new(h, now);
    r.accept(vec![1, 2], None, Intake::default(), now).unwrap();
    let _rules = s.poll_transmit().unwrap();
    let manifest = s.poll_transmit().unwrap();
    let err = r.handle(manifest, now).unwrap_err();
    assert!(matches!(err, SetupError::Unexpected { .. }), "{err:?}");
    // Rules where no mirror was asked are not taken either.
    let mut r = opened();
    let err = r
        .handle(
            Control::Mirror {
                rules: Vec::new(),
                root: false,
            },
            now,
        )
        .unwrap_err();
    assert!(matches!(err, SetupError::Unexpected { .. }), "{err:?}");
}
