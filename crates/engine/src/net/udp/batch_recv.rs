//! Receiving: datagrams into a [`RecvBatch`] in one system call per batch, and waiting on
//! several channels' sockets at once.
//!
//! [`UdpChannel::recv_batch`] fills a [`RecvBatch`], allocated once, with one `recvmmsg(2)`
//! (through quinn-udp's `UdpSocketState::recv`): up to [`MAX_RECV_BUFFERS`] buffers per call.
//! quinn-udp turns on **GRO** (`UDP_GRO`) where the kernel has it, so one buffer can hold up to
//! 64 datagrams of the same size, `stride` bytes apart (the last may be shorter). On loopback
//! a GSO send arrives as one such buffer. [`RecvBatch::iter`] splits buffers back into
//! datagrams, so callers never see the difference. With GRO on, buffers must be at least
//! [`GRO_BUF_SIZE`] bytes, or a merged batch would be cut short.
//!
//! # Arrival times
//!
//! quinn-udp turns on `SO_TIMESTAMPNS`, so the kernel says when each buffer arrived (on the
//! host's real-time clock). [`RecvBatch::for_each_mut`] gives that as an [`Instant`]: a
//! receiver that reads in lumps (starved of CPU, or letting datagrams gather) then still times
//! each datagram when it came, not when it was read, and the one-way delays it reports carry
//! no lumps of its own. Where the kernel gave no time (or one that cannot be right) it gives
//! `None`, and the caller times the datagram itself.
//!
//! # Blocking and timeouts
//!
//! The socket stays non-blocking, as quinn-udp configures it. A plain blocking socket does not
//! work well here: `recvmmsg` without `MSG_WAITFORONE` (quinn-udp passes no flags) keeps
//! blocking until *all* buffers are filled, so a half-empty queue would stall every call for a
//! whole `SO_RCVTIMEO`. Instead `recv_batch` tries `recvmmsg` first and, only when the queue is
//! empty, waits in `poll(2)` for at most the read timeout. A busy channel makes one system call
//! per batch; an idle one makes one more.

use super::{UdpChannel, UdpError};
use crate::sys;
use quinn_udp::RecvMeta;
use std::{
    fmt,
    io::{self, IoSliceMut},
    net::{IpAddr, SocketAddr},
    os::fd::{AsFd, BorrowedFd},
    time::{Duration, Instant, SystemTime},
};

pub use crate::sys::socket::MAX_WAIT_FDS;

/// Smallest [`RecvBatch`] buffer that can hold any GRO batch the kernel may hand over (the kernel
/// caps a merged batch at 64 KiB).
pub const GRO_BUF_SIZE: usize = 65_536;

/// Most buffers one `recv_batch` call fills: quinn-udp's batch size for `recvmmsg`. A
/// [`RecvBatch`] with more buffers is trimmed to this.
pub const MAX_RECV_BUFFERS: usize = quinn_udp::BATCH_SIZE;

/// Oldest a kernel arrival time may be and still be taken: a datagram read later than this
/// after it came was timed by a clock that was stepped meanwhile, or is not what it says.
const MAX_ARRIVAL_AGE: Duration = Duration::from_secs(1);

impl UdpChannel {
    /// Receives what one `recvmmsg` call gives into `out`, replacing what it held, and returns
    /// the number of datagrams (GRO buffers counted as the datagrams they hold). Waits up to the
    /// read timeout for the first datagram and returns `Ok(0)` if none came. Allocates nothing.
    ///
    /// Datagrams longer than `out`'s buffer size are cut short without notice, so size buffers
    /// for the largest datagram expected; with GRO on they must be at least [`GRO_BUF_SIZE`].
    pub fn recv_batch(&mut self, out: &mut RecvBatch) -> Result<usize, UdpError> {
        out.clear();
        if self.gro_segments() > 1 && out.buf_size < GRO_BUF_SIZE {
            return Err(UdpError::RecvBufferTooSmall {
                have: out.buf_size,
                need: GRO_BUF_SIZE,
            });
        }
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let result = {
                let mut chunks = out.data.chunks_mut(out.buf_size);
                let mut bufs: [IoSliceMut<'_>; MAX_RECV_BUFFERS] =
                    std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap_or(&mut [])));
                let n = out.meta.len();
                self.state
                    .recv((&self.socket).into(), &mut bufs[..n], &mut out.meta)
            };
            match result {
                Ok(n) => return Ok(out.fill(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    let deadline =
                        *deadline.get_or_insert_with(|| self.read_timeout.map(|t| now + t));
                    let remaining = match deadline {
                        None => None,
                        Some(d) if d <= now => return Ok(0),
                        Some(d) => Some(d - now),
                    };
                    sys::socket::wait(self.socket.as_fd(), libc::POLLIN, remaining)?;
                }
                Err(e) => return Err(UdpError::from_io(e)),
            }
        }
    }
}

