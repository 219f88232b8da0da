//! A transfer in progress ([`Transfer`]): the session runs on a thread of its own; the handle
//! waits for its summary, hands out its progress as [`Event`]s (a channel, or an iterator), and
//! cancels it ([`Transfer::cancel`], or a [`Canceller`] from another thread).
//!
//! Events are read from the engine's live counters ([`hurtle_engine::Progress`]) by a watcher
//! thread every [`DEFAULT_INTERVAL`] (or the builder's `progress_interval`), and say what
//! changed since the last look. Cancelling asks the session to end as Ctrl-C does for the
//! command: the peer is told, what was verified is kept, and the same transfer again resumes.

use super::error::Error;
use crossbeam_channel::{Receiver as Rx, RecvTimeoutError, Sender as Tx, TrySendError};
use hurtle_engine::progress::Phase as EnginePhase;
use hurtle_engine::Progress;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the watcher looks at the session's counters unless the builder says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(200);

/// Events kept for a reader that is behind; later ones are dropped (and counted) until it
/// catches up, so that a transfer nobody watches costs no memory.
const EVENT_QUEUE: usize = 4096;

/// Where a session is.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A receiver waits for its sender; a sender reads the list of files.
    Waiting,
    /// A sender connects to the receiver.
    Connecting,
    /// Connected: the key agreement, the list of files, what the receiver already has.
    SettingUp,
    /// Data moves.
    Moving,
}

impl From<EnginePhase> for Phase {
    fn from(p: EnginePhase) -> Phase {
        match p {
            EnginePhase::Idle => Phase::Waiting,
            EnginePhase::Connecting => Phase::Connecting,
            EnginePhase::SettingUp => Phase::SettingUp,
            EnginePhase::Moving => Phase::Moving,
        }
    }
}

/// A file is among [`Snapshot::moving`] while some channel moved bytes of it this recently.
pub const MOVING_WITHIN: Duration = Duration::from_millis(500);

/// The session at one moment: its counters, and everything else the command's progress line
/// shows (the peer, what limits the transfer, which way the data goes, the files moving now).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Where the session is.
    pub phase: Phase,
    /// The address a receiver waits on, or the one a sender connects to (`None` before it is
    /// known).
    pub peer: Option<SocketAddr>,
    /// Bytes the session moves in all (known once the list of files is agreed; resumed bytes
    /// are not in it).
    pub total: u64,
    /// Bytes not moved because the receiver held them from an interrupted transfer.
    pub resumed: u64,
    /// Bytes sent at least once (sender) or received (receiver).
    pub sent: u64,
    /// Bytes the receiver reports holding, verified (sender).
    pub confirmed: u64,
    /// The sender's pacing rate now, bits per second (0 on the receiver).
    pub rate_bps: u64,
    /// Bits per second of `sent` since the previous snapshot.
    pub moving_bps: u64,
    /// Files complete.
    pub files_done: usize,
    /// Time since data started moving (zero before).
    pub elapsed: Duration,
    /// When data started moving (`None` before; a move to TCP starts it again). The command
    /// measures its rate from it.
    pub moving_since: Option<Instant>,
    /// What limits the transfer now, as [`Event::Bottleneck`] says it (sender; `None` until
    /// the rate control knows).
    pub bottleneck: Option<String>,
    /// Which way the data goes now, as [`Event::Path`] says it (`None` unless relayed).
    pub path: Option<&'static str>,
    /// The files (their paths in the transfer) whose bytes moved in the last
    /// [`MOVING_WITHIN`], in the order of the transfer.
    pub moving: Vec<String>,
}

/// What a sender waits for before its session starts ([`Event::Waiting`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Nothing listens at the receiver's address yet: the sender tries again, up to `up_to`
    /// ([`SenderBuilder::wait`](crate::SenderBuilder::wait)).
    Listener {
        /// The receiver's address.
        addr: SocketAddr,
        /// How long the sender waits in all.
        up_to: Duration,
    },
    /// The receiver of the code has not registered at the relay yet: the sender looks it up
    /// again once a second, up to `up_to`.
    Registration {
        /// The receiver's code.
        code: String,
        /// How long the sender waits in all.
        up_to: Duration,
    },
    /// The sender offered a code at its relay (a relay and no code): the receiving side gives
    /// this code ([`ReceiverBuilder::sender_code`](crate::ReceiverBuilder::sender_code), or
    /// `hurtle receive CODE`), within `valid`. Also [`Transfer::code`].
    Receiver {
        /// The code the receiver gives.
        code: String,
        /// How long the relay keeps the offer.
        valid: Duration,
    },
}

