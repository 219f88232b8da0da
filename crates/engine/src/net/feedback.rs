//! The receiver's reports and NACKs as datagrams, beside the control connection (the format
//! and why: [`hurtle_proto::feedback`]).
//!
//! - The receiver's [`FeedbackOut`] sends a sealed copy of each `Report` and `Nack` from the
//!   socket of the first channel the sender was heard on (among the first [`MAX_WAIT_FDS`] less
//!   one, the sockets the sender's reader watches) to the address it was heard from, so that it
//!   passes the same NAT mappings and firewalls as the data, backwards. Sending never blocks and
//!   a failed send is let go, and said: the caller then sends the message on TCP (a NACK goes
//!   there anyway; a report goes there too only now and then while nothing is lost).
//! - The sender's [`FeedbackReader`] is a thread that waits on its channel sockets (the same
//!   sockets the data leaves from), opens what comes from the receiver's address with the
//!   feedback key, and hands the messages to the session loop, which takes the first copy of
//!   each ([`hurtle_proto::feedback::Dedup`]). Dropping it wakes the thread at once (a
//!   datagram on a socket pair of its own) and joins it, so the sender's exit does not wait
//!   out the thread's 50 ms stop check.

use crate::net::punch::{PunchStep, SocketPunch};
use crate::net::udp::{wait_readable, MAX_WAIT_FDS};
use crossbeam_channel::{unbounded, Receiver};
use hurtle_proto::feedback;
use hurtle_proto::secure::{DataKey, PacketNumbers, PacketSeal};
use hurtle_proto::wire::Control;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// The sender's side: a thread reading feedback datagrams from the channel sockets until
/// dropped.
pub struct FeedbackReader {
    /// The messages, in the order they arrived.
    pub rx: Receiver<Control>,
    /// What it received and dropped.
    pub counts: Arc<FeedbackCounts>,
    stop: Arc<AtomicBool>,
    /// Wakes the thread from its wait when the reader is dropped.
    wake: UnixDatagram,
    thread: Option<JoinHandle<()>>,
}

/// How often the reader looks at its stop flag while nothing arrives (a dropped reader also
/// wakes it at once).
const STOP_CHECK: Duration = Duration::from_millis(50);

impl FeedbackReader {
    /// Starts reading `socks` (clones of the channel sockets; the first [`MAX_WAIT_FDS`] less
    /// one are watched, beside the wake-up socket) for feedback from `from` of data session
    /// `session`, opened with `key`.
    pub fn start(
        socks: Vec<UdpSocket>,
        from: IpAddr,
        key: &DataKey,
        session: u32,
    ) -> std::io::Result<FeedbackReader> {
        Self::start_checking(socks, from, key, session, STOP_CHECK, None)
    }

    /// [`FeedbackReader::start`] for a relayed session that tries direct paths: `punch` takes
    /// the relay's answers and the punching datagrams on the channel sockets, and its timers
    /// run on this thread.
    pub fn start_punching(
        socks: Vec<UdpSocket>,
        from: IpAddr,
        (key, session): (&DataKey, u32),
        punch: SenderPunch,
    ) -> std::io::Result<FeedbackReader> {
        Self::start_checking(socks, from, key, session, STOP_CHECK, Some(punch))
    }

