//! `wait` on a gRPC method: refused at `wait` (the method answers RESOURCE_EXHAUSTED with a
//! `RetryInfo` detail).
use ratelimit_runtime::rate_limit;
use tonic::{Request, Response, Status};

#[tonic::async_trait]
pub trait Greeter: Send + Sync + 'static {
    async fn say_hello(&self, request: Request<String>) -> Result<Response<String>, Status>;
}

pub struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    #[rate_limit(num = 5, time = 1, by = "ip", wait = "5s")]
    async fn say_hello(&self, request: Request<String>) -> Result<Response<String>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

fn main() {}
