//! The key agreement's driver: runs [`hurtle_proto::secure`]'s agreement on a new control
//! connection, before any other frame, within a deadline, and tells a peer that failed it from
//! a session that failed.
//!
//! The sender [`offer`]s, with its hello in the clear behind the `Agree` (bound into the
//! keys); the receiver [`answer`]s the offer and hello its front door read
//! ([`crate::receive::accept::greet`]) and reads the sender's first sealed frame (the
//! manifest's first part), which proves the sender holds the secret. Its own first sealed
//! frame (its `HelloAck`) goes in the answer's flight when what it answers was opened ahead
//! of any connection (lent, and given back if the agreement fails), else only once the sender
//! proved the secret, when what the session needs is opened for it. Everything a
//! stranger can do (hold another key, guess a code, change a message) is decided before a
//! session exists, and comes back as a [`Refusal`] the receiver logs and survives. A
//! [`Keyring`] holds what a receiver accepts: its code, and the keys of a key file, and the
//! code's budget of guesses ([`hurtle_proto::guesses`]): each agreement with the code is
//! charged to it before the receiver answers (the answer is what lets a guesser test its
//! guess), and given back only when the sender proves it holds the code, so that at most
//! [`CODE_TRIES`] wrong guesses are ever answered, however many come at once or are held open.
//!
//! With no shared secret (a sender's identity key that the receiver authorizes: docs/identity.md)
//! each side proves its identity key by a sealed `Identify` that signs the agreement's
//! transcript: the receiver's goes in its answer's flight (the [`Keyring`] holds the
//! receiver's identity key), and the sender checks it, and the receiver's key against the one
//! it pinned ([`offer_checked`]), before it sends its own, its first sealed frame. Nothing is
//! opened ahead for such a session: the receiver opens what it needs only once the sender's
//! proof checked.

use crate::error::SessionError;
use crate::net::control::{read_frame, read_sealed, write_frame, ControlError};
use hurtle_proto::guesses::{Failed, Guess, GuessBudget, Refused};
use hurtle_proto::secure::{
    self, AgreeError, FrameSeal, IdentityKey, KeyId, Offer, PublicId, Secret, SessionKeys,
};
use hurtle_proto::wire::{Control, FrameError};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// Wrong guesses of the code that are answered before it is spent: the code's budget
/// ([`hurtle_proto::guesses`]). See docs/security.md for the odds this gives.
pub const CODE_TRIES: u32 = 3;

/// How a receiver's refusal for want of room starts (`Reject` reasons): the sender turns it
/// into [`SessionError::Busy`] rather than a refusal of its secret.
pub const BUSY: &str = "busy: ";

/// What a receiver accepts: a code, and named keys (from a key file), and the code's budget of
/// guesses. Clones share their contents, so a code known only after the receiver started
/// listening (one a relay gave it) can still be added ([`Keyring::add`]).
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Arc<RwLock<Vec<(String, Secret)>>>,
    guesses: Arc<Guesses>,
    identity: Option<Arc<IdentityKey>>,
}

/// The code's budget, and the wake-up of agreements waiting for a slot of it.
#[derive(Debug)]
struct Guesses {
    budget: Mutex<GuessBudget>,
    settled: Condvar,
}

impl Default for Guesses {
    fn default() -> Self {
        Guesses {
            budget: Mutex::new(GuessBudget::new(CODE_TRIES)),
            settled: Condvar::new(),
        }
    }
}

impl Guesses {
    fn lock(&self) -> MutexGuard<'_, GuessBudget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Keyring {
    /// A keyring holding one code.
    pub fn code(code: &str) -> Keyring {
        let k = Keyring::default();
        k.add("code", Secret::code(code));
        k
    }

    /// Adds a secret under `name` (for the logs: which sender came; `code` for a code). It
    /// replaces a secret of the same id: a receiver has one code at most.
    pub fn add(&self, name: impl Into<String>, secret: Secret) {
        if let Ok(mut e) = self.entries.write() {
            e.retain(|(_, s)| s.id() != secret.id());
            e.push((name.into(), secret));
        }
    }

