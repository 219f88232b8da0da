//! One module per command; each turns its parsed flags into a call of the engine (or the relay)
//! and its result into output and a [`Failure`]. The checks of values, codes and keys, and the
//! exit code of each error, are the library's (`hurtle::api`); `api_parity` (a test) keeps
//! every flag of `send` and `receive` a setter of the library's builders, or says why not.

#[cfg(test)]
mod api_parity;
pub mod cp;
pub mod demo;
pub mod docs;
pub mod keys;
pub mod receive;
pub mod relay;
pub mod send;
pub mod stdin;

use crate::args::HostPort;
use crate::exit::Failure;
use hurtle_engine::{Progress, SessionError};
use std::net::SocketAddr;

/// Resolves `hp` (the `what`, for the message): a name that does not resolve is a network
/// failure (exit 4); its syntax was checked when the flags were parsed.
pub fn resolve(hp: &HostPort, what: &str) -> Result<SocketAddr, Failure> {
    hp.resolve(what)
        .map_err(|e| Failure::from(hurtle::Error::Resolve(e)))
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
