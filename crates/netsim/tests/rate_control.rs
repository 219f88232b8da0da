//! Rate control end to end: the sender's `RateController` fed by the receiver's reports, as in
//! the engine, over simulated paths (see `hurtle_netsim::pair`, "Rate control").
//!
//! Every case but the short paths' starts cold at 100 Mbit/s with a 10 Gbit/s ceiling on a
//! 40 ms RTT path, 4 channels, 1 MiB blocks, runs of 4 datagrams (bursts of 4 x 5.6 KB across
//! the channels) and the engine's timers (final marker every 2 RTT, NACK retry from
//! `RecvConfig::for_rtt`). The runner checks every run ends byte-exact; the cases check how the
//! rate behaves:
//!
//! - *settling*: the first moment after which the rate delivered to the receiver, over every
//!   sliding window of [`WINDOW`] reports (one report per RTT) up to the end of the steady part
//!   (when the first channel runs out of new data), stays within a band around the capacity;
//!   stated in RTTs.
//! - *resent share*: repair bytes over all payload bytes sent.
//!
//! The cases and their stated bounds: a 300 Mbit/s bottleneck with a 128 KiB drop-tail queue
//! settles within 15 RTTs to within 10% (delivery and rate) with under 2% resent; with 1%
//! random loss the steady goodput stays above 85% of it; a receiver that takes a quarter of the
//! link rate behind a 256 KiB socket buffer sets the rate within 15 RTTs to within 15%, its
//! buffer bounded, its drops reported as socket drops; a bottleneck halving at 1.5 s is followed
//! within 8 RTTs and its recovery at 3 s within 20; `fair` keeps a 2 MiB queue near its 5 ms
//! delay target; random paths never stall; and on short paths, started at the initial window as
//! the engine does, a loopback-like receiver (8 Gbit/s, 0.25 ms) is reached at least 40 ms
//! sooner than from 100 Mbit/s, while a LAN's 100 Mbit/s bottleneck behind a 64 KiB queue is
//! not flooded by it (under 3% resent).
//!
//! Delivered rates count whole datagrams (header included), as the bottleneck does; goodput
//! counts new file bytes. Run with `--nocapture` to see each case's numbers and rate timeline.

use hurtle_netsim::{LinkConfig, Outcome, Scenario};
use hurtle_proto::rate::model::CRUISE_FILL_GAIN;
use hurtle_proto::rate::{PathMemory, RateConfig, RateMode, Reason};
use hurtle_proto::{RecvConfig, SendConfig};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const MBIT: f64 = 1e6;
/// Round-trip time of every path here (20 ms each way).
const RTT: Duration = Duration::from_millis(40);
/// The bottleneck of most cases.
const BOTTLENECK: u64 = 300_000_000;
/// Reports per sliding window (one report per RTT).
const WINDOW: usize = 4;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rtts(d: Duration) -> f64 {
    d.as_secs_f64() / RTT.as_secs_f64()
}

/// A cold start in `mode` over `link` (its delay is set to half the RTT).
fn scenario(mode: RateMode, link: LinkConfig, mib: u64) -> Scenario {
    scenario_rtt(mode, link, mib, RTT)
}

/// [`scenario`] on a path of round-trip time `rtt`.
fn scenario_rtt(mode: RateMode, link: LinkConfig, mib: u64, rtt: Duration) -> Scenario {
    Scenario {
        files: vec![mib * MIB],
        block_size: MIB,
        channels: 4,
        run_datagrams: 4,
        // The engine's pacer catch-up.
        pacer_burst: Duration::from_micros(1500),
        link: link.with_delay(rtt / 2),
        rate: Some(RateConfig {
            mode,
            ceiling_bps: 10_000_000_000,
            start_bps: 100_000_000,
            min_bps: 1_000_000,
            rtt,
        }),
        send: SendConfig::for_rtt(rtt),
        recv: RecvConfig::for_rtt(rtt),
        max_virtual: Duration::from_secs(60),
        max_steps: 50_000_000,
        ..Scenario::default()
    }
}

/// Runs `sc` and prints its summary and rate timeline.
fn run(name: &str, sc: Scenario) -> Outcome {
    let wall = std::time::Instant::now();
    let out = sc.run().unwrap_or_else(|f| panic!("{name}: {f}"));
    let timeline: Vec<String> = out
        .rate_timeline
        .iter()
        .map(|p| {
            format!(
                "{:.0}:{:.0}{}",
                p.at.as_secs_f64() * 1e3,
                p.rate_bps as f64 / MBIT,
                &p.reason.as_str()[..2]
            )
        })
        .collect();
    eprintln!(
        "{name}: {:.3} s virtual, steady until {:.3} s, resent {:.2}%, wall {:.0} ms\n  {out}\n  \
         rate (ms:Mbit/s, first two letters of the reason: startup, drain, cruise, probe, loss, delay, socket-drops, backlog): {}",
        out.duration.as_secs_f64(),
        out.steady_until.as_secs_f64(),
        out.resent_share() * 100.0,
        wall.elapsed().as_secs_f64() * 1e3,
        timeline.join(" "),
    );
    assert_eq!(
        out.new_bytes, out.bytes,
        "{name}: every byte sent once as new"
    );
    assert!(out.rate_timeline.iter().all(|p| p.rate_bps >= 1_000_000));
    out
}

/// Delivered rate over each sliding window of [`WINDOW`] reports that ends by `until`:
/// (window start, window end, bits per second).
fn windows(out: &Outcome, until: Duration) -> Vec<(Duration, Duration, f64)> {
    let reports: Vec<_> = out.reports.iter().filter(|r| r.at <= until).collect();
    reports
        .windows(WINDOW)
        .map(|w| {
            let start = w[0].at - w[0].feedback.interval;
            let end = w[WINDOW - 1].at;
            let bytes: u64 = w.iter().map(|r| r.feedback.bytes).sum();
            (start, end, bytes as f64 * 8.0 / (end - start).as_secs_f64())
        })
        .collect()
}

/// The start of the first window from `from` on after which every window up to `until` delivers
/// within `[lo, hi]` bits per second; `None` if even the last one does not.
fn settled(out: &Outcome, from: Duration, until: Duration, lo: f64, hi: f64) -> Option<Duration> {
    let w: Vec<_> = windows(out, until)
        .into_iter()
        .filter(|&(start, _, _)| start >= from)
        .collect();
    let last_bad = w.iter().rposition(|&(_, _, bps)| bps < lo || bps > hi);
    match last_bad {
        None => w.first().map(|&(start, _, _)| start),
        Some(i) => w.get(i + 1).map(|&(start, _, _)| start),
    }
}

/// When the controller's rate entered `[lo, hi]` for good (up to `until`), looking from `from`.
fn rate_settled(out: &Outcome, from: Duration, until: Duration, lo: f64, hi: f64) -> Duration {
    let out_of_band = |bps: u64| (bps as f64) < lo || (bps as f64) > hi;
    out.rate_timeline
        .iter()
        .filter(|p| p.at > from && p.at <= until)
        .fold(
            if out_of_band(out.rate_at(from)) {
                None
            } else {
                Some(from)
            },
            |settled, p| match (settled, out_of_band(p.rate_bps)) {
                (_, true) => None,
                (None, false) => Some(p.at),
                (s, false) => s,
            },
        )
        .unwrap_or(until)
}

/// Both the delivery windows and the controller's rate within `[lo, hi]` for good, from `from`
/// to `until`: when that began.
fn settled_both(out: &Outcome, from: Duration, until: Duration, lo: f64, hi: f64) -> Duration {
    let delivered = settled(out, from, until, lo, hi).unwrap_or(until);
    delivered.max(rate_settled(out, from, until, lo, hi))
}

/// New file bytes per second received between `from` and `to` (at report granularity).
fn goodput(out: &Outcome, from: Duration, to: Duration) -> f64 {
    let first = out.reports.iter().find(|r| r.at >= from).expect("a report");
    let last = out.reports.iter().rfind(|r| r.at <= to).expect("a report");
    (last.received - first.received) as f64 * 8.0 / (last.at - first.at).as_secs_f64()
}

/// Mean and largest queueing delay the reports saw from `from` to `to`.
fn queue_delays(out: &Outcome, from: Duration, to: Duration) -> (Duration, Duration) {
    let d: Vec<Duration> = out
        .reports
        .iter()
        .filter(|r| r.at >= from && r.at <= to)
        .map(|r| r.feedback.queue_delay)
        .collect();
    let mean = d.iter().sum::<Duration>() / d.len().max(1) as u32;
    (mean, d.iter().copied().max().unwrap_or_default())
}

/// Rates the controller set from `from` to `to`, including the one in force at `from`.
fn rates(out: &Outcome, from: Duration, to: Duration) -> Vec<u64> {
    std::iter::once(out.rate_at(from))
        .chain(
            out.rate_timeline
                .iter()
                .filter(|p| p.at > from && p.at <= to)
                .map(|p| p.rate_bps),
        )
        .collect()
}

fn mbit(bps: f64) -> String {
    format!("{:.1} Mbit/s", bps / MBIT)
}

mod bottleneck {
    use super::*;

    /// Settles within this many RTTs of a cold start.
    const SETTLE_RTTS: f64 = 15.0;

    #[test]
    fn cold_start_settles_near_a_shallow_bottleneck() {
        let c = BOTTLENECK as f64;
        let out = run(
            "300 Mbit/s, 128 KiB drop-tail",
            scenario(
                RateMode::Auto,
                LinkConfig::default().with_rate(BOTTLENECK, 128 << 10),
                128,
            ),
        );
        let end = out.steady_until;
        // The rate's band is a hair wider below: a drain paces at 0.9 x the model's
        // bottleneck, which can be a fraction of a percent under the link's rate (a startup
        // that went to the trains' rate at once, without overshooting, never sampled above it).
        let rate_lo = 0.89 * c;
        let delivered_at = settled(&out, Duration::ZERO, end, 0.9 * c, 1.1 * c).unwrap_or(end);
        let at = delivered_at.max(rate_settled(&out, Duration::ZERO, end, rate_lo, 1.1 * c));
        let steady = windows(&out, end);
        let worst = steady
            .iter()
            .filter(|w| w.0 >= at)
            .map(|w| w.2)
            .fold(f64::INFINITY, f64::min);
        let r = rates(&out, at, end);
        let (lo, hi) = (r.iter().min().unwrap(), r.iter().max().unwrap());
        eprintln!(
            "  settled after {:.1} RTTs; after that: worst {}-RTT window {} ({:.1}%), rates {}..{}",
            rtts(at),
            WINDOW,
            mbit(worst),
            worst / c * 100.0,
            mbit(*lo as f64),
            mbit(*hi as f64),
        );
        assert!(
            rtts(at) <= SETTLE_RTTS,
            "settled after {:.1} RTTs",
            rtts(at)
        );
        assert!(
            (*lo as f64) >= rate_lo && (*hi as f64) <= 1.1 * c,
            "rate left the 10% band after settling: {}..{}",
            mbit(*lo as f64),
            mbit(*hi as f64),
        );
        assert!(
            out.resent_share() < 0.02,
            "resent {:.2}%",
            out.resent_share() * 100.0
        );
    }

    #[test]
    fn random_loss_keeps_goodput_above_85_percent() {
        let c = BOTTLENECK as f64;
        let out = run(
            "300 Mbit/s, 128 KiB drop-tail, 1% random loss",
            scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(BOTTLENECK, 128 << 10)
                    .with_loss(0.01),
                128,
            ),
        );
        // The steady part: from the first settled window (within 15%) to the end of new data.
        let end = out.steady_until;
        let from = settled(&out, Duration::ZERO, end, 0.85 * c, 1.1 * c)
            .unwrap_or_else(|| panic!("never within 15% of the bottleneck\n{out}"));
        let steady = goodput(&out, from, end);
        let whole = out.goodput_bps();
        let losses = out
            .rate_timeline
            .iter()
            .filter(|p| p.reason == Reason::Loss)
            .count();
        eprintln!(
            "  steady from {:.1} RTTs: goodput {} ({:.1}%); whole run {} ({:.1}%); {} loss cuts",
            rtts(from),
            mbit(steady),
            steady / c * 100.0,
            mbit(whole),
            whole / c * 100.0,
            losses,
        );
        assert!(steady > 0.85 * c, "steady goodput {}", mbit(steady));
        assert!(whole > 0.80 * c, "whole-run goodput {}", mbit(whole));
    }
}

