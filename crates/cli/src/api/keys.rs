//! Codes and key files, as `hurtle send --code/--key`, `hurtle receive --code/--keys` and
//! `hurtle keygen` take and make them: a code is checked before it costs one of the receiver's
//! tries; a key file holds one `hurtle-key-...` per line (made by [`new_key`]), optionally
//! followed by a name. The command uses these functions; the builders
//! ([`SenderBuilder::code`](crate::SenderBuilder::code),
//! [`ReceiverBuilder::keys_file`](crate::ReceiverBuilder::keys_file), ...) call them for you.

use super::error::Error;
use std::path::Path;

/// A shared secret: a code's, or a key of a key file. Printed, it shows only its id.
pub use hurtle_proto::secure::Secret;
/// A pairing code: a number (the nameplate, all a relay learns) and words of the list.
pub use hurtle_relay::Code;

/// Words of a new code for a receiver that is not paired through a relay (after its number).
const DIRECT_WORDS: usize = 3;

/// Checks a code locally, before it costs one of the receiver's tries: a number and 2 or 3
/// words of the list (a word not in it is refused with the nearest word). A
/// [`Usage`](crate::ErrorKind::Usage) error otherwise (`bad code: ...`).
pub fn check_code(code: &str) -> Result<Code, Error> {
    Code::parse(code).map_err(|e| Error::Usage(format!("bad code: {e}")))
}

/// A new code for a receiver: a number and three words (about 37 bits).
pub fn new_code() -> String {
    Code::generate(rand::random_range(1000..10000), DIRECT_WORDS).to_string()
}

/// A new key, as `hurtle keygen` prints it (`hurtle-key-...`): one line of a key file.
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    Secret::key_text(&bytes)
}

/// The keys of a key file with their names (a key's id when the line names none); blank lines
/// and `#` comments are skipped. A file that cannot be read, a line that is not a key, or a
/// file without a key is a [`Usage`](crate::ErrorKind::Usage) error naming the file (and
/// the line).
pub fn read_key_file(path: &Path) -> Result<Vec<(String, Secret)>, Error> {
    // A key file holds secrets: refused when its group or others may read it, as ssh does.
    let text = hurtle_engine::identity::read_private(path).map_err(|e| match e {
        hurtle_engine::identity::KeyFileError::Io { source, .. } => Error::Usage(format!(
            "cannot read the key file {}: {source}",
            path.display()
        )),
        other => Error::Usage(other.to_string()),
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_read_with_their_names_and_refused_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        let (a, b) = (new_key(), new_key());
        std::fs::write(&file, format!("# keys\n\n{a} lab\n{b}\n")).unwrap();
        // A key file holds secrets: only its owner may read it (else it is refused).
        let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
        std::fs::set_permissions(&file, private).unwrap();
        let keys = read_key_file(&file).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0, "lab");
        assert!(keys[1].0.starts_with("key "), "{}", keys[1].0);
        std::fs::write(&file, format!("{a}\nnot-a-key\n")).unwrap();
        let e = read_key_file(&file).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::write(&file, "# nothing\n").unwrap();
        let e = read_key_file(&file).unwrap_err().to_string();
        assert!(e.ends_with("no key in it"), "{e}");
        assert!(check_code(&new_code()).is_ok(), "a new code is a valid one");
        assert!(check_code("12-notaword-acid").is_err());
    }
}
