use ratelimit_runtime::rate_limit;

#[rate_limit(num = 5, time = 60)]
async fn f(phone: &str) {
    let _ = phone;
}

fn main() {}