    /// Gives the receiver its identity key, which it proves to senders that come with an
    /// identity key of theirs ([`Keyring::authorize`]).
    pub fn with_identity(mut self, key: Arc<IdentityKey>) -> Keyring {
        self.identity = Some(key);
        self
    }

    /// The receiver's identity key, if it has one.
    pub fn identity(&self) -> Option<&IdentityKey> {
        self.identity.as_deref()
    }

    /// Accepts the sender whose identity key has this public half, under `name` (for the logs).
    pub fn authorize(&self, name: impl Into<String>, public: PublicId) {
        self.add(name, Secret::authorized(public));
    }

    /// Removes the code (it was spent); keys stay.
    pub fn remove_code(&self) {
        if let Ok(mut e) = self.entries.write() {
            e.retain(|(_, s)| !s.is_code());
        }
    }

    /// Whether it holds nothing (a receiver then refuses to start).
    pub fn is_empty(&self) -> bool {
        self.entries.read().map_or(true, |e| e.is_empty())
    }

    /// Whether the code was spent by [`CODE_TRIES`] failed agreements.
    pub fn code_spent(&self) -> bool {
        self.guesses.lock().is_spent()
    }

    /// Failed agreements with the code so far.
    pub fn code_failures(&self) -> u32 {
        self.guesses.lock().failures()
    }

    /// Charges a guess of the code, before it is answered: waits (until `deadline`) while
    /// every slot left is held by agreements still under way, one of which may be the right
    /// code's.
    fn charge(&self, deadline: Instant) -> Result<Guess, Refused> {
        let mut budget = self.guesses.lock();
        loop {
            match budget.charge() {
                Err(Refused::Busy(_)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return budget.charge();
                    }
                    budget = match self.guesses.settled.wait_timeout(budget, left) {
                        Ok((b, _)) => b,
                        Err(e) => e.into_inner().0,
                    };
                }
                other => return other,
            }
        }
    }

    /// Settles a charged guess: given back if `proven`, else charged for good; the
    /// [`CODE_TRIES`]th failure removes the code.
    fn settle(&self, guess: Guess, proven: bool) -> Option<Failed> {
        let mut budget = self.guesses.lock();
        let failed = if proven {
            budget.proven(guess);
            None
        } else {
            let f = budget.failed(guess);
            if f.spent {
                // Spent: no later agreement with it can succeed, whoever holds it (keys, if
                // any, still work).
                self.remove_code();
            }
            Some(f)
        };
        drop(budget);
        self.guesses.settled.notify_all();
        failed
    }

    fn find(&self, id: KeyId) -> Option<(String, Secret)> {
        self.entries
            .read()
            .ok()?
            .iter()
            .find(|(_, s)| s.id() == id)
            .cloned()
    }
}

/// The sender's side: sends the offer and `hello` (one write) and reads the answer on
/// `stream`, within `timeout`. For a secret that is a code or a key; an identity key needs
/// [`offer_checked`].
pub fn offer(
    stream: &mut TcpStream,
    secret: &Secret,
    plain_data: bool,
    hello: &Control,
    timeout: Duration,
) -> Result<SessionKeys, SessionError> {
    offer_checked(stream, secret, plain_data, hello, timeout, &mut |_| {
        Err(SessionError::NotAuthenticated(
            "no known-receivers file to check the receiver's identity against; nothing was sent"
                .into(),
        ))
    })
}

