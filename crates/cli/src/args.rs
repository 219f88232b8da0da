//! The command line: every command's flags (clap derive) and the parsers that check their values,
//! so that a bad value is a usage error (exit 2) before anything starts.
//!
//! The flags' doc comments are `--help` text, not Markdown: `HOST[:PORT]` is no link.
#![allow(rustdoc::broken_intra_doc_links)]

use crate::exit;
use clap::{Args, Parser, Subcommand};
use hurtle_engine::send::Transport;
use hurtle_engine::{PathMemories, SendOptions, WriteQueue};
use hurtle_proto::RateMode;
use std::path::PathBuf;

mod filters;
pub use filters::FilterArgs;

// Addresses, their default ports, and the checks of channel counts, chunk sizes, rates and
// sizes are the library's, so that the command and the API accept the same values with the
// same errors.
pub use hurtle::api::values::{
    parse_channels, parse_chunk_size, parse_rate, parse_size, HostPort, RECEIVER_PORT, RELAY_PORT,
};

/// Fast, verified file transfer over long, fat, lossy networks.
#[derive(Parser)]
#[command(name = "hurtle", version, after_help = exit::TABLE)]
#[command(about = "Fast, verified file transfer over long, fat, lossy networks.")]
pub struct Cli {
    /// When to color errors and warnings: auto (on a terminal, unless NO_COLOR is set), always,
    /// never.
    #[arg(long, value_enum, default_value = "auto", global = true)]
    pub color: ColorArg,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Receive one transfer (or, with --serve, transfers until interrupted).
    #[command(after_help = exit::TABLE)]
    Receive(ReceiveArgs),
    /// Send files and directories to a receiver.
    #[command(after_help = exit::TABLE)]
    Send(SendArgs),
    /// Copy to or from a host you reach with ssh (scp's operands): ssh starts hurtle there.
    #[command(after_help = cp_after_help(),
              override_usage = "hurtle cp [OPTIONS] SRC... [user@]host:DEST\n       hurtle cp [OPTIONS] [user@]host:SRC... DEST")]
    Cp(CpArgs),
    /// Send a file of random bytes to a receiver on this machine and compare with plain TCP.
    Demo(DemoArgs),
    /// Run a rendezvous/relay server that pairs senders with receivers by a code.
    Relay(RelayArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(CompletionsArgs),
    /// Write manual pages (hurtle.1 and one per command) into a directory, or hurtle.1 on stdout.
    Man(ManArgs),
    /// Make a new key (for a receiver that serves several transfers: `receive --keys`, and
    /// `send --key`).
    Keygen(KeygenArgs),
    /// The far side of `hurtle cp`, started over ssh (not for people).
    #[command(hide = true, name = "ssh-serve")]
    SshServe(SshServeArgs),
}

impl Command {
    /// The output flags of a command that has them (`send`, `receive`, `cp`, `demo`).
    pub fn output(&self) -> Option<&OutputArgs> {
        match self {
            Command::Receive(a) => Some(&a.output),
            Command::Send(a) => Some(&a.output),
            Command::Cp(a) => Some(&a.output),
            Command::Demo(a) => Some(&a.output),
            _ => None,
        }
    }
}

/// `hurtle keygen`.
#[derive(Args)]
pub struct KeygenArgs {
    /// Write the key into this file (created readable by its owner only) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Make an identity key (Ed25519: `receive --identity`, `send --identity`) instead of a
    /// shared key: the private key goes into --out, its public key and fingerprint are printed
    /// (the public key line goes into a receiver's --authorized file).
    #[arg(long, requires = "out")]
    pub identity: bool,
}

/// `--color`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorArg {
    /// On a terminal, unless `NO_COLOR` is set to something.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Output flags shared by every transfer command.
#[derive(Args, Clone)]
pub struct OutputArgs {
    /// Print one JSON summary object on stdout at the end.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print more detail (warnings, counters, the first 10 files' BLAKE3); -vv: every file's.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Write one network log per channel into this directory.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

/// `--transport`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TransportArg {
    /// UDP, moving to parallel TCP in the same session when nothing gets through.
    Auto,
    /// UDP only.
    Udp,
    /// Parallel TCP connections.
    Tcp,
}

impl From<TransportArg> for Transport {
    fn from(t: TransportArg) -> Self {
        match t {
            TransportArg::Auto => Transport::Auto,
            TransportArg::Udp => Transport::Udp,
            TransportArg::Tcp => Transport::Tcp,
        }
    }
}

