//! `hurtle cp`: copy to or from a host reached with ssh, which starts hurtle on the far side
//! (`hurtle ssh-serve`, hidden), as scp and rsync do.
//!
//! **Push** (`cp SRC... [user@]host:DEST`): this side runs
//! `ssh [opts] [user@]host HURTLE ssh-serve receive --out DEST`. The far side binds a one-shot
//! receiver on an ephemeral port on all its addresses, prints one line on stdout,
//! `HURTLE-SSH <PROTOCOL> <port> <secret>`, and waits for one line on its stdin. This side
//! reads the far line, checks the protocol, and tries to connect to the host ssh connected to
//! (its name as `ssh -G` resolves it, then resolved here) at that port, within
//! [`DIRECT_TRY`]. Connected, it writes `direct` and sends over that connection (and the data
//! paths the session finds, UDP or parallel TCP); refused or unanswered (or `--via-ssh`), it
//! writes `ssh`, and both processes turn the ssh channel into a [`Mux`]: this side dials
//! every connection of the session through it, the far side connects each to its own
//! receiver on loopback.
//!
//! **Pull** (`cp [user@]host:SRC... DEST`): this side binds a one-shot receiver on an ephemeral
//! port, runs `ssh ... HURTLE ssh-serve send [flags] -- SRC...`, reads the far side's
//! `HURTLE-SSH <PROTOCOL> ready`, and writes `<port> <secret> <auto|ssh>` to its stdin (never on
//! a command line). The far side tries to dial back to the address ssh saw this side at (the
//! first field of `SSH_CONNECTION`) within [`DIRECT_TRY`] and says which path it takes:
//! `HURTLE-SSH <PROTOCOL> direct`, or `HURTLE-SSH <PROTOCOL> ssh <why>` after which its stdout
//! and stdin are the [`Mux`] (it dials, this side connects each stream to its receiver on
//! loopback).
//!
//! **The retry.** A direct session can get its control connection through and still fail in
//! its data path (UDP blocked and the receiver's TCP data ports too: a firewall that lets only
//! ssh and the control port through). When the sender's session fails so, before any file
//! data reached the receiver ([`retry_reason`]), the transfer is retried once through the ssh
//! channel, by the same two processes, to the same receiver, with the same secret (it never
//! left the ssh channel). Push: the near sender writes `ssh` (else `end`) after its failed
//! session; the far side, whose thread reading stdin ([`Watch`]) takes the word, answers
//! `HURTLE-SSH <PROTOCOL> ssh` and its stdout and stdin become the mux, whose connections wait
//! at the receiver's door until its failed session has ended (within its 10 s wait for TCP
//! data connections). Pull: the far sender says `HURTLE-SSH <PROTOCOL> ssh <why>` and waits;
//! the near side writes `ssh` and both become the mux, and its receiver's next session is the
//! retry. A far side whose direct session failed waits for that word (at most
//! [`VERDICT_WAIT`]); `end`, EOF or no word ends it with its own session's exit code.
//!
//! Through the ssh channel the session is parallel TCP inside one TCP connection and ssh's
//! own flow control: slow, and the summary says so (`path: through the ssh channel`,
//! `"path": "ssh"`).
//!
//! The far process never outlives the session: a thread reads its stdin (the ssh channel; the
//! mux's reader when it carries the session) and, at EOF, ends the session as a signal would
//! (`interrupt::hang_up`), unless the direct session is over and waits for the near side's
//! word on a retry (EOF is `end` then).
//!
//! The secret is 32 random bytes in hex, made by whichever side listens and carried over the ssh
//! channel, which ssh authenticates and encrypts. [`send_options`] and [`receive_options`] hand
//! it to the engine's key agreement as a key: the session is authenticated and its data
//! encrypted as any other, with no code to type.
//!
//! Directories follow rsync's trailing-slash rule ([`expand_sources`]); DEST is always a
//! directory.

use crate::args::{parse_channels, parse_rate, CpArgs, HostPort, SendFlags, SshServeArgs};
use crate::args::{OutputArgs, SshServeSide};
use crate::cmd::receive::check_out;
use crate::cmd::{resolve, session_failure};
use crate::config::Defaults;
use crate::exit::{self, Failure, Outcome};
use crate::sshmux::{Accept, Mux};
use crate::ui::PathInfo;
use crate::{interrupt, ui};
use hurtle_engine::net::dial::Dialer;
use hurtle_engine::{OwnPorts, Progress, ReceiveOptions, Receiver, SendOptions, SessionError};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The version of the conversation over ssh (the banner line, the port/secret line, the path
/// lines, and the mux's frames). The session itself has its own version, checked in its hello.
/// 2: the path lines (`direct`, `ssh`) and the mux. 3: after a direct session whose data could
/// not get through, the retry through the ssh channel (the near side's `ssh` or `end`, the far
/// side's `ssh` line).
pub const PROTOCOL: u32 = 3;
/// How long a direct connection to the other side's port may take (refused at once, or no
/// answer: a firewall that drops) before the ssh channel carries the session instead.
pub const DIRECT_TRY: Duration = Duration::from_secs(3);
/// How long the far side waits, after its direct session failed, for the near side to say
/// whether the transfer is retried through the ssh channel (it says so as soon as its own
/// session has ended).
const VERDICT_WAIT: Duration = Duration::from_secs(30);
/// How long a pull whose direct session failed here waits for the far sender's word that its
/// data path failed (then the transfer is retried through the ssh channel).
const RETRY_WORD_WAIT: Duration = Duration::from_secs(2);
/// How long a far side whose session went through the mux waits for its last frames to cross.
const MUX_DRAIN: Duration = Duration::from_secs(5);
/// The first word of the far side's line.
pub const BANNER: &str = "HURTLE-SSH";
/// How long the far side may take to say it is ready (ssh's connection and authentication
/// included: a password typed at ssh's prompt must fit in it).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long ssh may take to end once the session is over or its stdin is closed.
const FAR_EXIT_WAIT: Duration = Duration::from_secs(10);
/// Lines of ssh's stderr kept for the error message (all of it is shown as it comes).
const STDERR_TAIL: usize = 20;

// ---------------------------------------------------------------------------------------------
// Operands
// ---------------------------------------------------------------------------------------------

/// One operand of `hurtle cp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// A path on this host.
    Local(String),
    /// `[user@]host:path`.
    Remote(Remote),
}

/// A remote operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The user, when given.
    pub user: Option<String>,
    /// The host (an IPv6 address without its brackets).
    pub host: String,
    /// The path on the far host (`.` for `host:`), relative to the far user's home.
    pub path: String,
}

impl Remote {
    /// What ssh is given: `user@host` or `host`.
    fn destination(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }
}

