//! The channel threads: each serves one or more channels ([`serve_channels`]), sending what
//! each channel's pacer allows ([`ChannelWorker::step`]): new data read a block at a time and
//! hashed the first time ([`ChannelWorker::load_block`]), repairs, held blocks' values and the
//! final marker, in trains of at most [`SEND_TRAIN`] of the session's rate, [`QUEUED_TRAIN`]
//! while the receiver reports a queue on the path ([`train_span`]; while startup lasts, at
//! least the controller's longer train: [`Shared::train_bytes`]); between sends the thread
//! sleeps until a command wakes it ([`ChannelCmds`]).

use super::shared::{ChanCmd, ChanEvent, Shared, ThreadCmd};
use crate::error::SessionError;
use crate::iobuf::IoBuf;
use crate::net::channel_link::LinkOut;
use crate::netlog::NetLog;
use crossbeam_channel::{Receiver, Sender};
use hurtle_proto::fec::{self, ParityDesc, TailGroups};
use hurtle_proto::hash::{hole_value, value_of};
use hurtle_proto::secure::PacketNumbers;
use hurtle_proto::wire::{self, Header, Kind, HEADER_LEN};
use hurtle_proto::{ChannelSender, Pacer, RunKind};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest train of datagrams one send may put on the wire, in time at the session's rate (all
/// channels together), where one GSO send ([`crate::net::udp::MAX_GSO_BYTES`], 64 KiB) holds
/// it: a channel thread wakes once per send, and the sends are as long as this allows, so
/// wake-ups scale with bytes, not with time (each costs a context switch, 8-10 µs of CPU on a
/// VM). With 2 channels, a channel sends every 3.8 ms at 100 Mbit/s (24 KB trains), every 2.6 ms
/// at 400 Mbit/s and every 1 ms at 1 Gbit/s (64 KiB trains, the GSO limit); at 250 µs, trains
/// were an eighth of that, and the 1 ms [`MIN_SLEEP`] set the wake-ups: 4 times as many per
/// GiB at 100 Mbit/s. A channel's trains are as large with 8 channels as with 1, so more
/// channels do not mean more, smaller sends.
///
/// The bound on what a channel puts into the bottleneck's queue back to back: one train (at
/// most 2 ms of the session's rate and 64 KiB), or on a path without a queue its share of
/// [`QUIET_WAKE_BYTES`] where that is more (sent as several trains at one wake-up:
/// [`wake_ahead`]), plus its pacer's credit for a late wake-up ([`PACER_CREDIT`] of the
/// channel's rate, a quarter more while missed time is repaid: [`hurtle_proto::Pacer`]); all
/// channels at once, at most `channels` such plus 1.9 ms of the session's rate (at 100 Mbit/s
/// with 2 channels and no queue, 286 KB: 23 ms of the rate; behind a queue 1 ms trains; at
/// 1 Gbit/s, 496 KB: 4 ms). [`train_cap`] sets the train; the tests below check the bound.
const SEND_TRAIN: Duration = Duration::from_millis(2);

/// The train while the path's bottleneck holds a queue ([`train_span`]): half of
/// [`SEND_TRAIN`]. With 2 channels on one thread, a wake-up then puts 2 ms of the rate into the
/// queue, not 4 ms (100 KB at 200 Mbit/s). On `lossy-wifi-reorder` (200 Mbit/s behind a 512 KB
/// queue, 21 ms, which `auto` runs at a median of 9 ms and probes up to 19 ms and more), 2 ms
/// trains throughout overflowed the queue about 2,100-2,350 times per GiB (0.2 points of resent
/// share); shortened behind a queue, 700-1,000 times. (A quarter, 500 µs, overflowed it a little
/// less, 560-890 times, for a third more of the sender's CPU on that path: a wake-up a
/// millisecond.) A path without a queue (a LAN, the veth pair of `bench/cost.py`) keeps the
/// long trains and their fewer wake-ups.
const QUEUED_TRAIN: Duration = Duration::from_millis(1);

/// Fewest datagrams one send carries (where the link's limit allows as many): a train the
/// receiver can time, four datagrams being the three pairs
/// [`hurtle_proto::rate::dispersion`] needs. Without it, startup's 100 Mbit/s spread over 8
/// channels sent one or two datagrams per send, and the first reports had no bottleneck
/// estimate. (Four datagrams are 5.8 KB: nothing a bottleneck queue notices.)
const MIN_SEND_DATAGRAMS: u64 = 4;

/// Shortest sleep of a channel thread between wake-ups that send: it then sends the trains
/// its pacer's credit allows back to back, up to a few per wake-up. Each wake-up costs a
/// context switch and a timer (tens of microseconds of system time in a VM): waking for every
/// 250 µs train cost the sender 100,000 context switches and 3.5 s of system time per GiB at
/// 400 Mbit/s. A millisecond's data per wake-up is what Linux's TCP pacing puts in one
/// segment too (its pacing shift of 10); it stays within [`PACER_CREDIT`], so no rate is lost.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// Catch-up credit of each channel's pacer after a late wake-up. On a busy 2-core machine a
/// channel thread often wakes more than 0.5 ms late, and lateness beyond the credit is rate
/// lost: with 0.5 ms a channel fell measurably short of its pace, with 1.5 ms it kept it.
/// Credit is sent back to back, so it is also the most a channel can burst into the
/// bottleneck's queue (1.5 ms is 56 KB at 300 Mbit/s).
pub(super) const PACER_CREDIT: Duration = Duration::from_micros(1500);

/// Commands to the thread that serves a channel. The thread sleeps in `park_timeout` between
/// sends, and a command wakes it: crossbeam's blocking receive spins and yields before it
/// sleeps, which costs the sending thread CPU (thousands of `sched_yield` per GiB) for pacing
/// waits of tens of microseconds.
#[derive(Clone)]
pub(super) struct ChannelCmds {
    pub(super) tx: Sender<ThreadCmd>,
    pub(super) thread: std::thread::Thread,
}

impl ChannelCmds {
    /// Queues `cmd` and wakes the thread; an error when the thread has ended.
    pub(super) fn send(
        &self,
        cmd: ThreadCmd,
    ) -> Result<(), crossbeam_channel::SendError<ThreadCmd>> {
        let sent = self.tx.send(cmd);
        self.thread.unpark();
        sent
    }
}

/// The most a session may pace at (all channels, bits per second) for one thread to send all
/// its UDP channels ([`send_threads`]). A thread's wake-up costs a context switch whatever it
/// sends; on one thread the channels' trains go out at the same wake-ups ([`align_slack`]),
/// half the wake-ups of two threads. At 1 Gbit/s the thread's work (read, hash, seal, send:
/// about 1.2 CPU-s per GiB at a 1500-byte MTU) is an eighth of a core.
const ONE_THREAD_BPS: u64 = 1_000_000_000;

/// Threads sending `channels` UDP channels: one when the session never paces above
/// [`ONE_THREAD_BPS`] (`ceiling_bps`), otherwise one per channel, at most one per core. TCP
/// connections get a thread each: a write blocks until the connection takes it, which would
/// hold up the others.
pub(super) fn send_threads(channels: u16, tcp: bool, ceiling_bps: u64) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let channels = usize::from(channels).max(1);
    if tcp {
        channels
    } else if ceiling_bps <= ONE_THREAD_BPS {
        1
    } else {
        channels.min(cores)
    }
}

/// How early a channel that shares its thread may send its next train: half the time a train
/// of `train` bytes takes at `channel_bps`. The thread wakes when the first channel is due,
/// and the others due within this go with it; each pacer's clock still charges every train, so
/// no rate changes, and after the first few trains the channels stay in step: a wake-up per
/// train time, not one per channel. (What goes out at once is then every channel's train, the
/// bound [`SEND_TRAIN`] states for all channels.)
fn align_slack(train: u64, channel_bps: u64) -> Duration {
    airtime(train, channel_bps) / 2
}

