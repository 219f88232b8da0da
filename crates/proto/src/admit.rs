//! Admission of data-channel datagrams, and the rate-feedback report built from what was
//! admitted. The engine's channel threads, `hurtle-netsim`'s receiver and the receiver fuzz
//! target all judge datagrams here, so they cannot disagree about what counts.
//!
//! | part | owns |
//! |---|---|
//! | [`Admission`] | the checks of a datagram arriving on one socket (session, channel, kind, stripe length, placement in the [`Layout`]), the verdict ([`Admit`]) and the counting that follows it |
//! | [`Tally`] | what was counted, as running totals: datagrams and bytes admitted, packet numbers spanned, one-way delay samples, rejections |
//! | [`Rejected`] | the rejections by [`RejectReason`] |
//! | [`ReportBuilder`] | a `Control::Report` from the totals at the end of an interval and those at its start |
//!
//! What this module does not own: what the driver does with a verdict (acknowledging a probe,
//! recording data in the channel's [`ChannelReceiver`](crate::ChannelReceiver), writing its
//! bytes), the socket-level facts it passes in (the source address, kernel drops, how full
//! the socket buffer got), and when a report is due.
//!
//! An [`Admission`] covers the channels whose datagrams reach one socket: in the engine each
//! channel has a socket of its own, so one channel; in `hurtle-netsim` all channels share one
//! simulated link, so all of them. Packet numbers are followed per channel; the one-way delay
//! baseline (the lowest delay seen) is the admission's, one per receive path.
//!
//! # Order of the checks, and when a datagram counts
//!
//! A datagram is checked in this order, and the first check it fails is its [`RejectReason`]:
//! the header decodes; its session id is the session's; its channel is one this admission
//! covers (the one it arrived on); a probe is welcome and announces its own size; a final
//! marker announces its channel's stripe length; data lies inside one block of a file, in a
//! block the layout puts on its channel.
//!
//! Final markers and data count towards the rate feedback (bytes, datagrams, packet-number
//! span, one-way delay) **only after every check has passed**. A datagram that fails a check
//! is not known to be the sender's: its packet number and timestamp are whatever a forger or a
//! flipped bit made them, and one forged packet number near the top of its 48 bits would make
//! every later genuine datagram of its channel look old, so that no loss was ever seen again.
//! Probes never count: they are not paced with the data and have their
//! own packet numbers. Every rejection counts once, in [`Tally::rejected`] and under its reason.
//!
//! # Packet numbers
//!
//! A sender numbers the datagrams of each channel 1, 2, 3, ... (0 is never sent). The span of
//! a channel is its highest packet number seen; its growth over an interval, summed over the
//! channels, against the datagrams admitted, is what [`LostCount`] turns into `lost`.

use crate::fec::ParityDesc;
use crate::layout::{Layout, Placement};
use crate::rate::dispersion::TrainMeter;
use crate::rate::{LostCount, OneWayDelay};
use crate::wire::{Control, Header, Kind, FLAG_RETRANSMIT, HEADER_LEN};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// [`Header::decode`] failed (shorter than a header, unknown kind).
    Malformed,
    /// Another session id.
    Session,
    /// It did not come from the peer's address (only the driver can tell; see
    /// [`Admission::reject`]).
    Source,
    /// The header's channel is not one this admission covers (the channel it arrived on), or
    /// data lies on another channel's stripe.
    Channel,
    /// A kind that has no business here (a probe where probes are not welcome).
    Kind,
    /// A probe whose announced size is not its size. (Before admission was shared, the engine
    /// dropped these without counting them.)
    ProbeSize,
    /// A final marker with the wrong stripe length.
    FinalLength,
    /// A parity datagram whose descriptor does not parse or describes no group sent
    /// ([`ParityDesc::decode`]).
    Parity,
    /// Early data of the provisional outcome that the real one replaced (see
    /// [`crate::session`]): expected, and counted apart, not in [`Rejected::total`].
    Superseded,
    /// `(file, offset, len)` refused by [`Layout::place`], or bytes of a file the driver is not
    /// receiving.
    Layout,
}

/// Datagrams rejected, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rejected {
    /// [`RejectReason::Malformed`].
    pub malformed: u64,
    /// [`RejectReason::Session`].
    pub session: u64,
    /// [`RejectReason::Source`].
    pub source: u64,
    /// [`RejectReason::Channel`].
    pub channel: u64,
    /// [`RejectReason::Kind`].
    pub kind: u64,
    /// [`RejectReason::ProbeSize`].
    pub probe_size: u64,
    /// [`RejectReason::FinalLength`].
    pub final_len: u64,
    /// [`RejectReason::Parity`].
    pub parity: u64,
    /// [`RejectReason::Layout`].
    pub layout: u64,
    /// [`RejectReason::Superseded`] (not in [`Rejected::total`]: nobody did anything wrong).
    pub superseded: u64,
}

impl Rejected {
    /// All rejected datagrams.
    pub fn total(&self) -> u64 {
        self.malformed
            + self.session
            + self.source
            + self.channel
            + self.kind
            + self.probe_size
            + self.final_len
            + self.parity
            + self.layout
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Rejected) {
        self.malformed += other.malformed;
        self.session += other.session;
        self.source += other.source;
        self.channel += other.channel;
        self.kind += other.kind;
        self.probe_size += other.probe_size;
        self.final_len += other.final_len;
        self.parity += other.parity;
        self.layout += other.layout;
        self.superseded += other.superseded;
    }

    fn count(&mut self, reason: RejectReason) {
        let n = match reason {
            RejectReason::Malformed => &mut self.malformed,
            RejectReason::Session => &mut self.session,
            RejectReason::Source => &mut self.source,
            RejectReason::Channel => &mut self.channel,
            RejectReason::Kind => &mut self.kind,
            RejectReason::ProbeSize => &mut self.probe_size,
            RejectReason::FinalLength => &mut self.final_len,
            RejectReason::Parity => &mut self.parity,
            RejectReason::Layout => &mut self.layout,
            RejectReason::Superseded => &mut self.superseded,
        };
        *n += 1;
    }
}

