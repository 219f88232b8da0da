//! A sender never changes the mode of a directory that was already on the receiver (`~/.ssh`,
//! 0700) unless the receiver runs with `--overwrite`: `send`/`receive` end to end, on
//! loopback. (`hurtle cp`'s push and pull are tested against a real sshd in ssh.rs.)

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use support::fsx;
use support::proc::{self, start_receiver};
use support::TRANSFER_TIMEOUT;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Sends `home` (whose `.ssh` is 0755 and holds `file`) to a receiver into `out`, with the
/// receiver's `extra` flags.
fn send_home(home: &Path, file: &str, out: &Path, extra: &[&str]) {
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh").join(file), file.as_bytes()).unwrap();
    fsx::set_mode(&home.join(".ssh"), 0o755);
    let r = start_receiver(out, extra);
    proc::send(r.addr, &[home], &["--channels", "2"]).assert_success();
    r.proc.wait(TRANSFER_TIMEOUT).assert_success();
}

#[test]
fn an_existing_directory_keeps_its_mode_unless_the_receiver_overwrites() {
    let t = support::tempdir("hurtle-modes-");
    let home = t.path().join("src/home");
    let out = t.path().join("out");
    // The receiver's own .ssh, 0700, where the sender's tree puts one of 0755.
    std::fs::create_dir_all(out.join("home/.ssh")).unwrap();
    fsx::set_mode(&out.join("home/.ssh"), 0o700);

    send_home(&home, "known_hosts", &out, &[]);
    assert!(out.join("home/.ssh/known_hosts").is_file());
    assert_eq!(mode(&out.join("home/.ssh")), 0o700, "the sender changed it");

    // --overwrite: the receiver replaces what exists, the directory's mode too.
    send_home(&home, "config", &out, &["--overwrite"]);
    assert!(out.join("home/.ssh/config").is_file());
    assert_eq!(mode(&out.join("home/.ssh")), 0o755);

    // A directory the transfer creates takes the sender's mode.
    let fresh = t.path().join("fresh");
    send_home(&home, "more", &fresh, &[]);
    assert_eq!(mode(&fresh.join("home/.ssh")), 0o755);
}
