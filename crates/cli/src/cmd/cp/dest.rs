//! Where a `hurtle cp` lands, by scp's and rsync's destination rules ([`place`]), on whichever
//! side receives (this side for a pull, the far side for a push):
//!
//! - `DEST/` (a trailing slash, or a last component `.` or `..`) or a `DEST` that is an
//!   existing directory: the sources go *into* it (created, with its parents, if missing);
//! - otherwise, a single source (not `SRC/`) is *named* `DEST`: a file `DEST`, or a directory
//!   `DEST` that is a copy of the source tree (as `scp -r` and `cp -r` do; rsync would make
//!   `DEST/SRC`); `DEST`'s directory must exist; a file already there is replaced only with
//!   `--overwrite`;
//! - a single `SRC/` (its contents) fills `DEST`, created if missing;
//! - several sources need `DEST` to be a directory (existing, or written `DEST/`).
//!
//! What the receiving side needs to know of the sources is their [`Shape`]; a push sends it
//! to the far side as one line on its stdin ([`Shape::line`], [`Shape::parse`], in
//! [`crate::cp_lines`]; [`shape_of`] finds it) before anything else.

use super::sources::{source_kind, Kind};
use crate::exit::{self, Failure};
use std::path::{Path, PathBuf};

pub(super) use crate::cp_lines::Shape;

/// The shape of the sources as given on the command line (before `SRC/` is expanded). `name`
/// gives a source's top-level name where [`source_kind`] leaves it to the side that reads the
/// source (a push names its local sources as the sender will).
pub(super) fn shape_of(
    sources: &[&str],
    name: impl Fn(&str) -> Result<String, Failure>,
) -> Result<Shape, Failure> {
    match sources {
        [one] => Ok(match source_kind(one) {
            Kind::Itself(_) => Shape::One(name(one)?),
            Kind::Contents => Shape::Contents,
        }),
        _ => Ok(Shape::Many),
    }
}

/// Where the files land: the receiver's output directory, and the single source's top-level
/// name with the name it is written under there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    pub(super) out: PathBuf,
    pub(super) rename: Option<(String, String)>,
}

/// Whether `dest` is written as a directory: a trailing slash, or a last component `.` or
/// `..` (which name a directory whatever follows).
fn written_as_dir(dest: &str) -> bool {
    dest.ends_with('/') || matches!(dest.rsplit('/').next(), Some("." | ".."))
}

/// Where sources of `shape` land for the destination `dest` (see the module's rules), as the
/// receiving side finds it.
pub(super) fn place(dest: &str, shape: &Shape) -> Result<Placement, Failure> {
    let storage = |what: String| Failure::new(exit::STORAGE, anyhow::anyhow!(what));
    let path = Path::new(dest);
    let into = || Placement {
        out: path.to_path_buf(),
        rename: None,
    };
    if written_as_dir(dest) || std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Ok(into());
    }
    let exists = std::fs::symlink_metadata(path).is_ok();
    match shape {
        Shape::One(name) => {
            let new_name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| storage(format!("{dest}: not a name to copy to")))?;
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !std::fs::metadata(parent).is_ok_and(|m| m.is_dir()) {
                return Err(storage(format!(
                    "{dest}: its directory {} does not exist (write DEST/ to create DEST as a \
                     directory and copy into it)",
                    parent.display()
                )));
            }
            Ok(Placement {
                out: parent.to_path_buf(),
                rename: Some((name.clone(), new_name.to_string())),
            })
        }
        Shape::Contents if !exists => Ok(into()),
        Shape::Contents => Err(storage(format!("{dest}: exists and is not a directory"))),
        Shape::Many if exists => Err(storage(format!(
            "{dest}: exists and is not a directory, and several sources need a directory"
        ))),
        Shape::Many => Err(Failure::usage(format!(
            "{dest}: several sources need DEST to be an existing directory; write {dest}/ to \
             create it"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(n: &str) -> Shape {
        Shape::One(n.into())
    }

    #[test]
    fn shapes_of_the_command_line() {
        let name = |s: &str| Ok(format!("<{s}>"));
        let shape = |v: &[&str]| shape_of(v, name).unwrap();
        assert_eq!(shape(&["a/big.bin"]), one("<a/big.bin>"));
        for contents in ["d/", "/", ".", "d/.", "..", "d/.."] {
            assert_eq!(shape(&[contents]), Shape::Contents, "{contents}");
        }
        assert_eq!(shape(&["a", "b"]), Shape::Many);
        assert_eq!(shape(&["a/", "b/"]), Shape::Many);
    }

    #[test]
    fn destinations_as_scp_and_rsync_read_them() {
        let t = tempfile::tempdir().unwrap();
        let d = |p: &str| format!("{}/{p}", t.path().display());
        std::fs::create_dir(t.path().join("dir")).unwrap();
        std::fs::write(t.path().join("file"), b"x").unwrap();
        let placed = |dest: &str, shape: &Shape| place(dest, shape);
        let into = |dest: &str| Placement {
            out: PathBuf::from(dest),
            rename: None,
        };
        let named = |name: &str, to: &str| Placement {
            out: t.path().to_path_buf(),
            rename: Some((name.into(), to.into())),
        };
        // An existing directory, or one written with a slash: into it, whatever the sources.
        for shape in [one("f"), Shape::Contents, Shape::Many] {
            for dest in [d("dir"), d("dir/"), d("new/"), d("new/.")] {
                assert_eq!(placed(&dest, &shape).unwrap(), into(&dest), "{dest}");
            }
        }
        // A single source names a DEST that is not a directory (the engine then refuses a
        // file there without --overwrite).
        assert_eq!(placed(&d("new"), &one("f")).unwrap(), named("f", "new"));
        assert_eq!(placed(&d("file"), &one("f")).unwrap(), named("f", "file"));
        // ... but its directory must exist.
        let f = placed(&d("missing/new"), &one("f")).unwrap_err();
        assert_eq!(f.code, exit::STORAGE);
        assert!(
            f.error.to_string().contains("does not exist"),
            "{}",
            f.error
        );
        // A single SRC/ fills a new DEST.
        assert_eq!(
            placed(&d("new"), &Shape::Contents).unwrap(),
            into(&d("new"))
        );
        assert_eq!(
            placed(&d("file"), &Shape::Contents).unwrap_err().code,
            exit::STORAGE
        );
        // Several sources need a directory.
        let f = placed(&d("new"), &Shape::Many).unwrap_err();
        assert_eq!(f.code, exit::USAGE);
        assert!(
            f.error.to_string().contains("new/ to create it"),
            "{}",
            f.error
        );
        assert_eq!(
            placed(&d("file"), &Shape::Many).unwrap_err().code,
            exit::STORAGE
        );
        // A relative DEST without a directory part lands in the current directory.
        assert_eq!(
            place("renamed.bin", &one("big.bin")).unwrap(),
            Placement {
                out: PathBuf::from("."),
                rename: Some(("big.bin".into(), "renamed.bin".into())),
            }
        );
    }
}
