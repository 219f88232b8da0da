//! The socket's receive queue and the kernel's drop counter, as statistics for the reports.
//!
//! quinn-udp reads no `SO_RXQ_OVFL` control message, so that option is not enabled. Instead
//! [`UdpChannel::receive_queue`] asks the kernel with one `getsockopt(SO_MEMINFO)` how many
//! bytes wait in the socket's receive buffer, its limit, and how many packets it dropped.
//! Where that option is missing, [`UdpChannel::kernel_drops`] falls back to the socket's
//! `drops` column in `/proc/net/udp` or `/proc/net/udp6` (a file read: for statistics, not
//! per batch). Drops count packets, and a GRO batch is one packet.

use super::UdpChannel;
use crate::sys;
use std::{
    net::SocketAddr,
    os::fd::{AsFd, AsRawFd},
};

/// A socket's receive queue at one moment, in the kernel's accounting: `queued` counts each
/// packet's buffer overhead too, and the kernel drops arriving packets once `queued` reaches
/// `limit`, so `queued / limit` is how close the socket is to dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveQueue {
    /// Bytes held by packets waiting to be read.
    pub queued: u64,
    /// The receive buffer's limit (what `SO_RCVBUF` granted, as the kernel stores it).
    pub limit: u64,
    /// Packets dropped since the socket was created.
    pub drops: u64,
}

impl ReceiveQueue {
    /// How full the queue is, in thousandths of its limit (capped at 1000).
    pub fn fill_permille(&self) -> u64 {
        (self.queued.saturating_mul(1000) / self.limit.max(1)).min(1000)
    }
}

impl UdpChannel {
    /// The receive queue now: bytes waiting and the drops so far, from `SO_MEMINFO` (one
    /// `getsockopt`, cheap enough to call every millisecond or so). `None` where the kernel
    /// does not have it (not Linux, or older than 4.11).
    pub fn receive_queue(&self) -> Option<ReceiveQueue> {
        sys::socket::meminfo(self.socket.as_fd()).map(|(queued, limit, drops)| ReceiveQueue {
            queued,
            limit,
            drops,
        })
    }

    /// Packets the kernel dropped on this socket since it was created, mostly because the
    /// receive buffer was full: from [`receive_queue`](Self::receive_queue) where the kernel has
    /// it, else read from the `drops` column of `/proc/net/udp` (or `udp6`), on the line whose
    /// inode is this socket's (more exact than the local port, which `SO_REUSEPORT` sockets
    /// share). `None` when neither is possible. The fallback reads a file, so call this for
    /// statistics, not per batch.
    ///
    /// The kernel counts packets as they reach the socket, so a GRO batch counts once: over
    /// loopback, where a GSO send arrives whole, one drop can be up to 64 lost datagrams.
    pub fn kernel_drops(&self) -> Option<u64> {
        self.receive_queue()
            .map(|q| q.drops)
            .or_else(|| self.proc_drops())
    }

    /// The socket's drop counter from `/proc/net/udp` (or `udp6`).
    fn proc_drops(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let fd = self.socket.as_raw_fd();
        let inode = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?.ino();
        let table = match self.local {
            SocketAddr::V4(_) => "/proc/net/udp",
            SocketAddr::V6(_) => "/proc/net/udp6",
        };
        // The kernel prints this table in pieces; a socket that another thread opens or closes
        // between two pieces can shift our line past a piece boundary so that one read misses
        // it. Our socket is open, so a miss is that race: read again.
        (0..4).find_map(|_| {
            let text = std::fs::read_to_string(table).ok()?;
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            text.lines().skip(1).find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                match fields.get(9)?.parse::<u64>() {
                    Ok(i) if i == inode => fields.get(12)?.parse().ok(),
                    _ => None,
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::udp::testing::{datagram, opts, pair};
    use crate::net::udp::{ChannelOptions, RecvBatch, GRO_BUF_SIZE, MAX_RECV_BUFFERS};
    use std::net::Ipv4Addr;

    #[test]
    fn kernel_drops_counts_overflow() {
        let (mut a, _) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        let small = ChannelOptions {
            recv_buffer: 8 << 10,
            ..opts()
        };
        let b = UdpChannel::bind((Ipv4Addr::LOCALHOST, 0).into(), &small).unwrap();
        assert_eq!(b.kernel_drops(), Some(0));
        let mut buf = Vec::new();
        for seq in 0..200 {
            datagram(seq, 1400, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, 1400).unwrap();
        let drops = b.kernel_drops().expect("drop counter");
        assert!(drops > 0, "no drops with an 8 KiB buffer");
        assert_eq!(b.proc_drops(), Some(drops), "/proc agrees with SO_MEMINFO");
        let q = b.receive_queue().expect("SO_MEMINFO on Linux");
        assert_eq!(q.drops, drops);
        assert!(q.fill_permille() > 500, "full when it drops: {q:?}");
    }

    #[test]
    fn receive_queue_shows_waiting_bytes() {
        let (mut a, mut b) = pair(Ipv4Addr::LOCALHOST.into(), &opts()).unwrap();
        let empty = b.receive_queue().expect("SO_MEMINFO on Linux");
        assert_eq!((empty.queued, empty.drops), (0, 0));
        assert!(empty.limit >= b.granted_recv_buffer() as u64, "{empty:?}");
        let mut buf = Vec::new();
        for seq in 0..20 {
            datagram(seq, 1400, &mut buf);
        }
        a.send_batch(b.local_addr(), &buf, 1400).unwrap();
        let q = b.receive_queue().unwrap();
        assert!(q.queued >= 20 * 1400, "{q:?}");
        assert!((1..500).contains(&q.fill_permille()), "{q:?}");
        let mut batch = RecvBatch::new(MAX_RECV_BUFFERS, GRO_BUF_SIZE);
        let mut got = 0;
        while got < 20 {
            b.recv_batch(&mut batch).unwrap();
            got += batch.iter().count();
        }
        assert_eq!(b.receive_queue().unwrap().queued, 0);
    }
}