mod receiver {
    use super::*;

    #[test]
    fn a_slow_receiver_sets_the_rate_and_its_buffer_stays_bounded() {
        let link = BOTTLENECK;
        let absorb = link / 4;
        let buffer = 256 << 10;
        let c = absorb as f64;
        let out = run(
            "300 Mbit/s link, receiver takes 75 Mbit/s behind a 256 KiB socket buffer",
            Scenario {
                receiver_rate_bps: Some(absorb),
                receiver_queue_bytes: buffer,
                ..scenario(
                    RateMode::Auto,
                    LinkConfig::default().with_rate(link, 128 << 10),
                    48,
                )
            },
        );
        let end = out.steady_until;
        let at = settled_both(&out, Duration::ZERO, end, 0.85 * c, 1.15 * c);
        let r = rates(&out, at, end);
        let (lo, hi) = (*r.iter().min().unwrap(), *r.iter().max().unwrap());
        let reported: u64 = out.reports.iter().map(|r| r.feedback.socket_drops).sum();
        eprintln!(
            "  settled after {:.1} RTTs; rates after that {}..{}; buffer max {} of {} bytes; \
             {} socket drops ({} reported)",
            rtts(at),
            mbit(lo as f64),
            mbit(hi as f64),
            out.receiver_queue_max,
            buffer,
            out.socket_drops,
            reported,
        );
        assert!(rtts(at) <= 15.0, "settled after {:.1} RTTs", rtts(at));
        assert!(
            lo as f64 >= 0.85 * c && hi as f64 <= 1.15 * c,
            "rate left the 15% band after settling: {}..{}",
            mbit(lo as f64),
            mbit(hi as f64),
        );
        assert!(out.receiver_queue_max <= buffer);
        assert!(
            out.receiver_queue_max > 0,
            "the receiver was never the bottleneck"
        );
        // The drops are reported as socket drops (the sender reacted to them), not lost silently.
        assert!(
            out.socket_drops > 0 && reported == out.socket_drops,
            "{out}"
        );
        // Nor are they taken for the path going out.
        assert_eq!(out.outages.count, 0, "{:?}", out.outages);
        // The sender reacted to the receiver: to its filling socket buffer, or to its drops.
        assert!(out
            .rate_timeline
            .iter()
            .any(|p| matches!(p.reason, Reason::Backlog | Reason::SocketDrops)));
        assert!(
            out.resent_share() < 0.02,
            "resent {:.2}%",
            out.resent_share() * 100.0
        );
    }
}

mod path_change {
    use super::*;

    /// The rate is within 10% of the halved bottleneck this many RTTs after it halves.
    const DOWN_RTTS: f64 = 8.0;
    /// Delivery is back within 10% of the full bottleneck this many RTTs after it recovers.
    const UP_RTTS: f64 = 20.0;

    #[test]
    fn the_rate_follows_the_bottleneck_down_and_back_up() {
        let (full, half) = (BOTTLENECK, BOTTLENECK / 2);
        let (down, up) = (ms(1500), ms(3000));
        let out = run(
            "300 -> 150 Mbit/s at 1.5 s -> 300 at 3 s, 128 KiB drop-tail",
            Scenario {
                rate_changes: vec![(down, half), (up, full)],
                ..scenario(
                    RateMode::Auto,
                    LinkConfig::default().with_rate(full, 128 << 10),
                    128,
                )
            },
        );
        assert!(
            out.steady_until > up + ms(1000),
            "too short to see the way back up"
        );
        let h = half as f64;
        // Down: the first rate within 10% of the new bottleneck, then it stays near it.
        let followed = out
            .rate_timeline
            .iter()
            .find(|p| p.at >= down && (p.rate_bps as f64) <= 1.1 * h)
            .map(|p| p.at - down)
            .expect("the rate never came down");
        let low = settled(&out, down, up, 0.85 * h, 1.1 * h)
            .unwrap_or_else(|| panic!("never settled at the halved bottleneck\n{out}"));
        let r = rates(&out, down + followed, up);
        let (lo, hi) = (*r.iter().min().unwrap(), *r.iter().max().unwrap());
        // Up: the first window from the recovery on that delivers within 10% of it.
        let f = full as f64;
        let back = windows(&out, out.steady_until)
            .into_iter()
            .find(|w| w.0 >= up && w.2 >= 0.9 * f)
            .map(|w| w.1 - up)
            .expect("delivery never came back up");
        eprintln!(
            "  down: rate within 10% after {:.1} RTTs, delivery settled (15%) {:.1} RTTs after \
             the change, rates until the recovery {}..{}; up: a {}-RTT window within 10% of \
             300 Mbit/s ends {:.1} RTTs after it",
            rtts(followed),
            rtts(low - down),
            mbit(lo as f64),
            mbit(hi as f64),
            WINDOW,
            rtts(back),
        );
        assert!(
            rtts(followed) <= DOWN_RTTS,
            "down after {:.1} RTTs",
            rtts(followed)
        );
        assert!(
            lo as f64 >= 0.5 * h,
            "the rate collapsed to {} at the halved bottleneck",
            mbit(lo as f64)
        );
        assert!(
            rtts(back) <= UP_RTTS,
            "back up after {:.1} RTTs",
            rtts(back)
        );
        assert!(
            out.resent_share() < 0.03,
            "resent {:.2}%",
            out.resent_share() * 100.0
        );
    }

    /// Delivery is back within 10% of the bottleneck this many RTTs after a trickle ends (the
    /// first half second of it is the trickle's queue, 128 KiB at 2 Mbit/s, reported).
    const TRICKLE_UP_RTTS: f64 = 80.0;

    #[test]
    fn a_path_down_to_a_trickle_is_filled_again_once_it_recovers() {
        // What a competitor that keeps the queue full (TCP bbr) does to `auto`: the rate
        // follows it down to where a report holds a datagram or two. Such reports must be
        // pooled into samples: where none is a sample, the rate stays there for good after the
        // path is free again.
        let (trickle, up) = (ms(1000), ms(3000));
        let out = run(
            "300 -> 2 Mbit/s at 1 s -> 300 at 3 s, 128 KiB drop-tail",
            Scenario {
                rate_changes: vec![(trickle, 2_000_000), (up, BOTTLENECK)],
                ..scenario(
                    RateMode::Auto,
                    LinkConfig::default().with_rate(BOTTLENECK, 128 << 10),
                    160,
                )
            },
        );
        assert!(
            out.steady_until > up + ms(1000),
            "too short to see the way back up"
        );
        let low = *rates(&out, trickle, up).iter().min().unwrap();
        assert!(low <= 4_000_000, "only down to {}", mbit(low as f64));
        let f = BOTTLENECK as f64;
        let back = windows(&out, out.steady_until)
            .into_iter()
            .find(|w| w.0 >= up && w.2 >= 0.9 * f)
            .map(|w| w.1 - up)
            .unwrap_or_else(|| panic!("delivery never came back up\n{out}"));
        eprintln!(
            "  down to {}; up: a {}-RTT window within 10% of 300 Mbit/s ends {:.1} RTTs after \
             the trickle",
            mbit(low as f64),
            WINDOW,
            rtts(back),
        );
        assert!(
            rtts(back) <= TRICKLE_UP_RTTS,
            "back up after {:.1} RTTs",
            rtts(back)
        );
    }
}

mod fair {
    use super::*;

    /// Both modes keep a deep queue short after startup: `fair` near its 5 ms target, `auto`
    /// well under its 40 ms one (it catches its own surplus as saturation before the queue gets
    /// long, so it does not fill it towards 40 ms either; what `auto` tolerates that `fair` does
    /// not is queueing delay it did not cause, which this runner cannot produce).
    #[test]
    fn fair_mode_keeps_a_deep_queue_near_its_delay_target() {
        let c = 100_000_000f64;
        let link = || LinkConfig::default().with_rate(100_000_000, 2 << 20);
        let mut seen = Vec::new();
        for mode in [RateMode::Fair, RateMode::Auto] {
            let out = run(
                &format!("{mode:?}: 100 Mbit/s, 2 MiB drop-tail (168 ms)"),
                scenario(mode, link(), 32),
            );
            // After startup: from the first probe (the controller saw the queue drained).
            let from = out
                .rate_timeline
                .iter()
                .find(|p| p.reason == Reason::Probe)
                .map_or(Duration::ZERO, |p| p.at);
            let end = out.steady_until;
            let (mean, max) = queue_delays(&out, from, end);
            let util = goodput(&out, from, end) / c;
            let rtt = scenario(mode, link(), 1).rate.unwrap().rtt;
            // `fair` keeps the queue near its delay target by backing off for delay; `auto`'s
            // model paces at the bottleneck and keeps it under its own, lower queue target.
            let target = match mode {
                RateMode::Auto => hurtle_proto::rate::model::queue_target(rtt),
                _ => scenario(mode, link(), 1).rate.unwrap().delay_target(),
            };
            eprintln!(
                "  {mode:?}: queueing delay after startup mean {:.1} ms, max {:.1} ms (target \
                 {:.0} ms); goodput {:.1}% of the link; resent {:.2}%",
                mean.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3,
                target.as_secs_f64() * 1e3,
                util * 100.0,
                out.resent_share() * 100.0,
            );
            let delay_cuts = out
                .rate_timeline
                .iter()
                .filter(|p| p.at >= from && p.reason == Reason::Delay)
                .count();
            if mode == RateMode::Fair {
                assert!(delay_cuts > 0, "{mode:?} never backed off for delay");
            }
            seen.push((mode, mean, max, target, util));
        }
        for (mode, mean, max, target, util) in seen {
            assert!(
                mean <= target,
                "{mode:?}: mean queueing delay {mean:?} above {target:?}"
            );
            // The largest delay is a probe's overshoot before its queue showed (`fair` climbs
            // until it sees one), and how far it goes depends on where the probe ladder meets
            // the capacity, which moves with as little as the datagrams per block: over payloads
            // of 1340 to 1440 bytes (every second one), `fair`'s largest delay here ranged from
            // 6 to 15 ms with the 28-byte header (from 8 to 51 ms with the 40-byte one), under
            // twice its target in about a third of them either way.
            let spike = if mode == RateMode::Fair { 3 } else { 2 };
            assert!(
                max <= spike * target,
                "{mode:?}: queueing delay up to {max:?}"
            );
            assert!(
                util > 0.85,
                "{mode:?}: goodput {:.1}% of the link",
                util * 100.0
            );
        }
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn same_seed_same_rate_timeline() {
        let sc = Scenario {
            seed: 7,
            receiver_rate_bps: Some(150_000_000),
            receiver_queue_bytes: 256 << 10,
            rate_changes: vec![(ms(300), 100_000_000)],
            ..scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(BOTTLENECK, 128 << 10)
                    .with_loss(0.01)
                    .with_jitter(ms(1)),
                8,
            )
        };
        let (a, b) = (sc.run().unwrap(), sc.run().unwrap());
        assert_eq!(a.rate_timeline, b.rate_timeline);
        assert_eq!(a.reports, b.reports);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(a.rate_timeline.len() > 3, "{a}");
    }

