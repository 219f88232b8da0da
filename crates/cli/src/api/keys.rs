//! Codes and key files, as `hurtle send --code/--key` and `hurtle receive --code/--keys` take
//! them: a code is checked before it costs one of the receiver's tries; a key file holds one
//! `hurtle-key-...` per line (made by `hurtle keygen`), optionally followed by a name.

use super::error::Error;
use hurtle_proto::secure::Secret;
use hurtle_relay::Code;
use std::path::Path;

/// Words of a new code for a receiver that is not paired through a relay (after its number).
const DIRECT_WORDS: usize = 3;

/// A code checked locally: a number and 2 or 3 words of the list (with the nearest word for
/// one not in it).
pub(crate) fn checked_code(code: &str) -> Result<Code, Error> {
    Code::parse(code).map_err(|e| Error::Usage(format!("bad code: {e}")))
}

/// A new code for a receiver: a number and three words.
pub(crate) fn new_code() -> String {
    Code::generate(rand::random_range(1000..10000), DIRECT_WORDS).to_string()
}

/// The keys of a key file; blank lines and `#` comments are skipped.
pub(crate) fn read_keys(path: &Path) -> Result<Vec<(String, Secret)>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read the key file {}: {e}", path.display())))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(2, char::is_whitespace);
        let key = parts.next().unwrap_or_default();
        let secret = Secret::parse_key(key)
            .map_err(|e| Error::Usage(format!("{} line {}: {e}", path.display(), i + 1)))?;
        let name = parts
            .next()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map_or_else(|| format!("key {}", secret.id()), str::to_string);
        keys.push((name, secret));
    }
    if keys.is_empty() {
        return Err(Error::Usage(format!("{}: no key in it", path.display())));
    }
    Ok(keys)
}
