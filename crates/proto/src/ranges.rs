//! A set of half-open `u64` ranges, kept merged and sorted.
//!
//! This is how hurtle remembers which bytes of a channel's stripe have arrived (receiver), which
//! must be sent again (sender) and which were already asked for (NACK bookkeeping). Adjacent and
//! overlapping ranges are merged on insert, so the set's size tracks the number of *holes*, not the
//! number of packets. It is tested against a naive bitmap model at the bottom of this file.

use std::collections::BTreeMap;
use std::ops::Range;

/// Sorted, merged, non-empty half-open ranges `[start, end)`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end; invariant: ranges are non-empty, disjoint and non-adjacent.
    map: BTreeMap<u64, u64>,
    total: u64,
}

impl std::fmt::Debug for RangeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of disjoint ranges held.
    pub fn range_count(&self) -> usize {
        self.map.len()
    }

    /// Total number of values (bytes) covered.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// True when nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Iterates over the ranges in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Range<u64>> + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// The lowest range, if any.
    pub fn first(&self) -> Option<Range<u64>> {
        self.map.iter().next().map(|(&s, &e)| s..e)
    }

    /// Adds `range`; returns how many values were newly covered (0 for a full duplicate).
    pub fn insert(&mut self, range: Range<u64>) -> u64 {
        if range.start >= range.end {
            return 0;
        }
        let (mut start, mut end) = (range.start, range.end);
        // Nearly every insert reaches or overlaps the highest range from within (data in
        // order): it grows in place, one lookup instead of four.
        if let Some(mut last) = self.map.last_entry() {
            let (s, e) = (*last.key(), *last.get());
            if s <= start && start <= e {
                if end <= e {
                    return 0;
                }
                *last.get_mut() = end;
                self.total += end - e;
                return end - e;
            }
        }
        let before = self.total;
        // Merge with a range that starts before `start` and reaches it.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                if e >= end {
                    return 0;
                }
                start = s;
                end = end.max(e);
                self.map.remove(&s);
                self.total -= e - s;
            }
        }
        // Swallow every range that starts inside [start, end].
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            self.map.remove(&s);
            self.total -= e - s;
            end = end.max(e);
        }
        self.map.insert(start, end);
        self.total += end - start;
        self.total - before
    }

    /// Removes `range`; returns how many values were removed.
    pub fn remove(&mut self, range: Range<u64>) -> u64 {
        if range.start >= range.end {
            return 0;
        }
        let before = self.total;
        // A range starting before `range.start` may overlap it: split off its head.
        if let Some((&s, &e)) = self.map.range(..range.start).next_back() {
            if e > range.start {
                self.map.insert(s, range.start);
                self.total -= e - range.start;
                if e > range.end {
                    self.map.insert(range.end, e);
                    self.total += e - range.end;
                }
            }
        }
        while let Some((&s, &e)) = self.map.range(range.start..range.end).next() {
            self.map.remove(&s);
            self.total -= e - s;
            if e > range.end {
                self.map.insert(range.end, e);
                self.total += e - range.end;
            }
        }
        before - self.total
    }

    /// True if `value` is covered.
    pub fn contains(&self, value: u64) -> bool {
        self.map
            .range(..=value)
            .next_back()
            .is_some_and(|(_, &e)| e > value)
    }

    /// True if every value of `range` is covered (an empty range is always covered).
    pub fn covers(&self, range: Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        self.map
            .range(..=range.start)
            .next_back()
            .is_some_and(|(_, &e)| e >= range.end)
    }

    /// The covered parts of `within`, in ascending order.
    pub fn overlapping(&self, within: Range<u64>) -> impl Iterator<Item = Range<u64>> + '_ {
        let head = self
            .map
            .range(..within.start)
            .next_back()
            .filter(|(_, &e)| e > within.start && within.end > within.start);
        head.into_iter()
            .chain(self.map.range(within.start..within.end.max(within.start)))
            .map(move |(&s, &e)| s.max(within.start)..e.min(within.end))
    }

    /// The parts of `within` that are *not* covered, in ascending order.
    pub fn gaps(&self, within: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut cursor = within.start;
        if within.start >= within.end {
            return out;
        }
        if let Some((_, &e)) = self.map.range(..=within.start).next_back() {
            cursor = cursor.max(e);
        }
        for (&s, &e) in self.map.range(within.start..within.end) {
            if s > cursor {
                out.push(cursor..s.min(within.end));
            }
            cursor = cursor.max(e);
            if cursor >= within.end {
                break;
            }
        }
        if cursor < within.end {
            out.push(cursor..within.end);
        }
        out
    }

    /// Removes and returns up to `max_len` values from the lowest range.
    pub fn pop_front(&mut self, max_len: u64) -> Option<Range<u64>> {
        let (&s, &e) = self.map.iter().next()?;
        let take_end = e.min(s.saturating_add(max_len.max(1)));
        self.remove(s..take_end);
        Some(s..take_end)
    }

    /// Adds every range of `other`.
    pub fn union_with(&mut self, other: &RangeSet) {
        for r in other.iter() {
            self.insert(r);
        }
    }

    /// Removes every range of `other`.
    pub fn subtract(&mut self, other: &RangeSet) {
        for r in other.iter() {
            self.remove(r);
        }
    }
}

