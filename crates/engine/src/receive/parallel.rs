//! Work split over a few threads in runs of consecutive items, the results joined in order
//! ([`in_runs`]): creating many part files, hashing many blocks.

/// `work` over `items` split into `threads` runs of consecutive items, one thread each (none
/// spawned for one), with the results joined in order. The first error is returned; a worker's
/// panic is passed on.
pub(super) fn in_runs<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&[T]) -> Result<Vec<R>, E> + Sync,
) -> Result<Vec<R>, E> {
    if threads <= 1 || items.len() <= 1 {
        return work(items);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(items.len().div_ceil(threads))
            .map(|run| scope.spawn(move || work(run)))
            .collect();
        let mut all = Vec::with_capacity(items.len());
        for w in workers {
            match w.join() {
                Ok(done) => all.extend(done?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(all)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_in_runs_keeps_the_order_and_returns_an_error() {
        let items: Vec<u32> = (0..103).collect();
        for threads in [1, 2, 4, 200] {
            let doubled = in_runs(&items, threads, |run| {
                Ok::<_, ()>(run.iter().map(|x| x * 2).collect())
            });
            assert_eq!(
                doubled.unwrap(),
                items.iter().map(|x| x * 2).collect::<Vec<_>>()
            );
            let failed = in_runs(&items, threads, |run| {
                if run.contains(&77) {
                    Err(77)
                } else {
                    Ok(run.to_vec())
                }
            });
            assert_eq!(failed, Err(77), "{threads} threads");
        }
    }
}
