//! The deterministic scenario runner: hurtle's sender and receiver state machines, run against
//! each other over simulated links on a virtual clock.
//!
//! # What this module owns
//!
//! The *driver* role, in simulation: the event loop, the timers and the glue that the real
//! drivers in `hurtle-engine` provide around the sans-IO core, so that a whole data phase (step 4
//! and 5 of the session in `hurtle-proto`'s crate docs) can be replayed exactly from a seed.
//! A [`Scenario`] describes files (sizes; the bytes come from the seed), the layout parameters,
//! the path and a few fault knobs; a [`Pair`] runs it:
//!
//! The data phase's rules are the engine's own machines, [`SenderData`] and [`ReceiverData`]
//! (`hurtle_proto::session::data`): this runner only carries out what they decide, as the
//! engine's session loops do, so its tests test what ships.
//!
//! - **Sender side**: its [`SenderData`], and one [`ChannelSender`] and one [`Pacer`] (the
//!   total rate split evenly) per channel. Each turn it hands control messages to the machine
//!   and carries out its commands (a NACK to `on_nack`, a channel's end to
//!   `on_channel_done`, a new rate to the pacers, a move to [`Scenario::fallback`]), sends runs
//!   while the pacer allows (cut into datagrams of `payload` bytes with a [`Header`]: kind
//!   `Data`, `FLAG_RETRANSMIT` for repairs, per-channel packet numbers from 1, file id and
//!   offset from [`Layout::resolve`]), sends a `Final` datagram when `poll_final` says so,
//!   gives the machine the value of every block it read for the first time and sends its
//!   `BlockHashes` at once, and runs its timers (keep-alives, the silence check, the stall).
//! - **Receiver side**: its [`ReceiverData`], one [`Admission`] for all channels (they share
//!   one link, as they would share one socket), one [`ChannelReceiver`] per channel and an
//!   in-memory copy of every file. Admission is the engine's, from `hurtle-proto`: datagrams
//!   that fail [`Header::decode`], carry another session id, a probe (this runner has no
//!   probing phase), a channel that is not the one the layout assigns, a wrong stripe length
//!   in a final marker, or a `(file, offset, len)` that [`Layout::place`] refuses are dropped
//!   and counted ([`Rejected`]). Good data is recorded with `on_data` and copied into the file
//!   when it brought new bytes; a completed block's value, hashed over the received bytes,
//!   goes to the machine, which judges it against the sender's: a file it completes is in
//!   place at once (this runner's disk is its memory) and confirmed, a block that failed goes
//!   back to its channel (`reject`). Each turn it sends `poll_nack` results as `Nack` and
//!   `poll_done` as `ChannelDone`.
//! - **Paths**: all channels share one data [`Link`] (sender -> receiver), so a rate-limited
//!   bottleneck is shared as it would be on a real path. The control connection is modelled as
//!   TCP ([`crate::control`]): reliable and in order, with the data link's one-way delay (or
//!   [`Scenario::control_delay`]); during a blackout of the data link it stalls and delivers what
//!   was sent once the blackout ends. Messages really are framed and parsed with
//!   [`Control::to_frame`] / [`Control::from_body`]. With [`Scenario::fallback`] a second data
//!   path stands for the TCP data connections of `--transport auto`: the receiver's machine
//!   names the channels on which nothing arrived, the sender's moves every channel there
//!   (what the silent ones sent queued again, no second copies of repairs, no parity), and
//!   the receiver reads it from the `Fallback` on.
//! - **Rate control** ([`Scenario::rate`]): without it every pacer runs at a fixed share of
//!   [`Scenario::rate_bps`]. With it the sender runs a [`RateController`] the way the engine's
//!   sender does: the receiver sends a `Control::Report` over the control path every report
//!   interval ([`hurtle_proto::rate::report_interval`] of the configured RTT, stretched at
//!   low rates by [`ReportCadence`], further where the link's propagation both ways is a
//!   short path's ([`Scenario::report_pace`]), as the engine's receiver does it; the first at
//!   that interval after time zero), built by the engine's
//!   [`ReportBuilder`] from the admission counts: the datagram bytes and count admitted in the
//!   interval, `lost` = packet numbers spanned minus datagrams admitted (per channel, `Data`
//!   and `Final`, counted only once every check passed), the receiver stage's drops as kernel
//!   socket drops, the receiver stage's fullest moment (as `queue_fill`), and the mean queueing
//!   delay: one-way delay above the lowest seen on the channel, from the header's `sent_us`
//!   (stamped by the sender at send time, µs since time zero, wrapping) against the receiver's
//!   own clock, which is offset from the sender's by a seeded amount so only differences mean
//!   anything. Each channel's receiver waits that much longer before asking for a repair again,
//!   as in the engine. The sender feeds each report
//!   to `on_feedback` when it arrives and sets every pacer to the new rate divided by the channel
//!   count (at least 100 kbit/s), and their catch-up to the controller's
//!   (`RateController::catch_up`); between reports it asks `on_silence` at every step, as the
//!   engine's sender does every report interval. Every change lands in
//!   [`Outcome::rate_timeline`], every report in [`Outcome::reports`].
//! - **Receiver capacity** ([`Scenario::receiver_rate_bps`]): a second rate-limited drop-tail
//!   stage between the data link and the receiver, like a socket buffer of
//!   [`Scenario::receiver_queue_bytes`] drained by a reader that can take only so many bits per
//!   second. Its drops are what the kernel's `SO_RXQ_OVFL` counter would say: they reach the
//!   sender as socket drops, and also show as lost packet numbers, as on a real host. As the
//!   engine's receiver does with the kernel's arrival stamps, the receiver behind it measures
//!   each datagram's queueing delay at its arrival in the stage, not when it is read, and its
//!   reports time their bytes by when they arrived ([`hurtle_proto::admit::arrival_interval`]),
//!   or, once the stage is a quarter full, by when they were read
//!   ([`ReportBuilder::build`]).
//! - **Path changes** ([`Scenario::rate_changes`]): at given virtual times the data link's
//!   bottleneck rate becomes a new value ([`Link::set_rate`]).
//! - **Resume** ([`Scenario::held`]): the receiver starts with some blocks already in its copy
//!   of the files, some of them possibly wrong. Both sides `hold` those blocks' stripe ranges;
//!   the sender hashes a held block when its cursor reaches it and sends the value without the
//!   bytes, and the receiver judges the copy it hashed at the start against it, so a wrong copy
//!   is rejected and fetched again like a corrupted block.
//! - **Faults on top of the link model**: NACK messages can be dropped with a probability
//!   ([`Scenario::nack_loss`]; TCP would not lose them, but a lost NACK is what re-NACKing
//!   exists for), final markers can be dropped ([`Scenario::final_loss`]), one header bit can be
//!   flipped ([`Scenario::header_corrupt`]), and a hostile injector adds forged datagrams
//!   straight into the receiver ([`Scenario::hostile_every`]).
//! - **Feedback as datagrams** ([`Scenario::feedback_copies`]): reports and NACKs also go as
//!   lossy datagrams, as the engine's do, and the sender acts on the first copy of each (a
//!   report goes on TCP too only where [`hurtle_proto::feedback::TcpCopies`] says); with
//!   [`Scenario::control_rto`] the control connection delivers what was sent into a blackout
//!   at TCP's first retransmission after it (its timer backing off), so the copies on TCP of
//!   lost feedback datagrams come late, as they do after a real outage.
//! - **Control faults** (whole sessions only, [`crate::whole_session::ControlFault`]; the control
//!   path applies each [`crate::control::Fault`]): a message inserted, replaced, lost or
//!   duplicated, garbage, or silence from some message on; and the end of the connection when
//!   a side closes it.
//! - **The clock** jumps to the next deadline: the next delivery on any path (or out of the
//!   receiver stage), a pacer's ready time (for channels with work), the senders' and receivers'
//!   `next_timeout`, the next report, the next path change, and an optional periodic tick
//!   ([`Scenario::tick`]).
//!
//! The run ends when every file is in place at the receiver (an empty file at once) and every
//! channel sender `is_done()`. Then the receiver's bytes must equal the sender's exactly and every file hash
//! must equal `blake3::hash(file)`; otherwise, or when the virtual time or step cap is hit, the
//! run fails with a [`Failure`] that describes the state of every channel.
//!
//! # What it does not own
//!
//! The network model ([`crate::link`]), the control connection's model ([`crate::control`]:
//! delay, blackouts, retransmission timer, framing, faults) and the protocol logic
//! (`hurtle-proto`). A plain
//! [`Scenario`] skips the session's set-up: both sides start with the same [`Layout`] and
//! session id at time zero. The set-up (hello, manifest, decisions, skips) runs in
//! [`crate::whole_session`], which drives `hurtle-proto`'s set-up machines over the same control
//! paths and then this data phase on the same clock, each side from its own start: its sender
//! starts sending early data at the `HelloAck` under the provisional outcome
//! (`Pair::sender_begins`: a budget of new bytes; its block values go at once, tagged with
//! the hello's session id), goes on when its outcome is the provisional one
//! (`Pair::early_kept`) or starts again from it under the next session id
//! (`Pair::sender_restarts`, the block values of the blocks it reads again tagged with that
//! one); its receiver builds its data state from its own outcome and reads its datagrams
//! from then on (`Pair::receiver_starts`: they wait in the link until then, and those of
//! another session id are dropped), its machine taking first the early data's values that
//! came during its set-up when its outcome keeps the early data, and dropping those of
//! superseded early data in its data phase; a side that ends stops. The sender's layout and the receiver's are kept apart, as they may
//! differ for a while. Probing of payload sizes runs in neither: data uses
//! [`Scenario::payload`] and the receiver rejects probes.
//!
//! # Determinism
//!
//! The only real-clock read is the origin `Instant` taken when a [`Pair`] is created; everything
//! else is a function of the [`Scenario`]. Each random decision the runner itself makes (file
//! bytes, NACK drops, final drops, header flips, the receiver's clock offset) has its own
//! SplitMix64 stream, so turning one knob does not reshuffle the others.

