//! Sealing and opening: control frames ([`FrameSeal`], [`FrameOpen`]) and data frames, the
//! datagrams and TCP data frames ([`PacketSeal`], [`PacketOpen`], made from a [`DataKey`]).
//!
//! A [`DataKey`] owns everything that keeps the data frames' AEAD inside its limits:
//! - **Key epochs.** No key seals more than [`EPOCH_PACKETS`] numbers of one channel: the key
//!   of a frame is derived (HKDF-SHA256) from the session's data secret and its *epoch*, its
//!   packet number divided by [`EPOCH_PACKETS`]. A channel thus moves to a new key every
//!   [`EPOCH_PACKETS`] frames, and one key seals at most 256 channels' worth of an epoch:
//!   2^22 frames, half of the 2^23 that RFC 9001 (section 6.6) allows AES-GCM
//!   ([`CONFIDENTIALITY_LIMIT`]). The packet number is in every header, so the receiver opens
//!   frames of the old and the new epoch alike while a switch is under way, in any order.
//! - **No nonce twice.** The nonce is the frame's channel and packet number; every sealer made
//!   from one key shares a record of the highest number sealed per channel and space (data,
//!   probes), and refuses, with [`SealError::Reused`], a number that is not above it. A channel
//!   restarted, renumbered, moved to TCP, or given to another thread can thus never seal a
//!   `(key, nonce)` pair twice: the session ends instead.
//! - **Keys derived for strangers.** An opener keeps the keys of the epochs around the newest
//!   it opened ([`NEAR_EPOCHS`] of them, from the oldest its replay window still takes to a few
//!   ahead), each derived once. A frame naming an epoch further ahead (a sender that ran far
//!   ahead while its frames were lost, or a forgery by anyone who saw the session id) has its
//!   key derived only if no other such key was derived in the last [`FAR_EVERY`] frames; else
//!   it is dropped unread ([`OpenError::Ahead`]). So forged frames make an opener derive at
//!   most one key per [`FAR_EVERY`] frames, whatever epochs they name.
//! - **Failed openings.** Every frame that fails authentication under any epoch's key is
//!   counted; past [`INTEGRITY_LIMIT`] (RFC 9001's 2^52 for AES-GCM) no frame opens any more
//!   ([`OpenError::IntegrityLimit`]) and the session must end.
//!
//! TCP data connections' greetings are tagged under a key of their own, with the session and
//! channel they name as the nonce ([`DataKey::greeting_tag`]).

use super::{ReplayWindow, AEAD};
use crate::wire::{nonce_fields, Control, FrameError, HEADER_LEN, MAX_PACKET};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use ring::hkdf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of the authentication tag after every sealed frame and datagram.
pub const TAG_LEN: usize = 16;
/// Packet numbers from here up are the probes' own (the sender's prober counts up from it),
/// so that a probe and a data datagram of one channel never share a nonce. Data counts up from
/// 1 below it ([`PacketNumbers`]).
pub const PROBE_PACKETS: u64 = 1 << 47;
/// Packet numbers of one channel sealed under one key: the key of packet number `pn` is that
/// of epoch `pn / EPOCH_PACKETS`.
pub const EPOCH_PACKETS: u64 = 1 << 14;
/// Frames one AES-GCM key may seal: RFC 9001, section 6.6 ("the confidentiality limit is 2^23
/// encrypted packets", for packets of up to 2^16 bytes; a TCP data frame is at most
/// 65,472 + 44 bytes, a datagram 8,944).
pub const CONFIDENTIALITY_LIMIT: u64 = 1 << 23;
/// Frames that may fail authentication under a session's data key, all epochs together: RFC
/// 9001, section 6.6 ("the integrity limit is 2^52 invalid packets" for AES-GCM).
pub const INTEGRITY_LIMIT: u64 = 1 << 52;
/// Epochs whose keys an opener keeps per space: from the oldest its replay window still takes
/// (4 epochs below the newest opened: [`REPLAY_WINDOW`](super::REPLAY_WINDOW) numbers) to 3
/// above it. Consecutive epochs have slots of their own (epoch modulo this), so frames of
/// these epochs, in any mix, never make an opener derive a key twice.
pub const NEAR_EPOCHS: u64 = 8;
/// Epochs of [`NEAR_EPOCHS`] below the newest opened.
const NEAR_BELOW: u64 = 4;
/// Frames an opener takes between two derivations of a key for an epoch beyond its near ones:
/// frames that name such epochs cost it at most one derivation per this many frames.
pub const FAR_EVERY: u64 = 64;
/// Channels a header names (one byte).
const CHANNELS: usize = 256;
// One epoch of every channel stays at half the confidentiality limit, and probes never share
// an epoch (a key) with data.
const _: () = assert!(EPOCH_PACKETS * CHANNELS as u64 <= CONFIDENTIALITY_LIMIT / 2);
const _: () = assert!(PROBE_PACKETS.is_multiple_of(EPOCH_PACKETS));
// Data below the probes, all within the header's 48 bits.
const _: () = assert!(PROBE_PACKETS < MAX_PACKET);
// The near epochs cover every epoch the replay window still takes.
const _: () = assert!(NEAR_BELOW * EPOCH_PACKETS >= super::replay::WINDOW);
const _: () = assert!(NEAR_BELOW < NEAR_EPOCHS);

