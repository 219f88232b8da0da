//! Rate control after PA-UDP: start at or below what the receiver can absorb (its ceiling,
//! offered at the hello), then follow the path by the receiver's feedback.
//!
//! The receiver reports several times per round trip ([`report_interval`], [`Feedback`]; on a
//! short path at about 75 to 300 Mbit/s every 256 datagrams instead, up to 30 ms apart:
//! [`ReportCadence`]): what arrived in the interval, how many datagrams went missing (gaps in
//! the per-channel packet numbers), kernel socket drops, how long datagrams spent queued
//! (one-way delay above the lowest seen, from the sender's timestamps), how full its socket
//! receive buffers got, and how late its own timer runs. [`RateController`] turns that into a
//! pacing rate, by mode:
//!
//! | mode | how | module |
//! |---|---|---|
//! | `auto` (default) | a model of the path: the windowed maximum of delivered rate and the queueing delay; startup, drain, cruise and probing states | [`model`] |
//! | `fair` | LEDBAT's rule in rates: past startup, queueing delay over a low target (5 ms, or RTT/20) cuts the rate in proportion, whoever built the queue; under it the rate climbs in proportion to the room left, so it yields to competing TCP | this file |
//! | `fixed` | exactly the configured rate; feedback is ignored | this file |
//!
//! Both adaptive modes share the **loss floor** ([`LossFloor`]): the loss rate that random loss
//! alone explains, taken from the quieter three quarters of recent reports and erring high, and
//! how much more than independent losses the reports' counts vary (a path that loses in bursts,
//! as Wi-Fi does). Loss up to the floor, within that variation, is the path's, not congestion:
//! it costs only the lost bytes, which is the point against TCP. Loss clearly beyond it is
//! congestion.
//!
//! **Silence**: where reports stop coming (a receiver starved of CPU, a path that lost them),
//! `auto` paces no faster than its model's bottleneck until the next one, and past a few
//! seconds of silence halves that every few seconds (an outage: not into the void at full
//! rate); the next report brings it back ([`RateController::on_silence`], which the driver
//! calls between reports).
//!
//! **The round trip** the controller goes by is the path's ([`rtt`]): the key agreement's
//! timing, which both sides' CPU inflates (tens of milliseconds on a busy loopback), lowered
//! by the first probes' answers, never below the kernel's TCP floor
//! ([`RateController::set_rtt`]).
//!
//! At the end, [`bottleneck`] names what limited the transfer from the controller's view, and
//! [`RateController::outages`] says whether the path went out meanwhile ([`Outages`]).
//!
//! **A path seen before** ([`PathMemory`], after the careful-resume idea of QUIC and TCP): a
//! transfer that ends past startup leaves its model's bottleneck and the RTT it measured; the
//! next one to the same receiver within [`MEMORY_LIFETIME`], on a round-trip time within a
//! factor of two of that one's, starts at half that bottleneck instead of the cold start, and
//! its startup stops at the bottleneck remembered ([`RateController::resume`]). A path that
//! got slower since shows it in the first round's reports, as any congestion does; one that got
//! faster is found by probing.
//!
//! Every change is recorded with its reason ([`RateChange`]) for the progress line, the JSON
//! summary and the channel logs. The controller is pure: time comes in as arguments.

pub mod bottleneck;
pub mod dispersion;
pub mod model;
pub mod rtt;

use crate::wire::Control;
use model::{Model, Signals};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How the rate is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateMode {
    /// Pace at exactly the ceiling; ignore feedback.
    Fixed,
    /// As fast as the path and receiver take without self-inflicted loss.
    Auto,
    /// Like auto, but yield to competing traffic when queueing delay rises.
    Fair,
}

/// Configuration of a [`RateController`].
#[derive(Debug, Clone)]
pub struct RateConfig {
    /// Mode.
    pub mode: RateMode,
    /// Highest rate ever used, bits per second (the user's cap and the receiver's ceiling).
    pub ceiling_bps: u64,
    /// First rate, bits per second (clamped to the ceiling).
    pub start_bps: u64,
    /// Lowest rate, bits per second.
    pub min_bps: u64,
    /// Round-trip time measured at the handshake.
    pub rtt: Duration,
}

/// Datagrams a transfer may send per round trip at its first rate: TCP's initial window
/// (RFC 6928), as a rate.
pub const INITIAL_WINDOW: u64 = 10;

/// The first rate for a path: [`INITIAL_WINDOW`] datagrams of `payload` bytes per `rtt`, or
/// `floor_bps` if that is higher. On a long path the floor decides (10 datagrams of 1396
/// bytes per 100 ms is 1.1 Mbit/s); on a short one (loopback, a rack) startup begins where TCP
/// would, not dozens of doubling rounds below it, since a round is a report interval (10 ms at
/// least), many round trips there. (A round trip or payload that the probes find before the
/// first report raises it: [`RateController::raise_start`].)
pub fn initial_rate(floor_bps: u64, payload: u16, rtt: Duration) -> u64 {
    let window_bits = (INITIAL_WINDOW * u64::from(payload) * 8) as f64;
    let rtt = rtt.as_secs_f64().max(1e-6);
    floor_bps.max((window_bits / rtt).min(u64::MAX as f64 / 2.0) as u64)
}

/// Most bytes a channel sends back to back while `auto`'s startup lasts
/// ([`startup_train_bytes`]): one GSO send, 45 datagrams of 1428 bytes.
pub const STARTUP_TRAIN_BYTES: u64 = 64 << 10;

/// How long a startup train may be at the channel's own rate, as a share of the round trip.
/// All channels' trains together, which may meet at the bottleneck, are then at most that share
/// of the rate's bandwidth-delay product: a 40 ms path's queue of a twelfth of its BDP (netsim's
/// shallow case, four channels) takes them. On a short path startup is over in a few report
/// intervals and needs no trains, and a LAN queue is spared the bursts. (A quarter overflowed
/// that shallow queue in startup; an eighth, at most 8 ms, was too short on a 150 ms path with
/// two channels: 50 KB trains, four buffers at 1 Gbit/s, and the first estimates came after
/// 0.5 s.)
pub const STARTUP_TRAIN_RTT_SHARE: u32 = 16;

/// How many times a channel's startup train doubles past its share of the round trip
/// ([`STARTUP_TRAIN_RTT_SHARE`]) while the receiver's reports carry no estimate of the
/// bottleneck ([`Feedback::train_rate`]): once per such report, to half the round trip at the
/// channel's rate at most (and [`STARTUP_TRAIN_BYTES`]).
///
/// A train the receiver cannot time because it arrived in too few GRO buffers took that little
/// time at the bottleneck, so a longer one costs the bottleneck's queue little: on a 40 ms path
/// at 1 Gbit/s a sixteenth of the round trip at startup's 50 Mbit/s a channel is 15.6 KB, 125 µs
/// there, one or two 100 µs buffers; 64 KiB is half a millisecond of queue and five buffers.
/// The cap keeps a train that jitter, not its length, keeps untimed within half the round
/// trip's worth at the channel's rate.
pub const STARTUP_TRAIN_DOUBLINGS: u32 = 3;

/// The bytes a channel pacing at `channel_bps` on a path of round trip `rtt` sends back to back
/// while startup lasts: [`STARTUP_TRAIN_BYTES`], or what the channel's rate sends in a
/// sixteenth of the round trip if that is less.
///
/// A receiver behind GRO (a NIC that coalesces, or linkem's GSO writes) is handed what arrived
/// in each 100 µs or so as one buffer with one arrival time, so the spacing of datagrams shows
/// the bottleneck's rate only over a train that spans several buffers
/// ([`dispersion`]): at 1 Gbit/s a 64 KiB train spans five. The channel's usual sends, a
/// quarter millisecond of the rate, span one or two, and startup without the trains' estimate
/// doubles past the bottleneck (a logged wan-1g run: paced at 2.1 Gbit/s on the 1 Gbit/s path,
/// a 66 ms queue, 870 datagrams lost). Past startup the estimate is not needed and the trains
/// go back to their usual length.
pub fn startup_train_bytes(channel_bps: u64, rtt: Duration) -> u64 {
    let time = rtt / STARTUP_TRAIN_RTT_SHARE;
    let bytes = channel_bps as f64 / 8.0 * time.as_secs_f64();
    (bytes as u64).min(STARTUP_TRAIN_BYTES)
}

/// How often the receiver reports, for a path of round-trip time `rtt`: four times per round
/// trip, so that startup sees its growth and congestion within a fraction of one, but at most
/// every 10 ms (a report costs the receiver's session loop a wake-up) and at least every 500 ms.
pub fn report_interval(rtt: Duration) -> Duration {
    (rtt / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// The fewest datagrams a report covers once the transfer is under way ([`report_every`]),
/// where the interval for that is no longer than [`REPORT_STRETCH_MAX`]: a report wakes both
/// sides' session loops and the sender's report thread, and at 100 Mbit/s on a short path 100
/// reports a second came every ~90 datagrams (about a third of a paced sender's CPU went to
/// receiving and acting on them). A short path ([`SHORT_PATH_RTT`]) counts
/// [`SHORT_REPORT_DATAGRAMS`].
pub const REPORT_DATAGRAMS: u64 = 256;

/// The longest the datagram count ([`REPORT_DATAGRAMS`]) stretches a report interval to (a
/// longer [`report_interval`] stays as it is). `auto` climbs by a step per report: with
/// reports up to 100 ms apart its climb back from a trickle (netsim's
/// `a_path_down_to_a_trickle_is_filled_again_once_it_recovers`) took 119 round trips
/// instead of 38. A short path ([`SHORT_PATH_RTT`]) stretches to
/// [`SHORT_REPORT_STRETCH_MAX`].
pub const REPORT_STRETCH_MAX: Duration = Duration::from_millis(30);

/// A path whose round trip, as the kernel timed the control connection's (its floor: never
/// below the path's own), is at most this is short: a LAN, a rack, loopback. Its
/// [`report_interval`] is the 10 ms floor, dozens of round trips, and `auto`'s steps per
/// report are as many round trips apart either way; its reports stretch further
/// ([`ReportPace`]). A 40 ms path, also at the 10 ms floor, does not: there a report
/// stretched to 60 ms was a round trip and a half late, and netsim's climb back after a
/// 100 ms dip and its bursts of random loss failed.
pub const SHORT_PATH_RTT: Duration = Duration::from_millis(4);

/// [`REPORT_DATAGRAMS`] on a short path ([`SHORT_PATH_RTT`]): at 100 Mbit/s with 1428-byte
/// datagrams a report every 59 ms instead of 29, at 400 Mbit/s every 15 ms instead of 10.
/// (On veth at a fixed 100 Mbit/s the receiver went 3.36 -> 2.92 CPU-s/GiB, its context
/// switches per GiB 19,560 -> 14,576; the sender's cost did not move: BENCHMARKS.md 10.)
pub const SHORT_REPORT_DATAGRAMS: u64 = 512;

/// [`REPORT_STRETCH_MAX`] on a short path ([`SHORT_PATH_RTT`]).
pub const SHORT_REPORT_STRETCH_MAX: Duration = Duration::from_millis(60);

/// A report of fewer datagrams than this keeps the path's [`report_interval`]
/// ([`report_every`]): a slow path (below about 75 Mbit/s at the 10 ms floor) or one that
/// fell quiet is heard of at the usual cadence, where `auto`'s steps per report matter most.
pub const REPORT_STRETCH_FROM: u64 = REPORT_DATAGRAMS / 4;

/// The bytes [`report_every`] counts as one datagram at most: a full datagram of a 1500-byte
/// MTU. Larger datagrams (a 9000-byte MTU, loopback) count as several, so that a report's
/// stretch follows the rate in bits, as it does at 1500 bytes. (Counted by datagrams alone, a
/// fixed 100 Mbit/s in 8900-byte datagrams brought 14 a report, under
/// [`REPORT_STRETCH_FROM`]: reports stayed 10 ms apart, 87 a second on loopback.)
pub const REPORT_DATAGRAM_BYTES: u64 = 1_472;

/// A report's size in datagrams as [`report_every`] counts them: its datagrams, or its bytes in
/// [`REPORT_DATAGRAM_BYTES`], whichever is more.
fn report_size(fb: &Feedback) -> u64 {
    fb.datagrams.max(fb.bytes / REPORT_DATAGRAM_BYTES)
}

/// How the receiver spaces its reports on a path: every [`report_interval`] (`base`), or, once
/// the transfer is under way, as long as `datagrams` take to arrive, up to `stretch_max`
/// ([`report_every`]). Both sides choose it from their own view of the path: the receiver to
/// space its reports ([`ReportPace::for_path`]), the sender to know how long a silence is
/// ([`ReportPace::heard_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportPace {
    /// The path's [`report_interval`].
    pub base: Duration,
    /// The fewest datagrams a stretched report covers.
    pub datagrams: u64,
    /// The longest a report is stretched to (unless `base` is longer).
    pub stretch_max: Duration,
}

impl ReportPace {
    /// The pace on a path of round trip `rtt`, short or not ([`SHORT_PATH_RTT`]).
    pub fn new(rtt: Duration, short: bool) -> Self {
        let (datagrams, stretch_max) = if short {
            (SHORT_REPORT_DATAGRAMS, SHORT_REPORT_STRETCH_MAX)
        } else {
            (REPORT_DATAGRAMS, REPORT_STRETCH_MAX)
        };
        ReportPace {
            base: report_interval(rtt),
            datagrams,
            stretch_max,
        }
    }

    /// The receiver's pace on a path of round trip `rtt` whose control connection the kernel
    /// timed at `floor` or more: short where the floor is at most [`SHORT_PATH_RTT`] (no floor,
    /// as through a relay, is not short). A TCP proxy near the receiver that answers for the
    /// sender makes a long path look short: its reports at low rates then come up to 60 ms
    /// apart, and `auto` there hears of a queue later, as it would at a lower report rate.
    pub fn for_path(rtt: Duration, floor: Option<Duration>) -> Self {
        Self::new(rtt, floor.is_some_and(|f| f <= SHORT_PATH_RTT))
    }

    /// The pace a sender allows for: as [`ReportPace::for_path`], with twice the round trip
    /// for a short path. Each side's kernel times its own end of the control connection; near
    /// [`SHORT_PATH_RTT`] the receiver may find the path short where the sender does not, and
    /// its longer reports must not read as silence there. (The other way round the sender
    /// only calls a silence later.)
    pub fn heard_on(rtt: Duration, floor: Option<Duration>) -> Self {
        Self::new(rtt, floor.is_some_and(|f| f <= SHORT_PATH_RTT * 2))
    }
}

/// How many reports the receiver sends at [`report_interval`] before the datagram count may
/// stretch it ([`ReportCadence`]): `auto`'s startup sees its growth at the usual cadence.
pub const REPORTS_AT_START: u64 = 32;

/// An arrival rate more than this many times the highest of the [`REPORT_RISING_OVER`] reports
/// before it keeps the next report at [`report_interval`] ([`ReportCadence`]): a rate that is
/// climbing is heard of at the usual cadence. (Without it the climb back from a trickle took 46
/// round trips, with it 42.)
pub const REPORT_RISING: f64 = 1.05;

/// How many earlier reports a rising rate must top ([`REPORT_RISING`]). Not only the last one:
/// a sender paced at a fixed 100 Mbit/s sends 128 KiB at a wake-up (about 94 datagrams), so a
/// stretched report holds two trains or three, and its count jitters by a third from one report
/// to the next; against the previous report alone every third train read as a climb, and a
/// third of the reports went back to the 10 ms cadence (the receiver's threads woke about 53
/// times a second instead of 34). A climb tops them all, report after report.
pub const REPORT_RISING_OVER: usize = 4;

/// How long after report `last` the next one may come, at `pace`: its `base`, or the time the
/// arrival rate `last` shows (its datagrams over its interval) takes to bring `pace.datagrams`
/// datagrams, if longer, but no longer than `pace.stretch_max`. A report of fewer than
/// [`REPORT_STRETCH_FROM`] datagrams keeps `base`. (Datagrams larger than
/// [`REPORT_DATAGRAM_BYTES`] count as several.) At 100 Mbit/s at the 10 ms floor the
/// interval is about 29 ms (59 on a short path); from about 300 Mbit/s on, 10 ms as before (on
/// a short path from about 600). The receiver's cadence stretches no further
/// ([`ReportCadence`]) and the sender's silence check allows for it
/// ([`RateController::on_silence`]).
pub fn report_every(pace: ReportPace, last: &Feedback) -> Duration {
    let base = pace.base;
    let size = report_size(last);
    if size < REPORT_STRETCH_FROM || base >= pace.stretch_max {
        return base;
    }
    let secs = last.interval.as_secs_f64() * pace.datagrams as f64 / size as f64;
    Duration::from_secs_f64(secs.min(pace.stretch_max.as_secs_f64())).clamp(base, pace.stretch_max)
}

/// The receiver's report cadence: [`report_interval`] for the first [`REPORTS_AT_START`]
/// reports and after a report whose arrival rate rose above the last few ([`REPORT_RISING`]),
/// else [`report_every`] of the latest report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportCadence {
    pace: ReportPace,
    reports: u64,
    every: Duration,
    /// The arrival rates of the latest [`REPORT_RISING_OVER`] reports, datagrams per second
    /// (report `n` at `n % REPORT_RISING_OVER`).
    recent: [f64; REPORT_RISING_OVER],
}

impl ReportCadence {
    /// The cadence at `pace`, before the first report.
    pub fn new(pace: ReportPace) -> Self {
        ReportCadence {
            pace,
            reports: 0,
            every: pace.base,
            recent: [0.0; REPORT_RISING_OVER],
        }
    }

    /// How long after the latest report the next one is due.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Notes report `sent` (as the sender will read it; see [`Feedback::of_report`]).
    pub fn sent(&mut self, sent: &Feedback) {
        let rate = sent.datagrams as f64 / sent.interval.as_secs_f64().max(1e-6);
        let highest = self.recent.iter().copied().fold(0.0, f64::max);
        let rising = rate > highest * REPORT_RISING;
        self.recent[(self.reports % REPORT_RISING_OVER as u64) as usize] = rate;
        self.reports = self.reports.saturating_add(1);
        self.every = if self.reports < REPORTS_AT_START || rising {
            self.pace.base
        } else {
            report_every(self.pace, sent)
        };
    }
}

/// How long what a transfer learnt of a path is used for the next one (see [`PathMemory`]).
pub const MEMORY_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// What a remembered round trip may differ by beyond a factor of two ([`PathMemory::fits`]):
/// on loopback or a LAN the key agreement's round trip is mostly CPU, 0.1 ms on an idle
/// machine and ten on a busy one.
pub const RTT_SLACK: Duration = Duration::from_millis(10);

/// What a transfer learnt of its path, for the next one to the same receiver: `auto`'s
/// bottleneck at its end and the round-trip time measured at its start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathMemory {
    /// The model's bottleneck rate, bits per second.
    pub bottleneck_bps: u64,
    /// The round-trip time the transfer measured at its handshake.
    pub rtt: Duration,
}

impl PathMemory {
    /// What a finished transfer leaves for the next one: `None` unless its controller is
    /// `auto` and left startup (a model still in startup knows only a lower bound); the
    /// bottleneck from before a cut at its end ([`model::Model::bottleneck_to_remember`]).
    pub fn of(ctl: &RateController) -> Option<PathMemory> {
        let model = ctl.model()?;
        if model.phase() == model::Phase::Startup {
            return None;
        }
        let bps = model.bottleneck_to_remember()?;
        (bps.is_finite() && bps >= 1.0).then(|| PathMemory {
            bottleneck_bps: bps.min(u64::MAX as f64 / 2.0) as u64,
            rtt: ctl.config().rtt,
        })
    }

    /// Whether this memory, `age` old, still describes a path whose round trip measures `rtt`
    /// now: younger than [`MEMORY_LIFETIME`], and the round trip within a factor of two (and
    /// [`RTT_SLACK`], for short paths, whose round trip at the key agreement is mostly the two
    /// sides' CPU) of the remembered one; another round trip is another path.
    pub fn fits(&self, age: Duration, rtt: Duration) -> bool {
        self.fits_range(age, (rtt, rtt))
    }

    /// [`PathMemory::fits`] for a path whose round trip is known to lie between `lo` and `hi`
    /// ([`rtt::PathRtt::range`]: the kernel's floor and the key agreement's timing, which a
    /// busy host inflates by tens of milliseconds): the remembered round trip within a factor
    /// of two (and [`RTT_SLACK`]) of some round trip in that range.
    pub fn fits_range(&self, age: Duration, (lo, hi): (Duration, Duration)) -> bool {
        let slack = RTT_SLACK;
        age <= MEMORY_LIFETIME
            && self.bottleneck_bps > 0
            && lo <= self.rtt * 2 + slack
            && hi * 2 + slack >= self.rtt
    }
}

