//! hurtle's protocol core. It is sans-IO: it opens no socket or file, reads no clock and spawns
//! no thread. Time comes in as an argument; what to send comes out as values. That is what lets
//! `hurtle-netsim` run a sender against a receiver at 20% loss over millions of datagrams in a
//! second, deterministically, and lets the drivers in `hurtle-engine` stay thin.
//!
//! | module | owns |
//! |---|---|
//! | [`wire`] | the datagram header and the control messages, and their encodings |
//! | [`ranges`] | [`RangeSet`], the set of byte ranges behind all loss bookkeeping |
//! | [`layout`] | which channel carries which bytes of which file |
//! | [`probe`] | which payload the path carries, and whether UDP gets through (the sender's probing, the receiver's [`probe::SilenceWatch`]), found beside the data |
//! | [`punch`] | hole punching: two peers behind NATs finding a direct UDP path from the candidates the relay gave them, authenticated by a session key |
//! | [`channel_send`] | one channel's sender: new data, repairs within a bounded share, final marker; pacing |
//! | [`channel_recv`] | one channel's receiver: what arrived, gaps, NACKs and their retries |
//! | [`fec`] | Reed-Solomon parity for the tail of a channel's data, and rebuilding from it |
//! | [`feedback`] | the receiver's reports and NACKs as datagrams beside the control connection, and the sender's filter of their copies |
//! | [`secure`] | the key agreement from a code or key, and the sealing of every control frame and datagram |
//! | [`guesses`] | a code's budget of guesses: each charged before it is answered, given back only when proven |
//! | [`session`] | a session's set-up (hello, manifest, decisions, skips) and its data phase and finish ([`session::data`]), a state machine per side for each |
//! | [`admit`] | the receiver's checks of each datagram, their verdict and counts, and the rate report built from the counts |
//! | [`rate`] | the sender's rate controller: receiver feedback in, pacing rate out |
//! | [`hash`] | BLAKE3 of blocks, and each file's real BLAKE3 from its blocks |
//! | [`verify`] | which blocks and files are proven, and what to fetch again |
//!
//! # A session, in order
//!
//! Steps 1 and 2 are the [`session`] machines ([`session::SenderSetup`],
//! [`session::ReceiverSetup`]); the data phase and the finish are
//! [`session::data::SenderData`] and [`session::data::ReceiverData`], with the per-channel
//! machines below on the channels' threads.
//!
//! 1. Sender -> `Agree` and, in the clear behind it, `Hello` (magic, version, channels offered,
//!    payload, block size, session id); receiver -> `Agree` (a try of its code charged first:
//!    [`guesses`]) and, sealed behind it, `HelloAck` (the UDP ports of sockets it opened ahead
//!    of any connection; their count is the channel count). One round trip after the connect
//!    the sender has the keys and the ports: it sends the `Manifest` parts, whose first, sealed,
//!    proves it holds the keys, and data at once under the provisional outcome (every file
//!    whole: [`session::Agreed::provisional`]), within a budget. Data leaves two round trips
//!    after the sender's connect (three when the receiver's sockets opened ahead are taken:
//!    it then sends `HelloAck`, with sockets opened for the sender, once the key is proven).
//! 2. Receiver -> `ManifestReply` parts (per entry: send, refuse, already
//!    have it, or resume: these blocks are here from an interrupted transfer); sender -> `Skip`
//!    (the files it will not send) if the receiver offered any hashes. Both build the same
//!    [`Layout`] from the accepted files, and both `hold` the resumed blocks: the sender
//!    hashes them without sending them. When every file is sent whole the early data counts;
//!    otherwise the data phase has the next session id and the sender starts it again.
//! 3. From `HelloAck` on, sender -> `Probe` datagrams of every candidate size on every channel;
//!    receiver -> `ProbeAck`. They run beside the data ([`probe::PayloadProbe`]): data starts
//!    at [`wire::DEFAULT_PAYLOAD`] and moves to another size when probing settles. With `--transport auto` the
//!    receiver also offers a TCP data port and the sender dials it at once; if nothing
//!    arrives on a channel within [`probe::SILENT_AFTER`] (three round trips on a longer path)
//!    of the receiver's data phase,
//!    receiver -> `UdpSilent`, sender -> `Fallback`, and every channel goes on over its TCP
//!    connection.
//! 4. Data: each channel's [`ChannelSender`] emits runs; the receiver checks each datagram with
//!    an [`Admission`] (one per socket), the channel's [`ChannelReceiver`] records what was
//!    admitted and sends `Nack`s, and a [`ReportBuilder`] turns the admission counts into a
//!    `Report` every interval; the sender sends `BlockHashes` as it reads blocks. In each
//!    channel's tail, Reed-Solomon parity follows its groups of new data, and the receiver
//!    rebuilds what it can from it instead of asking ([`fec`]).
//! 5. The receiver verifies each block with the [`Verifier`], syncs and renames finished files
//!    and sends `FileDone` with each file's hash; `ChannelDone` answers each final marker.
//! 6. When every file is confirmed with a matching hash, the sender sends `Done`.

#![warn(missing_docs)]

pub mod admit;
pub mod channel_recv;
pub mod channel_send;
pub mod fec;
pub mod feedback;
pub mod guesses;
pub mod hash;
pub mod layout;
pub mod probe;
pub mod punch;
pub mod ranges;
pub mod rate;
pub mod secure;
pub mod session;
pub mod verify;
pub mod wire;

pub use admit::{Admission, Admit, ReportBuilder};
pub use channel_recv::{ChannelReceiver, RecvConfig};
pub use channel_send::{ChannelSender, Pacer, Run, RunKind, SendConfig};
pub use layout::Layout;
pub use ranges::RangeSet;
pub use rate::{Feedback, RateConfig, RateController, RateMode};
pub use verify::{BlockTable, Verdict, Verifier};