    proptest! {
        // A fixed seed: the same cases every run, like the rest of this file.
        #![proptest_config(ProptestConfig {
            cases: 8,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6875_7274),
            ..ProptestConfig::default()
        })]

        /// Random bottlenecks, losses, RTTs, jitter, slow receivers and modes: the run ends
        /// byte-exact (the runner checks) without stalling, and the rate stays a positive number
        /// within its bounds.
        #[test]
        fn random_paths_never_stall(
            seed in any::<u64>(),
            fair in any::<bool>(),
            bottleneck_mbit in 20u64..1000,
            queue_kib in 64usize..2048,
            loss in 0.0..0.03f64,
            rtt_ms in 4u64..200,
            jitter_us in 0u64..3000,
            receiver_mbit in proptest::option::of(10u64..500),
            mib in 2u64..8,
        ) {
            let rtt = ms(rtt_ms);
            let bottleneck = bottleneck_mbit * 1_000_000;
            let mut sc = scenario(
                if fair { RateMode::Fair } else { RateMode::Auto },
                LinkConfig::default()
                    .with_rate(bottleneck, queue_kib << 10)
                    .with_loss(loss)
                    .with_jitter(Duration::from_micros(jitter_us)),
                mib,
            );
            sc.receiver_rate_bps = receiver_mbit.map(|m| m * 1_000_000);
            sc.receiver_queue_bytes = 1 << 20;
            sc.seed = seed;
            // At least two blocks per channel: every channel paces at a quarter of the rate,
            // so a channel without data would leave its share unused.
            sc.block_size = 256 << 10;
            sc.link.delay = rtt / 2;
            sc.recv = RecvConfig::for_rtt(rtt);
            sc.send = SendConfig::for_rtt(rtt);
            let cfg = sc.rate.as_mut().unwrap();
            cfg.rtt = rtt;
            let (min, max) = (cfg.min_bps, cfg.ceiling_bps);
            let out = sc.run().map_err(|f| TestCaseError::fail(f.to_string()))?;
            for p in &out.rate_timeline {
                prop_assert!(p.rate_bps >= min && p.rate_bps <= max, "rate {} at {:?}", p.rate_bps, p.at);
            }
            // No stall: within four times the time at the bottleneck rate, plus 50 RTTs for
            // startup and the tail.
            let capacity = bottleneck.min(sc.receiver_rate_bps.unwrap_or(u64::MAX));
            let ideal = Duration::from_secs_f64(out.bytes as f64 * 8.0 / capacity as f64);
            let bound = ideal * 4 + rtt * 50;
            prop_assert!(out.duration <= bound, "took {:?}, bound {:?}\n{}", out.duration, bound, out);
        }
    }
}

/// Short paths, where the first rate is TCP's initial window per round trip
/// ([`hurtle_proto::rate::initial_rate`]) rather than the 100 Mbit/s floor, as in the engine.
mod short_path {
    use super::*;
    use hurtle_proto::rate::initial_rate;

    /// A cold start over a path of `rtt` with `payload`-byte datagrams, 1 channel, starting at
    /// `start_bps`.
    fn short(rtt: Duration, payload: u16, start_bps: u64, link: LinkConfig, mib: u64) -> Scenario {
        let base = scenario(RateMode::Auto, link, mib);
        Scenario {
            channels: 1,
            payload,
            link: base.link.with_delay(rtt / 2),
            rate: Some(RateConfig {
                start_bps,
                rtt,
                ..base.rate.unwrap()
            }),
            send: SendConfig::for_rtt(rtt),
            recv: RecvConfig::for_rtt(rtt),
            ..base
        }
    }

    /// When the delivered rate first reached `share` of `c` (a report's interval).
    fn reached(out: &Outcome, c: f64, share: f64) -> Duration {
        out.reports
            .iter()
            .find(|r| {
                r.feedback.bytes as f64 * 8.0 / r.feedback.interval.as_secs_f64() >= share * c
            })
            .unwrap_or_else(|| panic!("never delivered {share} of the capacity\n{out}"))
            .at
    }

    #[test]
    fn loopback_like_receiver_is_reached_rounds_sooner_from_the_initial_window() {
        // A receiver that takes 8 Gbit/s behind a 4 MiB socket buffer, 0.25 ms away, 8900-byte
        // payloads: the initial window is 2.8 Gbit/s.
        let (rtt, payload, absorb) = (Duration::from_micros(250), 8900, 8_000_000_000u64);
        let c = absorb as f64;
        let start = initial_rate(100_000_000, payload, rtt);
        assert_eq!(start, 2_848_000_000);
        let sc = |start_bps| Scenario {
            receiver_rate_bps: Some(absorb),
            ..short(rtt, payload, start_bps, LinkConfig::default(), 256)
        };
        let window = run(
            "0.25 ms, receiver takes 8 Gbit/s, initial window",
            sc(start),
        );
        let floor = run(
            "0.25 ms, receiver takes 8 Gbit/s, 100 Mbit/s",
            sc(100_000_000),
        );
        let (w, f) = (reached(&window, c, 0.9), reached(&floor, c, 0.9));
        eprintln!(
            "  90% of the receiver after {:.0} ms (initial window) vs {:.0} ms (100 Mbit/s); \
             whole transfer {:.0} vs {:.0} ms; resent {:.2}% vs {:.2}%",
            w.as_secs_f64() * 1e3,
            f.as_secs_f64() * 1e3,
            window.duration.as_secs_f64() * 1e3,
            floor.duration.as_secs_f64() * 1e3,
            window.resent_share() * 100.0,
            floor.resent_share() * 100.0,
        );
        // Three report intervals saved at least: five doublings, fewer than five intervals
        // because the pacer applies each raised rate at once (the start from 100 Mbit/s
        // reaches 90% in about 60 ms).
        assert!(w + ms(30) <= f, "{w:?} vs {f:?}");
        assert!(window.duration < floor.duration);
        assert!(window.resent_share() < 0.02, "{window}");
    }

    #[test]
    fn a_lan_with_a_slow_shallow_bottleneck_is_not_flooded_by_the_initial_window() {
        // 0.5 ms, 1384-byte payloads: the initial window is 221 Mbit/s, over a 100 Mbit/s
        // bottleneck with a 64 KiB drop-tail queue.
        let (rtt, payload, c) = (Duration::from_micros(500), 1384, 100_000_000u64);
        let start = initial_rate(100_000_000, payload, rtt);
        assert_eq!(start, 221_440_000);
        let out = run(
            "0.5 ms, 100 Mbit/s, 64 KiB drop-tail, initial window",
            short(
                rtt,
                payload,
                start,
                LinkConfig::default().with_rate(c, 64 << 10),
                32,
            ),
        );
        let end = out.steady_until;
        let c = c as f64;
        let at = settled(&out, Duration::ZERO, end, 0.85 * c, 1.1 * c)
            .unwrap_or_else(|| panic!("never settled\n{out}"));
        eprintln!(
            "  settled after {:.0} ms; goodput {}; resent {:.2}%",
            at.as_secs_f64() * 1e3,
            mbit(out.goodput_bps()),
            out.resent_share() * 100.0
        );
        assert!(at <= ms(200), "settled after {at:?}");
        assert!(out.resent_share() < 0.03, "{out}");
    }

    #[test]
    fn a_short_paths_stretched_reports_still_follow_its_bottleneck_down_and_back_up() {
        // (At the 10 ms cadence: back to 90% in 263 ms, resent 1.24%.)
        stretched_reports_follow_the_bottleneck(1384, ms(500), 0.03);
    }

    /// The same in 8900-byte datagrams (a 9000-byte MTU, loopback): their reports stretch by
    /// their bytes as far ([`hurtle_proto::rate::REPORT_DATAGRAM_BYTES`]; counted by datagrams,
    /// 14 a report, they stayed 10 ms apart). Back to 90% in 619 ms (160 at the 10 ms
    /// cadence). The queue holds 29 of these datagrams: 7.98% were resent, 7.80% at the 10 ms
    /// cadence. Most of that is the start, not the reports: 350 of the 487 datagrams dropped
    /// were reported in the first 100 ms, since the initial window of 8900-byte datagrams at
    /// 0.5 ms (ten a round trip, as Linux's TCP sends with a 9000-byte MTU) is 1.4 Gbit/s, 14
    /// times this bottleneck, until the first report 20 ms later (1384-byte datagrams: 36 of
    /// 511); after it, 137 (1.2 MB, against 475 of 1384 bytes, 0.66 MB). Once per transfer,
    /// about 3 MB: 0.3% of a GiB.
    #[test]
    fn a_short_paths_reports_of_large_datagrams_stretch_and_follow_its_bottleneck() {
        stretched_reports_follow_the_bottleneck(8900, ms(750), 0.09);
    }

    /// [`a_short_paths_stretched_reports_still_follow_its_bottleneck_down_and_back_up`] in
    /// datagrams of `payload` bytes: the rate back to 90% within `back_within` of the
    /// bottleneck's recovery, and less than `resent_below` of the datagrams resent.
    fn stretched_reports_follow_the_bottleneck(
        payload: u16,
        back_within: Duration,
        resent_below: f64,
    ) {
        // 0.5 ms, 100 Mbit/s with a 256 KiB drop-tail queue: the receiver's reports stretch
        // to about 60 ms ([`hurtle_proto::rate::SHORT_REPORT_STRETCH_MAX`]), 120 round trips.
        // The bottleneck halves at 1.5 s and is back at 2.5 s.
        let (rtt, c) = (Duration::from_micros(500), 100_000_000u64);
        let (down, up) = (ms(1500), ms(2500));
        let out = run(
            "0.5 ms, 100 -> 50 Mbit/s at 1.5 s -> 100 at 2.5 s, 256 KiB drop-tail",
            Scenario {
                rate_changes: vec![(down, c / 2), (up, c)],
                ..short(
                    rtt,
                    payload,
                    initial_rate(100_000_000, payload, rtt),
                    LinkConfig::default().with_rate(c, 256 << 10),
                    48,
                )
            },
        );
        assert!(out.steady_until > up + ms(700), "too short\n{out}");
        let c = c as f64;
        let spacing = |from: Duration, to: Duration| {
            let n = out
                .reports
                .iter()
                .filter(|r| r.at >= from && r.at < to)
                .count();
            (to - from) / n.max(1) as u32
        };
        let steady = spacing(ms(700), down);
        let before = goodput(&out, ms(700), down);
        let halved = goodput(&out, down + ms(300), up);
        let back = windows(&out, out.steady_until)
            .into_iter()
            .find(|w| w.0 >= up && w.2 >= 0.9 * c)
            .map(|w| w.1 - up)
            .expect("delivery never came back up");
        let (mean, max) = queue_delays(&out, ms(700), out.steady_until);
        eprintln!(
            "  reports every {:.1} ms before the dip; goodput {} before, {} halved; back to \
             90% {:.0} ms after; queue mean {:.1} ms, max {:.1} ms; resent {:.2}%",
            steady.as_secs_f64() * 1e3,
            mbit(before),
            mbit(halved),
            back.as_secs_f64() * 1e3,
            mean.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            out.resent_share() * 100.0
        );
        assert!(steady >= ms(40), "reports every {steady:?}");
        assert!(before >= 0.9 * c, "{}", mbit(before));
        assert!(halved >= 0.85 * c / 2.0, "{}", mbit(halved));
        assert!(back <= back_within, "back after {back:?}");
        assert!(out.resent_share() < resent_below, "{out}");
    }
}

/// The long fat pipe (the WAN-fill issue): each behaviour of `auto`'s model, with numbers.
mod wan {
    use super::*;

    /// First time a report delivered at least `share` of `bps`, from `from`.
    fn first_delivering(out: &Outcome, from: Duration, share: f64, bps: f64) -> Option<Duration> {
        out.reports
            .iter()
            .filter(|r| r.at >= from)
            .find(|r| {
                r.feedback.bytes as f64 * 8.0 / r.feedback.interval.as_secs_f64() >= share * bps
            })
            .map(|r| r.at)
    }

