//! What limited a transfer, named from the sender's view: the rate controller's timeline and
//! model, and what the channels managed to send.
//!
//! | name | when |
//! |---|---|
//! | `fixed-rate` | `--rate-fixed`: the rate was set, not found |
//! | `sender` | the channels sent less than three quarters of the rate they were paced at (over at least a second of pacing, and not a transfer still in startup that sent less than its first rate moves in a second: it had little to send): the sender's CPU, or the disk it reads from |
//! | `rate-cap` | the user's `--rate` held the rate for half the transfer or more |
//! | `receiver-ceiling` | the ceiling the receiver offered (how fast it hashes, times its cores) held it for half the transfer or more |
//! | `startup` | the rate only ever grew from its start (`auto` or `fair`, no correction, no cruise) and the sender did not hold it back: the transfer ended before the rate found what limits it, and round trips, not bandwidth, set its time |
//! | `receiver-disk` | in at least [`DISK_REPORTS`] reports, and more of them than showed its CPU behind, the receiver's writer queue was over half full or a block waited in it longer than the queueing target, and the rate was corrected: the disk it writes to |
//! | `receiver-buffers` | as `receiver-cpu`, but the receiver's socket buffers were capped below what it asked for (`net.core.rmem_max`) while the rate stayed under half the ceiling it offered (or it offered none): its CPU had room, and a bigger buffer takes the bursts it catches up with |
//! | `receiver-cpu` | the receiver fell behind (socket buffers over half full, or dropping) at least as often as the path showed congestion: its CPU |
//! | `path` | otherwise: the path, with the rate `auto`'s model has for it and the random loss on it (the share of datagrams lost in reports without congestion, once [`super::LOSS_SHARE_AFTER`] were counted) |
//!
//! The receiver says in its `HelloAck` whether the kernel granted its sockets' receive
//! buffers in full ([`BufferCap`]).

use super::{Feedback, RateMode, Reason};
use std::fmt;
use std::time::Duration;

/// What limited a transfer. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub enum Bottleneck {
    /// `--rate-fixed`: the rate was set, not found.
    FixedRate {
        /// The rate, bits per second.
        bps: u64,
    },
    /// The sender could not send as fast as it paced: its CPU, or the disk it reads from.
    Sender {
        /// What the channels sent, bits per second.
        sent_bps: u64,
        /// The mean pacing rate, bits per second.
        paced_bps: u64,
    },
    /// The user's `--rate` ceiling.
    RateCap {
        /// The ceiling, bits per second.
        bps: u64,
    },
    /// The ceiling the receiver offered: how fast it hashes, times its cores.
    ReceiverCeiling {
        /// The ceiling, bits per second.
        bps: u64,
    },
    /// The transfer ended while the rate was still growing from its start: round trips.
    Startup {
        /// The last rate, bits per second.
        bps: u64,
    },
    /// The receiver's disk: blocks waited for its writer.
    ReceiverDisk {
        /// Reports that showed the writer behind.
        reports: u64,
        /// The longest a block waited for the writer.
        longest_wait: Duration,
    },
    /// The receiver fell behind: its CPU.
    Receiver {
        /// Rate corrections for a receiver falling behind.
        corrections: u64,
    },
    /// The receiver fell behind with socket buffers the kernel capped below what it asked for.
    ReceiverBuffers {
        /// Rate corrections for a receiver falling behind.
        corrections: u64,
        /// What it got and what it asked for.
        cap: BufferCap,
    },
    /// The path.
    Path {
        /// The path's rate as `auto`'s model has it, bits per second.
        bps: Option<u64>,
        /// The share of datagrams random loss took.
        random_loss: Option<f64>,
    },
}

