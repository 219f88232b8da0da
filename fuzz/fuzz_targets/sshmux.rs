//! Any bytes from the far side of `hurtle cp`'s ssh channel, given to the multiplexer's reading
//! end (`hurtle::sshmux::Mux`) while one stream (id 1, dialed from this end and opened by
//! the far side) is live: never a panic, the stream's socket gets only bytes the far side sent
//! it in `DATA` frames, in order (a prefix of them: a stream that overruns its window is
//! killed), and the pipe's end ends the mux (its `on_end` runs, later dials fail) in bounded
//! time, whatever came before it, and every thread the mux started then exits.
//!
//! Frames: `[stream id: u32][kind: u8][length: u32][payload]`, big-endian (the module's docs).
#![no_main]
use hurtle::sshmux::{Accept, Mux, MAX_DATA};
use hurtle_engine::net::dial::Dialer;
use libfuzzer_sys::fuzz_target;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const OPEN: u8 = 1;
const OPENED: u8 = 2;
const DATA: u8 = 4;
const BOUND: Duration = Duration::from_secs(10);

/// What this end writes to the pipe, as it comes.
struct Out(mpsc::Sender<Vec<u8>>);

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = self.0.send(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn frame(id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = id.to_be_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The bytes the far side sends stream 1 in `DATA` frames, read as the mux reads its pipe
/// (it stops at a frame over [`MAX_DATA`] or a cut one).
fn data_for_stream_1(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while rest.len() >= 9 {
        let id = u32::from_be_bytes(rest[..4].try_into().unwrap());
        let kind = rest[4];
        let len = u32::from_be_bytes(rest[5..9].try_into().unwrap()) as usize;
        if len > MAX_DATA || rest.len() < 9 + len {
            break;
        }
        if id == 1 && kind == DATA {
            out.extend_from_slice(&rest[9..9 + len]);
        }
        rest = &rest[9 + len..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let (theirs, ours) = UnixStream::pair().unwrap();
    let (out_tx, out_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel();
    let mux = Mux::start(
        ours,
        Out(out_tx),
        Some(Accept {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            allow: Box::new(|_| false),
        }),
        move || {
            let _ = end_tx.send(());
        },
    );
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9);
    let dialer = mux.dialer();
    let dialing = std::thread::spawn(move || dialer.dial(to, BOUND));
    // The dial's OPEN comes out first; the far side opens stream 1, then says what it says.
    let mut said = Vec::new();
    let deadline = Instant::now() + BOUND;
    while said.len() < 11 {
        let left = deadline.saturating_duration_since(Instant::now());
        said.extend(out_rx.recv_timeout(left).expect("the dial's OPEN"));
    }
    assert_eq!(said[..11], frame(1, OPEN, &9u16.to_be_bytes())[..]);
    let mut pipe = &theirs;
    pipe.write_all(&frame(1, OPENED, &[])).unwrap();
    let mut sock = dialing.join().unwrap().expect("stream 1 opened");
    // The stream's socket, read to its end on a thread of its own.
    sock.set_read_timeout(Some(BOUND)).unwrap();
    let reading = std::thread::spawn(move || {
        let mut got = Vec::new();
        let _ = sock.read_to_end(&mut got);
        got
    });
    pipe.write_all(data).unwrap();
    theirs.shutdown(Shutdown::Both).unwrap();
    end_rx
        .recv_timeout(BOUND)
        .expect("the pipe's end ends the mux");
    assert!(mux.ended());
    let got = reading.join().unwrap();
    let sent = data_for_stream_1(data);
    assert!(
        sent.starts_with(&got),
        "stream 1 got {} bytes that are not a prefix of the {} sent to it",
        got.len(),
        sent.len()
    );
    assert!(mux.dialer().dial(to, Duration::from_secs(1)).is_err());
    // Nothing of this input runs on into the next one (a thread still exiting when the
    // iteration ends is what LeakSanitizer reports as a leak).
    assert!(
        mux.join_threads(BOUND),
        "the mux's threads run on after its end"
    );
});
