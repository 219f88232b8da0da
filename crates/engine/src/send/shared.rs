//! What the session loop and the channel threads share: the session's state ([`Shared`]:
//! layout, sources, rate and payload now, counters) and the messages between them
//! ([`ChanCmd`], [`ThreadCmd`], [`ChanEvent`]), one per block or per NACK, never per datagram.

use super::summary::Limits;
use super::value_cache::{CachedValues, ValueCache, ValueLog};
use crate::error::SessionError;
use crate::fs::SourceFile;
use crate::progress::Progress;
use hurtle_proto::rate::bottleneck::ReceiverSigns;
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
    /// Round-trip time measured at the handshake: how long a channel's tail is
    /// ([`hurtle_proto::fec::in_tail`]).
    pub(super) rtt: std::time::Duration,
    /// Parity for each UDP channel's tail ([`super::SendOptions::fec`]).
    pub(super) fec: bool,
    /// The random loss rate the controller sees, in parts per million (`u32::MAX`: not known
    /// yet): what a group's parity is sized for.
    pub(super) loss_ppm: std::sync::atomic::AtomicU32,
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
}

impl Shared {
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
