//! End-to-end tests of identities without shared secrets (docs/identity.md): `hurtle keygen
//! --identity`, a receiver with `--identity` and `--authorized`, a sender with `--identity`
//! that pins the receiver in its known-receivers file.
//!
//! - an authorized sender gets in with no code or key; its first transfer pins the receiver
//!   and warns, the second is silent about it;
//! - a sender whose identity the receiver does not list is turned away (exit 3), nothing
//!   written, and the receiver serves on;
//! - a receiver at an address pinned with another key (a man in the middle with an identity
//!   key of its own, who authorizes the sender's public key) is refused by the sender (exit
//!   9), naming both fingerprints and the line to remove; nothing is sent;
//! - key files (identity keys, `--key`, `--keys`) readable by group or others, and an
//!   authorized file they may write, are refused (exit 2) with the `chmod` that fixes them.

#[allow(dead_code)] // shared with the other test binaries
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::proc::{self, start_receiver_env, Proc};
use support::{fsx, TRANSFER_TIMEOUT};

fn tmp() -> tempfile::TempDir {
    support::tempdir("hurtle-identity-")
}

/// `hurtle keygen --identity --out DIR/NAME`: the key file, its public key line, and the
/// fingerprint keygen printed.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String, String) {
    let path = dir.join(name);
    let k = Proc::spawn(
        "keygen",
        &["keygen", "--identity", "--out", path.to_str().unwrap()],
    )
    .wait(Duration::from_secs(10));
    k.assert_success();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "identity key file mode");
    let public = k.stdout.trim().to_string();
    assert!(public.starts_with("hurtle-id-"), "{}", k.stdout);
    let fingerprint = k
        .stderr
        .split("fingerprint ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no fingerprint in {}", k.stderr))
        .to_string();
    assert!(fingerprint.starts_with("SHA256:"), "{fingerprint}");
    (path, public, fingerprint)
}

/// Writes a file of public keys, writable by its owner only (whatever the umask), as the
/// receiver wants its authorized file.
fn write_public(path: &Path, text: String) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A served receiver with identity `id` that authorizes the senders of `authorized`.
fn serve(out: &Path, id: &Path, authorized: &Path) -> proc::ReceiverProc {
    start_receiver_env(
        out,
        &[
            "--serve",
            "--identity",
            arg(id),
            "--authorized",
            arg(authorized),
        ],
        &[("HURTLE_CODE", "")],
    )
}

fn send(r: &proc::ReceiverProc, src: &Path, id: &Path, known: &Path) -> proc::Finished {
    proc::send_env(
        r.addr,
        &[src],
        &["--identity", arg(id), "--known-receivers", arg(known)],
        &[("HURTLE_CODE", "")],
    )
}

#[test]
fn an_authorized_sender_gets_in_and_pins_the_receiver_on_first_use() {
    let t = tmp();
    let (receiver_id, receiver_pub, receiver_fp) = keygen(t.path(), "receiver.id");
    let (alice, alice_pub, _) = keygen(t.path(), "alice.id");
    let (mallory, _, _) = keygen(t.path(), "mallory.id");
    let authorized = t.path().join("authorized");
    write_public(&authorized, format!("# senders\n{alice_pub} alice\n")).unwrap();
    let out = t.path().join("out");
    let mut r = serve(&out, &receiver_id, &authorized);
    let known = t.path().join("config/known_receivers");

    // First use: in, and the receiver's key is pinned under its address, with a warning.
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 700_000, 61);
    let s = send(&r, &src, &alice, &known);
    s.assert_success();
    assert!(
        s.stderr.contains("first transfer to the receiver") && s.stderr.contains(&receiver_fp),
        "{}",
        s.stderr
    );
    fsx::assert_same_file(&src, &out.join("a.bin"));
    let pinned = std::fs::read_to_string(&known).unwrap();
    assert_eq!(pinned, format!("{} {receiver_pub}\n", r.addr));

    // Second use: in, nothing said about the key, nothing added.
    let src2 = t.path().join("b.bin");
    fsx::write_random(&src2, 300_000, 62);
    let s = send(&r, &src2, &alice, &known);
    s.assert_success();
    assert!(!s.stderr.contains("pinned"), "{}", s.stderr);
    fsx::assert_same_file(&src2, &out.join("b.bin"));
    assert_eq!(std::fs::read_to_string(&known).unwrap(), pinned);

    // An identity the receiver does not list: turned away, nothing written, serving on.
    let src3 = t.path().join("m.bin");
    fsx::write_random(&src3, 100_000, 63);
    let s = send(&r, &src3, &mallory, &known);
    assert!(
        s.assert_exit(3).contains("does not know key"),
        "{}",
        s.stderr
    );
    assert!(!out.join("m.bin").exists(), "an unauthorized sender wrote");
    assert!(r.proc.is_running(), "a stranger ended the receiver");
    let line = r.proc.wait_for_log_line(
        "the refusal logged",
        Duration::from_secs(10),
        "not authorized here",
    );
    assert!(
        line.contains("127.0.0.1"),
        "the log names who tried: {line}"
    );
    let came = r.proc.stderr();
    assert!(came.contains("authenticated with alice"), "{came}");
    r.proc.kill();
}

