//! The receiving side: [`ReceiverBuilder`] checks the options as `hurtle receive` checks its
//! flags; [`ReceiverBuilder::build`] checks the output directory and binds the listening
//! port, so that a [`Receiver`] knows its address and code before any sender comes; each
//! [`Receiver::receive`] serves one transfer.
//!
//! With a relay ([`ReceiverBuilder::relay`]) the receiver registers there and gets its code
//! from it (a number and two words; the relay learns the number only), and keeps an agent
//! connected that forwards the relayed connections and datagrams of the sender that finds it
//! by that code. A code is good for one transfer.

use super::error::Error;
use super::keys::{check_code, new_code, read_key_file};
use super::pairing::{self, Unregistered};
use super::transfer::{Transfer, DEFAULT_INTERVAL};
use super::values::{self, HostPort, RECEIVER_PORT};
use hurtle_engine::RelayedUdp;
use hurtle_engine::{Keyring, ReceiveOptions, ReceiveSummary};
use hurtle_relay::client::{Agent, AgentEvent, RelayError};
use hurtle_relay::Code;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Options for a [`Receiver`]. Every setter is checked as the command line checks its flag;
/// the first bad value is the error of [`ReceiverBuilder::build`].
#[derive(Debug, Clone)]
pub struct ReceiverBuilder {
    out: PathBuf,
    listen: Option<String>,
    relay: Option<String>,
    code: Option<String>,
    sender_code: Option<String>,
    keys_file: Option<PathBuf>,
    identity_file: Option<PathBuf>,
    authorized_file: Option<PathBuf>,
    opts: ReceiveOptions,
    interval: Duration,
    error: Option<String>,
}

impl Default for ReceiverBuilder {
    fn default() -> Self {
        ReceiverBuilder {
            out: PathBuf::from("."),
            listen: None,
            relay: None,
            code: None,
            sender_code: None,
            keys_file: None,
            identity_file: None,
            authorized_file: None,
            opts: ReceiveOptions::default(),
            interval: DEFAULT_INTERVAL,
            error: None,
        }
    }
}

impl ReceiverBuilder {
    /// The directory to receive into (created if missing; default `.`).
    pub fn out(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out = dir.into();
        self
    }

    /// Where to listen for the sender's control connection, `HOST[:PORT]` (default
    /// `0.0.0.0:7400`; port 0 picks a free one, see [`Receiver::local_addr`]).
    pub fn listen(mut self, addr: impl ToString) -> Self {
        self.listen = Some(addr.to_string());
        self
    }

    /// Register with this relay, `HOST[:PORT]` (port 7401 when not given), and take the code
    /// it gives ([`Receiver::code`]); the sender finds this receiver by that code. Not with
    /// a code or keys of one's own. Listens on `0.0.0.0:0` unless told otherwise.
    pub fn relay(mut self, relay: impl ToString) -> Self {
        self.relay = Some(relay.to_string());
        self
    }

    /// A code a sender printed, having offered it at the relay ([`ReceiverBuilder::relay`]):
    /// this receiver answers that sender's offer instead of taking a code of the relay's
    /// (`hurtle receive CODE`). No sender waiting with the code at the relay is an
    /// [`ErrorKind::Other`](crate::ErrorKind::Other) error of [`ReceiverBuilder::build`]; a
    /// sender that refuses this receiver (the code was mistyped) ends the waiting
    /// [`Transfer`] with an [`ErrorKind::Refused`](crate::ErrorKind::Refused) error.
    pub fn sender_code(mut self, code: impl Into<String>) -> Self {
        self.sender_code = Some(code.into());
        self
    }

    /// The code the sender must give (default: a new one, [`Receiver::code`]; none when only
    /// a key file is given).
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Accept senders holding one of the keys in this file (one `hurtle-key-...` per line,
    /// optionally followed by a name; `hurtle keygen` makes them).
    pub fn keys_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.keys_file = Some(path.into());
        self
    }