/// The packet numbers of one space, counted up and never used twice: with the channel, a
/// packet number is the AEAD nonce, and a nonce used twice under one key breaks AES-GCM. A
/// channel's data datagrams (data and final markers) count 1, 2, 3, ... below
/// [`PROBE_PACKETS`] ([`PacketNumbers::data`]); the prober's probes count up from there, to
/// the top of the header's 48 bits ([`PacketNumbers::probes`]). When a space is used up,
/// [`next_number`](PacketNumbers::next_number) fails instead of wrapping, and the session must
/// end. (The sealers check it too: [`SealError::Reused`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketNumbers {
    /// The number used last; `start` while none was.
    last: u64,
    start: u64,
    /// The first number past the space.
    end: u64,
}

/// A space of packet numbers is used up ([`PacketNumbers::next_number`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the packet numbers of a channel are used up after {used} datagrams under this session's key (a number is never used twice: the session ends)")]
pub struct PacketsExhausted {
    /// How many numbers the space held, all used.
    pub used: u64,
}

impl PacketNumbers {
    /// A channel's data numbers, none used yet: 1 is the first, `PROBE_PACKETS - 1` the last.
    pub fn data() -> PacketNumbers {
        PacketNumbers {
            last: 0,
            start: 0,
            end: PROBE_PACKETS,
        }
    }

    /// The probes' numbers, none used yet: `PROBE_PACKETS + 1` is the first, the top of the
    /// header's 48 bits the last.
    pub fn probes() -> PacketNumbers {
        PacketNumbers {
            last: PROBE_PACKETS,
            start: PROBE_PACKETS,
            end: MAX_PACKET + 1,
        }
    }

    /// The number used last (where the space starts while none was).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The next number; an error, for good, once the space is used up.
    pub fn next_number(&mut self) -> Result<u64, PacketsExhausted> {
        let next = self.last + 1;
        if next >= self.end {
            return Err(PacketsExhausted {
                used: self.last - self.start,
            });
        }
        self.last = next;
        Ok(next)
    }
}

fn key_of(bytes: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is exactly what AES-256-GCM takes; `new` fails only on a wrong length.
    LessSafeKey::new(UnboundKey::new(AEAD, bytes).unwrap_or_else(|_| unreachable!()))
}

/// A frame's nonce: its channel and packet number (bytes 1 and 6..12 of the header,
/// [`nonce_fields`]).
fn packet_nonce(channel: u16, pn: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[2..4].copy_from_slice(&channel.to_be_bytes());
    n[4..].copy_from_slice(&pn.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The epoch (the key) of packet number `pn`.
pub fn epoch_of(pn: u64) -> u64 {
    pn / EPOCH_PACKETS
}

/// The highest packet number sealed on one channel, per space (data, probes); 0: none. A
/// cache line of its own: the channels' threads each write theirs on every seal.
#[repr(align(64))]
#[derive(Default)]
struct Sealed([AtomicU64; 2]);

/// What every sealer and opener of one data key shares.
struct Keyring {
    /// The data secret, extracted: each epoch's key is expanded from it.
    prk: hkdf::Prk,
    /// The greetings' key.
    greeting: LessSafeKey,
    /// Per channel, the highest packet number sealed in each space.
    sealed: Box<[Sealed]>,
    /// Frames that failed authentication under any epoch's key.
    failures: AtomicU64,
    /// [`INTEGRITY_LIMIT`], lower in tests.
    integrity_limit: u64,
}

impl Keyring {
    fn new(prk: hkdf::Prk, greeting: LessSafeKey) -> Keyring {
        Keyring {
            prk,
            greeting,
            sealed: (0..CHANNELS).map(|_| Sealed::default()).collect(),
            failures: AtomicU64::new(0),
            integrity_limit: INTEGRITY_LIMIT,
        }
    }

    /// The key of `epoch`.
    fn epoch_key(&self, epoch: u64) -> LessSafeKey {
        let epoch = epoch.to_be_bytes();
        let info: [&[u8]; 2] = [b"hurtle v15 data epoch", &epoch];
        // An AES-256 key is 32 bytes, far below what HKDF-SHA256 can expand to.
        let okm = self
            .prk
            .expand(&info, AEAD)
            .unwrap_or_else(|_| unreachable!());
        LessSafeKey::new(UnboundKey::from(okm))
    }

    /// Records that `pn` of `channel` is about to be sealed: an error if it, or a higher
    /// number of its space, was sealed before.
    fn claim(&self, channel: u16, pn: u64) -> Result<(), SealError> {
        let space = usize::from(pn >= PROBE_PACKETS);
        let Some(slot) = self.sealed.get(usize::from(channel)) else {
            return Err(SealError::Channel(channel));
        };
        let before = slot.0[space].fetch_max(pn, Ordering::AcqRel);
        if before >= pn {
            return Err(SealError::Reused {
                channel,
                packet: pn,
                sealed: before,
            });
        }
        Ok(())
    }
}

/// The current epoch's key of one sealer or opener, derived again when the epoch changes.
#[derive(Clone)]
struct EpochKey {
    epoch: u64,
    key: LessSafeKey,
}

impl EpochKey {
    fn get<'a>(slot: &'a mut Option<EpochKey>, ring: &Keyring, epoch: u64) -> &'a LessSafeKey {
        if slot.as_ref().is_some_and(|k| k.epoch != epoch) {
            *slot = None;
        }
        &slot
            .get_or_insert_with(|| EpochKey {
                epoch,
                key: ring.epoch_key(epoch),
            })
            .key
    }
}