    /// Rate changes for a congestion reason, from `from` to `to`.
    fn corrections(out: &Outcome, from: Duration, to: Duration) -> Vec<Reason> {
        out.rate_timeline
            .iter()
            .filter(|p| p.at >= from && p.at < to)
            .map(|p| p.reason)
            .filter(|r| {
                matches!(
                    r,
                    Reason::Loss | Reason::Delay | Reason::SocketDrops | Reason::Backlog
                )
            })
            .collect()
    }

    /// 256 MiB over intercontinental (500 Mbit/s, 1% loss, a 4 MiB queue) of round trip
    /// `rtt`, cold, `auto`.
    fn intercontinental_256(rtt: Duration) -> Scenario {
        scenario_rtt(
            RateMode::Auto,
            LinkConfig::default()
                .with_rate(500_000_000, 4 << 20)
                .with_loss(0.01),
            256,
            rtt,
        )
    }

    /// When startup ended (the first change that is not a startup step).
    fn startup_end(out: &Outcome) -> Duration {
        out.rate_timeline
            .iter()
            .find(|p| !matches!(p.reason, Reason::Start | Reason::Startup))
            .map_or(Duration::ZERO, |p| p.at)
    }

    /// The highest rate startup paced at, bits per second.
    fn startup_top(out: &Outcome) -> f64 {
        out.rate_timeline
            .iter()
            .filter(|p| p.at < startup_end(out))
            .map(|p| p.rate_bps)
            .max()
            .unwrap_or(0) as f64
    }

    /// The reports' train estimates before `until`, bits per second.
    fn train_estimates(out: &Outcome, until: Duration) -> Vec<f64> {
        out.reports
            .iter()
            .filter(|r| r.at < until)
            .filter_map(|r| r.feedback.train_rate)
            .collect()
    }

    #[test]
    fn a_cold_start_reaches_90_percent_of_the_bottleneck_in_a_few_round_trips() {
        let rtt = ms(100);
        let c = 500e6;
        let mut sc = scenario_rtt(
            RateMode::Auto,
            LinkConfig::default().with_rate(500_000_000, 4 << 20),
            256,
            rtt,
        );
        // From 10 Mbit/s: five and a half doublings to 90%.
        sc.rate.as_mut().unwrap().start_bps = 10_000_000;
        let out = run("500 Mbit/s, 100 ms, 4 MiB queue, from 10 Mbit/s", sc);
        let at = first_delivering(&out, Duration::ZERO, 0.9, c).expect("never at 90%");
        let after_startup = startup_end(&out);
        eprintln!(
            "  90% delivered after {:.1} RTTs; startup ended after {:.1} RTTs; resent {:.2}%",
            at.as_secs_f64() / rtt.as_secs_f64(),
            after_startup.as_secs_f64() / rtt.as_secs_f64(),
            out.resent_share() * 100.0
        );
        assert!(at <= rtt * 10, "90% after {at:?}");
        assert!(
            out.resent_share() < 0.01,
            "resent {:.2}%",
            out.resent_share() * 100.0
        );
    }

    /// Intercontinental (500 Mbit/s, 150 ms, 1% loss, a 4 MiB queue), 256 MiB: a cold start
    /// against one that resumes from an earlier transfer's bottleneck on the same path, and one
    /// whose memory is of a path twice as fast as it is now. (A cold start goes to the rate its
    /// trains measure once three reports agree, a round trip and three report intervals in;
    /// a resumed one starts at half the path and is there with the first report.)
    #[test]
    fn a_resumed_start_fills_the_path_sooner_without_startup_s_overshoot() {
        let rtt = ms(150);
        let c = 500e6;
        let sc = || intercontinental_256(rtt);
        let memory = |bps| {
            Some((
                PathMemory {
                    bottleneck_bps: bps,
                    rtt,
                },
                Duration::from_secs(600),
            ))
        };
        let cold = run("cold start", sc());
        let warm = run(
            "resumed from 495 Mbit/s",
            Scenario {
                resume: memory(495_000_000),
                ..sc()
            },
        );
        let stale = run(
            "resumed from 1 Gbit/s (the path is half as fast now)",
            Scenario {
                resume: memory(1_000_000_000),
                ..sc()
            },
        );
        let at = |out: &Outcome| first_delivering(out, Duration::ZERO, 0.9 * 0.99, c).unwrap();
        // The highest rate of the first 4 round trips (probing, 8% above, comes later).
        let top = |out: &Outcome| {
            out.rate_timeline
                .iter()
                .filter(|p| p.at < rtt * 4)
                .map(|p| p.rate_bps)
                .max()
                .unwrap()
        };
        for (name, out) in [("cold", &cold), ("resumed", &warm), ("stale", &stale)] {
            eprintln!(
                "  {name}: 90% delivered after {:.2} RTTs, highest rate in 4 RTTs {} Mbit/s, \
                 resent {:.2}%, \
                 done in {:.3} s",
                at(out).as_secs_f64() / rtt.as_secs_f64(),
                top(out) / 1_000_000,
                out.resent_share() * 100.0,
                out.duration.as_secs_f64()
            );
        }
        // At 90% a report interval sooner at least, never above the path's rate (but for the
        // 3% with which cruising builds its reserve of queue), with no more resent than the
        // path's loss and its noise.
        assert!(
            at(&warm) + rtt / 4 <= at(&cold),
            "{:?} {:?}",
            at(&warm),
            at(&cold)
        );
        assert!(at(&warm) <= rtt * 3, "{:?}", at(&warm));
        assert!(
            top(&warm) as f64 <= 500e6 * CRUISE_FILL_GAIN,
            "{}",
            top(&warm)
        );
        assert!(warm.resent_share() < 0.0125, "{}", warm.resent_share());
        // (A cold start whose trains agree does not overshoot either: both resend what the
        // path loses, within its noise.)
        assert!(warm.resent_share() <= cold.resent_share() + 0.0005);
        assert!(warm.steady_until < cold.steady_until);
        // A memory of a faster path costs no more than a cold start's overshoot.
        assert!(at(&stale) <= at(&cold), "{:?} {:?}", at(&stale), at(&cold));
        // (Its first round trip at 1 Gbit/s drops about 470 datagrams, 0.24% of them, at the
        // 4 MiB queue.)
        assert!(stale.resent_share() <= cold.resent_share() + 0.003);
    }

    /// Intercontinental again, cold, 256 MiB: startup with the receiver's estimates of the
    /// bottleneck from the spacing of back-to-back datagrams
    /// (`hurtle_proto::rate::dispersion`) against startup without them
    /// (`Scenario::train_estimates`). The estimates come with the first reports, at the path's
    /// rate; once three agree, startup goes to it at once and no further, where without them
    /// it doubles towards the path, passes it twofold for the round trip and more its
    /// congestion signals lag, and the 4 MiB queue drops thousands of datagrams.
    #[test]
    fn train_estimates_keep_startup_s_overshoot_within_the_queue() {
        let rtt = ms(150);
        let c = 500e6;
        let sc = |train_estimates| Scenario {
            train_estimates,
            ..intercontinental_256(rtt)
        };
        let with = run("with train estimates", sc(true));
        let without = run("without train estimates", sc(false));
        let estimates = train_estimates(&with, rtt * 3);
        let mut sorted = estimates.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        let at = |out: &Outcome| first_delivering(out, Duration::ZERO, 0.9 * 0.99, c).unwrap();
        let paced_at = |out: &Outcome| {
            out.rate_timeline
                .iter()
                .find(|p| p.rate_bps as f64 >= 0.9 * c)
                .map_or(Duration::MAX, |p| p.at)
        };
        let top = startup_top;
        for (name, out) in [("with", &with), ("without", &without)] {
            eprintln!(
                "  {name}: paced at 90% after {:.2} RTTs, startup ended after {:.2} RTTs at most \
                 {}, 90% delivered after {:.2} RTTs, {} dropped by the queue, resent {:.2}%, new \
                 data sent by {:.3} s, done in {:.3} s",
                paced_at(out).as_secs_f64() / rtt.as_secs_f64(),
                startup_end(out).as_secs_f64() / rtt.as_secs_f64(),
                mbit(top(out)),
                at(out).as_secs_f64() / rtt.as_secs_f64(),
                out.link.dropped_queue,
                out.resent_share() * 100.0,
                out.steady_until.as_secs_f64(),
                out.duration.as_secs_f64()
            );
        }
        eprintln!(
            "  {} estimates in the first 3 RTTs, median {}",
            estimates.len(),
            mbit(median)
        );
        // The estimates: from the first round trip's reports on, near the path's rate.
        assert!(estimates.len() >= 4, "{estimates:?}");
        assert!((median / c - 1.0).abs() < 0.1, "{estimates:?}");
        // Startup stays at the path's rate, against about twice it without, and the queue
        // drops nothing.
        assert!(top(&with) <= 1.05 * c, "{}", top(&with));
        assert!(top(&without) >= 1.8 * c, "{}", top(&without));
        assert_eq!(with.link.dropped_queue, 0);
        assert!(without.link.dropped_queue > 1000);
        // Paced at the path from the third report with estimates (a round trip and three
        // report intervals), where doubling takes two and a half round trips; delivering 90%
        // no later, resent within a quarter point of the path's 1%, and done sooner, by half a
        // round trip at least. (When all new data was sent is no measure here: startup sends
        // long trains (`RateController::train_bytes`) and takes lumpy reports for what they
        // are, so the overshoot without estimates, which queues 4 MiB of new data early and
        // drops 6,400 datagrams to resend later, sends its new data sooner and ends later.)
        assert!(paced_at(&with) <= rtt * 2, "{:?}", paced_at(&with));
        assert!(paced_at(&without) >= rtt * 2, "{:?}", paced_at(&without));
        assert!(
            at(&with) <= at(&without),
            "{:?} {:?}",
            at(&with),
            at(&without)
        );
        assert!(
            with.resent_share() < without.resent_share() && with.resent_share() < 0.0125,
            "{} {}",
            with.resent_share(),
            without.resent_share()
        );
        assert!(
            with.duration + rtt / 2 <= without.duration,
            "{:?} {:?}",
            with.duration,
            without.duration
        );
    }

    /// Intercontinental, cold, 256 MiB, to a receiver behind GRO (`Scenario::receiver_lumps`:
    /// buffers every 100 us, as linkem's GSO writes and NICs that coalesce hand them over).
    /// Startup's long trains (`RateController::train_bytes`: 64 KiB, two milliseconds at the
    /// bottleneck) span enough buffers to be timed buffer to buffer, and startup goes to the
    /// path's rate and no further; with the usual sends of four datagrams a train is inside one
    /// buffer, no report has an estimate, and startup doubles past the path as without them.
    #[test]
    fn behind_gro_startup_s_long_trains_are_timed_and_keep_its_overshoot_within_the_queue() {
        let rtt = ms(150);
        let c = 500e6;
        let sc = |startup_trains| Scenario {
            receiver_lumps: Some(Duration::from_micros(100)),
            startup_trains,
            ..intercontinental_256(rtt)
        };
        let long = run("behind GRO, startup's long trains", sc(true));
        let short = run("behind GRO, the usual sends", sc(false));
        let estimates = |out: &Outcome| train_estimates(out, rtt * 3);
        let top = startup_top;
        for (name, out) in [("long", &long), ("short", &short)] {
            eprintln!(
                "  {name}: {} estimates in the first 3 RTTs {:?}, startup ended after {:.2} RTTs \
                 at most {}, {} dropped by the queue, resent {:.2}%, done in {:.3} s",
                estimates(out).len(),
                estimates(out)
                    .iter()
                    .map(|e| (e / 1e6) as u64)
                    .collect::<Vec<_>>(),
                startup_end(out).as_secs_f64() / rtt.as_secs_f64(),
                mbit(top(out)),
                out.link.dropped_queue,
                out.resent_share() * 100.0,
                out.duration.as_secs_f64()
            );
        }
        let mut with = estimates(&long);
        assert!(with.len() >= 4, "{with:?}");
        with.sort_by(f64::total_cmp);
        let median = with[with.len() / 2];
        assert!((median / c - 1.0).abs() < 0.1, "{with:?}");
        assert!(estimates(&short).is_empty(), "{:?}", estimates(&short));
        assert!(top(&long) <= 1.05 * c, "{}", top(&long));
        assert!(top(&short) >= 1.8 * c, "{}", top(&short));
        assert_eq!(long.link.dropped_queue, 0);
        assert!(short.link.dropped_queue > 1000);
        assert!(
            long.resent_share() < 0.0125 && long.resent_share() < short.resent_share(),
            "{} {}",
            long.resent_share(),
            short.resent_share()
        );
        assert!(long.duration < short.duration);
    }