/// Rate flags shared by `send` and `demo`.
#[derive(Args, Clone)]
pub struct RateArgs {
    /// Highest rate: bits per second as 800M, 800Mbit/s or 800Mbps, or bytes per second as
    /// 100MB/s or 100MiB/s (100MB means 100MB/s); automatic rate control never exceeds it
    /// [env: HURTLE_RATE] [default: only the receiver's measured ceiling]
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Pace at exactly this rate (the forms of --rate) and ignore feedback (for benchmarks and
    /// links you own)
    #[arg(long, value_parser = parse_rate, conflicts_with_all = ["rate", "fair"])]
    pub rate_fixed: Option<u64>,
    /// Yield to competing traffic on a shared bottleneck (delay-based back-off)
    #[arg(long)]
    pub fair: bool,
    /// Start as on a path never seen: neither use nor keep what the last transfer to the same
    /// receiver learnt of the path (by default its bottleneck is kept in
    /// ~/.cache/hurtle/paths and the next transfer starts at half of it) [env:
    /// HURTLE_PATH_MEMORY: `off`, or the file to keep them in]
    #[arg(long)]
    pub cold_start: bool,
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
        if !self.cold_start {
            opts.path_memory = path_memories();
        }
    }
}

/// Where path memories are kept: `HURTLE_PATH_MEMORY` (a file, or `off` for nowhere), else
/// the cache directory's `hurtle/paths`.
fn path_memories() -> Option<PathMemories> {
    match std::env::var_os("HURTLE_PATH_MEMORY") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathMemories::at(v)),
        _ => PathMemories::default_file().map(PathMemories::at),
    }
}

