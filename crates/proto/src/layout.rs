//! Where every byte of a transfer lives: files cut into blocks, blocks dealt to channels.
//!
//! Both peers build the same [`Layout`] from the manifest (file sizes), the block size and the
//! channel count, so neither has to tell the other who sends what. Block `k` of the whole transfer
//! (blocks numbered across files in manifest order; a file's last block may be short; an empty file
//! has none) belongs to channel `k % channels`. Each channel sees its blocks laid end to end as one
//! contiguous *stripe*: stripe positions are what its loss tracking, NACKs and final marker talk
//! about, and [`Layout::locate`] / [`Layout::resolve`] translate between `(file, offset)` (what a
//! datagram carries) and `(channel, stripe position)`.
//!
//! A datagram never crosses a block boundary, so each block is received, hashed and verified on
//! its own.

use std::ops::Range;

/// Smallest block size allowed (one BLAKE3 chunk).
pub const MIN_BLOCK_SIZE: u64 = 1024;
/// Largest block size allowed.
pub const MAX_BLOCK_SIZE: u64 = 64 << 20;
/// Most channels a session may have.
pub const MAX_CHANNELS: u16 = 256;
/// Most blocks a transfer may have: 4 TiB in 1 MiB blocks, 256 TiB in the largest. Each side
/// keeps some tens of bytes per block (stripe positions, expected and computed values), and a
/// receiver must not be made to hold more than that for a manifest of huge sparse files that
/// takes no disk space. A sender raises its block size to stay within it
/// ([`fitting_block_size`]).
pub const MAX_BLOCKS: u64 = 1 << 22;

/// Why a layout could not be built, or a position is not part of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The block size is not a power of two within bounds.
    #[error("block size {0} must be a power of two between 1 KiB and 64 MiB")]
    BadBlockSize(u64),
    /// The channel count is zero or too large.
    #[error("channel count {0} must be between 1 and {MAX_CHANNELS}")]
    BadChannels(u16),
    /// The file id is not in the manifest.
    #[error("no file with id {0}")]
    NoSuchFile(u32),
    /// The range is empty, outside the file, or crosses a block boundary.
    #[error("range {start}..{end} is not inside one block of file {file}")]
    BadRange {
        /// File id.
        file: u32,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
    },
    /// The transfer has more blocks than a u64 stripe can address (not reachable in practice).
    #[error("transfer too large")]
    TooLarge,
    /// The transfer has more than [`MAX_BLOCKS`] blocks.
    #[error("the transfer has {blocks} blocks of {block_size} bytes, more than {MAX_BLOCKS}: send it with a larger --chunk-size")]
    TooManyBlocks {
        /// Blocks the transfer would have.
        blocks: u64,
        /// Its block size.
        block_size: u64,
    },
    /// Held block ranges that are empty, out of order, overlapping or past the file's end.
    #[error("held blocks {start}..{end} of file {file} are not ascending ranges inside the file")]
    BadHeld {
        /// File id.
        file: u32,
        /// First block of the offending range.
        start: u64,
        /// End of the offending range.
        end: u64,
    },
}

/// A resolved stripe position: which file bytes it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSpan {
    /// File id (index into the manifest).
    pub file: u32,
    /// Byte offset in the file.
    pub offset: u64,
    /// Global block number.
    pub block: u64,
    /// Bytes from `offset` to the end of the block.
    pub to_block_end: u64,
}

/// Where a datagram's bytes go: see [`Layout::place`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Channel that carries these bytes.
    pub channel: u16,
    /// Stripe position of the first byte.
    pub pos: u64,
    /// Global block number.
    pub block: u64,
    /// The block's range in the channel's stripe.
    pub block_stripe: Range<u64>,
    /// The block's first byte in its file.
    pub block_file_start: u64,
}

/// The shared map of files, blocks, channels and stripes. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    block_size: u64,
    channels: u16,
    sizes: Vec<u64>,
    /// First global block of each file (equal to the next file's for an empty file).
    first_block: Vec<u64>,
    total_blocks: u64,
    /// Per channel: stripe start of each of its blocks, plus the stripe length at the end.
    stripe_starts: Vec<Vec<u64>>,
}