/// [`offer`], and for a sender's identity key ([`Secret::identity`]): reads the receiver's
/// proof of its identity, checks it and gives its key to `pin` (which refuses a key other than
/// the one pinned for the receiver), and only then sends the sender's own proof.
pub fn offer_checked(
    stream: &mut TcpStream,
    secret: &Secret,
    plain_data: bool,
    hello: &Control,
    timeout: Duration,
    pin: &mut dyn FnMut(&PublicId) -> Result<(), SessionError>,
) -> Result<SessionKeys, SessionError> {
    let (offer, first) = Offer::new(secret, plain_data, hello);
    stream.set_nodelay(true).ok();
    let mut flight = first.to_frame();
    flight.extend_from_slice(&hello.to_frame());
    stream.write_all(&flight).map_err(ControlError::from)?;
    stream.flush().map_err(ControlError::from)?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| SessionError::io("control connection", e))?;
    let reply = read_frame(stream, timeout)?;
    let mut keys = offer.finish(reply).map_err(|e| match e {
        AgreeError::WrongSecret => SessionError::NotAuthenticated(if secret.is_code() {
            "the receiver does not hold this code: check it (or someone in between changed the key agreement); nothing was sent".into()
        } else {
            "the receiver does not hold this key (or someone in between changed the key agreement); nothing was sent".into()
        }),
        AgreeError::Rejected(reason) => match reason.strip_prefix(BUSY) {
            Some(why) => SessionError::Busy(why.to_string()),
            None => SessionError::NotAuthenticated(format!("the receiver refused: {reason}")),
        },
        AgreeError::Version { .. } => SessionError::Incompatible(format!("the receiver: {e}")),
        other => SessionError::Agreement(other),
    })?;
    if let Some(own) = secret.identity_key() {
        let theirs = read_sealed(stream, &mut keys.frames_in, timeout)?;
        let receiver = keys.check_peer(&theirs, None).map_err(|e| {
            SessionError::NotAuthenticated(format!(
                "the receiver did not prove an identity: {e}; nothing was sent"
            ))
        })?;
        pin(&receiver)?;
        let proof = keys.frames_out.seal(&keys.prove(own));
        stream.write_all(&proof).map_err(ControlError::from)?;
    }
    Ok(keys)
}

/// A sender that passed the agreement.
#[derive(Debug)]
pub struct Accepted {
    /// The session's keys (the control frames' opener has read the first frame already, the
    /// sealer has sealed the receiver's first).
    pub keys: SessionKeys,
    /// The sender's first sealed frame (the manifest's first part).
    pub first: Control,
    /// The name of the key it used (`code` for the code).
    pub key_name: String,
    /// From the receiver's answer to the sender's first sealed frame: the sender sends it as
    /// soon as it read the answer, so this is the path's round trip (the receiver's first
    /// estimate).
    pub rtt: Duration,
}

/// Why a connection did not become a session. The receiver logs it and goes on waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// One line for the log.
    pub reason: String,
    /// It ran the agreement with the code and failed: one of the code's [`CODE_TRIES`].
    pub code_try: bool,
    /// This failure spent the code (it was the [`CODE_TRIES`]th).
    pub spent: bool,
}

impl Refusal {
    fn stray(reason: impl Into<String>) -> Refusal {
        Refusal {
            reason: reason.into(),
            code_try: false,
            spent: false,
        }
    }
}

