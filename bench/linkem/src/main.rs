//! linkem — a user-space link emulator for hurtle's benchmarks.
//!
//! linkem attaches to two layer-3 TUN devices, `tunA` and `tunB`, and
//! forwards every IP packet read from one to the other, applying per
//! direction: one-way delay, jitter, random (optionally bursty) loss, a rate
//! limit with a bounded drop-tail queue, reordering and duplication. The
//! decisions come from a seeded PRNG, so runs repeat. See [`model`] for the
//! exact semantics and `bench/README.md` for the namespace topology the
//! benchmark harness builds around it (the kernel routes traffic from host A
//! into `tunA` and from host B into `tunB`; linkem writes each packet into
//! the other TUN, where the kernel routes it on to its destination).
//!
//! One thread per direction reads packets in batches (non-blocking reads
//! until `EAGAIN`), queues them in a delay line ordered by release time, and
//! writes them out when due; it sleeps in `ppoll` with a nanosecond timeout
//! (1 µs timer slack) and busy-polls only the last `--spin` before a release.
//! With `--slack`, a release also writes what falls due within the slack after
//! it, so the thread wakes at most once per slack instead of once per packet
//! (a NIC that coalesces interrupts delivers in such lumps too). With `--gso`,
//! consecutive packets of one flow in such a lump go out as one GSO write
//! ([`gso`]): one system call and one trip through the kernel's forwarding
//! path instead of one per packet, the most expensive part of forwarding.
//! With `--outage-at`, the link goes down in both directions for
//! `--outage-for` once that many bytes have entered it from A ([`model::Outage`]).
//! The main thread handles SIGINT/SIGTERM/SIGHUP synchronously, prints
//! periodic statistics if asked and final statistics on exit.
//!
//! linkem never interprets packets beyond a sanity check of the IP header
//! length fields; anything that fails it is counted as `malformed` and
//! dropped, never panicked on.

mod gso;
mod model;
mod sys;
mod units;

use std::fs::File;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Arg, ArgAction, ArgMatches, Command};

use model::{DelayLine, DirConfig, Impairer, Outage, OutageFate, Outcome};

/// One impairment parameter: its flag name, help text, default and parser.
struct Param {
    name: &'static str,
    help: &'static str,
    default: &'static str,
}

const PARAMS: &[Param] = &[
    Param {
        name: "delay",
        help: "one-way propagation delay (e.g. 40ms, 500us)",
        default: "0",
    },
    Param {
        name: "jitter",
        help: "delay jitter amplitude, uniform in [-J, +J]; never reorders",
        default: "0",
    },
    Param {
        name: "loss",
        help: "random loss probability (0.01 or 1%)",
        default: "0",
    },
    Param {
        name: "loss-burst",
        help: "mean loss burst length in packets (1 = independent; >1 = Gilbert-Elliott)",
        default: "1",
    },
    Param {
        name: "rate",
        help: "bottleneck rate in bit/s (300M, 1G); 0 = unlimited",
        default: "0",
    },
    Param {
        name: "queue",
        help: "bottleneck drop-tail queue limit in bytes (256k, 4M)",
        default: "256k",
    },
    Param {
        name: "reorder",
        help: "probability that a packet is held back and overtaken",
        default: "0",
    },
    Param {
        name: "reorder-delay",
        help: "extra delay of a reordered packet",
        default: "1ms",
    },
    Param {
        name: "dup",
        help: "duplication probability",
        default: "0",
    },
    Param {
        name: "seed",
        help: "PRNG seed (b2a uses a derived seed unless --b2a-seed is given)",
        default: "1",
    },
];