/// Running totals of what admission counted. Sums saturate; differences
/// ([`Tally::since`]) wrap, so totals kept in wrapping atomics difference correctly too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Final markers and data datagrams admitted.
    pub datagrams: u64,
    /// Their bytes, headers included.
    pub bytes: u64,
    /// Packet numbers spanned: per channel, the growth of the highest packet number seen.
    pub pn_span: u64,
    /// Sum of the queueing delays (one-way delay above the lowest seen) of those datagrams,
    /// microseconds.
    pub delay_sum_us: u64,
    /// How many delays were summed.
    pub delay_count: u64,
    /// Datagrams rejected, for any reason.
    pub rejected: u64,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Tally) {
        self.datagrams = self.datagrams.saturating_add(other.datagrams);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.pn_span = self.pn_span.saturating_add(other.pn_span);
        self.delay_sum_us = self.delay_sum_us.saturating_add(other.delay_sum_us);
        self.delay_count = self.delay_count.saturating_add(other.delay_count);
        self.rejected = self.rejected.saturating_add(other.rejected);
    }

    /// What was counted between `earlier` and these totals.
    pub fn since(&self, earlier: &Tally) -> Tally {
        Tally {
            datagrams: self.datagrams.wrapping_sub(earlier.datagrams),
            bytes: self.bytes.wrapping_sub(earlier.bytes),
            pn_span: self.pn_span.wrapping_sub(earlier.pn_span),
            delay_sum_us: self.delay_sum_us.wrapping_sub(earlier.delay_sum_us),
            delay_count: self.delay_count.wrapping_sub(earlier.delay_count),
            rejected: self.rejected.wrapping_sub(earlier.rejected),
        }
    }
}

/// Data that passed every check: where its bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// File id.
    pub file: u32,
    /// Offset of the first byte in the file.
    pub offset: u64,
    /// Payload bytes.
    pub len: u64,
    /// The sender marked it as a repair (`FLAG_RETRANSMIT`).
    pub retransmit: bool,
    /// Its stripe position, block and the block's place ([`Layout::place`]).
    pub place: Placement,
}

/// The verdict on one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// A path probe of `size` datagram bytes, header included. Not counted; a driver that is
    /// probing answers it with a `ProbeAck`.
    Probe {
        /// Its channel.
        channel: u16,
        /// The datagram's size.
        size: u16,
    },
    /// A channel's final marker, announcing the right stripe length. Counted.
    Final {
        /// Its channel.
        channel: u16,
        /// The stripe length it announced (the channel's).
        stripe_len: u64,
    },
    /// Data for a channel's stripe (the channel is `place.channel`). Counted.
    Data(Placed),
    /// Parity of a group of the tail's data ([`crate::fec`]): the group is `place`'s `len`
    /// bytes (inside one block of the channel's stripe), and [`Admission::admit_datagram`]
    /// returns the shard as the payload. Counted, as data is (it is paced and numbered with
    /// it).
    Parity {
        /// Where the group lies (`retransmit` is false).
        place: Placed,
        /// The group and which shard this is.
        desc: ParityDesc,
    },
    /// Dropped. Counted as rejected, under this reason.
    Reject(RejectReason),
}

/// The admission of datagrams arriving on one socket: the checks, the verdict and the
/// counting. See the module docs for the order of the checks and when a datagram counts.
#[derive(Debug, Clone)]
pub struct Admission {
    session: u32,
    /// The provisional session whose early data this one replaced, if it did.
    superseded: Option<u32>,
    channels: Range<u16>,
    probes: bool,
    origin: Instant,
    clock_offset_us: u64,
    /// Highest packet number seen, per channel of `channels`.
    highest_pn: Vec<u64>,
    /// The `sent_us` of the datagram of each channel's highest packet number counted, and
    /// when it arrived.
    newest: Vec<Option<(u32, Instant)>>,
    owd: OneWayDelay,
    tally: Tally,
    rejected: Rejected,
    peak_queue_us: u64,
    trains: TrainMeter,
}

impl Admission {
    /// Admission for datagrams of session `session` arriving on the socket of `channels` (one
    /// channel, `c..c + 1`, where each channel has its own). Probes are welcome (see
    /// [`Admission::without_probes`]). One-way delays are measured on a clock that reads
    /// microseconds since `origin`.
    pub fn new(session: u32, channels: Range<u16>, origin: Instant) -> Self {
        Admission {
            session,
            superseded: None,
            highest_pn: vec![0; channels.len()],
            newest: vec![None; channels.len()],
            trains: TrainMeter::new(channels.len()),
            channels,
            probes: true,
            origin,
            clock_offset_us: 0,
            owd: OneWayDelay::default(),
            tally: Tally::default(),
            rejected: Rejected::default(),
            peak_queue_us: 0,
        }
    }

    /// Datagrams of session `early` (the provisional outcome's, which this session's replaced)
    /// are dropped as [`RejectReason::Superseded`], apart from the rejected.
    pub fn superseding(mut self, early: u32) -> Self {
        self.superseded = (early != self.session).then_some(early);
        self
    }

    /// Probes are rejected ([`RejectReason::Kind`]): for a driver past probing that no longer
    /// answers them.
    pub fn without_probes(mut self) -> Self {
        self.probes = false;
        self
    }

    /// The receiver's clock reads `offset_us` more than the time since the origin (wrapping):
    /// a simulation's way of giving the two sides unsynchronised clocks.
    pub fn with_clock_offset(mut self, offset_us: u64) -> Self {
        self.clock_offset_us = offset_us;
        self
    }

    /// The channels this admission covers.
    pub fn channels(&self) -> Range<u16> {
        self.channels.clone()
    }

