//! The data phase's rules, each side alone: messages in, what the machine says out.

use super::*;
use crate::hash::{block_value, BlockValue};
use crate::layout::Layout;
use crate::probe::SilenceWatch;
use crate::rate::{RateConfig, RateMode};
use crate::RateController;
use std::time::{Duration, Instant};

const BLOCK: u64 = 1024;
const STALL: Duration = Duration::from_secs(30);

/// Three files (3 blocks, empty, 1 block) over two channels, with their bytes.
fn layout() -> (Layout, Vec<Vec<u8>>) {
    let files: Vec<Vec<u8>> = vec![
        (0..3000).map(|i| (i % 251) as u8).collect(),
        vec![],
        vec![7; 100],
    ];
    let sizes: Vec<u64> = files.iter().map(|f| f.len() as u64).collect();
    (Layout::new(&sizes, BLOCK, 2).unwrap(), files)
}

fn value(l: &Layout, files: &[Vec<u8>], block: u64) -> BlockValue {
    let (f, r) = l.block_file_range(block).unwrap();
    let blocks = l.blocks_of(f);
    block_value(
        &files[f as usize][r.start as usize..r.end as usize],
        block - blocks.start,
        BLOCK,
        blocks.end - blocks.start,
    )
}

fn controller(now: Instant) -> RateController {
    RateController::new(
        RateConfig {
            mode: RateMode::Auto,
            ceiling_bps: 1_000_000_000,
            start_bps: 100_000_000,
            min_bps: 1_000_000,
            rtt: Duration::from_millis(100),
        },
        now,
    )
}

fn sender(path: DataPath, now: Instant) -> (SenderData, Layout, Vec<Vec<u8>>) {
    let (l, files) = layout();
    let mut s = SenderData::new(&l, (7, 2), &[None, None, None], (path, STALL), now);
    s.begin(now, Some(controller(now)));
    (s, l, files)
}

fn events(s: &mut SenderData) -> Vec<SenderDataEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn transmits(s: &mut SenderData) -> Vec<Control> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

fn report(seq: u64, received: u64) -> Control {
    Control::Report {
        seq,
        received,
        rejected: 2,
        socket_drops: 3,
        interval_us: 25_000,
        bytes: 100_000,
        datagrams: 80,
        lost: 0,
        drops: 0,
        queue_delay_us: 0,
        queue_fill: 0,
        lateness_us: 0,
        disk_wait_us: 0,
        disk_fill: 0,
        train_kbps: 0,
    }
}

// ----- sender -----

#[test]
fn a_file_is_confirmed_only_with_the_root_of_the_values_read() {
    let t0 = Instant::now();
    let (mut s, l, files) = sender(DataPath::Udp, t0);
    let root0 = *blake3::hash(&files[0]).as_bytes();
    // Before all its values were read: early.
    assert_eq!(
        s.handle(
            t0,
            Control::FileDone {
                file: 0,
                hash: root0
            }
        ),
        Err(DataError::EarlyConfirmation { file: 0 })
    );
    assert_eq!(s.on_block_value(t0, 0, value(&l, &files, 0), false), None);
    assert_eq!(s.on_block_value(t0, 1, value(&l, &files, 1), false), None);
    // The last value completes the file: the driver checks the source before sending it.
    assert_eq!(
        s.on_block_value(t0, 2, value(&l, &files, 2), false),
        Some(0)
    );
    // The values go in one message, under the data phase's session id.
    match transmits(&mut s).as_slice() {
        [Control::BlockHashes { session: 7, blocks }] => assert_eq!(blocks.len(), 3),
        other => panic!("{other:?}"),
    }
    // Another hash: the receiver has other bytes.
    assert_eq!(
        s.handle(
            t0,
            Control::FileDone {
                file: 0,
                hash: [1; 32]
            }
        ),
        Err(DataError::HashMismatch {
            file: 0,
            got: [1; 32],
            want: root0
        })
    );
    s.handle(
        t0,
        Control::FileDone {
            file: 0,
            hash: root0,
        },
    )
    .unwrap();
    assert_eq!(events(&mut s), [SenderDataEvent::FileConfirmed { file: 0 }]);
    // A second copy confirms nothing more.
    s.handle(
        t0,
        Control::FileDone {
            file: 0,
            hash: root0,
        },
    )
    .unwrap();
    assert!(events(&mut s).is_empty());
    // The empty file's root is known from the start; a file the layout lacks is never read.
    s.handle(
        t0,
        Control::FileDone {
            file: 1,
            hash: *blake3::hash(b"").as_bytes(),
        },
    )
    .unwrap();
    assert!(matches!(
        s.handle(
            t0,
            Control::FileDone {
                file: 9,
                hash: root0
            }
        ),
        Err(DataError::EarlyConfirmation { file: 9 })
    ));
    assert!(!s.is_done());
    s.on_block_value(t0, 3, value(&l, &files, 3), false);
    let root2 = *blake3::hash(&files[2]).as_bytes();
    s.handle(
        t0,
        Control::FileDone {
            file: 2,
            hash: root2,
        },
    )
    .unwrap();
    assert!(s.is_done());
    let (finish, _) = s.finish();
    assert_eq!(finish.hashes[0], root0);
    assert_eq!(finish.hashes[2], root2);
}

