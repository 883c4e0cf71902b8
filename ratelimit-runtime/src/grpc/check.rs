//! What a gRPC method's check reads from its `tonic::Request` and what a refusal carries.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::{Code, Request, Status};

use super::details::retry_info_status;
use crate::UserId;
use crate::error::RateLimitError;
use crate::http::HttpSettings;
use crate::http::ip;
use crate::http::response::{Fields, Refusal, reset_seconds, whole_seconds};
use crate::limit::{By, Limit, keys_for};
use crate::limiter::RateLimiter;
use crate::policy::Verdict;

/// A call's limiter and store keys, read from its request by [`prepare`] so that the check's
/// future holds no reference to the request (whose message may be neither `Sync` nor `Send`,
/// as a `Streaming` is not).
pub struct GrpcCall {
    limiter: RateLimiter,
    keys: Vec<String>,
}

impl std::fmt::Debug for GrpcCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys may hold a caller's metadata (an API key): not printed.
        f.debug_struct("GrpcCall")
            .field("limiter", &self.limiter)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// Reads what `limits` are `by` from `request` and builds the store keys (one per limit;
/// `templates[i]` is limit `i`'s rendered `key` template, if any), or the `Status` that answers
/// a request lacking it.
pub fn prepare<T>(
    limits: &'static [Limit],
    request: &Request<T>,
    templates: &[Option<&str>],
) -> Result<GrpcCall, Status> {
    let limiter = request
        .extensions()
        .get::<RateLimiter>()
        .cloned()
        .unwrap_or_else(RateLimiter::current);
    let settings = limiter.settings();
    let keys = keys_for(&settings.prefix, limits, templates, |by| {
        by_value(request, by, &settings.http)
    })?;
    Ok(GrpcCall { limiter, keys })
}

/// Checks every limit of a method for one call (one store round trip): `Ok` runs the body,
/// `Err` is `RESOURCE_EXHAUSTED` (quota spent), `UNAVAILABLE` (store down under the deny
/// failure policy), or what [`prepare`] refused.
pub async fn check(limits: &'static [Limit], call: Result<GrpcCall, Status>) -> Result<(), Status> {
    let GrpcCall { limiter, keys } = call?;
    // Shadow mode and the metrics apply as for handlers (`RateLimiter::decide`).
    match limiter.decide(limits, &keys).await {
        Ok(v) if v.is_admitted() => Ok(()),
        Ok(v) => Err(resource_exhausted(limits, &v, &limiter.settings().http)),
        Err(_) => Err(unavailable()),
    }
}

/// The method's error from a refusal: `E::from(status)` (spanned by the macro at the return
/// type, so a missing `From<Status>` is reported there).
pub fn into_error<E: From<Status>>(status: Status) -> E {
    E::from(status)
}

static MISSING_PEER_LOGGED: AtomicBool = AtomicBool::new(false);

const MISSING_PEER: &str = "rate limiting by IP needs the peer address of the connection, which this request does not carry: \
     serve the service with tonic's transport server (`tonic::transport::Server`), which records it \
     (`Request::remote_addr`), or use another `by`";

/// The value `by` identifies the caller of `request` with (`None` for `global`), or the
/// `Status` that answers a request lacking it.
fn by_value<'r, T>(
    request: &'r Request<T>,
    by: By,
    settings: &HttpSettings,
) -> Result<Option<Cow<'r, [u8]>>, Status> {
    let headers: &http::HeaderMap = request.metadata().as_ref();
    Ok(Some(match by {
        By::Global => return Ok(None),
        By::Ip => {
            let Some(peer) = request.remote_addr() else {
                if !MISSING_PEER_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::error!(target: crate::observe::log::CALLER, "{MISSING_PEER}");
                }
                return Err(Status::failed_precondition(MISSING_PEER));
            };
            let client = ip::client_ip(peer.ip(), headers, settings);
            Cow::Owned(ip::bucket_text(client, settings).as_bytes().to_vec())
        }
        By::User => match request.extensions().get::<UserId>() {
            Some(user) if !user.as_str().is_empty() => Cow::Borrowed(user.as_str().as_bytes()),
            _ => {
                return Err(Status::unauthenticated(
                    "user info empty: the request carries no authenticated user (UserId)",
                ));
            }
        },
        By::AppId => match header(headers, "appid") {
            Some(v) => Cow::Borrowed(v),
            None => return Err(Status::invalid_argument("appId must not be empty")),
        },
        By::Header(name) => match header(headers, name) {
            Some(v) => Cow::Borrowed(v),
            None => {
                return Err(Status::invalid_argument(format!(
                    "metadata {name} must not be empty"
                )));
            }
        },
        // The macro rejects `by = "url"` on a gRPC method: a tonic request has no path.
        By::Url => {
            return Err(Status::failed_precondition(
                "by = \"url\" is not available on a gRPC method: a tonic request carries no path",
            ));
        }
    }))
}

