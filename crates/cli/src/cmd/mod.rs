//! One module per command; each turns its parsed flags into a call of the engine (or the relay)
//! and its result into output and a [`Failure`].

pub mod cp;
pub mod demo;
pub mod docs;
pub mod keys;
pub mod receive;
pub mod relay;
pub mod send;
pub mod stdin;

use crate::args::HostPort;
use crate::exit::{self, Failure};
use hurtle_engine::{Progress, SessionError};
use std::net::{SocketAddr, ToSocketAddrs};

/// Resolves `hp` (the `what`, for the message): a name that does not resolve is a network
/// failure (exit 4); its syntax was checked when the flags were parsed.
pub fn resolve(hp: &HostPort, what: &str) -> Result<SocketAddr, Failure> {
    let unresolved = |detail: String| {
        Failure::new(
            exit::NETWORK,
            anyhow::anyhow!("cannot resolve the {what} host {:?}: {detail}", hp.host),
        )
    };
    (hp.host.as_str(), hp.port)
        .to_socket_addrs()
        .map_err(|e| unresolved(e.to_string()))?
        .next()
        .ok_or_else(|| unresolved("no address".into()))
}

/// The failure of a session on this side: an interruption says what was kept and how to resume,
/// anything else is its typed error.
pub fn session_failure(e: SessionError, receiver: bool, progress: &Progress) -> Failure {
    if matches!(e, SessionError::Interrupted { .. }) {
        return Failure::new(
            crate::interrupt::exit_code(),
            anyhow::anyhow!(crate::interrupt::kept(receiver, progress)),
        );
    }
    Failure::from(e)
}
