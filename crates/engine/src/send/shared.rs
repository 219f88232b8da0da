//! What the session loop and the channel threads share: the session's state ([`Shared`]:
//! layout, sources, rate and payload now, counters) and the messages between them
//! ([`ChanCmd`], [`ThreadCmd`], [`ChanEvent`]), one per block or per NACK, never per datagram.
//! A channel thread's events wait for the session loop's next wake-up, and wake it only when
//! they must not wait ([`LoopWake`], [`value_wakes_loop`]).

use super::summary::Limits;
use super::value_cache::{CachedValues, ValueCache, ValueLog};
use crate::error::SessionError;
use crate::fs::SourceFile;
use crate::net::bell::Bell;
use crate::progress::Progress;
use crossbeam_channel::Sender;
use hurtle_proto::rate::bottleneck::ReceiverSigns;
use hurtle_proto::rate::{initial_rate, RateController};
use hurtle_proto::Layout;
use std::sync::atomic::{AtomicU16, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// What the session loop tells a channel.
pub(super) enum ChanCmd {
    /// Ranges to send again, and the NACK's `knew_us` (what it knew of).
    Nack(Vec<(u64, u64)>, u32),
    Done,
    /// A direct path to the receiver's socket was punched: datagrams go there from now on.
    Redirect(std::net::SocketAddr),
}

/// What the session loop tells a channel thread.
pub(super) enum ThreadCmd {
    /// For one of its channels.
    Channel(u16, ChanCmd),
    /// The session is over.
    Stop,
}

pub(super) enum ChanEvent {
    /// A block was read for the first time, with its value; `held`: one the receiver already
    /// has, read only to be hashed.
    Block {
        block: u64,
        value: [u8; 32],
        held: bool,
    },
    Failed(SessionError),
}

/// The session loop's wake-up for the channel threads' events ([`ChanEvent`]). The loop does
/// not wait on the events themselves: it takes all that are queued whenever it wakes (for a
/// report, a message, a timer), and a channel thread wakes it only for an event that must not
/// wait ([`value_wakes_loop`]; a failure always). Waking the loop for every block's value cost
/// a futex wake and two context switches per block, and the values then went to the receiver
/// one `BlockHashes` (and one wake-up of the control writer) each. The bell is the one the
/// loop polls beside the feedback sockets, which the control connection's reader rings too
/// ([`crate::net::bell`]).
pub(super) struct LoopWake {
    bell: Arc<Bell>,
}

impl LoopWake {
    /// Wakes through `bell`.
    pub(super) fn new(bell: Arc<Bell>) -> LoopWake {
        LoopWake { bell }
    }

    /// Wakes the session loop (at once if it waits; at its next wait if it does not).
    pub(super) fn wake(&self) {
        self.bell.ring();
    }

    /// What the session loop waits on (and answers when it wakes).
    pub(super) fn bell(&self) -> &Bell {
        &self.bell
    }
}

/// The most block values that wait for the session loop's next wake-up: a channel thread that
/// queues one more wakes it (resumed blocks' values come many at a time).
pub(super) const VALUES_PER_WAKE: usize = 16;

/// True when a channel thread that has just queued `block`'s value, with `queued` events now
/// waiting for the session loop, is to wake the loop: the block is its file's last (the file
/// can be finished only once the loop has passed on all its values), or [`VALUES_PER_WAKE`]
/// wait. Any other value goes at the loop's next wake-up, which comes with the next report
/// while data flows (every 256 datagrams or 10-30 ms on a short path), and within
/// the loop's 200 ms tick otherwise; a block's value goes before its data anyway (it is
/// hashed when its first datagram is sent), so the receiver rarely has a block's bytes
/// without its value for long.
pub(super) fn value_wakes_loop(layout: &Layout, block: u64, queued: usize) -> bool {
    if queued >= VALUES_PER_WAKE {
        return true;
    }
    match layout.file_of_block(block) {
        Some((file, _)) => layout.blocks_of(file).end == block + 1,
        None => true,
    }
}

pub(super) struct Shared {
    pub(super) layout: Layout,
    pub(super) sources: Vec<SourceFile>,
    pub(super) session: u32,
    /// Payload bytes per data datagram now: probing may move it while data flows.
    pub(super) payload: AtomicU16,
    /// The most `payload` can become: what buffers are sized for.
    /// (Raised only while no channel thread runs: when the channels move to TCP.)
    pub(super) max_payload: AtomicU16,
    pub(super) start: Instant,
    pub(super) progress: Arc<Progress>,
    /// Current pacing rate for all channels together, bits per second.
    pub(super) rate_bps: AtomicU64,
    /// The most `rate_bps` can become (the controller's ceiling): what the channel threads are
    /// counted for ([`super::channel_threads::send_threads`]).
    pub(super) rate_ceiling_bps: u64,
    /// The least first rate (the user's start rate): with the payload, what the first rate is
    /// at a round trip found shorter before the first report
    /// ([`hurtle_proto::rate::initial_rate`], [`hurtle_proto::rate::RateController::raise_start`]).
    pub(super) start_floor_bps: u64,
    pub(super) channels: u16,
    /// When the first data datagram left, microseconds after `start` (`u64::MAX`: not yet).
    pub(super) first_data_us: AtomicU64,
    /// When the last channel to do so had sent all its new data once, microseconds after
    /// `start` (0: not yet).
    pub(super) new_data_sent_us: AtomicU64,
    /// Bytes of data the channels may still send before the receiver's decisions (the early
    /// data's budget); `u64::MAX` once the outcome is known.
    pub(super) early_left: AtomicU64,
    /// Channels with new data still to send: the session's rate is shared among them (a
    /// channel whose stripe is sent, or that has none, as a file smaller than a block per
    /// channel leaves some, does not keep its share idle).
    pub(super) sending: std::sync::atomic::AtomicU16,
    /// What the live bottleneck is judged against; `None` over parallel TCP, which paces
    /// itself (nor is it judged once the channels moved to TCP).
    pub(super) limits: Option<Limits>,
    /// What the receiver's reports said of its CPU and its disk.
    pub(super) receiver_signs: std::sync::Mutex<ReceiverSigns>,
    /// The path's round trip, microseconds ([`Shared::rtt`]): how long a channel's tail is
    /// ([`hurtle_proto::fec::in_tail`]) and how long its trains may be.
    pub(super) rtt_us: AtomicU64,
    /// Parity for each UDP channel's tail ([`super::SendOptions::fec`]).
    pub(super) fec: bool,
    /// The random loss rate the controller sees, in parts per million (`u32::MAX`: not known
    /// yet): what a group's parity is sized for.
    pub(super) loss_ppm: std::sync::atomic::AtomicU32,
    /// The path has lost nothing in this transfer so far
    /// ([`hurtle_proto::rate::RateController::lost_nothing`]): the tails go without parity.
    pub(super) lost_nothing: std::sync::atomic::AtomicBool,
    /// The most missed time the channels' pacers repay, microseconds: the controller's
    /// [`hurtle_proto::rate::RateController::catch_up`].
    pub(super) catch_up_us: AtomicU64,
    /// The bytes each channel sends back to back at least, while the controller wants long
    /// trains (its [`hurtle_proto::rate::RateController::train_bytes`]; 0: the usual sends).
    pub(super) train_bytes: AtomicU64,
    /// The queueing delay of the receiver's latest report, microseconds: the channel threads
    /// send shorter trains while it is high (`channel_threads::train_span`).
    pub(super) queue_delay_us: AtomicU64,
    /// Where block values are kept between sessions (`None`: nowhere).
    pub(super) value_cache: Option<ValueCache>,
    /// Per source, what the cache held for it, loaded when its first resumed block is valued.
    pub(super) cached: Vec<OnceLock<Option<CachedValues>>>,
    /// The values passed on so far, kept in the cache if the session ends before their file.
    pub(super) values: Mutex<ValueLog>,
    /// Resumed blocks valued from the cache, and by reading them.
    pub(super) resume_cached: AtomicU64,
    pub(super) resume_read: AtomicU64,
    /// Wakes the session loop for the channel threads' events that must not wait.
    pub(super) loop_wake: LoopWake,
}

impl Shared {
    /// The path's round trip as the channel threads use it: the key agreement's timing at
    /// the start, lowered to the controller's ([`hurtle_proto::rate::rtt::PathRtt`]) once a
    /// probe's answer shows the path's ([`Shared::lower_rtt`]).
    pub(super) fn rtt(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.rtt_us.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The controller's round trip fell to `rtt` (a [`hurtle_proto::rate::rtt::PathRtt`]
    /// estimate: never below the kernel's floor). Only ever lowers it.
    pub(super) fn lower_rtt(&self, rtt: std::time::Duration) {
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1);
        self.rtt_us
            .fetch_min(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// Raises `controller`'s first rate to the initial window at its round trip and the
    /// payload now, if that is more and no report came yet ([`RateController::raise_start`]:
    /// a round trip found shorter, a payload found larger), and passes it on to the channel
    /// threads.
    /// Returns the rate it set, if it did.
    pub(super) fn raise_start(&self, controller: &mut RateController) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let payload = self.payload.load(Relaxed);
        let window = initial_rate(self.start_floor_bps, payload, controller.config().rtt);
        let raised = controller.raise_start(std::time::Instant::now(), window)?;
        self.set_rate(raised);
        self.train_bytes.store(controller.train_bytes(), Relaxed);
        Some(raised)
    }

    /// Paces the channels, and shows on the progress line, `rate_bps`.
    pub(super) fn set_rate(&self, rate_bps: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.rate_bps.store(rate_bps, Relaxed);
        self.progress.rate_bps.store(rate_bps, Relaxed);
    }

    /// Queues a channel thread's `event` for the session loop, and wakes the loop if it must
    /// not wait ([`value_wakes_loop`]; a failure always). False when the loop has gone.
    pub(super) fn to_loop(&self, events: &Sender<ChanEvent>, event: ChanEvent) -> bool {
        let wake = match &event {
            ChanEvent::Block { block, .. } => {
                value_wakes_loop(&self.layout, *block, events.len() + 1)
            }
            ChanEvent::Failed(_) => true,
        };
        let sent = events.send(event).is_ok();
        if wake {
            self.loop_wake.wake();
        }
        sent
    }

    /// The cached value of held `block`, if the cache has one for its source as it is now
    /// (see [`super::value_cache`]).
    pub(super) fn cached_value(&self, block: u64) -> Option<[u8; 32]> {
        let cache = self.value_cache.as_ref()?;
        let (file, index) = self.layout.file_of_block(block)?;
        if !self.cacheable(file) {
            return None;
        }
        let source = self.sources.get(file as usize)?;
        self.cached
            .get(file as usize)?
            .get_or_init(|| cache.load(source, self.layout.block_size()))
            .as_ref()?
            .get(index)
    }

    /// Notes a value passed on for `block`, for the cache.
    pub(super) fn note_value(&self, block: u64, value: [u8; 32]) {
        if self.value_cache.is_none() {
            return;
        }
        if let Some((file, index)) = self.layout.file_of_block(block) {
            if self.cacheable(file) {
                self.value_log().note(file, index, value);
            }
        }
    }

    /// True when `file` is large enough for its values to be kept in the cache
    /// ([`super::value_cache::MIN_BLOCKS`]).
    pub(super) fn cacheable(&self, file: u32) -> bool {
        let blocks = self.layout.blocks_of(file);
        blocks.end - blocks.start >= super::value_cache::MIN_BLOCKS
    }

    /// The values passed on so far.
    pub(super) fn value_log(&self) -> std::sync::MutexGuard<'_, ValueLog> {
        self.values.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the values of the files left unfinished in the cache, if there is one and
    /// anything new; returns an error to log, if keeping failed (a transfer never fails for
    /// it).
    pub(super) fn keep_values(&self) -> Option<String> {
        let cache = self.value_cache.as_ref()?;
        let mut log = self.value_log();
        if !log.is_dirty() {
            return None;
        }
        let (_, err) = log.keep(cache, &self.sources, self.layout.block_size());
        err.map(|e| e.to_string())
    }

    /// What the receiver's reports said of its CPU and its disk so far.
    pub(super) fn signs(&self) -> ReceiverSigns {
        *self
            .receiver_signs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_files_last_value_wakes_the_loop_and_others_wait() {
        // Files of 3 blocks, 1 block and 2.5 blocks: blocks 0-2, 3, 4-6.
        let layout = Layout::new(&[3 * MIB, MIB, 5 * MIB / 2], MIB, 2).unwrap();
        let wakes: Vec<u64> = (0..7)
            .filter(|&b| value_wakes_loop(&layout, b, 1))
            .collect();
        assert_eq!(wakes, vec![2, 3, 6]);
        // A block outside the layout (never sent) does not wait either.
        assert!(value_wakes_loop(&layout, 7, 1));
    }

    #[test]
    fn many_queued_values_wake_the_loop() {
        let layout = Layout::new(&[64 * MIB], MIB, 2).unwrap();
        assert!(!value_wakes_loop(&layout, 5, VALUES_PER_WAKE - 1));
        assert!(value_wakes_loop(&layout, 5, VALUES_PER_WAKE));
    }

    #[test]
    fn a_wake_up_waits_for_the_loop_and_wakes_it_once() {
        use crate::net::udp::wait_readable;
        let wake = LoopWake::new(Arc::new(Bell::new().unwrap()));
        let rung = |w: &LoopWake| {
            wait_readable([Some(w.bell().fd())], std::time::Duration::ZERO).unwrap() & 1 != 0
        };
        assert!(!rung(&wake));
        wake.wake();
        wake.wake();
        assert!(rung(&wake));
        wake.bell().answer();
        assert!(!rung(&wake), "two wake-ups woke the loop twice");
    }
}
