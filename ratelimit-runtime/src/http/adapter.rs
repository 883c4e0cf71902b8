//! The hidden extractor, the check and the response wrapper of HTTP-mode handlers.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;

use crate::call::plan::{self, Dynamic, Input};
use crate::call::{self, Admitted, Call};
use crate::caller::answer::{FieldSet, PolicyField, Refusal};
use crate::caller::settings::ForwardedHeader;
use crate::caller::{Caller, Headers, Transport, UserId, ip};
use crate::limit::Limit;
use crate::limiter::RateLimiter;

/// The path and headers of a request, as its framework holds them: cloning them is cheap
/// (reference-counted bytes), converting them would not be.
pub(crate) enum Head {
    /// `http` 1 types (Axum).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Http {
        path: Option<http::uri::PathAndQuery>,
        headers: http::HeaderMap,
    },
    /// Actix-web's own types (`http` 0.2 inside).
    #[cfg(feature = "actix")]
    Actix {
        uri: actix_web::http::Uri,
        headers: actix_web::http::header::HeaderMap,
    },
}

impl Head {
    fn path(&self) -> &str {
        match self {
            Self::Http { path, .. } => path.as_ref().map_or("/", http::uri::PathAndQuery::path),
            #[cfg(feature = "actix")]
            Self::Actix { uri, .. } => uri.path(),
        }
    }

    fn first(&self, name: &str) -> Option<&[u8]> {
        match self {
            Self::Http { headers, .. } => headers.get(name).map(http::HeaderValue::as_bytes),
            #[cfg(feature = "actix")]
            Self::Actix { headers, .. } => headers
                .get(name)
                .map(actix_web::http::header::HeaderValue::as_bytes),
        }
    }
}

impl Headers for Head {
    fn first(&self, name: &str) -> Option<&[u8]> {
        Head::first(self, name)
    }
}

impl ip::ForwardingHeaders for Head {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        match self {
            Self::Http { headers, .. } => ip::ForwardingHeaders::values(headers, name),
            #[cfg(feature = "actix")]
            Self::Actix { headers, .. } => headers
                .get_all(name)
                .map(actix_web::http::header::HeaderValue::as_bytes)
                .collect(),
        }
    }

    fn has(&self, header: ForwardedHeader) -> bool {
        match self {
            Self::Http { headers, .. } => ip::ForwardingHeaders::has(headers, header),
            #[cfg(feature = "actix")]
            Self::Actix { headers, .. } => {
                use actix_web::http::header::{self as h, HeaderName};
                static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
                static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
                headers.contains_key(match header {
                    ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
                    ForwardedHeader::Forwarded => &h::FORWARDED,
                    ForwardedHeader::XRealIp => &X_REAL_IP,
                })
            }
        }
    }
}

/// The headers a caller of limits without a header source keeps: only the forwarding ones
/// (every line of each, in order), or all of them when `limiter` has an exemption predicate.
/// Also resolves the limiter the check will use (`RateLimiter::current()` when the request
/// names none), so that it is looked up once.
#[cfg(feature = "axum")]
pub(crate) fn forwarding_only(
    headers: &http::HeaderMap,
    limiter: &mut Option<RateLimiter>,
) -> http::HeaderMap {
    let limiter = limiter.get_or_insert_with(RateLimiter::current);
    if limiter.settings().exemptions.predicate.is_some() {
        return headers.clone();
    }
    // One pass over the request's few headers, comparing names, costs less than three
    // lookups, each hashing a name. Each name's lines keep their order.
    let names = ip::forwarding_names();
    let mut kept = http::HeaderMap::new();
    for (name, value) in headers {
        if names.contains(&name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// Which framework a request came through (for the message of a missing peer address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framework {
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Axum,
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    Actix,
}

/// What a limited handler needs from its request, captured by the hidden extractor that
/// `#[rate_limit]` puts in front of the handler's parameters: the peer address, the path, the
/// headers, the [`UserId`] and the limiter found in the request, if any.
///
/// An Axum `FromRequestParts` (feature `axum`) and an Actix-web `FromRequest` (feature
/// `actix`); it never rejects a request by itself — [`check_http`] decides.
///
/// `HEADERS` is whether a limit reads a header (`by = "header:…"` or `"app_id"`). Without one,
/// the extractor keeps only the forwarding headers (which `by = "ip"` and the deny and exempt
/// lists read), unless the limiter has an exemption predicate (which may read any header):
/// the request's header map is not copied for every request.
pub struct HttpCaller<const HEADERS: bool = true> {
    pub(crate) peer: Option<IpAddr>,
    pub(crate) head: Head,
    pub(crate) user: Option<UserId>,
    pub(crate) limiter: Option<RateLimiter>,
    pub(crate) framework: Framework,
    /// The caller's [`crate::Quota`] from the request extensions (for `quota = "request"`).
    pub(crate) quota: Option<crate::quota::Quota>,
}

impl<const H: bool> fmt::Debug for HttpCaller<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Headers may hold credentials: not printed.
        f.debug_struct("HttpCaller")
            .field("peer", &self.peer)
            .field("path", &self.path())
            .field("user", &self.user)
            .field("framework", &self.framework)
            .finish_non_exhaustive()
    }
}