impl FromIterator<Range<u64>> for RangeSet {
    fn from_iter<I: IntoIterator<Item = Range<u64>>>(iter: I) -> Self {
        let mut set = RangeSet::new();
        for r in iter {
            set.insert(r);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SPACE: u64 = 200;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
        Pop(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..SPACE, 0..40u64).prop_map(|(s, l)| Op::Insert(s, s + l)),
            (0..SPACE, 0..40u64).prop_map(|(s, l)| Op::Remove(s, s + l)),
            (0..30u64).prop_map(Op::Pop),
        ]
    }

    /// The naive oracle: one bool per value.
    fn model_ranges(bits: &[bool]) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for (i, &b) in bits.iter().enumerate() {
            let i = i as u64;
            if b {
                match out.last_mut() {
                    Some(r) if r.end == i => r.end = i + 1,
                    _ => out.push(i..i + 1),
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn matches_naive_model(ops in proptest::collection::vec(op(), 0..60)) {
            let mut set = RangeSet::new();
            let mut bits = vec![false; (SPACE + 50) as usize];
            for op in ops {
                match op {
                    Op::Insert(s, e) => {
                        let newly = (s..e).filter(|&i| !bits[i as usize]).count() as u64;
                        (s..e).for_each(|i| bits[i as usize] = true);
                        prop_assert_eq!(set.insert(s..e), newly);
                    }
                    Op::Remove(s, e) => {
                        let gone = (s..e).filter(|&i| bits[i as usize]).count() as u64;
                        (s..e).for_each(|i| bits[i as usize] = false);
                        prop_assert_eq!(set.remove(s..e), gone);
                    }
                    Op::Pop(n) => {
                        let expect = model_ranges(&bits).first().cloned().map(|r| r.start..r.end.min(r.start + n.max(1)));
                        let got = set.pop_front(n);
                        prop_assert_eq!(got.clone(), expect);
                        if let Some(r) = got { (r.start..r.end).for_each(|i| bits[i as usize] = false); }
                    }
                }
                let want = model_ranges(&bits);
                prop_assert_eq!(set.iter().collect::<Vec<_>>(), want.clone());
                prop_assert_eq!(set.total(), bits.iter().filter(|b| **b).count() as u64);
                // Point and range queries agree with the model too.
                for probe in [0u64, 7, 50, 99, 150, 199] {
                    prop_assert_eq!(set.contains(probe), bits[probe as usize]);
                    let within = probe..(probe + 13).min(SPACE);
                    let model_gaps: Vec<u64> = within.clone().filter(|&i| !bits[i as usize]).collect();
                    let gaps: Vec<u64> = set.gaps(within.clone()).into_iter().flatten().collect();
                    prop_assert_eq!(&gaps, &model_gaps);
                    let model_held: Vec<u64> = within.clone().filter(|&i| bits[i as usize]).collect();
                    let held: Vec<u64> = set.overlapping(within.clone()).flatten().collect();
                    prop_assert_eq!(&held, &model_held);
                    prop_assert_eq!(set.covers(within), model_gaps.is_empty());
                }
            }
        }
    }

    #[test]
    fn merges_adjacent_and_counts_duplicates() {
        let mut s = RangeSet::new();
        assert_eq!(s.insert(0..10), 10);
        assert_eq!(s.insert(10..20), 10);
        assert_eq!(s.range_count(), 1);
        assert_eq!(s.insert(5..15), 0);
        assert_eq!(s.insert(30..40), 10);
        assert_eq!(s.gaps(0..50), vec![20..30, 40..50]);
        assert_eq!(s.remove(5..35), 20);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..5, 35..40]);
    }

    #[test]
    fn in_order_inserts_grow_the_highest_range() {
        let mut s = RangeSet::new();
        assert_eq!(s.insert(100..200), 100);
        assert_eq!(s.insert(0..50), 50);
        // Appends, overlaps from within and duplicates of the highest range.
        for i in 2..10 {
            assert_eq!(s.insert(i * 100..i * 100 + 100), 100);
        }
        assert_eq!(s.insert(950..1050), 50);
        assert_eq!(s.insert(1000..1050), 0);
        assert_eq!(s.insert(100..1050), 0);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..50, 100..1050]);
        assert_eq!(s.total(), 1000);
        // One that starts below the highest range and reaches into it merges the ranges
        // between.
        assert_eq!(s.insert(40..1100), 100);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..1100]);
        assert_eq!(s.total(), 1100);
    }

    #[test]
    fn empty_ranges_are_ignored() {
        let mut s = RangeSet::new();
        assert_eq!(s.insert(5..5), 0);
        assert!(s.is_empty());
        assert!(s.covers(3..3));
        assert!(s.gaps(4..4).is_empty());
    }

    #[test]
    fn handles_values_near_u64_max() {
        let mut s = RangeSet::new();
        s.insert(u64::MAX - 10..u64::MAX);
        assert_eq!(s.pop_front(u64::MAX), Some(u64::MAX - 10..u64::MAX));
    }
}