/// The receiver's side: answers the sender's offer (`first`, its first frame, and `hello`,
/// the second, already read) with a key from `keys`, and reads the sender's first sealed
/// frame, all before `deadline`. The receiver's first frame is sealed with the keys' frame
/// sealer by `ahead` (given the sealer once the keys exist, before the answer is sent) and
/// sent in the answer's flight, if `ahead` gives one: what it returns was opened before any
/// connection, and is dropped (given back) if the agreement then fails. Else, only once the
/// sender has proven it holds the secret, `answered` opens what the session needs and seals
/// the receiver's first frame (it returns what it opened, and the sealed frame, which is
/// sent then, a round trip later).
///
/// An agreement with the code is charged to the code's budget before it is answered (waiting
/// until `deadline` while the budget is held by agreements under way), and given back only
/// when the sender's first sealed frame opens; a spent code, or a budget still held at the
/// deadline, is refused with a `Reject` that says so and no answer.
pub fn answer<T>(
    stream: &mut TcpStream,
    keys: &Keyring,
    plain_data: bool,
    (first, hello): (&Control, &Control),
    deadline: Instant,
    (ahead, answered): (
        impl FnOnce(&mut FrameSeal) -> Option<(T, Vec<u8>)>,
        impl FnOnce(&mut FrameSeal) -> Result<(T, Vec<u8>), String>,
    ),
) -> Result<(Accepted, T), Refusal> {
    let id = secure::offered_key(first).map_err(|e| Refusal::stray(e.to_string()))?;
    let refuse = |stream: &mut TcpStream, told: String, reason: String| {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = stream.set_write_timeout(Some(left.max(Duration::from_millis(10))));
        let _ = write_frame(stream, &Control::Reject { reason: told });
        Err(Refusal::stray(reason))
    };
    let Some((name, secret)) = keys.find(id) else {
        if id == KeyId::CODE && keys.code_spent() {
            return refuse(
                stream,
                spent_reason(),
                "tried the code, which is spent".into(),
            );
        }
        return refuse(
            stream,
            format!("this receiver does not know key {id}"),
            format!("offered key {id}, which is not authorized here"),
        );
    };
    if secret.is_identity() && keys.identity().is_none() {
        return refuse(
            stream,
            "this receiver has no identity key to prove".into(),
            format!("came with the identity of {name}, but this receiver has no identity key"),
        );
    }
    let guess = if secret.is_code() {
        match keys.charge(deadline) {
            Ok(guess) => Some(guess),
            Err(Refused::Spent(_)) => {
                return refuse(
                    stream,
                    spent_reason(),
                    "tried the code, which is spent".into(),
                )
            }
            Err(Refused::Busy(n)) => {
                return refuse(
                    stream,
                    format!("{BUSY}{n} tries of this receiver's code are under way; try again in a few seconds"),
                    format!("tried the code while {n} tries of it were under way; told the receiver is busy"),
                )
            }
        }
    } else {
        None
    };
    let agreed = agree(
        stream,
        (&secret, keys.identity()),
        plain_data,
        (first, hello),
        deadline,
        ahead,
    );
    let failed = guess.and_then(|g| keys.settle(g, agreed.is_ok()));
    let (mut session, first, rtt, ahead) = agreed.map_err(|reason| Refusal {
        reason,
        code_try: secret.is_code(),
        spent: failed.is_some_and(|f| f.spent),
    })?;
    let opened = match ahead {
        Some(opened) => opened,
        None => {
            // Proven: what the session needs is opened now, and its answer sent.
            let (opened, sealed) = answered(&mut session.frames_out).map_err(Refusal::stray)?;
            stream
                .write_all(&sealed)
                .map_err(|e| Refusal::stray(describe(&ControlError::from(e), "left")))?;
            opened
        }
    };
    Ok((
        Accepted {
            keys: session,
            first,
            key_name: name,
            rtt,
        },
        opened,
    ))
}

/// The kernel's lowest round trip on the control connection `stream` (TCP's `min_rtt`): the
/// floor under which no later timing of the path is believed
/// ([`hurtle_proto::rate::rtt::PathRtt`]). A lower bound of the path only: through a relay, or
/// a proxy that answers TCP for the receiver, it ends short of the receiver. `None` where the
/// kernel does not say.
pub fn kernel_floor(stream: &TcpStream) -> Option<Duration> {
    crate::sys::socket::tcp_min_rtt(std::os::fd::AsFd::as_fd(stream))
}

fn spent_reason() -> String {
    format!("this receiver's code was tried {CODE_TRIES} times with the wrong words and is spent; ask for a new one")
}

