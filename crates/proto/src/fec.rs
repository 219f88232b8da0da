//! Forward error correction for the tail of a channel's stripe.
//!
//! A datagram lost while new data still flows costs nothing but its bytes: the receiver asks
//! for it, the repair goes out beside new data, and the transfer does not wait. A datagram lost
//! in the last round trip of new data is different: the transfer ends only when its repair
//! arrives, a round trip and a report interval later (two, if the repair is lost too). So the
//! sender sends **parity** for the tail: once a channel's new data left to send fits in about
//! one and a half round trips at its rate ([`in_tail`]), it cuts new data into pieces of
//! [`piece_size`] bytes and gathers consecutive pieces of one block into groups
//! ([`TailGroups`]); after each group it sends [`parity_count`] Reed-Solomon recovery shards
//! ([`encode`], the `reed-solomon-simd` crate), each in a parity datagram
//! ([`crate::wire::Kind::Parity`]) whose payload is a [`ParityDesc`] and the shard. A receiver
//! that misses up to as many pieces of a group as it got shards rebuilds them at once
//! ([`ParityStore`], [`recover`]) instead of asking; anything it cannot rebuild is asked for as
//! before, and every rebuilt byte is checked with its block like any other. A piece that
//! arrives after its group's parity (reordered) tries the group again ([`ParityStore::group_at`]);
//! a receiver keeps parity for a bounded number of groups and bytes ([`MAX_PENDING`],
//! [`MAX_PENDING_BYTES`]).
//!
//! A group is described by its first byte (the parity datagram's header: file and offset) and
//! its length; its pieces are `piece` bytes each from there, the last one shorter if the length
//! says so (it is encoded padded with zeros). A piece is exactly one data datagram's payload:
//! the sender cuts the tail's new data at the piece size, which leaves room for the descriptor
//! in a parity datagram of the same size as the data ones.
//!
//! A path that has lost nothing in the transfer so far
//! ([`crate::rate::RateController::lost_nothing`]: a thousand datagrams or more reported, not
//! one missing) sends its tail without parity: a tail is unlikely to lose there, and the first
//! parity costs the sender the Reed-Solomon engine's tables, built once per process (16 ms of
//! CPU for the first encode on a 2-core EPYC; with the parity itself, a 256 MiB paced transfer's
//! sender spent 0.06 CPU-s more). Its losses, if any, are asked for as anywhere else.
//!
//! Parity is sized to the loss the sender knows of ([`parity_count`]: the fewest shards that
//! leave the whole tail with a group that cannot be rebuilt at most [`TAIL_FAILURE`] of the
//! time, each group taking its share), and a group spans about
//! [`GROUP_SPAN`] of the channel's sending ([`group_pieces`]), so that its parity arrives before
//! the receiver would have asked for a piece of it.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::time::Duration;

/// Bytes of a [`ParityDesc`] at the start of a parity datagram's payload.
pub const DESC_LEN: usize = 8;
/// Most pieces in a group.
pub const MAX_GROUP: usize = 64;
/// Fewest pieces a group is sized for (a slow channel's groups span more than [`GROUP_SPAN`]).
pub const MIN_GROUP: usize = 32;
/// Most parity shards of a group.
pub const MAX_PARITY: usize = 16;
/// How long a group's data takes to send at the channel's rate, about: its parity follows
/// within this of its first piece, well inside the receiver's wait before it asks for a gap.
pub const GROUP_SPAN: Duration = Duration::from_millis(4);
/// A channel's tail is left with a group that cannot be rebuilt at most this often: each
/// group's share of it ([`group_failure`]) sizes its parity ([`parity_count`]).
pub const TAIL_FAILURE: f64 = 0.05;
/// Groups a receiver keeps parity for ([`ParityStore`]); older ones are forgotten first.
pub const MAX_PENDING: usize = 4096;
/// Bytes of shards a receiver's channel keeps at most; older groups are forgotten first.
pub const MAX_PENDING_BYTES: usize = 16 << 20;
/// The loss rate parity is sized for before any report says what the path loses.
pub const DEFAULT_LOSS: f64 = 0.01;

