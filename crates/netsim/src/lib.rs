//! A deterministic, in-process simulated network for testing hurtle end to end.
//!
//! Everything here runs on caller-supplied [`std::time::Instant`]s and seeded randomness: no
//! sockets, no threads, no real clock, so a scenario replays exactly for a given seed.
//!
//! - [`link`]: the network model: one direction of an impaired path ([`Link`]) with delay,
//!   jitter, loss, duplication, reordering, corruption, a rate-limited drop-tail bottleneck, an
//!   MTU and blackout windows, plus [`Duplex`] for both directions.
//! - [`pair`]: the scenario runner: hurtle's channel senders, channel receivers and verifier
//!   driven against each other over a [`Link`] and a simulated control connection on a virtual
//!   clock ([`Scenario`], [`Pair`], [`Outcome`]), at a fixed rate or under hurtle's rate
//!   controller fed by the receiver's reports, optionally with a slow receiving host and a path
//!   whose capacity changes mid-run. The scenario suites in `tests/scenarios.rs` and
//!   `tests/rate_control.rs` are built on it.

pub mod link;
pub mod pair;

pub use link::{Duplex, Link, LinkConfig, LinkStats};
pub use pair::{Failure, Outcome, Pair, RatePoint, Rejected, ReportSample, Scenario};