/// What the sender knows at the end of a transfer.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// The rate mode.
    pub mode: RateMode,
    /// The rate changes: (time since the first, bits per second, why), the first being the
    /// start. Of a long run, a sample spread over it (the controller's timeline): enough for
    /// the time-weighted rates, not for counting.
    pub changes: Vec<(Duration, u64, Reason)>,
    /// Every rate change by reason, the first rate not counted
    /// ([`super::RateController::reasons`]; [`Evidence::reasons_of`] counts a whole list).
    pub reasons: Vec<(Reason, u64)>,
    /// How long the rate was in force, from the first change to the end.
    pub paced_for: Duration,
    /// The user's `--rate`, bits per second (0: none).
    pub cap_bps: u64,
    /// The receiver's offered ceiling, bits per second (0: none).
    pub receiver_ceiling_bps: u64,
    /// Datagram bits the channels sent per second while paced.
    pub sent_bps: f64,
    /// `auto`'s model of the path's rate, bits per second.
    pub path_bps: Option<u64>,
    /// The random loss the controller estimated.
    pub random_loss: Option<f64>,
    /// What the receiver's reports said of its CPU and its disk.
    pub receiver: ReceiverSigns,
    /// The receiver's socket buffers, when the kernel granted less than it asked for.
    pub receiver_buffer: Option<BufferCap>,
}

/// A receive buffer the kernel granted smaller than asked for, per socket, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferCap {
    /// What the kernel granted.
    pub granted: u64,
    /// What the receiver asked for.
    pub wanted: u64,
}

impl BufferCap {
    /// A cap, when `granted` is less than `wanted` (both known, non-zero).
    pub fn of(granted: u64, wanted: u64) -> Option<BufferCap> {
        (granted > 0 && granted < wanted).then_some(BufferCap { granted, wanted })
    }
}

/// Counts of the receiver's reports that showed it behind, by cause (see
/// [`ReceiverSigns::note`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReceiverSigns {
    /// Reports in which its writer queue was over half full or a block waited in it longer
    /// than the queueing target: its disk.
    pub disk_reports: u64,
    /// Reports in which its socket buffers were over half full or dropped (and the writer
    /// was not behind): its CPU.
    pub cpu_reports: u64,
    /// The longest a block waited for the writer.
    pub longest_disk_wait: Duration,
}

impl ReceiverSigns {
    /// Takes one report; `target` is the queueing delay `auto` keeps under.
    pub fn note(&mut self, fb: &Feedback, target: Duration) {
        if fb.disk_fill > super::QUEUE_FILL_LIMIT || fb.disk_wait > target {
            self.disk_reports += 1;
            self.longest_disk_wait = self.longest_disk_wait.max(fb.disk_wait);
        } else if fb.queue_fill > super::QUEUE_FILL_LIMIT || fb.socket_drops > 0 {
            self.cpu_reports += 1;
        }
    }
}

/// Reports of a writer behind that make the disk the bottleneck, at least.
pub const DISK_REPORTS: u64 = 3;

/// Share of its time a rate must spend at a ceiling for the ceiling to be the bottleneck.
const AT_CEILING: f64 = 0.5;
/// Under this share of the receiver's offered ceiling its CPU had room to spare.
const CPU_TO_SPARE: f64 = 0.5;
/// Below this share of its pacing rate the sender itself is the bottleneck.
const SENDER_KEPT: f64 = 0.75;
/// The sender is judged only after this much pacing (short transfers are mostly setup and
/// tail, when channels wait with nothing to send).
const SENDER_JUDGED_AFTER: Duration = Duration::from_secs(1);

impl Evidence {
    /// The time-weighted mean pacing rate.
    fn mean_rate(&self) -> f64 {
        self.weighted(|_| 1.0) / self.paced_for.as_secs_f64().max(1e-9)
    }

    /// Share of the time the rate was at `level` or within 2% under it.
    fn share_at(&self, level: u64) -> f64 {
        let level = level as f64 * 0.98;
        let at = self.weighted(|r| if r >= level { 1.0 / r } else { 0.0 });
        at / self.paced_for.as_secs_f64().max(1e-9)
    }

