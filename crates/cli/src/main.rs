//! The `hurtle` command: `send`, `receive`, `relay` and `demo`.
//!
//! This file parses flags and maps outcomes to output and exit codes; transfers are done by
//! `hurtle-engine`. Progress bars go to stderr on a terminal only; `--json` prints one summary
//! object on stdout at the end.

mod demo;
mod rendezvous;
mod ui;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use hurtle_engine::sender::Transport;
use hurtle_engine::{ReceiveOptions, Receiver, SendOptions, SessionError, WriteQueue};
use hurtle_proto::RateMode;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

/// Fast, verified file transfer over long, fat, lossy networks.
#[derive(Parser)]
#[command(name = "hurtle", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Receive one transfer (or, with --serve, transfers until interrupted).
    Receive(ReceiveArgs),
    /// Send files and directories to a receiver.
    Send(SendArgs),
    /// Send a file of random bytes to a receiver on this machine and compare with plain TCP.
    Demo(DemoArgs),
    /// Run a rendezvous/relay server that pairs senders with receivers by a code.
    Relay(rendezvous::RelayArgs),
}

/// Output flags shared by every command.
#[derive(Args, Clone)]
pub struct OutputArgs {
    /// Print one JSON summary object on stdout at the end.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print more detail (warnings, counters).
    #[arg(short, long)]
    pub verbose: bool,
    /// Write one network log per channel into this directory.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TransportArg {
    Auto,
    Udp,
    Tcp,
}

/// Rate flags shared by `send` and `demo`.
#[derive(Args, Clone)]
pub struct RateArgs {
    /// Highest rate in bits per second, with k/M/G suffixes (e.g. 800M); automatic rate control
    /// never exceeds it [default: only the receiver's measured ceiling]
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Pace at exactly this rate and ignore feedback (for benchmarks and links you own)
    #[arg(long, value_parser = parse_rate, conflicts_with_all = ["rate", "fair"])]
    pub rate_fixed: Option<u64>,
    /// Yield to competing traffic on a shared bottleneck (delay-based back-off)
    #[arg(long)]
    pub fair: bool,
}

impl RateArgs {
    /// Applies the flags to sender options.
    pub fn apply(&self, opts: &mut SendOptions) {
        if let Some(r) = self.rate_fixed {
            opts.rate_mode = RateMode::Fixed;
            opts.rate_bps = r;
            return;
        }
        opts.rate_mode = if self.fair {
            RateMode::Fair
        } else {
            RateMode::Auto
        };
        if let Some(r) = self.rate {
            opts.rate_bps = r;
            opts.start_rate_bps = opts.start_rate_bps.min(r);
        }
    }
}

