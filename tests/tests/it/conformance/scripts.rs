//! The script texts (and the Functions library) the Redis stores send, byte for byte: taken from the runtime itself
//! (`store::redis::script_sources`, the same strings `RedisStore` and `RedisClusterStore`
//! hash and load). The test `script_texts_are_the_ones_the_store_loads` also checks the driver
//! scripts against what a `RedisStore` loads into a real server (`SCRIPT EXISTS` of their SHA1s).

use ratelimit_runtime::store::redis::script_sources;
use ratelimit_runtime::{Algorithm, store::Check};

/// Every script a store sends.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// The driver for calls whose limits all use one algorithm, by `Algorithm::code() - 1`.
    pub single: Vec<String>,
    /// The driver for calls that stack different algorithms.
    pub combined: String,
    /// The Redis Cluster store's companion script (peek and refund).
    pub compensate: String,
    /// The Functions library (`FUNCTION LOAD`): the same code, what the stores run by `FCALL`
    /// on servers with Redis Functions.
    pub library: String,
    /// The library's function for checks (the drivers' code).
    pub check_function: String,
    /// The library's function for peeks and refunds (the companion's code).
    pub compensate_function: String,
    /// The script for a call of fixed-window limits only (`fixed_only.lua` after its driver).
    pub fixed_only: String,
    /// The library's function for a call of one fixed-window limit.
    pub fixed_only_function: String,
}

impl Sources {
    /// The function and the script a call of `checks` is sent to, as the stores pick them
    /// (`ScriptSources::for_checks`): the fixed windows' own, or the driver.
    pub(crate) fn for_checks(&self, checks: &[Check<'_>]) -> (&str, &str) {
        let texts = script_sources();
        let (function, _) = texts.for_checks(checks);
        if function == texts.fixed_only_function {
            (&self.fixed_only_function, &self.fixed_only)
        } else {
            let algorithms: Vec<Algorithm> = checks.iter().map(|c| c.policy.algorithm()).collect();
            (&self.check_function, self.driver(&algorithms))
        }
    }

    /// The driver a call with these algorithms is sent (as `Scripts::for_checks` picks it).
    pub(crate) fn driver(&self, algorithms: &[Algorithm]) -> &str {
        match algorithms.first() {
            Some(first) if algorithms.iter().all(|a| a == first) => &self.single[code(*first) - 1],
            _ => &self.combined,
        }
    }
}

/// The wire code the scripts know an algorithm by (`Algorithm::code`, crate-private): its
/// place in `Algorithm::BY_CODE`, from 1.
pub(crate) fn code(algorithm: Algorithm) -> usize {
    Algorithm::BY_CODE
        .iter()
        .position(|&a| a == algorithm)
        .map_or(0, |i| i + 1)
}

/// The texts, exactly as the stores send them.
pub(crate) fn sources() -> Sources {
    let texts = script_sources();
    Sources {
        single: Algorithm::BY_CODE
            .iter()
            .map(|&a| texts.for_algorithm(a).to_owned())
            .collect(),
        combined: texts.combined.to_owned(),
        compensate: texts.companion.to_owned(),
        library: texts.library.to_owned(),
        check_function: texts.check_function.to_owned(),
        compensate_function: texts.compensate_function.to_owned(),
        fixed_only: texts.fixed_only.to_owned(),
        fixed_only_function: texts.fixed_only_function.to_owned(),
    }
}
