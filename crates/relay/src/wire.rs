//! The relay wire protocol: frames of a u16 big-endian length and that many bytes of one JSON
//! message, at most [`MAX_FRAME`] bytes. After a `spliced` message the connection carries raw
//! bytes between sender and receiver, so frames are always read exactly, never buffered ahead.
//!
//! The relay learns a code's nameplate and nothing derived from its words: the words are the
//! password of the peers' SPAKE2 agreement, which runs inside the (spliced) control connection,
//! so neither the relay nor anyone on the path can test guesses offline. The relay cannot tell a
//! right code from a wrong one; the peers can (the receiver counts each guess), and a lookup
//! opens at most one connection to the receiver's control port through the relay
//! ([`CONTROL_SPLICES_PER_TICKET`](crate::server::CONTROL_SPLICES_PER_TICKET)).
//!
//! Conversations (client → relay, relay → client):
//!
//! - receiver: `register {port, candidates}` → `nameplate {nameplate}`, then
//!   `registered {ttl_secs, idle_secs}`. The connection then stays open as the receiver's
//!   *agent*: it sends `ping` and `refuse {id, reason}`, and gets `paired {sender, path}` (once
//!   per lookup, by anyone), `dial {id, port}`, `expired`, or `cancelled {reason}` (this
//!   relay sends it to a receiver that answered an offer with another code, when the offer's
//!   sender says so with `mismatch`).
//! - a sender that starts first: `offer` → `nameplate {nameplate}`, then `registered
//!   {ttl_secs, idle_secs}`; the connection stays open as the *offer*: it sends `ping` and
//!   `mismatch {nameplate}` (that receiver typed another code), and gets `answered
//!   {nameplate}` (a receiver answered) or `expired`. Its receiver registers with `answer
//!   {offer, port, candidates}` (`offer`: the offer's nameplate; charged to the lookup rate of
//!   its address as a lookup is; `no_such_code` when no offer has it), answered as `register`
//!   is, and the sender then looks the
//!   receiver's own nameplate up as below: the roles in the session do not change. A lookup
//!   never finds an offer, and an answer never finds a receiver's registration.
//! - sender: `lookup {nameplate}` → `found {ticket, candidates}` (however often the
//!   nameplate is looked up) or `error` (`no_such_code`, `rate_limited`, `busy`, `limited`);
//!   then `path {relayed}` once it knows how it reaches the receiver.
//! - sender, per relayed TCP connection: `splice {ticket, port}` → `spliced` or `error`.
//! - agent, per `dial`: `join {id}` → `spliced` or `error`.
//! - sender, for UDP through the relay: `allocate {ticket, channels}` → `allocated {port,
//!   tokens}` (one token per channel, the sender's end of each allocation; `port` is the
//!   relay's UDP port) and the agent gets `udp {tokens}` (the receiver's ends), or `error`.
//!   Each peer's channel socket then binds its end by a datagram ([`crate::udp`]).
//!
//! There is no version field: a client of the earlier protocol (which sent `claim {verifier}`
//! and `lookup {nameplate, verifier}`) gets a `bad_frame` error naming the unknown field.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::SocketAddr;

/// Largest frame body, in bytes.
pub const MAX_FRAME: usize = 1024;

/// Most candidate addresses a registration may carry.
pub const MAX_CANDIDATES: usize = 8;

/// Most UDP allocations one `allocate` asks for (their tokens fill a frame).
pub const MAX_UDP_CHANNELS: u16 = 16;

