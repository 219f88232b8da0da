//! This side's hold on the far side of `hurtle cp`: how to run ssh to the far host ([`Ssh`],
//! the far command line quoted for its shell), the ssh process running `hurtle ssh-serve`
//! ([`Far`]: the far side's `HURTLE-SSH` lines, its stdin, its stderr passed through, the mux
//! over its stdout and stdin), and what ssh's exit status means when the far side ends without
//! a session ([`far_failure`], [`near_failure`]).

use super::operands::Remote;
use super::{BANNER, PROTOCOL};
use crate::args::OutputArgs;
use crate::cmd::session_failure;
use crate::cp_lines::{banner_words, ProtocolMismatch};
use crate::exit::{self, Failure};
use crate::sshmux::{Accept, Mux};
use crate::ui;
use hurtle_engine::{Progress, SessionError};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the far side may take to say it is ready (ssh's connection and authentication
/// included: a password typed at ssh's prompt must fit in it).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long ssh may take to end once the session is over or its stdin is closed.
const FAR_EXIT_WAIT: Duration = Duration::from_secs(10);
/// Lines of ssh's stderr kept for the error message (all of it is shown as it comes).
const STDERR_TAIL: usize = 20;

/// How to run ssh to the far host.
pub(super) struct Ssh {
    program: String,
    args: Vec<String>,
    /// `user@host` or `host`.
    pub(super) destination: String,
    /// The host as given.
    host: String,
}

impl Ssh {
    pub(super) fn new(cmd: &str, port: Option<u16>, remote: &Remote) -> Result<Ssh, Failure> {
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
    pub(super) fn hostname(&self) -> String {
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
pub(super) struct Far {
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
    pub(super) fn start(ssh: &Ssh, remote_hurtle: &str, words: &[String]) -> Result<Far, Failure> {
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
    pub(super) fn banner(&mut self) -> Result<Vec<String>, Failure> {
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
        banner_words(line).map_err(|ProtocolMismatch { theirs }| {
            Failure::new(
                exit::OTHER,
                anyhow::anyhow!(
                    "the hurtle on {} ({}) speaks ssh protocol {theirs}, this one (hurtle {}) \
                     speaks {PROTOCOL}: install the same hurtle version on both hosts",
                    self.destination,
                    self.remote_hurtle,
                    env!("CARGO_PKG_VERSION")
                ),
            )
        })
    }

    /// While a pull's direct session runs: the far sender's word that its session could not
    /// get its data through (`ssh WHY`), if it has come; returns WHY. The reading thread then
    /// waits for [`Far::start_mux`]. Other lines are passed over.
    pub(super) fn retry_word(&mut self) -> Result<Option<String>, Failure> {
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
    pub(super) fn end_direct(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"end\n").and_then(|()| s.flush());
        }
    }

    /// After a banner: reads on, line by line.
    pub(super) fn read_on(&mut self) {
        let _ = self.resume.send(true);
    }

    /// After a banner: this side's end of a mux over the far side's stdout and stdin, which it
    /// owns from now on. `accept`: connect the streams the far side opens (a pull).
    pub(super) fn start_mux(&mut self, accept: Option<Accept>) -> Result<Mux, Failure> {
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
    pub(super) fn tell(&mut self, line: &str) -> Result<(), Failure> {
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
    pub(super) fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// After a session that succeeded here: lets the far side end by itself (it may still be
    /// finishing, e.g. the receiver setting directories' modes after the last file was
    /// confirmed; closing its stdin first would cut that short), then closes its stdin. Warns
    /// when it ended with an error.
    pub(super) fn finish(&mut self, out: &OutputArgs) {
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
    pub(super) fn wait(&mut self) -> Option<ExitStatus> {
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
    pub(super) fn failure(&mut self) -> Failure {
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

/// A session's failure on this side; when it is the network's (the peer gone, a connection
/// refused) and ssh ended with an error, ssh's or the far side's reason is the one to show.
pub(super) fn near_failure(
    e: SessionError,
    receiver: bool,
    progress: &Progress,
    far: &mut Far,
) -> Failure {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
