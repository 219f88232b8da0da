//! The sending side: [`SenderBuilder`] checks the options as `hurtle send` checks its flags,
//! and a [`Sender`] starts transfers ([`Sender::send`]) to a receiver at an address, or to one
//! found by its code through a relay.

use super::error::Error;
use super::keys::{check_code, read_key_file};
use super::pairing::{self, OfferEnd};
use super::transfer::{Emit, Event, Transfer, Waiting as Wait, DEFAULT_INTERVAL};
use super::values::{self, HostPort, RECEIVER_PORT};
use hurtle_engine::filter::{Filter, RuleKind};
use hurtle_engine::net::dial::{Dialer, Waiting};
use hurtle_engine::{PathMemories, Progress, SendOptions, SendSummary, SessionError};
use hurtle_proto::secure::Secret;
use hurtle_proto::RateMode;
use hurtle_relay::client;
use hurtle_relay::Code;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use hurtle_engine::send::Transport;

/// Where a sender's receiver is.
#[derive(Debug, Clone)]
enum Target {
    /// At this address, waited for this long if nothing listens there yet.
    Addr(HostPort, Duration),
    /// Found by this code at this relay.
    Relay {
        relay: HostPort,
        code: Code,
        relay_only: bool,
        wait: Duration,
    },
    /// The one that answers the code this sender offers at this relay (sender-first).
    Offer { relay: HostPort, relay_only: bool },
}

/// Options for a [`Sender`]: a receiver (`to`, or `relay` and a code), its code or a key, and
/// how to send. Every setter is checked as the command line checks its flag; the first bad
/// value is the error of [`SenderBuilder::build`].
#[derive(Debug, Clone)]
pub struct SenderBuilder {
    to: Option<String>,
    relay: Option<String>,
    relay_only: bool,
    code: Option<String>,
    key_file: Option<PathBuf>,
    identity_file: Option<PathBuf>,
    known_receivers: Option<PathBuf>,
    opts: SendOptions,
    rate: Option<u64>,
    rate_fixed: Option<u64>,
    fair: bool,
    cold_start: bool,
    path_memory: Option<PathBuf>,
    rules: Vec<(RuleKind, String)>,
    wait: Duration,
    interval: Duration,
    error: Option<String>,
}

impl Default for SenderBuilder {
    fn default() -> Self {
        SenderBuilder {
            to: None,
            relay: None,
            relay_only: false,
            code: None,
            key_file: None,
            identity_file: None,
            known_receivers: None,
            opts: SendOptions::default(),
            rate: None,
            rate_fixed: None,
            fair: false,
            cold_start: false,
            path_memory: None,
            rules: Vec::new(),
            wait: Duration::ZERO,
            interval: DEFAULT_INTERVAL,
            error: None,
        }
    }
}

