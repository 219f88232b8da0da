//! The receiver's data phase ([`ReceiverData`]): block values met and judged, verified files
//! to the committer and their `FileDone` once in place, blocks that fail back to their
//! channels, the silent-UDP watch and the move to TCP, and the end at `Done`.

use super::DataError;
use crate::hash::BlockValue;
use crate::layout::Layout;
use crate::probe::SilenceWatch;
use crate::verify::{Verdict, Verifier};
use crate::wire::Control;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the receiver's driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverDataEvent {
    /// A block is written and verified: a resume can start from it (its file's journal).
    Verified {
        /// The file.
        file: u32,
        /// The block's index within the file.
        index: u64,
        /// Its value, as verified (what the journal vouches for).
        value: BlockValue,
    },
    /// Every block of `file` is verified: seal it, put it in place, then
    /// [`ReceiverData::on_committed`].
    Commit {
        /// The file.
        file: u32,
        /// Its BLAKE3 root.
        hash: [u8; 32],
    },
    /// A block failed verification: its channel must take it again.
    Reject {
        /// The channel whose stripe holds it.
        channel: u16,
        /// The block.
        block: u64,
    },
    /// The sender moves every channel to its TCP data connection now (`Fallback`): take the
    /// connections and hand each channel its own.
    MoveToTcp,
    /// The sender is done: wait for the committer to put in place every file it was given
    /// (each [`ReceiverData::on_committed`]), then [`ReceiverData::finish`].
    Finish,
}

/// The receiver's data phase (see the module docs of [`super`]).
#[derive(Debug)]
pub struct ReceiverData {
    layout: Layout,
    verifier: Verifier,
    session: u32,
    early_session: u32,
    /// Each file's hash once it is in place (or the receiver's own copy is kept).
    committed: Vec<Option<[u8; 32]>>,
    /// The watch for silent UDP, in a session that may still move to TCP.
    race: Option<SilenceWatch>,
    moved: bool,
    /// Blocks rejected so far.
    rejected_blocks: u64,
    /// Data comes in the clear ([`ReceiverData::set_in_the_clear`]).
    in_the_clear: bool,
    /// The sender may be silent this long (its keep-alives come every 200 ms).
    idle: Duration,
    last_heard: Instant,
    transmits: VecDeque<Control>,
    events: VecDeque<ReceiverDataEvent>,
}

