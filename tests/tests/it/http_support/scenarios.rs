//! The end-to-end HTTP scenarios, the same for every framework and store. Each takes the base
//! URL of a fresh server (fresh limiter) serving the routes below:
//!
//! | route | limit |
//! | --- | --- |
//! | `POST /login` (JSON `{"user":…}`) | the card's line: sliding, 3 per 10 s, by ip |
//! | `GET /stats` | none: how many times the login handler ran |
//! | `GET /url/<anything>` | fixed 2/60 s by url |
//! | `GET /me` (auth layer: header `x-user` → `UserId`) | fixed 2/60 s by user |
//! | `GET /api` | fixed 2/60 s by app_id |
//! | `GET /keyed` | fixed 2/60 s by header:x-api-key |
//! | `GET /ip` | fixed 2/60 s by ip |

use std::time::Duration;

use ratelimit_runtime::{FailurePolicy, RateLimiter, http::ForwardedHeader};
use reqwest::header::HeaderValue;

use super::{Answer, Backend, client, client_from, param, statuses};

async fn get(c: &reqwest::Client, url: String) -> Answer {
    Answer::from(c.get(url).send().await.expect("send")).await
}

/// The card's line: requests 1–3 from one IP get 200 with the `RateLimit` fields, the 4th a 429
/// (and the handler does not run), another IP still 200.
pub async fn card_line(base: &str) {
    let c = client();
    let login = |c: &reqwest::Client| {
        c.post(format!("{base}/login"))
            .json(&serde_json::json!({"user": "alice"}))
            .send()
    };
    for expected_left in [2, 1, 0] {
        let a = Answer::from(login(&c).await.expect("send")).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.json()["welcome"], "alice");
        let policy = a.header("ratelimit-policy").expect("RateLimit-Policy");
        assert_eq!(policy, "\"login\";q=3;w=10");
        assert_eq!(a.remaining(), expected_left, "{a:?}");
        let t = param(a.header("ratelimit").expect("RateLimit"), "t");
        assert!((1..=10).contains(&t), "{a:?}");
    }
    let fourth = Answer::from(login(&c).await.expect("send")).await;
    fourth.assert_too_many();
    let retry: u64 = fourth.header("retry-after").unwrap().parse().unwrap();
    assert!(retry <= 10, "{fourth:?}");
    let runs = get(&c, format!("{base}/stats")).await.body;
    assert_eq!(runs, "3", "the handler must not run when rejected");
    let other = Answer::from(login(&client_from("127.0.0.2")).await.expect("send")).await;
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(other.remaining(), 2);
}

/// Every source keeps a separate quota per value; missing identities are 401/400.
pub async fn sources(base: &str) {
    let c = client();

    // url: the path without the query.
    let url = |p: &str| c.get(format!("{base}/url/{p}"));
    assert_eq!(statuses(3, || url("a")).await, [200, 200, 429]);
    assert_eq!(statuses(1, || url("a?page=2")).await, [429]);
    assert_eq!(statuses(2, || url("b")).await, [200, 200]);

    // user: the UserId the auth layer put in the extensions.
    let me = |u: &str| c.get(format!("{base}/me")).header("x-user", u);
    assert_eq!(statuses(3, || me("alice")).await, [200, 200, 429]);
    assert_eq!(statuses(1, || me("bob")).await, [200]);
    let anonymous = get(&c, format!("{base}/me")).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(anonymous.json()["error"], "unauthorized");
    assert!(
        anonymous.json()["message"]
            .as_str()
            .unwrap()
            .contains("user")
    );

    // app_id: header appId, any case; blank or missing is a 400.
    let api = |name: &str, v: &str| c.get(format!("{base}/api")).header(name, v);
    assert_eq!(statuses(2, || api("appId", "app-1")).await, [200, 200]);
    assert_eq!(statuses(1, || api("APPID", "app-1")).await, [429]);
    assert_eq!(statuses(1, || api("appid", "app-2")).await, [200]);
    for blank in [
        api("appId", ""),
        api("appId", "   "),
        c.get(format!("{base}/api")),
    ] {
        let a = Answer::from(blank.send().await.expect("send")).await;
        assert_eq!(a.status, 400, "{a:?}");
        assert_eq!(a.json()["message"], "appId must not be empty");
    }

    // header:<name>
    let keyed = |v: &str| c.get(format!("{base}/keyed")).header("x-api-key", v);
    assert_eq!(statuses(3, || keyed("k1")).await, [200, 200, 429]);
    assert_eq!(statuses(1, || keyed("k2")).await, [200]);
    let missing = get(&c, format!("{base}/keyed")).await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert!(
        missing.json()["message"]
            .as_str()
            .unwrap()
            .contains("x-api-key")
    );

    // ip: the peer address.
    let ip = |c: &reqwest::Client| c.get(format!("{base}/ip"));
    assert_eq!(statuses(3, || ip(&c)).await, [200, 200, 429]);
    let c3 = client_from("127.0.0.3");
    assert_eq!(statuses(3, || ip(&c3)).await, [200, 200, 429]);
}