/// How long `bytes` take at `bps`.
fn airtime(bytes: u64, bps: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 * 8.0 / bps.max(1) as f64)
}

/// Sends for several channels on one thread until told to stop: each channel sends what its
/// pacer allows in turn, then the thread sleeps until the first of them may send again, a
/// timer is due, or a command arrives. Returns the channels, to be counted or moved to other
/// links. A channel's error is reported and ends the thread.
pub(super) fn serve_channels(
    mut workers: Vec<ChannelWorker>,
    cmds: Receiver<ThreadCmd>,
) -> Vec<ChannelWorker> {
    let mut bufs = SendBufs::for_channels(&workers);
    // Channels sharing the thread send together ([`align_slack`]).
    let together = workers.len() > 1;
    // Hands a command to its channel; false when the thread is to stop.
    let dispatch = |workers: &mut [ChannelWorker], cmd: ThreadCmd| -> bool {
        match cmd {
            ThreadCmd::Stop => false,
            ThreadCmd::Channel(ch, cmd) => {
                if let Some(w) = workers.iter_mut().find(|w| w.ch == ch) {
                    w.on_cmd(cmd);
                }
                true
            }
        }
    };
    'run: loop {
        loop {
            match cmds.try_recv() {
                Ok(c) => {
                    if !dispatch(&mut workers, c) {
                        break 'run;
                    }
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => break 'run,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
            }
        }
        let mut wake: Option<Instant> = None;
        for w in &mut workers {
            match w.step(&mut bufs, together) {
                Ok(next) => wake = [wake, next].into_iter().flatten().min(),
                Err(e) => {
                    w.shared.to_loop(&w.events, ChanEvent::Failed(e));
                    break 'run;
                }
            }
        }
        let wait = match wake {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::from_millis(200),
        };
        if wait.is_zero() {
            continue;
        }
        let wait = wait.max(MIN_SLEEP);
        // Even short waits sleep: spinning through them with sched_yield costs CPU (on
        // loopback, a core both ends share) and gained nothing; a late wake-up is made up from
        // the pacer's credit. A command unparks the thread
        // (`ChannelCmds::send`); the loop's top takes it.
        std::thread::park_timeout(wait);
    }
    workers
}

/// How long a train is, in time at the session's rate, when the receiver's latest report
/// showed `queue` of queueing delay on a path of round-trip time `rtt`: [`SEND_TRAIN`], or
/// [`QUEUED_TRAIN`] once the queue is half of what `auto` keeps it under
/// ([`hurtle_proto::rate::model::queue_target`]: 7.5 ms on paths up to 120 ms). The room left
/// above such a queue is what the channels' trains go into back to back, and the report that
/// shows a queue rising comes half a round trip and a report later: the trains shrink before
/// the queue nears the target, where a probe may take it to the bottleneck's limit.
fn train_span(queue: Duration, rtt: Duration) -> Duration {
    if queue >= hurtle_proto::rate::model::queue_target(rtt) / 2 {
        QUEUED_TRAIN
    } else {
        SEND_TRAIN
    }
}

/// The fewest bytes one wake-up sends, all channels together, while the receiver reports no
/// queue on the path ([`train_span`] is [`SEND_TRAIN`]): four GSO sends' worth. Below
/// 262 Mbit/s, 2 ms of the rate is less: at 100 Mbit/s with 2 channels a train was 24 KB and a
/// channel sent every 3.8 ms (46,000 sends and 55,000 context switches per GiB); with a floor
/// of 128 KiB each channel sent one 64 KiB GSO send every 10.5 ms, and the thread woke about
/// a third as often. With 256 KiB a channel's share is more than one send holds, and it sends
/// it in several back to back ([`wake_ahead`]): at 2 channels two 64 KiB GSO sends every 21 ms
/// at 100 Mbit/s, every 2.1 ms at 1 Gbit/s (where 2 ms trains are one GSO send each), half
/// the wake-ups of 128 KiB. (A paced sender's wake-up costs more than its context switch: the
/// thread's caches are cold after each sleep, and at 100 Mbit/s a paced byte cost the sender
/// twice what it cost at 1 Gbit/s.) What goes into the bottleneck's queue at once is then at
/// most this (plus the pacers' credit and, channels sharing a thread, half a train each:
/// [`align_slack`]) at any rate where it exceeds 2 ms of the rate: 21 ms of 100 Mbit/s, 2.1 ms
/// of 1 Gbit/s; once the receiver reports a queue the trains are [`QUEUED_TRAIN`] of the rate
/// again, without the floor, and so are they on a path that loses more than
/// [`QUIET_MAX_LOSS_PPM`] or whose buffer has shown itself shallow ([`quiet_train`]).
const QUIET_WAKE_BYTES: u64 = 256 * 1024;

/// The random loss (parts per million, the controller's loss floor) above which a path gets
/// no [`QUIET_WAKE_BYTES`] floor: 1%. On `lossy-wifi-reorder` (200 Mbit/s, 2% loss, a 512 KB
/// queue that `auto` runs a few milliseconds into), the floor's 64 KiB trains instead of 2 ms
/// ones (50 KB) cost goodput in each of three pairs of runs (medians 176.9 against
/// 180.5 Mbit/s), for a small saving at that rate; `satellite` (0.1%) kept its goodput.
const QUIET_MAX_LOSS_PPM: u32 = 10_000;

/// How far ahead of its pacer a channel sends at a wake-up: the time its trains beyond the first
/// take at `channel_bps`, where its share of [`QUIET_WAKE_BYTES`] (`quiet`, [`quiet_train`])
/// exceeds one send (`cap`, [`train_cap`]: one GSO send at most). The pacer charges every
/// train, so the rate does not change; the channel sends its share (in whole sends, at least
/// one) at one wake-up and then sleeps the time it took: at 100 Mbit/s with 2 channels two
/// 64 KiB GSO sends every 21 ms, not one every 10.5 ms. Nothing ahead behind a queue, on a
/// lossy path or a shallow buffer (`quiet` is then 0).
fn wake_ahead(quiet: u64, cap: u64, channel_bps: u64) -> Duration {
    airtime(quiet.saturating_sub(cap.max(1)), channel_bps)
}

/// The bytes each of `among` channels sends back to back at least when the train is `span`
/// ([`train_span`]): its share of [`QUIET_WAKE_BYTES`] on a path without a queue, nothing
/// behind one, nor where the controller's random loss (`loss_ppm`, `u32::MAX`: not known yet)
/// is over [`QUIET_MAX_LOSS_PPM`] or the path's buffer is `shallow` (the controller has the
/// pacers repay nothing: [`hurtle_proto::rate::RateController::catch_up`]). ([`train_cap`]
/// keeps it within one send of the link.)
fn quiet_train(span: Duration, among: u16, loss_ppm: u32, shallow: bool) -> u64 {
    let lossy = loss_ppm != u32::MAX && loss_ppm > QUIET_MAX_LOSS_PPM;
    if span == SEND_TRAIN && !lossy && !shallow {
        QUIET_WAKE_BYTES / u64::from(among.max(1))
    } else {
        0
    }
}

/// The most bytes one send carries: `span` ([`train_span`]) of the session's `rate` (bits per
/// second), in whole datagrams of `payload` bytes, within `max_run` (what one send of the link
/// holds); at least [`MIN_SEND_DATAGRAMS`] and `train` (bytes: startup's trains, and
/// [`quiet_train`]) where `max_run` allows, and never less than one datagram.
fn train_cap(rate: u64, payload: u64, train: u64, max_run: u64, span: Duration) -> u64 {
    let payload = payload.max(1);
    let bytes = (rate as f64 / 8.0 * span.as_secs_f64()) as u64;
    let floor = (payload * MIN_SEND_DATAGRAMS)
        .max(train / payload * payload)
        .min(max_run)
        .max(payload);
    (bytes / payload * payload).clamp(floor, max_run.max(floor))
}

