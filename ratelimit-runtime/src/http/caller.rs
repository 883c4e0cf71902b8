//! The hidden extractor, the check and the response wrapper of HTTP-mode handlers.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use super::UserId;
use super::ip;
use super::response::{FieldSet, Fields, PolicyField, Refusal, rate_fields, static_rate_fields};
use super::settings::HttpSettings;
use super::source::{ByValue, Headers, RequestParts};
use crate::dynamic::{Dynamic, Input, Taken};
use crate::error::RateLimitError;
use crate::limit::{By, Limit, key_of, keys_for};
use crate::limiter::exempt::CallerView;
use crate::limiter::{RateLimiter, Settings};
use crate::observe::{self, Outcome as Count};

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

    fn has(&self, header: super::ForwardedHeader) -> bool {
        match self {
            Self::Http { headers, .. } => ip::ForwardingHeaders::has(headers, header),
            #[cfg(feature = "actix")]
            Self::Actix { headers, .. } => {
                use actix_web::http::header::{self as h, HeaderName};
                static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
                static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
                headers.contains_key(match header {
                    super::ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
                    super::ForwardedHeader::Forwarded => &h::FORWARDED,
                    super::ForwardedHeader::XRealIp => &X_REAL_IP,
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
    let mut kept = http::HeaderMap::new();
    for name in ip::forwarding_names() {
        for value in headers.get_all(name) {
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
    pub(crate) quota: Option<crate::Quota>,
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

static MISSING_CONNECT_INFO_LOGGED: AtomicBool = AtomicBool::new(false);

const MISSING_CONNECT_INFO: &str = "rate limiting by IP needs the client address, which this request does not carry: \
     serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, e.g. \
     `axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())`";

const MISSING_PEER_ADDR: &str = "rate limiting by IP needs the peer address of the connection, which this request does not carry \
     (a test request? set it with `TestRequest::peer_addr`)";

impl<const H: bool> HttpCaller<H> {
    fn path(&self) -> &str {
        self.head.path()
    }

    /// The value `by` identifies this caller with (`None` for `global`), or the response that
    /// replaces the handler's when the request lacks it.
    fn by_value(&self, by: By, settings: &HttpSettings) -> Result<Option<ByValue<'_>>, Refusal> {
        let parts = RequestParts {
            peer: self.peer,
            path: self.path(),
            headers: &self.head,
            user: self.user.as_ref(),
        };
        parts
            .by_value(by, settings)
            .map_err(|missing| missing.refusal(|| self.missing_peer()))
    }

    /// Whether the deny list or an exemption answers this request (see
    /// [`crate::Exemptions`]). The address is the one `by = "ip"` computes. A client unknown
    /// behind a trusted proxy ([`ip::ClientAddr::Unknown`]) is denied when any address its
    /// forwarding header names is denied, is never in an exempt network, and the predicate
    /// sees no address for it ([`CallerView::ip`] is `None`): the proxy's address is never
    /// taken for the client's.
    fn exemption(&self, settings: &Settings, limits: &[Limit]) -> Option<Exemption> {
        let exemptions = &settings.exemptions;
        let resolved = self
            .peer
            .map(|peer| ip::resolve(peer, &self.head, &settings.http));
        let ip = resolved.as_ref().and_then(|r| r.client.known());
        if let Some(resolved) = &resolved {
            match resolved.client {
                ip::ClientAddr::Known(ip) => {
                    if exemptions.is_denied_ip(ip) {
                        return Some(Exemption::Denied);
                    }
                    if exemptions.is_exempt_ip(ip) {
                        return Some(Exemption::Exempt);
                    }
                }
                ip::ClientAddr::Unknown { .. } => {
                    if resolved.named.iter().any(|&ip| exemptions.is_denied_ip(ip)) {
                        return Some(Exemption::Denied);
                    }
                }
            }
        }
        let predicate = exemptions.predicate.as_ref()?;
        let header = |name: &str| self.head.first(name);
        let view = CallerView {
            ip,
            user: self.user.as_ref(),
            path: self.path(),
            header: &header,
            scope: limits.first().map_or("", |l| l.scope),
        };
        predicate(&view).then_some(Exemption::Exempt)
    }

    /// The answer of the deny list (`Err`: 403) or of an exemption (`Ok`: the handler runs
    /// unlimited) to this request, counted in the metrics; `None` when it is limited as usual.
    /// Every HTTP check path asks it before any store call.
    fn exempted(&self, settings: &Settings, limits: &[Limit]) -> Option<Result<(), Refusal>> {
        if settings.exemptions.is_empty() {
            return None;
        }
        // A deny list cannot be applied without the client's address: refused with the
        // reason (as `by = "ip"` is), never served as if the list were empty.
        if self.peer.is_none() && !settings.exemptions.deny_networks().is_empty() {
            return Some(Err(self.missing_peer()));
        }
        match self.exemption(settings, limits)? {
            Exemption::Denied => {
                observe::count_all(labels(limits), Count::Denied);
                Some(Err(Refusal::forbidden()))
            }
            Exemption::Exempt => {
                observe::count_all(labels(limits), Count::Exempted);
                Some(Ok(()))
            }
        }
    }

    fn missing_peer(&self) -> Refusal {
        let message = match self.framework {
            Framework::Axum => MISSING_CONNECT_INFO,
            Framework::Actix => MISSING_PEER_ADDR,
        };
        if !MISSING_CONNECT_INFO_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::error!(target: crate::observe::log::CALLER, "{message}");
        }
        Refusal::new(500, "internal_error", message)
    }

    /// The store keys of `limits` for this caller (one limit, the usual case, without a list).
    fn keys(
        &self,
        settings: &Settings,
        limits: &[Limit],
        templates: &[Option<&str>],
    ) -> Result<Keys, Refusal> {
        if let [limit] = limits {
            let by = self.by_value(limit.by, &settings.http)?;
            let template = templates.first().copied().flatten();
            let by = by.as_ref().map(AsRef::as_ref);
            return Ok(Keys::One([key_of(&settings.prefix, limit, template, by)]));
        }
        keys_for(&settings.prefix, limits, templates, |by| {
            self.by_value(by, &settings.http)
        })
        .map(Keys::Many)
    }
}

/// The keys of one request's limits.
enum Keys {
    One([String; 1]),
    Many(Vec<String>),
}

impl std::ops::Deref for Keys {
    type Target = [String];

    fn deref(&self) -> &[String] {
        match self {
            Self::One(key) => key,
            Self::Many(keys) => keys,
        }
    }
}

/// What the deny list or an exemption makes of a request.
enum Exemption {
    Denied,
    Exempt,
}

/// The metric labels of `limits`.
fn labels(limits: &[Limit]) -> impl Iterator<Item = (&'static str, crate::Algorithm)> + '_ {
    limits.iter().map(|l| (l.scope, l.policy.algorithm()))
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

/// Checks every limit of a handler for one request (one store round trip), then runs the
/// handler and adds the rate-limit fields to its response, or answers 429 (quota spent), 503
/// (store down under the deny failure policy) or 400/401/500 (the request lacks what a limit
/// is `by`) without running it.
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
    // A scope's quota overridden at run time: the limits are worked out per call (by the
    // same limiter, handed back).
    if limiter.has_overrides() {
        caller.limiter = Some(limiter);
        return check_http_dyn(limits, None, caller, templates, &[], handler).await;
    }
    let settings = limiter.settings();
    match caller.exempted(settings, limits) {
        Some(Err(refusal)) => return Limited(Outcome::Refused(refusal)),
        Some(Ok(())) => {
            drop(caller);
            return Limited(Outcome::Admitted(handler().await, FieldSet::Empty));
        }
        None => {}
    }
    let keys = match caller.keys(settings, limits, templates) {
        Ok(keys) => keys,
        Err(refusal) => return Limited(Outcome::Refused(refusal)),
    };
    drop(caller);
    let verdict = limiter.decide(limits, &keys).await;
    match verdict {
        // A function with a limit in shadow mode sends no rate-limit headers: its responses
        // are the handler's own, as if no limit were there.
        Ok(v) if v.is_admitted() && limiter.any_shadow(limits) => {
            Limited(Outcome::Admitted(handler().await, FieldSet::Empty))
        }
        Ok(v) if v.is_admitted() => {
            let fields = static_rate_fields(limits, policy, &v, settings.http.header_style);
            Limited(Outcome::Admitted(handler().await, fields))
        }
        Ok(v) => Limited(Outcome::Refused(Refusal::too_many_requests(
            limits,
            &v,
            &settings.http,
        ))),
        Err(_) => Limited(Outcome::Refused(Refusal::store_unavailable())),
    }
}

/// The response of a call a run-time rule refused before checking it.
fn refusal_of(error: &RateLimitError) -> Refusal {
    match error {
        RateLimitError::MissingQuota => Refusal::new(
            401,
            "unauthorized",
            "quota info empty: the request carries no quota for its caller (Quota)",
        ),
        RateLimitError::CostExceedsCapacity { .. } => {
            Refusal::new(400, "cost_exceeds_capacity", &error.to_string())
        }
        RateLimitError::NegativeCost { .. } => {
            Refusal::new(400, "negative_cost", &error.to_string())
        }
        RateLimitError::StoreUnavailable(_) => Refusal::store_unavailable(),
        _ => {
            tracing::error!(target: crate::observe::log::LIMITER, %error, "a rate limit could not be applied");
            Refusal::new(500, "internal_error", &error.to_string())
        }
    }
}

/// Checks (or takes) a handler's limits worked out for this caller: what to settle after the
/// handler, and the rate-limit fields; or the response that replaces the
/// handler's.
pub(crate) async fn admit<const H: bool>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    mut caller: HttpCaller<H>,
    templates: &[Option<&str>],
    inputs: &[Input],
) -> Result<(Taken, Fields), Refusal> {
    let limiter = caller.limiter.take().unwrap_or_else(RateLimiter::current);
    let settings = limiter.settings();
    // The deny list and the exemptions apply to these limits as to static ones.
    match caller.exempted(settings, limits) {
        Some(Err(refusal)) => return Err(refusal),
        Some(Ok(())) => return Ok((Taken::nothing(), Vec::new())),
        None => {}
    }
    let plan = crate::dynamic::plan(
        &limiter,
        limits,
        dynamics,
        inputs,
        caller.quota,
        templates,
        |by| {
            caller
                .by_value(by, &settings.http)
                .map(|v| v.map(ByValue::into_cow))
        },
        |e| refusal_of(&e),
    )?;
    drop(caller);
    let Ok((verdict, taken)) = plan.run(&limiter).await else {
        return Err(Refusal::store_unavailable());
    };
    if !verdict.is_admitted() {
        return Err(Refusal::too_many_requests(
            taken.limits(),
            &verdict,
            &settings.http,
        ));
    }
    // A function with a limit in shadow mode sends no rate-limit headers (as `check_http`).
    let fields = if taken.limits().is_empty() || limiter.any_shadow(limits) {
        Vec::new()
    } else {
        rate_fields(taken.limits(), &verdict, settings.http.header_style)
    };
    Ok((taken, fields))
}

/// The body of the frameworks' `check_http_counted`: takes the limits, runs the handler, turns
/// its output into the framework's response and its status (`respond`), and gives the units
/// back when that status does not count.
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
pub(crate) async fn check_counted<Fut, R>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    caller: HttpCaller,
    templates: &[Option<&str>],
    inputs: &[Input],
    handler: impl FnOnce() -> Fut,
    respond: impl FnOnce(Fut::Output) -> (R, u16),
) -> Limited<R>
where
    Fut: Future,
{
    match admit(limits, dynamics, caller, templates, inputs).await {
        Ok((taken, fields)) => {
            let (response, status) = respond(handler().await);
            taken.settle(crate::dynamic::Outcome::Status(status)).await;
            Limited(Outcome::Admitted(response, FieldSet::List(fields)))
        }
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

/// [`check_http`] for handlers with a dynamic limit (`quota`, `cost = <expression>`) or
/// whose limiter overrides a scope's quota. `inputs[i]` is what the call gives limit `i`.
pub async fn check_http_dyn<F, Fut, const H: bool>(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    caller: HttpCaller<H>,
    templates: &[Option<&str>],
    inputs: &[Input],
    handler: F,
) -> Limited<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    match admit(limits, dynamics, caller, templates, inputs).await {
        Ok((_, fields)) => Limited(Outcome::Admitted(handler().await, FieldSet::List(fields))),
        Err(refusal) => Limited(Outcome::Refused(refusal)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, Policy};

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
        let v = |by| c.by_value(by, &s).unwrap().map(|v| v.as_ref().to_vec());
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
        let status = |c: &HttpCaller, by| c.by_value(by, &s).unwrap_err();
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
            let key = caller(&[("x-k", v)]).keys(&s, &limits, &[None]).unwrap();
            assert!(key[0].len() < 100, "{}", key[0]);
            assert_eq!(key[0].matches('{').count(), 1);
            assert!(seen.insert(key[0].clone()));
        }
    }
}
