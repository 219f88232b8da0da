//! BLAKE3 bookkeeping: one chaining value per block, and each file's real BLAKE3 built from them.
//!
//! A block is a complete BLAKE3 subtree (blocks are power-of-two sized and aligned), so each side
//! hashes a block on its own, in any order, on any thread, and the root of the whole file is
//! assembled from the block values with the hazmat merge functions. The result equals
//! `blake3::hash(whole file)` (what `b3sum` prints), which the tests check.
//!
//! For a file of a single block, the block's value *is* the file's root hash; for longer files it
//! is the non-root chaining value. [`block_value`] hides that difference.

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};

/// A block's 32-byte BLAKE3 value (chaining value, or root hash for a one-block file).
pub type BlockValue = [u8; 32];

/// Hashes the bytes of block `index_in_file` of a file that has `blocks_in_file` blocks.
///
/// `data` must be the whole block (all of it, even if short at the end of the file).
pub fn block_value(
    data: &[u8],
    index_in_file: u64,
    block_size: u64,
    blocks_in_file: u64,
) -> BlockValue {
    let mut h = BlockHasher::new(index_in_file, block_size, blocks_in_file);
    h.update(data);
    h.finish()
}

/// Hashes one block in pieces, front to back, as its bytes become final: the same value as
/// [`block_value`] of the whole block. A receiver hashes a block while its bytes are still in
/// the CPU's cache rather than all at once when the block is complete.
#[derive(Clone)]
pub struct BlockHasher {
    hasher: blake3::Hasher,
    root: bool,
    len: u64,
}

impl BlockHasher {
    /// Starts block `index_in_file` of a file that has `blocks_in_file` blocks.
    pub fn new(index_in_file: u64, block_size: u64, blocks_in_file: u64) -> BlockHasher {
        let root = blocks_in_file <= 1;
        let mut hasher = blake3::Hasher::new();
        if !root {
            hasher.set_input_offset(index_in_file * block_size);
        }
        BlockHasher {
            hasher,
            root,
            len: 0,
        }
    }

    /// Adds the block's next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.len += data.len() as u64;
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True before the first byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block's value; `update` must have been given the whole block.
    pub fn finish(&self) -> BlockValue {
        if self.root {
            *self.hasher.finalize().as_bytes()
        } else {
            self.hasher.finalize_non_root()
        }
    }
}

/// The file's BLAKE3 root from all its block values, in order. An empty slice is the empty file.
pub fn file_hash(blocks: &[BlockValue]) -> [u8; 32] {
    match blocks.len() {
        0 => *blake3::hash(b"").as_bytes(),
        1 => blocks[0],
        _ => {
            let split = left_blocks(blocks.len());
            let l = subtree(&blocks[..split]);
            let r = subtree(&blocks[split..]);
            *merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()
        }
    }
}

/// Number of blocks in the left subtree of `n > 1` blocks: the largest power of two below `n`.
fn left_blocks(n: usize) -> usize {
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

fn subtree(blocks: &[BlockValue]) -> BlockValue {
    if blocks.len() == 1 {
        return blocks[0];
    }
    let split = left_blocks(blocks.len());
    merge_subtrees_non_root(
        &subtree(&blocks[..split]),
        &subtree(&blocks[split..]),
        Mode::Hash,
    )
}

/// Hex form of a hash, for summaries and logs.
pub fn to_hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn by_blocks(d: &[u8], bs: usize) -> [u8; 32] {
        let n = d.len().div_ceil(bs) as u64;
        let values: Vec<BlockValue> = d
            .chunks(bs)
            .enumerate()
            .map(|(i, c)| block_value(c, i as u64, bs as u64, n))
            .collect();
        file_hash(&values)
    }

    #[test]
    fn equals_plain_blake3_for_many_sizes() {
        for bs in [1024usize, 4096, 65536] {
            for len in [
                0,
                1,
                1023,
                1024,
                1025,
                4096,
                5000,
                8191,
                8192,
                8193,
                3 * 65536 + 7,
                5 * 65536,
                7 * 65536 - 1,
                300_000,
            ] {
                let d = data(len);
                assert_eq!(
                    by_blocks(&d, bs),
                    *blake3::hash(&d).as_bytes(),
                    "len {len} block {bs}"
                );
            }
        }
    }

    #[test]
    fn block_hasher_in_pieces_equals_block_value() {
        let d = data(3 * 65536 + 5);
        for (bs, piece) in [
            (65536usize, 1usize),
            (65536, 8900),
            (65536, 65536),
            (1024, 300),
        ] {
            let n = d.len().div_ceil(bs) as u64;
            for (i, block) in d.chunks(bs).enumerate() {
                let mut h = BlockHasher::new(i as u64, bs as u64, n);
                for p in block.chunks(piece) {
                    h.update(p);
                }
                assert_eq!(h.len(), block.len() as u64);
                assert_eq!(h.finish(), block_value(block, i as u64, bs as u64, n));
            }
        }
        let one = data(5000);
        let mut h = BlockHasher::new(0, 8192, 1);
        h.update(&one[..4096]);
        h.update(&one[4096..]);
        assert_eq!(h.finish(), *blake3::hash(&one).as_bytes());
    }

    #[test]
    fn left_split_is_largest_power_of_two_below() {
        assert_eq!(left_blocks(2), 1);
        assert_eq!(left_blocks(3), 2);
        assert_eq!(left_blocks(4), 2);
        assert_eq!(left_blocks(5), 4);
        assert_eq!(left_blocks(9), 8);
    }

    #[test]
    fn a_flipped_bit_changes_the_block_value() {
        let mut d = data(4096);
        let a = block_value(&d, 1, 4096, 3);
        d[100] ^= 1;
        assert_ne!(a, block_value(&d, 1, 4096, 3));
    }
}
