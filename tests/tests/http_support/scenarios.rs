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

use reqwest::header::HeaderValue;

use super::{Answer, client, client_from, param, statuses};

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

/// The server's limiter trusts 127.0.0.1: from it, the right-most untrusted hop is the key.
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
    // RFC 7239 Forwarded, quoted with a port.
    let fwd = |f: &str| proxy.get(format!("{base}/ip")).header("forwarded", f);
    assert_eq!(
        statuses(3, || fwd("for=\"198.51.100.7:4711\";proto=https")).await,
        [200, 200, 429]
    );
    // X-Real-IP.
    let real = |f: &str| proxy.get(format!("{base}/ip")).header("x-real-ip", f);
    assert_eq!(statuses(1, || real("198.51.100.7")).await, [429]);
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
