//! Signals to the tool, as events its loops can wait for with a timeout:
//! INT, TERM and HUP (to end a wait, or to pass on to the command) and
//! CHLD (the command may have ended).
//!
//! A thread blocks on `signal-hook`'s iterator and sends each signal down a
//! channel, so that waiting for "the next signal, or this much time" is one
//! `recv_timeout`, with no polling and no `unsafe`.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::exit::Failure;

/// Something that happened to the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A signal that asks the tool (and its command) to stop.
    Stop(i32),
    /// A child changed state: reap it.
    Child,
}

/// The signals asked for, delivered as [`Event`]s until dropped.
pub struct Events {
    events: Receiver<Event>,
    #[cfg(unix)]
    listener: Option<unix::Listener>,
}

impl Events {
    /// Starts listening. From now on INT, TERM and HUP no longer end the
    /// tool by themselves: the tool decides.
    pub fn listen() -> Result<Events, Failure> {
        let (tx, events) = mpsc::channel();
        #[cfg(unix)]
        let listener = Some(unix::Listener::start(tx)?);
        #[cfg(not(unix))]
        drop(tx);
        Ok(Events {
            events,
            #[cfg(unix)]
            listener,
        })
    }

    /// The next event within `timeout`, if any.
    pub fn next(&self, timeout: Duration) -> Option<Event> {
        match self.events.recv_timeout(timeout) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            // No listener (not Unix): nothing will come, but the caller
            // still wants its pause.
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(timeout);
                None
            }
        }
    }

    /// Waits up to `timeout` for a stop signal, passing over child events;
    /// returns the signal if one came.
    ///
    /// `timeout` comes from the command line (`--retry-delay`), and
    /// `Instant + Duration` panics past what an `Instant` can hold: a pause
    /// that long has no deadline, and only a signal ends it.
    pub fn stop_within(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            match self.next(left) {
                Some(Event::Stop(signal)) => return Some(signal),
                Some(Event::Child) if !left.is_zero() => continue,
                _ => return None,
            }
        }
    }

    /// A stop signal that has already arrived, if any.
    pub fn pending_stop(&self) -> Option<i32> {
        self.events.try_iter().find_map(|event| match event {
            Event::Stop(signal) => Some(signal),
            Event::Child => None,
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(listener) = self.listener.take() {
            listener.stop();
        }
    }
}

#[cfg(unix)]
mod unix {
    use std::sync::mpsc::Sender;
    use std::thread::JoinHandle;

    use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
    use signal_hook::iterator::{Handle, Signals};

    use super::Event;
    use crate::exit::Failure;

    /// The thread that turns signals into events.
    pub struct Listener {
        handle: Handle,
        thread: JoinHandle<()>,
    }

    impl Listener {
        pub fn start(tx: Sender<Event>) -> Result<Listener, Failure> {
            let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGCHLD])
                .map_err(|e| Failure::system(format!("cannot handle signals: {e}")))?;
            let handle = signals.handle();
            let thread = std::thread::Builder::new()
                .name("redlock-signals".into())
                .spawn(move || {
                    for signal in signals.forever() {
                        let event = match signal {
                            SIGCHLD => Event::Child,
                            stop => Event::Stop(stop),
                        };
                        if tx.send(event).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Failure::system(format!("cannot start the signal thread: {e}")))?;
            Ok(Listener { handle, thread })
        }

        pub fn stop(self) {
            self.handle.close();
            // The thread only forwards signals; if it panicked there is
            // nothing left to clean up.
            let _ = self.thread.join();
        }
    }
}