    /// This receiver's identity key file (`hurtle keygen --identity`), which it proves to
    /// senders with an identity key of theirs ([`ReceiverBuilder::authorized_file`]).
    pub fn identity_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.identity_file = Some(path.into());
        self
    }

    /// Accept senders whose identity keys are listed in this file, without a shared secret
    /// (one public `hurtle-id-...` per line, optionally followed by a name); needs
    /// [`ReceiverBuilder::identity_file`].
    pub fn authorized_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.authorized_file = Some(path.into());
        self
    }

    /// Replace files that already exist (by default a file that exists and differs is
    /// refused; one with the same size and modification time, or BLAKE3 when the sender
    /// asks, is skipped; a partial one from an interrupted transfer is resumed).
    pub fn overwrite(mut self, on: bool) -> Self {
        self.opts.overwrite = on;
        self
    }

    /// Let a sender's [`delete`](crate::SenderBuilder::delete) delete what it does not send,
    /// inside the directories it sends (never what its excludes leave out, never through a
    /// symbolic link); without it such a transfer is refused before anything is written.
    pub fn allow_delete(mut self, on: bool) -> Self {
        self.opts.allow_delete = on;
        self
    }

    /// Memory for gathering blocks that are still incomplete, across all channels, bytes
    /// (default 256 MiB).
    pub fn buffer_memory(mut self, bytes: u64) -> Self {
        match usize::try_from(bytes) {
            Ok(b) if b > 0 => self.opts.buffer_memory = b,
            _ => {
                self.error
                    .get_or_insert(format!("buffer_memory: out of range: {bytes}"));
            }
        }
        self
    }

    /// Most channels to accept, 1 to 32 (default 32).
    pub fn max_channels(mut self, n: u64) -> Self {
        match values::check_channels(n) {
            Ok(c) => self.opts.max_channels = c,
            Err(e) => {
                self.error.get_or_insert(format!("max_channels: {e}"));
            }
        }
        self
    }

    /// Agree to send data unencrypted, if the sender asks too.
    pub fn no_encryption(mut self, on: bool) -> Self {
        self.opts.no_encryption = on;
        self
    }

    /// Write one network log per channel into this directory.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.opts.log_dir = Some(dir.into());
        self
    }

    /// Give up when the sender is silent this long (default 30 s).
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.opts.idle_timeout = d;
        self
    }

    /// How often progress [`Event`](crate::Event)s are made (default 200 ms).
    pub fn progress_interval(mut self, d: Duration) -> Self {
        self.interval = d.max(Duration::from_millis(10));
        self
    }

    /// Checks the options and the output directory (which must be, or be made, a writable
    /// directory: else an [`ErrorKind::Storage`](crate::ErrorKind::Storage) error), and
    /// binds the listening port.
    pub fn build(self) -> Result<Receiver, Error> {
        if let Some(e) = self.error {
            return Err(Error::Usage(e));
        }
        let relay = match &self.relay {
            Some(_) if self.identity_file.is_some() || self.authorized_file.is_some() => {
                return Err(Error::Usage(
                    "relay: not with identity_file or authorized_file (give to the sender instead)"
                        .into(),
                ))
            }
            Some(_) if self.code.is_some() || self.keys_file.is_some() => {
                return Err(Error::Usage(
                    "relay: not with code or keys_file (the relay's code is made here; a code a \
                     sender printed is sender_code)"
                        .into(),
                ))
            }
            None if self.sender_code.is_some() => {
                return Err(Error::Usage(
                    "sender_code: needs the relay the sender offered it at (relay)".into(),
                ))
            }
            Some(r) => Some(
                HostPort::parse(r, values::RELAY_PORT, false)
                    .map_err(|e| Error::usage("relay", e))?
                    .resolve("relay")
                    .map_err(Error::Resolve)?,
            ),
            None => None,
        };
        let listen = match &self.listen {
            Some(l) => {
                HostPort::parse(l, RECEIVER_PORT, true).map_err(|e| Error::usage("listen", e))?
            }
            None => HostPort {
                host: "0.0.0.0".into(),
                port: if relay.is_some() { 0 } else { RECEIVER_PORT },
            },
        };
        let answer = match &self.sender_code {
            Some(c) => Some(check_code(c)?),
            None => None,
        };
        let code = match (&self.code, &self.keys_file) {
            (Some(c), _) => Some(check_code(c)?.to_string()),
            (None, Some(_)) => None,
            (None, None) if relay.is_some() || self.authorized_file.is_some() => None,
            (None, None) => Some(new_code()),
        };
        let keys = match &code {
            Some(c) => Keyring::code(c),
            None => Keyring::default(),
        };
        if let Some(path) = &self.keys_file {
            for (name, secret) in read_key_file(path)? {
                keys.add(name, secret);
            }
        }
        let keys = super::identity::receiver(
            keys,
            self.identity_file.as_deref(),
            self.authorized_file.as_deref(),
        )?;
        check_out(&self.out)?;
        let addr = listen.resolve("listening").map_err(Error::Resolve)?;
        let relayed_udp = relay.map(|r| Arc::new(RelayedUdp::new(r.ip())));
        let opts = ReceiveOptions {
            out_dir: self.out.clone(),
            keys: keys.clone(),
            relayed_udp: relayed_udp.clone(),
            ..self.opts
        };
        let own_ports = opts.own_ports.clone();
        let inner = hurtle_engine::Receiver::bind(addr, opts)?;
        let local = inner.local_addr()?;
        let (code, relay) = match (relay, relayed_udp) {
            (Some(r), Some(udp)) => {
                let link = register(r, local, own_ports, udp, &keys, answer.as_ref())?;
                (Some(link.code.clone()), Some(Arc::new(link)))
            }
            _ => (code, None),
        };
        Ok(Receiver {
            inner: Arc::new(inner),
            local,
            relay,
            code,
            out: self.out,
            busy: Arc::new(AtomicBool::new(false)),
            interval: self.interval,
        })
    }
}