use crate::control::ControlPath;
use crate::link::{Link, LinkConfig, LinkStats};
use hurtle_proto::admit::{arrival_interval, ArrivalMark, Placed, ReportFacts, Tally};
use hurtle_proto::fec::{self, ParityDesc, ParityStore, TailGroups};
use hurtle_proto::feedback::TcpCopies;
use hurtle_proto::hash::{block_value, BlockValue};
use hurtle_proto::probe::SilenceWatch;
use hurtle_proto::rate::dispersion::TrainPool;
use hurtle_proto::rate::{Outages, PathMemory, Reason, ReportCadence, ReportPace};
use hurtle_proto::session::data::{
    ChannelCmd, DataError, DataPath, ReceiverData, ReceiverDataEvent, SenderData, SenderDataEvent,
};
use hurtle_proto::wire::{
    Control, Header, Kind, DEFAULT_PAYLOAD, FLAG_RETRANSMIT, HEADER_LEN, MAX_PACKET,
};
use hurtle_proto::{
    Admission, Admit, ChannelReceiver, ChannelSender, Feedback, Layout, Pacer, RateConfig,
    RateController, RecvConfig, ReportBuilder, RunKind, SendConfig,
};
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Everything a run depends on. [`Scenario::default`] is 4 MiB in one file over 4 channels at
/// 200 Mbit/s on a clean path with 20 ms one-way delay.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Seeds the file contents, the link's randomness, the session id and the runner's knobs.
    pub seed: u64,
    /// File sizes in manifest order (0 is allowed).
    pub files: Vec<u64>,
    /// Block size (power of two, at least 1 KiB).
    pub block_size: u64,
    /// Data channels.
    pub channels: u16,
    /// Payload bytes per datagram (the header adds [`HEADER_LEN`]).
    pub payload: u16,
    /// Longest run asked of `poll_run`, in datagrams; a run is cut into datagrams and paced as
    /// one burst, like a GSO batch.
    pub run_datagrams: u16,
    /// Total pacing rate in bits per second (header bytes included), split evenly per channel.
    /// Unused when [`Scenario::rate`] is set.
    pub rate_bps: u64,
    /// Rate control: `Some` paces by a [`RateController`] fed by the receiver's reports, as the
    /// engine does (see the module docs); `None` paces at [`Scenario::rate_bps`] throughout.
    pub rate: Option<RateConfig>,
    /// With [`Scenario::rate`]: what an earlier transfer learnt of this path, and how long
    /// ago; the controller resumes from it as the engine's does ([`RateController::resume`]).
    pub resume: Option<(PathMemory, Duration)>,
    /// Catch-up allowance of each pacer.
    pub pacer_burst: Duration,
    /// The data path, sender -> receiver, shared by all channels.
    pub link: LinkConfig,
    /// Changes of the data link's bottleneck rate during the run: at each virtual time (from
    /// time zero, any order) the rate becomes the given bits per second.
    pub rate_changes: Vec<(Duration, u64)>,
    /// Rate at which the receiving host takes datagrams off its socket buffer, bits per second
    /// (datagram bytes, header included); `None`: as fast as they arrive.
    pub receiver_rate_bps: Option<u64>,
    /// Bytes the receiving host's socket buffer holds while the reader is busy (drop-tail, not
    /// counting the datagram being read). Only used with [`Scenario::receiver_rate_bps`].
    /// Default: 4 MiB, the engine's `SO_RCVBUF` request.
    pub receiver_queue_bytes: usize,
    /// Moments the receiving host's reader stops (a CPU hiccup, a page fault storm): from each
    /// start to each end (virtual times from time zero) nothing is taken off its socket buffer,
    /// which fills and then drops. Only used with [`Scenario::receiver_rate_bps`].
    pub receiver_stalls: Vec<(Duration, Duration)>,
    /// Moments the sending host's channel threads stop (preempted; on a busy VM, the
    /// hypervisor's steal): from each start to each end (virtual times from time zero) no data
    /// datagram leaves, and the pacers owe the time missed, as the engine's do (each repays
    /// up to [`hurtle_proto::channel_send::MAX_OWED`], or what the rate controller allows).
    pub sender_stalls: Vec<(Duration, Duration)>,
    /// Whether the receiver's reports carry the bottleneck's rate by its trains
    /// ([`hurtle_proto::rate::dispersion`]), as the engine's do; `false` leaves the field 0
    /// (a receiver whose arrival times cannot show the spacing), to compare startup without.
    pub train_estimates: bool,
    /// The receiving host is handed datagrams in buffers, as behind GRO (a NIC that coalesces
    /// its interrupts, or linkem's GSO writes): at each multiple of this from time zero, what
    /// arrived since the one before, every datagram with that moment as its arrival time.
    /// `None`: each datagram as it arrives.
    pub receiver_lumps: Option<Duration>,
    /// While `auto`'s startup lasts, each send is at least the controller's train
    /// ([`RateController::train_bytes`]), as the engine's are; `false` keeps
    /// [`Scenario::run_datagrams`] throughout, to compare.
    pub startup_trains: bool,
    /// The receiving host's limit is its disk, not its CPU: the stage of
    /// [`Scenario::receiver_rate_bps`] stands for the engine's writer queue, and the reports
    /// carry its fill and wait as the writer's (`disk_fill`, `disk_wait_us`) besides the
    /// backlog and queueing delay, as the engine's do.
    pub receiver_is_disk: bool,
    /// One-way delay of the control connection; `None` uses `link.delay`.
    pub control_delay: Option<Duration>,
    /// Probability that a NACK message is dropped instead of sent.
    pub nack_loss: f64,
    /// The receiver's reports and NACKs also go as datagrams, as the engine's do
    /// ([`hurtle_proto::feedback`]): each copy is lost with this probability, and in a blackout
    /// of the data link, and arrives after the control connection's delay otherwise; the
    /// sender's machine acts on the first copy of each ([`hurtle_proto::feedback::Dedup`]).
    /// `None`: the control connection only.
    pub feedback_copies: Option<f64>,
    /// The control connection's retransmission timer: a message sent into a blackout arrives
    /// with TCP's first retransmission after the blackout ends, the timer doubling from this
    /// value from the blackout's start (as TCP's backs off). `None`: as soon as it ends.
    pub control_rto: Option<Duration>,
    /// Probability that a final-marker datagram is dropped before it reaches the link.
    pub final_loss: f64,
    /// Probability that one bit of a data datagram's 28-byte header is flipped before sending.
    pub header_corrupt: f64,
    /// After every this many genuine datagrams, one forged datagram is injected at the receiver
    /// (cycling through [`Forgery`] kinds); 0 disables the injector.
    pub hostile_every: u64,
    /// A resumed transfer: global blocks the receiver already holds from an earlier attempt,
    /// each with whether its copy is wrong (a bit flipped, as a torn write or a changed source
    /// would leave it). Both sides `hold` them as the engine does after a resume offer; the
    /// receiver judges its copy against the sender's block value like any received block.
    pub held: Vec<(u64, bool)>,
    /// Channel sender tunables.
    pub send: SendConfig,
    /// Parity for each channel's tail ([`hurtle_proto::fec`]), as the engine sends it.
    pub fec: bool,
    /// Channel receiver tunables.
    pub recv: RecvConfig,
    /// Periodic wake-up on top of the deadlines; `None` runs on deadlines alone.
    pub tick: Option<Duration>,
    /// The run fails if it is not finished after this much virtual time.
    pub max_virtual: Duration,
    /// The sender gives up when the receiver's reports show no progress for this long, as
    /// the engine's does (`SendOptions::stall_timeout`, 30 s by default), and the receiver
    /// when the sender says nothing at all for this long (the engine's `idle_timeout`, 30 s).
    /// Without [`Scenario::rate`] there are no reports: a data phase longer than this stalls.
    pub stall: Duration,
    /// The TCP data connections of `--transport auto`, dialled beside UDP: with it the data
    /// phase may move every channel to this second path, once, when the receiver finds UDP
    /// silent at the start of its data phase ([`hurtle_proto::probe::SilenceWatch`]). TCP
    /// delivers every byte in order: give it no loss, and a queue that holds what the pacers
    /// send at its rate (they pace at that rate after the move, standing in for TCP's own).
    pub fallback: Option<LinkConfig>,
    /// A direct path that opens at this virtual time (one punched through both NATs while the
    /// data went through a relay, [`Scenario::link`]): the sender's channels move there at
    /// once, and the receiver reads both paths (what was on its way through the relay still
    /// arrives). Nothing is sent again at the move.
    pub direct: Option<(Duration, LinkConfig)>,
    /// The run fails after this many event-loop steps.
    pub max_steps: u64,
}

impl Scenario {
    /// The sender's rate controller at `start`, as the engine makes it: from
    /// [`Scenario::rate`], resumed from [`Scenario::resume`] (`None` without a `rate`).
    pub fn controller(&self, start: Instant) -> Option<RateController> {
        self.rate.clone().map(|cfg| {
            let pace = ReportPace::heard_on(cfg.rtt, Some(self.kernel_floor()));
            let mut c = RateController::new(cfg, start);
            c.set_channels(self.channels);
            c.set_report_pace(pace);
            if let Some((memory, age)) = &self.resume {
                c.resume(memory, *age);
            }
            c
        })
    }

    /// The receiver's pace of reports, as the engine's chooses it from the round trip it
    /// measured and the kernel's floor ([`ReportPace::for_path`]); `None` without
    /// [`Scenario::rate`].
    pub fn report_pace(&self) -> Option<ReportPace> {
        let floor = self.kernel_floor();
        self.rate
            .as_ref()
            .map(|cfg| ReportPace::for_path(cfg.rtt, Some(floor)))
    }

    /// What the engine's kernel would time the control connection's round trip at, at
    /// least: the link's propagation both ways.
    fn kernel_floor(&self) -> Duration {
        self.link.delay * 2
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: 1,
            files: vec![4 << 20],
            block_size: 16 << 10,
            channels: 4,
            payload: DEFAULT_PAYLOAD,
            run_datagrams: 4,
            rate_bps: 200_000_000,
            rate: None,
            resume: None,
            pacer_burst: Duration::from_millis(1),
            link: LinkConfig::default().with_delay(Duration::from_millis(20)),
            rate_changes: Vec::new(),
            receiver_rate_bps: None,
            receiver_queue_bytes: 4 << 20,
            receiver_stalls: Vec::new(),
            sender_stalls: Vec::new(),
            train_estimates: true,
            receiver_lumps: None,
            startup_trains: true,
            receiver_is_disk: false,
            control_delay: None,
            nack_loss: 0.0,
            feedback_copies: None,
            control_rto: None,
            final_loss: 0.0,
            header_corrupt: 0.0,
            hostile_every: 0,
            held: Vec::new(),
            send: SendConfig::default(),
            fec: true,
            recv: RecvConfig::default(),
            tick: Some(Duration::from_millis(1)),
            max_virtual: Duration::from_secs(600),
            stall: Duration::from_secs(30),
            fallback: None,
            direct: None,
            max_steps: 3_000_000,
        }
    }
}

impl Scenario {
    /// Runs the scenario to the end. See [`Pair::drive`].
    pub fn run(&self) -> Result<Outcome, Failure> {
        Pair::new(self.clone())?.drive()
    }
}

/// The kinds of datagram the hostile injector forges, in the order it cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgery {
    /// A well-formed data datagram for real bytes, but with another session id.
    WrongSession,
    /// Data starting at the end of file 0.
    PastEndOfFile,
    /// Data crossing a block boundary (or overflowing the offset).
    CrossesBlock,
    /// Data for a file id that is not in the manifest.
    NoSuchFile,
    /// Data for real bytes claiming a channel that does not carry them.
    WrongChannel,
    /// A final marker announcing the wrong stripe length.
    WrongFinal,
    /// A probe datagram during the data phase.
    Probe,
    /// An unknown kind.
    BadKind,
    /// Fewer bytes than a header.
    Truncated,
}

const FORGERIES: [Forgery; 9] = [
    Forgery::WrongSession,
    Forgery::PastEndOfFile,
    Forgery::CrossesBlock,
    Forgery::NoSuchFile,
    Forgery::WrongChannel,
    Forgery::WrongFinal,
    Forgery::Probe,
    Forgery::BadKind,
    Forgery::Truncated,
];

/// Datagrams the receiver dropped, by reason: the engine's admission counts
/// ([`hurtle_proto::admit::Rejected`]).
pub use hurtle_proto::admit::Rejected;

/// What a finished run did. Byte counts are payload bytes unless noted.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// When the sender moved its channels to [`Scenario::fallback`], if it did.
    pub moved_to_tcp: Option<Duration>,
    /// When the sender moved its channels to [`Scenario::direct`], if it did.
    pub moved_direct: Option<Duration>,
    /// Virtual time from time zero until the run was complete (for a plain scenario time zero
    /// is the first send; for a whole session, the sender's hello, and the end is both sides'
    /// end).
    pub duration: Duration,
    /// Virtual time at which the first channel had sent all its new data: until then every
    /// channel sends new data at its share of the rate (the transfer's steady part).
    pub steady_until: Duration,
    /// Virtual time at which the last new byte was sent (every later datagram is a repair or a
    /// final marker).
    pub new_data_sent: Duration,
    /// Event-loop steps taken.
    pub steps: u64,
    /// Total bytes of all files.
    pub bytes: u64,
    /// Data datagrams handed to the link (first transmissions and repairs).
    pub datagrams_sent: u64,
    /// Of those, repairs (`FLAG_RETRANSMIT`).
    pub datagrams_resent: u64,
    /// Payload bytes sent for the first time (sum over the channel senders).
    pub new_bytes: u64,
    /// Payload bytes resent.
    pub repair_bytes: u64,
    /// Bytes the receiver held from the start ([`Scenario::held`]) and the sender passed over.
    pub held_bytes: u64,
    /// Final markers the senders produced.
    pub finals_sent: u64,
    /// Final markers dropped by [`Scenario::final_loss`].
    pub finals_dropped: u64,
    /// NACK messages the receivers produced.
    pub nacks_sent: u64,
    /// NACK messages dropped by [`Scenario::nack_loss`].
    pub nacks_dropped: u64,
    /// Duplicate payload bytes seen by the receivers.
    pub duplicate_bytes: u64,
    /// Blocks whose hash did not match (and were fetched again).
    pub blocks_rejected: u64,
    /// Datagrams dropped by the receiver, by reason.
    pub rejected: Rejected,
    /// Forged datagrams injected.
    pub injected: u64,
    /// Datagrams given a flipped header bit by [`Scenario::header_corrupt`].
    pub header_corrupted: u64,
    /// `BlockHashes` messages sent (of a whole session whose early data was not kept: those of
    /// the data phase after it; the early data's are in [`EarlySent::hash_messages`]).
    pub hash_messages: u64,
    /// Block values the receiver fed its verifier as the sender's (each block's once): those
    /// of its data phase's session, the early data's that came during a whole session's
    /// set-up included ([`Outcome::early_values`]).
    pub values_expected: u64,
    /// Of [`Outcome::values_expected`], the early data's values that came during a whole
    /// session's set-up, taken from the receiver's set-up machine at its outcome
    /// (`ReceiverSetup::early_values`: only when the outcome keeps the early data).
    pub early_values: u64,
    /// Block values of superseded early data (the hello's session id, when the data phase's
    /// is another) that the receiver read in its data phase and dropped.
    pub values_superseded: u64,
    /// Counters of the data link.
    pub link: LinkStats,
    /// The total pacing rate over time: the first rate at time zero, then every change. Without
    /// [`Scenario::rate`], just [`Scenario::rate_bps`] at time zero.
    pub rate_timeline: Vec<RatePoint>,
    /// The total pacing rate at the end, bits per second.
    pub final_rate_bps: u64,
    /// The outages the sender's rate controller counted (none without [`Scenario::rate`]).
    pub outages: Outages,
    /// Every report the receiver sent, in order (none without [`Scenario::rate`]).
    pub reports: Vec<ReportSample>,
    /// Datagrams the receiver stage dropped because its buffer was full (the socket drops).
    pub socket_drops: u64,
    /// Most bytes ever waiting in the receiver stage's buffer.
    pub receiver_queue_max: usize,
    /// Virtual time at which the first data datagram was sent (`None`: none was), a whole
    /// session's early data included (kept or not). When a whole session's early data was not
    /// kept, the counts of what its sender sent are those of the data phase after it; the
    /// receiver's ([`Outcome::rejected`]) and the link's include it.
    pub first_data: Option<Duration>,
    /// Data datagrams handed to the link, by channel.
    pub datagrams_by_channel: Vec<u64>,
    /// Payload bytes of the data datagrams handed to the link (first sends and repairs), by
    /// the file id in their header.
    pub file_payload_bytes: Vec<u64>,
    /// Parity datagrams sent ([`Scenario::fec`]).
    pub parity_sent: u64,
    /// Data datagrams' pieces the receiver rebuilt from parity.
    pub recovered: u64,
}