/// The first value of metadata entry `name`, unless it is blank.
fn header<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h [u8]> {
    let value = headers.get(name)?.as_bytes();
    (!value.trim_ascii().is_empty()).then_some(value)
}

/// `RESOURCE_EXHAUSTED` for a refused verdict: the HTTP integration's fields (`retry-after`,
/// `ratelimit-policy`, `ratelimit` …) as metadata, and the `RetryInfo` detail.
fn resource_exhausted(limits: &[Limit], verdict: &Verdict, settings: &HttpSettings) -> Status {
    let fields = Refusal::too_many_requests(limits, verdict, settings).fields;
    let delay = verdict.retry_after().unwrap_or_default();
    refused(&settings.message, &fields, delay)
}

fn refused(message: &str, fields: &Fields, delay: std::time::Duration) -> Status {
    let code = Code::ResourceExhausted;
    let mut metadata = MetadataMap::with_capacity(fields.len());
    for (name, value) in fields {
        // Static lower-case names and ASCII values: never refused.
        if let Ok(value) = MetadataValue::try_from(value.as_str()) {
            metadata.insert(MetadataKey::from_static(name), value);
        }
    }
    let details = retry_info_status(code as i32, message, delay);
    Status::with_details_and_metadata(code, message, details.into(), metadata)
}

fn unavailable() -> Status {
    Status::unavailable("the rate-limit store is unavailable; please try again later")
}

