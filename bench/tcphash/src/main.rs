//! A benchmark baseline: one TCP connection that does the integrity work hurtle does, BLAKE3 of
//! every byte on both ends, and nothing else (no framing per block, no repair, no pacing).
//!
//! ```text
//! tcphash recv --listen ADDR:PORT --out FILE
//! tcphash send FILE --to ADDR:PORT
//! ```
//!
//! The sender writes the file's size (8 bytes, big-endian), the file, then its BLAKE3 (32
//! bytes); it reads the file in 1 MiB pieces into a page-aligned buffer and hashes each piece
//! before sending it. The receiver reads into a 1 MiB buffer, hashes and writes each piece,
//! compares the hashes and answers one byte (1: match), so the sender's exit status says
//! whether the file arrived intact. Both print the byte count on success.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Piece size for reads, hashing and writes.
const PIECE: usize = 1 << 20;

#[derive(Parser)]
#[command(about = "one TCP connection with BLAKE3 of every byte on both ends")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Receive one file.
    Recv {
        #[arg(long)]
        listen: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Send one file.
    Send {
        file: PathBuf,
        #[arg(long)]
        to: String,
    },
}

/// A zeroed buffer of `len` bytes starting on a 4096-byte boundary (the kernel's copy out of
/// the page cache is much slower into a misaligned buffer on some CPUs; hurtle aligns too).
struct Aligned {
    raw: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let raw = vec![0u8; len + 4096];
        let start = raw.as_ptr().align_offset(4096).min(4096);
        Aligned { raw, start }
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + len]
    }
}

fn recv(listen: &str, out: &PathBuf) -> Result<u64> {
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let (mut conn, _) = listener.accept().context("accept")?;
    let mut size = [0u8; 8];
    conn.read_exact(&mut size).context("read the size")?;
    let size = u64::from_be_bytes(size);
    let file = File::create(out).with_context(|| format!("create {}", out.display()))?;
    let mut buf = Aligned::new(PIECE);
    let mut hasher = blake3::Hasher::new();
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(PIECE as u64) as usize;
        let piece = buf.get(want);
        conn.read_exact(piece).context("read data")?;
        hasher.update(piece);
        file.write_all_at(piece, done).context("write")?;
        done += want as u64;
    }
    let mut theirs = [0u8; 32];
    conn.read_exact(&mut theirs).context("read the hash")?;
    let ok = hasher.finalize().as_bytes() == &theirs;
    conn.write_all(&[u8::from(ok)]).context("answer")?;
    if !ok {
        bail!("BLAKE3 differs");
    }
    Ok(size)
}

fn send(path: &PathBuf, to: &str) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let size = file.metadata()?.len();
    let mut conn = TcpStream::connect(to).with_context(|| format!("connect to {to}"))?;
    conn.write_all(&size.to_be_bytes())?;
    let mut buf = Aligned::new(PIECE);
    let mut hasher = blake3::Hasher::new();
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(PIECE as u64) as usize;
        let piece = buf.get(want);
        file.read_exact_at(piece, done).context("read")?;
        hasher.update(piece);
        conn.write_all(piece).context("send")?;
        done += want as u64;
    }
    conn.write_all(hasher.finalize().as_bytes())?;
    let mut answer = [0u8; 1];
    conn.read_exact(&mut answer).context("read the answer")?;
    if answer[0] != 1 {
        bail!("the receiver's BLAKE3 differs");
    }
    Ok(size)
}

fn main() -> Result<()> {
    let n = match Cli::parse().cmd {
        Cmd::Recv { listen, out } => recv(&listen, &out)?,
        Cmd::Send { file, to } => send(&file, &to)?,
    };
    println!("{n}");
    Ok(())
}
