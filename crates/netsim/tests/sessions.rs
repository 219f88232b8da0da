//! Whole sessions: hurtle-proto's set-up machines (`SenderSetup`, `ReceiverSetup`) driven over
//! the simulated control path on virtual time, then the data phase from what they agreed (see
//! `hurtle_netsim::session`).
//!
//! Each case asserts numbers: the virtual time of each phase, what each side hashed, the bytes
//! of each file that crossed the data link, and for a failed session which side ended with which
//! typed error, when. The runner itself checks that no file lands on the receiver with a byte
//! that is not the sender's, and that a session both sides call done is exact.
//!
//! Unless a case says otherwise the control path's one-way delay is 20 ms (the data link's), so
//! a round trip is 40 ms, and time zero is the hello.

use hurtle_netsim::{
    ControlFault, End, Fault, FileState, OnDisk, PartFile, Scenario, SessionOutcome,
    SessionScenario, Side, SideError, SimEntry, SimFile,
};
use hurtle_proto::session::{Agreed, SetupError, Skipped, SETUP_TIMEOUT};
use hurtle_proto::wire::{AbortCause, Control, Decision, MAGIC, VERSION};
use std::time::Duration;

const KIB: u64 = 1 << 10;
/// The default scenario's block size.
const BLOCK: u64 = 16 * KIB;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One way, and a round trip, on the default path.
const D: Duration = Duration::from_millis(20);
const RTT: Duration = Duration::from_millis(40);

/// A session of `entries` into an empty directory, over the default path (4 channels offered,
/// 16 KiB blocks, 200 Mbit/s, 20 ms one way).
fn session(entries: Vec<SimEntry>) -> SessionScenario {
    SessionScenario {
        entries,
        ..SessionScenario::new(Scenario {
            files: Vec::new(),
            ..Scenario::default()
        })
    }
}

fn run(name: &str, sc: &SessionScenario) -> SessionOutcome {
    let out = sc.run().unwrap_or_else(|f| panic!("{name}: {f}"));
    eprintln!("{name}: {out}");
    out
}

/// Runs a session that must end done on both sides.
fn run_done(name: &str, sc: &SessionScenario) -> SessionOutcome {
    let out = run(name, sc);
    assert!(out.is_done(), "{name}: {out}");
    out
}

fn file_with(path: &str, size: u64, f: impl FnOnce(&mut SimFile)) -> SimEntry {
    let SimEntry::File(mut file) = SimEntry::file(path, size) else {
        unreachable!()
    };
    f(&mut file);
    SimEntry::File(file)
}

fn fault(toward: Side, nth: usize, fault: Fault) -> ControlFault {
    ControlFault { toward, nth, fault }
}

/// Both sides' outcomes are the same in every field.
fn assert_same(out: &SessionOutcome) -> (&Agreed, &Agreed) {
    let s = out.sender_agreed.as_ref().expect("sender agreed");
    let r = out.receiver_agreed.as_ref().expect("receiver agreed");
    assert_eq!(s, r);
    (s, r)
}

/// `side` ended at `at` with an error that `matches`; returns it.
fn ended_with(
    out: &SessionOutcome,
    side: Side,
    at: Duration,
    matches: impl FnOnce(&SideError) -> bool,
) -> &SideError {
    let end = match side {
        Side::Sender => &out.sender,
        Side::Receiver => &out.receiver,
    };
    let Some(err) = end.error() else {
        panic!("{side:?} ended done, not failed: {out}");
    };
    assert!(matches(err), "{side:?} ended with {err:?}\n{out}");
    assert_eq!(end.at, at, "{side:?}'s end: {err}");
    err
}

/// Nothing of the data phase happened: no datagram, no file touched.
fn no_data(out: &SessionOutcome) {
    assert_eq!(out.link.sent, 0, "{out}");
    assert!(out.data.is_none());
    assert!(out.times.first_data.is_none());
    for f in &out.files {
        assert_ne!(f.state, FileState::Written, "{}", f.path);
    }
}

fn peer_aborted(cause: AbortCause) -> impl FnOnce(&SideError) -> bool {
    move |e| matches!(e, SideError::PeerAborted { cause: c, .. } if *c == cause)
}

fn unexpected(name: &'static str, in_state: &'static str) -> impl FnOnce(&SideError) -> bool {
    move |e| {
        matches!(e, SideError::Setup(SetupError::Unexpected { got, wanted })
            if got.name() == name && *wanted == in_state)
    }
}

mod timing {
    use super::*;

