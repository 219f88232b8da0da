//! Codes and keys on the command line: `hurtle keygen`, the secret a sender gives (`--code`,
//! `HURTLE_CODE`, `--key`), and what a receiver accepts (its code, printed when new, and the
//! keys of `--keys`).

use crate::args::KeygenArgs;
use crate::exit::{self, Failure, Outcome};
use hurtle_engine::Keyring;
use hurtle_proto::secure::Secret;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable that gives a code without putting it on a command line (where
/// other users of the host can read it in the process list).
pub const CODE_ENV: &str = "HURTLE_CODE";

/// Words of a new code for a direct receiver (after its number): about 37 bits in all.
const DIRECT_WORDS: usize = 3;

/// `hurtle keygen`.
pub fn keygen(a: KeygenArgs) -> Outcome {
    let bytes: [u8; 32] = rand::random();
    let line = format!("{}\n", Secret::key_text(&bytes));
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

/// The sender's secret: `--key FILE`, else the code.
pub fn sender_secret(key: &Option<PathBuf>, code: Option<&str>) -> Result<Option<Secret>, Failure> {
    if let Some(path) = key {
        let keys = read_keys(path)?;
        let Some((_, secret)) = keys.into_iter().next() else {
            return Err(Failure::usage(format!("{}: no key in it", path.display())));
        };
        return Ok(Some(secret));
    }
    Ok(code.map(Secret::code))
}

/// A new code for a direct receiver: a number and three words.
pub fn new_code() -> String {
    hurtle_relay::code::Code::generate(rand::random_range(1000..10000), DIRECT_WORDS).to_string()
}

/// The keys of a key file: one `hurtle-key-...` per line, optionally followed by a name;
/// blank lines and `#` comments are skipped.
pub fn read_keys(path: &Path) -> Result<Vec<(String, Secret)>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read the key file {}: {e}", path.display())))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(2, char::is_whitespace);
        let key = parts.next().unwrap_or_default();
        let secret = Secret::parse_key(key)
            .map_err(|e| Failure::usage(format!("{} line {}: {e}", path.display(), i + 1)))?;
        let name = parts
            .next()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map_or_else(|| format!("key {}", secret.id()), str::to_string);
        keys.push((name, secret));
    }
    Ok(keys)
}

/// A receiver's keyring from `--keys` and a code (if any).
pub fn keyring(keys: &Option<PathBuf>, code: Option<&str>) -> Result<Keyring, Failure> {
    let ring = match code {
        Some(c) => Keyring::code(c),
        None => Keyring::default(),
    };
    if let Some(path) = keys {
        let found = read_keys(path)?;
        if found.is_empty() {
            return Err(Failure::usage(format!("{}: no key in it", path.display())));
        }
        for (name, secret) in found {
            ring.add(name, secret);
        }
    }
    Ok(ring)
}
