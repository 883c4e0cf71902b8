//! The scripts' wire format: the keys and arguments a call declares, the admin commands on the
//! same keys, and the reading of the replies.

use std::fmt;
use std::io;
use std::time::Duration;

use redis::Value;

use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::store::Check;

/// A key a script touches, declared in the call's KEYS (the scripts build no key: see the
/// prelude's `declared_keys`): a limit's own key, or one named after it (the same hash tag,
/// so the same cluster slot).
#[derive(Debug, Clone, Copy)]
pub(super) enum Declared<'a> {
    /// The limit's key.
    Key(&'a str),
    /// `<key>:b`: its block marker ([`block_key`]).
    Block(&'a str),
    /// `<key>:w`: the driver's working copy, when a key repeats in the call.
    Copy(&'a str),
    /// `<key>:r:<id>:<i>`: receipt `i` (from 1) of the call id.
    Receipt(&'a str, &'a str, usize),
}

impl fmt::Display for Declared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Key(key) => f.write_str(key),
            Self::Block(key) => write!(f, "{key}:b"),
            Self::Copy(key) => write!(f, "{key}:w"),
            Self::Receipt(key, id, i) => write!(f, "{key}:r:{id}:{i}"),
        }
    }
}

impl redis::ToRedisArgs for Declared<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        // Straight into the command's buffer, piece by piece: no String per key on the hot
        // path, and none of the formatting machinery (its cost is per piece written).
        let mut w = out.writer_for_next_arg();
        let (key, suffix) = match *self {
            Self::Key(key) => (key, ""),
            Self::Block(key) => (key, ":b"),
            Self::Copy(key) => (key, ":w"),
            Self::Receipt(key, id, i) => {
                let mut index = itoa::Buffer::new();
                let _ = io::Write::write_all(&mut w, key.as_bytes())
                    .and_then(|()| io::Write::write_all(&mut w, b":r:"))
                    .and_then(|()| io::Write::write_all(&mut w, id.as_bytes()))
                    .and_then(|()| io::Write::write_all(&mut w, b":"))
                    .and_then(|()| io::Write::write_all(&mut w, index.format(i).as_bytes()));
                return;
            }
        };
        let _ = io::Write::write_all(&mut w, key.as_bytes())
            .and_then(|()| io::Write::write_all(&mut w, suffix.as_bytes()));
    }
}

/// Whether a key is named by more than one limit of the call (the driver then works on
/// copies, which the call declares). Calls hold a handful of limits: pairwise is cheapest.
pub(super) fn keys_repeat(checks: &[Check<'_>]) -> bool {
    checks
        .iter()
        .enumerate()
        .any(|(i, a)| checks[..i].iter().any(|b| a.key == b.key))
}

/// The KEYS of a check (the driver) or of the companion's peek and refund, in the prelude's
/// order (`declared_keys`): the limits' keys, their block markers, the working copies when
/// `copies` (a key repeats), the receipts under `receipts` (a call id).
pub(super) fn declared<'a>(
    checks: &'a [Check<'a>],
    copies: bool,
    receipts: Option<&'a str>,
) -> impl ExactSizeIterator<Item = Declared<'a>> + 'a {
    let n = checks.len();
    let groups = 2 + usize::from(copies) + usize::from(receipts.is_some());
    (0..n * groups).map(move |at| {
        let (group, i) = (at / n, at % n);
        let key = checks[i].key;
        match group {
            0 => Declared::Key(key),
            1 => Declared::Block(key),
            2 if copies => Declared::Copy(key),
            // The last group, counted in `groups` only with a call id.
            _ => Declared::Receipt(key, receipts.unwrap_or_default(), i + 1),
        }
    })
}

