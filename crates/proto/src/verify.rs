//! Block and file verification bookkeeping (BLAKE3), shared by both peers.
//!
//! The sender fills a [`BlockTable`] with the value of each block as it reads it and sends the
//! values to the receiver. The receiver's [`Verifier`] holds those expected values and the values
//! it computed itself over what it received; a block counts only when both exist and agree. A
//! mismatch sends the block back to be fetched again, a limited number of times (a source file
//! changing under the sender would otherwise loop forever). When every block of a file is
//! verified, the file's BLAKE3 root is known and the file can be synced and renamed into place.

use crate::hash::{file_hash, BlockValue};
use crate::layout::Layout;
use std::collections::HashMap;

/// Most times one block may fail verification before the transfer gives up. A block whose wrong
/// value comes back *the same* twice gives up at once: the sender's bytes really differ from
/// what it hashed (the source changed), which no refetch can mend. Differing wrong values are
/// what corruption on the path looks like, and get this many attempts. With data in the clear
/// ([`Verifier::set_unauthenticated`]) a repeated wrong value may be an attacker's repeated
/// injection, and gets this many attempts too.
pub const MAX_BLOCK_FAILURES: u8 = 8;

/// Per-block values, and per-file completion.
#[derive(Debug, Clone)]
pub struct BlockTable {
    values: Vec<Option<BlockValue>>,
    missing_per_file: Vec<u64>,
    layout: Layout,
}

impl BlockTable {
    /// An empty table for `layout`.
    pub fn new(layout: &Layout) -> Self {
        let missing_per_file = (0..layout.file_count() as u32)
            .map(|f| {
                let b = layout.blocks_of(f);
                b.end - b.start
            })
            .collect();
        BlockTable {
            values: vec![None; layout.total_blocks() as usize],
            missing_per_file,
            layout: layout.clone(),
        }
    }

    /// The value of `block`, if known.
    pub fn get(&self, block: u64) -> Option<&BlockValue> {
        self.values.get(block as usize).and_then(|v| v.as_ref())
    }

    /// Stores the value of `block`. Returns `Some((file, root hash))` when this completes a file.
    /// Setting a block twice keeps the first value.
    pub fn set(&mut self, block: u64, value: BlockValue) -> Option<(u32, [u8; 32])> {
        let slot = self.values.get_mut(block as usize)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(value);
        let (file, _) = self.layout.file_of_block(block)?;
        let missing = &mut self.missing_per_file[file as usize];
        *missing -= 1;
        if *missing > 0 {
            return None;
        }
        Some((file, self.file_root(file)?))
    }

    /// The root hash of `file` once all its blocks are known (also for an empty file).
    pub fn file_root(&self, file: u32) -> Option<[u8; 32]> {
        let blocks = self.layout.blocks_of(file);
        let values: Option<Vec<BlockValue>> = blocks.map(|b| self.values[b as usize]).collect();
        Some(file_hash(&values?))
    }
}

/// What verification concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to conclude yet (waiting for the other value).
    Pending,
    /// The block is good.
    Verified,
    /// The block is good and completes its file, whose BLAKE3 is given.
    FileComplete {
        /// File id.
        file: u32,
        /// BLAKE3 root of the file.
        hash: [u8; 32],
    },
    /// The block's bytes do not match: fetch it again.
    Mismatch {
        /// Global block number.
        block: u64,
    },
    /// The block failed too often (the source probably changed while being sent).
    GiveUp {
        /// Global block number.
        block: u64,
    },
}

/// The receiver's verification state. See the module docs.
#[derive(Debug, Clone)]
pub struct Verifier {
    expected: Vec<Option<BlockValue>>,
    /// Values computed by the receiver whose expected value has not arrived.
    waiting: HashMap<u64, BlockValue>,
    verified: BlockTable,
    /// Per failing block: attempts so far and the last wrong value.
    failures: HashMap<u64, (u8, BlockValue)>,
    /// Data comes in the clear, not authenticated ([`Verifier::set_unauthenticated`]).
    unauthenticated: bool,
}

impl Verifier {
    /// A verifier for `layout`.
    pub fn new(layout: &Layout) -> Self {
        Verifier {
            expected: vec![None; layout.total_blocks() as usize],
            waiting: HashMap::new(),
            verified: BlockTable::new(layout),
            failures: HashMap::new(),
            unauthenticated: false,
        }
    }

    /// Data comes in the clear (`--no-encryption`): its datagrams carry no tag, so anyone on
    /// the path can inject a block's bytes, the same ones each time. A wrong value that comes
    /// back the same is then no proof that the source changed: such a block is fetched again,
    /// as any other, up to [`MAX_BLOCK_FAILURES`] times.
    pub fn set_unauthenticated(&mut self) {
        self.unauthenticated = true;
    }

    /// The sender's value for `block` arrived. Unknown blocks are ignored (`Pending`).
    pub fn on_expected(&mut self, block: u64, value: BlockValue) -> Verdict {
        let Some(slot) = self.expected.get_mut(block as usize) else {
            return Verdict::Pending;
        };
        *slot = Some(value);
        match self.waiting.remove(&block) {
            Some(actual) => self.judge(block, actual),
            None => Verdict::Pending,
        }
    }

    /// The receiver computed `value` over the bytes it holds for `block`.
    pub fn on_received(&mut self, block: u64, value: BlockValue) -> Verdict {
        if block as usize >= self.expected.len() || self.verified.get(block).is_some() {
            return Verdict::Pending;
        }
        if self.expected[block as usize].is_none() {
            self.waiting.insert(block, value);
            return Verdict::Pending;
        }
        self.judge(block, value)
    }