/// Parses an operand as scp does: remote when a `:` comes before the first `/` (brackets
/// around an IPv6 address hide its colons), so `./a:b` is local and so is `:x`.
pub fn parse_operand(s: &str) -> Result<Operand, String> {
    let local = || Ok(Operand::Local(s.to_string()));
    // Where the host starts: after `user@`, when the `@` comes before any `:` or `/`.
    let host_start = match s.find(['@', ':', '/']) {
        Some(at) if s.as_bytes()[at] == b'@' => at + 1,
        _ => 0,
    };
    let (host, path) = if s[host_start..].starts_with('[') {
        let Some(close) = s[host_start..].find(']') else {
            return local();
        };
        let after = host_start + close + 1;
        match s[after..].strip_prefix(':') {
            Some(path) => (&s[host_start + 1..host_start + close], path),
            None => return local(),
        }
    } else {
        match s.find([':', '/']) {
            Some(i) if s.as_bytes()[i] == b':' && i > 0 => (&s[host_start..i], &s[i + 1..]),
            _ => return local(),
        }
    };
    let user = (host_start > 0).then(|| s[..host_start - 1].to_string());
    if let Some(u) = &user {
        if u.is_empty() || u.starts_with('-') || u.contains(char::is_whitespace) {
            return Err(format!("{s:?}: {u:?} is not a user name"));
        }
    }
    if host.is_empty() {
        return Err(format!("{s:?}: no host before the ':'"));
    }
    if host.starts_with('-') || host.contains(char::is_whitespace) || host.contains('@') {
        return Err(format!("{s:?}: {host:?} is not a host name"));
    }
    Ok(Operand::Remote(Remote {
        user,
        host: host.to_string(),
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
    }))
}

/// What a `hurtle cp` does.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Local sources to a remote directory.
    Push { sources: Vec<String>, dest: Remote },
    /// Remote sources (one host) to a local directory.
    Pull { sources: Vec<Remote>, dest: String },
}

