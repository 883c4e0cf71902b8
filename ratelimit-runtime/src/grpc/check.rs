//! The gRPC adapter of the call pipeline: what a method's check reads from its
//! `tonic::Request` ([`prepare`]), the decision ([`check`]), and what the call answers: a
//! `Status` for a refusal, the rate-limit metadata on an admitted response
//! ([`Admission::finish`]), which also settles a `count = …` limit by the method's result.

use std::borrow::Cow;

use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status};

use super::details::retry_info_status;
use crate::call::plan::{Dynamic, Input, Outcome};
use crate::call::{self, Admitted, Call, Prepared, Refused};
use crate::caller::answer::{FieldSet, Fields, Refusal, reset_seconds, retry_seconds};
use crate::caller::settings::HttpSettings;
use crate::caller::{Caller, Transport, UserId};
use crate::error::RateLimitError;
use crate::limit::Limit;
use crate::limiter::{Current, RateLimiter};
use crate::quota::Quota;

/// A call's limiter and what its request gave the pipeline (keys, quotas, costs), read by
/// [`prepare`] so that the check's future holds no reference to the request (whose message may
/// be neither `Sync` nor `Send`, as a `Streaming` is not).
pub struct GrpcCall {
    limiter: Current,
    prepared: Result<Prepared<'static>, Refused>,
}

impl std::fmt::Debug for GrpcCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys may hold a caller's metadata (an API key): not printed.
        f.debug_struct("GrpcCall")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

/// What a tonic request offers the limiter: the peer address tonic's transport recorded, the
/// method's path ([`method_path`]), the metadata as headers, the [`UserId`] and [`Quota`] an
/// interceptor put in the extensions.
fn caller<'r, T>(request: &'r Request<T>, path: Option<&'r str>) -> Caller<'r> {
    let extensions = request.extensions();
    Caller {
        peer: request.remote_addr().map(|a| a.ip()),
        path,
        headers: request.metadata().as_ref(),
        user: extensions.get::<UserId>(),
        quota: extensions.get::<Quota>().copied(),
        transport: Transport::Grpc,
    }
}

/// The path of the method a request calls, `/package.Service/Method`, as an HTTP request to it
/// has it: from tonic's [`tonic::GrpcMethod`] extension, or the URI tonic's router recorded
/// (Axum's `OriginalUri`, which its router keeps when Axum's `original-uri` feature is on, as
/// the `axum` feature of this crate turns it on). `None` when the request carries neither: an
/// exemption predicate then sees an empty path, never one an HTTP route has.
fn method_path<T>(request: &Request<T>) -> Option<Cow<'_, str>> {
    let extensions = request.extensions();
    if let Some(method) = extensions.get::<tonic::GrpcMethod<'static>>() {
        let (service, method) = (method.service(), method.method());
        return Some(Cow::Owned(format!("/{service}/{method}")));
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = extensions.get::<axum::extract::OriginalUri>() {
        return Some(Cow::Borrowed(uri.path()));
    }
    None
}

/// Reads what `limits` are `by` from `request` (the limiter of its extensions, else
/// [`RateLimiter::current`]) and works out the call: `templates[i]` is limit `i`'s rendered
/// `key` template, `dynamics` and `inputs` the run-time parts (`quota`, `cost = <expression>`,
/// `count`) of a method that has them.
pub fn prepare<T>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    request: &Request<T>,
    templates: &[Option<&str>],
    inputs: &[Input],
) -> GrpcCall {
    let limiter = request
        .extensions()
        .get::<RateLimiter>()
        .cloned()
        .map_or_else(RateLimiter::current_for_call, Current::Held);
    let call = Call {
        limits,
        dynamics,
        inputs,
        templates,
    };
    // Only an exemption predicate reads a method's path (the macro refuses `by = "url"` on
    // a method): looked up for it alone.
    let path = limiter
        .settings()
        .exemptions
        .has_predicate()
        .then(|| method_path(request))
        .flatten();
    let prepared = call::prepare(&limiter, call, &caller(request, path.as_deref()));
    GrpcCall { limiter, prepared }
}

/// Checks every limit of a method for one call (one store round trip): `Ok` runs the body,
/// `Err` is `RESOURCE_EXHAUSTED` (quota spent), `UNAVAILABLE` (store down under the deny
/// failure policy), `PERMISSION_DENIED` (a denied network), or what the request lacks.
pub async fn check(call: GrpcCall) -> Result<Admission, Status> {
    let GrpcCall { limiter, prepared } = call;
    let admitted = match prepared {
        Ok(prepared) => prepared.run_soon(&limiter).await,
        Err(refused) => Err(refused),
    };
    let settings = &limiter.settings().http;
    match admitted {
        Ok(admitted) => Ok(Admission {
            fields: admitted.fields(settings.header_style, None),
            admitted,
        }),
        Err(refused) => Err(status_of(&refused.refusal(settings))),
    }
}

