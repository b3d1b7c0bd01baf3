//! Keeping the lock alive while the command runs, and seeing when it is
//! lost.
//!
//! Plain locks use the library's `with_lock`: its watchdog thread extends
//! the lock, and its [`LockGuard`] says when it is lost. Fenced locks cannot:
//! `with_lock` acquires its own, plain, lock, and the library has no way to
//! hand it a lock taken with `try_acquire_fenced`. For those, [`hold`] runs
//! a small keeper on [`Redlock::extend`] with the watchdog's rules: extend
//! by the TTL each time a third of the validity is left, retry an
//! extension that too few nodes answered after the retry delay while
//! validity is left, never extend past the hold cap, and once lost, lost
//! for good.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redlock_sync::{Lock, LockError, LockGuard, Redlock, Report};

/// What the command's supervisor needs to know about the lock.
pub trait Lease {
    /// Whether the lock is still held; false for good once it is lost.
    fn is_held(&self) -> bool;
    /// Whether the lock will not be extended any more (the hold cap is
    /// reached, or it is lost).
    fn is_ending(&self) -> bool;
    /// Why the lock was lost, for the message.
    fn lost_reason(&self) -> String;
}

impl Lease for LockGuard {
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }

    fn is_ending(&self) -> bool {
        LockGuard::is_ending(self)
    }

    fn lost_reason(&self) -> String {
        match self.check() {
            Err(e) => e.to_string(),
            Ok(()) => "it is held".to_string(),
        }
    }
}

/// How a fenced hold ended.
pub struct Held<T> {
    /// What the closure returned.
    pub value: T,
    /// Whether the lock was held until the closure returned.
    pub held: bool,
    /// Why it was lost, if it was.
    pub lost_reason: String,
    /// The release's outcome.
    pub released: Result<Report, LockError>,
}

/// Keeps `lock` alive (extending it by `ttl`, never past `max_hold` from
/// now) while `f` runs, then releases it. `pause` is the wait before
/// retrying an extension that too few nodes answered.
pub fn hold<T>(
    locks: &Redlock,
    mut lock: Lock,
    ttl: Duration,
    max_hold: Option<Duration>,
    pause: Duration,
    f: impl FnOnce(&dyn Lease) -> T,
) -> Result<Held<T>, LockError> {
    let cap = max_hold.and_then(|hold| Instant::now().checked_add(hold));
    let keeper = Keeper::new(&lock, cap);
    let value = std::thread::scope(|s| {
        let watchdog = std::thread::Builder::new()
            .name("redlock-keeper".into())
            .spawn_scoped(s, || keeper.keep(locks, &mut lock, ttl, cap, pause))
            .map_err(LockError::Thread)?;
        // Stops the keeper even if `f` panics: the scope joins it first.
        let stop = StopOnDrop(&keeper);
        let value = f(&keeper);
        drop(stop);
        // The keeper only extends; a panic in it leaves the lock to expire.
        let _ = watchdog.join();
        Ok::<_, LockError>(value)
    });
    let value = match value {
        Ok(value) => value,
        Err(e) => {
            let _ = locks.release(lock);
            return Err(e);
        }
    };
    let held = keeper.is_held();
    let lost_reason = keeper.lost_reason();
    Ok(Held {
        value,
        held,
        lost_reason,
        released: locks.release(lock),
    })
}

/// Tells the keeper to stop when dropped.
struct StopOnDrop<'a>(&'a Keeper);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The fenced lock's state, shared by the keeper thread and the
/// supervisor.
struct Keeper {
    state: Mutex<State>,
    wake: Condvar,
    cap: Option<Instant>,
}

struct State {
    /// The validity deadline; `None` once lost.
    valid_until: Option<Instant>,
    /// Why the last extension failed (too few nodes answered), if it did.
    failure: Option<String>,
    /// The error of the extension that was refused, if one was.
    refused: Option<String>,
    /// The command has ended: stop extending.
    stop: bool,
    /// The hold cap is reached: no more extensions.
    capped: bool,
}

