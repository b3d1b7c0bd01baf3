//! `Token`, the proof of ownership.

use std::fmt;
use std::str::FromStr;

use crate::error::{LockError, ParseTokenError};

/// How many random bytes a token has: 160 bits.
const TOKEN_BYTES: usize = 20;

/// The proof of ownership of a lock: 160 random bits from the OS (as
/// `/dev/urandom`), in 40 lowercase hex characters.
///
/// Each acquisition gets a fresh token, stored as the lock key's value.
/// Only its holder can extend or release the lock. A token written out and
/// parsed back lets another process release or extend the lock (see
/// [`Lock::from_token`](crate::Lock::from_token)).
///
/// ```
/// use redlock_sync::Token;
///
/// let token = Token::random()?;
/// let text = token.to_string();
/// assert_eq!(text.len(), 40);
/// assert_eq!(text.parse::<Token>()?, token);
/// assert!("not a token".parse::<Token>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token([u8; TOKEN_BYTES]);

impl Token {
    /// A new token from the OS random source.
    ///
    /// # Errors
    ///
    /// [`LockError::Random`] if the random source fails (practically
    /// never).
    ///
    /// ```
    /// use redlock_sync::Token;
    /// assert_ne!(Token::random()?, Token::random()?);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn random() -> Result<Token, LockError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| LockError::Random(e.into()))?;
        Ok(Token(bytes))
    }

    /// The token's 20 bytes.
    ///
    /// ```
    /// # use redlock_sync::Token;
    /// let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
    /// assert_eq!(token.as_bytes()[..3], [0x00, 0x11, 0x22]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_bytes(&self) -> &[u8; TOKEN_BYTES] {
        &self.0
    }

    /// The 40 hex characters that go on the wire (and that `Display` shows).
    pub(crate) fn hex(&self) -> [u8; 2 * TOKEN_BYTES] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        // Digit `i` is byte `i / 2`'s high half if `i` is even, else its low.
        std::array::from_fn(|i| DIGITS[usize::from((self.0[i / 2] >> (4 * (1 - i % 2))) & 0x0f)])
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The digits are ASCII, so this never fails.
        f.write_str(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

/// Only the first 8 hex characters, as `redlock status` shows. `Debug`
/// output ends up in logs, and the whole token can release the lock from
/// anywhere. `Display` shows all of it.
///
/// ```
/// # use redlock_sync::Token;
/// let token: Token = "00112233445566778899aabbccddeeff00112233".parse()?;
/// assert_eq!(format!("{token:?}"), "Token(00112233…)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", &self.to_string()[..8])
    }
}

impl FromStr for Token {
    type Err = ParseTokenError;

    fn from_str(s: &str) -> Result<Token, ParseTokenError> {
        let (bytes, bad) = (s.as_bytes(), |problem| ParseTokenError { problem });
        if bytes.len() != 2 * TOKEN_BYTES {
            return Err(bad(format!("got {} bytes", bytes.len())));
        }
        let nibble = |i: usize| match bytes[i] {
            c @ b'0'..=b'9' => Ok(c - b'0'),
            c @ b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(bad(format!("byte {i} is not a lowercase hex digit"))),
        };
        let mut out = [0u8; TOKEN_BYTES];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = (nibble(2 * i)? << 4) | nibble(2 * i + 1)?;
        }
        Ok(Token(out))
    }
}