/// The nonce of a TCP data connection's greeting: its first 12 bytes (4 zero bytes, the
/// session, the channel, 2 zero bytes; short ones padded with zeros). A greeting is those and
/// 4 more zero bytes, so one nonce only ever tags one greeting.
fn greeting_nonce(greeting: &[u8]) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    let len = greeting.len().min(NONCE_LEN);
    n[..len].copy_from_slice(&greeting[..len]);
    Nonce::assume_unique_for_key(n)
}

/// The key of the session's data frames (sender to receiver): the epochs' keys, the record of
/// the numbers sealed, the count of failed openings. Clones share all of it.
#[derive(Clone)]
pub struct DataKey(Arc<Keyring>);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// Why a data frame was not sealed. Each is a bug on the sending side, never peer input: the
/// session ends rather than send the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Too short to hold a header and a tag.
    #[error("a frame too short to seal")]
    Short,
    /// The header names a channel beyond the header's byte.
    #[error("a frame of channel {0}, beyond the header's 256")]
    Channel(u16),
    /// The channel's packet number was sealed before under this key (or a higher one was): its
    /// nonce would be used twice.
    #[error("packet number {packet} of channel {channel} is not above {sealed}, the highest already sealed under this session's key: a nonce is never used twice, the session ends")]
    Reused {
        /// The channel.
        channel: u16,
        /// The number refused.
        packet: u64,
        /// The highest number of its space sealed before.
        sealed: u64,
    },
}

impl DataKey {
    pub(crate) fn new(bytes: &[u8; 32]) -> DataKey {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"hurtle v15 data key").extract(bytes);
        let mut greeting = [0u8; 32];
        if let Ok(okm) = prk.expand(&[b"hurtle v15 greeting"], hkdf::HKDF_SHA256) {
            // 32 bytes is HKDF_SHA256's own length: fill cannot fail.
            let _ = okm.fill(&mut greeting);
        }
        DataKey(Arc::new(Keyring::new(prk, key_of(&greeting))))
    }

    /// This key with an integrity limit of `failures` instead of [`INTEGRITY_LIMIT`] (for
    /// tests: the real limit takes 2^52 forgeries). Only a key not yet shared changes.
    #[doc(hidden)]
    pub fn with_integrity_limit(mut self, failures: u64) -> DataKey {
        if let Some(ring) = Arc::get_mut(&mut self.0) {
            ring.integrity_limit = failures;
        }
        self
    }

    /// Frames that failed authentication under this key so far, all epochs and channels.
    pub fn failures(&self) -> u64 {
        self.0.failures.load(Ordering::Relaxed)
    }

    /// A sealer for any channel of the sending side.
    pub fn sealer(&self) -> PacketSeal {
        PacketSeal {
            ring: self.0.clone(),
            key: None,
            checked: true,
        }
    }

    /// A sealer that neither checks nor records its numbers in the key's record of numbers
    /// sealed: for a test proxy that seals frames of its own between another session's,
    /// whose numbers it keeps unique itself. Never in a release build.
    #[cfg(feature = "test-support")]
    pub fn sealer_unchecked(&self) -> PacketSeal {
        PacketSeal {
            checked: false,
            ..self.sealer()
        }
    }

    /// An opener for `channel` of the receiving side, with its own replay windows.
    pub fn opener(&self, channel: u16) -> PacketOpen {
        PacketOpen {
            ring: self.0.clone(),
            near: Default::default(),
            newest: [epoch_of(0), epoch_of(PROBE_PACKETS)],
            far: None,
            since_far: FAR_EVERY,
            derived: 0,
            channel,
            data: ReplayWindow::new(),
            probes: ReplayWindow::new(),
            dropped: 0,
        }
    }

    /// The tag that authenticates a TCP data connection's `greeting` (which names the session
    /// and channel), so that only the peer can open a data connection of the session.
    pub fn greeting_tag(&self, greeting: &[u8]) -> [u8; TAG_LEN] {
        let mut out = [0u8; TAG_LEN];
        if let Ok(tag) = self.0.greeting.seal_in_place_separate_tag(
            greeting_nonce(greeting),
            Aad::from(greeting),
            &mut [],
        ) {
            out.copy_from_slice(tag.as_ref());
        }
        out
    }

    /// Whether `tag` is [`greeting_tag`](Self::greeting_tag) of `greeting` (checked as an
    /// AEAD tag of nothing, in constant time).
    pub fn check_greeting(&self, greeting: &[u8], tag: &[u8]) -> bool {
        let Ok(tag) = ring::aead::Tag::try_from(tag) else {
            return false;
        };
        self.0
            .greeting
            .open_in_place_separate_tag(
                greeting_nonce(greeting),
                Aad::from(greeting),
                tag,
                &mut [],
                0..,
            )
            .is_ok()
    }
}

/// Seals data frames under their epoch's key: the header is associated data, the payload is
/// encrypted in place, the tag is written after it.
#[derive(Clone)]
pub struct PacketSeal {
    ring: Arc<Keyring>,
    key: Option<EpochKey>,
    /// Numbers are checked against, and recorded in, the key's record (always but in tests).
    checked: bool,
}

