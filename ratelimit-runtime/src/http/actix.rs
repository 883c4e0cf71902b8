//! Actix-web 4: `HttpCaller` is a `FromRequest`, `Limited<T>` a `Responder`.

use std::future::{Ready, ready};

use actix_web::body::EitherBody;
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, Responder, web};

use super::adapter::{Framework, Head, HttpCaller, Limited, Outcome};
use crate::caller::UserId;
use crate::caller::answer::{FieldSet, Fields, Refusal};
use crate::limiter::{Current, RateLimiter};

impl<const H: bool> FromRequest for HttpCaller<H> {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let mut limiter = req
            .app_data::<RateLimiter>()
            .cloned()
            .or_else(|| {
                req.app_data::<web::Data<RateLimiter>>()
                    .map(|data| RateLimiter::clone(data))
            })
            .map(Current::Held);
        let headers = if H {
            req.headers().clone()
        } else {
            forwarding_only(req.headers(), &mut limiter)
        };
        ready(Ok(Self {
            peer: req.peer_addr().map(|addr| addr.ip()),
            head: Head::Actix {
                uri: req.uri().clone(),
                headers,
            },
            user: req.extensions().get::<UserId>().cloned(),
            limiter,
            quota: req.extensions().get::<crate::quota::Quota>().copied(),
            framework: Framework::Actix,
        }))
    }
}

/// `caller::forwarding_only` for Actix-web's header map: the forwarding headers only, or all
/// of them when the limiter has an exemption predicate.
fn forwarding_only(headers: &HeaderMap, limiter: &mut Option<Current>) -> HeaderMap {
    static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
    let limiter = limiter.get_or_insert_with(RateLimiter::current_for_call);
    if limiter.settings().exemptions.predicate.is_some() {
        return headers.clone();
    }
    // One pass over the request's few headers, as the Axum extractor does; each name's lines
    // keep their order.
    let names = [&X_FORWARDED_FOR, &header::FORWARDED, &X_REAL_IP];
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        if names.contains(&name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

fn refusal_response(refusal: Refusal) -> HttpResponse {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, "application/json"));
    let mut response = response.body(refusal.body);
    add_fields(&mut response, refusal.fields);
    response
}

fn add_fields<B>(response: &mut HttpResponse<B>, fields: Fields) {
    for (name, value) in fields {
        if let Ok(value) = HeaderValue::try_from(value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Adds an admitted response's fields: the usual pair without a list, the policy's value as
/// it was formatted for the function (a static value: no copy, no allocation).
fn add_field_set<B>(response: &mut HttpResponse<B>, fields: FieldSet) {
    match fields {
        FieldSet::Empty => {}
        FieldSet::Ietf { policy, state } => {
            let headers = response.headers_mut();
            headers.insert(RATELIMIT_POLICY, HeaderValue::from_static(policy));
            if let Ok(state) = HeaderValue::try_from(state) {
                headers.insert(RATELIMIT, state);
            }
        }
        FieldSet::List(fields) => add_fields(response, fields),
    }
}

impl<T: Responder> Responder for Limited<T> {
    type Body = EitherBody<T::Body>;

    fn respond_to(self, req: &HttpRequest) -> HttpResponse<Self::Body> {
        match self.0 {
            Outcome::Admitted(inner, fields) => {
                let mut response = inner.respond_to(req);
                add_field_set(&mut response, fields);
                response.map_into_left_body()
            }
            Outcome::Refused(refusal) => refusal_response(refusal).map_into_right_body(),
        }
    }
}

/// A handler can take the [`UserId`] its auth layer set; without one, the same 401 as
/// `by = "user"`.
impl FromRequest for UserId {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(match req.extensions().get::<UserId>() {
            Some(user) if !user.as_str().is_empty() => Ok(user.clone()),
            _ => Err(actix_web::error::InternalError::from_response(
                "no authenticated user",
                refusal_response(Refusal::no_user()),
            )
            .into()),
        })
    }
}

/// The hidden extractor of `count = …` Actix-web handlers: the [`HttpCaller`] and the
/// request, which turning the handler's output into a response (to read its status) needs.
pub struct CountingCaller {
    caller: HttpCaller,
    request: HttpRequest,
}

impl std::fmt::Debug for CountingCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingCaller")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl FromRequest for CountingCaller {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        ready(
            HttpCaller::from_request(req, payload)
                .into_inner()
                .map(|caller| Self {
                    caller,
                    request: req.clone(),
                }),
        )
    }
}

/// `count = …` on an Actix-web handler: the limits are taken before the handler runs and,
/// when the response's status does not count, given back after it (see `#[rate_limit]`'s
/// docs). The handler's output becomes its response here, to read the status.
pub async fn check_http_counted<F, Fut>(
    limits: &'static [crate::limit::Limit],
    dynamics: Option<&'static [crate::call::plan::Dynamic]>,
    caller: CountingCaller,
    templates: &[Option<&str>],
    inputs: &[crate::call::plan::Input],
    handler: F,
) -> Limited<HttpResponse>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future,
    Fut::Output: Responder,
{
    let CountingCaller { caller, request } = caller;
    super::adapter::check_counted(
        limits,
        dynamics,
        caller,
        templates,
        inputs,
        handler,
        |output| {
            let response = output.respond_to(&request).map_into_boxed_body();
            let status = response.status().as_u16();
            (response, status)
        },
    )
    .await
}
