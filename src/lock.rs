//! `Lock`, what a holder has, and `IntoResources`, what a call locks.

use std::time::{Duration, Instant};

use crate::error::{LockError, Report};
use crate::kind::Kind;
use crate::token::Token;

/// A lock held on a quorum of nodes: its resources, its token, and its
/// validity by this process's monotonic clock.
///
/// [`Redlock::release`](crate::Redlock::release) consumes it. Dropping it
/// does not release it: others wait until the TTL runs out. For a lock
/// released at the end of its scope, and kept alive meanwhile, use
/// [`Redlock::lock`](crate::Redlock::lock).
///
/// ```no_run
/// # use redlock_sync::Redlock;
/// # use std::time::Duration;
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// println!("{} held with token {} for {:?} more", lock.resource(), lock.token(), lock.validity());
/// locks.release(lock)?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
///
/// Its `Debug` output redacts the token (see [`Token`]).
#[derive(Debug)]
#[must_use = "a lock stays held until its TTL runs out unless released: pass it to Redlock::release when done"]
pub struct Lock {
    pub(crate) resources: Vec<String>,
    pub(crate) token: Token,
    pub(crate) kind: Kind,
    pub(crate) valid_until: Option<Instant>,
    pub(crate) report: Report,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) owner: Option<String>,
}

impl Lock {
    /// A lock rebuilt from its resources, token and kind, to release or
    /// extend a lock acquired elsewhere.
    ///
    /// This process did not time the acquisition, so
    /// [`validity`](Self::validity) is zero until an
    /// [`extend`](crate::Redlock::extend) succeeds. The nodes decide whether
    /// the token still holds the lock. A rebuilt fenced lock has no
    /// [`fencing_token`](Self::fencing_token).
    ///
    /// ```no_run
    /// use redlock_sync::{Kind, Lock, Redlock, Token};
    ///
    /// // In the process that acquired it, print `resource` and `token`;
    /// // in another, given both on the command line:
    /// let token: Token = "0123456789abcdef0123456789abcdef01234567".parse()?;
    /// let lock = Lock::from_token("nightly-report", token, Kind::Plain)?;
    /// let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.release(lock)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Argument`] for a bad list of resources: none, an empty
    /// name, a name twice, or several for a fenced lock.
    pub fn from_token(
        resources: impl IntoResources,
        token: Token,
        kind: Kind,
    ) -> Result<Lock, LockError> {
        let resources = resources.into_resources();
        kind.check(&resources)?;
        Ok(Lock {
            resources,
            token,
            kind,
            valid_until: None,
            report: Report::default(),
            fencing_token: None,
            owner: None,
        })
    }

    /// The kind of lock.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// let lock = Lock::from_token("r", Token::random()?, Kind::Fenced)?;
    /// assert_eq!(lock.kind(), Kind::Fenced);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The resource this lock holds (the first one, for a lock over several).
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token("invoice:42", token, Kind::Plain)?;
    /// assert_eq!(lock.resource(), "invoice:42");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resource(&self) -> &str {
        &self.resources[0]
    }

    /// Every resource this lock holds, in the order given.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token(["a", "b"], token, Kind::Plain)?;
    /// assert_eq!(lock.resources(), ["a", "b"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The token that proves ownership.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token("r", token, Kind::Plain)?;
    /// assert_eq!(lock.token().to_string(), "00112233445566778899aabbccddeeff00112233");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// How long the lock is still valid, by the monotonic clock; zero once
    /// it has run out. Work only while this is well above zero.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// // A lock rebuilt from its token has no validity measured yet.
    /// let lock = Lock::from_token("r", token, Kind::Plain)?;
    /// assert!(lock.validity().is_zero());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether some validity is left.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token("r", token, Kind::Plain)?;
    /// assert!(!lock.is_valid());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_valid(&self) -> bool {
        !self.validity().is_zero()
    }

    /// When the validity runs out, by the monotonic clock. Now, for a
    /// rebuilt lock no extension has measured.
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token("r", token, Kind::Plain)?;
    /// assert!(lock.valid_until() <= std::time::Instant::now());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn valid_until(&self) -> Instant {
        self.valid_until.unwrap_or_else(Instant::now)
    }

    /// What each node answered in the round that acquired or last extended
    /// this lock. Empty after [`from_token`](Self::from_token).
    ///
    /// ```
    /// # use redlock_sync::{Kind, Lock, Token};
    /// # let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// let lock = Lock::from_token("r", token, Kind::Plain)?;
    /// assert!(lock.report().nodes.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// The fencing token of a lock acquired as [`Kind::Fenced`], else `None`.
    /// Extensions keep it.
    ///
    /// Pass it with every write to the protected resource. The resource
    /// rejects a token lower than the highest it has seen (see [`Kind`]).
    ///
    /// ```no_run
    /// # use redlock_sync::{Kind, LockOptions, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let lock = locks.acquire("ledger", LockOptions::new(Duration::from_secs(10)).kind(Kind::Fenced))?;
    /// let token = lock.fencing_token().expect("a fenced lock has a token");
    /// // storage.write_if_token_at_least(token, ...);
    /// # let _ = token;
    /// locks.release(lock)?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// What the nodes store: the token, then a space and the owner label.
    pub(crate) fn value(&self) -> String {
        value(&self.token, self.owner.as_deref())
    }
}