impl RateConfig {
    /// Queueing delay above which `fair` sees congestion (see [`model::queue_target`] for
    /// `auto`).
    pub fn delay_target(&self) -> Duration {
        match self.mode {
            RateMode::Fair => Duration::from_millis(5).max(self.rtt / 20),
            _ => Duration::from_millis(40).max(self.rtt / 2),
        }
    }
}

/// What the receiver saw during one report interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Feedback {
    /// Length of the interval.
    pub interval: Duration,
    /// Bytes of datagrams received (all, including repairs and duplicates).
    pub bytes: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Datagrams missing by packet number.
    pub lost: u64,
    /// Datagrams the kernel dropped because the socket buffer was full.
    pub socket_drops: u64,
    /// Mean one-way delay above the lowest seen in the session.
    pub queue_delay: Duration,
    /// The fullest a receiver socket buffer got, as a share of its limit (0 to 1).
    pub queue_fill: f64,
    /// How late the receiver's own timer runs (smoothed): a receiver starved of CPU runs in
    /// lumps this far apart. Where the receiver times datagrams by the kernel's arrival stamps
    /// its lumps are not in `queue_delay`, but the margin stays: on a busy machine the
    /// sender's own late wake-ups, repaid in bursts, move the delay by as much, and a
    /// standing queue of that size keeps the bottleneck busy through them. (Without the
    /// margin a long path on a busy machine is no faster, slightly slower if anything, so the
    /// margin the controller was tuned with stays.)
    pub receiver_lag: Duration,
    /// The longest a complete block waited for the receiver's writer (its disk); also in
    /// `queue_delay`.
    pub disk_wait: Duration,
    /// How full the receiver's writer queue got (0 to 1); also in `queue_fill`.
    pub disk_fill: f64,
    /// The bottleneck's rate by the spacing of back-to-back datagrams, bits per second
    /// ([`dispersion`]); `None` when the receiver had too few trains to tell.
    pub train_rate: Option<f64>,
}

impl Feedback {
    /// The controller's view of a receiver's `Report`; `None` for other messages.
    pub fn of_report(msg: &Control) -> Option<Feedback> {
        match *msg {
            Control::Report {
                interval_us,
                bytes,
                datagrams,
                lost,
                drops,
                queue_delay_us,
                queue_fill,
                lateness_us,
                disk_wait_us,
                disk_fill,
                train_kbps,
                ..
            } => Some(Feedback {
                interval: Duration::from_micros(interval_us),
                bytes,
                datagrams,
                lost,
                socket_drops: drops,
                queue_delay: Duration::from_micros(queue_delay_us),
                queue_fill: f64::from(queue_fill.min(1000)) / 1000.0,
                receiver_lag: Duration::from_micros(lateness_us),
                disk_wait: Duration::from_micros(disk_wait_us),
                disk_fill: f64::from(disk_fill.min(1000)) / 1000.0,
                train_rate: (train_kbps > 0).then_some(train_kbps as f64 * 1000.0),
            }),
            _ => None,
        }
    }
}

/// The datagrams a receiver reports as lost (gaps in the per-channel packet numbers), from the
/// running totals of packet numbers spanned and datagrams received, so that reordering evens
/// out: a datagram one report counted as missing that then arrives late is not counted as lost
/// again by a later report, whose gaps it offsets first. A per-report difference clamped at
/// zero would count every reordered datagram as lost.
#[derive(Debug, Default, Clone)]
pub struct LostCount {
    reported: u64,
}

impl LostCount {
    /// Datagrams to report as lost now, from the totals so far.
    pub fn report(&mut self, spanned: u64, received: u64) -> u64 {
        let missing = spanned.saturating_sub(received);
        let lost = missing.saturating_sub(self.reported);
        self.reported += lost;
        lost
    }
}

/// Tracks one-way delay (receiver clock minus the sender's timestamp, both in wrapping
/// microseconds, from unsynchronised clocks) relative to the lowest seen: the part above the
/// lowest is queueing. What a receiver reports as [`Feedback::queue_delay`].
#[derive(Debug, Default, Clone)]
pub struct OneWayDelay {
    base: Option<u32>,
    min: i64,
}

impl OneWayDelay {
    /// Queueing delay in microseconds of a datagram sent at `sent_us` (sender clock) and
    /// received at `now_us` (receiver clock).
    pub fn sample(&mut self, now_us: u32, sent_us: u32) -> u64 {
        let d = now_us.wrapping_sub(sent_us);
        let base = *self.base.get_or_insert(d);
        let rel = i64::from(d.wrapping_sub(base) as i32);
        self.min = self.min.min(rel);
        (rel - self.min) as u64
    }
}

/// Why the rate changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// First rate.
    Start,
    /// Doubling during startup.
    Startup,
    /// Probing upward after a quiet round.
    Probe,
    /// Loss above the path's floor.
    Loss,
    /// Sending below the path's rate for a while, to empty a queue.
    Drain,
    /// Pacing at the modelled bottleneck.
    Cruise,
    /// Queueing delay above the target, or a queue building (less passed than was sent).
    Delay,
    /// The receiver's kernel dropped datagrams.
    SocketDrops,
    /// The receiver is falling behind: its socket buffers are filling.
    Backlog,
    /// No report came for a while: no faster than the model's bottleneck until one does, and
    /// halved over a long silence ([`RateController::on_silence`]).
    Silence,
}

impl Reason {
    /// Short lowercase name, for logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Startup => "startup",
            Reason::Probe => "probe",
            Reason::Loss => "loss",
            Reason::Drain => "drain",
            Reason::Cruise => "cruise",
            Reason::Delay => "delay",
            Reason::SocketDrops => "socket-drops",
            Reason::Backlog => "backlog",
            Reason::Silence => "silence",
        }
    }
}

/// A rate change, for the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateChange {
    /// When.
    pub at: Instant,
    /// New rate, bits per second.
    pub rate_bps: u64,
    /// Why.
    pub reason: Reason,
}

/// One report as the controller took it, for a picture of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportPoint {
    /// When it arrived.
    pub at: Instant,
    /// What the receiver got over its interval, bits per second.
    pub delivered_bps: u64,
    /// Its queueing delay.
    pub queue_delay: Duration,
    /// Datagrams missing by packet number, and all it counted (received plus missing).
    pub lost: u64,
    /// Datagrams received plus missing.
    pub seen: u64,
    /// The pacing rate after it, bits per second.
    pub rate_bps: u64,
    /// The bottleneck's rate by the receiver's trains, bits per second (0: not measured; see
    /// [`dispersion`]).
    pub train_bps: u64,
}

/// Receiver socket buffer fill above which the receiver counts as falling behind: past it a
/// stall of the reader, or a little more surplus, and the kernel drops.
pub const QUEUE_FILL_LIMIT: f64 = 0.5;
/// How many recent rounds the loss floor looks back over.
const FLOOR_ROUNDS: usize = 16;
/// The share of those rounds, the ones with the least loss, the floor's rate is taken from (so
/// that congested rounds do not count). Half of them read a bursty path's random loss as much
/// less than it was: over lossy-wifi-reorder's 2% in bursts of two the floor came to about
/// 1.2%, and 9% of the rounds went beyond it (about five cuts a second on random loss alone).
const FLOOR_QUIET_SHARE: (usize, usize) = (3, 4);
/// The most [`LossFloor::dispersion`] is taken to be: loss in bursts of a few datagrams, not
/// whatever a congested round adds.
pub const MAX_LOSS_DISPERSION: f64 = 4.0;

/// The random loss of a path, as its recent reports show it ([`RateController::random_loss`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossFloor {
    /// The loss rate random loss alone explains, erring high.
    pub rate: f64,
    /// How many times the variance of a report's lost count is what independent losses at the
    /// reports' pooled rate would give (1 to [`MAX_LOSS_DISPERSION`]): a path that loses
    /// datagrams in bursts (lossy-wifi-reorder, bursts of two on average: about 3) has counts
    /// that vary that much more, and one report's count is judged against that noise.
    pub dispersion: f64,
}

impl LossFloor {
    /// A floor of independent losses at `rate`.
    pub fn independent(rate: f64) -> LossFloor {
        LossFloor {
            rate,
            dispersion: 1.0,
        }
    }
}

/// Datagrams the receiver's kernel dropped (a report's `socket_drops`) that no report's lost
/// count has taken yet: they show as gaps in the packet numbers, in that report or a later
/// one, and are the receiver's loss, not the path's.
#[derive(Debug, Default, Clone)]
pub struct ReceiverDrops {
    unexplained: u64,
}

impl ReceiverDrops {
    /// Counts the drops a report carried (also a report of no datagrams: a reader that stalled
    /// while its buffer overflowed).
    pub fn note(&mut self, drops: u64) {
        self.unexplained = self.unexplained.saturating_add(drops);
    }

    /// How many of a report's `lost` datagrams the receiver's drops explain; they are taken.
    pub fn explain(&mut self, lost: u64) -> u64 {
        let explained = lost.min(self.unexplained);
        self.unexplained -= explained;
        explained
    }
}

/// Loss above what the floor explains that counts as congestion, as a share of the round's
/// datagrams (on top of the floor's own noise, see [`RateController::on_feedback`]).
const LOSS_MARGIN: f64 = 0.005;
/// Datagrams counted before [`RateController::loss_share`] names a loss rate.
pub const LOSS_SHARE_AFTER: u64 = 1000;
/// Outside startup one report cuts the rate to no less than this share of it.
const MAX_CUT: f64 = 0.5;
/// Outside startup, a judged round that delivered less than this share of the rate (or less,
/// after a large increase) means the surplus is queueing somewhere.
const SATURATED: f64 = 0.97;
/// The same in startup, where the rate doubles.
const STARTUP_SATURATED: f64 = 0.75;
/// Longest report interval, queueing delay or RTT taken at face value.
const MAX_REPORTED: Duration = Duration::from_secs(3600);
/// `fair`: share of the rate given up per report for each delay target's worth of queueing
/// delay over the target (at most twice that: a cut to half at three times the target).
const FAIR_CUT: f64 = 0.25;
/// `fair`: increase per round before any doubling, with an empty queue; less the closer the
/// queueing delay is to the target. Doubled step at most [`FAIR_GAIN_MAX`] (below the last
/// congestion's delivered rate) or 1 (no such rate known: as fast as startup).
const FAIR_GAIN: f64 = 0.1;
/// `fair`: largest doubled step below the last congestion's delivered rate.
const FAIR_GAIN_MAX: f64 = 0.5;
/// `fair`: the base step within 3% of or above the delivered rate of the last congestion...
const FAIR_PROBE_GAIN: f64 = 0.03;
/// ... and the largest it doubles to there.
const FAIR_PROBE_GAIN_MAX: f64 = 0.12;
/// `fair`: most doublings of the step over rounds with an empty queue.
const FAIR_MAX_DOUBLINGS: u32 = 6;

/// The sender's rate controller. See the module docs.
#[derive(Debug, Clone)]
pub struct RateController {
    cfg: RateConfig,
    rate: f64,
    startup: bool,
    hold_until: Option<Instant>,
    /// (lost, seen) datagrams of recent rounds.
    recent_loss: VecDeque<(u64, u64)>,
    /// (lost, seen) datagrams of every report whose loss the floor explained (not
    /// congestion), for [`RateController::loss_share`].
    random: (u64, u64),
    /// (lost, seen) datagrams of every report, whatever their cause, for
    /// [`RateController::lost_nothing`].
    all_loss: (u64, u64),
    /// Delivery rate the last time congestion was seen: where the path's capacity was.
    capacity: Option<f64>,
    /// Rounds in a row with an empty queue: how many times the probing step has doubled.
    quiet_above: u32,
    /// New rate over old rate of the last change; `None` before the first.
    last_change: Option<f64>,
    /// Queueing delay of the previous report.
    prev_delay: Duration,
    /// `auto`'s model of the path; `None` in the other modes.
    model: Option<Model>,
    /// Channels the rate is shared among ([`RateController::set_channels`]).
    channels: u16,
    /// How many times startup's trains have doubled past their share of the round trip
    /// ([`STARTUP_TRAIN_DOUBLINGS`] at most).
    train_doublings: u32,
    /// The receiver's drops, which the loss floor does not count: they are not the path's
    /// random loss.
    drops: ReceiverDrops,
    timeline: Record<RateChange>,
    reports: Record<ReportPoint>,
    changes: u64,
    /// Changes by reason (the first rate not counted), and the lowest and highest rate set.
    reasons: Vec<(Reason, u64)>,
    rate_range: (u64, u64),
    /// When the latest report came, and, once the reports fell silent, the rate the silence
    /// began from: the model's bottleneck, or the rate if it was lower
    /// ([`RateController::on_silence`]).
    last_report: Option<Instant>,
    /// When the next report is due after the latest, at the longest the receiver's
    /// [`ReportCadence`] spaces it (its exception for a rising rate only shortens it, and
    /// reports lost on the way only delay the stretch here), and how many reports came (the
    /// cadence stretches after [`REPORTS_AT_START`]).
    report_spacing: Duration,
    /// The receiver's pace of reports, as far as this side can tell: from the round trip
    /// configured at the start (the receiver takes its cadence from its own timing of the key
    /// agreement, and [`RateController::set_rtt`] does not change it), not a short path's
    /// unless [`RateController::set_report_pace`] says so.
    report_pace: ReportPace,
    reports_heard: u64,
    silenced: Option<f64>,
    /// The bits the rate paced until `paced.1` (what a silence sent into the path).
    paced: (f64, Instant),
    /// When the latest report that counted delivered datagrams came, and the bits paced then.
    last_delivery: Option<(Instant, f64)>,
    outages: Outages,
    /// A silence being judged for an outage.
    outage_check: Option<OutageCheck>,
    /// The receiver's kernel drops reported since the latest report that delivered.
    silent_drops: u64,
}

/// A silence being judged for an outage ([`RateController::outages`]).
#[derive(Debug, Clone, Copy)]
struct OutageCheck {
    /// The time between the delivering reports around it.
    gap: Duration,
    /// Until when reports' path losses count for it.
    until: Instant,
    /// The losses counted so far ...
    lost: u64,
    /// ... and the receiver's kernel drops, the silence's included (not the path's).
    drops: u64,
    /// The path losses that make it an outage: a quarter of what the rate paced in `gap`.
    need: f64,
}

/// Fewest path losses that make a silence an outage, however low the rate.
const OUTAGE_LEAST_LOST: f64 = 8.0;

/// Times the path delivered nothing while data was being sent ([`RateController::outages`]):
/// no report counted a datagram for longer than the silence limit (four report intervals, and
/// at least a round trip and two), and the reports from the first that did again to a silence
/// limit later counted at least a quarter of what the rate paced in that time lost on the
/// path: what was sent meanwhile never came (a route flap, a Wi-Fi handover, a cable pulled and put
/// back). A receiver starved of CPU is silent too, but what it did not read its kernel dropped
/// (its socket drops) or it reads late: no outage. Nor is a sender with little to send (a
/// transfer's tail of repairs), whose few losses are not what its rate would have sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outages {
    /// How many.
    pub count: u32,
    /// Their lengths added up: each, the time between the reports that delivered around it,
    /// less one report interval (the reports' own spacing).
    pub total: Duration,
}

/// Report intervals without a report after which `auto` paces no faster than its model's
/// bottleneck ([`RateController::on_silence`]); at least a round trip and two intervals.
pub const SILENCE_REPORTS: u32 = 4;
/// A silence this much longer than that (or four round trips, if longer) halves the rate, and
/// each such span after it halves it again ([`RateController::on_silence`]).
pub const SILENCE_BACKOFF: Duration = Duration::from_secs(2);
/// Most halvings of a silence: 1/64 of the rate it began from (at 500 Mbit/s, 7.8).
pub const SILENCE_HALVINGS: u32 = 6;

/// Whether `lost` of `seen` datagrams is congestion rather than the random loss the `floor`
/// explains: over half of them, or more than the floor's share by more than that count's noise
/// (three standard deviations of a Poisson count, times the root of the floor's
/// [`LossFloor::dispersion`], plus two datagrams) plus 0.5% of them. So few datagrams need more
/// than a loss or two, and a clean path that has been watched for a while notices an overshoot
/// of about 1%.
pub fn loss_beyond(floor: Option<LossFloor>, lost: u64, seen: u64) -> bool {
    let seen_f = seen as f64;
    lost as f64 > seen_f * 0.5
        || floor.is_some_and(|floor| {
            let expected = floor.rate * seen_f;
            let noise = 3.0 * (expected * floor.dispersion.max(1.0)).sqrt() + 2.0;
            lost as f64 > expected + noise + LOSS_MARGIN * seen_f
        })
}

/// Most entries a [`Record`] keeps.
const TIMELINE_CAP: usize = 256;
/// Of them, the latest, kept whole.
const RECORD_RECENT: usize = 64;

/// A run's rate changes or reports, small however long the run: the latest [`RECORD_RECENT`]
/// whole, and the older ones spread evenly over the run before them (every `stride`-th kept;
/// when that part is full, every other one of it goes and the stride doubles). Until session
/// 35 a full record dropped every other entry of the whole: a long run's early part was
/// thinned once per filling and its late part never (a 47 s run's first 37 s showed a handful
/// of points).
#[derive(Debug, Clone)]
struct Record<T> {
    older: Vec<T>,
    recent: VecDeque<T>,
    stride: u64,
    /// Entries moved from `recent` to the older part (kept or not) so far.
    aged: u64,
}

impl<T: Clone> Record<T> {
    fn new() -> Self {
        Record {
            older: Vec::new(),
            recent: VecDeque::new(),
            stride: 1,
            aged: 0,
        }
    }

    fn push(&mut self, item: T) {
        self.recent.push_back(item);
        if self.recent.len() <= RECORD_RECENT {
            return;
        }
        let Some(old) = self.recent.pop_front() else {
            return;
        };
        let n = self.aged;
        self.aged += 1;
        if !n.is_multiple_of(self.stride) {
            return;
        }
        if self.older.len() >= TIMELINE_CAP - RECORD_RECENT {
            let mut i = 0;
            self.older.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
            if !n.is_multiple_of(self.stride) {
                return;
            }
        }
        self.older.push(old);
    }

    /// Everything kept, oldest first.
    fn to_vec(&self) -> Vec<T> {
        self.older.iter().chain(&self.recent).cloned().collect()
    }

    fn first_mut(&mut self) -> Option<&mut T> {
        match self.older.first_mut() {
            Some(first) => Some(first),
            None => self.recent.front_mut(),
        }
    }

    fn last(&self) -> Option<&T> {
        self.recent.back()
    }
}

impl RateController {
    /// A controller starting at `now`.
    pub fn new(cfg: RateConfig, now: Instant) -> Self {
        let ceiling = cfg.ceiling_bps.max(cfg.min_bps).max(1) as f64;
        let start = match cfg.mode {
            RateMode::Fixed => ceiling,
            _ => (cfg.start_bps as f64).clamp(cfg.min_bps.max(1) as f64, ceiling),
        };
        let model =
            (cfg.mode == RateMode::Auto).then(|| Model::new(cfg.rtt.min(MAX_REPORTED), now));
        let report_pace = ReportPace::new(cfg.rtt, false);
        let mut c = RateController {
            cfg,
            model,
            channels: 1,
            train_doublings: 0,
            drops: ReceiverDrops::default(),
            rate: start,
            startup: true,
            hold_until: None,
            recent_loss: VecDeque::new(),
            random: (0, 0),
            all_loss: (0, 0),
            capacity: None,
            quiet_above: 0,
            last_change: None,
            prev_delay: Duration::ZERO,
            timeline: Record::new(),
            reports: Record::new(),
            changes: 0,
            reasons: Vec::new(),
            rate_range: (u64::MAX, 0),
            last_report: None,
            report_spacing: report_pace.base,
            report_pace,
            reports_heard: 0,
            silenced: None,
            paced: (0.0, now),
            last_delivery: None,
            outages: Outages::default(),
            outage_check: None,
            silent_drops: 0,
        };
        c.record(now, Reason::Start);
        c
    }

    /// Starts from a path seen before, if `memory` (`age` old) still [fits](PathMemory::fits)
    /// it and the mode is `auto`: at half the remembered bottleneck (if that is above the
    /// configured start; never above the ceiling), with startup ending at the bottleneck
    /// remembered. Call it before the first report. Returns the start rate it set, if it did.
    pub fn resume(&mut self, memory: &PathMemory, age: Duration) -> Option<u64> {
        self.resume_within(memory, age, (self.cfg.rtt, self.cfg.rtt))
    }

