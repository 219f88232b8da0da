//! The path a `hurtle cp` session takes, directly to the other side's port or through the ssh
//! channel ([`Route`], with what the summary and the warnings say of it), the retry through
//! the ssh channel of a direct session whose data could not get through ([`retry_reason`]),
//! and what either side needs to take a path: a direct path's control connection already
//! open ([`Prepared`]), the accepting end of a mux ([`accept_for`]).

use crate::args::OutputArgs;
use crate::sshmux::Accept;
use crate::ui::{self, PathInfo};
use hurtle_engine::net::dial::Dialer;
use hurtle_engine::{OwnPorts, Progress, SessionError};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The path a `hurtle cp` session takes.
pub(super) enum Route {
    /// Directly to the other side's port (then UDP or parallel TCP, as the session finds).
    Direct(SocketAddr),
    /// Through the ssh channel, for this reason.
    Ssh(String),
}

impl Route {
    pub(super) fn ssh(why: &str) -> Route {
        Route::Ssh(why.to_string())
    }

    /// The summary's `path:` line, after `path: `.
    pub(super) fn describe(&self) -> String {
        match self {
            Route::Direct(addr) => format!("direct to {addr}"),
            Route::Ssh(why) => format!("through the ssh channel (slow; {why})"),
        }
    }

    /// For the `--json` summary.
    pub(super) fn info(&self) -> PathInfo {
        PathInfo {
            path: match self {
                Route::Direct(_) => "direct",
                Route::Ssh(_) => "ssh",
            },
            relay: None,
            code_nameplate: None,
        }
    }
}

/// The reason the summary gives for a transfer retried through the ssh channel.
pub(super) const RETRIED: &str = "the direct path could not carry the data";

/// The warning that `whose` direct session could not get its data through (`why`) and that
/// the transfer is retried through the ssh channel. Shown at once; with `--json` it comes with
/// the summary instead (in its `warnings`), or before the error if the retry fails too.
pub(super) fn warn_retry(out: &OutputArgs, whose: &str, why: &str) -> String {
    let warning = format!(
        "{whose} direct session could not get its data through ({why}), before any file data \
         arrived: retrying once through the ssh channel, which is slow (one TCP connection \
         inside ssh's own flow control)"
    );
    if !out.quiet && !out.json {
        ui::warning(&warning);
    }
    warning
}

/// With `--json`, the retry's warning goes in the summary (see [`warn_retry`]).
pub(super) fn retry_in_summary(
    out: &OutputArgs,
    warnings: &mut Vec<String>,
    retry: Option<String>,
) {
    if out.json {
        warnings.splice(0..0, retry);
    }
}

/// With `--json`, the retry's warning before the failure of the retry (see [`warn_retry`]).
pub(super) fn retry_before_failure(out: &OutputArgs, retry: Option<&String>) {
    if let Some(w) = retry.filter(|_| out.json && !out.quiet) {
        ui::warning(w);
    }
}

/// Warns that the data will go through the ssh channel, and why.
pub(super) fn warn_slow(out: &OutputArgs, why: &str) {
    if !out.quiet {
        ui::warning(&format!(
            "{why}: the data goes through the ssh channel instead, which is slow (one TCP \
             connection inside ssh's own flow control)"
        ));
    }
}

/// A direct path whose first connection (the control connection) is already open.
#[derive(Debug)]
pub(super) struct Prepared {
    addr: SocketAddr,
    first: Mutex<Option<TcpStream>>,
}

impl Prepared {
    pub(super) fn new(addr: SocketAddr, first: TcpStream) -> Prepared {
        Prepared {
            addr,
            first: Mutex::new(Some(first)),
        }
    }
}

impl Dialer for Prepared {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
        if addr == self.addr {
            if let Some(s) = self.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok(s);
            }
        }
        TcpStream::connect_timeout(&addr, timeout)
    }
}

/// Loopback of the address family of `ip` (where a receiver bound to `ip` is reached from its
/// own host).
fn loopback(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// The accepting end of a mux for a receiver bound to `bound`: its loopback, its own ports.
pub(super) fn accept_for(bound: IpAddr, ports: Arc<OwnPorts>) -> Accept {
    Accept {
        ip: if bound.is_unspecified() {
            loopback(bound)
        } else {
            bound
        },
        allow: Box::new(move |p| ports.contains(p)),
    }
}

/// Whether a direct session failed in its data path before any file data reached the
/// receiver, which `hurtle cp` answers by carrying the transfer through the ssh channel
/// instead, once; returns the reason to give. `to` is the receiver's control address.
///
/// Two failures qualify, both of the sender (it decides, on either side), and both leave the
/// receiver's session ending by itself, so that its next session is the retry:
/// - [`SessionError::UdpBlocked`]: no datagram reached the receiver (with `--transport udp`;
///   the default `auto` moves the channels to parallel TCP first). The sender tells the
///   receiver.
/// - [`SessionError::Connect`] to a port other than the control port: a TCP data connection
///   could not be made (refused, unreachable, or no answer within the engine's 5 s connect
///   timeout). The sender tells the receiver, or it sees the control connection close.
///
/// Anything else does not: a refusal, a failed verification, an interrupt, a peer gone, a
/// stall, and a control connection that cannot be made again (after UDP was found blocked),
/// whose receiver would wait for the next one.
pub(super) fn retry_reason(
    e: &SessionError,
    to: SocketAddr,
    progress: &Progress,
) -> Option<String> {
    // (Both failures come before any data could be delivered; the check says so again.
    // Empty files may have been committed: they hold no data, and the retry skips them.)
    let delivered = progress
        .confirmed
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0;
    if delivered || progress.interrupted() {
        return None;
    }
    match e {
        SessionError::UdpBlocked { .. } => Some(e.to_string()),
        SessionError::Connect { addr, .. } if *addr != to => Some(e.to_string()),
        _ => None,
    }
}