    #[test]
    fn first_data_leaves_one_round_trip_after_the_hello() {
        let out = run_done("one round trip", &SessionScenario::default());
        let t = &out.times;
        assert_eq!(t.hello_at_receiver, Some(D));
        assert_eq!(t.manifest_at_receiver, Some(D));
        assert_eq!(t.reply_sent, Some(D));
        assert_eq!(t.hello_ack, Some(RTT));
        assert_eq!(t.manifest_reply, Some(RTT));
        assert_eq!(t.sender_ready, Some(RTT));
        assert_eq!(t.first_data, Some(RTT));
        assert_eq!(t.receiver_ready, Some(RTT + D));
        assert_eq!(t.start_at_receiver, Some(RTT + D));
        // The receiver reads `Done` one way after the sender sent it.
        assert_eq!(out.receiver.at, out.sender.at + D);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.first_data, Some(RTT));
        assert_eq!((data.new_bytes, data.repair_bytes), (4 << 20, 0));
        let count = |m: &std::collections::BTreeMap<&str, u64>, k| m.get(k).copied();
        for (kind, n) in [
            ("Hello", 1),
            ("Manifest", 1),
            ("Skip", 1),
            ("Start", 1),
            ("BlockHashes", 64),
            ("Done", 1),
        ] {
            assert_eq!(count(&out.to_receiver, kind), Some(n), "{kind}");
        }
        for (kind, n) in [
            ("HelloAck", 1),
            ("ManifestReply", 1),
            ("ChannelDone", 4),
            ("FileDone", 1),
        ] {
            assert_eq!(count(&out.to_sender, kind), Some(n), "{kind}");
        }
        assert_eq!(out.keepalives, (0, 0));
    }

    #[test]
    fn ten_thousand_small_files_still_start_one_round_trip_after_the_hello() {
        let mut entries: Vec<SimEntry> =
            (0..100).map(|d| SimEntry::dir(&format!("d{d}"))).collect();
        entries
            .extend((0..10_000u64).map(|i| SimEntry::file(&format!("d{}/f{i}", i % 100), i % 701)));
        let sc = session(entries);
        let out = run_done("10,000 files", &sc);
        assert_eq!(out.times.first_data, Some(RTT));
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
        // 10,100 entries in parts of 2048.
        assert_eq!(out.to_receiver.get("Manifest"), Some(&5));
        assert_eq!(out.to_sender.get("ManifestReply"), Some(&5));
        let (s, _) = assert_same(&out);
        assert_eq!(s.layout.file_count(), 10_000);
        let bytes: u64 = (0..10_000u64).map(|i| i % 701).sum();
        assert_eq!(s.sent_bytes, bytes);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.new_bytes, bytes);
        // Every non-empty file is confirmed on its own.
        let non_empty = (0..10_000u64).filter(|i| i % 701 != 0).count() as u64;
        assert_eq!(out.to_sender.get("FileDone"), Some(&non_empty));
        assert!(out
            .files
            .iter()
            .all(|f| f.state == FileState::Written && f.equals_source));
    }

    #[test]
    fn data_waits_in_the_link_when_control_is_slower_than_data() {
        // Control 35 ms one way, data 20 ms: the first datagrams reach the receiver 15 ms
        // before it has `Skip` and `Start`, and are read then.
        let mut sc = SessionScenario::default();
        sc.data.control_delay = Some(ms(35));
        let out = run_done("slow control", &sc);
        assert_eq!(out.times.first_data, Some(ms(70)));
        assert_eq!(out.times.receiver_ready, Some(ms(105)));
        assert_eq!(out.times.start_at_receiver, Some(ms(105)));
        let data = out.data.as_ref().unwrap();
        assert_eq!((data.repair_bytes, data.rejected.total()), (0, 0));
    }

    #[test]
    fn sessions_replay_exactly() {
        let mut sc = SessionScenario::default();
        sc.data.link = sc.data.link.clone().with_loss(0.02);
        let a = run_done("replay a", &sc);
        let b = run_done("replay b", &sc);
        assert_eq!(a.sender.at, b.sender.at);
        assert_eq!(a.steps, b.steps);
        assert_eq!(a.link, b.link);
        assert!(a.data.as_ref().unwrap().repair_bytes > 0);
    }
}

mod agreement {
    use super::*;

    #[test]
    fn both_sides_agree_on_skips_resumes_holes_and_channels() {
        let mut sc = session(vec![
            SimEntry::dir("d"),
            SimEntry::file("d/fresh", 100_000),
            SimEntry::file("d/same", 50_000),
            SimEntry::file("empty", 0),
            SimEntry::file("resumed", 40 * BLOCK + 7),
            file_with("sparse", 30 * BLOCK, |f| f.holes = vec![(0, 4), (20, 30)]),
        ]);
        sc.max_channels = 3;
        sc.disk
            .files
            .insert("d/same".into(), OnDisk::Copy { mtime_ns: 5 });
        sc.disk.parts.insert(
            "resumed".into(),
            PartFile {
                blocks: vec![(0, 10), (35, 41)],
                corrupt: Vec::new(),
            },
        );
        let out = run_done("agreement", &sc);
        let (s, _) = assert_same(&out);
        assert_eq!(s.channels, 3);
        let same =
            *blake3::hash(&hurtle_netsim::pair::file_bytes(sc.data.seed, 1, 50_000)).as_bytes();
        assert_eq!(
            s.skips,
            vec![
                Skipped::No,
                Skipped::Same(same),
                Skipped::No,
                Skipped::No,
                Skipped::No
            ]
        );
        assert_eq!(s.resumed[3], vec![(0, 10), (35, 41)]);
        assert_eq!(s.sent_bytes, 100_000 + 40 * BLOCK + 7 + 30 * BLOCK);
        assert_eq!(s.held.resumed_bytes, 15 * BLOCK + 7);
        assert_eq!(s.held.hole_bytes, 14 * BLOCK);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.new_bytes, s.moving_bytes());
        assert_eq!(data.held_bytes, s.held.bytes());
        assert_eq!(data.new_bytes, 100_000 + 25 * BLOCK + 16 * BLOCK);
        assert_eq!(out.payload_bytes(1), 0);
    }
}

mod skips {
    use super::*;