fn plan(operands: &[String]) -> Result<Plan, Failure> {
    let parsed = operands
        .iter()
        .map(|o| parse_operand(o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::usage)?;
    let Some((dest, sources)) = parsed.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(Failure::usage(
            "hurtle cp needs SRC... DEST: at least two operands",
        ));
    };
    let remote_sources: Vec<&Remote> = sources
        .iter()
        .filter_map(|s| match s {
            Operand::Remote(r) => Some(r),
            Operand::Local(_) => None,
        })
        .collect();
    match dest {
        Operand::Remote(dest) => {
            if !remote_sources.is_empty() {
                return Err(Failure::usage(
                    "hurtle cp copies between this host and one other: a remote SRC and a \
                     remote DEST (remote to remote) is not supported; copy to one of them first",
                ));
            }
            let sources = sources
                .iter()
                .filter_map(|s| match s {
                    Operand::Local(l) => Some(l.clone()),
                    Operand::Remote(_) => None,
                })
                .collect();
            Ok(Plan::Push {
                sources,
                dest: dest.clone(),
            })
        }
        Operand::Local(dest) => {
            if remote_sources.is_empty() {
                return Err(Failure::usage(
                    "hurtle cp copies between this host and another over ssh, and no operand is \
                     remote (HOST:PATH); for a local copy use cp -r or rsync",
                ));
            }
            if remote_sources.len() != sources.len() {
                return Err(Failure::usage(
                    "hurtle cp: the sources are either all local (a push) or all on one remote \
                     host (a pull), not both",
                ));
            }
            let first = remote_sources[0];
            if let Some(other) = remote_sources
                .iter()
                .find(|r| r.host != first.host || r.user != first.user)
            {
                return Err(Failure::usage(format!(
                    "hurtle cp: all remote sources must be on one host (given {} and {})",
                    first.destination(),
                    other.destination()
                )));
            }
            Ok(Plan::Pull {
                sources: remote_sources.into_iter().cloned().collect(),
                dest: dest.clone(),
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Directories: rsync's trailing-slash rule
// ---------------------------------------------------------------------------------------------

/// The sender's paths under rsync's rule: `SRC/` (a directory named with a trailing slash)
/// stands for what is in it, each entry sent under its own name (sorted, symbolic links among
/// them skipped with a warning unless `follow_symlinks`); any other path is sent as itself, a
/// directory with everything below it. A path that does not exist is a storage failure
/// (exit 6) before anything starts.
pub fn expand_sources(
    paths: &[PathBuf],
    follow_symlinks: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<PathBuf>, Failure> {
    let storage = |what: String| Failure::new(exit::STORAGE, anyhow::anyhow!(what));
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p);
        if meta.is_err() && std::fs::symlink_metadata(p).is_err() {
            return Err(storage(format!(
                "no such file or directory: {}",
                p.display()
            )));
        }
        let contents = p.as_os_str().as_bytes().ends_with(b"/");
        if !(contents && meta.is_ok_and(|m| m.is_dir())) {
            out.push(p.clone());
            continue;
        }
        let mut entries = std::fs::read_dir(p)
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .map_err(|e| storage(format!("cannot read {}: {e}", p.display())))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = p.join(e.file_name());
            if !follow_symlinks && e.file_type().is_ok_and(|t| t.is_symlink()) {
                warnings.push(format!(
                    "skipping symbolic link {} (--follow-symlinks follows it)",
                    path.display()
                ));
                continue;
            }
            out.push(path);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The engine's options (where the session secret is handed over)
// ---------------------------------------------------------------------------------------------

/// The secret of one `hurtle cp` session: 32 random bytes, written in hex on the wire (the
/// far side's stdout for a push, its stdin for a pull). The bytes are what a key agreement
/// takes as a key.
#[derive(Clone)]
pub struct Secret(pub [u8; 32]);

impl Secret {
    fn new() -> Secret {
        Secret(rand::random())
    }

    fn parse(s: &str) -> Option<Secret> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Secret(bytes))
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The sender's options from the flags, for either side.
fn send_options(flags: &SendFlags, log_dir: Option<PathBuf>, secret: &Secret) -> SendOptions {
    // The session's secret came over the authenticated ssh channel: the key agreement uses it
    // as a key (no code to type, and only the two ends of this ssh session hold it).
    SendOptions {
        secret: Some(hurtle_proto::secure::Secret::key(secret.0)),
        ..flags.options(log_dir)
    }
}

/// The receiver's options, for either side.
fn receive_options(
    out: &Path,
    overwrite: bool,
    log_dir: Option<PathBuf>,
    secret: &Secret,
) -> ReceiveOptions {
    // The session's secret, as in `send_options`.
    let keys = hurtle_engine::Keyring::default();
    keys.add("ssh", hurtle_proto::secure::Secret::key(secret.0));
    ReceiveOptions {
        keys,
        out_dir: out.to_path_buf(),
        overwrite,
        log_dir,
        ..ReceiveOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// ssh
// ---------------------------------------------------------------------------------------------

/// How to run ssh to the far host.
struct Ssh {
    program: String,
    args: Vec<String>,
    /// `user@host` or `host`.
    destination: String,
    /// The host as given.
    host: String,
}

impl Ssh {
    fn new(cmd: &str, port: Option<u16>, remote: &Remote) -> Result<Ssh, Failure> {
        let words = shlex::split(cmd)
            .filter(|w| !w.is_empty())
            .ok_or_else(|| Failure::usage(format!("--ssh {cmd:?}: not a command")))?;
        let mut args = words[1..].to_vec();
        if let Some(p) = port {
            args.extend(["-p".into(), p.to_string()]);
        }
        Ok(Ssh {
            program: words[0].clone(),
            args,
            destination: remote.destination(),
            host: remote.host.clone(),
        })
    }

    /// The host name ssh connects to (`ssh -G`: an alias of ~/.ssh/config becomes its
    /// HostName), or the host as given when ssh cannot say.
    fn hostname(&self) -> String {
        let out = Command::new(&self.program)
            .args(&self.args)
            .arg("-G")
            .arg(&self.destination)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        out.ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("hostname ").map(str::to_string))
            })
            .unwrap_or_else(|| self.host.clone())
    }
}

/// One word of the far side's command line, quoted for its shell; a leading `~/` stays
/// unquoted so that the far shell expands it, as scp's does.
fn quote_remote(word: &str) -> Result<String, Failure> {
    let quote = |w: &str| {
        shlex::try_quote(w)
            .map(|q| q.into_owned())
            .map_err(|e| Failure::usage(format!("{word:?}: {e}")))
    };
    match word {
        "~" => Ok("~".into()),
        w => match w.strip_prefix("~/") {
            Some("") => Ok("~/".into()),
            Some(rest) => Ok(format!("~/{}", quote(rest)?)),
            None => quote(w),
        },
    }
}

fn remote_command(words: &[String]) -> Result<String, Failure> {
    Ok(words
        .iter()
        .map(|w| quote_remote(w))
        .collect::<Result<Vec<_>, _>>()?
        .join(" "))
}

/// What the thread reading the far side's stdout hands over.
enum FarOut {
    /// A line.
    Line(String),
    /// The rest of stdout, raw (asked for after a banner line: the mux reads it).
    Rest(BufReader<ChildStdout>),
}

/// The ssh process running the far side: its stdout lines, its stderr passed through to ours
/// (ssh's own messages are what the user needs), and its stdin, which this side holds open
/// for as long as the session runs. When the session goes through the ssh channel, its stdout
/// and stdin belong to the mux.
struct Far {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<FarOut>,
    /// After each banner line the reading thread waits here: `true` to read on, `false` to hand
    /// stdout over.
    resume: mpsc::Sender<bool>,
    mux: Option<Mux>,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    destination: String,
    remote_hurtle: String,
}

impl Far {
    fn start(ssh: &Ssh, remote_hurtle: &str, words: &[String]) -> Result<Far, Failure> {
        let mut all = vec![remote_hurtle.to_string()];
        all.extend_from_slice(words);
        let command = remote_command(&all)?;
        let mut child = Command::new(&ssh.program)
            .args(&ssh.args)
            .arg(&ssh.destination)
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Failure::new(
                    exit::SSH,
                    anyhow::anyhow!("cannot run ssh ({:?}): {e}", ssh.program),
                )
            })?;
        let (tx, lines) = mpsc::channel();
        let (resume, resumed) = mpsc::channel::<bool>();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(out);
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let text = line.trim_end_matches(['\n', '\r']).to_string();
                    let banner = text.split_whitespace().next() == Some(BANNER);
                    if tx.send(FarOut::Line(text)).is_err() {
                        break;
                    }
                    if banner {
                        match resumed.recv() {
                            Ok(true) => {}
                            Ok(false) => {
                                let _ = tx.send(FarOut::Rest(r));
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                }
            });
        }
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let stderr_thread = child.stderr.take().map(|err| {
            let tail = stderr_tail.clone();
            std::thread::spawn(move || pass_through(err, &tail))
        });
        Ok(Far {
            stdin: child.stdin.take(),
            child,
            lines,
            resume,
            mux: None,
            stderr_tail,
            stderr_thread,
            destination: ssh.destination.clone(),
            remote_hurtle: remote_hurtle.to_string(),
        })
    }

    /// Waits for the far side's `HURTLE-SSH` line and checks its protocol; returns the words
    /// after the version. Lines before it (a chatty login script) are skipped.
    fn banner(&mut self) -> Result<Vec<String>, Failure> {
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(FarOut::Rest(_)) => continue,
                Ok(FarOut::Line(line)) => match self.parse_banner(&line)? {
                    Some(words) => return Ok(words),
                    None => skipped.push(line),
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return Err(Failure::new(
                        exit::SSH,
                        anyhow::anyhow!(
                            "ssh to {} gave no answer within {} s",
                            self.destination,
                            HANDSHAKE_TIMEOUT.as_secs()
                        ),
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let mut f = self.failure();
                    if !skipped.is_empty() && f.code == exit::OTHER {
                        f.error = f.error.context(format!(
                            "the far side printed {:?} instead of hurtle's line (is its shell's \
                             login script printing?)",
                            skipped.join(" / ")
                        ));
                    }
                    return Err(f);
                }
            }
        }
    }

    /// The words after the version of a `HURTLE-SSH` line, its protocol checked; `None` for
    /// another line.
    fn parse_banner(&self, line: &str) -> Result<Option<Vec<String>>, Failure> {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if words.first().map(String::as_str) != Some(BANNER) {
            return Ok(None);
        }
        let theirs = words.get(1).map_or("", String::as_str);
        if theirs.parse::<u32>() != Ok(PROTOCOL) {
            return Err(Failure::new(
                exit::OTHER,
                anyhow::anyhow!(
                    "the hurtle on {} ({}) speaks ssh protocol {theirs}, this one (hurtle {}) \
                     speaks {PROTOCOL}: install the same hurtle version on both hosts",
                    self.destination,
                    self.remote_hurtle,
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
        Ok(Some(words[2..].to_vec()))
    }

    /// While a pull's direct session runs: the far sender's word that its session could not
    /// get its data through (`ssh WHY`), if it has come; returns WHY. The reading thread then
    /// waits for [`Far::start_mux`]. Other lines are passed over.
    fn retry_word(&mut self) -> Result<Option<String>, Failure> {
        loop {
            match self.lines.try_recv() {
                Ok(FarOut::Line(line)) => match self.parse_banner(&line)? {
                    Some(words) if words.first().map(String::as_str) == Some("ssh") => {
                        return Ok(Some(words[1..].join(" ")));
                    }
                    Some(_) => self.read_on(),
                    None => {}
                },
                Ok(FarOut::Rest(_)) => {}
                Err(_) => return Ok(None),
            }
        }
    }

    /// After a push's direct session failed and is not retried: tells the far side (`end`),
    /// which then ends with its own session's failure, as it waits to hear whether it is.
    fn end_direct(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"end\n").and_then(|()| s.flush());
        }
    }

    /// After a banner: reads on, line by line.
    fn read_on(&mut self) {
        let _ = self.resume.send(true);
    }

    /// After a banner: this side's end of a mux over the far side's stdout and stdin, which it
    /// owns from now on. `accept`: connect the streams the far side opens (a pull).
    fn start_mux(&mut self, accept: Option<Accept>) -> Result<Mux, Failure> {
        let _ = self.resume.send(false);
        let rest = loop {
            match self.lines.recv_timeout(Duration::from_secs(5)) {
                Ok(FarOut::Rest(r)) => break Some(r),
                Ok(FarOut::Line(_)) => {}
                Err(_) => break None,
            }
        };
        let (Some(rest), Some(stdin)) = (rest, self.stdin.take()) else {
            return Err(self.failure());
        };
        let mux = Mux::start(rest, stdin, accept, || {});
        self.mux = Some(mux.clone());
        Ok(mux)
    }

    /// Writes a line to the far side (the push's path, the pull's port and secret).
    fn tell(&mut self, line: &str) -> Result<(), Failure> {
        let written = self
            .stdin
            .as_mut()
            .map(|s| s.write_all(line.as_bytes()).and_then(|()| s.flush()));
        match written {
            Some(Ok(())) => Ok(()),
            _ => Err(self.failure()),
        }
    }

    /// ssh's exit status, if it has ended.
    fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// After a session that succeeded here: lets the far side end by itself (it may still be
    /// finishing, e.g. the receiver setting directories' modes after the last file was
    /// confirmed; closing its stdin first would cut that short), then closes its stdin. Warns
    /// when it ended with an error.
    fn finish(&mut self, out: &OutputArgs) {
        let deadline = Instant::now() + FAR_EXIT_WAIT;
        while self.ended().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        match self.wait() {
            Some(s) if s.success() => {}
            other if !out.quiet => ui::warning(&format!(
                "the far side on {} ended with {} after the session",
                self.destination,
                other.map_or("no status (killed)".into(), |s| s.to_string())
            )),
            _ => {}
        }
    }

    /// Closes the far side's stdin and waits for ssh to end (killing it after
    /// [`FAR_EXIT_WAIT`]).
    fn wait(&mut self) -> Option<ExitStatus> {
        drop(self.stdin.take());
        if let Some(m) = &self.mux {
            m.close();
        }
        let deadline = Instant::now() + FAR_EXIT_WAIT;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        status
    }

    /// Why the far side ended without a session: ssh's exit status read as ssh's, the shell's
    /// or the far hurtle's.
    fn failure(&mut self) -> Failure {
        let status = self.wait();
        let tail = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        far_failure(
            status.and_then(|s| s.code()),
            &tail,
            &self.destination,
            &self.remote_hurtle,
        )
    }
}

/// Copies the far side's stderr to ours a line at a time, keeping the last lines.
fn pass_through(err: impl Read, tail: &Mutex<Vec<String>>) {
    let mut r = BufReader::new(err);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let _ = std::io::stderr().write_all(&line);
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                if text.is_empty() {
                    continue;
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == STDERR_TAIL {
                    t.remove(0);
                }
                t.push(text);
            }
        }
    }
}

/// The failure for ssh's exit `code` (`None`: killed), given the last lines of its stderr.
fn far_failure(code: Option<i32>, tail: &[String], dest: &str, remote_hurtle: &str) -> Failure {
    let last = tail.last().map_or("", String::as_str);
    let fail = |code, msg: String| Failure::new(code, anyhow::anyhow!(msg));
    match code {
        Some(255) => fail(
            exit::SSH,
            if last.is_empty() {
                format!("ssh to {dest} failed (exit 255)")
            } else {
                format!("ssh to {dest} failed: {last}")
            },
        ),
        Some(126 | 127) => fail(
            exit::REMOTE_MISSING,
            format!(
                "no hurtle to run on {dest}: its shell could not run {remote_hurtle:?} ({last}); \
                 install hurtle there (from a checkout: cargo install --locked --path \
                 crates/cli; or copy the static binary: scp \"$(bash scripts/release.sh)\" \
                 {dest}:/usr/local/bin/hurtle), or name it with --remote-hurtle PATH"
            ),
        ),
        Some(2) if tail.iter().any(|l| l.contains("unrecognized subcommand")) => fail(
            exit::OTHER,
            format!(
                "the hurtle on {dest} ({remote_hurtle}) has no ssh-serve: it is older than this \
                 one; install hurtle {} there",
                env!("CARGO_PKG_VERSION")
            ),
        ),
        Some(0) => fail(
            exit::OTHER,
            format!("the far side on {dest} ended without starting a session"),
        ),
        Some(c) => fail(
            u8::try_from(c).unwrap_or(exit::OTHER),
            format!("the far side on {dest} failed (exit {c}); its error is above"),
        ),
        None => fail(exit::OTHER, format!("ssh to {dest} was ended by a signal")),
    }
}

// ---------------------------------------------------------------------------------------------
// The near side
// ---------------------------------------------------------------------------------------------

/// Runs `hurtle cp`.
pub fn run(a: CpArgs, defaults: &Defaults) -> Outcome {
    let mut flags = a.send.clone();
    if flags.channels.is_none() {
        flags.channels = defaults.get("channels", parse_channels)?;
    }
    if flags.rate.rate.is_none() && flags.rate.rate_fixed.is_none() && !flags.rate.fair {
        flags.rate.rate = defaults.get("rate", parse_rate)?;
    }
    match plan(&a.operands)? {
        Plan::Push { sources, dest } => push(&a, &flags, &sources, &dest),
        Plan::Pull { sources, dest } => pull(&a, &flags, &sources, Path::new(&dest)),
    }
}

fn warn_all(out: &OutputArgs, warnings: &[String]) {
    if !out.quiet {
        for w in warnings {
            ui::warning(w);
        }
    }
}

fn push(a: &CpArgs, flags: &SendFlags, sources: &[String], dest: &Remote) -> Outcome {
    let paths: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    let mut warnings = Vec::new();
    let paths = expand_sources(&paths, flags.follow_symlinks, &mut warnings)?;
    warn_all(&a.output, &warnings);
    let ssh = Ssh::new(&a.ssh, a.port, dest)?;
    let mut words: Vec<String> = ["ssh-serve", "receive", "--out", &dest.path]
        .map(String::from)
        .to_vec();
    if a.overwrite {
        words.push("--overwrite".into());
    }
    let mut far = Far::start(&ssh, &a.remote_hurtle, &words)?;
    let said = far.banner()?;
    let (port, secret) = match said.as_slice() {
        [port, secret, ..] => (port.parse::<u16>().ok(), Secret::parse(secret)),
        _ => (None, None),
    };
    let (Some(port), Some(secret)) = (port, secret) else {
        far.wait();
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the far side's line {said:?} is not a port and a secret"),
        ));
    };
    let host = HostPort {
        host: ssh.hostname(),
        port,
    };
    let to = resolve(&host, "far")?;
    // The far side's port directly, or else the ssh channel.
    let direct = if a.via_ssh {
        Err(Route::ssh("asked for with --via-ssh"))
    } else {
        hurtle_engine::net::dial::connect_hedged(to, DIRECT_TRY).map_err(|e| {
            let why = format!("cannot connect to the far side's port {to} directly ({e})");
            warn_slow(&a.output, &why);
            Route::ssh("no direct port was reachable")
        })
    };
    let mut opts = send_options(flags, a.output.log_dir.clone(), &secret);
    let mut route = match direct {
        Ok(first) => {
            far.tell("direct\n")?;
            far.read_on();
            opts.dialer = Some(Arc::new(Prepared::new(to, first)));
            Route::Direct(to)
        }
        Err(route) => {
            far.tell("ssh\n")?;
            opts.dialer = Some(far.start_mux(None)?.dialer());
            route
        }
    };
    if a.output.verbose {
        ui::say(
            &a.output,
            &format!(
                "hurtle: the far side receives on {to} (over ssh to {}), {}",
                ssh.destination,
                route.describe()
            ),
        );
    }
    let send = |opts: &SendOptions| {
        let (progress, bar) = ui::progress_bar(&a.output, "sending");
        interrupt::watch(&progress);
        let result = hurtle_engine::send(&paths, to, opts, progress.clone());
        bar.finish();
        (result, progress)
    };
    let started = Instant::now();
    let (mut result, mut progress) = send(&opts);
    let mut retry_warning = None;
    if let (Route::Direct(_), Err(e)) = (&route, &result) {
        match retry_reason(e, to, &progress) {
            // The far side's port answered, but the session's data could not get through:
            // the same transfer again, through the ssh channel (the far side acknowledges,
            // and its mux connects to the same receiver, with the same secret).
            Some(why) => {
                let spent = started.elapsed().as_secs_f64();
                retry_warning = Some(warn_retry(
                    &a.output,
                    "the",
                    &format!("{why}; {spent:.1} s spent"),
                ));
                far.tell("ssh\n")?;
                let said = far.banner()?;
                if said.first().map(String::as_str) != Some("ssh") {
                    far.wait();
                    return Err(Failure::new(
                        exit::OTHER,
                        anyhow::anyhow!("the far side said {said:?}, not that it takes the retry"),
                    ));
                }
                opts.dialer = Some(far.start_mux(None)?.dialer());
                route = Route::ssh(RETRIED);
                (result, progress) = send(&opts);
            }
            // No retry: the far side ends with its own failure.
            None => far.end_direct(),
        }
    }
    match result {
        Ok(mut s) => {
            far.finish(&a.output);
            retry_in_summary(&a.output, &mut s.warnings, retry_warning);
            ui::print_send_summary(&a.output, &s, Some(&route.info()));
            ui::say(&a.output, &format!("path: {}", route.describe()));
            Ok(())
        }
        Err(e) => {
            retry_before_failure(&a.output, retry_warning.as_ref());
            Err(near_failure(e, false, &progress, &mut far))
        }
    }
}

