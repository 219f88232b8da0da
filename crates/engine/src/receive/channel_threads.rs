//! The channel threads: each serves one or more channels' links ([`serve_channels`]), reading
//! in batches and letting datagrams gather while the session is slow ([`SlowFlow`],
//! [`gather_time`]), in pauses that end just before the session loop's next report
//! ([`report_pause`]); a channel ([`ChannelWorker`]) checks every datagram
//! ([`ChannelWorker::on_datagram`]), gathers blocks, spills the oldest when buffers run short,
//! hands complete ones on, and sends NACKs and its completion.

use super::gathering::{Gathering, Gatherings};
use super::shared::{ChanCmd, ChanEvent, Shared};
use super::writer::{write_block, Writer, Written};
use crate::error::SessionError;
use crate::net::channel_link::{InPath, LinkIn};
use crate::net::dial::RELAY_TAG;
use crate::net::punch::{PunchStep, SocketPunch};
use crate::net::udp::{RecvBatch, GRO_BUF_SIZE};
use crate::netlog::NetLog;
use crate::progress::Route;
use crossbeam_channel::{Receiver as ChanRx, Sender};
use hurtle_proto::admit::{Admit, Placed, RejectReason, Tally};
use hurtle_proto::fec::{self, ParityStore};
use hurtle_proto::hash::{block_value, BlockHasher};
use hurtle_proto::punch::Role;
use hurtle_proto::rate::SHORT_REPORT_STRETCH_MAX;
use hurtle_proto::wire::Control;
use hurtle_proto::{Admission, ChannelReceiver};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a channel thread samples its socket's receive queue.
const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(1);

pub(super) struct ChannelWorker {
    pub(super) ch: u16,
    pub(super) rec: ChannelReceiver,
    pub(super) shared: Arc<Shared>,
    pub(super) cmds: ChanRx<ChanCmd>,
    pub(super) events: Sender<ChanEvent>,
    /// Incomplete blocks being gathered in memory, oldest first (for spilling).
    pub(super) buffers: Gatherings,
    pub(super) pool: Vec<Vec<u8>>,
    /// Where complete blocks go to be written, if not written on this thread.
    pub(super) writer: Option<Writer>,
    pub(super) max_buffers: usize,
    /// Blocks whose bytes go straight to the file; value: the block's file start.
    pub(super) spilled: HashMap<u64, u64>,
    /// Blocks fetched again after a failed check: their first copy was written.
    pub(super) refetched: HashSet<u64>,
    pub(super) log: NetLog,
    pub(super) probes_acked: Vec<u16>,
    /// The channel's checks of each datagram, and their counts.
    pub(super) admission: Admission,
    /// The admission totals already added to the shared counters (once per batch).
    pub(super) added: Tally,
    /// When the socket's receive queue (or, without `SO_MEMINFO`, its drop counter) was last read.
    pub(super) queue_sampled: Instant,
    /// The file of the last new bytes in the current batch, for the progress display.
    pub(super) moved_file: Option<u32>,
    /// Something of the sender's arrived on this channel ([`Shared::heard`], kept here so
    /// that no datagram touches the shared flag once it is set).
    pub(super) heard: bool,
    /// Parity of the tail's groups not yet complete ([`hurtle_proto::fec`]).
    pub(super) parity: ParityStore,
    /// Through a relay: the channel's binding there and its try for a direct path.
    pub(super) punch: Option<ReceiverPunch>,
    /// Where the sender's datagrams came from last, and every address they came from.
    pub(super) last_src: Option<SocketAddr>,
    pub(super) sources: Vec<SocketAddr>,
    /// The bytes of the sender's this batch brought each way.
    pub(super) ways: WayCount,
}

/// Which way a channel's datagrams came, counted per datagram and handed to the session's
/// [`crate::progress::Progress::count_route`] once per batch: through the relay's UDP port
/// (the datagram came from there), over TCP (through the relay's splice when the sender came
/// through the relay), or direct (anything else the channel took as the sender's).
#[derive(Debug, Default)]
pub(super) struct WayCount {
    /// The relay's UDP port, once the relay offered the session's allocations there.
    pub(super) relay: Option<SocketAddr>,
    /// The channel's link is a TCP connection now, and its frames come this way.
    pub(super) tcp: Option<Route>,
    /// The bytes not yet handed on, in the order of [`Route::ALL`].
    pub(super) bytes: [u64; 3],
}

impl WayCount {
    /// A data or parity datagram (or TCP frame) of `len` bytes from `src` was taken as the
    /// sender's.
    fn add(&mut self, src: &SocketAddr, len: usize) {
        let route = if let Some(tcp) = self.tcp {
            tcp
        } else if Some(*src) == self.relay {
            Route::RelayUdp
        } else {
            Route::Direct
        };
        self.bytes[route as usize] += len as u64;
    }

    /// Hands the counts on to `progress`.
    fn flush(&mut self, progress: &crate::progress::Progress) {
        for (route, n) in Route::ALL.into_iter().zip(&mut self.bytes) {
            if *n > 0 {
                progress.count_route(route, std::mem::take(n));
            }
        }
    }
}

/// A relayed channel's binding at the relay and its try for a direct path to the sender's
/// socket ([`SocketPunch`], made once the relay gives the session's allocations).
pub(super) struct ReceiverPunch {
    /// A clone of the channel's socket, to send from.
    pub(super) sock: std::net::UdpSocket,
    pub(super) state: Option<SocketPunch>,
    /// The sender's IP on the direct path, once punched: its datagrams are the sender's too.
    pub(super) direct_ip: Option<std::net::IpAddr>,
}

