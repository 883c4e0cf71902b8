//! The script texts the Redis stores send, byte for byte.
//!
//! Assembled here the way `store/redis.rs` (the driver scripts) and `store/cluster.rs` (the
//! companion script) assemble them: the same files, concatenated in the same order. The test
//! `script_texts_are_the_ones_the_store_loads` checks the driver scripts against what a
//! `RedisStore` loads into a real server (`SCRIPT EXISTS` of their SHA1s). When the runtime
//! exposes its own texts, [`sources`] is the one place to switch to them.

use ratelimit_runtime::Algorithm;

macro_rules! script {
    ($name:literal) => {
        include_str!(concat!("../../../ratelimit-runtime/src/scripts/", $name))
    };
}

const PRELUDE: &str = script!("prelude.lua");
const FIXED: &str = script!("fixed.lua");
const SLIDING: &str = script!("sliding.lua");
const LEAKY: &str = script!("leaky.lua");
const TOKEN: &str = script!("token.lua");
const DRIVER: &str = script!("driver.lua");
const REFUND: &str = script!("refund.lua");

/// Every script a store sends.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// The driver for calls whose limits all use one algorithm, by `Algorithm::code() - 1`.
    pub single: [String; 4],
    /// The driver for calls that stack different algorithms.
    pub combined: String,
    /// The Redis Cluster store's companion script (peek and refund).
    pub compensate: String,
}

impl Sources {
    /// The driver a call with these algorithms is sent (as `Scripts::for_checks` picks it).
    pub(crate) fn driver(&self, algorithms: &[Algorithm]) -> &str {
        match algorithms.first() {
            Some(first) if algorithms.iter().all(|a| a == first) => &self.single[code(*first) - 1],
            _ => &self.combined,
        }
    }
}

/// The wire code the scripts know an algorithm by (`Algorithm::code`, crate-private): its
/// place in `Algorithm::ALL`, from 1.
pub(crate) fn code(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|&a| a == algorithm)
        .map_or(0, |i| i + 1)
}

fn source(algorithm: Algorithm) -> &'static str {
    [FIXED, SLIDING, LEAKY, TOKEN][code(algorithm) - 1]
}

/// The texts, as the stores build them.
pub(crate) fn sources() -> Sources {
    Sources {
        single: Algorithm::ALL.map(|a| [PRELUDE, source(a), DRIVER].concat()),
        combined: [PRELUDE, FIXED, SLIDING, LEAKY, TOKEN, DRIVER].concat(),
        compensate: [PRELUDE, FIXED, SLIDING, LEAKY, TOKEN, REFUND].concat(),
    }
}
