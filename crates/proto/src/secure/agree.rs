//! The key agreement: [`Secret`]s, the sender's [`Offer`], the receiver's [`answer`], and the
//! [`SessionKeys`] both derive.

use super::seal::{DataKey, FrameOpen, FrameSeal};
use crate::wire::{Control, MAGIC, VERSION};
use ring::{digest, hkdf, hmac};
use spake2::{Ed25519Group, Identity, Password, Spake2};
use std::fmt;

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

/// What both sides know and nobody else does: a code or a key. Never sent, never printed by
/// `Debug`.
#[derive(Clone)]
pub struct Secret {
    password: Vec<u8>,
    id: KeyId,
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
        }
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

enum Role {
    Sender,
    Receiver,
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
}

impl Derived {
    fn new(shared: &[u8], transcript: [&[u8]; 3]) -> Derived {
        let mut t = digest::Context::new(&digest::SHA256);
        for part in transcript {
            t.update(&(part.len() as u64).to_be_bytes());
            t.update(part);
        }
        let transcript = t.finish();
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript.as_ref()).extract(shared);
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, Kind, HEADER_LEN};

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

    fn sealed_datagram(key: &DataKey) -> Vec<u8> {
        let mut f = vec![0u8; HEADER_LEN + 4 + super::super::TAG_LEN];
        Header {
            kind: Kind::Data,
            flags: 0,
            channel: 0,
            session: 1,
            packet: 1,
            file: 0,
            offset: 0,
            len: 4,
            sent_us: 0,
        }
        .encode(&mut f);
        key.sealer().seal(&mut f).unwrap();
        f
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
        assert!(r.data.opener(0).open(&mut sealed_datagram(&s.data)).is_ok());
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
