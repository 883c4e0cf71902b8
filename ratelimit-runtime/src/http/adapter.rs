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
use crate::limiter::{Current, RateLimiter};

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
    limiter: &mut Option<Current>,
) -> http::HeaderMap {
    let limiter = limiter.get_or_insert_with(RateLimiter::current_for_call);
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
    pub(crate) limiter: Option<Current>,
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

/// Steps 1–4 of the pipeline ([`crate::call`]) for one request: the caller read and let go
/// here (steps 1–3, at once), then the decision, in the future returned. That future holds
/// the call's keys, not the request: a handler's future is moved into a box by its framework,
/// so what it holds is copied once a request.
fn admit<'a, 'l, const H: bool>(
    limiter: &'a RateLimiter,
    call: Call<'l, '_>,
    caller: HttpCaller<H>,
) -> impl Future<Output = Result<Admitted<'l>, Refusal>> + use<'a, 'l, H> {
    let prepared = call::prepare(limiter, call, &caller.view());
    drop(caller);
    decide(limiter, prepared)
}

/// Step 4 of [`admit`]: the decision on a prepared call, a refusal as the transports render it.
async fn decide<'l>(
    limiter: &RateLimiter,
    prepared: Result<call::Prepared<'l>, call::Refused>,
) -> Result<Admitted<'l>, Refusal> {
    match prepared {
        Ok(prepared) => prepared.run_soon(limiter).await,
        Err(refused) => Err(refused),
    }
    .map_err(|refused| refused.refusal(&limiter.settings().http))
}

/// Checks every limit of a handler for one request (one store round trip), then runs the
/// handler and adds the rate-limit fields to its response, or answers 429 (quota spent), 503
/// (store down under the deny failure policy), 403 (denied network) or 400/401/500 (the
/// request lacks what a limit is `by`) without running it.
///
/// `templates[i]` is the rendered `key` template of `limits[i]`, if it has one; `policy` is the
/// function's own `static` (its `RateLimit-Policy` value, formatted on first use).
pub fn check_http<F, Fut, const H: bool>(
    limits: &'static [Limit],
    policy: &'static PolicyField,
    mut caller: HttpCaller<H>,
    templates: &[Option<&str>],
    handler: F,
) -> impl Future<Output = Limited<Fut::Output>> + use<F, Fut, H>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    // The request is read and the call decided here, when the handler calls this, as far as
    // that waits for nothing ([`call::Prepared::run_now`]): the future returned holds the
    // response's fields, not the request, nor the size of every future the decision may wait
    // for. (A framework boxes a handler's future and moves it: its every byte is allocated
    // and copied on every request.)
    let decided = if limits.is_empty() {
        Decided::Admitted(FieldSet::Empty)
    } else {
        let limiter = caller
            .limiter
            .take()
            .unwrap_or_else(RateLimiter::current_for_call);
        let settings = limiter.settings();
        match call::prepare(&limiter, Call::fixed(limits, templates), &caller.view()) {
            Err(refused) => Decided::Refused(refused.refusal(&settings.http)),
            Ok(prepared) => match prepared.run_now(&limiter) {
                // Nothing to settle after the handler (`run_now`): the fields are all it
                // leaves.
                Ok(Ok(admitted)) => {
                    Decided::Admitted(admitted.fields(settings.http.header_style, Some(policy)))
                }
                Ok(Err(refused)) => Decided::Refused(refused.refusal(&settings.http)),
                Err(prepared) => Decided::Later(limiter, prepared),
            },
        }
    };
    drop(caller);
    async move {
        match decided {
            Decided::Admitted(fields) => Limited(Outcome::Admitted(handler().await, fields)),
            Decided::Refused(refusal) => Limited(Outcome::Refused(refusal)),
            // Boxed: see above.
            Decided::Later(limiter, prepared) => {
                Box::pin(decide_then_handle(limiter, prepared, policy, handler)).await
            }
        }
    }
}