    /// Decodes and admits one datagram as it came off the socket, at `now`: when it arrived,
    /// which its queueing delay is measured at (the kernel's arrival time where the driver has
    /// it, so that a receiver that reads in lumps does not count its lumps as queue). Returns
    /// the verdict and the payload (empty if it did not decode).
    pub fn admit_datagram<'a>(
        &mut self,
        now: Instant,
        layout: &Layout,
        datagram: &'a [u8],
    ) -> (Admit, &'a [u8]) {
        match Header::decode(datagram) {
            Ok((h, payload)) if h.kind == Kind::Parity => {
                self.admit_parity(now, layout, &h, payload)
            }
            Ok((h, payload)) => (self.admit(now, layout, &h, payload.len()), payload),
            Err(_) => (self.reject(RejectReason::Malformed), &[]),
        }
    }

    /// Admits a parity datagram: the session and channel checks of [`Admission::admit`], then
    /// its descriptor, then its group's place (one block of its channel's stripe). Returns the
    /// verdict and the shard.
    fn admit_parity<'a>(
        &mut self,
        now: Instant,
        layout: &Layout,
        h: &Header,
        payload: &'a [u8],
    ) -> (Admit, &'a [u8]) {
        if let Err(verdict) = self.check_session_and_channel(h) {
            return (verdict, &[]);
        }
        let Ok((desc, shard)) = ParityDesc::decode(payload) else {
            return (self.reject(RejectReason::Parity), &[]);
        };
        let len = u64::from(desc.len);
        let Ok(place) = layout.place(h.file, h.offset, len) else {
            return (self.reject(RejectReason::Layout), &[]);
        };
        if place.channel != h.channel {
            return (self.reject(RejectReason::Channel), &[]);
        }
        self.count(now, h, HEADER_LEN + payload.len());
        let place = Placed {
            file: h.file,
            offset: h.offset,
            len,
            retransmit: false,
            place,
        };
        (Admit::Parity { place, desc }, shard)
    }

    /// Admits one decoded datagram: header `h` and `payload_len` bytes of payload, arrived at
    /// `now` on this admission's socket.
    pub fn admit(
        &mut self,
        now: Instant,
        layout: &Layout,
        h: &Header,
        payload_len: usize,
    ) -> Admit {
        if let Err(verdict) = self.check_session_and_channel(h) {
            return verdict;
        }
        let channel = h.channel;
        let size = HEADER_LEN + payload_len;
        match h.kind {
            Kind::Probe if !self.probes => self.reject(RejectReason::Kind),
            Kind::Probe => match u16::try_from(size) {
                Ok(size) if h.offset == u64::from(size) => Admit::Probe { channel, size },
                _ => self.reject(RejectReason::ProbeSize),
            },
            Kind::Final => {
                let stripe_len = layout.stripe_len(channel);
                if h.offset != stripe_len {
                    return self.reject(RejectReason::FinalLength);
                }
                self.count(now, h, size);
                Admit::Final {
                    channel,
                    stripe_len,
                }
            }
            // Judged with its payload: `admit_datagram`.
            Kind::Parity | Kind::Feedback => self.reject(RejectReason::Kind),
            Kind::Data => {
                let len = u64::from(h.len);
                let Ok(place) = layout.place(h.file, h.offset, len) else {
                    return self.reject(RejectReason::Layout);
                };
                if place.channel != channel {
                    return self.reject(RejectReason::Channel);
                }
                self.count(now, h, size);
                Admit::Data(Placed {
                    file: h.file,
                    offset: h.offset,
                    len,
                    retransmit: h.flags & FLAG_RETRANSMIT != 0,
                    place,
                })
            }
        }
    }

    /// The first checks of every datagram: its session is this one's (early data of a session
    /// this one replaced is noted and refused apart), its channel one this admission covers.
    fn check_session_and_channel(&mut self, h: &Header) -> Result<(), Admit> {
        if h.session != self.session {
            if Some(h.session) == self.superseded {
                // The sender's packet numbers go on from its early data: where they stand is
                // where this session's count of the span starts, not a loss. (Not a probe's:
                // probes are numbered in a space of their own, above every data number, and
                // would leave no later datagram newer, nor any NACK knowing of one.)
                if let Some(highest) = h
                    .channel
                    .checked_sub(self.channels.start)
                    .filter(|_| h.kind != Kind::Probe)
                    .and_then(|i| self.highest_pn.get_mut(usize::from(i)))
                {
                    *highest = (*highest).max(h.packet);
                }
                return Err(self.reject(RejectReason::Superseded));
            }
            return Err(self.reject(RejectReason::Session));
        }
        if !self.channels.contains(&h.channel) {
            return Err(self.reject(RejectReason::Channel));
        }
        Ok(())
    }

    /// Rejects a datagram for `reason`: counts it and returns the verdict. The driver calls this
    /// for what only it can see (a datagram from another address, bytes of a file it has no
    /// part file for); [`Admission::admit`] calls it for everything else.
    pub fn reject(&mut self, reason: RejectReason) -> Admit {
        // Superseded early data is nobody's wrongdoing: apart from the rejected.
        if reason != RejectReason::Superseded {
            self.tally.rejected = self.tally.rejected.saturating_add(1);
        }
        self.rejected.count(reason);
        Admit::Reject(reason)
    }

    /// Counts an admitted final marker or data datagram of `size` bytes (of a channel this
    /// admission covers).
    fn count(&mut self, now: Instant, h: &Header, size: usize) {
        let index = usize::from(h.channel - self.channels.start);
        let highest = &mut self.highest_pn[index];
        if h.packet > *highest {
            self.tally.pn_span = self.tally.pn_span.saturating_add(h.packet - *highest);
            *highest = h.packet;
            self.newest[index] = Some((h.sent_us, now));
        }
        let t = &mut self.tally;
        t.datagrams = t.datagrams.saturating_add(1);
        t.bytes = t.bytes.saturating_add(size as u64);
        let since = now.saturating_duration_since(self.origin).as_micros() as u64;
        let now_us = since.wrapping_add(self.clock_offset_us) as u32;
        let queued_us = self.owd.sample(now_us, h.sent_us);
        t.delay_sum_us = t.delay_sum_us.saturating_add(queued_us);
        t.delay_count += 1;
        self.peak_queue_us = self.peak_queue_us.max(queued_us);
        self.trains
            .on_datagram(index, h.packet, h.sent_us, now, size as u64);
    }

    /// Moves the bottleneck estimates of the trains that ended since the last call into `out`
    /// (see [`crate::rate::dispersion`]): for the driver to gather over a report's interval.
    pub fn take_train_rates(&mut self, out: &mut Vec<u32>) {
        self.trains.drain_into(out);
    }

    /// Drops the estimates of the trains that ended since the last call: for a driver whose
    /// arrival times are its own reads, not the path's spacing.
    pub fn forget_train_rates(&mut self) {
        self.trains.forget();
    }

    /// What a NACK of `channel` sent at `now` knows of, on the sender's clock
    /// (`Control::Nack`'s `knew_us`): the `sent_us` of the newest datagram (by packet number)
    /// admitted on the channel, plus the time since it arrived. Anything the sender sent later
    /// would have had to travel faster than that datagram to have arrived by `now`. 0 before
    /// the first datagram, or for a channel this admission does not cover.
    pub fn knew_us(&self, channel: u16, now: Instant) -> u32 {
        let newest = channel
            .checked_sub(self.channels.start)
            .and_then(|i| self.newest.get(usize::from(i)).copied().flatten());
        newest.map_or(0, |(sent_us, at)| {
            let since = now.saturating_duration_since(at).as_micros() as u32;
            sent_us.wrapping_add(since)
        })
    }

    /// Running totals so far.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Rejections so far, by reason.
    pub fn rejected(&self) -> Rejected {
        self.rejected
    }

    /// The most queueing delay any datagram counted since the last call met (zero if none):
    /// what the channel's receiver waits on before asking for a repair again
    /// ([`ChannelReceiver::note_queue_delay`](crate::ChannelReceiver::note_queue_delay)).
    pub fn take_peak_queue_delay(&mut self) -> Duration {
        Duration::from_micros(std::mem::take(&mut self.peak_queue_us))
    }
}

