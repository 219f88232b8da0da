//! `auto` rate control: a model of the path, in the spirit of BBR but in rates, for a receiver
//! that reports what it got (see [`super::Feedback`]) rather than acknowledging each datagram.
//!
//! # The model
//!
//! - **Bottleneck rate**: the windowed maximum, over the last [`BW_WINDOW_ROUNDS`] rounds, of
//!   each report's *delivery sample*: what the receiver got over the report's interval (the
//!   time its bytes arrived over, by the kernel's times where the receiver has them: see
//!   [`crate::admit::arrival_interval`]; while the receiver's buffers are over a quarter
//!   full, the time it read them over: [`crate::admit::ReportBuilder::build`]), with the
//!   share of datagrams that random loss
//!   explains added back (the loss floor, see
//!   [`super::RateController`]), since the sender has to send those too. A round is one
//!   round-trip time (or one report interval, where that is longer). A report that delivered
//!   little while losing most datagrams without a long queue (an outage) is not a sample, and
//!   rounds in which the sender had little to send do not age the maximum: after a blackout or
//!   a stall the rate returns to the remembered bottleneck at once. (The same through a queue
//!   over twice the target is a path slowed to a trickle: congestion.)
//! - **The bottleneck's rate by dispersion** (startup only): the median of the latest
//!   reports' train estimates ([`super::dispersion`]: how far apart datagrams the sender put
//!   on the wire back to back arrived). It is known from the first round trip's reports, long
//!   before startup's rate reaches it; startup grows to it and no further, as a resumed one
//!   does to its memory (below), instead of passing the path twofold for the round trip and
//!   more that its congestion signals lag (on intercontinental that surplus is 9 MB, twice its
//!   4 MiB queue, dropped). Once the latest three estimates agree (within [`TRAINS_AGREE`]),
//!   startup goes to their rate at once instead of doubling towards it: on intercontinental
//!   that is the path a round trip and three report intervals in, 260 ms, where doubling from
//!   100 Mbit/s took 375 ms. It does so once, and to no more than [`MAX_JUMP`] times what was
//!   delivered: behind a token bucket the trains measure the line's rate and agree, and a jump
//!   per report passed a 300 Mbit/s path fourfold. An
//!   estimate too high changes little (startup ends as it would have, from a higher step).
//!   Estimates that disagree (the latest three more than [`TRAINS_AGREE`] apart: jitter that
//!   holds a train's datagrams back and lets them go together spreads them, mostly low) are
//!   a floor, not the path's rate: once startup reached their median it grows past it by
//!   [`STARTUP_PAST_TRAINS_GAIN`] (1.3) a round until its usual exits end it, instead of
//!   leaving the rest to probing (on linkem's `jittery` path, medians of 211-252 Mbit/s of
//!   500, and 1.8 s to reach 90% of the path by probes).
//! - **Low rates**: a report of fewer than [`MIN_SAMPLE_DATAGRAMS`] is pooled with the next
//!   until they hold that many, timed over the reports' time (at 1 Mbit/s a 10 ms report
//!   holds one datagram, and without pooling no report was a sample, so a model cut to the
//!   floor never left it). A small sample is held to what was sent rather than thrown away
//!   when it shows more ([`FEW_DATAGRAMS`]), and a probe adds at least [`PROBE_DATAGRAMS`] to
//!   a sample, lasting two samples' time where that is more than its usual step.
//! - **Queueing**: the receiver's mean one-way delay above the lowest seen. The model keeps it
//!   under [`queue_target`] (larger of 15 ms and an eighth of the RTT, plus twice the
//!   receiver's timer lateness: how far a receiver that runs in lumps moved it when it timed
//!   datagrams on reading, and, now that it uses the kernel's arrival times, a stand-in for
//!   how far both ends' scheduling lumps move it on a busy machine).
//! - **A reserve of queue**: cruising keeps a little queue standing ([`stall_reserve`]: a third
//!   of the target, at most [`STALL_RESERVE`], and up to twice that), so that the bottleneck
//!   keeps sending from it while the sender's threads are preempted, instead of idling (on a
//!   busy 2-core machine they pause for 3-37 ms a few times a second, and each pause with an
//!   empty queue is link time lost). Not while the receiver's buffers are over a quarter
//!   full: a receiver that is the bottleneck would hold the reserve, and fall behind.
//! - **Shallow buffers**: a loss judged congestion while the queueing delay was under what
//!   cruising keeps standing (twice the reserve) means the bottleneck's buffer overflows
//!   before the delay says anything ([`Model::shallow`]); from then on cruising keeps no
//!   reserve and drains over a third of the target, and the pacers repay nothing of a stalled
//!   sender's missed time (see [`super::RateController::catch_up`]), which such a buffer would
//!   drop.
//!
//! - **Startup's long trains**: while startup lasts, each channel sends trains of up to 64 KiB
//!   back to back ([`super::RateController::train_bytes`]: a sixteenth of the round trip at
//!   the channel's rate, doubled for each report that had no estimate), so that a receiver
//!   behind GRO (which timestamps what arrived in each ~100 µs once) can time the bottleneck
//!   over trains that span several of its buffers ([`super::dispersion`]). A report then
//!   counts a train more or less than its share, so startup takes a sample for a receiver
//!   catching up only at [`STARTUP_CATCHING_UP`] over what was sent (1.05 past startup), and
//!   its queue exit allows for the trains' own queue.
//! - **The receiver's start**: from the first report that counts datagrams, the reports that
//!   show the receiver reading behind (its buffers a quarter full or more, or dropping), up
//!   to [`RECEIVER_START_REPORTS`], are no samples and end nothing: a receiver that read its
//!   first datagrams late reads a whole socket buffer at once, and such a report times its
//!   bytes over the stall ([`Model::on_report`]).
//!
//! # States
//!
//! | state | pacing rate | leaves when | to |
//! |---|---|---|---|
//! | `Startup` | [`startup_gain`] x bottleneck (about 2.2: doubles per round trip, allowing for the report's lag), but no more than the rate the receiver's trains measure ([`Model::train_rate`]) or a resumed startup remembers; that rate at once (up to [`MAX_JUMP`] x bottleneck, once) when the latest three train estimates agree; once a round's sample reached [`RESUMED_SHARE`] of the trains' rate while they disagree, [`STARTUP_PAST_TRAINS_GAIN`] x bottleneck, with no bound | a round's sample reached [`RESUMED_SHARE`] of the remembered rate, or of the trains' while they agree (to `Cruise`, at the sample); the bottleneck grew less than 25% in 3 rounds; or a queue over the target, or [`STARTUP_RISE`] over the lowest delay (and over the queue the channels' own trains make where they meet, [`Signals::trains_bits`] over the path's rate) in two reports in a row; or the receiver falls behind (socket drops, buffer over half full); or loss beyond the floor | `Drain` (at 0.75) |
//! | `Drain` | 0.75 x bottleneck after startup (0.9 if the receiver fell behind), 0.9 after a correction | the queue is under half the target and the receiver keeps up, judged only on reports of data sent since the drain began; or after 6 rounds | `Cruise` |
//! | `Cruise` | 1.0 x bottleneck; [`CRUISE_FILL_GAIN`] (1.03) while the queue is under the reserve, 0.95 while it is over twice the reserve ([`Model::cruise_band`]; on a shallow buffer no reserve, and 0.95 over a third of the target) | [`CRUISE_ROUNDS`] rounds passed, and the receiver has room (its buffers under a quarter full, no drops) | `ProbeUp` |
//! | `ProbeUp` | (1 + [`PROBE_STEP`] x 2^k) x bottleneck, for one report interval; at low rates at least [`PROBE_DATAGRAMS`] more per sample, for two samples' time | that passed | `ProbeDown` |
//! | `ProbeDown` | 0.9 x bottleneck, for as long as the probe lasted (its surplus drains) | that passed | `ProbeWait` |
//! | `ProbeWait` | as `Cruise` | the probe's data has been reported (a round trip, the probe's length and a sample's span after it began) | if the bottleneck rose by half the probe's step or more, and the receiver kept up (its buffers stayed under a quarter full, without drops, from the probe's start; else the probe's samples are taken back: they time the bytes by when they arrived, which a receiver's buffers take faster than it reads): `Cruise` at the bottleneck from before the latest corrections, if they cut it by more than a fifth within [`BW_WINDOW_ROUNDS`] rounds (the dip was a moment's), else `ProbeUp` with k + 1 (the path got faster: probe again, with a doubled step; but k stays 0 for the first [`DAMPED_PROBES`] probes after the receiver fell behind); else `Cruise`, k = 0 |
//!
//! In every state but `Startup`, **congestion** corrects the model: a queue over the target in
//! two reports in a row or loss beyond the floor sets the bottleneck to the lower of the last
//! two samples (what the path takes now), and a receiver that falls behind in two reports in a
//! row to what it read over the reports that showed it; then the model drains (`Drain`). One
//! report's socket-drop burst or delay swing (a receiver's CPU hiccup, jitter) changes
//! nothing. The receiver is judged in time, not by one report's buffer fill: a report counts
//! it behind when its buffers dropped, or are over half full while it read less than
//! [`KEEPS_UP`] of what was sent over the report (a fuller buffer it reads at the rate is one
//! scheduling gap's backlog, which does not grow); what was sent is the rate in force times
//! the share of it that reached the receiver by the latest report timed by its arrivals (at
//! least [`LEAST_SENT_SHARE`]: a sender late on a busy machine sends less than its rate).
//! Reports that describe data sent before the last correction or drain (one round trip and an
//! interval) are not judged, and their loss does not count in a later round's. Random loss
//! that the floor explains is never congestion: it costs only the lost bytes. While cruising
//! or draining the floor allows for
//! loss in bursts ([`super::LossFloor::dispersion`]); in startup and a probe, which send above
//! the path on purpose, loss is judged against independent counts. A correction remembers the bottleneck it cut
//! from: after a cut of more than a fifth, a path that takes a probe again within
//! [`BW_WINDOW_ROUNDS`] rounds gets it back at once (a dip of a moment costs a few round trips, not a climb of many probe steps), and a
//! path that did slow down does not take the probe.
//!
//! A **resumed** startup ([`Model::resume`], a path seen before: see [`super::PathMemory`])
//! starts at half the bottleneck remembered and grows as any startup does, but to no more than
//! that bottleneck (or the trains' rate, if lower); once a round's sample reaches
//! [`RESUMED_SHARE`] of it, the path is as it was and the model goes to `Cruise` at the sample
//! (no overshoot to drain). A path slower
//! than remembered ends startup as a cold one does (its queue or its stalled growth).
//!
//! The gains stay within 10% of the bottleneck once startup is over, so a settled transfer's
//! rate moves within that band; a path that got faster is found by the doubling probe step.

