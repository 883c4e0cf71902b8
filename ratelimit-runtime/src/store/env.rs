//! The environment variables the limiter reads, read in one way: a value that is set but not
//! UTF-8 is an error naming the variable, never "unset".

use crate::error::ConfigError;

/// An environment variable that is set but whose value is not UTF-8: its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unreadable(pub(crate) &'static str);

impl From<Unreadable> for ConfigError {
    fn from(Unreadable(name): Unreadable) -> Self {
        Self::Invalid(format!("{name} is set but its value is not valid UTF-8"))
    }
}

/// The value of environment variable `name`: `None` when it is unset, [`Unreadable`] when it
/// is set but not UTF-8 (a mistake to report, never "unset": a Redis URL read as unset would
/// leave every process on its own memory store). Every variable the limiter reads goes
/// through here.
pub(crate) fn var(name: &'static str) -> Result<Option<String>, Unreadable> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Unreadable(name)),
    }
}