    /// The impairments of `bench`'s `jittery` profile on top of `link`: ordered jitter of
    /// 0-8 ms, 1% reordered by 3 ms, 0.5% duplicated.
    fn jittery(link: LinkConfig) -> LinkConfig {
        link.with_ordered_jitter(ms(8))
            .with_reorder(0.01, ms(3))
            .with_duplicate(0.005)
    }

    /// The same path with jitter that keeps order (0-8 ms each way, as linkem's: a datagram
    /// waits for the latest before it), 1% reordered by 3 ms and 0.5% duplicated. A train's
    /// datagrams are held back by whichever of them drew the most jitter and then let go
    /// together, so the receiver's estimates scatter (here 113-370 Mbit/s in startup). Startup
    /// grows to their median at its usual gain, and past it by the gentle one
    /// (`STARTUP_PAST_TRAINS_GAIN`, 1.3), since estimates that disagree are a floor: to 1.29x
    /// the path, without a queue drop. Two rules for estimates that jitter spread were tried
    /// against this and not kept: no bound while the latest three disagree doubled past the
    /// path at startup's usual gain to 1011 Mbit/s (1,566 datagrams dropped by the queue); no
    /// bound once the path delivered over 1.25 times the estimate, to 1071 (7,031).
    #[test]
    fn behind_gro_trains_that_jitter_spreads_keep_startup_near_the_path() {
        let rtt = ms(150);
        let c = 500e6;
        let mut sc = Scenario {
            receiver_lumps: Some(Duration::from_micros(100)),
            ..intercontinental_256(rtt)
        };
        sc.link = jittery(sc.link);
        let out = run("behind GRO, ordered jitter 0-8 ms", sc);
        let estimates: Vec<u64> = train_estimates(&out, startup_end(&out))
            .iter()
            .map(|e| (e / 1e6) as u64)
            .collect();
        let at_90 = first_delivering(&out, Duration::ZERO, 0.9, c).expect("never at 90%");
        eprintln!(
            "  estimates in startup {estimates:?}; startup ended after {:.2} RTTs at most {}; \
             90% of the path delivered after {:.2} RTTs; {} dropped by the queue, resent \
             {:.2}%, done in {:.3} s",
            startup_end(&out).as_secs_f64() / rtt.as_secs_f64(),
            mbit(startup_top(&out)),
            at_90.as_secs_f64() / rtt.as_secs_f64(),
            out.link.dropped_queue,
            out.resent_share() * 100.0,
            out.duration.as_secs_f64()
        );
        let top = startup_top(&out);
        assert!((0.9 * c..=1.35 * c).contains(&top), "{}", mbit(top));
        assert!(at_90 <= rtt * 12, "{at_90:?}");
        assert!(out.link.dropped_queue < 100, "{}", out.link.dropped_queue);
    }

    /// The jittery path as `bench`'s `jittery` runs it: two channels (the engine's default),
    /// the same jitter that keeps order, reordering and duplication. Here the first estimates
    /// are lower still (83-375 Mbit/s, median 273 of the first five), as on linkem (BENCHMARKS
    /// 2b: startup ended at 211-252 Mbit/s of 500 there). Estimates that disagree are taken
    /// for a floor: startup grows past them by the gentle gain until its queue signal ends it.
    /// Here: startup's top 661 Mbit/s (1.32x), 90% of the path delivered after 6.0 RTTs, no
    /// queue drop. Bounds: startup's top within 0.9-1.35x the path, 90% of the path delivered
    /// within 8 RTTs, under 100 queue drops, resent within a quarter point of the path's 1%.
    /// Seen failing without the floor rule (startup ended at 221 Mbit/s after 2.5 RTTs, the
    /// median of the estimates, and probing took it to 90% of the path after 9.75 RTTs).
    #[test]
    fn startup_takes_jitter_spread_trains_for_a_floor_and_reaches_the_path() {
        let rtt = ms(150);
        let c = 500e6;
        let mut sc = Scenario {
            receiver_lumps: Some(Duration::from_micros(100)),
            channels: 2,
            seed: 1,
            ..intercontinental_256(rtt)
        };
        sc.link = jittery(sc.link);
        let out = run("two channels behind GRO, ordered jitter 0-8 ms", sc);
        let end = startup_end(&out);
        let estimates: Vec<u64> = train_estimates(&out, end)
            .iter()
            .map(|e| (e / 1e6) as u64)
            .collect();
        let at_90 = first_delivering(&out, Duration::ZERO, 0.9, c).expect("never at 90%");
        let top = startup_top(&out);
        eprintln!(
            "  estimates in startup {estimates:?}; startup ended after {:.2} RTTs at most {}; \
             90% of the path delivered after {:.2} RTTs; {} dropped by the queue, resent \
             {:.2}%, done in {:.3} s",
            end.as_secs_f64() / rtt.as_secs_f64(),
            mbit(top),
            at_90.as_secs_f64() / rtt.as_secs_f64(),
            out.link.dropped_queue,
            out.resent_share() * 100.0,
            out.duration.as_secs_f64()
        );
        assert!((0.9 * c..=1.35 * c).contains(&top), "{}", mbit(top));
        assert!(at_90 <= rtt * 8, "{at_90:?}");
        assert!(out.link.dropped_queue < 100, "{}", out.link.dropped_queue);
        assert!(
            out.resent_share() < 0.0125,
            "{:.2}%",
            out.resent_share() * 100.0
        );
    }

