//! gRPC answers: a request that is gRPC gets a trailers-only response (HTTP 200 with
//! `grpc-status` in the headers) instead of an HTTP error status, so that gRPC clients see a
//! status code (`RESOURCE_EXHAUSTED` for a spent quota) rather than a transport error.

use std::fmt::Write as _;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method};

use crate::call::plan::Outcome;

/// The header (or trailer) of a gRPC call's status code.
pub(crate) const STATUS: &str = "grpc-status";

/// What a gRPC call's `grpc-status` means to a count filter: `0` (`OK`) is `Ok`, any other
/// code `Err` (as a gRPC method's `Result`).
pub(crate) fn outcome(status: &http::HeaderValue) -> Outcome {
    if status.as_bytes().trim_ascii() == b"0" {
        Outcome::Ok
    } else {
        Outcome::Err
    }
}

/// Whether a request is gRPC: a `POST` whose content type is `application/grpc`, alone or
/// followed by `+<codec>`, `-web…` or parameters (any case). gRPC always posts; requiring it
/// keeps a client that merely sends a gRPC content type on a `GET` from getting a cacheable
/// `200` in place of a 429.
pub(crate) fn is_grpc(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| is_grpc_content_type(v.as_bytes()))
}

/// Whether `value` is a gRPC content type (see [`is_grpc`]).
pub(crate) fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some((head, rest)) = value.split_at_checked(GRPC.len()) else {
        return false;
    };
    head.eq_ignore_ascii_case(GRPC) && matches!(rest.first(), None | Some(b'+' | b'-' | b';'))
}

/// `message` as a `grpc-message` value: percent-encoded UTF-8, printable ASCII but `%` as is.
pub(crate) fn message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grpc_content_types() {
        for yes in [
            &b"application/grpc"[..],
            b"application/grpc+proto",
            b"application/grpc-web",
            b"application/grpc-web+proto",
            b"application/grpc;charset=utf-8",
            b"Application/GRPC",
        ] {
            assert!(is_grpc_content_type(yes), "{yes:?}");
        }
        for no in [
            &b""[..],
            b"application/json",
            b"application/grpcx",
            b"application/grp",
            b"text/application/grpc",
            b" application/grpc",
        ] {
            assert!(!is_grpc_content_type(no), "{no:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "application/grpc".parse().unwrap());
        assert!(is_grpc(&Method::POST, &headers));
        assert!(!is_grpc(&Method::GET, &headers));
        assert!(!is_grpc(&Method::POST, &HeaderMap::new()));
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(message("Too many, 100%"), "Too many, 100%25");
        assert_eq!(message("é\n"), "%C3%A9%0A");
    }

    proptest! {
        #[test]
        fn any_content_type_is_read_without_panic(value in proptest::collection::vec(any::<u8>(), 0..40)) {
            let grpc = is_grpc_content_type(&value);
            prop_assert_eq!(grpc, value.len() >= 16
                && value[..16].eq_ignore_ascii_case(b"application/grpc")
                && matches!(value.get(16), None | Some(b'+' | b'-' | b';')));
        }

        #[test]
        fn any_message_encodes_to_a_valid_header_value(s in any::<String>()) {
            let encoded = message(&s);
            prop_assert!(http::HeaderValue::try_from(encoded.as_str()).is_ok());
        }
    }
}