/// The path a `hurtle cp` session takes.
enum Route {
    /// Directly to the other side's port (then UDP or parallel TCP, as the session finds).
    Direct(SocketAddr),
    /// Through the ssh channel, for this reason.
    Ssh(String),
}

impl Route {
    fn ssh(why: &str) -> Route {
        Route::Ssh(why.to_string())
    }

    /// The summary's `path:` line, after `path: `.
    fn describe(&self) -> String {
        match self {
            Route::Direct(addr) => format!("direct to {addr}"),
            Route::Ssh(why) => format!("through the ssh channel (slow; {why})"),
        }
    }

    /// For the `--json` summary.
    fn info(&self) -> PathInfo {
        PathInfo {
            path: match self {
                Route::Direct(_) => "direct",
                Route::Ssh(_) => "ssh",
            },
            relay: None,
            code_nameplate: None,
        }
    }
}

/// The reason the summary gives for a transfer retried through the ssh channel.
const RETRIED: &str = "the direct path could not carry the data";

/// The warning that `whose` direct session could not get its data through (`why`) and that
/// the transfer is retried through the ssh channel. Shown at once; with `--json` it comes with
/// the summary instead (in its `warnings`), or before the error if the retry fails too.
fn warn_retry(out: &OutputArgs, whose: &str, why: &str) -> String {
    let warning = format!(
        "{whose} direct session could not get its data through ({why}), before any file data \
         arrived: retrying once through the ssh channel, which is slow (one TCP connection \
         inside ssh's own flow control)"
    );
    if !out.quiet && !out.json {
        ui::warning(&warning);
    }
    warning
}

