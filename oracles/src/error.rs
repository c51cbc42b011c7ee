//! Bad input, named precisely: what was wrong with which input.

use std::fmt;

/// An input that violates docs/spec.md. The message names the input and the value,
/// e.g. "tokens[1, 7] = 151936 is outside the vocabulary [0, 151936)".
#[derive(Clone, Debug, PartialEq)]
pub struct InputError(pub String);

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

macro_rules! input_error {
    ($($arg:tt)*) => { $crate::error::InputError(format!($($arg)*)) };
}
pub(crate) use input_error;
