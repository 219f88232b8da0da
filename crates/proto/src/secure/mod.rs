//! Session security: the key agreement that opens every control connection, and the AEAD that
//! seals every control frame and data datagram after it.
//!
//! Both sides hold the same [`Secret`]: a code the receiver printed (`7431-purple-sausage-...`),
//! or a key from a key file (`hurtle key new`). Neither is ever sent. The sender's first frame
//! is [`Control::Agree`](crate::wire::Control::Agree) with a SPAKE2 message
//! ([`Offer`]); the receiver answers with its own and a confirmation ([`answer`]). Both derive
//! the [`SessionKeys`] from SPAKE2's output and a hash of both frames (HKDF-SHA256), one key per
//! direction and purpose. SPAKE2 is a balanced PAKE: whoever is on the path (a relay included)
//! learns nothing from the messages that lets it test a guess of the code offline, and a man in
//! the middle gets one guess per attempt, which the receiver counts.
//!
//! After the agreement:
//! - every control frame is sealed with AES-256-GCM ([`FrameSeal`], [`FrameOpen`]): the length
//!   prefix is associated data, the nonce is a per-direction counter, so a frame dropped,
//!   replayed, reordered or changed fails to open and ends the session;
//! - every data datagram (and every frame on a TCP data connection) is sealed ([`PacketSeal`],
//!   [`PacketOpen`]): the 28-byte header is associated data, the nonce is the header's channel
//!   and 48-bit packet number (unique per channel and key: [`PacketNumbers`] counts them up and
//!   never wraps, data below [`PROBE_PACKETS`] and probes from it, each a space of its own, and
//!   every sealer of a key refuses a number not above the highest it sealed:
//!   [`SealError::Reused`]), the key is that of the packet number's epoch (a new key every
//!   [`EPOCH_PACKETS`] numbers of a channel, well inside AES-GCM's confidentiality limit), the
//!   tag follows the payload, and a [`ReplayWindow`] per channel drops repeats. Anything that
//!   fails is dropped before it reaches the receiver's bookkeeping, and counted; past AES-GCM's
//!   integrity limit nothing opens and the session ends. With `--no-encryption` on both sides,
//!   data datagrams go in the clear, without a tag (control frames stay sealed, and every block
//!   is still checked against the sender's BLAKE3 values, which come sealed).
//!
//! The cipher is `ring`'s AES-256-GCM: on CPUs with AES-NI and VAES it seals more than twice
//! as fast per core as ChaCha20-Poly1305 (BENCHMARKS.md, section 8, has the figures).
//!
//! The ephemeral SPAKE2 scalar is drawn from the operating system's random source: the one
//! place where this crate reaches outside its arguments.

mod agree;
mod identity;
mod replay;
mod seal;

pub use agree::{answer, offered_key, AgreeError, KeyError, KeyId, Offer, Secret, SessionKeys};
pub use identity::{IdentityError, IdentityKey, ProofError, PublicId, Role};
pub use replay::{ReplayWindow, WINDOW as REPLAY_WINDOW};
pub use seal::{
    epoch_of, DataKey, FrameOpen, FrameSeal, OpenError, PacketNumbers, PacketOpen, PacketSeal,
    PacketsExhausted, SealError, CONFIDENTIALITY_LIMIT, EPOCH_PACKETS, INTEGRITY_LIMIT,
    PROBE_PACKETS, TAG_LEN,
};

/// The AEAD of every sealed frame and datagram.
pub(crate) static AEAD: &ring::aead::Algorithm = &ring::aead::AES_256_GCM;

/// A data datagram of channel 0, session 1, packet 1, file 0, carrying `payload`, sealed under
/// `key`: for tests of which keys open what, here and in other crates' tests
/// (`test-support`). Never in a release build.
#[cfg(any(test, feature = "test-support"))]
pub fn sealed_test_datagram(key: &DataKey, payload: &[u8]) -> Vec<u8> {
    use crate::wire::{Header, Kind, HEADER_LEN};
    let mut f = vec![0u8; HEADER_LEN + payload.len() + TAG_LEN];
    Header {
        kind: Kind::Data,
        flags: 0,
        channel: 0,
        session: 1,
        packet: 1,
        file: 0,
        offset: 0,
        len: u16::try_from(payload.len()).expect("a test payload fits a datagram"),
        sent_us: 0,
    }
    .encode(&mut f);
    f[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    key.sealer().seal(&mut f).expect("a new key seals");
    f
}

/// A sender's and a receiver's keys of one session, agreed on a code (for tests).
#[cfg(test)]
pub(crate) fn testing_keys() -> (SessionKeys, SessionKeys) {
    let secret = Secret::code("1-test-keys");
    let hello = crate::wire::Control::hello(0, 2, crate::wire::DEFAULT_PAYLOAD, 1 << 20, 7);
    let (offer, first) = Offer::new(&secret, false, &hello);
    let (receiver, reply) = answer(&secret, &first, &hello, false).expect("the receiver answers");
    let sender = offer.finish(reply).expect("the sender agrees");
    (sender, receiver)
}
