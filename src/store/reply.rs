//! Each script's replies, read as typed votes: nothing outside the store
//! asks which script ran.

use redis::Value;

/// What one node's reply says of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Granted, renewed or deleted; with a fenced round one's counter.
    Yes(u64),
    /// Refused: held by another, or our key or member was gone.
    No,
    /// An extension found another token on the key.
    Taken,
    /// An extension set a lost key again: a re-take, which is no vote.
    Retook,
}

/// How an operation reads its replies, and the word its report uses.
#[derive(Clone, Copy)]
pub(crate) struct Reading {
    pub(crate) verb: &'static str,
    /// A reply as a vote; `None` for a reply no script of ours gives.
    pub(crate) vote: fn(&Value) -> Option<Vote>,
}

/// An acquisition: `SET NX`'s `OK`, a script's 1, or a fenced round one's
/// counter grants; nil or 0 refuses.
pub(crate) const ACQUIRED: Reading = Reading {
    verb: "granted",
    vote: acquired,
};

/// A fenced round two: 1 or 0.
pub(crate) const CONFIRMED: Reading = Reading {
    verb: "granted",
    vote: one_or_zero,
};

/// An extension ([`EXTEND`](super::script::EXTEND), or
/// [`SHARED`](super::script::SHARED)'s `extend`): 1 renewed, 2 re-taken, 3
/// gone, 0 taken by another token.
pub(crate) const RENEWED: Reading = Reading {
    verb: "renewed",
    vote: renewed,
};

/// A release: 1 where every key (or the member) held our token.
pub(crate) const DELETED: Reading = Reading {
    verb: "deleted",
    vote: one_or_zero,
};

fn acquired(value: &Value) -> Option<Vote> {
    match value {
        Value::Okay => Some(Vote::Yes(0)),
        Value::Int(n) if *n > 0 => Some(Vote::Yes(n.unsigned_abs())),
        Value::Nil | Value::Int(0) => Some(Vote::No),
        _ => None,
    }
}

fn one_or_zero(value: &Value) -> Option<Vote> {
    match value {
        Value::Int(1) => Some(Vote::Yes(0)),
        Value::Int(0) => Some(Vote::No),
        _ => None,
    }
}

fn renewed(value: &Value) -> Option<Vote> {
    match value {
        Value::Int(1) => Some(Vote::Yes(0)),
        Value::Int(2) => Some(Vote::Retook),
        Value::Int(3) => Some(Vote::No),
        Value::Int(0) => Some(Vote::Taken),
        _ => None,
    }
}