use super::{Feedback, Reason};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Rounds over which the bottleneck's maximum is kept.
pub const BW_WINDOW_ROUNDS: u64 = 10;
/// Rounds of cruising between probes.
pub const CRUISE_ROUNDS: u64 = 2;
/// Startup ends when the bottleneck grew less than this factor...
const FULL_GROWTH: f64 = 1.25;
/// ... for this many rounds in a row.
const FULL_ROUNDS: u32 = 3;
/// Pacing gain while draining startup's queue.
const STARTUP_DRAIN_GAIN: f64 = 0.75;
/// Pacing gain while draining after a correction, and after a probe.
const DRAIN_GAIN: f64 = 0.9;
/// Pacing gain while cruising with a queue over its band ([`Model::cruise_band`]).
const CRUISE_DRAIN_GAIN: f64 = 0.95;
/// Pacing gain while cruising with a queue under its band: the reserve builds in a round trip
/// or two (3% of 150 ms is 4.5 ms of queue per round trip).
pub const CRUISE_FILL_GAIN: f64 = 1.03;
/// The first probe's step above the bottleneck; it doubles with each probe the path takes.
pub const PROBE_STEP: f64 = 0.08;
/// A probe adds at least this many datagrams to a sample (twice as many once the path took
/// one): the sender sends in runs of a few, and a probe smaller than a run or two is lost in
/// which runs a sample happens to hold.
pub const PROBE_DATAGRAMS: u64 = 8;
/// Most doublings of the probe step (8 x: 64% above the bottleneck).
const MAX_PROBE_DOUBLINGS: u32 = 3;
/// After a receiver fell behind (a `Backlog` or `SocketDrops` correction), this many probes
/// keep the first step ([`PROBE_STEP`]): a receiver that read less than was sent has told
/// the model its rate, and a doubled step (16%, 32% above it) only fills its buffers again
/// (on loopback, 1 GiB auto on 2 cores, the probes after each such cut pushed the rate to
/// 13.5 Gbit/s, over the 11-12 the receiver reads, and it was cut again). A path or a
/// receiver that got faster is still found, a step at a time, then doubling again.
pub const DAMPED_PROBES: u32 = 3;
/// A correction that left the bottleneck below this share of what it was is restored when a
/// probe soon after shows the path takes more (see the state table).
const RESTORE_AFTER_CUT: f64 = 0.8;
/// Most rounds spent draining (startup's queue can be a few round trips' worth at 0.75).
const MAX_DRAIN_ROUNDS: u32 = 6;
/// A report with fewer datagrams than this is no delivery sample on its own (too few to time,
/// and over a few channels, some of which got none in it, the receiver's arrival interval
/// misses their share): such reports are pooled until they hold this many.
pub const MIN_SAMPLE_DATAGRAMS: u64 = 8;
/// A delivery sample of fewer datagrams than this is not taken for a receiver catching up when
/// it delivered more than was sent: it holds a whole run of the sender's more or less than its
/// share, and is held to what was sent like any other sample.
pub const FEW_DATAGRAMS: u64 = 32;
/// Most reports taken for the receiver's start (see the module docs): a receiver still behind
/// after them is behind.
pub const RECEIVER_START_REPORTS: u32 = 3;
/// Startup ends when two reports in a row show a queue this much above the lowest delay it saw.
pub const STARTUP_RISE: Duration = Duration::from_millis(1);
/// A resumed startup ends once a sample reaches this share of the bottleneck remembered.
pub const RESUMED_SHARE: f64 = 0.9;

/// The queueing delay `auto` keeps under: the larger of 15 ms and an eighth of the RTT.
pub fn queue_target(rtt: Duration) -> Duration {
    Duration::from_millis(15).max(rtt / 8)
}

/// The queueing delay over which cruising drains gently on a shallow buffer (a third of the
/// `target`), and under which it builds its reserve on any other ([`stall_reserve`]).
fn cruise_queue(target: Duration) -> Duration {
    target / 3
}

/// The most queue cruising keeps standing as its reserve against a stalled sender (see
/// [`stall_reserve`]).
pub const STALL_RESERVE: Duration = Duration::from_millis(10);

/// The queue cruising keeps standing where the buffer is not known to be shallow: a third of
/// the `target`, at most [`STALL_RESERVE`]. While the sender is stalled (a channel thread
/// preempted for a few to tens of milliseconds on a busy machine), the bottleneck keeps
/// sending from it instead of idling: on the 2-core test VM the link idled 3.6% of a transfer
/// over intercontinental with the queue at 0.5-6 ms, each dip in delivery a round trip after
/// a channel thread paused for 3-37 ms (10 or more in three of four). Stalls are a matter of the sender's CPU, not of the path,
/// so the reserve does not grow with the round trip (a third of the satellite path's target
/// is 25 ms).
pub fn stall_reserve(target: Duration) -> Duration {
    cruise_queue(target).min(STALL_RESERVE)
}

/// The queue cruising keeps on a buffer not known to be shallow, `(fill under, drain over)`:
/// from [`stall_reserve`] to twice it.
fn reserve_band(target: Duration) -> (Duration, Duration) {
    let reserve = stall_reserve(target);
    (reserve, 2 * reserve)
}