/// What a driver knows at the end of a report interval besides the admission totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportFacts {
    /// Admission totals so far, summed over the channels.
    pub totals: Tally,
    /// Payload bytes accepted so far (the report's `received`).
    pub received: u64,
    /// Kernel socket drops so far, summed over the channels (0 when unknown).
    pub socket_drops: u64,
    /// The fullest any channel's socket buffer got in the interval, thousandths of its limit.
    pub queue_fill_permille: u64,
    /// The longest data waited inside the receiver in the interval (a block queued for a
    /// writer), microseconds: it counts like a queue on the path, so the mean queueing delay
    /// is reported as at least this.
    pub held_us: u64,
    /// How late the receiver's timer has been running (smoothed).
    pub lateness: Duration,
    /// The fullest the writer thread's queue got in the interval, thousandths of its depth (0
    /// without one); `queue_fill_permille` should count it too.
    pub disk_fill_permille: u64,
    /// The time the interval's bytes arrived over, by the kernel's arrival times
    /// ([`arrival_interval`]); `None`: the time since the last report.
    pub arrived_over: Option<Duration>,
    /// The bottleneck's rate by the interval's trains, kbit/s (a
    /// [`crate::rate::dispersion::TrainPool`]'s median of what [`Admission::take_train_rates`]
    /// gave, with too few carried over from the reports before); 0: not measured.
    pub train_kbps: u64,
}

/// What one channel had admitted by a moment, timed by the kernel: its bytes (as
/// [`Tally::bytes`] counts them) and when the last of them arrived, in microseconds from an
/// origin the driver chooses (0: nothing yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArrivalMark {
    /// Bytes admitted so far.
    pub bytes: u64,
    /// When the last of them arrived, microseconds from the driver's origin.
    pub at_us: u64,
}

/// The time a report's bytes arrived over, from each channel's [`ArrivalMark`] at the last
/// report (`before`) and now (`after`), for a report `tick` after the last: a channel's bytes
/// between its marks came in over the time between their arrivals, so the channels' rates
/// summed are what the receiver got however late its threads read them, and the interval
/// returned is the one over which all the bytes came at that rate. (A receiver whose threads
/// read in lumps counts, in one report, bytes that arrived in the last one's time, and the
/// rate by its reports swings from half to twice the path's.) `None`, for the caller to use
/// `tick`, when the marks cannot time it: nothing arrived, no mark before, or a channel's
/// bytes arrived within a quarter of `tick` (or a millisecond), too short a span to time
/// (after an outage, a burst's arrivals say more of the last link's rate than the path's).
pub fn arrival_interval(
    before: &[ArrivalMark],
    after: &[ArrivalMark],
    tick: Duration,
) -> Option<Duration> {
    let shortest = (tick.as_micros() as u64 / 4).max(1000);
    let (mut bytes, mut per_us) = (0u64, 0f64);
    for (b, a) in before.iter().zip(after) {
        let got = a.bytes.checked_sub(b.bytes)?;
        if got == 0 {
            continue;
        }
        let span = a.at_us.checked_sub(b.at_us)?;
        if b.at_us == 0 || span < shortest {
            return None;
        }
        bytes += got;
        per_us += got as f64 / span as f64;
    }
    (bytes > 0 && per_us > 0.0).then(|| Duration::from_micros((bytes as f64 / per_us) as u64))
}