impl PacketSeal {
    /// Seals `frame`: a header, its payload, then [`TAG_LEN`] bytes of room that receive the
    /// tag. The nonce comes from the header: a `(channel, packet number)` sealed before under
    /// this key (by any of its sealers), or lower than one sealed before in its space, is
    /// refused ([`SealError::Reused`]) and the frame left as it was.
    pub fn seal(&mut self, frame: &mut [u8]) -> Result<(), SealError> {
        if frame.len() < HEADER_LEN + TAG_LEN {
            return Err(SealError::Short);
        }
        let (channel, pn) = nonce_fields(frame);
        if self.checked {
            self.ring.claim(channel, pn)?;
        }
        let key = EpochKey::get(&mut self.key, &self.ring, epoch_of(pn));
        let (head, rest) = frame.split_at_mut(HEADER_LEN);
        let (payload, tag_out) = rest.split_at_mut(rest.len() - TAG_LEN);
        // Sealing fails only for inputs of 64 GiB and more: a frame is at most 64 KiB.
        if let Ok(tag) =
            key.seal_in_place_separate_tag(packet_nonce(channel, pn), Aad::from(&*head), payload)
        {
            tag_out.copy_from_slice(tag.as_ref());
        }
        Ok(())
    }
}

/// Why a data frame was dropped before it was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Too short to hold a header and a tag.
    #[error("too short for a sealed frame")]
    Short,
    /// Its header names another channel than the socket or connection it came on.
    #[error("names another channel")]
    Misdirected,
    /// Its packet number was accepted before, or is too old to tell.
    #[error("replayed")]
    Replayed,
    /// It failed authentication: changed on the way, or forged.
    #[error("failed authentication")]
    Unauthentic,
    /// It names a key epoch more than 3 ahead of the newest its opener opened, while another
    /// such epoch's key was derived less than 64 frames ago: dropped unread.
    #[error("names a key epoch far ahead of those opened")]
    Ahead,
    /// More frames failed authentication under this session's key than AES-GCM's integrity
    /// limit allows: none opens any more, and the session must end.
    #[error("{failures} data frames failed authentication under this session's key, past the integrity limit of {limit}: the session ends")]
    IntegrityLimit {
        /// Frames that failed.
        failures: u64,
        /// The limit.
        limit: u64,
    },
}

/// Opens the sealed data frames of one channel.
pub struct PacketOpen {
    ring: Arc<Keyring>,
    /// Per space (data, probes), the keys of the near epochs, epoch modulo [`NEAR_EPOCHS`].
    /// (Boxed: they are kilobytes, and openers move into their links.)
    near: Box<[[Option<EpochKey>; NEAR_EPOCHS as usize]; 2]>,
    /// Per space, the newest epoch a frame opened in (where the space starts while none did).
    newest: [u64; 2],
    /// The key of the last epoch beyond the near ones that was derived.
    far: Option<EpochKey>,
    /// Frames that reached the key step since `far` was derived.
    since_far: u64,
    /// Keys derived so far.
    derived: u64,
    channel: u16,
    data: ReplayWindow,
    probes: ReplayWindow,
    /// Frames dropped so far, for any [`OpenError`].
    pub dropped: u64,
}

impl PacketOpen {
    /// Opens `frame` (header, ciphertext, tag) in place and returns the plain frame (header
    /// and payload) it holds. Cheap checks first: length, channel, replay window; the window
    /// moves only for frames that opened. Past the integrity limit, nothing opens.
    pub fn open<'a>(&mut self, frame: &'a mut [u8]) -> Result<&'a mut [u8], OpenError> {
        let r = self.try_open(frame);
        if r.is_err() {
            self.dropped += 1;
        }
        r
    }

    fn try_open<'a>(&mut self, frame: &'a mut [u8]) -> Result<&'a mut [u8], OpenError> {
        let failures = self.ring.failures.load(Ordering::Relaxed);
        if failures > self.ring.integrity_limit {
            return Err(OpenError::IntegrityLimit {
                failures,
                limit: self.ring.integrity_limit,
            });
        }
        if frame.len() < HEADER_LEN + TAG_LEN {
            return Err(OpenError::Short);
        }
        let (channel, pn) = nonce_fields(frame);
        if channel != self.channel {
            return Err(OpenError::Misdirected);
        }
        let space = usize::from(pn >= PROBE_PACKETS);
        let window = if space == 1 {
            &mut self.probes
        } else {
            &mut self.data
        };
        if !window.check(pn) {
            return Err(OpenError::Replayed);
        }
        let epoch = epoch_of(pn);
        let newest = self.newest[space];
        self.since_far = self.since_far.saturating_add(1);
        let key = if epoch + NEAR_BELOW >= newest && epoch < newest + NEAR_EPOCHS - NEAR_BELOW {
            // A near epoch: its slot holds it, or an epoch that is no longer near.
            let slot = &mut self.near[space][(epoch % NEAR_EPOCHS) as usize];
            if slot.as_ref().is_none_or(|k| k.epoch != epoch) {
                self.derived += 1;
            }
            EpochKey::get(slot, &self.ring, epoch)
        } else if epoch > newest {
            // Far ahead: derived only now and then, whoever names it.
            if self.far.as_ref().is_none_or(|k| k.epoch != epoch) {
                if self.since_far < FAR_EVERY {
                    return Err(OpenError::Ahead);
                }
                self.since_far = 0;
                self.derived += 1;
            }
            EpochKey::get(&mut self.far, &self.ring, epoch)
        } else {
            // Older than the replay window takes (it refused the number above).
            return Err(OpenError::Replayed);
        };
        let plain_len = frame.len() - TAG_LEN;
        let (head, rest) = frame.split_at_mut(HEADER_LEN);
        let (payload, tag) = rest.split_at_mut(plain_len - HEADER_LEN);
        let tag = ring::aead::Tag::try_from(&*tag).map_err(|_| OpenError::Short)?;
        let opened = key.open_in_place_separate_tag(
            packet_nonce(channel, pn),
            Aad::from(&*head),
            tag,
            payload,
            0..,
        );
        if opened.is_err() {
            let failures = self.ring.failures.fetch_add(1, Ordering::Relaxed) + 1;
            if failures > self.ring.integrity_limit {
                return Err(OpenError::IntegrityLimit {
                    failures,
                    limit: self.ring.integrity_limit,
                });
            }
            return Err(OpenError::Unauthentic);
        }
        window.accept(pn);
        if epoch > newest {
            self.newest[space] = epoch;
            if self.far.as_ref().is_some_and(|k| k.epoch == epoch) {
                // Near now: the far key moves to its slot.
                self.near[space][(epoch % NEAR_EPOCHS) as usize] = self.far.take();
            }
        }
        Ok(&mut frame[..plain_len])
    }
}