/// What [`check_http`] knows of a call before its handler runs.
enum Decided {
    /// Admitted, with these fields.
    Admitted(FieldSet),
    /// Refused, with this answer.
    Refused(Refusal),
    /// To be decided by waiting: a store over the network (with its leases), shadow mode, or
    /// a planned call (run-time overrides, a concurrency limit), which settles after the
    /// handler.
    Later(Current, call::Prepared<'static>),
}

/// The rest of [`check_http`] for a call decided by waiting: the decision, then the handler
/// with the call admitted (what it settles is settled after the handler).
async fn decide_then_handle<F, Fut>(
    limiter: Current,
    prepared: call::Prepared<'static>,
    policy: &'static PolicyField,
    handler: F,
) -> Limited<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    // `run`, not `run_soon`: `check_http` found that the decision waits.
    let decided = prepared.run(&limiter).await;
    match decided.map_err(|refused| refused.refusal(&limiter.settings().http)) {
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
    let limiter = caller
        .limiter
        .take()
        .unwrap_or_else(RateLimiter::current_for_call);
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
    let limiter = caller
        .limiter
        .take()
        .unwrap_or_else(RateLimiter::current_for_call);
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
    let limiter = caller
        .limiter
        .take()
        .unwrap_or_else(RateLimiter::current_for_call);
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

    static ONE_A_SECOND: std::sync::LazyLock<[Limit; 1]> =
        std::sync::LazyLock::new(|| [limit(By::Ip)]);

    /// [`ONE_A_SECOND`] in shadow mode.
    static SHADOW_LIMIT: std::sync::LazyLock<[Limit; 1]> = std::sync::LazyLock::new(|| {
        [Limit {
            shadow: true,
            ..limit(By::Ip)
        }]
    });

    /// A framework boxes a handler's future and moves it on every request, so its every byte
    /// is allocated and copied each time. A call the memory store decides at once leaves only
    /// its fields in `check_http`'s future, and a decision that waits is boxed; the decision
    /// the other transports await (`run_soon`) boxes what waits the same way. The bounds
    /// (several times what rustc 1.95 makes of them: 176 and 576 bytes) fail when `run`, whose
    /// future holds every store call's state, is awaited in either future.
    #[test]
    fn a_limited_handler_s_future_stays_small() {
        static POLICY: PolicyField = PolicyField::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let limiter = RateLimiter::builder().memory().build_lazy().unwrap();
        let templates = [None];
        let decision = admit(
            &limiter,
            Call::fixed(&*ONE_A_SECOND, &templates),
            caller(&[]),
        );
        let size = std::mem::size_of_val(&decision);
        drop(decision);
        assert!(size <= 800, "the decision's future is {size} bytes");
        let mut with_limiter = caller(&[]);
        with_limiter.limiter = Some(Current::Held(limiter));
        let handler = check_http(
            &*ONE_A_SECOND,
            &POLICY,
            with_limiter,
            &templates,
            || async {},
        );
        let size = std::mem::size_of_val(&handler);
        assert!(size <= 320, "check_http's future is {size} bytes");
    }

    /// What `check_http` decides before its future runs: a call the store answers at once
    /// (static limits, no shadow mode), as `run` decides it; never a call that would wait,
    /// which is given back untouched for `run`.
    #[test]
    fn only_a_call_that_waits_for_nothing_is_decided_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let templates = [None];
        let prepare_for = |limits: &'static [Limit], limiter: &RateLimiter| {
            call::prepare(
                limiter,
                Call::fixed(limits, &templates),
                &caller(&[]).view(),
            )
            .unwrap()
        };
        let prepare = |limiter: &RateLimiter| prepare_for(&*ONE_A_SECOND, limiter);
        // What a call's answer shows: admitted or not, and a refusal's remaining units.
        let seen = |answer: &Result<Admitted<'_>, call::Refused>| match answer {
            Ok(_) => (true, Vec::new()),
            Err(call::Refused::Limited { verdict, .. }) => (
                false,
                verdict.decisions().iter().map(|d| d.remaining).collect(),
            ),
            Err(other) => panic!("refused for another reason: {other:?}"),
        };

        // Three calls of one a second, decided at once and by `run` on two memory stores.
        let at_once = RateLimiter::builder().memory().build_lazy().unwrap();
        let awaited = RateLimiter::builder().memory().build_lazy().unwrap();
        for _ in 0..3 {
            let now = prepare(&at_once)
                .run_now(&at_once)
                .expect("decided at once");
            let run = rt.block_on(prepare(&awaited).run(&awaited));
            assert_eq!(seen(&now), seen(&run));
        }
        let second = prepare(&at_once)
            .run_now(&at_once)
            .expect("decided at once");
        assert!(
            matches!(second, Err(call::Refused::Limited { .. })),
            "one a second: {second:?}"
        );

        // Shadow mode may check a call twice (its enforced limits again): that waits, for
        // the limiter's shadow mode and a limit's own alike.
        let shadow = RateLimiter::builder()
            .memory()
            .shadow(true)
            .build_lazy()
            .unwrap();
        assert!(prepare(&shadow).run_now(&shadow).is_err());
        let admitted = rt.block_on(prepare(&shadow).run(&shadow)).unwrap();
        assert!(
            rt.block_on(prepare(&shadow).run(&shadow)).is_ok(),
            "{admitted:?}"
        );
        assert!(
            prepare_for(&*SHADOW_LIMIT, &at_once)
                .run_now(&at_once)
                .is_err()
        );

        // A store over the network is not asked here: the call is given back untouched.
        let remote = RateLimiter::builder()
            .redis_url("redis://127.0.0.1:1")
            .build_lazy()
            .unwrap();
        let given_back = prepare(&remote).run_now(&remote).expect_err("not decided");
        assert!(matches!(given_back, call::Prepared::Fixed { .. }));
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
        let kept = forwarding_only(&map, &mut Some(Current::Held(plain)));
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
        assert_eq!(
            forwarding_only(&map, &mut Some(Current::Held(predicate))),
            map
        );
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
