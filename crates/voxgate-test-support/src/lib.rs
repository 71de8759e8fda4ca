//! Test helpers shared by the voxgate crates. Used only as a dev-dependency.
//!
//! [`CountingAllocator`] proves the "no heap allocation on the audio path" invariant of
//! ARCHITECTURE.md: install it as the global allocator of one integration-test binary and
//! measure a closure with [`allocations_during`].
//!
//! ```
//! use voxgate_test_support::{CountingAllocator, allocations_during};
//!
//! #[global_allocator]
//! static GLOBAL: CountingAllocator = CountingAllocator;
//!
//! # fn main() {
//! let mut buf = Vec::with_capacity(64);
//! assert_eq!(allocations_during(|| buf.extend_from_slice(b"fits")), 0);
//! assert_eq!(allocations_during(|| drop(vec![0u8; 4096])), 1);
//! # }
//! ```
//!
//! Counts are per thread, so tests running in parallel in the same binary do not see each
//! other's allocations. libopus (voxgate-opus-sys) allocates its state through Rust's
//! allocator, so its allocations are counted too; other C code calling `malloc` is not.
//!
//! With the `fake-providers` feature, [`fake_providers`] serves zero-delay (or delayed)
//! OpenAI-compatible ASR, LLM and TTS endpoints in-process, so a real turn (recognition, a
//! streamed completion, streamed speech) runs without a model: `cargo xtask load` and the load
//! generator's end-to-end test use them.

// The one place in the workspace that needs `unsafe`: a `GlobalAlloc` impl cannot be written
// without it. Every method forwards to `System` unchanged.
#![allow(unsafe_code, reason = "GlobalAlloc is an unsafe trait")]

#[cfg(feature = "fake-providers")]
pub mod fake_providers;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

/// How many thread tags [`set_thread_tag`] accepts.
pub const TAGS: usize = 4;

/// Bytes currently allocated through [`CountingAllocator`] (allocations minus frees), per thread
/// tag, so the footprint of a whole subsystem (a server runtime's threads) can be measured apart
/// from a client running in the same process.
static LIVE_BYTES: [AtomicI64; TAGS] = [const { AtomicI64::new(0) }; TAGS];

thread_local! {
    static TAG: Cell<usize> = const { Cell::new(0) };
}

fn live_add(delta: i64) {
    let tag = TAG.try_with(Cell::get).unwrap_or(0);
    if let Some(counter) = LIVE_BYTES.get(tag) {
        counter.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Attributes this thread's future allocations and frees to `tag` (`0..TAGS`; the default is 0),
/// e.g. from a tokio runtime's `on_thread_start`. Out-of-range tags count as 0.
pub fn set_thread_tag(tag: usize) {
    let tag = if tag < TAGS { tag } else { 0 };
    let _ = TAG.try_with(|t| t.set(tag));
}

thread_local! {
    // A const-initialised `Cell` never allocates, so counting cannot recurse into the allocator.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count(size: usize) {
    // `try_with`: the slot is gone while the thread is being torn down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get().saturating_add(size as u64)));
}

/// A global allocator that forwards to [`System`] and counts allocations and reallocations
/// (not frees) per thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; counting only
// touches const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        live_add(layout.size() as i64);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        live_add(layout.size() as i64);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        live_add(new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live_add(-(layout.size() as i64));
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What one measured closure allocated on the current thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocationStats {
    /// Allocations plus reallocations.
    pub count: u64,
    /// Bytes requested by them (a reallocation counts its new size).
    pub bytes: u64,
}

/// The allocations made on this thread so far. Only meaningful when [`CountingAllocator`] is the
/// global allocator; otherwise always zero.
pub fn allocations() -> AllocationStats {
    AllocationStats {
        count: ALLOCATIONS.with(Cell::get),
        bytes: BYTES.with(Cell::get),
    }
}

/// Runs `f` and returns its result with what it allocated on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, AllocationStats) {
    let before = allocations();
    let result = f();
    let after = allocations();
    let stats = AllocationStats {
        count: after.count - before.count,
        bytes: after.bytes - before.bytes,
    };
    (result, stats)
}

/// Heap bytes live right now through [`CountingAllocator`], all threads and tags. Only
/// meaningful when it is the global allocator; otherwise always zero.
pub fn live_bytes() -> i64 {
    LIVE_BYTES.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// Heap bytes live right now that were allocated (net of frees) by threads tagged `tag`. Memory
/// allocated under one tag and freed under another shows up as a positive and a negative.
pub fn live_bytes_tagged(tag: usize) -> i64 {
    LIVE_BYTES.get(tag).map_or(0, |c| c.load(Ordering::Relaxed))
}

/// How many allocations `f` made on this thread.
pub fn allocations_during(f: impl FnOnce()) -> u64 {
    measure(f).1.count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: CountingAllocator = CountingAllocator;

    #[test]
    fn live_bytes_follow_the_thread_tag() {
        let tag = 3;
        std::thread::spawn(move || {
            set_thread_tag(tag);
            let before = live_bytes_tagged(tag);
            let buf = vec![0u8; 10_000];
            assert!(live_bytes_tagged(tag) - before >= 10_000);
            drop(buf);
            assert_eq!(live_bytes_tagged(tag), before);
        })
        .join()
        .unwrap();
        // Out-of-range tags fall back to the default tag instead of panicking.
        std::thread::spawn(|| {
            set_thread_tag(TAGS + 1);
            let before = live_bytes_tagged(0);
            let buf = vec![0u8; 10_000];
            assert!(live_bytes_tagged(0) - before >= 10_000);
            drop(buf);
        })
        .join()
        .unwrap();
    }
}
