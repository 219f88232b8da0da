//! Any text given to the relay code parser (`hurtle_relay::Code::parse`, what a person types
//! after `--code`): never a panic; a code parsed has a nameplate and 2 or 3 words of the list,
//! and prints as a code that parses to the same code; an unknown word is reported cut to 40
//! characters with suggestions from the list only.
#![no_main]
use hurtle_relay::code::{CodeError, WORD_RANGE};
use hurtle_relay::words::WORDS;
use hurtle_relay::Code;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Code::parse(text) {
        Ok(code) => {
            assert!(WORD_RANGE.contains(&code.words.len()), "{code:?}");
            assert!(code.words.iter().all(|w| WORDS.contains(w)), "{code:?}");
            let printed = code.to_string();
            assert_eq!(Code::parse(&printed).as_ref(), Ok(&code), "{printed:?}");
        }
        Err(e) => {
            if let CodeError::UnknownWord { word, suggestions } = &e {
                assert!(word.chars().count() <= 40, "{word:?}");
                assert!(suggestions.iter().all(|w| WORDS.contains(w)));
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