/// With `--json`, the retry's warning goes in the summary (see [`warn_retry`]).
fn retry_in_summary(out: &OutputArgs, warnings: &mut Vec<String>, retry: Option<String>) {
    if out.json {
        warnings.splice(0..0, retry);
    }
}

/// With `--json`, the retry's warning before the failure of the retry (see [`warn_retry`]).
fn retry_before_failure(out: &OutputArgs, retry: Option<&String>) {
    if let Some(w) = retry.filter(|_| out.json && !out.quiet) {
        ui::warning(w);
    }
}

/// Warns that the data will go through the ssh channel, and why.
fn warn_slow(out: &OutputArgs, why: &str) {
    if !out.quiet {
        ui::warning(&format!(
            "{why}: the data goes through the ssh channel instead, which is slow (one TCP \
             connection inside ssh's own flow control)"
        ));
    }
}

/// A direct path whose first connection (the control connection) is already open.
#[derive(Debug)]
struct Prepared {
    addr: SocketAddr,
    first: Mutex<Option<TcpStream>>,
}

impl Prepared {
    fn new(addr: SocketAddr, first: TcpStream) -> Prepared {
        Prepared {
            addr,
            first: Mutex::new(Some(first)),
        }
    }
}

impl Dialer for Prepared {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
        if addr == self.addr {
            if let Some(s) = self.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok(s);
            }
        }
        TcpStream::connect_timeout(&addr, timeout)
    }
}

