use ratelimit_runtime::rate_limit;

#[derive(Debug)]
pub struct MyError;

#[rate_limit(num = 5, time = 60)]
async fn f() -> Result<(), MyError> {
    Ok(())
}

fn main() {}