fn counter_nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Seals this side's control frames, in order.
pub struct FrameSeal {
    key: LessSafeKey,
    counter: u64,
}

impl FrameSeal {
    pub(crate) fn new(bytes: &[u8; 32]) -> FrameSeal {
        FrameSeal {
            key: key_of(bytes),
            counter: 0,
        }
    }

    /// The sealed frame of `msg`: a 4-byte big-endian length (associated data), the
    /// encrypted postcard encoding, the tag.
    pub fn seal(&mut self, msg: &Control) -> Vec<u8> {
        let mut frame = msg.to_frame();
        let len = (frame.len() - 4 + TAG_LEN) as u32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        let (prefix, body) = frame.split_at_mut(4);
        let nonce = counter_nonce(self.counter);
        self.counter += 1;
        // Sealing fails only for inputs of 64 GiB and more; a zero tag then fails to open.
        let mut tag = [0u8; TAG_LEN];
        if let Ok(t) = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(&*prefix), body)
        {
            tag.copy_from_slice(t.as_ref());
        }
        frame.extend_from_slice(&tag);
        frame
    }
}

/// Opens the peer's control frames, in order: a frame that is missing, repeated, reordered or
/// changed fails, and the session ends.
pub struct FrameOpen {
    key: LessSafeKey,
    counter: u64,
}

impl FrameOpen {
    pub(crate) fn new(bytes: &[u8; 32]) -> FrameOpen {
        FrameOpen {
            key: key_of(bytes),
            counter: 0,
        }
    }

