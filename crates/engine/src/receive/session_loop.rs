//! The receiver's session loop, on the caller's thread while data flows ([`session_loop`]):
//! the driver of the data phase's machine ([`ReceiverData`]), which verifies blocks as their
//! two values meet and says which file to commit, which block to journal and which to fetch
//! again; and the reports, sent less often when its own timer runs late ([`Lateness`]), each as
//! a datagram and, while the path loses or every other report, on the control connection too
//! ([`TcpCopies`]).

use super::commit::{Commits, JournalQueue};
use super::links::{accept_data_connections, DataKeys};
use super::shared::{ChanCmd, ChanEvent, Shared};
use crate::error::{SessionError, Side};
use crate::fs;
use crate::net::control::ControlError;
use crate::progress::Phase;
use crossbeam_channel::{select, Receiver as ChanRx, Sender};
use hurtle_proto::admit::{arrival_interval, ReportFacts};
use hurtle_proto::feedback::TcpCopies;
use hurtle_proto::hash::BlockValue;
use hurtle_proto::probe::SilenceWatch;
use hurtle_proto::rate::{Feedback, ReportCadence, ReportPace};
use hurtle_proto::session::data::{ReceiverData, ReceiverDataEvent};
use hurtle_proto::wire::{Control, Entry};
use hurtle_proto::ReportBuilder;
use std::net::{IpAddr, TcpListener};
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the receiver's session loop listens to and commands.
pub(super) struct Wires<'a> {
    /// Control messages from the sender.
    pub(super) rx: &'a ChanRx<Result<Control, ControlError>>,
    /// Completed blocks and failures from the channel threads.
    pub(super) events: &'a ChanRx<ChanEvent>,
    /// Commands to each channel, by channel.
    pub(super) cmds: &'a [Sender<ChanCmd>],
    /// The committer thread, which puts verified files in place.
    pub(super) commits: Commits,
    /// Where the channels go if the sender moves them to TCP, in a session that allows it.
    pub(super) race: Option<Race<'a>>,
    /// How often to report to the sender: at the start four times per round trip of the
    /// receiver's measure, as the sender's controller expects
    /// ([`hurtle_proto::rate::report_interval`]); stretched at low rates ([`ReportCadence`]),
    /// further on a short path ([`ReportPace::for_path`]).
    pub(super) report_pace: ReportPace,
    /// How long the sender may be silent on the control connection.
    pub(super) idle: Duration,
    /// The data phase's session id, and the early data's (the hello's) if the data phase
    /// superseded it: the block values of each, and what to do with them.
    pub(super) sessions: (u32, u32),
    /// The early data's block values that came during the set-up (when the data phase keeps
    /// the early data).
    pub(super) early_values: Vec<(u64, [u8; 32])>,
    /// Data comes in the clear (`--no-encryption` on both sides): not authenticated.
    pub(super) in_the_clear: bool,
}

/// A session whose channels may move from UDP to TCP data connections: the listener they
/// come to, what opens them, and the watch for channels on which nothing arrives.
pub(super) struct Race<'a> {
    pub(super) listener: TcpListener,
    pub(super) session: u32,
    pub(super) peer_ip: IpAddr,
    pub(super) data: &'a DataKeys,
    pub(super) control: BorrowedFd<'a>,
    pub(super) watch: SilenceWatch,
}

impl Race<'_> {
    /// The sender's `Fallback`: takes its TCP data connections (dialled while UDP was tried,
    /// so they are usually waiting) and hands each channel its own.
    fn move_to_tcp(&self, cmds: &[Sender<ChanCmd>]) -> Result<(), SessionError> {
        let links = accept_data_connections(
            &self.listener,
            self.session,
            cmds.len() as u16,
            self.peer_ip,
            self.data,
            self.control,
        )?;
        for (cmd, link) in cmds.iter().zip(links) {
            let _ = cmd.send(ChanCmd::Relink(Box::new(link)));
        }
        Ok(())
    }
}

/// How the data phase ended: every file's hash, and the channels on which no UDP had arrived
/// when the sender moved them to TCP, if it did.
pub(super) struct Received {
    pub(super) hashes: Vec<[u8; 32]>,
    pub(super) moved: Option<Vec<u16>>,
}

