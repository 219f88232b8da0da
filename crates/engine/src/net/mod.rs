//! The network: the control connection, the data channels' links and sockets, and how the
//! sender dials. Nothing here knows a session: these are the pipes that the session loops and
//! the channel threads of both sides use.
//!
//! - [`control`]: the TCP control connection (sealed framed messages, reader and writer
//!   threads).
//! - [`channel_link`]: a channel's link, UDP datagrams or a TCP connection of frames (parallel TCP),
//!   sealed on the way out and opened on the way in.
//! - [`udp`]: batched UDP data channels (GSO sends and `sendmmsg` written here; GRO and
//!   `recvmmsg` via quinn-udp).
//! - [`dial`]: how the sender opens TCP connections (directly, with a spare connect attempt
//!   when the first is slow, or through a relay).
//!
//! - [`feedback`]: the receiver's reports and NACKs as datagrams beside the control
//!   connection, sent by the receiver and read by the sender's session loop.
//! - [`bell`]: a wake-up polled beside sockets, which the sender's session loop waits on
//!   with the feedback sockets.
//!
//! Imports point down: [`channel_link`] uses [`udp`]; [`udp`] makes its system calls through the
//! engine's `sys`; none of them uses the sessions above, nor their error: each fails with
//! an error of its own ([`control::ControlError`], [`channel_link::LinkError`], [`udp::UdpError`]),
//! which the session's error wraps.

pub mod bell;
pub mod channel_link;
pub mod control;
pub mod dial;
pub mod feedback;
pub mod punch;
pub mod udp;