/// An admitted gRPC call, until its method returns.
#[derive(Debug)]
pub struct Admission {
    admitted: Admitted<'static>,
    fields: FieldSet,
}

impl Admission {
    /// After the body: settles the call by its result (`count = …`: an uncounted outcome gives
    /// its units back) and adds the rate-limit fields to an `Ok` response as metadata
    /// (`ratelimit-policy`, `ratelimit`, or the legacy ones), as HTTP responses carry them.
    pub async fn finish<R: GrpcReply>(self, reply: R) -> R {
        self.finish_settled(reply, None).await
    }

    /// [`Admission::finish`] for a method with `settle = |result| …`: the limits with
    /// `settle` settled to `used`, what the closure read from the result.
    pub async fn finish_settled<R: GrpcReply>(
        self,
        mut reply: R,
        used: Option<crate::cost::Units>,
    ) -> R {
        self.admitted.settle_to(reply.outcome(), used).await;
        add_metadata(&mut reply, self.fields);
        reply
    }

    /// `settle = "later"`: runs the method's body with its
    /// [`Reservation`](crate::settle::Reservation) available to it; when the body did not take it, the
    /// call settles by its result as [`Admission::finish`] does (its estimate stays counted).
    pub async fn run_later<R: GrpcReply>(self, body: impl Future<Output = R>) -> R {
        let (mut reply, left) = crate::call::settle::with_reservation(self.admitted, body).await;
        if let Some(admitted) = left {
            admitted.settle(reply.outcome()).await;
        }
        add_metadata(&mut reply, self.fields);
        reply
    }
}

/// The rate-limit fields of an admitted call, added to an `Ok` reply as metadata.
fn add_metadata<R: GrpcReply>(reply: &mut R, fields: FieldSet) {
    if let Some(metadata) = reply.metadata_mut() {
        for (name, value) in fields.into_fields() {
            if let Ok(value) = MetadataValue::try_from(value.as_str()) {
                metadata.insert(MetadataKey::from_static(name), value);
            }
        }
    }
}

/// What a rate-limited gRPC method returns: `Result<Response<T>, E>`.
pub trait GrpcReply {
    /// The outcome `count = …` reads.
    fn outcome(&self) -> Outcome;
    /// The admitted response's metadata, when the method answered `Ok`.
    fn metadata_mut(&mut self) -> Option<&mut MetadataMap>;
}

impl<T, E> GrpcReply for Result<Response<T>, E> {
    fn outcome(&self) -> Outcome {
        Outcome::of(self)
    }

    fn metadata_mut(&mut self) -> Option<&mut MetadataMap> {
        self.as_mut().ok().map(Response::metadata_mut)
    }
}

/// The method's error from a refusal: `E::from(status)` (spanned by the macro at the return
/// type, so a missing `From<Status>` is reported there).
pub fn into_error<E: From<Status>>(status: Status) -> E {
    E::from(status)
}

/// A refusal as a `Status`: the code of the one table ([`Refusal::grpc_code`]), its message,
/// its fields as metadata (`retry-after`, `ratelimit-policy`, `ratelimit` …, exactly as the
/// HTTP integrations write them) and, for a spent quota, the `RetryInfo` detail.
pub(crate) fn status_of(refusal: &Refusal) -> Status {
    let code = Code::from(refusal.grpc_code());
    let metadata = metadata(&refusal.fields);
    match refusal.retry_after {
        Some(delay) => {
            let details = retry_info_status(code as i32, &refusal.message, delay);
            Status::with_details_and_metadata(code, &refusal.message, details.into(), metadata)
        }
        None => Status::with_metadata(code, &refusal.message, metadata),
    }
}

fn metadata(fields: &Fields) -> MetadataMap {
    let mut metadata = MetadataMap::with_capacity(fields.len());
    for (name, value) in fields {
        // Static lower-case names and ASCII values: never refused.
        if let Ok(value) = MetadataValue::try_from(value.as_str()) {
            metadata.insert(MetadataKey::from_static(name), value);
        }
    }
    metadata
}