/// Startup's pacing gain over the bottleneck: a report describes data sent about one round
/// trip plus half a report interval ago, so to double per round trip the rate is set to
/// `2^(lag / round)` times it; at least 2 (a round is a report interval on short paths) and at
/// most 2.5.
pub fn startup_gain(rtt: Duration, interval: Duration) -> f64 {
    let round = rtt.max(interval).as_secs_f64().max(1e-6);
    let lag = (rtt + interval / 2).as_secs_f64();
    2f64.powf(lag / round).clamp(2.0, 2.5)
}

/// A sample this far above what was sent is a receiver catching up after a stall: neither its
/// rate nor its delay says anything of the path.
pub const CATCHING_UP: f64 = 1.05;
/// ... in startup, whose long trains make reports lumpy.
pub const STARTUP_CATCHING_UP: f64 = 1.5;
/// A report whose receiver read at least this share of what was sent over it (the highest
/// rate in force while its data left, times the share of its rate the sender got out lately;
/// datagrams lost on the path counted as read, those its own socket dropped not), without
/// socket drops,
/// kept up: however full its buffer got, its backlog did not grow over the report
/// ([`Model::on_report`]: a scheduling gap, not a slow reader). The margin is the
/// measurement's only. A wider one (0.95, for a sender that falls short of its rate on a busy
/// machine) let backlogs over half the buffer stand, and the next gap overflowed them: on
/// veth 1500 and loopback, auto, twice the socket-drop cuts, and 1.2-1.6% resent against
/// 0.1-0.7%.
pub const KEEPS_UP: f64 = 0.99;
/// The least share of its pacing rate a sender is taken to get out ([`Model::on_report`]'s
/// judgement of the receiver, against what was sent): a report timed by its arrivals that
/// shows less (a path slower than the rate, a startup far above it) is no measure of the
/// sender's shortfall alone, and a receiver judged against too little is never behind.
pub const LEAST_SENT_SHARE: f64 = 0.75;

/// Train estimates startup keeps (the latest reports'); it goes by their median.
const TRAIN_HINTS: usize = 5;
/// Train estimates startup needs before it goes by them.
const MIN_TRAIN_HINTS: usize = 3;
/// Startup goes to the trains' rate at once, instead of doubling towards it, once the latest
/// three estimates agree: the highest no more than this factor above the lowest.
pub const TRAINS_AGREE: f64 = 1.25;
/// ... but to no more than this many times the bottleneck sample at once (an estimate from
/// lumps the receiver's NIC or an emulator made is no measure of the path).
pub const MAX_JUMP: f64 = 5.0;
/// Startup's pacing gain over the bottleneck once it reached the trains' rate while their
/// latest estimates disagree (jitter spread them: [`Model::train_rate`] is then a floor, not
/// the path's rate). Gentle, so that the round trip and two reports its queue signal lags
/// queue no more than 0.3 x that long at the path's rate (on intercontinental 2.7 MB of its
/// 4 MiB). On linkem's `jittery` path (500 Mbit/s) the estimates' median is 211-252 Mbit/s;
/// growing from there reached the path about 1.1-1.3 s into the transfer, where probing from
/// there reached it about 2.4-2.6 s in.
pub const STARTUP_PAST_TRAINS_GAIN: f64 = 1.3;

/// A run of reports in a row that showed the receiver falling behind, and what it read over
/// them.
#[derive(Debug, Clone, Copy)]
struct Behind {
    /// When the run's first report came.
    since: Instant,
    /// Its reports so far.
    reports: u32,
    /// The bytes they counted, and the time they were counted over.
    bytes: u64,
    time: Duration,
}

impl Behind {
    /// What the receiver read over the run, bits per second.
    fn read_bps(&self) -> Option<f64> {
        let bps = self.bytes as f64 * 8.0 / self.time.as_secs_f64();
        (bps.is_finite() && bps > 0.0).then_some(bps)
    }
}

/// Reports too small to time on their own ([`MIN_SAMPLE_DATAGRAMS`]), pooled into one
/// delivery sample over the time they were reported in. At a low rate (1 Mbit/s is one datagram
/// per 10 ms report) no report is a sample, and without pooling the model never saw one: after
/// a competitor had cut it to the floor it stayed there, probing in vain, long after the path
/// was free again.
#[derive(Debug, Clone, Copy, Default)]
struct Pool {
    /// When the report before the pool's first one came: its datagrams arrived since.
    since: Option<Instant>,
    bytes: u64,
    datagrams: u64,
    lost: u64,
}

/// One delivery sample's raw numbers: a report's, or a [`Pool`]'s.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    /// The time its datagrams arrived over: the report's interval, or, pooled, the time
    /// between the reports that bound them (the receiver's arrival intervals of sparse reports
    /// do not add up to it).
    interval: Duration,
    bytes: u64,
    datagrams: u64,
    lost: u64,
}

/// What [`Model::sample`] makes of a [`Delivery`].
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// The delivery sample, bits per second.
    bps: f64,
    /// The receiver delivered clearly more than was sent: it was catching up after a stall.
    catching_up: bool,
    /// The sender was sending: delivered at least half the rate (a round in which it was not
    /// does not age the maximum).
    sending: bool,
}

/// Where the model is (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Finding the bottleneck: the rate roughly doubles per round trip.
    Startup,
    /// Emptying the queue startup or a correction built.
    Drain,
    /// Pacing at the bottleneck.
    Cruise,
    /// Sending a little more for one report interval, to see whether the path takes it.
    ProbeUp,
    /// Draining what the probe queued.
    ProbeDown,
    /// Waiting for the probe's data to be reported.
    ProbeWait,
}

/// What the controller knows beyond the report itself.
#[derive(Debug, Clone, Copy)]
pub struct Signals {
    /// The random loss earlier reports explain (see [`super::RateController`]); `None` before
    /// any.
    pub floor: Option<super::LossFloor>,
    /// How far the queueing delay moves without any queue (twice the receiver's lateness).
    pub noise: Duration,
    /// The bits the sender's channels send back to back at once, together, while startup
    /// lasts (their trains: [`super::RateController::train_bytes`]); 0 past it.
    pub trains_bits: f64,
}

