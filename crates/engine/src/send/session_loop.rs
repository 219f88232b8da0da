//! The sender's session loop, on the caller's thread while data flows ([`session_loop`]): the
//! driver of the data phase's machine ([`SenderData`], whose rules it carries out): messages,
//! the channel threads' block values (all that are queued at each of its wake-ups: a channel
//! thread wakes it only for one that must not wait, [`Shared::to_loop`]) and the machine's
//! timers in; the machine's commands to
//! the channel threads, its messages to the receiver and its rates out, each report logged in
//! `send-rate.log` ([`rate_line`]). Beside it, probing's decisions (and the controller's round
//! trip lowered by the probes' answers: [`hurtle_proto::rate::rtt`]), and the live bottleneck
//! for the progress line ([`judge_live`]).

use super::channel_threads::ChannelCmds;
use super::prober::{probe_step, Prober};
use super::shared::{ChanCmd, ChanEvent, Shared, ThreadCmd};
use super::summary::BottleneckSummary;
use crate::error::{SessionError, Side};
use crate::net::control::{ControlError, ControlTx, Incoming};
use crate::net::feedback::FeedbackReader;
use crate::net::udp::wait_readable;
use crate::netlog::NetLog;
use crate::walk;
use crossbeam_channel::Receiver;
use hurtle_proto::rate::model::queue_target;
use hurtle_proto::rate::rtt::PathRtt;
use hurtle_proto::session::data::{ChannelCmd, SenderData, SenderDataEvent};
use hurtle_proto::wire::HEADER_LEN;
use hurtle_proto::{Feedback, RateController};
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

/// The UDP side of the session loop: the probing, if still going, and the TCP data connections
/// dialled beside it, if the channels may move there.
pub(super) struct UdpPath {
    pub(super) prober: Option<Prober>,
    /// The dials, until the channels move (taken then).
    pub(super) fallback: Option<Vec<Dialing>>,
    /// The controller's round trip: the first round of probes' answers lower it
    /// ([`hurtle_proto::rate::rtt::PathRtt`]).
    pub(super) rtt: PathRtt,
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

/// A channel thread's word while the set-up still runs (the early data): block values go to
/// the receiver at once, failures end the session.
pub(super) fn on_early_event(
    state: &mut SenderData,
    shared: &Shared,
    tx: &ControlTx,
    ev: ChanEvent,
) -> Result<(), SessionError> {
    match ev {
        ChanEvent::Block { block, value, held } => {
            pass_value(state, shared, tx, (block, value, held))
        }
        ChanEvent::Failed(e) => Err(e),
    }
}

/// Passes a block's value, read for the first time, to the receiver through the machine. The
/// last value of a file goes only once the file is found unchanged since its first block was
/// read: with it the receiver can finish the file.
fn pass_value(
    state: &mut SenderData,
    shared: &Shared,
    tx: &ControlTx,
    (block, value, held): (u64, [u8; 32], bool),
) -> Result<(), SessionError> {
    take_value(state, shared, (block, value, held))?;
    transmit(state, tx);
    Ok(())
}

/// Gives a block's value to the machine (see [`pass_value`]), which sends it at the next
/// transmit, in one `BlockHashes` with the others taken since the last.
fn take_value(
    state: &mut SenderData,
    shared: &Shared,
    (block, value, held): (u64, [u8; 32], bool),
) -> Result<(), SessionError> {
    shared.note_value(block, value);
    if let Some(file) = state.on_block_value(Instant::now(), block, value, held) {
        shared.sources[file as usize].check_unchanged()?;
    }
    Ok(())
}

/// Takes every event the channel threads have queued: the values go to the machine, to be
/// sent together; a failure ends the session.
fn take_events(
    state: &mut SenderData,
    shared: &Shared,
    events: &Receiver<ChanEvent>,
) -> Result<(), SessionError> {
    loop {
        match events.try_recv() {
            Ok(ChanEvent::Block { block, value, held }) => {
                take_value(state, shared, (block, value, held))?;
            }
            Ok(ChanEvent::Failed(e)) => return Err(e),
            Err(crossbeam_channel::TryRecvError::Empty) => return Ok(()),
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                return Err(SessionError::Internal("all channel threads ended early"))
            }
        }
    }
}

/// Sends what the machine has to send.
fn transmit(state: &mut SenderData, tx: &ControlTx) {
    while let Some(msg) = state.poll_transmit() {
        let _ = tx.send(msg);
    }
}