/// Why a parity datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FecError {
    /// Fewer bytes than a descriptor.
    #[error("parity datagram shorter than its descriptor")]
    Truncated,
    /// A descriptor that describes no group this protocol sends.
    #[error("parity descriptor out of range")]
    BadDesc,
    /// The shard is not one piece long.
    #[error("parity shard of {got} bytes for pieces of {piece}")]
    ShardSize {
        /// The descriptor's piece size.
        piece: u16,
        /// The shard's size.
        got: usize,
    },
}

/// What a parity datagram's payload starts with: the group and which shard this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParityDesc {
    /// The group's length in bytes, from the header's offset.
    pub len: u32,
    /// Bytes per piece (even; the last piece may be shorter).
    pub piece: u16,
    /// This shard's index, below `count`.
    pub index: u8,
    /// Shards sent for the group.
    pub count: u8,
}

impl ParityDesc {
    /// Writes the descriptor into the first [`DESC_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`DESC_LEN`].
    pub fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.len.to_be_bytes());
        out[4..6].copy_from_slice(&self.piece.to_be_bytes());
        out[6] = self.index;
        out[7] = self.count;
    }

    /// Parses a parity datagram's payload into its descriptor and its shard, checking that
    /// they describe a group this protocol sends: an even piece size, at most [`MAX_GROUP`]
    /// pieces, at most [`MAX_PARITY`] shards, a shard of one piece.
    pub fn decode(payload: &[u8]) -> Result<(ParityDesc, &[u8]), FecError> {
        if payload.len() < DESC_LEN {
            return Err(FecError::Truncated);
        }
        let (d, shard) = payload.split_at(DESC_LEN);
        let desc = ParityDesc {
            len: u32::from_be_bytes([d[0], d[1], d[2], d[3]]),
            piece: u16::from_be_bytes([d[4], d[5]]),
            index: d[6],
            count: d[7],
        };
        let ok = desc.piece >= 2
            && desc.piece.is_multiple_of(2)
            && desc.len > 0
            && desc.pieces() <= MAX_GROUP
            && desc.count >= 1
            && usize::from(desc.count) <= MAX_PARITY
            && desc.index < desc.count;
        if !ok {
            return Err(FecError::BadDesc);
        }
        if shard.len() != usize::from(desc.piece) {
            return Err(FecError::ShardSize {
                piece: desc.piece,
                got: shard.len(),
            });
        }
        Ok((desc, shard))
    }

    /// Pieces in the group.
    pub fn pieces(&self) -> usize {
        (self.len as usize).div_ceil(usize::from(self.piece.max(1)))
    }

    /// Piece `i`'s bytes, relative to the group's first.
    pub fn piece_range(&self, i: usize) -> Range<u64> {
        let piece = u64::from(self.piece);
        let start = i as u64 * piece;
        start..(start + piece).min(u64::from(self.len))
    }
}

/// The piece size for datagrams of `payload` bytes: room for the descriptor, and even (the
/// Reed-Solomon shards are).
pub fn piece_size(payload: u16) -> u16 {
    payload.saturating_sub(DESC_LEN as u16) & !1
}

/// Whether a channel with `new_remaining` bytes of new data left, sending at `rate_bps`, is in
/// its tail: what is left takes no longer than one and a half round trips and 20 ms (a loss in
/// it would be repaired only after the last new byte went).
pub fn in_tail(new_remaining: u64, rate_bps: u64, rtt: Duration) -> bool {
    let horizon = rtt.as_secs_f64() * 1.5 + 0.02;
    new_remaining > 0 && (new_remaining as f64) <= rate_bps as f64 / 8.0 * horizon
}

/// Pieces per group for a channel sending at `rate_bps`: what it sends in [`GROUP_SPAN`],
/// within [`MIN_GROUP`]..=[`MAX_GROUP`].
pub fn group_pieces(rate_bps: u64, piece: u16) -> usize {
    let bytes = rate_bps as f64 / 8.0 * GROUP_SPAN.as_secs_f64();
    let n = (bytes / f64::from(piece.max(1))) as usize;
    n.clamp(MIN_GROUP, MAX_GROUP)
}