    /// [`RateController::resume`] on a path whose round trip lies between `range`'s ends
    /// ([`PathMemory::fits_range`]).
    pub fn resume_within(
        &mut self,
        memory: &PathMemory,
        age: Duration,
        range: (Duration, Duration),
    ) -> Option<u64> {
        let model = self.model.as_mut()?;
        if self.changes != 1 || !memory.fits_range(age, range) {
            return None;
        }
        let ceiling = self.cfg.ceiling_bps.max(self.cfg.min_bps).max(1) as f64;
        let remembered = (memory.bottleneck_bps as f64).min(ceiling);
        model.resume(remembered);
        let half = remembered / 2.0;
        if half > self.rate {
            self.rate = half;
            if let Some(start) = self.timeline.first_mut() {
                start.rate_bps = half as u64;
            }
            // The first rate is the only one so far.
            self.rate_range = (half as u64, half as u64);
        }
        Some(self.rate as u64)
    }

    /// Takes `rtt` as the path's round trip from now on, in place of the one configured (the
    /// key agreement's, lowered by later samples: [`rtt::PathRtt`]): what the model times its
    /// rounds and judges its reports by, and what [`PathMemory`] keeps. The receiver's report
    /// cadence, which it took from its own timing, is still expected as configured.
    pub fn set_rtt(&mut self, rtt: Duration) {
        self.cfg.rtt = rtt;
        if let Some(model) = self.model.as_mut() {
            model.set_rtt(rtt.min(MAX_REPORTED));
        }
    }

    /// Raises the first rate to `bps` (within the ceiling), if it is lower and no rate has
    /// been set since it (nor any report taken); returns the first rate then. For
    /// [`initial_rate`] at a round trip found shorter than the configured one
    /// ([`RateController::set_rtt`]) or a payload found larger, before the first report: the
    /// key agreement's round trip, inflated by both sides' CPU, and the payload before the
    /// probes found the path's largest made the first rate the floor on loopback (100 Mbit/s
    /// at 19 ms; the probes' answers said 2.9 ms, and 8,900 bytes, 249 Mbit/s), and startup,
    /// which doubles once per report interval there, took a report or two longer to the
    /// path's rate. Not in `fixed` mode, which starts at its rate.
    pub fn raise_start(&mut self, now: Instant, bps: u64) -> Option<u64> {
        if self.cfg.mode == RateMode::Fixed || self.changes != 1 || self.reports_heard != 0 {
            return None;
        }
        let ceiling = self.cfg.ceiling_bps.max(self.cfg.min_bps).max(1) as f64;
        let start = (bps as f64).min(ceiling);
        if start <= self.rate {
            return None;
        }
        self.paced = (self.paced_until(now), now.max(self.paced.1));
        self.rate = start;
        if let Some(first) = self.timeline.first_mut() {
            first.rate_bps = start as u64;
        }
        // The first rate is the only one so far.
        self.rate_range = (start as u64, start as u64);
        Some(start as u64)
    }

    /// Current rate, bits per second.
    pub fn rate_bps(&self) -> u64 {
        self.rate as u64
    }

    /// The configuration.
    pub fn config(&self) -> &RateConfig {
        &self.cfg
    }

    /// Sets how many channels the rate is shared among (1 until told): what each channel's
    /// train is ([`RateController::train_bytes`]), and so how much queue the trains of all of
    /// them make at once.
    pub fn set_channels(&mut self, channels: u16) {
        self.channels = channels.max(1);
    }

    /// The bytes each channel sends back to back now, at least (as far as its link allows):
    /// while `auto`'s startup lasts, [`startup_train_bytes`] at the channel's share of the
    /// rate, doubled once for each report so far that carried no estimate of the bottleneck
    /// ([`STARTUP_TRAIN_DOUBLINGS`] times at most, [`STARTUP_TRAIN_BYTES`] at most), so that
    /// the receiver can time the bottleneck by them behind GRO; otherwise 0 (the channels'
    /// usual sends).
    pub fn train_bytes(&self) -> u64 {
        match &self.model {
            Some(m) if m.phase() == model::Phase::Startup => {
                let share = startup_train_bytes(
                    self.rate_bps() / u64::from(self.channels.max(1)),
                    self.cfg.rtt,
                );
                (share << self.train_doublings).min(STARTUP_TRAIN_BYTES)
            }
            _ => 0,
        }
    }

    /// True while still in startup.
    pub fn in_startup(&self) -> bool {
        match &self.model {
            Some(m) => m.phase() == model::Phase::Startup,
            None => self.startup,
        }
    }

    /// `auto`'s model of the path (`None` in the other modes).
    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// Rate changes so far, oldest first: at most a few hundred, the latest whole and the
    /// older spread evenly over the run.
    pub fn timeline(&self) -> Vec<RateChange> {
        self.timeline.to_vec()
    }

    /// Rate changes by reason, all of them (the first rate not counted), in the order the
    /// reasons first came.
    pub fn reasons(&self) -> &[(Reason, u64)] {
        &self.reasons
    }

    /// The lowest and the highest rate set, bits per second.
    pub fn rate_range(&self) -> (u64, u64) {
        self.rate_range
    }

    /// Number of rate changes made.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The reports taken so far, oldest first, kept as the timeline is.
    pub fn reports(&self) -> Vec<ReportPoint> {
        self.reports.to_vec()
    }

    /// Keeps one report's loss for the loss floor (the last [`FLOOR_ROUNDS`] reports) and,
    /// unless it was `congestion`, for [`RateController::loss_share`].
    fn note_loss(&mut self, lost: u64, seen: u64, congestion: bool) {
        if !congestion {
            self.random.0 = self.random.0.saturating_add(lost);
            self.random.1 = self.random.1.saturating_add(seen);
        }
        self.recent_loss.push_back((lost, seen));
        if self.recent_loss.len() > FLOOR_ROUNDS {
            self.recent_loss.pop_front();
        }
    }

    /// The loss rate random loss explains, from recent reports (`None` before any): an upper
    /// bound (the floor's rate), which is what parity is sized by. For what the path lost, see
    /// [`RateController::loss_share`].
    pub fn random_loss(&self) -> Option<f64> {
        self.loss_floor().map(|f| f.rate)
    }

    /// The most missed time the pacers may repay after their sender stalled:
    /// [`crate::channel_send::MAX_OWED`], or nothing once `auto`'s model found the path's buffer
    /// shallow ([`Model::shallow`]). Repaying puts the missed time's data into the
    /// bottleneck's queue at once: on a deep buffer it refills the reserve the link sent from
    /// during the stall ([`model::stall_reserve`]); a shallow buffer, which holds no reserve,
    /// drops what does not fit, which then reads as congestion and cuts the rate.
    pub fn catch_up(&self) -> Duration {
        if self.model.as_ref().is_some_and(Model::shallow) {
            Duration::ZERO
        } else {
            crate::channel_send::MAX_OWED
        }
    }

    /// The share of datagrams the path lost in the reports that showed no congestion, over
    /// the whole transfer: its random loss, for a summary. `None` until [`LOSS_SHARE_AFTER`]
    /// datagrams were counted (an 8 KiB file's few datagrams say nothing of it, while the
    /// floor's bound over them is 50%).
    pub fn loss_share(&self) -> Option<f64> {
        let (lost, seen) = self.random;
        (seen >= LOSS_SHARE_AFTER).then(|| lost as f64 / seen as f64)
    }

    /// Whether the reports so far counted at least [`LOSS_SHARE_AFTER`] datagrams and not one
    /// lost, to congestion or otherwise: the tail goes without parity then
    /// ([`crate::fec`]). In every mode.
    pub fn lost_nothing(&self) -> bool {
        let (lost, seen) = self.all_loss;
        seen >= LOSS_SHARE_AFTER && lost == 0
    }

    /// Takes one report (see [`RateController::on_feedback`]) and keeps it for
    /// [`RateController::reports`].
    pub fn on_report(&mut self, now: Instant, fb: &Feedback) -> Option<RateChange> {
        let change = self.on_feedback(now, fb);
        let secs = fb.interval.as_secs_f64();
        self.reports.push(ReportPoint {
            at: now,
            delivered_bps: if secs > 0.0 {
                (fb.bytes as f64 * 8.0 / secs).min(u64::MAX as f64 / 2.0) as u64
            } else {
                0
            },
            queue_delay: fb.queue_delay,
            lost: fb.lost,
            seen: fb.datagrams.saturating_add(fb.lost),
            rate_bps: self.rate_bps(),
            train_bps: fb
                .train_rate
                .map_or(0, |b| b.min(u64::MAX as f64 / 2.0) as u64),
        });
        change
    }

