//! How a check reaches the server: `FCALL` or `EVALSHA`, and the reload after a missing
//! function or `NOSCRIPT` (the load at connect is [`super::load`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{ErrorKind, Script, ServerErrorKind, Value};

use super::script::{COMPANION, LIBRARY, SCRIPTS, source_of};
use super::seat::{Seat, refused_acknowledgement};
use super::wire::{
    ReplyReceipt, declared, keys_repeat, limit_args, parse_reply, parse_reply_with_receipts,
};
use crate::decision::Verdict;
use crate::error::{StoreError, out_of_memory};
use crate::store::Check;

/// Whether a store's server (every node of a cluster) runs the library with `FCALL`, or the
/// scripts with `EVALSHA`. Found out once: at connect (`FUNCTION LOAD` answered) or by the
/// first call. Until a server has refused Functions outright (`unknown command`: Redis before
/// 7, or a proxy in front that does not take `FCALL`; `NOPERM`: an ACL without `FCALL` or
/// `FUNCTION`), calls use `FCALL`; from then on, `EVALSHA`. A server out of memory refuses a
/// whole `FCALL` (functions without flags may write), where a script still answers the calls
/// it rejects (they write nothing): that call runs with `EVALSHA`. Any other error fails that
/// call only.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// `true` once a server refused the library.
    scripts_only: AtomicBool,
    /// The masters found without a replica, whose takes wait for no acknowledgement for a
    /// while (a Cluster's replica acknowledgement).
    #[cfg(feature = "cluster")]
    pub(crate) orphans: super::seat::Orphans,
}

impl Calls {
    pub(crate) fn functions(&self) -> bool {
        !self.scripts_only.load(Ordering::Relaxed)
    }

    pub(super) fn refuse_functions(&self, why: &redis::RedisError) {
        if !self.scripts_only.swap(true, Ordering::Relaxed) {
            tracing::info!(target: crate::observe::log::STORE, error = %why, "redis: no Functions on this server, the scripts run with EVALSHA");
        }
    }
}

/// `FUNCTION LOAD REPLACE <library>`: the same text under the same name is the same library,
/// so replacing it never changes another version's (each has a name of its own).
pub(super) fn library_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(&LIBRARY.text);
    cmd
}

/// `SCRIPT LOAD <source>`.
pub(super) fn script_load_cmd(source: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(source);
    cmd
}

/// An error the server answered (as opposed to a transport error, after which nothing is
/// known about the server).
pub(super) fn is_server_error(e: &redis::RedisError) -> bool {
    e.code().is_some()
}

/// `FCALL` of a function the server does not have: a restarted server without persistence, a
/// `FUNCTION FLUSH`, a node added to a cluster.
fn function_missing(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// `FCALL` refused outright: a server without Redis Functions (`unknown command`), a proxy
/// that does not pass it on (`unsupported command`), or an ACL that does not allow it.
pub(super) fn no_functions(e: &redis::RedisError) -> bool {
    match e.code() {
        Some("ERR") => e.detail().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            d.starts_with("unknown command") || d.starts_with("unsupported command")
        }),
        Some("NOPERM") => true,
        _ => false,
    }
}

/// A connection the checks run on, which can send the Functions library to the server that
/// serves a key: the server itself, or on a cluster the key's master (the node whose `FCALL`
/// answered that the function is missing).
pub(crate) trait ScriptConnection: ConnectionLike + Send {
    /// `FUNCTION LOAD REPLACE` of the library where `key` lives.
    fn load_library_for(
        &mut self,
        key: &str,
    ) -> impl Future<Output = redis::RedisResult<()>> + Send;

    /// `SCRIPT LOAD` of `source` on the server where `key` lives (a cluster client left to
    /// itself sends it to every node, and fails it when one node does not answer).
    fn load_script_for(
        &mut self,
        source: &str,
        key: &str,
    ) -> impl Future<Output = redis::RedisResult<()>> + Send;

    /// `pipe` (none of its commands ignored, its errors kept in place) routed to the server
    /// where `key` lives, whatever the keys of its commands: each command's reply as it came. (A cluster client
    /// whose connection to that server is down sends it to another node: a caller that must
    /// know where it ran asks, as [`Seat`] does.)
    fn pipeline_for(
        &mut self,
        pipe: &redis::Pipeline,
        key: &str,
    ) -> impl Future<Output = redis::RedisResult<Vec<redis::RedisResult<Value>>>> + Send;
}

impl ScriptConnection for ConnectionManager {
    async fn load_library_for(&mut self, _key: &str) -> redis::RedisResult<()> {
        library_cmd().query_async(self).await
    }