/// The [`Instant`] a datagram that the kernel stamped `stamp` (since the Unix epoch, on the
/// real-time clock) arrived, read at `now` (`wall` on the real-time clock); `None` for a stamp
/// from the future or older than [`MAX_ARRIVAL_AGE`].
fn arrival(now: Instant, wall: SystemTime, stamp: Duration) -> Option<Instant> {
    let wall = wall.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let age = wall.checked_sub(stamp)?;
    (age <= MAX_ARRIVAL_AGE)
        .then(|| now.checked_sub(age))
        .flatten()
}

/// An IPv4-mapped IPv6 address (what a dual-stack socket reports for IPv4 peers) as plain IPv4.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::new(IpAddr::V4(ip), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

/// Waits until one of `fds` (sockets of any kind; `None` for one not to watch; at most
/// [`MAX_WAIT_FDS`], any beyond are not watched) has something to read, or `timeout` passes; a
/// thread serving several channels sleeps here. Returns which are ready to read (or have an
/// error or hang-up for the read to report): bit `i` for the `i`th of `fds`; 0 after a timeout
/// or a signal. Allocates nothing.
pub fn wait_readable<'a>(
    fds: impl IntoIterator<Item = Option<BorrowedFd<'a>>>,
    timeout: Duration,
) -> Result<u64, UdpError> {
    sys::socket::wait_any(fds, libc::POLLIN, Some(timeout)).map_err(UdpError::from_io)
}

/// Receive buffers for [`UdpChannel::recv_batch`], allocated once and reused: `buffers` buffers
/// of `buf_size` bytes each, and the datagrams the last call received.
pub struct RecvBatch {
    data: Vec<u8>,
    meta: Vec<RecvMeta>,
    /// When each filled buffer arrived, from its kernel timestamp (see the module docs).
    arrived: Vec<Option<Instant>>,
    buf_size: usize,
    filled: usize,
    datagrams: usize,
}

impl RecvBatch {
    /// Allocates `buffers` buffers (clamped to 1..=[`MAX_RECV_BUFFERS`]) of `buf_size` bytes
    /// (at least 1). With GRO on (the usual case on Linux) `buf_size` must be at least
    /// [`GRO_BUF_SIZE`]; `RecvBatch::new(32, GRO_BUF_SIZE)` (2 MiB) is a good choice.
    pub fn new(buffers: usize, buf_size: usize) -> Self {
        let buffers = buffers.clamp(1, MAX_RECV_BUFFERS);
        let buf_size = buf_size.max(1);
        Self {
            data: vec![0; buffers * buf_size],
            meta: vec![RecvMeta::default(); buffers],
            arrived: vec![None; buffers],
            buf_size,
            filled: 0,
            datagrams: 0,
        }
    }

    /// Number of buffers, the most `recvmmsg` results one call can take.
    pub fn buffers(&self) -> usize {
        self.meta.len()
    }

    /// Size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of datagrams the last `recv_batch` received.
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether the last `recv_batch` filled every buffer (so more may be waiting).
    pub fn is_full(&self) -> bool {
        self.filled == self.meta.len()
    }