#[test]
fn skipped_files_are_confirmed_from_the_start() {
    let t0 = Instant::now();
    let l = Layout::new(&[0], BLOCK, 1).unwrap();
    let s = SenderData::new(&l, (1, 1), &[Some([5; 32])], (DataPath::Udp, STALL), t0);
    assert!(s.is_done());
    assert_eq!(s.finish().0.hashes, vec![[5; 32]]);
}

#[test]
fn many_values_go_in_messages_a_frame_can_carry() {
    let t0 = Instant::now();
    let l = Layout::new(&[(VALUES_PER_MESSAGE as u64 + 10) * BLOCK], BLOCK, 1).unwrap();
    let mut s = SenderData::new(&l, (1, 1), &[None], (DataPath::Udp, STALL), t0);
    for b in 0..l.total_blocks() {
        s.on_block_value(t0, b, [b as u8; 32], false);
    }
    let sizes: Vec<usize> = transmits(&mut s)
        .into_iter()
        .map(|m| match m {
            Control::BlockHashes { blocks, .. } => blocks.len(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, [VALUES_PER_MESSAGE, 10]);
}

#[test]
fn nacks_and_channel_ends_go_to_their_channel_once() {
    let t0 = Instant::now();
    let (mut s, ..) = sender(DataPath::Udp, t0);
    let nack = |seq| Control::Nack {
        channel: 1,
        seq,
        ranges: vec![(10, 20)],
        knew_us: 99,
    };
    s.handle(t0, nack(1)).unwrap();
    // The copy that came the other way.
    s.handle(t0, nack(1)).unwrap();
    // A channel the session does not have.
    s.handle(
        t0,
        Control::Nack {
            channel: 5,
            seq: 1,
            ranges: vec![(0, 1)],
            knew_us: 0,
        },
    )
    .unwrap();
    s.handle(t0, Control::ChannelDone { channel: 0 }).unwrap();
    assert_eq!(
        events(&mut s),
        [
            SenderDataEvent::Channel {
                channel: 1,
                cmd: ChannelCmd::Nack {
                    ranges: vec![(10, 20)],
                    knew_us: 99
                }
            },
            SenderDataEvent::Channel {
                channel: 0,
                cmd: ChannelCmd::Done
            },
        ]
    );
    assert_eq!(s.copies_dropped(), 1);
}

#[test]
fn reports_feed_the_controller_and_hold_off_the_stall() {
    let t0 = Instant::now();
    let (mut s, ..) = sender(DataPath::Udp, t0);
    let t1 = t0 + Duration::from_secs(20);
    s.handle(t1, report(1, 5000)).unwrap();
    match events(&mut s).as_slice() {
        [SenderDataEvent::Report { received: 5000, .. }] => {}
        other => panic!("{other:?}"),
    }
    // An older copy is dropped.
    s.handle(t1, report(1, 5000)).unwrap();
    assert!(events(&mut s).is_empty());
    // 30 s after the start, but 10 s after progress: no stall.
    s.handle_timeout(t0 + STALL + Duration::from_millis(1))
        .unwrap();
    // A report without progress does not hold it off.
    s.handle(t1 + Duration::from_secs(10), report(2, 5000))
        .unwrap();
    assert_eq!(
        s.handle_timeout(t1 + STALL + Duration::from_millis(1)),
        Err(DataError::Stalled { after: STALL })
    );
    let (finish, controller) = s.finish();
    assert_eq!((finish.rejected, finish.drops), (2, 3));
    assert_eq!(controller.unwrap().reports().len(), 2);
}

#[test]
fn hashing_what_the_receiver_holds_is_progress() {
    let t0 = Instant::now();
    let (mut s, l, files) = sender(DataPath::Udp, t0);
    let t1 = t0 + Duration::from_secs(29);
    s.on_block_value(t1, 0, value(&l, &files, 0), true);
    assert_eq!(
        s.handle_timeout(t0 + STALL + Duration::from_secs(1)),
        Ok(())
    );
    assert!(s
        .handle_timeout(t1 + STALL + Duration::from_secs(1))
        .is_err());
}

#[test]
fn keep_alives_and_the_silence_check_run_on_their_timers() {
    let t0 = Instant::now();
    let (mut s, ..) = sender(DataPath::Udp, t0);
    // The silence check first (a quarter of the round trip), then the keep-alive.
    assert_eq!(s.poll_timeout(), t0 + Duration::from_millis(25));
    s.handle_timeout(t0 + Duration::from_millis(25)).unwrap();
    assert!(transmits(&mut s).is_empty());
    let mut t = t0;
    let mut alive = 0;
    while t < t0 + Duration::from_secs(1) {
        t = s.poll_timeout();
        s.handle_timeout(t).unwrap();
        alive += transmits(&mut s)
            .iter()
            .filter(|m| matches!(m, Control::KeepAlive))
            .count();
    }
    assert_eq!(alive, 5, "one every {KEEP_ALIVE:?}");
    // The controller was asked at each check; with no report ever it has no model to fall
    // back to, and keeps its rate (its own tests cover the silence).
    assert!(events(&mut s).is_empty());
}

#[test]
fn silent_udp_moves_the_channels_once_where_the_session_may() {
    let t0 = Instant::now();
    let (mut s, ..) = sender(DataPath::UdpOrTcp, t0);
    s.handle(
        t0,
        Control::UdpSilent {
            channels: vec![0, 1],
        },
    )
    .unwrap();
    assert_eq!(
        events(&mut s),
        [SenderDataEvent::MoveToTcp {
            silent: vec![0, 1],
            why: "nothing reached the receiver on channels 0, 1".into()
        }]
    );
    // The receiver's word crossed the move.
    s.handle(t0, Control::UdpSilent { channels: vec![1] })
        .unwrap();
    assert!(events(&mut s).is_empty());
    s.moved_to_tcp(t0, None);
    assert_eq!(s.path(), DataPath::Tcp);
    assert_eq!(
        s.udp_blocked(0, 3),
        Err(DataError::UdpBlocked {
            channel: 0,
            secs: 3
        })
    );

    // A session that cannot move ends instead.
    let (mut s, ..) = sender(DataPath::Udp, t0);
    assert!(matches!(
        s.handle(t0, Control::UdpSilent { channels: vec![0] }),
        Err(DataError::Unexpected(_))
    ));
    assert_eq!(
        s.udp_blocked(1, 3),
        Err(DataError::UdpBlocked {
            channel: 1,
            secs: 3
        })
    );
    // Probes found it blocked where it may move: every channel goes.
    let (mut s, ..) = sender(DataPath::UdpOrTcp, t0);
    s.udp_blocked(1, 3).unwrap();
    match events(&mut s).as_slice() {
        [SenderDataEvent::MoveToTcp { silent, .. }] => assert_eq!(silent, &[0, 1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_message_of_another_phase_ends_the_sender() {
    let t0 = Instant::now();
    let (mut s, ..) = sender(DataPath::Udp, t0);
    for msg in [
        Control::Done,
        Control::Fallback,
        Control::Abort {
            cause: crate::wire::AbortCause::Failed,
            reason: "disk full".into(),
        },
    ] {
        assert!(matches!(s.handle(t0, msg), Err(DataError::Unexpected(_))));
    }
    s.handle(t0, Control::KeepAlive).unwrap();
    s.handle(
        t0,
        Control::ProbeAck {
            channel: 0,
            size: 1428,
        },
    )
    .unwrap();
    assert_eq!(
        events(&mut s),
        [SenderDataEvent::ProbeAck {
            channel: 0,
            size: 1428
        }]
    );
}

// ----- receiver -----

fn receiver(race: bool) -> (ReceiverData, Layout, Vec<Vec<u8>>) {
    let (l, files) = layout();
    let watch = race.then(|| SilenceWatch::new(Duration::from_millis(100)));
    let r = ReceiverData::new(
        &l,
        (7, 6),
        &[None, None, None],
        (watch, STALL),
        Instant::now(),
    );
    (r, l, files)
}

fn revents(r: &mut ReceiverData) -> Vec<ReceiverDataEvent> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

#[test]
fn verified_files_are_committed_then_confirmed_and_done_ends_it() {
    let t0 = Instant::now();
    let (mut r, l, files) = receiver(false);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    // The empty file is complete at once.
    let empty = *blake3::hash(b"").as_bytes();
    assert_eq!(
        revents(&mut r),
        [ReceiverDataEvent::Commit {
            file: 1,
            hash: empty
        }]
    );
    r.on_committed(1, empty);
    for b in 0..4 {
        r.on_block(b, value(&l, &files, b)).unwrap();
    }
    let blocks = (0..4).map(|b| (b, value(&l, &files, b))).collect();
    r.handle(t0, Control::BlockHashes { session: 7, blocks })
        .unwrap();
    let root0 = *blake3::hash(&files[0]).as_bytes();
    let root2 = *blake3::hash(&files[2]).as_bytes();
    assert_eq!(
        revents(&mut r),
        [
            ReceiverDataEvent::Verified {
                file: 0,
                index: 0,
                value: value(&l, &files, 0)
            },
            ReceiverDataEvent::Verified {
                file: 0,
                index: 1,
                value: value(&l, &files, 1)
            },
            ReceiverDataEvent::Commit {
                file: 0,
                hash: root0
            },
            ReceiverDataEvent::Commit {
                file: 2,
                hash: root2
            },
        ]
    );
    // `Done` while a file is still with the committer: it is waited for.
    r.on_committed(0, root0);
    r.handle(t0, Control::Done).unwrap();
    assert_eq!(revents(&mut r), [ReceiverDataEvent::Finish]);
    assert_eq!(r.finish(), Err(DataError::FinishedIncomplete { file: 2 }));
    r.on_committed(2, root2);
    assert_eq!(r.finish(), Ok(vec![root0, empty, root2]));
    // Each file was confirmed once it was in place.
    let confirmed: Vec<u32> = std::iter::from_fn(|| r.poll_transmit())
        .map(|m| match m {
            Control::FileDone { file, .. } => file,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(confirmed, [1, 0, 2]);
}

#[test]
fn kept_files_are_not_committed_and_held_values_wait_for_the_senders() {
    let t0 = Instant::now();
    let l = Layout::new(&[0, 0], BLOCK, 1).unwrap();
    let mut r = ReceiverData::new(&l, (1, 1), &[Some([3; 32]), None], (None, STALL), t0);
    r.start(t0, [], &[], &[0, 0]).unwrap();
    let empty = *blake3::hash(b"").as_bytes();
    assert_eq!(
        revents(&mut r),
        [ReceiverDataEvent::Commit {
            file: 1,
            hash: empty
        }]
    );

    let (mut r, l, files) = receiver(false);
    let held = [(0, value(&l, &files, 0)), (1, [0; 32])];
    // The early data's values come first: block 0's meets its held value.
    r.start(t0, [(0, value(&l, &files, 0))], &held, &[3000, 0, 100])
        .unwrap();
    let ev = revents(&mut r);
    assert_eq!(
        ev[0],
        ReceiverDataEvent::Verified {
            file: 0,
            index: 0,
            value: value(&l, &files, 0)
        }
    );
    // A held copy that was wrong is fetched again, on its channel.
    r.handle(
        t0,
        Control::BlockHashes {
            session: 7,
            blocks: vec![(1, value(&l, &files, 1))],
        },
    )
    .unwrap();
    let (ch, _) = l.block_stripe_range(1).unwrap();
    assert_eq!(
        revents(&mut r),
        [ReceiverDataEvent::Reject {
            channel: ch,
            block: 1
        }]
    );
    assert_eq!(r.rejected_blocks(), 1);
}

#[test]
fn a_block_that_keeps_failing_ends_the_session() {
    let t0 = Instant::now();
    let (mut r, l, files) = receiver(false);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    r.handle(
        t0,
        Control::BlockHashes {
            session: 7,
            blocks: vec![(3, value(&l, &files, 3))],
        },
    )
    .unwrap();
    let mut result = Ok(());
    for i in 0..crate::verify::MAX_BLOCK_FAILURES {
        result = r.on_block(3, [i + 1; 32]);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(
        result,
        Err(DataError::GaveUp {
            block: 3,
            file: Some(2)
        })
    );
}

#[test]
fn block_values_of_superseded_early_data_are_dropped_and_others_refused() {
    let t0 = Instant::now();
    let (mut r, ..) = receiver(false);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    revents(&mut r);
    r.handle(
        t0,
        Control::BlockHashes {
            session: 6,
            blocks: vec![(0, [1; 32])],
        },
    )
    .unwrap();
    assert!(revents(&mut r).is_empty());
    assert_eq!(r.waiting(), 0);
    assert_eq!(
        r.handle(
            t0,
            Control::BlockHashes {
                session: 8,
                blocks: vec![]
            }
        ),
        Err(DataError::WrongSession { session: 8 })
    );
}

#[test]
fn fallback_moves_the_channels_once_and_only_where_the_session_may() {
    let t0 = Instant::now();
    let (mut r, ..) = receiver(true);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    revents(&mut r);
    r.handle(t0, Control::Fallback).unwrap();
    assert_eq!(revents(&mut r), [ReceiverDataEvent::MoveToTcp]);
    assert!(r.moved());
    assert!(matches!(
        r.handle(t0, Control::Fallback),
        Err(DataError::Unexpected(_))
    ));
    let (mut r, ..) = receiver(false);
    assert!(matches!(
        r.handle(t0, Control::Fallback),
        Err(DataError::Unexpected(_))
    ));
}

#[test]
fn silent_channels_are_named_once_after_the_wait() {
    let t0 = Instant::now();
    let (mut r, ..) = receiver(true);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    let seen = |passes: u64| move |ch: u16| (ch == 0, passes);
    // Before the wait is over (the round trip, at least `SILENT_AFTER`): nothing.
    r.handle_timeout(t0 + Duration::from_millis(100), 2, seen(0))
        .unwrap();
    assert_eq!(r.poll_transmit(), None);
    // The wait is over: the threads' passes are noted; two passes later, channel 1 is silent.
    let t = t0 + Duration::from_millis(400);
    r.handle_timeout(t, 2, seen(0)).unwrap();
    assert_eq!(r.poll_transmit(), None);
    r.handle_timeout(t, 2, seen(2)).unwrap();
    assert_eq!(
        r.poll_transmit(),
        Some(Control::UdpSilent { channels: vec![1] })
    );
    r.handle_timeout(t + Duration::from_secs(1), 2, seen(9))
        .unwrap();
    assert_eq!(r.poll_transmit(), None);
}

#[test]
fn a_closed_connection_is_the_end_only_with_every_file_in_place() {
    let t0 = Instant::now();
    let (mut r, ..) = receiver(false);
    r.start(t0, [], &[], &[3000, 0, 100]).unwrap();
    assert_eq!(r.on_closed(), Err(DataError::PeerGone));
    let l = Layout::new(&[0], BLOCK, 1).unwrap();
    let mut r = ReceiverData::new(&l, (1, 1), &[Some([3; 32])], (None, STALL), t0);
    r.start(t0, [], &[], &[0]).unwrap();
    r.on_closed().unwrap();
    assert_eq!(revents(&mut r), [ReceiverDataEvent::Finish]);
}

#[test]
fn a_sender_silent_for_the_idle_time_ends_the_receiver() {
    let t0 = Instant::now();
    let l = Layout::new(&[100], BLOCK, 1).unwrap();
    let mut r = ReceiverData::new(&l, (1, 1), &[None], (None, STALL), t0);
    r.start(t0, [], &[], &[100]).unwrap();
    assert_eq!(r.poll_timeout(), t0 + STALL);
    // A keep-alive is enough.
    let t1 = t0 + Duration::from_secs(20);
    r.handle(t1, Control::KeepAlive).unwrap();
    r.handle_timeout(t0 + STALL + Duration::from_secs(1), 1, |_| (true, 0))
        .unwrap();
    assert_eq!(
        r.handle_timeout(t1 + STALL + Duration::from_millis(1), 1, |_| (true, 0)),
        Err(DataError::PeerSilent { after: STALL })
    );
}
