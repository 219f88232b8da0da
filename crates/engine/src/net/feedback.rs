//! The receiver's reports and NACKs as datagrams, beside the control connection (the format
//! and why: [`hurtle_proto::feedback`]).
//!
//! - The receiver's [`FeedbackOut`] sends a sealed copy of each `Report` and `Nack` from the
//!   socket of the first channel the sender was heard on (among the first [`MAX_WAIT_FDS`] less
//!   one, the sockets the sender's reader watches) to the address it was heard from, so that it
//!   passes the same NAT mappings and firewalls as the data, backwards. Sending never blocks and
//!   a failed send is let go, and said: the caller then sends the message on TCP (a NACK goes
//!   there anyway; a report goes there too only now and then while nothing is lost).
//! - The sender's [`FeedbackReader`] reads its channel sockets (the same sockets the data
//!   leaves from) for the session loop, which polls them beside its other wake-ups (a
//!   [`crate::net::bell::Bell`]): it opens what comes from the receiver's address with the
//!   feedback key and passes the messages on, and the loop takes the first copy of each
//!   ([`hurtle_proto::feedback::Dedup`]). A report is one wake-up of one thread: with a
//!   reader thread of its own, each was that thread's wake-up and a hand-off to the loop (a
//!   futex and a context switch more): that thread was 6% of a paced sender's samples at
//!   100 Mbit/s, 3% at 1 Gbit/s.