/// A receiver's registration at a relay: its code, and the agent that keeps it.
struct RelayLink {
    code: String,
    /// Why the registration ended before a sender came (the relay cancelled the code, it
    /// expired, the relay was lost), for a transfer still waiting.
    ended: Arc<Mutex<Option<Error>>>,
    _agent: Agent,
}

/// Registers the receiver listening at `local` with `relay` (answering the offer of the
/// sender that printed `answer`, if given; [`pairing::register`], which puts the code in
/// `keys`), and starts its agent: relayed connections go to the receiver's own ports, relayed
/// datagrams to its channels.
fn register(
    relay: SocketAddr,
    local: SocketAddr,
    own_ports: Arc<hurtle_engine::OwnPorts>,
    udp: Arc<RelayedUdp>,
    keys: &Keyring,
    answer: Option<&Code>,
) -> Result<RelayLink, Error> {
    let reg = pairing::register(relay, local, keys, answer).map_err(|e| match (e, answer) {
        (Unregistered::NoOffer, Some(code)) => Error::Code(format!(
            "no sender is waiting with code {code} at the relay {relay} (it expired or was \
             used, or its number is mistyped)"
        )),
        (Unregistered::Relay(e), _) => Error::Relay(e),
        (Unregistered::NoOffer, None) => {
            Error::Code(format!("the relay {relay} refused the registration"))
        }
    })?;
    let answering = answer.is_some();
    let code = reg.code.to_string();
    let ttl = reg.ttl_secs;
    let ended = Arc::new(Mutex::new(None));
    let slot = ended.clone();
    let said = code.clone();
    let paired = AtomicBool::new(false);
    let agent = reg
        .start_agent(local.ip(), own_ports, move |event| {
            let end = match event {
                AgentEvent::Udp { port, tokens } => {
                    pairing::relay_datagrams(&udp, relay, port, &tokens);
                    return;
                }
                AgentEvent::Cancelled(reason) if answering => Error::Refused(format!(
                    "code {said} was refused: {reason}; check the code the sender printed"
                )),
                AgentEvent::Cancelled(reason) => Error::Code(format!(
                    "the relay cancelled code {said}: {reason}; build a receiver again for a new code"
                )),
                AgentEvent::Expired => Error::Code(format!(
                    "code {said} expired after {ttl} s; build a receiver again for a new code"
                )),
                AgentEvent::Paired { relayed, .. } => {
                    paired.store(true, Ordering::Relaxed);
                    if relayed == Some(true) {
                        udp.paired_through_relay();
                    }
                    return;
                }
                // Once a sender found the code, the session no longer needs the relay's
                // registration (a relayed one goes on through the relay's splices).
                AgentEvent::Lost(_) if paired.load(Ordering::Relaxed) => return,
                AgentEvent::Lost(reason) => Error::Relay(RelayError::Protocol(format!(
                    "lost the relay at {relay}: {reason}"
                ))),
                _ => return,
            };
            slot.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(end);
        })
        .map_err(|e| Error::Thread(format!("cannot start the relay agent: {e}")))?;
    Ok(RelayLink {
        code,
        ended,
        _agent: agent,
    })
}

