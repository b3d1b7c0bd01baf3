//! Signals to the tool, as events its loops can wait for with a timeout:
//! INT, TERM and HUP (to end a wait, or to pass on to the command), CHLD
//! (a child may have ended) and USR1 (the supervisor's parent-death
//! signal); and the lines of a pipe ([`Events::read_lines`]).
//!
//! A stop signal also cancels [`Events::cancel`], the handle that the
//! library's waiting calls are given: a wait for a lock ends at once.
//!
//! A thread blocks on `signal-hook`'s iterator and sends each signal down a
//! channel, so that waiting for "the next signal, or this much time" is one
//! `recv_timeout`, with no polling and no `unsafe`.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use redlock_sync::Cancel;

use crate::exit::Failure;

/// Something that happened to the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A signal that asks the tool (and its command) to stop.
    Stop(i32),
    /// A child changed state: reap it.
    Child,
    /// SIGUSR1: the supervisor's parent may have died.
    Wake,
    /// A line read by [`Events::read_lines`].
    Line(String),
    /// What [`Events::read_lines`] reads has ended (or failed).
    Closed,
}

/// The signals asked for, delivered as [`Event`]s until dropped.
pub struct Events {
    events: Receiver<Event>,
    /// For [`read_lines`](Self::read_lines); also keeps the channel open
    /// where no listener holds it.
    tx: Sender<Event>,
    /// Cancelled by the first stop signal, after its [`Event::Stop`] is
    /// sent.
    cancel: Cancel,
    #[cfg(unix)]
    listener: Option<unix::Listener>,
}

impl Events {
    /// Starts listening. From now on INT, TERM and HUP no longer end the
    /// tool by themselves: the tool decides.
    pub fn listen() -> Result<Events, Failure> {
        Events::start(false)
    }

    /// As [`listen`](Self::listen), and SIGUSR1 comes as [`Event::Wake`].
    #[cfg(unix)]
    pub fn listen_waking() -> Result<Events, Failure> {
        Events::start(true)
    }

    fn start(#[allow(unused_variables)] wake: bool) -> Result<Events, Failure> {
        let (tx, events) = mpsc::channel();
        let cancel = Cancel::new();
        #[cfg(unix)]
        let listener = Some(unix::Listener::start(tx.clone(), cancel.clone(), wake)?);
        Ok(Events {
            events,
            tx,
            cancel,
            #[cfg(unix)]
            listener,
        })
    }

    /// Reads `from` line by line on a thread of its own, each line an
    /// [`Event::Line`], and [`Event::Closed`] at its end.
    #[cfg_attr(not(unix), allow(dead_code))] // only the supervisor reads
    pub fn read_lines(&self, from: impl Read + Send + 'static) -> Result<(), Failure> {
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("redlock-lines".into())
            .spawn(move || {
                for line in BufReader::new(from).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Event::Line(line)).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Event::Closed);
            })
            .map(drop)
            .map_err(|e| Failure::system(format!("cannot start a thread: {e}")))
    }

    /// The next event within `timeout`, if any.
    pub fn next(&self, timeout: Duration) -> Option<Event> {
        // `self.tx` keeps the channel open: only a timeout ends the wait.
        self.events.recv_timeout(timeout).ok()
    }

    /// The handle that a stop signal cancels, for the library's waiting
    /// calls ([`LockOptions::cancel`](redlock_sync::LockOptions::cancel)).
    /// Its signal is then [`pending_stop`](Self::pending_stop)'s.
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// A stop signal that has already arrived, if any.
    pub fn pending_stop(&self) -> Option<i32> {
        self.events.try_iter().find_map(|event| match event {
            Event::Stop(signal) => Some(signal),
            _ => None,
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

    use redlock_sync::Cancel;
    use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM, SIGUSR1};
    use signal_hook::iterator::{Handle, Signals};

    use super::Event;
    use crate::exit::Failure;

    /// The thread that turns signals into events.
    pub struct Listener {
        handle: Handle,
        thread: JoinHandle<()>,
    }

    impl Listener {
        /// Forwards each signal to `tx`; a stop signal also cancels
        /// `cancel` (once sent, so that the waiter it wakes finds it).
        pub fn start(tx: Sender<Event>, cancel: Cancel, wake: bool) -> Result<Listener, Failure> {
            let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGCHLD])
                .and_then(|signals| {
                    if wake {
                        signals.add_signal(SIGUSR1)?;
                    }
                    Ok(signals)
                })
                .map_err(|e| Failure::system(format!("cannot handle signals: {e}")))?;
            let handle = signals.handle();
            let thread = std::thread::Builder::new()
                .name("redlock-signals".into())
                .spawn(move || {
                    for signal in signals.forever() {
                        let event = match signal {
                            SIGCHLD => Event::Child,
                            SIGUSR1 => Event::Wake,
                            stop => Event::Stop(stop),
                        };
                        let stop = matches!(event, Event::Stop(_));
                        if tx.send(event).is_err() {
                            return;
                        }
                        if stop {
                            cancel.cancel();
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