    /// Whether the last `recv_batch` received nothing.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// The datagrams of the last `recv_batch`, with GRO buffers split by their stride, each with
    /// its source address (IPv4-mapped IPv6 sources given as IPv4).
    pub fn iter(&self) -> RecvIter<'_> {
        RecvIter {
            batch: self,
            buffer: 0,
            offset: 0,
        }
    }

    /// The buffers of the last `recv_batch` as the kernel filled them: each with its source,
    /// its bytes, and the stride its datagrams are apart (GRO merges only datagrams of one
    /// flow and one size, the last possibly shorter; a buffer of one datagram has its length
    /// as stride). For a forwarder that sends a merged buffer on whole.
    pub fn merged(&self) -> impl Iterator<Item = (SocketAddr, &[u8], usize)> + '_ {
        self.meta[..self.filled].iter().enumerate().map(|(b, m)| {
            let base = b * self.buf_size;
            let stride = if m.stride == 0 {
                m.len.max(1)
            } else {
                m.stride
            };
            (m.addr, &self.data[base..base + m.len], stride)
        })
    }

    /// Hands each datagram to `f` as [`iter`](Self::iter) does, but mutable (sealed datagrams
    /// are opened in place) and with when the kernel says it arrived (`None` when it did not:
    /// see the module docs); stops at the first error.
    pub fn for_each_mut<E>(
        &mut self,
        mut f: impl FnMut(&SocketAddr, Option<Instant>, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        for (b, m) in self.meta[..self.filled].iter().enumerate() {
            let base = b * self.buf_size;
            let buf = &mut self.data[base..base + m.len];
            let at = self.arrived[b];
            if m.len == 0 {
                f(&m.addr, at, buf)?;
                continue;
            }
            for datagram in buf.chunks_mut(m.stride) {
                f(&m.addr, at, datagram)?;
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.filled = 0;
        self.datagrams = 0;
    }

    /// Records that the first `n` buffers were filled; returns the number of datagrams.
    fn fill(&mut self, n: usize) -> usize {
        self.filled = n;
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mut datagrams = 0;
        for (m, at) in self.meta[..n].iter_mut().zip(&mut self.arrived) {
            *at = m.timestamp.and_then(|stamp| arrival(now, wall, stamp));
            m.addr = canonical(m.addr);
            m.len = m.len.min(self.buf_size);
            if m.stride == 0 || m.stride > m.len {
                m.stride = m.len;
            }
            datagrams += if m.len == 0 {
                1
            } else {
                m.len.div_ceil(m.stride)
            };
        }
        self.datagrams = datagrams;
        datagrams
    }
}

impl fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBatch")
            .field("buffers", &self.meta.len())
            .field("buf_size", &self.buf_size)
            .field("filled", &self.filled)
            .field("datagrams", &self.datagrams)
            .finish()
    }
}

impl<'a> IntoIterator for &'a RecvBatch {
    type Item = (&'a SocketAddr, &'a [u8]);
    type IntoIter = RecvIter<'a>;

    fn into_iter(self) -> RecvIter<'a> {
        self.iter()
    }
}

/// Iterator over the datagrams in a [`RecvBatch`]: `(source, datagram)` pairs.
#[derive(Debug)]
pub struct RecvIter<'a> {
    batch: &'a RecvBatch,
    buffer: usize,
    offset: usize,
}