    /// Opens a frame whose length prefix was `prefix` and whose bytes are `body`.
    pub fn open(&mut self, prefix: [u8; 4], mut body: Vec<u8>) -> Result<Control, FrameError> {
        let nonce = counter_nonce(self.counter);
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(prefix), &mut body)
            .map_err(|_| FrameError::Unauthentic)?;
        self.counter += 1;
        Control::from_body(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure::REPLAY_WINDOW;
    use crate::wire::{Header, Kind};
    use proptest::prelude::*;

    fn frame(channel: u16, pn: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HEADER_LEN + payload.len() + TAG_LEN];
        Header {
            kind: Kind::Data,
            flags: 0,
            channel,
            session: 7,
            packet: pn,
            file: 0,
            offset: 0,
            len: payload.len() as u16,
            sent_us: 0,
        }
        .encode(&mut f);
        f[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        f
    }

    #[test]
    fn a_sealed_frame_opens_once_and_hides_its_payload() {
        let key = DataKey::new(&[3; 32]);
        let mut f = frame(2, 10, b"marker marker marker");
        key.sealer().seal(&mut f).unwrap();
        assert!(!f.windows(6).any(|w| w == b"marker"));
        let mut open = key.opener(2);
        let mut again = f.clone();
        let plain = open.open(&mut f).unwrap();
        assert_eq!(&plain[HEADER_LEN..], b"marker marker marker");
        assert_eq!(open.open(&mut again), Err(OpenError::Replayed));
        assert_eq!(open.dropped, 1);
    }

    #[test]
    fn wrong_channel_wrong_key_and_truncation_are_dropped() {
        let key = DataKey::new(&[3; 32]);
        let mut f = frame(1, 1, b"abc");
        key.sealer().seal(&mut f).unwrap();
        assert_eq!(
            key.opener(2).open(&mut f.clone()),
            Err(OpenError::Misdirected)
        );
        let other = DataKey::new(&[4; 32]);
        assert_eq!(
            other.opener(1).open(&mut f.clone()),
            Err(OpenError::Unauthentic)
        );
        assert_eq!(
            key.opener(1).open(&mut f[..HEADER_LEN + 3]),
            Err(OpenError::Short)
        );
    }

    #[test]
    fn a_forged_datagram_does_not_move_the_window() {
        let key = DataKey::new(&[3; 32]);
        let mut open = key.opener(0);
        let mut forged = frame(0, 1_000_000, b"x");
        assert_eq!(open.open(&mut forged), Err(OpenError::Unauthentic));
        let mut real = frame(0, 5, b"y");
        key.sealer().seal(&mut real).unwrap();
        assert!(
            open.open(&mut real).is_ok(),
            "the forgery left the window at the start"
        );
    }

    #[test]
    fn probes_have_their_own_window() {
        let key = DataKey::new(&[3; 32]);
        let mut open = key.opener(0);
        let mut probe = frame(0, PROBE_PACKETS + 1, b"p");
        key.sealer().seal(&mut probe).unwrap();
        assert!(open.open(&mut probe).is_ok());
        let mut data = frame(0, 1, b"d");
        key.sealer().seal(&mut data).unwrap();
        assert!(
            open.open(&mut data).is_ok(),
            "data is not judged against probe numbers"
        );
    }

    #[test]
    fn greeting_tags_name_the_greeting() {
        let key = DataKey::new(&[3; 32]);
        let g = [1u8; 16];
        let tag = key.greeting_tag(&g);
        assert!(key.check_greeting(&g, &tag));
        let mut h = g;
        h[9] ^= 1;
        assert!(!key.check_greeting(&h, &tag));
        assert!(!DataKey::new(&[4; 32]).check_greeting(&g, &tag));
    }

    #[test]
    fn control_frames_open_in_order_only() {
        let mut seal = FrameSeal::new(&[9; 32]);
        let mut open = FrameOpen::new(&[9; 32]);
        let a = seal.seal(&Control::KeepAlive);
        let b = seal.seal(&Control::Done);
        let split =
            |f: &[u8]| -> ([u8; 4], Vec<u8>) { (f[..4].try_into().unwrap(), f[4..].to_vec()) };
        let (pb, bb) = split(&b);
        assert!(
            matches!(open.open(pb, bb), Err(FrameError::Unauthentic)),
            "b before a"
        );
        let (pa, ba) = split(&a);
        assert!(matches!(open.open(pa, ba), Ok(Control::KeepAlive)));
        let (pb, bb) = split(&b);
        assert!(matches!(open.open(pb, bb), Ok(Control::Done)));
    }

    proptest! {
        /// Any single bit flipped anywhere in a sealed datagram makes it fail to open.
        #[test]
        fn any_flipped_bit_is_caught(payload in proptest::collection::vec(any::<u8>(), 0..300), bit in any::<usize>()) {
            let key = DataKey::new(&[5; 32]);
            let mut f = frame(0, 3, &payload);
            key.sealer().seal(&mut f).unwrap();
            let bit = bit % (f.len() * 8);
            f[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(key.opener(0).open(&mut f).is_err());
        }

        /// Against a model: whatever the sealers of one key are asked to seal, in any order,
        /// a number seals exactly when it is above every number sealed before on its channel
        /// and in its space, so no `(channel, number)` is sealed twice; and everything sealed
        /// opens.
        #[test]
        fn no_nonce_is_sealed_twice(steps in proptest::collection::vec((0usize..3, 0u16..3, any::<bool>(), 1u64..3 * EPOCH_PACKETS), 1..200)) {
            let key = DataKey::new(&[6; 32]);
            let mut sealers = [key.sealer(), key.sealer(), key.clone().sealer()];
            let mut highest = std::collections::HashMap::new();
            let mut done = std::collections::HashSet::new();
            for (who, ch, probe, n) in steps {
                let pn = if probe { PROBE_PACKETS + n } else { n };
                let mut f = frame(ch, pn, b"p");
                let top = highest.entry((ch, probe)).or_insert(0u64);
                let fresh = pn > *top;
                prop_assert_eq!(sealers[who].seal(&mut f).is_ok(), fresh, "ch {} pn {}", ch, pn);
                if fresh {
                    *top = pn;
                    prop_assert!(done.insert((ch, pn)));
                    prop_assert!(key.opener(ch).open(&mut f).is_ok());
                }
            }
        }

        /// Whatever numbers forgeries name, in the data and the probes' spaces, and however
        /// they mix with a real sender's frames: every real frame opens, and the opener
        /// derives each near epoch's key once plus at most one key per [`FAR_EVERY`] frames.
        #[test]
        fn forgeries_cost_at_most_one_derivation_per_far_every_frames(
            steps in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u64..PROBE_PACKETS, 1u64..EPOCH_PACKETS), 1..400)
        ) {
            let key = DataKey::new(&[8; 32]);
            let mut seal = key.sealer();
            let mut open = key.opener(0);
            let mut pn = 0u64;
            let (mut frames, mut advanced) = (0u64, 0u64);
            for (real, probe, n, step) in steps {
                frames += 1;
                if real {
                    let before = epoch_of(pn);
                    pn += step;
                    advanced += epoch_of(pn) - before;
                    prop_assert!(open.open(&mut sealed(&mut seal, 0, pn, b"real")).is_ok(), "real {}", pn);
                } else {
                    let f = if probe { PROBE_PACKETS + n % (MAX_PACKET - PROBE_PACKETS) } else { n };
                    prop_assert!(open.open(&mut forged(f)).is_err());
                }
            }
            let bound = NEAR_EPOCHS + advanced + 1 + frames / FAR_EVERY + NEAR_EPOCHS;
            prop_assert!(open.derived <= bound, "{} derived, bound {}", open.derived, bound);
        }

        /// Nonces never repeat across the numbers a session uses: data from 1, probes from
        /// PROBE_PACKETS, per channel; and the nonce read back from an encoded header is the
        /// one of its channel and number.
        #[test]
        fn nonces_are_distinct(
            ch in 0u16..=255,
            a in 1u64..PROBE_PACKETS,
            b in PROBE_PACKETS + 1..=MAX_PACKET,
        ) {
            let n = |c: u16, p: u64| *packet_nonce(c, p).as_ref();
            prop_assert_ne!(n(ch, a), n(ch, b));
            prop_assert_ne!(n(ch, a), n(ch.wrapping_add(1), a));
            prop_assert_ne!(epoch_of(a), epoch_of(b), "data and probes never share a key");
            for pn in [a, b] {
                let f = frame(ch, pn, b"");
                prop_assert_eq!(nonce_fields(&f), (ch, pn));
            }
        }
    }