/// How often a group of `group_len` bytes in a tail of `tail_len` may be left unrecoverable:
/// its share of [`TAIL_FAILURE`] (at least 1e-4).
pub fn group_failure(group_len: u64, tail_len: u64) -> f64 {
    let share = group_len as f64 / tail_len.max(group_len).max(1) as f64;
    (TAIL_FAILURE * share).clamp(1e-4, TAIL_FAILURE)
}

/// The fewest parity shards (1 to [`MAX_PARITY`]) for a group of `pieces` so that random loss
/// at rate `loss` leaves it unrecoverable (more of its pieces and shards lost than it has
/// shards) at most `failure` of the time; [`MAX_PARITY`] if none does.
pub fn parity_count(pieces: usize, loss: f64, failure: f64) -> usize {
    let p = if loss.is_finite() {
        loss.clamp(0.0, 0.5)
    } else {
        DEFAULT_LOSS
    };
    (1..=MAX_PARITY)
        .find(|&k| more_than(pieces + k, k, p) <= failure)
        .unwrap_or(MAX_PARITY)
}

/// P(X > k) for X ~ Binomial(n, p).
fn more_than(n: usize, k: usize, p: f64) -> f64 {
    if p <= 0.0 {
        return 0.0;
    }
    let q = 1.0 - p;
    let mut pmf = q.powi(n as i32);
    let mut cdf = pmf;
    for i in 0..k.min(n) {
        pmf *= (n - i) as f64 / (i + 1) as f64 * p / q;
        cdf += pmf;
    }
    (1.0 - cdf).max(0.0)
}

/// The parity shards of a group: `group` is its bytes, cut into pieces of `piece` bytes (the
/// last padded with zeros), and `count` shards are made.
///
/// # Panics
/// If `piece` is odd or zero, `group` is empty or longer than [`MAX_GROUP`] pieces, or `count`
/// is not within 1..=[`MAX_PARITY`]: the sender's own bug, never peer input.
pub fn encode(group: &[u8], piece: u16, count: usize) -> Vec<Vec<u8>> {
    let piece = usize::from(piece);
    assert!(piece >= 2 && piece.is_multiple_of(2), "piece size {piece}");
    let n = group.len().div_ceil(piece);
    assert!((1..=MAX_GROUP).contains(&n), "{n} pieces");
    assert!((1..=MAX_PARITY).contains(&count), "{count} parity shards");
    let padded = pad(&group[(n - 1) * piece..], piece);
    let shards = group
        .chunks(piece)
        .take(n - 1)
        .chain(std::iter::once(&padded[..]));
    reed_solomon_simd::encode(n, count, shards)
        .expect("piece and shard counts within what Reed-Solomon supports")
}

fn pad(bytes: &[u8], piece: usize) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(piece, 0);
    v
}

/// Rebuilds the pieces of the group `desc` that `present` does not give (it gives piece `i`'s
/// bytes, `desc.piece_range(i)` long, if the receiver has them), from `shards` (index, bytes).
/// Returns each rebuilt piece's index and bytes (cut to its length), or `None` if more pieces
/// are missing than there are shards (or the shards contradict each other's sizes).
pub fn recover<'a>(
    desc: &ParityDesc,
    present: impl Fn(usize) -> Option<&'a [u8]>,
    shards: &[(u8, Vec<u8>)],
) -> Option<Vec<(usize, Vec<u8>)>> {
    let n = desc.pieces();
    let piece = usize::from(desc.piece);
    // What is there, first without a copy: most groups lose nothing.
    let whole = |i: usize| {
        let r = desc.piece_range(i);
        present(i).filter(|b| b.len() as u64 == r.end - r.start)
    };
    let missing: Vec<usize> = (0..n).filter(|&i| whole(i).is_none()).collect();
    if missing.is_empty() {
        return Some(Vec::new());
    }
    if missing.len() > shards.len() {
        return None;
    }
    // The last piece may be short: the shards were made with it padded.
    let originals = (0..n).filter_map(|i| {
        whole(i).map(|b| {
            (
                i,
                if b.len() == piece {
                    b.to_vec()
                } else {
                    pad(b, piece)
                },
            )
        })
    });
    let recovery = shards
        .iter()
        .filter(|(_, s)| s.len() == piece)
        .map(|(j, s)| (usize::from(*j), s));
    let rebuilt =
        reed_solomon_simd::decode(n, usize::from(desc.count), originals, recovery).ok()?;
    missing
        .into_iter()
        .map(|i| {
            let mut b = rebuilt.get(&i)?.clone();
            let r = desc.piece_range(i);
            b.truncate((r.end - r.start) as usize);
            Some((i, b))
        })
        .collect()
}