/// One point of the pacing rate's timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatePoint {
    /// Virtual time at which the sender set this rate.
    pub at: Duration,
    /// Total rate over all channels from then on, bits per second.
    pub rate_bps: u64,
    /// Why the rate changed ([`Reason::Start`] for the first rate).
    pub reason: Reason,
}

/// One report the receiver sent: the feedback the sender's controller got from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportSample {
    /// Virtual time at which the receiver sent it (the end of the interval it covers).
    pub at: Duration,
    /// Payload bytes accepted as new so far (the report's `received`).
    pub received: u64,
    /// What it said about the interval.
    pub feedback: Feedback,
}

impl Outcome {
    /// The pacing rate in force at virtual time `at`, bits per second.
    pub fn rate_at(&self, at: Duration) -> u64 {
        self.rate_timeline
            .iter()
            .take_while(|p| p.at <= at)
            .last()
            .or(self.rate_timeline.first())
            .map_or(0, |p| p.rate_bps)
    }

    /// Share of the payload bytes sent that were repairs.
    pub fn resent_share(&self) -> f64 {
        let total = self.new_bytes + self.repair_bytes;
        if total == 0 {
            0.0
        } else {
            self.repair_bytes as f64 / total as f64
        }
    }

    /// File bytes per second of virtual time, in bits per second.
    pub fn goodput_bps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.duration.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes in {:.3} s virtual ({:.1} Mbit/s, {} steps): {} datagrams, {} resent \
             ({:.1}% of bytes), {} finals ({} dropped), {} nacks ({} dropped), {} duplicate \
             bytes, {} blocks rejected, {} datagrams rejected ({:?}), {} injected, link {:?}, \
             rate {:.1} Mbit/s at the end after {} changes, {} reports, {} socket drops \
             (receiver buffer max {} bytes)",
            self.bytes,
            self.duration.as_secs_f64(),
            self.goodput_bps() / 1e6,
            self.steps,
            self.datagrams_sent,
            self.datagrams_resent,
            self.resent_share() * 100.0,
            self.finals_sent,
            self.finals_dropped,
            self.nacks_sent,
            self.nacks_dropped,
            self.duplicate_bytes,
            self.blocks_rejected,
            self.rejected.total(),
            self.rejected,
            self.injected,
            self.link,
            self.final_rate_bps as f64 / 1e6,
            self.rate_timeline.len().saturating_sub(1),
            self.reports.len(),
            self.socket_drops,
            self.receiver_queue_max,
        )
    }
}

/// Why a run failed, with a description of the state of both sides at that moment.
pub struct Failure {
    /// Virtual time of the failure.
    pub at: Duration,
    /// What went wrong.
    pub reason: String,
    /// Per-channel and per-side state, one item per line.
    pub state: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run failed at {:.3} s virtual: {}\n{}",
            self.at.as_secs_f64(),
            self.reason,
            self.state
        )
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Failure {}

