//! A control-connection peer driven by hand, to play a broken or hostile sender. It passes the
//! key agreement with the suite's code ([`super::TEST_CODE`]) and then speaks sealed frames.

use hurtle_proto::secure::{FrameOpen, FrameSeal, Offer, Secret};
use hurtle_proto::wire::{self, Control, Entry, EntryKind};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Reads one control frame; `None` on EOF, timeout or a malformed frame.
pub fn read_frame(r: &mut impl Read) -> Option<Control> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).ok()?;
    let len = Control::frame_len(prefix).ok()?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Control::from_body(&body).ok()
}

/// [`read_frame`] on `s`, its reads timing out after `timeout`.
#[allow(dead_code)] // not every test binary uses it
pub fn read_frame_within(s: &mut TcpStream, timeout: Duration) -> Option<Control> {
    s.set_read_timeout(Some(timeout)).ok()?;
    read_frame(s)
}

/// One TCP control connection to a receiver, speaking [`Control`] frames directly: sealed
/// after the key agreement, or plain before it ([`RawPeer::connect_plain`]).
pub struct RawPeer {
    stream: TcpStream,
    keys: Option<(FrameSeal, FrameOpen)>,
}

impl RawPeer {
    /// Connects and passes the key agreement with the suite's code, its hello (one channel)
    /// behind the offer ([`RawPeer::hello`] reads the answer to it); reads time out after 10 s
    /// so a silent receiver cannot hang the test.
    pub fn connect(addr: SocketAddr) -> RawPeer {
        let mut peer = RawPeer::connect_plain(addr);
        let hello = Control::hello(0, 1, wire::DEFAULT_PAYLOAD, 1 << 20, 0x5eed_0001);
        let (offer, first) = Offer::new(&Secret::code(super::TEST_CODE), false, &hello);
        peer.send(&first);
        peer.send(&hello);
        let reply = peer.recv().expect("an answer to the key agreement");
        let keys = offer.finish(reply).expect("the key agreement");
        peer.keys = Some((keys.frames_out, keys.frames_in));
        peer
    }

    /// Connects without the key agreement: everything it sends is plain.
    pub fn connect_plain(addr: SocketAddr) -> RawPeer {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to the receiver at {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawPeer { stream, keys: None }
    }

    /// Writes raw bytes (after the agreement, bytes the receiver cannot open).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Writes one message, sealed once the agreement is done.
    pub fn send(&mut self, msg: &Control) {
        let frame = match &mut self.keys {
            Some((seal, _)) => seal.seal(msg),
            None => msg.to_frame(),
        };
        self.send_raw(&frame);
    }

    /// Reads the next message; `None` when the receiver closed the connection (or sent a
    /// frame that does not open).
    pub fn recv(&mut self) -> Option<Control> {
        match &mut self.keys {
            None => read_frame(&mut self.stream),
            Some((_, open)) => {
                let mut prefix = [0u8; 4];
                self.stream.read_exact(&mut prefix).ok()?;
                let len = Control::frame_len(prefix).ok()?;
                let mut body = vec![0u8; len];
                self.stream.read_exact(&mut body).ok()?;
                open.open(prefix, body).ok()
            }
        }
    }

    /// Reads the receiver's answer to the hello that [`RawPeer::connect`] sent. A sealed
    /// keep-alive goes first: the receiver answers the hello only once a first sealed frame
    /// proved the key.
    pub fn hello(&mut self) -> Control {
        self.send(&Control::KeepAlive);
        let ack = self.recv().expect("an answer to the hello");
        assert!(
            matches!(ack, Control::HelloAck { .. }),
            "expected HelloAck, got {ack:?}"
        );
        ack
    }

    /// Reads until the receiver aborts (returns the reason) or closes (returns `None`),
    /// skipping other messages; at most 100 messages.
    pub fn until_abort(&mut self) -> Option<String> {
        for _ in 0..100 {
            match self.recv()? {
                Control::Abort { reason, .. } | Control::Reject { reason } => return Some(reason),
                _ => continue,
            }
        }
        None
    }

    /// Closes the connection both ways.
    pub fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// A one-entry manifest of a small file or directory at `path`.
pub fn manifest_of(path: &str, kind: EntryKind) -> Control {
    Control::Manifest {
        entries: vec![Entry {
            path: path.to_owned(),
            kind,
            size: if kind == EntryKind::File { 10 } else { 0 },
            mode: 0o644,
            mtime_ns: 0,
            holes: Vec::new(),
            target: String::new(),
        }],
        last: true,
    }
}
