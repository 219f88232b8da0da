//! Pairing by code through a relay, the steps that [`Sender`](crate::Sender),
//! [`Receiver`](crate::Receiver) and the `hurtle` command share: a sender finding the receiver
//! of a code ([`find`]) and its path to it ([`connect`]), a sender that offered a code waiting
//! for receivers to answer it ([`answered`]), and a receiver registering, or answering a
//! sender's offer ([`register`]), and its channels binding at the relay for a sender's relayed
//! datagrams ([`relay_datagrams`]). Each caller says what happens in its own words (events for a
//! program, lines for the command): these return what happened, typed.

use hurtle_engine::handshake::CODE_TRIES;
use hurtle_engine::net::dial::Dialer;
use hurtle_engine::{Keyring, RelayedUdp, SessionError};
use hurtle_proto::secure::Secret;
use hurtle_relay::client::{self, Found, OfferEvent, Offering, Registration, RelayError};
use hurtle_relay::code::DEFAULT_WORDS;
use hurtle_relay::Code;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a sender tries a found receiver's addresses directly before it goes through the
/// relay.
pub const DIRECT_TRY: Duration = Duration::from_secs(2);

/// Where a sender connects to the receiver found by code, and how.
pub struct Route {
    /// The address the session connects to: the receiver's, or the relay's port for it.
    pub to: SocketAddr,
    /// How the session opens its connections (directly, or through the relay).
    pub dialer: Arc<dyn Dialer>,
    /// Whether the path goes through the relay.
    pub relayed: bool,
}

/// The path to a receiver the relay found: its addresses tried directly for [`DIRECT_TRY`]
/// (unless `relay_only`), else through the relay.
pub fn connect(found: Found, relay_only: bool) -> Route {
    let relay = found.relay;
    let port = found.port();
    let direct = if relay_only {
        None
    } else {
        found.try_direct(DIRECT_TRY)
    };
    let to = match &direct {
        Some((addr, _)) => *addr,
        None => SocketAddr::new(relay.ip(), port),
    };
    let relayed = direct.is_none();
    Route {
        to,
        dialer: found.into_dialer(direct),
        relayed,
    }
}

/// Looks `code` up at `relay`, waiting up to `wait` for its receiver to register (`waiting`
/// is called once, before the first wait), and [`connect`]s to it.
pub fn find(
    relay: SocketAddr,
    code: &Code,
    relay_only: bool,
    wait: Duration,
    waiting: impl FnOnce(),
) -> Result<Route, RelayError> {
    let found = client::lookup_waiting(relay, code.nameplate, wait, waiting)?;
    Ok(connect(found, relay_only))
}

/// Why a sender's offer ended without a transfer ([`answered`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum OfferEnd<X> {
    /// The code expired before a receiver with it came.
    Expired,
    /// The relay closed the offer's connection (why).
    Lost(String),
    /// The relay refused or failed a lookup of a receiver that answered.
    Relay(RelayError),
    /// [`CODE_TRIES`] receivers answered with another code: the code is spent.
    Spent {
        /// How many answered with another code.
        tries: u32,
    },
    /// The transfer to a receiver that answered failed (not for a wrong code), with what the
    /// transfer returned beside its error.
    Failed(SessionError, X),
    /// `interrupted` said so while no transfer ran.
    Interrupted,
    /// The offer's thread could not be started.
    Thread(std::io::Error),
}

/// Offers a code for a sender that starts first, at `relay` with the relay's default number
/// of words (the code is the offering's: print it before calling [`answered`]).
pub fn offer(relay: SocketAddr) -> Result<Offering, RelayError> {
    client::offer(relay, DEFAULT_WORDS)
}

