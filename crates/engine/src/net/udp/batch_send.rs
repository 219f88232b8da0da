//! Sending: datagrams out of a [`UdpChannel`] in as few system calls as the kernel allows.
//!
//! The caller hands [`UdpChannel::send_batch`] one buffer holding several datagrams back to back,
//! each `segment_size` bytes long except possibly the last, or [`UdpChannel::send_framed`]
//! the same datagrams as headers in one buffer and payloads as consecutive slices of another
//! (a block of the file), so the sender never copies payload into a datagram buffer. Either way
//! the kernel gathers each datagram from its pieces (one iovec, or a header's and a payload's);
//! both go through one loop, `send_gathered`.
//!
//! - **GSO** (Linux 4.18+, [`UdpChannel::max_gso_segments`] > 1): the datagrams are cut into
//!   runs of at most `max_gso_segments()` segments and at most [`MAX_GSO_BYTES`] bytes, and each
//!   run is one `sendmsg` with a `UDP_SEGMENT` control message (made by the engine: quinn-udp
//!   sends only contiguous buffers). The kernel, or the NIC, cuts it into datagrams. With
//!   1424-byte datagrams that is 45 per system call. A lone datagram is sent without
//!   `UDP_SEGMENT`.
//! - **Fallback** (no GSO, or [`ChannelOptions::gso`](super::ChannelOptions::gso) off): the
//!   datagrams go out with `sendmmsg(2)`, up to 64 per call. Its message headers and iovecs
//!   live in fixed arrays on the stack, so nothing is allocated per call. If a GSO send fails
//!   with `EIO`/`EINVAL` (a driver that cannot segment), GSO is turned off for the socket and
//!   the run is sent again on this path.
//! - Gathering the payload from its block instead of copying it into datagram buffers takes
//!   away the user-space copy, and the kernel's copy grows by less than that (it reads the
//!   block rather than a freshly written buffer).
//! - On a [connected](UdpChannel::connect) socket, sends to its peer carry no address: the
//!   kernel then takes the route it keeps for the connection rather than looking one up for
//!   each call (the FIB lookup was a few per cent of a paced sender's samples).
//! - A full send buffer (`EAGAIN`) is waited out with `poll(2)`, and `ENOBUFS` (a full device
//!   queue) with short sleeps; both for at most [`SEND_STALL_LIMIT`] in a row before
//!   [`UdpError::SendStalled`].

use super::{UdpChannel, UdpError, MAX_DATAGRAM};
use crate::sys::{self, socket::MMSG_BATCH};
use std::{
    io,
    net::SocketAddr,
    os::fd::AsFd,
    time::{Duration, Instant},
};

/// Most bytes one GSO send carries. The kernel cuts a GSO packet into datagrams in software,
/// before the device, when its length with IP, UDP and link headers reaches the device's
/// `gso_max_size` (64 KiB on loopback and most NICs): the NIC's segmentation offload is then
/// lost, and on loopback the receiver gets every datagram on its own instead of one GRO buffer.
/// Measured on loopback over IPv4: 65 492 payload bytes in one send stayed one packet, 65 494
/// arrived as separate datagrams. This limit leaves room for IPv6's 40-byte header and a
/// 14-byte Ethernet header: 45 datagrams of a 1500-byte path's size per send (46 were cut up).
pub const MAX_GSO_BYTES: usize = 65_536 - 14 - 40 - 8 - 1;

/// Most datagrams one [`UdpChannel::send_framed`] call gathers into one system call.
pub const MAX_FRAMED: usize = 64;

/// How long a send may keep failing with a full send buffer or `ENOBUFS` before
/// [`UdpChannel::send_batch`] gives up with [`UdpError::SendStalled`].
pub const SEND_STALL_LIMIT: Duration = Duration::from_secs(2);

/// Longest single sleep while the device queue is full (`ENOBUFS`).
const ENOBUFS_MAX_SLEEP: Duration = Duration::from_millis(1);