/// A SplitMix64 stream for the runner's own random decisions.
#[derive(Debug, Clone)]
struct SimRng(u64);

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SimRng {
    /// Stream `stream` of `seed`.
    fn new(seed: u64, stream: u64) -> Self {
        SimRng(mix64(
            seed ^ mix64(stream.wrapping_mul(GOLDEN_GAMMA) ^ 0x6875_7274_6c65),
        ))
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix64(self.0)
    }
    /// True with probability `p`; draws nothing when `p` cannot fire.
    fn chance(&mut self, p: f64) -> bool {
        if p.is_nan() || p <= 0.0 {
            return false;
        }
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < p
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Random streams of a scenario.
mod stream {
    pub const FILES: u64 = 1;
    pub const LINK: u64 = 2;
    pub const SESSION: u64 = 3;
    pub const NACK_DROP: u64 = 4;
    pub const FINAL_DROP: u64 = 5;
    pub const HEADER_FLIP: u64 = 6;
    pub const CLOCK: u64 = 7;
    pub const FEEDBACK_DROP: u64 = 8;
    pub const TCP: u64 = 9;
    pub const DIRECT: u64 = 10;
}

/// The session id a sender seeded with `seed` picks (odd, as the engine's are).
pub(crate) fn session_id(seed: u64) -> u32 {
    (SimRng::new(seed, stream::SESSION).next_u64() >> 32) as u32 | 1
}

/// The bytes of file `index` of a scenario seeded with `seed`.
pub fn file_bytes(seed: u64, index: usize, len: u64) -> Vec<u8> {
    let mut rng = SimRng::new(seed ^ mix64(index as u64 + 1), stream::FILES);
    let mut out = Vec::with_capacity(len as usize);
    while out.len() + 8 <= len as usize {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    let tail = len as usize - out.len();
    out.extend_from_slice(&rng.next_u64().to_le_bytes()[..tail]);
    out
}

/// The receiving host between the data link and the receiver: a drop-tail socket buffer of
/// `capacity` bytes drained by a reader that takes each datagram at `rate_bps`. Like the link's
/// bottleneck, the datagram being read is not in the buffer; it reaches the receiver when its
/// reading is done.
#[derive(Debug)]
struct RecvStage {
    rate_bps: u64,
    capacity: usize,
    /// When the reader is done with the last admitted datagram.
    busy_until: Instant,
    /// Admitted datagrams not yet being read at the last offer: (read start, length).
    waiting: VecDeque<(Instant, usize)>,
    waiting_bytes: usize,
    /// Admitted datagrams by the time they reach the receiver (nondecreasing: one reader),
    /// with when each arrived (the kernel's arrival stamp, which the engine's receiver times
    /// datagrams by).
    out: VecDeque<(Instant, Instant, Vec<u8>)>,
    drops: u64,
    max_waiting: usize,
    /// Most bytes waiting since the last report took it.
    peak_waiting: usize,
    /// When the reader stops, and until when (absolute).
    stalls: Vec<(Instant, Instant)>,
}

impl RecvStage {
    fn new(rate_bps: u64, capacity: usize, t0: Instant, stalls: &[(Duration, Duration)]) -> Self {
        RecvStage {
            stalls: stalls.iter().map(|&(a, b)| (t0 + a, t0 + b)).collect(),
            rate_bps,
            capacity,
            busy_until: t0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            out: VecDeque::new(),
            drops: 0,
            max_waiting: 0,
            peak_waiting: 0,
        }
    }

    /// A datagram arriving from the network at `now`.
    fn offer(&mut self, now: Instant, dg: Vec<u8>) {
        while let Some(&(start, len)) = self.waiting.front() {
            if start > now {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= len;
        }
        let mut start = self.busy_until.max(now);
        // A stalled reader takes nothing until the stall ends.
        if let Some(&(_, end)) = self.stalls.iter().find(|&&(a, b)| a <= start && start < b) {
            start = end;
        }
        if start > now {
            if self.waiting_bytes.saturating_add(dg.len()) > self.capacity {
                self.drops += 1;
                return;
            }
            self.waiting.push_back((start, dg.len()));
            self.waiting_bytes += dg.len();
            self.max_waiting = self.max_waiting.max(self.waiting_bytes);
            self.peak_waiting = self.peak_waiting.max(self.waiting_bytes);
        }
        let nanos = (dg.len() as u128 * 8 * 1_000_000_000).div_ceil(u128::from(self.rate_bps));
        self.busy_until = start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.out.push_back((self.busy_until, now, dg));
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.out.front().map(|(at, _, _)| *at)
    }

    /// The fullest the buffer got since the last call, in thousandths of its capacity (what
    /// the engine's receiver reads with `SO_MEMINFO`).
    fn take_fill_permille(&mut self) -> u16 {
        let peak = std::mem::take(&mut self.peak_waiting) as u64;
        (peak * 1000 / self.capacity.max(1) as u64).min(1000) as u16
    }

    /// The next datagram the reader is done with by `now`, with when it arrived.
    fn poll(&mut self, now: Instant) -> Option<(Instant, Vec<u8>)> {
        if self.out.front()?.0 > now {
            return None;
        }
        self.out.pop_front().map(|(_, arrived, dg)| (arrived, dg))
    }
}

/// The receiver's rate feedback: when the next `Control::Report` is due, and the engine's
/// builder that computes it.
#[derive(Debug)]
struct Reporter {
    /// When each report is due after the last, as the engine's receiver decides it.
    cadence: ReportCadence,
    builder: ReportBuilder,
    /// Which reports also go on the control connection, as the engine's receiver decides.
    copies: TcpCopies,
}

/// The sending peer.
#[derive(Debug)]
pub(crate) struct SenderSide {
    /// The layout it sends by (a whole session's sender may run ahead of its receiver, under
    /// the provisional outcome: see `Pair::sender_begins`).
    layout: Layout,
    /// The session id of its datagrams.
    session: u32,
    /// Early data: new bytes it may still send before its outcome is known; `None` once it
    /// is (and for a plain scenario). Its block values go at once all the same, tagged with
    /// [`SenderSide::session`].
    early: Option<u64>,
    pub(crate) files: Vec<Vec<u8>>,
    pub(crate) channels: Vec<ChannelSender>,
    pacers: Vec<Pacer>,
    /// Each channel's groups of tail data ([`Scenario::fec`]).
    fec: Vec<TailGroups>,
    packet_numbers: Vec<u64>,
    hashed: Vec<bool>,
    /// `BlockHashes` messages sent, and the block values in them.
    hash_messages: u64,
    values_sent: u64,
    genuine: u64,
    /// The data phase's rules, the engine's: block values, confirmations, NACK routing and
    /// the rate controller (with [`Scenario::rate`]).
    pub(crate) data: SenderData,
    rate_timeline: Vec<RatePoint>,
}

/// The receiving peer.
#[derive(Debug)]
pub(crate) struct ReceiverSide {
    pub(crate) files: Vec<Vec<u8>>,
    /// The checks of every datagram, and their counts.
    admission: Admission,
    /// The train estimates for the next report.
    trains: TrainPool,
    channels: Vec<ChannelReceiver>,
    /// Each channel's parity of groups not yet complete.
    parity: Vec<ParityStore>,
    /// The data phase's rules, the engine's: verification, commits, the end.
    pub(crate) data: ReceiverData,
    /// Turns the receiver has taken: its channels' passes over their sockets, for the
    /// silent-UDP watch.
    passes: u64,
    /// The session id of superseded early data, whose block values are dropped (`None` for
    /// a plain scenario, and when the data phase's session is the early data's).
    superseded: Option<u32>,
    /// Block values fed to the verifier, of them the early data's from the set-up, and the
    /// superseded ones dropped.
    values_expected: u64,
    early_values: u64,
    values_superseded: u64,
    blocks_rejected: u64,
    nacks_dropped: u64,
    /// With [`Scenario::receiver_rate_bps`].
    stage: Option<RecvStage>,
    /// Behind the stage, each channel's bytes admitted and when the last of them arrived, as
    /// the engine's channel threads mark them; and the marks at the last report. A report's
    /// bytes are timed by when they arrived ([`arrival_interval`]), as the engine's are where
    /// the kernel stamps arrivals (by when they were read once the stage is a quarter full:
    /// [`ReportBuilder::build`]).
    arrivals: Vec<ArrivalMark>,
    arrivals_reported: Vec<ArrivalMark>,
    /// With [`Scenario::rate`].
    reporter: Option<Reporter>,
    reports: Vec<ReportSample>,
}

/// What a data phase starts from: the layout both sides use, the session id, each side's
/// bytes, and what both hold. A plain [`Scenario`] makes one from its files and
/// [`Scenario::held`]; a whole session ([`crate::whole_session`]) from the set-up's `Agreed`.
#[derive(Debug)]
pub(crate) struct DataPlan {
    pub(crate) layout: Layout,
    pub(crate) session: u32,
    /// The sender's bytes of each file of the layout (empty for a file not sent).
    pub(crate) snd_files: Vec<Vec<u8>>,
    /// The receiver's copy of each file at the start: zeros, or a part file's held blocks.
    pub(crate) rcv_files: Vec<Vec<u8>>,
    /// Per channel: the stripe ranges both sides hold (not sent; the receiver judges its copy).
    pub(crate) held: Vec<Vec<Range<u64>>>,
}

impl DataPlan {
    /// The plan of a plain scenario: its files from the seed, its held blocks copied (and
    /// spoiled where asked) into the receiver's files.
    fn of_scenario(sc: &Scenario) -> Result<DataPlan, String> {
        let layout = Layout::new(&sc.files, sc.block_size, sc.channels)
            .map_err(|e| format!("bad layout: {e}"))?;
        let snd_files: Vec<Vec<u8>> = sc
            .files
            .iter()
            .enumerate()
            .map(|(i, &len)| file_bytes(sc.seed, i, len))
            .collect();
        let mut rcv_files: Vec<Vec<u8>> = sc.files.iter().map(|&s| vec![0u8; s as usize]).collect();
        let mut held = vec![Vec::new(); usize::from(sc.channels)];
        for &(block, corrupt) in &sc.held {
            let (Some((ch, stripe)), Some((file, range))) = (
                layout.block_stripe_range(block),
                layout.block_file_range(block),
            ) else {
                return Err(format!("held block {block} is not in the layout"));
            };
            let (f, r) = (file as usize, range.start as usize..range.end as usize);
            rcv_files[f][r.clone()].copy_from_slice(&snd_files[f][r.clone()]);
            if corrupt {
                rcv_files[f][r.start] ^= 0x20;
            }
            held[usize::from(ch)].push(stripe);
        }
        Ok(DataPlan {
            session: (SimRng::new(sc.seed, stream::SESSION).next_u64() >> 32) as u32,
            layout,
            snd_files,
            rcv_files,
            held,
        })
    }
}

/// What a whole session's sender sent as early data that its outcome did not keep (see
/// `Pair::sender_restarts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EarlySent {
    /// Data datagrams sent (final markers not counted).
    pub datagrams: u64,
    /// Final markers sent (a channel that sent all its stripe early).
    pub finals: u64,
    /// Parity datagrams sent (its tail's: see [`Scenario::fec`]).
    pub parity: u64,
    /// Payload bytes of new data sent.
    pub new_bytes: u64,
    /// Payload bytes sent, by the file id of the provisional layout.
    pub file_payload_bytes: Vec<u64>,
    /// `BlockHashes` messages sent (tagged with the hello's session id).
    pub hash_messages: u64,
    /// Block values in them (one per block read).
    pub values: u64,
}

/// The sending peer's state for a data phase that starts at `start`: `plan`'s layout, session
/// id, bytes and held stripes (its receiver's copies are not read).
fn sender_side(
    sc: &Scenario,
    plan: &DataPlan,
    snd_files: Vec<Vec<u8>>,
    t0: Instant,
    start: Instant,
) -> Result<SenderSide, String> {
    let layout = plan.layout.clone();
    let channels = layout.channels();
    let n = usize::from(channels);
    if snd_files.len() != layout.file_count() || plan.held.len() != n {
        return Err("data plan does not fit its layout".into());
    }
    let controller = sc.controller(start);
    let (per_channel, first_rate) = match &controller {
        // As the engine's sender splits the controller's rate.
        Some(c) => (
            (c.rate_bps() / u64::from(channels)).max(100_000),
            c.rate_bps(),
        ),
        None => ((sc.rate_bps / u64::from(channels)).max(1), sc.rate_bps),
    };
    let mut snd = SenderSide {
        channels: (0..channels)
            .map(|c| ChannelSender::new(&layout, c, sc.send.clone()))
            .collect(),
        pacers: (0..n)
            .map(|_| Pacer::new(per_channel, sc.pacer_burst))
            .collect(),
        fec: vec![TailGroups::new(); n],
        packet_numbers: vec![0; n],
        hashed: vec![false; layout.total_blocks() as usize],
        hash_messages: 0,
        values_sent: 0,
        genuine: 0,
        data: {
            let mut data = SenderData::new(
                &layout,
                (plan.session, channels),
                &vec![None; layout.file_count()],
                (
                    if sc.fallback.is_some() {
                        DataPath::UdpOrTcp
                    } else {
                        DataPath::Udp
                    },
                    sc.stall,
                ),
                start,
            );
            data.begin(start, controller);
            data
        },
        rate_timeline: vec![RatePoint {
            at: start - t0,
            rate_bps: first_rate,
            reason: Reason::Start,
        }],
        files: snd_files,
        session: plan.session,
        early: None,
        layout,
    };
    for (ch, ranges) in plan.held.iter().enumerate() {
        for stripe in ranges {
            snd.channels[ch].hold(stripe.clone());
        }
    }
    Ok(snd)
}

/// The receiving peer's state for a data phase that starts at `start`: `plan`'s layout,
/// session id, starting copies and held stripes (the sender's bytes are not read). With
/// `report_pace` (and [`Scenario::rate`]) it reports at that pace from `start`.
/// Datagrams of session `superseded` (early data its outcome did not keep) are dropped apart.
/// Its machine takes `early_values` (the early data's, that came during the set-up) first.
fn receiver_side(
    sc: &Scenario,
    plan: &DataPlan,
    (rcv_files, early_values): (Vec<Vec<u8>>, Vec<(u64, BlockValue)>),
    (t0, start): (Instant, Instant),
    report_pace: Option<ReportPace>,
    superseded: Option<u32>,
) -> Result<ReceiverSide, String> {
    let layout = &plan.layout;
    let channels = layout.channels();
    if rcv_files.len() != layout.file_count() || plan.held.len() != usize::from(channels) {
        return Err("data plan does not fit its layout".into());
    }
    let clock_offset_us = SimRng::new(sc.seed, stream::CLOCK).next_u64();
    let mut admission = Admission::new(plan.session, 0..channels, t0)
        .without_probes()
        .with_clock_offset(clock_offset_us);
    if let Some(early) = superseded {
        admission = admission.superseding(early);
    }
    let mut rcv = ReceiverSide {
        admission,
        trains: TrainPool::default(),
        files: rcv_files,
        channels: (0..channels)
            .map(|c| ChannelReceiver::new(c, layout.stripe_len(c), sc.recv.clone()))
            .collect(),
        parity: vec![ParityStore::new(); usize::from(channels)],
        data: ReceiverData::new(
            layout,
            (plan.session, superseded.unwrap_or(plan.session)),
            &vec![None; layout.file_count()],
            (
                sc.fallback.as_ref().map(|_| {
                    let rtt = sc.rate.as_ref().map_or(sc.link.delay * 2, |r| r.rtt);
                    SilenceWatch::new(rtt)
                }),
                sc.stall,
            ),
            start,
        ),
        passes: 0,
        superseded: superseded.filter(|&s| s != plan.session),
        values_expected: 0,
        early_values: 0,
        values_superseded: 0,
        blocks_rejected: 0,
        nacks_dropped: 0,
        stage: sc
            .receiver_rate_bps
            .map(|r| RecvStage::new(r, sc.receiver_queue_bytes, t0, &sc.receiver_stalls)),
        arrivals: vec![ArrivalMark::default(); usize::from(channels)],
        arrivals_reported: vec![ArrivalMark::default(); usize::from(channels)],
        reporter: sc.rate.as_ref().and(report_pace).map(|pace| Reporter {
            cadence: ReportCadence::new(pace),
            builder: ReportBuilder::new(start, Tally::default(), 0),
            copies: TcpCopies::default(),
        }),
        reports: Vec::new(),
    };
    // The receiver hashes its copy of the held blocks before anything arrives; the verdicts
    // wait for the sender's values.
    let mut held = Vec::new();
    for (ch, ranges) in plan.held.iter().enumerate() {
        for stripe in ranges {
            rcv.channels[ch].hold(stripe.clone());
            let mut pos = stripe.start;
            while pos < stripe.end {
                let span = layout.resolve(ch as u16, pos).ok_or_else(|| {
                    format!("held stripe {stripe:?} of channel {ch} is not in the layout")
                })?;
                held.push((span.block, block_value_of(layout, &rcv.files, span.block)));
                pos += span.to_block_end;
            }
        }
    }
    let sizes: Vec<u64> = (0..layout.file_count() as u32)
        .map(|f| layout.file_size(f).unwrap_or(0))
        .collect();
    rcv.early_values = early_values.len() as u64;
    rcv.values_expected = rcv.early_values;
    rcv.data
        .start(start, early_values, &held, &sizes)
        .map_err(|e| format!("the receiver's data phase did not start: {e}"))?;
    Ok(rcv)
}

/// A sender and a receiver wired together over simulated paths, on a virtual clock. See the
/// module docs.
#[derive(Debug)]
pub struct Pair {
    pub(crate) sc: Scenario,
    /// The receiver's layout and session id (the sender's are its own: see `SenderSide`).
    pub(crate) layout: Layout,
    session: u32,
    pub(crate) t0: Instant,
    pub(crate) now: Instant,
    pub(crate) steps: u64,
    pub(crate) link: Link,
    /// [`Scenario::fallback`]'s path, and whether each side moved to it (the sender when its
    /// machine says so, the receiver at `Fallback`), and when the sender did.
    tcp: Option<Link>,
    snd_on_tcp: bool,
    rcv_on_tcp: bool,
    /// [`Scenario::direct`]'s path, when it opens, and when the sender moved there.
    direct: Option<Link>,
    direct_opens: Option<Instant>,
    moved_direct: Option<Instant>,
    /// The receiver's channels that have had a datagram by the direct path.
    rcv_direct: Vec<usize>,
    moved_to_tcp: Option<Instant>,
    /// Forged datagrams waiting to be handed to the receiver (at once).
    injected: VecDeque<Vec<u8>>,
    pub(crate) to_receiver: ControlPath,
    pub(crate) to_sender: ControlPath,
    pub(crate) snd: SenderSide,
    pub(crate) rcv: ReceiverSide,
    /// The sender's channels send (false before a whole session's data phase and after the
    /// sender ended).
    pub(crate) snd_sending: bool,
    /// The receiver reads its data sockets (false until a whole session's receiver is ready
    /// for data, and after it ended: datagrams wait in the link meanwhile).
    pub(crate) rcv_reading: bool,
    nack_rng: SimRng,
    /// Feedback datagrams on their way to the sender (see [`Scenario::feedback_copies`]).
    feedback: VecDeque<(Instant, Control)>,
    feedback_rng: SimRng,
    final_rng: SimRng,
    header_rng: SimRng,
    datagrams_sent: u64,
    datagrams_resent: u64,
    parity_sent: u64,
    recovered: u64,
    datagrams_by_channel: Vec<u64>,
    /// Payload bytes of data datagrams, by file id.
    file_payload: Vec<u64>,
    first_data: Option<Instant>,
    finals_dropped: u64,
    injected_total: u64,
    header_corrupted: u64,
    /// [`Scenario::rate_changes`] in time order, and how many have been applied.
    rate_changes: Vec<(Duration, u64)>,
    rate_changes_done: usize,
    /// When the first channel, and when every channel, had sent all its new data.
    steady_until: Option<Instant>,
    new_data_sent: Option<Instant>,
    pub(crate) finished: Option<Instant>,
}

/// Why a side's data phase failed: a rule of its machine (the peer broke it), or a check of
/// this runner's own.
#[derive(Debug)]
pub(crate) enum DataFailure {
    /// The machine's verdict.
    Rule(DataError),
    /// This runner's.
    Runner(String),
}

impl fmt::Display for DataFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataFailure::Rule(e) => e.fmt(f),
            DataFailure::Runner(s) => f.write_str(s),
        }
    }
}

/// The scenario's knobs that every run needs to be positive.
pub(crate) fn check_knobs(sc: &Scenario) -> Result<(), String> {
    if sc.payload == 0 || sc.run_datagrams == 0 || (sc.rate.is_none() && sc.rate_bps == 0) {
        return Err("payload, run_datagrams and rate_bps must be positive".into());
    }
    if sc.receiver_rate_bps == Some(0) {
        return Err("receiver_rate_bps must be positive".into());
    }
    Ok(())
}

impl Pair {
    /// Builds both sides at virtual time zero. Fails if the layout parameters are invalid.
    pub fn new(sc: Scenario) -> Result<Self, Failure> {
        let fail = |reason: String| Failure {
            at: Duration::ZERO,
            reason,
            state: String::new(),
        };
        let plan = DataPlan::of_scenario(&sc).map_err(fail)?;
        check_knobs(&sc).map_err(fail)?;
        let t0 = Instant::now();
        let control_delay = sc.control_delay.unwrap_or(sc.link.delay);
        let blackouts = sc.link.blackouts.clone();
        let paths = (
            ControlPath::new(t0, control_delay, blackouts.clone()).with_rto(sc.control_rto),
            ControlPath::new(t0, control_delay, blackouts).with_rto(sc.control_rto),
        );
        Pair::build(sc, plan, t0, paths, true).map_err(fail)
    }

    /// Builds both sides from `plan` at time zero `t0`, over the given control paths (to the
    /// receiver, to the sender). `running`: the data phase starts at once; otherwise each side
    /// waits for its own start (`Pair::sender_begins`, `Pair::receiver_starts`: a whole
    /// session's set-up runs first).
    pub(crate) fn build(
        sc: Scenario,
        mut plan: DataPlan,
        t0: Instant,
        paths: (ControlPath, ControlPath),
        running: bool,
    ) -> Result<Pair, String> {
        let snd_files = std::mem::take(&mut plan.snd_files);
        let rcv_files = std::mem::take(&mut plan.rcv_files);
        let snd = sender_side(&sc, &plan, snd_files, t0, t0)?;
        // As the engine's receiver chooses it, from the round trip.
        let pace = sc.report_pace();
        let rcv = receiver_side(
            &sc,
            &plan,
            (rcv_files, Vec::new()),
            (t0, t0),
            pace.filter(|_| running),
            None,
        )?;
        let DataPlan {
            layout, session, ..
        } = plan;
        let mut rate_changes = sc.rate_changes.clone();
        rate_changes.sort_by_key(|&(at, _)| at);
        Ok(Pair {
            datagrams_by_channel: vec![0; usize::from(layout.channels())],
            file_payload: vec![0; layout.file_count()],
            layout,
            session,
            t0,
            now: t0,
            steps: 0,
            link: Link::new(
                sc.link.clone(),
                SimRng::new(sc.seed, stream::LINK).next_u64(),
                t0,
            ),
            tcp: sc
                .fallback
                .clone()
                .map(|cfg| Link::new(cfg, SimRng::new(sc.seed, stream::TCP).next_u64(), t0)),
            snd_on_tcp: false,
            rcv_on_tcp: false,
            direct: sc.direct.clone().map(|(_, cfg)| {
                Link::new(cfg, SimRng::new(sc.seed, stream::DIRECT).next_u64(), t0)
            }),
            direct_opens: sc.direct.as_ref().and_then(|&(at, _)| t0.checked_add(at)),
            moved_direct: None,
            rcv_direct: Vec::new(),
            moved_to_tcp: None,
            injected: VecDeque::new(),
            to_receiver: paths.0,
            to_sender: paths.1,
            snd,
            rcv,
            snd_sending: running,
            rcv_reading: running,
            nack_rng: SimRng::new(sc.seed, stream::NACK_DROP),
            feedback: VecDeque::new(),
            feedback_rng: SimRng::new(sc.seed, stream::FEEDBACK_DROP),
            final_rng: SimRng::new(sc.seed, stream::FINAL_DROP),
            header_rng: SimRng::new(sc.seed, stream::HEADER_FLIP),
            datagrams_sent: 0,
            datagrams_resent: 0,
            parity_sent: 0,
            recovered: 0,
            first_data: None,
            finals_dropped: 0,
            injected_total: 0,
            header_corrupted: 0,
            rate_changes,
            rate_changes_done: 0,
            steady_until: None,
            new_data_sent: None,
            finished: None,
            sc,
        })
    }

