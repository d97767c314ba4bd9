//! The embedded broker's users file (`[sources.X] users_file`): mosquitto_passwd's format, so a
//! gateway's operators keep their tools and files.
//!
//! One `user:hash` per line; blank lines and lines starting with `#` are skipped. Two hashes are
//! read, the ones mosquitto 2 reads:
//! - `$7$ITERATIONS$SALT$HASH`: PBKDF2-HMAC-SHA512, 64-byte hash (what `mosquitto_passwd` writes
//!   by default since 2.0; 101 iterations, 12-byte salt);
//! - `$6$SALT$HASH`: SHA-512 of the password followed by the salt (mosquitto 1.6 and
//!   `mosquitto_passwd -H sha512`).
//!
//! SALT and HASH are standard base64. A plain-text password (what `mosquitto_passwd -U` would
//! hash) or any other scheme is an error naming the line: braid never keeps a password it could
//! read back. Verification is constant-time in the password (ring's PBKDF2 verify, and a
//! byte-folding comparison for SHA-512), and an unknown user costs the same PBKDF2 as a known
//! one, so timing does not tell which user names exist.

use std::collections::HashMap;
use std::num::NonZeroU32;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::{digest, pbkdf2};

/// What `mosquitto_passwd` writes: the hash of a password, never the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordHash {
    Pbkdf2Sha512 { iterations: NonZeroU32, salt: Vec<u8>, hash: Vec<u8> },
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
}

/// The users of one users file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Users {
    hashes: HashMap<String, PasswordHash>,
}

/// A line of the file that could not be read: its number (from 1) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub reason: String,
}

/// Checked against when the user is unknown, so that an unknown name takes as long as a known one.
fn decoy() -> PasswordHash {
    PasswordHash::Pbkdf2Sha512 { iterations: NonZeroU32::MIN.saturating_add(100), salt: vec![0; 12], hash: vec![0; 64] }
}

impl Users {
    /// Parses the text of a users file.
    pub fn parse(text: &str) -> Result<Users, LineError> {
        let mut hashes = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let error = |reason: String| LineError { line: index + 1, reason };
            let Some((user, hash)) = line.split_once(':') else {
                return Err(error("expected USER:HASH (a line of mosquitto_passwd's file)".into()));
            };
            if user.is_empty() {
                return Err(error("empty user name".into()));
            }
            let hash = PasswordHash::parse(hash).map_err(|reason| error(format!("user {user:?}: {reason}")))?;
            if hashes.insert(user.to_owned(), hash).is_some() {
                return Err(error(format!("user {user:?} appears twice")));
            }
        }
        Ok(Users { hashes })
    }

    /// Whether `password` is `user`'s.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.hashes.get(user) {
            Some(hash) => hash.verify(password),
            None => {
                let _ = decoy().verify(password);
                false
            }
        }
    }

    /// The hash `user` authenticates with (a reload that changes or removes it ends the user's
    /// connections).
    pub fn hash_of(&self, user: &str) -> Option<&PasswordHash> {
        self.hashes.get(user)
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

impl PasswordHash {
    fn parse(text: &str) -> Result<PasswordHash, String> {
        let fields: Vec<&str> = text.split('$').collect();
        let b64 = |what: &str, s: &str| STANDARD.decode(s).map_err(|e| format!("the {what} is not base64 ({e})"));
        match fields.as_slice() {
            ["", "7", iterations, salt, hash] => {
                let iterations = iterations
                    .parse::<NonZeroU32>()
                    .map_err(|_| format!("bad PBKDF2 iteration count {iterations:?}"))?;
                let (salt, hash) = (b64("salt", salt)?, b64("hash", hash)?);
                if hash.len() != digest::SHA512_OUTPUT_LEN {
                    return Err(format!("a $7$ hash has 64 bytes, this one {}", hash.len()));
                }
                Ok(PasswordHash::Pbkdf2Sha512 { iterations, salt, hash })
            }
            ["", "6", salt, hash] => {
                let (salt, hash) = (b64("salt", salt)?, b64("hash", hash)?);
                if hash.len() != digest::SHA512_OUTPUT_LEN {
                    return Err(format!("a $6$ hash has 64 bytes, this one {}", hash.len()));
                }
                Ok(PasswordHash::Sha512 { salt, hash })
            }
            ["", scheme, ..] => Err(format!(
                "hash scheme ${scheme}$ is not supported (braid reads $7$ PBKDF2-SHA512 and $6$ SHA-512, \
                 what mosquitto_passwd writes)"
            )),
            _ => Err("not a password hash; hash the file with `mosquitto_passwd -U FILE`".into()),
        }
    }

    fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Pbkdf2Sha512 { iterations, salt, hash } => {
                pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA512, *iterations, salt, password, hash).is_ok()
            }
            PasswordHash::Sha512 { salt, hash } => {
                let mut context = digest::Context::new(&digest::SHA512);
                context.update(password);
                context.update(salt);
                same_bytes(context.finish().as_ref(), hash)
            }
        }
    }
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by `mosquitto_passwd -c -b pw dev1 secret1` and `-H sha512 -b pw old oldpass`
    /// (mosquitto 2.0.11); the integration tests run the tool itself.
    const FILE: &str = "\
dev1:$7$101$XWPG4birH4TSJypm$QlFM5madtYXEsOj0Q0QblEzqZgwlG/4KMa8zg1n7gMacjbIDg7zSywtb7zK+4LobIc1fgsQz9TsJZeQn7OmpLA==
# a comment, then a blank line

old:$6$P4Q13nrM4N46nMTN$LNbpu7fbpLneYIyH9Xhr7IX8VS7xZGKNUaWDgMHhj8gPEaDcxidjGvxWWcd6lMl6VU65wyyZVs7JtGHZhqCdSQ==
";

    #[test]
    fn mosquitto_passwd_hashes_verify() {
        let users = Users::parse(FILE).unwrap();
        assert_eq!(users.len(), 2);
        assert!(users.verify("dev1", b"secret1"));
        assert!(!users.verify("dev1", b"secret2"));
        assert!(!users.verify("dev1", b""));
        assert!(users.verify("old", b"oldpass"));
        assert!(!users.verify("old", b"oldpas"));
        assert!(!users.verify("nobody", b"secret1"));
        assert!(!users.verify("dev1 ", b"secret1"));
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line, reason) in [
            ("dev1 secret", 1, "USER:HASH"),
            ("\n:$6$AA==$AA==", 2, "empty user"),
            ("a:secret", 1, "mosquitto_passwd -U"),
            ("a:$2y$10$abc", 1, "$2y$ is not supported"),
            ("a:$7$0$AA==$AA==", 1, "iteration count"),
            ("a:$7$101$!!$AA==", 1, "salt is not base64"),
            ("a:$6$AA==$AA==", 1, "64 bytes"),
            (&format!("{FILE}{}", FILE.lines().next().unwrap()), 5, "appears twice"),
        ] {
            let error = Users::parse(text).unwrap_err();
            assert_eq!(error.line, line, "{text}: {error:?}");
            assert!(error.reason.contains(reason), "{text}: {error:?}");
        }
    }

    #[test]
    fn same_bytes_is_equality() {
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"ab"));
        assert!(same_bytes(b"", b""));
    }
}