/// Loopback of the address family of `ip` (where a receiver bound to `ip` is reached from its
/// own host).
fn loopback(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// The accepting end of a mux for a receiver bound to `bound`: its loopback, its own ports.
fn accept_for(bound: IpAddr, ports: Arc<OwnPorts>) -> Accept {
    Accept {
        ip: if bound.is_unspecified() {
            loopback(bound)
        } else {
            bound
        },
        allow: Box::new(move |p| ports.contains(p)),
    }
}

/// A session's failure on this side; when it is the network's (the peer gone, a connection
/// refused) and ssh ended with an error, ssh's or the far side's reason is the one to show.
fn near_failure(e: SessionError, receiver: bool, progress: &Progress, far: &mut Far) -> Failure {
    let network = exit::session_code(&e) == exit::NETWORK;
    if network && !progress.interrupted() {
        let deadline = Instant::now() + Duration::from_secs(2);
        while far.ended().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if far.ended().is_some_and(|s| !s.success()) {
            return far.failure();
        }
    }
    far.wait();
    session_failure(e, receiver, progress)
}

fn pull(a: &CpArgs, flags: &SendFlags, sources: &[Remote], out: &Path) -> Outcome {
    let ssh = Ssh::new(&a.ssh, a.port, &sources[0])?;
    check_out(out)?;
    // Listen on the address family ssh reaches the far host by, so its dial back matches.
    let v6 = (ssh.hostname().as_str(), 22)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| a.is_ipv6());
    let any = if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let secret = Secret::new();
    let opts = receive_options(out, a.overwrite, a.output.log_dir.clone(), &secret);
    let own_ports = opts.own_ports.clone();
    let receiver = Receiver::bind(SocketAddr::new(any, 0), opts)?;
    let port = receiver.local_addr()?.port();
    let mut words: Vec<String> = vec!["ssh-serve".into(), "send".into()];
    words.extend(flags.to_args());
    words.push("--".into());
    words.extend(sources.iter().map(|r| r.path.clone()));
    let mut far = Far::start(&ssh, &a.remote_hurtle, &words)?;
    let said = far.banner()?;
    if said.first().map(String::as_str) != Some("ready") {
        far.wait();
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the far side said {said:?}, not that it is ready to send"),
        ));
    }
    far.read_on();
    let mode = if a.via_ssh { "ssh" } else { "auto" };
    far.tell(&format!("{port} {secret} {mode}\n"))?;
    // The far side says which path it takes: `direct` (it reached our port), or `ssh WHY`
    // (from now on its stdout and stdin are the mux).
    let said = far.banner()?;
    let mut route = match said.first().map(String::as_str) {
        Some("direct") => {
            far.read_on();
            Route::Direct(SocketAddr::new(any, port))
        }
        Some("ssh") => {
            let why = said[1..].join(" ");
            if !a.via_ssh {
                warn_slow(&a.output, &format!("the far side {why}"));
            }
            far.start_mux(Some(accept_for(any, own_ports.clone())))?;
            Route::Ssh(if a.via_ssh {
                "asked for with --via-ssh".into()
            } else {
                "no direct port was reachable".into()
            })
        }
        _ => {
            far.wait();
            return Err(Failure::new(
                exit::OTHER,
                anyhow::anyhow!("the far side said {said:?}, not the path it takes"),
            ));
        }
    };
    // One session at a time, in a thread that hands the receiver back with its result.
    let accept = |receiver: Receiver| {
        let (progress, bar) = ui::progress_bar(&a.output, "receiving");
        interrupt::watch(&progress);
        let (tx, rx) = mpsc::channel();
        let session = progress.clone();
        std::thread::spawn(move || {
            let result = receiver.accept_one(session);
            let _ = tx.send((result, receiver));
        });
        (rx, progress, bar)
    };
    let (mut rx, mut progress, mut bar) = accept(receiver);
    // This side's direct session failed: kept while the far side may still say that its data
    // path failed (it says so when its own session has ended, which can be just after ours).
    let mut failed: Option<(SessionError, Receiver, Instant)> = None;
    // The far side said so (`ssh WHY`): the retry's mux runs, its first connection waits at
    // this receiver's door; `second`: the receiver's next session (the retry) was started.
    let (mut retried, mut second) = (None, false);
    // The session ends, or ssh ends first: then the far side failed before or during it (a
    // source that does not exist, ssh cut off), unless the session ends just after.
    let result = loop {
        if failed.is_none() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((Ok(s), _)) => break Some(Ok(s)),
                Ok((Err(_), receiver)) if retried.is_some() && !second => {
                    // The direct session ended here too: the retry is the next one.
                    second = true;
                    bar.finish();
                    (rx, progress, bar) = accept(receiver);
                    continue;
                }
                Ok((Err(e), receiver))
                    if retried.is_none() && matches!(route, Route::Direct(_)) =>
                {
                    failed = Some((e, receiver, Instant::now()));
                }
                Ok((Err(e), _)) => break Some(Err(e)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        if retried.is_none() && matches!(route, Route::Direct(_)) {
            if let Some(why) = far.retry_word()? {
                retried = Some(warn_retry(&a.output, "the far side's", &why));
                far.tell("ssh\n")?;
                far.start_mux(Some(accept_for(any, own_ports.clone())))?;
                route = Route::ssh(RETRIED);
                if let Some((_, receiver, _)) = failed.take() {
                    second = true;
                    bar.finish();
                    (rx, progress, bar) = accept(receiver);
                }
                continue;
            }
        }
        if let Some((_, _, at)) = &failed {
            if at.elapsed() >= RETRY_WORD_WAIT || far.ended().is_some() {
                break failed.take().map(|(e, ..)| Err(e));
            }
            continue;
        }
        if let Some(status) = far.ended() {
            let grace = if status.success() {
                Duration::from_secs(30)
            } else {
                Duration::from_secs(2)
            };
            break match rx.recv_timeout(grace) {
                // The direct session's end, while the retry failed on the far side: its
                // failure is the one to show.
                Ok((Err(_), _)) if retried.is_some() && !second => None,
                r => r.ok().map(|(r, _)| r),
            };
        }
    };
    bar.finish();
    match result {
        Some(Ok(mut s)) => {
            far.finish(&a.output);
            retry_in_summary(&a.output, &mut s.warnings, retried);
            ui::print_receive_summary(&a.output, &s, Some(&route.info()));
            if let Route::Direct(_) = route {
                ui::say(&a.output, &format!("path: direct from {}", s.peer));
            } else {
                ui::say(&a.output, &format!("path: {}", route.describe()));
            }
            Ok(())
        }
        Some(Err(e)) => {
            retry_before_failure(&a.output, retried.as_ref());
            Err(near_failure(e, true, &progress, &mut far))
        }
        None => {
            retry_before_failure(&a.output, retried.as_ref());
            Err(far.failure())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The far side: `hurtle ssh-serve`
// ---------------------------------------------------------------------------------------------

/// Runs the far side of `hurtle cp` (`hurtle ssh-serve receive|send`, started over ssh). Its
/// stdout carries only the one line the near side reads; errors go to stderr, which ssh shows
/// the user, marked as the far side's.
pub fn serve(a: SshServeArgs) -> ExitCode {
    let outcome = match a.side {
        SshServeSide::Receive { out, overwrite } => serve_receive(&out, overwrite),
        SshServeSide::Send { paths, flags } => serve_send(&paths, &flags),
    };
    match outcome {
        Ok(()) => ExitCode::from(exit::OK),
        Err(f) => {
            // The channel may be gone: never panic on a write.
            let _ = writeln!(
                std::io::stderr(),
                "hurtle (far side): error: {}",
                crate::one_line(&f.error)
            );
            ExitCode::from(f.code)
        }
    }
}

/// `SSH_CONNECTION`: the near side's address and the address it reached this host at.
fn ssh_connection() -> Result<(IpAddr, IpAddr), Failure> {
    let var = std::env::var("SSH_CONNECTION").unwrap_or_default();
    let ip = |s: Option<&str>| {
        s.map(|s| s.split('%').next().unwrap_or(s))
            .and_then(|s| s.parse::<IpAddr>().ok())
    };
    let mut f = var.split_whitespace();
    let (client, _, server) = (ip(f.next()), f.next(), ip(f.next()));
    match (client, server) {
        (Some(c), Some(s)) => Ok((c, s)),
        _ => Err(Failure::usage(format!(
            "SSH_CONNECTION is {var:?}: hurtle ssh-serve runs over ssh, started by hurtle cp"
        ))),
    }
}

/// What the near side says after a direct session: `ssh` (carry the transfer through the ssh
/// channel instead, once) or `end` (no retry; EOF says the same once the session is over).
enum Verdict {
    /// The retry's mux runs over the ssh channel.
    Ssh(Mux),
    /// No retry.
    End,
}

#[derive(Default)]
struct WatchState {
    verdict: Option<Verdict>,
    /// The direct session is over and the main thread waits for the verdict: EOF is `end`
    /// then, not a hang-up.
    waiting: bool,
}

/// The far side's stdin (the ssh channel) while a direct session runs, read by a thread of its
/// own. EOF before the session is over (the near side or ssh gone) ends the process as a
/// signal would ([`interrupt::hang_up`]); once the main thread waits for the verdict it means
/// `end`. The line `ssh` hands the channel to `retry` (which starts the retry's mux) and ends
/// the thread: from then on the mux reads stdin, and its EOF hangs up. Anything else is `end`.
#[derive(Clone)]
struct Watch {
    state: Arc<(Mutex<WatchState>, std::sync::Condvar)>,
}

impl Watch {
    fn start(
        mut stdin: BufReader<File>,
        retry: impl FnOnce(BufReader<File>) -> Result<Mux, Failure> + Send + 'static,
    ) -> Watch {
        let watch = Watch {
            state: Arc::default(),
        };
        let me = watch.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        // After a verdict (`end` came before the EOF) there is nothing to cut
                        // short: the main thread takes the verdict when its session is over.
                        if !me.decide(Verdict::End, true) {
                            interrupt::hang_up();
                        }
                        return;
                    }
                    Ok(_) if line.trim() == "ssh" => {
                        let verdict = match retry(stdin) {
                            Ok(mux) => Verdict::Ssh(mux),
                            Err(_) => Verdict::End,
                        };
                        me.decide(verdict, false);
                        return;
                    }
                    Ok(_) => {
                        me.decide(Verdict::End, false);
                    }
                }
            }
        });
        watch
    }

    /// Records the first verdict; with `only_if_waiting`, only when the main thread already
    /// waits for one. Returns whether a verdict stands now (recorded here or before) or the
    /// main thread waits: `false` only for an EOF with neither, a hang-up.
    fn decide(&self, verdict: Verdict, only_if_waiting: bool) -> bool {
        let (lock, cv) = &*self.state;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        if s.verdict.is_some() {
            return true;
        }
        if s.waiting || !only_if_waiting {
            s.verdict = Some(verdict);
            cv.notify_all();
        }
        s.waiting || s.verdict.is_some()
    }

    /// After a failed direct session: waits (at most `timeout`, then `end`) for the near
    /// side's verdict; returns the retry's mux if it is `ssh`.
    fn verdict(&self, timeout: Duration) -> Option<Mux> {
        let (lock, cv) = &*self.state;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        s.waiting = true;
        let (mut s, _) = cv
            .wait_timeout_while(s, timeout, |s| s.verdict.is_none())
            .unwrap_or_else(|e| e.into_inner());
        match s.verdict.take() {
            Some(Verdict::Ssh(mux)) => Some(mux),
            _ => None,
        }
    }

    /// The retry's mux, if the near side asked for it already.
    fn retried(&self) -> Option<Mux> {
        let s = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
        match &s.verdict {
            Some(Verdict::Ssh(mux)) => Some(mux.clone()),
            _ => None,
        }
    }
}