    /// A whole session's sender starts sending at `now` from `plan` (built from an `Agreed`;
    /// the receiver's copies in it are not read). With `early_budget` it sends early data: the
    /// provisional outcome, before the real one is known, at most that many new bytes (the
    /// block values it reads go at once, tagged with the plan's session id, the hello's);
    /// `Pair::early_kept` or `Pair::sender_restarts` end that.
    pub(crate) fn sender_begins(
        &mut self,
        mut plan: DataPlan,
        now: Instant,
        early_budget: Option<u64>,
    ) -> Result<(), String> {
        let files = std::mem::take(&mut plan.snd_files);
        let mut snd = sender_side(&self.sc, &plan, files, self.t0, now)?;
        snd.early = early_budget;
        self.datagrams_by_channel = vec![0; usize::from(plan.layout.channels())];
        self.file_payload = vec![0; plan.layout.file_count()];
        self.snd = snd;
        self.snd_sending = true;
        Ok(())
    }

    /// The sender's outcome is the provisional one its early data followed: the data phase
    /// goes on at `now`, with no more budget (the block values sent so far stand).
    pub(crate) fn early_kept(&mut self, now: Instant) {
        self.snd.early = None;
        let controller = self.snd.data.take_controller();
        self.snd.data.begin(now, controller);
    }

    /// The sender's outcome is not the provisional one: at `now` it drops its early data and
    /// starts again from `plan`, its pacers, rate controller and packet numbers going on; it
    /// reads every block again and sends its value tagged with the plan's session id. The
    /// data phase's counts start again from zero (take what the early data was with
    /// `Pair::early_sent` before).
    pub(crate) fn sender_restarts(
        &mut self,
        mut plan: DataPlan,
        now: Instant,
    ) -> Result<(), String> {
        let files = std::mem::take(&mut plan.snd_files);
        let mut snd = sender_side(&self.sc, &plan, files, self.t0, now)?;
        if snd.channels.len() == self.snd.channels.len() {
            snd.pacers = std::mem::take(&mut self.snd.pacers);
            snd.packet_numbers = std::mem::take(&mut self.snd.packet_numbers);
            let controller = self.snd.data.take_controller();
            snd.data.begin(now, controller);
            snd.rate_timeline = std::mem::take(&mut self.snd.rate_timeline);
        }
        snd.genuine = self.snd.genuine;
        self.datagrams_by_channel = vec![0; usize::from(plan.layout.channels())];
        self.file_payload = vec![0; plan.layout.file_count()];
        self.datagrams_sent = 0;
        self.datagrams_resent = 0;
        self.steady_until = None;
        self.new_data_sent = None;
        self.snd = snd;
        self.snd_sending = true;
        Ok(())
    }

    /// What the sender sent since it began (its early data, until its outcome).
    pub(crate) fn early_sent(&self) -> EarlySent {
        EarlySent {
            datagrams: self.datagrams_sent,
            finals: self.snd.channels.iter().map(|c| c.stats().finals).sum(),
            parity: self.parity_sent,
            new_bytes: self.snd.channels.iter().map(|c| c.stats().new_bytes).sum(),
            file_payload_bytes: self.file_payload.clone(),
            hash_messages: self.snd.hash_messages,
            values: self.snd.values_sent,
        }
    }

    /// A whole session's receiver has its outcome at `now`: its data state is built from
    /// `plan` (built from its own `Agreed`; the sender's bytes in it are not read), it reads
    /// its data sockets from now on (datagrams of another session id are dropped: those of
    /// `early`, the provisional outcome's, apart as superseded, when it is not the plan's) and
    /// reports at `report_pace` (with [`Scenario::rate`]). `early_values` are the early
    /// data's block values that came during the set-up, as its set-up machine gives them at
    /// its outcome (`ReceiverSetup::early_values`): the data phase takes them first.
    pub(crate) fn receiver_starts(
        &mut self,
        mut plan: DataPlan,
        now: Instant,
        (report_pace, early): (ReportPace, u32),
        early_values: Vec<(u64, BlockValue)>,
    ) -> Result<(), String> {
        let files = std::mem::take(&mut plan.rcv_files);
        self.rcv = receiver_side(
            &self.sc,
            &plan,
            (files, early_values),
            (self.t0, now),
            Some(report_pace),
            Some(early),
        )?;
        self.layout = plan.layout;
        self.session = plan.session;
        self.rcv_reading = true;
        Ok(())
    }

    /// Carries out what the receiver's machine decided: a verified file is in place at once
    /// (this runner's disk is its memory), a block that failed goes back to its channel, and
    /// the machine's messages go to the sender. Returns true when the sender is done and
    /// every file is in place.
    fn receiver_acts(&mut self, now: Instant) -> Result<bool, String> {
        let mut finished = false;
        while let Some(ev) = self.rcv.data.poll_event() {
            match ev {
                ReceiverDataEvent::Verified { .. } => {}
                ReceiverDataEvent::Commit { file, hash } => {
                    match self.rcv.data.committed().get(file as usize) {
                        None => return Err("verifier completed an unknown file".into()),
                        Some(Some(_)) => return Err(format!("file {file} completed twice")),
                        Some(None) => self.rcv.data.on_committed(file, hash),
                    }
                }
                ReceiverDataEvent::Reject { channel, block } => {
                    self.rcv.blocks_rejected += 1;
                    let (_, stripe) = self
                        .layout
                        .block_stripe_range(block)
                        .ok_or("verifier rejected an unknown block")?;
                    self.rcv.channels[usize::from(channel)].reject(stripe);
                }
                ReceiverDataEvent::MoveToTcp if self.tcp.is_some() => self.rcv_on_tcp = true,
                ReceiverDataEvent::MoveToTcp => {
                    return Err("Fallback in a scenario without a TCP path".into())
                }
                ReceiverDataEvent::Finish => {
                    self.rcv.data.finish().map_err(|e| e.to_string())?;
                    finished = true;
                }
            }
        }
        while let Some(msg) = self.rcv.data.poll_transmit() {
            self.to_sender.send(now, &msg);
        }
        Ok(finished)
    }

    /// The receiver's layout (the sender's too, but while a whole session's sender runs ahead
    /// of its receiver).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Virtual time elapsed.
    pub fn elapsed(&self) -> Duration {
        self.now - self.t0
    }
    /// The sender's bytes of file `file`.
    pub fn source(&self, file: usize) -> &[u8] {
        &self.snd.files[file]
    }
    /// The receiver's bytes of file `file` so far.
    pub fn received(&self, file: usize) -> &[u8] {
        &self.rcv.files[file]
    }
    /// Counters of the data link so far.
    pub fn link_stats(&self) -> LinkStats {
        *self.link.stats()
    }

    /// Runs steps until the transfer is complete and checked, or fails.
    pub fn drive(mut self) -> Result<Outcome, Failure> {
        while !self.step()? {}
        self.check_exact()?;
        Ok(self.outcome())
    }

    /// Handles every event due at the current virtual time, then advances the clock to the next
    /// deadline. Returns true once the run is complete (the clock then stays put).
    pub fn step(&mut self) -> Result<bool, Failure> {
        if self.finished.is_some() {
            return Ok(true);
        }
        self.steps += 1;
        let now = self.now;
        self.apply_rate_changes(now);
        self.receiver_turn(now).map_err(|r| self.failure(r))?;
        self.sender_turn(now).map_err(|r| self.failure(r))?;
        if self.is_complete() {
            self.finished = Some(now);
            return Ok(true);
        }
        self.advance(now, None)?;
        Ok(false)
    }

    /// Applies the path changes due at `now`.
    pub(crate) fn apply_rate_changes(&mut self, now: Instant) {
        while let Some(&(at, bps)) = self.rate_changes.get(self.rate_changes_done) {
            if self.t0.checked_add(at).is_none_or(|t| t > now) {
                break;
            }
            self.link.set_rate(Some(bps));
            self.rate_changes_done += 1;
        }
    }

    /// Moves the clock from `now` to the next deadline (or `extra`, if earlier), checking the
    /// step and time caps.
    pub(crate) fn advance(&mut self, now: Instant, extra: Option<Instant>) -> Result<(), Failure> {
        if self.steps >= self.sc.max_steps {
            return Err(self.failure(format!("step cap of {} reached", self.sc.max_steps)));
        }
        let next = match (self.next_deadline(), extra) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(next) = next else {
            return Err(self.failure("deadlock: nothing pending and no timer armed".into()));
        };
        // A deadline at or before `now` would be an event this step failed to handle; move on
        // regardless so the loop cannot spin in place.
        self.now = next.max(now + Duration::from_micros(1));
        if self.now - self.t0 > self.sc.max_virtual {
            return Err(self.failure(format!(
                "virtual time cap of {:?} reached",
                self.sc.max_virtual
            )));
        }
        Ok(())
    }

    /// The path the sender's channels send on.
    fn data_out(&mut self) -> &mut Link {
        if let (Some(direct), Some(_)) = (self.direct.as_mut(), self.moved_direct) {
            return direct;
        }
        match self.tcp.as_mut() {
            Some(tcp) if self.snd_on_tcp => tcp,
            _ => &mut self.link,
        }
    }

    /// The path the receiver's channels read.
    fn data_in(&mut self) -> &mut Link {
        match self.tcp.as_mut() {
            Some(tcp) if self.rcv_on_tcp => tcp,
            _ => &mut self.link,
        }
    }

    /// When the sender's stall at `now` ends, if it is in one ([`Scenario::sender_stalls`]).
    fn sender_stall_end(&self, now: Instant) -> Option<Instant> {
        self.sc
            .sender_stalls
            .iter()
            .map(|&(a, b)| (self.t0 + a, self.t0 + b))
            .find(|&(a, b)| a <= now && now < b)
            .map(|(_, b)| b)
    }

    fn is_complete(&self) -> bool {
        self.rcv.data.committed().iter().all(Option::is_some)
            && self.snd.channels.iter().all(ChannelSender::is_done)
    }

    /// When the first data datagram was sent, from time zero.
    pub(crate) fn first_data(&self) -> Option<Duration> {
        self.first_data.map(|t| t - self.t0)
    }