/// The agreement proper: answers the offer (with the receiver's first sealed frame behind, in
/// one write, if `ahead` gives one), and reads and opens the sender's first sealed frame.
/// Returns the keys, that frame, the round trip between the answer and it, and what `ahead`
/// gave (dropped if the agreement fails). With an authorized sender's identity, the
/// receiver's proof (by `own`) goes in place of `ahead`'s frame (not asked for: a stranger
/// can finish such an agreement, and nothing is lent before its proof checks), and the
/// sender's proof must be its first sealed frame; the one after it is returned.
fn agree<T>(
    stream: &mut TcpStream,
    (secret, own): (&Secret, Option<&IdentityKey>),
    plain_data: bool,
    (first, hello): (&Control, &Control),
    deadline: Instant,
    ahead: impl FnOnce(&mut FrameSeal) -> Option<(T, Vec<u8>)>,
) -> Result<(SessionKeys, Control, Duration, Option<T>), String> {
    let code_try = secret.is_code();
    let (mut session, reply) = secure::answer(secret, first, hello, plain_data)
        .map_err(|e| format!("key agreement: {e}"))?;
    let mut flight = reply.to_frame();
    let ahead = match (secret.authorized_key(), own) {
        (Some(_), Some(own)) => {
            flight.extend_from_slice(&session.frames_out.seal(&session.prove(own)));
            None
        }
        (Some(_), None) => return Err("this receiver has no identity key".into()),
        (None, _) => ahead(&mut session.frames_out).map(|(t, sealed)| {
            flight.extend_from_slice(&sealed);
            t
        }),
    };
    stream.set_nodelay(true).ok();
    stream
        .write_all(&flight)
        .map_err(|e| describe(&ControlError::from(e), "left"))?;
    let answered = Instant::now();
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("did not finish the key agreement in time".into());
    }
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| format!("socket: {e}"))?;
    let opened = |e| match e {
        ControlError::Closed => format!(
            "left after the key agreement: it does not hold this receiver's {}",
            if code_try {
                "code"
            } else if secret.is_identity() {
                "identity key as it expected"
            } else {
                "key"
            }
        ),
        ControlError::Frame(FrameError::Unauthentic) => {
            "its first frame failed authentication".into()
        }
        other => describe(&other, "sent after the key agreement"),
    };
    let mut first = read_sealed(stream, &mut session.frames_in, left).map_err(opened)?;
    let rtt = answered.elapsed();
    if let Some(expected) = secret.authorized_key() {
        session
            .check_peer(&first, Some(expected))
            .map_err(|e| format!("came with an authorized sender's key id, but {e}"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        first = read_sealed(stream, &mut session.frames_in, left).map_err(opened)?;
    }
    Ok((session, first, rtt, ahead))
}

fn describe(e: &ControlError, what: &str) -> String {
    match e {
        ControlError::Closed => "closed the connection".into(),
        ControlError::Timeout(_) => "stayed silent".into(),
        ControlError::Frame(FrameError::TooLong(n)) => {
            format!("{what} a length prefix of {n} bytes (not a hurtle peer)")
        }
        ControlError::Frame(f) => format!("{what} bytes that are no hurtle message ({f})"),
        ControlError::Io(e) => format!("socket error: {e}"),
    }
}

/// For tests elsewhere in the engine: connections on loopback, and sessions agreed on them.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// Both ends of a TCP connection on loopback.
    pub(crate) fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// A hello for agreements in tests.
    pub(crate) fn hello() -> Control {
        Control::hello(0, 1, hurtle_proto::wire::DEFAULT_PAYLOAD, 1 << 20, 1)
    }

    /// The receiver's side of an agreement on `r`: reads the offer and hello, answers with a
    /// sealed keep-alive as its first frame, and reads the sender's first sealed frame.
    pub(crate) fn receive(
        r: &mut TcpStream,
        keys: &Keyring,
        deadline: Instant,
    ) -> Result<Accepted, Refusal> {
        let first = read_frame(r, Duration::from_secs(5)).unwrap();
        let hello = read_frame(r, Duration::from_secs(5)).unwrap();
        let answered = |seal: &mut FrameSeal| Ok(((), seal.seal(&Control::KeepAlive)));
        let ahead = |_: &mut FrameSeal| None;
        answer(
            r,
            keys,
            false,
            (&first, &hello),
            deadline,
            (ahead, answered),
        )
        .map(|(a, ())| a)
    }

    /// A key agreement with `code` on loopback, the sender's first sealed frame a keep-alive:
    /// the receiver's side of it, and the control connection's ends (sender's, receiver's).
    pub(crate) fn agreed(code: &str) -> (Accepted, TcpStream, TcpStream) {
        let (mut s, r) = pair();
        let keyring = Keyring::code(code);
        let receiver = std::thread::spawn(move || {
            let mut r = r;
            let deadline = Instant::now() + Duration::from_secs(5);
            let got = receive(&mut r, &keyring, deadline).unwrap();
            (got, r)
        });
        let mut keys = offer(
            &mut s,
            &Secret::code(code),
            false,
            &hello(),
            Duration::from_secs(5),
        )
        .unwrap();
        s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let (got, r) = receiver.join().unwrap();
        (got, s, r)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::pair;
    use super::*;
    use std::io::Write;

    fn receive(mut s: TcpStream, keys: Keyring, secs: u64) -> Result<Accepted, Refusal> {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        super::testing::receive(&mut s, &keys, Instant::now() + Duration::from_secs(secs))
    }

    /// A receiver thread answering with `keys` within `secs` on a new connection: the sender's
    /// end, and the thread.
    fn receiving(
        keys: Keyring,
        secs: u64,
    ) -> (
        TcpStream,
        std::thread::JoinHandle<Result<Accepted, Refusal>>,
    ) {
        let (s, r) = pair();
        (s, std::thread::spawn(move || receive(r, keys, secs)))
    }

    /// The sender's [`offer`] of `secret` with the test's hello, waiting `secs` for the answer.
    fn offer_for(
        s: &mut TcpStream,
        secret: &Secret,
        secs: u64,
    ) -> Result<SessionKeys, SessionError> {
        let hello = super::testing::hello();
        offer(s, secret, false, &hello, Duration::from_secs(secs))
    }

    /// The sender's [`offer_checked`] of `secret` with the test's hello within 5 s, the
    /// receiver's identity given to `pin`.
    fn offer_pinned(
        s: &mut TcpStream,
        secret: &Secret,
        pin: &mut dyn FnMut(&PublicId) -> Result<(), SessionError>,
    ) -> Result<SessionKeys, SessionError> {
        let hello = super::testing::hello();
        offer_checked(s, secret, false, &hello, Duration::from_secs(5), pin)
    }

    #[test]
    fn the_right_code_opens_a_session_and_the_hello_is_read() {
        let (mut s, rx) = receiving(Keyring::code("12-a-b"), 5);
        let mut keys = offer_for(&mut s, &Secret::code("12-A-B"), 5).unwrap();
        s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let got = rx.join().unwrap().unwrap();
        assert_eq!(got.first, Control::KeepAlive);
        assert_eq!(got.key_name, "code");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernels_floor_is_below_a_key_agreement_held_up_by_the_receivers_cpu() {
        // A receiver that holds the offer 30 ms before it answers (its CPU busy elsewhere):
        // the agreement's timing has the 30 ms in it, the kernel's floor on the same
        // connection has not.
        let (mut s, r) = pair();
        let rx = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            receive(r, Keyring::code("12-a-b"), 5)
        });
        let t = Instant::now();
        let keys = offer_for(&mut s, &Secret::code("12-a-b"), 5);
        let timed = t.elapsed();
        assert!(keys.is_ok());
        let floor = kernel_floor(&s).expect("Linux says");
        assert!(timed >= Duration::from_millis(30), "{timed:?}");
        assert!(floor < Duration::from_millis(10), "{floor:?}");
        let mut r = hurtle_proto::rate::rtt::PathRtt::new(timed, Some(floor));
        // A probe answered in 1 ms is taken; a forged zero is the floor.
        assert_eq!(
            r.sample(Duration::from_millis(1)),
            Some(Duration::from_millis(1))
        );
        assert_eq!(r.sample(Duration::ZERO), Some(floor));
        drop(s);
        let _ = rx.join();
    }

    #[test]
    fn a_wrong_code_fails_on_both_sides_and_costs_a_try() {
        let (mut s, rx) = receiving(Keyring::code("12-a-b"), 5);
        let err = offer_for(&mut s, &Secret::code("12-a-c"), 5).unwrap_err();
        assert!(matches!(err, SessionError::NotAuthenticated(_)), "{err}");
        drop(s);
        let refusal = rx.join().unwrap().unwrap_err();
        assert!(refusal.code_try, "{refusal:?}");
    }

    /// Offers `code` on a new connection to a receiver thread answering with `ring` within
    /// `secs`; returns what the sender's offer got and the connection, held open.
    fn try_code(
        ring: &Keyring,
        code: &str,
        secs: u64,
    ) -> (
        Result<SessionKeys, SessionError>,
        TcpStream,
        std::thread::JoinHandle<Result<Accepted, Refusal>>,
    ) {
        let (mut s, rx) = receiving(ring.clone(), secs);
        let got = offer_for(&mut s, &Secret::code(code), 10);
        (got, s, rx)
    }

    #[test]
    fn a_guess_is_charged_before_its_answer_and_given_back_only_when_proven() {
        let ring = Keyring::code("12-a-b");
        // Three wrong guesses answered and held open: charged, not yet failed.
        let held: Vec<_> = (0..3)
            .map(|i| {
                let (got, s, rx) = try_code(&ring, &format!("12-a-{i}"), 2);
                assert!(matches!(got, Err(SessionError::NotAuthenticated(_))));
                (s, rx)
            })
            .collect();
        assert_eq!(ring.code_failures(), 0);
        // A fourth, even the right code, is not answered while they are under way: it waits,
        // and is refused as busy when its own deadline passes first.
        let (got, _s, rx) = try_code(&ring, "12-a-b", 1);
        assert!(
            matches!(&got, Err(SessionError::Busy(r)) if r.contains("under way")),
            "{got:?}"
        );
        assert!(!rx.join().unwrap().unwrap_err().code_try);
        // The held ones' deadline passes: three failures, the code is spent and removed.
        for (s, rx) in held {
            let refusal = rx.join().unwrap().unwrap_err();
            assert!(refusal.code_try);
            drop(s);
        }
        assert_eq!(ring.code_failures(), 3);
        assert!(ring.code_spent() && ring.find(KeyId::CODE).is_none());
        let (got, _s, _rx) = try_code(&ring, "12-a-b", 1);
        assert!(
            matches!(&got, Err(SessionError::NotAuthenticated(r)) if r.contains("spent")),
            "{got:?}"
        );
    }

    #[test]
    fn a_proven_code_gives_its_charge_back() {
        let ring = Keyring::code("12-a-b");
        for _ in 0..5 {
            let (got, mut s, rx) = try_code(&ring, "12-A-B", 5);
            let mut keys = got.unwrap();
            s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
                .unwrap();
            rx.join().unwrap().unwrap();
        }
        assert_eq!(ring.code_failures(), 0);
        assert!(!ring.code_spent());
    }

    #[test]
    fn a_keyring_holds_one_code_and_a_spent_code_leaves_the_keys() {
        let ring = Keyring::code("1-a-b");
        ring.add("code", Secret::code("2-c-d"));
        ring.add("alice", Secret::key([1; 32]));
        assert!(ring
            .find(KeyId::CODE)
            .is_some_and(|(_, s)| s.id() == KeyId::CODE));
        assert_eq!(
            ring.entries.read().unwrap().len(),
            2,
            "the second code replaced the first"
        );
        ring.remove_code();
        assert!(ring.find(KeyId::CODE).is_none());
        assert!(ring.find(Secret::key([1; 32]).id()).is_some());
        assert!(!ring.is_empty());
    }

    /// A receiver with identity `bob` that authorizes `alice`, on a new connection: the
    /// sender's end, and the receiver's thread.
    fn identified_receiver(
        alice: PublicId,
    ) -> (
        TcpStream,
        Arc<IdentityKey>,
        std::thread::JoinHandle<Result<Accepted, Refusal>>,
    ) {
        let bob = Arc::new(IdentityKey::from_seed([2; 32]));
        let ring = Keyring::default().with_identity(bob.clone());
        ring.authorize("alice", alice);
        let (s, rx) = receiving(ring, 5);
        (s, bob, rx)
    }

    #[test]
    fn an_authorized_identity_opens_a_session_once_both_proofs_check() {
        let alice = Arc::new(IdentityKey::from_seed([1; 32]));
        let (mut s, bob, rx) = identified_receiver(alice.public());
        let mut pinned = Vec::new();
        let mut keys = offer_pinned(&mut s, &Secret::identity(alice.clone()), &mut |k| {
            pinned.push(*k);
            Ok(())
        })
        .unwrap();
        assert_eq!(pinned, [bob.public()]);
        s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let got = rx.join().unwrap().unwrap();
        // The sender's proof was read before its first frame, which is what is handed on.
        assert_eq!(got.first, Control::KeepAlive);
        assert_eq!(got.key_name, "alice");
    }

    #[test]
    fn a_sender_that_refuses_the_receiver_s_identity_sends_nothing() {
        let alice = Arc::new(IdentityKey::from_seed([1; 32]));
        let (mut s, _, rx) = identified_receiver(alice.public());
        let err = offer_pinned(&mut s, &Secret::identity(alice), &mut |_| {
            Err(SessionError::IdentityChanged("changed".into()))
        })
        .unwrap_err();
        assert!(matches!(err, SessionError::IdentityChanged(_)), "{err}");
        drop(s);
        let refusal = rx.join().unwrap().unwrap_err();
        assert!(refusal.reason.contains("left after"), "{refusal:?}");
    }

    #[test]
    fn strangers_and_impostors_of_an_identity_are_refused() {
        let alice = Arc::new(IdentityKey::from_seed([1; 32]));
        // An identity the receiver does not list: turned away before an answer.
        let (mut s, _, rx) = identified_receiver(alice.public());
        let mallory = Arc::new(IdentityKey::from_seed([3; 32]));
        let err =
            offer_pinned(&mut s, &Secret::identity(mallory.clone()), &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("does not know key"), "{err}");
        assert!(rx
            .join()
            .unwrap()
            .unwrap_err()
            .reason
            .contains("not authorized"));
        // One who knows alice's public key (it is public) agrees as her, but can only prove
        // its own key: refused, and nothing after its proof is read.
        let (mut s, _, rx) = identified_receiver(alice.public());
        let mut keys = offer_for(&mut s, &Secret::authorized(alice.public()), 5).unwrap();
        let receivers = read_sealed(&mut s, &mut keys.frames_in, Duration::from_secs(5)).unwrap();
        assert!(matches!(receivers, Control::Identify { .. }));
        let mut flight = keys.frames_out.seal(&keys.prove(&mallory));
        flight.extend(keys.frames_out.seal(&Control::KeepAlive));
        s.write_all(&flight).unwrap();
        let refusal = rx.join().unwrap().unwrap_err();
        assert!(
            refusal.reason.contains("not the key it offered"),
            "{refusal:?}"
        );
        // A receiver without an identity key of its own cannot take identities.
        let ring = Keyring::default();
        ring.authorize("alice", alice.public());
        let (mut s, rx) = receiving(ring, 5);
        let err = offer_pinned(&mut s, &Secret::identity(alice), &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("no identity key"), "{err}");
        assert!(!rx.join().unwrap().unwrap_err().code_try);
    }

    #[test]
    fn an_unknown_key_is_told_and_refused() {
        let ring = Keyring::default();
        ring.add("alice", Secret::key([1; 32]));
        let (mut s, rx) = receiving(ring, 5);
        let err = offer_for(&mut s, &Secret::key([2; 32]), 5).unwrap_err();
        assert!(err.to_string().contains("does not know key"), "{err}");
        assert!(!rx.join().unwrap().unwrap_err().code_try);
    }
}