/// How full a receiver's buffers got (thousandths) for its report to time its bytes by when it
/// read them rather than by when they arrived ([`ReportBuilder::build`]): a quarter, where the
/// rate controller stops adding to the rate ([`crate::rate::QUEUE_FILL_LIMIT`] is half).
pub const READING_BEHIND_PERMILLE: u64 = 250;

/// Builds the receiver's `Control::Report` for each interval from running totals, and
/// remembers where the interval started. The lost count runs on the totals since the session
/// began ([`LostCount`]); everything else is the interval's difference.
#[derive(Debug, Clone)]
pub struct ReportBuilder {
    start: Instant,
    prev: Tally,
    prev_drops: u64,
    lost: LostCount,
    /// Reports built so far (each carries its number: [`crate::feedback::Dedup`]).
    built: u64,
}

impl ReportBuilder {
    /// The first interval starts at `now`, with these totals and kernel drops already counted.
    pub fn new(now: Instant, totals: Tally, socket_drops: u64) -> Self {
        ReportBuilder {
            start: now,
            prev: totals,
            prev_drops: socket_drops,
            lost: LostCount::default(),
            built: 0,
        }
    }

    /// When the current interval started (the last report, or the builder's creation).
    pub fn interval_start(&self) -> Instant {
        self.start
    }

    /// The report for the interval ending at `now`; the next interval starts there.
    ///
    /// Its interval is the time its bytes arrived over where the driver has that, else the
    /// time since the last report; but where the receiver's buffers filled to
    /// [`READING_BEHIND_PERMILLE`] or more, the time since the last report: such a receiver
    /// read behind its arrivals, and the rate they arrived at is only what was sent (its
    /// buffers took the rest). The rate it read at is what it takes: lower than what was sent
    /// if it falls behind, higher if it is catching up after a stall, which the sender then
    /// sees as such.
    pub fn build(&mut self, now: Instant, facts: &ReportFacts) -> Control {
        let tick = now.saturating_duration_since(self.start);
        let interval = match facts.arrived_over {
            Some(arrived) if facts.queue_fill_permille < READING_BEHIND_PERMILLE => arrived,
            _ => tick,
        };
        let d = facts.totals.since(&self.prev);
        let drops = facts.socket_drops.saturating_sub(self.prev_drops);
        self.start = now;
        self.prev = facts.totals;
        self.prev_drops = facts.socket_drops;
        self.built += 1;
        Control::Report {
            seq: self.built,
            received: facts.received,
            rejected: facts.totals.rejected,
            socket_drops: facts.socket_drops,
            interval_us: interval.as_micros() as u64,
            bytes: d.bytes,
            datagrams: d.datagrams,
            lost: self
                .lost
                .report(facts.totals.pn_span, facts.totals.datagrams),
            drops,
            queue_delay_us: d
                .delay_sum_us
                .checked_div(d.delay_count)
                .unwrap_or(0)
                .max(facts.held_us),
            queue_fill: facts.queue_fill_permille.min(1000) as u16,
            lateness_us: facts.lateness.as_micros() as u64,
            disk_wait_us: facts.held_us,
            disk_fill: facts.disk_fill_permille.min(1000) as u16,
            train_kbps: facts.train_kbps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: u32 = 0x5e55;

    /// Two files over two channels, 1 KiB blocks: file 0's blocks alternate channels 0 and 1.
    fn layout() -> Layout {
        Layout::new(&[4096, 100], 1024, 2).unwrap()
    }

    fn data(channel: u16, packet: u64, file: u32, offset: u64, len: u16, sent_us: u32) -> Header {
        Header {
            kind: Kind::Data,
            flags: 0,
            channel,
            session: SESSION,
            packet,
            file,
            offset,
            len,
            sent_us,
        }
    }

    fn datagram(h: &Header) -> Vec<u8> {
        let mut dg = vec![0xabu8; HEADER_LEN + usize::from(h.len)];
        h.encode(&mut dg);
        dg
    }

    #[test]
    fn data_for_this_channel_is_placed_and_counted() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        let h = Header {
            flags: FLAG_RETRANSMIT,
            ..data(0, 1, 0, 2048 + 100, 200, 0)
        };
        let dg = datagram(&h);
        let (verdict, payload) = a.admit_datagram(t0, &l, &dg);
        assert_eq!(payload.len(), 200);
        assert_eq!(
            verdict,
            Admit::Data(Placed {
                file: 0,
                offset: 2148,
                len: 200,
                retransmit: true,
                place: l.place(0, 2148, 200).unwrap(),
            })
        );
        let t = a.tally();
        assert_eq!((t.datagrams, t.bytes, t.pn_span), (1, 228, 1));
        assert_eq!((t.delay_count, t.rejected), (1, 0));
    }

    #[test]
    fn the_superseded_early_session_is_dropped_apart_from_the_rejected() {
        let now = Instant::now();
        let layout = Layout::new(&[1 << 20], 1 << 16, 1).unwrap();
        let mut a = Admission::new(SESSION, 0..1, now).superseding(SESSION - 2);
        let early = Header {
            session: SESSION - 2,
            ..data(0, 1, 0, 0, 100, 0)
        };
        assert_eq!(
            a.admit(now, &layout, &early, 100),
            Admit::Reject(RejectReason::Superseded)
        );
        let stranger = Header {
            session: SESSION - 4,
            ..data(0, 2, 0, 0, 100, 0)
        };
        assert_eq!(
            a.admit(now, &layout, &stranger, 100),
            Admit::Reject(RejectReason::Session)
        );
        assert_eq!(a.rejected().superseded, 1);
        assert_eq!(a.rejected().total(), 1, "only the stranger");
        assert_eq!(a.tally().rejected, 1, "only the stranger");
        // The packet numbers go on from the early data's: the next one is no loss.
        let next = Header {
            packet: 2,
            ..data(0, 1, 0, 0, 100, 0)
        };
        assert!(matches!(a.admit(now, &layout, &next, 100), Admit::Data(_)));
        assert_eq!(a.tally().pn_span, 1, "the span starts after the early data");
        // A probe of the early session (numbered above every data number) leaves the span,
        // and what a NACK knows of, to the data.
        let probe = Header {
            kind: Kind::Probe,
            session: SESSION - 2,
            packet: crate::secure::PROBE_PACKETS + 1,
            offset: (HEADER_LEN + 100) as u64,
            ..data(0, 0, 0, 0, 100, 0)
        };
        assert_eq!(
            a.admit(now, &layout, &probe, 100),
            Admit::Reject(RejectReason::Superseded)
        );
        let after = Header {
            packet: 3,
            ..data(0, 1, 0, 100, 100, 5_000)
        };
        assert!(matches!(a.admit(now, &layout, &after, 100), Admit::Data(_)));
        assert_eq!(a.tally().pn_span, 2);
        assert_eq!(a.knew_us(0, now), 5_000);
        // Superseding itself is no superseding.
        let mut b = Admission::new(SESSION, 0..1, now).superseding(SESSION);
        assert!(matches!(
            b.admit(now, &layout, &data(0, 1, 0, 0, 100, 0), 100),
            Admit::Data(_)
        ));
    }

    #[test]
    fn a_foreign_session_is_rejected_and_not_counted() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        let h = Header {
            session: !SESSION,
            ..data(0, 1_000_000, 0, 0, 100, 0)
        };
        assert_eq!(
            a.admit(t0, &l, &h, 100),
            Admit::Reject(RejectReason::Session)
        );
        assert_eq!(a.rejected().session, 1);
        assert_eq!(
            a.tally(),
            Tally {
                rejected: 1,
                ..Tally::default()
            },
            "its packet number spans nothing"
        );
    }

