//! End-to-end tests of authentication and encryption (`hurtle_proto::secure`, the engine's
//! `agree`): codes, keys, `--no-encryption`, and a man in the middle with its own key.
//!
//! - a receiver prints a new code, and a sender that gives it gets through, encrypted;
//! - wrong codes: each sender fails (exit 3) before sending anything, the receiver waits on,
//!   and the third spends the code (receiver exit 3); nothing is written;
//! - keys: a served receiver takes a sender with an authorized key and turns away one with
//!   another key or a code, and keeps serving;
//! - `--no-encryption` takes both sides;
//! - a man in the middle who runs the key agreement with each side (as a relay that
//!   substitutes its own key would) gets nothing through, and both sides say so.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use hurtle_proto::secure::{answer, Offer, Secret};
use hurtle_proto::wire::Control;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;
use support::peer::read_frame;
use support::proc::{self, start_receiver, start_receiver_env, Proc};
use support::{fsx, TRANSFER_TIMEOUT};

fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-auth-")
}

/// Whether `dir` holds nothing (or does not exist).
fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

#[test]
fn a_printed_code_lets_its_sender_through_encrypted() {
    let t = tmp();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 2 << 20, 51);
    let out = t.path().join("out");
    // No code given: the receiver makes one and prints it.
    let mut r = start_receiver_env(&out, &["--json"], &[("HURTLE_CODE", "")]);
    let code = r
        .proc
        .wait_for_output("its code", Duration::from_secs(10), |_, e| {
            e.lines()
                .find_map(|l| l.strip_prefix("code: "))
                .map(str::to_owned)
        });
    assert_eq!(
        code.split('-').count(),
        4,
        "a number and three words: {code}"
    );
    // Without it, the sender is told to give one (exit 2) and connects nowhere.
    let s = proc::send_env(r.addr, &[&src], &[], &[("HURTLE_CODE", "")]);
    assert!(s.assert_exit(2).contains("--code"), "{}", s.stderr);
    let s = proc::send_env(
        r.addr,
        &[&src],
        &["--json", "--code", &code],
        &[("HURTLE_CODE", "")],
    );
    s.assert_success();
    assert_eq!(s.json()["encrypted"], true, "{}", s.stdout);
    let recv = r.proc.wait(TRANSFER_TIMEOUT);
    recv.assert_success();
    assert_eq!(recv.json()["encrypted"], true);
    fsx::assert_same_file(&src, &out.join("a.bin"));
}

#[test]
fn wrong_codes_fail_before_anything_is_sent_and_the_third_spends_the_code() {
    let t = tmp();
    let src = t.path().join("secret.bin");
    fsx::write_random(&src, 300_000, 52);
    let out = t.path().join("out");
    let mut r = start_receiver(&out, &["--code", "1111-maple-otter-quilt"]);
    for i in 0..3 {
        let s = proc::send(r.addr, &[&src], &["--code", "1111-maple-otter-robin"]);
        let why = s.assert_exit(3);
        assert!(why.contains("does not hold this code"), "{why}");
        assert!(
            why.contains("nothing was sent"),
            "the sender says nothing left: {why}"
        );
        if i < 2 {
            std::thread::sleep(Duration::from_millis(200));
            assert!(r.proc.is_running(), "a wrong code ended the receiver");
        }
    }
    let recv = r.proc.wait(Duration::from_secs(10));
    let why = recv.assert_exit(3);
    assert!(why.contains("tried 3 times"), "{why}");
    assert!(empty(&out), "something was written");
}

#[test]
fn keys_let_authorized_senders_in_and_keep_others_out() {
    let t = tmp();
    let keygen = |name: &str| {
        let path = t.path().join(name);
        let k = Proc::spawn("keygen", &["keygen", "--out", path.to_str().unwrap()])
            .wait(Duration::from_secs(10));
        k.assert_success();
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "key file mode");
        path
    };
    let alice = keygen("alice.key");
    let bob = keygen("bob.key");
    let authorized = t.path().join("authorized");
    let alice_key = std::fs::read_to_string(&alice).unwrap();
    std::fs::write(
        &authorized,
        format!("# who may send\n{} alice\n", alice_key.trim()),
    )
    .unwrap();
    // It holds secrets: only its owner may read it (else it is refused, as ssh refuses a key).
    let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
    std::fs::set_permissions(&authorized, private).unwrap();
    let src = t.path().join("k.bin");
    fsx::write_random(&src, 500_000, 53);
    let out = t.path().join("out");
    let mut r = start_receiver_env(
        &out,
        &["--serve", "--keys", authorized.to_str().unwrap()],
        &[("HURTLE_CODE", "")],
    );
    // Bob's key, and a code: turned away, nothing written, the receiver serves on.
    let s = proc::send_env(
        r.addr,
        &[&src],
        &["--key", bob.to_str().unwrap()],
        &[("HURTLE_CODE", "")],
    );
    assert!(
        s.assert_exit(3).contains("does not know key"),
        "{}",
        s.stderr
    );
    let s = proc::send(r.addr, &[&src], &[]);
    assert!(
        s.assert_exit(3).contains("does not know key"),
        "{}",
        s.stderr
    );
    assert!(
        empty(&out),
        "something was written for a sender without an authorized key"
    );
    assert!(r.proc.is_running());
    // Alice's key: in, and the log names her.
    proc::send_env(
        r.addr,
        &[&src],
        &["--key", alice.to_str().unwrap()],
        &[("HURTLE_CODE", "")],
    )
    .assert_success();
    fsx::assert_same_file(&src, &out.join("k.bin"));
    let line = r.proc.wait_for_log_line(
        "the refusals logged",
        Duration::from_secs(10),
        "not authorized here",
    );
    assert!(
        line.contains("127.0.0.1"),
        "the log names who tried: {line}"
    );
    let came =
        r.proc
            .wait_for_log_line("alice named", Duration::from_secs(10), "authenticated with");
    assert!(
        came.contains("authenticated with alice"),
        "the log names the key's owner: {came}"
    );
    assert!(r.proc.is_running());
    r.proc.kill();
}

