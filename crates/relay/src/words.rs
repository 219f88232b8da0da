//! The word list codes are made of: 256 short, distinct, easily spoken English words, so a code
//! can be read aloud. A word is chosen by one random byte.

/// The words, lowercase ASCII, all distinct.
pub const WORDS: [&str; 256] = [
    "acid", "acorn", "actor", "adobe", "alarm", "album", "alpine", "amber", "anchor", "angle",
    "apple", "apron", "arrow", "aspen", "atlas", "attic", "autumn", "avocado", "bacon", "badge",
    "bagel", "bamboo", "banana", "banjo", "barley", "basket", "beacon", "beaver", "berry", "bison",
    "blanket", "blossom", "bonnet", "border", "bottle", "breeze", "brick", "bridge", "broom",
    "bubble", "bucket", "buffalo", "button", "cabin", "cactus", "camel", "canal", "candle",
    "canoe", "canyon", "carbon", "carpet", "carrot", "castle", "cedar", "cello", "cement",
    "cherry", "chess", "chimney", "cider", "cinema", "circus", "citrus", "clover", "cobalt",
    "coconut", "comet", "copper", "coral", "cotton", "cradle", "crayon", "cricket", "crystal",
    "cycle", "daisy", "delta", "denim", "desert", "diamond", "dolphin", "domino", "donkey",
    "dragon", "drum", "eagle", "easel", "echo", "eclipse", "elbow", "ember", "engine", "falcon",
    "feather", "fiddle", "flannel", "forest", "fossil", "fountain", "garden", "garlic", "gazelle",
    "ginger", "glacier", "goblet", "granite", "gravel", "guitar", "hammer", "harbor", "harvest",
    "hazel", "helmet", "heron", "hockey", "honey", "hornet", "iceberg", "igloo", "indigo",
    "island", "ivory", "jacket", "jaguar", "jasmine", "jelly", "jigsaw", "jungle", "kayak",
    "kettle", "kitten", "koala", "ladder", "lagoon", "lantern", "lemon", "lentil", "lilac",
    "lizard", "lobster", "locket", "magnet", "mango", "maple", "marble", "meadow", "melon",
    "meteor", "mitten", "monkey", "mosaic", "muffin", "mustard", "napkin", "nectar", "needle",
    "noodle", "nutmeg", "oasis", "olive", "onion", "orbit", "orchid", "otter", "oyster", "paddle",
    "panda", "papaya", "parrot", "peanut", "pebble", "pelican", "pepper", "piano", "pickle",
    "pigeon", "pillow", "pirate", "planet", "plum", "pocket", "polka", "pony", "poppy", "potato",
    "pretzel", "puffin", "pumpkin", "puzzle", "quartz", "quilt", "rabbit", "raccoon", "radar",
    "radish", "raisin", "raven", "ribbon", "river", "robin", "rocket", "saddle", "saffron",
    "salmon", "sandal", "sausage", "scarf", "shadow", "sierra", "silver", "sketch", "sparrow",
    "spider", "spinach", "sponge", "spruce", "squid", "statue", "summit", "sunset", "tablet",
    "tango", "teapot", "temple", "thistle", "thunder", "tiger", "timber", "toffee", "tomato",
    "topaz", "tractor", "trumpet", "tulip", "tunnel", "turnip", "turtle", "tuxedo", "umbrella",
    "unicorn", "valley", "velvet", "violin", "volcano", "wafer", "walnut", "walrus", "wasabi",
    "willow", "window", "wizard", "yogurt", "zebra", "zipper", "purple",
];

/// The index of `word` in [`WORDS`], if it is one.
pub fn index_of(word: &str) -> Option<usize> {
    WORDS.iter().position(|w| *w == word)
}

/// The words of the list nearest to `typed` (a mistyped word), when they are near enough to be
/// what was meant: at most one edit away for words of up to 4 letters, two for longer ones
/// (Damerau-Levenshtein: a swap of two neighbouring letters is one edit). All the words at the
/// nearest distance, in the list's order, at most 3 (more are no help); none when nothing is
/// near.
pub fn nearest(typed: &str) -> Vec<&'static str> {
    let most = if typed.chars().count() <= 4 { 1 } else { 2 };
    let scored: Vec<(usize, &'static str)> = WORDS
        .iter()
        .map(|w| (strsim::damerau_levenshtein(typed, w), *w))
        .filter(|&(d, _)| d <= most)
        .collect();
    let Some(best) = scored.iter().map(|&(d, _)| d).min() else {
        return Vec::new();
    };
    let near: Vec<&'static str> = scored
        .into_iter()
        .filter(|&(d, _)| d == best)
        .map(|(_, w)| w)
        .collect();
    if near.len() > 3 {
        Vec::new()
    } else {
        near
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_miss_finds_the_word_meant() {
        assert_eq!(nearest("purpel"), ["purple"], "a swap");
        assert_eq!(nearest("sausge"), ["sausage"], "a letter left out");
        assert_eq!(nearest("rivver"), ["river"], "a letter twice");
        assert_eq!(nearest("tigre"), ["tiger"]);
        assert_eq!(nearest("purple"), ["purple"]);
        assert_eq!(
            nearest("acron"),
            ["acorn", "apron"],
            "as near as each other"
        );
        assert!(nearest("xyzzy").is_empty(), "nothing near");
        assert!(nearest("test").is_empty(), "two edits from any short word");
        assert!(nearest("").is_empty());
    }

    #[test]
    fn words_are_distinct_short_lowercase() {
        let mut seen = std::collections::HashSet::new();
        for w in WORDS {
            assert!(seen.insert(w), "{w} twice");
            assert!((3..=8).contains(&w.len()), "{w}");
            assert!(w.bytes().all(|b| b.is_ascii_lowercase()), "{w}");
        }
        assert_eq!(seen.len(), 256);
    }
}
