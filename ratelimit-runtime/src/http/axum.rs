//! Axum 0.8: `HttpCaller` is a `FromRequestParts`, `Limited<T>` an `IntoResponse`.

use std::future::Future;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::adapter::{Framework, Head, HttpCaller, Limited, Outcome};
use crate::caller::UserId;
use crate::caller::answer::{FieldSet, Fields, Refusal};
use crate::limiter::{Current, RateLimiter};

impl<S: Send + Sync, const H: bool> FromRequestParts<S> for HttpCaller<H> {
    /// Never used: the extractor does not fail; `check_http` answers for missing parts.
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut limiter = parts
            .extensions
            .get::<RateLimiter>()
            .cloned()
            .map(Current::Held);
        let headers = if H {
            parts.headers.clone()
        } else {
            super::adapter::forwarding_only(&parts.headers, &mut limiter)
        };
        Ok(Self {
            peer: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip()),
            head: Head::Http {
                // The path the client sent: under `Router::nest`, `parts.uri` lacks the prefix.
                path: original_uri(parts).path_and_query().cloned(),
                headers,
            },
            user: parts.extensions.get::<UserId>().cloned(),
            limiter,
            quota: parts.extensions.get::<crate::quota::Quota>().copied(),
            framework: Framework::Axum,
        })
    }
}

/// The URI the client sent: Axum's router records it (`OriginalUri`) before `Router::nest`
/// strips the prefix from `parts.uri`; `parts.uri` when no router did (a bare service).
pub(crate) fn original_uri(parts: &Parts) -> &axum::http::Uri {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |axum::extract::OriginalUri(uri)| uri)
}

fn add_fields(headers: &mut HeaderMap, fields: Fields) {
    for (name, value) in fields {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Adds an admitted response's fields: the usual pair without a list, the policy's value as
/// it was formatted for the function (a static value: no copy, no allocation).
fn add_field_set(headers: &mut HeaderMap, fields: FieldSet) {
    match fields {
        FieldSet::Empty => {}
        FieldSet::Ietf { policy, state } => {
            headers.insert(RATELIMIT_POLICY, HeaderValue::from_static(policy));
            if let Ok(state) = HeaderValue::try_from(state) {
                headers.insert(RATELIMIT, state);
            }
        }
        FieldSet::List(fields) => add_fields(headers, fields),
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body,
        )
            .into_response();
        add_fields(response.headers_mut(), self.fields);
        response
    }
}

impl<T: IntoResponse> IntoResponse for Limited<T> {
    fn into_response(self) -> Response {
        match self.0 {
            Outcome::Admitted(inner, fields) => {
                let mut response = inner.into_response();
                add_field_set(response.headers_mut(), fields);
                response
            }
            Outcome::Refused(refusal) => refusal.into_response(),
        }
    }
}

/// A handler can take the [`UserId`] its auth layer set; without one, the same 401 as
/// `by = "user"`.
impl<S: Send + Sync> FromRequestParts<S> for UserId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<UserId>() {
            Some(user) if !user.as_str().is_empty() => Ok(user.clone()),
            _ => Err(Refusal::no_user().into_response()),
        }
    }
}

/// `count = …` on an Axum handler: the limits are taken before the handler runs and, when
/// the response's status does not count, given back after it (see `#[rate_limit]`'s docs).
/// The handler's output becomes its response here, to read the status.
pub async fn check_http_counted<F, Fut>(
    limits: &'static [crate::limit::Limit],
    dynamics: Option<&'static [crate::call::plan::Dynamic]>,
    caller: HttpCaller,
    templates: &[Option<&str>],
    inputs: &[crate::call::plan::Input],
    handler: F,
) -> Limited<Response>
where
    F: FnOnce() -> Fut,
    Fut: Future,
    Fut::Output: IntoResponse,
{
    super::adapter::check_counted(
        limits,
        dynamics,
        caller,
        templates,
        inputs,
        handler,
        |output| {
            let response = output.into_response();
            let status = response.status().as_u16();
            (response, status)
        },
    )
    .await
}