#[test]
fn no_encryption_takes_both_sides() {
    let t = tmp();
    let src = t.path().join("p.bin");
    fsx::write_random(&src, 400_000, 54);
    for (sender, receiver, want) in [(true, false, true), (true, true, false)] {
        let out = t.path().join(format!("out-{sender}-{receiver}"));
        let mut rargs = vec!["--json"];
        if receiver {
            rargs.push("--no-encryption");
        }
        let r = start_receiver(&out, &rargs);
        let mut sargs = vec!["--json"];
        if sender {
            sargs.push("--no-encryption");
        }
        let s = proc::send(r.addr, &[&src], &sargs);
        s.assert_success();
        let recv = r.proc.wait(TRANSFER_TIMEOUT);
        recv.assert_success();
        assert_eq!(
            s.json()["encrypted"],
            want,
            "sender {sender} receiver {receiver}"
        );
        assert_eq!(recv.json()["encrypted"], want);
        fsx::assert_same_file(&src, &out.join("p.bin"));
    }
}

/// A man in the middle between a sender and the receiver at `receiver`, who holds `guess`
/// (not the code): it answers the sender's agreement and offers its own to the receiver.
fn man_in_the_middle(receiver: SocketAddr, guess: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((mut from_sender, _)) = listener.accept() else {
            return;
        };
        from_sender
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let secret = Secret::code(guess);
        // Towards the receiver: its own offer.
        if let Ok(mut to_receiver) = TcpStream::connect(receiver) {
            to_receiver
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let hello = Control::hello(0, 1, hurtle_proto::wire::DEFAULT_PAYLOAD, 1 << 20, 1);
            let (offer, first) = Offer::new(&secret, false, &hello);
            let _ = to_receiver.write_all(&first.to_frame());
            let _ = to_receiver.write_all(&hello.to_frame());
            if let Some(reply) = read_frame(&mut to_receiver) {
                assert!(offer.finish(reply).is_err(), "the guess was right");
            }
        }
        // Towards the sender: its own answer.
        if let (Some(first), Some(hello)) =
            (read_frame(&mut from_sender), read_frame(&mut from_sender))
        {
            if let Ok((_, reply)) = answer(&secret, &first, &hello, false) {
                let _ = from_sender.write_all(&reply.to_frame());
            }
        }
        // Whatever the sender sends next is kept until it hangs up.
        let mut rest = Vec::new();
        let _ = from_sender.read_to_end(&mut rest);
    });
    addr
}

#[test]
fn a_man_in_the_middle_with_its_own_key_gets_nothing_through() {
    let t = tmp();
    let src = t.path().join("m.bin");
    fsx::write_random(&src, 300_000, 55);
    let out = t.path().join("out");
    let mut r = start_receiver(&out, &[]);
    let mitm = man_in_the_middle(r.addr, "9999-guessed-by-relay");
    let s = proc::send(mitm, &[&src], &[]);
    let why = s.assert_exit(3);
    assert!(why.contains("does not hold this code"), "{why}");
    let line = r.proc.wait_for_log_line(
        "the failed agreement logged",
        Duration::from_secs(10),
        "failed the key agreement",
    );
    assert!(line.contains("does not hold"), "{line}");
    assert!(
        r.proc.is_running(),
        "one failed agreement ended the receiver"
    );
    assert!(empty(&out));
    r.proc.kill();
}

#[test]
fn a_served_receiver_with_only_a_code_ends_when_the_code_is_spent() {
    let t = tmp();
    let src = t.path().join("s.bin");
    fsx::write_random(&src, 100_000, 56);
    let out = t.path().join("out");
    let r = start_receiver(&out, &["--serve", "--code", "2222-maple-otter-quilt"]);
    for _ in 0..3 {
        let s = proc::send(r.addr, &[&src], &["--code", "2222-maple-otter-robin"]);
        s.assert_exit(3);
    }
    let recv = r.proc.wait(Duration::from_secs(10));
    assert!(
        recv.assert_exit(3).contains("tried 3 times"),
        "{}",
        recv.stderr
    );
    // The right code no longer opens anything: the receiver is gone.
    let s = proc::send(r.addr, &[&src], &["--code", "2222-maple-otter-quilt"]);
    assert_ne!(s.status.code(), Some(0));
    assert!(empty(&out));
}