    async fn load_script_for(&mut self, source: &str, _key: &str) -> redis::RedisResult<()> {
        script_load_cmd(source)
            .query_async::<String>(self)
            .await
            .map(drop)
    }

    async fn pipeline_for(
        &mut self,
        pipe: &redis::Pipeline,
        _key: &str,
    ) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        pipe.query_async(self).await
    }
}

#[cfg(feature = "cluster")]
impl ScriptConnection for redis::cluster_async::ClusterConnection {
    async fn load_library_for(&mut self, key: &str) -> redis::RedisResult<()> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
        self.route_command(
            library_cmd(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .await
        .map(drop)
    }

    async fn load_script_for(&mut self, source: &str, key: &str) -> redis::RedisResult<()> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
        self.route_command(
            script_load_cmd(source),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .await
        .map(drop)
    }

    async fn pipeline_for(
        &mut self,
        pipe: &redis::Pipeline,
        key: &str,
    ) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
        let replies = self
            .route_pipeline(
                pipe.clone(),
                0,
                pipe.len(),
                SingleNodeRoutingInfo::SpecificNode(route),
            )
            .await?;
        Ok(replies.into_iter().map(Value::extract_error).collect())
    }
}

/// Runs one of the library's functions (`FCALL function numkeys keys… args…`, `args` writing
/// the numkeys, keys and arguments) or, on a server without Functions, `script`, which holds
/// the same code (`EVALSHA sha numkeys …`, same layout). A missing function is loaded on the
/// node of `first_key` (the one that answered) and the call repeated once; missing again, the
/// call runs as the script. A missing script likewise (`NOSCRIPT`: `SCRIPT LOAD`, then once
/// more).
///
/// With `seat`, the reply comes with the connection the attempt that answered ran on
/// ([`send`]).
async fn invoke<C>(
    conn: &mut C,
    calls: &Calls,
    (function, script): (&str, impl Fn() -> &'static Script),
    first_key: &str,
    size: (usize, usize),
    args: impl Fn(&mut redis::Cmd),
    seat: bool,
) -> Result<(Value, Option<Seat>), redis::RedisError>
where
    C: ScriptConnection,
{
    let command = |name: &str, target: &str| sized_command(name, target, size, &args);
    if calls.functions() {
        let cmd = command("FCALL", function);
        match send(conn, &cmd, seat.then_some(first_key)).await {
            Err(e) if function_missing(&e) => match conn.load_library_for(first_key).await {
                Ok(()) => match send(conn, &cmd, seat.then_some(first_key)).await {
                    // Gone again between the load and the call (a `FUNCTION FLUSH` loop): the
                    // script, which reloads itself on `NOSCRIPT`, answers this call, never the
                    // failure policy.
                    Err(e) if function_missing(&e) => {}
                    other => return other,
                },
                Err(e) if no_functions(&e) => calls.refuse_functions(&e),
                Err(e) if out_of_memory(&e) => {}
                Err(e) => return Err(e),
            },
            Err(e) if no_functions(&e) => calls.refuse_functions(&e),
            // This call only: the next one tries `FCALL` again.
            Err(e) if out_of_memory(&e) => {}
            other => return other,
        }
    }
    // The scripts are hashed when a server first needs them: a server with Functions never
    // does.
    let script = script();
    let cmd = command("EVALSHA", script.get_hash());
    match send(conn, &cmd, seat.then_some(first_key)).await {
        // A restarted or flushed server: load the script and repeat the call once.
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            match source_of(script) {
                Some(source) => conn.load_script_for(source, first_key).await?,
                None => drop(script.load_async(conn).await?),
            }
            send(conn, &cmd, seat.then_some(first_key)).await
        }
        other => other,
    }
}

/// Sends `cmd`; with `seat` (the key it is routed by), in one request followed by
/// [`Seat::commands`]: its reply, and the connection it ran on (`None` without `seat`, or
/// when the server did not say).
async fn send<C>(
    conn: &mut C,
    cmd: &redis::Cmd,
    seat: Option<&str>,
) -> Result<(Value, Option<Seat>), redis::RedisError>
where
    C: ScriptConnection,
{
    let Some(key) = seat else {
        return cmd.query_async(conn).await.map(|reply| (reply, None));
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(cmd.clone());
    Seat::commands(&mut pipe);
    let mut replies = conn.pipeline_for(&pipe, key).await?.into_iter();
    let reply = replies.next().ok_or_else(|| {
        redis::RedisError::from((
            ErrorKind::Client,
            "a request of three commands got no reply",
        ))
    })??;
    let (node, client) = (replies.next(), replies.next());
    for refused in [&node, &client]
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_ref().err())
    {
        refused_acknowledgement(refused);
    }
    let node = node.and_then(Result::ok);
    let client = client.and_then(Result::ok);
    Ok((reply, Seat::read(node.as_ref(), client.as_ref())))
}