/// The `auto` controller's path model and state.
#[derive(Debug, Clone)]
pub struct Model {
    phase: Phase,
    rtt: Duration,
    /// Per round, the highest delivery sample: (round, bits per second).
    bw_rounds: VecDeque<(u64, f64)>,
    /// The samples of the last two reports, newest last: what the path delivered while it
    /// showed congestion.
    recent: VecDeque<f64>,
    /// The pacing rates of the last round trip and a few intervals: (until when, bits per
    /// second), a step function. Nothing can be delivered faster than it was sent, so a
    /// receiver's catch-up after a stall is no sample above them.
    sent: VecDeque<(Instant, f64)>,
    /// Datagrams lost on the path and seen, in the reports of the last round: (when, lost,
    /// seen). Loss is judged over a round, where a datagram that one report counted as lost
    /// (reordered) is counted as received by the next.
    round_loss: VecDeque<(Instant, u64, u64)>,
    /// Socket drops at the receiver not yet matched by gaps in the packet numbers.
    drops: super::ReceiverDrops,
    /// Startup: the lowest queueing delay reported (jitter, not a queue).
    startup_delay_floor: Option<Duration>,
    /// Startup: reports in a row whose queueing delay was over [`STARTUP_RISE`] above the
    /// floor.
    startup_rising: u32,
    round: u64,
    round_start: Instant,
    phase_round: u64,
    /// Startup: the bottleneck when it last grew by [`FULL_GROWTH`], and rounds since.
    full_bw: f64,
    full_rounds: u32,
    full_round: u64,
    /// The bottleneck before the current probe, when it began, its gain, and its step's
    /// doublings.
    probe_base: f64,
    probe: f64,
    probe_len: Duration,
    probe_start: Instant,
    probe_doublings: u32,
    /// What share of its pacing rate reached the receiver, by the latest report timed by its
    /// arrivals (buffers under [`crate::admit::READING_BEHIND_PERMILLE`], no drops), within
    /// [`LEAST_SENT_SHARE`] and 1: a sender late on a busy machine sends less than its rate,
    /// and the receiver is judged against what it was sent.
    sent_share: f64,
    /// Probes still to keep the first step after the receiver fell behind
    /// ([`DAMPED_PROBES`]).
    damped_probes: u32,
    /// The receiver's buffers filled past a quarter (or dropped) since the current probe
    /// began: a probe the receiver took into its buffers without keeping up with it shows the
    /// rate it arrived at, not a path or a receiver that takes more.
    probe_buffered: bool,
    /// When the current state began.
    phase_start: Instant,
    /// The pacing gain of the current drain.
    drain_gain: f64,
    /// Reports before this describe data sent before the last correction or drain.
    judge_after: Instant,
    /// The bottleneck before the first of the latest corrections, and the round it was cut
    /// in: restored when a probe shows the path takes more again within
    /// [`BW_WINDOW_ROUNDS`] rounds (the dip was a moment's).
    cut_from: Option<(u64, f64)>,
    /// Since when the reports have shown a queue over the target, and the receiver falling
    /// behind (with how many reports in a row).
    queue_since: Option<Instant>,
    behind_since: Option<Behind>,
    /// A resumed startup: the bottleneck an earlier transfer found on this path.
    resumed: Option<f64>,
    /// Startup: the bottleneck's rate by the receiver's trains in the latest reports that had
    /// one (see [`Model::train_rate`]).
    train_hints: VecDeque<f64>,
    /// Startup has gone to the trains' rate at once: it does so once only.
    jumped: bool,
    /// Startup reached the trains' rate while their estimates disagreed, and grows past it
    /// gently ([`STARTUP_PAST_TRAINS_GAIN`]) until its usual exits.
    past_trains: bool,
    /// Reports too small to be a sample on their own, so far.
    pool: Pool,
    /// When the latest report came.
    last_report: Option<Instant>,
    /// The time the latest delivery sample spanned: a report interval, or longer when
    /// reports were pooled (a probe lasts as long, to be seen in one); and its datagrams.
    sample_span: Duration,
    sample_datagrams: u64,
    /// The path dropped for congestion while its queue was under the third of the target
    /// that cruising drains at: its buffer is shallow ([`Model::shallow`]).
    shallow: bool,
    /// The receiver's start is over (see [`Model::receiver_start`]), and how many reports
    /// it took so far.
    receiver_started: bool,
    start_reports: u32,
}

impl Model {
    /// A model with nothing learnt yet, at `now`.
    pub fn new(rtt: Duration, now: Instant) -> Model {
        Model {
            phase: Phase::Startup,
            rtt,
            bw_rounds: VecDeque::new(),
            recent: VecDeque::new(),
            sent: VecDeque::new(),
            round_loss: VecDeque::new(),
            drops: super::ReceiverDrops::default(),
            startup_delay_floor: None,
            startup_rising: 0,
            round: 0,
            round_start: now,
            phase_round: 0,
            full_bw: 0.0,
            full_rounds: 0,
            full_round: 0,
            probe_base: 0.0,
            probe: 1.0,
            probe_len: Duration::ZERO,
            probe_start: now,
            probe_doublings: 0,
            damped_probes: 0,
            sent_share: 1.0,
            probe_buffered: false,
            phase_start: now,
            drain_gain: STARTUP_DRAIN_GAIN,
            judge_after: now,
            cut_from: None,
            queue_since: None,
            behind_since: None,
            resumed: None,
            train_hints: VecDeque::new(),
            jumped: false,
            past_trains: false,
            pool: Pool::default(),
            last_report: None,
            sample_span: Duration::ZERO,
            sample_datagrams: 0,
            shallow: false,
            receiver_started: false,
            start_reports: 0,
        }
    }

    /// Whether `fb`, a report in startup, is one of the receiver's start: from the first
    /// report that counts datagrams, those that show the receiver reading behind (its buffers
    /// a quarter full or more, or dropping), at most [`RECEIVER_START_REPORTS`]; the first
    /// that does not ends the start. They describe how the receiver started, not its pace or
    /// the path's. A receiver that got its first datagrams late (its threads not yet
    /// scheduled, a page fault or an allocation at the first read) reads a whole socket buffer
    /// at once, and a report that reads behind is timed by its reads
    /// ([`crate::admit::READING_BEHIND_PERMILLE`]) over an interval that holds the stall: in
    /// `hurtle demo` on loopback, one round in ten resumed at 7.2 Gbit/s, got a first report
    /// of 1.3 Gbit/s with the buffers over half full, ended startup on it with a bottleneck of
    /// 1.3 Gbit/s, and took 2.3 s of probes to get back to 8; on a busy machine the start
    /// spans two or three reports (0.6, 3.2 and 10.4 Gbit/s read, the buffers 37, 58 and 82%
    /// full, then 3%). Such reports are no samples and end nothing; a receiver that stays
    /// behind past them ends startup as before.
    fn receiver_start(&mut self, fb: &Feedback) -> bool {
        if self.receiver_started || fb.datagrams == 0 {
            return false;
        }
        let reading_behind = fb.socket_drops > 0
            || fb.queue_fill * 1000.0 >= crate::admit::READING_BEHIND_PERMILLE as f64;
        if self.phase != Phase::Startup
            || !reading_behind
            || self.start_reports >= RECEIVER_START_REPORTS
        {
            self.receiver_started = true;
            return false;
        }
        self.start_reports += 1;
        true
    }

    /// Whether the path's buffer has shown itself shallow: a loss beyond the floor, judged
    /// congestion, while the queueing delay was under a third of the target (where cruising
    /// starts to drain a queue). Such a buffer overflows before the delay says anything, and
    /// a stalled sender's catch-up (up to [`crate::channel_send::MAX_OWED`] of data at once into the
    /// queue) is enough: the controller has the pacers repay nothing there
    /// ([`super::RateController::catch_up`]).
    pub fn shallow(&self) -> bool {
        self.shallow
    }

    /// Notes a loss judged congestion at queueing delay `queue`, against the `target`: below
    /// the queue cruising drains at on a buffer not known to be shallow, the buffer is
    /// shallow ([`Model::shallow`]): it does not hold what cruising keeps standing.
    fn note_congestion_loss(&mut self, queue: Duration, target: Duration) {
        self.shallow |= queue < reserve_band(target).1;
    }

    /// The queue cruising keeps, `(fill under, drain over)`, against the `target`: on a buffer
    /// not known to be shallow, from [`stall_reserve`] to twice it; on a shallow one, from
    /// nothing to a third of the target.
    pub fn cruise_band(&self, target: Duration) -> (Duration, Duration) {
        if self.shallow {
            (Duration::ZERO, cruise_queue(target))
        } else {
            reserve_band(target)
        }
    }

    /// The bottleneck's rate by the receiver's trains, as startup goes by it: the median (the
    /// lower middle) of the latest five reports' estimates, once there are three.
    pub fn train_rate(&self) -> Option<f64> {
        if self.train_hints.len() < MIN_TRAIN_HINTS {
            return None;
        }
        let mut hints: Vec<f64> = self.train_hints.iter().copied().collect();
        hints.sort_by(f64::total_cmp);
        Some(hints[(hints.len() - 1) / 2])
    }