fn cli() -> Command {
    let mut cmd = Command::new("linkem")
        .about("User-space link emulator between two TUN devices (hurtle bench tooling)")
        .long_about(
            "Forwards IP packets between two TUN devices, applying per direction delay, \
             jitter, loss, a rate limit with a drop-tail queue, reordering and duplication. \
             Each impairment flag sets both directions; --a2b-X / --b2a-X override one \
             direction (a2b = read from --tun-a, written to --tun-b). Statistics go to \
             stderr periodically (--stats-interval) and on SIGINT/SIGTERM.",
        )
        .arg(
            Arg::new("tun-a")
                .long("tun-a")
                .default_value("tunA")
                .help("TUN device on host A's side (attached or created)"),
        )
        .arg(
            Arg::new("tun-b")
                .long("tun-b")
                .default_value("tunB")
                .help("TUN device on host B's side (attached or created)"),
        )
        .arg(
            Arg::new("stats-interval")
                .long("stats-interval")
                .default_value("0")
                .help("print statistics every this often (e.g. 1s); 0 = only at exit"),
        )
        .arg(
            Arg::new("spin")
                .long("spin")
                .default_value("10us")
                .help("busy-poll instead of sleeping when the next release is this close"),
        )
        .arg(Arg::new("slack").long("slack").default_value("0").help(
            "release packets due within this long after a due one with it \
                     (up to this early), so a thread wakes at most once per slack; \
                     0 = every packet at its own time",
        ))
        .arg(Arg::new("gso").long("gso").action(ArgAction::SetTrue).help(
            "write consecutive packets of one flow released together as one GSO \
                     super-packet (IFF_VNET_HDR), which the kernel segments again",
        ))
        .arg(
            Arg::new("batch")
                .long("batch")
                .default_value("64")
                .value_parser(clap::value_parser!(u32).range(1..=4096))
                .help("max packets read per batch before releasing due packets"),
        )
        .arg(
            Arg::new("max-held")
                .long("max-held")
                .default_value("512M")
                .help("memory bound: bytes held in the delay line per direction"),
        )
        .arg(
            Arg::new("rt-priority")
                .long("rt-priority")
                .default_value("0")
                .value_parser(clap::value_parser!(i32).range(0..=99))
                .help("SCHED_FIFO priority for the forwarding threads (0 = normal scheduling)"),
        )
        .arg(
            Arg::new("outage-at")
                .long("outage-at")
                .default_value("0")
                .help(
                    "take the link down, both ways, once this many bytes have entered it \
                     from A (e.g. 256M); 0 = never",
                ),
        )
        .arg(
            Arg::new("outage-for")
                .long("outage-for")
                .default_value("3s")
                .help("how long the link stays down (--outage-at)"),
        )
        .arg(
            Arg::new("label")
                .long("label")
                .default_value("linkem")
                .help("prefix for the statistics lines"),
        );
    for p in PARAMS {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        cmd = cmd
            .arg(
                Arg::new(p.name)
                    .long(p.name)
                    .default_value(p.default)
                    .help(p.help)
                    .action(ArgAction::Set),
            )
            .arg(
                Arg::new(leak(format!("a2b-{}", p.name)))
                    .long(leak(format!("a2b-{}", p.name)))
                    .hide_short_help(true)
                    .help(leak(format!("A->B only: {}", p.help))),
            )
            .arg(
                Arg::new(leak(format!("b2a-{}", p.name)))
                    .long(leak(format!("b2a-{}", p.name)))
                    .hide_short_help(true)
                    .help(leak(format!("B->A only: {}", p.help))),
            );
    }
    cmd
}

/// Build one direction's config from the symmetric flags and its overrides.
fn dir_config(m: &ArgMatches, dir: &str) -> Result<DirConfig> {
    let get = |name: &str| -> (String, bool) {
        let key = format!("{dir}-{name}");
        match m.get_one::<String>(&key) {
            Some(v) => (v.clone(), true),
            None => (
                m.get_one::<String>(name)
                    .cloned()
                    .unwrap_or_else(|| "0".into()),
                false,
            ),
        }
    };
    let ctx = |name: &str| format!("--{dir}-{name} / --{name}");
    let burst: f64 = get("loss-burst")
        .0
        .parse()
        .with_context(|| ctx("loss-burst"))?;
    anyhow::ensure!(
        burst.is_finite() && burst >= 1.0,
        "--loss-burst must be >= 1"
    );
    let (seed_s, seed_overridden) = get("seed");
    let mut seed: u64 = seed_s.parse().with_context(|| ctx("seed"))?;
    if dir == "b2a" && !seed_overridden {
        seed ^= 0xB2A0_5EED_0000_0000;
    }
    Ok(DirConfig {
        delay_ns: units::parse_duration_ns(&get("delay").0).with_context(|| ctx("delay"))?,
        jitter_ns: units::parse_duration_ns(&get("jitter").0).with_context(|| ctx("jitter"))?,
        loss: units::parse_prob(&get("loss").0).with_context(|| ctx("loss"))?,
        loss_burst: burst,
        rate_bps: units::parse_rate_bps(&get("rate").0).with_context(|| ctx("rate"))?,
        queue_bytes: units::parse_bytes(&get("queue").0).with_context(|| ctx("queue"))?,
        reorder: units::parse_prob(&get("reorder").0).with_context(|| ctx("reorder"))?,
        reorder_delay_ns: units::parse_duration_ns(&get("reorder-delay").0)
            .with_context(|| ctx("reorder-delay"))?,
        dup: units::parse_prob(&get("dup").0).with_context(|| ctx("dup"))?,
        seed,
    })
}