/// What a transfer reports as it goes; each says a change since the previous look.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The session entered a phase.
    Phase(Phase),
    /// The counters, while data moves (one per look, when anything changed), and once more
    /// at the end.
    Progress(Snapshot),
    /// What limits the transfer now, in a few words with its figures ("the path, about 412
    /// Mbit/s, 1.0% random loss"), as the sender's rate control judges it.
    Bottleneck(String),
    /// Bytes of this file (its path in the transfer) started moving.
    FileStarted(String),
    /// Another file is complete: `done` files in all (the engine counts them; it does not
    /// name them as they complete).
    FileDone {
        /// Files complete so far.
        done: usize,
    },
    /// Which way the data goes changed (a relayed session): `relay`, `relay tcp`, `direct`,
    /// or `relay+direct` while its channels are split.
    Path(&'static str),
    /// A sender waits for its receiver (it has not started yet, or it has not answered the
    /// sender's code yet).
    Waiting(Waiting),
    /// A sender found its receiver by code through a relay, and connects to it at `to`:
    /// directly, or (`relayed`) through the relay.
    Found {
        /// Where the session connects.
        to: SocketAddr,
        /// Whether the connection goes through the relay.
        relayed: bool,
    },
    /// A receiver answered this sender's code with another code (the key agreement failed):
    /// it was told so, and the sender waits for the next; after
    /// [`CODE_TRIES`](Event::CODE_TRIES) such answers the code is spent and the transfer
    /// fails ([`ErrorKind::Refused`](crate::ErrorKind::Refused)).
    WrongCode {
        /// Wrong answers so far.
        tries: u32,
    },
}

impl Event {
    /// Wrong answers to a sender's code before the code is spent ([`Event::WrongCode`]).
    pub const CODE_TRIES: u32 = hurtle_engine::handshake::CODE_TRIES;
}

/// Hands events made outside the watcher (by the session's own thread) to the transfer's
/// reader, in the same queue.
#[derive(Clone)]
pub(crate) struct Emit {
    tx: Tx<Event>,
    dropped: Arc<AtomicU64>,
}

impl Emit {
    /// Queues `e`; dropped (and counted) when the reader is too far behind.
    pub(crate) fn send(&self, e: Event) {
        send_counted(&self.tx, &self.dropped, e);
    }
}

