//! The key agreement's driver: runs [`hurtle_proto::secure`]'s agreement on a new control
//! connection, before any other frame, within a deadline, and tells a peer that failed it from
//! a session that failed.
//!
//! The sender [`offer`]s, with its hello in the clear behind the `Agree` (bound into the
//! keys); the receiver [`answer`]s the offer and hello its front door read
//! ([`crate::receive::accept::greet`]), sends its own first sealed frame (its `HelloAck`,
//! so that the sender can send data as soon as it has the keys), and reads the sender's first
//! sealed frame (the manifest's first part), so that everything a stranger can do (hold
//! another key, guess a code, change a message) is decided before a session exists, and comes
//! back as a [`Refusal`] the receiver logs and survives. A [`Keyring`] holds what a receiver
//! accepts: its code, and the keys of a key file.

use crate::error::SessionError;
use crate::net::control::{read_frame, read_sealed, write_frame, ControlError};
use hurtle_proto::secure::{self, AgreeError, FrameSeal, KeyId, Offer, Secret, SessionKeys};
use hurtle_proto::wire::{Control, FrameError};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Failed agreements with the code that spend it. A direct receiver's code has about 37 bits
/// (three guesses: one chance in 50 billion); a relay's words 16 (one in 22 thousand, as a
/// magic-wormhole code).
pub const CODE_TRIES: u32 = 3;

/// What a receiver accepts: a code, and named keys (from a key file). Clones share their
/// contents, so a code known only after the receiver started listening (one a relay gave it)
/// can still be added ([`Keyring::add`]).
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Arc<RwLock<Vec<(String, Secret)>>>,
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
/// `stream`, within `timeout`.
pub fn offer(
    stream: &mut TcpStream,
    secret: &Secret,
    plain_data: bool,
    hello: &Control,
    timeout: Duration,
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
    offer.finish(reply).map_err(|e| match e {
        AgreeError::WrongSecret => SessionError::NotAuthenticated(if secret.is_code() {
            "the receiver does not hold this code: check it (or someone in between changed the key agreement); nothing was sent".into()
        } else {
            "the receiver does not hold this key (or someone in between changed the key agreement); nothing was sent".into()
        }),
        AgreeError::Rejected(reason) => SessionError::NotAuthenticated(format!("the receiver refused: {reason}")),
        AgreeError::Version { .. } => SessionError::Incompatible(format!("the receiver: {e}")),
        other => SessionError::Agreement(other),
    })
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
}

impl Refusal {
    fn stray(reason: impl Into<String>) -> Refusal {
        Refusal {
            reason: reason.into(),
            code_try: false,
        }
    }
}

/// The receiver's side: answers the sender's offer (`first`, its first frame, and `hello`,
/// the second, already read) with a key from `keys`, and with the receiver's first sealed
/// frame right behind it in the same write (`answered` seals it with the keys' frame sealer,
/// and returns what it opened for it); then reads the sender's first sealed frame, all before
/// `deadline`. (One write: with Nagle's algorithm, a second small write would wait a round
/// trip for the first one's acknowledgement.)
pub fn answer<T>(
    stream: &mut TcpStream,
    keys: &Keyring,
    plain_data: bool,
    (first, hello): (&Control, &Control),
    deadline: Instant,
    answered: impl FnOnce(&mut FrameSeal) -> Result<(T, Vec<u8>), String>,
) -> Result<(Accepted, T), Refusal> {
    let id = secure::offered_key(first).map_err(|e| Refusal::stray(e.to_string()))?;
    let Some((name, secret)) = keys.find(id) else {
        let _ = write_frame(
            stream,
            &Control::Reject {
                reason: format!("this receiver does not know key {id}"),
            },
        );
        return Err(Refusal::stray(format!(
            "offered key {id}, which is not authorized here"
        )));
    };
    let code_try = secret.is_code();
    let failed = |reason: String| Refusal { reason, code_try };
    let (mut session, reply) = secure::answer(&secret, first, hello, plain_data)
        .map_err(|e| failed(format!("key agreement: {e}")))?;
    let (opened, sealed) = answered(&mut session.frames_out).map_err(Refusal::stray)?;
    let mut flight = reply.to_frame();
    flight.extend_from_slice(&sealed);
    stream
        .write_all(&flight)
        .map_err(|e| failed(describe(&ControlError::from(e), "left")))?;
    let answered = Instant::now();
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(failed("did not finish the key agreement in time".into()));
    }
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| failed(format!("socket: {e}")))?;
    let first = read_sealed(stream, &mut session.frames_in, left).map_err(|e| {
        failed(match e {
            ControlError::Closed => format!(
                "left after the key agreement: it does not hold this receiver's {}",
                if code_try { "code" } else { "key" }
            ),
            ControlError::Frame(FrameError::Unauthentic) => {
                "its first frame failed authentication".into()
            }
            other => describe(&other, "sent after the key agreement"),
        })
    })?;
    Ok((
        Accepted {
            keys: session,
            first,
            key_name: name,
            rtt: answered.elapsed(),
        },
        opened,
    ))
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
        answer(r, keys, false, (&first, &hello), deadline, answered).map(|(a, ())| a)
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

    #[test]
    fn the_right_code_opens_a_session_and_the_hello_is_read() {
        let (mut s, r) = pair();
        let rx = std::thread::spawn(move || receive(r, Keyring::code("12-a-b"), 5));
        let mut keys = offer(
            &mut s,
            &Secret::code("12-A-B"),
            false,
            &super::testing::hello(),
            Duration::from_secs(5),
        )
        .unwrap();
        s.write_all(&keys.frames_out.seal(&Control::KeepAlive))
            .unwrap();
        let got = rx.join().unwrap().unwrap();
        assert_eq!(got.first, Control::KeepAlive);
        assert_eq!(got.key_name, "code");
    }

    #[test]
    fn a_wrong_code_fails_on_both_sides_and_costs_a_try() {
        let (mut s, r) = pair();
        let rx = std::thread::spawn(move || receive(r, Keyring::code("12-a-b"), 5));
        let err = offer(
            &mut s,
            &Secret::code("12-a-c"),
            false,
            &super::testing::hello(),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(matches!(err, SessionError::NotAuthenticated(_)), "{err}");
        drop(s);
        let refusal = rx.join().unwrap().unwrap_err();
        assert!(refusal.code_try, "{refusal:?}");
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

    #[test]
    fn an_unknown_key_is_told_and_refused() {
        let ring = Keyring::default();
        ring.add("alice", Secret::key([1; 32]));
        let (mut s, r) = pair();
        let rx = std::thread::spawn(move || receive(r, ring, 5));
        let err = offer(
            &mut s,
            &Secret::key([2; 32]),
            false,
            &super::testing::hello(),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(err.to_string().contains("does not know key"), "{err}");
        assert!(!rx.join().unwrap().unwrap_err().code_try);
    }
}