use crate::net::punch::{PunchStep, SocketPunch};
use crate::net::udp::MAX_WAIT_FDS;
use hurtle_proto::feedback;
use hurtle_proto::secure::{DataKey, PacketNumbers, PacketOpen, PacketSeal};
use hurtle_proto::wire::Control;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A relayed session's try for direct paths, on the sender's feedback reader (which reads the
/// channel sockets): one [`SocketPunch`] per channel socket, and what to do when one finds a
/// direct path (the channel moves there; the reader takes feedback from there too).
pub struct SenderPunch {
    /// Per channel, in the order of the reader's sockets.
    pub sockets: Vec<SocketPunch>,
    /// Called with the channel and the peer's address when a channel's path is punched.
    pub on_direct: Box<dyn Fn(u16, SocketAddr) + Send>,
}

/// The receiver's side: sends feedback datagrams once the sender has been heard.
pub struct FeedbackOut {
    /// Each channel's socket (clones of the channel threads'); empty over TCP data connections.
    socks: Vec<UdpSocket>,
    /// The channel whose socket sends, and the sender's address on it: the first heard (or
    /// that channel's direct path, once punched).
    to: Mutex<Option<(usize, SocketAddr)>>,
    /// The feedback's packet numbers and their sealer, under one lock: each number is sealed
    /// as soon as it is taken, so numbers reach the sealer in order.
    sealing: Mutex<(PacketNumbers, PacketSeal)>,
    session: u32,
    /// Datagrams sent.
    pub sent: AtomicU64,
}

impl FeedbackOut {
    /// Feedback from `socks` (one per channel, in order; none for TCP data; only the first
    /// [`MAX_WAIT_FDS`] less one are kept: the sender's reader watches no more, beside its
    /// wake-up socket), sealed with the session's feedback `key`, in data session `session`.
    pub fn new(mut socks: Vec<UdpSocket>, key: &DataKey, session: u32) -> FeedbackOut {
        socks.truncate(MAX_WAIT_FDS - 1);
        FeedbackOut {
            socks,
            to: Mutex::new(None),
            sealing: Mutex::new((PacketNumbers::data(), key.sealer())),
            session,
            sent: AtomicU64::new(0),
        }
    }

    /// The sender was heard on `channel` from `src` (an authentic datagram): the first such
    /// channel's socket and address carry the feedback from now on.
    pub fn heard(&self, channel: u16, src: SocketAddr) {
        let ch = usize::from(channel);
        let mut to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        if ch < self.socks.len() && to.is_none() {
            *to = Some((ch, src));
        }
    }

    /// `channel` has a direct path to the sender at `addr`: feedback on it goes there.
    pub fn redirect(&self, channel: u16, addr: SocketAddr) {
        let mut to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        match *to {
            Some((ch, _)) if ch == usize::from(channel) => *to = Some((ch, addr)),
            None if usize::from(channel) < self.socks.len() => {
                *to = Some((usize::from(channel), addr))
            }
            _ => {}
        }
    }

    /// Sends a copy of `msg` if it is feedback, the sender has been heard and it fits a
    /// datagram; never blocks (a full socket buffer drops it). Returns whether the datagram
    /// went to the kernel (what the path does with it is not known here): where not, the
    /// caller sends the message on TCP.
    pub fn send(&self, msg: &Control) -> bool {
        let Some((ch, to)) = *self.to.lock().unwrap_or_else(|e| e.into_inner()) else {
            return false;
        };
        let frame = {
            let mut sealing = self.sealing.lock().unwrap_or_else(|e| e.into_inner());
            let (packets, seal) = &mut *sealing;
            let Ok(packet) = packets.next_number() else {
                return false;
            };
            let Some(mut frame) = feedback::encode(msg, self.session, packet) else {
                return false;
            };
            // A number refused (never: they are taken and sealed in order under the lock) is
            // a copy not sent; the control connection carries the message anyway.
            if seal.seal(&mut frame).is_err() {
                return false;
            }
            frame
        };
        let sent = crate::net::punch::send_to(&self.socks[ch], &frame, to).is_ok();
        if sent {
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }
}

/// Counts of the sender's feedback reader.
#[derive(Debug, Default)]
pub struct FeedbackCounts {
    /// Feedback datagrams opened and passed on.
    pub received: AtomicU64,
    /// Datagrams dropped: from another address, unauthentic, replayed or malformed.
    pub dropped: AtomicU64,
}

/// The sender's side: reads feedback datagrams from the channel sockets for the session loop,
/// which polls [`fds`](FeedbackReader::fds) beside its other wake-ups and calls
/// [`read`](FeedbackReader::read) for those that are ready, and
/// [`tick`](FeedbackReader::tick) at each wake-up (the punching's timers). No thread of its
/// own: a report is one wake-up of the loop.
pub struct FeedbackReader {
    /// The first [`MAX_WAIT_FDS`] less one channel sockets (the loop polls one more fd).
    socks: Vec<UdpSocket>,
    open: PacketOpen,
    session: u32,
    /// Feedback comes from the receiver (or the relay), and from a channel's direct path
    /// once it has one.
    from_ips: Vec<IpAddr>,
    punch: Option<SenderPunch>,
    buf: Vec<u8>,
    /// What it received and dropped.
    pub counts: FeedbackCounts,
}

impl FeedbackReader {
    /// A reader of `socks` (clones of the channel sockets; the first [`MAX_WAIT_FDS`] less
    /// one are read, the poller's own wake-up being the one more) for feedback from `from`
    /// of data session `session`, opened with `key`.
    pub fn new(socks: Vec<UdpSocket>, from: IpAddr, key: &DataKey, session: u32) -> FeedbackReader {
        FeedbackReader {
            socks: socks.into_iter().take(MAX_WAIT_FDS - 1).collect(),
            open: key.opener(feedback::FEEDBACK_CHANNEL),
            session,
            from_ips: vec![from.to_canonical()],
            punch: None,
            buf: vec![0u8; 2048],
            counts: FeedbackCounts::default(),
        }
    }

    /// [`FeedbackReader::new`] for a relayed session that tries direct paths: `punch` takes
    /// the relay's answers and the punching datagrams on the channel sockets, and its timers
    /// run at each [`tick`](FeedbackReader::tick).
    pub fn punching(
        socks: Vec<UdpSocket>,
        from: IpAddr,
        (key, session): (&DataKey, u32),
        punch: SenderPunch,
    ) -> FeedbackReader {
        FeedbackReader {
            punch: Some(punch),
            ..Self::new(socks, from, key, session)
        }
    }

    /// The sockets to poll for reading, in the order of [`read`](FeedbackReader::read)'s
    /// bits.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> + '_ {
        self.socks.iter().map(|s| s.as_fd())
    }

    /// Runs the punching's timers due at `now`; returns when the next falls due (`None`: no
    /// punching, or none pending).
    pub fn tick(&mut self, now: Instant) -> Option<Instant> {
        let p = self.punch.as_mut()?;
        let mut next: Option<Instant> = None;
        for (ch, (sp, sock)) in p.sockets.iter_mut().zip(&self.socks).enumerate() {
            if let PunchStep::Direct(addr) = sp.tick(now, sock) {
                self.from_ips.push(addr.ip().to_canonical());
                (p.on_direct)(ch as u16, addr);
            }
            if let Some(t) = sp.next_timeout() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// Reads every datagram waiting on the sockets whose bits are set in `ready` (bit `i`:
    /// the `i`th of [`fds`](FeedbackReader::fds)), and passes each feedback message from the
    /// receiver's address to `deliver`, in the order they came; the punching takes its own.
    pub fn read(&mut self, ready: u64, mut deliver: impl FnMut(Control)) {
        for (i, sock) in self.socks.iter().enumerate() {
            if ready & (1 << i) == 0 {
                continue;
            }
            loop {
                let (n, src) = match sock.recv_from(&mut self.buf) {
                    // An IPv4 source as such, on a dual-stack socket too.
                    Ok((n, src)) => (n, SocketAddr::new(src.ip().to_canonical(), src.port())),
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    // WouldBlock, or an error a datagram sent earlier left.
                    Err(_) => break,
                };
                if let Some(p) = self.punch.as_mut() {
                    if let Some(sp) = p.sockets.get_mut(i) {
                        match sp.on_datagram(Instant::now(), sock, src, &self.buf[..n]) {
                            PunchStep::NotMine => {}
                            PunchStep::Taken => continue,
                            PunchStep::Direct(addr) => {
                                self.from_ips.push(addr.ip().to_canonical());
                                (p.on_direct)(i as u16, addr);
                                continue;
                            }
                        }
                    }
                }
                let session = self.session;
                let msg = self
                    .from_ips
                    .contains(&src.ip())
                    .then(|| self.open.open(&mut self.buf[..n]).ok())
                    .flatten()
                    .and_then(|plain| feedback::decode(plain, session).ok());
                match msg {
                    Some(msg) => {
                        self.counts.received.fetch_add(1, Ordering::Relaxed);
                        deliver(msg);
                    }
                    None => {
                        self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::wire::Control;
    use std::time::{Duration, Instant};

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    fn nack(seq: u64) -> Control {
        Control::Nack {
            channel: 0,
            seq,
            ranges: vec![(0, 1400)],
            knew_us: 1_000,
        }
    }

    /// Waits (at most 5 s) for the reader's sockets, and reads what is ready.
    fn read_some(reader: &mut FeedbackReader) -> Vec<Control> {
        let ready = crate::net::udp::wait_readable(
            reader.fds().map(Some).collect::<Vec<_>>(),
            Duration::from_secs(5),
        )
        .unwrap();
        let mut got = Vec::new();
        reader.read(ready, |m| got.push(m));
        got
    }

    #[test]
    fn feedback_goes_once_the_sender_is_heard_and_only_its_key_opens_it() {
        let (got, _, _) = crate::handshake::testing::agreed("7-a-b");
        let key = got.keys.feedback.clone();
        let (recv_sock, send_sock) = pair();
        let send_addr = send_sock.local_addr().unwrap();
        let out = FeedbackOut::new(vec![recv_sock], &key, 9);
        let mut reader = FeedbackReader::new(
            vec![send_sock.try_clone().unwrap()],
            "127.0.0.1".parse().unwrap(),
            &key,
            9,
        );
        // Not heard yet: nothing goes.
        assert!(!out.send(&nack(1)), "said sent before the sender was heard");
        assert_eq!(out.sent.load(Ordering::Relaxed), 0);
        out.heard(0, send_addr);
        assert!(out.send(&nack(2)));
        assert!(out.send(&nack(3)));
        assert!(
            !out.send(&Control::KeepAlive),
            "said a non-feedback message went"
        );
        assert_eq!(out.sent.load(Ordering::Relaxed), 2, "only feedback goes");
        let mut msgs = Vec::new();
        let t = Instant::now();
        while msgs.len() < 2 && t.elapsed() < Duration::from_secs(5) {
            msgs.extend(read_some(&mut reader));
        }
        assert_eq!(msgs, vec![nack(2), nack(3)], "one read takes all, in order");
        // A datagram sealed with another key (the data key) is dropped and counted.
        let wrong = FeedbackOut::new(
            vec![UdpSocket::bind("127.0.0.1:0").unwrap()],
            &got.keys.data,
            9,
        );
        wrong.heard(0, send_addr);
        wrong.send(&nack(4));
        let t = Instant::now();
        while reader.counts.dropped.load(Ordering::Relaxed) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the forgery was not counted"
            );
            assert!(read_some(&mut reader).is_empty(), "a forgery was passed on");
        }
        assert_eq!(reader.counts.received.load(Ordering::Relaxed), 2);
        // Nothing ready: nothing read, and no wait.
        let mut none = Vec::new();
        reader.read(0, |m| none.push(m));
        assert!(none.is_empty());
    }
}