    #[test]
    fn an_identical_file_is_skipped_and_no_byte_of_it_is_sent() {
        let mut sc = session(vec![
            SimEntry::file("same", 300_000),
            SimEntry::file("new", 70_000),
        ]);
        // Another modification time: compared by hash, on both sides.
        sc.disk
            .files
            .insert("same".into(), OnDisk::Copy { mtime_ns: 1 });
        let out = run_done("identical", &sc);
        let (s, _) = assert_same(&out);
        assert!(matches!(s.skips[..], [Skipped::Same(_), Skipped::No]));
        assert_eq!(out.receiver_hashed, vec!["same".to_string()]);
        assert_eq!(out.sender_hashed, vec![0]);
        assert!(matches!(
            out.decisions[0],
            Decision::Have {
                replace_ok: false,
                ..
            }
        ));
        assert_eq!((out.payload_bytes(0), out.payload_bytes(1)), (0, 70_000));
        assert_eq!(out.data.as_ref().unwrap().new_bytes, 70_000);
        assert_eq!(out.files[0].state, FileState::Kept);
        assert!(out.files[0].equals_source);
        assert_eq!(out.files[1].state, FileState::Written);
        // Hashing takes no time here: still one round trip.
        assert_eq!(out.times.first_data, Some(RTT));
    }

    #[test]
    fn a_changed_file_of_the_same_size_is_sent_with_overwrite() {
        let mut sc = session(vec![SimEntry::file("a", 200_000)]);
        sc.disk.files.insert(
            "a".into(),
            OnDisk::Altered {
                len: 200_000,
                mtime_ns: 1,
            },
        );
        sc.disk.overwrite = true;
        let out = run_done("changed, overwrite", &sc);
        assert!(matches!(
            out.decisions[0],
            Decision::Have {
                replace_ok: true,
                ..
            }
        ));
        assert_eq!(out.sender_agreed.as_ref().unwrap().skips, vec![Skipped::No]);
        assert_eq!(out.payload_bytes(0), 200_000);
        assert_eq!(out.files[0].state, FileState::Written);
        assert!(out.files[0].equals_source);
    }