/// The receiver's data phase: the driver of its machine ([`ReceiverData`], whose rules it
/// carries out): control messages, the channels' block values, the committer's files in place
/// and the timers in; verified files to the committer, verified blocks to their journals,
/// blocks that fail back to their channels, messages to the sender out. Beside it, the
/// reports, built from the channels' counters. Ends at the sender's `Done` once the committer
/// has put every file in place. `held` are the blocks resumed from part files, with the values
/// hashed from them.
pub(super) fn session_loop(
    shared: &Shared,
    files: &[&Entry],
    dirs: &[&Entry],
    out: &fs::OutRoot,
    wires: Wires<'_>,
    kept: &[Option<[u8; 32]>],
    held: &[(u64, BlockValue)],
) -> Result<Received, SessionError> {
    let Wires {
        rx,
        events,
        cmds,
        mut commits,
        mut race,
        report_pace,
        idle,
        sessions,
        early_values,
        in_the_clear,
    } = wires;
    let data_error = |e| {
        crate::phase::session_error(e, Side::Sender, |f| {
            files
                .get(f as usize)
                .map(|e| e.path.clone())
                .unwrap_or_default()
        })
    };
    let mut journal = JournalQueue::new(shared);
    let mut data = ReceiverData::new(
        &shared.layout,
        sessions,
        kept,
        (race.as_ref().map(|r| r.watch.clone()), idle),
        Instant::now(),
    );
    if in_the_clear {
        data.set_in_the_clear();
    }
    let sizes: Vec<u64> = files.iter().map(|e| e.size).collect();
    // The data phase starts now (no message says so: both sides know the set-up's outcome).
    data.start(Instant::now(), early_values, held, &sizes)
        .map_err(data_error)?;
    shared.started.store(true, Ordering::Relaxed);
    shared.progress.set_phase(Phase::Moving);
    let mut reports = ReportBuilder::new(
        Instant::now(),
        shared.counters.totals(),
        shared.socket_drops(),
    );
    let mut lateness = Lateness::new(reports.interval_start());
    // Every 10 ms or more, stretched at low rates ([`hurtle_proto::rate::report_every`]).
    let mut cadence = ReportCadence::new(report_pace);
    let mut tcp_copies = TcpCopies::default();
    // When the timers run next ([`next_wake`]); the loop waits for messages until then.
    let mut wake = Instant::now() + TICK;
    let mut marks = shared.arrival_marks();
    // The channels silent when the sender moved them to TCP, if it did.
    let mut moved: Option<Vec<u16>> = None;
    loop {
        while let Some(msg) = data.poll_transmit() {
            let _ = shared.to_wire.send(msg);
        }
        while let Some(ev) = data.poll_event() {
            match ev {
                ReceiverDataEvent::Verified { file, index, value } => {
                    journal.push(file, index, value)
                }
                ReceiverDataEvent::Commit { file, hash } => commits.give(file, hash),
                ReceiverDataEvent::Reject { channel, block } => {
                    shared
                        .counters
                        .rejected_blocks
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(cmd) = cmds.get(usize::from(channel)) {
                        let _ = cmd.send(ChanCmd::Reject(block));
                    }
                }
                ReceiverDataEvent::MoveToTcp => {
                    if let Some(r) = race.take() {
                        moved = Some(
                            (0..cmds.len() as u16)
                                .filter(|&ch| {
                                    !shared.heard[usize::from(ch)].load(Ordering::Relaxed)
                                })
                                .collect(),
                        );
                        r.move_to_tcp(cmds)?;
                    }
                }
                ReceiverDataEvent::Finish => {
                    for (file, hash) in commits.finish()? {
                        data.on_committed(file, hash);
                    }
                    let hashes = data.finish().map_err(data_error)?;
                    for d in dirs.iter().rev() {
                        out.finish_dir(&d.path, d.mode, d.mtime_ns)?;
                    }
                    return Ok(Received { hashes, moved });
                }
            }
        }
        let now = Instant::now();
        if now >= wake {
            if shared.progress.interrupted() {
                return Err(SessionError::Interrupted {
                    side: Side::Receiver,
                });
            }
            journal.tick(now);
            data.handle_timeout(now, cmds.len() as u16, |ch| {
                let ch = usize::from(ch);
                (
                    shared.heard[ch].load(Ordering::Relaxed),
                    shared.passes[ch].load(Ordering::Relaxed),
                )
            })
            .map_err(data_error)?;
            let interval = now.saturating_duration_since(reports.interval_start());
            let late = lateness.tick(now, wake);
            // Reports cover at least four times the recent lateness ([`Lateness`]).
            let every = cadence.every().max(late * 4).min(MAX_REPORT_INTERVAL);
            if interval >= every {
                let timed_on_read = shared.timed_on_read.swap(false, Ordering::Relaxed);
                let now_marks = shared.arrival_marks();
                let before = std::mem::replace(&mut marks, now_marks);
                let facts = ReportFacts {
                    totals: shared.counters.totals(),
                    received: shared.progress.sent.load(Ordering::Relaxed),
                    socket_drops: shared.socket_drops(),
                    queue_fill_permille: shared.queue_fill.swap(0, Ordering::Relaxed),
                    // A block waiting for the writer is queued at the receiver: the longest
                    // wait counts like a queue on the path, so a stalled disk slows the
                    // sender as much as the wait says, not by a fixed step.
                    held_us: shared.write_wait_us.swap(0, Ordering::Relaxed),
                    // Reported as it is even where the kernel timed every datagram (then
                    // the delays carry none of it): the sender keeps it as its margin for
                    // both ends' scheduling lumps (see `Feedback::receiver_lag`). The bytes
                    // are timed by when they came where the kernel timed them all.
                    lateness: late,
                    arrived_over: if timed_on_read {
                        None
                    } else {
                        arrival_interval(&before, &marks, interval)
                    },
                    disk_fill_permille: shared.write_fill.swap(0, Ordering::Relaxed),
                    train_kbps: shared.take_train_kbps(),
                };
                let report = reports.build(now, &facts);
                if let Some(sent) = Feedback::of_report(&report) {
                    cadence.sent(&sent);
                }
                let datagram = shared.feedback.send(&report);
                if tcp_copies.wanted(now, every, &report, datagram) {
                    let _ = shared.to_wire.send(report);
                }
            }
            let due = reports.interval_start() + every;
            // The channel threads that let datagrams gather read just before it.
            shared.report_clock.publish(
                due.saturating_duration_since(shared.origin).as_micros() as u64,
                every.as_micros() as u64,
                report_pace.base.as_micros() as u64,
            );
            wake = next_wake(now, due, data.poll_timeout());
        }
        select! {
            recv(rx) -> msg => match msg.map_err(|_| ControlError::Closed)? {
                Ok(msg) => data.handle(Instant::now(), msg).map_err(data_error)?,
                Err(ControlError::Closed) => data.on_closed().map_err(data_error)?,
                Err(other) => return Err(other.into()),
            },
            recv(events) -> ev => match ev {
                Ok(ChanEvent::Block { block, value }) => {
                    data.on_block(block, value).map_err(data_error)?;
                }
                Ok(ChanEvent::Failed(e)) => return Err(e),
                Err(_) => return Err(SessionError::Internal("all channel threads ended early")),
            },
            recv(commits.committed) -> batch => {
                match batch {
                    Ok(batch) => {
                        for (file, hash) in commits.note(batch)? {
                            data.on_committed(file, hash);
                        }
                    }
                    // It reports an error before it stops; it stops early only by panicking.
                    Err(_) => return Err(SessionError::io(
                        "commit files",
                        std::io::Error::other("the commit thread stopped"),
                    )),
                }
            }
            default(wake.saturating_duration_since(Instant::now())) => {}
        }
    }
}