/// The longest a channel thread lets datagrams gather while the session is slow ([`SlowFlow`])
/// when it does not know when the next report goes ([`super::shared::ReportClock`]: before
/// the session loop's first). On a paced path datagrams arrive in small bursts some tens of
/// microseconds to a few milliseconds apart, and a thread that woke for each paid a wake-up, a
/// `poll` and a `recvmmsg` per burst. Datagrams are timed by the kernel's arrival stamps, so a
/// pause does not move their queueing delays or the reports' intervals: 5 ms, half the
/// shortest report interval, so that every report still finds new reads; it holds back NACKs
/// by no more than it lasts, and what gathers meanwhile is kept small against the socket
/// buffer ([`gather_time`]). (2 ms cost 10-20% more CPU per GiB at 100-400 Mbit/s on
/// loopback.)
const GATHER_MAX: Duration = Duration::from_millis(5);

/// The longest pause that ends [`REPORT_LEAD`] before a report: at the shortest report
/// interval (10 ms, a path of a few milliseconds' round trip) a thread then wakes once per
/// report rather than twice, and every report finds the reads of the interval it covers.
/// Where reports come further apart on a long path (where NACKs held back longer cost more) a
/// thread pauses [`GATHER_MAX`] at a time until the next report is this near; on a short path
/// whose reports were stretched by the datagram count, see [`aligned_max`].
const GATHER_MAX_ALIGNED: Duration = Duration::from_millis(10);

/// The longest pause aimed at a report where a short path's reports were stretched
/// ([`hurtle_proto::rate::report_every`], up to [`SHORT_REPORT_STRETCH_MAX`] at 100 Mbit/s
/// on the shortest paths): a thread wakes once per report there too. (With 5 ms pauses at
/// 100 Mbit/s on veth it woke about six times per report.)
const GATHER_MAX_STRETCHED: Duration = SHORT_REPORT_STRETCH_MAX;

/// The longest pause aimed at a report, with reports every `every_us` on a path whose own
/// report interval is `base_us`, when `awaiting_repair` says whether any of the thread's
/// channels waits on a loss ([`ChannelReceiver::awaiting_repair`]). A short path's interval
/// (`base_us` up to [`GATHER_MAX_ALIGNED`]) stretched beyond it: the whole interval, up to
/// [`GATHER_MAX_STRETCHED`], unless a channel waits on a loss, whose NACKs go out only when
/// the thread wakes: then, as elsewhere, [`GATHER_MAX_ALIGNED`]. A long path's longer
/// interval keeps [`GATHER_MAX_ALIGNED`] (pauses of 10 ms there once cost intercontinental
/// goodput).
fn aligned_max(every_us: u64, base_us: u64, awaiting_repair: bool) -> Duration {
    let every = Duration::from_micros(every_us);
    let base = Duration::from_micros(base_us);
    if !awaiting_repair && base <= GATHER_MAX_ALIGNED && every > GATHER_MAX_ALIGNED {
        every.min(GATHER_MAX_STRETCHED)
    } else {
        GATHER_MAX_ALIGNED
    }
}

/// How long before a report a pause that ends there ends: time for the thread's sleep to run
/// over and for it to read and count what gathered (tens of datagrams at the rates that pause).
const REPORT_LEAD: Duration = Duration::from_millis(1);

/// The shortest pause that is aimed at a report: a thread that has just read for one waits for
/// the next.
const ALIGNED_MIN: Duration = Duration::from_millis(2);

/// The session rate, bits per second, below which datagrams may be let gather. Above it a
/// thread that has caught up is the bottleneck and must not sleep (on loopback it did, and
/// was slower).
const GATHER_BELOW_BPS: f64 = 2e9;

/// How long to let datagrams gather when the session receives `bps` bits per second into
/// sockets whose smallest receive buffer is `room` bytes: `max`, or less if that would fill
/// more than an eighth of the buffer. The kernel counts each datagram's overhead against the
/// buffer too (up to about twice the payload), and the sender sees a buffer past half full as
/// backlog, so an eighth leaves both far off. The session's rate bounds each channel's.
fn gather_time(bps: f64, room: usize, max: Duration) -> Duration {
    let bytes_per_sec = (bps / 8.0).max(1.0);
    Duration::from_secs_f64(room as f64 / 8.0 / bytes_per_sec).min(max)
}

/// The pause that ends [`REPORT_LEAD`] before a report, at `now_us` (microseconds from the
/// report clock's origin), with the next report due at `due_us` and reports every `every_us`:
/// aimed at the first report at least [`ALIGNED_MIN`] of pause away (the one just read for is
/// passed over, and a late report loop's due time already past too); [`GATHER_MAX`] if that
/// pause would be longer than `longest` ([`aligned_max`]), except where `longest` follows
/// stretched reports and the pause is at most [`ALIGNED_MIN`] longer: then `longest`.
fn report_pause(now_us: u64, due_us: u64, every_us: u64, longest: Duration) -> Duration {
    let lead = REPORT_LEAD.as_micros() as u64;
    let least = now_us + ALIGNED_MIN.as_micros() as u64 + lead;
    let due = if due_us >= least {
        due_us
    } else {
        // Whole intervals past the due time, enough to reach `least`.
        let every = every_us.max(1);
        due_us + (least - due_us).div_ceil(every) * every
    };
    let pause = Duration::from_micros(due - lead - now_us);
    if pause <= longest {
        pause
    } else if longest > GATHER_MAX_ALIGNED && pause <= longest + ALIGNED_MIN {
        // Stretched reports: the one just read for came a little later than aimed at (the
        // loop built it late, or the interval grew), and the next is a little more than the
        // longest pause away. Waking up to `ALIGNED_MIN` earlier before it, rather than
        // pausing the usual 5 ms first, keeps one wake-up per report (without it, 55 a second
        // against 41 reports at 100 Mbit/s).
        longest
    } else {
        GATHER_MAX
    }
}