impl<const H: bool> HttpCaller<H> {
    fn path(&self) -> &str {
        self.head.path()
    }

    /// What this request offers the limiter.
    fn view(&self) -> Caller<'_> {
        Caller {
            peer: self.peer,
            path: Some(self.path()),
            headers: &self.head,
            user: self.user.as_ref(),
            quota: self.quota,
            transport: match self.framework {
                Framework::Axum => Transport::Axum,
                Framework::Actix => Transport::Actix,
            },
        }
    }
}

/// What a limited handler returns: the handler's own response with the rate-limit fields
/// added, or the response that replaced it (429, 503, or 400/401/500 when the request lacks
/// what a limit is `by`).
///
/// An Axum `IntoResponse` when `T` is one (feature `axum`) and an Actix-web `Responder` when
/// `T` is one (feature `actix`).
pub struct Limited<T>(pub(crate) Outcome<T>);

pub(crate) enum Outcome<T> {
    Admitted(T, FieldSet),
    Refused(Refusal),
}

impl<T> Limited<T> {
    /// The status of the response that replaced the handler's, or `None` when the handler ran.
    pub fn refused_status(&self) -> Option<u16> {
        match &self.0 {
            Outcome::Admitted(..) => None,
            Outcome::Refused(r) => Some(r.status),
        }
    }

    /// The handler's output, when it ran.
    pub fn into_inner(self) -> Option<T> {
        match self.0 {
            Outcome::Admitted(t, _) => Some(t),
            Outcome::Refused(_) => None,
        }
    }
}

impl<T> fmt::Debug for Limited<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Outcome::Admitted(_, fields) => f
                .debug_struct("Limited::Admitted")
                .field("fields", fields)
                .finish_non_exhaustive(),
            Outcome::Refused(r) => f.debug_tuple("Limited::Refused").field(r).finish(),
        }
    }
}

/// Steps 1–4 of the pipeline ([`crate::call`]) for one request: the caller read and let go,
/// then the decision.
async fn admit<'l, const H: bool>(
    limiter: &RateLimiter,
    call: Call<'l, '_>,
    caller: HttpCaller<H>,
) -> Result<Admitted<'l>, Refusal> {
    let settings = limiter.settings();
    let prepared = call::prepare(limiter, call, &caller.view());
    drop(caller);
    match prepared {
        Ok(prepared) => prepared.run(limiter).await,
        Err(refused) => Err(refused),
    }
    .map_err(|refused| refused.refusal(&settings.http))
}