fn send_counted(tx: &Tx<Event>, dropped: &AtomicU64, e: Event) {
    match tx.try_send(e) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => {}
        Err(TrySendError::Full(_)) => {
            dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Cancels a transfer from anywhere (a signal handler's thread, a user interface), and looks
/// at it from there: a signal handler decides by the phase whether there is anything to keep,
/// and says what was kept from the snapshot, as the command's Ctrl-C does.
#[derive(Debug, Clone)]
pub struct Canceller {
    progress: Arc<Progress>,
}

impl Canceller {
    /// The transfer's counters now (as [`Transfer::snapshot`]).
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.progress, 0)
    }

    /// The phase the transfer is in now (as [`Transfer::phase`]).
    pub fn phase(&self) -> Phase {
        self.progress.phase().into()
    }

    /// Asks the transfer to end: within a fraction of a second of its data moving it tells the
    /// peer, keeps what it verified, and ends with [`Error::Interrupted`]. Before data moves
    /// there is nothing to keep; a receiver still waiting for its sender stops waiting within
    /// 50 ms (its thread ends, and the [`Receiver`](crate::Receiver) can receive again).
    pub fn cancel(&self) {
        self.progress.interrupt();
    }
}

/// A transfer running on its own thread. Dropping the handle leaves the transfer running to
/// its end, as dropping a thread's `JoinHandle` does: cancel it first to stop it.
pub struct Transfer<S> {
    progress: Arc<Progress>,
    receiver: bool,
    done: Rx<Result<S, Error>>,
    result: Mutex<Option<Result<S, Error>>>,
    events: Rx<Event>,
    dropped: Arc<AtomicU64>,
    /// Why a receiver still waiting for its sender gave up (its relay cancelled the code, or
    /// it expired): set by someone else, taken by [`Transfer::wait_timeout`].
    abandoned: Option<Arc<Mutex<Option<Error>>>>,
    /// The error taken from `abandoned`, given instead of the interruption it causes.
    gave_up: Mutex<Option<Error>>,
    /// The code a sender offered at its relay.
    code: Option<String>,
}

impl<S: Send + 'static> Transfer<S> {
    /// Starts `run` on a thread of its own, with a watcher of its progress.
    pub(crate) fn start(
        name: &str,
        receiver: bool,
        interval: Duration,
        run: impl FnOnce(Arc<Progress>, Emit) -> Result<S, Error> + Send + 'static,
    ) -> Result<Transfer<S>, Error> {
        let progress = Arc::new(Progress::default());
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let (events_tx, events) = crossbeam_channel::bounded(EVENT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let (p, d) = (progress.clone(), dropped.clone());
        let emit = Emit {
            tx: events_tx.clone(),
            dropped: dropped.clone(),
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let stop = Arc::new(AtomicBool::new(false));
                let watcher = {
                    let (p, stop) = (p.clone(), stop.clone());
                    std::thread::Builder::new()
                        .name("events".into())
                        .spawn(move || watch(&p, &stop, interval, &events_tx, &d))
                        .ok()
                };
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(p.clone(), emit)))
                        .unwrap_or_else(|_| {
                            Err(Error::Thread("the transfer thread panicked".into()))
                        });
                if result.is_ok() {
                    // A finished transfer moved and confirmed everything: the last snapshot says
                    // so even where the engine's counters stopped at the last report.
                    let total = p.total.load(Ordering::Relaxed);
                    p.sent.fetch_max(total, Ordering::Relaxed);
                    p.confirmed.fetch_max(total, Ordering::Relaxed);
                }
                stop.store(true, Ordering::Relaxed);
                if let Some(w) = watcher {
                    w.thread().unpark();
                    let _ = w.join();
                }
                let _ = done_tx.send(result);
            })
            .map_err(|e| Error::Thread(format!("cannot start the transfer thread: {e}")))?;
        Ok(Transfer {
            progress,
            receiver,
            done,
            result: Mutex::new(None),
            events,
            dropped,
            abandoned: None,
            gave_up: Mutex::new(None),
            code: None,
        })
    }

    /// Gives the transfer the code it offered at its relay ([`Transfer::code`]).
    pub(crate) fn with_code(mut self, code: String) -> Self {
        self.code = Some(code);
        self
    }

    /// The code this sender offered at its relay, for the receiving side to give (a sender
    /// built with a relay and no code: [`Waiting::Receiver`]); `None` otherwise.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// Ends the wait of a receiver still waiting for its sender with the error put in
    /// `slot` (by its relay agent), as a cancel does.
    pub(crate) fn abandoned_by(mut self, slot: Arc<Mutex<Option<Error>>>) -> Self {
        self.abandoned = Some(slot);
        self
    }

    /// Waits for the transfer to end: its summary, or why it failed.
    pub fn wait(self) -> Result<S, Error> {
        while !self.wait_timeout(Duration::from_secs(1)) {}
        let result = self.result.lock().unwrap_or_else(|e| e.into_inner()).take();
        result.unwrap_or_else(|| Err(Error::Thread("the transfer ended without a result".into())))
    }

    /// Waits up to `timeout` for the transfer to end; true once it has ([`Transfer::wait`]
    /// then returns at once). For a caller that must do something else meanwhile.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let mut slot = self.result.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return true;
        }
        let deadline = Instant::now() + timeout;
        loop {
            // A receiver whose relay gave up its code while it waited for a sender: the wait
            // is cancelled (the engine's wait ends within 50 ms of a cancel) and ends with why.
            if self.receiver && self.progress.phase() == EnginePhase::Idle {
                let given_up = self
                    .abandoned
                    .as_ref()
                    .and_then(|a| a.lock().unwrap_or_else(|e| e.into_inner()).take());
                if let Some(e) = given_up {
                    self.progress.interrupt();
                    *self.gave_up.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            }
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            match self.done.recv_timeout(step) {
                Ok(r) => {
                    let gave_up = self
                        .gave_up
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                    *slot = Some(match (r, gave_up) {
                        (Err(Error::Interrupted { .. }), Some(why)) => Err(why),
                        (r, _) => r.map_err(|e| self.kept(e)),
                    });
                    return true;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    *slot = Some(Err(Error::Thread(
                        "the transfer thread ended without a result".into(),
                    )));
                    return true;
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() >= deadline => return false,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// An interruption with what this side knows was kept.
    fn kept(&self, e: Error) -> Error {
        match e {
            Error::Interrupted { receiver, .. } => Error::Interrupted {
                receiver,
                held: if receiver {
                    self.progress.sent.load(Ordering::Relaxed)
                } else {
                    self.progress.confirmed.load(Ordering::Relaxed)
                },
                total: self.progress.total.load(Ordering::Relaxed),
            },
            e => e,
        }
    }

    /// Whether the transfer has ended (its result is waiting for [`Transfer::wait`]).
    pub fn is_finished(&self) -> bool {
        self.wait_timeout(Duration::ZERO)
    }

    /// Asks the transfer to end, keeping what was verified (see [`Canceller::cancel`]).
    pub fn cancel(&self) {
        self.canceller().cancel();
    }

    /// A handle that cancels this transfer from another thread.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            progress: self.progress.clone(),
        }
    }

    /// The transfer's events as a channel: each [`Event`] once, in order; it closes when the
    /// transfer has ended and its last events are in it. Events a reader is too slow for
    /// beyond a few thousand are dropped ([`Transfer::dropped_events`]).
    pub fn events(&self) -> &crossbeam_channel::Receiver<Event> {
        &self.events
    }

    /// The transfer's events as a blocking iterator; it ends when the transfer has.
    pub fn iter(&self) -> crossbeam_channel::Iter<'_, Event> {
        self.events.iter()
    }

    /// Events dropped because nobody read them in time.
    pub fn dropped_events(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.progress, 0)
    }

    /// The phase the session is in now.
    pub fn phase(&self) -> Phase {
        self.progress.phase().into()
    }
}

