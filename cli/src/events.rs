//! Signals to the tool, as events its loops can wait for with a timeout:
//! INT, TERM, HUP, QUIT, USR1 and USR2 (to end a wait, or to pass on to
//! the command), CHLD (a child may have ended); for the supervisor, INT,
//! TERM, HUP, CHLD, USR1 (its parent-death signal) and TSTP, TTIN, TTOU
//! (caught, so that they never stop it); and the lines of a pipe
//! ([`Events::read_lines`]).
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
    /// A signal for the command: INT, TERM, HUP, QUIT, USR1 or USR2 (each
    /// of which ends a process by default). It ends a wait; `run` passes
    /// it on to the command's group.
    Stop(i32),
    /// A child changed state: reap it.
    Child,
    /// For the supervisor, SIGUSR1 (its parent may have died), or a stop
    /// signal (TSTP, TTIN, TTOU), caught so that it does not stop it.
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
    /// Starts listening. From now on INT, TERM, HUP, QUIT, USR1 and USR2
    /// no longer end the tool by themselves: the tool decides.
    pub fn listen() -> Result<Events, Failure> {
        Events::start(false)
    }

    /// For the supervisor: INT, TERM, HUP and CHLD as [`listen`](Self::listen)
    /// has them, SIGUSR1, TSTP, TTIN and TTOU as [`Event::Wake`]; QUIT and USR2 keep their
    /// default action (`run` sees the supervisor die, and ends the
    /// command's group).
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
    #[cfg_attr(not(unix), allow(dead_code))] // only `run` and the supervisor read
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
    use signal_hook::consts::{
        SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2,
    };
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
            // SIGUSR1 is the supervisor's parent-death signal; the stop
            // signals are caught so that they never stop the supervisor.
            // For `run`, USR1 is one more signal to pass on, as QUIT and
            // USR2.
            let more: &[i32] = if wake {
                &[SIGUSR1, SIGTSTP, SIGTTIN, SIGTTOU]
            } else {
                &[SIGQUIT, SIGUSR1, SIGUSR2]
            };
            let mut signals =
                Signals::new([SIGINT, SIGTERM, SIGHUP, SIGCHLD].iter().chain(more))
                    .map_err(|e| Failure::system(format!("cannot handle signals: {e}")))?;
            let handle = signals.handle();
            let thread = std::thread::Builder::new()
                .name("redlock-signals".into())
                .spawn(move || {
                    for signal in signals.forever() {
                        let event = match signal {
                            SIGCHLD => Event::Child,
                            SIGUSR1 | SIGTSTP | SIGTTIN | SIGTTOU if wake => Event::Wake,
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