impl SenderBuilder {
    fn check<T>(&mut self, what: &str, v: Result<T, String>) -> Option<T> {
        match v {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(format!("{what}: {e}"));
                None
            }
        }
    }

    /// The receiver's address, `HOST[:PORT]` (port 7400 when not given): a
    /// [`SocketAddr`] or its text.
    pub fn to(mut self, addr: impl ToString) -> Self {
        self.to = Some(addr.to_string());
        self
    }

    /// The relay the receiver registered with, `HOST[:PORT]` (port 7401 when not given): the
    /// receiver is found by its code there, reached directly if it can be and through the
    /// relay otherwise. Not with [`SenderBuilder::to`].
    ///
    /// Without a code the sender starts first: each [`Sender::send`] offers a new code at the
    /// relay ([`Transfer::code`], and a [`Waiting::Receiver`](crate::Waiting::Receiver) event)
    /// and sends to the receiver that gives it
    /// ([`ReceiverBuilder::sender_code`](crate::ReceiverBuilder::sender_code), or
    /// `hurtle receive CODE`).
    pub fn relay(mut self, relay: impl ToString) -> Self {
        self.relay = Some(relay.to_string());
        self
    }

    /// With a relay: never connect directly, always go through the relay.
    pub fn relay_only(mut self, on: bool) -> Self {
        self.relay_only = on;
        self
    }

    /// The code the receiver printed (or was given). Not with a key.
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// How long to wait for a receiver that has not started yet (`--wait`): at
    /// [`SenderBuilder::to`], while nothing listens there; with a relay, while the code is not
    /// registered (default: not at all, the error comes at once).
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// A key file the receiver accepts (`hurtle keygen`), instead of a code.
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key_file = Some(path.into());
        self
    }

    /// This sender's identity key file (`hurtle keygen --identity`), which the receiver lists
    /// among its authorized senders, instead of a code or key (with [`SenderBuilder::to`]).
    /// The receiver's identity is pinned on first use in the known-receivers file, and a later
    /// change is an [`ErrorKind::Identity`](crate::ErrorKind::Identity) error.
    pub fn identity_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.identity_file = Some(path.into());
        self
    }

    /// The known-receivers file for [`SenderBuilder::identity_file`] (default:
    /// `HURTLE_KNOWN_RECEIVERS`, else `known_receivers` under `$XDG_CONFIG_HOME/hurtle/` or
    /// `~/.config/hurtle/`).
    pub fn known_receivers(mut self, path: impl Into<PathBuf>) -> Self {
        self.known_receivers = Some(path.into());
        self
    }

    /// Data channels (UDP) or connections (TCP), 1 to 32 (default: one per core, 2 to 8).
    pub fn channels(mut self, n: u64) -> Self {
        if let Some(c) = self.check("channels", values::check_channels(n)) {
            self.opts.channels = c;
        }
        self
    }

    /// How data moves (default [`Transport::Auto`]: UDP, moving to parallel TCP in the same
    /// session when nothing gets through).
    pub fn transport(mut self, t: Transport) -> Self {
        self.opts.transport = t;
        self
    }

    /// Highest rate, as the command line writes it: `800M`, `800Mbit/s`, `100MB/s`,
    /// `100MiB/s` (see [`values::parse_rate`]). Automatic rate control never exceeds it.
    pub fn rate(mut self, rate: &str) -> Self {
        self.rate = self.check("rate", values::parse_rate(rate));
        self
    }

    /// Highest rate, bits per second.
    pub fn rate_bps(mut self, bps: u64) -> Self {
        self.rate = self.check("rate", positive(bps));
        self
    }

    /// Pace at exactly this rate and ignore feedback (the forms of [`SenderBuilder::rate`]).
    /// Not with a highest rate or fair mode.
    pub fn rate_fixed(mut self, rate: &str) -> Self {
        self.rate_fixed = self.check("rate_fixed", values::parse_rate(rate));
        self
    }

    /// Pace at exactly this many bits per second.
    pub fn rate_fixed_bps(mut self, bps: u64) -> Self {
        self.rate_fixed = self.check("rate_fixed", positive(bps));
        self
    }

    /// Yield to competing traffic on a shared bottleneck (delay-based back-off).
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// Neither use nor keep what the last transfer to the same receiver learnt of the path
    /// (by default it is kept where `HURTLE_PATH_MEMORY` says, else in
    /// `~/.cache/hurtle/paths`).
    pub fn cold_start(mut self, on: bool) -> Self {
        self.cold_start = on;
        self
    }

    /// Keep what transfers learn of their paths in this file.
    pub fn path_memory(mut self, file: impl Into<PathBuf>) -> Self {
        self.path_memory = Some(file.into());
        self
    }

    /// The unit of striping, hashing and verification, bytes: a power of two from 1K to 64M
    /// (default 1M).
    pub fn chunk_size(mut self, bytes: u64) -> Self {
        if let Some(v) = self.check("chunk_size", values::check_chunk_size(bytes)) {
            self.opts.block_size = v;
        }
        self
    }

    /// Largest datagram payload to try, bytes (512 to 8900; the handshake lowers it to what
    /// the path carries).
    pub fn payload(mut self, bytes: u64) -> Self {
        if let Some(v) = self.check("payload", values::check_payload(bytes)) {
            self.opts.payload = v;
        }
        self
    }

    /// Skip a file the receiver already has only if its BLAKE3 matches (both sides read it);
    /// by default one of the same size and modification time is skipped unread.
    pub fn checksum(mut self, on: bool) -> Self {
        self.opts.checksum = on;
        self
    }

    /// Send what symbolic links inside a directory point at (`--copy-links`) instead of the
    /// links themselves.
    pub fn follow_symlinks(mut self, on: bool) -> Self {
        self.opts.follow_symlinks = on;
        self
    }

    /// Do not send what `pattern` matches (rsync's rules: `*.tmp`, `build/` for directories,
    /// `/top` from the root, `**/cache`); with [`SenderBuilder::include`], tried in the order
    /// given, the first match decides.
    pub fn exclude(mut self, pattern: impl Into<String>) -> Self {
        self.rules.push((RuleKind::Exclude, pattern.into()));
        self
    }

    /// Send what `pattern` matches even if a later [`SenderBuilder::exclude`] matches it too.
    pub fn include(mut self, pattern: impl Into<String>) -> Self {
        self.rules.push((RuleKind::Include, pattern.into()));
        self
    }

    /// Move nothing: the summary says what would be sent and skipped (and, with
    /// [`SenderBuilder::delete`], deleted) in its files and warnings; the receiver decides as
    /// for a transfer and creates nothing.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.opts.dry_run = on;
        self
    }

    /// Mirror: the receiver deletes what is not sent inside the directories sent (keeping what
    /// the excludes leave out), once every file is in place. It must allow it
    /// ([`ReceiverBuilder::allow_delete`](crate::ReceiverBuilder::allow_delete)), or nothing
    /// moves ([`ErrorKind::Refused`](crate::ErrorKind::Refused)).
    pub fn delete(mut self, on: bool) -> Self {
        self.opts.delete = on;
        self
    }

    /// Send the holes of sparse files as data.
    pub fn no_sparse(mut self, on: bool) -> Self {
        self.opts.no_sparse = on;
        self
    }

    /// Send parity for the tail of each channel's data (default on).
    pub fn fec(mut self, on: bool) -> Self {
        self.opts.fec = on;
        self
    }

    /// Ask to send data unencrypted (done only if the receiver agrees; control messages stay
    /// encrypted and everything stays authenticated).
    pub fn no_encryption(mut self, on: bool) -> Self {
        self.opts.no_encryption = on;
        self
    }

    /// Write one network log per channel into this directory.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.opts.log_dir = Some(dir.into());
        self
    }

    /// Give up when nothing progresses for this long (default 30 s).
    pub fn stall_timeout(mut self, d: Duration) -> Self {
        self.opts.stall_timeout = d;
        self
    }

    /// How long to wait for the receiver's TCP connection (default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.opts.connect_timeout = d;
        self
    }

    /// How often progress [`Event`](crate::Event)s are made (default 200 ms).
    pub fn progress_interval(mut self, d: Duration) -> Self {
        self.interval = d.max(Duration::from_millis(10));
        self
    }

    /// Checks the options together, as the command line does: a receiver (an address with a
    /// code or a key, or a relay with or without a code), no rate beside a fixed one.
    pub fn build(self) -> Result<Sender, Error> {
        if let Some(e) = self.error {
            return Err(Error::Usage(e));
        }
        let mut opts = self.opts;
        opts.filter = Filter::new(self.rules.iter().map(|(k, p)| (*k, p.as_str())))
            .map_err(|e| Error::usage("exclude/include", e))?;
        if self.code.is_some() && self.key_file.is_some() {
            return Err(Error::Usage("code: not with key_file (give one)".into()));
        }
        if self.identity_file.is_some() && (self.code.is_some() || self.key_file.is_some()) {
            return Err(Error::Usage(
                "identity_file: not with code or key_file (give one)".into(),
            ));
        }
        if self.key_file.is_some() && self.relay.is_some() {
            return Err(Error::Usage("key_file: needs to, not a relay".into()));
        }
        if self.identity_file.is_some() && self.relay.is_some() {
            return Err(Error::Usage("identity_file: needs to, not a relay".into()));
        }
        if let Some(r) = self.rate_fixed {
            if self.rate.is_some() || self.fair {
                return Err(Error::Usage(
                    "rate_fixed: not with rate or fair (a fixed rate ignores both)".into(),
                ));
            }
            opts.rate_mode = RateMode::Fixed;
            opts.rate_bps = r;
        } else {
            opts.rate_mode = if self.fair {
                RateMode::Fair
            } else {
                RateMode::Auto
            };
            if let Some(r) = self.rate {
                opts.rate_bps = r;
                opts.start_rate_bps = opts.start_rate_bps.min(r);
            }
            if !self.cold_start {
                opts.path_memory = match self.path_memory {
                    Some(f) => Some(PathMemories::at(f)),
                    None => default_path_memory(),
                };
            }
        }
        let code = match &self.code {
            Some(c) => Some(check_code(c)?),
            None => None,
        };
        opts.secret = match (&self.key_file, &code) {
            (Some(path), _) => read_key_file(path)?.into_iter().next().map(|(_, s)| s),
            (None, Some(c)) => Some(Secret::code(&c.to_string())),
            (None, None) => None,
        };
        if let Some(path) = &self.identity_file {
            let (secret, known) = super::identity::sender(path, self.known_receivers.as_deref())?;
            opts.secret = Some(secret);
            opts.known_receivers = Some(known);
        }
        let target = match (self.to, self.relay) {
            (Some(_), Some(_)) => {
                return Err(Error::Usage("relay: not with to (give one)".into()));
            }
            (Some(to), None) => {
                if opts.secret.is_none() {
                    return Err(Error::Usage(
                        "give the code the receiver printed (code), or a key file (key_file)"
                            .into(),
                    ));
                }
                if self.relay_only {
                    return Err(Error::Usage("relay_only: needs a relay".into()));
                }
                Target::Addr(
                    HostPort::parse(&to, RECEIVER_PORT, false)
                        .map_err(|e| Error::usage("to", e))?,
                    self.wait,
                )
            }
            (None, Some(relay)) => {
                let relay = HostPort::parse(&relay, values::RELAY_PORT, false)
                    .map_err(|e| Error::usage("relay", e))?;
                match code {
                    Some(code) => Target::Relay {
                        relay,
                        code,
                        relay_only: self.relay_only,
                        wait: self.wait,
                    },
                    None => Target::Offer {
                        relay,
                        relay_only: self.relay_only,
                    },
                }
            }
            (None, None) => return Err(Error::Usage("give to, or relay and code".into())),
        };
        Ok(Sender {
            opts,
            target,
            interval: self.interval,
        })
    }
}

