//! A fixed set of worker threads with a bounded queue, for CPU-bound inference.
//!
//! Inference takes hundreds of milliseconds of CPU; run on the async runtime it would stall
//! every session sharing the thread. Each job goes to a worker thread instead, and the caller
//! awaits a oneshot. The queue is bounded: when every worker is busy and `queue` jobs already
//! wait, [`WorkerPool::run`] fails at once with [`ProviderError::Busy`], so load beyond what the
//! machine can recognize turns into a clear error (and the provider's fallback, if one is
//! configured) rather than into ever longer waits.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokio::sync::oneshot;
use voxgate_providers::ProviderError;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A pool of inference threads; cheap to clone (all clones share the threads).
///
/// The threads end when the last clone is dropped and the queue has drained.
#[derive(Clone)]
pub struct WorkerPool {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    workers: usize,
    queue: usize,
    sender: Mutex<Option<mpsc::SyncSender<Job>>>,
    /// Jobs accepted and not yet finished (running or queued).
    in_flight: AtomicUsize,
    done: AtomicU64,
    refused: AtomicU64,
    busy_micros: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping the sender ends each worker's `recv` loop once the queue is empty.
        if let Ok(mut s) = self.sender.lock() {
            s.take();
        }
    }
}

/// Counters of a [`WorkerPool`], for metrics and `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Worker threads.
    pub workers: usize,
    /// Jobs that may wait beyond the running ones.
    pub queue: usize,
    /// Jobs running or waiting now.
    pub in_flight: usize,
    /// Jobs finished since start.
    pub done: u64,
    /// Jobs refused as busy since start.
    pub refused: u64,
    /// Total time workers spent on jobs, in microseconds.
    pub busy_micros: u64,
}

impl WorkerPool {
    /// Starts `workers` threads (at least one) named `<name>-<i>`, accepting up to `queue` jobs
    /// beyond the running ones.
    ///
    /// # Errors
    /// [`ProviderError::Local`] when the operating system refuses a thread.
    pub fn new(name: &str, workers: usize, queue: usize) -> Result<Self, ProviderError> {
        let workers = workers.max(1);
        // The channel holds the waiting jobs only; `in_flight` bounds running + waiting, so the
        // channel never blocks a sender (its capacity is the whole admitted amount).
        let (tx, rx) = mpsc::sync_channel::<Job>(workers + queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    loop {
                        // Hold the lock only to take one job, never while running it.
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| ProviderError::Local(format!("cannot start {name} worker: {e}")))?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                workers,
                queue,
                sender: Mutex::new(Some(tx)),
                in_flight: AtomicUsize::new(0),
                done: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                busy_micros: AtomicU64::new(0),
            }),
        })
    }

    /// Runs `job` on a worker and waits for its result without blocking the runtime.
    ///
    /// Dropping the returned future does not stop a job already running (inference cannot be
    /// interrupted midway) but its result is discarded.
    ///
    /// # Errors
    /// [`ProviderError::Busy`] at once when every worker is busy and the queue is full;
    /// [`ProviderError::Local`] when the job panicked.
    pub async fn run<T, F>(&self, job: F) -> Result<T, ProviderError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let inner = &self.inner;
        let limit = inner.workers + inner.queue;
        let admitted = inner
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ProviderError::Busy(format!(
                "{}: {} workers busy and {} waiting",
                inner.name, inner.workers, inner.queue
            )));
        }
        let (tx, rx) = oneshot::channel();
        let done_inner = Arc::clone(inner);
        let wrapped: Job = Box::new(move || {
            let started = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(job));
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            done_inner.busy_micros.fetch_add(micros, Ordering::Relaxed);
            done_inner.done.fetch_add(1, Ordering::Relaxed);
            done_inner.in_flight.fetch_sub(1, Ordering::AcqRel);
            // The caller may have gone away; its result is then discarded.
            let _ = tx.send(result.map_err(|_| ()));
        });
        let sent = match inner.sender.lock() {
            Ok(s) => s.as_ref().map(|s| s.try_send(wrapped).is_ok()),
            Err(_) => None,
        };
        if sent != Some(true) {
            inner.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ProviderError::Local(format!(
                "{}: workers stopped",
                inner.name
            )));
        }
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(())) => Err(ProviderError::Local(format!(
                "{}: the job panicked (see the log)",
                inner.name
            ))),
            Err(_) => Err(ProviderError::Local(format!(
                "{}: worker stopped",
                inner.name
            ))),
        }
    }

    /// The pool's counters now.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            workers: i.workers,
            queue: i.queue,
            in_flight: i.in_flight.load(Ordering::Acquire),
            done: i.done.load(Ordering::Relaxed),
            refused: i.refused.load(Ordering::Relaxed),
            busy_micros: i.busy_micros.load(Ordering::Relaxed),
        }
    }

    /// The name given at [`WorkerPool::new`].
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("name", &self.inner.name)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_returns_results() {
        let pool = WorkerPool::new("t", 2, 2).unwrap();
        let a = pool.run(|| 2 + 2).await.unwrap();
        assert_eq!(a, 4);
        let s = pool.stats();
        assert_eq!((s.done, s.refused, s.in_flight), (1, 0, 0));
    }

    #[tokio::test]
    async fn refuses_at_once_when_workers_and_queue_are_full() {
        let pool = WorkerPool::new("t", 1, 1).unwrap();
        let gate = Arc::new(Barrier::new(2));
        let g = Arc::clone(&gate);
        // One running (held by the barrier), one queued: the third is refused.
        let running = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(move || g.wait()).await }
        });
        while pool.stats().in_flight < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let queued = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(|| 7).await }
        });
        while pool.stats().in_flight < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let refused = pool.run(|| 0).await;
        assert!(
            matches!(&refused, Err(ProviderError::Busy(m)) if m.contains("1 workers busy")),
            "{refused:?}"
        );
        assert!(refused.unwrap_err().is_transient());
        gate.wait();
        running.await.unwrap().unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), 7);
        let s = pool.stats();
        assert_eq!((s.done, s.refused, s.in_flight), (2, 1, 0));
        // Capacity is back once the jobs finished.
        assert_eq!(pool.run(|| 1).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_worker_survives() {
        let pool = WorkerPool::new("t", 1, 0).unwrap();
        #[allow(clippy::panic)]
        let r: Result<(), _> = pool.run(|| panic!("model exploded")).await;
        assert!(matches!(r, Err(ProviderError::Local(_))), "{r:?}");
        assert_eq!(pool.run(|| 5).await.unwrap(), 5);
    }
}