    #[test]
    fn a_changed_file_without_overwrite_is_refused_by_the_sender() {
        let mut sc = session(vec![SimEntry::file("a", 200_000)]);
        sc.disk.files.insert(
            "a".into(),
            OnDisk::Altered {
                len: 200_000,
                mtime_ns: 1,
            },
        );
        let out = run("changed, no overwrite", &sc);
        ended_with(
            &out,
            Side::Sender,
            RTT,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Refused),
        );
        assert_eq!(out.sender_hashed, vec![0]);
        no_data(&out);
        assert_eq!(out.files[0].state, FileState::Kept);
        assert!(!out.files[0].equals_source);
    }

    #[test]
    fn something_else_in_the_way_is_refused_by_the_receiver_unless_it_may_overwrite() {
        let mut sc = session(vec![SimEntry::file("ok", 10), SimEntry::file("a", 100_000)]);
        sc.disk.files.insert("a".into(), OnDisk::NotAFile);
        let out = run("in the way", &sc);
        ended_with(
            &out,
            Side::Receiver,
            D,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        // The sender learns which entry from the reply itself.
        ended_with(
            &out,
            Side::Sender,
            RTT,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        no_data(&out);
        sc.disk.overwrite = true;
        let out = run_done("in the way, overwrite", &sc);
        assert_eq!(out.decisions[1], Decision::SendAll);
        assert_eq!(out.payload_bytes(1), 100_000);
        assert_eq!(out.files[1].state, FileState::Written);
    }

    #[test]
    fn files_unchanged_by_size_and_time_are_skipped_unread() {
        let mut sc = session(vec![
            SimEntry::file("a", 500_000),
            SimEntry::file("b", 500_000),
            SimEntry::file("c", 500_000),
        ]);
        sc.disk.files.insert(
            "a".into(),
            OnDisk::Copy {
                mtime_ns: hurtle_netsim::session::MTIME_NS,
            },
        );
        // Same size and time, other bytes: the quick check cannot tell, as with rsync.
        sc.disk.files.insert(
            "b".into(),
            OnDisk::Altered {
                len: 500_000,
                mtime_ns: hurtle_netsim::session::MTIME_NS,
            },
        );
        // Hashing would take seconds here: nobody hashes.
        sc.sender_hash_bps = Some(1_000_000);
        sc.receiver_hash_bps = Some(1_000_000);
        let out = run_done("unchanged", &sc);
        assert_eq!(
            out.decisions[..2],
            [Decision::Unchanged, Decision::Unchanged]
        );
        let (s, _) = assert_same(&out);
        assert_eq!(
            s.skips,
            vec![Skipped::Unchecked, Skipped::Unchecked, Skipped::No]
        );
        assert!(out.sender_hashed.is_empty());
        assert!(out.receiver_hashed.is_empty());
        assert_eq!(out.keepalives, (0, 0));
        assert_eq!(out.times.first_data, Some(RTT));
        assert_eq!(
            (
                out.payload_bytes(0),
                out.payload_bytes(1),
                out.payload_bytes(2)
            ),
            (0, 0, 500_000)
        );
        assert_eq!(out.files[0].state, FileState::Kept);
        assert!(out.files[0].equals_source);
        // Left as it was, different bytes and all.
        assert_eq!(out.files[1].state, FileState::Kept);
        assert!(!out.files[1].equals_source);
    }

    #[test]
    fn with_checksums_both_sides_hash_and_the_time_shows() {
        let mtime = hurtle_netsim::session::MTIME_NS;
        let mut sc = session(vec![
            SimEntry::file("a", 1_000_000),
            SimEntry::file("b", 1_000_000),
            SimEntry::file("c", 1000),
        ]);
        sc.checksum = true;
        sc.disk.overwrite = true;
        sc.disk
            .files
            .insert("a".into(), OnDisk::Copy { mtime_ns: mtime });
        sc.disk.files.insert(
            "b".into(),
            OnDisk::Altered {
                len: 1_000_000,
                mtime_ns: mtime,
            },
        );
        // 80 Mbit/s: 100 ms per file.
        sc.sender_hash_bps = Some(80_000_000);
        sc.receiver_hash_bps = Some(80_000_000);
        let out = run_done("checksum", &sc);
        assert_eq!(out.receiver_hashed, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(out.sender_hashed, vec![0, 1]);
        let (s, _) = assert_same(&out);
        assert!(matches!(
            s.skips[..],
            [Skipped::Same(_), Skipped::No, Skipped::No]
        ));
        // The receiver hashes 200 ms before its reply, the sender 200 ms after it.
        assert_eq!(out.times.reply_sent, Some(D + ms(200)));
        assert_eq!(out.times.manifest_reply, Some(RTT + ms(200)));
        assert_eq!(out.times.first_data, Some(RTT + ms(400)));
        assert_eq!((out.payload_bytes(0), out.payload_bytes(1)), (0, 1_000_000));
        assert_eq!(out.keepalives, (0, 0));
    }
}

mod resume {
    use super::*;

    fn resumed(corrupt: Vec<u64>) -> SessionScenario {
        let mut sc = session(vec![SimEntry::file("big", 64 * BLOCK + 100)]);
        sc.disk.parts.insert(
            "big".into(),
            PartFile {
                blocks: vec![(0, 20), (30, 40)],
                corrupt,
            },
        );
        sc
    }

    #[test]
    fn resume_from_a_part_file_sends_only_the_missing_blocks() {
        let out = run_done("resume", &resumed(Vec::new()));
        assert_eq!(
            out.decisions,
            vec![Decision::Resume {
                blocks: vec![(0, 20), (30, 40)]
            }]
        );
        let (s, _) = assert_same(&out);
        assert_eq!(s.held.resumed_bytes, 30 * BLOCK);
        let data = out.data.as_ref().unwrap();
        assert_eq!(out.payload_bytes(0), 34 * BLOCK + 100);
        assert_eq!(data.new_bytes, 34 * BLOCK + 100);
        assert_eq!(data.held_bytes, 30 * BLOCK);
        assert_eq!((data.repair_bytes, data.blocks_rejected), (0, 0));
        assert!(out.files[0].equals_source);
    }

    #[test]
    fn a_wrong_block_in_a_part_file_is_fetched_again() {
        let out = run_done("resume, one wrong block", &resumed(vec![35]));
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.blocks_rejected, 1);
        assert_eq!(data.repair_bytes, BLOCK);
        assert_eq!(out.payload_bytes(0), 35 * BLOCK + 100);
        assert!(out.files[0].equals_source);
    }

    #[test]
    fn a_sparse_files_holes_are_not_sent() {
        let sc = session(vec![file_with("sparse", 40 * BLOCK + 1, |f| {
            f.holes = vec![(2, 5), (10, 12)]
        })]);
        let out = run_done("sparse", &sc);
        let (s, _) = assert_same(&out);
        assert_eq!(s.held.hole_bytes, 5 * BLOCK);
        assert_eq!(s.held.resumed_bytes, 0);
        let data = out.data.as_ref().unwrap();
        assert_eq!(out.payload_bytes(0), 35 * BLOCK + 1);
        assert_eq!(data.held_bytes, 5 * BLOCK);
        assert!(out.files[0].equals_source);
    }
}

mod channels {
    use super::*;

    #[test]
    fn the_receiver_clamps_the_channels_and_data_uses_its_count() {
        let mut sc = SessionScenario::default();
        sc.data.channels = 8;
        sc.max_channels = 3;
        let out = run_done("clamped", &sc);
        assert_eq!(out.hello.unwrap().channels, 3);
        assert_eq!(out.accepted.as_ref().unwrap().ports, vec![7401, 7402, 7403]);
        let (s, _) = assert_same(&out);
        assert_eq!(s.channels, 3);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.datagrams_by_channel.len(), 3);
        assert!(data.datagrams_by_channel.iter().all(|&n| n > 900), "{data}");
        assert_eq!(data.rejected.total(), 0);
        assert_eq!(out.to_sender.get("ChannelDone"), Some(&3));
    }

    #[test]
    fn an_offer_of_no_channels_gets_one() {
        let mut sc = SessionScenario::default();
        sc.data.channels = 0;
        let out = run_done("no channels offered", &sc);
        assert_eq!(assert_same(&out).0.channels, 1);
        assert_eq!(out.data.as_ref().unwrap().datagrams_by_channel.len(), 1);
    }
}

mod busy {
    use super::*;

    #[test]
    fn keep_alives_carry_a_slow_sender_past_the_set_up_deadline() {
        // The sender hashes its 1 MB copy of a file the receiver has in 25 s (320 kbit/s):
        // more than twice the deadline.
        let mut sc = session(vec![
            SimEntry::file("same", 1_000_000),
            SimEntry::file("new", 10_000),
        ]);
        sc.disk
            .files
            .insert("same".into(), OnDisk::Copy { mtime_ns: 1 });
        sc.sender_hash_bps = Some(320_000);
        let out = run_done("slow sender", &sc);
        let ready = RTT + Duration::from_secs(25);
        assert_eq!(out.times.sender_ready, Some(ready));
        assert_eq!(out.times.first_data, Some(ready));
        // One a second while hashing: 1.04 s ... 24.04 s.
        assert_eq!(out.keepalives, (24, 0));
        assert_eq!(out.to_receiver.get("KeepAlive"), Some(&24));
        assert_eq!(out.payload_bytes(0), 0);
    }

