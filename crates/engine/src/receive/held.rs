//! What a transfer holds and does not send: part files resumed from an interrupted transfer
//! ([`Resumed`], their journaled blocks held unread or hashed again), the holes of sparse files ([`Holes`],
//! valued on a thread of their own by [`hash_holes`], without hashing: see
//! [`hurtle_proto::hash::hole_value`]), and the manifest's checks of its blocks
//! and holes before anything is created (`check_blocks`, in the receiver's set-up machine).

use super::parallel::in_runs;
use super::shared::{ChanEvent, Shared};
use crate::error::SessionError;
use crate::fs::{self, PartFile, StoreError};
use crossbeam_channel::Sender;
use hurtle_proto::hash::{block_value, hole_value, is_zeros, BlockValue};
use hurtle_proto::wire::Entry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A part file left by an interrupted transfer, with the blocks its journal lists and their
/// values: as the journal vouches for them, or hashed again from the part file now where it
/// cannot (see [`crate::fs::journal`]).
pub(super) struct Resumed {
    pub(super) part: PartFile,
    /// `(block number within the file, value)`, ascending.
    pub(super) values: Vec<(u64, BlockValue)>,
}

impl Resumed {
    /// The part file of `e` and what it holds, if there is one to resume from (see
    /// [`PartFile::resume`]) and its journal lists any block.
    pub(super) fn open(
        out: &fs::OutRoot,
        e: &Entry,
        block_size: u64,
        overwrite: bool,
    ) -> Result<Option<Resumed>, SessionError> {
        let Some((part, journaled)) =
            PartFile::resume_in(out, &e.path, e.size, block_size, overwrite)?
        else {
            return Ok(None);
        };
        if journaled.is_empty() {
            return Ok(None);
        }
        // The journal's MACs vouch for its trusted blocks: held unread. Its other claims are
        // hashed again from the part file.
        let mut values = journaled.trusted;
        values.extend(hash_blocks(&part, e.size, block_size, &journaled.claims)?);
        values.sort_unstable_by_key(|&(b, _)| b);
        Ok(Some(Resumed { part, values }))
    }

    /// The held blocks as ascending half-open ranges, as a resume offer carries them.
    pub(super) fn block_ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &(b, _) in &self.values {
            match ranges.last_mut() {
                Some(last) if last.1 == b => last.1 = b + 1,
                _ => ranges.push((b, b + 1)),
            }
        }
        ranges
    }
}

/// The values of blocks `blocks` (numbers within the file, ascending) of `part`, a file of
/// `size` bytes, as read from it now: hashed on every core, since a nearly finished big file
/// holds a lot.
fn hash_blocks(
    part: &PartFile,
    size: u64,
    block_size: u64,
    blocks: &[u64],
) -> Result<Vec<(u64, BlockValue)>, StoreError> {
    let count = size.div_ceil(block_size);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(blocks.len())
        .max(1);
    let hash_some = |mine: &[u64]| -> Result<Vec<(u64, BlockValue)>, StoreError> {
        let mut buf = crate::iobuf::IoBuf::new(block_size as usize);
        mine.iter()
            .map(|&index| {
                let start = index * block_size;
                let len = (size - start).min(block_size) as usize;
                let data = &mut buf.aligned()[..len];
                part.read_at(start, data)?;
                Ok((index, block_value(data, index, block_size, count)))
            })
            .collect()
    };
    in_runs(blocks, threads, hash_some)
}

/// The values of announced holes `blocks` (numbers within the file, ascending) of `part`, a
/// file of `size` bytes: their [`hole_value`]s, without hashing. With `zeros` (they read as
/// zeros by construction) nothing is read either: reading a hole makes the kernel fill
/// page-cache pages with zeros. Otherwise each is read back, and one that holds anything but
/// zeros is overwritten with zeros first, so that it holds what its value says (if the
/// sender's copy is not zeros there after all, its value differs and the block is fetched).
fn hole_values(
    part: &PartFile,
    size: u64,
    block_size: u64,
    blocks: &[u64],
    zeros: bool,
) -> Result<Vec<(u64, BlockValue)>, StoreError> {
    let mut buf = (!zeros).then(|| crate::iobuf::IoBuf::new(block_size as usize));
    blocks
        .iter()
        .map(|&index| {
            let start = index * block_size;
            let len = (size - start).min(block_size) as usize;
            if let Some(buf) = &mut buf {
                let data = &mut buf.aligned()[..len];
                part.read_at(start, data)?;
                if !is_zeros(data) {
                    part.write_at(start, crate::iobuf::zeros(len))?;
                }
            }
            Ok((index, hole_value(index, len as u64)))
        })
        .collect()
}

