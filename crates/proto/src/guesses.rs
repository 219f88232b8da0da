//! A code's budget of guesses: how many times a receiver lets anyone test a guess of its code,
//! counted so that no number of parallel, held or relayed connections gets more.
//!
//! | part | owns |
//! |---|---|
//! | [`GuessBudget`] | the count: guesses failed, guesses under way, and whether the code is spent |
//! | [`Guess`] | one guess under way: the slot it took, to be settled exactly once |
//! | [`Refused`] | why a guess was not let in (spent, or the budget taken by guesses under way) |
//! | [`Failed`] | what a failed guess left: the failures so far, and whether it spent the code |
//!
//! # The rule
//!
//! A guess is *charged* (it takes one of the budget's slots, [`GuessBudget::charge`]) before
//! the receiver sends the message that lets a guesser test it: the key agreement's answer,
//! whose confirmation tells a sender holding the right code from one holding another (and,
//! with the SPAKE2 share, lets an offline check of that one guess). The slot is given back
//! only when the guesser proves it holds the code ([`GuessBudget::proven`]); anything else
//! (a wrong code, silence, a close, a connection held open past its deadline) settles it as
//! failed ([`GuessBudget::failed`]) and the slot stays taken. With `limit` failures the code is
//! spent and no guess is let in again.
//!
//! Since the charged guesses under way and the failed ones together never exceed the limit,
//! **at most `limit` wrong guesses are ever answered**, however the guesses interleave. A
//! guess that finds every slot taken by guesses still under way is refused
//! ([`Refused::Busy`]): its driver may wait for one to settle and ask again.
//!
//! What this module does not own: the clock and the waiting (the engine's front door), the
//! key agreement itself ([`crate::secure`]), and what the receiver does with a spent code.

/// One guess under way: it holds a slot of the budget until it is settled with
/// [`GuessBudget::proven`] or [`GuessBudget::failed`]. Not `Clone`: each guess is settled
/// once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a guess must be settled: proven or failed"]
pub struct Guess {
    _slot: (),
}

/// Why a guess was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The code is spent: `limit` guesses failed.
    #[error("the code is spent: it was tried {0} times with the wrong words")]
    Spent(u32),
    /// Every slot left is held by a guess still under way (`under_way` of them); one may be
    /// the right code, so this one may come again once they are settled.
    #[error("{0} tries of the code are under way")]
    Busy(u32),
}

/// What a failed guess left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// Guesses failed so far, this one included.
    pub failures: u32,
    /// This failure spent the code (it was the `limit`th).
    pub spent: bool,
}

/// A code's budget of guesses: see the module docs for the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuessBudget {
    limit: u32,
    failed: u32,
    under_way: u32,
}

impl GuessBudget {
    /// A budget of `limit` guesses (a limit of 0 lets none in).
    pub fn new(limit: u32) -> GuessBudget {
        GuessBudget {
            limit,
            failed: 0,
            under_way: 0,
        }
    }

    /// Takes a slot for a guess about to be answered, or says why not.
    pub fn charge(&mut self) -> Result<Guess, Refused> {
        if self.is_spent() {
            return Err(Refused::Spent(self.failed));
        }
        if self.failed + self.under_way >= self.limit {
            return Err(Refused::Busy(self.under_way));
        }
        self.under_way += 1;
        Ok(Guess { _slot: () })
    }

    /// The guesser proved it holds the code: its slot is given back.
    pub fn proven(&mut self, guess: Guess) {
        let Guess { _slot: () } = guess;
        self.under_way = self.under_way.saturating_sub(1);
    }

    /// The guess failed (or was never proven): its slot stays taken, for good.
    pub fn failed(&mut self, guess: Guess) -> Failed {
        let Guess { _slot: () } = guess;
        self.under_way = self.under_way.saturating_sub(1);
        self.failed = self.failed.saturating_add(1).min(self.limit);
        Failed {
            failures: self.failed,
            spent: self.is_spent(),
        }
    }

    /// Whether `limit` guesses failed: no guess is let in again.
    pub fn is_spent(&self) -> bool {
        self.failed >= self.limit
    }

    /// Guesses failed so far.
    pub fn failures(&self) -> u32 {
        self.failed
    }