    #[test]
    fn keep_alives_carry_slow_decisions() {
        // The receiver hashes its 1 MB copy in 5 s (1.6 Mbit/s) before it answers.
        let mut sc = session(vec![SimEntry::file("same", 1_000_000)]);
        sc.disk
            .files
            .insert("same".into(), OnDisk::Copy { mtime_ns: 1 });
        sc.receiver_hash_bps = Some(1_600_000);
        let out = run_done("slow receiver", &sc);
        assert_eq!(out.times.reply_sent, Some(D + Duration::from_secs(5)));
        assert_eq!(out.times.manifest_reply, Some(RTT + Duration::from_secs(5)));
        assert_eq!(out.keepalives, (0, 4));
        // Everything was skipped: the data phase is final markers only.
        assert_eq!(out.data.as_ref().unwrap().new_bytes, 0);
        assert_eq!(out.files[0].state, FileState::Kept);
    }

    /// The wait for the sender's skips runs from the reply, however long deciding took: a
    /// receiver that hashes its copy for 12 s (past the set-up deadline) keeps the sender
    /// waiting with keep-alives and then goes on.
    #[test]
    fn a_receiver_deciding_past_the_deadline_goes_on_after_its_reply() {
        let mut sc = session(vec![SimEntry::file("same", 1_500_000)]);
        sc.disk
            .files
            .insert("same".into(), OnDisk::Copy { mtime_ns: 1 });
        // 12 s of hashing.
        sc.receiver_hash_bps = Some(1_000_000);
        let out = run_done("decides for 12 s", &sc);
        let replied = D + Duration::from_secs(12);
        assert_eq!(out.times.reply_sent, Some(replied));
        // Its keep-alives kept the sender (deadline 10.04 s without them) waiting.
        assert_eq!(out.keepalives, (0, 11));
        assert_eq!(out.times.manifest_reply, Some(replied + D));
        let (s, _) = assert_same(&out);
        assert_eq!(s.skips.iter().filter(|k| k.is_skipped()).count(), 1);
    }
}

mod hostile {
    use super::*;

    fn three() -> SessionScenario {
        session(vec![
            SimEntry::file("f0", 100_000),
            SimEntry::dir("d"),
            SimEntry::file("d/f1", 20_000),
        ])
    }

    fn with(fault: ControlFault) -> SessionScenario {
        SessionScenario {
            faults: vec![fault],
            ..three()
        }
    }

    #[test]
    fn a_skip_before_the_manifest_fails_the_receiver() {
        let skip = Control::Skip { files: vec![] };
        let out = run(
            "skip before manifest",
            &with(fault(Side::Receiver, 1, Fault::Insert(skip))),
        );
        ended_with(&out, Side::Receiver, D, unexpected("Skip", "Manifest"));
        // HelloAck, then the abort.
        ended_with(&out, Side::Sender, RTT, peer_aborted(AbortCause::Failed));
        assert_eq!(out.to_sender.get("HelloAck"), Some(&1));
        assert_eq!(out.to_sender.get("Abort"), Some(&1));
        no_data(&out);
    }

    #[test]
    fn a_skip_before_the_manifest_reply_fails_the_sender() {
        let skip = Control::Skip { files: vec![0] };
        let out = run(
            "skip before reply",
            &with(fault(Side::Sender, 1, Fault::Insert(skip))),
        );
        ended_with(&out, Side::Sender, RTT, unexpected("Skip", "ManifestReply"));
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        no_data(&out);
    }

    #[test]
    fn a_second_hello_fails_the_receiver() {
        let out = run(
            "second hello",
            &with(fault(Side::Receiver, 0, Fault::Duplicate)),
        );
        ended_with(&out, Side::Receiver, D, unexpected("Hello", "Manifest"));
        ended_with(&out, Side::Sender, RTT, peer_aborted(AbortCause::Failed));
        no_data(&out);
    }

    #[test]
    fn a_manifest_reply_of_the_wrong_length_fails_the_sender() {
        // Three entries, two decisions.
        let short = Control::ManifestReply {
            decisions: vec![Decision::SendAll; 2],
            last: true,
        };
        let out = run(
            "short reply",
            &with(fault(Side::Sender, 1, Fault::Replace(short))),
        );
        ended_with(&out, Side::Sender, RTT, |e| {
            matches!(e, SideError::Setup(SetupError::ReplyLength))
        });
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        no_data(&out);
    }

    #[test]
    fn a_skip_naming_a_file_not_offered_fails_the_receiver_before_it_reads_a_datagram() {
        // File 0 was offered as "send it": skipping it is not the sender's call.
        let skip = Control::Skip { files: vec![0] };
        let out = run(
            "skip not offered",
            &with(fault(Side::Receiver, 2, Fault::Replace(skip))),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            |e| matches!(e, SideError::Setup(SetupError::SkipNotOffered { path }) if path == "f0"),
        );
        // The sender had started; it stops at the abort.
        ended_with(
            &out,
            Side::Sender,
            RTT + 2 * D,
            peer_aborted(AbortCause::Failed),
        );
        let data = out.data.as_ref().unwrap();
        assert!(data.datagrams_sent > 0);
        assert_eq!(data.rejected.total(), 0, "the receiver read nothing");
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
        // A file id that does not exist.
        let skip = Control::Skip { files: vec![7] };
        let out = run(
            "skip unknown",
            &with(fault(Side::Receiver, 2, Fault::Replace(skip))),
        );
        ended_with(&out, Side::Receiver, RTT + D, |e| {
            matches!(e, SideError::Setup(SetupError::SkipUnknown(7)))
        });
    }