impl<'a> Iterator for RecvIter<'a> {
    type Item = (&'a SocketAddr, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.batch;
        if self.buffer >= batch.filled {
            return None;
        }
        let m = &batch.meta[self.buffer];
        let base = self.buffer * batch.buf_size;
        let start = self.offset;
        // `fill` made 0 < stride <= len, or stride == len == 0 (one empty datagram).
        let end = (start + m.stride).min(m.len);
        if end >= m.len {
            self.buffer += 1;
            self.offset = 0;
        } else {
            self.offset = end;
        }
        Some((&m.addr, &batch.data[base + start..base + end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::udp::testing::{datagram, expected, opts, pair};
    use crate::net::udp::{ChannelOptions, MAX_GSO_BYTES};
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn wait_readable_says_which_sockets_have_data() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (mut a, b) = pair(lo, &opts()).unwrap();
        let c = UdpChannel::bind(SocketAddr::new(lo, 0), &opts()).unwrap();
        let fds = || [Some(b.as_fd()), None, Some(c.as_fd())];
        let t = Instant::now();
        assert_eq!(wait_readable(fds(), Duration::from_millis(20)).unwrap(), 0);
        assert!(
            t.elapsed() >= Duration::from_millis(15),
            "{:?}",
            t.elapsed()
        );
        a.send_batch(c.local_addr(), &[7u8; 100], 100).unwrap();
        assert_eq!(wait_readable(fds(), Duration::from_secs(5)).unwrap(), 0b100);
        a.send_batch(b.local_addr(), &[7u8; 100], 100).unwrap();
        assert_eq!(wait_readable(fds(), Duration::from_secs(5)).unwrap(), 0b101);
    }

    /// A GSO send as large as `send_batch` makes stays one packet on loopback: the receiver
    /// gets it as one GRO buffer, not datagram by datagram (which it did when sends reached
    /// the device's 64 KiB `gso_max_size` with their headers).
    fn gso_sends_arrive_whole(ip: IpAddr) {
        const SIZE: usize = 1424; // a 1500-byte path's datagram
        const COUNT: usize = 90;
        let Some((mut a, mut b)) = pair(ip, &opts()) else {
            return;
        };
        if a.max_gso_segments() <= 1 || b.gro_segments() <= 1 {
            println!(
                "skipping: no UDP GSO/GRO here ({} / {})",
                a.max_gso_segments(),
                b.gro_segments()
            );
            return;
        }
        let per_send = a.max_gso_segments().min(MAX_GSO_BYTES / SIZE);
        let mut buf = Vec::new();
        for seq in 0..COUNT as u32 {
            datagram(seq, SIZE, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, SIZE).unwrap();
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let (mut datagrams, mut buffers) = (0, 0);
        while datagrams < COUNT {
            let n = b.recv_batch(&mut batch).unwrap();
            assert!(n > 0, "only {datagrams} of {COUNT} datagrams arrived");
            datagrams += n;
            buffers += batch.filled;
        }
        assert_eq!(datagrams, COUNT);
        assert_eq!(
            buffers,
            COUNT.div_ceil(per_send),
            "{per_send} datagrams per send"
        );
    }

    #[test]
    fn gso_sends_arrive_whole_ipv4() {
        gso_sends_arrive_whole(Ipv4Addr::LOCALHOST.into());
    }

    #[test]
    fn gso_sends_arrive_whole_ipv6() {
        gso_sends_arrive_whole(Ipv6Addr::LOCALHOST.into());
    }

    /// A paced sender's bursts (GSO sends a millisecond apart) that gathered while the reader
    /// paused come in one read, one GRO buffer per burst: every datagram exactly once, in
    /// order, and the batch is not full though it holds more datagrams than it has buffers
    /// (a channel thread takes a batch that is not full for a trickle, and pauses again).
    #[test]
    fn gro_batched_receive_admits_exactly_the_datagrams_sent() {
        const SIZE: usize = 1424;
        const BURSTS: u32 = 5;
        const PER_BURST: u32 = 24;
        let Some((mut a, mut b)) = pair(IpAddr::V4(Ipv4Addr::LOCALHOST), &opts()) else {
            return;
        };
        if a.max_gso_segments() < PER_BURST as usize || b.gro_segments() <= 1 {
            println!(
                "skipping: no UDP GSO/GRO here ({} / {})",
                a.max_gso_segments(),
                b.gro_segments()
            );
            return;
        }
        for burst in 0..BURSTS {
            let mut buf = Vec::new();
            for seq in burst * PER_BURST..(burst + 1) * PER_BURST {
                datagram(seq, SIZE, &mut buf);
            }
            a.send_batch(b.local_addr(), &buf, SIZE).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut batch = RecvBatch::new(32, GRO_BUF_SIZE);
        let n = b.recv_batch(&mut batch).unwrap();
        let total = (BURSTS * PER_BURST) as usize;
        assert_eq!(n, total, "in one read");
        assert_eq!(batch.len(), total);
        assert!(total > batch.buffers());
        assert_eq!(batch.filled, BURSTS as usize, "one GRO buffer per burst");
        assert!(
            !batch.is_full(),
            "more datagrams than buffers, yet not full"
        );
        let got: Vec<Vec<u8>> = batch.iter().map(|(_, d)| d.to_vec()).collect();
        let want: Vec<Vec<u8>> = (0..BURSTS * PER_BURST).map(|s| expected(s, SIZE)).collect();
        assert!(got == want, "each datagram once, in order, as sent");
        // Nothing more, nothing twice.
        b.set_read_timeout(Some(Duration::from_millis(20)));
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 0);
    }

    #[test]
    fn recv_timeout_returns_zero() {
        let mut b = UdpChannel::bind(
            (Ipv4Addr::LOCALHOST, 0).into(),
            &ChannelOptions {
                read_timeout: Some(Duration::from_millis(50)),
                ..ChannelOptions::default()
            },
        )
        .unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        let t = Instant::now();
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 0);
        let waited = t.elapsed();
        assert!(batch.is_empty());
        assert_eq!(batch.iter().count(), 0);
        assert!(
            waited >= Duration::from_millis(45) && waited < Duration::from_secs(2),
            "waited {waited:?}"
        );
    }

    #[test]
    fn iter_splits_gro_buffers_by_stride() {
        let mut batch = RecvBatch::new(3, 100);
        for (i, byte) in batch.data.iter_mut().enumerate() {
            *byte = i as u8;
        }
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:9".parse().unwrap();
        let v4: SocketAddr = "10.0.0.1:9".parse().unwrap();
        for (m, (len, stride)) in batch.meta.iter_mut().zip([(25, 10), (0, 0), (7, 7)]) {
            m.addr = mapped;
            m.len = len;
            m.stride = stride;
        }
        assert_eq!(batch.fill(3), 5);
        let got: Vec<(SocketAddr, Vec<u8>)> = batch.iter().map(|(a, d)| (*a, d.to_vec())).collect();
        let want = vec![
            (v4, (0..10).collect::<Vec<u8>>()),
            (v4, (10..20).collect()),
            (v4, (20..25).collect()),
            (v4, vec![]),
            (v4, (200..207).collect()),
        ];
        assert_eq!(got, want);
        let mut again = Vec::new();
        batch
            .for_each_mut(|a, _, d| {
                again.push((*a, d.to_vec()));
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(again, want);
        batch.clear();
        assert_eq!(batch.iter().count(), 0);
    }

    /// A datagram read well after it came is timed when it came: the kernel's stamp, not the
    /// read.
    #[test]
    fn datagrams_are_timed_when_they_arrived_not_when_read() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (mut a, mut b) = pair(lo, &opts()).unwrap();
        let mut batch = RecvBatch::new(4, GRO_BUF_SIZE);
        // Linux turns arrival stamping on a moment after the first socket asks for it (a
        // deferred switch); a datagram that came before is stamped when it is read. One goes
        // first, so that the one measured comes after.
        a.send_batch(b.local_addr(), &[1u8; 10], 10).unwrap();
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 1);
        std::thread::sleep(Duration::from_millis(20));
        let sent = Instant::now();
        a.send_batch(b.local_addr(), &[7u8; 100], 100).unwrap();
        // Until it has arrived (on a busy machine loopback's delivery itself can wait for a
        // while): the kernel stamped it by then. Then the read comes late.
        let ready = wait_readable(std::iter::once(Some(b.as_fd())), Duration::from_secs(5));
        assert_eq!(ready.unwrap() & 1, 1, "the datagram arrives");
        let arrived_by = Instant::now();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 1);
        let read = Instant::now();
        let mut times = Vec::new();
        batch
            .for_each_mut(|_, at, _| {
                times.push(at);
                Ok::<(), ()>(())
            })
            .unwrap();
        let at = times[0].expect("the kernel stamps what it receives (SO_TIMESTAMPNS)");
        assert!(
            read.duration_since(at) >= Duration::from_millis(50),
            "timed {:?} before the read",
            read.duration_since(at)
        );
        // Within the clocks' rounding of the send and of its arrival (the real-time clock has
        // microseconds here).
        assert!(at + Duration::from_millis(5) >= sent, "before it was sent");
        assert!(
            at <= arrived_by + Duration::from_millis(5),
            "after it was there"
        );
    }

    #[test]
    fn a_stamp_from_the_future_or_long_ago_is_not_an_arrival() {
        let now = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let since_epoch = Duration::from_secs(1_800_000_000);
        let ms = Duration::from_millis;
        assert_eq!(
            arrival(now, wall, since_epoch - ms(3)),
            now.checked_sub(ms(3))
        );
        assert_eq!(arrival(now, wall, since_epoch), Some(now));
        assert_eq!(arrival(now, wall, since_epoch + ms(1)), None);
        assert_eq!(
            arrival(now, wall, since_epoch - MAX_ARRIVAL_AGE - ms(1)),
            None
        );
    }
}