    /// The sum over the intervals between changes of `rate x weight(rate) x seconds`.
    fn weighted(&self, weight: impl Fn(f64) -> f64) -> f64 {
        let mut sum = 0.0;
        for (i, &(at, bps, _)) in self.changes.iter().enumerate() {
            let until = self
                .changes
                .get(i + 1)
                .map_or(self.paced_for, |n| n.0)
                .min(self.paced_for);
            let secs = until.saturating_sub(at).as_secs_f64();
            let r = bps as f64;
            sum += r * weight(r) * secs;
        }
        sum
    }

    /// Counts a complete list of changes by reason, the first not counted, as the controller
    /// counts them.
    pub fn reasons_of(changes: &[(Duration, u64, Reason)]) -> Vec<(Reason, u64)> {
        let mut counts: Vec<(Reason, u64)> = Vec::new();
        for &(_, _, reason) in changes.iter().skip(1) {
            match counts.iter_mut().find(|c| c.0 == reason) {
                Some(c) => c.1 += 1,
                None => counts.push((reason, 1)),
            }
        }
        counts
    }

    /// Changes made for any of `reasons`.
    fn count(&self, reasons: &[Reason]) -> u64 {
        self.reasons
            .iter()
            .filter(|c| reasons.contains(&c.0))
            .map(|c| c.1)
            .sum()
    }
}

impl Bottleneck {
    /// Names what limited a transfer (see the module docs).
    pub fn classify(e: &Evidence) -> Bottleneck {
        if e.mode == RateMode::Fixed {
            return Bottleneck::FixedRate {
                bps: e.changes.first().map_or(0, |c| c.1),
            };
        }
        let paced = e.mean_rate();
        // The rate only ever grew from its start: the transfer ended before anything but
        // round trips limited it, unless the sender held it back. One that sent less than its
        // first rate moves in a second had little to send (a tiny file whose confirmation
        // was slow on a busy machine), however long it paced: not the sender.
        let in_startup = e
            .reasons
            .iter()
            .all(|c| matches!(c.0, Reason::Start | Reason::Startup));
        let start_bps = e.changes.first().map_or(0.0, |c| c.1 as f64);
        let little =
            e.sent_bps * e.paced_for.as_secs_f64() < start_bps * SENDER_JUDGED_AFTER.as_secs_f64();
        if !(in_startup && little)
            && e.paced_for >= SENDER_JUDGED_AFTER
            && e.sent_bps < paced * SENDER_KEPT
        {
            return Bottleneck::Sender {
                sent_bps: e.sent_bps as u64,
                paced_bps: paced as u64,
            };
        }
        if e.cap_bps > 0 && e.share_at(e.cap_bps) >= AT_CEILING {
            return Bottleneck::RateCap { bps: e.cap_bps };
        }
        if e.receiver_ceiling_bps > 0 && e.share_at(e.receiver_ceiling_bps) >= AT_CEILING {
            return Bottleneck::ReceiverCeiling {
                bps: e.receiver_ceiling_bps,
            };
        }
        if in_startup {
            return Bottleneck::Startup {
                bps: e.changes.last().map_or(0, |c| c.1),
            };
        }
        let receiver = e.count(&[Reason::Backlog, Reason::SocketDrops]);
        let path = e.count(&[Reason::Loss, Reason::Delay]);
        // A slow disk corrects the rate through the backlog and the queueing delay its writer
        // adds; the reports say whose they were.
        let signs = &e.receiver;
        if signs.disk_reports >= DISK_REPORTS
            && signs.disk_reports > signs.cpu_reports
            && receiver + path > 0
        {
            return Bottleneck::ReceiverDisk {
                reports: signs.disk_reports,
                longest_wait: signs.longest_disk_wait,
            };
        }
        if receiver > 0 && receiver >= path {
            // With capped buffers, a receiver that ran well under the ceiling it measured for
            // itself had CPU to spare: its buffers overflowed in bursts.
            let cpu_to_spare =
                e.receiver_ceiling_bps == 0 || paced < e.receiver_ceiling_bps as f64 * CPU_TO_SPARE;
            return match e.receiver_buffer.filter(|_| cpu_to_spare) {
                Some(cap) => Bottleneck::ReceiverBuffers {
                    corrections: receiver,
                    cap,
                },
                None => Bottleneck::Receiver {
                    corrections: receiver,
                },
            };
        }
        Bottleneck::Path {
            bps: e.path_bps,
            random_loss: e.random_loss,
        }
    }