/// Whether the session receives slowly enough to let datagrams gather: its received bytes over
/// the last 10 ms or more, below [`GATHER_BELOW_BPS`].
struct SlowFlow {
    since: Instant,
    bytes: u64,
    /// The last measured rate, bits per second, if below [`GATHER_BELOW_BPS`].
    slow: Option<f64>,
}

impl SlowFlow {
    fn new(now: Instant, bytes: u64) -> SlowFlow {
        SlowFlow {
            since: now,
            bytes,
            slow: None,
        }
    }

    /// With the session's byte count `bytes` at `now`: updates the estimate, at most every
    /// 10 ms, and returns the rate if it is slow.
    fn update(&mut self, now: Instant, bytes: u64) -> Option<f64> {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Duration::from_millis(10) {
            let bps = bytes.saturating_sub(self.bytes) as f64 * 8.0 / elapsed.as_secs_f64();
            self.slow = (bps < GATHER_BELOW_BPS).then_some(bps);
            self.since = now;
            self.bytes = bytes;
        }
        self.slow
    }
}

/// How long data may pause and still count as flowing: a thread whose reads found nothing for
/// longer waits in `poll`, so the first datagram after a pause is read at once.
const STILL_FLOWING: Duration = Duration::from_millis(20);

/// The pause before a thread that has caught up reads again, at `now`, if it should pause
/// rather than wait in `poll`: while data flows (some came at `last_got`, within
/// [`STILL_FLOWING`]) and the session is slow (`slow()`, from [`SlowFlow::update`]):
/// [`gather_time`] for that rate and the thread's smallest socket buffer `room`, up to the
/// pause that ends just before the next report (`report()`: it, from [`report_pause`]), or
/// [`GATHER_MAX`] while no report is planned.
fn gather_pause(
    now: Instant,
    last_got: Instant,
    slow: impl FnOnce() -> Option<f64>,
    room: usize,
    report: impl FnOnce() -> Option<Duration>,
) -> Option<Duration> {
    if now.saturating_duration_since(last_got) >= STILL_FLOWING {
        return None;
    }
    let bps = slow()?;
    Some(gather_time(bps, room, report().unwrap_or(GATHER_MAX)))
}

/// Marks the links that `ready` (a `poll` that does not wait; bit `i` for link `i`) finds
/// readable, if any link is not marked already; `ready` is not called otherwise.
fn add_ready(readable: &mut [bool], ready: impl FnOnce() -> Option<u64>) {
    if readable.iter().all(|&r| r) {
        return;
    }
    if let Some(ready) = ready() {
        for (i, read) in readable.iter_mut().enumerate() {
            *read |= ready & (1 << i) != 0;
        }
    }
}

/// How long a channel thread sleeps when none of its channels has anything to read (it
/// wakes at once when one has): the longest its timers (NACKs, reports) can be late.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// Serves channels on one thread until the session stops: reads whatever each channel's link
/// has waiting, in turn, and sleeps until one of them has more. Returns the channels' kernel
/// drops and NACKs sent, summed. The first error stops the session.
pub(super) fn serve_channels(
    mut members: Vec<(ChannelWorker, LinkIn)>,
    shared: &Shared,
) -> (u64, u64) {
    // One receive batch for all: each channel's datagrams are handled before the next
    // channel's are read, and one batch's buffers stay in the CPU's cache where several would
    // not.
    let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
    // Which links to read: those the last wait found readable, and those whose last read
    // filled the whole batch (more is probably waiting). The others only run their timers, so
    // no read comes back empty on a busy thread.
    let mut readable = vec![true; members.len()];
    let received = || shared.counters.bytes.load(Ordering::Relaxed);
    let mut slow = SlowFlow::new(Instant::now(), received());
    // When a read last brought something (long ago: nothing yet).
    let mut last_got = Instant::now()
        .checked_sub(STILL_FLOWING)
        .unwrap_or_else(Instant::now);
    // The smallest receive buffer of the thread's UDP links, which gathering must not fill.
    let room = members
        .iter()
        .filter_map(|(_, link)| link.recv_buffer())
        .min()
        .unwrap_or(usize::MAX);
    'run: while !shared.stop.load(Ordering::Relaxed) {
        let mut got = 0;
        for ((worker, link), read) in members.iter_mut().zip(&mut readable) {
            match worker.step(link, (*read).then_some(&mut batch)) {
                Ok(n) => {
                    got += n;
                    *read = n > 0 && batch.is_full();
                }
                Err(e) => {
                    shared.stop.store(true, Ordering::Relaxed);
                    let _ = worker.events.send(ChanEvent::Failed(e));
                    break 'run;
                }
            }
        }
        if readable.iter().any(|&r| r) {
            // Some links had a batch or more waiting and are read again at once. The others
            // are asked whether they have anything too (one `poll` that does not wait), so a
            // quieter link is not left unread while busier ones are drained: it was, for tens
            // of milliseconds at a time with 8 channels on loopback, long enough to fill its
            // socket buffer.
            add_ready(&mut readable, || {
                let fds = members.iter().map(|(_, link)| link.fd());
                crate::net::udp::wait_readable(fds, Duration::ZERO).ok()
            });
            continue;
        }
        // No read filled its batch (a link whose read did is still marked above). While data
        // flows slowly, the thread sleeps a gathering pause and reads again, whether this
        // round found anything or not, rather than wait in `poll` for the next datagram: a
        // paced sender's bursts (a GSO send, one GRO buffer here) come a few milliseconds
        // apart, and a thread woken by each, then pausing, then finding nothing, then waiting
        // again, woke twice per burst.
        let now = Instant::now();
        if got > 0 {
            last_got = now;
        }
        let report = || {
            let clock = shared.report_clock.get()?;
            let now_us = now.saturating_duration_since(shared.origin).as_micros() as u64;
            let repairing = members.iter().any(|(w, _)| w.rec.awaiting_repair());
            let longest = aligned_max(clock.every_us, clock.base_us, repairing);
            Some(report_pause(now_us, clock.due_us, clock.every_us, longest))
        };
        if let Some(pause) =
            gather_pause(now, last_got, || slow.update(now, received()), room, report)
        {
            std::thread::sleep(pause);
            readable.fill(true);
            continue;
        }
        // Links without anything to wait on (a closed TCP connection) are skipped; with none
        // left this sleeps out the wait.
        let fds = members.iter().map(|(_, link)| link.fd());
        match crate::net::udp::wait_readable(fds, IDLE_WAIT) {
            Ok(ready) => {
                for (i, read) in readable.iter_mut().enumerate() {
                    *read = ready & (1 << i) != 0;
                }
            }
            Err(e) => {
                shared.stop.store(true, Ordering::Relaxed);
                if let Some((worker, _)) = members.first() {
                    let _ = worker.events.send(ChanEvent::Failed(e.into()));
                }
                break;
            }
        }
    }
    members
        .iter()
        .map(|(worker, link)| worker.finish(link))
        .fold((0, 0), |(d, n), (dw, nw)| (d + dw, n + nw))
}