/// A stored value: `TOKEN[ OWNER]` (a re-take inserts `~MARK` after the token).
pub(crate) fn value(token: &Token, owner: Option<&str>) -> String {
    match owner {
        Some(owner) => format!("{token} {owner}"),
        None => token.to_string(),
    }
}

/// What a call locks: one resource (`&str`, `String`, `&String`), or
/// several as one lock, all or nothing. A list is `&[S]`, `[S; N]`,
/// `&[S; N]`, `Vec<S>` or `&Vec<S>`, for any `S: AsRef<str>`.
///
/// ```no_run
/// # use std::time::Duration;
/// # use redlock_sync::Redlock;
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let ttl = Duration::from_secs(10);
/// let one = locks.acquire("invoice:42", ttl)?;
/// let both = locks.acquire(["account:alice", "account:bob"], ttl)?;
/// let names = vec![format!("shelf:{}", 3), format!("shelf:{}", 4)];
/// let shelves = locks.acquire(&names, ttl)?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
pub trait IntoResources {
    /// The resource names, in the order given.
    fn into_resources(self) -> Vec<String>;
}

macro_rules! resource_lists {
    ($($one:ty),*; $([$($generics:tt)*] $list:ty),*) => {
        $(impl IntoResources for $one {
            fn into_resources(self) -> Vec<String> {
                vec![self.into()]
            }
        })*
        $(impl<$($generics)*> IntoResources for $list {
            fn into_resources(self) -> Vec<String> {
                self.iter().map(|s| s.as_ref().to_string()).collect()
            }
        })*
    };
}

resource_lists!(
    &str, String, &String;
    [S: AsRef<str>] &[S],
    [S: AsRef<str>, const N: usize] [S; N],
    [S: AsRef<str>, const N: usize] &[S; N],
    [S: AsRef<str>] Vec<S>,
    [S: AsRef<str>] &Vec<S>
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_through_its_text() {
        let token = Token::random().unwrap();
        let text = token.to_string();
        assert_eq!(text.len(), 40);
        assert!(text
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(text.parse::<Token>().unwrap(), token);
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(Token::random().unwrap(), Token::random().unwrap());
    }

    #[test]
    fn token_parse_rejects_everything_but_40_lowercase_hex() {
        let good = "0123456789abcdef0123456789abcdef01234567";
        assert!(good.parse::<Token>().is_ok());
        for bad in [
            "",
            &good[..39],
            &format!("{good}0"),
            &good.to_uppercase(),
            "0123456789abcdef0123456789abcdef0123456g",
            "0123456789abcdef0123456789abcdef012345 7",
            "é123456789abcdef0123456789abcdef0123456",
        ] {
            assert!(bad.parse::<Token>().is_err(), "{bad:?} was accepted");
        }
    }
}
