//! The sender's session loop, on the caller's thread while data flows ([`session_loop`]):
//! routes the receiver's NACKs and confirmations to the channel threads, owns the
//! [`BlockTable`] of the blocks' values, feeds the receiver's reports to the
//! [`RateController`] (logging each in `send-rate.log`, [`rate_line`]), applies probing's
//! decisions, and judges the live bottleneck for the progress line ([`judge_live`]).

use super::channels::ChannelCmds;
use super::probe::{probe_step, Prober};
use super::shared::{ChanCmd, ChanEvent, Shared, ThreadCmd};
use super::summary::BottleneckSummary;
use crate::error::{SessionError, Side};
use crate::net::control::{ControlError, Incoming};
use crate::netlog::NetLog;
use crate::report::channel_list;
use crate::walk;
use crossbeam_channel::{select, Receiver, Sender};
use hurtle_proto::feedback::Dedup;
use hurtle_proto::hash::to_hex;
use hurtle_proto::rate::{report_interval, RateMode};
use hurtle_proto::wire::{Control, HEADER_LEN};
use hurtle_proto::{BlockTable, Feedback, RateController};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One line of `send-rate.log`: a receiver report and the change it caused, if any.
fn rate_line(fb: &Feedback, rate_bps: u64, changed: Option<&str>) -> String {
    let secs = fb.interval.as_secs_f64();
    let delivered = if secs > 0.0 {
        fb.bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    let rate = rate_bps as f64 / 1e6;
    let why = changed.unwrap_or("unchanged");
    format!(
        "report interval_ms={:.1} delivered_mbps={delivered:.1} datagrams={} lost={} socket_drops={} queue_ms={:.2} fill={:.0}% lag_ms={:.1} trains_mbps={:.1} -> rate {rate:.1} Mbit/s ({why})",
        secs * 1e3,
        fb.datagrams,
        fb.lost,
        fb.socket_drops,
        fb.queue_delay.as_secs_f64() * 1e3,
        fb.queue_fill * 100.0,
        fb.receiver_lag.as_secs_f64() * 1e3,
        fb.train_rate.unwrap_or(0.0) / 1e6,
    )
}

/// What the session loop keeps across a move of the channels to TCP: the blocks' values,
/// the files confirmed, and the receiver's counts and progress.
pub(super) struct LoopState {
    table: BlockTable,
    confirmed: Vec<Option<[u8; 32]>>,
    left: usize,
    rejected: u64,
    drops: u64,
    last_received: u64,
    last_progress: Instant,
    judged_at: Instant,
    /// The first copy of each report and NACK (datagram or control connection) is taken.
    dedup: Dedup,
}

impl LoopState {
    /// Nothing sent yet; the `skipped` files (with the receiver's hash) are confirmed already.
    pub(super) fn new(shared: &Shared, skipped: &[Option<[u8; 32]>]) -> LoopState {
        let confirmed = skipped.to_vec();
        LoopState {
            table: BlockTable::new(&shared.layout),
            left: confirmed.iter().filter(|c| c.is_none()).count(),
            confirmed,
            rejected: 0,
            drops: 0,
            last_received: 0,
            last_progress: Instant::now(),
            judged_at: Instant::now(),
            dedup: Dedup::new(),
        }
    }

    /// What a channel thread says while the set-up still runs (the early data): block values
    /// go to the receiver at once, failures end the session.
    pub(super) fn on_early_event(
        &mut self,
        shared: &Shared,
        tx: &Sender<Control>,
        ev: ChanEvent,
    ) -> Result<(), SessionError> {
        match ev {
            ChanEvent::Block { block, value, .. } => {
                pass_value(&mut self.table, shared, tx, block, value)
            }
            ChanEvent::Failed(e) => Err(e),
        }
    }

    /// The channels moved to other links just now: the wait for progress starts again.
    pub(super) fn moved(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Every file's confirmed hash, the receiver's rejected datagrams and its socket drops.
    pub(super) fn finish(self) -> (Vec<[u8; 32]>, u64, u64) {
        (
            self.confirmed
                .into_iter()
                .map(|h| h.unwrap_or_default())
                .collect(),
            self.rejected,
            self.drops,
        )
    }
}

/// The UDP side of the session loop: the probing, if still going, and the TCP data connections
/// dialled beside it, if the channels may move there.
pub(super) struct UdpPath {
    pub(super) prober: Option<Prober>,
    /// The dials, until the channels move (taken then).
    pub(super) fallback: Option<Vec<Dialing>>,
    pub(super) moved: bool,
}

/// A TCP data connection being dialled.
pub(super) type Dialing = std::thread::JoinHandle<Result<std::net::TcpStream, SessionError>>;

/// How the session loop ended without an error.
pub(super) enum Outcome {
    /// Every file is confirmed.
    Done,
    /// UDP does not get through: these channels sent nothing the receiver saw, and all move
    /// to TCP now. `why` says how it was found.
    MoveToTcp { silent: Vec<u16>, why: String },
}

/// Passes a block's value, read for the first time, to the receiver (in the set-up too, for
/// the early data: [`LoopState::on_early_event`]), and records it in `table`. The last value
/// of a file waits until the file is found unchanged since its first block was read: with it
/// the receiver can finish the file.
fn pass_value(
    table: &mut BlockTable,
    shared: &Shared,
    tx: &Sender<Control>,
    block: u64,
    value: [u8; 32],
) -> Result<(), SessionError> {
    if let Some((file, _)) = table.set(block, value) {
        shared.sources[file as usize].check_unchanged()?;
    }
    let _ = tx.send(Control::BlockHashes {
        session: shared.session,
        blocks: vec![(block, value)],
    });
    Ok(())
}

/// The session loop's message paths: control in and out, channel events in, channel commands out.
pub(super) struct Wires<'a> {
    pub(super) rx: &'a Incoming,
    /// The reports and NACKs that came as datagrams ([`crate::net::feedback`]); copies of
    /// what `rx` brings too, the first of each taken.
    pub(super) feedback: &'a Receiver<Control>,
    pub(super) events: &'a Receiver<ChanEvent>,
    pub(super) tx: &'a Sender<Control>,
    pub(super) cmds: &'a [ChannelCmds],
}

/// The data phase until every file is confirmed ([`Outcome::Done`]), or until UDP is found not
/// to get through in a session that may move to TCP ([`Outcome::MoveToTcp`]; the caller moves
/// the channels and calls again with the same `state`).
pub(super) fn session_loop(
    shared: &Shared,
    files: &[&walk::SourceEntry],
    wires: &Wires,
    stall: Duration,
    (controller, rate_log): (&mut RateController, &mut NetLog),
    state: &mut LoopState,
    udp: &mut UdpPath,
) -> Result<Outcome, SessionError> {
    let Wires {
        rx,
        feedback,
        events,
        tx,
        cmds,
    } = *wires;
    let LoopState {
        table,
        confirmed,
        left,
        rejected,
        drops,
        last_received,
        last_progress,
        judged_at,
        dedup,
    } = state;
    // Probing found UDP blocked: the channels move to TCP if they may.
    let blocked = |e: SessionError, udp: &UdpPath| match e {
        // Every channel sends again what it sent: on a path this blocked, little or nothing
        // of it arrived (the receiver drops what it has twice).
        SessionError::UdpBlocked { channel, secs } if udp.fallback.is_some() => {
            Ok(Outcome::MoveToTcp {
                silent: (0..shared.channels).collect(),
                why: format!("no probe was answered on channel {channel} within {secs} s"),
            })
        }
        e => Err(e),
    };
    let tick = crossbeam_channel::tick(Duration::from_millis(200));
    // Between reports, `auto` checks for their silence once per report interval.
    let silence = match controller.config().mode {
        RateMode::Auto => crossbeam_channel::tick(report_interval(controller.config().rtt)),
        _ => crossbeam_channel::never(),
    };
    let mut feedback = feedback;
    let never = crossbeam_channel::never();
    while *left > 0 {
        let msg = select! {
            recv(rx) -> msg => msg.map_err(|_| ControlError::Closed)??,
            recv(feedback) -> msg => match msg {
                Ok(msg) => msg,
                // The reader ended: the control connection still brings every message.
                Err(_) => {
                    feedback = &never;
                    continue;
                }
            },
            recv(events) -> ev => {
                match ev {
                    Ok(ChanEvent::Block { block, value, held }) => {
                        // Hashing what the receiver already holds is progress too: a resume
                        // of a big, nearly finished file sends nothing for a while.
                        if held {
                            *last_progress = Instant::now();
                        }
                        pass_value(table, shared, tx, block, value)?;
                    }
                    Ok(ChanEvent::Failed(e)) => return Err(e),
                    Err(_) => return Err(SessionError::Internal("all channel threads ended early")),
                }
                continue;
            }
            recv(silence) -> _ => {
                if let Some(change) = controller.on_silence(Instant::now()) {
                    let r = change.rate_bps;
                    rate_log.line(|| {
                        format!("no report for a while -> rate {:.1} Mbit/s (silence)", r as f64 / 1e6)
                    });
                    shared.rate_bps.store(r, Ordering::Relaxed);
                    shared.progress.rate_bps.store(r, Ordering::Relaxed);
                }
                continue;
            }
            recv(tick) -> _ => {
                if shared.progress.interrupted() {
                    return Err(SessionError::Interrupted { side: Side::Sender });
                }
                if let Some(p) = udp.prober.as_mut() {
                    p.send_due(Instant::now());
                    if let Err(e) = probe_step(p, shared, *last_received > 0, rate_log) {
                        return blocked(e, udp);
                    }
                    if p.probe.is_done() {
                        udp.prober = None;
                    }
                }
                let _ = tx.send(Control::KeepAlive);
                if last_progress.elapsed() > stall {
                    return Err(SessionError::Stalled(stall.as_secs()));
                }
                continue;
            }
        };
        // A report or NACK came both as a datagram and on the control connection: the first
        // copy counts.
        if !dedup.admit(&msg) {
            continue;
        }
        match msg {
            Control::Nack {
                channel,
                ranges,
                knew_us,
                ..
            } => {
                if let Some(c) = cmds.get(usize::from(channel)) {
                    let cmd = ChanCmd::Nack(ranges, knew_us);
                    let _ = c.send(ThreadCmd::Channel(channel, cmd));
                }
            }
            Control::ChannelDone { channel } => {
                if let Some(c) = cmds.get(usize::from(channel)) {
                    let _ = c.send(ThreadCmd::Channel(channel, ChanCmd::Done));
                }
            }
            Control::FileDone { file, hash } => {
                let f = file as usize;
                let Some(want) = table.file_root(file).filter(|_| f < files.len()) else {
                    return Err(SessionError::EarlyConfirmation(file));
                };
                if want != hash {
                    return Err(SessionError::HashMismatch {
                        path: files[f].rel_path.clone(),
                        got: to_hex(&hash),
                        want: to_hex(&want),
                    });
                }
                if confirmed[f].replace(hash).is_none() {
                    *left -= 1;
                    shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
                }
            }
            report @ Control::Report {
                received,
                rejected: r,
                socket_drops,
                ..
            } => {
                *rejected = r;
                *drops = socket_drops;
                let Some(fb) = Feedback::of_report(&report) else {
                    unreachable!("a report")
                };
                shared
                    .receiver_signs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(
                        &fb,
                        hurtle_proto::rate::model::queue_target(controller.config().rtt),
                    );
                let change = controller.on_report(Instant::now(), &fb);
                let why = change.as_ref().map(|c| c.reason.as_str());
                rate_log.line(|| rate_line(&fb, controller.rate_bps(), why));
                if let Some(loss) = controller.random_loss() {
                    let ppm = (loss.clamp(0.0, 1.0) * 1e6) as u32;
                    shared.loss_ppm.store(ppm, Ordering::Relaxed);
                }
                shared
                    .catch_up_us
                    .store(controller.catch_up().as_micros() as u64, Ordering::Relaxed);
                shared
                    .train_bytes
                    .store(controller.train_bytes(), Ordering::Relaxed);
                if change.is_some() {
                    let r = controller.rate_bps();
                    shared.rate_bps.store(r, Ordering::Relaxed);
                    shared.progress.rate_bps.store(r, Ordering::Relaxed);
                }
                shared.progress.confirmed.store(received, Ordering::Relaxed);
                if judged_at.elapsed() >= LIMIT_EVERY {
                    *judged_at = Instant::now();
                    judge_live(shared, controller, udp.moved);
                }
                if received > *last_received {
                    *last_received = received;
                    *last_progress = Instant::now();
                }
            }
            Control::ProbeAck { channel, size } => {
                if let Some(p) = udp.prober.as_mut() {
                    p.probe.on_ack(channel, usize::from(size), Instant::now());
                    if let Err(e) = probe_step(p, shared, *last_received > 0, rate_log) {
                        return blocked(e, udp);
                    }
                }
            }
            // Nothing reached the receiver on these channels since its data phase began.
            Control::UdpSilent { channels } if udp.fallback.is_some() => {
                return Ok(Outcome::MoveToTcp {
                    why: format!(
                        "nothing reached the receiver on {}",
                        channel_list(&channels)
                    ),
                    silent: channels,
                });
            }
            // Moved already, on the sender's own finding.
            Control::UdpSilent { .. } if udp.moved => {}
            Control::KeepAlive => {}
            other => {
                return Err(SessionError::unexpected(
                    Side::Receiver,
                    other,
                    "a data-phase message",
                ))
            }
        }
    }
    Ok(Outcome::Done)
}

/// How often the progress line's bottleneck is judged again.
const LIMIT_EVERY: Duration = Duration::from_secs(1);

/// Judges what limits the transfer so far, for the progress line; not once the channels
/// moved to TCP, which paces itself.
fn judge_live(shared: &Shared, controller: &RateController, moved_to_tcp: bool) {
    let Some(limits) = shared.limits.filter(|_| !moved_to_tcp) else {
        return;
    };
    let payload = usize::from(shared.payload.load(Ordering::Relaxed)).max(1);
    // First transmissions only: close enough to tell a sender that cannot keep up.
    let bits =
        shared.progress.sent.load(Ordering::Relaxed) as f64 * 8.0 * (HEADER_LEN + payload) as f64
            / payload as f64;
    let b = BottleneckSummary::judge(controller, bits, limits, shared.signs());
    shared.progress.set_limit(b.brief());
}