impl ChannelWorker {
    /// The channel's kernel drops and NACKs sent, when the session ends; adds its duplicate
    /// bytes to the session's counters.
    fn finish(&self, link: &LinkIn) -> (u64, u64) {
        self.shared
            .counters
            .duplicate
            .fetch_add(self.rec.stats().duplicate_bytes, Ordering::Relaxed);
        self.shared
            .counters
            .unauthentic
            .fetch_add(link.dropped(), Ordering::Relaxed);
        (link.kernel_drops().unwrap_or(0), self.rec.stats().nacks)
    }

    /// A relay's answer or a punching datagram from `src`: a direct path found moves the
    /// feedback there and lets the sender's datagrams in from there.
    fn on_punching(&mut self, now: Instant, src: SocketAddr, datagram: &[u8]) {
        let Some(p) = self.punch.as_mut() else {
            return;
        };
        let Some(sp) = p.state.as_mut() else {
            return;
        };
        if let PunchStep::Direct(addr) = sp.on_datagram(now, &p.sock, src, datagram) {
            self.on_direct(addr);
        }
    }

    /// The relay's offer, once it has come, starts the channel's binding; then its timers.
    fn punch_tick(&mut self, now: Instant) {
        let Some(p) = self.punch.as_mut() else {
            return;
        };
        if p.state.is_none() {
            let Some((relay, binds, parse)) = self.shared.relay_offer.get() else {
                return;
            };
            let Some(bind) = binds.get(usize::from(self.ch)) else {
                return;
            };
            self.ways.relay = Some(*relay);
            p.state = Some(SocketPunch::new(
                (*relay, bind.clone(), *parse),
                Role::Receiver,
                self.shared.punch_key,
                now,
            ));
        }
        let step = p
            .state
            .as_mut()
            .map_or(PunchStep::Taken, |sp| sp.tick(now, &p.sock));
        if let PunchStep::Direct(addr) = step {
            self.on_direct(addr);
        }
    }

    fn on_direct(&mut self, addr: SocketAddr) {
        if let Some(p) = self.punch.as_mut() {
            p.direct_ip = Some(addr.ip().to_canonical());
        }
        let sh = &self.shared;
        sh.progress.set_route(self.ch, Route::Direct);
        let at = sh.origin.elapsed().as_micros() as u64;
        sh.direct_at_us.fetch_min(at, Ordering::Relaxed);
        self.shared.feedback.redirect(self.ch, addr);
        self.log
            .line(|| format!("direct path to the sender at {addr}: the relay is left"));
    }

