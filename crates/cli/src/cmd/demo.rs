//! `hurtle demo`: a real transfer on this machine, verified, beside one plain TCP connection.
//!
//! Makes a file of random bytes in a temporary directory, starts a receiver on loopback, sends
//! the file with the default settings, checks the copy's BLAKE3 against the source's, then moves
//! the same file through one plain TCP connection (sendfile on one side, write + fsync on the
//! other) for comparison. The summary says what limited hurtle's transfer, as `send`'s does
//! (on loopback most often the receiver's CPU or the disk). The temporary directory is removed
//! at the end, also on failure.

use crate::args::{DemoArgs, OutputArgs};
use crate::exit::{self, Failure, Outcome};
use crate::ui::{bytes, rate, say};
use anyhow::{Context, Result};
use hurtle_engine::{ReceiveOptions, Receiver, SendOptions, SessionError};
use rand::RngCore;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

fn hash_file(path: &Path) -> Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    h.update_reader(BufReader::with_capacity(1 << 20, File::open(path)?))?;
    Ok(*h.finalize().as_bytes())
}

/// Seconds to move `src` to `dst` through one TCP connection on loopback.
fn plain_tcp(src: &Path, dst: &Path) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let dst = dst.to_path_buf();
    let server = std::thread::spawn(move || -> Result<()> {
        let (mut sock, _) = listener.accept()?;
        let mut out = File::create(&dst)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = sock.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
        }
        out.sync_all()?;
        sock.write_all(b"k")?;
        Ok(())
    });
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr)?;
    std::io::copy(&mut File::open(src)?, &mut sock)?;
    sock.shutdown(std::net::Shutdown::Write)?;
    let mut ack = [0u8; 1];
    sock.read_exact(&mut ack)
        .context("TCP receiver did not confirm")?;
    let secs = t0.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| anyhow::anyhow!("TCP receiver thread panicked"))??;
    Ok(secs)
}

/// The copy's BLAKE3 differs from the source's.
#[derive(Debug, thiserror::Error)]
#[error("the received file's BLAKE3 differs from the source's")]
struct Mismatch;

/// `hurtle demo`.
pub fn run(a: DemoArgs) -> Outcome {
    demo(&a.output, a.size, a.channels, &a.rate, !a.no_tcp).map_err(|e| {
        let code = if e.is::<Mismatch>() {
            exit::VERIFICATION
        } else if let Some(s) = e.downcast_ref::<SessionError>() {
            exit::session_code(s)
        } else {
            exit::OTHER
        };
        Failure::new(code, e)
    })
}

fn demo(
    out: &OutputArgs,
    size: u64,
    channels: Option<u16>,
    rate_args: &crate::args::RateArgs,
    with_tcp: bool,
) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("hurtle-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let src_dir = dir.path().join("src");
    let in_dir = dir.path().join("incoming");
    std::fs::create_dir_all(&src_dir)?;
    let src = src_dir.join("random.bin");
    say(
        out,
        &format!(
            "hurtle demo: writing {} of random bytes to {}",
            bytes(size),
            src.display()
        ),
    );
    {
        let mut f = File::create(&src)?;
        let mut rng = rand::rng();
        let mut buf = vec![0u8; 4 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill_bytes(&mut buf[..n]);
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        // On the disk before either transfer starts, so that neither competes with its
        // writeback (the first would, and look slower than it is).
        f.sync_all()?;
    }
    let src_hash = hash_file(&src)?;

    // Both ends hold the same new code, as a receiver that printed it and a sender given it.
    let code = crate::cmd::keys::new_code();
    let receiver = Receiver::bind(
        "127.0.0.1:0".parse()?,
        ReceiveOptions {
            out_dir: in_dir.clone(),
            log_dir: out.log_dir.clone(),
            keys: hurtle_engine::Keyring::code(&code),
            ..ReceiveOptions::default()
        },
    )?;
    let addr = receiver.local_addr()?;
    let recv_thread = std::thread::spawn(move || receiver.accept_one(Default::default()));
    let mut opts = SendOptions {
        log_dir: out.log_dir.clone(),
        secret: Some(hurtle_proto::secure::Secret::code(&code)),
        ..SendOptions::default()
    };
    if let Some(c) = channels {
        opts.channels = c;
    }
    rate_args.apply(&mut opts);
    say(
        out,
        &format!(
            "hurtle demo: sending it to a receiver on {addr} ({} channels, rate control {})",
            opts.channels,
            match opts.rate_mode {
                hurtle_proto::RateMode::Fixed =>
                    format!("off, fixed at {}", rate(opts.rate_bps as f64)),
                hurtle_proto::RateMode::Fair => "fair".into(),
                hurtle_proto::RateMode::Auto => "auto".into(),
            }
        ),
    );
    let (progress, bar) = crate::ui::progress_bar(out, "sending");
    crate::interrupt::watch(&progress);
    let sent = hurtle_engine::send(std::slice::from_ref(&src), addr, &opts, progress);
    bar.finish();
    let received = recv_thread
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))?;
    let sent = sent?;
    let received = received?;
    let dst_hash = hash_file(&in_dir.join("random.bin"))?;
    let matched = dst_hash == src_hash;

    let tcp = if with_tcp {
        Some(plain_tcp(&src, &dir.path().join("tcp-copy.bin"))?)
    } else {
        None
    };
    let cc =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    if out.json {
        let v = serde_json::json!({
            "size": size,
            "seconds": sent.seconds,
            "goodput_bps": sent.goodput_bps,
            "resent_share": sent.resent_share,
            "channels": sent.channels,
            "datagrams_sent": sent.datagrams_sent,
            "datagrams_resent": sent.datagrams_resent,
            "nacks": sent.nacks,
            "encrypted": sent.encrypted,
            "first_data_ms": sent.first_data_ms,
            "bottleneck": sent.bottleneck,
            // The pacing rate's timeline and the receiver's reports, as `send --json` gives
            // them (`bench/timeline.py` reads them).
            "rate": sent.rate,
            "receiver_socket_drops": sent.receiver_socket_drops,
            "hash_match": matched,
            "blake3": hurtle_proto::hash::to_hex(&dst_hash),
            "receiver_rejected": received.rejected,
            "tcp_seconds": tcp,
            "tcp_goodput_bps": tcp.map(|t| size as f64 * 8.0 / t),
            "tcp_congestion_control": cc.trim(),
        });
        println!("{v}");
    } else {
        say(
            out,
            &format!(
                "hurtle:    {} in {:.2} s = {} ({} channels, {:.2}% resent, {} NACKs), BLAKE3 {}",
                bytes(size),
                sent.seconds,
                rate(sent.goodput_bps),
                sent.channels,
                sent.resent_share * 100.0,
                sent.nacks,
                if matched { "matches" } else { "DIFFERS" }
            ),
        );
        if let Some(b) = &sent.bottleneck {
            say(out, &format!("           limited by {}", b.detail));
        }
        if let Some(t) = tcp {
            say(out, &format!("plain TCP: {} in {:.2} s = {} (one connection on loopback, {}, no verification)", bytes(size), t, rate(size as f64 * 8.0 / t), cc.trim()));
        }
        for w in &sent.warnings {
            say(out, &format!("note: {w}"));
        }
    }
    if !matched {
        return Err(Mismatch.into());
    }
    Ok(())
}