    #[test]
    fn an_abort_from_the_peer_ends_the_session_in_its_words() {
        let abort = |cause, reason: &str| Control::Abort {
            cause,
            reason: reason.into(),
        };
        // To the sender, before the receiver's answer.
        let out = run(
            "abort to sender",
            &with(fault(
                Side::Sender,
                0,
                Fault::Insert(abort(AbortCause::Interrupted, "ctrl-c")),
            )),
        );
        ended_with(
            &out,
            Side::Sender,
            RTT,
            |e| matches!(e, SideError::PeerAborted { cause: AbortCause::Interrupted, reason } if reason == "ctrl-c"),
        );
        // The sender says nothing back (its peer knows) and closes.
        assert_eq!(out.to_receiver.get("Abort"), None);
        ended_with(&out, Side::Receiver, RTT + D, |e| {
            matches!(e, SideError::PeerGone)
        });
        no_data(&out);
        // To the receiver, ready and waiting for `Start`.
        let out = run(
            "abort to receiver",
            &with(fault(
                Side::Receiver,
                3,
                Fault::Insert(abort(AbortCause::Refused, "disk full")),
            )),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            |e| matches!(e, SideError::PeerAborted { cause: AbortCause::Refused, reason } if reason == "disk full"),
        );
        ended_with(&out, Side::Sender, RTT + 2 * D, |e| {
            matches!(e, SideError::PeerGone)
        });
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
    }