/// Without trusted proxies, a client sending a different random `X-Forwarded-For` (and
/// `Forwarded`, `X-Real-IP`) on each request is still limited after `num`.
pub async fn spoofing_changes_nothing(base: &str) {
    let c = client();
    let mut n: u32 = 0x5eed_1234;
    let got = statuses(4, || {
        // xorshift: a different address each time.
        n ^= n << 13;
        n ^= n >> 17;
        n ^= n << 5;
        let fake = std::net::Ipv4Addr::from(n).to_string();
        c.get(format!("{base}/ip"))
            .header("x-forwarded-for", &fake)
            .header("forwarded", format!("for={fake}"))
            .header("x-real-ip", &fake)
    })
    .await;
    assert_eq!(got, [200, 200, 429, 429]);
}

/// The server's limiter trusts 127.0.0.1 (default header, `X-Forwarded-For`): from it, the
/// right-most untrusted hop is the key. The other headers: [`only_the_configured_header_counts`].
pub async fn trusted_proxy_right_most_untrusted_hop(base: &str) {
    let proxy = client();
    let via = |xff: &str| {
        proxy
            .get(format!("{base}/ip"))
            .header("x-forwarded-for", xff)
    };
    // The client 203.0.113.5, whatever it claims on the left.
    assert_eq!(statuses(1, || via("6.6.6.6, 203.0.113.5")).await, [200]);
    assert_eq!(statuses(1, || via("7.7.7.7, 203.0.113.5")).await, [200]);
    assert_eq!(statuses(1, || via("203.0.113.5")).await, [429]);
    // Trusted hops on the right are skipped.
    assert_eq!(statuses(1, || via("203.0.113.5, 127.0.0.1")).await, [429]);
    // Another client.
    assert_eq!(statuses(2, || via("203.0.113.6")).await, [200, 200]);
    // From an untrusted peer the headers are ignored: 127.0.0.2 is its own client.
    let direct = client_from("127.0.0.2");
    let spoof = || {
        direct
            .get(format!("{base}/ip"))
            .header("x-forwarded-for", "203.0.113.5")
    };
    assert_eq!(statuses(3, spoof).await, [200, 200, 429]);
}

/// IPv6 clients (named by a trusted proxy) are grouped by /64.
pub async fn ipv6_grouped_by_64(base: &str) {
    let proxy = client();
    let via = |xff: &str| {
        proxy
            .get(format!("{base}/ip"))
            .header("x-forwarded-for", xff)
    };
    assert_eq!(statuses(1, || via("2001:db8:1:2::1")).await, [200]);
    assert_eq!(
        statuses(1, || via("[2001:db8:1:2:ffff::9]:443")).await,
        [200]
    );
    assert_eq!(statuses(1, || via("2001:db8:1:2::2")).await, [429]);
    assert_eq!(statuses(2, || via("2001:db8:1:3::1")).await, [200, 200]);
    // IPv4-mapped IPv6 is IPv4.
    assert_eq!(statuses(1, || via("::ffff:192.0.2.1")).await, [200]);
    assert_eq!(statuses(2, || via("192.0.2.1")).await, [200, 429]);
}

/// Header values of 10 KB, with braces and colons, or not UTF-8: no panic, and each value has
/// its own quota.
pub async fn unusual_header_values(base: &str) {
    let c = client();
    let big_a = "a".repeat(10 * 1024);
    let big_b = format!("{}b", "a".repeat(10 * 1024 - 1));
    let values: Vec<HeaderValue> = vec![
        HeaderValue::from_str(&big_a).unwrap(),
        HeaderValue::from_str(&big_b).unwrap(),
        HeaderValue::from_static("{}:"),
        HeaderValue::from_static("}{:"),
        HeaderValue::from_static("a:b}"),
        HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        HeaderValue::from_bytes(b"\xff\xfd").unwrap(),
        HeaderValue::from_bytes(b"caf\xe9").unwrap(),
    ];
    for v in &values {
        let got = statuses(3, || {
            c.get(format!("{base}/keyed"))
                .header("x-api-key", v.clone())
        })
        .await;
        assert_eq!(got, [200, 200, 429], "value {v:?}");
    }
}

/// 40 concurrent requests from one client against `num = 2`: exactly 2 are admitted.
pub async fn concurrent_requests_are_exact(base: &str) {
    let c = client();
    let requests = (0..40).map(|_| {
        let c = c.clone();
        let url = format!("{base}/ip");
        async move { c.get(url).send().await.expect("send").status().as_u16() }
    });
    let mut handles = Vec::new();
    for r in requests {
        handles.push(tokio::spawn(r));
    }
    let mut ok = 0;
    let mut limited = 0;
    for h in handles {
        match h.await.expect("join") {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, limited), (2, 38));
}