/// `hurtle receive`.
#[derive(Args)]
pub struct ReceiveArgs {
    /// Address to listen on for the control connection, HOST[:PORT] (UDP ports are chosen per
    /// transfer) [default: 0.0.0.0:7400, or 0.0.0.0:0 with --relay]
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_listen)]
    pub listen: Option<HostPort>,
    /// Register with this relay and print a code for the sender; without a value, the relay of
    /// HURTLE_RELAY or the configuration file.
    #[arg(long, value_name = "HOST[:PORT]", num_args = 0..=1, default_missing_value = "",
          conflicts_with = "serve")]
    pub relay: Option<String>,
    /// Directory to receive into (created if missing) [env: HURTLE_OUT] [default: .]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep receiving transfers until interrupted.
    #[arg(long)]
    pub serve: bool,
    /// Replace files that already exist.
    #[arg(long)]
    pub overwrite: bool,
    /// Let a sender's --delete delete what it does not send, inside the directories it sends
    /// (never what its --exclude leaves out, never through a symlink); without it such a
    /// transfer is refused before anything is written (exit 3).
    #[arg(long)]
    pub allow_delete: bool,
    /// Memory for gathering blocks that are still incomplete, across all channels (K/M/G,
    /// binary); on a disk, up to a quarter as much again queues complete blocks for the writer
    /// thread. When it runs out, the oldest incomplete block is written to the file as it is
    /// and the rest of it as it arrives; every channel keeps at least 4 blocks' worth.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub buffer_memory: u64,
    /// The code the sender must give (default: a new one, printed; not with --keys alone);
    /// with --relay, the code a sender printed [env: HURTLE_CODE]
    #[arg(long)]
    pub code: Option<String>,
    /// The code a sender printed (`hurtle send FILES` through a relay): found through the
    /// relay (--relay, HURTLE_RELAY or the configuration file's), and received from.
    #[arg(value_name = "CODE", conflicts_with_all = ["code", "serve", "keys"])]
    pub sender_code: Option<String>,
    /// Accept senders holding one of the keys in this file (one `hurtle-key-...` per line,
    /// optionally followed by a name for the log; made by `hurtle keygen`). For --serve.
    #[arg(long, value_name = "FILE", conflicts_with = "relay")]
    pub keys: Option<PathBuf>,
    /// This receiver's identity key (`hurtle keygen --identity`), which it proves to senders
    /// with an identity key of theirs (they pin it on first use). For --authorized.
    #[arg(long, value_name = "FILE", conflicts_with = "relay")]
    pub identity: Option<PathBuf>,
    /// Accept senders whose identity keys are in this file, without any shared secret (one
    /// public `hurtle-id-...` per line, optionally followed by a name for the log).
    #[arg(
        long,
        value_name = "FILE",
        requires = "identity",
        conflicts_with = "relay"
    )]
    pub authorized: Option<PathBuf>,
    /// Agree to send data unencrypted, if the sender asks too (control messages stay
    /// encrypted and authenticated; data datagrams carry no tag). For links you own.
    #[arg(long)]
    pub no_encryption: bool,
    /// Who writes complete blocks: `auto` (a writer thread on a disk, the channel threads on
    /// tmpfs), `always` the writer thread, `never`. For tests and comparisons.
    #[arg(long, hide = true, value_enum, default_value = "auto")]
    pub write_queue: WriteQueueArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--write-queue`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum WriteQueueArg {
    /// A writer thread on a disk, the channel threads on tmpfs.
    Auto,
    /// Always the writer thread.
    Always,
    /// Never.
    Never,
}

impl From<WriteQueueArg> for WriteQueue {
    fn from(w: WriteQueueArg) -> Self {
        match w {
            WriteQueueArg::Auto => WriteQueue::Auto,
            WriteQueueArg::Always => WriteQueue::Always,
            WriteQueueArg::Never => WriteQueue::Never,
        }
    }
}

/// `hurtle send`.
#[derive(Args)]
pub struct SendArgs {
    /// Files and directories to send (directories recursively); `-` alone: standard input,
    /// sent as one file named by --name.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The name what `send -` reads from standard input is sent under.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The receiver's address, HOST[:PORT] (port 7400 when not given). Without --to and
    /// --code, the code is printed here, through the relay, for the receiver to type.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_to)]
    pub to: Option<HostPort>,
    /// The code the receiver printed; without --to, the receiver is found through a relay
    /// [env: HURTLE_CODE]
    #[arg(long)]
    pub code: Option<String>,
    /// Seconds to wait for a receiver that has not started yet: with --to, while nothing
    /// listens there; with --code and a relay, while the code is not registered (0: fail at
    /// once) [env: HURTLE_WAIT] [default: 60]
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// A key file the receiver accepts (`hurtle keygen`), instead of a code.
    #[arg(long, value_name = "FILE", conflicts_with = "code")]
    pub key: Option<PathBuf>,
    /// This sender's identity key (`hurtle keygen --identity`), which a receiver lists in its
    /// --authorized file, instead of a code or key. The receiver's identity is pinned on first
    /// use in the known-receivers file, and a later change is refused.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["code", "key"])]
    pub identity: Option<PathBuf>,
    /// The known-receivers file where --identity pins receivers (default:
    /// $XDG_CONFIG_HOME/hurtle/known_receivers, else ~/.config/hurtle/known_receivers)
    /// [env: HURTLE_KNOWN_RECEIVERS]
    #[arg(long, value_name = "FILE", requires = "identity")]
    pub known_receivers: Option<PathBuf>,
    /// Ask to send data unencrypted; done only if the receiver agrees with its own
    /// --no-encryption (control messages stay encrypted and authenticated; data datagrams
    /// carry no tag, every block is still checked by BLAKE3).
    #[arg(long)]
    pub no_encryption: bool,
    /// The relay, HOST[:PORT]: the one the receiver registered with (with --code), or the one
    /// to print a code through (without --code) [env: HURTLE_RELAY] [default: the
    /// configuration file's relay]
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_relay_target,
          conflicts_with = "to")]
    pub relay: Option<HostPort>,
    /// Never connect directly: go through the relay (for tests).
    #[arg(long, hide = true, conflicts_with = "to")]
    pub relay_only: bool,
    #[command(flatten)]
    pub flags: SendFlags,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `hurtle cp --help` shows after the flags (then the exit codes): the operands and the
/// directory rule.
pub const CP_NOTES: &str = "\
Operands:
  An operand is remote when it has a ':' before its first '/', as in scp: [user@]host:path or
  [user@][v6addr]:path; './a:b' is local. Exactly one side is remote. A remote path is relative
  to the far user's home directory ('host:' is the home directory itself).

Directories (rsync's trailing-slash rule):
  SRC/  (with a trailing slash) copies what is in SRC into DEST;
  SRC   copies the directory itself, as DEST/SRC.
  DEST is always a directory, created if it is missing: cp a.iso host:b makes b/a.iso.";

fn cp_after_help() -> String {
    format!("{CP_NOTES}\n\n{}", exit::TABLE)
}

/// Transfer flags of the sending side, shared by `hurtle cp` and the far side it starts (which
/// gets them back as flags when it is the sender).
#[derive(Args, Clone)]
pub struct SendFlags {
    /// Number of UDP data channels, or TCP connections with --transport tcp, 1 to 32
    /// [env: HURTLE_CHANNELS] [default: one per core, 2 to 8]
    #[arg(long, visible_alias = "connections", value_parser = parse_channels)]
    pub channels: Option<u16>,
    /// How data moves: udp, tcp (N parallel TCP connections), or auto (UDP, moving to parallel
    /// TCP in the same session when nothing gets through, about 0.3 s after data starts).
    #[arg(long, value_enum, default_value = "auto")]
    pub transport: TransportArg,
    /// Chunk size: the unit of striping, hashing and verification (a power of two, 1K to 64M).
    #[arg(long, value_parser = parse_chunk_size, default_value = "1M")]
    pub chunk_size: u64,
    #[command(flatten)]
    pub rate: RateArgs,
    /// Largest datagram payload to try, in bytes (512 to 8900). The handshake lowers it to what
    /// the path carries: 1396 on a 1500-byte path, more with jumbo frames or on loopback.
    #[arg(long, default_value_t = hurtle_proto::wire::MAX_PAYLOAD, value_parser = clap::value_parser!(u16).range(i64::from(hurtle_proto::wire::MIN_PAYLOAD)..=i64::from(hurtle_proto::wire::MAX_PAYLOAD)))]
    pub payload: u16,
    /// Send what symbolic links inside a directory point at, as rsync -L does, instead of
    /// the links themselves (a dangling one is skipped with a warning). By default they are
    /// sent as links, and the receiver creates those that stay inside its destination. A link
    /// named as an argument is followed (not one inside cp's SRC/, which goes as a link).
    #[arg(short = 'L', long = "copy-links", visible_alias = "follow-symlinks")]
    pub follow_symlinks: bool,
    /// Skip a file the receiver already has only if its BLAKE3 matches (both sides read it);
    /// by default a file of the same size and modification time is skipped unread, as rsync
    /// does.
    #[arg(long)]
    pub checksum: bool,
    /// Send the holes of sparse files as data (by default they are found with SEEK_HOLE and
    /// not sent, and stay holes on the receiver).
    #[arg(long)]
    pub no_sparse: bool,
    /// Send no parity for the tail of each channel's data. By default the last round trip of
    /// new data goes with Reed-Solomon parity (a few percent of it), so that a datagram lost
    /// there is rebuilt by the receiver instead of being sent again a round trip later.
    #[arg(long)]
    pub no_fec: bool,
    /// Show what would be sent, skipped and (with --delete) deleted, and move nothing: the
    /// receiver decides as for a transfer and creates nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Mirror: the receiver deletes what is not sent inside the directories sent (as rsync -r
    /// --delete), keeping what --exclude leaves out, once every file is in place; it must
    /// allow it (receive --allow-delete), or nothing moves (exit 3).
    #[arg(long)]
    pub delete: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

impl SendFlags {
    /// The engine's options these flags ask for (`log_dir` from the output flags).
    pub fn options(&self, log_dir: Option<PathBuf>) -> SendOptions {
        let mut opts = SendOptions {
            payload: self.payload,
            follow_symlinks: self.follow_symlinks,
            filter: self.filter.filter.clone(),
            checksum: self.checksum,
            no_sparse: self.no_sparse,
            log_dir,
            block_size: self.chunk_size,
            transport: self.transport.into(),
            fec: !self.no_fec,
            dry_run: self.dry_run,
            delete: self.delete,
            ..SendOptions::default()
        };
        if let Some(c) = self.channels {
            opts.channels = c;
        }
        self.rate.apply(&mut opts);
        opts
    }

    /// The flags again, as arguments for the far side's `ssh-serve send`.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(c) = self.channels {
            v.extend(["--channels".into(), c.to_string()]);
        }
        let transport = clap::ValueEnum::to_possible_value(&self.transport)
            .map(|p| p.get_name().to_string())
            .unwrap_or_else(|| "auto".into());
        v.extend(["--transport".into(), transport]);
        v.extend(["--chunk-size".into(), self.chunk_size.to_string()]);
        v.extend(["--payload".into(), self.payload.to_string()]);
        if let Some(r) = self.rate.rate {
            v.extend(["--rate".into(), r.to_string()]);
        }
        if let Some(r) = self.rate.rate_fixed {
            v.extend(["--rate-fixed".into(), r.to_string()]);
        }
        for (on, flag) in [
            (self.rate.fair, "--fair"),
            (self.rate.cold_start, "--cold-start"),
            (self.follow_symlinks, "--copy-links"),
            (self.checksum, "--checksum"),
            (self.no_sparse, "--no-sparse"),
            (self.no_fec, "--no-fec"),
            (self.dry_run, "--dry-run"),
            (self.delete, "--delete"),
        ] {
            if on {
                v.push(flag.into());
            }
        }
        v.extend(self.filter.to_args());
        v
    }
}

/// `hurtle cp`.
#[derive(Args)]
pub struct CpArgs {
    /// SRC... DEST: local paths and [user@]host:path operands, exactly one side remote.
    #[arg(required = true, value_name = "SRC... DEST")]
    pub operands: Vec<String>,
    /// The ssh command to run, split like a shell would (e.g. 'ssh -p 2222 -i key').
    #[arg(short = 'e', long = "ssh", value_name = "CMD", default_value = "ssh")]
    pub ssh: String,
    /// The ssh port (passed to ssh as -p PORT).
    #[arg(short = 'P', long, value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// The hurtle binary on the far side: a command on its PATH, or a path.
    #[arg(long, value_name = "PATH", default_value = "hurtle")]
    pub remote_hurtle: String,
    /// Replace files that already exist at the destination.
    #[arg(long)]
    pub overwrite: bool,
    /// Carry the data through the ssh channel itself, without trying a direct port first
    /// (slow: for a firewall that lets only ssh through; without it, this is the fallback).
    #[arg(long)]
    pub via_ssh: bool,
    /// Accepted for scp's habit: directories are always copied recursively.
    #[arg(short = 'r', hide = true)]
    pub recursive: bool,
    #[command(flatten)]
    pub send: SendFlags,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `hurtle ssh-serve`: the far side of `hurtle cp`.
#[derive(Args)]
pub struct SshServeArgs {
    /// Which side this host is.
    #[command(subcommand)]
    pub side: SshServeSide,
}

/// The far side's role.
#[derive(Subcommand)]
pub enum SshServeSide {
    /// Receive one transfer (a push): print the port and secret, serve one session.
    Receive {
        /// Directory to receive into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Replace files that already exist.
        #[arg(long)]
        overwrite: bool,
        /// Let the sender's --delete delete what it does not send.
        #[arg(long)]
        allow_delete: bool,
        /// The near side asks for a dry run: the destination is not created.
        #[arg(long)]
        dry_run: bool,
    },
    /// Send (a pull): read the port and secret from stdin, dial back, send.
    Send {
        /// Files and directories to send (rsync's trailing-slash rule).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        flags: SendFlags,
    },
}

/// `hurtle demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Size of the random file, with K/M/G suffixes (binary).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    /// Number of UDP data channels, 1 to 32 [default: one per core, 2 to 8].
    #[arg(long, value_parser = parse_channels)]
    pub channels: Option<u16>,
    #[command(flatten)]
    pub rate: RateArgs,
    /// Skip the plain-TCP comparison.
    #[arg(long)]
    pub no_tcp: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `hurtle relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// Address to listen on, HOST[:PORT].
    #[arg(long, value_name = "HOST[:PORT]", default_value = "0.0.0.0:7401", value_parser = parse_relay)]
    pub listen: HostPort,
    /// Seconds a code can be looked up.
    #[arg(long, value_name = "SECS", default_value_t = 600.0, value_parser = parse_secs)]
    pub code_ttl: f64,
    /// Seconds of silence after which a client is disconnected.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = parse_secs)]
    pub idle_timeout: f64,
    /// Lookups one client IP may make at once.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub lookup_burst: u32,
    /// Lookups per second one client IP may make on average.
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = parse_secs)]
    pub lookup_per_sec: f64,
    /// Most connections served at once.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = parse_count)]
    pub max_connections: usize,
    /// Most codes registered at once.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = parse_count)]
    pub max_codes: usize,
    /// Most UDP allocations held at once (one per channel of a session whose UDP goes through
    /// the relay).
    #[arg(long, value_name = "N", default_value_t = 16_384, value_parser = parse_count)]
    pub max_allocations: usize,
    #[command(flatten)]
    pub limits: crate::cmd::relay::LimitArgs,
    /// Serve counters in the Prometheus text format at this address (default: nowhere).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub metrics: Option<HostPort>,
}

/// `hurtle completions`.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `hurtle man`.
#[derive(Args)]
pub struct ManArgs {
    /// Write hurtle.1 and hurtle-COMMAND.1 into this directory instead of hurtle.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

fn parse_to(s: &str) -> Result<HostPort, String> {
    HostPort::parse(s, RECEIVER_PORT, false)
}

fn parse_listen(s: &str) -> Result<HostPort, String> {
    HostPort::parse(s, RECEIVER_PORT, true)
}

fn parse_relay(s: &str) -> Result<HostPort, String> {
    HostPort::parse(s, RELAY_PORT, true)
}

/// A relay address for connecting: `HOST[:PORT]`, port 7401 when not given.
pub fn parse_relay_target(s: &str) -> Result<HostPort, String> {
    HostPort::parse(s, RELAY_PORT, false)
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?}: expected a positive number")),
    }
}

fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?}: expected a whole number of at least 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn rates_mean_bits_or_bytes_as_written() {
        const MIB: u64 = 1 << 20;
        for (form, bps) in [
            ("1000", 1000),
            ("250k", 250_000),
            ("250K", 250_000),
            ("800M", 800_000_000),
            ("800m", 800_000_000),
            ("800Mbit", 800_000_000),
            ("800Mbits", 800_000_000),
            ("800Mbit/s", 800_000_000),
            ("800Mbits/s", 800_000_000),
            ("800Mbps", 800_000_000),
            ("800 Mbit/s", 800_000_000),
            (" 800M ", 800_000_000),
            ("1.5G", 1_500_000_000),
            ("1.5Gbit", 1_500_000_000),
            ("1.5gbps", 1_500_000_000),
            ("2T", 2_000_000_000_000),
            ("100MB/s", 800_000_000),
            ("100MB", 800_000_000),
            ("100MiB/s", 100 * MIB * 8),
            ("100MiB", 100 * MIB * 8),
            ("100miB/s", 100 * MIB * 8),
            ("1.5GB/s", 12_000_000_000),
            ("512KiB/s", 512 * 1024 * 8),
            ("125B/s", 1000),
            ("125B", 1000),
        ] {
            assert_eq!(parse_rate(form), Ok(bps), "{form:?}");
        }
        assert_eq!(parse_rate("100MiB/s"), Ok(838_860_800));
        for form in [
            "",
            "fast",
            "M",
            "-5M",
            "5X",
            "1.5.3G",
            "0.1",
            "0",
            "0M",
            "nanM",
            "infG",
            "100Mb",
            "100mb",
            "100Mb/s",
            "100MBps",
            "100Mi",
            "100Mibit/s",
            "100Mib",
            "100MB/h",
            "100MB/min",
            "100Mbit/h",
            "100Mbyte",
            "100 megabits",
            "100MBs",
            "100M/s",
            "1e3M",
            "99999999999T",
        ] {
            let e = parse_rate(form).expect_err(form);
            assert!(
                e.contains("accepted: bits per second: 800M"),
                "{form:?}: {e}"
            );
        }
        assert!(parse_rate("100Mb").unwrap_err().contains("ambiguous"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert!(parse_size("99999999T").is_err(), "beyond u64");
    }

    #[test]
    fn addresses_take_a_default_port() {
        let hp = |h: &str, p| HostPort {
            host: h.into(),
            port: p,
        };
        assert_eq!(parse_to("example.org"), Ok(hp("example.org", 7400)));
        assert_eq!(parse_to("example.org:9"), Ok(hp("example.org", 9)));
        assert_eq!(parse_to("10.0.0.1"), Ok(hp("10.0.0.1", 7400)));
        assert_eq!(parse_to("[::1]:80"), Ok(hp("::1", 80)));
        assert_eq!(parse_to("[::1]"), Ok(hp("::1", 7400)));
        assert_eq!(parse_to("::1"), Ok(hp("::1", 7400)));
        assert_eq!(parse_relay_target("r.example"), Ok(hp("r.example", 7401)));
        assert_eq!(parse_listen("0.0.0.0:0"), Ok(hp("0.0.0.0", 0)));
        assert_eq!(hp("::1", 80).to_string(), "[::1]:80");
        for bad in [
            "",
            ":7400",
            "host:",
            "host:port",
            "host:70000",
            "host:0",
            "[::1",
            "[::1]x",
        ] {
            assert!(parse_to(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn counts_out_of_range_are_refused() {
        assert_eq!(parse_channels("4"), Ok(4));
        assert_eq!(parse_channels("32"), Ok(32));
        for bad in ["0", "33", "100", "-1", "x"] {
            assert!(parse_channels(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_chunk_size("64K"), Ok(64 << 10));
        assert!(parse_chunk_size("3K").is_err());
        assert!(parse_chunk_size("128M").is_err());
    }
}
