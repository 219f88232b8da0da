//! BLAKE3 bookkeeping: one chaining value per block, and each file's real BLAKE3 built from them.
//!
//! A block is a complete BLAKE3 subtree (blocks are power-of-two sized and aligned), so each side
//! hashes a block on its own, in any order, on any thread, and the root of the whole file is
//! assembled from the block values with the hazmat merge functions. The result equals
//! `blake3::hash(whole file)` (what `b3sum` prints), which the tests check.
//!
//! For a file of a single block, the block's value *is* the file's root hash; for longer files it
//! is the non-root chaining value. [`block_value`] hides that difference.
//!
//! Holes: a block that the sender announced as lying wholly in a hole of a sparse file, and
//! that holds only zeros, is not hashed: its value is [`hole_value`], a marker made of its
//! place and length that neither side needs to read or hash anything for ([`value_of`]). BLAKE3
//! chains each 1 KiB chunk with its position, so the zeros of a hole have no value that could be
//! computed once and reused: a 64 GiB hole would cost 64 GiB of hashing on each side. A file
//! with announced holes therefore has a root that is not `b3sum`'s: the same BLAKE3 tree of
//! block values, with the markers in it ([`HashKind::Sparse`]); every byte is still bound to it,
//! since a marker stands for exactly `len` zeros at its block and can be no real block's value.

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

/// How a file's root hash was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKind {
    /// The BLAKE3 of the file's bytes: what `b3sum` prints.
    Blake3,
    /// The BLAKE3 tree of the file's block values, where each block the sender announced as a
    /// hole, and that holds only zeros, stands as its [`hole_value`] (see the module docs).
    Sparse,
}

impl HashKind {
    /// The kind for a file with (`true`) or without announced holes.
    pub fn with_holes(holes: bool) -> HashKind {
        if holes {
            HashKind::Sparse
        } else {
            HashKind::Blake3
        }
    }

    /// Its name in summaries: `"blake3"` or `"blake3-sparse"`.
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Blake3 => "blake3",
            HashKind::Sparse => "blake3-sparse",
        }
    }
}

/// The first 16 bytes of every [`hole_value`]. A real block value is a BLAKE3 output: one that
/// starts with these bytes would take about 2^128 tries to find.
const HOLE_TAG: &[u8; 16] = b"hurtle-hole-v1\0\0";

/// The value of block `index_in_file`, `len` bytes of zeros that the sender announced as a
/// hole: its tag, place and length, computed without hashing (see the module docs).
pub fn hole_value(index_in_file: u64, len: u64) -> BlockValue {
    let mut v = [0u8; 32];
    v[..16].copy_from_slice(HOLE_TAG);
    v[16..24].copy_from_slice(&index_in_file.to_le_bytes());
    v[24..].copy_from_slice(&len.to_le_bytes());
    v
}

/// True when `value` is a [`hole_value`].
pub fn is_hole_value(value: &BlockValue) -> bool {
    value.starts_with(HOLE_TAG)
}

/// The value of block `index_in_file` holding `data` (the whole block): [`hole_value`] when
/// the block is an announced hole (`announced_hole`) and `data` is all zeros, otherwise
/// [`block_value`]. Both sides value every block this way.
pub fn value_of(
    data: &[u8],
    index_in_file: u64,
    block_size: u64,
    blocks_in_file: u64,
    announced_hole: bool,
) -> BlockValue {
    if announced_hole && is_zeros(data) {
        hole_value(index_in_file, data.len() as u64)
    } else {
        block_value(data, index_in_file, block_size, blocks_in_file)
    }
}

/// True when `data` holds only zero bytes.
pub fn is_zeros(data: &[u8]) -> bool {
    // Pieces OR-ed together, which the compiler vectorises, with an early way out.
    data.chunks(256)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
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

    #[test]
    fn hole_values_are_only_for_announced_zeros() {
        let zeros = vec![0u8; 4096];
        let mut one = zeros.clone();
        one[4095] = 1;
        assert_eq!(value_of(&zeros, 2, 4096, 5, true), hole_value(2, 4096));
        assert!(is_hole_value(&value_of(&zeros, 2, 4096, 5, true)));
        // Not announced: hashed; announced but not zeros: hashed.
        assert_eq!(
            value_of(&zeros, 2, 4096, 5, false),
            block_value(&zeros, 2, 4096, 5)
        );
        assert_eq!(
            value_of(&one, 2, 4096, 5, true),
            block_value(&one, 2, 4096, 5)
        );
        assert!(!is_hole_value(&block_value(&zeros, 2, 4096, 5)));
        // Place and length are bound.
        assert_ne!(hole_value(2, 4096), hole_value(3, 4096));
        assert_ne!(hole_value(2, 4096), hole_value(2, 4095));
        assert!(is_zeros(&[]) && !is_zeros(&[0, 0, 9]));
        assert_eq!(HashKind::with_holes(true).name(), "blake3-sparse");
        assert_eq!(HashKind::with_holes(false).name(), "blake3");
    }

    /// Files of random sizes with random holes: the root without announced holes is the
    /// plain BLAKE3 of the bytes whatever the layout, and with them it changes with any byte.
    mod sparse {
        use super::*;
        use proptest::prelude::*;

        fn build(size: usize, data_at: &[(usize, u8)]) -> Vec<u8> {
            let mut d = vec![0u8; size];
            for &(at, b) in data_at {
                if size > 0 {
                    d[at % size] = b;
                }
            }
            d
        }

        fn root(d: &[u8], bs: usize, announced: &[bool]) -> [u8; 32] {
            let n = d.len().div_ceil(bs) as u64;
            let values: Vec<BlockValue> = d
                .chunks(bs)
                .enumerate()
                .map(|(i, c)| value_of(c, i as u64, bs as u64, n, announced[i]))
                .collect();
            file_hash(&values)
        }

        proptest! {
            #[test]
            fn roots_of_sparse_files(
                size in 0usize..40_000,
                bs_log in 10u32..13,
                data_at in proptest::collection::vec((0usize..40_000, 1u8..), 0..6),
                flip in 0usize..40_000,
            ) {
                let bs = 1usize << bs_log;
                let d = build(size, &data_at);
                let n = d.len().div_ceil(bs);
                // Announced: every block that is all zeros (what the sender finds).
                let holes: Vec<bool> = d.chunks(bs).map(is_zeros).collect();
                prop_assert_eq!(root(&d, bs, &vec![false; n]), *blake3::hash(&d).as_bytes());
                let sparse = root(&d, bs, &holes);
                if holes.iter().any(|&h| h) {
                    prop_assert_ne!(sparse, *blake3::hash(&d).as_bytes());
                } else {
                    prop_assert_eq!(sparse, *blake3::hash(&d).as_bytes());
                }
                // Any changed byte changes the sparse root too, in a hole or not.
                if size > 0 {
                    let mut e = d.clone();
                    e[flip % size] ^= 0x40;
                    prop_assert_ne!(root(&e, bs, &holes), sparse);
                }
            }
        }
    }
}