/// The shortest wait between two runs of the timers, where a timer wants them at once or
/// repeatedly (the silent-UDP watch, once its wait is over).
const TICK: Duration = Duration::from_millis(5);

/// The longest wait between two runs of the timers: how late the journal's flush (due every
/// 100 ms, `JournalQueue::EVERY`), the sender-silence check and a Ctrl-C can be. The reports
/// and the data phase's timers wake the loop when they are due, so a loop wakes once per
/// report, not 200 times a second (each wake was a futex wait, a context switch and
/// crossbeam's `sched_yield` spins). (At 25 ms a receiver paced at 100 Mbit/s, its reports
/// 57 ms apart, woke 52 times a second, 33 of them for nothing due.)
const MAX_TICK: Duration = Duration::from_millis(100);

/// Longest report interval, however starved the receiver.
const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// When the session loop's timers run next, having run at `now`: when the next report is due
/// (`report`), when the data phase's timers are (`timeout`, but no sooner than [`TICK`]
/// from now), and no later than [`MAX_TICK`] from now.
fn next_wake(now: Instant, report: Instant, timeout: Instant) -> Instant {
    report
        .min(timeout.max(now + TICK))
        .min(now + MAX_TICK)
        .max(now + Duration::from_millis(1))
}

/// How late the timers run, smoothed. A receiver starved of CPU (a cgroup quota, an
/// overloaded machine) runs in lumps, tens or hundreds of milliseconds apart; a report
/// covering fewer than a few lumps measures the scheduler, not the path (the delivered rate of
/// one interval swings from zero to several times the real one), so reports then cover at
/// least four times the recent lateness, whatever interval the sender asked for.
struct Lateness {
    last: Instant,
    smoothed: Duration,
}