impl ReceiverData {
    /// The data phase of `layout` under `session` (`early_session`: the hello's, whose block
    /// values are dropped when the data phase superseded the early data; equal to `session`
    /// when it did not). `kept` has the hash of each file the receiver keeps its own copy of.
    /// `race`: the watch for silent UDP, in a session that may move to TCP. The sender may be
    /// silent on the control connection for `idle`, from `now` on.
    pub fn new(
        layout: &Layout,
        (session, early_session): (u32, u32),
        kept: &[Option<[u8; 32]>],
        (race, idle): (Option<SilenceWatch>, Duration),
        now: Instant,
    ) -> ReceiverData {
        ReceiverData {
            layout: layout.clone(),
            verifier: Verifier::new(layout),
            session,
            early_session,
            committed: kept.to_vec(),
            race,
            moved: false,
            rejected_blocks: 0,
            in_the_clear: false,
            idle,
            last_heard: now,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Data comes in the clear (`--no-encryption` on both sides): datagrams are not
    /// authenticated, so a block that keeps failing verification may be an attacker's
    /// injection: it is fetched again up to the limit, and then the error says so
    /// ([`DataError::GaveUpInTheClear`]), never that the source changed.
    pub fn set_in_the_clear(&mut self) {
        self.in_the_clear = true;
        self.verifier.set_unauthenticated();
    }

    /// The data phase starts at `now`: the early data's values that came during the set-up
    /// (`early_values`) are taken, then the values the receiver hashed from the blocks it
    /// resumed (`held`), which wait for the sender's; the empty files are complete at once.
    /// `sizes` has every file's size.
    pub fn start(
        &mut self,
        now: Instant,
        early_values: impl IntoIterator<Item = (u64, BlockValue)>,
        held: &[(u64, BlockValue)],
        sizes: &[u64],
    ) -> Result<(), DataError> {
        for (block, value) in early_values {
            let v = self.verifier.on_expected(block, value);
            self.judge(block, v)?;
        }
        for &(block, value) in held {
            let v = self.verifier.on_received(block, value);
            self.judge(block, v)?;
        }
        if let Some(watch) = self.race.as_mut() {
            watch.start(now);
        }
        for (f, &size) in sizes.iter().enumerate() {
            if size == 0 && self.committed.get(f).is_some_and(Option::is_none) {
                self.events.push_back(ReceiverDataEvent::Commit {
                    file: f as u32,
                    hash: *blake3::hash(b"").as_bytes(),
                });
            }
        }
        Ok(())
    }

    /// The value the receiver hashed over a block it has whole.
    pub fn on_block(&mut self, block: u64, value: BlockValue) -> Result<(), DataError> {
        let v = self.verifier.on_received(block, value);
        self.judge(block, v)
    }

    /// A control message from the sender, at `now`.
    pub fn handle(&mut self, now: Instant, msg: Control) -> Result<(), DataError> {
        self.last_heard = now;
        match msg {
            Control::BlockHashes { session, blocks } if session == self.session => {
                for (block, value) in blocks {
                    let v = self.verifier.on_expected(block, value);
                    self.judge(block, v)?;
                }
            }
            // The values of superseded early data: its blocks were of another layout.
            Control::BlockHashes { session, .. } if session == self.early_session => {}
            Control::BlockHashes { session, .. } => {
                return Err(DataError::WrongSession { session })
            }
            Control::KeepAlive => {}
            // UDP does not get through (we said so, or the sender's probes found it): the
            // channels go on over TCP, once.
            Control::Fallback if self.race.is_some() => {
                self.race = None;
                self.moved = true;
                self.events.push_back(ReceiverDataEvent::MoveToTcp);
            }
            Control::Done => self.events.push_back(ReceiverDataEvent::Finish),
            other => return Err(DataError::Unexpected(Box::new(other))),
        }
        Ok(())
    }

    /// The sender closed the control connection. It ends as soon as every file is confirmed,
    /// and its `Done` can be lost to a reset of the connection (a report of ours reaching its
    /// closed socket): with every file in place, this is the end it said.
    pub fn on_closed(&mut self) -> Result<(), DataError> {
        if self.committed.iter().all(Option::is_some) {
            self.events.push_back(ReceiverDataEvent::Finish);
            Ok(())
        } else {
            Err(DataError::PeerGone)
        }
    }

    /// `file` is in place with `hash`: the sender is told.
    pub fn on_committed(&mut self, file: u32, hash: [u8; 32]) {
        if let Some(slot) = self.committed.get_mut(file as usize) {
            *slot = Some(hash);
            self.transmits.push_back(Control::FileDone { file, hash });
        }
    }

    /// Timers due at `now`: the silent-UDP watch, which needs `seen(ch)`: whether anything
    /// arrived on channel `ch`, and how many passes its thread has made over its socket; and
    /// the sender's silence on the control connection, which ends the session.
    pub fn handle_timeout(
        &mut self,
        now: Instant,
        channels: u16,
        seen: impl Fn(u16) -> (bool, u64),
    ) -> Result<(), DataError> {
        if let Some(silent) = self.race.as_mut().and_then(|w| w.poll(now, channels, seen)) {
            self.transmits
                .push_back(Control::UdpSilent { channels: silent });
        }
        if now.saturating_duration_since(self.last_heard) > self.idle {
            return Err(DataError::PeerSilent { after: self.idle });
        }
        Ok(())
    }

    /// When [`ReceiverData::handle_timeout`] must be called at the latest (the silent-UDP
    /// watch wants calls as often as the driver's tick, while it waits).
    pub fn poll_timeout(&self) -> Instant {
        let idle = self.last_heard + self.idle;
        match self.race.as_ref().and_then(SilenceWatch::next_check) {
            Some(check) => check.min(idle),
            None => idle,
        }
    }

    /// The next control message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.transmits.pop_front()
    }

    /// The next thing the driver must do.
    pub fn poll_event(&mut self) -> Option<ReceiverDataEvent> {
        self.events.pop_front()
    }

    /// The channels moved to TCP.
    pub fn moved(&self) -> bool {
        self.moved
    }

    /// Blocks whose two values have not met yet.
    pub fn waiting(&self) -> usize {
        self.verifier.waiting()
    }

    /// Blocks that failed verification so far.
    pub fn rejected_blocks(&self) -> u64 {
        self.rejected_blocks
    }

    /// Each file's hash once in place, so far.
    pub fn committed(&self) -> &[Option<[u8; 32]>] {
        &self.committed
    }

    /// The end, after [`ReceiverDataEvent::Finish`] and every commit: each file's hash, or the
    /// first file not in place.
    pub fn finish(&self) -> Result<Vec<[u8; 32]>, DataError> {
        if let Some(f) = self.committed.iter().position(Option::is_none) {
            return Err(DataError::FinishedIncomplete { file: f as u32 });
        }
        Ok(self
            .committed
            .iter()
            .map(|h| h.unwrap_or_default())
            .collect())
    }

    fn judge(&mut self, block: u64, v: Verdict) -> Result<(), DataError> {
        match v {
            Verdict::Pending => {}
            Verdict::Verified => {
                let value = self.verifier.verified_value(block);
                if let (Some((file, index)), Some(&value)) =
                    (self.layout.file_of_block(block), value)
                {
                    self.events
                        .push_back(ReceiverDataEvent::Verified { file, index, value });
                }
            }
            Verdict::FileComplete { file, hash } => {
                self.events
                    .push_back(ReceiverDataEvent::Commit { file, hash });
            }
            Verdict::Mismatch { block } => {
                self.rejected_blocks += 1;
                if let Some((channel, _)) = self.layout.block_stripe_range(block) {
                    self.events
                        .push_back(ReceiverDataEvent::Reject { channel, block });
                }
            }
            Verdict::GiveUp { block } => {
                let file = self.layout.file_of_block(block).map(|(f, _)| f);
                return Err(if self.in_the_clear {
                    DataError::GaveUpInTheClear { block, file }
                } else {
                    DataError::GaveUp { block, file }
                });
            }
        }
        Ok(())
    }
}