    /// The benchmarks' `shallow-1g` behind GRO: 1 Gbit/s, 40 ms, a queue of a tenth of the
    /// bandwidth-delay product (500 KB: 4 ms), two channels, buffers every 100 us, 256 MiB,
    /// cold. A sixteenth of the round trip at startup's 50 Mbit/s a channel is 15.6 KB, 125 us
    /// at the bottleneck: one or two buffers, too few to time. The trains double with each
    /// report that has no estimate (`STARTUP_TRAIN_DOUBLINGS`: to 64 KiB, two or three a
    /// 10 ms report, which the receiver pools until it has five: `TrainPool`), are timed
    /// from the second round trip of reports on, and startup goes to the path's rate
    /// without overflowing its queue.
    #[test]
    fn behind_gro_on_a_short_path_startup_s_trains_grow_until_they_are_timed() {
        let rtt = ms(40);
        let c = 1e9;
        let sc = Scenario {
            channels: 2,
            receiver_lumps: Some(Duration::from_micros(100)),
            ..scenario_rtt(
                RateMode::Auto,
                LinkConfig::default().with_rate(1_000_000_000, 500_000),
                256,
                rtt,
            )
        };
        let out = run("1 Gbit/s, 40 ms, 500 KB queue, behind GRO", sc);
        let first_report = out
            .reports
            .iter()
            .find(|r| r.feedback.bytes > 0)
            .map_or(Duration::ZERO, |r| r.at);
        let estimates = train_estimates(&out, first_report + rtt * 3);
        eprintln!(
            "  {} estimates in the first 3 RTTs of reports {:?}, startup ended after {:.2} RTTs \
             at most {}, {} dropped by the queue, resent {:.2}%, done in {:.3} s",
            estimates.len(),
            estimates
                .iter()
                .map(|e| (e / 1e6) as u64)
                .collect::<Vec<_>>(),
            startup_end(&out).as_secs_f64() / rtt.as_secs_f64(),
            mbit(startup_top(&out)),
            out.link.dropped_queue,
            out.resent_share() * 100.0,
            out.duration.as_secs_f64()
        );
        let mut sorted = estimates.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted.len() >= 3, "{estimates:?}");
        let median = sorted[sorted.len() / 2];
        assert!((median / c - 1.0).abs() < 0.1, "{estimates:?}");
        assert!(startup_top(&out) <= 1.1 * c, "{}", startup_top(&out));
        assert!(out.resent_share() < 0.005, "{}", out.resent_share());
    }

    /// Once the new data is out, the repairs are what a transfer waits for, and a lost one is
    /// asked for again only after the receiver's `nack_retry`, a round trip and more. Its second
    /// copy (`SendConfig::tail_copies`) saves that. 2 MiB over 150 ms at 5% random loss, all
    /// of it tail (sent in a tenth of a round trip): about 75 repairs, of which several are
    /// lost too. Sixteen seeds, at a fixed rate (the tail, not the controller).
    #[test]
    fn a_lost_repair_in_the_tail_costs_no_extra_round_trip() {
        let rtt = ms(150);
        let tails = |copies: u64| -> Vec<f64> {
            (1..=16)
                .map(|seed| {
                    let mut sc = scenario_rtt(
                        RateMode::Fixed,
                        LinkConfig::default()
                            .with_rate(500_000_000, 4 << 20)
                            .with_loss(0.05),
                        2,
                        rtt,
                    );
                    sc.rate.as_mut().unwrap().ceiling_bps = 200_000_000;
                    sc.seed = seed;
                    sc.send.tail_copies = copies;
                    // The repairs' copies alone: no parity, which would leave few repairs.
                    sc.fec = false;
                    let out = sc.run().expect("run");
                    (out.duration - out.new_data_sent).as_secs_f64() / rtt.as_secs_f64()
                })
                .collect()
        };
        let mut with = tails(SendConfig::default().tail_copies);
        let mut without = tails(0);
        with.sort_by(f64::total_cmp);
        without.sort_by(f64::total_cmp);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        eprintln!(
            "  tail after the last new datagram, in round trips: with second copies {with:.2?} \
             (mean {:.2}); without {without:.2?} (mean {:.2})",
            mean(&with),
            mean(&without)
        );
        // Nearly every transfer without second copies loses a repair; with them, few do.
        // (A lost repair is asked for again when its own wait is over, never early: an ask
        // that came up to a quarter of the wait early was taken by the sender for an echo of
        // the first and not answered, and the transfer waited for a third ask.)
        let extra = |v: &[f64]| v.iter().filter(|&&t| t > 2.5).count();
        assert!(mean(&with) + 1.0 < mean(&without));
        // Without copies the channel is quiet once its repairs are out, and the ask for a
        // lost one must still be answered: a NACK knows of what was sent until a one-way delay
        // before it (`knew_us` counts the time since the channel's last datagram). With the
        // last datagram's stamp alone, asks waited for the next final marker: mean 3.65,
        // three tails of 4.9-6.3 round trips.
        assert!(mean(&without) < 3.5, "{without:?}");
        assert!(
            extra(&with) <= 3 && extra(&without) >= 12,
            "{with:?} {without:?}"
        );
    }

    /// A path that lost nothing before its tail sends the tail without parity
    /// (`hurtle_proto::fec`); one datagram in a thousand lost and it does; a transfer that is
    /// all tail, before any report, does too. 32 MiB over 40 ms at 200 Mbit/s.
    #[test]
    fn a_path_that_lost_nothing_sends_its_tail_without_parity() {
        let run = |loss: f64, mib: u64| {
            let mut sc = scenario_rtt(
                RateMode::Fixed,
                LinkConfig::default()
                    .with_rate(500_000_000, 4 << 20)
                    .with_loss(loss),
                mib,
                ms(40),
            );
            sc.rate.as_mut().unwrap().ceiling_bps = 200_000_000;
            sc.fec = true;
            sc.run().expect("run")
        };
        let clean = run(0.0, 32);
        let lossy = run(0.001, 32);
        let small = run(0.0, 1);
        eprintln!(
            "  parity sent: clean {}, 0.1% loss {}, 1 MiB clean {}",
            clean.parity_sent, lossy.parity_sent, small.parity_sent
        );
        assert_eq!(clean.parity_sent, 0, "{clean}");
        assert!(lossy.parity_sent > 0, "{lossy}");
        assert!(small.parity_sent > 0, "{small}");
    }

    /// Parity for the tail (`hurtle_proto::fec`): a datagram lost in the last round trip of
    /// new data is rebuilt from its group's parity as soon as that arrives, not repaired a
    /// round trip later. 2 MiB over 150 ms at 1% and 3% random loss, all of it tail, sixteen
    /// seeds with parity and without: the time from the last new datagram to the end, in round
    /// trips (half a round trip for the last datagram to arrive, half for the receiver's
    /// answer: 1.0 is the least).
    #[test]
    fn parity_rebuilds_the_tails_losses_without_a_round_trip() {
        let rtt = ms(150);
        let tails = |loss: f64, fec: bool| -> (Vec<f64>, u64, u64, f64) {
            let mut rebuilt = 0;
            let mut parity = 0;
            let mut resent = 0.0;
            let mut v: Vec<f64> = (1..=16)
                .map(|seed| {
                    let mut sc = scenario_rtt(
                        RateMode::Fixed,
                        LinkConfig::default()
                            .with_rate(500_000_000, 4 << 20)
                            .with_loss(loss),
                        2,
                        rtt,
                    );
                    sc.rate.as_mut().unwrap().ceiling_bps = 200_000_000;
                    sc.seed = seed;
                    sc.fec = fec;
                    let out = sc.run().expect("run");
                    rebuilt += out.recovered;
                    parity += out.parity_sent;
                    resent += out.resent_share() / 16.0;
                    (out.duration - out.new_data_sent).as_secs_f64() / rtt.as_secs_f64()
                })
                .collect();
            v.sort_by(f64::total_cmp);
            (v, rebuilt, parity, resent)
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        for loss in [0.01, 0.03] {
            let (with, rebuilt, parity, resent_with) = tails(loss, true);
            let (without, none, no_parity, resent_without) = tails(loss, false);
            eprintln!(
                "  {:.0}% loss, tail in round trips: with parity {with:.2?} (mean {:.2}, {rebuilt} \
                 rebuilt, {parity} parity sent, {:.2}% resent); without {without:.2?} (mean \
                 {:.2}, {:.2}% resent)",
                loss * 100.0,
                mean(&with),
                resent_with * 100.0,
                mean(&without),
                resent_without * 100.0
            );
            assert_eq!((none, no_parity), (0, 0));
            assert!(rebuilt > 0 && parity > 0);
            // Without parity every transfer waits for repairs; with it, most end at once at
            // 1% (the whole transfer goes before the first report, so its parity is sized for
            // the 1% a sender assumes before it knows: at 3% fewer groups are rebuilt whole).
            let at_once = |v: &[f64]| v.iter().filter(|&&t| t < 1.2).count();
            assert!(at_once(&without) <= 2, "{without:?}");
            let want = if loss < 0.02 { 12 } else { 6 };
            assert!(at_once(&with) >= want, "{with:?}");
            assert!(mean(&with) + 0.5 < mean(&without));
            assert!(resent_with < resent_without);
        }
    }

    /// A long transfer's tail under `auto` (96 MiB over 500 Mbit/s, 150 ms, 1% loss, three
    /// seeds): with the tail's parity, and its repairs sent twice from the last round trip and a
    /// half of new data on (not only once all of it is sent: a lost repair of a loss just
    /// before the end cost a second round trip most times), the transfer ends about a round
    /// trip after its last new datagram; with neither, two.
    #[test]
    fn a_long_transfers_tail_is_one_round_trip() {
        let rtt = ms(150);
        let tails = |protect: bool| -> Vec<f64> {
            (1..=3)
                .map(|seed| {
                    let mut sc = scenario_rtt(
                        RateMode::Auto,
                        LinkConfig::default()
                            .with_rate(500_000_000, 4 << 20)
                            .with_loss(0.01),
                        96,
                        rtt,
                    );
                    sc.channels = 2;
                    sc.seed = seed;
                    sc.fec = protect;
                    if !protect {
                        sc.send.tail_copies = 0;
                    }
                    let out = sc.run().expect("run");
                    (out.duration - out.new_data_sent).as_secs_f64() / rtt.as_secs_f64()
                })
                .collect()
        };
        let (with, without) = (tails(true), tails(false));
        eprintln!("  tails in round trips: protected {with:.2?}, not {without:.2?}");
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean(&with) < 1.3, "{with:?}");
        assert!(mean(&without) > 1.8, "{without:?}");
    }

    /// The same tail at 1% loss, with 2% of datagrams held back 3 ms and 1% duplicated:
    /// parity that arrives before a reordered piece of its group waits for it (the piece's
    /// arrival tries the group again), and duplicates rebuild nothing twice. Every file
    /// arrives exact (the run checks it) and most tails still end at once.
    #[test]
    fn parity_works_through_reordering_and_duplication() {
        let rtt = ms(150);
        let mut tails = Vec::new();
        let mut rebuilt = 0;
        for seed in 1..=16 {
            let mut sc = scenario_rtt(
                RateMode::Fixed,
                LinkConfig::default()
                    .with_rate(500_000_000, 4 << 20)
                    .with_loss(0.01)
                    .with_reorder(0.02, ms(3))
                    .with_duplicate(0.01),
                2,
                rtt,
            );
            sc.rate.as_mut().unwrap().ceiling_bps = 200_000_000;
            sc.seed = seed;
            let out = sc.run().expect("run");
            rebuilt += out.recovered;
            tails.push((out.duration - out.new_data_sent).as_secs_f64() / rtt.as_secs_f64());
        }
        tails.sort_by(f64::total_cmp);
        eprintln!("  tails with reordering, in round trips: {tails:.2?}, {rebuilt} rebuilt");
        assert!(rebuilt > 0);
        assert!(
            tails.iter().filter(|&&t| t < 1.2).count() >= 10,
            "{tails:?}"
        );
    }

    #[test]
    fn random_loss_of_1_and_3_percent_is_never_taken_for_congestion() {
        let rtt = ms(100);
        for loss in [0.01, 0.03] {
            let out = run(
                &format!(
                    "300 Mbit/s, 100 ms, 4 MiB queue, {}% random loss",
                    loss * 100.0
                ),
                scenario_rtt(
                    RateMode::Auto,
                    LinkConfig::default()
                        .with_rate(BOTTLENECK, 4 << 20)
                        .with_loss(loss),
                    128,
                    rtt,
                ),
            );
            let from = startup_end(&out) + rtt * 2;
            let cuts = corrections(&out, from, out.steady_until);
            let bound = BOTTLENECK as f64 * (1.0 - loss);
            let steady = goodput(&out, from, out.steady_until);
            eprintln!(
                "  {}%: corrections after startup {:?}; steady goodput {} ({:.1}% of the bound); \
                 resent {:.2}%",
                loss * 100.0,
                cuts,
                mbit(steady),
                steady / bound * 100.0,
                out.resent_share() * 100.0
            );
            assert!(cuts.is_empty(), "{loss}: cut for {cuts:?}");
            assert!(
                steady > 0.9 * bound,
                "{loss}: steady goodput {}",
                mbit(steady)
            );
            assert!(
                out.resent_share() < loss + 0.01,
                "{loss}: resent {:.2}%",
                out.resent_share() * 100.0
            );
        }
    }

    #[test]
    fn repairs_waiting_behind_a_startup_overshoot_are_not_sent_twice() {
        // 1 Gbit/s, 40 ms, a queue of a tenth of the bandwidth-delay product: startup's
        // overshoot drops thousands of datagrams at once, and their repairs wait in the
        // sender's queue longer than the receiver waits before asking again. Those second
        // requests come before the repairs could arrive, and get no second copy: every byte
        // resent is a byte the path dropped.
        let rtt = ms(40);
        let out = run(
            "1 Gbit/s, 40 ms, 500 KB queue",
            scenario_rtt(
                RateMode::Auto,
                LinkConfig::default().with_rate(1_000_000_000, 500_000),
                256,
                rtt,
            ),
        );
        eprintln!(
            "  resent {:.2}%, {} datagrams dropped by the queue, {} duplicate bytes",
            out.resent_share() * 100.0,
            out.link.dropped_queue,
            out.duplicate_bytes
        );
        assert_eq!(out.duplicate_bytes, 0);
        assert_eq!(out.datagrams_resent, out.link.dropped_queue);
    }

    #[test]
    fn a_receiver_that_stalls_for_50_ms_costs_no_capacity() {
        // A fast receiver (twice the path) that stops reading for 50 ms twice: at 300 Mbit/s
        // its 4 MiB buffer holds the stall; at 1 Gbit/s it overflows and drops.
        for (link, queue) in [(BOTTLENECK, 4usize << 20), (1_000_000_000, 4 << 20)] {
            let stalls = vec![(ms(1500), ms(1550)), (ms(2500), ms(2550))];
            let out = run(
                &format!("{} Mbit/s, receiver stalls 50 ms twice", link / 1_000_000),
                Scenario {
                    receiver_rate_bps: Some(2 * link),
                    receiver_queue_bytes: queue,
                    receiver_stalls: stalls.clone(),
                    ..scenario(
                        RateMode::Auto,
                        LinkConfig::default().with_rate(link, 4 << 20),
                        if link > BOTTLENECK { 512 } else { 160 },
                    )
                },
            );
            assert!(
                out.steady_until > ms(2700),
                "too short: {:?}",
                out.steady_until
            );
            let cuts = corrections(&out, ms(1500), ms(3000));
            let low = rates(&out, ms(1500), ms(3000))
                .into_iter()
                .min()
                .unwrap_or(0);
            eprintln!(
                "  corrections during the stalls {cuts:?}; lowest rate {}; {} socket drops",
                mbit(low as f64),
                out.socket_drops
            );
            assert!(cuts.is_empty(), "cut for {cuts:?}");
            assert!(
                low as f64 >= 0.85 * link as f64,
                "rate down to {}",
                mbit(low as f64)
            );
            // A receiver that stalls is not the path going out, even where it drops.
            assert_eq!(out.outages.count, 0, "{:?}", out.outages);
        }
    }

    /// A sender whose channel threads stop now and then (preempted: on the busy test VM the
    /// hypervisor took milliseconds to tens of milliseconds at a time). Paced under the
    /// bottleneck, a sender that stops for 8 ms four times owes the time it missed beyond its
    /// 1.5 ms credit and repays it faster than its rate, so over the stalls it moves what a
    /// sender that never stalled moves (without the debt, 26 ms of its rate would be lost:
    /// 0.988 of it). Under `auto`, paced at the bottleneck, a sender that stops for 40 ms twice
    /// loses the link time it idled (and the 30 ms beyond what it may owe), but nothing more:
    /// what it repays stands in the queue and is drained as any queue, with no cut under 85%
    /// of the path, and it moves at least 95% of what the calm sender moved (the stalls are 4%
    /// of the time).
    #[test]
    fn a_sender_that_stalls_repays_what_it_may_and_loses_no_capacity() {
        let rtt = ms(100);
        let sc = |mode: RateMode, stalls: Vec<(Duration, Duration)>| {
            let mut sc = Scenario {
                sender_stalls: stalls,
                ..scenario_rtt(
                    mode,
                    LinkConfig::default().with_rate(BOTTLENECK, 4 << 20),
                    256,
                    rtt,
                )
            };
            if let Some(cfg) = sc.rate.as_mut().filter(|c| c.mode == RateMode::Fixed) {
                cfg.ceiling_bps = BOTTLENECK * 9 / 10;
            }
            sc
        };
        let (from, to) = (ms(1900), ms(4000));
        // Payload the receiver took from `from` to `to`.
        let moved = |out: &Outcome| {
            let received = |at: Duration| {
                out.reports
                    .iter()
                    .take_while(|r| r.at <= at)
                    .last()
                    .map_or(0, |r| r.received)
            };
            received(to) - received(from)
        };
        let short = [2000, 2500, 3000, 3500]
            .map(|t| (ms(t), ms(t + 8)))
            .to_vec();
        let long = vec![(ms(2000), ms(2040)), (ms(3000), ms(3040))];
        for (mode, stalls, least) in [
            (RateMode::Fixed, short, 0.998),
            (RateMode::Auto, long, 0.95),
        ] {
            let name = format!("{mode:?}, 300 Mbit/s, 100 ms, 4 MiB queue");
            let calm = run(&name, sc(mode, Vec::new()));
            let stalled = run(
                &format!("{name}, the sender stalls {:?}", stalls[0].1 - stalls[0].0),
                sc(mode, stalls),
            );
            for out in [&calm, &stalled] {
                assert!(out.steady_until > to, "too short: {:?}", out.steady_until);
            }
            let share = moved(&stalled) as f64 / moved(&calm) as f64;
            let low = rates(&stalled, from, to).into_iter().min().unwrap_or(0);
            eprintln!(
                "  {mode:?}: moved {share:.4} of what the calm sender moved; lowest rate {}, corrections {:?}",
                mbit(low as f64),
                corrections(&stalled, from, to)
            );
            assert!(share >= least, "{mode:?}: moved {share:.4} of it");
            if mode == RateMode::Auto {
                assert!(
                    low as f64 >= 0.85 * BOTTLENECK as f64,
                    "rate down to {}",
                    mbit(low as f64)
                );
            }
        }
    }

    /// A sender preempted now and then on a path whose buffer is a tenth of its
    /// bandwidth-delay product (1 Gbit/s, 40 ms, 500 KB: 4 ms): once the buffer has shown
    /// itself shallow (startup's overshoot dropped at a queue of a few milliseconds), the
    /// pacers repay nothing after a stall. Repaying 10 ms at 1.25 times the rate put 2.5 ms of
    /// queue on top of what stood there every 10 ms until repaid, and the buffer dropped it:
    /// before, this scenario resent 1.82% with 11 loss corrections after startup (0.03% and
    /// one now; without the stalls, none either way); the benchmarks' `shallow-1g` resent
    /// 1.8-2.2%.
    #[test]
    fn a_sender_that_stalls_does_not_overflow_a_shallow_buffer_with_its_catch_up() {
        let rtt = ms(40);
        let stalls: Vec<(Duration, Duration)> = (0..12)
            .map(|i| {
                let at = ms(700 + 230 * i + 17 * (i % 3));
                (at, at + ms(4 + 6 * (i % 4)))
            })
            .collect();
        let sc = Scenario {
            channels: 2,
            sender_stalls: stalls,
            ..scenario_rtt(
                RateMode::Auto,
                LinkConfig::default().with_rate(1_000_000_000, 500_000),
                320,
                rtt,
            )
        };
        let out = run(
            "1 Gbit/s, 40 ms, 500 KB queue, the sender stalling 4-22 ms",
            sc,
        );
        let resent = out.datagrams_resent as f64 / out.datagrams_sent as f64;
        let from = ms(700);
        let losses = corrections(&out, from, out.duration)
            .into_iter()
            .filter(|&r| r == Reason::Loss)
            .count();
        eprintln!(
            "  resent {:.2}%, loss corrections after startup {losses}",
            100.0 * resent
        );
        assert!(resent < 0.005, "resent {:.2}%", 100.0 * resent);
        assert!(losses <= 2, "{losses} loss corrections");
    }

    /// A sender whose threads are preempted for 2-26 ms every 80-300 ms (as on the 2-core test
    /// VM, where each dip in a transfer's delivery over intercontinental was such a stall) on a
    /// deep buffer (intercontinental: 500 Mbit/s, 150 ms, 1% loss, 4 MiB, 256 MiB). Cruising
    /// keeps a reserve of queue (`stall_reserve`: 6.25 ms here, up to twice that) that the
    /// bottleneck sends from while the sender is stalled, instead of idling: the stalled
    /// sender takes 1.2% longer than a calm one (2.4% when cruising drained any queue over
    /// 6.25 ms and built none), and the reserve costs the calm sender nothing (4.782 s either
    /// way), nor does it read as congestion.
    #[test]
    fn a_stalling_sender_on_a_deep_buffer_keeps_the_link_busy_from_cruising_s_reserve() {
        let rtt = ms(150);
        // A stall every 80-300 ms, of 2-26 ms (a third of them 2 ms), from a fixed sequence.
        let mut stalls = Vec::new();
        let mut x: u64 = 12345;
        let mut at = 900;
        while at < 6000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (gap, len) = (80 + (x >> 33) % 220, 2 + ((x >> 20) % 13) * ((x >> 50) % 3));
            stalls.push((ms(at), ms(at + len)));
            at += gap + len;
        }
        let (from, to) = (ms(1500), ms(4000));
        let sc = |stalls: Vec<(Duration, Duration)>| Scenario {
            channels: 2,
            sender_stalls: stalls,
            ..intercontinental_256(rtt)
        };
        let calm = run("intercontinental, 2 channels", sc(Vec::new()));
        let stalled = run(
            &format!("the same, the sender stalling {} times", stalls.len()),
            sc(stalls),
        );
        let longer = stalled.duration.as_secs_f64() / calm.duration.as_secs_f64();
        let (mean, top) = queue_delays(&stalled, from, to);
        let cuts = corrections(&stalled, from, to);
        eprintln!(
            "  stalled took {longer:.4} times as long as calm; its queue {mean:?} on average, \
             at most {top:?}; corrections {cuts:?}"
        );
        assert!(longer <= 1.015, "{longer:.4}");
        assert!(mean >= ms(5), "{mean:?}");
        assert!(cuts.is_empty(), "{cuts:?}");
        assert!(corrections(&calm, from, to).is_empty());
    }

    /// A bottleneck that carries 60% of its rate for 100 ms (the benchmarks' emulator, short
    /// of CPU for a moment, did that to a 1 Gbit/s path) slows the rate for as long as it
    /// lasts, and then costs nothing more: the rate is back where it was within a few round
    /// trips (a probe that the path takes restores the bottleneck from before the cuts),
    /// instead of climbing back a probe step at a time. On an emulated 1 Gbit/s path such a
    /// climb can take a tenth of the transfer after cuts to 30% of the path: a correction to
    /// one report's dip, then another for the loss of data sent before the first.
    #[test]
    fn after_a_100_ms_dip_of_the_bottleneck_the_rate_is_back_within_8_round_trips() {
        let (dip, end) = (ms(2000), ms(2100));
        let b = BOTTLENECK as f64;
        let out = run(
            "300 Mbit/s, 40 ms, 1% loss, 512 KiB queue; 60% of it for 100 ms at 2 s",
            Scenario {
                rate_changes: vec![(dip, BOTTLENECK * 6 / 10), (end, BOTTLENECK)],
                ..scenario(
                    RateMode::Auto,
                    LinkConfig::default()
                        .with_rate(BOTTLENECK, 512 << 10)
                        .with_loss(0.01),
                    256,
                )
            },
        );
        let lowest = rates(&out, dip, end + RTT * 20)
            .into_iter()
            .min()
            .unwrap_or(0) as f64;
        let back = out
            .rate_timeline
            .iter()
            .find(|p| p.at >= end && p.rate_bps as f64 >= 0.95 * b)
            .map(|p| p.at)
            .expect("the rate never came back");
        let cuts = corrections(&out, dip, end + RTT * 20);
        eprintln!(
            "  lowest rate after the dip {}, back to 95% {:.1} RTTs after it, corrections {cuts:?}",
            mbit(lowest),
            rtts(back - end)
        );
        // No lower than draining the dip's own 60%; at most one correction per round trip
        // of the dip and the one after it.
        assert!(lowest >= 0.5 * b, "the rate fell to {}", mbit(lowest));
        assert!(cuts.len() <= 3, "{cuts:?}");
        assert!(
            back <= end + RTT * 8,
            "back after {:.1} RTTs",
            rtts(back - end)
        );
    }

    /// A transfer of `mib` through a blackout from 1 s for `secs` seconds on a 300 Mbit/s,
    /// 40 ms path: the outcome, with the lowest rate across the blackout and how long after
    /// its end the receiver got 90% of the path, checked to be at most 5 round trips, and the
    /// one outage the sender counted, as long as the blackout give or take a round trip (the
    /// reports in flight when it began, and those of the data sent as it ended).
    fn through_blackout(secs: u64, mib: u64) -> (Outcome, u64) {
        let (start, end) = (ms(1000), ms(1000 + 1000 * secs));
        let out = run(
            &format!("300 Mbit/s, 40 ms, {secs} s blackout"),
            scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(BOTTLENECK, 1 << 20)
                    .with_blackout(start, end),
                mib,
            ),
        );
        let back = first_delivering(&out, end, 0.9, BOTTLENECK as f64).expect("never back");
        let lowest = rates(&out, start, end + RTT).into_iter().min().unwrap_or(0);
        eprintln!(
            "  90% delivered {:.1} RTTs after the blackout; lowest rate across it {}; outages \
             {} ({:.3} s)",
            rtts(back - end),
            mbit(lowest as f64),
            out.outages.count,
            out.outages.total.as_secs_f64()
        );
        assert!(
            back <= end + RTT * 5,
            "back after {:.1} RTTs",
            rtts(back - end)
        );
        assert_eq!(out.outages.count, 1, "{:?}", out.outages);
        let seconds = out.outages.total.as_secs_f64();
        assert!(
            (seconds - secs as f64).abs() <= RTT.as_secs_f64(),
            "{:?}",
            out.outages
        );
        (out, lowest)
    }

    #[test]
    fn after_a_3_s_blackout_the_rate_is_back_within_5_round_trips() {
        through_blackout(3, 256);
    }

    /// The engine's feedback after an outage: reports and NACKs go as datagrams and on TCP, a
    /// datagram copy is lost now and then (1%), and TCP, whose retransmission timer backed off
    /// through the 3.5 s blackout (from 200 ms), brings its copies 2.7 s after it. The copy of
    /// a NACK whose datagram was lost then asks for what the receiver has asked again since
    /// and been repaired: a NACK says what it knew of (`knew_us`), and the sender does not
    /// send those repairs again (judged by `repair_echo` alone, as before protocol 14, 7.0 MB of
    /// the 256 arrived twice; now none).
    #[test]
    fn nacks_that_come_late_after_a_blackout_are_not_repaired_twice() {
        let sc = Scenario {
            feedback_copies: Some(0.01),
            control_rto: Some(ms(200)),
            ..scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(BOTTLENECK, 1 << 20)
                    .with_loss(0.01)
                    .with_blackout(ms(1000), ms(4500)),
                256,
            )
        };
        let out = run("300 Mbit/s, 40 ms, 1%, 3.5 s blackout, TCP backs off", sc);
        eprintln!(
            "  {:.1} MB arrived twice; {:.1} MB resent",
            out.duplicate_bytes as f64 / 1e6,
            out.repair_bytes as f64 / 1e6
        );
        assert!(
            out.duplicate_bytes < 1 << 20,
            "{} twice",
            out.duplicate_bytes
        );
    }

    /// A path out for 12 s: the sender stays at the model's rate for the first seconds (a
    /// short outage costs no link time when it ends) and then halves it every 2 s, instead of
    /// pacing into the void at full rate; deliveries resume at the rate the path had.
    #[test]
    fn through_a_12_s_blackout_the_rate_backs_off_and_is_back_within_5_round_trips_after() {
        let (out, lowest) = through_blackout(12, 512);
        let datagram =
            (hurtle_proto::wire::DEFAULT_PAYLOAD as usize + hurtle_proto::wire::HEADER_LEN) as f64;
        let full = BOTTLENECK as f64 * 12.0 / 8.0 / datagram;
        let into_void = out.link.dropped_blackout as f64 / full;
        eprintln!(
            "  sent into it {:.1}% of what the bottleneck's rate would",
            into_void * 100.0
        );
        // Five halvings in the 12 s (the first after 2 s past the silence limit): about 4.2 s
        // of the path's rate in all, a third of it.
        assert!(into_void <= 0.4, "{into_void:.3}");
        assert!(
            lowest as f64 <= BOTTLENECK as f64 / 16.0,
            "{}",
            mbit(lowest as f64)
        );
    }

    /// The benchmarks' `lossy-wifi-reorder` without its jitter and duplicates (which lift the
    /// model above the path here, see the next test): 200 Mbit/s, 20 ms, 2% random loss in
    /// bursts of two on average, 2% reordered by 3 ms, a 512 KiB queue, 128 MiB. Loss in bursts
    /// makes a report's lost count vary about three times as much as independent loss would;
    /// the loss floor allows for it (`LossFloor::dispersion`) while cruising and takes its rate
    /// from the quieter three quarters of recent reports, not half: random loss is not
    /// congestion. 11 loss corrections in 5.5 s, ten of them within three round trips of a
    /// probe (whose loss the floor judges without the allowance: it is most likely the
    /// probe's own), steady goodput
    /// 95.5% of the path; with the allowance in probes too, 2 and 96.1%; with the floor of the
    /// quieter half and a Poisson count's noise, 26 (one every 0.2 s) and 93.8%.
    #[test]
    fn random_loss_in_bursts_is_not_congestion() {
        let rtt = ms(20);
        let c = 200e6;
        let sc = Scenario {
            channels: 2,
            ..scenario_rtt(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(200_000_000, 512 << 10)
                    .with_loss(0.02)
                    .with_loss_burst(2.0)
                    .with_reorder(0.02, ms(3)),
                128,
                rtt,
            )
        };
        let out = run("lossy-wifi-reorder: 2% loss in bursts of 2", sc);
        let from = startup_end(&out) + rtt * 4;
        let cuts = corrections(&out, from, out.steady_until);
        let losses = cuts.iter().filter(|&&r| r == Reason::Loss).count();
        let secs = (out.steady_until - from).as_secs_f64();
        let steady = goodput(&out, from, out.steady_until);
        eprintln!(
            "  {losses} loss corrections in {secs:.1} s after startup ({cuts:?}); steady goodput \
             {} ({:.1}%)",
            mbit(steady),
            steady / c * 100.0
        );
        assert!(
            losses as f64 <= 2.5 * secs,
            "{losses} loss cuts in {secs:.1} s"
        );
        assert!(steady > 0.95 * c, "steady goodput {}", mbit(steady));
    }

    #[test]
    fn jitter_reordering_and_duplication_are_not_a_queue() {
        let c = 200e6;
        let out = run(
            "200 Mbit/s, 40 ms, +-5 ms jitter, 2% reordered by 3 ms, 1% duplicated",
            scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(200_000_000, 512 << 10)
                    .with_jitter(ms(5))
                    .with_reorder(0.02, ms(3))
                    .with_duplicate(0.01),
                64,
            ),
        );
        let from = startup_end(&out) + RTT * 2;
        let cuts = corrections(&out, from, out.steady_until);
        let steady = goodput(&out, from, out.steady_until);
        eprintln!(
            "  corrections after startup {cuts:?}; steady goodput {} ({:.1}%)",
            mbit(steady),
            steady / c * 100.0
        );
        // Jitter itself never crosses the queue target; what does is a real queue, built when
        // duplicates and lucky intervals (this model's jitter reorders almost every datagram)
        // lift the modelled bottleneck a few percent above the path: the model corrects that,
        // but not more than about once a second.
        let delay_cuts = cuts.iter().filter(|&&r| r == Reason::Delay).count();
        let secs = (out.steady_until - from).as_secs_f64();
        assert!(
            delay_cuts as f64 <= secs.ceil(),
            "{delay_cuts} delay cuts in {secs:.1} s"
        );
        assert!(steady > 0.9 * c, "steady goodput {}", mbit(steady));
    }

    /// The benchmarks' `jittery` path in small: jitter that keeps order (as linkem's and
    /// netem's do: a datagram waits for the latest before it), 0-8 ms each way, so that a
    /// report's mean one-way delay sits 6-8 ms over the lowest one seen with no queue at all;
    /// 1% reordered by 3 ms, 0.5% duplicated, 0.5% random loss, 200 Mbit/s, 40 ms, a queue of
    /// one bandwidth-delay product, 96 MiB. That spread is under the 15 ms queue target and
    /// inside cruising's reserve band: it costs some of the reserve, not the rate. 4 delay
    /// corrections in 3.9 s after startup, steady goodput 97.8% of the path less its loss (a
    /// floor under the delay that underused reports measured, tried against this, held a queue
    /// 5 ms longer and corrected 6 times, at 98.0%). With a queue target under the spread
    /// (5 ms instead of 15) the model corrected 23 times in 8.6 s, at 46%.
    #[test]
    fn ordered_jitter_is_not_a_queue() {
        let c = 200e6;
        let loss = 0.005;
        let out = run(
            "200 Mbit/s, 40 ms, ordered jitter 0-8 ms, 1% reordered by 3 ms, 0.5% duplicated, \
             0.5% loss",
            scenario(
                RateMode::Auto,
                LinkConfig::default()
                    .with_rate(200_000_000, 1_000_000)
                    .with_ordered_jitter(ms(8))
                    .with_reorder(0.01, ms(3))
                    .with_duplicate(0.005)
                    .with_loss(loss),
                96,
            ),
        );
        let from = startup_end(&out) + RTT * 4;
        let cuts = corrections(&out, from, out.steady_until);
        let steady = goodput(&out, from, out.steady_until);
        let (mean_delay, _) = queue_delays(&out, from, out.steady_until);
        let secs = (out.steady_until - from).as_secs_f64();
        eprintln!(
            "  corrections in {secs:.1} s after startup {cuts:?}; steady goodput {} ({:.1}% of the \
             path less its loss); mean reported delay {mean_delay:?}",
            mbit(steady),
            steady / (c * (1.0 - loss)) * 100.0
        );
        let delay_cuts = cuts.iter().filter(|&&r| r == Reason::Delay).count();
        assert!(
            delay_cuts as f64 <= 1.5 * secs,
            "{delay_cuts} delay cuts in {secs:.1} s"
        );
        assert!(
            steady > 0.95 * c * (1.0 - loss),
            "steady goodput {}",
            mbit(steady)
        );
    }
}