/// Buffers a channel thread shares between its channels, sized once for the largest send any
/// of them makes: the headers of the datagrams being sent, and a repair's bytes.
struct SendBufs {
    headers: Vec<u8>,
    scratch: IoBuf,
}

impl SendBufs {
    fn for_channels(workers: &[ChannelWorker]) -> SendBufs {
        let (datagrams, payload) = workers
            .iter()
            .map(ChannelWorker::max_send)
            .fold((0, 0), |(d, p), (wd, wp)| (d.max(wd), p.max(wp)));
        SendBufs {
            headers: vec![0u8; datagrams * HEADER_LEN],
            scratch: IoBuf::new(payload),
        }
    }
}

/// How many datagrams of `payload` bytes one send of at most `frames` frames carries over a
/// link whose frames add `overhead` bytes: over UDP, no more than one GSO send's bytes.
fn datagrams_within(frames: usize, payload: u16, overhead: usize, tcp: bool) -> usize {
    if tcp {
        frames
    } else {
        frames.min((crate::net::udp::MAX_GSO_BYTES / (overhead + usize::from(payload))).max(1))
    }
}

/// The most datagrams, and the most payload bytes, one send of at most `frames` frames carries
/// at any payload from [`wire::MIN_PAYLOAD`] to `max_payload`. Datagrams are most at the
/// smallest payload. Bytes are not most at either end: over UDP a send holds the datagrams
/// that fit one GSO send, a count rounded down at each size (52 datagrams of 1200 bytes carry
/// 62,400 bytes, 7 of 8900 only 62,300), but never more than that send's bytes.
fn send_limits(frames: usize, max_payload: u16, overhead: usize, tcp: bool) -> (usize, usize) {
    let datagrams = [wire::MIN_PAYLOAD, max_payload]
        .into_iter()
        .map(|p| datagrams_within(frames, p, overhead, tcp))
        .max()
        .unwrap_or(frames);
    let bytes = frames * usize::from(max_payload);
    if tcp {
        (datagrams, bytes)
    } else {
        (datagrams, bytes.min(crate::net::udp::MAX_GSO_BYTES))
    }
}

pub(super) struct ChannelWorker {
    pub(super) ch: u16,
    pub(super) link: LinkOut,
    pub(super) sender: ChannelSender,
    pub(super) pacer: Pacer,
    pub(super) shared: Arc<Shared>,
    pub(super) events: Sender<ChanEvent>,
    pub(super) log: NetLog,
    /// The channel's data packet numbers (data and final markers): never one twice, and the
    /// session ends when they are used up.
    pub(super) packets: PacketNumbers,
    /// The shared rate last applied to this channel's pacer.
    pub(super) rate_seen: u64,
    /// How many channels shared it then.
    pub(super) among: u16,
    /// The catch-up allowance last applied to the pacer, microseconds.
    pub(super) catch_up_seen: u64,
    /// The round trip last applied to the channel's sender ([`Shared::rtt`]).
    pub(super) rtt_seen: Duration,
    /// This channel has new data to send, and counts in [`Shared::sending`].
    pub(super) sending: bool,
    /// The block new data is being sent from, and its bytes.
    pub(super) loaded: Option<u64>,
    /// The block whose value was passed on last (a hole's value is, without loading it).
    pub(super) valued: Option<u64>,
    pub(super) block_buf: IoBuf,
    /// Datagrams sent and resent.
    pub(super) sent: u64,
    pub(super) resent: u64,
    /// The tail's groups of new data, for their parity ([`hurtle_proto::fec`]).
    pub(super) groups: TailGroups,
    /// Parity datagrams sent.
    pub(super) parity_sent: u64,
    /// Values the blocks resumed from an earlier transfer on a thread of its own, once there
    /// is one: reading and hashing them does not hold up the new data.
    pub(super) held_valuer: Option<HeldValuer>,
}

/// A thread that values a channel's held blocks that were resumed from an earlier transfer
/// (read and hashed, as [`held_value`] does), so that the channel's new data goes out at once
/// rather than after gigabytes of them: each value goes to the session loop as the channel's
/// own would. Dropped, it stops at the next block and is joined.
pub(super) struct HeldValuer {
    tx: Option<Sender<u64>>,
    quit: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl HeldValuer {
    fn start(
        ch: u16,
        shared: Arc<Shared>,
        events: Sender<ChanEvent>,
    ) -> Result<Self, SessionError> {
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let quit = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = quit.clone();
        let handle = std::thread::Builder::new()
            .name(format!("held-{ch}"))
            .spawn(move || {
                let mut buf = IoBuf::new(shared.layout.block_size() as usize);
                for block in rx {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let event = match held_value(&shared, &mut buf, block) {
                        Ok(value) => ChanEvent::Block {
                            block,
                            value,
                            held: true,
                        },
                        Err(e) => ChanEvent::Failed(e),
                    };
                    let failed = matches!(event, ChanEvent::Failed(_));
                    if !shared.to_loop(&events, event) || failed {
                        return;
                    }
                }
            })
            .map_err(|e| SessionError::io("held block thread", e))?;
        Ok(HeldValuer {
            tx: Some(tx),
            quit,
            handle: Some(handle),
        })
    }

    fn value(&self, block: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(block);
        }
    }
}