    /// Whether the latest [`MIN_TRAIN_HINTS`] train estimates agree within [`TRAINS_AGREE`]:
    /// several reports' medians of several trains each that say the same are trusted enough
    /// for startup to go to their rate at once.
    fn trains_agree(&self) -> bool {
        let n = self.train_hints.len();
        if n < MIN_TRAIN_HINTS {
            return false;
        }
        let latest = self.train_hints.iter().skip(n - MIN_TRAIN_HINTS).copied();
        let (lo, hi) = latest.fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(r), hi.max(r)));
        hi <= lo * TRAINS_AGREE
    }

    /// Makes startup a resumed one: growing to no more than `bottleneck_bps`, an earlier
    /// transfer's bottleneck on this path (see the module docs).
    pub fn resume(&mut self, bottleneck_bps: f64) {
        if self.phase == Phase::Startup && bottleneck_bps.is_finite() && bottleneck_bps > 0.0 {
            self.resumed = Some(bottleneck_bps);
        }
    }

    /// The bottleneck a later transfer on this path should resume from: the model's, or, if
    /// the latest corrections cut it by more than a fifth within [`BW_WINDOW_ROUNDS`] rounds
    /// and no probe since showed the path does not take it back, what it was before them. (A
    /// transfer's end often cuts it: as the channels run out of new data the samples fall, and
    /// its repairs and parity burst into a short queue; remembering that cut, the next transfer
    /// started from half the path's rate and climbed back by probing.)
    pub fn bottleneck_to_remember(&self) -> Option<f64> {
        let bw = self.bottleneck_bps()?;
        Some(self.cut_before(bw).unwrap_or(bw))
    }

    /// Takes `rtt` as the path's round trip from now on ([`super::RateController::set_rtt`]).
    pub fn set_rtt(&mut self, rtt: Duration) {
        self.rtt = rtt;
    }

    /// The round trip the model goes by.
    pub fn rtt(&self) -> Duration {
        self.rtt
    }

    /// The current state.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The bottleneck rate as the model has it, bits per second (`None` before any sample).
    pub fn bottleneck_bps(&self) -> Option<f64> {
        self.bw_rounds.iter().map(|r| r.1).reduce(f64::max)
    }

    fn enter(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.phase_round = self.round;
        self.phase_start = now;
    }

    /// The probe step now: [`PROBE_STEP`], doubled for each probe in a row the path took; but
    /// at least [`PROBE_DATAGRAMS`] more than the latest sample's datagrams (at a low rate a
    /// sample holds a few of the sender's runs, and a step of a run or less does not show).
    fn probe_gain(&self) -> f64 {
        1.0 + self.probe_step().max(self.visible_step())
    }

    /// [`PROBE_STEP`], doubled for each probe in a row the path took.
    fn probe_step(&self) -> f64 {
        PROBE_STEP * f64::from(1u32 << self.probe_doublings)
    }

    /// The step that adds [`PROBE_DATAGRAMS`] to the latest sample (twice as many once the
    /// path took a probe).
    fn visible_step(&self) -> f64 {
        let more = if self.probe_doublings > 0 { 2.0 } else { 1.0 };
        more * PROBE_DATAGRAMS as f64 / self.sample_datagrams.max(1) as f64
    }

    /// Starts a probe from the bottleneck `bw`, at `now`, with reports every `interval`;
    /// returns its rate. It lasts a report interval; two samples' time where a sample is a
    /// few runs of the sender's (pooled reports, or a rate so low that the probe's step is
    /// sized to show in one), so that one sample holds nothing else: a probe's data shared by
    /// two reports shows half its step in each, and the run or two a sample holds more or
    /// less than its share hid that.
    fn start_probe(&mut self, bw: f64, now: Instant, interval: Duration) -> f64 {
        self.probe_base = bw;
        self.probe_start = now;
        self.probe_buffered = false;
        self.probe = self.probe_gain();
        self.damped_probes = self.damped_probes.saturating_sub(1);
        self.probe_len = if self.visible_step() > self.probe_step() {
            self.sample_span.max(interval) * 2
        } else {
            interval
        };
        self.enter(Phase::ProbeUp, now);
        bw * self.probe
    }

    /// Counts socket drops the receiver reported, also in a report of no datagrams (a reader
    /// that stalled while its buffer overflowed), so that the gaps they leave are not taken
    /// for the path's loss.
    pub fn note_drops(&mut self, drops: u64) {
        self.drops.note(drops);
    }

    /// The highest pacing rate in force between `from` and `until` (`now_rate` after the last
    /// recorded change).
    fn rate_between(&self, from: Instant, until: Instant, now_rate: f64) -> f64 {
        let mut highest: Option<f64> = None;
        for &(end, r) in &self.sent {
            if end < from {
                continue;
            }
            highest = Some(highest.map_or(r, |h| h.max(r)));
            if end >= until {
                return highest.unwrap_or(r);
            }
        }
        highest.map_or(now_rate, |h| h.max(now_rate))
    }

    fn rounds_in_phase(&self) -> u64 {
        self.round - self.phase_round
    }

    /// Forgets every sample but the lower of the last two reports', which showed the
    /// congestion: what the path (or the receiver) takes now, erring low (a probe the path
    /// takes soon after restores what it had before, see [`Model::take_cut_from`]); never less
    /// than half the bottleneck at once (a report in which the sender had little to send is no
    /// measure of the path).
    fn correct_to_recent(&mut self) {
        if let Some(recent) = self.recent.iter().copied().reduce(f64::min) {
            self.correct_to(recent);
        }
    }

    /// Sets the bottleneck to what the receiver read over the run of reports that showed it
    /// falling behind (`behind`), not to the lowest of the last two: one of those may hold
    /// most of a scheduling gap, and the receiver reads more than that once it runs again.
    /// Without such a run, as [`Model::correct_to_recent`].
    fn correct_to_read(&mut self, behind: Option<Behind>) {
        match behind.and_then(|b| b.read_bps()) {
            Some(read) => self.correct_to(read),
            None => self.correct_to_recent(),
        }
    }

    /// Forgets every sample and sets the bottleneck to `to` (within half the bottleneck and
    /// the bottleneck), remembering what it cut from (see [`Model::take_cut_from`]).
    fn correct_to(&mut self, to: f64) {
        let Some(bw) = self.bottleneck_bps() else {
            return;
        };
        self.cut_from = Some(match self.cut_from {
            Some((round, before)) if round + BW_WINDOW_ROUNDS > self.round && before > bw => {
                (round, before)
            }
            _ => (self.round, bw),
        });
        self.bw_rounds.clear();
        self.bw_rounds
            .push_back((self.round, to.clamp(bw / 2.0, bw)));
    }

    /// Takes back what a probe the receiver did not keep up with added to the bottleneck: no
    /// more than it was before the probe.
    fn forget_probe(&mut self) {
        let Some(bw) = self.bottleneck_bps() else {
            return;
        };
        if bw > self.probe_base && self.probe_base > 0.0 {
            self.bw_rounds.clear();
            self.bw_rounds.push_back((self.round, self.probe_base));
        }
    }

    /// What the bottleneck was before the latest corrections, if they were lately and cut it
    /// by more than a fifth (below [`RESTORE_AFTER_CUT`] of it; smaller cuts are climbed back
    /// by probing, which does not refill a shallow queue at once); forgotten once asked for.
    fn take_cut_from(&mut self, bw: f64) -> Option<f64> {
        let before = self.cut_before(bw);
        self.cut_from = None;
        before
    }

    /// What the bottleneck was before the latest corrections, if they were lately and cut it
    /// from there to `bw`, below [`RESTORE_AFTER_CUT`] of it.
    fn cut_before(&self, bw: f64) -> Option<f64> {
        let (round, before) = self.cut_from?;
        (round + BW_WINDOW_ROUNDS > self.round && bw < before * RESTORE_AFTER_CUT).then_some(before)
    }

    /// The delivery sample `fb` completes, if any: `fb` itself if it has
    /// [`MIN_SAMPLE_DATAGRAMS`] and nothing is pooled, else the pool with `fb` once it has
    /// that many (timed from the report before its first to `now`).
    fn pool(&mut self, now: Instant, fb: &Feedback) -> Option<Delivery> {
        let previous = self.last_report.replace(now);
        if self.pool.datagrams == 0 && fb.datagrams >= MIN_SAMPLE_DATAGRAMS {
            return Some(Delivery {
                interval: fb.interval,
                bytes: fb.bytes,
                datagrams: fb.datagrams,
                lost: fb.lost,
            });
        }
        if self.pool.datagrams == 0 {
            self.pool = Pool {
                since: previous.or_else(|| now.checked_sub(fb.interval)),
                ..Pool::default()
            };
        }
        let p = &mut self.pool;
        p.bytes = p.bytes.saturating_add(fb.bytes);
        p.datagrams = p.datagrams.saturating_add(fb.datagrams);
        p.lost = p.lost.saturating_add(fb.lost);
        if p.datagrams < MIN_SAMPLE_DATAGRAMS {
            return None;
        }
        let p = std::mem::take(&mut self.pool);
        let interval = p
            .since
            .map_or(fb.interval, |s| now.saturating_duration_since(s));
        (!interval.is_zero()).then_some(Delivery {
            interval,
            bytes: p.bytes,
            datagrams: p.datagrams,
            lost: p.lost,
        })
    }

    /// What the delivery `d`, received `now` with the controller at `rate`, says: its sample,
    /// whether the receiver was catching up in it, and whether the sender was sending.
    ///
    /// The sample is what was delivered, with what random loss took added back, since the
    /// sender has to send that too; and no more than was sent: the highest rate in force while
    /// that data left (a receiver catching up after a stall delivers faster than the path, and
    /// so do the lucky intervals of a jittery one).
    fn sample(&self, now: Instant, d: Delivery, sig: Signals, rate: f64) -> Sample {
        let seen = d.datagrams.saturating_add(d.lost);
        let loss = d.lost as f64 / seen.max(1) as f64;
        let delivered = d.bytes as f64 * 8.0 / d.interval.as_secs_f64();
        let random = sig.floor.map_or(0.0, |f| f.rate).min(loss);
        let left_from = now.checked_sub(self.rtt + d.interval).unwrap_or(now);
        let left_until = now.checked_sub(self.rtt).unwrap_or(now);
        let sent_then = self.rate_between(left_from, left_until, rate);
        let passed = delivered / (1.0 - random).max(0.5);
        // A receiver that delivers clearly more than was sent is catching up (after a stall):
        // neither its rate nor the delay its late datagrams carry says anything about the path.
        // Not so a sample of a few datagrams: it holds a whole run of the sender's more or
        // less than its span's share (a quarter of it and more), and is held to what was sent
        // like any other (thrown away, only the low ones counted, and at a low rate the
        // windowed maximum fell sample by sample).
        // In startup its sends are long trains (`RateController::train_bytes`), a few per
        // report at its first rates, and a report counts a train more or less than its share:
        // a third and more above what was sent, in netsim's intercontinental behind GRO. Taken
        // for catching up, those reports were thrown away and startup's first step came
        // three reports late.
        let over = if self.phase == Phase::Startup {
            STARTUP_CATCHING_UP
        } else {
            CATCHING_UP
        };
        let catching_up = passed > sent_then * over && d.datagrams >= FEW_DATAGRAMS;
        // Past startup, no sample is above what was sent: a receiver counts arrivals in lumps
        // (its threads run late on a busy machine) and a jittery path has lucky intervals, so
        // one report in a few counts more than arrived in its interval; with 2% of slack each
        // such report lifted the windowed maximum, and so the rate, 2% above the last. A path
        // with room is found by probing, whose higher rate its reports are held against.
        // Startup keeps the slack: its rate grows between reports.
        let slack = if self.phase == Phase::Startup {
            1.02
        } else {
            1.0
        };
        Sample {
            bps: passed.min(sent_then * slack),
            catching_up,
            sending: delivered >= rate / 2.0,
        }
    }

    /// Takes one report (already checked and clamped by the controller) and the controller's
    /// current `rate`; returns the new pacing rate and why, or `None` to keep the rate.
    pub fn on_report(
        &mut self,
        now: Instant,
        fb: &Feedback,
        sig: Signals,
        rate: f64,
    ) -> Option<(f64, Reason)> {
        let seen = fb.datagrams.saturating_add(fb.lost);
        let loss = fb.lost as f64 / seen.max(1) as f64;
        let delivered = fb.bytes as f64 * 8.0 / fb.interval.as_secs_f64();
        let round_len = self.rtt.max(fb.interval);
        let target = queue_target(self.rtt) + sig.noise;
        // An outage (most datagrams lost, little delivered, and no long queue): nothing about
        // the path's rate or its congestion, and no reason to slow down; deliveries resume at
        // the remembered rate. (What little comes through a queue twice the target is a path
        // that slowed down to a trickle: congestion.)
        if loss > 0.5
            && fb.queue_delay <= target * 2
            && self.bottleneck_bps().is_some_and(|b| delivered < b / 4.0)
        {
            return None;
        }
        let starting = self.receiver_start(fb);
        let delivery = if starting {
            self.last_report = Some(now);
            None
        } else {
            self.pool(now, fb)
        };
        // The rate until now; the reports' data left about a round trip ago.
        self.sent.push_back((now, rate));
        let kept = self.rtt + (fb.interval * 4).max(self.sample_span * 2);
        while self.sent.len() > 1 && self.sent[0].0 + kept <= now {
            self.sent.pop_front();
        }
        let (sample, catching_up, sending) = match delivery {
            Some(d) => {
                let s = self.sample(now, d, sig, rate);
                self.sample_span = d.interval;
                self.sample_datagrams = d.datagrams;
                (Some(s.bps), s.catching_up, s.sending)
            }
            // Pooled, no sample yet: nothing to go by but the delay and loss.
            None => (None, false, false),
        };
        // Loss over the last round, against the floor. Datagrams the receiver's kernel dropped show as gaps too, in that report or a later
        // one: those are the receiver's, judged as it falling behind, not the path's loss.
        self.note_drops(fb.socket_drops);
        let explained = self.drops.explain(fb.lost);
        let path_lost = (fb.lost - explained).min(seen);
        // Loss in data sent before the last correction was answered by it: not judged again.
        if now >= self.judge_after {
            self.round_loss.push_back((now, path_lost, seen));
        }
        while self.round_loss.len() > 1 && self.round_loss[0].0 + round_len <= now {
            self.round_loss.pop_front();
        }
        let (round_lost, round_seen) = self.round_loss.iter().fold((0u64, 0u64), |(l, s), r| {
            (l.saturating_add(r.1), s.saturating_add(r.2))
        });
        // The floor's allowance for loss in bursts holds while the rate is the model's or under
        // it: a startup or a probe sends above the path on purpose, and loss then is most
        // likely its own. (With the allowance there too, `bench/ratectl.py` scenario b, a
        // 64 KiB queue behind `tbf` with 1% random loss, overflowed longer in each probe:
        // resent 2.3% in six runs against 1.8% before the allowance, and 1.8% without it here.)
        let floor = match self.phase {
            Phase::Drain | Phase::Cruise => sig.floor,
            _ => sig.floor.map(|f| super::LossFloor::independent(f.rate)),
        };
        let loss_congestion = super::loss_beyond(floor, round_lost, round_seen);
        if starting {
            // The receiver's start: no sample, nothing judged (its loss counts in the round).
            return None;
        }
        // A round in which the sender had little to send (or the path was out) does not age
        // the maximum.
        if now >= self.round_start + round_len && sending {
            self.round += 1;
            self.round_start = now;
        }
        if let Some(sample) = sample.filter(|s| s.is_finite() && *s > 0.0 && !catching_up) {
            match self.bw_rounds.back_mut() {
                Some(last) if last.0 == self.round => last.1 = last.1.max(sample),
                _ => self.bw_rounds.push_back((self.round, sample)),
            }
            while self
                .bw_rounds
                .front()
                .is_some_and(|r| r.0 + BW_WINDOW_ROUNDS <= self.round)
            {
                self.bw_rounds.pop_front();
            }
            self.recent.push_back(sample);
            if self.recent.len() > 2 {
                self.recent.pop_front();
            }
        }
        let bw = self.bottleneck_bps()?;

        let queue = fb.queue_delay > target && !catching_up;
        // Startup sees a queue as soon as the delay rises clearly above what jitter gave it.
        let delay_floor = self
            .startup_delay_floor
            .map_or(fb.queue_delay, |d| d.min(fb.queue_delay));
        if self.phase == Phase::Startup {
            self.startup_delay_floor = Some(delay_floor);
            if let Some(r) = fb.train_rate.filter(|r| r.is_finite() && *r > 0.0) {
                self.train_hints.push_back(r);
                if self.train_hints.len() > TRAIN_HINTS {
                    self.train_hints.pop_front();
                }
            }
        }
        let startup_queue =
            fb.queue_delay > delay_floor + Duration::from_millis(5).max(self.rtt / 20) + sig.noise;
        // Startup also ends when two reports in a row show a queue of a millisecond or more
        // above the floor: below the bottleneck a paced sender's bursts leave none, and a
        // report's mean delay averages jitter out. That is a report or two before the queue
        // passes the threshold above; startup's rate is about twice the path's by then, and
        // each report later the queue has grown by a fifth of a round trip (on
        // intercontinental's 4 MiB queue, thousands of datagrams dropped).
        if self.phase == Phase::Startup {
            // (Against the receiver's lag itself, not twice it: two reports in a row of it.)
            // (Nor against the queue the channels' own trains make where they meet: their bits
            // over the path's rate by the trains; untimed, over the pacing rate, since a path
            // slower than that is one startup has passed, and its queue is a real one.)
            let path = self.train_rate().unwrap_or(rate);
            let trains = Duration::from_secs_f64((sig.trains_bits / path.max(1.0)).min(0.01));
            let rising = fb.queue_delay > delay_floor + STARTUP_RISE + sig.noise / 2 + trains;
            self.startup_rising = if rising { self.startup_rising + 1 } else { 0 };
        }
        let queue_rising = self.startup_rising >= 2;
        // The receiver is judged in time, not by how full one report found its buffer: a
        // reader that was off the CPU for a few milliseconds (the scheduler's, on a busy
        // machine) finds its buffer half full and then reads it down. A report that read at
        // least what was sent over it ([`KEEPS_UP`], lost datagrams counted as read), without
        // drops, shows a backlog that did not grow, whatever its fill: no sample of a slow
        // receiver. (On loopback, 1 GiB auto on a busy 2-core machine, 5-13 cuts per GiB
        // were such fills.)
        // What was sent is the rate in force while the report's data left times the share of
        // its rate the sender got out lately (`sent_share`): a sender late on a busy machine
        // (hundreds of ms per GiB on loopback) sends less than its rate, and a receiver that
        // reads all it was sent is no slow receiver for that.
        let left_from = now.checked_sub(self.rtt + fb.interval).unwrap_or(now);
        let left_until = now.checked_sub(self.rtt).unwrap_or(now);
        let paced_then = self.rate_between(left_from, left_until, rate);
        // (Datagrams the path lost count as read; those the receiver's socket dropped, which
        // show as gaps in this report or a later one, do not: a receiver that overflows every
        // other report would otherwise read as keeping up in the reports between.)
        let read =
            delivered * fb.datagrams.saturating_add(path_lost) as f64 / fb.datagrams.max(1) as f64;
        let kept_up = fb.socket_drops == 0
            && fb.datagrams > 0
            && read >= paced_then * self.sent_share * KEEPS_UP;
        // A report timed by its arrivals (buffers under a quarter full: the receiver read as
        // they came) says what reached the receiver against what was paced; only for data
        // paced at or under what the model says the path takes (with cruising's reserve), and
        // without a queue: above it (startup, a probe's step up) the path holds back what was
        // sent, and the shortfall is not the sender's.
        let within_path = self
            .bottleneck_bps()
            .is_some_and(|bw| paced_then <= bw * CRUISE_FILL_GAIN * 1.01);
        if fb.socket_drops == 0
            && !queue
            && within_path
            && fb.datagrams >= MIN_SAMPLE_DATAGRAMS
            && fb.queue_fill * 1000.0 < crate::admit::READING_BEHIND_PERMILLE as f64
            && !catching_up
            && paced_then > 0.0
            && read.is_finite()
        {
            self.sent_share = (read / paced_then).clamp(LEAST_SENT_SHARE, 1.0);
        }
        let behind = (fb.socket_drops > 0 || fb.queue_fill > super::QUEUE_FILL_LIMIT)
            && !catching_up
            && !kept_up;
        // A queue counts once it has lasted a round (a receiver that stalled for a moment shows
        // a burst of delay and then delivers its backlog above the path's rate); a receiver
        // falling behind once it has in two reports over half a round (one report's drops are
        // a hiccup).
        self.queue_since = queue.then(|| self.queue_since.unwrap_or(now));
        self.behind_since = behind.then(|| {
            let run = self.behind_since.unwrap_or(Behind {
                since: now,
                reports: 0,
                bytes: 0,
                time: Duration::ZERO,
            });
            Behind {
                reports: run.reports + 1,
                bytes: run.bytes.saturating_add(fb.bytes),
                time: run.time + fb.interval,
                ..run
            }
        });
        let queue_lasts = self
            .queue_since
            .is_some_and(|since| now >= since + self.rtt.max(fb.interval));
        let behind_lasts = self
            .behind_since
            .is_some_and(|b| b.reports >= 2 && now >= b.since + (self.rtt / 2).min(fb.interval));
        let behind_reason = if fb.socket_drops > 0 {
            Reason::SocketDrops
        } else {
            Reason::Backlog
        };

        let judged = now >= self.judge_after;
        // The receiver has room for a probe: its buffers under a quarter full, no drops. (Into
        // a receiver that is the bottleneck a probe only fills its buffers.) A probe during
        // which it had none is not taken, and what its samples added to the model is taken
        // back when it ends: they time the bytes by when they arrived, and the receiver's
        // buffers took them faster than it reads.
        let receiver_room = fb.socket_drops == 0 && fb.queue_fill < super::QUEUE_FILL_LIMIT / 2.0;
        if matches!(
            self.phase,
            Phase::ProbeUp | Phase::ProbeDown | Phase::ProbeWait
        ) {
            self.probe_buffered |= !receiver_room;
        }
        // Data sent from now on is reported about a round trip and an interval later.
        let settle = self.rtt + fb.interval;
        match self.phase {
            Phase::Startup => {
                if self.round > self.full_round {
                    self.full_round = self.round;
                    if bw >= self.full_bw * FULL_GROWTH {
                        self.full_bw = bw;
                        self.full_rounds = 0;
                    } else {
                        self.full_rounds += 1;
                    }
                }
                let why = if behind {
                    Some(behind_reason)
                } else if queue || startup_queue || queue_rising {
                    Some(Reason::Delay)
                } else if loss_congestion {
                    Some(Reason::Loss)
                } else if self.full_rounds >= FULL_ROUNDS {
                    Some(Reason::Drain)
                } else {
                    None
                };
                if why == Some(Reason::Loss) {
                    self.note_congestion_loss(fb.queue_delay, target);
                }
                match why {
                    Some(why) => {
                        // Startup's maximum is what the path took; on congestion, what it
                        // takes now is the last round's.
                        if behind {
                            self.correct_to_read(self.behind_since);
                            self.damped_probes = DAMPED_PROBES;
                        } else if why != Reason::Drain {
                            self.correct_to_recent();
                        }
                        self.behind_since = None;
                        // A path queue built by startup's surplus needs a deep drain; a
                        // receiver's socket buffer holds only milliseconds.
                        self.drain_gain = if behind {
                            DRAIN_GAIN
                        } else {
                            STARTUP_DRAIN_GAIN
                        };
                        self.enter(Phase::Drain, now);
                        self.judge_after = now + settle;
                        let bw = self.bottleneck_bps().unwrap_or(bw);
                        Some((bw * self.drain_gain, why))
                    }
                    None if self.past_trains => {
                        let grown = STARTUP_PAST_TRAINS_GAIN * bw;
                        (grown > rate).then_some((grown, Reason::Startup))
                    }
                    None => {
                        let grown = startup_gain(self.rtt, fb.interval) * bw;
                        // The path's rate as an earlier transfer found it or as the trains
                        // measure it now (the lower, if both: a memory of a faster path is
                        // stale): startup grows to it and no further.
                        let known = match (self.resumed, self.train_rate()) {
                            (Some(before), Some(now)) => Some(before.min(now)),
                            (before, now) => before.or(now),
                        };
                        match known {
                            // Reached by trains that disagree (jitter spread them): a floor
                            // of the path's rate, not its rate; startup grows past it,
                            // gently (its exits above end it at the path).
                            Some(before)
                                if bw >= before * RESUMED_SHARE
                                    && self.resumed.is_none()
                                    && !self.trains_agree() =>
                            {
                                self.past_trains = true;
                                // (Growth stalled at the floor: the full-growth count starts
                                // again from here.)
                                self.full_bw = bw;
                                self.full_rounds = 0;
                                let grown = STARTUP_PAST_TRAINS_GAIN * bw;
                                (grown > rate).then_some((grown, Reason::Startup))
                            }
                            // The path takes that rate: no surplus to find (probing finds any
                            // more).
                            Some(before) if bw >= before * RESUMED_SHARE => {
                                self.resumed = None;
                                // (At the sample: cruising's band applies from the next
                                // report.)
                                self.enter(Phase::Cruise, now);
                                Some((bw, Reason::Cruise))
                            }
                            Some(before) => {
                                // Trains that agree: their rate at once (within a bound),
                                // not a doubling per round trip towards it; once (behind a
                                // token bucket the trains measure the line's rate, and a jump
                                // per report would pass the path fivefold per report).
                                let jump = if self.trains_agree() && !self.jumped {
                                    self.jumped = true;
                                    bw * MAX_JUMP
                                } else {
                                    grown
                                };
                                let grown = grown.max(jump).min(before);
                                (grown > rate).then_some((grown, Reason::Startup))
                            }
                            None => (grown > rate).then_some((grown, Reason::Startup)),
                        }
                    }
                }
            }
            _ => {
                let congestion = if !judged {
                    None
                } else if behind_lasts {
                    Some(behind_reason)
                } else if queue_lasts && self.phase != Phase::Drain {
                    // (A queue while draining is what the drain is for.)
                    Some(Reason::Delay)
                } else if loss_congestion {
                    Some(Reason::Loss)
                } else {
                    None
                };
                if congestion == Some(Reason::Loss) {
                    self.note_congestion_loss(fb.queue_delay, target);
                }
                if let Some(why) = congestion {
                    // A receiver that fell behind is cut to what it read over the reports
                    // that showed it (a gentler drain, 0.95, left a standing backlog at the
                    // rate it reads, over a quarter of its buffer, and so no more probes).
                    if matches!(why, Reason::Backlog | Reason::SocketDrops) {
                        self.correct_to_read(self.behind_since);
                        self.damped_probes = DAMPED_PROBES;
                    } else {
                        self.correct_to_recent();
                    }
                    self.queue_since = None;
                    self.behind_since = None;
                    self.probe_doublings = 0;
                    self.drain_gain = DRAIN_GAIN;
                    self.enter(Phase::Drain, now);
                    self.judge_after = now + settle;
                    let bw = self.bottleneck_bps().unwrap_or(bw);
                    return Some((bw * DRAIN_GAIN, why));
                }
                match self.phase {
                    Phase::Drain => {
                        let drained = judged && fb.queue_delay <= target / 2 && !behind;
                        if drained || self.rounds_in_phase() >= u64::from(MAX_DRAIN_ROUNDS) {
                            self.enter(Phase::Cruise, now);
                            Some((bw * self.cruise_gain(fb, target), Reason::Cruise))
                        } else {
                            Some((bw * self.drain_gain, Reason::Drain))
                        }
                    }
                    Phase::Cruise
                        if judged && self.rounds_in_phase() >= CRUISE_ROUNDS && receiver_room =>
                    {
                        Some((self.start_probe(bw, now, fb.interval), Reason::Probe))
                    }
                    Phase::ProbeUp if now >= self.phase_start + self.probe_len => {
                        self.enter(Phase::ProbeDown, now);
                        Some((bw * DRAIN_GAIN, Reason::Drain))
                    }
                    Phase::ProbeDown if now >= self.phase_start + self.probe_len => {
                        self.enter(Phase::ProbeWait, now);
                        Some((bw * self.cruise_gain(fb, target), Reason::Cruise))
                    }
                    // (The sample that holds the probe's last data is reported a round trip and
                    // a sample's span after it left.)
                    Phase::ProbeWait
                        if now
                            >= self.probe_start
                                + self.rtt
                                + self.probe_len
                                + self.sample_span.max(fb.interval) =>
                    {
                        // A probe the receiver did not keep up with was not taken, whatever
                        // its samples say (`receiver_room`).
                        let took = !self.probe_buffered
                            && bw >= self.probe_base * (1.0 + (self.probe - 1.0) / 2.0);
                        // The path takes more again soon after a correction: it was a
                        // moment's dip (an emulator or a router short of CPU, a burst of
                        // cross traffic), and the model returns to what it had before at
                        // once, instead of climbing back a probe step at a time over many
                        // round trips; if the path did slow down, the next correction says so.
                        let restored = (took && !queue && !behind)
                            .then(|| self.take_cut_from(bw))
                            .flatten();
                        if let Some(before) = restored {
                            match self.bw_rounds.back_mut() {
                                Some(last) if last.0 == self.round => last.1 = last.1.max(before),
                                _ => self.bw_rounds.push_back((self.round, before)),
                            }
                            self.probe_doublings = 0;
                            self.enter(Phase::Cruise, now);
                            Some((before, Reason::Probe))
                        } else if took && !queue && !behind {
                            // (Not past a receiver that fell behind lately: the probes after
                            // its correction keep the first step, [`DAMPED_PROBES`].)
                            self.probe_doublings = if self.damped_probes > 0 {
                                0
                            } else {
                                (self.probe_doublings + 1).min(MAX_PROBE_DOUBLINGS)
                            };
                            Some((self.start_probe(bw, now, fb.interval), Reason::Probe))
                        } else {
                            self.probe_doublings = 0;
                            if self.probe_buffered {
                                self.forget_probe();
                            }
                            let bw = self.bottleneck_bps().unwrap_or(bw);
                            self.enter(Phase::Cruise, now);
                            Some((bw * self.cruise_gain(fb, target), Reason::Cruise))
                        }
                    }
                    Phase::ProbeUp => Some((self.probe_base * self.probe, Reason::Probe)),
                    Phase::ProbeDown => Some((self.probe_base * DRAIN_GAIN, Reason::Drain)),
                    _ => Some((bw * self.cruise_gain(fb, target), Reason::Cruise)),
                }
            }
        }
    }

    /// Cruising's pacing gain over the bottleneck for a report `fb`, against the queue
    /// `target`. Cruising keeps the queue in its band ([`Model::cruise_band`]): over it (an
    /// overestimate standing in the queue) the queue is let drain, gently, without changing
    /// the model; under it, a little more than the bottleneck builds the reserve that keeps
    /// the link busy while the sender is stalled; but not into a receiver that is the
    /// bottleneck (its socket buffers, not the path, would hold the reserve, and it would fall
    /// behind).
    fn cruise_gain(&self, fb: &Feedback, target: Duration) -> f64 {
        let (fill_under, drain_over) = self.cruise_band(target);
        if fb.queue_delay > drain_over {
            CRUISE_DRAIN_GAIN
        } else if fb.queue_delay < fill_under
            && fb.socket_drops == 0
            && fb.queue_fill < super::QUEUE_FILL_LIMIT / 2.0
        {
            CRUISE_FILL_GAIN
        } else {
            1.0
        }
    }
}