    /// [`FeedbackReader::start`], looking at the stop flag every `stop_check`.
    fn start_checking(
        socks: Vec<UdpSocket>,
        from: IpAddr,
        key: &DataKey,
        session: u32,
        stop_check: Duration,
        mut punch: Option<SenderPunch>,
    ) -> std::io::Result<FeedbackReader> {
        let (tx, rx) = unbounded();
        let counts = Arc::new(FeedbackCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = UnixDatagram::pair()?;
        wake.set_nonblocking(true)?;
        let mut open = key.opener(feedback::FEEDBACK_CHANNEL);
        let (c, s) = (counts.clone(), stop.clone());
        let from = from.to_canonical();
        let thread = std::thread::Builder::new()
            .name("feedback-rx".into())
            .spawn(move || {
                let socks: Vec<UdpSocket> = socks.into_iter().take(MAX_WAIT_FDS - 1).collect();
                let mut buf = vec![0u8; 2048];
                // Feedback comes from the receiver (or the relay), and from a channel's direct
                // path once it has one.
                let mut from_ips = vec![from];
                while !s.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let mut wait = stop_check;
                    if let Some(p) = punch.as_mut() {
                        for (ch, (sp, sock)) in p.sockets.iter_mut().zip(&socks).enumerate() {
                            let st = sp.tick(now, sock);
                            if let PunchStep::Direct(addr) = st {
                                from_ips.push(addr.ip().to_canonical());
                                (p.on_direct)(ch as u16, addr);
                            }
                            if let Some(t) = sp.next_timeout() {
                                wait = wait.min(t.saturating_duration_since(now));
                            }
                        }
                    }
                    // Bit 0: the wake-up socket; bit i + 1: the ith channel socket.
                    let fds = std::iter::once(Some(woken.as_fd()))
                        .chain(socks.iter().map(|u| Some(u.as_fd())));
                    let ready = match wait_readable(fds, wait.max(Duration::from_millis(1))) {
                        Ok(r) => r,
                        Err(_) => return,
                    };
                    if ready & 1 != 0 {
                        return;
                    }
                    for (i, sock) in socks.iter().enumerate() {
                        if ready & (1 << (i + 1)) == 0 {
                            continue;
                        }
                        loop {
                            let (n, src) = match sock.recv_from(&mut buf) {
                                // An IPv4 source as such, on a dual-stack socket too.
                                Ok((n, src)) => {
                                    (n, SocketAddr::new(src.ip().to_canonical(), src.port()))
                                }
                                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                                // WouldBlock, or an error a datagram sent earlier left.
                                Err(_) => break,
                            };
                            if let Some(p) = punch.as_mut() {
                                if let Some(sp) = p.sockets.get_mut(i) {
                                    match sp.on_datagram(Instant::now(), sock, src, &buf[..n]) {
                                        PunchStep::NotMine => {}
                                        PunchStep::Taken => continue,
                                        PunchStep::Direct(addr) => {
                                            from_ips.push(addr.ip().to_canonical());
                                            (p.on_direct)(i as u16, addr);
                                            continue;
                                        }
                                    }
                                }
                            }
                            let msg = from_ips
                                .contains(&src.ip().to_canonical())
                                .then(|| open.open(&mut buf[..n]).ok())
                                .flatten()
                                .and_then(|plain| feedback::decode(plain, session).ok());
                            match msg {
                                Some(msg) => {
                                    c.received.fetch_add(1, Ordering::Relaxed);
                                    if tx.send(msg).is_err() {
                                        return;
                                    }
                                }
                                None => {
                                    c.dropped.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                }
            })?;
        Ok(FeedbackReader {
            rx,
            counts,
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for FeedbackReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // (If the wake-up cannot be sent, the stop check ends the wait within 50 ms.)
        let _ = self.wake.send(&[0]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::wire::Control;
    use std::time::Instant;

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

    #[test]
    fn a_dropped_reader_wakes_its_thread_instead_of_waiting_out_the_stop_check() {
        let (got, _, _) = crate::handshake::testing::agreed("7-a-b");
        let (_, sock) = pair();
        // A stop check of an hour: only the wake-up can end the thread's wait.
        let reader = FeedbackReader::start_checking(
            vec![sock],
            "127.0.0.1".parse().unwrap(),
            &got.keys.feedback,
            9,
            Duration::from_secs(3600),
            None,
        )
        .unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            drop(reader);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(30)).is_ok(),
            "the reader's thread was not woken"
        );
    }

    #[test]
    fn feedback_goes_once_the_sender_is_heard_and_only_its_key_opens_it() {
        let (got, _, _) = crate::handshake::testing::agreed("7-a-b");
        let key = got.keys.feedback.clone();
        let (recv_sock, send_sock) = pair();
        let send_addr = send_sock.local_addr().unwrap();
        let out = FeedbackOut::new(vec![recv_sock], &key, 9);
        let reader = FeedbackReader::start(
            vec![send_sock.try_clone().unwrap()],
            "127.0.0.1".parse().unwrap(),
            &key,
            9,
        )
        .unwrap();
        // Not heard yet: nothing goes.
        assert!(!out.send(&nack(1)), "said sent before the sender was heard");
        assert_eq!(out.sent.load(Ordering::Relaxed), 0);
        out.heard(0, send_addr);
        assert!(out.send(&nack(2)));
        assert!(
            !out.send(&Control::KeepAlive),
            "said a non-feedback message went"
        );
        assert_eq!(out.sent.load(Ordering::Relaxed), 1, "only feedback goes");
        let msg = reader.rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(msg, nack(2));
        // A datagram sealed with another key (the data key) is dropped and counted.
        let wrong = FeedbackOut::new(
            vec![UdpSocket::bind("127.0.0.1:0").unwrap()],
            &got.keys.data,
            9,
        );
        wrong.heard(0, send_addr);
        wrong.send(&nack(3));
        let t = Instant::now();
        while reader.counts.dropped.load(Ordering::Relaxed) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the forgery was not counted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(reader.rx.try_recv().is_err());
        assert_eq!(reader.counts.received.load(Ordering::Relaxed), 1);
    }
}