    /// Seals `frame(channel, pn, payload)` with `seal`.
    fn sealed(seal: &mut PacketSeal, channel: u16, pn: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = frame(channel, pn, payload);
        seal.seal(&mut f).expect("a new number seals");
        f
    }

    #[test]
    fn each_epoch_has_its_own_key_and_both_sides_of_a_switch_open() {
        let key = DataKey::new(&[3; 32]);
        // The same nonce and plaintext under two epochs' keys: different ciphertexts.
        let under = |epoch: u64| {
            let mut p = *b"same";
            let tag = key
                .0
                .epoch_key(epoch)
                .seal_in_place_separate_tag(packet_nonce(0, 1), Aad::empty(), &mut p)
                .unwrap();
            (p, tag.as_ref().to_vec())
        };
        assert_ne!(under(0), under(1));
        assert_eq!(under(1), under(1));
        // Frames on both sides of a switch, opened in another order than sealed.
        let mut seal = key.sealer();
        let pns = [
            EPOCH_PACKETS - 2,
            EPOCH_PACKETS - 1,
            EPOCH_PACKETS,
            EPOCH_PACKETS + 1,
        ];
        let mut frames: Vec<Vec<u8>> = pns
            .iter()
            .map(|&pn| sealed(&mut seal, 0, pn, b"x"))
            .collect();
        let mut open = key.opener(0);
        for i in [2, 0, 3, 1] {
            let plain = open.open(&mut frames[i]).expect("opens across the switch");
            assert_eq!(&plain[HEADER_LEN..], b"x");
        }
        // A frame sealed under its epoch's key does not open as another epoch's.
        let mut f = frame(0, 5, b"y");
        let tag = key.0.epoch_key(1).seal_in_place_separate_tag(
            packet_nonce(0, 5),
            Aad::from(&f[..HEADER_LEN]),
            &mut [],
        );
        let n = f.len();
        f[n - TAG_LEN..].copy_from_slice(tag.unwrap().as_ref());
        assert_eq!(key.opener(0).open(&mut f), Err(OpenError::Unauthentic));
    }

    /// A frame of channel 0 numbered `pn` that no sealer of the key made.
    fn forged(pn: u64) -> Vec<u8> {
        frame(0, pn, b"forged")
    }

    #[test]
    fn forgeries_naming_near_epochs_in_any_mix_derive_each_key_once() {
        let key = DataKey::new(&[3; 32]);
        let mut seal = key.sealer();
        let mut open = key.opener(0);
        let newest = 10 * EPOCH_PACKETS;
        open.open(&mut sealed(&mut seal, 0, newest, b"real"))
            .unwrap();
        let derived = open.derived;
        assert_eq!(derived, 1, "the real frame's epoch is derived once");
        // Every epoch from the oldest the replay window takes to 3 ahead, over and over.
        let near: Vec<u64> = (newest - REPLAY_WINDOW + 1..)
            .step_by(EPOCH_PACKETS as usize)
            .take(NEAR_EPOCHS as usize)
            .collect();
        assert_eq!(epoch_of(near[7]), epoch_of(newest) + 3);
        for round in 0..50 {
            for &pn in near.iter().rev() {
                assert_eq!(
                    open.open(&mut forged(pn + round)),
                    Err(OpenError::Unauthentic)
                );
            }
        }
        assert_eq!(open.derived, NEAR_EPOCHS, "one derivation per near epoch");
        open.open(&mut sealed(&mut seal, 0, newest + 1, b"real"))
            .expect("the real sender goes on");
        assert_eq!(open.derived, NEAR_EPOCHS);
    }

    #[test]
    fn a_sender_far_ahead_gets_its_key_while_forgeries_name_other_far_epochs() {
        let key = DataKey::new(&[3; 32]);
        let mut seal = key.sealer();
        let mut open = key.opener(0);
        open.open(&mut sealed(&mut seal, 0, 5, b"real")).unwrap();
        // The sender's frames were lost for 100 epochs; ten forgeries come for each of its
        // frames, each naming another epoch far ahead.
        let mut pn = 100 * EPOCH_PACKETS;
        let mut frames = 0u64;
        let mut far_epoch = 1000u64;
        let back = loop {
            assert!(frames < 11 * 20 * FAR_EVERY, "the sender never got its key");
            for _ in 0..10 {
                far_epoch += 1;
                let r = open
                    .open(&mut forged(far_epoch * EPOCH_PACKETS))
                    .map(|_| ());
                assert!(
                    matches!(r, Err(OpenError::Ahead | OpenError::Unauthentic)),
                    "{r:?}"
                );
                frames += 1;
            }
            pn += 1;
            frames += 1;
            if open.open(&mut sealed(&mut seal, 0, pn, b"real")).is_ok() {
                break frames;
            }
        };
        assert!(
            open.derived <= 2 + back / FAR_EVERY,
            "{} keys derived for {back} frames",
            open.derived
        );
        // Back in step: its next frames open without a key derived for them, the forgeries
        // still get at most one per FAR_EVERY frames.
        let derived = open.derived;
        for _ in 0..100 {
            pn += 1;
            open.open(&mut sealed(&mut seal, 0, pn, b"real"))
                .expect("near again");
            far_epoch += 1;
            assert!(open.open(&mut forged(far_epoch * EPOCH_PACKETS)).is_err());
        }
        assert!(
            open.derived <= derived + 200 / FAR_EVERY,
            "{}",
            open.derived
        );
        // A new opener of the channel (a TCP link after UDP) takes the far epoch at once.
        let mut fresh = key.opener(0);
        pn += 1;
        assert!(fresh.open(&mut sealed(&mut seal, 0, pn, b"real")).is_ok());
    }