/// The session loop's message paths: control in and out, channel events in, channel commands out.
/// (The reports and NACKs that come as datagrams, copies of what `rx` brings too, are read by
/// the loop itself: [`session_loop`]'s `feedback`.)
pub(super) struct Wires<'a> {
    pub(super) rx: &'a Incoming,
    pub(super) events: &'a Receiver<ChanEvent>,
    pub(super) tx: &'a ControlTx,
    pub(super) cmds: &'a [ChannelCmds],
}

/// The data phase until every file is confirmed ([`Outcome::Done`]), or until UDP is found not
/// to get through in a session that may move to TCP ([`Outcome::MoveToTcp`]; the caller moves
/// the channels, tells `state` and calls again). The rules are `state`'s
/// ([`hurtle_proto::session::data`]); this loop waits for messages, channel events and timers,
/// and carries out what the machine decides.
///
/// It sleeps in one `poll(2)` on its bell ([`Shared::loop_wake`], rung by the control
/// connection's reader and by the channel threads) and on `feedback`'s sockets (the reports
/// and NACKs that come as datagrams, the first copy of each taken), until the machine's next
/// timer or the [`PROBE_TICK`]; at each wake-up it takes everything that came.
pub(super) fn session_loop(
    shared: &Shared,
    files: &[&walk::SourceEntry],
    wires: &Wires,
    rate_log: &mut NetLog,
    state: &mut SenderData,
    udp: &mut UdpPath,
    mut feedback: Option<&mut FeedbackReader>,
) -> Result<Outcome, SessionError> {
    let Wires {
        rx,
        events,
        tx,
        cmds,
    } = *wires;
    let data_error = |e| {
        crate::phase::session_error(e, Side::Receiver, |f| {
            files
                .get(f as usize)
                .map(|e| e.rel_path.clone())
                .unwrap_or_default()
        })
    };
    let mut next_tick = Instant::now() + PROBE_TICK;
    let mut judged_at = Instant::now();
    let mut kept_at = Instant::now();
    let bell = shared.loop_wake.bell();
    let mut came = Vec::new();
    while !state.is_done() {
        let now = Instant::now();
        let mut until = state.poll_timeout().min(next_tick);
        // The punching's timers (a relayed session's), not sooner than a millisecond apart.
        if let Some(t) = feedback.as_mut().and_then(|f| f.tick(now)) {
            until = until.min(t.max(now + Duration::from_millis(1)));
        }
        // Bit 0: the bell; bit i + 1: the ith feedback socket.
        let fds =
            std::iter::once(Some(bell.fd())).chain(feedback.iter().flat_map(|f| f.fds()).map(Some));
        let ready = wait_readable(fds, until.saturating_duration_since(now))
            .map_err(|_| SessionError::Internal("the session loop's wait failed"))?;
        if ready & 1 != 0 {
            // Before taking what the ringers queued: a ring after this wakes the next wait.
            bell.answer();
        }
        if let Some(f) = feedback.as_mut() {
            f.read(ready >> 1, |msg| came.push(msg));
        }
        for msg in came.drain(..) {
            state.handle(Instant::now(), msg).map_err(data_error)?;
        }
        loop {
            match rx.try_recv() {
                Ok(msg) => state.handle(Instant::now(), msg?).map_err(data_error)?,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    return Err(ControlError::Closed.into())
                }
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            next_tick = now + PROBE_TICK;
            if shared.progress.interrupted() {
                return Err(SessionError::Interrupted { side: Side::Sender });
            }
            // The values so far go to the cache now and then, so that even a sender
            // killed outright leaves them for the next session.
            if kept_at.elapsed() >= KEEP_VALUES_EVERY {
                kept_at = Instant::now();
                if let Some(e) = shared.keep_values() {
                    rate_log.line(|| e);
                }
            }
            if let Some(p) = udp.prober.as_mut() {
                p.send_due(now);
                let step = probe_step(p, shared, state.received() > 0, rate_log);
                if p.probe.is_done() {
                    udp.prober = None;
                }
                blocked(step, state).map_err(data_error)?;
            }
        }
        if now >= state.poll_timeout() {
            state.handle_timeout(now).map_err(data_error)?;
        }
        take_events(state, shared, events)?;
        transmit(state, tx);
        while let Some(ev) = state.poll_event() {
            match ev {
                SenderDataEvent::Channel { channel, cmd } => {
                    let cmd = match cmd {
                        ChannelCmd::Nack { ranges, knew_us } => ChanCmd::Nack(ranges, knew_us),
                        ChannelCmd::Done => ChanCmd::Done,
                    };
                    if let Some(c) = cmds.get(usize::from(channel)) {
                        let _ = c.send(ThreadCmd::Channel(channel, cmd));
                    }
                }
                SenderDataEvent::FileConfirmed { file } => {
                    shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
                    let source = shared.sources.get(file as usize);
                    if let Some(source) = source.filter(|_| shared.cacheable(file)) {
                        shared
                            .value_log()
                            .confirmed(file, source, shared.value_cache.as_ref());
                    }
                }
                SenderDataEvent::Report {
                    feedback: fb,
                    received,
                    change,
                } => {
                    let Some(controller) = state.controller() else {
                        continue;
                    };
                    shared
                        .receiver_signs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .note(&fb, queue_target(controller.config().rtt));
                    let why = change.as_ref().map(|c| c.reason.as_str());
                    rate_log.line(|| rate_line(&fb, controller.rate_bps(), why));
                    if let Some(loss) = controller.random_loss() {
                        let ppm = (loss.clamp(0.0, 1.0) * 1e6) as u32;
                        shared.loss_ppm.store(ppm, Ordering::Relaxed);
                    }
                    shared
                        .lost_nothing
                        .store(controller.lost_nothing(), Ordering::Relaxed);
                    shared
                        .catch_up_us
                        .store(controller.catch_up().as_micros() as u64, Ordering::Relaxed);
                    shared
                        .train_bytes
                        .store(controller.train_bytes(), Ordering::Relaxed);
                    shared
                        .queue_delay_us
                        .store(fb.queue_delay.as_micros() as u64, Ordering::Relaxed);
                    if change.is_some() {
                        shared.set_rate(controller.rate_bps());
                    }
                    shared.progress.confirmed.store(received, Ordering::Relaxed);
                    if judged_at.elapsed() >= LIMIT_EVERY {
                        judged_at = Instant::now();
                        judge_live(shared, controller, !state.path().is_udp());
                    }
                }
                SenderDataEvent::Silence { change } => {
                    let r = change.rate_bps;
                    rate_log.line(|| {
                        format!(
                            "no report for a while -> rate {:.1} Mbit/s (silence)",
                            r as f64 / 1e6
                        )
                    });
                    shared.set_rate(r);
                }
                SenderDataEvent::ProbeAck { channel, size } => {
                    if let Some(p) = udp.prober.as_mut() {
                        p.probe.on_ack(channel, usize::from(size), Instant::now());
                        let lower = p.probe.rtt().and_then(|s| udp.rtt.sample(s));
                        if let Some(lower) = lower {
                            shared.lower_rtt(lower);
                        }
                        if let (Some(lower), Some(c)) = (lower, state.controller_mut()) {
                            c.set_rtt(lower);
                            rate_log.line(|| {
                                format!(
                                    "rtt {:.3} ms: a probe's answer (the key agreement's: {:.2} ms)",
                                    lower.as_secs_f64() * 1e3,
                                    udp.rtt.handshake().as_secs_f64() * 1e3
                                )
                            });
                        }
                        let step = probe_step(p, shared, state.received() > 0, rate_log);
                        // (A shorter round trip or a larger payload makes a larger initial
                        // window: before the first report, the first rate.)
                        if let Some(c) = state.controller_mut() {
                            if let Some(bps) = shared.raise_start(c) {
                                rate_log.line(|| {
                                    format!(
                                        "first rate {:.1} Mbit/s: the initial window at the path's round trip",
                                        bps as f64 / 1e6
                                    )
                                });
                            }
                        }
                        blocked(step, state).map_err(data_error)?;
                    }
                }
                SenderDataEvent::MoveToTcp { silent, why } => {
                    return Ok(Outcome::MoveToTcp { silent, why })
                }
            }
        }
    }
    Ok(Outcome::Done)
}

/// Probing found UDP blocked: the machine moves the channels to TCP if the session may.
fn blocked(
    step: Result<(), SessionError>,
    state: &mut SenderData,
) -> Result<(), hurtle_proto::session::data::DataError> {
    match step {
        Err(SessionError::UdpBlocked { channel, secs }) => state.udp_blocked(channel, secs),
        // `probe_step` fails for no other reason.
        _ => Ok(()),
    }
}

/// How often the loop looks for an interrupt and sends the probes that are due (at the
/// latest: it looks at every wake-up past this).
const PROBE_TICK: Duration = Duration::from_millis(200);

/// How often the values passed on so far are kept in the cache
/// ([`super::value_cache`]).
const KEEP_VALUES_EVERY: Duration = Duration::from_secs(15);

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