    fn judge(&mut self, block: u64, actual: BlockValue) -> Verdict {
        if self.expected[block as usize] != Some(actual) {
            let (n, last) = self.failures.entry(block).or_insert((0, actual));
            let repeated = !self.unauthenticated && *n > 0 && *last == actual;
            *n += 1;
            *last = actual;
            return if repeated || *n >= MAX_BLOCK_FAILURES {
                Verdict::GiveUp { block }
            } else {
                Verdict::Mismatch { block }
            };
        }
        match self.verified.set(block, actual) {
            Some((file, hash)) => Verdict::FileComplete { file, hash },
            None => Verdict::Verified,
        }
    }

    /// The value of `block` once it is verified.
    pub fn verified_value(&self, block: u64) -> Option<&BlockValue> {
        self.verified.get(block)
    }

    /// Blocks waiting for their expected value.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::block_value;

    #[test]
    fn verifies_in_any_order_and_completes_files() {
        let l = Layout::new(&[3000, 0, 100], 1024, 2).unwrap();
        let files: Vec<Vec<u8>> = vec![(0..3000).map(|i| i as u8).collect(), vec![], vec![7; 100]];
        let value = |b: u64| {
            let (f, r) = l.block_file_range(b).unwrap();
            let blocks = l.blocks_of(f);
            block_value(
                &files[f as usize][r.start as usize..r.end as usize],
                b - blocks.start,
                1024,
                blocks.end - blocks.start,
            )
        };
        let mut v = Verifier::new(&l);
        assert_eq!(v.on_received(0, value(0)), Verdict::Pending);
        assert_eq!(v.on_expected(0, value(0)), Verdict::Verified);
        assert_eq!(v.on_expected(1, value(1)), Verdict::Pending);
        assert_eq!(v.on_received(1, [0; 32]), Verdict::Mismatch { block: 1 });
        assert_eq!(v.on_received(1, value(1)), Verdict::Verified);
        assert_eq!(v.on_expected(2, value(2)), Verdict::Pending);
        let done = v.on_received(2, value(2));
        assert_eq!(
            done,
            Verdict::FileComplete {
                file: 0,
                hash: *blake3::hash(&files[0]).as_bytes()
            }
        );
        assert_eq!(v.on_expected(3, value(3)), Verdict::Pending);
        assert_eq!(
            v.on_received(3, value(3)),
            Verdict::FileComplete {
                file: 2,
                hash: *blake3::hash(&files[2]).as_bytes()
            }
        );
        assert_eq!(
            v.on_received(3, value(3)),
            Verdict::Pending,
            "already verified"
        );
        assert_eq!(
            v.on_received(99, value(3)),
            Verdict::Pending,
            "unknown block"
        );
    }

    #[test]
    fn gives_up_when_the_same_wrong_value_repeats() {
        let l = Layout::new(&[10], 1024, 1).unwrap();
        let mut v = Verifier::new(&l);
        v.on_expected(0, [1; 32]);
        assert_eq!(v.on_received(0, [2; 32]), Verdict::Mismatch { block: 0 });
        assert_eq!(v.on_received(0, [2; 32]), Verdict::GiveUp { block: 0 });
    }

    #[test]
    fn corruption_gets_several_attempts_but_not_endless_ones() {
        let l = Layout::new(&[10], 1024, 1).unwrap();
        let mut v = Verifier::new(&l);
        v.on_expected(0, [1; 32]);
        for i in 1..MAX_BLOCK_FAILURES {
            assert_eq!(
                v.on_received(0, [i + 1; 32]),
                Verdict::Mismatch { block: 0 }
            );
        }
        assert_eq!(v.on_received(0, [99; 32]), Verdict::GiveUp { block: 0 });
    }

    #[test]
    fn in_the_clear_a_repeated_wrong_value_is_fetched_again_up_to_the_limit() {
        let l = Layout::new(&[1000], 1024, 1).unwrap();
        let good = block_value(&[1u8; 1000], 0, 1024, 1);
        let injected = block_value(&[2u8; 1000], 0, 1024, 1);
        // Authenticated data: the same wrong value twice is a changed source, at once.
        let mut v = Verifier::new(&l);
        assert_eq!(v.on_expected(0, good), Verdict::Pending);
        assert_eq!(v.on_received(0, injected), Verdict::Mismatch { block: 0 });
        assert_eq!(v.on_received(0, injected), Verdict::GiveUp { block: 0 });
        // In the clear: fetched again each time, until the limit.
        let mut v = Verifier::new(&l);
        v.set_unauthenticated();
        assert_eq!(v.on_expected(0, good), Verdict::Pending);
        for _ in 1..MAX_BLOCK_FAILURES {
            assert_eq!(v.on_received(0, injected), Verdict::Mismatch { block: 0 });
        }
        assert_eq!(v.on_received(0, injected), Verdict::GiveUp { block: 0 });
        // And the real bytes, coming before the limit, verify.
        let mut v = Verifier::new(&l);
        v.set_unauthenticated();
        assert_eq!(v.on_expected(0, good), Verdict::Pending);
        assert_eq!(v.on_received(0, injected), Verdict::Mismatch { block: 0 });
        assert_eq!(v.on_received(0, injected), Verdict::Mismatch { block: 0 });
        assert!(matches!(
            v.on_received(0, good),
            Verdict::FileComplete { file: 0, .. }
        ));
    }
}