impl Keeper {
    fn new(lock: &Lock, cap: Option<Instant>) -> Keeper {
        Keeper {
            state: Mutex::new(State {
                valid_until: Some(lock.valid_until()),
                failure: None,
                refused: None,
                stop: false,
                capped: cap.is_some_and(|cap| cap <= lock.valid_until()),
            }),
            wake: Condvar::new(),
            cap,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the lock is held now; marks it lost for good once its
    /// deadline has passed.
    fn held_in(state: &mut State) -> bool {
        match state.valid_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                state.valid_until = None;
                false
            }
            None => false,
        }
    }

    /// The extension's new deadline, unless the old one passed first (a
    /// late extension does not revive the lock). Returns whether held.
    fn extended(&self, until: Instant) -> bool {
        let mut state = self.state();
        if !Keeper::held_in(&mut state) {
            return false;
        }
        state.valid_until = Some(self.cap.map_or(until, |cap| cap.min(until)));
        state.failure = None;
        true
    }

    fn refused(&self, e: &LockError) {
        let mut state = self.state();
        state.valid_until = None;
        state.refused = Some(e.to_string());
    }

    fn failed(&self, e: &LockError) {
        self.state().failure = Some(e.to_string());
    }

    fn stop(&self) {
        self.state().stop = true;
        self.wake.notify_all();
    }

    /// Sleeps until `until`; false if told to stop first.
    fn sleep_until(&self, until: Instant) -> bool {
        let mut state = self.state();
        loop {
            if state.stop {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            state = match self.wake.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// The keeper thread: extends `lock` until told to stop, the lock is
    /// lost, or the hold cap is reached.
    fn keep(
        &self,
        locks: &Redlock,
        lock: &mut Lock,
        ttl: Duration,
        cap: Option<Instant>,
        pause: Duration,
    ) {
        let mut due = extension_due(lock);
        loop {
            if !self.sleep_until(due) {
                return;
            }
            let now = Instant::now();
            let mut this_ttl = ttl;
            let room = cap.map(|cap| cap.saturating_duration_since(now));
            let last = room.is_some_and(|room| room < ttl);
            if let Some(room) = room.filter(|_| last) {
                // The last extension: shortened to end at the cap, and
                // none at all if the validity already reaches it.
                self.state().capped = true;
                if room <= lock.valid_until().saturating_duration_since(now) {
                    return;
                }
                this_ttl = room;
            }
            match locks.extend(lock, this_ttl) {
                Ok(()) => {
                    if !self.extended(lock.valid_until()) || last {
                        return;
                    }
                    due = extension_due(lock);
                }
                Err(e @ LockError::Lost { .. }) => return self.refused(&e),
                // Only a TTL shortened by the cap can be refused as an
                // argument: too short to extend anything.
                Err(LockError::Argument(_)) => return,
                Err(e) => {
                    self.failed(&e);
                    if lock.valid_until() <= now {
                        // Out of validity: lost; the supervisor sees it.
                        return;
                    }
                    // Never spin, even with a zero retry delay.
                    let retry = now + pause.max(Duration::from_millis(1));
                    due = retry.min(lock.valid_until());
                }
            }
        }
    }
}

/// When to extend next: once only a third of the validity is left.
fn extension_due(lock: &Lock) -> Instant {
    Instant::now() + lock.validity().mul_f64(2.0 / 3.0)
}

impl Lease for Keeper {
    fn is_held(&self) -> bool {
        Keeper::held_in(&mut self.state())
    }

    fn is_ending(&self) -> bool {
        let mut state = self.state();
        state.capped || !Keeper::held_in(&mut state)
    }

    fn lost_reason(&self) -> String {
        let state = self.state();
        match (&state.refused, &state.failure) {
            (Some(refused), _) => refused.clone(),
            (None, Some(failure)) => {
                format!("its validity ran out while extensions failed: {failure}")
            }
            (None, None) => "its validity ran out".to_string(),
        }
    }
}