impl Drop for HeldValuer {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::Relaxed);
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The value of held `block`, read into `buf` (a hole is not read: see
/// [`ChannelWorker::load_block`]).
fn held_value(
    shared: &Shared,
    buf: &mut IoBuf,
    block: u64,
) -> Result<hurtle_proto::hash::BlockValue, SessionError> {
    let layout = &shared.layout;
    let (file, range) = layout
        .block_file_range(block)
        .ok_or(SessionError::Internal("a block outside the layout"))?;
    let blen = (range.end - range.start) as usize;
    let source = &shared.sources[file as usize];
    let blocks = layout.blocks_of(file);
    let index = block - blocks.start;
    let announced = source.is_announced_hole(index);
    let data = if source.is_hole(range.start, range.end)? {
        if announced {
            return Ok(hole_value(index, blen as u64));
        }
        crate::iobuf::zeros(blen)
    } else {
        let data = &mut buf.aligned()[..blen];
        source.read_at(range.start, data)?;
        &*data
    };
    Ok(value_of(
        data,
        index,
        layout.block_size(),
        blocks.end - blocks.start,
        announced,
    ))
}

impl ChannelWorker {
    fn on_cmd(&mut self, cmd: ChanCmd) {
        match cmd {
            ChanCmd::Nack(ranges, knew_us) => {
                let now = Instant::now();
                let knew = wire::sent_at(self.shared.start, now, knew_us);
                let q = self.sender.on_nack(&ranges, now, knew);
                self.log.line(|| {
                    format!(
                        "nack ranges={} queued={q} first={:?} knew_ms={} knew_us={knew_us} now_us={}",
                        ranges.len(),
                        ranges.first(),
                        now.saturating_duration_since(knew).as_millis(),
                        now.saturating_duration_since(self.shared.start).as_micros() as u32
                    )
                });
            }
            ChanCmd::Done => {
                self.sender.on_channel_done();
                self.log.line(|| "channel confirmed".into());
            }
            ChanCmd::Redirect(to) => {
                if let crate::net::channel_link::OutPath::Udp { dest, .. } = &mut self.link.path {
                    *dest = to;
                    // Counted as direct from the first send there, not from when the punch
                    // succeeded: what the channel sent before this went through the relay.
                    self.shared
                        .progress
                        .set_route(self.ch, crate::progress::Route::Direct);
                    self.log
                        .line(|| format!("direct path to {to}: the relay is left"));
                }
            }
        }
    }

    /// How many datagrams one send may carry now: the link's limit, and over UDP no more than
    /// one GSO send's bytes.
    fn max_datagrams(&self, payload: u16) -> usize {
        self.datagrams_within(self.link.max_frames(), payload)
    }

    /// The most datagrams one send can ever make (the link's limit changes when GSO is turned
    /// off after a failure, but never exceeds [`LinkOut::frame_limit`]), and the most payload
    /// bytes in them: what the buffers are sized for, whatever payload probing moves to between
    /// [`wire::MIN_PAYLOAD`] and the session's largest ([`send_limits`]).
    fn max_send(&self) -> (usize, usize) {
        send_limits(
            self.link.frame_limit(),
            self.shared.max_payload.load(Ordering::Relaxed),
            self.link.frame_overhead(),
            self.link.is_tcp(),
        )
    }

    fn datagrams_within(&self, frames: usize, payload: u16) -> usize {
        datagrams_within(
            frames,
            payload,
            self.link.frame_overhead(),
            self.link.is_tcp(),
        )
    }

    /// True when held `block` was resumed from an earlier transfer (not a hole the manifest
    /// announced).
    fn is_resumed(&self, block: u64) -> bool {
        let layout = &self.shared.layout;
        layout.file_of_block(block).is_some_and(|(file, index)| {
            !self.shared.sources[file as usize].is_announced_hole(index)
        })
    }

    /// Reads `block` into the block buffer unless it is there already, and the first time
    /// hashes it and passes its value on (for the receiver; `held`: the receiver has the block
    /// and will not be sent it, and if it lies in a hole it is hashed as zeros, not read).
    /// Returns the block's file offset.
    fn load_block(&mut self, block: u64, held: bool) -> Result<u64, SessionError> {
        let layout = &self.shared.layout;
        let (file, range) = layout
            .block_file_range(block)
            .ok_or(SessionError::Internal("a block outside the layout"))?;
        let loaded = self.loaded == Some(block);
        // Bytes to send from the buffer (a held block's are not sent), and a value to pass on.
        let need_bytes = !held && !loaded;
        let need_value = self.valued != Some(block);
        if need_bytes || need_value {
            let blen = (range.end - range.start) as usize;
            let source = &self.shared.sources[file as usize];
            // A hole the receiver holds as a hole is not read: reading one makes the kernel
            // fill page-cache pages with zeros (a GiB of holes cost a second of it).
            let mut in_hole = false;
            let data = if loaded {
                &self.block_buf.aligned()[..blen]
            } else if held && source.is_hole(range.start, range.end)? {
                in_hole = true;
                crate::iobuf::zeros(blen)
            } else {
                let block_buf = &mut self.block_buf.aligned()[..blen];
                source.read_at(range.start, block_buf)?;
                self.loaded = Some(block);
                &*block_buf
            };
            if need_value {
                let blocks = layout.blocks_of(file);
                let index = block - blocks.start;
                let announced = source.is_announced_hole(index);
                // An announced hole that still is one is not hashed either (see
                // `hurtle_proto::hash::hole_value`).
                let value = if in_hole && announced {
                    hole_value(index, blen as u64)
                } else {
                    value_of(
                        data,
                        index,
                        layout.block_size(),
                        blocks.end - blocks.start,
                        announced,
                    )
                };
                self.valued = Some(block);
                self.shared
                    .to_loop(&self.events, ChanEvent::Block { block, value, held });
            }
        }
        Ok(range.start)
    }

    /// Tells the channel's sender whether it is in its tail ([`fec::in_tail`]: its repairs go
    /// twice there), and returns the piece size new data is cut at there, from datagrams of
    /// `payload` bytes: `None` outside the tail, over TCP (which loses nothing) and without
    /// [`super::SendOptions::fec`], nor where the path has lost nothing so far (see
    /// [`hurtle_proto::fec`]).
    fn tail_piece(&mut self, payload: u16) -> Option<u16> {
        let left = self.sender.new_remaining();
        let tail = fec::in_tail(left, self.pacer.rate(), self.shared.rtt());
        self.sender.set_tail(tail);
        if !tail
            || !self.shared.fec
            || self.link.is_tcp()
            || self.shared.lost_nothing.load(Ordering::Relaxed)
        {
            return None;
        }
        Some(fec::piece_size(payload)).filter(|&p| p >= wire::MIN_PAYLOAD / 2)
    }

    /// New tail data `run` (stripe position and length) went out in pieces of `piece` bytes;
    /// its block ends at stripe position `block_end`. Sends the parity of the groups that
    /// closes (from the block buffer, where their bytes are); returns the bytes sent.
    fn send_parity(
        &mut self,
        headers: &mut [u8],
        run: (u64, u64),
        piece: u16,
        block_end: u64,
    ) -> Result<usize, SessionError> {
        let max = fec::group_pieces(self.pacer.rate(), piece);
        let tail_len = self.groups.tail_len(self.sender.new_remaining() + run.1);
        let groups = self.groups.on_sent(run.0, run.1, piece, block_end, max);
        let loss = match self.shared.loss_ppm.load(Ordering::Relaxed) {
            u32::MAX => fec::DEFAULT_LOSS,
            ppm => f64::from(ppm) / 1e6,
        };
        let stride = fec::DESC_LEN + usize::from(piece);
        let per_send = self.max_datagrams(stride as u16).max(1);
        let mut total = 0;
        for g in groups {
            let span = self
                .shared
                .layout
                .resolve(self.ch, g.pos)
                .ok_or(SessionError::Internal("a parity group outside the layout"))?;
            if self.loaded != Some(span.block) {
                // Its bytes are gone (never so far): the receiver asks for any loss as before.
                continue;
            }
            let at = (span.offset % self.shared.layout.block_size()) as usize;
            let bytes = &self.block_buf.aligned()[at..at + g.len as usize];
            let failure = fec::group_failure(g.len, tail_len);
            let count = fec::parity_count(bytes.len().div_ceil(usize::from(piece)), loss, failure);
            let shards = fec::encode(bytes, piece, count);
            let sent_us = self.shared.start.elapsed().as_micros() as u32;
            let mut body = vec![0u8; count * stride];
            for (j, shard) in shards.iter().enumerate() {
                let out = &mut body[j * stride..(j + 1) * stride];
                ParityDesc {
                    len: g.len as u32,
                    piece,
                    index: j as u8,
                    count: count as u8,
                }
                .encode(out);
                out[fec::DESC_LEN..].copy_from_slice(shard);
            }
            for (k, chunk) in body.chunks(per_send * stride).enumerate() {
                let n = chunk.len() / stride;
                for i in 0..n {
                    Header {
                        kind: Kind::Parity,
                        flags: 0,
                        channel: self.ch,
                        session: self.shared.session,
                        packet: self.packets.next_number()?,
                        file: span.file,
                        offset: span.offset,
                        len: 0,
                        sent_us,
                    }
                    .encode(&mut headers[i * HEADER_LEN..]);
                }
                self.link
                    .send_framed(&headers[..n * HEADER_LEN], chunk, stride)?;
                self.log.line(|| {
                    format!(
                        "parity pos={} len={} piece={piece} shards={n} of {count} (send {k})",
                        g.pos, g.len
                    )
                });
            }
            self.parity_sent += count as u64;
            total += count * (HEADER_LEN + stride);
        }
        Ok(total)
    }

    /// Sends what the pacer allows (new data, repairs, the final marker) at the rate the
    /// controller last chose; returns when it should run again (`None`: only when a command
    /// comes). `together`: the thread serves other channels too, and this one's trains may go
    /// early by [`align_slack`], with theirs.
    fn step(
        &mut self,
        bufs: &mut SendBufs,
        together: bool,
    ) -> Result<Option<Instant>, SessionError> {
        // Its own handle, so that reading blocks (which borrows the worker) can go on beside it.
        let shared = self.shared.clone();
        let layout = &shared.layout;
        let payload16 = self.shared.payload.load(Ordering::Relaxed);
        let scratch = &mut bufs.scratch;
        let headers = &mut bufs.headers;
        // Data, as the pacer allows, at the rate the controller last chose: shared among the
        // channels that still have new data to send, while this one has.
        if self.sending && self.sender.new_remaining() == 0 {
            self.sending = false;
            shared.sending.fetch_sub(1, Ordering::Relaxed);
        }
        let rate = self.shared.rate_bps.load(Ordering::Relaxed);
        let among = if self.sending {
            shared.sending.load(Ordering::Relaxed).max(1)
        } else {
            self.shared.channels
        };
        let mut now = Instant::now();
        if (rate, among) != (self.rate_seen, self.among) {
            self.rate_seen = rate;
            self.among = among;
            self.pacer
                .set_rate((rate / u64::from(among)).max(100_000), now);
            self.log
                .line(|| format!("rate {rate} bit/s for all channels, shared by {among}"));
        }
        let rtt = self.shared.rtt();
        if rtt < self.rtt_seen {
            self.rtt_seen = rtt;
            self.sender.set_rtt(rtt);
            self.log
                .line(|| format!("rtt {} us: the path's", rtt.as_micros()));
        }
        let catch_up = self.shared.catch_up_us.load(Ordering::Relaxed);
        if catch_up != self.catch_up_seen {
            self.catch_up_seen = catch_up;
            self.pacer.set_max_owed(Duration::from_micros(catch_up));
            self.log
                .line(|| format!("catch-up after a stall: at most {catch_up} us"));
        }
        let span = train_span(
            Duration::from_micros(shared.queue_delay_us.load(Ordering::Relaxed)),
            shared.rtt(),
        );
        // The floor of a train on a quiet path (`quiet_train`).
        let quiet = quiet_train(
            span,
            self.among,
            shared.loss_ppm.load(Ordering::Relaxed),
            self.catch_up_seen == 0,
        );
        let cap = {
            let payload = u64::from(payload16);
            let max_run = self.max_datagrams(payload16) as u64 * payload;
            let train = shared.train_bytes.load(Ordering::Relaxed).max(quiet);
            train_cap(self.rate_seen, payload, train, max_run, span)
        };
        let early = if together {
            align_slack(cap, self.pacer.rate())
        } else {
            Duration::ZERO
        };
        // A quiet path's share of `QUIET_WAKE_BYTES` goes out at one wake-up, in as many sends
        // as it takes (`wake_ahead`).
        let ahead = wake_ahead(quiet, cap, self.pacer.rate());
        let mut bursts = 0;
        while self.pacer.can_send(now + early + ahead) && bursts < 16 {
            // The tail's new data goes in pieces that leave room for a parity descriptor.
            let piece = self.tail_piece(payload16);
            let payload16 = piece.unwrap_or(payload16);
            let payload = usize::from(payload16);
            // The buffers fit any run the link allows (`max_send`).
            let max_run = (self.max_datagrams(payload16) * payload) as u64;
            // Each send is at most `span` of the session's rate (and at least
            // MIN_SEND_DATAGRAMS where the link allows): a shallow bottleneck queue then sees
            // short trains, not 64-datagram GSO bursts. While startup lasts, at least the
            // controller's train, which a receiver behind GRO can time; without a queue, at
            // least this channel's share of `QUIET_WAKE_BYTES` (fewer, fuller wake-ups).
            let train = shared.train_bytes.load(Ordering::Relaxed).max(quiet);
            let run_cap = train_cap(self.rate_seen, payload as u64, train, max_run, span);
            // Before the receiver's decisions, within the early data's budget only (a run cut
            // to what is left of it: startup's trains are up to 64 KiB a channel).
            let early_left = shared.early_left.load(Ordering::Relaxed);
            if early_left == 0 {
                self.pacer.idle();
                break;
            }
            let run_cap = run_cap.min(early_left);
            let Some(run) = self.sender.poll_run(layout, run_cap, now) else {
                // Nothing to send: the time until there is is not owed.
                self.pacer.idle();
                break;
            };
            bursts += 1;
            let span = layout
                .resolve(self.ch, run.pos)
                .ok_or(SessionError::Internal("a run outside the layout"))?;
            let len = run.len as usize;
            let data: &[u8] = match run.kind {
                RunKind::Held => {
                    // The receiver has these bytes: it needs only their value to check them.
                    // Announced holes are valued here (without reading: see `load_block`);
                    // resumed blocks on the held block thread, while new data goes out.
                    if self.is_resumed(span.block) {
                        // Its value kept by an earlier session, for the source as it is now:
                        // not read at all.
                        if let Some(value) = shared.cached_value(span.block) {
                            shared.resume_cached.fetch_add(1, Ordering::Relaxed);
                            shared.to_loop(
                                &self.events,
                                ChanEvent::Block {
                                    block: span.block,
                                    value,
                                    held: true,
                                },
                            );
                            self.log.line(|| {
                                format!("held block {} valued from the cache", span.block)
                            });
                            continue;
                        }
                        shared.resume_read.fetch_add(1, Ordering::Relaxed);
                        if self.held_valuer.is_none() {
                            let valuer = HeldValuer::start(
                                self.ch,
                                self.shared.clone(),
                                self.events.clone(),
                            )?;
                            self.held_valuer = Some(valuer);
                        }
                        if let Some(v) = &self.held_valuer {
                            v.value(span.block);
                        }
                        self.log
                            .line(|| format!("held block {} to the held block thread", span.block));
                    } else {
                        self.load_block(span.block, true)?;
                        self.log
                            .line(|| format!("held block {} hashed", span.block));
                    }
                    continue;
                }
                RunKind::New => {
                    let start = self.load_block(span.block, false)?;
                    let at = (span.offset - start) as usize;
                    &self.block_buf.aligned()[at..at + len]
                }
                RunKind::Repair => {
                    let buf = scratch.for_offset(span.offset, len);
                    shared.sources[span.file as usize].read_at(span.offset, buf)?;
                    buf
                }
            };
            let flags = if run.kind == RunKind::Repair {
                wire::FLAG_RETRANSMIT
            } else {
                0
            };
            let sent_us = self.shared.start.elapsed().as_micros() as u32;
            let mut total = 0;
            let mut n = 0u64;
            // Headers only: the link gathers each datagram from its header and its slice of
            // `data`, which is not copied.
            for (i, piece) in data.chunks(payload).enumerate() {
                let at = i * HEADER_LEN;
                Header {
                    kind: Kind::Data,
                    flags,
                    channel: self.ch,
                    session: self.shared.session,
                    packet: self.packets.next_number()?,
                    file: span.file,
                    offset: span.offset + (i * payload) as u64,
                    len: piece.len() as u16,
                    sent_us,
                }
                .encode(&mut headers[at..]);
                total += HEADER_LEN + piece.len();
                n += 1;
            }
            self.link
                .send_framed(&headers[..n as usize * HEADER_LEN], data, payload)?;
            if self.sent == 0 {
                shared
                    .first_data_us
                    .fetch_min(shared.start.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            self.sent += n;
            shared.progress.note_moving(self.ch, span.file);
            if run.kind == RunKind::Repair {
                self.resent += n;
            } else {
                self.shared
                    .progress
                    .sent
                    .fetch_add(run.len, Ordering::Relaxed);
            }
            self.log.line(|| {
                format!(
                    "send {:?} pos={} len={} datagrams={n} pkt={}",
                    run.kind,
                    run.pos,
                    run.len,
                    self.packets.last()
                )
            });
            if run.kind == RunKind::New && self.sender.new_remaining() == 0 {
                // The channel's last new byte is on its way: the tail starts.
                let at = shared.start.elapsed().as_micros() as u64;
                shared.new_data_sent_us.fetch_max(at, Ordering::Relaxed);
            }
            if let (Some(piece), RunKind::New) = (piece, run.kind) {
                let end = run.pos + span.to_block_end;
                total += self.send_parity(headers, (run.pos, run.len), piece, end)?;
            }
            self.pacer.on_sent(now, total as u64);
            shared.progress.count_sent(self.ch, total as u64);
            if early_left != u64::MAX {
                let _ =
                    shared
                        .early_left
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                            (left != u64::MAX).then(|| left.saturating_sub(total as u64))
                        });
            }
            now = Instant::now();
        }
        // The final marker.
        if self.sender.poll_final(now) {
            let mut fin = [0u8; HEADER_LEN];
            Header {
                kind: Kind::Final,
                flags: 0,
                channel: self.ch,
                session: self.shared.session,
                packet: self.packets.next_number()?,
                file: 0,
                offset: self.sender.stripe_len(),
                len: 0,
                // Stamped like data: the receiver takes a one-way delay sample from it.
                sent_us: self.shared.start.elapsed().as_micros() as u32,
            }
            .encode(&mut fin);
            self.link.send_headers(&fin)?;
            self.log
                .line(|| format!("final stripe_len={}", self.sender.stripe_len()));
        }
        // When the pacer or a timer allows more (with the early data's budget spent, not
        // before the session loop wakes the thread: `ChannelThreads::wake`).
        let spent = shared.early_left.load(Ordering::Relaxed) == 0;
        let pace = if self.sender.has_work() && !spent {
            // When it is due (not `early` before: it goes early only with another's train).
            Some(self.pacer.ready_at().unwrap_or(now))
        } else {
            None
        };
        Ok([pace, self.sender.next_timeout()]
            .into_iter()
            .flatten()
            .min())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::channel_link::TCP_PAYLOAD;
    use crate::net::udp::MAX_FRAMED;

    /// The file bytes of one GSO send of `payload`-byte datagrams (at least one datagram).
    fn gso_run(payload: u64) -> u64 {
        (crate::net::udp::MAX_GSO_BYTES as u64 / (wire::DATAGRAM_OVERHEAD as u64 + payload)).max(1)
            * payload
    }

    /// One channel thread serving one channel of `channels`, as [`serve_channels`] and
    /// [`ChannelWorker::step`] do, for `span` of simulated time: each wake-up sends trains of
    /// [`train_cap`] ([`SEND_TRAIN`], at least the channel's share of [`QUIET_WAKE_BYTES`]
    /// within one GSO send) while the pacer allows ([`wake_ahead`] of it: the rest of that
    /// share; 16 at most), then sleeps until
    /// the pacer allows the next, at least [`MIN_SLEEP`], and wakes `late(i)` after that.
    /// Returns each send's time (from the start) and bytes, and the wake-ups.
    fn simulate(
        rate: u64,
        channels: u16,
        payload: u64,
        span: Duration,
        late: impl FnMut(usize) -> Duration,
    ) -> (Vec<(Duration, u64)>, usize) {
        simulate_trains(rate, channels, payload, span, SEND_TRAIN, late)
    }

    /// [`simulate`] with trains of `train` of the rate.
    fn simulate_trains(
        rate: u64,
        channels: u16,
        payload: u64,
        span: Duration,
        train: Duration,
        late: impl FnMut(usize) -> Duration,
    ) -> (Vec<(Duration, u64)>, usize) {
        let (sends, wakes, _) = simulate_lost(rate, channels, payload, span, train, late);
        (sends, wakes)
    }

    /// [`simulate_trains`], and with each send the time its pacer lost so far (missed beyond
    /// what it repays: [`Pacer::lost`]).
    fn simulate_lost(
        rate: u64,
        channels: u16,
        payload: u64,
        span: Duration,
        train: Duration,
        mut late: impl FnMut(usize) -> Duration,
    ) -> (Vec<(Duration, u64)>, usize, Vec<Duration>) {
        let t0 = Instant::now();
        let mut lost = Vec::new();
        let max_run = gso_run(payload);
        let mut pacer = Pacer::new(rate / u64::from(channels), PACER_CREDIT);
        let (mut now, mut sends, mut wakes) = (t0, Vec::new(), 0);
        while now < t0 + span {
            wakes += 1;
            let mut bursts = 0;
            let quiet = quiet_train(train, channels, u32::MAX, false);
            let run = train_cap(rate, payload, quiet, max_run, train);
            let ahead = wake_ahead(quiet, run, rate / u64::from(channels));
            while pacer.can_send(now + ahead) && bursts < 16 {
                sends.push((now - t0, run));
                pacer.on_sent(now, run);
                lost.push(pacer.lost());
                bursts += 1;
            }
            let wait = pacer.ready_at().map_or(Duration::ZERO, |t| t - now.min(t));
            if !wait.is_zero() {
                now += wait.max(MIN_SLEEP) + late(wakes);
            }
        }
        (sends, wakes, lost)
    }

    /// The train one of `channels` channels sends on a path without a queue: [`SEND_TRAIN`]
    /// of the session's rate, at least its share of [`QUIET_WAKE_BYTES`], within one GSO send.
    fn quiet_cap(rate: u64, channels: u16, payload: u64) -> u64 {
        let train = quiet_train(SEND_TRAIN, channels, u32::MAX, false);
        train_cap(rate, payload, train, gso_run(payload), SEND_TRAIN)
    }

    /// What one of `channels` channels sends at a wake-up on a path without a queue: one train
    /// ([`quiet_cap`]), or where its share of [`QUIET_WAKE_BYTES`] is more, that share
    /// ([`wake_ahead`]).
    fn wake_cap(rate: u64, channels: u16, payload: u64) -> u64 {
        let quiet = quiet_train(SEND_TRAIN, channels, u32::MAX, false);
        quiet_cap(rate, channels, payload).max(quiet)
    }

    /// What one channel may put on the wire back to back (see [`SEND_TRAIN`] and
    /// [`QUIET_WAKE_BYTES`]): a wake-up's trains ([`wake_cap`]) and its pacer's credit, a
    /// quarter more while missed time is repaid.
    fn burst_bound(rate: u64, channels: u16, payload: u64) -> u64 {
        let credit = PACER_CREDIT.mul_f64(hurtle_proto::channel_send::CATCH_UP_GAIN);
        wake_cap(rate, channels, payload)
            + (rate as f64 / 8.0 / f64::from(channels) * credit.as_secs_f64()) as u64
    }

    /// Bytes sent at each wake-up (sends at one instant).
    fn per_wake(sends: &[(Duration, u64)]) -> Vec<u64> {
        let mut out: Vec<(Duration, u64)> = Vec::new();
        for &(t, b) in sends {
            match out.last_mut() {
                Some((at, sum)) if *at == t => *sum += b,
                _ => out.push((t, b)),
            }
        }
        out.into_iter().map(|(_, b)| b).collect()
    }

    /// Pacing with coarser wake-ups keeps the rate and the burst size within the bounds
    /// [`SEND_TRAIN`] and [`QUIET_WAKE_BYTES`] state: at 100 Mbit/s with 2 channels on a path
    /// without a queue a channel wakes every 21 ms on average (not every 3.8 ms, as with
    /// 2 ms trains alone, nor every 10.5 ms, as with one GSO send a wake-up; at least 19 ms
    /// here, where a late wake-up sometimes sends a train more), sends two 64 KiB GSO sends a
    /// wake-up ([`wake_ahead`]), and keeps its rate to within two of them.
    #[test]
    fn coarser_wake_ups_keep_the_rate_and_the_burst_bound() {
        let payload = u64::from(wire::DEFAULT_PAYLOAD);
        for (rate, min_gap_us) in [
            (100_000_000u64, 19_000u64),
            (200_000_000, 9_500),
            (400_000_000, 4_600),
            (1_000_000_000, 1_800),
        ] {
            let span = Duration::from_secs(2);
            // A thread that wakes 0-400 µs late, in a fixed pattern.
            let (sends, wakes) = simulate(rate, 2, payload, span, |i| {
                Duration::from_micros((i as u64 * 137) % 400)
            });
            let sent: u64 = sends.iter().map(|s| s.1).sum();
            let want = rate as f64 / 8.0 / 2.0 * span.as_secs_f64();
            let train = wake_cap(rate, 2, payload);
            assert!(
                (sent as f64 - want).abs() <= train as f64 * 2.0,
                "{rate}: sent {sent}, want {want}"
            );
            let gap = span.as_micros() as u64 / wakes as u64;
            assert!(gap >= min_gap_us, "{rate}: a wake-up every {gap} us");
            let most = per_wake(&sends).into_iter().max().unwrap_or(0);
            let bound = burst_bound(rate, 2, payload);
            assert!(most <= bound, "{rate}: {most} bytes at once, bound {bound}");
        }
        // The doc's figures: 24 KB trains at 100 Mbit/s, the GSO limit at 400 Mbit/s and up.
        assert_eq!(
            train_cap(100_000_000, payload, 0, 1 << 20, SEND_TRAIN),
            23_732
        );
        // Without a queue, at least a share of QUIET_WAKE_BYTES: with 2 channels one GSO send
        // each below 262 Mbit/s (and another at the same wake-up: `wake_cap`); with 8, 32 KiB
        // each (23 datagrams), more than 2 ms of 100 Mbit/s. Behind a queue, no floor.
        assert_eq!(quiet_cap(100_000_000, 2, payload), gso_run(payload));
        assert_eq!(quiet_cap(100_000_000, 1, payload), gso_run(payload));
        assert_eq!(quiet_cap(100_000_000, 8, payload), 32_108);
        assert_eq!(wake_cap(100_000_000, 2, payload), 128 * 1024);
        assert_eq!(quiet_train(QUEUED_TRAIN, 2, u32::MAX, false), 0);
        // Nor on a lossy path (over 1%), nor a shallow buffer; below 1%, and before the loss
        // is known, the floor.
        assert_eq!(quiet_train(SEND_TRAIN, 2, 20_000, false), 0);
        assert_eq!(quiet_train(SEND_TRAIN, 2, 1_000, true), 0);
        assert_eq!(quiet_train(SEND_TRAIN, 2, 1_000, false), 128 * 1024);
        assert_eq!(quiet_train(SEND_TRAIN, 2, u32::MAX, false), 128 * 1024);
        // All channels together send at most QUIET_WAKE_BYTES at a wake-up where 2 ms trains
        // would have been less, and no more than those trains where they are not.
        for channels in 1..=8u16 {
            for rate in [
                50_000_000u64,
                100_000_000,
                262_000_000,
                400_000_000,
                1_000_000_000,
            ] {
                let ch = u64::from(channels);
                let together = wake_cap(rate, channels, payload) * ch;
                let trains = train_cap(rate, payload, 0, gso_run(payload), SEND_TRAIN) * ch;
                assert!(
                    together <= trains.max(QUIET_WAKE_BYTES),
                    "{channels} x {rate}: {together} at once"
                );
            }
        }
        // A wake-up 5 ms late (beyond the credit) sends at most the bound, not the 5 ms.
        let (sends, _) = simulate(100_000_000, 2, payload, Duration::from_millis(100), |i| {
            Duration::from_millis(if i == 10 { 5 } else { 0 })
        });
        let most = per_wake(&sends).into_iter().max().unwrap_or(0);
        assert!(most <= burst_bound(100_000_000, 2, payload), "{most}");
    }

    /// A channel's share of [`QUIET_WAKE_BYTES`] beyond one GSO send goes out at the same
    /// wake-up ([`wake_ahead`]): at 100 Mbit/s with 2 channels, two 64 KiB sends a wake-up,
    /// within the burst bound; nothing ahead where the share fits one send, or behind a queue.
    #[test]
    fn a_wake_up_sends_its_share_in_several_sends() {
        let payload = u64::from(wire::DEFAULT_PAYLOAD);
        let span = Duration::from_secs(2);
        let (sends, wakes) = simulate(100_000_000, 2, payload, span, |_| Duration::ZERO);
        let per = per_wake(&sends);
        let mean = per.iter().sum::<u64>() / per.len() as u64;
        assert!(
            mean >= 2 * gso_run(payload),
            "{mean} bytes a wake-up ({wakes} wake-ups)"
        );
        let most = per.iter().copied().max().unwrap_or(0);
        assert!(most <= burst_bound(100_000_000, 2, payload), "{most}");
        let quiet = quiet_train(SEND_TRAIN, 2, u32::MAX, false);
        let ahead = wake_ahead(quiet, gso_run(payload), 50_000_000);
        assert!(ahead > Duration::from_millis(10), "{ahead:?}");
        assert_eq!(
            wake_ahead(gso_run(payload), gso_run(payload), 50_000_000),
            Duration::ZERO
        );
        let queued = quiet_train(QUEUED_TRAIN, 2, u32::MAX, false);
        assert_eq!(wake_ahead(queued, 23_732, 50_000_000), Duration::ZERO);
    }

    /// While the receiver reports a queue of half `auto`'s target or more ([`train_span`]), a
    /// wake-up puts less than half as much into the bottleneck's queue: at 200 Mbit/s with 2
    /// channels (`lossy-wifi-reorder`), a channel sends 25 KB a wake-up instead of one 64 KiB
    /// GSO send (its share of [`QUIET_WAKE_BYTES`], more than 2 ms of the rate), and it keeps
    /// its rate. Without a queue, and below half the target, the trains stay long (and the
    /// wake-ups few: [`coarser_wake_ups_keep_the_rate_and_the_burst_bound`]).
    #[test]
    fn a_queue_on_the_path_shortens_the_trains() {
        let ms = Duration::from_millis;
        // 20 ms round trip: the target is 15 ms; 150 ms: 18.75 ms.
        assert_eq!(train_span(Duration::ZERO, ms(20)), SEND_TRAIN);
        assert_eq!(train_span(ms(7), ms(20)), SEND_TRAIN);
        assert_eq!(train_span(ms(8), ms(20)), QUEUED_TRAIN);
        assert_eq!(train_span(ms(19), ms(20)), QUEUED_TRAIN);
        assert_eq!(train_span(ms(9), ms(150)), SEND_TRAIN);
        assert_eq!(train_span(ms(10), ms(150)), QUEUED_TRAIN);
        let payload = u64::from(wire::DEFAULT_PAYLOAD);
        let rate = 200_000_000u64;
        let span = Duration::from_secs(2);
        let late = |i: usize| Duration::from_micros((i as u64 * 137) % 400);
        let mut most = Vec::new();
        for queue in [Duration::ZERO, ms(9)] {
            let train = train_span(queue, ms(20));
            let (sends, _) = simulate_trains(rate, 2, payload, span, train, late);
            let sent: u64 = sends.iter().map(|s| s.1).sum();
            let want = rate as f64 / 8.0 / 2.0 * span.as_secs_f64();
            assert!(
                (sent as f64 - want).abs() <= 50_000.0,
                "{queue:?}: sent {sent}, want {want}"
            );
            let per_wake = per_wake(&sends);
            let mean = per_wake.iter().sum::<u64>() / per_wake.len() as u64;
            most.push((mean, per_wake.into_iter().max().unwrap_or(0)));
        }
        let ((long_mean, long_most), (short_mean, short_most)) = (most[0], most[1]);
        assert!(
            long_mean >= 45_000,
            "{long_mean} bytes a wake-up without a queue"
        );
        assert!(
            short_mean <= 30_000,
            "{short_mean} bytes a wake-up behind a queue"
        );
        assert!(
            short_most * 3 <= long_most * 2,
            "{short_most} / {long_most} at most"
        );
    }

    /// Two channels on one thread ([`send_threads`] at a ceiling of 1 Gbit/s or less) go out
    /// at the same wake-ups ([`align_slack`]): one wake-up per train time, not one per channel,
    /// and each channel keeps its rate. Without the slack, a second channel started half a
    /// train later keeps its own wake-ups: twice as many.
    #[test]
    fn channels_on_one_thread_send_at_the_same_wake_ups() {
        assert_eq!(send_threads(2, false, 1_000_000_000), 1);
        assert_eq!(send_threads(8, false, 100_000_000), 1);
        assert_eq!(send_threads(2, true, 100_000_000), 2);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(send_threads(2, false, 2_000_000_000), 2.min(cores));
        let payload = u64::from(wire::DEFAULT_PAYLOAD);
        for rate in [100_000_000u64, 400_000_000, 1_000_000_000] {
            let per = rate / 2;
            let train = quiet_cap(rate, 2, payload);
            let gap = Duration::from_secs_f64(train as f64 * 8.0 / per as f64);
            let span = Duration::from_secs(1);
            let t0 = Instant::now();
            let run = |slack: bool| {
                let mut pacers = [Pacer::new(per, PACER_CREDIT), Pacer::new(per, PACER_CREDIT)];
                // The second channel's first train goes 0.6 of a train time after the first's.
                let mut sent = [0u64; 2];
                pacers[1].on_sent(t0, 0);
                pacers[1].set_rate(per, t0);
                let (mut now, mut wakes) = (t0, 0u32);
                let mut started = false;
                while now < t0 + span {
                    wakes += 1;
                    let early = if slack {
                        align_slack(train, per)
                    } else {
                        Duration::ZERO
                    };
                    let mut wake: Option<Instant> = None;
                    for (i, p) in pacers.iter_mut().enumerate() {
                        if i == 1 && !started {
                            if now < t0 + gap.mul_f64(0.6) {
                                wake = Some(t0 + gap.mul_f64(0.6));
                                continue;
                            }
                            started = true;
                            p.idle();
                        }
                        let mut bursts = 0;
                        while p.can_send(now + early) && bursts < 16 {
                            p.on_sent(now, train);
                            sent[i] += train;
                            bursts += 1;
                        }
                        wake = [wake, Some(p.ready_at().unwrap_or(now))]
                            .into_iter()
                            .flatten()
                            .min();
                    }
                    let wait = wake.map_or(Duration::ZERO, |t| t - now.min(t));
                    if !wait.is_zero() {
                        now += wait.max(MIN_SLEEP) + Duration::from_micros(50);
                    }
                }
                (wakes, sent)
            };
            let (wakes, sent) = run(true);
            let per_gap = span.as_secs_f64() / gap.as_secs_f64().max(MIN_SLEEP.as_secs_f64());
            assert!(
                f64::from(wakes) <= per_gap * 1.15 + 2.0,
                "{rate}: {wakes} wake-ups, {per_gap:.0} train times"
            );
            for (i, s) in sent.iter().enumerate() {
                let want = per as f64 / 8.0 * span.as_secs_f64();
                assert!(
                    (*s as f64 - want).abs() <= 2.0 * train as f64,
                    "{rate}: channel {i} sent {s}, want {want}"
                );
            }
            if gap > MIN_SLEEP * 2 {
                // Apart, the channels wake the thread twice per train time.
                let (apart, _) = run(false);
                assert!(
                    f64::from(apart) > per_gap * 1.5,
                    "{rate}: {apart} wake-ups apart"
                );
            }
        }
    }

    proptest::proptest! {
        /// Over any window longer than a wake-up's burst (20 ms and more), a channel sends its
        /// rate to within the burst bound each side (a wake-up's trains, at least its share of
        /// [`QUIET_WAKE_BYTES`], and 1.9 ms of its rate, plus the longest sleep's:
        /// [`MIN_SLEEP`] and the lateness), and what its pacer owes: at most
        /// [`hurtle_proto::channel_send::MAX_OWED`] of its rate (late wake-ups beyond the
        /// credit, sent at 1.25 times the rate later: owed at the window's end, or owed from
        /// before it and repaid in it); below it also what its pacer lost in the window (owed
        /// beyond that: [`Pacer::lost`], where wake-ups come late again and again), at any
        /// rate from 100 Mbit/s to 1 Gbit/s, 1 to 8 channels, any payload, and wake-ups late
        /// by up to the credit.
        #[test]
        fn pacing_over_any_window_stays_near_the_rate(
            rate in 100_000_000u64..=1_000_000_000,
            channels in 1u16..=8,
            payload in u64::from(wire::MIN_PAYLOAD)..=u64::from(wire::MAX_PAYLOAD),
            lateness in proptest::collection::vec(0u64..1_500, 64),
        ) {
            let span = Duration::from_millis(300);
            let (sends, _, lost) = simulate_lost(rate, channels, payload, span, SEND_TRAIN, |i| {
                Duration::from_micros(lateness[i % lateness.len()])
            });
            let bps = rate as f64 / 8.0 / f64::from(channels);
            let tolerance = burst_bound(rate, channels, payload) as f64
                + bps * (MIN_SLEEP + PACER_CREDIT).as_secs_f64();
            let owed = bps * hurtle_proto::channel_send::MAX_OWED.as_secs_f64();
            let window = Duration::from_millis(20);
            for (i, &(a, _)) in sends.iter().enumerate() {
                for w in [window, window * 3, window * 10] {
                    if a + w > span {
                        continue;
                    }
                    let n = sends[i..].iter().take_while(|s| s.0 < a + w).count();
                    let sent: u64 = sends[i..i + n].iter().map(|s| s.1).sum();
                    // Lost from the window's first send to the first after it.
                    let gone = lost.get(i + n).unwrap_or(&lost[lost.len() - 1]);
                    let gone = bps * gone.saturating_sub(lost[i]).as_secs_f64();
                    let want = bps * w.as_secs_f64();
                    proptest::prop_assert!(
                        sent as f64 >= want - tolerance - owed - gone
                            && sent as f64 <= want + tolerance + owed,
                        "window {:?} at {:?}: sent {}, want {}, tolerance {} (+{} owed, -{} lost)",
                        w, a, sent, want, tolerance, owed, gone
                    );
                }
            }
        }
    }

    /// The buffers sized by [`send_limits`] hold any send at any payload probing may move to:
    /// the bytes of the largest payload's sends are not the most (a narrow tunnel's 1200-byte
    /// payload carries more per GSO send than a jumbo frame's).
    #[test]
    fn send_buffers_fit_every_payload_in_between() {
        let sealed = wire::DATAGRAM_OVERHEAD;
        for (frames, max_payload, overhead, tcp) in [
            (MAX_FRAMED, wire::MAX_PAYLOAD, sealed, false),
            (MAX_FRAMED, wire::MAX_PAYLOAD, wire::HEADER_LEN, false),
            (MAX_FRAMED, wire::DEFAULT_PAYLOAD, sealed, false),
            (8, wire::MAX_PAYLOAD, sealed, false),
            (1, wire::MIN_PAYLOAD, sealed, false),
            (16, TCP_PAYLOAD, sealed, true),
        ] {
            let (datagrams, bytes) = send_limits(frames, max_payload, overhead, tcp);
            for p in wire::MIN_PAYLOAD..=max_payload {
                let n = datagrams_within(frames, p, overhead, tcp);
                assert!(
                    n <= datagrams,
                    "{n} datagrams of {p} bytes, room for {datagrams}"
                );
                let need = n * usize::from(p);
                assert!(need <= bytes, "{n} x {p} bytes, room for {bytes}");
            }
        }
        // What sizing for the two ends missed: 7 x 8900 (62,300 bytes) and 64 x 512 are less.
        let (_, bytes) = send_limits(MAX_FRAMED, wire::MAX_PAYLOAD, sealed, false);
        assert_eq!(datagrams_within(MAX_FRAMED, 1200, sealed, false), 52);
        assert!(bytes >= 52 * 1200);
    }
}
