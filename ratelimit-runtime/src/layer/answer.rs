//! What the layer answers: a refusal in HTTP or gRPC form, and the rate-limit fields it adds to
//! an admitted response.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::caller::answer::{Fields, Refusal, join_members};
use crate::limit::Limit;

use super::LayerBody;
use super::grpc;

/// The response that replaces the inner service's: the attribute's (status, JSON body,
/// fields), or for a gRPC request (`grpc`: its content type) a trailers-only answer with the
/// same fields, the code of the one table ([`Refusal::grpc_code`]) and the refusal's message.
pub(super) fn answer<B>(refusal: Refusal, grpc: Option<&HeaderValue>) -> Response<LayerBody<B>> {
    let mut response;
    if let Some(content_type) = grpc {
        response = Response::new(LayerBody::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, content_type.clone());
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from(refusal.grpc_code()),
        );
        if let Ok(value) = HeaderValue::try_from(grpc::message(&refusal.message)) {
            headers.insert(HeaderName::from_static("grpc-message"), value);
        }
    } else {
        response = Response::new(LayerBody::full(Bytes::from(refusal.body)));
        *response.status_mut() =
            StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let headers = response.headers_mut();
    for (name, value) in refusal.fields {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

pub(super) const LEGACY_REMAINING: &str = "x-ratelimit-remaining";

/// Adds the layer's fields to an admitted response: the IETF lists join the response's own
/// (a route's `#[rate_limit]`) into one field each, its members first, named by the one rule
/// of [`join_members`]; the legacy single values are the layer's unless the response already
/// describes a limit with no more remaining.
pub(super) fn add_admitted_fields(headers: &mut HeaderMap, fields: Fields, limits: &[Limit]) {
    let ours = fields
        .iter()
        .find(|(name, _)| *name == LEGACY_REMAINING)
        .and_then(|(_, v)| v.parse::<u64>().ok());
    let theirs = headers
        .get(LEGACY_REMAINING)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let keep_theirs = matches!((ours, theirs), (Some(o), Some(t)) if t <= o);
    for (name, value) in fields {
        let Ok(value) = HeaderValue::try_from(value) else {
            continue;
        };
        let name = HeaderName::from_static(name);
        if name.as_str().starts_with("x-ratelimit-") {
            if !keep_theirs {
                headers.insert(name, value);
            }
            continue;
        }
        let theirs: Vec<&str> = headers
            .get_all(&name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if theirs.is_empty() {
            headers.insert(name, value);
            continue;
        }
        let joined = join_members(&theirs.join(", "), value.to_str().unwrap_or(""), limits);
        if let Ok(joined) = HeaderValue::try_from(joined) {
            headers.insert(name, joined);
        } else {
            headers.append(name, value);
        }
    }
}
