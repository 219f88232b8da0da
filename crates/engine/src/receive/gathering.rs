//! A block being gathered in memory ([`Gathering`]): each datagram's payload copied into the
//! block's buffer (whose next lines are asked for ahead of the copies, [`WRITE_AHEAD`]), and
//! the block hashed front to back, in steps of [`HASH_STEP`], while its bytes are still in the
//! CPU's cache; and a channel's blocks being gathered
//! ([`Gatherings`]), found by block number without hashing it for every datagram.

use crate::sys::prefetch::prefetch_for_write;
use hurtle_proto::hash::{BlockHasher, BlockValue};

/// A block being gathered in memory, hashed front to back while its bytes are still in the
/// CPU's cache: whenever the bytes held from its start reach past the next [`HASH_STEP`]
/// boundary, those steps are hashed. Hashed bytes are never written again (a datagram that
/// overlaps them only fills what lies beyond), so the value is that of the bytes written.
pub(super) struct Gathering {
    pub(super) buf: Vec<u8>,
    pub(super) hasher: BlockHasher,
    /// End of the bytes held without a gap from the block's start (as far as in-order
    /// arrivals show; a gap filled later is hashed when the block completes).
    pub(super) prefix: usize,
}

/// Bytes hashed at a time while a block is gathered: a multiple of BLAKE3's widest SIMD
/// batch, and small enough to still be in the cache after the copies that brought it.
const HASH_STEP: usize = 64 << 10;

/// How far past a datagram's bytes their block's lines are asked for ahead of the copies
/// that will write them: two to three datagrams of a 1500-byte path.
const WRITE_AHEAD: usize = 4 << 10;

impl Gathering {
    /// Copies `payload` to `at`, except what overlaps bytes already hashed, and hashes what
    /// is now complete from the start in whole steps.
    pub(super) fn fill(&mut self, at: usize, payload: &[u8]) {
        let hashed = self.hasher.len() as usize;
        let end = at + payload.len();
        if end <= hashed {
            return;
        }
        let from = at.max(hashed);
        self.buf[from..end].copy_from_slice(&payload[from - at..]);
        // The lines the next datagrams (in order) are copied to, asked for now: the copy's
        // stores then find them in the cache (see `prefetch_for_write`). Only the lines this
        // call adds to the window: the earlier calls asked for the rest.
        let ahead_end = (end + WRITE_AHEAD).min(self.buf.len());
        let ahead_start = end.max(ahead_end.saturating_sub(payload.len()));
        if let Some(ahead) = self.buf.get(ahead_start..ahead_end) {
            prefetch_for_write(ahead);
        }
        if at <= self.prefix {
            self.prefix = self.prefix.max(end);
        }
        let upto = self.prefix / HASH_STEP * HASH_STEP;
        if upto > hashed {
            self.hasher.update(&self.buf[hashed..upto]);
        }
    }

    /// The block's value, once every byte is in.
    pub(super) fn finish(&mut self) -> BlockValue {
        let hashed = self.hasher.len() as usize;
        self.hasher.update(&self.buf[hashed..]);
        self.hasher.finish()
    }
}

/// A channel's blocks being gathered, by block number, in the order they started (the
/// oldest first, the one to spill when buffers run short). Nearly every datagram belongs to
/// the block its predecessor did, so that block is kept at hand and found with one
/// comparison; another is looked for among the (few: the channel's share of the receive
/// buffer memory) block numbers. A `HashMap` took two hashes and two probes per datagram, a
/// tenth of the receiver's instructions beyond the cipher and the hash.
#[derive(Default)]
pub(super) struct Gatherings {
    /// The blocks' numbers, oldest first, and their gatherings, in the same order (boxed:
    /// a block's hasher is two kilobytes, and a block that completes out of order moves the
    /// others behind it up).
    blocks: Vec<u64>,
    #[allow(clippy::vec_box)] // moved on every removal: a pointer, not two kilobytes
    slots: Vec<Box<Gathering>>,
    /// Where the block last asked for is (a hint: checked before use).
    last: usize,
}

impl Gatherings {
    /// Where block `block` is, if it is being gathered.
    fn find(&mut self, block: u64) -> Option<usize> {
        if self.blocks.get(self.last) == Some(&block) {
            return Some(self.last);
        }
        let i = self.blocks.iter().position(|&b| b == block)?;
        self.last = i;
        Some(i)
    }

    /// How many blocks are being gathered.
    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Block `block`'s gathering, if it is being gathered.
    pub(super) fn get_mut(&mut self, block: u64) -> Option<&mut Gathering> {
        let i = self.find(block)?;
        self.slots.get_mut(i).map(|g| &mut **g)
    }

    /// Block `block`'s gathering, if it is being gathered (no hint kept: for lookups that do
    /// not come with a datagram).
    pub(super) fn get(&self, block: u64) -> Option<&Gathering> {
        let i = self.blocks.iter().position(|&b| b == block)?;
        self.slots.get(i).map(|g| &**g)
    }

    /// Starts gathering block `block` (the newest), which must not be gathered already.
    pub(super) fn push(&mut self, block: u64, g: Gathering) -> &mut Gathering {
        debug_assert!(
            !self.blocks.contains(&block),
            "block {block} gathered twice"
        );
        self.blocks.push(block);
        self.slots.push(Box::new(g));
        self.last = self.blocks.len() - 1;
        &mut self.slots[self.last]
    }

    /// Stops gathering block `block`: its gathering, if it was being gathered.
    pub(super) fn remove(&mut self, block: u64) -> Option<Gathering> {
        let i = self.find(block)?;
        self.blocks.remove(i);
        Some(*self.slots.remove(i))
    }

