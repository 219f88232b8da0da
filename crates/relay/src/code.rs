//! Codes: `4821-purple-sausage`. The nameplate (the number) is allocated by the relay and is all
//! the relay ever learns; the words are chosen by the receiver and never leave the peers, not
//! even as a hash: they are the password of the peers' SPAKE2 agreement (`hurtle_proto::secure`),
//! which runs over the control connection (through the relay when the session is relayed). So
//! neither the relay nor anyone on the path can test guesses of the words offline; a wrong code
//! is found by the peers' agreement, one online guess per connection.

use crate::words::{index_of, nearest, WORDS};
use std::fmt;

/// Words the receiver picks for a new code.
pub const DEFAULT_WORDS: usize = 2;
/// Fewest and most words a code may have.
pub const WORD_RANGE: std::ops::RangeInclusive<usize> = 2..=3;

/// A parsed code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    /// The relay's number.
    pub nameplate: u32,
    /// The secret words, from [`WORDS`].
    pub words: Vec<&'static str>,
}

/// Why a string is not a code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    /// No number in front.
    #[error("a code starts with a number, like 4821-purple-sausage")]
    NoNameplate,
    /// Too few or too many words.
    #[error("a code has {} to {} words after the number, like 4821-purple-sausage", WORD_RANGE.start(), WORD_RANGE.end())]
    WordCount,
    /// A word not in the list, and the words of the list it is a near miss of, if any.
    #[error("'{word}' is not in the word list{}", did_you_mean(suggestions))]
    UnknownWord {
        /// The word as typed (lowercase, at most 40 characters).
        word: String,
        /// The nearest words of the list, when they are near ([`crate::words::nearest`]).
        suggestions: Vec<&'static str>,
    },
}

/// "; did you mean 'a'?", "; did you mean 'a' or 'b'?", or nothing.
fn did_you_mean(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => format!("; did you mean {last}?"),
        Some((last, rest)) => format!("; did you mean {} or {last}?", rest.join(", ")),
    }
}

impl Code {
    /// A new code for `nameplate` with `n` random words.
    pub fn generate(nameplate: u32, n: usize) -> Code {
        let words = (0..n)
            .map(|_| WORDS[usize::from(rand::random::<u8>())])
            .collect();
        Code { nameplate, words }
    }

    /// Parses a code as a person types it: case, surrounding space and spaces instead of dashes
    /// are forgiven.
    pub fn parse(s: &str) -> Result<Code, CodeError> {
        let lower = s.trim().to_ascii_lowercase();
        let mut parts = lower
            .split(|c: char| c == '-' || c.is_whitespace())
            .filter(|p| !p.is_empty());
        let nameplate = parts
            .next()
            .filter(|p| p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
            .ok_or(CodeError::NoNameplate)?;
        let mut words = Vec::new();
        for p in parts {
            if words.len() >= *WORD_RANGE.end() {
                return Err(CodeError::WordCount);
            }
            let i = index_of(p).ok_or_else(|| CodeError::UnknownWord {
                word: p.chars().take(40).collect(),
                suggestions: nearest(p),
            })?;
            words.push(WORDS[i]);
        }
        if !WORD_RANGE.contains(&words.len()) {
            return Err(CodeError::WordCount);
        }
        Ok(Code { nameplate, words })
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.nameplate)?;
        for w in &self.words {
            write!(f, "-{w}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_format() {
        let c = Code::parse("4821-purple-sausage").unwrap();
        assert_eq!(c.nameplate, 4821);
        assert_eq!(c.words, ["purple", "sausage"]);
        assert_eq!(c.to_string(), "4821-purple-sausage");
        assert_eq!(Code::parse("  4821 Purple-SAUSAGE ").unwrap(), c);
        assert_eq!(Code::parse("7-acid-acorn-actor").unwrap().words.len(), 3);
        assert_eq!(Code::parse("purple-sausage"), Err(CodeError::NoNameplate));
        assert_eq!(Code::parse(""), Err(CodeError::NoNameplate));
        assert_eq!(
            Code::parse("99999999999-acid-acorn"),
            Err(CodeError::NoNameplate)
        );
        assert_eq!(Code::parse("12-acid"), Err(CodeError::WordCount));
        assert_eq!(
            Code::parse("12-acid-acid-acid-acid"),
            Err(CodeError::WordCount)
        );
        let typo = Code::parse("12-acid-purpel").unwrap_err();
        assert_eq!(
            typo,
            CodeError::UnknownWord {
                word: "purpel".into(),
                suggestions: vec!["purple"]
            }
        );
        assert_eq!(
            typo.to_string(),
            "'purpel' is not in the word list; did you mean 'purple'?"
        );
        assert_eq!(
            Code::parse("12-acid-Xyzzy").unwrap_err().to_string(),
            "'xyzzy' is not in the word list"
        );
        assert_eq!(
            Code::parse("12-acid-acron").unwrap_err().to_string(),
            "'acron' is not in the word list; did you mean 'acorn' or 'apron'?"
        );
    }

    proptest! {
        #[test]
        fn generated_codes_round_trip(nameplate in 0u32..1_000_000, n in 2usize..=3) {
            let c = Code::generate(nameplate, n);
            prop_assert_eq!(Code::parse(&c.to_string()).unwrap(), c);
        }

        #[test]
        fn parsing_any_string_never_panics(s in "\\PC{0,80}") {
            let _ = Code::parse(&s);
        }
    }
}
