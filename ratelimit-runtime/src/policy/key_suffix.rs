//! A policy's part of its store keys, `<num><algorithm letter>[<count>]<unit>[b<burst>]`: the
//! grammar and why it is injective are in [`crate::key`]'s docs; it is written here, once per
//! policy, when the policy is built.

use crate::algorithm::Algorithm;

/// The letter of an algorithm in the suffix.
const fn algorithm_letter(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Fixed => b'f',
        Algorithm::Sliding => b's',
        Algorithm::Leaky => b'l',
        Algorithm::Token => b't',
        Algorithm::Gcra => b'g',
        Algorithm::SlidingCounter => b'c',
        Algorithm::Concurrency => b'n',
    }
}

/// The units a period is written in, largest first, with their length in milliseconds.
pub(crate) const PERIOD_UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest suffix: `num` and `burst` of 20 digits each, a count of 20, a letter, `b` and a
/// unit of two (what `u64`s can write; a policy's bounds keep them shorter).
const KEY_SUFFIX_CAP: usize = 20 + 1 + 20 + 2 + 1 + 20;

/// A policy's key suffix, `<num><algorithm letter>[<count>]<unit>[b<burst>]` (see the [`crate::key`]
/// docs, which also say why it is injective), written once when the policy is built, so that a
/// key is put together per call by copying it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeySuffix {
    len: u8,
    bytes: [u8; KEY_SUFFIX_CAP],
}

impl KeySuffix {
    /// The suffix of a policy of these parameters.
    pub(crate) const fn of(algorithm: Algorithm, limit: u64, period_ms: u64, burst: u64) -> Self {
        let mut s = Self {
            len: 0,
            bytes: [0; KEY_SUFFIX_CAP],
        };
        s = s.decimal(limit).byte(algorithm_letter(algorithm));
        let mut i = 0;
        // The largest unit that divides the period ("ms" divides every one).
        while i + 1 < PERIOD_UNITS.len() && !period_ms.is_multiple_of(PERIOD_UNITS[i].1) {
            i += 1;
        }
        let (unit, ms) = PERIOD_UNITS[i];
        if period_ms / ms != 1 {
            s = s.decimal(period_ms / ms);
        }
        let unit = unit.as_bytes();
        let mut u = 0;
        while u < unit.len() {
            s = s.byte(unit[u]);
            u += 1;
        }
        if burst != limit {
            s = s.byte(b'b').decimal(burst);
        }
        s
    }

    /// This suffix with `b` appended (never past the capacity, which holds the longest).
    const fn byte(mut self, b: u8) -> Self {
        if (self.len as usize) < KEY_SUFFIX_CAP {
            self.bytes[self.len as usize] = b;
            self.len += 1;
        }
        self
    }

    /// This suffix with `n` appended in decimal, without leading zeros.
    const fn decimal(mut self, n: u64) -> Self {
        let mut digits = [0_u8; 20];
        let mut count = 0;
        let mut rest = n;
        loop {
            #[allow(clippy::cast_possible_truncation)] // a digit, below 10
            {
                digits[count] = b'0' + (rest % 10) as u8;
            }
            count += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        while count > 0 {
            count -= 1;
            self = self.byte(digits[count]);
        }
        self
    }

    /// The suffix's bytes (ASCII: digits and letters).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

// The longest suffix `u64`s can make, 64 bytes (20 digits, a letter, 20 digits and `ms`, `b`
// and 20 digits), is kept whole: none is ever cut short, which could give two policies one key.
// Checked when the crate compiles.
const _: () = assert!(KeySuffix::of(Algorithm::Fixed, u64::MAX, u64::MAX, u64::MAX - 1).len == 64);