impl Layout {
    /// Builds the layout for files of the given sizes.
    pub fn new(sizes: &[u64], block_size: u64, channels: u16) -> Result<Self, LayoutError> {
        if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
        {
            return Err(LayoutError::BadBlockSize(block_size));
        }
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(LayoutError::BadChannels(channels));
        }
        let total_blocks = count_blocks(sizes.iter().copied(), block_size);
        if total_blocks > MAX_BLOCKS {
            return Err(LayoutError::TooManyBlocks {
                blocks: total_blocks,
                block_size,
            });
        }
        let mut first_block = Vec::with_capacity(sizes.len());
        let mut next = 0;
        for &size in sizes {
            first_block.push(next);
            next += size.div_ceil(block_size);
        }
        let c = u64::from(channels);
        let mut stripe_starts: Vec<Vec<u64>> = (0..c)
            .map(|ch| Vec::with_capacity((total_blocks / c + 2) as usize + usize::from(ch == 0)))
            .collect();
        let mut lens = vec![0u64; channels as usize];
        let mut file = 0usize;
        for k in 0..total_blocks {
            while file + 1 < sizes.len() && first_block[file + 1] <= k {
                file += 1;
            }
            let within = k - first_block[file];
            let len = (sizes[file] - within * block_size).min(block_size);
            let ch = (k % c) as usize;
            stripe_starts[ch].push(lens[ch]);
            lens[ch] = lens[ch].checked_add(len).ok_or(LayoutError::TooLarge)?;
        }
        for (starts, len) in stripe_starts.iter_mut().zip(lens) {
            starts.push(len);
        }
        Ok(Layout {
            block_size,
            channels,
            sizes: sizes.to_vec(),
            first_block,
            total_blocks,
            stripe_starts,
        })
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }
    /// Number of channels.
    pub fn channels(&self) -> u16 {
        self.channels
    }
    /// Number of files.
    pub fn file_count(&self) -> usize {
        self.sizes.len()
    }
    /// Size of file `file`, if it exists.
    pub fn file_size(&self, file: u32) -> Option<u64> {
        self.sizes.get(file as usize).copied()
    }
    /// Total bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }
    /// Total number of blocks.
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }
    /// Length of channel `ch`'s stripe in bytes (0 for an unknown channel).
    pub fn stripe_len(&self, ch: u16) -> u64 {
        self.stripe_starts
            .get(ch as usize)
            .and_then(|s| s.last().copied())
            .unwrap_or(0)
    }
    /// The global blocks of file `file`.
    pub fn blocks_of(&self, file: u32) -> Range<u64> {
        let f = file as usize;
        match self.first_block.get(f) {
            Some(&first) => first..first + self.sizes[f].div_ceil(self.block_size),
            None => 0..0,
        }
    }
    /// Which file block `block` belongs to, and its index within that file.
    pub fn file_of_block(&self, block: u64) -> Option<(u32, u64)> {
        if block >= self.total_blocks {
            return None;
        }
        let f = self.first_block.partition_point(|&b| b <= block) - 1;
        Some((f as u32, block - self.first_block[f]))
    }
    /// The byte range of block `block` within its file.
    pub fn block_file_range(&self, block: u64) -> Option<(u32, Range<u64>)> {
        let (file, idx) = self.file_of_block(block)?;
        let start = idx * self.block_size;
        let end = (start + self.block_size).min(self.sizes[file as usize]);
        Some((file, start..end))
    }
    /// The channel and stripe range that carry block `block`.
    pub fn block_stripe_range(&self, block: u64) -> Option<(u16, Range<u64>)> {
        if block >= self.total_blocks {
            return None;
        }
        let c = u64::from(self.channels);
        let ch = (block % c) as usize;
        let j = (block / c) as usize;
        let starts = &self.stripe_starts[ch];
        Some((ch as u16, starts[j]..starts[j + 1]))
    }

    /// The global block numbers of the blocks of `file` listed in `held` (half-open ranges of
    /// the file's own block numbers, as a resume offer carries them), checking that the ranges
    /// are non-empty, ascending, disjoint and inside the file.
    pub fn held_blocks(&self, file: u32, held: &[(u64, u64)]) -> Result<Vec<u64>, LayoutError> {
        if file as usize >= self.sizes.len() {
            return Err(LayoutError::NoSuchFile(file));
        }
        let blocks = self.blocks_of(file);
        check_block_ranges(held, blocks.end - blocks.start)
            .map_err(|(start, end)| LayoutError::BadHeld { file, start, end })?;
        Ok(held
            .iter()
            .flat_map(|&(start, end)| (start..end).map(|b| blocks.start + b))
            .collect())
    }

    /// What is not sent: the blocks of each file listed in `resumed` (held by the receiver
    /// from an interrupted transfer) or in `holes` (a sparse file's holes), both as half-open
    /// ranges of the file's own block numbers, checked like [`Layout::held_blocks`]. Both
    /// peers work it out from the same manifest and decisions.
    pub fn held_stripes(
        &self,
        resumed: &[Vec<(u64, u64)>],
        holes: &[&[(u64, u64)]],
    ) -> Result<Held, LayoutError> {
        let mut held = Vec::new();
        let mut in_holes = Vec::new();
        for f in 0..self.file_count() {
            let r = resumed.get(f).map_or(&[][..], |r| &r[..]);
            let h = holes.get(f).copied().unwrap_or(&[]);
            held.extend(self.held_blocks(f as u32, &union_ranges(r, h))?);
            in_holes.extend(self.held_blocks(f as u32, h)?);
        }
        let (stripes, bytes) = self.stripes_by_channel(held);
        let (_, hole_bytes) = self.stripes_by_channel(in_holes);
        Ok(Held {
            stripes,
            // A block both resumed and in a hole counts as a hole.
            resumed_bytes: bytes - hole_bytes,
            hole_bytes,
        })
    }

    /// The stripe ranges that carry `blocks` (global block numbers), gathered by channel, and
    /// their total length: what each channel's sender and receiver `hold` on a resume. Blocks
    /// outside the layout are skipped.
    pub fn stripes_by_channel(
        &self,
        blocks: impl IntoIterator<Item = u64>,
    ) -> (Vec<Vec<Range<u64>>>, u64) {
        let mut stripes = vec![Vec::new(); usize::from(self.channels)];
        let mut bytes = 0;
        for (ch, stripe) in blocks
            .into_iter()
            .filter_map(|b| self.block_stripe_range(b))
        {
            bytes += stripe.end - stripe.start;
            stripes[usize::from(ch)].push(stripe);
        }
        (stripes, bytes)
    }

    /// Maps `len` bytes at `offset` of `file` to `(channel, stripe position)`, checking that the
    /// range is non-empty, inside the file and inside a single block.
    pub fn locate(&self, file: u32, offset: u64, len: u64) -> Result<(u16, u64), LayoutError> {
        self.place(file, offset, len).map(|p| (p.channel, p.pos))
    }

    /// Like [`Layout::locate`], but also says which block the bytes belong to and where it lies.
    /// (Once per datagram: the block and its stripe range are worked out once.)
    pub fn place(&self, file: u32, offset: u64, len: u64) -> Result<Placement, LayoutError> {
        let size = self.file_size(file).ok_or(LayoutError::NoSuchFile(file))?;
        let bad = || LayoutError::BadRange {
            file,
            start: offset,
            end: offset.saturating_add(len),
        };
        let end = offset.checked_add(len).ok_or_else(bad)?;
        let (index, within) = (offset / self.block_size, offset % self.block_size);
        // Inside one block: the range does not reach past the block's end.
        if len == 0 || end > size || within + len > self.block_size {
            return Err(bad());
        }
        let block = self.first_block[file as usize] + index;
        let (channel, block_stripe) = self.block_stripe_range(block).ok_or_else(bad)?;
        Ok(Placement {
            channel,
            pos: block_stripe.start + within,
            block,
            block_stripe,
            block_file_start: offset - within,
        })
    }

    /// Maps a position of channel `ch`'s stripe back to the file bytes it stands for.
    pub fn resolve(&self, ch: u16, pos: u64) -> Option<FileSpan> {
        let starts = self.stripe_starts.get(ch as usize)?;
        if pos >= *starts.last()? {
            return None;
        }
        let j = starts.partition_point(|&s| s <= pos) - 1;
        let block = j as u64 * u64::from(self.channels) + u64::from(ch);
        let (file, idx) = self.file_of_block(block)?;
        let within = pos - starts[j];
        Some(FileSpan {
            file,
            offset: idx * self.block_size + within,
            block,
            to_block_end: starts[j + 1] - pos,
        })
    }
}