    #[test]
    fn an_abort_during_data_keeps_what_was_verified_and_nothing_else() {
        // Many small files: the abort arrives with some verified and in place.
        let mut sc = session(
            (0..40)
                .map(|i| SimEntry::file(&format!("f{i}"), 30_000))
                .collect(),
        );
        sc.data.rate_bps = 20_000_000;
        let abort = Control::Abort {
            cause: AbortCause::Interrupted,
            reason: "ctrl-c".into(),
        };
        // Toward the receiver: Hello, Manifest, Skip, Start, then block values.
        let clean = run_done("no abort", &sc);
        assert_eq!(clean.to_receiver.get("BlockHashes"), Some(&39));
        // Before the 20th block values of 39.
        sc.faults = vec![fault(Side::Receiver, 4 + 20, Fault::Insert(abort))];
        let out = run("abort during data", &sc);
        let err = out.error(Side::Receiver).unwrap();
        assert!(
            matches!(
                err,
                SideError::PeerAborted {
                    cause: AbortCause::Interrupted,
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(out.error(Side::Sender), Some(SideError::PeerGone)));
        let written = out
            .files
            .iter()
            .filter(|f| f.state == FileState::Written)
            .count();
        assert!(written > 0 && written < 40, "{written} files written");
        assert!(out
            .files
            .iter()
            .all(|f| (f.state == FileState::Written) == f.equals_source));
    }

    #[test]
    fn garbage_that_does_not_parse_fails_the_reader() {
        let out = run(
            "garbage",
            &with(fault(Side::Receiver, 0, Fault::Garbage(vec![0xff; 9]))),
        );
        ended_with(&out, Side::Receiver, D, |e| {
            matches!(
                e,
                SideError::Frame(hurtle_proto::wire::FrameError::Malformed(_))
            )
        });
        ended_with(&out, Side::Sender, RTT, peer_aborted(AbortCause::Failed));
        no_data(&out);
        let out = run("oversized", &with(fault(Side::Sender, 1, Fault::Oversized)));
        ended_with(&out, Side::Sender, RTT, |e| {
            matches!(
                e,
                SideError::Frame(hurtle_proto::wire::FrameError::TooLong(_))
            )
        });
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        no_data(&out);
    }

    #[test]
    fn a_duplicated_message_fails_the_side_that_reads_it_twice() {
        // A second Skip, before Start: the receiver's set-up machine judges it.
        let out = run(
            "skip twice",
            &with(fault(Side::Receiver, 2, Fault::Duplicate)),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            unexpected("Skip", "nothing during set-up"),
        );
        ended_with(
            &out,
            Side::Sender,
            RTT + 2 * D,
            peer_aborted(AbortCause::Failed),
        );
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
        // A second HelloAck.
        let out = run(
            "hello ack twice",
            &with(fault(Side::Sender, 0, Fault::Duplicate)),
        );
        ended_with(
            &out,
            Side::Sender,
            RTT,
            unexpected("HelloAck", "ManifestReply"),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        no_data(&out);
        // A second ManifestReply, read after the sender started its data phase.
        let out = run(
            "reply twice",
            &with(fault(Side::Sender, 1, Fault::Duplicate)),
        );
        ended_with(
            &out,
            Side::Sender,
            RTT,
            |e| matches!(e, SideError::Unexpected { got } if got.name() == "ManifestReply"),
        );
        // The receiver got Skip and Start, then the abort.
        assert_eq!(out.times.start_at_receiver, Some(RTT + D));
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        assert_eq!(
            out.link.sent, 0,
            "the sender stopped before its first datagram"
        );
    }

    #[test]
    fn a_lost_start_is_found_by_the_next_message_or_the_deadline() {
        // Lost alone: the block values that follow it are not what a receiver waiting for
        // `Start` takes.
        let out = run("start lost", &with(fault(Side::Receiver, 3, Fault::Drop)));
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            unexpected("BlockHashes", "nothing during set-up"),
        );
        ended_with(
            &out,
            Side::Sender,
            RTT + 2 * D,
            peer_aborted(AbortCause::Failed),
        );
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
        // Lost with everything after it: the receiver, ready, waits out its deadline.
        let out = run(
            "start and all after lost",
            &with(fault(Side::Receiver, 3, Fault::Silence)),
        );
        ended_with(&out, Side::Receiver, RTT + D + SETUP_TIMEOUT, |e| {
            matches!(e, SideError::Setup(SetupError::Timeout(_)))
        });
        ended_with(
            &out,
            Side::Sender,
            RTT + 2 * D + SETUP_TIMEOUT,
            peer_aborted(AbortCause::Network),
        );
        // The sender sent everything; none of it was read.
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.new_bytes, 120_000);
        assert_eq!(data.link.delivered, 0);
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
    }

    #[test]
    fn a_lost_manifest_times_the_receiver_out_from_its_answer() {
        let out = run(
            "manifest lost",
            &with(fault(Side::Receiver, 1, Fault::Drop)),
        );
        // The deadline runs from the hello (and HelloAck) at 20 ms.
        ended_with(&out, Side::Receiver, D + SETUP_TIMEOUT, |e| {
            matches!(e, SideError::Setup(SetupError::Timeout(_)))
        });
        // Its abort reaches the sender exactly at the sender's own deadline (HelloAck + 10 s):
        // a message that arrives at the deadline is read first.
        ended_with(
            &out,
            Side::Sender,
            RTT + SETUP_TIMEOUT,
            peer_aborted(AbortCause::Network),
        );
        no_data(&out);
    }

    /// The receiver answers in parts, as the manifest came: a receiver that has 125,000 of the
    /// files (a `Have` decision is 34 bytes, 4.25 MB in all, past the 4 MiB frame limit in one
    /// message) still gets its answer through, and the sender skips them all.
    #[test]
    fn a_reply_for_many_files_the_receiver_has_goes_in_parts() {
        let n = 125_000;
        let mut sc = session((0..n).map(|i| SimEntry::file(&format!("{i}"), 1)).collect());
        for i in 0..n {
            sc.disk
                .files
                .insert(format!("{i}"), OnDisk::Copy { mtime_ns: 1 });
        }
        let out = run_done("125,000 files the receiver has", &sc);
        assert_eq!(out.receiver_hashed.len(), n);
        assert_eq!(out.to_receiver.get("Manifest"), Some(&62));
        assert_eq!(out.to_sender.get("ManifestReply"), Some(&62));
        let (s, _) = assert_same(&out);
        assert!(s.skips.iter().all(|k| k.is_skipped()));
        assert_eq!(out.data.as_ref().map(|d| d.new_bytes), Some(0));
    }

    #[test]
    fn another_version_is_told_with_reject() {
        let sc = three();
        let hello = Control::Hello {
            magic: MAGIC,
            version: VERSION + 1,
            caps: 0,
            channels: sc.data.channels,
            payload: sc.data.payload,
            block_size: sc.data.block_size,
            session: 1,
        };
        let out = run(
            "other version",
            &with(fault(Side::Receiver, 0, Fault::Replace(hello))),
        );
        ended_with(
            &out,
            Side::Receiver,
            D,
            |e| matches!(e, SideError::Setup(SetupError::Incompatible { version, .. }) if *version == VERSION + 1),
        );
        assert_eq!(out.to_sender.get("Reject"), Some(&1));
        ended_with(
            &out,
            Side::Sender,
            RTT,
            |e| matches!(e, SideError::PeerAborted { cause: AbortCause::Failed, reason } if reason.contains("same hurtle version")),
        );
        no_data(&out);
    }

    /// A `HelloAck` naming more ports than the sender offered channels is refused at once:
    /// the two sides would otherwise build different layouts.
    #[test]
    fn a_hello_ack_with_more_ports_than_offered_is_refused() {
        let mut sc = three();
        sc.data.channels = 2;
        let ack = Control::HelloAck {
            version: VERSION,
            caps: 0,
            ports: vec![7401; 5],
            payload: sc.data.payload,
            rate_ceiling: 0,
            recv_buffer: 0,
            recv_buffer_wanted: 0,
            tcp_port: 0,
        };
        sc.faults = vec![fault(Side::Sender, 0, Fault::Replace(ack))];
        let out = run("more ports", &sc);
        ended_with(&out, Side::Sender, RTT, |e| {
            matches!(
                e,
                SideError::Setup(SetupError::TooManyPorts {
                    ports: 5,
                    offered: 2
                })
            )
        });
        assert!(out.sender_agreed.is_none());
        assert!(out.files.iter().all(|f| f.state == FileState::Absent));
        no_data(&out);
    }
}

mod silence {
    use super::*;

    fn silent(faults: Vec<ControlFault>) -> SessionOutcome {
        let sc = SessionScenario {
            faults,
            ..SessionScenario::default()
        };
        run("silence", &sc)
    }

    fn timed_out(e: &SideError) -> bool {
        matches!(e, SideError::Setup(SetupError::Timeout(t)) if *t == SETUP_TIMEOUT)
    }

    #[test]
    fn nothing_reaches_the_sender_and_both_time_out_at_their_deadlines() {
        // The receiver's answers are lost, and so is everything the sender sends after its
        // hello and manifest (its abort too).
        let out = silent(vec![
            fault(Side::Sender, 0, Fault::Silence),
            fault(Side::Receiver, 2, Fault::Silence),
        ]);
        // The sender's deadline runs from its hello.
        ended_with(&out, Side::Sender, SETUP_TIMEOUT, timed_out);
        // The receiver's from the manifest, at 20 ms.
        ended_with(&out, Side::Receiver, D + SETUP_TIMEOUT, timed_out);
        no_data(&out);
    }

