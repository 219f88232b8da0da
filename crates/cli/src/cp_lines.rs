//! The text lines of `hurtle cp`'s conversation over ssh, as pure functions: what the far side
//! prints ([`banner_words`] reads its `HURTLE-SSH` line), the session [`Secret`] carried in
//! those lines, and a push's first line, the sources' [`Shape`]. Every one of them is read from
//! a process on another host, so each reader takes any text and answers with a value or
//! `None`/an error, never a panic (the `cp_lines` fuzz target checks this, and that what is
//! read is written back as the same value).
//!
//! The command's `cp` (`src/cmd/cp/`) holds the conversation itself; this module is part of
//! the library only so that the fuzz targets reach it.

use std::fmt;

/// The version of the conversation over ssh (the banner line, the port/secret line, the path
/// lines, and the mux's frames). The session itself has its own version, checked in its hello.
/// 2: the path lines (`direct`, `ssh`) and the mux. 3: after a direct session whose data could
/// not get through, the retry through the ssh channel (the near side's `ssh` or `end`, the far
/// side's `ssh` line). 4: a push's first line to the far side, the sources' shape
/// (`shape one HEX`, `shape contents`, `shape many`), for the destination rules.
pub const PROTOCOL: u32 = 4;
/// The first word of the far side's line.
pub const BANNER: &str = "HURTLE-SSH";

/// A `HURTLE-SSH` line of another protocol than [`PROTOCOL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the far side speaks ssh protocol {theirs:?}, this one speaks {PROTOCOL}")]
pub struct ProtocolMismatch {
    /// The far side's protocol word as it printed it (empty when it printed none).
    pub theirs: String,
}

/// The words after the version of a `HURTLE-SSH` line, its protocol checked; `None` for
/// another line (a chatty login script's).
pub fn banner_words(line: &str) -> Result<Option<Vec<String>>, ProtocolMismatch> {
    let mut words = line.split_whitespace();
    if words.next() != Some(BANNER) {
        return Ok(None);
    }
    let theirs = words.next().unwrap_or("");
    if theirs.parse::<u32>() != Ok(PROTOCOL) {
        return Err(ProtocolMismatch {
            theirs: theirs.to_string(),
        });
    }
    Ok(Some(words.map(str::to_string).collect()))
}

/// The secret of one `hurtle cp` session: 32 random bytes, written in hex on the wire (the
/// far side's stdout for a push, its stdin for a pull). The bytes are what a key agreement
/// takes as a key.
#[derive(Clone)]
pub struct Secret(pub [u8; 32]);

impl Secret {
    /// A new random secret.
    pub fn new() -> Secret {
        Secret(rand::random())
    }

    /// Reads the secret's hex form (64 hex digits, either case); `None` for anything else.
    pub fn parse(s: &str) -> Option<Secret> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Secret(bytes))
    }
}

impl Default for Secret {
    fn default() -> Secret {
        Secret::new()
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// What the destination rules need to know of the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// One source sent as itself, under this top-level name.
    One(String),
    /// One source's contents (`SRC/`).
    Contents,
    /// Several sources.
    Many,
}

impl Shape {
    /// The line a push writes to the far side's stdin first (the name in hex: any byte may be
    /// in a name but a newline must not end the line early).
    pub fn line(&self) -> String {
        match self {
            Shape::One(name) => {
                let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
                format!("shape one {hex}\n")
            }
            Shape::Contents => "shape contents\n".into(),
            Shape::Many => "shape many\n".into(),
        }
    }

    /// Reads [`Shape::line`].
    pub fn parse(line: &str) -> Option<Shape> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["shape", "contents"] => Some(Shape::Contents),
            ["shape", "many"] => Some(Shape::Many),
            ["shape", "one", hex] if hex.len() % 2 == 0 && !hex.is_empty() => {
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()?;
                String::from_utf8(bytes).ok().map(Shape::One)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(n: &str) -> Shape {
        Shape::One(n.into())
    }

    #[test]
    fn the_shape_travels_as_one_line() {
        for shape in [one("big.bin"), one("a b\nc"), Shape::Contents, Shape::Many] {
            assert_eq!(
                Shape::parse(&shape.line()),
                Some(shape.clone()),
                "{shape:?}"
            );
        }
        for bad in [
            "",
            "shape",
            "shape one",
            "shape one 6",
            "shape one zz",
            "direct",
        ] {
            assert_eq!(Shape::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn banner_lines() {
        let line = format!("{BANNER} {PROTOCOL} 7000 ab");
        assert_eq!(
            banner_words(&line),
            Ok(Some(vec!["7000".into(), "ab".into()]))
        );
        assert_eq!(banner_words("Welcome to the host"), Ok(None));
        assert_eq!(banner_words(""), Ok(None));
        assert_eq!(
            banner_words(&format!("{BANNER} 3 ready")),
            Err(ProtocolMismatch { theirs: "3".into() })
        );
        assert_eq!(
            banner_words(BANNER),
            Err(ProtocolMismatch {
                theirs: String::new()
            })
        );
    }

    #[test]
    fn secrets_travel_as_hex() {
        let s = Secret::new();
        assert_eq!(Secret::parse(&s.to_string()).map(|t| t.0), Some(s.0));
        assert_eq!(
            Secret::parse(&"AB".repeat(32)).map(|t| t.0),
            Some([0xab; 32])
        );
        for bad in [
            "",
            "ab",
            &"g0".repeat(32),
            &"ab".repeat(33),
            &"é".repeat(32),
        ] {
            assert!(Secret::parse(bad).is_none(), "{bad:?}");
        }
    }
}