/// Counters of one direction, shared with the printing thread.
#[derive(Default)]
struct DirStats {
    pkts_in: AtomicU64,
    bytes_in: AtomicU64,
    pkts_out: AtomicU64,
    bytes_out: AtomicU64,
    lost: AtomicU64,
    queue_drop: AtomicU64,
    overflow: AtomicU64,
    dup: AtomicU64,
    reordered: AtomicU64,
    malformed: AtomicU64,
    outage: AtomicU64,
    read_err: AtomicU64,
    write_err: AtomicU64,
    held: AtomicU64,
    late_max_ns: AtomicU64,
    late_sum_ns: AtomicU64,
    stalls: AtomicU64,
    stall_ns: AtomicU64,
    sleeps: AtomicU64,
    writes: AtomicU64,
}

/// A forwarding thread that ran this much later than it meant to (a loop iteration that long,
/// or a wake-up that late) was stalled: neither reading nor releasing, so the link it emulates
/// idled unless its queue held packets.
const STALL_NS: u64 = 200_000;

impl DirStats {
    fn line(&self, label: &str, dir: &str, secs: f64) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let out = g(&self.pkts_out);
        let late_avg_us = if out > 0 {
            g(&self.late_sum_ns) as f64 / out as f64 / 1e3
        } else {
            0.0
        };
        format!(
            "{label}: {dir} t={secs:.1}s in={} out={} bytes_in={} bytes_out={} lost={} \
             queue_drop={} overflow={} dup={} reordered={} malformed={} outage={} read_err={} \
             write_err={} held={} late_avg_us={late_avg_us:.1} late_max_us={:.1} \
             out_mbps={:.1} stalls={} stall_ms={:.1} sleeps={} writes={}",
            g(&self.pkts_in),
            out,
            g(&self.bytes_in),
            g(&self.bytes_out),
            g(&self.lost),
            g(&self.queue_drop),
            g(&self.overflow),
            g(&self.dup),
            g(&self.reordered),
            g(&self.malformed),
            g(&self.outage),
            g(&self.read_err),
            g(&self.write_err),
            g(&self.held),
            g(&self.late_max_ns) as f64 / 1e3,
            if secs > 0.0 {
                g(&self.bytes_out) as f64 * 8.0 / secs / 1e6
            } else {
                0.0
            },
            g(&self.stalls),
            g(&self.stall_ns) as f64 / 1e6,
            g(&self.sleeps),
            g(&self.writes),
        )
    }

    /// Counts a stall of `ns` if it is one ([`STALL_NS`]).
    fn stalled(&self, ns: u64) {
        if ns > STALL_NS {
            self.stalls.fetch_add(1, Relaxed);
            self.stall_ns.fetch_add(ns, Relaxed);
        }
    }
}

/// Cheap sanity check of an IP packet read from a TUN device.
fn plausible_ip(p: &[u8]) -> bool {
    match p.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = (p[0] & 0x0f) as usize * 4;
            ihl >= 20 && p.len() >= ihl && p.len() >= 20
        }
        Some(6) => p.len() >= 40,
        _ => false,
    }
}

struct Forwarder {
    input: Arc<File>,
    output: Arc<File>,
    model: Impairer,
    outage: Arc<Outage>,
    /// This thread forwards from A (whose bytes begin the outage).
    from_a: bool,
    stats: Arc<DirStats>,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    spin_ns: u64,
    slack_ns: u64,
    gso: bool,
    batch: u32,
    max_held: usize,
    rt_priority: i32,
    label: String,
}

