//! The sender's data phase ([`SenderData`]): block values out, the receiver's NACKs to the
//! channels, its reports to the rate controller, its confirmations checked, the move to TCP,
//! keep-alives and the stall timer.

use super::{DataError, DataPath};
use crate::feedback::Dedup;
use crate::hash::BlockValue;
use crate::layout::Layout;
use crate::rate::{Feedback, RateChange, RateController, RateMode};
use crate::verify::BlockTable;
use crate::wire::Control;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most block values in one `BlockHashes` (40 bytes each: well inside a frame).
pub const VALUES_PER_MESSAGE: usize = 8192;

/// How often the sender sends a keep-alive in the data phase.
pub const KEEP_ALIVE: Duration = Duration::from_millis(200);

/// What a channel must do, from the receiver's word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelCmd {
    /// Send these stripe ranges again; `knew_us` is the stamp of the newest datagram the
    /// receiver had taken on the channel when it asked ([`crate::wire::sent_at`]).
    Nack {
        /// Half-open stripe ranges.
        ranges: Vec<(u64, u64)>,
        /// What the NACK knew of.
        knew_us: u32,
    },
    /// The receiver has every byte of the channel's stripe.
    Done,
}

/// What the sender's driver must act on.
#[derive(Debug, Clone, PartialEq)]
pub enum SenderDataEvent {
    /// A command for one channel.
    Channel {
        /// The channel.
        channel: u16,
        /// What it must do.
        cmd: ChannelCmd,
    },
    /// The receiver has this file in place, with the hash the sender read.
    FileConfirmed {
        /// The file.
        file: u32,
    },
    /// A report of the receiver's, as the controller took it: the driver logs it and paces to
    /// the controller's rate (`change` says whether it moved).
    Report {
        /// The report.
        feedback: Feedback,
        /// Bytes the receiver has taken so far.
        received: u64,
        /// The controller's change, if any.
        change: Option<RateChange>,
    },
    /// No report came for a while and the controller slowed down.
    Silence {
        /// The change.
        change: RateChange,
    },
    /// The receiver answered a probe of a payload size on a channel.
    ProbeAck {
        /// The channel.
        channel: u16,
        /// The payload size.
        size: u16,
    },
    /// UDP does not get through: these channels reached the receiver with nothing, and every
    /// channel moves to its TCP connection now ([`SenderData::moved_to_tcp`] when done).
    MoveToTcp {
        /// The silent channels (every channel when the probes found UDP blocked).
        silent: Vec<u16>,
        /// How it was found.
        why: String,
    },
}

/// The sender's data phase (see the module docs of [`super`]).
#[derive(Debug)]
pub struct SenderData {
    session: u32,
    channels: u16,
    table: BlockTable,
    /// Each file's confirmed hash (the skipped files' from the start).
    confirmed: Vec<Option<[u8; 32]>>,
    left: usize,
    /// The receiver's counts from its latest report.
    rejected: u64,
    drops: u64,
    received: u64,
    last_progress: Instant,
    stall: Duration,
    dedup: Dedup,
    controller: Option<RateController>,
    path: DataPath,
    next_keep_alive: Instant,
    next_silence: Instant,
    /// Block values not yet in a `BlockHashes`.
    values: Vec<(u64, BlockValue)>,
    transmits: VecDeque<Control>,
    events: VecDeque<SenderDataEvent>,
}

/// What the data phase ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderFinish {
    /// Every file's confirmed hash (zero for a skipped file whose hash was never read).
    pub hashes: Vec<[u8; 32]>,
    /// Datagrams the receiver rejected.
    pub rejected: u64,
    /// Datagrams its sockets dropped.
    pub drops: u64,
}

