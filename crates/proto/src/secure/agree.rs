//! The key agreement: [`Secret`]s, the sender's [`Offer`], the receiver's [`answer`], and the
//! [`SessionKeys`] both derive.

use super::identity::{self, IdentityKey, ProofError, PublicId, Role};
use super::seal::{DataKey, FrameOpen, FrameSeal};
use crate::wire::{Control, MAGIC, VERSION};
use ring::{digest, hkdf, hmac};
use spake2::{Ed25519Group, Identity, Password, Spake2};
use std::fmt;
use std::sync::Arc;

const SENDER_ID: &[u8] = b"hurtle sender";
const RECEIVER_ID: &[u8] = b"hurtle receiver";
const KEY_PREFIX: &str = "hurtle-key-";

/// Names which secret a sender uses, so a receiver with several keys knows which to try. Codes
/// all have [`KeyId::CODE`]: an id derived from a code would let anyone on the path test
/// guesses of it offline. A key's id is derived from the key (256 random bits), so it reveals
/// nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 8]);

impl KeyId {
    /// The id every code has.
    pub const CODE: KeyId = KeyId([0; 8]);
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// What a session is agreed on: a code or a key both sides know and nobody else does (never
/// sent, never printed by `Debug`); or, with no shared secret, a sender's identity key (the
/// sender's side: [`Secret::identity`]) and its public key (the receiver's side, one of the
/// senders it authorizes: [`Secret::authorized`]).
#[derive(Clone)]
pub struct Secret {
    password: Vec<u8>,
    id: KeyId,
    identity: Identified,
}

/// Whether a secret is shared, or an identity proven by signatures.
#[derive(Clone)]
enum Identified {
    /// A code or a key.
    Shared,
    /// The sender's own identity key.
    Own(Arc<IdentityKey>),
    /// An authorized sender's public key.
    Peer(PublicId),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}, ..)", self.id)
    }
}

/// Why a key's text is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// It does not start with the prefix.
    #[error("a hurtle key starts with {KEY_PREFIX:?} (made by `hurtle key new`)")]
    Prefix,
    /// The rest is not 64 hex digits.
    #[error("a hurtle key has 64 hex digits after {KEY_PREFIX:?}")]
    Digits,
}

impl Secret {
    /// A code, as a person typed it: case, surrounding space and the separators between its
    /// words (spaces or dashes) do not matter.
    pub fn code(code: &str) -> Secret {
        let words: Vec<String> = code
            .split(|c: char| c.is_whitespace() || c == '-')
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        Secret {
            password: words.join("-").into_bytes(),
            id: KeyId::CODE,
            identity: Identified::Shared,
        }
    }

    /// A 256-bit key.
    pub fn key(bytes: [u8; 32]) -> Secret {
        let derived = blake3::derive_key("hurtle key id v1", &bytes);
        let mut id = [0u8; 8];
        id.copy_from_slice(&derived[..8]);
        Secret {
            password: bytes.to_vec(),
            id: KeyId(id),
            identity: Identified::Shared,
        }
    }

    /// A sender's identity key: the session is agreed with no shared secret, and both sides
    /// prove their identity keys by signing its transcript. The receiver must list the key's
    /// public half ([`Secret::authorized`]).
    pub fn identity(key: Arc<IdentityKey>) -> Secret {
        let public = key.public();
        Secret {
            password: public.0.to_vec(),
            id: public.key_id(),
            identity: Identified::Own(key),
        }
    }

    /// A sender a receiver authorizes by its public key.
    pub fn authorized(public: PublicId) -> Secret {
        Secret {
            password: public.0.to_vec(),
            id: public.key_id(),
            identity: Identified::Peer(public),
        }
    }

    /// The sender's identity key, if this is one ([`Secret::identity`]).
    pub fn identity_key(&self) -> Option<&IdentityKey> {
        match &self.identity {
            Identified::Own(k) => Some(k),
            _ => None,
        }
    }

    /// The authorized sender's public key, if this is one ([`Secret::authorized`]).
    pub fn authorized_key(&self) -> Option<PublicId> {
        match &self.identity {
            Identified::Peer(p) => Some(*p),
            _ => None,
        }
    }

    /// Whether the session is agreed on identities (no shared secret): each side must then
    /// prove its identity key ([`SessionKeys::prove`], [`SessionKeys::check_peer`]).
    pub fn is_identity(&self) -> bool {
        !matches!(self.identity, Identified::Shared)
    }

