//! What the client tells its observer: [`Event`] and [`What`].

use std::sync::Arc;
use std::time::Duration;

use crate::error::{LockError, NodeOutcome};

/// What an [`Event`] reports.
///
/// The observer hears of change, not of every round. An acquisition whose
/// rounds start failing tells [`Contended`](Self::Contended) or
/// [`AttemptFailed`](Self::AttemptFailed). It tells again only when the
/// reason changes. It ends with [`Acquired`](Self::Acquired) or
/// [`GaveUp`](Self::GaveUp). A guard's watchdog tells
/// [`ExtendFailed`](Self::ExtendFailed) likewise, then
/// [`Extended`](Self::Extended) or [`Lost`](Self::Lost). A node's failure
/// is told once, [`NodeFailed`](Self::NodeFailed), until
/// [`NodeRecovered`](Self::NodeRecovered). [`Event::failures`] counts the
/// rounds not told.
///
/// ```
/// use redlock_sync::{Event, What};
///
/// fn is_trouble(event: &Event<'_>) -> bool {
///     matches!(event.what, What::NodeFailed | What::ExtendFailed | What::Lost | What::GaveUp)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// An attempt won the lock ([`Event::failures`]: the rounds that failed before it).
    Acquired,
    /// An acquisition found the lock held, and waits to try again.
    Contended,
    /// An acquisition failed otherwise (too few nodes answered, too slow), and waits to try again.
    AttemptFailed,
    /// An acquisition gave up ([`Event::error`] is what it returns).
    GaveUp,
    /// A node that had been answering failed or timed out ([`Event::node`] says which).
    NodeFailed,
    /// A node answered again ([`Event::failures`]: the rounds it had failed).
    NodeRecovered,
    /// An extension succeeded ([`Event::failures`]: the rounds that failed before it).
    Extended,
    /// An extension set the key again on a node that had lost it
    /// ([`Event::node`]; see [`Redlock::extend`](crate::Redlock::extend)).
    Retook,
    /// A guard's extensions started failing; its watchdog retries them while validity is left.
    ExtendFailed,
    /// A guard's lock is lost, or its guard released it ([`LockError::Panicked`]).
    Lost,
    /// A release round ended ([`Event::error`] says if it failed).
    Released,
}

/// Something the client did, for logs and metrics, as the builder's
/// [`observer`](crate::RedlockBuilder::observer) gets it ([`What`] says
/// when). It never holds a whole token or a password. Its `Debug` output
/// is one log line. There the error shows as its variant and the round's
/// counts: the nodes' failures have events of their own.
///
/// ```
/// use redlock_sync::{Event, What};
///
/// fn log(event: &Event<'_>) {
///     if event.what == What::NodeFailed {
///         eprintln!("{} on {:?}: {:?}", event.resource, event.node, event.node_outcome);
///     }
/// }
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Event<'a> {
    /// What happened.
    pub what: What,
    /// The (first) resource.
    pub resource: &'a str,
    /// The token's first 8 characters. Each attempt has a token of its own.
    pub token: &'a str,
    /// The acquisition's id, for an acquisition's events: the same for all
    /// its attempts, so they can be grouped. A writer that waits names its
    /// intents by it ([`Kind::Shared`](crate::Kind::Shared)).
    pub acquisition: Option<&'a str>,
    /// The attempt's number, for the acquisition's events; else 0.
    pub attempt: u32,
    /// The rounds that failed in a row, this one included: the node's, for
    /// a node's event, else the operation's. An event that ends a run
    /// ([`What::Acquired`], [`What::GaveUp`], [`What::Extended`],
    /// [`What::Lost`], [`What::NodeRecovered`]) counts all of its rounds. A
    /// metric of failed rounds adds those up.
    pub failures: u32,
    /// How long the round took, or the node's part of it.
    pub elapsed: Duration,
    /// The node, for the node's events.
    pub node: Option<&'a str>,
    /// What the node did, for the node's events.
    pub node_outcome: Option<&'a NodeOutcome>,
    /// The error, for the events of a failure.
    pub error: Option<&'a LockError>,
}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut event = f.debug_struct("Event");
        let event = (event.field("what", &self.what))
            .field("resource", &self.resource)
            .field("token", &self.token);
        if let Some(acquisition) = self.acquisition {
            event.field("acquisition", &acquisition);
        }
        for (name, n) in [("attempt", self.attempt), ("failures", self.failures)] {
            if n > 0 {
                event.field(name, &n);
            }
        }
        event.field("elapsed", &self.elapsed);
        if let (Some(node), Some(outcome)) = (self.node, self.node_outcome) {
            event
                .field("node", &node)
                .field("outcome", &format_args!("{outcome}"));
        }
        if let Some(error) = self.error {
            // The variant's name is the first word of its `Debug` output.
            let debug = format!("{error:?}");
            let name = debug.split(|c: char| !c.is_alphanumeric()).next();
            match (name, error.report()) {
                (Some(name), Some(r)) => event.field("error", &format_args!("{name} ({r:#})")),
                _ => event.field("error", &format_args!("{error}")),
            };
        }
        event.finish()
    }
}

#[derive(Clone)]
pub(crate) struct Observer(pub(crate) Arc<dyn Fn(&Event<'_>) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}