#[derive(Args)]
struct ReceiveArgs {
    /// Address to listen on for the control connection (UDP ports are chosen per transfer)
    /// [default: 0.0.0.0:7400, or 0.0.0.0:0 with --relay]
    #[arg(long)]
    listen: Option<String>,
    /// Register with this relay (HOST:PORT) and print a code for the sender.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "serve")]
    relay: Option<String>,
    /// Directory to receive into (created if missing).
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Keep receiving transfers until interrupted.
    #[arg(long)]
    serve: bool,
    /// Replace files that already exist.
    #[arg(long)]
    overwrite: bool,
    /// Memory for gathering blocks that are still incomplete, across all channels (K/M/G,
    /// binary); on a disk, up to a quarter as much again queues complete blocks for the writer
    /// thread. When it runs out, the oldest incomplete block is written to the file as it is
    /// and the rest of it as it arrives; every channel keeps at least 4 blocks' worth.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    buffer_memory: u64,
    /// Who writes complete blocks: `auto` (a writer thread on a disk, the channel threads on
    /// tmpfs), `always` the writer thread, `never`. For tests and comparisons.
    #[arg(long, hide = true, value_enum, default_value = "auto")]
    write_queue: WriteQueueArg,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum WriteQueueArg {
    Auto,
    Always,
    Never,
}

#[derive(Args)]
struct SendArgs {
    /// Files and directories to send (directories recursively).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The receiver's address, HOST:PORT.
    #[arg(long, required_unless_present = "code", conflicts_with = "code")]
    to: Option<String>,
    /// The code the receiver printed (with --relay).
    #[arg(long, requires = "relay")]
    code: Option<String>,
    /// The relay the receiver registered with, HOST:PORT (with --code).
    #[arg(long, value_name = "HOST:PORT", requires = "code")]
    relay: Option<String>,
    /// Never connect directly: go through the relay (for tests).
    #[arg(long, hide = true, requires = "code")]
    relay_only: bool,
    /// Number of UDP data channels, or TCP connections with --transport tcp [default: one per
    /// core, 2 to 8].
    #[arg(long, alias = "connections")]
    channels: Option<u16>,
    /// How data moves: udp, tcp (N parallel TCP connections), or auto (UDP, falling back to TCP
    /// when no datagram gets through).
    #[arg(long, value_enum, default_value = "auto")]
    transport: TransportArg,
    /// Chunk size: the unit of striping, hashing and verification (a power of two, 1K to 64M).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    chunk_size: u64,
    #[command(flatten)]
    rate: RateArgs,
    /// Largest datagram payload to try, in bytes. The handshake lowers it to what the path
    /// carries: 1384 on a 1500-byte path, more with jumbo frames or on loopback.
    #[arg(long, default_value_t = hurtle_proto::wire::MAX_PAYLOAD)]
    payload: u16,
    /// Follow symbolic links instead of skipping them.
    #[arg(long)]
    follow_symlinks: bool,
    /// Skip a file the receiver already has only if its BLAKE3 matches (both sides read it);
    /// by default a file of the same size and modification time is skipped unread, as rsync
    /// does.
    #[arg(long)]
    checksum: bool,
    /// Send the holes of sparse files as data (by default they are found with SEEK_HOLE and
    /// not sent, and stay holes on the receiver).
    #[arg(long)]
    no_sparse: bool,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct DemoArgs {
    /// Size of the random file, with K/M/G suffixes (binary).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// Number of UDP data channels [default: one per core, 2 to 8].
    #[arg(long)]
    channels: Option<u16>,
    #[command(flatten)]
    rate: RateArgs,
    /// Skip the plain-TCP comparison.
    #[arg(long)]
    no_tcp: bool,
    #[command(flatten)]
    output: OutputArgs,
}

/// Parses "800M", "1.5G", "250k" or a plain number as bits per second.
fn parse_rate(s: &str) -> Result<u64, String> {
    parse_scaled(s, 1000.0).map_err(|e| format!("{e} (expected bits per second like 800M or 2G)"))
}

/// Parses "1G", "64M", "4096" as bytes (binary multiples).
fn parse_size(s: &str) -> Result<u64, String> {
    parse_scaled(s, 1024.0).map_err(|e| format!("{e} (expected a size like 1G or 64M)"))
}

fn parse_scaled(s: &str, base: f64) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['b', 'B', 'i']);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => base,
                'm' => base * base,
                'g' => base * base * base,
                't' => base * base * base * base,
                _ => return Err(format!("unknown suffix in {s:?}")),
            };
            (&t[..i], m)
        }
        _ => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("must be positive: {s:?}"));
    }
    Ok((v * mult) as u64)
}

fn resolve(addr: &str) -> Result<SocketAddr, SessionError> {
    addr.to_socket_addrs()
        .map_err(|e| SessionError::io(format!("cannot resolve {addr}"), e))?
        .next()
        .ok_or_else(|| {
            SessionError::io(
                format!("cannot resolve {addr}"),
                std::io::Error::other("no address"),
            )
        })
}

/// Exit codes: 1 other failure, 2 usage, 3 refused by the receiver, 4 network, 5 verification,
/// 6 local storage (disk full, permissions, unsafe path).
fn exit_code(e: &SessionError) -> u8 {
    match e {
        SessionError::Refused { .. } => 3,
        SessionError::Connect { .. }
        | SessionError::Listen { .. }
        | SessionError::Control(_)
        | SessionError::UdpBlocked { .. }
        | SessionError::Stalled(_)
        | SessionError::Udp(_) => 4,
        SessionError::Verification { .. }
        | SessionError::HashMismatch { .. }
        | SessionError::SourceChanged(_) => 5,
        SessionError::Store(_) | SessionError::Path(_) | SessionError::Walk(_) => 6,
        _ => 1,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Receive(a) => receive(a),
        Command::Send(a) => send(a),
        Command::Demo(a) => {
            demo::run(&a.output, a.size, a.channels, &a.rate, !a.no_tcp).map_err(|e| (1, e))
        }
        Command::Relay(a) => rendezvous::serve(a),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("hurtle: error: {}", one_line(&e));
            ExitCode::from(code)
        }
    }
}

