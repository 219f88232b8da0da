//! hurtle's rendezvous and relay server: it pairs a sender with a receiver by a short code, and
//! forwards their TCP connections when they cannot reach each other directly.
//!
//! The relay sees only a code's nameplate (the number in `4821-purple-sausage`). The words are
//! the password of the peers' SPAKE2 agreement (`hurtle_proto::secure`), run over the control
//! connection, through the relay when it is relayed; nothing derived from them reaches the
//! relay, so neither the relay nor anyone on the path can test guesses offline. A wrong code is
//! found by the peers (the receiver counts each guess); the relay, which cannot tell, lets a
//! lookup open one connection to the receiver's control port, and no number of lookups cancels
//! a code.
//!
//! This crate owns:
//! - [`wire`]: the relay protocol, length-prefixed frames (u16 big-endian, at most
//!   [`wire::MAX_FRAME`] bytes) of JSON messages; decoding arbitrary bytes never panics, and a
//!   bad frame gets the client an error frame and a disconnect;
//! - [`code`] and [`words`]: codes like `4821-purple-sausage` (a nameplate from the relay and
//!   words from the receiver);
//! - [`registry`] (codes: allocation, per-address bound, lookup, expiry) and [`limit`]
//!   (per-address token buckets for lookups and bytes, per-address counts of connections and
//!   codes; an IPv6 client is its /64), pure and driven by an injected clock;
//! - [`server`]: `hurtle relay`, one thread per connection, bounded connections, codes,
//!   tickets, pending splices and tracked clients, in all and per client address, idle
//!   timeouts on every read;
//! - [`splice`]: copying bytes both ways between two TCP connections;
//! - [`logq`]: the log's own thread, so that a log nobody reads never blocks a connection;
//! - [`metrics`]: the server's counters, served in the Prometheus text format where the operator
//!   asks (`--metrics`);
//! - [`udp`]: the relay's UDP port: the address a socket is seen from (for hole punching), and
//!   allocations that forward a paired session's datagrams between its peers;
//! - [`client`]: what `hurtle receive --relay` and `hurtle send --code` use (registration and
//!   the receiver's agent, lookup, direct attempts, and the relay dialer for the engine).

pub mod client;
pub mod code;
pub mod limit;
pub mod logq;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod splice;
pub mod udp;
pub mod wire;
pub mod words;

pub use code::Code;
pub use server::{Config, Server};
