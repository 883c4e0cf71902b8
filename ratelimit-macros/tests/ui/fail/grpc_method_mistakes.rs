//! The mistakes on a tonic service method: no `Request<T>` to read the caller from,
//! `by = "url"` (a tonic request has no path), an unnamed request, and an error type that
//! `Status` does not convert into.
use ratelimit_runtime::rate_limit;
use tonic::{Request, Response, Status};

#[tonic::async_trait]
pub trait Greeter: Send + Sync + 'static {
    async fn no_request(&self, name: String) -> Result<Response<String>, Status>;
    async fn by_url(&self, request: Request<String>) -> Result<Response<String>, Status>;
    async fn unnamed(&self, _: Request<String>) -> Result<Response<String>, Status>;
    async fn wrong_error(&self, request: Request<String>) -> Result<Response<String>, String>;
}

pub struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    #[rate_limit(num = 5, time = 60, by = "ip")]
    async fn no_request(&self, name: String) -> Result<Response<String>, Status> {
        Ok(Response::new(name))
    }

    #[rate_limit(num = 5, time = 60, by = "url")]
    async fn by_url(&self, request: Request<String>) -> Result<Response<String>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    #[rate_limit(num = 5, time = 60, by = "header:x-api-key")]
    async fn unnamed(&self, _: Request<String>) -> Result<Response<String>, Status> {
        Ok(Response::new(String::new()))
    }

    #[rate_limit(num = 5, time = 60, by = "ip")]
    async fn wrong_error(&self, request: Request<String>) -> Result<Response<String>, String> {
        Ok(Response::new(request.into_inner()))
    }
}

fn main() {}