/// A group of the tail's new data, closed and ready for its parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Stripe position of its first byte.
    pub pos: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its piece size.
    pub piece: u16,
}

/// The sender's groups of one channel: consecutive new data of one block, cut at one piece
/// size, up to a number of pieces.
#[derive(Debug, Clone, Default)]
pub struct TailGroups {
    open: Option<Group>,
    /// The tail's length: new data left when it began.
    tail_len: Option<u64>,
}

impl TailGroups {
    /// No group open.
    pub fn new() -> Self {
        TailGroups::default()
    }

    /// New data `pos..pos + len` of the stripe was sent in pieces of `piece` bytes; its block
    /// ends at stripe position `block_end`. Returns the groups this closes, oldest first: the
    /// open one if this run does not continue it, and the one this run is in if it reached
    /// `max_pieces`, its block's end, or a piece shorter than the others.
    pub fn on_sent(
        &mut self,
        pos: u64,
        len: u64,
        piece: u16,
        block_end: u64,
        max_pieces: usize,
    ) -> Vec<Group> {
        let mut closed = Vec::new();
        let p = u64::from(piece.max(1));
        let continues = self.open.is_some_and(|g| {
            g.piece == piece
                && g.pos + g.len == pos
                && g.len.is_multiple_of(p)
                && (g.len + len).div_ceil(p) as usize <= max_pieces
        });
        if !continues {
            closed.extend(self.open.take());
        }
        let g = self.open.get_or_insert(Group { pos, len: 0, piece });
        g.len += len;
        let full = g.len.div_ceil(p) as usize >= max_pieces;
        if full || pos + len >= block_end || !g.len.is_multiple_of(p) {
            closed.extend(self.open.take());
        }
        closed
    }

    /// The tail's length: `left` (new data left before the run just sent) the first time this
    /// is asked, the same after.
    pub fn tail_len(&mut self, left: u64) -> u64 {
        *self.tail_len.get_or_insert(left)
    }

    /// Closes the open group, if any (before the bytes it covers are gone).
    pub fn close(&mut self) -> Option<Group> {
        self.open.take()
    }
}

/// Parity a receiver's channel holds for groups it has not finished: the shards, by the
/// group's first stripe position.
#[derive(Debug, Clone, Default)]
pub struct ParityStore {
    groups: BTreeMap<u64, Pending>,
    order: VecDeque<u64>,
    /// Bytes of the shards held.
    bytes: usize,
}

/// One group's parity so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The group (from the first shard that came; later ones must agree).
    pub desc: ParityDesc,
    /// File and file offset of its first byte.
    pub file: u32,
    /// File offset of its first byte.
    pub offset: u64,
    /// The shards, by index.
    pub shards: Vec<(u8, Vec<u8>)>,
}

impl ParityStore {
    /// Holds nothing.
    pub fn new() -> Self {
        ParityStore::default()
    }

