//! Whole sessions: hurtle-proto's set-up machines (`SenderSetup`, `ReceiverSetup`) driven over
//! the simulated control path on virtual time, then the data phase from what they agreed (see
//! `hurtle_netsim::whole_session`).
//!
//! Each case asserts numbers: the virtual time of each phase, what each side hashed, the bytes
//! of each file that crossed the data link, and for a failed session which side ended with which
//! typed error, when. The runner itself checks that no file lands on the receiver with a byte
//! that is not the sender's, and that a session both sides call done is exact.
//!
//! Unless a case says otherwise the control path's one-way delay is 20 ms (the data link's), so
//! a round trip is 40 ms. Time zero is the sender's first flight, the key agreement's `Agree`
//! with the hello behind it, one round trip after its TCP connect (neither the connect nor the
//! agreement is modelled): add a round trip to any time here for the time from the connect.
//! The sender's manifest and its early data leave at the `HelloAck`, one round trip after time
//! zero; the receiver starts its data phase at its decisions, one and a half, unless it offers
//! files for hashing.

use hurtle_netsim::{
    ControlFault, EarlyData, End, Fault, FileState, OnDisk, PartFile, Scenario, SessionOutcome,
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
/// 16 KiB blocks, 200 Mbit/s, 20 ms one way). Without the tail's parity: these tests pin the
/// session's times and counts to the datagram, and parity (all of a small transfer is tail)
/// would move them by its own cost, which `rate_control.rs` measures where it matters.
fn session(entries: Vec<SimEntry>) -> SessionScenario {
    SessionScenario {
        entries,
        ..SessionScenario::new(Scenario {
            files: Vec::new(),
            fec: false,
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

/// Nothing of the data phase happened: no datagram, no file touched (a session that failed
/// before the sender could send any early data).
fn no_data(out: &SessionOutcome) {
    assert_eq!(out.link.sent, 0, "{out}");
    assert!(out.data.is_none());
    // At most begun by a `HelloAck` read just before the end.
    assert!(out
        .early
        .as_ref()
        .is_none_or(|e| e.kept.is_none() && e.sent.datagrams == 0));
    assert!(out.times.first_data.is_none());
    for f in &out.files {
        assert_ne!(f.state, FileState::Written, "{}", f.path);
    }
}

/// The sender sent early data from the `HelloAck` (at `RTT`) but never had its outcome: no
/// data phase of its own. Its block values went all the same, so a receiver in its data phase
/// may have verified and put in place files of it (the run checks they are exact). Returns
/// the early data's datagrams.
fn early_data_only(out: &SessionOutcome) -> u64 {
    let early = out.early.as_ref().expect("early data");
    assert_eq!(early.from, RTT);
    assert_eq!(early.kept, None, "{out}");
    assert!(out.data.is_none());
    assert_eq!(out.times.first_data, Some(RTT));
    assert!(early.sent.datagrams > 0);
    assert!(early.sent.values > 0);
    for f in &out.files {
        assert!(
            f.state != FileState::Written || f.equals_source,
            "{}",
            f.path
        );
    }
    early.sent.datagrams
}

/// Whether the receiver put each of the sender's files in place.
fn written(out: &SessionOutcome) -> Vec<bool> {
    out.files
        .iter()
        .map(|f| f.state == FileState::Written)
        .collect()
}

/// The sender's outcome did not keep its early data: all of it reached the receiver, which
/// dropped it as superseded (the run checks that none of it landed in a file), and none of it
/// counts in the data phase. Returns it.
fn early_wasted(out: &SessionOutcome) -> &EarlyData {
    let early = out.early.as_ref().expect("early data");
    assert_eq!(early.from, RTT);
    assert_eq!(early.kept, Some(false), "{out}");
    let (s, _) = assert_same(out);
    assert!(!s.early);
    let data = out.data.as_ref().unwrap();
    assert_eq!(
        data.rejected.superseded,
        early.sent.datagrams + early.sent.finals + early.sent.parity,
        "{out}"
    );
    assert_eq!(data.rejected.total(), 0, "{out}");
    early
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

    /// The hello goes at time zero with the key agreement; the manifest and the early data at
    /// its `HelloAck`, one round trip later; the receiver decides and starts its data phase
    /// half a round trip after that, and the sender learns that its early data counts half a
    /// round trip later still.
    #[test]
    fn first_data_leaves_one_round_trip_after_the_hello() {
        let out = run_done("one round trip", &SessionScenario::default());
        let t = &out.times;
        assert_eq!(t.hello_at_receiver, Some(D));
        assert_eq!(t.hello_ack, Some(RTT));
        assert_eq!(t.first_data, Some(RTT));
        assert_eq!(t.manifest_at_receiver, Some(RTT + D));
        assert_eq!(t.reply_sent, Some(RTT + D));
        assert_eq!(t.receiver_ready, Some(RTT + D));
        assert_eq!(t.manifest_reply, Some(2 * RTT));
        assert_eq!(t.sender_ready, Some(2 * RTT));
        // The receiver reads `Done` one way after the sender sent it.
        assert_eq!(out.receiver.at, out.sender.at + D);
        // All the early data counted: 200 Mbit/s for one round trip (720 datagrams), well
        // inside its budget of two round trips' worth (2 MB).
        let early = out.early.as_ref().unwrap();
        assert_eq!(
            (early.from, early.budget, early.kept),
            (RTT, 2_000_000, Some(true))
        );
        assert_eq!((early.sent.datagrams, early.sent.new_bytes), (720, 983_040));
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.first_data, Some(RTT));
        assert_eq!((data.new_bytes, data.repair_bytes), (4 << 20, 0));
        assert_eq!(data.rejected, Default::default());
        let count = |m: &std::collections::BTreeMap<&str, u64>, k| m.get(k).copied();
        for (kind, n) in [
            ("Hello", Some(1)),
            ("Manifest", Some(1)),
            ("Skip", None),
            ("Start", None),
            // The block values go as the blocks are read, early data's too: one message per
            // step of the sender that read any (256 blocks).
            ("BlockHashes", Some(64)),
            ("Done", Some(1)),
        ] {
            assert_eq!(count(&out.to_receiver, kind), n, "{kind}");
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
        assert_eq!(out.times.manifest_at_receiver, Some(RTT + D));
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
        assert_eq!(out.early.as_ref().unwrap().kept, Some(true));
        // 10,100 entries in parts of 2048.
        assert_eq!(out.to_receiver.get("Manifest"), Some(&5));
        assert_eq!(out.to_sender.get("ManifestReply"), Some(&5));
        let (s, _) = assert_same(&out);
        assert_eq!(s.layout.file_count(), 10_000);
        let bytes: u64 = (0..10_000u64).map(|i| i % 701).sum();
        assert_eq!(s.sent_bytes, bytes);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.new_bytes, bytes);
        // Every file is confirmed on its own, the empty ones too (as the engine's receiver
        // commits them at the start of its data phase).
        assert_eq!(out.to_sender.get("FileDone"), Some(&10_000));
        assert!(out
            .files
            .iter()
            .all(|f| f.state == FileState::Written && f.equals_source));
    }

    #[test]
    fn data_waits_in_the_link_when_control_is_slower_than_data() {
        // Control 35 ms one way, data 20 ms: the first (early) datagrams leave at the
        // `HelloAck` (70 ms) and reach the receiver at 90 ms, 15 ms before the manifest and its
        // decisions start its data phase, and are read then.
        let mut sc = SessionScenario::default();
        sc.data.control_delay = Some(ms(35));
        let out = run_done("slow control", &sc);
        assert_eq!(out.times.first_data, Some(ms(70)));
        assert_eq!(out.times.manifest_at_receiver, Some(ms(105)));
        assert_eq!(out.times.receiver_ready, Some(ms(105)));
        assert_eq!(out.early.as_ref().unwrap().kept, Some(true));
        let data = out.data.as_ref().unwrap();
        assert_eq!((data.repair_bytes, data.rejected), (0, Default::default()));
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

/// Early data: the sender's data from the `HelloAck` on, under its provisional outcome, before
/// it knows the real one.
mod early_data {
    use super::*;
    use hurtle_netsim::LinkConfig;
    use hurtle_proto::{RateConfig, RateMode, RecvConfig, SendConfig};

    /// A 150 ms round trip (75 ms each way, control and data), tuned for it as the engine
    /// tunes its channels.
    const RTT150: Duration = Duration::from_millis(150);

    fn path150(entries: Vec<SimEntry>) -> SessionScenario {
        SessionScenario {
            entries,
            ..SessionScenario::new(Scenario {
                files: Vec::new(),
                link: LinkConfig::default().with_delay(RTT150 / 2),
                send: SendConfig::for_rtt(RTT150),
                recv: RecvConfig::for_rtt(RTT150),
                // As `session`: times pinned to the datagram, without the tail's parity.
                fec: false,
                ..Scenario::default()
            })
        }
    }

    /// How long `bytes` of file data take at the default 200 Mbit/s, headers included
    /// (datagrams of the default payload).
    fn transmission(bytes: u64) -> Duration {
        let payload = u64::from(hurtle_proto::wire::DEFAULT_PAYLOAD);
        let wire = bytes + bytes.div_ceil(payload) * hurtle_proto::wire::HEADER_LEN as u64;
        Duration::from_nanos(wire * 8 * 1_000_000_000 / 200_000_000)
    }

    /// The first data leaves at the `HelloAck`: one round trip after time zero, two after the
    /// sender's connect (counting TCP's handshake, which netsim does not model). Exactly: the
    /// epsilon the engine needs there (its own work between reading the `HelloAck` and sending
    /// the first datagram) is zero here, as netsim gives no work virtual time.
    #[test]
    fn first_data_leaves_one_round_trip_after_time_zero_on_a_150_ms_path() {
        let out = run_done(
            "one file, 150 ms",
            &path150(vec![SimEntry::file("a", 4 << 20)]),
        );
        let first = out.times.first_data.unwrap();
        assert!(first <= RTT150 + Duration::ZERO, "{out}");
        assert_eq!(first, RTT150);
        assert_eq!(out.data.as_ref().unwrap().first_data, Some(RTT150));
        // Done (the run checked the received file is exact) and in place.
        assert_eq!(out.files[0].state, FileState::Written);
        assert!(out.files[0].equals_source);
        // The early data counted: no new start, nothing dropped, nothing resent.
        let early = out.early.as_ref().unwrap();
        assert_eq!(early.kept, Some(true));
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.rejected, Default::default());
        assert_eq!((data.new_bytes, data.repair_bytes), (4 << 20, 0));
        // The sender is done one round trip after its last datagram left (the last one's way
        // there, the `FileDone`'s way back): 470.4 ms.
        let done = out.sender.at;
        assert!(done <= RTT150 + transmission(4 << 20) + RTT150, "{done:?}");
        assert_eq!(done, Duration::from_nanos(470_360_320));
    }

    /// Neither the manifest (10,000 entries, 5 parts) nor the decisions hold the early data
    /// back: it leaves at the `HelloAck` all the same.
    #[test]
    fn ten_thousand_small_files_still_send_their_first_data_one_round_trip_after_time_zero() {
        let size = |i: u64| KIB + (i * 977) % (3 * KIB);
        let entries = (0..10_000u64)
            .map(|i| SimEntry::file(&format!("f{i}"), size(i)))
            .collect();
        let wall = std::time::Instant::now();
        let out = run_done("10,000 files of 1-4 KiB, 150 ms", &path150(entries));
        eprintln!("10,000 files: {:?} of wall time", wall.elapsed());
        let t = &out.times;
        assert_eq!(t.first_data, Some(RTT150));
        // The whole manifest in one flight: decided at one and a half round trips.
        assert_eq!(t.manifest_at_receiver, Some(RTT150 + RTT150 / 2));
        assert_eq!(t.receiver_ready, Some(RTT150 + RTT150 / 2));
        assert_eq!(t.sender_ready, Some(2 * RTT150));
        assert_eq!(out.to_receiver.get("Manifest"), Some(&5));
        assert_eq!(out.to_sender.get("ManifestReply"), Some(&5));
        // One round trip of early data at 200 Mbit/s (3.7 MB, inside its 7.5 MB budget), all
        // of it kept.
        let early = out.early.as_ref().unwrap();
        assert_eq!((early.budget, early.kept), (7_500_000, Some(true)));
        assert_eq!(
            (early.sent.datagrams, early.sent.new_bytes),
            (3295, 3_662_750)
        );
        let bytes: u64 = (0..10_000u64).map(size).sum();
        let (s, _) = assert_same(&out);
        assert_eq!(s.sent_bytes, bytes);
        assert_eq!(out.data.as_ref().unwrap().new_bytes, bytes);
        assert_eq!(out.to_sender.get("FileDone"), Some(&10_000));
        assert!(out
            .files
            .iter()
            .all(|f| f.state == FileState::Written && f.equals_source));
    }

    /// A file resumed, unchanged or offered for hashing makes the outcome another layout: the
    /// early data (every file whole) is dropped, the data phase starts again under the next
    /// session id (the hello's + 2), and the receiver drops every early datagram it reads as
    /// superseded (none lands in a file: the run checks the files are exact).
    #[test]
    fn early_data_is_dropped_when_a_file_is_resumed_unchanged_or_offered_for_hashing() {
        let resumed =
            |d: &Decision| matches!(d, Decision::Resume { blocks } if *blocks == [(0, 10)]);
        let unchanged = |d: &Decision| *d == Decision::Unchanged;
        let have = |d: &Decision| matches!(d, Decision::Have { .. });
        let part = PartFile {
            blocks: vec![(0, 10)],
            corrupt: Vec::new(),
        };
        let same = OnDisk::Copy {
            mtime_ns: hurtle_netsim::whole_session::MTIME_NS,
        };
        type Case = (
            &'static str,
            Option<OnDisk>,
            Option<PartFile>,
            fn(&Decision) -> bool,
        );
        let cases: [Case; 3] = [
            ("resumed", None, Some(part), resumed),
            ("unchanged", Some(same), None, unchanged),
            (
                "offered for hashing",
                Some(OnDisk::Copy { mtime_ns: 1 }),
                None,
                have,
            ),
        ];
        for (name, on_disk, part, decided) in cases {
            let mut sc = session(vec![
                SimEntry::file("fresh", 50_000),
                SimEntry::file("old", 20 * BLOCK),
            ]);
            if let Some(d) = on_disk {
                sc.disk.files.insert("old".into(), d);
            }
            if let Some(p) = part {
                sc.disk.parts.insert("old".into(), p);
            }
            let out = run_done(name, &sc);
            assert!(decided(&out.decisions[1]), "{name}: {:?}", out.decisions);
            // Both sides agree on the outcome, and it is not the provisional one: the next
            // session id.
            let (s, _) = assert_same(&out);
            assert!(!s.early, "{name}");
            assert_eq!(s.session, out.hello.unwrap().session + 2, "{name}");
            // The early data left at the `HelloAck` and all of it was dropped.
            assert_eq!(out.times.first_data, Some(RTT), "{name}");
            let early = early_wasted(&out);
            assert_eq!(
                early.sent.file_payload_bytes,
                vec![50_000, 20 * BLOCK],
                "{name}"
            );
            // Both files whole, 377,680 bytes in 277 datagrams, and a final marker per
            // channel: all sent within the round trip before the outcome, all wasted.
            eprintln!(
                "{name}: {} early datagrams and {} final markers wasted",
                early.sent.datagrams, early.sent.finals
            );
            assert_eq!(
                (early.sent.datagrams, early.sent.finals),
                (277, 4),
                "{name}"
            );
            // The data phase moved what the outcome says, and every file is right.
            let data = out.data.as_ref().unwrap();
            assert_eq!(data.new_bytes, s.moving_bytes(), "{name}");
            assert!(out.files.iter().all(|f| f.equals_source), "{name}: {out}");
            // The early data's block values (one per block of both files, of the provisional
            // layout) went at once, and the receiver dropped every one: those that came
            // during its set-up (its machine kept them until the outcome, or dropped them
            // waiting for `Skip`), and those that came in its data phase as superseded. Its
            // verifier took only the data phase's values, one per block of its layout, and
            // no block failed.
            eprintln!(
                "{name}: {} early values in {} messages; {} in the set-up, {} superseded; \
                 {} of the data phase",
                early.sent.values,
                early.sent.hash_messages,
                out.values_in_setup,
                data.values_superseded,
                data.values_expected
            );
            assert_eq!(early.sent.values, 4 + 20, "{name}");
            assert_eq!(
                out.values_in_setup + data.values_superseded,
                early.sent.values,
                "{name}"
            );
            assert_eq!(data.early_values, 0, "{name}");
            assert_eq!(data.values_expected, s.layout.total_blocks(), "{name}");
            assert_eq!(data.blocks_rejected, 0, "{name}");
        }
    }

    /// A receiver slow to decide (its look at its file system takes 100 ms) for an outcome
    /// that keeps the early data: the early data's block values that came meanwhile are
    /// kept by its set-up machine and checked in its data phase as if they had come in it.
    #[test]
    fn early_block_values_that_come_before_a_kept_outcome_are_checked() {
        let mut sc = session(vec![SimEntry::file("a", 1 << 20)]);
        sc.receiver_look = ms(100);
        let out = run_done("slow look", &sc);
        let (s, _) = assert_same(&out);
        assert!(s.early);
        assert_eq!(out.times.manifest_at_receiver, Some(RTT + D));
        assert_eq!(out.times.receiver_ready, Some(RTT + D + ms(100)));
        // The file was verified at the receiver's outcome: the sender is done at its own.
        assert_eq!(out.sender.at, out.times.sender_ready.unwrap());
        assert_eq!(out.sender.at, 2 * RTT + ms(100));
        let early = out.early.as_ref().unwrap();
        assert_eq!(early.kept, Some(true));
        assert_eq!(early.sent.values, 64);
        let data = out.data.as_ref().unwrap();
        eprintln!(
            "slow look: {} values in the set-up, {} used, {} in all",
            out.values_in_setup, data.early_values, data.values_expected
        );
        // The early data sent the whole file (1 MiB, inside its 2 MB budget) in 43 ms: every
        // value came while the receiver looked, and every one was used.
        assert_eq!(out.values_in_setup, 64);
        assert_eq!((data.early_values, data.values_expected), (64, 64));
        assert_eq!((data.blocks_rejected, data.repair_bytes), (0, 0));
        assert_eq!(data.values_superseded, 0);
        assert!(out.files[0].equals_source);
    }

    /// 1 MiB over a 150 ms path: the early data carries it all, block values included (they
    /// go as the blocks are read), so the sender is done one round trip after its last
    /// datagram left (its way there, the `FileDone`'s way back): at two round trips plus the
    /// transmission time after time zero (342.0 ms at 200 Mbit/s; a little less than the
    /// transmission time, as the pacers' catch-up lets the first bursts go at once), not at
    /// its outcome (two round trips) plus one. The same with rate control (starting at
    /// 100 Mbit/s: 380.3 ms, where the receiver reports at its own interval from its start,
    /// startup's sends going in trains of up to 64 KiB).
    #[test]
    fn a_mebibyte_over_150_ms_is_done_one_round_trip_after_its_last_datagram() {
        let mut sc = path150(vec![SimEntry::file("a", 1 << 20)]);
        for rated in [false, true] {
            if rated {
                sc.data.rate = Some(RateConfig {
                    mode: RateMode::Auto,
                    ceiling_bps: 10_000_000_000,
                    start_bps: 100_000_000,
                    min_bps: 1_000_000,
                    rtt: RTT150,
                });
            }
            let out = run_done("1 MiB, 150 ms", &sc);
            let done = out.sender.at;
            let data = out.data.as_ref().unwrap();
            let (at, transmitted) = if rated {
                (380_256_000, 2 * transmission(1 << 20))
            } else {
                (341_950_720, transmission(1 << 20))
            };
            assert_eq!(done, Duration::from_nanos(at), "rated {rated}");
            assert_eq!(done, data.new_data_sent + RTT150, "rated {rated}");
            assert!(done <= 2 * RTT150 + transmitted, "rated {rated}: {done:?}");
            assert_eq!(out.receiver.at, done + RTT150 / 2);
            let early = out.early.as_ref().unwrap();
            assert_eq!(early.kept, Some(true));
            // Every byte, and every block's value, went before the outcome.
            assert_eq!(early.sent.new_bytes, 1 << 20);
            assert_eq!(early.sent.values, 64);
            // The receiver decided at the manifest, which came before any value: it checked
            // every block against the early data's value in its data phase, none from its
            // set-up, and none failed.
            assert_eq!(out.values_in_setup, 0);
            assert_eq!((data.values_expected, data.early_values), (64, 0));
            assert_eq!(data.blocks_rejected, 0);
            if rated {
                // Every 37.5 ms from the receiver's start at 225 ms.
                let at: Vec<Duration> = data.reports.iter().take(3).map(|r| r.at).collect();
                assert_eq!(at, [262_500, 300_000, 337_500].map(Duration::from_micros));
            } else {
                assert!(data.reports.is_empty());
            }
        }
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
    fn an_identical_file_is_skipped_and_no_byte_of_it_counts() {
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
        // Hashing takes no time here: the early data leaves at one round trip, the outcome's
        // data phase at two, and the receiver starts at the `Skip`, half a round trip later.
        assert_eq!(out.times.first_data, Some(RTT));
        assert_eq!(out.times.sender_ready, Some(2 * RTT));
        assert_eq!(out.times.receiver_ready, Some(2 * RTT + D));
        // Both files went early, whole (370 KB, inside the 2 MB budget), and were dropped.
        let early = early_wasted(&out);
        assert_eq!(early.sent.file_payload_bytes, vec![300_000, 70_000]);
        assert_eq!((early.sent.datagrams, early.sent.finals), (272, 4));
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
        // Offered for hashing: the early data (all of the file) does not count; it is sent
        // again under the outcome's session id.
        let early = early_wasted(&out);
        assert_eq!(early.sent.file_payload_bytes, vec![200_000]);
        assert_eq!(early.sent.datagrams, 147);
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
            2 * RTT,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            peer_aborted(AbortCause::Refused),
        );
        assert_eq!(out.sender_hashed, vec![0]);
        // The whole file went early; the receiver, waiting for `Skip`, read none of it.
        assert_eq!(early_data_only(&out), 147);
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
            RTT + D,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        // The sender learns which entry from the reply itself.
        ended_with(
            &out,
            Side::Sender,
            2 * RTT,
            |e| matches!(e, SideError::Setup(SetupError::Refused { path, .. }) if path == "a"),
        );
        assert_eq!(early_data_only(&out), 75);
        sc.disk.overwrite = true;
        let out = run_done("in the way, overwrite", &sc);
        assert_eq!(out.decisions[1], Decision::SendAll);
        assert_eq!(out.early.as_ref().unwrap().kept, Some(true));
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
                mtime_ns: hurtle_netsim::whole_session::MTIME_NS,
            },
        );
        // Same size and time, other bytes: the quick check cannot tell, as with rsync.
        sc.disk.files.insert(
            "b".into(),
            OnDisk::Altered {
                len: 500_000,
                mtime_ns: hurtle_netsim::whole_session::MTIME_NS,
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
        // Nothing offered for hashing: no `Skip`, and the receiver starts at its decisions.
        assert_eq!(out.to_receiver.get("Skip"), None);
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
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
        // The early data sent what one round trip at 200 Mbit/s takes (the outcome came
        // before its 2 MB budget was spent), the unchanged files first: wasted.
        let early = early_wasted(&out);
        assert_eq!(
            early.sent.file_payload_bytes,
            vec![500_000, 475_136, 11_168]
        );
    }

    #[test]
    fn with_checksums_both_sides_hash_and_the_time_shows() {
        let mtime = hurtle_netsim::whole_session::MTIME_NS;
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
        // The receiver hashes 200 ms before its reply, the sender 200 ms after it: the
        // outcome's data phase starts 400 ms later than without hashing.
        assert_eq!(out.times.reply_sent, Some(RTT + D + ms(200)));
        assert_eq!(out.times.manifest_reply, Some(2 * RTT + ms(200)));
        assert_eq!(out.times.sender_ready, Some(2 * RTT + ms(400)));
        assert_eq!(out.times.receiver_ready, Some(2 * RTT + D + ms(400)));
        assert_eq!((out.payload_bytes(0), out.payload_bytes(1)), (0, 1_000_000));
        assert_eq!(out.keepalives, (0, 0));
        // The early data still left at one round trip, and stopped at its budget (two round
        // trips' worth, 2 MB of the 2,001,000 bytes): all of it wasted.
        assert_eq!(out.times.first_data, Some(RTT));
        let early = early_wasted(&out);
        assert_eq!((early.budget, early.sent.new_bytes), (2_000_000, 2_000_000));
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
        // Once, and once more: nothing new is left, so the repair is the tail's and goes twice.
        assert_eq!(data.repair_bytes, 2 * BLOCK);
        assert_eq!(out.payload_bytes(0), 36 * BLOCK + 100);
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
        // It hashes from the reply, at two round trips.
        let ready = 2 * RTT + Duration::from_secs(25);
        assert_eq!(out.times.sender_ready, Some(ready));
        assert_eq!(out.times.receiver_ready, Some(ready + D));
        // One a second while hashing: 1.08 s ... 24.08 s.
        assert_eq!(out.keepalives, (24, 0));
        assert_eq!(out.to_receiver.get("KeepAlive"), Some(&24));
        assert_eq!(out.payload_bytes(0), 0);
        assert_eq!(out.payload_bytes(1), 10_000);
        // The early data, meanwhile, sent both files whole and waited: wasted.
        assert_eq!(out.times.first_data, Some(RTT));
        let early = early_wasted(&out);
        assert_eq!(early.sent.file_payload_bytes, vec![1_000_000, 10_000]);
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
        assert_eq!(out.times.reply_sent, Some(RTT + D + Duration::from_secs(5)));
        assert_eq!(
            out.times.manifest_reply,
            Some(2 * RTT + Duration::from_secs(5))
        );
        assert_eq!(out.keepalives, (0, 4));
        // Everything was skipped: the data phase is final markers only.
        assert_eq!(out.data.as_ref().unwrap().new_bytes, 0);
        assert_eq!(out.files[0].state, FileState::Kept);
        // The early data sent the whole file meanwhile: wasted.
        assert_eq!(early_wasted(&out).sent.new_bytes, 1_000_000);
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
        let replied = RTT + D + Duration::from_secs(12);
        assert_eq!(out.times.reply_sent, Some(replied));
        // Its keep-alives kept the sender (deadline 10.04 s without them, from the
        // `HelloAck`) waiting.
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

    /// The `Skip` of `with_skip`, among the messages toward the receiver: after `Hello`,
    /// `Manifest` and the early data's block values (9 blocks, in 3 messages).
    const SKIP: usize = 5;

    /// `three()` with `f0` on the receiver, another modification time: offered for hashing,
    /// so the set-up has a `Skip` (message [`SKIP`] toward the receiver), sent at the
    /// sender's outcome (two round trips).
    fn with_skip(fault: ControlFault) -> SessionScenario {
        let mut sc = with(fault);
        sc.disk
            .files
            .insert("f0".into(), OnDisk::Copy { mtime_ns: 1 });
        sc
    }

    /// No file of the receiver's changed (all `Absent`, or `Kept` for what it had).
    fn nothing_written(out: &SessionOutcome) {
        for f in &out.files {
            assert_ne!(f.state, FileState::Written, "{}: {out}", f.path);
        }
    }

    #[test]
    fn the_skip_comes_after_the_early_block_values() {
        let out = run_done(
            "with skip",
            &with_skip(fault(Side::Sender, 99, Fault::Drop)),
        );
        let early = out.early.as_ref().unwrap();
        assert_eq!((early.sent.hash_messages, early.sent.values), (3, 9));
        assert_eq!(SKIP, 2 + early.sent.hash_messages as usize);
        // The receiver, waiting for `Skip` since its decisions, dropped them all.
        assert_eq!(out.values_in_setup, 9);
        let data = out.data.as_ref().unwrap();
        assert_eq!((data.early_values, data.values_superseded), (0, 0));
        // Then d/f1 alone, under the next session id: its 2 blocks' values, in 1 message.
        assert_eq!(data.values_expected, 2);
        assert_eq!(out.to_receiver.get("BlockHashes"), Some(&4));
    }

    #[test]
    fn a_skip_before_the_manifest_fails_the_receiver() {
        let skip = Control::Skip { files: vec![] };
        let out = run(
            "skip before manifest",
            &with(fault(Side::Receiver, 1, Fault::Insert(skip))),
        );
        // It comes with the manifest, at one and a half round trips.
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            unexpected("Skip", "Manifest"),
        );
        // HelloAck (the early data left), then the abort.
        ended_with(
            &out,
            Side::Sender,
            2 * RTT,
            peer_aborted(AbortCause::Failed),
        );
        assert_eq!(out.to_sender.get("HelloAck"), Some(&1));
        assert_eq!(out.to_sender.get("Abort"), Some(&1));
        early_data_only(&out);
    }

    #[test]
    fn a_skip_before_the_manifest_reply_fails_the_sender() {
        let skip = Control::Skip { files: vec![0] };
        let out = run(
            "skip before reply",
            &with(fault(Side::Sender, 1, Fault::Insert(skip))),
        );
        ended_with(
            &out,
            Side::Sender,
            2 * RTT,
            unexpected("Skip", "ManifestReply"),
        );
        // The receiver had started its data phase at its decisions; it read the early data
        // and its block values, and had both files verified and in place before the abort.
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        early_data_only(&out);
        assert_eq!(written(&out), [true, true]);
    }

    #[test]
    fn a_second_hello_fails_the_receiver() {
        let out = run(
            "second hello",
            &with(fault(Side::Receiver, 0, Fault::Duplicate)),
        );
        ended_with(&out, Side::Receiver, D, unexpected("Hello", "Manifest"));
        // The abort comes right behind the `HelloAck`: no early datagram left.
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
        ended_with(&out, Side::Sender, 2 * RTT, |e| {
            matches!(e, SideError::Setup(SetupError::ReplyLength))
        });
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        // The receiver had verified both files from the early data meanwhile.
        early_data_only(&out);
        assert_eq!(written(&out), [true, true]);
    }

    #[test]
    fn a_skip_naming_a_file_not_offered_fails_the_receiver_before_it_reads_a_datagram() {
        // File 1 was offered as "send it": skipping it is not the sender's call.
        let skip = Control::Skip { files: vec![1] };
        let out = run(
            "skip not offered",
            &with_skip(fault(Side::Receiver, SKIP, Fault::Replace(skip))),
        );
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            |e| matches!(e, SideError::Setup(SetupError::SkipNotOffered { path }) if path == "d/f1"),
        );
        // The sender had started its data phase again from its outcome; it stops at the abort.
        ended_with(
            &out,
            Side::Sender,
            3 * RTT,
            peer_aborted(AbortCause::Failed),
        );
        assert_eq!(out.early.as_ref().unwrap().kept, Some(false));
        let data = out.data.as_ref().unwrap();
        assert!(data.datagrams_sent > 0);
        assert_eq!(
            data.rejected,
            Default::default(),
            "the receiver read nothing"
        );
        assert_eq!(data.link.delivered, 0);
        nothing_written(&out);
        // A file id that does not exist.
        let skip = Control::Skip { files: vec![7] };
        let out = run(
            "skip unknown",
            &with_skip(fault(Side::Receiver, SKIP, Fault::Replace(skip))),
        );
        ended_with(&out, Side::Receiver, 2 * RTT + D, |e| {
            matches!(e, SideError::Setup(SetupError::SkipUnknown(7)))
        });
        // A `Skip` where none is due (nothing was offered for hashing), right behind the
        // manifest: the receiver is in its data phase by then (it decided at the manifest),
        // where a set-up message has no place.
        let skip = Control::Skip { files: vec![] };
        let out = run(
            "skip not due",
            &with(fault(Side::Receiver, 2, Fault::Insert(skip))),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            |e| matches!(e, SideError::Unexpected { got } if got.name() == "Skip"),
        );
        nothing_written(&out);
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
        // To the receiver, in its data phase (since its decisions, at the manifest): right
        // before the first block values (the early data's, right behind the manifest).
        let out = run(
            "abort to receiver",
            &with(fault(
                Side::Receiver,
                2,
                Fault::Insert(abort(AbortCause::Refused, "disk full")),
            )),
        );
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            |e| matches!(e, SideError::PeerAborted { cause: AbortCause::Refused, reason } if reason == "disk full"),
        );
        ended_with(&out, Side::Sender, 2 * RTT, |e| {
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
        // Toward the receiver: Hello, Manifest, then block values (nothing is offered for
        // hashing: no Skip), from the early data's on.
        let clean = run_done("no abort", &sc);
        assert_eq!(clean.to_receiver.get("BlockHashes"), Some(&39));
        // Before the 20th block values of 39.
        sc.faults = vec![fault(Side::Receiver, 2 + 20, Fault::Insert(abort))];
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
        // Before the `ManifestReply`: the sender had started its early data.
        let out = run("oversized", &with(fault(Side::Sender, 1, Fault::Oversized)));
        ended_with(&out, Side::Sender, 2 * RTT, |e| {
            matches!(
                e,
                SideError::Frame(hurtle_proto::wire::FrameError::TooLong(_))
            )
        });
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        // The receiver had verified both files from the early data meanwhile.
        early_data_only(&out);
        assert_eq!(written(&out), [true, true]);
    }

    #[test]
    fn a_duplicated_message_fails_the_side_that_reads_it_twice() {
        // A second Skip: the receiver started its data phase at the first.
        let out = run(
            "skip twice",
            &with_skip(fault(Side::Receiver, SKIP, Fault::Duplicate)),
        );
        assert_eq!(out.times.receiver_ready, Some(2 * RTT + D));
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            |e| matches!(e, SideError::Unexpected { got } if got.name() == "Skip"),
        );
        ended_with(
            &out,
            Side::Sender,
            3 * RTT,
            peer_aborted(AbortCause::Failed),
        );
        nothing_written(&out);
        // A second HelloAck: the sender fails before its first early datagram.
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
        // Its manifest went before its abort: the receiver decides and starts its data phase,
        // then reads the abort.
        ended_with(
            &out,
            Side::Receiver,
            RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        no_data(&out);
        // A second ManifestReply, read right after the sender had its outcome (the early
        // data's: kept).
        let out = run(
            "reply twice",
            &with(fault(Side::Sender, 1, Fault::Duplicate)),
        );
        ended_with(
            &out,
            Side::Sender,
            2 * RTT,
            |e| matches!(e, SideError::Unexpected { got } if got.name() == "ManifestReply"),
        );
        assert_eq!(out.early.as_ref().unwrap().kept, Some(true));
        // The receiver was in its data phase since its decisions; then the abort.
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            peer_aborted(AbortCause::Failed),
        );
        // The early data's block values went as its blocks were read: the receiver had both
        // files verified and in place before the abort.
        assert_eq!(out.to_receiver.get("BlockHashes"), Some(&3));
        assert!(out.link.sent > 0);
        assert_eq!(written(&out), [true, true]);
    }

    /// No `Start` since version 9: the nearest case is a lost `Skip`, the last set-up message
    /// toward a receiver that offered files for hashing.
    #[test]
    fn a_lost_skip_is_found_by_the_next_message_or_the_deadline() {
        // Lost alone: the block values that follow it (the next session's: d/f1 again) are
        // not what a receiver waiting for `Skip` takes.
        let out = run(
            "skip lost",
            &with_skip(fault(Side::Receiver, SKIP, Fault::Drop)),
        );
        ended_with(
            &out,
            Side::Receiver,
            2 * RTT + D,
            unexpected("BlockHashes", "Skip"),
        );
        ended_with(
            &out,
            Side::Sender,
            3 * RTT,
            peer_aborted(AbortCause::Failed),
        );
        nothing_written(&out);
        // Lost with everything after it: the receiver waits out its deadline, from the last
        // message it read (the early data's last block values, dropped as it waited).
        let out = run(
            "skip and all after lost",
            &with_skip(fault(Side::Receiver, SKIP, Fault::Silence)),
        );
        // The early data's last block values reached it at 65.4 ms (they left as the last
        // early blocks were read, at 45.4 ms).
        let last = Duration::from_nanos(65_350_400);
        ended_with(&out, Side::Receiver, last + SETUP_TIMEOUT, |e| {
            matches!(e, SideError::Setup(SetupError::Timeout(_)))
        });
        ended_with(
            &out,
            Side::Sender,
            last + SETUP_TIMEOUT + D,
            peer_aborted(AbortCause::Network),
        );
        assert_eq!(out.values_in_setup, 9);
        // The sender sent everything (the early data, then d/f1 again); none of it was read.
        assert_eq!(out.early.as_ref().unwrap().sent.new_bytes, 120_000);
        let data = out.data.as_ref().unwrap();
        assert_eq!(data.new_bytes, 20_000);
        assert_eq!(data.link.delivered, 0);
        nothing_written(&out);
    }

    /// A lost manifest: the receiver waits for it, and its set-up machine restarts the wait at
    /// every message it reads, the early data's block values too.
    #[test]
    fn a_lost_manifest_times_the_set_up_out() {
        // Lost alone: the early data's block values that follow it (the last at 65.4 ms)
        // keep the receiver waiting past the sender's deadline (its `HelloAck` + 10 s), whose
        // abort ends it.
        let out = run(
            "manifest lost",
            &with(fault(Side::Receiver, 1, Fault::Drop)),
        );
        ended_with(&out, Side::Sender, RTT + SETUP_TIMEOUT, |e| {
            matches!(e, SideError::Setup(SetupError::Timeout(_)))
        });
        ended_with(
            &out,
            Side::Receiver,
            RTT + D + SETUP_TIMEOUT,
            peer_aborted(AbortCause::Network),
        );
        // The receiver's set-up machine took the early data's block values, for an outcome
        // that never came.
        assert_eq!(out.values_in_setup, 9);
        // The early data went (and its final markers again and again); none was read.
        early_data_only(&out);
        assert_eq!(out.link.delivered, 0);
        // Lost with everything after it: the receiver's deadline runs from the hello (and
        // `HelloAck`) at 20 ms.
        let out = run(
            "manifest and all after lost",
            &with(fault(Side::Receiver, 1, Fault::Silence)),
        );
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
        assert_eq!(out.values_in_setup, 0);
        early_data_only(&out);
        assert_eq!(out.link.delivered, 0);
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
        // hello (its abort too: without the `HelloAck` its manifest never goes).
        let out = silent(vec![
            fault(Side::Sender, 0, Fault::Silence),
            fault(Side::Receiver, 1, Fault::Silence),
        ]);
        assert_eq!(out.to_receiver.get("Manifest"), None);
        // The sender's deadline runs from its hello.
        ended_with(&out, Side::Sender, SETUP_TIMEOUT, timed_out);
        // The receiver's from its `HelloAck`, at 20 ms.
        ended_with(&out, Side::Receiver, D + SETUP_TIMEOUT, timed_out);
        no_data(&out);
    }

    #[test]
    fn silence_after_the_hello_ack_times_the_sender_out_and_its_abort_ends_the_receiver() {
        let out = silent(vec![fault(Side::Sender, 1, Fault::Silence)]);
        // The sender waits for `ManifestReply` from `HelloAck` (40 ms), its early data spent.
        ended_with(&out, Side::Sender, RTT + SETUP_TIMEOUT, timed_out);
        // The receiver, in its data phase since its decisions (60 ms) with nothing more to
        // wait for in the set-up, reads the sender's abort.
        assert_eq!(out.times.receiver_ready, Some(RTT + D));
        ended_with(
            &out,
            Side::Receiver,
            RTT + D + SETUP_TIMEOUT,
            peer_aborted(AbortCause::Network),
        );
        // The early data's block values went, but it stopped at its budget (2 MB of the 4 MiB
        // file): nothing written.
        early_data_only(&out);
        assert_eq!(written(&out), [false]);
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
                seq: 1,
                ranges: vec![(0, 10)],
                knew_us: 0
            }),
            Just(Control::Abort {
                cause: AbortCause::Failed,
                reason: "x".into()
            }),
        ]
    }

    fn any_fault() -> impl Strategy<Value = Fault> {
        fault_with(any_message().boxed())
    }

    /// Any fault, the inserted and replacing messages drawn from `messages`.
    pub(super) fn fault_with(messages: BoxedStrategy<Control>) -> impl Strategy<Value = Fault> {
        prop_oneof![
            messages.clone().prop_map(Fault::Insert),
            messages.prop_map(Fault::Replace),
            Just(Fault::Drop),
            Just(Fault::Duplicate),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(Fault::Garbage),
            Just(Fault::Oversized),
            Just(Fault::Silence),
        ]
    }

    /// A fault at one of the set-up's messages: toward the receiver `Hello`, `Manifest`, the
    /// early data's block values (two messages), `Skip` (with `hashing`, the sender's two
    /// keep-alives before it); toward the sender `HelloAck`, `ManifestReply`. (A `Start` was
    /// the last before version 9.)
    fn any_setup_fault(hashing: bool) -> impl Strategy<Value = ControlFault> {
        let to_receiver = if hashing { 7 } else { 5 };
        (any::<bool>(), 0usize..7, any_fault()).prop_map(move |(receiver, nth, fault)| {
            if receiver {
                ControlFault {
                    toward: Side::Receiver,
                    nth: nth % to_receiver,
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
        fn any_fault_in_the_set_up_ends_both_sides_cleanly(
            (f, hashing) in any::<bool>().prop_flat_map(|h| (any_setup_fault(h), Just(h)))
        ) {
            let mut sc = session(vec![
                SimEntry::file("f0", 40_000),
                SimEntry::dir("d"),
                SimEntry::file("d/f1", 3 * BLOCK),
            ]);
            sc.disk.files.insert("f0".into(), OnDisk::Copy { mtime_ns: 1 });
            sc.disk.parts.insert("d/f1".into(), PartFile { blocks: vec![(1, 2)], corrupt: vec![] });
            if hashing {
                // The sender hashes f0 for 2.5 s: its keep-alives are messages 4 and 5.
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

mod any_data_fault {
    use super::*;
    use hurtle_netsim::LinkConfig;
    use proptest::prelude::*;

    /// Messages a confused or hostile peer might send at any point of the data phase: each
    /// a real message of it, with values that are wrong for this session.
    fn any_message() -> impl Strategy<Value = Control> {
        prop_oneof![
            Just(Control::KeepAlive),
            Just(Control::Done),
            Just(Control::Fallback),
            Just(Control::UdpSilent { channels: vec![0] }),
            (0u16..6, 0u64..1_000_000).prop_map(|(channel, end)| Control::Nack {
                channel,
                seq: 1,
                ranges: vec![(0, end)],
                knew_us: 0,
            }),
            (0u16..6).prop_map(|channel| Control::ChannelDone { channel }),
            (0u32..4, any::<u8>()).prop_map(|(file, b)| Control::FileDone {
                file,
                hash: [b; 32]
            }),
            (any::<u32>(), 0u64..40, any::<u8>()).prop_map(|(session, block, b)| {
                Control::BlockHashes {
                    session,
                    blocks: vec![(block, [b; 32])],
                }
            }),
            (1u64..1_000, any::<u64>()).prop_map(|(seq, received)| Control::Report {
                seq,
                received,
                rejected: 0,
                socket_drops: 0,
                interval_us: 1,
                bytes: u64::MAX,
                datagrams: 1,
                lost: 1,
                drops: 0,
                queue_delay_us: u64::MAX,
                queue_fill: 1000,
                lateness_us: 0,
                disk_wait_us: 0,
                disk_fill: 0,
                train_kbps: 0,
            }),
            Just(Control::Abort {
                cause: AbortCause::Failed,
                reason: "x".into()
            }),
        ]
    }

    fn any_fault() -> impl Strategy<Value = Fault> {
        super::any_fault::fault_with(any_message().boxed())
    }

    /// Three files, one of them empty, over a path that loses 3% of datagrams: the data phase
    /// has block values, NACKs, channel ends, file confirmations and `Done` to hit.
    fn base() -> SessionScenario {
        let mut sc = session(vec![
            SimEntry::file("f0", 10 * BLOCK + 5),
            SimEntry::file("empty", 0),
            SimEntry::file("f2", 3 * BLOCK),
        ]);
        sc.data.link = LinkConfig::default().with_delay(D).with_loss(0.03);
        sc.data.max_virtual = Duration::from_secs(90);
        sc
    }

    #[test]
    fn the_base_is_done_with_messages_of_every_kind_in_its_data_phase() {
        let out = run_done("the data-fault base", &base());
        for kind in ["BlockHashes", "Done"] {
            assert!(out.to_receiver.contains_key(kind), "{kind}: {out}");
        }
        for kind in ["Nack", "ChannelDone", "FileDone"] {
            assert!(out.to_sender.contains_key(kind), "{kind}: {out}");
        }
        // The set-up's messages are the first 2 (toward the receiver: hello, manifest) and 2
        // (toward the sender: ack, reply); the faults below fall on the data phase's.
        assert!(out.to_receiver.values().sum::<u64>() > 6, "{out}");
        assert!(out.to_sender.values().sum::<u64>() > 8, "{out}");
    }

    /// A confirmation with a hash other than the root of the values the sender read ends the
    /// sender, wherever it comes: the receiver has other bytes (or is not the receiver).
    #[test]
    fn a_file_confirmed_with_another_hash_ends_the_sender() {
        for nth in 2..10 {
            let mut sc = base();
            sc.faults = vec![ControlFault {
                toward: Side::Sender,
                nth,
                fault: Fault::Insert(Control::FileDone {
                    file: 0,
                    hash: [9; 32],
                }),
            }];
            let out = run(&format!("a wrong FileDone at {nth}"), &sc);
            assert!(
                matches!(&out.sender.end, End::Failed(SideError::Data(why))
                    if why.contains("hash other than") || why.contains("before all of it")),
                "{nth}: {out}"
            );
            assert!(!matches!(out.receiver.end, End::Done), "{nth}: {out}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Whatever goes wrong at one message of the data phase, either way, the session ends
        /// on both sides (done, or with a typed error), never panics, never lands a wrong
        /// byte (the runner checks), and the receiver is done only after the sender is.
        #[test]
        fn any_fault_in_the_data_phase_ends_both_sides_cleanly(
            receiver in any::<bool>(),
            nth in 2usize..12,
            fault in any_fault(),
        ) {
            let mut sc = base();
            let f = ControlFault {
                toward: if receiver { Side::Receiver } else { Side::Sender },
                nth,
                fault,
            };
            sc.faults = vec![f.clone()];
            let out = sc.run().unwrap_or_else(|e| panic!("{f:?}: {e}"));
            prop_assert!(
                out.files.iter().all(|f| f.state != FileState::Written || f.equals_source),
                "{out}"
            );
            if matches!(out.receiver.end, End::Done) {
                prop_assert!(matches!(out.sender.end, End::Done), "{f:?}: {out}");
            }
            // The sender is done only when the receiver has every file, right.
            if matches!(out.sender.end, End::Done) {
                prop_assert!(
                    out.files.iter().all(|f| f.state == FileState::Written && f.equals_source),
                    "{f:?}: {out}"
                );
            }
            if out.is_done() {
                prop_assert!(out.files.iter().all(|f| f.equals_source), "{out}");
            }
        }
    }
}

mod move_to_tcp {
    use super::*;
    use hurtle_netsim::LinkConfig;

    /// A whole session whose UDP gets nowhere, with TCP data connections beside it: the
    /// receiver names the silent channels, the sender moves them, the receiver follows at
    /// `Fallback`, and the files arrive whole with nothing twice.
    #[test]
    fn a_session_whose_udp_is_blocked_moves_to_tcp_and_is_done() {
        let mut sc = session(vec![
            SimEntry::file("a", 40 * BLOCK),
            SimEntry::file("b", 0),
        ]);
        sc.data.link = LinkConfig::default().with_delay(D).with_loss(1.0);
        sc.data.fallback = Some(LinkConfig {
            rate_bps: Some(100_000_000),
            queue_bytes: 64 << 20,
            ..LinkConfig::default().with_delay(D)
        });
        let out = run_done("UDP blocked in a session", &sc);
        assert_eq!(out.to_sender.get("UdpSilent"), Some(&1));
        assert_eq!(out.to_receiver.get("Fallback"), Some(&1));
        let data = out.data.as_ref().unwrap();
        // The receiver starts its data phase at 60 ms and names the channels 300 ms later
        // (two passes of its channels on); the sender has it 20 ms after that.
        let moved = data.moved_to_tcp.expect("moved");
        assert!(moved >= ms(380) && moved <= ms(390), "{moved:?}");
        assert_eq!(data.duplicate_bytes, 0, "{out}");
        assert!(out.files.iter().all(|f| f.equals_source));
    }
}
