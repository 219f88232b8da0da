//! `hurtle send - --name NAME`: what is read from standard input, sent as one file named NAME.
//!
//! The manifest announces each file's size before any data moves, and the sender reads blocks
//! out of order and again for repairs, so standard input is first copied whole into a file in
//! a private temporary directory (`$TMPDIR`, else `/tmp`), named NAME, removed when the send
//! ends; that file is what is sent. It gets mode 0644 and the time it was read, as a new file
//! written by `cat > NAME` under the usual umask would.

use crate::exit::{self, Failure};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The path argument that stands for standard input.
pub const STDIN: &str = "-";

/// Standard input, copied into a file named for the receiver; the directory goes when this
/// is dropped.
pub struct Spooled {
    _dir: tempfile::TempDir,
    /// The file to send.
    pub path: PathBuf,
}

/// Whether `paths` asks for standard input (`-`).
pub fn wanted(paths: &[PathBuf]) -> bool {
    paths.iter().any(|p| p.as_os_str() == STDIN)
}

/// Checks the arguments of `send -` (alone, with a plain file name), then copies `input` into
/// a file named `name`. A bad name or a misuse is a usage error (exit 2); a read or write
/// failure a storage failure (exit 6).
pub fn spool(paths: &[PathBuf], name: Option<&str>, input: impl Read) -> Result<Spooled, Failure> {
    if paths.len() != 1 {
        return Err(Failure::usage(
            "`-` (standard input) is sent alone: give no other path with it",
        ));
    }
    let name =
        name.ok_or_else(|| Failure::usage("`send -` needs a name for what it reads: --name NAME"))?;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Failure::usage(format!(
            "--name {name:?}: give a file name, without '/'"
        )));
    }
    let storage =
        |what: &str, e: std::io::Error| Failure::new(exit::STORAGE, anyhow::anyhow!("{what}: {e}"));
    let dir = tempfile::Builder::new()
        .prefix("hurtle-stdin-")
        .tempdir()
        .map_err(|e| storage("cannot make a temporary directory for standard input", e))?;
    let path = dir.path().join(name);
    copy_into(&path, input).map_err(|e| {
        storage(
            &format!("cannot copy standard input to {}", path.display()),
            e,
        )
    })?;
    Ok(Spooled { _dir: dir, path })
}

fn copy_into(path: &Path, mut input: impl Read) -> std::io::Result<()> {
    let mut file = std::fs::File::create_new(path)?;
    std::io::copy(&mut input, &mut file)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// `--name` given without `-`: a usage error.
pub fn name_without_stdin() -> Failure {
    Failure::usage("--name names what `send -` reads from standard input; give `-` as the path")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_lands_in_a_file_of_that_name() {
        let s = spool(&[PathBuf::from("-")], Some("notes.txt"), &b"hello"[..]).unwrap();
        assert_eq!(s.path.file_name().unwrap(), "notes.txt");
        assert_eq!(std::fs::read(&s.path).unwrap(), b"hello");
        let mode = std::fs::metadata(&s.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let dir = s.path.parent().unwrap().to_path_buf();
        drop(s);
        assert!(!dir.exists(), "the temporary directory is removed");
    }

    #[test]
    fn misuse_is_a_usage_error() {
        let dash = [PathBuf::from("-")];
        for (paths, name) in [
            (&dash[..], None),
            (&dash[..], Some("")),
            (&dash[..], Some("a/b")),
            (&dash[..], Some("..")),
            (&[PathBuf::from("-"), PathBuf::from("x")][..], Some("n")),
        ] {
            let e = spool(paths, name, &b""[..]).err().expect("refused");
            assert_eq!(e.code, exit::USAGE, "{paths:?} {name:?}");
        }
    }
}