    fn record(&mut self, now: Instant, reason: Reason) {
        self.changes += 1;
        let rate_bps = self.rate as u64;
        self.timeline.push(RateChange {
            at: now,
            rate_bps,
            reason,
        });
        self.rate_range = (
            self.rate_range.0.min(rate_bps),
            self.rate_range.1.max(rate_bps),
        );
        if reason != Reason::Start {
            match self.reasons.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => self.reasons.push((reason, 1)),
            }
        }
    }

    /// The loss floor of recent rounds (`None` before the first round). Its rate is what random
    /// loss alone explains, erring high: the datagrams of the quieter three quarters of the
    /// recent rounds ([`FLOOR_QUIET_SHARE`], so that congested rounds do not count), pooled,
    /// with the count of lost ones raised to the top of its likely range
    /// (`lost + 2 + 2 sqrt(lost + 1)`), so that a floor seen over few datagrams is not taken for
    /// zero. Its dispersion is the variance of all the recent rounds' lost counts around their
    /// pooled rate, over that rate's expectation (1 to [`MAX_LOSS_DISPERSION`]).
    fn loss_floor(&self) -> Option<LossFloor> {
        let mut rounds: Vec<(u64, u64)> = self.recent_loss.iter().copied().collect();
        rounds.sort_by(|a, b| (a.0 as f64 / a.1 as f64).total_cmp(&(b.0 as f64 / b.1 as f64)));
        let (num, den) = FLOOR_QUIET_SHARE;
        // (Rounded down, but one at least: of three rounds, one of them congested, two.)
        let quiet = &rounds[..(rounds.len() * num / den).max(1).min(rounds.len())];
        let lost = quiet.iter().map(|r| r.0 as f64).sum::<f64>();
        let seen = quiet.iter().map(|r| r.1 as f64).sum::<f64>();
        if seen <= 0.0 {
            return None;
        }
        let rate = ((lost + 2.0 + 2.0 * (lost + 1.0).sqrt()) / seen).min(1.0);
        let all_lost = rounds.iter().map(|r| r.0 as f64).sum::<f64>();
        let all_seen = rounds.iter().map(|r| r.1 as f64).sum::<f64>();
        let pooled = all_lost / all_seen;
        let expected = all_lost / rounds.len() as f64;
        let variance = rounds
            .iter()
            .map(|&(l, s)| (l as f64 - pooled * s as f64).powi(2))
            .sum::<f64>()
            / rounds.len() as f64;
        let dispersion = if expected > 0.0 {
            (variance / expected).clamp(1.0, MAX_LOSS_DISPERSION)
        } else {
            1.0
        };
        Some(LossFloor { rate, dispersion })
    }

    /// Takes one report; returns the change made, if any. `fixed` ignores it; `auto` hands it
    /// to its [`Model`] with the loss floor; `fair` follows the rules below.
    ///
    /// Loss is congestion as [`loss_beyond`] says, against the floor of the *earlier* reports.
    ///
    /// A judged round is *saturated* if less passed the path (delivered, plus the lost share
    /// added back) than 97% of the rate (75% in startup, less after a large increase), and the
    /// mean queueing delay grew by at least half of what that surplus would queue in an
    /// interval; it counts as [`Reason::Delay`].
    ///
    /// On congestion the rate goes to the delivered rate (or the current rate, if lower) times
    /// 0.95 (0.8 on loss), or, past startup with the queue over the delay target, down by 25% per
    /// target's worth of excess (LEDBAT's rule, judged again after one round); for
    /// [`Reason::Backlog`], or a queue longer than the target, low enough to drain the queue
    /// within two holds. The hold that follows lasts until that queue has drained (at most two
    /// more rounds), and a queue seen shrinking after a cut is left to drain, unless a report
    /// shows the receiver's socket buffer over its limit and dropping while it delivered less
    /// than 95% of the new rate: then the rate is cut again. Outside startup one report never
    /// cuts more than half.
    ///
    /// Without congestion: in startup the rate doubles, but to no more than twice what was
    /// delivered; after it, the rate climbs in proportion to the room under the delay target,
    /// by a smaller step near the delivered rate of the last congestion, the step doubling over
    /// rounds in which the queue stays empty.
    ///
    /// The first report after a silence brings the rate back to where the silence began from
    /// (if it was halved meanwhile), before it is judged.
    pub fn on_feedback(&mut self, now: Instant, fb: &Feedback) -> Option<RateChange> {
        self.last_report = Some(now);
        let resumed = match self.silenced.take() {
            Some(rate) if rate > self.rate => self.set_rate(now, rate, Reason::Cruise),
            _ => None,
        };
        self.note_outage(now, fb);
        self.reports_heard = self.reports_heard.saturating_add(1);
        let (lost, seen) = self.all_loss;
        self.all_loss = (
            lost.saturating_add(fb.lost),
            seen.saturating_add(fb.datagrams).saturating_add(fb.lost),
        );
        let pace = self.report_pace;
        self.report_spacing = if self.reports_heard < REPORTS_AT_START {
            pace.base
        } else {
            report_every(pace, fb)
        };
        self.judge(now, fb).or(resumed)
    }

    /// [`RateController::on_feedback`]'s judgment of a report.
    fn judge(&mut self, now: Instant, fb: &Feedback) -> Option<RateChange> {
        let seen = fb.datagrams.saturating_add(fb.lost);
        if self.cfg.mode == RateMode::Fixed {
            // The rate stays; the loss is kept all the same, for what random loss the path
            // has ([`RateController::random_loss`]: the tail's parity is sized by it).
            if seen > 0 && !fb.interval.is_zero() {
                let lost = fb.lost.min(seen);
                self.note_loss(lost, seen, loss_beyond(self.loss_floor(), lost, seen));
            }
            return None;
        }
        if seen == 0 || fb.interval.is_zero() {
            self.drops.note(fb.socket_drops);
            if let Some(model) = self.model.as_mut() {
                model.note_drops(fb.socket_drops);
            }
            return None;
        }
        // The peer's numbers: keep the durations in a range where the arithmetic cannot overflow.
        let fb = &Feedback {
            interval: fb.interval.min(MAX_REPORTED),
            queue_delay: fb.queue_delay.min(MAX_REPORTED),
            receiver_lag: fb.receiver_lag.min(MAX_REPORTED),
            disk_wait: fb.disk_wait.min(MAX_REPORTED),
            ..*fb
        };
        // Queueing delay that moves within twice the receiver's lag is its lumps, not a queue.
        let noise = fb.receiver_lag * 2;
        let loss = fb.lost as f64 / seen as f64;
        let floor = self.loss_floor();
        let loss_congestion = loss_beyond(floor, fb.lost, seen);
        // The floor is the path's: the receiver's own drops (a receiver short of CPU drops in
        // bursts, which made the floor high and its dispersion the largest) are left out.
        self.drops.note(fb.socket_drops);
        let receivers = self.drops.explain(fb.lost);
        self.note_loss((fb.lost - receivers).min(seen), seen, loss_congestion);
        // The queue the channels' trains make when they meet at the bottleneck: startup does
        // not take it for the path's.
        let train = self.train_bytes();
        let trains_bits = (train * u64::from(self.channels) * 8) as f64;
        // Trains the receiver could not time were too short for its buffers, or broken up by
        // jitter: the next ones are longer.
        if fb.train_rate.is_none() && train > 0 && train < STARTUP_TRAIN_BYTES {
            self.train_doublings = (self.train_doublings + 1).min(STARTUP_TRAIN_DOUBLINGS);
        }
        if let Some(model) = self.model.as_mut() {
            let sig = Signals {
                floor,
                noise,
                trains_bits,
            };
            let (new, why) = model.on_report(now, fb, sig, self.rate)?;
            return self.set_rate(now, new, why);
        }
        let delivered = fb.bytes as f64 * 8.0 / fb.interval.as_secs_f64();
        let measured = delivered.is_finite() && delivered > 0.0;
        // What left the queues: the delivered rate with the lost datagrams added back (they
        // were dropped, not queued), so random loss alone does not look like a queue.
        let passed = delivered / (1.0 - loss).max(0.5);
        let last_cut = self.last_change.is_some_and(|r| r < 1.0);
        let prev_delay = std::mem::replace(&mut self.prev_delay, fb.queue_delay);
        // A receiver whose socket buffer is full and dropping takes exactly what it can, so a
        // rate above what it delivered overflows it however old the report's data is: a cut
        // that left the rate there was not deep enough, and waiting for the queue to drain
        // would only wait through more drops.
        let overflowing = fb.socket_drops > 0
            && fb.queue_fill > QUEUE_FILL_LIMIT
            && measured
            && delivered < self.rate * 0.95;
        // A queue that is draining after a cut is no reason to cut again, nor to speed up.
        if last_cut
            && !overflowing
            && fb.queue_delay > self.cfg.delay_target()
            && fb.queue_delay < prev_delay
        {
            return None;
        }
        // What the receiver saw.
        let seen_congestion = if fb.socket_drops > 0 {
            Some(Reason::SocketDrops)
        } else if fb.queue_fill > QUEUE_FILL_LIMIT {
            Some(Reason::Backlog)
        } else if fb.queue_delay > self.cfg.delay_target() + noise {
            Some(Reason::Delay)
        } else if loss_congestion {
            Some(Reason::Loss)
        } else {
            None
        };
        if self.hold_until.is_some_and(|t| now < t) {
            // After a cut the queue is still draining: wait, whatever the report says, unless
            // the receiver overflows at the new rate. After an increase, congestion the
            // receiver already sees is acted on at once (it cannot be older than the increase:
            // the report that allowed the increase was quiet).
            if (last_cut && !overflowing) || seen_congestion.is_none() {
                return None;
            }
        }
        // A judged round (its data was all sent after the last change, give or take a quarter
        // interval) that delivered clearly less than the rate while the queueing delay grew
        // accordingly: the surplus is filling a queue. Not before the first change (the first
        // report also covers the first one-way delay, when nothing can arrive), and outside
        // startup not below half the rate (the sender had little to send).
        let saturated = self.last_change.is_some_and(|ratio| {
            let share = if self.startup {
                STARTUP_SATURATED
            } else {
                // Some of the interval at the old rate weighs more after a larger increase.
                SATURATED.min(1.0 - (ratio - 1.0) / 8.0)
            };
            // Sending 1/share times what the path takes for an interval queues at least
            // (1 - share) of an interval; ask for half of that in the mean delay.
            let growth = fb.interval.mul_f64((1.0 - share) / 2.0);
            measured
                && (self.startup || delivered >= self.rate / 2.0)
                && passed < self.rate * share
                && fb.queue_delay >= prev_delay + growth + noise
        });
        let reason = seen_congestion.or(saturated.then_some(Reason::Delay));
        // Judge the new rate by the first report whose data was sent after the change: one
        // round trip (with what is queued now) plus one report interval later. Reports come
        // once per interval, so a quarter interval of slack lets that one through despite
        // timing noise.
        let rtt = self.cfg.rtt.min(MAX_REPORTED);
        let mut hold = rtt + fb.queue_delay + fb.interval.mul_f64(0.75);
        let fair = self.cfg.mode == RateMode::Fair;
        let (new, why) = match reason {
            Some(r) => {
                let base = if measured {
                    self.capacity = Some(delivered);
                    self.rate.min(delivered)
                } else {
                    self.rate
                };
                // `fair` gives up more on loss: with a competing flow, a queue that overflows
                // is shared.
                let factor: f64 = if fair && r == Reason::Loss { 0.8 } else { 0.95 };
                // A filling socket buffer is a queue too, at the receiver: drain it the same way.
                let queue_cut = matches!(r, Reason::Delay | Reason::Backlog);
                // The queue now: what the report saw, plus, for a queue on the path, what the
                // surplus over the delivered rate has added since its data was sent. Not for a
                // receiver's socket buffer: it cannot hold more than it did by much (half full
                // already), and what does not fit is dropped, which the next report shows.
                let surplus = if measured && r == Reason::Delay {
                    (self.rate / delivered - 1.0).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let queue = fb.queue_delay + (rtt + fb.interval).mul_f64(surplus);
                // `fair`, past startup, over its delay target: the queue may well be someone
                // else's, so back off in proportion to how far over the target it is (LEDBAT's
                // rule), not to drain it, and judge again after one round.
                let yield_to_queue = fair
                    && !self.startup
                    && r == Reason::Delay
                    && fb.queue_delay > self.cfg.delay_target();
                // When the queue itself is the problem (or longer than the mode accepts), go low
                // enough to drain it within two holds. A short queue that drops (a shallow
                // bottleneck, a socket buffer) only needs the rate below capacity: it drains at
                // the mode's margin.
                let factor = if yield_to_queue {
                    let over =
                        fb.queue_delay.as_secs_f64() / self.cfg.delay_target().as_secs_f64() - 1.0;
                    1.0 - FAIR_CUT * over.min(2.0)
                } else if queue_cut || queue > self.cfg.delay_target() {
                    let drain = 1.0 - queue.as_secs_f64() / (2.0 * hold.as_secs_f64()).max(1e-6);
                    factor.min(drain).max(0.5)
                } else {
                    factor
                };
                let mut new = base * factor;
                if !self.startup {
                    new = new.max(self.rate * MAX_CUT);
                }
                // And wait for the queue to drain at that rate before judging again (at most
                // two more rounds).
                if !yield_to_queue {
                    hold += queue
                        .mul_f64(1.0 / (1.0 - factor))
                        .min((rtt + fb.interval) * 2);
                }
                self.startup = false;
                self.quiet_above = 0;
                (new, r)
            }
            None if self.startup => {
                let limit = if measured {
                    2.0 * delivered
                } else {
                    2.0 * self.rate
                };
                (self.rate.max(limit.min(2.0 * self.rate)), Reason::Startup)
            }
            // The sender had little to send: nothing learnt about the path.
            None if measured && delivered < self.rate / 2.0 => (self.rate, Reason::Probe),
            // `fair`: climb in proportion to the room under the delay target, by a smaller step
            // near and above the delivered rate of the last congestion, and never jump back to
            // it: a competing flow may be using it now. A queue that stays empty round after
            // round means the path has room (the competitor left): the step doubles each such
            // round, so the rate is back in a few rounds, not minutes.
            None => {
                let target = self.cfg.delay_target();
                let under = 1.0 - fb.queue_delay.as_secs_f64() / target.as_secs_f64();
                if self.capacity.is_some_and(|c| self.rate > c * 1.25) {
                    // Well past it without congestion: it no longer says anything.
                    self.capacity = None;
                }
                self.quiet_above = if fb.queue_delay < target / 4 {
                    (self.quiet_above + 1).min(FAIR_MAX_DOUBLINGS)
                } else {
                    0
                };
                let doubled =
                    |base: f64| base * f64::from(1u32 << self.quiet_above.saturating_sub(1));
                let new = match self.capacity {
                    Some(c) if self.rate >= c * 0.97 => {
                        self.rate
                            * (1.0 + doubled(FAIR_PROBE_GAIN).min(FAIR_PROBE_GAIN_MAX) * under)
                    }
                    Some(c) => {
                        (self.rate * (1.0 + doubled(FAIR_GAIN).min(FAIR_GAIN_MAX) * under)).min(c)
                    }
                    None => self.rate * (1.0 + doubled(FAIR_GAIN).min(1.0) * under),
                };
                (new, Reason::Probe)
            }
        };
        self.hold_until = now.checked_add(hold);
        self.set_rate(now, new, why)
    }

    /// Moves to `new` (within the configured floor and ceiling) and records why; `None` if that
    /// changes the rate by less than 0.1%.
    /// For `auto`, called now and then between reports (every report interval or so): once no
    /// report has come for [`SILENCE_REPORTS`] report intervals (and at least a round trip and
    /// two intervals) since the last, the rate goes down to the model's bottleneck if it was
    /// above it (startup, a probe, cruising's reserve), until the next report. A receiver
    /// starved of CPU reports late and in lumps, and a second of startup's doubled rate, sent
    /// while it said nothing, overflowed its buffers by thousands of datagrams; a path that
    /// lost its reports says nothing either. Not below the bottleneck for the first
    /// [`silence_backoff`](RateController::silence_backoff) (at least [`SILENCE_BACKOFF`]):
    /// after an outage of a few seconds deliveries resume at the rate the path had
    /// ([`model`]), with no link time lost to a rate that has to come back. A silence longer
    /// than that is a path that is out (or a receiver that is gone; the reports come on the
    /// control connection too): the rate halves, and again with each such span, down to
    /// 2^-[`SILENCE_HALVINGS`] of where the silence began, as TCP's retransmission timer and
    /// TFRC's no-feedback timer back off, instead of pacing into the void until the transfer
    /// gives up. The next report brings it back ([`RateController::on_feedback`]). Returns the
    /// change, if any.
    pub fn on_silence(&mut self, now: Instant) -> Option<RateChange> {
        if self.cfg.mode != RateMode::Auto {
            return None;
        }
        let last = self.last_report?;
        let silent = now.saturating_duration_since(last);
        let limit = self.silence_limit();
        if silent < limit {
            return None;
        }
        let bw = self.model.as_ref()?.bottleneck_bps()?;
        let from = *self.silenced.get_or_insert(self.rate.min(bw));
        let spans = (silent - limit).as_secs_f64() / self.silence_backoff().as_secs_f64();
        let halvings = (spans.floor() as u32).min(SILENCE_HALVINGS);
        let to = from / f64::from(1u32 << halvings);
        if to >= self.rate {
            return None;
        }
        self.set_rate(now, to, Reason::Silence)
    }

    /// How long past the silence limit the rate stays at the model's bottleneck before it
    /// halves, and how long each halving lasts: [`SILENCE_BACKOFF`], or four round trips if
    /// longer.
    pub fn silence_backoff(&self) -> Duration {
        SILENCE_BACKOFF.max(self.cfg.rtt * 4)
    }

    /// How long without a report is silence ([`SILENCE_REPORTS`] intervals, and at least a
    /// round trip and two): intervals as the latest report spaces the next
    /// ([`RateController::report_spacing`]).
    fn silence_limit(&self) -> Duration {
        let every = self.report_spacing;
        (every * SILENCE_REPORTS).max(self.cfg.rtt + every * 2)
    }

    /// Sets the pace of the receiver's reports that silence is judged by (the sender's
    /// [`ReportPace::heard_on`]); before any report.
    pub fn set_report_pace(&mut self, pace: ReportPace) {
        self.report_pace = pace;
        if self.reports_heard == 0 {
            self.report_spacing = pace.base;
        }
    }

    /// When the receiver's next report is due after its latest ([`report_every`] of it;
    /// [`report_interval`] before the first): how often silence is worth checking for.
    pub fn report_spacing(&self) -> Duration {
        self.report_spacing
    }

    /// The outages so far (see [`Outages`]), in every mode.
    pub fn outages(&self) -> Outages {
        self.outages
    }

    /// Judges report `fb`, at `now`, for an outage ([`Outages`]): the first report to deliver
    /// after the silence limit begins the judgment; the path losses it and the reports within
    /// the silence limit after it count decide (a receiver counts a gap once later datagrams
    /// show it, and its reports can come out of order).
    fn note_outage(&mut self, now: Instant, fb: &Feedback) {
        let limit = self.silence_limit();
        let paced = self.paced_until(now);
        let gap = if fb.datagrams > 0 {
            self.last_delivery
                .replace((now, paced))
                .map(|(at, then)| (now.saturating_duration_since(at), paced - then))
        } else {
            None
        };
        // The receiver's kernel drops show as gaps in the report that counts them or a later
        // one: those counted during the silence are set against its losses too.
        let silent_drops = if fb.datagrams > 0 {
            std::mem::take(&mut self.silent_drops)
        } else {
            self.silent_drops = self.silent_drops.saturating_add(fb.socket_drops);
            0
        };
        if let Some((gap, bits)) = gap.filter(|g| g.0 >= limit) {
            let size = (fb.bytes as f64 / fb.datagrams as f64).max(1.0);
            let would_send = bits / 8.0 / size;
            self.outage_check = Some(OutageCheck {
                gap,
                until: now + limit,
                lost: 0,
                drops: silent_drops,
                need: (would_send / 4.0).max(OUTAGE_LEAST_LOST),
            });
        }
        let Some(check) = self.outage_check.as_mut() else {
            return;
        };
        if now > check.until {
            self.outage_check = None;
            return;
        }
        check.lost = check.lost.saturating_add(fb.lost);
        check.drops = check.drops.saturating_add(fb.socket_drops);
        if check.lost.saturating_sub(check.drops) as f64 >= check.need {
            let length = check.gap.saturating_sub(self.report_spacing);
            self.outages.count = self.outages.count.saturating_add(1);
            self.outages.total = self.outages.total.saturating_add(length);
            self.outage_check = None;
        }
    }

    /// The bits the rate paced from the start until `now`.
    fn paced_until(&self, now: Instant) -> f64 {
        let (bits, at) = self.paced;
        bits + self.rate * now.saturating_duration_since(at).as_secs_f64()
    }

    fn set_rate(&mut self, now: Instant, new: f64, why: Reason) -> Option<RateChange> {
        let ceiling = self.cfg.ceiling_bps.max(1) as f64;
        let floor = self.cfg.min_bps.max(1) as f64;
        let new = if new.is_finite() {
            new.clamp(floor, ceiling.max(floor))
        } else {
            self.rate
        };
        if (new - self.rate).abs() < (self.rate / 1000.0).max(1.0) {
            return None;
        }
        self.last_change = Some(new / self.rate);
        self.paced = (self.paced_until(now), now.max(self.paced.1));
        self.rate = new;
        self.record(now, why);
        self.timeline.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(mode: RateMode) -> RateConfig {
        RateConfig {
            mode,
            ceiling_bps: 10_000_000_000,
            start_bps: 50_000_000,
            min_bps: 1_000_000,
            rtt: Duration::from_millis(50),
        }
    }

    fn fb(rate_bps: f64, loss: f64, delay_ms: u64) -> Feedback {
        let interval = Duration::from_millis(50);
        let bytes = (rate_bps / 8.0 * interval.as_secs_f64()) as u64;
        let datagrams = bytes / 1400;
        Feedback {
            train_rate: None,
            interval,
            bytes,
            datagrams,
            lost: (datagrams as f64 * loss / (1.0 - loss)) as u64,
            socket_drops: 0,
            queue_delay: Duration::from_millis(delay_ms),
            queue_fill: 0.0,
            receiver_lag: Duration::ZERO,
            disk_wait: Duration::ZERO,
            disk_fill: 0.0,
        }
    }

    /// [`fb`] over a 10 ms interval.
    fn fb10(rate_bps: f64, delay_ms: u64) -> Feedback {
        Feedback {
            interval: Duration::from_millis(10),
            bytes: (rate_bps / 8.0 * 0.01) as u64,
            datagrams: (rate_bps / 8.0 * 0.01 / 8900.0) as u64,
            queue_delay: Duration::from_millis(delay_ms),
            ..Feedback::default()
        }
    }

    #[test]
    fn one_way_delay_is_relative_across_clock_offsets_and_wraps() {
        for offset in [0u64, 17, u64::from(u32::MAX) - 500] {
            let mut owd = OneWayDelay::default();
            let recv = |sent: u64, delay: u64| ((sent + delay + offset) as u32, sent as u32);
            let mut samples = Vec::new();
            for (sent, delay) in [
                (0, 20_000),
                (1_000, 25_000),
                (2_000, 19_000),
                (3_000, 21_000),
            ] {
                let (now_us, sent_us) = recv(sent, delay);
                samples.push(owd.sample(now_us, sent_us));
            }
            // Above the lowest seen so far.
            assert_eq!(samples, vec![0, 5_000, 0, 2_000], "offset {offset}");
        }
    }

    #[test]
    fn initial_rate_is_the_floor_on_long_paths_and_a_window_per_rtt_on_short_ones() {
        // 10 x 1396 bytes per 100 ms: 1.1 Mbit/s, under the floor.
        assert_eq!(
            initial_rate(100_000_000, 1396, Duration::from_millis(100)),
            100_000_000
        );
        // Loopback: 10 x 8900 bytes per 250 us.
        assert_eq!(
            initial_rate(100_000_000, 8900, Duration::from_micros(250)),
            2_848_000_000
        );
        // A zero RTT (a coarse clock) is bounded, not a division by zero.
        assert!(initial_rate(0, 8900, Duration::ZERO) <= 712_000_000_000);
    }

    #[test]
    fn startup_trains_are_long_on_a_long_path_short_on_a_short_one_and_end_with_startup() {
        let ms = Duration::from_millis;
        // 160 ms: 10 ms of the channel's rate, up to 64 KiB (50 Mbit/s: 62,500 bytes).
        assert_eq!(startup_train_bytes(50_000_000, ms(160)), 62_500);
        assert_eq!(
            startup_train_bytes(100_000_000, ms(160)),
            STARTUP_TRAIN_BYTES
        );
        // 40 ms: 2.5 ms; a LAN's 0.5 ms: 31 us, less than a datagram at 221 Mbit/s.
        assert_eq!(startup_train_bytes(50_000_000, ms(40)), 15_625);
        assert_eq!(
            startup_train_bytes(221_440_000, Duration::from_micros(500)),
            865
        );
        assert_eq!(startup_train_bytes(0, ms(150)), 0);
        assert_eq!(startup_train_bytes(u64::MAX, ms(150)), STARTUP_TRAIN_BYTES);

        let t0 = Instant::now();
        let auto = RateConfig {
            rtt: ms(160),
            start_bps: 100_000_000,
            ..cfg(RateMode::Auto)
        };
        let mut c = RateController::new(auto.clone(), t0);
        // 100 Mbit/s on one channel (until told otherwise, and told none), over two, and over
        // 16: 10 ms of 6.25 Mbit/s each.
        assert_eq!(c.train_bytes(), STARTUP_TRAIN_BYTES);
        c.set_channels(0);
        assert_eq!(c.train_bytes(), STARTUP_TRAIN_BYTES);
        c.set_channels(2);
        assert_eq!(c.train_bytes(), 62_500);
        c.set_channels(16);
        assert_eq!(c.train_bytes(), 7_812);
        c.set_channels(2);
        // Startup ends on a queue: the usual sends again.
        let mut t = t0;
        for _ in 0..20 {
            t += ms(50);
            c.on_feedback(t, &fb(100e6, 0.0, 100));
            if !c.in_startup() {
                break;
            }
        }
        assert!(!c.in_startup());
        assert_eq!(c.train_bytes(), 0);
        // Nor in the other modes.
        for mode in [RateMode::Fixed, RateMode::Fair] {
            let c = RateController::new(
                RateConfig {
                    mode,
                    ..auto.clone()
                },
                t0,
            );
            assert_eq!(c.train_bytes(), 0);
        }
    }

    #[test]
    fn startup_trains_grow_while_the_receiver_cannot_time_them() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let cold_40ms = || {
            RateController::new(
                RateConfig {
                    rtt: ms(40),
                    start_bps: 100_000_000,
                    ..cfg(RateMode::Auto)
                },
                t0,
            )
        };
        // A 40 ms path from 100 Mbit/s over 16 channels: 2.5 ms of 6.25 Mbit/s, 1,953 bytes.
        let mut c = cold_40ms();
        c.set_channels(16);
        assert_eq!(c.train_bytes(), 1_953);
        let share = |c: &RateController| startup_train_bytes(c.rate_bps() / 16, ms(40));
        // Reports of a growing delivery with no estimate: each doubles the next trains, three
        // times at most (half the round trip at the channel's rate).
        let mut t = t0;
        for doublings in [1, 2, 3, 3] {
            t += ms(10);
            c.on_feedback(t, &fb10(c.rate_bps() as f64, 0));
            assert!(c.in_startup());
            assert_eq!(c.train_bytes(), share(&c) << doublings, "{doublings}");
        }
        // Two channels: the trains reach 64 KiB, and no further.
        c.set_channels(2);
        assert_eq!(c.train_bytes(), STARTUP_TRAIN_BYTES);

        // A report with an estimate: the trains keep their length.
        let mut c = cold_40ms();
        c.set_channels(2);
        let timed = Feedback {
            train_rate: Some(1e9),
            ..fb10(100e6, 0)
        };
        c.on_feedback(t0 + ms(10), &timed);
        assert!(c.in_startup());
        assert_eq!(
            c.train_bytes(),
            startup_train_bytes(c.rate_bps() / 2, ms(40))
        );
    }

    #[test]
    fn a_path_lost_nothing_once_a_thousand_datagrams_came_and_none_went_missing() {
        for mode in [RateMode::Auto, RateMode::Fixed] {
            let t0 = Instant::now();
            let mut c = RateController::new(cfg(mode), t0);
            assert!(!c.lost_nothing(), "nothing heard yet");
            // 50 ms of 10 Mbit/s: 44 datagrams a report.
            let clean = fb(10e6, 0.0, 0);
            let mut t = t0;
            let mut n = 0;
            while !c.lost_nothing() {
                t += Duration::from_millis(50);
                c.on_feedback(t, &clean);
                n += clean.datagrams;
            }
            assert!(
                (LOSS_SHARE_AFTER..LOSS_SHARE_AFTER + 44).contains(&n),
                "{n}"
            );
            // One lost datagram, whatever its cause, and it never again lost nothing.
            t += Duration::from_millis(50);
            c.on_feedback(t, &Feedback { lost: 1, ..clean });
            for _ in 0..100 {
                t += Duration::from_millis(50);
                c.on_feedback(t, &clean);
            }
            assert!(!c.lost_nothing(), "{mode:?}");
        }
    }

    #[test]
    fn random_loss_alone_does_not_slow_it_down() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        for _ in 0..12 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64 * 0.99, 0.01, 1));
        }
        assert!(c.rate_bps() >= 5_000_000_000, "rate {}", c.rate_bps());
        assert!(c
            .timeline()
            .iter()
            .all(|ch| !matches!(ch.reason, Reason::Loss | Reason::Delay)));
    }

    #[test]
    fn the_loss_share_is_what_the_path_lost_without_congestion_and_nothing_from_a_few_datagrams() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        // An 8 KiB file's datagrams, none lost: the floor's bound over them is 50% (what the
        // tail's parity is sized by), but they say nothing of the path's loss.
        let few = Feedback {
            bytes: 8 * 1400,
            datagrams: 8,
            lost: 0,
            ..fb(1e6, 0.0, 0)
        };
        c.on_feedback(t0 + ms(10), &few);
        assert_eq!(c.random_loss(), Some(0.5));
        assert_eq!(c.loss_share(), None);
        // 1% random loss, report after report: the share is 1%, the floor a little above it.
        let mut t = t0 + ms(10);
        for _ in 0..12 {
            t += ms(50);
            c.on_feedback(t, &fb(1e9, 0.01, 1));
        }
        let share = c.loss_share().unwrap();
        assert!((0.0095..0.0105).contains(&share), "{share}");
        assert!(c.random_loss().unwrap() > share);
        // A report that lost a fifth is congestion, not the path's random loss.
        t += ms(50);
        c.on_feedback(t, &fb(1e9, 0.2, 1));
        assert!((0.0095..0.0105).contains(&c.loss_share().unwrap()));
    }

    #[test]
    fn fair_mode_yields_to_queueing_delay_and_fixed_ignores_everything() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Fair), t0);
        let before = c.rate_bps();
        let ch = c
            .on_feedback(t0 + Duration::from_secs(1), &fb(40e6, 0.0, 30))
            .unwrap();
        assert_eq!(ch.reason, Reason::Delay);
        assert!(c.rate_bps() < before);
        let mut f = RateController::new(cfg(RateMode::Fixed), t0);
        assert_eq!(
            f.on_feedback(t0 + Duration::from_secs(1), &fb(1e6, 0.9, 500)),
            None
        );
        assert_eq!(f.rate_bps(), 10_000_000_000);
    }

    #[test]
    fn fair_yields_to_a_queue_it_did_not_cause_and_comes_back_when_it_empties() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Fair), t0);
        let mut t = t0;
        // Startup to about 400M, then a clean path for a while.
        while c.rate_bps() < 400_000_000 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
        }
        for _ in 0..5 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        let alone = c.rate_bps();
        // A competing flow keeps a 15 ms queue (three times the target) whatever we do.
        for _ in 0..10 {
            t += Duration::from_millis(200);
            let r = c.rate_bps() as f64;
            c.on_feedback(t, &fb(r * 0.9, 0.0, 15));
        }
        let yielded = c.rate_bps();
        assert!(yielded < alone / 10, "{alone} -> {yielded}");
        assert!(c
            .timeline()
            .iter()
            .rev()
            .take(5)
            .all(|ch| ch.reason == Reason::Delay));
        // It leaves: the queue is empty and everything sent arrives.
        let mut rounds = 0;
        while c.rate_bps() < alone / 2 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
            rounds += 1;
            assert!(rounds < 30, "{:?}", c.timeline());
        }
        assert!(rounds <= 15, "{rounds} rounds back to half");
    }

    /// An `auto` controller on a 1 s round trip (a 500 ms delay target, more than a socket
    /// buffer holds) after one quiet report; returns it, its start and the report's time.
    fn long_path_after_one_round() -> (RateController, Instant, Instant) {
        let t0 = Instant::now();
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_secs(1),
                ..cfg(RateMode::Auto)
            },
            t0,
        );
        let t = t0 + Duration::from_secs(2);
        c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 0));
        (c, t0, t)
    }

    #[test]
    fn a_filling_receiver_buffer_cuts_before_the_kernel_drops() {
        let (mut c, t0, mut t) = long_path_after_one_round();
        let before = c.rate_bps();
        // 200 ms queued at the receiver, under the target, but its buffer is 60% full.
        let full = Feedback {
            queue_fill: 0.6,
            ..fb(before as f64 * 0.7, 0.0, 200)
        };
        t += Duration::from_secs(2);
        let ch = c.on_feedback(t, &full).unwrap();
        assert_eq!(ch.reason, Reason::Backlog);
        assert!(
            c.rate_bps() < (before as f64 * 0.7 * 0.95) as u64,
            "below what was delivered, to drain: {before} -> {}",
            c.rate_bps()
        );
        assert!(!c.in_startup());
        // Half full is still fine (past the receiver's first report, which is its start).
        let mut d = RateController::new(cfg(RateMode::Auto), t0);
        d.on_feedback(
            t0 + Duration::from_secs(1),
            &fb(d.rate_bps() as f64, 0.0, 0),
        );
        let half = Feedback {
            queue_fill: 0.5,
            ..fb(d.rate_bps() as f64, 0.0, 0)
        };
        assert_eq!(
            d.on_feedback(t0 + Duration::from_secs(2), &half)
                .map(|c| c.reason),
            Some(Reason::Startup)
        );
    }

    #[test]
    fn a_lumpy_receiver_s_delay_swings_are_not_a_queue() {
        // Reports from a receiver that runs in 30 ms lumps: the delay swings between 5 and 60
        // ms and the delivered rate by +-20% around what is sent, with no queue building.
        let run = |lag: Duration| {
            let t0 = Instant::now();
            let mut c = RateController::new(cfg(RateMode::Auto), t0);
            let mut t = t0;
            for _ in 0..3 {
                t += Duration::from_millis(200);
                c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
            }
            for i in 0..20 {
                t += Duration::from_millis(200);
                let (share, delay) = if i % 2 == 0 { (0.8, 60) } else { (1.2, 5) };
                let f = Feedback {
                    receiver_lag: lag,
                    ..fb(c.rate_bps() as f64 * share, 0.0, delay)
                };
                c.on_feedback(t, &f);
            }
            c.timeline().iter().any(|ch| ch.reason == Reason::Delay)
        };
        assert!(
            run(Duration::ZERO),
            "without the lag, these look like a queue"
        );
        assert!(!run(Duration::from_millis(30)), "with it, they do not");
    }

    #[test]
    fn auto_ignores_a_queue_under_its_target() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        for _ in 0..4 {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 15));
        }
        assert!(c.timeline().iter().all(|ch| ch.reason != Reason::Delay));
    }

    #[test]
    fn holds_for_a_round_after_a_change() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        assert!(c
            .on_feedback(t0 + Duration::from_millis(60), &fb(50e6, 0.0, 0))
            .is_some());
        assert!(c
            .on_feedback(t0 + Duration::from_millis(70), &fb(50e6, 0.0, 0))
            .is_none());
    }

    /// Reports at the engine's cadence for [`cfg`]'s 50 ms path (every 12.5 ms), each of what
    /// `path` makes of the rate in force one round trip earlier: (delivered bits per second,
    /// queueing delay).
    fn drive(
        c: &mut RateController,
        t: &mut Instant,
        reports: usize,
        path: impl Fn(f64) -> (f64, Duration),
    ) {
        for _ in 0..reports {
            report(c, t, &path, |f| f);
        }
    }

    /// One report as in [`drive`], changed by `edit`; returns the change.
    fn report(
        c: &mut RateController,
        t: &mut Instant,
        path: impl Fn(f64) -> (f64, Duration),
        edit: impl FnOnce(Feedback) -> Feedback,
    ) -> Option<RateChange> {
        let every = report_interval(c.config().rtt);
        *t += every;
        let sent = rate_before(c, *t, c.config().rtt);
        let f = path_report(every, path(sent as f64));
        c.on_feedback(*t, &edit(f))
    }

    /// The rate `c` paced at `rtt` before `t`: the timeline's last change before then.
    fn rate_before(c: &RateController, t: Instant, rtt: Duration) -> u64 {
        let then = t.checked_sub(rtt).unwrap_or(t);
        c.timeline()
            .iter()
            .rev()
            .find(|ch| ch.at < then)
            .map_or(c.rate_bps(), |ch| ch.rate_bps)
    }

    /// A report over `every` of a path that delivered at `delivered` bits per second with
    /// `delay` of queue, in datagrams of 1,400 bytes.
    fn path_report(every: Duration, (delivered, delay): (f64, Duration)) -> Feedback {
        let bytes = (delivered / 8.0 * every.as_secs_f64()) as u64;
        Feedback {
            interval: every,
            bytes,
            datagrams: bytes / 1400,
            queue_delay: delay,
            ..Feedback::default()
        }
    }

    /// A bottleneck of `bps` that queues whatever exceeds it (20 ms of delay). It has no
    /// memory: the few percent over the bottleneck with which cruising builds its reserve
    /// ([`model::CRUISE_FILL_GAIN`]) would build a queue over round trips, not at once, so
    /// only a surplus beyond that shows as a queue here.
    fn bottleneck(bps: f64) -> impl Fn(f64) -> (f64, Duration) {
        move |rate| {
            let delay = if rate > bps * (model::CRUISE_FILL_GAIN + 0.01) {
                20
            } else {
                1
            };
            (rate.min(bps), Duration::from_millis(delay))
        }
    }

    /// An `auto` controller cruising at a 300 Mbit/s bottleneck, and the time.
    fn cruising_at_300() -> (RateController, Instant) {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        drive(&mut c, &mut t, 200, bottleneck(300e6));
        assert!(!c.in_startup());
        (c, t)
    }

    /// Reports on a bottleneck of `bps` until `c` leaves startup, at most `most`; returns how
    /// many it took.
    fn leave_startup(c: &mut RateController, t: &mut Instant, bps: f64, most: usize) -> usize {
        let mut reports = 0;
        while c.in_startup() {
            drive(c, t, 1, bottleneck(bps));
            reports += 1;
            assert!(reports <= most, "{:?}", c.timeline());
        }
        reports
    }

    /// After 100 more reports on a bottleneck of `bps`, `c` paces within 10% of it.
    fn cruises_at(c: &mut RateController, t: &mut Instant, bps: f64) {
        drive(c, t, 100, bottleneck(bps));
        let r = c.rate_bps() as f64;
        assert!((0.9 * bps..=1.1 * bps).contains(&r), "{r} against {bps}");
    }

    /// The controller's latest rate changes, newest first: what a failed assertion shows.
    fn latest_changes(c: &RateController) -> Vec<RateChange> {
        c.timeline().iter().rev().take(8).cloned().collect()
    }

    fn bottleneck_of(c: &RateController) -> f64 {
        c.model().unwrap().bottleneck_bps().unwrap()
    }

    #[test]
    fn startup_at_least_doubles_per_round_trip_then_drains_below_what_was_delivered() {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        let start = c.rate_bps();
        // One round trip (4 reports) on a path that takes everything.
        drive(&mut c, &mut t, 4, bottleneck(10e9));
        assert!(c.rate_bps() >= 2 * start, "{} -> {}", start, c.rate_bps());
        assert!(c.in_startup());
        // Into a 300 Mbit/s bottleneck: out of startup within a few round trips, draining
        // below what was delivered (not below half of it).
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        leave_startup(&mut c, &mut t, 300e6, 39);
        let last = *c.timeline().last().unwrap();
        assert_eq!(last.reason, Reason::Delay);
        assert!(
            last.rate_bps < 300_000_000 && last.rate_bps >= 150_000_000,
            "{last:?}"
        );
        // Then it cruises at the bottleneck, within 10%.
        cruises_at(&mut c, &mut t, 300e6);
    }

    /// Startup's rate after three reports on a path of `path_bps` from 50 Mbit/s, the reports
    /// carrying these train estimates (Mbit/s).
    fn after_trains(estimates: [f64; 3], path_bps: f64) -> (u64, RateController) {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        for e in estimates {
            report(&mut c, &mut t, bottleneck(path_bps), |f| Feedback {
                train_rate: Some(e * 1e6),
                ..f
            });
        }
        assert!(c.in_startup());
        (c.rate_bps(), c)
    }

    #[test]
    fn startup_goes_to_the_trains_rate_at_once_when_they_agree_and_no_further() {
        // Three estimates within 25%: their median, 200 Mbit/s, at once (four times the
        // start), and no further while the path delivers less.
        let (rate, mut c) = after_trains([205.0, 200.0, 190.0], 200e6);
        assert_eq!(rate, 200_000_000, "{:?}", c.timeline());
        let mut t = c.timeline().last().unwrap().at;
        leave_startup(&mut c, &mut t, 200e6, 12);
        assert!(c.timeline().iter().all(|ch| ch.rate_bps <= 200_000_000));
        assert_eq!(c.model().unwrap().phase(), model::Phase::Cruise);
        // Estimates that disagree: startup doubles towards their median, no jump.
        let (rate, c) = after_trains([300.0, 200.0, 150.0], 200e6);
        assert!(rate < 150_000_000, "{:?}", c.timeline());
        // Without any: the same doubling.
        let mut t = Instant::now();
        let mut plain = RateController::new(cfg(RateMode::Auto), t);
        drive(&mut plain, &mut t, 3, bottleneck(200e6));
        assert_eq!(plain.rate_bps(), rate);
        // Agreeing estimates far above what was delivered: no more than five times it at once.
        let (rate, mut c) = after_trains([2000.0, 2100.0, 1900.0], 10e9);
        let delivered = 50e6 * 1.02;
        assert!(
            rate as f64 <= model::MAX_JUMP * delivered && rate > 200_000_000,
            "{:?}",
            c.timeline()
        );
        // Once: a round trip later, with the jump's rate delivered and the trains still
        // agreeing (a token bucket's line rate), startup doubles as usual, not five times.
        let mut t = c.timeline().last().unwrap().at;
        for _ in 0..5 {
            report(&mut c, &mut t, bottleneck(10e9), |f| Feedback {
                train_rate: Some(2000e6),
                ..f
            });
        }
        assert!(
            (c.rate_bps() as f64) < 3.0 * rate as f64,
            "{rate} -> {:?}",
            c.timeline()
        );
    }

    #[test]
    fn startup_takes_trains_that_disagree_for_a_floor_and_grows_past_it_gently() {
        // A 400 Mbit/s path whose trains, spread by jitter, say 150-300 (median 200): startup
        // reaches 200 and does not stop there (it did: the rest was left to probing), but
        // grows by the gentle gain until its queue signal ends it, near the path.
        let path = 400e6;
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        let spread = [300.0, 150.0, 200.0];
        let mut reports = 0;
        while c.rate_bps() < 190_000_000 {
            report(&mut c, &mut t, bottleneck(path), |f| Feedback {
                train_rate: Some(spread[reports % 3] * 1e6),
                ..f
            });
            reports += 1;
            assert!(reports < 20 && c.in_startup(), "{:?}", c.timeline());
        }
        let mut top = 0;
        while c.in_startup() {
            report(&mut c, &mut t, bottleneck(path), |f| Feedback {
                train_rate: Some(spread[reports % 3] * 1e6),
                ..f
            });
            reports += 1;
            assert!(reports < 60, "{:?}", c.timeline());
            top = top.max(c.rate_bps());
            let last = *c.timeline().last().unwrap();
            if last.reason == Reason::Startup {
                // Each step no more than the gentle gain over what was delivered.
                assert!(
                    last.rate_bps as f64 <= model::STARTUP_PAST_TRAINS_GAIN * path * 1.02 + 1.0,
                    "{last:?}"
                );
            }
        }
        assert!(
            top as f64 >= 0.95 * path
                && (top as f64) <= model::STARTUP_PAST_TRAINS_GAIN * path * 1.02,
            "{top} {:?}",
            c.timeline()
        );
        // Then it cruises at the path.
        cruises_at(&mut c, &mut t, path);
        // Trains that agree on a rate still end startup there (the path's rate, measured).
        let (rate, mut c) = after_trains([205.0, 200.0, 190.0], 200e6);
        let mut t = c.timeline().last().unwrap().at;
        leave_startup(&mut c, &mut t, 200e6, 12);
        assert_eq!(rate, 200_000_000);
        assert_eq!(c.model().unwrap().phase(), model::Phase::Cruise);
    }

    #[test]
    fn a_memory_fits_a_path_of_the_same_round_trip_within_its_lifetime() {
        let m = PathMemory {
            bottleneck_bps: 500_000_000,
            rtt: Duration::from_millis(150),
        };
        let hour = Duration::from_secs(3600);
        assert!(m.fits(hour, Duration::from_millis(150)));
        assert!(m.fits(hour, Duration::from_millis(290)));
        assert!(m.fits(hour, Duration::from_millis(80)));
        assert!(!m.fits(hour, Duration::from_millis(320)), "another path");
        assert!(!m.fits(hour, Duration::from_millis(65)), "another path");
        assert!(!m.fits(MEMORY_LIFETIME + hour, Duration::from_millis(150)));
        // Loopback's round trips move by more than a factor of two: 10 ms of slack.
        let lo = PathMemory {
            bottleneck_bps: 5_000_000_000,
            rtt: Duration::from_micros(40),
        };
        assert!(lo.fits(hour, Duration::from_micros(300)));
        assert!(lo.fits(hour, Duration::from_millis(10)));
        assert!(!lo.fits(hour, Duration::from_millis(11)));
    }

    #[test]
    fn a_memory_fits_a_handshake_inflated_by_cpu_down_to_the_kernels_floor() {
        let hour = Duration::from_secs(3600);
        let us = Duration::from_micros;
        // Loopback: the last transfer went by a probe's 0.4 ms; this key agreement took
        // 27 ms on a busy host, the kernel's floor is 30 us.
        let m = PathMemory {
            bottleneck_bps: 9_000_000_000,
            rtt: us(400),
        };
        assert!(!m.fits(hour, us(27_000)), "by the key agreement alone");
        assert!(m.fits_range(hour, (us(30), us(27_000))));
        // A path far longer than the key agreement's timing, or far shorter than the floor,
        // is another path.
        let far = PathMemory {
            rtt: us(300_000),
            ..m
        };
        assert!(!far.fits_range(hour, (us(30), us(27_000))));
        assert!(!m.fits_range(hour, (us(100_000), us(150_000))));
        assert!(!m.fits_range(MEMORY_LIFETIME + hour, (us(30), us(27_000))));
    }

    /// The rates `c` paces at through 60 reports every 10 ms from a path of round trip
    /// `path_rtt` with a 2 Gbit/s bottleneck, each of the rate in force a round trip earlier.
    fn short_path_rates(c: &mut RateController, t0: Instant, path_rtt: Duration) -> Vec<u64> {
        let (every, mut t) = (Duration::from_millis(10), t0);
        let path = bottleneck(2e9);
        (0..60)
            .map(|_| {
                t += every;
                let sent = rate_before(c, t, path_rtt);
                c.on_feedback(t, &path_report(every, path(sent as f64)));
                c.rate_bps()
            })
            .collect()
    }

    #[test]
    fn a_controller_told_the_paths_round_trip_goes_as_one_configured_with_it() {
        // Loopback on a busy host: the key agreement took 27 ms, the path's round trip is
        // 0.4 ms.
        let (path, handshake) = (Duration::from_micros(400), Duration::from_millis(27));
        let with = |rtt| RateConfig {
            start_bps: 100_000_000,
            ceiling_bps: 100_000_000_000,
            rtt,
            ..cfg(RateMode::Auto)
        };
        let t0 = Instant::now();
        let mut knows = RateController::new(with(path), t0);
        let mut told = RateController::new(with(handshake), t0);
        told.set_rtt(path);
        assert_eq!(told.config().rtt, path);
        assert_eq!(told.model().unwrap().rtt(), path);
        let mut inflated = RateController::new(with(handshake), t0);
        let rates = short_path_rates(&mut knows, t0, path);
        assert_eq!(short_path_rates(&mut told, t0, path), rates);
        // (Which is not what the key agreement's round trip makes of the same path.)
        assert_ne!(short_path_rates(&mut inflated, t0, path), rates);
    }

    #[test]
    fn a_round_trip_found_shorter_before_any_report_raises_the_first_rate() {
        // Loopback: the key agreement took 5.4 ms, the path's round trip is 0.8 ms.
        let (handshake, path) = (Duration::from_micros(5400), Duration::from_micros(800));
        let with = |mode| RateConfig {
            start_bps: initial_rate(100_000_000, 8900, handshake),
            ceiling_bps: 100_000_000_000,
            rtt: handshake,
            ..cfg(mode)
        };
        let t0 = Instant::now();
        let window = initial_rate(100_000_000, 8900, path);
        assert_eq!(window, 890_000_000);
        for mode in [RateMode::Auto, RateMode::Fair] {
            let mut c = RateController::new(with(mode), t0);
            assert_eq!(c.rate_bps(), 131_851_851);
            c.set_rtt(path);
            assert_eq!(c.raise_start(t0, window), Some(window), "{mode:?}");
            assert_eq!(c.rate_bps(), window);
            // Still the first rate: one change, the start, at the window's rate.
            assert_eq!(c.changes(), 1);
            assert_eq!(c.timeline()[0].rate_bps, window);
            assert_eq!(c.timeline()[0].reason, Reason::Start);
            assert_eq!(c.rate_range(), (window, window));
            // Never lower, nor above the ceiling.
            assert_eq!(c.raise_start(t0, window / 2), None);
            assert_eq!(c.rate_bps(), window);
        }
        let mut capped = RateController::new(
            RateConfig {
                ceiling_bps: 500_000_000,
                ..with(RateMode::Auto)
            },
            t0,
        );
        assert_eq!(capped.raise_start(t0, window), Some(500_000_000));
        // Not in fixed mode, and not once a report came.
        let mut fixed = RateController::new(with(RateMode::Fixed), t0);
        let fixed_rate = fixed.rate_bps();
        assert_eq!(fixed.raise_start(t0, window), None);
        assert_eq!(fixed.rate_bps(), fixed_rate);
        let mut heard = RateController::new(with(RateMode::Auto), t0);
        let t1 = t0 + Duration::from_millis(10);
        heard.on_report(t1, &fb10(120e6, 0));
        let after = heard.rate_bps();
        assert_eq!(heard.raise_start(t1, window), None);
        assert_eq!(heard.rate_bps(), after);
    }

    /// A controller of [`cfg`], resumed from a memory of `bps` on its 50 ms path.
    fn resumed_from(bps: u64, t: Instant) -> RateController {
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        let memory = PathMemory {
            bottleneck_bps: bps,
            rtt: Duration::from_millis(50),
        };
        assert_eq!(c.resume(&memory, Duration::from_secs(60)), Some(bps / 2));
        assert_eq!(c.timeline()[0].rate_bps, bps / 2);
        c
    }

    #[test]
    fn a_resumed_start_reaches_the_remembered_bottleneck_without_overshoot() {
        let mut t = Instant::now();
        let mut c = resumed_from(3_000_000_000, t);
        // Two round trips of 4 reports at most: the first sample at half, then there.
        let reports = leave_startup(&mut c, &mut t, 3e9, 8);
        let top = c.timeline().iter().map(|ch| ch.rate_bps).max().unwrap();
        assert!(top <= 3_000_000_000, "{:?}", c.timeline());
        assert_eq!(c.model().unwrap().phase(), model::Phase::Cruise);
        // A cold start on the same path takes longer and overshoots.
        let mut t = Instant::now();
        let mut cold = RateController::new(cfg(RateMode::Auto), t);
        let mut cold_reports = 0;
        while cold.rate_bps() < 2_700_000_000 {
            drive(&mut cold, &mut t, 1, bottleneck(3e9));
            cold_reports += 1;
        }
        assert!(
            cold_reports > reports + 4,
            "{cold_reports} against {reports}"
        );
        // Past it, cruising within 10% as after any start.
        cruises_at(&mut c, &mut t, 3e9);
    }

    /// `hurtle demo`'s start on loopback (0.1 ms, reports every 10 ms), resumed at half a
    /// remembered 14.4 Gbit/s: the receiver's `early` reports, then `then` more of the path's
    /// 9 Gbit/s. Returns the controller and the lowest rate it set.
    fn demo_start(early: &[Feedback], then: usize) -> (RateController, u64) {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let rtt = Duration::from_micros(100);
        let mut c = RateController::new(
            RateConfig {
                rtt,
                ceiling_bps: 100_000_000_000,
                start_bps: 100_000_000,
                ..cfg(RateMode::Auto)
            },
            t0,
        );
        let memory = PathMemory {
            bottleneck_bps: 14_400_000_000,
            rtt,
        };
        assert_eq!(c.resume(&memory, ms(60_000)), Some(7_200_000_000));
        let mut t = t0;
        for f in early {
            t += ms(10);
            c.on_feedback(t, f);
        }
        for _ in 0..then {
            t += ms(10);
            let rate = c.rate_bps() as f64;
            let delay = if rate > 9.3e9 { 5 } else { 0 };
            c.on_feedback(t, &fb10(rate.min(9e9), delay));
        }
        let lowest = c.timeline().iter().map(|ch| ch.rate_bps).min().unwrap();
        (c, lowest)
    }

    /// A report of `bps` read over 10 ms with the receiver's buffers `fill` full and `drops`
    /// socket drops.
    fn read_behind(bps: f64, fill: f64, drops: u64) -> Feedback {
        Feedback {
            queue_fill: fill,
            socket_drops: drops,
            lost: drops,
            ..fb10(bps, 0)
        }
    }

    #[test]
    fn the_receiver_s_start_read_behind_is_not_its_pace() {
        // The slow round BENCHMARKS traced (a quiet machine): the first report counts 1.3
        // Gbit/s read with the buffers 60% full (a whole socket buffer read at once after a
        // late start), with or without socket drops, the next 7.6 Gbit/s, still reading
        // behind. And one on a busy machine: 0.6, 3.2 and 10.4 Gbit/s read with the buffers
        // 37, 58 and 82% full.
        let traces = [
            vec![read_behind(1.3e9, 0.6, 0), read_behind(7.6e9, 0.3, 0)],
            vec![read_behind(1.3e9, 0.6, 300), read_behind(7.6e9, 0.3, 0)],
            vec![
                read_behind(0.6e9, 0.37, 0),
                read_behind(3.2e9, 0.58, 0),
                read_behind(10.4e9, 0.82, 0),
            ],
        ];
        for early in &traces {
            // Those reports neither end startup nor are samples.
            let (c, _) = demo_start(early, 0);
            let reasons: Vec<_> = c.timeline().iter().map(|ch| ch.reason).collect();
            assert!(
                !reasons.contains(&Reason::Backlog) && !reasons.contains(&Reason::SocketDrops),
                "{:?}",
                c.timeline()
            );
            assert!(c.rate_bps() >= 7_200_000_000, "{:?}", c.timeline());
            // Ten reports (0.1 s) on, at the path's rate; nowhere near the start's reports on
            // the way (startup's drain goes to 0.75 of what was delivered).
            let (c, lowest) = demo_start(early, 10);
            let rate = c.rate_bps() as f64;
            assert!(
                (0.9 * 9e9..=1.1 * 9e9).contains(&rate),
                "{rate}: {:?}",
                c.timeline()
            );
            assert!(lowest >= 5_000_000_000, "{:?}", c.timeline());
        }
        // A receiver that stays behind past its start ends startup at what it reads.
        let behind = read_behind(1.3e9, 0.6, 0);
        let mut early = vec![behind; model::RECEIVER_START_REPORTS as usize];
        let (c, _) = demo_start(&early, 0);
        assert!(c.in_startup(), "{:?}", c.timeline());
        early.push(behind);
        let (c, _) = demo_start(&early, 0);
        let last = c.timeline().last().copied().unwrap();
        assert_eq!(last.reason, Reason::Backlog, "{:?}", c.timeline());
        assert!(!c.in_startup());
        assert!(last.rate_bps < 1_300_000_000, "{last:?}");
        // And a start that caught up ends there: a later report read behind is judged.
        let (c, _) = demo_start(&[behind, fb10(7.2e9, 0), behind, behind], 0);
        assert!(!c.in_startup(), "{:?}", c.timeline());
    }

    #[test]
    fn a_resumed_start_on_a_path_that_slowed_down_settles_at_the_new_bottleneck() {
        let mut t = Instant::now();
        // Remembered 3 Gbit/s; the path takes a third of it now.
        let mut c = resumed_from(3_000_000_000, t);
        leave_startup(&mut c, &mut t, 1e9, 16);
        cruises_at(&mut c, &mut t, 1e9);
    }

    #[test]
    fn a_memory_is_not_used_by_other_modes_after_the_start_or_for_another_path() {
        let t = Instant::now();
        let memory = PathMemory {
            bottleneck_bps: 3_000_000_000,
            rtt: Duration::from_millis(50),
        };
        let day = Duration::from_secs(60);
        for mode in [RateMode::Fair, RateMode::Fixed] {
            let mut c = RateController::new(cfg(mode), t);
            assert_eq!(c.resume(&memory, day), None, "{mode:?}");
        }
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        let other = PathMemory {
            rtt: Duration::from_millis(200),
            ..memory
        };
        assert_eq!(c.resume(&other, day), None);
        assert_eq!(c.rate_bps(), 50_000_000);
        let mut t2 = t;
        drive(&mut c, &mut t2, 2, bottleneck(3e9));
        assert_eq!(c.resume(&memory, day), None, "after the start");
        // Never above the ceiling.
        let mut capped = RateController::new(
            RateConfig {
                ceiling_bps: 1_000_000_000,
                ..cfg(RateMode::Auto)
            },
            t,
        );
        assert_eq!(capped.resume(&memory, day), Some(500_000_000));
        // And a finished transfer leaves a memory only past startup.
        assert_eq!(
            PathMemory::of(&RateController::new(cfg(RateMode::Auto), t)),
            None
        );
        let (settled, _) = cruising_at_300();
        let m = PathMemory::of(&settled).unwrap();
        assert!(
            (270_000_000..=330_000_000).contains(&m.bottleneck_bps),
            "{m:?}"
        );
        assert_eq!(m.rtt, Duration::from_millis(50));
    }

    /// Startup ends on two reports in a row that show a queue of a millisecond or more above
    /// the lowest delay it saw (the bottleneck is reached, and each report later its queue has
    /// grown by a fifth of a round trip at twice the path's rate), not on one such report.
    /// (Beyond the queue its own trains make: one channel's 64 KiB at the pacing rate, 1-2 ms
    /// here, which is not a queue rising.)
    #[test]
    fn startup_ends_on_two_reports_of_a_queue_starting() {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        let open = |r: f64| (r, Duration::from_micros(300));
        let rising = |r: f64| (r, Duration::from_micros(4000));
        drive(&mut c, &mut t, 8, open);
        assert!(c.in_startup());
        // One report of it is a blip.
        drive(&mut c, &mut t, 1, rising);
        drive(&mut c, &mut t, 1, open);
        drive(&mut c, &mut t, 1, rising);
        assert!(c.in_startup(), "{:?}", c.timeline());
        let ch = report(&mut c, &mut t, rising, |f| f);
        assert!(!c.in_startup(), "{:?}", c.timeline());
        assert_eq!(ch.map(|ch| ch.reason), Some(Reason::Delay));
    }

    #[test]
    fn a_path_that_got_faster_is_found_in_a_few_round_trips() {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        drive(&mut c, &mut t, 200, bottleneck(150e6));
        assert!(c.rate_bps() < 170_000_000, "{}", c.rate_bps());
        let mut reports = 0;
        while c.rate_bps() < 285_000_000 {
            drive(&mut c, &mut t, 1, bottleneck(300e6));
            reports += 1;
            // 20 round trips of 4 reports.
            assert!(reports <= 80, "{:?}", c.timeline());
        }
        assert!(c.rate_bps() < 500_000_000, "{}", c.rate_bps());
    }

    /// A report of 10 ms of `bps` in 1400-byte datagrams.
    fn ten_ms_at(bps: f64) -> Feedback {
        let bytes = (bps / 8.0 * 0.01) as u64;
        Feedback {
            interval: Duration::from_millis(10),
            bytes,
            datagrams: bytes / 1400,
            ..Feedback::default()
        }
    }

    #[test]
    fn reports_cover_256_datagrams_at_low_rates_after_the_start() {
        let ms = Duration::from_millis;
        let at = ten_ms_at;
        let pace = ReportPace::new(ms(2), false);
        let base = pace.base;
        assert_eq!(base, ms(10));
        // 10 ms of 100 Mbit/s: 89 datagrams; 256 take 28.8 ms.
        let slow = at(100e6);
        assert_eq!(slow.datagrams, 89);
        let every = report_every(pace, &slow);
        assert!((ms(28)..ms(30)).contains(&every), "{every:?}");
        // From about 300 Mbit/s on, every 10 ms as before; no longer than the most.
        assert_eq!(report_every(pace, &at(300e6)), base);
        assert_eq!(report_every(pace, &at(1e9)), base);
        assert_eq!(report_every(pace, &at(80e6)), REPORT_STRETCH_MAX);
        // A slow or quiet path keeps the usual cadence.
        assert_eq!(report_every(pace, &at(50e6)), base);
        assert_eq!(report_every(pace, &at(0.0)), base);
        // A long path's interval stays as it was, and is never shortened.
        let long = ReportPace::new(ms(600), false);
        assert_eq!(report_every(long, &at(100e6)), long.base);
        assert_eq!(report_every(long, &fb(1e6, 0.0, 0)), long.base);
        // The receiver keeps the round trip's cadence for its first reports (startup) ...
        let mut cadence = ReportCadence::new(pace);
        for _ in 1..REPORTS_AT_START {
            cadence.sent(&slow);
            assert_eq!(cadence.every(), base);
        }
        cadence.sent(&slow);
        assert_eq!(cadence.every(), every);
        // ... and after a rate that rose (a climb); a steady or falling one stretches.
        cadence.sent(&at(110e6));
        assert_eq!(cadence.every(), base);
        cadence.sent(&at(110e6));
        assert_eq!(cadence.every(), report_every(pace, &at(110e6)));
        cadence.sent(&at(90e6));
        assert!(cadence.every() > every, "{:?}", cadence.every());
        cadence.sent(&at(1e9));
        assert_eq!(cadence.every(), base);
    }

    #[test]
    fn a_short_paths_reports_cover_512_datagrams_up_to_60_ms() {
        let ms = Duration::from_millis;
        let at = ten_ms_at;
        // Short: the kernel's floor is at most 4 ms; none (a relay) is not short.
        let short = ReportPace::for_path(ms(2), Some(Duration::from_micros(50)));
        assert_eq!(short, ReportPace::new(ms(2), true));
        assert_eq!(short.base, ms(10));
        assert_eq!(
            ReportPace::for_path(ms(2), None),
            ReportPace::new(ms(2), false)
        );
        assert_eq!(
            ReportPace::for_path(ms(40), Some(ms(39))),
            ReportPace::new(ms(40), false)
        );
        // The sender allows for a short path's reports up to twice the threshold.
        assert_eq!(
            ReportPace::heard_on(ms(9), Some(ms(7))),
            ReportPace::new(ms(9), true)
        );
        assert_eq!(
            ReportPace::for_path(ms(9), Some(ms(7))),
            ReportPace::new(ms(9), false)
        );
        // 100 Mbit/s: 89 datagrams in 10 ms, 512 in 57.5 ms; 400 Mbit/s: 14.4 ms; 1 Gbit/s
        // and a slow path keep 10 ms; no longer than 60 ms.
        let every = report_every(short, &at(100e6));
        assert!((ms(57)..ms(58)).contains(&every), "{every:?}");
        let every = report_every(short, &at(400e6));
        assert!((ms(14)..ms(15)).contains(&every), "{every:?}");
        assert_eq!(report_every(short, &at(1e9)), ms(10));
        assert_eq!(report_every(short, &at(80e6)), SHORT_REPORT_STRETCH_MAX);
        assert_eq!(report_every(short, &at(50e6)), ms(10));
        // Not short: as before.
        let every = report_every(ReportPace::new(ms(2), false), &at(100e6));
        assert!((ms(28)..ms(30)).contains(&every), "{every:?}");
    }

    /// Reports of large datagrams (a 9000-byte MTU, loopback) stretch as those of the same
    /// rate in 1500-byte ones: by bytes, not by their few datagrams.
    #[test]
    fn large_datagrams_stretch_reports_by_their_bytes() {
        let ms = Duration::from_millis;
        let jumbo = |bps: f64| {
            let f = ten_ms_at(bps);
            Feedback {
                datagrams: f.bytes / 8_900,
                ..f
            }
        };
        for pace in [ReportPace::new(ms(2), false), ReportPace::new(ms(2), true)] {
            // 100 Mbit/s: 14 datagrams of 8,900 bytes a report, 84 of 1,472-byte equivalents.
            assert_eq!(jumbo(100e6).datagrams, 14);
            let every = report_every(pace, &jumbo(100e6));
            assert!(every > pace.base, "{every:?}");
            let small = report_every(pace, &ten_ms_at(100e6));
            // (Within what 1400-byte datagrams against 1472-byte equivalents make.)
            assert!(every.abs_diff(small) < ms(4), "{every:?} {small:?}");
            // A slow path keeps the usual cadence whatever its datagrams' size.
            assert_eq!(report_every(pace, &jumbo(50e6)), pace.base);
            assert_eq!(report_every(pace, &jumbo(1e9)), pace.base);
        }
    }

    /// A fixed rate whose reports hold two trains or three (128 KiB trains at 100 Mbit/s,
    /// reports of about 256 datagrams) keeps the stretched cadence: the count's jitter is no
    /// climb. A climb that tops the last few reports still brings the usual cadence back.
    #[test]
    fn a_fixed_rates_train_jitter_keeps_the_stretched_cadence() {
        let ms = Duration::from_millis;
        let pace = ReportPace::new(ms(2), false);
        let base = pace.base;
        // 29 ms reports of two or three 94-datagram trains: 65 or 97 Mbit/s of 1,396 bytes.
        let trains = |n: u64| Feedback {
            interval: ms(29),
            datagrams: 94 * n,
            bytes: 94 * n * 1396,
            ..Default::default()
        };
        let mut cadence = ReportCadence::new(pace);
        for _ in 0..REPORTS_AT_START {
            cadence.sent(&trains(3));
        }
        let mut stretched = 0;
        for n in 0..40u64 {
            // Two trains, three, three, two, three, ...
            cadence.sent(&trains(if n % 3 == 0 { 2 } else { 3 }));
            if cadence.every() > base {
                stretched += 1;
            }
        }
        assert_eq!(stretched, 40);
        // A climb: each report above all before it.
        for k in 4..8 {
            cadence.sent(&trains(k));
            assert_eq!(cadence.every(), base, "{k} trains");
        }
    }

    #[test]
    fn a_round_trip_lowered_after_the_start_keeps_the_receivers_report_cadence() {
        // A busy host: the key agreement took 200 ms, so the receiver reports every 50 ms
        // (its own timing is as long); the probes then show the path's 0.4 ms. Reports 50 ms
        // apart are no silence: without the configured cadence kept, the sender expected them
        // every 10 ms and called each gap past 40 ms silence.
        let mut t = Instant::now();
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_millis(200),
                ..cfg(RateMode::Auto)
            },
            t,
        );
        let every = report_interval(Duration::from_millis(200));
        assert_eq!(every, Duration::from_millis(50));
        let path = bottleneck(300e6);
        for n in 0..80 {
            if n == 10 {
                c.set_rtt(Duration::from_micros(400));
            }
            assert!(c.on_silence(t + every - Duration::from_millis(2)).is_none());
            t += every;
            let sent = rate_before(&c, t, c.config().rtt);
            c.on_feedback(t, &path_report(every, path(sent as f64)));
        }
        assert!(
            !c.reasons().iter().any(|r| r.0 == Reason::Silence),
            "{:?}",
            c.reasons()
        );
        assert_eq!(c.config().rtt, Duration::from_micros(400));
    }

    /// A 2 ms round trip, a bottleneck of `bps`: the receiver's reports at its stretched
    /// cadence (`receiver`), each 2 ms late (the receiver's loop is woken late) and one in
    /// four lost after the first 100, reach a sender that allows for `sender`. Returns the controller, the reports that were stretched beyond 25 ms and
    /// beyond 50 ms, and when the last report came.
    fn stretched_reports(
        bps: f64,
        receiver: ReportPace,
        sender: ReportPace,
    ) -> (RateController, usize, usize, Instant) {
        let mut t = Instant::now();
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_millis(2),
                ..cfg(RateMode::Auto)
            },
            t,
        );
        c.set_report_pace(sender);
        let path = bottleneck(bps);
        let mut cadence = ReportCadence::new(receiver);
        let (mut over_25, mut over_50) = (0, 0);
        for n in 0..400 {
            let every = cadence.every();
            over_25 += usize::from(every > Duration::from_millis(25));
            over_50 += usize::from(every > Duration::from_millis(50));
            // The sender checks for silence every 5 ms (more often than it does).
            let mut at = t;
            let every = every + Duration::from_millis(2);
            while at + Duration::from_millis(5) < t + every {
                at += Duration::from_millis(5);
                c.on_silence(at);
            }
            t += every;
            let f = path_report(every, path(c.rate_bps() as f64));
            cadence.sent(&f);
            if n < 100 || n % 4 != 0 {
                c.on_feedback(t, &f);
            }
        }
        (c, over_25, over_50, t)
    }

    #[test]
    fn a_short_path_at_100_mbits_reporting_at_its_stretched_cadence_is_not_silent() {
        // At 100 Mbit/s reports 29 ms apart (58 ms where one is lost), longer than the
        // silence limit of the round trip's 10 ms cadence (40 ms); on a short path 57 ms, at
        // 80 Mbit/s 60 ms (120 ms where one is lost, the limit of a path's usual stretch).
        let ms = Duration::from_millis;
        let floor = Some(Duration::from_micros(50));
        let not_short = ReportPace::new(ms(2), false);
        let short = (
            ReportPace::for_path(ms(2), floor),
            ReportPace::heard_on(ms(2), floor),
        );
        for (bps, (pace, sender), stretched) in [
            (100e6, (not_short, not_short), 0),
            (100e6, short, 200),
            (80e6, (not_short, not_short), 0),
            (80e6, short, 200),
        ] {
            let (mut c, over_25, over_50, t) = stretched_reports(bps, pace, sender);
            assert!(over_25 > 200, "{over_25}");
            assert!(over_50 >= stretched, "{over_50}");
            assert!(
                !c.reasons().iter().any(|r| r.0 == Reason::Silence),
                "{:?}",
                c.reasons()
            );
            let r = c.rate_bps() as f64;
            assert!((bps * 0.9..bps * 1.2).contains(&r), "{r}");
            // Reports that do stop are still silence, four of their intervals on.
            let (bw, every) = (bottleneck_of(&c), c.report_spacing());
            assert!(every > Duration::from_millis(25), "{every:?}");
            assert!(c
                .on_silence(t + every * 4 - Duration::from_millis(1))
                .is_none());
            // (Cruising paces a little over the model's bottleneck: its reserve.)
            assert!(c.rate_bps() as f64 > bw, "{} against {bw}", c.rate_bps());
            let cut = c.on_silence(t + every * 4).expect("a cut");
            assert_eq!(cut.reason, Reason::Silence);
        }
    }

    #[test]
    fn a_sender_that_does_not_allow_for_a_short_paths_reports_calls_them_silence() {
        // Why the sender is told the pace ([`ReportPace::heard_on`]): the same short path's
        // reports, heard by a sender that expects a path's usual stretch.
        let ms = Duration::from_millis;
        let short = ReportPace::for_path(ms(2), Some(Duration::from_micros(50)));
        let (c, _, over_50, _) = stretched_reports(80e6, short, ReportPace::new(ms(2), false));
        assert!(over_50 > 0, "{over_50}");
        assert!(
            c.reasons().iter().any(|r| r.0 == Reason::Silence),
            "{:?}",
            c.reasons()
        );
    }

    #[test]
    fn reports_that_stop_coming_bring_the_rate_down_to_the_model_once() {
        let mut t = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t);
        // Nothing before the first report: the set-up's silence is not the receiver's.
        assert!(c.on_silence(t + Duration::from_secs(5)).is_none());
        // Startup, a few reports in: its rate is above what was delivered.
        drive(&mut c, &mut t, 6, bottleneck(1e9));
        assert!(c.in_startup());
        let (rate, model) = (c.rate_bps(), bottleneck_of(&c));
        assert!(rate as f64 > model * 1.5, "{rate} against {model}");
        // 50 ms RTT, 12.5 ms reports: silent for 4 intervals (50 ms) is not yet enough, a
        // round trip and two intervals (75 ms) is.
        assert!(c.on_silence(t + Duration::from_millis(74)).is_none());
        let cut = c.on_silence(t + Duration::from_millis(75)).expect("a cut");
        assert_eq!(cut.reason, Reason::Silence);
        assert_eq!(cut.rate_bps, model as u64);
        // Once per silence.
        assert!(c.on_silence(t + Duration::from_millis(500)).is_none());
        // A report ends it; the model goes on from there (still in startup).
        t += Duration::from_millis(500);
        report(&mut c, &mut t, bottleneck(1e9), |f| f);
        assert!(
            c.in_startup() && c.rate_bps() > cut.rate_bps,
            "{:?}",
            c.timeline()
        );
        // Other modes are left alone.
        for mode in [RateMode::Fixed, RateMode::Fair] {
            let mut t = Instant::now();
            let mut c = RateController::new(cfg(mode), t);
            drive(&mut c, &mut t, 6, bottleneck(1e9));
            assert!(
                c.on_silence(t + Duration::from_secs(5)).is_none(),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn a_long_silence_halves_the_rate_every_backoff_and_the_next_report_brings_it_back() {
        let (mut c, mut t) = cruising_at_300();
        let bw = bottleneck_of(&c);
        let limit = c.silence_limit();
        let backoff = c.silence_backoff();
        assert_eq!(backoff, SILENCE_BACKOFF, "50 ms round trips");
        // The driver asks every 12.5 ms; 20 s of silence (a path that is out).
        let mut at = t;
        let mut seen = Vec::new();
        while at < t + Duration::from_secs(20) {
            at += Duration::from_micros(12_500);
            c.on_silence(at);
            seen.push((at - t, c.rate_bps() as f64));
        }
        let rate_at = |d: Duration| {
            seen.iter()
                .rev()
                .find(|s| s.0 <= d)
                .map_or(f64::NAN, |s| s.1)
        };
        // Down to the model at the silence limit, no lower for a backoff ...
        assert_eq!(rate_at(limit) as u64, bw as u64);
        let ms = Duration::from_millis;
        assert_eq!(rate_at(limit + backoff - ms(13)) as u64, bw as u64);
        // ... then halved once per backoff, to 1/64 at most.
        for k in 1..=SILENCE_HALVINGS {
            let at = limit + backoff * k + ms(13);
            let want = bw / f64::from(1u32 << k);
            assert!(
                (rate_at(at) - want).abs() <= 1.0,
                "{k}: {} {want}",
                rate_at(at)
            );
        }
        assert!((rate_at(ms(19_990)) - bw / 64.0).abs() <= 1.0);
        let halved = c
            .reasons()
            .iter()
            .find(|r| r.0 == Reason::Silence)
            .map(|r| r.1);
        assert_eq!(
            halved,
            Some(u64::from(SILENCE_HALVINGS) + 1),
            "{:?}",
            c.reasons()
        );
        // The path is back: the first report (the outage's gaps in it) restores the model's
        // bottleneck at once, ...
        let paced = c.paced_until(at) - c.last_delivery.unwrap().1;
        let sent = paced / 8.0 / 1400.0;
        assert!(
            sent < bw * 5.0 / 8.0 / 1400.0,
            "{sent}: a quarter of 20 s at the rate"
        );
        t = at;
        let back = report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
            lost: sent as u64,
            datagrams: 10,
            bytes: 14_000,
            ..f
        })
        .expect("restored");
        assert_eq!(back.rate_bps, bw as u64);
        assert_eq!(back.reason, Reason::Cruise);
        // ... and the sender counts one outage of the silence's length, by what it paced (at
        // the rate it had when the reports stopped, those losses are not a quarter of 20 s).
        drive(&mut c, &mut t, 8, bottleneck(300e6));
        assert_eq!(c.outages().count, 1, "{:?}", c.outages());
        assert!(
            c.outages().total >= Duration::from_secs(19),
            "{:?}",
            c.outages()
        );
        assert!(c.rate_bps() as f64 >= bw * 0.9, "{}", c.rate_bps());
        // A silence shorter than a backoff past the limit leaves the rate at the model's.
        let (mut c, t) = cruising_at_300();
        let bw = bottleneck_of(&c);
        c.on_silence(t + c.silence_limit());
        c.on_silence(t + c.silence_limit() + SILENCE_BACKOFF - ms(1));
        assert_eq!(c.rate_bps(), bw as u64);
    }

    #[test]
    fn a_record_keeps_the_latest_whole_and_the_older_evenly_spread() {
        for n in [10u64, 64, 65, 256, 300, 1_000, 10_000, 123_457] {
            let mut r = Record::new();
            for i in 0..n {
                r.push(i);
            }
            let kept = r.to_vec();
            assert!(kept.len() <= TIMELINE_CAP, "{n}: {}", kept.len());
            assert_eq!(kept[0], 0, "{n}: the first is kept");
            // The latest whole.
            let recent = (n as usize).min(RECORD_RECENT);
            let tail: Vec<u64> = (n - recent as u64..n).collect();
            assert_eq!(kept[kept.len() - recent..], tail[..], "{n}");
            // Before them, one stride apart throughout, and no more than twice as sparse as
            // the cap allows.
            let older = &kept[..kept.len() - recent];
            let steps: Vec<u64> = older.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(steps.windows(2).all(|w| w[0] == w[1]), "{n}: {steps:?}");
            if let Some(&step) = steps.first() {
                let span = n - RECORD_RECENT as u64;
                let even = span.div_ceil((TIMELINE_CAP - RECORD_RECENT) as u64);
                assert!(step <= 2 * even.max(1), "{n}: step {step}, span {span}");
            }
        }
    }

    #[test]
    fn the_bottlenecks_count_of_a_whole_timeline_is_the_controllers() {
        let (c, _) = cruising_at_300();
        let tl = c.timeline();
        assert!((tl.len() as u64) == c.changes(), "not thinned yet");
        let first = tl[0].at;
        let changes: Vec<_> = tl
            .iter()
            .map(|ch| (ch.at - first, ch.rate_bps, ch.reason))
            .collect();
        assert_eq!(bottleneck::Evidence::reasons_of(&changes), c.reasons());
    }

    #[test]
    fn reasons_and_the_rate_range_count_every_change_however_long_the_run() {
        let (mut c, mut t) = cruising_at_300();
        drive(&mut c, &mut t, 2000, bottleneck(300e6));
        assert!(c.changes() > 2 * TIMELINE_CAP as u64, "{}", c.changes());
        assert!(c.timeline().len() <= TIMELINE_CAP);
        let counted: u64 = c.reasons().iter().map(|&(_, n)| n).sum();
        assert_eq!(counted, c.changes() - 1);
        let (lo, hi) = c.rate_range();
        let all = c.timeline();
        assert!(all.iter().all(|ch| (lo..=hi).contains(&ch.rate_bps)));
        assert_eq!(lo, cfg(RateMode::Auto).start_bps);
        assert!(hi as f64 > 300e6, "{hi}");
    }

    #[test]
    fn a_path_that_delivers_nothing_for_a_while_and_loses_what_was_sent_is_an_outage() {
        // 50 ms RTT, 12.5 ms reports: silence is 75 ms without a delivering report.
        for mode in [RateMode::Auto, RateMode::Fair, RateMode::Fixed] {
            let (mut c, mut t) = {
                let mut t = Instant::now();
                let mut c = RateController::new(cfg(mode), t);
                drive(&mut c, &mut t, 200, bottleneck(300e6));
                (c, t)
            };
            assert_eq!(c.outages(), Outages::default(), "{mode:?}");
            // What the rate sent in those 3 s, less a tenth.
            let lost = (c.rate_bps() as f64 * 3.0 / 8.0 / 1400.0 * 0.9) as u64;
            // Reports that count nothing (the receiver's, while only the data is lost) are
            // part of the silence; the first delivering one after 3 s lost what was sent.
            t += Duration::from_secs(1);
            report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
                bytes: 0,
                datagrams: 0,
                ..f
            });
            t += Duration::from_secs(2);
            report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
                lost,
                ..f
            });
            let o = c.outages();
            assert_eq!(o.count, 1, "{mode:?}");
            // From the last delivering report to this one (3 s and two intervals), less an
            // interval.
            assert_eq!(o.total, Duration::from_micros(3_012_500), "{mode:?}");
            // Deliveries go on: no more.
            drive(&mut c, &mut t, 20, bottleneck(300e6));
            assert_eq!(c.outages().count, 1, "{mode:?}");
            // Again, the gap counted a few reports after the first delivering one (the
            // receiver sees it once later datagrams come; reports can be reordered).
            t += Duration::from_secs(3);
            drive(&mut c, &mut t, 2, bottleneck(300e6));
            assert_eq!(c.outages().count, 1, "{mode:?}");
            report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
                lost,
                ..f
            });
            assert_eq!(c.outages().count, 2, "{mode:?}");
            // (This silence: 3 s and an interval, less an interval.)
            assert_eq!(
                c.outages().total,
                Duration::from_micros(3_012_500 + 3_000_000),
                "{mode:?}"
            );
        }
        // Silent as long, but what was sent came (a sender that stalled), or its receiver's
        // kernel dropped it (a receiver starved of CPU), or little was lost, or more than was
        // delivered but a handful (a tail's repairs): no outage.
        let (mut c, mut t) = cruising_at_300();
        let edits: [fn(Feedback) -> Feedback; 4] = [
            |f| f,
            |f| Feedback {
                lost: 80_000,
                socket_drops: 80_000,
                ..f
            },
            |f| Feedback {
                lost: f.datagrams,
                ..f
            },
            |f| Feedback {
                bytes: 2800,
                datagrams: 2,
                lost: 5,
                ..f
            },
        ];
        for edit in edits {
            t += Duration::from_secs(3);
            report(&mut c, &mut t, bottleneck(300e6), edit);
            drive(&mut c, &mut t, 20, bottleneck(300e6));
        }
        assert_eq!(c.outages(), Outages::default());
        // The receiver's kernel dropped what was sent, and said so during the silence (its
        // gaps show once later datagrams come): no outage.
        t += Duration::from_secs(3);
        report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
            bytes: 0,
            datagrams: 0,
            socket_drops: 80_000,
            ..f
        });
        report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
            lost: 80_000,
            ..f
        });
        drive(&mut c, &mut t, 20, bottleneck(300e6));
        assert_eq!(c.outages(), Outages::default());
        // The losses of a silence count for it only until a silence limit after it ended.
        t += Duration::from_secs(3);
        drive(&mut c, &mut t, 7, bottleneck(300e6));
        report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
            lost: 80_000,
            ..f
        });
        assert_eq!(c.outages(), Outages::default());
        // A gap just under the silence limit is no outage either.
        t += Duration::from_millis(60);
        report(&mut c, &mut t, bottleneck(300e6), |f| Feedback {
            lost: 80_000,
            ..f
        });
        assert_eq!(c.outages(), Outages::default());
    }

    #[test]
    fn a_receiver_that_is_the_bottleneck_bounds_the_model_and_its_probes() {
        // The path takes anything; the receiver reads 320 Mbit/s, and what is sent beyond
        // that fills its socket buffers. Its reports time the bytes by when they arrived, or,
        // once its buffers are a quarter full, by when it read them (`ReportBuilder::build`).
        // A probe's reports show the probe's rate until then; the buffers' fill says that the
        // receiver did not keep up, and the model stays near what the receiver reads.
        let (mut c, mut t) = cruising_at_300();
        let base = bottleneck_of(&c);
        let reads = 320e6;
        // The bytes in its buffers (256 KiB), which drop what does not fit.
        let (held, room) = (std::cell::Cell::new(0f64), 262_144.0);
        let receiver = |f: Feedback| {
            let secs = f.interval.as_secs_f64();
            let got = f.bytes as f64;
            let level = held.get() + got - reads / 8.0 * secs;
            held.set(level.clamp(0.0, room));
            let fill = held.get() / room;
            if fill < 0.25 {
                return Feedback {
                    queue_fill: fill,
                    ..f
                };
            }
            // Behind, it reads all the time.
            let read = reads / 8.0 * secs;
            Feedback {
                queue_fill: fill,
                bytes: read as u64,
                datagrams: read as u64 / 1400,
                socket_drops: ((level - room).max(0.0) / 1400.0) as u64,
                ..f
            }
        };
        let (mut probes, mut doubled) = (0, 0);
        for _ in 0..400 {
            let model = bottleneck_of(&c);
            let change = report(&mut c, &mut t, |r| (r, Duration::from_millis(1)), receiver);
            if let Some(ch) = change.filter(|ch| ch.reason == Reason::Probe) {
                probes += 1;
                let step = ch.rate_bps as f64 / model;
                doubled += usize::from(step > 1.0 + 1.5 * model::PROBE_STEP);
            }
            assert!(
                bottleneck_of(&c) <= reads * 1.15,
                "the model took the receiver's buffers for capacity: {:?}",
                c.timeline().iter().rev().take(12).collect::<Vec<_>>()
            );
        }
        // It kept probing (the receiver might get faster), from the receiver's rate: one probe
        // at a doubled step, after the first, which the buffers took unseen.
        assert!(probes >= 10, "{probes} probes");
        assert!(
            doubled <= 1,
            "{doubled} of {probes} probes at a doubled step"
        );
        assert!(bottleneck_of(&c) >= base, "{}", bottleneck_of(&c));
    }

    /// One report on a 300 Mbit/s path that lost a tenth of its datagrams through a queue of
    /// `queue_ms`; returns why the rate changed.
    fn lossy_report(c: &mut RateController, t: &mut Instant, queue_ms: u64) -> Option<Reason> {
        let path = |rate: f64| (rate.min(300e6), Duration::from_millis(queue_ms));
        let lossy = |f: Feedback| Feedback {
            lost: f.datagrams / 10,
            ..f
        };
        report(c, t, path, lossy).map(|ch| ch.reason)
    }

    /// A loss judged congestion while the queue was under what cruising keeps standing (twice
    /// its reserve: 10 ms of the 15 ms target here) is a buffer too shallow for the pacers'
    /// catch-up after a stall: they repay nothing from then on. A loss through a longer queue
    /// says nothing of the kind.
    #[test]
    fn a_buffer_that_drops_before_its_queue_shows_gets_no_catch_up_from_the_pacers() {
        let (mut c, mut t) = cruising_at_300();
        assert_eq!(c.catch_up(), crate::channel_send::MAX_OWED);
        // Through a 12 ms queue (the target is 15 ms): congestion, in a deep buffer.
        assert_eq!(lossy_report(&mut c, &mut t, 12), Some(Reason::Loss));
        assert_eq!(c.catch_up(), crate::channel_send::MAX_OWED);
        drive(&mut c, &mut t, 40, bottleneck(300e6));
        // The same loss with 2 ms of queue: a shallow buffer.
        assert_eq!(lossy_report(&mut c, &mut t, 2), Some(Reason::Loss));
        assert_eq!(c.catch_up(), Duration::ZERO);
        // Other modes have no model of the path: the pacers repay as always.
        let fair = RateController::new(cfg(RateMode::Fair), t);
        assert_eq!(fair.catch_up(), crate::channel_send::MAX_OWED);
    }

    /// The gains over the model's bottleneck that cruising set (each run of one gain once) over
    /// 40 reports through a queue of `queue_ms` on a 300 Mbit/s path, the receiver's buffers
    /// `fill` full.
    fn cruise_gains(c: &mut RateController, t: &mut Instant, queue_ms: u64, fill: f64) -> Vec<f64> {
        let path = |rate: f64| (rate.min(300e6), Duration::from_millis(queue_ms));
        let edit = |f: Feedback| Feedback {
            queue_fill: fill,
            ..f
        };
        let mut gains = Vec::new();
        for _ in 0..40 {
            if let Some(ch) = report(c, t, path, edit).filter(|ch| ch.reason == Reason::Cruise) {
                gains.push(ch.rate_bps as f64 / bottleneck_of(c));
            }
        }
        gains.dedup_by(|a, b| (*a - *b).abs() < 1e-3);
        gains
    }

    /// Cruising keeps a reserve of queue against a stalled sender (a third of the 15 ms
    /// target, 5 ms, to twice that): under it the rate is 3% over the model's bottleneck, in
    /// it the bottleneck, over it 5% under. Not into a receiver whose buffers fill (it would
    /// hold the reserve), and not on a buffer that proved shallow: there it drains over a
    /// third of the target and keeps nothing.
    #[test]
    fn cruising_keeps_a_reserve_of_queue_unless_the_buffer_is_shallow() {
        let (mut c, mut t) = cruising_at_300();
        let near = |gains: &[f64], want: f64| {
            !gains.is_empty() && gains.iter().all(|g| (g - want).abs() < 0.005)
        };
        let g = cruise_gains(&mut c, &mut t, 2, 0.0);
        assert!(near(&g, model::CRUISE_FILL_GAIN), "{g:?}");
        let g = cruise_gains(&mut c, &mut t, 7, 0.0);
        assert!(near(&g, 1.0), "{g:?}");
        let g = cruise_gains(&mut c, &mut t, 12, 0.0);
        assert!(near(&g, 0.95), "{g:?}");
        // A receiver whose buffers are a third full: no reserve.
        let g = cruise_gains(&mut c, &mut t, 2, 0.33);
        assert!(near(&g, 1.0), "{g:?}");
        // A loss judged congestion through 2 ms of queue: the buffer is shallow.
        assert_eq!(lossy_report(&mut c, &mut t, 2), Some(Reason::Loss));
        drive(&mut c, &mut t, 40, bottleneck(300e6));
        let g = cruise_gains(&mut c, &mut t, 2, 0.0);
        assert!(near(&g, 1.0), "{g:?}");
        let g = cruise_gains(&mut c, &mut t, 7, 0.0);
        assert!(near(&g, 0.95), "{g:?}");
    }

    #[test]
    fn a_rate_cut_to_the_floor_climbs_back_once_the_path_is_free() {
        let (mut c, mut t) = cruising_at_300();
        // A competitor that keeps a queue: a correction every round trip, down to the floor.
        // (Its reports count small datagrams, so that each is a sample down there: that is
        // not what is tested here.)
        let crowded = |rate: f64| (rate * 0.6, Duration::from_millis(40));
        let many = |f: Feedback| Feedback {
            datagrams: f.datagrams.max(16),
            ..f
        };
        let mut reports = 0;
        while c.rate_bps() > 1_100_000 {
            report(&mut c, &mut t, crowded, many);
            reports += 1;
            assert!(reports <= 2_000, "{:?}", c.timeline().last());
        }
        // The competitor leaves. At 1 Mbit/s a 12.5 ms report holds one datagram, too few to
        // time on its own: the reports are pooled into samples, and probes last long enough to
        // be seen in them, so the model climbs back (before, it stayed at the floor for good).
        let free = bottleneck(300e6);
        let mut reports = 0;
        while c.rate_bps() < 270_000_000 {
            drive(&mut c, &mut t, 1, &free);
            reports += 1;
            // 5 s: 100 round trips.
            assert!(
                reports <= 400,
                "{:?}",
                &c.timeline()[c.timeline().len().saturating_sub(30)..]
            );
        }
        assert!(c.rate_bps() < 400_000_000, "{}", c.rate_bps());
    }

    #[test]
    fn a_queue_over_the_target_for_a_round_corrects_the_model() {
        let (mut c, mut t) = cruising_at_300();
        // The path slows to 200 Mbit/s: the surplus queues (30 ms, over the 15 ms target). A
        // round (4 reports) of it is a queue, not a receiver's moment.
        let slower = |_: f64| (200e6, Duration::from_millis(30));
        let mut reports = 0;
        let ch = loop {
            reports += 1;
            match report(&mut c, &mut t, slower, |f| f) {
                Some(ch) if ch.reason == Reason::Delay => break ch,
                _ => assert!(reports < 8, "{:?}", c.timeline()),
            }
        };
        assert!(reports >= 4, "after {reports} reports");
        assert!(
            ch.rate_bps < 200_000_000 && ch.rate_bps >= 150_000_000,
            "{ch:?}"
        );
        assert!((bottleneck_of(&c) - 200e6).abs() < 2e6);
    }

    #[test]
    fn one_report_of_socket_drops_changes_nothing_and_two_correct_the_model() {
        let (mut c, mut t) = cruising_at_300();
        let before = bottleneck_of(&c);
        // A receiver's hiccup: one report with a full, dropping buffer at 200 Mbit/s.
        let behind = |f: Feedback| Feedback {
            socket_drops: 50,
            queue_fill: 0.9,
            ..f
        };
        let slow = |_: f64| (200e6, Duration::from_millis(1));
        let ch = report(&mut c, &mut t, slow, behind);
        assert!(
            ch.is_none_or(|ch| ch.reason != Reason::SocketDrops),
            "{ch:?}"
        );
        assert_eq!(bottleneck_of(&c), before);
        drive(&mut c, &mut t, 8, bottleneck(300e6));
        assert!(c.rate_bps() as f64 >= 0.9 * 300e6, "{}", c.rate_bps());
        // A receiver that stays behind: two reports in a row.
        report(&mut c, &mut t, slow, behind);
        let ch = report(&mut c, &mut t, slow, behind).unwrap();
        assert_eq!(ch.reason, Reason::SocketDrops);
        assert!(ch.rate_bps < 200_000_000, "{ch:?}");
        assert!((bottleneck_of(&c) - 200e6).abs() < 2e6);
    }

    /// A receiver whose reader was off the CPU for a few milliseconds (the scheduler's, on a
    /// busy machine) finds its buffer over half full in report after report, but reads what
    /// was sent over each: its backlog does not grow, and it is no slow receiver.
    #[test]
    fn a_backlog_the_receiver_reads_at_the_rate_is_no_slow_receiver() {
        let (mut c, mut t) = cruising_at_300();
        let before = bottleneck_of(&c);
        let gap = |f: Feedback| Feedback {
            queue_fill: 0.7,
            ..f
        };
        // What was sent arrives, and is read: the path takes more than the receiver is sent.
        let reads_all = |rate: f64| (rate, Duration::from_millis(1));
        for _ in 0..6 {
            let ch = report(&mut c, &mut t, reads_all, gap);
            assert!(
                ch.is_none_or(|ch| ch.reason != Reason::Backlog),
                "{ch:?} {:?}",
                c.timeline().iter().rev().take(6).collect::<Vec<_>>()
            );
        }
        assert!(bottleneck_of(&c) >= before, "{}", bottleneck_of(&c));
    }

    /// A receiver that reads less than was sent, report after report, with its buffer over
    /// half full, is behind however it got there: the model is cut to what it read over those
    /// reports (their mean), not to the lowest of them, which may hold a scheduling gap.
    #[test]
    fn a_receiver_behind_is_cut_to_what_it_read_over_the_reports_that_showed_it() {
        let (mut c, mut t) = cruising_at_300();
        let full = |f: Feedback| Feedback {
            queue_fill: 0.7,
            ..f
        };
        // 150 then 250 Mbit/s read: 200 over the two.
        report(&mut c, &mut t, |_| (150e6, Duration::from_millis(1)), full);
        let ch = report(&mut c, &mut t, |_| (250e6, Duration::from_millis(1)), full).unwrap();
        assert_eq!(ch.reason, Reason::Backlog);
        let bw = bottleneck_of(&c);
        assert!((bw - 200e6).abs() < 4e6, "{bw}");
        assert!(ch.rate_bps < 200_000_000, "{ch:?}");
    }

    /// A sender that gets only 80% of its rate out (late on a busy machine) is judged by what
    /// it sent: a receiver whose buffer is over half full but reads all of that is no slow
    /// receiver; one that reads less than was sent still is.
    #[test]
    fn a_receiver_is_judged_against_what_the_sender_got_out() {
        let (mut c, mut t) = cruising_at_300();
        // The receiver reads as it arrives: its reports say what the late sender got out.
        let late = |rate: f64| (rate * 0.8, Duration::from_millis(1));
        for _ in 0..3 {
            report(&mut c, &mut t, late, |f| Feedback {
                queue_fill: 0.1,
                ..f
            });
        }
        // A scheduling gap's backlog: over half full, and all of what was sent is read.
        let gap = |f: Feedback| Feedback {
            queue_fill: 0.7,
            ..f
        };
        for _ in 0..6 {
            let ch = report(&mut c, &mut t, late, gap);
            assert!(
                ch.is_none_or(|ch| !matches!(ch.reason, Reason::Backlog | Reason::SocketDrops)),
                "{ch:?} {:?}",
                c.timeline().iter().rev().take(8).collect::<Vec<_>>()
            );
        }
        // Reading less than the sender got out, with its buffer over half full: behind.
        let slow = |rate: f64| (rate * 0.6, Duration::from_millis(1));
        let cut = (0..3)
            .filter_map(|_| report(&mut c, &mut t, slow, gap))
            .any(|ch| ch.reason == Reason::Backlog);
        assert!(cut, "{:?}", latest_changes(&c));
    }

    /// A receiver whose socket overflows in every other report (drops in one, the gaps they
    /// left counted as lost in the next, its buffer over half full in both, reading 60% of
    /// what was sent, dropping as much again) is behind in both: the gaps its own drops left
    /// are not read, so the report between two overflows does not read as keeping up and end
    /// the run.
    #[test]
    fn a_receiver_that_overflows_every_other_report_is_behind_in_the_reports_between() {
        let (mut c, mut t) = cruising_at_300();
        let slow = |rate: f64| (rate * 0.6, Duration::from_millis(1));
        let mut cut = false;
        for _ in 0..4 {
            let drops = report(&mut c, &mut t, slow, |f| Feedback {
                queue_fill: 0.7,
                socket_drops: f.datagrams,
                ..f
            });
            let gaps = report(&mut c, &mut t, slow, |f| Feedback {
                queue_fill: 0.7,
                lost: f.datagrams,
                ..f
            });
            cut |= [drops, gaps]
                .iter()
                .flatten()
                .any(|ch| matches!(ch.reason, Reason::Backlog | Reason::SocketDrops));
        }
        assert!(cut, "{:?}", latest_changes(&c));
    }

    /// What a probe's step up gets through is the path's to say, not the sender's: a report
    /// then (the path delivering less than the rate, the receiver's buffer nearly empty) is no
    /// measure of the sender's shortfall, and a receiver that falls behind right after it is
    /// judged against the whole rate.
    #[test]
    fn a_probes_step_up_is_no_measure_of_what_the_sender_gets_out() {
        let (mut c, mut t) = cruising_at_300();
        // Into the first probe's step up.
        let mut probing = false;
        for _ in 0..400 {
            report(&mut c, &mut t, bottleneck(300e6), |f| f);
            if c.model().unwrap().phase() == model::Phase::ProbeUp {
                probing = true;
                break;
            }
        }
        assert!(probing, "no probe");
        // The probe's data reported (a round trip later): a policer holds delivery at the
        // path's 300 Mbit/s without a queue, the receiver's buffer nearly empty.
        let probe_reported = std::cell::Cell::new(false);
        for _ in 0..12 {
            report(
                &mut c,
                &mut t,
                |r| {
                    probe_reported.set(r > 315e6);
                    (r.min(300e6), Duration::from_millis(1))
                },
                |f| f,
            );
            if probe_reported.get() {
                break;
            }
        }
        assert!(probe_reported.get(), "the probe's data was not reported");
        // The receiver reads 92% of what is sent, its buffer over half full: behind.
        let full = |f: Feedback| Feedback {
            queue_fill: 0.7,
            ..f
        };
        let cut = (0..6)
            .filter_map(|_| {
                report(
                    &mut c,
                    &mut t,
                    |r| (r * 0.92, Duration::from_millis(1)),
                    full,
                )
            })
            .any(|ch| ch.reason == Reason::Backlog);
        assert!(cut, "{:?}", latest_changes(&c));
    }

    /// After the receiver fell behind, the probes that follow keep the first step for
    /// [`model::DAMPED_PROBES`] probes, though the path takes each (the receiver reads
    /// everything again): a doubled step would push past what the receiver just showed it
    /// reads and fill its buffers again. Then the step doubles as before.
    #[test]
    fn the_probes_after_a_receiver_fell_behind_keep_the_first_step() {
        let (mut c, mut t) = cruising_at_300();
        // Two reports with socket drops, reading 270 Mbit/s: a cut of a tenth (too small to
        // be restored at once by the next probe).
        let drops = |f: Feedback| Feedback {
            socket_drops: 5,
            ..f
        };
        report(&mut c, &mut t, |_| (270e6, Duration::from_millis(1)), drops);
        let ch = report(&mut c, &mut t, |_| (270e6, Duration::from_millis(1)), drops).unwrap();
        assert_eq!(ch.reason, Reason::SocketDrops);
        // Then everything sent is read: every probe is taken.
        let mut steps: Vec<f64> = Vec::new();
        let mut last_probe = 0u64;
        for _ in 0..400 {
            let model = bottleneck_of(&c);
            let change = report(&mut c, &mut t, |r| (r, Duration::from_millis(1)), |f| f);
            if let Some(ch) = change.filter(|ch| ch.reason == Reason::Probe) {
                if ch.rate_bps != last_probe {
                    steps.push(ch.rate_bps as f64 / model - 1.0);
                }
                last_probe = ch.rate_bps;
            }
            if steps.len() > model::DAMPED_PROBES as usize {
                break;
            }
        }
        let damped = model::DAMPED_PROBES as usize;
        assert!(steps.len() > damped, "{steps:?}");
        for (i, step) in steps[..damped].iter().enumerate() {
            assert!(
                *step < 1.5 * model::PROBE_STEP,
                "probe {i} after the cut at step {step}: {steps:?}"
            );
        }
        // The path keeps taking them: the step doubles again.
        assert!(
            steps[damped] > 1.5 * model::PROBE_STEP,
            "{steps:?} {:?}",
            c.timeline().iter().rev().take(12).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_outage_leaves_the_remembered_rate_for_when_deliveries_resume() {
        let (mut c, mut t) = cruising_at_300();
        let before = c.rate_bps();
        // 3 s of nothing arriving: each report counts the gap as lost datagrams.
        let out = |f: Feedback| Feedback {
            bytes: 1400,
            datagrams: 1,
            lost: 300,
            ..f
        };
        for _ in 0..240 {
            let ch = report(&mut c, &mut t, bottleneck(300e6), out);
            assert!(ch.is_none(), "{ch:?}");
        }
        assert_eq!(c.rate_bps(), before);
        // Deliveries resume at once at the remembered rate.
        drive(&mut c, &mut t, 4, bottleneck(300e6));
        assert!(c.rate_bps() as f64 >= 0.9 * 300e6, "{}", c.rate_bps());
    }

    /// The end of a transfer on a 300 Mbit/s path: the channels run out of new data (160 Mbit/s
    /// delivered), then the tail's repairs overflow the queue (a third lost). The model is cut
    /// to what the last reports delivered; the next transfer remembers the path's rate, unless
    /// a probe since showed the path no longer takes it.
    #[test]
    fn a_cut_at_a_transfers_end_is_not_what_the_next_transfer_remembers() {
        let (mut c, mut t) = cruising_at_300();
        let dry = |rate: f64| (rate.min(160e6), Duration::from_millis(1));
        drive(&mut c, &mut t, 2, dry);
        let mut cut = false;
        for _ in 0..4 {
            let lossy = |f: Feedback| Feedback {
                lost: f.datagrams / 2,
                ..f
            };
            if let Some(ch) = report(&mut c, &mut t, dry, lossy) {
                cut |= ch.reason == Reason::Loss;
            }
        }
        assert!(cut, "{:?}", c.timeline());
        let model_bw = bottleneck_of(&c);
        assert!(model_bw < 0.8 * 300e6, "{model_bw}");
        let m = PathMemory::of(&c).unwrap();
        assert!(m.bottleneck_bps as f64 >= 0.95 * 300e6, "{m:?}");
        // The path did slow down to 160: a probe finds it does not take more, and that is
        // what is remembered.
        drive(&mut c, &mut t, 100, bottleneck(160e6));
        let m = PathMemory::of(&c).unwrap();
        assert!(
            (m.bottleneck_bps as f64) < 0.8 * 300e6,
            "{m:?} {:?}",
            c.timeline()
        );
    }

    /// A controller out of startup with a known capacity of `capacity_bps` (a loss round there),
    /// at `t`; returns it and the time of its last report.
    fn settled_at(capacity_bps: f64) -> (RateController, Instant) {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        while (c.rate_bps() as f64) < capacity_bps {
            t += Duration::from_millis(200);
            c.on_feedback(t, &fb(c.rate_bps() as f64, 0.0, 1));
        }
        t += Duration::from_millis(200);
        let ch = c.on_feedback(t, &fb(capacity_bps, 0.3, 1)).unwrap();
        assert_eq!(ch.reason, Reason::Loss);
        (c, t)
    }

    #[test]
    fn a_socket_buffer_half_full_is_not_extrapolated_like_a_path_queue() {
        // Startup on a 0.2 ms path with 10 ms reports has reached 10 Gbit/s when the receiver
        // falls behind for a moment: 5 Gbit/s delivered, its buffer 70% full (3 ms queued).
        let mut c = RateController::new(
            RateConfig {
                rtt: Duration::from_micros(200),
                ceiling_bps: 20_000_000_000,
                ..cfg(RateMode::Auto)
            },
            Instant::now(),
        );
        let mut t = Instant::now();
        while c.rate_bps() < 10_000_000_000 {
            t += Duration::from_millis(10);
            c.on_feedback(t, &fb10(c.rate_bps() as f64, 0));
        }
        t += Duration::from_millis(10);
        let full = Feedback {
            queue_fill: 0.7,
            ..fb10(5e9, 3)
        };
        let cut = c.on_feedback(t, &full).unwrap();
        assert_eq!(cut.reason, Reason::Backlog);
        // Below what was delivered, by what the 3 ms need to drain, not by half again for
        // what the surplus would add to a queue that cannot hold it.
        assert!(
            cut.rate_bps > 4_000_000_000 && cut.rate_bps < 5_000_000_000,
            "{cut:?}"
        );
    }

    #[test]
    fn a_nearly_idle_round_cuts_at_most_half() {
        let (mut c, mut t) = settled_at(300e6);
        let before = c.rate_bps();
        t += Duration::from_millis(200);
        // The end of a transfer: a few datagrams, a third of them lost.
        let tail = Feedback {
            interval: Duration::from_millis(50),
            bytes: 20 * 1400,
            datagrams: 20,
            lost: 10,
            ..Feedback::default()
        };
        let ch = c.on_feedback(t, &tail).unwrap();
        assert_eq!(ch.reason, Reason::Loss);
        assert!(ch.rate_bps >= before / 2, "{} -> {}", before, ch.rate_bps);
    }

    /// Reports of 150 datagrams from a path that loses 2% in bursts of two on average (a
    /// Gilbert model drawn from a fixed sequence): their counts vary about three times as much
    /// as independent losses would, and the floor says so; independent losses give about 1.
    #[test]
    fn the_loss_floor_allows_for_loss_in_bursts() {
        let counts = |burst: f64| -> Vec<u64> {
            let mut x: u64 = 7;
            let mut draw = || {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 11) as f64 / (1u64 << 53) as f64
            };
            let mut in_burst = false;
            (0..400)
                .map(|_| {
                    (0..150)
                        .filter(|_| {
                            let p = if burst <= 1.0 {
                                0.02
                            } else if in_burst {
                                1.0 - 1.0 / burst
                            } else {
                                0.02 / (burst * 0.98)
                            };
                            in_burst = draw() < p;
                            in_burst
                        })
                        .count() as u64
                })
                .collect()
        };
        let t0 = Instant::now();
        let floors = |counts: &[u64]| -> (Vec<LossFloor>, u32) {
            let mut c = RateController::new(cfg(RateMode::Fair), t0);
            let (mut floors, mut beyond) = (Vec::new(), 0);
            for &lost in counts {
                if let Some(floor) = c
                    .loss_floor()
                    .filter(|_| c.recent_loss.len() == FLOOR_ROUNDS)
                {
                    floors.push(floor);
                    beyond += u32::from(loss_beyond(Some(floor), lost, 150));
                }
                c.note_loss(lost, 150, false);
            }
            (floors, beyond)
        };
        let mean = |f: &[LossFloor], g: fn(&LossFloor) -> f64| -> f64 {
            f.iter().map(g).sum::<f64>() / f.len() as f64
        };
        let (bursty, bursty_beyond) = floors(&counts(2.0));
        let (independent, independent_beyond) = floors(&counts(1.0));
        let d_bursty = mean(&bursty, |f| f.dispersion);
        let d_independent = mean(&independent, |f| f.dispersion);
        let rate_bursty = mean(&bursty, |f| f.rate);
        eprintln!(
            "dispersion {d_bursty:.2} bursty, {d_independent:.2} independent; bursty floor \
             {rate_bursty:.4}; beyond it {bursty_beyond} and {independent_beyond} of 384"
        );
        assert!(
            (2.0..=MAX_LOSS_DISPERSION).contains(&d_bursty),
            "{d_bursty}"
        );
        assert!(d_independent < 1.6, "{d_independent}");
        // The floor's rate is near the path's 2%, erring high, not the quiet half's ~1.2%.
        assert!((0.016..0.03).contains(&rate_bursty), "{rate_bursty}");
        // A report beyond it now and then, not every tenth.
        assert!(bursty_beyond <= 8, "{bursty_beyond}");
        assert!(independent_beyond <= 8, "{independent_beyond}");
        // Congestion still shows: a round trip of four such reports that lost 10%.
        assert!(bursty.iter().all(|&f| loss_beyond(Some(f), 60, 600)));
    }

    /// A receiver short of CPU whose kernel drops datagrams in bursts: its gaps are its own,
    /// not the path's random loss, and the floor leaves them out (also when they show as gaps
    /// a report after the drops were counted).
    #[test]
    fn the_receiver_s_socket_drops_are_not_the_path_s_random_loss() {
        let t0 = Instant::now();
        let floor = |drops_first: bool| {
            let mut c = RateController::new(cfg(RateMode::Auto), t0);
            let mut t = t0;
            for i in 0..FLOOR_ROUNDS as u64 {
                t += Duration::from_millis(50);
                // Every other report: 100 datagrams dropped by the receiver's kernel, shown
                // as gaps in the same report, or (`drops_first`) in the next one.
                let dropped = if i % 2 == 0 { 100 } else { 0 };
                let (drops, lost) = match (drops_first, i % 2 == 0) {
                    (false, _) => (dropped, dropped + 1),
                    (true, true) => (100, 1),
                    (true, false) => (0, 101),
                };
                let f = Feedback {
                    interval: Duration::from_millis(50),
                    bytes: 1000 * 1400,
                    datagrams: 1000,
                    lost,
                    socket_drops: drops,
                    ..Feedback::default()
                };
                c.on_feedback(t, &f);
            }
            c.loss_floor().unwrap()
        };
        for drops_first in [false, true] {
            let f = floor(drops_first);
            // One datagram a report is the path's: about 0.1%, erring high.
            assert!(f.rate < 0.004, "{drops_first}: {f:?}");
            assert!(f.dispersion < 1.5, "{drops_first}: {f:?}");
        }
    }

    #[test]
    fn random_loss_in_small_rounds_is_not_congestion() {
        let t0 = Instant::now();
        let mut c = RateController::new(cfg(RateMode::Auto), t0);
        let mut t = t0;
        // About 1% of 200 datagrams per round, as a binomial count would scatter.
        for lost in [0, 3, 1, 4, 2, 0, 5, 2, 1, 3, 2, 4, 1, 0, 2, 3] {
            t += Duration::from_millis(200);
            let f = Feedback {
                interval: Duration::from_millis(50),
                bytes: 200 * 1400,
                datagrams: 200 - lost,
                lost,
                queue_delay: Duration::from_millis(1),
                ..Feedback::default()
            };
            c.on_feedback(t, &f);
        }
        assert!(
            c.timeline().iter().all(|ch| ch.reason != Reason::Loss),
            "{:?}",
            c.timeline()
        );
    }

    #[test]
    fn absurd_reports_do_not_panic() {
        let t0 = Instant::now();
        for mode in [RateMode::Auto, RateMode::Fair] {
            let mut c = RateController::new(cfg(mode), t0);
            let mut t = t0;
            for f in [
                Feedback {
                    train_rate: None,
                    interval: Duration::from_micros(u64::MAX),
                    bytes: u64::MAX,
                    datagrams: u64::MAX,
                    lost: u64::MAX,
                    socket_drops: 0,
                    queue_delay: Duration::from_micros(u64::MAX),
                    queue_fill: 0.0,
                    receiver_lag: Duration::ZERO,
                    disk_wait: Duration::ZERO,
                    disk_fill: 0.0,
                },
                Feedback {
                    interval: Duration::from_nanos(1),
                    bytes: u64::MAX,
                    datagrams: 1,
                    lost: 0,
                    queue_delay: Duration::MAX,
                    ..Feedback::default()
                },
                fb(100e6, 0.0, 1),
            ] {
                t += Duration::from_millis(200);
                c.on_feedback(t, &f);
                assert!((1_000_000..=10_000_000_000).contains(&c.rate_bps()));
            }
        }
    }

    proptest! {
        /// Any sequence of reports keeps the rate finite and within [min, ceiling].
        #[test]
        fn rate_stays_bounded(
            mode in prop_oneof![Just(RateMode::Auto), Just(RateMode::Fair), Just(RateMode::Fixed)],
            steps in proptest::collection::vec((0u64..400, any::<u64>(), any::<u32>(), any::<u32>(), any::<u16>(), 0u64..10_000, 0u16..=1000), 1..200),
        ) {
            let t0 = Instant::now();
            let config = cfg(mode);
            let (lo, hi) = (config.min_bps, config.ceiling_bps);
            let mut c = RateController::new(config, t0);
            let mut t = t0;
            for (dt, bytes, datagrams, lost, drops, delay, fill) in steps {
                t += Duration::from_millis(dt);
                let f = Feedback {
                    train_rate: None,
                    interval: Duration::from_millis(dt),
                    bytes,
                    datagrams: u64::from(datagrams),
                    lost: u64::from(lost),
                    socket_drops: u64::from(drops),
                    queue_delay: Duration::from_millis(delay),
                    queue_fill: f64::from(fill) / 1000.0,
                    receiver_lag: Duration::from_millis(dt / 8),
                    disk_wait: Duration::ZERO,
                    disk_fill: 0.0,
                };
                c.on_feedback(t, &f);
                let r = c.rate_bps();
                prop_assert!(r >= lo && r <= hi, "rate {r} outside [{lo}, {hi}]");
            }
        }
    }
}