/// What a transfer does not send ([`Layout::held_stripes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Stripe ranges, by channel: what each channel's sender and receiver `hold`.
    pub stripes: Vec<Vec<Range<u64>>>,
    /// Their bytes resumed from an earlier transfer.
    pub resumed_bytes: u64,
    /// Their bytes in sparse files' holes.
    pub hole_bytes: u64,
}

impl Held {
    /// All their bytes.
    pub fn bytes(&self) -> u64 {
        self.resumed_bytes + self.hole_bytes
    }
}

/// The blocks of `block_size` bytes that files of `sizes` bytes make (saturating).
pub fn count_blocks(sizes: impl IntoIterator<Item = u64>, block_size: u64) -> u64 {
    sizes.into_iter().fold(0u64, |n, size| {
        n.saturating_add(size.div_ceil(block_size.max(1)))
    })
}

/// The smallest block size, `block_size` or a larger power of two up to [`MAX_BLOCK_SIZE`],
/// that cuts files of `sizes` bytes into at most [`MAX_BLOCKS`] blocks (the largest if none
/// does; the layout then refuses the transfer).
pub fn fitting_block_size(sizes: &[u64], block_size: u64) -> u64 {
    let mut b = block_size;
    while b < MAX_BLOCK_SIZE && count_blocks(sizes.iter().copied(), b) > MAX_BLOCKS {
        b *= 2;
    }
    b
}

