//! Sealing and opening: control frames ([`FrameSeal`], [`FrameOpen`]) and data frames, the
//! datagrams and TCP data frames ([`PacketSeal`], [`PacketOpen`], made from a [`DataKey`]).

use super::{ReplayWindow, AEAD};
use crate::wire::{nonce_fields, Control, FrameError, HEADER_LEN, MAX_PACKET};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};

/// Bytes of the authentication tag after every sealed frame and datagram.
pub const TAG_LEN: usize = 16;
/// Packet numbers from here up are the probes' own (the sender's prober counts up from it),
/// so that a probe and a data datagram of one channel never share a nonce. Data counts up from
/// 1 below it ([`PacketNumbers`]).
pub const PROBE_PACKETS: u64 = 1 << 47;
/// The packet number in the nonce of a TCP data connection's greeting tag, the last of the
/// header's 48 bits; no datagram uses it.
const GREETING_PACKET: u64 = MAX_PACKET;
// Data below the probes, the probes below the greeting, all within the header's 48 bits.
const _: () = assert!(PROBE_PACKETS < GREETING_PACKET && GREETING_PACKET <= MAX_PACKET);

/// The packet numbers of one space, counted up and never used twice: with the channel, a
/// packet number is the AEAD nonce, and a nonce used twice under one key breaks AES-GCM. A
/// channel's data datagrams (data and final markers) count 1, 2, 3, ... below
/// [`PROBE_PACKETS`] ([`PacketNumbers::data`]); the prober's probes count up from there, below
/// the greeting's number ([`PacketNumbers::probes`]). When a space is used up,
/// [`next_number`](PacketNumbers::next_number) fails instead of wrapping, and the session must
/// end.
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

    /// The probes' numbers, none used yet: `PROBE_PACKETS + 1` is the first, the one below
    /// the greeting's the last.
    pub fn probes() -> PacketNumbers {
        PacketNumbers {
            last: PROBE_PACKETS,
            start: PROBE_PACKETS,
            end: GREETING_PACKET,
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

/// The key of the session's data frames (sender to receiver). Clone it for each channel.
#[derive(Clone)]
pub struct DataKey(LessSafeKey);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    pub(crate) fn new(bytes: &[u8; 32]) -> DataKey {
        DataKey(key_of(bytes))
    }

    /// A sealer for any channel of the sending side.
    pub fn sealer(&self) -> PacketSeal {
        PacketSeal(self.0.clone())
    }

    /// An opener for `channel` of the receiving side, with its own replay windows.
    pub fn opener(&self, channel: u16) -> PacketOpen {
        PacketOpen {
            key: self.0.clone(),
            channel,
            data: ReplayWindow::new(),
            probes: ReplayWindow::new(),
            dropped: 0,
        }
    }

    /// The tag that authenticates a TCP data connection's `greeting` (which names the session
    /// and channel), so that only the peer can open a data connection of the session.
    pub fn greeting_tag(&self, greeting: &[u8]) -> [u8; TAG_LEN] {
        let channel = match greeting {
            [_, _, _, _, _, _, _, _, a, b, ..] => u16::from_be_bytes([*a, *b]),
            _ => 0,
        };
        let mut out = [0u8; TAG_LEN];
        if let Ok(tag) = self.0.seal_in_place_separate_tag(
            packet_nonce(channel, GREETING_PACKET),
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
        let channel = match greeting {
            [_, _, _, _, _, _, _, _, a, b, ..] => u16::from_be_bytes([*a, *b]),
            _ => 0,
        };
        let Ok(tag) = ring::aead::Tag::try_from(tag) else {
            return false;
        };
        self.0
            .open_in_place_separate_tag(
                packet_nonce(channel, GREETING_PACKET),
                Aad::from(greeting),
                tag,
                &mut [],
                0..,
            )
            .is_ok()
    }
}

/// Seals data frames: the header is associated data, the payload is encrypted in place, the
/// tag is written after it.
#[derive(Clone)]
pub struct PacketSeal(LessSafeKey);

impl PacketSeal {
    /// Seals `frame`: a header, its payload, then [`TAG_LEN`] bytes of room that receive the
    /// tag. The nonce comes from the header, so each `(channel, packet number)` must be sealed
    /// once only: the channel workers and the prober count their numbers with
    /// [`PacketNumbers`].
    pub fn seal(&self, frame: &mut [u8]) {
        if frame.len() < HEADER_LEN + TAG_LEN {
            return;
        }
        let (head, rest) = frame.split_at_mut(HEADER_LEN);
        let (payload, tag_out) = rest.split_at_mut(rest.len() - TAG_LEN);
        let (channel, pn) = nonce_fields(head);
        if let Ok(tag) =
            self.0
                .seal_in_place_separate_tag(packet_nonce(channel, pn), Aad::from(&*head), payload)
        {
            tag_out.copy_from_slice(tag.as_ref());
        }
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
}

/// Opens the sealed data frames of one channel.
pub struct PacketOpen {
    key: LessSafeKey,
    channel: u16,
    data: ReplayWindow,
    probes: ReplayWindow,
    /// Frames dropped so far, for any [`OpenError`].
    pub dropped: u64,
}

impl PacketOpen {
    /// Opens `frame` (header, ciphertext, tag) in place and returns the plain frame (header
    /// and payload) it holds. Cheap checks first: length, channel, replay window; the window
    /// moves only for frames that opened.
    pub fn open<'a>(&mut self, frame: &'a mut [u8]) -> Result<&'a mut [u8], OpenError> {
        let r = self.try_open(frame);
        if r.is_err() {
            self.dropped += 1;
        }
        r
    }

    fn try_open<'a>(&mut self, frame: &'a mut [u8]) -> Result<&'a mut [u8], OpenError> {
        if frame.len() < HEADER_LEN + TAG_LEN {
            return Err(OpenError::Short);
        }
        let (channel, pn) = nonce_fields(frame);
        if channel != self.channel {
            return Err(OpenError::Misdirected);
        }
        let window = if pn >= PROBE_PACKETS {
            &mut self.probes
        } else {
            &mut self.data
        };
        if !window.check(pn) {
            return Err(OpenError::Replayed);
        }
        let plain_len = frame.len() - TAG_LEN;
        let (head, rest) = frame.split_at_mut(HEADER_LEN);
        let (payload, tag) = rest.split_at_mut(plain_len - HEADER_LEN);
        let tag = ring::aead::Tag::try_from(&*tag).map_err(|_| OpenError::Short)?;
        self.key
            .open_in_place_separate_tag(
                packet_nonce(channel, pn),
                Aad::from(&*head),
                tag,
                payload,
                0..,
            )
            .map_err(|_| OpenError::Unauthentic)?;
        window.accept(pn);
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
        key.sealer().seal(&mut f);
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
        key.sealer().seal(&mut f);
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
        key.sealer().seal(&mut real);
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
        key.sealer().seal(&mut probe);
        assert!(open.open(&mut probe).is_ok());
        let mut data = frame(0, 1, b"d");
        key.sealer().seal(&mut data);
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
            key.sealer().seal(&mut f);
            let bit = bit % (f.len() * 8);
            f[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(key.opener(0).open(&mut f).is_err());
        }

        /// Nonces never repeat across the numbers a session uses: data from 1, probes from
        /// PROBE_PACKETS, the greeting at the top of the header's 48 bits, per channel; and
        /// the nonce read back from an encoded header is the one of its channel and number.
        #[test]
        fn nonces_are_distinct(
            ch in 0u16..=255,
            a in 1u64..PROBE_PACKETS,
            b in PROBE_PACKETS + 1..GREETING_PACKET,
        ) {
            let n = |c: u16, p: u64| *packet_nonce(c, p).as_ref();
            prop_assert_ne!(n(ch, a), n(ch, b));
            prop_assert_ne!(n(ch, a), n(ch, GREETING_PACKET));
            prop_assert_ne!(n(ch, b), n(ch, GREETING_PACKET));
            prop_assert_ne!(n(ch, a), n(ch.wrapping_add(1), a));
            for pn in [a, b] {
                let f = frame(ch, pn, b"");
                prop_assert_eq!(nonce_fields(&f), (ch, pn));
            }
        }
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
        // The probes' space stops below the greeting's number.
        let mut probes = PacketNumbers::probes();
        assert_eq!(probes.next_number(), Ok(PROBE_PACKETS + 1));
        let mut probes = PacketNumbers {
            last: GREETING_PACKET - 2,
            ..probes
        };
        assert_eq!(probes.next_number(), Ok(GREETING_PACKET - 1));
        assert_eq!(
            probes.next_number(),
            Err(PacketsExhausted {
                used: GREETING_PACKET - 1 - PROBE_PACKETS
            })
        );
    }
}