impl SenderData {
    /// The data phase of `layout` under `session`, on `path`, with `channels` channels;
    /// `skipped` has the hash of each file the receiver already has (confirmed from the
    /// start). It gives up after `stall` without progress. Made at the start of the early
    /// data, during the set-up, it takes block values ([`SenderData::on_block_value`]); the
    /// rest waits for [`SenderData::begin`].
    pub fn new(
        layout: &Layout,
        (session, channels): (u32, u16),
        skipped: &[Option<[u8; 32]>],
        (path, stall): (DataPath, Duration),
        now: Instant,
    ) -> SenderData {
        let confirmed = skipped.to_vec();
        SenderData {
            session,
            channels,
            table: BlockTable::new(layout),
            left: confirmed.iter().filter(|c| c.is_none()).count(),
            confirmed,
            rejected: 0,
            drops: 0,
            received: 0,
            last_progress: now,
            stall,
            dedup: Dedup::new(),
            controller: None,
            path,
            next_keep_alive: now + KEEP_ALIVE,
            next_silence: now,
            values: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The data phase begins at `now`, paced by `controller` (none: at a fixed pace the driver
    /// keeps): the stall timer, keep-alives and the silence check run from here.
    pub fn begin(&mut self, now: Instant, controller: Option<RateController>) {
        self.controller = controller;
        self.restart_timers(now);
    }

    /// A block's value, read for the first time (`held`: hashed from what the receiver already
    /// holds, which is progress too). It goes to the receiver in the next `BlockHashes`, with
    /// every value taken since the last (at most [`VALUES_PER_MESSAGE`]). Returns the file that
    /// this value completes, if it does: the driver must check that the file is unchanged
    /// since its first block was read before it polls the next transmit (with that value the
    /// receiver can finish the file), and end the session if it is not.
    pub fn on_block_value(
        &mut self,
        now: Instant,
        block: u64,
        value: BlockValue,
        held: bool,
    ) -> Option<u32> {
        if held {
            self.last_progress = now;
        }
        let completes = self.table.set(block, value).map(|(file, _)| file);
        self.values.push((block, value));
        completes
    }

    /// A control message from the receiver (by either path: the first copy of each report and
    /// NACK counts).
    pub fn handle(&mut self, now: Instant, msg: Control) -> Result<(), DataError> {
        if !self.dedup.admit(&msg) {
            return Ok(());
        }
        match msg {
            Control::Nack {
                channel,
                ranges,
                knew_us,
                ..
            } => self.route(channel, ChannelCmd::Nack { ranges, knew_us }),
            Control::ChannelDone { channel } => self.route(channel, ChannelCmd::Done),
            Control::FileDone { file, hash } => self.on_file_done(file, hash)?,
            report @ Control::Report { .. } => self.on_report(now, &report),
            Control::ProbeAck { channel, size } => {
                self.events
                    .push_back(SenderDataEvent::ProbeAck { channel, size });
            }
            Control::UdpSilent { channels } if self.path.may_move() => {
                let why = format!(
                    "nothing reached the receiver on {}",
                    channel_list(&channels)
                );
                self.move_to_tcp(channels, why);
            }
            // Moved already, on the sender's own finding.
            Control::UdpSilent { .. } if self.path == DataPath::Tcp => {}
            Control::KeepAlive => {}
            other => return Err(DataError::Unexpected(Box::new(other))),
        }
        Ok(())
    }

    /// The sender's probes found no answer on `channel` within `secs`: the channels move to
    /// TCP if the session may, else the session ends.
    pub fn udp_blocked(&mut self, channel: u16, secs: u64) -> Result<(), DataError> {
        if !self.path.may_move() {
            return Err(DataError::UdpBlocked { channel, secs });
        }
        // Every channel sends again what it sent: on a path this blocked, little or nothing
        // of it arrived (the receiver drops what it has twice).
        let why = format!("no probe was answered on channel {channel} within {secs} s");
        self.move_to_tcp((0..self.channels).collect(), why);
        Ok(())
    }

    /// The channels moved to their TCP connections at `now` (after
    /// [`SenderDataEvent::MoveToTcp`], the driver sent `Fallback`), paced from now on by
    /// `controller`: the wait for progress starts again.
    pub fn moved_to_tcp(&mut self, now: Instant, controller: Option<RateController>) {
        self.path = DataPath::Tcp;
        self.begin(now, controller);
    }

    /// Timers due at `now`: a keep-alive, the silence check, the stall.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), DataError> {
        if now >= self.next_keep_alive {
            self.transmits.push_back(Control::KeepAlive);
            self.next_keep_alive = now + KEEP_ALIVE;
        }
        if let Some(every) = self.silence_every() {
            if now >= self.next_silence {
                self.next_silence = now + every;
                if let Some(change) = self.controller.as_mut().and_then(|c| c.on_silence(now)) {
                    self.events.push_back(SenderDataEvent::Silence { change });
                }
            }
        }
        if now.saturating_duration_since(self.last_progress) > self.stall {
            return Err(DataError::Stalled { after: self.stall });
        }
        Ok(())
    }

    /// When [`SenderData::handle_timeout`] wants to be called next.
    pub fn poll_timeout(&self) -> Instant {
        let mut at = self.next_keep_alive.min(self.last_progress + self.stall);
        if self.silence_every().is_some() {
            at = at.min(self.next_silence);
        }
        at
    }

    /// The next control message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        if let Some(msg) = self.transmits.pop_front() {
            return Some(msg);
        }
        if self.values.is_empty() {
            return None;
        }
        let rest = self
            .values
            .split_off(self.values.len().min(VALUES_PER_MESSAGE));
        Some(Control::BlockHashes {
            session: self.session,
            blocks: std::mem::replace(&mut self.values, rest),
        })
    }

