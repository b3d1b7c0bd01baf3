//! A small helper for the crate's mutexes.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, even if a thread panicked holding it.
///
/// Every mutex of the crate guards state that stays consistent between
/// statements, so a panic elsewhere never leaves it half-written.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
