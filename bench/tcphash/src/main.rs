//! A benchmark baseline: one TCP connection that does the integrity work hurtle does, BLAKE3 of
//! every byte on both ends, and nothing else (no framing per block, no repair); optionally paced
//! by the kernel, or without the hash (plain TCP with the same reads and writes).
//!
//! ```text
//! tcphash recv --listen ADDR:PORT --out FILE
//! tcphash send FILE --to ADDR:PORT [--pacing-rate RATE] [--no-hash]
//! ```
//!
//! The sender writes a header (the file's size, 8 bytes big-endian, then one byte: 1 if it
//! hashes, 0 if not), the file, then its BLAKE3 (32 bytes; without hashing, none); it reads the
//! file in 1 MiB pieces into an aligned buffer (hurtle's own `iobuf::IoBuf`, as hurtle reads)
//! and hashes each piece before sending it. The receiver does what the header says: it reads
//! into a 1 MiB buffer, hashes (if asked) and writes each piece, compares the hashes and
//! answers one byte (1: match; without hashing, 1 once every byte is written), so the sender's
//! exit status says whether the file arrived intact. Both print the byte count on success.
//!
//! `--pacing-rate` (bit/s, with an optional k/M/G suffix) sets `SO_MAX_PACING_RATE` on the
//! sender's socket: with the `fq` qdisc fq paces; without it the kernel paces inside TCP
//! (`tcp_internal_pacing`, an hrtimer per burst). Either way the sender's TCP sends at most
//! that many bytes per second, headers included, so the receiver sees a paced stream.

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
        /// Pace the connection at RATE bit/s (k/M/G suffixes; SO_MAX_PACING_RATE).
        #[arg(long, value_name = "RATE", value_parser = parse_rate)]
        pacing_rate: Option<u64>,
        /// Do not hash: plain TCP with the same reads and writes (the receiver follows).
        #[arg(long)]
        no_hash: bool,
    },
}

/// Parses a rate in bit/s: digits with an optional k, M or G (decimal) suffix, e.g. `400M`.
fn parse_rate(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1e3),
        Some((i, 'm' | 'M')) => (&s[..i], 1e6),
        Some((i, 'g' | 'G')) => (&s[..i], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad rate {s:?} (bit/s, e.g. 100M, 1G, 250000)"))?;
    let bits = v * mult;
    // At least one byte per second, at most what SO_MAX_PACING_RATE's u64 bytes/s can hold.
    if !bits.is_finite() || bits < 8.0 || bits / 8.0 >= u64::MAX as f64 {
        return Err(format!("rate {s:?} out of range"));
    }
    Ok((bits / 8.0) as u64 * 8)
}

mod sys;

/// Moves `size` bytes a piece at a time: `fill` puts the piece at an offset into the buffer,
/// BLAKE3 takes it (if `hash`), `drain` passes it on. Returns the hash of all of it, if taken.
fn pieces(
    size: u64,
    hash: bool,
    mut fill: impl FnMut(u64, &mut [u8]) -> Result<()>,
    mut drain: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Option<blake3::Hash>> {
    let mut buf = IoBuf::new(PIECE);
    let mut hasher = hash.then(blake3::Hasher::new);
    let mut done = 0u64;
    while done < size {
        let want = (size - done).min(PIECE as u64) as usize;
        let piece = &mut buf.aligned()[..want];
        fill(done, piece)?;
        if let Some(h) = hasher.as_mut() {
            h.update(piece);
        }
        drain(done, piece)?;
        done += want as u64;
    }
    Ok(hasher.map(|h| h.finalize()))
}

fn recv(listen: &str, out: &Path) -> Result<u64> {
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let (mut conn, _) = listener.accept().context("accept")?;
    let mut header = [0u8; 9];
    conn.read_exact(&mut header).context("read the header")?;
    let size = u64::from_be_bytes(header[..8].try_into().expect("8 bytes"));
    let hash = match header[8] {
        0 => false,
        1 => true,
        other => bail!("bad header: hash flag {other} (not a tcphash sender?)"),
    };
    let file = File::create(out).with_context(|| format!("create {}", out.display()))?;
    let ours = pieces(
        size,
        hash,
        |_, piece| conn.read_exact(piece).context("read data"),
        |at, piece| file.write_all_at(piece, at).context("write"),
    )?;
    let ok = match ours {
        Some(ours) => {
            let mut theirs = [0u8; 32];
            conn.read_exact(&mut theirs).context("read the hash")?;
            ours.as_bytes() == &theirs
        }
        None => true,
    };
    conn.write_all(&[u8::from(ok)]).context("answer")?;
    if !ok {
        bail!("BLAKE3 differs");
    }
    Ok(size)
}

fn send(path: &Path, to: &str, pacing_rate: Option<u64>, hash: bool) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let size = file.metadata()?.len();
    let mut conn = TcpStream::connect(to).with_context(|| format!("connect to {to}"))?;
    if let Some(rate) = pacing_rate {
        sys::set_pacing_rate(&conn, rate)?;
    }
    let mut header = [0u8; 9];
    header[..8].copy_from_slice(&size.to_be_bytes());
    header[8] = u8::from(hash);
    conn.write_all(&header)?;
    let ours = pieces(
        size,
        hash,
        |at, piece| file.read_exact_at(piece, at).context("read"),
        |_, piece| conn.write_all(piece).context("send"),
    )?;
    if let Some(ours) = ours {
        conn.write_all(ours.as_bytes())?;
    }
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
        Cmd::Send {
            file,
            to,
            pacing_rate,
            no_hash,
        } => send(&file, &to, pacing_rate, !no_hash)?,
    };
    println!("{n}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_parse_in_bits_per_second() {
        assert_eq!(parse_rate("100M"), Ok(100_000_000));
        assert_eq!(parse_rate("1G"), Ok(1_000_000_000));
        assert_eq!(parse_rate("2.5g"), Ok(2_500_000_000));
        assert_eq!(parse_rate("64k"), Ok(64_000));
        assert_eq!(parse_rate("800"), Ok(800));
        for bad in ["", "M", "fast", "-1M", "1T", "0", "1e30G", "NaN"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} parsed");
        }
    }
}
