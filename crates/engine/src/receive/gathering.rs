//! A block being gathered in memory ([`Gathering`]): each datagram's payload copied into the
//! block's buffer, and the block hashed front to back, in steps of [`HASH_STEP`], while its
//! bytes are still in the CPU's cache.

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
}