    #[test]
    fn a_number_sealed_once_is_refused_by_every_sealer_of_the_key() {
        let key = DataKey::new(&[3; 32]);
        let (mut a, mut b) = (key.sealer(), key.clone().sealer());
        sealed(&mut a, 3, 10, b"first");
        let mut again = frame(3, 10, b"again");
        let before = again.clone();
        assert_eq!(
            b.seal(&mut again),
            Err(SealError::Reused {
                channel: 3,
                packet: 10,
                sealed: 10
            })
        );
        assert_eq!(again, before, "a refused frame is left as it was");
        assert!(matches!(
            b.seal(&mut frame(3, 9, b"")),
            Err(SealError::Reused { .. })
        ));
        assert!(SealError::Reused {
            channel: 3,
            packet: 9,
            sealed: 10
        }
        .to_string()
        .contains("never used twice"));
        // Other channels, the probes' space and another key go on.
        sealed(&mut b, 4, 10, b"");
        sealed(&mut b, 3, PROBE_PACKETS + 1, b"");
        sealed(&mut b, 3, 11, b"");
        sealed(&mut DataKey::new(&[4; 32]).sealer(), 3, 10, b"");
        assert_eq!(a.seal(&mut [0u8; HEADER_LEN]), Err(SealError::Short));
    }

    #[test]
    fn sealers_on_two_threads_never_seal_one_number_twice() {
        let key = DataKey::new(&[3; 32]);
        let run = |key: DataKey| {
            std::thread::spawn(move || {
                let mut seal = key.sealer();
                (1..=2000u64)
                    .filter(|&pn| seal.seal(&mut frame(0, pn, b"t")).is_ok())
                    .collect::<Vec<u64>>()
            })
        };
        let (a, b) = (run(key.clone()), run(key.clone()));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let mut all: Vec<u64> = a.iter().chain(&b).copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a number sealed by both threads");
        assert_eq!(all.last(), Some(&2000));
    }

    #[test]
    fn past_the_integrity_limit_nothing_opens() {
        let key = DataKey::new(&[3; 32]).with_integrity_limit(3);
        let mut open = key.opener(0);
        for pn in 1..=3 {
            assert_eq!(
                open.open(&mut frame(0, pn, b"forged")),
                Err(OpenError::Unauthentic)
            );
        }
        assert_eq!(key.failures(), 3);
        let past = Err(OpenError::IntegrityLimit {
            failures: 4,
            limit: 3,
        });
        assert_eq!(key.opener(1).open(&mut frame(1, 9, b"forged")), past);
        // Now not even an authentic frame, on any channel.
        let mut real = sealed(&mut key.sealer(), 0, 20, b"real");
        let err = open.open(&mut real).unwrap_err();
        assert!(matches!(err, OpenError::IntegrityLimit { .. }), "{err}");
        assert!(err.to_string().contains("integrity limit"));
    }

    #[test]
    fn packet_numbers_never_wrap_into_another_space() {
        let mut data = PacketNumbers::data();
        assert_eq!(
            (data.last(), data.next_number(), data.next_number()),
            (0, Ok(1), Ok(2))
        );
        // Near the end of the data numbers: the last is used, then none.
        let mut data = PacketNumbers {
            last: PROBE_PACKETS - 3,
            ..PacketNumbers::data()
        };
        assert_eq!(data.next_number(), Ok(PROBE_PACKETS - 2));
        assert_eq!(data.next_number(), Ok(PROBE_PACKETS - 1));
        let used_up = PacketsExhausted {
            used: PROBE_PACKETS - 1,
        };
        assert_eq!(data.next_number(), Err(used_up));
        assert_eq!(data.next_number(), Err(used_up), "for good");
        assert_eq!(data.last(), PROBE_PACKETS - 1);
        assert!(used_up.to_string().contains("used up"));
        // The probes' space stops at the top of the header's 48 bits.
        let mut probes = PacketNumbers::probes();
        assert_eq!(probes.next_number(), Ok(PROBE_PACKETS + 1));
        let mut probes = PacketNumbers {
            last: MAX_PACKET - 1,
            ..probes
        };
        assert_eq!(probes.next_number(), Ok(MAX_PACKET));
        assert_eq!(
            probes.next_number(),
            Err(PacketsExhausted {
                used: MAX_PACKET - PROBE_PACKETS
            })
        );
    }
}
