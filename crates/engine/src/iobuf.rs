//! Buffers for reading files, placed so the kernel's copy runs at full speed.
//!
//! The kernel copies a file's bytes out of the page cache with `rep movsb`. On AMD EPYC that
//! copy runs at about a third of its speed when the destination's address differs from the
//! source's modulo 64, as it does in a buffer 8 or 16 bytes off a page (which is where a plain
//! `Vec<u8>` of a read's size starts). [`IoBuf`] hands out slices that start where the file
//! offset does, modulo [`ALIGN`]. Writes into the page cache did not show the effect, so only
//! reads use it.

/// `len` zero bytes (at most 64 MiB, the largest block), to hash a hole without reading it.
/// One buffer for the process, allocated zeroed and never written: the kernel backs it with
/// its shared zero page, so it costs neither memory nor cache.
pub fn zeros(len: usize) -> &'static [u8] {
    static ZEROS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    &ZEROS.get_or_init(|| vec![0u8; MAX_ZEROS])[..len]
}

/// Length of the buffer [`zeros`] hands out slices of.
const MAX_ZEROS: usize = 64 << 20;

/// The alignment a read's destination must share with its file offset.
pub const ALIGN: usize = 64;

/// A byte buffer from which slices matching a file offset's alignment are cut.
pub struct IoBuf {
    raw: Vec<u8>,
    /// Where in `raw` the first [`ALIGN`]-aligned byte is.
    base: usize,
    len: usize,
}

impl IoBuf {
    /// A zeroed buffer that can hold `len` bytes read from any offset.
    pub fn new(len: usize) -> IoBuf {
        let raw = vec![0u8; len + 2 * ALIGN];
        let base = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        IoBuf { raw, base, len }
    }

    /// The most bytes one slice can hold.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` bytes (at most [`IoBuf::len`]) placed for a read from file offset `offset`.
    pub fn for_offset(&mut self, offset: u64, len: usize) -> &mut [u8] {
        assert!(
            len <= self.len,
            "IoBuf of {} bytes asked for {len}",
            self.len
        );
        let start = self.base + (offset % ALIGN as u64) as usize;
        &mut self.raw[start..start + len]
    }

    /// The buffer's bytes from a 0-aligned start: for a block read from a block-aligned offset.
    pub fn aligned(&mut self) -> &mut [u8] {
        &mut self.raw[self.base..self.base + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_offsets_alignment() {
        for len in [0usize, 1, 1000, 1 << 20] {
            let mut b = IoBuf::new(len);
            assert_eq!(b.aligned().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.aligned().len(), len);
            for offset in [0u64, 1, 63, 64, 4096 + 17, (1 << 40) + 5] {
                let s = b.for_offset(offset, len);
                assert_eq!(s.len(), len);
                assert_eq!(
                    s.as_ptr() as usize % ALIGN,
                    (offset % ALIGN as u64) as usize
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "asked for")]
    fn a_slice_longer_than_the_buffer_is_a_bug() {
        IoBuf::new(10).for_offset(0, 11);
    }
}