/// Checks that `ranges` are non-empty, ascending, disjoint half-open ranges of block numbers
/// below `count` (as resume offers and sparse files' holes carry them); the first one that is
/// not is the error.
pub fn check_block_ranges(ranges: &[(u64, u64)], count: u64) -> Result<(), (u64, u64)> {
    let mut floor = 0;
    for &(start, end) in ranges {
        if start < floor || start >= end || end > count {
            return Err((start, end));
        }
        floor = end;
    }
    Ok(())
}

/// The union of two lists of ascending, disjoint half-open ranges, as one such list with
/// touching ranges joined.
pub fn union_ranges(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (start, end) in all {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn deals_blocks_round_robin() {
        // files: 2.5 blocks, empty, 1 block; block size 1024; 2 channels.
        let l = Layout::new(&[2560, 0, 1024], 1024, 2).unwrap();
        assert_eq!(l.total_blocks(), 4);
        assert_eq!(l.stripe_len(0), 1024 + 512);
        assert_eq!(l.stripe_len(1), 1024 + 1024);
        assert_eq!(l.blocks_of(1), 3..3);
        assert_eq!(l.file_of_block(3), Some((2, 0)));
        assert_eq!(l.locate(0, 2048, 512), Ok((0, 1024)));
        assert_eq!(l.locate(2, 0, 10), Ok((1, 1024)));
        assert!(l.locate(0, 1000, 100).is_err(), "crosses a block boundary");
        assert_eq!(
            l.locate(0, 1000, 24),
            Ok((0, 1000)),
            "ends at the block's end"
        );
        assert!(
            l.locate(0, 1000, 25).is_err(),
            "one byte past the block's end"
        );
        assert!(l.locate(0, 2560, 1).is_err(), "past end of file");
        assert!(l.locate(1, 0, 1).is_err(), "empty file has no bytes");
        assert!(l.locate(9, 0, 1).is_err());
        assert!(l.locate(0, u64::MAX, 2).is_err());
        assert_eq!(l.resolve(0, 1024).unwrap().offset, 2048);
        let p = l.place(0, 2100, 10).unwrap();
        assert_eq!(
            (
                p.channel,
                p.pos,
                p.block,
                p.block_stripe,
                p.block_file_start
            ),
            (0, 1076, 2, 1024..1536, 2048)
        );
        assert_eq!(l.resolve(0, 1536), None);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Layout::new(&[1], 1000, 1).is_err());
        assert!(Layout::new(&[1], 1024, 0).is_err());
        assert!(Layout::new(&[], 1024, 3).unwrap().total_blocks() == 0);
    }

    #[test]
    fn held_blocks_are_checked_and_made_global() {
        // File 0 has 3 blocks (0..3), file 1 has 2 (3..5).
        let l = Layout::new(&[3 * 1024, 1500], 1024, 2).unwrap();
        assert_eq!(l.held_blocks(1, &[(0, 2)]).unwrap(), vec![3, 4]);
        assert_eq!(l.held_blocks(0, &[(0, 1), (2, 3)]).unwrap(), vec![0, 2]);
        assert_eq!(l.held_blocks(0, &[]).unwrap(), Vec::<u64>::new());
        for bad in [
            &[(0, 4)][..],
            &[(1, 1)],
            &[(2, 3), (0, 1)],
            &[(0, 2), (1, 3)],
            &[(u64::MAX, 0)],
        ] {
            assert!(
                matches!(l.held_blocks(0, bad), Err(LayoutError::BadHeld { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(l.held_blocks(2, &[]), Err(LayoutError::NoSuchFile(2)));
    }

    #[test]
    fn a_transfer_has_at_most_max_blocks() {
        let mb = 1 << 20;
        // 4 TiB in 1 MiB blocks is the most; one byte more is refused, in 2 MiB blocks not.
        let most = MAX_BLOCKS * mb;
        assert_eq!(count_blocks([most, 0], mb), MAX_BLOCKS);
        assert!(Layout::new(&[most + 1], mb, 1).is_err_and(|e| matches!(
            e,
            LayoutError::TooManyBlocks { blocks, .. } if blocks == MAX_BLOCKS + 1
        )));
        assert_eq!(fitting_block_size(&[most], mb), mb);
        assert_eq!(fitting_block_size(&[most, 1], mb), 2 * mb);
        assert_eq!(fitting_block_size(&[u64::MAX], mb), MAX_BLOCK_SIZE);
        assert_eq!(count_blocks([u64::MAX, u64::MAX], 1), u64::MAX);
        assert!(Layout::new(&[u64::MAX], MAX_BLOCK_SIZE, 1).is_err());
    }

    #[test]
    fn block_ranges_are_checked_and_joined() {
        assert_eq!(check_block_ranges(&[(0, 1), (2, 3)], 3), Ok(()));
        assert_eq!(check_block_ranges(&[(0, 2), (1, 3)], 3), Err((1, 3)));
        assert_eq!(check_block_ranges(&[(2, 4)], 3), Err((2, 4)));
        assert_eq!(
            union_ranges(&[(0, 2), (5, 6)], &[(1, 3), (3, 4), (8, 9)]),
            vec![(0, 4), (5, 6), (8, 9)]
        );
        assert_eq!(union_ranges(&[], &[(1, 2)]), vec![(1, 2)]);
    }

    proptest::proptest! {
        #[test]
        fn union_matches_a_set_of_blocks(
            a in proptest::collection::btree_set(0u64..64, 0..40),
            b in proptest::collection::btree_set(0u64..64, 0..40),
        ) {
            let ranges = |set: &std::collections::BTreeSet<u64>| {
                let blocks: Vec<u64> = set.iter().copied().collect();
                let mut r: Vec<(u64, u64)> = Vec::new();
                for x in blocks {
                    match r.last_mut() {
                        Some(last) if last.1 == x => last.1 = x + 1,
                        _ => r.push((x, x + 1)),
                    }
                }
                r
            };
            let want = ranges(&a.union(&b).copied().collect());
            let got = union_ranges(&ranges(&a), &ranges(&b));
            proptest::prop_assert!(check_block_ranges(&got, 64).is_ok());
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn stripes_of_blocks_are_gathered_by_channel() {
        // Blocks 0..5 alternate between the two channels; block 4 is the short tail (476).
        let l = Layout::new(&[3 * 1024, 1500], 1024, 2).unwrap();
        let (stripes, bytes) = l.stripes_by_channel([0, 2, 4, 1, 99]);
        assert_eq!(stripes[0], vec![0..1024, 1024..2048, 2048..2524]);
        assert_eq!(stripes[1], vec![0..1024]);
        assert_eq!(bytes, 3 * 1024 + 476);
    }

    proptest! {
        /// Every byte of every file maps to exactly one stripe position and back.
        #[test]
        fn locate_and_resolve_are_inverse(
            sizes in proptest::collection::vec(0u64..9000, 0..6),
            channels in 1u16..5,
        ) {
            let l = Layout::new(&sizes, 1024, channels).unwrap();
            let mut seen = std::collections::HashSet::new();
            for (f, &size) in sizes.iter().enumerate() {
                for off in (0..size).step_by(97) {
                    let (ch, pos) = l.locate(f as u32, off, 1).unwrap();
                    prop_assert!(seen.insert((ch, pos)));
                    let span = l.resolve(ch, pos).unwrap();
                    prop_assert_eq!((span.file, span.offset), (f as u32, off));
                    prop_assert!(span.to_block_end >= 1 && span.to_block_end <= 1024);
                }
            }
            let total: u64 = (0..channels).map(|c| l.stripe_len(c)).sum();
            prop_assert_eq!(total, sizes.iter().sum::<u64>());
        }
    }
}