fn say_line(line: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::OTHER, anyhow::anyhow!("cannot write to ssh: {e}")))
}

/// This process's stdin or stdout as a plain file (a duplicate of its descriptor): the mux
/// reads and writes them raw, without std's line buffering.
fn stdio_file(fd: impl AsFd, what: &str) -> Result<File, Failure> {
    fd.as_fd()
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|e| Failure::new(exit::OTHER, anyhow::anyhow!("cannot use {what}: {e}")))
}

fn serve_receive(out: &Path, overwrite: bool) -> Outcome {
    let (_, server) = ssh_connection()?;
    let any = match server {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    check_out(out)?;
    let secret = Secret::new();
    let opts = receive_options(out, overwrite, None, &secret);
    let own_ports = opts.own_ports.clone();
    let receiver = Receiver::bind(SocketAddr::new(any, 0), opts)?;
    let port = receiver.local_addr()?.port();
    say_line(&format!("{BANNER} {PROTOCOL} {port} {secret}"))?;
    // The near side says how it reaches us: directly, or through the ssh channel.
    let mut stdin = BufReader::new(stdio_file(std::io::stdin(), "stdin")?);
    let mut line = String::new();
    if matches!(stdin.read_line(&mut line), Ok(0) | Err(_)) {
        // The ssh channel closed before the near side said anything.
        interrupt::hang_up();
    }
    let stdout = stdio_file(std::io::stdout(), "stdout")?;
    let progress = Arc::new(Progress::default());
    interrupt::watch(&progress);
    let session = |progress: &Arc<Progress>| {
        receiver
            .accept_one(progress.clone())
            .map(drop)
            .map_err(|e| session_failure(e, true, progress))
    };
    let (result, mux) = match line.trim() {
        "direct" => {
            // The near side may ask for the retry through the ssh channel while this
            // session still ends (see `retry_reason`): it is acknowledged, and the mux
            // started, at once; its first connection waits at this receiver's door.
            let accept = accept_for(any, own_ports);
            let watch = Watch::start(stdin, move |stdin| {
                say_line(&format!("{BANNER} {PROTOCOL} ssh"))?;
                Ok(Mux::start(stdin, stdout, Some(accept), || {
                    interrupt::hang_up()
                }))
            });
            match session(&progress) {
                Ok(()) => (Ok(()), watch.retried()),
                Err(direct) => match watch.verdict(VERDICT_WAIT) {
                    Some(mux) => {
                        let progress = Arc::new(Progress::default());
                        interrupt::watch(&progress);
                        (session(&progress), Some(mux))
                    }
                    None => (Err(direct), None),
                },
            }
        }
        "ssh" => {
            let mux = Mux::start(stdin, stdout, Some(accept_for(any, own_ports)), || {
                interrupt::hang_up()
            });
            (session(&progress), Some(mux))
        }
        other => {
            return Err(Failure::new(
                exit::OTHER,
                anyhow::anyhow!("the near side sent {other:?}, not the path it takes"),
            ))
        }
    };
    if let Some(m) = mux {
        m.drain(MUX_DRAIN);
    }
    result
}

fn serve_send(paths: &[PathBuf], flags: &SendFlags) -> Outcome {
    say_line(&format!("{BANNER} {PROTOCOL} ready"))?;
    let mut stdin = BufReader::new(stdio_file(std::io::stdin(), "stdin")?);
    let mut line = String::new();
    let _ = stdin.read_line(&mut line);
    let mut words = line.split_whitespace();
    let (port, secret, mode) = (
        words.next().and_then(|p| p.parse::<u16>().ok()),
        words.next().and_then(Secret::parse),
        words.next(),
    );
    let (Some(port), Some(secret), Some(mode @ ("auto" | "ssh"))) = (port, secret, mode) else {
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the near side sent {line:?}, not a port, a secret and a path"),
        ));
    };
    let (client, _) = ssh_connection()?;
    let mut warnings = Vec::new();
    let paths = expand_sources(paths, flags.follow_symlinks, &mut warnings)?;
    for w in warnings {
        let _ = writeln!(std::io::stderr(), "hurtle (far side): warning: {w}");
    }
    let to = SocketAddr::new(client, port);
    let mut opts = send_options(flags, None, &secret);
    let stdout = stdio_file(std::io::stdout(), "stdout")?;
    // Dial back directly, or else through the ssh channel; say which.
    let direct = match mode {
        "ssh" => Err("was asked to use the ssh channel".to_string()),
        _ => TcpStream::connect_timeout(&to, DIRECT_TRY)
            .map_err(|e| format!("cannot connect back to {to} ({e})")),
    };
    let send = |opts: &SendOptions| {
        let progress = Arc::new(Progress::default());
        interrupt::watch(&progress);
        let result = hurtle_engine::send(&paths, to, opts, progress.clone());
        (result, progress)
    };
    let (result, mux) = match direct {
        Ok(first) => {
            say_line(&format!("{BANNER} {PROTOCOL} direct"))?;
            let watch = Watch::start(stdin, move |stdin| {
                Ok(Mux::start(stdin, stdout, None, || interrupt::hang_up()))
            });
            opts.dialer = Some(Arc::new(Prepared::new(to, first)));
            let started = Instant::now();
            match send(&opts) {
                (Err(e), progress) => match retry_reason(&e, to, &progress) {
                    // The direct path cannot carry the data: say so, and retry through the
                    // ssh channel when the near side answers `ssh` (its mux then accepts).
                    Some(why) => {
                        let spent = started.elapsed().as_secs_f64();
                        say_line(&format!(
                            "{BANNER} {PROTOCOL} ssh {why}; {spent:.1} s spent"
                        ))?;
                        match watch.verdict(VERDICT_WAIT) {
                            Some(mux) => {
                                opts.dialer = Some(mux.dialer());
                                let (result, progress) = send(&opts);
                                (result.map_err(|e| (e, progress)), Some(mux))
                            }
                            None => (Err((e, progress)), None),
                        }
                    }
                    None => (Err((e, progress)), None),
                },
                (result, progress) => (result.map_err(|e| (e, progress)), None),
            }
        }
        Err(why) => {
            say_line(&format!("{BANNER} {PROTOCOL} ssh {why}"))?;
            let mux = Mux::start(stdin, stdout, None, || interrupt::hang_up());
            opts.dialer = Some(mux.dialer());
            let (result, progress) = send(&opts);
            (result.map_err(|e| (e, progress)), Some(mux))
        }
    };
    if let Some(m) = mux {
        m.drain(MUX_DRAIN);
    }
    result
        .map(drop)
        .map_err(|(e, progress)| session_failure(e, false, &progress))
}