    /// Keeps a shard of the group at stripe position `pos` (file `file`, offset `offset`).
    /// A shard that disagrees with the group's descriptor, or repeats one held, is dropped.
    /// Returns the group's parity so far.
    pub fn add(
        &mut self,
        pos: u64,
        file: u32,
        offset: u64,
        desc: ParityDesc,
        shard: &[u8],
    ) -> &Pending {
        if !self.groups.contains_key(&pos) {
            if self.order.len() >= MAX_PENDING {
                self.forget_oldest();
            }
            self.order.push_back(pos);
        }
        while self.bytes + shard.len() > MAX_PENDING_BYTES && self.order.front() != Some(&pos) {
            self.forget_oldest();
        }
        let g = self.groups.entry(pos).or_insert_with(|| Pending {
            desc,
            file,
            offset,
            shards: Vec::new(),
        });
        let same = ParityDesc {
            index: g.desc.index,
            ..desc
        } == g.desc
            && (g.file, g.offset) == (file, offset);
        if same && !g.shards.iter().any(|(j, _)| *j == desc.index) {
            g.shards.push((desc.index, shard.to_vec()));
            self.bytes += shard.len();
        }
        g
    }

    fn forget_oldest(&mut self) {
        if let Some(old) = self.order.pop_front() {
            if let Some(g) = self.groups.remove(&old) {
                self.bytes -= g.shards.iter().map(|(_, s)| s.len()).sum::<usize>();
            }
        }
    }

    /// The parity held for the group at `pos`.
    pub fn get(&self, pos: u64) -> Option<&Pending> {
        self.groups.get(&pos)
    }

    /// The first stripe position of the group held that stripe position `pos` lies in, if
    /// any: data that arrives after its group's parity (reordered) may complete what the
    /// parity can rebuild.
    pub fn group_at(&self, pos: u64) -> Option<u64> {
        let (&start, g) = self.groups.range(..=pos).next_back()?;
        (pos < start + u64::from(g.desc.len)).then_some(start)
    }

    /// Forgets the group at `pos` (done with: complete, rebuilt, or beyond rebuilding here).
    pub fn remove(&mut self, pos: u64) {
        if let Some(g) = self.groups.remove(&pos) {
            self.bytes -= g.shards.iter().map(|(_, s)| s.len()).sum::<usize>();
            self.order.retain(|&p| p != pos);
        }
    }

