//! A benchmark baseline: one TCP connection that does the integrity work hurtle does, BLAKE3 of
//! every byte on both ends, and nothing else (no framing per block, no repair, no pacing).
//!
//! ```text
//! tcphash recv --listen ADDR:PORT --out FILE
//! tcphash send FILE --to ADDR:PORT
//! ```
//!
//! The sender writes the file's size (8 bytes, big-endian), the file, then its BLAKE3 (32
//! bytes); it reads the file in 1 MiB pieces into an aligned buffer (hurtle's own
//! `iobuf::IoBuf`, as hurtle reads) and hashes each piece before sending it. The receiver reads
//! into a 1 MiB buffer, hashes and writes each piece, compares the hashes and answers one byte
//! (1: match), so the sender's exit status says whether the file arrived intact. Both print the
//! byte count on success.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hurtle_engine::iobuf::IoBuf;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

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

/// Moves `size` bytes a piece at a time: `fill` puts the piece at an offset into the buffer,
/// BLAKE3 takes it, `drain` passes it on. Returns the hash of all of it.
fn pieces(
    size: u64,
    mut fill: impl FnMut(u64, &mut [u8]) -> Result<()>,
    mut drain: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<blake3::Hash> {
    let mut buf = IoBuf::new(PIECE);
    let mut hasher = blake3::Hasher::new();
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(PIECE as u64) as usize;
        let piece = &mut buf.aligned()[..want];
        fill(done, piece)?;
        hasher.update(piece);
        drain(done, piece)?;
        done += want as u64;
    }
    Ok(hasher.finalize())
}

fn recv(listen: &str, out: &Path) -> Result<u64> {
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let (mut conn, _) = listener.accept().context("accept")?;
    let mut size = [0u8; 8];
    conn.read_exact(&mut size).context("read the size")?;
    let size = u64::from_be_bytes(size);
    let file = File::create(out).with_context(|| format!("create {}", out.display()))?;
    let ours = pieces(
        size,
        |_, piece| conn.read_exact(piece).context("read data"),
        |at, piece| file.write_all_at(piece, at).context("write"),
    )?;
    let mut theirs = [0u8; 32];
    conn.read_exact(&mut theirs).context("read the hash")?;
    let ok = ours.as_bytes() == &theirs;
    conn.write_all(&[u8::from(ok)]).context("answer")?;
    if !ok {
        bail!("BLAKE3 differs");
    }
    Ok(size)
}

fn send(path: &Path, to: &str) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let size = file.metadata()?.len();
    let mut conn = TcpStream::connect(to).with_context(|| format!("connect to {to}"))?;
    conn.write_all(&size.to_be_bytes())?;
    let hash = pieces(
        size,
        |at, piece| file.read_exact_at(piece, at).context("read"),
        |_, piece| conn.write_all(piece).context("send"),
    )?;
    conn.write_all(hash.as_bytes())?;
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