/// A limiter on `backend` behind a proxy on 127.0.0.1 that sets `header` (`None`: the default,
/// not configured at all).
pub async fn limiter_behind_proxy(
    backend: &Backend,
    header: Option<ForwardedHeader>,
) -> RateLimiter {
    let mut builder = RateLimiter::builder()
        .trusted_proxies(["127.0.0.1"])
        .timeout(Duration::from_secs(5))
        .failure_policy(FailurePolicy::Deny);
    if let Some(header) = header {
        builder = builder.forwarded_header(header);
    }
    let builder = match backend {
        Backend::Memory => builder.memory(),
        Backend::Redis(server) => builder.redis_url(server.url()),
    };
    builder.build().await.expect("limiter")
}

const ALL_HEADERS: [ForwardedHeader; 3] = [
    ForwardedHeader::XForwardedFor,
    ForwardedHeader::Forwarded,
    ForwardedHeader::XRealIp,
];

/// How a proxy that sets `header` names `client` (with a spoofed hop on the left where the
/// header is a list).
fn proxied(header: ForwardedHeader, client: &str) -> String {
    match header {
        ForwardedHeader::XForwardedFor => format!("6.6.6.6, {client}"),
        ForwardedHeader::Forwarded => format!("for=6.6.6.6, for=\"{client}:4711\";proto=https"),
        _ => client.to_owned(),
    }
}

/// How a client writes `ip` into `header` itself.
fn spoofed(header: ForwardedHeader, ip: &str) -> String {
    match header {
        ForwardedHeader::Forwarded => format!("for={ip}"),
        _ => ip.to_owned(),
    }
}

/// A different IPv4 address on every call (xorshift).
struct Fakes(u32);

impl Fakes {
    fn next(&mut self) -> String {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        std::net::Ipv4Addr::from(self.0).to_string()
    }
}

/// The server trusts the proxy 127.0.0.1, which sets `configured`; `GET /ip` allows 2 per
/// client. A client sends its own, fresh value in each of the two other forwarding headers on
/// every request (the proxy passes them through): it still gets the bucket the configured
/// header names, and that bucket runs out. Without the configured header the others are no
/// fallback: the proxy's own address is the key.
async fn only_the_configured_header_counts(base: &str, configured: ForwardedHeader) {
    let proxy = client();
    let ip = || proxy.get(format!("{base}/ip"));
    let others: Vec<ForwardedHeader> = ALL_HEADERS
        .into_iter()
        .filter(|h| *h != configured)
        .collect();
    let mut fakes = Fakes(0x5eed_1234);
    let got = statuses(4, || {
        let mut req = ip().header(configured.name(), proxied(configured, "203.0.113.5"));
        for other in &others {
            req = req.header(other.name(), spoofed(*other, &fakes.next()));
        }
        req
    })
    .await;
    assert_eq!(
        got,
        [200, 200, 429, 429],
        "{configured:?}: spoofed headers gave fresh buckets"
    );
    // The same bucket as without them.
    let plain = statuses(1, || {
        ip().header(configured.name(), proxied(configured, "203.0.113.5"))
    })
    .await;
    assert_eq!(plain, [429], "{configured:?}");
    // Another client named by the configured header has its own quota, even when the other
    // headers name the spent one.
    let other_client = statuses(2, || {
        let mut req = ip().header(configured.name(), proxied(configured, "203.0.113.6"));
        for other in &others {
            req = req.header(other.name(), spoofed(*other, "203.0.113.5"));
        }
        req
    })
    .await;
    assert_eq!(other_client, [200, 200], "{configured:?}");
    // Without the configured header: the proxy's own bucket, fresh values or not.
    let unproxied = statuses(3, || {
        let mut req = ip();
        for other in &others {
            req = req.header(other.name(), spoofed(*other, &fakes.next()));
        }
        req
    })
    .await;
    assert_eq!(
        unproxied,
        [200, 200, 429],
        "{configured:?}: a fallback header was read"
    );
}

/// Behind an `X-Forwarded-For` proxy (the default, not configured): a client's own
/// `Forwarded: for=<random>` (and `X-Real-IP: <random>`) on each request changes nothing. On
/// `main` `Forwarded` won and every request got a fresh bucket.
pub async fn a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing(base: &str) {
    only_the_configured_header_counts(base, ForwardedHeader::XForwardedFor).await;
}

/// Behind a proxy that sets `Forwarded`: a client's own `X-Forwarded-For` (and `X-Real-IP`)
/// changes nothing.
pub async fn a_spoofed_x_forwarded_for_behind_a_forwarded_proxy_changes_nothing(base: &str) {
    only_the_configured_header_counts(base, ForwardedHeader::Forwarded).await;
}

/// Behind a proxy that sets `X-Real-IP`: a client's own `Forwarded` (and `X-Forwarded-For`)
/// changes nothing.
pub async fn a_spoofed_forwarded_header_behind_an_x_real_ip_proxy_changes_nothing(base: &str) {
    only_the_configured_header_counts(base, ForwardedHeader::XRealIp).await;
}
