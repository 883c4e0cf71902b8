//! The standard rich error detail of a refusal: a `google.rpc.Status` carrying one
//! `google.rpc.RetryInfo`, encoded by hand (a few fields of protobuf wire format) so that the
//! runtime needs no protobuf library. Clients read it with `tonic_types::StatusExt::
//! get_details_retry_info` (Rust), `grpc-status-details-bin` elsewhere.

use std::time::Duration;

const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// `google.rpc.Status { code, message, details: [Any(RetryInfo { retry_delay })] }`.
pub(crate) fn retry_info_status(code: i32, message: &str, retry_delay: Duration) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut duration = Vec::with_capacity(12);
    let seconds = i64::try_from(retry_delay.as_secs()).unwrap_or(i64::MAX);
    if seconds != 0 {
        varint_field(&mut duration, 1, seconds.cast_unsigned());
    }
    if retry_delay.subsec_nanos() != 0 {
        varint_field(&mut duration, 2, u64::from(retry_delay.subsec_nanos()));
    }
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1; }
    let mut retry_info = Vec::with_capacity(duration.len() + 2);
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::with_capacity(RETRY_INFO_URL.len() + retry_info.len() + 4);
    bytes_field(&mut any, 1, RETRY_INFO_URL.as_bytes());
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
    let mut status = Vec::with_capacity(message.len() + any.len() + 8);
    if code != 0 {
        // int32 is sign-extended to 64 bits on the wire.
        varint_field(&mut status, 1, i64::from(code).cast_unsigned());
    }
    if !message.is_empty() {
        bytes_field(&mut status, 2, message.as_bytes());
    }
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        // The low seven bits, with the continuation bit.
        out.push(u8::try_from(n & 0x7f).unwrap_or_default() | 0x80);
        n >>= 7;
    }
    out.push(u8::try_from(n).unwrap_or_default());
}

fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        for (n, bytes) in [
            (0_u64, &[0_u8][..]),
            (1, &[1]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (
                u64::MAX,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut out = Vec::new();
            varint(&mut out, n);
            assert_eq!(out, bytes, "{n}");
        }
    }

    #[test]
    fn a_retry_info_status_is_the_standard_message() {
        let got = retry_info_status(8, "slow", Duration::from_millis(1_500));
        let mut want = vec![0x08, 8, 0x12, 4];
        want.extend_from_slice(b"slow");
        // details[0]: Any, 2 + 40 bytes of type_url, 2 + 10 bytes of RetryInfo.
        want.extend_from_slice(&[0x1a, 54, 0x0a, 40]);
        want.extend_from_slice(RETRY_INFO_URL.as_bytes());
        // RetryInfo { retry_delay: Duration { seconds: 1, nanos: 500_000_000 } }
        want.extend_from_slice(&[
            0x12, 10, 0x0a, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01,
        ]);
        assert_eq!(got, want);
    }
}
