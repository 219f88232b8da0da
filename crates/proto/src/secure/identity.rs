//! Identity keys: a long-lived Ed25519 key pair ([`IdentityKey`]) per side, named by its
//! public half ([`PublicId`]), which proves itself in a session by signing the agreement's
//! transcript ([`Proof`]).
//!
//! A sender with an identity key and a receiver that lists its public key (an authorized
//! sender) share no secret: the agreement's SPAKE2 then runs on a public password (the
//! sender's public key), which makes it a plain ephemeral Diffie-Hellman exchange that gives
//! fresh session keys, and each side signs the hash of the agreement's transcript (both
//! `Agree` frames and the hello) with its role, in a sealed [`Control::Identify`] frame. A man
//! in the middle runs two agreements with two transcripts, so a signature it relays from one
//! does not verify in the other; and it cannot sign as either side. docs/identity.md argues it
//! in full.

use super::agree::KeyId;
use crate::wire::Control;
use ring::signature::{self, Ed25519KeyPair, KeyPair};
use std::fmt;

const SECRET_PREFIX: &str = "hurtle-identity-secret-";
const PUBLIC_PREFIX: &str = "hurtle-id-";
const PROOF_LABEL: &[u8] = b"hurtle identity proof v1\0";

/// Which side signs a proof: part of what is signed, so one side's proof never passes as the
/// other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that sends files and opens the agreement.
    Sender,
    /// The side that receives files and answers.
    Receiver,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Sender => b"sender",
            Role::Receiver => b"receiver",
        }
    }

    fn peer(self) -> Role {
        match self {
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        }
    }
}

/// Why an identity key's text is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A private key's text does not start with its prefix.
    #[error(
        "a hurtle identity key starts with {SECRET_PREFIX:?} (made by `hurtle keygen --identity`)"
    )]
    SecretPrefix,
    /// A public key's text does not start with its prefix.
    #[error(
        "a hurtle public key starts with {PUBLIC_PREFIX:?} (printed by `hurtle keygen --identity`)"
    )]
    PublicPrefix,
    /// The rest is not 64 hex digits.
    #[error("a hurtle identity key has 64 hex digits after its prefix")]
    Digits,
}

/// A side's long-lived identity: an Ed25519 key pair, kept in a private file. Never printed by
/// `Debug`.
pub struct IdentityKey {
    pair: Ed25519KeyPair,
    seed: [u8; 32],
}

impl fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdentityKey({})", self.public().fingerprint())
    }
}

impl IdentityKey {
    /// A key pair from its 32-byte seed.
    pub fn from_seed(seed: [u8; 32]) -> IdentityKey {
        // Any 32 bytes are an Ed25519 seed: this cannot fail.
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .unwrap_or_else(|_| unreachable!("every 32-byte seed is a key"));
        IdentityKey { pair, seed }
    }

    /// A new key pair, from the operating system's random source.
    pub fn generate() -> IdentityKey {
        let mut seed = [0u8; 32];
        // The system's random source does not fail on the systems hurtle runs on; if it did,
        // a key must not be made from zeros.
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .unwrap_or_else(|_| panic!("the system's random source failed"));
        IdentityKey::from_seed(seed)
    }

    /// The private key's text, as a key file holds it.
    pub fn secret_text(&self) -> String {
        format!("{SECRET_PREFIX}{}", hex(&self.seed))
    }

    /// Parses [`secret_text`](Self::secret_text).
    pub fn parse(text: &str) -> Result<IdentityKey, IdentityError> {
        let rest = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(IdentityError::SecretPrefix)?;
        Ok(IdentityKey::from_seed(unhex(rest)?))
    }

    /// The public half.
    pub fn public(&self) -> PublicId {
        let mut p = [0u8; 32];
        p.copy_from_slice(self.pair.public_key().as_ref());
        PublicId(p)
    }

    /// This side's proof in the session whose transcript hash is `transcript`.
    pub(crate) fn prove(&self, role: Role, transcript: &[u8; 32]) -> Control {
        let public = self.public();
        let sig = self.pair.sign(&signed(role, &public, transcript));
        Control::Identify {
            public: public.0,
            proof: sig.as_ref().to_vec(),
        }
    }
}

/// A side's public key: what a receiver lists to authorize a sender, and what a sender pins
/// for a receiver.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicId(pub [u8; 32]);

impl fmt::Debug for PublicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicId({})", self.fingerprint())
    }
}

impl fmt::Display for PublicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl PublicId {
    /// The public key's text, as authorized-keys and known-receivers files hold it.
    pub fn text(&self) -> String {
        format!("{PUBLIC_PREFIX}{}", hex(&self.0))
    }

    /// Parses [`text`](Self::text). (A key that is no point of the curve parses, and fails
    /// every verification.)
    pub fn parse(text: &str) -> Result<PublicId, IdentityError> {
        let rest = text
            .trim()
            .strip_prefix(PUBLIC_PREFIX)
            .ok_or(IdentityError::PublicPrefix)?;
        Ok(PublicId(unhex(rest)?))
    }

    /// A short form for people to compare: `SHA256:` and the first 16 bytes of the key's
    /// SHA-256, in hex.
    pub fn fingerprint(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, &self.0);
        format!("SHA256:{}", hex(&d.as_ref()[..16]))
    }

    /// The id a sender with this key names in its offer, so that the receiver finds the key
    /// among those it authorizes (and turns an unknown one away before it answers).
    pub fn key_id(&self) -> KeyId {
        let derived = blake3::derive_key("hurtle identity id v1", &self.0);
        let mut id = [0u8; 8];
        id.copy_from_slice(&derived[..8]);
        KeyId(id)
    }

    /// Checks a peer's `Identify` frame: it must come from `role`, and sign `transcript`.
    /// Returns the key it proved.
    pub(crate) fn verify(
        msg: &Control,
        role: Role,
        transcript: &[u8; 32],
    ) -> Result<PublicId, ProofError> {
        let Control::Identify { public, proof } = msg else {
            return Err(ProofError::Missing(msg.name()));
        };
        let id = PublicId(*public);
        signature::UnparsedPublicKey::new(&signature::ED25519, &id.0)
            .verify(&signed(role, &id, transcript), proof)
            .map_err(|_| ProofError::Forged(id))?;
        Ok(id)
    }
}

/// Why a peer's identity was not proven.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The peer sent another frame where its proof belongs.
    #[error("it sent {0} where its identity proof belongs")]
    Missing(&'static str),
    /// The signature does not verify over this session's transcript: made for another session
    /// (replayed or relayed by a man in the middle), or not by the key it names.
    #[error("its proof for {} does not sign this session (replayed or relayed from another session, or forged)", .0.fingerprint())]
    Forged(PublicId),
    /// The proof is good, but for another key than the one the peer named.
    #[error("it proved key {}, not the key it offered", .0.fingerprint())]
    OtherKey(PublicId),
}

/// Checks the proof of the peer of a side in `role` (a receiver checks a sender's).
pub(crate) fn verify_peer(
    msg: &Control,
    ours: Role,
    transcript: &[u8; 32],
) -> Result<PublicId, ProofError> {
    PublicId::verify(msg, ours.peer(), transcript)
}

fn signed(role: Role, public: &PublicId, transcript: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(PROOF_LABEL.len() + 8 + 64);
    m.extend_from_slice(PROOF_LABEL);
    m.extend_from_slice(role.label());
    m.push(0);
    m.extend_from_slice(&public.0);
    m.extend_from_slice(transcript);
    m
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<[u8; 32], IdentityError> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(IdentityError::Digits);
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| IdentityError::Digits)?;
    }
    Ok(out)
}
