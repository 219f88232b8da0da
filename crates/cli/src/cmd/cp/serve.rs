//! The far side of `hurtle cp`: `hurtle ssh-serve receive|send` ([`serve`], hidden), started
//! over ssh by the near side. It says its `HURTLE-SSH` lines on stdout, reads the near side's
//! words on stdin, and runs one session (two with the retry through the ssh channel), a
//! receiver for a push ([`serve_receive`]) or a sender for a pull ([`serve_send`]); a thread
//! reading stdin ([`Watch`]) hangs up at EOF and takes the near side's word on the retry.

use super::dest::{place, Shape};
use super::options::{receive_options, send_options, Secret};
use super::route::{accept_for, retry_reason, Prepared};
use super::sources::expand_sources;
use super::{BANNER, DIRECT_TRY, PROTOCOL};
use crate::args::{SendFlags, SshServeArgs, SshServeSide};
use crate::cmd::receive::check_out;
use crate::cmd::session_failure;
use crate::exit::{self, Failure, Outcome};
use crate::interrupt;
use crate::sshmux::Mux;
use hurtle_engine::receive::Names;
use hurtle_engine::{Progress, Receiver, SendOptions};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the far side waits, after its direct session failed, for the near side to say
/// whether the transfer is retried through the ssh channel (it says so as soon as its own
/// session has ended).
pub(super) const VERDICT_WAIT: Duration = Duration::from_secs(30);
/// How long a far side whose session went through the mux waits for its last frames to cross.
const MUX_DRAIN: Duration = Duration::from_secs(5);

/// Runs the far side of `hurtle cp` (`hurtle ssh-serve receive|send`, started over ssh). Its
/// stdout carries only the one line the near side reads; errors go to stderr, which ssh shows
/// the user, marked as the far side's.
pub fn serve(a: SshServeArgs) -> ExitCode {
    let outcome = match a.side {
        SshServeSide::Receive {
            out,
            overwrite,
            allow_delete,
            dry_run,
        } => serve_receive(&out, (overwrite, allow_delete), dry_run),
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
pub(super) struct Watch {
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

fn serve_receive(out: &Path, overwrite: (bool, bool), dry_run: bool) -> Outcome {
    let (_, server) = ssh_connection()?;
    let any = match server {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    // The near side says first what its sources are, for the destination rules.
    let mut stdin = BufReader::new(stdio_file(std::io::stdin(), "stdin")?);
    let mut line = String::new();
    if matches!(stdin.read_line(&mut line), Ok(0) | Err(_)) {
        interrupt::hang_up();
    }
    let Some(shape) = Shape::parse(&line) else {
        return Err(Failure::new(
            exit::OTHER,
            anyhow::anyhow!("the near side sent {line:?}, not the shape of its sources"),
        ));
    };
    let dest = out.to_str().ok_or_else(|| {
        Failure::new(
            exit::STORAGE,
            anyhow::anyhow!("--out {}: not valid UTF-8", out.display()),
        )
    })?;
    let placed = place(dest, &shape)?;
    // A dry run creates nothing, the destination included (its session writes nothing).
    if !dry_run {
        check_out(&placed.out)?;
    }
    let secret = Secret::new();
    let names = Names {
        allowed: None,
        rename: placed.rename,
    };
    // A dry run into a destination not there yet decides as into an empty one: a private empty
    // directory stands for it (a receiver creates its directory when it binds), removed after.
    let stand_in = match dry_run && std::fs::symlink_metadata(&placed.out).is_err() {
        true => Some(tempfile::tempdir().map_err(|e| {
            Failure::new(
                exit::STORAGE,
                anyhow::anyhow!("cannot make a temporary directory: {e}"),
            )
        })?),
        false => None,
    };
    let out = stand_in.as_ref().map_or(placed.out.as_path(), |d| d.path());
    let opts = receive_options((out, names), overwrite, None, &secret);
    let own_ports = opts.own_ports.clone();
    let receiver = Receiver::bind(SocketAddr::new(any, 0), opts)?;
    let port = receiver.local_addr()?.port();
    say_line(&format!("{BANNER} {PROTOCOL} {port} {secret}"))?;
    // The near side says how it reaches us: directly, or through the ssh channel.
    line.clear();
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
    let root = super::options::mirror_root(paths.iter().filter_map(|p| p.to_str()));
    let (paths, link_args) = expand_sources(paths, flags.follow_symlinks)?;
    let to = SocketAddr::new(client, port);
    let mut opts = send_options(flags, None, &secret);
    opts.mirror_root = root;
    opts.link_args = link_args;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
