//! Signals to the tool, and the lines of a pipe, as [`Happening`]s that its
//! loops wait for with a timeout.
//!
//! Which signals depends on the [`Role`]. A stop signal also cancels
//! [`Events::cancel`], the handle given to the library's waiting calls: a
//! wait for a lock ends at once.
//!
//! A thread blocks on `signal-hook`'s iterator and sends each signal down a
//! channel. So "the next signal, or this much time" is one `recv_timeout`,
//! with no polling and no `unsafe`.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use redlock_sync::Cancel;

use crate::exit::Failure;

/// Something that happened to the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// A signal that ends a process by default: INT, TERM, HUP, and for
    /// the tool QUIT, USR1 and USR2. It ends a wait; `run` passes it on to
    /// the command's group.
    Stop(i32),
    /// A child changed state: reap it.
    Child,
    /// For the supervisor: SIGUSR1 (its parent may have died), or TSTP,
    /// TTIN or TTOU, caught so that they never stop it.
    Wake,
    /// A line read by [`Events::read_lines`].
    Line(String),
    /// What [`Events::read_lines`] reads has ended (or failed).
    Closed,
}

/// Whose signals to listen to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(unix), allow(dead_code))] // only Unix has a supervisor
pub enum Role {
    /// `run`, `acquire`: INT, TERM, HUP, QUIT, USR1, USR2 and CHLD.
    Tool,
    /// The supervisor: INT, TERM, HUP and CHLD, and USR1 (its parent-death
    /// signal), TSTP, TTIN and TTOU as [`Happening::Wake`]. QUIT and USR2
    /// keep their default action: `run` sees the supervisor die, and ends
    /// the command's group.
    Supervisor,
}

/// The signals asked for, delivered as [`Happening`]s until dropped.
pub struct Events {
    rx: Receiver<Happening>,
    /// For [`read_lines`](Self::read_lines); also keeps the channel open
    /// where no signal thread holds it.
    tx: Sender<Happening>,
    /// Cancelled by the first stop signal, after its [`Happening::Stop`] is
    /// sent.
    cancel: Cancel,
    #[cfg(unix)]
    signal_thread: Option<unix::SignalThread>,
}

impl Events {
    /// Starts listening. From now on the signals of `role` no longer end
    /// the process by themselves: the tool decides.
    #[cfg_attr(not(unix), allow(unused_variables))]
    pub fn listen(role: Role) -> Result<Events, Failure> {
        let (tx, rx) = mpsc::channel();
        let cancel = Cancel::new();
        #[cfg(unix)]
        let signal_thread = Some(unix::SignalThread::start(tx.clone(), cancel.clone(), role)?);
        Ok(Events {
            rx,
            tx,
            cancel,
            #[cfg(unix)]
            signal_thread,
        })
    }

    /// Reads `from` line by line on a thread of its own, each line an
    /// [`Happening::Line`], and [`Happening::Closed`] at its end.
    #[cfg_attr(not(unix), allow(dead_code))] // only `run` and the supervisor read
    pub fn read_lines(&self, from: impl Read + Send + 'static) -> Result<(), Failure> {
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("redlock-lines".into())
            .spawn(move || {
                for line in BufReader::new(from).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Happening::Line(line)).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Happening::Closed);
            })
            .map(drop)
            .map_err(|e| Failure::system(format!("cannot start a thread: {e}")))
    }

    /// The next happening within `timeout`, if any.
    pub fn next(&self, timeout: Duration) -> Option<Happening> {
        // `self.tx` keeps the channel open: only a timeout ends the wait.
        self.rx.recv_timeout(timeout).ok()
    }

    /// The handle that a stop signal cancels, for the library's waiting
    /// calls ([`LockOptions::cancel`](redlock_sync::LockOptions::cancel)).
    /// Its signal is then [`pending_stop`](Self::pending_stop)'s.
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// A stop signal that has already arrived, if any.
    pub fn pending_stop(&self) -> Option<i32> {
        self.rx.try_iter().find_map(|happening| match happening {
            Happening::Stop(signal) => Some(signal),
            _ => None,
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(signal_thread) = self.signal_thread.take() {
            signal_thread.stop();
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

    use super::{Happening, Role};
    use crate::exit::Failure;

    /// The thread that turns signals into events.
    pub struct SignalThread {
        handle: Handle,
        thread: JoinHandle<()>,
    }

    impl SignalThread {
        /// Forwards each signal to `tx`; a stop signal also cancels
        /// `cancel` (once sent, so that the waiter it wakes finds it).
        pub fn start(
            tx: Sender<Happening>,
            cancel: Cancel,
            role: Role,
        ) -> Result<SignalThread, Failure> {
            // For `run`, USR1 is one more signal to pass on.
            let more: &[i32] = match role {
                Role::Tool => &[SIGQUIT, SIGUSR1, SIGUSR2],
                Role::Supervisor => &[SIGUSR1, SIGTSTP, SIGTTIN, SIGTTOU],
            };
            let wake = role == Role::Supervisor;
            let mut signals =
                Signals::new([SIGINT, SIGTERM, SIGHUP, SIGCHLD].iter().chain(more))
                    .map_err(|e| Failure::system(format!("cannot handle signals: {e}")))?;
            let handle = signals.handle();
            let thread = std::thread::Builder::new()
                .name("redlock-signals".into())
                .spawn(move || {
                    for signal in signals.forever() {
                        let happening = match signal {
                            SIGCHLD => Happening::Child,
                            SIGUSR1 | SIGTSTP | SIGTTIN | SIGTTOU if wake => Happening::Wake,
                            stop => Happening::Stop(stop),
                        };
                        let stop = matches!(happening, Happening::Stop(_));
                        if tx.send(happening).is_err() {
                            return;
                        }
                        if stop {
                            cancel.cancel();
                        }
                    }
                })
                .map_err(|e| Failure::system(format!("cannot start the signal thread: {e}")))?;
            Ok(SignalThread { handle, thread })
        }

        pub fn stop(self) {
            self.handle.close();
            // The thread only forwards signals; if it panicked there is
            // nothing left to clean up.
            let _ = self.thread.join();
        }
    }
}
