//! Any line given to the readers of `hurtle cp`'s conversation over ssh (`hurtle::cp_lines`):
//! the far side's `HURTLE-SSH` line, the secret and the port in it, and a push's shape line.
//! Never a panic; what is read is written back as the same value: the banner's words as a
//! banner line, a secret as its hex, a shape as its line (one line, ending in a newline).
#![no_main]
use hurtle::cp_lines::{banner_words, Secret, Shape, BANNER, PROTOCOL};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Some(words)) = banner_words(line) {
        assert!(words
            .iter()
            .all(|w| !w.is_empty() && !w.contains(char::is_whitespace)));
        let again = format!("{BANNER} {PROTOCOL} {}", words.join(" "));
        assert_eq!(banner_words(&again), Ok(Some(words.clone())), "{again:?}");
        // As a push reads the far side's port and secret, and the far side a pull's.
        if let [port, secret, ..] = words.as_slice() {
            let _ = port.parse::<u16>();
            if let Some(s) = Secret::parse(secret) {
                assert_eq!(s.to_string(), secret.to_ascii_lowercase());
            }
        }
    }
    for word in line.split_whitespace() {
        if let Some(s) = Secret::parse(word) {
            assert_eq!(s.to_string(), word.to_ascii_lowercase());
        }
    }
    if let Some(shape) = Shape::parse(line) {
        let written = shape.line();
        assert!(written.ends_with('\n') && written.matches('\n').count() == 1);
        assert_eq!(Shape::parse(&written).as_ref(), Some(&shape), "{written:?}");
        if let Shape::One(name) = &shape {
            assert!(!name.is_empty());
        }
    }
});