    /// The next thing the driver must do.
    pub fn poll_event(&mut self) -> Option<SenderDataEvent> {
        self.events.pop_front()
    }

    /// Every file is confirmed.
    pub fn is_done(&self) -> bool {
        self.left == 0
    }

    /// The path the channels are on.
    pub fn path(&self) -> DataPath {
        self.path
    }

    /// The rate controller, if the data phase paces.
    pub fn controller(&self) -> Option<&RateController> {
        self.controller.as_ref()
    }

    /// The rate controller, to tell it what the driver measured of the path (a round trip:
    /// [`RateController::set_rtt`]).
    pub fn controller_mut(&mut self) -> Option<&mut RateController> {
        self.controller.as_mut()
    }

    /// Takes the rate controller, for the data phase that replaces this one (the early data's,
    /// when the outcome was another).
    pub fn take_controller(&mut self) -> Option<RateController> {
        self.controller.take()
    }

    /// Bytes the receiver said it has taken, in its latest report.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Report and NACK copies dropped as seen before.
    pub fn copies_dropped(&self) -> u64 {
        self.dedup.dropped
    }

    /// How many files are confirmed.
    pub fn confirmed(&self) -> usize {
        self.confirmed.iter().filter(|c| c.is_some()).count()
    }

    /// The ends: each file's hash and the receiver's counts; the controller back.
    pub fn finish(self) -> (SenderFinish, Option<RateController>) {
        let finish = SenderFinish {
            hashes: self
                .confirmed
                .into_iter()
                .map(|h| h.unwrap_or_default())
                .collect(),
            rejected: self.rejected,
            drops: self.drops,
        };
        (finish, self.controller)
    }

    fn restart_timers(&mut self, now: Instant) {
        self.last_progress = now;
        self.next_keep_alive = now + KEEP_ALIVE;
        self.next_silence = now + self.silence_every().unwrap_or(Duration::ZERO);
    }

    /// How often the silence check runs: as often as the receiver reports
    /// ([`RateController::report_spacing`], stretched at low rates), in `auto` only.
    fn silence_every(&self) -> Option<Duration> {
        let ctl = self.controller.as_ref()?;
        (ctl.config().mode == RateMode::Auto).then(|| ctl.report_spacing())
    }

    fn route(&mut self, channel: u16, cmd: ChannelCmd) {
        if channel < self.channels {
            self.events
                .push_back(SenderDataEvent::Channel { channel, cmd });
        }
    }

    fn on_file_done(&mut self, file: u32, hash: [u8; 32]) -> Result<(), DataError> {
        let f = file as usize;
        let Some(want) = self
            .table
            .file_root(file)
            .filter(|_| f < self.confirmed.len())
        else {
            return Err(DataError::EarlyConfirmation { file });
        };
        if want != hash {
            return Err(DataError::HashMismatch {
                file,
                got: hash,
                want,
            });
        }
        if self.confirmed[f].replace(hash).is_none() {
            self.left -= 1;
            self.events
                .push_back(SenderDataEvent::FileConfirmed { file });
        }
        Ok(())
    }

    fn on_report(&mut self, now: Instant, report: &Control) {
        let Control::Report {
            received,
            rejected,
            socket_drops,
            ..
        } = *report
        else {
            return;
        };
        let Some(feedback) = Feedback::of_report(report) else {
            return;
        };
        self.rejected = rejected;
        self.drops = socket_drops;
        let change = self
            .controller
            .as_mut()
            .and_then(|c| c.on_report(now, &feedback));
        if received > self.received {
            self.received = received;
            self.last_progress = now;
        }
        self.events.push_back(SenderDataEvent::Report {
            feedback,
            received,
            change,
        });
    }

    fn move_to_tcp(&mut self, silent: Vec<u16>, why: String) {
        // Once: the driver moves the channels, then calls `moved_to_tcp`.
        self.path = DataPath::Tcp;
        self.events
            .push_back(SenderDataEvent::MoveToTcp { silent, why });
    }
}

/// `channel 1`, or `channels 0, 2, 3`: channels named in a message.
pub fn channel_list(channels: &[u16]) -> String {
    let list: Vec<String> = channels.iter().map(u16::to_string).collect();
    match list.as_slice() {
        [one] => format!("channel {one}"),
        _ => format!("channels {}", list.join(", ")),
    }
}
