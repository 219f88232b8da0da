//! A wake-up that a thread waits on beside its sockets ([`Bell`]): the sender's session loop
//! sleeps in one `poll(2)` on the feedback datagrams' sockets and its bell, which the control
//! connection's reader and the channel threads ring when they have queued something for it.
//! A report then costs one wake-up of one thread, not a reader thread's wake-up and a hand-off.

use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};

/// A level-triggered wake-up: [`ring`](Bell::ring) makes its [`fd`](Bell::fd) readable until
/// the waiter [`answer`](Bell::answer)s. Rings between two answers cost one system call
/// together: the first sends a byte, the others see it pending.
#[derive(Debug)]
pub struct Bell {
    /// A ring is pending: set by the first ring after an answer, cleared by the answer.
    rung: AtomicBool,
    ring: UnixDatagram,
    wait: UnixDatagram,
}

impl Bell {
    /// A bell not rung.
    pub fn new() -> io::Result<Bell> {
        let (ring, wait) = UnixDatagram::pair()?;
        ring.set_nonblocking(true)?;
        wait.set_nonblocking(true)?;
        Ok(Bell {
            rung: AtomicBool::new(false),
            ring,
            wait,
        })
    }

    /// Wakes the waiter: at once if it waits, at its next wait if it does not. Never blocks
    /// (a full socket holds a pending ring already).
    pub fn ring(&self) {
        if !self.rung.swap(true, Ordering::SeqCst) {
            let _ = self.ring.send(&[1]);
        }
    }

    /// What the waiter polls for reading.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wait.as_fd()
    }

    /// The waiter woke: clears the rings so far. Call it before taking what the ringers
    /// queued: a ring after this wakes the next wait.
    pub fn answer(&self) {
        // The bytes first, then the flag: a ring whose byte this drains was made before the
        // flag is cleared, so the next ring sends again. (Cleared first, a ring between the
        // two would set the flag and have its byte drained, and every later ring would find
        // the flag set and send nothing: the waiter never woke by the bell again.)
        let mut b = [0u8; 16];
        loop {
            match self.wait.recv(&mut b) {
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.rung.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::udp::wait_readable;
    use std::time::Duration;

    fn readable(bell: &Bell) -> bool {
        wait_readable([Some(bell.fd())], Duration::ZERO).unwrap() & 1 != 0
    }

    #[test]
    fn a_ring_stays_readable_until_answered_and_rings_after_an_answer_wake_again() {
        let bell = Bell::new().unwrap();
        assert!(!readable(&bell));
        bell.ring();
        bell.ring();
        assert!(readable(&bell));
        assert!(readable(&bell), "a ring is level-triggered");
        bell.answer();
        assert!(!readable(&bell), "two rings before an answer woke twice");
        bell.ring();
        assert!(readable(&bell), "a ring after an answer was lost");
    }

    /// A ringer on another thread rings as fast as it can while the waiter, as the session
    /// loop does, answers only when the bell woke it: a ring made while the waiter answers
    /// must not leave the bell set with no byte pending (then no later ring wakes it, and the
    /// wait times out though the ringer never stops). Bounded: 300 ms of answers.
    #[test]
    fn rings_that_race_an_answer_still_wake_the_next_wait() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let bell = Arc::new(Bell::new().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (bell.clone(), stop.clone());
        let ringer = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                b.ring();
            }
        });
        let end = std::time::Instant::now() + Duration::from_millis(300);
        let mut woke = 0u32;
        let mut lost = false;
        while std::time::Instant::now() < end {
            if wait_readable([Some(bell.fd())], Duration::from_secs(1)).unwrap() & 1 == 0 {
                lost = true;
                break;
            }
            bell.answer();
            woke += 1;
        }
        stop.store(true, Ordering::SeqCst);
        ringer.join().unwrap();
        assert!(
            !lost,
            "the bell stopped waking its waiter after {woke} answers"
        );
    }

    #[test]
    fn a_ring_from_another_thread_ends_a_wait() {
        let bell = std::sync::Arc::new(Bell::new().unwrap());
        let b = bell.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b.ring();
        });
        let ready = wait_readable([Some(bell.fd())], Duration::from_secs(30)).unwrap();
        assert_eq!(ready & 1, 1);
        t.join().unwrap();
    }
}
