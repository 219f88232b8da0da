//! Codes and keys on the command line: `hurtle keygen`, the secret a sender gives (`--code`,
//! `HURTLE_CODE`, `--key`), and what a receiver accepts (its code, printed when new, and the
//! keys of `--keys`). The rules (a code's shape, a key file's lines, a new code or key) are
//! the library's, [`hurtle::api::keys`]; what is here is the command's: the environment
//! variable, the file `keygen` writes.

use crate::args::KeygenArgs;
use crate::exit::{self, Failure, Outcome};
use hurtle::api::keys::{self as rules, Code, Secret};
use hurtle_engine::Keyring;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable that gives a code without putting it on a command line (where
/// other users of the host can read it in the process list).
pub const CODE_ENV: &str = "HURTLE_CODE";

/// `hurtle keygen`.
pub fn keygen(a: KeygenArgs) -> Outcome {
    if let (true, Some(out)) = (a.identity, &a.out) {
        // The public key on stdout (for a receiver's --authorized file), the rest on stderr.
        let public = hurtle::api::identity::new_identity(out)?;
        println!("{public}");
        eprintln!(
            "hurtle: identity key written to {} (fingerprint {}); the public key above goes into \
             a receiver's --authorized file, or is what senders pin for this receiver",
            out.display(),
            public.fingerprint()
        );
        return Ok(());
    }
    let line = format!("{}\n", rules::new_key());
    match a.out {
        None => {
            print!("{line}");
            Ok(())
        }
        Some(path) => write_private(&path, &line).map_err(|e| {
            Failure::new(
                exit::STORAGE,
                anyhow::anyhow!("cannot write {}: {e}", path.display()),
            )
        }),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// The code given with `--code`, or else in [`CODE_ENV`].
pub fn given_code(flag: &Option<String>) -> Option<String> {
    flag.clone().or_else(|| {
        std::env::var(CODE_ENV)
            .ok()
            .filter(|c| !c.trim().is_empty())
    })
}

/// A code as given to `--code` or in [`CODE_ENV`], checked locally (see
/// [`hurtle::api::keys::check_code`]): a malformed one is a usage error (exit 2).
pub fn checked_code(code: &str) -> Result<Code, Failure> {
    Ok(rules::check_code(code)?)
}

/// The sender's secret: `--key FILE` (its first key), else the code.
pub fn sender_secret(key: &Option<PathBuf>, code: Option<&str>) -> Result<Option<Secret>, Failure> {
    if let Some(path) = key {
        return Ok(rules::read_key_file(path)?
            .into_iter()
            .next()
            .map(|(_, secret)| secret));
    }
    Ok(code.map(Secret::code))
}

/// A new code for a direct receiver: a number and three words.
pub fn new_code() -> String {
    rules::new_code()
}

/// A receiver's keyring from `--keys` and a code (if any).
pub fn keyring(keys: &Option<PathBuf>, code: Option<&str>) -> Result<Keyring, Failure> {
    let ring = match code {
        Some(c) => Keyring::code(c),
        None => Keyring::default(),
    };
    if let Some(path) = keys {
        for (name, secret) in rules::read_key_file(path)? {
            ring.add(name, secret);
        }
    }
    Ok(ring)
}