fn snapshot(p: &Progress, moving_bps: u64) -> Snapshot {
    let moving_since = p.moving_since();
    Snapshot {
        phase: p.phase().into(),
        peer: p.address(),
        total: p.total.load(Ordering::Relaxed),
        resumed: p.resumed.load(Ordering::Relaxed),
        sent: p.sent.load(Ordering::Relaxed),
        confirmed: p.confirmed.load(Ordering::Relaxed),
        rate_bps: p.rate_bps.load(Ordering::Relaxed),
        moving_bps,
        files_done: p.files_done.load(Ordering::Relaxed),
        elapsed: moving_since.map_or(Duration::ZERO, |t| t.elapsed()),
        moving_since,
        bottleneck: p.limit(),
        path: p.route_tag(),
        moving: p.moving_files(MOVING_WITHIN),
    }
}

/// The watcher: looks at `p` every `interval` until `stop`, and once more after it, sending
/// what changed.
fn watch(p: &Progress, stop: &AtomicBool, interval: Duration, tx: &Tx<Event>, dropped: &AtomicU64) {
    let send = |e: Event| send_counted(tx, dropped, e);
    let mut phase = EnginePhase::Idle;
    let mut last: Option<Snapshot> = None;
    let mut last_at = Instant::now();
    let mut limit: Option<String> = None;
    let mut route: Option<&'static str> = None;
    let mut started: HashSet<String> = HashSet::new();
    let mut files_done = 0;
    loop {
        let ending = stop.load(Ordering::Relaxed);
        let now_phase = p.phase();
        if now_phase != phase {
            phase = now_phase;
            send(Event::Phase(phase.into()));
        }
        for name in p.moving_files(interval * 2) {
            if started.insert(name.clone()) {
                send(Event::FileStarted(name));
            }
        }
        let done = p.files_done.load(Ordering::Relaxed);
        while files_done < done {
            files_done += 1;
            send(Event::FileDone { done: files_done });
        }
        if let Some(l) = p.limit().filter(|l| limit.as_ref() != Some(l)) {
            limit = Some(l.clone());
            send(Event::Bottleneck(l));
        }
        if let Some(r) = p.route_tag().filter(|r| route != Some(*r)) {
            route = Some(r);
            send(Event::Path(r));
        }
        if phase == EnginePhase::Moving || ending {
            let secs = last_at.elapsed().as_secs_f64().max(1e-3);
            let sent = p.sent.load(Ordering::Relaxed);
            let before = last.as_ref().map_or(0, |s| s.sent);
            let bps = (sent.saturating_sub(before) as f64 * 8.0 / secs) as u64;
            let now = snapshot(p, bps);
            let changed = last.as_ref().is_none_or(|s| {
                (s.sent, s.confirmed, s.files_done, s.total, s.rate_bps)
                    != (
                        now.sent,
                        now.confirmed,
                        now.files_done,
                        now.total,
                        now.rate_bps,
                    )
            });
            if changed || ending {
                send(Event::Progress(now.clone()));
                last = Some(now);
                last_at = Instant::now();
            }
        }
        if ending {
            return;
        }
        std::thread::park_timeout(interval);
    }
}