    /// With a batch, reads what the link has waiting (without waiting for more); then runs
    /// the channel's timers: NACKs, completion. Returns how many datagrams came.
    fn step(
        &mut self,
        link: &mut LinkIn,
        batch: Option<&mut RecvBatch>,
    ) -> Result<usize, SessionError> {
        let mut new_bytes = 0;
        let mut batch_time = None;
        let mut timed_on_read = false;
        let mut last_arrival: Option<Instant> = None;
        self.ways.tcp = matches!(link.path, InPath::Tcp(_)).then(|| self.shared.tcp_route());
        let n = match batch {
            Some(batch) => link.recv(batch, |src, arrived, datagram| {
                let now = *batch_time.get_or_insert_with(Instant::now);
                timed_on_read |= arrived.is_none();
                last_arrival = last_arrival.max(arrived);
                new_bytes += self.on_datagram(now, arrived.unwrap_or(now), src, datagram)?;
                Ok::<(), SessionError>(())
            })?,
            None => 0,
        };
        if timed_on_read {
            self.shared.timed_on_read.store(true, Ordering::Relaxed);
        }
        let now = Instant::now();
        self.punch_tick(now);
        // Counted only while the channel has heard nothing: all a silence watch needs.
        if !self.heard {
            self.shared.passes[usize::from(self.ch)].fetch_add(1, Ordering::Relaxed);
        }
        self.sample_queue(now, link);
        if n > 0 {
            // Repairs wait behind the queue the batch's datagrams met.
            let queued = self.admission.take_peak_queue_delay();
            self.rec.note_queue_delay(now, queued);
            let totals = self.admission.tally();
            let counted = totals.since(&self.added);
            self.shared.counters.add(&counted);
            self.added = totals;
            // The trains that ended in the batch, for the report's bottleneck estimate; none of
            // datagrams timed when read (a TCP data connection, a kernel that gave no time):
            // their spacing is the reader's, not the path's.
            if timed_on_read {
                self.admission.forget_train_rates();
            } else {
                let mut pool = (self.shared.train_rates.lock()).unwrap_or_else(|e| e.into_inner());
                self.admission.take_train_rates(pool.rates_mut());
            }
            if let Some(at) = last_arrival.filter(|_| !timed_on_read) {
                self.shared.note_arrivals(self.ch, counted.bytes, at);
            }
            self.shared
                .progress
                .sent
                .fetch_add(new_bytes, Ordering::Relaxed);
            self.ways.flush(&self.shared.progress);
            if let Some(file) = self.moved_file.take() {
                self.shared.progress.note_moving(self.ch, file);
            }
            self.log.line(|| {
                format!(
                    "recv datagrams={n} new_bytes={new_bytes} held={}",
                    self.rec.received_bytes()
                )
            });
        }
        while let Ok(cmd) = self.cmds.try_recv() {
            match cmd {
                ChanCmd::Reject(block) => {
                    if let Some((_, range)) = self.shared.layout.block_stripe_range(block) {
                        self.log
                            .line(|| format!("block {block} failed verification; fetching again"));
                        self.spilled.remove(&block);
                        self.refetched.insert(block);
                        self.rec.reject(range);
                    }
                }
                ChanCmd::Relink(new) => {
                    // What the old link dropped as unauthentic still counts.
                    self.shared
                        .counters
                        .unauthentic
                        .fetch_add(link.dropped(), Ordering::Relaxed);
                    *link = *new;
                    let route = self.shared.tcp_route();
                    if route != Route::Direct {
                        self.shared.progress.set_route(self.ch, route);
                    }
                    self.log.line(|| "link moved to TCP".into());
                }
            }
        }
        if let Some(ranges) = self.rec.poll_nack(now) {
            self.shared.counters.nacks.fetch_add(1, Ordering::Relaxed);
            self.log.line(|| {
                format!(
                    "loss nack ranges={} bytes={} first={:?}",
                    ranges.len(),
                    ranges.iter().map(|r| r.1 - r.0).sum::<u64>(),
                    ranges.first()
                )
            });
            self.shared.send_nack(Control::Nack {
                channel: self.ch,
                seq: self.rec.stats().nacks,
                ranges,
                knew_us: self.admission.knew_us(self.ch, now),
            });
        }
        if self.shared.started.load(Ordering::Relaxed) && self.rec.poll_done() {
            self.log.line(|| "channel complete".into());
            let _ = self
                .shared
                .to_wire
                .send(Control::ChannelDone { channel: self.ch });
        }
        Ok(n)
    }

    /// Samples the socket's receive queue (every millisecond at most: one `getsockopt`) for
    /// the fill the next report carries, and its drop counter. Where the kernel cannot say how
    /// full the queue is, reads only the drop counter, every 100 ms (a file read).
    fn sample_queue(&mut self, now: Instant, link: &LinkIn) {
        let since = now.saturating_duration_since(self.queue_sampled);
        if since < QUEUE_SAMPLE_EVERY {
            return;
        }
        let drops = match link.receive_queue() {
            Some(q) => {
                self.shared
                    .queue_fill
                    .fetch_max(q.fill_permille(), Ordering::Relaxed);
                Some(q.drops)
            }
            None if since >= Duration::from_millis(100) => link.kernel_drops(),
            None => return,
        };
        self.queue_sampled = now;
        if let Some(d) = drops {
            self.shared.channel_drops[usize::from(self.ch)].store(d, Ordering::Relaxed);
        }
    }

    /// Checks and stores one datagram, read at `now`, that arrived at `arrived` (its delay is
    /// measured there); returns the new payload bytes it brought.
    fn on_datagram(
        &mut self,
        now: Instant,
        arrived: Instant,
        src: &SocketAddr,
        datagram: &[u8],
    ) -> Result<u64, SessionError> {
        // The relay's answers and punching datagrams (never data: see `RELAY_TAG`).
        if matches!(
            datagram.first(),
            Some(&RELAY_TAG) | Some(&hurtle_proto::punch::TAG_BYTE)
        ) {
            self.on_punching(now, *src, datagram);
            return Ok(0);
        }
        let from = src.ip().to_canonical();
        let direct = self.punch.as_ref().and_then(|p| p.direct_ip);
        if from != self.shared.peer_ip.to_canonical()
            && Some(from) != self.shared.relay_ip
            && Some(from) != direct
        {
            self.admission.reject(RejectReason::Source);
            return Ok(0);
        }
        let (verdict, payload) =
            self.admission
                .admit_datagram(arrived, &self.shared.layout, datagram);
        // Data and parity, as a sender counts them (not probes or a channel's end).
        if matches!(verdict, Admit::Data(_) | Admit::Parity { .. }) {
            self.ways.add(src, datagram.len());
        }
        if !self.heard && !matches!(verdict, Admit::Reject(_)) {
            self.heard = true;
            self.shared.heard[usize::from(self.ch)].store(true, Ordering::Relaxed);
            self.shared.feedback.heard(self.ch, *src);
        }
        if !matches!(verdict, Admit::Reject(_)) && self.last_src != Some(*src) {
            // The sender's datagrams come another way now (from a relay to a direct path):
            // what the old way still carries (it comes from there, between the new way's) is
            // not taken for lost at once. Once per new address.
            if !self.sources.contains(src) {
                if !self.sources.is_empty() {
                    self.rec.on_path_change(now);
                    self.log.line(|| format!("datagrams now come from {src}"));
                }
                if self.sources.len() < 4 {
                    self.sources.push(*src);
                }
            }
            self.last_src = Some(*src);
        }
        match verdict {
            Admit::Reject(_) => Ok(0),
            Admit::Probe { size, .. } => {
                if !self.probes_acked.contains(&size) {
                    self.probes_acked.push(size);
                    let _ = self.shared.to_wire.send(Control::ProbeAck {
                        channel: self.ch,
                        size,
                    });
                }
                Ok(0)
            }
            Admit::Final { stripe_len, .. } => {
                self.rec.on_final(now, stripe_len);
                self.rec.resend_done();
                self.log.line(|| format!("final stripe_len={stripe_len}"));
                Ok(0)
            }
            Admit::Data(placed) => {
                let pos = placed.place.pos;
                let new_bytes = self.take_data(now, placed, payload)?;
                // Data after its group's parity (reordered) may be what the parity lacked.
                match self.parity.group_at(pos) {
                    Some(group) if new_bytes > 0 => Ok(new_bytes + self.try_recover(now, group)?),
                    _ => Ok(new_bytes),
                }
            }
            Admit::Parity { place, desc } => {
                let pos = place.place.pos;
                self.parity
                    .add(pos, place.file, place.offset, desc, payload);
                self.try_recover(now, pos)
            }
        }
    }