    #[test]
    fn out_of_bounds_data_is_rejected_before_it_counts() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        for (file, offset, len) in [
            (0, 4096, 10),         // past the end of the file
            (0, 1000, 100),        // across a block boundary
            (0, u64::MAX - 4, 16), // overflowing
            (7, 0, 10),            // no such file
            (0, 0, 0),             // empty
        ] {
            let h = data(0, crate::wire::MAX_PACKET, file, offset, len, 0);
            assert_eq!(
                a.admit(t0, &l, &h, usize::from(len)),
                Admit::Reject(RejectReason::Layout),
                "{file} {offset} {len}"
            );
        }
        assert_eq!(a.rejected().layout, 5);
        assert_eq!(a.tally().pn_span, 0);
        // A genuine datagram after the forgeries is seen as new: the forged packet numbers
        // did not move the channel's highest.
        let h = data(0, 3, 0, 0, 10, 0);
        assert!(matches!(a.admit(t0, &l, &h, 10), Admit::Data(_)));
        assert_eq!(a.tally().pn_span, 3);
    }

    #[test]
    fn the_wrong_channel_is_rejected() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 1..2, t0);
        // Arrived on channel 1 but says channel 0.
        let h = data(0, 1, 0, 0, 10, 0);
        assert_eq!(
            a.admit(t0, &l, &h, 10),
            Admit::Reject(RejectReason::Channel)
        );
        // Says channel 1, but the bytes (block 0) are channel 0's.
        let h = data(1, 1, 0, 0, 10, 0);
        assert_eq!(
            a.admit(t0, &l, &h, 10),
            Admit::Reject(RejectReason::Channel)
        );
        // Block 1 is channel 1's.
        let h = data(1, 1, 0, 1024, 10, 0);
        assert!(matches!(a.admit(t0, &l, &h, 10), Admit::Data(_)));
        assert_eq!(a.rejected().channel, 2);
        assert_eq!(a.tally().datagrams, 1);
    }

    #[test]
    fn probes_are_answered_by_size_or_refused() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        let probe = |payload: u16, announced: u64| Header {
            kind: Kind::Probe,
            offset: announced,
            ..data(0, 9, 0, 0, payload, 0)
        };
        let size = HEADER_LEN as u16 + 1200;
        assert_eq!(
            a.admit(t0, &l, &probe(1200, u64::from(size)), 1200),
            Admit::Probe { channel: 0, size }
        );
        assert_eq!(
            a.admit(t0, &l, &probe(1200, 999), 1200),
            Admit::Reject(RejectReason::ProbeSize)
        );
        assert_eq!(a.tally().datagrams, 0, "probes are not data");
        assert_eq!(a.tally().pn_span, 0);
        let mut past = Admission::new(SESSION, 0..1, t0).without_probes();
        assert_eq!(
            past.admit(t0, &l, &probe(1200, u64::from(size)), 1200),
            Admit::Reject(RejectReason::Kind)
        );
    }

    #[test]
    fn a_final_marker_counts_only_with_the_right_stripe_length() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 1..2, t0);
        let fin = |packet: u64, stripe_len: u64| Header {
            kind: Kind::Final,
            offset: stripe_len,
            ..data(1, packet, 0, 0, 0, 0)
        };
        let stripe_len = l.stripe_len(1);
        assert_eq!(
            a.admit(t0, &l, &fin(50, stripe_len + 1), 0),
            Admit::Reject(RejectReason::FinalLength)
        );
        assert_eq!(a.tally().pn_span, 0);
        assert_eq!(
            a.admit(t0, &l, &fin(4, stripe_len), 0),
            Admit::Final {
                channel: 1,
                stripe_len
            }
        );
        let t = a.tally();
        assert_eq!((t.datagrams, t.bytes, t.pn_span, t.rejected), (1, 28, 4, 1));
    }

    #[test]
    fn a_duplicate_counts_as_a_datagram_but_spans_nothing() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        let h = data(0, 2, 0, 0, 100, 0);
        let first = a.admit(t0, &l, &h, 100);
        assert!(matches!(first, Admit::Data(_)));
        // The network delivered it twice: placed again (the channel receiver finds its bytes
        // are not new); one more datagram, no more packet numbers.
        assert_eq!(a.admit(t0, &l, &h, 100), first);
        let t = a.tally();
        assert_eq!((t.datagrams, t.bytes, t.pn_span), (2, 256, 2));
        // An older packet number spans nothing either.
        let h = data(0, 1, 0, 100, 100, 0);
        assert!(matches!(a.admit(t0, &l, &h, 100), Admit::Data(_)));
        assert_eq!(a.tally().pn_span, 2);
    }

    #[test]
    fn one_admission_for_all_channels_follows_packet_numbers_per_channel() {
        let (t0, l) = (Instant::now(), layout());
        // All channels on one socket, as in the simulator.
        let mut a = Admission::new(SESSION, 0..2, t0);
        assert!(matches!(
            a.admit(t0, &l, &data(0, 5, 0, 0, 10, 0), 10),
            Admit::Data(_)
        ));
        assert!(matches!(
            a.admit(t0, &l, &data(1, 3, 0, 1024, 10, 0), 10),
            Admit::Data(p) if p.place.channel == 1
        ));
        // Channel 1's numbers are its own: 4 spans one more, whatever channel 0 reached.
        assert!(matches!(
            a.admit(t0, &l, &data(1, 4, 0, 1034, 10, 700), 10),
            Admit::Data(_)
        ));
        assert_eq!(a.tally().pn_span, 5 + 4);
        // What a NACK knows of is the newest packet number's stamp, not the latest arrival's.
        assert!(matches!(
            a.admit(t0, &l, &data(1, 2, 0, 1044, 10, 900), 10),
            Admit::Data(_)
        ));
        let later = t0 + Duration::from_micros(50);
        assert_eq!((a.knew_us(0, later), a.knew_us(1, later)), (50, 750));
        assert_eq!(a.knew_us(2, later), 0, "no channel 2");
        // A channel gone quiet (a tail whose last repair was lost): a NACK a second later
        // knows that what was sent up to a second after packet 4 has not arrived.
        assert_eq!(a.knew_us(1, t0 + Duration::from_secs(1)), 1_000_700);
        assert_eq!(
            a.admit(t0, &l, &data(2, 1, 0, 0, 10, 0), 10),
            Admit::Reject(RejectReason::Channel),
            "no channel 2"
        );
        assert_eq!(a.channels(), 0..2);
    }

    #[test]
    fn queueing_delay_is_one_way_delay_above_the_lowest() {
        let (t0, l) = (Instant::now(), layout());
        let ms = Duration::from_millis;
        // The receiver's clock is far from the sender's: only differences matter.
        let mut a = Admission::new(SESSION, 0..1, t0).with_clock_offset(u64::MAX - 5);
        let at = |sent_ms: u32| data(0, 1, 0, 0, 10, sent_ms * 1000);
        a.admit(t0 + ms(20), &l, &at(0), 10); // 20 ms on the way: the lowest so far
        a.admit(t0 + ms(35), &l, &at(10), 10); // 25 ms: 5 queued
        assert_eq!(a.take_peak_queue_delay(), ms(5));
        assert_eq!(a.take_peak_queue_delay(), Duration::ZERO);
        a.admit(t0 + ms(38), &l, &at(20), 10); // 18 ms: the new lowest
        let t = a.tally();
        assert_eq!((t.delay_sum_us, t.delay_count), (5000, 3));
    }

    #[test]
    fn a_datagram_that_does_not_decode_is_malformed() {
        let (t0, l) = (Instant::now(), layout());
        let mut a = Admission::new(SESSION, 0..1, t0);
        let dg = datagram(&data(0, 1, 0, 0, 10, 0));
        assert_eq!(
            a.admit_datagram(t0, &l, &dg[..HEADER_LEN - 1]),
            (Admit::Reject(RejectReason::Malformed), &[][..])
        );
        assert_eq!(
            a.reject(RejectReason::Source),
            Admit::Reject(RejectReason::Source)
        );
        let r = a.rejected();
        assert_eq!((r.malformed, r.source, r.total()), (1, 1, 2));
        assert_eq!(a.tally().rejected, 2);
    }

    #[test]
    fn tallies_add_and_difference() {
        let a = Tally {
            datagrams: 3,
            bytes: 300,
            pn_span: 4,
            delay_sum_us: 10,
            delay_count: 3,
            rejected: 1,
        };
        let mut b = a;
        b.add(&a);
        assert_eq!(b.since(&a), a);
        // Totals kept in wrapping counters still difference right.
        let wrapped = Tally {
            bytes: 5,
            ..Tally::default()
        };
        let before = Tally {
            bytes: u64::MAX - 4,
            ..Tally::default()
        };
        assert_eq!(wrapped.since(&before).bytes, 10);
    }

    #[test]
    fn a_report_covers_the_interval_and_loss_runs_on_totals() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let start = Tally {
            datagrams: 10,
            bytes: 10_000,
            pn_span: 10,
            delay_sum_us: 500,
            delay_count: 10,
            rejected: 2,
        };
        let mut b = ReportBuilder::new(t0, start, 7);
        assert_eq!(b.interval_start(), t0);
        // 50 ms: 8 datagrams over 10 packet numbers, 2 kernel drops.
        let facts = ReportFacts {
            train_kbps: 2_500,
            totals: Tally {
                datagrams: 18,
                bytes: 18_000,
                pn_span: 20,
                delay_sum_us: 500 + 8 * 300,
                delay_count: 18,
                rejected: 3,
            },
            received: 123_456,
            socket_drops: 9,
            queue_fill_permille: 1500,
            held_us: 0,
            lateness: Duration::from_micros(250),
            disk_fill_permille: 0,
            arrived_over: None,
        };
        let report = b.build(t0 + ms(50), &facts);
        assert_eq!(
            report,
            Control::Report {
                train_kbps: 2_500,
                seq: 1,
                received: 123_456,
                rejected: 3,
                socket_drops: 9,
                interval_us: 50_000,
                bytes: 8000,
                datagrams: 8,
                lost: 2,
                drops: 2,
                queue_delay_us: 300,
                queue_fill: 1000,
                lateness_us: 250,
                disk_wait_us: 0,
                disk_fill: 0,
            }
        );
        assert_eq!(b.interval_start(), t0 + ms(50));
        // The next 50 ms: one of the missing two arrives late, nothing new is lost; a block
        // waited 2 ms for the writer, which counts as queueing; nothing admitted means no
        // delay samples.
        let late = ReportFacts {
            totals: Tally {
                datagrams: 19,
                bytes: 19_000,
                ..facts.totals
            },
            held_us: 2000,
            queue_fill_permille: 10,
            disk_fill_permille: 10,
            ..facts
        };
        let Control::Report {
            interval_us,
            bytes,
            datagrams,
            lost,
            drops,
            queue_delay_us,
            queue_fill,
            disk_wait_us,
            disk_fill,
            ..
        } = b.build(t0 + ms(100), &late)
        else {
            panic!("not a report");
        };
        assert_eq!((interval_us, bytes, datagrams), (50_000, 1000, 1));
        assert_eq!((lost, drops, queue_delay_us, queue_fill), (0, 0, 2000, 10));
        assert_eq!(
            (disk_wait_us, disk_fill),
            (2000, 10),
            "the writer's share, apart"
        );
        // A clock that went backwards is an empty interval, not a panic.
        let Control::Report { interval_us, .. } = b.build(t0, &late) else {
            panic!("not a report");
        };
        assert_eq!(interval_us, 0);
    }

    /// Two channels at 100 and 50 bytes per ms by the kernel's times, read in lumps: the
    /// report's interval is the one their bytes came over at their summed rate, whatever the
    /// report loop's tick; spans too short to time, a first report and a silent channel's
    /// place are handled as documented.
    #[test]
    fn arrival_interval_times_bytes_by_when_they_came() {
        let mark = |bytes, at_us| ArrivalMark { bytes, at_us };
        let ms = Duration::from_millis;
        // Channel 0: 4000 bytes over 40 ms (read late: the tick says 25 ms); channel 1: 1000
        // bytes over 20 ms. 150 bytes/ms together: 5000 bytes over 33.3 ms.
        let before = [mark(10_000, 100_000), mark(5_000, 120_000)];
        let after = [mark(14_000, 140_000), mark(6_000, 140_000)];
        assert_eq!(
            arrival_interval(&before, &after, ms(25)),
            Some(Duration::from_micros(33_333))
        );
        // A channel that got nothing is no part of it.
        let idle = [mark(14_000, 140_000), mark(5_000, 120_000)];
        assert_eq!(arrival_interval(&before, &idle, ms(25)), Some(ms(40)));
        // Nothing arrived; a channel with no mark before; a span under a quarter of the tick.
        assert_eq!(arrival_interval(&before, &before, ms(25)), None);
        let first = [mark(0, 0), mark(5_000, 120_000)];
        assert_eq!(arrival_interval(&first, &after, ms(25)), None);
        let burst = [mark(14_000, 105_000), mark(5_000, 120_000)];
        assert_eq!(arrival_interval(&before, &burst, ms(25)), None);
        assert_eq!(arrival_interval(&before, &burst, ms(16)), Some(ms(5)));
        // Marks that went backwards (a driver's mistake) time nothing.
        assert_eq!(arrival_interval(&after, &before, ms(25)), None);
    }

    #[test]
    fn a_report_takes_the_interval_its_bytes_arrived_over() {
        let t0 = Instant::now();
        let mut b = ReportBuilder::new(t0, Tally::default(), 0);
        let facts = ReportFacts {
            train_kbps: 0,
            totals: Tally {
                datagrams: 10,
                bytes: 10_000,
                ..Tally::default()
            },
            received: 0,
            socket_drops: 0,
            queue_fill_permille: 0,
            held_us: 0,
            lateness: Duration::ZERO,
            disk_fill_permille: 0,
            arrived_over: Some(Duration::from_millis(38)),
        };
        let Control::Report { interval_us, .. } = b.build(t0 + Duration::from_millis(50), &facts)
        else {
            panic!("not a report");
        };
        assert_eq!(interval_us, 38_000);
        assert_eq!(b.interval_start(), t0 + Duration::from_millis(50));
    }

    #[test]
    fn a_receiver_reading_behind_reports_the_rate_it_read_at() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = ReportBuilder::new(t0, Tally::default(), 0);
        let facts = |bytes: u64, fill: u64, arrived: u64| ReportFacts {
            totals: Tally {
                datagrams: bytes / 1000,
                bytes,
                ..Tally::default()
            },
            queue_fill_permille: fill,
            arrived_over: Some(ms(arrived)),
            ..ReportFacts::default()
        };
        let interval = |c: Control| match c {
            Control::Report { interval_us, .. } => interval_us,
            _ => panic!("not a report"),
        };
        // Buffers under a quarter full: the bytes are timed by when they arrived.
        assert_eq!(
            interval(b.build(t0 + ms(10), &facts(10_000, 249, 8))),
            8_000
        );
        // Filling (a reader slower than the arrivals): by the report's own time, however
        // short or long a span they arrived over.
        assert_eq!(
            interval(b.build(t0 + ms(20), &facts(20_000, 250, 6))),
            10_000
        );
        assert_eq!(
            interval(b.build(t0 + ms(30), &facts(30_000, 900, 25))),
            10_000
        );
        // Without arrival times, always the report's own time.
        let mut none = facts(40_000, 0, 0);
        none.arrived_over = None;
        assert_eq!(interval(b.build(t0 + ms(45), &none)), 15_000);
    }
}