    /// The text of a key, as `hurtle key new` prints it and key files hold it.
    pub fn key_text(bytes: &[u8; 32]) -> String {
        let mut s = String::from(KEY_PREFIX);
        for b in bytes {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parses [`key_text`](Self::key_text).
    pub fn parse_key(text: &str) -> Result<Secret, KeyError> {
        let hex = text
            .trim()
            .strip_prefix(KEY_PREFIX)
            .ok_or(KeyError::Prefix)?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError::Digits);
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| KeyError::Digits)?;
        }
        Ok(Secret::key(bytes))
    }

    /// Which secret this is.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Whether this is a code (low entropy: the receiver limits the attempts).
    pub fn is_code(&self) -> bool {
        self.id == KeyId::CODE
    }
}

/// Why the agreement failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgreeError {
    /// The peer's first message was another one.
    #[error("the peer opened with {0}, not hurtle's key agreement")]
    NotAgree(&'static str),
    /// Not hurtle's magic.
    #[error("the peer is not a hurtle peer")]
    Magic,
    /// Another protocol version.
    #[error("the peer speaks hurtle protocol version {theirs}; this build speaks {VERSION}")]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// The message is malformed.
    #[error("malformed key agreement: {0}")]
    Malformed(&'static str),
    /// The peer turned the session away.
    #[error("the peer refused: {0}")]
    Rejected(String),
    /// The peer does not hold the same secret (or someone in between changed the messages).
    #[error("the peer does not hold the same code or key")]
    WrongSecret,
}

/// The keys of one session, as one side holds them.
pub struct SessionKeys {
    /// Seals this side's control frames.
    pub frames_out: FrameSeal,
    /// Opens the peer's control frames.
    pub frames_in: FrameOpen,
    /// The data frames' key (sender to receiver), and the TCP data connections' greetings.
    pub data: DataKey,
    /// The key of the receiver's feedback datagrams (receiver to sender; see
    /// [`crate::feedback`]), sealed whether or not data is.
    pub feedback: DataKey,
    /// The key that tags hole-punching datagrams ([`crate::punch`]), the same on both sides.
    pub punch: [u8; 32],
    /// Whether data frames are sealed: false only when both sides asked for plain data.
    pub encrypt_data: bool,
    /// Which secret was used.
    pub key_id: KeyId,
    /// The SHA-256 of the agreement's transcript (both `Agree` frames and the hello): what an
    /// identity proof signs.
    transcript: [u8; 32],
    role: Role,
}

impl SessionKeys {
    /// This side's proof of `key` in this session: a `Control::Identify` to send sealed.
    pub fn prove(&self, key: &IdentityKey) -> Control {
        key.prove(self.role, &self.transcript)
    }

    /// Checks the peer's `Control::Identify` (opened from a sealed frame): that it signs this
    /// session's transcript in the peer's role, and, if `expected` is given, with that key.
    /// Returns the key it proved.
    pub fn check_peer(
        &self,
        msg: &Control,
        expected: Option<PublicId>,
    ) -> Result<PublicId, ProofError> {
        let proved = identity::verify_peer(msg, self.role, &self.transcript)?;
        match expected {
            Some(e) if e != proved => Err(ProofError::OtherKey(proved)),
            _ => Ok(proved),
        }
    }
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionKeys")
            .field("encrypt_data", &self.encrypt_data)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The sender's half of an agreement in progress.
pub struct Offer {
    spake: Spake2<Ed25519Group>,
    body: Vec<u8>,
    hello: Vec<u8>,
    secret_id: KeyId,
}

impl Offer {
    /// Starts the agreement: the state to keep, and the `Agree` frame to send first, with
    /// `hello` (sent in the clear right behind it) bound into the keys: a hello changed on the
    /// way fails the receiver's confirmation.
    pub fn new(secret: &Secret, plain_data: bool, hello: &Control) -> (Offer, Control) {
        let (spake, pake) = Spake2::<Ed25519Group>::start_a(
            &Password::new(&secret.password),
            &Identity::new(SENDER_ID),
            &Identity::new(RECEIVER_ID),
        );
        let msg = Control::Agree {
            magic: MAGIC,
            version: VERSION,
            key_id: secret.id.0,
            pake,
            confirm: Vec::new(),
            plain_data,
        };
        let body = body_of(&msg);
        (
            Offer {
                spake,
                body,
                hello: body_of(hello),
                secret_id: secret.id,
            },
            msg,
        )
    }

    /// Finishes with the receiver's answer: the keys, once the receiver proved it derived them.
    pub fn finish(self, reply: Control) -> Result<SessionKeys, AgreeError> {
        let (pake, confirm, theirs_plain) = match reply {
            Control::Reject { reason } => return Err(AgreeError::Rejected(reason)),
            Control::Agree {
                magic,
                version,
                pake,
                confirm,
                plain_data,
                ..
            } => {
                check_header(magic, version)?;
                (pake, confirm, plain_data)
            }
            other => return Err(AgreeError::NotAgree(other.name())),
        };
        let reply_body = body_of(&unconfirmed(&pake, theirs_plain));
        let shared = self
            .spake
            .finish(&pake)
            .map_err(|_| AgreeError::Malformed("SPAKE2 message"))?;
        let ours_plain = offered_plain(&self.body);
        let keys = Derived::new(&shared, [&self.body, &self.hello, &reply_body]);
        hmac::verify(&keys.confirm, b"receiver", &confirm).map_err(|_| AgreeError::WrongSecret)?;
        Ok(keys.into_session(Role::Sender, !(ours_plain && theirs_plain), self.secret_id))
    }
}

/// The receiver's half: checks the sender's `Agree` (`offer`, and the `hello` that came in
/// the clear behind it) against `secret` and returns the keys and the `Agree` frame to answer
/// with. Look the secret up by the offer's key id first ([`offered_key`]).
pub fn answer(
    secret: &Secret,
    offer: &Control,
    hello: &Control,
    plain_data: bool,
) -> Result<(SessionKeys, Control), AgreeError> {
    let (key_id, pake, theirs_plain) = offered(offer)?;
    if KeyId(key_id) != secret.id {
        return Err(AgreeError::WrongSecret);
    }
    let (spake, ours) = Spake2::<Ed25519Group>::start_b(
        &Password::new(&secret.password),
        &Identity::new(SENDER_ID),
        &Identity::new(RECEIVER_ID),
    );
    let shared = spake
        .finish(pake)
        .map_err(|_| AgreeError::Malformed("SPAKE2 message"))?;
    let reply_body = body_of(&unconfirmed(&ours, plain_data));
    let keys = Derived::new(&shared, [&body_of(offer), &body_of(hello), &reply_body]);
    let confirm = hmac::sign(&keys.confirm, b"receiver").as_ref().to_vec();
    let reply = Control::Agree {
        magic: MAGIC,
        version: VERSION,
        key_id,
        pake: ours,
        confirm,
        plain_data,
    };
    Ok((
        keys.into_session(Role::Receiver, !(plain_data && theirs_plain), secret.id),
        reply,
    ))
}

/// The key id a sender's first frame names, after checking it is an `Agree` of this version.
pub fn offered_key(offer: &Control) -> Result<KeyId, AgreeError> {
    offered(offer).map(|(id, _, _)| KeyId(id))
}

fn offered(offer: &Control) -> Result<([u8; 8], &[u8], bool), AgreeError> {
    match offer {
        Control::Agree {
            magic,
            version,
            key_id,
            pake,
            confirm,
            plain_data,
        } => {
            check_header(*magic, *version)?;
            if !confirm.is_empty() {
                return Err(AgreeError::Malformed(
                    "a sender's offer carries no confirmation",
                ));
            }
            Ok((*key_id, pake, *plain_data))
        }
        Control::Hello { magic, version, .. } if *magic == MAGIC => {
            Err(AgreeError::Version { theirs: *version })
        }
        other => Err(AgreeError::NotAgree(other.name())),
    }
}

fn check_header(magic: [u8; 4], version: u16) -> Result<(), AgreeError> {
    if magic != MAGIC {
        return Err(AgreeError::Magic);
    }
    if version != VERSION {
        return Err(AgreeError::Version { theirs: version });
    }
    Ok(())
}

/// The receiver's `Agree` without its confirmation: what the transcript covers.
fn unconfirmed(pake: &[u8], plain_data: bool) -> Control {
    Control::Agree {
        magic: MAGIC,
        version: VERSION,
        key_id: [0; 8],
        pake: pake.to_vec(),
        confirm: Vec::new(),
        plain_data,
    }
}

fn offered_plain(body: &[u8]) -> bool {
    matches!(
        Control::from_body(body),
        Ok(Control::Agree {
            plain_data: true,
            ..
        })
    )
}

fn body_of(msg: &Control) -> Vec<u8> {
    msg.to_frame().split_off(4)
}

/// The keys derived from SPAKE2's output, salted with the hash of both `Agree` frames and the
/// sender's hello.
struct Derived {
    control_s2r: [u8; 32],
    control_r2s: [u8; 32],
    data_s2r: [u8; 32],
    feedback_r2s: [u8; 32],
    punch: [u8; 32],
    confirm: hmac::Key,
    transcript: [u8; 32],
}

impl Derived {
    fn new(shared: &[u8], transcript: [&[u8]; 3]) -> Derived {
        let mut t = digest::Context::new(&digest::SHA256);
        for part in transcript {
            t.update(&(part.len() as u64).to_be_bytes());
            t.update(part);
        }
        let digest = t.finish();
        let transcript = digest.as_ref();
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript).extract(shared);
        let expand = |label: &[u8]| {
            let mut out = [0u8; 32];
            // 32 bytes is HKDF_SHA256's own length: expand and fill cannot fail.
            if let Ok(okm) = prk.expand(&[b"hurtle v9 ", label], hkdf::HKDF_SHA256) {
                let _ = okm.fill(&mut out);
            }
            out
        };
        Derived {
            control_s2r: expand(b"control sender to receiver"),
            control_r2s: expand(b"control receiver to sender"),
            data_s2r: expand(b"data sender to receiver"),
            feedback_r2s: expand(b"feedback receiver to sender"),
            punch: expand(b"hole punching"),
            confirm: hmac::Key::new(hmac::HMAC_SHA256, &expand(b"receiver confirms")),
            transcript: transcript.try_into().unwrap_or([0; 32]),
        }
    }

    fn into_session(self, role: Role, encrypt_data: bool, key_id: KeyId) -> SessionKeys {
        let (out, inn) = match role {
            Role::Sender => (&self.control_s2r, &self.control_r2s),
            Role::Receiver => (&self.control_r2s, &self.control_s2r),
        };
        SessionKeys {
            frames_out: FrameSeal::new(out),
            frames_in: FrameOpen::new(inn),
            data: DataKey::new(&self.data_s2r),
            feedback: DataKey::new(&self.feedback_r2s),
            punch: self.punch,
            encrypt_data,
            key_id,
            transcript: self.transcript,
            role,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure::sealed_test_datagram;

    fn agree(
        sender: &Secret,
        receiver: &Secret,
        plain: (bool, bool),
    ) -> Result<(SessionKeys, SessionKeys), AgreeError> {
        let (offer, first) = Offer::new(sender, plain.0, &hello());
        let (r, reply) = answer(receiver, &first, &hello(), plain.1)?;
        let s = offer.finish(reply)?;
        Ok((s, r))
    }

    fn hello() -> Control {
        Control::hello(0, 4, crate::wire::DEFAULT_PAYLOAD, 1 << 20, 7)
    }

    #[test]
    fn the_same_code_gives_both_sides_the_same_keys() {
        let (mut s, mut r) = agree(
            &Secret::code("4821-Purple-sausage"),
            &Secret::code(" 4821 purple SAUSAGE "),
            (false, false),
        )
        .unwrap();
        let frame = s.frames_out.seal(&Control::Done);
        let got = r
            .frames_in
            .open(frame[..4].try_into().unwrap(), frame[4..].to_vec())
            .unwrap();
        assert_eq!(got, Control::Done);
        let back = r.frames_out.seal(&Control::KeepAlive);
        assert_eq!(
            s.frames_in
                .open(back[..4].try_into().unwrap(), back[4..].to_vec())
                .unwrap(),
            Control::KeepAlive
        );
        assert!(r
            .data
            .opener(0)
            .open(&mut sealed_test_datagram(&s.data, &[0; 4]))
            .is_ok());
        assert!(s.encrypt_data && r.encrypt_data);
    }

    #[test]
    fn a_wrong_code_is_caught_by_the_sender_before_it_sends_anything_sealed() {
        let err = agree(
            &Secret::code("4821-purple-sausage"),
            &Secret::code("4821-purple-sausages"),
            (false, false),
        )
        .unwrap_err();
        assert_eq!(err, AgreeError::WrongSecret);
    }

    #[test]
    fn a_changed_agree_frame_fails_the_confirmation() {
        let secret = Secret::code("1-a-b");
        let (offer, mut first) = Offer::new(&secret, false, &hello());
        // Someone in between says the sender wants plain data.
        if let Control::Agree { plain_data, .. } = &mut first {
            *plain_data = true;
        }
        let (_, reply) = answer(&secret, &first, &hello(), true).unwrap();
        assert_eq!(offer.finish(reply).unwrap_err(), AgreeError::WrongSecret);
    }

    #[test]
    fn a_changed_hello_fails_the_confirmation() {
        let secret = Secret::code("1-a-b");
        let (offer, first) = Offer::new(&secret, false, &hello());
        // Someone in between asks for one channel instead of four.
        let mut changed = hello();
        if let Control::Hello { channels, .. } = &mut changed {
            *channels = 1;
        }
        let (_, reply) = answer(&secret, &first, &changed, false).unwrap();
        assert_eq!(offer.finish(reply).unwrap_err(), AgreeError::WrongSecret);
    }

    #[test]
    fn data_is_plain_only_when_both_sides_ask() {
        let k = Secret::code("9-x-y");
        for (plain, want) in [
            ((false, false), true),
            ((true, false), true),
            ((false, true), true),
            ((true, true), false),
        ] {
            let (s, r) = agree(&k, &k, plain).unwrap();
            assert_eq!((s.encrypt_data, r.encrypt_data), (want, want), "{plain:?}");
        }
    }

    #[test]
    fn keys_have_ids_codes_do_not() {
        let a = Secret::key([1; 32]);
        let text = Secret::key_text(&[1; 32]);
        assert_eq!(
            Secret::parse_key(&format!("  {text}\n")).unwrap().id(),
            a.id()
        );
        assert_ne!(a.id(), KeyId::CODE);
        assert_ne!(a.id(), Secret::key([2; 32]).id());
        assert_eq!(Secret::code("1-a-b").id(), KeyId::CODE);
        assert_eq!(
            Secret::parse_key("hurtle-key-12").unwrap_err(),
            KeyError::Digits
        );
        assert_eq!(
            Secret::parse_key("ssh-ed25519 AAAA").unwrap_err(),
            KeyError::Prefix
        );
        let (s, r) = agree(&a, &a, (false, false)).unwrap();
        assert_eq!(s.key_id, r.key_id);
        assert!(matches!(
            answer(
                &Secret::key([2; 32]),
                &Offer::new(&a, false, &hello()).1,
                &hello(),
                false
            ),
            Err(AgreeError::WrongSecret)
        ));
    }

    #[test]
    fn hellos_and_strangers_are_told_apart() {
        let old = Control::Hello {
            magic: MAGIC,
            version: 5,
            caps: 0,
            channels: 1,
            payload: 1384,
            block_size: 1 << 20,
            session: 1,
        };
        assert_eq!(offered_key(&old), Err(AgreeError::Version { theirs: 5 }));
        assert_eq!(
            offered_key(&Control::KeepAlive),
            Err(AgreeError::NotAgree("KeepAlive"))
        );
        let (_, mut first) = Offer::new(&Secret::code("1-a-b"), false, &hello());
        if let Control::Agree { version, .. } = &mut first {
            *version = 99;
        }
        assert_eq!(offered_key(&first), Err(AgreeError::Version { theirs: 99 }));
    }

    /// An agreement of a sender with identity `sender` and a receiver that authorizes `auth`.
    fn identified(
        sender: &Arc<IdentityKey>,
        auth: PublicId,
    ) -> Result<(SessionKeys, SessionKeys), AgreeError> {
        agree(
            &Secret::identity(sender.clone()),
            &Secret::authorized(auth),
            (false, false),
        )
    }

    #[test]
    fn identities_agree_without_a_shared_secret_and_each_proof_checks() {
        let alice = Arc::new(IdentityKey::from_seed([7; 32]));
        let bob = IdentityKey::from_seed([8; 32]);
        let (s, r) = identified(&alice, alice.public()).unwrap();
        assert_eq!(s.key_id, alice.public().key_id());
        // The receiver (bob) proves itself to the sender, the sender (alice) to the receiver.
        assert_eq!(s.check_peer(&r.prove(&bob), None), Ok(bob.public()));
        assert_eq!(
            r.check_peer(&s.prove(&alice), Some(alice.public())),
            Ok(alice.public())
        );
        // Proven with another key than the one the sender offered.
        let mallory = IdentityKey::from_seed([9; 32]);
        assert_eq!(
            r.check_peer(&s.prove(&mallory), Some(alice.public())),
            Err(ProofError::OtherKey(mallory.public()))
        );
        // A side's proof never passes as the other side's (reflected back to its signer).
        assert_eq!(
            s.check_peer(&s.prove(&alice), None),
            Err(ProofError::Forged(alice.public()))
        );
        assert_eq!(
            s.check_peer(&Control::KeepAlive, None),
            Err(ProofError::Missing("KeepAlive"))
        );
        // Fresh keys every session, though nothing secret is shared.
        let (s2, _) = identified(&alice, alice.public()).unwrap();
        assert_ne!(s.transcript, s2.transcript);
        assert_ne!(s.punch, s2.punch);
    }

    #[test]
    fn a_proof_from_another_session_fails_replayed_or_relayed() {
        let alice = Arc::new(IdentityKey::from_seed([7; 32]));
        let bob = IdentityKey::from_seed([8; 32]);
        let (s1, r1) = identified(&alice, alice.public()).unwrap();
        let (s2, r2) = identified(&alice, alice.public()).unwrap();
        // Replayed: session 1's proofs, shown in session 2.
        assert_eq!(
            s2.check_peer(&r1.prove(&bob), None),
            Err(ProofError::Forged(bob.public()))
        );
        assert_eq!(
            r2.check_peer(&s1.prove(&alice), Some(alice.public())),
            Err(ProofError::Forged(alice.public()))
        );
        // Relayed by a man in the middle, who runs one agreement with the sender (posing as
        // the receiver) and one with the receiver (posing as the sender): each side's proof,
        // passed on to the other, signs the other agreement's transcript.
        let (offer, first) = Offer::new(&Secret::identity(alice.clone()), false, &hello());
        let (m_as_receiver, to_sender) =
            answer(&Secret::authorized(alice.public()), &first, &hello(), false).unwrap();
        let sender = offer.finish(to_sender).unwrap();
        // Alice's public key is all it needs to agree with the receiver as her.
        let (m_offer, m_first) = Offer::new(&Secret::authorized(alice.public()), false, &hello());
        let (receiver, to_mitm) = answer(
            &Secret::authorized(alice.public()),
            &m_first,
            &hello(),
            false,
        )
        .unwrap();
        let m_as_sender = m_offer.finish(to_mitm).unwrap();
        // But each side's proof, passed on, fails on the other side.
        assert_eq!(
            sender.check_peer(&receiver.prove(&bob), None),
            Err(ProofError::Forged(bob.public()))
        );
        assert_eq!(
            receiver.check_peer(&sender.prove(&alice), Some(alice.public())),
            Err(ProofError::Forged(alice.public()))
        );
        // What it can sign is its own key: the sender then sees that key (and pins or
        // refuses it), and the receiver refuses it for alice.
        let m_key = IdentityKey::from_seed([10; 32]);
        assert_eq!(
            sender.check_peer(&m_as_receiver.prove(&m_key), None),
            Ok(m_key.public())
        );
        assert_eq!(
            receiver.check_peer(&m_as_sender.prove(&m_key), Some(alice.public())),
            Err(ProofError::OtherKey(m_key.public()))
        );
    }

    #[test]
    fn identity_texts_round_trip_and_bad_ones_are_errors() {
        let k = IdentityKey::from_seed([3; 32]);
        let again = IdentityKey::parse(&format!(" {}\n", k.secret_text())).unwrap();
        assert_eq!(again.public(), k.public());
        assert_eq!(PublicId::parse(&k.public().text()), Ok(k.public()));
        assert!(k.public().fingerprint().starts_with("SHA256:"));
        assert!(!format!("{k:?}").contains(&k.secret_text()[24..]));
        assert_eq!(
            IdentityKey::parse(&k.public().text()).unwrap_err(),
            crate::secure::IdentityError::SecretPrefix
        );
        assert_eq!(
            PublicId::parse("hurtle-id-abc").unwrap_err(),
            crate::secure::IdentityError::Digits
        );
        assert_ne!(
            IdentityKey::generate().public(),
            IdentityKey::generate().public()
        );
    }

    #[test]
    fn a_bad_spake_message_is_an_error_not_a_panic() {
        let secret = Secret::code("1-a-b");
        for pake in [vec![], vec![0u8; 33], vec![0xff; 200]] {
            let offer = Control::Agree {
                magic: MAGIC,
                version: VERSION,
                key_id: [0; 8],
                pake,
                confirm: vec![],
                plain_data: false,
            };
            assert!(answer(&secret, &offer, &hello(), false).is_err());
        }
    }
}