fn positive(bps: u64) -> Result<u64, String> {
    if bps == 0 {
        Err("must be at least 1 bit per second".into())
    } else {
        Ok(bps)
    }
}

/// Where path memories are kept by default: `HURTLE_PATH_MEMORY` (a file, or `off`), else the
/// cache directory's `hurtle/paths`, as for the command.
fn default_path_memory() -> Option<PathMemories> {
    match std::env::var_os("HURTLE_PATH_MEMORY") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathMemories::at(v)),
        _ => PathMemories::default_file().map(PathMemories::at),
    }
}

/// A sender: checked options and a receiver to send to. Each [`Sender::send`] is one
/// transfer.
#[derive(Debug, Clone)]
pub struct Sender {
    opts: SendOptions,
    target: Target,
    interval: Duration,
}

impl Sender {
    /// Options to build a sender from.
    pub fn builder() -> SenderBuilder {
        SenderBuilder::default()
    }

    /// Starts sending `paths` (files and directories, recursively) on a thread of its own.
    /// A name that does not resolve fails here; everything else the [`Transfer`] reports.
    pub fn send<P: Into<PathBuf>>(
        &self,
        paths: impl IntoIterator<Item = P>,
    ) -> Result<Transfer<SendSummary>, Error> {
        let paths: Vec<PathBuf> = paths.into_iter().map(Into::into).collect();
        if paths.is_empty() {
            return Err(Error::Usage(
                "give at least one file or directory to send".into(),
            ));
        }
        let mut opts = self.opts.clone();
        let mut offered = None;
        let run: Box<dyn FnOnce(_, Emit) -> _ + Send> = match &self.target {
            Target::Addr(hp, wait) => {
                let to = hp.resolve("receiver").map_err(Error::Resolve)?;
                let wait = *wait;
                Box::new(move |progress, emit: Emit| {
                    if !wait.is_zero() {
                        opts.dialer = Some(Arc::new(Waiting::new(wait, move |addr| {
                            emit.send(Event::Waiting(Wait::Listener { addr, up_to: wait }))
                        })));
                    }
                    Ok(hurtle_engine::send(&paths, to, &opts, progress)?)
                })
            }
            Target::Relay {
                relay,
                code,
                relay_only,
                wait,
            } => {
                let relay_addr = relay.resolve("relay").map_err(Error::Resolve)?;
                let (code, relay_only, wait) = (code.clone(), *relay_only, *wait);
                Box::new(move |progress, emit: Emit| {
                    let to = pair(relay_addr, &code, (relay_only, wait), &mut opts, &emit)?;
                    Ok(hurtle_engine::send(&paths, to, &opts, progress)?)
                })
            }
            Target::Offer { relay, relay_only } => {
                let relay_addr = relay.resolve("relay").map_err(Error::Resolve)?;
                let offering = pairing::offer(relay_addr)?;
                offered = Some(offering.code.to_string());
                let relay_only = *relay_only;
                Box::new(move |progress, emit: Emit| {
                    send_first(
                        offering,
                        relay_addr,
                        relay_only,
                        &emit,
                        |to, dialer, secret| {
                            let mut opts = opts.clone();
                            opts.dialer = Some(dialer);
                            opts.secret = Some(secret);
                            hurtle_engine::send(&paths, to, &opts, progress.clone())
                        },
                        &progress,
                    )
                })
            }
        };
        let t = Transfer::start("send", false, self.interval, run)?;
        Ok(match offered {
            Some(code) => t.with_code(code),
            None => t,
        })
    }
}