impl Forwarder {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn run(mut self) {
        sys::set_timer_slack_ns(1_000);
        if self.rt_priority > 0 {
            if let Err(e) = sys::set_fifo_priority(self.rt_priority) {
                eprintln!("{}: warning: {e:#}", self.label);
            }
        }
        let mut line: DelayLine<Vec<u8>> = DelayLine::default();
        let mut pool: Vec<Vec<u8>> = Vec::new();
        let mut lump: Vec<Vec<u8>> = Vec::new();
        let mut hdr = Vec::new();
        let mut buf = vec![0u8; 65_536 + gso::VNET_HDR_LEN];
        let skip = if self.gso { gso::VNET_HDR_LEN } else { 0 };
        let st = Arc::clone(&self.stats);
        // When the thread last knew it was running (after a batch, or back from a wait).
        let mut mark = self.now();
        while !self.stop.load(Relaxed) {
            // 1. Release everything that is due and, once something is, what falls due
            //    within the slack after it.
            let now = self.now();
            st.stalled(now.saturating_sub(mark));
            let horizon = match line.next_at() {
                Some(t) if t <= now => now + self.slack_ns,
                _ => now,
            };
            while let Some((due, pkt)) = line.pop_due(horizon, |p| p.len()) {
                let late = now.saturating_sub(due);
                st.late_sum_ns.fetch_add(late, Relaxed);
                st.late_max_ns.fetch_max(late, Relaxed);
                lump.push(pkt);
            }
            self.write_lump(&lump, &mut hdr);
            for pkt in lump.drain(..) {
                if pool.len() < 8192 {
                    pool.push(pkt);
                }
            }
            // 2. Read a batch.
            let mut got = 0;
            while got < self.batch {
                match (&*self.input).read(&mut buf) {
                    Ok(n) if n >= skip && (skip == 0 || gso::plain(&buf[..skip])) => {
                        got += 1;
                        self.admit(&buf[skip..n], &mut line, &mut pool);
                    }
                    Ok(_) => {
                        got += 1;
                        st.malformed.fetch_add(1, Relaxed);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        st.read_err.fetch_add(1, Relaxed);
                        // e.g. the device went away: don't spin on errors.
                        thread::sleep(Duration::from_millis(1));
                        break;
                    }
                }
            }
            st.held.store(
                if line.is_empty() {
                    0
                } else {
                    line.len() as u64
                },
                Relaxed,
            );
            mark = self.now();
            if got > 0 {
                continue;
            }
            // 3. Idle: sleep until input arrives or the next release is near.
            let now = self.now();
            match line.next_at() {
                Some(t) if t <= now + self.spin_ns => {
                    // Busy-poll the last stretch before a release.
                    std::hint::spin_loop();
                }
                Some(t) => {
                    let deadline = t - self.spin_ns / 2;
                    st.sleeps.fetch_add(1, Relaxed);
                    sys::wait_readable(&self.input, Duration::from_nanos(deadline - now));
                    mark = self.now();
                    st.stalled(mark.saturating_sub(deadline));
                }
                None => {
                    sys::wait_readable(&self.input, Duration::from_millis(100));
                    mark = self.now();
                }
            }
        }
    }

    /// Writes the packets released together, in order: each alone, or with
    /// `--gso` in runs of one flow ([`gso::Run`]), one write per run.
    fn write_lump(&self, lump: &[Vec<u8>], hdr: &mut Vec<u8>) {
        let st = &self.stats;
        let mut i = 0;
        while i < lump.len() {
            let (n, wrote) = if self.gso {
                // The longest run from packet i on; its header, then each packet's payload.
                let mut run = gso::Run::start(&lump[i]);
                while i + run.len() < lump.len() && run.can_join(&lump[i + run.len()]) {}
                let n = run.len();
                let skip = run.header(hdr);
                let mut iov = [IoSlice::new(&[]); gso::MAX_RUN + 1];
                iov[0] = IoSlice::new(hdr);
                for (slot, p) in iov[1..].iter_mut().zip(&lump[i..i + n]) {
                    *slot = IoSlice::new(&p[skip..]);
                }
                (n, (&*self.output).write_vectored(&iov[..=n]))
            } else {
                (1, (&*self.output).write(&lump[i]))
            };
            st.writes.fetch_add(1, Relaxed);
            match wrote {
                Ok(_) => {
                    let bytes: usize = lump[i..i + n].iter().map(Vec::len).sum();
                    st.pkts_out.fetch_add(n as u64, Relaxed);
                    st.bytes_out.fetch_add(bytes as u64, Relaxed);
                }
                Err(_) => {
                    st.write_err.fetch_add(n as u64, Relaxed);
                }
            }
            i += n;
        }
    }