/// Checks every limit of one call in one invocation of the driver: `FCALL` of the library's
/// `check` (or `EVALSHA` of the driver script with the same code, see [`invoke`]).
///
/// Generic over the connection so that any Redis deployment whose connection sends all keys of
/// the call to one node (a single server, or a cluster with hash-tagged keys) reuses it.
///
/// With a `call_id` (1 to 32 lower-case hex digits), an admitted call also leaves a receipt per
/// limit for the refunds (see `scripts/driver.lua` and `scripts/prelude.lua`), kept at most
/// `keep` (`None`: the scripts' longest, 10 s).
pub(crate) async fn eval_checks<C>(
    conn: &mut C,
    calls: &Calls,
    checks: &[Check<'_>],
    call_id: Option<&str>,
    keep: Option<Duration>,
) -> Result<Verdict, StoreError>
where
    C: ScriptConnection,
{
    if checks.is_empty() {
        return Ok(Verdict::new(Vec::new()));
    }
    let receipts = call_id.map_or(Receipts::None, |id| Receipts::Keys(id, keep));
    let (reply, _) = run_checks(conn, calls, checks, receipts, false).await?;
    parse_reply(&reply, checks)
}

/// [`eval_checks`] of a take whose receipts come back in its reply instead of being written
/// (the scripts' `~`): the verdict, and when the call was admitted the receipt of each limit,
/// which [`Mode::Return`] hands back to give back what the take took.
pub(crate) async fn take_in_reply<C>(
    conn: &mut C,
    calls: &Calls,
    checks: &[Check<'_>],
) -> Result<(Verdict, Vec<ReplyReceipt>), StoreError>
where
    C: ScriptConnection,
{
    if checks.is_empty() {
        return Ok((Verdict::new(Vec::new()), Vec::new()));
    }
    let (reply, _) = run_checks(conn, calls, checks, Receipts::InReply, false).await?;
    parse_reply_with_receipts(&reply, checks)
}

/// Where an admitted take's receipts go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Receipts<'a> {
    /// Nowhere: a check.
    None,
    /// A key per limit under this call id, kept at most this long (`None`: 10 s).
    Keys(&'a str, Option<Duration>),
    /// Into the reply (the scripts' `~`).
    InReply,
}

impl<'a> Receipts<'a> {
    /// The call id whose receipt keys the call declares.
    fn call_id(self) -> Option<&'a str> {
        match self {
            Receipts::Keys(id, _) => Some(id),
            Receipts::None | Receipts::InReply => None,
        }
    }
}

/// The driver (or the fixed windows' function) on `checks`, which hold at least one check;
/// the reply as it came, with `seat` the connection it ran on ([`invoke`]).
pub(crate) async fn run_checks<C>(
    conn: &mut C,
    calls: &Calls,
    checks: &[Check<'_>],
    receipts: Receipts<'_>,
    seat: bool,
) -> Result<(Value, Option<Seat>), StoreError>
where
    C: ScriptConnection,
{
    let first = checks.first().map_or("", |c| c.key);
    // The command is built directly, each argument written once into the command's buffer (a
    // `ScriptInvocation` would first copy every key and argument into vectors of its own, then
    // again into the command): numkeys keys… args….
    // The working copies only when a key repeats: most calls have no use for them.
    let copies = keys_repeat(checks);
    let args = |cmd: &mut redis::Cmd| check_args(cmd, checks, copies, receipts);
    let function = LIBRARY.function_for(checks);
    let script = || SCRIPTS.for_checks(checks);
    let size = command_size(checks, copies, receipts.call_id(), 2);
    Ok(invoke(conn, calls, (function, script), first, size, args, seat).await?)
}

/// A command `name target`, then what `args` writes, in buffers made to `size` (arguments,
/// bytes after the name and target) once: a command that grows argument by argument copies
/// its buffers each time they double, several times a call.
fn sized_command(
    name: &str,
    target: &str,
    (arg_count, bytes): (usize, usize),
    args: impl Fn(&mut redis::Cmd),
) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(arg_count + 2, bytes + name.len() + target.len());
    cmd.arg(name).arg(target);
    args(&mut cmd);
    cmd
}

/// The driver's arguments for `checks`: numkeys, the declared keys (with the working copies
/// when `copies`), one argument per limit, then the call id and its receipts' TTL, or `~` for
/// the receipts in the reply.
fn check_args(cmd: &mut redis::Cmd, checks: &[Check<'_>], copies: bool, receipts: Receipts<'_>) {
    let keys = declared(checks, copies, receipts.call_id());
    cmd.arg(keys.len());
    for key in keys {
        cmd.arg(key);
    }
    limit_args(cmd, checks);
    match receipts {
        Receipts::None => {}
        Receipts::Keys(id, keep) => {
            cmd.arg(id);
            if let Some(keep) = keep {
                cmd.arg(receipt_keep_ms(keep));
            }
        }
        Receipts::InReply => {
            cmd.arg(RECEIPTS_IN_REPLY);
        }
    }
}

/// The last argument of a take whose receipts go in its reply (the prelude's `call_shape`).
const RECEIPTS_IN_REPLY: &str = "~";

/// About how many arguments and bytes a call of `checks` writes after the command's name and
/// target: numkeys, the declared keys, one argument per limit, the call id and `extra` more of
/// at most 20 bytes. A hint for the command's buffers: an estimate too small only grows them.
fn command_size(
    checks: &[Check<'_>],
    copies: bool,
    call_id: Option<&str>,
    extra: usize,
) -> (usize, usize) {
    let groups = 2 + usize::from(copies) + usize::from(call_id.is_some());
    let id = call_id.map_or(0, str::len);
    // A declared key is the key and at most a suffix (`:b`, `:w`, `:r:<id>:<i>`); a limit's
    // argument is five numbers and four colons (mostly far under its 104 bytes).
    let per_check = |c: &Check<'_>| groups * c.key.len() + 8 * groups + id + 24 + 48;
    let bytes = 24 + checks.iter().map(per_check).sum::<usize>() + id + 20 * extra;
    (1 + checks.len() * (groups + 1) + extra, bytes)
}

/// The longest the scripts keep a receipt, ms (their `RECEIPT_TTL_US`).
const RECEIPT_KEEP_MAX_MS: u64 = 10_000;

/// How long a take's receipts are kept, as the scripts take it after the call id: whole
/// milliseconds, rounded up, from 1 to [`RECEIPT_KEEP_MAX_MS`].
fn receipt_keep_ms(keep: Duration) -> u64 {
    let ms = keep.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, RECEIPT_KEEP_MAX_MS)
}

/// What the companion script does.
pub(crate) enum Mode<'a> {
    /// Read only ([`Store::peek`](crate::store::Store::peek), and the limits of a rejected
    /// cross-slot call that were never checked).
    Peek,
    /// Give back what the take under this call id still holds (its receipts), then read: the
    /// refunds of outcome-filtered calls (`count = …`) and of the cluster's cross-slot calls.
    Refund(&'a str),
    /// Settle the take under this call id to the units it used, one per limit
    /// ([`Store::settle`](crate::store::Store::settle)), then read.
    Settle(&'a str, &'a [u64]),
    /// Give back, once, what the take under this call id took, by the receipts its reply
    /// carried (one per limit: [`take_in_reply`]), then read.
    Return(&'a str, &'a [ReplyReceipt]),
}

impl<'a> Mode<'a> {
    /// The call id whose receipts the companion reads (declared in its KEYS), if any.
    fn call_id(&self) -> Option<&'a str> {
        match *self {
            Mode::Peek => None,
            Mode::Refund(id) | Mode::Settle(id, _) | Mode::Return(id, _) => Some(id),
        }
    }
}

/// Runs the companion script on `checks` (all on one node, in one slot on a cluster; loaded on
/// `NOSCRIPT`): keys in order, their block markers, then for a refund each key's receipt
/// `<key>:r:<id>:<i>` (i from 1, the driver's name for it). A receipt is read once and deleted: a second refund gives
/// back nothing. The reply reads the limits as they are after it.
pub(crate) async fn compensate<C>(
    conn: &mut C,
    calls: &Calls,
    mode: Mode<'_>,
    checks: &[Check<'_>],
) -> Result<Verdict, StoreError>
where
    C: ScriptConnection,
{
    let Some(first) = checks.first() else {
        return Ok(Verdict::new(Vec::new()));
    };
    let receipts = mode.call_id();
    let args = |cmd: &mut redis::Cmd| companion_args(cmd, checks, &mode);
    let function = LIBRARY.compensate_function.as_str();
    let size = command_size(checks, false, receipts, companion_extra(checks, &mode));
    let (reply, _) = invoke(
        conn,
        calls,
        (function, || &*COMPANION),
        first.key,
        size,
        args,
        false,
    )
    .await?;
    parse_reply(&reply, checks)
}

/// The arguments of at most 20 bytes the companion writes beyond those [`command_size`]
/// counts: the mode, its call id and a number per limit, or a receipt (four numbers) per limit.
fn companion_extra(checks: &[Check<'_>], mode: &Mode<'_>) -> usize {
    let per_limit = if matches!(mode, Mode::Return(..)) {
        4
    } else {
        1
    };
    2 + per_limit * checks.len()
}

/// The companion's arguments for `checks` in `mode`: numkeys, the declared keys, the mode
/// (with its call id), one argument per limit, then a settle's units.
fn companion_args(cmd: &mut redis::Cmd, checks: &[Check<'_>], mode: &Mode<'_>) {
    let receipts = mode.call_id();
    let keys = declared(checks, false, receipts);
    cmd.arg(keys.len());
    for key in keys {
        cmd.arg(key);
    }
    match mode {
        Mode::Peek => cmd.arg("peek"),
        Mode::Refund(id) => cmd.arg("refund").arg(*id),
        Mode::Settle(id, _) => cmd.arg("settle").arg(*id),
        Mode::Return(id, _) => cmd.arg("return").arg(*id),
    };
    limit_args(cmd, checks);
    match mode {
        Mode::Settle(_, actual) => {
            for &units in *actual {
                cmd.arg(crate::algorithm::settled_units(units));
            }
        }
        Mode::Return(_, receipts) => {
            for (receipt, check) in receipts.iter().zip(checks) {
                cmd.arg(receipt.value(check.policy.cost()));
            }
        }
        Mode::Peek | Mode::Refund(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;

    /// The arguments and bytes `args` writes after the command's name and target.
    fn written(args: impl Fn(&mut redis::Cmd)) -> (usize, usize) {
        let cmd = sized_command("", "", (0, 0), args);
        let mut count = 0;
        let mut bytes = 0;
        for arg in cmd.args_iter() {
            count += 1;
            // The stores write no cursor.
            if let redis::Arg::Simple(arg) = arg {
                bytes += arg.len();
            }
        }
        (count - 2, bytes)
    }

    fn fits((count, bytes): (usize, usize), (hint_count, hint_bytes): (usize, usize)) -> bool {
        count <= hint_count && bytes <= hint_bytes
    }

    /// The size a call's command is made to holds every argument it writes: one limit and
    /// several, a key repeated (the working copies), the longest call id and TTL, long keys
    /// and the largest numbers, every companion mode.
    #[test]
    fn commands_are_made_to_their_size() {
        let small = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60)).unwrap();
        let most = crate::policy::rules::MAX_UNITS;
        let large = Policy::new(Algorithm::Fixed, most, Duration::from_secs(86_400 * 365))
            .unwrap()
            .with_cost(most)
            .unwrap();
        let long_key = format!("ratelimit:{{{}:ip=2001:db8::1}}:5fm", "s".repeat(200));
        let shapes: [Vec<Check<'_>>; 4] = [
            vec![Check::new("ratelimit:{a:ip=10.0.0.1}:5fm", &small)],
            vec![Check::new("k", &large), Check::new(&long_key, &small)],
            vec![Check::new("k", &small), Check::new("k", &large)],
            (0..12).map(|_| Check::new(&long_key, &large)).collect(),
        ];
        let id = "f".repeat(32);
        for checks in &shapes {
            let copies = keys_repeat(checks);
            let mut shapes = vec![Receipts::None, Receipts::InReply];
            for call_id in ["1", id.as_str()] {
                for keep in [None, Some(Duration::from_secs(3_600))] {
                    shapes.push(Receipts::Keys(call_id, keep));
                }
            }
            for receipts in shapes {
                let args = |cmd: &mut redis::Cmd| check_args(cmd, checks, copies, receipts);
                let size = command_size(checks, copies, receipts.call_id(), 2);
                assert!(fits(written(args), size), "{checks:?} {receipts:?}");
            }
            let units = vec![u64::MAX; checks.len()];
            let most = ReplyReceipt {
                at_us: u64::MAX,
                reset_us: u64::MAX,
                first_us: u64::MAX,
            };
            let receipts = vec![most; checks.len()];
            for mode in [
                Mode::Peek,
                Mode::Refund(&id),
                Mode::Settle(&id, &units),
                Mode::Return(&id, &receipts),
            ] {
                let args = |cmd: &mut redis::Cmd| companion_args(cmd, checks, &mode);
                let size = command_size(
                    checks,
                    false,
                    mode.call_id(),
                    companion_extra(checks, &mode),
                );
                assert!(fits(written(args), size), "{checks:?}");
            }
        }
    }
}
