//! Network namespaces for tests that need a second host (root): made with `ip netns add`,
//! removed when the guard is dropped, however the test ends.
#![allow(dead_code)] // not every test binary uses it

use std::process::Command;

/// Namespaces removed when dropped.
pub struct Namespaces {
    /// Their names, in the order they were added.
    pub names: Vec<String>,
}

impl Namespaces {
    /// Adds a namespace named `name` with its loopback up, removed with the others on drop.
    pub fn add(&mut self, name: &str) {
        ip(&["netns", "add", name]);
        self.names.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"]);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Runs `ip ARGS`; fails the test with its message if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The packets counted by the first `counter` in an `nft list ...` listing (0 if none).
pub fn nft_packets(listing: &str) -> u64 {
    listing
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