/// The bottleneck named at the end of a transfer, from what the sender saw.
mod bottleneck_named {
    use super::*;
    use hurtle_proto::rate::bottleneck::{Bottleneck, BufferCap, Evidence, ReceiverSigns};

    fn named(out: &Outcome, payload: u16) -> Bottleneck {
        named_with(out, payload, 0, None)
    }

    /// As the sender names it, with the ceiling the receiver offered and its buffer cap.
    fn named_with(
        out: &Outcome,
        payload: u16,
        receiver_ceiling_bps: u64,
        receiver_buffer: Option<BufferCap>,
    ) -> Bottleneck {
        // As the engine's sender does: every report the receiver sent, against the target.
        let mut receiver = ReceiverSigns::default();
        for r in &out.reports {
            receiver.note(&r.feedback, hurtle_proto::rate::model::queue_target(ms(40)));
        }
        let bits = out.datagrams_sent as f64
            * (payload as usize + hurtle_proto::wire::HEADER_LEN) as f64
            * 8.0;
        let changes: Vec<_> = out
            .rate_timeline
            .iter()
            .map(|p| (p.at, p.rate_bps, p.reason))
            .collect();
        Bottleneck::classify(&Evidence {
            mode: RateMode::Auto,
            reasons: Evidence::reasons_of(&changes),
            changes,
            paced_for: out.duration,
            cap_bps: 0,
            receiver_ceiling_bps,
            sent_bps: bits / out.duration.as_secs_f64(),
            path_bps: None,
            random_loss: None,
            receiver,
            receiver_buffer,
        })
    }