/// One relay protocol message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum Msg {
    /// Receiver: asks for a nameplate; `port` is its control port, `candidates` the addresses
    /// it believes a sender might reach it at.
    Register {
        /// The receiver's control port.
        port: u16,
        /// Candidate addresses of the receiver's control listener.
        candidates: Vec<SocketAddr>,
    },
    /// Receiver: registers as `register` does, answering the sender's `offer` of `offer` (the
    /// nameplate of the code the sender printed, typed on the receiver): the offer's sender is
    /// told this registration's own nameplate, and looks it up as any sender does.
    Answer {
        /// The offer's nameplate.
        offer: u32,
        /// The receiver's control port.
        port: u16,
        /// Candidate addresses of the receiver's control listener.
        candidates: Vec<SocketAddr>,
    },
    /// Sender: asks for a nameplate to print in a code of its own (the sender starts first);
    /// answered by `nameplate` and `registered` as a registration is. The connection then stays
    /// open as the offer: the sender pings, and sends `mismatch`; it gets `answered` once per
    /// receiver that answers the offer, and `expired`.
    Offer,
    /// Relay to an offer: a receiver answered it, and registered under `nameplate` (look it up).
    Answered {
        /// The answering receiver's own nameplate.
        nameplate: u32,
    },
    /// Offer: the receiver registered under `nameplate` (one that answered this offer) holds
    /// another code; the relay withdraws its registration and tells it `cancelled`.
    Mismatch {
        /// The answering receiver's nameplate.
        nameplate: u32,
    },
    /// Relay: the nameplate allocated to a registration.
    Nameplate {
        /// The number that starts the code.
        nameplate: u32,
    },
    /// Relay, right after `nameplate`: the code is registered and can be looked up.
    Registered {
        /// Seconds during which the code can be looked up.
        ttl_secs: u64,
        /// Seconds of silence after which the relay drops the agent (ping more often).
        idle_secs: u64,
    },
    /// Sender: looks a code up by its nameplate (never its words).
    Lookup {
        /// The code's nameplate.
        nameplate: u32,
    },
    /// Relay: the nameplate is registered. Whether the code is right is for the peers' key
    /// agreement to find out; the code stays registered for the other lookups.
    Found {
        /// Opaque ticket for `splice` requests (valid while the receiver stays).
        ticket: String,
        /// Where the receiver might be reachable directly.
        candidates: Vec<SocketAddr>,
    },
    /// Sender: how it reaches the receiver.
    Path {
        /// True when relayed, false when direct.
        relayed: bool,
    },
    /// Relay to agent: someone looked the nameplate up (the real sender or not: the agreement
    /// tells).
    Paired {
        /// The sender's address as the relay saw it.
        sender: SocketAddr,
        /// Whether the sender goes through the relay (`None`: not known yet).
        relayed: Option<bool>,
    },
    /// Sender: splice this connection to the receiver's `port`.
    Splice {
        /// The ticket from `found`.
        ticket: String,
        /// The receiver's local port (control or TCP data).
        port: u16,
    },
    /// Relay to agent: open a connection with `join {id}` and connect it to local `port`.
    Dial {
        /// Splice id.
        id: u64,
        /// Local port to connect to.
        port: u16,
    },
    /// Agent: joins splice `id` on this connection.
    Join {
        /// Splice id from `dial`.
        id: u64,
    },
    /// Agent: will not dial.
    Refuse {
        /// Splice id from `dial`.
        id: u64,
        /// Why.
        reason: String,
    },
    /// Relay: from now on this connection carries the peer's bytes.
    Spliced,
    /// Sender: UDP allocations through the relay for a session of `channels` channels (at
    /// most [`MAX_UDP_CHANNELS`]).
    Allocate {
        /// The ticket from `found`.
        ticket: String,
        /// Allocations wanted, one per channel.
        channels: u16,
    },
    /// Relay to sender: its ends of the allocations, in channel order (hex tokens), and the
    /// relay's UDP port.
    Allocated {
        /// The relay's UDP port (on the address the sender reached it at).
        port: u16,
        /// The sender's token of each allocation.
        tokens: Vec<String>,
    },
    /// Relay to agent: the receiver's ends of a session's allocations, in channel order.
    Udp {
        /// The relay's UDP port.
        port: u16,
        /// The receiver's token of each allocation.
        tokens: Vec<String>,
    },
    /// Agent: still here.
    Ping,
    /// Relay to agent: the code was cancelled (a receiver that answered an offer holds another
    /// code than its sender: the sender said `mismatch`); tickets already handed out stay
    /// valid while the agent stays.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// Relay to agent: the code expired (no more lookups). The relay closes the agent if the
    /// code was never looked up, and keeps it for the tickets otherwise.
    Expired,
    /// Relay: the request failed; the relay closes the connection after this.
    Error {
        /// Machine-readable kind: `no_such_code`, `rate_limited`, `busy`, `bad_frame`,
        /// `bad_request`, `timeout`, `refused`, `no_such_ticket`, `no_such_splice`.
        kind: String,
        /// One line for a person.
        message: String,
    },
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix exceeds [`MAX_FRAME`] (or is zero).
    #[error("frame of {0} bytes (at most {MAX_FRAME} allowed)")]
    BadLength(usize),
    /// The body is not a message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The connection failed or closed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Msg {
    /// The message as one frame (length prefix and JSON).
    pub fn to_frame(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).unwrap_or_default();
        let mut f = Vec::with_capacity(2 + body.len());
        f.extend_from_slice(&(body.len() as u16).to_be_bytes());
        f.extend_from_slice(&body);
        f
    }

    /// An `error` message.
    pub fn error(kind: &str, message: impl Into<String>) -> Msg {
        Msg::Error {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

/// Checks a length prefix.
pub fn frame_len(prefix: [u8; 2]) -> Result<usize, FrameError> {
    let len = usize::from(u16::from_be_bytes(prefix));
    if len == 0 || len > MAX_FRAME {
        return Err(FrameError::BadLength(len));
    }
    Ok(len)
}

/// Decodes a frame body.
pub fn decode_body(body: &[u8]) -> Result<Msg, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Decodes the first frame of `buf`: the message and the bytes it took, or `Ok(None)` when
/// `buf` holds only part of a frame.
pub fn decode(buf: &[u8]) -> Result<Option<(Msg, usize)>, FrameError> {
    let Some(prefix) = buf.get(..2) else {
        return Ok(None);
    };
    let len = frame_len([prefix[0], prefix[1]])?;
    match buf.get(2..2 + len) {
        Some(body) => Ok(Some((decode_body(body)?, 2 + len))),
        None => Ok(None),
    }
}

/// Reads exactly one frame (nothing beyond it).
pub fn read_msg(r: &mut impl Read) -> Result<Msg, FrameError> {
    let mut prefix = [0u8; 2];
    r.read_exact(&mut prefix)?;
    let len = frame_len(prefix)?;
    let mut body = [0u8; MAX_FRAME];
    r.read_exact(&mut body[..len])?;
    decode_body(&body[..len])
}

/// Writes one frame.
pub fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    w.write_all(&msg.to_frame())
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        let msgs = [
            Msg::Register {
                port: 7400,
                candidates: vec!["10.0.0.1:7400".parse().unwrap(), "[::1]:1".parse().unwrap()],
            },
            Msg::Answer {
                offer: 4821,
                port: 7400,
                candidates: vec![],
            },
            Msg::Offer,
            Msg::Answered { nameplate: 1234 },
            Msg::Mismatch { nameplate: 1234 },
            Msg::Nameplate { nameplate: 4821 },
            Msg::Paired {
                sender: "1.2.3.4:5".parse().unwrap(),
                relayed: Some(true),
            },
            Msg::Spliced,
            Msg::Lookup { nameplate: 4821 },
            Msg::error("no_such_code", "no such code"),
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_msg(&mut buf, m).unwrap();
        }
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(&read_msg(&mut r).unwrap(), m);
        }
        assert!(matches!(read_msg(&mut r), Err(FrameError::Io(_))));
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(matches!(
            decode(&[0xff, 0xff]),
            Err(FrameError::BadLength(65535))
        ));
        assert!(matches!(decode(&[0, 0]), Err(FrameError::BadLength(0))));
        assert!(matches!(
            decode(&[0, 3, b'{', b'}', b'x']),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(decode(b"\x00\x0a{\"t\":1"), Ok(None)));
        let unknown = br#"{"t":"join","id":1,"extra":1}"#;
        let mut f = (unknown.len() as u16).to_be_bytes().to_vec();
        f.extend_from_slice(unknown);
        assert!(matches!(decode(&f), Err(FrameError::Malformed(_))));
        assert!(matches!(decode(&[0, 1]), Ok(None)));
        // The earlier protocol's secrets are not messages any more.
        for old in [
            br#"{"t":"lookup","nameplate":4821,"verifier":"00"}"#.as_slice(),
            br#"{"t":"claim","verifier":"00"}"#.as_slice(),
        ] {
            let mut f = (old.len() as u16).to_be_bytes().to_vec();
            f.extend_from_slice(old);
            assert!(matches!(decode(&f), Err(FrameError::Malformed(_))));
        }
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let _ = decode(&bytes);
            let _ = read_msg(&mut &bytes[..]);
        }

        #[test]
        fn decoding_json_like_bytes_never_panics(body in "[{}\\[\\]\":,a-z0-9 ]{0,300}") {
            let mut f = (body.len() as u16).to_be_bytes().to_vec();
            f.extend_from_slice(body.as_bytes());
            let _ = decode(&f);
        }
    }
}
