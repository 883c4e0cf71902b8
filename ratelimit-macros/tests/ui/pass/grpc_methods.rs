//! Methods of a tonic service (`#[tonic::async_trait]`, `Request<T>` in, `Result<Response<T>,
//! Status>` out) limited by the request (`by = "ip"`, `"header:…"`, `"app_id"`, `"user"`):
//! a named, `mut` or `_`-prefixed request, a streaming request (whose `Streaming` is not
//! `Sync`: the check's future must still be `Send`), stacked limits with a key template, an
//! error type that converts from `Status`, a plain-mode limit through `Status:
//! From<RateLimitError>`, and a trait's default method.
#![deny(warnings)]

use ratelimit_runtime::{UserId, rate_limit};
use tonic::{Code, Request, Response, Status, Streaming};

#[derive(Debug)]
pub struct AppError(Status);

impl From<Status> for AppError {
    fn from(s: Status) -> Self {
        AppError(s)
    }
}

#[tonic::async_trait]
pub trait Greeter: Send + Sync + 'static {
    async fn by_ip(&self, request: Request<String>) -> Result<Response<String>, Status>;
    async fn by_key(&self, request: Request<String>) -> Result<Response<String>, Status>;
    async fn by_user(&self, request: Request<String>) -> Result<Response<String>, AppError>;
    async fn stream(&self, request: Request<Streaming<String>>) -> Result<Response<u32>, Status>;
    async fn plain(&self, name: String) -> Result<Response<String>, Status>;

    #[rate_limit(num = 1, time = 60, by = "app_id")]
    async fn by_app(&self, _request: Request<()>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
}

pub struct MyGreeter {
    tenant: String,
}

#[tonic::async_trait]
impl Greeter for MyGreeter {
    #[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
    async fn by_ip(&self, request: Request<String>) -> Result<Response<String>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    #[rate_limit(num = 1, time = 60, by = "header:x-api-key")]
    #[rate_limit(algo = "token", num = 5, time = 1, by = "header:x-api-key", key = "{self.tenant}")]
    async fn by_key(&self, mut request: Request<String>) -> Result<Response<String>, Status> {
        request.get_mut().push('!');
        Ok(Response::new(request.into_inner()))
    }

    #[rate_limit(num = 1, time = 60, by = "user")]
    async fn by_user(&self, request: Request<String>) -> Result<Response<String>, AppError> {
        Ok(Response::new(request.into_inner()))
    }

    #[rate_limit(num = 10, time = 1, by = "ip")]
    async fn stream(
        &self,
        _request: Request<Streaming<String>>,
    ) -> Result<Response<u32>, Status> {
        Ok(Response::new(0))
    }

    #[rate_limit(num = 1, time = 60, key = "{name}")]
    async fn plain(&self, name: String) -> Result<Response<String>, Status> {
        Ok(Response::new(name))
    }
}

fn with(metadata: &[(&'static str, &'static str)]) -> Request<String> {
    let mut r = Request::new("hi".to_owned());
    for (k, v) in metadata {
        r.metadata_mut().insert(*k, v.parse().unwrap());
    }
    r
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let g = MyGreeter {
        tenant: "acme".to_owned(),
    };
    let key = &[("x-api-key", "k1")];
    assert_eq!(g.by_key(with(key)).await.unwrap().into_inner(), "hi!");
    let refused = g.by_key(with(key)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.metadata().get("retry-after").is_some());
    assert!(refused.metadata().get("ratelimit-policy").is_some());
    // Another key is another bucket; no key is a clear refusal naming the header.
    assert!(g.by_key(with(&[("x-api-key", "k2")])).await.is_ok());
    let missing = g.by_key(with(&[])).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("x-api-key"), "{missing:?}");

    // No transport, so no peer address: a clear status, not an admission.
    let no_peer = g.by_ip(with(&[])).await.unwrap_err();
    assert_eq!(no_peer.code(), Code::Internal);

    let mut alice = with(&[]);
    alice.extensions_mut().insert(UserId::new("alice"));
    assert!(g.by_user(alice).await.is_ok());
    let AppError(anonymous) = g.by_user(with(&[])).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);

    let mut app = Request::new(());
    app.metadata_mut().insert("appid", "a1".parse().unwrap());
    assert!(g.by_app(app).await.is_ok());
    assert_eq!(
        g.by_app(Request::new(())).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    assert!(g.plain("bob".to_owned()).await.is_ok());
    let limited = g.plain("bob".to_owned()).await.unwrap_err();
    assert_eq!(limited.code(), Code::ResourceExhausted);
    assert!(limited.metadata().get("retry-after").is_some());
}