/// Finds the receiver of `code` at `relay` (waiting up to `wait` for it to register, said by
/// a [`Wait::Registration`] event), and connects to it (said by an [`Event::Found`]). Sets the
/// options' dialer; returns where the engine connects to.
fn pair(
    relay: SocketAddr,
    code: &Code,
    (relay_only, wait): (bool, Duration),
    opts: &mut SendOptions,
    emit: &Emit,
) -> Result<SocketAddr, Error> {
    let route = pairing::find(relay, code, relay_only, wait, || {
        emit.send(Event::Waiting(Wait::Registration {
            code: code.to_string(),
            up_to: wait,
        }))
    })?;
    emit.send(Event::Found {
        to: route.to,
        relayed: route.relayed,
    });
    opts.dialer = Some(route.dialer);
    Ok(route.to)
}

/// A sender that offered a code (`offering`) at `relay`: says so ([`Wait::Receiver`]), and
/// sends to the receiver that answers it ([`pairing::answered`]: each found receiver said by
/// an [`Event::Found`], each wrong code by an [`Event::WrongCode`]). Ends when `progress` is
/// interrupted while waiting.
fn send_first(
    offering: client::Offering,
    relay: SocketAddr,
    relay_only: bool,
    emit: &Emit,
    mut transfer: impl FnMut(SocketAddr, Arc<dyn Dialer>, Secret) -> Result<SendSummary, SessionError>,
    progress: &Progress,
) -> Result<SendSummary, Error> {
    let (code, ttl) = (offering.code.clone(), offering.ttl_secs);
    emit.send(Event::Waiting(Wait::Receiver {
        code: code.to_string(),
        valid: Duration::from_secs(ttl),
    }));
    let sent = pairing::answered(
        offering,
        relay,
        relay_only,
        |route, secret| {
            emit.send(Event::Found {
                to: route.to,
                relayed: route.relayed,
            });
            transfer(route.to, route.dialer, secret).map_err(|e| (e, ()))
        },
        |tries| emit.send(Event::WrongCode { tries }),
        || progress.interrupted(),
    );
    sent.map_err(|end| match end {
        OfferEnd::Interrupted => Error::Interrupted {
            receiver: false,
            held: 0,
            total: 0,
        },
        OfferEnd::Expired => Error::Code(format!(
            "code {code} expired after {ttl} s without a receiver; send again for a new code"
        )),
        OfferEnd::Lost(reason) => Error::Relay(client::RelayError::Protocol(format!(
            "lost the relay at {relay}: {reason}"
        ))),
        OfferEnd::Relay(e) => e.into(),
        OfferEnd::Spent { tries } => Error::Refused(format!(
            "code {code} was answered {tries} times with another code and is no longer valid; \
             nothing was sent (send again for a new code)"
        )),
        OfferEnd::Failed(e, ()) => e.into(),
        OfferEnd::Thread(e) => Error::Thread(format!("cannot start the relay offer thread: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(b: SenderBuilder) -> String {
        match b.build() {
            Err(Error::Usage(e)) => e,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn bad_values_are_usage_errors_that_say_what_is_accepted() {
        let ok = || Sender::builder().to("127.0.0.1:9").code("7-acid-acorn");
        assert!(ok().build().is_ok());
        let e = refused(ok().rate("100Mb"));
        assert!(
            e.starts_with("rate: \"100Mb\" is ambiguous") && e.contains("accepted:"),
            "{e}"
        );
        assert_eq!(
            refused(ok().channels(33)),
            "channels: \"33\": expected a number of channels from 1 to 32"
        );
        assert!(refused(ok().chunk_size(3000)).contains("power of two from 1K to 64M"));
        assert!(refused(ok().payload(100)).starts_with("payload: "));
        assert!(refused(ok().rate("1G").rate_fixed("1G")).starts_with("rate_fixed: not with"));
        assert!(refused(Sender::builder().to("h:0").code("7-acid-acorn"))
            .contains("port 0 cannot be connected to"));
        assert!(refused(Sender::builder().to("h")).starts_with("give the code"));
        assert!(refused(Sender::builder().code("7-acid-acorn")).starts_with("give to"));
        assert!(
            refused(Sender::builder().relay("r").code("7-acid-acorn").to("h"))
                .starts_with("relay: not with to")
        );
        assert!(refused(Sender::builder().to("h").code("nope")).starts_with("bad code: "));
        // The first bad value is the one reported.
        assert!(refused(ok().channels(0).rate("x")).starts_with("channels: "));
        // A relay without a code offers one; a key is for an address.
        assert!(matches!(
            Sender::builder().relay("h").build().unwrap().target,
            Target::Offer { .. }
        ));
        assert!(refused(Sender::builder().relay("h").key_file("k")).starts_with("key_file: "));
    }

    #[test]
    fn options_reach_the_engine() {
        let s = Sender::builder()
            .to("127.0.0.1")
            .code("7-acid-acorn")
            .channels(3)
            .rate("100MB/s")
            .fair(true)
            .cold_start(true)
            .chunk_size(64 << 10)
            .transport(Transport::Tcp)
            .build()
            .unwrap();
        assert_eq!(s.opts.channels, 3);
        assert_eq!(s.opts.rate_bps, 800_000_000);
        assert_eq!(s.opts.rate_mode, RateMode::Fair);
        assert_eq!(s.opts.block_size, 64 << 10);
        assert!(s.opts.path_memory.is_none() && s.opts.secret.is_some());
        assert!(matches!(&s.target, Target::Addr(hp, _) if hp.port == RECEIVER_PORT));
        let fixed = Sender::builder()
            .to("h")
            .code("7-acid-acorn")
            .rate_fixed_bps(5)
            .build()
            .unwrap();
        assert_eq!(
            (fixed.opts.rate_mode, fixed.opts.rate_bps),
            (RateMode::Fixed, 5)
        );
    }
}