    #[test]
    fn silence_after_the_hello_ack_times_each_side_out_from_its_last_message() {
        let out = silent(vec![fault(Side::Sender, 1, Fault::Silence)]);
        // The receiver waits for `Skip` from its reply (20 ms); its abort is lost.
        ended_with(&out, Side::Receiver, D + SETUP_TIMEOUT, timed_out);
        // The sender waits for `ManifestReply` from `HelloAck` (40 ms).
        ended_with(&out, Side::Sender, RTT + SETUP_TIMEOUT, timed_out);
        no_data(&out);
    }

    #[test]
    fn a_receiver_that_never_hears_the_hello_times_out_from_its_start() {
        let out = silent(vec![fault(Side::Receiver, 0, Fault::Silence)]);
        ended_with(&out, Side::Receiver, SETUP_TIMEOUT, timed_out);
        // The receiver's abort would arrive 20 ms after the sender's own deadline.
        ended_with(&out, Side::Sender, SETUP_TIMEOUT, timed_out);
        no_data(&out);
    }
}

mod any_fault {
    use super::*;
    use proptest::prelude::*;

    /// Messages a confused or hostile peer might send at any point of the set-up.
    fn any_message() -> impl Strategy<Value = Control> {
        prop_oneof![
            Just(Control::Skip { files: vec![] }),
            Just(Control::Skip { files: vec![0, 1] }),
            Just(Control::Start {
                payload: 1384,
                report_interval_us: 10_000
            }),
            Just(Control::KeepAlive),
            Just(Control::Done),
            Just(Control::ManifestReply {
                decisions: vec![Decision::SendAll; 3],
                last: true,
            }),
            Just(Control::ManifestReply {
                decisions: vec![
                    Decision::Unchanged,
                    Decision::SendAll,
                    Decision::Resume {
                        blocks: vec![(0, 99)]
                    }
                ],
                last: true,
            }),
            Just(Control::HelloAck {
                version: VERSION,
                caps: 0,
                ports: vec![],
                payload: 1384,
                rate_ceiling: 0,
                recv_buffer: 0,
                recv_buffer_wanted: 0,
                tcp_port: 0,
            }),
            Just(Control::Manifest {
                entries: vec![],
                last: true
            }),
            Just(Control::FileDone {
                file: 0,
                hash: [0; 32]
            }),
            Just(Control::Nack {
                channel: 9,
                ranges: vec![(0, 10)]
            }),
            Just(Control::Abort {
                cause: AbortCause::Failed,
                reason: "x".into()
            }),
        ]
    }

    fn any_fault() -> impl Strategy<Value = Fault> {
        prop_oneof![
            any_message().prop_map(Fault::Insert),
            any_message().prop_map(Fault::Replace),
            Just(Fault::Drop),
            Just(Fault::Duplicate),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(Fault::Garbage),
            Just(Fault::Oversized),
            Just(Fault::Silence),
        ]
    }

    /// A fault at one of the set-up's messages: toward the receiver `Hello`, `Manifest`,
    /// `Skip`, `Start` (or the sender's keep-alives while it hashes); toward the sender
    /// `HelloAck`, `ManifestReply`.
    fn any_setup_fault() -> impl Strategy<Value = ControlFault> {
        (any::<bool>(), 0usize..4, any_fault()).prop_map(|(to_receiver, nth, fault)| {
            if to_receiver {
                ControlFault {
                    toward: Side::Receiver,
                    nth,
                    fault,
                }
            } else {
                ControlFault {
                    toward: Side::Sender,
                    nth: nth % 2,
                    fault,
                }
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        /// Whatever goes wrong at one set-up message, the session ends on both sides (done, or
        /// with a typed error), never panics, and never lands a wrong byte (the runner checks).
        #[test]
        fn any_fault_in_the_set_up_ends_both_sides_cleanly(f in any_setup_fault(), hashing in any::<bool>()) {
            let mut sc = session(vec![
                SimEntry::file("f0", 40_000),
                SimEntry::dir("d"),
                SimEntry::file("d/f1", 3 * BLOCK),
            ]);
            sc.disk.files.insert("f0".into(), OnDisk::Copy { mtime_ns: 1 });
            sc.disk.parts.insert("d/f1".into(), PartFile { blocks: vec![(1, 2)], corrupt: vec![] });
            if hashing {
                // The sender hashes f0 for 2.5 s: its keep-alives are messages 2 and 3.
                sc.sender_hash_bps = Some(128_000);
            }
            sc.data.max_virtual = Duration::from_secs(60);
            sc.faults = vec![f.clone()];
            let out = sc.run().unwrap_or_else(|e| panic!("{f:?}: {e}"));
            if out.is_done() {
                prop_assert!(out.files.iter().all(|f| f.equals_source), "{out}");
            } else {
                prop_assert!(out.files.iter().all(|f| f.state != FileState::Written || f.equals_source));
            }
            // A side done means its peer did its part: the receiver is done only after the
            // sender's `Done`.
            if matches!(out.receiver.end, End::Done) {
                prop_assert!(matches!(out.sender.end, End::Done));
            }
        }
    }

    #[test]
    fn without_faults_that_session_is_done_and_exact() {
        let mut sc = session(vec![
            SimEntry::file("f0", 40_000),
            SimEntry::dir("d"),
            SimEntry::file("d/f1", 3 * BLOCK),
        ]);
        sc.disk
            .files
            .insert("f0".into(), OnDisk::Copy { mtime_ns: 1 });
        sc.disk.parts.insert(
            "d/f1".into(),
            PartFile {
                blocks: vec![(1, 2)],
                corrupt: vec![],
            },
        );
        let out = run_done("the proptest's base", &sc);
        assert_eq!(out.payload_bytes(0), 0);
        assert_eq!(out.payload_bytes(1), 2 * BLOCK);
    }
}