/// An error and its causes on one line, each cause once: most of the engine's errors already
/// name their cause in their own message, context added with `anyhow` does not.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

type Outcome = std::result::Result<(), (u8, anyhow::Error)>;

fn fail(e: SessionError) -> (u8, anyhow::Error) {
    (exit_code(&e), anyhow::Error::new(e))
}

fn receive(a: ReceiveArgs) -> Outcome {
    let default_listen = if a.relay.is_some() {
        "0.0.0.0:0"
    } else {
        "0.0.0.0:7400"
    };
    let addr = resolve(a.listen.as_deref().unwrap_or(default_listen)).map_err(fail)?;
    let opts = ReceiveOptions {
        out_dir: a.out.clone(),
        overwrite: a.overwrite,
        log_dir: a.output.log_dir.clone(),
        buffer_memory: usize::try_from(a.buffer_memory).unwrap_or(usize::MAX),
        write_queue: match a.write_queue {
            WriteQueueArg::Auto => WriteQueue::Auto,
            WriteQueueArg::Always => WriteQueue::Always,
            WriteQueueArg::Never => WriteQueue::Never,
        },
        ..ReceiveOptions::default()
    };
    let own_ports = opts.own_ports.clone();
    let receiver = Receiver::bind(addr, opts).map_err(fail)?;
    let bound = receiver.local_addr().map_err(fail)?;
    ui::say(
        &a.output,
        &format!(
            "hurtle: listening on {bound}, receiving into {}",
            a.out.display()
        ),
    );
    if let Some(relay) = &a.relay {
        return rendezvous::receive(&a.output, relay, receiver, bound, own_ports);
    }
    loop {
        let (progress, bar) = ui::progress_bar(&a.output, "receiving");
        let result = receiver.accept_one(progress);
        bar.finish();
        match result {
            Ok(s) => ui::print_receive_summary(&a.output, &s, None),
            Err(e) if a.serve => {
                // One write, so a reader never sees half the line.
                let line = format!("hurtle: transfer failed: {e}");
                eprintln!("{line}");
                continue;
            }
            Err(e) => return Err(fail(e)),
        }
        if !a.serve {
            return Ok(());
        }
    }
}

fn send(a: SendArgs) -> Outcome {
    let mut opts = SendOptions {
        payload: a.payload,
        follow_symlinks: a.follow_symlinks,
        checksum: a.checksum,
        no_sparse: a.no_sparse,
        log_dir: a.output.log_dir.clone(),
        ..SendOptions::default()
    };
    if let Some(c) = a.channels {
        opts.channels = c;
    }
    a.rate.apply(&mut opts);
    opts.transport = match a.transport {
        TransportArg::Auto => Transport::Auto,
        TransportArg::Udp => Transport::Udp,
        TransportArg::Tcp => Transport::Tcp,
    };
    if !a.chunk_size.is_power_of_two() || !(1024..=64 << 20).contains(&a.chunk_size) {
        return Err((
            2,
            anyhow::anyhow!("--chunk-size must be a power of two between 1K and 64M"),
        ));
    }
    opts.block_size = a.chunk_size;
    let (to, path) = match (&a.to, &a.code, &a.relay) {
        (Some(to), _, _) => (resolve(to).map_err(fail)?, None),
        (None, Some(code), Some(relay)) => {
            let (to, path) = rendezvous::pair(&a.output, relay, code, a.relay_only)?;
            opts.dialer = Some(path.dialer.clone());
            (to, Some(path))
        }
        _ => return Err((2, anyhow::anyhow!("give --to, or --code with --relay"))),
    };
    let (progress, bar) = ui::progress_bar(&a.output, "sending");
    let result = hurtle_engine::send(&a.paths, to, &opts, progress);
    bar.finish();
    let s = result.map_err(fail)?;
    ui::print_send_summary(&a.output, &s, path.as_ref().map(|p| &p.info));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_sizes_parse() {
        assert_eq!(parse_rate("800M"), Ok(800_000_000));
        assert_eq!(parse_rate("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_rate("250k"), Ok(250_000));
        assert_eq!(parse_rate("1000"), Ok(1000));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-5M").is_err());
        assert!(parse_rate("5X").is_err());
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        use anyhow::Context;
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let own = anyhow::Error::new(SessionError::io("create /x", io()));
        assert_eq!(one_line(&own), "create /x: gone");
        let added = Err::<(), _>(io()).context("cannot start").unwrap_err();
        assert_eq!(one_line(&added), "cannot start: gone");
    }
}