    fn admit(&mut self, pkt: &[u8], line: &mut DelayLine<Vec<u8>>, pool: &mut Vec<Vec<u8>>) {
        let st = &self.stats;
        if !plausible_ip(pkt) {
            st.malformed.fetch_add(1, Relaxed);
            return;
        }
        st.pkts_in.fetch_add(1, Relaxed);
        let bytes_in = st.bytes_in.fetch_add(pkt.len() as u64, Relaxed) + pkt.len() as u64;
        let now = self.now();
        match self.outage.offer(now, self.from_a.then_some(bytes_in)) {
            OutageFate::Up => {}
            fate => {
                if fate == OutageFate::Begun {
                    eprintln!(
                        "{}: outage: link down at t={:.3}s",
                        self.label,
                        now as f64 / 1e9
                    );
                }
                st.outage.fetch_add(1, Relaxed);
                return;
            }
        }
        if line.bytes() + pkt.len() > self.max_held {
            st.overflow.fetch_add(1, Relaxed);
            return;
        }
        let (first, second) = self.model.admit(now, pkt.len());
        if second.is_some() {
            st.dup.fetch_add(1, Relaxed);
        }
        for o in std::iter::once(first).chain(second) {
            match o {
                Outcome::Deliver {
                    release_ns,
                    reordered,
                } => {
                    if reordered {
                        st.reordered.fetch_add(1, Relaxed);
                    }
                    let mut v = pool.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(pkt);
                    line.push(release_ns, !reordered, pkt.len(), v);
                }
                Outcome::Lost => {
                    st.lost.fetch_add(1, Relaxed);
                }
                Outcome::QueueDrop => {
                    st.queue_drop.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

fn describe(c: &DirConfig) -> String {
    format!(
        "delay={}us jitter={}us loss={} burst={} rate={}bps queue={}B reorder={} \
         reorder_delay={}us dup={} seed={}",
        c.delay_ns / 1000,
        c.jitter_ns / 1000,
        c.loss,
        c.loss_burst,
        c.rate_bps,
        c.queue_bytes,
        c.reorder,
        c.reorder_delay_ns / 1000,
        c.dup,
        c.seed
    )
}

fn main() -> Result<()> {
    let m = cli().get_matches();
    let a2b = dir_config(&m, "a2b")?;
    let b2a = dir_config(&m, "b2a")?;
    let label = m.get_one::<String>("label").cloned().unwrap_or_default();
    let interval = units::parse_duration_ns(m.get_one::<String>("stats-interval").unwrap())
        .context("--stats-interval")?;
    let spin_ns =
        units::parse_duration_ns(m.get_one::<String>("spin").unwrap()).context("--spin")?;
    let slack_ns =
        units::parse_duration_ns(m.get_one::<String>("slack").unwrap()).context("--slack")?;
    let max_held =
        units::parse_bytes(m.get_one::<String>("max-held").unwrap()).context("--max-held")?;
    let batch = *m.get_one::<u32>("batch").unwrap();
    let outage = Arc::new(Outage::new(
        units::parse_bytes(m.get_one::<String>("outage-at").unwrap()).context("--outage-at")?,
        units::parse_duration_ns(m.get_one::<String>("outage-for").unwrap())
            .context("--outage-for")?,
    ));
    let gso = m.get_flag("gso");
    let rt_priority = *m.get_one::<i32>("rt-priority").unwrap();

    // Block the stop signals before any thread exists so all inherit it.
    sys::block_stop_signals()?;

    let tun_a = Arc::new(sys::open_tun(m.get_one::<String>("tun-a").unwrap(), gso)?);
    let tun_b = Arc::new(sys::open_tun(m.get_one::<String>("tun-b").unwrap(), gso)?);
    eprintln!("{label}: a2b {}", describe(&a2b));
    eprintln!("{label}: b2a {}", describe(&b2a));

    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let stats_a2b = Arc::new(DirStats::default());
    let stats_b2a = Arc::new(DirStats::default());
    let mk = |input: &Arc<File>,
              output: &Arc<File>,
              cfg: DirConfig,
              from_a: bool,
              stats: &Arc<DirStats>| Forwarder {
        input: Arc::clone(input),
        output: Arc::clone(output),
        model: Impairer::new(cfg),
        outage: Arc::clone(&outage),
        from_a,
        stats: Arc::clone(stats),
        stop: Arc::clone(&stop),
        epoch,
        spin_ns,
        slack_ns,
        gso,
        batch,
        max_held: max_held as usize,
        rt_priority,
        label: label.clone(),
    };
    let fa = mk(&tun_a, &tun_b, a2b, true, &stats_a2b);
    let fb = mk(&tun_b, &tun_a, b2a, false, &stats_b2a);
    let ha = thread::Builder::new()
        .name("a2b".into())
        .spawn(move || fa.run())?;
    let hb = thread::Builder::new()
        .name("b2a".into())
        .spawn(move || fb.run())?;
    eprintln!("{label}: ready");

    let tick = if interval > 0 {
        Duration::from_nanos(interval)
    } else {
        Duration::from_millis(500)
    };
    let mut signal = None;
    while signal.is_none() {
        signal = sys::wait_stop_signal(tick);
        if ha.is_finished() || hb.is_finished() {
            eprintln!("{label}: a forwarding thread stopped unexpectedly");
            break;
        }
        if interval > 0 && signal.is_none() {
            let secs = epoch.elapsed().as_secs_f64();
            eprintln!("{}", stats_a2b.line(&label, "a2b", secs));
            eprintln!("{}", stats_b2a.line(&label, "b2a", secs));
        }
    }
    stop.store(true, Relaxed);
    let ok = ha.join().is_ok() & hb.join().is_ok();
    let secs = epoch.elapsed().as_secs_f64();
    eprintln!("{} final", stats_a2b.line(&label, "a2b", secs));
    eprintln!("{} final", stats_b2a.line(&label, "b2a", secs));
    if let Some(s) = signal {
        eprintln!("{label}: stopped by signal {s}");
    }
    anyhow::ensure!(ok, "a forwarding thread panicked");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        cli().debug_assert();
    }

    #[test]
    fn overrides_apply_per_direction() {
        let m = cli().get_matches_from([
            "linkem",
            "--delay",
            "40ms",
            "--loss",
            "1%",
            "--b2a-delay",
            "5ms",
            "--a2b-rate",
            "300M",
        ]);
        let a = dir_config(&m, "a2b").unwrap();
        let b = dir_config(&m, "b2a").unwrap();
        assert_eq!(a.delay_ns, 40_000_000);
        assert_eq!(b.delay_ns, 5_000_000);
        assert_eq!(a.rate_bps, 300_000_000);
        assert_eq!(b.rate_bps, 0);
        assert_eq!(a.loss, 0.01);
        assert_eq!(b.loss, 0.01);
        assert_ne!(a.seed, b.seed);
    }

    #[test]
    fn malformed_packets_are_rejected_not_panicked_on() {
        assert!(!plausible_ip(&[]));
        assert!(!plausible_ip(&[0x45]));
        assert!(!plausible_ip(&[0x4f; 40])); // IHL 60 > len
        assert!(!plausible_ip(&[0x60; 39]));
        assert!(!plausible_ip(&[0x00; 100]));
        assert!(plausible_ip(&[0x45; 20]));
        assert!(plausible_ip(&[0x60; 40]));
        for len in 0..64 {
            for first in [0u8, 0x40, 0x41, 0x45, 0x4f, 0x60, 0xff] {
                let mut p = vec![0u8; len];
                if let Some(b) = p.first_mut() {
                    *b = first;
                }
                let _ = plausible_ip(&p);
            }
        }
    }
}