impl UdpChannel {
    /// Sends the datagrams in `buf` to `dest`: `buf` holds them back to back, each
    /// `segment_size` bytes except possibly the last, which may be shorter. Uses one GSO
    /// `sendmsg` per [`max_gso_segments`](Self::max_gso_segments) datagrams, or `sendmmsg` for up
    /// to 64 at a time without GSO. An empty `buf` sends nothing.
    ///
    /// `segment_size` must fit the path MTU. With GSO, a segment the device cannot carry fails
    /// with `EINVAL`, which is taken for "GSO unsupported": GSO is turned off for this socket
    /// and the datagrams then fail with `EMSGSIZE` as they would without GSO.
    pub fn send_batch(
        &mut self,
        dest: SocketAddr,
        buf: &[u8],
        segment_size: usize,
    ) -> Result<(), UdpError> {
        if segment_size == 0 || segment_size > MAX_DATAGRAM {
            return Err(UdpError::InvalidSegmentSize(segment_size));
        }
        let count = buf.len().div_ceil(segment_size);
        self.send_gathered(dest, segment_size, count, 1, |d| {
            [
                &buf[d * segment_size..((d + 1) * segment_size).min(buf.len())],
                &[],
            ]
        })
    }

    /// Sends datagrams that are each one header of `headers` (`header_len` bytes each, back to
    /// back) followed by the next `payload` bytes of `data` (the last datagram's share may be
    /// shorter): the datagrams [`send_batch`](Self::send_batch) would send of the same bytes
    /// laid out datagram by datagram, without copying `data` into such a buffer. The kernel
    /// gathers each datagram from its two pieces: `sendmsg` with iovecs and `UDP_SEGMENT`
    /// (at most [`MAX_FRAMED`] datagrams and [`MAX_GSO_BYTES`] per call), or `sendmmsg`
    /// without GSO. `headers` must hold a header for every datagram `data` makes.
    pub fn send_framed(
        &mut self,
        dest: SocketAddr,
        headers: &[u8],
        header_len: usize,
        data: &[u8],
        payload: usize,
    ) -> Result<(), UdpError> {
        let segment_size = header_len + payload;
        if header_len == 0 || payload == 0 || segment_size > MAX_DATAGRAM {
            return Err(UdpError::InvalidSegmentSize(segment_size));
        }
        let count = data.len().div_ceil(payload);
        if headers.len() < count * header_len {
            return Err(UdpError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fewer headers than datagrams",
            )));
        }
        self.send_gathered(dest, segment_size, count, 2, |d| {
            [
                &headers[d * header_len..(d + 1) * header_len],
                &data[d * payload..((d + 1) * payload).min(data.len())],
            ]
        })
    }

    /// Sends datagrams `0..count`, each gathered by the kernel from the first `per` (1 or 2)
    /// of the pieces `pieces(d)` gives, every datagram `segment_size` bytes long but the last:
    /// with GSO one `sendmsg` with `UDP_SEGMENT` per [`MAX_GSO_BYTES`] (a lone datagram goes
    /// without it, as a plain send), else `sendmmsg` for up to [`MMSG_BATCH`] datagrams. A GSO
    /// send that fails with `EIO`/`EINVAL` (a device that cannot segment) turns GSO off for the
    /// socket and is sent again without it.
    fn send_gathered<'a>(
        &mut self,
        dest: SocketAddr,
        segment_size: usize,
        count: usize,
        per: usize,
        pieces: impl Fn(usize) -> [&'a [u8]; 2],
    ) -> Result<(), UdpError> {
        let dest = self.send_address(dest);
        let dest = dest.as_ref();
        let mut first = 0;
        while first < count {
            let gso = self.max_gso_segments();
            let n = if gso > 1 {
                gso.min(MAX_GSO_BYTES / segment_size).max(1)
            } else {
                MMSG_BATCH
            }
            .min(MAX_FRAMED)
            .min(count - first);
            let mut iovs = [sys::socket::iovec(&[]); 2 * MAX_FRAMED];
            for (i, slots) in iovs.chunks_exact_mut(per).take(n).enumerate() {
                for (slot, piece) in slots.iter_mut().zip(pieces(first + i)) {
                    *slot = sys::socket::iovec(piece);
                }
            }
            let iovs = &iovs[..per * n];
            let fd = self.socket.as_fd();
            if gso > 1 && n > 1 {
                match self
                    .retry_send(|| sys::socket::sendmsg_segmented(fd, dest, iovs, segment_size))
                {
                    Ok(()) => first += n,
                    Err(UdpError::Io(e))
                        if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
                    {
                        self.gso = false;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                first += self.retry_send(|| sys::socket::sendmmsg(fd, dest, iovs, per))?;
            }
        }
        Ok(())
    }

    /// Runs a send operation, waiting out a full send buffer or device queue for at most
    /// [`SEND_STALL_LIMIT`].
    fn retry_send<T>(&self, mut op: impl FnMut() -> io::Result<T>) -> Result<T, UdpError> {
        let mut stalled_since: Option<Instant> = None;
        let mut nap = Duration::from_micros(20);
        loop {
            let e = match op() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let would_block = e.kind() == io::ErrorKind::WouldBlock;
            if !would_block && e.raw_os_error() != Some(libc::ENOBUFS) {
                return Err(UdpError::from_io(e));
            }
            let since = *stalled_since.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited >= SEND_STALL_LIMIT {
                return Err(UdpError::SendStalled(waited));
            }
            if would_block {
                let left = SEND_STALL_LIMIT - waited;
                sys::socket::wait(self.socket.as_fd(), libc::POLLOUT, Some(left))?;
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(ENOBUFS_MAX_SLEEP);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::udp::testing::{datagram, expected, opts, pair};
    use crate::net::udp::{ChannelOptions, RecvBatch, GRO_BUF_SIZE};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// Sends 1000 distinct 1400-byte datagrams in chunks of 100, receiving between chunks, and
    /// checks each arrived exactly once with the right content.
    fn thousand_datagrams(ip: IpAddr, gso: bool) {
        const COUNT: u32 = 1000;
        const CHUNK: u32 = 100;
        const SIZE: usize = 1400;
        let Some((mut a, mut b)) = pair(ip, &ChannelOptions { gso, ..opts() }) else {
            return;
        };
        if !gso {
            assert_eq!(a.max_gso_segments(), 1);
        }
        let dest = b.local_addr();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let mut seen = vec![false; COUNT as usize];
        let mut received = 0u32;
        let mut calls = 0;
        let mut buf = Vec::with_capacity(CHUNK as usize * SIZE);
        for first in (0..COUNT).step_by(CHUNK as usize) {
            buf.clear();
            for seq in first..first + CHUNK {
                datagram(seq, SIZE, &mut buf);
            }
            a.send_batch(dest, &buf, SIZE).expect("send_batch");
            while received < first + CHUNK {
                let n = b.recv_batch(&mut batch).expect("recv_batch");
                if n == 0 {
                    break;
                }
                calls += 1;
                assert_eq!(batch.len(), n);
                assert_eq!(batch.iter().count(), n);
                for (src, d) in &batch {
                    assert_eq!(*src, a.local_addr());
                    assert_eq!(d.len(), SIZE);
                    let seq = u32::from_le_bytes(d[..4].try_into().unwrap());
                    assert!(seq < COUNT, "sequence {seq} out of range");
                    assert!(!seen[seq as usize], "datagram {seq} arrived twice");
                    assert!(d == expected(seq, SIZE), "datagram {seq} corrupted");
                    seen[seq as usize] = true;
                    received += 1;
                }
            }
        }
        println!(
            "{ip} gso={gso}: GSO segments {}, GRO segments {}, {received} datagrams in {calls} recv calls",
            a.max_gso_segments(),
            b.gro_segments()
        );
        let missing: Vec<usize> = (0..COUNT as usize).filter(|&i| !seen[i]).collect();
        assert!(
            missing.is_empty(),
            "{} datagrams missing (kernel drops: {:?}), first {:?}",
            missing.len(),
            b.kernel_drops(),
            &missing[..missing.len().min(10)]
        );
        assert_eq!(b.kernel_drops(), Some(0));
    }

    /// `send_framed` sends what `send_batch` would of the same datagrams laid out whole: each
    /// a header and its slice of the data, the last one shorter, with GSO and without.
    fn framed_sends(ip: IpAddr, gso: bool) {
        const HEADER: usize = 12;
        const PAYLOAD: usize = 1384;
        const COUNT: usize = 150; // more than one GSO send and one sendmmsg batch
        let Some((mut a, mut b)) = pair(ip, &ChannelOptions { gso, ..opts() }) else {
            return;
        };
        let data: Vec<u8> = (0..(COUNT - 1) * PAYLOAD + 500)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut headers = Vec::new();
        for i in 0..COUNT as u32 {
            headers.extend_from_slice(&i.to_le_bytes());
            headers.extend_from_slice(&[0xA5; HEADER - 4]);
        }
        a.send_framed(b.local_addr(), &headers, HEADER, &data, PAYLOAD)
            .unwrap();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let mut seen = [false; COUNT];
        let mut got = 0;
        while got < COUNT {
            let n = b.recv_batch(&mut batch).unwrap();
            assert!(n > 0, "only {got} of {COUNT} datagrams arrived (gso={gso})");
            for (_, d) in &batch {
                let i = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
                assert!(!seen[i], "datagram {i} twice");
                seen[i] = true;
                assert_eq!(&d[4..HEADER], &[0xA5; HEADER - 4]);
                let want = &data[i * PAYLOAD..((i + 1) * PAYLOAD).min(data.len())];
                assert!(&d[HEADER..] == want, "datagram {i}'s payload differs");
            }
            got += n;
        }
        assert_eq!(got, COUNT);
    }

    #[test]
    fn framed_sends_ipv4_gso() {
        framed_sends(Ipv4Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn framed_sends_ipv4_without_gso() {
        framed_sends(Ipv4Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn framed_sends_ipv6_gso() {
        framed_sends(Ipv6Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn framed_sends_refuse_missing_headers() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (mut a, b) = pair(lo, &opts()).unwrap();
        let err = a.send_framed(b.local_addr(), &[0; 20], 10, &[1; 25], 10);
        assert!(err.is_err(), "3 datagrams, 2 headers");
        assert!(matches!(
            a.send_framed(b.local_addr(), &[0; 10], 10, &[1; 10], 0),
            Err(UdpError::InvalidSegmentSize(_))
        ));
    }

    #[test]
    fn thousand_datagrams_ipv4_gso() {
        thousand_datagrams(Ipv4Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn thousand_datagrams_ipv4_sendmmsg() {
        thousand_datagrams(Ipv4Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn thousand_datagrams_ipv6_gso() {
        thousand_datagrams(Ipv6Addr::LOCALHOST.into(), true);
    }

    #[test]
    fn thousand_datagrams_ipv6_sendmmsg() {
        thousand_datagrams(Ipv6Addr::LOCALHOST.into(), false);
    }

    #[test]
    fn short_last_segment() {
        for gso in [true, false] {
            let (mut a, mut b) = pair(
                Ipv4Addr::LOCALHOST.into(),
                &ChannelOptions { gso, ..opts() },
            )
            .unwrap();
            let mut buf = Vec::new();
            for seq in 0..3 {
                datagram(seq, 1000, &mut buf);
            }
            datagram(3, 17, &mut buf);
            a.send_batch(b.local_addr(), &buf, 1000).unwrap();
            let mut batch = RecvBatch::new(8, GRO_BUF_SIZE);
            let mut got = Vec::new();
            while got.len() < 4 {
                if b.recv_batch(&mut batch).unwrap() == 0 {
                    break;
                }
                got.extend(batch.iter().map(|(_, d)| d.to_vec()));
            }
            let want: Vec<Vec<u8>> = (0..4)
                .map(|seq| expected(seq, if seq == 3 { 17 } else { 1000 }))
                .collect();
            assert_eq!(got, want, "gso = {gso}");
        }
    }

    #[test]
    fn single_datagram_and_empty_buffer() {
        let (mut a, mut b) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        a.send_batch(b.local_addr(), &[], 1400).unwrap();
        a.send_batch(b.local_addr(), b"hello", 1400).unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 1);
        let all: Vec<_> = batch.iter().collect();
        assert_eq!(all, vec![(&a.local_addr(), &b"hello"[..])]);
    }
}