impl Lateness {
    fn new(now: Instant) -> Lateness {
        Lateness {
            last: now,
            smoothed: Duration::ZERO,
        }
    }

    /// The timers, due at `due`, run at `now`; returns the smoothed lateness: this run's, or
    /// the earlier figure decayed by 2% per [`TICK`] since the last run (gone in a second or
    /// so of punctual runs, however often they come).
    fn tick(&mut self, now: Instant, due: Instant) -> Duration {
        let late = now.saturating_duration_since(due);
        let since = now.saturating_duration_since(std::mem::replace(&mut self.last, now));
        let decay = 0.98f64.powf(since.as_secs_f64() / TICK.as_secs_f64());
        self.smoothed = late.max(self.smoothed.mul_f64(decay));
        self.smoothed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_follows_late_runs_and_decays_with_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = Lateness::new(t0);
        assert_eq!(
            l.tick(t0 + TICK, t0 + TICK),
            Duration::ZERO,
            "a punctual run"
        );
        // A 200 ms stall: the timers due 5 ms later run 195 ms late.
        let mut t = t0 + TICK + ms(200);
        assert_eq!(l.tick(t, t0 + TICK + TICK), ms(195));
        // Punctual runs afterwards, every 25 ms: the figure decays, and is small after a
        // second or two, as it was with a run every 5 ms.
        let mut last = ms(195);
        for _ in 0..60 {
            t += ms(25);
            let now = l.tick(t, t);
            assert!(now < last);
            last = now;
        }
        assert!(last < ms(1), "{last:?}");
        // The same 1.5 s in runs every 5 ms decays it as far.
        let mut l5 = Lateness::new(t0);
        let mut t = t0 + ms(200);
        l5.tick(t, t0 + TICK);
        for _ in 0..300 {
            t += TICK;
            l5.tick(t, t);
        }
        let ratio = l5.smoothed.as_secs_f64() / last.as_secs_f64();
        assert!((ratio - 1.0).abs() < 1e-6, "{ratio}");
    }

    #[test]
    fn timers_wake_when_due_within_bounds() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let far = t0 + Duration::from_secs(60);
        // Nothing due soon: the longest wait.
        assert_eq!(next_wake(t0, far, far), t0 + MAX_TICK);
        // A report due in 12 ms: then, not at a fixed tick; a short path's stretched report
        // 60 ms away too, with nothing due before it (one wake-up per report).
        assert_eq!(next_wake(t0, t0 + ms(12), far), t0 + ms(12));
        assert_eq!(next_wake(t0, t0 + ms(60), far), t0 + ms(60));
        // The data phase's timers due in 3 ms, or already: no sooner than a tick.
        assert_eq!(next_wake(t0, far, t0 + ms(3)), t0 + TICK);
        assert_eq!(next_wake(t0, far, t0), t0 + TICK);
        assert_eq!(next_wake(t0, far, t0 + ms(20)), t0 + ms(20));
        // A report overdue (the receiver ran late): at once, but not in a spin.
        assert_eq!(next_wake(t0 + ms(5), t0, far), t0 + ms(6));
    }
}