#[test]
fn a_receiver_that_proves_another_key_than_the_pinned_one_is_refused() {
    let t = tmp();
    let (receiver_id, _, receiver_fp) = keygen(t.path(), "receiver.id");
    let (mitm_id, _, mitm_fp) = keygen(t.path(), "mitm.id");
    let (alice, alice_pub, _) = keygen(t.path(), "alice.id");
    let authorized = t.path().join("authorized");
    write_public(&authorized, format!("{alice_pub} alice\n")).unwrap();
    let known = t.path().join("known_receivers");
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 200_000, 64);

    // The real receiver, pinned by a first transfer.
    let real_out = t.path().join("real");
    let real = serve(&real_out, &receiver_id, &authorized);
    send(&real, &src, &alice, &known).assert_success();
    real.proc.kill();

    // Someone else answers at that address: a man in the middle with an identity key of its
    // own, who knows (and authorizes) alice's public key. The test points the pinned line at
    // its address, as a redirection of the real receiver's traffic would.
    let out = t.path().join("out");
    let mut mitm = serve(&out, &mitm_id, &authorized);
    let pinned = std::fs::read_to_string(&known).unwrap();
    std::fs::write(
        &known,
        format!(
            "# receivers\n{}",
            pinned.replace(&real.addr.to_string(), &mitm.addr.to_string())
        ),
    )
    .unwrap();
    let s = send(&mitm, &src, &alice, &known);
    let why = s.assert_exit(9);
    for needle in [
        receiver_fp.as_str(),
        mitm_fp.as_str(),
        "line 2",
        known.to_str().unwrap(),
        "nothing was sent",
    ] {
        assert!(why.contains(needle), "{needle:?} not in: {why}");
    }
    assert!(
        !out.join("a.bin").exists(),
        "the man in the middle got the file"
    );
    assert!(mitm.proc.is_running());
    // The pinned line is left as it was.
    assert!(std::fs::read_to_string(&known)
        .unwrap()
        .ends_with(&pinned.replace(&real.addr.to_string(), &mitm.addr.to_string())));
    mitm.proc.kill();
}

#[test]
fn key_files_readable_by_group_or_others_are_refused_with_the_chmod() {
    use std::os::unix::fs::PermissionsExt;
    let t = tmp();
    let (id, public, _) = keygen(t.path(), "me.id");
    let authorized = t.path().join("authorized");
    write_public(&authorized, format!("{public} me\n")).unwrap();
    let key = t.path().join("shared.key");
    Proc::spawn("keygen", &["keygen", "--out", arg(&key)])
        .wait(Duration::from_secs(10))
        .assert_success();
    let src = t.path().join("a.bin");
    fsx::write_random(&src, 1000, 65);
    let out = t.path().join("out");
    let to = "127.0.0.1:9".parse().unwrap();
    for (file, mode) in [(&id, 0o640), (&key, 0o644)] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
        let chmod = format!("chmod 600 {}", file.display());
        let runs = [
            // A sender's key files.
            if *file == id {
                proc::send(to, &[&src], &["--identity", arg(file)])
            } else {
                proc::send(to, &[&src], &["--key", arg(file)])
            },
            // A receiver's.
            Proc::spawn(
                "receiver",
                &if *file == id {
                    vec![
                        "receive",
                        "--out",
                        arg(&out),
                        "--identity",
                        arg(file),
                        "--authorized",
                        arg(&authorized),
                    ]
                } else {
                    vec![
                        "receive",
                        "--out",
                        arg(&out),
                        "--serve",
                        "--keys",
                        arg(file),
                    ]
                },
            )
            .wait(TRANSFER_TIMEOUT),
        ];
        for run in runs {
            let why = run.assert_exit(2);
            assert!(why.contains(&chmod), "{}: {why}", run.name);
        }
        // Private again: accepted (the receiver then listens; the sender finds nobody).
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = if *file == id {
            proc::send(to, &[&src], &["--identity", arg(file), "--wait", "0"])
        } else {
            proc::send(to, &[&src], &["--key", arg(file), "--wait", "0"])
        };
        assert!(!s.stderr.contains("chmod"), "{}", s.stderr);
        assert_ne!(s.status.code(), Some(2), "{}", s.stderr);
    }
    // The authorized file holds no secret, but whoever may write it may add a sender.
    std::fs::set_permissions(&authorized, std::fs::Permissions::from_mode(0o664)).unwrap();
    let r = Proc::spawn(
        "receiver",
        &[
            "receive",
            "--out",
            arg(&out),
            "--identity",
            arg(&id),
            "--authorized",
            arg(&authorized),
        ],
    )
    .wait(TRANSFER_TIMEOUT);
    let why = r.assert_exit(2);
    assert!(
        why.contains(&format!("chmod go-w {}", authorized.display())),
        "{why}"
    );
}