    /// Short lowercase name, for JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Bottleneck::FixedRate { .. } => "fixed-rate",
            Bottleneck::Sender { .. } => "sender",
            Bottleneck::RateCap { .. } => "rate-cap",
            Bottleneck::ReceiverCeiling { .. } => "receiver-ceiling",
            Bottleneck::Startup { .. } => "startup",
            Bottleneck::ReceiverDisk { .. } => "receiver-disk",
            Bottleneck::Receiver { .. } => "receiver-cpu",
            Bottleneck::ReceiverBuffers { .. } => "receiver-buffers",
            Bottleneck::Path { .. } => "path",
        }
    }
}

impl Bottleneck {
    /// A few words for a progress line: "the path, about 412 Mbit/s, 1.00% random loss".
    pub fn brief(&self) -> String {
        match self {
            Bottleneck::FixedRate { bps } => format!("the fixed rate, {}", mbit(*bps)),
            Bottleneck::Sender { .. } => "the sender's CPU or disk".into(),
            Bottleneck::RateCap { bps } => format!("--rate {}", mbit(*bps)),
            Bottleneck::ReceiverCeiling { bps } => {
                format!("the receiver's hashing, {}", mbit(*bps))
            }
            Bottleneck::Startup { .. } => "round trips, the rate still growing".into(),
            Bottleneck::ReceiverDisk { .. } => "the receiver's disk".into(),
            Bottleneck::Receiver { .. } => "the receiver's CPU".into(),
            Bottleneck::ReceiverBuffers { cap, .. } => format!(
                "the receiver's socket buffers, {} (net.core.rmem_max)",
                bytes(cap.granted)
            ),
            Bottleneck::Path { bps, random_loss } => match (bps, random_loss) {
                (Some(b), Some(l)) => format!(
                    "the path, about {}, {:.2}% random loss",
                    mbit(*b),
                    l * 100.0
                ),
                (Some(b), None) => format!("the path, about {}", mbit(*b)),
                _ => "the path".into(),
            },
        }
    }
}

/// Bytes as KiB or MiB, whichever reads better.
fn bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n.div_ceil(1 << 10))
    }
}

fn mbit(bps: u64) -> String {
    format!("{:.0} Mbit/s", bps as f64 / 1e6)
}

