//! The cost of one call as `cost = <expression>` computes it, in arithmetic that cannot wrap.
//!
//! A cost expression reads the call's arguments, which a client chose: `cost = req.n * 1000`
//! with `n = 2^60` would wrap in a release build (a tiny cost for a huge call) and panic in a
//! debug one. So the macro hands the expression's arithmetic to this module: each operand of
//! `+`, `-`, `*` and `/` (through parentheses) is an integer of any primitive type, widened
//! to [`Units`] (128-bit, signed), and every operation is checked. What comes out is the cost
//! the call asked for, exactly, or a value that says it was negative or beyond any capacity;
//! [`crate::RateLimitError::NegativeCost`] and [`crate::RateLimitError::CostExceedsCapacity`]
//! refuse such calls before any store call.
//!
//! An operand that is not an integer (a type of your own with an `Add` impl) does not fit:
//! write the expression inside a block, `cost = { my_add(a, b) }`, to keep it as written (the
//! block's value must then be an integer, and its arithmetic is yours).

/// A cost as the expression computed it, in 128-bit signed integers. Every operation is
/// checked: one that overflows (only operands a client picked to be huge can make one) or
/// divides by zero makes the whole result *unbounded*, which no later operation can bring back
/// into range, so the call is refused as costing more than any capacity — never wrapped, never
/// a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Units(Option<i128>);

impl Units {
    /// An unbounded cost: more than any capacity.
    pub const UNBOUNDED: Self = Self(None);

    /// The value, widened.
    pub fn of<T: IntoUnits>(value: T) -> Self {
        value.into_units()
    }

    /// The cost as the limiter takes it: `Ok(units)` (0 counts as 1: a call always takes at
    /// least one unit; beyond `u64::MAX`, or unbounded, is `u64::MAX`, more than any capacity),
    /// or `Err(value)` when negative.
    pub fn to_cost(self) -> Result<u64, i128> {
        match self.0 {
            Some(n) if n < 0 => Err(n),
            Some(n) => Ok(u64::try_from(n).unwrap_or(u64::MAX).max(1)),
            None => Ok(u64::MAX),
        }
    }

    /// The units a call used, as a settle charges them (`settle = …`): `Ok(units)` (0 is 0:
    /// a call that used nothing gives its whole estimate back; beyond 2^52, or unbounded, is
    /// 2^52, more than any capacity), or `Err(value)` when negative.
    pub fn to_used(self) -> Result<u64, i128> {
        match self.0 {
            Some(n) if n < 0 => Err(n),
            Some(n) => Ok(crate::algorithm::settled_units(
                u64::try_from(n).unwrap_or(u64::MAX),
            )),
            None => Ok(crate::algorithm::settled_units(u64::MAX)),
        }
    }

    fn map2(a: Self, b: Self, op: impl FnOnce(i128, i128) -> Option<i128>) -> Self {
        Self(a.0.zip(b.0).and_then(|(a, b)| op(a, b)))
    }
}

/// `a + b`.
pub fn add(a: Units, b: Units) -> Units {
    Units::map2(a, b, i128::checked_add)
}

/// `a - b` (a negative result is a negative cost, refused).
pub fn sub(a: Units, b: Units) -> Units {
    Units::map2(a, b, i128::checked_sub)
}

/// `a * b`.
pub fn mul(a: Units, b: Units) -> Units {
    Units::map2(a, b, i128::checked_mul)
}

/// `a / b`, rounded toward zero as Rust's integer division; dividing by zero is unbounded
/// (refused, never a panic).
pub fn div(a: Units, b: Units) -> Units {
    Units::map2(a, b, i128::checked_div)
}

/// An integer that a cost expression may be made of.
#[diagnostic::on_unimplemented(
    message = "a `cost` expression is made of integers, and `{Self}` is not one",
    label = "not an integer",
    note = "`cost` takes an integer of any primitive type (`u8` to `u128`, `i8` to `i128`, `usize`, `isize`, their `NonZero` forms and references to them); arithmetic on a type of your own goes inside a block: `cost = {{ … }}`"
)]
pub trait IntoUnits {
    /// The value as [`Units`] (unbounded where it does not fit: a `u128` above `i128::MAX`).
    fn into_units(self) -> Units;
}

impl IntoUnits for Units {
    fn into_units(self) -> Units {
        self
    }
}

impl<T: IntoUnits + Copy> IntoUnits for &T {
    fn into_units(self) -> Units {
        (*self).into_units()
    }
}

macro_rules! lossless {
    ($($t:ty),*) => {$(
        impl IntoUnits for $t {
            fn into_units(self) -> Units {
                Units(Some(i128::from(self)))
            }
        }
    )*};
}
lossless!(u8, u16, u32, u64, i8, i16, i32, i64, i128);

macro_rules! saturating {
    ($($t:ty),*) => {$(
        impl IntoUnits for $t {
            fn into_units(self) -> Units {
                Units(i128::try_from(self).ok())
            }
        }
    )*};
}
saturating!(u128, usize, isize);

macro_rules! non_zero {
    ($($t:ty),*) => {$(
        impl IntoUnits for $t {
            fn into_units(self) -> Units {
                self.get().into_units()
            }
        }
    )*};
}
non_zero!(
    std::num::NonZeroU8,
    std::num::NonZeroU16,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroU128,
    std::num::NonZeroUsize
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn operands_that_would_wrap_saturate_and_zero_divisors_refuse() {
        let n = Units::of(1_u64 << 60);
        assert_eq!(mul(n, Units::of(1000)).to_cost(), Ok(u64::MAX));
        assert_eq!(
            mul(Units::of(u64::MAX), Units::of(u64::MAX)).to_cost(),
            Ok(u64::MAX)
        );
        assert_eq!(sub(Units::of(3_u32), Units::of(5_u32)).to_cost(), Err(-2));
        assert_eq!(div(Units::of(7), Units::of(0)), Units::UNBOUNDED);
        // An overflow is never brought back into range: huge - huge is not 0.
        let huge = mul(Units::of(u64::MAX), Units::of(u64::MAX));
        let huger = mul(huge, Units::of(4));
        assert_eq!(sub(huger, huger), Units::UNBOUNDED);
        assert_eq!(sub(huger, huger).to_cost(), Ok(u64::MAX));
        assert_eq!(div(Units::of(7), Units::of(2)).to_cost(), Ok(3));
        assert_eq!(Units::of(0_u8).to_cost(), Ok(1));
        assert_eq!(Units::of(u128::MAX), Units::UNBOUNDED);
        let five = 5_usize;
        let by_ref: &usize = &five;
        assert_eq!(Units::of(by_ref).to_cost(), Ok(5));
        assert_eq!(
            Units::of(std::num::NonZeroU32::new(9).unwrap()).to_cost(),
            Ok(9)
        );
        assert_eq!(Units::of(i64::MIN).to_cost(), Err(i128::from(i64::MIN)));
    }

    proptest! {
        /// Any operands: never a panic, and the result is the exact mathematical value
        /// whenever that fits a u64 (else it saturates or is negative).
        #[test]
        fn arithmetic_is_exact_or_saturates(a in any::<u64>(), b in any::<u64>(), c in any::<i64>()) {
            let (ua, ub, uc) = (Units::of(a), Units::of(b), Units::of(c));
            let exact = i128::from(a)
                .checked_mul(i128::from(b))
                .and_then(|ab| ab.checked_add(i128::from(c)));
            let got = add(mul(ua, ub), uc);
            prop_assert_eq!(got, Units(exact));
            let _ = div(sub(ua, uc), ub).to_cost();
            let _ = mul(mul(got, got), got).to_cost();
        }
    }
}