/// Checks every limit of a handler for one request (one store round trip), then runs the
/// handler and adds the rate-limit fields to its response, or answers 429 (quota spent), 503
/// (store down under the deny failure policy), 403 (denied network) or 400/401/500 (the
/// request lacks what a limit is `by`) without running it.
///
/// `templates[i]` is the rendered `key` template of `limits[i]`, if it has one; `policy` is the
/// function's own `static` (its `RateLimit-Policy` value, formatted on first use).
pub async fn check_http<F, Fut, const H: bool>(
    limits: &'static [Limit],
    policy: &'static PolicyField,
    mut caller: HttpCaller<H>,
    templates: &[Option<&str>],
    handler: F,
) -> Limited<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    if limits.is_empty() {
        return Limited(Outcome::Admitted(handler().await, FieldSet::Empty));
    }
    let limiter = caller.limiter.take().unwrap_or_else(RateLimiter::current);
    match admit(&limiter, Call::fixed(limits, templates), caller).await {
        Ok(admitted) => {
            let fields = admitted.fields(limiter.settings().http.header_style, Some(policy));
            Limited(Outcome::Admitted(handler().await, fields))
        }
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

/// The body of the frameworks' `check_http_counted`: takes the limits, runs the handler, turns
/// its output into the framework's response and its status (`respond`), and gives the units
/// back when that status does not count.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) async fn check_counted<Fut, R>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    mut caller: HttpCaller,
    templates: &[Option<&str>],
    inputs: &[Input],
    handler: impl FnOnce() -> Fut,
    respond: impl FnOnce(Fut::Output) -> (R, u16),
) -> Limited<R>
where
    Fut: Future,
{
    let limiter = caller.limiter.take().unwrap_or_else(RateLimiter::current);
    let call = Call {
        limits,
        dynamics,
        inputs,
        templates,
    };
    match admit(&limiter, call, caller).await {
        Ok(admitted) => {
            let fields = admitted.fields(limiter.settings().http.header_style, None);
            let (response, status) = respond(handler().await);
            admitted.settle(plan::Outcome::Status(status)).await;
            Limited(Outcome::Admitted(response, fields))
        }
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

/// [`check_http`] for handlers with a dynamic limit (`quota`, `cost = <expression>`).
/// `inputs[i]` is what the call gives limit `i`.
pub async fn check_http_dyn<F, Fut, const H: bool>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    mut caller: HttpCaller<H>,
    templates: &[Option<&str>],
    inputs: &[Input],
    handler: F,
) -> Limited<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let limiter = caller.limiter.take().unwrap_or_else(RateLimiter::current);
    let call = Call {
        limits,
        dynamics,
        inputs,
        templates,
    };
    match admit(&limiter, call, caller).await {
        Ok(admitted) => {
            let fields = admitted.fields(limiter.settings().http.header_style, None);
            let output = handler().await;
            // Every outcome counts here (`count` goes through `check_counted`): this releases
            // a concurrency limit's slot, now rather than when `admitted` drops.
            admitted.settle(plan::Outcome::Ok).await;
            Limited(Outcome::Admitted(output, fields))
        }
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

/// [`check_http_dyn`] for handlers with `settle = …`: the handler's future yields its output
/// and the units it used (read by the macro's `settle = |output| …`), or with `later`
/// (`settle = "later"`) its output alone matters and the handler's
/// [`Reservation`](crate::settle::Reservation) settles.
#[allow(clippy::too_many_arguments)] // the call's parts, as `check_http_dyn` takes them
pub async fn check_http_settle<F, Fut, T, const H: bool>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    mut caller: HttpCaller<H>,
    templates: &[Option<&str>],
    inputs: &[Input],
    later: bool,
    handler: F,
) -> Limited<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = (T, Option<crate::cost::Units>)>,
{
    let limiter = caller.limiter.take().unwrap_or_else(RateLimiter::current);
    let call = Call {
        limits,
        dynamics,
        inputs,
        templates,
    };
    match admit(&limiter, call, caller).await {
        Ok(admitted) => {
            let fields = admitted.fields(limiter.settings().http.header_style, None);
            let admitted = admitted.detach();
            let output = if later {
                let ((output, _), left) = call::settle::with_reservation(admitted, handler()).await;
                if let Some(admitted) = left {
                    admitted.settle(plan::Outcome::Ok).await;
                }
                output
            } else {
                let (output, used) = handler().await;
                admitted.settle_to(plan::Outcome::Ok, used).await;
                output
            };
            Limited(Outcome::Admitted(output, fields))
        }
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::caller::settings::HttpSettings;
    use crate::limit::By;
    use crate::limiter::Settings;
    use crate::policy::Policy;

    fn caller(headers: &[(&str, &[u8])]) -> HttpCaller {
        let mut map = http::HeaderMap::new();
        for (n, v) in headers {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        HttpCaller {
            peer: Some("192.0.2.1".parse().unwrap()),
            head: Head::Http {
                path: Some(http::uri::PathAndQuery::from_static("/a/b?q=1")),
                headers: map,
            },
            user: None,
            limiter: None,
            framework: Framework::Axum,
            quota: None,
        }
    }

    fn limit(by: By) -> Limit {
        Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 1, 1000, 1, 1).unwrap(),
            scope: "s",
            by,
            shadow: false,
            failure_policy: None,
            lease: None,
            replica_ack: false,
        }
    }

    #[cfg(feature = "axum")]
    #[test]
    fn without_header_sources_only_forwarding_headers_are_kept() {
        let mut map = http::HeaderMap::new();
        for (name, value) in [
            ("x-forwarded-for", "203.0.113.1"),
            ("authorization", "secret"),
            ("x-forwarded-for", "10.0.0.1"),
            ("forwarded", "for=192.0.2.1"),
            ("x-real-ip", "198.51.100.1"),
            ("appid", "a"),
        ] {
            map.append(name, value.parse().unwrap());
        }
        let plain = RateLimiter::builder().build_lazy().unwrap();
        let kept = forwarding_only(&map, &mut Some(plain));
        let lines: Vec<(&str, &str)> = kept
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            lines,
            [
                ("x-forwarded-for", "203.0.113.1"),
                ("x-forwarded-for", "10.0.0.1"),
                ("forwarded", "for=192.0.2.1"),
                ("x-real-ip", "198.51.100.1"),
            ]
        );
        // An exemption predicate may read any header: all are kept.
        let predicate = RateLimiter::builder()
            .exempt_when(|_| false)
            .build_lazy()
            .unwrap();
        assert_eq!(forwarding_only(&map, &mut Some(predicate)), map);
        // No limiter in the request: the current one is resolved once, here.
        let mut none = None;
        let _ = forwarding_only(&map, &mut none);
        assert!(none.is_some());
    }

    #[test]
    fn sources_read_the_request() {
        let s = HttpSettings::default();
        let c = caller(&[("appId", b" a1 "), ("x-key", b"k")]);
        let view = c.view();
        let v = |by| view.by_value(by, &s).unwrap().map(|v| v.as_ref().to_vec());
        assert_eq!(v(By::Global), None);
        assert_eq!(v(By::Ip), Some(b"192.0.2.1".to_vec()));
        assert_eq!(v(By::Url), Some(b"/a/b".to_vec()));
        assert_eq!(v(By::AppId), Some(b" a1 ".to_vec()));
        assert_eq!(v(By::Header("x-key")), Some(b"k".to_vec()));
    }

    #[test]
    fn missing_sources_are_client_errors_with_a_message() {
        let s = HttpSettings::default();
        let mut c = caller(&[("appid", b"  "), ("x-key", b"")]);
        let status = |c: &HttpCaller, by| c.view().by_value(by, &s).unwrap_err().refusal();
        assert_eq!(status(&c, By::User).status, 401);
        let r = status(&c, By::AppId);
        assert_eq!(r.status, 400);
        assert!(r.body.contains("appId must not be empty"), "{}", r.body);
        let r = status(&c, By::Header("x-key"));
        assert!(
            r.body.contains("header x-key must not be empty"),
            "{}",
            r.body
        );
        let r = status(&c, By::Header("x-other"));
        assert!(r.body.contains("x-other"), "{}", r.body);
        c.user = Some(UserId::new(""));
        assert_eq!(status(&c, By::User).status, 401);
        c.peer = None;
        let r = status(&c, By::Ip);
        assert_eq!(r.status, 500);
        assert!(r.body.contains("into_make_service_with_connect_info"));
    }

    #[test]
    fn header_values_of_any_content_give_bounded_distinct_keys() {
        let s = Settings::default();
        let limits = [limit(By::Header("x-k"))];
        let values: Vec<Vec<u8>> = vec![
            vec![b'a'; 10 * 1024],
            vec![b'a'; 10 * 1024 - 1],
            b"{".to_vec(),
            b"}".to_vec(),
            b"a:b".to_vec(),
            b"a}:{b".to_vec(),
            b"\xff\xfe".to_vec(),
            b"\xff\xfd".to_vec(),
            b"plain".to_vec(),
        ];
        let mut seen = std::collections::HashSet::new();
        for v in &values {
            let c = caller(&[("x-k", v)]);
            let view = c.view();
            let by = |by| view.by_value(by, &s.http);
            let key = crate::limit::keys_for(&s.prefix, &limits, &[None], by).unwrap();
            assert!(key[0].len() < 100, "{}", key[0]);
            assert_eq!(key[0].matches('{').count(), 1);
            assert!(seen.insert(key[0].clone()));
        }
    }
}
