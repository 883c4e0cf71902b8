use ratelimit_runtime::rate_limit;

#[rate_limit(num = 5, time = 60)]
async fn f() -> Option<u32> {
    Some(1)
}

fn main() {}
