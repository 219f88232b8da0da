//! A control-connection peer driven by hand, to play a broken or hostile sender.

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

/// One TCP control connection to a receiver, speaking [`Control`] frames directly.
pub struct RawPeer {
    stream: TcpStream,
}

impl RawPeer {
    /// Connects; reads time out after 10 s so a silent receiver cannot hang the test.
    pub fn connect(addr: SocketAddr) -> RawPeer {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to the receiver at {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawPeer { stream }
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Writes one message.
    pub fn send(&mut self, msg: &Control) {
        self.send_raw(&msg.to_frame());
    }

    /// Reads the next message; `None` when the receiver closed the connection.
    pub fn recv(&mut self) -> Option<Control> {
        read_frame(&mut self.stream)
    }

    /// Sends a valid hello (one channel) and returns the receiver's answer.
    pub fn hello(&mut self) -> Control {
        self.send(&Control::Hello {
            magic: wire::MAGIC,
            version: wire::VERSION,
            caps: 0,
            channels: 1,
            payload: wire::DEFAULT_PAYLOAD,
            block_size: 1 << 20,
            session: 0x5eed_0001,
        });
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
        }],
        last: true,
    }
}