impl fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bottleneck::FixedRate { bps } => write!(f, "the fixed rate ({})", mbit(*bps)),
            Bottleneck::Sender {
                sent_bps,
                paced_bps,
            } => write!(
                f,
                "the sender: its CPU or the disk it reads from (sent {} of the {} it paced at)",
                mbit(*sent_bps),
                mbit(*paced_bps)
            ),
            Bottleneck::RateCap { bps } => write!(f, "the --rate ceiling ({})", mbit(*bps)),
            Bottleneck::ReceiverCeiling { bps } => write!(
                f,
                "the receiver's CPU: the ceiling it offered, {}, how fast it hashes",
                mbit(*bps)
            ),
            Bottleneck::Startup { bps } => write!(
                f,
                "round trips: the transfer ended while the rate was still growing from its \
                 start (last {}), before it found what limits the path",
                mbit(*bps)
            ),
            Bottleneck::ReceiverDisk {
                reports,
                longest_wait,
            } => write!(
                f,
                "the receiver's disk: blocks waited for its writer in {reports} reports, up to \
                 {} ms",
                longest_wait.as_millis()
            ),
            Bottleneck::Receiver { corrections } => write!(
                f,
                "the receiver's CPU: it fell behind {} (its socket buffers filled or dropped)",
                if *corrections == 1 {
                    "once".to_string()
                } else {
                    format!("{corrections} times")
                }
            ),
            Bottleneck::ReceiverBuffers { corrections, cap } => write!(
                f,
                "the receiver's socket buffers: it fell behind {} with {} each, capped by \
                 net.core.rmem_max (it asked for {}; `sysctl -w net.core.rmem_max={}` on the \
                 receiver would grant them)",
                if *corrections == 1 {
                    "once".to_string()
                } else {
                    format!("{corrections} times")
                },
                bytes(cap.granted),
                bytes(cap.wanted),
                cap.wanted
            ),
            Bottleneck::Path { bps, random_loss } => {
                write!(f, "the path")?;
                match (bps, random_loss) {
                    (Some(b), Some(l)) => {
                        write!(f, " (about {}, {:.2}% random loss)", mbit(*b), l * 100.0)
                    }
                    (Some(b), None) => write!(f, " (about {})", mbit(*b)),
                    (None, Some(l)) => write!(f, " ({:.2}% random loss)", l * 100.0),
                    (None, None) => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(changes: &[(u64, u64, Reason)], secs: u64) -> Evidence {
        let changes: Vec<_> = changes
            .iter()
            .map(|&(ms, bps, r)| (Duration::from_millis(ms), bps, r))
            .collect();
        Evidence {
            mode: RateMode::Auto,
            reasons: Evidence::reasons_of(&changes),
            changes,
            paced_for: Duration::from_secs(secs),
            cap_bps: 0,
            receiver_ceiling_bps: 0,
            sent_bps: 400e6,
            path_bps: Some(450_000_000),
            random_loss: Some(0.01),
            receiver: ReceiverSigns::default(),
            receiver_buffer: None,
        }
    }

    const M: u64 = 1_000_000;

    #[test]
    fn a_writer_that_fell_behind_is_the_receivers_disk_not_the_path() {
        // A slow disk corrects the rate through queueing delay (the writer's wait is in it).
        let mut e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (500, 500 * M, Reason::Startup),
                (900, 200 * M, Reason::Delay),
                (3000, 180 * M, Reason::Delay),
            ],
            10,
        );
        let fb = |disk_fill: f64, disk_ms: u64, queue_fill: f64, drops: u64| Feedback {
            train_rate: None,
            interval: Duration::from_millis(50),
            bytes: 1,
            datagrams: 1,
            lost: 0,
            socket_drops: drops,
            queue_delay: Duration::from_millis(disk_ms),
            queue_fill,
            receiver_lag: Duration::ZERO,
            disk_wait: Duration::from_millis(disk_ms),
            disk_fill,
        };
        let target = Duration::from_millis(15);
        for _ in 0..5 {
            e.receiver.note(&fb(0.9, 40, 0.9, 0), target);
        }
        e.receiver.note(&fb(0.0, 0, 0.8, 3), target);
        e.receiver.note(&fb(0.1, 2, 0.1, 0), target);
        assert_eq!(
            e.receiver,
            ReceiverSigns {
                disk_reports: 5,
                cpu_reports: 1,
                longest_disk_wait: Duration::from_millis(40)
            }
        );
        let b = Bottleneck::classify(&e);
        assert_eq!(b.name(), "receiver-disk", "{b:?}");
        assert_eq!(
            b.to_string(),
            "the receiver's disk: blocks waited for its writer in 5 reports, up to 40 ms"
        );
        // Its CPU behind more often than its writer: the CPU.
        for _ in 0..5 {
            e.receiver.note(&fb(0.0, 0, 0.8, 3), target);
        }
        e.changes
            .push((Duration::from_secs(4), 150 * M, Reason::SocketDrops));
        e.changes
            .push((Duration::from_secs(5), 140 * M, Reason::Backlog));
        e.reasons = Evidence::reasons_of(&e.changes);
        assert_eq!(Bottleneck::classify(&e).name(), "receiver-cpu");
    }

    #[test]
    fn a_transfer_that_ended_while_the_rate_grew_names_round_trips_not_the_path() {
        let mut e = evidence(
            &[(0, 100 * M, Reason::Start), (200, 218 * M, Reason::Startup)],
            0,
        );
        let b = Bottleneck::classify(&e);
        assert_eq!(b, Bottleneck::Startup { bps: 218 * M });
        assert_eq!(
            b.to_string(),
            "round trips: the transfer ended while the rate was still growing from its start \
             (last 218 Mbit/s), before it found what limits the path"
        );
        assert_eq!(b.name(), "startup");
        // Once the rate settled, what held it is named.
        e.changes
            .push((Duration::from_millis(400), 480 * M, Reason::Cruise));
        e.reasons = Evidence::reasons_of(&e.changes);
        assert_eq!(Bottleneck::classify(&e).name(), "path");
    }

    #[test]
    fn corrections_are_counted_from_every_change_not_from_the_sample_of_a_long_run() {
        // The timeline of a long run keeps a sample; the corrections it skipped still count.
        let mut e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (500, 500 * M, Reason::Startup),
                (900, 400 * M, Reason::Delay),
                (3000, 420 * M, Reason::Cruise),
            ],
            10,
        );
        assert_eq!(Bottleneck::classify(&e).name(), "path");
        e.reasons.push((Reason::Backlog, 2));
        assert_eq!(
            Bottleneck::classify(&e),
            Bottleneck::Receiver { corrections: 2 }
        );
        // Nor is a run in startup that corrected its rate where the sample does not show it.
        let mut grew = evidence(
            &[(0, 100 * M, Reason::Start), (200, 218 * M, Reason::Startup)],
            1,
        );
        assert_eq!(Bottleneck::classify(&grew).name(), "startup");
        grew.reasons.push((Reason::Loss, 1));
        assert_eq!(Bottleneck::classify(&grew).name(), "path");
    }

    #[test]
    fn a_path_that_showed_loss_and_queues_is_the_path() {
        let e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (500, 500 * M, Reason::Startup),
                (900, 400 * M, Reason::Delay),
                (3000, 420 * M, Reason::Cruise),
                (6000, 400 * M, Reason::Loss),
            ],
            10,
        );
        let b = Bottleneck::classify(&e);
        assert_eq!(b.name(), "path");
        assert_eq!(
            b.to_string(),
            "the path (about 450 Mbit/s, 1.00% random loss)"
        );
    }

    #[test]
    fn a_receiver_that_fell_behind_more_often_than_the_path_showed_congestion_is_the_receiver() {
        let e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (500, 500 * M, Reason::Backlog),
                (900, 400 * M, Reason::SocketDrops),
                (3000, 420 * M, Reason::Delay),
            ],
            10,
        );
        assert_eq!(
            Bottleneck::classify(&e),
            Bottleneck::Receiver { corrections: 2 }
        );
    }

    #[test]
    fn a_receiver_behind_with_capped_buffers_names_the_buffers_and_the_sysctl() {
        let mut e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (500, 500 * M, Reason::Backlog),
                (900, 400 * M, Reason::SocketDrops),
                (3000, 420 * M, Reason::Delay),
            ],
            10,
        );
        // Linux's default rmem_max (208 KiB) against hurtle's 4 MiB.
        e.receiver_buffer = BufferCap::of(212_992, 4 << 20);
        let b = Bottleneck::classify(&e);
        assert_eq!(b.name(), "receiver-buffers", "{b:?}");
        assert_eq!(
            b.to_string(),
            "the receiver's socket buffers: it fell behind 2 times with 208 KiB each, capped by \
             net.core.rmem_max (it asked for 4 MiB; `sysctl -w net.core.rmem_max=4194304` on the \
             receiver would grant them)"
        );
        assert_eq!(
            b.brief(),
            "the receiver's socket buffers, 208 KiB (net.core.rmem_max)"
        );
        // Capped buffers on a receiver that kept up: the path, as before.
        let mut path = evidence(
            &[(0, 100 * M, Reason::Start), (900, 400 * M, Reason::Loss)],
            10,
        );
        path.receiver_buffer = e.receiver_buffer;
        assert_eq!(Bottleneck::classify(&path).name(), "path");
        // A receiver that ran near the ceiling it offered: its CPU, capped buffers or not.
        e.receiver_ceiling_bps = 500 * M;
        assert_eq!(Bottleneck::classify(&e).name(), "receiver-cpu");
        e.receiver_ceiling_bps = 2000 * M;
        assert_eq!(Bottleneck::classify(&e).name(), "receiver-buffers");
        // Granted in full, or unknown: no cap.
        assert_eq!(BufferCap::of(4 << 20, 4 << 20), None);
        assert_eq!(BufferCap::of(0, 4 << 20), None);
    }

    #[test]
    fn ceilings_name_themselves_when_they_held_the_rate_half_the_time() {
        let mut e = evidence(
            &[
                (0, 100 * M, Reason::Start),
                (1000, 300 * M, Reason::Startup),
            ],
            10,
        );
        e.sent_bps = 280e6;
        e.cap_bps = 300 * M;
        assert_eq!(
            Bottleneck::classify(&e),
            Bottleneck::RateCap { bps: 300 * M }
        );
        e.cap_bps = 0;
        e.receiver_ceiling_bps = 300 * M;
        assert_eq!(
            Bottleneck::classify(&e).name(),
            "receiver-ceiling",
            "{:?}",
            Bottleneck::classify(&e)
        );
        // At the ceiling only briefly: not the ceiling.
        let mut brief = evidence(
            &[(0, 300 * M, Reason::Start), (1000, 200 * M, Reason::Delay)],
            10,
        );
        brief.sent_bps = 200e6;
        brief.cap_bps = 300 * M;
        assert_eq!(Bottleneck::classify(&brief).name(), "path");
    }

    #[test]
    fn a_sender_that_sent_far_less_than_it_paced_is_the_sender_but_not_in_a_short_transfer() {
        let mut e = evidence(
            &[(0, 400 * M, Reason::Start), (0, 400 * M, Reason::Cruise)],
            10,
        );
        e.sent_bps = 200e6;
        assert_eq!(
            Bottleneck::classify(&e),
            Bottleneck::Sender {
                sent_bps: 200 * M,
                paced_bps: 400 * M
            }
        );
        e.paced_for = Duration::from_millis(500);
        assert_eq!(Bottleneck::classify(&e).name(), "path");
        // A transfer that never left its first rate sent little because it had little to
        // send (a tiny file, its confirmation slow on a busy machine): round trips, however
        // long it paced.
        let mut tiny = evidence(&[(0, 100 * M, Reason::Start)], 2);
        tiny.sent_bps = 8e3;
        assert_eq!(Bottleneck::classify(&tiny).name(), "startup");
        // One that sent a disk's 30 Mbit/s for ten seconds, its rate never grown (too little
        // was delivered for startup's rounds to count): the sender.
        let mut slow = evidence(&[(0, 100 * M, Reason::Start)], 10);
        slow.sent_bps = 30e6;
        assert_eq!(Bottleneck::classify(&slow).name(), "sender");
    }

    #[test]
    fn a_fixed_rate_is_named_as_such() {
        let mut e = evidence(&[(0, 900 * M, Reason::Start)], 10);
        e.mode = RateMode::Fixed;
        assert_eq!(e.mean_rate() as u64, 900 * M);
        assert_eq!(
            Bottleneck::classify(&e).to_string(),
            "the fixed rate (900 Mbit/s)"
        );
    }
}