/// Checks that `out` is, or can be made, a writable directory, before anything listens.
fn check_out(out: &Path) -> Result<(), Error> {
    values::check_out_dir(out, "out").map_err(Error::Storage)
}

/// A receiver listening for senders; each [`Receiver::receive`] serves one transfer, one at
/// a time.
pub struct Receiver {
    inner: Arc<hurtle_engine::Receiver>,
    local: SocketAddr,
    /// Its registration at the relay, held by each transfer too: a transfer that outlives
    /// its `Receiver` keeps the code registered.
    relay: Option<Arc<RelayLink>>,
    code: Option<String>,
    out: PathBuf,
    busy: Arc<AtomicBool>,
    interval: Duration,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("local", &self.local)
            .field("out", &self.out)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Options to build a receiver from.
    pub fn builder() -> ReceiverBuilder {
        ReceiverBuilder::default()
    }

    /// The address it listens on (with the port picked when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The code a sender must give (`None` when only keys are accepted); for a receiver
    /// answering a sender's code ([`ReceiverBuilder::sender_code`]), that code.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The directory it receives into.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// Starts waiting for one sender, and receiving its transfer, on a thread of its own.
    /// One transfer at a time: asking for another while one runs is a usage error.
    pub fn receive(&self) -> Result<Transfer<ReceiveSummary>, Error> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(Error::Usage(
                "this receiver is already receiving a transfer".into(),
            ));
        }
        let (inner, busy) = (self.inner.clone(), self.busy.clone());
        let link = self.relay.clone();
        let started = Transfer::start("receive", true, self.interval, move |progress, _| {
            let result = inner.accept_one(progress);
            busy.store(false, Ordering::Release);
            drop(link);
            Ok(result?)
        });
        match (started, &self.relay) {
            (Ok(t), Some(link)) => Ok(t.abandoned_by(link.ended.clone())),
            (Ok(t), None) => Ok(t),
            (Err(e), _) => {
                self.busy.store(false, Ordering::Release);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_and_an_unwritable_out_are_refused_before_anything_listens() {
        let dir = tempfile::tempdir().unwrap();
        let usage = |b: ReceiverBuilder| match b.build() {
            Err(Error::Usage(e)) => e,
            other => panic!("expected a usage error, got {other:?}"),
        };
        let ok = || Receiver::builder().out(dir.path()).listen("127.0.0.1:0");
        assert!(usage(ok().max_channels(0)).starts_with("max_channels: "));
        assert!(usage(ok().listen("h:x")).contains("is not a port"));
        assert!(usage(ok().code("12-notaword-acid")).starts_with("bad code: "));
        assert!(usage(ok().sender_code("7-acid-acorn")).starts_with("sender_code: needs"));
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = Receiver::builder()
            .out(&file)
            .listen("127.0.0.1:0")
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Storage, "{e}");
        let r = ok().build().unwrap();
        assert_ne!(r.local_addr().port(), 0);
        assert!(
            check_code(r.code().unwrap()).is_ok(),
            "a new code is a valid one"
        );
    }
}