/// True when block `b` lies in one of `ranges` (ascending, disjoint half-open ranges).
pub(super) fn in_ranges(ranges: &[(u64, u64)], b: u64) -> bool {
    let i = ranges.partition_point(|&(_, end)| end <= b);
    ranges.get(i).is_some_and(|&(start, _)| start <= b)
}

/// Blocks of holes hashed at a time, between looks at whether the session stopped.
const HOLE_BATCH: usize = 64;

/// The blocks of a sparse file's holes, for [`hash_holes`].
pub(super) struct Holes {
    /// File id.
    pub(super) file: u32,
    /// Block numbers within the file.
    pub(super) blocks: Vec<u64>,
    /// The part file reads as zeros there by construction (new, or the holes punched again);
    /// otherwise they are read back.
    pub(super) zeros: bool,
}

/// Starts a thread that values the blocks of sparse files' holes in their part files, where
/// nothing is written (see [`hole_values`]), and hands each value to the session loop as a
/// channel thread hands those of received blocks; the sender's values for them come as for
/// any other block. A hole the sender finds filled with data since it announced it has
/// another value there, and is fetched. On a thread of its own because a big sparse file
/// holds a lot (where its part file must be read back): the channels run meanwhile, and the
/// data blocks need not wait.
pub(super) fn hash_holes(
    shared: Arc<Shared>,
    events: Sender<ChanEvent>,
    holes: Vec<Holes>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("holes".into())
        .spawn(move || {
            let layout = &shared.layout;
            for Holes {
                file,
                blocks,
                zeros,
            } in holes
            {
                let Some(part) = &shared.files[file as usize] else {
                    continue;
                };
                let first = layout.blocks_of(file).start;
                for batch in blocks.chunks(HOLE_BATCH) {
                    if shared.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match hole_values(part, part.size(), layout.block_size(), batch, zeros) {
                        Ok(values) => {
                            for (index, value) in values {
                                let block = first + index;
                                let _ = events.send(ChanEvent::Block { block, value });
                            }
                        }
                        Err(e) => {
                            let _ = events.send(ChanEvent::Failed(e.into()));
                            return;
                        }
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_valued_without_hashing_and_made_zeros_where_they_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let (bs, size) = (4096u64, 3 * 4096 + 100);
        let part = PartFile::create(tmp.path(), "f", size, false).unwrap();
        // Block 1 holds other bytes (a resumed part file whose holes could not be punched).
        part.write_at(bs + 7, b"junk").unwrap();
        let want: Vec<(u64, BlockValue)> = [1, 3]
            .iter()
            .map(|&i| (i, hole_value(i, (size - i * bs).min(bs))))
            .collect();
        // By construction: nothing read, nothing written.
        assert_eq!(hole_values(&part, size, bs, &[1, 3], true).unwrap(), want);
        let mut block = vec![0u8; bs as usize];
        part.read_at(bs, &mut block).unwrap();
        assert!(!is_zeros(&block), "left alone");
        // Read back: the junk is made zeros, so the block holds what its value says.
        assert_eq!(hole_values(&part, size, bs, &[1, 3], false).unwrap(), want);
        part.read_at(bs, &mut block).unwrap();
        assert!(is_zeros(&block));
    }

    #[test]
    fn resumed_blocks_are_hashed_from_the_part_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (bs, size) = (4096u64, 2 * 4096 + 1);
        let part = PartFile::create(tmp.path(), "f", size, false).unwrap();
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        part.write_at(0, &data).unwrap();
        let got = hash_blocks(&part, size, bs, &[0, 2]).unwrap();
        assert_eq!(got[0], (0, block_value(&data[..4096], 0, bs, 3)));
        assert_eq!(got[1], (2, block_value(&data[8192..], 2, bs, 3)));
    }
}