    /// Rebuilds what this channel misses of the tail's group at stripe position `pos` if its
    /// parity suffices, from the bytes gathered of its block; forgets the group once it is
    /// complete or its block is no longer gathered here (spilled or done: any loss is asked
    /// for as before). Returns the new payload bytes rebuilt.
    fn try_recover(&mut self, now: Instant, pos: u64) -> Result<u64, SessionError> {
        let Some(g) = self.parity.get(pos) else {
            return Ok(0);
        };
        let (desc, file, offset) = (g.desc, g.file, g.offset);
        let block_size = self.shared.layout.block_size();
        let Ok(place) = self.shared.layout.place(file, offset, u64::from(desc.len)) else {
            self.parity.remove(pos);
            return Ok(0);
        };
        let Some(gathering) = self.buffers.get(place.block) else {
            self.parity.remove(pos);
            return Ok(0);
        };
        let rec = &self.rec;
        let at = (offset % block_size) as usize;
        let present = |i: usize| {
            let r = desc.piece_range(i);
            let bytes = gathering
                .buf
                .get(at + r.start as usize..at + r.end as usize);
            bytes.filter(|_| rec.has(pos + r.start..pos + r.end))
        };
        let Some(rebuilt) = fec::recover(&desc, present, &g.shards) else {
            return Ok(0);
        };
        self.parity.remove(pos);
        let mut new_bytes = 0;
        for (i, bytes) in rebuilt {
            let r = desc.piece_range(i);
            let len = r.end - r.start;
            let Ok(place) = self.shared.layout.place(file, offset + r.start, len) else {
                continue;
            };
            let placed = Placed {
                file,
                offset: offset + r.start,
                len,
                retransmit: false,
                place,
            };
            self.shared
                .counters
                .recovered
                .fetch_add(1, Ordering::Relaxed);
            self.log
                .line(|| format!("rebuilt pos={} len={len} from parity", pos + r.start));
            new_bytes += self.take_data(now, placed, &bytes)?;
        }
        Ok(new_bytes)
    }

    /// Records and stores data `placed` with its bytes `payload` (arrived, or rebuilt from
    /// parity); returns the new payload bytes it brought.
    fn take_data(
        &mut self,
        now: Instant,
        placed: Placed,
        payload: &[u8],
    ) -> Result<u64, SessionError> {
        let Placed {
            file: file_id,
            offset,
            len,
            retransmit,
            place,
        } = placed;
        let out = self
            .rec
            .on_data(now, place.pos, len, retransmit, place.block_stripe.clone());
        if out.new_bytes == 0 {
            return Ok(0);
        }
        self.moved_file = Some(file_id);
        let block_len = (place.block_stripe.end - place.block_stripe.start) as usize;
        let at = (offset - place.block_file_start) as usize;
        let Some(file) = &self.shared.files[file_id as usize] else {
            // A file this receiver is not receiving (it takes no room in the layout,
            // so nothing of it is ever placed).
            self.admission.reject(RejectReason::Layout);
            return Ok(0);
        };
        // The block being gathered (nearly always the last datagram's), else one spilled,
        // else a new one: a block is never both gathered and spilled.
        if let Some(g) = self.buffers.get_mut(place.block) {
            g.fill(at, payload);
        } else if self.spilled.contains_key(&place.block) {
            file.write_at(offset, payload)?;
        } else {
            if self.buffers.len() >= self.max_buffers {
                self.spill_oldest()?;
            }
            let mut buf = self.take_buffer();
            buf.resize(block_len, 0);
            let layout = &self.shared.layout;
            let blocks = layout.blocks_of(file_id);
            let hasher = BlockHasher::new(
                place.block - blocks.start,
                layout.block_size(),
                blocks.end - blocks.start,
            );
            let gathering = Gathering {
                buf,
                hasher,
                prefix: 0,
            };
            self.buffers.push(place.block, gathering).fill(at, payload);
        }
        if out.completes_block {
            self.complete_block(place.block, file_id, place.block_file_start, block_len)?;
        }
        Ok(out.new_bytes)
    }

    fn complete_block(
        &mut self,
        block: u64,
        file: u32,
        file_start: u64,
        len: usize,
    ) -> Result<(), SessionError> {
        let layout = &self.shared.layout;
        let blocks = layout.blocks_of(file);
        let (index, count) = (block - blocks.start, blocks.end - blocks.start);
        let Some(part) = self.shared.files[file as usize].clone() else {
            return Ok(());
        };
        let value = if let Some(mut g) = self.buffers.remove(block) {
            let v = g.finish();
            let first = !self.refetched.contains(&block);
            if let Some(w) = &self.writer {
                // Its value goes to the session loop once written, from the writer thread.
                self.log
                    .line(|| format!("block {block} complete, queued for writing"));
                return w.hand_over(
                    &self.shared,
                    Written {
                        queued: Instant::now(),
                        file,
                        block,
                        file_start,
                        value: v,
                        buf: g.buf,
                        first,
                    },
                );
            }
            write_block(&part, file_start, &g.buf, first)?;
            self.pool.push(g.buf);
            v
        } else {
            // Spilled: read back what is on disk.
            self.spilled.remove(&block);
            let mut buf = self.take_buffer();
            buf.resize(len, 0);
            part.read_at(file_start, &mut buf)?;
            let v = block_value(&buf, index, self.shared.layout.block_size(), count);
            self.pool.push(buf);
            v
        };
        self.log.line(|| format!("block {block} complete"));
        let _ = self.events.send(ChanEvent::Block { block, value });
        Ok(())
    }

