//! End-to-end tests of the data key's limits (`hurtle_proto::secure`, sealing): a transfer that
//! outlives several key epochs arrives byte-exact, encrypted and with `--no-encryption` (frames
//! then authenticated only).
//!
//! One channel and 512-byte payloads make each epoch (`EPOCH_PACKETS` numbers of a channel)
//! 8 MiB of file, so a 24 MiB file crosses at least two key updates; the sender's summary
//! shows that the channel's packet numbers went past them.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::secure::EPOCH_PACKETS;
use support::proc::{self, start_receiver};
use support::{fsx, TRANSFER_TIMEOUT};

#[test]
fn a_transfer_across_key_epochs_arrives_byte_exact_encrypted_or_not() {
    let t = support::tempdir("hurtle-aead-");
    let src = t.path().join("epochs.bin");
    let size: u64 = 24 << 20;
    fsx::write_random(&src, size, 61);
    for encrypt in [true, false] {
        let out = t.path().join(format!("out-{encrypt}"));
        let plain = if encrypt {
            None
        } else {
            Some("--no-encryption")
        };
        let rargs: Vec<&str> = ["--json"].into_iter().chain(plain).collect();
        let r = start_receiver(&out, &rargs);
        let sargs: Vec<&str> = [
            "--json",
            "--channels",
            "1",
            "--payload",
            "512",
            "--transport",
            "udp",
        ]
        .into_iter()
        .chain(plain)
        .collect();
        let s = proc::send(r.addr, &[&src], &sargs);
        s.assert_success();
        let recv = r.proc.wait(TRANSFER_TIMEOUT);
        recv.assert_success();
        fsx::assert_same_file(&src, &out.join("epochs.bin"));
        let v = s.json();
        assert_eq!(v["encrypted"], encrypt, "{v}");
        assert_eq!(recv.json()["encrypted"], encrypt);
        let sent = v["datagrams_sent"].as_u64().expect("datagrams_sent");
        assert!(
            sent > 2 * EPOCH_PACKETS,
            "one channel's {sent} datagrams cross two key updates ({v})"
        );
    }
}
