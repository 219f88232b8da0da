//! Running the `hurtle` binary: every process is collected with a deadline and killed (by its
//! own `Child` handle) if it overstays or the test ends early.

use std::ffi::OsStr;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hurtle")
}

/// A running `hurtle` process whose stdout and stderr are collected in the background. Dropping
/// it kills the process if it still runs and reaps it.
pub struct Proc {
    name: String,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// How a process ended.
#[derive(Debug)]
pub struct Finished {
    /// Label given at spawn, for messages.
    pub name: String,
    /// Exit status.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

fn collect(mut r: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        // Ends at EOF, i.e. when the process exits (or is killed).
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut s = into.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

impl Proc {
    /// Starts `hurtle ARGS`, labelled `name` in failure messages.
    pub fn spawn<S: AsRef<OsStr>>(name: &str, args: &[S]) -> Proc {
        Proc::spawn_program(name, bin(), args)
    }

    /// Starts `PROGRAM ARGS` (e.g. `ip netns exec NS hurtle ...`), labelled `name`.
    pub fn spawn_program<S: AsRef<OsStr>>(name: &str, program: &str, args: &[S]) -> Proc {
        let mut cmd = Command::new(program);
        cmd.args(args);
        Proc::start(name, cmd)
    }

    /// Starts `hurtle ARGS` with these environment variables added, labelled `name`.
    #[allow(dead_code)] // not every test binary uses it
    pub fn spawn_env<S: AsRef<OsStr>>(name: &str, args: &[S], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(bin());
        cmd.args(args).envs(env.iter().copied());
        Proc::start(name, cmd)
    }

    fn start(name: &str, mut cmd: Command) -> Proc {
        // Every session is authenticated: both ends get the same code unless a test says
        // otherwise (the tests of codes and keys set their own).
        if !cmd.get_envs().any(|(k, _)| k == "HURTLE_CODE") {
            cmd.env("HURTLE_CODE", super::TEST_CODE);
        }
        // A sender does not wait for a receiver that is not there (the default is 60 s),
        // unless a test says otherwise: a test of a refusal gets it at once.
        if !cmd.get_envs().any(|(k, _)| k == "HURTLE_WAIT") {
            cmd.env("HURTLE_WAIT", "0");
        }
        // Every start is a cold one, and nothing is kept in the user's cache, unless a test
        // names a file for the path memories.
        if !cmd.get_envs().any(|(k, _)| k == "HURTLE_PATH_MEMORY") {
            cmd.env("HURTLE_PATH_MEMORY", "off");
        }
        // Nor block values (a sender's cache for resuming), unless a test names a directory.
        if !cmd.get_envs().any(|(k, _)| k == "HURTLE_VALUE_CACHE") {
            cmd.env("HURTLE_VALUE_CACHE", "off");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().expect("piped stdout"), stdout.clone()),
            collect(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        Proc {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            readers,
            status: None,
        }
    }

    /// The process id.
    #[allow(dead_code)] // not every test binary uses it
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status.is_none()
    }

    /// Polls the output (stdout, stderr) until `pick` returns a value; fails the test after
    /// `timeout` or if the process exits first. While the process runs, `pick` sees only
    /// complete lines: a line can reach the pipe in several writes (Rust's stderr is
    /// unbuffered), and half a line ("code: 2330" of "code: 2330-purple-sausage") must not be
    /// taken for the whole.
    pub fn wait_for_output<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&str, &str) -> Option<T>,
    ) -> T {
        fn complete(text: &str) -> &str {
            text.rfind('\n').map_or("", |end| &text[..=end])
        }
        let deadline = Instant::now() + timeout;
        loop {
            let (out, err) = (self.stdout(), self.stderr());
            if let Some(v) = pick(complete(&out), complete(&err)) {
                return v;
            }
            if !self.is_running() {
                // Output may still be in flight: one last look after the readers drain.
                self.join_readers();
                if let Some(v) = pick(&self.stdout(), &self.stderr()) {
                    return v;
                }
                panic!(
                    "{} exited ({:?}) before {what}\nstdout:\n{}\nstderr:\n{}",
                    self.name,
                    self.status,
                    self.stdout(),
                    self.stderr()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} did not show {what} within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                    self.name,
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Proc::wait_for_output`] for the first complete line of its standard error that
    /// contains `needle`: that line.
    #[allow(dead_code)] // not every test binary uses it
    pub fn wait_for_log_line(&mut self, what: &str, timeout: Duration, needle: &str) -> String {
        self.wait_for_output(what, timeout, |_, e| {
            e.lines().find(|l| l.contains(needle)).map(str::to_owned)
        })
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    fn finished(&mut self) -> Finished {
        self.join_readers();
        Finished {
            name: self.name.clone(),
            status: self.status.expect("process has exited"),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }

    /// Waits for the process to exit; after `timeout` kills it and fails the test with its
    /// output.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                self.kill_now();
                let f = self.finished();
                panic!(
                    "{} still running after {timeout:?}; killed it\nstdout:\n{}\nstderr:\n{}",
                    f.name, f.stdout, f.stderr
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.finished()
    }

    /// Kills the process (if it still runs) and returns how it ended.
    pub fn kill(mut self) -> Finished {
        self.kill_now();
        self.finished()
    }

    fn kill_now(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            self.status = Some(self.child.wait().expect("wait after kill"));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

impl Finished {
    /// Fails the test unless the process exited with status 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "{} failed ({})\nstdout:\n{}\nstderr:\n{}",
            self.name,
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Fails the test unless the process exited non-zero with exactly one `hurtle: error:` line
    /// on stderr; returns that line's message.
    pub fn assert_failure(&self) -> String {
        assert!(
            !self.status.success() && self.status.code().is_some(),
            "{} should have exited non-zero by itself, got {}\nstdout:\n{}\nstderr:\n{}",
            self.name,
            self.status,
            self.stdout,
            self.stderr
        );
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter_map(|l| l.strip_prefix("hurtle: error: "))
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{} should print exactly one one-line cause\nstderr:\n{}",
            self.name,
            self.stderr
        );
        errors[0].to_owned()
    }

    /// Fails the test unless the process exited with `code` and one `hurtle: error:` line;
    /// returns that line's message.
    #[allow(dead_code)] // not every test binary uses it
    pub fn assert_exit(&self, code: i32) -> String {
        let cause = self.assert_failure();
        assert_eq!(
            self.status.code(),
            Some(code),
            "{} should exit {code}: {cause}",
            self.name
        );
        cause
    }

    /// The JSON summary printed on stdout with `--json`.
    pub fn json(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .rfind(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("{}: no JSON on stdout:\n{}", self.name, self.stdout));
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}: bad JSON ({e}): {line}", self.name))
    }
}

/// A `hurtle receive` process and the address it listens on.
pub struct ReceiverProc {
    /// The process.
    pub proc: Proc,
    /// Its control address, parsed from its "listening on" line.
    pub addr: SocketAddr,
    /// Its `--out` directory.
    pub out: PathBuf,
}

/// Parses the address from "hurtle: listening on ADDR, receiving into DIR".
fn listening_addr(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("hurtle: listening on ")?;
        rest.split(", receiving into").next()?.parse().ok()
    })
}

/// Starts `hurtle receive --listen 127.0.0.1:0 --out OUT EXTRA...` and waits for its address.
pub fn start_receiver(out: &Path, extra: &[&str]) -> ReceiverProc {
    start_receiver_at("127.0.0.1:0", out, extra)
}

/// Starts `hurtle receive --listen LISTEN --out OUT EXTRA...` and waits for its address.
pub fn start_receiver_at(listen: &str, out: &Path, extra: &[&str]) -> ReceiverProc {
    let args = receive_args(listen, out, extra);
    await_receiver(Proc::spawn("receiver", &args), out)
}

/// Like [`start_receiver`], under `sh` with `ulimit LIMIT` (e.g. `-n 64`) applied first.
pub fn start_receiver_under_ulimit(limit: &str, out: &Path, extra: &[&str]) -> ReceiverProc {
    let script = format!("ulimit {limit} && exec \"$0\" \"$@\"");
    let mut args: Vec<&OsStr> = vec!["-c".as_ref(), script.as_ref(), bin().as_ref()];
    args.extend(receive_args("127.0.0.1:0", out, extra));
    await_receiver(Proc::spawn_program("receiver", "sh", &args), out)
}

fn receive_args<'a>(listen: &'a str, out: &'a Path, extra: &[&'a str]) -> Vec<&'a OsStr> {
    let mut args: Vec<&OsStr> = vec![
        "receive".as_ref(),
        "--listen".as_ref(),
        listen.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(|s| OsStr::new(*s)));
    args
}

/// Waits for a starting receiver to print its listening address.
fn await_receiver(mut proc: Proc, out: &Path) -> ReceiverProc {
    let addr = proc.wait_for_output("its listening address", Duration::from_secs(10), |o, e| {
        listening_addr(o).or_else(|| listening_addr(e))
    });
    ReceiverProc {
        proc,
        addr,
        out: out.to_path_buf(),
    }
}

/// Arguments of `hurtle send PATHS --to ADDR EXTRA...`.
pub fn send_args<P: AsRef<Path>>(to: SocketAddr, paths: &[P], extra: &[&str]) -> Vec<String> {
    let mut args = vec!["send".to_owned()];
    args.extend(paths.iter().map(|p| p.as_ref().display().to_string()));
    args.push("--to".into());
    args.push(to.to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `hurtle send PATHS --to ADDR EXTRA...` to completion (bounded by [`TRANSFER_TIMEOUT`]).
///
/// [`TRANSFER_TIMEOUT`]: super::TRANSFER_TIMEOUT
pub fn send<P: AsRef<Path>>(to: SocketAddr, paths: &[P], extra: &[&str]) -> Finished {
    Proc::spawn("sender", &send_args(to, paths, extra)).wait(super::TRANSFER_TIMEOUT)
}

/// An ssh stand-in in `dir` for `hurtle cp -e`: drops the destination and runs the far side's
/// command here, with the `SSH_CONNECTION` sshd would set (and says nothing for `ssh -G`).
#[allow(dead_code)] // not every test binary uses it
pub fn fake_ssh(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("fake-ssh");
    std::fs::write(
        &p,
        "#!/bin/sh\n[ \"$1\" = -G ] && exit 1\nshift\nSSH_CONNECTION=\"127.0.0.1 40000 127.0.0.1 22\" exec sh -c \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Runs `hurtle cp -e SSH --remote-hurtle BIN --channels 2 ARGS...` to completion (bounded by
/// [`TRANSFER_TIMEOUT`]), the far side through `ssh` (a [`fake_ssh`]).
///
/// [`TRANSFER_TIMEOUT`]: super::TRANSFER_TIMEOUT
#[allow(dead_code)] // not every test binary uses it
pub fn cp(ssh: &Path, args: &[&str]) -> Finished {
    let mut all = vec![
        "cp",
        "-e",
        ssh.to_str().unwrap(),
        "--remote-hurtle",
        bin(),
        "--channels",
        "2",
    ];
    all.extend_from_slice(args);
    Proc::spawn("cp", &all).wait(super::TRANSFER_TIMEOUT)
}

/// Sends the file `src` into `out` to the end: a new receiver (`--json`), and `hurtle send
/// --json EXTRA...` with these environment variables; checks that both succeeded, that the
/// file arrived byte-exact and that no part file is left, and returns the sender's and the
/// receiver's JSON summaries.
#[allow(dead_code)] // not every test binary uses it
pub fn send_whole(
    src: &Path,
    out: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (serde_json::Value, serde_json::Value) {
    let r = start_receiver(out, &["--json"]);
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let s = send_env(r.addr, &[src], &args, env);
    s.assert_success();
    let rj = r.proc.wait(super::TRANSFER_TIMEOUT).assert_success().json();
    super::fsx::assert_same_file(src, &out.join(src.file_name().unwrap()));
    super::fsx::assert_no_part_files(out);
    (s.json(), rj)
}

/// [`start_receiver`] with these environment variables (e.g. `HURTLE_CODE` empty: no code
/// given, so the receiver makes and prints one).
#[allow(dead_code)] // not every test binary uses it
pub fn start_receiver_env(out: &Path, extra: &[&str], env: &[(&str, &str)]) -> ReceiverProc {
    let args = receive_args("127.0.0.1:0", out, extra);
    await_receiver(Proc::spawn_env("receiver", &args, env), out)
}

/// [`send`] with these environment variables.
#[allow(dead_code)] // not every test binary uses it
pub fn send_env<P: AsRef<Path>>(
    to: SocketAddr,
    paths: &[P],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Finished {
    Proc::spawn_env("sender", &send_args(to, paths, extra), env).wait(super::TRANSFER_TIMEOUT)
}