    /// A block buffer: from this channel's pool, else one the writer thread is done with, else
    /// a new one.
    fn take_buffer(&mut self) -> Vec<u8> {
        self.pool
            .pop()
            .or_else(|| self.writer.as_ref().and_then(|w| w.spare.try_recv().ok()))
            .unwrap_or_default()
    }

    /// Writes what the oldest buffered block holds to its file and frees its buffer.
    fn spill_oldest(&mut self) -> Result<(), SessionError> {
        let Some((block, Gathering { buf, .. })) = self.buffers.pop_oldest() else {
            return Ok(());
        };
        let layout = &self.shared.layout;
        let (Some((_, stripe)), Some((file, range))) = (
            layout.block_stripe_range(block),
            layout.block_file_range(block),
        ) else {
            return Ok(());
        };
        let Some(part) = &self.shared.files[file as usize] else {
            return Ok(());
        };
        for held in self.rec.held(stripe.clone()) {
            let a = (held.start - stripe.start) as usize;
            let b = (held.end - stripe.start) as usize;
            part.write_at(range.start + a as u64, &buf[a..b])?;
        }
        self.log
            .line(|| format!("block {block} spilled to disk while incomplete"));
        self.shared
            .counters
            .spilled_blocks
            .fetch_add(1, Ordering::Relaxed);
        self.spilled.insert(block, range.start);
        self.pool.push(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_flow_is_judged_over_ten_milliseconds() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut flow = SlowFlow::new(t0, 1000);
        // Not slow until measured, and not measured within 10 ms.
        assert_eq!(flow.update(t0 + ms(5), 1000), None);
        // 125 KB in 10 ms is 100 Mbit/s: slow.
        let bps = flow.update(t0 + ms(10), 126_000).expect("slow");
        assert!((bps - 100e6).abs() < 1e3, "{bps}");
        assert_eq!(flow.update(t0 + ms(15), 50_000_000), Some(bps));
        // 50 MB in 10 ms is 40 Gbit/s: fast.
        assert_eq!(flow.update(t0 + ms(20), 50_000_000 + 126_000), None);
        // Exactly at the threshold is not slow; just under it is.
        let at = (GATHER_BELOW_BPS / 8.0 / 100.0) as u64; // bytes in 10 ms
        let b = 50_000_000 + 126_000;
        assert_eq!(flow.update(t0 + ms(30), b + at), None);
        assert!(flow.update(t0 + ms(40), b + at + at - 1).is_some());
    }

    #[test]
    fn a_thread_pauses_while_slow_data_flows_and_waits_otherwise() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let room = 4 << 20;
        let no_report = || None;
        // Data came 3 ms ago, at 100 Mbit/s: pause, even if this round found nothing.
        assert_eq!(
            gather_pause(t0 + ms(3), t0, || Some(100e6), room, no_report),
            Some(GATHER_MAX)
        );
        // Fast: no pause (a thread that has caught up is the bottleneck).
        assert_eq!(gather_pause(t0 + ms(3), t0, || None, room, no_report), None);
        // Nothing for longer than data may pause: wait in `poll`, and the rate is not asked.
        assert_eq!(
            gather_pause(
                t0 + STILL_FLOWING,
                t0,
                || panic!("asked"),
                room,
                || panic!("asked")
            ),
            None
        );
        // A report planned: the pause ends just before it, longer than without one...
        assert_eq!(
            gather_pause(t0 + ms(3), t0, || Some(100e6), room, || Some(ms(9))),
            Some(ms(9))
        );
        // ...but still fills no more than an eighth of the socket buffer (208 KiB: 2.13 ms at
        // 100 Mbit/s).
        let t =
            gather_pause(t0 + ms(3), t0, || Some(100e6), 212_992, || Some(ms(9))).expect("pauses");
        assert!(t < Duration::from_micros(2140), "{t:?}");
        // The socket buffer's bound applies without a report too.
        let t = gather_pause(t0 + ms(3), t0, || Some(400e6), 212_992, no_report).expect("pauses");
        assert!(t < Duration::from_micros(540), "{t:?}");
    }

    #[test]
    fn a_pause_ends_just_before_the_next_report() {
        let us = |d: Duration| d.as_micros() as u64;
        let ms = Duration::from_millis;
        let pause = |now, due, every| report_pause(now, due, every, GATHER_MAX_ALIGNED);
        let every = us(ms(10));
        // A report due in 7 ms: wake 1 ms before it.
        assert_eq!(pause(50_000, 57_000, every), ms(6));
        // Just read for the report due in 1 ms (or one due already, its loop late): wait for
        // the next, less the lead.
        assert_eq!(pause(56_000, 57_000, every), ms(10));
        assert_eq!(pause(56_500, 57_000, every), ms(9) + ms(1) / 2);
        assert_eq!(pause(58_000, 57_000, every), ms(8));
        // A loop several intervals late: the first report time far enough ahead.
        assert_eq!(pause(80_000, 57_000, every), ms(6));
        // A thread just past the least aimed pause before a report: the next report is too
        // far for one pause, so the usual one.
        assert_eq!(pause(54_100, 57_000, every), GATHER_MAX);
        // Never shorter than the least aimed pause, never longer than the longest.
        for now in (40_000..90_000).step_by(250) {
            let p = pause(now, 57_000, every);
            assert!(p >= ALIGNED_MIN && p <= GATHER_MAX_ALIGNED, "{now}: {p:?}");
            // It ends the lead before some report, or is the usual pause.
            let end = now + us(p) + us(REPORT_LEAD);
            assert!(
                p == GATHER_MAX || (end >= 57_000 && (end - 57_000) % every == 0),
                "{now}: {p:?}"
            );
        }
        // Reports far apart (a long round trip): the usual pauses until one is near, then one
        // that ends before it.
        let every = us(ms(40));
        assert_eq!(pause(0, 35_000, every), GATHER_MAX);
        assert_eq!(pause(30_000, 35_000, every), ms(4));
        assert_eq!(pause(34_500, 35_000, every), GATHER_MAX);
    }