    /// When a datagram that arrives at `t` reaches the receiver: at once, or behind GRO at the
    /// end of its buffer ([`Scenario::receiver_lumps`]).
    fn lump_end(&self, t: Instant) -> Instant {
        match self.sc.receiver_lumps.filter(|l| !l.is_zero()) {
            Some(lump) => {
                let lumps = (t - self.t0).as_nanos().div_ceil(lump.as_nanos());
                self.t0 + lump * u32::try_from(lumps).unwrap_or(u32::MAX)
            }
            None => t,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let now = self.now;
        let mut next: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if self.rcv_reading {
            let data_in = if self.rcv_on_tcp {
                self.tcp.as_ref()
            } else {
                Some(&self.link)
            };
            consider(
                data_in
                    .and_then(Link::next_delivery)
                    .map(|t| self.lump_end(t)),
            );
            consider(
                self.direct
                    .as_ref()
                    .and_then(Link::next_delivery)
                    .map(|t| self.lump_end(t)),
            );
            consider(self.rcv.stage.as_ref().and_then(RecvStage::next_delivery));
            consider(
                self.rcv
                    .reporter
                    .as_ref()
                    .map(|r| r.builder.interval_start() + r.cadence.every()),
            );
            consider((!self.injected.is_empty()).then_some(now));
            for r in &self.rcv.channels {
                consider(r.next_timeout(now));
            }
            consider(Some(self.rcv.data.poll_timeout()));
        }
        consider(
            self.rate_changes
                .get(self.rate_changes_done)
                .and_then(|&(at, _)| self.t0.checked_add(at)),
        );
        consider(self.direct_opens.filter(|_| self.moved_direct.is_none()));
        consider(self.to_receiver.next_delivery());
        consider(self.to_sender.next_delivery());
        consider(self.feedback.front().map(|&(at, _)| at));
        if let Some(end) = self.sender_stall_end(now).filter(|_| self.snd_sending) {
            consider(Some(end));
        } else if self.snd_sending {
            // Early data that spent its budget waits for the outcome.
            let spent = self.snd.early == Some(0);
            for (s, p) in self.snd.channels.iter().zip(&self.snd.pacers) {
                if s.has_work() && !spent {
                    consider(Some(p.ready_at().unwrap_or(now)));
                }
                consider(s.next_timeout());
            }
            // The machine's timers run in the data phase (the set-up has its own).
            consider(Some(self.snd.data.poll_timeout()).filter(|_| self.snd.early.is_none()));
        }
        if let Some(tick) = self.sc.tick.filter(|t| !t.is_zero()) {
            let ticks = (now - self.t0).as_nanos() / tick.as_nanos() + 1;
            let at = tick.as_nanos() * ticks;
            consider(Some(
                self.t0 + Duration::from_nanos(u64::try_from(at).unwrap_or(u64::MAX)),
            ));
        }
        next
    }

    // ----- receiver -----

    fn receiver_turn(&mut self, now: Instant) -> Result<(), String> {
        self.receiver_datagrams(now)?;
        while let Some(msg) = self.to_receiver.poll(now) {
            let msg = msg.map_err(|e| format!("control frame failed to decode: {e}"))?;
            match self.on_receiver_control(now, msg) {
                Ok(_) => {}
                Err(DataFailure::Rule(DataError::Unexpected(other))) => {
                    return Err(format!("receiver got unexpected {}", other.name()))
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        self.receiver_timers(now).map_err(|e| e.to_string())?;
        self.receiver_outputs(now)
    }

    /// The receiver machine's timers due at `now`: the sender's silence ends its data phase.
    pub(crate) fn receiver_timers(&mut self, now: Instant) -> Result<(), DataFailure> {
        let channels = self.rcv.channels.len() as u16;
        self.rcv.passes += 1;
        let (arrivals, passes) = (&self.rcv.arrivals, self.rcv.passes);
        let seen = |ch: u16| {
            let heard = arrivals.get(usize::from(ch)).is_some_and(|m| m.bytes > 0);
            (heard, passes)
        };
        self.rcv
            .data
            .handle_timeout(now, channels, seen)
            .map_err(DataFailure::Rule)?;
        // `UdpSilent`, if the watch named channels.
        self.receiver_acts(now)
            .map(|_| ())
            .map_err(DataFailure::Runner)
    }

    /// The receiver reads every datagram due at `now` (forged ones first).
    pub(crate) fn receiver_datagrams(&mut self, now: Instant) -> Result<(), String> {
        while let Some(dg) = self.injected.pop_front() {
            self.on_datagram(now, now, &dg)?;
        }
        // Behind GRO, what arrived up to the latest buffer's moment (taken at that moment:
        // [`Pair::lump_end`] is when the receiver is woken for it).
        let upto = match self.sc.receiver_lumps.filter(|l| !l.is_zero()) {
            Some(lump) => {
                let lumps = (now - self.t0).as_nanos() / lump.as_nanos();
                self.t0 + lump * u32::try_from(lumps).unwrap_or(u32::MAX)
            }
            None => now,
        };
        while let Some(dg) = self.data_in().poll(upto) {
            match &mut self.rcv.stage {
                Some(stage) => stage.offer(now, dg),
                None => self.on_datagram(now, now, &dg)?,
            }
        }
        // A direct path, once there, is read beside the relayed one. A channel's first datagram
        // that comes this way is its path change, as the engine's channel threads see one in a
        // new source address.
        while let Some(dg) = self.direct.as_mut().and_then(|d| d.poll(upto)) {
            if let Some(ch) = dg.get(1).map(|&c| usize::from(c)) {
                if ch < self.rcv.channels.len() && !self.rcv_direct.contains(&ch) {
                    self.rcv_direct.push(ch);
                    self.rcv.channels[ch].on_path_change(now);
                }
            }
            match &mut self.rcv.stage {
                Some(stage) => stage.offer(now, dg),
                None => self.on_datagram(now, now, &dg)?,
            }
        }
        while let Some((arrived, dg)) = self.rcv.stage.as_mut().and_then(|s| s.poll(now)) {
            self.on_datagram(now, arrived, &dg)?;
        }
        Ok(())
    }

    /// A control message of the data phase at the receiver, judged by its machine. Returns
    /// true when the sender is done and every file is in place.
    pub(crate) fn on_receiver_control(
        &mut self,
        now: Instant,
        msg: Control,
    ) -> Result<bool, DataFailure> {
        if let Control::BlockHashes { session, blocks } = &msg {
            if *session == self.session {
                self.rcv.values_expected += blocks.len() as u64;
            } else if Some(*session) == self.rcv.superseded {
                self.rcv.values_superseded += blocks.len() as u64;
            }
        }
        self.rcv.data.handle(now, msg).map_err(DataFailure::Rule)?;
        self.receiver_acts(now).map_err(DataFailure::Runner)
    }

    /// The receiver's NACKs, channel completions, report and machine's work due at `now`.
    pub(crate) fn receiver_outputs(&mut self, now: Instant) -> Result<(), String> {
        self.receiver_acts(now)?;
        for ch in 0..self.rcv.channels.len() {
            if let Some(ranges) = self.rcv.channels[ch].poll_nack(now) {
                if self.nack_rng.chance(self.sc.nack_loss) {
                    self.rcv.nacks_dropped += 1;
                } else {
                    let channel = ch as u16;
                    let seq = self.rcv.channels[ch].stats().nacks;
                    let knew_us = self.rcv.admission.knew_us(channel, now);
                    let nack = Control::Nack {
                        channel,
                        seq,
                        ranges,
                        knew_us,
                    };
                    self.send_feedback(now, &nack);
                    self.to_sender.send(now, &nack);
                }
            }
            if self.rcv.channels[ch].poll_done() {
                let channel = ch as u16;
                self.to_sender.send(now, &Control::ChannelDone { channel });
            }
        }
        self.maybe_report(now);
        Ok(())
    }

    /// Sends a `Report` if an interval has passed, built as the engine's receiver builds it.
    fn maybe_report(&mut self, now: Instant) {
        let Some(rep) = self.rcv.reporter.as_ref() else {
            return;
        };
        if now < rep.builder.interval_start() + rep.cadence.every() {
            return;
        }
        let received = self
            .rcv
            .channels
            .iter()
            .map(ChannelReceiver::received_bytes)
            .sum();
        let fill = self
            .rcv
            .stage
            .as_mut()
            .map_or(0, |s| u64::from(s.take_fill_permille()));
        // A disk: the stage is the writer's queue, and its fullest moment waited as long as
        // that much of it takes to drain.
        let (disk_fill, disk_wait_us) = match (self.sc.receiver_is_disk, self.sc.receiver_rate_bps)
        {
            (true, Some(rate)) => (
                fill,
                fill * self.sc.receiver_queue_bytes as u64 * 8 / 1000 * 1_000_000 / rate.max(1),
            ),
            _ => (0, 0),
        };
        let facts = ReportFacts {
            totals: self.rcv.admission.tally(),
            received,
            socket_drops: self.rcv.stage.as_ref().map_or(0, |s| s.drops),
            queue_fill_permille: fill,
            // The simulated receiver runs whenever something is due: never late.
            held_us: disk_wait_us,
            lateness: Duration::ZERO,
            disk_fill_permille: disk_fill,
            // Without a stage it reads each datagram when it arrives: the report's own
            // interval is right. Behind one, by when the bytes arrived, as the engine does.
            arrived_over: match self.rcv.stage {
                Some(_) => {
                    let tick = now.saturating_duration_since(rep.builder.interval_start());
                    let before = std::mem::replace(
                        &mut self.rcv.arrivals_reported,
                        self.rcv.arrivals.clone(),
                    );
                    arrival_interval(&before, &self.rcv.arrivals, tick)
                }
                None => None,
            },
            train_kbps: if self.sc.train_estimates {
                let pool = &mut self.rcv.trains;
                self.rcv.admission.take_train_rates(pool.rates_mut());
                pool.take_kbps()
            } else {
                self.rcv.admission.forget_train_rates();
                0
            },
        };
        let Some(rep) = self.rcv.reporter.as_mut() else {
            return;
        };
        let report = rep.builder.build(now, &facts);
        // The interval the copies judge by is the one this report closed.
        let every = rep.cadence.every();
        if let Some(feedback) = Feedback::of_report(&report) {
            rep.cadence.sent(&feedback);
            self.rcv.reports.push(ReportSample {
                at: now - self.t0,
                received,
                feedback,
            });
        }
        let datagram = self.send_feedback(now, &report);
        let on_tcp = self
            .rcv
            .reporter
            .as_mut()
            .is_some_and(|rep| rep.copies.wanted(now, every, &report, datagram));
        if on_tcp {
            self.to_sender.send(now, &report);
        }
    }

    /// The datagram copy of a report or NACK, with [`Scenario::feedback_copies`]; whether it
    /// left (what the path then does with it is the path's).
    fn send_feedback(&mut self, now: Instant, msg: &Control) -> bool {
        let Some(loss) = self.sc.feedback_copies else {
            return false;
        };
        // A copy longer than a datagram holds goes on the control connection only.
        let fits = hurtle_proto::feedback::encode(msg, self.session, 1).is_some();
        if fits && !self.link.in_blackout(now) && !self.feedback_rng.chance(loss) {
            let delay = self.sc.control_delay.unwrap_or(self.sc.link.delay);
            self.feedback.push_back((now + delay, msg.clone()));
        }
        fits
    }

    /// Takes one datagram read at `now` that arrived at `arrived` (its queueing delay is
    /// measured there, as the engine's receiver measures it at the kernel's arrival stamp).
    fn on_datagram(&mut self, now: Instant, arrived: Instant, dg: &[u8]) -> Result<(), String> {
        let (verdict, payload) = self.rcv.admission.admit_datagram(arrived, &self.layout, dg);
        let counted = match &verdict {
            Admit::Final { channel, .. } => Some(*channel),
            Admit::Data(p) | Admit::Parity { place: p, .. } => Some(p.place.channel),
            Admit::Probe { .. } | Admit::Reject(_) => None,
        };
        if let Some(m) = counted.and_then(|ch| self.rcv.arrivals.get_mut(usize::from(ch))) {
            m.bytes += dg.len() as u64;
            m.at_us = m.at_us.max((arrived - self.t0).as_micros() as u64).max(1);
        }
        let queued = self.rcv.admission.take_peak_queue_delay();
        // With rate control, as the engine's channel threads do: repairs wait behind the
        // queue the datagram met. (Without it this runner has never done so.)
        let rated = self.rcv.reporter.is_some();
        match verdict {
            Admit::Probe { .. } | Admit::Reject(_) => {}
            Admit::Final {
                channel,
                stripe_len,
            } => {
                let r = &mut self.rcv.channels[usize::from(channel)];
                if rated {
                    r.note_queue_delay(now, queued);
                }
                r.on_final(now, stripe_len);
                // Answers the marker again if the channel is already complete.
                r.resend_done();
            }
            Admit::Data(p) => {
                if rated {
                    self.rcv.channels[usize::from(p.place.channel)].note_queue_delay(now, queued);
                }
                self.take_data(now, &p, payload)?;
                // Data after its group's parity (reordered) may be what the parity lacked.
                let ch = usize::from(p.place.channel);
                if let Some(group) = self.rcv.parity[ch].group_at(p.place.pos) {
                    self.try_recover(now, ch, group)?;
                }
            }
            Admit::Parity { place, desc } => {
                let ch = usize::from(place.place.channel);
                if rated {
                    self.rcv.channels[ch].note_queue_delay(now, queued);
                }
                let pos = place.place.pos;
                self.rcv.parity[ch].add(pos, place.file, place.offset, desc, payload);
                self.try_recover(now, ch, pos)?;
            }
        }
        Ok(())
    }

    /// Records data `p` with its bytes `payload` (arrived, or rebuilt from parity).
    fn take_data(&mut self, now: Instant, p: &Placed, payload: &[u8]) -> Result<(), String> {
        let r = &mut self.rcv.channels[usize::from(p.place.channel)];
        let out = r.on_data(
            now,
            p.place.pos,
            p.len,
            p.retransmit,
            p.place.block_stripe.clone(),
        );
        // Like the real receiver: a datagram that brought new bytes is written whole.
        if out.new_bytes > 0 {
            let file = &mut self.rcv.files[p.file as usize];
            let at = p.offset as usize;
            file[at..at + payload.len()].copy_from_slice(payload);
        }
        if out.completes_block {
            let value = block_value_of(&self.layout, &self.rcv.files, p.place.block);
            self.rcv
                .data
                .on_block(p.place.block, value)
                .map_err(|e| e.to_string())?;
            self.receiver_acts(now)?;
        }
        Ok(())
    }

    /// Rebuilds what channel `ch` misses of the group at stripe position `pos` if its parity
    /// suffices, as the engine's receiver does; forgets the group once it is complete.
    fn try_recover(&mut self, now: Instant, ch: usize, pos: u64) -> Result<(), String> {
        let Some(g) = self.rcv.parity[ch].get(pos) else {
            return Ok(());
        };
        let rec = &self.rcv.channels[ch];
        let file = &self.rcv.files[g.file as usize];
        let present = |i: usize| {
            let r = g.desc.piece_range(i);
            rec.has(pos + r.start..pos + r.end)
                .then(|| &file[(g.offset + r.start) as usize..(g.offset + r.end) as usize])
        };
        let Some(rebuilt) = fec::recover(&g.desc, present, &g.shards) else {
            return Ok(());
        };
        let (desc, file_id, offset) = (g.desc, g.file, g.offset);
        self.rcv.parity[ch].remove(pos);
        for (i, bytes) in rebuilt {
            let r = desc.piece_range(i);
            let len = r.end - r.start;
            let place = self
                .layout
                .place(file_id, offset + r.start, len)
                .map_err(|e| format!("a rebuilt piece does not place: {e}"))?;
            let p = Placed {
                file: file_id,
                offset: offset + r.start,
                len,
                retransmit: false,
                place,
            };
            self.recovered += 1;
            self.take_data(now, &p, &bytes)?;
        }
        Ok(())
    }

    // ----- sender -----

    fn sender_turn(&mut self, now: Instant) -> Result<(), String> {
        while self.feedback.front().is_some_and(|&(at, _)| at <= now) {
            if let Some((_, msg)) = self.feedback.pop_front() {
                self.on_sender_control(now, msg)
                    .map_err(|e| e.to_string())?;
            }
        }
        while let Some(msg) = self.to_sender.poll(now) {
            let msg = msg.map_err(|e| format!("control frame failed to decode: {e}"))?;
            match self.on_sender_control(now, msg) {
                Ok(()) => {}
                Err(DataFailure::Rule(DataError::Unexpected(other))) => {
                    return Err(format!("sender got unexpected {}", other.name()))
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        self.sender_timers(now).map_err(|e| e.to_string())?;
        self.sender_data(now)
    }

    /// The sender machine's timers due at `now`, in the data phase (the set-up has its own):
    /// keep-alives, the controller's check for silence between reports every report
    /// interval, and the stall.
    pub(crate) fn sender_timers(&mut self, now: Instant) -> Result<(), DataFailure> {
        if self.snd.early.is_some() || now < self.snd.data.poll_timeout() {
            return Ok(());
        }
        self.snd
            .data
            .handle_timeout(now)
            .map_err(DataFailure::Rule)?;
        self.sender_acts(now).map_err(DataFailure::Runner)
    }

    /// A control message of the data phase at the sender (by either path: the machine takes
    /// the first copy of each report and NACK), judged by its machine.
    pub(crate) fn on_sender_control(
        &mut self,
        now: Instant,
        msg: Control,
    ) -> Result<(), DataFailure> {
        self.snd.data.handle(now, msg).map_err(DataFailure::Rule)?;
        self.sender_acts(now).map_err(DataFailure::Runner)
    }

    /// Carries out what the sender's machine decided: NACKs and completions to the channels,
    /// new rates to the pacers, its messages to the receiver.
    fn sender_acts(&mut self, now: Instant) -> Result<(), String> {
        while let Some(ev) = self.snd.data.poll_event() {
            match ev {
                SenderDataEvent::Channel { channel, cmd } => {
                    let sender = self
                        .snd
                        .channels
                        .get_mut(usize::from(channel))
                        .ok_or("a command for an unknown channel")?;
                    match cmd {
                        ChannelCmd::Nack { ranges, knew_us } => {
                            let knew = hurtle_proto::wire::sent_at(self.t0, now, knew_us);
                            sender.on_nack(&ranges, now, knew);
                        }
                        ChannelCmd::Done => sender.on_channel_done(),
                    }
                }
                SenderDataEvent::Report { change, .. } => {
                    if let Some(catch_up) = self.snd.data.controller().map(|c| c.catch_up()) {
                        for p in &mut self.snd.pacers {
                            p.set_max_owed(catch_up);
                        }
                    }
                    self.set_pacers(now, change);
                }
                SenderDataEvent::Silence { change } => self.set_pacers(now, Some(change)),
                // This runner does not probe, and its data path is UDP alone.
                SenderDataEvent::FileConfirmed { .. } | SenderDataEvent::ProbeAck { .. } => {}
                SenderDataEvent::MoveToTcp { silent, .. } => {
                    self.sender_moves_to_tcp(now, &silent)?
                }
            }
        }
        while let Some(msg) = self.snd.data.poll_transmit() {
            if let Control::BlockHashes { blocks, .. } = &msg {
                self.snd.hash_messages += 1;
                self.snd.values_sent += blocks.len() as u64;
            }
            self.to_receiver.send(now, &msg);
        }
        Ok(())
    }

    /// The sender moves every channel to [`Scenario::fallback`]'s path at `now`, as the
    /// engine's does: `Fallback` to the receiver, what the silent channels sent queued again
    /// (nothing of it arrived), the pacers at the path's rate from now on.
    fn sender_moves_to_tcp(&mut self, now: Instant, silent: &[u16]) -> Result<(), String> {
        let rate = match &self.tcp {
            Some(tcp) => tcp.config().rate_bps,
            None => return Err("a move to TCP in a scenario without a TCP path".into()),
        };
        self.to_receiver.send(now, &Control::Fallback);
        for &ch in silent {
            if let Some(c) = self.snd.channels.get_mut(usize::from(ch)) {
                c.on_link_lost();
            }
        }
        for c in &mut self.snd.channels {
            c.set_lossless();
        }
        self.snd_on_tcp = true;
        self.moved_to_tcp = Some(now);
        if let Some(bps) = rate {
            let per_channel = (bps / self.snd.pacers.len().max(1) as u64).max(100_000);
            for p in &mut self.snd.pacers {
                p.set_rate(per_channel, now);
            }
        }
        self.snd.data.moved_to_tcp(now, None);
        Ok(())
    }

    /// Sets every pacer to the controller's new rate, if it changed, and notes the change.
    fn set_pacers(&mut self, now: Instant, change: Option<hurtle_proto::rate::RateChange>) {
        let Some(change) = change else {
            return;
        };
        let per_channel = (change.rate_bps / self.snd.pacers.len() as u64).max(100_000);
        for p in &mut self.snd.pacers {
            p.set_rate(per_channel, now);
        }
        self.snd.rate_timeline.push(RatePoint {
            at: now - self.t0,
            rate_bps: change.rate_bps,
            reason: change.reason,
        });
    }

    /// The sender's channels send what their pacers allow at `now`, and the block values read.
    pub(crate) fn sender_data(&mut self, now: Instant) -> Result<(), String> {
        if self.moved_direct.is_none() && self.direct_opens.is_some_and(|t| now >= t) {
            // A punched path: the channels send there from now on, nothing again.
            self.moved_direct = Some(now);
        }
        if self.sender_stall_end(now).is_some() {
            return Ok(());
        }
        for ch in 0..self.snd.channels.len() {
            while self.snd.pacers[ch].can_send(now) {
                // The tail's new data goes in pieces that leave room for a parity descriptor.
                let piece = self.tail_piece(ch);
                let payload = u64::from(piece.unwrap_or(self.sc.payload));
                // While startup lasts, the controller's train at least, as the engine sends.
                let train = match self.snd.data.controller() {
                    Some(c) if self.sc.startup_trains => c.train_bytes() / payload,
                    _ => 0,
                };
                let max_run = payload * u64::from(self.sc.run_datagrams).max(train);
                // Early data: runs are cut to the budget left, and stop when it is spent.
                let max_run = match self.snd.early {
                    Some(0) => {
                        self.snd.pacers[ch].idle();
                        break;
                    }
                    Some(left) => max_run.min(left),
                    None => max_run,
                };
                let snd = &mut self.snd;
                let Some(run) = snd.channels[ch].poll_run(&snd.layout, max_run, now) else {
                    // Nothing to send: the time until there is is not owed.
                    snd.pacers[ch].idle();
                    break;
                };
                if run.kind == RunKind::Held {
                    // Hashed, not sent: the receiver checks its own copy against the value.
                    self.hash_block(now, ch as u16, (run.pos, run.len), true)?;
                    continue;
                }
                if let Some(left) = &mut self.snd.early {
                    *left = left.saturating_sub(run.len);
                }
                let cut = piece.unwrap_or(self.sc.payload);
                let mut bytes = self.send_run(now, ch as u16, run.pos, run.len, run.kind, cut)?;
                if let (Some(piece), RunKind::New) = (piece, run.kind) {
                    bytes += self.group_sent(now, ch, run.pos, run.len, piece)?;
                }
                self.snd.pacers[ch].on_sent(now, bytes);
            }
            if self.snd.channels[ch].poll_final(now) {
                let h = Header {
                    kind: Kind::Final,
                    flags: 0,
                    channel: ch as u16,
                    session: self.snd.session,
                    packet: self.next_packet(ch),
                    file: 0,
                    offset: self.snd.channels[ch].stripe_len(),
                    len: 0,
                    sent_us: self.sent_us(now),
                };
                let mut dg = vec![0u8; HEADER_LEN];
                h.encode(&mut dg);
                self.snd.pacers[ch].on_sent(now, dg.len() as u64);
                if self.final_rng.chance(self.sc.final_loss) {
                    self.finals_dropped += 1;
                } else {
                    self.data_out().send(now, dg);
                }
            }
        }
        let sent_all = |c: &ChannelSender| c.new_remaining() == 0;
        if self.steady_until.is_none() && self.snd.channels.iter().any(sent_all) {
            self.steady_until = Some(now);
        }
        if self.new_data_sent.is_none() && self.snd.channels.iter().all(sent_all) {
            self.new_data_sent = Some(now);
        }
        // The values of the blocks read for the first time go at once, early data's too.
        self.sender_acts(now)
    }

    /// Tells channel `ch`'s sender whether it is in its tail ([`fec::in_tail`]: its repairs
    /// go twice there), as the engine does, and returns the piece size new data is cut at
    /// there: `None` outside it (or without [`Scenario::fec`], or where the path lost nothing
    /// so far: [`hurtle_proto::fec`]).
    fn tail_piece(&mut self, ch: usize) -> Option<u16> {
        let rtt = self
            .sc
            .rate
            .as_ref()
            .map_or(self.sc.link.delay * 2, |r| r.rtt);
        let left = self.snd.channels[ch].new_remaining();
        let tail = fec::in_tail(left, self.snd.pacers[ch].rate(), rtt);
        self.snd.channels[ch].set_tail(tail);
        // No parity over TCP, which loses nothing, nor where the path lost nothing so far (as
        // the engine's).
        let lost_nothing = self
            .snd
            .data
            .controller()
            .is_some_and(RateController::lost_nothing);
        (self.sc.fec && tail && !self.snd_on_tcp && !lost_nothing)
            .then(|| fec::piece_size(self.sc.payload))
            .filter(|&p| p >= 2)
    }

    /// New tail data `pos..pos + len` of channel `ch` went out in pieces of `piece`: sends the
    /// parity of the groups that closes. Returns the datagram bytes sent.
    fn group_sent(
        &mut self,
        now: Instant,
        ch: usize,
        pos: u64,
        len: u64,
        piece: u16,
    ) -> Result<u64, String> {
        let span = self
            .snd
            .layout
            .resolve(ch as u16, pos)
            .ok_or_else(|| format!("run at stripe {pos} of channel {ch} does not resolve"))?;
        let max = fec::group_pieces(self.snd.pacers[ch].rate(), piece);
        let tail_len = self.snd.fec[ch].tail_len(self.snd.channels[ch].new_remaining() + len);
        let groups = self.snd.fec[ch].on_sent(pos, len, piece, pos + span.to_block_end, max);
        let loss = self
            .snd
            .data
            .controller()
            .and_then(RateController::random_loss)
            .unwrap_or(fec::DEFAULT_LOSS);
        let mut sent = 0;
        for g in groups {
            let span = self
                .snd
                .layout
                .resolve(ch as u16, g.pos)
                .ok_or("a group outside the layout")?;
            let file = &self.snd.files[span.file as usize];
            let bytes = &file[span.offset as usize..(span.offset + g.len) as usize];
            let failure = fec::group_failure(g.len, tail_len);
            let count = fec::parity_count(bytes.len().div_ceil(usize::from(piece)), loss, failure);
            let shards = fec::encode(bytes, piece, count);
            for (j, shard) in shards.iter().enumerate() {
                let desc = ParityDesc {
                    len: g.len as u32,
                    piece,
                    index: j as u8,
                    count: count as u8,
                };
                let h = Header {
                    kind: Kind::Parity,
                    flags: 0,
                    channel: ch as u16,
                    session: self.snd.session,
                    packet: self.next_packet(ch),
                    file: span.file,
                    offset: span.offset,
                    len: 0,
                    sent_us: self.sent_us(now),
                };
                let mut dg = vec![0u8; HEADER_LEN + fec::DESC_LEN + shard.len()];
                h.encode(&mut dg);
                desc.encode(&mut dg[HEADER_LEN..]);
                dg[HEADER_LEN + fec::DESC_LEN..].copy_from_slice(shard);
                sent += dg.len() as u64;
                self.data_out().send(now, dg);
                self.parity_sent += 1;
            }
        }
        Ok(sent)
    }

    /// Cuts one run into datagrams of `payload` bytes and sends them; returns the datagram
    /// bytes sent.
    fn send_run(
        &mut self,
        now: Instant,
        ch: u16,
        pos: u64,
        len: u64,
        kind: RunKind,
        payload: u16,
    ) -> Result<u64, String> {
        let span = self
            .snd
            .layout
            .resolve(ch, pos)
            .ok_or_else(|| format!("run at stripe {pos} of channel {ch} does not resolve"))?;
        self.hash_block(now, ch, (pos, len), false)?;
        let payload = u64::from(payload);
        let flags = if kind == RunKind::Repair {
            FLAG_RETRANSMIT
        } else {
            0
        };
        let mut sent = 0;
        let mut done = 0;
        while done < len {
            let n = payload.min(len - done);
            let offset = span.offset + done;
            let h = Header {
                kind: Kind::Data,
                flags,
                channel: ch,
                session: self.snd.session,
                packet: self.next_packet(usize::from(ch)),
                file: span.file,
                offset,
                len: n as u16,
                sent_us: self.sent_us(now),
            };
            let mut dg = vec![0u8; HEADER_LEN + n as usize];
            h.encode(&mut dg);
            let src = &self.snd.files[span.file as usize][offset as usize..(offset + n) as usize];
            dg[HEADER_LEN..].copy_from_slice(src);
            if self.header_rng.chance(self.sc.header_corrupt) {
                let bit = self.header_rng.below(HEADER_LEN as u64 * 8);
                dg[(bit / 8) as usize] ^= 1 << (bit % 8);
                self.header_corrupted += 1;
            }
            sent += dg.len() as u64;
            self.data_out().send(now, dg);
            self.datagrams_sent += 1;
            self.first_data.get_or_insert(now);
            self.datagrams_by_channel[usize::from(ch)] += 1;
            self.file_payload[span.file as usize] += n;
            if kind == RunKind::Repair {
                self.datagrams_resent += 1;
            }
            self.snd.genuine += 1;
            if self.sc.hostile_every > 0 && self.snd.genuine.is_multiple_of(self.sc.hostile_every) {
                let forgery = FORGERIES[(self.injected_total % FORGERIES.len() as u64) as usize];
                let dg = self.forge(forgery, now);
                self.injected.push_back(dg);
                self.injected_total += 1;
            }
            done += n;
        }
        Ok(sent)
    }

    /// On the first read of the block that run `pos`+`len` of channel `ch` lies in: hashes it
    /// and queues its value for the receiver.
    fn hash_block(
        &mut self,
        now: Instant,
        ch: u16,
        (pos, len): (u64, u64),
        held: bool,
    ) -> Result<(), String> {
        let span = self
            .snd
            .layout
            .resolve(ch, pos)
            .ok_or_else(|| format!("run at stripe {pos} of channel {ch} does not resolve"))?;
        if span.to_block_end < len {
            return Err(format!("run {pos}+{len} of channel {ch} crosses its block"));
        }
        if !self.snd.hashed[span.block as usize] {
            self.snd.hashed[span.block as usize] = true;
            let value = block_value_of(&self.snd.layout, &self.snd.files, span.block);
            // This runner's source cannot change under it: nothing to check at a file's end.
            let _ = self.snd.data.on_block_value(now, span.block, value, held);
        }
        Ok(())
    }

    /// The next packet number of channel `ch`: 1, 2, 3, ... as the engine's sender numbers
    /// them (admission counts the span from 0).
    fn next_packet(&mut self, ch: usize) -> u64 {
        self.snd.packet_numbers[ch] += 1;
        self.snd.packet_numbers[ch]
    }

    fn sent_us(&self, now: Instant) -> u32 {
        (now - self.t0).as_micros() as u32
    }

    /// A forged datagram of the given kind. Its payload is garbage, so if the receiver accepted
    /// it the transfer would be corrupted (and a block would fail verification).
    fn forge(&self, forgery: Forgery, now: Instant) -> Vec<u8> {
        let file0 = self.layout.file_size(0).unwrap_or(0);
        let payload = u64::from(self.sc.payload).min(self.layout.block_size());
        let mut h = Header {
            kind: Kind::Data,
            flags: 0,
            channel: 0,
            session: self.session,
            packet: MAX_PACKET - self.injected_total,
            file: 0,
            offset: 0,
            len: payload.min(file0.max(1)) as u16,
            sent_us: self.sent_us(now),
        };
        match forgery {
            Forgery::WrongSession => h.session = !self.session,
            Forgery::PastEndOfFile => h.offset = file0,
            Forgery::CrossesBlock => {
                if file0 > self.layout.block_size() {
                    h.offset = self.layout.block_size() - 8;
                    h.len = 16;
                } else {
                    h.offset = u64::MAX - 4;
                    h.len = 16;
                }
            }
            Forgery::NoSuchFile => h.file = self.layout.file_count() as u32 + 7,
            Forgery::WrongChannel => {
                // File 0's first block is on channel 0; claim another channel (or a channel
                // that does not exist when there is only one).
                h.channel = if self.layout.channels() > 1 { 1 } else { 255 };
            }
            Forgery::WrongFinal => {
                h.kind = Kind::Final;
                h.offset = self.layout.stripe_len(0) + 1;
                h.len = 0;
            }
            Forgery::Probe => h.kind = Kind::Probe,
            Forgery::BadKind | Forgery::Truncated => {}
        }
        let mut dg = vec![0xA5u8; HEADER_LEN + usize::from(h.len)];
        h.encode(&mut dg);
        match forgery {
            Forgery::BadKind => dg[0] = 9,
            Forgery::Truncated => dg.truncate(HEADER_LEN / 2),
            _ => {}
        }
        dg
    }

    // ----- end of run -----

    pub(crate) fn check_exact(&self) -> Result<(), Failure> {
        for (i, (src, got)) in self.snd.files.iter().zip(&self.rcv.files).enumerate() {
            if src != got {
                let first = src
                    .iter()
                    .zip(got)
                    .position(|(a, b)| a != b)
                    .unwrap_or(src.len().min(got.len()));
                return Err(self.failure(format!(
                    "file {i} differs from the source (first at byte {first}) although verified"
                )));
            }
            let want = *blake3::hash(src).as_bytes();
            if self.rcv.data.committed().get(i) != Some(&Some(want)) {
                return Err(
                    self.failure(format!("file {i}: verified hash is not blake3 of the file"))
                );
            }
        }
        Ok(())
    }

    pub(crate) fn outcome(&self) -> Outcome {
        let end = self.finished.unwrap_or(self.now);
        let s = self.snd.channels.iter().map(ChannelSender::stats);
        let r = self.rcv.channels.iter().map(ChannelReceiver::stats);
        Outcome {
            moved_to_tcp: self.moved_to_tcp.map(|t| t - self.t0),
            moved_direct: self.moved_direct.map(|t| t - self.t0),
            duration: end - self.t0,
            steady_until: self.steady_until.unwrap_or(end) - self.t0,
            new_data_sent: self.new_data_sent.unwrap_or(end) - self.t0,
            steps: self.steps,
            bytes: self.snd.layout.total_bytes(),
            datagrams_sent: self.datagrams_sent,
            datagrams_resent: self.datagrams_resent,
            new_bytes: s.clone().map(|s| s.new_bytes).sum(),
            held_bytes: s.clone().map(|s| s.held_bytes).sum(),
            repair_bytes: s.clone().map(|s| s.repair_bytes).sum(),
            finals_sent: s.map(|s| s.finals).sum(),
            finals_dropped: self.finals_dropped,
            nacks_sent: r.clone().map(|r| r.nacks).sum(),
            nacks_dropped: self.rcv.nacks_dropped,
            duplicate_bytes: r.map(|r| r.duplicate_bytes).sum(),
            blocks_rejected: self.rcv.blocks_rejected,
            rejected: self.rcv.admission.rejected(),
            injected: self.injected_total,
            header_corrupted: self.header_corrupted,
            hash_messages: self.snd.hash_messages,
            values_expected: self.rcv.values_expected,
            early_values: self.rcv.early_values,
            values_superseded: self.rcv.values_superseded,
            link: *self.link.stats(),
            rate_timeline: self.snd.rate_timeline.clone(),
            final_rate_bps: self.snd.rate_timeline.last().map_or(0, |p| p.rate_bps),
            outages: self
                .snd
                .data
                .controller()
                .map_or_else(Outages::default, |c| c.outages()),
            reports: self.rcv.reports.clone(),
            socket_drops: self.rcv.stage.as_ref().map_or(0, |s| s.drops),
            receiver_queue_max: self.rcv.stage.as_ref().map_or(0, |s| s.max_waiting),
            first_data: self.first_data.map(|t| t - self.t0),
            datagrams_by_channel: self.datagrams_by_channel.clone(),
            file_payload_bytes: self.file_payload.clone(),
            parity_sent: self.parity_sent,
            recovered: self.recovered,
        }
    }

    pub(crate) fn failure(&self, reason: String) -> Failure {
        use std::fmt::Write;
        let mut state = String::new();
        let _ = writeln!(
            state,
            "  steps {}, link in flight {}, control in flight {} -> receiver / {} -> sender, \
             verifier waiting {}, files verified {}/{}, confirmed {}/{}",
            self.steps,
            self.link.in_flight(),
            self.to_receiver.in_flight(),
            self.to_sender.in_flight(),
            self.rcv.data.waiting(),
            self.rcv
                .data
                .committed()
                .iter()
                .filter(|h| h.is_some())
                .count(),
            self.rcv.data.committed().len(),
            self.snd.data.confirmed(),
            self.snd.layout.file_count(),
        );
        for (s, r) in self.snd.channels.iter().zip(&self.rcv.channels) {
            let _ = writeln!(
                state,
                "  channel {}: sender new_remaining {} repair_pending {} has_work {} done {} \
                 next_timeout {:?} {:?}; receiver {}/{} complete {} {:?}",
                s.channel(),
                s.new_remaining(),
                s.repair_pending(),
                s.has_work(),
                s.is_done(),
                s.next_timeout()
                    .map(|t| t.saturating_duration_since(self.t0)),
                s.stats(),
                r.received_bytes(),
                self.layout.stripe_len(r.channel()),
                r.is_complete(),
                r.stats(),
            );
        }
        let _ = write!(state, "  so far: {}", self.outcome());
        Failure {
            at: self.now - self.t0,
            reason,
            state,
        }
    }
}

/// The value of `block` computed over `files` (either side's copy).
fn block_value_of(layout: &Layout, files: &[Vec<u8>], block: u64) -> BlockValue {
    let (file, range) = layout
        .block_file_range(block)
        .expect("block of the layout has a file range");
    let blocks = layout.blocks_of(file);
    block_value(
        &files[file as usize][range.start as usize..range.end as usize],
        block - blocks.start,
        layout.block_size(),
        blocks.end - blocks.start,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_bytes_are_seeded_and_sized() {
        assert_eq!(file_bytes(1, 0, 13).len(), 13);
        assert_eq!(file_bytes(1, 0, 13), file_bytes(1, 0, 13));
        assert_ne!(file_bytes(1, 0, 64), file_bytes(1, 1, 64));
        assert_ne!(file_bytes(1, 0, 64), file_bytes(2, 0, 64));
        assert!(file_bytes(1, 0, 0).is_empty());
    }

    #[test]
    fn receiver_stage_is_a_drop_tail_buffer_drained_at_its_rate() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // 8 Mbit/s: 1000 bytes take 1 ms; room for two waiting.
        let mut stage = RecvStage::new(8_000_000, 2000, t0, &[]);
        for i in 0..5u8 {
            stage.offer(t0, vec![i; 1000]);
        }
        assert_eq!((stage.drops, stage.max_waiting), (2, 2000));
        let mut got = Vec::new();
        while let Some(at) = stage.next_delivery() {
            got.push((at - t0, stage.poll(at).unwrap().1[0]));
        }
        assert_eq!(got, vec![(ms(1), 0), (ms(2), 1), (ms(3), 2)]);
        // Drained: the next one is read at once.
        stage.offer(t0 + ms(10), vec![9; 1000]);
        assert_eq!(stage.next_delivery(), Some(t0 + ms(11)));
        assert_eq!(stage.drops, 2);
    }

    #[test]
    fn a_clean_small_run_is_exact_and_repeatable() {
        let sc = Scenario {
            files: vec![100_000, 0, 5_000],
            block_size: 4096,
            channels: 3,
            ..Scenario::default()
        };
        let a = sc.run().unwrap();
        let b = sc.run().unwrap();
        assert_eq!(a.duration, b.duration);
        assert_eq!(a.steps, b.steps);
        assert_eq!(a.repair_bytes, 0);
        assert_eq!(a.new_bytes, 105_000);
    }

    #[test]
    fn every_forgery_is_rejected_by_the_receiver() {
        let sc = Scenario {
            files: vec![3 * 16384 + 5, 10],
            channels: 2,
            hostile_every: 1,
            ..Scenario::default()
        };
        let mut pair = Pair::new(sc).unwrap();
        for (i, &f) in FORGERIES.iter().enumerate() {
            let before = pair.rcv.admission.rejected().total();
            let dg = pair.forge(f, pair.now);
            pair.on_datagram(pair.now, pair.now, &dg).unwrap();
            assert_eq!(
                pair.rcv.admission.rejected().total(),
                before + 1,
                "forgery {i}: {f:?}"
            );
        }
        let r = pair.rcv.admission.rejected();
        assert_eq!(
            (
                r.malformed,
                r.session,
                r.kind,
                r.layout,
                r.channel,
                r.final_len
            ),
            (2, 1, 1, 3, 1, 1)
        );
    }
}
