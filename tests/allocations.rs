//! With no observer, events cost nothing: an uncontended acquire and
//! release allocate as much with an observer that ignores its events as
//! with none (the events are borrowed, never built on the heap), and the
//! count without one is what it was before events existed. In a test
//! binary of its own: it counts the process's allocations.

mod common;

use std::alloc::System;
use std::time::Duration;

use redlock_sync::Redlock;
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
    let observed = common::builder(&nodes)
        .observer(|event| {
            std::hint::black_box(event);
        })
        .build()
        .unwrap();
    let (without, with) = (allocations(&bare), allocations(&observed));
    eprintln!(
        "allocations per acquire and release: {without} without an observer, {with} with one"
    );
    assert_eq!(with, without, "the events allocated");
}