    #[test]
    fn a_short_paths_stretched_reports_are_waited_for_in_one_pause() {
        let us = |d: Duration| d.as_micros() as u64;
        let ms = Duration::from_millis;
        // 100 Mbit/s on a short path: reports every 29 ms instead of the path's 10.
        let (every, base) = (us(ms(29)), us(ms(10)));
        let longest = aligned_max(every, base, false);
        assert_eq!(longest, ms(29));
        // Just read for a report: one pause to just before the next, not six of 5 ms.
        assert_eq!(report_pause(56_000, 57_000, every, longest), ms(29));
        assert_eq!(report_pause(60_000, 57_000, every, longest), ms(25));
        // A shortest path's reports at 100 Mbit/s: every 57 ms, waited for in one pause too.
        assert_eq!(aligned_max(us(ms(57)), base, false), ms(57));
        // Stretched further (a late loop): the pause ends before the report if it is within
        // 60 ms, else the usual one until it is.
        assert_eq!(aligned_max(us(ms(75)), base, false), GATHER_MAX_STRETCHED);
        assert_eq!(
            report_pause(0, 70_000, us(ms(75)), GATHER_MAX_STRETCHED),
            GATHER_MAX
        );
        assert_eq!(
            report_pause(10_000, 70_000, us(ms(75)), GATHER_MAX_STRETCHED),
            ms(59)
        );
        // The report just read for came 1.5 ms late (its loop published it after the thread
        // aimed at it): the next is 30.5 ms away, so a pause aimed at it (29.5 ms) is a little
        // past the longest. Wake 1.5 ms before it rather than pause 5 ms first and then again.
        assert_eq!(report_pause(84_500, 86_000, every, longest), ms(29));
        // A report further than that: the usual pause first.
        assert_eq!(report_pause(50_000, 86_000, every, longest), GATHER_MAX);
        // A channel waits on a loss: its NACKs go out when the thread wakes, so no pause is
        // longer than where reports are not stretched.
        let longest = aligned_max(every, base, true);
        assert_eq!(longest, GATHER_MAX_ALIGNED);
        assert_eq!(report_pause(56_000, 57_000, every, longest), GATHER_MAX);
        // Not stretched: as before.
        assert_eq!(aligned_max(base, base, false), GATHER_MAX_ALIGNED);
        // A long path (reports every 37.5 ms at 150 ms, never stretched by the count): the
        // usual pauses until the report is near.
        let long = us(Duration::from_micros(37_500));
        assert_eq!(aligned_max(long, long, false), GATHER_MAX_ALIGNED);
        assert_eq!(
            aligned_max(us(ms(20)), us(ms(20)), false),
            GATHER_MAX_ALIGNED
        );
    }

    #[test]
    fn links_left_out_of_a_busy_round_are_read_when_ready() {
        // Link 0 had a full batch; links 1 and 2 were not marked. The poll finds 2 readable.
        let mut readable = [true, false, false];
        add_ready(&mut readable, || Some(0b100));
        assert_eq!(readable, [true, false, true]);
        // A poll that fails changes nothing.
        let mut readable = [true, false];
        add_ready(&mut readable, || None);
        assert_eq!(readable, [true, false]);
        // All marked: no poll at all.
        let mut readable = [true, true];
        add_ready(&mut readable, || {
            panic!("polled although every link is read anyway")
        });
        assert_eq!(readable, [true, true]);
    }

    #[test]
    fn gathering_fills_at_most_an_eighth_of_the_socket_buffer() {
        // 4 MiB buffers: the full pause up to 800 Mbit/s, then an eighth of the buffer.
        assert_eq!(gather_time(400e6, 4 << 20, GATHER_MAX), GATHER_MAX);
        assert_eq!(gather_time(800e6, 4 << 20, GATHER_MAX), GATHER_MAX);
        let t = gather_time(1.9e9, 4 << 20, GATHER_MAX);
        assert!(
            t > Duration::from_micros(2200) && t < Duration::from_micros(2220),
            "{t:?}"
        );
        // Linux's usual 208 KiB: an eighth is 26.6 KB, 2.13 ms at 100 Mbit/s, 0.53 ms at 400.
        let t = gather_time(100e6, 212_992, GATHER_MAX);
        assert!(
            t > Duration::from_micros(2120) && t < Duration::from_micros(2140),
            "{t:?}"
        );
        let t = gather_time(400e6, 212_992, GATHER_MAX);
        assert!(
            t > Duration::from_micros(520) && t < Duration::from_micros(540),
            "{t:?}"
        );
        // What gathers at that rate in that time is an eighth of the buffer.
        let gathered = 400e6 / 8.0 * t.as_secs_f64();
        assert!((gathered - 212_992.0 / 8.0).abs() < 10.0, "{gathered}");
        // No UDP link (TCP only): the full pause.
        assert_eq!(gather_time(1e9, usize::MAX, GATHER_MAX), GATHER_MAX);
    }
}
