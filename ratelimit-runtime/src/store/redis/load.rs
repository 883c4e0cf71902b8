//! What a connection loads before its first check: the Functions library, or on a server
//! without Functions the scripts.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, Script};

use super::invoke::{Calls, is_server_error, library_cmd, no_functions, script_load_cmd};
#[cfg(feature = "cluster")]
use super::script::COMPANION;
use super::script::SCRIPTS;
use super::server::{MemoryPolicy, info_memory_cmd, log_engine};

/// Loads the library (`FUNCTION LOAD REPLACE`; on a cluster the client sends it to every
/// master), so that the first checks need no reload round trip. A server that refuses the
/// library gets every script instead (`SCRIPT LOAD`, which the client sends to every node).
#[cfg(feature = "cluster")]
pub(crate) async fn load_scripts<C>(conn: &mut C, calls: &Calls) -> Result<(), redis::RedisError>
where
    C: ConnectionLike + Send,
{
    match library_cmd().query_async::<()>(conn).await {
        Ok(()) => return Ok(()),
        Err(e) if no_functions(&e) => calls.refuse_functions(&e),
        // Any other answer (a master busy loading, out of memory, a failover under way): the
        // first `FCALL` that finds the function missing loads it.
        Err(e) if is_server_error(&e) => return Ok(()),
        Err(e) => return Err(e),
    }
    for script in SCRIPTS.all() {
        script.load_async(conn).await?;
    }
    COMPANION.load_async(conn).await?;
    Ok(())
}

/// Like [`load_scripts`] on a single server, in one round trip (a pipeline): connecting at a
/// cold start is on the path of the checks that wait for it. A server without Functions gets
/// the scripts in a second round trip; the companion script is left to its first call
/// (`NOSCRIPT`): peeks and refunds are rare.
///
/// The same round trip reads the server's `maxmemory-policy` (`INFO memory`, last) into
/// `memory`; a server that refuses `INFO` leaves it unknown.
pub(super) async fn load_scripts_pipelined<C>(
    conn: &mut C,
    calls: &Calls,
    memory: &MemoryPolicy,
) -> Result<(), redis::RedisError>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(library_cmd());
    // Last, for the log and the eviction check: which server this is, and its memory policy.
    pipe.cmd("INFO").arg("server");
    pipe.add_command(info_memory_cmd());
    let replies: Vec<redis::RedisResult<String>> = pipe.query_async(conn).await?;
    let Ok([library, info, memory_info]) = <[_; 3]>::try_from(replies) else {
        return Err(redis::RedisError::from((
            ErrorKind::Client,
            "the library pipeline got other than three replies",
        )));
    };
    match memory_info {
        Ok(info) => memory.record_info("redis", &info),
        Err(e) => {
            tracing::debug!(target: crate::observe::log::STORE, error = %e, "redis: INFO memory refused; maxmemory-policy unknown");
        }
    }
    match library {
        Ok(_) => {}
        Err(e) if no_functions(&e) => calls.refuse_functions(&e),
        // Any other answer (busy loading, out of memory): the first `FCALL` that finds the
        // function missing loads it.
        Err(e) if is_server_error(&e) => {}
        Err(e) => return Err(e),
    }
    if !calls.functions() {
        load_eval_scripts(conn).await?;
    }
    log_engine("redis", info.ok().as_deref(), calls.functions());
    Ok(())
}

/// `SCRIPT LOAD` of every check script (not the companion) on a single server, in one
/// pipeline, each answered by the SHA1 `EVALSHA` will name it by.
async fn load_eval_scripts<C>(conn: &mut C) -> Result<(), redis::RedisError>
where
    C: ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    for source in &SCRIPTS.sources {
        pipe.add_command(script_load_cmd(source));
    }
    let hashes: Vec<String> = pipe.query_async(conn).await?;
    let expected: Vec<&str> = SCRIPTS.all().map(Script::get_hash).collect();
    if hashes != expected {
        return Err(redis::RedisError::from((
            ErrorKind::Client,
            "SCRIPT LOAD answered unexpected hashes",
        )));
    }
    Ok(())
}
