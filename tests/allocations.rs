//! With no observer, events cost nothing: while the nodes answer, an
//! uncontended acquire and release allocate as much with an observer that
//! ignores its events as with none (the events are borrowed, never built on
//! the heap). In a test binary of its own: it counts the process's
//! allocations.

mod common;

use std::alloc::System;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redlock_sync::{Redlock, What};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocations of the fewest of 20 acquire-and-release pairs (after a
/// warm-up): other threads of the process allocate too, now and then.
fn allocations(locks: &Redlock) -> usize {
    let pair = || {
        let lock = locks.acquire("counted", Duration::from_secs(10)).unwrap();
        locks.release(lock).unwrap();
    };
    (0..5).for_each(|_| pair());
    (0..20)
        .map(|_| {
            let region = Region::new(GLOBAL);
            pair();
            region.change().allocations
        })
        .min()
        .unwrap()
}

#[test]
fn an_uncontended_acquire_and_release_allocate_no_more_for_the_events() {
    let nodes = common::cluster(3);
    let bare = common::builder(&nodes).build().unwrap();
    // A node that fails on a busy machine is told as a change, which does
    // allocate: such a measurement is taken again.
    let failed = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&failed);
    let observed = common::builder(&nodes)
        .observer(move |event| {
            std::hint::black_box(event);
            if event.what == What::NodeFailed {
                seen.store(true, Ordering::Relaxed);
            }
        })
        .build()
        .unwrap();
    let (mut without, mut with) = (allocations(&bare), allocations(&observed));
    for _ in 0..3 {
        if !failed.swap(false, Ordering::Relaxed) {
            break;
        }
        (without, with) = (allocations(&bare), allocations(&observed));
    }
    eprintln!(
        "allocations per acquire and release: {without} without an observer, {with} with one"
    );
    assert_eq!(with, without, "the events allocated");
}