/// `RESOURCE_EXHAUSTED` for [`RateLimitError::Limited`], with `retry-after` (whole seconds,
/// rounded up, at least 1), the legacy `x-ratelimit-limit` / `-remaining` / `-reset` of the
/// binding limit and the `google.rpc.RetryInfo` detail; `UNAVAILABLE` for
/// [`RateLimitError::StoreUnavailable`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::RateLimitError;
///
/// let error = RateLimitError::Limited {
///     retry_after: Duration::from_millis(1_200),
///     limit: 5,
///     remaining: 0,
///     reset_after: Duration::from_secs(60),
/// };
/// let status = tonic::Status::from(error);
/// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
/// assert_eq!(status.metadata().get("retry-after").unwrap(), "2");
/// assert_eq!(status.metadata().get("x-ratelimit-limit").unwrap(), "5");
/// ```
impl From<RateLimitError> for Status {
    fn from(error: RateLimitError) -> Self {
        match error {
            RateLimitError::Limited {
                retry_after,
                limit,
                remaining,
                reset_after,
            } => {
                let fields: Fields = vec![
                    ("retry-after", whole_seconds(retry_after).max(1).to_string()),
                    ("x-ratelimit-limit", limit.to_string()),
                    ("x-ratelimit-remaining", remaining.to_string()),
                    ("x-ratelimit-reset", reset_seconds(reset_after).to_string()),
                ];
                refused(&error.to_string(), &fields, retry_after)
            }
            RateLimitError::StoreUnavailable(_) => unavailable(),
            // The HTTP integrations' 401, 500 and 400, in gRPC's codes.
            RateLimitError::MissingQuota => Status::unauthenticated(error.to_string()),
            RateLimitError::InvalidQuota(_) => Status::internal(error.to_string()),
            RateLimitError::CostExceedsCapacity { .. } | RateLimitError::NegativeCost { .. } => {
                Status::invalid_argument(error.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::{Algorithm, Decision, Policy};

    fn limit(by: By) -> Limit {
        Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 1, 1000, 1, 1).unwrap(),
            scope: "app::hello",
            by,
            shadow: false,
            failure_policy: None,
        }
    }

    fn request(metadata: &[(&'static str, &str)]) -> Request<()> {
        let mut r = Request::new(());
        for (n, v) in metadata {
            r.metadata_mut().append(*n, v.parse().unwrap());
        }
        r
    }

    #[test]
    fn sources_read_the_metadata_and_extensions() {
        let s = HttpSettings::default();
        let mut r = request(&[("appid", " a1 "), ("x-key", "k")]);
        r.extensions_mut().insert(UserId::new("alice"));
        let v = |by| by_value(&r, by, &s).unwrap().map(Cow::into_owned);
        assert_eq!(v(By::Global), None);
        assert_eq!(v(By::AppId), Some(b" a1 ".to_vec()));
        assert_eq!(v(By::Header("x-key")), Some(b"k".to_vec()));
        assert_eq!(v(By::User), Some(b"alice".to_vec()));
    }

    #[test]
    fn missing_sources_are_statuses_with_a_message() {
        let s = HttpSettings::default();
        let mut r = request(&[("appid", "  "), ("x-key", "")]);
        let err = |r: &Request<()>, by| by_value(r, by, &s).unwrap_err();
        let e = err(&r, By::Header("x-key"));
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("x-key"), "{e:?}");
        assert!(err(&r, By::Header("x-other")).message().contains("x-other"));
        assert_eq!(err(&r, By::AppId).code(), Code::InvalidArgument);
        assert_eq!(err(&r, By::User).code(), Code::Unauthenticated);
        r.extensions_mut().insert(UserId::new(""));
        assert_eq!(err(&r, By::User).code(), Code::Unauthenticated);
        // No transport, no peer address: a clear status, never "admit".
        let e = err(&r, By::Ip);
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("remote_addr"), "{e:?}");
    }

    #[test]
    fn errors_of_limits_that_follow_the_caller_are_the_http_answers_in_grpc_codes() {
        let missing = Status::from(RateLimitError::MissingQuota);
        assert_eq!(missing.code(), Code::Unauthenticated);
        let cost = Status::from(RateLimitError::CostExceedsCapacity {
            cost: 101,
            capacity: 100,
        });
        assert_eq!(cost.code(), Code::InvalidArgument);
        assert!(cost.message().contains("101"), "{cost:?}");
        let invalid = Policy::from_parts(Algorithm::Sliding, 10_001, 1000, 10_001, 1).unwrap_err();
        let invalid = Status::from(RateLimitError::InvalidQuota(invalid));
        assert_eq!(invalid.code(), Code::Internal);
    }

    #[test]
    fn a_refusal_carries_the_http_fields_and_retry_info() {
        let limits = [limit(By::Global)];
        let v = Verdict::new(vec![Decision::new(
            false,
            1,
            0,
            Duration::from_millis(900),
            Duration::from_millis(900),
        )]);
        let status = resource_exhausted(&limits, &v, &HttpSettings::default());
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), HttpSettings::DEFAULT_MESSAGE);
        let md = status.metadata();
        assert_eq!(md.get("retry-after").unwrap(), "1");
        assert_eq!(md.get("ratelimit-policy").unwrap(), "\"hello\";q=1;w=1");
        assert_eq!(md.get("ratelimit").unwrap(), "\"hello\";r=0;t=1");
        assert_eq!(
            status.details(),
            retry_info_status(
                Code::ResourceExhausted as i32,
                HttpSettings::DEFAULT_MESSAGE,
                Duration::from_millis(900)
            )
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn metadata(value: &[u8]) -> Option<tonic::metadata::AsciiMetadataValue> {
            // What a client can send: any bytes a header value may hold.
            let value = http::HeaderValue::from_bytes(value).ok()?;
            let mut headers = http::HeaderMap::new();
            headers.insert("x", value);
            MetadataMap::from_headers(headers).get("x").cloned()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any bytes in the keyed entry and in `x-forwarded-for`, trusted or not: no
            /// panic; a key of bounded length with one hash tag, or a refusal of a blank value;
            /// by IP always a key, the peer's when no proxy is trusted.
            #[test]
            fn any_metadata_gives_a_bounded_key_or_a_refusal(
                key in proptest::collection::vec(any::<u8>(), 0..300),
                xff in proptest::collection::vec(any::<u8>(), 0..300),
                trusting in any::<bool>(),
            ) {
                let proxies: &[&str] = if trusting { &["0.0.0.0/0", "::/0"] } else { &[] };
                let limiter = RateLimiter::builder()
                    .trusted_proxies(proxies.iter().copied())
                    .build_lazy()
                    .unwrap();
                let settings = limiter.settings();
                let mut r = Request::new(());
                r.extensions_mut().insert(tonic::transport::server::TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some("10.0.0.1:5000".parse().unwrap()),
                });
                if let Some(v) = metadata(&key) {
                    r.metadata_mut().insert("x-key", v);
                }
                if let Some(v) = metadata(&xff) {
                    r.metadata_mut().insert("x-forwarded-for", v);
                }
                let limits = [limit(By::Header("x-key"))];
                match keys_for(&settings.prefix, &limits, &[None], |by| by_value(&r, by, &settings.http)) {
                    Ok(keys) => {
                        prop_assert!(keys[0].len() < 120, "{}", keys[0]);
                        prop_assert_eq!(keys[0].matches('{').count(), 1);
                    }
                    Err(status) => prop_assert_eq!(status.code(), Code::InvalidArgument),
                }
                // By IP, the peer or a hop the header spells: always a key.
                let limits = [limit(By::Ip)];
                let keys = keys_for(&settings.prefix, &limits, &[None], |by| by_value(&r, by, &settings.http));
                let keys = keys.map_err(|s| TestCaseError::fail(format!("{s:?}")))?;
                prop_assert!(keys[0].len() < 120, "{}", keys[0]);
                if !trusting {
                    prop_assert!(keys[0].contains("10.0.0.1"), "{}", keys[0]);
                }
            }
        }
    }

    #[test]
    fn a_store_failure_is_unavailable() {
        let status = Status::from(RateLimitError::StoreUnavailable(
            crate::StoreError::connection("refused"),
        ));
        assert_eq!(status.code(), Code::Unavailable);
    }
}