/// The KEYS the driver is called with for `checks` (under `call_id`), as the store sends
/// them.
#[doc(hidden)] // public for the conformance test, which calls the scripts as the stores do
pub fn check_keys(checks: &[Check<'_>], call_id: Option<&str>) -> Vec<String> {
    declared(checks, keys_repeat(checks), call_id)
        .map(|k| k.to_string())
        .collect()
}

/// The KEYS the companion is called with for `checks`: a peek (`refund: None`) or a refund
/// under that call id, as the stores send them.
#[doc(hidden)] // public for the conformance test
pub fn compensate_keys(checks: &[Check<'_>], refund: Option<&str>) -> Vec<String> {
    declared(checks, false, refund)
        .map(|k| k.to_string())
        .collect()
}

/// The argument of each limit, in the scripts' form (the prelude's `parse_limit`): five whole
/// numbers joined by `:` (algorithm code, limit, period in µs, burst, cost), e.g.
/// `1:5:60000000:5:1`. One string a limit: the server makes an object of each argument it is
/// sent, which costs a check more than the script's parsing of the string.
pub(super) fn limit_args(cmd: &mut redis::Cmd, checks: &[Check<'_>]) {
    for check in checks {
        let p = check.policy;
        let mut spec = LimitSpec::new();
        cmd.arg(spec.write([
            u64::from(p.algorithm().code()),
            p.limit(),
            p.period_ms().saturating_mul(1000),
            p.burst(),
            p.cost(),
        ]));
    }
}

/// One limit's argument, written into a stack buffer: five numbers of at most 20 digits
/// each and four separators.
struct LimitSpec {
    buf: [u8; 5 * 20 + 4],
}

impl LimitSpec {
    const fn new() -> Self {
        Self {
            buf: [0; 5 * 20 + 4],
        }
    }

    /// The argument of a limit's five numbers, as bytes of this buffer.
    fn write(&mut self, numbers: [u64; 5]) -> &[u8] {
        let mut len = 0;
        let mut digits = itoa::Buffer::new();
        for (i, n) in numbers.into_iter().enumerate() {
            if i > 0 {
                self.buf[len] = b':';
                len += 1;
            }
            let text = digits.format(n).as_bytes();
            self.buf[len..len + text.len()].copy_from_slice(text);
            len += text.len();
        }
        &self.buf[..len]
    }
}

/// `DEL` of every receipt the take of `checks` under `call_id` left
/// ([`Store::forget`](crate::store::Store::forget)): one command, so on a cluster only for
/// checks in one slot (the only takes that leave receipts).
pub(crate) fn forget_cmd(checks: &[Check<'_>], call_id: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("DEL");
    for (i, check) in checks.iter().enumerate() {
        cmd.arg(Declared::Receipt(check.key, call_id, i + 1));
    }
    cmd
}

/// [`forget_cmd`] and, for each concurrency limit among `checks`, `ZREM key call_id`: the
/// call's release ([`Store::forget`](crate::store::Store::forget) releases the slots of
/// concurrency limits). One slot's commands, so one pipeline on a cluster too.
pub(crate) fn forget_pipe(checks: &[Check<'_>], call_id: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(forget_cmd(checks, call_id)).ignore();
    for check in checks {
        if check.policy.algorithm() == crate::algorithm::Algorithm::Concurrency {
            pipe.cmd("ZREM").arg(check.key).arg(call_id).ignore();
        }
    }
    pipe
}

/// The block marker of a limit's key (`driver.lua` rejects every call on the key while it
/// exists): the same hash tag, so the same cluster slot.
fn block_key(key: &str) -> String {
    Declared::Block(key).to_string()
}

/// `DEL key key:b`: a limit's state and its block (one slot: the same hash tag).
pub(crate) fn reset_cmd(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(key).arg(block_key(key));
    cmd
}

/// `SET key:b 1 PX ms`: the block marker, with the block's length as its TTL
/// ([`crate::store::block_ms`]).
pub(crate) fn block_cmd(key: &str, duration: Duration) -> redis::Cmd {
    let ms = crate::store::block_ms(duration);
    let mut cmd = redis::cmd("SET");
    cmd.arg(block_key(key)).arg(1).arg("PX").arg(ms);
    cmd
}

/// The script of [`extend_block_cmd`]: the marker written only when it ends later.
const EXTEND_BLOCK: &str = include_str!("../../scripts/extend_block.lua");

/// `EVAL extend_block.lua 1 key:b ms`: the block marker as [`block_cmd`] writes it, unless
/// the marker there already ends later (read and written in one script, so atomically).
pub(crate) fn extend_block_cmd(key: &str, duration: Duration) -> redis::Cmd {
    let ms = crate::store::block_ms(duration);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(EXTEND_BLOCK).arg(1).arg(block_key(key)).arg(ms);
    cmd
}

/// Reads the script's reply: one `[admitted, remaining, reset_after_us, retry_after_us]` per
/// check, in an array (an admitted call's packed in one string instead: [`Row::packed`]); for one check, the
/// driver answers that row itself (the companion script an array of one, read alike). Numbers
/// are clamped into range (a negative count is 0, `remaining` is at most the capacity), so no
/// state under a key can turn into a reply that fails the call; anything that is not that shape
/// is [`StoreError::BadReply`], an error for this call only.
#[doc(hidden)] // public for the conformance test, which reads the embedded Lua's replies with it
pub fn parse_reply(reply: &Value, checks: &[Check<'_>]) -> Result<Verdict, StoreError> {
    parse_rows(reply, checks, None)
}

/// The figures of a receipt that a take's reply carries instead of writing it (the prelude's
/// `receipts_in_reply`): what a receipt key would hold, but for the units, which are the
/// limit's cost.
#[doc(hidden)] // public for the conformance test
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyReceipt {
    /// The server's time of the take, µs; for a fixed window, the start of the millisecond
    /// its window's end was read against (`algorithm::fixed::receipt_in_reply`).
    pub at_us: u64,
    /// The `reset_after` the receipt records, µs.
    pub reset_us: u64,
    /// The decision's `first` (the sliding log's first entry of the call), µs.
    pub first_us: u64,
}

impl ReplyReceipt {
    /// The receipt's value as a receipt key holds it (`<at>:<reset>:<first>:<cost>`, the
    /// prelude's `read_receipt`), for the companion's `return`.
    #[must_use]
    pub fn value(&self, cost: u64) -> String {
        format!("{}:{}:{}:{cost}", self.at_us, self.reset_us, self.first_us)
    }
}

/// [`parse_reply`] of a take whose receipts are in its reply: each row of an admitted call
/// ends with its receipt's three figures; a rejected call's rows have none, and neither has
/// its list of receipts (empty: nothing to give back).
#[doc(hidden)] // public for the conformance test
pub fn parse_reply_with_receipts(
    reply: &Value,
    checks: &[Check<'_>],
) -> Result<(Verdict, Vec<ReplyReceipt>), StoreError> {
    let mut receipts = Vec::new();
    let verdict = parse_rows(reply, checks, Some(&mut receipts))?;
    if !verdict.is_admitted() {
        receipts.clear();
    }
    Ok((verdict, receipts))
}

/// [`parse_reply`], and with `receipts` the receipts of rows that carry them (seven numbers).
fn parse_rows(
    reply: &Value,
    checks: &[Check<'_>],
    mut receipts: Option<&mut Vec<ReplyReceipt>>,
) -> Result<Verdict, StoreError> {
    let bad = |what: String| StoreError::BadReply(what);
    let with_receipts = receipts.is_some();
    let mut decisions = Vec::with_capacity(checks.len());
    let mut take = |row: Row, check: &Check<'_>| {
        if let (Some(receipt), Some(list)) = (row.receipt, receipts.as_deref_mut()) {
            list.push(receipt);
        }
        let limit = check.policy.capacity();
        decisions.push(Decision::new(
            row.admitted,
            limit,
            row.remaining.min(limit),
            Duration::from_micros(row.reset_us),
            Duration::from_micros(row.retry_us),
        ));
    };
    match reply {
        // An admitted call's rows, packed in one string after the byte 1 (for one check,
        // its one row).
        Value::BulkString(bytes) => {
            // Each row 16 or 40 bytes (Row::packed); never 0, which chunks_exact refuses.
            let rows = match bytes.split_first() {
                Some((1, rows)) => rows,
                _ => &[][..],
            };
            let size = rows.len() / checks.len().max(1);
            if !matches!(size, 16 | 40) || size * checks.len() != rows.len() {
                return Err(bad(format!(
                    "expected {} packed decisions, got {bytes:?}",
                    checks.len()
                )));
            }
            for (packed, check) in rows.chunks_exact(size).zip(checks) {
                take(Row::packed(packed, with_receipts)?, check);
            }
        }
        // One check answered with its own numbers: the reply is its one row.
        Value::Array(fields)
            if checks.len() == 1 && matches!(fields.first(), Some(Value::Int(_))) =>
        {
            take(Row::read(reply, with_receipts)?, &checks[0]);
        }
        Value::Array(rows) if rows.len() == checks.len() => {
            for (row, check) in rows.iter().zip(checks) {
                take(Row::read(row, with_receipts)?, check);
            }
        }
        Value::Array(rows) => {
            return Err(bad(format!(
                "expected {} decisions, got {}",
                checks.len(),
                rows.len()
            )));
        }
        _ => return Err(bad(format!("expected an array, got {reply:?}"))),
    }
    // Every limit's receipt, or none: a call with a receipt missing gives back nothing.
    if let Some(list) = receipts
        && list.len() != checks.len()
    {
        list.clear();
    }
    Ok(Verdict::new(decisions))
}

/// One limit's row of a reply: whether admitted, then remaining, `reset_after` and
/// `retry_after` (µs), and the receipt's three figures when the row has them.
struct Row {
    admitted: bool,
    remaining: u64,
    reset_us: u64,
    retry_us: u64,
    receipt: Option<ReplyReceipt>,
}

impl Row {
    /// Reads a row, with its receipt when `with_receipt` and the row has one: an array of
    /// four (or seven) integers. A negative integer reads as 0.
    fn read(row: &Value, with_receipt: bool) -> Result<Self, StoreError> {
        let bad = |what: String| StoreError::BadReply(what);
        let fields = match row {
            Value::Array(fields) if fields.len() == 4 || (with_receipt && fields.len() == 7) => {
                fields
            }
            other => return Err(bad(format!("expected a decision's numbers, got {other:?}"))),
        };
        let mut numbers = [0_u64; 7];
        for (slot, field) in numbers.iter_mut().zip(fields) {
            *slot = match field {
                Value::Int(n) => u64::try_from(*n).unwrap_or(0),
                other => return Err(bad(format!("expected an integer, got {other:?}"))),
            };
        }
        if !matches!(fields.first(), Some(Value::Int(0 | 1))) {
            return Err(bad(format!(
                "admitted must be 0 or 1, got {:?}",
                fields.first()
            )));
        }
        Ok(Self {
            admitted: numbers[0] == 1,
            remaining: numbers[1],
            reset_us: numbers[2],
            retry_us: numbers[3],
            receipt: (fields.len() == 7).then_some(ReplyReceipt {
                at_us: numbers[4],
                reset_us: numbers[5],
                first_us: numbers[6],
            }),
        })
    }

    /// An admitted call's row as the scripts pack it after the reply's leading byte 1 (the
    /// prelude's `taken_row` and `packed_rows`): 16 bytes, or 40 with its receipt (only where
    /// `with_receipt`), each eight a little-endian IEEE 754 double holding a whole number
    /// from 0: remaining and `reset_after`, then the receipt's time, `reset_after` and
    /// `first`. `retry_after` (0) is every such row's, so it is not sent.
    fn packed(bytes: &[u8], with_receipt: bool) -> Result<Self, StoreError> {
        let bad = || StoreError::BadReply(format!("expected a packed decision, got {bytes:?}"));
        if !(bytes.len() == 16 || (with_receipt && bytes.len() == 40)) {
            return Err(bad());
        }
        let mut numbers = [0_u64; 5];
        for (slot, chunk) in numbers.iter_mut().zip(bytes.chunks_exact(8)) {
            let n = f64::from_le_bytes(chunk.try_into().map_err(|_| bad())?);
            // Whole and not negative (NaN and the infinities fail this); -0 reads as 0.
            if !(n >= 0.0 && n.fract() == 0.0) {
                return Err(bad());
            }
            // Exact below 2^64; beyond, only a corrupt reply, saturated (a wait of 584,000
            // years).
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let whole = n as u64;
            *slot = whole;
        }
        let [remaining, reset_us, at_us, receipt_reset_us, first_us] = numbers;
        Ok(Self {
            admitted: true,
            remaining,
            reset_us,
            retry_us: 0,
            receipt: (bytes.len() == 40).then_some(ReplyReceipt {
                at_us,
                reset_us: receipt_reset_us,
                first_us,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;

    fn policy(a: Algorithm) -> Policy {
        Policy::new(a, 5, Duration::from_secs(1)).unwrap()
    }

    fn ints(values: &[i64]) -> Vec<Value> {
        values.iter().map(|v| Value::Int(*v)).collect()
    }

    #[test]
    fn a_declared_key_is_sent_as_it_is_named() {
        use redis::ToRedisArgs as _;
        for declared in [
            Declared::Key("rl:{app::x}:5f1m"),
            Declared::Block("rl:{app::x}:5f1m"),
            Declared::Copy("k"),
            Declared::Receipt("rl:{app::x}:5f1m", "0123456789abcdef1a", 1),
            Declared::Receipt("k", "ab", 12),
            Declared::Key(""),
        ] {
            let sent = declared.to_redis_args();
            assert_eq!(sent, [declared.to_string().into_bytes()], "{declared:?}");
        }
    }

    #[test]
    fn a_limit_is_one_argument_of_five_numbers_joined_by_colons() {
        let p = Policy::new(Algorithm::Gcra, 7, Duration::from_secs(60)).unwrap();
        let q = Policy::new(Algorithm::Fixed, 3, Duration::from_millis(1500)).unwrap();
        let mut cmd = redis::cmd("FCALL");
        limit_args(&mut cmd, &[Check::new("k", &p), Check::new("j", &q)]);
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let (gcra, fixed) = (Algorithm::Gcra.code(), Algorithm::Fixed.code());
        assert_eq!(
            args[1..],
            [
                format!("{gcra}:7:60000000:7:1").into_bytes(),
                format!("{fixed}:3:1500000:3:1").into_bytes(),
            ]
        );
        // The largest numbers fill the buffer exactly, each written whole.
        let max = u64::MAX.to_string();
        let mut spec = LimitSpec::new();
        assert_eq!(
            spec.write([u64::MAX; 5]),
            [max.as_str(); 5].join(":").as_bytes()
        );
    }

    #[test]
    fn malformed_replies_are_errors_and_out_of_range_numbers_are_clamped() {
        let p = policy(Algorithm::Fixed);
        let checks = [Check::new("k", &p)];
        let row = |v: Vec<Value>| Value::Array(vec![Value::Array(v)]);
        let cases = [
            Value::Nil,
            Value::Int(1),
            Value::Array(ints(&[])),
            row(ints(&[1, 2, 3])),
            Value::Array(ints(&[1, 2, 3])),
            Value::Array(ints(&[2, 2, 3, 0])),
            row(ints(&[2, 2, 3, 0])),
            row(vec![
                Value::Int(1),
                Value::BulkString(b"2".to_vec()),
                Value::Int(3),
                Value::Int(0),
            ]),
        ];
        for case in cases {
            assert!(
                matches!(parse_reply(&case, &checks), Err(StoreError::BadReply(_))),
                "{case:?}"
            );
        }
        // Out-of-range numbers are clamped, never an error that fails the call.
        let negative = row(ints(&[1, -1, -3, -9]));
        let d = parse_reply(&negative, &checks).unwrap().decisions()[0];
        assert_eq!((d.remaining, d.reset_after), (0, Duration::ZERO));
        let above = row(ints(&[0, 6, 3, 0]));
        let d = parse_reply(&above, &checks).unwrap().decisions()[0];
        assert_eq!((d.remaining, d.retry_after), (5, Some(Duration::ZERO)));
        let ok = row(ints(&[0, 0, 1500, 700]));
        let v = parse_reply(&ok, &checks).unwrap();
        let d = v.decisions()[0];
        assert!(!d.admitted);
        assert_eq!(d.limit, 5);
        assert_eq!(d.reset_after, Duration::from_micros(1500));
        assert_eq!(d.retry_after, Some(Duration::from_micros(700)));
        // One check's four numbers without the array around them read the same.
        let Value::Array(mut flat) = ok else {
            unreachable!()
        };
        assert_eq!(parse_reply(&flat.remove(0), &checks).unwrap(), v);
        // Two checks need an array of two arrays.
        let two = [Check::new("k", &p), Check::new("j", &p)];
        let four = Value::Array(ints(&[1, 2, 3, 0]));
        assert!(matches!(
            parse_reply(&four, &two),
            Err(StoreError::BadReply(_))
        ));
    }

    /// An admitted call's rows as the scripts pack them (`struct.pack('<Bdd…', 1, …)`).
    fn packed(numbers: &[f64]) -> Value {
        let rows = numbers.iter().flat_map(|n| n.to_le_bytes());
        Value::BulkString(std::iter::once(1).chain(rows).collect())
    }

    #[test]
    fn a_packed_row_reads_as_its_numbers() {
        let p = policy(Algorithm::Fixed);
        let checks = [Check::new("k", &p)];
        let as_ints = parse_reply(&Value::Array(ints(&[1, 3, 10_001_000, 0])), &checks).unwrap();
        assert_eq!(
            parse_reply(&packed(&[3.0, 10_001_000.0]), &checks).unwrap(),
            as_ints
        );
        let with_receipt = [3.0, 10_001_000.0, 1_700_000_000_000.0, 10_001_000.0, 42.0];
        let (verdict, receipts) =
            parse_reply_with_receipts(&packed(&with_receipt), &checks).unwrap();
        assert_eq!(verdict, as_ints);
        let receipt = ReplyReceipt {
            at_us: 1_700_000_000_000,
            reset_us: 10_001_000,
            first_us: 42,
        };
        assert_eq!(receipts, [receipt]);
        // The largest whole double a row holds reads exactly; -0 reads as 0.
        let v = parse_reply(&packed(&[-0.0, 9_007_199_254_740_991.0]), &checks).unwrap();
        assert_eq!(
            v.decisions()[0].reset_after,
            Duration::from_micros(9_007_199_254_740_991)
        );
        assert_eq!(v.decisions()[0].remaining, 0);
        // Any other first byte is no admitted row: not an error's text that happens to have
        // the length of one (eight ASCII letters can read as a whole double).
        let Value::BulkString(mut tagged) = packed(&[3.0, 10_001_000.0]) else {
            unreachable!()
        };
        for tag in [0, 2, b'E'] {
            tagged[0] = tag;
            assert!(parse_reply(&Value::BulkString(tagged.clone()), &checks).is_err());
        }
        assert!(parse_reply(&Value::BulkString(b"ERR ERR ERR ERR ".to_vec()), &checks).is_err());
        for bad in [
            Value::BulkString(Vec::new()),
            Value::BulkString(b"1:3:10001000:0".to_vec()),
            Value::BulkString(vec![1]),
            Value::BulkString(vec![1; 16]),
            Value::BulkString([&[1][..], &[0; 16]].concat()[1..].to_vec()),
            Value::BulkString(vec![1; 18]),
            Value::BulkString(vec![0; 33]),
            Value::BulkString([&[1][..], &[0; 32]].concat()),
            Value::BulkString([&[1][..], &[0; 48]].concat()),
            packed(&[-1.0, 3.0]),
            packed(&[1.5, 3.0]),
            packed(&[3.0, f64::NAN]),
            packed(&[3.0, f64::INFINITY]),
            packed(&[3.0, 1.0, f64::NEG_INFINITY, 0.0, 0.0]),
        ] {
            assert!(
                matches!(
                    parse_reply_with_receipts(&bad, &checks),
                    Err(StoreError::BadReply(_))
                ),
                "{bad:?}"
            );
        }
        // A receipt only where receipts were asked for.
        assert!(parse_reply(&packed(&with_receipt), &checks).is_err());
    }

    #[test]
    fn the_packed_rows_of_a_stack_read_as_one_row_per_limit() {
        let p = policy(Algorithm::Fixed);
        let q = policy(Algorithm::Gcra);
        let two = [Check::new("k", &p), Check::new("j", &q)];
        let v = parse_reply(&packed(&[3.0, 1_000.0, 2.0, 5_000.0]), &two).unwrap();
        let rows: Vec<_> = v
            .decisions()
            .iter()
            .map(|d| (d.admitted, d.remaining, d.reset_after.as_micros()))
            .collect();
        assert_eq!(rows, [(true, 3, 1_000), (true, 2, 5_000)]);
        let rows = [
            3.0, 1_000.0, 7.0, 1_000.0, 0.0, 2.0, 5_000.0, 8.0, 5_000.0, 9.0,
        ];
        let (v, receipts) = parse_reply_with_receipts(&packed(&rows), &two).unwrap();
        assert!(v.is_admitted());
        assert_eq!(
            receipts
                .iter()
                .map(|r| (r.at_us, r.first_us))
                .collect::<Vec<_>>(),
            [(7, 0), (8, 9)]
        );
        // Without receipts asked for, 80 bytes are not two rows; a row alone is not two; nor
        // is a string of a length the limits do not divide.
        assert!(parse_reply(&packed(&rows), &two).is_err());
        assert!(parse_reply(&packed(&[3.0, 1.0]), &two).is_err());
        assert!(parse_reply(&Value::BulkString(vec![1; 34]), &two).is_err());
        assert!(parse_reply(&packed(&[3.0, 1.0]), &[]).is_err());
        // A rejected call's rows are arrays of integers; a packed row in an array is none.
        let rows = Value::Array(vec![
            Value::Array(ints(&[1, 2, 3, 0])),
            Value::Array(ints(&[0, 0, 9, 9])),
        ]);
        assert!(!parse_reply(&rows, &two).unwrap().is_admitted());
        let rows = Value::Array(vec![packed(&[3.0, 1.0]), Value::Array(ints(&[0, 0, 9, 9]))]);
        assert!(parse_reply(&rows, &two).is_err());
    }

    proptest::proptest! {
        /// Whatever bytes a row's string holds, reading it answers a decision or an error.
        #[test]
        fn any_string_row_reads_without_a_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let p = policy(Algorithm::Fixed);
            let reply = Value::BulkString(bytes);
            for n in 0..4 {
                let checks = vec![Check::new("k", &p); n];
                let _ = parse_reply(&reply, &checks);
                let _ = parse_reply_with_receipts(&reply, &checks);
            }
        }

        /// Any whole numbers packed as the scripts pack them read as those numbers, as the
        /// rows of four (two packed a limit) or seven (five packed) they stand for, for one
        /// limit or two; any other count is an error.
        #[test]
        fn packed_numbers_read_as_their_rows(
            numbers in proptest::collection::vec(0_u64..(1 << 53), 0..11),
            limits in 1_usize..3,
        ) {
            let p = policy(Algorithm::Fixed);
            let checks = vec![Check::new("k", &p); limits];
            #[allow(clippy::cast_precision_loss)] // below 2^53: exact
            let doubles: Vec<f64> = numbers.iter().map(|&n| n as f64).collect();
            let per_limit = numbers.len() / limits;
            let rows = per_limit * limits == numbers.len() && matches!(per_limit, 2 | 5);
            match parse_reply_with_receipts(&packed(&doubles), &checks) {
                Ok((verdict, receipts)) => {
                    proptest::prop_assert!(rows);
                    for (i, d) in verdict.decisions().iter().enumerate() {
                        let row = &numbers[i * per_limit..(i + 1) * per_limit];
                        proptest::prop_assert!(d.admitted);
                        proptest::prop_assert_eq!(d.remaining, row[0].min(d.limit));
                        proptest::prop_assert_eq!(d.reset_after, Duration::from_micros(row[1]));
                        proptest::prop_assert_eq!(d.retry_after, None);
                        if per_limit == 5 {
                            let expected = ReplyReceipt { at_us: row[2], reset_us: row[3], first_us: row[4] };
                            proptest::prop_assert_eq!(receipts[i], expected);
                        }
                    }
                    proptest::prop_assert_eq!(receipts.len(), if per_limit == 5 { limits } else { 0 });
                }
                Err(StoreError::BadReply(_)) => proptest::prop_assert!(!rows),
                Err(other) => proptest::prop_assert!(false, "{other:?}"),
            }
        }
    }
}