    /// Stops gathering the block that started first: its number and gathering.
    pub(super) fn pop_oldest(&mut self) -> Option<(u64, Gathering)> {
        if self.blocks.is_empty() {
            return None;
        }
        Some((self.blocks.remove(0), *self.slots.remove(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::hash::block_value;

    fn gathering(len: usize, index: u64, block_size: u64, blocks: u64) -> Gathering {
        Gathering {
            buf: vec![0; len],
            hasher: BlockHasher::new(index, block_size, blocks),
            prefix: 0,
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 + usize::from(seed)) as u8)
            .collect()
    }

    #[test]
    fn a_block_gathered_in_order_is_hashed_as_it_fills() {
        let block = pattern(300_000, 1);
        let mut g = gathering(block.len(), 3, 1 << 19, 5);
        for (i, piece) in block.chunks(8900).enumerate() {
            g.fill(i * 8900, piece);
            // Hashing keeps up with the prefix, in whole steps.
            let hashed = g.hasher.len() as usize;
            assert_eq!(
                hashed,
                ((i + 1) * 8900).min(block.len()) / HASH_STEP * HASH_STEP
            );
        }
        assert_eq!(g.finish(), block_value(&block, 3, 1 << 19, 5));
    }

    #[test]
    fn a_block_gathered_out_of_order_gets_the_same_value() {
        let block = pattern(200_000, 2);
        let mut g = gathering(block.len(), 0, 1 << 18, 1);
        let pieces: Vec<(usize, &[u8])> = block
            .chunks(1000)
            .enumerate()
            .map(|(i, p)| (i * 1000, p))
            .collect();
        // Every other piece first, then the gaps, then one piece again.
        for &(at, p) in pieces.iter().step_by(2) {
            g.fill(at, p);
        }
        assert_eq!(
            g.hasher.len(),
            0,
            "nothing is held without a gap from the start"
        );
        for &(at, p) in pieces.iter().skip(1).step_by(2) {
            g.fill(at, p);
        }
        g.fill(pieces[3].0, pieces[3].1);
        assert_eq!(g.buf, block);
        assert_eq!(g.finish(), *blake3::hash(&block).as_bytes());
    }

    #[test]
    fn hashed_bytes_are_never_overwritten() {
        let block = pattern(4 * HASH_STEP, 3);
        let mut g = gathering(block.len(), 1, 1 << 20, 2);
        g.fill(0, &block[..HASH_STEP + 10]);
        assert_eq!(g.hasher.len() as usize, HASH_STEP);
        // A datagram that overlaps the hashed step with other bytes: only its part beyond the
        // step is taken, so what is written is what was hashed.
        let hostile = vec![0xee; 100];
        g.fill(HASH_STEP - 50, &hostile);
        assert_eq!(&g.buf[..HASH_STEP], &block[..HASH_STEP]);
        assert_eq!(&g.buf[HASH_STEP..HASH_STEP + 50], &hostile[50..]);
        g.fill(0, &hostile);
        assert_eq!(&g.buf[..100], &block[..100]);
        g.fill(HASH_STEP, &block[HASH_STEP..]);
        assert_eq!(g.buf, block);
        assert_eq!(g.finish(), block_value(&g.buf, 1, 1 << 20, 2));
    }

    /// A gathering whose first byte tells which block it is.
    fn marked(block: u64) -> Gathering {
        let mut g = gathering(16, 0, 16, 1);
        g.buf[0] = block as u8;
        g
    }

    fn mark(gs: &mut Gatherings, block: u64) -> Option<u8> {
        gs.get_mut(block).map(|g| g.buf[0])
    }

    #[test]
    fn gatherings_find_each_block_whatever_was_asked_for_last() {
        let mut gs = Gatherings::default();
        for block in [10, 11, 12, 13] {
            gs.push(block, marked(block));
        }
        assert_eq!(gs.len(), 4);
        // The block asked for last is at hand; the others are found too, and what is not
        // gathered is not found.
        assert_eq!(mark(&mut gs, 13), Some(13));
        assert_eq!(mark(&mut gs, 11), Some(11));
        assert_eq!(mark(&mut gs, 11), Some(11));
        assert_eq!(mark(&mut gs, 14), None);
        assert_eq!(gs.get(12).map(|g| g.buf[0]), Some(12));
        // A block that completes out of order moves the later ones up: the hint now points at
        // another block or past the end, and each block is still found as itself.
        assert_eq!(mark(&mut gs, 13), Some(13));
        assert_eq!(gs.remove(11).map(|g| g.buf[0]), Some(11));
        assert_eq!(gs.remove(11).map(|g| g.buf[0]), None);
        assert_eq!(mark(&mut gs, 11), None);
        assert_eq!(mark(&mut gs, 13), Some(13));
        assert_eq!(mark(&mut gs, 12), Some(12));
        assert_eq!(mark(&mut gs, 10), Some(10));
        assert_eq!(gs.len(), 3);
    }

    #[test]
    fn gatherings_spill_the_oldest_block_first() {
        let mut gs = Gatherings::default();
        for block in [7, 3, 9, 5] {
            gs.push(block, marked(block));
        }
        // Completing one in the middle keeps the others' order.
        assert!(gs.remove(9).is_some());
        gs.push(1, marked(1));
        let order: Vec<(u64, u8)> = std::iter::from_fn(|| gs.pop_oldest())
            .map(|(b, g)| (b, g.buf[0]))
            .collect();
        assert_eq!(order, [(7, 7), (3, 3), (5, 5), (1, 1)]);
        assert_eq!(gs.len(), 0);
        assert!(gs.pop_oldest().is_none());
        assert_eq!(mark(&mut gs, 7), None);
    }
}
