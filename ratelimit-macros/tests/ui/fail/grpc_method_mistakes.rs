//! The mistakes on a tonic service method: no `Request<T>` to read the caller from,
//! `by = "url"` (a tonic request has no path), an unnamed request, and an error type that
//! `Status` does not convert into, and the forms of limits that follow the caller, which gRPC
//! methods do not take yet.
use ratelimit_runtime::rate_limit;
use tonic::{Request, Response, Status};

#[tonic::async_trait]
pub trait Greeter: Send + Sync + 'static {
    async fn no_request(&self, name: String) -> Result<Response<String>, Status>;
    async fn by_url(&self, request: Request<String>) -> Result<Response<String>, Status>;
    async fn unnamed(&self, _: Request<String>) -> Result<Response<String>, Status>;
    async fn wrong_error(&self, request: Request<String>) -> Result<Response<String>, String>;
    async fn by_status(&self, request: Request<Vec<u8>>) -> Result<Response<String>, Status>;
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

    // A gRPC method counts its results, not status classes.
    #[rate_limit(num = 5, time = 60, by = "ip", count = "5xx")]
    async fn by_status(&self, request: Request<Vec<u8>>) -> Result<Response<String>, Status> {
        Ok(Response::new(format!("{}", request.get_ref().len())))
    }
}

fn main() {}