/// Whether a direct session failed in its data path before any file data reached the
/// receiver, which `hurtle cp` answers by carrying the transfer through the ssh channel
/// instead, once; returns the reason to give. `to` is the receiver's control address.
///
/// Two failures qualify, both of the sender (it decides, on either side), and both leave the
/// receiver's session ending by itself, so that its next session is the retry:
/// - [`SessionError::UdpBlocked`]: no datagram reached the receiver (with `--transport udp`;
///   the default `auto` moves the channels to parallel TCP first). The sender tells the
///   receiver.
/// - [`SessionError::Connect`] to a port other than the control port: a TCP data connection
///   could not be made (refused, unreachable, or no answer within the engine's 5 s connect
///   timeout). The sender tells the receiver, or it sees the control connection close.
///
/// Anything else does not: a refusal, a failed verification, an interrupt, a peer gone, a
/// stall, and a control connection that cannot be made again (after UDP was found blocked),
/// whose receiver would wait for the next one.
fn retry_reason(e: &SessionError, to: SocketAddr, progress: &Progress) -> Option<String> {
    // (Both failures come before any data could be delivered; the check says so again.
    // Empty files may have been committed: they hold no data, and the retry skips them.)
    let delivered = progress
        .confirmed
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0;
    if delivered || progress.interrupted() {
        return None;
    }
    match e {
        SessionError::UdpBlocked { .. } => Some(e.to_string()),
        SessionError::Connect { addr, .. } if *addr != to => Some(e.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(user: Option<&str>, host: &str, path: &str) -> Operand {
        Operand::Remote(Remote {
            user: user.map(str::to_string),
            host: host.into(),
            path: path.into(),
        })
    }

    /// The near side says `end` after a refused push and closes the channel, both maybe before
    /// the far side's session is over: the EOF behind the verdict must not hang up (before the
    /// fix it exited the process with 129, without the far side's error line). An EOF alone,
    /// with the main thread waiting, is `end` too.
    #[test]
    fn end_then_eof_before_the_far_side_waits_is_still_end() {
        for said in [&b"end\n"[..], b""] {
            let (reader, mut writer) = std::io::pipe().unwrap();
            let stdin = BufReader::new(File::from(std::os::fd::OwnedFd::from(reader)));
            let watch = Watch::start(stdin, |_| panic!("no retry was asked for"));
            writer.write_all(said).unwrap();
            if said.is_empty() {
                // The main thread waits before the EOF comes.
                let w = watch.clone();
                let waiting = std::thread::spawn(move || w.verdict(Duration::from_secs(5)));
                while !watch.state.0.lock().unwrap().waiting {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(writer);
                assert!(waiting.join().unwrap().is_none());
                continue;
            }
            drop(writer);
            // Let the reading thread see the EOF before the main thread waits.
            std::thread::sleep(Duration::from_millis(100));
            assert!(watch.verdict(Duration::from_secs(5)).is_none());
        }
    }

    #[test]
    fn operands_parse_as_scp_reads_them() {
        let p = |s| parse_operand(s).unwrap();
        assert_eq!(p("host:/data"), remote(None, "host", "/data"));
        assert_eq!(p("me@host:x/y"), remote(Some("me"), "host", "x/y"));
        assert_eq!(p("host:"), remote(None, "host", "."));
        assert_eq!(p("[::1]:/d"), remote(None, "::1", "/d"));
        assert_eq!(p("me@[fe80::1]:d"), remote(Some("me"), "fe80::1", "d"));
        assert_eq!(p("host:a:b"), remote(None, "host", "a:b"));
        for local in ["./a:b", "a/b:c", "plain", "/abs/x:y", ":x", "[::1]/x", "[x"] {
            assert_eq!(p(local), Operand::Local(local.into()), "{local}");
        }
        for bad in ["-oProxyCommand=x:y", "@host:x", "me@-x:y", "[]:x"] {
            assert!(parse_operand(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exactly_one_side_is_remote() {
        let ops = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let code = |v: &[&str]| plan(&ops(v)).unwrap_err().code;
        assert_eq!(code(&["a", "b"]), exit::USAGE);
        assert_eq!(code(&["h:a"]), exit::USAGE);
        assert_eq!(code(&["h:a", "g:b"]), exit::USAGE);
        assert_eq!(code(&["h:a", "b", "c"]), exit::USAGE);
        assert_eq!(code(&["h:a", "g:b", "c"]), exit::USAGE);
        assert!(matches!(
            plan(&ops(&["a", "b", "h:d"])),
            Ok(Plan::Push { .. })
        ));
        assert!(matches!(
            plan(&ops(&["h:a", "h:b", "d"])),
            Ok(Plan::Pull { .. })
        ));
    }

    #[test]
    fn remote_words_are_quoted_for_the_far_shell() {
        let words = ["hurtle", "a b", "~/x y", "~", "it's", "$HOME"].map(String::from);
        assert_eq!(
            remote_command(&words).unwrap(),
            r#"hurtle 'a b' ~/'x y' ~ "it's" '$HOME'"#
        );
    }

    #[test]
    fn ssh_exit_codes_name_their_cause() {
        let tail = ["root@h: Permission denied (publickey).".to_string()];
        let f = far_failure(Some(255), &tail, "root@h", "hurtle");
        assert_eq!(f.code, exit::SSH);
        assert!(f.error.to_string().contains("Permission denied"));
        let f = far_failure(
            Some(127),
            &["bash: hurtle: command not found".into()],
            "h",
            "hurtle",
        );
        assert_eq!(f.code, exit::REMOTE_MISSING);
        assert!(f.error.to_string().contains("install hurtle"));
        assert_eq!(far_failure(Some(6), &[], "h", "x").code, exit::STORAGE);
    }

    #[test]
    fn a_secret_is_32_bytes_in_hex() {
        let secret = Secret::new();
        let s = secret.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(Secret::parse(&s).map(|p| p.0), Some(secret.0));
        assert!(Secret::parse("abc").is_none());
        assert!(Secret::parse(&"+f".repeat(32)).is_none());
    }
}
