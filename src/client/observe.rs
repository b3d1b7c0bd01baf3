//! What the observer hears: changes, not rounds (see [`What`]). It runs
//! under `catch_unwind`, like all user code ([`caught`]).

use std::mem::{self, Discriminant};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Redlock;
use crate::error::{LockError, NodeOutcome, NodeReport, Report};
use crate::event::{Event, Observer, What};
use crate::token::Token;

/// Runs `f`; a panic in it comes back as its message.
pub(crate) fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let text = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| panic.downcast_ref::<String>().cloned());
        text.unwrap_or_else(|| "a panic".to_string())
    })
}

/// For each node, the rounds it failed in a row, as the observer knows.
#[derive(Default)]
pub(crate) struct NodesSeen(Mutex<Vec<u32>>);

/// One operation's failed rounds in a row. The observer hears of the first,
/// and of each that fails for another reason. The event that ends the run
/// carries the count.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    /// The rounds failed in a row so far.
    pub(crate) count: u32,
    reason: Option<Discriminant<LockError>>,
}

impl Failures {
    /// Counts a failed round; whether the observer is to hear of it.
    pub(crate) fn failed(&mut self, error: &LockError) -> bool {
        self.count = self.count.saturating_add(1);
        let reason = Some(mem::discriminant(error));
        mem::replace(&mut self.reason, reason) != reason
    }

    /// A round succeeded: the run ends; returns how many had failed.
    pub(crate) fn end(&mut self) -> u32 {
        self.reason = None;
        mem::take(&mut self.count)
    }
}

impl Redlock {
    /// Tells the observer, if any, of a round on `resources` by `token` that
    /// ended in `outcome`. First each node whose state changed or that
    /// re-took the key, then `what`, if any. Every round comes here, told or
    /// not, to keep the nodes' state.
    pub(crate) fn observe_counted(
        &self,
        what: Option<What>,
        ids: (&[String], &Token),
        counts: (u32, u32),
        outcome: Result<&Report, &LockError>,
    ) {
        self.observe(what, ids, None, counts, outcome);
    }

    /// [`observe_counted`](Self::observe_counted) for an acquisition's
    /// round: its events carry the acquisition's id.
    pub(crate) fn observe_acquiring(
        &self,
        what: Option<What>,
        ids: (&[String], &Token),
        acquisition: Option<&str>,
        counts: (u32, u32),
        outcome: Result<&Report, &LockError>,
    ) {
        self.observe(what, ids, acquisition, counts, outcome);
    }

    fn observe(
        &self,
        what: Option<What>,
        (resources, token): (&[String], &Token),
        acquisition: Option<&str>,
        (attempt, failures): (u32, u32),
        outcome: Result<&Report, &LockError>,
    ) {
        let Some(Observer(observer)) = &self.config().observer else {
            return;
        };
        let (report, error) = outcome.map_or_else(|e| (e.report(), Some(e)), |r| (Some(r), None));
        let hex = token.hex();
        let event = Event {
            what: What::NodeFailed,
            resource: &resources[0],
            token: std::str::from_utf8(&hex[..8]).unwrap_or_default(),
            acquisition,
            attempt,
            failures,
            elapsed: report.map_or(Duration::ZERO, |r| r.elapsed),
            node: None,
            node_outcome: None,
            error,
        };
        let tell = |event: &Event<'_>| drop(catch_unwind(AssertUnwindSafe(|| observer(event))));
        // A loss repeats the report of a round seen already.
        let report = report.filter(|_| what != Some(What::Lost));
        // What a lost lock's round re-took is released at once: not told.
        let retakes = !matches!(error, Some(LockError::Lost { .. }));
        let nodes = report.map_or(&[][..], |r| &r.nodes);
        for (what, node, failures) in self.inner.seen.changes(nodes, retakes) {
            tell(&Event {
                what,
                attempt: 0,
                failures,
                elapsed: node.elapsed,
                node: Some(&*node.node),
                node_outcome: Some(&node.outcome),
                error: None,
                ..event
            });
        }
        if let Some(what) = what {
            tell(&Event { what, ..event });
        }
    }
}

impl NodesSeen {
    /// The nodes whose state changed for the observer, and with `retakes`
    /// those that re-took the key. Each comes with what to tell and its
    /// failed rounds.
    fn changes<'a>(
        &self,
        nodes: &'a [NodeReport],
        retakes: bool,
    ) -> Vec<(What, &'a NodeReport, u32)> {
        let mut down = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let len = down.len().max(nodes.len());
        down.resize(len, 0);
        let mut changes = Vec::new();
        for (node, down) in nodes.iter().zip(down.iter_mut()) {
            let change = match node.outcome {
                NodeOutcome::TimedOut | NodeOutcome::Failed(_) => {
                    *down = down.saturating_add(1);
                    (*down == 1).then_some((What::NodeFailed, 1))
                }
                NodeOutcome::NotAwaited => None,
                _ => (*down > 0).then(|| (What::NodeRecovered, mem::take(down))),
            };
            changes.extend(change.map(|(what, n)| (what, node, n)));
            if retakes && node.retook {
                changes.push((What::Retook, node, 0));
            }
        }
        changes
    }
}
