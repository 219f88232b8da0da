//! `--no-encryption` end to end, through a proxy that changes data on the way
//! (`support::proxy`, `ProxyConfig::change_first`): data datagrams then carry no tag, so a
//! block whose bytes an on-path attacker replaced comes back with the same wrong value each
//! time. It must be fetched again, never taken for a changed source (which ends the transfer);
//! with encryption on, only the peer can have sent it, and a repeated wrong value still means
//! the source changed.
//!
//! The proxy changes the same bytes of the block each time (the file's first
//! `support::proxy::CHANGED_BYTES`), whatever the size of the datagram that carries them, so
//! each changed copy that reaches verification gives the same wrong value. Not every copy it
//! changes reaches verification: a repair's second copy (the sender's tail sends repairs
//! twice) may arrive while the block is still held, and is dropped as a duplicate. The first
//! copy sent and the first repair after the first failure always do.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use support::proc::{self, start_receiver};
use support::proxy::{Proxy, ProxyConfig, Stats};
use support::{fsx, TRANSFER_TIMEOUT};

const MIB: u64 = 1 << 20;
/// Times file 0's first datagram is changed on the way: more than the once that a changed
/// source is allowed, fewer than `MAX_BLOCK_FAILURES` (8).
const CHANGES: u64 = 3;

#[test]
fn data_changed_on_the_way_in_the_clear_is_fetched_again_not_blamed_on_the_source() {
    let t = support::tempdir("hurtle-clear-");
    let src = t.path().join("src/clear.bin");
    fsx::write_random(&src, 3 * MIB, 71);
    for plain in [true, false] {
        let out = t.path().join(format!("out-{plain}"));
        let flag = plain.then_some("--no-encryption");
        let rargs: Vec<&str> = ["--json"].into_iter().chain(flag).collect();
        let r = start_receiver(&out, &rargs);
        let cfg = ProxyConfig {
            seed: 71,
            change_first: CHANGES,
            ..ProxyConfig::default()
        };
        let proxy = Proxy::start(r.addr, cfg);
        let sargs: Vec<&str> = ["--json", "--channels", "2", "--rate", "100M"]
            .into_iter()
            .chain(flag)
            .collect();
        let s = proc::send(proxy.addr(), &[&src], &sargs);
        let recv = r.proc.wait(TRANSFER_TIMEOUT);
        let changed = Stats::get(&proxy.stats().changed);
        if plain {
            // Two failures at least, so three copies sent at least: every change happened.
            assert_eq!(
                changed, CHANGES,
                "the proxy changed file 0's first bytes {CHANGES} times"
            );
            s.assert_success();
            recv.assert_success();
            fsx::assert_same_file(&src, &out.join("clear.bin"));
            let v = recv.json();
            assert_eq!(v["encrypted"], false, "{v}");
            let rejected = v["rejected_blocks"].as_u64().expect("rejected_blocks");
            assert!(
                (2..=CHANGES).contains(&rejected),
                "the changed block failed verification and was fetched again each time: {v}"
            );
        } else {
            // The second copy to reach verification ends it: the third change happens only if
            // the sender sent those bytes again before it heard. Fewer wrong copies than
            // `MAX_BLOCK_FAILURES` (8): only their being the same can have ended it.
            assert!(
                (2..=CHANGES).contains(&changed),
                "the proxy changed file 0's first bytes {changed} times"
            );
            let err = recv.assert_failure();
            assert!(err.contains("did the source change?"), "{err}");
            assert!(!out.join("clear.bin").exists());
            s.assert_failure();
        }
    }
}