/// `RESOURCE_EXHAUSTED` for [`RateLimitError::Limited`], with `retry-after` (whole seconds,
/// rounded up, at least 1, never past `x-ratelimit-reset`), the legacy `x-ratelimit-limit` / `-remaining` / `-reset` of the
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
                let mut refusal = Refusal::new(429, "too_many_requests", &error.to_string());
                refusal.fields = vec![
                    (
                        "retry-after",
                        retry_seconds(retry_after, reset_after).to_string(),
                    ),
                    ("x-ratelimit-limit", limit.to_string()),
                    ("x-ratelimit-remaining", remaining.to_string()),
                    ("x-ratelimit-reset", reset_seconds(reset_after).to_string()),
                ];
                refusal.retry_after = Some(retry_after);
                status_of(&refusal)
            }
            // The HTTP integrations' answers (401, 500, 400, 503), in gRPC's codes.
            error => status_of(&Refused::Rule(error).refusal(&HttpSettings::default())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::decision::{Decision, Verdict};
    use crate::limit::{By, keys_for};
    use crate::policy::Policy;

    /// What `by` reads from `request`, or the status a request lacking it gets.
    fn by_value<T>(
        request: &Request<T>,
        by: By,
        settings: &HttpSettings,
    ) -> Result<Option<Vec<u8>>, Status> {
        caller(request, None)
            .by_value(by, settings)
            .map(|v| v.map(|v| v.as_ref().to_vec()))
            .map_err(|missing| status_of(&missing.refusal()))
    }

    fn limit(by: By) -> Limit {
        Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 1, 1000, 1, 1).unwrap(),
            scope: "app::hello",
            by,
            shadow: false,
            failure_policy: None,
            lease: None,
            replica_ack: false,
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
        let v = |by| by_value(&r, by, &s).unwrap();
        assert_eq!(v(By::Global), None);
        assert_eq!(v(By::AppId), Some(b" a1 ".to_vec()));
        assert_eq!(v(By::Header("x-key")), Some(b"k".to_vec()));
        assert_eq!(v(By::User), Some(b"alice".to_vec()));
    }

    /// A method's path comes from tonic's `GrpcMethod` extension, else the URI the router
    /// kept; with neither, none (an empty path for a predicate, never `/`).
    #[test]
    fn a_method_s_path_is_read_from_the_request() {
        let mut r = request(&[]);
        assert_eq!(method_path(&r), None);
        assert_eq!(caller(&r, None).path_or_empty(), "");
        #[cfg(feature = "axum")]
        {
            let uri: http::Uri = "/greeter.Greeter/SayHelloWithKey?x=1".parse().unwrap();
            r.extensions_mut().insert(axum::extract::OriginalUri(uri));
            assert_eq!(
                method_path(&r).as_deref(),
                Some("/greeter.Greeter/SayHelloWithKey")
            );
        }
        r.extensions_mut()
            .insert(tonic::GrpcMethod::new("greeter.Greeter", "SayHello"));
        assert_eq!(
            method_path(&r).as_deref(),
            Some("/greeter.Greeter/SayHello")
        );
    }

    /// A plain limited error whose slot the store put a few microseconds past a 10 s window:
    /// `retry-after` says 10, never 11; `RetryInfo` carries the exact wait.
    #[test]
    fn a_limited_error_s_retry_after_never_passes_the_window() {
        use tonic_types::StatusExt as _;
        let us = std::time::Duration::from_micros;
        for (wait_us, reset_us, secs) in [
            (10_000_001, 10_000_003, "10"),
            (9_300_000, 10_000_000, "10"),
        ] {
            let status = Status::from(RateLimitError::Limited {
                retry_after: us(wait_us),
                limit: 3,
                remaining: 0,
                reset_after: us(reset_us),
            });
            assert_eq!(
                status.metadata().get("retry-after").unwrap(),
                secs,
                "{wait_us}"
            );
            let detail = status.get_details_retry_info().unwrap().retry_delay;
            assert_eq!(detail, Some(us(wait_us)));
        }
    }

    #[test]
    fn missing_sources_are_statuses_with_a_message() {
        let s = HttpSettings::default();
        let mut r = request(&[("appid", "  "), ("x-key", "")]);
        let err = |r: &Request<()>, by| by_value(r, by, &s).unwrap_err();
        let e = err(&r, By::Header("x-key"));
        assert_eq!(e.code(), Code::InvalidArgument);
        // gRPC carries metadata, not headers: the message names it so.
        assert_eq!(e.message(), "metadata x-key must not be empty");
        assert_eq!(
            err(&r, By::Header("x-other")).message(),
            "metadata x-other must not be empty"
        );
        assert_eq!(err(&r, By::AppId).code(), Code::InvalidArgument);
        assert_eq!(err(&r, By::User).code(), Code::Unauthenticated);
        r.extensions_mut().insert(UserId::new(""));
        assert_eq!(err(&r, By::User).code(), Code::Unauthenticated);
        // No transport, no peer address: a clear status, never "admit".
        let e = err(&r, By::Ip);
        assert_eq!(e.code(), Code::Internal);
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
        let status = status_of(&Refusal::too_many_requests(
            &limits,
            &v,
            &HttpSettings::default(),
        ));
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
            crate::error::StoreError::connection("refused"),
        ));
        assert_eq!(status.code(), Code::Unavailable);
    }
}