/// A sender that offered a code (`offering`, at `relay`) waits for a receiver to answer it, and
/// runs `transfer` to that receiver (its [`Route`], and the code as the session's secret). A
/// receiver that answered with another code (the key agreement fails) is told so through the
/// relay and waited past, `wrong` called with the count; the [`CODE_TRIES`]th spends the code.
/// `interrupted` is asked every 50 ms while waiting. The offer is withdrawn when this returns.
pub fn answered<S, X>(
    offering: Offering,
    relay: SocketAddr,
    relay_only: bool,
    mut transfer: impl FnMut(Route, Secret) -> Result<S, (SessionError, X)>,
    mut wrong: impl FnMut(u32),
    interrupted: impl Fn() -> bool,
) -> Result<S, OfferEnd<X>> {
    let code = offering.code.clone();
    let (tx, rx) = crossbeam_channel::unbounded::<OfferEvent>();
    let offer = offering
        .start(move |e| {
            let _ = tx.send(e);
        })
        .map_err(OfferEnd::Thread)?;
    let mut tries = 0;
    loop {
        let event = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(e) => e,
            Err(_) if interrupted() => return Err(OfferEnd::Interrupted),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                OfferEvent::Lost("the offer thread ended".into())
            }
        };
        let nameplate = match event {
            OfferEvent::Answered(n) => n,
            OfferEvent::Expired => return Err(OfferEnd::Expired),
            OfferEvent::Lost(reason) => return Err(OfferEnd::Lost(reason)),
        };
        let found = match client::lookup(relay, nameplate) {
            Ok(f) => f,
            // That receiver left already: wait for the next.
            Err(RelayError::Refused { kind, .. }) if kind == "no_such_code" => continue,
            Err(e) => return Err(OfferEnd::Relay(e)),
        };
        let route = connect(found, relay_only);
        match transfer(route, Secret::code(&code.to_string())) {
            Ok(s) => return Ok(s),
            Err((SessionError::NotAuthenticated(_), _)) => {
                tries += 1;
                let _ = offer.mismatch(nameplate);
                if tries >= CODE_TRIES {
                    return Err(OfferEnd::Spent { tries });
                }
                wrong(tries);
            }
            Err((e, x)) => return Err(OfferEnd::Failed(e, x)),
        }
    }
}

/// Why a receiver is not registered ([`register`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Unregistered {
    /// No sender offers the code answered (it expired or was used, or its number is mistyped).
    NoOffer,
    /// The relay failed or refused otherwise.
    Relay(RelayError),
}

/// Registers the receiver listening at `listen` with `relay`: for a code of the relay's, or,
/// with `answer` (a code a sender printed), answering that sender's offer. The code goes into
/// `keys` as the session's secret: an answered one before the relay hears the answer (the
/// waiting sender looks the receiver up at once and may connect before the registration
/// returns; without the code by then its greeting would count as a wrong try).
pub fn register(
    relay: SocketAddr,
    listen: SocketAddr,
    keys: &Keyring,
    answer: Option<&Code>,
) -> Result<Registration, Unregistered> {
    let reg = match answer {
        None => client::register(relay, listen, DEFAULT_WORDS).map_err(Unregistered::Relay)?,
        Some(code) => {
            keys.add("code", Secret::code(&code.to_string()));
            client::register_answer(relay, listen, code).map_err(|e| match e {
                RelayError::Refused { kind, .. } if kind == "no_such_code" => Unregistered::NoOffer,
                e => Unregistered::Relay(e),
            })?
        }
    };
    if answer.is_none() {
        keys.add("code", Secret::code(&reg.code.to_string()));
    }
    Ok(reg)
}

/// A receiver's agent heard that the sender's datagrams come through the relay (the relay's
/// UDP `port` at `relay`, and the receiver's token of each channel's allocation,
/// [`AgentEvent::Udp`](client::AgentEvent::Udp)): the session's channels bind there.
pub fn relay_datagrams(
    udp: &RelayedUdp,
    relay: SocketAddr,
    port: u16,
    tokens: &[hurtle_relay::udp::Token],
) {
    let binds = tokens
        .iter()
        .map(|t| client::udp_bind_request(t).to_vec())
        .collect();
    udp.offer(SocketAddr::new(relay.ip(), port), binds, |d| {
        client::parse_relay_answer(d)
    });
}