    /// Bytes of the shards held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Groups held.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when no group is held.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn descriptor_round_trips_and_refuses_what_is_never_sent() {
        let d = ParityDesc {
            len: 10_000,
            piece: 1420,
            index: 2,
            count: 4,
        };
        let mut p = vec![0u8; DESC_LEN + 1420];
        d.encode(&mut p);
        assert_eq!(ParityDesc::decode(&p).unwrap().0, d);
        assert_eq!(d.pieces(), 8);
        assert_eq!(d.piece_range(7), 9940..10_000);
        assert_eq!(ParityDesc::decode(&p[..7]), Err(FecError::Truncated));
        assert_eq!(
            ParityDesc::decode(&p[..DESC_LEN + 10]),
            Err(FecError::ShardSize {
                piece: 1420,
                got: 10
            })
        );
        for bad in [
            ParityDesc { piece: 1421, ..d },
            ParityDesc { piece: 0, ..d },
            ParityDesc { len: 0, ..d },
            ParityDesc { index: 4, ..d },
            ParityDesc {
                count: 17,
                index: 0,
                ..d
            },
            ParityDesc {
                len: 1420 * 65,
                ..d
            },
        ] {
            bad.encode(&mut p);
            assert_eq!(ParityDesc::decode(&p), Err(FecError::BadDesc), "{bad:?}");
        }
    }

    #[test]
    fn piece_leaves_room_for_the_descriptor_and_is_even() {
        assert_eq!(piece_size(1428), 1420);
        assert_eq!(piece_size(1397), 1388);
        assert_eq!(piece_size(4), 0);
    }

    #[test]
    fn parity_grows_with_loss_and_group() {
        let f = 1e-3;
        assert_eq!(parity_count(8, 0.0, f), 1);
        assert_eq!(parity_count(8, 0.001, f), 1);
        let at1 = parity_count(43, 0.01, f);
        assert!((3..=5).contains(&at1), "{at1}");
        assert!(parity_count(64, 0.05, f) > at1);
        assert!(parity_count(43, 0.01, 1e-2) < at1);
        assert_eq!(parity_count(64, 0.5, f), MAX_PARITY);
        assert_eq!(
            parity_count(64, f64::NAN, f),
            parity_count(64, DEFAULT_LOSS, f)
        );
        // The count chosen meets the failure target, and one fewer would not.
        for (n, p) in [(8, 0.01), (43, 0.01), (64, 0.03)] {
            let k = parity_count(n, p, f);
            assert!(more_than(n + k, k, p) <= f);
            if k > 1 {
                assert!(more_than(n + k - 1, k - 1, p) > f);
            }
        }
    }

    #[test]
    fn a_group_takes_its_share_of_the_tails_failure() {
        assert_eq!(group_failure(1000, 100_000), TAIL_FAILURE / 100.0);
        assert_eq!(group_failure(1000, 500), TAIL_FAILURE);
        assert_eq!(group_failure(1, u64::MAX), 1e-4);
        let mut t = TailGroups::new();
        assert_eq!(t.tail_len(5000), 5000);
        assert_eq!(t.tail_len(300), 5000);
    }

    #[test]
    fn tail_and_group_size_follow_the_rate() {
        let rtt = Duration::from_millis(100);
        // 100 Mbit/s for 170 ms is 2.125 MB.
        assert!(in_tail(2_000_000, 100_000_000, rtt));
        assert!(!in_tail(2_200_000, 100_000_000, rtt));
        assert!(!in_tail(0, 100_000_000, rtt));
        assert_eq!(group_pieces(200_000_000, 1420), 70.min(MAX_GROUP));
        assert_eq!(group_pieces(100_000_000, 1420), 35);
        assert_eq!(group_pieces(1_000_000, 1420), MIN_GROUP);
        assert_eq!(group_pieces(10_000_000_000, 1420), MAX_GROUP);
    }

    #[test]
    fn groups_close_at_their_size_block_end_and_breaks() {
        let mut t = TailGroups::new();
        // Runs of 3 pieces of 100 bytes, groups of at most 8 pieces, block ends at 2000.
        assert!(t.on_sent(0, 300, 100, 2000, 8).is_empty());
        assert!(t.on_sent(300, 300, 100, 2000, 8).is_empty());
        // Would make 9 pieces: the open group closes, this run starts the next.
        assert_eq!(
            t.on_sent(600, 300, 100, 2000, 8),
            vec![Group {
                pos: 0,
                len: 600,
                piece: 100
            }]
        );
        // Not contiguous (a held block passed): the open one closes.
        let c = t.on_sent(5000, 200, 100, 6000, 8);
        assert_eq!(c[0].pos, 600);
        // A short piece closes its group at once.
        let c = t.on_sent(5200, 150, 100, 6000, 8);
        assert_eq!(
            c,
            vec![Group {
                pos: 5000,
                len: 350,
                piece: 100
            }]
        );
        // The block's end closes it.
        assert_eq!(t.on_sent(5800, 200, 100, 6000, 8).len(), 1);
        assert_eq!(t.close(), None);
        // Another piece size starts another group.
        assert!(t.on_sent(7000, 200, 100, 9000, 8).is_empty());
        assert_eq!(t.on_sent(7200, 240, 120, 9000, 8).len(), 1);
        assert_eq!(t.close().map(|g| g.piece), Some(120));
    }

    #[test]
    fn store_keeps_agreeing_shards_once_and_forgets_the_oldest() {
        let mut s = ParityStore::new();
        let d = ParityDesc {
            len: 400,
            piece: 100,
            index: 0,
            count: 2,
        };
        s.add(0, 1, 50, d, &[1; 100]);
        s.add(0, 1, 50, d, &[2; 100]);
        let other = ParityDesc { len: 300, ..d };
        s.add(0, 1, 50, ParityDesc { index: 1, ..other }, &[3; 100]);
        let g = s.add(0, 1, 50, ParityDesc { index: 1, ..d }, &[4; 100]);
        assert_eq!(g.shards.len(), 2);
        assert_eq!(g.shards[0].1[0], 1);
        for pos in 1..=MAX_PENDING as u64 {
            s.add(pos * 1000, 1, 0, d, &[0; 100]);
        }
        assert_eq!(s.len(), MAX_PENDING);
        assert_eq!(s.group_at(2399), Some(2000));
        assert_eq!(s.group_at(2400), None);
        s.remove(1000);
        assert_eq!(s.len(), MAX_PENDING - 1);
        assert_eq!(s.bytes(), (MAX_PENDING - 1) * 100);
        // Big shards: the oldest groups go to keep the bytes bounded.
        let big = vec![0u8; 1 << 20];
        let d = ParityDesc {
            len: 1 << 21,
            piece: 1 << 15,
            index: 0,
            count: 1,
        };
        for pos in 0..40u64 {
            s.add(1 << 40 | pos, 1, 0, d, &big);
        }
        assert!(s.bytes() <= MAX_PENDING_BYTES);
        assert!(s.get(1 << 40 | 39).is_some() && s.get(1 << 40).is_none());
    }

    fn lose_and_recover(
        group: &[u8],
        piece: u16,
        count: usize,
        lost: &[usize],
        shards_lost: &[usize],
    ) -> Option<Vec<u8>> {
        let desc = ParityDesc {
            len: group.len() as u32,
            piece,
            index: 0,
            count: count as u8,
        };
        let shards: Vec<(u8, Vec<u8>)> = encode(group, piece, count)
            .into_iter()
            .enumerate()
            .filter(|(j, _)| !shards_lost.contains(j))
            .map(|(j, s)| (j as u8, s))
            .collect();
        let piece_of = |i: usize| {
            let r = desc.piece_range(i);
            &group[r.start as usize..r.end as usize]
        };
        let rebuilt = recover(
            &desc,
            |i| (!lost.contains(&i)).then(|| piece_of(i)),
            &shards,
        )?;
        let mut out = group.to_vec();
        for (i, b) in &rebuilt {
            assert!(lost.contains(i));
            let r = desc.piece_range(*i);
            out[r.start as usize..r.end as usize].copy_from_slice(b);
        }
        for &i in lost {
            if !rebuilt.iter().any(|(j, _)| *j == i) {
                return None;
            }
        }
        Some(out)
    }

    #[test]
    fn lost_pieces_up_to_the_shards_come_back_exactly() {
        let g = bytes(1000, 7);
        assert_eq!(lose_and_recover(&g, 100, 2, &[3, 9], &[]), Some(g.clone()));
        // A short last piece, lost.
        let g = bytes(950, 9);
        assert_eq!(lose_and_recover(&g, 100, 1, &[9], &[]), Some(g.clone()));
        // A shard lost too: one left for one piece.
        assert_eq!(lose_and_recover(&g, 100, 2, &[0], &[0]), Some(g.clone()));
        // Two pieces lost, one shard: beyond rebuilding.
        assert_eq!(lose_and_recover(&g, 100, 1, &[0, 1], &[]), None);
        // Nothing lost: nothing to rebuild.
        assert_eq!(lose_and_recover(&g, 100, 1, &[], &[]), Some(g));
    }

    proptest! {
        #[test]
        fn any_loss_within_the_shards_is_rebuilt(
            len in 1usize..6000,
            piece_half in 1u16..200,
            count in 1usize..6,
            seed in any::<u8>(),
            picks in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let piece = piece_half * 2;
            let n = len.div_ceil(usize::from(piece));
            prop_assume!(n <= MAX_GROUP);
            let g = bytes(len, seed);
            let mut lost: Vec<usize> = picks.iter().map(|p| p % n).collect();
            lost.sort_unstable();
            lost.dedup();
            lost.truncate(count);
            prop_assert_eq!(lose_and_recover(&g, piece, count, &lost, &[]), Some(g));
        }

        #[test]
        fn decoding_any_payload_never_panics(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok((desc, shard)) = ParityDesc::decode(&payload) {
                prop_assert_eq!(shard.len(), usize::from(desc.piece));
                prop_assert!(desc.pieces() <= MAX_GROUP);
                let _ = recover(&desc, |_| None, &[(desc.index, shard.to_vec())]);
            }
        }
    }
}