    /// Guesses charged and not yet settled.
    pub fn under_way(&self) -> u32 {
        self.under_way
    }

    /// The budget's limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn three_wrong_guesses_spend_the_code() {
        let mut b = GuessBudget::new(3);
        for n in 1..=3 {
            let g = b.charge().unwrap();
            let f = b.failed(g);
            assert_eq!(
                f,
                Failed {
                    failures: n,
                    spent: n == 3
                }
            );
        }
        assert_eq!(b.charge(), Err(Refused::Spent(3)));
        assert!(b.is_spent());
    }

    #[test]
    fn guesses_under_way_hold_the_slots_and_a_proven_one_gives_its_back() {
        let mut b = GuessBudget::new(3);
        let held: Vec<Guess> = (0..3).map(|_| b.charge().unwrap()).collect();
        // A fourth, however many more come at once, is not answered.
        for _ in 0..32 {
            assert_eq!(b.charge(), Err(Refused::Busy(3)));
        }
        let mut held = held.into_iter();
        b.proven(held.next().unwrap());
        assert_eq!(b.under_way(), 2);
        let again = b.charge().unwrap();
        assert_eq!(b.charge(), Err(Refused::Busy(3)));
        b.proven(again);
        // The two held ones fail (a proxy kept them open past their deadline): charged.
        for g in held {
            b.failed(g);
        }
        assert_eq!((b.failures(), b.under_way()), (2, 0));
        let last = b.charge().unwrap();
        assert_eq!(b.charge(), Err(Refused::Busy(1)));
        assert!(b.failed(last).spent);
    }

    #[test]
    fn a_budget_of_nothing_lets_nothing_in() {
        assert_eq!(GuessBudget::new(0).charge(), Err(Refused::Spent(0)));
    }

    /// One step of a guesser: start (ask for a slot, and be answered if it got one), or
    /// settle the `i`th guess under way (modulo how many there are) as proven or failed.
    #[derive(Debug, Clone)]
    enum Step {
        Start,
        Settle { i: usize, right: bool },
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                Just(Step::Start),
                (any::<usize>(), any::<bool>()).prop_map(|(i, right)| Step::Settle { i, right }),
            ],
            0..200,
        )
    }

    proptest! {
        /// Any interleaving of any number of concurrent guessers, each answered only once
        /// charged, each settled once, in any order: at most `limit` wrong guesses are
        /// answered, failed and under-way guesses never exceed the limit, and a spent code
        /// lets nobody in.
        #[test]
        fn no_interleaving_answers_more_wrong_guesses_than_the_limit(
            limit in 0u32..6,
            steps in steps(),
        ) {
            let mut b = GuessBudget::new(limit);
            let mut under_way: Vec<Guess> = Vec::new();
            let mut answered_wrong = 0u32;
            let mut answered = 0u32;
            let mut proven = 0u32;
            for step in steps {
                match step {
                    Step::Start => match b.charge() {
                        Ok(g) => {
                            answered += 1;
                            under_way.push(g);
                        }
                        Err(Refused::Spent(n)) => {
                            prop_assert_eq!(n, limit);
                            prop_assert!(b.is_spent());
                        }
                        Err(Refused::Busy(n)) => {
                            prop_assert_eq!(n as usize, under_way.len());
                            prop_assert!(n > 0);
                        }
                    },
                    Step::Settle { i, right } if !under_way.is_empty() => {
                        let g = under_way.swap_remove(i % under_way.len());
                        if right {
                            b.proven(g);
                            proven += 1;
                        } else {
                            answered_wrong += 1;
                            let f = b.failed(g);
                            prop_assert_eq!(f.failures, answered_wrong);
                            prop_assert_eq!(f.spent, answered_wrong == limit);
                        }
                    }
                    Step::Settle { .. } => {}
                }
                prop_assert!(b.failures() + b.under_way() <= limit);
                prop_assert_eq!(b.under_way() as usize, under_way.len());
            }
            // Guesses still under way end as failures (their deadline passed).
            for g in under_way.drain(..) {
                answered_wrong += 1;
                b.failed(g);
            }
            prop_assert!(answered_wrong <= limit, "{} wrong guesses answered", answered_wrong);
            prop_assert_eq!(answered, answered_wrong + proven);
        }
    }
}