    #[test]
    fn a_path_limited_transfer_names_the_path_a_slow_reader_the_cpu_and_a_slow_writer_the_disk() {
        let sc = scenario(
            RateMode::Auto,
            LinkConfig::default()
                .with_rate(BOTTLENECK, 256 << 10)
                .with_loss(0.005),
            64,
        );
        let payload = sc.payload;
        let out = run("300 Mbit/s path, 0.5% loss", sc);
        let b = named(&out, payload);
        eprintln!("  named: {b}");
        assert_eq!(b.name(), "path", "{b:?}");

        // A receiver that takes a quarter of the path: its reader (CPU), then its writer
        // (disk).
        for (disk, what, name) in [
            (false, "receiver takes", "receiver-cpu"),
            (true, "receiver's disk takes", "receiver-disk"),
        ] {
            let out = run(
                &format!("300 Mbit/s path, {what} 75 Mbit/s"),
                Scenario {
                    receiver_rate_bps: Some(BOTTLENECK / 4),
                    receiver_queue_bytes: 256 << 10,
                    receiver_is_disk: disk,
                    ..scenario(
                        RateMode::Auto,
                        LinkConfig::default().with_rate(BOTTLENECK, 128 << 10),
                        32,
                    )
                },
            );
            let b = named(&out, payload);
            eprintln!("  named: {b}");
            assert_eq!(b.name(), name, "{b:?}");
        }
    }

    #[test]
    fn a_receiver_behind_with_capped_buffers_and_cpu_to_spare_names_its_buffers() {
        // The receiver's stage: a 64 KiB buffer (Linux's default rmem_max is 208 KiB), read at
        // a quarter of the path. What the sender is told decides the name: the kernel capped
        // the buffer below the 4 MiB asked for, and the ceiling the receiver offered (what it
        // measured it can hash) was far above the rate, or unknown: the buffers; the same cap
        // with a ceiling the rate came within half of: the CPU; no cap: the CPU.
        let sc = Scenario {
            receiver_rate_bps: Some(BOTTLENECK / 4),
            receiver_queue_bytes: 64 << 10,
            ..scenario(
                RateMode::Auto,
                LinkConfig::default().with_rate(BOTTLENECK, 128 << 10),
                32,
            )
        };
        let payload = sc.payload;
        let out = run(
            "300 Mbit/s path, receiver with a 64 KiB buffer takes 75 Mbit/s",
            sc,
        );
        let cap = BufferCap::of(64 << 10, 4 << 20);
        for (ceiling, cap, name) in [
            (0, cap, "receiver-buffers"),
            (4 * BOTTLENECK, cap, "receiver-buffers"),
            (120_000_000, cap, "receiver-cpu"),
            (4 * BOTTLENECK, None, "receiver-cpu"),
        ] {
            let b = named_with(&out, payload, ceiling, cap);
            eprintln!("  ceiling {} Mbit/s, cap {cap:?}: {b}", ceiling / 1_000_000);
            assert_eq!(b.name(), name, "{b:?}");
        }
        let b = named_with(&out, payload, 0, cap);
        assert!(
            b.to_string()
                .contains("sysctl -w net.core.rmem_max=4194304"),
            "{b}"
        );
    }
}
