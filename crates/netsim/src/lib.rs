//! A deterministic, in-process simulated network for testing hurtle end to end.
//!
//! Everything here runs on caller-supplied [`std::time::Instant`]s and seeded randomness: no
//! sockets, no threads, no real clock, so a scenario replays exactly for a given seed.
//!
//! - [`link`]: the network model: one direction of an impaired path ([`Link`]) with delay,
//!   jitter, loss, duplication, reordering, corruption, a rate-limited drop-tail bottleneck, an
//!   MTU and blackout windows, plus [`Duplex`] for both directions.
//! - [`control`]: the modelled control connection: one direction of the TCP control stream,
//!   reliable and in order, delayed, stalled by blackouts (optionally with TCP's backed-off
//!   retransmission timer), really framed, and the faults that can be applied to it
//!   ([`Fault`]). It imports neither of the two modules below, which both run over it.
//! - [`pair`]: the scenario runner: hurtle's channel senders, channel receivers and verifier
//!   driven against each other over a [`Link`] and the simulated control connection on a
//!   virtual clock ([`Scenario`], [`Pair`], [`Outcome`]), at a fixed rate or under hurtle's rate
//!   controller fed by the receiver's reports, optionally with a slow receiving host and a path
//!   whose capacity changes mid-run. The scenario suites in `tests/scenarios.rs` and
//!   `tests/rate_control.rs` are built on it. A plain [`Scenario`] starts at the data phase:
//!   both sides share one layout at time zero.
//! - [`whole_session`]: whole sessions: `hurtle-proto`'s set-up machines (hello, manifest, the
//!   receiver's decisions from its file system given as data, the sender's hashes, skips) over
//!   the simulated control connection on virtual time, the sender's early data under its
//!   provisional outcome from the `HelloAck` on, then the data phase of a [`Pair`] from what
//!   each side agreed ([`SessionScenario`], [`Session`], [`SessionOutcome`]), with the virtual
//!   time of each phase, hostile or out-of-order control messages ([`ControlFault`]) and each
//!   side's typed end ([`SideError`]). The suite in `tests/sessions.rs` is built on it.
//! - [`nat`]: NATs of each kind RFC 4787 names (mapping per socket or per destination;
//!   filtering by nothing, address, or address and port), and [`punch`]: two peers behind
//!   them finding a direct path with `hurtle-proto`'s hole punching after learning their
//!   addresses from a relay ([`punch::PunchScenario`]). The suite in `tests/punch.rs` is built
//!   on them.
//!
//! Not simulated: the TCP connect, the key agreement and sealing before and around the set-up
//! (a session's time zero is the sender's `Agree` and hello, one round trip after its
//! connect), probing of payload sizes, and parallel TCP data (a second path that the channels
//! may move to stands for it: [`Scenario::fallback`]). A session's data phase does not yet run
//! through NATs: punching is run on its own.

pub mod control;
pub mod link;
pub mod nat;
pub mod pair;
pub mod punch;
pub mod whole_session;

pub use control::Fault;
pub use link::{Duplex, Link, LinkConfig, LinkStats};
pub use pair::{EarlySent, Failure, Outcome, Pair, RatePoint, Rejected, ReportSample, Scenario};
pub use whole_session::{
    ControlFault, Disk, EarlyData, End, FileEnd, FileState, OnDisk, PartFile, PhaseTimes, Session,
    SessionOutcome, SessionScenario, Side, SideEnd, SideError, SimEntry, SimFile,
};
